// SPDX-License-Identifier: MIT
/*
 * uvsock-guest: the in-guest half of the interop run. Runs ONLY inside the QEMU guest booted by
 * tests/interop (statically linked, the initramfs has no libc); it is the only program of the
 * project that opens AF_VSOCK sockets, and only there.
 *
 *   uvsock-guest run            read the case list from /proc/cmdline (uvsock.cases=a,b:arg,...)
 *                               and run each case in a forked child with a time limit; print
 *                               "UVSOCK-BEGIN <case>" and "UVSOCK-CASE <case> PASS|FAIL <ms>
 *                               <detail>" on stdout (the serial console). Exit status = failures.
 *   uvsock-guest cid            print this guest's CID
 *   uvsock-guest connect CID PORT / listen PORT   netcat-like relay (for scripts/vm-shell.sh)
 *   uvsock-guest trace [PORT]   print virtio-vsock packets (vsockmon tap), a debugging aid; also
 *                               started by uvsock.trace=PORT|all on the kernel command line
 *
 * Cases that need the host side talk to the host helper (tests/interop/host) over the second
 * serial port (/dev/ttyS1) with tagged lines ("<tag> CMD args" -> "<tag> OK|FAIL text"); the
 * data itself only ever goes through vsock, i.e. through uvsockd.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <linux/errqueue.h>
#include <linux/netlink.h>
#include <linux/sockios.h>
#include <linux/sock_diag.h>
#include <linux/vm_sockets.h>
#include <linux/vm_sockets_diag.h>
#include <linux/virtio_vsock.h>
#include <linux/vsockmon.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <sys/reboot.h>

#include "xfer.h"

#define DETAIL 480
#define BULK_DEFAULT (64ull << 20) /* INTEROP_BULK_BYTES: bytes each way of the bulk cases */
#define MANY_DEFAULT 200 /* concurrent connections of the *_many cases */

static struct {
	struct ctl ctl;
	bool have_ctl;
	unsigned tag;
	uint64_t bulk;
	unsigned many;
	uint32_t cid;
	uint32_t seed;
} g = { .ctl = { .fd = -1 }, .bulk = BULK_DEFAULT, .many = MANY_DEFAULT, .seed = 1 };

static int fail(char *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(char *d, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(d, DETAIL, fmt, ap);
	va_end(ap);
	return -1;
}

static uint32_t local_cid(void)
{
	uint32_t cid = VMADDR_CID_ANY;
	int fd = open("/dev/vsock", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (ioctl(fd, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid) < 0)
			cid = VMADDR_CID_ANY;
		close(fd);
	}
	return cid;
}

/* ---- control channel to the host helper ---- */

/* Send "<tag> <cmd>"; Returns: the tag, or 0 if there is no control channel. */
static unsigned req_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static unsigned req_send(const char *fmt, ...)
{
	char cmd[400];
	va_list ap;

	if (!g.have_ctl)
		return 0;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	g.tag++;
	if (ctl_send(&g.ctl, "%u %s", g.tag, cmd) < 0)
		return 0;
	return g.tag;
}

/*
 * Wait for the reply line of @tag (lines of other tags are stale answers of timed-out cases and
 * are dropped). @word: the expected first word ("OK"); anything else is a failure.
 * Returns: 0 when the reply is OK (rest of the line in @out), -1 otherwise (@out says why).
 */
static int req_wait(unsigned tag, char *out, size_t len, int timeout_s)
{
	int64_t end = xfer_now_ms() + (int64_t)timeout_s * 1000;
	char line[600];

	if (!tag) {
		snprintf(out, len, "no control channel to the host helper");
		return -1;
	}
	for (;;) {
		int r = ctl_recv(&g.ctl, line, sizeof(line), end);
		char *sp;

		if (r < 0) {
			snprintf(out, len, "control channel: %s waiting for reply %u",
				 r == -ETIMEDOUT ? "timeout" : strerror(-r), tag);
			return -1;
		}
		if (strtoul(line, &sp, 10) != tag || *sp != ' ')
			continue;
		sp++;
		if (strncmp(sp, "OK", 2) == 0 && (sp[2] == 0 || sp[2] == ' ')) {
			snprintf(out, len, "%s", sp[2] ? sp + 3 : "");
			return 0;
		}
		snprintf(out, len, "host: %s", sp);
		return -1;
	}
}

static int req(char *out, size_t len, int timeout_s, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int req(char *out, size_t len, int timeout_s, const char *fmt, ...)
{
	char cmd[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return req_wait(req_send("%s", cmd), out, len, timeout_s);
}

static long host_rss_kb(void)
{
	char out[128];

	if (req(out, sizeof(out), 10, "RSS") < 0)
		return -1;
	return strtol(out, NULL, 10);
}

/* ---- sockets ---- */

/* Blocking-with-deadline connect; Returns: fd or -errno. */
static int vs_connect(uint32_t cid, uint32_t port, int type, int timeout_ms)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port };
	int fd = socket(AF_VSOCK, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), err = 0;
	socklen_t el = sizeof(err);
	struct pollfd p;

	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		goto ok;
	if (errno != EINPROGRESS) {
		err = errno;
		close(fd);
		return -err;
	}
	p.fd = fd;
	p.events = POLLOUT;
	if (poll(&p, 1, timeout_ms) <= 0) {
		close(fd);
		return -ETIME; /* our deadline, distinct from the kernel's ETIMEDOUT */
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
		err = errno;
	if (err) {
		close(fd);
		return -err;
	}
ok:
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

/* Connect, retrying refusals (the peer may not listen yet) until @timeout_ms. */
static int vs_connect_retry(uint32_t cid, uint32_t port, int type, int timeout_ms)
{
	int64_t end = xfer_now_ms() + timeout_ms;
	int fd;

	for (;;) {
		fd = vs_connect(cid, port, type, 3000);
		if (fd >= 0 || xfer_now_ms() >= end ||
		    (fd != -ECONNRESET && fd != -ETIMEDOUT && fd != -ETIME))
			return fd;
		usleep(200 * 1000);
	}
}

static int vs_listen(uint32_t port, int type)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK,
				 .svm_cid = VMADDR_CID_ANY,
				 .svm_port = port };
	int fd = socket(AF_VSOCK, type | SOCK_CLOEXEC, 0), err;

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 256) < 0) {
		err = errno;
		close(fd);
		return -err;
	}
	return fd;
}

/* accept with a deadline; Returns: fd or -errno (-ETIME on timeout). */
static int vs_accept(int lfd, int timeout_ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	int r = poll(&p, 1, timeout_ms);

	if (r == 0)
		return -ETIME;
	if (r < 0)
		return -errno;
	r = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	return r < 0 ? -errno : r;
}

static uint64_t new_id(void)
{
	return ((uint64_t)g.cid << 32) | (++g.seed * 1000u);
}

/*
 * Opens a guest -> host session with header @h (its id set here) on XFER_PORT_STREAM: connected,
 * send and receive timeouts of @timeout_ms, the header sent. Returns: the fd, or -1 (@d says why).
 */
static int g2h_open(struct xfer_hdr *h, int timeout_ms, char *d)
{
	int fd;

	h->id = new_id();
	fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
	if (fd < 0)
		return fail(d, "connect: %s", strerror(-fd));
	set_timeouts(fd, timeout_ms);
	if (send_full(fd, h, sizeof(*h)) < 0) {
		close(fd);
		return fail(d, "header send failed");
	}
	return fd;
}

/* ---- stream cases ---- */

/* One guest->host session of @mode; asks the host for its own verdict afterwards. */
static int g2h_session(char *d, uint32_t mode, uint64_t c2s, uint64_t s2c, int limit_s)
{
	struct xfer x;
	struct xfer_hdr h = { .mode = mode, .c2s = c2s, .s2c = s2c, .seed = g.seed * 7919u };
	int64_t t0 = xfer_now_ms();
	size_t n = 1;
	int fd;
	char why[DETAIL];

	h.id = new_id();
	fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
	if (fd < 0)
		return fail(d, "connect to host port %d: %s", XFER_PORT_STREAM, strerror(-fd));
	xfer_client_init(&x, fd, &h, NULL, false);
	if (xfer_run(&x, &n, 1, -1, 0, t0 + limit_s * 1000ll, NULL, 0))
		return fail(d, "%s", x.msg);
	if (req(why, sizeof(why), 30, "VERDICT %llu", (unsigned long long)h.id) < 0)
		return fail(d, "guest side ok, %s", why);
	int64_t ms = x.t1 - x.t0 > 0 ? x.t1 - x.t0 : 1;

	snprintf(d, DETAIL, "c2s %llu B, s2c %llu B in %lld ms (%.1f MB/s each way)",
		 (unsigned long long)c2s, (unsigned long long)s2c, (long long)ms,
		 (double)(c2s > s2c ? c2s : s2c) / 1e3 / ms);
	return 0;
}

/* Host-initiated sessions into a guest listener: ask the host to connect @count times. */
static int h2g_sessions(char *d, uint32_t mode, uint64_t c2s, uint64_t s2c, unsigned count,
			int limit_s)
{
	int64_t t0 = xfer_now_ms();
	struct xfer *v = calloc(count, sizeof(*v));
	size_t n = 0;
	int lfd, bad;
	unsigned tag;
	char why[DETAIL], host[DETAIL];
	uint64_t id = new_id();

	if (!v)
		return fail(d, "out of memory");
	lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);
	if (lfd < 0)
		return fail(d, "listen on port %d: %s", XFER_GPORT_STREAM, strerror(-lfd));
	tag = req_send("CONNECT %d %u %u %llu %llu %u %llu", XFER_GPORT_STREAM, count, mode,
		       (unsigned long long)c2s, (unsigned long long)s2c, g.seed * 104729u,
		       (unsigned long long)id);
	/* A host-side failure (e.g. uvsockd refused the CONNECT) must not cost the whole limit. */
	xfer_hint_fd = g.ctl.len ? -1 : g.ctl.fd;
	bad = xfer_run(v, &n, count, lfd, count, t0 + limit_s * 1000ll, why, sizeof(why));
	xfer_hint_fd = -1;
	close(lfd);
	xfer_summary(v, n, host, sizeof(host));
	if (bad)
		snprintf(d, DETAIL, "guest: %s%s%s", host, why[0] ? "; " : "", why);
	int hr = req_wait(tag, host, sizeof(host), limit_s);

	if (bad || hr < 0) {
		if (!bad)
			snprintf(d, DETAIL, "guest side ok, %s", host);
		else
			snprintf(d + strlen(d), DETAIL - strlen(d), " | %s", host);
		free(v);
		return -1;
	}
	int64_t ms = xfer_now_ms() - t0;

	snprintf(d, DETAIL,
		 "%u conn, c2s %llu B, s2c %llu B each, %lld ms (%.1f MB/s total); host: %s", count,
		 (unsigned long long)c2s, (unsigned long long)s2c, (long long)ms,
		 (double)(c2s + s2c) * count / 1e3 / (ms ? ms : 1), host);
	free(v);
	return 0;
}

static int c_hello(const char *arg, char *d)
{
	struct utsname u;
	char out[DETAIL];

	uname(&u);
	if (g.cid == VMADDR_CID_ANY || g.cid <= VMADDR_CID_HOST)
		return fail(d, "no virtio vsock device: local CID is %d", (int)g.cid);
	if (req(out, sizeof(out), 20, "HELLO %s cid=%u", u.release, g.cid) < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL, "kernel %s cid %u; host: %s", u.release, g.cid, out);
	return 0;
}

static int c_g2h_echo(const char *arg, char *d)
{
	return g2h_session(d, XM_ECHO, 4u << 20, 0, 120);
}

static int c_g2h_bulk(const char *arg, char *d)
{
	uint64_t b = arg ? strtoull(arg, NULL, 0) : g.bulk;

	return g2h_session(d, XM_DUPLEX, b, b, 570);
}

static int c_g2h_halfclose(const char *arg, char *d)
{
	return g2h_session(d, XM_HALFCLOSE, 1u << 20, 1u << 20, 60);
}

static int c_h2g_echo(const char *arg, char *d)
{
	return h2g_sessions(d, XM_ECHO, 4u << 20, 0, 1, 120);
}

static int c_h2g_bulk(const char *arg, char *d)
{
	uint64_t b = arg ? strtoull(arg, NULL, 0) : g.bulk;

	return h2g_sessions(d, XM_DUPLEX, b, b, 1, 570);
}

static int c_h2g_halfclose(const char *arg, char *d)
{
	return h2g_sessions(d, XM_HALFCLOSE, 1u << 20, 1u << 20, 1, 60);
}

static int c_h2g_many(const char *arg, char *d)
{
	unsigned n = arg ? (unsigned)strtoul(arg, NULL, 0) : g.many;

	return h2g_sessions(d, XM_DUPLEX, 65536, 65536, n, 240);
}

