/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's live upgrade (docs/upgrade.md, "The protocol"): a uvsockd child process serving one
 * guest-role VM of this process (the project's own vhost-user front-end and guest driver) is
 * upgraded while connections carry data:
 *
 *   - a patterned transfer each way in progress (host -> guest and guest -> host, checked byte
 *     by byte), an idle connection each way, and a connection whose guest reader stopped with
 *     128 KiB the host wrote waiting (in the host socket, the engine and the guest's ring); then
 *     `uvsock-ctl upgrade` three times in a row: every byte arrives once and in order, no
 *     connection sees an RST, the idle ones carry bytes both ways afterwards, the guest's
 *     vhost-user connection is never redone (the front-end notices nothing), and each answer
 *     names the old PID (which exits 0) and the new one (which serves: the next upgrade is its);
 *   - failed upgrades: a binary that does not exist, and uvsockd-test-refuse (this uvsockd,
 *     reading no version of the VM record): uvsock-ctl exits 1 with "upgrade refused by PATH
 *     (pid N): ...", the same process serves on, and a transfer through it loses nothing;
 *   - SIGUSR2: the same hand-over with the daemon's own binary, a connection kept across it;
 *     systemd (a NOTIFY_SOCKET of the test's) hears MAINPID=<new pid>, then READY=1;
 *   - a datagram socket of the host program keeps working across an upgrade;
 *   - two VMs and one added with vm-add: a refusal resumes all three, an upgrade moves all
 *     three (one commit), the added one keeps its name and socket file;
 *   - two VMs of one group (linked siblings), the project's own guests in both: a checksummed
 *     stream each way between them, numbered SEQPACKET messages and datagrams from one to the
 *     other, and a host connection, three upgrades mid-transfer: every byte and message once
 *     and in order, the datagrams intact, in order and never twice, no RST (what waits in a
 *     sibling inbox or is held for a full one moves in the record);
 *   - --isolate (docs/upgrade.md, "Under --isolate"): two workers, a transfer each way in one
 *     group's VM and idle connections in the other's, three upgrades mid-transfer, each worker
 *     replaced in turn (new worker PIDs, the VMM connections never redone, every byte once and
 *     in order, no RST), then the main process (the answer's new_pid, the old main exits 0, the
 *     control socket answers from the new one); uvsockd-test-refuse leaves every worker
 *     serving; a worker killed after an upgrade is re-adopted from the new worker's records by
 *     the new main, then SIGUSR2 upgrades both workers and the main again;
 *     uvsockd-test-refuse-main (reading no version of the main's record) takes the workers but
 *     not the main: the old main stays in charge and restarts a killed worker; SIGTERM to the
 *     main of the day stops every worker and removes the socket files; a worker of two linked
 *     siblings hands both over together (streams each way between them, two upgrades, every
 *     byte once);
 *   - inherited sockets (--fd): a connected VMM connection answers the VMM's next requests from
 *     the new process; a listening one takes the next VMM there, and its file is kept.
 *
 * The test process is a child subreaper (PR_SET_CHILD_SUBREAPER), so every uvsockd generation
 * is its child: each is waited for or killed by its PID.
 * With --bench: the pause of one upgrade with 1 and with 1000 open connections, several runs,
 * medians printed (docs/upgrade.md, "The pause").
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "ctlcli.h"
#include "ctlquery.h"
#include "ctlproto/json.h"
#include "guestside.h"
#include "restarts.h"
#include "test.h"
#include "util/uds.h"
#include "uvsockd-proc.h"
#include "vhost_user/frontend.h"
#include "workers.h"

#ifndef UVSOCKD_TEST_REFUSE_PATH
#define UVSOCKD_TEST_REFUSE_PATH "uvsockd-test-refuse"
#endif

#define MiB (1024u * 1024u)
#define XFER (48u * MiB)
#define HELD (128u * 1024)

struct up {
	int rc;
	char out[4096], err[1024];
	struct ops_jv *v;
};

/* uvsock-ctl --control CTL --json upgrade [--binary PATH], in-process; the answer parsed. */
static struct up ctl_upgrade(const struct uvd *u, const char *binary)
{
	char ctl[160];
	char *argv[] = { "uvsock-ctl", "--control", ctl, "--json", "upgrade", "--binary",
			 (char *)binary, NULL };
	struct up o = { 0 };
	FILE *out, *err;

	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	/* The control socket comes up after the VMs' sockets (uvd_start waits for those). */
	ASSERT_TRUE(WAIT_FOR(uds_probe(ctl, SOCK_STREAM) == -EADDRINUSE, 5000));
	out = fmemopen(o.out, sizeof(o.out) - 1, "w");
	err = fmemopen(o.err, sizeof(o.err) - 1, "w");
	ASSERT_TRUE(out && err);
	o.rc = uvsock_ctl_main(binary ? 7 : 5, argv, "test", out, err);
	fclose(out);
	fclose(err);
	if (o.rc == 0)
		ASSERT_EQ(ops_json_parse(o.out, strlen(o.out), &o.v), 0);
	return o;
}

static void set_live(pid_t pid);

/* Open fds of pid (0 once it is gone). */
static unsigned count_fds(pid_t pid)
{
	char path[64];
	unsigned n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n > 2 ? n - 2 : 0;
}

/* An exited generation: reaped (we are its subreaper), exit status 0. */
static void old_exited(pid_t pid)
{
	int st = 0;
	pid_t r = -1;

	ASSERT_TRUE(WAIT_FOR((r = waitpid(pid, &st, WNOHANG)) == pid, 10000));
	ASSERT_TRUE(WIFEXITED(st));
	ASSERT_EQ(WEXITSTATUS(st), 0);
}

/* Upgrades u (binary NULL: its own) and checks the answer; u->pid becomes the new process. */
static void upgrade_ok(struct uvd *u, unsigned want_conns_min)
{
	struct up o = ctl_upgrade(u, NULL);
	const struct ops_jv *vms, *vm;
	pid_t old = u->pid, np;

	if (o.rc != 0)
		test_fail(__FILE__, __LINE__, "upgrade failed: %s (log %s)", o.err, u->log);
	ASSERT_EQ((pid_t)ops_json_u64(o.v, "old_pid", 0), old);
	np = (pid_t)ops_json_u64(o.v, "new_pid", 0);
	ASSERT_TRUE(np > 0 && np != old);
	vms = ops_json_get(o.v, "vms");
	ASSERT_TRUE(vms && vms->type == OPS_J_ARR && vms->child);
	/* Every VM of u, in order; want_conns_min for each. */
	vm = vms->child;
	for (int i = 0; i < u->nvms; i++, vm = vm->next) {
		ASSERT_TRUE(vm != NULL);
		ASSERT_EQ(ops_json_u64(vm, "cid", 0), u->cid[i]);
		ASSERT_TRUE(ops_json_get(vm, "pause_ms") &&
			    ops_json_get(vm, "pause_ms")->type == OPS_J_NUM);
		ASSERT_GE(ops_json_u64(vm, "conns", 0), want_conns_min);
		test_note("upgrade %d -> %d: VM %u: pause %.3f ms, %llu connections, %u fds "
			  "before, %u after", (int)old, (int)np, u->cid[i],
			  ops_json_get(vm, "pause_ms")->d,
			  (unsigned long long)ops_json_u64(vm, "conns", 0), count_fds(old),
			  count_fds(np));
	}
	ASSERT_TRUE(vm == NULL);
	ops_json_free(o.v);
	set_live(np);
	old_exited(old);
	u->pid = np;
	ASSERT_EQ(kill(np, 0), 0);
}

/* A refused upgrade: uvsock-ctl fails with the reason, the same process serves on. */
static void upgrade_refused(struct uvd *u, const char *binary, const char *why)
{
	struct up o = ctl_upgrade(u, binary);
	char want[512];

	ASSERT_EQ(o.rc, 1);
	snprintf(want, sizeof(want), "upgrade refused by %s (pid ", binary);
	if (!strstr(o.err, want) || !strstr(o.err, why))
		test_fail(__FILE__, __LINE__, "unexpected error: %s", o.err);
	test_note("refused as expected: %s", o.err);
	ASSERT_TRUE(uvd_alive(u));
}

/* No RST, no error: the guest socket is open and fine. */
static void g_no_error(int fd)
{
	int err = -1;
	socklen_t el = sizeof(err);

	ASSERT_EQ(uvsock_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el), 0);
	ASSERT_EQ(err, 0);
	ASSERT_EQ(uvsock_poll_events(fd) & (POLLERR | POLLHUP), 0);
}

/* One byte each way on an idle pair (guest fd g, host fd h). */
static void ping(int g, int h, char c)
{
	char b = 0;

	g_set_timeouts(g, WAIT_MS);
	ASSERT_EQ(uvsock_send(g, &c, 1, 0), 1);
	ASSERT_EQ(hs_read_full(h, &b, 1, WAIT_MS), 1);
	ASSERT_EQ(b, c);
	hs_write_all(h, &c, 1);
	ASSERT_EQ(uvsock_recv(g, &b, 1, 0), 1);
	ASSERT_EQ(b, c);
}

struct g_recv_io {
	int fd;
	size_t total;
	uint64_t seed;
};

static void *g_recv_main(void *arg)
{
	struct g_recv_io *io = arg;

	g_recv_pattern(io->fd, io->total, io->seed);
	return NULL;
}

/* A host sender that paces itself (so that the transfer is still running at the upgrades). */
static void *host_send_paced(void *arg)
{
	struct host_io *h = arg;
	uint8_t *buf = malloc(65536);

	for (size_t off = 0; buf && off < h->total;) {
		size_t n = h->total - off < 65536 ? h->total - off : 65536;

		hs_fill(buf, n, h->seed, off);
		hs_write_all(h->fd, buf, n);
		off += n;
		usleep(500);
	}
	h->ok = buf != NULL;
	free(buf);
	return NULL;
}

static void *g_send_paced(void *arg)
{
	struct g_io *io = arg;
	uint8_t *buf = malloc(io->chunk);

	ASSERT_TRUE(buf != NULL);
	for (size_t off = 0; off < io->total;) {
		size_t n = io->total - off < io->chunk ? io->total - off : io->chunk;
		ssize_t r;

		hs_fill(buf, n, io->seed, off);
		r = uvsock_send(io->fd, buf, n, 0);
		if (r <= 0)
			test_fail(__FILE__, __LINE__, "uvsock_send at %zu: %zd %s", off, r,
				  strerror(errno));
		off += (size_t)r;
		usleep(500);
	}
	free(buf);
	return NULL;
}

/*
 * The daemon generation that serves now, in memory shared with a guard process: a failing case
 * ends with _exit, and only the first generation dies with us (PR_SET_PDEATHSIG in uvd_spawn),
 * so the guard kills the current one, by its PID, when this process dies.
 */
static volatile pid_t *live;

static void guard_start(void)
{
	pid_t parent = getpid(), g;

	live = mmap(NULL, sizeof(*live), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		    0);
	ASSERT_TRUE(live != MAP_FAILED);
	*live = 0;
	g = fork();
	ASSERT_GE(g, 0);
	if (g == 0) {
		sigset_t set;
		int sig;

		/* Hold none of the test's sockets open (a VMM connection must end when the test
		 * closes it). */
		for (int fd = 3; fd < 4096; fd++)
			close(fd);
		sigemptyset(&set);
		sigaddset(&set, SIGUSR1);
		sigprocmask(SIG_BLOCK, &set, NULL);
		prctl(PR_SET_PDEATHSIG, SIGUSR1);
		if (getppid() == parent)
			(void)sigwait(&set, &sig);
		if (*live > 0)
			kill(*live, SIGKILL);
		_exit(0);
	}
}

static void set_live(pid_t pid)
{
	if (!live)
		guard_start();
	*live = pid;
}

static void start_one(struct uvd *u)
{
	static const uint32_t cid = 3;

	/* Every uvsockd generation becomes this process's child when the one before exits (each
	 * case runs in a process of its own: set here, not once for the program). */
	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	uvd_start(u, 1, &cid, NULL, "--log-level=info");
	set_live(u->pid);
}

/* The last generation, by PID; then the test's files. */
static void stop_all(struct uvd *u)
{
	char cmd[128];

	ASSERT_EQ(uvd_kill(u), 0);
	set_live(0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", u->dir);
	(void)!system(cmd);
}

TEST(three_upgrades_mid_transfer_lose_nothing)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct host_io hs, hr;
	struct g_io gs;
	struct g_recv_io gr;
	pthread_t th[4];
	int ls, hl1, hl2, hl3, g_in, h_in, g_out, h_out, g_idle_in, h_idle_in, g_idle_out,
	    h_idle_out, g_held, h_held, g_x, h_x;

	start_one(&u);
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	/* host -> guest transfer, guest -> host transfer */
	g_in = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_in);
	g_set_timeouts(g_in, 4 * WAIT_MS);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, 4 * WAIT_MS, &hl1, &h_out);
	/* idle connections, each way */
	g_idle_in = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_idle_in);
	g_idle_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5002, WAIT_MS, &hl2, &h_idle_out);
	/* a held one: the host writes 128 KiB the guest does not read until the end (within the
	 * guest's credit: in its RX ring and the engine, the rest in the host socket) */
	g_held = g_connect_host(g, u.uds[0], SOCK_STREAM, 5003, WAIT_MS, &hl3, &h_held);
	{
		struct host_io hh = { .fd = h_held, .total = HELD, .seed = 91 };

		host_send_main(&hh);
	}

	hs = (struct host_io){ .fd = h_in, .total = XFER, .seed = 11 };
	gr = (struct g_recv_io){ .fd = g_in, .total = XFER, .seed = 11 };
	gs = (struct g_io){ .fd = g_out, .total = XFER, .chunk = 65536, .seed = 12 };
	hr = (struct host_io){ .fd = h_out, .total = XFER, .seed = 12 };
	ASSERT_EQ(pthread_create(&th[0], NULL, host_send_paced, &hs), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, g_recv_main, &gr), 0);
	ASSERT_EQ(pthread_create(&th[2], NULL, g_send_paced, &gs), 0);
	ASSERT_EQ(pthread_create(&th[3], NULL, host_recv_main, &hr), 0);

	usleep(100 * 1000);
	for (int i = 0; i < 3; i++)
		upgrade_ok(&u, 5);

	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ASSERT_TRUE(hs.ok);
	ASSERT_TRUE(hr.ok); /* guest -> host: every byte, once, in order */
	/* the held bytes: all there, in order */
	g_set_timeouts(g_held, WAIT_MS);
	g_recv_pattern(g_held, HELD, 91);
	g_no_error(g_in);
	g_no_error(g_out);
	g_no_error(g_idle_in);
	g_no_error(g_idle_out);
	g_no_error(g_held);
	ping(g_idle_in, h_idle_in, 'i');
	ping(g_idle_out, h_idle_out, 'o');
	ping(g_in, h_in, 'x');
	/* a new connection each way through the last process */
	g_x = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_x);
	ping(g_x, h_x, 'n');
	/* No RST either way in any generation (the counters go on across upgrades), and the
	 * VMM's connection is the one it made at the start (our front-end never redoes it: had
	 * it been dropped, every connection above would have been reset). */
	ASSERT_EQ(uvd_vm_counter(&u, 3, "rst_sent"), 0);
	ASSERT_EQ(uvd_vm_counter(&u, 3, "rst_received"), 0);
	ASSERT_GE(uvd_vm_counter(&u, 3, "rx_bytes"), XFER + HELD);
	/* orderly ends: a FIN each way, no RST */
	ASSERT_EQ(uvsock_shutdown(g_out, SHUT_WR), 0);
	ASSERT_TRUE(hs_wait_eof(h_out, WAIT_MS));

	for (int i = 0; i < 8; i++)
		close((int[]){ hl1, hl2, hl3, h_in, h_out, h_idle_in, h_idle_out, h_held }[i]);
	close(h_x);
	uvsock_close(g_x);
	for (int i = 0; i < 6; i++)
		uvsock_close((int[]){ ls, g_in, g_out, g_idle_in, g_idle_out, g_held }[i]);
	uvsock_ctx_free(g);
	stop_all(&u);
}

