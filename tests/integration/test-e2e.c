/* SPDX-License-Identifier: MIT */
/*
 * End-to-end tests: the uvsockd binary runs as a child process (by PID, temp directory, every
 * wait bounded); guests are guest-role contexts (uvsock_ctx_new_guest) in this process driving
 * it through real vhost-user sockets, memfd guest memory and shared-memory rings; host programs
 * are plain Unix sockets following the hybrid convention. Every transferred byte is checked
 * against a position-dependent pattern (stronger than an end checksum: it also catches
 * reordering, loss and duplication at the exact offset).
 *
 * Covers: STREAM guest->host and host->guest at write sizes 64 B .. 512 KiB (256 MiB each),
 * SEQPACKET both ways, half-close both ways, a refused port,
 * 1000 concurrent connections, two sibling guests, VMM disconnect/reconnect, a slow host reader
 * (uvsockd's VmRSS must stay bounded), eight VMs at once.
 */
#include <stdatomic.h>

#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"

#define MiB (1024u * 1024u)
#define ARRAY_SIZE_(a) (sizeof(a) / sizeof((a)[0]))

static void one_vm(struct uvd *u)
{
	static const uint32_t cid3[] = { 3 };

	uvd_start(u, 1, cid3, NULL, NULL);
}

static double secs_since(uint64_t t0_ms)
{
	return (double)(test_now_ms() - t0_ms) / 1000.0;
}

/* Guest sends total bytes in writes of w bytes; the host reads them in reads of w bytes. */
static void stream_g2h(size_t w, size_t total)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct host_io hr;
	pthread_t th;
	int lfd, hfd, gfd;
	uint64_t t0;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	hr = (struct host_io){ .fd = hfd, .total = total, .seed = w, .chunk = w };
	t0 = test_now_ms();
	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	g_send_pattern(gfd, total, w, w);
	pthread_join(th, NULL);
	ASSERT_TRUE(hr.ok);
	test_note("guest->host %zu MiB in %zu B writes: %.2f s, %.1f MiB/s", total / MiB, w,
		  secs_since(t0), (double)total / MiB / secs_since(t0));
	/* And the end of stream arrives after the data. */
	ASSERT_EQ(uvsock_shutdown(gfd, SHUT_WR), 0);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Host sends total bytes in writes of w bytes; the guest reads them in reads of w bytes. */
