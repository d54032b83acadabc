/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for VIRTIO_F_IN_ORDER on packed rings (virtio 1.2 §2.8.8), both sides over one
 * shared memory: the driver hands out buffer ids in sequence, the device folds runs of read-only
 * buffers used completely into one used descriptor (the last id, in the batch's first slot) and
 * writes every writable buffer's descriptor with its own length, a skipped writable buffer is
 * never folded, the driver expands a batch into its buffers in order, rejects hostile used
 * descriptors, and random runs over many ring sizes (across the wrap) with and without IN_ORDER
 * and EVENT_IDX keep every length exact and never lose an interrupt.
 */
#include "test.h"
#include "vring/vring_drv.h"

#include <endian.h>

#define GPA0 0x100000ull
#define RINGSZ 0x8000ull /* rings of up to 1024 descriptors and their event areas */
#define MEMSZ (RINGSZ + 0x40000ull)

static const uint64_t F_PK = 1ull << VRING_FEAT_RING_PACKED;
static const uint64_t F_IO = 1ull << VRING_FEAT_IN_ORDER;
static const uint64_t F_EVT = 1ull << VRING_FEAT_EVENT_IDX;
static const uint16_t USED_W1 = VRING_PK_DESC_F_AVAIL | VRING_PK_DESC_F_USED;

struct pr {
	uint8_t *mem;
	struct guest_mem *gm;
	struct vring_layout lay;
	struct vring_drv *drv;
	struct vring_dev_queue *q;
	unsigned num;
};

static int marks[8192];
#define MARK(k) ((void *)&marks[(k) % 8192])

static void pr_open(struct pr *r, unsigned num, uint64_t feat)
{
	struct guest_mem_region_desc rd = { .guest_phys_addr = GPA0, .memory_size = MEMSZ };
	void *hb[1];

	memset(r, 0, sizeof(*r));
	r->num = num;
	r->mem = aligned_alloc(4096, MEMSZ);
	r->q = calloc(1, sizeof(*r->q));
	ASSERT_TRUE(r->mem && r->q);
	memset(r->mem, 0xa5, MEMSZ);
	hb[0] = r->mem;
	ASSERT_OK(guest_mem_new_local(&rd, hb, 1, &r->gm));
	ASSERT_OK(vring_layout_packed(num, &r->lay));
	ASSERT_LE(r->lay.total, RINGSZ);
	ASSERT_OK(vring_drv_new(num, r->mem + r->lay.desc_off, r->mem + r->lay.avail_off,
				r->mem + r->lay.used_off, feat | F_PK, &r->drv));
	struct vring_dev_config c = {
		.mem = r->gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = GPA0 + r->lay.desc_off, .avail_addr = GPA0 + r->lay.avail_off,
		.used_addr = GPA0 + r->lay.used_off, .features = feat | F_PK,
		.last_avail_idx = 1u << VRING_PK_WRAP_BIT,
	};
	ASSERT_OK(vring_dev_init(r->q, &c));
}

static void pr_close(struct pr *r)
{
	vring_drv_free(r->drv);
	guest_mem_free(r->gm);
	free(r->mem);
	free(r->q);
}

static struct vring_pk_desc_le *slot_of(struct pr *r, unsigned s)
{
	return (struct vring_pk_desc_le *)(r->mem + r->lay.desc_off) + s;
}

static uint16_t flags_at(struct pr *r, unsigned s)
{
	return le16toh(slot_of(r, s)->flags);
}

/* Writes a used descriptor by hand, as a (hostile) device would. */
static void forge(struct pr *r, unsigned s, uint16_t id, uint32_t len, uint16_t flags)
{
	slot_of(r, s)->id = htole16(id);
	slot_of(r, s)->len = htole32(len);
	slot_of(r, s)->flags = htole16(flags);
}

/* Driver: adds nd descriptors of 64 bytes, the last wr of them writable; cookie MARK(k). */
static int add_buf(struct pr *r, unsigned nd, unsigned wr, unsigned k)
{
	struct vring_drv_buf b[4];
	unsigned i = 0;

	ASSERT_LE(nd, 4);
	for (; i < nd - wr; i++)
		b[i] = (struct vring_drv_buf){ GPA0 + RINGSZ + ((k * 4 + i) % 4096) * 64, 64, false };
	for (; i < nd; i++)
		b[i] = (struct vring_drv_buf){ GPA0 + RINGSZ + ((k * 4 + i) % 4096) * 64, 64, true };
	return vring_drv_add(r->drv, b, nd, MARK(k));
}

/* Device: the next available buffer, mapped (one iovec per descriptor here). */
static struct vring_chain pop_one(struct pr *r)
{
	struct iovec iov[8];
	struct vring_chain c;

	ASSERT_OK(vring_dev_pop(r->q, iov, 4, iov + 4, 4, &c));
	ASSERT_EQ(c.out_len + c.in_len, 64 * (c.out_num + c.in_num));
	return c;
}

/* Driver: the next used buffer must be the k-th added, with len bytes written. */
static void expect_used(struct pr *r, unsigned k, uint32_t len)
{
	struct {
		uint32_t len;
		void *ck;
	} got = { UINT32_MAX, NULL };

	ASSERT_OK(vring_drv_get_used(r->drv, &got.len, &got.ck));
	ASSERT_TRUE(got.ck == MARK(k) && got.len == len);
}

static void expect_none(struct pr *r)
{
	ASSERT_ERR(vring_drv_get_used(r->drv, &(uint32_t){ 0 }, &(void *){ NULL }), EAGAIN);
	ASSERT_FALSE(vring_drv_broken(r->drv));
}

/* Adds three one-descriptor buffers, has them used and collected, then adds three more. */
static void ids_after_one_round(uint64_t feat, const int want[3])
{
	struct pr r;

	pr_open(&r, 4, feat);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_EQ(add_buf(&r, 1, 0, k), (int)k);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_OK(vring_dev_push(r.q, pop_one(&r).head, 0));
	for (unsigned k = 0; k < 3; k++)
		expect_used(&r, k, 0);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_EQ(add_buf(&r, 1, 0, 3 + k), want[k]);
	pr_close(&r);
}

TEST(ids_are_sequential_with_in_order_only)
{
	ids_after_one_round(F_IO, (const int[3]){ 3, 0, 1 });
	ids_after_one_round(0, (const int[3]){ 2, 1, 0 }); /* the free list: last returned first */
}

TEST(device_folds_read_only_buffers_into_one_descriptor)
{
	struct pr r;
	struct vring_chain c;
	uint16_t before[5];

	pr_open(&r, 16, F_IO);
	for (unsigned k = 0; k < 5; k++)
		ASSERT_EQ(add_buf(&r, 2, 0, k), (int)k); /* slots 2k, 2k + 1 */
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 5; k++)
		before[k] = flags_at(&r, 2 * k);
	for (unsigned k = 0; k < 5; k++) {
		c = pop_one(&r);
		ASSERT_EQ(c.head, k);
		ASSERT_OK(vring_dev_fill(r.q, c.head, 0));
	}
	ASSERT_FALSE(vring_drv_more_used(r.drv)); /* nothing before the flush */
	vring_dev_flush(r.q);
	ASSERT_EQ(le16toh(slot_of(&r, 0)->id), 4); /* the batch's last id, in its first slot */
	ASSERT_EQ(le32toh(slot_of(&r, 0)->len), 0);
	ASSERT_EQ(flags_at(&r, 0), USED_W1);
	for (unsigned k = 1; k < 5; k++)
		ASSERT_EQ(flags_at(&r, 2 * k), before[k]); /* never written */
	for (unsigned k = 0; k < 5; k++)
		expect_used(&r, k, 0);
	expect_none(&r);
	ASSERT_EQ(vring_drv_num_free(r.drv), 16);
	pr_close(&r);
}

