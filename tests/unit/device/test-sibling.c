/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/sibling.c, the sibling port: routing with RX splitting, a
 * congested or full sibling (RSTs dropped, packets held in order, then back-pressure), a
 * sibling's VMM disconnecting and reconnecting (the device is kept), each sender's fair share
 * of a slow sibling's inbox, the budget of REQUESTs a sibling did not accept.
 * Shared set-up: devtest.h.
 */
#include "devtest.h"

TEST(siblings_route_and_split_large_packets)
{
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	static uint8_t big[10000], got[10000];
	uint8_t buf[RXBUF];
	size_t have = 0;
	int pieces = 0;

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + 1);
	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	tg_connect(&gb, &tb);

	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_SEQPACKET, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.dst_cid, 4);
	h = mkhdr(&gb, 3, 77, 1111, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RESPONSE, 0);
	tg_send(&gb, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(r.src_cid, 4);

	/* 10000 bytes into 4096-byte buffers: 4052 + 4052 + 1896, EOM|EOR on the last only. */
	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RW, sizeof(big));
	h.flags = VSOCK_SEQ_EOM | VSOCK_SEQ_EOR;
	tg_send(&ga, &h, big);
	while (have < sizeof(big)) {
		ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		ASSERT_LE(r.len, RXBUF - 44);
		ASSERT_LE(have + r.len, sizeof(big));
		memcpy(got + have, buf, r.len);
		have += r.len;
		pieces++;
		if (have < sizeof(big))
			ASSERT_EQ(r.flags, 0);
		else
			ASSERT_EQ(r.flags, VSOCK_SEQ_EOM | VSOCK_SEQ_EOR);
	}
	ASSERT_EQ(pieces, 3);
	ASSERT_MEMEQ(got, big, sizeof(big));
	vsock_dev_get_stats(ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 2);

	sib_stop(router, &ta, &tb, &ga, &gb);
}

TEST(congested_sibling_does_not_stall_sender)
{
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	uint64_t t0;
	char buf[64];

	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	/* B's guest posts no RX buffers: its inbox (512 packets) fills and stays full. */
	tg_connect_nrx(&gb, &tb, 0);
	for (uint32_t i = 0; i < 600; i++) {
		h = mkhdr(&ga, 4, 10000 + i, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&ga, &h, NULL);
	}
	/* A reaches the host at once: the 88 REQUESTs B has no room for are held for B, not in
	 * A's TX ring. */
	t0 = test_now_ms();
	h = mkhdr(&ga, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_LT(test_now_ms() - t0, 500);
	/* B makes no room within 1 s: what was held for it is dropped, each answered with an RST
	 * from B to A's guest. */
	ASSERT_WAIT_FOR((vsock_dev_get_stats(ta.d, &st), st.sibling_dropped == 600 - 512), WAIT_MS);
	ASSERT_EQ(st.sibling_fwd_pkts, 512);
	for (uint32_t i = 512; i < 600; i++) {
		ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RST);
		ASSERT_EQ(r.src_cid, 4);
		ASSERT_EQ(r.dst_port, 10000 + i);
	}
	/* Once B takes packets again, forwarding resumes. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&gb, i);
	tg_kick(&gb, 0);
	for (int i = 0; i < 512; i++) {
		ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	}
	h = mkhdr(&ga, 4, 9999, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, 9999);
	sib_stop(router, &ta, &tb, &ga, &gb);
}

/*
 * uvsockd's case: a VMM disconnect does not free the device. While B's VMM is away, what A sends
 * B is dropped (counted on B) and A keeps working; B's next VMM gets A's packets again.
 */
TEST(sibling_vmm_disconnect_keeps_the_device)
{
	struct vsock_router *router;
	struct vsock_dev_status ds;
	struct vsock_dev_stats st;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	char buf[64];

	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	tg_connect(&gb, &tb);
	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.src_port, 1111);

	tg_disconnect(&gb);
	ASSERT_WAIT_FOR((vsock_dev_get_status(tb.d, &ds), !ds.vmm_connected), WAIT_MS);
	h = mkhdr(&ga, 4, 1112, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(tb.d, &st), st.sibling_dropped), WAIT_MS);
	ASSERT_EQ(st.sibling_dropped, 1);
	/* A still reaches the host (no listener there: RST at once). */
	h = mkhdr(&ga, 2, 1113, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);

	/* The same device serves B's next VMM, and A's packets reach it again. */
	tg_connect(&gb, &tb);
	h = mkhdr(&ga, 4, 1114, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.src_port, 1114);
	vsock_dev_get_stats(tb.d, &st);
	ASSERT_EQ(st.vmm_connects, 2);
	vsock_dev_get_stats(ta.d, &st);
	ASSERT_EQ(st.sibling_dropped, 0);
	ASSERT_EQ(st.sibling_fwd_pkts, 3);
	tg_disconnect(&ga);
	tg_disconnect(&gb);
	/* Shutdown as uvsockd's: every device stopped, then all freed. */
	vsock_dev_stop(ta.d);
	vsock_dev_stop(tb.d);
	pthread_join(ta.th, NULL);
	pthread_join(tb.th, NULL);
	dev_vhu_free(ta.vhu);
	dev_vhu_free(tb.vhu);
	vsock_dev_free(ta.d);
	vsock_dev_free(tb.d);
	ASSERT_OK(rmdir(ta.dir));
	ASSERT_OK(rmdir(tb.dir));
	vsock_router_free(router);
}

