/* SPDX-License-Identifier: MIT */
/*
 * Split virtqueue, driver side: free-descriptor list, chain (and indirect table) construction,
 * batched avail publication, kick and interrupt suppression with and without EVENT_IDX, and
 * collection of used buffers.
 *
 * Security model: the device may be buggy or hostile. The free list, chain links, lengths and
 * cookies live in private memory (struct dslot); the shared descriptor table is write-only for
 * us. A used element is checked (id < num, chain in flight, len <= writable bytes, used->idx not
 * ahead of what is in flight) before anything is freed; a violation breaks the ring (-EIO).
 *
 * Memory ordering, driver side (docs/vring.md, "Barriers"; virtio 1.2 §2.7.13 and §2.7.14; Linux
 * drivers/virtio/virtio_ring.c, virtqueue_kick_prepare_split() and virtqueue_get_buf_ctx_split()):
 *   1. stores of descriptors and avail->ring[]  →  store avail->idx (release);
 *   2. store avail->idx  →  full fence  →  load avail_event / used->flags (kick decision);
 *   3. load used->idx (acquire)  →  loads of used->ring[] and of the buffers' contents;
 *   4. store used_event / avail->flags  →  full fence  →  load used->idx (interrupt re-enable).
 */
#include "vring/vring_drv.h"

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/macros.h"

/* Private per-descriptor state. cookie/in_len/ndescs are meaningful for chain heads only. */
struct dslot {
	void *cookie;    /* non-NULL while the chain headed here is in flight */
	uint32_t in_len; /* writable bytes of the chain (bound for the used len) */
	uint16_t next;   /* free-list / chain link (private copy of desc.next) */
	uint16_t ndescs; /* ring descriptors the chain uses (1 for an indirect chain) */
};

struct vring_drv {
	struct vring_desc_le *desc;
	struct vring_avail_le *avail;
	struct vring_used_le *used;
	uint32_t num;
	uint16_t mask;
	bool event_idx;
	bool indirect;
	bool broken;
	bool in_order;           /* VIRTIO_F_IN_ORDER: descriptors taken and returned in ring order */
	bool cb_enabled;         /* interrupts wanted */
	uint16_t batch_left;     /* IN_ORDER: buffers of the current used batch not yet taken */
	uint16_t batch_id;       /* ... the batch's last chain, which carries batch_len */
	uint32_t batch_len;
	uint16_t free_head;      /* first free descriptor (valid when num_free > 0) */
	uint32_t num_free;       /* free ring descriptors */
	uint32_t inflight;       /* chains added and not yet returned */
	uint16_t avail_idx;      /* next avail slot to fill (private; published by publish) */
	uint16_t kicked_avail;   /* avail idx at the last kick decision */
	uint16_t last_used;      /* next used slot to read */
	uint16_t avail_flags;    /* shadow of avail->flags */
	struct dslot *slot;      /* [num] */
	struct vring_pk_drv *pk; /* VIRTIO_F_RING_PACKED: the ring is this one (packed_drv.c) */
};

/* A vring_drv that forwards everything to a packed ring. */
static int new_packed(unsigned num, void *ring, void *drv_ev, void *dev_ev, uint64_t features,
		      struct vring_drv **ret)
{
	struct vring_drv *d;
	int r;

	if (!ret)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	r = vring_pk_drv_new(num, ring, drv_ev, dev_ev, features, &d->pk);
	if (r < 0) {
		free(d);
		return r;
	}
	*ret = d;
	return 0;
}

int vring_drv_new(unsigned num, void *desc, void *avail, void *used, uint64_t features,
		  struct vring_drv **ret)
{
	struct vring_drv *d;

	if (features & (1ull << VRING_FEAT_RING_PACKED))
		return new_packed(num, desc, avail, used, features, ret);

