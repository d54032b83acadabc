/* SPDX-License-Identifier: MIT */
/*
 * Dirty log of guest memory for live migration (vhost-user.rst "Migration", VHOST_F_LOG_ALL and
 * VHOST_USER_PROTOCOL_F_LOG_SHMFD): a shared bitmap the front-end hands over with SET_LOG_BASE,
 * one bit per 4 KiB page of guest-physical memory (bit p % 8 of byte p / 8 stands for the page
 * at p * 4096, the layout of Linux drivers/vhost/vhost.c and QEMU hw/virtio/vhost.c). While
 * logging is on, the device marks every page it writes, after the write and before the used
 * ring publishes it; the front-end reads and clears the bits concurrently, hence the atomic OR.
 *
 * Cost: a queue's write paths test one flag (vring_log_write()); with logging off that is the
 * only work, one predictable branch.
 *
 * Security model: the front-end chooses the log's size; a mark past its end is never written
 * (counted in `outside`), so no guest address reaches outside the mapping. The mapping is
 * protected by the fault guard like guest memory (a front-end that shrinks the file behind it
 * turns the log into zero pages, and marks then land there).
 * Context: one thread (the VM's device thread) maps, unmaps and marks.
 */
#ifndef UVSOCK_VRING_DIRTY_LOG_H
#define UVSOCK_VRING_DIRTY_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct guest_mem;

#define VRING_LOG_PAGE 4096u

struct vring_log {
	bool active;      /* marks are made: LOG_ALL acked and a log mapped */
	bool want;        /* LOG_ALL acked (active once a log is mapped too) */
	uint8_t *bits;    /* the bitmap, NULL while none is mapped */
	uint64_t size;    /* bytes of bitmap: pages [0, size * 8) can be marked */
	void *map;        /* what mmap returned */
	size_t map_len;
	int fault_id;     /* fault guard slot of the mapping; -1 if none */
	atomic_bool poisoned;
	int call_fd;      /* SET_LOG_FD eventfd, signalled after a publication that marked; -1 */
	bool marked;      /* pages were marked since the last signal */
	uint64_t outside; /* marks refused because the page is past the end of the log */
};

/* The log of queues that have none (guest role, local maps): never active. */
extern struct vring_log vring_log_none;

/* An empty log: not active, nothing mapped, no fd. */
void vring_log_init(struct vring_log *log);

/*
 * Maps [offset, offset + size) of fd (MAP_SHARED) as the bitmap, replacing the previous one.
 * The fd is borrowed. Returns 0, -EINVAL (size 0, offset + size overflowing, fd not a regular
 * file or memfd, or shorter than offset + size), or the mmap / fault guard errno; on error the
 * previous bitmap stays.
 */
int vring_log_map(struct vring_log *log, int fd, uint64_t size, uint64_t offset);

/* Unmaps the bitmap and closes the eventfd; the log is then as after vring_log_init(). */
void vring_log_reset(struct vring_log *log);

/* LOG_ALL acked (on) or not: logging is active while on and a bitmap is mapped. */
void vring_log_set_enabled(struct vring_log *log, bool on);

/* Replaces the SET_LOG_FD eventfd (owned from now on; -1: none), closing the old one. */
void vring_log_set_fd(struct vring_log *log, int fd);

/* Bytes of bitmap needed to cover guest-physical addresses [0, end). */
static inline uint64_t vring_log_bytes_for(uint64_t end)
{
	uint64_t pages = end / VRING_LOG_PAGE + (end % VRING_LOG_PAGE != 0);

	return pages / 8 + (pages % 8 != 0);
}

/* Marks the pages of guest-physical [gpa, gpa + len) (len > 0). */
void vring_log_mark_gpa(struct vring_log *log, uint64_t gpa, uint64_t len);

/*
 * Marks the pages of host range [hva, hva + len), which lies in one region of mem (iovecs from
 * a pop, ring parts): translated back to guest-physical through mem.
 */
void vring_log_mark_hva(struct vring_log *log, const struct guest_mem *mem, const void *hva,
			uint64_t len);

/* The one test on the write paths. */
static inline void vring_log_write(struct vring_log *log, const struct guest_mem *mem,
				   const void *hva, uint64_t len)
{
	if (__builtin_expect(log->active, 0))
		vring_log_mark_hva(log, mem, hva, len);
}

/* Writes 1 to the SET_LOG_FD eventfd (if any) and clears `marked`. */
void vring_log_signal(struct vring_log *log);

/* After a used-ring publication: signals the SET_LOG_FD eventfd if pages were marked. */
static inline void vring_log_published(struct vring_log *log)
{
	if (__builtin_expect(log->marked, 0))
		vring_log_signal(log);
}

#endif
