/* SPDX-License-Identifier: MIT */
/*
 * Datagram sockets of the engine (engine.h "Datagrams"; the wire format is docs/vsock-protocol.md
 * "Datagrams"): the receive side (one fed DGRAM packet -> the receive queue of the socket bound
 * to its port, bounded by SO_RCVBUF), the send path (vsock_dgram_send -> the engine's lock-free
 * send queue -> vsock_engine_pull), connect/peer address and the buffer options.
 *
 * The send path without the socket lock. A send needs three things of the socket: its engine
 * (fixed at creation), its local address and its default peer. The last two are each one 64-bit
 * atomic word (cid << 32 | port, or DG_NONE), so a sender's read of either is a whole, immutable
 * snapshot: the value itself is the snapshot, and there is nothing to free or protect, which is
 * what an RCU-managed pointer to a struct would give at the price of a grace period. Both words
 * are written only under the socket lock (bind, the auto-bind, connect), with release stores; a
 * sender loads them with acquire, so a sender that sees the peer set by a connect also sees the
 * bind that connect made first. dg_local changes once (DG_NONE -> bound) and never back, which
 * is why a sender that finds it DG_NONE takes the lock (to auto-bind) and one that finds it set
 * never does. A connect racing with sends on other threads is linearized at its store: each
 * datagram goes either to the old or to the new peer, never to a mix of the two.
 *
 * The send queue is an intrusive multi-producer single-consumer list (the scheme of D. Vyukov's
 * "intrusive MPSC node-based queue"; our own code): a push is one atomic exchange of `head` and
 * one store linking the previous node, so senders never wait for each other or for the puller.
 * The consumer side (whoever calls vsock_engine_pull) holds pop_lock, which no sender takes. A
 * pop can find a push half done (head exchanged, link not yet stored): it then reports nothing,
 * and the push that completes the link must make someone pull again. That is the `stalled`
 * handshake: the consumer stores stalled = true, a seq_cst fence, and tries again; the producer
 * stores its link, a seq_cst fence, and loads stalled. By the fences one of the two sees the
 * other's store: the consumer's retry finds the link, or the producer finds stalled set and calls
 * ops->tx_ready. The first push into an empty queue (the count n going 0 -> 1) calls tx_ready
 * too, as any first packet does.
 *
 * Memory is bounded per socket, as Linux UDP does with SO_SNDBUF: each queued datagram charges
 * len + VSOCK_DGRAM_OVERHEAD to its socket's dg_wmem (an atomic add, undone when it is pulled);
 * a send that finds dg_wmem at or above SO_SNDBUF returns -EAGAIN. A queued datagram holds a
 * reference to its socket, so a socket closed with datagrams queued is freed after they leave.
 *
 * Write space, as Linux's sock_writeable() / sock_def_write_space() (net/core/sock.c): POLLOUT
 * and the wake-up of a waiting sender both mean "dg_wmem below half of SO_SNDBUF" (the low mark),
 * not "one more datagram fits", so a full socket with many blocked senders costs one event per
 * half buffer drained instead of one per datagram pulled. A send still succeeds whenever the
 * charge is below the limit. A sender that found the quota full (dg_tx_room) or a poll that found
 * it above the low mark (dg_writeable) stores dg_tx_wait = true, a seq_cst fence, and loads
 * dg_wmem again; a puller (dg_uncharge) does its wmem RMW, a seq_cst fence, and loads dg_tx_wait
 * only if its RMW left the charge below the low mark; if the flag is set it takes it (an
 * exchange) and reports the socket's event.
 *
 * No lost wake-up. Let a waiter W store the flag and then load dg_wmem = X, X at or above the low
 * mark (a sender that sleeps saw X at or above the limit, even more; a poll reports no POLLOUT).
 * For dg_wmem to fall below the low mark later, some RMW after X in dg_wmem's modification order
 * must leave it there (a decrement that W's load did not see). By the fence pair (W: flag store,
 * fence, wmem load; the puller: wmem RMW, fence, flag load), that puller's load of the flag sees
 * W's store or a later one in the flag's modification order. The later ones are another waiter's
 * store (still true: the puller reports) or a puller's exchange, which read W's true (an RMW reads
 * the latest value) and reported an event itself. That event comes after W sampled the socket's
 * event counter: the flag store is a release and the exchange an acquire, so W's sample happens
 * before the event's counter bump, and W's sleep ends (src/lib/socket.c "Blocking"). A puller whose
 * RMW leaves the charge above the mark leaves the flag as it is for the one that crosses it. And
 * the charge does reach the mark: W saw at least SO_SNDBUF / 2 queued, every queued datagram is
 * pulled, dropped as oversize or freed with the engine, and the first two uncharge; senders that
 * keep it high are not asleep.
 *
 * Buffers. Every datagram is copied twice on the loopback transport (into the send queue, then
 * into the receiver's queue), and the buffers cross threads: the sender allocates, the puller
 * frees and allocates the receive copy, the receiver frees that. With malloc this churn made
 * glibc trim and regrow the sending thread's heap, a page fault per datagram (a quarter of the
 * samples of `perf record` at one sender, docs/performance.md §10). So buffers come from a small
 * per-engine cache of five size classes (256 B to 64 KiB of payload; at most DG_POOL_BYTES of
 * them cached, all classes together, so an idle engine holds at most that): a stack pushed with a CAS by any thread and popped by one thread at a time
 * under pop_mu, taken with trylock (a busy or empty class falls back to malloc). Serialized pops
 * make the CAS free of ABA: between a pop's load of top and its CAS only pushes can run, so a
 * top unchanged at the CAS was never removed, and its link, written before it was pushed, is
 * still what the pop read. Nothing is freed while on the stack except by the engine's fini.
 *
 * Threads: any thread. Locks: the socket lock (receive queue, bind, connect), pop_lock (a leaf,
 * consumers only; never held while taking a socket lock), a pool's pop_mu (a leaf, trylock only).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/iov.h"
#include "util/macros.h"
#include "util/tune.h"
#include "vsock/engine_internal.h"

#define DG_NONE UINT64_MAX

static inline uint64_t dg_pack(uint32_t cid, uint32_t port)
{
	return (uint64_t)cid << 32 | port;
}

/* ---- buffers ----------------------------------------------------------------------------- */

