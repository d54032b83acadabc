/* SPDX-License-Identifier: MIT */
/*
 * Engine tests for the rest of the contract: malformed packets counted by reason, transport
 * reset, deferred and wildcard listeners, the reply limit behind can_feed, pull order and
 * round-robin, foreach_sock, and concurrent application threads against a pump thread.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "util/macros.h"
#include "util/time.h"
#include "vsock-test-util.h"

TEST(malformed_packets_counted_by_reason)
{
	struct world *w = world_new(NULL);
	struct vsock_engine_stats st;
	char p[8] = {0};
	struct vsock_hdr h;

	h = mkhdr(3, 1, 2, 2, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST);
	h.src_cid |= 1ull << 40;
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	h = mkhdr(3, 1, 2, 2, VSOCK_TYPE_STREAM, 9);
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	h = mkhdr(3, 1, 2, 2, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = 70000;
	struct iovec iov = {p, 8};
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EPROTO);
	h.len = 9; /* 8 bytes given */
	ASSERT_ERR(vsock_engine_feed(w->h, &h, &iov, 1), EPROTO);
	h = mkhdr(3, 1, 2, 2, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN);
	h.flags = 4;
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	h = mkhdr(3, 1, 2, 2, 7, VSOCK_OP_REQUEST);
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_CID], 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_OP], 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_OVERSIZE], 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_LEN], 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_FLAGS], 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_TYPE], 1);
	ASSERT_EQ(st.rx_pkts, 6);
	/* Only the unknown type is answered (RST). */
	struct vsock_hdr rep;
	ASSERT_EQ(pull_one(w->h, &rep, p, sizeof(p)), 0);
	ASSERT_EQ(rep.op, VSOCK_OP_RST);
	ASSERT_EQ(pull_one(w->h, &rep, p, sizeof(p)), -EAGAIN);
	/* Sent to CID_ANY: the answer comes from our CID, never from CID_ANY. */
	h = mkhdr(3, 1, VMADDR_CID_ANY, 2, 7, VSOCK_OP_REQUEST);
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	ASSERT_EQ(pull_one(w->h, &rep, p, sizeof(p)), 0);
	ASSERT_EQ(rep.src_cid, 2);
	world_free(w);
}

TEST(transport_reset)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a, *gl, *pending;
	struct vsock_hdr h;
	char b[8];

	connect_pair(w, VSOCK_TYPE_STREAM, 500, &l, &c, &a);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gl));
	ASSERT_OK(vsock_sock_bind(gl, VMADDR_CID_ANY, 600));
	ASSERT_OK(vsock_sock_listen(gl, 5));
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &pending));
	ASSERT_ERR(vsock_sock_connect(pending, 2, 501), EINPROGRESS);
	ASSERT_EQ(send_buf(c, "queued", 6, 0), 6);

	vsock_engine_transport_reset(w->g, 9);
	ASSERT_EQ(vsock_engine_local_cid(w->g), 9);
	ASSERT_EQ(pull_one(w->g, &h, b, sizeof(b)), -EAGAIN); /* no RST, nothing queued */
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(c), ECONNRESET);
	ASSERT_EQ(vsock_sock_state(pending), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(pending), ECONNRESET);
	ASSERT_EQ(vsock_sock_state(gl), VSOCK_SS_LISTEN);
	ASSERT_EQ(vsock_engine_next_deadline(w->g), UINT64_MAX);
	/* The listener works under the new CID. */
	struct vsock_sock *hc, *ga;
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &hc));
	ASSERT_ERR(vsock_sock_connect(hc, 9, 600), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(hc), VSOCK_SS_CONNECTED);
	ASSERT_OK(vsock_sock_accept(gl, &ga));
	uint32_t cid, port;
	ASSERT_OK(vsock_sock_local_addr(ga, &cid, &port));
	ASSERT_EQ(cid, 9);
	vsock_sock_close(ga);
	vsock_sock_close(hc);
	vsock_sock_close(gl);
	vsock_sock_close(pending);
	pair_free(w, l, c, a);
}

