/* SPDX-License-Identifier: MIT */
/*
 * What the device-role tests share (tests/unit/device/test-*.c, one file per source file of
 * src/device): a struct vsock_dev runs on its own thread; the test plays both the VMM (the
 * vhost-user front-end of src/vhost_user/frontend.c, memfd guest memory) and a hand-written
 * guest driver (vring_drv rings, packets built byte by byte), and the host programs (plain Unix
 * sockets).
 */
#ifndef UVSOCK_TESTS_UNIT_DEVICE_DEVTEST_H
#define UVSOCK_TESTS_UNIT_DEVICE_DEVTEST_H

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/vsock_dev.h"
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

static inline void tdev_stop(struct tdev *t)
{
	tdev_halt(t);
	/* The device removed its socket files: the directory must be empty now. */
	ASSERT_OK(rmdir(t->dir));
}

static inline void tg_post_rx(struct tguest *g, int i)
{
	struct vring_drv_buf b = { .addr = g->rxg[i], .len = RXBUF, .write = true };

	ASSERT_GE(vring_drv_add(g->rx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
}

static inline void tg_kick(struct tguest *g, unsigned q)
{
	uint64_t one = 1;
	struct vring_drv *r = q == 0 ? g->rx : g->tx;

	if (vring_drv_kick_prepare(r))
		ASSERT_EQ(write(vhu_front_ring(g->f, q)->kick_fd, &one, 8), 8);
}

static inline void tg_connect_nrx(struct tguest *g, struct tdev *t, int nrx);

static inline void tg_connect(struct tguest *g, struct tdev *t)
{
	tg_connect_nrx(g, t, NRX);
}

static inline void tg_connect_feat(struct tguest *g, struct tdev *t, int nrx, uint64_t extra);

static inline void tg_connect_nrx(struct tguest *g, struct tdev *t, int nrx)
{
	tg_connect_feat(g, t, nrx, 0);
}

/* tg_connect_nrx, asking also for the device features extra (VHU_BIT(...)). */
static inline void tg_connect_feat(struct tguest *g, struct tdev *t, int nrx, uint64_t extra)
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

static inline void tg_disconnect(struct tguest *g)
{
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
	memset(g, 0, sizeof(*g));
}

static inline void tg_reclaim_tx(struct tguest *g)
{
	uint32_t len;
	void *cookie;

	while (vring_drv_get_used(g->tx, &len, &cookie) == 0)
		g->txbusy[(uintptr_t)cookie - 1] = false;
}

/* Takes back the TX buffers the device used; the index of a free one, or -1 if all are busy. */
static inline int tg_free_tx(struct tguest *g)
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
static inline int tg_send_wait(struct tguest *g, const struct vsock_hdr *h, const void *payload,
			int wait_ms)
{
	struct vring_drv_buf b;
	int i;

	if (!WAIT_FOR((i = tg_free_tx(g)) >= 0, wait_ms))
		return -ETIMEDOUT;
	vsock_hdr_encode(h, g->txb[i]);
	if (h->len && payload)
		memcpy(g->txb[i] + 44, payload, h->len);
	b = (struct vring_drv_buf){ .addr = g->txg[i], .len = 44 + h->len, .write = false };
	g->txbusy[i] = true;
	ASSERT_GE(vring_drv_add(g->tx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
	tg_kick(g, 1);
	return 0;
}

static inline void tg_send(struct tguest *g, const struct vsock_hdr *h, const void *payload)
{
	ASSERT_OK(tg_send_wait(g, h, payload, WAIT_MS));
}

static inline struct vsock_hdr mkhdr(struct tguest *g, uint64_t dst_cid, uint32_t sport, uint32_t dport,
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
static inline int tg_recv(struct tguest *g, struct vsock_hdr *h, void *buf, size_t cap, int timeout_ms,
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

static inline int unix_listen(const char *path, int type)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(fd, 8));
	return fd;
}

static inline int unix_connect(const char *path, int type)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

/* Reads up to cap bytes with a deadline; returns the count (0 at EOF) or -ETIMEDOUT. */
static inline ssize_t read_wait(int fd, void *buf, size_t cap, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	return read(fd, buf, cap);
}

static inline int accept_wait(int lfd, int timeout_ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* A device for guest CID 3 on its own thread, and the test's guest connected to it as its VMM. */
static inline void solo_start(struct tdev *t, struct tguest *g)
{
	tdev_new(t, NULL, 3);
	tdev_run(t);
	tg_connect(g, t);
}

static inline void solo_stop(struct tdev *t, struct tguest *g)
{
	tg_disconnect(g);
	tdev_stop(t);
}

/*
 * solo_start with a host listener at <uds>_1234 (path, made before the device runs; *lfd) and the
 * guest's port 40001 connected to it (REQUEST, RESPONSE checked). Returns the accepted host fd.
 */
static inline int solo_start_guest_conn(struct tdev *t, struct tguest *g, char *path, size_t cap,
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
static inline void sib_start(struct vsock_router **router, struct tdev *ta, struct tdev *tb)
{
	ASSERT_OK(vsock_router_new(router));
	tdev_new(ta, *router, 3);
	tdev_new(tb, *router, 4);
	ASSERT_OK(vsock_dev_link_sibling(ta->d, tb->d));
	tdev_run(ta);
	tdev_run(tb);
}

static inline void sib_stop(struct vsock_router *router, struct tdev *ta, struct tdev *tb,
		     struct tguest *ga, struct tguest *gb)
{
	tg_disconnect(ga);
	tg_disconnect(gb);
	tdev_stop(ta);
	tdev_stop(tb);
	vsock_router_free(router);
}

/* Checks that the len bytes at buf are the writer's pattern from stream offset off on. */
static inline void check_pattern(const uint8_t *buf, size_t len, size_t off)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != (uint8_t)((off + i) % 251))
			test_fail(__FILE__, __LINE__, "byte %zu corrupted", off + i);
}

/* On solo_start_guest_conn's connection: "hello" guest -> host, then "world" host -> guest. */
static inline void hello_world(struct tguest *g, int hfd)
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

static inline void host_initiated(struct tdev *t, struct tguest *g, int type, int *ret_fd,
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

static inline int count_str(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

struct walk {
	int conns, listeners;
	uint32_t port;
};

static inline void walk_one(void *arg, const struct vsock_sock_info *info)
{
	struct walk *w = arg;

	if (info->state == VSOCK_SS_LISTEN) {
		w->listeners++;
		return;
	}
	w->conns++;
	w->port = info->local_port;
}

struct writer_arg {
	int fd;
	size_t len;
};

static inline void *writer_thread(void *arg)
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

/*
 * Host writes of 129..512 bytes, each read by the device before the next (one packet each), into
 * a guest that consumes nothing: the packets never break Linux's per-packet overhead rule
 * ((queued + 1) * SKB_TRUESIZE(0) + bytes + len <= 2 * buf_alloc, 576 on x86-64), so the device
 * stops before the credit runs out; once the guest has consumed them, the bytes that waited in
 * the host socket come as full packets, all in order.
 */
/* One RW packet into a guest queue that consumes nothing: Linux's overhead rule must hold. */
static inline void overhead_rx(const struct vsock_hdr *r, const uint8_t *buf, size_t *total,
			size_t *pkts)
{
	ASSERT_EQ(r->op, VSOCK_OP_RW);
	check_pattern(buf, r->len, *total);
	/* every packet so far is queued, none small enough to be merged; 576: SKB_TRUESIZE(0) */
	(*pkts)++;
	*total += r->len;
	ASSERT_LE(*pkts * 576 + *total, 2 * 256 * 1024);
}

/* ---- a sibling whose inbox is full never stops the sender's TX ring ------------------------- */

/* Two linked devices, CIDs 3 (a) and 4 (b), each with a connected guest; b's guest posts nrx_b
 * RX buffers. */
struct sib_pair {
	struct vsock_router *router;
	struct tdev ta, tb;
	struct tguest ga, gb;
};

static inline void sib_pair_start(struct sib_pair *p, int nrx_b)
{
	sib_start(&p->router, &p->ta, &p->tb);
	tg_connect(&p->ga, &p->ta);
	tg_connect_nrx(&p->gb, &p->tb, nrx_b);
}

static inline void sib_pair_stop(struct sib_pair *p)
{
	sib_stop(p->router, &p->ta, &p->tb, &p->ga, &p->gb);
}

/* a's guest sends n packets (op) to b, src ports from sport, dst port 77. */
static inline void sib_send_n(struct sib_pair *p, uint32_t sport, unsigned n, uint16_t op)
{
	for (unsigned i = 0; i < n; i++) {
		struct vsock_hdr h = mkhdr(&p->ga, 4, sport + i, 77, VSOCK_TYPE_STREAM, op, 0);

		tg_send(&p->ga, &h, NULL);
	}
}

/* a's guest reaches the host at once (no listener there: an RST from CID 2 within 500 ms). */
static inline void sib_host_round_trip(struct sib_pair *p, uint32_t sport)
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

/* ---- the RX ring's share between the VM's own traffic and its siblings --------------------- */

/* ---- zero-copy host path (docs/performance.md, "uvsockd's host path") --------------------- */

/* The device's engine socket of its one connection (listing), in *ret. */
static inline void conn_info_one(void *arg, const struct vsock_sock_info *info)
{
	if (info->state != VSOCK_SS_LISTEN)
		*(struct vsock_sock_info *)arg = *info;
}

static inline struct vsock_sock_info conn_info(struct tdev *t)
{
	struct vsock_sock_info info = { 0 };

	vsock_dev_foreach_sock(t->d, conn_info_one, &info);
	return info;
}

/* Waits until the device has put n more packets (from before) into RX buffers. */
static inline void wait_rx_pkts(struct tdev *t, uint64_t n)
{
	struct vsock_dev_stats st;

	ASSERT_WAIT_FOR((vsock_dev_get_stats(t->d, &st), st.rx_pkts >= n), WAIT_MS);
}

/* ---- datagrams (docs/uvsockd.md "Datagrams") ------------------------------------------------ */

#define DG_FEAT VHU_BIT(VHU_VSOCK_F_DGRAM)

/* A SOCK_DGRAM socket bound at path (removed first if there), non-blocking. */
static inline int dg_bind(const char *path)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	unlink(path);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

/* An unbound SOCK_DGRAM socket. */
static inline int dg_unbound(void)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	return fd;
}

/* Sends len bytes of msg from fd to the device's <uds>.dgram. */
static inline void dg_send_host(struct tdev *t, int fd, const void *msg, size_t len)
{
	char path[160];
	struct sockaddr_un sa;

	snprintf(path, sizeof(path), "%s.dgram", t->uds);
	sa = hs_addr(path);
	ASSERT_EQ(sendto(fd, msg, len, 0, (struct sockaddr *)&sa, sizeof(sa)), (ssize_t)len);
}

/* Receives one datagram on fd within WAIT_MS; its length, and the sender's path in from. */
static inline ssize_t dg_recv_host(int fd, void *buf, size_t cap, char *from, size_t fromcap)
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
static inline void dg_send_guest(struct tguest *g, uint64_t cid, uint32_t sport, uint32_t dport,
			  const char *s)
{
	struct vsock_hdr h = mkhdr(g, cid, sport, dport, VSOCK_TYPE_DGRAM, VSOCK_OP_RW,
				   (uint32_t)strlen(s));

	h.buf_alloc = 0;
	tg_send(g, &h, s);
}

/* Waits until the guest's TX packets so far were processed: a REQUEST to a host port nobody
 * listens on is answered with an RST, after everything sent before it (one ring, in order). */
static inline void dg_sync(struct tguest *g, uint32_t sport)
{
	struct vsock_hdr h = mkhdr(g, 2, sport, 4999, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	char buf[RXBUF];

	tg_send(g, &h, NULL);
	ASSERT_OK(tg_recv(g, &h, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(h.type, VSOCK_TYPE_STREAM);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.dst_port, sport);
}

static inline uint64_t dg_stat(struct tdev *t, size_t off)
{
	struct vsock_dev_stats st;

	vsock_dev_get_stats(t->d, &st);
	return *(const uint64_t *)((const char *)&st + off);
}

#define DG_STAT(t, f) dg_stat((t), offsetof(struct vsock_dev_stats, f))

#endif