/* RSTs to a sibling whose inbox is full are replies: dropped and counted, never waited for. */
TEST(rsts_to_a_full_sibling_are_dropped_not_waited_for)
{
	struct sib_pair p;
	struct vsock_dev_stats st;

	sib_pair_start(&p, 0);
	sib_send_n(&p, 10000, 512, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == 512), WAIT_MS);
	sib_send_n(&p, 20000, 300, VSOCK_OP_RST);
	sib_host_round_trip(&p, 40000);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 512);
	ASSERT_EQ(st.sibling_replies_dropped, 300);
	ASSERT_EQ(st.sibling_dropped, 0);
	sib_pair_stop(&p);
}

/*
 * Packets to a full sibling are held for it, in order; once the hold reaches its bound the
 * sender's ring waits (back-pressure on the guest that sends, never an RST on a healthy
 * connection). When the sibling drains within the stall limit, everything arrives in order and
 * nothing is lost, and the sender's ring goes on.
 */
TEST(packets_for_a_full_sibling_are_held_in_order_then_back_pressured)
{
	struct sib_pair p;
	struct vsock_dev_stats st;
	struct vsock_hdr r;
	char buf[64];

	sib_pair_start(&p, 0);
	/* 512 fill B's inbox, 256 are held, the hold is full: the last 10 wait in A's ring. */
	sib_send_n(&p, 10000, 512 + 256 + 10, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == 512), WAIT_MS);
	/* B drains now (well within the 1 s limit): everything arrives, in order. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&p.gb, i);
	tg_kick(&p.gb, 0);
	for (uint32_t i = 0; i < 512 + 256 + 10; i++) {
		ASSERT_OK(tg_recv(&p.gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
		ASSERT_EQ(r.src_port, 10000 + i);
	}
	sib_host_round_trip(&p, 40000);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 512 + 256 + 10);
	ASSERT_EQ(st.sibling_dropped, 0);
	ASSERT_EQ(st.sibling_replies_dropped, 0);
	sib_pair_stop(&p);
}

/* Takes n packets from a guest that keeps no RX buffers posted: posts n (indices 0..n-1), waits
 * for all n, counts them by source CID into from[] (CIDs below 8) and REQUESTs into *reqs. */
static void take_n(struct tguest *g, unsigned n, unsigned *from, unsigned *reqs)
{
	unsigned got = 0;

	for (unsigned i = 0; i < n; i++)
		tg_post_rx(g, (int)i);
	tg_kick(g, 0);
	while (got < n) {
		struct vsock_hdr h;
		uint32_t len;
		void *ck;

		ASSERT_TRUE(WAIT_FOR(vring_drv_get_used(g->rx, &len, &ck) == 0, WAIT_MS));
		ASSERT_GE(len, 44);
		vsock_hdr_decode(g->rxb[(uintptr_t)ck - 1], &h);
		ASSERT_LT(h.src_cid, 8);
		from[h.src_cid]++;
		if (h.type == VSOCK_TYPE_STREAM && h.op == VSOCK_OP_REQUEST)
			(*reqs)++;
		got++;
	}
}

/*
 * Three siblings: F (CID 3) floods a slow V (CID 4) with datagrams, T (CID 5) sends V a few
 * datagrams and one connect. V takes 16 packets a round (15 rounds of 100 ms); after each, F
 * sends 64 datagrams
 * before T sends 4, so F always finds the room V made first. Each sender gets a fair share of
 * V's inbox: once T was refused, F (holding far more than half) is refused while the inbox is
 * over half full, so T's connect gets in (no RST) and every datagram T sends after its first
 * refusal is delivered.
 */
