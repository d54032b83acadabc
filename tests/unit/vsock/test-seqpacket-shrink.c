/* SPDX-License-Identifier: MIT */
/*
 * Lowering SO_VM_SOCKETS_BUFFER_SIZE on a live connection (docs/vsock-protocol.md §3, rule 5):
 * a message already started, or bytes send() already accepted, are never stranded by the lower
 * value, on either side; what send() accepts from then on obeys it.
 *
 * The first test is the case the deterministic simulation found (tests/sim, test-sim --seed 711
 * before the fix): a SEQPACKET sender lowered its own buffer while a message was partly sent,
 * its send credit (min(peer buf_alloc, own buf_alloc) - in flight) fell to 0, a SEQPACKET
 * receiver consumes only whole messages, and the connection hung until the close timeout's RST.
 * The receiver tests are the same stall seen from the other end (test-sim --seed 8148 with only
 * the sender side fixed): the receiver lowered its buf_alloc below the part of a message it held.
 */
#include "test.h"
#include "vsock-test-util.h"

static uint8_t buf[65536];

/* Moves one packet of at most cap payload bytes from `from` to `to`; returns its length. */
static ssize_t move_one(struct vsock_engine *from, struct vsock_engine *to, size_t cap)
{
	struct vsock_hdr h;
	struct iovec iov;
	ssize_t n = pull_one(from, &h, buf, cap);

	ASSERT_TRUE(n >= 0);
	iov = (struct iovec){ buf, (size_t)n };
	ASSERT_OK(vsock_engine_feed(to, &h, &iov, 1));
	return n;
}

/* Receives one whole message of len bytes on s, with EOR. */
static void recv_msg(struct vsock_sock *s, size_t len)
{
	int mflags = 0;

	ASSERT_EQ(recv_buf(s, buf, sizeof(buf), 0, &mflags), (ssize_t)len);
	ASSERT_EQ(mflags, VSOCK_MSG_EOR);
}

static struct vsock_sock_info info_of(struct vsock_sock *s)
{
	struct vsock_sock_info i;

	vsock_sock_get_info(s, &i);
	return i;
}

/* A SEQPACKET pair on port; c has sent a 60000-byte message, of which 16 KiB reached a. */
static struct world *half_sent(uint32_t port, struct vsock_sock **l, struct vsock_sock **c,
			       struct vsock_sock **a)
{
	struct world *w = world_new(NULL);

	connect_pair(w, VSOCK_TYPE_SEQPACKET, port, l, c, a);
	ASSERT_EQ(send_buf(*c, buf, 60000, VSOCK_MSG_EOR), 60000);
	ASSERT_EQ(move_one(w->g, w->h, 16384), 16384);
	return w;
}

/* Between messages, cap is the largest message c may send to a, and it goes through. */
static void check_max_msg(struct world *w, struct vsock_sock *c, struct vsock_sock *a,
			  uint32_t cap)
{
	ASSERT_ERR(send_buf(c, buf, cap + 1, VSOCK_MSG_EOR), EMSGSIZE);
	ASSERT_EQ(send_buf(c, buf, cap, VSOCK_MSG_EOR), (ssize_t)cap);
	pump(w);
	recv_msg(a, cap);
}

TEST (seqpacket_message_completes_after_sender_shrinks_buffer) {
	struct vsock_sock *l, *c, *a;
	struct world *w = half_sent(100, &l, &c, &a);

	/* With 16 KiB of the message at the receiver, the sender lowers its own buffer to 16 KiB;
	 * everything is delivered. */
	ASSERT_OK(vsock_sock_setopt(c, VSOCK_OPT_BUFFER_SIZE, 16384));
	pump(w);
	recv_msg(a, 60000);
	pair_free(w, l, c, a);
}

TEST (sender_shrink_applies_to_what_send_accepts_next) {
	struct vsock_sock *l, *c, *a;
	struct world *w = half_sent(101, &l, &c, &a);

	ASSERT_OK(vsock_sock_setopt(c, VSOCK_OPT_BUFFER_SIZE, 16384));
	/* Nothing more is accepted: the own cap (16 KiB) is below the 60000 bytes accepted. */
	ASSERT_EQ(vsock_sock_send_space(c), 0);
	ASSERT_ERR(send_buf(c, buf, 20000, VSOCK_MSG_EOR), EMSGSIZE);
	ASSERT_ERR(send_buf(c, buf, 100, VSOCK_MSG_EOR), EAGAIN);
	pump(w);
	recv_msg(a, 60000);
	pump(w);
	/* The message was read: the new cap is all the credit there is. */
	ASSERT_EQ(vsock_sock_send_space(c), 16384);
	check_max_msg(w, c, a, 16384);
	pair_free(w, l, c, a);
}