TEST(failed_upgrades_leave_the_old_process_serving)
{
	struct uvd u;
	struct uvsock_ctx *g;
	struct host_io hr;
	struct g_io gs;
	pthread_t th[2];
	int hl, g_out, h_out, ls, g_in, h_in;
	pid_t pid;

	start_one(&u);
	pid = u.pid;
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	g_in = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_in);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, 4 * WAIT_MS, &hl, &h_out);
	gs = (struct g_io){ .fd = g_out, .total = 16 * MiB, .chunk = 65536, .seed = 21 };
	hr = (struct host_io){ .fd = h_out, .total = 16 * MiB, .seed = 21 };
	ASSERT_EQ(pthread_create(&th[0], NULL, g_send_paced, &gs), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, host_recv_main, &hr), 0);
	usleep(50 * 1000);

	upgrade_refused(&u, "/nonexistent/uvsockd", "cannot execute it: No such file");
	upgrade_refused(&u, UVSOCKD_TEST_REFUSE_PATH, "version 1 is not one this program reads");
	ASSERT_EQ(u.pid, pid);
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	ASSERT_TRUE(hr.ok); /* every byte, in order, through the refusals */
	g_no_error(g_in);
	g_no_error(g_out);
	ping(g_in, h_in, 'r');
	ASSERT_EQ(uvd_vm_counter(&u, 3, "rst_sent"), 0);
	/* and it can still be upgraded */
	upgrade_ok(&u, 2);
	ping(g_in, h_in, 's');
	ping(g_out, h_out, 't');

	for (int i = 0; i < 3; i++)
		close((int[]){ hl, h_out, h_in }[i]);
	for (int i = 0; i < 3; i++)
		uvsock_close((int[]){ ls, g_in, g_out }[i]);
	uvsock_ctx_free(g);
	stop_all(&u);
}

/* One sd_notify datagram (NUL-terminated) within 5 s. */
static bool notify_recv(int fd, char *buf, size_t len)
{
	ssize_t n;

	if (hs_wait_fd(fd, POLLIN, 5000) <= 0)
		return false;
	n = recv(fd, buf, len - 1, 0);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return true;
}