static void stream_h2g(size_t w, size_t total)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct host_io hw;
	pthread_t th;
	int ls, hfd, gfd;
	uint64_t t0;
	char c;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	hw = (struct host_io){ .fd = hfd, .total = total, .seed = w + 1, .chunk = w };
	t0 = test_now_ms();
	ASSERT_EQ(pthread_create(&th, NULL, host_send_main, &hw), 0);
	g_recv_pattern_chunk(gfd, total, w + 1, w);
	pthread_join(th, NULL);
	ASSERT_TRUE(hw.ok);
	test_note("host->guest %zu MiB in %zu B writes: %.2f s, %.1f MiB/s", total / MiB, w,
		  secs_since(t0), (double)total / MiB / secs_since(t0));
	{
		struct uvsock_guest_stats gs = { .size = sizeof(gs) };

		ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &gs), 0);
		test_note("guest driver: %" PRIu64 " RX buffers in %" PRIu64 " batches, RX buffer "
			  "now %" PRIu64 " B, %" PRIu64 " wake-ups, %" PRIu64 " dropped",
			  gs.rx_bufs, gs.rx_batches, gs.rx_buf_len, gs.wakeups, gs.rx_dropped);
		ASSERT_EQ(gs.rx_dropped, 0);
		/* Bulk writes from the host fill the guest's buffers: the size adapted upwards. */
		if (w >= 65536)
			ASSERT_GT(gs.rx_buf_len, 4096 + 44 + 64);
	}
	ASSERT_EQ(shutdown(hfd, SHUT_WR), 0);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 0);
	uvsock_close(gfd);
	uvsock_close(ls);
	close(hfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(stream_guest_to_host_64B_writes) { stream_g2h(64, 256 * MiB); }
TEST(stream_guest_to_host_1KiB_writes) { stream_g2h(1024, 256 * MiB); }
TEST(stream_guest_to_host_4KiB_writes) { stream_g2h(4096, 256 * MiB); }
TEST(stream_guest_to_host_64KiB_writes) { stream_g2h(65536, 256 * MiB); }
TEST(stream_guest_to_host_512KiB_writes) { stream_g2h(512 * 1024, 256 * MiB); }
TEST(stream_host_to_guest_64B_writes) { stream_h2g(64, 256 * MiB); }
TEST(stream_host_to_guest_1KiB_writes) { stream_h2g(1024, 256 * MiB); }
TEST(stream_host_to_guest_4KiB_writes) { stream_h2g(4096, 256 * MiB); }
TEST(stream_host_to_guest_64KiB_writes) { stream_h2g(65536, 256 * MiB); }
TEST(stream_host_to_guest_512KiB_writes) { stream_h2g(512 * 1024, 256 * MiB); }

/* Message sizes that cross every boundary of interest: tiny, one RX buffer, one packet, more. */
static const size_t seq_sizes[] = { 1, 100, 4052, 4096, 4097, 20000, 65536, 65537, 100000 };

TEST(seqpacket_guest_to_host_keeps_boundaries)
{
	struct uvd u;
	struct uvsock_ctx *g;
	int lfd, hfd, gfd;
	uint8_t *buf = malloc(256 * 1024);

	ASSERT_TRUE(buf != NULL);
	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g, u.uds[0], SOCK_SEQPACKET, 5001, WAIT_MS, &lfd, &hfd);
	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < ARRAY_SIZE_(seq_sizes); i++) {
			size_t n = seq_sizes[i];
			ssize_t r;

			hs_fill(buf, n, i + round, 0);
			ASSERT_EQ(uvsock_send(gfd, buf, n, MSG_EOR), (ssize_t)n);
			ASSERT_EQ(hs_wait_fd(hfd, POLLIN, WAIT_MS), 1);
			r = recv(hfd, buf, 256 * 1024, 0);
			ASSERT_EQ(r, (ssize_t)n);
			ASSERT_EQ(hs_check(buf, n, i + round, 0), n);
		}
	}
	uvsock_close(gfd);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	free(buf);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(seqpacket_host_to_guest_keeps_boundaries)
{
	struct uvd u;
	struct uvsock_ctx *g;
	int ls, hfd, gfd;
	uint8_t *buf = malloc(256 * 1024);

	ASSERT_TRUE(buf != NULL);
	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_SEQPACKET, 6001);
	gfd = g_accept_host(ls, u.uds[0], SOCK_SEQPACKET, 6001, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	/* All messages first, then read them: boundaries must survive queueing. */
	for (size_t i = 0; i < ARRAY_SIZE_(seq_sizes); i++) {
		if (seq_sizes[i] > 65536)
			continue; /* keep the burst within the guest's 256 KiB buffer */
		hs_fill(buf, seq_sizes[i], 100 + i, 0);
		ASSERT_EQ(send(hfd, buf, seq_sizes[i], 0), (ssize_t)seq_sizes[i]);
	}
	for (size_t i = 0; i < ARRAY_SIZE_(seq_sizes); i++) {
		if (seq_sizes[i] > 65536)
			continue;
		ASSERT_EQ(uvsock_recv(gfd, buf, 256 * 1024, 0), (ssize_t)seq_sizes[i]);
		ASSERT_EQ(hs_check(buf, seq_sizes[i], 100 + i, 0), seq_sizes[i]);
	}
	close(hfd);
	/* Host close: the guest sees the end. */
	ASSERT_EQ(uvsock_recv(gfd, buf, 16, 0), 0);
	uvsock_close(gfd);
	uvsock_close(ls);
	uvsock_ctx_free(g);
	free(buf);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(half_close_both_ways)
{
	struct uvd u;
	struct uvsock_ctx *g;
	char buf[64];
	int lfd, hfd, gfd, ls, hfd2, gfd2;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	/* Guest-initiated: guest SHUT_WR, host reads EOF, then answers, then closes. */
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ASSERT_EQ(uvsock_send(gfd, "request", 7, 0), 7);
	ASSERT_EQ(uvsock_shutdown(gfd, SHUT_WR), 0);
	ASSERT_EQ(hs_read_full(hfd, buf, 7, WAIT_MS), 7);
	ASSERT_MEMEQ(buf, "request", 7);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	hs_write_all(hfd, "reply", 5);
	ASSERT_EQ(uvsock_recv(gfd, buf, 5, MSG_WAITALL), 5);
	ASSERT_MEMEQ(buf, "reply", 5);
	ASSERT_EQ(uvsock_send(gfd, "x", 1, 0), -1);
	ASSERT_EQ(errno, EPIPE);
	close(hfd);
	ASSERT_EQ(uvsock_recv(gfd, buf, 1, 0), 0);
	uvsock_close(gfd);

	/* Host-initiated: host SHUT_WR, guest reads 0, guest still sends, then closes. */
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd2 = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd2);
	g_set_timeouts(gfd2, WAIT_MS);
	hs_write_all(hfd2, "ask", 3);
	ASSERT_EQ(shutdown(hfd2, SHUT_WR), 0);
	ASSERT_EQ(uvsock_recv(gfd2, buf, 3, MSG_WAITALL), 3);
	ASSERT_EQ(uvsock_recv(gfd2, buf, 1, 0), 0);
	ASSERT_EQ(uvsock_send(gfd2, "answer", 6, 0), 6);
	ASSERT_EQ(hs_read_full(hfd2, buf, 6, WAIT_MS), 6);
	ASSERT_MEMEQ(buf, "answer", 6);
	uvsock_close(gfd2);
	ASSERT_TRUE(hs_wait_eof(hfd2, WAIT_MS));
	close(hfd2);
	uvsock_close(ls);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(refused_port_fails_fast_with_econnreset)
{
	struct uvd u;
	struct uvsock_ctx *g;
	uint64_t t0;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	for (int i = 0; i < 20; i++) {
		t0 = test_now_ms();
		ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 7000 + i), -1);
		ASSERT_EQ(errno, ECONNRESET);
		ASSERT_LT(test_now_ms() - t0, 1000); /* an RST, not the 2 s connect timeout */
		ASSERT_EQ(g_connect(g, SOCK_SEQPACKET, VMADDR_CID_HOST, 7000 + i), -1);
		ASSERT_EQ(errno, ECONNRESET);
	}
	/* A host port refused for the guest does not leave anything behind in the daemon. */
	ASSERT_TRUE(uvd_alive(&u));
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* The host side of many_connections: accepts n connections and echoes everything. */
struct echo_srv {
	int lfd, n;
	bool ok;
};

