/* SPDX-License-Identifier: MIT */
/*
 * Engine data-path tests: SEQPACKET boundaries, truncation, EOR and all-or-nothing sends over a
 * small max_payload (messages split into several packets), receive memory bounds under floods of
 * tiny packets (STREAM never reset, SEQPACKET reset), the small-payload merge, and feed_batch
 * having the same semantics as one feed per packet.
 */
#include "vsock-test-util.h"

TEST(seqpacket_boundaries_eor_split)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char msg[2500], got[4096];
	int mf = -1;

	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = (char)(i * 13 + 1);
	connect_pair(w, VSOCK_TYPE_SEQPACKET, 300, &l, &c, &a);
	w->max_payload = 1000;
	unsigned first = w->nlog;
	ASSERT_EQ(send_buf(c, msg, sizeof(msg), VSOCK_MSG_EOR), (ssize_t)sizeof(msg));
	ASSERT_EQ(send_buf(c, "ten bytes!", 10, 0), 10);
	/* Nothing readable while only part of the first message has arrived. */
	struct vsock_hdr h;
	uint8_t pb[1000];
	ASSERT_EQ(pull_one(w->g, &h, pb, sizeof(pb)), 1000);
	ASSERT_EQ(h.flags, 0);
	struct iovec iov = {pb, 1000};
	ASSERT_OK(vsock_engine_feed(w->h, &h, &iov, 1));
	ASSERT_ERR(recv_buf(a, got, sizeof(got), 0, NULL), EAGAIN);
	ASSERT_FALSE(vsock_sock_poll(a) & VSOCK_POLLIN);
	pump(w);
	/* On the wire: 1000, 1000 (no flags), 500 EOM|EOR, then 10 EOM. */
	unsigned rw = 0;
	uint32_t lens[8], flags[8];
	for (unsigned i = first; i < w->nlog; i++) {
		if (w->log[i].op == VSOCK_OP_RW && w->log_from[i] == 0 && rw < 8) {
			lens[rw] = w->log[i].len;
			flags[rw] = w->log[i].flags;
			rw++;
		}
	}
	/* The first packet was moved by hand above, so the log starts at the second. */
	ASSERT_EQ(rw, 3);
	ASSERT_EQ(lens[0], 1000);
	ASSERT_EQ(flags[0], 0);
	ASSERT_EQ(lens[1], 500);
	ASSERT_EQ(flags[1], VSOCK_SEQ_EOM | VSOCK_SEQ_EOR);
	ASSERT_EQ(lens[2], 10);
	ASSERT_EQ(flags[2], VSOCK_SEQ_EOM);

	ASSERT_TRUE(vsock_sock_poll(a) & VSOCK_POLLIN);
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, &mf), 2500);
	ASSERT_EQ(mf, VSOCK_MSG_EOR);
	ASSERT_MEMEQ(got, msg, sizeof(msg));
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, &mf), 10);
	ASSERT_EQ(mf, 0);
	ASSERT_MEMEQ(got, "ten bytes!", 10);
	ASSERT_ERR(recv_buf(a, got, sizeof(got), 0, &mf), EAGAIN);
	/* Every dequeued message sends a credit update. */
	pump(w);
	ASSERT_EQ(log_count(w, VSOCK_OP_CREDIT_UPDATE, 1), 1);
	pair_free(w, l, c, a);
}

