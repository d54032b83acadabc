/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the driver side of the split virtqueue, alone (descriptor layout, free list,
 * indirect tables, a misbehaving device) and talking to the device side over the same memory:
 * N buffers through and back with cookies and lengths, kick and interrupt suppression with and
 * without EVENT_IDX (no kick or interrupt is ever lost by a sleeping side), u16 index wraparound
 * after 70000 operations, and a two-thread run that exercises the barriers for real.
 */
#include "test.h"
#include "util/macros.h"
#include "util/time.h"
#include "vring/vring_drv.h"

#include <endian.h>
#include <pthread.h>
#include <sched.h>

#define MEMSZ 0x40000ull /* one region at gpa 0x100000 */
#define GPA0 0x100000ull
#define BUFS 0x10000ull /* buffer area offset in the region */

static const uint64_t F_IND = 1ull << VRING_FEAT_INDIRECT_DESC;
static const uint64_t F_EVT = 1ull << VRING_FEAT_EVENT_IDX;

struct pair {
	uint8_t *mem;
	struct guest_mem *gm;
	struct vring_layout lay;
	struct vring_drv *drv;
	struct vring_dev_queue dev;
	unsigned num;
};

static void *hva(struct pair *p, uint64_t gpa)
{
	return p->mem + (gpa - GPA0);
}

static void pair_init(struct pair *p, unsigned num, uint64_t features)
{
	struct guest_mem_region_desc d = { .guest_phys_addr = GPA0, .memory_size = MEMSZ };
	void *hb[1];

	memset(p, 0, sizeof(*p));
	p->num = num;
	p->mem = aligned_alloc(4096, MEMSZ);
	ASSERT_TRUE(p->mem);
	memset(p->mem, 0x5a, MEMSZ); /* the driver must zero the ring itself */
	hb[0] = p->mem;
	ASSERT_OK(guest_mem_new_local(&d, hb, 1, &p->gm));
	ASSERT_OK(vring_layout(num, &p->lay));
	ASSERT_LE(p->lay.total, BUFS);
	ASSERT_OK(vring_drv_new(num, p->mem + p->lay.desc_off, p->mem + p->lay.avail_off,
				p->mem + p->lay.used_off, features, &p->drv));
	struct vring_dev_config c = {
		.mem = p->gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = GPA0 + p->lay.desc_off, .avail_addr = GPA0 + p->lay.avail_off,
		.used_addr = GPA0 + p->lay.used_off, .features = features,
	};
	ASSERT_OK(vring_dev_init(&p->dev, &c));
}

static void pair_fini(struct pair *p)
{
	vring_drv_free(p->drv);
	guest_mem_free(p->gm);
	free(p->mem);
}

static struct vring_desc_le *desc(struct pair *p, unsigned i)
{
	return (struct vring_desc_le *)(p->mem + p->lay.desc_off) + i;
}

static struct vring_used_le *used(struct pair *p)
{
	return (struct vring_used_le *)(p->mem + p->lay.used_off);
}

static int cookie_v[1024];
#define COOKIE(i) ((void *)&cookie_v[(i) % 1024])

