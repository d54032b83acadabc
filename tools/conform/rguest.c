/* SPDX-License-Identifier: MIT */
/* uvsock-conform's raw guest (rguest.h): front-end, rings and buffers, driven by hand. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rguest.h"
#include "vhost_user/frontend.h"
#include "vring/vring.h"
#include "vring/vring_drv.h"

#define RG_MEM      (32u << 20)
#define RG_QSIZE    128u /* QEMU's: what every back-end takes */
#define RG_SLOT     (VSOCK_HDR_SIZE + 65536u)
#define RG_RXB      (64u + 65536u) /* header, a gap (split layout), 64 KiB of room */
#define RG_RX_SPLIT 64u            /* payload offset in a split RX buffer */

struct rg_queued {
	struct rg_queued *next;
	struct rg_pkt p;
	uint8_t data[];
};

static int reap_tx(struct rguest *g);

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void kick(struct vring_drv *d, int fd)
{
	uint64_t one = 1;

	if (vring_drv_kick_prepare(d))
		(void)!write(fd, &one, sizeof(one));
}

bool rg_seqpacket(const struct rguest *g)
{
	return g->features & (1ull << VIRTIO_VSOCK_F_SEQPACKET);
}

bool rg_indirect(const struct rguest *g)
{
	return g->features & (1ull << VRING_FEAT_INDIRECT_DESC);
}

static int post_rx(struct rguest *g, unsigned i)
{
	uint32_t room = g->lay.room[g->lay_next++ % g->lay.nroom];
	struct vring_drv_buf b[2];
	unsigned n = 1;

	if (g->lay.split) {
		b[0] = (struct vring_drv_buf){ .addr = g->rxb_gpa[i], .len = VSOCK_HDR_SIZE,
					       .write = true };
		b[1] = (struct vring_drv_buf){ .addr = g->rxb_gpa[i] + RG_RX_SPLIT, .len = room,
					       .write = true };
		n = 2;
	} else {
		b[0] = (struct vring_drv_buf){ .addr = g->rxb_gpa[i], .len = VSOCK_HDR_SIZE + room,
					       .write = true };
	}
	if (vring_drv_add(g->rx, b, n, (void *)(uintptr_t)(i + 1)) < 0)
		return -EIO;
	g->rxb_room[i] = room;
	g->rxb_busy[i] = true;
	return 0;
}

int rg_open(struct rguest *g, const char *sock, const struct rg_rx_layout *lay, int timeout_ms,
	    char *err, size_t errlen)
{
	struct vhu_front_config cfg;
	const char *step = "connect";
	int r;

	memset(g, 0, sizeof(*g));
	g->timeout_ms = timeout_ms;
	if (lay)
		g->lay = *lay;
	if (g->lay.nroom == 0) {
		g->lay.room[0] = 4096;
		g->lay.nroom = 1;
	}
	for (unsigned i = 0; i < g->lay.nroom; i++)
		if (g->lay.room[i] == 0 || g->lay.room[i] > 65536)
			return -EINVAL;
	vhu_front_config_init(&cfg);
	cfg.mem_size = RG_MEM;
	cfg.queue_size = RG_QSIZE;
	cfg.timeout_ms = timeout_ms;
	r = vhu_front_connect(sock, &cfg, &g->f);
	if (r == 0) {
		step = "device initialisation (features, GET_CONFIG)";
		r = vhu_front_init(g->f);
	}
	for (unsigned i = 0; r == 0 && i < RG_TX_SLOTS; i++) {
		step = "guest memory";
		r = vhu_front_alloc(g->f, RG_SLOT, 64, (void **)&g->slot[i], &g->slot_gpa[i]);
		if (r == 0)
			r = vhu_front_alloc(g->f, 16 * RG_MAX_SEGS, 16, (void **)&g->ind[i],
					    &g->ind_gpa[i]);
	}
	for (unsigned i = 0; r == 0 && i < RG_RX_BUFS; i++)
		r = vhu_front_alloc(g->f, RG_RXB, 64, (void **)&g->rxb[i], &g->rxb_gpa[i]);
	if (r == 0) {
		step = "driver start (memory table, rings)";
		r = vhu_front_start(g->f);
	}
	if (r == 0) {
		g->cid = (uint32_t)vhu_front_guest_cid(g->f);
		g->features = vhu_front_features(g->f);
		g->rq = vhu_front_ring(g->f, 0);
		g->tq = vhu_front_ring(g->f, 1);
		step = "rings";
		r = vring_drv_new(g->rq->num, g->rq->desc, g->rq->avail, g->rq->used, g->features,
				  &g->rx);
		if (r == 0)
			r = vring_drv_new(g->tq->num, g->tq->desc, g->tq->avail, g->tq->used,
					  g->features, &g->tx);
	}
	/* As many RX buffers as the ring holds (two descriptors each when split). */
	for (unsigned i = 0; r == 0 && i < RG_RX_BUFS &&
			     vring_drv_num_free(g->rx) >= (g->lay.split ? 2u : 1u); i++)
		r = post_rx(g, i);
	if (r < 0) {
		snprintf(err, errlen, "%s: %s", step, strerror(-r));
		rg_close(g);
		return r;
	}
	kick(g->rx, g->rq->kick_fd);
	return 0;
}

