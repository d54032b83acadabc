/* SPDX-License-Identifier: MIT */
/*
 * uvsockd as operators and service managers start it: a second daemon on a live daemon's paths
 * (refused before anything is bound, naming the path and the owner's PID; stale files kept), the
 * usage exit status, --print-capabilities and the vhost-user descriptor JSON (parsed with
 * python3's json), --fd with a listening and with a connected vhost-user socket (driven by the
 * project's vhost-user front-end), systemd readiness (a test-owned NOTIFY_SOCKET), socket
 * activation (LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES set in the child before exec, so LISTEN_PID is
 * the daemon's), journald priority prefixes and timestamps, --socket-mode/--socket-group, and
 * `systemd-analyze verify` of the shipped units (skipped, loudly, without systemd-analyze).
 */
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "hostside.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "util/uds.h"
#include "vhost_user/frontend.h"

#ifndef UVSOCK_BUILD_ROOT
#define UVSOCK_BUILD_ROOT "."
#endif

/* ---- helpers ------------------------------------------------------------------------------- */

/* A fresh directory for one case's sockets and logs (u->dir, u->log); no daemon yet. */
static void case_dir(struct uvd *u)
{
	memset(u, 0, sizeof(*u));
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-dm-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
}

/*
 * Forks and executes argv with stdout and stderr to log: fds[0..n) become descriptors 3, 4, ...,
 * env ("K=V" strings, NULL-terminated, may be NULL) is added, and with listen_pid LISTEN_PID is
 * set to the child's own PID, which exec keeps (sd_listen_fds(3) checks it).
 */