TEST(deferred_wildcard_listener)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *wl, *wl2, *own, *c1, *c2, *c3, *ch, *oc;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &wl));
	ASSERT_OK(vsock_sock_listen_deferred(wl, 16, true));
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &wl2));
	ASSERT_ERR(vsock_sock_listen_deferred(wl2, 16, true), EADDRINUSE);
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &own));
	ASSERT_OK(vsock_sock_bind(own, VMADDR_CID_ANY, 800));
	ASSERT_OK(vsock_sock_listen(own, 4));

	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c1));
	ASSERT_ERR(vsock_sock_connect(c1, 2, 777), EINPROGRESS);
	pump(w);
	/* Not answered yet. */
	ASSERT_EQ(vsock_sock_state(c1), VSOCK_SS_CONNECTING);
	ASSERT_TRUE(vsock_sock_poll(wl) & VSOCK_POLLIN);
	ASSERT_OK(vsock_sock_accept(wl, &ch));
	ASSERT_EQ(vsock_sock_state(ch), VSOCK_SS_PENDING);
	uint32_t cid, port;
	ASSERT_OK(vsock_sock_local_addr(ch, &cid, &port));
	ASSERT_EQ(port, 777);
	ASSERT_EQ(cid, 2);
	ASSERT_OK(vsock_sock_accept_pending(ch));
	ASSERT_ERR(vsock_sock_accept_pending(ch), EINVAL);
	pump(w);
	ASSERT_EQ(vsock_sock_state(c1), VSOCK_SS_CONNECTED);
	ASSERT_EQ(send_buf(c1, "hi", 2, 0), 2);
	pump(w);
	char b[4];
	ASSERT_EQ(recv_buf(ch, b, sizeof(b), 0, NULL), 2);

	/* Rejected: the connect fails with ECONNRESET at once. */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c2));
	ASSERT_ERR(vsock_sock_connect(c2, 2, 778), EINPROGRESS);
	pump(w);
	struct vsock_sock *ch2;
	ASSERT_OK(vsock_sock_accept(wl, &ch2));
	vsock_sock_reject(ch2);
	pump(w);
	ASSERT_EQ(vsock_sock_take_error(c2), ECONNRESET);
	vsock_sock_close(ch2);

	/* A port with its own listener is not taken by the wildcard. */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c3));
	ASSERT_ERR(vsock_sock_connect(c3, 2, 800), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(c3), VSOCK_SS_CONNECTED);
	ASSERT_OK(vsock_sock_accept(own, &oc));
	ASSERT_ERR(vsock_sock_accept(wl, &ch2), EAGAIN);
	/* The wildcard is per type. */
	struct vsock_sock *sp;
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_SEQPACKET, &sp));
	ASSERT_ERR(vsock_sock_connect(sp, 2, 779), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_take_error(sp), ECONNRESET);

	vsock_sock_close(sp);
	vsock_sock_close(oc);
	vsock_sock_close(c3);
	vsock_sock_close(c2);
	vsock_sock_close(c1);
	vsock_sock_close(ch);
	vsock_sock_close(own);
	vsock_sock_close(wl2);
	vsock_sock_close(wl);
	pump(w);
	/* Closing the wildcard releases the slot. */
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &wl));
	ASSERT_OK(vsock_sock_listen_deferred(wl, 1, true));
	vsock_sock_close(wl);
	world_free(w);
}

static void small_replies(struct vsock_engine_config *cfg)
{
	cfg->reply_limit = 4;
}

TEST(reply_limit_and_can_feed)
{
	struct world *w = world_new(small_replies);
	struct vsock_engine_stats st;
	struct vsock_hdr h, rep;
	char b[8];

	ASSERT_TRUE(vsock_engine_can_feed(w->h));
	for (uint32_t i = 0; i < 4; i++) {
		h = mkhdr(3, 100 + i, 2, 4242, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST);
		ASSERT_ERR(feed_hdr(w->h, &h, NULL), ECONNRESET);
	}
	ASSERT_FALSE(vsock_engine_can_feed(w->h));
	/* A transport that ignores can_feed still cannot grow the queue. */
	h = mkhdr(3, 200, 2, 4242, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST);
	(void)feed_hdr(w->h, &h, NULL);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rst_dropped, 1);
	ASSERT_TRUE(vsock_engine_has_pending(w->h));
	ASSERT_EQ(pull_one(w->h, &rep, b, sizeof(b)), 0);
	ASSERT_EQ(rep.dst_port, 100);
	ASSERT_TRUE(vsock_engine_can_feed(w->h));
	while (pull_one(w->h, &rep, b, sizeof(b)) >= 0)
		;
	ASSERT_FALSE(vsock_engine_has_pending(w->h));
	world_free(w);
}

static void one_reply(struct vsock_engine_config *cfg)
{
	cfg->reply_limit = 1;
}

