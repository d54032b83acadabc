/* SPDX-License-Identifier: MIT */
/*
 * Engine end-to-end tests: two engines (guest CID 3, host CID 2) wired by a pump loop. STREAM
 * connect/accept/send/recv/close, half-close both ways, refused connects, timeouts with a fake
 * clock, close linger, credit stall/resume and violations, memory bounds, SEQPACKET boundaries,
 * batching equivalence, malformed packets.
 */
#include "vsock-test-util.h"

TEST(stream_connect_send_recv_close)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[64];
	int mf = -1;

	connect_pair(w, VSOCK_TYPE_STREAM, 1234, &l, &c, &a);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLOUT);
	ASSERT_EQ(send_buf(c, "hello", 5, 0), 5);
	ASSERT_ERR(recv_buf(a, buf, sizeof(buf), 0, NULL), EAGAIN);
	pump(w);
	ASSERT_TRUE(vsock_sock_poll(a) & VSOCK_POLLIN);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, &mf), 5);
	ASSERT_EQ(mf, 0);
	ASSERT_MEMEQ(buf, "hello", 5);
	ASSERT_EQ(send_buf(a, "world!", 6, 0), 6);
	pump(w);
	ASSERT_EQ(recv_buf(c, buf, 3, 0, NULL), 3);
	ASSERT_EQ(recv_buf(c, buf + 3, sizeof(buf), 0, NULL), 3);
	ASSERT_MEMEQ(buf, "world!", 6);

	/* Addresses. */
	uint32_t cid, port;
	ASSERT_OK(vsock_sock_peer_addr(c, &cid, &port));
	ASSERT_EQ(cid, 2);
	ASSERT_EQ(port, 1234);
	ASSERT_OK(vsock_sock_peer_addr(a, &cid, &port));
	ASSERT_EQ(cid, 3);
	uint32_t lport;
	ASSERT_OK(vsock_sock_local_addr(c, &cid, &lport));
	ASSERT_EQ(cid, 3);
	ASSERT_EQ(lport, port);

	/* Clean close: SHUTDOWN(3) from c, RST from a's engine (queue empty). */
	vsock_sock_close(c);
	pump(w);
	int sd = log_find_last(w, VSOCK_OP_SHUTDOWN, 0);
	ASSERT_GE(sd, 0);
	ASSERT_EQ(w->log[sd].flags, 3);
	ASSERT_GT(log_find_last(w, VSOCK_OP_RST, 1), sd);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 0); /* EOF */
	ASSERT_ERR(send_buf(a, "x", 1, 0), EPIPE);
	vsock_sock_close(a);
	vsock_sock_close(l);
	pump(w);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.socks_open, 0);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.socks_open, 0);
	ASSERT_EQ(vsock_engine_next_deadline(w->g), UINT64_MAX);
	world_free(w);
}

TEST(every_packet_carries_credit)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[8];

	connect_pair(w, VSOCK_TYPE_STREAM, 99, &l, &c, &a);
	ASSERT_EQ(send_buf(c, "abc", 3, 0), 3);
	pump(w);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 3);
	pump(w);
	vsock_sock_close(c);
	pump(w);
	for (unsigned i = 0; i < w->nlog; i++) {
		ASSERT_EQ(w->log[i].buf_alloc, 262144);
		ASSERT_EQ(w->log[i].src_cid, w->log_from[i] ? 2 : 3);
	}
	/* a consumed 3 bytes and drained its queue: its credit update carried fwd_cnt 3. */
	int cu = log_find_last(w, VSOCK_OP_CREDIT_UPDATE, 1);
	ASSERT_GE(cu, 0);
	ASSERT_EQ(w->log[cu].fwd_cnt, 3);
	vsock_sock_close(a);
	vsock_sock_close(l);
	world_free(w);
}

