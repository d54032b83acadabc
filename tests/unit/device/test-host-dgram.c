/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/host_dgram.c, datagrams: DGRAM negotiated or not, the host-
 * side AF_UNIX SOCK_DGRAM convention both ways, malformed lines, oversize, a full host socket,
 * siblings, symlinks and rebound sockets.
 * Shared set-up: devtest.h.
 */
#include <dirent.h>

#include "devtest.h"

TEST(dgram_not_negotiated_is_dropped_and_counted_never_answered)
{
	struct tdev t;
	struct tguest g;
	char path[160], buf[64];
	int hfd, ufd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_5000.dgram", t.uds);
	hfd = dg_bind(path);
	tdev_run(&t);
	tg_connect(&g, &t); /* a Linux guest: bit 3 never acked */
	ASSERT_EQ(vhu_front_features(g.f) & DG_FEAT, 0);
	dg_send_guest(&g, 2, 1234, 5000, "hello");
	/* The RST dg_sync waits for is the first packet the guest gets: none for the datagram. */
	dg_sync(&g, 40000);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_not_negotiated), 1);
	ASSERT_EQ(recv(hfd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	ASSERT_EQ(errno, EAGAIN);
	/* Host to a guest that did not negotiate: dropped and counted. */
	ufd = dg_unbound();
	dg_send_host(&t, ufd, "1234\nhi", 7);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_not_negotiated) == 2, WAIT_MS);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx) + DG_STAT(&t, dgram_rx), 0);
	close(ufd);
	close(hfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_guest_host_round_trip_with_bound_ephemeral_and_unbound_senders)
{
	struct tdev t;
	struct tguest g;
	char path[160], other[160], dgpath[160], from[160], buf[RXBUF];
	struct vsock_hdr r;
	int hfd, ofd, ufd;
	ssize_t n;
	uint32_t eph;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_5000.dgram", t.uds);
	snprintf(other, sizeof(other), "%s/other.sock", t.dir);
	snprintf(dgpath, sizeof(dgpath), "%s.dgram", t.uds);
	hfd = dg_bind(path);
	ofd = dg_bind(other);
	ufd = dg_unbound();
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	ASSERT_NE(vhu_front_features(g.f) & DG_FEAT, 0);

	/* Guest -> host port 5000: "<guest port>\n" + payload, from the device's socket connected
	 * to it (an abstract name: no path). */
	dg_send_guest(&g, 2, 1234, 5000, "hello");
	n = dg_recv_host(hfd, buf, sizeof(buf), from, sizeof(from));
	ASSERT_EQ(n, 10);
	ASSERT_MEMEQ(buf, "1234\nhello", 10);
	ASSERT_STREQ(from, "");
	/* The reply from <uds>_5000.dgram comes from host port 5000. */
	dg_send_host(&t, hfd, "1234\nworld", 10);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_EQ(r.dst_cid, 3);
	ASSERT_EQ(r.src_port, 5000);
	ASSERT_EQ(r.dst_port, 1234);
	ASSERT_EQ(r.len, 5);
	ASSERT_EQ(r.buf_alloc + r.fwd_cnt + r.flags, 0);
	ASSERT_MEMEQ(buf, "world", 5);
	/* An empty datagram is one too. */
	dg_send_host(&t, hfd, "1234\n", 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, 0);

	/* A sender bound elsewhere gets an ephemeral port; replies to it reach it. */
	dg_send_host(&t, ofd, "77\nq", 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	eph = r.src_port;
	ASSERT_GE(eph, 1u << 30);
	ASSERT_LT(eph, (1u << 31) - 1);
	ASSERT_EQ(r.dst_port, 77);
	dg_send_host(&t, ofd, "77\nq2", 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, eph); /* remembered */
	dg_send_guest(&g, 2, 77, eph, "answer");
	n = dg_recv_host(ofd, buf, sizeof(buf), NULL, 0);
	ASSERT_EQ(n, 9);
	ASSERT_MEMEQ(buf, "77\nanswer", 9);

	/* An unbound sender: a port whose replies are dropped and counted. */
	dg_send_host(&t, ufd, "88\nanon", 7);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, (1u << 31) - 1);
	dg_send_guest(&g, 2, 88, r.src_port, "lost");
	dg_sync(&g, 40001);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 2);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx_bytes), 5 + 6);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_rx), 5);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_rx_bytes), 5 + 0 + 1 + 2 + 4);
	close(ufd);
	close(ofd);
	close(hfd);
	unlink(other);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_malformed_oversize_and_unroutable_are_dropped_and_counted)
{
	static const char *const bad[] = { "abc\nx", "01\nx", "4294967296\nx", "12345678901\nx",
					   "", "12", "-1\nx", " 1\nx", "1 \nx" };
	static char big[65536 + 64];
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	char buf[RXBUF];
	int ufd;

	tg_skip_empty = true;

	solo_start(&t, &g);
	tg_disconnect(&g);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	ufd = dg_unbound();
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++)
		dg_send_host(&t, ufd, bad[i], strlen(bad[i]));
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_malformed) == ARRAY_SIZE(bad), WAIT_MS);
	/* The largest port parses. */
	dg_send_host(&t, ufd, "4294967295\nok", 13);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.dst_port, 0xffffffffu);
	/* Over the maximum (65492) from the host; over the guest's 4 KiB RX buffer. */
	memcpy(big, "9\n", 2);
	memset(big + 2, 'x', sizeof(big) - 2);
	dg_send_host(&t, ufd, big, 2 + 65493);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_oversize) == 1, WAIT_MS);
	dg_send_host(&t, ufd, big, 2 + RXBUF - 44 + 1);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_oversize) == 2, WAIT_MS);
	dg_send_host(&t, ufd, big, 2 + RXBUF - 44);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, RXBUF - 44); /* exactly one full buffer is whole */

	/* From the guest: over the maximum, an op other than RW, a CID that is nobody. */
	h = mkhdr(&g, 2, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_RW, 65493);
	tg_send(&g, &h, big);
	h = mkhdr(&g, 2, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	h = mkhdr(&g, 77, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_RW, 3);
	tg_send(&g, &h, "abc");
	/* Nobody bound at <uds>_5000.dgram. */
	dg_send_guest(&g, 2, 1, 5000, "nobody");
	dg_sync(&g, 40002); /* and never an RST for any of them */
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_oversize), 3);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_malformed), ARRAY_SIZE(bad) + 1);
	ASSERT_EQ_U64(DG_STAT(&t, tx_bad_dst_cid), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 0);
	close(ufd);
	solo_stop(&t, &g);
	tg_skip_empty = false;
}

