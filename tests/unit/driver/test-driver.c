/* SPDX-License-Identifier: MIT */
/*
 * Guest-role tests against the device role running in-process: a struct vsock_dev on its own
 * thread listens on a vhost-user socket; the guest role (uvsock_ctx_new_guest) connects to it
 * as a VMM would, with real shared-memory rings and eventfds; host programs are plain Unix
 * sockets in this process. (The same scenarios through the uvsockd binary are in
 * tests/integration.) Covers: both stream directions with checksums and half-close, SEQPACKET
 * boundaries host->guest, the refused-port fast path, RX buffer growth under bulk traffic, event
 * index kick suppression counters, TRANSPORT_RESET, reconnect, back-end loss, siblings.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "guestside.h"
/* <linux/vm_sockets.h> (via uvsock.h) and vsock/hdr.h (via device.h) spell the VMADDR_*
 * constants differently with equal values: keep hdr.h's, as src/lib/lib.h does. */
#undef VMADDR_CID_HYPERVISOR
#undef VMADDR_CID_LOCAL
#undef VMADDR_CID_HOST
#undef VMADDR_CID_ANY
#undef VMADDR_PORT_ANY
#include "drvtest.h"
#include "test.h"

static struct uvsock_ctx *guest_new(struct tdev *t)
{
	/* Without datagrams: the RX sizing checked here is the adaptive one (test-dgram.c). */
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = UVSOCK_GUEST_NO_DGRAM };

	return g_guest_new(t->sock, &o);
}

/*
 * Ends a test with one connection: closes its guest end gfd and host end hfd, the host listener
 * lfd (or -1 for none), frees the guest context and stops the device.
 */
static void guest_conn_free(struct tdev *t, struct uvsock_ctx *g, int gfd, int hfd, int lfd)
{
	uvsock_close(gfd);
	close(hfd);
	if (lfd >= 0)
		close(lfd);
	uvsock_ctx_free(g);
	tdev_stop(t);
}

TEST(guest_to_host_stream_both_ways_with_half_close)
{
	struct tdev t;
	struct uvsock_ctx *g;
	int lfd, hfd, gfd;
	struct host_io hr, hw;
	pthread_t th_r, th_w;
	const size_t total = 4u << 20;
	char c;

	tdev_start(&t, 3);
	g = guest_new(&t);
	ASSERT_EQ(uvsock_ctx_local_cid(g), 3);
	gfd = g_connect_host(g, t.uds, SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);

	hr = (struct host_io){ .fd = hfd, .total = total, .seed = 1 };
	hw = (struct host_io){ .fd = hfd, .total = total, .seed = 2 };
	ASSERT_EQ(pthread_create(&th_r, NULL, host_recv_main, &hr), 0);
	ASSERT_EQ(pthread_create(&th_w, NULL, host_send_main, &hw), 0);
	g_send_pattern(gfd, total, 10000, 1);
	g_recv_pattern(gfd, total, 2);
	pthread_join(th_r, NULL);
	pthread_join(th_w, NULL);
	ASSERT_TRUE(hr.ok);
	ASSERT_TRUE(hw.ok);

	/* Guest SHUT_WR: the host reads EOF and can still send. */
	ASSERT_EQ(uvsock_shutdown(gfd, SHUT_WR), 0);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	hs_write_all(hfd, "z", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'z');
	/* Host EOF: the guest reads 0. */
	ASSERT_EQ(shutdown(hfd, SHUT_WR), 0);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 0);
	ASSERT_EQ(uvsock_close(gfd), 0);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	tdev_stop(&t);
}

