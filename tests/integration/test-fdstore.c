/* SPDX-License-Identifier: MIT */
/*
 * Crash survival without --isolate through systemd's fd store (daemon/fdstore.h;
 * docs/upgrade.md, "Without --isolate: the systemd fd store"). This process plays the service
 * manager (tests/harness/fakesd.h: its own NOTIFY_SOCKET, a store that honours FDSTORE=1,
 * FDNAME= and FDSTOREREMOVE=1 and keeps one copy of a file as systemd does) and the VM (the
 * project's guest role). uvsockd is killed with SIGKILL while the VM has connections open both
 * ways and a listener, and started again with the store as LISTEN_FDS: the new process adopts
 * the VMM's connection. Checked: the front-end's connection was never closed (the guest role's
 * driver saw no back-end loss, one "VMM connected" in the log), the old connections end on both
 * sides (TRANSPORT_RESET, or one RST per kept connection when the event queue is the VMM's),
 * new connections work both ways, a second SIGKILL is survived the same way, and a clean
 * SIGTERM empties the store. Then: a garbled stored record is refused with a log line, its fds
 * are removed from the store, and the VM waits for a VMM as usual; an fd nobody stores and a
 * store that is not there; an eventfd the VMM replaces replaces its stored copy; and
 * tests/harness/fake-fdstore, the same service manager as a program.
 */
#include "fakesd.h"
#include "guestside.h"
#include "restarts.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "workers.h"
#undef VMADDR_CID_HYPERVISOR
#undef VMADDR_CID_LOCAL
#undef VMADDR_CID_HOST
#undef VMADDR_CID_ANY
#undef VMADDR_PORT_ANY
#include "util/rec.h"
#include "util/time.h"
#include "vhost_user/frontend.h"
#include "vhost_user/protocol.h"
#include <sys/eventfd.h>
#include "util/tune.h"

#define PREFIX "uvsock-crash-"

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

/* uvsockd with one VM (cid) under the fake service manager s; the paths in u as uvd_start. */
static void fs_setup(struct uvd *u, struct fakesd *s, uint32_t cid)
{
	memset(u, 0, sizeof(*u));
	u->nvms = 1;
	u->cid[0] = cid;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-fdstore-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	snprintf(u->sock[0], sizeof(u->sock[0]), "%s/vm%u.sock", u->dir, cid);
	snprintf(u->uds[0], sizeof(u->uds[0]), "%s/vm%u.vsock", u->dir, cid);
	ASSERT_OK(fakesd_init(s, u->dir));
}

/* Starts uvsockd (with_store: the store as LISTEN_FDS) and waits for its READY=1. */
static void fs_start(struct uvd *u, struct fakesd *s, bool with_store)
{
	char vm[400];
	char *argv[] = { (char *)uvd_binary(), "--log-level=debug", "--vm", vm, NULL };
	unsigned ready = fakesd_ready(s);
	int log = open(u->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600), st;

	ASSERT_GE(log, 0);
	snprintf(vm, sizeof(vm), "guest-cid=%u,socket=%s,uds-path=%s", u->cid[0], u->sock[0],
		 u->uds[0]);
	u->pid = fakesd_spawn(s, argv, log, with_store);
	close(log);
	ASSERT_GT(u->pid, 0);
	if (!WAIT_FOR(fakesd_ready(s) > ready || uvd_exited(u, &st), WAIT_MS) || u->pid == 0)
		test_fail(__FILE__, __LINE__, "uvsockd not ready (log: %s)", u->log);
}

/* SIGKILL, reaped. */
static void fs_kill9(struct uvd *u)
{
	ASSERT_OK(kill(u->pid, SIGKILL));
	ASSERT_EQ(waitpid(u->pid, NULL, 0), u->pid);
	u->pid = 0;
}

/* A listening socket bound to path in s under name, as a .socket unit passes it. */
static void add_activated(struct fakesd *s, const char *path, const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_LT(strlen(path), sizeof(a.sun_path));
	memcpy(a.sun_path, path, strlen(path));
	ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
	ASSERT_OK(listen(fd, 16));
	pthread_mutex_lock(&s->lock);
	s->e[s->n].fd = fd;
	snprintf(s->e[s->n].name, sizeof(s->e[s->n].name), "%s", name);
	s->n++;
	pthread_mutex_unlock(&s->lock);
}

/*
 * The guest role (event queue ev) on VM 3 with a connection each way; uvsockd killed twice and
 * started again from the store each time; then a clean stop. activated: VM 3's vhost-user
 * socket is socket-activated (named by its basename), passed in LISTEN_FDS beside the store's.
 */
