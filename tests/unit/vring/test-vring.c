/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the device side of the split virtqueue, against a fake two-region guest memory
 * (gpa 0x10000..0x20000 and 0x20000..0x30000, adjacent in guest-physical space but separate host
 * allocations): chains of one, two and many descriptors, a buffer split across regions, indirect
 * tables, every validation rule (the table broken_rings: each row must break the queue with its
 * own error and never crash), used-ring batching, interrupt and kick suppression with and without
 * EVENT_IDX including u16 wraparound.
 */
#include "test.h"
#include "util/macros.h"
#include "vring/vring.h"

#include <endian.h>

#define RA 0x10000ull /* region A: the ring lives at its start */
#define RB 0x20000ull
#define RSIZE 0x10000ull
#define BUF (RA + 0x8000) /* buffers from here on */
#define NIOV 16

struct fx {
	uint8_t *mem[2];
	struct guest_mem *gm;
	struct vring_dev_queue q;
	struct vring_desc_le *desc;
	struct vring_avail_le *avail;
	struct vring_used_le *used;
	struct vring_layout lay;
	unsigned num;
	uint16_t avail_idx;
	/* What the last pop() took: the chain and its device-readable and -writable iovecs. */
	struct vring_chain c;
	struct iovec out[NIOV], in[NIOV];
};

static void *host(struct fx *f, uint64_t gpa)
{
	return gpa >= RB ? f->mem[1] + (gpa - RB) : f->mem[0] + (gpa - RA);
}

#define F_IND (1ull << VRING_FEAT_INDIRECT_DESC)
#define F_EVT (1ull << VRING_FEAT_EVENT_IDX)

/* Lays out the ring without initialising the queue (tests may preset used->idx first). */
static void fx_mem(struct fx *f, unsigned num)
{
	struct guest_mem_region_desc d[2] = {
		{ .guest_phys_addr = RA, .memory_size = RSIZE, .userspace_addr = 0x7000000000 },
		{ .guest_phys_addr = RB, .memory_size = RSIZE, .userspace_addr = 0x5000000000 },
	};

	memset(f, 0, sizeof(*f));
	f->num = num;
	for (int i = 0; i < 2; i++) {
		f->mem[i] = aligned_alloc(4096, RSIZE);
		ASSERT_TRUE(f->mem[i]);
		memset(f->mem[i], 0, RSIZE);
	}
	ASSERT_OK(guest_mem_new_local(d, (void *const *)f->mem, 2, &f->gm));
	ASSERT_OK(vring_layout(num, &f->lay));
	ASSERT_LE(f->lay.total, 0x8000);
	f->desc = host(f, RA + f->lay.desc_off);
	f->avail = host(f, RA + f->lay.avail_off);
	f->used = host(f, RA + f->lay.used_off);
}

static void fx_start(struct fx *f, uint64_t features, uint16_t last_avail)
{
	struct vring_dev_config c = {
		.mem = f->gm, .num = f->num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = RA + f->lay.desc_off, .avail_addr = RA + f->lay.avail_off,
		.used_addr = RA + f->lay.used_off, .features = features,
		.last_avail_idx = last_avail,
	};

	f->avail_idx = last_avail;
	f->avail->idx = htole16(last_avail);
	ASSERT_OK(vring_dev_init(&f->q, &c));
}

static void fx_init(struct fx *f, unsigned num, uint64_t features)
{
	fx_mem(f, num);
	fx_start(f, features, 0);
}

static void fx_fini(struct fx *f)
{
	guest_mem_free(f->gm);
	free(f->mem[0]);
	free(f->mem[1]);
}

static void set_desc_in(struct vring_desc_le *t, unsigned i, uint64_t addr, uint32_t len,
			uint16_t flags, uint16_t next)
{
	t[i].addr = htole64(addr);
	t[i].len = htole32(len);
	t[i].flags = htole16(flags);
	t[i].next = htole16(next);
}

static void set_desc(struct fx *f, unsigned i, uint64_t addr, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	set_desc_in(f->desc, i, addr, len, flags, next);
}

