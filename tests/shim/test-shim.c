/* SPDX-License-Identifier: MIT */
/*
 * Unmodified AF_VSOCK host programs over uvsockd (suite 'shim', docs/shim.md): Debian's socat
 * (VSOCK-CONNECT, VSOCK-LISTEN) and ncat --vsock, and shim-prog (names, errno, options,
 * non-blocking connect, 100 threads, fork and exec after connect) run through uvsock-run
 * against a guest-role VM of a uvsockd started here; the guest side is the uvsock API in this
 * process. And the seccomp filter of uvsock-run, proved with a harmless address family on a
 * static program.
 *
 * SAFETY: every host program runs through uvsock-run (its filter refuses the kernel's AF_VSOCK);
 * shim-prog refuses to start otherwise; nothing here creates an AF_VSOCK socket of the kernel.
 * Child processes die with their test case (PR_SET_PDEATHSIG) and are killed by PID.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "guestside.h"
#include "manpage.h"
#include "uvsockd-proc.h"

#define CID 3u
#define PROC_OUT_MAX (64 * 1024)
#define SETPRIV "/usr/bin/setpriv"

/* ---- host programs -------------------------------------------------------------------------- */

struct proc {
	pid_t pid;
	int in, out;           /* its stdin (write end), its stdout + stderr (read end) */
	char buf[PROC_OUT_MAX];
	size_t len;
};

static void proc_start_opt(struct proc *p, const struct uvd *u, bool raw, const char *opt,
			   char *const *argv);

/* Starts argv (through uvsock-run unless raw) with UVSOCK_CONTROL pointing at u's daemon. */
static void proc_start(struct proc *p, const struct uvd *u, bool raw, char *const *argv)
{
	proc_start_opt(p, u, raw, NULL, argv);
}

/* proc_start with one more uvsock-run option (e.g. "--listen-vm=4"), or none (NULL). */
static void proc_start_opt(struct proc *p, const struct uvd *u, bool raw, const char *opt,
			   char *const *argv)
{
	char *full[32];
	int in[2], out[2], n = 0;
	pid_t parent = getpid();

	memset(p, 0, sizeof(*p));
	if (!raw) {
		full[n++] = (char *)UVSOCK_RUN_PATH;
		full[n++] = (char *)"--control";
		full[n++] = (char *)u->sock[0];
		if (opt)
			full[n++] = (char *)opt;
	}
	for (int i = 0; argv[i] && n < 31; i++)
		full[n++] = argv[i];
	full[n] = NULL;
	ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);
	ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
	p->pid = fork();
	ASSERT_GE(p->pid, 0);
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(out[1], 2);
		setenv("UVSOCK_PRELOAD", PRELOAD_PATH, 1);
#ifdef SHIM_ASAN_RT
		/* Before the (ASan-built) preload library; socat's own leaks are not ours. */
		setenv("LD_PRELOAD", SHIM_ASAN_RT, 1);
		setenv("ASAN_OPTIONS", "detect_leaks=0:verify_asan_link_order=0", 1);
#endif
		execv(full[0], full);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	p->in = in[1];
	p->out = out[0];
	fcntl(p->out, F_SETFL, O_NONBLOCK);
}

/* Reads what is there into p->buf; waits at most ms for more. False at EOF. */
static bool proc_pump(struct proc *p, int ms)
{
	struct pollfd pf = { .fd = p->out, .events = POLLIN };
	ssize_t n;

	if (p->out < 0 || poll(&pf, 1, ms) <= 0)
		return p->out >= 0;
	n = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
	if (n <= 0) {
		close(p->out);
		p->out = -1;
		return false;
	}
	p->len += (size_t)n;
	p->buf[p->len] = '\0';
	return true;
}

/* The output as TAP comments, line by line. */
static void note_output(const struct proc *p)
{
	for (const char *s = p->buf; *s;) {
		const char *nl = strchr(s, '\n');
		int n = nl ? (int)(nl - s) : (int)strlen(s);

		test_note("| %.*s", n, s);
		s += n + (nl ? 1 : 0);
	}
}

