/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf --dgram: datagram throughput with many senders on ONE socket. For each transport
 * and each sender count N, N threads send `size`-byte datagrams on one shared socket to one
 * receiving socket for the run's duration; one receiver thread reads them. The same method over
 * UDP loopback, a Unix datagram socket, uvsock's loopback transport (CID 1, in this process) and
 * the guest role in this process through uvsockd to a host AF_UNIX datagram socket (the host-side
 * convention of docs/uvsockd.md: "<guest port>\n" then the payload).
 *
 * Rate = payload bytes received / (last datagram received - start), in MB/s (10^6 bytes).
 * Drops: sent - received (the receiver drains until nothing arrives for DG_QUIET_MS), and the
 * drops the transport itself counted (UDP: the kernel's Udp RcvbufErrors, machine-wide; uvsock:
 * the engine's datagram drop counters). A Unix datagram socket never drops: its sender blocks.
 *
 * Threads: the main thread owns the records (g_res.dg); sender threads touch only their own
 * struct dg_sender and the shared socket; the receiver thread its own struct dg_recv.
 */
#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <uvsock/uvsock.h>

#include "ctlproto/client.h"
#include "ctlproto/json.h"
#include "perf.h"
#include "util/time.h"

#define DG_QUIET_MS     100u /* the receiver is drained: nothing for this long */
#define DG_DRAIN_MAX_MS 3000u
#define DG_RCVBUF       (4u << 20) /* asked for; the kernel caps it at net.core.rmem_max */

const char *const dg_name[D_MAX] = {
	[D_UDP] = "udp",
	[D_UNIX] = "unix-dgram",
	[D_LOOP] = "uvsock-loopback",
	[D_LOOP_LOCKED] = "uvsock-loopback-locked",
	[D_UVSOCKD] = "uvsockd-g2h",
	[D_UVSOCKD_H2G] = "uvsockd-h2g",
};

/*
 * One measured point's two sockets and how to use them. uvsock sockets (tx_uv, rx_uv) are
 * libuvsock descriptors; the uvsockd receiver is a host AF_UNIX datagram socket whose datagrams
 * start with the "<guest port>\n" line of the host-side convention (hdr: strip it).
 */
struct dg_pair {
	enum dgtr t;
	int txfd, rxfd;
	bool tx_uv, rx_uv, hdr;
	bool rx_peer; /* hdr: connected back to the sender of the first datagram (dg_recv) */
	char line[12]; /* uvsockd-h2g: the "<guest port>\n" line each datagram starts with */
	size_t linelen;
	struct uvsock_ctx *ctx; /* the loopback context this point created, or NULL */
	struct sockaddr_storage dst;
	socklen_t dlen;
	char rxpath[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

struct dg_sender {
	struct dg_pair *p;
	size_t size;
	pthread_barrier_t *go;
	_Atomic int *stop;
	uint64_t sent, busy;
	int err;
};

struct dg_recv {
	struct dg_pair *p;
	size_t size;
	_Atomic int *stop;
	_Atomic uint64_t got; /* read by the main thread while draining */
	uint64_t bytes, bad;
	uint64_t t_last;
	int err;
};

static uint8_t g_dbuf[PERF_DGRAM_MAX];

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static ssize_t dg_send(struct dg_pair *p, const void *buf, size_t n)
{
	const struct sockaddr *a = (const struct sockaddr *)&p->dst;

	struct iovec v[2] = { { p->line, p->linelen }, { (void *)buf, n } };
	struct msghdr m = { .msg_name = (void *)a, .msg_namelen = p->dlen, .msg_iov = v,
			    .msg_iovlen = 2 };
	ssize_t r;

	if (p->tx_uv)
		return uvsock_sendto(p->txfd, buf, n, 0, a, p->dlen);
	if (!p->linelen)
		return sendto(p->txfd, buf, n, 0, a, p->dlen);
	r = sendmsg(p->txfd, &m, 0);
	return r < 0 ? r : r - (ssize_t)p->linelen;
}

/* Payload bytes of one datagram received without waiting; -1 with errno (EAGAIN: none). */
static ssize_t dg_recv(struct dg_pair *p, void *buf, size_t n)
{
	struct sockaddr_un from;
	socklen_t flen = sizeof(from);
	ssize_t r;
	const char *nl;

	if (p->rx_uv)
		r = uvsock_recvfrom(p->rxfd, buf, n, MSG_DONTWAIT, NULL, NULL);
	else if (p->hdr && !p->rx_peer)
		r = recvfrom(p->rxfd, buf, n, MSG_DONTWAIT, (struct sockaddr *)&from, &flen);
	else
		r = recv(p->rxfd, buf, n, MSG_DONTWAIT);
	if (r < 0 || !p->hdr)
		return r;
	/*
	 * What a host program that takes datagrams from one VM's uvsockd does: connect back to the
	 * socket uvsockd sends from (docs/uvsockd.md "Datagrams"). Linux does not hold a socket's
	 * own peer to net.unix.max_dgram_qlen (net/unix/af_unix.c, unix_dgram_sendmsg), only to
	 * the sender's SO_SNDBUF, so a burst is not cut at ten datagrams.
	 */
	if (!p->rx_peer) {
		p->rx_peer = true;
		if (flen > sizeof(sa_family_t) &&
		    connect(p->rxfd, (struct sockaddr *)&from, flen) < 0)
			progress("%s: connect to the sender: %s", dg_name[p->t], strerror(errno));
	}
	/* "<guest port>\n" then the payload: a datagram without the line counts as bad. */
	nl = memchr(buf, '\n', (size_t)r < 12 ? (size_t)r : 12);
	return nl ? r - (nl + 1 - (const char *)buf) : 0;
}

/* 1: readable, 0: timeout, -1: error (errno). */
static int dg_wait(struct dg_pair *p, int ms)
{
	struct pollfd pf = { .fd = p->rxfd, .events = POLLIN };

	return p->rx_uv ? uvsock_poll(&pf, 1, ms) : poll(&pf, 1, ms);
}

static void *sender_main(void *arg)
{
	struct dg_sender *s = arg;

	pthread_barrier_wait(s->go);
	/* Relaxed: a stop hint; the join publishes the counts. At least one datagram each. */
	for (bool once = true; once || !atomic_load_explicit(s->stop, memory_order_relaxed);
	     once = false) {
		ssize_t r = dg_send(s->p, g_dbuf, s->size);

		if (r == (ssize_t)s->size) {
			s->sent++;
		} else if (r < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
			/* A full transmit path that does not block: counted, then retried. */
			s->busy++;
			sched_yield();
		} else if (r < 0 && errno != EINTR) {
			s->err = errno;
			break;
		}
	}
	return NULL;
}

static void *recv_main(void *arg)
{
	struct dg_recv *r = arg;
	uint8_t *buf = malloc(PERF_DGRAM_MAX + 32);

	if (!buf) {
		r->err = ENOMEM;
		return NULL;
	}
	/* Relaxed: the main thread raises stop after it saw the count settle; join publishes. */
	while (!atomic_load_explicit(r->stop, memory_order_relaxed)) {
		ssize_t n = dg_recv(r->p, buf, PERF_DGRAM_MAX + 32);

		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				r->err = errno;
				break;
			}
			if (dg_wait(r->p, 10) < 0 && errno != EINTR) {
				r->err = errno;
				break;
			}
			continue;
		}
		if ((size_t)n != r->size)
			r->bad++;
		else
			r->bytes += (uint64_t)n;
		r->t_last = mono_ns();
		atomic_fetch_add_explicit(&r->got, 1, memory_order_relaxed);
	}
	free(buf);
	return NULL;
}

/* The kernel's machine-wide UDP receive-buffer drop count (/proc/net/snmp), 0 if unknown. */
static uint64_t udp_rcvbuf_errors(void)
{
	char hdr[512], val[512];
	uint64_t v = 0;
	FILE *f = fopen("/proc/net/snmp", "r");

	if (!f)
		return 0;
	while (fgets(hdr, sizeof(hdr), f) && fgets(val, sizeof(val), f)) {
		char *hs = NULL, *vs = NULL;
		char *h = strtok_r(hdr, " \n", &hs), *x = strtok_r(val, " \n", &vs);

		if (!h || strcmp(h, "Udp:"))
			continue;
		while ((h = strtok_r(NULL, " \n", &hs)) && (x = strtok_r(NULL, " \n", &vs)))
			if (!strcmp(h, "RcvbufErrors"))
				v = strtoull(x, NULL, 10);
		break;
	}
	fclose(f);
	return v;
}

/* The datagram drops a libuvsock context's engine counted (every reason). */
static uint64_t uvsock_drops(struct uvsock_ctx *ctx)
{
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	if (uvsock_ctx_get_stats(ctx, &st) < 0)
		return 0;
	return st.dgram_drop_no_listener + st.dgram_drop_full + st.dgram_drop_oversize +
	       st.dgram_drop_not_negotiated;
}

/*
 * The datagram drops the uvsockd behind e counted for its VM (every dgram_drop_* counter of its
 * `stats` answer on the control socket <socket>.ctl); 0 if it has no control socket.
 */
static uint64_t uvsockd_drops(const struct env *e)
{
	static const char *const names[] = { "dgram_drop_no_listener", "dgram_drop_full",
		                             "dgram_drop_oversize", "dgram_drop_not_negotiated",
		                             "dgram_drop_malformed" };
	const struct ops_jv *vms;
	struct ops_jv *v = NULL;
	char ctl[200];
	uint64_t n = 0;
	int fd = -1;

	snprintf(ctl, sizeof(ctl), "%.190s.ctl", e->sock);
	if (ops_ctl_connect(ctl, &fd) < 0)
		return 0;
	if (ops_ctl_request(fd, "stats", -1, PERF_WAIT_MS, NULL, &v) == 0) {
		vms = ops_json_get(v, "vms");
		for (unsigned i = 0; vms && vms->child && i < sizeof(names) / sizeof(names[0]); i++)
			n += ops_json_u64(ops_json_get(vms->child, "counters"), names[i], 0);
	}
	ops_json_free(v);
	close(fd);
	return n;
}

/* The drops transport p counted itself so far (monotonic; the caller takes differences). */
static uint64_t counted_drops(const struct env *e, const struct dg_pair *p)
{
	if (p->t == D_UDP)
		return udp_rcvbuf_errors();
	if (p->t == D_UVSOCKD || p->t == D_UVSOCKD_H2G)
		return uvsockd_drops(e) + uvsock_drops(e->g);
	if (p->ctx)
		return uvsock_drops(p->ctx);
	return 0;
}

static void big_rcvbuf(int fd, bool uv)
{
	int v = DG_RCVBUF;

	if (uv)
		uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	else
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
}

/* A Unix datagram socket bound at path (replacing a stale one), or die. */
static int unix_dgram_bind(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("unix datagram socket %s: %s", path, strerror(errno));
	return fd;
}

static void kernel_pair(struct env *e, struct dg_pair *p)
{
	if (p->t == D_UDP) {
		struct sockaddr_in a = { .sin_family = AF_INET,
			                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t al = sizeof(a);

		p->rxfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		p->txfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (p->rxfd < 0 || p->txfd < 0 || bind(p->rxfd, (struct sockaddr *)&a, al) < 0 ||
		    getsockname(p->rxfd, (struct sockaddr *)&a, &al) < 0)
			die("udp socket: %s", strerror(errno));
		memcpy(&p->dst, &a, sizeof(a));
		p->dlen = sizeof(a);
	} else {
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		snprintf(p->rxpath, sizeof(p->rxpath), "%.90s_dgrambench", e->uds);
		p->rxfd = unix_dgram_bind(p->rxpath);
		p->txfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (p->txfd < 0)
			die("unix datagram socket: %s", strerror(errno));
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", p->rxpath);
		memcpy(&p->dst, &a, sizeof(a));
		p->dlen = sizeof(a);
	}
}

/* A SOCK_DGRAM uvsock socket of ctx; -1 if the transport has no datagrams (ENODEV). */
static int uv_dgram(struct uvsock_ctx *ctx, const char *what)
{
	int fd = uvsock_socket(ctx, SOCK_DGRAM, 0);

	if (fd < 0 && errno != ENODEV)
		die("%s: SOCK_DGRAM socket: %s", what, strerror(errno));
	return fd;
}

static void vm_dst(struct dg_pair *p, uint32_t cid, uint32_t port)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port };

	memcpy(&p->dst, &a, sizeof(a));
	p->dlen = sizeof(a);
}