static int c_g2h_many(const char *arg, char *d)
{
	unsigned count = arg ? (unsigned)strtoul(arg, NULL, 0) : g.many;
	struct xfer *v = calloc(count, sizeof(*v));
	struct sockaddr_vm a = { .svm_family = AF_VSOCK,
				 .svm_cid = VMADDR_CID_HOST,
				 .svm_port = XFER_PORT_STREAM };
	int64_t t0 = xfer_now_ms();
	uint64_t base = new_id();
	size_t n = 0;
	char sum[DETAIL], host[DETAIL];
	int bad;

	if (!v)
		return fail(d, "out of memory");
	for (unsigned i = 0; i < count; i++) {
		struct xfer_hdr h = { .mode = XM_DUPLEX,
				      .c2s = 65536,
				      .s2c = 65536,
				      .seed = g.seed * 31u + i,
				      .id = base + i };
		int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

		if (fd < 0) {
			free(v);
			return fail(d, "socket #%u: %s", i, strerror(errno));
		}
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
			int e = errno;

			close(fd);
			free(v);
			return fail(d, "connect #%u: %s", i, strerror(e));
		}
		xfer_client_init(&v[n++], fd, &h, NULL, true);
	}
	bad = xfer_run(v, &n, count, -1, 0, t0 + 240000, NULL, 0);
	xfer_summary(v, n, sum, sizeof(sum));
	free(v);
	if (bad)
		return fail(d, "%s", sum);
	if (req(host, sizeof(host), 60, "VERDICTS %llu %u", (unsigned long long)base, count) < 0)
		return fail(d, "guest: %s; %s", sum, host);
	snprintf(d, DETAIL, "%u conn x 64 KiB each way in %lld ms; guest %s; host %s", count,
		 (long long)(xfer_now_ms() - t0), sum, host);
	return 0;
}

/* ---- SEQPACKET ---- */

static int c_g2h_seqpacket(const char *arg, char *d)
{
	char msg[DETAIL];
	int fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_SEQ, SOCK_SEQPACKET, 5000), r;

	if (fd < 0)
		return fail(d, "seqpacket connect to host port %d: %s", XFER_PORT_SEQ,
			    strerror(-fd));
	r = xfer_seq_client(fd, g.seed * 13u, 0, 20000, msg, sizeof(msg));
	close(fd);
	return r ? fail(d, "%s", msg) : (snprintf(d, DETAIL, "%s", msg), 0);
}

static int c_h2g_seqpacket(const char *arg, char *d)
{
	char msg[DETAIL], host[DETAIL];
	int lfd = vs_listen(XFER_GPORT_SEQ, SOCK_SEQPACKET), fd, r;
	unsigned tag;

	if (lfd < 0)
		return fail(d, "seqpacket listen: %s", strerror(-lfd));
	tag = req_send("SEQCONNECT %d %u 0", XFER_GPORT_SEQ, g.seed * 17u);
	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(tag, host, sizeof(host), 5);
		return fail(d, "no host connection: %s; %s", strerror(-fd), host);
	}
	r = xfer_seq_server(fd, 20000, msg, sizeof(msg));
	close(fd);
	if (req_wait(tag, host, sizeof(host), 30) < 0 || r)
		return fail(d, "guest: %s | %s", r ? msg : "ok", host);
	snprintf(d, DETAIL, "guest server ok; host client: %s", host);
	return 0;
}

/* ---- refused, half-close, close mid-stream ---- */

static int c_g2h_refused(const char *arg, char *d)
{
	int types[2] = { SOCK_STREAM, SOCK_SEQPACKET };
	const char *names[2] = { "stream", "seqpacket" };
	int64_t ms[2];

	for (int i = 0; i < 2; i++) {
		int64_t t0 = xfer_now_ms();
		int fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_NOBODY, types[i], 5000);

		ms[i] = xfer_now_ms() - t0;
		if (fd >= 0) {
			close(fd);
			return fail(d, "%s connect to host port %d (nobody listens) succeeded",
				    names[i], XFER_PORT_NOBODY);
		}
		if (fd != -ECONNRESET)
			return fail(d,
				    "%s connect to unlistened host port: %s after %lld ms "
				    "(want ECONNRESET at once)",
				    names[i], strerror(-fd), (long long)ms[i]);
		if (ms[i] > 1000)
			return fail(d, "%s: ECONNRESET only after %lld ms (want well under 2 s)",
				    names[i], (long long)ms[i]);
	}
	snprintf(d, DETAIL, "ECONNRESET after %lld ms (stream), %lld ms (seqpacket)",
		 (long long)ms[0], (long long)ms[1]);
	return 0;
}

static int c_h2g_refused(const char *arg, char *d)
{
	char out[DETAIL];

	if (req(out, sizeof(out), 20, "HREFUSED 6999") < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL, "host: %s", out);
	return 0;
}

/* Write until the peer is gone; Returns: errno of the failing send, or -ETIME. */
static int write_until_error(int fd, int timeout_ms, uint64_t *ret_bytes)
{
	int64_t end = xfer_now_ms() + timeout_ms;
	uint8_t *buf = xfer_scratch(0);
	uint64_t n = 0;

	xfer_pattern_fill(99, 0, buf, 65536);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	while (xfer_now_ms() < end) {
		ssize_t r = send(fd, buf, 65536, MSG_NOSIGNAL);

		if (r > 0) {
			n += r;
			continue;
		}
		if (r < 0 && errno != EAGAIN && errno != EINTR) {
			*ret_bytes = n;
			return errno;
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		poll(&p, 1, 100);
	}
	*ret_bytes = n;
	return -ETIME;
}

static int c_host_close(const char *arg, char *d)
{
	char host[DETAIL];
	uint64_t n;
	int e, fd, lfd;
	int64_t t0;
	uint8_t *buf = xfer_scratch(1);
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_ABORT, .c2s = 65536, .seed = 5 };

	/* (a) guest->host connection: the host reads 64 KiB, then closes with data in flight. */
	h.id = new_id();
	fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
	if (fd < 0)
		return fail(d, "connect: %s", strerror(-fd));
	if (send_full(fd, &h, sizeof(h)) < 0) {
		close(fd);
		return fail(d, "header send failed");
	}
	t0 = xfer_now_ms();
	e = write_until_error(fd, 15000, &n);
	int64_t ms_a = xfer_now_ms() - t0;

	if (e == -ETIME) {
		close(fd);
		return fail(d,
			    "g2h: host closed after 64 KiB but guest writes still succeed after "
			    "15 s (%llu B written): no RST/SHUTDOWN reached the guest",
			    (unsigned long long)n);
	}
	if (e != EPIPE && e != ECONNRESET) {
		close(fd);
		return fail(d, "g2h: send failed with %s (want EPIPE)", strerror(e));
	}
	set_timeouts(fd, 5000);
	ssize_t r = recv(fd, buf, 4096, 0);

	close(fd);
	if (r != 0 && !(r < 0 && errno == ECONNRESET))
		return fail(d, "g2h: after the host's close recv returned %zd (%s), want EOF", r,
			    r < 0 ? strerror(errno) : "data");
	if (req(host, sizeof(host), 20, "VERDICT %llu", (unsigned long long)h.id) < 0)
		return fail(d, "g2h: %s", host);

	/* (b) host->guest connection: the host writes 100000 B, then closes. */
	lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);
	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	unsigned tag = req_send("HCLOSE %d 100000", XFER_GPORT_STREAM);

	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(tag, host, sizeof(host), 5);
		return fail(d, "h2g: no connection: %s; %s", strerror(-fd), host);
	}
	set_timeouts(fd, 15000);
	uint64_t got = 0;

	for (;;) {
		r = recv(fd, buf, 65536, 0);
		if (r <= 0)
			break;
		if (xfer_pattern_check(77, got, buf, r) >= 0) {
			close(fd);
			return fail(d, "h2g: data mismatch near byte %llu",
				    (unsigned long long)got);
		}
		got += r;
	}
	if (r < 0 || got != 100000) {
		int er = errno;

		close(fd);
		return fail(d, "h2g: got %llu of 100000 B then %s", (unsigned long long)got,
			    r < 0 ? strerror(er) : "EOF");
	}
	t0 = xfer_now_ms();
	e = write_until_error(fd, 15000, &n);
	int64_t ms_b = xfer_now_ms() - t0;

	close(fd);
	if (req_wait(tag, host, sizeof(host), 10) < 0)
		return fail(d, "h2g: %s", host);
	if (e == -ETIME)
		return fail(d,
			    "h2g: host closed, guest saw EOF, but guest writes still succeed "
			    "after 15 s (%llu B): no RST reached the guest",
			    (unsigned long long)n);
	if (e != EPIPE && e != ECONNRESET)
		return fail(d, "h2g: send after host close failed with %s (want EPIPE)",
			    strerror(e));
	snprintf(d, DETAIL,
		 "g2h: send failed %s after %lld ms; h2g: EOF after 100000 B, send "
		 "failed %s after %lld ms (%llu B accepted first)",
		 e == EPIPE ? "EPIPE" : "ECONNRESET", (long long)ms_a, strerror(e), (long long)ms_b,
		 (unsigned long long)n);
	return 0;
}

static int c_guest_close(const char *arg, char *d)
{
	char host[DETAIL], host2[DETAIL];
	uint8_t *buf = xfer_scratch(1);
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_FLOOD, .seed = 6 };
	int fd, lfd;
	uint64_t got = 0;

	/* (a) guest->host: the host floods; the guest reads 64 KiB and closes. */
	fd = g2h_open(&h, 15000, d);
	if (fd < 0)
		return -1;
	while (got < 65536) {
		ssize_t r = recv(fd, buf, 65536, 0);

		if (r <= 0) {
			close(fd);
			return fail(d, "g2h: flood stopped after %llu B", (unsigned long long)got);
		}
		got += r;
	}
	close(fd);
	if (req(host, sizeof(host), 30, "VERDICT %llu", (unsigned long long)h.id) < 0)
		return fail(d, "g2h: %s", host);

	/* (b) host->guest: the host floods into our listener; we read 64 KiB and close. */
	lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);
	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	unsigned tag = req_send("HFLOOD %d", XFER_GPORT_STREAM);

	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(tag, host2, sizeof(host2), 5);
		return fail(d, "h2g: no connection: %s; %s", strerror(-fd), host2);
	}
	set_timeouts(fd, 15000);
	got = 0;
	while (got < 65536) {
		ssize_t r = recv(fd, buf, 65536, 0);

		if (r <= 0) {
			close(fd);
			req_wait(tag, host2, sizeof(host2), 5);
			return fail(d, "h2g: flood stopped after %llu B", (unsigned long long)got);
		}
		got += r;
	}
	close(fd);
	if (req_wait(tag, host2, sizeof(host2), 30) < 0)
		return fail(d, "h2g: %s", host2);
	snprintf(d, DETAIL, "g2h host writer: %s; h2g host writer: %s", host, host2);
	return 0;
}

/* ---- back-pressure ---- */

#define BP_TOTAL (16u << 20) /* bytes pushed through a stalled connection */
#define BP_MAX_BUFFERED (32u << 20) /* more accepted while the reader stalls = unbounded */
#define BP_MAX_RSS_GROWTH_KB (32 * 1024)