/* Waits until the output holds s (within 10 s); fails the case with the output otherwise. */
static void proc_expect(struct proc *p, const char *s)
{
	uint64_t end = test_now_ms() + 10000;

	while (!strstr(p->buf, s) && test_now_ms() < end)
		if (!proc_pump(p, 100) && !strstr(p->buf, s))
			break;
	if (!strstr(p->buf, s)) {
		note_output(p);
		test_fail(__FILE__, __LINE__, "no '%s' in the output of pid %d (above)", s,
			  (int)p->pid);
	}
}

static void proc_write(struct proc *p, const char *s)
{
	ASSERT_EQ(write(p->in, s, strlen(s)), (ssize_t)strlen(s));
}

static void proc_close_in(struct proc *p)
{
	if (p->in >= 0)
		close(p->in);
	p->in = -1;
}

/* Reads to EOF and reaps it within 10 s (else SIGKILL by PID); returns the exit status. */
static int proc_wait(struct proc *p)
{
	uint64_t end = test_now_ms() + 10000;
	int st = 0;

	proc_close_in(p);
	while (proc_pump(p, 100) && test_now_ms() < end)
		;
	while (waitpid(p->pid, &st, WNOHANG) == 0) {
		if (test_now_ms() >= end) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &st, 0);
			test_note("pid %d killed after 10 s", (int)p->pid);
			note_output(p);
			break;
		}
		test_sleep_ms(10);
	}
	if (p->out >= 0)
		close(p->out);
	p->out = -1;
	p->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* True if a line of buf holds a, and b after it. */
static bool line_has(const char *buf, const char *a, const char *b)
{
	for (const char *s = strstr(buf, a); s; s = strstr(s + 1, a)) {
		const char *nl = strchr(s, '\n'), *t = strstr(s, b);

		if (t && (!nl || t < nl))
			return true;
	}
	return false;
}

/* ---- the guest: an echo server on the uvsock API ------------------------------------------ */

struct echo {
	int lfd, type;
	pthread_t th;
	int served;
};

/* Each connection: everything until EOF (stream) or one message (seqpacket), sent back. */
static void *echo_main(void *arg)
{
	struct echo *e = arg;

	for (;;) {
		char buf[8192];
		size_t len = 0;
		int c = uvsock_accept(e->lfd, NULL, NULL);

		if (c < 0)
			break;
		g_set_timeouts(c, 5000);
		for (;;) {
			ssize_t n = uvsock_recv(c, buf + len, sizeof(buf) - len, 0);

			if (n <= 0)
				break;
			len += (size_t)n;
			if (e->type == SOCK_SEQPACKET || len == sizeof(buf))
				break;
		}
		if (len)
			(void)uvsock_send(c, buf, len, 0);
		uvsock_close(c);
		e->served++;
	}
	return NULL;
}

