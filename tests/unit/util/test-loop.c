/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for src/util/loop.c: fd watches (level-triggered, modify, delete from inside a
 * callback), timers (order, re-arm, disarm, free from own callback), async wakeups from another
 * thread (coalescing, visibility of the sender's writes), loop_stop, and embedding the loop in
 * an outer poll() loop (loop_fd, loop_next_timeout_ms).
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "test.h"
#include "util/loop.h"

struct fd_ctx {
	int hits;
	struct loop_watch *self;
	struct loop_watch *other;
	bool del_self, del_other;
};

static void fd_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct fd_ctx *c = opaque;
	char b[16];

	(void)l;
	(void)events;
	c->hits++;
	(void)!read(fd, b, sizeof(b));
	if (c->del_self) {
		loop_watch_del(c->self);
		c->self = NULL;
	}
	if (c->del_other && c->other) {
		loop_watch_del(c->other);
		c->other = NULL;
	}
}

TEST(watch_fires_and_modifies)
{
	struct loop *l;
	int p[2];
	struct fd_ctx c = { 0 };

	ASSERT_OK(loop_new(&l));
	ASSERT_OK(pipe(p));
	ASSERT_OK(loop_watch_add(l, p[0], EPOLLIN, fd_cb, &c, &c.self));
	ASSERT_EQ(loop_run_once(l, 0), 0);
	ASSERT_EQ(write(p[1], "x", 1), 1);
	ASSERT_EQ(loop_run_once(l, 1000), 1);
	ASSERT_EQ(c.hits, 1);
	/* Masked: data present but no callback. */
	ASSERT_OK(loop_watch_mod(c.self, 0));
	ASSERT_EQ(loop_watch_events(c.self), 0);
	ASSERT_EQ(write(p[1], "y", 1), 1);
	ASSERT_EQ(loop_run_once(l, 0), 0);
	ASSERT_OK(loop_watch_mod(c.self, EPOLLIN));
	ASSERT_EQ(loop_run_once(l, 1000), 1);
	ASSERT_EQ(c.hits, 2);
	ASSERT_ERR(loop_watch_add(l, p[0], EPOLLIN, fd_cb, &c, &c.other), EEXIST);
	loop_watch_del(c.self);
	loop_free(l);
	close(p[0]);
	close(p[1]);
}

TEST(delete_other_watch_during_dispatch)
{
	struct loop *l;
	int a[2], b[2];
	struct fd_ctx ca = { 0 }, cb = { 0 };

	ASSERT_OK(loop_new(&l));
	ASSERT_OK(pipe(a));
	ASSERT_OK(pipe(b));
	ASSERT_OK(loop_watch_add(l, a[0], EPOLLIN, fd_cb, &ca, &ca.self));
	ASSERT_OK(loop_watch_add(l, b[0], EPOLLIN, fd_cb, &cb, &cb.self));
	/* Whichever runs first deletes the other; the other's already-fetched event is dropped. */
	ca.other = cb.self;
	ca.del_other = true;
	cb.other = ca.self;
	cb.del_other = true;
	ASSERT_EQ(write(a[1], "x", 1), 1);
	ASSERT_EQ(write(b[1], "x", 1), 1);
	ASSERT_EQ(loop_run_once(l, 1000), 1);
	ASSERT_EQ(ca.hits + cb.hits, 1);
	if (ca.hits)
		loop_watch_del(ca.self);
	else
		loop_watch_del(cb.self);
	loop_free(l);
	close(a[0]);
	close(a[1]);
	close(b[0]);
	close(b[1]);
}

TEST(delete_self_during_dispatch)
{
	struct loop *l;
	int p[2];
	struct fd_ctx c = { .del_self = true };

	ASSERT_OK(loop_new(&l));
	ASSERT_OK(pipe(p));
	ASSERT_OK(loop_watch_add(l, p[0], EPOLLIN, fd_cb, &c, &c.self));
	ASSERT_EQ(write(p[1], "xx", 2), 2);
	ASSERT_EQ(loop_run_once(l, 1000), 1);
	ASSERT_EQ(write(p[1], "x", 1), 1);
	ASSERT_EQ(loop_run_once(l, 0), 0);
	ASSERT_EQ(c.hits, 1);
	loop_free(l);
	close(p[0]);
	close(p[1]);
}

struct timer_log {
	int order[8];
	int n;
	struct loop_timer *t[8];
	int free_self_idx;
};

static void timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct timer_log *log = opaque;

	(void)l;
	for (int i = 0; i < 8; i++)
		if (log->t[i] == t) {
			log->order[log->n++] = i;
			if (i == log->free_self_idx) {
				loop_timer_free(t);
				log->t[i] = NULL;
			}
		}
}

TEST(timers_fire_in_deadline_order)
{
	struct loop *l;
	struct timer_log log = { .free_self_idx = 2 };
	uint64_t now;
	/* Deadlines in ms from now, deliberately unsorted; timer 4 is disarmed, 1 re-armed. */
	const int ms[6] = { 30, 5, 1, 20, 10, 15 };

	ASSERT_OK(loop_new(&l));
	now = loop_now_ns();
	for (int i = 0; i < 6; i++) {
		ASSERT_OK(loop_timer_new(l, timer_cb, &log, &log.t[i]));
		loop_timer_arm(log.t[i], now + (uint64_t)ms[i] * 1000000);
	}
	loop_timer_disarm(log.t[4]);
	ASSERT_FALSE(loop_timer_armed(log.t[4]));
	loop_timer_arm(log.t[1], now + 25 * 1000000ull);
	while (log.n < 5) {
		uint64_t deadline = now + 5000000000ull;

		ASSERT_OK(loop_run_once(l, 1000));
		ASSERT_LT(loop_now_ns(), deadline);
	}
	ASSERT_EQ(log.order[0], 2);
	ASSERT_EQ(log.order[1], 5);
	ASSERT_EQ(log.order[2], 3);
	ASSERT_EQ(log.order[3], 1);
	ASSERT_EQ(log.order[4], 0);
	ASSERT_GE(loop_now_ns(), now + 30 * 1000000ull);
	ASSERT_TRUE(log.t[2] == NULL);
	for (int i = 0; i < 6; i++)
		loop_timer_free(log.t[i]);
	loop_free(l);
}

