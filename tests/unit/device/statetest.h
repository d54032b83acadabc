/* SPDX-License-Identifier: MIT */
/*
 * What the VHOST_USER_PROTOCOL_F_DEVICE_STATE tests share (tests/unit/device/test-vhu-state.c:
 * devices in this process; tests/integration/test-devstate.c: two uvsockd processes): the test's
 * guest with three queues (as Cloud Hypervisor), the save and load through a pipe, the move of
 * the front-end to another back-end with the same memory and rings, and a transfer each way
 * that a move interrupts. After devtest.h.
 */
#ifndef UVSOCK_TESTS_UNIT_DEVICE_STATETEST_H
#define UVSOCK_TESTS_UNIT_DEVICE_STATETEST_H

#include <endian.h>
#include <sys/eventfd.h>

#include "util/rec.h"

#define NEV 4

/* The test's guest with the event queue too (three rings handed over, as Cloud Hypervisor). */
struct mguest {
	struct tguest g;
	struct vring_drv *ev;
	uint8_t *evb;
	uint64_t evb_gpa;
};

static int evmark[NEV];

/* The guest connected to the back-end at sock, with nrx RX buffers posted (of NRX). */
static inline void mg_connect_nrx(struct mguest *m, const char *sock, int nrx)
{
	struct vhu_front_config cfg;
	struct tguest *g = &m->g;
	const struct vhu_front_ring *rr, *tr, *er;
	uint64_t feats;

	memset(m, 0, sizeof(*m));
	vhu_front_config_init(&cfg);
	cfg.mem_size = 8u << 20;
	cfg.num_queues = 3;
	ASSERT_OK(vhu_front_connect(sock, &cfg, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	ASSERT_TRUE(vhu_front_protocol_features(g->f) & VHU_BIT(VHU_PROTO_F_DEVICE_STATE));
	g->cid = (uint32_t)vhu_front_guest_cid(g->f);
	for (int i = 0; i < NRX; i++)
		ASSERT_OK(vhu_front_alloc(g->f, RXBUF, 64, (void **)&g->rxb[i], &g->rxg[i]));
	for (int i = 0; i < NTX; i++)
		ASSERT_OK(vhu_front_alloc(g->f, TXBUF, 64, (void **)&g->txb[i], &g->txg[i]));
	ASSERT_OK(vhu_front_alloc(g->f, 4u * NEV, 8, (void **)&m->evb, &m->evb_gpa));
	ASSERT_OK(vhu_front_start(g->f));
	rr = vhu_front_ring(g->f, 0);
	tr = vhu_front_ring(g->f, 1);
	er = vhu_front_ring(g->f, 2);
	feats = vhu_front_features(g->f);
	ASSERT_OK(vring_drv_new(rr->num, rr->desc, rr->avail, rr->used, feats, &g->rx));
	ASSERT_OK(vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, feats, &g->tx));
	ASSERT_OK(vring_drv_new(er->num, er->desc, er->avail, er->used, feats, &m->ev));
	for (int i = 0; i < nrx; i++)
		tg_post_rx(g, i);
	tg_kick(g, 0);
	for (int i = 0; i < NEV; i++) {
		struct vring_drv_buf b = { m->evb_gpa + 4u * i, 4, true };

		ASSERT_GE(vring_drv_add(m->ev, &b, 1, &evmark[i]), 0);
	}
	vring_drv_publish(m->ev);
	ASSERT_EQ(eventfd_write(er->kick_fd, 1), 0);
}

static inline void mg_connect(struct mguest *m, const char *sock)
{
	mg_connect_nrx(m, sock, NRX);
}

/*
 * For the transfers: 8 RX buffers of 4 KiB, so that of H2G_TOTAL bytes most wait in the engine
 * and the host socket when the device stops.
 */
#define MG_NRX_SMALL 8

static inline void mg_disconnect(struct mguest *m)
{
	vring_drv_free(m->ev);
	tg_disconnect(&m->g);
}

/* The next used event buffer's id, or -1 if none came. */
static inline int64_t mg_event(struct mguest *m)
{
	uint32_t len, id;
	void *ck;

	if (vring_drv_get_used(m->ev, &len, &ck) != 0)
		return -1;
	ASSERT_EQ(len, 4);
	memcpy(&id, m->evb + 4u * (unsigned)((int *)ck - evmark), 4);
	return le32toh(id);
}

/* Reads fd until end of file (bounded) into a malloc'd buffer. */
static inline uint8_t *read_all(int fd, size_t *ret_len)
{
	size_t cap = 4096, len = 0;
	uint8_t *b = malloc(cap);

	ASSERT_TRUE(b != NULL);
	for (;;) {
		ssize_t k = read_wait(fd, b + len, cap - len, WAIT_MS);

		ASSERT_GE(k, 0);
		if (k == 0)
			break;
		len += (size_t)k;
		if (len == cap) {
			cap *= 2;
			b = realloc(b, cap);
			ASSERT_TRUE(b != NULL);
		}
	}
	*ret_len = len;
	return b;
}

/* SET_DEVICE_STATE_FD save through a pipe, then CHECK_DEVICE_STATE; the state's bytes. */
static inline uint8_t *save_state(struct vhu_front *f, size_t *ret_len)
{
	uint64_t rep = 1, chk = 1;
	uint8_t *st;
	int p[2];

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	ASSERT_OK(vhu_front_set_device_state_fd(f, VHU_STATE_DIR_SAVE, VHU_STATE_PHASE_STOPPED, p[1],
						&rep));
	ASSERT_EQ(rep, VHU_STATE_REPLY_NOFD);
	close(p[1]);
	st = read_all(p[0], ret_len);
	close(p[0]);
	ASSERT_OK(vhu_front_check_device_state(f, &chk));
	ASSERT_EQ(chk, 0);
	return st;
}

/*
 * SET_DEVICE_STATE_FD load of len bytes through a pipe (written after the request, as a
 * front-end streams it), then CHECK_DEVICE_STATE; returns its answer.
 */
static inline uint64_t load_state(struct vhu_front *f, const void *st, size_t len)
{
	uint64_t rep = 1, chk = 1;
	int p[2];

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	ASSERT_OK(vhu_front_set_device_state_fd(f, VHU_STATE_DIR_LOAD, VHU_STATE_PHASE_STOPPED, p[0],
						&rep));
	ASSERT_EQ(rep, VHU_STATE_REPLY_NOFD);
	close(p[0]);
	ASSERT_EQ(write(p[1], st, len), (ssize_t)len);
	close(p[1]);
	ASSERT_OK(vhu_front_check_device_state(f, &chk));
	return chk;
}

/* The front-end leaves its back-end for the one at sock, with the same memory and rings. */
static inline void move_to(struct vhu_front *f, const char *sock)
{
	vhu_front_move(f, unix_connect(sock, SOCK_STREAM));
	ASSERT_OK(vhu_front_init(f));
}

/* A guest connection from port sport to the host listener at <uds>_1234 (made here). */
static inline int guest_conn(struct tguest *g, const char *uds, uint32_t sport, int *lfd)
{
	char path[160];
	struct vsock_hdr h, r;
	uint8_t buf[RXBUF];
	int hfd;

	snprintf(path, sizeof(path), "%s_1234", uds);
	*lfd = unix_listen(path, SOCK_STREAM);
	h = mkhdr(g, 2, sport, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(g, &h, NULL);
	hfd = accept_wait(*lfd, WAIT_MS);
	ASSERT_GE(hfd, 0);
	do /* an older connection's packets (its bytes, RSTs for it) may come first */
		ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
	while ((r.op == VSOCK_OP_RST || r.op == VSOCK_OP_RW) && r.dst_port != sport);
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(r.dst_port, sport);
	return hfd;
}

/* "hello" guest -> host, then "world" host -> guest, on the guest's port sport. */
static inline void hello_port(struct tguest *g, int hfd, uint32_t sport)
{
	struct vsock_hdr h = mkhdr(g, 2, sport, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 5), r;
	char buf[256];

	tg_send(g, &h, "hello");
	ASSERT_EQ(read_wait(hfd, buf, sizeof(buf), WAIT_MS), 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	ASSERT_EQ(write(hfd, "world", 5), 5);
	ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.dst_port, sport);
	ASSERT_MEMEQ(buf, "world", 5);
}

static inline void rm_listener(const char *uds, int lfd)
{
	char path[160];

	snprintf(path, sizeof(path), "%s_1234", uds);
	close(lfd);
	unlink(path);
}

/* Pattern bytes of a stream from offset off (check_pattern's, devtest.h). */
static inline void fill_pattern(uint8_t *buf, size_t len, size_t off)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)((off + i) % 251);
}

