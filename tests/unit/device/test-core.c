/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/device.c, the core: TX validation and routing (spoofed CIDs,
 * bad packets and their rate-limited log), the reply limit, ring errors (broken until restart,
 * one VM only), the RX share of the sibling inbox, and the data-path switches off.
 * Shared set-up: devtest.h.
 */
#include "devtest.h"

TEST(spoofed_source_cid_is_dropped_and_counted)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	char buf[64];

	solo_start(&t, &g);
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	h.src_cid = 7;
	tg_send(&g, &h, NULL);
	h = mkhdr(&g, 9, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_ERR(tg_recv(&g, &r, buf, sizeof(buf), 300, true), ETIMEDOUT);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.tx_bad_src_cid, 1);
	ASSERT_EQ(st.tx_bad_dst_cid, 1);
	solo_stop(&t, &g);
}

/*
 * A guest flooding the device with bad packets (spoofed source CIDs, unknown destinations) gets
 * every one dropped and counted, but only a burst of tagged log lines per call site (10 per 5 s,
 * src/util/log.c), not one line per packet. stderr goes to a memfd in this (forked) case.
 */
TEST(guest_flood_of_bad_packets_is_logged_tagged_and_rate_limited)
{
	enum { N = 300 };
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h;
	struct vsock_dev_stats st;
	int mfd = capture_stderr();
	const char *out;

	log_set_level(LOG_LVL_INFO);
	solo_start(&t, &g);
	for (int i = 0; i < N; i++) {
		h = mkhdr(&g, 2, 40000 + (uint32_t)i, 5000, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		h.src_cid = 7;
		tg_send(&g, &h, NULL);
		h = mkhdr(&g, 9, 40000 + (uint32_t)i, 5000, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&g, &h, NULL);
	}
	WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.tx_bad_src_cid == N && st.tx_bad_dst_cid == N),
		 WAIT_MS);
	ASSERT_EQ(st.tx_bad_src_cid, N);
	ASSERT_EQ(st.tx_bad_dst_cid, N);
	solo_stop(&t, &g);
	out = captured(mfd);
	ASSERT_TRUE(*out);
	/* Tagged with the VM and the two ports (lp: the host side, pp: the guest's). */
	ASSERT_TRUE(strstr(out, "uvsock warn: vm=3 lp=5000 pp=40000: tx packet with spoofed "
				"src_cid 7 dropped\n") != NULL);
	ASSERT_TRUE(strstr(out, "uvsock warn: vm=3 lp=5000 pp=40000: tx packet to cid 9 dropped")
		    != NULL);
	/* 10 per call site per 5 s window (20 if the flood straddled a window), not 300. */
	ASSERT_GE(count_str(out, "spoofed src_cid"), 10);
	ASSERT_LE(count_str(out, "spoofed src_cid"), 20);
	ASSERT_GE(count_str(out, "no route"), 10);
	ASSERT_LE(count_str(out, "no route"), 20);
	ASSERT_LE(count_str(out, "\n"), 60);
}

TEST(tx_pauses_at_reply_limit_and_resumes)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	char buf[64];
	int sent = 0, rsts = 0;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	/* No RX buffers: every RST reply stays queued in the device. */
	tg_connect_nrx(&g, &t, 0);
	for (;;) {
		h = mkhdr(&g, 2, 20000 + (uint32_t)sent, 9, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		if (tg_send_wait(&g, &h, NULL, 300) < 0)
			break;
		sent++;
		ASSERT_LT(sent, 1000);
	}
	/* The device stopped taking TX packets near the TX ring size (128) of queued replies. */
	vsock_dev_get_stats(t.d, &st);
	ASSERT_GE(st.tx_pkts, 128);
	ASSERT_LE(st.tx_pkts, 128 + 64);
	/* Posting RX buffers lets the replies out, and TX resumes. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&g, i);
	tg_kick(&g, 0);
	for (int k = 0; k < 100; k++) {
		h = mkhdr(&g, 2, 30000 + (uint32_t)k, 9, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		while (tg_send_wait(&g, &h, NULL, 0) < 0) {
			ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
			ASSERT_EQ(r.op, VSOCK_OP_RST);
			rsts++;
		}
	}
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0) {
		ASSERT_EQ(r.op, VSOCK_OP_RST);
		rsts++;
	}
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.tx_pkts, (uint64_t)sent + 100);
	/* Every REQUEST got its RST, except those beyond the bounded reply queue. */
	ASSERT_GE(rsts, 100 + 128);
	ASSERT_LE(rsts, sent + 100);
	solo_stop(&t, &g);
}

