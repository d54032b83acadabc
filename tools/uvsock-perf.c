/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf: guest-less benchmark of a vhost-user vsock back-end. A userspace guest driver
 * (the guest role, uvsock_ctx_new_guest) drives the back-end through real shared-memory
 * virtqueues, and this program plays the host application on the back-end's hybrid Unix-socket
 * side. It measures, for each write size:
 *
 *   vsock g->h   guest app --uvsock_send--> rings --> back-end --> Unix socket --> host app
 *   vsock h->g   host app --> Unix socket --> back-end --> rings --> guest app (uvsock_recv)
 *   tcp          TCP loopback (TCP_NODELAY), both ends in this process
 *   unix         Unix stream socket, both ends in this process
 *
 * with the same method for all four: a writer thread sends `bytes` in writes of `size`, the
 * reader (main thread) reads in 128 KiB reads; the time runs from the start signal to the last
 * byte read. Each point is run N times on a fresh connection; the median is reported. Units:
 * Gbit/s (10^9 bits per second) of payload, and CPU seconds per GB (10^9 bytes) moved:
 * getrusage(RUSAGE_SELF) of this process (guest and host applications and the guest driver
 * thread) plus, when this program started the back-end, the back-end's utime+stime from
 * /proc/<pid>/stat. Latency: 64-byte ping-pong round trips (guest -> host -> guest for vsock),
 * median and 99th percentile in microseconds.
 *
 * By default it starts uvsockd (found as --uvsockd, $UVSOCKD, next to this program in a build
 * tree, or in $PATH) with one VM in a temporary directory and stops it by PID at the end. With
 * --socket PATH --uds-path PATH it uses a running back-end (uvsockd, vhost-device-vsock...).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "util/time.h"

#define READ_SIZE (128u * 1024u)
#define MAX_SIZES 16
#define HOST_PORT 5000u
#define GUEST_PORT 6000u
#define WAIT_MS 10000

enum kind { K_VSOCK_G2H, K_VSOCK_H2G, K_TCP, K_UNIX, K_MAX };
static const char *const kind_name[K_MAX] = { "vsock g->h", "vsock h->g", "tcp loopback",
					      "unix loopback" };

struct opts {
	const char *uvsockd;
	const char *socket;
	const char *uds;
	size_t sizes[MAX_SIZES];
	int nsizes;
	uint64_t bytes;      /* 0: adaptive */
	int runs;
	int rtt_count;
	unsigned busy_poll_us;
	bool quiet;
};

struct env {
	struct opts o;
	pid_t daemon;
	char dir[64], sock[128], uds[128], host_lpath[160];
	struct uvsock_ctx *g;
	int host_lfd;        /* host listener at <uds>_HOST_PORT */
	int guest_lfd;       /* guest listener on GUEST_PORT */
	int tcp_lfd;
	struct sockaddr_in tcp_addr;
	int unix_lfd;
	char unix_path[160];
};

/* One end of a connection: a uvsock descriptor or a plain fd. */
struct conn {
	int fd;
	bool uv;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static struct env *g_env;

static void cleanup(void)
{
	struct env *e = g_env;

	if (!e)
		return;
	g_env = NULL;
	uvsock_ctx_free(e->g);
	if (e->host_lfd >= 0)
		close(e->host_lfd);
	if (e->tcp_lfd >= 0)
		close(e->tcp_lfd);
	if (e->unix_lfd >= 0)
		close(e->unix_lfd);
	if (e->unix_path[0])
		unlink(e->unix_path);
	if (e->host_lpath[0])
		unlink(e->host_lpath);
	if (e->daemon > 0) {
		int st;

		kill(e->daemon, SIGTERM);
		for (int i = 0; i < 2500; i++) {
			if (waitpid(e->daemon, &st, WNOHANG) == e->daemon)
				goto reaped;
			usleep(2000);
		}
		kill(e->daemon, SIGKILL);
		waitpid(e->daemon, &st, 0);
reaped:
		e->daemon = 0;
	}
	if (e->dir[0]) {
		char p[200];

		snprintf(p, sizeof(p), "%s/uvsockd.log", e->dir);
		unlink(p);
		rmdir(e->dir);
	}
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("uvsock-perf: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	cleanup();
	exit(1);
}

static double cpu_self_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* utime + stime of pid in seconds, from /proc/<pid>/stat; 0 if unknown. */
static double cpu_pid_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;
	size_t n;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	/* Fields after the command: state(3) ... utime(14) stime(15). */
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- connections ------------------------------------------------------------------------ */

static ssize_t c_send(const struct conn *c, const void *buf, size_t n)
{
	return c->uv ? uvsock_send(c->fd, buf, n, 0) : write(c->fd, buf, n);
}

static ssize_t c_recv(const struct conn *c, void *buf, size_t n)
{
	return c->uv ? uvsock_recv(c->fd, buf, n, 0) : read(c->fd, buf, n);
}

static void c_close(struct conn *c)
{
	if (c->fd < 0)
		return;
	if (c->uv)
		uvsock_close(c->fd);
	else
		close(c->fd);
	c->fd = -1;
}

static int accept_wait(int lfd)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, WAIT_MS) <= 0)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static int unix_connect(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect %s: %s", path, strerror(errno));
	return fd;
}