TEST(seqpacket_truncation)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	char got[200];
	static char msg[100];
	int mf;

	memset(msg, 'm', sizeof(msg));
	connect_pair(w, VSOCK_TYPE_SEQPACKET, 301, &l, &c, &a);
	ASSERT_EQ(send_buf(c, msg, 100, 0), 100);
	ASSERT_EQ(send_buf(c, msg, 100, VSOCK_MSG_EOR), 100);
	ASSERT_EQ(send_buf(c, "next", 4, 0), 4);
	pump(w);
	/* Short buffer: 40 bytes, MSG_TRUNC, the rest of the message is discarded. */
	ASSERT_EQ(recv_buf(a, got, 40, 0, &mf), 40);
	ASSERT_EQ(mf, VSOCK_MSG_TRUNC);
	/* MSG_TRUNC in flags: the real length is returned. */
	ASSERT_EQ(recv_buf(a, got, 40, VSOCK_MSG_TRUNC, &mf), 100);
	ASSERT_EQ(mf, VSOCK_MSG_TRUNC | VSOCK_MSG_EOR);
	/* Peek leaves the message queued. */
	ASSERT_EQ(recv_buf(a, got, sizeof(got), VSOCK_MSG_PEEK, &mf), 4);
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, &mf), 4);
	ASSERT_MEMEQ(got, "next", 4);
	struct vsock_sock_info info;
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, 0);
	ASSERT_EQ(info.fwd_cnt, 204);
	ASSERT_EQ(info.rx_mem, 0);
	pair_free(w, l, c, a);
}

TEST(seqpacket_emsgsize_and_all_or_nothing)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	static char big[262145];

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_SEQPACKET, &l));
	ASSERT_OK(vsock_sock_setopt(l, VSOCK_OPT_BUFFER_SIZE, 4096));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, 302));
	ASSERT_OK(vsock_sock_listen(l, 4));
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_SEQPACKET, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, 302), EINPROGRESS);
	pump(w);
	ASSERT_OK(vsock_sock_accept(l, &a));
	/* Max message = min(peer buf_alloc 4096, own 256 KiB). */
	ASSERT_ERR(send_buf(c, big, 4097, 0), EMSGSIZE);
	ASSERT_EQ(send_buf(c, big, 3000, 0), 3000);
	ASSERT_ERR(send_buf(c, big, 2000, 0), EAGAIN); /* 1096 left: nothing partial */
	ASSERT_EQ(send_buf(c, big, 1096, 0), 1096);
	ASSERT_EQ(send_buf(c, big, 0, 0), 0); /* empty message: nothing sent, as Linux */
	pump(w);
	char got[4096];
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, NULL), 3000);
	pump(w);
	ASSERT_EQ(send_buf(c, big, 2000, 0), 2000);
	/* Own buffer smaller than the peer's also caps the message size. */
	ASSERT_ERR(send_buf(a, big, 262145, 0), EMSGSIZE);
	pair_free(w, l, c, a);
}

/* Feeds 1-byte RW packets of `type` from the client's address to the accepted socket. */
static int feed_tiny(struct world *w, struct vsock_sock *c, uint32_t port, unsigned type,
		     uint32_t len, uint32_t flags)
{
	static char p[4096];
	uint32_t cid, cport;
	struct vsock_hdr h;

	ASSERT_OK(vsock_sock_local_addr(c, &cid, &cport));
	h = mkhdr(3, cport, 2, port, type, VSOCK_OP_RW);
	h.len = len;
	h.flags = flags;
	return feed_hdr(w->h, &h, p);
}

TEST(stream_one_byte_flood_memory_bound)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	struct vsock_engine_stats st;

	connect_pair(w, VSOCK_TYPE_STREAM, 303, &l, &c, &a);
	for (uint32_t i = 0; i < 262144; i++) {
		ASSERT_OK(feed_tiny(w, c, 303, VSOCK_TYPE_STREAM, 1, 0));
		if ((i & 4095) == 0) {
			vsock_sock_get_info(a, &info);
			ASSERT_LE(info.rx_mem, 2 * 262144 + 65536);
		}
	}
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, 262144);
	/* Merged into 4 KiB chunks: barely more than the bytes themselves. */
	ASSERT_LE(info.rx_mem, 262144 + 262144 / 16);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	/* The next byte exceeds the credit. */
	ASSERT_ERR(feed_tiny(w, c, 303, VSOCK_TYPE_STREAM, 1, 0), ENOBUFS);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.credit_violations, 1);
	ASSERT_EQ(st.rx_mem_resets, 0);
	pair_free(w, l, c, a);
}

