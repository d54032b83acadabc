/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the engine's datagram sockets (src/vsock/dgram.c): the wire header of a pulled
 * datagram, delivery with the source address, the drops by reason (not negotiated, bad op,
 * oversize, no listener, receiver full, too large for the puller's buffer) and that none of them
 * is answered, the send quota and its event, write space at the low mark (POLLOUT and the event
 * only below half of SO_SNDBUF), a blocked sender thread that must be woken, UVSOCK_DGRAM_LOCKED
 * read per engine, cached buffers reused across sizes, the separate port namespace, and a socket closed with datagrams still queued.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/macros.h"
#include "vsock-test-util.h"

static void tweak_dgram(struct vsock_engine_config *cfg)
{
	cfg->dgram = true;
}

static void tweak_dgram_small(struct vsock_engine_config *cfg)
{
	cfg->dgram = true;
	cfg->dgram_max = 1000;
}

static struct vsock_sock *dg_sock(struct vsock_engine *e, uint32_t port)
{
	struct vsock_sock *s = NULL;

	ASSERT_OK(vsock_sock_new(e, VSOCK_TYPE_DGRAM, &s));
	if (port != VMADDR_PORT_ANY)
		ASSERT_OK(vsock_sock_bind(s, VMADDR_CID_ANY, port));
	return s;
}

static ssize_t dg_send(struct vsock_sock *s, uint32_t cid, uint32_t port, const void *p, size_t n)
{
	struct vsock_dgram_addr to = { cid, port };
	struct iovec iov = { (void *)p, n };

	return vsock_dgram_send(s, &to, &iov, 1);
}

static ssize_t dg_recv(struct vsock_sock *s, void *p, size_t n, int flags, int *mflags,
		       struct vsock_dgram_addr *src)
{
	struct iovec iov = { p, n };

	return vsock_dgram_recv(s, &iov, 1, flags, mflags, src);
}

static struct vsock_engine_stats stats(struct vsock_engine *e)
{
	struct vsock_engine_stats st;

	vsock_engine_get_stats(e, &st);
	return st;
}

/* A fed datagram header from g (CID 3) to h (CID 2). */
static struct vsock_hdr dg_hdr(uint32_t sport, uint32_t dport, uint32_t len)
{
	return (struct vsock_hdr){ .src_cid = 3, .dst_cid = 2, .src_port = sport, .dst_port = dport,
				   .len = len, .type = VSOCK_TYPE_DGRAM, .op = VSOCK_OP_RW };
}

TEST(dgram_wire_and_delivery)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *rx = dg_sock(w->h, 100), *tx = dg_sock(w->g, VMADDR_PORT_ANY);
	struct vsock_dgram_addr src;
	uint32_t cid, port;
	char buf[64];
	int mf = -1;
	int i;

	ASSERT_OK(vsock_sock_local_addr(tx, &cid, &port));
	ASSERT_EQ(port, VMADDR_PORT_ANY);
	ASSERT_EQ(dg_send(tx, 2, 100, "hello", 5), 5);
	ASSERT_EQ(dg_send(tx, 2, 100, "", 0), 0);
	ASSERT_OK(vsock_sock_local_addr(tx, &cid, &port)); /* auto-bound by the send */
	ASSERT_GE(port, 1024u);
	ASSERT_TRUE(vsock_engine_has_pending(w->g));
	ASSERT_EQ(pump(w), 2u);
	for (i = 0; i < 2; i++) {
		const struct vsock_hdr *h = &w->log[i];

		ASSERT_EQ(h->type, VSOCK_TYPE_DGRAM);
		ASSERT_EQ(h->op, VSOCK_OP_RW);
		ASSERT_EQ(h->flags, 0u);
		ASSERT_EQ(h->buf_alloc, 0u);
		ASSERT_EQ(h->fwd_cnt, 0u);
		ASSERT_EQ_U64(h->src_cid, 3);
		ASSERT_EQ_U64(h->dst_cid, 2);
		ASSERT_EQ(h->src_port, port);
		ASSERT_EQ(h->dst_port, 100u);
		ASSERT_EQ(w->log_from[i], 0);
	}
	ASSERT_EQ(w->log[0].len, 5u);
	ASSERT_EQ(w->log[1].len, 0u);
	ASSERT_TRUE(vsock_sock_poll(rx) & VSOCK_POLLIN);
	ASSERT_EQ(dg_recv(rx, buf, sizeof(buf), 0, &mf, &src), 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	ASSERT_EQ(mf, 0);
	ASSERT_EQ(src.cid, 3u);
	ASSERT_EQ(src.port, port);
	ASSERT_EQ(dg_recv(rx, buf, sizeof(buf), 0, &mf, &src), 0);
	ASSERT_ERR(dg_recv(rx, buf, sizeof(buf), 0, &mf, &src), EAGAIN);
	ASSERT_FALSE(vsock_sock_poll(rx) & VSOCK_POLLIN);
	ASSERT_EQ_U64(stats(w->g).dgram_tx, 2);
	ASSERT_EQ_U64(stats(w->g).dgram_tx_bytes, 5);
	ASSERT_EQ_U64(stats(w->h).dgram_rx, 2);
	ASSERT_EQ_U64(stats(w->h).dgram_rx_bytes, 5);
	vsock_sock_close(rx);
	vsock_sock_close(tx);
	world_free(w);
}

TEST(dgram_not_negotiated)
{
	struct world *w = world_new(NULL);
	struct vsock_hdr h = dg_hdr(5000, 100, 3);
	struct iovec iov = { "abc", 3 };
	struct vsock_sock *s = NULL;

	ASSERT_ERR(vsock_sock_new(w->h, VSOCK_TYPE_DGRAM, &s), ENODEV);
	ASSERT_FALSE(vsock_engine_dgram_enabled(w->h));
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EOPNOTSUPP);
	ASSERT_EQ_U64(stats(w->h).dgram_drop_not_negotiated, 1);
	ASSERT_FALSE(vsock_engine_has_pending(w->h)); /* never an RST */
	world_free(w);
}