/* Credit updates are not replies (as on Linux): a peer's reads never block our feeding. */
TEST(credit_updates_do_not_count_as_replies)
{
	struct world *w = world_new(one_reply);
	struct vsock_sock *l, *c, *a;
	struct vsock_hdr h;
	uint32_t cport, ccid;

	connect_pair(w, VSOCK_TYPE_STREAM, 4242, &l, &c, &a);
	ASSERT_OK(vsock_sock_local_addr(c, &ccid, &cport));
	/* Every connection of the peer asks for credit: one CREDIT_UPDATE pending on ours. */
	h = mkhdr(3, cport, 2, 4242, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_REQUEST);
	ASSERT_OK(feed_hdr(w->h, &h, NULL));
	ASSERT_TRUE(vsock_engine_has_pending(w->h));
	ASSERT_TRUE(vsock_engine_can_feed(w->h));
	/* A REQUEST to a closed port queues an RST reply: that one counts. */
	h = mkhdr(3, 999, 2, 4243, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST);
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), ECONNRESET);
	ASSERT_FALSE(vsock_engine_can_feed(w->h));
	pump(w);
	ASSERT_TRUE(vsock_engine_can_feed(w->h));
	ASSERT_EQ(log_count(w, VSOCK_OP_CREDIT_UPDATE, 1), 1);
	vsock_sock_close(a);
	vsock_sock_close(c);
	vsock_sock_close(l);
	pump(w);
	world_free(w);
}

TEST(pull_order_and_round_robin)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c1, *a1, *c2, *a2;
	static char data[300];
	struct vsock_hdr h;
	char b[100];

	connect_pair(w, VSOCK_TYPE_STREAM, 900, &l, &c1, &a1);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c2));
	ASSERT_ERR(vsock_sock_connect(c2, 2, 900), EINPROGRESS);
	pump(w);
	ASSERT_OK(vsock_sock_accept(l, &a2));
	uint32_t cid, p1, p2;
	ASSERT_OK(vsock_sock_local_addr(c1, &cid, &p1));
	ASSERT_OK(vsock_sock_local_addr(c2, &cid, &p2));
	/* Each has 300 bytes; pulled 100 at a time the sockets alternate. */
	ASSERT_EQ(send_buf(c1, data, 300, 0), 300);
	ASSERT_EQ(send_buf(c2, data, 300, 0), 300);
	uint32_t order[6];
	for (int i = 0; i < 6; i++) {
		ASSERT_EQ(pull_one(w->g, &h, b, 100), 100);
		order[i] = h.src_port;
	}
	ASSERT_EQ(pull_one(w->g, &h, b, 100), -EAGAIN);
	for (int i = 0; i < 6; i++)
		ASSERT_EQ(order[i], (i % 2 == 0) ? p1 : p2);
	/* Within one socket: RW before SHUTDOWN; a pending CREDIT_UPDATE rides on them. */
	ASSERT_EQ(send_buf(c1, data, 10, 0), 10);
	ASSERT_OK(vsock_sock_shutdown(c1, VSOCK_SHUTDOWN_SEND));
	h = mkhdr(2, 900, 3, p1, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_REQUEST);
	h.fwd_cnt = 300;
	ASSERT_OK(feed_hdr(w->g, &h, NULL));
	ASSERT_EQ(pull_one(w->g, &h, b, 100), 10);
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(pull_one(w->g, &h, b, 100), 0);
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(pull_one(w->g, &h, b, 100), -EAGAIN);
	/* A SHUTDOWN without SEND does not wait for queued data. */
	while (pull_one(w->h, &h, b, 100) >= 0)
		;
	ASSERT_EQ(send_buf(a2, data, 10, 0), 10);
	ASSERT_OK(vsock_sock_shutdown(a2, VSOCK_SHUTDOWN_RCV));
	ASSERT_EQ(pull_one(w->h, &h, b, 100), 0);
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(h.flags, VSOCK_SHUTDOWN_RCV);
	ASSERT_EQ(pull_one(w->h, &h, b, 100), 10);
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	/* RST goes first and drops everything else: c2 has data queued, then the peer's
	 * SHUTDOWN(3) with c2's receive queue empty makes c2 reset. */
	ASSERT_EQ(send_buf(c2, data, 10, 0), 10);
	h = mkhdr(2, 900, 3, p2, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST); /* ignored when connected */
	ASSERT_ERR(feed_hdr(w->g, &h, NULL), EINVAL);
	h.op = VSOCK_OP_SHUTDOWN;
	h.flags = VSOCK_SHUTDOWN_MASK;
	ASSERT_OK(feed_hdr(w->g, &h, NULL));
	ASSERT_EQ(pull_one(w->g, &h, b, 100), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.src_port, p2);
	ASSERT_EQ(pull_one(w->g, &h, b, 100), -EAGAIN);
	vsock_sock_close(c2);
	ASSERT_EQ(pull_one(w->g, &h, b, 100), -EAGAIN);
	vsock_sock_close(a1);
	vsock_sock_close(a2);
	vsock_sock_close(c1);
	vsock_sock_close(l);
	world_free(w);
}