static void post(struct fx *f, uint16_t head)
{
	f->avail->ring[f->avail_idx % f->num] = htole16(head);
	f->avail_idx++;
	f->avail->idx = htole16(f->avail_idx);
}

static uint16_t used_idx(struct fx *f)
{
	return le16toh(f->used->idx);
}

static int pop(struct fx *f)
{
	return vring_dev_pop(&f->q, f->out, NIOV, f->in, NIOV, &f->c);
}

/* An assertion that names the case (a row of broken_rings) it fails in. */
#define CHECK(what, cond)                                                                          \
	do {                                                                                       \
		if (!(cond))                                                                       \
			test_fail(__FILE__, __LINE__, "%s: %s", what, #cond);                      \
	} while (0)

/* The next pop breaks the queue with error e, and the queue stays broken. */
static void expect_broken(struct fx *f, enum vring_err e, const char *what)
{
	uint16_t head;

	CHECK(what, pop(f) == -EIO);
	CHECK(what, vring_dev_error(&f->q) == e);
	CHECK(what, strlen(vring_dev_error_msg(&f->q)) > 0);
	/* Broken stays broken, whatever the guest does next. */
	CHECK(what, pop(f) == -EIO);
	CHECK(what, vring_dev_skip(&f->q, &head) == -EIO);
	CHECK(what, vring_dev_avail_count(&f->q) == -EIO);
	CHECK(what, vring_dev_empty(&f->q));
	CHECK(what, !vring_dev_should_notify(&f->q));
	CHECK(what, vring_dev_push(&f->q, 0, 0) == -EIO);
	CHECK(what, vring_dev_error(&f->q) == e);
}

TEST(single_descriptor_header_and_payload)
{
	struct fx f;

	fx_init(&f, 8, 0);
	memcpy(host(&f, BUF), "hdr-and-payload", 15);
	set_desc(&f, 3, BUF, 44 + 100, 0, 0);
	post(&f, 3);
	ASSERT_EQ(vring_dev_avail_count(&f.q), 1);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.head, 3);
	ASSERT_EQ(f.c.out_num, 1);
	ASSERT_EQ(f.c.in_num, 0);
	ASSERT_EQ(f.c.out_len, 144);
	ASSERT_TRUE(f.out[0].iov_base == host(&f, BUF));
	ASSERT_EQ(f.out[0].iov_len, 144);
	ASSERT_MEMEQ(f.out[0].iov_base, "hdr-and-payload", 15);
	ASSERT_EQ(vring_dev_inflight(&f.q), 1);
	ASSERT_ERR(pop(&f), EAGAIN);
	ASSERT_TRUE(vring_dev_empty(&f.q));

	ASSERT_OK(vring_dev_push(&f.q, 3, 0));
	ASSERT_EQ(used_idx(&f), 1);
	ASSERT_EQ(le32toh(f.used->ring[0].id), 3);
	ASSERT_EQ(le32toh(f.used->ring[0].len), 0);
	ASSERT_EQ(vring_dev_inflight(&f.q), 0);
	ASSERT_EQ(vring_dev_last_avail_idx(&f.q), 1);
	fx_fini(&f);
}

TEST(two_descriptors_header_then_payload)
{
	struct fx f;

	fx_init(&f, 8, 0);
	set_desc(&f, 0, BUF, 44, VRING_DESC_F_NEXT, 5);
	set_desc(&f, 5, BUF + 0x100, 4096, 0, 0);
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.out_num, 2);
	ASSERT_EQ(f.c.out_len, 44 + 4096);
	ASSERT_TRUE(f.out[1].iov_base == host(&f, BUF + 0x100));
	fx_fini(&f);
}

