/* SPDX-License-Identifier: MIT */
/*
 * Packed virtqueue, device side (virtio 1.2 §2.8): the bodies of the vring_dev_* functions for a
 * queue set up with cfg->packed. Bounded walk of a buffer's descriptors across ring slots (and
 * through an indirect table), used descriptors written in batches whose first flags store
 * publishes the batch (with VIRTIO_F_IN_ORDER, runs of completely used buffers folded into one
 * used descriptor), the interrupt decision from the driver event area and kick suppression in
 * the device event area.
 *
 * Security model (as vring.c): the guest writes the ring concurrently. Each descriptor is copied
 * once into a local before it is checked; a buffer spans at most num ring slots and num buffer
 * descriptors; buffer ids must be below num and not in flight; every buffer goes through
 * guest_mem. A violation breaks the queue (vring_dev_error()) and later calls return -EIO.
 *
 * Memory ordering, device side (docs/vring.md, "Packed rings"):
 *   1. load the flags of the descriptor at our avail slot (acquire)  →  loads of the rest of that
 *      descriptor, of the buffer's other descriptors and of the indirect table (the driver writes
 *      the first descriptor's flags last, with release);
 *   2. stores of buffer contents, used id/len and the batch's later flags  →  store of the
 *      batch's first flags (release);
 *   3. that store  →  full fence  →  load of the driver event area (interrupt decision);
 *   4. store of the device event area  →  full fence  →  load of the avail slot's flags.
 */
#include "vring/vring.h"

#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util/macros.h"

int vring_layout_packed(unsigned num, struct vring_layout *l)
{
	if (!vring_pk_size_valid(num) || !l)
		return -EINVAL;
	l->desc_off = 0;
	l->avail_off = ((size_t)16 * num + 63) & ~(size_t)63;
	l->used_off = l->avail_off + 64;
	l->total = l->used_off + sizeof(struct vring_pk_event_le);
	return 0;
}

__attribute__((format(printf, 3, 4))) static int pk_broken(struct vring_dev_queue *q,
							    enum vring_err e, const char *fmt, ...)
{
	char detail[128];
	va_list ap;

	if (q->err != VRING_ERR_NONE)
		return -EIO;
	va_start(ap, fmt);
	(void)vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	(void)snprintf(q->errmsg, sizeof(q->errmsg), "%s: %s (packed)", vring_err_to_string(e),
		       detail);
	q->err = e;
	return -EIO;
}

static void *pk_translate(const struct vring_dev_config *cfg, uint64_t addr, size_t len)
{
	if (cfg->addr_kind == VRING_ADDR_UVA)
		return guest_mem_uva_range(cfg->mem, addr, len);
	if (cfg->addr_kind == VRING_ADDR_GPA)
		return guest_mem_gpa_range(cfg->mem, addr, len);
	return (void *)(uintptr_t)addr; /* VRING_ADDR_HOST */
}

/* Event areas are read and written whole, as one untorn le32. */
static inline uint32_t ev_load(const struct vring_pk_event_le *ev)
{
	return vring_load32_relaxed((const uint32_t *)(const void *)ev);
}
/* The device event area (kick suppression): stored, and marked in the dirty log. */
static inline void dev_ev_store(struct vring_dev_queue *q, uint32_t v)
{
	vring_store32_relaxed((uint32_t *)(void *)q->pk.dev_ev, v);
	vring_log_write(q->log, q->mem, q->pk.dev_ev, sizeof(*q->pk.dev_ev));
}