static void echo_start(struct echo *e, struct uvsock_ctx *ctx, int type, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);

	e->type = type;
	e->served = 0;
	e->lfd = uvsock_socket(ctx, type, 0);
	ASSERT_GE(e->lfd, 0);
	ASSERT_EQ(uvsock_bind(e->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(uvsock_listen(e->lfd, 256), 0);
	ASSERT_EQ(pthread_create(&e->th, NULL, echo_main, e), 0);
}

static void echo_stop(struct echo *e)
{
	uvsock_close(e->lfd); /* wakes the blocked accept */
	pthread_join(e->th, NULL);
}

struct env {
	struct uvd u;
	struct uvsock_ctx *ctx;
};

static void env_start(struct env *v)
{
	uint32_t cid = CID;

	uvd_start(&v->u, 1, &cid, NULL, NULL);
	v->ctx = g_guest_new(v->u.sock[0], NULL);
}

static void env_stop(struct env *v)
{
	uvsock_ctx_free(v->ctx);
	ASSERT_EQ(uvd_stop(&v->u), 0);
}

/* The guest connects to host port `port` and sends msg, half-closes, returns what comes back. */
static void guest_call(struct env *v, int type, uint32_t port, const char *msg, char *out,
		       size_t cap)
{
	size_t len = 0;
	int fd = -1;

	/* The host program may not be listening yet: its socket file says when it is. */
	for (int i = 0; i < 100 && fd < 0; i++) {
		fd = g_connect(v->ctx, type, VMADDR_CID_HOST, port);
		if (fd < 0)
			test_sleep_ms(50);
	}
	ASSERT_GE(fd, 0);
	g_set_timeouts(fd, 5000);
	ASSERT_EQ(uvsock_send(fd, msg, strlen(msg), 0), (ssize_t)strlen(msg));
	if (type == SOCK_STREAM)
		ASSERT_EQ(uvsock_shutdown(fd, SHUT_WR), 0);
	for (;;) {
		ssize_t n = uvsock_recv(fd, out + len, cap - 1 - len, 0);

		if (n <= 0)
			break;
		len += (size_t)n;
		if (type == SOCK_SEQPACKET)
			break;
	}
	out[len] = '\0';
	uvsock_close(fd);
}

static void wait_listening(struct env *v, uint32_t port)
{
	char path[200];
	struct stat st;

	snprintf(path, sizeof(path), "%s_%u", v->u.uds[0], port);
	ASSERT_WAIT_FOR(stat(path, &st) == 0 && S_ISSOCK(st.st_mode), 10000);
}

/* ---- the seccomp filter ------------------------------------------------------------------- */

TEST(filter_refuses_a_static_program_with_the_test_family)
{
#ifndef SHIM_STATIC_PATH
	test_skip("no static program in a sanitizer build (the plain build runs this case)");
#else
	struct env v = { 0 };
	struct proc p;

	/* Unfiltered, AF_NETLINK works here (else the refusal below would prove nothing). */
	proc_start(&p, &v.u, true, (char *[]){ SHIM_STATIC_PATH, "16", "1", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	ASSERT_TRUE(strstr(p.buf, "family 16: ok") != NULL);
	setenv("UVSOCK_RUN_TEST_BLOCK_FAMILY", "16", 1);
	proc_start(&p, &v.u, false, (char *[]){ "-v", SHIM_STATIC_PATH, "16", "1", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	unsetenv("UVSOCK_RUN_TEST_BLOCK_FAMILY");
	note_output(&p);
	ASSERT_TRUE(strstr(p.buf, "family 16: refused: Address family not supported by protocol "
				  "(errno 97)") != NULL);
	ASSERT_TRUE(strstr(p.buf, "family 1: ok") != NULL);
	ASSERT_TRUE(strstr(p.buf, "seccomp filter installed") != NULL);
#endif
}

/*
 * An io_uring made before uvsock-run, left to the program: its IORING_OP_SOCKET is a socket
 * the filter never sees. uvsock-run closes inherited rings, and the filter refuses
 * io_uring_enter for a ring that arrives later (pidfd_getfd() from a process that kept it; an
 * io_uring fd cannot travel in SCM_RIGHTS).
 */
TEST(filter_refuses_an_inherited_io_uring)
{
#ifndef SHIM_STATIC_PATH
	test_skip("no static program in a sanitizer build (the plain build runs this case)");
#else
	static const char *const how[] = { "inherit", "getfd" };
	struct env v = { 0 };
	struct proc p;

	for (int i = 0; i < 2; i++) {
		/* Unfiltered, the ring's socket op works here (else nothing below is proved). */
		proc_start(&p, &v.u, true, (char *[]){ SHIM_STATIC_PATH, "ring-exec",
							(char *)how[i], "16", SHIM_STATIC_PATH,
							"ring", "16", NULL });
		ASSERT_EQ(proc_wait(&p), 0);
		note_output(&p);
		if (strstr(p.buf, "no io_uring here"))
			test_skip("io_uring is not available on this kernel");
		if (i == 1 && !strstr(p.buf, "ring family 16: ok")) {
			test_note("pidfd_getfd() not allowed here: the io_uring_enter case is skipped");
			break;
		}
		ASSERT_TRUE(strstr(p.buf, "ring family 16: ok") != NULL);
		setenv("UVSOCK_RUN_TEST_BLOCK_FAMILY", "16", 1);
		proc_start(&p, &v.u, true, (char *[]){ SHIM_STATIC_PATH, "ring-exec",
							(char *)how[i], "16", UVSOCK_RUN_PATH,
							"-v", SHIM_STATIC_PATH, "ring", "16",
							NULL });
		ASSERT_EQ(proc_wait(&p), 0);
		unsetenv("UVSOCK_RUN_TEST_BLOCK_FAMILY");
		note_output(&p);
		ASSERT_TRUE(strstr(p.buf, "seccomp filter installed") != NULL);
		ASSERT_TRUE(strstr(p.buf, "ring family 16: refused: ") != NULL);
		ASSERT_TRUE(strstr(p.buf, i == 0 ? "(errno 9)" : "(errno 38)") != NULL);
	}
#endif
}

TEST(uvsock_run_usage_and_man_page)
{
	struct env v = { 0 };
	struct proc p;

	proc_start(&p, &v.u, true, (char *[]){ UVSOCK_RUN_PATH, "--help", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	man_check_help_documented(p.buf, "uvsock-run", MAN_DIR "/uvsock-run.1", false, 3);
	proc_start(&p, &v.u, true, (char *[]){ UVSOCK_RUN_PATH, NULL });
	ASSERT_EQ(proc_wait(&p), 2);
	proc_start(&p, &v.u, true, (char *[]){ UVSOCK_RUN_PATH, "/nonexistent/program", NULL });
	ASSERT_EQ(proc_wait(&p), 127);
}

/* ---- socat and ncat ----------------------------------------------------------------------- */

TEST(socat_vsock_connect_stream_half_close)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5000);
	proc_start(&p, &v.u, false, (char *[]){ "socat", "-t", "5", "-", "VSOCK-CONNECT:3:5000",
						NULL });
	proc_write(&p, "hello from the host\n");
	proc_close_in(&p); /* socat half-closes; the echo comes back after the guest saw EOF */
	proc_expect(&p, "hello from the host");
	ASSERT_EQ(proc_wait(&p), 0);
	echo_stop(&e);
	ASSERT_EQ(e.served, 1);
	env_stop(&v);
}

TEST(socat_vsock_connect_seqpacket)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_SEQPACKET, 5001);
	proc_start(&p, &v.u, false, (char *[]){ "socat", "-t", "5", "-",
						"VSOCK-CONNECT:3:5001,socktype=5", NULL });
	proc_write(&p, "one message");
	proc_expect(&p, "one message");
	ASSERT_EQ(proc_wait(&p), 0);
	echo_stop(&e);
	env_stop(&v);
}

TEST(socat_vsock_connect_refused)
{
	struct env v;
	struct proc p;

	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ "socat", "-", "VSOCK-CONNECT:3:5999", NULL });
	ASSERT_NE(proc_wait(&p), 0);
	ASSERT_TRUE(strstr(p.buf, "Connection reset by peer") != NULL);
	env_stop(&v);
}

/*
 * Runs socat's VSOCK-CONNECT to 3:5999 through uvsock-run (with --control u's socket unless
 * raw), which must fail: the output must hold `why`, and socat's connect ENETUNREACH.
 */
static void socat_unreachable(const struct uvd *u, bool raw, const char *why)
{
	struct proc p;

	if (raw)
		proc_start(&p, u, true, (char *[]){ UVSOCK_RUN_PATH, "socat", "-",
						    "VSOCK-CONNECT:3:5999", NULL });
	else
		proc_start(&p, u, false, (char *[]){ "socat", "-", "VSOCK-CONNECT:3:5999", NULL });
	ASSERT_NE(proc_wait(&p), 0);
	note_output(&p);
	if (!strstr(p.buf, why))
		test_fail(__FILE__, __LINE__, "no '%s' in the output (above)", why);
	ASSERT_TRUE(line_has(p.buf, "E connect(", "Network is unreachable"));
}

TEST(socat_without_a_daemon_is_told_why)
{
	struct uvd none = { .pid = -1 };

	/* No uvsockd at the control socket: one line naming it and the cause, then socat's own
	 * "Network is unreachable" for the connect. */
	snprintf(none.sock[0], sizeof(none.sock[0]), "/nonexistent/uvsock-test/control.sock");
	socat_unreachable(&none, false, "uvsock-run: cannot ask uvsockd for its VMs at "
					"/nonexistent/uvsock-test/control.sock: no such socket: is "
					"uvsockd running");
}

/*
 * Where uvsock-run looks without --control: $UVSOCK_CONTROL, else /run/uvsockd/control.sock
 * (docs/operations.md, "The control socket"); and a socket file nobody listens on (a daemon
 * that is gone) named as such. Each is named on stderr, and socat's connect fails
 * ENETUNREACH (no daemon).
 */
TEST(uvsock_run_control_socket_rule_and_causes)
{
	struct uvd none = { .pid = -1 };
	char dir[] = "/tmp/uvsock-shim-rule-XXXXXX", stale[200];

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	/* $UVSOCK_CONTROL, no --control. */
	setenv("UVSOCK_CONTROL", "/nonexistent/uvsock-env/control.sock", 1);
	socat_unreachable(&none, true, "uvsock-run: cannot ask uvsockd for its VMs at "
				       "/nonexistent/uvsock-env/control.sock: no such socket");

	/* Neither: the packaged default. */
	unsetenv("UVSOCK_CONTROL");
	if (access("/run/uvsockd/control.sock", F_OK) == 0)
		test_note("a uvsockd serves /run/uvsockd/control.sock here: default not tried");
	else
		socat_unreachable(&none, true, "uvsock-run: cannot ask uvsockd for its VMs at "
					       "/run/uvsockd/control.sock: no such socket");

	/* A socket file left by a daemon that is gone: ECONNREFUSED, named as such. */
	snprintf(stale, sizeof(stale), "%s/gone.ctl", dir);
	close(hs_listen(stale, SOCK_STREAM));
	snprintf(none.sock[0], sizeof(none.sock[0]), "%s", stale);
	socat_unreachable(&none, false, "nobody listens there: a socket file left by a uvsockd "
					"that is gone");
	unlink(stale);
	rmdir(dir);
}

/*
 * A user other than the daemon's (uid 65534 here, through setpriv) cannot open the daemon's 0600
 * control socket: uvsock-run says permission denied naming the control socket, and socat's
 * connect fails with EACCES, not "Network is unreachable" (no daemon). Both with --control
 * naming the control socket and with a VM's socket (the control socket found next to it). The
 * directory is open to everyone so the EACCES is the socket's own.
 */
TEST(socat_of_another_user_is_told_permission_denied)
{
	char ctl[200];
	const char *paths[2];
	struct env v;

	if (geteuid() != 0)
		test_skip("running as another user needs root");
	if (access(SETPRIV, X_OK) != 0)
		test_skip(SETPRIV " is not installed");
	env_start(&v);
	ASSERT_EQ(chmod(v.u.dir, 0755), 0);
	snprintf(ctl, sizeof(ctl), "%s.ctl", v.u.sock[0]);
	paths[0] = ctl;
	paths[1] = v.u.sock[0];
	for (int i = 0; i < 2; i++) {
		struct proc p;
		char want[300];

		test_note("uvsock-run --control %s, as uid 65534", paths[i]);
		proc_start(&p, &v.u, true,
			   (char *[]){ SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups",
				       UVSOCK_RUN_PATH, "--control", (char *)paths[i], "socat", "-",
				       "VSOCK-CONNECT:3:5999", NULL });
		ASSERT_NE(proc_wait(&p), 0);
		note_output(&p);
		snprintf(want, sizeof(want), "uvsock-run: cannot ask uvsockd for its VMs at %s: "
			 "permission denied", ctl);
		ASSERT_TRUE(strstr(p.buf, want) != NULL);
		ASSERT_TRUE(line_has(p.buf, "E connect(", "Permission denied"));
		ASSERT_TRUE(strstr(p.buf, "Network is unreachable") == NULL);
	}
	env_stop(&v);
}

TEST(socat_vsock_listen_both_directions)
{
	struct env v;
	struct proc p;
	char got[256];

	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ "socat", "-t", "5", "VSOCK-LISTEN:6000", "-",
						NULL });
	wait_listening(&v, 6000);
	proc_write(&p, "pong from the host");
	proc_close_in(&p);
	guest_call(&v, SOCK_STREAM, 6000, "ping from the guest\n", got, sizeof(got));
	ASSERT_STREQ(got, "pong from the host");
	proc_expect(&p, "ping from the guest");
	ASSERT_EQ(proc_wait(&p), 0);
	env_stop(&v);
}