TEST(a_sibling_datagram_flood_leaves_a_third_sibling_its_share)
{
	enum { ROUNDS = 15, T_PER_ROUND = 4 };
	struct vsock_router *router;
	struct tdev tf, tv, tt;
	struct tguest gf, gv, gt;
	unsigned from[8] = { 0 }, reqs = 0, f_sent = 0;
	struct vsock_hdr h;
	uint64_t expect;

	tg_skip_empty = true;
	ASSERT_OK(vsock_router_new(&router));
	tdev_new(&tf, router, 3);
	tdev_new(&tv, router, 4);
	tdev_new(&tt, router, 5);
	ASSERT_OK(vsock_dev_link_sibling(tf.d, tv.d));
	ASSERT_OK(vsock_dev_link_sibling(tt.d, tv.d));
	ASSERT_OK(vsock_dev_link_sibling(tf.d, tt.d));
	tdev_run(&tf);
	tdev_run(&tv);
	tdev_run(&tt);
	tg_connect_feat(&gf, &tf, NRX, DG_FEAT);
	tg_connect_feat(&gv, &tv, 0, DG_FEAT); /* V posts RX buffers only in take_n */
	tg_connect_feat(&gt, &tt, NRX, DG_FEAT);
	ASSERT_WAIT_FOR(atomic_load(&tv.d->sib.port->dgram), WAIT_MS);

	/* F fills V's inbox (512) and more. */
	while (DG_STAT(&tf, dgram_drop_full) == 0) {
		dg_send_guest(&gf, 4, 1000, 2000, "f");
		if (++f_sent % 64 == 0)
			dg_sync(&gf, 41000 + f_sent / 64);
	}
	dg_sync(&gf, 40999);
	ASSERT_EQ_U64(DG_STAT(&tf, dgram_tx), DEV_INBOX_PKTS);
	/* T: one connect (held: V is full) and one datagram (refused: V is full). */
	h = mkhdr(&gt, 4, 3000, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&gt, &h, NULL);
	dg_send_guest(&gt, 4, 3001, 2000, "t");
	dg_sync(&gt, 40000);
	ASSERT_EQ_U64(DG_STAT(&tt, dgram_drop_full), 1);
	/*
	 * 100 ms a round, so that the rounds outlast the 1 s a held packet waits for room
	 * (DEV_SIB_STALL_NS): a connect that only got in once the inbox is down to half would be
	 * dropped with an RST on the way (the flood keeps it over half). No time is measured.
	 */
	for (unsigned r = 0; r < ROUNDS; r++) {
		test_sleep_ms(100);
		take_n(&gv, 16, from, &reqs);
		for (unsigned i = 0; i < 64; i++)
			dg_send_guest(&gf, 4, 1000, 2000, "f");
		dg_sync(&gf, 40100 + r);
		for (unsigned i = 0; i < T_PER_ROUND; i++)
			dg_send_guest(&gt, 4, 3001, 2000, "t");
		dg_sync(&gt, 40200 + r);
	}
	/* V takes everything left. */
	expect = DG_STAT(&tf, sibling_fwd_pkts) + DG_STAT(&tt, sibling_fwd_pkts);
	while (from[3] + from[5] < expect)
		take_n(&gv, (unsigned)MIN(16u, expect - (from[3] + from[5])), from, &reqs);
	ASSERT_EQ(reqs, 1);                           /* T's connect reached V */
	ASSERT_EQ_U64(DG_STAT(&tt, sibling_dropped), 0); /* and was never answered with an RST */
	ASSERT_EQ_U64(DG_STAT(&tt, dgram_tx), ROUNDS * T_PER_ROUND);
	ASSERT_EQ_U64(DG_STAT(&tt, dgram_drop_full), 1);
	ASSERT_EQ(from[5], ROUNDS * T_PER_ROUND + 1);  /* T's datagrams and its connect */
	ASSERT_EQ_U64(from[3], DG_STAT(&tf, dgram_tx));

	tg_disconnect(&gt);
	tdev_stop(&tt);
	sib_stop(router, &tf, &tv, &gf, &gv);
	tg_skip_empty = false;
}