TEST(new_validation_and_zeroing)
{
	struct pair p;
	struct vring_drv *d = NULL;

	pair_init(&p, 8, 0);
	ASSERT_EQ(vring_drv_num_free(p.drv), 8);
	ASSERT_EQ(used(&p)->idx, 0);
	ASSERT_EQ(desc(&p, 7)->addr, 0);
	ASSERT_ERR(vring_drv_new(6, p.mem, p.mem + 1024, p.mem + 2048, 0, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(8, p.mem + 8, p.mem + 1024, p.mem + 2048, 0, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(8, p.mem, p.mem + 1025, p.mem + 2048, 0, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(8, p.mem, p.mem + 1024, p.mem + 2050, 0, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(8, NULL, p.mem + 1024, p.mem + 2048, 0, &d), EINVAL);
	ASSERT_TRUE(d == NULL);
	vring_drv_free(NULL);
	pair_fini(&p);
}

TEST(add_writes_chain_and_avail)
{
	struct pair p;
	struct vring_drv_buf b[3] = {
		{ GPA0 + BUFS, 44, false },
		{ GPA0 + BUFS + 0x100, 100, true },
		{ GPA0 + BUFS + 0x200, 200, true },
	};
	struct vring_avail_le *av;
	int head;

	pair_init(&p, 8, 0);
	av = (struct vring_avail_le *)(p.mem + p.lay.avail_off);
	head = vring_drv_add(p.drv, b, 3, COOKIE(1));
	ASSERT_EQ(head, 0);
	ASSERT_EQ(vring_drv_num_free(p.drv), 5);
	ASSERT_EQ_U64(le64toh(desc(&p, 0)->addr), GPA0 + BUFS);
	ASSERT_EQ(le16toh(desc(&p, 0)->flags), VRING_DESC_F_NEXT);
	ASSERT_EQ(le16toh(desc(&p, 0)->next), 1);
	ASSERT_EQ(le16toh(desc(&p, 1)->flags), VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
	ASSERT_EQ(le16toh(desc(&p, 2)->flags), VRING_DESC_F_WRITE);
	ASSERT_EQ(le32toh(desc(&p, 2)->len), 200);
	ASSERT_EQ(le16toh(av->ring[0]), 0);
	/* Not visible before publication. */
	ASSERT_EQ(av->idx, 0);
	ASSERT_TRUE(vring_dev_empty(&p.dev));
	vring_drv_publish(p.drv);
	ASSERT_EQ(le16toh(av->idx), 1);
	ASSERT_EQ(vring_dev_avail_count(&p.dev), 1);
	pair_fini(&p);
}

TEST(add_errors)
{
	struct pair p;
	struct vring_drv_buf b[9];
	uint64_t table[16];

	pair_init(&p, 8, 0);
	for (unsigned i = 0; i < 9; i++)
		b[i] = (struct vring_drv_buf){ GPA0 + BUFS + i * 16, 16, i >= 4 };
	ASSERT_ERR(vring_drv_add(p.drv, b, 9, COOKIE(0)), ENOSPC);
	ASSERT_ERR(vring_drv_add(p.drv, b, 0, COOKIE(0)), EINVAL);
	ASSERT_ERR(vring_drv_add(p.drv, b, 2, NULL), EINVAL);
	b[5].write = false; /* readable after writable */
	ASSERT_ERR(vring_drv_add(p.drv, b, 6, COOKIE(0)), EINVAL);
	/* Indirect needs the feature. */
	ASSERT_ERR(vring_drv_add_indirect(p.drv, b, 2, table, GPA0, COOKIE(0)), EINVAL);
	ASSERT_EQ(vring_drv_add(p.drv, b, 8 - 3, COOKIE(0)), 0);
	ASSERT_EQ(vring_drv_add(p.drv, b, 3, COOKIE(0)), 5);
	ASSERT_EQ(vring_drv_num_free(p.drv), 0);
	ASSERT_ERR(vring_drv_add(p.drv, b, 1, COOKIE(0)), ENOSPC);
	pair_fini(&p);
}

/* Device side: pop one chain, write `fill` bytes of pattern into its writable part, push. */
static void dev_serve_one(struct pair *p, uint8_t pattern, uint32_t fill, struct vring_chain *c)
{
	struct iovec out[16], in[16];
	uint32_t left = fill;

	ASSERT_OK(vring_dev_pop(&p->dev, out, 16, in, 16, c));
	for (unsigned i = 0; i < c->in_num && left; i++) {
		size_t n = MIN(left, in[i].iov_len);

		memset(in[i].iov_base, pattern, n);
		left -= (uint32_t)n;
	}
	ASSERT_EQ(left, 0);
	ASSERT_OK(vring_dev_push(&p->dev, c->head, fill));
}

TEST(roundtrip_n_buffers_with_cookies)
{
	struct pair p;
	struct vring_chain c;
	uint32_t len;
	void *ck;

	pair_init(&p, 16, 0);
	for (unsigned i = 0; i < 8; i++) {
		struct vring_drv_buf b[2] = {
			{ GPA0 + BUFS + i * 0x1000, 44, false },
			{ GPA0 + BUFS + i * 0x1000 + 0x100, 0x800, true },
		};

		ASSERT_OK(vring_drv_add(p.drv, b, 2, COOKIE(i)));
	}
	ASSERT_TRUE(vring_drv_kick_prepare(p.drv));
	ASSERT_EQ(vring_dev_avail_count(&p.dev), 8);
	for (unsigned i = 0; i < 8; i++) {
		dev_serve_one(&p, (uint8_t)(0xa0 + i), 100 + i, &c);
		ASSERT_EQ(c.out_len, 44);
		ASSERT_EQ(c.in_len, 0x800);
	}
	ASSERT_TRUE(vring_dev_should_notify(&p.dev));
	for (unsigned i = 0; i < 8; i++) {
		uint8_t *data = hva(&p, GPA0 + BUFS + i * 0x1000 + 0x100);

		ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
		ASSERT_TRUE(ck == COOKIE(i));
		ASSERT_EQ(len, 100 + i);
		ASSERT_EQ(data[0], 0xa0 + i);
		ASSERT_EQ(data[len - 1], 0xa0 + i);
	}
	ASSERT_ERR(vring_drv_get_used(p.drv, &len, &ck), EAGAIN);
	ASSERT_EQ(vring_drv_num_free(p.drv), 16);
	pair_fini(&p);
}

TEST(indirect_roundtrip)
{
	struct pair p;
	struct vring_chain c;
	struct vring_drv_buf b[5];
	uint32_t len;
	void *ck;

	pair_init(&p, 4, F_IND);
	for (unsigned i = 0; i < 5; i++)
		b[i] = (struct vring_drv_buf){ GPA0 + BUFS + i * 0x100, 0x40, i >= 2 };
	/* A chain longer than the ring is refused even indirectly (the device would too). */
	ASSERT_ERR(vring_drv_add_indirect(p.drv, b, 5, hva(&p, GPA0 + 0x8000), GPA0 + 0x8000,
					  COOKIE(7)), EINVAL);
	/* Three elements and another chain of 3 in a 4-entry ring: only through a table. */
	ASSERT_OK(vring_drv_add(p.drv, b, 3, COOKIE(6)));
	ASSERT_ERR(vring_drv_add(p.drv, b + 1, 3, COOKIE(7)), ENOSPC);
	ASSERT_OK(vring_drv_add_indirect(p.drv, b + 1, 4, hva(&p, GPA0 + 0x8000), GPA0 + 0x8000,
					 COOKIE(7)));
	ASSERT_EQ(vring_drv_num_free(p.drv), 0);
	vring_drv_publish(p.drv);
	dev_serve_one(&p, 0x11, 0x40, &c);
	ASSERT_EQ(c.out_num, 2);
	ASSERT_EQ(c.in_num, 1);
	dev_serve_one(&p, 0x22, 0xc0, &c);
	ASSERT_EQ(c.out_num, 1);
	ASSERT_EQ(c.in_num, 3);
	ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
	ASSERT_TRUE(ck == COOKIE(6));
	ASSERT_EQ(vring_drv_num_free(p.drv), 3);
	ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
	ASSERT_EQ(len, 0xc0);
	ASSERT_TRUE(ck == COOKIE(7));
	ASSERT_EQ(vring_drv_num_free(p.drv), 4);
	pair_fini(&p);
}

/*
 * A ring of 8 with one 64-byte buffer in flight (id 0); the device then writes used element 0 as
 * (id, len) and the used index idx: get_used fails with -EIO and the ring stays broken.
 */
static void bad_used(uint32_t id, uint32_t len, uint16_t idx)
{
	struct pair p;
	struct vring_drv_buf b = { GPA0 + BUFS, 64, true };
	uint32_t got;
	void *ck;

	pair_init(&p, 8, 0);
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, COOKIE(0)));
	used(&p)->ring[0].id = htole32(id);
	used(&p)->ring[0].len = htole32(len);
	used(&p)->idx = htole16(idx);
	ASSERT_ERR(vring_drv_get_used(p.drv, &got, &ck), EIO);
	ASSERT_TRUE(vring_drv_broken(p.drv));
	ASSERT_ERR(vring_drv_add(p.drv, &b, 1, COOKIE(0)), EIO);
	pair_fini(&p);
}

TEST(bad_device_used_id)
{
	bad_used(3, 0, 1); /* not in flight */
}

TEST(bad_device_used_len_and_idx)
{
	bad_used(0, 65, 1); /* more than the buffer */
	bad_used(0, 0, 2);  /* two used, one in flight */
}

TEST(kick_without_event_idx_honours_no_notify)
{
	struct pair p;
	struct vring_drv_buf b = { GPA0 + BUFS, 64, false };

	pair_init(&p, 8, 0);
	ASSERT_FALSE(vring_drv_kick_prepare(p.drv)); /* nothing added */
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, COOKIE(0)));
	ASSERT_TRUE(vring_drv_kick_prepare(p.drv));
	vring_dev_disable_notify(&p.dev);
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, COOKIE(0)));
	ASSERT_FALSE(vring_drv_kick_prepare(p.drv));
	ASSERT_TRUE(vring_dev_enable_notify(&p.dev)); /* the re-check sees both */
	pair_fini(&p);
}

