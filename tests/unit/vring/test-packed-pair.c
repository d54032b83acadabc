/* SPDX-License-Identifier: MIT */
/*
 * Packed virtqueue, driver side against device side over one shared memory: buffers of 1..3
 * descriptors completed out of order across many laps on ring sizes from 1 to 32768 (powers of
 * two or not), indirect tables, kick and interrupt suppression with and without EVENT_IDX (a side
 * that sleeps after its re-enable re-check is always woken), a device returning bad used
 * descriptors, and a two-thread run that exercises the barriers.
 */
#include "test.h"
#include "util/time.h"
#include "vring/vring_drv.h"

#include <endian.h>
#include <pthread.h>
#include <sched.h>

#define GPA0 0x400000ull
#define RINGSZ 0x81000ull /* room for the largest ring and its event areas, page-rounded */
#define BUFSZ 0x10000ull
#define MEMSZ (RINGSZ + BUFSZ)

static const uint64_t F_PK = 1ull << VRING_FEAT_RING_PACKED;
static const uint64_t F_IND = 1ull << VRING_FEAT_INDIRECT_DESC;
static const uint64_t F_EVT = 1ull << VRING_FEAT_EVENT_IDX;

struct pp {
	uint8_t *mem;
	struct guest_mem *gm;
	struct vring_layout lay;
	struct vring_drv *drv;
	struct vring_dev_queue *dev;
	unsigned num;
};

static void pp_init(struct pp *p, unsigned num, uint64_t features)
{
	struct guest_mem_region_desc rd = { .guest_phys_addr = GPA0, .memory_size = MEMSZ };
	void *hb[1];

	memset(p, 0, sizeof(*p));
	p->num = num;
	p->mem = aligned_alloc(4096, MEMSZ);
	p->dev = calloc(1, sizeof(*p->dev));
	ASSERT_TRUE(p->mem && p->dev);
	memset(p->mem, 0xa5, MEMSZ); /* the driver zeroes its ring itself */
	hb[0] = p->mem;
	ASSERT_OK(guest_mem_new_local(&rd, hb, 1, &p->gm));
	ASSERT_OK(vring_layout_packed(num, &p->lay));
	ASSERT_LE(p->lay.total, RINGSZ);
	ASSERT_OK(vring_drv_new(num, p->mem + p->lay.desc_off, p->mem + p->lay.avail_off,
				p->mem + p->lay.used_off, features | F_PK, &p->drv));
	struct vring_dev_config c = {
		.mem = p->gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = GPA0 + p->lay.desc_off, .avail_addr = GPA0 + p->lay.avail_off,
		.used_addr = GPA0 + p->lay.used_off, .features = features | F_PK,
		.last_avail_idx = 1u << VRING_PK_WRAP_BIT,
	};
	ASSERT_OK(vring_dev_init(p->dev, &c));
}

static void pp_fini(struct pp *p)
{
	vring_drv_free(p->drv);
	guest_mem_free(p->gm);
	free(p->mem);
	free(p->dev);
}

static uint64_t buf_gpa(unsigned i)
{
	return GPA0 + RINGSZ + (uint64_t)(i % 1024) * 64;
}

/* Cookies: one byte each of a static table, so that every in-flight buffer has its own. */
static uint8_t ck_tab[32768];
#define CK(i) ((void *)&ck_tab[(i) % 32768])

