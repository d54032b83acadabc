/* SPDX-License-Identifier: MIT */
/*
 * Crash survival under `uvsockd --isolate` (docs/upgrade.md, "Crash survival"): the worker
 * serving a VM is killed with SIGKILL while the VM has connections open both ways and a
 * listener; the main process kept the VMM's vhost-user connection and configuration, and the
 * worker it starts again adopts them. Checked: the front-end's connection was never closed and
 * the front-end sent nothing again (the guest role's driver saw no back-end loss, and the new
 * worker logs the adoption), the old connections end on both sides (the guest's with
 * ECONNRESET from the TRANSPORT_RESET on the event queue, or with the RST sent for each
 * connection of the kept list when the event queue is the VMM's), the guest's listener keeps
 * working, new connections work both ways, and the VM of the other worker is untouched. Then:
 * two sibling VMs of one worker, both adopted after one kill; a worker killed while a ring is
 * stopped (a hand-driven front-end: the adopted back-end answers at once and restarts the ring
 * where the front-end says); a VMM that disconnects while the worker is down (the new worker
 * listens again; a new VMM is served); a running packed ring, whose adoption is refused with a
 * clear log. Each daemon is a child of this process, stopped by PID; each worker is found by
 * its name among the daemon's children.
 */
#include "guestside.h"
#include "restarts.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "workers.h"
/* The raw front-end below uses the project's own vsock definitions. */
#undef VMADDR_CID_HYPERVISOR
#undef VMADDR_CID_LOCAL
#undef VMADDR_CID_HOST
#undef VMADDR_CID_ANY
#undef VMADDR_PORT_ANY
#include "util/time.h"
#include "util/tune.h"
#include "vhost_user/frontend.h"

/* One byte each way on a guest fd and its host end. */
static void ping(int gfd, int hfd, char c)
{
	char b = 0;

	hs_write_all(hfd, &c, 1);
	ASSERT_EQ(uvsock_recv(gfd, &b, 1, 0), 1);
	ASSERT_EQ(b, c);
	ASSERT_EQ(uvsock_send(gfd, &c, 1, 0), 1);
	ASSERT_EQ(hs_read_full(hfd, &b, 1, WAIT_MS), 1);
	ASSERT_EQ(b, c);
}

/* `uvsockd --isolate --log-level=debug`, VM i in group g<cid>, as uvd_start does. */
static void crash_start(struct uvd *u, int nvms, const uint32_t *cids)
{
	char vm[2][400];
	char *argv[8] = { (char *)uvd_binary(), "--isolate", "--log-level=debug" };
	int argc = 3;

	ASSERT_LE(nvms, 2);
	memset(u, 0, sizeof(*u));
	u->nvms = nvms;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-crash-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	for (int i = 0; i < nvms; i++) {
		u->cid[i] = cids[i];
		snprintf(u->sock[i], sizeof(u->sock[i]), "%s/vm%u.sock", u->dir, cids[i]);
		snprintf(u->uds[i], sizeof(u->uds[i]), "%s/vm%u.vsock", u->dir, cids[i]);
		snprintf(vm[i], sizeof(vm[i]), "guest-cid=%u,socket=%s,uds-path=%s,groups=g%u",
			 cids[i], u->sock[i], u->uds[i], cids[i]);
		argv[argc++] = "--vm";
		argv[argc++] = vm[i];
	}
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
}

/*
 * VM 3 (the guest role; event queue handed over or not, ev) and VM 4, one worker each: VM 3's
 * worker is killed with open connections and adopted by the next one.
 */