TEST(stream_mixed_size_flood_is_compacted_not_reset)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	struct vsock_engine_stats st;
	uint32_t total = 0;
	static char rd[4096];

	connect_pair(w, VSOCK_TYPE_STREAM, 304, &l, &c, &a);
	/* 129-byte packets get exact chunks, each followed by a 1-byte packet that would start a
	 * 4 KiB chunk: the worst case for the merge; and the reader nibbles from the front. */
	for (int i = 0; total + 130 <= 262144; i++) {
		ASSERT_OK(feed_tiny(w, c, 304, VSOCK_TYPE_STREAM, 129, 0));
		ASSERT_OK(feed_tiny(w, c, 304, VSOCK_TYPE_STREAM, 1, 0));
		total += 130;
		vsock_sock_get_info(a, &info);
		ASSERT_LE(info.rx_mem, 2 * 262144 + 65536 + 256);
		if (i % 64 == 63) {
			ssize_t n = recv_buf(a, rd, 7, 0, NULL);
			ASSERT_EQ(n, 7);
			total -= 7;
		}
	}
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rx_mem_resets, 0);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_bytes, total);
	pair_free(w, l, c, a);
}

TEST(seqpacket_tiny_message_flood_is_reset)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	struct vsock_engine_stats st;
	int r = 0;
	uint32_t i;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 305, &l, &c, &a);
	for (i = 0; i < 262144; i++) {
		r = feed_tiny(w, c, 305, VSOCK_TYPE_SEQPACKET, 1, VSOCK_SEQ_EOM);
		if (r < 0)
			break;
		vsock_sock_get_info(a, &info);
		ASSERT_LE(info.rx_mem, 2 * 262144 + 65536 + 256);
	}
	ASSERT_ERR(r, ENOBUFS);
	ASSERT_LT(i, 262144);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rx_mem_resets, 1);
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CLOSED);
	ASSERT_EQ(vsock_sock_take_error(a), ENOBUFS);
	struct vsock_hdr h;
	char b[8];
	ASSERT_EQ(pull_one(w->h, &h, b, sizeof(b)), 0);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	pair_free(w, l, c, a);
}

TEST(small_payload_merge_respects_message_boundary)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct vsock_sock_info info;
	char got[64];
	int mf;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 306, &l, &c, &a);
	/* Fragments of one message merge; the next message never joins it. */
	ASSERT_OK(feed_tiny(w, c, 306, VSOCK_TYPE_SEQPACKET, 10, 0));
	vsock_sock_get_info(a, &info);
	uint32_t one_chunk = info.rx_mem;
	ASSERT_OK(feed_tiny(w, c, 306, VSOCK_TYPE_SEQPACKET, 10, VSOCK_SEQ_EOM));
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.rx_mem, one_chunk); /* merged into the tail */
	ASSERT_OK(feed_tiny(w, c, 306, VSOCK_TYPE_SEQPACKET, 5, VSOCK_SEQ_EOM | VSOCK_SEQ_EOR));
	vsock_sock_get_info(a, &info);
	ASSERT_GT(info.rx_mem, one_chunk); /* new chunk after EOM */
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, &mf), 20);
	ASSERT_EQ(mf, 0);
	ASSERT_EQ(recv_buf(a, got, sizeof(got), 0, &mf), 5);
	ASSERT_EQ(mf, VSOCK_MSG_EOR);
	pair_free(w, l, c, a);
}