static void killed_twice_adopted_from_the_store(bool ev, bool activated)
{
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = ev ? UVSOCK_GUEST_EVENT_QUEUE : 0 };
	int ls, lfd[2], hfd[2], gfd[2];
	struct uvsock_ctx *g;
	struct fakesd *s = calloc(1, sizeof(*s));
	uint64_t t0;
	struct uvd u;

	ASSERT_TRUE(s != NULL);
	/* Split rings (a running packed ring is not adopted, test-crash.c). The guest role of this
	 * process read its own switches before: only the daemon inherits this. */
	(void)tune_get();
	ASSERT_OK(setenv("UVSOCK_TUNE", "no-packed", 1));
	fs_setup(&u, s, 3);
	if (activated)
		add_activated(s, u.sock[0], "vm3.sock");
	fs_start(&u, s, activated);
	ASSERT_TRUE(file_has(u.log, "crash survival: on (systemd fd store"));
	ASSERT_EQ(log_count(u.log, "socket-activated vhost-user socket"), activated ? 1 : 0);
	g = g_guest_new(u.sock[0], &o);
	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd[0] = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd[0], &hfd[0]);
	gfd[1] = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd[1]);
	g_set_timeouts(gfd[1], WAIT_MS);
	ping(gfd[0], hfd[0], 'a');
	ping(gfd[1], hfd[1], 'b');

	for (int round = 0; round < 2; round++) {
		char adopted[160];
		struct uvsock_guest_stats st;

		/* The store has the list of the two connections (written at most
		 * VHU_KEEP_CONNS_MS after they changed): what the RSTs come from. */
		ASSERT_WAIT_FOR(log_last_has(u.log, "vm3: crash-survival record stored in the fd "
					     "store", "fds, 2 connections"), WAIT_MS);
		/* Connection, memory, eventfds; the previous generation's record removed. */
		ASSERT_OK(fakesd_drain(s, WAIT_MS));
		ASSERT_EQ(fakesd_count(s, PREFIX "3-r"), 1u);
		ASSERT_GE(fakesd_count(s, PREFIX "3-f"), 4u);
		t0 = mono_ms();
		fs_kill9(&u);
		/* The host ends of the old connections end with the dead process. */
		ASSERT_TRUE(hs_wait_eof(hfd[0], WAIT_MS));
		ASSERT_TRUE(hs_wait_eof(hfd[1], WAIT_MS));
		for (int i = 0; i < 2; i++) {
			close(hfd[i]);
			close(lfd[i]);
		}
		fs_start(&u, s, true);
		snprintf(adopted, sizeof(adopted), "vm3: adopted the VMM's vhost-user connection");
		ASSERT_WAIT_FOR(log_count(u.log, adopted) == round + 1, WAIT_MS);
		ASSERT_EQ(log_count(u.log, "from the fd store offered"), round + 1);
		ASSERT_EQ(log_count(u.log, ev ? "(the event queue's TRANSPORT_RESET ends them)"
					      : "(2 RSTs sent of 2 kept;"), round + 1);
		/* The guest's old connections end, without anything sent on them. */
		guest_conn_ended(gfd[0]);
		guest_conn_ended(gfd[1]);
		uvsock_close(gfd[0]);
		uvsock_close(gfd[1]);
		/* New connections both ways: the guest's listener survived. */
		gfd[0] = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001 + round, WAIT_MS, &lfd[0],
					&hfd[0]);
		gfd[1] = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd[1]);
		g_set_timeouts(gfd[1], WAIT_MS);
		ping(gfd[0], hfd[0], 'c');
		ping(gfd[1], hfd[1], 'd');
		printf("# kill -9 %d to both new connections working: %llu ms (restart at once; "
		       "load: see /proc/loadavg)\n", round + 1, (unsigned long long)(mono_ms() - t0));
		/* Socket activation and the store side by side: the socket each time. */
		ASSERT_EQ(log_count(u.log, "socket-activated vhost-user socket"),
			  activated ? round + 2 : 0);
		/* One vhost-user connection all along. */
		st = guest_stats(g);
		ASSERT_EQ(st.backend_lost, 0);
		ASSERT_EQ(st.resets, ev ? (uint64_t)round + 1 : 0u);
		ASSERT_EQ(log_count(u.log, "vm3: VMM connected"), 1);
		/* The previous generation is gone from the store: one record, no stale fds. */
		ASSERT_WAIT_FOR(fakesd_count(s, PREFIX "3-r") == 1, WAIT_MS);
	}
	ASSERT_OK(unsetenv("UVSOCK_TUNE"));

	/* A clean stop empties the store: a later start adopts nothing. */
	ASSERT_EQ(uvd_kill(&u), 0);
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX) == 0, WAIT_MS);
	for (int i = 0; i < 2; i++) {
		uvsock_close(gfd[i]);
		close(hfd[i]);
		close(lfd[i]);
	}
	uvsock_close(ls);
	uvsock_ctx_free(g);
	fakesd_fini(s);
	free(s);
	ASSERT_EQ(uvd_stop(&u), -1); /* not running any more */
}

