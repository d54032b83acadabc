/* SPDX-License-Identifier: MIT */
/*
 * The socket API's guest transport (include/uvsock/guest.h), beside the loopback one
 * (loopback.c): uvsock_ctx_new_guest() builds a vdrv (src/driver/driver.h), creates
 * the context's engine with the CID the back-end reported, and attaches the two. The context
 * calls back into here through struct uvsock_transport_ops (src/lib/lib.h).
 *
 * Guest contexts are kept in a small registry so that the uvsock_ctx_guest_*() calls can tell a
 * guest context from another kind without looking inside struct uvsock_ctx.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* lib.h first: it reconciles <linux/vm_sockets.h> with vsock/hdr.h (see there). */
#include "lib/lib.h"

#include <uvsock/guest.h>

#include "driver/driver.h"
#include "util/abisize.h"

struct vguest {
	struct vdrv *d;
	struct uvsock_ctx *ctx;
	size_t max_pkt;             /* the engine's cfg.max_pkt (direct TX packet size) */
	struct vguest *next;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vguest *reg_head;

static void reg_add(struct vguest *g)
{
	pthread_mutex_lock(&reg_mu);
	g->next = reg_head;
	reg_head = g;
	pthread_mutex_unlock(&reg_mu);
}

static void reg_del(struct vguest *g)
{
	pthread_mutex_lock(&reg_mu);
	for (struct vguest **p = &reg_head; *p; p = &(*p)->next) {
		if (*p == g) {
			*p = g->next;
			break;
		}
	}
	pthread_mutex_unlock(&reg_mu);
}

/* The driver of ctx if ctx is a live guest context, else NULL. */
static struct vdrv *reg_find(struct uvsock_ctx *ctx)
{
	struct vdrv *d = NULL;