static pid_t spawn_fds(const char *log, char *const *argv, const int *fds, unsigned n,
		       const char *const *env, bool listen_pid)
{
	pid_t parent = getpid(), pid = fork();

	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		char lp[32];

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		int high[4];

		/* Out of the way first, so that placing one never closes another. */
		for (unsigned i = 0; i < n && i < 4; i++)
			high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
		for (unsigned i = 0; i < n && i < 4; i++)
			if (high[i] < 0 || dup2(high[i], 3 + (int)i) != 3 + (int)i)
				_exit(126);
		for (unsigned i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		if (listen_pid) {
			snprintf(lp, sizeof(lp), "%d", (int)getpid());
			setenv("LISTEN_PID", lp, 1);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

/* spawn_fds with at most one descriptor (fd3 < 0: none). */
static pid_t spawn_env(const char *log, char *const *argv, int fd3, const char *const *env,
		       bool listen_pid)
{
	return spawn_fds(log, argv, &fd3, fd3 >= 0, env, listen_pid);
}

/* Waits (bounded) for pid to exit; returns its exit status, or -1 (killed) if it did not. */
static int wait_exit(pid_t pid, int ms)
{
	int st = 0;

	if (!WAIT_FOR(waitpid(pid, &st, WNOHANG) == pid, ms)) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* SIGTERM, then the bounded wait; the exit status or -1. */
static int stop_pid(pid_t pid)
{
	kill(pid, SIGTERM);
	return wait_exit(pid, 5000);
}

static bool log_has(const char *log, const char *needle)
{
	static char buf[1 << 16];
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return strstr(buf, needle) != NULL;
}

static void assert_log_has(const char *log, const char *needle)
{
	if (!log_has(log, needle))
		test_fail(__FILE__, __LINE__, "%s does not say '%s'", log, needle);
}

/* A socket file nobody listens on (what a crashed daemon leaves); returns its inode. */
static ino_t stale_socket(const char *path)
{
	struct stat st;

	close(hs_listen(path, SOCK_STREAM));
	ASSERT_OK(lstat(path, &st));
	return st.st_ino;
}

static ino_t inode_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? st.st_ino : 0;
}

/* The guest CID a vhost-user session on sock (connected; taken over) reads from the back-end. */
static uint64_t frontend_cid(int sock)
{
	struct vhu_front_config cfg;
	struct vhu_front *f;
	uint64_t cid;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 1 << 20;
	ASSERT_OK(vhu_front_new(sock, &cfg, &f));
	ASSERT_OK(vhu_front_init(f));
	cid = vhu_front_guest_cid(f);
	vhu_front_free(f);
	return cid;
}

/* Connects to the vhost-user listener at path (retrying while the daemon starts). */
static int connect_path(const char *path)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = -1;

	ASSERT_TRUE(WAIT_FOR((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
			     (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 ||
			      (close(fd), fd = -1, false)), 5000));
	return fd;
}

/* Runs cmd with sh and returns its exit status (-1 if it did not run). */
static int run_sh(const char *cmd)
{
	int st = system(cmd);

	return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- bug 1: a second uvsockd on a live daemon's paths -------------------------------------- */

/* Starts a second daemon with the VM specs given (NULL-terminated) and waits for its exit. */
static int second_daemon(struct uvd *b, const char *const *vms, const char *control)
{
	char *argv[16] = { (char *)uvd_binary() };
	int argc = 1;

	for (unsigned i = 0; vms[i]; i++) {
		argv[argc++] = "--vm";
		argv[argc++] = (char *)vms[i];
	}
	argv[argc++] = "--control";
	argv[argc++] = (char *)control;
	argv[argc] = NULL;
	return wait_exit(spawn_env(b->log, argv, -1, NULL, false), 5000);
}

TEST(second_daemon_leaves_a_live_daemons_sockets_alone)
{
	static const uint32_t cids[] = { 3 };
	char stale[160], fresh[160], vm5[400], vm6[400], vm7[400], ctl[160], actl[160], pid[32];
	struct uvd a, b;
	ino_t stale_ino;

	uvd_start(&a, 1, cids, NULL, "--log-level=info");
	case_dir(&b);
	snprintf(stale, sizeof(stale), "%s/stale.sock", b.dir);
	snprintf(fresh, sizeof(fresh), "%s/vm5.vsock", b.dir);
	snprintf(ctl, sizeof(ctl), "%s/b.ctl", b.dir);
	snprintf(actl, sizeof(actl), "%s.ctl", a.sock[0]);
	snprintf(pid, sizeof(pid), "(pid %d)", (int)a.pid);
	stale_ino = stale_socket(stale);

	/* VM 5 comes first on paths of its own; VM 6 names the live daemon's vhost-user socket. */
	snprintf(vm5, sizeof(vm5), "guest-cid=5,socket=%s,uds-path=%s", stale, fresh);
	snprintf(vm6, sizeof(vm6), "guest-cid=6,socket=%s,uds-path=%s/vm6.vsock", a.sock[0],
		 b.dir);
	ASSERT_EQ(second_daemon(&b, (const char *const[]){ vm5, vm6, NULL }, ctl), 1);
	/* Nothing was bound before the check: the stale file is untouched, VM 5's path unmade. */
	ASSERT_EQ(inode_of(stale), stale_ino);
	ASSERT_EQ(uds_probe(stale, SOCK_STREAM), 0);
	ASSERT_EQ(access(fresh, F_OK), -1);
	assert_log_has(b.log, a.sock[0]);
	assert_log_has(b.log, "is in use: another process serves it");
	assert_log_has(b.log, pid);

	/* The live daemon's uds-path, and its control socket, are refused the same way. */
	snprintf(vm7, sizeof(vm7), "guest-cid=7,socket=%s/vm7.sock,uds-path=%s", b.dir, a.uds[0]);
	ASSERT_EQ(second_daemon(&b, (const char *const[]){ vm7, NULL }, ctl), 1);
	assert_log_has(b.log, a.uds[0]);
	snprintf(vm7, sizeof(vm7), "guest-cid=7,socket=%s/vm7.sock,uds-path=%s/vm7.vsock", b.dir,
		 b.dir);
	ASSERT_EQ(second_daemon(&b, (const char *const[]){ vm7, NULL }, actl), 1);
	assert_log_has(b.log, actl);

	/* The first daemon still serves every path it had. */
	ASSERT_TRUE(uvd_alive(&a));
	ASSERT_EQ(uds_probe(a.sock[0], SOCK_STREAM), -EADDRINUSE);
	ASSERT_EQ(uds_probe(a.uds[0], SOCK_STREAM), -EADDRINUSE);
	ASSERT_EQ(uds_probe(actl, SOCK_STREAM), -EADDRINUSE);
	ASSERT_EQ(frontend_cid(connect_path(a.sock[0])), 3);

	/* A stale socket alone is replaced, and that is logged. */
	ASSERT_EQ(uvd_stop(&a), 0);
	(void)stale_socket(stale);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm5, "--control", "none", NULL };
		pid_t p = spawn_env(b.log, argv, -1, NULL, false);

		/* Live now: replaced (its inode number may well be the freed one, see uds.h). */
		ASSERT_WAIT_FOR(uds_probe(stale, SOCK_STREAM) == -EADDRINUSE, 5000);
		ASSERT_EQ(stop_pid(p), 0);
	}
	assert_log_has(b.log, "replaced the stale socket file");
	/* At exit it removed only its own files. */
	ASSERT_EQ(access(stale, F_OK), -1);
	ASSERT_EQ(access(fresh, F_OK), -1);
	uvd_stop(&b);
}

/* ---- the command line ---------------------------------------------------------------------- */

TEST(usage_errors_exit_2_and_version_exits_0)
{
	char *bad[] = { (char *)uvd_binary(), "--bogus", NULL };
	char *novalue[] = { (char *)uvd_binary(), "--socket", NULL };
	char *ver[] = { (char *)uvd_binary(), "--version", NULL };
	struct uvd u;

	case_dir(&u);
	ASSERT_EQ(wait_exit(spawn_env(u.log, bad, -1, NULL, false), 5000), 2);
	assert_log_has(u.log, "uvsockd: unknown argument '--bogus'");
	ASSERT_EQ(wait_exit(spawn_env(u.log, novalue, -1, NULL, false), 5000), 2);
	assert_log_has(u.log, "--socket needs a value");
	ASSERT_EQ(wait_exit(spawn_env(u.log, ver, -1, NULL, false), 5000), 0);
	assert_log_has(u.log, "uvsockd " UVSOCK_VERSION_STR);
	uvd_stop(&u);
}

TEST(print_capabilities_ignores_other_options)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd),
		 "%s --bogus --print-capabilities --vm nonsense | python3 -c 'import json, sys; "
		 "d = json.load(sys.stdin); sys.exit(0 if d == {\"type\": \"vsock\", \"features\": "
		 "[\"migrate-precopy\", \"seqpacket\", \"dgram\", \"siblings\"]} else 1)'",
		 uvd_binary());
	ASSERT_EQ(run_sh(cmd), 0);
}

