/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests: a struct vsock_dev runs on its own thread; the test plays both the VMM
 * (the vhost-user front-end of src/vhost_user/frontend.c, memfd guest memory) and a hand-written
 * guest driver (vring_drv rings, packets built byte by byte), and the host programs (plain Unix
 * sockets). Covers: RST at once when no host listener, guest->host and host->guest streams with
 * the CONNECT/OK handshake, half-close both ways, bad CONNECT lines, the CONNECT timeout, spoofed
 * source CIDs, VMM reconnect, sibling routing with RX splitting, a sibling's VMM disconnecting
 * and reconnecting (the device is kept), and unknown destination CIDs; datagrams (DGRAM
 * negotiated or not, the host-side AF_UNIX SOCK_DGRAM convention both ways, malformed lines,
 * oversize, a full host socket, siblings).
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/device.h"
#include "device/device_internal.h"
#include "device/h2g_budget.h"
#include "hostside.h"
#include "ops/stats.h"
#include "stderr-capture.h"
#include "tdev.h"
#include "test.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/tune.h"
#include "uvsock/device.h"
#include "vhost_user/frontend.h"
#include "vring/vring.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define NRX 64
#define RXBUF 4096
#define NTX 32
#define TXBUF (44 + 65536)
#define WAIT_MS 3000

struct tguest {
	struct vhu_front *f;
	struct vring_drv *rx, *tx;
	uint32_t cid;
	uint8_t *rxb[NRX];
	uint64_t rxg[NRX];
	uint8_t *txb[NTX];
	uint64_t txg[NTX];
	bool txbusy[NTX];
};

static void tdev_stop(struct tdev *t)
{
	tdev_halt(t);
	/* The device removed its socket files: the directory must be empty now. */
	ASSERT_OK(rmdir(t->dir));
}

static void tg_post_rx(struct tguest *g, int i)
{
	struct vring_drv_buf b = { .addr = g->rxg[i], .len = RXBUF, .write = true };

	ASSERT_GE(vring_drv_add(g->rx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
}

static void tg_kick(struct tguest *g, unsigned q)
{
	uint64_t one = 1;
	struct vring_drv *r = q == 0 ? g->rx : g->tx;

	if (vring_drv_kick_prepare(r))
		ASSERT_EQ(write(vhu_front_ring(g->f, q)->kick_fd, &one, 8), 8);
}

static void tg_connect_nrx(struct tguest *g, struct tdev *t, int nrx);

static void tg_connect(struct tguest *g, struct tdev *t)
{
	tg_connect_nrx(g, t, NRX);
}

static void tg_connect_feat(struct tguest *g, struct tdev *t, int nrx, uint64_t extra);

static void tg_connect_nrx(struct tguest *g, struct tdev *t, int nrx)
{
	tg_connect_feat(g, t, nrx, 0);
}

/* tg_connect_nrx, asking also for the device features extra (VHU_BIT(...)). */
static void tg_connect_feat(struct tguest *g, struct tdev *t, int nrx, uint64_t extra)
{
	struct vhu_front_config cfg;
	const struct vhu_front_ring *rr, *tr;

	memset(g, 0, sizeof(*g));
	vhu_front_config_init(&cfg);
	cfg.features |= extra;
	cfg.mem_size = 8u << 20;
	ASSERT_OK(vhu_front_connect(t->sock, &cfg, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	g->cid = (uint32_t)vhu_front_guest_cid(g->f);
	for (int i = 0; i < NRX; i++)
		ASSERT_OK(vhu_front_alloc(g->f, RXBUF, 64, (void **)&g->rxb[i], &g->rxg[i]));
	for (int i = 0; i < NTX; i++)
		ASSERT_OK(vhu_front_alloc(g->f, TXBUF, 64, (void **)&g->txb[i], &g->txg[i]));
	ASSERT_OK(vhu_front_start(g->f));
	rr = vhu_front_ring(g->f, 0);
	tr = vhu_front_ring(g->f, 1);
	/* The rings are zeroed and unused: the driver state starts at index 0 as the device's. */
	ASSERT_OK(vring_drv_new(rr->num, rr->desc, rr->avail, rr->used, vhu_front_features(g->f),
				&g->rx));
	ASSERT_OK(vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, vhu_front_features(g->f),
				&g->tx));
	for (int i = 0; i < nrx; i++)
		tg_post_rx(g, i);
	tg_kick(g, 0);
}

static void tg_disconnect(struct tguest *g)
{
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
	memset(g, 0, sizeof(*g));
}

static void tg_reclaim_tx(struct tguest *g)
{
	uint32_t len;
	void *cookie;

	while (vring_drv_get_used(g->tx, &len, &cookie) == 0)
		g->txbusy[(uintptr_t)cookie - 1] = false;
}

/* Takes back the TX buffers the device used; the index of a free one, or -1 if all are busy. */
static int tg_free_tx(struct tguest *g)
{
	tg_reclaim_tx(g);
	for (int i = 0; i < NTX; i++)
		if (!g->txbusy[i])
			return i;
	return -1;
}

/*
 * Sends one packet (payload copied into a TX buffer after the header), waiting up to wait_ms for
 * a free TX buffer. Returns 0 or -ETIMEDOUT (the device is not returning TX buffers).
 */
static int tg_send_wait(struct tguest *g, const struct vsock_hdr *h, const void *payload,
			int wait_ms)
{
	struct vring_drv_buf b;
	int i;

	if (!WAIT_FOR((i = tg_free_tx(g)) >= 0, wait_ms))
		return -ETIMEDOUT;
	vsock_hdr_encode(h, g->txb[i]);
	if (h->len)
		memcpy(g->txb[i] + 44, payload, h->len);
	b = (struct vring_drv_buf){ .addr = g->txg[i], .len = 44 + h->len, .write = false };
	g->txbusy[i] = true;
	ASSERT_GE(vring_drv_add(g->tx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
	tg_kick(g, 1);
	return 0;
}

static void tg_send(struct tguest *g, const struct vsock_hdr *h, const void *payload)
{
	ASSERT_OK(tg_send_wait(g, h, payload, WAIT_MS));
}

static struct vsock_hdr mkhdr(struct tguest *g, uint64_t dst_cid, uint32_t sport, uint32_t dport,
			      uint16_t type, uint16_t op, uint32_t len)
{
	return (struct vsock_hdr){
		.src_cid = g->cid,
		.dst_cid = dst_cid,
		.src_port = sport,
		.dst_port = dport,
		.len = len,
		.type = type,
		.op = op,
		.buf_alloc = 256 * 1024,
	};
}

/* Datagram tests: RX buffers the device gave back unused (used.len 0) are posted again. */
static bool tg_skip_empty;

/*
 * Receives the next packet within timeout_ms (skipping bare CREDIT_UPDATEs if skip_credit).
 * Returns 0, or -ETIMEDOUT.
 */
static int tg_recv(struct tguest *g, struct vsock_hdr *h, void *buf, size_t cap, int timeout_ms,
		   bool skip_credit)
{
	uint64_t deadline = test_now_ms() + (uint64_t)timeout_ms;
	int call = vhu_front_ring(g->f, 0)->call_fd;

	for (;;) {
		uint32_t len;
		void *cookie;

		if (vring_drv_get_used(g->rx, &len, &cookie) == 0) {
			int i = (int)(uintptr_t)cookie - 1;

			if (len == 0 && tg_skip_empty) {
				/* A buffer given back unused (a datagram dropped for it). */
				tg_post_rx(g, i);
				tg_kick(g, 0);
				continue;
			}
			ASSERT_GE(len, 44);
			vsock_hdr_decode(g->rxb[i], h);
			ASSERT_EQ(len, 44 + h->len);
			ASSERT_LE(h->len, cap);
			if (h->len)
				memcpy(buf, g->rxb[i] + 44, h->len);
			tg_post_rx(g, i);
			tg_kick(g, 0);
			if (skip_credit && h->op == VSOCK_OP_CREDIT_UPDATE)
				continue;
			return 0;
		}
		{
			uint64_t now = test_now_ms(), v;
			struct pollfd p = { .fd = call, .events = POLLIN };

			if (now >= deadline)
				return -ETIMEDOUT;
			/* Ask for an interrupt; used buffers that came meanwhile are taken first. */
			if (vring_drv_enable_cb(g->rx))
				continue;
			if (poll(&p, 1, (int)MIN(deadline - now + 1, 1000)) > 0)
				(void)!read(call, &v, 8);
		}
	}
}

static int unix_listen(const char *path, int type)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(fd, 8));
	return fd;
}

static int unix_connect(const char *path, int type)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

/* Reads up to cap bytes with a deadline; returns the count (0 at EOF) or -ETIMEDOUT. */
static ssize_t read_wait(int fd, void *buf, size_t cap, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	return read(fd, buf, cap);
}

static int accept_wait(int lfd, int timeout_ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* A device for guest CID 3 on its own thread, and the test's guest connected to it as its VMM. */
static void solo_start(struct tdev *t, struct tguest *g)
{
	tdev_new(t, NULL, 3);
	tdev_run(t);
	tg_connect(g, t);
}

static void solo_stop(struct tdev *t, struct tguest *g)
{
	tg_disconnect(g);
	tdev_stop(t);
}

/*
 * solo_start with a host listener at <uds>_1234 (path, made before the device runs; *lfd) and the
 * guest's port 40001 connected to it (REQUEST, RESPONSE checked). Returns the accepted host fd.
 */
static int solo_start_guest_conn(struct tdev *t, struct tguest *g, char *path, size_t cap,
				 int *lfd)
{
	struct vsock_hdr h, r;
	uint8_t buf[64];
	int hfd;

	tdev_new(t, NULL, 3);
	snprintf(path, cap, "%s_1234", t->uds);
	*lfd = unix_listen(path, SOCK_STREAM);
	tdev_run(t);
	tg_connect(g, t);
	h = mkhdr(g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(g, &h, NULL);
	hfd = accept_wait(*lfd, WAIT_MS);
	ASSERT_GE(hfd, 0);
	ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(r.dst_port, 40001);
	ASSERT_EQ(r.src_port, 1234);
	ASSERT_GT(r.buf_alloc, 0);
	return hfd;
}

/* Two linked sibling devices (CIDs 3 and 4) on one new router, each on its own thread. */
static void sib_start(struct vsock_router **router, struct tdev *ta, struct tdev *tb)
{
	ASSERT_OK(vsock_router_new(router));
	tdev_new(ta, *router, 3);
	tdev_new(tb, *router, 4);
	ASSERT_OK(vsock_dev_link_sibling(ta->d, tb->d));
	tdev_run(ta);
	tdev_run(tb);
}

static void sib_stop(struct vsock_router *router, struct tdev *ta, struct tdev *tb,
		     struct tguest *ga, struct tguest *gb)
{
	tg_disconnect(ga);
	tg_disconnect(gb);
	tdev_stop(ta);
	tdev_stop(tb);
	vsock_router_free(router);
}

/* Checks that the len bytes at buf are the writer's pattern from stream offset off on. */
static void check_pattern(const uint8_t *buf, size_t len, size_t off)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != (uint8_t)((off + i) % 251))
			test_fail(__FILE__, __LINE__, "byte %zu corrupted", off + i);
}

/*
 * Allocation counting, for the per-packet allocation test: malloc, calloc and realloc called by
 * alloc_thread while alloc_counting is set are counted. glibc only, and not under
 * AddressSanitizer or ThreadSanitizer, which own malloc (the test skips there).
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZER_OWNS_MALLOC 1
#endif
#endif
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) &&      \
	!defined(SANITIZER_OWNS_MALLOC)
#define ALLOC_COUNTING 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
static atomic_bool alloc_counting;
static pthread_t alloc_thread;
static atomic_uint alloc_count;

static void alloc_note(void)
{
	/* acquire: pairs with the release that set it, so alloc_thread is the one written. */
	if (atomic_load_explicit(&alloc_counting, memory_order_acquire) &&
	    pthread_equal(pthread_self(), alloc_thread))
		atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
}

void *malloc(size_t n)
{
	alloc_note();
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	alloc_note();
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	alloc_note();
	return __libc_realloc(p, n);
}
#endif

/* On solo_start_guest_conn's connection: "hello" guest -> host, then "world" host -> guest. */
static void hello_world(struct tguest *g, int hfd)
{
	struct vsock_hdr h = mkhdr(g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 5), r;
	char buf[256];

	tg_send(g, &h, "hello");
	ASSERT_EQ(read_wait(hfd, buf, sizeof(buf), WAIT_MS), 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	ASSERT_EQ(write(hfd, "world", 5), 5);
	ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.len, 5);
	ASSERT_MEMEQ(buf, "world", 5);
}

/* ---- tests -------------------------------------------------------------------------------- */

TEST(guest_connect_without_host_listener_gets_rst_at_once)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h = { 0 }, r;
	uint8_t buf[64];
	uint64_t t0;

	solo_start(&t, &g);
	ASSERT_EQ(g.cid, 3);
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	t0 = test_now_ms();
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_EQ(r.dst_cid, 3);
	ASSERT_EQ(r.src_port, 1234);
	ASSERT_EQ(r.dst_port, 40000);
	/* Not the 2 s connect timeout: the refusal is immediate. */
	ASSERT_LT(test_now_ms() - t0, 1500);
	solo_stop(&t, &g);
}

TEST(guest_to_host_stream_with_half_close)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	char path[160], buf[256];
	int lfd, hfd;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	hello_world(&g, hfd);

	/* guest SHUTDOWN(SEND): the host sees EOF but can still write. */
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN, 0);
	h.flags = VSOCK_SHUTDOWN_SEND;
	tg_send(&g, &h, NULL);
	ASSERT_EQ(read_wait(hfd, buf, sizeof(buf), WAIT_MS), 0);
	ASSERT_EQ(write(hfd, "bye", 3), 3);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_MEMEQ(buf, "bye", 3);

	/* host EOF: SHUTDOWN with the SEND bit reaches the guest. */
	ASSERT_OK(shutdown(hfd, SHUT_WR));
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_SHUTDOWN);
	ASSERT_TRUE(r.flags & VSOCK_SHUTDOWN_SEND);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(guest_close_with_unread_data_ends_with_rst_after_host_close)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	static uint8_t payload[4096], rb[65536];
	char path[160];
	size_t got = 0;
	ssize_t n;
	int lfd, hfd, i;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	/* 248 KiB while the host reads nothing: more than its socket buffer takes. */
	for (i = 0; i < 62; i++) {
		memset(payload, i, sizeof(payload));
		h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, sizeof(payload));
		tg_send(&g, &h, payload);
	}
	/* The guest closes: SHUTDOWN with both flags. */
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN, 0);
	h.flags = VSOCK_SHUTDOWN_MASK;
	tg_send(&g, &h, NULL);
	/* The host now reads everything, sees EOF, closes: the guest gets its RST promptly. */
	while ((n = read_wait(hfd, rb, sizeof(rb), WAIT_MS)) > 0) {
		for (ssize_t k = 0; k < n; k++)
			if (rb[k] != (uint8_t)((got + (size_t)k) / 4096))
				test_fail(__FILE__, __LINE__, "byte %zu corrupted", got + (size_t)k);
		got += (size_t)n;
	}
	ASSERT_EQ(n, 0);
	ASSERT_EQ(got, 62 * 4096);
	close(hfd);
	do {
		ASSERT_OK(tg_recv(&g, &r, rb, sizeof(rb), 1500, true));
	} while (r.op == VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

static void host_initiated(struct tdev *t, struct tguest *g, int type, int *ret_fd,
			   struct vsock_hdr *ret_req)
{
	char line[32], buf[64], path[160];
	struct vsock_hdr h, r;
	int fd, n;

	snprintf(path, sizeof(path), "%.100s%s", t->uds, type == SOCK_STREAM ? "" : "_seqpacket");
	fd = unix_connect(path, type);

	ASSERT_EQ(write(fd, "CONNECT 5000\n", 13), 13);
	ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.dst_port, 5000);
	ASSERT_EQ(r.type, type == SOCK_STREAM ? VSOCK_TYPE_STREAM : VSOCK_TYPE_SEQPACKET);
	ASSERT_GE(r.src_port, 1u << 30);
	ASSERT_LT(r.src_port, 1u << 31);
	h = mkhdr(g, 2, 5000, r.src_port, r.type, VSOCK_OP_RESPONSE, 0);
	tg_send(g, &h, NULL);
	n = (int)read_wait(fd, line, sizeof(line) - 1, WAIT_MS);
	ASSERT_GT(n, 0);
	line[n] = '\0';
	snprintf(buf, sizeof(buf), "OK %u\n", r.src_port);
	ASSERT_STREQ(line, buf);
	*ret_fd = fd;
	*ret_req = r;
}