TEST(dgram_bad_packets_dropped_unanswered)
{
	struct world *w = world_new(tweak_dgram_small);
	struct vsock_sock *rx = dg_sock(w->h, 100);
	static char big[1001];
	struct vsock_hdr h = dg_hdr(5000, 100, 0);
	struct iovec iov = { big, 0 };

	h.op = VSOCK_OP_REQUEST;
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EPROTO);
	ASSERT_EQ_U64(stats(w->h).rx_dropped[VSOCK_HDR_BAD_OP], 1);
	h = dg_hdr(5000, 100, sizeof(big));
	iov.iov_len = sizeof(big);
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EMSGSIZE);
	ASSERT_EQ_U64(stats(w->h).dgram_drop_oversize, 1);
	h = dg_hdr(5000, 100, 10); /* len differs from the payload */
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EPROTO);
	ASSERT_EQ_U64(stats(w->h).rx_dropped[VSOCK_HDR_BAD_LEN], 1);
	h = dg_hdr(5000, 101, 3);
	iov.iov_len = 3;
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), ENOTCONN);
	ASSERT_EQ_U64(stats(w->h).dgram_drop_no_listener, 1);
	ASSERT_FALSE(vsock_engine_has_pending(w->h));
	ASSERT_ERR(dg_send(rx, 3, 1, big, sizeof(big)), EMSGSIZE);
	ASSERT_EQ(dg_send(rx, 3, 1, big, 1000), 1000);
	vsock_sock_close(rx);
	world_free(w);
}

TEST(dgram_receiver_full_and_rcvbuf)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *rx = dg_sock(w->h, 100);
	struct vsock_hdr h = dg_hdr(5000, 100, 1000);
	static char data[1000];
	struct iovec iov = { data, sizeof(data) };
	unsigned ok = 0, full = 0;
	uint64_t v = 0;
	char buf[1000];

	ASSERT_OK(vsock_dgram_set_buf(rx, true, 2048));
	ASSERT_OK(vsock_dgram_get_buf(rx, true, &v));
	ASSERT_EQ_U64(v, 4096);
	for (int i = 0; i < 10; i++) {
		int r = vsock_engine_feed(w->h, &h, &iov, 1);

		if (r == 0)
			ok++;
		else if (r == -ENOBUFS)
			full++;
	}
	/* 4096 / (1000 + VSOCK_DGRAM_OVERHEAD) = 3 fit. */
	ASSERT_EQ(ok, 4096u / (1000u + VSOCK_DGRAM_OVERHEAD));
	ASSERT_EQ(full, 10u - ok);
	ASSERT_EQ_U64(stats(w->h).dgram_drop_full, full);
	ASSERT_EQ(dg_recv(rx, buf, sizeof(buf), 0, NULL, NULL), 1000);
	ASSERT_OK(vsock_engine_feed(w->h, &h, &iov, 1)); /* room again */
	ASSERT_FALSE(vsock_engine_has_pending(w->h));
	vsock_sock_close(rx);
	world_free(w);
}

