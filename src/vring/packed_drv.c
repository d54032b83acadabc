/* SPDX-License-Identifier: MIT */
/*
 * Packed virtqueue, driver side (virtio 1.2 §2.8): the bodies of the vring_drv_* functions for a
 * ring created with VIRTIO_F_RING_PACKED. A free list of buffer ids, buffers written as runs of
 * ring descriptors (or one descriptor pointing at an indirect table), the first descriptor of a
 * publication batch made available last, kick and interrupt suppression through the two event
 * areas, and collection of used descriptors. With VIRTIO_F_IN_ORDER buffer ids are handed out in
 * sequence and a used descriptor may complete every earlier buffer in flight (virtio 1.2 §2.8.8).
 *
 * Security model: the device is less trusted than our own state. The descriptor count, writable
 * length and cookie of every buffer id are private; a used descriptor whose id is out of range or
 * not in flight, or whose length exceeds the buffer's writable bytes, breaks the ring (-EIO); so
 * does, under IN_ORDER, one whose id is further from the oldest buffer than buffers are in flight.
 *
 * Memory ordering, driver side (docs/vring.md, "Packed rings"):
 *   1. stores of a batch's descriptors (and indirect tables)  →  store of the batch's first
 *      flags (release);
 *   2. that store  →  full fence  →  load of the device event area (kick decision);
 *   3. load of the flags at our used slot (acquire)  →  loads of its id/len and buffer contents;
 *   4. store of the driver event area  →  full fence  →  load of the used slot's flags.
 */
#include "vring/vring_drv.h"

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/macros.h"

/* Private state of one buffer id. */
struct pk_id {
	void *cookie;    /* non-NULL while the buffer is in flight */
	uint32_t in_len; /* writable bytes (bound for the used len) */
	uint16_t slots;  /* ring descriptors it takes */
	uint16_t next;   /* free-list link */
};

struct vring_pk_drv {
	struct vring_pk_desc_le *ring;
	struct vring_pk_event_le *drv_ev; /* we write: interrupt suppression */
	struct vring_pk_event_le *dev_ev; /* device writes: kick suppression */
	uint32_t num;
	bool event_idx, indirect, broken, cb_enabled;
	bool in_order;           /* ids taken in sequence from old_id; completed in that order */
	uint16_t old_id;         /* IN_ORDER: the oldest id in flight (the next one if none) */
	uint16_t batch_left;     /* IN_ORDER: buffers of the used batch read but not yet taken */
	uint32_t batch_len;      /* IN_ORDER: len of the batch's used descriptor (its last buffer) */
	uint16_t avail;          /* next slot to fill */
	bool avail_wrap;
	uint16_t used;           /* next slot to read a used descriptor from */
	bool used_wrap;
	uint32_t num_free;       /* free ring descriptors */
	uint16_t free_id;        /* head of the id free list (valid while ids_free > 0) */
	uint32_t ids_free;
	bool batch;              /* the batch's first flags are not stored yet */
	uint16_t batch_slot, batch_flags;
	uint16_t kicked;         /* avail position at the last kick decision */
	bool kicked_wrap;
	uint32_t unkicked;       /* slots made available since then */
	struct pk_id *id;        /* [num] */
};

static inline uint32_t ev_load(const struct vring_pk_event_le *ev)
{
	return vring_load32_relaxed((const uint32_t *)(const void *)ev);
}
static inline void ev_store(struct vring_pk_event_le *ev, uint32_t v)
{
	vring_store32_relaxed((uint32_t *)(void *)ev, v);
}

int vring_pk_drv_new(unsigned num, void *ring, void *drv_ev, void *dev_ev, uint64_t features,
		     struct vring_pk_drv **ret)
{
	struct vring_pk_drv *p;

	if (!ret || !vring_pk_size_valid(num) || !ring || !drv_ev || !dev_ev)
		return -EINVAL;
	if ((uintptr_t)ring % VRING_DESC_ALIGN || (uintptr_t)drv_ev % 4 || (uintptr_t)dev_ev % 4)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->id = calloc(num, sizeof(*p->id));
	if (!p->id) {
		free(p);
		return -ENOMEM;
	}
	p->ring = ring;
	p->drv_ev = drv_ev;
	p->dev_ev = dev_ev;
	p->num = num;
	p->event_idx = features & (1ull << VRING_FEAT_EVENT_IDX);
	p->indirect = features & (1ull << VRING_FEAT_INDIRECT_DESC);
	p->in_order = features & (1ull << VRING_FEAT_IN_ORDER);
	p->cb_enabled = true;
	p->avail_wrap = p->used_wrap = p->kicked_wrap = true; /* virtio 1.2 §2.8.1 */
	p->num_free = p->ids_free = num;
	for (unsigned i = 0; i < num; i++)
		p->id[i].next = (uint16_t)(i + 1); /* the last link is never followed */
	memset(ring, 0, (size_t)16 * num);
	memset(drv_ev, 0, sizeof(struct vring_pk_event_le));
	memset(dev_ev, 0, sizeof(struct vring_pk_event_le));
	*ret = p;
	return 0;
}