	if (!ret || !vring_size_valid(num) || !desc || !avail || !used)
		return -EINVAL;
	if ((uintptr_t)desc % VRING_DESC_ALIGN || (uintptr_t)avail % VRING_AVAIL_ALIGN ||
	    (uintptr_t)used % VRING_USED_ALIGN)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->slot = calloc(num, sizeof(*d->slot));
	if (!d->slot) {
		free(d);
		return -ENOMEM;
	}
	d->desc = desc;
	d->avail = avail;
	d->used = used;
	d->num = num;
	d->mask = (uint16_t)(num - 1);
	d->event_idx = features & (1ull << VRING_FEAT_EVENT_IDX);
	d->indirect = features & (1ull << VRING_FEAT_INDIRECT_DESC);
	d->in_order = features & (1ull << VRING_FEAT_IN_ORDER);
	d->cb_enabled = true;
	d->num_free = num;
	/* Without IN_ORDER the last link is never followed; with it the table is used as a ring
	 * and the last descriptor's next is 0 (virtio 1.2 §2.7.9). */
	for (unsigned i = 0; i < num; i++)
		d->slot[i].next = (uint16_t)((i + 1) & (d->in_order ? d->mask : 0xffffu));
	memset(desc, 0, vring_desc_size(num));
	memset(avail, 0, vring_avail_size(num));
	memset(used, 0, vring_used_size(num));
	*ret = d;
	return 0;
}

void vring_drv_free(struct vring_drv *d)
{
	if (!d)
		return;
	vring_pk_drv_free(d->pk);
	free(d->slot);
	free(d);
}

static void write_desc(struct vring_desc_le *dst, uint64_t addr, uint32_t len, uint16_t flags,
		       uint16_t next)
{
	struct vring_desc_le v = {
		.addr = htole64(addr),
		.len = htole32(len),
		.flags = htole16(flags),
		.next = htole16(next),
	};

	memcpy(dst, &v, sizeof(v));
}

/* Checks the element list; returns the writable byte count or -EINVAL. */
static int64_t check_bufs(const struct vring_drv_buf *bufs, unsigned n)
{
	bool seen_write = false;
	int64_t in_len = 0;

	if (n == 0 || !bufs)
		return -EINVAL;
	for (unsigned k = 0; k < n; k++) {
		if (bufs[k].write) {
			seen_write = true;
			in_len += bufs[k].len;
		} else if (seen_write) {
			return -EINVAL;
		}
	}
	return in_len > UINT32_MAX ? UINT32_MAX : in_len;
}

/* Takes ndescs free descriptors starting at free_head; returns the head. */
static uint16_t take_free(struct vring_drv *d, unsigned ndescs, uint16_t *ret_last)
{
	uint16_t head = d->free_head, i = head, last = head;

	for (unsigned k = 0; k < ndescs; k++) {
		last = i;
		i = d->slot[i].next;
	}
	d->free_head = i;
	d->num_free -= ndescs;
	*ret_last = last;
	return head;
}

static void make_avail(struct vring_drv *d, uint16_t head, void *cookie, uint32_t in_len,
		       uint16_t ndescs)
{
	d->slot[head].cookie = cookie;
	d->slot[head].in_len = in_len;
	d->slot[head].ndescs = ndescs;
	d->inflight++;
	vring_store16_relaxed(&d->avail->ring[d->avail_idx & d->mask], head);
	d->avail_idx++;
}

int vring_drv_add(struct vring_drv *d, const struct vring_drv_buf *bufs, unsigned n, void *cookie)
{
	uint16_t head, last, i;
	int64_t in_len;

	if (d->pk)
		return vring_pk_drv_add(d->pk, bufs, n, cookie);
	if (d->broken)
		return -EIO;
	in_len = check_bufs(bufs, n);
	if (in_len < 0 || !cookie)
		return -EINVAL;
	if (n > d->num_free)
		return -ENOSPC;
	head = take_free(d, n, &last);
	i = head;
	for (unsigned k = 0; k < n; k++) {
		uint16_t flags = bufs[k].write ? VRING_DESC_F_WRITE : 0;
		uint16_t next = 0;

		if (k + 1 < n) {
			flags |= VRING_DESC_F_NEXT;
			next = d->slot[i].next;
		}
		write_desc(&d->desc[i], bufs[k].addr, bufs[k].len, flags, next);
		i = d->slot[i].next;
	}
	(void)last;
	make_avail(d, head, cookie, (uint32_t)in_len, (uint16_t)n);
	return head;
}