TEST(many_descriptors_readable_then_writable)
{
	struct fx f;

	fx_init(&f, 16, 0);
	/* 4 readable then 12 writable, the whole table, in reverse index order. */
	for (unsigned i = 0; i < 16; i++) {
		unsigned idx = 15 - i;
		uint16_t flags = (uint16_t)((i >= 4 ? VRING_DESC_F_WRITE : 0) |
					    (i < 15 ? VRING_DESC_F_NEXT : 0));

		set_desc(&f, idx, BUF + i * 0x100, 0x80, flags, (uint16_t)(idx - 1));
	}
	post(&f, 15);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.head, 15);
	ASSERT_EQ(f.c.out_num, 4);
	ASSERT_EQ(f.c.in_num, 12);
	ASSERT_EQ(f.c.out_len, 4 * 0x80);
	ASSERT_EQ(f.c.in_len, 12 * 0x80);
	ASSERT_TRUE(f.in[11].iov_base == host(&f, BUF + 15 * 0x100));
	memset(f.in[0].iov_base, 0xee, 0x80);
	ASSERT_OK(vring_dev_push(&f.q, f.c.head, 0x80));
	ASSERT_EQ(le32toh(f.used->ring[0].len), 0x80);
	fx_fini(&f);
}

TEST(buffer_split_across_regions)
{
	struct fx f;

	fx_init(&f, 8, 0);
	set_desc(&f, 1, RB - 0x10, 0x30, VRING_DESC_F_WRITE, 0);
	post(&f, 1);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.in_num, 2);
	ASSERT_EQ(f.c.in_len, 0x30);
	ASSERT_TRUE(f.in[0].iov_base == host(&f, RB - 0x10));
	ASSERT_EQ(f.in[0].iov_len, 0x10);
	ASSERT_TRUE(f.in[1].iov_base == f.mem[1]);
	ASSERT_EQ(f.in[1].iov_len, 0x20);
	fx_fini(&f);
}

/* ---- malformed rings: each breaks the queue with its own error ---------------------------- */

/* One descriptor to write: in the ring, or in the indirect table at RB. */
struct desc_set {
	bool set;
	uint16_t i;
	uint64_t addr;
	uint32_t len;
	uint16_t flags, next;
};

#define D(i_, addr_, len_, flags_, next_)                                                         \
	{ .set = true, .i = i_, .addr = addr_, .len = len_, .flags = flags_, .next = next_ }

#define NEXT VRING_DESC_F_NEXT
#define WRITE VRING_DESC_F_WRITE
#define INDIRECT VRING_DESC_F_INDIRECT

struct broken_ring {
	const char *name;
	uint64_t features;
	struct desc_set ring[2];  /* descriptors in the ring */
	struct desc_set table[2]; /* entries of an indirect table at gpa RB */
	uint16_t head;            /* the head posted in the avail ring */
	uint16_t avail_idx;       /* non-zero: written to avail->idx instead of posting head */
	bool skip;                /* found by vring_dev_skip() (which must fail) before any pop */
	enum vring_err err;       /* the error the queue must break with */
};