/* A guest RW packet on port sport published but not kicked: the device has not seen it. */
static inline void tg_queue_unkicked(struct tguest *g, const struct vsock_hdr *h, const void *payload)
{
	struct vring_drv_buf b;
	int i = tg_free_tx(g);

	ASSERT_GE(i, 0);
	vsock_hdr_encode(h, g->txb[i]);
	memcpy(g->txb[i] + 44, payload, h->len);
	b = (struct vring_drv_buf){ .addr = g->txg[i], .len = 44 + h->len, .write = false };
	g->txbusy[i] = true;
	ASSERT_GE(vring_drv_add(g->tx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
	vring_drv_publish(g->tx);
}

/* The guest reads host -> guest bytes of port sport until *got reaches want, each checked. */
static inline void guest_read_to(struct tguest *g, uint32_t sport, size_t *got, size_t want)
{
	struct vsock_hdr r;
	uint8_t buf[RXBUF];

	while (*got < want) {
		ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		ASSERT_EQ(r.dst_port, sport);
		check_pattern(buf, r.len, *got);
		*got += r.len;
	}
}

/*
 * Reads hfd until its end: end of file, or ECONNRESET where the device's end closed with bytes
 * of ours unread. What was in flight is skipped; fails on a timeout.
 */
static inline void host_read_to_eof(int hfd)
{
	uint8_t buf[4096];
	ssize_t k;

	while ((k = read_wait(hfd, buf, sizeof(buf), WAIT_MS)) > 0)
		;
	ASSERT_TRUE(k == 0 || (k == -1 && errno == ECONNRESET));
}

#define H2G_TOTAL (96u * 1024)
#define G2H_PKT 1000u

/*
 * A move in the middle of a transfer each way (the guest made with MG_NRX_SMALL): host -> guest
 * bytes in the RX ring, the engine and the host socket; guest -> host packets, two of them put
 * in the TX ring without a kick (which device takes them depends on its passes: either way each
 * must arrive once). Returns the host fd.
 */
static inline int transfer_started(struct mguest *m, const char *uds, int *lfd, size_t *h2g_got)
{
	static uint8_t h2g[H2G_TOTAL];
	uint8_t p[G2H_PKT];
	struct vsock_hdr h;
	int hfd = guest_conn(&m->g, uds, 40001, lfd);

	fill_pattern(h2g, sizeof(h2g), 0);
	ASSERT_EQ(write(hfd, h2g, sizeof(h2g)), (ssize_t)sizeof(h2g));
	*h2g_got = 0;
	guest_read_to(&m->g, 40001, h2g_got, 8192); /* some of it, the rest waits */
	for (unsigned i = 0; i < 4; i++) {
		h = mkhdr(&m->g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, G2H_PKT);
		fill_pattern(p, sizeof(p), i * G2H_PKT);
		if (i < 2)
			tg_send(&m->g, &h, p);
		else
			tg_queue_unkicked(&m->g, &h, p);
	}
	return hfd;
}

/* The rest of transfer_started's bytes arrive, each once and in order, through hfd. */
static inline void transfer_finished(struct mguest *m, int hfd, size_t h2g_got)
{
	uint8_t buf[4 * G2H_PKT];
	size_t got = 0;

	tg_kick(&m->g, 1);
	while (got < sizeof(buf)) {
		ssize_t k = read_wait(hfd, buf + got, sizeof(buf) - got, WAIT_MS);

		ASSERT_GT(k, 0);
		got += (size_t)k;
	}
	check_pattern(buf, sizeof(buf), 0);
	guest_read_to(&m->g, 40001, &h2g_got, H2G_TOTAL);
	ASSERT_EQ(h2g_got, H2G_TOTAL);
	hello_port(&m->g, hfd, 40001);
}

#endif
