/* SPDX-License-Identifier: MIT */
/*
 * Guest memory map: the regions a vhost-user front-end hands us with SET_MEM_TABLE (or that a
 * C VMM hands the device API), mmapped here, and translation of guest-physical addresses (ring
 * descriptors) and front-end virtual addresses (SET_VRING_ADDR) to host pointers.
 *
 * Security model: every address and length comes from the guest or the front-end. Translation
 * clamps the length to the end of the region that holds the address; a buffer that spans regions
 * becomes several iovecs; an address outside every region is an error, never a crash.
 * Lifetime: pointers obtained from a map are valid until guest_mem_free() of that map; a new
 * SET_MEM_TABLE builds a new map, so no guest pointer is kept across it.
 */
#ifndef UVSOCK_VRING_GUEST_MEM_H
#define UVSOCK_VRING_GUEST_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define GUEST_MEM_MAX_REGIONS 8

struct guest_mem_region_desc {
	uint64_t guest_phys_addr;
	uint64_t memory_size;
	uint64_t userspace_addr; /* front-end VA of the region (for ring addresses) */
	uint64_t mmap_offset;    /* offset of the region in fd */
	int fd;                  /* borrowed; guest_mem_new() dups nothing and does not close it */
};

struct guest_mem;

/*
 * Maps n regions (MAP_SHARED, from file offset 0 as libvhost-user does, since mmap_offset need not
 * be page aligned). Regions with overlapping guest-physical ranges, zero size or sizes that
 * overflow are refused. The fds are borrowed: the caller closes them (mapping keeps the memory).
 * A memfd that allows sealing gets F_SEAL_SHRINK (the front-end can no longer shrink it), and
 * every mapping is protected by the fault guard (vring/fault.h, guest_mem_poisoned()).
 * Each fd must be a regular file (a memfd, or a tmpfs or hugetlbfs file) of at least
 * mmap_offset + memory_size bytes. Returns 0, -EINVAL (bad table, negative fd, fd not a regular
 * file or shorter than its region), -EBADF, -E2BIG (n > GUEST_MEM_MAX_REGIONS), -ENOMEM,
 * -ENOSPC (fault guard slots exhausted) or the mmap errno.
 */
int guest_mem_new(const struct guest_mem_region_desc *regions, unsigned n, struct guest_mem **ret);

/*
 * Caps on mapped guest memory, counted in bytes of address space (mmap_offset + memory_size of
 * each region): a sparse memfd costs the front-end no RAM, so without a cap one VMM could take
 * all of the process's address space and make the next VM's mapping fail. A map over
 * per_map_max (one VM's table) is refused with -E2BIG; one that would bring the process total
 * over process_max with -ENOMEM. Defaults: 1 TiB per map (more RAM than a VM on one host is
 * given today), 16 TiB per process (an eighth of the 128 TiB x86-64 user address space, room for
 * 16 such VMs, or many smaller ones, beside everything else). docs/security.md says more.
 */
#define GUEST_MEM_DEFAULT_PER_MAP_MAX (1ull << 40)
#define GUEST_MEM_DEFAULT_PROCESS_MAX (16ull << 40)

/*
 * Sets the caps for maps built from now on (maps that exist stay); 0 selects the default.
 * Thread-safe. The process total of mapped bytes is kept whatever the caps.
 */
void guest_mem_set_limits(uint64_t per_map_max, uint64_t process_max);
void guest_mem_get_limits(uint64_t *per_map_max, uint64_t *process_max);

/* Bytes currently mapped by guest_mem_new() maps of this process (freed maps excluded). */
uint64_t guest_mem_mapped_bytes(void);

/*
 * A map over memory the caller already has (the guest role and unit tests: the guest's own RAM).
 * host_base[i] is the host pointer of region i; userspace_addr is ignored unless used for VA
 * translation. Nothing is unmapped on free.
 */
int guest_mem_new_local(const struct guest_mem_region_desc *regions, void *const *host_base,
			unsigned n, struct guest_mem **ret);

/*
 * True once a SIGBUS in this map's memory was caught (the front-end shrank a file behind it,
 * see vring/fault.h): its regions are zero pages from then on, so the rings in it must be
 * treated as broken. Safe to call from any thread; false for local maps and NULL.
 */
bool guest_mem_poisoned(const struct guest_mem *m);

/* Unmaps (if it mapped) and frees. Safe on NULL. */
void guest_mem_free(struct guest_mem *m);

/*
 * Guest-physical → host pointer. *len is clamped to what is contiguous in the region holding gpa.
 * Returns NULL if gpa is in no region.
 */
void *guest_mem_gpa_to_hva(const struct guest_mem *m, uint64_t gpa, uint64_t *len);

/* Host pointer inside one of m's regions → guest-physical address. False if in none. */
bool guest_mem_hva_to_gpa(const struct guest_mem *m, const void *hva, uint64_t *gpa);

/* The end of the highest region: guest-physical addresses are below it (0 for NULL). */
uint64_t guest_mem_gpa_end(const struct guest_mem *m);

/*
 * The dirty log the queues over m mark (vring/dirty_log.h): set by the vhost-user back-end on
 * each map it builds; borrowed, must outlive m's queues. guest_mem_log() returns it, or the
 * never-active vring_log_none when none was set.
 */
struct vring_log;
void guest_mem_set_log(struct guest_mem *m, struct vring_log *log);
struct vring_log *guest_mem_log(const struct guest_mem *m);

/* Front-end virtual (SET_VRING_ADDR) → host pointer, same contract. */
void *guest_mem_uva_to_hva(const struct guest_mem *m, uint64_t uva, uint64_t *len);

/*
 * Whole-range variants for ring parts (desc table, avail, used) that must be contiguous in host
 * memory: return the host pointer only if all of [addr, addr+len) lies in one region, else NULL.
 */
void *guest_mem_gpa_range(const struct guest_mem *m, uint64_t gpa, uint64_t len);
void *guest_mem_uva_range(const struct guest_mem *m, uint64_t uva, uint64_t len);

/*
 * Maps [gpa, gpa+len) into at most iovmax iovecs (one per region crossed) appended at iov.
 * Returns the number of iovecs used, -EFAULT if any byte is outside guest memory, -ENOBUFS if more
 * than iovmax would be needed.
 */
int guest_mem_map_iov(const struct guest_mem *m, uint64_t gpa, uint64_t len, struct iovec *iov,
		      int iovmax);

#endif