/*
 * uvsock's loopback (CID 1): a context of this point's own, created with UVSOCK_DGRAM_LOCKED=1
 * in the environment for the locked row (read when the context is created), both ends in it.
 */
static bool loop_pair(struct dg_pair *p)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK,
		                 .svm_cid = VMADDR_CID_ANY,
		                 .svm_port = PERF_GUEST_DGRAM_PORT };

	if (p->t == D_LOOP_LOCKED)
		setenv("UVSOCK_DGRAM_LOCKED", "1", 1);
	p->ctx = uvsock_ctx_new_loopback(NULL);
	unsetenv("UVSOCK_DGRAM_LOCKED");
	if (!p->ctx)
		die("loopback context: %s", strerror(errno));
	p->tx_uv = p->rx_uv = true;
	p->rxfd = uv_dgram(p->ctx, dg_name[p->t]);
	if (p->rxfd < 0)
		return false;
	p->txfd = uv_dgram(p->ctx, dg_name[p->t]);
	if (p->txfd < 0 || uvsock_bind(p->rxfd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("%s: socket/bind: %s", dg_name[p->t], strerror(errno));
	vm_dst(p, VMADDR_CID_LOCAL, PERF_GUEST_DGRAM_PORT);
	return true;
}

/*
 * The guest role in this process -> uvsockd -> the host program: a host AF_UNIX datagram
 * socket bound at "<uds-path>_<port>.dgram" (docs/uvsockd.md, host-side datagrams).
 */
static bool uvsockd_pair(struct env *e, struct dg_pair *p)
{
	p->tx_uv = true;
	p->hdr = true;
	p->txfd = uv_dgram(e->g, dg_name[p->t]);
	if (p->txfd < 0)
		return false;
	snprintf(p->rxpath, sizeof(p->rxpath), "%.90s_%u.dgram", e->uds, PERF_HOST_DGRAM_PORT);
	p->rxfd = unix_dgram_bind(p->rxpath);
	vm_dst(p, VMADDR_CID_HOST, PERF_HOST_DGRAM_PORT);
	return true;
}

/*
 * A host program -> uvsockd -> the guest role in this process: an unbound host AF_UNIX
 * datagram socket sending "<guest port>\n<payload>" to "<uds-path>.dgram" (blocking, as a host
 * sender that must not lose datagrams at its own end), a guest datagram socket bound at the
 * port.
 */
static bool uvsockd_h2g_pair(struct env *e, struct dg_pair *p)
{
	struct sockaddr_vm va = { .svm_family = AF_VSOCK,
		                  .svm_cid = VMADDR_CID_ANY,
		                  .svm_port = PERF_GUEST_DGRAM_PORT };
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	p->rx_uv = true;
	p->rxfd = uv_dgram(e->g, dg_name[p->t]);
	if (p->rxfd < 0)
		return false;
	if (uvsock_bind(p->rxfd, (struct sockaddr *)&va, sizeof(va)) < 0)
		die("%s: bind: %s", dg_name[p->t], strerror(errno));
	p->txfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (p->txfd < 0)
		die("unix datagram socket: %s", strerror(errno));
	snprintf(a.sun_path, sizeof(a.sun_path), "%.90s.dgram", e->uds);
	memcpy(&p->dst, &a, sizeof(a));
	p->dlen = sizeof(a);
	p->linelen = (size_t)snprintf(p->line, sizeof(p->line), "%u\n", PERF_GUEST_DGRAM_PORT);
	return true;
}

/* Opens the two sockets of transport t; false (and a progress note) if it is not available. */
static bool pair_open_dg(struct env *e, enum dgtr t, struct dg_pair *p)
{
	bool ok = true;

	*p = (struct dg_pair){ .t = t, .txfd = -1, .rxfd = -1 };
	if (t == D_UDP || t == D_UNIX)
		kernel_pair(e, p);
	else if (t == D_UVSOCKD)
		ok = uvsockd_pair(e, p);
	else if (t == D_UVSOCKD_H2G)
		ok = uvsockd_h2g_pair(e, p);
	else
		ok = loop_pair(p);
	if (!ok) {
		progress("%s: no datagram sockets on this transport (ENODEV): skipped", dg_name[t]);
		return false;
	}
	big_rcvbuf(p->rxfd, p->rx_uv);
	return true;
}

static void pair_close_dg(struct dg_pair *p)
{
	if (p->txfd >= 0)
		p->tx_uv ? uvsock_close(p->txfd) : close(p->txfd);
	if (p->rxfd >= 0)
		p->rx_uv ? uvsock_close(p->rxfd) : close(p->rxfd);
	if (p->rxpath[0])
		unlink(p->rxpath);
	uvsock_ctx_free(p->ctx);
	*p = (struct dg_pair){ .txfd = -1, .rxfd = -1 };
}

struct res_dgram *res_dgram_get(enum dgtr t, int senders, const char *variant)
{
	struct res_dgram *r;

	for (int i = 0; i < g_res.ndg; i++) {
		r = &g_res.dg[i];
		if (r->t == t && r->senders == senders && strcmp(r->variant, variant) == 0)
			return r;
	}
	g_res.dg = res_grow(g_res.dg, g_res.ndg, &g_res.cdg, sizeof(*g_res.dg));
	r = &g_res.dg[g_res.ndg++];
	memset(r, 0, sizeof(*r));
	r->t = t;
	r->senders = senders;
	snprintf(r->variant, sizeof(r->variant), "%s", variant);
	return r;
}

/* One run of one point: n senders, one receiver, the run's duration, then the drain. */
static void run_dgram_once(struct env *e, enum dgtr t, int n, size_t size)
{
	struct dg_sender sd[PERF_DGRAM_MAX_SENDERS];
	pthread_t th[PERF_DGRAM_MAX_SENDERS], rth;
	_Atomic int stop = 0, rstop = 0;
	struct dg_recv rv = { .size = size, .stop = &rstop };
	pthread_barrier_t go;
	struct dg_pair p;
	struct dg_sample *smp;
	struct res_dgram *rec;
	uint64_t t0, t_stop, sent = 0, busy = 0, c0, got, last, quiet_since;

	if (!pair_open_dg(e, t, &p))
		return;
	rv.p = &p;
	c0 = counted_drops(e, &p);
	if (pthread_barrier_init(&go, NULL, (unsigned)n + 1))
		die("barrier");
	if (pthread_create(&rth, NULL, recv_main, &rv))
		die("pthread_create");
	for (int i = 0; i < n; i++) {
		sd[i] = (struct dg_sender){ .p = &p, .size = size, .go = &go, .stop = &stop };
		if (pthread_create(&th[i], NULL, sender_main, &sd[i]))
			die("pthread_create");
	}
	pthread_barrier_wait(&go);
	t0 = mono_ns();
	sleep_ms(e->o->duration_ms);
	atomic_store_explicit(&stop, 1, memory_order_relaxed);
	t_stop = mono_ns();
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		sent += sd[i].sent;
		busy += sd[i].busy;
		if (sd[i].err)
			die("%s: send: %s", dg_name[t], strerror(sd[i].err));
	}
	/* Drain: until everything arrived or nothing came for DG_QUIET_MS (bounded). */
	last = atomic_load_explicit(&rv.got, memory_order_relaxed);
	quiet_since = mono_ms();
	for (uint64_t end = mono_ms() + DG_DRAIN_MAX_MS; mono_ms() < end;) {
		got = atomic_load_explicit(&rv.got, memory_order_relaxed);
		if (got >= sent)
			break;
		if (got != last) {
			last = got;
			quiet_since = mono_ms();
		} else if (mono_ms() - quiet_since >= DG_QUIET_MS) {
			break;
		}
		sleep_ms(2);
	}
	atomic_store_explicit(&rstop, 1, memory_order_relaxed);
	pthread_join(rth, NULL);
	pthread_barrier_destroy(&go);
	if (rv.err)
		die("%s: receive: %s", dg_name[t], strerror(rv.err));
	rec = res_dgram_get(t, n, e->variant);
	if (rec->n >= PERF_MAX_RUNS)
		die("too many runs");
	rec->size = size;
	smp = &rec->s[rec->n++];
	got = atomic_load_explicit(&rv.got, memory_order_relaxed);
	*smp = (struct dg_sample){
		.mbps = rv.t_last > t0 ? (double)rv.bytes / ((double)(rv.t_last - t0) / 1e3) : 0,
		.tx_mbps = (double)sent * (double)size / ((double)(t_stop - t0) / 1e3),
		.sent = sent,
		.received = got - rv.bad,
		.lost = sent > got ? sent - got : 0,
		.counted = counted_drops(e, &p) - c0,
		.busy = busy,
		.bad = rv.bad,
	};
	pair_close_dg(&p);
}

