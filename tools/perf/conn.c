/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf transports: the back-end (a uvsockd this program starts and stops by PID, or a
 * running one given by --socket/--uds-path), the guest context on it, the comparison listeners
 * (TCP loopback, Unix stream and seqpacket) and connection ends over all of them, so that every
 * measurement runs the same code over every transport. Main thread, except c_send/c_recv/
 * c_shutdown_wr, which the measurement threads call on their own ends.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "../common/hybrid.h"
#include "perf.h"

const char *const tr_name[T_MAX] = {
	[T_VSOCK_G2H] = "vsock-g2h",
	[T_VSOCK_H2G] = "vsock-h2g",
	[T_TCP] = "tcp",
	[T_TCP_NODELAY] = "tcp-nodelay",
	[T_UNIX] = "unix",
	[T_SHM] = "shm-ring",
	[T_VSOCK_SEQ_G2H] = "vsock-seqpacket-g2h",
	[T_VSOCK_SEQ_H2G] = "vsock-seqpacket-h2g",
	[T_UNIX_SEQ] = "unix-seqpacket",
	[T_INPROC_G2H] = "inproc-g2h",
	[T_INPROC_H2G] = "inproc-h2g",
};

/* ---- connection ends -------------------------------------------------------------------- */

ssize_t c_send(struct conn *c, const void *buf, size_t n)
{
	switch (c->kind) {
	case C_UV:
		return uvsock_send(c->fd, buf, n, 0);
	case C_SHM:
		return shm_send(c->tx, buf, n);
	case C_INPROC:
		return inproc_send(c->ip, buf, n);
	default:
		return send(c->fd, buf, n, MSG_NOSIGNAL);
	}
}

ssize_t c_recv(struct conn *c, void *buf, size_t n)
{
	switch (c->kind) {
	case C_UV:
		return uvsock_recv(c->fd, buf, n, 0);
	case C_SHM:
		return shm_recv(c->rx, buf, n);
	case C_INPROC:
		return inproc_recv(c->ip, buf, n);
	default:
		return read(c->fd, buf, n);
	}
}

void c_shutdown_wr(struct conn *c)
{
	switch (c->kind) {
	case C_UV:
		uvsock_shutdown(c->fd, SHUT_WR);
		break;
	case C_SHM:
		shm_close_wr(c->tx);
		break;
	case C_INPROC:
		inproc_close(c->ip);
		break;
	default:
		shutdown(c->fd, SHUT_WR);
		break;
	}
}

int c_set_rcvlowat(struct conn *c, int v)
{
	if (c->kind == C_UV)
		return uvsock_setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
	if (c->kind == C_FD)
		return setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v));
	return 0; /* the ring and the raw guest return whatever is there */
}

/* A receive timeout of ms on a socket end; -1 (ENOTSUP) for the ring and the raw guest. */
int c_set_rcvtimeo(struct conn *c, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (c->kind == C_UV)
		return uvsock_setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (c->kind == C_FD)
		return setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	errno = ENOTSUP;
	return -1;
}

void c_close(struct conn *c)
{
	switch (c->kind) {
	case C_UV:
		if (c->fd >= 0)
			uvsock_close(c->fd);
		break;
	case C_SHM:
		shm_free(c->tx); /* both ends hold both rings: the second close frees them */
		shm_free(c->rx);
		break;
	case C_INPROC:
		inproc_close(c->ip);
		break;
	default:
		if (c->fd >= 0)
			close(c->fd);
		break;
	}
	c->fd = -1;
	c->rx = c->tx = NULL;
}

/* ---- plain sockets ---------------------------------------------------------------------- */

/* A listener at path, or die. */
static int unix_listen(const char *path, int type)
{
	int fd = hybrid_listen(path, type);

	if (fd < 0)
		die("listen %s: %s", path, strerror(errno));
	return fd;
}