/* The uvsockd child of ours other than `not` (an upgrade's new process, reparented to us). */
static pid_t find_child(pid_t not)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = 0;

	ASSERT_TRUE(d != NULL);
	while (!found && (e = readdir(d))) {
		char path[300], buf[512], *p;
		pid_t pid = (pid_t)atoi(e->d_name);
		FILE *f;

		if (pid <= 0 || pid == not)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) &&
		    strstr(buf, "(uvsockd)") && atoi(p + 4) == (int)getpid() && p[2] != 'Z')
			found = pid;
		fclose(f);
	}
	closedir(d);
	return found;
}

TEST(sigusr2_upgrades_with_the_same_binary)
{
	struct uvd u;
	struct uvsock_ctx *g;
	int ls, g_in, h_in, hl, g_out, h_out, dg;
	pid_t old, np = 0;
	struct sockaddr_un sa = { .sun_family = AF_UNIX }, na = { .sun_family = AF_UNIX };
	char ndir[] = "/tmp/uvsock-up-XXXXXX", buf[512];
	int nfd;


	/* systemd's side: a NOTIFY_SOCKET of ours, inherited by every generation */
	ASSERT_TRUE(mkdtemp(ndir) != NULL);
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(nfd, 0);
	snprintf(na.sun_path, sizeof(na.sun_path), "%s/notify", ndir);
	ASSERT_EQ(bind(nfd, (struct sockaddr *)&na, sizeof(na)), 0);
	ASSERT_EQ(setenv("NOTIFY_SOCKET", na.sun_path, 1), 0);
	start_one(&u);
	old = u.pid;
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)) && strstr(buf, "READY=1"));
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	g_in = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_in);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, WAIT_MS, &hl, &h_out);
	/* a host datagram socket connected to <uds-path>.dgram before the upgrade */
	dg = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(dg, 0);
	ASSERT_LT(strlen(u.uds[0]) + 6, sizeof(sa.sun_path));
	memcpy(sa.sun_path, u.uds[0], strlen(u.uds[0]));
	memcpy(sa.sun_path + strlen(u.uds[0]), ".dgram", 6);
	ASSERT_EQ(connect(dg, (struct sockaddr *)&sa, sizeof(sa)), 0);

	ASSERT_EQ(kill(old, SIGUSR2), 0);
	/* The new process says MAINPID=<itself>, then READY=1, before the old one exits. */
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)));
	ASSERT_EQ(strncmp(buf, "MAINPID=", 8), 0);
	np = (pid_t)atoi(buf + 8);
	ASSERT_TRUE(np > 0 && np != old);
	set_live(np);
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)) && strstr(buf, "READY=1"));
	old_exited(old);
	ASSERT_EQ(find_child(old), np);
	u.pid = np;
	test_note("SIGUSR2: %d -> %d", (int)old, (int)np);
	ping(g_in, h_in, 'a');
	ping(g_out, h_out, 'b');
	g_no_error(g_in);
	g_no_error(g_out);
	/* the datagram socket connected before the upgrade reaches the guest through the new
	 * process: the bound <uds-path>.dgram socket went across with its fd */
	{
		struct sockaddr_vm vm = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
					  .svm_port = 7000 };
		static const char msg[] = "7000\nafter the upgrade";
		char b[64] = { 0 };
		int gd = uvsock_socket(g, SOCK_DGRAM, 0);

		ASSERT_GE(gd, 0);
		ASSERT_EQ(uvsock_bind(gd, (struct sockaddr *)&vm, sizeof(vm)), 0);
		g_set_timeouts(gd, WAIT_MS);
		ASSERT_EQ(send(dg, msg, sizeof(msg) - 1, 0), (ssize_t)(sizeof(msg) - 1));
		ASSERT_EQ(uvsock_recv(gd, b, sizeof(b), 0), (ssize_t)strlen("after the upgrade"));
		ASSERT_EQ(memcmp(b, "after the upgrade", 17), 0);
		uvsock_close(gd);
	}
	close(dg);

	for (int i = 0; i < 3; i++)
		close((int[]){ hl, h_out, h_in }[i]);
	for (int i = 0; i < 3; i++)
		uvsock_close((int[]){ ls, g_in, g_out }[i]);
	uvsock_ctx_free(g);
	stop_all(&u);
	close(nfd);
	unlink(na.sun_path);
	rmdir(ndir);
}