TEST(socat_vsock_listen_seqpacket)
{
	struct env v;
	struct proc p;
	char got[256];

	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ "socat", "-t", "5", "VSOCK-LISTEN:6001,socktype=5",
						"-", NULL });
	wait_listening(&v, 6001);
	proc_write(&p, "host message");
	guest_call(&v, SOCK_SEQPACKET, 6001, "guest message", got, sizeof(got));
	ASSERT_STREQ(got, "host message");
	proc_expect(&p, "guest message");
	proc_close_in(&p);
	(void)proc_wait(&p);
	env_stop(&v);
}

TEST(ncat_vsock_connect_and_listen)
{
	struct env v;
	struct echo e;
	struct proc p;
	char got[256];

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5002);
	proc_start(&p, &v.u, false, (char *[]){ "ncat", "--vsock", "3", "5002", NULL });
	proc_write(&p, "ncat to the guest\n");
	proc_close_in(&p);
	proc_expect(&p, "ncat to the guest");
	ASSERT_EQ(proc_wait(&p), 0);
	echo_stop(&e);

	proc_start(&p, &v.u, false, (char *[]){ "ncat", "--vsock", "-l", "6002", NULL });
	wait_listening(&v, 6002);
	proc_write(&p, "ncat to the guest\n");
	proc_close_in(&p);
	guest_call(&v, SOCK_STREAM, 6002, "guest to ncat\n", got, sizeof(got));
	ASSERT_STREQ(got, "ncat to the guest\n");
	proc_expect(&p, "guest to ncat");
	ASSERT_EQ(proc_wait(&p), 0);
	env_stop(&v);
}