static void set_nodelay(int fd, int on)
{
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

static void fd_pair(int lfd, int cfd, struct conn *tx, struct conn *rx, const char *what)
{
	if (cfd < 0)
		die("%s connect: %s", what, strerror(errno));
	*tx = (struct conn){ .kind = C_FD, .fd = cfd };
	*rx = (struct conn){ .kind = C_FD, .fd = hybrid_accept(lfd, PERF_WAIT_MS) };
	if (rx->fd < 0)
		die("%s accept: %s", what, strerror(errno));
}

static int guest_connect(struct env *e, int type, unsigned port)
{
	struct sockaddr_vm va = { .svm_family = AF_VSOCK,
		                  .svm_cid = VMADDR_CID_HOST,
		                  .svm_port = port };
	int fd = uvsock_socket(e->g, type, 0);

	if (fd < 0 || uvsock_connect(fd, (struct sockaddr *)&va, sizeof(va)) < 0)
		die("guest connect to host port %u: %s", port, strerror(errno));
	return fd;
}

bool tr_available(const struct env *e, enum tr t)
{
	if (t == T_INPROC_G2H || t == T_INPROC_H2G)
		return e->ip != NULL;
	return true;
}

/* A connected pair: tx writes, rx reads (ping-pong uses both ends both ways). */
void pair_open(struct env *e, enum tr t, struct conn *tx, struct conn *rx)
{
	int fd;

	switch (t) {
	case T_VSOCK_G2H:
	case T_VSOCK_SEQ_G2H: {
		bool seq = t == T_VSOCK_SEQ_G2H;

		fd = guest_connect(e, seq ? SOCK_SEQPACKET : SOCK_STREAM,
		                   seq ? PERF_HOST_SEQ_PORT : PERF_HOST_PORT);
		*tx = (struct conn){ .kind = C_UV, .fd = fd, .seq = seq };
		*rx = (struct conn){ .kind = C_FD,
			             .seq = seq,
			             .fd = hybrid_accept(seq ? e->host_seq_lfd : e->host_lfd,
			                               PERF_WAIT_MS) };
		if (rx->fd < 0)
			die("host accept: %s", strerror(errno));
		break;
	}
	case T_VSOCK_H2G:
	case T_VSOCK_SEQ_H2G: {
		bool seq = t == T_VSOCK_SEQ_H2G;

		fd = hybrid_connect(e->uds, seq ? PERF_GUEST_SEQ_PORT : PERF_GUEST_PORT,
		                    seq ? SOCK_SEQPACKET : SOCK_STREAM, PERF_WAIT_MS);
		if (fd < 0)
			die("host connect to guest port: no OK from the back-end");
		*tx = (struct conn){ .kind = C_FD, .fd = fd, .seq = seq };
		fd = uvsock_accept(seq ? e->guest_seq_lfd : e->guest_lfd, NULL, NULL);
		if (fd < 0)
			die("guest accept: %s", strerror(errno));
		*rx = (struct conn){ .kind = C_UV, .fd = fd, .seq = seq };
		break;
	}
	case T_TCP:
	case T_TCP_NODELAY:
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 &&
		    connect(fd, (struct sockaddr *)&e->tcp_addr, sizeof(e->tcp_addr)) < 0) {
			close(fd);
			fd = -1;
		}
		fd_pair(e->tcp_lfd, fd, tx, rx, "tcp");
		set_nodelay(tx->fd, t == T_TCP_NODELAY);
		set_nodelay(rx->fd, t == T_TCP_NODELAY);
		break;
	case T_UNIX:
		fd_pair(e->unix_lfd, hybrid_unix_connect(e->unix_path, SOCK_STREAM), tx, rx, "unix");
		break;
	case T_UNIX_SEQ:
		fd_pair(e->unix_seq_lfd, hybrid_unix_connect(e->unix_seq_path, SOCK_SEQPACKET), tx, rx,
		        "unix seqpacket");
		tx->seq = rx->seq = true;
		break;
	case T_SHM:
		shm_pair(tx, rx);
		break;
	case T_INPROC_G2H:
	case T_INPROC_H2G:
		inproc_pair(e->ip, t == T_INPROC_G2H, tx, rx);
		break;
	default:
		die("transport %d", (int)t);
	}
}

/* ---- the back-end ----------------------------------------------------------------------- */

const char *find_uvsockd(const char *given, char *buf, size_t cap)
{
	char self[PATH_MAX];
	const char *env = getenv("UVSOCKD");
	ssize_t n;

	if (given)
		return given;
	if (env && *env)
		return env;
	/* In a build tree: <build>/tools/uvsock-perf next to <build>/daemon/uvsockd. */
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = 0;
		slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			snprintf(buf, cap, "%s/../daemon/uvsockd", self);
			if (access(buf, X_OK) == 0)
				return buf;
			snprintf(buf, cap, "%s/uvsockd", self);
			if (access(buf, X_OK) == 0)
				return buf;
		}
	}
	return "uvsockd"; /* $PATH */
}

