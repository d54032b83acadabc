/* SPDX-License-Identifier: MIT */
/*
 * The event queue end to end (docs/vhost-user.md "Event queue"; docs/guest-role.md "Transport
 * reset"): the guest role with UVSOCK_GUEST_EVENT_QUEUE hands three queues to the device role
 * in-process over the project's front-end. A transport reset of the device (the VMM's call, and
 * the device's own after rings stopped) reaches the guest as VIRTIO_VSOCK_EVENT_TRANSPORT_RESET:
 * connected sockets fail with ECONNRESET both ways, the listener stays and serves a new
 * connection, a new connect works. Without the event queue (two queues, as QEMU) nothing is
 * posted and the guest keeps its sockets, which is what the event queue is for.
 *
 * The device sends nothing for the connections it drops; it posts the event, and its new session
 * answers any later guest packet of an old connection (a credit update still in flight) with an
 * RST, which the guest may take from RX before the event. Either order ends in ECONNRESET, as on
 * Linux (docs/guest-role.md "Transport reset"); the counters are read only after the sockets
 * were reset, so the checks below need no waiting.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/device.h>
#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "guestside.h"
#include "lib/lib.h"
#include "device/vhu.h"
#include "driver/driver.h"
#include "drvtest.h"
#include "test.h"

static uint64_t ev_resets(struct uvsock_ctx *g)
{
	struct vdrv_stats st;

	vdrv_get_stats(lib_ctx_guest_vdrv(g), &st);
	return st.ev_resets;
}

static uint64_t dev_resets(struct tdev *t)
{
	struct vsock_dev_stats st;

	vsock_dev_get_stats(t->d, &st);
	return st.transport_resets;
}

/* A guest with (flag) or without the event queue, a host -> guest and a guest -> host stream. */
struct evq_case {
	struct tdev t;
	struct uvsock_ctx *g;
	int ls, gin, hin;   /* guest listener on 6000; accepted guest fd; its host end */
	int hl, gout, hout; /* host listener on 5000; guest fd connected there; accepted host fd */
};

static void case_open(struct evq_case *c, unsigned flags)
{
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = flags };
	char b;

	tdev_start(&c->t, 3);
	c->g = g_guest_new(c->t.sock, &o);
	c->ls = g_listen(c->g, SOCK_STREAM, 6000);
	c->gin = g_accept_host(c->ls, c->t.uds, SOCK_STREAM, 6000, &c->hin);
	c->gout = g_connect_host(c->g, c->t.uds, SOCK_STREAM, 5000, WAIT_MS, &c->hl, &c->hout);
	g_set_timeouts(c->gin, WAIT_MS);
	hs_write_all(c->hin, "i", 1);
	ASSERT_EQ(uvsock_recv(c->gin, &b, 1, 0), 1);
	ASSERT_EQ(uvsock_send(c->gout, "o", 1, 0), 1);
	ASSERT_EQ(hs_read_full(c->hout, &b, 1, WAIT_MS), 1);
}

static void case_close(struct evq_case *c)
{
	uvsock_close(c->gin);
	uvsock_close(c->gout);
	uvsock_close(c->ls);
	if (c->hin >= 0)
		close(c->hin);
	close(c->hout);
	close(c->hl);
	uvsock_ctx_free(c->g);
	tdev_stop(&c->t);
}

/* The socket's pending error (SO_ERROR), which reading clears. */
static int so_error(int fd)
{
	int err = -1;
	socklen_t len = sizeof(err);

	ASSERT_EQ(uvsock_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
	return err;
}

/*
 * After a reset (ev_resets counted): both guest sockets are closed with ECONNRESET (POLLERR and
 * POLLHUP, SO_ERROR, as Linux's virtio_vsock_reset_sock leaves them), no byte comes, a send
 * fails; both host ends see EOF. No wait for the guest: the count follows the reset.
 */
static void expect_guest_reset(struct evq_case *c)
{
	const int bad = POLLERR | POLLHUP;
	char b;

	ASSERT_EQ(uvsock_poll_events(c->gin) & bad, bad);
	ASSERT_EQ(uvsock_poll_events(c->gout) & bad, bad);
	ASSERT_EQ(so_error(c->gin), ECONNRESET);
	ASSERT_EQ(so_error(c->gout), ECONNRESET);
	ASSERT_LE(uvsock_recv(c->gin, &b, 1, MSG_DONTWAIT), 0);
	ASSERT_EQ(uvsock_send(c->gout, "x", 1, MSG_NOSIGNAL), -1);
}

static void expect_reset(struct evq_case *c)
{
	ASSERT_TRUE(hs_wait_eof(c->hin, WAIT_MS));
	ASSERT_TRUE(hs_wait_eof(c->hout, WAIT_MS));
	expect_guest_reset(c);
}

/* One byte each way over a guest fd and its host end, then both closed. */
static void roundtrip_and_close(int gfd, int hfd, char v)
{
	char b = 0;

	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, &v, 1);
	ASSERT_TRUE(uvsock_recv(gfd, &b, 1, 0) == 1 && b == v);
	ASSERT_EQ(uvsock_send(gfd, &v, 1, 0), 1);
	ASSERT_TRUE(hs_read_full(hfd, &b, 1, WAIT_MS) == 1 && b == v);
	uvsock_close(gfd);
	close(hfd);
}

