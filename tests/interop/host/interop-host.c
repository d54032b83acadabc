// SPDX-License-Identifier: MIT
/*
 * uvsock-interop-host: the host half of the interop run, one process per guest. It plays the
 * host applications that sit behind uvsockd's Unix sockets:
 *
 *  - services the guest connects to (uvsockd connects to `<uds>_5000` (stream) and
 *    `<uds>_5001` (SOCK_SEQPACKET) for guest connections to CID 2 ports 5000/5001): each
 *    connection is served per the session header the guest sends (xfer.h), in its own thread,
 *    and the verdict is kept by session id for the guest to ask for;
 *  - host-initiated connections into guest listeners, through uvsockd's `<uds>` ("CONNECT
 *    <port>\n" -> "OK <n>\n") and `<uds>_seqpacket`, on the guest's request;
 *  - the control channel: a Unix listener that QEMU connects to as the guest's /dev/ttyS1, with
 *    tagged request/response lines (see guest/uvsock-guest.c for the requests).
 *
 *  - with --uvsock-run: unmodified AF_VSOCK host programs (socat, ncat) through uvsock-run and
 *    libuvsock-preload.so (docs/shim.md), on the guest's SHIMRUN/SHIMWAIT requests; always
 *    through uvsock-run, whose seccomp filter refuses this machine's own AF_VSOCK.
 *
 * It also measures uvsockd's VmRSS (--daemon-pid) for the back-pressure cases and waits for a
 * file (--hold-file) for the "survive" case. `--selftest` runs every session mode over plain
 * Unix sockets inside this process (no VM, no daemon) and exits 0/1.
 *
 * Never opens AF_VSOCK sockets. Exits when the control channel closes (the VM is gone).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "xfer.h"

#define MSG 400

static struct {
	const char *ctl, *uds, *hold, *name, *uvsock_run, *control, *vsock_test;
	long cid;
	long daemon_pid;
} opt = { .cid = -1, .daemon_pid = -1, .name = "vm" };

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void logf_(const char *fmt, ...)
{
	static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	va_list ap;

	pthread_mutex_lock(&m);
	printf("HOST[%s] ", opt.name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	pthread_mutex_unlock(&m);
}

/* ---- verdicts of guest-initiated sessions, by session id ---- */

struct verdict {
	uint64_t id;
	bool used, done, ok, stalled, released;
	char msg[MSG];
};

#define NVERDICT 4096
static struct verdict vt[NVERDICT];
static size_t vt_next;
static pthread_mutex_t vt_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t vt_cond = PTHREAD_COND_INITIALIZER;

static struct verdict *vt_find(uint64_t id)
{
	for (size_t i = 0; i < NVERDICT; i++)
		if (vt[i].used && vt[i].id == id)
			return &vt[i];
	return NULL;
}

static void vt_begin(uint64_t id)
{
	pthread_mutex_lock(&vt_lock);
	struct verdict *v = &vt[vt_next++ % NVERDICT];

	memset(v, 0, sizeof(*v));
	v->used = true;
	v->id = id;
	pthread_cond_broadcast(&vt_cond);
	pthread_mutex_unlock(&vt_lock);
}

static void vt_end(uint64_t id, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void vt_end(uint64_t id, bool ok, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&vt_lock);
	struct verdict *v = vt_find(id);

	if (v) {
		va_start(ap, fmt);
		vsnprintf(v->msg, sizeof(v->msg), fmt, ap);
		va_end(ap);
		v->ok = ok;
		v->done = true;
		if (!ok)
			logf_("session %llu FAILED: %s", (unsigned long long)id, v->msg);
	}
	pthread_cond_broadcast(&vt_cond);
	pthread_mutex_unlock(&vt_lock);
}