int vring_drv_add_indirect(struct vring_drv *d, const struct vring_drv_buf *bufs, unsigned n,
			   void *table_host, uint64_t table_gpa, void *cookie)
{
	struct vring_desc_le *table = table_host;
	uint16_t head, last;
	int64_t in_len;

	if (d->pk)
		return vring_pk_drv_add_indirect(d->pk, bufs, n, table_host, table_gpa, cookie);
	if (d->broken)
		return -EIO;
	in_len = check_bufs(bufs, n);
	if (in_len < 0 || !cookie || !d->indirect || n > d->num || !table ||
	    (uintptr_t)table % VRING_DESC_ALIGN)
		return -EINVAL;
	if (d->num_free == 0)
		return -ENOSPC;
	for (unsigned k = 0; k < n; k++) {
		uint16_t flags = bufs[k].write ? VRING_DESC_F_WRITE : 0;

		if (k + 1 < n)
			flags |= VRING_DESC_F_NEXT;
		write_desc(&table[k], bufs[k].addr, bufs[k].len, flags,
			   k + 1 < n ? (uint16_t)(k + 1) : 0);
	}
	head = take_free(d, 1, &last);
	write_desc(&d->desc[head], table_gpa, (uint32_t)(16 * n), VRING_DESC_F_INDIRECT, 0);
	make_avail(d, head, cookie, (uint32_t)in_len, 1);
	return head;
}

void vring_drv_publish(struct vring_drv *d)
{
	if (d->pk) {
		vring_pk_drv_publish(d->pk);
		return;
	}
	/* Release: orders the stores of the descriptors (and indirect tables) and of avail->ring[]
	 * before this store of avail->idx (device side: its acquire load of avail->idx). */
	vring_store16_release(&d->avail->idx, d->avail_idx);
}

bool vring_drv_kick_prepare(struct vring_drv *d)
{
	uint16_t old = d->kicked_avail, new_idx = d->avail_idx;

	if (d->pk)
		return vring_pk_drv_kick_prepare(d->pk);
	vring_drv_publish(d);
	/* Full barrier: orders the store of avail->idx above before the loads of avail_event /
	 * used->flags below, pairing with the device's fence between writing avail_event and
	 * re-reading avail->idx; otherwise both sides may miss each other (lost kick). */
	atomic_thread_fence(memory_order_seq_cst);
	d->kicked_avail = new_idx;
	if (new_idx == old)
		return false;
	if (d->event_idx) {
		uint16_t event = vring_load16_relaxed(vring_avail_event(d->used, d->num));

		return vring_idx_passed_event(event, new_idx, old);
	}
	return !(vring_load16_relaxed(&d->used->flags) & VRING_USED_F_NO_NOTIFY);
}

static int broken(struct vring_drv *d)
{
	d->broken = true;
	return -EIO;
}

/*
 * IN_ORDER: the in-flight chains lie in ring order right after the free descriptors, the
 * oldest first; returns the oldest one's head.
 */
static uint16_t oldest_head(const struct vring_drv *d)
{
	return (uint16_t)((d->free_head + d->num_free) & d->mask);
}

/*
 * IN_ORDER: reads the used element at last_used, which ends a batch of one or more buffers
 * (virtio 1.2 §2.7.8: one element with the id of the batch's last buffer, in the slot of its
 * first). The id must head an in-flight chain at most `pending` chains from the oldest one.
 * Returns 0 (batch_left/batch_id/batch_len set) or -EIO.
 */
static int read_batch(struct vring_drv *d, uint16_t pending)
{
	struct vring_used_elem_le *e = &d->used->ring[d->last_used & d->mask];
	uint32_t id = vring_load32_relaxed(&e->id), len = vring_load32_relaxed(&e->len);
	uint16_t h = oldest_head(d);

	if (id >= d->num || !d->slot[id].cookie || len > d->slot[id].in_len)
		return broken(d);
	for (unsigned k = 1; k <= pending; k++) {
		if (h == id) {
			d->batch_left = (uint16_t)k;
			d->batch_id = (uint16_t)id;
			d->batch_len = len;
			return 0;
		}
		h = (uint16_t)((h + d->slot[h].ndescs) & d->mask);
	}
	return broken(d); /* in flight, but beyond what used->idx says was used: out of order */
}