TEST(dgram_send_quota_and_event)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *tx = dg_sock(w->g, 7);
	static char data[1000];
	unsigned sent = 0, ev;
	uint64_t v = 0;
	ssize_t r;

	ASSERT_OK(vsock_dgram_set_buf(tx, false, 2048));
	ASSERT_OK(vsock_dgram_get_buf(tx, false, &v));
	ASSERT_EQ_U64(v, 4096);
	ASSERT_TRUE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	while ((r = dg_send(tx, 2, 100, data, sizeof(data))) == (ssize_t)sizeof(data))
		sent++;
	ASSERT_ERR(r, EAGAIN);
	/* Charged before the check: 4096 / 1064 rounds up to 4 queued. */
	ASSERT_EQ(sent, 4u);
	ASSERT_FALSE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ev = w_events(w);
	ASSERT_EQ(pump(w), sent); /* no listener on h: each dropped there */
	ASSERT_GT(w_events(w), ev); /* the drained quota was reported */
	ASSERT_TRUE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ASSERT_EQ_U64(stats(w->h).dgram_drop_no_listener, sent);
	ASSERT_EQ(dg_send(tx, 2, 100, data, sizeof(data)), (ssize_t)sizeof(data));
	vsock_sock_close(tx);
	ASSERT_EQ(pump(w), 1u); /* queued before the close: still sent */
	world_free(w);
}

TEST(dgram_write_space_at_low_mark)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *tx = dg_sock(w->g, 7);
	static char data[1000], buf[1000];
	struct vsock_hdr h;
	unsigned ev;

	ASSERT_OK(vsock_dgram_set_buf(tx, false, 2048)); /* SO_SNDBUF 4096, low mark 2048 */
	/* 4 x 1064 charged: 4256, full. */
	for (int i = 0; i < 4; i++)
		ASSERT_EQ(dg_send(tx, 2, 100, data, sizeof(data)), (ssize_t)sizeof(data));
	ASSERT_ERR(dg_send(tx, 2, 100, data, sizeof(data)), EAGAIN); /* a waiting sender */
	ASSERT_FALSE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ev = w_events(w);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), (ssize_t)sizeof(data)); /* 3192 */
	ASSERT_EQ(w_events(w), ev);
	ASSERT_FALSE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), (ssize_t)sizeof(data)); /* 2128 */
	ASSERT_EQ(w_events(w), ev); /* above the mark: no wake-up yet */
	ASSERT_FALSE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), (ssize_t)sizeof(data)); /* 1064 */
	ASSERT_EQ(w_events(w), ev + 1); /* below it: one event for every waiter */
	ASSERT_TRUE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), (ssize_t)sizeof(data)); /* 0 */
	ASSERT_EQ(w_events(w), ev + 1); /* nobody waits any more */
	/* Above the mark but below the limit: a send fits, POLLOUT is still off. */
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(dg_send(tx, 2, 100, data, sizeof(data)), (ssize_t)sizeof(data));
	ASSERT_FALSE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	ASSERT_EQ(dg_send(tx, 2, 100, data, sizeof(data)), (ssize_t)sizeof(data));
	ASSERT_EQ(pump(w), 3u);
	ASSERT_EQ(w_events(w), ev + 2); /* the poll's wait was reported once */
	vsock_sock_close(tx);
	world_free(w);
}

/*
 * A sender thread with a tiny send quota against a puller on this thread: every time the sender
 * finds the quota full it sleeps until the next socket event, as the socket API does. A lost
 * wake-up leaves it asleep with the queue empty, which the bounded wait below reports.
 */
#define BS_SENDS 3000u

struct bsend {
	struct vsock_engine *e;
	struct vsock_sock *s;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	unsigned events; /* protected by mu */
	atomic_uint sent, blocked;
	atomic_bool stop;
};

static uint64_t bs_now(void *opaque)
{
	(void)opaque;
	return 1000000000ull;
}

static void bs_tx_ready(void *opaque)
{
	(void)opaque; /* the test's own loop pulls */
}