void rg_close(struct rguest *g)
{
	while (g->qhead) {
		struct rg_queued *q = g->qhead;

		g->qhead = q->next;
		free(q);
	}
	free(g->cur);
	g->cur = NULL;
	if (g->f && g->rx)
		(void)vhu_front_stop(g->f, NULL);
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
	memset(g, 0, sizeof(*g));
}

/* Sleeps until a call eventfd fires or deadline passes, unless used buffers are pending. */
static void wait_calls(struct rguest *g, uint64_t deadline)
{
	struct pollfd p[2] = { { .fd = g->rq->call_fd, .events = POLLIN },
			       { .fd = g->tq->call_fd, .events = POLLIN } };
	uint64_t now = now_ms(), v;

	if (vring_drv_enable_cb(g->rx) || vring_drv_enable_cb(g->tx) || now >= deadline)
		return;
	if (poll(p, 2, (int)(deadline - now)) > 0)
		for (unsigned i = 0; i < 2; i++)
			if (p[i].revents)
				(void)!read(p[i].fd, &v, sizeof(v));
}

/* Takes one used RX buffer into a queued copy and posts the buffer again. 0, -EAGAIN, -EIO. */
static int take_rx(struct rguest *g, struct rg_queued **ret)
{
	struct rg_queued *q;
	uint32_t len, room, nd;
	void *cookie;
	unsigned i;
	int r = vring_drv_get_used(g->rx, &len, &cookie);

	if (r < 0)
		return r == -EAGAIN ? r : -EIO;
	i = (unsigned)(uintptr_t)cookie - 1;
	room = g->rxb_room[i];
	g->rxb_busy[i] = false;
	q = calloc(1, sizeof(*q) + room);
	if (!q)
		return -ENOMEM;
	q->p.used_len = len;
	q->p.room = room;
	if (len >= VSOCK_HDR_SIZE && len <= VSOCK_HDR_SIZE + room) {
		const uint8_t *pay = g->rxb[i] + (g->lay.split ? RG_RX_SPLIT : VSOCK_HDR_SIZE);

		vsock_hdr_decode(g->rxb[i], &q->p.h);
		nd = len - VSOCK_HDR_SIZE;
		if (q->p.h.len < nd)
			nd = q->p.h.len;
		memcpy(q->data, pay, nd);
		q->p.ndata = nd;
	}
	q->p.data = q->data;
	g->rx_pkts++;
	if (post_rx(g, i) < 0) {
		free(q);
		return -EIO;
	}
	kick(g->rx, g->rq->kick_fd);
	*ret = q;
	return 0;
}

static void enqueue(struct rguest *g, struct rg_queued *q)
{
	q->next = NULL;
	if (g->qtail)
		g->qtail->next = q;
	else
		g->qhead = q;
	g->qtail = q;
	g->nqueued++;
}