#define DG_POOL_BYTES (2u * 1024u * 1024u) /* what one engine may keep cached, all classes */

static const uint32_t dg_pool_cap[DG_POOL_CLASSES] = { 256, 1024, 4096, 16384, VSOCK_DGRAM_MAX };

static uint32_t dg_pool_class(uint32_t len)
{
	for (uint32_t c = 0; c < DG_POOL_CLASSES; c++)
		if (len <= dg_pool_cap[c])
			return c;
	return DG_POOL_NONE;
}

/* A buffer for a datagram of len bytes (from the cache if it can), or NULL. Any thread. */
static struct dgram_pkt *dg_alloc(struct vsock_engine *e, uint32_t len)
{
	uint32_t c = dg_pool_class(len);
	struct dgram_pkt *p = NULL, *next;
	struct dgram_pool *pl;

	if (c == DG_POOL_NONE) {
		p = malloc(sizeof(*p) + len);
		if (p)
			p->cls = DG_POOL_NONE;
		return p;
	}
	pl = &e->dgpool[c];
	/* Relaxed: a hint; an empty-looking class is a malloc, not an error. */
	if (atomic_load_explicit(&pl->n, memory_order_relaxed) > 0 &&
	    pthread_mutex_trylock(&pl->pop_mu) == 0) {
		/* Acquire: pairs with the push's release CAS, so p's link is the pusher's. */
		p = atomic_load_explicit(&pl->top, memory_order_acquire);
		while (p) {
			next = atomic_load_explicit(&p->next, memory_order_relaxed);
			/* Only pushes run beside us: a failed CAS reloads top (file comment). */
			if (atomic_compare_exchange_weak_explicit(&pl->top, &p, next,
								  memory_order_acquire,
								  memory_order_acquire))
				break;
		}
		pthread_mutex_unlock(&pl->pop_mu);
		if (p) {
			atomic_fetch_sub_explicit(&pl->n, 1, memory_order_relaxed);
			atomic_fetch_sub_explicit(&e->dgpool_bytes, dg_pool_cap[c],
						  memory_order_relaxed);
		}
	}
	if (!p) {
		p = malloc(sizeof(*p) + dg_pool_cap[c]);
		if (p)
			p->cls = c;
	}
	return p;
}