static void bs_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	struct bsend *b = opaque;

	(void)s, (void)user, (void)mask;
	pthread_mutex_lock(&b->mu); /* a leaf under the socket's lock */
	b->events++;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->mu);
}

static const struct vsock_engine_ops bs_ops = {
	.now = bs_now,
	.tx_ready = bs_tx_ready,
	.sock_event = bs_event,
};

static void *bs_sender(void *arg)
{
	struct bsend *b = arg;
	static char data[900];

	while (atomic_load(&b->sent) < BS_SENDS && !atomic_load(&b->stop)) {
		unsigned seq;
		ssize_t r;

		pthread_mutex_lock(&b->mu);
		seq = b->events;
		pthread_mutex_unlock(&b->mu);
		r = dg_send(b->s, 2, 100, data, sizeof(data));
		if (r == (ssize_t)sizeof(data)) {
			atomic_fetch_add(&b->sent, 1);
			continue;
		}
		if (r != -EAGAIN)
			break;
		atomic_fetch_add(&b->blocked, 1);
		pthread_mutex_lock(&b->mu);
		while (b->events == seq && !atomic_load(&b->stop))
			pthread_cond_wait(&b->cond, &b->mu);
		pthread_mutex_unlock(&b->mu);
	}
	return NULL;
}

TEST(dgram_blocked_sender_is_woken)
{
	struct bsend b = { 0 };
	struct vsock_engine_config cfg;
	unsigned pulled = 0;
	uint64_t deadline = test_now_ms() + 20000;
	char buf[1000];
	pthread_t t;

	pthread_mutex_init(&b.mu, NULL);
	pthread_cond_init(&b.cond, NULL);
	vsock_engine_config_default(&cfg);
	cfg.local_cid = 3;
	cfg.ops = &bs_ops;
	cfg.opaque = &b;
	cfg.dgram = true;
	ASSERT_OK(vsock_engine_new(&cfg, &b.e));
	b.s = dg_sock(b.e, 7);
	ASSERT_OK(vsock_dgram_set_buf(b.s, false, 2048)); /* 4 datagrams of 964 */
	ASSERT_EQ(pthread_create(&t, NULL, bs_sender, &b), 0);
	while (pulled < BS_SENDS && test_now_ms() < deadline) {
		struct vsock_hdr h;

		if (pull_one(b.e, &h, buf, sizeof(buf)) >= 0)
			pulled++;
		else
			sched_yield();
	}
	atomic_store(&b.stop, true);
	pthread_mutex_lock(&b.mu);
	pthread_cond_broadcast(&b.cond);
	pthread_mutex_unlock(&b.mu);
	pthread_join(t, NULL);
	if (pulled < BS_SENDS)
		test_fail(__FILE__, __LINE__, "sender stuck after %u of %u datagrams (%u blocks)",
			  pulled, BS_SENDS, atomic_load(&b.blocked));
	ASSERT_GT(atomic_load(&b.blocked), 0u); /* the quota was full, so the wake-up was tested */
	test_note("%u datagrams, the sender blocked %u times, %u events", pulled,
		  atomic_load(&b.blocked), b.events);
	vsock_sock_close(b.s);
	vsock_engine_free(b.e);
	pthread_cond_destroy(&b.cond);
	pthread_mutex_destroy(&b.mu);
}

/* UVSOCK_DGRAM_LOCKED is read per engine: a locked engine, then a lock-free one, one process. */
TEST(dgram_locked_switch_per_engine)
{
	struct vsock_engine *a = NULL, *b = NULL;
	struct vsock_engine_config cfg;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = 3;
	cfg.ops = &bs_ops; /* nothing is sent: no callback runs */
	cfg.dgram = true;
	ASSERT_EQ(setenv("UVSOCK_DGRAM_LOCKED", "1", 1), 0);
	ASSERT_OK(vsock_engine_new(&cfg, &a));
	ASSERT_EQ(unsetenv("UVSOCK_DGRAM_LOCKED"), 0);
	ASSERT_OK(vsock_engine_new(&cfg, &b));
	ASSERT_TRUE(vsock_engine_dgram_locked(a));
	ASSERT_FALSE(vsock_engine_dgram_locked(b));
	vsock_engine_free(a);
	vsock_engine_free(b);
}

/*
 * Datagrams of every buffer class's edge sizes, twice round, each filled with its own byte:
 * a cached buffer reused for a shorter datagram delivers only that datagram's bytes.
 */