static const struct broken_ring broken_rings[] = {
	{ "unmapped_address", 0, { D(0, BUF, 44, NEXT, 1), D(1, 0x900000, 16, 0, 0) },
	  .err = VRING_ERR_ADDR },
	{ "buffer_running_off_guest_memory", 0, { D(0, RB + RSIZE - 8, 16, 0, 0) },
	  .err = VRING_ERR_ADDR },
	{ "indirect_without_feature", 0, { D(0, RB, 16, INDIRECT, 0) }, { D(0, BUF, 16, 0, 0) },
	  .err = VRING_ERR_INDIRECT_FEATURE },
	{ "indirect_length_not_multiple_of_16", F_IND, { D(0, RB, 24, INDIRECT, 0) },
	  { D(0, BUF, 16, 0, 0) }, .err = VRING_ERR_INDIRECT_LEN },
	{ "indirect_length_zero", F_IND, { D(0, RB, 0, INDIRECT, 0) },
	  .err = VRING_ERR_INDIRECT_LEN },
	{ "indirect_nested", F_IND, { D(0, RB, 32, INDIRECT, 0) },
	  { D(0, BUF, 16, NEXT, 1), D(1, RB + 0x100, 16, INDIRECT, 0) },
	  .err = VRING_ERR_INDIRECT_NESTED },
	{ "indirect_with_next", F_IND, { D(0, RB, 16, INDIRECT | NEXT, 1), D(1, BUF, 16, 0, 0) },
	  { D(0, BUF, 16, 0, 0) }, .err = VRING_ERR_INDIRECT_NEXT },
	{ "indirect_table_unmapped", F_IND, { D(0, 0x900000, 32, INDIRECT, 0) },
	  .err = VRING_ERR_INDIRECT_ADDR },
	/* The table has 2 entries. */
	{ "indirect_next_past_table", F_IND, { D(0, RB, 32, INDIRECT, 0) },
	  { D(0, BUF, 16, NEXT, 2), D(1, BUF, 16, 0, 0) }, .err = VRING_ERR_NEXT },
	{ "indirect_loop", F_IND, { D(0, RB, 32, INDIRECT, 0) },
	  { D(0, BUF, 16, NEXT, 1), D(1, BUF, 16, NEXT, 0) }, .err = VRING_ERR_LOOP },
	{ "loop_a_b_a", 0, { D(2, BUF, 16, NEXT, 6), D(6, BUF, 16, NEXT, 2) }, .head = 2,
	  .err = VRING_ERR_LOOP },
	{ "self_loop_of_zero_length_descriptors", 0, { D(0, BUF, 0, NEXT, 0) },
	  .err = VRING_ERR_LOOP },
	{ "next_past_ring", 0, { D(0, BUF, 16, NEXT, 8) }, .err = VRING_ERR_NEXT },
	{ "head_past_ring", 0, .head = 8, .err = VRING_ERR_HEAD },
	{ "head_past_ring_on_skip", 0, .head = 0xffff, .skip = true, .err = VRING_ERR_HEAD },
	{ "avail_idx_jumps_more_than_num", 0, .avail_idx = 9, .err = VRING_ERR_AVAIL_IDX },
	{ "writable_then_readable", 0, { D(0, BUF, 16, WRITE | NEXT, 1), D(1, BUF + 16, 16, 0, 0) },
	  .err = VRING_ERR_ORDER },
	{ "zero_length_writable_then_readable", 0,
	  { D(0, BUF, 0, WRITE | NEXT, 1), D(1, BUF + 16, 16, 0, 0) }, .err = VRING_ERR_ORDER },
};

#undef NEXT
#undef WRITE
#undef INDIRECT
#undef D

static void run_broken_ring(const struct broken_ring *b)
{
	struct fx f;
	uint16_t head;

	fx_init(&f, 8, b->features);
	for (size_t k = 0; k < ARRAY_SIZE(b->ring) && b->ring[k].set; k++) {
		const struct desc_set *d = &b->ring[k];

		set_desc(&f, d->i, d->addr, d->len, d->flags, d->next);
	}
	for (size_t k = 0; k < ARRAY_SIZE(b->table) && b->table[k].set; k++) {
		const struct desc_set *d = &b->table[k];

		set_desc_in(host(&f, RB), d->i, d->addr, d->len, d->flags, d->next);
	}
	if (b->avail_idx)
		f.avail->idx = htole16(b->avail_idx);
	else
		post(&f, b->head);
	if (b->skip) {
		CHECK(b->name, vring_dev_skip(&f.q, &head) == -EIO);
		CHECK(b->name, vring_dev_error(&f.q) == b->err);
	}
	expect_broken(&f, b->err, b->name);
	fx_fini(&f);
}

TEST(broken_rings)
{
	for (size_t i = 0; i < ARRAY_SIZE(broken_rings); i++)
		run_broken_ring(&broken_rings[i]);
}

TEST(iov_storage_too_small_is_not_fatal)
{
	struct fx f;
	struct iovec out[2], in[2];
	struct vring_chain c;
	uint16_t head;

	fx_init(&f, 8, 0);
	set_desc(&f, 0, BUF, 16, VRING_DESC_F_NEXT, 1);
	set_desc(&f, 1, BUF + 16, 16, VRING_DESC_F_NEXT, 2);
	set_desc(&f, 2, BUF + 32, 16, 0, 0);
	post(&f, 0);
	ASSERT_ERR(vring_dev_pop(&f.q, out, 2, in, 2, &c), ENOBUFS);
	ASSERT_EQ(vring_dev_error(&f.q), VRING_ERR_NONE);
	ASSERT_EQ(vring_dev_avail_count(&f.q), 1); /* not consumed */
	ASSERT_OK(vring_dev_skip(&f.q, &head));
	ASSERT_EQ(head, 0);
	ASSERT_OK(vring_dev_push(&f.q, head, 0));
	ASSERT_EQ(used_idx(&f), 1);
	ASSERT_ERR(vring_dev_skip(&f.q, &head), EAGAIN);
	fx_fini(&f);
}