TEST(stream_zero_copy_peek_and_consume)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *c, *a;
	struct iovec iov[4];

	connect_pair(w, VSOCK_TYPE_STREAM, 307, &l, &c, &a);
	ASSERT_EQ(send_buf(c, "abcdef", 6, 0), 6);
	pump(w);
	ASSERT_EQ(vsock_sock_rx_peek_iov(a, iov, 4), 6);
	ASSERT_MEMEQ(iov[0].iov_base, "abcdef", 6);
	vsock_sock_rx_consume(a, 4);
	ASSERT_EQ(vsock_sock_rx_peek_iov(a, iov, 4), 2);
	ASSERT_MEMEQ(iov[0].iov_base, "ef", 2);
	vsock_sock_rx_consume(a, 100); /* clamped */
	ASSERT_EQ(vsock_sock_rx_peek_iov(a, iov, 4), 0);
	struct vsock_sock_info info;
	vsock_sock_get_info(a, &info);
	ASSERT_EQ(info.fwd_cnt, 6);
	pump(w);
	vsock_sock_get_info(c, &info);
	ASSERT_EQ(info.peer_fwd_cnt, 6);
	pair_free(w, l, c, a);
}

/* ---- feed_batch equivalence ----------------------------------------------------------------- */

#define NPKT 64

struct scenario {
	struct world *w;
	struct vsock_sock *l, *c[2], *a[2];
	struct vsock_hdr hdrs[NPKT];
	char payload[NPKT][200];
	int n;
};

static void scenario_setup(struct scenario *s)
{
	s->w = world_new(NULL);
	ASSERT_OK(vsock_sock_new(s->w->h, VSOCK_TYPE_STREAM, &s->l));
	ASSERT_OK(vsock_sock_bind(s->l, VMADDR_CID_ANY, 400));
	ASSERT_OK(vsock_sock_listen(s->l, 8));
	for (int i = 0; i < 2; i++) {
		ASSERT_OK(vsock_sock_new(s->w->g, VSOCK_TYPE_STREAM, &s->c[i]));
		ASSERT_OK(vsock_sock_bind(s->c[i], VMADDR_CID_ANY, 5000 + i));
		ASSERT_ERR(vsock_sock_connect(s->c[i], 2, 400), EINPROGRESS);
		pump(s->w);
		ASSERT_OK(vsock_sock_accept(s->l, &s->a[i]));
	}
	/* The packet sequence: runs of RW for flow 0, interleaved flow 1, a CREDIT_REQUEST,
	 * a malformed packet, an RST to nowhere, a REQUEST for a new flow, a SHUTDOWN. */
	s->n = 0;
	for (int i = 0; i < NPKT - 8; i++) {
		int flow = (i / 5) % 2;
		struct vsock_hdr h = mkhdr(3, 5000 + flow, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_RW);

		h.len = (uint32_t)(1 + (i * 37) % 190);
		h.fwd_cnt = 0;
		memset(s->payload[s->n], 'a' + i % 26, h.len);
		s->hdrs[s->n++] = h;
	}
	struct vsock_hdr h = mkhdr(3, 5000, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_REQUEST);
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 5000, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN);
	h.flags = 9; /* malformed */
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 6000, 2, 401, VSOCK_TYPE_STREAM, VSOCK_OP_RST);
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 6001, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST);
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 6001, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = 3;
	memcpy(s->payload[s->n], "new", 3);
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 5001, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN);
	h.flags = VSOCK_SHUTDOWN_SEND;
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 5001, 2, 400, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = 2;
	memcpy(s->payload[s->n], "zz", 2);
	s->hdrs[s->n++] = h;
	h = mkhdr(3, 9999, 2, 12345, VSOCK_TYPE_STREAM, VSOCK_OP_RW);
	h.len = 1;
	s->hdrs[s->n++] = h;
}

struct outcome {
	struct vsock_engine_stats st;
	struct vsock_sock_info info[2];
	char data[2][NPKT * 200];
	ssize_t len[2];
	struct vsock_hdr replies[32];
	int nrep;
	unsigned events;
};

static void scenario_outcome(struct scenario *s, struct outcome *o)
{
	char b[64];

	memset(o, 0, sizeof(*o));
	o->events = w_events(s->w);
	vsock_engine_get_stats(s->w->h, &o->st);
	for (int i = 0; i < 2; i++) {
		vsock_sock_get_info(s->a[i], &o->info[i]);
		o->len[i] = recv_buf(s->a[i], o->data[i], sizeof(o->data[i]), 0, NULL);
	}
	while (o->nrep < 32 && pull_one(s->w->h, &o->replies[o->nrep], b, sizeof(b)) >= 0)
		o->nrep++;
}