/* The listener still serves and a new connect works. */
static void expect_works_after(struct evq_case *c)
{
	int gfd, hfd;

	gfd = g_accept_host(c->ls, c->t.uds, SOCK_STREAM, 6000, &hfd);
	roundtrip_and_close(gfd, hfd, 'n');
	gfd = g_connect_accept(c->g, c->hl, SOCK_STREAM, 5000, &hfd);
	roundtrip_and_close(gfd, hfd, 'm');
}

TEST(vmm_transport_reset_reaches_the_guest_through_the_event_queue)
{
	struct evq_case c;

	case_open(&c, UVSOCK_GUEST_EVENT_QUEUE);
	ASSERT_EQ(vdrv_features(lib_ctx_guest_vdrv(c.g)) != 0, 1);
	ASSERT_EQ(ev_resets(c.g), 0);
	ASSERT_EQ(uvsock_dev_transport_reset(dev_api(c.t.d)), 0);
	ASSERT_WAIT_FOR(ev_resets(c.g) == 1, WAIT_MS);
	ASSERT_EQ(dev_resets(&c.t), 1);
	expect_reset(&c);
	expect_works_after(&c);
	ASSERT_EQ(ev_resets(c.g), 1);
	case_close(&c);
}

TEST(two_resets_two_events_and_the_buffers_are_reposted)
{
	struct evq_case c;

	case_open(&c, UVSOCK_GUEST_EVENT_QUEUE);
	/* More resets than event buffers would exhaust a ring that is not refilled (128). */
	for (unsigned i = 1; i <= 200; i++) {
		ASSERT_EQ(uvsock_dev_transport_reset(dev_api(c.t.d)), 0);
		ASSERT_WAIT_FOR(ev_resets(c.g) == i, WAIT_MS);
	}
	ASSERT_EQ(dev_resets(&c.t), 200);
	expect_reset(&c);
	expect_works_after(&c);
	case_close(&c);
}

/*
 * A socket the peer closed before the reset and the application still holds is reset too: the
 * host end closes, the guest sees EOF without an error (SHUTDOWN from the device), then the
 * event gives it ECONNRESET, as Linux's virtio_vsock_reset_sock() on a socket that is still in
 * vsock_connected_table. This is the order an RST answering an in-flight packet also makes.
 */
TEST(a_socket_the_peer_closed_first_is_reset_too)
{
	struct evq_case c;
	char b;

	case_open(&c, UVSOCK_GUEST_EVENT_QUEUE);
	close(c.hin);
	c.hin = -1;
	ASSERT_EQ(uvsock_recv(c.gin, &b, 1, 0), 0); /* EOF: g_set_timeouts bounds the wait */
	ASSERT_WAIT_FOR(uvsock_poll_events(c.gin) & POLLHUP, WAIT_MS); /* closed, not reset */
	ASSERT_EQ(uvsock_poll_events(c.gin) & POLLERR, 0);
	ASSERT_EQ(so_error(c.gin), 0);
	ASSERT_EQ(uvsock_dev_transport_reset(dev_api(c.t.d)), 0);
	ASSERT_WAIT_FOR(ev_resets(c.g) == 1, WAIT_MS);
	ASSERT_TRUE(hs_wait_eof(c.hout, WAIT_MS));
	expect_guest_reset(&c);
	case_close(&c);
}

TEST(without_the_event_queue_nothing_is_posted)
{
	struct evq_case c;
	ssize_t r;
	char b;

	case_open(&c, 0);
	ASSERT_EQ(uvsock_dev_transport_reset(dev_api(c.t.d)), 0);
	/* The device dropped its side (host ends closed); the guest was not told. */
	ASSERT_TRUE(hs_wait_eof(c.hin, WAIT_MS));
	ASSERT_TRUE(hs_wait_eof(c.hout, WAIT_MS));
	ASSERT_EQ(dev_resets(&c.t), 0);
	ASSERT_EQ(ev_resets(c.g), 0);
	/*
	 * Still "connected" as far as the guest knows, unless a packet of its own (a credit update
	 * still in flight at the reset) met the new session, which answers with an RST: EOF then,
	 * as on Linux. Never ECONNRESET: no reset reached the guest.
	 */
	r = uvsock_recv(c.gin, &b, 1, MSG_DONTWAIT);
	ASSERT_TRUE(r == 0 || (r == -1 && errno == EAGAIN));
	ASSERT_EQ(so_error(c.gin), 0);
	expect_works_after(&c);
	case_close(&c);
}

TEST_MAIN()