TEST(host_to_guest_stream_connect_ok)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	ASSERT_EQ(write(fd, "ping", 4), 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.src_port, req.src_port);
	ASSERT_MEMEQ(buf, "ping", 4);
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 4);
	tg_send(&g, &h, "pong");
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 4);
	ASSERT_MEMEQ(buf, "pong", 4);
	/* Guest RST: the host socket is closed. */
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_RST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
	close(fd);
	solo_stop(&t, &g);
}

TEST(host_to_guest_seqpacket_keeps_boundaries)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	ASSERT_TRUE(vhu_front_features(g.f) & (1ull << VIRTIO_VSOCK_F_SEQPACKET));
	host_initiated(&t, &g, SOCK_SEQPACKET, &fd, &req);
	ASSERT_EQ(write(fd, "one", 3), 3);
	ASSERT_EQ(write(fd, "three", 5), 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.len, 3);
	ASSERT_TRUE(r.flags & VSOCK_SEQ_EOM);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.len, 5);
	ASSERT_TRUE(r.flags & VSOCK_SEQ_EOM);
	/* Guest message -> one host message. */
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RW, 2);
	h.flags = VSOCK_SEQ_EOM;
	tg_send(&g, &h, "ab");
	h.len = 3;
	tg_send(&g, &h, "cde");
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 2);
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 3);
	ASSERT_MEMEQ(buf, "cde", 3);
	close(fd);
	solo_stop(&t, &g);
}