static int unix_listen(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0)
		die("listen %s: %s", path, strerror(errno));
	return fd;
}

/* Host -> guest: CONNECT <port>\n on <uds>, then "OK ...\n" (read byte by byte). */
static int host_connect_guest(struct env *e)
{
	char line[64];
	int fd = unix_connect(e->uds), n;
	size_t got = 0;

	n = snprintf(line, sizeof(line), "CONNECT %u\n", GUEST_PORT);
	if (write(fd, line, (size_t)n) != n)
		die("write CONNECT: %s", strerror(errno));
	while (got + 1 < sizeof(line)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, WAIT_MS) <= 0 || read(fd, line + got, 1) != 1)
			die("no OK from the back-end for CONNECT %u", GUEST_PORT);
		if (line[got++] == '\n')
			break;
	}
	if (strncmp(line, "OK ", 3) != 0)
		die("back-end answered: %.*s", (int)got, line);
	return fd;
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Makes a connected pair: tx writes, rx reads (for ping-pong both directions are used). */
static void pair_open(struct env *e, enum kind k, struct conn *tx, struct conn *rx)
{
	struct sockaddr_vm va = { .svm_family = AF_VSOCK };
	int fd;

	switch (k) {
	case K_VSOCK_G2H:
		fd = uvsock_socket(e->g, SOCK_STREAM, 0);
		va.svm_cid = VMADDR_CID_HOST;
		va.svm_port = HOST_PORT;
		if (fd < 0 || uvsock_connect(fd, (struct sockaddr *)&va, sizeof(va)) < 0)
			die("guest connect to host port %u: %s", HOST_PORT, strerror(errno));
		*tx = (struct conn){ .fd = fd, .uv = true };
		*rx = (struct conn){ .fd = accept_wait(e->host_lfd), .uv = false };
		if (rx->fd < 0)
			die("host accept: %s", strerror(errno));
		break;
	case K_VSOCK_H2G:
		*tx = (struct conn){ .fd = host_connect_guest(e), .uv = false };
		fd = uvsock_accept(e->guest_lfd, NULL, NULL);
		if (fd < 0)
			die("guest accept: %s", strerror(errno));
		*rx = (struct conn){ .fd = fd, .uv = true };
		break;
	case K_TCP:
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&e->tcp_addr, sizeof(e->tcp_addr)) < 0)
			die("tcp connect: %s", strerror(errno));
		set_nodelay(fd);
		*tx = (struct conn){ .fd = fd };
		*rx = (struct conn){ .fd = accept_wait(e->tcp_lfd) };
		if (rx->fd < 0)
			die("tcp accept: %s", strerror(errno));
		set_nodelay(rx->fd);
		break;
	default:
		*tx = (struct conn){ .fd = unix_connect(e->unix_path) };
		*rx = (struct conn){ .fd = accept_wait(e->unix_lfd) };
		if (rx->fd < 0)
			die("unix accept: %s", strerror(errno));
		break;
	}
}

/* ---- throughput ------------------------------------------------------------------------- */

struct writer {
	const struct conn *c;
	size_t size;
	uint64_t bytes;
	const uint8_t *buf;
	atomic_int go;
	int err;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;

	/* Relaxed: a start signal only (pthread_create already published *w). */
	while (!atomic_load_explicit(&w->go, memory_order_relaxed))
		;
	for (uint64_t off = 0; off < w->bytes;) {
		size_t n = w->bytes - off < w->size ? (size_t)(w->bytes - off) : w->size;
		ssize_t r = c_send(w->c, w->buf, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			w->err = errno ? errno : EPIPE;
			return NULL;
		}
		off += (uint64_t)r;
	}
	return NULL;
}

struct sample {
	double gbps;
	double cpu_per_gb;
};