TEST(vhost_user_descriptor_is_a_backend_json)
{
	char cmd[1024];

	/* QEMU's docs/interop/vhost-user.json, VhostUserBackend: description, type, binary. */
	snprintf(cmd, sizeof(cmd),
		 "python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); "
		 "sys.exit(0 if d[\"type\"] == \"vsock\" and d[\"binary\"].endswith(\"/uvsockd\") "
		 "and d[\"description\"] and set(d) == {\"description\", \"type\", \"binary\"} "
		 "else 1)' %s/data/50-uvsockd.json", UVSOCK_BUILD_ROOT);
	ASSERT_EQ(run_sh(cmd), 0);
}

/* ---- --fd: inherited vhost-user sockets ---------------------------------------------------- */

/*
 * The daemon p serves VM cids[i] on the inherited listener at paths[i]; stopped, it logged
 * `line` and left each file (whoever bound it owns it: the test, or the service manager).
 */
static void assert_served_inherited(pid_t p, const char *log, const char *const *paths,
				    const uint32_t *cids, unsigned n, const char *line)
{
	for (unsigned i = 0; i < n; i++)
		ASSERT_EQ(frontend_cid(connect_path(paths[i])), cids[i]);
	ASSERT_EQ(stop_pid(p), 0);
	assert_log_has(log, line);
	for (unsigned i = 0; i < n; i++)
		ASSERT_EQ(access(paths[i], F_OK), 0);
}

/*
 * Runs uvsockd with `--fd 3 --guest-cid cid --uds-path DIR/u.vsock [extra]` and fd 3 = fd3
 * (extra: one more argument or NULL).
 */
static pid_t spawn_fd_x(struct uvd *u, int fd3, uint32_t cid, const char *extra)
{
	char cids[16], uds[160];
	char *argv[] = { (char *)uvd_binary(), "--fd=3", "--guest-cid", cids, "--uds-path", uds,
			 "--log-level=info", (char *)extra, NULL };

	snprintf(cids, sizeof(cids), "%u", cid);
	snprintf(uds, sizeof(uds), "%s/u.vsock", u->dir);
	return spawn_env(u->log, argv, fd3, NULL, false);
}

static pid_t spawn_fd(struct uvd *u, int fd3, uint32_t cid)
{
	return spawn_fd_x(u, fd3, cid, NULL);
}