/*
 * A device takes its inbox in batches of DEV_SIB_TAKE packets under one lock, not one packet per
 * lock: after one RX buffer is filled, DEV_SIB_TAKE packets have left the inbox. Nothing is lost
 * or reordered by it.
 */
TEST(the_inbox_is_taken_in_batches_in_order)
{
	enum { N = 200 };
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h;
	unsigned from[8] = { 0 }, reqs = 0, got = 0;

	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	tg_connect_nrx(&gb, &tb, 0);
	for (uint32_t i = 0; i < N; i++) {
		h = mkhdr(&ga, 4, 10000 + i, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&ga, &h, NULL);
	}
	ASSERT_WAIT_FOR(atomic_load(&tb.d->sib.port->inbox.count) == N, WAIT_MS);
	take_n(&gb, 1, from, &reqs);
	ASSERT_EQ(atomic_load(&tb.d->sib.port->inbox.count), N - DEV_SIB_TAKE);
	got = 1;
	while (got < N) {
		unsigned n = MIN(16u, N - got);

		for (unsigned i = 0; i < n; i++)
			tg_post_rx(&gb, (int)i);
		tg_kick(&gb, 0);
		for (unsigned i = 0; i < n; i++) {
			uint32_t len;
			void *ck;

			ASSERT_TRUE(WAIT_FOR(vring_drv_get_used(gb.rx, &len, &ck) == 0, WAIT_MS));
			vsock_hdr_decode(gb.rxb[(uintptr_t)ck - 1], &h);
			ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
			ASSERT_EQ(h.src_port, 10000 + got);
			got++;
		}
	}
	ASSERT_EQ(reqs, 1);
	sib_stop(router, &ta, &tb, &ga, &gb);
}

/* ---- the REQUEST budget (sibling.c, "REQUESTs a sibling does not accept") ------------------ */

/* As sib_pair_start, with A's REQUEST budget towards B set to burst, one more every ns. */
static void budget_pair_start(struct sib_pair *p, uint32_t burst, uint64_t ns)
{
	ASSERT_OK(vsock_router_new(&p->router));
	tdev_new(&p->ta, p->router, 3);
	tdev_new(&p->tb, p->router, 4);
	dev_sib_set_req_budget(p->ta.d, burst, ns);
	ASSERT_OK(vsock_dev_link_sibling(p->ta.d, p->tb.d));
	tdev_run(&p->ta);
	tdev_run(&p->tb);
	tg_connect(&p->ga, &p->ta);
	tg_connect(&p->gb, &p->tb);
}

/* B's guest receives A's next packet: a REQUEST from A's port sport to port dport. */
static void b_gets_request(struct sib_pair *p, uint32_t sport, uint32_t dport)
{
	struct vsock_hdr r;
	char buf[64];

	ASSERT_OK(tg_recv(&p->gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.src_port, sport);
	ASSERT_EQ(r.dst_port, dport);
}

/* B's guest answers A's REQUEST from A's port sport to dport with op (RST or RESPONSE). */
static void b_answers(struct sib_pair *p, uint32_t sport, uint32_t dport, uint16_t op)
{
	struct vsock_hdr h = mkhdr(&p->gb, 3, dport, sport, VSOCK_TYPE_STREAM, op, 0);

	tg_send(&p->gb, &h, NULL);
}

/* A's guest receives B's answer op to its REQUEST from sport. */
static void a_gets(struct sib_pair *p, uint32_t sport, uint16_t op)
{
	struct vsock_hdr r;
	char buf[64];

	ASSERT_OK(tg_recv(&p->ga, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, op);
	ASSERT_EQ(r.src_cid, 4);
	ASSERT_EQ(r.dst_port, sport);
}

/*
 * A floods B with REQUESTs; B's guest refuses each (RST), but for the first, to the one port
 * where it listens (RESPONSE). With a budget of 8 and none paid back by time, B gets exactly 8:
 * the 9th waits in A (counted), and A's TX ring with it; the RSTs A's guest takes pay nothing
 * back. The RESPONSE A's guest takes pays one back: exactly one more REQUEST reaches B. Nothing
 * is refused in B's name by the device: every answer A sees is B's guest's.
 */
TEST(requests_a_sibling_refuses_are_paced_at_the_sender)
{
	struct sib_pair p;
	struct vsock_dev_stats st;

	budget_pair_start(&p, 8, 0);
	for (uint32_t i = 0; i < 20; i++) {
		struct vsock_hdr h = mkhdr(&p.ga, 4, 10000 + i, i ? 30000 + i : 77,
					   VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);

		tg_send(&p.ga, &h, NULL);
	}
	for (uint32_t i = 0; i < 8; i++)
		b_gets_request(&p, 10000 + i, i ? 30000 + i : 77);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_requests_paced == 1),
			WAIT_MS);
	/* The refusals, taken by A's guest, pay nothing back. */
	for (uint32_t i = 1; i < 8; i++)
		b_answers(&p, 10000 + i, 30000 + i, VSOCK_OP_RST);
	for (uint32_t i = 1; i < 8; i++)
		a_gets(&p, 10000 + i, VSOCK_OP_RST);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 8);
	ASSERT_EQ(st.sibling_requests_paced, 1);
	ASSERT_EQ(st.sibling_dropped, 0);
	/* B accepts the first: the RESPONSE pays one back, the 9th goes, the 10th waits. */
	b_answers(&p, 10000, 77, VSOCK_OP_RESPONSE);
	a_gets(&p, 10000, VSOCK_OP_RESPONSE);
	b_gets_request(&p, 10008, 30008);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_requests_paced == 2),
			WAIT_MS);
	ASSERT_EQ(st.sibling_fwd_pkts, 9);
	ASSERT_EQ(st.sibling_dropped, 0);
	/* The operators' counter. */
	{
		struct ops_vm_stats os;

		vsock_dev_get_ops_stats(p.ta.d, &os);
		ASSERT_EQ_U64(OPS_CTR_GET(&os.c, sibling_requests_paced), 2);
	}
	sib_pair_stop(&p);
}

