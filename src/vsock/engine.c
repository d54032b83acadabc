/* SPDX-License-Identifier: MIT */
/*
 * The vsock protocol engine, per packet: dispatch of received packets (docs/vsock-protocol.md
 * §2.1), the per-socket state machine (§2.2, §2.3), credit accounting (§3), pending replies and
 * the send list that pull hands out (§5), the timers, and the whole-engine operations (create,
 * free, stats, transport reset, listing). The socket calls of engine.h are in sock.c and the
 * receive chunk queue in rxq.c; engine_internal.h holds what engine.c and sock.c share. Linux
 * splits the same way: net/vmw_vsock/virtio_transport_common.c holds the protocol, af_vsock.c
 * the socket calls.
 *
 * Security model: every fed packet is untrusted. It is validated by vsock_hdr_check() and
 * counted by reason when rejected; a peer can make us hold at most the credit we advertised
 * (rx_limit), in chunks whose total allocation (rxq.mem) is bounded by vsock_rxq_mem_limit(),
 * plus at most RX_SPARES emptied spare chunks of at most RX_SPARE_MAX kept per socket for reuse; replies to
 * packets that matched no socket go to a bounded ring; per-socket replies are bits, so a socket
 * never has more than a handful queued; sockets are capped by max_socks. Nothing here asserts
 * on input.
 *
 * Threads: see the lock order in engine_internal.h. Every entry point that works on a socket
 * holds a reference on it for the duration, so references dropped while the socket is locked
 * are never the last one (sock_put_locked asserts that).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/iov.h"
#include "util/macros.h"
#include "util/tune.h"
#include "vsock/credit.h"
#include "vsock/engine_internal.h"

#define RX_DEFER_MAX 64u  /* sockets whose events one batch defers before flushing early */
#define BATCH_RUN_MAX 256u /* packets handled under one socket lock hold in a batch */
#define RX_DELIVER_IOV_MAX 128u /* payload iovecs an in-place delivery may have (engine.h) */

/* ---- references and locks -------------------------------------------------------------------- */

static void ct_ref(struct vsock_ct_node *n, bool connected)
{
	sock_ref(connected ? container_of(n, struct vsock_sock, cnode)
			   : container_of(n, struct vsock_sock, bnode));
}

/*
 * Socket locks and tx_lock are taken by the thread feeding packets and by the application's
 * threads at once, for short critical sections: adaptive mutexes spin briefly before sleeping,
 * which saves the futex wait/wake pair of most collisions (see docs/performance.md).
 */