TEST(killed_twice_adopted_from_the_fd_store_with_a_transport_reset)
{
	killed_twice_adopted_from_the_store(true, false);
}

/* Two queues, as QEMU: the event queue is the VMM's, so each kept connection gets an RST. */
TEST(killed_twice_adopted_from_the_fd_store_with_an_rst_per_connection)
{
	killed_twice_adopted_from_the_store(false, false);
}

/* The vhost-user socket socket-activated: its name and the store's coexist in LISTEN_FDNAMES. */
TEST(killed_twice_adopted_from_the_fd_store_beside_a_socket_activated_socket)
{
	killed_twice_adopted_from_the_store(true, true);
}

/* Replaces the stored record of cid by a copy whose index claims one fd more. */
static void garble_record(struct fakesd *s, uint32_t cid)
{
	char prefix[64];
	size_t hit = 0;

	snprintf(prefix, sizeof(prefix), PREFIX "%u-r", cid);
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->n; i++) {
		const uint8_t *buf;
		uint8_t *copy;
		uint32_t nfds;
		size_t len;
		int fd;

		if (strncmp(s->e[i].name, prefix, strlen(prefix)) != 0)
			continue;
		ASSERT_OK(rec_map_fd(s->e[i].fd, &buf, &len));
		ASSERT_GT(len, 16u);
		copy = malloc(len);
		ASSERT_TRUE(copy != NULL);
		memcpy(copy, buf, len);
		rec_unmap(buf, len);
		memcpy(&nfds, copy + 8, 4); /* daemon/fdstore.c: struct idx_hdr */
		nfds++;
		memcpy(copy + 8, &nfds, 4);
		ASSERT_OK(rec_memfd(copy, len, "garbled", &fd));
		free(copy);
		close(s->e[i].fd);
		s->e[i].fd = fd;
		hit++;
	}
	pthread_mutex_unlock(&s->lock);
	ASSERT_EQ(hit, 1u);
}

TEST(a_garbled_stored_record_is_refused_and_the_vm_waits_for_a_vmm)
{
	struct fakesd *s = calloc(1, sizeof(*s));
	struct uvsock_ctx *g, *g2;
	int lfd, hfd, gfd;
	struct uvd u;

	ASSERT_TRUE(s != NULL);
	(void)tune_get();
	ASSERT_OK(setenv("UVSOCK_TUNE", "no-packed", 1));
	fs_setup(&u, s, 3);
	fs_start(&u, s, false);
	ASSERT_OK(unsetenv("UVSOCK_TUNE"));
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: crash-survival record stored in the fd store"),
			WAIT_MS);
	fs_kill9(&u);
	ASSERT_OK(fakesd_drain(s, WAIT_MS));
	garble_record(s, 3);
	fs_start(&u, s, true);
	ASSERT_TRUE(file_has(u.log, "the fd store's crash-survival record " PREFIX "3-r"));
	ASSERT_TRUE(file_has(u.log, "is refused: sizes do not add up"));
	ASSERT_FALSE(file_has(u.log, "adopted the VMM's"));
	/* Every fd of the old VMM is out of the store: its connection ends. */
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX) == 0, WAIT_MS);
	ASSERT_WAIT_FOR(guest_stats(g).backend_lost >= 1, WAIT_MS);
	uvsock_ctx_free(g);
	/* The VM waits for a VMM as usual: a new one is served, and stored. */
	g2 = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g2, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ping(gfd, hfd, 'x');
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX "3-r") == 1, WAIT_MS);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g2);
	ASSERT_EQ(uvd_kill(&u), 0);
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX) == 0, WAIT_MS);
	fakesd_fini(s);
	free(s);
	(void)uvd_stop(&u);
}

/* A stored fd whose name is not one uvsockd writes is closed with a log line; a service
 * manager without a store, and none at all: crash survival is off and says why. */