struct count_arg {
	unsigned n, listen, connected;
};

static void count_cb(void *arg, const struct vsock_sock_info *i)
{
	struct count_arg *a = arg;

	a->n++;
	a->listen += i->state == VSOCK_SS_LISTEN;
	a->connected += i->state == VSOCK_SS_CONNECTED;
}

TEST(foreach_sock_lists_everything)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct count_arg ca = {0};

	connect_pair(w, VSOCK_TYPE_STREAM, 950, &l, &c, &a);
	vsock_engine_foreach_sock(w->h, count_cb, &ca);
	ASSERT_EQ(ca.n, 2);
	ASSERT_EQ(ca.listen, 1);
	ASSERT_EQ(ca.connected, 1);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.socks_open, 2);
	ASSERT_EQ(st.socks_total, 2);
	pair_free(w, l, c, a);
}

/* ---- threads -------------------------------------------------------------------------------- */

#define XFER (4u << 20)

struct thr {
	struct world *w;
	struct vsock_sock *s;
	atomic_int stop; /* relaxed: pthread_join orders what the thread wrote */
	uint8_t *buf;
	size_t done;
	int failed;
	pthread_mutex_t pump_lock;
};

static void *sender(void *p)
{
	struct thr *t = p;
	uint64_t deadline = mono_ms() + 30000;

	while (t->done < XFER && mono_ms() < deadline) {
		size_t chunk = MIN((size_t)(XFER - t->done), (size_t)70000);
		ssize_t n = send_buf(t->s, t->buf + t->done, chunk, 0);

		if (n > 0)
			t->done += (size_t)n;
		else if (n != -EAGAIN)
			t->failed = (int)n;
	}
	return NULL;
}

static void *receiver(void *p)
{
	struct thr *t = p;
	uint64_t deadline = mono_ms() + 30000;

	while (t->done < XFER && mono_ms() < deadline) {
		ssize_t n = recv_buf(t->s, t->buf + t->done, 100000, 0, NULL);

		if (n > 0)
			t->done += (size_t)n;
		else if (n != -EAGAIN)
			t->failed = (int)(n ? n : -EPIPE);
	}
	return NULL;
}

static void *pumper(void *p)
{
	struct thr *t = p;

	while (!atomic_load_explicit(&t->stop, memory_order_relaxed))
		pump(t->w);
	return NULL;
}

TEST(concurrent_app_threads_and_pump)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static struct thr ts, tr, tp;
	pthread_t th[3];

	connect_pair(w, VSOCK_TYPE_STREAM, 960, &l, &c, &a);
	ts = (struct thr){.w = w, .s = c, .buf = malloc(XFER)};
	tr = (struct thr){.w = w, .s = a, .buf = malloc(XFER)};
	tp = (struct thr){.w = w};
	for (size_t i = 0; i < XFER; i++)
		ts.buf[i] = (uint8_t)(i * 2654435761u >> 13);
	ASSERT_EQ(pthread_create(&th[0], NULL, pumper, &tp), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, sender, &ts), 0);
	ASSERT_EQ(pthread_create(&th[2], NULL, receiver, &tr), 0);
	pthread_join(th[1], NULL);
	pthread_join(th[2], NULL);
	atomic_store_explicit(&tp.stop, 1, memory_order_relaxed);
	pthread_join(th[0], NULL);
	ASSERT_EQ(ts.failed, 0);
	ASSERT_EQ(tr.failed, 0);
	ASSERT_EQ(ts.done, XFER);
	ASSERT_EQ(tr.done, XFER);
	ASSERT_MEMEQ(ts.buf, tr.buf, XFER);
	free(ts.buf);
	free(tr.buf);
	pair_free(w, l, c, a);
}


/* One direction of the wire, for two pump threads running at once (no packet log). */
struct dir_pump {
	struct vsock_engine *from, *to;
	atomic_int stop; /* relaxed: pthread_join orders what the thread wrote */
	uint8_t buf[65536];
};