/*
 * Puts n REQUESTs from A's ports sport.. to B's ports dport.. into A's TX ring and kicks once:
 * A's device takes them in one pass, within microseconds of each other.
 */
static void a_queue_requests(struct sib_pair *p, uint32_t sport, uint32_t dport, unsigned n)
{
	ASSERT_LE(n, NTX);
	for (unsigned k = 0; k < n; k++) {
		struct vsock_hdr h = mkhdr(&p->ga, 4, sport + k, dport + k, VSOCK_TYPE_STREAM,
					   VSOCK_OP_REQUEST, 0);
		struct vring_drv_buf b;
		int i = tg_free_tx(&p->ga);

		ASSERT_GE(i, 0);
		vsock_hdr_encode(&h, p->ga.txb[i]);
		b = (struct vring_drv_buf){ .addr = p->ga.txg[i], .len = 44, .write = false };
		p->ga.txbusy[i] = true;
		ASSERT_GE(vring_drv_add(p->ga.tx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
	}
	tg_kick(&p->ga, 1);
}

/*
 * A guest over its budget is only slowed, never answered in the sibling's name: with a budget
 * of 8 paid back by time (one a millisecond), A's 31 refused REQUESTs, taken in one pass (the
 * 9th is paced unless the pass took over a millisecond per REQUEST), all reach B and get B's
 * own RSTs, and A's connect that follows, to the port B has started listening on meanwhile,
 * reaches B and is accepted (a RESPONSE, not an RST).
 */
TEST(a_connect_after_a_paced_flood_reaches_the_now_listening_sibling)
{
	struct sib_pair p;
	struct vsock_dev_stats st;

	budget_pair_start(&p, 8, 1000 * 1000);
	a_queue_requests(&p, 10000, 30000, 31);
	for (uint32_t i = 0; i < 31; i++) {
		b_gets_request(&p, 10000 + i, 30000 + i);
		b_answers(&p, 10000 + i, 30000 + i, VSOCK_OP_RST);
	}
	for (uint32_t i = 0; i < 31; i++)
		a_gets(&p, 10000 + i, VSOCK_OP_RST);
	{
		struct vsock_hdr h = mkhdr(&p.ga, 4, 20000, 77, VSOCK_TYPE_STREAM,
					   VSOCK_OP_REQUEST, 0);

		tg_send(&p.ga, &h, NULL);
	}
	b_gets_request(&p, 20000, 77);
	b_answers(&p, 20000, 77, VSOCK_OP_RESPONSE);
	a_gets(&p, 20000, VSOCK_OP_RESPONSE);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 32);
	ASSERT_GT(st.sibling_requests_paced, 0);
	ASSERT_EQ(st.sibling_dropped, 0);
	sib_pair_stop(&p);
}

TEST_MAIN()