/* Lines of u's log (every generation writes to it) that contain what. */
static unsigned log_lines(const struct uvd *u, const char *what)
{
	FILE *f = fopen(u->log, "r");
	char line[1024];
	unsigned n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/* ---- sibling VMs --------------------------------------------------------------------------- */

#define SIB_XFER (64u * MiB)
#define DG_SIZE 1000u
#define DG_PORT 9100u

/* Guest 3 -> guest 4 datagrams: a sequence number and a pattern seeded by it, paced; sent
 * until stop is set, then DG_TAIL more (the last sequence number in last). */
#define DG_TAIL 50u
struct dg_flow {
	struct uvsock_ctx *g;
	int fd;                  /* the sender's socket, or the receiver's */
	atomic_bool stop;
	atomic_uint last;        /* the sender's last sequence number, once it is done */
	atomic_bool done;
	unsigned got, max_seq;   /* the receiver's */
};

static void *dg_send_main(void *arg)
{
	struct dg_flow *f = arg;
	struct sockaddr_vm to = vm_addr(4, DG_PORT);
	uint8_t buf[DG_SIZE];
	unsigned tail = 0, seq;

	for (seq = 0; tail < DG_TAIL; seq++) {
		memcpy(buf, &seq, sizeof(seq));
		hs_fill(buf + sizeof(seq), DG_SIZE - sizeof(seq), 7000 + seq, 0);
		/* ENOBUFS (a full inbox) drops it: datagrams are unreliable. */
		(void)uvsock_sendto(f->fd, buf, DG_SIZE, 0, (struct sockaddr *)&to, sizeof(to));
		if (atomic_load(&f->stop))
			tail++;
		usleep(2000);
	}
	atomic_store(&f->last, seq - 1);
	atomic_store(&f->done, true);
	return NULL;
}

/* Each datagram intact, none twice, none out of order; until the sender's last one. */
static void *dg_recv_main(void *arg)
{
	struct dg_flow *f = arg;
	uint8_t buf[DG_SIZE + 1];
	bool first = true;

	g_set_timeouts(f->fd, 4 * WAIT_MS);
	for (;;) {
		ssize_t n = uvsock_recvfrom(f->fd, buf, sizeof(buf), 0, NULL, NULL);
		unsigned seq;

		if (n < 0)
			break; /* nothing for 4 * WAIT_MS: checked by the caller */
		ASSERT_EQ(n, (ssize_t)DG_SIZE);
		memcpy(&seq, buf, sizeof(seq));
		if (!first && seq <= f->max_seq)
			test_fail(__FILE__, __LINE__, "datagram %u after %u (twice or reordered)",
				  seq, f->max_seq);
		ASSERT_EQ(hs_check(buf + sizeof(seq), DG_SIZE - sizeof(seq), 7000 + seq, 0),
			  DG_SIZE - sizeof(seq));
		first = false;
		f->max_seq = seq;
		f->got++;
		if (atomic_load(&f->done) && seq == atomic_load(&f->last))
			break;
	}
	return NULL;
}

/* Guest 4 -> guest 3: 4-byte SEQPACKET messages numbered 0, 1, ... until stop, then ~0u. Many
 * small packets in flight, so that saves find some waiting in guest 3's inbox. */
struct msg_flow {
	int fd;
	atomic_bool stop;
	uint32_t n;
};

static void *msg_send_main(void *arg)
{
	struct msg_flow *f = arg;
	uint32_t end = ~0u;

	while (!atomic_load(&f->stop)) {
		ASSERT_EQ(uvsock_send(f->fd, &f->n, sizeof(f->n), MSG_EOR), (ssize_t)sizeof(f->n));
		f->n++;
	}
	ASSERT_EQ(uvsock_send(f->fd, &end, sizeof(end), MSG_EOR), (ssize_t)sizeof(end));
	return NULL;
}

/* Every message once, in order, boundaries kept. */
static void *msg_recv_main(void *arg)
{
	struct msg_flow *f = arg;
	uint32_t m;

	for (;;) {
		ASSERT_EQ(uvsock_recv(f->fd, &m, sizeof(m), 0), (ssize_t)sizeof(m));
		if (m == ~0u)
			break;
		if (m != f->n)
			test_fail(__FILE__, __LINE__, "message %u, expected %u", m, f->n);
		f->n++;
	}
	return NULL;
}

TEST(sibling_vms_keep_streams_and_datagrams_across_three_upgrades)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvd u;
	struct uvsock_ctx *g3, *g4;
	struct g_io s34, s43;
	struct g_recv_io r34, r43, rh;
	struct host_io hs;
	struct dg_flow ds = { 0 }, dr = { 0 };
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, DG_PORT);
	struct uvsock_guest_opts sib_opts = { .size = sizeof(sib_opts), .queue_size = 16,
					      .rx_buf_min = 4096, .rx_buf_max = 4096 };
	struct msg_flow ms = { 0 }, mr = { 0 };
	pthread_t th[10];
	int ls4, ls3, lsh, c34, a34, c43, a43, g_in, h_in, lq3;
	unsigned saves;

	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	uvd_start(&u, 2, cids, "shared", "--log-level=info");
	set_live(u.pid);
	/* Small RX rings of small buffers: what a sibling sends waits in the inbox for room (and a
	 * packet is delivered in pieces), so that saves find packets there. */
	g3 = g_guest_new(u.sock[0], &sib_opts);
	g4 = g_guest_new(u.sock[1], &sib_opts);
	/* a stream each way between the siblings */
	ls4 = g_listen(g4, SOCK_STREAM, 9000);
	c34 = g_connect(g3, SOCK_STREAM, 4, 9000);
	ASSERT_GE(c34, 0);
	a34 = uvsock_accept(ls4, NULL, NULL);
	ASSERT_GE(a34, 0);
	ls3 = g_listen(g3, SOCK_STREAM, 9001);
	c43 = g_connect(g4, SOCK_STREAM, 3, 9001);
	ASSERT_GE(c43, 0);
	a43 = uvsock_accept(ls3, NULL, NULL);
	ASSERT_GE(a43, 0);
	for (int i = 0; i < 4; i++)
		g_set_timeouts((int[]){ c34, a34, c43, a43 }[i], 4 * WAIT_MS);
	/* SEQPACKET messages 4 -> 3 */
	lq3 = g_listen(g3, SOCK_SEQPACKET, 9002);
	ms.fd = g_connect(g4, SOCK_SEQPACKET, 3, 9002);
	ASSERT_GE(ms.fd, 0);
	mr.fd = uvsock_accept(lq3, NULL, NULL);
	ASSERT_GE(mr.fd, 0);
	g_set_timeouts(ms.fd, 4 * WAIT_MS);
	g_set_timeouts(mr.fd, 4 * WAIT_MS);
	/* a host connection into guest 3 */
	lsh = g_listen(g3, SOCK_STREAM, 6000);
	g_in = g_accept_host(lsh, u.uds[0], SOCK_STREAM, 6000, &h_in);
	g_set_timeouts(g_in, 4 * WAIT_MS);
	/* datagrams 3 -> 4 */
	dr.fd = uvsock_socket(g4, SOCK_DGRAM, 0);
	ASSERT_GE(dr.fd, 0);
	ASSERT_EQ(uvsock_bind(dr.fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ds.fd = uvsock_socket(g3, SOCK_DGRAM, 0);
	ASSERT_GE(ds.fd, 0);

	s34 = (struct g_io){ .fd = c34, .total = SIB_XFER, .chunk = 65536, .seed = 51 };
	r34 = (struct g_recv_io){ .fd = a34, .total = SIB_XFER, .seed = 51 };
	s43 = (struct g_io){ .fd = c43, .total = SIB_XFER, .chunk = 16384, .seed = 52 };
	r43 = (struct g_recv_io){ .fd = a43, .total = SIB_XFER, .seed = 52 };
	hs = (struct host_io){ .fd = h_in, .total = SIB_XFER, .seed = 53 };
	rh = (struct g_recv_io){ .fd = g_in, .total = SIB_XFER, .seed = 53 };
	ASSERT_EQ(pthread_create(&th[0], NULL, g_send_main, &s34), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, g_recv_main, &r34), 0);
	ASSERT_EQ(pthread_create(&th[2], NULL, g_send_main, &s43), 0);
	ASSERT_EQ(pthread_create(&th[3], NULL, g_recv_main, &r43), 0);
	ASSERT_EQ(pthread_create(&th[4], NULL, host_send_paced, &hs), 0);
	ASSERT_EQ(pthread_create(&th[5], NULL, g_recv_main, &rh), 0);
	ASSERT_EQ(pthread_create(&th[6], NULL, dg_recv_main, &dr), 0);
	ASSERT_EQ(pthread_create(&th[7], NULL, dg_send_main, &ds), 0);
	ASSERT_EQ(pthread_create(&th[8], NULL, msg_recv_main, &mr), 0);
	ASSERT_EQ(pthread_create(&th[9], NULL, msg_send_main, &ms), 0);

	usleep(100 * 1000);
	/* (sibling connections are not the engine's: only guest 3's host connection counts) */
	for (int i = 0; i < 3; i++)
		upgrade_ok(&u, 0);
	/* Packets wait in an inbox at a save only now and then (when a guest's RX ring is out of
	 * buffers at that instant): more upgrades, a bounded number, until a save carried some,
	 * so that the record's inbox is what this case checks (the daemon logs each such save). */
	for (int i = 0; i < 30 && !log_lines(&u, "go into the record"); i++)
		upgrade_ok(&u, 0);
	saves = log_lines(&u, "go into the record");
	atomic_store(&ds.stop, true);
	atomic_store(&ms.stop, true);
	pthread_join(th[9], NULL);
	pthread_join(th[8], NULL);
	ASSERT_EQ(mr.n, ms.n); /* every message, once, in order */
	test_note("SEQPACKET messages 4 -> 3: %u", mr.n);

	pthread_join(th[7], NULL);
	atomic_store(&dr.last, atomic_load(&ds.last));
	atomic_store(&dr.done, true);
	for (int i = 0; i < 7; i++)
		pthread_join(th[i], NULL);
	ASSERT_TRUE(hs.ok);
	test_note("datagrams: %u of %u arrived, the last %u", dr.got, atomic_load(&ds.last) + 1,
		  dr.max_seq);
	/* some sent after the last upgrade arrived: the flow goes on in the new process */
	ASSERT_TRUE(dr.got > 0 && dr.max_seq == atomic_load(&ds.last));
	for (int i = 0; i < 7; i++)
		g_no_error((int[]){ c34, a34, c43, a43, g_in, ms.fd, mr.fd }[i]);
	/* the siblings still talk, and a new connection between them works */
	{
		char b = 0;
		int c = g_connect(g4, SOCK_STREAM, 3, 9001), s;

		ASSERT_GE(c, 0);
		s = uvsock_accept(ls3, NULL, NULL);
		ASSERT_GE(s, 0);
		g_set_timeouts(c, WAIT_MS);
		g_set_timeouts(s, WAIT_MS);
		ASSERT_EQ(uvsock_send(c, "z", 1, 0), 1);
		ASSERT_EQ(uvsock_recv(s, &b, 1, 0), 1);
		ASSERT_EQ(b, 'z');
		uvsock_close(c);
		uvsock_close(s);
	}
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(uvd_vm_counter(&u, cids[i], "rst_sent"), 0);
		ASSERT_EQ(uvd_vm_counter(&u, cids[i], "rst_received"), 0);
	}
	test_note("saves with sibling packets in the record: %u", saves);
	ASSERT_GE(saves, 1u);
	close(h_in);
	for (int i = 0; i < 9; i++)
		uvsock_close((int[]){ ls4, ls3, lsh, c34, a34, c43, a43, g_in, ds.fd }[i]);
	uvsock_close(dr.fd);
	for (int i = 0; i < 3; i++)
		uvsock_close((int[]){ ms.fd, mr.fd, lq3 }[i]);
	uvsock_ctx_free(g3);
	uvsock_ctx_free(g4);
	stop_all(&u);
}

/* ---- --isolate: one worker at a time --------------------------------------------------------- */

/* `uvsockd --isolate --log-level=LEVEL`, VMs 3 and 4 in groups of their own (two workers), or
 * with shared both in group "shared" (one worker, the two linked). */
static void iso_start_groups(struct uvd *u, const char *level, bool shared)
{
	static const uint32_t cids[] = { 3, 4 };
	char vm[2][400];
	char *argv[8] = { (char *)uvd_binary(), "--isolate", (char *)level };
	int argc = 3;

	memset(u, 0, sizeof(*u));
	u->nvms = 2;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-isoup-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	for (int i = 0; i < 2; i++) {
		u->cid[i] = cids[i];
		snprintf(u->sock[i], sizeof(u->sock[i]), "%s/vm%u.sock", u->dir, cids[i]);
		snprintf(u->uds[i], sizeof(u->uds[i]), "%s/vm%u.vsock", u->dir, cids[i]);
		if (shared)
			snprintf(vm[i], sizeof(vm[i]), "guest-cid=%u,socket=%s,uds-path=%s,"
				 "groups=shared", cids[i], u->sock[i], u->uds[i]);
		else
			snprintf(vm[i], sizeof(vm[i]), "guest-cid=%u,socket=%s,uds-path=%s,"
				 "groups=g%u", cids[i], u->sock[i], u->uds[i], cids[i]);
		argv[argc++] = "--vm";
		argv[argc++] = vm[i];
	}
	argv[argc] = NULL;
	/* Every main process generation becomes this process's child when the one before exits
	 * (and so do the workers the old main forked): waitpid and the guard find them. */
	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
	set_live(u->pid);
}

/*
 * The worker serving VM cid as the control socket of u's main process names it ("vmN pid P"),
 * waiting for one that runs and is not `not` (0: any). After a hand-over of the main process
 * the workers are not its children: the main's own answer is what says which serves.
 */
