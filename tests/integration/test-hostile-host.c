/* SPDX-License-Identifier: MIT */
/*
 * Hostile host programs against a real uvsockd (suite 'integration'): the daemon runs as a child
 * process (tests/harness/uvsockd-proc.h), under a small RLIMIT_NOFILE where a case needs one (a
 * /bin/sh wrapper that sets `ulimit -n` and execs it, so the PID stays the daemon's); guests are
 * guest-role contexts in this process over real vhost-user; host programs are plain Unix sockets.
 *
 *   - one VM's host side holding every idle connection it can get leaves the other VM working
 *     (vhost-user, both connect directions), the daemon idle (no accept spin at EMFILE), and
 *     refuses the excess at once;
 *   - idle sockets that never send a CONNECT line (slowloris) cannot lock out a well-behaved
 *     host program: they are capped, refused beyond the cap and timed out, and counted;
 *   - a symlink planted at <uds-path>_<port> is not followed: the guest's connect is refused
 *     (RST, counted) and the socket it points to sees nothing;
 *   - in-process (a device of this process, no uvsockd): accept() at EMFILE sheds the connection
 *     with the reserve fd instead of spinning.
 */
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "device/vsock_dev.h"
#include "guestside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "test.h"
#include "uvsockd-proc.h"

#define FLOOD_MAX 1100

/* This process holds many sockets: take the hard limit. */
static void own_nofile_to_hard(void)
{
	struct rlimit rl;

	ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = rl.rlim_max;
	ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < FLOOD_MAX + 200)
		test_skip("RLIMIT_NOFILE hard limit too small for this test");
}

/*
 * uvd_start with the daemon's RLIMIT_NOFILE (soft and hard) set to nofile: $UVSOCKD points at a
 * wrapper script for the start (the script execs the real binary, so u->pid is the daemon).
 */
static void uvd_start_limited(struct uvd *u, int nvms, const uint32_t *cids, unsigned nofile,
			      const char *extra)
{
	char script[] = "/tmp/uvsock-hh-XXXXXX";
	const char *old = getenv("UVSOCKD");
	char real[4096];
	FILE *f;
	int fd;

	snprintf(real, sizeof(real), "%s", uvd_binary());
	fd = mkstemp(script);
	ASSERT_GE(fd, 0);
	f = fdopen(fd, "w");
	ASSERT_TRUE(f != NULL);
	fprintf(f, "#!/bin/sh\nulimit -n %u || exit 126\nexec '%s' \"$@\"\n", nofile, real);
	ASSERT_EQ(fclose(f), 0);
	ASSERT_EQ(chmod(script, 0700), 0);
	ASSERT_EQ(setenv("UVSOCKD", script, 1), 0);
	uvd_start(u, nvms, cids, NULL, extra);
	if (old)
		setenv("UVSOCKD", old, 1);
	else
		unsetenv("UVSOCKD");
	unlink(script);
}

/* utime + stime of the process, in clock ticks (/proc/<pid>/stat fields 14 and 15). */
static uint64_t cpu_ticks(pid_t pid)
{
	unsigned long long ut = 0, st = 0;
	char path[64], buf[1024], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	ASSERT_GT(n, 0);
	buf[n] = 0;
	/* After "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
	 * cmajflt utime stime */
	p = strrchr(buf, ')');
	ASSERT_TRUE(p != NULL);
	ASSERT_EQ(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st),
		  2);
	return ut + st;
}

/*
 * Opens up to n non-blocking connections to path that never send anything; a full backlog
 * (EAGAIN) is retried for at most retry_ms over the whole batch. Returns how many connected.
 */
static int open_idle(const char *path, int *fds, int n, unsigned retry_ms)
{
	struct sockaddr_un a = hs_addr(path);
	uint64_t end = test_now_ms() + retry_ms;
	int got = 0;

	while (got < n) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

		ASSERT_GE(fd, 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
			fds[got++] = fd;
			continue;
		}
		close(fd);
		if (errno != EAGAIN || test_now_ms() >= end)
			break;
		test_sleep_ms(1);
	}
	return got;
}

/* True once the daemon closed fd (EOF or reset), without blocking. */
static bool closed_by_peer(int fd)
{
	char c;
	ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);

	return r == 0 || (r < 0 && errno != EAGAIN);
}

static int count_closed(const int *fds, int n)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += closed_by_peer(fds[i]);
	return k;
}