static int c_g2h_backpressure(const char *arg, char *d)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_STALL, .c2s = BP_TOTAL, .seed = 8 };
	uint8_t *buf = xfer_scratch(0);
	uint64_t off = 0;
	long rss0, rss1;
	char out[DETAIL];
	int fd;

	h.id = new_id();
	rss0 = host_rss_kb();
	fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
	if (fd < 0)
		return fail(d, "connect: %s", strerror(-fd));
	if (send_full(fd, &h, sizeof(h)) < 0) {
		close(fd);
		return fail(d, "header send failed");
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	/* Write until no progress for 1.5 s: the writer must end up blocked. */
	int64_t end = xfer_now_ms() + 60000;

	for (;;) {
		size_t n = BP_TOTAL - off < 65536 ? BP_TOTAL - off : 65536;
		ssize_t r;

		if (n == 0) {
			close(fd);
			return fail(d,
				    "all %u B accepted while the host reads nothing: no "
				    "back-pressure",
				    BP_TOTAL);
		}
		xfer_pattern_fill(h.seed, off, buf, n);
		r = send(fd, buf, n, MSG_NOSIGNAL);
		if (r > 0) {
			off += r;
			continue;
		}
		if (r < 0 && errno != EAGAIN) {
			int e = errno;

			close(fd);
			return fail(d, "send after %llu B: %s", (unsigned long long)off,
				    strerror(e));
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		if (poll(&p, 1, 1500) == 0)
			break;
		if (xfer_now_ms() > end) {
			close(fd);
			return fail(d, "writer never blocked (%llu B)", (unsigned long long)off);
		}
	}
	uint64_t stuck = off;

	rss1 = host_rss_kb();
	if (stuck > BP_MAX_BUFFERED || (rss0 > 0 && rss1 - rss0 > BP_MAX_RSS_GROWTH_KB)) {
		close(fd);
		return fail(d, "blocked after %llu B, uvsockd RSS %ld -> %ld kB: not bounded",
			    (unsigned long long)stuck, rss0, rss1);
	}
	if (req(out, sizeof(out), 15, "RELEASE %llu", (unsigned long long)h.id) < 0) {
		close(fd);
		return fail(d, "%s", out);
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	set_timeouts(fd, 30000);
	while (off < BP_TOTAL) {
		size_t n = BP_TOTAL - off < 65536 ? BP_TOTAL - off : 65536;
		int r;

		xfer_pattern_fill(h.seed, off, buf, n);
		r = send_full(fd, buf, n);
		if (r < 0) {
			close(fd);
			return fail(d, "send after release at %llu B: %s", (unsigned long long)off,
				    strerror(-r));
		}
		off += n;
	}
	close(fd);
	if (req(out, sizeof(out), 60, "VERDICT %llu", (unsigned long long)h.id) < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL,
		 "writer blocked after %llu B; uvsockd RSS %ld -> %ld kB; all %u B "
		 "then arrived intact",
		 (unsigned long long)stuck, rss0, rss1, BP_TOTAL);
	return 0;
}

/*
 * The host writes @total bytes (seed @seed) into a connection accepted from @lfd (closed here)
 * while this side reads nothing, until its writer blocks (@may_pass: or all were taken); uvsockd's
 * RSS must stay bounded; then everything is read and checked. @note starts the detail.
 */
static int h2g_stall(char *d, int lfd, uint32_t seed, unsigned total, bool may_pass,
		     const char *note)
{
	char out[DETAIL];
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0;
	int fd;
	unsigned tag;
	unsigned long long stuck;
	long rss0, rss1;

	tag = req_send("BPH2G %d %u %u %d", XFER_GPORT_STREAM, total, seed, may_pass);
	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(tag, out, sizeof(out), 5);
		return fail(d, "no connection: %s; %s", strerror(-fd), out);
	}
	/* Read nothing until the host says its writer is stuck. */
	for (;;) {
		char line[DETAIL], *sp;
		int r = ctl_recv(&g.ctl, line, sizeof(line), xfer_now_ms() + 60000);

		if (r < 0) {
			close(fd);
			return fail(d, "no STUCK from the host: %s", strerror(-r));
		}
		if (strtoul(line, &sp, 10) != tag || *sp != ' ')
			continue;
		if (sscanf(sp, " STUCK %llu %ld %ld", &stuck, &rss0, &rss1) == 3)
			break;
		close(fd);
		return fail(d, "host: %s", sp + 1);
	}
	if (stuck > BP_MAX_BUFFERED || (rss0 > 0 && rss1 - rss0 > BP_MAX_RSS_GROWTH_KB)) {
		ctl_send(&g.ctl, "%u ABORT", tag);
		close(fd);
		return fail(d,
			    "host writer blocked after %llu B, uvsockd RSS %ld -> %ld kB: not "
			    "bounded",
			    stuck, rss0, rss1);
	}
	ctl_send(&g.ctl, "%u GO", tag);
	set_timeouts(fd, 30000);
	for (;;) {
		ssize_t r = recv(fd, buf, 65536, 0), bad;

		if (r <= 0) {
			int e = errno;

			close(fd);
			if (r == 0 && got == total)
				break;
			req_wait(tag, out, sizeof(out), 5);
			return fail(d, "got %llu of %u B then %s; %s", (unsigned long long)got,
				    total, r ? strerror(e) : "EOF", out);
		}
		bad = xfer_pattern_check(seed, got, buf, r);
		if (bad >= 0) {
			close(fd);
			return fail(d, "data mismatch at byte %llu",
				    (unsigned long long)(got + bad));
		}
		got += r;
	}
	if (req_wait(tag, out, sizeof(out), 30) < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL,
		 "%shost writer %s %llu B; uvsockd RSS %ld -> %ld kB; all %u B then read intact",
		 note, stuck < total ? "blocked after" : "never blocked, guest took all", stuck,
		 rss0, rss1, total);
	return 0;
}

static int c_h2g_backpressure(const char *arg, char *d)
{
	int lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);

	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	return h2g_stall(d, lfd, 9, BP_TOTAL, false, "");
}

/* ---- siblings, survival, module reload ---- */

static int c_sib_server(const char *arg, char *d)
{
	int lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM), sfd, fd, r;
	struct xfer x;
	size_t n = 0;
	char why[DETAIL], msg[DETAIL];

	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	sfd = vs_listen(XFER_GPORT_SEQ, SOCK_SEQPACKET);
	if (sfd < 0) {
		close(lfd);
		return fail(d, "seqpacket listen: %s", strerror(-sfd));
	}
	printf("UVSOCK-INFO sibling listening on %u:%d and %u:%d\n", g.cid, XFER_GPORT_STREAM,
	       g.cid, XFER_GPORT_SEQ);
	fflush(stdout);
	if (xfer_run(&x, &n, 1, lfd, 1, xfer_now_ms() + 240000, why, sizeof(why))) {
		close(lfd);
		close(sfd);
		return fail(d, "stream: %s", n ? x.msg : why);
	}
	close(lfd);
	fd = vs_accept(sfd, 60000);
	close(sfd);
	if (fd < 0)
		return fail(d, "stream ok; no seqpacket connection: %s", strerror(-fd));
	r = xfer_seq_server(fd, 20000, msg, sizeof(msg));
	close(fd);
	if (r)
		return fail(d, "stream ok; seqpacket: %s", msg);
	snprintf(d, DETAIL, "served a sibling: stream %llu B each way, seqpacket ok",
		 (unsigned long long)x.h.c2s);
	return 0;
}

static int c_sib_client(const char *arg, char *d)
{
	uint32_t peer = arg ? (uint32_t)strtoul(arg, NULL, 0) : 4;
	struct xfer_hdr h = { .mode = XM_DUPLEX, .c2s = 8u << 20, .s2c = 8u << 20, .seed = 4242 };
	struct xfer x;
	size_t n = 1;
	char msg[DETAIL];
	int64_t t0 = xfer_now_ms();
	int fd, r;

	fd = vs_connect_retry(peer, XFER_GPORT_STREAM, SOCK_STREAM, 120000);
	if (fd < 0)
		return fail(d, "connect to sibling %u:%d: %s", peer, XFER_GPORT_STREAM,
			    strerror(-fd));
	h.id = new_id();
	xfer_client_init(&x, fd, &h, NULL, false);
	if (xfer_run(&x, &n, 1, -1, 0, xfer_now_ms() + 240000, NULL, 0))
		return fail(d, "stream: %s", x.msg);
	int64_t ms = x.t1 - x.t0 ? x.t1 - x.t0 : 1;

	fd = vs_connect_retry(peer, XFER_GPORT_SEQ, SOCK_SEQPACKET, 30000);
	if (fd < 0)
		return fail(d, "stream ok; seqpacket connect to sibling: %s", strerror(-fd));
	r = xfer_seq_client(fd, 4343, XF_CHECK_EOR, 20000, msg, sizeof(msg));
	close(fd);
	if (r)
		return fail(d, "stream ok; seqpacket: %s", msg);
	snprintf(d, DETAIL,
		 "cid %u -> %u: stream 8 MiB each way %.1f MB/s; seqpacket: %s "
		 "(total %lld ms)",
		 g.cid, peer, (double)(8u << 20) / 1e3 / ms, msg, (long long)(xfer_now_ms() - t0));
	return 0;
}

/* Echo ping-pong on one connection until the host answers HOLD (the other VM was killed). */
static int c_survive(const char *arg, char *d)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_ECHO, .c2s = UINT64_MAX, .seed = 10 };
	uint8_t *out = xfer_scratch(0), *in = xfer_scratch(1);
	uint64_t off = 0, rounds = 0;
	unsigned tag;
	int fd;
	char line[DETAIL];
	int64_t end = xfer_now_ms() + 280000;

	fd = g2h_open(&h, 10000, d);
	if (fd < 0)
		return -1;
	tag = req_send("HOLD");
	printf("UVSOCK-INFO survive: echoing until the host says the other VM is gone\n");
	fflush(stdout);
	for (;;) {
		struct pollfd p = { .fd = g.ctl.fd, .events = POLLIN };
		int r;

		xfer_pattern_fill(h.seed, off, out, 4096);
		if ((r = send_full(fd, out, 4096)) < 0 || (r = recv_full(fd, in, 4096)) < 0) {
			close(fd);
			return fail(d, "echo round %llu failed: %s", (unsigned long long)rounds,
				    strerror(-r));
		}
		if (memcmp(in, out, 4096) != 0) {
			close(fd);
			return fail(d, "echo round %llu: mismatch", (unsigned long long)rounds);
		}
		off += 4096;
		rounds++;
		if (g.ctl.len > 0 || poll(&p, 1, 0) > 0)
			break;
		if (xfer_now_ms() > end) {
			close(fd);
			return fail(d, "no HOLD answer from the host in time");
		}
	}
	close(fd);
	if (req_wait(tag, line, sizeof(line), 10) < 0)
		return fail(d, "%s", line);
	snprintf(d, DETAIL, "%llu echo rounds while the other VM was killed; host: %s",
		 (unsigned long long)rounds, line);
	return 0;
}

/* Stream to the host until this VM is killed (the harness kills QEMU mid-transfer). */
static int c_flood(const char *arg, char *d)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_SINK, .c2s = 4u << 20, .seed = 11 };
	uint8_t *buf = xfer_scratch(0);
	uint64_t off = 0;
	int fd, r;

	fd = g2h_open(&h, 30000, d);
	if (fd < 0)
		return -1;
	for (;;) {
		xfer_pattern_fill(h.seed, off, buf, 65536);
		if ((r = send_full(fd, buf, 65536)) < 0) {
			close(fd);
			return fail(d, "send at %llu: %s", (unsigned long long)off, strerror(-r));
		}
		off += 65536;
	}
}

static bool module_loaded(const char *name)
{
	FILE *f = fopen("/proc/modules", "r");
	char line[256];
	size_t l = strlen(name);
	bool yes = false;

	if (!f)
		return false;
	while (!yes && fgets(line, sizeof(line), f))
		yes = strncmp(line, name, l) == 0 && line[l] == ' ';
	fclose(f);
	return yes;
}

/* Path of module @name in /etc/uvsock/load-order, or NULL when it is built in. */
static bool module_path(const char *name, char *out, size_t len)
{
	FILE *f = fopen("/etc/uvsock/load-order", "r");
	char line[256], want[80];
	bool found = false;

	snprintf(want, sizeof(want), "/%s.ko", name);
	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (strlen(line) >= strlen(want) &&
		    strcmp(line + strlen(line) - strlen(want), want) == 0) {
			snprintf(out, len, "/lib/modules/%s", line);
			found = true;
		}
	}
	fclose(f);
	return found;
}

static int diag_list(char *out, size_t len);
static int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int run_cmd(const char *fmt, ...)
{
	char cmd[400];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* rmmod with retries: sockets still closing hold a reference on the transport. */
static int rmmod_wait(const char *name, int timeout_ms, int64_t *ret_ms)
{
	int64_t t0 = xfer_now_ms();

	while (module_loaded(name)) {
		if (run_cmd("rmmod %s 2>/dev/null", name) == 0)
			break;
		if (xfer_now_ms() - t0 > timeout_ms)
			return -1;
		usleep(250 * 1000);
	}
	*ret_ms = xfer_now_ms() - t0;
	return 0;
}

static int c_reload(const char *arg, char *d)
{
	const char *tr = "vmw_vsock_virtio_transport";
	char ptr[256], ppci[256], sub[DETAIL];
	bool pci_mod = module_path("virtio_pci", ppci, sizeof(ppci));
	uint32_t cid = g.cid;
	int rounds = arg ? atoi(arg) : 2;
	char log[DETAIL] = "";

	if (!module_path(tr, ptr, sizeof(ptr)))
		return fail(d, "%s is built in: cannot reload (and no reboot case here)", tr);
	if (g2h_session(sub, XM_ECHO, 65536, 0, 60))
		return fail(d, "before reload: %s", sub);
	for (int i = 0; i < rounds; i++) {
		int64_t t_tr = 0, t_pci = 0, t0;

		char left[300];
		int nleft = diag_list(left, sizeof(left));

		if (nleft > 0)
			snprintf(log + strlen(log), sizeof(log) - strlen(log),
				 "%s%d open before rmmod: %s", log[0] ? "; " : "", nleft, left);
		if (rmmod_wait(tr, 20000, &t_tr))
			return fail(d,
				    "round %d: rmmod %s still busy after 20 s (sockets not "
				    "released: a missing RST from the device?)",
				    i + 1, tr);
		if (pci_mod && (i & 1) == 0 && rmmod_wait("virtio_pci", 10000, &t_pci))
			return fail(d, "round %d: rmmod virtio_pci failed", i + 1);
		t0 = xfer_now_ms();
		if (pci_mod && !module_loaded("virtio_pci") && run_cmd("insmod %s", ppci) != 0)
			return fail(d, "round %d: insmod virtio_pci failed", i + 1);
		if (run_cmd("insmod %s", ptr) != 0)
			return fail(d, "round %d: insmod %s failed", i + 1, tr);
		while (local_cid() != cid) {
			if (xfer_now_ms() - t0 > 10000)
				return fail(d, "round %d: after reload the CID is %u, want %u",
					    i + 1, local_cid(), cid);
			usleep(100 * 1000);
		}
		int64_t up = xfer_now_ms() - t0;

		if (g2h_session(sub, XM_ECHO, 1u << 20, 0, 60))
			return fail(d, "round %d (after reload): g2h echo: %s", i + 1, sub);
		if (h2g_sessions(sub, XM_ECHO, 1u << 20, 0, 1, 60))
			return fail(d, "round %d (after reload): h2g echo: %s", i + 1, sub);
		snprintf(log + strlen(log), sizeof(log) - strlen(log),
			 "%sround %d: rmmod transport %lld ms%s, device back in %lld ms",
			 log[0] ? "; " : "", i + 1, (long long)t_tr,
			 (pci_mod && (i & 1) == 0) ? " + virtio_pci" : "", (long long)up);
	}
	snprintf(d, DETAIL, "%s; echo both ways after each", log);
	return 0;
}

/* ---- socket lifetime after close (vsock_diag) ---- */

/*
 * Is a vsock socket with local port @port still in the kernel's tables? A connected socket stays
 * there after close() until the peer's RST arrives or the 8 s close timeout fires, so this shows
 * whether the device finished the close handshake.
 * Returns: 1 present, 0 absent, -errno if vsock_diag cannot be queried.
 */
static int diag_has_port(uint32_t port)
{
	struct {
		struct nlmsghdr nlh;
		struct vsock_diag_req r;
	} q = { .nlh = { .nlmsg_len = sizeof(q),
			 .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
			 .nlmsg_seq = 1 },
		.r = { .sdiag_family = AF_VSOCK, .vdiag_states = ~0u } };
	char buf[16384];
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG), found = 0;

	if (fd < 0)
		return -errno;
	set_timeouts(fd, 2000);
	if (send(fd, &q, sizeof(q), 0) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		struct nlmsghdr *h = (struct nlmsghdr *)buf;

		if (n <= 0) {
			close(fd);
			return n < 0 ? -errno : -EPROTO;
		}
		for (; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE) {
				close(fd);
				return found;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				close(fd);
				return -EPROTO;
			}
			struct vsock_diag_msg *m = NLMSG_DATA(h);

			if (m->vdiag_src_port == port && m->vdiag_state != 10 /* TCP_LISTEN */)
				found = 1;
		}
	}
}