TEST(fd_with_a_listening_socket)
{
	char path[160];
	struct uvd u;
	pid_t p;
	int l;

	case_dir(&u);
	snprintf(path, sizeof(path), "%s/inherited.sock", u.dir);
	l = hs_listen(path, SOCK_STREAM);
	p = spawn_fd(&u, l, 11);
	close(l);
	/* Twice: a VMM that goes away is followed by the next one on the same listener. */
	ASSERT_EQ(frontend_cid(connect_path(path)), 11);
	assert_served_inherited(p, u.log, (const char *[]){ path }, (const uint32_t[]){ 11 }, 1,
				"inherited fd 3 (listening)");
	uvd_stop(&u);
}

TEST(fd_with_a_connected_socket)
{
	struct uvd u;
	int sp[2];
	pid_t p;

	case_dir(&u);
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp));
	p = spawn_fd(&u, sp[1], 12);
	close(sp[1]);
	ASSERT_EQ(frontend_cid(sp[0]), 12);
	ASSERT_WAIT_FOR(log_has(u.log, "the inherited vhost-user connection ended"), 5000);
	ASSERT_EQ(stop_pid(p), 0);
	assert_log_has(u.log, "inherited fd 3 (connected)");
	uvd_stop(&u);
}

/* With --isolate the worker process serves the inherited sockets (its fork took them along). */
TEST(fd_with_isolate)
{
	char path[160];
	struct uvd u;
	int l, sp[2];
	pid_t p;

	case_dir(&u);
	snprintf(path, sizeof(path), "%s/inherited.sock", u.dir);
	l = hs_listen(path, SOCK_STREAM);
	p = spawn_fd_x(&u, l, 14, "--isolate");
	close(l);
	assert_served_inherited(p, u.log, (const char *[]){ path }, (const uint32_t[]){ 14 }, 1,
				"worker pid");
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp));
	p = spawn_fd_x(&u, sp[1], 15, "--isolate");
	close(sp[1]);
	ASSERT_EQ(frontend_cid(sp[0]), 15);
	ASSERT_WAIT_FOR(log_has(u.log, "the inherited vhost-user connection ended"), 5000);
	ASSERT_EQ(stop_pid(p), 0);
	uvd_stop(&u);
}

TEST(fd_that_is_not_a_unix_stream_socket)
{
	struct uvd u;
	int pfd[2], dg;

	case_dir(&u);
	ASSERT_OK(pipe(pfd));
	ASSERT_EQ(wait_exit(spawn_fd(&u, pfd[0], 13), 5000), 1);
	assert_log_has(u.log, "fd 3: not a Unix socket");
	close(pfd[0]);
	close(pfd[1]);
	dg = socket(AF_UNIX, SOCK_DGRAM, 0);
	ASSERT_EQ(wait_exit(spawn_fd(&u, dg, 13), 5000), 1);
	assert_log_has(u.log, "fd 3: not a stream socket");
	close(dg);
	uvd_stop(&u);
}

/* ---- systemd ------------------------------------------------------------------------------- */

/* Receives one sd_notify datagram on fd into buf within 5 s (asserted). */
static const char *notify_recv(int fd, char *buf, size_t len)
{
	ssize_t n;

	ASSERT_EQ(hs_wait_fd(fd, POLLIN, 5000), 1);
	n = recv(fd, buf, len - 1, 0);
	ASSERT_GT(n, 0);
	buf[n] = '\0';
	return buf;
}

TEST(notify_ready_status_stopping)
{
	static const uint32_t cids[] = { 21, 22 };
	char ns[200], vm[2][300], buf[512];
	const char *env[] = { ns, NULL };
	struct sockaddr_un sa;
	struct uvd u;
	pid_t p;
	int fd;

	case_dir(&u);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(fd, 0);
	sa = hs_addr(u.dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", u.dir);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	snprintf(ns, sizeof(ns), "NOTIFY_SOCKET=%s", sa.sun_path);
	for (int i = 0; i < 2; i++)
		snprintf(vm[i], sizeof(vm[i]),
			 "guest-cid=%u,socket=%s/vm%u.sock,uds-path=%s/vm%u.vsock", cids[i], u.dir,
			 cids[i], u.dir, cids[i]);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm[0], "--vm", vm[1], NULL };

		p = spawn_env(u.log, argv, -1, env, false);
	}
	notify_recv(fd, buf, sizeof(buf));
	ASSERT_TRUE(strstr(buf, "READY=1") != NULL);
	ASSERT_TRUE(strstr(buf, "STATUS=serving 2 VMs") != NULL);
	/* Ready means every listener is up. */
	for (int i = 0; i < 2; i++) {
		char path[200];

		snprintf(path, sizeof(path), "%s/vm%u.sock", u.dir, cids[i]);
		ASSERT_EQ(uds_probe(path, SOCK_STREAM), -EADDRINUSE);
		snprintf(path, sizeof(path), "%s/vm%u.vsock_seqpacket", u.dir, cids[i]);
		ASSERT_EQ(uds_probe(path, SOCK_SEQPACKET), -EADDRINUSE);
	}
	kill(p, SIGTERM);
	notify_recv(fd, buf, sizeof(buf));
	ASSERT_TRUE(strstr(buf, "STOPPING=1") != NULL);
	ASSERT_EQ(wait_exit(p, 5000), 0);
	close(fd);
	uvd_stop(&u);
}