/* ---- shim-prog: the calls one by one ------------------------------------------------------ */

TEST(connect_names_and_echo)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5003);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "client", "3", "5003", "stream",
						"abc", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	note_output(&p);
	ASSERT_TRUE(strstr(p.buf, "local 2 ") != NULL);
	ASSERT_TRUE(strstr(p.buf, " peer 3 5003") != NULL);
	ASSERT_TRUE(strstr(p.buf, "got abc") != NULL);
	echo_stop(&e);
	env_stop(&v);
}

TEST(listen_accept_knows_the_guest_address)
{
	struct env v;
	struct proc p;
	struct sockaddr_vm me;
	socklen_t ml = sizeof(me);
	char got[64], want[96];
	int fd, st;

	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "serve", "6003", "stream", "2",
						NULL });
	proc_expect(&p, "listening");
	guest_call(&v, SOCK_STREAM, 6003, "first", got, sizeof(got));
	ASSERT_STREQ(got, "first");
	/* The second time, the guest's own port is known here, to compare. */
	fd = g_connect(v.ctx, SOCK_STREAM, VMADDR_CID_HOST, 6003);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(uvsock_getsockname(fd, (struct sockaddr *)&me, &ml), 0);
	snprintf(want, sizeof(want), "accepted 3 %u\nlocal 2 6003 peer 3 %u", me.svm_port,
		 me.svm_port);
	ASSERT_EQ(uvsock_send(fd, "x", 1, 0), 1);
	ASSERT_EQ(uvsock_shutdown(fd, SHUT_WR), 0);
	proc_expect(&p, want);
	g_set_timeouts(fd, 5000);
	ASSERT_EQ(uvsock_recv(fd, got, sizeof(got), 0), 1);
	uvsock_close(fd);
	st = proc_wait(&p);
	note_output(&p);
	ASSERT_EQ(st, 0);
	env_stop(&v);
}

