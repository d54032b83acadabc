/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the device side of the packed virtqueue against a driver written by hand in this
 * file (descriptors stored with explicit AVAIL/USED bits): buffers across ring slots and across
 * the wrap, indirect tables, used descriptors (id, len, flags, slot skipping, batch publication by
 * the first flags), the vhost-user base with its wrap bit, event suppression in both areas, and
 * every hostile-descriptor rule breaking the queue instead of crashing.
 */
#include "test.h"
#include "vring/vring.h"

#include <endian.h>

#define GPA0 0x200000ull
#define MEMSZ 0x100000ull
#define BUFS 0x80000ull /* buffers live here, the ring at 0 */

static const uint64_t F_IND = 1ull << VRING_FEAT_INDIRECT_DESC;
static const uint64_t F_EVT = 1ull << VRING_FEAT_EVENT_IDX;
static const uint64_t F_PK = 1ull << VRING_FEAT_RING_PACKED;

/* The hand-written driver: its memory, positions and the device under test. */
struct hd {
	uint8_t *mem;
	struct guest_mem *gm;
	struct vring_layout lay;
	unsigned num;
	uint16_t avail;  /* driver's next slot */
	bool wrap;       /* driver's avail wrap counter */
	struct vring_dev_queue *q;
};

static struct vring_pk_desc_le *slot_p(struct hd *h, unsigned i)
{
	return (struct vring_pk_desc_le *)(h->mem + h->lay.desc_off) + i;
}
static struct vring_pk_event_le *drv_ev(struct hd *h)
{
	return (struct vring_pk_event_le *)(h->mem + h->lay.avail_off);
}
static struct vring_pk_event_le *dev_ev(struct hd *h)
{
	return (struct vring_pk_event_le *)(h->mem + h->lay.used_off);
}

static int hd_start(struct hd *h, unsigned num, uint64_t features, uint16_t base)
{
	struct vring_dev_config c = {
		.mem = h->gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = GPA0 + h->lay.desc_off, .avail_addr = GPA0 + h->lay.avail_off,
		.used_addr = GPA0 + h->lay.used_off, .features = features | F_PK,
		.last_avail_idx = base,
	};

	return vring_dev_init(h->q, &c);
}

static void hd_init(struct hd *h, unsigned num, uint64_t features)
{
	struct guest_mem_region_desc d = { .guest_phys_addr = GPA0, .memory_size = MEMSZ };
	void *hb[1];

	memset(h, 0, sizeof(*h));
	h->num = num;
	h->wrap = true;
	h->mem = aligned_alloc(4096, MEMSZ);
	h->q = calloc(1, sizeof(*h->q));
	ASSERT_TRUE(h->mem && h->q);
	memset(h->mem, 0, MEMSZ);
	hb[0] = h->mem;
	ASSERT_OK(guest_mem_new_local(&d, hb, 1, &h->gm));
	ASSERT_OK(vring_layout_packed(num, &h->lay));
	ASSERT_LE(h->lay.total, BUFS);
	ASSERT_OK(hd_start(h, num, features, 0x8000));
}

static void hd_fini(struct hd *h)
{
	guest_mem_free(h->gm);
	free(h->mem);
	free(h->q);
}

/* Stores one descriptor at the driver's slot (flags last), advancing the driver's position. */
static void hd_put(struct hd *h, uint64_t addr, uint32_t len, uint16_t id, uint16_t flags)
{
	struct vring_pk_desc_le *e = slot_p(h, h->avail);

	e->addr = htole64(addr);
	e->len = htole32(len);
	e->id = htole16(id);
	flags |= h->wrap ? VRING_PK_DESC_F_AVAIL : VRING_PK_DESC_F_USED;
	__atomic_store_n(&e->flags, htole16(flags), __ATOMIC_RELEASE);
	if (++h->avail == h->num) {
		h->avail = 0;
		h->wrap = !h->wrap;
	}
}

static uint16_t used_flags_at(struct hd *h, unsigned i)
{
	return le16toh(__atomic_load_n(&slot_p(h, i)->flags, __ATOMIC_ACQUIRE));
}

