/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for VIRTIO_F_IN_ORDER on split rings (virtio 1.2 §2.7.8, §2.7.9), both sides over
 * one shared memory: the driver takes descriptors in ring order (links wrap to 0), the device
 * folds chains used completely into one used element per batch and writes every other element
 * in its own slot, the driver expands a batch into its buffers in order with the right lengths,
 * rejects an id out of order, and a long mixed run across the u16 and table wraps stays exact.
 */
#include "test.h"
#include "util/macros.h"
#include "vring/vring_drv.h"

#include <endian.h>

#define RING_GPA 0x200000ull
#define AREA (256u * 1024u)
#define DATA_OFF 0x20000u /* buffers start here in the area */

static const uint64_t F_IO = 1ull << VRING_FEAT_IN_ORDER;

/* One driver and one device queue over the same area, which is the whole guest memory. */
struct ring2 {
	uint8_t *area;
	struct guest_mem *gm;
	struct vring_layout lay;
	struct vring_drv *drv;
	struct vring_dev_queue q;
};

static int marks[4096];

static struct vring_used_le *used_of(struct ring2 *r)
{
	return (struct vring_used_le *)(r->area + r->lay.used_off);
}
#define MARK(i) ((void *)&marks[(i) % 4096])

static struct vring_desc_le *desc_of(struct ring2 *r, unsigned i)
{
	return (struct vring_desc_le *)(r->area + r->lay.desc_off) + i;
}

static void ring2_open(struct ring2 *r, unsigned num, uint64_t feat)
{
	struct guest_mem_region_desc reg = { .guest_phys_addr = RING_GPA, .memory_size = AREA };
	void *host[1];
	struct vring_dev_config cfg = { .num = num, .addr_kind = VRING_ADDR_GPA, .features = feat };

	memset(r, 0, sizeof(*r));
	r->area = aligned_alloc(4096, AREA);
	ASSERT_TRUE(r->area);
	memset(r->area, 0xee, AREA);
	host[0] = r->area;
	ASSERT_OK(guest_mem_new_local(&reg, host, 1, &r->gm));
	ASSERT_TRUE(vring_layout(num, &r->lay) == 0 && r->lay.total <= DATA_OFF);
	ASSERT_OK(vring_drv_new(num, r->area + r->lay.desc_off, r->area + r->lay.avail_off,
				r->area + r->lay.used_off, feat, &r->drv));
	/* The driver zeroed the ring; mark the used elements to see which ones get written. */
	memset(used_of(r)->ring, 0xee, 8 * num);
	cfg.mem = r->gm;
	cfg.desc_addr = RING_GPA + r->lay.desc_off;
	cfg.avail_addr = RING_GPA + r->lay.avail_off;
	cfg.used_addr = RING_GPA + r->lay.used_off;
	ASSERT_OK(vring_dev_init(&r->q, &cfg));
}

static void ring2_close(struct ring2 *r)
{
	vring_drv_free(r->drv);
	guest_mem_free(r->gm);
	free(r->area);
}

/*
 * Driver: adds a chain of nd descriptors, the last `wr` of them device-writable (64 bytes each),
 * with cookie MARK(k). Returns the head.
 */
static int add_chain(struct ring2 *r, unsigned nd, unsigned wr, unsigned k)
{
	struct vring_drv_buf b[8];

	ASSERT_LE(nd, 8);
	for (unsigned i = 0; i < nd; i++) {
		b[i].addr = RING_GPA + DATA_OFF + ((k * 8 + i) % 2048) * 64;
		b[i].len = 64;
		b[i].write = i >= nd - wr;
	}
	return vring_drv_add(r->drv, b, nd, MARK(k));
}

/* Device: pops one chain (must be there). */
static struct vring_chain pop_one(struct ring2 *r)
{
	struct iovec out[8], in[8];
	struct vring_chain c;

	ASSERT_OK(vring_dev_pop(&r->q, out, 8, in, 8, &c));
	return c;
}

/* Driver: takes the next used buffer and checks its cookie and length. */
static void expect_used(struct ring2 *r, unsigned k, uint32_t len)
{
	uint32_t got;
	void *ck;

	ASSERT_OK(vring_drv_get_used(r->drv, &got, &ck));
	ASSERT_TRUE(ck == MARK(k));
	ASSERT_EQ(got, len);
}

static uint32_t used_id(struct ring2 *r, unsigned slot)
{
	return le32toh(used_of(r)->ring[slot].id);
}