TEST(connect_refused_no_listener)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *c;

	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, 4444), EINPROGRESS);
	ASSERT_ERR(vsock_sock_connect(c, 2, 4444), EALREADY);
	pump(w);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CLOSED);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLERR);
	ASSERT_EQ(vsock_sock_take_error(c), ECONNRESET);
	ASSERT_EQ(vsock_sock_take_error(c), 0);
	/* The no-socket RST carries zeros and swapped addresses. */
	int r = log_find_last(w, VSOCK_OP_RST, 1);
	ASSERT_GE(r, 0);
	ASSERT_EQ(w->log[r].buf_alloc, 0);
	ASSERT_EQ(w->log[r].fwd_cnt, 0);
	ASSERT_EQ(w->log[r].dst_cid, 3);
	ASSERT_EQ(w->log[r].src_port, 4444);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rx_no_socket, 1);
	/* The timer was cancelled. */
	ASSERT_EQ(vsock_engine_next_deadline(w->g), UINT64_MAX);
	/* A failed connect can be retried. */
	struct vsock_sock *l;
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, 4444));
	ASSERT_OK(vsock_sock_listen(l, 1));
	ASSERT_ERR(vsock_sock_connect(c, 2, 4444), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CONNECTED);
	vsock_sock_close(c);
	vsock_sock_close(l);
	pump(w);
	world_free(w);
}


static void small_buf_listener(struct world *w, uint32_t port, uint64_t bufsize,
			       struct vsock_sock **ret_l, struct vsock_sock **ret_c,
			       struct vsock_sock **ret_a)
{
	struct vsock_sock *l, *c, *a;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_setopt(l, VSOCK_OPT_BUFFER_SIZE, bufsize));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, port));
	ASSERT_OK(vsock_sock_listen(l, 4));
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, port), EINPROGRESS);
	pump(w);
	ASSERT_OK(vsock_sock_accept(l, &a));
	*ret_l = l;
	*ret_c = c;
	*ret_a = a;
}

TEST(half_close_send_side)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[16];

	connect_pair(w, VSOCK_TYPE_STREAM, 80, &l, &c, &a);
	/* Data queued before SHUTDOWN goes out before it. */
	ASSERT_EQ(send_buf(c, "data", 4, 0), 4);
	ASSERT_OK(vsock_sock_shutdown(c, VSOCK_SHUTDOWN_SEND));
	ASSERT_ERR(send_buf(c, "x", 1, 0), EPIPE);
	unsigned first = w->nlog;
	pump(w);
	int rw = log_find_last(w, VSOCK_OP_RW, 0), sd = log_find_last(w, VSOCK_OP_SHUTDOWN, 0);
	ASSERT_GE(rw, (int)first);
	ASSERT_GT(sd, rw);
	ASSERT_EQ(w->log[sd].flags, VSOCK_SHUTDOWN_SEND);
	ASSERT_TRUE(vsock_sock_poll(a) & VSOCK_POLLRDHUP);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 4);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 0);
	/* The other direction still works. */
	ASSERT_EQ(send_buf(a, "back", 4, 0), 4);
	pump(w);
	ASSERT_EQ(recv_buf(c, buf, sizeof(buf), 0, NULL), 4);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CONNECTED);
	/* Flags are sticky: a second SHUTDOWN(SEND) sends nothing. */
	pump(w); /* the credit update for the bytes c just read */
	unsigned before = w->nlog;
	ASSERT_OK(vsock_sock_shutdown(c, VSOCK_SHUTDOWN_SEND));
	pump(w);
	ASSERT_EQ(w->nlog, before);
	/* a finishes too: no RST yet, each side saw only SEND. */
	ASSERT_OK(vsock_sock_shutdown(a, VSOCK_SHUTDOWN_SEND));
	pump(w);
	ASSERT_EQ(recv_buf(c, buf, sizeof(buf), 0, NULL), 0);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLHUP);
	ASSERT_EQ(log_count(w, VSOCK_OP_RST, -1), 0);
	/* close: SHUTDOWN(3) then RST from the peer's engine. */
	vsock_sock_close(c);
	pump(w);
	ASSERT_EQ(log_count(w, VSOCK_OP_RST, 1), 1);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	vsock_sock_close(a);
	vsock_sock_close(l);
	world_free(w);
}