static bool is_used(uint16_t f, bool wrap)
{
	return !!(f & VRING_PK_DESC_F_AVAIL) == wrap && !!(f & VRING_PK_DESC_F_USED) == wrap;
}

TEST(layout_and_size_rules)
{
	struct vring_layout l;

	ASSERT_OK(vring_layout_packed(1, &l));
	ASSERT_OK(vring_layout_packed(100, &l));
	ASSERT_EQ(l.avail_off % 64, 0);
	ASSERT_EQ(l.used_off, l.avail_off + 64);
	ASSERT_OK(vring_layout_packed(32768, &l));
	ASSERT_EQ(vring_layout_packed(0, &l), -EINVAL);
	ASSERT_EQ(vring_layout_packed(32769, &l), -EINVAL);
	ASSERT_TRUE(vring_pk_size_valid(3));
	ASSERT_FALSE(vring_pk_size_valid(0));
}

TEST(init_rejects_bad_config)
{
	struct hd h;

	hd_init(&h, 8, 0);
	ASSERT_ERR(hd_start(&h, 0, 0, 0x8000), EINVAL);
	ASSERT_ERR(hd_start(&h, 40000, 0, 0x8000), EINVAL);
	ASSERT_ERR(hd_start(&h, 8, 0, 0x8008), EINVAL); /* base slot >= num */
	h.lay.desc_off = 8;                               /* misaligned ring */
	ASSERT_ERR(hd_start(&h, 8, 0, 0x8000), EINVAL);
	h.lay.desc_off = MEMSZ - 16; /* ring runs off guest memory */
	ASSERT_ERR(hd_start(&h, 8, 0, 0x8000), EFAULT);
	hd_fini(&h);
}