TEST(driver_takes_descriptors_in_ring_order)
{
	struct ring2 r;
	struct vring_chain c;

	ring2_open(&r, 8, F_IO);
	ASSERT_EQ(add_chain(&r, 3, 0, 0), 0);
	ASSERT_EQ(add_chain(&r, 2, 1, 1), 3);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 2; k++) {
		c = pop_one(&r);
		ASSERT_OK(vring_dev_fill(&r.q, c.head, c.in_len ? 5 : 0));
	}
	vring_dev_flush(&r.q);
	expect_used(&r, 0, 0);
	expect_used(&r, 1, 5);
	/* The next chain starts at 5 and wraps: 5, 6, 7, 0 (the last descriptor links to 0). */
	ASSERT_EQ(add_chain(&r, 4, 0, 2), 5);
	ASSERT_EQ(le16toh(desc_of(&r, 7)->next), 0);
	ASSERT_EQ(le16toh(desc_of(&r, 6)->next), 7);
	vring_drv_publish(r.drv);
	c = pop_one(&r);
	ASSERT_EQ(c.head, 5);
	ASSERT_EQ(c.out_len, 4 * 64);
	ASSERT_OK(vring_dev_push(&r.q, c.head, 0));
	expect_used(&r, 2, 0);
	ASSERT_EQ(vring_drv_num_free(r.drv), 8);
	ring2_close(&r);
}

TEST(device_folds_readable_chains_into_one_element)
{
	struct ring2 r;
	struct vring_chain c;
	uint16_t heads[5];

	ring2_open(&r, 16, F_IO);
	for (unsigned k = 0; k < 5; k++)
		ASSERT_GE(add_chain(&r, 2, 0, k), 0);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 5; k++) {
		c = pop_one(&r);
		heads[k] = c.head;
		ASSERT_OK(vring_dev_fill(&r.q, c.head, 0));
	}
	vring_dev_flush(&r.q);
	ASSERT_EQ(le16toh(used_of(&r)->idx), 5);
	ASSERT_EQ(used_id(&r, 0), heads[4]); /* the batch's last id, in its first slot */
	ASSERT_EQ(le32toh(used_of(&r)->ring[0].len), 0);
	for (unsigned s = 1; s < 5; s++)
		ASSERT_EQ(used_id(&r, s), 0xeeeeeeeeu); /* never written */
	for (unsigned k = 0; k < 5; k++)
		expect_used(&r, k, 0);
	ASSERT_ERR(vring_drv_get_used(r.drv, &(uint32_t){ 0 }, &(void *){ NULL }), EAGAIN);
	ASSERT_EQ(vring_drv_num_free(r.drv), 16);
	ring2_close(&r);
}

TEST(device_writes_each_writable_element_and_publishes_once)
{
	struct ring2 r;
	struct vring_chain c;

	ring2_open(&r, 8, F_IO);
	for (unsigned k = 0; k < 4; k++)
		ASSERT_GE(add_chain(&r, 2, 2, k), 0);
	ASSERT_TRUE(vring_drv_kick_prepare(r.drv));
	for (unsigned k = 0; k < 4; k++) {
		c = pop_one(&r);
		ASSERT_OK(vring_dev_fill(&r.q, c.head, 10 + k));
		ASSERT_EQ(le16toh(used_of(&r)->idx), 0); /* nothing published before the flush */
	}
	vring_dev_flush(&r.q);
	ASSERT_EQ(le16toh(used_of(&r)->idx), 4);
	for (unsigned k = 0; k < 4; k++) {
		ASSERT_EQ(used_id(&r, k), 2 * k);
		ASSERT_EQ(le32toh(used_of(&r)->ring[k].len), 10 + k);
	}
	for (unsigned k = 0; k < 4; k++)
		expect_used(&r, k, 10 + k);
	ring2_close(&r);
}

TEST(mixed_batch_and_skipped_chain)
{
	struct ring2 r;
	struct vring_chain c;
	uint16_t h[6];

	ring2_open(&r, 16, F_IO);
	/* ro, ro, rw, ro, skipped (unknown), ro */
	ASSERT_GE(add_chain(&r, 1, 0, 0), 0);
	ASSERT_GE(add_chain(&r, 1, 0, 1), 0);
	ASSERT_GE(add_chain(&r, 2, 1, 2), 0);
	ASSERT_GE(add_chain(&r, 1, 0, 3), 0);
	ASSERT_GE(add_chain(&r, 1, 0, 4), 0);
	ASSERT_GE(add_chain(&r, 1, 0, 5), 0);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 6; k++) {
		if (k == 4) {
			ASSERT_OK(vring_dev_skip(&r.q, &h[k]));
		} else {
			c = pop_one(&r);
			h[k] = c.head;
		}
	}
	for (unsigned k = 0; k < 6; k++)
		ASSERT_OK(vring_dev_fill(&r.q, h[k], k == 2 ? 7 : 0));
	vring_dev_flush(&r.q);
	/* Slot 0: ro, ro folded into the rw chain, which carries its length. Chain 3 lies between
	 * two chains that may be writable (the device tracks only the range), so it, the skipped
	 * one and the last each get their own slot. */
	ASSERT_EQ(le16toh(used_of(&r)->idx), 6);
	ASSERT_EQ(used_id(&r, 0), h[2]);
	ASSERT_EQ(le32toh(used_of(&r)->ring[0].len), 7);
	ASSERT_EQ(used_id(&r, 1), 0xeeeeeeeeu);
	ASSERT_EQ(used_id(&r, 2), 0xeeeeeeeeu);
	ASSERT_EQ(used_id(&r, 3), h[3]);
	ASSERT_EQ(used_id(&r, 4), h[4]);
	ASSERT_EQ(used_id(&r, 5), h[5]);
	for (unsigned k = 0; k < 6; k++)
		expect_used(&r, k, k == 2 ? 7 : 0);
	ring2_close(&r);
}