/* Gives a buffer of dg_alloc back (to its class's cache unless that is full). Any thread. */
static void dg_free(struct vsock_engine *e, struct dgram_pkt *p)
{
	struct dgram_pool *pl;
	struct dgram_pkt *top;

	if (!p)
		return;
	if (p->cls == DG_POOL_NONE) {
		free(p);
		return;
	}
	pl = &e->dgpool[p->cls];
	/* Relaxed: the byte count only bounds the cache's memory. */
	if (atomic_fetch_add_explicit(&e->dgpool_bytes, dg_pool_cap[p->cls],
				      memory_order_relaxed) >= DG_POOL_BYTES) {
		atomic_fetch_sub_explicit(&e->dgpool_bytes, dg_pool_cap[p->cls],
					  memory_order_relaxed);
		free(p);
		return;
	}
	atomic_fetch_add_explicit(&pl->n, 1, memory_order_relaxed);
	top = atomic_load_explicit(&pl->top, memory_order_relaxed);
	do {
		atomic_store_explicit(&p->next, top, memory_order_relaxed);
		/* Release: the popper that loads p (acquire) sees the link stored above. */
	} while (!atomic_compare_exchange_weak_explicit(&pl->top, &top, p, memory_order_release,
							memory_order_relaxed));
}

/* ---- the lock-free send queue ------------------------------------------------------------ */

static void dgq_push(struct dgram_queue *q, struct dgram_pkt *p)
{
	struct dgram_pkt *prev;

	atomic_store_explicit(&p->next, NULL, memory_order_relaxed);
	/* acq_rel: release publishes p's contents to the consumer that reaches p; acquire orders
	 * our link store after the exchange that made prev ours. */
	prev = atomic_exchange_explicit(&q->head, p, memory_order_acq_rel);
	/* Release: the consumer that loads this link (acquire) sees p's payload. */
	atomic_store_explicit(&prev->next, p, memory_order_release);
}

/* Consumer only (pop_lock held). NULL when empty or when a push is half done. */
static struct dgram_pkt *dgq_pop(struct dgram_queue *q)
{
	struct dgram_pkt *tail = q->tail, *next, *head;

	/* Acquire on every link load: pairs with the release store in dgq_push. */
	next = atomic_load_explicit(&tail->next, memory_order_acquire);
	if (tail == &q->stub) {
		if (!next)
			return NULL;
		q->tail = next;
		tail = next;
		next = atomic_load_explicit(&tail->next, memory_order_acquire);
	}
	if (next) {
		q->tail = next;
		return tail;
	}
	/* tail is the last linked node: only safe to hand out with the stub behind it. */
	head = atomic_load_explicit(&q->head, memory_order_acquire);
	if (tail != head)
		return NULL; /* a push is between its exchange and its link */
	dgq_push(q, &q->stub);
	next = atomic_load_explicit(&tail->next, memory_order_acquire);
	if (next) {
		q->tail = next;
		return tail;
	}
	return NULL; /* a push slipped in before the stub's and is half done */
}

/* Queues p; returns true if the transport must be told (tx_ready). */
static bool dgq_enqueue(struct vsock_engine *e, struct dgram_pkt *p)
{
	struct dgram_queue *q = &e->dgq;
	bool kick;

	dgq_push(q, p);
	/* Counted after the link: n > 0 means a complete push to pull (a hint: vsock_dgram_pull).
	 * Relaxed: the 0 -> 1 decision needs only the RMW's atomicity. */
	kick = atomic_fetch_add_explicit(&q->n, 1, memory_order_relaxed) == 0;
	/* seq_cst fence: our link store against the consumer's stalled store (file comment). */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&q->stalled, memory_order_relaxed) &&
	    atomic_exchange_explicit(&q->stalled, false, memory_order_relaxed))
		kick = true;
	return kick;
}

/* ---- engine set-up ----------------------------------------------------------------------- */