static void *echo_main(void *arg)
{
	struct echo_srv *s = arg;
	struct pollfd *p = calloc((size_t)s->n + 1, sizeof(*p));
	int nconn = 0, open_ = 0;
	uint64_t end = test_now_ms() + 30000;
	char buf[4096];

	s->ok = false;
	if (!p)
		return NULL;
	p[0] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
	while (test_now_ms() < end) {
		if (nconn == s->n && open_ == 0)
			break;
		if (poll(p, (nfds_t)nconn + 1, 100) <= 0)
			continue;
		if ((p[0].revents & POLLIN) && nconn < s->n) {
			int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);

			if (fd >= 0) {
				p[++nconn] = (struct pollfd){ .fd = fd, .events = POLLIN };
				open_++;
			}
		}
		for (int i = 1; i <= nconn; i++) {
			ssize_t r;

			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
				continue;
			r = read(p[i].fd, buf, sizeof(buf));
			if (r <= 0) {
				close(p[i].fd);
				p[i].fd = -1;
				open_--;
				continue;
			}
			hs_write_all(p[i].fd, buf, (size_t)r);
		}
	}
	s->ok = nconn == s->n && open_ == 0;
	for (int i = 1; i <= nconn; i++)
		if (p[i].fd >= 0)
			close(p[i].fd);
	free(p);
	return NULL;
}