TEST(pop_single_and_chain_then_used_descriptors)
{
	struct hd h;
	struct iovec out[4], in[4];
	struct vring_chain c;

	hd_init(&h, 8, 0);
	ASSERT_TRUE(vring_dev_empty(h.q));
	ASSERT_ERR(vring_dev_pop(h.q, out, 4, in, 4, &c), EAGAIN);
	hd_put(&h, GPA0 + BUFS, 100, 5, 0);
	/* A three-descriptor buffer: id only in the last one (the others carry junk ids). */
	hd_put(&h, GPA0 + BUFS + 0x1000, 10, 999, VRING_DESC_F_NEXT);
	hd_put(&h, GPA0 + BUFS + 0x2000, 20, 999, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
	hd_put(&h, GPA0 + BUFS + 0x3000, 30, 2, VRING_DESC_F_WRITE);
	ASSERT_EQ(vring_dev_avail_count(h.q), 2);

	ASSERT_OK(vring_dev_pop(h.q, out, 4, in, 4, &c));
	ASSERT_EQ(c.head, 5);
	ASSERT_EQ(c.out_num, 1);
	ASSERT_EQ(c.in_num, 0);
	ASSERT_EQ(c.out_len, 100);
	ASSERT_TRUE(out[0].iov_base == h.mem + BUFS);
	ASSERT_OK(vring_dev_pop(h.q, out, 4, in, 4, &c));
	ASSERT_EQ(c.head, 2);
	ASSERT_EQ(c.out_num, 1);
	ASSERT_EQ(c.in_num, 2);
	ASSERT_EQ(c.in_len, 50);
	ASSERT_EQ(vring_dev_inflight(h.q), 2);
	ASSERT_EQ(vring_dev_last_avail_idx(h.q), 0x8000 | 4);

	/* Complete out of order, as one batch: id 2 first (slot 0), then id 5 (slot 3). */
	ASSERT_OK(vring_dev_fill(h.q, 2, 44));
	ASSERT_OK(vring_dev_fill(h.q, 5, 0));
	ASSERT_FALSE(is_used(used_flags_at(&h, 0), true)); /* batch not published yet */
	ASSERT_TRUE(is_used(used_flags_at(&h, 3), true));  /* later entries may be */
	vring_dev_flush(h.q);
	ASSERT_TRUE(is_used(used_flags_at(&h, 0), true));
	ASSERT_EQ(le16toh(slot_p(&h, 0)->id), 2);
	ASSERT_EQ(le32toh(slot_p(&h, 0)->len), 44);
	ASSERT_EQ(le16toh(slot_p(&h, 3)->id), 5);
	ASSERT_EQ(le32toh(slot_p(&h, 3)->len), 0);
	ASSERT_EQ(vring_dev_inflight(h.q), 0);
	/* Caller bugs: id not in flight, id out of range. */
	ASSERT_ERR(vring_dev_fill(h.q, 5, 0), EINVAL);
	ASSERT_ERR(vring_dev_fill(h.q, 8, 0), EINVAL);
	ASSERT_EQ(vring_dev_error(h.q), VRING_ERR_NONE);
	hd_fini(&h);
}

TEST(wrap_counters_over_many_laps)
{
	struct hd h;
	struct iovec in[4];
	struct vring_chain c;
	unsigned used_slot = 0;
	bool used_wrap = true;

	hd_init(&h, 5, 0); /* not a power of two: the spec allows any size */
	for (unsigned i = 0; i < 1000; i++) {
		unsigned n = 1 + i % 3; /* buffers of 1..3 descriptors cross the end of the ring */

		for (unsigned k = 0; k < n; k++)
			hd_put(&h, GPA0 + BUFS + k * 64, 64, (uint16_t)(i % 5),
			       VRING_DESC_F_WRITE | (k + 1 < n ? VRING_DESC_F_NEXT : 0));
		ASSERT_OK(vring_dev_pop(h.q, NULL, 0, in, 4, &c));
		ASSERT_EQ(c.head, i % 5);
		ASSERT_EQ(c.in_num, n);
		ASSERT_OK(vring_dev_push(h.q, c.head, (uint32_t)i));
		ASSERT_TRUE(is_used(used_flags_at(&h, used_slot), used_wrap));
		ASSERT_EQ(le32toh(slot_p(&h, used_slot)->len), i);
		used_slot += n;
		if (used_slot >= 5) {
			used_slot -= 5;
			used_wrap = !used_wrap;
		}
		ASSERT_EQ(vring_dev_last_avail_idx(h.q), (uint16_t)(h.avail | (h.wrap ? 0x8000 : 0)));
	}
	ASSERT_EQ(vring_dev_error(h.q), VRING_ERR_NONE);
	hd_fini(&h);
}

TEST(restart_from_base_with_wrap_bit)
{
	struct hd h;
	struct iovec in[2];
	struct vring_chain c;

	hd_init(&h, 4, 0);
	/* Pretend the ring ran 6 slots before a stop: driver at slot 2 on the second lap. */
	h.avail = 2;
	h.wrap = false;
	ASSERT_OK(hd_start(&h, 4, 0, 2));
	ASSERT_TRUE(vring_dev_empty(h.q));
	hd_put(&h, GPA0 + BUFS, 8, 1, VRING_DESC_F_WRITE);
	ASSERT_OK(vring_dev_pop(h.q, NULL, 0, in, 2, &c));
	ASSERT_OK(vring_dev_push(h.q, c.head, 8));
	ASSERT_TRUE(is_used(used_flags_at(&h, 2), false)); /* written with wrap 0 */
	ASSERT_EQ(vring_dev_last_avail_idx(h.q), 3);
	hd_fini(&h);
}

TEST(indirect_table)
{
	struct hd h;
	struct iovec out[4], in[4];
	struct vring_chain c;
	struct vring_pk_desc_le *t;

	hd_init(&h, 4, F_IND);
	t = (struct vring_pk_desc_le *)(h.mem + BUFS + 0x8000);
	t[0] = (struct vring_pk_desc_le){ .addr = htole64(GPA0 + BUFS), .len = htole32(16),
					  .flags = htole16(VRING_DESC_F_NEXT) /* ignored */ };
	t[1] = (struct vring_pk_desc_le){ .addr = htole64(GPA0 + BUFS + 64), .len = htole32(32),
					  .flags = htole16(VRING_DESC_F_WRITE) };
	t[2] = (struct vring_pk_desc_le){ .addr = htole64(GPA0 + BUFS + 128), .len = htole32(8),
					  .flags = htole16(VRING_DESC_F_WRITE) };
	hd_put(&h, GPA0 + BUFS + 0x8000, 48, 3, VRING_DESC_F_INDIRECT);
	ASSERT_OK(vring_dev_pop(h.q, out, 4, in, 4, &c));
	ASSERT_EQ(c.head, 3);
	ASSERT_EQ(c.out_num, 1);
	ASSERT_EQ(c.in_num, 2);
	ASSERT_EQ(c.in_len, 40);
	ASSERT_OK(vring_dev_push(h.q, 3, 40));
	ASSERT_TRUE(is_used(used_flags_at(&h, 0), true));
	ASSERT_EQ(vring_dev_last_avail_idx(h.q), 0x8001); /* one ring slot */
	hd_fini(&h);
}

TEST(enobufs_does_not_consume_and_skip_does)
{
	struct hd h;
	struct iovec in[1];
	struct vring_chain c;
	uint16_t id = 0;

	hd_init(&h, 4, 0);
	hd_put(&h, GPA0 + BUFS, 8, 0, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT);
	hd_put(&h, GPA0 + BUFS + 64, 8, 1, VRING_DESC_F_WRITE);
	ASSERT_ERR(vring_dev_pop(h.q, NULL, 0, in, 1, &c), ENOBUFS);
	ASSERT_EQ(vring_dev_error(h.q), VRING_ERR_NONE);
	ASSERT_EQ(vring_dev_last_avail_idx(h.q), 0x8000);
	ASSERT_OK(vring_dev_skip(h.q, &id));
	ASSERT_EQ(id, 1);
	ASSERT_EQ(vring_dev_last_avail_idx(h.q), 0x8002);
	ASSERT_OK(vring_dev_push(h.q, id, 0));
	ASSERT_TRUE(is_used(used_flags_at(&h, 0), true));
	hd_fini(&h);
}

/* Each case: what the hand-written driver stores, and the error the queue must report. */
static void expect_broken(uint64_t features, void (*setup)(struct hd *), enum vring_err want)
{
	struct hd h;
	struct iovec out[8], in[8];
	struct vring_chain c;

	hd_init(&h, 4, features);
	setup(&h);
	ASSERT_ERR(vring_dev_pop(h.q, out, 8, in, 8, &c), EIO);
	ASSERT_EQ(vring_dev_error(h.q), want);
	ASSERT_TRUE(vring_dev_error_msg(h.q)[0] != '\0');
	/* Broken stays broken: every data-path call fails, nothing is written. */
	ASSERT_ERR(vring_dev_pop(h.q, out, 8, in, 8, &c), EIO);
	ASSERT_ERR(vring_dev_avail_count(h.q), EIO);
	ASSERT_TRUE(vring_dev_empty(h.q));
	ASSERT_FALSE(vring_dev_should_notify(h.q));
	ASSERT_FALSE(vring_dev_enable_notify(h.q));
	hd_fini(&h);
}

static void s_id_range(struct hd *h)
{
	hd_put(h, GPA0 + BUFS, 8, 4, 0);
}
static void s_loop(struct hd *h)
{
	for (int i = 0; i < 4; i++) /* every slot says NEXT: the buffer would span the ring */
		hd_put(h, GPA0 + BUFS, 8, 0, VRING_DESC_F_NEXT);
}
static void s_order(struct hd *h)
{
	hd_put(h, GPA0 + BUFS, 8, 0, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT);
	hd_put(h, GPA0 + BUFS, 8, 0, 0);
}
static void s_addr(struct hd *h)
{
	hd_put(h, GPA0 + MEMSZ - 4, 8, 0, 0);
}
static void s_ind_feature(struct hd *h)
{
	hd_put(h, GPA0 + BUFS, 16, 0, VRING_DESC_F_INDIRECT);
}
static void s_ind_next(struct hd *h)
{
	hd_put(h, GPA0 + BUFS, 16, 0, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT);
}
static void s_ind_len(struct hd *h)
{
	hd_put(h, GPA0 + BUFS, 24, 0, VRING_DESC_F_INDIRECT);
}
static void s_ind_addr(struct hd *h)
{
	hd_put(h, 0x10, 32, 0, VRING_DESC_F_INDIRECT);
}
static void s_ind_nested(struct hd *h)
{
	struct vring_pk_desc_le *t = (struct vring_pk_desc_le *)(h->mem + BUFS);

	t[0].flags = htole16(VRING_DESC_F_INDIRECT);
	hd_put(h, GPA0 + BUFS, 16, 0, VRING_DESC_F_INDIRECT);
}
static void s_ind_huge(struct hd *h)
{
	/* 8 table entries on a queue of 4: more buffer descriptors than the queue size. */
	hd_put(h, GPA0 + BUFS, 8 * 16, 0, VRING_DESC_F_INDIRECT);
}

TEST(hostile_descriptors_break_the_queue)
{
	expect_broken(0, s_id_range, VRING_ERR_HEAD);
	expect_broken(0, s_loop, VRING_ERR_LOOP);
	expect_broken(0, s_order, VRING_ERR_ORDER);
	expect_broken(0, s_addr, VRING_ERR_ADDR);
	expect_broken(0, s_ind_feature, VRING_ERR_INDIRECT_FEATURE);
	expect_broken(F_IND, s_ind_next, VRING_ERR_INDIRECT_NEXT);
	expect_broken(F_IND, s_ind_len, VRING_ERR_INDIRECT_LEN);
	expect_broken(F_IND, s_ind_addr, VRING_ERR_INDIRECT_ADDR);
	expect_broken(F_IND, s_ind_nested, VRING_ERR_INDIRECT_NESTED);
	expect_broken(F_IND, s_ind_huge, VRING_ERR_LOOP);
}

TEST(duplicate_id_in_flight_breaks)
{
	struct hd h;
	struct iovec in[2];
	struct vring_chain c;

	hd_init(&h, 4, 0);
	hd_put(&h, GPA0 + BUFS, 8, 1, VRING_DESC_F_WRITE);
	hd_put(&h, GPA0 + BUFS, 8, 1, VRING_DESC_F_WRITE);
	ASSERT_OK(vring_dev_pop(h.q, NULL, 0, in, 2, &c));
	ASSERT_ERR(vring_dev_pop(h.q, NULL, 0, in, 2, &c), EIO);
	ASSERT_EQ(vring_dev_error(h.q), VRING_ERR_HEAD);
	ASSERT_ERR(vring_dev_fill(h.q, 1, 0), EIO);
	hd_fini(&h);
}

static void set_drv_ev(struct hd *h, uint16_t off, bool wrap, uint16_t flags)
{
	uint32_t v = vring_pk_event_word(off, wrap, flags);

	memcpy(drv_ev(h), &(uint32_t){ htole32(v) }, 4);
}

static void one_round(struct hd *h, uint16_t id)
{
	struct iovec in[1];
	struct vring_chain c;

	hd_put(h, GPA0 + BUFS, 8, id, VRING_DESC_F_WRITE);
	ASSERT_OK(vring_dev_pop(h->q, NULL, 0, in, 1, &c));
	ASSERT_OK(vring_dev_push(h->q, c.head, 0));
}

TEST(interrupt_decision_from_driver_area)
{
	struct hd h;

	hd_init(&h, 4, F_EVT);
	set_drv_ev(&h, 0, false, VRING_PK_EVENT_F_DISABLE);
	one_round(&h, 0);
	ASSERT_FALSE(vring_dev_should_notify(h.q));
	set_drv_ev(&h, 0, false, VRING_PK_EVENT_F_ENABLE);
	one_round(&h, 1);
	ASSERT_TRUE(vring_dev_should_notify(h.q));
	/* DESC: notify when the used descriptor at slot 3 (wrap 1) is written. */
	set_drv_ev(&h, 3, true, VRING_PK_EVENT_F_DESC);
	one_round(&h, 2); /* writes slot 2 */
	ASSERT_FALSE(vring_dev_should_notify(h.q));
	one_round(&h, 3); /* writes slot 3 */
	ASSERT_TRUE(vring_dev_should_notify(h.q));
	ASSERT_FALSE(vring_dev_should_notify(h.q)); /* nothing new since */
	/* Slot 0 of the next lap (wrap 0). */
	set_drv_ev(&h, 1, false, VRING_PK_EVENT_F_DESC);
	one_round(&h, 0); /* slot 0, wrap 0 */
	ASSERT_FALSE(vring_dev_should_notify(h.q));
	one_round(&h, 1); /* slot 1, wrap 0 */
	ASSERT_TRUE(vring_dev_should_notify(h.q));
	/* Without EVENT_IDX, DESC is not ours to honour: interrupt. */
	ASSERT_OK(hd_start(&h, 4, 0, vring_dev_last_avail_idx(h.q)));
	set_drv_ev(&h, 3, true, VRING_PK_EVENT_F_DESC);
	one_round(&h, 2);
	ASSERT_TRUE(vring_dev_should_notify(h.q));
	hd_fini(&h);
}

TEST(kick_suppression_in_device_area)
{
	struct hd h;
	uint16_t id;
	uint32_t v;

	hd_init(&h, 4, F_EVT);
	memcpy(&v, dev_ev(&h), 4);
	ASSERT_EQ(le32toh(v), vring_pk_event_word(0, true, VRING_PK_EVENT_F_DESC));
	vring_dev_disable_notify(h.q);
	memcpy(&v, dev_ev(&h), 4);
	ASSERT_EQ(le32toh(v) >> 16, VRING_PK_EVENT_F_DISABLE);
	ASSERT_FALSE(vring_dev_enable_notify(h.q));
	hd_put(&h, GPA0 + BUFS, 8, 0, 0);
	vring_dev_disable_notify(h.q);
	/* A buffer added while kicks were off is found by the re-enable re-check. */
	ASSERT_TRUE(vring_dev_enable_notify(h.q));
	ASSERT_OK(vring_dev_skip(h.q, &id));
	memcpy(&v, dev_ev(&h), 4);
	/* The event offset follows our avail position while kicks are wanted. */
	ASSERT_EQ(le32toh(v), vring_pk_event_word(1, true, VRING_PK_EVENT_F_DESC));
	ASSERT_OK(hd_start(&h, 4, 0, 0x8000));
	memcpy(&v, dev_ev(&h), 4);
	ASSERT_EQ(le32toh(v), vring_pk_event_word(0, false, VRING_PK_EVENT_F_ENABLE));
	hd_fini(&h);
}

TEST(event_passed_helper)
{
	/* Ring of 8; moved 3 from slot 6 wrap 1: slots 6, 7 (wrap 1) and 0 (wrap 0) written. */
	ASSERT_TRUE(vring_pk_event_passed(8, 6 | 0x8000, 6, true, 3));
	ASSERT_TRUE(vring_pk_event_passed(8, 7 | 0x8000, 6, true, 3));
	ASSERT_TRUE(vring_pk_event_passed(8, 0, 6, true, 3));
	ASSERT_FALSE(vring_pk_event_passed(8, 1, 6, true, 3));
	ASSERT_FALSE(vring_pk_event_passed(8, 0 | 0x8000, 6, true, 3)); /* a lap ahead */
	ASSERT_FALSE(vring_pk_event_passed(8, 5 | 0x8000, 6, true, 3)); /* behind */
	ASSERT_FALSE(vring_pk_event_passed(8, 6 | 0x8000, 6, true, 0));
	ASSERT_TRUE(vring_pk_event_passed(8, 9, 6, true, 1));  /* offset out of range */
	ASSERT_TRUE(vring_pk_event_passed(8, 1, 6, true, 8)); /* a whole ring */
}

TEST_MAIN()