/*
 * A local program of another user connects to the listener with the abstract name uvsockd
 * would use ("uvsock-peer PID CID PORT HOSTPORT", its own PID, so SO_PEERCRED's PID matches):
 * the accepted peer's port must read VMADDR_PORT_ANY, not the forged 80. A connection from the
 * guest, through uvsockd, still gets its real port.
 */
TEST(forged_peer_name_from_another_user_reads_port_any)
{
	struct env v;
	struct proc p;
	char path[200], got[64];
	const char *real;
	pid_t pid;
	int st = 0;

	if (geteuid() != 0)
		test_skip("connecting as another user needs root");
	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "serve", "6020", "stream", "2",
						NULL });
	proc_expect(&p, "listening");
	wait_listening(&v, 6020);
	/* The listener reachable by every user: the attack needs nothing more. */
	snprintf(path, sizeof(path), "%s_6020", v.u.uds[0]);
	ASSERT_EQ(chmod(v.u.dir, 0711), 0);
	ASSERT_EQ(chmod(path, 0777), 0);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct sockaddr_un me = { .sun_family = AF_UNIX }, to = { .sun_family = AF_UNIX };
		socklen_t ml;
		char buf[64];
		int fd;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ml = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
				 (size_t)snprintf(me.sun_path + 1, sizeof(me.sun_path) - 1,
						  "uvsock-peer %d 3 80 6020", (int)getpid()));
		snprintf(to.sun_path, sizeof(to.sun_path), "%.*s", (int)sizeof(to.sun_path) - 1, path);
		if (fd < 0 || bind(fd, (struct sockaddr *)&me, ml) < 0)
			_exit(11);
		if (connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0)
			_exit(12);
		if (write(fd, "forged", 6) != 6 || shutdown(fd, SHUT_WR) < 0)
			_exit(13);
		while (read(fd, buf, sizeof(buf)) > 0)
			;
		_exit(0);
	}
	if (!WAIT_FOR(waitpid(pid, &st, WNOHANG) == pid, 10000)) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	proc_expect(&p, "got forged");
	note_output(&p);
	ASSERT_TRUE(strstr(p.buf, "accepted 3 4294967295\n") != NULL);
	ASSERT_TRUE(strstr(p.buf, "accepted 3 80\n") == NULL);
	/* The daemon's own name is still believed. */
	guest_call(&v, SOCK_STREAM, 6020, "real", got, sizeof(got));
	ASSERT_STREQ(got, "real");
	ASSERT_EQ(proc_wait(&p), 0);
	note_output(&p);
	real = strstr(p.buf, "got forged");
	real = real ? strstr(real, "accepted 3 ") : NULL;
	ASSERT_TRUE(real != NULL && strncmp(real, "accepted 3 4294967295", 21) != 0);
	env_stop(&v);
}