int rg_recv(struct rguest *g, struct rg_pkt *p, int ms)
{
	uint64_t deadline = now_ms() + (uint64_t)ms;
	struct rg_queued *q = NULL;
	int r;

	free(g->cur);
	g->cur = NULL;
	for (;;) {
		if (g->qhead) {
			q = g->qhead;
			g->qhead = q->next;
			if (!g->qhead)
				g->qtail = NULL;
			g->nqueued--;
			break;
		}
		r = take_rx(g, &q);
		if (r == 0)
			break;
		if (r != -EAGAIN)
			return r;
		/* TX completions too: pending ones would keep the wait from sleeping. */
		if (reap_tx(g) < 0)
			return -EIO;
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		wait_calls(g, deadline);
	}
	g->cur = (uint8_t *)q;
	*p = q->p;
	if (p->used_len < VSOCK_HDR_SIZE || p->used_len > VSOCK_HDR_SIZE + p->room) {
		memset(&p->h, 0, sizeof(p->h));
		return -EPROTO;
	}
	return 0;
}

/* Takes back the TX buffers the back-end is done with. 0 or -EIO. */
static int reap_tx(struct rguest *g)
{
	uint32_t len;
	void *cookie;
	int r;

	while ((r = vring_drv_get_used(g->tx, &len, &cookie)) == 0)
		g->busy[(uintptr_t)cookie - 1] = false;
	return r == -EAGAIN ? 0 : -EIO;
}

/* Takes back finished TX buffers; queues RX packets so that a back-end waiting for RX room to
 * answer can go on taking TX. */
static int reap(struct rguest *g)
{
	struct rg_queued *q;
	int r = reap_tx(g);

	if (r < 0)
		return r;
	while ((r = take_rx(g, &q)) == 0)
		enqueue(g, q);
	return r == -EAGAIN ? 0 : r;
}

int rg_send(struct rguest *g, const struct vsock_hdr *h, const void *payload, uint32_t plen,
	    const uint32_t *cuts, unsigned ncuts, bool indirect)
{
	uint64_t deadline = now_ms() + (uint64_t)g->timeout_ms;
	struct vring_drv_buf b[RG_MAX_SEGS];
	uint32_t total = VSOCK_HDR_SIZE + plen, from = 0;
	unsigned i, n = 0;
	int r;

	if (plen > 65536 || ncuts >= RG_MAX_SEGS || (indirect && !rg_indirect(g)))
		return -EINVAL;
	for (;;) {
		r = reap(g);
		if (r < 0)
			return r;
		for (i = 0; i < RG_TX_SLOTS && g->busy[i]; i++)
			;
		if (i < RG_TX_SLOTS && vring_drv_num_free(g->tx) >= (indirect ? 1 : ncuts + 1))
			break;
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		wait_calls(g, deadline);
	}
	vsock_hdr_encode(h, g->slot[i]);
	if (plen)
		memcpy(g->slot[i] + VSOCK_HDR_SIZE, payload, plen);
	for (unsigned k = 0; k <= ncuts; k++) {
		uint32_t to = k < ncuts ? cuts[k] : total;

		if (to <= from || to > total)
			return -EINVAL;
		b[n++] = (struct vring_drv_buf){ .addr = g->slot_gpa[i] + from, .len = to - from };
		from = to;
	}
	if (indirect)
		r = vring_drv_add_indirect(g->tx, b, n, g->ind[i], g->ind_gpa[i],
					   (void *)(uintptr_t)(i + 1));
	else
		r = vring_drv_add(g->tx, b, n, (void *)(uintptr_t)(i + 1));
	if (r < 0)
		return r == -EIO ? r : -EINVAL;
	g->busy[i] = true;
	g->tx_pkts++;
	kick(g->tx, g->tq->kick_fd);
	return 0;
}

int rg_send_hdr(struct rguest *g, const struct vsock_hdr *h)
{
	return rg_send(g, h, NULL, 0, NULL, 0, false);
}

bool rg_rx_pending(struct rguest *g)
{
	return g->qhead || vring_drv_more_used(g->rx);
}

int rg_flush(struct rguest *g, int ms)
{
	uint64_t deadline = now_ms() + (uint64_t)ms;

	for (;;) {
		bool idle = true;
		int r = reap(g);

		if (r < 0)
			return r;
		for (unsigned i = 0; i < RG_TX_SLOTS; i++)
			idle = idle && !g->busy[i];
		if (idle)
			return 0;
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		wait_calls(g, deadline);
	}
}
