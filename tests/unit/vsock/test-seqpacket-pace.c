/* SPDX-License-Identifier: MIT */
/*
 * The per-packet overhead of SEQPACKET receive queues (docs/vsock-protocol.md §3 "Per-packet
 * overhead", §4): a sender that respects only the byte credit and floods small messages is
 * reset as Linux 6.12.92+ resets it (RST, ENOBUFS), while our own sender paces its messages and
 * is never reset, however slowly the reader reads; a message as large as the peer's buffer
 * still goes once nothing is outstanding.
 */
#include "test.h"
#include "vsock-test-util.h"
#include "vsock/credit.h"

#define BUF 16384u

static uint8_t buf[65536];

static void small_buf(struct vsock_engine_config *cfg)
{
	cfg->buf_size = BUF;
}

static uint64_t mem_resets(struct vsock_engine *e)
{
	struct vsock_engine_stats st;

	vsock_engine_get_stats(e, &st);
	return st.rx_mem_resets;
}

static struct vsock_sock_info info_of(struct vsock_sock *s)
{
	struct vsock_sock_info i;

	vsock_sock_get_info(s, &i);
	return i;
}

/* Whole messages the receiver may queue before the next one is refused: (n + 1) * 576 > BUF. */
static unsigned rx_bound(void)
{
	return BUF / 576u;
}

/* Messages of one byte our sender lets out to an idle reader: k * (768 + 1) <= BUF. */
static unsigned tx_paced(void)
{
	return BUF / (VSOCK_TX_PKT_COST + 1u);
}

/* Receives one message on s and checks it is `len` bytes of `fill`, with EOR. */
static void recv_msg(struct vsock_sock *s, size_t len, uint8_t fill)
{
	int mflags = 0;

	ASSERT_EQ(recv_buf(s, buf, sizeof(buf), 0, &mflags), (ssize_t)len);
	ASSERT_EQ(mflags, VSOCK_MSG_EOR);
	for (size_t i = 0; i < len; i++)
		ASSERT_EQ(buf[i], fill);
}

/*
 * Sends messages sent..total-1 of len bytes, message i filled with (uint8_t)i, until send()
 * says -EAGAIN. Returns the new count of messages sent.
 */
static unsigned send_until_full(struct vsock_sock *c, unsigned sent, unsigned total, size_t len)
{
	uint8_t m[64];

	for (; sent < total; sent++) {
		ssize_t r;

		memset(m, (int)(sent & 0xff), len);
		r = send_buf(c, m, len, VSOCK_MSG_EOR);
		if (r == -EAGAIN)
			break;
		ASSERT_EQ(r, (ssize_t)len);
	}
	return sent;
}

TEST (unpaced_sender_is_reset_as_linux_resets_it) {
	struct world *w = world_new(small_buf);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info ci;
	struct vsock_hdr h;
	uint8_t one = 7;
	unsigned i;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 100, &l, &c, &a);
	ci = info_of(c);
	/* Raw one-byte messages, well within the byte credit, with no regard for the overhead. */
	for (i = 0; i < rx_bound(); i++) {
		h = mkhdr(3, ci.local_port, 2, 100, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RW);
		h.len = 1;
		h.flags = VSOCK_SEQ_EOM | VSOCK_SEQ_EOR;
		h.buf_alloc = BUF;
		ASSERT_OK(feed_hdr(w->h, &h, &one));
	}
	ASSERT_EQ(info_of(a).rx_bytes, rx_bound());
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	/* One more: (queued + 1) * 576 > buf_alloc, the connection is reset. */
	ASSERT_TRUE(feed_hdr(w->h, &h, &one) < 0);
	ASSERT_EQ(mem_resets(w->h), 1);
	ASSERT_EQ(vsock_sock_take_error(a), ENOBUFS);
	ASSERT_EQ(pull_one(w->h, &h, buf, sizeof(buf)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	pair_free(w, l, c, a);
}

/*
 * A writer sends `total` messages of `len` bytes as fast as send() takes them, a slow reader
 * reads `per_round` per round: every message arrives, in order, and nothing is ever reset. With
 * `cap` (the buffer, or 0 for no check) the receiver never holds more whole messages than the
 * pacing lets out for that buffer, fewer than its own bound, and exactly that many at first.
 */
static void slow_reader(struct world *w, unsigned total, size_t len, unsigned per_round,
			unsigned cap)
{
	struct vsock_sock *l, *c, *a;
	unsigned sent = 0, got = 0;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 100, &l, &c, &a);
	while (got < total) {
		sent = send_until_full(c, sent, total, len);
		pump(w);
		ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
		ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CONNECTED);
		if (cap) {
			ASSERT_TRUE(info_of(a).rx_bytes <= tx_paced() * len);
			ASSERT_TRUE(tx_paced() < rx_bound());
		}
		if (cap && got == 0)
			ASSERT_EQ(info_of(a).rx_bytes,
				  (tx_paced() < total ? tx_paced() : total) * len);
		for (unsigned k = 0; k < per_round && got < total; k++, got++)
			recv_msg(a, len, (uint8_t)got);
	}
	pump(w);
	ASSERT_EQ(info_of(a).rx_bytes, 0);
	ASSERT_EQ(mem_resets(w->h), 0);
	ASSERT_EQ(mem_resets(w->g), 0);
	pair_free(w, l, c, a);
}

TEST (paced_sender_waits_for_a_slow_reader_and_is_never_reset) {
	slow_reader(world_new(small_buf), 300, 1, 1, BUF);
}

TEST (many_small_messages_with_default_buffers) {
	slow_reader(world_new(NULL), 3000, 64, 3, 0);
}

TEST (message_as_large_as_the_buffer_goes_once_nothing_is_outstanding) {
	struct world *w = world_new(small_buf);
	struct vsock_sock *l, *c, *a;
	uint8_t b = 1;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 100, &l, &c, &a);
	ASSERT_EQ(send_buf(c, &b, 1, VSOCK_MSG_EOR), 1);
	pump(w);
	ASSERT_EQ(info_of(a).rx_bytes, 1);
	/* One byte in flight: send() takes what the byte credit allows, pull waits for the
	 * pacing ((1 + 1) * 768 + 1 + BUF - 1 > BUF) until the first message is read. */
	ASSERT_ERR(send_buf(c, buf, BUF, VSOCK_MSG_EOR), EAGAIN);
	ASSERT_EQ(send_buf(c, buf, BUF - 1, VSOCK_MSG_EOR), (ssize_t)(BUF - 1));
	pump(w);
	ASSERT_EQ(info_of(a).rx_bytes, 1);
	recv_msg(a, 1, 1);
	pump(w);
	memset(buf, 0, BUF);
	recv_msg(a, BUF - 1, 0);
	pump(w); /* the reader's credit update */
	/* Nothing outstanding: the full buffer goes in one message. */
	ASSERT_EQ(send_buf(c, buf, BUF, VSOCK_MSG_EOR), (ssize_t)BUF);
	pump(w);
	recv_msg(a, BUF, 0);
	ASSERT_EQ(mem_resets(w->h), 0);
	pair_free(w, l, c, a);
}

TEST_MAIN()