TEST(socket_activation_by_address_and_by_name)
{
	char a_path[160], b_bound[160], vm[2][300], names[64];
	const char *env[] = { "LISTEN_FDS=2", names, NULL };
	struct uvd u;
	int la, lb;
	pid_t p;

	case_dir(&u);
	/* fd 3 is bound at VM 31's socket path; fd 4 elsewhere, named after VM 32's socket. */
	snprintf(a_path, sizeof(a_path), "%s/vm31.sock", u.dir);
	snprintf(b_bound, sizeof(b_bound), "%s/elsewhere.sock", u.dir);
	snprintf(names, sizeof(names), "LISTEN_FDNAMES=uvsockd.socket:vm32.sock");
	la = hs_listen(a_path, SOCK_STREAM);
	lb = hs_listen(b_bound, SOCK_STREAM);
	for (int i = 0; i < 2; i++)
		snprintf(vm[i], sizeof(vm[i]),
			 "guest-cid=%d,socket=%s/vm%d.sock,uds-path=%s/vm%d.vsock", 31 + i, u.dir,
			 31 + i, u.dir, 31 + i);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm[0], "--vm", vm[1],
				 "--control", "none", "--log-level=info", NULL };

		p = spawn_fds(u.log, argv, (const int[]){ la, lb }, 2, env, true);
	}
	close(la);
	close(lb);
	assert_served_inherited(p, u.log, (const char *[]){ a_path, b_bound },
				(const uint32_t[]){ 31, 32 }, 2, "socket-activated vhost-user socket");
	uvd_stop(&u);
}

TEST(socket_activation_refuses_an_unclaimed_socket)
{
	char path[160], vm[300];
	const char *env[] = { "LISTEN_FDS=1", "LISTEN_FDNAMES=nobody", NULL };
	struct uvd u;
	int l;

	case_dir(&u);
	snprintf(path, sizeof(path), "%s/other.sock", u.dir);
	l = hs_listen(path, SOCK_STREAM);
	snprintf(vm, sizeof(vm), "guest-cid=33,socket=%s/vm33.sock,uds-path=%s/vm33.vsock", u.dir,
		 u.dir);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm, NULL };

		ASSERT_EQ(wait_exit(spawn_env(u.log, argv, l, env, true), 5000), 1);
	}
	close(l);
	assert_log_has(u.log, "is no VM's socket");
	uvd_stop(&u);
}

/* The first log line of the daemon (it logs its version at start-up, at info). */
static void first_line(const char *log, char *buf, size_t len)
{
	FILE *f = fopen(log, "r");

	ASSERT_TRUE(f != NULL);
	ASSERT_TRUE(fgets(buf, (int)len, f) != NULL);
	fclose(f);
}