TEST(bad_connect_lines_and_timeout_close_the_socket)
{
	static const char *const bad[] = { "HELLO\n", "CONNECT x\n", "CONNECT 99999999999\n" };
	struct tdev t;
	struct tguest g;
	struct vsock_dev_stats st;
	char buf[64];
	uint64_t t0;
	int fd;

	solo_start(&t, &g);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fd = unix_connect(t.uds, SOCK_STREAM);
		ASSERT_EQ(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
		close(fd);
	}
	/* A partial line followed by an early close. */
	fd = unix_connect(t.uds, SOCK_STREAM);
	ASSERT_EQ(write(fd, "CONN", 4), 4);
	close(fd);
	/* Silence: closed after the 2 s limit, not before. */
	fd = unix_connect(t.uds, SOCK_STREAM);
	t0 = test_now_ms();
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), 5000), 0);
	ASSERT_GE(test_now_ms() - t0, 1500);
	close(fd);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.host_connect_bad_line, 4);
	ASSERT_EQ(st.host_connect_timeouts, 1);
	solo_stop(&t, &g);
}

TEST(spoofed_source_cid_is_dropped_and_counted)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	char buf[64];

	solo_start(&t, &g);
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	h.src_cid = 7;
	tg_send(&g, &h, NULL);
	h = mkhdr(&g, 9, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_ERR(tg_recv(&g, &r, buf, sizeof(buf), 300, true), ETIMEDOUT);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.tx_bad_src_cid, 1);
	ASSERT_EQ(st.tx_bad_dst_cid, 1);
	solo_stop(&t, &g);
}

static int count_str(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/*
 * A guest flooding the device with bad packets (spoofed source CIDs, unknown destinations) gets
 * every one dropped and counted, but only a burst of tagged log lines per call site (10 per 5 s,
 * src/util/log.c), not one line per packet. stderr goes to a memfd in this (forked) case.
 */
TEST(guest_flood_of_bad_packets_is_logged_tagged_and_rate_limited)
{
	enum { N = 300 };
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h;
	struct vsock_dev_stats st;
	int mfd = capture_stderr();
	const char *out;

	log_set_level(LOG_LVL_INFO);
	solo_start(&t, &g);
	for (int i = 0; i < N; i++) {
		h = mkhdr(&g, 2, 40000 + (uint32_t)i, 5000, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		h.src_cid = 7;
		tg_send(&g, &h, NULL);
		h = mkhdr(&g, 9, 40000 + (uint32_t)i, 5000, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&g, &h, NULL);
	}
	WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.tx_bad_src_cid == N && st.tx_bad_dst_cid == N),
		 WAIT_MS);
	ASSERT_EQ(st.tx_bad_src_cid, N);
	ASSERT_EQ(st.tx_bad_dst_cid, N);
	solo_stop(&t, &g);
	out = captured(mfd);
	ASSERT_TRUE(*out);
	/* Tagged with the VM and the two ports (lp: the host side, pp: the guest's). */
	ASSERT_TRUE(strstr(out, "uvsock warn: vm=3 lp=5000 pp=40000: tx packet with spoofed "
				"src_cid 7 dropped\n") != NULL);
	ASSERT_TRUE(strstr(out, "uvsock warn: vm=3 lp=5000 pp=40000: tx packet to cid 9 dropped")
		    != NULL);
	/* 10 per call site per 5 s window (20 if the flood straddled a window), not 300. */
	ASSERT_GE(count_str(out, "spoofed src_cid"), 10);
	ASSERT_LE(count_str(out, "spoofed src_cid"), 20);
	ASSERT_GE(count_str(out, "no route"), 10);
	ASSERT_LE(count_str(out, "no route"), 20);
	ASSERT_LE(count_str(out, "\n"), 60);
}

TEST(vmm_disconnect_resets_and_reconnect_works)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	tg_disconnect(&g);
	/* The VM is gone: its host connection is closed. */
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
	close(fd);
	/* Same socket path, a new VMM session. */
	tg_connect(&g, &t);
	h = mkhdr(&g, 2, 40000, 4321, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	solo_stop(&t, &g);
}

TEST(siblings_route_and_split_large_packets)
{
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	static uint8_t big[10000], got[10000];
	uint8_t buf[RXBUF];
	size_t have = 0;
	int pieces = 0;

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + 1);
	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	tg_connect(&gb, &tb);

	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_SEQPACKET, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.dst_cid, 4);
	h = mkhdr(&gb, 3, 77, 1111, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RESPONSE, 0);
	tg_send(&gb, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(r.src_cid, 4);

	/* 10000 bytes into 4096-byte buffers: 4052 + 4052 + 1896, EOM|EOR on the last only. */
	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RW, sizeof(big));
	h.flags = VSOCK_SEQ_EOM | VSOCK_SEQ_EOR;
	tg_send(&ga, &h, big);
	while (have < sizeof(big)) {
		ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		ASSERT_LE(r.len, RXBUF - 44);
		ASSERT_LE(have + r.len, sizeof(big));
		memcpy(got + have, buf, r.len);
		have += r.len;
		pieces++;
		if (have < sizeof(big))
			ASSERT_EQ(r.flags, 0);
		else
			ASSERT_EQ(r.flags, VSOCK_SEQ_EOM | VSOCK_SEQ_EOR);
	}
	ASSERT_EQ(pieces, 3);
	ASSERT_MEMEQ(got, big, sizeof(big));
	vsock_dev_get_stats(ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 2);

	sib_stop(router, &ta, &tb, &ga, &gb);
}

TEST(congested_sibling_does_not_stall_sender)
{
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	uint64_t t0;
	char buf[64];

	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	/* B's guest posts no RX buffers: its inbox (512 packets) fills and stays full. */
	tg_connect_nrx(&gb, &tb, 0);
	for (uint32_t i = 0; i < 600; i++) {
		h = mkhdr(&ga, 4, 10000 + i, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&ga, &h, NULL);
	}
	/* A reaches the host at once: the 88 REQUESTs B has no room for are held for B, not in
	 * A's TX ring. */
	t0 = test_now_ms();
	h = mkhdr(&ga, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_LT(test_now_ms() - t0, 500);
	/* B makes no room within 1 s: what was held for it is dropped, each answered with an RST
	 * from B to A's guest. */
	ASSERT_WAIT_FOR((vsock_dev_get_stats(ta.d, &st), st.sibling_dropped == 600 - 512), WAIT_MS);
	ASSERT_EQ(st.sibling_fwd_pkts, 512);
	for (uint32_t i = 512; i < 600; i++) {
		ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RST);
		ASSERT_EQ(r.src_cid, 4);
		ASSERT_EQ(r.dst_port, 10000 + i);
	}
	/* Once B takes packets again, forwarding resumes. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&gb, i);
	tg_kick(&gb, 0);
	for (int i = 0; i < 512; i++) {
		ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	}
	h = mkhdr(&ga, 4, 9999, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, 9999);
	sib_stop(router, &ta, &tb, &ga, &gb);
}

/*
 * uvsockd's case: a VMM disconnect does not free the device. While B's VMM is away, what A sends
 * B is dropped (counted on B) and A keeps working; B's next VMM gets A's packets again.
 */
TEST(sibling_vmm_disconnect_keeps_the_device)
{
	struct vsock_router *router;
	struct vsock_dev_status ds;
	struct vsock_dev_stats st;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr h, r;
	char buf[64];

	sib_start(&router, &ta, &tb);
	tg_connect(&ga, &ta);
	tg_connect(&gb, &tb);
	h = mkhdr(&ga, 4, 1111, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.src_port, 1111);

	tg_disconnect(&gb);
	ASSERT_WAIT_FOR((vsock_dev_get_status(tb.d, &ds), !ds.vmm_connected), WAIT_MS);
	h = mkhdr(&ga, 4, 1112, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(tb.d, &st), st.sibling_dropped), WAIT_MS);
	ASSERT_EQ(st.sibling_dropped, 1);
	/* A still reaches the host (no listener there: RST at once). */
	h = mkhdr(&ga, 2, 1113, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&ga, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);

	/* The same device serves B's next VMM, and A's packets reach it again. */
	tg_connect(&gb, &tb);
	h = mkhdr(&ga, 4, 1114, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&ga, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(r.src_port, 1114);
	vsock_dev_get_stats(tb.d, &st);
	ASSERT_EQ(st.vmm_connects, 2);
	vsock_dev_get_stats(ta.d, &st);
	ASSERT_EQ(st.sibling_dropped, 0);
	ASSERT_EQ(st.sibling_fwd_pkts, 3);
	tg_disconnect(&ga);
	tg_disconnect(&gb);
	/* Shutdown as uvsockd's: every device stopped, then all freed. */
	vsock_dev_stop(ta.d);
	vsock_dev_stop(tb.d);
	pthread_join(ta.th, NULL);
	pthread_join(tb.th, NULL);
	dev_vhu_free(ta.vhu);
	dev_vhu_free(tb.vhu);
	vsock_dev_free(ta.d);
	vsock_dev_free(tb.d);
	ASSERT_OK(rmdir(ta.dir));
	ASSERT_OK(rmdir(tb.dir));
	vsock_router_free(router);
}

struct walk {
	int conns, listeners;
	uint32_t port;
};

static void walk_one(void *arg, const struct vsock_sock_info *info)
{
	struct walk *w = arg;

	if (info->state == VSOCK_SS_LISTEN) {
		w->listeners++;
		return;
	}
	w->conns++;
	w->port = info->local_port;
}

TEST(status_and_socket_listing_for_operators)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req;
	struct vsock_dev_status st;
	struct walk w = { 0 };
	int fd;

	tdev_new(&t, NULL, 3);
	vsock_dev_get_status(t.d, &st);
	ASSERT_FALSE(st.vmm_connected);
	ASSERT_FALSE(st.have_engine);
	tdev_run(&t);
	tg_connect(&g, &t);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	vsock_dev_get_status(t.d, &st);
	ASSERT_TRUE(st.vmm_connected);
	ASSERT_FALSE(st.broken);
	ASSERT_TRUE(st.have_engine);
	ASSERT_EQ(st.listeners, 2); /* STREAM and SEQPACKET wildcard listeners */
	ASSERT_EQ(st.eng.socks_open, 3);
	vsock_dev_foreach_sock(t.d, walk_one, &w);
	ASSERT_EQ(w.listeners, 2);
	ASSERT_EQ(w.conns, 1);
	ASSERT_EQ(w.port, req.src_port);
	tg_disconnect(&g);
	ASSERT_EQ(read_wait(fd, &w, 1, WAIT_MS), 0);
	close(fd);
	vsock_dev_get_status(t.d, &st);
	ASSERT_FALSE(st.vmm_connected);
	ASSERT_FALSE(st.have_engine);
	/* The ended session's counters stay: one connection (listeners not counted), none open. */
	ASSERT_EQ(st.eng_total.socks_total, 1);
	ASSERT_EQ(st.eng_total.socks_open, 0);
	memset(&w, 0, sizeof(w));
	vsock_dev_foreach_sock(t.d, walk_one, &w);
	ASSERT_EQ(w.conns + w.listeners, 0);
	/* A second session adds to them: its own connection plus its two listeners. */
	tg_connect(&g, &t);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	vsock_dev_get_status(t.d, &st);
	ASSERT_EQ(st.eng.socks_total, 3);
	ASSERT_EQ(st.eng_total.socks_total, 1 + 3);
	ASSERT_EQ(st.eng_total.socks_open, 3);
	ASSERT_GE(st.eng_total.rx_pkts, 2 * st.eng.rx_pkts);
	tg_disconnect(&g);
	ASSERT_EQ(read_wait(fd, &w, 1, WAIT_MS), 0);
	close(fd);
	vsock_dev_get_status(t.d, &st);
	ASSERT_EQ(st.eng_total.socks_total, 2);
	tdev_stop(&t);
}