TEST(without_in_order_every_element_is_written)
{
	struct ring2 r;
	struct vring_chain c;

	ring2_open(&r, 8, 0);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_GE(add_chain(&r, 1, 0, k), 0);
	vring_drv_publish(r.drv);
	for (unsigned k = 0; k < 3; k++) {
		c = pop_one(&r);
		ASSERT_OK(vring_dev_fill(&r.q, c.head, 0));
	}
	vring_dev_flush(&r.q);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_EQ(used_id(&r, k), k);
	ring2_close(&r);
}

/* Device misbehaviour seen by an IN_ORDER driver: three chains of two descriptors in flight. */
static void bad_batch(uint32_t id, uint32_t len, uint16_t idx, unsigned good_before)
{
	struct ring2 r;
	uint32_t got;
	void *ck;

	ring2_open(&r, 8, F_IO);
	for (unsigned k = 0; k < 3; k++)
		ASSERT_EQ(add_chain(&r, 2, 1, k), (int)(2 * k));
	vring_drv_publish(r.drv);
	used_of(&r)->ring[0].id = htole32(id);
	used_of(&r)->ring[0].len = htole32(len);
	used_of(&r)->idx = htole16(idx);
	for (unsigned k = 0; k < good_before; k++)
		ASSERT_OK(vring_drv_get_used(r.drv, &got, &ck));
	ASSERT_ERR(vring_drv_get_used(r.drv, &got, &ck), EIO);
	ASSERT_TRUE(vring_drv_broken(r.drv));
	ring2_close(&r);
}

TEST(driver_rejects_ids_out_of_order)
{
	bad_batch(4, 0, 2, 0);  /* the third chain, but used->idx says two were used */
	bad_batch(1, 0, 1, 0);  /* inside a chain, not a head */
	bad_batch(2, 65, 2, 0); /* longer than the chain's writable part */
	bad_batch(8, 0, 3, 0);  /* out of range */
	bad_batch(2, 0, 4, 0);  /* more used than in flight */
}

TEST(driver_accepts_batch_and_then_rejects_stale_slot)
{
	/* A batch of two (slot 0 names chain 1); slot 2 then still holds garbage the device
	 * never wrote: a published third must be a real element. */
	bad_batch(2, 3, 3, 2);
}

/* A long mixed run: random chain shapes, batch sizes and fill points, through every wrap. */
static void run_mixed(unsigned num, uint64_t feat, unsigned total)
{
	struct ring2 r;
	unsigned added = 0, served = 0, taken = 0, seed = 12345;
	uint16_t held[64];
	uint32_t lens[64];
	static uint32_t expect[4096]; /* by ordinal: chains are served in the order added */
	unsigned nheld = 0;

	ring2_open(&r, num, feat);
	while (taken < total) {
		unsigned nd, wr;
		uint32_t len;
		void *ck;

		seed = seed * 1103515245u + 12345u;
		nd = 1 + (seed >> 16) % 3;
		wr = (seed >> 20) % 4 == 0 ? 1 : 0;
		while (added < total && add_chain(&r, nd, wr, added) >= 0)
			added++;
		vring_drv_publish(r.drv);
		/* Device: pop a few and fill them; flush at random points. */
		while (nheld < 64 && !vring_dev_empty(&r.q) && ((seed >> 8) & 7) != 0) {
			struct vring_chain c = pop_one(&r);

			held[nheld] = c.head;
			lens[nheld] = c.in_len ? (uint32_t)(served % 64) : 0;
			expect[served % 4096] = lens[nheld++];
			served++;
			seed = seed * 1103515245u + 12345u;
		}
		for (unsigned i = 0; i < nheld; i++)
			ASSERT_OK(vring_dev_fill(&r.q, held[i], lens[i]));
		nheld = 0;
		vring_dev_flush(&r.q);
		while (vring_drv_get_used(r.drv, &len, &ck) == 0) {
			int k = (int *)ck - marks;

			ASSERT_EQ((unsigned)k, taken % 4096);
			ASSERT_EQ(len, expect[k]);
			taken++;
		}
		ASSERT_FALSE(vring_drv_broken(r.drv));
		ASSERT_EQ(vring_dev_error(&r.q), VRING_ERR_NONE);
	}
	ASSERT_EQ(vring_drv_num_free(r.drv), num);
	ring2_close(&r);
}

TEST(mixed_run_70000_in_order)
{
	run_mixed(16, F_IO, 70000);
	run_mixed(1, F_IO, 3000);
	run_mixed(16, F_IO | (1ull << VRING_FEAT_EVENT_IDX), 70000);
}

TEST(mixed_run_70000_without_in_order)
{
	run_mixed(16, 0, 70000);
}

TEST_MAIN()
