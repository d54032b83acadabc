/* SPDX-License-Identifier: MIT */
/*
 * Split virtqueue, device side: bounded descriptor-chain walk (direct and indirect), used-ring
 * publication in batches, interrupt decision and guest-kick suppression with and without
 * VIRTIO_RING_F_EVENT_IDX.
 *
 * Security model: the guest is untrusted and writes the avail ring and the descriptor tables
 * concurrently with us. Each shared field is read exactly once into a local before it is checked
 * and used (no double fetch); every index is range-checked; a chain walk visits at most num
 * descriptors; every buffer is translated through guest_mem, which clamps lengths to regions.
 * A violation sets q->err and makes every later data-path call fail with -EIO.
 *
 * Memory ordering, device side (docs/vring.md, "Barriers"; virtio 1.2 §2.7.13 and §2.7.14 give
 * the driver's half):
 *   1. load avail->idx (acquire)  →  loads of avail->ring[] and descriptors;
 *   2. stores of buffer contents and used->ring[] →  store used->idx (release);
 *   3. store used->idx  →  full fence  →  load used_event / avail->flags (interrupt decision);
 *   4. store avail_event / used->flags  →  full fence  →  load avail->idx (kick re-enable).
 */
#include "vring/vring.h"

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util/macros.h"

static const char *const err_names[_VRING_ERR_MAX] = {
	[VRING_ERR_NONE] = "none",
	[VRING_ERR_AVAIL_IDX] = "avail index moved by more than the queue size",
	[VRING_ERR_HEAD] = "head index out of range",
	[VRING_ERR_NEXT] = "next index out of range",
	[VRING_ERR_LOOP] = "descriptor chain longer than the queue (loop)",
	[VRING_ERR_INDIRECT_FEATURE] = "indirect descriptor without INDIRECT_DESC negotiated",
	[VRING_ERR_INDIRECT_LEN] = "indirect table length zero or not a multiple of 16",
	[VRING_ERR_INDIRECT_NESTED] = "nested indirect descriptor",
	[VRING_ERR_INDIRECT_NEXT] = "indirect descriptor with NEXT",
	[VRING_ERR_INDIRECT_ADDR] = "indirect table outside guest memory",
	[VRING_ERR_ORDER] = "readable descriptor after a writable one",
	[VRING_ERR_ADDR] = "buffer outside guest memory",
};

const char *vring_err_to_string(enum vring_err e)
{
	if ((unsigned)e >= _VRING_ERR_MAX)
		return "unknown";
	return err_names[e];
}

int vring_layout(unsigned num, struct vring_layout *l)
{
	if (!vring_size_valid(num) || !l)
		return -EINVAL;
	l->desc_off = 0;
	l->avail_off = (vring_desc_size(num) + 63) & ~(size_t)63;
	l->used_off = (l->avail_off + vring_avail_size(num) + 63) & ~(size_t)63;
	l->total = l->used_off + vring_used_size(num);
	return 0;
}

__attribute__((format(printf, 3, 4))) static int set_broken(struct vring_dev_queue *q,
							     enum vring_err e, const char *fmt, ...)
{
	va_list ap;

	if (q->err == VRING_ERR_NONE) {
		int n = snprintf(q->errmsg, sizeof(q->errmsg), "%s: ", vring_err_to_string(e));

		q->err = e;
		if (n > 0 && (size_t)n < sizeof(q->errmsg)) {
			va_start(ap, fmt);
			(void)vsnprintf(q->errmsg + n, sizeof(q->errmsg) - (size_t)n, fmt, ap);
			va_end(ap);
		}
	}
	return -EIO;
}

static void *translate(const struct guest_mem *m, enum vring_addr_kind kind, uint64_t addr,
		       size_t len)
{
	switch (kind) {
	case VRING_ADDR_HOST:
		return (void *)(uintptr_t)addr;
	case VRING_ADDR_UVA:
		return guest_mem_uva_range(m, addr, len);
	case VRING_ADDR_GPA:
		return guest_mem_gpa_range(m, addr, len);
	default:
		return NULL;
	}
}