TEST(indirect_table_valid)
{
	struct fx f;
	struct vring_desc_le *t;

	fx_init(&f, 8, F_IND);
	t = host(&f, RB + 0x1000);
	set_desc_in(t, 0, BUF, 44, VRING_DESC_F_NEXT, 2);
	set_desc_in(t, 2, BUF + 0x100, 100, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
	set_desc_in(t, 1, BUF + 0x200, 200, VRING_DESC_F_WRITE, 0);
	/* The pointer descriptor's WRITE flag is ignored (virtio 1.2 §2.7.5.3). */
	set_desc(&f, 4, RB + 0x1000, 3 * 16, VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE, 0);
	post(&f, 4);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.head, 4);
	ASSERT_EQ(f.c.out_num, 1);
	ASSERT_EQ(f.c.in_num, 2);
	ASSERT_EQ(f.c.out_len, 44);
	ASSERT_EQ(f.c.in_len, 300);
	ASSERT_TRUE(f.in[1].iov_base == host(&f, BUF + 0x200));
	fx_fini(&f);
}

TEST(direct_descriptors_then_indirect_table)
{
	struct fx f;
	struct vring_desc_le *t;

	fx_init(&f, 8, F_IND);
	t = host(&f, RB + 0x1000);
	set_desc_in(t, 0, BUF + 0x100, 64, VRING_DESC_F_WRITE, 0);
	set_desc(&f, 0, BUF, 44, VRING_DESC_F_NEXT, 1);
	set_desc(&f, 1, RB + 0x1000, 16, VRING_DESC_F_INDIRECT, 0);
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.out_num, 1);
	ASSERT_EQ(f.c.in_num, 1);
	fx_fini(&f);
}

TEST(indirect_table_across_regions)
{
	struct fx f;

	fx_init(&f, 8, F_IND);
	/* 4 entries: 2 at the end of region A, 2 at the start of region B (other host memory). */
	set_desc_in(host(&f, RB - 32), 0, BUF, 10, VRING_DESC_F_NEXT, 1);
	set_desc_in(host(&f, RB - 32), 1, BUF + 10, 10, VRING_DESC_F_NEXT, 2);
	set_desc_in(host(&f, RB), 0, BUF + 20, 10, VRING_DESC_F_NEXT, 3);
	set_desc_in(host(&f, RB), 1, BUF + 30, 10, VRING_DESC_F_WRITE, 0);
	set_desc(&f, 2, RB - 32, 64, VRING_DESC_F_INDIRECT, 0);
	post(&f, 2);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.out_num, 3);
	ASSERT_EQ(f.c.in_num, 1);
	ASSERT_TRUE(f.in[0].iov_base == host(&f, BUF + 30));
	fx_fini(&f);
}

TEST(chain_of_exactly_num_descriptors_is_fine)
{
	struct fx f;

	fx_init(&f, 8, 0);
	for (unsigned i = 0; i < 8; i++)
		set_desc(&f, i, BUF + i, 1, i < 7 ? VRING_DESC_F_NEXT : 0, (uint16_t)(i + 1));
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(f.c.out_num, 8);
	fx_fini(&f);
}