static struct sample run_tput(struct env *e, enum kind k, size_t size, uint64_t bytes,
			      const uint8_t *wbuf, uint8_t *rbuf)
{
	struct conn tx, rx;
	struct writer w;
	pthread_t th;
	uint64_t got = 0, t0, t1;
	double c0, c1, d0 = 0, d1 = 0;
	bool backend = k == K_VSOCK_G2H || k == K_VSOCK_H2G;
	struct sample s;

	pair_open(e, k, &tx, &rx);
	w = (struct writer){ .c = &tx, .size = size, .bytes = bytes, .buf = wbuf };
	if (pthread_create(&th, NULL, writer_main, &w) != 0)
		die("pthread_create");
	c0 = cpu_self_s();
	if (backend)
		d0 = cpu_pid_s(e->daemon);
	t0 = mono_ns();
	atomic_store_explicit(&w.go, 1, memory_order_relaxed); /* the start signal (writer_main) */
	while (got < bytes) {
		ssize_t r = c_recv(&rx, rbuf, READ_SIZE);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("%s: read after %" PRIu64 " of %" PRIu64 " bytes: %s", kind_name[k],
			    got, bytes, r == 0 ? "end of stream" : strerror(errno));
		got += (uint64_t)r;
	}
	t1 = mono_ns();
	c1 = cpu_self_s();
	if (backend)
		d1 = cpu_pid_s(e->daemon);
	pthread_join(th, NULL);
	if (w.err)
		die("%s: write: %s", kind_name[k], strerror(w.err));
	c_close(&tx);
	c_close(&rx);
	s.gbps = (double)bytes * 8.0 / (double)(t1 - t0);
	s.cpu_per_gb = ((c1 - c0) + (d1 - d0)) / ((double)bytes / 1e9);
	return s;
}

/* ---- latency ---------------------------------------------------------------------------- */

struct echo {
	const struct conn *c;
	int count;
	int err;
};