struct writer_arg {
	int fd;
	size_t len;
};

static void *writer_thread(void *arg)
{
	struct writer_arg *w = arg;
	uint8_t chunk[8192];
	size_t off = 0;

	while (off < w->len) {
		size_t n = MIN(sizeof(chunk), w->len - off);
		ssize_t k;

		for (size_t i = 0; i < n; i++)
			chunk[i] = (uint8_t)((off + i) % 251);
		k = write(w->fd, chunk, n);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	return NULL;
}

TEST(host_to_guest_respects_guest_credit)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	struct writer_arg wa;
	pthread_t th;
	static uint8_t buf[RXBUF];
	size_t total = 0, stalled_at;
	uint32_t fwd = 0;
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	wa.fd = fd;
	wa.len = 600 * 1024;
	ASSERT_EQ(pthread_create(&th, NULL, writer_thread, &wa), 0);
	/* No credit update from the guest: no more than its 256 KiB buf_alloc may arrive. */
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0) {
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		total += r.len;
	}
	stalled_at = total;
	/*
	 * At most its buf_alloc, less what the per-packet overhead bound (h2g_budget.h) holds back
	 * while bytes are in flight: H2G_PKT_COST, and half of it per small packet (a short tail
	 * of a read); there are at most as many of those as host writes.
	 */
	ASSERT_LE(stalled_at, 256 * 1024);
	ASSERT_GE(stalled_at, 256 * 1024 - (wa.len / 8192 + 2) * H2G_PKT_COST);
	/* Grant credit as the guest consumes: the rest arrives, in order. */
	while (total < wa.len) {
		if (fwd != total) {
			fwd = (uint32_t)total;
			h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM,
				  VSOCK_OP_CREDIT_UPDATE, 0);
			h.fwd_cnt = fwd;
			tg_send(&g, &h, NULL);
		}
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		total += r.len;
	}
	ASSERT_EQ(total, wa.len);
	pthread_join(th, NULL);
	close(fd);
	solo_stop(&t, &g);
}

/*
 * Host writes of 129..512 bytes, each read by the device before the next (one packet each), into
 * a guest that consumes nothing: the packets never break Linux's per-packet overhead rule
 * ((queued + 1) * SKB_TRUESIZE(0) + bytes + len <= 2 * buf_alloc, 576 on x86-64), so the device
 * stops before the credit runs out; once the guest has consumed them, the bytes that waited in
 * the host socket come as full packets, all in order.
 */
/* One RW packet into a guest queue that consumes nothing: Linux's overhead rule must hold. */
static void overhead_rx(const struct vsock_hdr *r, const uint8_t *buf, size_t *total,
			size_t *pkts)
{
	ASSERT_EQ(r->op, VSOCK_OP_RW);
	check_pattern(buf, r->len, *total);
	/* every packet so far is queued, none small enough to be merged; 576: SKB_TRUESIZE(0) */
	(*pkts)++;
	*total += r->len;
	ASSERT_LE(*pkts * 576 + *total, 2 * 256 * 1024);
}

TEST(host_to_guest_small_writes_respect_the_guest_packet_overhead)
{
	static uint8_t chunk[512], buf[RXBUF];
	const size_t buf_alloc = 256 * 1024;
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	size_t written = 0, total = 0, pkts = 0;
	bool held = false;
	unsigned w;
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	ASSERT_OK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK));
	for (w = 0; written < buf_alloc; w++) {
		size_t n = 129 + (w * 37u) % 384;

		for (size_t i = 0; i < n; i++)
			chunk[i] = (uint8_t)((written + i) % 251);
		if (write(fd, chunk, n) != (ssize_t)n)
			break; /* the host socket is full: the device waits for the guest */
		written += n;
		/* One packet per write until the device holds back; then only what comes. */
		if (tg_recv(&g, &r, buf, sizeof(buf), held ? 0 : 200, true) < 0) {
			held = true;
			continue;
		}
		overhead_rx(&r, buf, &total, &pkts);
	}
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0)
		overhead_rx(&r, buf, &total, &pkts);
	test_note("%zu packets, %zu of %zu bytes before the device held back; %u host writes", pkts,
		  total, written, w);
	ASSERT_LT(total, buf_alloc);
	ASSERT_LT(total, written);
	/* The guest consumes everything: the waiting bytes leave coalesced. */
	for (bool first = true; total < written; first = false) {
		h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_UPDATE, 0);
		h.fwd_cnt = (uint32_t)total;
		tg_send(&g, &h, NULL);
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		if (first && written - total > 512)
			ASSERT_GT(r.len, 512);
		total += r.len;
	}
	ASSERT_EQ(total, written);
	close(fd);
	solo_stop(&t, &g);
}

TEST(tx_pauses_at_reply_limit_and_resumes)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	char buf[64];
	int sent = 0, rsts = 0;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	/* No RX buffers: every RST reply stays queued in the device. */
	tg_connect_nrx(&g, &t, 0);
	for (;;) {
		h = mkhdr(&g, 2, 20000 + (uint32_t)sent, 9, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		if (tg_send_wait(&g, &h, NULL, 300) < 0)
			break;
		sent++;
		ASSERT_LT(sent, 1000);
	}
	/* The device stopped taking TX packets near the TX ring size (128) of queued replies. */
	vsock_dev_get_stats(t.d, &st);
	ASSERT_GE(st.tx_pkts, 128);
	ASSERT_LE(st.tx_pkts, 128 + 64);
	/* Posting RX buffers lets the replies out, and TX resumes. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&g, i);
	tg_kick(&g, 0);
	for (int k = 0; k < 100; k++) {
		h = mkhdr(&g, 2, 30000 + (uint32_t)k, 9, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		while (tg_send_wait(&g, &h, NULL, 0) < 0) {
			ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
			ASSERT_EQ(r.op, VSOCK_OP_RST);
			rsts++;
		}
	}
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0) {
		ASSERT_EQ(r.op, VSOCK_OP_RST);
		rsts++;
	}
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.tx_pkts, (uint64_t)sent + 100);
	/* Every REQUEST got its RST, except those beyond the bounded reply queue. */
	ASSERT_GE(rsts, 100 + 128);
	ASSERT_LE(rsts, sent + 100);
	solo_stop(&t, &g);
}

TEST(ring_error_marks_device_broken_until_restart)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	struct vsock_dev_stats st;
	struct vring_drv_buf b = { .addr = 1ull << 40, .len = 44, .write = false };
	char buf[64];

	solo_start(&t, &g);
	/* A TX buffer outside guest memory. */
	ASSERT_GE(vring_drv_add(g.tx, &b, 1, (void *)(uintptr_t)1000), 0);
	tg_kick(&g, 1);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.ring_errors), WAIT_MS);
	ASSERT_EQ(st.ring_errors, 1);
	/* Broken: nothing is processed any more. */
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_ERR(tg_recv(&g, &r, buf, sizeof(buf), 300, true), ETIMEDOUT);
	/* A new VMM session works again. */
	tg_disconnect(&g);
	tg_connect(&g, &t);
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.ring_errors, 1);
	solo_stop(&t, &g);
}

/*
 * The operators' counters are built from the device's and the engine's counters in one place
 * (vsock_dev_counters_from): every source field lands in its model field, the device's own
 * listeners are not connections, and a missing source leaves its fields zero.
 */