TEST(avail_idx_exactly_num_ahead_is_fine)
{
	struct fx f;

	fx_mem(&f, 8);
	fx_start(&f, 0, 65530); /* the 8 chains straddle the u16 wrap */
	for (unsigned i = 0; i < 8; i++) {
		set_desc(&f, i, BUF, 4, 0, 0);
		post(&f, (uint16_t)i);
	}
	ASSERT_EQ(le16toh(f.avail->idx), 2);
	ASSERT_EQ(vring_dev_avail_count(&f.q), 8);
	for (unsigned i = 0; i < 8; i++) {
		ASSERT_OK(pop(&f));
		ASSERT_EQ(f.c.head, i);
	}
	ASSERT_ERR(pop(&f), EAGAIN);
	/* Moving backwards is a jump of more than num too. */
	f.avail->idx = htole16(1);
	expect_broken(&f, VRING_ERR_AVAIL_IDX, "avail idx moved backwards");
	fx_fini(&f);
}

TEST(batch_publishes_used_idx_once)
{
	struct fx f;

	fx_init(&f, 8, 0);
	for (unsigned i = 0; i < 3; i++) {
		set_desc(&f, i, BUF + i * 64, 64, VRING_DESC_F_WRITE, 0);
		post(&f, (uint16_t)i);
	}
	for (unsigned i = 0; i < 3; i++)
		ASSERT_OK(pop(&f));
	/* Completed out of order, each filled, nothing visible until the flush. */
	ASSERT_OK(vring_dev_fill(&f.q, 2, 20));
	ASSERT_OK(vring_dev_fill(&f.q, 0, 0));
	ASSERT_EQ(used_idx(&f), 0);
	ASSERT_OK(vring_dev_fill(&f.q, 1, 64));
	ASSERT_EQ(used_idx(&f), 0);
	vring_dev_flush(&f.q);
	ASSERT_EQ(used_idx(&f), 3);
	ASSERT_EQ(le32toh(f.used->ring[0].id), 2);
	ASSERT_EQ(le32toh(f.used->ring[0].len), 20);
	ASSERT_EQ(le32toh(f.used->ring[2].id), 1);
	ASSERT_EQ(le32toh(f.used->ring[2].len), 64);
	/* Pushing more than was popped, or a head past the ring, is a caller bug. */
	ASSERT_ERR(vring_dev_fill(&f.q, 0, 0), EINVAL);
	fx_fini(&f);
}

TEST(push_head_past_ring_refused)
{
	struct fx f;

	fx_init(&f, 8, 0);
	set_desc(&f, 0, BUF, 1, 0, 0);
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_ERR(vring_dev_fill(&f.q, 8, 0), EINVAL);
	ASSERT_OK(vring_dev_fill(&f.q, 0, 0));
	fx_fini(&f);
}

TEST(init_takes_used_idx_from_guest_memory)
{
	struct fx f;

	fx_mem(&f, 8);
	f.used->idx = htole16(500);
	fx_start(&f, 0, 503);
	set_desc(&f, 1, BUF, 1, 0, 0);
	post(&f, 1);
	ASSERT_OK(pop(&f));
	ASSERT_OK(vring_dev_push(&f.q, 1, 0));
	ASSERT_EQ(used_idx(&f), 501);
	ASSERT_EQ(le32toh(f.used->ring[500 % 8].id), 1);
	ASSERT_EQ(vring_dev_last_avail_idx(&f.q), 504);
	fx_fini(&f);
}