static void killed_worker_adopts_its_vmm(bool ev)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = ev ? UVSOCK_GUEST_EVENT_QUEUE : 0 };
	struct uvsock_ctx *g, *g4;
	struct uvsock_guest_stats st;
	int ls, lfd, hfd1, gfd1, hfd2, gfd2, lfd4, hfd4, gfd4, lfd5, hfd5, gfd5, hfd6, gfd6;
	pid_t w3, w4, w3b;
	uint64_t t0;
	struct uvd u;

	/* Split rings (a running packed ring is not adopted: the last case). The guest role of
	 * this process read its own switches before: only the daemon inherits this. */
	(void)tune_get();
	ASSERT_OK(setenv("UVSOCK_TUNE", "no-packed", 1));
	crash_start(&u, 2, cids);
	ASSERT_OK(unsetenv("UVSOCK_TUNE"));
	w3 = worker_of(&u, 3);
	w4 = worker_of(&u, 4);
	g = g_guest_new(u.sock[0], &o);
	g4 = g_guest_new(u.sock[1], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	/* Guest -> host and host -> guest on VM 3, guest -> host on VM 4; each carries bytes. */
	gfd1 = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd1);
	gfd2 = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd2);
	g_set_timeouts(gfd2, WAIT_MS);
	gfd4 = g_connect_host(g4, u.uds[1], SOCK_STREAM, 5000, WAIT_MS, &lfd4, &hfd4);
	ping(gfd1, hfd1, 'a');
	ping(gfd2, hfd2, 'b');
	ping(gfd4, hfd4, 'c');
	st = guest_stats(g);
	ASSERT_EQ(st.backend_lost, 0);
	ASSERT_EQ(st.resets, 0);

	/* The crash: SIGKILL of VM 3's worker; the main starts another after its back-off. */
	ASSERT_TRUE(file_has(u.log, "crash survival: on (--isolate)"));
	/* The main has the list of VM 3's connections (written at most VHU_KEEP_CONNS_MS after
	 * they changed): what the RSTs of the two-queue case come from. */
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: crash-survival record kept: ") &&
				log_last_has(u.log, "vm3: crash-survival record kept: ",
					     "2 connections"), WAIT_MS);
	t0 = mono_ms();
	ASSERT_OK(kill(w3, SIGKILL));
	ASSERT_WAIT_FOR(pid_gone(w3), WAIT_MS);
	/* The host ends of the old connections end with the dead worker. */
	ASSERT_TRUE(hs_wait_eof(hfd1, WAIT_MS));
	ASSERT_TRUE(hs_wait_eof(hfd2, WAIT_MS));
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	/* With the event queue the TRANSPORT_RESET ends them (an RST racing it could end them
	 * first, and the event would then reset the guest's next connection too): no RST. */
	ASSERT_TRUE(file_has(u.log, ev ? "(the event queue's TRANSPORT_RESET ends them)"
				       : "(2 RSTs sent of 2 kept;"));
	w3b = worker_of(&u, 3);
	ASSERT_NE(w3b, w3);
	/* The guest's old connections end, both of them, without anything sent on them. */
	guest_conn_ended(gfd1);
	guest_conn_ended(gfd2);
	/* A new connection each way: the guest's listener survived. */
	gfd5 = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, WAIT_MS, &lfd5, &hfd5);
	gfd6 = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd6);
	g_set_timeouts(gfd6, WAIT_MS);
	ping(gfd5, hfd5, 'd');
	ping(gfd6, hfd6, 'e');
	printf("# kill -9 of the worker to both new connections working: %llu ms (load: see "
	       "/proc/loadavg)\n", (unsigned long long)(mono_ms() - t0));
	/* The same vhost-user connection all along: the guest's driver never lost its back-end
	 * (it would have reconnected and set its rings up again); with the event queue, the one
	 * TRANSPORT_RESET is what ended its connections. */
	st = guest_stats(g);
	ASSERT_EQ(st.backend_lost, 0);
	ASSERT_EQ(st.resets, ev ? 1u : 0u);
	ASSERT_EQ(log_count(u.log, "vm3: VMM connected"), 1);
	/* VM 4 and its worker were untouched: the same connection still carries bytes. */
	ASSERT_EQ(worker_of(&u, 4), w4);
	ping(gfd4, hfd4, 'f');
	ASSERT_EQ(guest_stats(g4).resets, 0);

	for (int i = 0; i < 4; i++)
		uvsock_close((int[]){ gfd1, gfd2, gfd5, gfd6 }[i]);
	for (int i = 0; i < 7; i++)
		close((int[]){ lfd, hfd1, hfd2, lfd5, hfd5, hfd6, lfd4 }[i]);
	close(hfd4);
	uvsock_close(gfd4);
	uvsock_close(ls);
	uvsock_ctx_free(g);
	uvsock_ctx_free(g4);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(a_killed_worker_adopts_its_vmm_and_the_guest_gets_a_transport_reset)
{
	killed_worker_adopts_its_vmm(true);
}

/* Two queues, as QEMU: the event queue is the VMM's, so each kept connection gets an RST. */
TEST(a_killed_worker_adopts_its_vmm_and_sends_an_rst_for_each_connection)
{
	killed_worker_adopts_its_vmm(false);
}

/* Siblings share a worker: one kill, both VMs adopted, both keep working. */
TEST(siblings_sharing_a_killed_worker_are_both_adopted)
{
	static const uint32_t cids[] = { 5, 6 };
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = UVSOCK_GUEST_EVENT_QUEUE };
	struct uvsock_ctx *g[2];
	int lfd[2], hfd[2], gfd[2];
	pid_t w;
	struct uvd u;

	(void)tune_get();
	ASSERT_OK(setenv("UVSOCK_TUNE", "no-packed", 1));
	uvd_start(&u, 2, cids, "shared", "--isolate");
	ASSERT_OK(unsetenv("UVSOCK_TUNE"));
	w = worker_of(&u, 5);
	for (int i = 0; i < 2; i++)
		g[i] = g_guest_new(u.sock[i], &o);
	ASSERT_WAIT_FOR(log_count(u.log, "VMM connected") == 2, WAIT_MS);
	ASSERT_OK(kill(w, SIGKILL));
	ASSERT_WAIT_FOR(file_has(u.log, "vm5: adopted the VMM's") &&
				file_has(u.log, "vm6: adopted the VMM's"), WAIT_MS);
	for (int i = 0; i < 2; i++) {
		gfd[i] = g_connect_host(g[i], u.uds[i], SOCK_STREAM, 5000, WAIT_MS, &lfd[i], &hfd[i]);
		ping(gfd[i], hfd[i], 'g');
		ASSERT_EQ(guest_stats(g[i]).backend_lost, 0);
		uvsock_close(gfd[i]);
		close(hfd[i]);
		close(lfd[i]);
		uvsock_ctx_free(g[i]);
	}
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* ---- a hand-driven front-end -------------------------------------------------------------- */

