/* SPDX-License-Identifier: MIT */
/*
 * Guest memory map: a small table (at most GUEST_MEM_MAX_REGIONS) of guest regions, each with its
 * guest-physical range, front-end virtual range and host pointer, and the translations the rings
 * need (gpa → hva, uva → hva, gpa range → iovecs).
 *
 * Security model: the front-end (SET_MEM_TABLE) and the guest (descriptor addresses) are
 * untrusted. Region tables are validated once when the map is built (no zero size, no wrap of
 * gpa+size, uva+size or mmap_offset+size, no overlapping guest-physical ranges, each fd a regular
 * file (a memfd) large enough to back the mapping so that touching it cannot SIGBUS). Every
 * translation clamps the length to the region that holds the address; an address outside every
 * region is a NULL / -EFAULT result, never a crash.
 *
 * The front-end keeps its fd and may shrink the file after we mapped it. A memfd that allows
 * sealing is sealed with F_SEAL_SHRINK before it is checked and mapped, so it cannot; every
 * mapped region is also registered with the fault guard (vring/fault.h), which turns a SIGBUS
 * in it into zero pages and sets the map's poisoned flag.
 */
#include "vring/guest_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "util/fdcheck.h"
#include "vring/dirty_log.h"
#include "vring/fault.h"

struct gm_region {
	uint64_t gpa;         /* first guest-physical address */
	uint64_t size;        /* bytes; > 0, gpa + size and uva + size do not wrap */
	uint64_t uva;         /* front-end virtual address of the first byte */
	uint8_t *host;        /* host pointer of the first byte */
	void *mmap_base;      /* what mmap returned (NULL for local maps) */
	size_t mmap_len;      /* size + mmap_offset when mapped here */
	int fault_id;         /* fault guard slot of the mapping; -1 if none */
};

struct guest_mem {
	unsigned n;
	struct gm_region r[GUEST_MEM_MAX_REGIONS];
	uint64_t budget;      /* bytes taken from mapped_bytes (0 for local maps) */
	atomic_bool poisoned; /* set by the SIGBUS handler (vring/fault.c) */
	struct vring_log *log; /* dirty log of the VM (guest_mem_set_log), NULL: none */
};

/* The caps (guest_mem_set_limits()) and the process total of mapped bytes. */
static _Atomic uint64_t limit_per_map = GUEST_MEM_DEFAULT_PER_MAP_MAX;
static _Atomic uint64_t limit_process = GUEST_MEM_DEFAULT_PROCESS_MAX;
static _Atomic uint64_t mapped_bytes;

void guest_mem_set_limits(uint64_t per_map_max, uint64_t process_max)
{
	/* Relaxed: each cap is one value read on its own; no other memory goes with it. */
	if (!per_map_max)
		per_map_max = GUEST_MEM_DEFAULT_PER_MAP_MAX;
	if (!process_max)
		process_max = GUEST_MEM_DEFAULT_PROCESS_MAX;
	atomic_store_explicit(&limit_per_map, per_map_max, memory_order_relaxed);
	atomic_store_explicit(&limit_process, process_max, memory_order_relaxed);
}

void guest_mem_get_limits(uint64_t *per_map_max, uint64_t *process_max)
{
	if (per_map_max)
		*per_map_max = atomic_load_explicit(&limit_per_map, memory_order_relaxed);
	if (process_max)
		*process_max = atomic_load_explicit(&limit_process, memory_order_relaxed);
}

uint64_t guest_mem_mapped_bytes(void)
{
	return atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}

/* Takes bytes from the process budget: 0, or -ENOMEM if it would pass the process cap. */
static int budget_take(uint64_t bytes)
{
	uint64_t max = atomic_load_explicit(&limit_process, memory_order_relaxed);
	uint64_t cur = atomic_load_explicit(&mapped_bytes, memory_order_relaxed);

	/* Relaxed: a counter; the CAS makes concurrent maps see each other's bytes. */
	do {
		if (bytes > max || cur > max - bytes)
			return -ENOMEM;
	} while (!atomic_compare_exchange_weak_explicit(&mapped_bytes, &cur, cur + bytes,
							memory_order_relaxed,
							memory_order_relaxed));
	return 0;
}

static void budget_give(uint64_t bytes)
{
	atomic_fetch_sub_explicit(&mapped_bytes, bytes, memory_order_relaxed);
}

/* Checks one descriptor in isolation: non-zero size, no arithmetic wrap. */
static bool region_desc_valid(const struct guest_mem_region_desc *d)
{
	if (d->memory_size == 0)
		return false;
	if (d->guest_phys_addr + d->memory_size < d->guest_phys_addr ||
	    d->guest_phys_addr + d->memory_size == 0)
		return false; /* wraps past 2^64 (a range ending exactly at 2^64 is refused too) */
	if (d->userspace_addr + d->memory_size < d->userspace_addr)
		return false;
	return true;
}