TEST(interrupt_suppression_and_enable_race)
{
	for (int evt = 0; evt < 2; evt++) {
		struct pair p;
		struct vring_drv_buf b = { GPA0 + BUFS, 64, true };
		struct vring_chain c;
		uint32_t len;
		void *ck;

		pair_init(&p, 8, evt ? F_EVT : 0);
		for (int i = 0; i < 3; i++)
			ASSERT_OK(vring_drv_add(p.drv, &b, 1, COOKIE(i)));
		vring_drv_publish(p.drv);
		dev_serve_one(&p, 1, 1, &c);
		ASSERT_TRUE(vring_dev_should_notify(&p.dev));
		ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
		/* The driver polls with interrupts off; the device returns a buffer meanwhile. */
		vring_drv_disable_cb(p.drv);
		dev_serve_one(&p, 1, 1, &c);
		if (!evt)
			ASSERT_FALSE(vring_dev_should_notify(&p.dev));
		/* Re-enabling catches it (no interrupt need come for it). */
		ASSERT_TRUE(vring_drv_enable_cb(p.drv));
		ASSERT_TRUE(vring_drv_more_used(p.drv));
		ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
		ASSERT_FALSE(vring_drv_enable_cb(p.drv));
		/* Enabled and idle: the next used buffer interrupts. */
		dev_serve_one(&p, 1, 1, &c);
		ASSERT_TRUE(vring_dev_should_notify(&p.dev));
		pair_fini(&p);
	}
}