static void abs_deadline(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

/* Wait for sessions [base, base+n) to finish; Returns: number ok, first failure in @msg. */
static unsigned vt_wait(uint64_t base, unsigned n, int timeout_ms, char *msg, size_t len)
{
	struct timespec ts;
	unsigned ok = 0, done = 0;

	abs_deadline(&ts, timeout_ms);
	msg[0] = 0;
	pthread_mutex_lock(&vt_lock);
	for (;;) {
		ok = done = 0;
		msg[0] = 0;
		for (unsigned i = 0; i < n; i++) {
			struct verdict *v = vt_find(base + i);

			if (!v || !v->done)
				continue;
			done++;
			if (v->ok)
				ok++;
			else if (!msg[0])
				snprintf(msg, len, "%s", v->msg);
		}
		if (done == n || pthread_cond_timedwait(&vt_cond, &vt_lock, &ts) == ETIMEDOUT)
			break;
	}
	if (done < n && !msg[0])
		snprintf(msg, len, "%u of %u sessions never finished on the host", n - done, n);
	pthread_mutex_unlock(&vt_lock);
	return ok;
}

/* ---- guest-initiated sessions (uvsockd connects to our listeners) ---- */

static void serve_stall(int fd, const struct xfer_hdr *h)
{
	struct timespec ts;
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0;

	abs_deadline(&ts, 120000);
	pthread_mutex_lock(&vt_lock);
	struct verdict *v = vt_find(h->id);

	if (v) {
		v->stalled = true;
		pthread_cond_broadcast(&vt_cond); /* a RELEASE may already be waiting for this */
	}
	while (v && !v->released)
		if (pthread_cond_timedwait(&vt_cond, &vt_lock, &ts) == ETIMEDOUT)
			break;
	bool rel = v && v->released;

	pthread_mutex_unlock(&vt_lock);
	if (!rel) {
		vt_end(h->id, false, "stall: never released");
		return;
	}
	set_timeouts(fd, 30000);
	for (;;) {
		ssize_t r = recv(fd, buf, 262144, 0), bad;

		if (r < 0) {
			vt_end(h->id, false, "stall: recv after %llu B: %s",
			       (unsigned long long)got, strerror(errno));
			return;
		}
		if (r == 0)
			break;
		bad = xfer_pattern_check(h->seed, got, buf, r);
		if (bad >= 0) {
			vt_end(h->id, false, "stall: mismatch at byte %llu",
			       (unsigned long long)(got + bad));
			return;
		}
		got += r;
	}
	if (got != h->c2s)
		vt_end(h->id, false, "stall: EOF after %llu of %llu B", (unsigned long long)got,
		       (unsigned long long)h->c2s);
	else
		vt_end(h->id, true, "stalled, then received all %llu B intact",
		       (unsigned long long)got);
}

static void serve_abort(int fd, const struct xfer_hdr *h)
{
	uint8_t *buf = xfer_scratch(1);

	set_timeouts(fd, 30000);
	if (recv_full(fd, buf, h->c2s) < 0 || xfer_pattern_check(99, 0, buf, h->c2s) >= 0) {
		vt_end(h->id, false, "abort: could not read the first %llu B intact",
		       (unsigned long long)h->c2s);
		return;
	}
	vt_end(h->id, true, "read %llu B, then closed with data in flight",
	       (unsigned long long)h->c2s);
}

/* Write until the peer is gone (EPIPE/ECONNRESET) or @ms pass; Returns: errno or -ETIME. */
static int flood(int fd, uint32_t seed, int ms, uint64_t *ret_bytes)
{
	uint8_t *buf = xfer_scratch(0);
	int64_t end = xfer_now_ms() + ms;
	uint64_t off = 0;

	set_timeouts(fd, 1000);
	while (xfer_now_ms() < end) {
		xfer_pattern_fill(seed, off, buf, 65536);
		ssize_t r = send(fd, buf, 65536, MSG_NOSIGNAL);

		if (r > 0) {
			off += r;
			continue;
		}
		if (r < 0 && errno != EAGAIN && errno != EINTR) {
			*ret_bytes = off;
			return errno;
		}
	}
	*ret_bytes = off;
	return -ETIME;
}

static void serve_flood(int fd, const struct xfer_hdr *h)
{
	uint64_t n;
	int64_t t0 = xfer_now_ms();
	int e = flood(fd, h->seed, 20000, &n);

	if (e == EPIPE || e == ECONNRESET)
		vt_end(h->id, true, "host writer got %s after %llu B, %lld ms", strerror(e),
		       (unsigned long long)n, (long long)(xfer_now_ms() - t0));
	else
		vt_end(h->id, false,
		       "host writer: %s after %llu B (want EPIPE once the guest "
		       "closed)",
		       e == -ETIME ? "still writable after 20 s" : strerror(e),
		       (unsigned long long)n);
}

static void serve_sink(int fd, const struct xfer_hdr *h)
{
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0;
	bool told = false;

	set_timeouts(fd, 600000);
	for (;;) {
		ssize_t r = recv(fd, buf, 262144, 0);

		if (r <= 0)
			break;
		if (xfer_pattern_check(h->seed, got, buf, r) >= 0) {
			vt_end(h->id, false, "sink: data mismatch near %llu",
			       (unsigned long long)got);
			return;
		}
		got += r;
		if (!told && got >= h->c2s) {
			printf("UVSOCK-HOST FLOWING %llu\n", (unsigned long long)h->id);
			fflush(stdout);
			told = true;
		}
	}
	vt_end(h->id, true, "sink ended after %llu B", (unsigned long long)got);
}

/*
 * XM_COUNT: read exactly c2s bytes (pattern checked in place, hashed), then EOF. The verdict
 * names the hash so the guest can compare it with what it sent.
 */
static void serve_count(int fd, const struct xfer_hdr *h)
{
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0, hash = XFER_HASH_INIT;
	ssize_t r, bad;

	set_timeouts(fd, 30000);
	while ((r = recv(fd, buf, 262144, 0)) > 0) {
		bad = xfer_pattern_check(h->seed, got, buf, (size_t)r);
		if (bad >= 0) {
			vt_end(h->id, false, "count: mismatch at byte %llu",
			       (unsigned long long)(got + bad));
			return;
		}
		hash = xfer_hash(hash, buf, (size_t)r);
		got += (uint64_t)r;
	}
	if (r < 0)
		vt_end(h->id, false, "count: recv after %llu B: %s", (unsigned long long)got,
		       strerror(errno));
	else if (got != h->c2s)
		vt_end(h->id, false, "count: EOF after %llu of %llu B", (unsigned long long)got,
		       (unsigned long long)h->c2s);
	else
		vt_end(h->id, true, "got %llu B intact then EOF, hash %016llx",
		       (unsigned long long)got, (unsigned long long)hash);
}

static void *stream_session(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct xfer_hdr h;

	set_timeouts(fd, 30000);
	if (recv_full(fd, &h, sizeof(h)) < 0 || h.magic != XFER_MAGIC) {
		logf_("stream connection without a valid session header");
		close(fd);
		return NULL;
	}
	vt_begin(h.id);
	switch (h.mode) {
	case XM_DUPLEX:
	case XM_ECHO:
	case XM_HALFCLOSE: {
		struct xfer x;
		size_t n = 1;

		xfer_server_init_hdr(&x, fd, &h);
		xfer_run(&x, &n, 1, -1, 0, xfer_now_ms() + 1800000, NULL, 0);
		vt_end(h.id, x.ok, "%s", x.msg);
		xfer_thread_done();
		return NULL; /* the engine closed fd */
	}
	case XM_STALL:
		serve_stall(fd, &h);
		break;
	case XM_ABORT:
		serve_abort(fd, &h);
		break;
	case XM_FLOOD:
		serve_flood(fd, &h);
		break;
	case XM_SINK:
		serve_sink(fd, &h);
		break;
	case XM_COUNT:
		serve_count(fd, &h);
		break;
	default:
		vt_end(h.id, false, "unknown mode %u", h.mode);
	}
	close(fd);
	xfer_thread_done();
	return NULL;
}

static void *seq_session(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char msg[MSG];

	if (xfer_seq_server(fd, 20000, msg, sizeof(msg)))
		logf_("seqpacket session failed: %s", msg);
	else
		logf_("seqpacket session ok");
	close(fd);
	xfer_thread_done();
	return NULL;
}

struct acceptor {
	int lfd;
	void *(*fn)(void *);
};

static void *acceptor(void *arg)
{
	struct acceptor *a = arg;

	for (;;) {
		int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC);
		pthread_t t;
		pthread_attr_t at;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
				continue;
			return NULL;
		}
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&at, 256 * 1024);
		if (pthread_create(&t, &at, a->fn, (void *)(intptr_t)fd) != 0)
			close(fd);
		pthread_attr_destroy(&at);
	}
}

