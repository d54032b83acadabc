/* SPDX-License-Identifier: MIT */
/*
 * The loopback transport (CID 1, Linux's vsock_loopback): one engine whose pulled packets are
 * fed straight back into it. Packets addressed to a CID other than the local one are discarded
 * and counted, which gives tests a peer that never answers.
 *
 * Pumping. By default the thread whose call made the engine produce packets delivers them
 * itself (inline, from tx_ready): no thread hand-off and no wake-up on the data path. Only one
 * thread pumps at a time; a thread that finds the pump busy leaves a "want" flag that the pumping
 * thread checks before it lets go, so no packet is left behind and the pump never recurses into
 * itself (feeding a packet may queue a reply and call tx_ready again). With
 * UVSOCK_LOOPBACK_PUMP_THREAD a dedicated thread pumps instead (kept for comparison in the
 * benchmark). Pulled packets go back in batches through vsock_engine_feed_batch().
 *
 * Timers. A timer thread sleeps until the engine's next deadline (connect timeout, close
 * linger) and runs the due timers; tx_ready wakes it when the deadline moves earlier.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/lib.h"
#include "util/abisize.h"
#include "util/time.h"

#define LB_BATCH 32
#define LB_ARENA (512u * 1024u)
#define LB_MAX_PKT VSOCK_MAX_PKT_PAYLOAD
#define LB_TIMER_MAX_SLEEP_NS 1000000000ull /* safety net: re-check at least once a second */

struct loopback {
	struct uvsock_ctx *ctx;
	struct vsock_engine *e;
	uint32_t local_cid;
	bool use_pump_thread;

	atomic_bool pumping;      /* a thread is in drain() */
	atomic_uint want;         /* packets may be pending: someone must drain */
	/* Owned by whoever holds `pumping`. */
	uint8_t *arena;
	struct vsock_pkt_ref refs[LB_BATCH];
	struct iovec iovs[LB_BATCH];

	atomic_uint_fast64_t dropped;

	/* Timer thread. */
	pthread_t timer;
	bool timer_started;
	pthread_mutex_t tmu;
	pthread_cond_t tcond;
	bool stopping;                  /* protected by tmu */
	_Atomic uint64_t timer_target;  /* deadline the timer thread sleeps until */

	/* Optional pump thread. */
	pthread_t pumper;
	bool pumper_started;
	atomic_uint pump_word;          /* futex word: bumped to wake the pump thread */
	atomic_bool pump_stop;
};

static __thread bool in_pump_thread;

static void drain(struct loopback *lb)
{
	for (;;) {
		size_t off = 0, n = 0;

		while (n < LB_BATCH && LB_ARENA - off >= LB_MAX_PKT) {
			struct iovec iov = { .iov_base = lb->arena + off, .iov_len = LB_MAX_PKT };
			struct vsock_pkt_ref *p = &lb->refs[n];
			ssize_t r;

			r = vsock_engine_pull(lb->e, &p->hdr, &iov, 1, LB_MAX_PKT);
			if (r < 0)
				break;
			if (p->hdr.dst_cid != lb->local_cid) {
				atomic_fetch_add_explicit(&lb->dropped, 1, memory_order_relaxed);
				continue;
			}
			lb->iovs[n].iov_base = lb->arena + off;
			lb->iovs[n].iov_len = (size_t)r;
			p->iov = &lb->iovs[n];
			p->iovcnt = r > 0 ? 1 : 0;
			off += (size_t)r;
			n++;
		}
		if (n == 0)
			return;
		if (n == 1)
			vsock_engine_feed(lb->e, &lb->refs[0].hdr, lb->refs[0].iov,
					  lb->refs[0].iovcnt);
		else
			vsock_engine_feed_batch(lb->e, lb->refs, n);
	}
}

/* Delivers everything pending, unless another thread is already doing so (it will). */
static void pump(struct loopback *lb)
{
	atomic_store(&lb->want, 1);
	for (;;) {
		bool expected = false;

		if (!atomic_compare_exchange_strong(&lb->pumping, &expected, true))
			return; /* the pumping thread sees want = 1 before it lets go */
		while (atomic_exchange(&lb->want, 0))
			drain(lb);
		atomic_store(&lb->pumping, false);
		/* A tx_ready that found us pumping after our last exchange left want = 1. */
		if (!atomic_load(&lb->want))
			return;
	}
}

static void timer_kick_if_earlier(struct loopback *lb)
{
	uint64_t d = vsock_engine_next_deadline(lb->e);

	if (d < atomic_load(&lb->timer_target)) {
		pthread_mutex_lock(&lb->tmu);
		atomic_store(&lb->timer_target, d);
		pthread_cond_signal(&lb->tcond);
		pthread_mutex_unlock(&lb->tmu);
	}
}

static void lb_tx_ready(struct uvsock_ctx *ctx)
{
	struct loopback *lb = lib_ctx_transport(ctx);

	if (lb->use_pump_thread) {
		atomic_store(&lb->want, 1);
		if (!in_pump_thread) {
			atomic_fetch_add(&lb->pump_word, 1);
			lib_futex_wake(&lb->pump_word);
		}
	} else {
		pump(lb);
	}
	timer_kick_if_earlier(lb);
}