/* Describe connected (non-listening) vsock sockets still in the tables into @out. Returns count. */
static int diag_list(char *out, size_t len)
{
	struct {
		struct nlmsghdr nlh;
		struct vsock_diag_req r;
	} q = { .nlh = { .nlmsg_len = sizeof(q),
			 .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
			 .nlmsg_seq = 1 },
		.r = { .sdiag_family = AF_VSOCK, .vdiag_states = ~(1u << 10) /* not LISTEN */ } };
	char buf[16384];
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG), n_found = 0;

	out[0] = 0;
	if (fd < 0)
		return -errno;
	set_timeouts(fd, 2000);
	if (send(fd, &q, sizeof(q), 0) < 0) {
		close(fd);
		return -EIO;
	}
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		struct nlmsghdr *h = (struct nlmsghdr *)buf;

		if (n <= 0)
			break;
		for (; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
				close(fd);
				return n_found;
			}
			struct vsock_diag_msg *m = NLMSG_DATA(h);

			if (m->vdiag_state == 10)
				continue;
			if (n_found++ < 6)
				snprintf(out + strlen(out), len - strlen(out),
					 "%s[port %u -> %u:%u state %u shut %u]",
					 n_found > 1 ? " " : "", m->vdiag_src_port,
					 m->vdiag_dst_cid, m->vdiag_dst_port, m->vdiag_state,
					 m->vdiag_shutdown);
		}
	}
	close(fd);
	return n_found;
}

static uint32_t local_port(int fd)
{
	struct sockaddr_vm a;
	socklen_t l = sizeof(a);

	if (getsockname(fd, (struct sockaddr *)&a, &l) < 0)
		return 0;
	return a.svm_port;
}

/* Milliseconds until the socket of local port @port leaves the tables (max @limit_ms), or -1. */
static int64_t gone_after(uint32_t port, int64_t t_close, int limit_ms)
{
	for (;;) {
		int r = diag_has_port(port);

		if (r < 0)
			return -1;
		if (r == 0)
			return xfer_now_ms() - t_close;
		if (xfer_now_ms() - t_close > limit_ms)
			return limit_ms + 1;
		usleep(20 * 1000);
	}
}

#define CLOSE_RST_MAX_MS 1500 /* the guest's own close timeout is 8 s */

/* After each way a connection can end, the guest socket must be released promptly (RST). */
static int c_close_rst(const char *arg, char *d)
{
	char host[DETAIL], log[DETAIL] = "";
	uint8_t *buf = xfer_scratch(1);
	int64_t ms[5];
	const char *what[5] = { "g2h guest closes first", "g2h host closes first",
				"h2g host closes first", "h2g guest closes first",
				"g2h guest closes with data the host has not read yet" };

	int dr = diag_has_port(1);

	if (dr < 0)
		return fail(d, "vsock_diag not available: %s", strerror(-dr));
	char left[300];
	int nleft = diag_list(left, sizeof(left));

	if (nleft > 0)
		snprintf(log, sizeof(log), "(%d sockets of earlier cases still open: %s) ", nleft,
			 left);
	for (int i = 0; i < 5; i++) {
		uint32_t port;
		int fd, lfd = -1;
		unsigned tag = 0;
		int64_t t;

		if (i == 4) {
			/*
			 * 300000 B still buffered (the host stalls; more than its Unix
			 * socket takes, ~220 KB at most, so part waits inside uvsockd)
			 * when the guest closes; the host then reads everything, sees EOF
			 * and closes: only now can uvsockd end it with RST. It must fit
			 * without the host reading: uvsockd's buf_alloc (256 KiB) plus
			 * what the Unix socket took, 64 KiB at least (g2h_backpressure saw
			 * the writer block after 320 KiB once; 400000 B then hung here).
			 */
			struct xfer_hdr h = {
				.magic = XFER_MAGIC, .mode = XM_STALL, .c2s = 300000, .seed = 23
			};
			int r;

			h.id = new_id();
			fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
			if (fd < 0)
				return fail(d, "%s: connect: %s", what[i], strerror(-fd));
			port = local_port(fd);
			set_timeouts(fd, 10000);
			r = send_full(fd, &h, sizeof(h));
			for (uint64_t off = 0; r == 0 && off < h.c2s; off += 50000) {
				xfer_pattern_fill(h.seed, off, buf, 50000);
				r = send_full(fd, buf, 50000);
			}
			if (r < 0) {
				close(fd);
				return fail(d, "%s: send failed: %s", what[i], strerror(-r));
			}
			close(fd);
			if ((r = req(host, sizeof(host), 15, "RELEASE %llu",
				     (unsigned long long)h.id)) < 0 ||
			    (r = req(host, sizeof(host), 30, "VERDICT %llu",
				     (unsigned long long)h.id)) < 0)
				return fail(d, "%s: %s", what[i], host);
			t = xfer_now_ms();
			ms[i] = gone_after(port, t, 10000);
			snprintf(log + strlen(log), sizeof(log) - strlen(log),
				 "; %s: %lld ms after the "
				 "host closed",
				 what[i], (long long)ms[i]);
			continue;
		}
		if (i < 2) {
			/* ECHO: the guest closes first; HALFCLOSE: the host does. */
			struct xfer_hdr h = { .magic = XFER_MAGIC,
					      .mode = i ? XM_HALFCLOSE : XM_ECHO,
					      .c2s = 4096,
					      .s2c = i ? 4096 : 0,
					      .seed = 21 };

			h.id = new_id();
			fd = vs_connect(VMADDR_CID_HOST, XFER_PORT_STREAM, SOCK_STREAM, 5000);
			if (fd < 0)
				return fail(d, "%s: connect: %s", what[i], strerror(-fd));
			port = local_port(fd);
			set_timeouts(fd, 10000);
			xfer_pattern_fill(h.seed, 0, buf, 4096);
			if (send_full(fd, &h, sizeof(h)) < 0 || send_full(fd, buf, 4096) < 0) {
				close(fd);
				return fail(d, "%s: send failed", what[i]);
			}
			if (i == 1) {
				struct xfer_trailer tr;

				shutdown(fd, SHUT_WR);
				/* Payload, trailer, then EOF: the host has closed its end. */
				if (recv_full(fd, buf, 4096) < 0 ||
				    recv_full(fd, &tr, sizeof(tr)) < 0 ||
				    recv(fd, buf, 1, 0) != 0) {
					close(fd);
					return fail(d, "%s: no clean EOF from the host", what[i]);
				}
				/*
				 * The host answers VERDICT once its session has ended, i.e. after
				 * it closed its end: an acknowledgement that the close is on its
				 * way to uvsockd. Only the answer counts here, not the verdict.
				 */
				(void)req(host, sizeof(host), 10, "VERDICT %llu",
					  (unsigned long long)h.id);
			} else if (recv_full(fd, buf, 4096) < 0) {
				close(fd);
				return fail(d, "%s: echo failed", what[i]);
			}
		} else {
			lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);
			if (lfd < 0)
				return fail(d, "listen: %s", strerror(-lfd));
			tag = req_send(i == 2 ? "HCLOSE %d 4096" : "HFLOOD %d", XFER_GPORT_STREAM);
			fd = vs_accept(lfd, 20000);
			close(lfd);
			if (fd < 0) {
				req_wait(tag, host, sizeof(host), 5);
				return fail(d, "%s: no connection: %s; %s", what[i], strerror(-fd),
					    host);
			}
			port = local_port(fd);
			set_timeouts(fd, 10000);
			if (i == 2) {
				uint64_t got = 0;
				ssize_t r;

				while ((r = recv(fd, buf, 65536, 0)) > 0)
					got += r;
				if (r < 0 || got != 4096) {
					close(fd);
					req_wait(tag, host, sizeof(host), 5);
					return fail(d, "%s: got %llu of 4096 B before EOF", what[i],
						    (unsigned long long)got);
				}
				/* The host answers HCLOSE after it closed its end: wait for that
				 * acknowledgement before closing ours. */
				if (req_wait(tag, host, sizeof(host), 30) < 0) {
					close(fd);
					return fail(d, "%s: %s", what[i], host);
				}
				tag = 0;
			} else if (recv_full(fd, buf, 4096) < 0) {
				close(fd);
				req_wait(tag, host, sizeof(host), 5);
				return fail(d, "%s: no data", what[i]);
			}
		}
		t = xfer_now_ms();
		close(fd);
		ms[i] = gone_after(port, t, 10000);
		if (tag && req_wait(tag, host, sizeof(host), 30) < 0)
			return fail(d, "%s: %s", what[i], host);
		snprintf(log + strlen(log), sizeof(log) - strlen(log), "%s%s: %lld ms",
			 i ? "; " : "", what[i], (long long)ms[i]);
		(void)0;
	}
	for (int i = 0; i < 5; i++)
		if (ms[i] < 0 || ms[i] > CLOSE_RST_MAX_MS)
			return fail(
				d,
				"guest socket still open %lld ms after close() (%s): the device "
				"did not end the close handshake with RST; all: %s",
				(long long)ms[i], what[i], log);
	snprintf(d, DETAIL, "socket released after close: %s", log);
	return 0;
}

/* Many 1-byte host writes while the guest does not read (the 6.12 tiny-packet mitigation). */
static int c_h2g_tiny(const char *arg, char *d)
{
	unsigned count = arg ? (unsigned)strtoul(arg, NULL, 0) : 100000;
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0;
	char host[DETAIL];
	int lfd, fd;
	unsigned tag;
	ssize_t r;

	lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);
	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	tag = req_send("TINY %d %u", XFER_GPORT_STREAM, count);
	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(tag, host, sizeof(host), 5);
		return fail(d, "no connection: %s; %s", strerror(-fd), host);
	}
	/* Let the host's tiny writes pile up before reading anything. */
	if (req_wait(tag, host, sizeof(host), 60) < 0) {
		close(fd);
		return fail(d, "%s", host);
	}
	set_timeouts(fd, 20000);
	while ((r = recv(fd, buf, 65536, 0)) > 0) {
		if (xfer_pattern_check(31, got, buf, r) >= 0) {
			close(fd);
			return fail(d, "data mismatch near byte %llu", (unsigned long long)got);
		}
		got += r;
	}
	int e = errno;

	close(fd);
	if (r < 0 || got != count)
		return fail(d, "got %llu of %u B, then %s", (unsigned long long)got, count,
			    r < 0 ? strerror(e) : "EOF");
	snprintf(d, DETAIL,
		 "%u one-byte host writes queued while the guest slept, all read intact "
		 "(host: %s)",
		 count, host);
	return 0;
}