TEST(new_validation)
{
	uint8_t *m = aligned_alloc(64, 4096);
	struct vring_drv *d;

	ASSERT_TRUE(m);
	ASSERT_ERR(vring_drv_new(0, m, m + 1024, m + 1088, F_PK, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(32769, m, m + 1024, m + 1088, F_PK, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(3, m + 8, m + 1024, m + 1088, F_PK, &d), EINVAL);
	ASSERT_ERR(vring_drv_new(3, m, m + 1026, m + 1088, F_PK, &d), EINVAL);
	memset(m, 0xff, 4096);
	ASSERT_OK(vring_drv_new(3, m, m + 1024, m + 1088, F_PK, &d));
	for (int i = 0; i < 48; i++)
		ASSERT_EQ(m[i], 0);
	ASSERT_EQ(vring_drv_num_free(d), 3);
	ASSERT_FALSE(vring_drv_more_used(d));
	vring_drv_free(d);
	free(m);
}

TEST(add_errors)
{
	struct pp p;
	struct vring_drv_buf b[3] = { { buf_gpa(0), 8, true }, { buf_gpa(1), 8, false },
				      { buf_gpa(2), 8, false } };
	uint8_t table[64] __attribute__((aligned(16)));

	pp_init(&p, 2, 0);
	ASSERT_ERR(vring_drv_add(p.drv, b, 2, CK(0)), EINVAL); /* readable after writable */
	ASSERT_ERR(vring_drv_add(p.drv, b + 1, 2, NULL), EINVAL);
	ASSERT_ERR(vring_drv_add(p.drv, b + 1, 0, CK(0)), EINVAL);
	ASSERT_ERR(vring_drv_add(p.drv, b, 3, CK(0)), EINVAL);
	ASSERT_ERR(vring_drv_add_indirect(p.drv, b + 1, 2, table, 0, CK(0)), EINVAL); /* no F */
	ASSERT_OK(vring_drv_add(p.drv, b + 1, 2, CK(0)));
	ASSERT_ERR(vring_drv_add(p.drv, b + 1, 1, CK(1)), ENOSPC);
	pp_fini(&p);
}

/*
 * Runs `ops` buffers of 1..3 descriptors through a ring of num: the device pops what it can,
 * then completes them in a pseudo-random order with len = id-derived bytes; the driver checks
 * each cookie comes back once with its length.
 */
static void run_laps(unsigned num, uint64_t features, unsigned ops, uint64_t seed)
{
	struct pp p;
	unsigned added = 0, done = 0, laps = 0, slots = 0;
	uint8_t *seen = calloc(ops, 1);
	uint16_t *pend = calloc(num, sizeof(*pend));
	uint32_t *room = calloc(num, sizeof(*room)); /* writable bytes of each popped id */
	uint64_t rnd = seed;

	ASSERT_TRUE(seen && pend && room);
	pp_init(&p, num, features);
	while (done < ops) {
		unsigned npend = 0;

		for (;;) {
			unsigned n = 1 + (unsigned)(test_xorshift64(&rnd) % 3);
			struct vring_drv_buf b[3];

			if (added == ops || n > vring_drv_num_free(p.drv))
				break;
			for (unsigned k = 0; k < n; k++)
				b[k] = (struct vring_drv_buf){ buf_gpa(added + k), 32, k > 0 };
			ASSERT_OK(vring_drv_add(p.drv, b, n, CK(added)));
			added++;
			slots += n;
			laps += slots / num;
			slots %= num;
		}
		(void)vring_drv_kick_prepare(p.drv);
		for (;;) {
			struct iovec out[4], in[4];
			struct vring_chain c;
			int r = vring_dev_pop(p.dev, out, 4, in, 4, &c);

			if (r == -EAGAIN)
				break;
			ASSERT_OK(r);
			ASSERT_EQ(c.out_num, 1);
			ASSERT_EQ(c.in_len, 32 * c.in_num);
			ASSERT_LT(npend, num);
			room[c.head] = (uint32_t)c.in_len;
			pend[npend++] = c.head;
		}
		/* Out of order: swap a random pending entry to the front each time. */
		while (npend > 0) {
			unsigned k = (unsigned)(test_xorshift64(&rnd) % npend);
			uint16_t id = pend[k];

			pend[k] = pend[--npend];
			ASSERT_OK(vring_dev_fill(p.dev, id, (uint32_t)id % (room[id] + 1)));
			if (test_xorshift64(&rnd) % 4 == 0)
				vring_dev_flush(p.dev);
		}
		vring_dev_flush(p.dev);
		for (;;) {
			uint32_t len;
			void *ck;
			int r = vring_drv_get_used(p.drv, &len, &ck);
			size_t op;

			if (r == -EAGAIN)
				break;
			ASSERT_OK(r);
			op = (size_t)((uint8_t *)ck - ck_tab);
			/* Ops in flight at once never exceed num <= 32768, so op is unambiguous
			 * among them: find the oldest unseen op with this cookie slot. */
			while (op < ops && seen[op])
				op += 32768;
			ASSERT_LT(op, ops);
			ASSERT_LE(len, 64);
			seen[op] = 1;
			done++;
		}
		ASSERT_FALSE(vring_drv_broken(p.drv));
	}
	test_note("packed num %u features %#llx: %u buffers, %u laps of the ring", num,
		  (unsigned long long)features, done, laps);
	ASSERT_EQ(vring_drv_num_free(p.drv), num);
	ASSERT_EQ(vring_dev_inflight(p.dev), 0);
	ASSERT_EQ(vring_dev_error(p.dev), VRING_ERR_NONE);
	pp_fini(&p);
	free(seen);
	free(pend);
	free(room);
}

TEST(laps_on_many_sizes)
{
	static const unsigned sizes[] = { 1, 2, 3, 5, 7, 16, 100, 256, 1000, 4096, 32768 };

	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned n = sizes[i], ops = n * 5 > 3000 ? n * 5 : 3000;

		run_laps(n, F_EVT, ops, 0x9e3779b97f4a7c15ull + n);
		run_laps(n, 0, ops / 3, 0x1234567ull + n);
	}
}

TEST(indirect_roundtrip)
{
	struct pp p;
	struct vring_pk_desc_le *tab;
	uint64_t tgpa = GPA0 + RINGSZ + 0x8000;
	struct vring_drv_buf b[4] = { { buf_gpa(0), 16, false }, { buf_gpa(1), 24, false },
				      { buf_gpa(2), 40, true }, { buf_gpa(3), 8, true } };
	struct iovec out[4], in[4];
	struct vring_chain c;
	uint32_t len;
	void *ck;
	int id;

	pp_init(&p, 4, F_IND); /* a table may hold up to num entries */
	tab = (struct vring_pk_desc_le *)(p.mem + (tgpa - GPA0));
	for (int lap = 0; lap < 10; lap++) {
		id = vring_drv_add_indirect(p.drv, b, 4, tab, tgpa, CK(lap));
		ASSERT_OK(id);
		ASSERT_EQ(vring_drv_num_free(p.drv), 3); /* one ring slot */
		ASSERT_TRUE(vring_drv_kick_prepare(p.drv));
		ASSERT_OK(vring_dev_pop(p.dev, out, 4, in, 4, &c));
		ASSERT_EQ(c.head, id);
		ASSERT_EQ(c.out_len, 40);
		ASSERT_EQ(c.in_len, 48);
		ASSERT_EQ(c.in_num, 2);
		ASSERT_OK(vring_dev_push(p.dev, c.head, 48));
		ASSERT_OK(vring_drv_get_used(p.drv, &len, &ck));
		ASSERT_EQ(len, 48);
		ASSERT_TRUE(ck == CK(lap));
	}
	pp_fini(&p);
}

/* The device writes a used descriptor by hand at slot 0 with the first lap's flags. */
static void forge_used(uint16_t id, uint32_t len, bool in_flight_id0)
{
	struct pp p;
	struct vring_pk_desc_le *e;
	struct vring_drv_buf b = { buf_gpa(0), 16, true };
	uint32_t l;
	void *ck;

	pp_init(&p, 4, 0);
	if (in_flight_id0)
		ASSERT_OK(vring_drv_add(p.drv, &b, 1, CK(0)));
	e = (struct vring_pk_desc_le *)(p.mem + p.lay.desc_off);
	e->id = htole16(id);
	e->len = htole32(len);
	e->flags = htole16(VRING_PK_DESC_F_AVAIL | VRING_PK_DESC_F_USED);
	ASSERT_TRUE(vring_drv_more_used(p.drv));
	ASSERT_ERR(vring_drv_get_used(p.drv, &l, &ck), EIO);
	ASSERT_TRUE(vring_drv_broken(p.drv));
	ASSERT_ERR(vring_drv_add(p.drv, &b, 1, CK(1)), EIO);
	ASSERT_ERR(vring_drv_get_used(p.drv, &l, &ck), EIO);
	pp_fini(&p);
}

TEST(bad_used_descriptors_break_the_ring)
{
	forge_used(0, 0, false);  /* id not in flight */
	forge_used(7, 0, true);   /* id out of range */
	forge_used(1, 0, true);   /* another id than the one in flight */
	forge_used(0, 17, true);  /* longer than the writable 16 bytes */
}

/*
 * Both sides sleep when their re-enable re-check says nothing is pending and wake only on the
 * other's kick / interrupt decision: over `ops` buffers no side may sleep with work pending.
 */
static void sleepers(unsigned num, uint64_t features, unsigned ops)
{
	struct pp p;
	bool dev_awake = true, drv_awake = true;
	unsigned added = 0, done = 0, kicks = 0, irqs = 0;

	pp_init(&p, num, features);
	while (done < ops) {
		struct vring_drv_buf b = { buf_gpa(added), 8, true };
		unsigned burst = 1 + added % 4;

		while (burst-- > 0 && added < ops && vring_drv_num_free(p.drv) > 0)
			ASSERT_OK(vring_drv_add(p.drv, &b, 1, CK(added++)));
		if (vring_drv_kick_prepare(p.drv)) {
			kicks++;
			dev_awake = true;
		}
		while (dev_awake) {
			struct iovec in[1];
			struct vring_chain c;
			unsigned served = 0;

			vring_dev_disable_notify(p.dev);
			while (vring_dev_pop(p.dev, NULL, 0, in, 1, &c) == 0) {
				ASSERT_OK(vring_dev_fill(p.dev, c.head, 8));
				served++;
			}
			vring_dev_flush(p.dev);
			if (served && vring_dev_should_notify(p.dev)) {
				irqs++;
				drv_awake = true;
			}
			dev_awake = vring_dev_enable_notify(p.dev);
		}
		ASSERT_TRUE(vring_dev_empty(p.dev));
		while (drv_awake) {
			uint32_t len;
			void *ck;

			vring_drv_disable_cb(p.drv);
			while (vring_drv_get_used(p.drv, &len, &ck) == 0) {
				ASSERT_TRUE(ck == CK(done));
				done++;
			}
			drv_awake = vring_drv_enable_cb(p.drv);
		}
		ASSERT_FALSE(vring_drv_more_used(p.drv));
	}
	test_note("packed num %u features %#llx: %u ops, %u kicks, %u interrupts", num,
		  (unsigned long long)features, ops, kicks, irqs);
	ASSERT_GT(kicks, 0);
	ASSERT_GT(irqs, 0);
	pp_fini(&p);
}

TEST(suppression_never_loses_a_wakeup)
{
	sleepers(8, F_EVT, 20000);
	sleepers(8, 0, 20000);
	sleepers(3, F_EVT, 20000);
	sleepers(1, F_EVT, 5000);
}

TEST(kick_follows_device_area)
{
	struct pp p;
	struct vring_drv_buf b = { buf_gpa(0), 8, true };
	struct iovec in[1];
	struct vring_chain c;

	pp_init(&p, 4, F_EVT);
	ASSERT_FALSE(vring_drv_kick_prepare(p.drv)); /* nothing added */
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, CK(0)));
	ASSERT_TRUE(vring_drv_kick_prepare(p.drv)); /* device waits at slot 0 */
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, CK(1)));
	ASSERT_FALSE(vring_drv_kick_prepare(p.drv)); /* it has not consumed slot 0 yet */
	vring_dev_disable_notify(p.dev);
	ASSERT_OK(vring_drv_add(p.drv, &b, 1, CK(2)));
	ASSERT_FALSE(vring_drv_kick_prepare(p.drv));
	ASSERT_OK(vring_dev_pop(p.dev, NULL, 0, in, 1, &c));
	ASSERT_TRUE(vring_dev_enable_notify(p.dev)); /* two more are there already */
	pp_fini(&p);
}