static void *dir_pumper(void *p)
{
	struct dir_pump *d = p;

	while (!atomic_load_explicit(&d->stop, memory_order_relaxed)) {
		struct vsock_hdr h;
		struct iovec iov = {d->buf, sizeof(d->buf)};
		ssize_t n = vsock_engine_pull(d->from, &h, &iov, 1, sizeof(d->buf));

		if (n < 0)
			continue;
		iov.iov_len = (size_t)n;
		(void)vsock_engine_feed(d->to, &h, &iov, 1);
	}
	return NULL;
}

struct churn {
	struct world *w;
	int id;
	int failed;
	atomic_int done; /* relaxed: the counters are read after pthread_join */
	int connected, pings;
};

static uint64_t socks_open(struct vsock_engine *e)
{
	struct vsock_engine_stats st;

	vsock_engine_get_stats(e, &st);
	return st.socks_open;
}

/* Connect, exchange, close, many times, while the other churners do the same. */
static void *churner(void *p)
{
	struct churn *c = p;
	uint64_t deadline = mono_ms() + 20000;

	for (int round = 0; round < 40 && mono_ms() < deadline; round++) {
		struct vsock_sock *s;
		char b[64];
		int ok = 0;

		if (vsock_sock_new(c->w->g, VSOCK_TYPE_STREAM, &s) < 0) {
			c->failed = 1;
			return NULL;
		}
		if (vsock_sock_connect(s, 2, 970) != -EINPROGRESS)
			c->failed = 2;
		while (mono_ms() < deadline && vsock_sock_state(s) == VSOCK_SS_CONNECTING)
			; /* spin: CONNECTED can be brief here (the server closes at once) */
		if (vsock_sock_state(s) == VSOCK_SS_CONNECTED) {
			c->connected++;
			for (int k = 0; k < 20 && mono_ms() < deadline; k++) {
				ssize_t n = send_buf(s, "ping", 4, 0);
				if (n == 4)
					ok++;
				(void)recv_buf(s, b, sizeof(b), 0, NULL);
			}
		}
		c->pings += ok;
		vsock_sock_close(s);
	}
	atomic_store_explicit(&c->done, 1, memory_order_relaxed);
	return NULL;
}

TEST(concurrent_connect_close_churn)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l;
	static struct dir_pump gp, hp;
	static struct churn ch[3];
	pthread_t pt[2], ct[3];
	uint64_t deadline;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, 970));
	ASSERT_OK(vsock_sock_listen(l, 64));
	gp = (struct dir_pump){.from = w->g, .to = w->h};
	hp = (struct dir_pump){.from = w->h, .to = w->g};
	ASSERT_EQ(pthread_create(&pt[0], NULL, dir_pumper, &gp), 0);
	ASSERT_EQ(pthread_create(&pt[1], NULL, dir_pumper, &hp), 0);
	for (int i = 0; i < 3; i++) {
		ch[i] = (struct churn){.w = w, .id = i};
		ASSERT_EQ(pthread_create(&ct[i], NULL, churner, &ch[i]), 0);
	}
	/* The main thread plays the server: accept, echo, close. */
	deadline = mono_ms() + 25000;
	int finished = 0;
	while (mono_ms() < deadline && finished < 3) {
		struct vsock_sock *a;

		if (vsock_sock_accept(l, &a) == 0) {
			char b[64];
			for (int k = 0; k < 5; k++)
				(void)recv_buf(a, b, sizeof(b), 0, NULL);
			vsock_sock_close(a);
		}
		finished = 0;
		for (int i = 0; i < 3; i++)
			finished += atomic_load_explicit(&ch[i].done, memory_order_relaxed);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(ct[i], NULL);
	/* Drain the accept queue, then let the lingers finish. */
	struct vsock_sock *a;
	while (vsock_sock_accept(l, &a) == 0)
		vsock_sock_close(a);
	vsock_sock_close(l);
	(void)WAIT_FOR(socks_open(w->g) == 0 && socks_open(w->h) == 0, 2000);
	atomic_store_explicit(&gp.stop, 1, memory_order_relaxed);
	atomic_store_explicit(&hp.stop, 1, memory_order_relaxed);
	pthread_join(pt[0], NULL);
	pthread_join(pt[1], NULL);
	w->now += 20000000000ull;
	vsock_engine_run_timers(w->g);
	vsock_engine_run_timers(w->h);
	pump(w);
	for (int i = 0; i < 3; i++) {
		ASSERT_EQ(ch[i].failed, 0);
		ASSERT_GT(ch[i].connected, 0);
		ASSERT_GT(ch[i].pings, 0);
	}
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.socks_open, 0);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.socks_open, 0);
	world_free(w);
}

TEST_MAIN()