/*
 * Single-threaded model of both sides with sleeping: the device sleeps when its enable-notify
 * re-check finds nothing, the driver sleeps the same way on the used ring. Each side wakes only
 * on a kick / interrupt decided by the other. Asserts that no side ever sleeps with work pending
 * (which would be a lost notification) over `ops` buffers, crossing u16 wraparound.
 */
static void run_model(unsigned num, uint64_t features, unsigned ops, unsigned batch)
{
	struct pair p;
	bool dev_sleeping = false, drv_sleeping = false;
	unsigned added = 0, done = 0, kicks = 0, irqs = 0;
	uint32_t len;
	void *ck;

	pair_init(&p, num, features);
	while (done < ops) {
		/* Driver: add up to `batch` buffers, then a kick decision. */
		unsigned n = 0;

		while (n < batch && added < ops && vring_drv_num_free(p.drv) > 0) {
			struct vring_drv_buf b = { GPA0 + BUFS + (added % num) * 64, 64, true };

			ASSERT_OK(vring_drv_add(p.drv, &b, 1, COOKIE(added)));
			added++;
			n++;
		}
		if (vring_drv_kick_prepare(p.drv)) {
			kicks++;
			dev_sleeping = false;
		}
		/* Device: if awake, drain with kicks off, then re-enable and maybe sleep. */
		if (!dev_sleeping) {
			struct iovec in[2];
			struct vring_chain c;
			bool pushed = false;

			vring_dev_disable_notify(&p.dev);
			for (;;) {
				int r = vring_dev_pop(&p.dev, NULL, 0, in, 2, &c);

				if (r == -EAGAIN) {
					if (vring_dev_enable_notify(&p.dev))
						continue;
					break;
				}
				ASSERT_OK(r);
				ASSERT_OK(vring_dev_fill(&p.dev, c.head, (uint32_t)(c.head + 1)));
				pushed = true;
			}
			vring_dev_flush(&p.dev);
			if (pushed && vring_dev_should_notify(&p.dev)) {
				irqs++;
				drv_sleeping = false;
			}
			dev_sleeping = true;
		}
		ASSERT_TRUE(vring_dev_empty(&p.dev)); /* a sleeping device has nothing pending */
		/* Driver: if awake, collect with interrupts off, then re-enable and maybe sleep. */
		if (!drv_sleeping) {
			vring_drv_disable_cb(p.drv);
			for (;;) {
				int r = vring_drv_get_used(p.drv, &len, &ck);

				if (r == -EAGAIN) {
					if (vring_drv_enable_cb(p.drv))
						continue;
					break;
				}
				ASSERT_OK(r);
				ASSERT_TRUE(ck == COOKIE(done));
				done++;
			}
			drv_sleeping = true;
		}
		ASSERT_FALSE(vring_drv_more_used(p.drv));
	}
	ASSERT_EQ(done, ops);
	ASSERT_EQ(vring_drv_num_free(p.drv), num);
	ASSERT_EQ(le16toh(used(&p)->idx), (uint16_t)ops);
	ASSERT_EQ(vring_dev_error(&p.dev), VRING_ERR_NONE);
	test_note("num %u features %#llx: %u ops, %u kicks, %u interrupts", num,
		  (unsigned long long)features, ops, kicks, irqs);
	ASSERT_GT(kicks, 0);
	ASSERT_LE(kicks, ops);
	pair_fini(&p);
}