int vring_pk_dev_init(struct vring_dev_queue *q, const struct vring_dev_config *cfg)
{
	struct vring_pk_desc_le *ring;
	struct vring_pk_event_le *drv_ev, *dev_ev;
	uint16_t base = cfg->last_avail_idx;

	if (!vring_pk_size_valid(cfg->num) || (unsigned)cfg->addr_kind >= _VRING_ADDR_MAX ||
	    !cfg->mem)
		return -EINVAL;
	if (cfg->desc_addr % VRING_DESC_ALIGN || cfg->avail_addr % 4 || cfg->used_addr % 4)
		return -EINVAL;
	if ((base & 0x7fffu) >= cfg->num)
		return -EINVAL; /* a base past the ring cannot come from a valid stop */
	ring = pk_translate(cfg, cfg->desc_addr, (size_t)16 * cfg->num);
	drv_ev = pk_translate(cfg, cfg->avail_addr, sizeof(*drv_ev));
	dev_ev = pk_translate(cfg, cfg->used_addr, sizeof(*dev_ev));
	if (!ring || !drv_ev || !dev_ev)
		return -EFAULT;
	if ((uintptr_t)ring % VRING_DESC_ALIGN || (uintptr_t)drv_ev % 4 || (uintptr_t)dev_ev % 4)
		return -EINVAL;

	/* Field by field: the ndescs table is large and only its in-flight entries matter. */
	q->mem = cfg->mem;
	q->log = guest_mem_log(cfg->mem);
	q->desc = NULL;
	q->avail = NULL;
	q->used = NULL;
	q->num = cfg->num;
	q->mask = 0;
	q->indirect = cfg->features & (1ull << VRING_FEAT_INDIRECT_DESC);
	q->event_idx = cfg->features & (1ull << VRING_FEAT_EVENT_IDX);
	q->notify_enabled = false;
	q->signalled_valid = false;
	q->last_avail_idx = q->shadow_avail_idx = q->used_idx = 0;
	q->published_used = q->signalled_used = q->used_flags = 0;
	q->inflight = 0;
	q->err = VRING_ERR_NONE;
	q->errmsg[0] = '\0';
	q->packed = true;
	q->pk.ring = ring;
	q->pk.drv_ev = drv_ev;
	q->pk.dev_ev = dev_ev;
	q->pk.avail = q->pk.used = q->pk.pub = q->pk.sig = (uint16_t)(base & 0x7fffu);
	q->pk.avail_wrap = q->pk.used_wrap = q->pk.pub_wrap = q->pk.sig_wrap =
		base >> VRING_PK_WRAP_BIT;
	q->pk.batch = false;
	q->pk.batch_descs = 0;
	q->pk.unsignalled = 0;
	q->pk.in_order = cfg->features & (1ull << VRING_FEAT_IN_ORDER);
	q->pk.hold = false;
	q->pk.pop_ord = q->pk.fill_ord = 0;
	memset(q->pk.ndescs, 0, sizeof(q->pk.ndescs[0]) * cfg->num);
	(void)vring_pk_dev_enable_notify(q);
	return 0;
}

static inline bool desc_avail(uint16_t flags, bool wrap)
{
	return !!(flags & VRING_PK_DESC_F_AVAIL) == wrap && !!(flags & VRING_PK_DESC_F_USED) != wrap;
}

/* True if the descriptor at our avail slot is available; orders the loads that follow. */
static bool head_avail(const struct vring_dev_queue *q)
{
	/* Acquire: orders this load of the flags before the loads of the descriptors and
	 * indirect table it publishes (driver side: its release store of these flags). */
	uint16_t f = vring_load16_acquire(&q->pk.ring[q->pk.avail].flags);

	return desc_avail(f, q->pk.avail_wrap);
}

static inline void read_pk_desc(const void *p, struct vring_pk_desc_le *d)
{
	memcpy(d, p, sizeof(*d));
	/* Compiler barrier: everything below uses this copy, never *p again (no double fetch). */
	__asm__ __volatile__("" ::: "memory");
	d->addr = le64toh(d->addr);
	d->len = le32toh(d->len);
	d->id = le16toh(d->id);
	d->flags = le16toh(d->flags);
}

/* What a walk collects; iovecs only if out/in arrays are given (NULL: skip, nothing mapped). */
struct pk_walk {
	struct iovec *out_iov, *in_iov;
	unsigned out_max, in_max;
	bool map;
	unsigned out_n, in_n, visited;
	uint64_t out_len, in_len;
	bool seen_write;
};

