/* SPDX-License-Identifier: MIT */
/*
 * Direct RX of the guest role (src/driver/driver.h vdrv_rx_wait; docs/performance.md "wake-ups
 * and busy polling") and the guest role's tune switches, against the device role in-process:
 * with the I/O thread kept off the RX ring (vdrv_test_io_rx), a blocked recv and a blocked
 * uvsock_poll get their data by draining the ring themselves; many threads ping-pong at once
 * with the I/O thread on; no-direct-rx is the old hand-over; no-pkt64k, no-rx-adaptive and
 * no-event-idx change what the driver posts and negotiates.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "guestside.h"
#include "lib/lib.h"
#include "driver/driver.h"
#include "util/tune.h"
#include "vhost_user/protocol.h"
#include "drvtest.h"
#include "test.h"

#define NCONN 4
#define ROUNDS 200

static struct uvsock_guest_stats gstats(struct uvsock_ctx *g)
{
	struct uvsock_guest_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	return st;
}

struct waiter {
	int fd;
	bool poll;     /* uvsock_poll, then a non-blocking recv; else a blocking recv */
	char buf[16];
	ssize_t got;
	short revents;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;

	if (w->poll) {
		struct pollfd p = { .fd = w->fd, .events = POLLIN };

		if (uvsock_poll(&p, 1, WAIT_MS) != 1)
			return NULL;
		w->revents = p.revents;
		w->got = uvsock_recv(w->fd, w->buf, sizeof(w->buf), MSG_DONTWAIT);
		return NULL;
	}
	w->got = uvsock_recv(w->fd, w->buf, sizeof(w->buf), 0);
	return NULL;
}

/* Starts w's waiter thread with the I/O thread off RX; returns once it sleeps on RX itself. */
static void waiter_start(struct conn *c, struct waiter *w, pthread_t *th)
{
	uint64_t sleeps;

	w->fd = c->gfd;
	vdrv_test_io_rx(lib_ctx_guest_vdrv(c->g), false);
	sleeps = gstats(c->g).rx_direct_sleeps;
	ASSERT_EQ(pthread_create(th, NULL, waiter_main, w), 0);
	ASSERT_WAIT_FOR(gstats(c->g).rx_direct_sleeps > sleeps, WAIT_MS);
}

/*
 * With the I/O thread off RX, a waiter (blocking recv or poll) sleeps on the RX interrupt
 * itself; the host's bytes reach it only through its own drain.
 */
static void waiter_drains_itself(bool poll)
{
	struct conn c;
	struct waiter w = { .poll = poll, .got = -1 };
	struct timeval tv = { .tv_sec = 0, .tv_usec = 20000 };
	uint64_t direct;
	pthread_t th;
	char b;

	conn_open(&c);
	direct = gstats(c.g).rx_direct;
	waiter_start(&c, &w, &th);
	hs_write_all(c.hfd, "ping", 4);
	pthread_join(th, NULL);
	ASSERT_EQ(w.got, 4);
	ASSERT_MEMEQ(w.buf, "ping", 4);
	if (poll)
		ASSERT_TRUE(w.revents & POLLIN);
	ASSERT_GT(gstats(c.g).rx_direct, direct);
	/* The reply still goes out (TX is the I/O thread's). */
	ASSERT_EQ(uvsock_send(c.gfd, "pong", 4, 0), 4);
	ASSERT_EQ(hs_read_full(c.hfd, &w.buf, 4, WAIT_MS), 4);
	ASSERT_MEMEQ(w.buf, "pong", 4);
	/* A waiter whose deadline passes with nothing sent times out as before. */
	ASSERT_EQ(uvsock_setsockopt(c.gfd, SOL_SOCKET, SO_RCVTIMEO_NEW, &tv, sizeof(tv)), 0);
	ASSERT_EQ(uvsock_recv(c.gfd, &b, 1, 0), -1);
	ASSERT_EQ(errno, EAGAIN);
	vdrv_test_io_rx(lib_ctx_guest_vdrv(c.g), true);
	conn_close(&c);
}

TEST(blocked_recv_drains_the_rx_ring_itself)
{
	waiter_drains_itself(false);
}

TEST(blocked_poll_drains_the_rx_ring_itself)
{
	waiter_drains_itself(true);
}

/* With the I/O thread off RX, a shutdown from another thread still wakes a direct waiter. */
TEST(shutdown_wakes_a_direct_waiter)
{
	struct conn c;
	struct waiter w = { .got = -1 };
	pthread_t th;

	conn_open(&c);
	waiter_start(&c, &w, &th);
	ASSERT_EQ(uvsock_shutdown(c.gfd, SHUT_RD), 0);
	pthread_join(th, NULL);
	ASSERT_EQ(w.got, 0);
	vdrv_test_io_rx(lib_ctx_guest_vdrv(c.g), true);
	conn_close(&c);
}

struct pinger {
	int gfd, hfd;
	unsigned id;
	bool ok;
};

/* Host side: echoes every 8-byte message back. */
static void *echo_main(void *arg)
{
	struct pinger *p = arg;
	char b[8];

	for (unsigned i = 0; i < ROUNDS; i++) {
		if (hs_read_full(p->hfd, b, sizeof(b), WAIT_MS) != sizeof(b))
			return NULL;
		hs_write_all(p->hfd, b, sizeof(b));
	}
	return NULL;
}