/* Tell the host helper, then (after the result line) the runner reboots the guest. */
static int c_reboot(const char *arg, char *d)
{
	char out[DETAIL];

	if (req(out, sizeof(out), 10, "REBOOT") < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL, "rebooting the guest (boot %s done)", out);
	return 0;
}

/* ---- packet trace through vsockmon (debugging aid: uvsock.trace=PORT|all) ---- */

static const char *op_name(unsigned op)
{
	static const char *n[] = { "INVALID",  "REQUEST", "RESPONSE",	   "RST",
				   "SHUTDOWN", "RW",	  "CREDIT_UPDATE", "CREDIT_REQUEST" };

	return op < 8 ? n[op] : "OP?";
}

/*
 * Print every virtio-vsock packet this guest sends or receives (as the vsockmon tap sees it,
 * i.e. the guest driver's view) whose source or destination port is @port (0 = all), one
 * "UVSOCK-TRACE" line each; runs of RW packets in one direction are summed into one line.
 * Never returns unless setting up the tap fails.
 */
/* The write end of the pipe the tracer acknowledges its start on (-1: nobody waits). */
static int trace_ready_fd = -1;

static int trace(uint32_t port)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL) };
	unsigned char buf[70000];
	int64_t t0 = xfer_now_ms(), rw_t = 0;
	uint64_t rw_bytes = 0;
	unsigned rw_n = 0;
	char rw_dir[64] = "";
	int fd;

	if (run_cmd("ip link add name vsockmon0 type vsockmon 2>/dev/null; ip link set vsockmon0 "
		    "up") != 0 ||
	    !(sll.sll_ifindex = (int)if_nametoindex("vsockmon0"))) {
		printf("UVSOCK-INFO trace: no vsockmon0 (module vsockmon missing?)\n");
		return 1;
	}
	fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
	if (fd < 0 || bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0) {
		printf("UVSOCK-INFO trace: AF_PACKET: %s\n", strerror(errno));
		return 1;
	}
	int rb = 32 << 20;

	/* Bursts of RW frames must not push the control packets out of the receive queue. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rb, sizeof(rb));
	printf("UVSOCK-INFO trace: capturing port %s on vsockmon0\n", port ? "filter" : "all");
	fflush(stdout);
	if (trace_ready_fd >= 0) {
		(void)!write(trace_ready_fd, "R", 1);
		close(trace_ready_fd);
		trace_ready_fd = -1;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, 200);

		if (rw_n && (pr == 0 || xfer_now_ms() - rw_t > 200)) {
			printf("UVSOCK-TRACE +%lld %s RW x%u %llu B\n", (long long)(rw_t - t0),
			       rw_dir, rw_n, (unsigned long long)rw_bytes);
			fflush(stdout);
			rw_n = 0;
			rw_bytes = 0;
		}
		if (pr == 0) {
			struct tpacket_stats st;
			socklen_t sl = sizeof(st);

			if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &sl) == 0 &&
			    st.tp_drops)
				printf("UVSOCK-TRACE capture dropped %u frames\n", st.tp_drops);
		}
		if (pr <= 0)
			continue;
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		struct af_vsockmon_hdr mh;
		struct virtio_vsock_hdr vh;
		char dir[64];

		if (n < (ssize_t)(sizeof(mh) + sizeof(vh)))
			continue;
		memcpy(&mh, buf, sizeof(mh));
		if (mh.transport != AF_VSOCK_TRANSPORT_VIRTIO || mh.len < sizeof(vh))
			continue;
		memcpy(&vh, buf + sizeof(mh), sizeof(vh));
		if (port && vh.src_port != port && vh.dst_port != port)
			continue;
		snprintf(dir, sizeof(dir), "%u:%u > %u:%u", (unsigned)vh.src_cid, vh.src_port,
			 (unsigned)vh.dst_cid, vh.dst_port);
		if (vh.op == VIRTIO_VSOCK_OP_RW) {
			if (rw_n && strcmp(dir, rw_dir) != 0) {
				printf("UVSOCK-TRACE +%lld %s RW x%u %llu B\n",
				       (long long)(rw_t - t0), rw_dir, rw_n,
				       (unsigned long long)rw_bytes);
				rw_n = 0;
				rw_bytes = 0;
			}
			if (!rw_n)
				rw_t = xfer_now_ms();
			snprintf(rw_dir, sizeof(rw_dir), "%s", dir);
			rw_n++;
			rw_bytes += vh.len;
			continue;
		}
		if (rw_n) {
			printf("UVSOCK-TRACE +%lld %s RW x%u %llu B\n", (long long)(rw_t - t0),
			       rw_dir, rw_n, (unsigned long long)rw_bytes);
			rw_n = 0;
			rw_bytes = 0;
		}
		printf("UVSOCK-TRACE +%lld %s %s type %u flags 0x%x buf_alloc %u fwd_cnt %u\n",
		       (long long)(xfer_now_ms() - t0), dir, op_name(vh.op), vh.type, vh.flags,
		       vh.buf_alloc, vh.fwd_cnt);
		fflush(stdout);
	}
}

/* ---- loopback self-test (no device needed: proves the guest program on a real kernel) ---- */