static int unix_listen(const char *path, int type)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(a.sun_path)) {
		fprintf(stderr, "path too long for a Unix socket: %s\n", path);
		return -1;
	}
	strcpy(a.sun_path, path);
	unlink(path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1024) < 0) {
		fprintf(stderr, "listen on %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static int unix_connect(const char *path, int type)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd, e;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	set_timeouts(fd, 10000);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static void start_service(const char *suffix, int type, void *(*fn)(void *))
{
	char path[256];
	static struct acceptor acc[4];
	static int nacc;
	pthread_t t;
	struct acceptor *a = &acc[nacc++];

	snprintf(path, sizeof(path), "%s_%s", opt.uds, suffix);
	a->lfd = unix_listen(path, type);
	if (a->lfd < 0)
		exit(1);
	a->fn = fn;
	pthread_create(&t, NULL, acceptor, a);
	pthread_detach(t);
}

/* ---- host-initiated connections through uvsockd ---- */

/* Read one '\n'-terminated line byte by byte (so nothing after it is consumed). */
static int read_line(int fd, char *out, size_t len)
{
	size_t n = 0;

	for (;;) {
		char c;
		ssize_t r = recv(fd, &c, 1, 0);

		if (r < 0)
			return -errno;
		if (r == 0)
			return -EPIPE;
		if (c == '\n')
			break;
		if (n + 1 < len)
			out[n++] = c;
	}
	out[n] = 0;
	return (int)n;
}

/* Connect to the guest's @port through uvsockd; Returns: fd or -errno, @why filled. */
static int host_connect(unsigned port, char *why, size_t len)
{
	char line[80];
	int fd = unix_connect(opt.uds, SOCK_STREAM), r;

	if (fd < 0) {
		snprintf(why, len, "connect to uvsockd %s: %s", opt.uds, strerror(-fd));
		return fd;
	}
	snprintf(line, sizeof(line), "CONNECT %u\n", port);
	if ((r = send_full(fd, line, strlen(line))) < 0 ||
	    (r = read_line(fd, line, sizeof(line))) < 0) {
		snprintf(why, len, "CONNECT %u handshake: %s", port,
			 r == -EPIPE ? "uvsockd closed the socket" : strerror(-r));
		close(fd);
		return r;
	}
	if (strncmp(line, "OK ", 3) != 0) {
		snprintf(why, len, "CONNECT %u: uvsockd replied '%s'", port, line);
		close(fd);
		return -EPROTO;
	}
	return fd;
}

/* host_connect for a control request: a failure is answered (FAIL) here. Returns: fd or -1. */
static int host_connect_req(struct ctl *c, unsigned tag, unsigned port)
{
	char why[MSG];
	int fd = host_connect(port, why, sizeof(why));

	if (fd < 0)
		ctl_send(c, "%u FAIL %s", tag, why);
	return fd;
}

static long daemon_rss_kb(void)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	if (opt.daemon_pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%ld/status", opt.daemon_pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void cmd_connect(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, n, mode, seed;
	unsigned long long c2s, s2c, base;
	struct xfer *v;
	size_t m = 0;
	char why[MSG], sum[MSG];
	int64_t t0 = xfer_now_ms();

	if (sscanf(args, "%u %u %u %llu %llu %u %llu", &port, &n, &mode, &c2s, &s2c, &seed,
		   &base) != 7 ||
	    n == 0 || n > 4096) {
		ctl_send(c, "%u FAIL bad CONNECT arguments", tag);
		return;
	}
	v = calloc(n, sizeof(*v));
	if (!v) {
		ctl_send(c, "%u FAIL out of memory", tag);
		return;
	}
	for (unsigned i = 0; i < n; i++) {
		struct xfer_hdr h = {
			.mode = mode, .c2s = c2s, .s2c = s2c, .seed = seed + i, .id = base + i
		};
		char pre[48];
		int fd = unix_connect(opt.uds, SOCK_STREAM);

		if (fd < 0) {
			for (size_t k = 0; k < m; k++)
				close(v[k].fd);
			free(v);
			ctl_send(c, "%u FAIL connection %u to uvsockd %s: %s", tag, i, opt.uds,
				 strerror(-fd));
			return;
		}
		snprintf(pre, sizeof(pre), "CONNECT %u\n", port);
		xfer_client_init(&v[m++], fd, &h, pre, false);
	}
	int bad = xfer_run(v, &m, n, -1, 0, t0 + 1700000, why, sizeof(why));

	xfer_summary(v, m, sum, sizeof(sum));
	free(v);
	if (bad)
		ctl_send(c, "%u FAIL host clients: %s", tag, sum);
	else
		ctl_send(c, "%u OK %s in %lld ms", tag, sum, (long long)(xfer_now_ms() - t0));
}

static void cmd_seqconnect(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, seed, flags;
	char path[256], line[80], msg[MSG];
	int fd;
	ssize_t r;

	if (sscanf(args, "%u %u %u", &port, &seed, &flags) != 3) {
		ctl_send(c, "%u FAIL bad SEQCONNECT arguments", tag);
		return;
	}
	snprintf(path, sizeof(path), "%s_seqpacket", opt.uds);
	fd = unix_connect(path, SOCK_SEQPACKET);
	if (fd < 0) {
		ctl_send(c, "%u FAIL connect to %s: %s", tag, path, strerror(-fd));
		return;
	}
	snprintf(line, sizeof(line), "CONNECT %u\n", port);
	if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
		ctl_send(c, "%u FAIL CONNECT message: %s", tag, strerror(errno));
		close(fd);
		return;
	}
	r = recv(fd, line, sizeof(line) - 1, 0);
	if (r <= 0 || strncmp(line, "OK ", 3) != 0) {
		line[r > 0 ? r : 0] = 0;
		ctl_send(c, "%u FAIL seqpacket CONNECT %u: %s%s", tag, port,
			 r < 0	  ? strerror(errno)
			 : r == 0 ? "uvsockd closed"
				  : "reply ",
			 line);
		close(fd);
		return;
	}
	if (xfer_seq_client(fd, seed, flags, 20000, msg, sizeof(msg)))
		ctl_send(c, "%u FAIL %s", tag, msg);
	else
		ctl_send(c, "%u OK %s", tag, msg);
	close(fd);
}

static void cmd_hrefused(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port = (unsigned)strtoul(args, NULL, 10);
	char line[80];
	int64_t t0 = xfer_now_ms();
	int fd = unix_connect(opt.uds, SOCK_STREAM), r;

	if (fd < 0) {
		ctl_send(c, "%u FAIL connect to uvsockd: %s", tag, strerror(-fd));
		return;
	}
	set_timeouts(fd, 5000);
	snprintf(line, sizeof(line), "CONNECT %u\n", port);
	send_full(fd, line, strlen(line));
	r = read_line(fd, line, sizeof(line));
	close(fd);
	if (r >= 0)
		ctl_send(c, "%u FAIL uvsockd answered '%s' for guest port %u, where nobody listens",
			 tag, line, port);
	else if (r == -EAGAIN)
		ctl_send(c, "%u FAIL uvsockd neither answered nor closed within 5 s", tag);
	else
		ctl_send(c, "%u OK uvsockd closed the socket after %lld ms (%s)", tag,
			 (long long)(xfer_now_ms() - t0), r == -EPIPE ? "EOF" : strerror(-r));
}

static void cmd_hclose(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, bytes;
	uint8_t *buf = xfer_scratch(0);
	int fd, r;

	if (sscanf(args, "%u %u", &port, &bytes) != 2 || bytes > XFER_SCRATCH) {
		ctl_send(c, "%u FAIL bad HCLOSE arguments", tag);
		return;
	}
	fd = host_connect_req(c, tag, port);
	if (fd < 0)
		return;
	xfer_pattern_fill(77, 0, buf, bytes);
	r = send_full(fd, buf, bytes);
	close(fd);
	if (r < 0)
		ctl_send(c, "%u FAIL send: %s", tag, strerror(-r));
	else
		ctl_send(c, "%u OK wrote %u B and closed", tag, bytes);
}

static void cmd_hflood(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port = (unsigned)strtoul(args, NULL, 10);
	char why[MSG];
	uint64_t n;
	int64_t t0 = xfer_now_ms();
	int fd = host_connect(port, why, sizeof(why)), e;

	if (fd < 0) {
		ctl_send(c, "%u FAIL %s", tag, why);
		return;
	}
	e = flood(fd, 99, 20000, &n);
	close(fd);
	if (e == EPIPE || e == ECONNRESET)
		ctl_send(c, "%u OK host writer got %s after %llu B, %lld ms", tag, strerror(e),
			 (unsigned long long)n, (long long)(xfer_now_ms() - t0));
	else
		ctl_send(c,
			 "%u FAIL host writer: %s after %llu B (want EPIPE once the guest closed)",
			 tag, e == -ETIME ? "still writable after 20 s" : strerror(e),
			 (unsigned long long)n);
}

/*
 * BPH2G PORT TOTAL SEED [MAY_PASS]: write TOTAL bytes into a guest that reads nothing until the
 * writer blocks (no progress for 1.5 s), report "STUCK bytes rss0 rss1", write the rest after
 * the guest's GO. MAY_PASS 1: the guest may take all TOTAL bytes unread (it advertised a buffer
 * that large); then STUCK reports TOTAL instead of a failure.
 */
static void cmd_bph2g(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, total, seed, may_pass = 0;
	char line[MSG];
	uint8_t *buf = xfer_scratch(0);
	uint64_t off = 0;
	long rss0 = daemon_rss_kb(), rss1;
	int fd;

	if (sscanf(args, "%u %u %u %u", &port, &total, &seed, &may_pass) < 3) {
		ctl_send(c, "%u FAIL bad BPH2G arguments", tag);
		return;
	}
	fd = host_connect_req(c, tag, port);
	if (fd < 0)
		return;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	int64_t end = xfer_now_ms() + 60000;

	for (;;) {
		size_t n = total - off < 65536 ? total - off : 65536;
		ssize_t r;

		if (n == 0 && may_pass)
			break;
		if (n == 0) {
			close(fd);
			ctl_send(c, "%u FAIL all %u B accepted while the guest reads nothing", tag,
				 total);
			return;
		}
		xfer_pattern_fill(seed, off, buf, n);
		r = send(fd, buf, n, MSG_NOSIGNAL);
		if (r > 0) {
			off += r;
			continue;
		}
		if (r < 0 && errno != EAGAIN) {
			ctl_send(c, "%u FAIL send after %llu B: %s", tag, (unsigned long long)off,
				 strerror(errno));
			close(fd);
			return;
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		if (poll(&p, 1, 1500) == 0)
			break;
		if (xfer_now_ms() > end) {
			ctl_send(c, "%u FAIL writer never blocked", tag);
			close(fd);
			return;
		}
	}
	rss1 = daemon_rss_kb();
	logf_("back-pressure: host writer blocked after %llu B, uvsockd RSS %ld -> %ld kB",
	      (unsigned long long)off, rss0, rss1);
	ctl_send(c, "%u STUCK %llu %ld %ld", tag, (unsigned long long)off, rss0, rss1);
	for (;;) {
		char *sp;
		int r = ctl_recv(c, line, sizeof(line), xfer_now_ms() + 60000);

		if (r < 0) {
			close(fd);
			return;
		}
		if (strtoul(line, &sp, 10) != tag)
			continue;
		if (strcmp(sp, " GO") == 0)
			break;
		close(fd);
		return;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	set_timeouts(fd, 30000);
	while (off < total) {
		size_t n = total - off < 65536 ? total - off : 65536;
		int r;

		xfer_pattern_fill(seed, off, buf, n);
		if ((r = send_full(fd, buf, n)) < 0) {
			ctl_send(c, "%u FAIL send after release at %llu B: %s", tag,
				 (unsigned long long)off, strerror(-r));
			close(fd);
			return;
		}
		off += n;
	}
	close(fd);
	ctl_send(c, "%u OK wrote all %u B", tag, total);
}

static void cmd_release(struct ctl *c, unsigned tag, const char *args)
{
	uint64_t id = strtoull(args, NULL, 10);
	struct timespec ts;
	bool ok = false;

	/* The stalled session may not have registered yet: wait for it briefly. */
	abs_deadline(&ts, 10000);
	pthread_mutex_lock(&vt_lock);
	for (;;) {
		struct verdict *v = vt_find(id);

		if (v && v->stalled) {
			v->released = true;
			ok = true;
			pthread_cond_broadcast(&vt_cond);
			break;
		}
		if (pthread_cond_timedwait(&vt_cond, &vt_lock, &ts) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&vt_lock);
	if (ok)
		ctl_send(c, "%u OK released", tag);
	else
		ctl_send(c, "%u FAIL no stalled session %llu", tag, (unsigned long long)id);
}

static void cmd_hold(struct ctl *c, unsigned tag)
{
	int64_t end = xfer_now_ms() + 280000;
	struct stat st;

	if (!opt.hold) {
		ctl_send(c, "%u FAIL no --hold-file", tag);
		return;
	}
	logf_("HOLD: waiting for %s", opt.hold);
	printf("UVSOCK-HOST HOLDING\n");
	fflush(stdout);
	while (stat(opt.hold, &st) != 0) {
		if (xfer_now_ms() > end) {
			ctl_send(c, "%u FAIL hold file never appeared", tag);
			return;
		}
		poll(NULL, 0, 100);
	}
	ctl_send(c, "%u OK released by the harness", tag);
}

/* Many 1-byte writes into a guest that does not read yet; replies once all are written. */
static void cmd_tiny(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, count;
	uint8_t *buf = xfer_scratch(0);
	int fd;
	int64_t t0 = xfer_now_ms();

	if (sscanf(args, "%u %u", &port, &count) != 2 || count > XFER_SCRATCH) {
		ctl_send(c, "%u FAIL bad TINY arguments", tag);
		return;
	}
	fd = host_connect_req(c, tag, port);
	if (fd < 0)
		return;
	xfer_pattern_fill(31, 0, buf, count);
	for (unsigned i = 0; i < count; i++) {
		int r = send_full(fd, buf + i, 1);

		if (r < 0) {
			ctl_send(c, "%u FAIL 1-byte write #%u: %s", tag, i, strerror(-r));
			close(fd);
			return;
		}
	}
	close(fd);
	ctl_send(c, "%u OK %u writes in %lld ms", tag, count, (long long)(xfer_now_ms() - t0));
}

/*
 * HSEND PORT TOTAL SEED MIN MAX PACE_US: connect to the guest's PORT and write TOTAL pattern
 * bytes in writes of MIN..MAX bytes (varying), PACE_US microseconds apart (0: back to back),
 * then close. Replies once everything is written (or a write failed).
 */
static void cmd_hsend(struct ctl *c, unsigned tag, const char *args)
{
	unsigned port, total, seed, lo, hi, pace, writes = 0;
	uint8_t *buf = xfer_scratch(0);
	int64_t t0 = xfer_now_ms();
	uint64_t off = 0;
	int fd;

	if (sscanf(args, "%u %u %u %u %u %u", &port, &total, &seed, &lo, &hi, &pace) != 6 ||
	    lo == 0 || hi < lo || hi > XFER_SCRATCH) {
		ctl_send(c, "%u FAIL bad HSEND arguments", tag);
		return;
	}
	fd = host_connect_req(c, tag, port);
	if (fd < 0)
		return;
	set_timeouts(fd, 30000);
	while (off < total) {
		size_t n = lo + (size_t)(writes * 7919u) % (hi - lo + 1);
		int r;

		if (n > total - off)
			n = total - off;
		xfer_pattern_fill(seed, off, buf, n);
		r = send_full(fd, buf, n);
		if (r < 0) {
			ctl_send(c, "%u FAIL write #%u at %llu B: %s", tag, writes,
				 (unsigned long long)off, strerror(-r));
			close(fd);
			return;
		}
		off += n;
		writes++;
		if (pace)
			usleep(pace);
	}
	close(fd);
	ctl_send(c, "%u OK %u writes of %u..%u B (%u B) in %lld ms", tag, writes, lo, hi, total,
		 (long long)(xfer_now_ms() - t0));
}

/* ---- AF_VSOCK programs through uvsock-run (SHIMRUN NAME PORT, SHIMWAIT NAME) ---- */

/*
 * One scenario per name: the program and its arguments after uvsock-run, whether it listens
 * (then SHIMRUN answers once its socket file <uds>_<port> is there), and what it must print:
 * the echo of its own input (the guest echoes), the guest's line, or the refusal.
 */
struct shim_scn {
	const char *name;
	const char *argv[8];   /* "%c" / "%p": the guest's CID / the port */
	bool listens, refused;
};

static const struct shim_scn shim_scns[] = {
	{ "socat-connect", { "socat", "-t", "5", "-", "VSOCK-CONNECT:%c:%p" } },
	{ "socat-connect-seq", { "socat", "-t", "5", "-", "VSOCK-CONNECT:%c:%p,socktype=5" } },
	{ "ncat-connect", { "ncat", "--vsock", "%c", "%p" } },
	{ "socat-listen", { "socat", "-t", "5", "VSOCK-LISTEN:%p", "-" }, true },
	{ "socat-listen-seq", { "socat", "-t", "5", "VSOCK-LISTEN:%p,socktype=5", "-" }, true },
	{ "ncat-listen", { "ncat", "--vsock", "-l", "%p" }, true },
	{ "socat-refused", { "socat", "-", "VSOCK-CONNECT:%c:%p" }, false, true },
};

/* The running program of a scenario (one at a time per name). */
static struct shim_job {
	pid_t pid;
	int out;
	unsigned port;
} shim_jobs[sizeof(shim_scns) / sizeof(shim_scns[0])];

static int shim_find(const char *name)
{
	for (size_t i = 0; i < sizeof(shim_scns) / sizeof(shim_scns[0]); i++)
		if (strcmp(shim_scns[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* What the host program is given on stdin (and, echoed, what it must print for connects). */
static void shim_host_text(const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "shim-host-%s\n", name);
}

static void cmd_shimrun(struct ctl *c, unsigned tag, const char *args)
{
	char name[40], text[80], argbuf[8][80], path[300];
	char *argv[12];
	unsigned port = 0;
	int i, n = 0, in[2], out[2];
	const struct shim_scn *s;
	struct shim_job *j;
	struct stat st;

	if (!opt.uvsock_run || sscanf(args, "%39s %u", name, &port) != 2 ||
	    (i = shim_find(name)) < 0) {
		ctl_send(c, "%u FAIL SHIMRUN: %s", tag, opt.uvsock_run ? "bad request" :
			 "no --uvsock-run given to the host helper");
		return;
	}
	s = &shim_scns[i];
	j = &shim_jobs[i];
	argv[n++] = (char *)opt.uvsock_run;
	argv[n++] = "--control";
	argv[n++] = (char *)opt.control;
	for (int k = 0; k < 8 && s->argv[k]; k++) {
		size_t o = 0;

		/* %c -> the guest's CID, %p -> the port; everything else as it is. */
		for (const char *a = s->argv[k]; *a && o < sizeof(argbuf[k]) - 12; a++) {
			if (a[0] == '%' && (a[1] == 'c' || a[1] == 'p')) {
				o += (size_t)sprintf(argbuf[k] + o, "%lu",
						     a[1] == 'c' ? (unsigned long)opt.cid : port);
				a++;
			} else {
				argbuf[k][o++] = *a;
			}
		}
		argbuf[k][o] = '\0';
		argv[n++] = argbuf[k];
	}
	argv[n] = NULL;
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
		ctl_send(c, "%u FAIL pipe: %s", tag, strerror(errno));
		return;
	}
	j->pid = fork();
	if (j->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(out[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	j->out = out[0];
	j->port = port;
	/* The whole input at once, then EOF: the program half-closes after sending it. */
	shim_host_text(name, text, sizeof(text));
	if (j->pid > 0 && write(in[1], text, strlen(text)) != (ssize_t)strlen(text))
		logf_("SHIMRUN %s: writing its input: %s", name, strerror(errno));
	close(in[1]);
	if (j->pid < 0) {
		ctl_send(c, "%u FAIL fork: %s", tag, strerror(errno));
		return;
	}
	logf_("SHIMRUN %s: pid %d: %s ... %s", name, (int)j->pid, argv[3], argv[n - 1]);
	if (!s->listens) {
		ctl_send(c, "%u OK started pid %d", tag, (int)j->pid);
		return;
	}
	snprintf(path, sizeof(path), "%s_%u", opt.uds, port);
	for (int64_t end = xfer_now_ms() + 20000; xfer_now_ms() < end; usleep(20000))
		if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
			ctl_send(c, "%u OK listening pid %d", tag, (int)j->pid);
			return;
		}
	ctl_send(c, "%u FAIL %s: no listener at %s within 20 s", tag, name, path);
}

/* Waits (20 s) for the program's end and judges its output; kills it by PID past the limit. */
static void cmd_shimwait(struct ctl *c, unsigned tag, const char *args)
{
	char name[40], want[80], buf[2048];
	size_t len = 0;
	int64_t end = xfer_now_ms() + 20000;
	int i = sscanf(args, "%39s", name) == 1 ? shim_find(name) : -1, st = 0;
	const struct shim_scn *s;
	struct shim_job *j;
	bool ok;

	if (i < 0 || shim_jobs[i].pid <= 0) {
		ctl_send(c, "%u FAIL SHIMWAIT: no such program running", tag);
		return;
	}
	s = &shim_scns[i];
	j = &shim_jobs[i];
	for (;;) {
		struct pollfd p = { .fd = j->out, .events = POLLIN };
		ssize_t n;

		if (xfer_now_ms() >= end || poll(&p, 1, (int)(end - xfer_now_ms())) <= 0)
			break;
		n = read(j->out, buf + len, sizeof(buf) - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	close(j->out);
	if (waitpid(j->pid, &st, WNOHANG) == 0) {
		kill(j->pid, SIGKILL);
		waitpid(j->pid, &st, 0);
	}
	j->pid = 0;
	for (char *q = buf; *q; q++)
		if (*q == '\n')
			*q = '|';
	if (s->refused) {
		ok = WIFEXITED(st) && WEXITSTATUS(st) != 0 &&
		     strstr(buf, "Connection reset by peer");
	} else {
		if (s->listens)
			snprintf(want, sizeof(want), "shim-guest-%s|", name);
		else
			shim_host_text(name, want, sizeof(want));
		for (char *q = want; *q; q++)
			if (*q == '\n')
				*q = '|';
		ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && strcmp(buf, want) == 0;
	}
	logf_("SHIMWAIT %s: status 0x%x output '%s'", name, st, buf);
	ctl_send(c, "%u %s %s: exit %d, output '%.200s'", tag, ok ? "OK" : "FAIL", name,
		 WIFEXITED(st) ? WEXITSTATUS(st) : -1, buf);
}

/*
 * The kernel's own suite (tools/testing/vsock vsock_test, built for this host from the guest
 * kernel's source): VTSERVER starts its server half through uvsock-run, with the control channel
 * (TCP in vsock_test) carried from the guest: guest TCP 127.0.0.1:VT_CTL_TCP -> vsock host port
 * VT_CTL_VSOCK -> <uds>_VT_CTL_VSOCK -> socat -> TCP 127.0.0.1:VT_CTL_TCP here. VTWAIT collects its
 * output (each line also on stdout as "UVSOCK-HOST VT ...") and exit status. VTCLIENT is the
 * other way round: its client half here, the control channel TCP 127.0.0.1:VT_CTL_TCP2 -> socat
 * (through uvsock-run) -> vsock guest port VT_CTL_VSOCK2 -> the guest's relay -> its server.
 */
#define VT_CTL_VSOCK 1235
#define VT_CTL_TCP "41236"
#define VT_CTL_VSOCK2 "1236"
#define VT_CTL_TCP2 "41237"

static struct {
	pid_t server, relay;
	int out;
} vt_run = { .out = -1 };

static pid_t spawn_out(char *const argv[], int *out_fd)
{
	int out[2];
	pid_t pid;

	if (pipe2(out, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		int nul = open("/dev/null", O_RDONLY);

		setpgid(0, 0); /* its own group: socat's forked children end with it (vt_stop) */

		dup2(nul, 0);
		dup2(out[1], 1);
		dup2(out[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(out[1]);
	if (pid < 0) {
		close(out[0]);
		return -1;
	}
	*out_fd = out[0];
	return pid;
}

static void vt_stop(void)
{
	int st;

	for (int i = 0; i < 2; i++) {
		pid_t *p = i ? &vt_run.relay : &vt_run.server;

		if (*p > 0) {
			/* The group (socat forks a child per connection): TERM, KILL after 2 s. */
			kill(-*p, SIGTERM);
			for (int k = 0; k < 40 && waitpid(*p, &st, WNOHANG) == 0; k++)
				usleep(50000);
			kill(-*p, SIGKILL);
			waitpid(*p, &st, 0);
		}
		*p = 0;
	}
	if (vt_run.out >= 0)
		close(vt_run.out);
	vt_run.out = -1;
}

static void cmd_vtserver(struct ctl *c, unsigned tag)
{
	char path[300], listen_arg[340], cid[32], line[512] = "";
	size_t len = 0;
	int rfd = -1;

	if (!opt.uvsock_run || !opt.vsock_test) {
		ctl_send(c, "%u FAIL no --uvsock-run / --vsock-test given to the host helper", tag);
		return;
	}
	vt_stop();
	snprintf(path, sizeof(path), "%s_%u", opt.uds, VT_CTL_VSOCK);
	snprintf(listen_arg, sizeof(listen_arg), "UNIX-LISTEN:%s,fork,unlink-early", path);
	snprintf(cid, sizeof(cid), "--peer-cid=%ld", opt.cid);
	/* The relay is Unix <-> TCP on loopback only: no vsock involved. */
	char *relay[] = { "/usr/bin/socat", listen_arg, "TCP4:127.0.0.1:" VT_CTL_TCP, NULL };
	char *server[] = { (char *)opt.uvsock_run, "--control", (char *)opt.control,
			   (char *)opt.vsock_test, "--mode=server", "--control-host=127.0.0.1",
			   "--control-port=" VT_CTL_TCP, cid, NULL };

	vt_run.relay = spawn_out(relay, &rfd);
	if (rfd >= 0)
		close(rfd);
	vt_run.server = spawn_out(server, &vt_run.out);
	if (vt_run.relay <= 0 || vt_run.server <= 0) {
		ctl_send(c, "%u FAIL cannot start the relay or the vsock_test server", tag);
		vt_stop();
		return;
	}
	/* Ready once the server says its control socket listens (and the relay's file is there). */
	for (int64_t end = xfer_now_ms() + 20000; xfer_now_ms() < end;) {
		struct pollfd p = { .fd = vt_run.out, .events = POLLIN };
		struct stat st;
		ssize_t n;

		if (strstr(line, "Control socket listening") && stat(path, &st) == 0) {
			ctl_send(c, "%u OK vsock_test server pid %d", tag, (int)vt_run.server);
			return;
		}
		if (poll(&p, 1, 100) <= 0 || len + 1 >= sizeof(line))
			continue;
		n = read(vt_run.out, line + len, sizeof(line) - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
		line[len] = '\0';
	}
	ctl_send(c, "%u FAIL vsock_test server not ready within 20 s: '%.200s'", tag, line);
	vt_stop();
}

static void cmd_vtwait(struct ctl *c, unsigned tag)
{
	char buf[8192];
	size_t len = 0;
	int64_t end = xfer_now_ms() + 240000;
	int st = 0;

	if (vt_run.server <= 0) {
		ctl_send(c, "%u FAIL no vsock_test running", tag);
		return;
	}
	for (;;) {
		struct pollfd p = { .fd = vt_run.out, .events = POLLIN };
		ssize_t n;

		if (xfer_now_ms() >= end || poll(&p, 1, (int)(end - xfer_now_ms())) <= 0)
			break;
		n = read(vt_run.out, buf + len, sizeof(buf) - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	if (waitpid(vt_run.server, &st, WNOHANG) == 0) {
		kill(vt_run.server, SIGKILL);
		waitpid(vt_run.server, &st, 0);
	}
	vt_run.server = 0;
	vt_stop();
	for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
		printf("UVSOCK-HOST VT %s\n", l);
	fflush(stdout);
	ctl_send(c, "%u %s vsock_test exit %d", tag,
		 WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "OK" : "FAIL",
		 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static void cmd_vtclient(struct ctl *c, unsigned tag)
{
	char connect_arg[64], cid[32];
	int rfd = -1;

	if (!opt.uvsock_run || !opt.vsock_test) {
		ctl_send(c, "%u FAIL no --uvsock-run / --vsock-test given to the host helper", tag);
		return;
	}
	vt_stop();
	snprintf(connect_arg, sizeof(connect_arg), "VSOCK-CONNECT:%ld:" VT_CTL_VSOCK2, opt.cid);
	snprintf(cid, sizeof(cid), "--peer-cid=%ld", opt.cid);
	char *relay[] = { (char *)opt.uvsock_run, "--control", (char *)opt.control,
			  "/usr/bin/socat", "TCP4-LISTEN:" VT_CTL_TCP2 ",bind=127.0.0.1,reuseaddr",
			  connect_arg, NULL };
	char *client[] = { (char *)opt.uvsock_run, "--control", (char *)opt.control,
			   (char *)opt.vsock_test, "--mode=client", "--control-host=127.0.0.1",
			   "--control-port=" VT_CTL_TCP2, cid, NULL };

	vt_run.relay = spawn_out(relay, &rfd);
	if (rfd >= 0)
		close(rfd);
	for (int i = 0; i < 200 && !xfer_tcp_listening((unsigned)atoi(VT_CTL_TCP2)); i++)
		usleep(50000);
	vt_run.server = spawn_out(client, &vt_run.out);
	if (vt_run.relay <= 0 || vt_run.server <= 0) {
		ctl_send(c, "%u FAIL cannot start the relay or the vsock_test client", tag);
		vt_stop();
		return;
	}
	ctl_send(c, "%u OK vsock_test client pid %d", tag, (int)vt_run.server);
}

static unsigned boots;

static void dispatch(struct ctl *c, char *line)
{
	char *sp, *cmd, *args;
	unsigned tag = (unsigned)strtoul(line, &sp, 10);
	char msg[MSG];

	if (*sp != ' ')
		return;
	cmd = sp + 1;
	args = strchr(cmd, ' ');
	if (args)
		*args++ = 0;
	else
		args = "";
	if (strcmp(cmd, "HELLO") == 0) {
		const char *cid = strstr(args, "cid=");

		logf_("guest says hello: %s", args);
		printf("UVSOCK-HOST HELLO %s\n", args);
		fflush(stdout);
		if (opt.cid >= 0 && (!cid || strtol(cid + 4, NULL, 10) != opt.cid))
			ctl_send(c, "%u FAIL guest reports %s, uvsockd was given guest-cid=%ld",
				 tag, cid ? cid : "no cid", opt.cid);
		else
			ctl_send(c, "%u OK host helper '%s' ready", tag, opt.name);
	} else if (strcmp(cmd, "RSS") == 0) {
		ctl_send(c, "%u OK %ld", tag, daemon_rss_kb());
	} else if (strcmp(cmd, "VERDICT") == 0) {
		uint64_t id = strtoull(args, NULL, 10);

		if (vt_wait(id, 1, 30000, msg, sizeof(msg)) == 1) {
			pthread_mutex_lock(&vt_lock);
			struct verdict *v = vt_find(id);

			snprintf(msg, sizeof(msg), "%s", v ? v->msg : "?");
			pthread_mutex_unlock(&vt_lock);
			ctl_send(c, "%u OK host: %s", tag, msg);
		} else {
			ctl_send(c, "%u FAIL host: %s", tag, msg);
		}
	} else if (strcmp(cmd, "VERDICTS") == 0) {
		unsigned long long base;
		unsigned n;

		if (sscanf(args, "%llu %u", &base, &n) != 2) {
			ctl_send(c, "%u FAIL bad VERDICTS", tag);
			return;
		}
		unsigned ok = vt_wait(base, n, 60000, msg, sizeof(msg));

		if (ok == n)
			ctl_send(c, "%u OK %u/%u host sessions ok", tag, ok, n);
		else
			ctl_send(c, "%u FAIL %u/%u host sessions ok; first failure: %s", tag, ok, n,
				 msg);
	} else if (strcmp(cmd, "CONNECT") == 0) {
		cmd_connect(c, tag, args);
	} else if (strcmp(cmd, "SEQCONNECT") == 0) {
		cmd_seqconnect(c, tag, args);
	} else if (strcmp(cmd, "HREFUSED") == 0) {
		cmd_hrefused(c, tag, args);
	} else if (strcmp(cmd, "HCLOSE") == 0) {
		cmd_hclose(c, tag, args);
	} else if (strcmp(cmd, "HFLOOD") == 0) {
		cmd_hflood(c, tag, args);
	} else if (strcmp(cmd, "BPH2G") == 0) {
		cmd_bph2g(c, tag, args);
	} else if (strcmp(cmd, "RELEASE") == 0) {
		cmd_release(c, tag, args);
	} else if (strcmp(cmd, "HOLD") == 0) {
		cmd_hold(c, tag);
	} else if (strcmp(cmd, "BOOT") == 0) {
		ctl_send(c, "%u OK %u", tag, ++boots);
	} else if (strcmp(cmd, "REBOOT") == 0) {
		logf_("guest reboots (boot %u done)", boots);
		ctl_send(c, "%u OK %u", tag, boots);
	} else if (strcmp(cmd, "VTSERVER") == 0) {
		cmd_vtserver(c, tag);
	} else if (strcmp(cmd, "VTCLIENT") == 0) {
		cmd_vtclient(c, tag);
	} else if (strcmp(cmd, "VTWAIT") == 0) {
		cmd_vtwait(c, tag);
	} else if (strcmp(cmd, "SHIMRUN") == 0) {
		cmd_shimrun(c, tag, args);
	} else if (strcmp(cmd, "SHIMWAIT") == 0) {
		cmd_shimwait(c, tag, args);
	} else if (strcmp(cmd, "TINY") == 0) {
		cmd_tiny(c, tag, args);
	} else if (strcmp(cmd, "HSEND") == 0) {
		cmd_hsend(c, tag, args);
	} else if (strcmp(cmd, "BYE") == 0) {
		logf_("guest said BYE");
	} else {
		ctl_send(c, "%u FAIL unknown command %s", tag, cmd);
	}
}

/* ---- self-test: every session mode over Unix sockets, no VM ---- */

static int selftest(void)
{
	static const struct {
		uint32_t mode;
		uint64_t c2s, s2c;
		unsigned n;
	} t[] = {
		{ XM_ECHO, 1u << 20, 0, 1 },
		{ XM_DUPLEX, 16u << 20, 16u << 20, 1 },
		{ XM_HALFCLOSE, 1u << 20, 3u << 20, 1 },
		{ XM_DUPLEX, 65536, 65536, 200 },
		{ XM_DUPLEX, 0, 0, 1 },
		{ XM_HALFCLOSE, 0, 5, 1 },
	};
	char dir[] = "/tmp/uvsock-host-selftest.XXXXXX", path[128], msg[MSG];
	int fails = 0;

	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/s", dir);
	for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++) {
		int lfd = unix_listen(path, SOCK_STREAM);
		pid_t pid;
		int st;
		struct xfer *v = calloc(t[k].n, sizeof(*v));
		size_t n = 0;

		pid = fork();
		if (pid == 0) {
			struct xfer *cv = calloc(t[k].n, sizeof(*cv));
			size_t m = 0;

			for (unsigned i = 0; i < t[k].n; i++) {
				struct xfer_hdr h = { .mode = t[k].mode,
						      .c2s = t[k].c2s,
						      .s2c = t[k].s2c,
						      .seed = 3 + i,
						      .id = i };
				int fd = unix_connect(path, SOCK_STREAM);

				if (fd < 0)
					_exit(2);
				xfer_client_init(&cv[m++], fd, &h, NULL, false);
			}
			_exit(xfer_run(cv, &m, t[k].n, -1, 0, xfer_now_ms() + 60000, NULL, 0) ? 1
											      : 0);
		}
		int bad = xfer_run(v, &n, t[k].n, lfd, t[k].n, xfer_now_ms() + 60000, msg,
				   sizeof(msg));

		waitpid(pid, &st, 0);
		xfer_summary(v, n, msg, sizeof(msg));
		bool ok = !bad && WIFEXITED(st) && WEXITSTATUS(st) == 0;

		printf("%s %zu - stream mode %u, %u session(s): %s\n", ok ? "ok" : "not ok", k + 1,
		       t[k].mode, t[k].n, msg);
		fails += !ok;
		free(v);
		close(lfd);
	}
	/* Corruption must be caught: a server fed a wrong byte fails. */
	{
		int sv[2];
		struct xfer x;
		size_t n = 1;
		struct xfer_hdr h = {
			.magic = XFER_MAGIC, .mode = XM_DUPLEX, .c2s = 1000, .seed = 9
		};
		uint8_t b[1000];

		socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
		xfer_pattern_fill(9, 0, b, sizeof(b));
		b[777] ^= 1;
		send_full(sv[1], &h, sizeof(h));
		send_full(sv[1], b, sizeof(b));
		xfer_server_init(&x, sv[0]);
		xfer_run(&x, &n, 1, -1, 0, xfer_now_ms() + 5000, NULL, 0);
		close(sv[1]);
		bool ok = !x.ok && strstr(x.msg, "byte 777");

		printf("%s %zu - corrupted byte detected: %s\n", ok ? "ok" : "not ok",
		       sizeof(t) / sizeof(t[0]) + 1, x.msg);
		fails += !ok;
	}
	/* SEQPACKET over a Unix seqpacket pair (MSG_EOR is not carried by AF_UNIX: not checked). */
	{
		int sv[2], st, r;
		pid_t pid;

		socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv);
		pid = fork();
		if (pid == 0) {
			close(sv[0]);
			_exit(xfer_seq_server(sv[1], 10000, msg, sizeof(msg)) ? 1 : 0);
		}
		close(sv[1]);
		r = xfer_seq_client(sv[0], 5, 0, 10000, msg, sizeof(msg));
		close(sv[0]);
		waitpid(pid, &st, 0);
		bool ok = !r && WIFEXITED(st) && WEXITSTATUS(st) == 0;

		printf("%s %zu - seqpacket session: %s\n", ok ? "ok" : "not ok",
		       sizeof(t) / sizeof(t[0]) + 2, msg);
		fails += !ok;
	}
	printf("1..%zu\n", sizeof(t) / sizeof(t[0]) + 2);
	unlink(path);
	rmdir(dir);
	xfer_thread_done();
	return fails ? 1 : 0;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: uvsock-interop-host --ctl PATH --uds PATH [--cid N] [--daemon-pid P]"
		" [--hold-file F] [--name NAME]\n"
		"       [--uvsock-run PATH --control PATH [--vsock-test PATH]]\n"
		"       uvsock-interop-host --selftest\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "ctl", required_argument, NULL, 'c' },
		{ "uds", required_argument, NULL, 'u' },
		{ "cid", required_argument, NULL, 'i' },
		{ "daemon-pid", required_argument, NULL, 'p' },
		{ "hold-file", required_argument, NULL, 'h' },
		{ "name", required_argument, NULL, 'n' },
		{ "uvsock-run", required_argument, NULL, 'r' },
		{ "control", required_argument, NULL, 'C' },
		{ "vsock-test", required_argument, NULL, 'V' },
		{ "selftest", no_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctl c = { .fd = -1 };
	char line[1024];
	int o, lfd;

	signal(SIGPIPE, SIG_IGN);
	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'c':
			opt.ctl = optarg;
			break;
		case 'u':
			opt.uds = optarg;
			break;
		case 'i':
			opt.cid = strtol(optarg, NULL, 10);
			break;
		case 'p':
			opt.daemon_pid = strtol(optarg, NULL, 10);
			break;
		case 'h':
			opt.hold = optarg;
			break;
		case 'n':
			opt.name = optarg;
			break;
		case 'r':
			opt.uvsock_run = optarg;
			break;
		case 'C':
			opt.control = optarg;
			break;
		case 'V':
			opt.vsock_test = optarg;
			break;
		case 's':
			return selftest();
		default:
			return usage();
		}
	}
	if (!opt.ctl || !opt.uds || (opt.uvsock_run && !opt.control))
		return usage();
	start_service("5000", SOCK_STREAM, stream_session);
	start_service("5001", SOCK_SEQPACKET, seq_session);
	lfd = unix_listen(opt.ctl, SOCK_STREAM);
	if (lfd < 0)
		return 1;
	logf_("listening: control %s, services %s_5000 (stream) %s_5001 (seqpacket)", opt.ctl,
	      opt.uds, opt.uds);
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, 180000) <= 0) {
		logf_("QEMU never connected to the control socket");
		return 1;
	}
	c.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	close(lfd);
	unlink(opt.ctl);
	if (c.fd < 0)
		return 1;
	for (;;) {
		int r = ctl_recv(&c, line, sizeof(line), xfer_now_ms() + 24 * 3600 * 1000ll);

		if (r == -EPIPE || (r < 0 && r != -ETIMEDOUT))
			break;
		if (r >= 0)
			dispatch(&c, line);
	}
	logf_("control channel closed (VM gone)");
	vt_stop();
	char path[256];

	snprintf(path, sizeof(path), "%s_5000", opt.uds);
	unlink(path);
	snprintf(path, sizeof(path), "%s_5001", opt.uds);
	unlink(path);
	xfer_thread_done();
	return 0;
}