TEST(half_close_receive_side)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[16];

	connect_pair(w, VSOCK_TYPE_STREAM, 81, &l, &c, &a);
	ASSERT_OK(vsock_sock_shutdown(a, VSOCK_SHUTDOWN_RCV));
	pump(w);
	int sd = log_find_last(w, VSOCK_OP_SHUTDOWN, 1);
	ASSERT_GE(sd, 0);
	ASSERT_EQ(w->log[sd].flags, VSOCK_SHUTDOWN_RCV);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 0);
	/* The peer may not send any more: EPIPE. */
	ASSERT_ERR(send_buf(c, "x", 1, 0), EPIPE);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLOUT); /* writable: fails at once */
	/* But a can still send to c. */
	ASSERT_EQ(send_buf(a, "yy", 2, 0), 2);
	pump(w);
	ASSERT_EQ(recv_buf(c, buf, sizeof(buf), 0, NULL), 2);
	ASSERT_ERR(vsock_sock_shutdown(a, 0), EINVAL);
	ASSERT_ERR(vsock_sock_shutdown(a, 4), EINVAL);
	vsock_sock_close(a);
	vsock_sock_close(c);
	pump(w);
	vsock_sock_close(l);
	world_free(w);
}

TEST(shutdown_unconnected_is_enotconn)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *s;

	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &s));
	ASSERT_ERR(vsock_sock_shutdown(s, VSOCK_SHUTDOWN_MASK), ENOTCONN);
	ASSERT_ERR(send_buf(s, "x", 1, 0), ENOTCONN);
	char b[2];
	ASSERT_ERR(recv_buf(s, b, 2, 0, NULL), ENOTCONN);
	vsock_sock_close(s);
	world_free(w);
}

TEST(rst_on_established_is_eof_then_epipe)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[16];

	connect_pair(w, VSOCK_TYPE_STREAM, 82, &l, &c, &a);
	ASSERT_EQ(send_buf(a, "tail", 4, 0), 4);
	pump(w);
	/* Hand-made RST from a's address to c. */
	uint32_t cport, dummy;
	ASSERT_OK(vsock_sock_local_addr(c, &dummy, &cport));
	struct vsock_hdr h = mkhdr(2, 82, 3, cport, VSOCK_TYPE_STREAM, VSOCK_OP_RST);
	ASSERT_OK(feed_hdr(w->g, &h, NULL));
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(c), 0); /* EOF, not ECONNRESET */
	ASSERT_EQ(recv_buf(c, buf, sizeof(buf), 0, NULL), 4);
	ASSERT_EQ(recv_buf(c, buf, sizeof(buf), 0, NULL), 0);
	ASSERT_ERR(send_buf(c, "x", 1, 0), EPIPE);
	ASSERT_ERR(vsock_sock_connect(c, 2, 82), EISCONN);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLIN);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLRDHUP);
	/* The 4-tuple left the connected table: a later packet gets a no-socket RST. */
	h.op = VSOCK_OP_RW;
	h.len = 1;
	(void)feed_hdr(w->g, &h, "z");
	struct vsock_hdr rep;
	ASSERT_EQ(pull_one(w->g, &rep, buf, sizeof(buf)), 0);
	ASSERT_EQ(rep.op, VSOCK_OP_RST);
	ASSERT_EQ(rep.buf_alloc, 0);
	vsock_sock_close(c); /* nothing more to send: the peer already reset */
	ASSERT_EQ(pull_one(w->g, &rep, buf, sizeof(buf)), -EAGAIN);
	vsock_sock_close(a);
	vsock_sock_close(l);
	pump(w);
	world_free(w);
}