static pid_t iso_worker(const struct uvd *u, uint32_t cid, pid_t not)
{
	pid_t w = 0;

	char ctl[200];

	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	for (int tries = 0; tries < 200; tries++) {
		struct ops_jv *v;
		const struct ops_jv *vms;
		unsigned c = 0, p = 0;

		int fd = -1;

		/* Not up yet just after start-up (which the VM sockets tell) */
		if (ops_ctl_connect(ctl, &fd) < 0) {
			usleep(50 * 1000);
			continue;
		}
		v = NULL;
		ASSERT_OK(ops_ctl_request(fd, "stats", -1, 5000, NULL, &v));
		close(fd);
		vms = ops_json_get(v, "vms");

		for (const struct ops_jv *e = vms ? vms->child : NULL; e; e = e->next) {
			const struct ops_jv *n = ops_json_get(e, "name");

			if (ops_json_u64(e, "cid", 0) == cid && n && n->s &&
			    sscanf(n->s, "vm%u pid %u", &c, &p) == 2 && c == cid)
				w = (pid_t)p;
		}
		ops_json_free(v);
		if (w > 0 && w != not && !pid_gone(w))
			return w;
		usleep(50 * 1000);
	}
	test_fail(__FILE__, __LINE__, "no worker for vm%u in the main's answer", cid);
	return 0;
}

static void iso_start(struct uvd *u, const char *level)
{
	iso_start_groups(u, level, false);
}

/* The number in the log of u right after needle (its first occurrence), or 0. */
static pid_t log_pid_after(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char *text, *p;
	int pid = 0;

	ASSERT_TRUE(f != NULL);
	text = calloc(1, 1 << 20);
	ASSERT_TRUE(text != NULL);
	(void)!fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	p = strstr(text, needle);
	if (p)
		pid = atoi(p + strlen(needle));
	free(text);
	return (pid_t)pid;
}

/*
 * SIGTERM to u's main process (whichever generation): it exits 0, every worker with it (they
 * are not its children after a hand-over of the main), and the socket files are removed.
 */
static void iso_stop(struct uvd *u)
{
	pid_t w[2] = { iso_worker(u, 3, 0), iso_worker(u, 4, 0) };
	char ctl[200];

	ASSERT_EQ(uvd_kill(u), 0);
	set_live(0);
	for (int i = 0; i < 2; i++) {
		ASSERT_WAIT_FOR(pid_gone(w[i]), WAIT_MS);
		ASSERT_NE(access(u->sock[i], F_OK), 0);
	}
	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	ASSERT_NE(access(ctl, F_OK), 0);
	(void)uvd_stop(u); /* the test's files */
}

/*
 * An upgrade of u --isolate: each VM names a new worker (w[0] for VM 3, w[1] for VM 4,
 * updated), which runs and is the VM's worker; the old ones are gone. Then the main process is
 * replaced: the answer's new_pid is a new process (u->pid becomes it), the old main exits 0,
 * and the control socket answers from the new one. The pauses go to pause[0..1] (ms).
 */
static void iso_upgrade_ok(struct uvd *u, pid_t w[2], double pause[2])
{
	struct up o = ctl_upgrade(u, NULL);
	const struct ops_jv *vms, *vm;
	pid_t nw[2] = { 0, 0 }, old = u->pid;
	int i = 0;

	if (o.rc != 0)
		test_fail(__FILE__, __LINE__, "upgrade failed: %s (log %s)", o.err, u->log);
	ASSERT_EQ((pid_t)ops_json_u64(o.v, "old_pid", 0), old);
	u->pid = (pid_t)ops_json_u64(o.v, "new_pid", 0);
	ASSERT_TRUE(u->pid > 0 && u->pid != old);
	set_live(u->pid);
	vms = ops_json_get(o.v, "vms");
	ASSERT_TRUE(vms && vms->type == OPS_J_ARR);
	for (vm = vms->child; vm; vm = vm->next, i++) {
		ASSERT_LT(i, 2);
		ASSERT_EQ(ops_json_u64(vm, "cid", 0), u->cid[i]);
		ASSERT_TRUE(ops_json_get(vm, "pause_ms") &&
			    ops_json_get(vm, "pause_ms")->type == OPS_J_NUM);
		pause[i] = ops_json_get(vm, "pause_ms")->d;
		nw[i] = (pid_t)ops_json_u64(vm, "worker_pid", 0);
		ASSERT_TRUE(nw[i] > 0 && nw[i] != w[i]);
	}
	ASSERT_EQ(i, 2);
	ops_json_free(o.v);
	old_exited(old);
	test_note("main %d -> %d", (int)old, (int)u->pid);
	for (i = 0; i < 2; i++) {
		ASSERT_TRUE(pid_gone(w[i]));
		ASSERT_EQ(iso_worker(u, u->cid[i], 0), nw[i]);
		test_note("vm%u: worker %d -> %d, pause %.3f ms", u->cid[i], (int)w[i], (int)nw[i],
			  pause[i]);
		w[i] = nw[i];
	}
	ASSERT_TRUE(uvd_alive(u));
}

TEST(isolate_three_upgrades_one_worker_at_a_time_lose_nothing)
{
	struct uvd u;
	struct uvsock_ctx *g, *g4;
	struct host_io hs, hr;
	struct g_io gs;
	struct g_recv_io gr;
	pthread_t th[4];
	pid_t w[2];
	double pause[2];
	int ls, ls4, hl1, hl2, g_in, h_in, g_out, h_out, g_idle_in, h_idle_in, g_idle_out,
	    h_idle_out;

	iso_start(&u, "--log-level=info");
	w[0] = iso_worker(&u, 3, 0);
	w[1] = iso_worker(&u, 4, 0);
	g = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	/* VM 3: a transfer each way; VM 4: an idle connection each way */
	ls = g_listen(g, SOCK_STREAM, 6000);
	g_in = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h_in);
	g_set_timeouts(g_in, 4 * WAIT_MS);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, 4 * WAIT_MS, &hl1, &h_out);
	ls4 = g_listen(g4, SOCK_STREAM, 6000);
	g_idle_in = g_accept_host(ls4, u.uds[1], SOCK_STREAM, 6000, &h_idle_in);
	g_idle_out = g_connect_host(g4, u.uds[1], SOCK_STREAM, 5002, WAIT_MS, &hl2, &h_idle_out);

	hs = (struct host_io){ .fd = h_in, .total = XFER, .seed = 31 };
	gr = (struct g_recv_io){ .fd = g_in, .total = XFER, .seed = 31 };
	gs = (struct g_io){ .fd = g_out, .total = XFER, .chunk = 65536, .seed = 32 };
	hr = (struct host_io){ .fd = h_out, .total = XFER, .seed = 32 };
	ASSERT_EQ(pthread_create(&th[0], NULL, host_send_paced, &hs), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, g_recv_main, &gr), 0);
	ASSERT_EQ(pthread_create(&th[2], NULL, g_send_paced, &gs), 0);
	ASSERT_EQ(pthread_create(&th[3], NULL, host_recv_main, &hr), 0);

	usleep(100 * 1000);
	for (int i = 0; i < 3; i++)
		iso_upgrade_ok(&u, w, pause);

	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ASSERT_TRUE(hs.ok);
	ASSERT_TRUE(hr.ok); /* guest -> host: every byte, once, in order */
	g_no_error(g_in);
	g_no_error(g_out);
	g_no_error(g_idle_in);
	g_no_error(g_idle_out);
	ping(g_idle_in, h_idle_in, 'i');
	ping(g_idle_out, h_idle_out, 'o');
	ping(g_in, h_in, 'x');
	/* No RST in any worker generation; each VMM connection is the one made at the start (the
	 * front-end's driver never lost its back-end, and the glue announced it once). */
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(uvd_vm_counter(&u, u.cid[i], "rst_sent"), 0);
		ASSERT_EQ(uvd_vm_counter(&u, u.cid[i], "rst_received"), 0);
	}
	ASSERT_GE(uvd_vm_counter(&u, 3, "rx_bytes"), XFER);
	ASSERT_EQ(guest_stats(g).backend_lost, 0);
	ASSERT_EQ(guest_stats(g4).backend_lost, 0);
	ASSERT_EQ(guest_stats(g).resets, 0);
	ASSERT_EQ(guest_stats(g4).resets, 0);
	ASSERT_EQ(log_count(u.log, "vm3: VMM connected"), 1);
	ASSERT_EQ(log_count(u.log, "vm4: VMM connected"), 1);
	ASSERT_EQ(uvsock_shutdown(g_out, SHUT_WR), 0);
	ASSERT_TRUE(hs_wait_eof(h_out, WAIT_MS));

	for (int i = 0; i < 6; i++)
		close((int[]){ hl1, hl2, h_in, h_out, h_idle_in, h_idle_out }[i]);
	for (int i = 0; i < 6; i++)
		uvsock_close((int[]){ ls, ls4, g_in, g_out, g_idle_in, g_idle_out }[i]);
	uvsock_ctx_free(g);
	uvsock_ctx_free(g4);
	iso_stop(&u);
}

