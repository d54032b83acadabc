/* SPDX-License-Identifier: MIT */
/*
 * Split virtqueue (virtio 1.2 §2.7), device side: what vhost does with a ring the guest driver
 * fills. Pop a descriptor chain into caller-provided readable ("out") and writable ("in") iovec
 * arrays, push used elements (one at a time or as a batch with one used->idx publication), decide
 * whether the guest needs an interrupt, and suppress / re-enable guest kicks. The ring layout
 * constants and helpers here are shared with the driver side (vring_drv.h).
 *
 * Security model: the guest is untrusted. Every index and descriptor read from the ring is
 * validated before use (head and next < table size, chain length <= queue size, indirect-table
 * rules, readable-before-writable, every buffer inside guest memory). A violation marks the queue
 * broken (vring_dev_error() says why) and every later data-path call returns -EIO; nothing a
 * guest writes can crash, assert, hang or allocate here.
 *
 * Ownership: the iovecs returned by pop point into guest memory. They are borrowed until the
 * chain is pushed back and must never be kept across a SET_MEM_TABLE (the guest_mem they came
 * from is freed then). Context: one queue is used by one thread (the device thread); nothing
 * here locks.
 */
#ifndef UVSOCK_VRING_VRING_H
#define UVSOCK_VRING_VRING_H

#include <stdbool.h>
#include <stddef.h>
#include <endian.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vring/dirty_log.h"
#include "vring/guest_mem.h"
#include "vring/packed.h"

/* Layout constants (virtio 1.2 §2.7). Fields in guest memory are little-endian. */
#define VRING_MAX_SIZE 32768u
#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4
#define VRING_AVAIL_F_NO_INTERRUPT 1
#define VRING_USED_F_NO_NOTIFY 1
/* Feature bit numbers (as in the virtio feature word). */
#define VRING_FEAT_INDIRECT_DESC 28
#define VRING_FEAT_EVENT_IDX 29
#define VRING_FEAT_RING_PACKED 34 /* virtio 1.2 §2.8 */
#define VRING_FEAT_IN_ORDER 35    /* virtio 1.2 §2.7.9, §2.8.21 */

/* Alignment the spec requires of each part; vring_layout() uses 64 for avail and used. */
#define VRING_DESC_ALIGN 16u
#define VRING_AVAIL_ALIGN 2u
#define VRING_USED_ALIGN 4u

/* The in-memory formats (names chosen not to clash with <linux/virtio_ring.h>). */
struct vring_desc_le {
	uint64_t addr; /* le64 guest-physical */
	uint32_t len;  /* le32 */
	uint16_t flags; /* le16 VRING_DESC_F_* */
	uint16_t next; /* le16 */
};
struct vring_avail_le {
	uint16_t flags; /* le16 VRING_AVAIL_F_NO_INTERRUPT */
	uint16_t idx;   /* le16, free-running, written by the driver */
	uint16_t ring[]; /* le16 [num] heads, then le16 used_event */
};
struct vring_used_elem_le {
	uint32_t id;  /* le32 head of the chain */
	uint32_t len; /* le32 bytes written into the chain's writable buffers */
};
struct vring_used_le {
	uint16_t flags; /* le16 VRING_USED_F_NO_NOTIFY */
	uint16_t idx;   /* le16, free-running, written by the device */
	struct vring_used_elem_le ring[]; /* [num], then le16 avail_event */
};

/* Bytes of each part for a queue of num entries (including the event-idx trailer). */
static inline size_t vring_desc_size(unsigned num)
{
	return (size_t)16 * num;
}
static inline size_t vring_avail_size(unsigned num)
{
	return 6 + (size_t)2 * num;
}
static inline size_t vring_used_size(unsigned num)
{
	return 6 + (size_t)8 * num;
}

/*
 * The only accesses of guest memory's shared ring fields (both roles): single, untorn loads and
 * stores of little-endian fields, in CPU order. Guest memory is not C11 _Atomic objects (the
 * guest shares it), so these are the tree's only GCC __atomic builtins. The relaxed ones order
 * nothing: ordering against other fields is the caller's, with its own commented barrier. The
 * acquire load and the release store are the index publications of the split ring (virtio 1.2
 * §2.7.13 and §2.7.14; docs/vring.md, "Barriers"): the caller's comment names what each orders.
 */
