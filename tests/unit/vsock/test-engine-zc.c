/* SPDX-License-Identifier: MIT */
/*
 * Engine zero-copy API (engine.h): deliver in place on receive (ops->deliver takes what it can,
 * the rest queues, later payloads queue behind it, fwd_cnt counts only what was taken, credit is
 * still enforced) and reserve/commit on send (the credit and ordering rules, the header it
 * builds); the device role's window (cfg.tx_window_peer, ops->tx_sent); and the engine's data-path switches
 * of src/util/tune.h (credit-reduce, merge).
 */
#include "util/iov.h"
#include "util/tune.h"
#include "vsock/rxq.h"
#include "vsock-test-util.h"

/* What the deliver callback of these tests does: takes up to quota bytes into got[]. */
static struct {
	size_t quota;
	unsigned calls;
	size_t got_len;
	uint8_t got[1 << 20];
} zc;

static size_t zc_deliver(void *opaque, struct vsock_sock *s, void *user, const struct iovec *iov,
			 int iovcnt, size_t len)
{
	size_t n = len < zc.quota ? len : zc.quota;

	(void)opaque;
	(void)s;
	(void)user;
	zc.calls++;
	ASSERT_EQ(iov_total(iov, (size_t)iovcnt), len);
	ASSERT_EQ(iov_read_at(iov, (size_t)iovcnt, 0, zc.got + zc.got_len, n), n);
	zc.got_len += n;
	zc.quota -= n;
	return n;
}

static const struct vsock_engine_ops zc_ops = {
	.now = w_now,
	.tx_ready = w_tx_ready,
	.sock_event = w_event,
	.deliver = zc_deliver,
};

static void zc_tweak(struct vsock_engine_config *cfg)
{
	cfg->ops = &zc_ops;
}

/* A world whose host engine (CID 2) delivers in place through zc_deliver. */
static struct world *zc_world(void)
{
	struct world *w = world_new(NULL);

	vsock_engine_free(w->h);
	w->h = w_engine(w, 2, zc_tweak);
	memset(&zc, 0, sizeof(zc));
	zc.quota = SIZE_MAX;
	return w;
}

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7 + seed);
}

TEST(deliver_takes_everything_nothing_queued)
{
	struct world *w = zc_world();
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	static uint8_t msg[3000];

	connect_pair(w, VSOCK_TYPE_STREAM, 500, &l, &c, &a);
	fill_pattern(msg, sizeof(msg), 1);
	ASSERT_EQ(send_buf(c, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	pump(w);
	ASSERT_GE(zc.calls, 1u);
	ASSERT_EQ(zc.got_len, sizeof(msg));
	ASSERT_MEMEQ(zc.got, msg, sizeof(msg));
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, 0u);
	ASSERT_EQ(info.fwd_cnt, (uint32_t)sizeof(msg));
	ASSERT_EQ(info.bytes_in, (uint64_t)sizeof(msg));
	ASSERT_FALSE(vsock_sock_poll(a) & VSOCK_POLLIN);
	/* The sender saw the bytes consumed: its in-flight count is back to 0. */
	vsock_sock_get_info(c, &info);
	ASSERT_EQ(info.peer_fwd_cnt, info.tx_cnt);
	pair_free(w, l, c, a);
}

TEST(deliver_refused_rest_queues_in_order)
{
	struct world *w = zc_world();
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	static uint8_t msg[6000], got[8192];
	unsigned calls;

	connect_pair(w, VSOCK_TYPE_STREAM, 501, &l, &c, &a);
	fill_pattern(msg, sizeof(msg), 3);
	/* The consumer takes 1000 bytes of the first packet and refuses the rest (EAGAIN). */
	zc.quota = 1000;
	ASSERT_EQ(send_buf(c, msg, 4000, 0), 4000);
	pump(w);
	ASSERT_EQ(zc.got_len, 1000u);
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, 3000u);
	ASSERT_EQ(info.fwd_cnt, 1000u); /* only what the consumer took */
	/* The consumer has room again, but bytes are queued: new ones queue behind them. */
	zc.quota = SIZE_MAX;
	calls = zc.calls;
	ASSERT_EQ(send_buf(c, msg + 4000, 2000, 0), 2000);
	pump(w);
	ASSERT_EQ(zc.calls, calls);
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, 5000u);
	ASSERT_EQ(info.fwd_cnt, 1000u);
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, NULL), 5000);
	ASSERT_MEMEQ(got, msg + 1000, 5000);
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.fwd_cnt, 6000u);
	/* Queue empty: in place again. */
	ASSERT_EQ(send_buf(c, msg, 100, 0), 100);
	pump(w);
	ASSERT_EQ(zc.got_len, 1100u);
	ASSERT_MEMEQ(zc.got + 1000, msg, 100);
	pair_free(w, l, c, a);
}