TEST(operator_counters_mapping)
{
	struct vsock_dev_stats ds = { 0 };
	struct vsock_engine_stats es = { 0 };
	struct ops_vm_counters m;

	ds.tx_pkts = 1;
	ds.tx_bytes = 2;
	ds.rx_pkts = 3;
	ds.rx_bytes = 4;
	ds.ring_errors = 5;
	ds.guest_conns_refused = 6;
	ds.tx_bad_src_cid = 7;
	ds.tx_bad_dst_cid = 8;
	ds.sibling_dropped = 9;
	ds.tx_bad_chain = 10;
	es.socks_open = 3;
	es.socks_total = 30;
	es.rst_sent = 11;
	es.rst_received = 12;
	es.credit_stalls = 13;
	es.backlog_refused = 14;
	for (unsigned i = 0; i < _VSOCK_HDR_ERROR_MAX; i++)
		es.rx_dropped[i] = 100u << i;
	vsock_dev_counters_from(&m, &ds, &es, 2);
	ASSERT_EQ_U64(m.tx_pkts + m.tx_bytes + m.rx_pkts + m.rx_bytes, 10);
	ASSERT_EQ_U64(m.ring_errors, 5);
	ASSERT_EQ_U64(m.host_connects_refused, 6 + 14);
	ASSERT_EQ_U64(m.conns_open, 1);
	ASSERT_EQ_U64(m.conns_total, 28);
	ASSERT_EQ_U64(m.rst_sent + m.rst_received + m.credit_stalls, 36);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_SPOOFED_CID], 7);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_NO_ROUTE], 17);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_BAD_OP], es.rx_dropped[VSOCK_HDR_BAD_OP]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_BAD_TYPE], es.rx_dropped[VSOCK_HDR_BAD_TYPE]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_OVERSIZE], es.rx_dropped[VSOCK_HDR_OVERSIZE]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED],
		      10 + es.rx_dropped[VSOCK_HDR_BAD_CID] + es.rx_dropped[VSOCK_HDR_BAD_LEN] +
			      es.rx_dropped[VSOCK_HDR_BAD_FLAGS]);

	vsock_dev_counters_from(&m, NULL, &es, 5);
	ASSERT_EQ_U64(m.tx_pkts, 0);
	ASSERT_EQ_U64(m.conns_open, 0);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED], es.rx_dropped[VSOCK_HDR_BAD_CID] +
		      es.rx_dropped[VSOCK_HDR_BAD_LEN] + es.rx_dropped[VSOCK_HDR_BAD_FLAGS]);
	vsock_dev_counters_from(&m, &ds, NULL, 2);
	ASSERT_EQ_U64(m.rst_sent, 0);
	ASSERT_EQ_U64(m.host_connects_refused, 6);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED], 10);
}

/* ---- a sibling whose inbox is full never stops the sender's TX ring ------------------------- */

/* Two linked devices, CIDs 3 (a) and 4 (b), each with a connected guest; b's guest posts nrx_b
 * RX buffers. */
struct sib_pair {
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
};

static void sib_pair_start(struct sib_pair *p, int nrx_b)
{
	sib_start(&p->router, &p->ta, &p->tb);
	tg_connect(&p->ga, &p->ta);
	tg_connect_nrx(&p->gb, &p->tb, nrx_b);
}

static void sib_pair_stop(struct sib_pair *p)
{
	sib_stop(p->router, &p->ta, &p->tb, &p->ga, &p->gb);
}

/* a's guest sends n packets (op) to b, src ports from sport, dst port 77. */
static void sib_send_n(struct sib_pair *p, uint32_t sport, unsigned n, uint16_t op)
{
	for (unsigned i = 0; i < n; i++) {
		struct vsock_hdr h = mkhdr(&p->ga, 4, sport + i, 77, VSOCK_TYPE_STREAM, op, 0);

		tg_send(&p->ga, &h, NULL);
	}
}

/* a's guest reaches the host at once (no listener there: an RST from CID 2 within 500 ms). */
static void sib_host_round_trip(struct sib_pair *p, uint32_t sport)
{
	struct vsock_hdr h = mkhdr(&p->ga, 2, sport, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	uint64_t t0 = test_now_ms();
	char buf[64];

	tg_send(&p->ga, &h, NULL);
	ASSERT_OK(tg_recv(&p->ga, &h, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.src_cid, 2);
	ASSERT_LT(test_now_ms() - t0, 500);
}

/* RSTs to a sibling whose inbox is full are replies: dropped and counted, never waited for. */
TEST(rsts_to_a_full_sibling_are_dropped_not_waited_for)
{
	struct sib_pair p;
	struct vsock_dev_stats st;

	sib_pair_start(&p, 0);
	sib_send_n(&p, 10000, 512, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == 512), WAIT_MS);
	sib_send_n(&p, 20000, 300, VSOCK_OP_RST);
	sib_host_round_trip(&p, 40000);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 512);
	ASSERT_EQ(st.sibling_replies_dropped, 300);
	ASSERT_EQ(st.sibling_dropped, 0);
	sib_pair_stop(&p);
}

/*
 * Packets to a full sibling are held for it, in order; once the hold reaches its bound the
 * sender's ring waits (back-pressure on the guest that sends, never an RST on a healthy
 * connection). When the sibling drains within the stall limit, everything arrives in order and
 * nothing is lost, and the sender's ring goes on.
 */
TEST(packets_for_a_full_sibling_are_held_in_order_then_back_pressured)
{
	struct sib_pair p;
	struct vsock_dev_stats st;
	struct vsock_hdr r;
	char buf[64];

	sib_pair_start(&p, 0);
	/* 512 fill B's inbox, 256 are held, the hold is full: the last 10 wait in A's ring. */
	sib_send_n(&p, 10000, 512 + 256 + 10, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == 512), WAIT_MS);
	/* B drains now (well within the 1 s limit): everything arrives, in order. */
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&p.gb, i);
	tg_kick(&p.gb, 0);
	for (uint32_t i = 0; i < 512 + 256 + 10; i++) {
		ASSERT_OK(tg_recv(&p.gb, &r, buf, sizeof(buf), WAIT_MS, false));
		ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
		ASSERT_EQ(r.src_port, 10000 + i);
	}
	sib_host_round_trip(&p, 40000);
	vsock_dev_get_stats(p.ta.d, &st);
	ASSERT_EQ(st.sibling_fwd_pkts, 512 + 256 + 10);
	ASSERT_EQ(st.sibling_dropped, 0);
	ASSERT_EQ(st.sibling_replies_dropped, 0);
	sib_pair_stop(&p);
}

/* ---- the RX ring's share between the VM's own traffic and its siblings --------------------- */

/*
 * While b's engine and its sibling inbox both have packets, the sibling inbox gets one RX buffer
 * per DEV_RX_ENG_SHARE of the engine's; once the engine has none, the inbox gets every buffer.
 * With no RX buffers posted, b's guest queues n_eng RSTs from the host (REQUESTs to ports
 * without a listener) and a's guest queues n_sib REQUESTs in b's inbox; then b posts its buffers.
 */
TEST(sibling_flood_gets_one_rx_buffer_in_five_while_the_engine_has_data)
{
	enum { n_eng = 100, n_sib = 200 };
	unsigned got_eng = 0, got_sib = 0, sib_while_eng = 0;
	struct vsock_dev_stats st;
	struct sib_pair p;
	char buf[64];

	sib_pair_start(&p, 0);
	for (unsigned i = 0; i < n_eng; i++) {
		struct vsock_hdr h = mkhdr(&p.gb, 2, 30000 + i, 9, VSOCK_TYPE_STREAM,
					   VSOCK_OP_REQUEST, 0);

		tg_send(&p.gb, &h, NULL);
	}
	sib_send_n(&p, 10000, n_sib, VSOCK_OP_REQUEST);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.tb.d, &st), st.tx_pkts == n_eng), WAIT_MS);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(p.ta.d, &st), st.sibling_fwd_pkts == n_sib), WAIT_MS);
	for (int i = 0; i < NRX; i++)
		tg_post_rx(&p.gb, i);
	tg_kick(&p.gb, 0);
	while (got_eng + got_sib < n_eng + n_sib) {
		struct vsock_hdr r;

		ASSERT_OK(tg_recv(&p.gb, &r, buf, sizeof(buf), WAIT_MS, false));
		if (r.src_cid == 2) {
			/* The engine's RSTs, in the order of the REQUESTs. */
			ASSERT_EQ(r.op, VSOCK_OP_RST);
			ASSERT_EQ(r.dst_port, 30000 + got_eng);
			got_eng++;
			sib_while_eng = got_sib;
		} else {
			/* The sibling's REQUESTs, in order, none lost. */
			ASSERT_EQ(r.src_cid, 3);
			ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
			ASSERT_EQ(r.src_port, 10000 + got_sib);
			got_sib++;
		}
	}
	/* Up to the engine's last packet: one sibling buffer per DEV_RX_ENG_SHARE, no more, no less. */
	ASSERT_LE(sib_while_eng * DEV_RX_ENG_SHARE, n_eng);
	ASSERT_GE((sib_while_eng + 1) * DEV_RX_ENG_SHARE, n_eng);
	ASSERT_EQ(got_sib, n_sib);
	vsock_dev_get_stats(p.tb.d, &st);
	ASSERT_EQ(st.sibling_dropped, 0);
	sib_pair_stop(&p);
}