TEST(an_unknown_stored_fd_is_closed_and_no_notify_socket_means_off)
{
	struct fakesd *s = calloc(1, sizeof(*s));
	struct uvsock_ctx *g;
	struct uvd u;
	int p[2];

	ASSERT_TRUE(s != NULL);
	fs_setup(&u, s, 3);
	ASSERT_OK(pipe2(p, O_CLOEXEC));
	pthread_mutex_lock(&s->lock);
	s->e[0].fd = p[0];
	snprintf(s->e[0].name, sizeof(s->e[0].name), PREFIX "3-x1");
	s->n = 1;
	pthread_mutex_unlock(&s->lock);
	close(p[1]);
	fs_start(&u, s, true);
	ASSERT_TRUE(file_has(u.log, "named '" PREFIX "3-x1' is not one uvsockd stores: closed "
				    "and removed"));
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX) == 0, WAIT_MS);
	ASSERT_EQ(uvd_kill(&u), 0);
	/* A service manager without a store (FDSTORE= not exported): off, nothing sent, and an
	 * fd of a store (a unit changed since) closed at once, with a log line. */
	s->max = 0;
	ASSERT_OK(pipe2(p, O_CLOEXEC));
	pthread_mutex_lock(&s->lock);
	s->e[0].fd = p[0];
	snprintf(s->e[0].name, sizeof(s->e[0].name), PREFIX "3-r1");
	s->n = 1;
	pthread_mutex_unlock(&s->lock);
	fs_start(&u, s, true);
	ASSERT_TRUE(file_has(u.log, "crash survival: off (not --isolate, no fd store (FDSTORE="));
	ASSERT_TRUE(file_has(u.log, PREFIX "3-r1 inherited but not used (crash survival off): "
				    "closed"));
	/* With the store's copy gone, the write end sees the last read end closed (POLLERR):
	 * uvsockd holds none while it runs. */
	pthread_mutex_lock(&s->lock);
	close(s->e[0].fd);
	s->n = 0;
	pthread_mutex_unlock(&s->lock);
	ASSERT_WAIT_FOR(poll(&(struct pollfd){ .fd = p[1] }, 1, 0) == 1, WAIT_MS);
	ASSERT_TRUE(uvd_alive(&u));
	close(p[1]);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: VMM connected"), WAIT_MS);
	ASSERT_OK(fakesd_drain(s, WAIT_MS));
	ASSERT_EQ(fakesd_count(s, PREFIX), 0u);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_kill(&u), 0);
	fakesd_fini(s);
	free(s);
	(void)uvd_stop(&u);

	uvd_start(&u, 1, (const uint32_t[]){ 3 }, NULL, "--log-level=info");
	ASSERT_TRUE(file_has(u.log, "crash survival: off (not --isolate, no service manager"));
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Whether the store holds fd's open file. */
static bool store_has_file(struct fakesd *s, int fd)
{
	bool has = false;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->n && !has; i++)
		has = fakesd_same(s->e[i].fd, fd);
	pthread_mutex_unlock(&s->lock);
	return has;
}

/*
 * A hand-driven front-end replaces RX's call eventfd (SET_VRING_CALL): the store holds the new
 * one and no longer the old one (the same number of fds), and the uvsockd started again after
 * a SIGKILL signals the new one (an adopted back-end signals every running ring's call once).
 */
TEST(a_replaced_eventfd_replaces_its_stored_copy_and_is_the_one_adopted)
{
	struct fakesd *s = calloc(1, sizeof(*s));
	struct vhu_front_config fc;
	struct vhu_front *f;
	uint64_t v = 0, qidx = 0;
	uint8_t cid[8];
	size_t n0;
	int call, stored;
	struct uvd u;

	ASSERT_TRUE(s != NULL);
	fs_setup(&u, s, 3);
	fs_start(&u, s, false);
	vhu_front_config_init(&fc);
	fc.mem_size = 4u << 20;
	ASSERT_WAIT_FOR(vhu_front_connect(u.sock[0], &fc, &f) == 0, WAIT_MS);
	ASSERT_OK(vhu_front_init(f));
	ASSERT_OK(vhu_front_start(f));
	ASSERT_OK(vhu_front_get_config(f, 0, 8, cid)); /* every message before it is handled */
	ASSERT_OK(fakesd_drain(s, WAIT_MS));
	n0 = fakesd_count(s, PREFIX "3-f");
	ASSERT_GE(n0, 4u);
	stored = log_count(u.log, "vm3: crash-survival record stored in the fd store");
	call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ASSERT_GE(call, 0);
	ASSERT_FALSE(store_has_file(s, call));
	ASSERT_OK(vhu_front_request(f, VHU_REQ_SET_VRING_CALL, false, &qidx, sizeof(qidx), &call, 1,
				    NULL, 0));
	ASSERT_OK(vhu_front_get_config(f, 0, 8, cid));
	ASSERT_WAIT_FOR(log_count(u.log, "vm3: crash-survival record stored in the fd store") >
				stored, WAIT_MS);
	ASSERT_OK(fakesd_drain(s, WAIT_MS));
	ASSERT_TRUE(store_has_file(s, call));
	ASSERT_EQ(fakesd_count(s, PREFIX "3-f"), n0); /* the old call eventfd went */
	ASSERT_EQ(fakesd_count(s, PREFIX "3-r"), 1u);
	pthread_mutex_lock(&s->lock);
	ASSERT_EQ(s->dups, 0u); /* uvsockd never relied on a duplicate being dropped */
	pthread_mutex_unlock(&s->lock);

	fs_kill9(&u);
	fs_start(&u, s, true);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	ASSERT_WAIT_FOR(read(call, &v, sizeof(v)) == sizeof(v), WAIT_MS);
	ASSERT_GE(v, 1u);
	ASSERT_OK(vhu_front_get_config(f, 0, 8, cid));
	ASSERT_EQ(cid[0], 3);
	vhu_front_free(f);
	close(call);
	ASSERT_EQ(uvd_kill(&u), 0);
	ASSERT_WAIT_FOR(fakesd_count(s, PREFIX) == 0, WAIT_MS);
	fakesd_fini(s);
	free(s);
	(void)uvd_stop(&u);
}

