/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's side of a VMM reconnect (docs/vhost-user.md, "VMM reconnect and back-end restart"):
 * two VMs in one uvsockd child process (by PID, temporary directory, bounded waits). VM B
 * streams patterned bytes guest -> host while VM A's front-end disconnects and reconnects three
 * times, each time with live connections both ways. B's bytes all arrive, in order and intact;
 * A's connections are reset each time (guest: POLLERR and ECONNRESET; host: EOF); A's listener
 * survives and A works after each reconnect, with two queues (as QEMU) and with the event queue.
 */
#include <pthread.h>

#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"

#define MiB (1024u * 1024u)

/* VM A: one live connection each way, then a reconnect; both are reset, the listener serves. */
static void a_reconnect_round(struct uvd *u, struct uvsock_ctx *a, int ls, int hl)
{
	int gin, hin, gout, hout, err = 0;
	socklen_t elen = sizeof(err);
	char b;

	gin = g_accept_host(ls, u->uds[0], SOCK_STREAM, 6000, &hin);
	gout = g_connect_accept(a, hl, SOCK_STREAM, 5000, &hout);
	g_set_timeouts(gin, WAIT_MS);
	hs_write_all(hin, "a", 1);
	ASSERT_EQ(uvsock_recv(gin, &b, 1, 0), 1);
	ASSERT_EQ(uvsock_send(gout, "b", 1, 0), 1);
	ASSERT_EQ(hs_read_full(hout, &b, 1, WAIT_MS), 1);

	/*
	 * The reconnect resets the sockets before it returns, with the I/O thread stopped and
	 * the old front-end closed (vdrv_reconnect): no RST of the back-end can come first, and
	 * an event of the new session only sets ECONNRESET again. So no wait on the guest side.
	 */
	ASSERT_EQ(uvsock_ctx_guest_reconnect(a), 0);
	ASSERT_EQ(uvsock_poll_events(gout) & (POLLERR | POLLHUP), POLLERR | POLLHUP);
	ASSERT_EQ(uvsock_poll_events(gin) & (POLLERR | POLLHUP), POLLERR | POLLHUP);
	ASSERT_TRUE(hs_wait_eof(hin, WAIT_MS));
	ASSERT_TRUE(hs_wait_eof(hout, WAIT_MS));
	ASSERT_EQ(uvsock_getsockopt(gout, SOL_SOCKET, SO_ERROR, &err, &elen), 0);
	ASSERT_EQ(err, ECONNRESET);
	elen = sizeof(err);
	ASSERT_EQ(uvsock_getsockopt(gin, SOL_SOCKET, SO_ERROR, &err, &elen), 0);
	ASSERT_EQ(err, ECONNRESET);
	uvsock_close(gin);
	uvsock_close(gout);
	close(hin);
	close(hout);

	/* A works after: a new connection through the surviving listener. */
	gin = g_accept_host(ls, u->uds[0], SOCK_STREAM, 6000, &hin);
	g_set_timeouts(gin, WAIT_MS);
	hs_write_all(hin, "c", 1);
	ASSERT_TRUE(uvsock_recv(gin, &b, 1, 0) == 1 && b == 'c');
	close(hin);
	uvsock_close(gin);
}

static void one_vm_reconnects_other_streams(unsigned a_flags)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvsock_guest_opts ao = { .size = sizeof(ao), .flags = a_flags };
	struct uvd u;
	struct uvsock_ctx *a, *bg;
	struct host_io hr;
	struct g_io gs;
	pthread_t th_r, th_s;
	int ls, hl, lb, hb, gb;
	bool alive;

	uvd_start(&u, 2, cids, NULL, NULL);
	/* VM B: 96 MiB guest -> host in 16 KiB writes, checked byte by byte on the host. */
	bg = g_guest_new(u.sock[1], NULL);
	gb = g_connect_host(bg, u.uds[1], SOCK_STREAM, 5000, WAIT_MS, &lb, &hb);
	hr = (struct host_io){ .fd = hb, .total = 96 * MiB, .seed = 77, .chunk = 16384 };
	gs = (struct g_io){ .fd = gb, .total = hr.total, .chunk = 16384, .seed = 77 };
	ASSERT_EQ(pthread_create(&th_r, NULL, host_recv_main, &hr), 0);
	ASSERT_EQ(pthread_create(&th_s, NULL, g_send_main, &gs), 0);

	/* VM A, meanwhile: three disconnect/reconnect rounds with live connections. */
	a = g_guest_new(u.sock[0], &ao);
	ls = g_listen(a, SOCK_STREAM, 6000);
	hl = hs_listen_port(u.uds[0], 5000, SOCK_STREAM);
	for (int round = 0; round < 3; round++)
		a_reconnect_round(&u, a, ls, hl);

	pthread_join(th_s, NULL);
	pthread_join(th_r, NULL);
	ASSERT_TRUE(hr.ok); /* B: every byte, in order */
	ASSERT_EQ(uvsock_shutdown(gb, SHUT_WR), 0);
	ASSERT_TRUE(hs_wait_eof(hb, WAIT_MS));
	/* Both VMs' ends, then the daemon, which must have lived through it all. */
	for (int i = 0; i < 3; i++)
		close((int[]){ hl, lb, hb }[i]);
	uvsock_close(ls);
	uvsock_close(gb);
	uvsock_ctx_free(a);
	uvsock_ctx_free(bg);
	alive = uvd_alive(&u);
	ASSERT_TRUE(alive);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(vm_a_reconnects_while_vm_b_streams)
{
	one_vm_reconnects_other_streams(0);
}

TEST(vm_a_with_the_event_queue_reconnects_while_vm_b_streams)
{
	one_vm_reconnects_other_streams(UVSOCK_GUEST_EVENT_QUEUE);
}

TEST_MAIN()