static void close_all(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* True if the daemon's log (u->log) contains s. */
static bool log_has(const struct uvd *u, const char *s)
{
	static char buf[1 << 20];
	ssize_t n;
	int fd = open(u->log, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	return strstr(buf, s) != NULL;
}

/* A counter of the first VM through the control socket (<vhost-user socket>.ctl). */
static uint64_t ctl_counter(const struct uvd *u, const char *name)
{
	struct ops_jv *v = NULL;
	const struct ops_jv *vms;
	uint64_t x;
	int fd = -1;

	ASSERT_WAIT_FOR(ops_ctl_connect(u->sock[0], &fd) >= 0, WAIT_MS);
	ASSERT_OK(ops_ctl_request(fd, "stats", -1, WAIT_MS, NULL, &v));
	close(fd);
	vms = ops_json_get(v, "vms");
	ASSERT_TRUE(vms && vms->child);
	x = ops_json_u64(ops_json_get(vms->child, "counters"), name, UINT64_MAX);
	ops_json_free(v);
	ASSERT_NE(x, UINT64_MAX);
	return x;
}

/*
 * A host program that behaves: connects to <uds>, sends CONNECT <port> at once and reads the
 * "OK" answer within bound_ms. A connection the daemon refuses (closed at once: the write or
 * the read fails) is retried until the bound. Returns the fd or -1.
 */
static int host_connect_within(const char *uds, uint32_t port, int bound_ms)
{
	uint64_t end = test_now_ms() + (uint64_t)bound_ms;
	struct sockaddr_un a = hs_addr(uds);
	char line[32];
	int fd, n;

	n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	do {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ASSERT_GE(fd, 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		    send(fd, line, (size_t)n, MSG_NOSIGNAL) == n &&
		    hs_read_line(fd, line + n, sizeof(line) - (size_t)n, bound_ms) > 0 &&
		    strncmp(line + n, "OK ", 3) == 0)
			return fd;
		close(fd);
	} while (test_now_ms() < end);
	return -1;
}

/* A guest -> host and a host -> guest connection of VM i carry a byte each way. */
static void vm_connects_work(struct uvd *u, int i, struct uvsock_ctx *g)
{
	int lfd, hfd, gfd, ls;
	char c;

	lfd = hs_listen_port(u->uds[i], 5000, SOCK_STREAM);
	gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	ASSERT_EQ(uvsock_send(gfd, "g", 1, 0), 1);
	ASSERT_EQ(hs_read_full(hfd, &c, 1, WAIT_MS), 1);
	ASSERT_EQ(c, 'g');
	uvsock_close(gfd);
	close(hfd);
	close(lfd);

	ls = g_listen(g, SOCK_STREAM, 6000);
	gfd = g_accept_host(ls, u->uds[i], SOCK_STREAM, 6000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, "h", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'h');
	uvsock_close(gfd);
	uvsock_close(ls);
	close(hfd);
}

/*
 * Finding: 1100 idle host connections to one VM's uds-path took every fd of the process (each
 * VM could hold 1024 host fds, the soft limit was never raised): the other VM's connects failed,
 * its VMM was dropped on its next fd-carrying message, and accept() spun at EMFILE.
 */
TEST(one_vm_out_of_fds_spares_the_other)
{
	static const uint32_t cids[] = { 3, 4 };
	static int fds[FLOOD_MAX];
	struct uvsock_ctx *ga, *gb;
	uint64_t t0;
	struct uvd u;
	int n, hfd;

	own_nofile_to_hard();
	uvd_start_limited(&u, 2, cids, 256, "--log-level=info");
	ga = g_guest_new(u.sock[0], NULL);

	/* Retries for 0.5 s at most: the flood is in place well within the 2 s handshake limit. */
	n = open_idle(u.uds[0], fds, FLOOD_MAX, 500);
	test_note("%d idle connections to VM 3 connected", n);
	ASSERT_GT(n, 0);
	test_sleep_ms(300);

	/* No spin: the daemon stays (nearly) idle for a second with the idle flood held. */
	t0 = cpu_ticks(u.pid);
	test_sleep_ms(1000);
	t0 = cpu_ticks(u.pid) - t0;
	test_note("uvsockd CPU over 1 s with the flood held: %" PRIu64 " ticks", t0);
	if (t0 > 10)
		test_fail(__FILE__, __LINE__, "uvsockd used %" PRIu64 " ticks in 1 s: accept spins",
			  t0);
	/* VM 3 refused what is over its budget at once (accepted and closed), well before the
	 * 2 s handshake limit. */
	if (count_closed(fds, n) == 0)
		test_fail(__FILE__, __LINE__, "VM 3 refused none of %d idle connections", n);

	/* VM 4: a VMM connecting now (fd-carrying messages), and both connect directions. */
	gb = g_guest_new(u.sock[1], NULL);
	vm_connects_work(&u, 1, gb);

	/* VM 3 recovers once the idle handshakes time out (2 s): a CONNECT gets in again. */
	ASSERT_WAIT_FOR(count_closed(fds, n) == n, 5000);
	{
		int ls = g_listen(ga, SOCK_STREAM, 7000), gfd;

		hfd = host_connect_within(u.uds[0], 7000, WAIT_MS);
		ASSERT_GE(hfd, 0);
		gfd = uvsock_accept(ls, NULL, NULL);
		ASSERT_GE(gfd, 0);
		uvsock_close(gfd);
		uvsock_close(ls);
		close(hfd);
	}
	close_all(fds, n);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_TRUE(log_has(&u, "host fd budget"));
	/* The budget kept the daemon within its fds: it never had to shed or pause. */
	ASSERT_FALSE(log_has(&u, "out of file descriptors"));
	uvsock_ctx_free(gb);
	uvsock_ctx_free(ga);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * Finding: idle sockets that never send a CONNECT line held a VM's whole connection budget
 * until they timed out, so a well-behaved host program was refused meanwhile.
 */
TEST(idle_handshakes_do_not_lock_out_connects)
{
	static const uint32_t cid3[] = { 3 };
	static int fds[200];
	struct uvsock_ctx *g;
	struct uvd u;
	int n, ls, hfd, gfd;
	uint64_t t0;
	char c;

	own_nofile_to_hard();
	/* 256 fds: a host budget of about 140 connections for the one VM. */
	uvd_start_limited(&u, 1, cid3, 256, "--log-level=info");
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);

	n = open_idle(u.uds[0], fds, 200, 500);
	test_note("%d idle sockets connected", n);
	ASSERT_EQ(n, 200);
	/* Let the daemon take them all (accepted or refused) before the good client comes. */
	test_sleep_ms(200);

	t0 = test_now_ms();
	hfd = host_connect_within(u.uds[0], 6000, 1000);
	if (hfd < 0)
		test_fail(__FILE__, __LINE__,
			  "a well-behaved CONNECT did not get in within 1 s of %d idle sockets", n);
	test_note("well-behaved CONNECT in after %" PRIu64 " ms", test_now_ms() - t0);
	gfd = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(gfd, 0);
	g_set_timeouts(gfd, WAIT_MS);
	hs_write_all(hfd, "x", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);

	/* Past the cap the oldest idle ones were closed, the rest timed out; both are counted
	 * (logged). */
	ASSERT_GT(count_closed(fds, n), 0);
	ASSERT_WAIT_FOR(count_closed(fds, n) == n, 5000);
	ASSERT_WAIT_FOR(log_has(&u, "handshakes pending (the cap)"), 1000);
	ASSERT_WAIT_FOR(log_has(&u, "timed out waiting for the CONNECT line"), 1000);
	/* The budget kept the daemon within its fds: it never had to shed or pause. */
	ASSERT_FALSE(log_has(&u, "out of file descriptors"));
	/* The established connection was not disturbed. */
	hs_write_all(hfd, "y", 1);
	ASSERT_EQ(uvsock_recv(gfd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'y');
	close_all(fds, n);
	uvsock_close(gfd);
	uvsock_close(ls);
	close(hfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * Finding: a guest connect to host port P followed a symlink planted at <uds-path>_<P> to any
 * socket the daemon could reach.
 */
TEST(guest_connect_to_symlinked_port_refused)
{
	static const uint32_t cid3[] = { 3 };
	char victim[200], link[200];
	struct uvsock_ctx *g;
	uint64_t refused;
	struct uvd u;
	int vfd, lfd, hfd, gfd;

	uvd_start(&u, 1, cid3, NULL, "--log-level=info");
	g = g_guest_new(u.sock[0], NULL);
	snprintf(victim, sizeof(victim), "%s/victim.sock", u.dir);
	snprintf(link, sizeof(link), "%s_5000", u.uds[0]);
	vfd = hs_listen(victim, SOCK_STREAM);
	ASSERT_EQ(symlink(victim, link), 0);
	refused = ctl_counter(&u, "host_connects_refused");

	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000), -1);
	ASSERT_EQ(errno, ECONNRESET);
	/* Nothing reached the socket the link points to. */
	ASSERT_EQ(hs_wait_fd(vfd, POLLIN, 200), 0);
	ASSERT_EQ_U64(ctl_counter(&u, "host_connects_refused"), refused + 1);
	ASSERT_WAIT_FOR(log_has(&u, "is a symlink"), 1000);

	/* A relative link is refused the same way. */
	ASSERT_EQ(unlink(link), 0);
	ASSERT_EQ(symlink("victim.sock", link), 0);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000), -1);
	ASSERT_EQ(errno, ECONNRESET);
	ASSERT_EQ(hs_wait_fd(vfd, POLLIN, 200), 0);

	/* The real socket in its place works. */
	ASSERT_EQ(unlink(link), 0);
	lfd = hs_listen(link, SOCK_STREAM);
	gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	close(vfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

static void *dev_main(void *arg)
{
	vsock_dev_run(arg);
	return NULL;
}

/*
 * The last line of defence, in-process (the budget keeps uvsockd from getting there): with the
 * process out of fds, accept() fails with EMFILE while the connection stays queued. The host
 * side sheds it with its reserve fd (the program sees EOF, host_accept_shed counts it) instead of
 * spinning on the readable listener.
 */
TEST(accept_at_emfile_sheds_instead_of_spinning)
{
	struct vsock_dev_config cfg = { .guest_cid = 3, .buf_alloc = 65536 };
	char dir[] = "/tmp/uvsock-hh-XXXXXX", uds[64];
	struct vsock_dev_stats st;
	struct sockaddr_un a;
	struct vsock_dev *d;
	struct timespec t0, t1;
	int cl[4], fill[64], nfill = 0;
	struct rlimit rl;
	pthread_t th;
	int64_t cpu_ns;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(uds, sizeof(uds), "%s/vm.vsock", dir);
	cfg.uds_path = uds;
	ASSERT_OK(vsock_dev_new(NULL, &cfg, &d));
	ASSERT_EQ(pthread_create(&th, NULL, dev_main, d), 0);
	a = hs_addr(uds);
	for (int i = 0; i < 4; i++) {
		cl[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ASSERT_GE(cl[i], 0);
	}
	/* This case runs in a child of its own: its fd table may be filled to the brim. */
	ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = (rlim_t)cl[3] + 32;
	ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	while (nfill < 64 && (fill[nfill] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
		nfill++;
	ASSERT_EQ(errno, EMFILE);
	ASSERT_LT(nfill, 64);

	for (int i = 0; i < 4; i++)
		ASSERT_EQ(connect(cl[i], (struct sockaddr *)&a, sizeof(a)), 0);
	for (int i = 0; i < 4; i++)
		ASSERT_TRUE(hs_wait_eof(cl[i], WAIT_MS));
	/* The counter moves just after the close the program saw. */
	ASSERT_WAIT_FOR((vsock_dev_get_stats(d, &st), st.host_accept_shed == 4), WAIT_MS);
	ASSERT_EQ_U64(st.host_conns_accepted, 0);

	/* Nothing left to shed: the device thread sleeps. */
	ASSERT_EQ(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0), 0);
	test_sleep_ms(300);
	ASSERT_EQ(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1), 0);
	cpu_ns = (t1.tv_sec - t0.tv_sec) * 1000000000ll + (t1.tv_nsec - t0.tv_nsec);
	ASSERT_LT(cpu_ns, 50 * 1000000ll);

	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	/* With fds again, a connection is taken as usual (refused: no guest runs). */
	{
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

		ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		ASSERT_TRUE(hs_wait_eof(fd, WAIT_MS));
		close(fd);
	}
	ASSERT_WAIT_FOR((vsock_dev_get_stats(d, &st), st.host_conns_accepted == 1), WAIT_MS);
	for (int i = 0; i < 4; i++)
		close(cl[i]);
	vsock_dev_stop(d);
	pthread_join(th, NULL);
	vsock_dev_free(d);
	ASSERT_OK(rmdir(dir));
}

TEST_MAIN()