TEST(ring_error_marks_device_broken_until_restart)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	struct vring_drv_buf b = { .addr = 1ull << 40, .len = 44, .write = false };
	char buf[64];

	solo_start(&t, &g);
	/* A TX buffer outside guest memory. */
	ASSERT_GE(vring_drv_add(g.tx, &b, 1, (void *)(uintptr_t)1000), 0);
	tg_kick(&g, 1);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.ring_errors), WAIT_MS);
	ASSERT_EQ(st.ring_errors, 1);
	/* Broken: nothing is processed any more. */
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_ERR(tg_recv(&g, &r, buf, sizeof(buf), 300, true), ETIMEDOUT);
	/* A new VMM session works again. */
	tg_disconnect(&g);
	tg_connect(&g, &t);
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.ring_errors, 1);
	solo_stop(&t, &g);
}

/*
 * While b's engine and its sibling inbox both have packets, the sibling inbox gets one RX buffer
 * per DEV_RX_ENG_SHARE of the engine's; once the engine has none, the inbox gets every buffer.
 * With no RX buffers posted, b's guest queues n_eng RSTs from the host (REQUESTs to ports
 * without a listener) and a's guest queues n_sib REQUESTs in b's inbox; then b posts its buffers.
 */
TEST(sibling_flood_gets_one_rx_buffer_in_five_while_the_engine_has_data)
{
	enum { n_eng = 100, n_sib = 200 };
	unsigned got_eng = 0, got_sib = 0, sib_while_eng = 0;
	struct vsock_dev_stats st;
	struct sib_pair p;
	char buf[64];

	sib_pair_start(&p, 0);
	for (unsigned i = 0; i < n_eng; i++) {
		struct vsock_hdr h = mkhdr(&p.gb, 2, 30000 + i, 9, VSOCK_TYPE_STREAM,
					   VSOCK_OP_REQUEST, 0);

		tg_send(&p.gb, &h, NULL);
	}
	sib_send_n(&p, 10000, n_sib, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.tb.d, &st), st.tx_pkts == n_eng), WAIT_MS);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == n_sib), WAIT_MS);
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&p.gb, i);
	tg_kick(&p.gb, 0);
	while (got_eng + got_sib < n_eng + n_sib) {
		struct vsock_hdr r;

		ASSERT_OK(tg_recv(&p.gb, &r, buf, sizeof(buf), WAIT_MS, false));
		if (r.src_cid == 2) {
			/* The engine's RSTs, in the order of the REQUESTs. */
			ASSERT_EQ(r.op, VSOCK_OP_RST);
			ASSERT_EQ(r.dst_port, 30000 + got_eng);
			got_eng++;
			sib_while_eng = got_sib;
		} else {
			/* The sibling's REQUESTs, in order, none lost. */
			ASSERT_EQ(r.src_cid, 3);
			ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
			ASSERT_EQ(r.src_port, 10000 + got_sib);
			got_sib++;
		}
	}
	/* Up to the engine's last packet: one sibling buffer per DEV_RX_ENG_SHARE, no more, no less. */
	ASSERT_LE(sib_while_eng * DEV_RX_ENG_SHARE, n_eng);
	ASSERT_GE((sib_while_eng + 1) * DEV_RX_ENG_SHARE, n_eng);
	ASSERT_EQ(got_sib, n_sib);
	vsock_dev_get_stats(p.tb.d, &st);
	ASSERT_EQ(st.sibling_dropped, 0);
	sib_pair_stop(&p);
}

/*
 * A guest RX buffer shorter than the header while host bytes wait for it (first or among the
 * gathered ones), or one outside guest memory among the gathered ones: that VM's device is
 * broken, nothing crashes or spins, another VM is unaffected.
 */