TEST(host_to_guest_stream_and_seqpacket)
{
	struct tdev t;
	struct uvsock_ctx *g;
	int ls, lq, hfd, gfd;
	char buf[256];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	tdev_start(&t, 3);
	g = guest_new(&t);
	ls = g_listen(g, SOCK_STREAM, 6000);
	lq = g_listen(g, SOCK_SEQPACKET, 6001);

	gfd = g_accept_host(ls, t.uds, SOCK_STREAM, 6000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, "hello", 5);
	ASSERT_EQ(uvsock_recv(gfd, buf, 5, MSG_WAITALL), 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	ASSERT_EQ(uvsock_send(gfd, "world", 5, 0), 5);
	ASSERT_EQ(hs_read_full(hfd, buf, 5, WAIT_MS), 5);
	ASSERT_MEMEQ(buf, "world", 5);
	uvsock_close(gfd);
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	close(hfd);

	gfd = g_accept_host(lq, t.uds, SOCK_SEQPACKET, 6001, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	ASSERT_EQ(send(hfd, "one", 3, 0), 3);
	ASSERT_EQ(send(hfd, "second", 6, 0), 6);
	ASSERT_EQ(uvsock_recvmsg(gfd, &m, 0), 3);
	ASSERT_MEMEQ(buf, "one", 3);
	ASSERT_EQ(uvsock_recvmsg(gfd, &m, 0), 6);
	ASSERT_MEMEQ(buf, "second", 6);
	ASSERT_EQ(uvsock_send(gfd, "abc", 3, MSG_EOR), 3);
	ASSERT_EQ(uvsock_send(gfd, "defgh", 5, MSG_EOR), 5);
	ASSERT_EQ(hs_wait_fd(hfd, POLLIN, WAIT_MS), 1);
	ASSERT_EQ(recv(hfd, buf, sizeof(buf), 0), 3);
	ASSERT_EQ(hs_wait_fd(hfd, POLLIN, WAIT_MS), 1);
	ASSERT_EQ(recv(hfd, buf, sizeof(buf), 0), 5);
	uvsock_close(gfd);
	close(hfd);
	uvsock_close(ls);
	uvsock_close(lq);
	uvsock_ctx_free(g);
	tdev_stop(&t);
}

TEST(refused_port_fails_fast_with_econnreset)
{
	struct tdev t;
	struct uvsock_ctx *g;
	uint64_t t0;

	tdev_start(&t, 3);
	g = guest_new(&t);
	t0 = test_now_ms();
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 7777), -1);
	ASSERT_EQ(errno, ECONNRESET);
	/* Far below the 2 s connect timeout: the RST came at once. */
	ASSERT_LT(test_now_ms() - t0, 1500);
	/* Connecting to our own CID has no transport (no loopback in this namespace). */
	ASSERT_EQ(g_connect(g, SOCK_STREAM, 3, 1), -1);
	ASSERT_EQ(errno, ENODEV);
	uvsock_ctx_free(g);
	tdev_stop(&t);
}

/* Host -> guest bulk: the device fills every buffer, so the sizing grows to 64 KiB. */
TEST(rx_buffers_grow_under_bulk_traffic)
{
	struct tdev t;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats st = { .size = sizeof(st) };
	struct host_io hw;
	pthread_t th;
	int ls, hfd, gfd;
	const size_t total = 32u << 20;

	tdev_start(&t, 3);
	g = guest_new(&t);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	ASSERT_LT(st.rx_buf_len, 4096 + 44 + 64);
	ASSERT_EQ(st.rx_posted, 128);
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd = g_accept_host(ls, t.uds, SOCK_STREAM, 6000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	hw = (struct host_io){ .fd = hfd, .total = total, .seed = 9 };
	ASSERT_EQ(pthread_create(&th, NULL, host_send_main, &hw), 0);
	g_recv_pattern(gfd, total, 9);
	pthread_join(th, NULL);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	test_note("rx bufs %" PRIu64 " batches %" PRIu64 " buf_len %" PRIu64 " wakeups %" PRIu64,
		  st.rx_bufs, st.rx_batches, st.rx_buf_len, st.wakeups);
	ASSERT_GT(st.rx_buf_len, 4096 + 44 + 64);
	ASSERT_EQ(st.rx_dropped, 0);
	guest_conn_free(&t, g, gfd, hfd, -1);
}

/* Guest -> host bulk: every publication either kicked or was suppressed by avail_event. */
TEST(tx_kicks_follow_the_event_index)
{
	struct tdev t;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats st = { .size = sizeof(st) };
	struct host_io hr;
	pthread_t th;
	int lfd, hfd, gfd;
	const size_t total = 32u << 20;

	tdev_start(&t, 3);
	g = guest_new(&t);
	gfd = g_connect_host(g, t.uds, SOCK_STREAM, 5001, WAIT_MS, &lfd, &hfd);
	hr = (struct host_io){ .fd = hfd, .total = total, .seed = 4 };
	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	g_send_pattern(gfd, total, 65536, 4);
	pthread_join(th, NULL);
	ASSERT_TRUE(hr.ok);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	test_note("tx pkts %" PRIu64 " kicks %" PRIu64 " suppressed %" PRIu64 " full %" PRIu64,
		  st.tx_pkts, st.kicks, st.kicks_suppressed, st.tx_full);
	ASSERT_GE(st.tx_bytes, total);
	/* At most one kick per packet; 32 MiB in <= 64 KiB packets is >= 512 packets. */
	ASSERT_GE(st.tx_pkts, total / 65536);
	ASSERT_LE(st.kicks, st.tx_pkts + 2 * st.rx_bufs + 2);
	guest_conn_free(&t, g, gfd, hfd, lfd);
}

/* A device for CID 3, a guest on it listening on port 6000, and one host connection accepted. */
static int guest_accepted(struct tdev *t, struct uvsock_ctx **g, int *ls, int *hfd)
{
	tdev_start(t, 3);
	*g = guest_new(t);
	*ls = g_listen(*g, SOCK_STREAM, 6000);
	return g_accept_host(*ls, t->uds, SOCK_STREAM, 6000, hfd);
}

/* The guest listener ls (port 6000) accepts a new host connection, and a byte goes through. */
static void listener_still_accepts(struct tdev *t, int ls, char byte)
{
	int hfd, gfd = g_accept_host(ls, t->uds, SOCK_STREAM, 6000, &hfd);
	char c;

	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, &byte, 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, byte);
	uvsock_close(gfd);
	close(hfd);
}