static struct vhu_front *front_up(const char *sock)
{
	struct vhu_front_config fc;
	struct vhu_front *f;

	vhu_front_config_init(&fc);
	fc.mem_size = 4u << 20;
	ASSERT_WAIT_FOR(vhu_front_connect(sock, &fc, &f) == 0, WAIT_MS);
	ASSERT_OK(vhu_front_init(f));
	ASSERT_OK(vhu_front_start(f));
	return f;
}

TEST(a_worker_killed_while_a_ring_is_stopped_is_adopted_with_it_stopped)
{
	static const uint32_t cids[] = { 3 };
	struct vhu_front *f;
	uint16_t base = 0, again = 0;
	uint8_t cid[8];
	struct uvd u;
	pid_t w3;

	uvd_start(&u, 1, cids, NULL, "--isolate");
	w3 = worker_of(&u, 3);
	f = front_up(u.sock[0]);
	/* TX stopped (GET_VRING_BASE, as a VMM stopping the device), RX left running. */
	ASSERT_OK(vhu_front_get_vring_base(f, 1, &base));
	ASSERT_OK(kill(w3, SIGKILL));
	ASSERT_WAIT_FOR(pid_gone(w3), WAIT_MS);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	/* The same connection answers at once (no message of ours was lost or is waited for). */
	ASSERT_OK(vhu_front_get_config(f, 0, 8, cid));
	ASSERT_EQ(cid[0], 3);
	/* TX was adopted stopped: restarting it where the front-end says is accepted, and
	 * stopping it again answers that index (a ring the adopted back-end ran would have
	 * refused SET_VRING_BASE, -EBUSY, and closed the connection). */
	ASSERT_OK(vhu_front_setup_ring(f, 1, 77));
	ASSERT_OK(vhu_front_enable_ring(f, 1, true));
	ASSERT_OK(vhu_front_get_vring_base(f, 1, &again));
	ASSERT_EQ(again, 77);
	ASSERT_FALSE(file_has(u.log, "closing VMM connection"));
	vhu_front_free(f);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(a_vmm_that_disconnects_while_its_worker_is_down_is_dropped_and_the_next_one_served)
{
	static const uint32_t cids[] = { 3 };
	struct vhu_front *f;
	struct uvsock_ctx *g;
	int lfd, hfd, gfd;
	struct uvd u;
	pid_t w3;

	crash_start(&u, 1, cids);
	w3 = worker_of(&u, 3);
	f = front_up(u.sock[0]);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: VMM connected"), WAIT_MS);
	/*
	 * Killed, and the VMM gone at once, normally before the new worker starts (its back-off
	 * is 200 ms): the main's copy of the connection is then its last one, and the main must
	 * close it (logged at warn, "while its worker was down"; at debug if the main had not
	 * reaped the worker yet). Should the new worker adopt it first, it finds it closed.
	 */
	ASSERT_OK(kill(w3, SIGKILL));
	vhu_front_free(f);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: the VMM closed its vhost-user connection"), WAIT_MS);
	ASSERT_WAIT_FOR(file_has(u.log, "started again for vm3"), WAIT_MS);
	/* The new worker listens: a new VMM (a guest) is served. */
	g = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ping(gfd, hfd, 'x');
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(a_running_packed_ring_is_not_adopted_and_says_why)
{
	static const uint32_t cids[] = { 3 };
	struct uvsock_ctx *g;
	struct uvd u;
	pid_t w3;

	/* The guest role and the daemon negotiate packed rings by default. */
	(void)tune_get();
	uvd_start(&u, 1, cids, NULL, "--isolate");
	w3 = worker_of(&u, 3);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: VMM connected"), WAIT_MS);
	ASSERT_OK(kill(w3, SIGKILL));
	ASSERT_WAIT_FOR(file_has(u.log, "cannot adopt the VMM after a crash: queue 0: a running "
				 "packed ring cannot be adopted"), WAIT_MS);
	/* The connection is closed (the guest's driver sees its back-end gone) and the daemon
	 * serves on. */
	ASSERT_WAIT_FOR(guest_stats(g).backend_lost >= 1, WAIT_MS);
	ASSERT_FALSE(file_has(u.log, "adopted the VMM's"));
	uvsock_ctx_free(g);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