/* One run of every datagram point: each sender count over each available transport. */
void run_dgram_round(struct env *e)
{
	const struct opts *o = e->o;

	for (int i = 0; i < o->ndg_senders; i++)
		for (int t = 0; t < D_MAX; t++)
			if (o->dg_transports ? (o->dg_transports & (1u << t))
			                     : t != D_LOOP_LOCKED || o->dg_locked)
				run_dgram_once(e, (enum dgtr)t, o->dg_senders[i], o->dg_size);
}

/* ---- report ----------------------------------------------------------------------------- */

static const struct res_dgram *dg_find(enum dgtr t, int senders, const char *variant)
{
	for (int i = 0; i < g_res.ndg; i++) {
		const struct res_dgram *r = &g_res.dg[i];

		if (r->t == t && r->senders == senders && !strcmp(r->variant, variant) && r->n)
			return r;
	}
	return NULL;
}

/* Median of one field of a record's samples; min and max too when asked. */
static double dg_med(const struct res_dgram *r, size_t off, double *mn, double *mx)
{
	double v[PERF_MAX_RUNS], m;

	for (int i = 0; i < r->n; i++) {
		const char *s = (const char *)&r->s[i] + off;

		v[i] = off < offsetof(struct dg_sample, sent) ? *(const double *)s
		                                              : (double)*(const uint64_t *)s;
	}
	m = median(v, r->n); /* sorts v */
	if (mn)
		*mn = v[0];
	if (mx)
		*mx = v[r->n - 1];
	return m;
}