/*
 * UVSOCK_DGRAM_LOCKED=1: this engine's sends run under the socket lock. Read at each engine's
 * creation, not once per process, so that a program comparing the two paths (uvsock-perf's
 * locked row) gets a locked engine after a lock-free one. Caller: the engine's creator, which
 * must not run setenv() concurrently (getenv(3)).
 */
static bool env_locked(void)
{
	const char *v = getenv("UVSOCK_DGRAM_LOCKED");

	return v && strcmp(v, "1") == 0;
}

int vsock_dgram_engine_init(struct vsock_engine *e)
{
	struct dgram_queue *q = &e->dgq;

	if (e->cfg.dgram_max == 0)
		e->cfg.dgram_max = VSOCK_DGRAM_MAX;
	if (e->cfg.dgram_max > VSOCK_DGRAM_MAX)
		return -EINVAL;
	e->dg_locked = env_locked() || !tune_get()->dgram_lockfree;
	atomic_init(&q->stub.next, NULL);
	atomic_init(&q->head, &q->stub);
	q->tail = &q->stub;
	atomic_init(&q->n, 0);
	atomic_init(&q->stalled, false);
	pthread_mutex_init(&q->pop_lock, NULL);
	atomic_init(&e->dgpool_bytes, 0);
	for (int c = 0; c < DG_POOL_CLASSES; c++) {
		atomic_init(&e->dgpool[c].top, NULL);
		atomic_init(&e->dgpool[c].n, 0);
		pthread_mutex_init(&e->dgpool[c].pop_mu, NULL);
	}
	return 0;
}

void vsock_dgram_engine_fini(struct vsock_engine *e)
{
	struct dgram_queue *q = &e->dgq;
	struct dgram_pkt *p;

	if (!q->tail)
		return; /* init never ran */
	/* No producer is left: every pop succeeds until the queue is empty. */
	while ((p = dgq_pop(q)))
		free(p);
	pthread_mutex_destroy(&q->pop_lock);
	for (int c = 0; c < DG_POOL_CLASSES; c++) {
		p = atomic_load_explicit(&e->dgpool[c].top, memory_order_relaxed);
		while (p) {
			struct dgram_pkt *n = atomic_load_explicit(&p->next, memory_order_relaxed);

			free(p);
			p = n;
		}
		pthread_mutex_destroy(&e->dgpool[c].pop_mu);
	}
}

bool vsock_engine_dgram_enabled(const struct vsock_engine *e)
{
	return e->cfg.dgram;
}

uint32_t vsock_engine_dgram_max(const struct vsock_engine *e)
{
	return e->cfg.dgram_max;
}

bool vsock_engine_dgram_locked(const struct vsock_engine *e)
{
	return e->dg_locked;
}

/* ---- sockets ----------------------------------------------------------------------------- */

void vsock_dgram_sock_init(struct vsock_sock *s)
{
	atomic_init(&s->dg_peer, DG_NONE);
	atomic_init(&s->dg_local, DG_NONE);
	atomic_init(&s->dg_wmem, 0);
	atomic_init(&s->dg_sndbuf, VSOCK_DGRAM_BUF_DEFAULT);
	atomic_init(&s->dg_tx_wait, false);
	s->dg_rcvbuf = VSOCK_DGRAM_BUF_DEFAULT;
}

void vsock_dgram_sock_free(struct vsock_sock *s)
{
	struct dgram_pkt *p = s->dg_rx_head;

	while (p) {
		struct dgram_pkt *n = atomic_load_explicit(&p->next, memory_order_relaxed);

		free(p);
		p = n;
	}
	s->dg_rx_head = s->dg_rx_tail = NULL;
	s->dg_rmem = 0;
}

void vsock_dgram_bound(struct vsock_sock *s)
{
	/* Release: pairs with the senders' acquire load (file comment). */
	atomic_store_explicit(&s->dg_local, dg_pack(s->bound_cid, s->local_port),
			      memory_order_release);
}

/* The low mark of the send quota: below it the socket is writeable (file comment). */
static inline uint64_t dg_low_mark(uint64_t sndbuf)
{
	return sndbuf / 2;
}

/*
 * True if dg_wmem is below `mark`; if not, asks for an event when it falls below the low mark
 * (the waiter's half of the handshake in the file comment).
 */