/*
 * A worker whose VMs are linked siblings (one group, one worker) hands both over together (the
 * stop-all-then-save of the default mode, per worker): a stream each way between the two
 * guests and a host connection keep every byte across two upgrades, no RST.
 */
TEST(isolate_a_worker_of_linked_siblings_moves_them)
{
	struct uvd u;
	struct uvsock_ctx *g3, *g4;
	struct g_io s34, s43;
	struct g_recv_io r34, r43;
	pthread_t th[4];
	pid_t w[1];
	int ls3, ls4, c34, a34, c43, a43, hl, g_out, h_out;

	iso_start_groups(&u, "--log-level=info", true);
	w[0] = iso_worker(&u, 3, 0);
	g3 = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	ls4 = g_listen(g4, SOCK_STREAM, 9000);
	c34 = g_connect(g3, SOCK_STREAM, 4, 9000);
	ASSERT_GE(c34, 0);
	a34 = uvsock_accept(ls4, NULL, NULL);
	ASSERT_GE(a34, 0);
	ls3 = g_listen(g3, SOCK_STREAM, 9001);
	c43 = g_connect(g4, SOCK_STREAM, 3, 9001);
	ASSERT_GE(c43, 0);
	a43 = uvsock_accept(ls3, NULL, NULL);
	ASSERT_GE(a43, 0);
	for (int i = 0; i < 4; i++)
		g_set_timeouts((int[]){ c34, a34, c43, a43 }[i], 4 * WAIT_MS);
	g_out = g_connect_host(g3, u.uds[0], SOCK_STREAM, 5001, WAIT_MS, &hl, &h_out);

	s34 = (struct g_io){ .fd = c34, .total = 16 * MiB, .chunk = 65536, .seed = 61 };
	r34 = (struct g_recv_io){ .fd = a34, .total = 16 * MiB, .seed = 61 };
	s43 = (struct g_io){ .fd = c43, .total = 16 * MiB, .chunk = 16384, .seed = 62 };
	r43 = (struct g_recv_io){ .fd = a43, .total = 16 * MiB, .seed = 62 };
	ASSERT_EQ(pthread_create(&th[0], NULL, g_send_paced, &s34), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, g_recv_main, &r34), 0);
	ASSERT_EQ(pthread_create(&th[2], NULL, g_send_paced, &s43), 0);
	ASSERT_EQ(pthread_create(&th[3], NULL, g_recv_main, &r43), 0);
	usleep(50 * 1000);
	for (int k = 0; k < 2; k++) {
		struct up o = ctl_upgrade(&u, NULL);
		const struct ops_jv *vm;
		pid_t nw;

		pid_t old = u.pid;

		if (o.rc != 0)
			test_fail(__FILE__, __LINE__, "upgrade failed: %s (log %s)", o.err, u.log);
		/* the workers move first, then the main process (iso_upgrade_ok) */
		ASSERT_EQ((pid_t)ops_json_u64(o.v, "old_pid", 0), old);
		u.pid = (pid_t)ops_json_u64(o.v, "new_pid", 0);
		ASSERT_TRUE(u.pid > 0 && u.pid != old);
		set_live(u.pid);
		vm = ops_json_get(o.v, "vms")->child;
		ASSERT_TRUE(vm && vm->next && !vm->next->next);
		nw = (pid_t)ops_json_u64(vm, "worker_pid", 0);
		/* one new worker for the group, named after its first VM */
		ASSERT_TRUE(nw > 0 && nw != w[0]);
		ASSERT_EQ((pid_t)ops_json_u64(vm->next, "worker_pid", 0), nw);
		ops_json_free(o.v);
		old_exited(old);
		ASSERT_TRUE(pid_gone(w[0]));
		ASSERT_EQ(iso_worker(&u, 3, 0), nw);
		test_note("worker %d -> %d", (int)w[0], (int)nw);
		w[0] = nw;
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 5; i++)
		g_no_error((int[]){ c34, a34, c43, a43, g_out }[i]);
	ping(g_out, h_out, 's');
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(uvd_vm_counter(&u, u.cid[i], "rst_sent"), 0);
		ASSERT_EQ(uvd_vm_counter(&u, u.cid[i], "rst_received"), 0);
	}
	ASSERT_EQ(guest_stats(g3).backend_lost, 0);
	ASSERT_EQ(guest_stats(g4).backend_lost, 0);

	close(hl);
	close(h_out);
	for (int i = 0; i < 7; i++)
		uvsock_close((int[]){ ls3, ls4, c34, a34, c43, a43, g_out }[i]);
	uvsock_ctx_free(g3);
	uvsock_ctx_free(g4);
	iso_stop(&u);
}

TEST(isolate_refused_upgrade_leaves_every_worker_serving)
{
	struct uvd u;
	struct uvsock_ctx *g, *g4;
	struct host_io hr;
	struct g_io gs;
	struct up o;
	pthread_t th[2];
	pid_t w[2];
	double pause[2];
	char want[400];
	int hl, hl4, g_out, h_out, g4_out, h4_out;

	iso_start(&u, "--log-level=info");
	w[0] = iso_worker(&u, 3, 0);
	w[1] = iso_worker(&u, 4, 0);
	g = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, 4 * WAIT_MS, &hl, &h_out);
	g4_out = g_connect_host(g4, u.uds[1], SOCK_STREAM, 5002, WAIT_MS, &hl4, &h4_out);
	gs = (struct g_io){ .fd = g_out, .total = 16 * MiB, .chunk = 65536, .seed = 41 };
	hr = (struct host_io){ .fd = h_out, .total = 16 * MiB, .seed = 41 };
	ASSERT_EQ(pthread_create(&th[0], NULL, g_send_paced, &gs), 0);
	ASSERT_EQ(pthread_create(&th[1], NULL, host_recv_main, &hr), 0);
	usleep(50 * 1000);

	/* The first worker's new binary refuses its record: the upgrade stops there, the old
	 * worker serves on, the second worker is not touched. */
	o = ctl_upgrade(&u, UVSOCKD_TEST_REFUSE_PATH);
	ASSERT_EQ(o.rc, 1);
	snprintf(want, sizeof(want), "upgrade refused by %s (pid ", UVSOCKD_TEST_REFUSE_PATH);
	if (!strstr(o.err, want) || !strstr(o.err, "worker of vm3 (0 of 2 upgraded"))
		test_fail(__FILE__, __LINE__, "unexpected error: %s", o.err);
	test_note("refused as expected: %s", o.err);
	ASSERT_EQ(iso_worker(&u, 3, 0), w[0]);
	ASSERT_EQ(iso_worker(&u, 4, 0), w[1]);
	ASSERT_TRUE(uvd_alive(&u));
	ping(g4_out, h4_out, 'r');

	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	ASSERT_TRUE(hr.ok);
	g_no_error(g_out);
	g_no_error(g4_out);
	ASSERT_EQ(uvd_vm_counter(&u, 3, "rst_sent"), 0);
	ASSERT_EQ(uvd_vm_counter(&u, 3, "rst_received"), 0);
	/* and a real upgrade after it */
	iso_upgrade_ok(&u, w, pause);
	ping(g_out, h_out, 'a');
	ping(g4_out, h4_out, 'b');
	ASSERT_EQ(guest_stats(g).backend_lost, 0);
	ASSERT_EQ(guest_stats(g4).backend_lost, 0);

	for (int i = 0; i < 4; i++)
		close((int[]){ hl, hl4, h_out, h4_out }[i]);
	uvsock_close(g_out);
	uvsock_close(g4_out);
	uvsock_ctx_free(g);
	uvsock_ctx_free(g4);
	iso_stop(&u);
}