TEST(deliver_credit_still_enforced)
{
	struct world *w = zc_world();
	struct vsock_sock *l, *c, *a;
	struct vsock_engine_stats st;
	uint32_t cport, lport, cid;
	static uint8_t big[65536];
	struct vsock_hdr h;
	int r;

	connect_pair(w, VSOCK_TYPE_STREAM, 502, &l, &c, &a);
	ASSERT_OK(vsock_sock_local_addr(c, &cid, &cport));
	ASSERT_OK(vsock_sock_local_addr(a, &cid, &lport));
	/* The consumer refuses everything: a peer past its credit is reset, not delivered. */
	zc.quota = 0;
	h = mkhdr(3, cport, 2, lport, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = sizeof(big);
	for (int i = 0; i < 4; i++)
		ASSERT_OK(feed_hdr(w->h, &h, big));
	zc.quota = SIZE_MAX;
	r = feed_hdr(w->h, &h, big);
	ASSERT_EQ(r, -ENOBUFS);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.credit_violations, 1u);
	ASSERT_EQ(zc.got_len, 0u);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	pair_free(w, l, c, a);
}

TEST(reserve_commit_send_path)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	static uint8_t pay[65536], got[65536];
	struct vsock_hdr h;
	struct iovec iov;

	connect_pair(w, VSOCK_TYPE_STREAM, 503, &l, &c, &a);
	fill_pattern(pay, sizeof(pay), 5);
	/* At most max and the credit; a commit at most max_pkt. */
	ASSERT_EQ(vsock_sock_tx_reserve(a, 1000), 1000);
	ASSERT_EQ(vsock_sock_tx_reserve(a, 1 << 20), 262144);
	ASSERT_ERR(vsock_sock_tx_commit(a, 65537, &h), EINVAL);
	ASSERT_OK(vsock_sock_tx_commit(a, 1000, &h));
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(h.len, 1000u);
	ASSERT_EQ(h.src_cid, 2u);
	ASSERT_EQ(h.dst_cid, 3u);
	ASSERT_EQ(h.buf_alloc, 262144u);
	iov = (struct iovec){pay, 1000};
	ASSERT_OK(vsock_engine_feed(w->g, &h, &iov, 1));
	ASSERT_EQ(recv_buf(c, got, sizeof(got), 0, NULL), 1000);
	ASSERT_MEMEQ(got, pay, 1000);
	/* Nothing was queued inside the engine for it. */
	ASSERT_FALSE(vsock_engine_has_pending(w->h));
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.tx_cnt, 1000u);
	ASSERT_EQ(info.tx_queued, 0u);
	/* Fill the peer's whole credit without it reading: then 0, as send() would block. */
	for (uint32_t sent = 1000; sent < 262144;) {
		ssize_t n = vsock_sock_tx_reserve(a, sizeof(pay));

		ASSERT_GT(n, 0);
		ASSERT_LE(n, (ssize_t)sizeof(pay));
		ASSERT_OK(vsock_sock_tx_commit(a, (size_t)n, &h));
		iov = (struct iovec){pay, (size_t)n};
		ASSERT_OK(vsock_engine_feed(w->g, &h, &iov, 1));
		sent += (uint32_t)n;
	}
	ASSERT_EQ(vsock_sock_tx_reserve(a, 100), 0);
	/* A commit beyond the credit is refused. */
	ASSERT_ERR(vsock_sock_tx_commit(a, 1, &h), EINVAL);
	/* Bytes queued by send() go first. */
	pump(w);
	while (recv_buf(c, got, sizeof(got), 0, NULL) > 0)
		;
	pump(w);
	ASSERT_EQ(send_buf(a, "x", 1, 0), 1);
	ASSERT_ERR(vsock_sock_tx_reserve(a, 100), EAGAIN);
	pump(w);
	ASSERT_GT(vsock_sock_tx_reserve(a, 100), 0);
	/* Shut down for sending: EPIPE. */
	ASSERT_OK(vsock_sock_shutdown(a, VSOCK_SHUTDOWN_SEND));
	pump(w);
	ASSERT_ERR(vsock_sock_tx_reserve(a, 100), EPIPE);
	pair_free(w, l, c, a);
}