TEST(model_70000_ops_event_idx)
{
	run_model(16, F_EVT, 70000, 5);
}

TEST(model_70000_ops_no_event_idx)
{
	run_model(16, 0, 70000, 3);
}

TEST(model_70000_ops_event_idx_ring_of_one)
{
	run_model(1, F_EVT, 70000, 1);
}

/* Two threads: driver and device spin (with sched_yield) over the same ring, checking data. */
struct thr {
	struct pair *p;
	unsigned ops;
	int err;
	uint64_t deadline_ms; /* mono_ms() */
};

static bool past(uint64_t deadline_ms)
{
	return mono_ms() > deadline_ms;
}

static void *dev_thread(void *arg)
{
	struct thr *t = arg;
	unsigned served = 0;

	while (served < t->ops) {
		struct iovec out[2], in[2];
		struct vring_chain c;
		int r = vring_dev_pop(&t->p->dev, out, 2, in, 2, &c);

		if (r == -EAGAIN) {
			if (past(t->deadline_ms)) {
				t->err = -ETIMEDOUT;
				return NULL;
			}
			sched_yield();
			continue;
		}
		if (r < 0 || c.out_num != 1 || c.in_num != 1 || out[0].iov_len != 4 ||
		    in[0].iov_len != 4) {
			t->err = r < 0 ? r : -EPROTO;
			return NULL;
		}
		/* Echo the driver's sequence number, plus one. */
		uint32_t v;

		memcpy(&v, out[0].iov_base, 4);
		v++;
		memcpy(in[0].iov_base, &v, 4);
		r = vring_dev_push(&t->p->dev, c.head, 4);
		if (r < 0) {
			t->err = r;
			return NULL;
		}
		served++;
	}
	return NULL;
}

TEST(two_threads_wraparound)
{
	struct pair p;
	struct thr t = { .p = &p, .ops = 70000 };
	pthread_t th;
	unsigned added = 0, done = 0;

	pair_init(&p, 64, F_EVT);
	t.deadline_ms = mono_ms() + 40 * 1000;
	ASSERT_EQ(pthread_create(&th, NULL, dev_thread, &t), 0);
	while (done < t.ops && !past(t.deadline_ms)) {
		uint32_t len;
		void *ck;

		while (added < t.ops && vring_drv_num_free(p.drv) >= 2) {
			uint64_t slot = GPA0 + BUFS + (added % 64) * 16;
			struct vring_drv_buf b[2] = { { slot, 4, false }, { slot + 8, 4, true } };
			uint32_t v = added;

			memcpy(hva(&p, slot), &v, 4);
			ASSERT_OK(vring_drv_add(p.drv, b, 2, COOKIE(added)));
			added++;
		}
		vring_drv_publish(p.drv);
		if (vring_drv_get_used(p.drv, &len, &ck) == 0) {
			uint32_t v;

			ASSERT_TRUE(ck == COOKIE(done));
			ASSERT_EQ(len, 4);
			memcpy(&v, hva(&p, GPA0 + BUFS + (done % 64) * 16 + 8), 4);
			ASSERT_EQ(v, done + 1);
			done++;
		} else {
			sched_yield();
		}
	}
	ASSERT_EQ(pthread_join(th, NULL), 0);
	ASSERT_OK(t.err);
	ASSERT_EQ(done, t.ops);
	ASSERT_FALSE(vring_drv_broken(p.drv));
	pair_fini(&p);
}

TEST_MAIN()