static int lo_pair(char *d, uint32_t mode, uint64_t c2s, uint64_t s2c, unsigned count)
{
	int lfd = vs_listen(7000, SOCK_STREAM);
	pid_t pid;
	int st, bad;
	struct xfer *v;
	size_t n = 0;
	char why[DETAIL], sum[DETAIL];

	if (lfd < 0)
		return fail(d, "loopback listen: %s", strerror(-lfd));
	pid = fork();
	if (pid == 0) {
		struct xfer *c = calloc(count, sizeof(*c));
		size_t m = 0;

		for (unsigned i = 0; i < count; i++) {
			struct xfer_hdr h = {
				.mode = mode, .c2s = c2s, .s2c = s2c, .seed = 500 + i, .id = i
			};
			int fd = vs_connect(VMADDR_CID_LOCAL, 7000, SOCK_STREAM, 5000);

			if (fd < 0)
				_exit(2);
			xfer_client_init(&c[m++], fd, &h, NULL, false);
		}
		_exit(xfer_run(c, &m, count, -1, 0, xfer_now_ms() + 120000, NULL, 0) ? 1 : 0);
	}
	v = calloc(count, sizeof(*v));
	bad = xfer_run(v, &n, count, lfd, count, xfer_now_ms() + 120000, why, sizeof(why));
	close(lfd);
	waitpid(pid, &st, 0);
	xfer_summary(v, n, sum, sizeof(sum));
	free(v);
	if (bad || !WIFEXITED(st) || WEXITSTATUS(st))
		return fail(d, "server: %s %s; client exit %d", sum, why,
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	snprintf(d, DETAIL, "%u session(s) mode %u over vsock loopback: %s", count, mode, sum);
	return 0;
}

static int c_lo_stream(const char *arg, char *d)
{
	int64_t t0 = xfer_now_ms();

	if (lo_pair(d, XM_ECHO, 1u << 20, 0, 1) || lo_pair(d, XM_DUPLEX, 8u << 20, 8u << 20, 1) ||
	    lo_pair(d, XM_HALFCLOSE, 1u << 20, 1u << 20, 1) ||
	    lo_pair(d, XM_DUPLEX, 65536, 65536, 50))
		return -1;
	snprintf(d, DETAIL, "echo, duplex 8 MiB, half-close, 50 concurrent: ok in %lld ms",
		 (long long)(xfer_now_ms() - t0));
	return 0;
}

static int c_lo_seqpacket(const char *arg, char *d)
{
	int lfd = vs_listen(7001, SOCK_SEQPACKET), fd, st;
	pid_t pid;
	char msg[DETAIL];

	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	pid = fork();
	if (pid == 0) {
		int c = vs_connect(VMADDR_CID_LOCAL, 7001, SOCK_SEQPACKET, 5000);
		char m[DETAIL];

		if (c < 0)
			_exit(2);
		_exit(xfer_seq_client(c, 77, XF_CHECK_EOR, 10000, m, sizeof(m)) ? 1 : 0);
	}
	fd = vs_accept(lfd, 10000);
	close(lfd);
	if (fd < 0) {
		waitpid(pid, &st, 0);
		return fail(d, "accept: %s", strerror(-fd));
	}
	int r = xfer_seq_server(fd, 10000, msg, sizeof(msg));

	close(fd);
	waitpid(pid, &st, 0);
	if (r || !WIFEXITED(st) || WEXITSTATUS(st))
		return fail(d, "server: %s; client exit %d", msg,
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	snprintf(d, DETAIL, "seqpacket over loopback with exact MSG_EOR: ok");
	return 0;
}

static int c_lo_refused(const char *arg, char *d)
{
	int64_t t0 = xfer_now_ms();
	int fd = vs_connect(VMADDR_CID_LOCAL, 7999, SOCK_STREAM, 5000);

	if (fd >= 0) {
		close(fd);
		return fail(d, "connect to an unused loopback port succeeded");
	}
	if (fd != -ECONNRESET)
		return fail(d, "loopback refusal: %s", strerror(-fd));
	snprintf(d, DETAIL, "ECONNRESET after %lld ms", (long long)(xfer_now_ms() - t0));
	return 0;
}

static int c_ctl(const char *arg, char *d)
{
	struct utsname u;
	char out[DETAIL];

	uname(&u);
	if (req(out, sizeof(out), 20, "HELLO %s cid=any", u.release) < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL, "control channel ok; host: %s", out);
	return 0;
}

/* ---- unmodified AF_VSOCK host programs through uvsock-run (docs/shim.md) ---- */

/* Reads until EOF (stream) or one message (seqpacket), at most len-1 bytes, within 20 s. */
static ssize_t read_reply(int fd, int type, char *buf, size_t len)
{
	size_t got = 0;

	set_timeouts(fd, 20000);
	for (;;) {
		ssize_t n = recv(fd, buf + got, len - 1 - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		got += (size_t)n;
		if (n == 0 || type == SOCK_SEQPACKET || got == len - 1)
			break;
	}
	buf[got] = '\0';
	return (ssize_t)got;
}

/*
 * Host -> guest: the host helper runs socat/ncat (uvsock-run) connecting to our port; we echo
 * what it sends (to its EOF, or one message), and the helper checks that it printed the echo.
 */
static int shim_h2g_one(const char *name, uint32_t port, int type, char *d)
{
	char out[DETAIL], buf[256];
	int lfd = vs_listen(port, type), fd;
	unsigned tag;
	ssize_t n;

	if (lfd < 0)
		return fail(d, "%s: listen on port %u: %s", name, port, strerror(-lfd));
	if (req(out, sizeof(out), 20, "SHIMRUN %s %u", name, port) < 0) {
		close(lfd);
		return fail(d, "%s: %s", name, out);
	}
	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0)
		return fail(d, "%s: no connection from the host program: %s", name, strerror(-fd));
	n = read_reply(fd, type, buf, sizeof(buf));
	if (n > 0)
		send_full(fd, buf, (size_t)n);
	close(fd);
	tag = req_send("SHIMWAIT %s", name);
	if (req_wait(tag, out, sizeof(out), 30) < 0)
		return fail(d, "%s", out);
	return 0;
}

/* Guest -> host: the helper runs socat/ncat listening; we connect to CID 2 and talk to it. */
static int shim_g2h_one(const char *name, uint32_t port, int type, char *d)
{
	char out[DETAIL], line[80], buf[256], want[80];
	int fd;
	ssize_t n;

	if (req(out, sizeof(out), 30, "SHIMRUN %s %u", name, port) < 0)
		return fail(d, "%s: %s", name, out);
	fd = vs_connect(VMADDR_CID_HOST, port, type, 10000);
	if (fd < 0)
		return fail(d, "%s: connect to host port %u: %s", name, port, strerror(-fd));
	snprintf(line, sizeof(line), "shim-guest-%s\n", name);
	send_full(fd, line, strlen(line));
	if (type == SOCK_STREAM)
		shutdown(fd, SHUT_WR);
	n = read_reply(fd, type, buf, sizeof(buf));
	close(fd);
	snprintf(want, sizeof(want), "shim-host-%s\n", name);
	if (n < 0 || strcmp(buf, want) != 0)
		return fail(d, "%s: got '%.60s' (%s), want '%s'", name, n < 0 ? "" : buf,
			    n < 0 ? strerror((int)-n) : "ok", want);
	if (req(out, sizeof(out), 30, "SHIMWAIT %s", name) < 0)
		return fail(d, "%s", out);
	return 0;
}

/* The scenarios of shim_h2g and shim_g2h (the helper's shim_scns names them too). */
static const struct {
	const char *name;
	uint32_t port;
	int type;
	bool g2h;
} shim_cases[] = {
	{ "socat-connect", 7100, SOCK_STREAM, false },
	{ "socat-connect-seq", 7101, SOCK_SEQPACKET, false },
	{ "ncat-connect", 7102, SOCK_STREAM, false },
	{ "socat-listen", 7110, SOCK_STREAM, true },
	{ "socat-listen-seq", 7111, SOCK_SEQPACKET, true },
	{ "ncat-listen", 7112, SOCK_STREAM, true },
};

static int shim_run_all(bool g2h, char *d)
{
	for (size_t i = 0; i < sizeof(shim_cases) / sizeof(shim_cases[0]); i++) {
		if (shim_cases[i].g2h != g2h)
			continue;
		if ((g2h ? shim_g2h_one : shim_h2g_one)(shim_cases[i].name, shim_cases[i].port,
							shim_cases[i].type, d) < 0)
			return -1;
	}
	snprintf(d, DETAIL, "%s", g2h ? "socat VSOCK-LISTEN (stream, seqpacket), ncat --vsock -l"
				      : "socat VSOCK-CONNECT (stream, seqpacket), ncat --vsock");
	return 0;
}

static int c_shim_h2g(const char *arg, char *d)
{
	return shim_run_all(false, d);
}

static int c_shim_g2h(const char *arg, char *d)
{
	return shim_run_all(true, d);
}

static int c_shim_refused(const char *arg, char *d)
{
	char out[DETAIL];

	if (req(out, sizeof(out), 20, "SHIMRUN socat-refused %u", XFER_PORT_NOBODY) < 0 ||
	    req(out, sizeof(out), 30, "SHIMWAIT socat-refused") < 0)
		return fail(d, "%s", out);
	snprintf(d, DETAIL, "%s", out);
	return 0;
}

/* ---- the kernel's own suite: vsock_test client here, its server on the host (uvsock-run) ---- */

#define VT_CTL_TCP 41236 /* the helper's VT_CTL_TCP; guest TCP -> vsock 2:1235 -> host TCP */

/*
 * arg: test ids to skip, '.'-separated ("9.10"): vsock_test ends at its first failing test, so
 * the cases that cannot pass are skipped to run the rest (docs/shim.md lists them and why).
 */
/* Starts argv (vsock_test) with its output into *out_fd. Returns the pid or -1. */
static pid_t vt_start(char **argv, int *out_fd)
{
	int pfd[2];
	pid_t pid;

	if (pipe(pfd) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(pfd[1]);
	if (pid < 0)
		close(pfd[0]);
	*out_fd = pfd[0];
	return pid;
}

/* Its output lines on the console as "UVSOCK-VT <line>" until it ends; returns its wait status
 * and counts its passed tests in *oks. */
static int vt_collect(pid_t pid, int fd, int *oks)
{
	char line[512];
	FILE *f = fdopen(fd, "r");
	int st = -1;

	*oks = 0;
	while (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		printf("UVSOCK-VT %s\n", line);
		fflush(stdout);
		*oks += line[0] >= '0' && line[0] <= '9' && strstr(line, "...ok") != NULL;
	}
	if (f)
		fclose(f);
	waitpid(pid, &st, 0);
	return st;
}

/*
 * The kernel's vsock_test with the guest as `mode` (client: the host's half is the server, and
 * the reverse). arg: test ids to skip, '.'-separated ("6.9"): vsock_test ends at its first
 * failing test, so the cases that cannot pass over the hybrid path are skipped to run the rest
 * (docs/shim.md lists them and why).
 */
static int vsock_test_as(const char *mode, const char *arg, char *d)
{
	bool client = strcmp(mode, "client") == 0;
	char out[DETAIL], port[16], *argv[40], skips[20][24], opt_mode[24], opt_port[32];
	int n = 0, st, oks = 0, fd = -1;
	pid_t relay = -1, self = -1;

	if (access("/bin/vsock_test", X_OK) != 0)
		return fail(d, "no /bin/vsock_test in the initramfs (linux-source not cached)");
	run_cmd("ifconfig lo 127.0.0.1 up");
	snprintf(opt_mode, sizeof(opt_mode), "--mode=%s", mode);
	snprintf(opt_port, sizeof(opt_port), "--control-port=%d", VT_CTL_TCP + !client);
	argv[n++] = "/bin/vsock_test";
	argv[n++] = opt_mode;
	argv[n++] = "--control-host=127.0.0.1";
	argv[n++] = opt_port;
	argv[n++] = "--peer-cid=2";
	for (const char *a = arg; a && *a && n < 20;) {
		snprintf(skips[n], sizeof(skips[n]), "--skip=%d", atoi(a));
		argv[n] = skips[n];
		n++;
		a = strchr(a, '.');
		a = a ? a + 1 : NULL;
	}
	argv[n] = NULL;
	snprintf(port, sizeof(port), "%d", VT_CTL_TCP + !client);
	if (client) {
		/* Control: guest TCP -> vsock host port 1235 -> the host helper's relay. */
		if (req(out, sizeof(out), 40, "VTSERVER") < 0)
			return fail(d, "%s", out);
		relay = fork();
		if (relay == 0) {
			execl("/bin/busybox", "nc", "-l", "-p", port, "-e", "/bin/uvsock-guest",
			      "connect", "2", "1235", (char *)NULL);
			_exit(127);
		}
		for (int i = 0; i < 100 && !xfer_tcp_listening(VT_CTL_TCP); i++)
			usleep(50000);
		self = vt_start(argv, &fd);
	} else {
		/* Control: our server's TCP port <- relay <- vsock 1236 <- the host's socat. */
		self = vt_start(argv, &fd);
		for (int i = 0; i < 100 && !xfer_tcp_listening(VT_CTL_TCP + 1); i++)
			usleep(50000);
		relay = fork();
		if (relay == 0) {
			execl("/bin/busybox", "nc", "127.0.0.1", port, "-e", "/bin/uvsock-guest",
			      "listen", "1236", (char *)NULL);
			_exit(127);
		}
		usleep(300000); /* the relay's vsock listener, before the host connects */
		if (self > 0 && req(out, sizeof(out), 40, "VTCLIENT") < 0) {
			kill(self, SIGKILL);
			kill(relay, SIGKILL);
			(void)vt_collect(self, fd, &oks);
			waitpid(relay, NULL, 0);
			return fail(d, "%s", out);
		}
	}
	if (self < 0)
		return fail(d, "cannot start vsock_test: %s", strerror(errno));
	st = vt_collect(self, fd, &oks);
	if (relay > 0) {
		kill(relay, SIGKILL);
		waitpid(relay, NULL, 0);
	}
	if (req(out, sizeof(out), 300, "VTWAIT") < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return fail(d, "guest %s: %d tests ok, exit %d; %s", mode, oks,
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
	snprintf(d, DETAIL, "guest %s: %d tests ok (skipped: %s); host: %s", mode, oks,
		 arg && *arg ? arg : "none", out);
	return 0;
}

static int c_vsock_test(const char *arg, char *d)
{
	return vsock_test_as("client", arg, d);
}

static int c_vsock_test_server(const char *arg, char *d)
{
	return vsock_test_as("server", arg, d);
}

/* ---- new-kernel behaviour (issue 13 item 2; docs/interop.md, cases 12-17) ---- */

/*
 * Sends @len bytes of @buf with @flags, retrying short sends and EINTR; *calls counts the
 * send() calls that took bytes (each MSG_ZEROCOPY one gets its own completion number).
 * Returns: 0 or -errno.
 */
static int send_flags(int fd, const uint8_t *buf, size_t len, int flags, uint32_t *calls)
{
	while (len > 0) {
		ssize_t r = send(fd, buf, len, flags | MSG_NOSIGNAL);

		if (r < 0 && errno == ENOBUFS && (flags & MSG_ZEROCOPY)) {
			/* Out of optmem for notifications: reap some, then retry. */
			struct pollfd p = { .fd = fd, .events = 0 };

			poll(&p, 1, 100);
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		buf += r;
		len -= (size_t)r;
		(*calls)++;
	}
	return 0;
}

/* SIOCINQ/SIOCOUTQ of @fd; Returns: the count, or -errno (no such ioctl on this kernel). */
static long sioc(int fd, unsigned long req)
{
	int v = 0;

	return ioctl(fd, req, &v) < 0 ? -errno : v;
}

/* Polls @fd's @req until it equals @want or @ms pass. Returns: the last value (or -errno). */
static long sioc_wait(int fd, unsigned long req, long want, int ms)
{
	int64_t end = xfer_now_ms() + ms;
	long v;

	while ((v = sioc(fd, req)) >= 0 && v != want && xfer_now_ms() < end)
		usleep(5000);
	return v;
}

/* MSG_ZEROCOPY completions seen on a socket (linux Documentation/networking/msg_zerocopy.rst). */
struct zc_seen {
	uint32_t next; /* highest completed id + 1 */
	uint32_t ids; /* ids completed, summed over the notifications' ranges */
	uint32_t copied; /* of those, ids the kernel copied instead (SO_EE_CODE_ZEROCOPY_COPIED) */
};

/* Reads the completion notifications queued on @fd's error queue. Returns: 0 or -errno. */
static int zc_reap(int fd, struct zc_seen *z)
{
	for (;;) {
		char ctrl[CMSG_SPACE(sizeof(struct sock_extended_err)) + 64];
		struct msghdr m = { .msg_control = ctrl, .msg_controllen = sizeof(ctrl) };
		struct cmsghdr *cm;
		struct sock_extended_err *ee;

		if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
			return errno == EAGAIN ? 0 : -errno;
		cm = CMSG_FIRSTHDR(&m);
		if (!cm)
			return -EPROTO;
		ee = (struct sock_extended_err *)CMSG_DATA(cm);
		if (ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY || ee->ee_errno != 0 ||
		    ee->ee_data < ee->ee_info)
			return -EPROTO;
		if (ee->ee_data + 1 > z->next)
			z->next = ee->ee_data + 1;
		z->ids += ee->ee_data - ee->ee_info + 1;
		if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
			z->copied += ee->ee_data - ee->ee_info + 1;
	}
}

/*
 * After the host has read everything: waits (up to 5 s) until the kernel has sent every byte
 * (SIOCOUTQ 0 where it exists) and completed at least @sends ids with no gap. Returns: 0 or -1.
 */
static int zc_wait_all(int fd, uint32_t sends, struct zc_seen *z)
{
	int64_t end = xfer_now_ms() + 5000;

	for (;;) {
		bool drained = sioc(fd, SIOCOUTQ) <= 0; /* 0, or no such ioctl */

		if (zc_reap(fd, z) < 0)
			return -1;
		if (drained && z->ids >= sends && z->ids == z->next)
			return 0;
		if (xfer_now_ms() > end)
			return -1;
		usleep(20 * 1000);
	}
}

#define MD_TOTAL (8u << 20) /* bytes of g2h_multidesc */

/*
 * g2h_multidesc: guest -> host sends that newer kernels put into TX packets of several
 * descriptors: MSG_ZEROCOPY (payload in page fragments pinned from the user buffer, 6.7+ and
 * 6.12.68+) alternating with plain large sends (non-linear skbs on 7.x). The host checks every
 * byte and hashes the stream; the hash must equal the guest's.
 */
static int c_g2h_multidesc(const char *arg, char *d)
{
	/*
	 * Zerocopy sends (even indexes) stay within one packet's 64 KiB and the credit, or the
	 * kernel copies them (virtio_transport_can_zcopy: the whole iov must go at once); the
	 * plain ones are large.
	 */
	static const size_t sizes[] = { 65536, 1u << 20, 32768, 200000,
					61440, 300001,  16384,  1000 };
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_COUNT, .c2s = MD_TOTAL, .seed = 51 };
	uint8_t *buf = malloc(MD_TOTAL);
	uint32_t zc_sends = 0, plain = 0;
	struct zc_seen z = { 0 };
	uint64_t off = 0, hash;
	char out[DETAIL], zc_note[160], hs[40];
	int one = 1, fd, zc, r = 0;

	if (!buf)
		return fail(d, "out of memory");
	/* Filled once and never written again: zerocopy sends may still reference it. */
	xfer_pattern_fill(h.seed, 0, buf, MD_TOTAL);
	hash = xfer_hash(XFER_HASH_INIT, buf, MD_TOTAL);
	fd = g2h_open(&h, 30000, d);
	if (fd < 0) {
		free(buf);
		return -1;
	}
	zc = setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0 ? 0 : errno;
	for (unsigned i = 0; r == 0 && off < MD_TOTAL; i++) {
		size_t n = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
		bool zs = !zc && (i & 1) == 0;

		if (zs) /* the one before went out: wait for the credit it took */
			sioc_wait(fd, SIOCOUTQ, 0, 1000);

		if (n > MD_TOTAL - off)
			n = MD_TOTAL - off;
		r = send_flags(fd, buf + off, n, zs ? MSG_ZEROCOPY : 0, zs ? &zc_sends : &plain);
		off += n;
	}
	if (r == 0)
		shutdown(fd, SHUT_WR);
	if (r < 0 || req(out, sizeof(out), 60, "VERDICT %llu", (unsigned long long)h.id) < 0) {
		close(fd);
		free(buf);
		if (r < 0)
			return fail(d, "send at %llu B: %s", (unsigned long long)off, strerror(-r));
		return fail(d, "%s", out);
	}
	/* Every zerocopy send must be completed (its pages released) before the buffer goes. */
	r = zc ? 0 : zc_wait_all(fd, zc_sends, &z);
	close(fd);
	free(buf);
	if (r < 0)
		return fail(d, "MSG_ZEROCOPY: %u sends, completions for ids 0..%u with %u in all",
			    zc_sends, z.next, z.ids);
	if (!zc && z.copied == z.ids)
		return fail(d, "MSG_ZEROCOPY: the kernel copied all %u sends: no page-fragment "
			    "descriptors reached the device", zc_sends);
	snprintf(hs, sizeof(hs), "hash %016llx", (unsigned long long)hash);
	if (!strstr(out, hs))
		return fail(d, "host hashed another stream: guest %s, %s", hs, out);
	if (zc)
		snprintf(zc_note, sizeof(zc_note),
			 "no MSG_ZEROCOPY on this kernel (SO_ZEROCOPY: %s): %u large sends only",
			 strerror(zc), plain);
	else
		snprintf(zc_note, sizeof(zc_note),
			 "%u MSG_ZEROCOPY sends, %u completion ids (%u copied by the kernel), %u "
			 "plain sends",
			 zc_sends, z.ids, z.copied, plain);
	snprintf(d, DETAIL, "%u B in sends of 1000 B..1 MiB; %s; %s", MD_TOTAL, zc_note, out);
	return 0;
}

/* Reads @fd to EOF checking pattern @seed, sleeping @pause_us after each read of at most
 * 64..2047 B (varying). Returns: bytes read, or -errno (*ret_bytes: read so far). */
static int64_t slow_read(int fd, uint32_t seed, unsigned pause_us, uint64_t *ret_bytes, char *d)
{
	uint8_t *buf = xfer_scratch(1);
	uint64_t got = 0;

	for (unsigned i = 0;; i++) {
		ssize_t r = recv(fd, buf, 64 + (i * 613u) % 1984, 0), bad;

		if (r == 0)
			break;
		if (r < 0) {
			*ret_bytes = got;
			return -errno;
		}
		bad = xfer_pattern_check(seed, got, buf, (size_t)r);
		if (bad >= 0) {
			*ret_bytes = got;
			fail(d, "data mismatch at byte %llu", (unsigned long long)(got + bad));
			return -EILSEQ;
		}
		got += (uint64_t)r;
		if (pause_us)
			usleep(pause_us);
	}
	*ret_bytes = got;
	return (int64_t)got;
}

/*
 * Listens on XFER_GPORT_STREAM and has the host write @total bytes (seed @seed) in writes of
 * @lo..@hi bytes, @pace_us apart. Returns: the accepted fd (*tag: the HSEND request) or -1.
 */
static int hsend_accept(char *d, unsigned total, uint32_t seed, unsigned lo, unsigned hi,
			unsigned pace_us, unsigned *tag)
{
	char out[DETAIL];
	int lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM), fd;

	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	*tag = req_send("HSEND %d %u %u %u %u %u", XFER_GPORT_STREAM, total, seed, lo, hi,
			pace_us);
	fd = vs_accept(lfd, 20000);
	close(lfd);
	if (fd < 0) {
		req_wait(*tag, out, sizeof(out), 5);
		return fail(d, "no connection: %s; %s", strerror(-fd), out);
	}
	set_timeouts(fd, 30000);
	return fd;
}

#define SS_TOTAL (1u << 20) /* h2g_small_slow: 4 times the guest's default 256 KiB buffer */

/*
 * h2g_small_slow: the host writes 129..512-byte chunks (bigger than the receiver's 128-byte
 * merge limit, so each may become one packet) while the guest reads small pieces slowly. Newer
 * kernels charge every queued packet its sk_buff overhead against buf_alloc and reset the
 * connection past it; uvsockd must never get there (docs/performance.md §7).
 */
static int c_h2g_small_slow(const char *arg, char *d)
{
	char host[DETAIL];
	uint64_t got = 0;
	int64_t t0 = xfer_now_ms(), n;
	unsigned tag;
	int fd = hsend_accept(d, SS_TOTAL, 53, 129, 512, 20, &tag);

	if (fd < 0)
		return -1;
	usleep(300 * 1000); /* let the buffer fill first */
	n = slow_read(fd, 53, 1000, &got, d);
	close(fd);
	if (n == -EILSEQ)
		return -1;
	if (n < 0 || got != SS_TOTAL) {
		req_wait(tag, host, sizeof(host), 10);
		return fail(d, "guest got %llu of %u B, then %s%s; host: %s",
			    (unsigned long long)got, SS_TOTAL, n < 0 ? strerror((int)-n) : "EOF",
			    n == -ECONNRESET ? " (the guest kernel reset the connection)" : "",
			    host);
	}
	if (req_wait(tag, host, sizeof(host), 30) < 0)
		return fail(d, "%s", host);
	snprintf(d, DETAIL,
		 "%u B read in 64..2047-byte pieces 1 ms apart in %lld ms, no reset; host: %s",
		 SS_TOTAL, (long long)(xfer_now_ms() - t0), host);
	return 0;
}

/* peek_partial: after a partial read, MSG_PEEK returns the bytes that follow it. */
static int c_peek_partial(const char *arg, char *d)
{
	uint8_t *buf = xfer_scratch(1);
	char host[DETAIL];
	unsigned tag;
	ssize_t r, p1, p2;
	uint64_t got = 0;
	int fd = hsend_accept(d, 4096, 55, 4096, 4096, 0, &tag);

	if (fd < 0)
		return -1;
	if (req_wait(tag, host, sizeof(host), 30) < 0) {
		close(fd);
		return fail(d, "%s", host);
	}
	r = recv(fd, buf, 1000, MSG_WAITALL);
	if (r != 1000 || xfer_pattern_check(55, 0, buf, 1000) >= 0) {
		close(fd);
		return fail(d, "first read: %zd B%s", r, r == 1000 ? ", wrong data" : "");
	}
	p1 = recv(fd, buf, 500, MSG_PEEK);
	p2 = p1 > 0 ? recv(fd, buf + 500, 3096, MSG_PEEK) : -1;
	if (p1 <= 0 || xfer_pattern_check(55, 1000, buf, (size_t)p1) >= 0 || p2 < p1 ||
	    xfer_pattern_check(55, 1000, buf + 500, (size_t)p2) >= 0) {
		close(fd);
		return fail(d,
			    "MSG_PEEK after reading 1000 B: %zd B then %zd B, not the bytes from "
			    "offset 1000",
			    p1, p2);
	}
	got = 1000;
	while ((r = recv(fd, buf, 65536, 0)) > 0) {
		if (xfer_pattern_check(55, got, buf, (size_t)r) >= 0)
			break;
		got += (uint64_t)r;
	}
	close(fd);
	if (r != 0 || got != 4096)
		return fail(d, "after the peeks: read to %llu B, then %s", (unsigned long long)got,
			    r < 0 ? strerror(errno) : r > 0 ? "wrong data" : "EOF");
	snprintf(d, DETAIL,
		 "read 1000 of 4096 B; MSG_PEEK gave %zd and %zd B from offset 1000; the rest read "
		 "intact",
		 p1, p2);
	return 0;
}

#define SQ_IN 10000 /* bytes the host queues for SIOCINQ */
#define SQ_OUT (512u << 10) /* bytes the guest sends before SIOCOUTQ must reach 0 */

/*
 * sioc_queues: SIOCINQ is the bytes queued (before and after a partial read); SIOCOUTQ reaches
 * 0 within 2 s once the host has read everything (uvsockd returns TX descriptors promptly). A
 * kernel without the ioctl on vsock says so in the detail.
 */
static int c_sioc_queues(const char *arg, char *d)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_COUNT, .c2s = SQ_OUT, .seed = 57 };
	uint8_t *buf = xfer_scratch(0);
	char host[DETAIL], in_note[160], out_note[160];
	long in0, in1 = 0, out0;
	uint64_t got = 0, off = 0;
	int64_t t;
	unsigned tag;
	ssize_t r;
	int fd = hsend_accept(d, SQ_IN, 59, SQ_IN, SQ_IN, 0, &tag);

	if (fd < 0)
		return -1;
	if (req_wait(tag, host, sizeof(host), 30) < 0) {
		close(fd);
		return fail(d, "%s", host);
	}
	in0 = sioc_wait(fd, SIOCINQ, SQ_IN, 5000);
	if (in0 >= 0 && in0 != SQ_IN) {
		close(fd);
		return fail(d, "SIOCINQ %ld with %u B queued", in0, SQ_IN);
	}
	if (recv(fd, buf, 1234, MSG_WAITALL) != 1234) {
		close(fd);
		return fail(d, "partial read failed");
	}
	if (in0 >= 0 && (in1 = sioc(fd, SIOCINQ)) != SQ_IN - 1234) {
		close(fd);
		return fail(d, "SIOCINQ %ld after reading 1234 of %u B", in1, SQ_IN);
	}
	got = 1234;
	while ((r = recv(fd, buf, 65536, 0)) > 0)
		got += (uint64_t)r;
	close(fd);
	if (got != SQ_IN)
		return fail(d, "read %llu of %u B", (unsigned long long)got, SQ_IN);
	if (in0 < 0)
		snprintf(in_note, sizeof(in_note), "no SIOCINQ on this kernel's vsock (%s)",
			 strerror((int)-in0));
	else
		snprintf(in_note, sizeof(in_note), "SIOCINQ %ld, %ld after reading 1234 B", in0,
			 in1);

	fd = g2h_open(&h, 30000, d);
	if (fd < 0)
		return -1;
	for (r = 0; r == 0 && off < SQ_OUT; off += 65536) {
		xfer_pattern_fill(h.seed, off, buf, 65536);
		r = send_full(fd, buf, 65536);
	}
	shutdown(fd, SHUT_WR);
	if (r < 0 || req(host, sizeof(host), 30, "VERDICT %llu", (unsigned long long)h.id) < 0) {
		close(fd);
		return fail(d, "%s; sending %u B: %s", in_note, SQ_OUT,
			    r < 0 ? strerror((int)-r) : host);
	}
	/* The host has read every byte: the device must have returned every TX buffer. */
	t = xfer_now_ms();
	out0 = sioc_wait(fd, SIOCOUTQ, 0, 2000);
	t = xfer_now_ms() - t;
	close(fd);
	if (out0 > 0)
		return fail(d, "%s; SIOCOUTQ still %ld 2 s after the host read all %u B", in_note,
			    out0, SQ_OUT);
	if (out0 < 0)
		snprintf(out_note, sizeof(out_note), "no SIOCOUTQ on this kernel's vsock (%s)",
			 strerror((int)-out0));
	else
		snprintf(out_note, sizeof(out_note),
			 "SIOCOUTQ 0 within %lld ms of the host's last read", (long long)t);
	snprintf(d, DETAIL, "%s; %s", in_note, out_note);
	return 0;
}

#define LG_TOTAL (1u << 20)

/*
 * guest_linger: SO_LINGER {1, 2 s}, 1 MiB sent (more than uvsockd's window, so some is still in
 * flight), close(): it returns within the linger time and the host gets every byte, then EOF.
 */
static int c_guest_linger(const char *arg, char *d)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_COUNT, .c2s = LG_TOTAL, .seed = 61 };
	struct linger lg = { .l_onoff = 1, .l_linger = 2 };
	uint8_t *buf = xfer_scratch(0);
	char host[DETAIL];
	uint64_t off = 0;
	int64_t t;
	int fd, r;

	fd = g2h_open(&h, 30000, d);
	if (fd < 0)
		return -1;
	if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0) {
		r = errno;
		close(fd);
		return fail(d, "SO_LINGER: %s", strerror(r));
	}
	for (r = 0; r == 0 && off < LG_TOTAL; off += 65536) {
		xfer_pattern_fill(h.seed, off, buf, 65536);
		r = send_full(fd, buf, 65536);
	}
	if (r < 0) {
		close(fd);
		return fail(d, "send at %llu B: %s", (unsigned long long)off, strerror(-r));
	}
	t = xfer_now_ms();
	r = close(fd);
	t = xfer_now_ms() - t;
	if (r < 0)
		return fail(d, "close: %s", strerror(errno));
	if (t > 3000)
		return fail(d, "close with SO_LINGER 2 s took %lld ms", (long long)t);
	if (req(host, sizeof(host), 30, "VERDICT %llu", (unsigned long long)h.id) < 0)
		return fail(d, "close took %lld ms; %s", (long long)t, host);
	snprintf(d, DETAIL, "close with SO_LINGER {1, 2 s} returned after %lld ms; %s",
		 (long long)t, host);
	return 0;
}