/* The last pid of a "fake-fdstore: started pid P" line in the file at path (0: none). */
static pid_t ff_pid(const char *path, int *count)
{
	FILE *f = fopen(path, "r");
	char line[256];
	int p = 0;

	*count = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "fake-fdstore: started pid %d", &p) == 1)
			(*count)++;
	fclose(f);
	return p;
}

/* tests/harness/fake-fdstore, as other tests run it: restarts on SIGKILL, empties on SIGTERM. */
TEST(fake_fdstore_restarts_a_killed_uvsockd_that_adopts_its_vmm)
{
	char vm[400], out[200];
	char *argv[] = { FAKE_FDSTORE_PATH, "--restart-on-kill", "--", (char *)uvd_binary(),
			 "--log-level=debug", "--vm", vm, NULL };
	struct uvsock_ctx *g;
	int lfd, hfd, gfd, n = 0, st;
	pid_t ff, p1, p2;
	struct uvd u;

	memset(&u, 0, sizeof(u));
	u.nvms = 1;
	u.cid[0] = 3;
	snprintf(u.dir, sizeof(u.dir), "/tmp/uvsock-fdstore-XXXXXX");
	ASSERT_TRUE(mkdtemp(u.dir) != NULL);
	snprintf(u.log, sizeof(u.log), "%s/uvsockd.log", u.dir);
	snprintf(out, sizeof(out), "%s/fake-fdstore.out", u.dir);
	snprintf(u.sock[0], sizeof(u.sock[0]), "%s/vm3.sock", u.dir);
	snprintf(u.uds[0], sizeof(u.uds[0]), "%s/vm3.vsock", u.dir);
	snprintf(vm, sizeof(vm), "guest-cid=3,socket=%s,uds-path=%s", u.sock[0], u.uds[0]);
	(void)tune_get();
	ASSERT_OK(setenv("UVSOCK_TUNE", "no-packed", 1));
	ff = fork();
	ASSERT_GE(ff, 0);
	if (ff == 0) {
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int l = open(u.log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (o < 0 || l < 0 || dup2(o, 1) < 0 || dup2(l, 2) < 0)
			_exit(127);
		execv(argv[0], argv);
		_exit(127);
	}
	u.pid = ff; /* uvd_stop's SIGTERM goes to fake-fdstore, which passes it on */
	ASSERT_WAIT_FOR((p1 = ff_pid(out, &n)) > 0, WAIT_MS);
	ASSERT_OK(unsetenv("UVSOCK_TUNE"));
	uvd_wait_ready(&u, "start-up");
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: crash-survival record stored in the fd store"),
			WAIT_MS);
	ASSERT_OK(kill(p1, SIGKILL));
	ASSERT_WAIT_FOR((p2 = ff_pid(out, &n)) != p1 && n == 2, WAIT_MS);
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ping(gfd, hfd, 'f');
	ASSERT_EQ(guest_stats(g).backend_lost, 0);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	/* SIGTERM to fake-fdstore: uvsockd stops cleanly, its store empty, status 0. */
	ASSERT_OK(kill(ff, SIGTERM));
	ASSERT_EQ(waitpid(ff, &st, 0), ff);
	u.pid = 0;
	ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ASSERT_TRUE(file_has(out, "ended (status 0), 0 fds stored"));
	uvsock_ctx_free(g);
	(void)uvd_stop(&u);
}

TEST_MAIN()