static bool dg_below_or_wait(struct vsock_sock *s, uint64_t mark)
{
	if (atomic_load_explicit(&s->dg_wmem, memory_order_relaxed) < mark)
		return true;
	/* Release: pairs with the acquire exchange in dg_uncharge (the waiter's event sample). */
	atomic_store_explicit(&s->dg_tx_wait, true, memory_order_release);
	/* seq_cst fence: our flag store against the puller's wmem RMW (file comment). */
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&s->dg_wmem, memory_order_relaxed) < mark;
}

/* One more datagram may be charged; if not, the caller will be woken at the low mark. */
static bool dg_tx_room(struct vsock_sock *s)
{
	return dg_below_or_wait(s, atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed));
}

/* POLLOUT: below the low mark (Linux's sock_writeable()); if not, an event when it is. */
static bool dg_writeable(struct vsock_sock *s)
{
	uint64_t lim = atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed);

	return dg_below_or_wait(s, dg_low_mark(lim));
}

unsigned vsock_dgram_poll_locked(struct vsock_sock *s)
{
	unsigned m = 0;

	if (s->dg_rx_head)
		m |= VSOCK_POLLIN;
	if (dg_writeable(s))
		m |= VSOCK_POLLOUT;
	return m;
}

int vsock_dgram_connect(struct vsock_sock *s, uint32_t cid, uint32_t port, bool clear)
{
	int r = 0;

	if (s->type != VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP;
	sock_lock(s);
	if (!clear && !s->bound)
		r = vsock_sk_bind_locked(s, VMADDR_CID_ANY, VMADDR_PORT_ANY);
	/* Release: a sender that sees the new peer sees the bind above (file comment). */
	if (r == 0)
		atomic_store_explicit(&s->dg_peer, clear ? DG_NONE : dg_pack(cid, port),
				      memory_order_release);
	sock_unlock(s);
	return r;
}

int vsock_dgram_peer_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port)
{
	uint64_t w = atomic_load_explicit(&s->dg_peer, memory_order_acquire);

	if (s->type != VSOCK_TYPE_DGRAM || w == DG_NONE)
		return -ENOTCONN;
	*ret_cid = (uint32_t)(w >> 32);
	*ret_port = (uint32_t)w;
	return 0;
}