TEST(reserve_refuses_seqpacket_and_unconnected)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a, *s;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 504, &l, &c, &a);
	ASSERT_ERR(vsock_sock_tx_reserve(a, 100), EOPNOTSUPP);
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &s));
	ASSERT_ERR(vsock_sock_tx_reserve(s, 100), ENOTCONN);
	vsock_sock_close(s);
	pair_free(w, l, c, a);
}

/* Credit updates the host side sent while the guest's reads of 10 x 100 bytes went on. */
static unsigned credit_updates_for_reads(struct world *w)
{
	struct vsock_sock *l, *c, *a;
	static uint8_t buf[1000];
	unsigned before;

	connect_pair(w, VSOCK_TYPE_STREAM, 505, &l, &c, &a);
	ASSERT_EQ(send_buf(c, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	pump(w);
	before = log_count(w, VSOCK_OP_CREDIT_UPDATE, 1);
	/* Leave 100 bytes queued each time (never below rcvlowat), lots of free space. */
	for (int i = 0; i < 9; i++) {
		ASSERT_EQ(recv_buf(a, buf, 100, 0, NULL), 100);
		pump(w);
	}
	before = log_count(w, VSOCK_OP_CREDIT_UPDATE, 1) - before;
	pair_free(w, l, c, a);
	return before;
}

TEST(credit_reduce_switch)
{
	char err[128];
	struct world *w = world_new(NULL);

	ASSERT_EQ(credit_updates_for_reads(w), 0u); /* the peer needs none */
	ASSERT_OK(tune_set("no-credit-reduce", err, sizeof(err)));
	w = world_new(NULL);
	ASSERT_EQ(credit_updates_for_reads(w), 9u); /* one after every read */
}

TEST(merge_switch)
{
	char err[128];
	struct world *w;
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info on, off;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			ASSERT_OK(tune_set("no-merge", err, sizeof(err)));
		w = world_new(NULL);
		connect_pair(w, VSOCK_TYPE_STREAM, 506, &l, &c, &a);
		for (int i = 0; i < 8; i++) {
			ASSERT_EQ(send_buf(c, "sixteen bytes!!!", 16, 0), 16);
			pump(w);
		}
		vsock_sock_get_info(a, pass ? &off : &on);
		pair_free(w, l, c, a);
	}
	ASSERT_EQ(on.rx_bytes, 128u);
	ASSERT_EQ(off.rx_bytes, 128u);
	/* Merged: one small chunk; unmerged: a chunk (and its overhead) per payload. */
	ASSERT_EQ(on.rx_mem, RX_SMALL_CHUNK + RX_CHUNK_OVERHEAD);
	ASSERT_EQ(off.rx_mem, 8 * (16 + RX_CHUNK_OVERHEAD));
}

static void window_peer_tweak(struct vsock_engine_config *cfg)
{
	cfg->buf_size = 4096;
	cfg->tx_window_peer = true;
}

static void window_min_tweak(struct vsock_engine_config *cfg)
{
	cfg->buf_size = 4096;
}

/*
 * cfg.tx_window_peer (the device role): a STREAM sender with buf_alloc 4096 keeps up to the
 * peer's buf_alloc (256 KiB) in flight while the peer reads nothing, 4096 queued at most at a
 * time, and pulling makes room again; without it (Linux, CVE-2026-23086) min(4096, 256 KiB).
 */
TEST(tx_window_peer_bounds_in_flight_by_the_peer_alone)
{
	static uint8_t msg[4096];

	for (int peer_only = 0; peer_only < 2; peer_only++) {
		struct world *w = world_new(NULL);
		struct vsock_sock *l, *c, *a;
		struct vsock_sock_info info;
		uint64_t sent = 0;
		ssize_t r;

		vsock_engine_free(w->h);
		w->h = w_engine(w, 2, peer_only ? window_peer_tweak : window_min_tweak);
		connect_pair(w, VSOCK_TYPE_STREAM, 640, &l, &c, &a);
		/* a (buf_alloc 4096) sends to c (256 KiB), which reads nothing. */
		while ((r = send_buf(a, msg, sizeof(msg), 0)) > 0) {
			ASSERT_LE((uint64_t)r, 4096u);
			vsock_sock_get_info(a, &info);
			ASSERT_LE(info.tx_queued, 4096u); /* what we hold: at most our buf_alloc */
			sent += (uint64_t)r;
			pump(w);
		}
		ASSERT_EQ(r, -EAGAIN);
		vsock_sock_get_info(c, &info);
		ASSERT_EQ(info.rx_bytes, (uint32_t)sent);
		ASSERT_EQ(sent, peer_only ? 256u * 1024 : 4096u);
		pair_free(w, l, c, a);
	}
}

/* The packets ops->tx_sent reported: each one's length and end (tx_cnt after it). */
static struct {
	unsigned n;
	uint32_t len[64], end[64];
} sent;

static void sent_note(void *opaque, struct vsock_sock *s, void *user, uint32_t len,
		      uint32_t end)
{
	(void)opaque;
	(void)s;
	(void)user;
	ASSERT_LT(sent.n, 64u);
	sent.len[sent.n] = len;
	sent.end[sent.n++] = end;
}

static const struct vsock_engine_ops sent_ops = {
	.now = w_now,
	.tx_ready = w_tx_ready,
	.sock_event = w_event,
	.tx_sent = sent_note,
};

static void window_peer_sent_tweak(struct vsock_engine_config *cfg)
{
	window_peer_tweak(cfg);
	cfg->ops = &sent_ops;
}

/*
 * With cfg.tx_window_peer, send() may have room (our buf_alloc, 4096) while the peer's credit
 * is what its transport waits for (the device's host -> guest budget): a CREDIT_UPDATE that
 * only opens the peer's credit is write space too, and one that opens nothing is not.
 */
TEST(tx_window_peer_write_space_when_only_the_credit_grows)
{
	static uint8_t msg[4096];
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	struct vsock_hdr h;
	unsigned ev;

	vsock_engine_free(w->h);
	w->h = w_engine(w, 2, window_peer_tweak);
	connect_pair(w, VSOCK_TYPE_STREAM, 641, &l, &c, &a);
	ASSERT_EQ(send_buf(a, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	pump(w);
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.tx_cnt, 4096u);
	ASSERT_EQ(vsock_sock_send_space(a), 4096u); /* our buf_alloc, the credit well above */
	h = mkhdr(3, info.peer_port, 2, info.local_port, VSOCK_TYPE_STREAM,
		  VSOCK_OP_CREDIT_UPDATE);
	h.buf_alloc = info.peer_buf_alloc;
	h.fwd_cnt = 0; /* nothing consumed: no more credit, no event */
	ev = w_events(w);
	ASSERT_OK(feed_hdr(w->h, &h, NULL));
	ASSERT_EQ(w_events(w), ev);
	h.fwd_cnt = 1024; /* the peer consumed 1024: send space unchanged, credit +1024 */
	ASSERT_OK(feed_hdr(w->h, &h, NULL));
	ASSERT_EQ(vsock_sock_send_space(a), 4096u);
	ASSERT_EQ(w_events(w), ev + 1);
	ASSERT_EQ((struct vsock_sock *)atomic_load(&w->last_event_sock), a);
	ASSERT_TRUE(w->last_mask & VSOCK_POLLOUT);
	pair_free(w, l, c, a);
}

/*
 * ops->tx_sent: each STREAM RW packet cut from what send() queued, with its length and end,
 * wherever the pull cuts it (here at 1000-byte payloads); not the control packets.
 */
TEST(tx_sent_reports_each_stream_packet)
{
	static uint8_t msg[2500];
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;

	vsock_engine_free(w->h);
	w->h = w_engine(w, 2, window_peer_sent_tweak);
	connect_pair(w, VSOCK_TYPE_STREAM, 642, &l, &c, &a);
	memset(&sent, 0, sizeof(sent));
	w->max_payload = 1000;
	ASSERT_EQ(send_buf(a, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	ASSERT_EQ(send_buf(a, msg, 300, 0), 300);
	pump(w);
	ASSERT_EQ(sent.n, 3u);
	ASSERT_EQ(sent.len[0], 1000u);
	ASSERT_EQ(sent.end[0], 1000u);
	ASSERT_EQ(sent.len[1], 1000u);
	ASSERT_EQ(sent.end[1], 2000u);
	ASSERT_EQ(sent.len[2], 800u); /* the two sends' bytes meet in one packet */
	ASSERT_EQ(sent.end[2], 2800u);
	pair_free(w, l, c, a);
}

TEST_MAIN()