TEST(isolate_a_worker_killed_after_an_upgrade_is_readopted_then_sigusr2)
{
	struct uvd u;
	struct uvsock_ctx *g, *g4;
	pid_t w[2], w3;
	double pause[2];
	int kept, ls, hl, hl4, g1, h1, g4_out, h4_out, g2, h2, g3, h3;
	char b;

	/* Split rings: a running packed ring is not adopted after a crash (docs/upgrade.md). */
	ASSERT_EQ(setenv("UVSOCK_TUNE", "no-packed", 1), 0);
	iso_start(&u, "--log-level=debug");
	ASSERT_EQ(unsetenv("UVSOCK_TUNE"), 0);
	w[0] = iso_worker(&u, 3, 0);
	w[1] = iso_worker(&u, 4, 0);
	g = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	g1 = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, WAIT_MS, &hl, &h1);
	g4_out = g_connect_host(g4, u.uds[1], SOCK_STREAM, 5002, WAIT_MS, &hl4, &h4_out);
	ping(g1, h1, 'a');
	ASSERT_WAIT_FOR(log_count(u.log, "vm3: crash-survival record kept: ") > 0, WAIT_MS);
	kept = log_count(u.log, "vm3: crash-survival record kept: ");
	iso_upgrade_ok(&u, w, pause);
	/* The new worker's first record replaces the old one's. */
	ASSERT_WAIT_FOR(log_count(u.log, "vm3: crash-survival record kept: ") > kept, WAIT_MS);
	ping(g1, h1, 'b');

	/* The crash of the new worker: re-adopted, its connections end, the VM keeps vsock. */
	ASSERT_EQ(kill(w[0], SIGKILL), 0);
	ASSERT_WAIT_FOR(pid_gone(w[0]), WAIT_MS);
	ASSERT_TRUE(hs_wait_eof(h1, WAIT_MS));
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	w3 = iso_worker(&u, 3, w[0]);
	ASSERT_NE(w3, w[0]);
	g_set_timeouts(g1, WAIT_MS);
	ASSERT_TRUE(uvsock_recv(g1, &b, 1, 0) <= 0);
	/* New connections both ways through the adopted VMM connection. */
	g2 = g_connect_host(g, u.uds[0], SOCK_STREAM, 5003, WAIT_MS, &hl, &h2);
	g3 = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &h3);
	g_set_timeouts(g3, WAIT_MS);
	ping(g2, h2, 'c');
	ping(g3, h3, 'd');
	ASSERT_EQ(guest_stats(g).backend_lost, 0);
	/* VM 4's worker (upgraded too) untouched. */
	ASSERT_EQ(iso_worker(&u, 4, 0), w[1]);
	ping(g4_out, h4_out, 'e');
	ASSERT_EQ(guest_stats(g4).backend_lost, 0);
	/* SIGUSR2 to the main: both workers again, the connections carry on. */
	ASSERT_EQ(kill(u.pid, SIGUSR2), 0);
	ASSERT_WAIT_FOR(file_has(u.log, "SIGUSR2: upgraded: pid "), 4 * WAIT_MS);
	{
		pid_t old = u.pid;

		u.pid = log_pid_after(u.log, "SIGUSR2: upgraded: pid ");
		ASSERT_TRUE(u.pid > 0 && u.pid != old);
		set_live(u.pid);
		old_exited(old);
	}
	ASSERT_NE(iso_worker(&u, 4, 0), w[1]);
	ASSERT_NE(iso_worker(&u, 3, 0), w3);
	ping(g2, h2, 'f');
	ping(g3, h3, 'g');
	ping(g4_out, h4_out, 'h');
	ASSERT_EQ(guest_stats(g).backend_lost, 0);
	ASSERT_EQ(guest_stats(g4).backend_lost, 0);
	ASSERT_TRUE(uvd_alive(&u));

	for (int i = 0; i < 6; i++)
		close((int[]){ hl, hl4, h1, h2, h3, h4_out }[i]);
	for (int i = 0; i < 5; i++)
		uvsock_close((int[]){ ls, g1, g2, g3, g4_out }[i]);
	uvsock_ctx_free(g);
	uvsock_ctx_free(g4);
	iso_stop(&u);
}


TEST(isolate_refused_main_hand_over_leaves_the_old_main_in_charge)
{
	struct uvd u;
	struct uvsock_ctx *g, *g4;
	struct up o;
	pid_t w[2], nw[2], w3, main0;
	double pause[2];
	char want[400], ndir[] = "/tmp/uvsock-isoup-n-XXXXXX", buf[512];
	struct sockaddr_un na = { .sun_family = AF_UNIX };
	int hl, hl4, g_out, h_out, g4_out, h4_out, nfd;

	/* systemd's side: a NOTIFY_SOCKET of ours, inherited by every main process */
	ASSERT_TRUE(mkdtemp(ndir) != NULL);
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(nfd, 0);
	snprintf(na.sun_path, sizeof(na.sun_path), "%s/notify", ndir);
	ASSERT_EQ(bind(nfd, (struct sockaddr *)&na, sizeof(na)), 0);
	ASSERT_EQ(setenv("NOTIFY_SOCKET", na.sun_path, 1), 0);
	ASSERT_EQ(setenv("UVSOCK_TUNE", "no-packed", 1), 0);
	iso_start(&u, "--log-level=debug");
	ASSERT_EQ(unsetenv("UVSOCK_TUNE"), 0);
	ASSERT_EQ(unsetenv("NOTIFY_SOCKET"), 0);
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)) && strstr(buf, "READY=1"));
	main0 = u.pid;
	w[0] = iso_worker(&u, 3, 0);
	w[1] = iso_worker(&u, 4, 0);
	g = g_guest_new(u.sock[0], NULL);
	g4 = g_guest_new(u.sock[1], NULL);
	g_out = g_connect_host(g, u.uds[0], SOCK_STREAM, 5001, WAIT_MS, &hl, &h_out);
	g4_out = g_connect_host(g4, u.uds[1], SOCK_STREAM, 5002, WAIT_MS, &hl4, &h4_out);
	ping(g_out, h_out, 'a');

	/* The new binary takes the workers but refuses the main's record: the workers run it,
	 * the old main stays in charge and says why. */
	o = ctl_upgrade(&u, UVSOCKD_TEST_REFUSE_MAIN_PATH);
	ASSERT_EQ(o.rc, 1);
	snprintf(want, sizeof(want), "refused by %s (pid ", UVSOCKD_TEST_REFUSE_MAIN_PATH);
	if (!strstr(o.err, "every worker was upgraded (2), the main process was not") ||
	    !strstr(o.err, want) || !strstr(o.err, "version 1"))
		test_fail(__FILE__, __LINE__, "unexpected error: %s", o.err);
	test_note("refused as expected: %s", o.err);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(u.pid, main0);
	nw[0] = iso_worker(&u, 3, w[0]);
	nw[1] = iso_worker(&u, 4, w[1]);
	ASSERT_TRUE(pid_gone(w[0]) && pid_gone(w[1]));
	ping(g_out, h_out, 'b');
	ping(g4_out, h4_out, 'c');
	/* The workers' parent death signal is set again: the old main still supervises; a crash
	 * is restarted by it. */
	ASSERT_EQ(kill(nw[0], SIGKILL), 0);
	ASSERT_WAIT_FOR(pid_gone(nw[0]), WAIT_MS);
	w3 = iso_worker(&u, 3, nw[0]);
	ASSERT_EQ(worker_of(&u, 3), w3); /* its child */
	ASSERT_WAIT_FOR(file_has(u.log, "vm3: adopted the VMM's vhost-user connection"), WAIT_MS);
	ping(g4_out, h4_out, 'd');
	/* and a real upgrade after it replaces the main, which tells systemd: MAINPID=<itself>,
	 * then READY=1 (nothing from the refused one) */
	w[0] = w3;
	w[1] = nw[1];
	iso_upgrade_ok(&u, w, pause);
	ping(g4_out, h4_out, 'e');
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)));
	ASSERT_EQ(strncmp(buf, "MAINPID=", 8), 0);
	ASSERT_EQ((pid_t)atoi(buf + 8), u.pid);
	ASSERT_TRUE(notify_recv(nfd, buf, sizeof(buf)) && strstr(buf, "READY=1"));
	close(nfd);
	unlink(na.sun_path);
	rmdir(ndir);

	for (int i = 0; i < 4; i++)
		close((int[]){ hl, hl4, h_out, h4_out }[i]);
	uvsock_close(g_out);
	uvsock_close(g4_out);
	uvsock_ctx_free(g);
	uvsock_ctx_free(g4);
	iso_stop(&u);
}

/* uvsock-ctl --control CTL add-vm SPEC, in-process: its exit status. */
static int ctl_add_vm(const struct uvd *u, const char *spec)
{
	char ctl[160], out[512] = "", err[512] = "";
	char *argv[] = { "uvsock-ctl", "--control", ctl, "add-vm", (char *)spec, NULL };
	FILE *fo = fmemopen(out, sizeof(out) - 1, "w"), *fe = fmemopen(err, sizeof(err) - 1, "w");
	int rc;

	ASSERT_TRUE(fo && fe);
	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	rc = uvsock_ctl_main(5, argv, "test", fo, fe);
	fclose(fo);
	fclose(fe);
	if (rc)
		test_note("add-vm: %s", err);
	return rc;
}