	pthread_mutex_lock(&reg_mu);
	for (struct vguest *g = reg_head; g; g = g->next) {
		if (g->ctx == ctx) {
			d = g->d;
			break;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	return d;
}

static void g_tx_ready(struct uvsock_ctx *ctx)
{
	struct vguest *g = lib_ctx_transport(ctx);

	vdrv_tx_ready(g->d);
}

static int g_connect_check(struct uvsock_ctx *ctx, uint32_t cid)
{
	struct vguest *g = lib_ctx_transport(ctx);

	/* Linux: no loopback transport in this namespace, so own CID and CID 1 have none. */
	if (cid == VMADDR_CID_LOCAL || cid == vdrv_guest_cid(g->d))
		return -ENODEV;
	if (!vdrv_alive(g->d))
		return -ENETUNREACH;
	return 0;
}

static int g_rx_wait(struct uvsock_ctx *ctx, struct pollfd *fds, unsigned nfds, atomic_uint *word,
		     unsigned val, uint64_t deadline_ns)
{
	struct vguest *g = lib_ctx_transport(ctx);

	return vdrv_rx_wait(g->d, fds, nfds, word, val, deadline_ns);
}

static void g_rx_wake(struct uvsock_ctx *ctx)
{
	struct vguest *g = lib_ctx_transport(ctx);

	vdrv_rx_wake(g->d);
}

static ssize_t g_send_direct(struct uvsock_ctx *ctx, struct vsock_sock *s,
			     const struct iovec *iov, int iovcnt, size_t len)
{
	struct vguest *g = lib_ctx_transport(ctx);

	return vdrv_tx_send(g->d, s, iov, iovcnt, len, g->max_pkt);
}

static void g_get_stats(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *st)
{
	struct vguest *g = lib_ctx_transport(ctx);
	struct vdrv_stats ds;

	vdrv_get_stats(g->d, &ds);
	st->dropped += ds.rx_dropped;
}

static void g_stop(struct uvsock_ctx *ctx)
{
	struct vguest *g = lib_ctx_transport(ctx);

	vdrv_stop(g->d);
}

static void g_destroy(struct uvsock_ctx *ctx)
{
	struct vguest *g = lib_ctx_transport(ctx);

	reg_del(g);
	vdrv_free(g->d);
	free(g);
}

static const struct uvsock_transport_ops guest_ops = {
	.name = "guest",
	.tx_ready = g_tx_ready,
	.connect_check = g_connect_check,
	.rx_wait = g_rx_wait,
	.rx_wake = g_rx_wake,
	.send_direct = g_send_direct,
	.get_stats = g_get_stats,
	.stop = g_stop,
	.destroy = g_destroy,
};

struct uvsock_ctx *uvsock_ctx_new_guest(const char *socket_path,
					const struct uvsock_guest_opts *opts)
{
	struct uvsock_guest_opts o = { 0 };
	struct vsock_engine_config cfg;
	struct vdrv_config dc;
	struct uvsock_ctx *ctx = NULL;
	struct vguest *g;
	int r;

	if ((opts && abi_struct_in(&o, sizeof(o), opts,
				   ABI_SIZE_0(struct uvsock_guest_opts, busy_poll_us)) < 0) ||
	    !socket_path ||
	    (o.flags & ~(UVSOCK_CTX_UNPRIVILEGED | UVSOCK_GUEST_EVENT_QUEUE |
			 UVSOCK_GUEST_NO_DGRAM)) ||
	    o.timeout_ms < 0) {
		errno = EINVAL;
		return NULL;
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		errno = ENOMEM;
		return NULL;
	}
	vdrv_config_default(&dc);
	dc.socket_path = socket_path;
	if (o.queue_size)
		dc.queue_size = o.queue_size;
	if (o.rx_buf_min)
		dc.rx_buf_min = o.rx_buf_min;
	if (o.rx_buf_max)
		dc.rx_buf_max = o.rx_buf_max;
	if (o.timeout_ms)
		dc.timeout_ms = o.timeout_ms;
	dc.busy_poll_us = o.busy_poll_us;
	dc.event_queue = o.flags & UVSOCK_GUEST_EVENT_QUEUE;
	dc.no_dgram = !!(o.flags & UVSOCK_GUEST_NO_DGRAM);
	r = vdrv_new(&dc, &g->d);
	if (r < 0) {
		free(g);
		errno = -r;
		return NULL;
	}

	vsock_engine_config_default(&cfg);
	cfg.local_cid = vdrv_guest_cid(g->d);
	cfg.max_socks = o.max_sockets ? o.max_sockets : 65536;
	/* Linux stops taking RX while queued replies reach the RX ring size (docs/vsock-protocol.md
	 * §5; Linux net/vmw_vsock/virtio_transport.c, virtio_transport_more_replies()). */
	cfg.reply_limit = dc.queue_size;
	cfg.seqpacket = vdrv_seqpacket(g->d);
	/* SOCK_DGRAM sockets only when the back-end negotiated VIRTIO_VSOCK_F_DGRAM. */
	cfg.dgram = vdrv_dgram(g->d);
	if (o.buf_size) {
		cfg.buf_size = o.buf_size;
		if (cfg.buf_max < o.buf_size)
			cfg.buf_max = o.buf_size;
	}
	g->max_pkt = cfg.max_pkt;
	r = lib_ctx_create(&guest_ops, g, &cfg, o.flags & UVSOCK_CTX_UNPRIVILEGED, &ctx);
	if (r < 0) {
		vdrv_free(g->d);
		free(g);
		errno = -r;
		return NULL;
	}
	g->ctx = ctx;
	reg_add(g);
	r = vdrv_start(g->d, lib_ctx_engine(ctx));
	if (r < 0) {
		uvsock_ctx_free(ctx); /* frees g and the driver through g_destroy */
		errno = -r;
		return NULL;
	}
	return ctx;
}

struct vdrv *lib_ctx_guest_vdrv(struct uvsock_ctx *ctx)
{
	return reg_find(ctx);
}

/* Runs op on ctx's driver, in the public API's convention: 0, or -1 with errno (EINVAL: not a
 * guest-role context). */
static int guest_op(struct uvsock_ctx *ctx, int (*op)(struct vdrv *d))
{
	struct vdrv *d = reg_find(ctx);
	int r;

	if (!d) {
		errno = EINVAL;
		return -1;
	}
	r = op(d);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return 0;
}

int uvsock_ctx_guest_transport_reset(struct uvsock_ctx *ctx)
{
	return guest_op(ctx, vdrv_transport_reset);
}

int uvsock_ctx_guest_reconnect(struct uvsock_ctx *ctx)
{
	return guest_op(ctx, vdrv_reconnect);
}

int uvsock_ctx_guest_get_stats(struct uvsock_ctx *ctx, struct uvsock_guest_stats *ret)
{
	struct vdrv *d = reg_find(ctx);
	struct uvsock_guest_stats st;
	struct vdrv_stats s;

	if (!d || !ret) {
		errno = EINVAL;
		return -1;
	}
	vdrv_get_stats(d, &s);
	st = (struct uvsock_guest_stats){
		.size = sizeof(st),
		.rx_bufs = s.rx_bufs,
		.rx_batches = s.rx_batches,
		.rx_dropped = s.rx_dropped,
		.rx_buf_len = s.rx_buf_len,
		.rx_posted = s.rx_posted,
		.tx_pkts = s.tx_pkts,
		.tx_bytes = s.tx_bytes,
		.tx_full = s.tx_full,
		.kicks = s.kicks,
		.kicks_suppressed = s.kicks_suppressed,
		.wakeups = s.wakeups,
		.resets = s.resets,
		.backend_lost = s.backend_lost,
		.tx_inflight = s.tx_inflight,
		.sleep_state = s.sleep_state,
		.rx_direct = s.rx_direct,
		.rx_direct_sleeps = s.rx_direct_sleeps,
	};
	if (abi_struct_out(ret, &st, sizeof(st), ABI_SIZE_0(struct uvsock_guest_stats, sleep_state))) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}