void vring_pk_drv_free(struct vring_pk_drv *p)
{
	if (!p)
		return;
	free(p->id);
	free(p);
}

/* Flags that make a descriptor available at the current avail position. */
static inline uint16_t avail_bits(const struct vring_pk_drv *p)
{
	return p->avail_wrap ? (uint16_t)VRING_PK_DESC_F_AVAIL : (uint16_t)VRING_PK_DESC_F_USED;
}

static inline void advance_avail(struct vring_pk_drv *p)
{
	if ((uint32_t)++p->avail == p->num) {
		p->avail = 0;
		p->avail_wrap = !p->avail_wrap;
	}
}

/*
 * Writes one ring descriptor at the avail position and advances it. The first one of a buffer
 * gets everything but its flags; those are stored last (here with release, or at publish for the
 * first buffer of a batch), since storing them makes the whole buffer available.
 */
static void put_desc(struct vring_pk_drv *p, bool first, uint64_t addr, uint32_t len, uint16_t id,
		     uint16_t flags, uint16_t *ret_first_slot, uint16_t *ret_first_flags)
{
	struct vring_pk_desc_le *e = &p->ring[p->avail];

	flags |= avail_bits(p);
	if (first) {
		vring_store32_relaxed(&e->len, len);
		vring_store16_relaxed(&e->id, id);
		memcpy(&e->addr, &(uint64_t){ htole64(addr) }, sizeof(e->addr));
		*ret_first_slot = p->avail;
		*ret_first_flags = flags;
	} else {
		struct vring_pk_desc_le v = {
			.addr = htole64(addr),
			.len = htole32(len),
			.id = htole16(id),
			.flags = htole16(flags),
		};

		memcpy(e, &v, sizeof(v));
	}
	advance_avail(p);
}

/* Makes the buffer whose first descriptor is at slot (with flags) available. */
static void make_avail(struct vring_pk_drv *p, uint16_t slot, uint16_t flags, uint16_t slots)
{
	if (!p->batch) {
		p->batch = true;
		p->batch_slot = slot;
		p->batch_flags = flags;
	} else {
		/* Release: orders the stores of this buffer's descriptors (and indirect table)
		 * before its first flags. The device stops at the batch's first slot until
		 * publish, so this cannot be seen early anyway; the order keeps a polling
		 * device's view whole. */
		vring_store16_release(&p->ring[slot].flags, flags);
	}
	p->unkicked += slots;
}

static int64_t check_bufs(const struct vring_drv_buf *bufs, unsigned n)
{
	bool seen_write = false;
	uint64_t in_len = 0;

	if (n == 0 || !bufs)
		return -EINVAL;
	for (unsigned k = 0; k < n; k++) {
		if (!bufs[k].write && seen_write)
			return -EINVAL;
		seen_write |= bufs[k].write;
		if (bufs[k].write)
			in_len += bufs[k].len;
	}
	return in_len > UINT32_MAX ? (int64_t)UINT32_MAX : (int64_t)in_len;
}

/* The number of buffers in flight (added and not yet returned by get_used). */
static inline uint32_t ids_used(const struct vring_pk_drv *p)
{
	return p->num - p->ids_free;
}

static uint16_t take_id(struct vring_pk_drv *p, void *cookie, uint32_t in_len, uint16_t slots)
{
	uint16_t id;

	if (p->in_order) {
		/* In sequence after the ones in flight: they complete in this order, so the ids
		 * in flight are always the run old_id, old_id + 1, ... (mod num). */
		id = (uint16_t)((p->old_id + ids_used(p)) % p->num);
	} else {
		id = p->free_id;
		p->free_id = p->id[id].next;
	}
	p->ids_free--;
	p->num_free -= slots;
	p->id[id].cookie = cookie;
	p->id[id].in_len = in_len;
	p->id[id].slots = slots;
	return id;
}