#define DG_MED(r, field) dg_med(r, offsetof(struct dg_sample, field), NULL, NULL)

static int dg_variants(const char **out, int cap)
{
	int n = 0;

	for (int i = 0; i < g_res.ndg; i++) {
		int j;

		for (j = 0; j < n && strcmp(out[j], g_res.dg[i].variant); j++)
			;
		if (j == n && n < cap)
			out[n++] = g_res.dg[i].variant;
	}
	return n;
}

static int dg_sender_counts(int *out, int cap)
{
	int n = 0;

	for (int i = 0; i < g_res.ndg; i++) {
		int j;

		for (j = 0; j < n && out[j] != g_res.dg[i].senders; j++)
			;
		if (j == n && n < cap)
			out[n++] = g_res.dg[i].senders;
	}
	return n;
}

/* Throughput of r over UDP loopback's at the same sender count (base variant); 0: none. */
static double dg_ratio_udp(const struct res_dgram *r)
{
	const struct res_dgram *u = dg_find(D_UDP, r->senders, "");
	double b = u ? DG_MED(u, mbps) : 0;

	return b > 0 ? DG_MED(r, mbps) / b : 0;
}

/* One cell: the rates and drops of r, or (ratios) its ratio to UDP and to one sender. */
static void dg_cell(char *cell, size_t cap, const struct res_dgram *r, bool ratios)
{
	const struct res_dgram *one = dg_find(r->t, 1, r->variant);
	double mn = 0, mx = 0, m = dg_med(r, offsetof(struct dg_sample, mbps), &mn, &mx);

	if (!ratios)
		snprintf(cell, cap, "%.0f (%.0f-%.0f) %.0f %.0f/%.0f", m, mn, mx,
		         DG_MED(r, tx_mbps), DG_MED(r, lost), DG_MED(r, counted));
	else if (one && DG_MED(one, mbps) > 0)
		snprintf(cell, cap, "%.2fx; %.2fx", dg_ratio_udp(r), m / DG_MED(one, mbps));
	else
		snprintf(cell, cap, "%.2fx", dg_ratio_udp(r));
}