TEST(thousand_concurrent_connections)
{
	enum { N = 1000 };
	struct uvd u;
	struct uvsock_ctx *g;
	struct echo_srv srv;
	pthread_t th;
	static int fds[N];
	uint64_t t0 = test_now_ms();

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	srv = (struct echo_srv){ .lfd = hs_listen_port(u.uds[0], 5000, SOCK_STREAM), .n = N };
	ASSERT_EQ(pthread_create(&th, NULL, echo_main, &srv), 0);
	/* All N open at the same time. */
	for (int i = 0; i < N; i++) {
		fds[i] = g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000);
		if (fds[i] < 0)
			test_fail(__FILE__, __LINE__, "connection %d: %s", i, strerror(errno));
		g_set_timeouts(fds[i], WAIT_MS);
	}
	for (int i = 0; i < N; i++) {
		char msg[32];
		int n = snprintf(msg, sizeof(msg), "conn-%d", i);

		ASSERT_EQ(uvsock_send(fds[i], msg, (size_t)n, 0), n);
	}
	for (int i = 0; i < N; i++) {
		char msg[32], got[32];
		int n = snprintf(msg, sizeof(msg), "conn-%d", i);

		ssize_t r = uvsock_recv(fds[i], got, (size_t)n, MSG_WAITALL);

		if (r != n) {
			struct uvsock_ctx_stats cs = { .size = sizeof(cs) };
			struct uvsock_guest_stats gs = { .size = sizeof(gs) };
			int e = errno;

			uvsock_ctx_get_stats(g, &cs);
			uvsock_ctx_guest_get_stats(g, &gs);
			test_note("engine: rx %" PRIu64 " tx %" PRIu64 " rst %" PRIu64 "/%" PRIu64
				  " dropped %" PRIu64 "; driver: rx bufs %" PRIu64
				  " posted %" PRIu64 " tx %" PRIu64 " full %" PRIu64
				  " inflight %" PRIu64 " slept 0x%" PRIx64
				  " events 0x%x",
				  cs.rx_pkts, cs.tx_pkts, cs.rst_sent, cs.rst_received, cs.dropped,
				  gs.rx_bufs, gs.rx_posted, gs.tx_pkts, gs.tx_full, gs.tx_inflight,
				  gs.sleep_state,
				  uvsock_poll_events(fds[i]));
			test_fail(__FILE__, __LINE__, "connection %d: recv %zd (%s)", i, r,
				  r < 0 ? strerror(e) : "short");
		}
		ASSERT_MEMEQ(got, msg, (size_t)n);
	}
	for (int i = 0; i < N; i++)
		ASSERT_EQ(uvsock_close(fds[i]), 0);
	pthread_join(th, NULL);
	ASSERT_TRUE(srv.ok);
	test_note("%d connections opened, echoed and closed in %.2f s", N, secs_since(t0));
	close(srv.lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Sockets the context still holds (the engine's count). */
static uint64_t socks_open(struct uvsock_ctx *g)
{
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_get_stats(g, &st), 0);
	return st.socks_open;
}

TEST(sibling_guests_talk_through_the_daemon)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvd u;
	struct uvsock_ctx *g3, *g4;
	int ls, c, s;
	const size_t total = 64 * MiB;
	struct sockaddr_vm peer;
	socklen_t plen = sizeof(peer);

	uvd_start(&u, 2, cids, "web", NULL);
	g3 = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	ASSERT_EQ(uvsock_ctx_local_cid(g3), 3);
	ASSERT_EQ(uvsock_ctx_local_cid(g4), 4);
	ls = g_listen(g4, SOCK_STREAM, 9000);
	c = g_connect(g3, SOCK_STREAM, 4, 9000);
	ASSERT_GE(c, 0);
	s = uvsock_accept(ls, (struct sockaddr *)&peer, &plen);
	ASSERT_GE(s, 0);
	ASSERT_EQ(peer.svm_cid, 3);
	g_set_timeouts(c, WAIT_MS);
	g_set_timeouts(s, WAIT_MS);
	g_transfer(c, s, total, 65536, 33);
	g_transfer(s, c, total, 4096, 44);
	/* SEQPACKET between the siblings: messages larger than a packet (the engine cuts them)
	 * and than an RX buffer (the daemon splits them) arrive whole, boundaries kept. */
	{
		static const size_t sz[] = { 1, 3000, 4096, 40000, 65536, 100000, 200000 };
		int lq = g_listen(g4, SOCK_SEQPACKET, 9002), cq, sq;
		uint8_t *buf = malloc(256 * 1024);

		ASSERT_TRUE(buf != NULL);
		cq = g_connect(g3, SOCK_SEQPACKET, 4, 9002);
		ASSERT_GE(cq, 0);
		sq = uvsock_accept(lq, NULL, NULL);
		ASSERT_GE(sq, 0);
		g_set_timeouts(cq, WAIT_MS);
		g_set_timeouts(sq, WAIT_MS);
		for (size_t i = 0; i < sizeof(sz) / sizeof(sz[0]); i++) {
			int mflags = 0;
			struct iovec iov = { .iov_base = buf, .iov_len = 256 * 1024 };
			struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

			hs_fill(buf, sz[i], 900 + i, 0);
			ASSERT_EQ(uvsock_send(cq, buf, sz[i], MSG_EOR), (ssize_t)sz[i]);
			memset(buf, 0, sz[i]);
			ASSERT_EQ(uvsock_recvmsg(sq, &m, 0), (ssize_t)sz[i]);
			mflags = m.msg_flags;
			ASSERT_TRUE(mflags & MSG_EOR);
			ASSERT_FALSE(mflags & MSG_TRUNC);
			ASSERT_EQ(hs_check(buf, sz[i], 900 + i, 0), sz[i]);
		}
		free(buf);
		uvsock_close(cq);
		uvsock_close(sq);
		uvsock_close(lq);
	}
	/* Nobody listens on 9001 in guest 4: its engine answers with RST at once. */
	ASSERT_EQ(g_connect(g3, SOCK_STREAM, 4, 9001), -1);
	ASSERT_EQ(errno, ECONNRESET);
	uvsock_close(c);
	uvsock_close(s);
	uvsock_close(ls);
	/* The close handshake (SHUTDOWN, then RST back) completes through the daemon: no socket
	 * is left lingering for the 8 s close timeout. */
	if (!WAIT_FOR(socks_open(g3) == 0 && socks_open(g4) == 0, 3000))
		test_fail(__FILE__, __LINE__, "sockets still open: %" PRIu64 " + %" PRIu64,
			  socks_open(g3), socks_open(g4));
	uvsock_ctx_free(g3);
	uvsock_ctx_free(g4);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(vmm_disconnect_and_reconnect)
{
	struct uvd u;
	struct uvsock_ctx *g;
	char c;
	int lfd, hfd, gfd, ls;

	one_vm(&u);
	lfd = hs_listen_port(u.uds[0], 5000, SOCK_STREAM);
	/* A VMM comes and goes three times, each with a live connection when it leaves. */
	for (int round = 0; round < 3; round++) {
		g = g_guest_new(u.sock[0], NULL);
		gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
		ASSERT_EQ(uvsock_send(gfd, "a", 1, 0), 1);
		ASSERT_EQ(hs_read_full(hfd, &c, 1, WAIT_MS), 1);
		uvsock_ctx_free(g); /* closes the front-end: the VMM is gone */
		ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
		close(hfd);
	}
	/* In-place reconnect: listeners survive, the old connection is reset. */
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
	ASSERT_EQ(uvsock_ctx_guest_reconnect(g), 0);
	ASSERT_NE(g_wait_events(gfd, POLLERR | POLLHUP, WAIT_MS), 0);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	close(hfd);
	uvsock_close(gfd);
	gfd = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, "b", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'b');
	uvsock_close(gfd);
	uvsock_close(ls);
	close(hfd);
	uvsock_ctx_free(g);
	close(lfd);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * The back-end itself restarts (crash, upgrade) with another guest CID on the same socket: the
 * guest sees the hang-up (connections reset, connect fails at once), reconnects, reads the new
 * CID, and its listener serves the new daemon.
 */
TEST(backend_restart_with_a_new_cid)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats gs = { .size = sizeof(gs) };
	struct sockaddr_vm me;
	socklen_t len = sizeof(me);
	int ls, hfd, gfd;
	char c;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_EQ(uvsock_ctx_local_cid(g), 3);
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd);

	ASSERT_EQ(uvd_kill(&u), 0);
	ASSERT_NE(g_wait_events(gfd, POLLERR | POLLHUP, WAIT_MS), 0);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000), -1);
	ASSERT_EQ(errno, ENETUNREACH);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &gs), 0);
	ASSERT_EQ(gs.backend_lost, 1);
	uvsock_close(gfd);
	close(hfd);

	uvd_restart_one(&u, 7);
	ASSERT_EQ(uvsock_ctx_guest_reconnect(g), 0);
	ASSERT_EQ(uvsock_ctx_local_cid(g), 7);
	gfd = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd);
	ASSERT_EQ(uvsock_getsockname(gfd, (struct sockaddr *)&me, &len), 0);
	ASSERT_EQ(me.svm_cid, 7);
	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, "n", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'n');
	ASSERT_EQ(uvsock_send(gfd, "m", 1, 0), 1);
	ASSERT_EQ(hs_read_full(hfd, &c, 1, WAIT_MS), 1);
	ASSERT_EQ(c, 'm');
	uvsock_close(gfd);
	uvsock_close(ls);
	close(hfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* The guest sends as fast as credit allows to a host that reads 64 KiB every 20 ms. */
struct slow_reader {
	int fd;
	size_t total;
	bool ok;
	atomic_bool fast;   /* switch to full speed */
	_Atomic uint64_t got;
};

static void *slow_reader_main(void *arg)
{
	struct slow_reader *s = arg;
	uint8_t *buf = malloc(65536);
	size_t off = 0;

	s->ok = false;
	while (buf && off < s->total) {
		ssize_t r;

		if (hs_wait_fd(s->fd, POLLIN, WAIT_MS) <= 0)
			break;
		r = read(s->fd, buf, 65536);
		if (r <= 0 || hs_check(buf, (size_t)r, 77, off) != (size_t)r)
			break;
		off += (size_t)r;
		atomic_store(&s->got, off);
		if (!atomic_load(&s->fast))
			test_sleep_ms(20); /* the reader's pace, not a wait for something */
	}
	s->ok = off == s->total;
	free(buf);
	return NULL;
}

TEST(slow_host_reader_keeps_daemon_memory_bounded)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct slow_reader sr;
	struct g_io io;
	pthread_t tr, tw;
	int lfd, hfd, gfd;
	uint64_t rss0, rss_max = 0, end, max_gap = 0;
	const size_t total = 256 * MiB;

	one_vm(&u);
	g = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, 30000, &lfd, &hfd);
	rss0 = uvd_rss_kib(&u);
	ASSERT_GT(rss0, 0);
	sr = (struct slow_reader){ .fd = hfd, .total = total };
	ASSERT_EQ(pthread_create(&tr, NULL, slow_reader_main, &sr), 0);
	io = (struct g_io){ .fd = gfd, .total = total, .chunk = 65536, .seed = 77 };
	ASSERT_EQ(pthread_create(&tw, NULL, g_send_main, &io), 0);
	/* 3 s of a guest pushing against a reader taking ~3 MiB/s. */
	end = test_now_ms() + 3000;
	while (test_now_ms() < end) {
		uint64_t r = uvd_rss_kib(&u);
		struct uvsock_guest_stats gs = { .size = sizeof(gs) };

		if (r > rss_max)
			rss_max = r;
		/* What left the guest but the host has not read: credit (256 KiB in the
		 * daemon) plus the Unix socket's buffer plus packets in flight. */
		ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &gs), 0);
		if (gs.tx_bytes - atomic_load(&sr.got) > max_gap)
			max_gap = gs.tx_bytes - atomic_load(&sr.got);
		test_sleep_ms(50); /* the sampling interval */
	}
	test_note("uvsockd VmRSS: %" PRIu64 " KiB at start, at most %" PRIu64
		  " KiB while the guest pushed at a slow reader; host read %" PRIu64
		  " KiB; at most %" PRIu64 " KiB between guest and host reader", rss0, rss_max,
		  atomic_load(&sr.got) / 1024, max_gap / 1024);
	/* Unbounded buffering would hold most of what the guest could push in 3 s (hundreds of
	 * MiB at the rates measured above); credit bounds it to well under 16 MiB. */
	ASSERT_LT(rss_max, rss0 + 16 * 1024);
	ASSERT_LT(max_gap, 4 * MiB);
	ASSERT_LT(atomic_load(&sr.got), 64 * MiB); /* the reader really was slow */
	atomic_store(&sr.fast, true);
	pthread_join(tw, NULL);
	pthread_join(tr, NULL);
	ASSERT_TRUE(sr.ok);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

