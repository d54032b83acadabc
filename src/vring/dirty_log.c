/* SPDX-License-Identifier: MIT */
/* Dirty log of guest memory (see dirty_log.h). */
#include "vring/dirty_log.h"

#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/fdcheck.h"
#include "vring/fault.h"
#include "vring/guest_mem.h"

struct vring_log vring_log_none = { .fault_id = -1, .call_fd = -1 };

void vring_log_init(struct vring_log *log)
{
	*log = (struct vring_log){ .fault_id = -1, .call_fd = -1 };
}

static void unmap(struct vring_log *log)
{
	if (log->fault_id >= 0)
		fault_unregister(log->fault_id);
	if (log->map)
		munmap(log->map, log->map_len);
	log->map = NULL;
	log->map_len = 0;
	log->bits = NULL;
	log->size = 0;
	log->fault_id = -1;
	atomic_store(&log->poisoned, false);
}

int vring_log_map(struct vring_log *log, int fd, uint64_t size, uint64_t offset)
{
	uint64_t len = offset + size;
	void *p;
	int id, r;

	if (size == 0 || len < offset || len > SIZE_MAX)
		return -EINVAL;
	r = fd_check_guest_memory(fd, len);
	if (r == -ERANGE)
		return -EINVAL;
	if (r < 0)
		return r;
	/* From file offset 0, like guest memory: offset need not be page aligned. */
	p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	unmap(log);
	id = fault_register(p, (size_t)len, &log->poisoned);
	if (id < 0) {
		munmap(p, (size_t)len);
		log->active = false;
		return id;
	}
	log->map = p;
	log->map_len = (size_t)len;
	log->fault_id = id;
	log->bits = (uint8_t *)p + offset;
	log->size = size;
	log->active = log->want;
	return 0;
}

void vring_log_reset(struct vring_log *log)
{
	unmap(log);
	vring_log_set_fd(log, -1);
	vring_log_init(log);
}

void vring_log_set_enabled(struct vring_log *log, bool on)
{
	log->want = on;
	log->active = on && log->bits;
}

void vring_log_set_fd(struct vring_log *log, int fd)
{
	if (log->call_fd >= 0)
		close(log->call_fd);
	log->call_fd = fd;
}

void vring_log_signal(struct vring_log *log)
{
	log->marked = false;
	if (log->call_fd >= 0)
		(void)eventfd_write(log->call_fd, 1);
}

void vring_log_mark_gpa(struct vring_log *log, uint64_t gpa, uint64_t len)
{
	uint64_t first = gpa / VRING_LOG_PAGE, last, limit = log->size * 8;

	if (len == 0 || !log->bits)
		return;
	last = (gpa + len - 1 < gpa ? UINT64_MAX : gpa + len - 1) / VRING_LOG_PAGE;
	for (uint64_t p = first; p <= last; p++) {
		if (p >= limit) {
			log->outside += last - p + 1;
			break;
		}
		/* The front-end clears bits while we set them: an atomic read-modify-write. */
		__atomic_fetch_or(&log->bits[p / 8], (uint8_t)(1u << (p % 8)), __ATOMIC_RELAXED);
	}
	log->marked = true;
}

void vring_log_mark_hva(struct vring_log *log, const struct guest_mem *mem, const void *hva,
			uint64_t len)
{
	uint64_t gpa;

	if (len && guest_mem_hva_to_gpa(mem, hva, &gpa))
		vring_log_mark_gpa(log, gpa, len);
}