int vring_dev_init(struct vring_dev_queue *q, const struct vring_dev_config *cfg)
{
	if (q && cfg && (cfg->features & (1ull << VRING_FEAT_RING_PACKED)))
		return vring_pk_dev_init(q, cfg);
	struct vring_dev_queue n = { 0 };

	if (!q || !cfg || !vring_size_valid(cfg->num) ||
	    (unsigned)cfg->addr_kind >= _VRING_ADDR_MAX)
		return -EINVAL;
	if (!cfg->mem) /* buffers are always translated through it */
		return -EINVAL;
	if (cfg->desc_addr % VRING_DESC_ALIGN || cfg->avail_addr % VRING_AVAIL_ALIGN ||
	    cfg->used_addr % VRING_USED_ALIGN)
		return -EINVAL;
	n.desc = translate(cfg->mem, cfg->addr_kind, cfg->desc_addr, vring_desc_size(cfg->num));
	n.avail = translate(cfg->mem, cfg->addr_kind, cfg->avail_addr, vring_avail_size(cfg->num));
	n.used = translate(cfg->mem, cfg->addr_kind, cfg->used_addr, vring_used_size(cfg->num));
	if (!n.desc || !n.avail || !n.used)
		return -EFAULT;
	/* Host addresses are not checked by translation; their alignment must still hold. */
	if ((uintptr_t)n.desc % VRING_DESC_ALIGN || (uintptr_t)n.avail % VRING_AVAIL_ALIGN ||
	    (uintptr_t)n.used % VRING_USED_ALIGN)
		return -EINVAL;

	n.mem = cfg->mem;
	n.log = guest_mem_log(cfg->mem);
	n.num = cfg->num;
	n.mask = (uint16_t)(cfg->num - 1);
	n.indirect = cfg->features & (1ull << VRING_FEAT_INDIRECT_DESC);
	n.event_idx = cfg->features & (1ull << VRING_FEAT_EVENT_IDX);
	n.in_order = cfg->features & (1ull << VRING_FEAT_IN_ORDER);
	n.last_avail_idx = cfg->last_avail_idx;
	n.shadow_avail_idx = cfg->last_avail_idx;
	/* Continue where the guest sees the used ring, never from 0 (docs/vhost-user.md, "Ring
	 * states"). */
	n.used_idx = vring_load16_relaxed(&n.used->idx);
	n.published_used = n.used_idx;
	n.signalled_used = n.used_idx;
	n.err = VRING_ERR_NONE;
	*q = n;
	/*
	 * Start with kicks enabled. The fence inside orders these stores before any later read of
	 * avail->idx; the result (chains already there) is seen by the caller's first pop.
	 */
	(void)vring_dev_enable_notify(q);
	return 0;
}

/*
 * Reads avail->idx and validates the distance to last_avail_idx. Returns the number of chains
 * available or -EIO.
 */
static int refresh_avail(struct vring_dev_queue *q)
{
	/* Acquire: orders this load of avail->idx before the loads of avail->ring[] and of the
	 * descriptors it publishes (driver side: its wmb between those stores and avail->idx). */
	uint16_t idx = vring_load16_acquire(&q->avail->idx);
	uint16_t count = (uint16_t)(idx - q->last_avail_idx);

	if (unlikely(count > q->num))
		return set_broken(q, VRING_ERR_AVAIL_IDX, "avail idx %u, last_avail_idx %u, num %u",
				  idx, q->last_avail_idx, q->num);
	q->shadow_avail_idx = idx;
	return count;
}

/* One descriptor, read once from shared memory. */
struct desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

static inline void read_desc(const void *p, struct desc *d)
{
	struct vring_desc_le raw;

	memcpy(&raw, p, sizeof(raw));
	/* Compiler barrier: the checks below use this copy; the guest may rewrite *p meanwhile
	 * and must not be re-read (no double fetch). */
	__asm__ __volatile__("" ::: "memory");
	d->addr = le64toh(raw.addr);
	d->len = le32toh(raw.len);
	d->flags = le16toh(raw.flags);
	d->next = le16toh(raw.next);
}

/* Where the descriptors currently being walked live. */
struct table {
	const uint8_t *host; /* contiguous table, or NULL: translate each entry from gpa */
	uint64_t gpa;
	uint32_t n; /* entries */
};

static inline const void *table_entry(const struct vring_dev_queue *q, const struct table *t,
				      uint32_t i)
{
	if (t->host)
		return t->host + (size_t)i * 16;
	return guest_mem_gpa_range(q->mem, t->gpa + (uint64_t)i * 16, 16);
}

/*
 * Walks the chain at head. Does not change queue indices. Returns 0, -ENOBUFS (iov storage too
 * small) or -EIO (queue now broken).
 */
static int walk_chain(struct vring_dev_queue *q, uint16_t head, struct iovec *out_iov,
		      unsigned out_max, struct iovec *in_iov, unsigned in_max,
		      struct vring_chain *c)
{
	struct table t = { .host = (const uint8_t *)q->desc, .n = q->num };
	bool in_indirect = false, seen_write = false;
	uint32_t i = head, visited = 0;
	unsigned out_n = 0, in_n = 0;
	uint64_t out_len = 0, in_len = 0;