static pthread_mutexattr_t adaptive_attr;
static pthread_once_t adaptive_once = PTHREAD_ONCE_INIT;
static void adaptive_attr_init(void)
{
	pthread_mutexattr_init(&adaptive_attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP /* glibc; elsewhere a normal mutex */
	pthread_mutexattr_settype(&adaptive_attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
}

static void mutex_init_adaptive(pthread_mutex_t *m)
{
	pthread_once(&adaptive_once, adaptive_attr_init);
	pthread_mutex_init(m, &adaptive_attr);
}

/* ---- poll mask and events -------------------------------------------------------------------- */

unsigned vsock_sk_poll_locked(const struct vsock_sock *s)
{
	unsigned m = 0;
	bool eof;

	if (s->type == VSOCK_TYPE_DGRAM)
		return vsock_dgram_poll_locked((struct vsock_sock *)s);
	if (s->err)
		m |= VSOCK_POLLERR;
	if (s->state == VSOCK_SS_LISTEN)
		return m | (s->acc_len ? VSOCK_POLLIN : 0);
	if (s->state == VSOCK_SS_FREE)
		return m;

	eof = s->done || (s->peer_shutdown & VSOCK_SHUTDOWN_SEND) ||
	      (s->shutdown & VSOCK_SHUTDOWN_RCV);
	if (eof)
		m |= VSOCK_POLLRDHUP | VSOCK_POLLIN;
	if (s->type == VSOCK_TYPE_STREAM) {
		if (s->rxq.bytes && s->rxq.bytes >= s->rcvlowat)
			m |= VSOCK_POLLIN;
	} else if (s->rxq.msgs) {
		m |= VSOCK_POLLIN;
	}
	if (s->err)
		m |= VSOCK_POLLIN;
	if (s->shutdown == VSOCK_SHUTDOWN_MASK ||
	    ((s->shutdown & VSOCK_SHUTDOWN_SEND) && (s->peer_shutdown & VSOCK_SHUTDOWN_SEND)) ||
	    s->state == VSOCK_SS_CLOSED)
		m |= VSOCK_POLLHUP;

	if (s->state == VSOCK_SS_CONNECTED) {
		if ((s->shutdown & VSOCK_SHUTDOWN_SEND) ||
		    (s->peer_shutdown & VSOCK_SHUTDOWN_RCV) || sock_send_space(s) > 0)
			m |= VSOCK_POLLOUT; /* writable, or send fails at once (EPIPE) */
	} else if (s->state == VSOCK_SS_CLOSED) {
		m |= VSOCK_POLLOUT; /* a finished connect; send reports the error */
	}
	return m;
}

/* Per-call receive context: feed_batch defers socket events to the end of the batch. */
struct rx_ctx {
	bool batch;
	uint32_t ndef;
	struct vsock_sock *def[RX_DEFER_MAX];
};

/* Calls ops->sock_event for s with its current poll mask. s locked. */
static void sock_event_call(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;

	e->ops->sock_event(e->opaque, s, atomic_load_explicit(&s->user, memory_order_relaxed),
			   vsock_sk_poll_locked(s));
}

/* Reports a possible poll-mask change of s. Called with s locked. */
void vsock_sk_event(struct rx_ctx *cx, struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;

	if (!e->ops->sock_event)
		return;
	if (cx && cx->batch) {
		if (s->ev_deferred)
			return;
		if (cx->ndef < RX_DEFER_MAX) {
			s->ev_deferred = true;
			sock_ref(s);
			cx->def[cx->ndef++] = s;
			return;
		}
	}
	sock_event_call(s);
}

static void rx_ctx_flush(struct rx_ctx *cx)
{
	for (uint32_t i = 0; i < cx->ndef; i++) {
		struct vsock_sock *s = cx->def[i];

		sock_lock(s);
		if (s->ev_deferred) {
			s->ev_deferred = false;
			sock_event_call(s);
		}
		sock_unlock(s);
		sock_unref(s);
	}
	cx->ndef = 0;
}

/* ---- send list and pending replies ----------------------------------------------------------- */

/* A SHUTDOWN carrying SEND ends the data queued before it, so it goes after that data. */
static bool shutdown_waits(const struct vsock_sock *s)
{
	return (s->shutdown & VSOCK_SHUTDOWN_SEND) && s->tx_len > 0;
}

/* The most entries the pacing ring needs: one per VSOCK_TX_PKT_COST of the credit limit. */
static uint32_t sock_tx_ring_max(const struct vsock_sock *s)
{
	return vsock_credit_peer_cap(s->peer_buf_alloc, s->rx_limit) / VSOCK_TX_PKT_COST + 2;
}

/*
 * Drops the pacing ring's packets the peer reported consumed: their end is at or behind
 * peer_fwd_cnt (modulo 2^32, within the bytes in flight). Called whenever peer_fwd_cnt moves.
 * s locked.
 */
static void sock_tx_retire(struct vsock_sock *s)
{
	uint32_t in_flight = vsock_credit_in_flight(s->tx_cnt, s->peer_fwd_cnt);

	while (s->pk_n) {
		uint32_t ahead = s->pk_end[s->pk_head] - s->peer_fwd_cnt;

		if (ahead != 0 && ahead <= in_flight)
			break;
		s->pk_head = (s->pk_head + 1) & (s->pk_cap - 1);
		s->pk_n--;
	}
}

/*
 * Notes the RW packet just sent (its end is tx_cnt) in the pacing ring. A packet the peer has
 * already "consumed" (nothing in flight: an empty message) is not kept. When the ring is at
 * sock_tx_ring_max() or cannot grow, the packet joins the newest entry instead: memory stays
 * bounded, and only a message cut into more pieces than the credit has VSOCK_TX_PKT_COSTs is
 * counted as fewer packets. s locked.
 */
static void sock_tx_record(struct vsock_sock *s)
{
	uint32_t ncap, i, *nr;

	if (s->tx_cnt == s->peer_fwd_cnt)
		return;
	if (s->pk_n == s->pk_cap) {
		ncap = s->pk_cap ? s->pk_cap * 2 : 16;
		nr = s->pk_cap < sock_tx_ring_max(s) ? malloc(ncap * sizeof(*nr)) : NULL;
		if (!nr) {
			if (s->pk_n)
				s->pk_end[(s->pk_head + s->pk_n - 1) & (s->pk_cap - 1)] = s->tx_cnt;
			return;
		}
		for (i = 0; i < s->pk_n; i++)
			nr[i] = s->pk_end[(s->pk_head + i) & (s->pk_cap - 1)];
		free(s->pk_end);
		s->pk_end = nr;
		s->pk_cap = ncap;
		s->pk_head = 0;
	}
	s->pk_end[(s->pk_head + s->pk_n) & (s->pk_cap - 1)] = s->tx_cnt;
	s->pk_n++;
}

/*
 * Whether the next RW packet may go as far as pacing is concerned: always for STREAM and for
 * the pieces of a SEQPACKET message already started; the first piece of a message only if the
 * whole message passes vsock_credit_tx_paced() (docs/vsock-protocol.md §3). s locked.
 */
static bool sock_tx_paced(const struct vsock_sock *s)
{
	uint32_t in_flight, piece, pkts;
	const struct tx_msg *m;

	if (s->type != VSOCK_TYPE_SEQPACKET || s->msg_sent || !s->msg_n)
		return true;
	in_flight = vsock_credit_in_flight(s->tx_cnt, s->peer_fwd_cnt);
	if (in_flight == 0)
		return true; /* nothing outstanding (the ring may hold a reset connection's) */
	m = &s->msgs[s->msg_head & (s->msg_cap - 1)];
	piece = s->tx_piece ? s->tx_piece : s->e->cfg.max_pkt;
	pkts = m->len && piece ? (m->len - 1) / piece + 1 : 1;
	return vsock_credit_tx_paced(vsock_credit_peer_cap(s->peer_buf_alloc, s->rx_limit),
				     in_flight, s->pk_n, pkts, m->len);
}

static bool sock_pullable(const struct vsock_sock *s)
{
	if (s->pend & (PEND_RST | PEND_RESPONSE | PEND_REQUEST | PEND_CREDIT_UPDATE |
		       PEND_CREDIT_REQUEST))
		return true;
	if ((s->pend & PEND_SHUTDOWN) && !shutdown_waits(s))
		return true;
	return s->tx_len && sock_can_send_data(s) && sock_credit(s) > 0 && sock_tx_paced(s);
}

/*
 * Publishes tx_n + nosock_n for the lock-free "nothing to pull" check. e->tx_lock held. The
 * release pairs with the acquire in vsock_engine_pull/has_pending: a reader that sees a non-zero
 * count also sees the queue entries it counts.
 */
static void tx_pending_update(struct vsock_engine *e)
{
	atomic_store_explicit(&e->tx_pending, e->tx_n + e->nosock_n, memory_order_release);
}

/* Puts s on the send list if it has something to pull. Called with s locked. */
void vsock_sk_kick_tx(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;
	bool was_empty = false;

	if (!sock_pullable(s))
		return;
	/*
	 * Already queued: nothing to do, and no tx_lock round trip. A stale true is harmless: it
	 * means a pull popped s (storing false under tx_lock) and has not yet taken s's lock, which
	 * we hold; it will, build, and requeue s while sock_pullable() (vsock_engine_pull). If that
	 * pull had already released s's lock, the lock hand-over made its store visible here.
	 */
	if (atomic_load_explicit(&s->on_txlist, memory_order_relaxed))
		return;
	pthread_mutex_lock(&e->tx_lock);
	if (!atomic_load_explicit(&s->on_txlist, memory_order_relaxed)) {
		atomic_store_explicit(&s->on_txlist, true, memory_order_relaxed);
		s->tx_next = NULL;
		sock_ref(s);
		if (e->tx_tail)
			e->tx_tail->tx_next = s;
		else
			e->tx_head = s;
		e->tx_tail = s;
		was_empty = e->tx_n++ == 0 && e->nosock_n == 0;
		tx_pending_update(e);
	}
	pthread_mutex_unlock(&e->tx_lock);
	if (was_empty)
		s->kick = true;
}

/* Number of PEND_REPLY_MASK bits in x (no popcount call: the target may lack the insn). */
static unsigned reply_bits(unsigned x)
{
	unsigned n = 0;

	for (x &= PEND_REPLY_MASK; x; x &= x - 1)
		n++;
	return n;
}

void vsock_sk_pend_set(struct vsock_sock *s, unsigned bits)
{
	unsigned added = bits & ~s->pend;
	unsigned n = reply_bits(added);

	s->pend |= bits;
	if (n)
		atomic_fetch_add_explicit(&s->e->replies, n, memory_order_relaxed);
	vsock_sk_kick_tx(s);
}

void vsock_sk_pend_clear(struct vsock_sock *s, unsigned bits)
{
	unsigned removed = bits & s->pend;
	unsigned n = reply_bits(removed);

	s->pend &= ~bits;
	if (n)
		atomic_fetch_sub_explicit(&s->e->replies, n, memory_order_relaxed);
}

/*
 * Puts an RST that answers no socket on the engine's ring; false (counted) when it is full.
 * `held` is the socket the caller has locked, if any, so that tx_ready is deferred to its
 * unlock.
 */
static bool nosock_push(struct vsock_engine *e, const struct vsock_hdr *rst,
			struct vsock_sock *held)
{
	bool was_empty = false, queued = false;

	pthread_mutex_lock(&e->tx_lock);
	if (e->nosock_n < e->nosock_cap) {
		e->nosock[(e->nosock_head + e->nosock_n) % e->nosock_cap] = *rst;
		was_empty = e->nosock_n++ == 0 && e->tx_n == 0;
		tx_pending_update(e);
		queued = true;
	}
	pthread_mutex_unlock(&e->tx_lock);
	if (!queued) {
		STAT_INC(e, rst_dropped);
		return false;
	}
	atomic_fetch_add_explicit(&e->replies, 1, memory_order_relaxed);
	if (was_empty) {
		if (held)
			held->kick = true;
		else if (e->ops->tx_ready)
			e->ops->tx_ready(e->opaque);
	}
	return true;
}

/*
 * Queues the RST for a packet that has no socket (or a dead one): addresses swapped, same type,
 * buf_alloc = fwd_cnt = 0. Never in answer to an RST.
 */
static void queue_nosock_rst(struct vsock_engine *e, const struct vsock_hdr *in,
			     struct vsock_sock *held)
{
	struct vsock_hdr r;

	if (in->op == VSOCK_OP_RST)
		return;
	/* Source = the address the packet was sent to (CID_ANY is never a source). */
	r = (struct vsock_hdr){
		.src_cid = in->dst_cid == VMADDR_CID_ANY ? vsock_engine_local_cid(e) : in->dst_cid,
		.dst_cid = in->src_cid,
		.src_port = in->dst_port,
		.dst_port = in->src_port,
		.type = in->type,
		.op = VSOCK_OP_RST,
	};
	(void)nosock_push(e, &r, held);
}

bool vsock_sk_nosock_put(struct vsock_engine *e, const struct vsock_hdr *rst)
{
	return nosock_push(e, rst, NULL);
}

/* ---- timers: a min-heap of sockets keyed by deadline, under timer_lock ----------------------- */

static void heap_set(struct vsock_engine *e, uint32_t i, struct vsock_sock *s)
{
	e->heap[i] = s;
	s->heap_idx = (int)i;
}

static void heap_up(struct vsock_engine *e, uint32_t i)
{
	struct vsock_sock *s = e->heap[i];

	while (i > 0) {
		uint32_t p = (i - 1) / 2;

		if (e->heap[p]->deadline <= s->deadline)
			break;
		heap_set(e, i, e->heap[p]);
		i = p;
	}
	heap_set(e, i, s);
}

static void heap_down(struct vsock_engine *e, uint32_t i)
{
	struct vsock_sock *s = e->heap[i];

	for (;;) {
		uint32_t l = 2 * i + 1, m = i;
		uint64_t best = s->deadline;

		if (l < e->heap_n && e->heap[l]->deadline < best) {
			m = l;
			best = e->heap[l]->deadline;
		}
		if (l + 1 < e->heap_n && e->heap[l + 1]->deadline < best)
			m = l + 1;
		if (m == i)
			break;
		heap_set(e, i, e->heap[m]);
		i = m;
	}
	heap_set(e, i, s);
}

static void heap_remove(struct vsock_engine *e, struct vsock_sock *s)
{
	uint32_t i = (uint32_t)s->heap_idx;
	struct vsock_sock *last = e->heap[--e->heap_n];

	s->heap_idx = -1;
	if (last == s)
		return;
	heap_set(e, i, last);
	heap_up(e, i);
	heap_down(e, (uint32_t)last->heap_idx);
}

/*
 * Publishes the earliest deadline for vsock_engine_next_deadline. e->timer_lock held. The
 * release pairs with the acquire there: a transport that sees the new deadline also sees the
 * heap change behind it (what vsock_engine_run_timers will then find).
 */
static void next_deadline_update(struct vsock_engine *e)
{
	atomic_store_explicit(&e->next_deadline, e->heap_n ? e->heap[0]->deadline : UINT64_MAX,
			      memory_order_release);
}

/* Arms (or re-arms) s's single timer. Called with s locked. */
void vsock_sk_timer_arm(struct vsock_sock *s, enum sock_timer kind, uint64_t deadline)
{
	struct vsock_engine *e = s->e;
	bool first;

	s->timer = kind;
	pthread_mutex_lock(&e->timer_lock);
	if (s->heap_idx < 0) {
		/* heap_cap == max_socks and each socket holds at most one slot. */
		sock_ref(s);
		s->deadline = deadline;
		e->heap[e->heap_n] = s;
		s->heap_idx = (int)e->heap_n++;
		heap_up(e, (uint32_t)s->heap_idx);
	} else {
		s->deadline = deadline;
		heap_up(e, (uint32_t)s->heap_idx);
		heap_down(e, (uint32_t)s->heap_idx);
	}
	first = e->heap[0] == s;
	next_deadline_update(e);
	pthread_mutex_unlock(&e->timer_lock);
	if (first)
		s->kick = true; /* the deadline moved earlier: tell the transport */
}

/* Called with s locked. */
static void timer_cancel(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;
	bool armed = false;

	if (s->timer == TIMER_NONE)
		return;
	s->timer = TIMER_NONE;
	pthread_mutex_lock(&e->timer_lock);
	if (s->heap_idx >= 0) {
		heap_remove(e, s);
		next_deadline_update(e);
		armed = true;
	}
	pthread_mutex_unlock(&e->timer_lock);
	if (armed)
		sock_put_locked(s);
}

/* ---- socket lifecycle helpers ---------------------------------------------------------------- */

/* Takes s out of one table if *in says it is there, dropping that table's reference. */
static void sock_unlink(struct vsock_sock *s, bool *in,
			bool (*remove)(struct vsock_conn_table *t, struct vsock_ct_node *n),
			struct vsock_ct_node *node)
{
	if (!*in)
		return;
	remove(node == &s->bnode ? sock_bound_table(s) : s->e->ct, node);
	*in = false;
	sock_put_locked(s);
}

void vsock_sk_unlink_conn(struct vsock_sock *s)
{
	sock_unlink(s, &s->in_conn, vsock_ct_remove_connected, &s->cnode);
}

void vsock_sk_unlink_bound(struct vsock_sock *s)
{
	sock_unlink(s, &s->bound, vsock_ct_remove_bound, &s->bnode);
}

static void sock_drop_tx(struct vsock_sock *s)
{
	s->tx_len = 0;
	s->tx_head = 0;
	s->msg_n = 0;
	s->msg_head = 0;
	s->msg_sent = 0;
}

/*
 * Ends the connection locally: state CLOSED, out of the connected table, timer cancelled,
 * unsent data and pending replies dropped; with send_rst an RST carrying our credit is queued.
 * err (positive errno or 0) becomes the pending error. Called with s locked.
 */
void vsock_sk_terminate(struct rx_ctx *cx, struct vsock_sock *s, bool send_rst, int err)
{
	timer_cancel(s);
	sock_drop_tx(s);
	vsock_sk_pend_clear(s, ~0u);
	s->state = VSOCK_SS_CLOSED;
	if (err)
		s->err = err;
	vsock_sk_unlink_conn(s);
	if (send_rst)
		vsock_sk_pend_set(s, PEND_RST);
	if (s->app_closed) {
		vsock_sk_unlink_bound(s);
		vsock_rxq_free(&s->rxq);
	}
	vsock_sk_event(cx, s);
}

/* The peer broke the connection's rules: reset it (RST to the peer, err locally). */
static void sock_abort(struct rx_ctx *cx, struct vsock_sock *s, int err)
{
	s->done = true;
	s->peer_shutdown = VSOCK_SHUTDOWN_MASK;
	vsock_sk_terminate(cx, s, true, err);
}

struct vsock_sock *vsock_sk_alloc(struct vsock_engine *e, enum vsock_type type, int *err)
{
	struct vsock_sock *s;
	unsigned prev;

	/* Relaxed: socks_open is a count against max_socks; it orders nothing. */
	prev = atomic_fetch_add_explicit(&e->socks_open, 1, memory_order_relaxed);
	if (prev >= e->cfg.max_socks) {
		atomic_fetch_sub_explicit(&e->socks_open, 1, memory_order_relaxed);
		*err = -EMFILE;
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		atomic_fetch_sub_explicit(&e->socks_open, 1, memory_order_relaxed);
		*err = -ENOMEM;
		return NULL;
	}
	s->e = e;
	atomic_init(&s->refs, 1);
	s->id = atomic_fetch_add_explicit(&e->next_id, 1, memory_order_relaxed);
	mutex_init_adaptive(&s->lock);
	s->type = type;
	s->heap_idx = -1;
	s->state = VSOCK_SS_FREE;
	s->bound_cid = VMADDR_CID_ANY;
	s->local_port = VMADDR_PORT_ANY;
	s->peer_cid = VMADDR_CID_ANY;
	s->peer_port = VMADDR_PORT_ANY;
	s->buf_size = e->cfg.buf_size;
	s->buf_min = e->cfg.buf_min;
	s->buf_max = e->cfg.buf_max;
	s->connect_timeout_ns = e->cfg.connect_timeout_ns;
	s->rcvlowat = 1;
	s->buf_alloc = (uint32_t)s->buf_size;
	s->rx_limit = s->buf_alloc;
	s->rxq.no_merge = !e->merge;
	if (type == VSOCK_TYPE_DGRAM)
		vsock_dgram_sock_init(s);

	pthread_mutex_lock(&e->all_lock);
	s->all_next = e->all;
	if (e->all)
		e->all->all_prev = s;
	e->all = s;
	pthread_mutex_unlock(&e->all_lock);
	STAT_INC(e, socks_total);
	return s;
}

static void sock_free_mem(struct vsock_sock *s)
{
	vsock_rxq_free(&s->rxq);
	vsock_dgram_sock_free(s);
	free(s->txbuf);
	free(s->msgs);
	free(s->pk_end);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void vsock_sk_destroy(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;

	pthread_mutex_lock(&e->all_lock);
	if (s->all_prev)
		s->all_prev->all_next = s->all_next;
	else
		e->all = s->all_next;
	if (s->all_next)
		s->all_next->all_prev = s->all_prev;
	pthread_mutex_unlock(&e->all_lock);
	atomic_fetch_sub_explicit(&e->socks_open, 1, memory_order_relaxed);
	sock_free_mem(s);
}

/* ---- engine ---------------------------------------------------------------------------------- */

const char *vsock_state_to_string(enum vsock_state st)
{
	static const char *const names[_VSOCK_SS_MAX] = {
		[VSOCK_SS_FREE] = "FREE",		[VSOCK_SS_LISTEN] = "LISTEN",
		[VSOCK_SS_CONNECTING] = "CONNECTING",	[VSOCK_SS_PENDING] = "PENDING",
		[VSOCK_SS_CONNECTED] = "CONNECTED",	[VSOCK_SS_CLOSING] = "CLOSING",
		[VSOCK_SS_CLOSED] = "CLOSED",
	};

	if ((unsigned)st >= ARRAY_SIZE(names))
		return "unknown";
	return names[st];
}

void vsock_engine_config_default(struct vsock_engine_config *cfg)
{
	*cfg = (struct vsock_engine_config){
		.local_cid = VMADDR_CID_HOST,
		.buf_size = 256 * 1024,
		.buf_min = 128,
		.buf_max = 256 * 1024,
		.max_pkt = VSOCK_MAX_PKT_PAYLOAD,
		.connect_timeout_ns = 2000000000ull,
		.close_timeout_ns = 8000000000ull,
		.max_socks = 4096,
		.reply_limit = 128,
		.port_lo = 0,
		.port_hi = 0,
		.seqpacket = true,
		.dgram = false,
		.dgram_max = VSOCK_DGRAM_MAX,
	};
}

int vsock_engine_new(const struct vsock_engine_config *cfg, struct vsock_engine **ret)
{
	struct vsock_engine *e;
	int r;

	if (!cfg || !cfg->ops || !cfg->ops->now || cfg->max_pkt == 0 ||
	    cfg->max_pkt > VSOCK_MAX_PKT_PAYLOAD || cfg->buf_min > cfg->buf_max ||
	    cfg->max_socks == 0 || cfg->reply_limit == 0 || cfg->local_cid == VMADDR_CID_ANY ||
	    cfg->port_lo > cfg->port_hi || (cfg->port_hi != 0 && cfg->port_lo == 0))
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	if (e->cfg.buf_size < e->cfg.buf_min)
		e->cfg.buf_size = e->cfg.buf_min;
	if (e->cfg.buf_size > e->cfg.buf_max)
		e->cfg.buf_size = e->cfg.buf_max;
	if (e->cfg.connect_timeout_ns == 0)
		e->cfg.connect_timeout_ns = 2000000000ull;
	if (e->cfg.close_timeout_ns == 0)
		e->cfg.close_timeout_ns = 8000000000ull;
	e->ops = cfg->ops;
	e->opaque = cfg->opaque;
	e->credit_reduce = tune_get()->credit_reduce;
	e->rx_batch = tune_get()->rx_batch;
	e->merge = tune_get()->merge;
	atomic_init(&e->local_cid, cfg->local_cid);
	atomic_init(&e->tx_pending, 0);
	atomic_init(&e->next_id, 1);
	atomic_init(&e->next_deadline, UINT64_MAX);
	mutex_init_adaptive(&e->tx_lock);
	pthread_mutex_init(&e->timer_lock, NULL);
	pthread_mutex_init(&e->all_lock, NULL);
	e->nosock_cap = cfg->reply_limit;
	e->nosock = calloc(e->nosock_cap, sizeof(*e->nosock));
	e->heap_cap = cfg->max_socks;
	e->heap = calloc(e->heap_cap, sizeof(*e->heap));
	if (!e->nosock || !e->heap) {
		r = -ENOMEM;
		goto fail;
	}
	r = vsock_conn_table_new(cfg->max_socks, ct_ref, &e->ct);
	if (r < 0)
		goto fail;
	r = vsock_conn_table_new(cfg->max_socks, ct_ref, &e->dct);
	if (r < 0)
		goto fail;
	r = vsock_dgram_engine_init(e);
	if (r < 0)
		goto fail;
	*ret = e;
	return 0;
fail:
	vsock_engine_free(e);
	return r;
}

void vsock_engine_free(struct vsock_engine *e)
{
	struct vsock_sock *s;

	if (!e)
		return;
	vsock_dgram_engine_fini(e);
	s = e->all;
	while (s) {
		struct vsock_sock *n = s->all_next;
		sock_free_mem(s);
		s = n;
	}
	vsock_conn_table_free(e->ct);
	vsock_conn_table_free(e->dct);
	free(e->nosock);
	free(e->heap);
	pthread_mutex_destroy(&e->tx_lock);
	pthread_mutex_destroy(&e->timer_lock);
	pthread_mutex_destroy(&e->all_lock);
	free(e);
}

uint32_t vsock_engine_local_cid(const struct vsock_engine *e)
{
	return atomic_load_explicit(&((struct vsock_engine *)e)->local_cid, memory_order_relaxed);
}

bool vsock_engine_can_feed(const struct vsock_engine *e)
{
	return atomic_load_explicit(&((struct vsock_engine *)e)->replies, memory_order_relaxed) <
	       e->cfg.reply_limit;
}

void vsock_engine_get_stats(struct vsock_engine *e, struct vsock_engine_stats *ret)
{
#define STAT_COPY(name) ret->name = atomic_load_explicit(&e->st.name, memory_order_relaxed);
	VSOCK_ENGINE_STATS(STAT_COPY)
#undef STAT_COPY
	for (size_t i = 0; i < ARRAY_SIZE(ret->rx_dropped); i++)
		ret->rx_dropped[i] =
			atomic_load_explicit(&e->st.rx_dropped[i], memory_order_relaxed);
	ret->socks_open = atomic_load_explicit(&e->socks_open, memory_order_relaxed);
}

/* ---- receive path ---------------------------------------------------------------------------- */

void vsock_sk_consumed(struct vsock_sock *s, uint32_t n, bool message)
{
	s->fwd_cnt += n;
	if (s->state != VSOCK_SS_CONNECTED)
		return;
	if (message || !s->e->credit_reduce ||
	    vsock_credit_need_update(s->buf_alloc, s->fwd_cnt, s->last_fwd_cnt, s->rxq.bytes,
				     s->rcvlowat))
		vsock_sk_pend_set(s, PEND_CREDIT_UPDATE);
}

/*
 * Offers an RW payload of a STREAM socket with nothing queued to ops->deliver (engine.h).
 * Returns the bytes it took, counted as received and consumed. s locked.
 */
static uint32_t sock_rx_deliver(struct vsock_sock *s, const struct iovec *iov, int iovcnt,
				uint32_t len)
{
	struct vsock_engine *e = s->e;
	size_t took;

	if (!e->ops->deliver || s->type != VSOCK_TYPE_STREAM || s->rxq.bytes ||
	    iov_count(iovcnt) > RX_DELIVER_IOV_MAX)
		return 0;
	took = e->ops->deliver(e->opaque, s, atomic_load_explicit(&s->user, memory_order_relaxed),
			       iov, iovcnt, len);
	if (took == 0)
		return 0;
	if (took > len)
		took = len; /* a callback bug must not inflate fwd_cnt */
	s->bytes_in += took;
	STAT_ADD(e, rx_bytes, took);
	vsock_sk_consumed(s, (uint32_t)took, false);
	return (uint32_t)took;
}

/* Queues an RW payload (credit check, then rxq.c: small-payload merge, memory bound). s locked. */
static int sock_rx_rw(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h,
		      const struct iovec *iov, int iovcnt, uint32_t len)
{
	struct vsock_engine *e = s->e;
	bool seq = s->type == VSOCK_TYPE_SEQPACKET;
	bool eom = seq && (h->flags & VSOCK_SEQ_EOM);
	struct iovec rest[RX_DELIVER_IOV_MAX];
	uint32_t took;
	int r;

	if (len == 0 && !eom)
		return 0;
	if (!vsock_credit_rx_fits(s->rxq.bytes, len, s->rx_limit)) {
		STAT_INC(e, credit_violations);
		sock_abort(cx, s, ENOBUFS);
		return -ENOBUFS;
	}
	/*
	 * Linux's per-packet bound (credit.h), charged per queued message on the packet that
	 * opens one: the pieces of an open message are bounded by the credit and vsock_rxq_push.
	 * STREAM queues compact instead (rxq.c).
	 */
	if (seq && s->rxq.open_bytes == 0 && !vsock_credit_rx_pkt_fits(s->rxq.msgs, s->rx_limit)) {
		STAT_INC(e, rx_mem_resets);
		sock_abort(cx, s, ENOBUFS);
		return -ENOBUFS;
	}
	took = sock_rx_deliver(s, iov, iovcnt, len);
	if (took == len)
		return 0;
	if (took) {
		/* What the consumer refused queues; the slice fits: iovcnt is within the array. */
		iovcnt = iov_slice(iov, iov_count(iovcnt), took, len - took, rest,
				   ARRAY_SIZE(rest));
		if (iovcnt < 0) {
			sock_abort(cx, s, EPROTO);
			return -EPROTO;
		}
		iov = rest;
		len -= took;
	}
	r = vsock_rxq_push(&s->rxq, iov, iov_count(iovcnt), len, seq, eom,
			   eom && (h->flags & VSOCK_SEQ_EOR), s->rx_limit);
	if (r < 0) {
		if (r == -ENOBUFS)
			STAT_INC(e, rx_mem_resets);
		sock_abort(cx, s, -r);
		return r;
	}
	s->bytes_in += len;
	STAT_ADD(e, rx_bytes, len);
	/* The open message just reached a lowered buf_alloc: say we take the rest (credit.h). */
	if (sock_adv_buf_alloc(s) != s->buf_alloc && s->rxq.open_bytes - len < s->buf_alloc)
		vsock_sk_pend_set(s, PEND_CREDIT_UPDATE);
	vsock_sk_event(cx, s);
	return 0;
}

/*
 * A REQUEST reached a listener: create the child (docs/vsock-protocol.md §2.3, LISTEN row; Linux
 * virtio_transport_recv_listen()). s locked.
 */
static int listener_rx(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h)
{
	struct vsock_engine *e = s->e;
	struct vsock_sock *c;
	int r;

	if (h->op == VSOCK_OP_RST)
		return 0;
	if (h->op != VSOCK_OP_REQUEST) {
		STAT_INC(e, rx_unexpected);
		queue_nosock_rst(e, h, s);
		return -ECONNRESET;
	}
	if (s->acc_len > (uint32_t)s->backlog || s->app_closed) {
		STAT_INC(e, backlog_refused);
		queue_nosock_rst(e, h, s);
		return -ECONNREFUSED;
	}
	c = vsock_sk_alloc(e, s->type, &r);
	if (!c) {
		STAT_INC(e, backlog_refused);
		queue_nosock_rst(e, h, s);
		return r;
	}
	sock_lock(c);
	c->buf_size = s->buf_size;
	c->buf_min = s->buf_min;
	c->buf_max = s->buf_max;
	c->connect_timeout_ns = s->connect_timeout_ns;
	c->rcvlowat = s->rcvlowat;
	c->buf_alloc = (uint32_t)c->buf_size;
	c->rx_limit = c->buf_alloc;
	c->local_port = h->dst_port;
	c->peer_cid = (uint32_t)h->src_cid;
	c->peer_port = h->src_port;
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
	c->was_connected = true;
	c->state = s->deferred ? VSOCK_SS_PENDING : VSOCK_SS_CONNECTED;
	r = vsock_ct_insert_connected(e->ct, &c->cnode, c->peer_cid, c->peer_port, c->local_port);
	if (r < 0) {
		c->app_closed = true;
		c->state = VSOCK_SS_CLOSED;
		sock_unlock(c);
		sock_unref(c);
		STAT_INC(e, backlog_refused);
		queue_nosock_rst(e, h, s);
		return r;
	}
	sock_ref(c); /* the connected table's reference */
	c->in_conn = true;
	if (!s->deferred)
		vsock_sk_pend_set(c, PEND_RESPONSE);
	if (c->kick) {
		c->kick = false;
		s->kick = true; /* tx_ready after the listener unlocks */
	}
	pthread_mutex_unlock(&c->lock);
	/* The accept queue takes the creation reference. */
	c->acc_next = NULL;
	if (s->acc_tail)
		s->acc_tail->acc_next = c;
	else
		s->acc_head = c;
	s->acc_tail = c;
	s->acc_len++;
	vsock_sk_event(cx, s);
	return 0;
}

static int connecting_rx(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h)
{
	switch (h->op) {
	case VSOCK_OP_RESPONSE:
		timer_cancel(s);
		s->state = VSOCK_SS_CONNECTED;
		s->was_connected = true;
		s->err = 0;
		vsock_sk_kick_tx(s);
		vsock_sk_event(cx, s);
		return 0;
	case VSOCK_OP_INVALID:
		return 0;
	case VSOCK_OP_RST:
		STAT_INC(s->e, rst_received);
		vsock_sk_terminate(cx, s, false, ECONNRESET);
		return 0;
	default:
		STAT_INC(s->e, rx_unexpected);
		vsock_sk_terminate(cx, s, true, EPROTO);
		return -EPROTO;
	}
}

static int connected_rx(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h,
			const struct iovec *iov, int iovcnt, uint32_t len)
{
	switch (h->op) {
	case VSOCK_OP_RW:
		return sock_rx_rw(cx, s, h, iov, iovcnt, len);
	case VSOCK_OP_CREDIT_UPDATE:
		return 0; /* credit applied already; the writer was woken */
	case VSOCK_OP_CREDIT_REQUEST:
		vsock_sk_pend_set(s, PEND_CREDIT_UPDATE);
		return 0;
	case VSOCK_OP_SHUTDOWN:
		s->peer_shutdown |= h->flags & VSOCK_SHUTDOWN_MASK;
		if (s->peer_shutdown == VSOCK_SHUTDOWN_MASK && !s->rxq.head && !s->done) {
			s->done = true;
			vsock_sk_terminate(cx, s, true, 0);
		} else if (h->flags & VSOCK_SHUTDOWN_MASK) {
			vsock_sk_event(cx, s);
		}
		return 0;
	case VSOCK_OP_RST:
		STAT_INC(s->e, rst_received);
		s->done = true;
		s->peer_shutdown = VSOCK_SHUTDOWN_MASK;
		vsock_sk_terminate(cx, s, false, 0);
		return 0;
	default: /* REQUEST, RESPONSE, INVALID: ignored */
		STAT_INC(s->e, rx_unexpected);
		return -EINVAL;
	}
}

/* After close(): waiting for the peer's RST (or its own SHUTDOWN(3)). */
static int closing_rx(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h)
{
	switch (h->op) {
	case VSOCK_OP_RST:
		STAT_INC(s->e, rst_received);
		s->done = true;
		vsock_sk_terminate(cx, s, false, 0);
		return 0;
	case VSOCK_OP_SHUTDOWN:
		s->peer_shutdown |= h->flags & VSOCK_SHUTDOWN_MASK;
		if (s->peer_shutdown == VSOCK_SHUTDOWN_MASK) {
			s->done = true;
			vsock_sk_terminate(cx, s, true, 0);
		}
		return 0;
	case VSOCK_OP_CREDIT_UPDATE:
	case VSOCK_OP_RW: /* nobody will read it: dropped */
		return 0;
	default:
		STAT_INC(s->e, rx_unexpected);
		return -EINVAL;
	}
}

/* Dispatches one checked packet to the locked socket it was looked up for. */
static int sock_rx(struct rx_ctx *cx, struct vsock_sock *s, const struct vsock_hdr *h,
		   const struct iovec *iov, int iovcnt, uint32_t len)
{
	struct vsock_engine *e = s->e;
	uint32_t space_before, credit_before;

	if (h->type != s->type) {
		STAT_INC(e, rx_type_mismatch);
		queue_nosock_rst(e, h, s);
		return -ECONNRESET;
	}
	if (s->state == VSOCK_SS_LISTEN)
		return listener_rx(cx, s, h);
	if (s->state == VSOCK_SS_FREE || s->state == VSOCK_SS_CLOSED ||
	    s->peer_cid != (uint32_t)h->src_cid || s->peer_port != h->src_port) {
		/* Not a live connection with this peer (docs/vsock-protocol.md §2.1, step 4). */
		STAT_INC(e, rx_no_socket);
		if (h->op == VSOCK_OP_RST)
			return -ENOTCONN;
		queue_nosock_rst(e, h, s);
		return -ECONNRESET;
	}

	/* Step 5: credit from every packet (Linux virtio_transport_space_update()). */
	space_before = sock_send_space(s);
	credit_before = sock_credit(s);
	s->peer_buf_alloc = h->buf_alloc;
	s->peer_fwd_cnt = h->fwd_cnt;
	sock_tx_retire(s);
	if (s->tx_len)
		vsock_sk_kick_tx(s);
	/*
	 * Write space when send() may queue more, and with cfg.tx_window_peer also when only the
	 * peer's credit grew: send() may already have had room (bounded by our buf_alloc), while
	 * the transport paces below the credit (the device's host -> guest budget) and waits for
	 * the peer to consume.
	 */
	if ((sock_send_space(s) > space_before ||
	     (e->cfg.tx_window_peer && sock_credit(s) > credit_before)) &&
	    s->state == VSOCK_SS_CONNECTED &&
	    h->op != VSOCK_OP_RST && h->op != VSOCK_OP_SHUTDOWN)
		vsock_sk_event(cx, s); /* write space */

	switch (s->state) {
	case VSOCK_SS_CONNECTING:
		return connecting_rx(cx, s, h);
	case VSOCK_SS_CONNECTED:
		return connected_rx(cx, s, h, iov, iovcnt, len);
	case VSOCK_SS_CLOSING:
		return closing_rx(cx, s, h);
	case VSOCK_SS_PENDING:
		if (h->op == VSOCK_OP_RST) {
			STAT_INC(e, rst_received);
			s->done = true;
			vsock_sk_terminate(cx, s, false, ECONNRESET);
			return 0;
		}
		STAT_INC(e, rx_unexpected);
		return -EINVAL;
	default:
		return -EINVAL;
	}
}

static struct vsock_sock *rx_lookup(struct vsock_engine *e, const struct vsock_hdr *h)
{
	struct vsock_ct_node *n;
	struct vsock_sock *s = NULL;

	n = vsock_ct_lookup_connected(e->ct, (uint32_t)h->src_cid, h->src_port, h->dst_port);
	if (n)
		return container_of(n, struct vsock_sock, cnode);
	n = vsock_ct_lookup_bound(e->ct, (uint32_t)h->dst_cid, h->dst_port);
	if (n)
		return container_of(n, struct vsock_sock, bnode);
	if (h->op == VSOCK_OP_REQUEST) {
		pthread_mutex_lock(&e->all_lock);
		s = e->wildcard[h->type];
		if (s)
			sock_ref(s);
		pthread_mutex_unlock(&e->all_lock);
	}
	return s;
}

static void held_release(struct vsock_sock **held)
{
	if (*held) {
		sock_unlock(*held);
		sock_unref(*held);
		*held = NULL;
	}
}

/*
 * One packet. *held is the socket (locked, referenced) the previous packet of a batch went to;
 * it is reused when this packet belongs to the same connected flow, else released.
 */
static int rx_packet(struct vsock_engine *e, struct rx_ctx *cx, struct vsock_sock **held,
		     const struct vsock_hdr *h, const struct iovec *iov, int iovcnt)
{
	size_t len = iov_total(iov, iov_count(iovcnt));
	enum vsock_hdr_error herr;
	struct vsock_sock *s = *held;

	STAT_INC(e, rx_pkts);
	if (h->type == VSOCK_TYPE_DGRAM) {
		held_release(held); /* no socket lock may be held across the datagram's */
		return vsock_dgram_rx(e, cx, h, iov, iovcnt, len);
	}
	herr = vsock_hdr_check(h, len);
	if (herr != VSOCK_HDR_OK) {
		STAT_INC(e, rx_dropped[herr]);
		if (herr == VSOCK_HDR_BAD_TYPE)
			queue_nosock_rst(e, h, s);
		return -EPROTO;
	}
	if (s && !(s->in_conn && s->peer_cid == (uint32_t)h->src_cid &&
		   s->peer_port == h->src_port && s->local_port == h->dst_port))
		held_release(held);
	s = *held;
	if (!s) {
		s = rx_lookup(e, h);
		if (!s) {
			STAT_INC(e, rx_no_socket);
			if (h->op == VSOCK_OP_RST)
				return -ENOTCONN;
			queue_nosock_rst(e, h, NULL);
			return -ECONNRESET;
		}
		sock_lock(s);
		*held = s;
	}
	return sock_rx(cx, s, h, iov, iovcnt, (uint32_t)len);
}

int vsock_engine_feed(struct vsock_engine *e, const struct vsock_hdr *h, const struct iovec *iov,
		      int iovcnt)
{
	struct vsock_sock *held = NULL;
	struct rx_ctx cx;
	int r;

	/* Not `= {...}`: that would zero def[], 512 bytes, on every packet. */
	cx.batch = false;
	cx.ndef = 0;
	r = rx_packet(e, &cx, &held, h, iov, iovcnt);
	held_release(&held);
	return r;
}

void vsock_engine_feed_batch(struct vsock_engine *e, const struct vsock_pkt_ref *pkts, size_t n)
{
	struct rx_ctx ctx, *cx = &ctx;
	struct vsock_sock *held = NULL;
	uint32_t run = 0;

	ctx.batch = true;
	ctx.ndef = 0;
	for (size_t i = 0; i < n; i++) {
		struct vsock_sock *prev = held;

		if (held && (++run >= BATCH_RUN_MAX || !e->rx_batch)) {
			held_release(&held); /* bound the lock hold */
			run = 0;
		}
		(void)rx_packet(e, cx, &held, &pkts[i].hdr, pkts[i].iov, pkts[i].iovcnt);
		if (held != prev)
			run = 0;
	}
	held_release(&held);
	rx_ctx_flush(cx);
}

/* ---- send path ------------------------------------------------------------------------------- */

static void tx_ring_read(struct vsock_sock *s, struct iov_cur *cur, uint32_t n)
{
	uint32_t first = MIN(n, s->tx_cap - s->tx_head);

	iov_cur_write(cur, s->txbuf + s->tx_head, first);
	if (n > first)
		iov_cur_write(cur, s->txbuf, n - first);
	s->tx_head = (s->tx_head + n) & (s->tx_cap - 1);
	s->tx_len -= n;
}

void vsock_sk_hdr_init(const struct vsock_sock *s, struct vsock_hdr *h)
{
	*h = (struct vsock_hdr){
		.src_cid = vsock_engine_local_cid(s->e),
		.dst_cid = s->peer_cid,
		.src_port = s->local_port,
		.dst_port = s->peer_port,
		.type = (uint16_t)s->type,
	};
}

void vsock_sk_hdr_finish(struct vsock_sock *s, struct vsock_hdr *h, uint32_t len)
{
	h->len = len;
	/* Every packet carries our credit, so it also answers any pending CREDIT_UPDATE. */
	h->buf_alloc = sock_adv_buf_alloc(s);
	h->fwd_cnt = s->fwd_cnt;
	s->last_fwd_cnt = s->fwd_cnt;
	vsock_sk_pend_clear(s, PEND_CREDIT_UPDATE);
	STAT_INC(s->e, tx_pkts);
	STAT_ADD(s->e, tx_bytes, len);
}

/* Builds the next packet of s into h/iov. s locked. Returns payload length or -EAGAIN. */
static ssize_t sock_build(struct vsock_sock *s, struct vsock_hdr *h, const struct iovec *iov,
			  int iovcnt, size_t max_payload)
{
	struct vsock_engine *e = s->e;
	uint32_t len = 0;

	vsock_sk_hdr_init(s, h);
	if (s->pend & PEND_RST) {
		h->op = VSOCK_OP_RST;
		vsock_sk_pend_clear(s, ~0u);
		sock_drop_tx(s);
		STAT_INC(e, rst_sent);
	} else if (s->pend & PEND_RESPONSE) {
		h->op = VSOCK_OP_RESPONSE;
		vsock_sk_pend_clear(s, PEND_RESPONSE);
	} else if (s->pend & PEND_REQUEST) {
		h->op = VSOCK_OP_REQUEST;
		vsock_sk_pend_clear(s, PEND_REQUEST);
		s->request_sent = true;
	} else if ((s->pend & PEND_SHUTDOWN) && !shutdown_waits(s)) {
		h->op = VSOCK_OP_SHUTDOWN;
		h->flags = s->shutdown;
		s->shutdown_sent = s->shutdown;
		vsock_sk_pend_clear(s, PEND_SHUTDOWN);
	} else if (s->tx_len && sock_can_send_data(s) && sock_credit(s) > 0 && max_payload > 0 &&
		   sock_tx_paced(s)) {
		struct iov_cur cur;
		uint64_t n = MIN((uint64_t)max_payload, (uint64_t)e->cfg.max_pkt);

		n = MIN(n, (uint64_t)sock_credit(s));
		n = MIN(n, (uint64_t)iov_total(iov, iov_count(iovcnt)));
		if (s->type == VSOCK_TYPE_SEQPACKET) {
			struct tx_msg *m = &s->msgs[s->msg_head & (s->msg_cap - 1)];

			s->tx_piece = (uint32_t)MIN((uint64_t)max_payload,
						    (uint64_t)e->cfg.max_pkt);
			n = MIN(n, (uint64_t)(m->len - s->msg_sent));
			if (n == 0)
				return -EAGAIN;
			s->msg_sent += (uint32_t)n;
			if (s->msg_sent == m->len) {
				/* EOM (and EOR) only on the piece that ends the message. */
				h->flags = VSOCK_SEQ_EOM | (m->eor ? VSOCK_SEQ_EOR : 0);
				s->msg_head++;
				s->msg_n--;
				s->msg_sent = 0;
			}
		} else {
			n = MIN(n, (uint64_t)s->tx_len);
			if (n == 0)
				return -EAGAIN;
		}
		uint32_t space = sock_send_space(s);

		len = (uint32_t)n;
		iov_cur_init(&cur, iov, iov_count(iovcnt));
		tx_ring_read(s, &cur, len);
		h->op = VSOCK_OP_RW;
		s->tx_cnt += len;
		s->bytes_out += len;
		if (s->type == VSOCK_TYPE_SEQPACKET)
			sock_tx_record(s);
		else if (e->ops->tx_sent)
			e->ops->tx_sent(e->opaque, s,
					atomic_load_explicit(&s->user, memory_order_relaxed), len,
					s->tx_cnt);
		/* With cfg.tx_window_peer what we queue, not only the credit, can bound send():
		 * pulling it makes room (write space). */
		if (sock_send_space(s) > space)
			vsock_sk_event(NULL, s);
	} else if (s->pend & PEND_CREDIT_REQUEST) {
		h->op = VSOCK_OP_CREDIT_REQUEST;
		vsock_sk_pend_clear(s, PEND_CREDIT_REQUEST);
		STAT_INC(e, credit_requests_sent);
	} else if (s->pend & PEND_CREDIT_UPDATE) {
		h->op = VSOCK_OP_CREDIT_UPDATE;
		STAT_INC(e, credit_updates_sent);
	} else {
		return -EAGAIN;
	}
	vsock_sk_hdr_finish(s, h, len);
	return len;
}

/* vsock_engine_pull with something queued (kept out of line: the empty case stays cheap). */
static __attribute__((noinline)) ssize_t pull_locked(struct vsock_engine *e, struct vsock_hdr *h,
						     const struct iovec *iov, int iovcnt,
						     size_t max_payload)
{
	uint32_t budget;

	pthread_mutex_lock(&e->tx_lock);
	if (e->nosock_n) {
		*h = e->nosock[e->nosock_head];
		e->nosock_head = (e->nosock_head + 1) % e->nosock_cap;
		e->nosock_n--;
		tx_pending_update(e);
		pthread_mutex_unlock(&e->tx_lock);
		atomic_fetch_sub_explicit(&e->replies, 1, memory_order_relaxed);
		STAT_INC(e, rst_sent);
		STAT_INC(e, tx_pkts);
		return 0;
	}
	budget = e->tx_n;
	while (budget-- > 0 && e->tx_head) {
		struct vsock_sock *s = e->tx_head;
		bool requeued = false;
		ssize_t r;

		/* Pop; the list's reference is now ours. */
		e->tx_head = s->tx_next;
		if (!e->tx_head)
			e->tx_tail = NULL;
		atomic_store_explicit(&s->on_txlist, false, memory_order_relaxed);
		e->tx_n--;
		tx_pending_update(e);
		pthread_mutex_unlock(&e->tx_lock);

		sock_lock(s);
		r = sock_build(s, h, iov, iovcnt, max_payload);
		if (sock_pullable(s)) {
			/* Round robin: back to the tail, handing our reference to the list. */
			pthread_mutex_lock(&e->tx_lock);
			if (!atomic_load_explicit(&s->on_txlist, memory_order_relaxed)) {
				atomic_store_explicit(&s->on_txlist, true, memory_order_relaxed);
				s->tx_next = NULL;
				if (e->tx_tail)
					e->tx_tail->tx_next = s;
				else
					e->tx_head = s;
				e->tx_tail = s;
				e->tx_n++;
				tx_pending_update(e);
				requeued = true;
			}
			pthread_mutex_unlock(&e->tx_lock);
		}
		s->kick = false; /* we are the puller: no need to wake ourselves */
		sock_unlock(s);
		if (!requeued)
			sock_unref(s);
		if (r >= 0)
			return r;
		pthread_mutex_lock(&e->tx_lock);
	}
	pthread_mutex_unlock(&e->tx_lock);
	return -EAGAIN;
}

ssize_t vsock_engine_pull(struct vsock_engine *e, struct vsock_hdr *h, const struct iovec *iov,
			  int iovcnt, size_t max_payload)
{
	/*
	 * Nothing queued: answer without the lock (a transport's last pull of every burst). A
	 * packet queued concurrently may be missed, as it could be by a pull that took the lock
	 * just before; its producer calls ops->tx_ready after queueing it, so it is not lost. The
	 * acquire pairs with the release in tx_pending_update: a count read as non-zero comes with
	 * the list it counts (we then take the lock anyway). Datagrams (dgram.c) take every other
	 * turn when both kinds wait, and the rest of the time when no stream packet does.
	 */
	bool streams = atomic_load_explicit(&e->tx_pending, memory_order_acquire) != 0;
	ssize_t r;

	if (vsock_dgram_pending(e)) {
		r = vsock_dgram_pull(e, h, iov, iovcnt, max_payload, streams);
		if (r != -EAGAIN)
			return r;
	}
	if (!streams)
		return -EAGAIN;
	r = pull_locked(e, h, iov, iovcnt, max_payload);
	if (r == -EAGAIN && vsock_dgram_pending(e))
		r = vsock_dgram_pull(e, h, iov, iovcnt, max_payload, false);
	return r;
}

bool vsock_engine_has_pending(struct vsock_engine *e)
{
	bool r;

	if (vsock_dgram_pending(e))
		return true;
	if (atomic_load_explicit(&e->tx_pending, memory_order_acquire) == 0)
		return false; /* as in vsock_engine_pull */
	pthread_mutex_lock(&e->tx_lock);
	r = e->nosock_n > 0 || e->tx_head != NULL;
	pthread_mutex_unlock(&e->tx_lock);
	return r;
}

/* ---- timers ---------------------------------------------------------------------------------- */

static void sock_timer_fire(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;
	enum sock_timer kind = s->timer;

	s->timer = TIMER_NONE;
	if (kind == TIMER_CONNECT && s->state == VSOCK_SS_CONNECTING) {
		bool sent = s->request_sent;

		STAT_INC(e, connects_timed_out);
		/* A REQUEST still queued is cancelled; one already sent is cancelled with RST. */
		vsock_sk_terminate(NULL, s, sent, ETIMEDOUT);
	} else if (kind == TIMER_CLOSE && s->state == VSOCK_SS_CLOSING) {
		STAT_INC(e, close_timeouts);
		s->done = true;
		vsock_sk_terminate(NULL, s, true, 0);
	}
}

void vsock_engine_run_timers(struct vsock_engine *e)
{
	uint64_t now = now_ns(e);

	for (;;) {
		struct vsock_sock *s;
		bool rearmed;

		pthread_mutex_lock(&e->timer_lock);
		if (e->heap_n == 0 || e->heap[0]->deadline > now) {
			pthread_mutex_unlock(&e->timer_lock);
			break;
		}
		s = e->heap[0];
		heap_remove(e, s); /* the heap's reference is now ours */
		next_deadline_update(e);
		pthread_mutex_unlock(&e->timer_lock);

		sock_lock(s);
		pthread_mutex_lock(&e->timer_lock);
		rearmed = s->heap_idx >= 0;
		pthread_mutex_unlock(&e->timer_lock);
		if (!rearmed && s->timer != TIMER_NONE)
			sock_timer_fire(s);
		sock_unlock(s);
		sock_unref(s);
	}
}

uint64_t vsock_engine_next_deadline(struct vsock_engine *e)
{
	/* Stored under timer_lock at every heap change; acquire: see next_deadline_update. */
	return atomic_load_explicit(&e->next_deadline, memory_order_acquire);
}

/* ---- whole-engine operations ----------------------------------------------------------------- */

ssize_t vsock_sk_collect(struct vsock_engine *e, struct vsock_sock ***ret)
{
	struct vsock_sock **v;
	size_t n = 0, i = 0;

	pthread_mutex_lock(&e->all_lock);
	for (struct vsock_sock *s = e->all; s; s = s->all_next)
		n++;
	v = malloc((n ? n : 1) * sizeof(*v));
	if (!v) {
		pthread_mutex_unlock(&e->all_lock);
		return -ENOMEM;
	}
	for (struct vsock_sock *s = e->all; s; s = s->all_next) {
		/*
		 * A socket whose last reference is being dropped right now is skipped. Relaxed, as
		 * sock_ref: all_lock keeps s allocated (vsock_sk_destroy unlinks it under all_lock
		 * before freeing), and the reference we take orders nothing by itself.
		 */
		unsigned r = atomic_load_explicit(&s->refs, memory_order_relaxed);

		while (r && !atomic_compare_exchange_weak_explicit(&s->refs, &r, r + 1,
								   memory_order_relaxed,
								   memory_order_relaxed))
			;
		if (r)
			v[i++] = s;
	}
	pthread_mutex_unlock(&e->all_lock);
	*ret = v;
	return (ssize_t)i;
}

void vsock_engine_transport_reset(struct vsock_engine *e, uint32_t new_cid)
{
	struct vsock_sock **v;
	ssize_t n = vsock_sk_collect(e, &v);

	pthread_mutex_lock(&e->tx_lock);
	atomic_fetch_sub_explicit(&e->replies, e->nosock_n, memory_order_relaxed);
	e->nosock_n = 0;
	tx_pending_update(e);
	pthread_mutex_unlock(&e->tx_lock);
	if (new_cid != VMADDR_CID_ANY)
		atomic_store_explicit(&e->local_cid, new_cid, memory_order_relaxed);
	for (ssize_t i = 0; i < n; i++) {
		struct vsock_sock *s = v[i];

		sock_lock(s);
		switch (s->state) {
		case VSOCK_SS_CONNECTING:
		case VSOCK_SS_PENDING:
		case VSOCK_SS_CONNECTED:
		case VSOCK_SS_CLOSING:
			s->done = s->state != VSOCK_SS_CONNECTING;
			s->peer_shutdown = VSOCK_SHUTDOWN_MASK;
			vsock_sk_terminate(NULL, s, false, ECONNRESET);
			break;
		case VSOCK_SS_CLOSED:
			/*
			 * Closed by the peer (RST, SHUTDOWN) but still held by the application: Linux
			 * keeps such a socket in vsock_connected_table until it is released, so
			 * virtio_vsock_reset_sock() reaches it too and sets ECONNRESET, whatever
			 * came first on RX.
			 */
			vsock_sk_pend_clear(s, ~0u);
			if (s->was_connected && !s->app_closed) {
				s->err = ECONNRESET;
				vsock_sk_event(NULL, s);
			}
			break;
		default:
			vsock_sk_pend_clear(s, ~0u);
			break;
		}
		sock_unlock(s);
		sock_unref(s);
	}
	if (n >= 0)
		free(v);
}

void vsock_engine_foreach_sock(struct vsock_engine *e,
			       void (*fn)(void *arg, const struct vsock_sock_info *info), void *arg)
{
	struct vsock_sock **v;
	ssize_t n = vsock_sk_collect(e, &v);

	for (ssize_t i = 0; i < n; i++) {
		struct vsock_sock_info info;

		vsock_sock_get_info(v[i], &info);
		fn(arg, &info);
		sock_unref(v[i]);
	}
	if (n >= 0)
		free(v);
}