int vring_pk_drv_add(struct vring_pk_drv *p, const struct vring_drv_buf *bufs, unsigned n,
		     void *cookie)
{
	uint16_t id, first_slot = 0, first_flags = 0;
	int64_t in_len;

	if (p->broken)
		return -EIO;
	in_len = check_bufs(bufs, n);
	if (in_len < 0 || !cookie)
		return -EINVAL;
	if (n > p->num_free || p->ids_free == 0)
		return -ENOSPC;
	id = take_id(p, cookie, (uint32_t)in_len, (uint16_t)n);
	for (unsigned k = 0; k < n; k++) {
		uint16_t flags = bufs[k].write ? VRING_DESC_F_WRITE : 0;

		if (k + 1 < n)
			flags |= VRING_DESC_F_NEXT;
		put_desc(p, k == 0, bufs[k].addr, bufs[k].len, id, flags, &first_slot,
			 &first_flags);
	}
	make_avail(p, first_slot, first_flags, (uint16_t)n);
	return id;
}

int vring_pk_drv_add_indirect(struct vring_pk_drv *p, const struct vring_drv_buf *bufs,
			      unsigned n, void *table_host, uint64_t table_gpa, void *cookie)
{
	struct vring_pk_desc_le *table = table_host;
	uint16_t id, first_slot = 0, first_flags = 0;
	int64_t in_len;

	if (p->broken)
		return -EIO;
	in_len = check_bufs(bufs, n);
	if (in_len < 0 || !cookie || !p->indirect || n > p->num || !table ||
	    (uintptr_t)table % VRING_DESC_ALIGN)
		return -EINVAL;
	if (p->num_free == 0 || p->ids_free == 0)
		return -ENOSPC;
	for (unsigned k = 0; k < n; k++) {
		struct vring_pk_desc_le v = {
			.addr = htole64(bufs[k].addr),
			.len = htole32(bufs[k].len),
			.flags = htole16(bufs[k].write ? VRING_DESC_F_WRITE : 0),
		};

		memcpy(&table[k], &v, sizeof(v));
	}
	id = take_id(p, cookie, (uint32_t)in_len, 1);
	put_desc(p, true, table_gpa, (uint32_t)(16 * n), id, VRING_DESC_F_INDIRECT, &first_slot,
		 &first_flags);
	make_avail(p, first_slot, first_flags, 1);
	return id;
}

void vring_pk_drv_publish(struct vring_pk_drv *p)
{
	if (!p->batch)
		return;
	/* Release: orders the stores of every descriptor and indirect table of the batch before
	 * this store of its first flags (device side: its acquire load of them). */
	vring_store16_release(&p->ring[p->batch_slot].flags, p->batch_flags);
	p->batch = false;
}

bool vring_pk_drv_kick_prepare(struct vring_pk_drv *p)
{
	uint16_t old = p->kicked, flags;
	bool old_wrap = p->kicked_wrap;
	uint32_t moved = p->unkicked, ev;

	vring_pk_drv_publish(p);
	/* Full barrier: orders the flags store above before the load of the device event area,
	 * pairing with the device's fence between writing that area and re-reading our slot. */
	atomic_thread_fence(memory_order_seq_cst);
	p->kicked = p->avail;
	p->kicked_wrap = p->avail_wrap;
	p->unkicked = 0;
	if (moved == 0)
		return false;
	ev = ev_load(p->dev_ev);
	flags = (uint16_t)(ev >> 16);
	if (flags == VRING_PK_EVENT_F_DISABLE)
		return false;
	if (flags != VRING_PK_EVENT_F_DESC || !p->event_idx)
		return true;
	return vring_pk_event_passed(p->num, (uint16_t)ev, old, old_wrap, moved);
}

static int broken(struct vring_pk_drv *p)
{
	p->broken = true;
	return -EIO;
}

/* True if the descriptor at our used slot was written back by the device. */
static bool used_ready(const struct vring_pk_drv *p)
{
	/* Acquire: orders this load of the flags before the loads of the descriptor's id/len and
	 * of the buffer contents (device side: its release store of these flags). */
	uint16_t f = vring_load16_acquire(&p->ring[p->used].flags);

	return !!(f & VRING_PK_DESC_F_AVAIL) == p->used_wrap &&
	       !!(f & VRING_PK_DESC_F_USED) == p->used_wrap;
}

static void write_drv_event(struct vring_pk_drv *p)
{
	if (p->event_idx)
		ev_store(p->drv_ev,
			 vring_pk_event_word(p->used, p->used_wrap, VRING_PK_EVENT_F_DESC));
	else
		ev_store(p->drv_ev, vring_pk_event_word(0, false, VRING_PK_EVENT_F_ENABLE));
}

