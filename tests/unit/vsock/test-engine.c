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

TEST_MAIN()
