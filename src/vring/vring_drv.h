/* SPDX-License-Identifier: MIT */
/*
 * Split virtqueue, driver side: what a guest virtio driver does (Linux virtio_ring.c in spirit),
 * for our userspace guest role and the benchmark. Lays the three ring parts out in memory the
 * caller gives, keeps a free-descriptor list, adds buffers as chains of (addr, len, write)
 * elements (or through an indirect table in caller memory), publishes avail->idx in batches,
 * decides kicks (EVENT_IDX avail_event or NO_NOTIFY), and collects used buffers with the
 * per-buffer opaque cookie given at add time.
 *
 * Security model: the device is less trusted than the driver's own state. Everything needed to
 * free a chain (next links, lengths, cookies) is kept in private memory, not re-read from the
 * shared descriptor table; a used element with an id that is out of range, not in flight or a
 * length larger than the buffer's writable part marks the ring broken (-EIO), never a crash.
 *
 * Addresses written into descriptors are guest-physical as the caller gives them. Context: one
 * vring_drv is used by one thread; nothing here locks.
 */
#ifndef UVSOCK_VRING_VRING_DRV_H
#define UVSOCK_VRING_VRING_DRV_H

#include <stdbool.h>
#include <stdint.h>

#include "vring/vring.h"

struct vring_drv;

/* One buffer element of a chain: guest-physical address, length, device-writable or not. */
struct vring_drv_buf {
	uint64_t addr;
	uint32_t len;
	bool write;
};

/*
 * Creates the driver state for a ring of num entries whose parts live at the given host pointers
 * (e.g. base + vring_layout() offsets; alignment 16/2/4 at least). Zeroes the three parts and
 * starts at index 0. features: negotiated bits (VRING_FEAT_EVENT_IDX, VRING_FEAT_INDIRECT_DESC,
 * VRING_FEAT_IN_ORDER: descriptors are then taken in ring order and a used element may end a
 * batch, virtio 1.2 §2.7.8).
 * The ring memory is borrowed and must outlive the returned object. Interrupts start enabled.
 * Returns 0, -EINVAL (num, NULL or misaligned pointer) or -ENOMEM (private state, allocated once).
 */
int vring_drv_new(unsigned num, void *desc, void *avail, void *used, uint64_t features,
		  struct vring_drv **ret);

/* Frees the private state (not the ring memory). Safe on NULL. */
void vring_drv_free(struct vring_drv *d);

/*
 * Adds a chain of n elements (device-readable ones first, then device-writable ones) and puts
 * its head into the avail ring; it becomes visible to the device at the next vring_drv_publish()
 * or vring_drv_kick_prepare(). cookie (non-NULL) comes back from vring_drv_get_used().
 * Returns the head index, -ENOSPC (fewer than n free descriptors), -EINVAL (n == 0, NULL cookie,
 * readable after writable) or -EIO (ring broken).
 */
int vring_drv_add(struct vring_drv *d, const struct vring_drv_buf *bufs, unsigned n, void *cookie);

/*
 * Same, but the n elements go into an indirect table the caller provides: table_host (host
 * pointer, 16-byte aligned, at least 16 * n bytes) at guest-physical table_gpa, which must stay
 * untouched until the buffer is returned. Uses one ring descriptor. Needs INDIRECT_DESC.
 * Returns the head index, -ENOSPC, -EINVAL (as above, feature not negotiated, n > num) or -EIO.
 */
int vring_drv_add_indirect(struct vring_drv *d, const struct vring_drv_buf *bufs, unsigned n,
			   void *table_host, uint64_t table_gpa, void *cookie);

/* Makes every added chain visible: one release store of avail->idx. */
void vring_drv_publish(struct vring_drv *d);

/*
 * Publishes, then decides whether the device must be kicked for the chains added since the last
 * call: with EVENT_IDX iff avail->idx passed avail_event, else unless used->flags has NO_NOTIFY.
 * Returns true if the caller should kick (write the kick eventfd).
 */
bool vring_drv_kick_prepare(struct vring_drv *d);

/*
 * Takes the next used buffer. Returns 0 with *ret_len (bytes the device wrote) and *ret_cookie
 * set and the chain's descriptors freed; -EAGAIN if none; -EIO if the device returned a bad id
 * or length (the ring is then broken).
 */
int vring_drv_get_used(struct vring_drv *d, uint32_t *ret_len, void **ret_cookie);

/* True if the device has returned buffers not yet taken with vring_drv_get_used(). */
bool vring_drv_more_used(struct vring_drv *d);

/*
 * Asks the device not to interrupt (NO_INTERRUPT without EVENT_IDX; with EVENT_IDX used_event is
 * left behind, so at most one more interrupt comes).
 */
void vring_drv_disable_cb(struct vring_drv *d);

/*
 * Asks for an interrupt at the next used buffer (used_event = last seen used idx, or clears
 * NO_INTERRUPT), then issues a full barrier and re-checks used->idx. Returns true if used
 * buffers are already pending (returned before the device could see the request, so no
 * interrupt may come: the caller must poll again instead of sleeping), false if it is safe to
 * wait for the interrupt.
 */
bool vring_drv_enable_cb(struct vring_drv *d);

/* Free descriptors. */
unsigned vring_drv_num_free(const struct vring_drv *d);

/* True once a device error was detected. */
bool vring_drv_broken(const struct vring_drv *d);

#endif