/* Checks the whole table: every region valid, guest-physical ranges pairwise disjoint. */
static int table_valid(const struct guest_mem_region_desc *regions, unsigned n)
{
	if (n > GUEST_MEM_MAX_REGIONS)
		return -E2BIG;
	if (n > 0 && !regions)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (!region_desc_valid(&regions[i]))
			return -EINVAL;
		for (unsigned j = 0; j < i; j++) {
			uint64_t a0 = regions[i].guest_phys_addr, a1 = a0 + regions[i].memory_size;
			uint64_t b0 = regions[j].guest_phys_addr, b1 = b0 + regions[j].memory_size;

			if (a0 < b1 && b0 < a1)
				return -EINVAL;
		}
	}
	return 0;
}

static void unmap_all(struct guest_mem *m)
{
	for (unsigned i = 0; i < m->n; i++) {
		if (!m->r[i].mmap_base)
			continue;
		/* Unprotect first: the address range may be reused by the next mmap. */
		fault_unregister(m->r[i].fault_id);
		(void)munmap(m->r[i].mmap_base, m->r[i].mmap_len);
	}
	budget_give(m->budget);
	m->budget = 0;
}

/*
 * Seals a memfd that allows it against shrinking, so that the front-end cannot truncate memory
 * we have mapped (QEMU's memory-backend-memfd seals it so itself by default). Other files,
 * memfds without MFD_ALLOW_SEALING and memfds already sealed with F_SEAL_SEAL stay as they are:
 * the fault guard covers those. Best effort, no error.
 */
static void seal_shrink(int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)))
		return;
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
}

/*
 * Adds up what a table maps (mmap_offset + memory_size a region) and takes it from the process
 * budget. Returns 0 with *bytes set, -EINVAL on overflow, -E2BIG over the per-map cap, -ENOMEM
 * over the process cap.
 */
static int map_budget(const struct guest_mem_region_desc *regions, unsigned n, uint64_t *bytes)
{
	uint64_t sum = 0, max = atomic_load_explicit(&limit_per_map, memory_order_relaxed);

	for (unsigned i = 0; i < n; i++) {
		uint64_t total = regions[i].memory_size + regions[i].mmap_offset;

		if (total < regions[i].memory_size || total > SIZE_MAX || sum + total < sum)
			return -EINVAL;
		sum += total;
	}
	if (sum > max)
		return -E2BIG;
	*bytes = sum;
	return budget_take(sum);
}

int guest_mem_new(const struct guest_mem_region_desc *regions, unsigned n, struct guest_mem **ret)
{
	struct guest_mem *m;
	uint64_t bytes;
	int r;

	if (!ret)
		return -EINVAL;
	r = table_valid(regions, n);
	if (r < 0)
		return r;
	r = map_budget(regions, n, &bytes);
	if (r < 0)
		return r;
	m = calloc(1, sizeof(*m));
	if (!m) {
		budget_give(bytes);
		return -ENOMEM;
	}
	m->budget = bytes;
	atomic_init(&m->poisoned, false);

	for (unsigned i = 0; i < n; i++) {
		const struct guest_mem_region_desc *d = &regions[i];
		uint64_t total = d->memory_size + d->mmap_offset;
		void *base;

		if (d->fd < 0) {
			r = -EINVAL;
			goto out_unmap;
		}
		/* Before the size check, so that the size cannot change after it. */
		seal_shrink(d->fd);
		/* Only a file of at least the mapping's size: a device (/dev/zero), pipe or socket
		 * is no guest memory, and a shorter file would SIGBUS at the first access. */
		r = fd_check_guest_memory(d->fd, total);
		if (r == -ERANGE)
			r = -EINVAL; /* the errno uvsock_dev_set_mem_table() documents */
		if (r < 0)
			goto out_unmap;
		/* From offset 0: mmap_offset need not be page (or hugepage) aligned. */
		base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
			    d->fd, 0);
		if (base == MAP_FAILED) {
			r = -errno;
			goto out_unmap;
		}
		m->r[i] = (struct gm_region){
			.gpa = d->guest_phys_addr,
			.size = d->memory_size,
			.uva = d->userspace_addr,
			.host = (uint8_t *)base + d->mmap_offset,
			.mmap_base = base,
			.mmap_len = (size_t)total,
			.fault_id = fault_register(base, (size_t)total, &m->poisoned),
		};
		m->n = i + 1;
		if (m->r[i].fault_id < 0) {
			r = m->r[i].fault_id;
			goto out_unmap;
		}
	}
	*ret = m;
	return 0;