TEST(dgram_buffer_reuse_across_sizes)
{
	static const uint32_t sizes[] = { 0, 1, 256, 257, 1024, 1025, 4096, 4097, 16384, 16385,
					  VSOCK_DGRAM_MAX, 100, 5000 };
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *rx = dg_sock(w->h, 100), *tx = dg_sock(w->g, 7);
	static uint8_t data[VSOCK_DGRAM_MAX], got[VSOCK_DGRAM_MAX + 1];
	int big = 1 << 24;

	ASSERT_OK(vsock_dgram_set_buf(rx, true, (uint64_t)big));
	for (int round = 0; round < 2; round++) {
		for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
			memset(data, (int)(i + 1 + round * 16), sizes[i]);
			ASSERT_EQ(dg_send(tx, 2, 100, data, sizes[i]), (ssize_t)sizes[i]);
		}
		ASSERT_EQ(pump(w), (unsigned)ARRAY_SIZE(sizes));
		for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
			memset(data, (int)(i + 1 + round * 16), sizes[i]);
			memset(got, 0xee, sizeof(got));
			ASSERT_EQ(dg_recv(rx, got, sizeof(got), 0, NULL, NULL), (ssize_t)sizes[i]);
			ASSERT_MEMEQ(got, data, sizes[i]);
			ASSERT_EQ(got[sizes[i]], 0xee);
		}
	}
	ASSERT_EQ_U64(stats(w->h).dgram_rx, 2 * ARRAY_SIZE(sizes));
	vsock_sock_close(rx);
	vsock_sock_close(tx);
	world_free(w);
}

TEST(dgram_too_large_for_puller)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *tx = dg_sock(w->g, 7);
	static char data[200];

	w->max_payload = 100;
	ASSERT_EQ(dg_send(tx, 2, 100, data, sizeof(data)), (ssize_t)sizeof(data));
	ASSERT_EQ(dg_send(tx, 2, 100, data, 50), 50);
	ASSERT_EQ(pump(w), 1u);
	ASSERT_EQ(w->log[0].len, 50u);
	ASSERT_EQ_U64(stats(w->g).dgram_drop_oversize, 1);
	ASSERT_TRUE(vsock_sock_poll(tx) & VSOCK_POLLOUT);
	vsock_sock_close(tx);
	world_free(w);
}

TEST(dgram_ports_apart_from_streams_and_peer)
{
	struct world *w = world_new(tweak_dgram);
	struct vsock_sock *st = NULL, *dg = dg_sock(w->h, 100), *dg2 = NULL;
	struct iovec iov = { "x", 1 };
	uint32_t cid, port;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &st));
	ASSERT_OK(vsock_sock_bind(st, VMADDR_CID_ANY, 100));
	ASSERT_OK(vsock_sock_listen(st, 1));
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_DGRAM, &dg2));
	ASSERT_ERR(vsock_sock_bind(dg2, VMADDR_CID_ANY, 100), EADDRINUSE);
	ASSERT_ERR(vsock_sock_listen(dg, 1), EOPNOTSUPP);
	ASSERT_ERR(vsock_sock_connect(dg, 3, 1), EOPNOTSUPP);
	ASSERT_ERR(vsock_dgram_peer_addr(dg2, &cid, &port), ENOTCONN);
	ASSERT_ERR(vsock_dgram_send(dg2, NULL, &iov, 1), EDESTADDRREQ);
	ASSERT_OK(vsock_dgram_connect(dg2, 3, 9, false)); /* auto-binds */
	ASSERT_OK(vsock_dgram_peer_addr(dg2, &cid, &port));
	ASSERT_EQ(cid, 3u);
	ASSERT_EQ(port, 9u);
	ASSERT_OK(vsock_sock_local_addr(dg2, &cid, &port));
	ASSERT_NE(port, VMADDR_PORT_ANY);
	ASSERT_EQ(vsock_dgram_send(dg2, NULL, &iov, 1), 1);
	ASSERT_OK(vsock_dgram_connect(dg2, 0, 0, true));
	ASSERT_ERR(vsock_dgram_send(dg2, NULL, &iov, 1), EDESTADDRREQ);
	ASSERT_EQ(pump(w), 1u);
	ASSERT_EQ(w->log[0].dst_port, 9u);
	vsock_sock_close(st);
	vsock_sock_close(dg);
	vsock_sock_close(dg2);
	world_free(w);
}

TEST_MAIN()