static inline uint16_t vring_load16_relaxed(const uint16_t *p)
{
	return le16toh(__atomic_load_n(p, __ATOMIC_RELAXED));
}
static inline void vring_store16_relaxed(uint16_t *p, uint16_t v)
{
	__atomic_store_n(p, htole16(v), __ATOMIC_RELAXED);
}
static inline uint16_t vring_load16_acquire(const uint16_t *p)
{
	return le16toh(__atomic_load_n(p, __ATOMIC_ACQUIRE));
}
static inline void vring_store16_release(uint16_t *p, uint16_t v)
{
	__atomic_store_n(p, htole16(v), __ATOMIC_RELEASE);
}
static inline uint32_t vring_load32_relaxed(const uint32_t *p)
{
	return le32toh(__atomic_load_n(p, __ATOMIC_RELAXED));
}
static inline void vring_store32_relaxed(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, htole32(v), __ATOMIC_RELAXED);
}

/*
 * The event-idx trailers (virtio 1.2 §2.7.10): used_event after avail's ring, avail_event after
 * used's.
 */
static inline uint16_t *vring_used_event(struct vring_avail_le *avail, unsigned num)
{
	return &avail->ring[num];
}
static inline uint16_t *vring_avail_event(struct vring_used_le *used, unsigned num)
{
	return (uint16_t *)&used->ring[num];
}

/*
 * Where the three parts go when placed in one area: desc at 0, avail and used each aligned to 64
 * bytes (more than the spec requires, so that the driver-written avail ring and the
 * device-written used ring do not share a cache line). `total` is the area size.
 */
struct vring_layout {
	size_t desc_off, avail_off, used_off, total;
};

/* Fills *l for a queue of num entries. Returns 0 or -EINVAL (num not a power of two <= 32768). */
int vring_layout(unsigned num, struct vring_layout *l);

/*
 * The same for a packed ring (virtio 1.2 §2.8): descriptor ring at desc_off, driver event area at
 * avail_off, device event area at used_off (each on its own 64-byte line). Any num in 1..32768.
 * Returns 0 or -EINVAL.
 */
int vring_layout_packed(unsigned num, struct vring_layout *l);

/* True if num is a valid split-queue size: a power of two, 1..VRING_MAX_SIZE. */
static inline bool vring_size_valid(unsigned num)
{
	return num > 0 && num <= VRING_MAX_SIZE && (num & (num - 1)) == 0;
}

/*
 * virtio 1.2 §2.7.10: true if moving an index from old to new_idx passed event, i.e. the other side
 * asked to be notified when idx reaches event + 1. All u16 arithmetic (wraps).
 */
static inline bool vring_idx_passed_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

/* Why a queue is broken. */
enum vring_err {
	VRING_ERR_NONE,
	VRING_ERR_AVAIL_IDX,          /* avail->idx moved more than num past last_avail_idx */
	VRING_ERR_HEAD,               /* head index from avail ring >= num */
	VRING_ERR_NEXT,               /* next index >= table size */
	VRING_ERR_LOOP,               /* chain longer than the queue size: a loop */
	VRING_ERR_INDIRECT_FEATURE,   /* INDIRECT used without VIRTIO_RING_F_INDIRECT_DESC */
	VRING_ERR_INDIRECT_LEN,       /* indirect table length zero or not a multiple of 16 */
	VRING_ERR_INDIRECT_NESTED,    /* INDIRECT inside an indirect table */
	VRING_ERR_INDIRECT_NEXT,      /* INDIRECT and NEXT on the same descriptor */
	VRING_ERR_INDIRECT_ADDR,      /* indirect table outside guest memory */
	VRING_ERR_ORDER,              /* readable descriptor after a writable one */
	VRING_ERR_ADDR,               /* buffer outside guest memory */
	_VRING_ERR_MAX,
};

/* Static name of e ("head out of range", ...); "unknown" for out-of-range values. */
const char *vring_err_to_string(enum vring_err e);

/* How the ring addresses in struct vring_dev_config are expressed. */
enum vring_addr_kind {
	VRING_ADDR_HOST, /* host pointers (cast to uint64_t) */
	VRING_ADDR_UVA,  /* front-end virtual addresses (vhost-user SET_VRING_ADDR) */
	VRING_ADDR_GPA,  /* guest-physical addresses */
	_VRING_ADDR_MAX,
};

struct vring_dev_config {
	const struct guest_mem *mem; /* borrowed, required; must outlive the queue's use */
	unsigned num;                /* queue size: power of two, <= 32768 */
	enum vring_addr_kind addr_kind;
	uint64_t desc_addr, avail_addr, used_addr;
	uint64_t features;       /* negotiated bits (INDIRECT_DESC, EVENT_IDX, IN_ORDER used here) */
	uint16_t last_avail_idx; /* SET_VRING_BASE value (0 on first start) */
	/*
	 * VRING_FEAT_RING_PACKED in features selects the packed format (virtio 1.2 §2.8):
	 * desc_addr is the descriptor ring, avail_addr the driver event area, used_addr the device
	 * event area (4 bytes each, 4-aligned); num may be any size 1..32768; and last_avail_idx
	 * is the vhost-user encoding next slot | wrap counter << 15 (0x8000 on first start). The
	 * used position starts equal to the avail position (nothing is in flight across a stop).
	 */
};