	for (;;) {
		const void *p = table_entry(q, &t, i);
		struct desc d;
		int r;

		if (unlikely(!p))
			return set_broken(q, VRING_ERR_INDIRECT_ADDR,
					  "indirect entry %u at gpa 0x%llx unmapped", i,
					  (unsigned long long)(t.gpa + (uint64_t)i * 16));
		read_desc(p, &d);

		if (d.flags & VRING_DESC_F_INDIRECT) {
			if (unlikely(!q->indirect))
				return set_broken(q, VRING_ERR_INDIRECT_FEATURE, "head %u desc %u",
						  head, i);
			if (unlikely(in_indirect))
				return set_broken(q, VRING_ERR_INDIRECT_NESTED, "head %u entry %u",
						  head, i);
			if (unlikely(d.flags & VRING_DESC_F_NEXT))
				return set_broken(q, VRING_ERR_INDIRECT_NEXT, "head %u desc %u",
						  head, i);
			if (unlikely(d.len == 0 || d.len % 16))
				return set_broken(q, VRING_ERR_INDIRECT_LEN, "head %u len %u", head,
						  d.len);
			if (unlikely(d.addr + d.len < d.addr))
				return set_broken(q, VRING_ERR_INDIRECT_ADDR, "head %u table wraps",
						  head);
			t.host = guest_mem_gpa_range(q->mem, d.addr, d.len);
			t.gpa = d.addr;
			t.n = d.len / 16;
			in_indirect = true;
			i = 0;
			continue;
		}

		/* Chains never exceed the queue size (virtio 1.2 §2.7.5.2); more means a loop. */
		if (unlikely(++visited > q->num))
			return set_broken(q, VRING_ERR_LOOP, "head %u: more than %u descriptors",
					  head, q->num);

		if (d.flags & VRING_DESC_F_WRITE) {
			seen_write = true;
			r = guest_mem_map_iov(q->mem, d.addr, d.len, in_iov + in_n,
					      (int)(in_max - in_n));
			if (r >= 0) {
				in_n += (unsigned)r;
				in_len += d.len;
			}
		} else {
			if (unlikely(seen_write))
				return set_broken(q, VRING_ERR_ORDER, "head %u desc %u", head, i);
			r = guest_mem_map_iov(q->mem, d.addr, d.len, out_iov + out_n,
					      (int)(out_max - out_n));
			if (r >= 0) {
				out_n += (unsigned)r;
				out_len += d.len;
			}
		}
		if (unlikely(r == -EFAULT))
			return set_broken(q, VRING_ERR_ADDR,
					  "head %u: 0x%llx+%u not in guest memory", head,
					  (unsigned long long)d.addr, d.len);
		if (unlikely(r < 0))
			return r; /* -ENOBUFS: the caller's arrays are too small */

		if (!(d.flags & VRING_DESC_F_NEXT))
			break;
		i = d.next;
		if (unlikely(i >= t.n))
			return set_broken(q, VRING_ERR_NEXT, "head %u: next %u >= %u%s", head, i,
					  t.n, in_indirect ? " (indirect)" : "");
	}
	c->head = head;
	c->out_num = out_n;
	c->in_num = in_n;
	c->out_len = out_len;
	c->in_len = in_len;
	return 0;
}

/* Ensures a chain is available at last_avail_idx. Returns 0, -EAGAIN or -EIO. */
static int have_avail(struct vring_dev_queue *q)
{
	int r;

	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	if (q->shadow_avail_idx != q->last_avail_idx)
		return 0;
	r = refresh_avail(q);
	if (r < 0)
		return r;
	return r == 0 ? -EAGAIN : 0;
}

/*
 * Reads and checks the head at last_avail_idx once a chain is available there.
 * Returns 0, -EAGAIN (none available) or -EIO (queue broken).
 */
static int next_head(struct vring_dev_queue *q, uint16_t *ret_head)
{
	uint16_t head;
	int r = have_avail(q);

	if (r < 0)
		return r;
	head = vring_load16_relaxed(&q->avail->ring[q->last_avail_idx & q->mask]);
	if (unlikely(head >= q->num))
		return set_broken(q, VRING_ERR_HEAD, "avail[%u] = %u >= num %u", q->last_avail_idx,
				  head, q->num);
	*ret_head = head;
	return 0;
}

/*
 * Consumes the chain at last_avail_idx. rw: it has writable buffers, or nobody knows (skip):
 * under IN_ORDER its used element must then carry its own length.
 */