/* Reads SO_ERROR or a failing recv: the connection must have been reset. */
static void assert_reset(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);
	char c;
	ssize_t r;

	ASSERT_NE(g_wait_events(fd, POLLERR | POLLHUP, WAIT_MS), 0);
	r = uvsock_recv(fd, &c, 1, MSG_DONTWAIT);
	if (r < 0 && errno == ECONNRESET)
		return;
	ASSERT_EQ(uvsock_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
	if (err != ECONNRESET)
		test_fail(__FILE__, __LINE__, "expected a reset: recv %zd (%s), SO_ERROR %d", r,
			  strerror(errno), err);
}

TEST(transport_reset_resets_connected_and_keeps_listeners)
{
	struct tdev t;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats st = { .size = sizeof(st) };
	int ls, hfd, gfd;

	gfd = guest_accepted(&t, &g, &ls, &hfd);

	ASSERT_EQ(uvsock_ctx_guest_transport_reset(g), 0);
	assert_reset(gfd);
	ASSERT_EQ(uvsock_send(gfd, "x", 1, MSG_DONTWAIT), -1);
	ASSERT_EQ(errno, EPIPE);
	ASSERT_EQ(uvsock_ctx_local_cid(g), 3);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	ASSERT_EQ(st.resets, 1);

	/* The listener survived: a new host connection works. */
	listener_still_accepts(&t, ls, 'k');
	guest_conn_free(&t, g, gfd, hfd, -1);
}

TEST(reconnect_resets_connections_and_keeps_listeners)
{
	struct tdev t;
	struct uvsock_ctx *g;
	int ls, hfd, gfd;

	gfd = guest_accepted(&t, &g, &ls, &hfd);

	ASSERT_EQ(uvsock_ctx_guest_reconnect(g), 0);
	assert_reset(gfd);
	/* The device dropped the old VM's host sockets. */
	ASSERT_TRUE(hs_wait_eof(hfd, WAIT_MS));
	listener_still_accepts(&t, ls, 'r');
	guest_conn_free(&t, g, gfd, hfd, -1);
}

TEST(backend_loss_resets_sockets_and_connect_fails_fast)
{
	struct tdev t;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats st = { .size = sizeof(st) };
	int ls, hfd, gfd;
	uint64_t t0;

	gfd = guest_accepted(&t, &g, &ls, &hfd);
	tdev_stop(&t); /* the back-end goes away with the VMM connection */
	assert_reset(gfd);
	close(hfd);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	ASSERT_EQ(st.backend_lost, 1);
	t0 = test_now_ms();
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000), -1);
	ASSERT_EQ(errno, ENETUNREACH);
	ASSERT_LT(test_now_ms() - t0, 1000);
	uvsock_close(gfd);
	uvsock_close(ls);
	uvsock_ctx_free(g);
}