/* IN_ORDER: takes the oldest chain, the next one of the current batch. Returns its head. */
static uint16_t take_in_order(struct vring_drv *d, uint32_t *ret_len)
{
	uint16_t head = oldest_head(d);

	d->batch_left--;
	/* A skipped buffer was used completely (virtio 1.2 §2.7.8); the last has its length. */
	*ret_len = d->batch_left ? d->slot[head].in_len : d->batch_len;
	d->num_free += d->slot[head].ndescs; /* they follow the free ones: no relinking */
	return head;
}

int vring_drv_get_used(struct vring_drv *d, uint32_t *ret_len, void **ret_cookie)
{
	struct vring_used_elem_le *e;
	uint16_t used_idx, pending;
	uint32_t id, len;
	void *cookie;

	if (d->pk)
		return vring_pk_drv_get_used(d->pk, ret_len, ret_cookie);
	if (d->broken)
		return -EIO;
	/* Acquire: orders this load of used->idx before the loads of used->ring[] and of the
	 * buffer contents the device wrote (device side: its release store of used->idx). */
	used_idx = vring_load16_acquire(&d->used->idx);
	pending = (uint16_t)(used_idx - d->last_used);
	if (pending == 0)
		return -EAGAIN;
	if (pending > d->inflight)
		return broken(d);
	if (d->in_order) {
		if (d->batch_left == 0 && read_batch(d, pending) < 0)
			return -EIO;
		id = take_in_order(d, &len);
		goto taken;
	}
	e = &d->used->ring[d->last_used & d->mask];
	id = vring_load32_relaxed(&e->id);
	len = vring_load32_relaxed(&e->len);
	if (id >= d->num || !d->slot[id].cookie || len > d->slot[id].in_len)
		return broken(d);

	/* Return the chain's descriptors to the free list, following the private links. */
	{
		uint16_t last = (uint16_t)id;

		for (unsigned k = 1; k < d->slot[id].ndescs; k++)
			last = d->slot[last].next;
		d->slot[last].next = d->free_head;
		d->free_head = (uint16_t)id;
		d->num_free += d->slot[id].ndescs;
	}
taken:
	cookie = d->slot[id].cookie;
	d->slot[id].cookie = NULL;
	d->inflight--;
	d->last_used++;
	/* With EVENT_IDX and interrupts wanted, ask for one at the next element. No fence here:
	 * vring_drv_enable_cb() is the race-free way to go to sleep. */
	if (d->event_idx && d->cb_enabled)
		vring_store16_relaxed(vring_used_event(d->avail, d->num), d->last_used);
	*ret_len = len;
	*ret_cookie = cookie;
	return 0;
}

bool vring_drv_more_used(struct vring_drv *d)
{
	if (d->pk)
		return vring_pk_drv_more_used(d->pk);
	return vring_load16_relaxed(&d->used->idx) != d->last_used;
}

void vring_drv_disable_cb(struct vring_drv *d)
{
	if (d->pk) {
		vring_pk_drv_disable_cb(d->pk);
		return;
	}
	d->cb_enabled = false;
	if (d->event_idx)
		return; /* used_event stays behind; at most one more interrupt */
	d->avail_flags |= VRING_AVAIL_F_NO_INTERRUPT;
	vring_store16_relaxed(&d->avail->flags, d->avail_flags);
}

bool vring_drv_enable_cb(struct vring_drv *d)
{
	if (d->pk)
		return vring_pk_drv_enable_cb(d->pk);
	d->cb_enabled = true;
	if (d->event_idx) {
		vring_store16_relaxed(vring_used_event(d->avail, d->num), d->last_used);
	} else {
		d->avail_flags &= (uint16_t)~VRING_AVAIL_F_NO_INTERRUPT;
		vring_store16_relaxed(&d->avail->flags, d->avail_flags);
	}
	/* Full barrier: orders the store of used_event / avail->flags above before the load of
	 * used->idx below, pairing with the device's fence between storing used->idx and reading
	 * used_event: either it sees our request and interrupts, or we see its buffers here. */
	atomic_thread_fence(memory_order_seq_cst);
	return vring_load16_relaxed(&d->used->idx) != d->last_used;
}

unsigned vring_drv_num_free(const struct vring_drv *d)
{
	if (d->pk)
		return vring_pk_drv_num_free(d->pk);
	return d->num_free;
}

bool vring_drv_broken(const struct vring_drv *d)
{
	if (d->pk)
		return vring_pk_drv_broken(d->pk);
	return d->broken;
}