TEST (stream_bytes_accepted_before_a_shrink_still_go) {
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	size_t got = 0;

	connect_pair(w, VSOCK_TYPE_STREAM, 102, &l, &c, &a);
	ASSERT_EQ(send_buf(c, buf, 65536, 0), 65536);
	ASSERT_EQ(send_buf(c, buf, 65536, 0), 65536);
	ASSERT_EQ(send_buf(c, buf, 65536, 0), 65536);
	ASSERT_EQ(move_one(w->g, w->h, 65536), 65536);
	ASSERT_OK(vsock_sock_setopt(c, VSOCK_OPT_BUFFER_SIZE, 4096));
	/* Without a read: the accepted bytes are within the peer's credit, so they all go. */
	pump(w);
	ASSERT_EQ(info_of(a).rx_bytes, 3 * 65536);
	ASSERT_EQ(info_of(c).tx_queued, 0);
	ASSERT_EQ(vsock_sock_send_space(c), 0);
	while (got < 3 * 65536) {
		ssize_t n = recv_buf(a, buf, sizeof(buf), 0, NULL);

		ASSERT_TRUE(n > 0);
		got += (size_t)n;
	}
	pump(w);
	ASSERT_EQ(vsock_sock_send_space(c), 4096);
	pair_free(w, l, c, a);
}

TEST (seqpacket_message_completes_after_receiver_shrinks_buffer) {
	struct vsock_sock *l, *c, *a;
	struct world *w = half_sent(103, &l, &c, &a);

	/* The receiver lowers its buffer below the 16 KiB of the message it holds. */
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 8192));
	ASSERT_EQ(move_one(w->h, w->g, 0), 0); /* its CREDIT_UPDATE goes first */
	pump(w);
	recv_msg(a, 60000);
	pump(w);
	/* Between messages the lower value is what the sender sees. */
	ASSERT_EQ(info_of(c).peer_buf_alloc, 8192);
	check_max_msg(w, c, a, 8192);
	pair_free(w, l, c, a);
}

TEST (receiver_shrink_racing_the_first_fragment) {
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_hdr f1, h;
	struct iovec iov;
	ssize_t n;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 104, &l, &c, &a);
	ASSERT_EQ(send_buf(c, buf, 60000, VSOCK_MSG_EOR), 60000);
	/* The first fragment leaves the sender but has not arrived... */
	n = pull_one(w->g, &f1, w->buf, 16384);
	ASSERT_EQ(n, 16384);
	/* ...when the receiver, holding nothing, lowers its buffer and says so. */
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 8192));
	ASSERT_EQ(move_one(w->h, w->g, 0), 0);
	ASSERT_EQ(info_of(c).peer_buf_alloc, 8192);
	/* 16 KiB in flight, credit 0: the sender waits. */
	ASSERT_ERR(pull_one(w->g, &h, buf, sizeof(buf)), EAGAIN);
	/* The fragment arrives: the receiver now holds a partial message and re-opens its credit. */
	iov = (struct iovec){ w->buf, (size_t)n };
	ASSERT_OK(vsock_engine_feed(w->h, &f1, &iov, 1));
	ASSERT_EQ(pull_one(w->h, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_CREDIT_UPDATE);
	ASSERT_EQ(h.buf_alloc, 262144);
	ASSERT_OK(feed_hdr(w->g, &h, NULL));
	pump(w);
	recv_msg(a, 60000);
	pump(w);
	ASSERT_EQ(info_of(c).peer_buf_alloc, 8192);
	pair_free(w, l, c, a);
}

TEST (queued_message_larger_than_a_shrunk_receiver_buffer) {
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_engine_stats st;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 105, &l, &c, &a);
	/* The receiver's lower value reaches the sender before any of the queued message goes. */
	ASSERT_EQ(send_buf(c, buf, 60000, VSOCK_MSG_EOR), 60000);
	ASSERT_OK(vsock_sock_setopt(a, VSOCK_OPT_BUFFER_SIZE, 4096));
	ASSERT_EQ(move_one(w->h, w->g, 0), 0);
	ASSERT_EQ(info_of(c).peer_buf_alloc, 4096);
	pump(w);
	recv_msg(a, 60000);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.credit_violations, 0);
	pump(w);
	check_max_msg(w, c, a, 4096);
	pair_free(w, l, c, a);
}

TEST_MAIN()