#define BB_TOTAL (8u << 20)

/*
 * h2g_bigbuf: the guest advertises a 4 GiB - 1 buffer (or the largest its kernel allows) and
 * reads nothing while the host writes 8 MiB: uvsockd's RSS stays bounded by its own window
 * (it caps the peer's credit at its own buf_alloc), and all bytes arrive intact afterwards.
 */
static int c_h2g_bigbuf(const char *arg, char *d)
{
	unsigned long long want = 0xffffffffull, max = want, got = 0;
	socklen_t l = sizeof(got);
	char note[120];
	int lfd = vs_listen(XFER_GPORT_STREAM, SOCK_STREAM);

	if (lfd < 0)
		return fail(d, "listen: %s", strerror(-lfd));
	/* Accepted sockets inherit the listener's buffer sizes (__vsock_create). */
	if (setsockopt(lfd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_MAX_SIZE, &max, sizeof(max)) < 0 ||
	    setsockopt(lfd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &want, sizeof(want)) < 0 ||
	    getsockopt(lfd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &got, &l) < 0) {
		int e = errno;

		close(lfd);
		return fail(d, "buffer size options: %s", strerror(e));
	}
	snprintf(note, sizeof(note), "guest buf_alloc %llu B%s; ", got,
		 got == want ? " (4 GiB - 1)" : " (the kernel's maximum)");
	return h2g_stall(d, lfd, 63, BB_TOTAL, true, note);
}