TEST(device_writes_each_writable_buffer_and_publishes_once)
{
	struct pr r;
	struct vring_chain c;

	pr_open(&r, 8, F_IO);
	for (unsigned k = 0; k < 4; k++)
		ASSERT_EQ(add_buf(&r, 2, 2, k), (int)k);
	ASSERT_TRUE(vring_drv_kick_prepare(r.drv));
	for (unsigned k = 0; k < 4; k++) {
		c = pop_one(&r);
		ASSERT_EQ(c.in_len, 128);
		ASSERT_OK(vring_dev_fill(r.q, c.head, 10 + k));
		ASSERT_FALSE(vring_drv_more_used(r.drv));
	}
	vring_dev_flush(r.q);
	for (unsigned k = 0; k < 4; k++) {
		ASSERT_EQ(le16toh(slot_of(&r, 2 * k)->id), k);
		ASSERT_EQ(le32toh(slot_of(&r, 2 * k)->len), 10 + k);
		ASSERT_EQ(flags_at(&r, 2 * k), USED_W1);
	}
	for (unsigned k = 0; k < 4; k++)
		expect_used(&r, k, 10 + k);
	expect_none(&r);
	pr_close(&r);
}

TEST(skipped_writable_buffer_is_never_folded)
{
	/* b0 ro, b1 ro, b2 rw (7 bytes), b3 ro, b4 rw skipped, b5 ro skipped, b6 ro. */
	static const unsigned nd[7] = { 1, 1, 2, 1, 2, 1, 1 }, wr[7] = { 0, 0, 1, 0, 1, 0, 0 };
	static const unsigned first[7] = { 0, 1, 2, 4, 5, 7, 8 };
	struct pr r;
	uint16_t id[7], before[7];

	pr_open(&r, 16, F_IO);
	for (unsigned k = 0; k < 7; k++)
		ASSERT_EQ(add_buf(&r, nd[k], wr[k], k), (int)k);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 7; k++) {
		before[k] = flags_at(&r, first[k]);
		if (k == 4 || k == 5)
			ASSERT_OK(vring_dev_skip(r.q, &id[k]));
		else
			id[k] = pop_one(&r).head;
	}
	for (unsigned k = 0; k < 7; k++)
		ASSERT_OK(vring_dev_fill(r.q, id[k], k == 2 ? 7 : 0));
	vring_dev_flush(r.q);
	/* b0, b1 fold into b2 (slot 0); b3 into the skipped b4, which keeps its len 0 (slot 4);
	 * b5 and b6 fold (slot 7). */
	ASSERT_EQ(le16toh(slot_of(&r, 0)->id), 2);
	ASSERT_EQ(le32toh(slot_of(&r, 0)->len), 7);
	ASSERT_EQ(le16toh(slot_of(&r, 4)->id), 4);
	ASSERT_EQ(le32toh(slot_of(&r, 4)->len), 0);
	ASSERT_EQ(le16toh(slot_of(&r, 7)->id), 6);
	for (unsigned k = 0; k < 7; k++)
		ASSERT_EQ(flags_at(&r, first[k]),
			  k == 0 || k == 3 || k == 5 ? USED_W1 : before[k]);
	for (unsigned k = 0; k < 7; k++)
		expect_used(&r, k, k == 2 ? 7 : 0);
	expect_none(&r);
	pr_close(&r);
}