TEST(init_validation)
{
	struct fx f;
	struct vring_dev_queue q;
	struct vring_dev_config c;

	fx_mem(&f, 8);
	c = (struct vring_dev_config){ .mem = f.gm, .num = 8, .addr_kind = VRING_ADDR_GPA,
				       .desc_addr = RA, .avail_addr = RA + f.lay.avail_off,
				       .used_addr = RA + f.lay.used_off };
	ASSERT_OK(vring_dev_init(&q, &c));
	c.num = 0;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.num = 12;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.num = 65536;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.num = 8;
	c.desc_addr = RA + 8; /* misaligned */
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.desc_addr = RA;
	c.used_addr = RA + f.lay.used_off + 2;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.used_addr = 0x900000; /* unmapped */
	ASSERT_ERR(vring_dev_init(&q, &c), EFAULT);
	c.used_addr = RB - 16; /* straddles two regions */
	ASSERT_ERR(vring_dev_init(&q, &c), EFAULT);
	c.used_addr = RA + f.lay.used_off;
	c.addr_kind = _VRING_ADDR_MAX;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	/* Front-end virtual addresses (vhost-user SET_VRING_ADDR). */
	c.addr_kind = VRING_ADDR_UVA;
	c.desc_addr = 0x7000000000;
	c.avail_addr = 0x7000000000 + f.lay.avail_off;
	c.used_addr = 0x7000000000 + f.lay.used_off;
	ASSERT_OK(vring_dev_init(&q, &c));
	ASSERT_TRUE((void *)q.used == (void *)f.used);
	c.used_addr = RA + f.lay.used_off; /* a gpa is not a uva */
	ASSERT_ERR(vring_dev_init(&q, &c), EFAULT);
	/* Host pointers (the guest role's own memory); guest memory is still required. */
	c.addr_kind = VRING_ADDR_HOST;
	c.desc_addr = (uintptr_t)f.desc;
	c.avail_addr = (uintptr_t)f.avail;
	c.used_addr = (uintptr_t)f.used;
	ASSERT_OK(vring_dev_init(&q, &c));
	c.used_addr = (uintptr_t)f.used + 2;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	c.used_addr = (uintptr_t)f.used;
	c.mem = NULL;
	ASSERT_ERR(vring_dev_init(&q, &c), EINVAL);
	fx_fini(&f);
}

TEST(notify_without_event_idx)
{
	struct fx f;

	fx_init(&f, 8, 0);
	set_desc(&f, 0, BUF, 1, 0, 0);
	post(&f, 0);
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_OK(vring_dev_push(&f.q, 0, 0));
	ASSERT_TRUE(vring_dev_should_notify(&f.q));
	f.avail->flags = htole16(VRING_AVAIL_F_NO_INTERRUPT);
	ASSERT_OK(pop(&f));
	ASSERT_OK(vring_dev_push(&f.q, 0, 0));
	ASSERT_FALSE(vring_dev_should_notify(&f.q));
	fx_fini(&f);
}

/* Pops and pushes one chain (descriptor 0) through the event-idx fixture. */
static void cycle(struct fx *f)
{

	post(f, 0);
	ASSERT_OK(pop(f));
	ASSERT_OK(vring_dev_push(&f->q, 0, 0));
}

TEST(notify_with_event_idx_at_wrap)
{
	struct fx f;
	uint16_t *used_event;

	fx_mem(&f, 8);
	f.used->idx = htole16(65533);
	fx_start(&f, F_EVT, 65533);
	used_event = &f.avail->ring[8];
	set_desc(&f, 0, BUF, 1, 0, 0);

	/* The first decision after a start always signals. */
	*used_event = htole16(0);
	cycle(&f); /* used idx 65534 */
	ASSERT_TRUE(vring_dev_should_notify(&f.q));
	/* Nothing new published: no interrupt. */
	ASSERT_FALSE(vring_dev_should_notify(&f.q));
	/* Guest wants one when used idx passes 65535 (i.e. reaches 0). */
	*used_event = htole16(65535);
	cycle(&f); /* 65535 */
	ASSERT_FALSE(vring_dev_should_notify(&f.q));
	cycle(&f); /* 0: crossed the wrap and the event */
	ASSERT_TRUE(vring_dev_should_notify(&f.q));
	ASSERT_EQ(used_idx(&f), 0);
	/* Event 1, batch 0 → 3 published at once: crossed. */
	*used_event = htole16(1);
	cycle(&f);
	cycle(&f);
	cycle(&f);
	ASSERT_TRUE(vring_dev_should_notify(&f.q));
	/* Guest left used_event behind (interrupts disabled): none. */
	cycle(&f);
	ASSERT_FALSE(vring_dev_should_notify(&f.q));
	/* NO_INTERRUPT is ignored with EVENT_IDX; used_event decides. */
	f.avail->flags = htole16(VRING_AVAIL_F_NO_INTERRUPT);
	*used_event = htole16(le16toh(f.used->idx));
	cycle(&f);
	ASSERT_TRUE(vring_dev_should_notify(&f.q));
	fx_fini(&f);
}