/* Guest side: ROUNDS round trips of 8 bytes naming the connection and the round. */
static void *ping_main(void *arg)
{
	struct pinger *p = arg;

	for (unsigned i = 0; i < ROUNDS; i++) {
		char out[8], in[8];

		snprintf(out, sizeof(out), "%01u:%05u", p->id, i);
		if (uvsock_send(p->gfd, out, sizeof(out), 0) != sizeof(out))
			return NULL;
		if (uvsock_recv(p->gfd, in, sizeof(in), MSG_WAITALL) != sizeof(in) ||
		    memcmp(in, out, sizeof(in)) != 0)
			return NULL;
	}
	p->ok = true;
	return NULL;
}

/* Several application threads wait at once: one drains for all, the others are woken by it or
 * by the I/O thread; every byte arrives in order on its own connection. */
TEST(many_threads_ping_pong)
{
	struct tdev t;
	struct uvsock_ctx *g;
	struct pinger p[NCONN];
	pthread_t tg[NCONN], th[NCONN];
	int ls;

	tdev_start(&t, 3);
	g = g_guest_new(t.sock, NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	for (unsigned i = 0; i < NCONN; i++) {
		p[i] = (struct pinger){ .id = i };
		p[i].gfd = g_accept_host(ls, t.uds, SOCK_STREAM, 6000, &p[i].hfd);
		g_set_timeouts(p[i].gfd, WAIT_MS);
	}
	for (unsigned i = 0; i < NCONN; i++) {
		ASSERT_EQ(pthread_create(&th[i], NULL, echo_main, &p[i]), 0);
		ASSERT_EQ(pthread_create(&tg[i], NULL, ping_main, &p[i]), 0);
	}
	for (unsigned i = 0; i < NCONN; i++) {
		pthread_join(tg[i], NULL);
		pthread_join(th[i], NULL);
		ASSERT_TRUE(p[i].ok);
		uvsock_close(p[i].gfd);
		close(p[i].hfd);
	}
	test_note("rx_direct %" PRIu64 " direct sleeps %" PRIu64 " wakeups %" PRIu64,
		  gstats(g).rx_direct, gstats(g).rx_direct_sleeps, gstats(g).wakeups);
	uvsock_close(ls);
	uvsock_ctx_free(g);
	tdev_stop(&t);
}

/*
 * One connection under the switches `tune` (set while no data path runs): a round trip, then
 * 1 MiB host -> guest. Returns the guest's counters at the end.
 */
static uint64_t g_features;

static struct uvsock_guest_stats run_with(const char *tune)
{
	struct conn c;
	struct uvsock_guest_stats st;
	struct host_io hw;
	pthread_t th;
	char err[160], b[4];

	ASSERT_EQ(tune_set(tune, err, sizeof(err)), 0);
	conn_open(&c);
	g_features = vdrv_features(lib_ctx_guest_vdrv(c.g));
	hs_write_all(c.hfd, "ping", 4);
	ASSERT_EQ(uvsock_recv(c.gfd, b, 4, MSG_WAITALL), 4);
	ASSERT_MEMEQ(b, "ping", 4);
	hw = (struct host_io){ .fd = c.hfd, .total = 1u << 20, .seed = 5 };
	ASSERT_EQ(pthread_create(&th, NULL, host_send_main, &hw), 0);
	g_recv_pattern(c.gfd, 1u << 20, 5);
	pthread_join(th, NULL);
	st = gstats(c.g);
	conn_close(&c);
	/* Back to the defaults for the next case. */
	ASSERT_EQ(tune_set("direct-rx,pkt64k,rx-adaptive,event-idx,rx-batch,packed", err,
			   sizeof(err)), 0);
	return st;
}

TEST(no_direct_rx_hands_over_through_the_io_thread)
{
	struct uvsock_guest_stats st = run_with("no-direct-rx");

	ASSERT_EQ_U64(st.rx_direct, 0);
	ASSERT_EQ_U64(st.rx_direct_sleeps, 0);
}

TEST(no_pkt64k_keeps_rx_buffers_at_4k)
{
	struct uvsock_guest_stats st = run_with("no-pkt64k");

	ASSERT_LE(st.rx_buf_len, 4096 + 44);
}

TEST(no_rx_adaptive_posts_one_fixed_size)
{
	struct uvsock_guest_stats st = run_with("no-rx-adaptive");

	ASSERT_EQ_U64(st.rx_buf_len, 65536 + 44);
}

TEST(no_event_idx_is_not_negotiated)
{
	run_with("");
	ASSERT_TRUE(g_features & VHU_BIT(VHU_F_EVENT_IDX));
	run_with("no-event-idx");
	ASSERT_FALSE(g_features & VHU_BIT(VHU_F_EVENT_IDX));
}

TEST(packed_rings_by_default_and_split_with_no_packed)
{
	/* 1 MiB each way over packed rings, then over split ones. */
	run_with("");
	ASSERT_TRUE(g_features & VHU_BIT(VHU_F_RING_PACKED));
	run_with("no-packed");
	ASSERT_FALSE(g_features & VHU_BIT(VHU_F_RING_PACKED));
}

TEST(no_rx_batch_feeds_one_packet_at_a_time)
{
	struct uvsock_guest_stats st = run_with("no-rx-batch");

	/* Every packet is its own feed call. */
	ASSERT_EQ_U64(st.rx_batches, st.rx_bufs - st.rx_dropped);
}

TEST_MAIN()