int vsock_dgram_set_buf(struct vsock_sock *s, bool rcv, uint64_t val)
{
	uint64_t v = val > DG_BUF_MAX / 2 ? DG_BUF_MAX : val * 2;

	if (s->type != VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP;
	if (v < DG_BUF_MIN)
		v = DG_BUF_MIN;
	sock_lock(s);
	if (rcv)
		s->dg_rcvbuf = v;
	else
		atomic_store_explicit(&s->dg_sndbuf, v, memory_order_relaxed);
	vsock_sk_event(NULL, s); /* a larger send quota may make POLLOUT true */
	sock_unlock(s);
	return 0;
}

int vsock_dgram_get_buf(struct vsock_sock *s, bool rcv, uint64_t *ret)
{
	if (s->type != VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP;
	sock_lock(s);
	*ret = rcv ? s->dg_rcvbuf : atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed);
	sock_unlock(s);
	return 0;
}

/* ---- receive ----------------------------------------------------------------------------- */

int vsock_dgram_rx(struct vsock_engine *e, struct rx_ctx *cx, const struct vsock_hdr *h,
		   const struct iovec *iov, int iovcnt, size_t len)
{
	struct vsock_ct_node *n;
	struct dgram_pkt *p;
	struct vsock_sock *s;
	int r = 0;

	if (!e->cfg.dgram) {
		STAT_INC(e, dgram_drop_not_negotiated);
		return -EOPNOTSUPP;
	}
	if ((h->src_cid >> 32) != 0 || (h->dst_cid >> 32) != 0 || h->src_cid == VMADDR_CID_ANY) {
		STAT_INC(e, rx_dropped[VSOCK_HDR_BAD_CID]);
		return -EPROTO;
	}
	if (h->op != VSOCK_OP_RW) {
		STAT_INC(e, rx_dropped[VSOCK_HDR_BAD_OP]);
		return -EPROTO;
	}
	if (h->len != len) {
		STAT_INC(e, rx_dropped[VSOCK_HDR_BAD_LEN]);
		return -EPROTO;
	}
	if (len > e->cfg.dgram_max) {
		STAT_INC(e, dgram_drop_oversize);
		return -EMSGSIZE;
	}
	n = vsock_ct_lookup_bound(e->dct, (uint32_t)h->dst_cid, h->dst_port);
	if (!n) {
		STAT_INC(e, dgram_drop_no_listener);
		return -ENOTCONN;
	}
	s = container_of(n, struct vsock_sock, bnode);
	/* Copied before the lock: the socket's receivers wait only for the link below. */
	p = dg_alloc(e, (uint32_t)len);
	if (!p) {
		sock_unref(s);
		STAT_INC(e, dgram_drop_full);
		return -ENOMEM;
	}
	iov_read_at(iov, iov_count(iovcnt), 0, p->data, len);
	atomic_init(&p->next, NULL);
	p->s = NULL;
	p->cid = (uint32_t)h->src_cid;
	p->port = h->src_port;
	p->len = (uint32_t)len;
	sock_lock(s);
	if (!s->bound || s->app_closed) {
		STAT_INC(e, dgram_drop_no_listener);
		r = -ENOTCONN;
	} else if (s->dg_rx_head && s->dg_rmem + vsock_dgram_cost(p->len) > s->dg_rcvbuf) {
		/* An empty queue takes one datagram of any size, a non-empty one only what fits. */
		STAT_INC(e, dgram_drop_full);
		r = -ENOBUFS;
	} else {
		vsock_dgram_rx_append(s, p);
		s->bytes_in += len;
		STAT_INC(e, dgram_rx);
		STAT_ADD(e, dgram_rx_bytes, len);
		STAT_ADD(e, rx_bytes, len);
		vsock_sk_event(cx, s);
		p = NULL;
	}
	sock_unlock(s);
	sock_unref(s);
	dg_free(e, p);
	return r;
}

ssize_t vsock_dgram_recv(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags,
			 int *ret_msg_flags, struct vsock_dgram_addr *ret_src)
{
	size_t room = iov_total(iov, iov_count(iovcnt)), n;
	struct dgram_pkt *p;
	uint32_t len;

	if (s->type != VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP;
	sock_lock(s);
	p = s->dg_rx_head;
	if (!p) {
		sock_unlock(s);
		return -EAGAIN;
	}
	len = p->len;
	n = MIN(room, (size_t)len);
	if (ret_src) {
		ret_src->cid = p->cid;
		ret_src->port = p->port;
	}
	if (flags & VSOCK_MSG_PEEK) {
		/* It stays queued: copy while the lock keeps another recv from freeing it. */
		iov_write_at(iov, iov_count(iovcnt), 0, p->data, n);
		sock_unlock(s);
	} else {
		s->dg_rx_head = atomic_load_explicit(&p->next, memory_order_relaxed);
		if (!s->dg_rx_head)
			s->dg_rx_tail = NULL;
		s->dg_rmem -= vsock_dgram_cost(len);
		sock_unlock(s);
		iov_write_at(iov, iov_count(iovcnt), 0, p->data, n); /* ours now: no lock */
		dg_free(s->e, p);
	}
	if (ret_msg_flags)
		*ret_msg_flags = len > n ? VSOCK_MSG_TRUNC : 0;
	return (flags & VSOCK_MSG_TRUNC) ? (ssize_t)len : (ssize_t)n;
}

/* ---- send -------------------------------------------------------------------------------- */

/* Binds an unbound s (the lock is taken unless the caller holds it). Returns 0 or -errno. */
static int dg_autobind(struct vsock_sock *s, bool locked, uint64_t *ret_local)
{
	int r = 0;

	if (!locked)
		sock_lock(s);
	if (!s->bound)
		r = vsock_sk_bind_locked(s, VMADDR_CID_ANY, VMADDR_PORT_ANY);
	*ret_local = atomic_load_explicit(&s->dg_local, memory_order_relaxed);
	if (!locked)
		sock_unlock(s);
	return r;
}

/* Charges a datagram of len bytes to s's send quota; false (nothing charged) when full. */
static bool dg_charge(struct vsock_sock *s, uint32_t len)
{
	uint64_t lim = atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed);
	uint64_t c = vsock_dgram_cost(len);

	do {
		/* Relaxed: a count; the event handshake is in dg_tx_room / dg_uncharge. */
		if (atomic_fetch_add_explicit(&s->dg_wmem, c, memory_order_relaxed) < lim)
			return true;
		atomic_fetch_sub_explicit(&s->dg_wmem, c, memory_order_relaxed);
	} while (dg_tx_room(s));
	return false;
}

/*
 * Gives back a datagram's charge; reports the socket's event if a sender or poll waits and the
 * charge is now below the low mark (file comment). `locked`: the caller holds s's lock (the
 * locked send path's failure exit).
 */
static void dg_uncharge(struct vsock_sock *s, uint32_t len, bool locked)
{
	uint64_t c = vsock_dgram_cost(len), lim = atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed);
	uint64_t left = atomic_fetch_sub_explicit(&s->dg_wmem, c, memory_order_relaxed) - c;

	if (left >= dg_low_mark(lim))
		return; /* the puller that takes it below the mark does the rest */
	/* seq_cst fence: our wmem RMW against the waiter's flag store (file comment). */
	atomic_thread_fence(memory_order_seq_cst);
	/* Acquire: pairs with the waiter's release store (file comment). */
	if (atomic_load_explicit(&s->dg_tx_wait, memory_order_relaxed) &&
	    atomic_exchange_explicit(&s->dg_tx_wait, false, memory_order_acquire)) {
		if (!locked)
			sock_lock(s);
		vsock_sk_event(NULL, s);
		if (!locked)
			sock_unlock(s);
	}
}