TEST(peer_full_shutdown_with_unread_data_waits_for_close)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[16];

	connect_pair(w, VSOCK_TYPE_STREAM, 83, &l, &c, &a);
	ASSERT_EQ(send_buf(c, "unread", 6, 0), 6);
	vsock_sock_close(c); /* SHUTDOWN(3) after the data */
	pump(w);
	/* a has unread data: no RST yet, c lingers. */
	ASSERT_EQ(log_count(w, VSOCK_OP_RST, -1), 0);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 6);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 0);
	/* close() after the peer's full shutdown: RST at once, c's engine finishes. */
	vsock_sock_close(a);
	pump(w);
	ASSERT_EQ(log_count(w, VSOCK_OP_RST, 1), 1);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.socks_open, 0);
	ASSERT_EQ(vsock_engine_next_deadline(w->g), UINT64_MAX);
	vsock_sock_close(l);
	world_free(w);
}

TEST(connect_timeout_fake_clock)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *c, *d;
	struct vsock_hdr h;
	uint8_t buf[8];
	uint64_t t0 = w->now, v = 0;

	/* Queued REQUEST never pulled: cancelled silently on timeout. */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, 5555), EINPROGRESS);
	ASSERT_EQ(vsock_engine_next_deadline(w->g), t0 + 2000000000ull);
	w->now = t0 + 2000000000ull - 1;
	vsock_engine_run_timers(w->g);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CONNECTING);
	w->now = t0 + 2000000000ull;
	vsock_engine_run_timers(w->g);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(c), ETIMEDOUT);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), -EAGAIN);

	/* Custom timeout; REQUEST sent but unanswered: RST on timeout. 0 resets to 2 s. */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &d));
	ASSERT_OK(vsock_sock_setopt(d, VSOCK_OPT_CONNECT_TIMEOUT, 500000000ull));
	ASSERT_OK(vsock_sock_getopt(d, VSOCK_OPT_CONNECT_TIMEOUT, &v));
	ASSERT_EQ(v, 500000000ull);
	ASSERT_ERR(vsock_sock_connect(d, 2, 5556), EINPROGRESS);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(h.buf_alloc, 262144);
	w->now += 500000000ull;
	vsock_engine_run_timers(w->g);
	ASSERT_EQ(vsock_sock_take_error(d), ETIMEDOUT);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.dst_port, 5556);
	/* A late RESPONSE hits a closed socket: no-socket RST back. */
	struct vsock_hdr resp = mkhdr(2, 5556, 3, h.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_RESPONSE);
	(void)feed_hdr(w->g, &resp, NULL);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(vsock_sock_state(d), VSOCK_SS_CLOSED);
	ASSERT_OK(vsock_sock_setopt(d, VSOCK_OPT_CONNECT_TIMEOUT, 0));
	ASSERT_OK(vsock_sock_getopt(d, VSOCK_OPT_CONNECT_TIMEOUT, &v));
	ASSERT_EQ(v, 2000000000ull);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.connects_timed_out, 2);
	vsock_sock_close(c);
	vsock_sock_close(d);
	world_free(w);
}

TEST(close_linger_8s_then_rst)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_hdr h;
	uint8_t buf[8];

	connect_pair(w, VSOCK_TYPE_STREAM, 84, &l, &c, &a);
	uint64_t t0 = w->now;
	vsock_sock_close(c);
	/* The SHUTDOWN(3) is lost: the peer never answers. */
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(h.flags, 3);
	ASSERT_EQ(vsock_engine_next_deadline(w->g), t0 + 8000000000ull);
	w->now = t0 + 8000000000ull - 1;
	vsock_engine_run_timers(w->g);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), -EAGAIN);
	w->now = t0 + 8000000000ull;
	vsock_engine_run_timers(w->g);
	ASSERT_EQ(pull_one(w->g, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.buf_alloc, 262144); /* a socket RST carries our credit */
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.close_timeouts, 1);
	ASSERT_EQ(st.socks_open, 0);
	/* The RST reaches a: EOF. */
	struct iovec iov = {buf, 0};
	ASSERT_OK(vsock_engine_feed(w->h, &h, &iov, 0));
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	vsock_sock_close(a);
	vsock_sock_close(l);
	world_free(w);
}