TEST(need_event_arithmetic)
{
	ASSERT_TRUE(vring_idx_passed_event(0, 1, 0));
	ASSERT_FALSE(vring_idx_passed_event(1, 1, 0));
	ASSERT_TRUE(vring_idx_passed_event(65535, 0, 65535));
	ASSERT_TRUE(vring_idx_passed_event(65534, 2, 65530));
	ASSERT_FALSE(vring_idx_passed_event(3, 2, 65530));
	ASSERT_FALSE(vring_idx_passed_event(5, 5, 5));
	ASSERT_TRUE(vring_idx_passed_event(65535, 1, 65535));
}

TEST(kick_suppression_without_event_idx)
{
	struct fx f;

	fx_init(&f, 8, 0);
	ASSERT_EQ(le16toh(f.used->flags), 0);
	vring_dev_disable_notify(&f.q);
	ASSERT_EQ(le16toh(f.used->flags), VRING_USED_F_NO_NOTIFY);
	ASSERT_FALSE(vring_dev_enable_notify(&f.q));
	ASSERT_EQ(le16toh(f.used->flags), 0);
	/* A chain added while kicks were off is caught by the re-check. */
	vring_dev_disable_notify(&f.q);
	set_desc(&f, 0, BUF, 1, 0, 0);
	post(&f, 0);
	ASSERT_TRUE(vring_dev_enable_notify(&f.q));
	fx_fini(&f);
}

TEST(kick_suppression_with_event_idx)
{
	struct fx f;
	uint16_t *avail_event;

	fx_mem(&f, 8);
	fx_start(&f, F_EVT, 65534);
	avail_event = (uint16_t *)&f.used->ring[8];
	ASSERT_EQ(le16toh(*avail_event), 65534);
	set_desc(&f, 0, BUF, 1, 0, 0);
	/* Kicks enabled: avail_event follows the consumer. */
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_EQ(le16toh(*avail_event), 65535);
	/* Disabled: it stays, and flags are untouched. */
	vring_dev_disable_notify(&f.q);
	post(&f, 0);
	post(&f, 0);
	ASSERT_OK(pop(&f));
	ASSERT_OK(pop(&f));
	ASSERT_EQ(le16toh(*avail_event), 65535);
	ASSERT_EQ(le16toh(f.used->flags), 0);
	/* Re-enable: avail_event = last_avail_idx (wrapped), nothing pending. */
	ASSERT_FALSE(vring_dev_enable_notify(&f.q));
	ASSERT_EQ(le16toh(*avail_event), 1);
	ASSERT_EQ(vring_dev_last_avail_idx(&f.q), 1);
	/* The guest's kick decision for its next buffer now fires. */
	ASSERT_TRUE(vring_idx_passed_event(le16toh(*avail_event), 2, 1));
	post(&f, 0);
	vring_dev_disable_notify(&f.q);
	ASSERT_TRUE(vring_dev_enable_notify(&f.q));
	fx_fini(&f);
}

TEST(error_strings)
{
	for (int e = 0; e < _VRING_ERR_MAX; e++) {
		const char *n = vring_err_to_string((enum vring_err)e);

		/* Every value has its own entry in the table. */
		ASSERT_TRUE(n != NULL && n[0] != '\0');
		ASSERT_TRUE(strcmp(n, "unknown") != 0);
	}
	ASSERT_STREQ(vring_err_to_string(_VRING_ERR_MAX), "unknown");
	ASSERT_STREQ(vring_err_to_string(VRING_ERR_LOOP),
		     "descriptor chain longer than the queue (loop)");
}

TEST(layout_sizes)
{
	struct vring_layout l;

	ASSERT_OK(vring_layout(128, &l));
	ASSERT_EQ(l.desc_off, 0);
	ASSERT_EQ(l.avail_off, 2048);
	ASSERT_EQ(l.used_off, 2048 + 320); /* 6 + 256 = 262 → 320 */
	ASSERT_EQ(l.total, 2368 + 6 + 1024);
	ASSERT_OK(vring_layout(32768, &l));
	ASSERT_ERR(vring_layout(100, &l), EINVAL);
	ASSERT_ERR(vring_layout(65536, &l), EINVAL);
}

TEST_MAIN()