struct vm_job {
	struct uvd *u;
	int i;
	size_t total;
	bool ok;
};

static void *vm_job_main(void *arg)
{
	struct vm_job *j = arg;
	struct uvsock_ctx *g = g_guest_new(j->u->sock[j->i], NULL);
	struct host_io hr;
	pthread_t th;
	int lfd, hfd, gfd;

	j->ok = false;
	if (uvsock_ctx_local_cid(g) != j->u->cid[j->i])
		test_fail(__FILE__, __LINE__, "wrong CID");
	gfd = g_connect_host(g, j->u->uds[j->i], SOCK_STREAM, 5000, 20000, &lfd, &hfd);
	hr = (struct host_io){ .fd = hfd, .total = j->total, .seed = 500 + (uint64_t)j->i };
	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	g_send_pattern(gfd, j->total, 32768, 500 + (uint64_t)j->i);
	pthread_join(th, NULL);
	j->ok = hr.ok;
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	return NULL;
}

TEST(eight_vms_at_once)
{
	enum { NVM = 8 };
	uint32_t cids[NVM];
	struct uvd u;
	struct vm_job jobs[NVM];
	pthread_t th[NVM];
	uint64_t t0;

	for (int i = 0; i < NVM; i++)
		cids[i] = 3 + (uint32_t)i;
	uvd_start(&u, NVM, cids, NULL, NULL);
	t0 = test_now_ms();
	for (int i = 0; i < NVM; i++) {
		jobs[i] = (struct vm_job){ .u = &u, .i = i, .total = 32 * MiB };
		ASSERT_EQ(pthread_create(&th[i], NULL, vm_job_main, &jobs[i]), 0);
	}
	for (int i = 0; i < NVM; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < NVM; i++)
		ASSERT_TRUE(jobs[i].ok);
	test_note("8 VMs x 32 MiB guest->host in %.2f s", secs_since(t0));
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