/* ---- zero-copy host path (docs/performance.md, "uvsockd's host path") --------------------- */

/* The device's engine socket of its one connection (listing), in *ret. */
static void conn_info_one(void *arg, const struct vsock_sock_info *info)
{
	if (info->state != VSOCK_SS_LISTEN)
		*(struct vsock_sock_info *)arg = *info;
}

static struct vsock_sock_info conn_info(struct tdev *t)
{
	struct vsock_sock_info info = { 0 };

	vsock_dev_foreach_sock(t->d, conn_info_one, &info);
	return info;
}

/*
 * Guest -> host with the host socket full: what it takes goes straight from the TX buffers, the
 * rest is queued and flushed later in order, and fwd_cnt counts only what the host socket took.
 */
TEST(zerocopy_guest_to_host_with_the_host_socket_full)
{
	struct vsock_dev_stats st;
	static uint8_t payload[4096], rb[65536];
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h;
	char path[160];
	size_t total = 62 * sizeof(payload), got = 0;
	struct vsock_sock_info info;
	int lfd, hfd, inq;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	/* 248 KiB, within the credit, while the host reads nothing: more than its socket takes. */
	for (size_t off = 0; off < total; off += sizeof(payload)) {
		for (size_t i = 0; i < sizeof(payload); i++)
			payload[i] = (uint8_t)((off + i) % 251);
		h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, sizeof(payload));
		tg_send(&g, &h, payload);
	}
	ASSERT_WAIT_FOR((info = conn_info(&t), info.fwd_cnt + info.rx_bytes == total), WAIT_MS);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_GT(st.zc_tx_bytes, 0);
	ASSERT_GE(info.fwd_cnt, st.zc_tx_bytes); /* in place, plus what a retry flushed */
	ASSERT_GT(info.rx_bytes, 0);             /* the rest waits, unacknowledged */
	ASSERT_LE(info.rx_bytes, info.buf_alloc);
	/* fwd_cnt is exactly what the host socket holds: credit only for what it took. */
	ASSERT_OK(ioctl(hfd, FIONREAD, &inq));
	ASSERT_EQ((uint32_t)inq, info.fwd_cnt);
	while (got < total) {
		ssize_t n = read_wait(hfd, rb, sizeof(rb), WAIT_MS);

		ASSERT_GT(n, 0);
		check_pattern(rb, (size_t)n, got);
		got += (size_t)n;
	}
	ASSERT_WAIT_FOR((info = conn_info(&t), info.fwd_cnt == total), WAIT_MS);
	ASSERT_EQ(info.rx_bytes, 0);
	/* Nothing queued any more: in place again. */
	vsock_dev_get_stats(t.d, &st);
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 5);
	tg_send(&g, &h, "again");
	ASSERT_EQ(read_wait(hfd, rb, sizeof(rb), WAIT_MS), 5);
	ASSERT_MEMEQ(rb, "again", 5);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.zc_tx_bytes), WAIT_MS);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

/* Waits until the device has put n more packets (from before) into RX buffers. */
static void wait_rx_pkts(struct tdev *t, uint64_t n)
{
	struct vsock_dev_stats st;

	ASSERT_WAIT_FOR((vsock_dev_get_stats(t->d, &st), st.rx_pkts >= n), WAIT_MS);
}

/*
 * Host -> guest while the guest posts no RX buffers: 100 small host writes wait in the host
 * socket and become as few packets as the guest's buffers allow, read with one readv over
 * several buffers, every buffer full but the last; every byte in order, all of it in place.
 */
TEST(zerocopy_host_to_guest_coalesces_small_writes)
{
	static uint8_t chunk[640], buf[RXBUF];
	struct vsock_dev_stats st;
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, r;
	size_t total = 100 * sizeof(chunk), got = 0, off = 0;
	unsigned rw = 0;
	int fd;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	tg_connect_nrx(&g, &t, 2);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	/* Take the guest's two buffers with one byte each. */
	vsock_dev_get_stats(t.d, &st);
	for (int i = 0; i < 2; i++) {
		chunk[0] = (uint8_t)(off % 251);
		ASSERT_EQ(write(fd, chunk, 1), 1);
		off++;
		wait_rx_pkts(&t, st.rx_pkts + 1 + (uint64_t)i);
	}
	for (int w = 0; w < 100; w++) {
		for (size_t i = 0; i < sizeof(chunk); i++)
			chunk[i] = (uint8_t)((off + i) % 251);
		ASSERT_EQ(write(fd, chunk, sizeof(chunk)), (ssize_t)sizeof(chunk));
		off += sizeof(chunk);
	}
	/* Buffers again, many at once: one gathered read fills them. */
	for (int i = 2; i < NRX; i++)
		tg_post_rx(&g, i);
	tg_kick(&g, 0);
	total += 2;
	while (got < total) {
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, got);
		got += r.len;
		if (++rw > 2 && got < total)
			ASSERT_EQ(r.len, RXBUF - 44);
	}
	ASSERT_EQ(got, total);
	/* 2 one-byte packets, then 64000 bytes in 16 buffers of 4052 (the last 3220). */
	ASSERT_EQ(rw, 2 + (64000 + RXBUF - 45) / (RXBUF - 44));
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.zc_rx_bytes, total);
	close(fd);
	solo_stop(&t, &g);
}

/*
 * A guest RX buffer shorter than the header while host bytes wait for it (first or among the
 * gathered ones), or one outside guest memory among the gathered ones: that VM's device is
 * broken, nothing crashes or spins, another VM is unaffected.
 */
TEST(zerocopy_short_rx_buffer_breaks_only_that_vm)
{
	struct vsock_dev_stats st;
	struct tdev t, t2;
	struct tguest g, g2;
	struct vsock_hdr req, req2, r;
	static uint8_t big[20000], buf[RXBUF];
	int fd, fd2;

	for (int gathered = 0; gathered < 3; gathered++) {
		tdev_new(&t, NULL, 3);
		tdev_run(&t);
		tg_connect_nrx(&g, &t, 1);
		host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
		solo_start(&t2, &g2);
		host_initiated(&t2, &g2, SOCK_STREAM, &fd2, &req2);
		/* Take the one buffer, then let bytes wait in the host socket. */
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(write(fd, "x", 1), 1);
		wait_rx_pkts(&t, st.rx_pkts + 1);
		ASSERT_EQ(write(fd, big, sizeof(big)), (ssize_t)sizeof(big));
		if (gathered) {
			struct vring_drv_buf b = { .addr = gathered == 1 ? g.rxg[5] : 1ull << 40,
						   .len = gathered == 1 ? 20 : RXBUF,
						   .write = true };

			tg_post_rx(&g, 4);
			ASSERT_GE(vring_drv_add(g.rx, &b, 1, (void *)(uintptr_t)6), 0);
		} else {
			struct vring_drv_buf b = { .addr = g.rxg[4], .len = 43, .write = true };

			ASSERT_GE(vring_drv_add(g.rx, &b, 1, (void *)(uintptr_t)5), 0);
		}
		tg_kick(&g, 0);
		ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.ring_errors == 1), WAIT_MS);
		/* The other VM still moves data both ways. */
		ASSERT_EQ(write(fd2, "ping", 4), 4);
		ASSERT_OK(tg_recv(&g2, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		ASSERT_MEMEQ(buf, "ping", 4);
		/* The broken one is still alive: counters answer, the thread stops cleanly. */
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(st.ring_errors, 1);
		close(fd);
		close(fd2);
		solo_stop(&t2, &g2);
		solo_stop(&t, &g);
	}
}

/* UVSOCK_TUNE=no-zerocopy,no-event-idx: the copying path still works; EVENT_IDX not offered. */
TEST(no_zerocopy_switch_runs_the_copying_path)
{
	struct vsock_dev_stats st;
	struct tdev t;
	struct tguest g;
	char path[160], err[128];
	int lfd, hfd;

	ASSERT_OK(tune_set("no-zerocopy,no-event-idx", err, sizeof(err)));
	ASSERT_EQ(uvsock_dev_features() & (1ull << UVSOCK_DEV_F_EVENT_IDX), 0);
	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	ASSERT_EQ(vhu_front_features(g.f) & (1ull << UVSOCK_DEV_F_EVENT_IDX), 0);
	for (int i = 0; i < 20; i++)
		hello_world(&g, hfd);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.rx_bytes == 100), WAIT_MS);
	ASSERT_EQ(st.tx_bytes, 100);
	ASSERT_EQ(st.zc_tx_bytes, 0);
	ASSERT_EQ(st.zc_rx_bytes, 0);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

/*
 * No allocation per packet on the device's data path, zero-copy or not: 1000 packets each way
 * (and the credit updates they cause) cost the device thread no malloc at all once warm.
 */
