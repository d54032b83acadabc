/* SPDX-License-Identifier: MIT */
/*
 * Packed virtqueue (virtio 1.2 §2.8): the in-memory formats, the private state of both roles and
 * the entry points that vring.c and vring_drv.c dispatch to when VIRTIO_F_RING_PACKED is in the
 * features. Callers use the vring_dev_* / vring_drv_* API (vring.h, vring_drv.h); nothing outside
 * src/vring calls the vring_pk_* functions.
 *
 * One ring of num descriptors (any num in 1..32768, not only powers of two) plus two 4-byte event
 * suppression areas: the driver area (written by the driver, read by the device: when to
 * interrupt) and the device area (written by the device: when to kick). Both sides keep a wrap
 * counter that starts at 1 and flips each time their position passes the end of the ring; a
 * descriptor is available when its AVAIL flag equals the driver's wrap counter and its USED flag
 * does not, and used when both equal the device's wrap counter at that slot.
 *
 * Context: as for the split ring, one queue is used by one thread; nothing here locks.
 */
#ifndef UVSOCK_VRING_PACKED_H
#define UVSOCK_VRING_PACKED_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#define VRING_PK_MAX_SIZE 32768u
#define VRING_PK_DESC_F_AVAIL (1u << 7)
#define VRING_PK_DESC_F_USED (1u << 15)
/* Event suppression flags (virtio 1.2 §2.8.10); DESC needs VIRTIO_RING_F_EVENT_IDX. */
#define VRING_PK_EVENT_F_ENABLE 0u
#define VRING_PK_EVENT_F_DISABLE 1u
#define VRING_PK_EVENT_F_DESC 2u
#define VRING_PK_WRAP_BIT 15 /* in off_wrap and in the vhost-user vring base */

struct vring_pk_desc_le {
	uint64_t addr;  /* le64 guest-physical */
	uint32_t len;   /* le32 */
	uint16_t id;    /* le16 buffer id */
	uint16_t flags; /* le16 VRING_DESC_F_* | AVAIL | USED */
};

/* An event suppression area; read and written as one le32 (off_wrap low, flags high). */
struct vring_pk_event_le {
	uint16_t off_wrap; /* le16 descriptor offset | wrap counter << 15 */
	uint16_t flags;    /* le16 VRING_PK_EVENT_F_* */
};

static inline bool vring_pk_size_valid(unsigned num)
{
	return num > 0 && num <= VRING_PK_MAX_SIZE;
}

/* Packs an event area value for one 32-bit store. */
static inline uint32_t vring_pk_event_word(uint16_t off, bool wrap, uint16_t flags)
{
	return (uint32_t)(off | (uint16_t)wrap << VRING_PK_WRAP_BIT) | (uint32_t)flags << 16;
}

/*
 * Event-offset test of both roles (virtio 1.2 §2.8.10, the packed form of §2.7.10): the other
 * side asked for a notification when the descriptor at off_wrap is written, and our position
 * moved by `moved` descriptors from (old, old_wrap). Positions are compared on a lap of 2 * num
 * (slot on an odd lap, i.e. wrap 1, and slot + num on an even one). A value that cannot be valid
 * (offset >= num) or a move of a whole ring or more asks for the notification: one too many is
 * harmless, one too few hangs the peer.
 */
static inline bool vring_pk_event_passed(unsigned num, uint16_t off_wrap, uint16_t old,
					 bool old_wrap, uint32_t moved)
{
	uint32_t off = off_wrap & 0x7fffu, lap = 2 * num, e, o;

	if (moved == 0)
		return false;
	if (off >= num || moved >= num)
		return true;
	e = off + ((off_wrap >> VRING_PK_WRAP_BIT) ? 0 : num);
	o = old + (old_wrap ? 0 : num);
	return (e + lap - o) % lap < moved;
}