/* Maps one buffer descriptor. Returns 0, -ENOBUFS or -EIO. */
static int walk_buf(struct vring_dev_queue *q, struct pk_walk *w, const struct vring_pk_desc_le *d,
		    uint16_t slot)
{
	bool write = d->flags & VRING_DESC_F_WRITE;
	int r;

	if (unlikely(++w->visited > q->num))
		return pk_broken(q, VRING_ERR_LOOP, "slot %u: more than %u descriptors", slot,
				 q->num);
	if (unlikely(!write && w->seen_write))
		return pk_broken(q, VRING_ERR_ORDER, "slot %u", slot);
	w->seen_write |= write;
	if (!w->map)
		return 0;
	if (write)
		r = guest_mem_map_iov(q->mem, d->addr, d->len, w->in_iov + w->in_n,
				      (int)(w->in_max - w->in_n));
	else
		r = guest_mem_map_iov(q->mem, d->addr, d->len, w->out_iov + w->out_n,
				      (int)(w->out_max - w->out_n));
	if (unlikely(r == -EFAULT))
		return pk_broken(q, VRING_ERR_ADDR, "slot %u: 0x%llx+%u not in guest memory", slot,
				 (unsigned long long)d->addr, d->len);
	if (r < 0)
		return r; /* -ENOBUFS */
	if (write) {
		w->in_n += (unsigned)r;
		w->in_len += d->len;
	} else {
		w->out_n += (unsigned)r;
		w->out_len += d->len;
	}
	return 0;
}