/* A popped chain: its head (to push back) and what the iovecs hold. */
struct vring_chain {
	uint16_t head;
	unsigned out_num; /* readable iovecs written to out_iov */
	unsigned in_num;  /* writable iovecs written to in_iov */
	uint64_t out_len; /* total readable bytes */
	uint64_t in_len;  /* total writable bytes */
};

/*
 * Device-side queue state. Embeddable (no allocation); all fields are owned by the device thread
 * and private to vring.c: use the functions below.
 */
struct vring_dev_queue {
	const struct guest_mem *mem;
	struct vring_desc_le *desc;
	struct vring_avail_le *avail;
	struct vring_used_le *used;
	uint32_t num;             /* queue size */
	uint16_t mask;            /* num - 1 */
	bool indirect;            /* VIRTIO_RING_F_INDIRECT_DESC negotiated */
	bool event_idx;           /* VIRTIO_RING_F_EVENT_IDX negotiated */
	bool notify_enabled;      /* guest kicks wanted (vring_dev_enable_notify) */
	bool signalled_valid;     /* signalled_used holds a value (first notify always fires) */
	uint16_t last_avail_idx;  /* next avail slot to consume; wraps */
	uint16_t shadow_avail_idx; /* last avail->idx read; wraps */
	uint16_t used_idx;        /* next used slot to fill; wraps */
	uint16_t published_used;  /* last value stored to used->idx */
	uint16_t signalled_used;  /* used->idx at the last interrupt decision */
	uint16_t used_flags;      /* shadow of used->flags (device-written) */
	uint32_t inflight;        /* chains popped and not yet pushed */
	/* VIRTIO_F_IN_ORDER (virtio 1.2 §2.7.9, used ring §2.7.8): batched used elements. */
	bool in_order;            /* negotiated: elements are filled in pop order */
	bool batch_open;          /* an element is held back until the next fill or flush */
	bool batch_full;          /* the held element's chain was used completely */
	uint16_t batch_slot;      /* used slot of the held element (its batch's first) */
	uint16_t batch_head;      /* the held element */
	uint32_t batch_len;
	bool rw_any;              /* a chain in flight may have writable buffers: */
	uint32_t rw_first;        /* ... none before this ordinal, */
	uint32_t rw_last;         /* ... none after this one */
	uint32_t pop_seq;         /* chains consumed (pop or skip), wraps */
	uint32_t fill_seq;        /* chains filled, wraps: under IN_ORDER the ordinal of the next */
	enum vring_err err;       /* VRING_ERR_NONE unless broken */
	char errmsg[160];          /* human-readable detail of err, for logs */
	struct vring_log *log;     /* dirty log of mem (guest_mem_log()); never NULL */
	bool packed;               /* VIRTIO_F_RING_PACKED: the fields above that name split
				    * ring parts are unused, pk holds the ring (packed.c) */
	struct vring_pk_dev pk;
};

/*
 * Sets q up over a ring the guest laid out. Translates the three addresses through cfg->mem
 * (each part must be contiguous in one region and correctly aligned), and takes the used index
 * from used->idx in guest memory (VIRTIO / vhost-user: on (re)start never assume 0).
 * Notifications start enabled (used->flags and avail_event are written accordingly).
 * Returns 0, -EINVAL (bad num, addr_kind or alignment) or -EFAULT (a part outside guest memory).
 * On error q is left untouched. Context: device thread.
 */
int vring_dev_init(struct vring_dev_queue *q, const struct vring_dev_config *cfg);

/*
 * Takes the next available chain. Readable buffers go to out_iov (at most out_max), writable ones
 * to in_iov (at most in_max); a buffer that crosses guest memory regions takes several iovecs.
 * Returns 0 with *ret filled; -EAGAIN if no chain is available; -EIO if the queue is broken (now
 * or before: see vring_dev_error()); -ENOBUFS if the chain needs more iovecs than given — the
 * chain is then NOT consumed and the queue is not broken (retry with more, or drop it with
 * vring_dev_skip()). The iovec arrays may be partly written on error.
 * No allocation; the iovecs are borrowed guest memory until the chain is pushed.
 * Context: device thread.
 */