TEST(zerocopy_short_rx_buffer_breaks_only_that_vm)
{
	struct vsock_dev_stats st;
	struct tdev t, t2;
	struct tguest g, g2;
	struct vsock_hdr req, req2, r;
	static uint8_t big[20000], buf[RXBUF];
	int fd, fd2;

	for (int gathered = 0; gathered < 3; gathered++) {
		tdev_new(&t, NULL, 3);
		tdev_run(&t);
		tg_connect_nrx(&g, &t, 1);
		host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
		solo_start(&t2, &g2);
		host_initiated(&t2, &g2, SOCK_STREAM, &fd2, &req2);
		/* Take the one buffer, then let bytes wait in the host socket. */
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(write(fd, "x", 1), 1);
		wait_rx_pkts(&t, st.rx_pkts + 1);
		ASSERT_EQ(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
		if (gathered) {
			struct vring_drv_buf b = { .addr = gathered == 1 ? g.rxg[5] : 1ull << 40,
						   .len = gathered == 1 ? 20 : RXBUF,
						   .write = true };

			tg_post_rx(&g, 4);
			ASSERT_GE(vring_drv_add(g.rx, &b, 1, (void *)(uintptr_t)6), 0);
		} else {
			struct vring_drv_buf b = { .addr = g.rxg[4], .len = 43, .write = true };

			ASSERT_GE(vring_drv_add(g.rx, &b, 1, (void *)(uintptr_t)5), 0);
		}
		tg_kick(&g, 0);
		ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.ring_errors == 1), WAIT_MS);
		/* The other VM still moves data both ways. */
		ASSERT_EQ(write(fd2, "ping", 4), 4);
		ASSERT_OK(tg_recv(&g2, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		ASSERT_MEMEQ(buf, "ping", 4);
		/* The broken one is still alive: counters answer, the thread stops cleanly. */
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(st.ring_errors, 1);
		close(fd);
		close(fd2);
		solo_stop(&t2, &g2);
		solo_stop(&t, &g);
	}
}

/*
 * Every switch of the device and the engine off (and zerocopy on or off): bytes still flow both
 * ways, in order, packets within 4 KiB (no-pkt64k) also when host bytes are read in place.
 */
TEST(device_and_engine_switches_off_still_move_data)
{
	static uint8_t payload[3000], rb[RXBUF];
	struct vsock_dev_stats st;
	char path[160], err[128];
	struct vsock_hdr h, r;
	struct tdev t;
	struct tguest g;
	int lfd, hfd;

	for (int pass = 0; pass < 2; pass++) {
		size_t got = 0, total = 20 * sizeof(payload);

		ASSERT_OK(tune_set(pass ? "no-zerocopy" : "zerocopy,no-tx-batch,no-event-idx,"
			  "no-credit-reduce,no-merge,no-pkt64k,no-rx-batch", err, sizeof(err)));
		hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
		for (int i = 0; i < 5; i++)
			hello_world(&g, hfd);
		for (size_t off = 0; off < total; off += sizeof(payload)) {
			for (size_t i = 0; i < sizeof(payload); i++)
				payload[i] = (uint8_t)((off + i) % 251);
			h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW,
				  sizeof(payload));
			tg_send(&g, &h, payload);
			ASSERT_EQ(write(hfd, payload, sizeof(payload)), (ssize_t)sizeof(payload));
		}
		while (got < total) {
			ssize_t n = read_wait(hfd, rb, sizeof(rb), WAIT_MS);

			ASSERT_GT(n, 0);
			check_pattern(rb, (size_t)n, got);
			got += (size_t)n;
		}
		for (got = 0; got < total; got += r.len) {
			ASSERT_OK(tg_recv(&g, &r, rb, sizeof(rb), WAIT_MS, true));
			ASSERT_EQ(r.op, VSOCK_OP_RW);
			check_pattern(rb, r.len, got);
		}
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(st.zc_rx_bytes == 0, pass == 1);
		close(hfd);
		close(lfd);
		unlink(path);
		solo_stop(&t, &g);
	}
}

TEST_MAIN()