static inline void consumed(struct vring_dev_queue *q, bool rw)
{
	if (rw) {
		if (!q->rw_any)
			q->rw_first = q->pop_seq;
		q->rw_any = true;
		q->rw_last = q->pop_seq;
	}
	q->pop_seq++;
	q->last_avail_idx++;
	q->inflight++;
	/* While kicks are wanted, keep avail_event at the consumer position (as libvhost-user
	 * does) so that a caller that never toggles notifications still gets kicked. */
	if (q->event_idx && q->notify_enabled)
		vring_store16_relaxed(vring_avail_event(q->used, q->num), q->last_avail_idx);
}

int vring_dev_pop(struct vring_dev_queue *q, struct iovec *out_iov, unsigned out_max,
		  struct iovec *in_iov, unsigned in_max, struct vring_chain *ret)
{
	if (q->packed)
		return vring_pk_dev_pop(q, out_iov, out_max, in_iov, in_max, ret);
	struct vring_chain c;
	uint16_t head = 0;
	int r;

	r = next_head(q, &head);
	if (r < 0)
		return r;
	r = walk_chain(q, head, out_iov, out_max, in_iov, in_max, &c);
	if (r < 0)
		return r;
	consumed(q, c.in_len > 0);
	*ret = c;
	return 0;
}

int vring_dev_skip(struct vring_dev_queue *q, uint16_t *ret_head)
{
	if (q->packed)
		return vring_pk_dev_skip(q, ret_head);
	uint16_t head = 0;
	int r;

	r = next_head(q, &head);
	if (r < 0)
		return r;
	consumed(q, true);
	*ret_head = head;
	return 0;
}

static void write_used(struct vring_dev_queue *q, uint16_t slot, uint16_t head, uint32_t len)
{
	struct vring_used_elem_le *e = &q->used->ring[slot & q->mask];

	/* Plain (relaxed) stores: the release store of used->idx in vring_dev_flush() publishes
	 * them. */
	vring_store32_relaxed(&e->id, head);
	vring_store32_relaxed(&e->len, len);
	vring_log_write(q->log, q->mem, e, sizeof(*e));
}

/*
 * IN_ORDER: holds (head, len) back as the last element of the current batch. The element held
 * before it is skipped if its chain was used completely (the driver assumes exactly that of a
 * skipped buffer, virtio 1.2 §2.7.8), otherwise written in its slot and a new batch starts.
 */
static void fill_in_order(struct vring_dev_queue *q, uint16_t head, uint32_t len)
{
	/* Ordinal f is the chain being filled (chains are filled in pop order). It is known to be
	 * device-readable only if no chain in flight may be writable or it comes before the first
	 * one that may; the range of the unknown ones shrinks from the front. */
	uint32_t f = q->fill_seq;
	bool ro = !q->rw_any || (int32_t)(f - q->rw_first) < 0;
	bool full = len == 0 && ro;

	if (q->rw_any && f == q->rw_last)
		q->rw_any = false;
	else if (q->rw_any && f == q->rw_first)
		q->rw_first = f + 1;

	if (!q->batch_open || !q->batch_full) {
		if (q->batch_open)
			write_used(q, q->batch_slot, q->batch_head, q->batch_len);
		q->batch_slot = q->used_idx;
	}
	q->batch_open = true;
	q->batch_full = full;
	q->batch_head = head;
	q->batch_len = len;
	q->fill_seq++;
}

int vring_dev_fill(struct vring_dev_queue *q, uint16_t head, uint32_t len)
{
	if (q->packed)
		return vring_pk_dev_fill(q, head, len);
	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	if (head >= q->num || q->inflight == 0)
		return -EINVAL;
	if (q->in_order)
		fill_in_order(q, head, len);
	else
		write_used(q, q->used_idx, head, len);
	q->used_idx++;
	q->inflight--;
	return 0;
}

void vring_dev_flush(struct vring_dev_queue *q)
{
	if (q->packed) {
		vring_pk_dev_flush(q);
		return;
	}
	if (q->published_used == q->used_idx || q->err != VRING_ERR_NONE)
		return;
	if (q->batch_open) {
		write_used(q, q->batch_slot, q->batch_head, q->batch_len);
		q->batch_open = false;
	}
	/* Release: orders the stores of buffer contents and used->ring[] entries before this
	 * store of used->idx (driver side: its rmb after loading used->idx). */
	vring_store16_release(&q->used->idx, q->used_idx);
	vring_log_write(q->log, q->mem, &q->used->idx, sizeof(q->used->idx));
	vring_log_published(q->log);
	q->published_used = q->used_idx;
}

