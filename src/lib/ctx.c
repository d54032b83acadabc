/* SPDX-License-Identifier: MIT */
/*
 * Contexts: one protocol engine plus the transport that moves its packets (src/lib/lib.h).
 * The context supplies the engine's callbacks: the clock, tx_ready (forwarded to the transport)
 * and sock_event (forwarded to the socket layer in socket.c, which wakes waiters and pollable
 * descriptors). Also the futex helpers every blocking wait in src/lib is built on.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lib/ctx.h"
#include "util/abisize.h"
#include "util/time.h"

int lib_futex_wait(atomic_uint *word, unsigned val, uint64_t deadline_ns)
{
	struct timespec ts, *tsp = NULL;
	long r;

	if (deadline_ns != UINT64_MAX) {
		ts.tv_sec = (time_t)(deadline_ns / NS_PER_SEC);
		ts.tv_nsec = (long)(deadline_ns % NS_PER_SEC);
		tsp = &ts;
	}
	/* Absolute CLOCK_MONOTONIC timeout: FUTEX_WAIT_BITSET takes an absolute time. */
	r = syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, val, tsp,
		    NULL, FUTEX_BITSET_MATCH_ANY);
	if (r < 0 && errno == ETIMEDOUT)
		return -ETIMEDOUT;
	return 0;
}

void lib_futex_wake(atomic_uint *word)
{
	syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
}

static uint64_t ctx_now(void *opaque)
{
	return mono_ns();
}

static void ctx_tx_ready(void *opaque)
{
	struct uvsock_ctx *ctx = opaque;

	ctx->tops->tx_ready(ctx);
}

static void ctx_sock_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	if (user)
		lib_sock_event(user, mask);
}

int lib_ctx_create(const struct uvsock_transport_ops *ops, void *tp,
		   const struct vsock_engine_config *cfg, unsigned flags,
		   struct uvsock_ctx **ret)
{
	struct vsock_engine_config c;
	struct uvsock_ctx *ctx;
	int r;

	if (!ops || !ops->tx_ready || !ops->stop || !ops->destroy || !cfg || !ret)
		return -EINVAL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->tops = ops;
	ctx->tp = tp;
	ctx->flags = flags;
	ctx->eops.now = ctx_now;
	ctx->eops.tx_ready = ctx_tx_ready;
	ctx->eops.sock_event = ctx_sock_event;
	pthread_mutex_init(&ctx->mu, NULL);
	c = *cfg;
	c.ops = &ctx->eops;
	c.opaque = ctx;
	r = vsock_engine_new(&c, &ctx->engine);
	if (r < 0) {
		pthread_mutex_destroy(&ctx->mu);
		free(ctx);
		return r;
	}
	*ret = ctx;
	return 0;
}

struct vsock_engine *lib_ctx_engine(struct uvsock_ctx *ctx)
{
	return ctx->engine;
}

void *lib_ctx_transport(struct uvsock_ctx *ctx)
{
	return ctx->tp;
}

void uvsock_ctx_free(struct uvsock_ctx *ctx)
{
	if (!ctx)
		return;
	lib_ctx_close_all(ctx);
	ctx->tops->stop(ctx);
	vsock_engine_free(ctx->engine);
	ctx->engine = NULL;
	ctx->tops->destroy(ctx);
	pthread_mutex_destroy(&ctx->mu);
	free(ctx);
}

uint32_t uvsock_ctx_local_cid(const struct uvsock_ctx *ctx)
{
	if (!ctx)
		return VMADDR_CID_ANY;
	return vsock_engine_local_cid(ctx->engine);
}

int uvsock_ctx_get_stats(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *ret)
{
	struct vsock_engine_stats es;
	struct uvsock_ctx_stats st;

	if (!ctx || !ret) {
		errno = EINVAL;
		return -1;
	}
	vsock_engine_get_stats(ctx->engine, &es);
	memset(&st, 0, sizeof(st));
	st.tx_pkts = es.tx_pkts;
	st.tx_bytes = es.tx_bytes;
	st.rx_pkts = es.rx_pkts;
	st.rx_bytes = es.rx_bytes;
	st.rst_sent = es.rst_sent;
	st.rst_received = es.rst_received;
	st.rx_mem_resets = es.rx_mem_resets;
	st.credit_violations = es.credit_violations;
	st.backlog_refused = es.backlog_refused;
	st.socks_open = es.socks_open;
	st.connects_timed_out = es.connects_timed_out;
	st.dgram_tx = es.dgram_tx;
	st.dgram_tx_bytes = es.dgram_tx_bytes;
	st.dgram_rx = es.dgram_rx;
	st.dgram_rx_bytes = es.dgram_rx_bytes;
	st.dgram_drop_no_listener = es.dgram_drop_no_listener;
	st.dgram_drop_full = es.dgram_drop_full;
	st.dgram_drop_oversize = es.dgram_drop_oversize;
	st.dgram_drop_not_negotiated = es.dgram_drop_not_negotiated;
	if (ctx->tops->get_stats)
		ctx->tops->get_stats(ctx, &st);
	if (abi_struct_out(ret, &st, sizeof(st), ABI_SIZE_0(struct uvsock_ctx_stats, dropped))) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}