/* One listener over two VMs (an epoll fd over two Unix listeners), then one VM only. */
TEST(listen_on_every_vm_or_the_one_named)
{
	uint32_t cids[2] = { 3, 4 };
	struct uvsock_ctx *g3, *g4;
	struct env v;
	struct proc p;
	char got[64], path[200];
	struct stat st;

	uvd_start(&v.u, 2, cids, NULL, NULL);
	g3 = v.ctx = g_guest_new(v.u.sock[0], NULL);
	g4 = g_guest_new(v.u.sock[1], NULL);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "serve", "6010", "stream", "2",
						NULL });
	proc_expect(&p, "listening");
	guest_call(&v, SOCK_STREAM, 6010, "from 3", got, sizeof(got));
	ASSERT_STREQ(got, "from 3");
	proc_expect(&p, "accepted 3 ");
	v.ctx = g4;
	guest_call(&v, SOCK_STREAM, 6010, "from 4", got, sizeof(got));
	v.ctx = g3;
	ASSERT_STREQ(got, "from 4");
	proc_expect(&p, "accepted 4 ");
	ASSERT_EQ(proc_wait(&p), 0);
	/* The socket files went with the listener. */
	snprintf(path, sizeof(path), "%s_6010", v.u.uds[1]);
	ASSERT_NE(stat(path, &st), 0);

	proc_start_opt(&p, &v.u, false, "--listen-vm=4",
		       (char *[]){ SHIM_PROG_PATH, "serve", "6011", "stream", "1", NULL });
	proc_expect(&p, "listening");
	snprintf(path, sizeof(path), "%s_6011", v.u.uds[0]);
	ASSERT_NE(stat(path, &st), 0);
	ASSERT_LT(g_connect(v.ctx, SOCK_STREAM, VMADDR_CID_HOST, 6011), 0); /* VM 3: refused */
	v.ctx = g4;
	guest_call(&v, SOCK_STREAM, 6011, "only 4", got, sizeof(got));
	ASSERT_STREQ(got, "only 4");
	proc_expect(&p, "accepted 4 ");
	ASSERT_EQ(proc_wait(&p), 0);
	uvsock_ctx_free(g4);
	uvsock_ctx_free(g3);
	ASSERT_EQ(uvd_stop(&v.u), 0);
}