/* Device-side packed state, embedded in struct vring_dev_queue; private to packed.c. */
struct vring_pk_dev {
	struct vring_pk_desc_le *ring;
	struct vring_pk_event_le *drv_ev; /* driver area: interrupt suppression (guest-written) */
	struct vring_pk_event_le *dev_ev; /* device area: kick suppression (we write) */
	uint16_t avail;                   /* next slot to consume */
	bool avail_wrap;
	uint16_t used;                    /* next slot to write a used descriptor to */
	bool used_wrap;
	bool batch;                       /* a filled descriptor's flags wait for flush */
	uint16_t batch_slot, batch_flags;
	uint32_t batch_descs;             /* ring slots covered by the pending batch */
	uint16_t pub;                     /* position after the last flush */
	bool pub_wrap;
	uint16_t sig;                     /* position at the last interrupt decision */
	bool sig_wrap;
	uint32_t unsignalled;             /* slots published since that decision */
	/* VIRTIO_F_IN_ORDER (virtio 1.2 §2.8.8, "In-order use of descriptors"): buffers are
	 * filled in the order they were consumed; one used descriptor may stand for a batch. */
	bool in_order;
	bool hold;                        /* a used descriptor waits for the next fill or flush */
	bool hold_full;                   /* ... and its buffer was used completely (folds) */
	bool hold_wrap;
	uint16_t hold_slot, hold_id;      /* where it goes (its batch's first slot), its id */
	uint32_t hold_len;
	uint16_t pop_ord, fill_ord;       /* buffers consumed / filled, mod VRING_PK_MAX_SIZE */
	uint64_t rw[VRING_PK_MAX_SIZE / 64]; /* by consumption ordinal: the buffer has writable
					      * descriptors (at most num are in flight) */
	uint16_t ndescs[VRING_PK_MAX_SIZE]; /* ring slots of each in-flight buffer id, 0 if free */
};

struct vring_dev_queue;
struct vring_dev_config;
struct vring_chain;

/* The packed bodies of the vring_dev_* functions of the same name (same contracts). */
int vring_pk_dev_init(struct vring_dev_queue *q, const struct vring_dev_config *cfg);
int vring_pk_dev_pop(struct vring_dev_queue *q, struct iovec *out_iov, unsigned out_max,
		     struct iovec *in_iov, unsigned in_max, struct vring_chain *ret);
int vring_pk_dev_skip(struct vring_dev_queue *q, uint16_t *ret_head);
int vring_pk_dev_fill(struct vring_dev_queue *q, uint16_t head, uint32_t len);
void vring_pk_dev_flush(struct vring_dev_queue *q);
bool vring_pk_dev_should_notify(struct vring_dev_queue *q);
void vring_pk_dev_disable_notify(struct vring_dev_queue *q);
bool vring_pk_dev_enable_notify(struct vring_dev_queue *q);
int vring_pk_dev_avail_count(struct vring_dev_queue *q);
bool vring_pk_dev_empty(struct vring_dev_queue *q);
uint16_t vring_pk_dev_base(const struct vring_dev_queue *q);

/* Driver side (packed_drv.c): the bodies of the vring_drv_* functions of the same name. */
struct vring_pk_drv;
struct vring_drv_buf;

int vring_pk_drv_new(unsigned num, void *ring, void *drv_ev, void *dev_ev, uint64_t features,
		     struct vring_pk_drv **ret);
void vring_pk_drv_free(struct vring_pk_drv *p);
int vring_pk_drv_add(struct vring_pk_drv *p, const struct vring_drv_buf *bufs, unsigned n,
		     void *cookie);
int vring_pk_drv_add_indirect(struct vring_pk_drv *p, const struct vring_drv_buf *bufs,
			      unsigned n, void *table_host, uint64_t table_gpa, void *cookie);
void vring_pk_drv_publish(struct vring_pk_drv *p);
bool vring_pk_drv_kick_prepare(struct vring_pk_drv *p);
int vring_pk_drv_get_used(struct vring_pk_drv *p, uint32_t *ret_len, void **ret_cookie);
bool vring_pk_drv_more_used(struct vring_pk_drv *p);
void vring_pk_drv_disable_cb(struct vring_pk_drv *p);
bool vring_pk_drv_enable_cb(struct vring_pk_drv *p);
unsigned vring_pk_drv_num_free(const struct vring_pk_drv *p);
bool vring_pk_drv_broken(const struct vring_pk_drv *p);

#endif