static void scenario_free(struct scenario *s)
{
	for (int i = 0; i < 2; i++) {
		vsock_sock_close(s->c[i]);
		vsock_sock_close(s->a[i]);
	}
	vsock_sock_close(s->l);
	world_free(s->w);
}

TEST(feed_batch_equals_individual_feeds)
{
	static struct scenario one, bat;
	static struct outcome o1, o2;
	struct iovec iovs[NPKT];
	struct vsock_pkt_ref refs[NPKT];

	scenario_setup(&one);
	scenario_setup(&bat);
	unsigned ev1 = w_events(one.w), ev2 = w_events(bat.w);
	for (int i = 0; i < one.n; i++) {
		struct iovec iov = {one.payload[i], one.hdrs[i].len};
		(void)vsock_engine_feed(one.w->h, &one.hdrs[i], &iov, 1);
	}
	for (int i = 0; i < bat.n; i++) {
		iovs[i] = (struct iovec){bat.payload[i], bat.hdrs[i].len};
		refs[i] = (struct vsock_pkt_ref){bat.hdrs[i], &iovs[i], 1};
	}
	vsock_engine_feed_batch(bat.w->h, refs, (size_t)bat.n);
	scenario_outcome(&one, &o1);
	scenario_outcome(&bat, &o2);

	ASSERT_EQ_U64(o1.st.rx_pkts, o2.st.rx_pkts);
	ASSERT_EQ_U64(o1.st.rx_bytes, o2.st.rx_bytes);
	ASSERT_EQ_U64(o1.st.rx_no_socket, o2.st.rx_no_socket);
	ASSERT_EQ_U64(o1.st.rx_dropped[VSOCK_HDR_BAD_FLAGS], 1);
	ASSERT_EQ_U64(o2.st.rx_dropped[VSOCK_HDR_BAD_FLAGS], 1);
	ASSERT_EQ_U64(o1.st.socks_open, o2.st.socks_open);
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(o1.len[i], o2.len[i]);
		ASSERT_GT(o1.len[i], 0);
		ASSERT_MEMEQ(o1.data[i], o2.data[i], (size_t)o1.len[i]);
		ASSERT_EQ(o1.info[i].rx_bytes, o2.info[i].rx_bytes);
		ASSERT_EQ(o1.info[i].peer_shutdown, o2.info[i].peer_shutdown);
		ASSERT_EQ(o1.info[i].state, o2.info[i].state);
	}
	ASSERT_EQ(o1.info[1].peer_shutdown, VSOCK_SHUTDOWN_SEND);
	ASSERT_EQ(o1.nrep, o2.nrep);
	for (int i = 0; i < o1.nrep; i++) {
		ASSERT_EQ(o1.replies[i].op, o2.replies[i].op);
		ASSERT_EQ(o1.replies[i].dst_port, o2.replies[i].dst_port);
	}
	ASSERT_GE(o1.nrep, 3); /* CREDIT_UPDATE, RESPONSE, RST to 9999 */
	/* Events were coalesced: fewer in the batch, but at least one per touched socket. */
	ASSERT_LT(o2.events - ev2, o1.events - ev1);
	ASSERT_GE(o2.events - ev2, 3);
	struct vsock_sock *nc;
	ASSERT_OK(vsock_sock_accept(one.l, &nc));
	vsock_sock_close(nc);
	ASSERT_OK(vsock_sock_accept(bat.l, &nc));
	char b[8];
	ASSERT_EQ(recv_buf(nc, b, sizeof(b), 0, NULL), 3);
	vsock_sock_close(nc);
	scenario_free(&one);
	scenario_free(&bat);
}

TEST_MAIN()