static void *echo_main(void *arg)
{
	struct echo *ec = arg;
	char buf[64];

	for (int i = 0; i < ec->count; i++) {
		size_t got = 0;

		while (got < sizeof(buf)) {
			ssize_t r = c_recv(ec->c, buf + got, sizeof(buf) - got);

			if (r <= 0) {
				ec->err = r == 0 ? EPIPE : errno;
				return NULL;
			}
			got += (size_t)r;
		}
		if (c_send(ec->c, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			ec->err = errno;
			return NULL;
		}
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Ping-pong from tx's side (the guest for vsock g->h); returns median and p99 in us. */
static void run_rtt(struct env *e, enum kind k, int count, double *med, double *p99)
{
	const int warm = 200;
	struct conn tx, rx;
	struct echo ec;
	pthread_t th;
	uint64_t *lat = calloc((size_t)count, sizeof(*lat));
	char buf[64];

	if (!lat)
		die("out of memory");
	memset(buf, 'p', sizeof(buf));
	pair_open(e, k, &tx, &rx);
	ec = (struct echo){ .c = &rx, .count = count + warm };
	if (pthread_create(&th, NULL, echo_main, &ec) != 0)
		die("pthread_create");
	for (int i = 0; i < count + warm; i++) {
		uint64_t t0 = mono_ns();
		size_t got = 0;

		if (c_send(&tx, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			die("%s: ping: %s", kind_name[k], strerror(errno));
		while (got < sizeof(buf)) {
			ssize_t r = c_recv(&tx, buf + got, sizeof(buf) - got);

			if (r <= 0)
				die("%s: pong: %s", kind_name[k], r ? strerror(errno) : "EOF");
			got += (size_t)r;
		}
		if (i >= warm)
			lat[i - warm] = mono_ns() - t0;
	}
	pthread_join(th, NULL);
	if (ec.err)
		die("%s: echo: %s", kind_name[k], strerror(ec.err));
	c_close(&tx);
	c_close(&rx);
	qsort(lat, (size_t)count, sizeof(*lat), cmp_u64);
	*med = (double)lat[count / 2] / 1000.0;
	*p99 = (double)lat[(size_t)count * 99 / 100] / 1000.0;
	free(lat);
}

/* ---- set-up ----------------------------------------------------------------------------- */

static const char *find_uvsockd(const char *given, char *buf, size_t cap)
{
	char self[PATH_MAX];
	ssize_t n;
	const char *env = getenv("UVSOCKD");

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

static void start_daemon(struct env *e)
{
	char bin_buf[PATH_MAX + 32], vm[512], logp[200];
	const char *bin = find_uvsockd(e->o.uvsockd, bin_buf, sizeof(bin_buf));
	pid_t parent = getpid();
	struct stat st;

	snprintf(e->dir, sizeof(e->dir), "/tmp/uvsock-perf-XXXXXX");
	if (!mkdtemp(e->dir)) {
		e->dir[0] = 0;
		die("mkdtemp: %s", strerror(errno));
	}
	snprintf(e->sock, sizeof(e->sock), "%s/vm3.sock", e->dir);
	snprintf(e->uds, sizeof(e->uds), "%s/vm3.vsock", e->dir);
	snprintf(vm, sizeof(vm), "guest-cid=3,socket=%s,uds-path=%s", e->sock, e->uds);
	snprintf(logp, sizeof(logp), "%s/uvsockd.log", e->dir);
	e->daemon = fork();
	if (e->daemon < 0)
		die("fork: %s", strerror(errno));
	if (e->daemon == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0)
			dup2(fd, 2);
		execlp(bin, bin, "--vm", vm, "--log-level=warn", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 2500; i++) {
		int status;

		if (stat(e->sock, &st) == 0)
			return;
		if (waitpid(e->daemon, &status, WNOHANG) == e->daemon) {
			e->daemon = 0;
			die("%s did not start (see --uvsockd; exit status %d)", bin, status);
		}
		usleep(2000);
	}
	die("%s: socket %s did not appear within 5 s", bin, e->sock);
}

static void setup(struct env *e)
{
	struct uvsock_guest_opts go = { .size = sizeof(go), .busy_poll_us = e->o.busy_poll_us };
	struct sockaddr_vm va = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				  .svm_port = GUEST_PORT };
	socklen_t alen = sizeof(e->tcp_addr);
	int one = 1;

	if (e->o.socket) {
		snprintf(e->sock, sizeof(e->sock), "%s", e->o.socket);
		snprintf(e->uds, sizeof(e->uds), "%s", e->o.uds);
	} else {
		start_daemon(e);
	}
	e->g = uvsock_ctx_new_guest(e->sock, &go);
	if (!e->g)
		die("guest role on %s: %s", e->sock, strerror(errno));
	snprintf(e->host_lpath, sizeof(e->host_lpath), "%s_%u", e->uds, HOST_PORT);
	e->host_lfd = unix_listen(e->host_lpath);
	e->guest_lfd = uvsock_socket(e->g, SOCK_STREAM, 0);
	if (e->guest_lfd < 0 || uvsock_bind(e->guest_lfd, (struct sockaddr *)&va, sizeof(va)) < 0 ||
	    uvsock_listen(e->guest_lfd, 16) < 0)
		die("guest listen: %s", strerror(errno));

	e->tcp_lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	e->tcp_addr = (struct sockaddr_in){ .sin_family = AF_INET,
					    .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	setsockopt(e->tcp_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (e->tcp_lfd < 0 || bind(e->tcp_lfd, (struct sockaddr *)&e->tcp_addr, alen) < 0 ||
	    listen(e->tcp_lfd, 16) < 0 ||
	    getsockname(e->tcp_lfd, (struct sockaddr *)&e->tcp_addr, &alen) < 0)
		die("tcp listen: %s", strerror(errno));
	snprintf(e->unix_path, sizeof(e->unix_path), "%s_unixbench",
		 e->o.socket ? e->o.uds : e->uds);
	e->unix_lfd = unix_listen(e->unix_path);
}

/* ---- main ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (end == s)
		die("bad size '%s'", s);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (*end || v == 0)
		die("bad size '%s'", s);
	return v;
}

static void usage(FILE *f)
{
	fputs("usage: uvsock-perf [options]\n"
	      "  --uvsockd PATH       uvsockd binary to start (default: $UVSOCKD, the build tree,"
	      " $PATH)\n"
	      "  --socket PATH        use a running vhost-user vsock back-end at PATH instead\n"
	      "  --uds-path PATH      its hybrid host-side socket (required with --socket)\n"
	      "  --sizes LIST         write sizes, comma-separated, K/M suffixes (default"
	      " 64,4K,64K)\n"
	      "  --bytes N            bytes per run (default: size x 256K, at most 128M)\n"
	      "  --runs N             runs per point, median reported (default 5)\n"
	      "  --rtt-count N        ping-pong round trips (default 10000)\n"
	      "  --busy-poll-us N     guest driver spins N us before sleeping (default 0)\n"
	      "  -h, --help\n", f);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "uvsockd", required_argument, NULL, 'u' },
		{ "socket", required_argument, NULL, 's' },
		{ "uds-path", required_argument, NULL, 'U' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "runs", required_argument, NULL, 'r' },
		{ "rtt-count", required_argument, NULL, 'l' },
		{ "busy-poll-us", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static struct env env = { .daemon = 0, .host_lfd = -1, .guest_lfd = -1, .tcp_lfd = -1,
				  .unix_lfd = -1 };
	struct env *e = &env;
	uint8_t *wbuf, *rbuf;
	int c;

	e->o.runs = 5;
	e->o.rtt_count = 10000;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'u': e->o.uvsockd = optarg; break;
		case 's': e->o.socket = optarg; break;
		case 'U': e->o.uds = optarg; break;
		case 'z': {
			char *list = strdup(optarg), *save = NULL;

			if (!list)
				die("out of memory");

			for (char *t = strtok_r(list, ",", &save); t;
			     t = strtok_r(NULL, ",", &save)) {
				if (e->o.nsizes == MAX_SIZES)
					die("at most %d sizes", MAX_SIZES);
				e->o.sizes[e->o.nsizes++] = (size_t)parse_size(t);
			}
			free(list);
			break;
		}
		case 'b': e->o.bytes = parse_size(optarg); break;
		case 'r': e->o.runs = atoi(optarg); break;
		case 'l': e->o.rtt_count = atoi(optarg); break;
		case 'p': e->o.busy_poll_us = (unsigned)atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (e->o.runs < 1 || e->o.runs > 1000 || e->o.rtt_count < 100)
		die("bad --runs or --rtt-count");
	if (!!e->o.socket != !!e->o.uds)
		die("--socket and --uds-path go together");
	if (!e->o.nsizes) {
		e->o.sizes[0] = 64;
		e->o.sizes[1] = 4096;
		e->o.sizes[2] = 65536;
		e->o.nsizes = 3;
	}
	for (int i = 0; i < e->o.nsizes; i++)
		if (e->o.sizes[i] > (64u << 20))
			die("write size above 64 MiB");
	signal(SIGPIPE, SIG_IGN);
	g_env = e;
	setup(e);

	wbuf = malloc(64u << 20);
	rbuf = malloc(READ_SIZE);
	if (!wbuf || !rbuf)
		die("out of memory");
	memset(wbuf, 0x5a, 64u << 20);

	printf("uvsock-perf: back-end %s%s (guest CID %u), %d runs per point, medians\n",
	       e->o.socket ? e->sock : "uvsockd", e->daemon > 0 ? " started by uvsock-perf" : "",
	       uvsock_ctx_local_cid(e->g), e->o.runs);
	printf("throughput in Gbit/s (payload); in brackets CPU seconds per GB moved "
	       "(this process%s); reader uses %u KiB reads\n",
	       e->daemon > 0 ? " + uvsockd for vsock" : "", READ_SIZE / 1024);
	printf("%-9s %-10s", "size", "bytes/run");
	for (int k = 0; k < K_MAX; k++)
		printf(" %-22s", kind_name[k]);
	printf("\n");
	fflush(stdout);
	for (int si = 0; si < e->o.nsizes; si++) {
		size_t size = e->o.sizes[si];
		uint64_t bytes = e->o.bytes;

		if (!bytes) {
			bytes = (uint64_t)size * 262144u;
			if (bytes > (128u << 20))
				bytes = 128u << 20;
		}
		printf("%-9zu %-10" PRIu64, size, bytes);
		for (int k = 0; k < K_MAX; k++) {
			double g[1000], cpu[1000];
			char cell[64];

			for (int r = 0; r < e->o.runs; r++) {
				struct sample s = run_tput(e, (enum kind)k, size, bytes, wbuf,
							   rbuf);

				g[r] = s.gbps;
				cpu[r] = s.cpu_per_gb;
			}
			snprintf(cell, sizeof(cell), "%.3f [%.2f]", median(g, e->o.runs),
				 median(cpu, e->o.runs));
			printf(" %-22s", cell);
			fflush(stdout);
		}
		printf("\n");
	}
	printf("\nlatency, 64 B ping-pong, %d round trips after 200 warm-up, microseconds "
	       "(median / p99)\n", e->o.rtt_count);
	{
		static const enum kind lk[] = { K_VSOCK_G2H, K_TCP, K_UNIX };
		static const char *const ln[] = { "vsock guest->host->guest", "tcp loopback",
						  "unix loopback" };

		for (unsigned i = 0; i < 3; i++) {
			double med[1000], p99[1000], m, p;

			for (int r = 0; r < e->o.runs; r++)
				run_rtt(e, lk[i], e->o.rtt_count, &med[r], &p99[r]);
			m = median(med, e->o.runs);
			p = median(p99, e->o.runs);
			printf("  %-26s %8.1f / %8.1f\n", ln[i], m, p);
			fflush(stdout);
		}
	}
	free(wbuf);
	free(rbuf);
	cleanup();
	return 0;
}