TEST(many_timers_heap)
{
	struct loop *l;
	struct loop_timer *t[300];
	struct timer_log log = { .free_self_idx = -1 };

	ASSERT_OK(loop_new(&l));
	for (int i = 0; i < 300; i++) {
		ASSERT_OK(loop_timer_new(l, timer_cb, &log, &t[i]));
		loop_timer_arm(t[i], UINT64_MAX - (uint64_t)((i * 7919) % 300));
	}
	for (int i = 0; i < 300; i += 2)
		loop_timer_free(t[i]);
	for (int i = 1; i < 300; i += 2) {
		ASSERT_TRUE(loop_timer_armed(t[i]));
		loop_timer_free(t[i]);
	}
	ASSERT_EQ(loop_run_once(l, 0), 0);
	loop_free(l);
}

struct async_ctx {
	struct loop_async *a;
	atomic_int produced; /* relaxed: stored before each send, whose wakeup orders it */
	int seen;
	int calls;
	struct loop *l;
};

static void async_cb(struct loop *l, void *opaque)
{
	struct async_ctx *c = opaque;

	(void)l;
	c->calls++;
	c->seen = atomic_load_explicit(&c->produced, memory_order_relaxed);
	if (c->seen == 1000)
		loop_stop(c->l);
}

static void *async_thread(void *arg)
{
	struct async_ctx *c = arg;

	for (int i = 1; i <= 1000; i++) {
		atomic_store_explicit(&c->produced, i, memory_order_relaxed);
		loop_async_send(c->a);
	}
	return NULL;
}

TEST(async_from_other_thread_coalesces)
{
	struct async_ctx c = { 0 };
	pthread_t th;

	ASSERT_OK(loop_new(&c.l));
	ASSERT_OK(loop_async_new(c.l, async_cb, &c, &c.a));
	ASSERT_EQ(pthread_create(&th, NULL, async_thread, &c), 0);
	ASSERT_OK(loop_run(c.l));
	pthread_join(th, NULL);
	ASSERT_EQ(c.seen, 1000);
	ASSERT_GE(c.calls, 1);
	ASSERT_LE(c.calls, 1000);
	loop_async_free(c.a);
	loop_free(c.l);
}

TEST(stop_before_run_is_kept)
{
	struct loop *l;

	ASSERT_OK(loop_new(&l));
	loop_stop(l);
	ASSERT_OK(loop_run(l));
	loop_free(l);
}

static void count_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	(void)l;
	(void)t;
	(*(int *)opaque)++;
}

/* Embedding in an outer poll() loop: loop_fd readiness, loop_next_timeout_ms, run_once(l, 0). */
TEST(embedded_in_a_poll_loop)
{
	struct fd_ctx c = { 0 };
	struct loop_timer *t;
	struct loop *l;
	struct pollfd pf;
	int p[2], fired = 0, ms;

	ASSERT_OK(loop_new(&l));
	ASSERT_OK(pipe(p));
	ASSERT_OK(loop_watch_add(l, p[0], EPOLLIN, fd_cb, &c, &c.self));
	ASSERT_OK(loop_timer_new(l, count_timer_cb, &fired, &t));
	pf = (struct pollfd){ .fd = loop_fd(l), .events = POLLIN };
	/* Nothing pending: the fd is not readable, no timer. */
	ASSERT_EQ(poll(&pf, 1, 0), 0);
	ASSERT_EQ(loop_next_timeout_ms(l), -1);
	/* A watched fd becomes readable: so does the loop's fd, until the event is handled. */
	ASSERT_EQ(write(p[1], "x", 1), 1);
	ASSERT_EQ(poll(&pf, 1, 1000), 1);
	ASSERT_TRUE(pf.revents & POLLIN);
	ASSERT_EQ(loop_run_once(l, 0), 1);
	ASSERT_EQ(c.hits, 1);
	ASSERT_EQ(poll(&pf, 1, 0), 0);
	/* A timer 50 ms away: the timeout is rounded up, never early; due timers give 0. */
	loop_timer_arm(t, loop_now_ns() + 50 * 1000000ull);
	ms = loop_next_timeout_ms(l);
	ASSERT_GT(ms, 40);
	ASSERT_LE(ms, 50);
	ASSERT_EQ(loop_run_once(l, 0), 0); /* not due yet: run_once(0) does not wait for it */
	ASSERT_EQ(fired, 0);
	ASSERT_EQ(poll(&pf, 1, loop_next_timeout_ms(l)), 0);
	ASSERT_EQ(loop_next_timeout_ms(l), 0);
	ASSERT_EQ(loop_run_once(l, 0), 1);
	ASSERT_EQ(fired, 1);
	ASSERT_EQ(loop_next_timeout_ms(l), -1);
	loop_timer_arm(t, 0); /* already due */
	ASSERT_EQ(loop_next_timeout_ms(l), 0);
	loop_timer_free(t);
	ASSERT_EQ(loop_next_timeout_ms(l), -1);
	loop_watch_del(c.self);
	loop_free(l);
	close(p[0]);
	close(p[1]);
}

TEST_MAIN()