struct thr {
	struct pp *p;
	unsigned ops;
	uint64_t deadline_ms;
	int err;
};

static void *device_loop(void *arg)
{
	struct thr *t = arg;

	for (unsigned n = 0; n < t->ops;) {
		struct iovec out[2], in[2];
		struct vring_chain c;
		uint32_t v;
		int r = vring_dev_pop(t->p->dev, out, 2, in, 2, &c);

		if (r == -EAGAIN && mono_ms() < t->deadline_ms) {
			sched_yield();
			continue;
		}
		if (r < 0 || c.out_num != 1 || c.in_num != 1) {
			t->err = r < 0 ? r : -EPROTO;
			return NULL;
		}
		memcpy(&v, out[0].iov_base, sizeof(v));
		v = ~v;
		memcpy(in[0].iov_base, &v, sizeof(v));
		r = vring_dev_push(t->p->dev, c.head, sizeof(v));
		if (r < 0) {
			t->err = r;
			return NULL;
		}
		n++;
	}
	return NULL;
}

TEST(two_threads_many_laps)
{
	struct pp p;
	struct thr t = { .p = &p, .ops = 60000 };
	unsigned sent = 0, got = 0;
	pthread_t th;

	pp_init(&p, 37, F_EVT);
	t.deadline_ms = mono_ms() + 40000;
	ASSERT_EQ(pthread_create(&th, NULL, device_loop, &t), 0);
	while (got < t.ops && mono_ms() < t.deadline_ms && t.err == 0) {
		uint32_t len, v;
		void *ck;

		while (sent < t.ops && vring_drv_num_free(p.drv) >= 2) {
			uint64_t g = buf_gpa(sent % 37 * 2);
			struct vring_drv_buf b[2] = { { g, 4, false }, { g + 8, 4, true } };

			v = sent;
			memcpy(p.mem + (g - GPA0), &v, sizeof(v));
			ASSERT_OK(vring_drv_add(p.drv, b, 2, CK(sent)));
			sent++;
		}
		vring_drv_publish(p.drv);
		if (vring_drv_get_used(p.drv, &len, &ck) != 0) {
			sched_yield();
			continue;
		}
		ASSERT_TRUE(ck == CK(got));
		ASSERT_EQ(len, 4);
		memcpy(&v, p.mem + (buf_gpa(got % 37 * 2) + 8 - GPA0), sizeof(v));
		ASSERT_EQ(v, ~got);
		got++;
	}
	ASSERT_EQ(pthread_join(th, NULL), 0);
	ASSERT_EQ(t.err, 0);
	ASSERT_EQ(got, t.ops);
	pp_fini(&p);
}

TEST_MAIN()