/* Every transport's row of one variant, a column per sender count. */
static void dg_rows(FILE *f, const char *variant, const int *sc, int ns, bool ratios)
{
	for (int t = 0; t < D_MAX; t++) {
		char name[96];
		bool any = false;

		for (int k = 0; k < ns; k++)
			any |= dg_find((enum dgtr)t, sc[k], variant) != NULL;
		if (!any)
			continue;
		snprintf(name, sizeof(name), "%s%s%s", dg_name[t], *variant ? " " : "", variant);
		fprintf(f, "%-30s", name);
		for (int k = 0; k < ns; k++) {
			const struct res_dgram *r = dg_find((enum dgtr)t, sc[k], variant);
			char cell[96] = "-";

			if (r)
				dg_cell(cell, sizeof(cell), r, ratios);
			fprintf(f, " %-30s", cell);
		}
		fprintf(f, "\n");
	}
}

void dgram_table(FILE *f)
{
	const char *vs[8];
	int sc[8], nv = dg_variants(vs, 8), ns = dg_sender_counts(sc, 8);
	size_t size = g_res.ndg ? g_res.dg[0].size : 0;

	if (!g_res.ndg)
		return;
	fprintf(f,
	        "\nDATAGRAM, %zu-byte datagrams, N sender threads on one socket -> one receiver:\n"
	        "received MB/s median (min-max), sent MB/s; per run, medians: lost = sent - "
	        "received / drops the transport counted\n%-30s",
	        size, "transport");
	for (int k = 0; k < ns; k++)
		fprintf(f, " %-30d", sc[k]);
	fprintf(f, "\n");
	for (int v = 0; v < nv; v++)
		dg_rows(f, vs[v], sc, ns, false);
	fprintf(f, "ratio to udp (same sender count); scaling: N senders / 1 sender\n");
	for (int v = 0; v < nv; v++)
		dg_rows(f, vs[v], sc, ns, true);
}