/* ---- case table and runner ---- */

struct gcase {
	const char *name;
	int (*fn)(const char *arg, char *d);
	int limit_s;
};

static const struct gcase cases[] = {
	{ "hello", c_hello, 30 },
	{ "g2h_echo", c_g2h_echo, 150 },
	{ "h2g_echo", c_h2g_echo, 150 },
	{ "g2h_bulk", c_g2h_bulk, 600 },
	{ "h2g_bulk", c_h2g_bulk, 600 },
	{ "g2h_seqpacket", c_g2h_seqpacket, 120 },
	{ "h2g_seqpacket", c_h2g_seqpacket, 120 },
	{ "g2h_refused", c_g2h_refused, 30 },
	{ "h2g_refused", c_h2g_refused, 30 },
	{ "g2h_halfclose", c_g2h_halfclose, 90 },
	{ "h2g_halfclose", c_h2g_halfclose, 90 },
	{ "host_close", c_host_close, 90 },
	{ "guest_close", c_guest_close, 90 },
	{ "g2h_many", c_g2h_many, 300 },
	{ "h2g_many", c_h2g_many, 300 },
	{ "g2h_backpressure", c_g2h_backpressure, 180 },
	{ "h2g_backpressure", c_h2g_backpressure, 180 },
	{ "sib_server", c_sib_server, 320 },
	{ "sib_client", c_sib_client, 320 },
	{ "survive", c_survive, 300 },
	{ "flood", c_flood, 600 },
	{ "reload", c_reload, 240 },
	{ "close_rst", c_close_rst, 120 },
	{ "h2g_tiny", c_h2g_tiny, 120 },
	{ "g2h_multidesc", c_g2h_multidesc, 120 },
	{ "h2g_small_slow", c_h2g_small_slow, 120 },
	{ "peek_partial", c_peek_partial, 60 },
	{ "sioc_queues", c_sioc_queues, 60 },
	{ "guest_linger", c_guest_linger, 60 },
	{ "h2g_bigbuf", c_h2g_bigbuf, 180 },
	{ "shim_h2g", c_shim_h2g, 180 },
	{ "shim_g2h", c_shim_g2h, 180 },
	{ "shim_refused", c_shim_refused, 60 },
	{ "vsock_test", c_vsock_test, 400 },
	{ "vsock_test_server", c_vsock_test_server, 400 },
	{ "reboot", c_reboot, 30 },
	{ "lo_stream", c_lo_stream, 240 },
	{ "lo_seqpacket", c_lo_seqpacket, 60 },
	{ "lo_refused", c_lo_refused, 30 },
	{ "ctl", c_ctl, 30 },
};

static const struct gcase *find_case(const char *name)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (strcmp(cases[i].name, name) == 0)
			return &cases[i];
	return NULL;
}

static void open_ctl(const char *path)
{
	struct termios t;
	int fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);

	if (fd < 0) {
		printf("UVSOCK-INFO no control channel %s: %s\n", path, strerror(errno));
		return;
	}
	if (tcgetattr(fd, &t) == 0) {
		cfmakeraw(&t);
		t.c_cflag |= CLOCAL | CREAD;
		t.c_cflag &= ~CRTSCTS;
		t.c_cc[VMIN] = 1;
		t.c_cc[VTIME] = 0;
		cfsetispeed(&t, B115200);
		cfsetospeed(&t, B115200);
		tcsetattr(fd, TCSANOW, &t);
		tcflush(fd, TCIOFLUSH);
	}
	g.ctl.fd = fd;
	g.have_ctl = true;
}

/* Run one case in a child with a time limit; prints the UVSOCK-CASE line. */
static bool run_one(const struct gcase *c, const char *arg, unsigned idx)
{
	int pfd[2];
	char d[DETAIL + 1] = "";
	int64_t t0 = xfer_now_ms();
	pid_t pid;
	int st = 0;
	ssize_t n = 0;

	printf("UVSOCK-BEGIN %s %d\n", c->name, c->limit_s);
	fflush(stdout);
	if (pipe(pfd) < 0)
		return false;
	pid = fork();
	if (pid == 0) {
		char det[DETAIL] = "";
		int r;

		close(pfd[0]);
		g.seed = idx * 100 + 1;
		g.tag = idx * 1000;
		alarm(c->limit_s);
		r = c->fn(arg, det);
		det[DETAIL - 1] = 0;
		for (char *p = det; *p; p++)
			if (*p == '\n' || *p == '\r')
				*p = ' ';
		if (write(pfd[1], det, strlen(det)) < 0)
			_exit(3);
		fflush(stdout);
		_exit(r ? 1 : 0);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r = read(pfd[0], d + n, DETAIL - n);

		if (r <= 0)
			break;
		n += r;
	}
	d[n] = 0;
	close(pfd[0]);
	waitpid(pid, &st, 0);
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;

	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		snprintf(d + strlen(d), sizeof(d) - strlen(d), "%stime limit %d s exceeded",
			 d[0] ? "; " : "", c->limit_s);
	else if (WIFSIGNALED(st))
		snprintf(d + strlen(d), sizeof(d) - strlen(d), "%skilled by signal %d",
			 d[0] ? "; " : "", WTERMSIG(st));
	printf("UVSOCK-CASE %s %s %lld %s\n", c->name, ok ? "PASS" : "FAIL",
	       (long long)(xfer_now_ms() - t0), d[0] ? d : "-");
	fflush(stdout);
	return ok;
}

static char *cmdline_value(const char *cmdline, const char *key, char *out, size_t len)
{
	size_t kl = strlen(key);

	for (const char *p = cmdline; (p = strstr(p, key)); p += kl) {
		if ((p == cmdline || p[-1] == ' ') && p[kl] == '=') {
			size_t l = strcspn(p + kl + 1, " \n");

			if (l >= len)
				l = len - 1;
			memcpy(out, p + kl + 1, l);
			out[l] = 0;
			return out;
		}
	}
	return NULL;
}

static int run(void)
{
	char cmdline[4096] = "", list[2048], val[256];
	FILE *f = fopen("/proc/cmdline", "r");
	unsigned fails = 0, idx = 0;
	struct utsname u;

	if (f) {
		if (!fgets(cmdline, sizeof(cmdline), f))
			cmdline[0] = 0;
		fclose(f);
	}
	if (cmdline_value(cmdline, "uvsock.bulk", val, sizeof(val)))
		g.bulk = strtoull(val, NULL, 0);
	if (cmdline_value(cmdline, "uvsock.many", val, sizeof(val)))
		g.many = (unsigned)strtoul(val, NULL, 0);
	open_ctl(cmdline_value(cmdline, "uvsock.ctl", val, sizeof(val)) ? val : "/dev/ttyS1");
	if (!cmdline_value(cmdline, "uvsock.cases", list, sizeof(list))) {
		printf("UVSOCK-INFO no uvsock.cases= on the kernel command line\n");
		return 0;
	}
	pid_t tracer = -1;

	if (cmdline_value(cmdline, "uvsock.trace", val, sizeof(val))) {
		int rp[2] = { -1, -1 };

		/* The tracer says when it captures (a byte on rp, or EOF if it gave up); the
		 * cases start after that, or after 5 s at most. */
		if (pipe2(rp, O_CLOEXEC) < 0)
			rp[0] = rp[1] = -1;
		tracer = fork();
		if (tracer == 0) {
			close(rp[0]);
			trace_ready_fd = rp[1];
			_exit(trace(strcmp(val, "all") ? (uint32_t)strtoul(val, NULL, 0) : 0));
		}
		close(rp[1]);
		if (rp[0] >= 0) {
			struct pollfd p = { .fd = rp[0], .events = POLLIN };
			char c;

			if (poll(&p, 1, 5000) > 0)
				(void)!read(rp[0], &c, 1);
			close(rp[0]);
		}
	}
	g.cid = local_cid();
	/* After a guest reboot (case "reboot"), continue after the reboot that was done. */
	unsigned boot = 1, skip_reboots;
	char out[128];

	if (g.have_ctl && req(out, sizeof(out), 10, "BOOT") == 0)
		boot = (unsigned)strtoul(out, NULL, 10);
	skip_reboots = boot > 1 ? boot - 1 : 0;
	uname(&u);
	printf("UVSOCK-GUEST kernel=%s cid=%d bulk=%llu many=%u boot=%u\n", u.release, (int)g.cid,
	       (unsigned long long)g.bulk, g.many, boot);
	fflush(stdout);
	for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *arg = strchr(tok, ':');
		const struct gcase *c;

		if (arg)
			*arg++ = 0;
		c = find_case(tok);
		idx++;
		if (skip_reboots > 0) {
			if (strcmp(tok, "reboot") == 0)
				skip_reboots--;
			continue;
		}
		if (!c) {
			printf("UVSOCK-CASE %s FAIL 0 unknown case\n", tok);
			fails++;
			continue;
		}
		if (!run_one(c, arg, idx)) {
			fails++;
		} else if (strcmp(tok, "reboot") == 0) {
			printf("UVSOCK-REBOOT\n");
			fflush(stdout);
			sync();
			reboot(RB_AUTOBOOT);
			printf("UVSOCK-INFO reboot failed: %s\n", strerror(errno));
			fails++;
		}
	}
	if (tracer > 0) {
		usleep(500 * 1000);
		kill(tracer, SIGTERM);
		waitpid(tracer, NULL, 0);
	}
	if (g.have_ctl) {
		ctl_send(&g.ctl, "0 BYE");
		tcdrain(g.ctl.fd);
	}
	return fails > 100 ? 100 : (int)fails;
}

/* ---- netcat-like relay for the interactive shell ---- */

static int relay(int fd)
{
	char buf[65536];
	bool in_open = true;

	for (;;) {
		struct pollfd p[2] = { { .fd = fd, .events = POLLIN },
				       { .fd = 0, .events = in_open ? POLLIN : 0 } };

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			return 1;
		if (p[0].revents) {
			ssize_t n = read(fd, buf, sizeof(buf));

			if (n <= 0)
				return n < 0;
			if (write(1, buf, n) != n)
				return 1;
		}
		if (in_open && p[1].revents) {
			ssize_t n = read(0, buf, sizeof(buf));

			if (n <= 0) {
				shutdown(fd, SHUT_WR);
				in_open = false;
			} else if (send_full(fd, buf, n) < 0) {
				return 1;
			}
		}
	}
}

static int usage(void)
{
	fprintf(stderr,
		"usage: uvsock-guest run | cid | connect CID PORT | listen PORT | trace [PORT]\n"
		"  run             the interop cases named by uvsock.cases= on /proc/cmdline\n"
		"  cid             print this guest's vsock CID\n"
		"  connect CID PORT  relay stdin/stdout over a vsock stream (CID 2 = host)\n"
		"  listen PORT     accept one vsock stream connection and relay it\n"
		"  trace [PORT]    print the virtio-vsock packets of PORT (all: none given)\n");
	return 2;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return usage();
	if (strcmp(argv[1], "run") == 0)
		return run();
	if (strcmp(argv[1], "trace") == 0)
		return trace(argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 0);
	if (strcmp(argv[1], "cid") == 0 || strcmp(argv[1], "--cid") == 0) {
		uint32_t cid = local_cid();

		if (cid == VMADDR_CID_ANY)
			return 1;
		printf("%u\n", cid);
		return 0;
	}
	if (strcmp(argv[1], "connect") == 0 && argc == 4) {
		int fd = vs_connect((uint32_t)strtoul(argv[2], NULL, 0),
				    (uint32_t)strtoul(argv[3], NULL, 0), SOCK_STREAM, 5000);

		if (fd < 0) {
			fprintf(stderr, "connect: %s\n", strerror(-fd));
			return 1;
		}
		return relay(fd);
	}
	if (strcmp(argv[1], "listen") == 0 && argc == 3) {
		int lfd = vs_listen((uint32_t)strtoul(argv[2], NULL, 0), SOCK_STREAM), fd;

		if (lfd < 0) {
			fprintf(stderr, "listen: %s\n", strerror(-lfd));
			return 1;
		}
		fd = accept(lfd, NULL, NULL);
		close(lfd);
		if (fd < 0) {
			perror("accept");
			return 1;
		}
		return relay(fd);
	}
	return usage();
}