/* Adds buffers k0 and k0 + 1 (two read-only slots each), has them used as one batch, and
 * checks where its used descriptor went. */
static void batch_of_two(struct pr *r, unsigned k0, unsigned slot, uint16_t id, uint16_t flags)
{
	for (unsigned k = k0; k < k0 + 2; k++)
		ASSERT_GE(add_buf(r, 2, 0, k), 0);
	vring_drv_publish(r->drv);
	for (unsigned k = 0; k < 2; k++)
		ASSERT_OK(vring_dev_fill(r->q, pop_one(r).head, 0));
	vring_dev_flush(r->q);
	ASSERT_EQ(le16toh(slot_of(r, slot)->id), id);
	ASSERT_EQ(flags_at(r, slot), flags);
	for (unsigned k = k0; k < k0 + 2; k++)
		expect_used(r, k, 0);
}

TEST(batches_across_the_wrap_carry_the_wrap_counter)
{
	struct pr r;

	pr_open(&r, 5, F_IO);
	batch_of_two(&r, 0, 0, 1, USED_W1); /* slots 0-1, 2-3 */
	batch_of_two(&r, 2, 4, 3, USED_W1); /* slots 4-0 (wrapping), 1-2: still the first lap */
	batch_of_two(&r, 4, 3, 0, 0);       /* slots 3-4, 0-1 on the second lap; ids 4, 0 */
	expect_none(&r);
	ASSERT_EQ(vring_drv_num_free(r.drv), 5);
	pr_close(&r);
}

/* Three buffers in flight (ids 0, 1, 2 at slots 0, 2, 4; 64 writable bytes each). */
static void open_three(struct pr *r)
{
	pr_open(r, 8, F_IO);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_EQ(add_buf(r, 2, 1, k), (int)k);
	vring_drv_publish(r->drv);
}

static void expect_broken(struct pr *r)
{
	ASSERT_ERR(vring_drv_get_used(r->drv, &(uint32_t){ 0 }, &(void *){ NULL }), EIO);
	ASSERT_TRUE(vring_drv_broken(r->drv));
	ASSERT_FALSE(vring_drv_more_used(r->drv));
}

static void bad_first(uint16_t id, uint32_t len)
{
	struct pr r;

	open_three(&r);
	forge(&r, 0, id, len, USED_W1);
	expect_broken(&r);
	pr_close(&r);
}

TEST(driver_rejects_hostile_used_descriptors)
{
	bad_first(3, 0);  /* not in flight */
	bad_first(8, 0);  /* out of range */
	bad_first(2, 65); /* longer than the last buffer's writable part */
	bad_first(1, 65);
}