/* One send, with s's lock held by the caller iff `locked`. Sets *kick for tx_ready. */
static ssize_t dg_send_one(struct vsock_sock *s, const struct vsock_dgram_addr *to,
			   const struct iovec *iov, int iovcnt, uint32_t len, bool locked,
			   bool *kick)
{
	uint64_t peer, local;
	struct dgram_pkt *p;
	int r;

	/* Acquire: pairs with the release stores of connect and bind (file comment). */
	peer = to ? dg_pack(to->cid, to->port)
		  : atomic_load_explicit(&s->dg_peer, memory_order_acquire);
	if (!to && peer == DG_NONE)
		return -EDESTADDRREQ;
	local = atomic_load_explicit(&s->dg_local, memory_order_acquire);
	if (local == DG_NONE) {
		r = dg_autobind(s, locked, &local);
		if (r < 0)
			return r;
	}
	if (!dg_charge(s, len))
		return -EAGAIN;
	p = dg_alloc(s->e, len);
	if (!p) {
		dg_uncharge(s, len, locked);
		return -ENOMEM;
	}
	iov_read_at(iov, iov_count(iovcnt), 0, p->data, len);
	sock_ref(s); /* the queue's, dropped when the datagram is pulled */
	p->s = s;
	p->cid = (uint32_t)(peer >> 32);
	p->port = (uint32_t)peer;
	p->src_port = (uint32_t)local;
	p->len = len;
	*kick = dgq_enqueue(s->e, p);
	return len;
}