TEST(two_vms_and_a_runtime_vm_move_together)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvd u;
	struct uvsock_ctx *g[2];
	int ls[2], gfd[2], hfd[2];
	char spec[400], sock5[160];
	struct ops_jv *v;
	const struct ops_jv *e;
	struct up o;
	unsigned n = 0;
	struct stat sb;
	pid_t old;

	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	uvd_start(&u, 2, cids, NULL, "--log-level=info");
	set_live(u.pid);
	for (int i = 0; i < 2; i++) {
		g[i] = g_guest_new(u.sock[i], NULL);
		ls[i] = g_listen(g[i], SOCK_STREAM, 6000);
		gfd[i] = g_accept_host(ls[i], u.uds[i], SOCK_STREAM, 6000, &hfd[i]);
	}
	/* a third VM added at run time, with no VMM: it moves too (its config is in its record) */
	snprintf(sock5, sizeof(sock5), "%s/vm5.sock", u.dir);
	snprintf(spec, sizeof(spec), "guest-cid=5,socket=%s,uds-path=%s/vm5.vsock,name=late",
		 sock5, u.dir);
	ASSERT_EQ(ctl_add_vm(&u, spec), 0);

	/* A refusal with three VMs: every one of them goes on. */
	upgrade_refused(&u, UVSOCKD_TEST_REFUSE_PATH, "version 1 is not one this program reads");
	for (int i = 0; i < 2; i++)
		ping(gfd[i], hfd[i], (char)('a' + i));

	old = u.pid;
	o = ctl_upgrade(&u, NULL);
	if (o.rc != 0)
		test_fail(__FILE__, __LINE__, "upgrade failed: %s", o.err);
	u.pid = (pid_t)ops_json_u64(o.v, "new_pid", 0);
	set_live(u.pid);
	for (e = ops_json_get(o.v, "vms")->child; e; e = e->next, n++) {
		static const uint64_t want[] = { 3, 4, 5 };

		ASSERT_TRUE(n < 3 && ops_json_u64(e, "cid", 0) == want[n]);
	}
	ASSERT_EQ(n, 3);
	ops_json_free(o.v);
	old_exited(old);
	for (int i = 0; i < 2; i++) {
		ping(gfd[i], hfd[i], (char)('c' + i));
		g_no_error(gfd[i]);
	}
	/* the runtime VM is served by the new process under its name, its socket file kept */
	v = uvd_ctl_query(&u, "vms");
	n = 0;
	for (e = ops_json_get(v, "vms")->child; e; e = e->next)
		n++;
	ASSERT_EQ(n, 3);
	ops_json_free(v);
	ASSERT_EQ(stat(sock5, &sb), 0);
	{
		char ctl[160], out[256] = "", err[256] = "";
		char *argv[] = { "uvsock-ctl", "--control", ctl, "remove-vm", "late", NULL };
		FILE *fo = fmemopen(out, sizeof(out) - 1, "w"), *fe = fmemopen(err, 255, "w");

		snprintf(ctl, sizeof(ctl), "%s.ctl", u.sock[0]);
		ASSERT_EQ(uvsock_ctl_main(5, argv, "test", fo, fe), 0);
		fclose(fo);
		fclose(fe);
	}
	ASSERT_NE(stat(sock5, &sb), 0); /* removed by the new process: the file is its own */

	for (int i = 0; i < 2; i++) {
		close(hfd[i]);
		uvsock_close(gfd[i]);
		uvsock_close(ls[i]);
		uvsock_ctx_free(g[i]);
	}
	stop_all(&u);
}

/*
 * uvsockd --fd=3 (fd3 its fd 3) --guest-cid CID --uds-path DIR/u.vsock --control DIR/x.ctl, in
 * a fresh u (u->sock[0] is DIR/x, so that ctl_upgrade finds DIR/x.ctl).
 */
static void spawn_inherited(struct uvd *u, int fd3, uint32_t cid)
{
	char cids[16], uds[160], ctl[160];
	char *argv[] = { (char *)uvd_binary(), "--fd=3", "--guest-cid", cids, "--uds-path", uds,
			 "--control", ctl, "--log-level=info", NULL };
	pid_t parent = getpid();

	memset(u, 0, sizeof(*u));
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-it-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	snprintf(u->sock[0], sizeof(u->sock[0]), "%s/x", u->dir);
	snprintf(u->uds[0], sizeof(u->uds[0]), "%s/u.vsock", u->dir);
	u->nvms = 1;
	u->cid[0] = cid;
	snprintf(cids, sizeof(cids), "%u", cid);
	snprintf(uds, sizeof(uds), "%s", u->uds[0]);
	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	u->pid = fork();
	ASSERT_GE(u->pid, 0);
	if (u->pid == 0) {
		int lf = open(u->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(lf, 1);
		dup2(lf, 2);
		if (fd3 == 3)
			fcntl(3, F_SETFD, 0); /* dup2 onto itself would keep close-on-exec */
		else
			dup2(fd3, 3);
		execv(argv[0], argv);
		_exit(127);
	}
	set_live(u->pid);
}

/* The log file has `what` (every generation writes to it: they share its fd). */
static bool log_says(const char *log, const char *what)
{
	char buf[65536];
	FILE *f = fopen(log, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strstr(buf, what) != NULL;
}

/* A front-end session on sock: negotiated (features, memory), the guest CID read back. */
static struct vhu_front *front_on(int sock, uint32_t want_cid)
{
	struct vhu_front_config cfg;
	struct vhu_front *f;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 1 << 20;
	ASSERT_OK(vhu_front_new(sock, &cfg, &f));
	ASSERT_OK(vhu_front_init(f));
	ASSERT_EQ(vhu_front_guest_cid(f), want_cid);
	return f;
}

/* The VMM's next request after an upgrade is answered by the new process on the same socket. */
static void front_still_served(struct vhu_front *f, uint32_t want_cid)
{
	uint64_t cid = 0, feat = 0;

	ASSERT_OK(vhu_front_get_config(f, 0, sizeof(cid), &cid));
	ASSERT_EQ(cid, want_cid);
	ASSERT_OK(vhu_front_get_features(f, &feat));
	ASSERT_NE(feat, 0);
}

TEST(inherited_sockets_travel_too)
{
	struct uvd u;
	struct vhu_front *f;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char path[96];
	int sp[2], l, c;

	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	/* --fd with a connected socket: the VMM's connection itself is inherited */
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp));
	spawn_inherited(&u, sp[1], 12);
	close(sp[1]);
	f = front_on(sp[0], 12);
	upgrade_ok(&u, 0);
	front_still_served(f, 12);
	upgrade_ok(&u, 0);
	front_still_served(f, 12);
	vhu_front_free(f);
	/* the inherited connection ended: the VM is detached, and moves so */
	ASSERT_TRUE(WAIT_FOR(log_says(u.log, "the inherited vhost-user connection ended"), 5000));
	upgrade_ok(&u, 0);
	stop_all(&u);

	/* --fd with a listening socket (bound by us, as a service manager would): it moves, the
	 * new process accepts the next VMM on it, and leaves the file, which is not its own */
	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	snprintf(path, sizeof(path), "/tmp/uvsock-up-l%d.sock", (int)getpid());
	l = hs_listen(path, SOCK_STREAM);
	spawn_inherited(&u, l, 13);
	close(l);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ASSERT_TRUE(WAIT_FOR((c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
			     (connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0 ||
			      (close(c), c = -1, false)), 5000));
	f = front_on(c, 13);
	upgrade_ok(&u, 0);
	front_still_served(f, 13);
	vhu_front_free(f); /* the VMM goes away: the new process serves the listener again */
	ASSERT_TRUE(WAIT_FOR((c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
			     (connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0 ||
			      (close(c), c = -1, false)), 5000));
	f = front_on(c, 13);
	vhu_front_free(f);
	stop_all(&u);
	ASSERT_EQ(access(path, F_OK), 0);
	unlink(path);
}

/* ---- the benchmark: the pause with 1 and 1000 open connections ---------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* One daemon with `conns` host -> guest connections, upgraded `runs` times: median pause. */
static void bench_conns(unsigned conns, int runs)
{
	struct uvd u;
	struct uvsock_ctx *g;
	double pause[32];
	int *hfd = calloc(conns, sizeof(int)), *gfd = calloc(conns, sizeof(int)), ls;
	double la[3] = { 0 };
	char cmd[128];

	ASSERT_TRUE(hfd && gfd);
	ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	start_one(&u);
	g = g_guest_new(u.sock[0], NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	for (unsigned i = 0; i < conns; i++)
		gfd[i] = g_accept_host(ls, u.uds[0], SOCK_STREAM, 6000, &hfd[i]);
	for (int r = 0; r < runs; r++) {
		struct up o = ctl_upgrade(&u, NULL);
		pid_t old = u.pid;

		if (o.rc != 0)
			test_fail(__FILE__, __LINE__, "upgrade failed: %s", o.err);
		pause[r] = ops_json_get(ops_json_get(o.v, "vms")->child, "pause_ms")->d;
		u.pid = (pid_t)ops_json_u64(o.v, "new_pid", 0);
		set_live(u.pid);
		ops_json_free(o.v);
		old_exited(old);
	}
	ping(gfd[conns - 1], hfd[conns - 1], 'z');
	(void)getloadavg(la, 3);
	qsort(pause, (size_t)runs, sizeof(pause[0]), cmp_double);
	printf("upgrade pause, %u connection%s, %d runs: median %.3f ms (min %.3f, max %.3f); "
	       "load average %.2f %.2f %.2f\n", conns, conns == 1 ? "" : "s", runs,
	       pause[runs / 2], pause[0], pause[runs - 1], la[0], la[1], la[2]);
	fflush(stdout);
	for (unsigned i = 0; i < conns; i++) {
		close(hfd[i]);
		uvsock_close(gfd[i]);
	}
	uvsock_close(ls);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_kill(&u), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", u.dir);
	(void)!system(cmd);
	free(hfd);
	free(gfd);
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--bench")) {
		int runs = argc == 4 && !strcmp(argv[2], "--runs") ? atoi(argv[3]) : 7;
		struct rlimit rl;

		if (runs < 1 || runs > 32) {
			fprintf(stderr, "usage: %s --bench [--runs 1..32]\n", argv[0]);
			return 2;
		}
		/* 1000 host sockets here */
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
			rl.rlim_cur = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &rl);
		}
		bench_conns(1, runs);
		bench_conns(1000, runs);
		return 0;
	}
	return test_main(argc, argv);
}