TEST(zero_credit_stall_and_resume)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char big[10000], got[10000];
	struct vsock_engine_stats st;

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7);
	small_buf_listener(w, 85, 4096, &l, &c, &a);
	ASSERT_EQ(vsock_sock_send_space(c), 4096);
	ASSERT_EQ(send_buf(c, big, sizeof(big), 0), 4096);
	ASSERT_ERR(send_buf(c, big, sizeof(big), 0), EAGAIN);
	ASSERT_FALSE(vsock_sock_poll(c) & VSOCK_POLLOUT);
	vsock_engine_get_stats(w->g, &st);
	ASSERT_GE(st.credit_stalls, 1);
	pump(w);
	ASSERT_ERR(send_buf(c, big, sizeof(big), 0), EAGAIN);
	/* The reader takes 1000 bytes: free space 3096 < 64 KiB, so a credit update goes. */
	ASSERT_EQ(recv_buf(a, got, 1000, 0, NULL), 1000);
	unsigned ev = w_events(w);
	pump(w);
	ASSERT_GT(w_events(w), ev);
	ASSERT_TRUE(vsock_sock_poll(c) & VSOCK_POLLOUT);
	ASSERT_EQ(vsock_sock_send_space(c), 1000);
	size_t sent = 4096, rcvd = 1000;
	while (rcvd < sizeof(big)) {
		ssize_t n = send_buf(c, big + sent, sizeof(big) - sent, 0);
		if (n > 0)
			sent += (size_t)n;
		pump(w);
		ssize_t m = recv_buf(a, got + rcvd, sizeof(got) - rcvd, 0, NULL);
		ASSERT_GT(m, 0);
		rcvd += (size_t)m;
		pump(w);
	}
	ASSERT_MEMEQ(got, big, sizeof(big));
	pair_free(w, l, c, a);
}

TEST(credit_update_only_when_needed)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char big[250000];
	struct vsock_hdr h;
	uint8_t tmp[8];

	connect_pair(w, VSOCK_TYPE_STREAM, 86, &l, &c, &a);
	ASSERT_EQ(send_buf(c, big, sizeof(big), 0), (ssize_t)sizeof(big));
	pump(w);
	/* Consumed 196608 = buf_alloc - 64 KiB unannounced, data left: no update. */
	ASSERT_EQ(recv_buf(a, big, 196608, 0, NULL), 196608);
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), -EAGAIN);
	/* One more byte crosses the threshold. */
	ASSERT_EQ(recv_buf(a, big, 1, 0, NULL), 1);
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_CREDIT_UPDATE);
	ASSERT_EQ(h.fwd_cnt, 196609);
	/* Peeking consumes nothing; draining the queue sends one. */
	ASSERT_EQ(recv_buf(a, big, 10, VSOCK_MSG_PEEK, NULL), 10);
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), -EAGAIN);
	ASSERT_EQ(recv_buf(a, big, sizeof(big), 0, NULL), 250000 - 196609);
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_CREDIT_UPDATE);
	ASSERT_EQ(h.fwd_cnt, 250000);
	/* CREDIT_REQUEST is always answered. */
	uint32_t cport, cc;
	ASSERT_OK(vsock_sock_local_addr(c, &cc, &cport));
	struct vsock_hdr rq = mkhdr(3, cport, 2, 86, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_REQUEST);
	rq.fwd_cnt = 0;
	ASSERT_OK(feed_hdr(w->h, &rq, NULL));
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_CREDIT_UPDATE);
	/* We may ask for credit ourselves; the peer engine answers. */
	ASSERT_OK(vsock_sock_request_credit(c));
	unsigned before = w->nlog;
	pump(w);
	ASSERT_EQ(w->nlog, before + 2);
	ASSERT_EQ(w->log[before].op, VSOCK_OP_CREDIT_REQUEST);
	ASSERT_EQ(w->log[before + 1].op, VSOCK_OP_CREDIT_UPDATE);
	struct vsock_engine_stats st;
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.credit_requests_sent, 1);
	/* A buffer-size change is announced at once. */
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 100000));
	ASSERT_EQ(pull_one(w->h, &h, tmp, sizeof(tmp)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_CREDIT_UPDATE);
	ASSERT_EQ(h.buf_alloc, 100000);
	/* Clamped to max: 1 MiB asked, 256 KiB max. */
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 1 << 20));
	uint64_t v;
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_BUFFER_SIZE, &v));
	ASSERT_EQ(v, 262144);
	pair_free(w, l, c, a);
}