int vring_dev_push(struct vring_dev_queue *q, uint16_t head, uint32_t len)
{
	int r = vring_dev_fill(q, head, len);

	if (r == 0)
		vring_dev_flush(q);
	return r;
}

bool vring_dev_should_notify(struct vring_dev_queue *q)
{
	if (q->packed)
		return vring_pk_dev_should_notify(q);
	uint16_t old, new_idx;
	bool valid;

	if (unlikely(q->err != VRING_ERR_NONE))
		return false;
	/* Full barrier: orders the store of used->idx (vring_dev_flush) before the loads of
	 * used_event / avail->flags below; without it a store→load reordering loses an interrupt
	 * (the smp_mb() in Linux drivers/vhost/vhost.c, vhost_notify()). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!q->event_idx)
		return !(vring_load16_relaxed(&q->avail->flags) & VRING_AVAIL_F_NO_INTERRUPT);

	old = q->signalled_used;
	valid = q->signalled_valid;
	new_idx = q->published_used;
	q->signalled_used = new_idx;
	q->signalled_valid = true;
	if (unlikely(!valid))
		return true;
	return vring_idx_passed_event(vring_load16_relaxed(vring_used_event(q->avail, q->num)),
				      new_idx, old);
}

void vring_dev_disable_notify(struct vring_dev_queue *q)
{
	if (q->packed) {
		vring_pk_dev_disable_notify(q);
		return;
	}
	q->notify_enabled = false;
	if (q->err != VRING_ERR_NONE || q->event_idx)
		return; /* EVENT_IDX: avail_event simply stops advancing */
	q->used_flags |= VRING_USED_F_NO_NOTIFY;
	vring_store16_relaxed(&q->used->flags, q->used_flags);
	vring_log_write(q->log, q->mem, &q->used->flags, sizeof(q->used->flags));
}

bool vring_dev_enable_notify(struct vring_dev_queue *q)
{
	if (q->packed)
		return vring_pk_dev_enable_notify(q);
	q->notify_enabled = true;
	if (q->err != VRING_ERR_NONE)
		return false;
	if (q->event_idx) {
		vring_store16_relaxed(vring_avail_event(q->used, q->num), q->last_avail_idx);
		vring_log_write(q->log, q->mem, vring_avail_event(q->used, q->num), 2);
	} else {
		q->used_flags &= (uint16_t)~VRING_USED_F_NO_NOTIFY;
		vring_store16_relaxed(&q->used->flags, q->used_flags);
		vring_log_write(q->log, q->mem, &q->used->flags, sizeof(q->used->flags));
	}
	/* Full barrier: orders the store of avail_event / used->flags above before the load of
	 * avail->idx in refresh_avail(): either the guest sees the re-enable and kicks, or we see
	 * its new avail->idx here (the smp_mb() in Linux drivers/vhost/vhost.c,
	 * vhost_enable_notify(); docs/vring.md, "Notifications"). */
	atomic_thread_fence(memory_order_seq_cst);
	return refresh_avail(q) > 0;
}

int vring_dev_avail_count(struct vring_dev_queue *q)
{
	if (q->packed)
		return vring_pk_dev_avail_count(q);
	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	return refresh_avail(q);
}

bool vring_dev_empty(struct vring_dev_queue *q)
{
	if (q->packed)
		return vring_pk_dev_empty(q);
	if (q->err == VRING_ERR_NONE && q->shadow_avail_idx != q->last_avail_idx)
		return false;
	return vring_dev_avail_count(q) <= 0;
}

uint16_t vring_dev_last_avail_idx(const struct vring_dev_queue *q)
{
	if (q->packed)
		return vring_pk_dev_base(q);
	return q->last_avail_idx;
}

void vring_dev_log_iov_slow(struct vring_dev_queue *q, const struct iovec *iov, unsigned n,
			    uint64_t len)
{
	for (unsigned i = 0; i < n && len; i++) {
		uint64_t l = MIN((uint64_t)iov[i].iov_len, len);

		vring_log_mark_hva(q->log, q->mem, iov[i].iov_base, l);
		len -= l;
	}
}

unsigned vring_dev_inflight(const struct vring_dev_queue *q)
{
	return q->inflight;
}

enum vring_err vring_dev_error(const struct vring_dev_queue *q)
{
	return q->err;
}

const char *vring_dev_error_msg(const struct vring_dev_queue *q)
{
	return q->err == VRING_ERR_NONE ? "" : q->errmsg;
}