TEST(no_allocation_per_packet_on_the_host_path)
{
#ifdef ALLOC_COUNTING
	char path[160], err[128];
	struct vsock_hdr h;
	struct tdev t;
	struct tguest g;
	int lfd, hfd, fd2;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			ASSERT_OK(tune_set("no-zerocopy", err, sizeof(err)));
		hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
		for (int i = 0; i < 50; i++)
			hello_world(&g, hfd);
		alloc_thread = t.th;
		atomic_store_explicit(&alloc_count, 0, memory_order_relaxed);
		/* release: publishes alloc_thread to alloc_note (acquire). */
		atomic_store_explicit(&alloc_counting, true, memory_order_release);
		for (int i = 0; i < 1000; i++)
			hello_world(&g, hfd);
		test_note("pass %d (%s): %u allocations by the device thread for 2000 packets",
			  pass, pass ? "no-zerocopy" : "zerocopy",
			  atomic_load_explicit(&alloc_count, memory_order_relaxed));
		ASSERT_EQ(atomic_load_explicit(&alloc_count, memory_order_relaxed), 0);
		/* The hook does count: a new connection allocates its state. */
		h = mkhdr(&g, 2, 40002, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&g, &h, NULL);
		fd2 = accept_wait(lfd, WAIT_MS);
		ASSERT_GE(fd2, 0);
		ASSERT_WAIT_FOR(atomic_load_explicit(&alloc_count, memory_order_relaxed) > 0,
				WAIT_MS);
		atomic_store_explicit(&alloc_counting, false, memory_order_relaxed);
		close(fd2);
		close(hfd);
		close(lfd);
		unlink(path);
		solo_stop(&t, &g);
	}
#else
	test_skip("malloc cannot be counted here (not glibc, or under a sanitizer)");
#endif
}

/*
 * Every switch of the device and the engine off (and zerocopy on or off): bytes still flow both
 * ways, in order, packets within 4 KiB (no-pkt64k) also when host bytes are read in place.
 */
TEST(device_and_engine_switches_off_still_move_data)
{
	static uint8_t payload[3000], rb[RXBUF];
	struct vsock_dev_stats st;
	char path[160], err[128];
	struct vsock_hdr h, r;
	struct tdev t;
	struct tguest g;
	int lfd, hfd;

	for (int pass = 0; pass < 2; pass++) {
		size_t got = 0, total = 20 * sizeof(payload);

		ASSERT_OK(tune_set(pass ? "no-zerocopy" : "zerocopy,no-tx-batch,no-event-idx,"
			  "no-credit-reduce,no-merge,no-pkt64k,no-rx-batch", err, sizeof(err)));
		hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
		for (int i = 0; i < 5; i++)
			hello_world(&g, hfd);
		for (size_t off = 0; off < total; off += sizeof(payload)) {
			for (size_t i = 0; i < sizeof(payload); i++)
				payload[i] = (uint8_t)((off + i) % 251);
			h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW,
				  sizeof(payload));
			tg_send(&g, &h, payload);
			ASSERT_EQ(write(hfd, payload, sizeof(payload)), (ssize_t)sizeof(payload));
		}
		while (got < total) {
			ssize_t n = read_wait(hfd, rb, sizeof(rb), WAIT_MS);

			ASSERT_GT(n, 0);
			check_pattern(rb, (size_t)n, got);
			got += (size_t)n;
		}
		for (got = 0; got < total; got += r.len) {
			ASSERT_OK(tg_recv(&g, &r, rb, sizeof(rb), WAIT_MS, true));
			ASSERT_EQ(r.op, VSOCK_OP_RW);
			check_pattern(rb, r.len, got);
		}
		vsock_dev_get_stats(t.d, &st);
		ASSERT_EQ(st.zc_rx_bytes == 0, pass == 1);
		close(hfd);
		close(lfd);
		unlink(path);
		solo_stop(&t, &g);
	}
}

/* ---- datagrams (docs/uvsockd.md "Datagrams") ------------------------------------------------ */

#define DG_FEAT VHU_BIT(VHU_VSOCK_F_DGRAM)

/* A SOCK_DGRAM socket bound at path (removed first if there), non-blocking. */
static int dg_bind(const char *path)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	unlink(path);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

/* An unbound SOCK_DGRAM socket. */
static int dg_unbound(void)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	return fd;
}

/* Sends len bytes of msg from fd to the device's <uds>.dgram. */
static void dg_send_host(struct tdev *t, int fd, const void *msg, size_t len)
{
	char path[160];
	struct sockaddr_un sa;

	snprintf(path, sizeof(path), "%s.dgram", t->uds);
	sa = hs_addr(path);
	ASSERT_EQ(sendto(fd, msg, len, 0, (struct sockaddr *)&sa, sizeof(sa)), (ssize_t)len);
}

/* Receives one datagram on fd within WAIT_MS; its length, and the sender's path in from. */
static ssize_t dg_recv_host(int fd, void *buf, size_t cap, char *from, size_t fromcap)
{
	struct sockaddr_un sa;
	socklen_t salen = sizeof(sa);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t n;

	ASSERT_GT(poll(&p, 1, WAIT_MS), 0);
	memset(&sa, 0, sizeof(sa));
	n = recvfrom(fd, buf, cap, 0, (struct sockaddr *)&sa, &salen);
	ASSERT_GE(n, 0);
	if (from)
		snprintf(from, fromcap, "%s", sa.sun_path);
	return n;
}

/* The guest's DGRAM packet from sport to cid:dport with the string payload s. */
static void dg_send_guest(struct tguest *g, uint64_t cid, uint32_t sport, uint32_t dport,
			  const char *s)
{
	struct vsock_hdr h = mkhdr(g, cid, sport, dport, VSOCK_TYPE_DGRAM, VSOCK_OP_RW,
				   (uint32_t)strlen(s));

	h.buf_alloc = 0;
	tg_send(g, &h, s);
}

/* Waits until the guest's TX packets so far were processed: a REQUEST to a host port nobody
 * listens on is answered with an RST, after everything sent before it (one ring, in order). */
static void dg_sync(struct tguest *g, uint32_t sport)
{
	struct vsock_hdr h = mkhdr(g, 2, sport, 4999, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	char buf[RXBUF];

	tg_send(g, &h, NULL);
	ASSERT_OK(tg_recv(g, &h, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(h.type, VSOCK_TYPE_STREAM);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.dst_port, sport);
}

static uint64_t dg_stat(struct tdev *t, size_t off)
{
	struct vsock_dev_stats st;

	vsock_dev_get_stats(t->d, &st);
	return *(const uint64_t *)((const char *)&st + off);
}

#define DG_STAT(t, f) dg_stat((t), offsetof(struct vsock_dev_stats, f))

TEST(dgram_not_negotiated_is_dropped_and_counted_never_answered)
{
	struct tdev t;
	struct tguest g;
	char path[160], buf[64];
	int hfd, ufd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_5000.dgram", t.uds);
	hfd = dg_bind(path);
	tdev_run(&t);
	tg_connect(&g, &t); /* a Linux guest: bit 3 never acked */
	ASSERT_EQ(vhu_front_features(g.f) & DG_FEAT, 0);
	dg_send_guest(&g, 2, 1234, 5000, "hello");
	/* The RST dg_sync waits for is the first packet the guest gets: none for the datagram. */
	dg_sync(&g, 40000);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_not_negotiated), 1);
	ASSERT_EQ(recv(hfd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	ASSERT_EQ(errno, EAGAIN);
	/* Host to a guest that did not negotiate: dropped and counted. */
	ufd = dg_unbound();
	dg_send_host(&t, ufd, "1234\nhi", 7);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_not_negotiated) == 2, WAIT_MS);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx) + DG_STAT(&t, dgram_rx), 0);
	close(ufd);
	close(hfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_guest_host_round_trip_with_bound_ephemeral_and_unbound_senders)
{
	struct tdev t;
	struct tguest g;
	char path[160], other[160], dgpath[160], from[160], buf[RXBUF];
	struct vsock_hdr r;
	int hfd, ofd, ufd;
	ssize_t n;
	uint32_t eph;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_5000.dgram", t.uds);
	snprintf(other, sizeof(other), "%s/other.sock", t.dir);
	snprintf(dgpath, sizeof(dgpath), "%s.dgram", t.uds);
	hfd = dg_bind(path);
	ofd = dg_bind(other);
	ufd = dg_unbound();
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	ASSERT_NE(vhu_front_features(g.f) & DG_FEAT, 0);

	/* Guest -> host port 5000: "<guest port>\n" + payload, from the device's socket connected
	 * to it (an abstract name: no path). */
	dg_send_guest(&g, 2, 1234, 5000, "hello");
	n = dg_recv_host(hfd, buf, sizeof(buf), from, sizeof(from));
	ASSERT_EQ(n, 10);
	ASSERT_MEMEQ(buf, "1234\nhello", 10);
	ASSERT_STREQ(from, "");
	/* The reply from <uds>_5000.dgram comes from host port 5000. */
	dg_send_host(&t, hfd, "1234\nworld", 10);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_EQ(r.dst_cid, 3);
	ASSERT_EQ(r.src_port, 5000);
	ASSERT_EQ(r.dst_port, 1234);
	ASSERT_EQ(r.len, 5);
	ASSERT_EQ(r.buf_alloc + r.fwd_cnt + r.flags, 0);
	ASSERT_MEMEQ(buf, "world", 5);
	/* An empty datagram is one too. */
	dg_send_host(&t, hfd, "1234\n", 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, 0);

	/* A sender bound elsewhere gets an ephemeral port; replies to it reach it. */
	dg_send_host(&t, ofd, "77\nq", 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	eph = r.src_port;
	ASSERT_GE(eph, 1u << 30);
	ASSERT_LT(eph, (1u << 31) - 1);
	ASSERT_EQ(r.dst_port, 77);
	dg_send_host(&t, ofd, "77\nq2", 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, eph); /* remembered */
	dg_send_guest(&g, 2, 77, eph, "answer");
	n = dg_recv_host(ofd, buf, sizeof(buf), NULL, 0);
	ASSERT_EQ(n, 9);
	ASSERT_MEMEQ(buf, "77\nanswer", 9);

	/* An unbound sender: a port whose replies are dropped and counted. */
	dg_send_host(&t, ufd, "88\nanon", 7);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.src_port, (1u << 31) - 1);
	dg_send_guest(&g, 2, 88, r.src_port, "lost");
	dg_sync(&g, 40001);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 2);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx_bytes), 5 + 6);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_rx), 5);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_rx_bytes), 5 + 0 + 1 + 2 + 4);
	close(ufd);
	close(ofd);
	close(hfd);
	unlink(other);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_malformed_oversize_and_unroutable_are_dropped_and_counted)
{
	static const char *const bad[] = { "abc\nx", "01\nx", "4294967296\nx", "12345678901\nx",
					   "", "12", "-1\nx", " 1\nx", "1 \nx" };
	static char big[65536 + 64];
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	char buf[RXBUF];
	int ufd;

	tg_skip_empty = true;

	solo_start(&t, &g);
	tg_disconnect(&g);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	ufd = dg_unbound();
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++)
		dg_send_host(&t, ufd, bad[i], strlen(bad[i]));
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_malformed) == ARRAY_SIZE(bad), WAIT_MS);
	/* The largest port parses. */
	dg_send_host(&t, ufd, "4294967295\nok", 13);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.dst_port, 0xffffffffu);
	/* Over the maximum (65492) from the host; over the guest's 4 KiB RX buffer. */
	memcpy(big, "9\n", 2);
	memset(big + 2, 'x', sizeof(big) - 2);
	dg_send_host(&t, ufd, big, 2 + 65493);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_oversize) == 1, WAIT_MS);
	dg_send_host(&t, ufd, big, 2 + RXBUF - 44 + 1);
	ASSERT_WAIT_FOR(DG_STAT(&t, dgram_drop_oversize) == 2, WAIT_MS);
	dg_send_host(&t, ufd, big, 2 + RXBUF - 44);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, RXBUF - 44); /* exactly one full buffer is whole */

	/* From the guest: over the maximum, an op other than RW, a CID that is nobody. */
	h = mkhdr(&g, 2, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_RW, 65493);
	tg_send(&g, &h, big);
	h = mkhdr(&g, 2, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	h = mkhdr(&g, 77, 1, 5000, VSOCK_TYPE_DGRAM, VSOCK_OP_RW, 3);
	tg_send(&g, &h, "abc");
	/* Nobody bound at <uds>_5000.dgram. */
	dg_send_guest(&g, 2, 1, 5000, "nobody");
	dg_sync(&g, 40002); /* and never an RST for any of them */
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_oversize), 3);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_malformed), ARRAY_SIZE(bad) + 1);
	ASSERT_EQ_U64(DG_STAT(&t, tx_bad_dst_cid), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 0);
	close(ufd);
	solo_stop(&t, &g);
	tg_skip_empty = false;
}