TEST(journald_prefixes_and_timestamps)
{
	static const uint32_t cids[] = { 41 };
	char js[64], line[512], vm[300];
	const char *env[] = { js, NULL };
	struct stat st;
	struct uvd u;
	pid_t p;
	int fd;

	/* Without JOURNAL_STREAM: a UTC timestamp, the tag, the level; the version, the control
	 * path. */
	uvd_start(&u, 1, cids, NULL, "--log-level=info");
	ASSERT_EQ(uvd_kill(&u), 0);
	first_line(u.log, line, sizeof(line));
	ASSERT_TRUE(strlen(line) > 25 && line[4] == '-' && line[10] == 'T' && line[23] == 'Z');
	ASSERT_TRUE(strstr(line, " uvsockd info: uvsockd " UVSOCK_VERSION_STR) != NULL);
	ASSERT_TRUE(strstr(line, "control socket ") != NULL && strstr(line, ".ctl") != NULL);

	/* JOURNAL_STREAM naming the log file: journald priorities instead. */
	ASSERT_OK(truncate(u.log, 0));
	fd = open(u.log, O_RDONLY | O_CLOEXEC);
	ASSERT_OK(fstat(fd, &st));
	close(fd);
	snprintf(js, sizeof(js), "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	snprintf(vm, sizeof(vm), "guest-cid=41,socket=%s,uds-path=%s", u.sock[0], u.uds[0]);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm, NULL };

		p = spawn_env(u.log, argv, -1, env, false);
	}
	ASSERT_WAIT_FOR(uds_probe(u.sock[0], SOCK_STREAM) == -EADDRINUSE, 5000);
	ASSERT_EQ(stop_pid(p), 0);
	first_line(u.log, line, sizeof(line));
	ASSERT_TRUE(strncmp(line, "<6>uvsockd info: uvsockd ", 25) == 0);
	assert_log_has(u.log, "<6>uvsockd info: signal 15");
	uvd_stop(&u);
}

TEST(socket_mode_and_group)
{
	char vm[400], sock[160], uds[160], seq[176], ctl[176], gid[16];
	struct group *gr = geteuid() == 0 ? getgrnam("nogroup") : NULL;
	gid_t want = gr ? gr->gr_gid : getegid();
	struct stat st;
	struct uvd u;
	pid_t p;

	case_dir(&u);
	snprintf(sock, sizeof(sock), "%s/vm51.sock", u.dir);
	snprintf(uds, sizeof(uds), "%s/vm51.vsock", u.dir);
	snprintf(seq, sizeof(seq), "%s_seqpacket", uds);
	snprintf(ctl, sizeof(ctl), "%s.ctl", sock);
	snprintf(vm, sizeof(vm), "guest-cid=51,socket=%s,uds-path=%s", sock, uds);
	snprintf(gid, sizeof(gid), "%u", (unsigned)want);
	{
		char *argv[] = { (char *)uvd_binary(), "--vm", vm, "--socket-mode=0660",
				 "--socket-group", gr ? "nogroup" : gid, NULL };

		p = spawn_env(u.log, argv, -1, NULL, false);
	}
	ASSERT_WAIT_FOR(uds_probe(ctl, SOCK_STREAM) == -EADDRINUSE, 5000);
	for (unsigned i = 0; i < 3; i++) {
		const char *path = i == 0 ? sock : i == 1 ? uds : seq;

		ASSERT_OK(lstat(path, &st));
		ASSERT_EQ(st.st_mode & 07777, 0660);
		ASSERT_EQ(st.st_gid, want);
	}
	/* The control socket stays the daemon's own (0600). */
	ASSERT_OK(lstat(ctl, &st));
	ASSERT_EQ(st.st_mode & 07777, 0600);
	ASSERT_EQ(stop_pid(p), 0);
	uvd_stop(&u);
}

/* ---- the shipped units --------------------------------------------------------------------- */

TEST(systemd_units_verify)
{
	char cmd[2048];
	struct uvd u;

	if (run_sh("command -v systemd-analyze >/dev/null") != 0)
		test_skip("systemd-analyze is not installed (Debian: systemd): the units are not "
			  "verified");
	case_dir(&u);
	/* ExecStart= and ExecReload= must name an existing binary: point them at the built one. */
	snprintf(cmd, sizeof(cmd),
		 "set -e; cd %s; "
		 "sed 's|^\\(Exec[A-Za-z]*=\\)[^ ]*/uvsockd |\\1%s |' %s/systemd/uvsockd.service > "
		 "uvsockd.service; "
		 "sed 's|^\\(Exec[A-Za-z]*=\\)[^ ]*/uvsockd |\\1%s |' %s/systemd/uvsockd@.service > "
		 "uvsockd@test.service; "
		 "systemd-analyze verify --man=no ./uvsockd.service ./uvsockd@test.service "
		 ">> uvsockd.log 2>&1",
		 u.dir, uvd_binary(), UVSOCK_BUILD_ROOT, uvd_binary(), UVSOCK_BUILD_ROOT);
	if (run_sh(cmd) != 0)
		test_fail(__FILE__, __LINE__, "systemd-analyze verify failed; see %s", u.log);
	uvd_stop(&u);
}

TEST_MAIN()