int vring_dev_pop(struct vring_dev_queue *q, struct iovec *out_iov, unsigned out_max,
		  struct iovec *in_iov, unsigned in_max, struct vring_chain *ret);

/*
 * Consumes the next available chain without walking it (after -ENOBUFS from pop) and returns its
 * head in *ret_head so that the caller can push it back with len 0.
 * Returns 0, -EAGAIN (empty) or -EIO (broken; a bad head breaks the queue). Context: device thread.
 */
int vring_dev_skip(struct vring_dev_queue *q, uint16_t *ret_head);

/*
 * Writes one used element (head, bytes written) into the used ring without publishing it:
 * call vring_dev_flush() after the last one of a batch. Returns 0, -EIO (broken) or -EINVAL
 * (head >= num, or more pushes than pops: caller bugs). Context: device thread.
 * With VIRTIO_F_IN_ORDER the caller must fill chains in the order it popped them (the spec's
 * requirement of the device). The element is then held back: a held element whose chain had no
 * writable buffer and len 0 (used completely, as the driver will assume) is replaced by the next
 * one, so a batch of such chains becomes one used element with the id of its last chain, in the
 * slot of its first (virtio 1.2 §2.7.8); any other element is written in its own slot.
 */
int vring_dev_fill(struct vring_dev_queue *q, uint16_t head, uint32_t len);

/* Publishes every filled element with one store of used->idx (release). Context: device thread. */
void vring_dev_flush(struct vring_dev_queue *q);

/* vring_dev_fill() + vring_dev_flush(): one element, published. Same returns as fill. */
int vring_dev_push(struct vring_dev_queue *q, uint16_t head, uint32_t len);

/*
 * Decides whether the guest must be interrupted for what was published since the last decision:
 * with EVENT_IDX if used->idx passed used_event (and always the first time after init), without
 * it unless the guest set NO_INTERRUPT. Call after vring_dev_flush(); if it returns true, signal
 * the call eventfd. Returns false on a broken queue. Context: device thread.
 */
bool vring_dev_should_notify(struct vring_dev_queue *q);

/*
 * Guest kick suppression while the device is draining the queue: without EVENT_IDX sets
 * NO_NOTIFY in used->flags; with EVENT_IDX stops advancing avail_event. Context: device thread.
 */
void vring_dev_disable_notify(struct vring_dev_queue *q);

/*
 * Re-enables guest kicks before the device goes to sleep: writes avail_event = last_avail_idx
 * (or clears NO_NOTIFY), issues a full barrier and re-reads avail->idx. Returns true if chains
 * are available (they may have been added before the guest could see the re-enable, so no kick
 * will come for them: the caller must drain again instead of sleeping), false if it is safe to
 * wait for a kick (or the queue is broken). Context: device thread.
 */
bool vring_dev_enable_notify(struct vring_dev_queue *q);

/*
 * Number of chains the guest has made available and the device has not popped yet (reads
 * avail->idx). Returns that count (0..num) or -EIO if broken (including by this read, if avail->idx
 * moved more than num ahead). Context: device thread.
 */
int vring_dev_avail_count(struct vring_dev_queue *q);

/* True if no chain is available (or the queue is broken). Context: device thread. */
bool vring_dev_empty(struct vring_dev_queue *q);

/*
 * The value to report for GET_VRING_BASE: the next avail index the device will consume (packed:
 * next slot | wrap counter << 15).
 */
uint16_t vring_dev_last_avail_idx(const struct vring_dev_queue *q);

/* Chains popped and not yet pushed. */
unsigned vring_dev_inflight(const struct vring_dev_queue *q);

/*
 * Dirty logging (vring/dirty_log.h): the device wrote the first len bytes of the writable iovecs
 * iov[0..n) of a popped chain (RX header and payload, an event): marks their pages in the log
 * while logging is on. Call after the writes and before the chain's fill. The rings' own writes
 * (used elements, used->idx and flags, event areas) are marked here without the caller.
 * Context: device thread.
 */
void vring_dev_log_iov_slow(struct vring_dev_queue *q, const struct iovec *iov, unsigned n,
			    uint64_t len);
static inline void vring_dev_log_written(struct vring_dev_queue *q, const struct iovec *iov,
					 unsigned n, uint64_t len)
{
	if (__builtin_expect(q->log->active, 0))
		vring_dev_log_iov_slow(q, iov, n, len);
}

/* Why the queue is broken (VRING_ERR_NONE if it is not). */
enum vring_err vring_dev_error(const struct vring_dev_queue *q);

/* Detail of the error for logs ("" if not broken); valid while q is. */
const char *vring_dev_error_msg(const struct vring_dev_queue *q);

#endif