TEST(errno_options_and_dev_vsock)
{
	struct env v;
	struct proc p;

	env_start(&v);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "errors", "3", "5999", NULL });
	int st = proc_wait(&p);

	note_output(&p);
	ASSERT_EQ(st, 0);
	ASSERT_TRUE(strstr(p.buf, "ok refused connect") && strstr(p.buf, "ok unknown cid"));
	ASSERT_TRUE(strstr(p.buf, "local cid 2") != NULL);
	env_stop(&v);
}

TEST(nonblocking_connect_and_connect_timeout)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5004);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "nonblock", "3", "5004", "5999",
						NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	note_output(&p);
	ASSERT_TRUE(strstr(p.buf, "so_error 0\nso_error Connection reset by peer") != NULL);
	ASSERT_TRUE(strstr(p.buf, "ok timed out") != NULL);
	echo_stop(&e);
	env_stop(&v);
}

TEST(hundred_connections_from_threads)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5005);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "threads", "3", "5005", "100",
						NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	ASSERT_TRUE(strstr(p.buf, "echoed 100 of 100") != NULL);
	echo_stop(&e);
	ASSERT_EQ(e.served, 100);
	env_stop(&v);
}

TEST(fork_after_connect)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5006);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "fork", "3", "5006", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	ASSERT_TRUE(strstr(p.buf, "got child;parent") != NULL);
	echo_stop(&e);
	env_stop(&v);
}

TEST(exec_after_connect_keeps_the_names)
{
	struct env v;
	struct echo e;
	struct proc p;

	env_start(&v);
	echo_start(&e, v.ctx, SOCK_STREAM, 5007);
	proc_start(&p, &v.u, false, (char *[]){ SHIM_PROG_PATH, "exec", "3", "5007", NULL });
	ASSERT_EQ(proc_wait(&p), 0);
	note_output(&p);
	ASSERT_TRUE(strstr(p.buf, " peer 3 5007") != NULL);
	ASSERT_TRUE(strstr(p.buf, "got exec'd") != NULL);
	echo_stop(&e);
	env_stop(&v);
}

TEST_MAIN()
