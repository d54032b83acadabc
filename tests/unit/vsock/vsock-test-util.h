/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the engine unit tests: a fake clock, two engines (CID 3 "guest" and CID 2
 * "host") wired by a pump loop that pulls from one and feeds the other, a packet log, and
 * helpers to hand-feed headers and pull single packets.
 */
#ifndef UVSOCK_TEST_VSOCK_UTIL_H
#define UVSOCK_TEST_VSOCK_UTIL_H

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "vsock/engine.h"

#define W_LOG_MAX 4096

struct world {
	uint64_t now;
	struct vsock_engine *g; /* CID 3 */
	struct vsock_engine *h; /* CID 2 */
	/* Written by the engine callbacks, possibly from several threads: relaxed counters. */
	atomic_uint tx_ready_calls;
	atomic_uint events;
	atomic_uint last_mask;
	_Atomic(struct vsock_sock *) last_event_sock;
	/* Every packet the pump moved: header, and which engine sent it (0 = g, 1 = h). */
	struct vsock_hdr log[W_LOG_MAX];
	int log_from[W_LOG_MAX];
	unsigned nlog;
	size_t max_payload;
	uint8_t buf[65536];
};

static inline uint64_t w_now(void *opaque)
{
	return ((struct world *)opaque)->now;
}

static inline void w_tx_ready(void *opaque)
{
	struct world *w = opaque;

	atomic_fetch_add_explicit(&w->tx_ready_calls, 1, memory_order_relaxed);
}

static inline void w_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	struct world *w = opaque;

	(void)user;
	/* Called under the socket's lock, possibly from several threads at once. */
	atomic_fetch_add_explicit(&w->events, 1, memory_order_relaxed);
	atomic_store_explicit(&w->last_mask, mask, memory_order_relaxed);
	atomic_store_explicit(&w->last_event_sock, s, memory_order_relaxed);
}

/* sock_event calls so far. */
static inline unsigned w_events(struct world *w)
{
	return atomic_load_explicit(&w->events, memory_order_relaxed);
}

static const struct vsock_engine_ops w_ops = {
	.now = w_now,
	.tx_ready = w_tx_ready,
	.sock_event = w_event,
};

static struct vsock_engine *w_engine(struct world *w, uint32_t cid,
				     void (*tweak)(struct vsock_engine_config *cfg))
{
	struct vsock_engine_config cfg;
	struct vsock_engine *e = NULL;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = cid;
	cfg.ops = &w_ops;
	cfg.opaque = w;
	if (tweak)
		tweak(&cfg);
	ASSERT_OK(vsock_engine_new(&cfg, &e));
	return e;
}

static struct world *world_new(void (*tweak)(struct vsock_engine_config *cfg))
{
	struct world *w = calloc(1, sizeof(*w));

	ASSERT_TRUE(w != NULL);
	w->now = 1000000000ull;
	w->max_payload = 65536;
	w->g = w_engine(w, 3, tweak);
	w->h = w_engine(w, 2, tweak);
	return w;
}

static inline void world_free(struct world *w)
{
	vsock_engine_free(w->g);
	vsock_engine_free(w->h);
	free(w);
}

/* Moves packets both ways until both engines are idle; returns packets moved. */
static inline unsigned pump(struct world *w)
{
	unsigned moved = 0;

	for (int guard = 0; guard < 1000000; guard++) {
		bool any = false;

		for (int dir = 0; dir < 2; dir++) {
			struct vsock_engine *from = dir ? w->h : w->g, *to = dir ? w->g : w->h;
			struct vsock_hdr hd;
			struct iovec iov = {w->buf, w->max_payload};
			ssize_t n = vsock_engine_pull(from, &hd, &iov, 1, w->max_payload);

			if (n < 0)
				continue;
			ASSERT_EQ(hd.len, n);
			if (w->nlog < W_LOG_MAX) {
				w->log[w->nlog] = hd;
				w->log_from[w->nlog] = dir;
				w->nlog++;
			}
			iov.iov_len = (size_t)n;
			(void)vsock_engine_feed(to, &hd, &iov, 1);
			any = true;
			moved++;
		}
		if (!any)
			return moved;
	}
	test_fail(__FILE__, __LINE__, "pump did not settle");
}