static void *pump_main(void *arg)
{
	struct loopback *lb = arg;

	in_pump_thread = true;
	while (!atomic_load(&lb->pump_stop)) {
		unsigned w = atomic_load(&lb->pump_word);

		if (atomic_load(&lb->want)) {
			pump(lb);
			continue;
		}
		lib_futex_wait(&lb->pump_word, w, UINT64_MAX);
	}
	return NULL;
}

static void *timer_main(void *arg)
{
	struct loopback *lb = arg;

	pthread_mutex_lock(&lb->tmu);
	while (!lb->stopping) {
		uint64_t now = mono_ns(), d, until;
		struct timespec ts;

		d = vsock_engine_next_deadline(lb->e);
		if (d <= now) {
			atomic_store(&lb->timer_target, 0);
			pthread_mutex_unlock(&lb->tmu);
			vsock_engine_run_timers(lb->e);
			pthread_mutex_lock(&lb->tmu);
			continue;
		}
		until = d - now > LB_TIMER_MAX_SLEEP_NS ? now + LB_TIMER_MAX_SLEEP_NS : d;
		atomic_store(&lb->timer_target, d);
		ts.tv_sec = (time_t)(until / NS_PER_SEC);
		ts.tv_nsec = (long)(until % NS_PER_SEC);
		pthread_cond_timedwait(&lb->tcond, &lb->tmu, &ts);
	}
	pthread_mutex_unlock(&lb->tmu);
	return NULL;
}

static void lb_get_stats(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *st)
{
	struct loopback *lb = lib_ctx_transport(ctx);

	st->dropped += atomic_load(&lb->dropped);
}

static void lb_stop(struct uvsock_ctx *ctx)
{
	struct loopback *lb = lib_ctx_transport(ctx);

	if (lb->timer_started) {
		pthread_mutex_lock(&lb->tmu);
		lb->stopping = true;
		pthread_cond_signal(&lb->tcond);
		pthread_mutex_unlock(&lb->tmu);
		pthread_join(lb->timer, NULL);
		lb->timer_started = false;
	}
	if (lb->pumper_started) {
		atomic_store(&lb->pump_stop, true);
		atomic_fetch_add(&lb->pump_word, 1);
		lib_futex_wake(&lb->pump_word);
		pthread_join(lb->pumper, NULL);
		lb->pumper_started = false;
	}
}

static void lb_free(struct loopback *lb)
{
	if (!lb)
		return;
	pthread_cond_destroy(&lb->tcond);
	pthread_mutex_destroy(&lb->tmu);
	free(lb->arena);
	free(lb);
}

static void lb_destroy(struct uvsock_ctx *ctx)
{
	lb_free(lib_ctx_transport(ctx));
}

static const struct uvsock_transport_ops loopback_ops = {
	.name = "loopback",
	.tx_ready = lb_tx_ready,
	.get_stats = lb_get_stats,
	.stop = lb_stop,
	.destroy = lb_destroy,
};

struct uvsock_ctx *uvsock_ctx_new_loopback(const struct uvsock_loopback_opts *opts)
{
	struct uvsock_loopback_opts o = { 0 };
	struct vsock_engine_config cfg;
	struct uvsock_ctx *ctx = NULL;
	pthread_condattr_t ca;
	struct loopback *lb;
	int r;

	if ((opts && abi_struct_in(&o, sizeof(o), opts,
				   ABI_SIZE_0(struct uvsock_loopback_opts, max_sockets)) < 0) ||
	    (o.flags & ~(UVSOCK_CTX_UNPRIVILEGED | UVSOCK_LOOPBACK_PUMP_THREAD))) {
		errno = EINVAL;
		return NULL;
	}
	lb = calloc(1, sizeof(*lb));
	if (!lb) {
		errno = ENOMEM;
		return NULL;
	}
	lb->arena = malloc(LB_ARENA);
	pthread_mutex_init(&lb->tmu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&lb->tcond, &ca);
	pthread_condattr_destroy(&ca);
	atomic_init(&lb->timer_target, UINT64_MAX);
	lb->use_pump_thread = !!(o.flags & UVSOCK_LOOPBACK_PUMP_THREAD);
	if (!lb->arena) {
		r = -ENOMEM;
		goto fail;
	}

	vsock_engine_config_default(&cfg);
	cfg.local_cid = VMADDR_CID_LOCAL;
	cfg.max_socks = o.max_sockets ? o.max_sockets : 65536;
	/* Every reply is pulled and fed back at once; the bound only protects memory. */
	cfg.reply_limit = 65536;
	cfg.seqpacket = true;
	cfg.dgram = true; /* datagrams are always "negotiated" with ourselves */
	r = lib_ctx_create(&loopback_ops, lb, &cfg, o.flags & UVSOCK_CTX_UNPRIVILEGED, &ctx);
	if (r < 0)
		goto fail;
	lb->ctx = ctx;
	lb->e = lib_ctx_engine(ctx);
	lb->local_cid = vsock_engine_local_cid(lb->e);

	r = -pthread_create(&lb->timer, NULL, timer_main, lb);
	if (r < 0)
		goto fail_ctx;
	lb->timer_started = true;
	if (lb->use_pump_thread) {
		r = -pthread_create(&lb->pumper, NULL, pump_main, lb);
		if (r < 0)
			goto fail_ctx;
		lb->pumper_started = true;
	}
	return ctx;

fail_ctx:
	uvsock_ctx_free(ctx); /* stops what started and frees lb via lb_destroy */
	errno = -r;
	return NULL;
fail:
	lb_free(lb);
	errno = -r;
	return NULL;
}