TEST(driver_takes_a_batch_then_checks_the_next_slot)
{
	struct pr r;

	open_three(&r);
	forge(&r, 0, 1, 3, USED_W1); /* a batch of two */
	forge(&r, 2, 2, 5, USED_W1); /* inside the batch: never read */
	ASSERT_TRUE(vring_drv_more_used(r.drv));
	expect_used(&r, 0, 64); /* skipped: used completely */
	ASSERT_TRUE(vring_drv_more_used(r.drv));
	expect_used(&r, 1, 3);
	expect_none(&r); /* slot 4 still holds the driver's available descriptor */
	forge(&r, 4, 0, 0, USED_W1); /* id 0 is no longer in flight: behind the oldest */
	expect_broken(&r);
	pr_close(&r);

	open_three(&r);
	forge(&r, 0, 2, 64, USED_W1); /* all three */
	for (unsigned k = 0; k < 3; k++)
		expect_used(&r, k, 64);
	forge(&r, 6, 3, 0, USED_W1); /* nothing is in flight */
	expect_broken(&r);
	pr_close(&r);
}

/*
 * A random run: buffers of 1..3 descriptors, read-only or with a writable last one, consumed by
 * pop or skip, filled in order with a random length (0 when skipped or read-only), flushed at
 * random points. Every length must come back exactly; a driver asleep (after enable_cb said no
 * more) must be interrupted by the next publication.
 */
static void run_random(unsigned num, uint64_t feat, unsigned total, unsigned seed)
{
	static uint32_t expect[8192];
	uint16_t held[64];
	unsigned added = 0, served = 0, taken = 0, nheld = 0, filled = 0;
	bool asleep = false, unflushed = false;
	struct pr r;

	pr_open(&r, num, feat);
	while (taken < total) {
		uint32_t len;
		void *ck;

		seed = seed * 1103515245u + 12345u;
		for (unsigned n = (seed >> 24) % 4; n > 0 && added < total; n--) {
			unsigned nd = 1 + (seed >> (n * 3)) % 3, wr = (seed >> (n + 9)) & 1;

			if (add_buf(&r, nd, wr, added) < 0)
				break;
			added++;
		}
		vring_drv_publish(r.drv);
		while (nheld < 64 && !vring_dev_empty(r.q) && ((seed >> 8) & 7) != 0) {
			struct vring_chain c = { 0 };
			bool skip = (seed >> 12) % 5 == 0;

			if (skip)
				ASSERT_OK(vring_dev_skip(r.q, &c.head));
			else
				c = pop_one(&r);
			held[nheld] = c.head;
			expect[served % 8192] = skip || !c.in_len ? 0 : (uint32_t)(served % 65);
			nheld++;
			served++;
			seed = seed * 1103515245u + 12345u;
		}
		/* Fill a prefix in order; flush sometimes (or when everything is served). */
		for (unsigned n = nheld ? 1 + (seed >> 4) % nheld : 0; n > 0; n--) {
			ASSERT_OK(vring_dev_fill(r.q, held[0], expect[filled % 8192]));
			memmove(held, held + 1, --nheld * sizeof(held[0]));
			filled++;
			unflushed = true;
		}
		if ((seed >> 16) % 3 != 0 || added == total) {
			bool notified;

			vring_dev_flush(r.q);
			notified = vring_dev_should_notify(r.q);
			ASSERT_FALSE(asleep && unflushed && !notified); /* a lost interrupt */
			unflushed = false;
			if (notified)
				asleep = false;
		}
		if (asleep)
			continue;
		while (vring_drv_get_used(r.drv, &len, &ck) == 0) {
			unsigned k = (unsigned)((int *)ck - marks);

			ASSERT_EQ(k, taken % 8192);
			ASSERT_EQ(len, expect[k]);
			taken++;
		}
		ASSERT_FALSE(vring_drv_broken(r.drv));
		ASSERT_EQ(vring_dev_error(r.q), VRING_ERR_NONE);
		if ((seed >> 20) & 1)
			asleep = !vring_drv_enable_cb(r.drv);
	}
	ASSERT_EQ(vring_drv_num_free(r.drv), num);
	pr_close(&r);
}

TEST(random_runs_with_in_order)
{
	static const unsigned sizes[] = { 1, 2, 3, 5, 7, 16, 100, 256, 1024 };

	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned total = sizes[i] < 16 ? 3000 : 20000;

		run_random(sizes[i], F_IO, total, 7 + i);
		run_random(sizes[i], F_IO | F_EVT, total, 70 + i);
	}
}

TEST(random_runs_without_in_order)
{
	run_random(5, 0, 3000, 3);
	run_random(16, F_EVT, 20000, 4);
	run_random(100, 0, 20000, 5);
}

TEST_MAIN()