/* True if `bin --help` prints `word` (how a uvsockd's options are probed). */
/* What `bin arg` prints (stdout and stderr, at most cap - 1 bytes), NUL-terminated. */
static void run_output(const char *bin, const char *arg, char *buf, size_t cap)
{
	size_t got = 0;
	int p[2], st;
	pid_t pid;

	buf[0] = 0;
	if (pipe2(p, O_CLOEXEC) < 0)
		return;
	pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		execlp(bin, bin, arg, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	while (pid > 0 && got + 1 < cap) {
		ssize_t r = read(p[0], buf + got, cap - 1 - got);

		if (r <= 0)
			break;
		got += (size_t)r;
	}
	buf[got] = 0;
	close(p[0]);
	if (pid > 0)
		waitpid(pid, &st, 0);
}

static bool help_has(const char *bin, const char *word)
{
	char buf[16384];

	run_output(bin, "--help", buf, sizeof(buf));
	return strstr(buf, word) != NULL;
}

/* The kind of build bin says it is in --version ("... (build: asan)"), or "unknown". */
static void backend_build(const char *bin, char *out, size_t cap)
{
	char buf[512], *b, *end;

	run_output(bin, "--version", buf, sizeof(buf));
	b = strstr(buf, "(build: ");
	end = b ? strchr(b, ')') : NULL;
	if (b && end)
		snprintf(out, cap, "%.*s", (int)(end - b - 8), b + 8);
	else
		snprintf(out, cap, "unknown (its --version does not say)");
}

/*
 * Starts bin with the given --vm arguments (NULL-terminated), the tune list as `--tune LIST`
 * when the binary has that option, else as UVSOCK_TUNE in its environment; stderr to log.
 * The child dies with this process (PR_SET_PDEATHSIG). Returns its PID.
 */
pid_t spawn_uvsockd(const char *bin, const char *tune, char *const *vm_args, const char *log)
{
	bool tune_opt = tune && *tune && help_has(bin, "--tune");
	pid_t parent = getpid(), pid;
	char *argv[300];
	int n = 0;

	argv[n++] = (char *)bin;
	for (int i = 0; vm_args[i] && n < 290; i++) {
		argv[n++] = "--vm";
		argv[n++] = vm_args[i];
	}
	argv[n++] = "--log-level=warn";
	if (tune_opt) {
		argv[n++] = "--tune";
		argv[n++] = (char *)tune;
	}
	argv[n] = NULL;
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0)
			dup2(fd, 2);
		if (tune && *tune && !tune_opt)
			setenv("UVSOCK_TUNE", tune, 1);
		else
			unsetenv("UVSOCK_TUNE");
		execvp(bin, argv);
		_exit(127);
	}
	return pid;
}

/* Waits until path exists (0), pid exited (-1, reaped) or ms passed (-2). */
int wait_socket(pid_t pid, const char *path, int ms)
{
	struct stat st;

	for (int i = 0; i < ms / 2; i++) {
		int status;

		if (stat(path, &st) == 0)
			return 0;
		if (waitpid(pid, &status, WNOHANG) == pid)
			return -1;
		usleep(2000);
	}
	return -2;
}