TEST(dgram_full_host_socket_drops_and_counts_and_the_ring_goes_on)
{
	static char payload[4000];
	struct tdev t;
	struct tguest g;
	char path[160], buf[RXBUF];
	unsigned sent = 0;
	int hfd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_6000.dgram", t.uds);
	hfd = dg_bind(path); /* never read until the end */
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	memset(payload, 'p', sizeof(payload) - 1);
	/* The device's send buffer (or the receiver's queue) fills up: EAGAIN, never a wait. */
	while (DG_STAT(&t, dgram_drop_full) == 0 && sent < 4000) {
		dg_send_guest(&g, 2, 1, 6000, payload);
		sent++;
		if (sent % 32 == 0)
			dg_sync(&g, 41000 + sent);
	}
	dg_sync(&g, 40003);
	ASSERT_GT(DG_STAT(&t, dgram_drop_full), 0);
	ASSERT_GT(DG_STAT(&t, dgram_tx), 0);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx) + DG_STAT(&t, dgram_drop_full), sent);
	/* What was sent on is there, whole. */
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 2 + (ssize_t)strlen(payload));
	close(hfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(dgram_siblings_route_by_cid_and_need_dgram_on_both_sides)
{
	static char big[RXBUF];
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
	struct vsock_hdr r;
	char buf[RXBUF];

	tg_skip_empty = true;

	sib_start(&router, &ta, &tb);
	tg_connect_feat(&ga, &ta, NRX, DG_FEAT);
	tg_connect_feat(&gb, &tb, NRX, DG_FEAT);
	dg_send_guest(&ga, 4, 1000, 2000, "sib");
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.dst_cid, 4);
	ASSERT_EQ(r.src_port, 1000);
	ASSERT_EQ(r.dst_port, 2000);
	ASSERT_EQ(r.len, 3);
	ASSERT_MEMEQ(buf, "sib", 3);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_tx), 1);
	ASSERT_EQ_U64(DG_STAT(&tb, dgram_rx), 1);
	/* Larger than b's RX buffer: dropped whole at b, not split. */
	memset(big, 'b', sizeof(big) - 1);
	dg_send_guest(&ga, 4, 1000, 2000, big);
	ASSERT_WAIT_FOR(DG_STAT(&tb, dgram_drop_oversize) == 1, WAIT_MS);
	dg_send_guest(&ga, 4, 1000, 2000, "after");
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, false));
	ASSERT_EQ(r.len, 5);

	/* b's guest comes back without DGRAM: a's datagrams for it are dropped at a. */
	tg_disconnect(&gb);
	tg_connect(&gb, &tb);
	ASSERT_WAIT_FOR(!atomic_load(&tb.d->sib.port->dgram), WAIT_MS);
	dg_send_guest(&ga, 4, 1000, 2000, "nope");
	dg_sync(&ga, 40004);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_drop_not_negotiated), 1);
	ASSERT_EQ_U64(DG_STAT(&ta, dgram_tx), 3); /* the big one went on: b dropped it */
	sib_stop(router, &ta, &tb, &ga, &gb);
	tg_skip_empty = false;
}

TEST(dgram_counters_map_one_for_one)
{
	struct vsock_dev_stats ds = { 0 };
	struct ops_vm_counters m;

	ds.dgram_tx = 1;
	ds.dgram_tx_bytes = 2;
	ds.dgram_rx = 3;
	ds.dgram_rx_bytes = 4;
	ds.dgram_drop_no_listener = 5;
	ds.dgram_drop_full = 6;
	ds.dgram_drop_oversize = 7;
	ds.dgram_drop_not_negotiated = 8;
	ds.dgram_drop_malformed = 9;
	vsock_dev_counters_from(&m, &ds, NULL, 0);
	ASSERT_EQ_U64(m.dgram_tx, 1);
	ASSERT_EQ_U64(m.dgram_tx_bytes, 2);
	ASSERT_EQ_U64(m.dgram_rx, 3);
	ASSERT_EQ_U64(m.dgram_rx_bytes, 4);
	ASSERT_EQ_U64(m.dgram_drop_no_listener, 5);
	ASSERT_EQ_U64(m.dgram_drop_full, 6);
	ASSERT_EQ_U64(m.dgram_drop_oversize, 7);
	ASSERT_EQ_U64(m.dgram_drop_not_negotiated, 8);
	ASSERT_EQ_U64(m.dgram_drop_malformed, 9);
	/* Not in the stream counters. */
	ASSERT_EQ_U64(m.tx_pkts + m.rx_pkts + m.dropped[OPS_DROP_MALFORMED], 0);
}

TEST(dgram_to_host_never_follows_a_symlink_and_follows_a_rebound_socket)
{
	struct tdev t;
	struct tguest g;
	char path[160], target[160], buf[RXBUF];
	int tfd, hfd;

	tdev_new(&t, NULL, 3);
	snprintf(path, sizeof(path), "%s_7000.dgram", t.uds);
	snprintf(target, sizeof(target), "%s/target.dgram", t.dir);
	tfd = dg_bind(target);
	ASSERT_OK(symlink(target, path));
	tdev_run(&t);
	tg_connect_feat(&g, &t, NRX, DG_FEAT);
	dg_send_guest(&g, 2, 1, 7000, "via link");
	dg_sync(&g, 40010);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 1);
	ASSERT_EQ(recv(tfd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	/* A real socket there now; then closed and bound again (a new inode): both reached. */
	ASSERT_OK(unlink(path));
	hfd = dg_bind(path);
	dg_send_guest(&g, 2, 1, 7000, "first");
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 7);
	close(hfd);
	hfd = dg_bind(path);
	dg_send_guest(&g, 2, 1, 7000, "second");
	ASSERT_EQ(dg_recv_host(hfd, buf, sizeof(buf), NULL, 0), 8);
	ASSERT_MEMEQ(buf, "1\nsecond", 8);
	/* Gone: counted, and nothing is held open for it. */
	close(hfd);
	unlink(path);
	dg_send_guest(&g, 2, 1, 7000, "third");
	dg_sync(&g, 40011);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_drop_no_listener), 2);
	ASSERT_EQ_U64(DG_STAT(&t, dgram_tx), 2);
	close(tfd);
	unlink(target);
	solo_stop(&t, &g);
}

TEST_MAIN()