/* Two linked devices (CIDs 3 and 4) with a guest each. */
struct sib_pair {
	struct vsock_router *r;
	struct tdev a, b;
	struct uvsock_ctx *ga, *gb;
};

static void sib_pair_open(struct sib_pair *p)
{
	ASSERT_OK(vsock_router_new(&p->r));
	tdev_new(&p->a, p->r, 3);
	tdev_new(&p->b, p->r, 4);
	ASSERT_OK(vsock_dev_link_sibling(p->a.d, p->b.d));
	tdev_run(&p->a);
	tdev_run(&p->b);
	p->ga = guest_new(&p->a);
	p->gb = guest_new(&p->b);
	ASSERT_EQ(uvsock_ctx_local_cid(p->gb), 4);
}

static void sib_pair_close(struct sib_pair *p)
{
	uvsock_ctx_free(p->ga);
	uvsock_ctx_free(p->gb);
	tdev_stop(&p->a);
	tdev_stop(&p->b);
	vsock_router_free(p->r);
}

/* A connection of `type` from guest 3 to guest 4 (port 9000): *ca on 3, *sb on 4. */
static void sib_pair_connect(struct sib_pair *p, int type, int *ca, int *sb)
{
	int ls = g_listen(p->gb, type, 9000);

	*ca = g_connect(p->ga, type, 4, 9000);
	ASSERT_GE(*ca, 0);
	*sb = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(*sb, 0);
	uvsock_close(ls);
	g_set_timeouts(*ca, WAIT_MS);
	g_set_timeouts(*sb, WAIT_MS);
}

TEST(siblings_talk_guest_to_guest)
{
	struct sib_pair p;
	const size_t total = 8u << 20;
	int ca, sb;

	sib_pair_open(&p);
	sib_pair_connect(&p, SOCK_STREAM, &ca, &sb);
	g_transfer(ca, sb, total, 30000, 7);
	g_transfer(sb, ca, total, 65536, 8);
	uvsock_close(ca);
	uvsock_close(sb);
	sib_pair_close(&p);
}

/*
 * Sibling packets of every size class of the sending device's buffer pool (src/device/sibling.c:
 * a header only, <= 256 B, <= 4 KiB, <= 64 KiB) and on both sides of each bound, many times
 * each way so that buffers are recycled through the pools: every message arrives whole, in
 * order, with its bytes (SEQPACKET: one message is one packet).
 */
TEST(siblings_reuse_pool_buffers_of_every_class)
{
	static const size_t sizes[] = { 1, 255, 256, 257, 4095, 4096, 4097, 65535, 65536 };
	static uint8_t out[65536], in[65536];
	struct sib_pair p;
	int ca, sb;

	sib_pair_open(&p);
	sib_pair_connect(&p, SOCK_SEQPACKET, &ca, &sb);
	for (unsigned round = 0; round < 40; round++) {
		for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			int from = (round & 1) ? sb : ca, to = (round & 1) ? ca : sb;
			uint64_t seed = round * 100u + i + 1;

			hs_fill(out, sizes[i], seed, 0);
			ASSERT_EQ(uvsock_send(from, out, sizes[i], MSG_EOR), (ssize_t)sizes[i]);
			ASSERT_EQ(uvsock_recv(to, in, sizeof(in), 0), (ssize_t)sizes[i]);
			ASSERT_EQ(hs_check(in, sizes[i], seed, 0), sizes[i]);
		}
	}
	uvsock_close(ca);
	uvsock_close(sb);
	sib_pair_close(&p);
}

/* Both directions at once over rings of a given size: tiny rings exercise the TX-full and
 * RX-refill paths on almost every packet, large ones the batching. */