TEST(dgram_full_host_socket_drops_and_counts_and_the_ring_goes_on)
{
	static char payload[4000];
	struct tdev t;
	struct tguest g;
	char path[160], buf[RXBUF];
	unsigned sent = 0;
	int hfd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_6000.dgram", t.uds);
	hfd = dg_bind(path); /* never read until the end */
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	memset(payload, 'p', sizeof(payload) - 1);
	/* The device's send buffer (or the receiver's queue) fills up: EAGAIN, never a wait. */
	while (DG_STAT(&t, dgram_drop_full) == 0 && sent < 4000) {
		dg_send_guest(&g, 2, 1, 6000, payload);
		sent++;
		if (sent % 32 == 0)
			dg_sync(&g, 41000 + sent);
	}
	dg_sync(&g, 40003);
	ASSERT_GT(DG_STAT(&t, dgram_drop_full), 0);
	ASSERT_GT(DG_STAT(&t, dgram_tx), 0);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx) + DG_STAT(&t, dgram_drop_full), sent);
	/* What was sent on is there, whole. */
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 2 + (ssize_t)strlen(payload));
	close(hfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_siblings_route_by_cid_and_need_dgram_on_both_sides)
{
	static char big[RXBUF];
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr r;
	char buf[RXBUF];

	tg_skip_empty = true;

	sib_start(&router, &ta, &tb);
	tg_connect_feat(&ga, &ta, NRX, DG_FEAT);
	tg_connect_feat(&gb, &tb, NRX, DG_FEAT);
	dg_send_guest(&ga, 4, 1000, 2000, "sib");
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.dst_cid, 4);
	ASSERT_EQ(r.src_port, 1000);
	ASSERT_EQ(r.dst_port, 2000);
	ASSERT_EQ(r.len, 3);
	ASSERT_MEMEQ(buf, "sib", 3);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_tx), 1);
	ASSERT_EQ_U64(DG_STAT(&tb, dgram_rx), 1);
	/* Larger than b's RX buffer: dropped whole at b, not split. */
	memset(big, 'b', sizeof(big) - 1);
	dg_send_guest(&ga, 4, 1000, 2000, big);
	ASSERT_WAIT_FOR(DG_STAT(&tb, dgram_drop_oversize) == 1, WAIT_MS);
	dg_send_guest(&ga, 4, 1000, 2000, "after");
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, 5);

	/* b's guest comes back without DGRAM: a's datagrams for it are dropped at a. */
	tg_disconnect(&gb);
	tg_connect(&gb, &tb);
	ASSERT_WAIT_FOR(!atomic_load(&tb.d->sib.port->dgram), WAIT_MS);
	dg_send_guest(&ga, 4, 1000, 2000, "nope");
	dg_sync(&ga, 40004);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_drop_not_negotiated), 1);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_tx), 3); /* the big one went on: b dropped it */
	sib_stop(router, &ta, &tb, &ga, &gb);
	tg_skip_empty = false;
}

