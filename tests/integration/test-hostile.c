/* SPDX-License-Identifier: MIT */
/*
 * Hostile VMMs, guests and host clients against a real uvsockd serving two VMs (suite
 * 'integration'). VM "victim" (CID 3) is a well-behaved guest-role context (<uvsock/guest.h>)
 * doing a patterned transfer both ways at once, guest -> host and host -> guest, every byte
 * checked at its offset (tests/harness/guestside.h), WHILE VM "attacker" (CID 4) attacks through
 * its VMM (raw vhost-user messages, a hand-driven front-end), its guest (rings driven by hand:
 * tests/harness/hostile.h) or its host clients. Every scenario asserts: the victim's transfer
 * completes with 0 bytes lost or corrupted; uvsockd is alive and serves the victim (a new
 * connection each way works); uvsockd's VmRSS stays under RSS_BOUND_KIB and its log under
 * LOG_BOUND; SIGTERM stops it cleanly within 5 s with the attacker still connected; and what the
 * scenario itself is about (counted drops, refused sessions, nothing mapped, ...). Nothing timed
 * decides pass or fail: waits are bounds against hangs only.
 *
 * `test-hostile --bench [--runs N] [--mib M] [--pick NAME]` (a meson benchmark, never run by
 * `meson test`) runs a baseline without attack and every scenario (or only NAME) N times each
 * (the victim moving at least M MiB each way, default 512), round-robin, and prints the victim's throughput under attack
 * against the baseline (medians), the bytes lost and uvsockd's peak RSS.
 * docs/hostile-scenarios.md has the scenarios, the bounds and a measured table.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "childrun.h"
#include "guestside.h"
#include "hostile.h"
#include "test.h"
#include "uvsockd-proc.h"

#define MiB            (1024u * 1024u)
#define VICTIM         0 /* index in struct uvd: CID 3 */
#define ATTACKER       1 /* CID 4 */
#define VICTIM_CID     3u
#define ATTACKER_CID   4u
#define HOST_PORT      5000u /* the victim's host service (guest -> host) */
#define GUEST_PORT     6000u /* the victim's guest service (host -> guest) */
#define IDLE_MS        10000 /* the victim's transfer fails after this long without progress */
#define XFER_CHUNK     65536u
/* Under attack a sender goes on until the attack did its rounds, but not beyond this. */
#define XFER_MAX_MS    10000u
#define ARRAY_SIZE_(x) (sizeof(x) / sizeof((x)[0]))

/*
 * uvsockd's VmRSS must stay under this. Measured without attack: about 9 MiB (the binary, two VM
 * threads, per-VM 64 KiB scratch buffers, 256 KiB receive buffers per connection, and the
 * victim's rings and RX buffers in shared guest memory that the daemon touches); under the
 * attacks 9 to 12 MiB. Every resource a guest or host program can make it hold is bounded
 * (connections per VM, queued replies, sibling hand-off, guest memory it maps but does not
 * touch), so an attack adds at most a few of those bounds; unbounded buffering of a flood would
 * reach hundreds of MiB within the transfer. 64 MiB leaves room for the bounds (1032 connections
 * of one VM are a few MiB of state) without hiding a leak.
 *
 * Under AddressSanitizer freed memory sits in the allocator's quarantine (256 MiB by default) and
 * shadow and metadata pages are resident too: the daemon then runs with a quarantine of
 * ASAN_QUARANTINE_MB and the bound allows for those; the plain build checks the real bound.
 */
#if defined(__SANITIZE_ADDRESS__)
#define HOSTILE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOSTILE_ASAN 1
#endif
#endif
#ifdef HOSTILE_ASAN
#define ASAN_QUARANTINE_MB 32
#define RSS_BOUND_KIB      ((64u + ASAN_QUARANTINE_MB + 128u) * 1024)
#else
#define RSS_BOUND_KIB (64u * 1024)
#endif
/* The log (--log-level=warn): guest-triggered messages are rate-limited, so a flood of bad
 * packets or sessions must not write more than this. */
#define LOG_BOUND (1u << 20)

static size_t xfer_total(void)
{
	const char *e = getenv("UVSOCK_HOSTILE_MIB");

	return (e && atoi(e) > 0 ? (size_t)atoi(e) : 32u) * MiB;
}

/* ---- the victim: a transfer both ways, every byte checked -------------------------------- */

/*
 * One direction's end: sends patterned bytes on fd, or receives them up to the end of the stream
 * checking each at its offset. A sender sends at least min_total bytes and goes on while the
 * attack has not done `until` rounds yet (until end_ms at most), so that the transfer spans whole
 * attack rounds; then it shuts its side down. (The time bounds the test's length; it decides
 * nothing.)
 */
struct xfer {
	int fd;
	bool guest, send;
	size_t min_total;
	const _Atomic uint64_t *rounds; /* the attack's rounds (NULL: no attack) */
	uint64_t until, end_ms;
	uint64_t seed;
	size_t done;  /* bytes sent, or received matching the pattern */
	int err;      /* errno of the failure (ETIMEDOUT: IDLE_MS without progress), 0 */
	bool corrupt; /* a received byte differed from the pattern (at offset done) */
};

static ssize_t xfer_io(struct xfer *x, uint8_t *buf, size_t n)
{
	if (x->guest)
		return x->send ? uvsock_send(x->fd, buf, n, 0) : uvsock_recv(x->fd, buf, n, 0);
	if (hs_wait_fd(x->fd, x->send ? POLLOUT : POLLIN, IDLE_MS) <= 0) {
		errno = ETIMEDOUT;
		return -1;
	}
	return x->send ? send(x->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL)
	               : recv(x->fd, buf, n, MSG_DONTWAIT);
}

/* True once a sender has sent enough. */
static bool xfer_enough(const struct xfer *x)
{
	if (x->done < x->min_total)
		return false;
	return !x->rounds || atomic_load(x->rounds) >= x->until || test_now_ms() >= x->end_ms;
}

static void *xfer_main(void *arg)
{
	struct xfer *x = arg;
	uint8_t *buf = malloc(XFER_CHUNK);

	x->err = buf ? 0 : ENOMEM;
	while (buf && !(x->send && xfer_enough(x))) {
		size_t n = XFER_CHUNK;
		ssize_t r;

		if (x->send && !x->rounds && x->min_total - x->done < n)
			n = x->min_total - x->done;
		if (x->send)
			hs_fill(buf, n, x->seed, x->done);
		r = xfer_io(x, buf, n);
		if (r < 0 && (errno == EINTR || (!x->guest && errno == EAGAIN)))
			continue;
		if (r == 0 && !x->send)
			break; /* the end of the stream */
		if (r <= 0) {
			x->err = r == 0 ? EPIPE : errno == EAGAIN ? ETIMEDOUT : errno;
			break;
		}
		if (!x->send) {
			size_t good = hs_check(buf, (size_t)r, x->seed, x->done);

			if (good != (size_t)r) {
				x->done += good;
				x->corrupt = true;
				break;
			}
		}
		x->done += (size_t)r;
	}
	if (x->send && x->guest)
		uvsock_shutdown(x->fd, SHUT_WR);
	else if (x->send)
		shutdown(x->fd, SHUT_WR);
	free(buf);
	return NULL;
}

struct victim {
	struct uvd *u;
	struct uvsock_ctx *g;
	int lfd;                   /* host listener <uds>_5000 */
	int ls;                    /* guest listener, port 6000 */
	int fd[4];                 /* g2h guest end, g2h host end, h2g host end, h2g guest end */
	_Atomic uint32_t g2h_port; /* the guest's port of the g2h connection (0: not yet) */
	_Atomic uint32_t h2g_port; /* the host's port of the h2g connection (0: not yet) */
	struct xfer x[4];
	uint64_t ms;
	char err[200];
};

/*
 * One connection each way: guest -> host port 5000 (accepted on lfd) and host -> guest port 6000
 * (CONNECT through the uds, accepted on ls). fds[] as struct victim's fd. Returns false with
 * err set if one cannot be made (asserts nothing: a scenario may explain a failure).
 */
static bool victim_pair(struct victim *v, int fds[4], char *err, size_t errlen)
{
	struct sockaddr_vm a;
	socklen_t alen = sizeof(a);

	fds[0] = g_connect(v->g, SOCK_STREAM, VMADDR_CID_HOST, HOST_PORT);
	if (fds[0] < 0) {
		snprintf(err, errlen, "guest connect to host port %u: %s", HOST_PORT,
		         strerror(errno));
		return false;
	}
	fds[1] = hs_accept(v->lfd, WAIT_MS);
	if (fds[1] < 0) {
		snprintf(err, errlen, "the host did not get the guest's connection");
		return false;
	}
	fds[2] = hs_connect_guest(v->u->uds[VICTIM], GUEST_PORT, SOCK_STREAM, WAIT_MS);
	if (fds[2] < 0) {
		snprintf(err, errlen, "host CONNECT %u through %s refused or unanswered",
		         GUEST_PORT, v->u->uds[VICTIM]);
		return false;
	}
	if (!(g_wait_events(v->ls, POLLIN, WAIT_MS) & POLLIN) ||
	    (fds[3] = uvsock_accept(v->ls, (struct sockaddr *)&a, &alen)) < 0) {
		snprintf(err, errlen, "the guest did not get the host's connection");
		return false;
	}
	ASSERT_EQ(a.svm_cid, VMADDR_CID_HOST);
	g_set_timeouts(fds[0], IDLE_MS);
	g_set_timeouts(fds[3], IDLE_MS);
	return true;
}