/* SIGTERM, up to 5 s, then SIGKILL; reaps. Only PIDs this program started. */
void stop_pid(pid_t pid)
{
	int st;

	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	for (int i = 0; i < 2500; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return;
		usleep(2000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
}

static void start_daemon(struct env *e)
{
	char bin_buf[PATH_MAX + 32], vm[512];
	const char *bin = find_uvsockd(e->o->uvsockd, bin_buf, sizeof(bin_buf));
	char *args[2] = { vm, NULL };
	int r;

	snprintf(e->dir, sizeof(e->dir), "/tmp/uvsock-perf-XXXXXX");
	if (!mkdtemp(e->dir)) {
		e->dir[0] = 0;
		die("mkdtemp: %s", strerror(errno));
	}
	snprintf(e->sock, sizeof(e->sock), "%s/vm3.sock", e->dir);
	snprintf(e->uds, sizeof(e->uds), "%s/vm3.vsock", e->dir);
	snprintf(e->logpath, sizeof(e->logpath), "%s/uvsockd.log", e->dir);
	snprintf(vm, sizeof(vm), "guest-cid=3,socket=%s,uds-path=%s", e->sock, e->uds);
	/* The per-VM connection cap as a key when this uvsockd has it (for the memory test). */
	e->max_conns_key = (e->o->tests & M_MEM) && help_has(bin, "max-conns");
	if (e->max_conns_key)
		snprintf(vm + strlen(vm), sizeof(vm) - strlen(vm), ",max-conns=%d",
		         e->o->idle_conns + 64);
	e->daemon = spawn_uvsockd(bin, e->tune_dev, args, e->logpath);
	r = wait_socket(e->daemon, e->sock, 5000);
	if (r == -1 && e->max_conns_key) {
		/* It printed max-conns but did not take it as a VM key: without it. */
		e->max_conns_key = false;
		*strstr(vm, ",max-conns=") = 0;
		e->daemon = spawn_uvsockd(bin, e->tune_dev, args, e->logpath);
		r = wait_socket(e->daemon, e->sock, 5000);
	}
	if (r < 0) {
		if (r == -1)
			e->daemon = 0;
		die("%s did not start (see --uvsockd and %s)", bin, e->logpath);
	}
	backend_build(bin, e->backend_build, sizeof(e->backend_build));
}

void env_setup(struct env *e)
{
	struct uvsock_guest_opts go = { .size = sizeof(go), .busy_poll_us = e->o->busy_poll_us };
	struct sockaddr_vm va = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY };
	socklen_t alen = sizeof(e->tcp_addr);
	int one = 1;

	e->host_lfd = e->host_seq_lfd = e->guest_lfd = e->guest_seq_lfd = -1;
	e->tcp_lfd = e->unix_lfd = e->unix_seq_lfd = -1;
	if (e->o->socket) {
		snprintf(e->sock, sizeof(e->sock), "%s", e->o->socket);
		snprintf(e->uds, sizeof(e->uds), "%s", e->o->uds);
		snprintf(e->backend_build, sizeof(e->backend_build),
		         "unknown (not started by uvsock-perf)");
	} else {
		start_daemon(e);
	}
	/* Whose CPU counts as the back-end's: the uvsockd started here, or --backend-pid. */
	e->cpu_pid = e->daemon > 0 ? e->daemon : e->o->backend_pid;
	e->g = uvsock_ctx_new_guest(e->sock, &go);
	if (!e->g)
		die("guest role on %s: %s", e->sock, strerror(errno));
	snprintf(e->host_lpath, sizeof(e->host_lpath), "%s_%u", e->uds, PERF_HOST_PORT);
	snprintf(e->host_seq_lpath, sizeof(e->host_seq_lpath), "%s_%u", e->uds, PERF_HOST_SEQ_PORT);
	e->host_lfd = unix_listen(e->host_lpath, SOCK_STREAM);
	e->host_seq_lfd = unix_listen(e->host_seq_lpath, SOCK_SEQPACKET);
	for (int i = 0; i < 2; i++) {
		int *lfd = i ? &e->guest_seq_lfd : &e->guest_lfd;

		va.svm_port = i ? PERF_GUEST_SEQ_PORT : PERF_GUEST_PORT;
		*lfd = uvsock_socket(e->g, i ? SOCK_SEQPACKET : SOCK_STREAM, 0);
		if (*lfd < 0 || uvsock_bind(*lfd, (struct sockaddr *)&va, sizeof(va)) < 0 ||
		    uvsock_listen(*lfd, 128) < 0) {
			if (i)
				break; /* a back-end without SEQPACKET: those tests are skipped */
			die("guest listen: %s", strerror(errno));
		}
	}
	e->tcp_lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	e->tcp_addr = (struct sockaddr_in){ .sin_family = AF_INET,
		                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	setsockopt(e->tcp_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (e->tcp_lfd < 0 || bind(e->tcp_lfd, (struct sockaddr *)&e->tcp_addr, alen) < 0 ||
	    listen(e->tcp_lfd, 128) < 0 ||
	    getsockname(e->tcp_lfd, (struct sockaddr *)&e->tcp_addr, &alen) < 0)
		die("tcp listen: %s", strerror(errno));
	snprintf(e->unix_path, sizeof(e->unix_path), "%s_unixbench", e->uds);
	snprintf(e->unix_seq_path, sizeof(e->unix_seq_path), "%s_unixseqbench", e->uds);
	e->unix_lfd = unix_listen(e->unix_path, SOCK_STREAM);
	e->unix_seq_lfd = unix_listen(e->unix_seq_path, SOCK_SEQPACKET);
	if (e->o->tests & M_INPROC)
		e->ip = inproc_new();
}

static void close_unlink(int *fd, char *path)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	if (path[0])
		unlink(path);
	path[0] = 0;
}

/* Undoes env_setup; safe on a partly set-up env (die() calls it). */
void env_teardown(struct env *e)
{
	inproc_free(e->ip);
	e->ip = NULL;
	if (e->guest_lfd >= 0)
		uvsock_close(e->guest_lfd);
	if (e->guest_seq_lfd >= 0)
		uvsock_close(e->guest_seq_lfd);
	e->guest_lfd = e->guest_seq_lfd = -1;
	uvsock_ctx_free(e->g);
	e->g = NULL;
	close_unlink(&e->host_lfd, e->host_lpath);
	close_unlink(&e->host_seq_lfd, e->host_seq_lpath);
	close_unlink(&e->unix_lfd, e->unix_path);
	close_unlink(&e->unix_seq_lfd, e->unix_seq_path);
	if (e->tcp_lfd >= 0)
		close(e->tcp_lfd);
	e->tcp_lfd = -1;
	stop_pid(e->daemon);
	e->daemon = 0;
	if (e->dir[0]) {
		unlink(e->logpath);
		rmdir(e->dir);
		e->dir[0] = 0;
	}
}