/*
 * The records as CSV rows of kind "dgram" (the columns after cpu_us_per_rt; stream and rtt rows
 * leave them empty) or as the JSON "datagram" list's records.
 */
static void dg_records(FILE *f, bool json)
{
	bool first = true;

	for (int i = 0; i < g_res.ndg; i++) {
		const struct res_dgram *r = &g_res.dg[i];
		double mn = 0, mx = 0, m;

		if (!r->n)
			continue;
		m = dg_med(r, offsetof(struct dg_sample, mbps), &mn, &mx);
		if (!json) {
			fprintf(f,
			        "dgram,%s,%zu,,%d,%s,%d,,,,,,,,,,,,,,,,%.1f,%.1f,%.1f,%.0f,%.0f,%.0f,"
			        "%.0f,%.3f\n",
			        dg_name[r->t], r->size, r->senders, r->variant, r->n, m, mn, mx,
			        DG_MED(r, sent), DG_MED(r, received), DG_MED(r, lost),
			        DG_MED(r, counted), dg_ratio_udp(r));
			continue;
		}
		fprintf(f,
		        "%s\n    {\"transport\": \"%s\", \"size\": %zu, \"senders\": %d, "
		        "\"variant\": \"%s\", \"runs\": %d, \"mbps\": %.2f, \"mbps_min\": %.2f, "
		        "\"mbps_max\": %.2f, \"tx_mbps\": %.2f, \"sent\": %.0f, \"received\": %.0f, "
		        "\"lost\": %.0f, \"counted_drops\": %.0f, \"send_busy\": %.0f, "
		        "\"bad_length\": %.0f, \"ratio_udp\": %.3f}",
		        first ? "" : ",", dg_name[r->t], r->size, r->senders, r->variant, r->n, m,
		        mn, mx, DG_MED(r, tx_mbps), DG_MED(r, sent), DG_MED(r, received),
		        DG_MED(r, lost), DG_MED(r, counted), DG_MED(r, busy), DG_MED(r, bad),
		        dg_ratio_udp(r));
		first = false;
	}
}

void dgram_csv(FILE *f)
{
	dg_records(f, false);
}

void dgram_json(FILE *f)
{
	dg_records(f, true);
}