ssize_t vsock_dgram_send(struct vsock_sock *s, const struct vsock_dgram_addr *to,
			 const struct iovec *iov, int iovcnt)
{
	struct vsock_engine *e = s->e;
	size_t len = iov_total(iov, iov_count(iovcnt));
	bool kick = false;
	ssize_t r;

	if (s->type != VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP;
	if (len > e->cfg.dgram_max)
		return -EMSGSIZE;
	if (e->dg_locked) {
		sock_lock(s);
		r = dg_send_one(s, to, iov, iovcnt, (uint32_t)len, true, &kick);
		sock_unlock(s);
	} else {
		r = dg_send_one(s, to, iov, iovcnt, (uint32_t)len, false, &kick);
	}
	if (kick && e->ops->tx_ready)
		e->ops->tx_ready(e->opaque);
	return r;
}

/* ---- pull -------------------------------------------------------------------------------- */

bool vsock_dgram_pending(struct vsock_engine *e)
{
	/* Relaxed: a hint; a push missed here calls tx_ready (dgq_enqueue). */
	return atomic_load_explicit(&e->dgq.n, memory_order_relaxed) > 0;
}

ssize_t vsock_dgram_pull(struct vsock_engine *e, struct vsock_hdr *h, const struct iovec *iov,
			 int iovcnt, size_t max_payload, bool first)
{
	struct dgram_queue *q = &e->dgq;
	struct dgram_pkt *p;
	struct vsock_sock *s;

	for (;;) {
		pthread_mutex_lock(&q->pop_lock);
		if (first) {
			q->turn = !q->turn;
			if (!q->turn) {
				pthread_mutex_unlock(&q->pop_lock);
				return -EAGAIN; /* the streams' turn */
			}
		}
		p = dgq_pop(q);
		if (!p && atomic_load_explicit(&q->n, memory_order_relaxed) > 0) {
			/* A push is half done: the stalled handshake (file comment). */
			atomic_store_explicit(&q->stalled, true, memory_order_relaxed);
			atomic_thread_fence(memory_order_seq_cst);
			p = dgq_pop(q);
		}
		pthread_mutex_unlock(&q->pop_lock);
		if (!p)
			return -EAGAIN;
		atomic_fetch_sub_explicit(&q->n, 1, memory_order_relaxed);
		s = p->s;
		if (p->len <= max_payload)
			break;
		/* It cannot fit the transport's buffer, and a datagram goes only whole. */
		STAT_INC(e, dgram_drop_oversize);
		dg_uncharge(s, p->len, false);
		sock_unref(s);
		dg_free(e, p);
		first = false;
	}
	*h = (struct vsock_hdr){
		.src_cid = vsock_engine_local_cid(e),
		.dst_cid = p->cid,
		.src_port = p->src_port,
		.dst_port = p->port,
		.len = p->len,
		.type = VSOCK_TYPE_DGRAM,
		.op = VSOCK_OP_RW,
	};
	iov_write_at(iov, iov_count(iovcnt), 0, p->data, p->len);
	STAT_INC(e, tx_pkts);
	STAT_ADD(e, tx_bytes, p->len);
	STAT_INC(e, dgram_tx);
	STAT_ADD(e, dgram_tx_bytes, p->len);
	dg_uncharge(s, p->len, false);
	sock_unref(s);
	dg_free(e, p);
	return h->len;
}

/* ---- state save and restore (save.c) ---------------------------------------------------- */

void vsock_dgram_foreach_tx(struct vsock_engine *e,
			    void (*fn)(void *arg, const struct dgram_pkt *p), void *arg)
{
	struct dgram_queue *q = &e->dgq;
	struct dgram_pkt *p;

	/* No producer runs (the caller's consistent point): the chain from tail is complete. The
	 * stub may sit anywhere in it (dgq_pop re-pushes it): skipped. */
	pthread_mutex_lock(&q->pop_lock);
	for (p = q->tail; p; p = atomic_load_explicit(&p->next, memory_order_acquire))
		if (p != &q->stub)
			fn(arg, p);
	pthread_mutex_unlock(&q->pop_lock);
}

struct dgram_pkt *vsock_dgram_pkt_new(struct vsock_engine *e, uint32_t len)
{
	struct dgram_pkt *p = dg_alloc(e, len);

	if (p) {
		atomic_init(&p->next, NULL);
		p->s = NULL;
		p->len = len;
	}
	return p;
}

void vsock_dgram_pkt_free(struct vsock_engine *e, struct dgram_pkt *p)
{
	dg_free(e, p);
}

void vsock_dgram_rx_append(struct vsock_sock *s, struct dgram_pkt *p)
{
	atomic_store_explicit(&p->next, NULL, memory_order_relaxed);
	if (s->dg_rx_tail)
		atomic_store_explicit(&s->dg_rx_tail->next, p, memory_order_relaxed);
	else
		s->dg_rx_head = p;
	s->dg_rx_tail = p;
	s->dg_rmem += vsock_dgram_cost(p->len);
}

bool vsock_dgram_restore_tx(struct vsock_sock *s, struct dgram_pkt *p)
{
	sock_ref(s); /* the queue's, as dg_send_one */
	p->s = s;
	return dgq_enqueue(s->e, p);
}