TEST(peer_shrinks_buf_alloc_with_bytes_in_flight)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char big[100000];
	struct vsock_sock_info info;

	connect_pair(w, VSOCK_TYPE_STREAM, 87, &l, &c, &a);
	ASSERT_EQ(send_buf(c, big, sizeof(big), 0), (ssize_t)sizeof(big));
	pump(w);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 4096));
	pump(w);
	vsock_sock_get_info(c, &info);
	ASSERT_EQ(info.peer_buf_alloc, 4096);
	ASSERT_EQ(vsock_sock_send_space(c), 0);
	ASSERT_ERR(send_buf(c, big, 1, 0), EAGAIN);
	/* The in-flight bytes were within what a had promised: no reset. */
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	ASSERT_EQ(recv_buf(a, big, sizeof(big), 0, NULL), (ssize_t)sizeof(big));
	pump(w);
	ASSERT_EQ(vsock_sock_send_space(c), 4096);
	/* Sending beyond the new, smaller credit is still refused locally. */
	ASSERT_EQ(send_buf(c, big, 5000, 0), 4096);
	pump(w);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	pair_free(w, l, c, a);
}

TEST(credit_violation_resets)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char p[5000];
	struct vsock_hdr h, rep;
	uint32_t cport, cc;
	struct vsock_engine_stats st;

	small_buf_listener(w, 88, 4096, &l, &c, &a);
	ASSERT_OK(vsock_sock_local_addr(c, &cc, &cport));
	h = mkhdr(3, cport, 2, 88, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = 4000;
	ASSERT_OK(feed_hdr(w->h, &h, p));
	h.len = 200; /* 4200 > 4096 */
	ASSERT_ERR(feed_hdr(w->h, &h, p), ENOBUFS);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	ASSERT_TRUE(vsock_sock_poll(a) & VSOCK_POLLERR);
	ASSERT_EQ(vsock_sock_take_error(a), ENOBUFS);
	ASSERT_EQ(pull_one(w->h, &rep, p, sizeof(p)), 0);
	ASSERT_EQ(rep.op, VSOCK_OP_RST);
	ASSERT_EQ(rep.buf_alloc, 4096);
	/* What was within credit stays readable, then EOF. */
	ASSERT_EQ(recv_buf(a, p, sizeof(p), 0, NULL), 4000);
	ASSERT_EQ(recv_buf(a, p, sizeof(p), 0, NULL), 0);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.credit_violations, 1);
	pair_free(w, l, c, a);
}