/* Returns id's ring slots and its id state to the free side and moves the used position past it. */
static void release_id(struct vring_pk_drv *p, uint16_t id)
{
	uint32_t u = (uint32_t)p->used + p->id[id].slots;

	p->id[id].cookie = NULL;
	if (p->in_order) {
		p->old_id = (uint32_t)p->old_id + 1 == p->num ? 0 : (uint16_t)(p->old_id + 1);
	} else {
		p->id[id].next = p->free_id;
		p->free_id = id;
	}
	p->ids_free++;
	p->num_free += p->id[id].slots;
	/* The device skips as many slots as the buffer took (virtio 1.2 §2.8.6). */
	if (u >= p->num) {
		u -= p->num;
		p->used_wrap = !p->used_wrap;
	}
	p->used = (uint16_t)u;
}

/*
 * Reads the used descriptor at our used slot and checks its id (in range, in flight) and len
 * (at most the buffer's writable bytes). Returns 0, -EAGAIN (not written yet) or -EIO (broken).
 */
static int read_used(struct vring_pk_drv *p, uint16_t *ret_id, uint32_t *ret_len)
{
	struct vring_pk_desc_le *e = &p->ring[p->used];
	uint32_t len;
	uint16_t id;

	if (!used_ready(p))
		return -EAGAIN;
	id = vring_load16_relaxed(&e->id);
	len = vring_load32_relaxed(&e->len);
	if (id >= p->num || !p->id[id].cookie || len > p->id[id].in_len)
		return broken(p);
	*ret_id = id;
	*ret_len = len;
	return 0;
}

/*
 * IN_ORDER: reads the used descriptor at our used slot, which ends a batch: its id is the batch's
 * last buffer, every earlier buffer in flight belongs to it (virtio 1.2 §2.8.8). Returns 0
 * (batch_left and batch_len set), -EAGAIN or -EIO.
 */
static int read_batch(struct vring_pk_drv *p)
{
	uint32_t len = 0, dist;
	uint16_t id = 0;
	int r = read_used(p, &id, &len);

	if (r < 0)
		return r;
	dist = ((uint32_t)id + p->num - p->old_id) % p->num;
	if (dist >= ids_used(p))
		return broken(p); /* not among the ids in flight: used out of order */
	p->batch_left = (uint16_t)(dist + 1);
	p->batch_len = len;
	return 0;
}

int vring_pk_drv_get_used(struct vring_pk_drv *p, uint32_t *ret_len, void **ret_cookie)
{
	uint32_t len = 0;
	uint16_t id = 0;
	void *cookie;
	int r;

	if (p->broken)
		return -EIO;
	if (p->in_order) {
		if (p->batch_left == 0 && (r = read_batch(p)) < 0)
			return r;
		id = p->old_id;
		p->batch_left--;
		/* A skipped buffer was used completely; the last one has the descriptor's len. */
		len = p->batch_left ? p->id[id].in_len : p->batch_len;
	} else if ((r = read_used(p, &id, &len)) < 0) {
		return r;
	}
	cookie = p->id[id].cookie;
	release_id(p, id);
	/* With EVENT_IDX and interrupts wanted, ask for one at the next used slot (after a whole
	 * batch: inside one, the slots are never written). No fence here:
	 * vring_pk_drv_enable_cb() is the race-free way to go to sleep. */
	if (p->event_idx && p->cb_enabled && p->batch_left == 0)
		write_drv_event(p);
	*ret_len = len;
	*ret_cookie = cookie;
	return 0;
}

bool vring_pk_drv_more_used(struct vring_pk_drv *p)
{
	return !p->broken && (p->batch_left > 0 || used_ready(p));
}

void vring_pk_drv_disable_cb(struct vring_pk_drv *p)
{
	p->cb_enabled = false;
	ev_store(p->drv_ev, vring_pk_event_word(0, false, VRING_PK_EVENT_F_DISABLE));
}

bool vring_pk_drv_enable_cb(struct vring_pk_drv *p)
{
	p->cb_enabled = true;
	write_drv_event(p);
	/* Full barrier: orders the event-area store above before the load of the used slot's
	 * flags, pairing with the device's fence between its flags store and reading our area:
	 * either it sees the request and interrupts, or we see its used descriptor here. */
	atomic_thread_fence(memory_order_seq_cst);
	return vring_pk_drv_more_used(p);
}

unsigned vring_pk_drv_num_free(const struct vring_pk_drv *p)
{
	return p->ids_free == 0 ? 0 : p->num_free;
}

bool vring_pk_drv_broken(const struct vring_pk_drv *p)
{
	return p->broken;
}