static void both_ways_with_queue_size(unsigned qsize, uint32_t rx_min, uint32_t rx_max)
{
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = UVSOCK_GUEST_NO_DGRAM,
				       .queue_size = qsize, .rx_buf_min = rx_min,
				       .rx_buf_max = rx_max };
	struct tdev t;
	struct uvsock_ctx *g;
	struct uvsock_guest_stats st = { .size = sizeof(st) };
	struct host_io hr, hw;
	pthread_t th_r, th_w;
	int lfd, hfd, gfd;
	const size_t total = 8u << 20;

	tdev_start(&t, 3);
	g = g_guest_new(t.sock, &o);
	gfd = g_connect_host(g, t.uds, SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	hr = (struct host_io){ .fd = hfd, .total = total, .seed = 11 };
	hw = (struct host_io){ .fd = hfd, .total = total, .seed = 12, .chunk = 3000 };
	ASSERT_EQ(pthread_create(&th_r, NULL, host_recv_main, &hr), 0);
	ASSERT_EQ(pthread_create(&th_w, NULL, host_send_main, &hw), 0);
	{
		struct g_io io = { .fd = gfd, .total = total, .chunk = 70000, .seed = 11 };
		pthread_t th;

		ASSERT_EQ(pthread_create(&th, NULL, g_send_main, &io), 0);
		g_recv_pattern(gfd, total, 12);
		pthread_join(th, NULL);
	}
	pthread_join(th_r, NULL);
	pthread_join(th_w, NULL);
	ASSERT_TRUE(hr.ok);
	ASSERT_TRUE(hw.ok);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	test_note("queue %u: rx bufs %" PRIu64 " posted %" PRIu64 " buf_len %" PRIu64
		  " tx pkts %" PRIu64 " tx full %" PRIu64, qsize, st.rx_bufs, st.rx_posted,
		  st.rx_buf_len, st.tx_pkts, st.tx_full);
	ASSERT_LE(st.rx_posted, qsize);
	ASSERT_GE(st.rx_buf_len, (rx_min ? rx_min : 4096) + 44);
	ASSERT_LE(st.rx_buf_len, (rx_max ? rx_max : 65536) + 44);
	ASSERT_EQ(st.rx_dropped, 0);
	guest_conn_free(&t, g, gfd, hfd, lfd);
}

TEST(tiny_rings_both_ways)
{
	both_ways_with_queue_size(4, 0, 0);
}

TEST(large_rings_and_fixed_small_rx_buffers_both_ways)
{
	/* rx_buf_min = rx_buf_max: a fixed size, as Linux; the device splits what does not fit. */
	both_ways_with_queue_size(1024, 4096, 4096);
}

TEST(bad_options_are_refused)
{
	struct tdev t;
	struct uvsock_guest_opts o = { .size = sizeof(o) };

	tdev_start(&t, 3);
	o.queue_size = 100; /* not a power of two */
	ASSERT_TRUE(uvsock_ctx_new_guest(t.sock, &o) == NULL);
	ASSERT_EQ(errno, EINVAL);
	o = (struct uvsock_guest_opts){ .size = sizeof(o), .rx_buf_min = 8192, .rx_buf_max = 4096 };
	ASSERT_TRUE(uvsock_ctx_new_guest(t.sock, &o) == NULL);
	ASSERT_EQ(errno, EINVAL);
	o = (struct uvsock_guest_opts){ .size = sizeof(o), .flags = 0x80000000u };
	ASSERT_TRUE(uvsock_ctx_new_guest(t.sock, &o) == NULL);
	ASSERT_EQ(errno, EINVAL);
	ASSERT_TRUE(uvsock_ctx_new_guest(NULL, NULL) == NULL);
	ASSERT_EQ(errno, EINVAL);
	/* Nobody listening: a bounded wait, then ETIMEDOUT. */
	o = (struct uvsock_guest_opts){ .size = sizeof(o), .timeout_ms = 200 };
	ASSERT_TRUE(uvsock_ctx_new_guest("/tmp/uvsock-no-such-dir/x.sock", &o) == NULL);
	ASSERT_EQ(errno, ETIMEDOUT);
	/* Not a guest context. */
	{
		struct uvsock_ctx *lb = uvsock_ctx_new_loopback(NULL);
		struct uvsock_guest_stats st = { .size = sizeof(st) };

		ASSERT_TRUE(lb != NULL);
		ASSERT_EQ(uvsock_ctx_guest_transport_reset(lb), -1);
		ASSERT_EQ(errno, EINVAL);
		ASSERT_EQ(uvsock_ctx_guest_get_stats(lb, &st), -1);
		ASSERT_EQ(errno, EINVAL);
		uvsock_ctx_free(lb);
	}
	tdev_stop(&t);
}

TEST_MAIN()