TEST(backlog_overflow_gets_rst)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *cl[4], *acc;
	struct vsock_engine_stats st;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, 90));
	ASSERT_OK(vsock_sock_listen(l, 1)); /* backlog 1: up to 2 pending */
	for (int i = 0; i < 3; i++) {
		ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &cl[i]));
		ASSERT_ERR(vsock_sock_connect(cl[i], 2, 90), EINPROGRESS);
		pump(w);
	}
	ASSERT_EQ(vsock_sock_state(cl[0]), VSOCK_SS_CONNECTED);
	ASSERT_EQ(vsock_sock_state(cl[1]), VSOCK_SS_CONNECTED);
	ASSERT_EQ(vsock_sock_state(cl[2]), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(cl[2]), ECONNRESET);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.backlog_refused, 1);
	ASSERT_TRUE(vsock_sock_poll(l) & VSOCK_POLLIN);
	ASSERT_OK(vsock_sock_accept(l, &acc));
	vsock_sock_close(acc);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &cl[3]));
	ASSERT_ERR(vsock_sock_connect(cl[3], 2, 90), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(cl[3]), VSOCK_SS_CONNECTED);
	/* Closing the listener closes its queued children. */
	vsock_sock_close(l);
	pump(w);
	ASSERT_EQ(vsock_sock_state(cl[1]), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_state(cl[3]), VSOCK_SS_CLOSED);
	for (int i = 0; i < 4; i++)
		vsock_sock_close(cl[i]);
	pump(w);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.socks_open, 0);
	vsock_engine_get_stats(w->g, &st);
	ASSERT_EQ(st.socks_open, 0);
	world_free(w);
}

TEST(bind_and_listen_errors)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *a, *b, *c;
	uint32_t cid, port;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &a));
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &b));
	ASSERT_ERR(vsock_sock_new(w->h, 4, &c), ESOCKTNOSUPPORT);
	ASSERT_ERR(vsock_sock_new(w->h, VSOCK_TYPE_DGRAM, &c), ENODEV); /* not negotiated */
	ASSERT_OK(vsock_sock_local_addr(a, &cid, &port));
	ASSERT_EQ(cid, VMADDR_CID_ANY);
	ASSERT_EQ(port, VMADDR_PORT_ANY);
	ASSERT_ERR(vsock_sock_peer_addr(a, &cid, &port), ENOTCONN);
	ASSERT_ERR(vsock_sock_bind(a, 77, 100), EADDRNOTAVAIL);
	ASSERT_OK(vsock_sock_bind(a, 2, 100));
	ASSERT_ERR(vsock_sock_bind(a, 2, 101), EINVAL);
	ASSERT_ERR(vsock_sock_bind(b, VMADDR_CID_ANY, 100), EADDRINUSE);
	ASSERT_OK(vsock_sock_bind(b, VMADDR_CID_ANY, VMADDR_PORT_ANY));
	ASSERT_OK(vsock_sock_local_addr(b, &cid, &port));
	ASSERT_GE(port, 1024);
	ASSERT_OK(vsock_sock_listen(a, 10));
	ASSERT_ERR(vsock_sock_connect(a, 3, 5), EINVAL);
	struct vsock_sock *acc;
	ASSERT_ERR(vsock_sock_accept(a, &acc), EAGAIN);
	ASSERT_ERR(vsock_sock_accept(b, &acc), EINVAL);
	char x[4];
	ASSERT_ERR(recv_buf(a, x, sizeof(x), 0, NULL), EINVAL);
	ASSERT_ERR(vsock_sock_connect(b, VMADDR_CID_ANY, 5), ENETUNREACH);
	vsock_sock_close(a);
	vsock_sock_close(b);
	/* After close the port is free again. */
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &a));
	ASSERT_OK(vsock_sock_bind(a, VMADDR_CID_ANY, 100));
	vsock_sock_close(a);
	world_free(w);
}

static void tiny_socks(struct vsock_engine_config *cfg)
{
	cfg->max_socks = 3;
	cfg->seqpacket = false;
}