/* Walks an indirect table (its entries are sequential; only WRITE counts, virtio 1.2 §2.8.20). */
static int walk_indirect(struct vring_dev_queue *q, struct pk_walk *w,
			 const struct vring_pk_desc_le *d, uint16_t slot)
{
	const uint8_t *host;
	uint32_t n;

	if (unlikely(!q->indirect))
		return pk_broken(q, VRING_ERR_INDIRECT_FEATURE, "slot %u", slot);
	if (unlikely(d->flags & VRING_DESC_F_NEXT))
		return pk_broken(q, VRING_ERR_INDIRECT_NEXT, "slot %u", slot);
	if (unlikely(d->len == 0 || d->len % 16))
		return pk_broken(q, VRING_ERR_INDIRECT_LEN, "slot %u len %u", slot, d->len);
	if (unlikely(d->addr + d->len < d->addr))
		return pk_broken(q, VRING_ERR_INDIRECT_ADDR, "slot %u: table wraps", slot);
	if (!w->map)
		return 0;
	n = d->len / 16;
	host = guest_mem_gpa_range(q->mem, d->addr, d->len);
	for (uint32_t k = 0; k < n; k++) {
		const void *p = host ? host + (size_t)k * 16
				     : guest_mem_gpa_range(q->mem, d->addr + (uint64_t)k * 16, 16);
		struct vring_pk_desc_le e;
		int r;

		if (unlikely(!p))
			return pk_broken(q, VRING_ERR_INDIRECT_ADDR, "slot %u entry %u unmapped",
					 slot, k);
		read_pk_desc(p, &e);
		if (unlikely(e.flags & VRING_DESC_F_INDIRECT))
			return pk_broken(q, VRING_ERR_INDIRECT_NESTED, "slot %u entry %u", slot, k);
		r = walk_buf(q, w, &e, slot);
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * Walks the buffer whose first descriptor is at our avail slot (available: checked by the
 * caller). Sets *ret_id and *ret_slots (ring slots it takes). Changes no queue position.
 * Returns 0, -ENOBUFS or -EIO.
 */
static int walk(struct vring_dev_queue *q, struct pk_walk *w, uint16_t *ret_id,
		uint16_t *ret_slots)
{
	uint16_t slot = q->pk.avail;
	uint32_t slots = 0;
	struct vring_pk_desc_le d;
	int r;

	for (;;) {
		read_pk_desc(&q->pk.ring[slot], &d);
		slots++;
		if (d.flags & VRING_DESC_F_INDIRECT)
			r = walk_indirect(q, w, &d, slot);
		else
			r = walk_buf(q, w, &d, slot);
		if (r < 0)
			return r;
		if (!(d.flags & VRING_DESC_F_NEXT))
			break;
		/* A buffer takes at most the whole ring (virtio 1.2 §2.8.6); more is a loop. */
		if (unlikely(slots >= q->num))
			return pk_broken(q, VRING_ERR_LOOP, "buffer at slot %u spans the ring",
					 q->pk.avail);
		slot = (uint32_t)slot + 1 == q->num ? 0 : (uint16_t)(slot + 1);
	}
	/* The buffer id is in the buffer's last ring descriptor (virtio 1.2 §2.8.6). */
	if (unlikely(d.id >= q->num))
		return pk_broken(q, VRING_ERR_HEAD, "buffer id %u >= num %u", d.id, q->num);
	if (unlikely(q->pk.ndescs[d.id] != 0))
		return pk_broken(q, VRING_ERR_HEAD, "buffer id %u already in flight", d.id);
	*ret_id = d.id;
	*ret_slots = (uint16_t)slots;
	return 0;
}

/* Bit of consumption ordinal ord in the rw table (at most num <= 32768 buffers are in flight). */
static inline uint64_t *rw_word(struct vring_dev_queue *q, uint16_t ord, uint64_t *ret_bit)
{
	ord &= VRING_PK_MAX_SIZE - 1;
	*ret_bit = 1ull << (ord % 64);
	return &q->pk.rw[ord / 64];
}

/* Consumes the walked buffer; rw: it has writable descriptors (its used len matters). */
static void consumed(struct vring_dev_queue *q, uint16_t id, uint16_t slots, bool rw)
{
	uint32_t a = (uint32_t)q->pk.avail + slots;
	uint64_t bit, *word = rw_word(q, q->pk.pop_ord++, &bit);

	*word = rw ? *word | bit : *word & ~bit;
	q->pk.ndescs[id] = slots;
	if (a >= q->num) {
		a -= q->num;
		q->pk.avail_wrap = !q->pk.avail_wrap;
	}
	q->pk.avail = (uint16_t)a;
	q->inflight++;
	/* While kicks are wanted in DESC mode, keep the event offset at our position (as vring.c
	 * does with avail_event). */
	if (q->event_idx && q->notify_enabled)
		dev_ev_store(q, vring_pk_event_word(q->pk.avail, q->pk.avail_wrap,
							   VRING_PK_EVENT_F_DESC));
}

static int take(struct vring_dev_queue *q, struct pk_walk *w, uint16_t *ret_id)
{
	uint16_t id = 0, slots = 0;
	int r;

	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	if (!head_avail(q))
		return -EAGAIN;
	r = walk(q, w, &id, &slots);
	if (r < 0)
		return r;
	consumed(q, id, slots, w->seen_write);
	*ret_id = id;
	return 0;
}

int vring_pk_dev_pop(struct vring_dev_queue *q, struct iovec *out_iov, unsigned out_max,
		     struct iovec *in_iov, unsigned in_max, struct vring_chain *ret)
{
	struct pk_walk w = { .out_iov = out_iov, .in_iov = in_iov, .out_max = out_max,
			     .in_max = in_max, .map = true };
	uint16_t id = 0;
	int r = take(q, &w, &id);

	if (r < 0)
		return r;
	ret->head = id;
	ret->out_num = w.out_n;
	ret->in_num = w.in_n;
	ret->out_len = w.out_len;
	ret->in_len = w.in_len;
	return 0;
}

int vring_pk_dev_skip(struct vring_dev_queue *q, uint16_t *ret_head)
{
	struct pk_walk w = { .map = false };

	return take(q, &w, ret_head);
}

/*
 * Writes a used descriptor (id, len) at slot with the wrap counter it has there. The first one
 * of a publication batch gets its flags at vring_pk_dev_flush(): the driver reads slots in order,
 * so it sees none of the batch before it sees all of it.
 */
static void put_used(struct vring_dev_queue *q, uint16_t slot, bool wrap, uint16_t id,
		     uint32_t len)
{
	struct vring_pk_desc_le *e = &q->pk.ring[slot];
	uint16_t flags = wrap ? (uint16_t)(VRING_PK_DESC_F_AVAIL | VRING_PK_DESC_F_USED) : 0;

	vring_store16_relaxed(&e->id, id);
	vring_store32_relaxed(&e->len, len);
	/* The whole descriptor: its flags are stored here or by the batch's flush. */
	vring_log_write(q->log, q->mem, e, sizeof(*e));
	if (!q->pk.batch) {
		q->pk.batch = true;
		q->pk.batch_slot = slot;
		q->pk.batch_flags = flags;
	} else {
		/* Release: orders the id/len stores above (and the buffer contents) before these
		 * flags; a driver that polls ahead sees a whole entry or none. */
		vring_store16_release(&e->flags, flags);
	}
}

/*
 * IN_ORDER: holds (id, len) back as the used descriptor of the current batch, at the used
 * position. The one held before it is folded into it (not written: virtio 1.2 §2.8.8 lets one
 * descriptor with the last id stand for the batch) only if its buffer had no writable
 * descriptor and len 0, i.e. was used completely, which is what the driver assumes of a skipped
 * buffer; otherwise it is written in its slot and this one starts a new run.
 */
static void fill_in_order(struct vring_dev_queue *q, uint16_t id, uint32_t len)
{
	uint64_t bit, *word = rw_word(q, q->pk.fill_ord++, &bit);
	bool ro = !(*word & bit);

	if (!q->pk.hold || !q->pk.hold_full) {
		if (q->pk.hold)
			put_used(q, q->pk.hold_slot, q->pk.hold_wrap, q->pk.hold_id,
				 q->pk.hold_len);
		q->pk.hold_slot = q->pk.used;
		q->pk.hold_wrap = q->pk.used_wrap;
	}
	q->pk.hold = true;
	q->pk.hold_full = ro && len == 0;
	q->pk.hold_id = id;
	q->pk.hold_len = len;
}

int vring_pk_dev_fill(struct vring_dev_queue *q, uint16_t head, uint32_t len)
{
	uint16_t slots;
	uint32_t u;

	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	if (head >= q->num || q->pk.ndescs[head] == 0)
		return -EINVAL;
	slots = q->pk.ndescs[head];
	if (q->pk.in_order)
		fill_in_order(q, head, len);
	else
		put_used(q, q->pk.used, q->pk.used_wrap, head, len);
	/* A folded buffer's slots are skipped as well (virtio 1.2 §2.8.6, §2.8.8). */
	q->pk.batch_descs += slots;
	u = (uint32_t)q->pk.used + slots;
	if (u >= q->num) {
		u -= q->num;
		q->pk.used_wrap = !q->pk.used_wrap;
	}
	q->pk.used = (uint16_t)u;
	q->pk.ndescs[head] = 0;
	q->inflight--;
	return 0;
}

void vring_pk_dev_flush(struct vring_dev_queue *q)
{
	if (q->err != VRING_ERR_NONE)
		return;
	if (q->pk.hold) {
		put_used(q, q->pk.hold_slot, q->pk.hold_wrap, q->pk.hold_id, q->pk.hold_len);
		q->pk.hold = false;
	}
	if (!q->pk.batch)
		return;
	/* Release: orders the stores of buffer contents and of every used descriptor of the batch
	 * before this store of its first flags (driver side: its acquire load of them). */
	vring_store16_release(&q->pk.ring[q->pk.batch_slot].flags, q->pk.batch_flags);
	vring_log_write(q->log, q->mem, &q->pk.ring[q->pk.batch_slot].flags, 2);
	vring_log_published(q->log);
	q->pk.batch = false;
	q->pk.unsignalled += q->pk.batch_descs;
	q->pk.batch_descs = 0;
	q->pk.pub = q->pk.used;
	q->pk.pub_wrap = q->pk.used_wrap;
}

bool vring_pk_dev_should_notify(struct vring_dev_queue *q)
{
	uint32_t ev, moved;
	uint16_t flags, old;
	bool valid, old_wrap;

	if (unlikely(q->err != VRING_ERR_NONE))
		return false;
	/* Full barrier: orders the flags store of vring_pk_dev_flush() before this load of the
	 * driver event area; without it a store→load reordering loses an interrupt. */
	atomic_thread_fence(memory_order_seq_cst);
	ev = ev_load(q->pk.drv_ev);
	flags = (uint16_t)(ev >> 16);
	old = q->pk.sig;
	old_wrap = q->pk.sig_wrap;
	moved = q->pk.unsignalled;
	valid = q->signalled_valid;
	q->pk.sig = q->pk.pub;
	q->pk.sig_wrap = q->pk.pub_wrap;
	q->pk.unsignalled = 0;
	q->signalled_valid = true;
	if (flags == VRING_PK_EVENT_F_DISABLE)
		return false;
	if (flags != VRING_PK_EVENT_F_DESC || !q->event_idx)
		return true; /* ENABLE; reserved values are taken as ENABLE */
	if (unlikely(!valid))
		return true;
	return vring_pk_event_passed(q->num, (uint16_t)ev, old, old_wrap, moved);
}

void vring_pk_dev_disable_notify(struct vring_dev_queue *q)
{
	q->notify_enabled = false;
	if (q->err != VRING_ERR_NONE)
		return;
	dev_ev_store(q, vring_pk_event_word(0, false, VRING_PK_EVENT_F_DISABLE));
}

bool vring_pk_dev_enable_notify(struct vring_dev_queue *q)
{
	q->notify_enabled = true;
	if (q->err != VRING_ERR_NONE)
		return false;
	if (q->event_idx)
		dev_ev_store(q, vring_pk_event_word(q->pk.avail, q->pk.avail_wrap,
							   VRING_PK_EVENT_F_DESC));
	else
		dev_ev_store(q, vring_pk_event_word(0, false, VRING_PK_EVENT_F_ENABLE));
	/* Full barrier: orders the event-area store above before the load of the avail slot's
	 * flags in head_avail(): either the driver sees the re-enable and kicks, or we see its
	 * new descriptor here (docs/vring.md, "Notifications"). */
	atomic_thread_fence(memory_order_seq_cst);
	return head_avail(q);
}

int vring_pk_dev_avail_count(struct vring_dev_queue *q)
{
	uint32_t slot = q->pk.avail, seen = 0;
	bool wrap = q->pk.avail_wrap, at_head = true;
	int count = 0;

	if (unlikely(q->err != VRING_ERR_NONE))
		return -EIO;
	/* Whole buffers only: one whose first descriptor is available, up to its last. At most num
	 * slots are looked at. */
	while (seen < q->num) {
		/* Acquire: as in head_avail(), for each first descriptor. */
		uint16_t f = vring_load16_acquire(&q->pk.ring[slot].flags);

		if (at_head && !desc_avail(f, wrap))
			break;
		at_head = !(f & VRING_DESC_F_NEXT);
		if (at_head)
			count++;
		seen++;
		if (++slot == q->num) {
			slot = 0;
			wrap = !wrap;
		}
	}
	return count;
}

bool vring_pk_dev_empty(struct vring_dev_queue *q)
{
	return q->err != VRING_ERR_NONE || !head_avail(q);
}

uint16_t vring_pk_dev_base(const struct vring_dev_queue *q)
{
	return (uint16_t)(q->pk.avail | (uint16_t)q->pk.avail_wrap << VRING_PK_WRAP_BIT);
}