TEST(dgram_to_host_never_follows_a_symlink_and_follows_a_rebound_socket)
{
	struct tdev t;
	struct tguest g;
	char path[160], target[160], buf[RXBUF];
	int tfd, hfd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_7000.dgram", t.uds);
	snprintf(target, sizeof(target), "%s/target.dgram", t.dir);
	tfd = dg_bind(target);
	ASSERT_OK(symlink(target, path));
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	dg_send_guest(&g, 2, 1, 7000, "via link");
	dg_sync(&g, 40010);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ(recv(tfd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	/* A real socket there now; then closed and bound again (a new inode): both reached. */
	ASSERT_OK(unlink(path));
	hfd = dg_bind(path);
	dg_send_guest(&g, 2, 1, 7000, "first");
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 7);
	close(hfd);
	hfd = dg_bind(path);
	dg_send_guest(&g, 2, 1, 7000, "second");
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 8);
	ASSERT_MEMEQ(buf, "1\nsecond", 8);
	/* Gone: counted, and nothing is held open for it. */
	close(hfd);
	unlink(path);
	dg_send_guest(&g, 2, 1, 7000, "third");
	dg_sync(&g, 40011);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 2);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 2);
	close(tfd);
	unlink(target);
	solo_stop(&t, &g);
}

/* Open fds of this process (the device runs in it). */
static unsigned count_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	unsigned n = 0;

	ASSERT_TRUE(dir != NULL);
	while (readdir(dir))
		n++;
	closedir(dir);
	return n;
}

/*
 * A remembered host sender that never reads fills the send buffer of the socket the guest's
 * replies to it leave through (60 KB datagrams: a few fill the default 208 KiB SO_SNDBUF before
 * the receiver's net.unix.max_dgram_qlen is reached). Replies to another sender must all arrive:
 * each sender has its own sending socket.
 */
TEST(dgram_a_host_sender_that_never_reads_starves_only_itself)
{
	static char big[60000];
	struct tdev t;
	struct tguest g;
	char stuck_p[160], good_p[160], buf[RXBUF];
	struct vsock_hdr h, r;
	uint32_t stuck_port, good_port;
	uint64_t full;
	int stuck, good;

	tdev_new(&t, NULL, 3);
	snprintf(stuck_p, sizeof(stuck_p), "%s/stuck.sock", t.dir);
	snprintf(good_p, sizeof(good_p), "%s/good.sock", t.dir);
	stuck = dg_bind(stuck_p);
	good = dg_bind(good_p);
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	dg_send_host(&t, stuck, "10\ns", 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	stuck_port = r.src_port;
	dg_send_host(&t, good, "11\ng", 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	good_port = r.src_port;
	ASSERT_NE(stuck_port, good_port);

	memset(big, 'b', sizeof(big));
	for (unsigned i = 0; i < 64 && DG_STAT(&t, dgram_drop_full) == 0; i++) {
		h = mkhdr(&g, 2, 10, stuck_port, VSOCK_TYPE_DGRAM, VSOCK_OP_RW, sizeof(big));
		h.buf_alloc = 0;
		tg_send(&g, &h, big);
		dg_sync(&g, 42000 + i);
	}
	full = DG_STAT(&t, dgram_drop_full);
	ASSERT_GT(full, 0);
	for (unsigned i = 0; i < 5; i++)
		dg_send_guest(&g, 2, 11, good_port, "reply");
	dg_sync(&g, 42100);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_full), full);
	for (unsigned i = 0; i < 5; i++) {
		ASSERT_EQ(dg_recv_host(good, buf, sizeof(buf), NULL, 0), 8);
		ASSERT_MEMEQ(buf, "11\nreply", 8);
	}
	close(good);
	close(stuck);
	unlink(good_p);
	unlink(stuck_p);
	solo_stop(&t, &g);
}

/*
 * The sending sockets of remembered senders are bounded: after replies to more senders than
 * DEV_DGRAM_PEER_SOCKS, exactly that many more fds are open, and every reply arrived (a sender
 * whose socket was closed gets a new one).
 */
TEST(dgram_sending_sockets_of_host_senders_are_bounded)
{
	enum { N = DEV_DGRAM_PEER_SOCKS + 4 };
	struct tdev t;
	struct tguest g;
	char path[N][160], buf[RXBUF];
	uint32_t port[N];
	struct vsock_hdr r;
	unsigned before;
	int fd[N];

	tdev_new(&t, NULL, 3);
	for (unsigned i = 0; i < N; i++) {
		snprintf(path[i], sizeof(path[i]), "%s/peer%u.sock", t.dir, i);
		fd[i] = dg_bind(path[i]);
	}
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	for (unsigned i = 0; i < N; i++) {
		dg_send_host(&t, fd[i], "7\nx", 3);
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
		port[i] = r.src_port;
	}
	before = count_fds();
	for (unsigned round = 0; round < 2; round++)
		for (unsigned i = 0; i < N; i++) {
			dg_send_guest(&g, 2, 7, port[i], "y");
			ASSERT_EQ(dg_recv_host(fd[i], buf, sizeof(buf), NULL, 0), 3);
			ASSERT_MEMEQ(buf, "7\ny", 3);
		}
	dg_sync(&g, 42200);
	ASSERT_EQ(count_fds(), before + DEV_DGRAM_PEER_SOCKS);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 2 * N);
	for (unsigned i = 0; i < N; i++) {
		close(fd[i]);
		unlink(path[i]);
	}
	solo_stop(&t, &g);
}

TEST_MAIN()