TEST(max_socks_and_seqpacket_feature)
{
	struct world *w = world_new(tiny_socks);
	struct vsock_sock *s[4];

	for (int i = 0; i < 3; i++)
		ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &s[i]));
	ASSERT_ERR(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &s[3]), EMFILE);
	vsock_sock_close(s[2]);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_SEQPACKET, &s[2]));
	ASSERT_ERR(vsock_sock_connect(s[2], 2, 5), EPROTONOSUPPORT);
	ASSERT_ERR(vsock_sock_listen(s[2], 5), EPROTONOSUPPORT);
	for (int i = 0; i < 3; i++)
		vsock_sock_close(s[i]);
	world_free(w);
}

static void port_range(struct vsock_engine_config *cfg)
{
	cfg->port_lo = 1u << 30;
	cfg->port_hi = (1u << 31) - 1;
}

TEST(device_port_range)
{
	struct world *w = world_new(port_range);
	for (int i = 0; i < 50; i++) {
		struct vsock_sock *s;
		uint32_t cid, port;

		ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &s));
		ASSERT_ERR(vsock_sock_connect(s, 3, 1000 + i), EINPROGRESS);
		ASSERT_OK(vsock_sock_local_addr(s, &cid, &port));
		ASSERT_GE(port, 1u << 30);
		ASSERT_LT(port, 1u << 31);
		vsock_sock_close(s);
	}
	world_free(w);
}


TEST(rcvlowat_and_buffer_options)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char buf[64];
	uint64_t v;

	connect_pair(w, VSOCK_TYPE_STREAM, 91, &l, &c, &a);
	ASSERT_ERR(vsock_sock_setopt(a, VSOCK_OPT_RCVLOWAT, 262145), EINVAL);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_RCVLOWAT, 0));
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_RCVLOWAT, &v));
	ASSERT_EQ(v, 1);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_RCVLOWAT, 10));
	ASSERT_EQ(send_buf(c, "12345", 5, 0), 5);
	pump(w);
	/* Below rcvlowat: not readable, but a recv returns what is queued (Linux's
	 * vsock_connectible_wait_data; the rcvlowat wait is the blocking caller's). */
	ASSERT_FALSE(vsock_sock_poll(a) & VSOCK_POLLIN);
	ASSERT_EQ(recv_buf(a, buf, 2, 0, NULL), 2);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 3);
	ASSERT_ERR(recv_buf(a, buf, sizeof(buf), 0, NULL), EAGAIN);
	ASSERT_EQ(send_buf(c, "6789012345", 10, 0), 10);
	pump(w);
	ASSERT_TRUE(vsock_sock_poll(a) & VSOCK_POLLIN);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 10);
	/* At EOF, less than rcvlowat is returned. */
	ASSERT_EQ(send_buf(c, "xy", 2, 0), 2);
	ASSERT_OK(vsock_sock_shutdown(c, VSOCK_SHUTDOWN_SEND));
	pump(w);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 2);
	ASSERT_EQ(recv_buf(a, buf, sizeof(buf), 0, NULL), 0);

	/* Clamping: to the max first, then to the min (Linux order); max changes re-clamp. */
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_MAX_SIZE, 1 << 20));
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 1 << 19));
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_BUFFER_SIZE, &v));
	ASSERT_EQ(v, 1 << 19);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_MAX_SIZE, 4096));
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_BUFFER_SIZE, &v));
	ASSERT_EQ(v, 4096);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 1));
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_BUFFER_SIZE, &v));
	ASSERT_EQ(v, 128);
	ASSERT_OK(vsock_sock_getopt(a, VSOCK_OPT_BUFFER_MIN_SIZE, &v));
	ASSERT_EQ(v, 128);
	ASSERT_ERR(vsock_sock_setopt(a, (enum vsock_sockopt)77, 1), ENOPROTOOPT);
	ASSERT_ERR(vsock_sock_getopt(a, (enum vsock_sockopt)77, &v), ENOPROTOOPT);
	struct vsock_sock_info info;
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.buf_alloc, 128);
	pair_free(w, l, c, a);
}

TEST_MAIN()