static void close_pair(int fds[4])
{
	for (int i = 0; i < 4; i++) {
		if (fds[i] < 0)
			continue;
		if (i == 0 || i == 3)
			uvsock_close(fds[i]);
		else
			close(fds[i]);
		fds[i] = -1;
	}
}

static void victim_open(struct victim *v, struct uvd *u)
{
	memset(v, 0, sizeof(*v));
	v->u = u;
	for (int i = 0; i < 4; i++)
		v->fd[i] = -1;
	v->g = g_guest_new(u->sock[VICTIM], NULL);
	ASSERT_EQ(uvsock_ctx_local_cid(v->g), VICTIM_CID);
	v->lfd = hs_listen_port(u->uds[VICTIM], HOST_PORT, SOCK_STREAM);
	v->ls = g_listen(v->g, SOCK_STREAM, GUEST_PORT);
}

/*
 * Connects both ways and moves at least min_total bytes in each direction at once, more while
 * the attack has not done nrounds more rounds (rounds: NULL without attack). False (err set) if
 * the connections could not be made; the transfer's own outcome is in v->x[].
 */
static bool victim_transfer(struct victim *v, size_t min_total, const _Atomic uint64_t *rounds,
                            unsigned nrounds)
{
	struct sockaddr_vm a;
	socklen_t alen = sizeof(a);
	pthread_t th[4];
	uint64_t t0;

	if (!victim_pair(v, v->fd, v->err, sizeof(v->err)))
		return false;
	ASSERT_EQ(uvsock_getsockname(v->fd[0], (struct sockaddr *)&a, &alen), 0);
	atomic_store(&v->g2h_port, a.svm_port);
	alen = sizeof(a);
	ASSERT_EQ(uvsock_getpeername(v->fd[3], (struct sockaddr *)&a, &alen), 0);
	atomic_store(&v->h2g_port, a.svm_port);
	v->x[0] = (struct xfer){ .fd = v->fd[0], .guest = true, .send = true, .seed = 0x51 };
	v->x[1] = (struct xfer){ .fd = v->fd[1], .seed = 0x51 };
	v->x[2] = (struct xfer){ .fd = v->fd[2], .send = true, .seed = 0x52 };
	v->x[3] = (struct xfer){ .fd = v->fd[3], .guest = true, .seed = 0x52 };
	t0 = test_now_ms();
	for (int i = 0; i < 4; i++) {
		v->x[i].min_total = min_total;
		v->x[i].end_ms = t0 + XFER_MAX_MS;
		v->x[i].rounds = rounds;
		v->x[i].until = rounds ? atomic_load(rounds) + nrounds : 0;
		ASSERT_EQ(pthread_create(&th[i], NULL, xfer_main, &v->x[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	v->ms = test_now_ms() - t0;
	return true;
}

/* Bytes the victim sent that did not arrive intact. */
static uint64_t victim_lost(const struct victim *v)
{
	return (uint64_t)(v->x[0].done - v->x[1].done) + (v->x[2].done - v->x[3].done);
}

/* Bytes the victim moved, both ways. */
static uint64_t victim_bytes(const struct victim *v)
{
	return (uint64_t)v->x[1].done + v->x[3].done;
}

/* Says what went wrong with the transfer (into err), or returns false if nothing did. */
static bool victim_failed(struct victim *v)
{
	static const char *const what[4] = { "g2h guest send", "g2h host recv", "h2g host send",
		                             "h2g guest recv" };

	for (int i = 0; i < 4; i++) {
		const struct xfer *x = &v->x[i];

		if (!x->err && !x->corrupt && (x->send || x->done == v->x[i - 1].done))
			continue;
		snprintf(v->err, sizeof(v->err), "%s stopped at %zu bytes (%zu sent): %s", what[i],
		         x->done, x->send ? x->done : v->x[i - 1].done,
		         x->corrupt ? "corrupt data"
		         : x->err   ? strerror(x->err)
		                    : "early end");
		return true;
	}
	return false;
}

/* A new small connection each way works (the daemon still serves the victim). */
static void victim_probe(struct victim *v)
{
	int fds[4];
	char err[200], b[4];

	if (!victim_pair(v, fds, err, sizeof(err)))
		test_fail(__FILE__, __LINE__, "the victim's new connection: %s", err);
	ASSERT_EQ(uvsock_send(fds[0], "ping", 4, 0), 4);
	ASSERT_EQ(hs_read_full(fds[1], b, 4, WAIT_MS), 4);
	ASSERT_MEMEQ(b, "ping", 4);
	hs_write_all(fds[2], "pong", 4);
	ASSERT_EQ(uvsock_recv(fds[3], b, 4, MSG_WAITALL), 4);
	ASSERT_MEMEQ(b, "pong", 4);
	close_pair(fds);
}

static void victim_close(struct victim *v)
{
	close_pair(v->fd);
	uvsock_close(v->ls);
	close(v->lfd);
	uvsock_ctx_free(v->g);
}

/* ---- uvsockd's memory, sampled while the victim transfers ------------------------------- */

struct sampler {
	pid_t pid;
	atomic_bool stop;
	uint64_t rss_kib, vm_kib; /* peaks of VmRSS and VmSize */
	uint64_t vm0_kib;         /* VmSize before the attack */
	pthread_t th;
};

static void *sampler_main(void *arg)
{
	struct sampler *s = arg;

	while (!atomic_load(&s->stop)) {
		uint64_t r = proc_status_kib(s->pid, "VmRSS"), m = proc_status_kib(s->pid, "VmSize");

		s->rss_kib = r > s->rss_kib ? r : s->rss_kib;
		s->vm_kib = m > s->vm_kib ? m : s->vm_kib;
		test_sleep_ms(10); /* the sampling interval */
	}
	return NULL;
}

/* ---- scenarios ------------------------------------------------------------------------------ */

struct atk;

struct scen {
	const char *name;    /* the TEST's name and the bench table's row */
	const char *group;   /* both VMs in this sibling group; NULL: a group each */
	bool low_nofile;     /* uvsockd starts with RLIMIT_NOFILE soft 1024 (a distro default) */
	unsigned min_rounds; /* attack rounds the victim's transfer spans at least (0: 2) */
	void (*setup)(struct atk *a);    /* before the victim starts (optional) */
	void (*round)(struct atk *a);    /* one attack, repeated until the victim is done */
	void (*check)(struct atk *a);    /* the finding's assertions, attacker still there */
	void (*teardown)(struct atk *a); /* after uvsockd was stopped (optional) */
};

/* The attacker's state: what every scenario may use. */
struct atk {
	const struct scen *s;
	struct uvd *u;
	struct victim *v;
	atomic_bool stop;
	_Atomic uint64_t rounds;
	uint64_t n[4];        /* per-scenario counts (written by the attack thread) */
	struct rawg rg;       /* a raw guest, if the scenario keeps one */
	struct vhu_front *f;  /* a front-end, if the scenario keeps one */
	struct uvsock_ctx *g; /* a well-behaved guest of the attacker VM, if needed */
	int fds[2048];        /* host sockets held by the attacker */
	int nfds;
	int efd, lfd;              /* scenario fds (-1: none) */
	int ls;                    /* a guest listener of the attacker VM (-1: none) */
	pthread_t th;              /* a helper thread of the scenario (lfd's acceptor) */
	_Atomic uint64_t accepted; /* connections that thread accepted */
	uint64_t cmp;              /* a value set in setup, compared in check */
	uint32_t port;
};

static void *attack_main(void *arg)
{
	struct atk *a = arg;

	while (!atomic_load(&a->stop)) {
		a->s->round(a);
		atomic_fetch_add(&a->rounds, 1);
	}
	return NULL;
}

/* The attacker VM's stats value `what` (see hv_stat). */
static uint64_t att_stat(struct atk *a, const char *what)
{
	return hv_stat(a->u->sock[VICTIM], ATTACKER_CID, what);
}

static uint64_t vic_stat(struct atk *a, const char *what)
{
	return hv_stat(a->u->sock[VICTIM], VICTIM_CID, what);
}

/* After the attack the attacker VM serves a well-behaved guest again: only its own sessions were
 * ever broken, not its device. */
static void attacker_recovers(struct atk *a)
{
	struct uvsock_ctx *g = g_guest_new(a->u->sock[ATTACKER], NULL);
	int lfd = hs_listen_port(a->u->uds[ATTACKER], HOST_PORT, SOCK_STREAM);
	int fds[4] = { -1, -1, -1, -1 }; /* as close_pair() wants them: guest end, host end */
	char b[2];

	ASSERT_EQ(uvsock_ctx_local_cid(g), ATTACKER_CID);
	fds[0] = g_connect_accept(g, lfd, SOCK_STREAM, HOST_PORT, &fds[1]);
	ASSERT_EQ(uvsock_send(fds[0], "ok", 2, 0), 2);
	ASSERT_EQ(hs_read_full(fds[1], b, 2, WAIT_MS), 2);
	close_pair(fds);
	close(lfd);
	uvsock_ctx_free(g);
}

/* ---- a. malformed vhost-user messages ---- */

/* Writes a vhost-user header and payload bytes with nfds fds, bypassing vhu_msg_send's checks. */
static void raw_msg(int fd, uint32_t req, uint32_t flags, uint32_t size, const void *p, size_t plen,
                    const int *fds, unsigned nfds)
{
	uint8_t buf[12 + 512];
	uint32_t h[3] = { req, flags, size };
	union {
		struct cmsghdr c;
		char b[CMSG_SPACE(sizeof(int) * 16)];
	} cm;
	struct iovec iov = { .iov_base = buf, .iov_len = 12 + plen };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	ASSERT_LE(plen, 512);
	ASSERT_LE(nfds, 16);
	memcpy(buf, h, 12);
	if (plen)
		memcpy(buf + 12, p, plen);
	if (nfds) {
		memset(&cm, 0, sizeof(cm));
		m.msg_control = cm.b;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm.c.cmsg_level = SOL_SOCKET;
		cm.c.cmsg_type = SCM_RIGHTS;
		cm.c.cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(&cm.c), fds, sizeof(int) * nfds);
	}
	ASSERT_EQ(sendmsg(fd, &m, MSG_NOSIGNAL), (ssize_t)(12 + plen));
}

#define OWNER(fd) raw_msg(fd, VHU_REQ_SET_OWNER, 1, 0, NULL, 0, NULL, 0)

/* Malformed message number i (of MALFORMED) on a fresh session fd; may end the write side. */
static void malformed(int fd, unsigned i)
{
	uint8_t junk[64] = { 0 };
	uint64_t q = 0;
	struct vhu_vring_state st = { .index = 0, .num = 128 };
	uint32_t nine = 9;
	uint8_t regions[8 + 9 * 32];
	int efd = eventfd(0, EFD_CLOEXEC), fds[9];

	ASSERT_GE(efd, 0);
	for (int k = 0; k < 9; k++)
		fds[k] = efd;
	switch (i) {
	case 0: /* a header announcing more than the largest payload */
		raw_msg(fd, VHU_REQ_GET_FEATURES, 1, VHU_PAYLOAD_MAX + 1, NULL, 0, NULL, 0);
		break;
	case 1: /* a truncated payload, then silence: the back-end's message deadline ends it */
		OWNER(fd);
		raw_msg(fd, VHU_REQ_SET_VRING_NUM, 1, sizeof(st), &st, 3, NULL, 0);
		break;
	case 2: /* an unknown request */
		OWNER(fd);
		raw_msg(fd, 9999, 1, 0, NULL, 0, NULL, 0);
		break;
	case 3: /* an fd where none is expected */
		raw_msg(fd, VHU_REQ_SET_OWNER, 1, 0, NULL, 0, &efd, 1);
		break;
	case 4: /* a truncated payload, then the end of the stream */
		OWNER(fd);
		raw_msg(fd, VHU_REQ_SET_VRING_NUM, 1, sizeof(st), &st, 3, NULL, 0);
		shutdown(fd, SHUT_WR);
		break;
	case 5: /* a bad version in the flags */
		raw_msg(fd, VHU_REQ_GET_FEATURES, 2, 0, NULL, 0, NULL, 0);
		break;
	case 6: /* a reply flag on a request */
		raw_msg(fd, VHU_REQ_GET_FEATURES, VHU_REPLY_FLAGS, 0, NULL, 0, NULL, 0);
		break;
	case 7: /* more memory regions than a table holds */
		OWNER(fd);
		memset(regions, 0, sizeof(regions));
		memcpy(regions, &nine, sizeof(nine));
		raw_msg(fd, VHU_REQ_SET_MEM_TABLE, 1, sizeof(regions), regions, sizeof(regions),
		        &efd, 1);
		break;
	case 8: /* a payload size that does not match the request */
		OWNER(fd);
		raw_msg(fd, VHU_REQ_SET_VRING_NUM, 1, 4, &st, 4, NULL, 0);
		break;
	case 9: /* a payload on a request that takes none */
		raw_msg(fd, VHU_REQ_GET_FEATURES, 1, 8, &q, 8, NULL, 0);
		break;
	case 10: /* more fds than a message may carry */
		OWNER(fd);
		raw_msg(fd, VHU_REQ_SET_VRING_KICK, 1, 8, &q, 8, fds, 9);
		break;
	case 11: /* a ring index out of range */
		OWNER(fd);
		st.index = 7;
		raw_msg(fd, VHU_REQ_SET_VRING_NUM, 1, sizeof(st), &st, sizeof(st), NULL, 0);
		break;
	case 12: /* a ring size that is not a power of 2 */
		OWNER(fd);
		st.num = 100;
		raw_msg(fd, VHU_REQ_SET_VRING_NUM, 1, sizeof(st), &st, sizeof(st), NULL, 0);
		break;
	default: /* garbage */
		for (unsigned k = 0; k < sizeof(junk); k++)
			junk[k] = (uint8_t)(k * 37 + 11);
		ASSERT_EQ(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
		break;
	}
	close(efd);
}

#define MALFORMED 14

static void malformed_round(struct atk *a)
{
	unsigned i = (unsigned)(atomic_load(&a->rounds) % MALFORMED);
	int fd = hv_connect(a->u->sock[ATTACKER]);

	malformed(fd, i);
	/* Case 1 waits out the daemon's message deadline (5 s). */
	if (!hv_dropped(fd, 3 * VHU_MSG_TIMEOUT_MS))
		test_fail(__FILE__, __LINE__, "malformed message %u: the session was not dropped",
		          i);
	close(fd);
	a->n[0]++;
}

static void malformed_check(struct atk *a)
{
	test_note("%" PRIu64 " malformed sessions, each dropped", a->n[0]);
	ASSERT_GE(a->n[0], 3);
	attacker_recovers(a);
}

/* ---- b. out-of-order set-up ---- */

/* Sequence i of OUT_OF_ORDER on a fresh front-end session; return values are ignored (the
 * back-end may end the session at any step, the rest then fail). */
static void out_of_order(struct vhu_front *f, unsigned i)
{
	uint64_t one = 1, feat = VHU_BIT(VHU_F_VERSION_1);
	uint16_t bases[2];
	struct vhu_mem_table t = { .nregions = 0 };

	switch (i) {
	case 0: /* requests before SET_OWNER */
		(void)vhu_front_set_features(f, feat);
		(void)vhu_front_set_mem_table(f);
		break;
	case 1: /* rings (SET_VRING_ADDR, KICK) before SET_MEM_TABLE and SET_FEATURES, kicked */
		(void)vhu_front_init(f);
		(void)vhu_front_setup_ring(f, 1, 0);
		(void)!write(vhu_front_ring(f, 1)->kick_fd, &one, 8);
		(void)vhu_front_set_features(f, vhu_front_features(f));
		(void)vhu_front_set_mem_table(f);
		(void)vhu_front_enable_ring(f, 1, true);
		(void)!write(vhu_front_ring(f, 1)->kick_fd, &one, 8);
		break;
	case 2: /* kicks and enables before features, then features changed while running */
		(void)vhu_front_init(f);
		(void)vhu_front_enable_ring(f, 0, true);
		(void)vhu_front_setup_ring(f, 0, 0);
		(void)!write(vhu_front_ring(f, 0)->kick_fd, &one, 8);
		(void)vhu_front_start(f);
		(void)vhu_front_set_features(f, feat | VHU_BIT(VHU_F_PROTOCOL_FEATURES));
		(void)!write(vhu_front_ring(f, 1)->kick_fd, &one, 8);
		break;
	case 3: /* a ring re-sized and re-based while it runs */
		(void)vhu_front_init(f);
		(void)vhu_front_start(f);
		(void)vhu_front_setup_ring(f, 1, 77);
		(void)!write(vhu_front_ring(f, 1)->kick_fd, &one, 8);
		break;
	case 4: /* GET_VRING_BASE of rings that never started, then an empty memory table */
		(void)vhu_front_init(f);
		(void)vhu_front_get_vring_base(f, 0, &bases[0]);
		(void)vhu_front_get_vring_base(f, 1, &bases[1]);
		(void)vhu_front_request(f, VHU_REQ_SET_MEM_TABLE, false, &t, 8, NULL, 0, NULL, 0);
		break;
	case 5: /* stopped, then kicked, then the memory table replaced under running rings */
		(void)vhu_front_init(f);
		(void)vhu_front_start(f);
		(void)vhu_front_stop(f, bases);
		(void)!write(vhu_front_ring(f, 0)->kick_fd, &one, 8);
		(void)vhu_front_start(f);
		(void)vhu_front_set_mem_table(f);
		(void)!write(vhu_front_ring(f, 1)->kick_fd, &one, 8);
		break;
	default: /* SET_FEATURES twice, SET_OWNER twice */
		(void)vhu_front_init(f);
		(void)vhu_front_request(f, VHU_REQ_SET_OWNER, false, NULL, 0, NULL, 0, NULL, 0);
		(void)vhu_front_set_features(f, feat);
		(void)vhu_front_set_features(f, feat | VHU_BIT(VHU_F_EVENT_IDX));
		(void)vhu_front_start(f);
		break;
	}
}

#define OUT_OF_ORDER 7

static void out_of_order_round(struct atk *a)
{
	unsigned i = (unsigned)(atomic_load(&a->rounds) % OUT_OF_ORDER);
	struct vhu_front_config cfg;
	struct vhu_front *f;
	uint64_t feat;
	int r;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 1u << 20;
	ASSERT_OK(vhu_front_new(hv_connect(a->u->sock[ATTACKER]), &cfg, &f));
	out_of_order(f, i);
	/* Either the back-end ended the session or it still answers: never a hang. */
	r = vhu_front_get_features(f, &feat);
	if (r == -ETIMEDOUT)
		test_fail(__FILE__, __LINE__,
		          "sequence %u: the back-end neither answers nor hangs up", i);
	a->n[r == 0 ? 1 : 0]++;
	vhu_front_free(f);
}

static void out_of_order_check(struct atk *a)
{
	test_note("out-of-order sessions: %" PRIu64 " dropped, %" PRIu64 " still answering",
	          a->n[0], a->n[1]);
	ASSERT_GE(a->n[0] + a->n[1], 2);
	attacker_recovers(a);
}

/* ---- c. header / chain length mismatches and oversize packets ---- */

static void bad_chains_round(struct atk *a)
{
	struct rawg *g = &a->rg;
	uint8_t wire[VSOCK_HDR_SIZE];
	struct vsock_hdr h = rawg_hdr(ATTACKER_CID, 1234, VMADDR_CID_HOST, 5001, VSOCK_OP_RW);
	static uint8_t big[70000];
	struct vring_drv_buf out;
	int head;

	rawg_open(g, a->u->sock[ATTACKER], true);
	/* Malformed chains (dropped as such): shorter than a header, */
	vsock_hdr_encode(&h, wire);
	ASSERT_OK(rawg_send(g, &(struct rawg_seg){ wire, 10, false }, 1));
	/* a header claiming more than its chain, */
	h.len = 1000;
	ASSERT_OK(rawg_send_pkt(g, &h, big, 10));
	h.len = UINT32_MAX;
	ASSERT_OK(rawg_send_pkt(g, &h, NULL, 0));
	/* chains beyond the largest packet (64 KiB + header), whatever the header says, */
	h.len = sizeof(big);
	ASSERT_OK(rawg_send_pkt(g, &h, big, sizeof(big)));
	h.len = 10;
	ASSERT_OK(rawg_send_pkt(g, &h, big, VSOCK_MAX_PKT_PAYLOAD + 1));
	/* and a device-writable element in a TX chain. */
	h.len = 0;
	h.op = VSOCK_OP_REQUEST;
	vsock_hdr_encode(&h, wire);
	ASSERT_OK(rawg_send(
	        g, (struct rawg_seg[]){ { wire, VSOCK_HDR_SIZE, false }, { NULL, 64, true } }, 2));
	a->n[0] += 6;
	/* Bad op and bad type (well-formed chains the engine drops). */
	h.op = 99;
	ASSERT_OK(rawg_send_pkt(g, &h, NULL, 0));
	h.op = VSOCK_OP_REQUEST;
	h.type = 9;
	ASSERT_OK(rawg_send_pkt(g, &h, NULL, 0));
	a->n[1]++;
	a->n[2]++;
	/* Legal but unusual layouts: the header in 7 pieces, then the payload; extra chain bytes
	 * beyond len. */
	h.type = VSOCK_TYPE_STREAM;
	h.op = VSOCK_OP_RW;
	h.len = 4;
	vsock_hdr_encode(&h, wire);
	ASSERT_OK(rawg_send(g,
	                    (struct rawg_seg[]){ { wire, 5, false },
	                                         { wire + 5, 5, false },
	                                         { wire + 10, 5, false },
	                                         { wire + 15, 5, false },
	                                         { wire + 20, 5, false },
	                                         { wire + 25, 5, false },
	                                         { wire + 30, 14, false },
	                                         { "data", 4, false } },
	                    8));
	ASSERT_OK(rawg_send_pkt(g, &h, big, 1000));
	if (!rawg_wait_tx(g, WAIT_MS))
		test_fail(__FILE__, __LINE__,
		          "the device did not return the TX buffers (%" PRIu64 " of %" PRIu64 ")",
		          g->tx_done, g->tx_sent);
	/* Last, a descriptor outside guest memory: this session's rings are broken for good. */
	out = (struct vring_drv_buf){ .addr = 1ull << 40, .len = VSOCK_HDR_SIZE };
	head = vring_drv_add(g->tx, &out, 1, (void *)(uintptr_t)1);
	ASSERT_GE(head, 0);
	g->busy[0] = true;
	rawg_kick(g);
	a->n[3]++;
	ASSERT_WAIT_FOR(att_stat(a, "ring_errors") >= a->n[3], WAIT_MS);
	rawg_close(g);
}

static void bad_chains_check(struct atk *a)
{
	test_note("%" PRIu64 " sessions of bad chains", a->n[3]);
	ASSERT_GE(att_stat(a, "dropped.malformed"), a->n[0]);
	ASSERT_GE(att_stat(a, "dropped.bad_op"), a->n[1]);
	ASSERT_GE(att_stat(a, "dropped.bad_type"), a->n[2]);
	ASSERT_EQ(att_stat(a, "ring_errors"), a->n[3]);
	ASSERT_EQ(vic_stat(a, "dropped.malformed"), 0);
	ASSERT_EQ(vic_stat(a, "ring_errors"), 0);
	attacker_recovers(a);
}

/* ---- d. spoofed source CIDs ---- */

static void spoof_setup(struct atk *a)
{
	rawg_open(&a->rg, a->u->sock[ATTACKER], true);
}

static void spoof_round(struct atk *a)
{
	struct rawg *g = &a->rg;
	uint32_t gp = atomic_load(&a->v->g2h_port), hp = atomic_load(&a->v->h2g_port);
	static const uint8_t junk[64] = "spoofed bytes that must never reach the victim's stream";
	struct vsock_hdr h[10];
	unsigned n = 0;

	/* Claims the victim's CID towards the host (its host service's port). */
	h[n++] = rawg_hdr(VICTIM_CID, 40000, VMADDR_CID_HOST, HOST_PORT, VSOCK_OP_REQUEST);
	/* Claims the host towards the victim (a sibling): a new connection to its service, */
	h[n++] = rawg_hdr(VMADDR_CID_HOST, 40001, VICTIM_CID, GUEST_PORT, VSOCK_OP_REQUEST);
	/* and, once the victim's connections exist, data, resets and a zero window on them. */
	if (gp && hp) {
		h[n] = rawg_hdr(VMADDR_CID_HOST, hp, VICTIM_CID, GUEST_PORT, VSOCK_OP_RW);
		h[n++].len = sizeof(junk);
		h[n++] = rawg_hdr(VMADDR_CID_HOST, hp, VICTIM_CID, GUEST_PORT, VSOCK_OP_RST);
		h[n++] = rawg_hdr(VMADDR_CID_HOST, HOST_PORT, VICTIM_CID, gp, VSOCK_OP_RST);
		h[n] = rawg_hdr(VMADDR_CID_HOST, HOST_PORT, VICTIM_CID, gp, VSOCK_OP_CREDIT_UPDATE);
		h[n++].buf_alloc = 0;
		h[n++] = rawg_hdr(VICTIM_CID, gp, VICTIM_CID, GUEST_PORT, VSOCK_OP_RST);
	}
	/* Reserved CIDs as source. */
	h[n++] = rawg_hdr(VMADDR_CID_LOCAL, 40002, VMADDR_CID_HOST, HOST_PORT, VSOCK_OP_REQUEST);
	h[n++] = rawg_hdr(UINT32_MAX, 40003, VICTIM_CID, GUEST_PORT, VSOCK_OP_REQUEST);
	rawg_reap(g);
	for (unsigned i = 0; i < n; i++)
		if (rawg_send_pkt(g, &h[i], h[i].len ? junk : NULL, h[i].len) == 0)
			a->n[0]++;
	/* With its own CID, aimed at the victim's connection (a sibling's packet, routed, which
	 * the victim's engine must not take as the host's). */
	if (hp) {
		struct vsock_hdr r =
		        rawg_hdr(ATTACKER_CID, hp, VICTIM_CID, GUEST_PORT, VSOCK_OP_RST);

		if (rawg_send_pkt(g, &r, NULL, 0) == 0)
			a->n[1]++;
	}
	if (!rawg_wait_tx(g, WAIT_MS))
		test_fail(__FILE__, __LINE__, "the attacker's TX ring stalled or broke");
}

static void spoof_check(struct atk *a)
{
	struct uvsock_ctx_stats cs = { .size = sizeof(cs) };

	test_note("%" PRIu64 " spoofed packets, %" PRIu64 " routed resets", a->n[0], a->n[1]);
	ASSERT_GE(a->n[0], 10);
	ASSERT_EQ(att_stat(a, "dropped.spoofed_cid"), a->n[0]);
	/* Nothing reached the victim's host service or its guest listener. */
	ASSERT_EQ(hs_wait_fd(a->v->lfd, POLLIN, 0), 0);
	ASSERT_EQ(uvsock_poll_events(a->v->ls) & POLLIN, 0);
	ASSERT_EQ(uvsock_ctx_get_stats(a->v->g, &cs), 0);
	test_note("victim engine: %" PRIu64 " RSTs received, %" PRIu64 " dropped", cs.rst_received,
	          cs.dropped);
	ASSERT_EQ(vic_stat(a, "dropped.spoofed_cid"), 0);
}

static void rawg_teardown(struct atk *a)
{
	rawg_close(&a->rg);
}

/* ---- e. REQUEST / small-packet flood to host ports ---- */

/* Accepts and closes at once whatever comes to lfd, until stop. */
static void *acceptor_main(void *arg)
{
	struct atk *a = arg;

	while (!atomic_load(&a->stop)) {
		int fd = hs_accept(a->lfd, 50);

		if (fd >= 0) {
			atomic_fetch_add(&a->accepted, 1);
			close(fd);
		}
	}
	return NULL;
}

static void flood_setup(struct atk *a)
{
	a->lfd = hs_listen_port(a->u->uds[ATTACKER], HOST_PORT, SOCK_STREAM);
	ASSERT_EQ(pthread_create(&a->th, NULL, acceptor_main, a), 0);
	rawg_open(&a->rg, a->u->sock[ATTACKER], true);
	a->port = 10000;
}

/* Fills every free TX buffer with packets from make(), kicks, and takes back what is done. */
static void flood_batch(struct atk *a, struct vsock_hdr (*make)(struct atk *a, unsigned i))
{
	struct rawg *g = &a->rg;
	unsigned i = 0;

	rawg_reap(g);
	for (;; i++) {
		struct vsock_hdr h = make(a, i);

		if (rawg_send_pkt(g, &h, h.len ? "x" : NULL, h.len) < 0)
			break;
		a->n[h.op == VSOCK_OP_REQUEST ? 0 : 1]++;
		a->port++;
	}
	rawg_kick(g);
	if (vring_drv_broken(g->tx) || vring_drv_broken(g->rx))
		test_fail(__FILE__, __LINE__, "the attacker's rings broke");
	/* Wait for room (bounded, so that stop is seen). */
	if (!vring_drv_enable_cb(g->tx))
		(void)hs_wait_fd(g->tq->call_fd, POLLIN, 10);
	vring_drv_disable_cb(g->tx);
	{
		uint64_t v;

		(void)!read(g->tq->call_fd, &v, sizeof(v));
	}
}

static struct vsock_hdr host_flood_pkt(struct atk *a, unsigned i)
{
	/* REQUESTs to a listening port and to a closed one, and 1-byte RW for no connection. */
	struct vsock_hdr h = rawg_hdr(ATTACKER_CID, a->port, VMADDR_CID_HOST,
	                              i % 3 == 1 ? HOST_PORT + 1 : HOST_PORT,
	                              i % 3 == 2 ? VSOCK_OP_RW : VSOCK_OP_REQUEST);

	h.len = h.op == VSOCK_OP_RW;
	return h;
}

static void host_flood_round(struct atk *a)
{
	uint64_t start = a->n[0];

	/* At least 32 REQUESTs a round however slowly the daemon frees ring slots (a loaded
	 * machine), so that flood_check's 1000 holds after the scenario's 50 rounds. */
	do
		flood_batch(a, host_flood_pkt);
	while (a->n[0] - start < 32 && !atomic_load(&a->stop));
}

static void flood_check(struct atk *a)
{
	uint64_t open_ = att_stat(a, "conns_open");

	test_note("%" PRIu64 " REQUESTs and %" PRIu64 " small packets; %" PRIu64
	          " host connections accepted and closed; attacker has %" PRIu64 " open, %" PRIu64
	          " refused",
	          a->n[0], a->n[1], atomic_load(&a->accepted), open_,
	          att_stat(a, "host_connects_refused"));
	ASSERT_GT(a->n[0], 1000);
	/* The engine's socket cap: max_conns (1024 by default) + 8 (src/device/device.c). */
	ASSERT_LE(open_, 1024 + 8);
	ASSERT_GT(att_stat(a, "host_connects_refused"), 0);
	ASSERT_GT(att_stat(a, "rst_sent"), 0);
}

static void flood_teardown(struct atk *a)
{
	pthread_join(a->th, NULL);
	close(a->lfd);
	rawg_close(&a->rg);
}

/* ---- f. guest memory shrunk under the daemon ---- */

static void shrink_round(struct atk *a)
{
	struct rawg *g = &a->rg;
	struct vsock_hdr h =
	        rawg_hdr(ATTACKER_CID, 1234, VMADDR_CID_HOST, HOST_PORT + 1, VSOCK_OP_REQUEST);
	uint64_t one = 1, errs = att_stat(a, "ring_errors");

	rawg_open(g, a->u->sock[ATTACKER], true);
	/* The device runs on this memory: a REQUEST goes through (and is refused). */
	ASSERT_OK(rawg_send_pkt(g, &h, NULL, 0));
	ASSERT_TRUE(rawg_wait_tx(g, WAIT_MS));
	/* The memfd (no seals: the front-end made it without MFD_ALLOW_SEALING) loses every page;
	 * the daemon's next access to it faults. This process must not touch it any more. */
	ASSERT_OK(ftruncate(vhu_front_memfd(g->f), 0));
	ASSERT_EQ(write(g->tq->kick_fd, &one, 8), 8);
	ASSERT_EQ(write(g->rq->kick_fd, &one, 8), 8);
	ASSERT_WAIT_FOR(att_stat(a, "ring_errors") > errs, WAIT_MS);
	ASSERT_TRUE(att_stat(a, "broken"));
	a->n[0]++;
	rawg_close(g);
}

static void shrink_check(struct atk *a)
{
	test_note("%" PRIu64 " sessions whose memory was shrunk under the daemon", a->n[0]);
	ASSERT_GE(att_stat(a, "ring_errors"), a->n[0]);
	ASSERT_EQ(vic_stat(a, "ring_errors"), 0);
	ASSERT_FALSE(vic_stat(a, "broken"));
	attacker_recovers(a);
}

/* ---- g. a pipe as kick fd, a pipe as call fd, /dev/zero as memory ---- */

static void bad_fd_round(struct atk *a)
{
	unsigned i = (unsigned)(atomic_load(&a->rounds) % 3);
	struct vhu_front *f = hv_front(a->u->sock[ATTACKER], 1u << 20, 128);
	struct vhu_mem_table t = { .nregions = 1 };
	uint64_t q = i;
	int p[2], fd;

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	if (i == 0) { /* the read end of a pipe whose writer is gone: readable for ever */
		close(p[1]);
		p[1] = -1;
		fd = p[0];
		(void)vhu_front_request(f, VHU_REQ_SET_VRING_KICK, false, &q, 8, &fd, 1, NULL, 0);
	} else if (i == 1) { /* the write end of a pipe: a write may block */
		fd = p[1];
		(void)vhu_front_request(f, VHU_REQ_SET_VRING_CALL, false, &q, 8, &fd, 1, NULL, 0);
	} else { /* /dev/zero: maps, but is no file the guest's memory could be in */
		fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
		ASSERT_GE(fd, 0);
		t.regions[0] = (struct vhu_mem_region){ .memory_size = 1u << 20,
			                                .userspace_addr = 0x7f0000000000ull };
		(void)vhu_front_request(f, VHU_REQ_SET_MEM_TABLE, false, &t, 8 + 32, &fd, 1, NULL,
		                        0);
		close(fd);
	}
	if (!hv_dropped(vhu_front_fd(f), WAIT_MS))
		test_fail(__FILE__, __LINE__, "bad fd %u: the session was not dropped", i);
	a->n[i]++;
	close(p[0]);
	if (p[1] >= 0)
		close(p[1]);
	vhu_front_free(f);
}

static void bad_fd_setup(struct atk *a)
{
	a->cmp = (uint64_t)hv_proc_fds(a->u->pid);
}

static void bad_fd_check(struct atk *a)
{
	test_note("sessions dropped: %" PRIu64 " pipe kick fds, %" PRIu64 " pipe call fds, %" PRIu64
	          " /dev/zero memories",
	          a->n[0], a->n[1], a->n[2]);
	ASSERT_GE(a->n[0] + a->n[1] + a->n[2], 3);
	/* Nothing was kept: the daemon has the fds it had plus the victim's two connections. */
	if (!WAIT_FOR(hv_proc_fds(a->u->pid) <= (int)a->cmp + 2, WAIT_MS))
		test_fail(__FILE__, __LINE__, "uvsockd holds %d fds, %d before the attack",
		          hv_proc_fds(a->u->pid), (int)a->cmp);
	attacker_recovers(a);
}

/* ---- h. a blocking call eventfd with a saturated counter ---- */

static void saturated_setup(struct atk *a)
{
	uint64_t v = 0xfffffffffffffffeull;

	rawg_open(&a->rg, a->u->sock[ATTACKER], true);
	a->efd = eventfd(0, EFD_CLOEXEC); /* blocking: a write of 1 would wait for a reader */
	ASSERT_GE(a->efd, 0);
	ASSERT_EQ(write(a->efd, &v, 8), 8);
	for (uint64_t q = 0; q < 2; q++)
		ASSERT_OK(vhu_front_request(a->rg.f, VHU_REQ_SET_VRING_CALL, false, &q, 8, &a->efd,
		                            1, NULL, 0));
	a->port = 20000;
}

static struct vsock_hdr refused_pkt(struct atk *a, unsigned i)
{
	return rawg_hdr(ATTACKER_CID, a->port, VMADDR_CID_HOST, HOST_PORT + 1 + i % 7,
	                VSOCK_OP_REQUEST);
}

static void saturated_round(struct atk *a)
{
	uint64_t feat;

	/* REQUESTs to closed ports: the device answers each with an RST in the RX ring and wants
	 * to interrupt the guest through the saturated eventfd. */
	flood_batch(a, refused_pkt);
	/* The VM's thread still serves its VMM (it did not block in a write). */
	ASSERT_OK(vhu_front_get_features(a->rg.f, &feat));
	a->n[2]++;
}

static void saturated_check(struct atk *a)
{
	test_note("%" PRIu64 " REQUESTs answered through a saturated call eventfd, %" PRIu64
	          " VMM round trips",
	          a->n[0], a->n[2]);
	ASSERT_GT(a->n[0], 100);
	ASSERT_GT(a->rg.rx_pkts, 0); /* the RSTs did arrive */
	ASSERT_GE(a->n[2], 1);
}

static void saturated_teardown(struct atk *a)
{
	uint64_t v = 0;

	/* No write ever got in: the counter is where the attacker left it. */
	ASSERT_EQ(read(a->efd, &v, 8), 8);
	ASSERT_EQ_U64(v, 0xfffffffffffffffeull);
	close(a->efd);
	rawg_close(&a->rg);
}

/* ---- i. a huge sparse memfd as guest memory ---- */

#define HUGE_MEM (2ull << 40) /* 2 TiB, over uvsockd's per-VM cap of 1 TiB */

static void huge_mem_round(struct atk *a)
{
	struct vhu_front *f = hv_front(a->u->sock[ATTACKER], 1u << 20, 128);
	struct vhu_mem_table t = { .nregions = 1 };
	int m = memfd_create("huge", MFD_CLOEXEC);

	ASSERT_GE(m, 0);
	ASSERT_OK(ftruncate(m, (off_t)HUGE_MEM)); /* costs nothing: sparse */
	t.regions[0] = (struct vhu_mem_region){ .memory_size = HUGE_MEM,
		                                .userspace_addr = 0x100000000000ull };
	(void)vhu_front_request(f, VHU_REQ_SET_MEM_TABLE, false, &t, 8 + 32, &m, 1, NULL, 0);
	if (!hv_dropped(vhu_front_fd(f), WAIT_MS))
		test_fail(__FILE__, __LINE__, "a 2 TiB memory table was not refused");
	a->n[0]++;
	close(m);
	vhu_front_free(f);
}

static void huge_mem_check(struct atk *a)
{
	test_note("%" PRIu64 " sessions with 2 TiB of guest memory refused", a->n[0]);
	ASSERT_GE(a->n[0], 2);
	ASSERT_FALSE(att_stat(a, "vmm_connected"));
}

/* ---- j. host programs: idle connections, slowloris, a planted symlink ---- */

/* A non-blocking stream socket connected to path, or -1 (backlog full, refused). */
static int host_sock(const char *path)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Keeps a->nfds host sockets open on the attacker's uds: re-opens those the daemon closed;
 * line: what each sends once open (NULL: nothing). */
static void hold_host_socks(struct atk *a, const char *line)
{
	for (int i = 0; i < a->nfds; i++) {
		if (a->fds[i] >= 0 && hs_wait_fd(a->fds[i], POLLIN, 0) != 0) {
			close(a->fds[i]);
			a->fds[i] = -1;
			a->n[1]++;
		}
		if (a->fds[i] < 0) {
			a->fds[i] = host_sock(a->u->uds[ATTACKER]);
			if (a->fds[i] >= 0) {
				a->n[0]++;
				if (line)
					(void)!send(a->fds[i], line, strlen(line), MSG_NOSIGNAL);
			}
		}
	}
}

/* The attacker VM has a running guest (the daemon takes host connections only then). */
static void host_attack_setup(struct atk *a, int n)
{
	struct rlimit rl;

	a->g = g_guest_new(a->u->sock[ATTACKER], NULL);
	ASSERT_OK(getrlimit(RLIMIT_NOFILE, &rl));
	/* This process holds them all too: stay well inside its own limit. */
	if ((rlim_t)n + 300 > rl.rlim_cur)
		n = (int)rl.rlim_cur - 300;
	ASSERT_LE(n, (int)ARRAY_SIZE_(a->fds));
	ASSERT_GT(n, 0);
	a->nfds = n;
	for (int i = 0; i < n; i++)
		a->fds[i] = -1;
}

static void idle_setup(struct atk *a)
{
	host_attack_setup(a, 1500); /* more than uvsockd's soft fd limit in this scenario */
}

static void idle_round(struct atk *a)
{
	hold_host_socks(a, NULL);
	test_sleep_ms(20); /* the attacker's pace: it re-opens what the daemon closed */
}

static void idle_check(struct atk *a)
{
	test_note("%" PRIu64 " idle host connections opened, %" PRIu64 " closed by uvsockd",
	          a->n[0], a->n[1]);
	ASSERT_GT(a->n[0], 1024);
	/* The attacker VM's fd budget refused the excess at once (the victim kept its fds). */
	ASSERT_GT(att_stat(a, "host_clients_refused"), 0);
	ASSERT_EQ(vic_stat(a, "host_clients_refused"), 0);
}

static void host_teardown(struct atk *a)
{
	for (int i = 0; i < a->nfds; i++)
		if (a->fds[i] >= 0)
			close(a->fds[i]);
	if (a->lfd >= 0) {
		pthread_join(a->th, NULL);
		close(a->lfd);
	}
	if (a->ls >= 0)
		uvsock_close(a->ls);
	uvsock_ctx_free(a->g);
}

#define SLOW_PORT 7000u

/*
 * What a well-behaved host program does: CONNECT port through uds, and if the daemon closes the
 * socket instead of answering OK (it refuses idle sockets over its handshake cap at once, and it
 * may have taken ours before the line came), try again, within bound_ms. The fd or -1.
 */
static int connect_retrying(const char *uds, uint32_t port, int bound_ms)
{
	uint64_t end = test_now_ms() + (uint64_t)bound_ms;
	char line[32];
	int n = snprintf(line, sizeof(line), "CONNECT %u\n", port);

	while (test_now_ms() < end) {
		int fd = host_sock(uds);
		char ok[32];

		if (fd < 0)
			continue;
		if (send(fd, line, (size_t)n, MSG_NOSIGNAL) == n &&
		    hs_read_line(fd, ok, sizeof(ok), bound_ms) > 0 && !strncmp(ok, "OK ", 3)) {
			ASSERT_OK(fcntl(fd, F_SETFL, 0)); /* blocking again */
			return fd;
		}
		close(fd);
	}
	return -1;
}

static void slowloris_setup(struct atk *a)
{
	host_attack_setup(a, 300);
	a->ls = g_listen(a->g, SOCK_STREAM, SLOW_PORT);
}

static void slowloris_round(struct atk *a)
{
	int hfd, gfd;

	/* Each socket sends part of a CONNECT line, then one more byte a round, never the end. */
	hold_host_socks(a, "CONNECT 70");
	for (int i = 0; i < a->nfds; i++)
		if (a->fds[i] >= 0)
			(void)!send(a->fds[i], "0", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
	/* Meanwhile a well-behaved host program of the attacker VM still gets through. */
	if (atomic_load(&a->rounds) % 5 == 0) {
		hfd = connect_retrying(a->u->uds[ATTACKER], SLOW_PORT, WAIT_MS);
		if (hfd < 0) {
			a->n[3]++;
		} else {
			gfd = uvsock_accept(a->ls, NULL, NULL);
			ASSERT_GE(gfd, 0);
			uvsock_close(gfd);
			close(hfd);
			a->n[2]++;
		}
	}
	test_sleep_ms(200); /* the drip's pace */
}

static void slowloris_check(struct atk *a)
{
	test_note("%" PRIu64 " slow CONNECT lines opened, %" PRIu64
	          " closed by uvsockd; a good host "
	          "program got through %" PRIu64 " times, was refused %" PRIu64 " times",
	          a->n[0], a->n[1], a->n[2], a->n[3]);
	ASSERT_GE(a->n[0], 300);
	ASSERT_GT(a->n[2], 0);
	ASSERT_EQ(a->n[3], 0);
	ASSERT_GT(a->n[1], 0); /* the daemon closed unfinished lines */
	ASSERT_GT(att_stat(a, "host_handshake_timeouts") + att_stat(a, "host_clients_refused"), 0);
	ASSERT_EQ(vic_stat(a, "host_handshake_timeouts"), 0);
}

/* The victim's second host service: what the attacker's symlink points at. */
#define SECRET_PORT 5002u

static void symlink_setup(struct atk *a)
{
	char link[200], target[200];

	a->g = g_guest_new(a->u->sock[ATTACKER], NULL);
	snprintf(target, sizeof(target), "%s_%u", a->u->uds[VICTIM], SECRET_PORT);
	snprintf(link, sizeof(link), "%s_%u", a->u->uds[ATTACKER], HOST_PORT);
	a->lfd = hs_listen(target, SOCK_STREAM);
	ASSERT_EQ(pthread_create(&a->th, NULL, acceptor_main, a), 0);
	ASSERT_OK(symlink(target, link));
}

static void symlink_round(struct atk *a)
{
	int fd = g_connect(a->g, SOCK_STREAM, VMADDR_CID_HOST, HOST_PORT);

	if (fd >= 0) {
		a->n[1]++; /* the daemon followed the link */
		uvsock_close(fd);
	} else {
		a->n[0]++;
	}
	test_sleep_ms(20); /* the attacker's pace */
}

static void symlink_check(struct atk *a)
{
	test_note("connects through the planted symlink: %" PRIu64 " refused, %" PRIu64
	          " followed; the victim's service accepted %" PRIu64,
	          a->n[0], a->n[1], atomic_load(&a->accepted));
	ASSERT_GT(a->n[0] + a->n[1], 0);
	ASSERT_EQ(a->n[1], 0);
	ASSERT_EQ(atomic_load(&a->accepted), 0);
	ASSERT_EQ(att_stat(a, "host_symlinks_refused"), a->n[0]);
}

/* ---- k. a sibling's REQUEST flood ---- */

static struct vsock_hdr sibling_pkt(struct atk *a, unsigned i)
{
	/* Closed ports of the victim: its engine answers each with an RST. */
	return rawg_hdr(ATTACKER_CID, a->port, VICTIM_CID, 30000 + (a->port + i) % 1000,
	                VSOCK_OP_REQUEST);
}

static void sibling_setup(struct atk *a)
{
	rawg_open(&a->rg, a->u->sock[ATTACKER], false); /* never takes an RX packet */
	a->port = 20000;
}

static void sibling_round(struct atk *a)
{
	/* The first round floods until the daemon paces the attacker (its budget of REQUESTs the
	 * victim did not accept is spent, src/device/sibling.c): the victim starts under the
	 * flood's steady state. The bound is a hang guard. */
	uint64_t end = test_now_ms() + 30000;

	do
		flood_batch(a, sibling_pkt);
	while (!atomic_load(&a->rounds) && !atomic_load(&a->stop) && test_now_ms() < end &&
	       att_stat(a, "sibling_requests_paced") == 0);
}

static void sibling_check(struct atk *a)
{
	struct uvsock_ctx_stats cs = { .size = sizeof(cs) };

	ASSERT_EQ(uvsock_ctx_get_stats(a->v->g, &cs), 0);
	test_note("%" PRIu64 " REQUESTs from the sibling; the victim's engine sent %" PRIu64
	          " RSTs; %" PRIu64 " sibling packets forwarded by the attacker, %" PRIu64
	          " paced",
	          a->n[0], cs.rst_sent, att_stat(a, "tx_pkts"),
	          att_stat(a, "sibling_requests_paced"));
	ASSERT_GT(a->n[0], 1000);
	ASSERT_GT(cs.rst_sent, 0);
	/* The attacker waited for its budget: its REQUESTs beyond it were paced, not sent on. */
	ASSERT_GT(att_stat(a, "sibling_requests_paced"), 0);
}

#define SCEN(id, ...) static const struct scen scen_##id = { .name = #id, __VA_ARGS__ }

/* a. -- e. */
SCEN(malformed_vhost_user_messages, .round = malformed_round, .check = malformed_check);
SCEN(out_of_order_setup, .round = out_of_order_round, .check = out_of_order_check);
SCEN(bad_chains_and_oversize_packets, .round = bad_chains_round, .check = bad_chains_check);
SCEN(spoofed_source_cids, .group = "web", .setup = spoof_setup, .round = spoof_round,
     .check = spoof_check, .teardown = rawg_teardown);
SCEN(request_flood_to_host_ports, .min_rounds = 50, .setup = flood_setup, .round = host_flood_round,
     .check = flood_check, .teardown = flood_teardown);
/* f. -- i. */
SCEN(guest_memory_shrunk_under_the_daemon, .round = shrink_round, .check = shrink_check);
SCEN(pipes_and_dev_zero_as_fds, .setup = bad_fd_setup, .round = bad_fd_round,
     .check = bad_fd_check);
SCEN(saturated_blocking_call_eventfd, .setup = saturated_setup, .round = saturated_round,
     .check = saturated_check, .teardown = saturated_teardown);
SCEN(huge_sparse_guest_memory, .round = huge_mem_round, .check = huge_mem_check);
/* j. (enough rounds to outlast the daemon's 2 s CONNECT deadline) and k. */
SCEN(idle_host_connections_exhaust_fds, .low_nofile = true, .min_rounds = 25, .setup = idle_setup,
     .round = idle_round, .check = idle_check, .teardown = host_teardown);
SCEN(slowloris_connect_lines, .min_rounds = 15, .setup = slowloris_setup, .round = slowloris_round,
     .check = slowloris_check, .teardown = host_teardown);
SCEN(symlink_planted_at_a_host_port, .setup = symlink_setup, .round = symlink_round,
     .check = symlink_check, .teardown = host_teardown);
SCEN(sibling_request_flood, .group = "web", .setup = sibling_setup, .round = sibling_round,
     .check = sibling_check, .teardown = rawg_teardown);
/* The bench's baseline: the same two VMs, no attack. */
static const struct scen scen_baseline = { .name = "baseline (no attack)" };

static const struct scen *const scens[] = {
	&scen_malformed_vhost_user_messages,   &scen_out_of_order_setup,
	&scen_bad_chains_and_oversize_packets, &scen_spoofed_source_cids,
	&scen_request_flood_to_host_ports,     &scen_guest_memory_shrunk_under_the_daemon,
	&scen_pipes_and_dev_zero_as_fds,       &scen_saturated_blocking_call_eventfd,
	&scen_huge_sparse_guest_memory,        &scen_idle_host_connections_exhaust_fds,
	&scen_slowloris_connect_lines,         &scen_symlink_planted_at_a_host_port,
	&scen_sibling_request_flood,
};

/* ---- the run ------------------------------------------------------------------------------ */

struct result {
	bool ok;          /* the transfer completed, every byte right */
	double mibps;     /* the victim's bytes (both ways) per second of the transfer */
	uint64_t lost;    /* bytes that did not arrive intact */
	uint64_t rss_kib; /* uvsockd's peak VmRSS during the transfer */
	uint64_t rounds;  /* attack rounds */
	char err[200];
};

/* Starts uvsockd with the two VMs; with low_nofile its RLIMIT_NOFILE soft limit is 1024. */
static void start_daemon(struct uvd *u, const struct scen *s)
{
	static const uint32_t cids[] = { VICTIM_CID, ATTACKER_CID };
	struct rlimit rl, low;

	ASSERT_OK(getrlimit(RLIMIT_NOFILE, &rl));
	low = rl;
	if (s->low_nofile && low.rlim_cur > 1024) {
		low.rlim_cur = 1024;
		ASSERT_OK(setrlimit(RLIMIT_NOFILE, &low)); /* inherited by the daemon */
	}
#ifdef HOSTILE_ASAN
	{
		const char *o = getenv("ASAN_OPTIONS");
		char opts[512];

		snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=%d", o ? o : "",
		         o && *o ? ":" : "", ASAN_QUARANTINE_MB);
		ASSERT_OK(setenv("ASAN_OPTIONS", opts, 1)); /* for the daemon, not this process */
	}
#endif
	uvd_start(u, 2, cids, s->group, NULL);
	ASSERT_OK(setrlimit(RLIMIT_NOFILE, &rl));
	hv_wait_ctl(u->sock[VICTIM]);
}

/*
 * Runs scenario s (attack false: the baseline, the same VMs without attack): uvsockd, the victim,
 * the attack on its own thread until the victim's transfer of total bytes each way is done.
 * checks: assert everything (the test); else only measure (the bench).
 */
static void run(const struct scen *s, bool attack, bool checks, size_t total, struct result *res)
{
	struct uvd u;
	struct victim v;
	static struct atk a;
	struct sampler sm = { 0 };
	pthread_t th;
	struct stat st;
	bool attacking = attack && s->round;

	memset(res, 0, sizeof(*res));
	start_daemon(&u, s);
	victim_open(&v, &u);
	sm.vm0_kib = proc_status_kib(u.pid, "VmSize");
	memset(&a, 0, sizeof(a));
	a.s = s;
	a.u = &u;
	a.v = &v;
	a.efd = a.lfd = a.ls = -1;
	if (attack && s->setup)
		s->setup(&a);
	if (attacking) {
		ASSERT_EQ(pthread_create(&th, NULL, attack_main, &a), 0);
		/* The victim starts under attack: one round done, the next one running. */
		ASSERT_WAIT_FOR(atomic_load(&a.rounds) >= 1, 30000);
	}
	sm.pid = u.pid;
	ASSERT_EQ(pthread_create(&sm.th, NULL, sampler_main, &sm), 0);
	if (victim_transfer(&v, total, attacking ? &a.rounds : NULL,
	                    s->min_rounds ? s->min_rounds : 2))
		res->ok = !victim_failed(&v);
	atomic_store(&sm.stop, true);
	pthread_join(sm.th, NULL);
	atomic_store(&a.stop, true);
	if (attacking)
		pthread_join(th, NULL);
	res->lost = victim_lost(&v);
	res->mibps = v.ms ? (double)victim_bytes(&v) / MiB / ((double)v.ms / 1000.0) : 0;
	res->rss_kib = sm.rss_kib;
	res->rounds = atomic_load(&a.rounds);
	snprintf(res->err, sizeof(res->err), "%s", v.err);
	if (checks) {
		test_note("%s: victim moved %" PRIu64 " MiB at %.1f MiB/s, %" PRIu64 " attack "
		          "rounds, uvsockd peak VmRSS %" PRIu64 " KiB, VmSize %" PRIu64 " KiB",
		          s->name, victim_bytes(&v) / MiB, res->mibps, res->rounds, sm.rss_kib,
		          sm.vm_kib);
		if (!res->ok)
			test_fail(__FILE__, __LINE__, "the victim's transfer failed: %s", res->err);
		ASSERT_EQ_U64(res->lost, 0);
		ASSERT_TRUE(uvd_alive(&u));
		if (attack && s->check)
			s->check(&a);
		victim_probe(&v);
		ASSERT_LT(sm.rss_kib, RSS_BOUND_KIB);
		/* KiB: less than 1 TiB more address space, nothing huge was mapped. */
		ASSERT_LT(sm.vm_kib - sm.vm0_kib, 1ull << 30);
		ASSERT_EQ(stat(u.log, &st), 0);
		test_note("uvsockd's log: %lld bytes", (long long)st.st_size);
		if (st.st_size >= LOG_BOUND)
			test_fail(__FILE__, __LINE__, "uvsockd wrote %lld bytes of log (%s)",
			          (long long)st.st_size, u.log);
	}
	/* SIGTERM with the attacker still there: a clean exit within 5 s. */
	if (uvd_stop(&u) != 0 && checks)
		test_fail(__FILE__, __LINE__, "uvsockd did not exit cleanly on SIGTERM within 5 s");
	if (attack && s->teardown)
		s->teardown(&a);
	victim_close(&v);
}

static void run_test(const struct scen *s)
{
	struct result r;

	run(s, true, true, xfer_total(), &r);
}

#define SCEN_TEST(id)                                                                              \
	TEST (id) {                                                                                \
		run_test(&scen_##id);                                                              \
	}

SCEN_TEST(malformed_vhost_user_messages)
SCEN_TEST(out_of_order_setup)
SCEN_TEST(bad_chains_and_oversize_packets)
SCEN_TEST(spoofed_source_cids)
SCEN_TEST(request_flood_to_host_ports)
SCEN_TEST(guest_memory_shrunk_under_the_daemon)
SCEN_TEST(pipes_and_dev_zero_as_fds)
SCEN_TEST(saturated_blocking_call_eventfd)
SCEN_TEST(huge_sparse_guest_memory)
SCEN_TEST(idle_host_connections_exhaust_fds)
SCEN_TEST(slowloris_connect_lines)
SCEN_TEST(symlink_planted_at_a_host_port)
SCEN_TEST(sibling_request_flood)

/* ---- the benchmark ------------------------------------------------------------------------ */

/* The bench's victim moves at least this much each way: long enough for a steady rate (the
 * test's 32 MiB take a tenth of a second here, mostly start-up). */
#define BENCH_MIB 512u

/* One run in a child process (a failure there ends only that run). */
struct bench_arg {
	const struct scen *s;
	bool attack;
	size_t total;
};

static void bench_run(void *arg, void *res)
{
	const struct bench_arg *a = arg;

	run(a->s, a->attack, false, a->total, res);
}

static bool bench_one(const struct scen *s, bool attack, size_t total, struct result *res)
{
	struct bench_arg a = { s, attack, total };

	return test_run_in_child(bench_run, &a, res, sizeof(*res));
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

struct bench_row {
	double mibps[16];
	uint64_t lost, rss_kib;
	int n, failed;
};

static double median(struct bench_row *r)
{
	if (!r->n)
		return 0;
	qsort(r->mibps, (size_t)r->n, sizeof(double), cmp_double);
	return r->n % 2 ? r->mibps[r->n / 2] : (r->mibps[r->n / 2 - 1] + r->mibps[r->n / 2]) / 2;
}

static int bench_main(int argc, char **argv)
{
	enum { NS = ARRAY_SIZE_(scens) };
	static struct bench_row rows[NS + 1]; /* [0]: the baseline */
	int runs = 3;
	size_t total = BENCH_MIB * MiB;
	const char *pick = NULL;
	bool bad = false;
	double base;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			total = (size_t)atoi(argv[++i]) * MiB;
		else if (!strcmp(argv[i], "--pick") && i + 1 < argc)
			pick = argv[++i];
		else
			bad = true;
	}
	if (pick) {
		bool found = false;

		for (int i = 0; i < NS; i++)
			found = found || !strcmp(scens[i]->name, pick);
		bad = bad || !found;
	}
	if (bad || runs < 1 || runs > 16 || total == 0) {
		fprintf(stderr, "usage: %s --bench [--runs 1..16] [--mib M] [--pick SCENARIO]\n",
			argv[0]);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	printf("# victim: %zu MiB each way at once (guest->host and host->guest), %d runs each, "
	       "round-robin\n",
	       total / MiB, runs);
	/* Round-robin, so that drift of the machine affects every row alike. */
	for (int k = 0; k < runs; k++) {
		for (int i = 0; i <= NS; i++) {
			const struct scen *s = i ? scens[i - 1] : &scen_baseline;
			struct bench_row *r = &rows[i];
			struct result res;

			if (i && pick && strcmp(s->name, pick))
				continue;
			if (!bench_one(s, i > 0, total, &res) || !res.ok) {
				r->failed++;
				printf("# run %d of %s failed: %s\n", k + 1, s->name,
				       res.err[0] ? res.err : "(the run died)");
			} else {
				r->mibps[r->n++] = res.mibps;
				printf("# run %d, %s: %.1f MiB/s, %" PRIu64 " attack rounds\n",
				       k + 1, s->name, res.mibps, res.rounds);
			}
			r->lost += res.lost;
			r->rss_kib = res.rss_kib > r->rss_kib ? res.rss_kib : r->rss_kib;
			fflush(stdout);
		}
	}
	base = median(&rows[0]);
	printf("| scenario | victim MiB/s under attack | baseline MiB/s | ratio | bytes lost | "
	       "uvsockd peak RSS |\n|---|---:|---:|---:|---:|---:|\n");
	for (int i = 0; i <= NS; i++) {
		struct bench_row *r = &rows[i];
		double m = median(r);

		if (i && pick && strcmp(scens[i - 1]->name, pick))
			continue;
		printf("| %s | %.1f | %.1f | %.0f %% | %" PRIu64 " | %.1f MiB |%s\n",
		       i ? scens[i - 1]->name : scen_baseline.name, m, base,
		       base > 0 ? 100.0 * m / base : 0.0, r->lost, (double)r->rss_kib / 1024,
		       r->failed ? " (failed runs)" : "");
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--bench"))
		return bench_main(argc, argv);
	return test_main(argc, argv);
}