/* Index of the last logged packet with op (and sender dir, -1 any), or -1. */
static inline int log_find_last(struct world *w, unsigned op, int dir)
{
	for (int i = (int)w->nlog - 1; i >= 0; i--)
		if (w->log[i].op == op && (dir < 0 || w->log_from[i] == dir))
			return i;
	return -1;
}

static inline unsigned log_count(struct world *w, unsigned op, int dir)
{
	unsigned n = 0;

	for (unsigned i = 0; i < w->nlog; i++)
		if (w->log[i].op == op && (dir < 0 || w->log_from[i] == dir))
			n++;
	return n;
}

static inline ssize_t send_buf(struct vsock_sock *s, const void *p, size_t n, int flags)
{
	struct iovec iov = {(void *)p, n};

	return vsock_sock_send(s, &iov, 1, flags);
}

static inline ssize_t recv_buf(struct vsock_sock *s, void *p, size_t n, int flags, int *mflags)
{
	struct iovec iov = {p, n};

	return vsock_sock_recv(s, &iov, 1, flags, mflags);
}

/* A listening socket on h:port and a connected pair (client on g, accepted child on h). */
static inline void connect_pair(struct world *w, enum vsock_type type, uint32_t port,
			 struct vsock_sock **ret_listener, struct vsock_sock **ret_client,
			 struct vsock_sock **ret_server)
{
	struct vsock_sock *l, *c, *a;

	ASSERT_OK(vsock_sock_new(w->h, type, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, port));
	ASSERT_OK(vsock_sock_listen(l, 16));
	ASSERT_OK(vsock_sock_new(w->g, type, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, port), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(c), VSOCK_SS_CONNECTED);
	ASSERT_EQ(vsock_sock_take_error(c), 0);
	ASSERT_OK(vsock_sock_accept(l, &a));
	ASSERT_EQ(vsock_sock_state(a), VSOCK_SS_CONNECTED);
	*ret_listener = l;
	*ret_client = c;
	*ret_server = a;
}

/*
 * Ends a connect_pair test: closes the client, the accepted child and the listener, lets the
 * engines exchange what the closes send, and frees the world.
 */
static inline void pair_free(struct world *w, struct vsock_sock *l, struct vsock_sock *c,
			     struct vsock_sock *a)
{
	vsock_sock_close(c);
	vsock_sock_close(a);
	vsock_sock_close(l);
	pump(w);
	world_free(w);
}

/* A header from peer (cid, port) to local (cid, port). */
static inline struct vsock_hdr mkhdr(uint32_t src_cid, uint32_t src_port, uint32_t dst_cid,
			      uint32_t dst_port, unsigned type, unsigned op)
{
	struct vsock_hdr h = {
		.src_cid = src_cid, .dst_cid = dst_cid, .src_port = src_port, .dst_port = dst_port,
		.type = (uint16_t)type, .op = (uint16_t)op, .buf_alloc = 262144, .fwd_cnt = 0,
	};
	return h;
}

static inline int feed_hdr(struct vsock_engine *e, const struct vsock_hdr *h, const void *payload)
{
	struct iovec iov = {(void *)payload, h->len};

	return vsock_engine_feed(e, h, &iov, payload ? 1 : 0);
}

/* Pulls one packet from e (payload into buf); returns its length or -EAGAIN. */
static inline ssize_t pull_one(struct vsock_engine *e, struct vsock_hdr *h, void *buf, size_t cap)
{
	struct iovec iov = {buf, cap};

	return vsock_engine_pull(e, h, &iov, 1, cap);
}

#endif