out_unmap:
	unmap_all(m);
	free(m);
	return r;
}

int guest_mem_new_local(const struct guest_mem_region_desc *regions, void *const *host_base,
			unsigned n, struct guest_mem **ret)
{
	struct guest_mem *m;
	int r;

	if (!ret || (n > 0 && !host_base))
		return -EINVAL;
	r = table_valid(regions, n);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < n; i++)
		if (!host_base[i] || regions[i].memory_size > SIZE_MAX ||
		    (uintptr_t)host_base[i] + regions[i].memory_size < (uintptr_t)host_base[i])
			return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	atomic_init(&m->poisoned, false);
	for (unsigned i = 0; i < n; i++)
		m->r[i] = (struct gm_region){
			.gpa = regions[i].guest_phys_addr,
			.size = regions[i].memory_size,
			.uva = regions[i].userspace_addr,
			.host = host_base[i],
			.fault_id = -1,
		};
	m->n = n;
	*ret = m;
	return 0;
}

bool guest_mem_poisoned(const struct guest_mem *m)
{
	/* Relaxed: the flag orders nothing; the handler may run on this or another thread. */
	return m && atomic_load_explicit(&m->poisoned, memory_order_relaxed);
}

void guest_mem_free(struct guest_mem *m)
{
	if (!m)
		return;
	unmap_all(m);
	free(m);
}

void *guest_mem_gpa_to_hva(const struct guest_mem *m, uint64_t gpa, uint64_t *len)
{
	if (!m)
		return NULL;
	for (unsigned i = 0; i < m->n; i++) {
		const struct gm_region *g = &m->r[i];

		if (gpa - g->gpa < g->size) { /* unsigned: also false for gpa < g->gpa */
			uint64_t off = gpa - g->gpa;

			if (len && *len > g->size - off)
				*len = g->size - off;
			return g->host + off;
		}
	}
	return NULL;
}

bool guest_mem_hva_to_gpa(const struct guest_mem *m, const void *hva, uint64_t *gpa)
{
	uintptr_t h = (uintptr_t)hva;

	if (!m)
		return false;
	for (unsigned i = 0; i < m->n; i++) {
		const struct gm_region *g = &m->r[i];

		if (h - (uintptr_t)g->host < g->size) {
			*gpa = g->gpa + (h - (uintptr_t)g->host);
			return true;
		}
	}
	return false;
}

uint64_t guest_mem_gpa_end(const struct guest_mem *m)
{
	uint64_t end = 0;

	for (unsigned i = 0; m && i < m->n; i++)
		if (m->r[i].gpa + m->r[i].size > end)
			end = m->r[i].gpa + m->r[i].size;
	return end;
}

void guest_mem_set_log(struct guest_mem *m, struct vring_log *log)
{
	if (m)
		m->log = log;
}

struct vring_log *guest_mem_log(const struct guest_mem *m)
{
	return m && m->log ? m->log : &vring_log_none;
}

void *guest_mem_uva_to_hva(const struct guest_mem *m, uint64_t uva, uint64_t *len)
{
	if (!m)
		return NULL;
	for (unsigned i = 0; i < m->n; i++) {
		const struct gm_region *g = &m->r[i];

		if (uva - g->uva < g->size) {
			uint64_t off = uva - g->uva;

			if (len && *len > g->size - off)
				*len = g->size - off;
			return g->host + off;
		}
	}
	return NULL;
}

void *guest_mem_gpa_range(const struct guest_mem *m, uint64_t gpa, uint64_t len)
{
	uint64_t l = len;
	void *p = guest_mem_gpa_to_hva(m, gpa, &l);

	return p && l == len ? p : NULL;
}

void *guest_mem_uva_range(const struct guest_mem *m, uint64_t uva, uint64_t len)
{
	uint64_t l = len;
	void *p = guest_mem_uva_to_hva(m, uva, &l);

	return p && l == len ? p : NULL;
}

int guest_mem_map_iov(const struct guest_mem *m, uint64_t gpa, uint64_t len, struct iovec *iov,
		      int iovmax)
{
	int n = 0;

	if (gpa + len < gpa)
		return -EFAULT; /* the range wraps past 2^64: no region can hold it */
	while (len > 0) {
		uint64_t l = len;
		void *p = guest_mem_gpa_to_hva(m, gpa, &l);

		if (!p)
			return -EFAULT;
		if (n >= iovmax)
			return -ENOBUFS;
		iov[n].iov_base = p;
		iov[n].iov_len = (size_t)l;
		n++;
		gpa += l;
		len -= l;
	}
	return n;
}
