/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the busy polling of src/util/loop.c (loop_set_busy_poll): no spin when off, or
 * after an idle iteration, or in a non-blocking iteration; a spin with no work ends after its
 * bound and the loop then sleeps (seen in the counters, not timed); a spin ends as soon as work
 * arrives from another thread or a timer falls due; the caller's timeout still bounds the call.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "test.h"
#include "util/loop.h"
#include "util/time.h"

#define LONG_SPIN_US 30000000u /* 30 s: only work, a timer or the timeout ends such a spin */

static void count_cb(struct loop *l, void *opaque)
{
	(void)l;
	atomic_fetch_add((atomic_int *)opaque, 1);
}

static void timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	(void)l;
	(void)t;
	atomic_fetch_add((atomic_int *)opaque, 1);
}

/* A loop with one async whose callbacks are counted in *hits; the last iteration did work. */
static struct loop *busy_loop(unsigned us, struct loop_async **a, atomic_int *hits)
{
	struct loop *l;

	ASSERT_OK(loop_new(&l));
	ASSERT_OK(loop_async_new(l, count_cb, hits, a));
	loop_set_busy_poll(l, us);
	loop_async_send(*a);
	ASSERT_EQ(loop_run_once(l, 1000), 1);
	return l;
}

static void loop_done(struct loop *l, struct loop_async *a)
{
	loop_async_free(a);
	loop_free(l);
}

/* One iteration with nothing to do, after one that worked; returns the counters. */
static struct loop_stats idle_once(unsigned us, int timeout_ms)
{
	struct loop_async *a;
	struct loop_stats st;
	atomic_int hits = 0;
	struct loop *l = busy_loop(us, &a, &hits);

	ASSERT_EQ(loop_run_once(l, timeout_ms), 0);
	loop_get_stats(l, &st);
	loop_done(l, a);
	return st;
}

TEST(off_never_spins)
{
	struct loop_stats st = idle_once(0, 5);

	ASSERT_EQ_U64(st.spins, 0);
	ASSERT_EQ_U64(st.spin_ns, 0);
	ASSERT_EQ_U64(st.sleeps, 2);
}

TEST(idle_spin_is_bounded_then_sleeps)
{
	struct loop_async *a;
	struct loop_stats st;
	atomic_int hits = 0;
	struct loop *l = busy_loop(2000, &a, &hits);

	/* Nothing comes: 2 ms of spinning, then a sleep for the rest of the 200 ms. */
	ASSERT_EQ(loop_run_once(l, 200), 0);
	loop_get_stats(l, &st);
	ASSERT_EQ_U64(st.spins, 1);
	ASSERT_EQ_U64(st.spin_found, 0);
	ASSERT_GE(st.spin_ns, 2000u * 1000u);
	ASSERT_EQ_U64(st.sleeps, 2);
	/* That iteration ran nothing: the next one sleeps at once. */
	ASSERT_EQ(loop_run_once(l, 5), 0);
	loop_get_stats(l, &st);
	ASSERT_EQ_U64(st.spins, 1);
	ASSERT_EQ_U64(st.sleeps, 3);
	loop_done(l, a);
}

struct sender {
	struct loop *l;
	struct loop_async *a;
};

/* Waits until the loop spins, then hands it work. */
static void *send_when_spinning(void *arg)
{
	struct sender *s = arg;
	struct loop_stats st;

	do {
		test_sleep_ms(1);
		loop_get_stats(s->l, &st);
	} while (st.spins == 0);
	loop_async_send(s->a);
	return NULL;
}

TEST(spin_ends_when_work_arrives)
{
	struct loop_async *a;
	struct loop_stats st;
	atomic_int hits = 0;
	struct loop *l = busy_loop(LONG_SPIN_US, &a, &hits);
	struct sender s = { l, a };
	pthread_t th;

	ASSERT_OK(-pthread_create(&th, NULL, send_when_spinning, &s));
	ASSERT_EQ(loop_run_once(l, -1), 1);
	pthread_join(th, NULL);
	ASSERT_EQ(atomic_load(&hits), 2);
	loop_get_stats(l, &st);
	ASSERT_EQ_U64(st.spins, 1);
	ASSERT_EQ_U64(st.spin_found, 1);
	ASSERT_GT(st.spin_ns, 0);
	/* Found while spinning: no sleep after the first iteration's. */
	ASSERT_EQ_U64(st.sleeps, 1);
	loop_done(l, a);
}

TEST(spin_honours_timers)
{
	struct loop_async *a;
	struct loop_timer *t;
	struct loop_stats st;
	atomic_int hits = 0, fired = 0;
	struct loop *l = busy_loop(LONG_SPIN_US, &a, &hits);

	ASSERT_OK(loop_timer_new(l, timer_cb, &fired, &t));
	loop_timer_arm(t, loop_now_ns() + 3 * NS_PER_MS);
	ASSERT_EQ(loop_run_once(l, -1), 1);
	ASSERT_EQ(atomic_load(&fired), 1);
	loop_get_stats(l, &st);
	ASSERT_EQ_U64(st.spins, 1);
	ASSERT_EQ_U64(st.spin_found, 1);
	ASSERT_EQ_U64(st.sleeps, 1);
	loop_timer_free(t);
	loop_done(l, a);
}

TEST(timeout_bounds_the_spin)
{
	struct loop_stats st = idle_once(LONG_SPIN_US, 20);

	ASSERT_EQ_U64(st.spins, 1);
	ASSERT_EQ_U64(st.spin_found, 0);
	ASSERT_GE(st.spin_ns, 20u * NS_PER_MS);
}

TEST(nonblocking_iteration_never_spins)
{
	struct loop_stats st = idle_once(LONG_SPIN_US, 0);

	ASSERT_EQ_U64(st.spins, 0);
	ASSERT_EQ_U64(st.sleeps, 1);
}

TEST_MAIN()
