/* SPDX-License-Identifier: MIT */
/*
 * Private structures of the vsock engine, shared by engine.c (dispatch, state machine, pull,
 * timers) and sock.c (the socket calls): struct vsock_sock and struct vsock_engine, the lock
 * order, the small inline helpers both use, and the vsock_sk_* functions engine.c provides to
 * sock.c. Nothing outside src/vsock includes this.
 *
 * Locks, in the only order they may nest:
 *   listener socket lock  ->  child socket lock  ->  { tx_lock, timer_lock, all_lock,
 *                                                      conn table bucket locks }
 * The four on the right are leaves: nothing is taken while holding one of them. Code that holds
 * a leaf lock and needs a socket lock drops the leaf first (taking a reference). The datagram
 * send queue's pop_lock (dgram.c) is a leaf too, taken only by pullers with no socket lock held.
 */
#ifndef UVSOCK_VSOCK_ENGINE_INTERNAL_H
#define UVSOCK_VSOCK_ENGINE_INTERNAL_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>

#include "vsock/conn_table.h"
#include "vsock/credit.h"
#include "vsock/engine.h"
#include "vsock/rxq.h"

/* Pending-reply bits, in the order pull hands them out. RW data is not a bit ("tx_len > 0"); it
 * goes after SHUTDOWN, except that a SHUTDOWN with the SEND flag waits for the data queued
 * before it. CREDIT_REQUEST and CREDIT_UPDATE come last. */
enum {
	PEND_RST = 1u << 0,
	PEND_RESPONSE = 1u << 1,
	PEND_REQUEST = 1u << 2,
	PEND_SHUTDOWN = 1u << 3,
	PEND_CREDIT_UPDATE = 1u << 4,
	PEND_CREDIT_REQUEST = 1u << 5,
};
/*
 * Bits counted against reply_limit: RESPONSE and RST, the packets Linux marks as replies
 * (virtio_transport_send_response, virtio_transport_reset). Credit updates are not replies there
 * and must not be here: each side's reads queue them on their own, and counting them let two
 * busy peers both sit at the limit, each waiting for the other to drain (a deadlock seen with
 * 1000 connections through uvsockd). They are bounded anyway: one bit per socket.
 */
#define PEND_REPLY_MASK (PEND_RST | PEND_RESPONSE)

enum sock_timer { TIMER_NONE, TIMER_CONNECT, TIMER_CLOSE };

/* A queued outgoing SEQPACKET message boundary. */
struct tx_msg {
	uint32_t len;
	uint32_t eor;
};

/*
 * One datagram (dgram.c): on the engine's send queue (next is the lock-free queue's link, s the
 * sending socket, referenced until the packet is pulled) or on a socket's receive queue (next
 * under that socket's lock; s NULL). The payload follows.
 */
struct dgram_pkt {
	_Atomic(struct dgram_pkt *) next;
	struct vsock_sock *s;
	uint32_t cid, port;       /* send queue: destination; receive queue: source */
	uint32_t src_port;        /* send queue: the sender's port */
	uint32_t len;
	uint32_t cls;             /* its buffer pool class (dgram.c), DG_POOL_NONE if malloc'd */
	uint8_t data[];
};

/*
 * A cache of datagram buffers of one size class (dgram.c "Buffers"): a stack that any thread
 * pushes on with a compare-and-swap and that one thread at a time pops from, holding pop_mu
 * (taken only with trylock: a busy pool means malloc, never a wait).
 */
#define DG_POOL_CLASSES 5
/* The range of a datagram socket's SO_RCVBUF / SO_SNDBUF (vsock_dgram_set_buf). */
#define DG_BUF_MIN 4096u
#define DG_BUF_MAX (64u * 1024u * 1024u)
#define DG_POOL_NONE UINT32_MAX
struct dgram_pool {
	_Atomic(struct dgram_pkt *) top;
	atomic_uint n;                  /* buffers on the stack (a hint, not exact) */
	pthread_mutex_t pop_mu;
};

/*
 * The engine's datagram send queue (dgram.c): an intrusive multi-producer single-consumer list
 * (one atomic exchange per push). Producers touch only head; tail and stub belong to the
 * consumer, which holds pop_lock (taken by pullers only, never by a sender).
 */
struct dgram_queue {
	_Atomic(struct dgram_pkt *) head;
	char pad_[64 - sizeof(void *)]; /* producers' line apart from the consumer's */
	struct dgram_pkt *tail;         /* Protected by pop_lock */
	struct dgram_pkt stub;
	pthread_mutex_t pop_lock;
	atomic_uint n;                  /* datagrams pushed and not yet popped */
	atomic_bool stalled;            /* a pop found a push half done (see dgram.c) */
	bool turn;                      /* Protected by pop_lock: pull alternates with streams */
};

struct vsock_sock {
	struct vsock_engine *e;
	atomic_uint refs;
	uint64_t id;          /* vsock_sock_id(): set at creation (or restore), then read-only */
	pthread_mutex_t lock;
	enum vsock_type type; /* set at creation, then read-only */

	/* Protected by e->all_lock */
	struct vsock_sock *all_prev, *all_next;

	/* Protected by e->tx_lock. on_txlist is written under tx_lock only, but also read under
	 * this socket's lock alone (vsock_sk_kick_tx's fast path), hence atomic. */
	struct vsock_sock *tx_next;
	atomic_bool on_txlist;

	/* Protected by e->timer_lock */
	uint64_t deadline;
	int heap_idx; /* -1 when not armed */

	/* Table nodes; their links are protected by the bucket locks, the decision to
	 * insert/remove by this socket's lock. */
	struct vsock_ct_node bnode; /* bound table */
	struct vsock_ct_node cnode; /* connected table */

	/* Written under lock, read without it by vsock_sock_get_user (relaxed: a plain value). */
	_Atomic(void *) user;

	/* Everything below is protected by lock. */
	enum vsock_state state;
	enum sock_timer timer;
	bool bound, in_conn, app_closed, deferred, wildcard, was_connected, done;
	bool request_sent;   /* the REQUEST left through pull (connect cancel then needs RST) */
	bool ev_deferred;    /* a batch holds a deferred event for this socket */
	bool kick;           /* call ops->tx_ready after unlocking */
	bool save_mark;      /* save.c: queued on a listener (the caller's consistent point) */
	uint32_t bound_cid, local_port, peer_cid, peer_port;
	int err;             /* pending SO_ERROR, positive errno */
	unsigned shutdown;   /* our sticky SHUTDOWN flags */
	unsigned shutdown_sent;
	unsigned peer_shutdown;
	unsigned pend;       /* PEND_* */

	/* options */
	uint64_t buf_size, buf_min, buf_max, connect_timeout_ns;
	uint32_t rcvlowat;

	/* receive side (credit we grant) */
	uint32_t buf_alloc;     /* our buffer size (what we advertise: sock_adv_buf_alloc) */
	/* The largest buf_alloc of this connection: the credit the peer may have been given, and
	 * the own cap for pulling bytes send() already accepted (sock_credit). */
	uint32_t rx_limit;
	uint32_t fwd_cnt, last_fwd_cnt;
	struct vsock_rxq rxq;   /* received bytes not yet read */

	/* send side (credit the peer grants) */
	uint32_t peer_buf_alloc, peer_fwd_cnt, tx_cnt;
	uint8_t *txbuf;      /* ring, capacity tx_cap (power of two) */
	uint32_t tx_cap, tx_head, tx_len;
	struct tx_msg *msgs; /* SEQPACKET boundaries, ring of msg_cap (power of two) */
	uint32_t msg_cap, msg_head, msg_n, msg_sent;
	/* SEQPACKET pacing (credit.h, vsock_credit_tx_paced): the tx_cnt at the end of each RW
	 * packet the peer may still hold, oldest first, in a ring of pk_cap (a power of two, at
	 * most sock_tx_ring_max()); tx_piece: the payload room of the last pull, for the packets
	 * a message will take. */
	uint32_t *pk_end;
	uint32_t pk_cap, pk_head, pk_n, tx_piece;

	/* listener */
	int backlog;
	uint32_t acc_len;
	struct vsock_sock *acc_head, *acc_tail, *acc_next;

	uint64_t bytes_in, bytes_out;

	/*
	 * Datagram sockets (dgram.c). dg_peer and dg_local are the send path's snapshot, written
	 * under lock and read without it; dg_wmem and dg_tx_wait are shared by senders and the
	 * puller. The rest is protected by lock.
	 */
	_Atomic uint64_t dg_peer;       /* cid << 32 | port of the default peer, or DG_NONE */
	_Atomic uint64_t dg_local;      /* cid << 32 | port once bound, or DG_NONE */
	_Atomic uint64_t dg_wmem;       /* bytes of our datagrams waiting to be pulled */
	_Atomic uint64_t dg_sndbuf;
	atomic_bool dg_tx_wait;         /* someone saw the send quota full: event when it drains */
	struct dgram_pkt *dg_rx_head, *dg_rx_tail;
	uint64_t dg_rmem, dg_rcvbuf;
};

struct vsock_engine {
	struct vsock_engine_config cfg;
	const struct vsock_engine_ops *ops;
	void *opaque;
	_Atomic uint32_t local_cid;
	struct vsock_conn_table *ct;

	pthread_mutex_t tx_lock;
	struct vsock_sock *tx_head, *tx_tail; /* Protected by tx_lock */
	uint32_t tx_n;                        /* Protected by tx_lock */
	struct vsock_hdr *nosock;             /* ring of no-socket RSTs, Protected by tx_lock */
	uint32_t nosock_cap, nosock_head, nosock_n;
	/* tx_n + nosock_n, stored under tx_lock and read without it: pull and has_pending answer
	 * "nothing" without taking the lock (see vsock_engine_pull). */
	atomic_uint tx_pending;
	atomic_uint replies;                  /* queued reply packets (reply_limit) */

	pthread_mutex_t timer_lock;
	struct vsock_sock **heap; /* Protected by timer_lock */
	uint32_t heap_n, heap_cap;
	/* heap[0]'s deadline or UINT64_MAX, stored under timer_lock whenever the heap changes,
	 * read without it by vsock_engine_next_deadline (called by transports on every tx_ready). */
	_Atomic uint64_t next_deadline;

	pthread_mutex_t all_lock;
	struct vsock_sock *all; /* Protected by all_lock */
	struct vsock_sock *wildcard[3]; /* by type; Protected by all_lock */

	atomic_uint socks_open;
	_Atomic uint64_t next_id; /* the id of the next socket (vsock_sock_id) */
	/* The data-path switches of src/util/tune.h, read once at creation (constant). */
	bool credit_reduce; /* off: a credit update after every read */
	bool rx_batch;      /* off: feed_batch takes each packet's socket lock on its own */
	bool merge;         /* off: no small-payload merge in the receive queues */
	bool dg_locked;     /* datagram sends hold the socket lock (dgram.c) */
	struct vsock_conn_table *dct; /* bound datagram sockets */
	struct dgram_queue dgq;
	struct dgram_pool dgpool[DG_POOL_CLASSES];
	_Atomic uint64_t dgpool_bytes;  /* payload capacity cached in dgpool, all classes */
	/*
	 * The counters of struct vsock_engine_stats, added to from any thread with relaxed atomics
	 * (each counts on its own; nothing is ordered by them). st.socks_open is unused: the
	 * snapshot reads socks_open above.
	 */
	struct {
#define ENGINE_STAT_FIELD(name) _Atomic uint64_t name;
		VSOCK_ENGINE_STATS(ENGINE_STAT_FIELD)
#undef ENGINE_STAT_FIELD
		_Atomic uint64_t rx_dropped[_VSOCK_HDR_ERROR_MAX];
	} st;
};

#define STAT_ADD(e, field, n) atomic_fetch_add_explicit(&(e)->st.field, (n), memory_order_relaxed)
#define STAT_INC(e, field) STAT_ADD(e, field, 1)

/* ---- helpers for engine.c and sock.c -------------------------------------------------------- */

struct rx_ctx; /* engine.c: a receive call's deferred events; NULL outside the receive path */

/* engine.c: unlinks s from the engine's list and frees it; sock_unref calls it for the last. */
void vsock_sk_destroy(struct vsock_sock *s);

static inline uint64_t now_ns(struct vsock_engine *e)
{
	return e->ops->now(e->opaque);
}

/* The engine's calls count iovecs in int (as readv); a negative count means none. */
static inline size_t iov_count(int iovcnt)
{
	return iovcnt > 0 ? (size_t)iovcnt : 0;
}

static inline void sock_ref(struct vsock_sock *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

static inline void sock_unref(struct vsock_sock *s)
{
	/* acq_rel: every access made under another holder's reference happens before the free. */
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
		vsock_sk_destroy(s);
}

/* Drops a reference that is known not to be the last (the caller holds another). */
static inline void sock_put_locked(struct vsock_sock *s)
{
	/* acq_rel, as in sock_unref. */
	unsigned prev = atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel);

	assert(prev > 1);
	(void)prev;
}

static inline void sock_lock(struct vsock_sock *s)
{
	pthread_mutex_lock(&s->lock);
}

/* Unlocks, then tells the transport there is something to pull if that became true. */
static inline void sock_unlock(struct vsock_sock *s)
{
	struct vsock_engine *e = s->e;
	bool kick = s->kick;

	s->kick = false;
	pthread_mutex_unlock(&s->lock);
	if (kick && e->ops->tx_ready)
		e->ops->tx_ready(e->opaque);
}

/*
 * Lowering our buffer on a live connection (docs/vsock-protocol.md §3, "Lowering the buffer";
 * Linux applies a new SO_VM_SOCKETS_BUFFER_SIZE at once, af_vsock.c vsock_update_buffer_size()
 * -> virtio_transport_common.c virtio_transport_notify_buffer_size(), and can stall here):
 *
 * - as a sender, the lower value caps what send() accepts from then on (sock_send_space); bytes
 *   it accepted before are pulled under the largest buf_alloc of the connection (sock_credit),
 *   still within the peer's credit. Capping them by the lower value strands a SEQPACKET message
 *   that is partly sent: the receiver consumes only whole messages, so with our buf_alloc at or
 *   below the bytes in flight the credit never comes back;
 * - as a receiver, we keep advertising the larger value while the message we hold open needs it
 *   (sock_adv_buf_alloc), for the same reason seen from the other end.
 *
 * Neither costs memory beyond what the larger value already allowed: the bytes are in our send
 * ring, and the receive side accepts up to rx_limit anyway (vsock_credit_rx_fits).
 */

/*
 * The most bytes s may have in flight given our buffer own: min(peer buf_alloc, own), or the
 * peer's buf_alloc alone for a STREAM socket of an engine with cfg.tx_window_peer.
 */
static inline uint32_t sock_tx_window(const struct vsock_sock *s, uint32_t own)
{
	if (s->e->cfg.tx_window_peer && s->type == VSOCK_TYPE_STREAM)
		return s->peer_buf_alloc;
	return vsock_credit_peer_cap(s->peer_buf_alloc, own);
}

/* Credit for pulling queued bytes: sock_tx_window(rx_limit) - in flight. */
static inline uint32_t sock_credit(const struct vsock_sock *s)
{
	return vsock_credit_avail(sock_tx_window(s, s->rx_limit), UINT32_MAX, s->tx_cnt,
				  s->peer_fwd_cnt);
}

/*
 * Bytes send() (or a zero-copy send) may queue now: sock_tx_window(buf_alloc) - in flight -
 * queued, and with cfg.tx_window_peer also at most buf_alloc - queued (what we hold).
 */
static inline uint32_t sock_send_space(const struct vsock_sock *s)
{
	uint32_t c = vsock_credit_avail(sock_tx_window(s, s->buf_alloc), UINT32_MAX, s->tx_cnt,
					s->peer_fwd_cnt);

	if (c > s->buf_alloc)
		c = s->buf_alloc; /* only with tx_window_peer: the window alone is at most ours */
	return c > s->tx_len ? c - s->tx_len : 0;
}

/* The buf_alloc our packets carry. */
static inline uint32_t sock_adv_buf_alloc(const struct vsock_sock *s)
{
	return vsock_credit_adv(s->buf_alloc, s->rx_limit, s->rxq.open_bytes);
}

static inline bool sock_can_send_data(const struct vsock_sock *s)
{
	return s->state == VSOCK_SS_CONNECTED || s->state == VSOCK_SS_CLOSING;
}

/* The bound table of s's type: datagram ports are a namespace of their own. */
static inline struct vsock_conn_table *sock_bound_table(const struct vsock_sock *s)
{
	return s->type == VSOCK_TYPE_DGRAM ? s->e->dct : s->e->ct;
}

/* ---- provided by dgram.c to engine.c and sock.c ---------------------------------------------- */

/* Engine set-up and teardown of the datagram part (tables, queue). vsock_dgram_engine_init
 * returns 0 or -ENOMEM; _fini frees what is still queued (no socket is unreferenced). */
int vsock_dgram_engine_init(struct vsock_engine *e);
void vsock_dgram_engine_fini(struct vsock_engine *e);
/* A new DGRAM socket's fields; freeing its receive queue at destroy. */
void vsock_dgram_sock_init(struct vsock_sock *s);
void vsock_dgram_sock_free(struct vsock_sock *s);
/* sock_bind_locked bound s: publishes the address to the send path. s locked. */
void vsock_dgram_bound(struct vsock_sock *s);
/* Poll mask of a DGRAM socket. s locked. */
unsigned vsock_dgram_poll_locked(struct vsock_sock *s);
/* One fed DGRAM packet (type checked by the caller; nothing locked). Returns as feed. */
int vsock_dgram_rx(struct vsock_engine *e, struct rx_ctx *cx, const struct vsock_hdr *h,
		   const struct iovec *iov, int iovcnt, size_t len);
/* Datagrams wait in the send queue (a hint, no lock). */
bool vsock_dgram_pending(struct vsock_engine *e);
/*
 * vsock_engine_pull's datagram half: with `first`, only every other call (so that datagrams and
 * stream packets alternate), otherwise whenever one is queued. Returns the length or -EAGAIN.
 */
ssize_t vsock_dgram_pull(struct vsock_engine *e, struct vsock_hdr *h, const struct iovec *iov,
			 int iovcnt, size_t max_payload, bool first);
/*
 * save.c's access to the datagram queues, at a consistent point only (docs/upgrade.md: no other
 * engine call runs). vsock_dgram_foreach_tx calls fn for every queued outgoing datagram, oldest
 * first. vsock_dgram_pkt_new allocates a datagram of len bytes (payload not set) or NULL;
 * vsock_dgram_pkt_free gives one back. vsock_dgram_rx_append appends p to s's receive queue
 * (s locked; also the receive path's append, after its SO_RCVBUF check) and
 * vsock_dgram_restore_tx queues p for pull on behalf of s (taking a reference on s; the
 * caller charged s's send quota, dg_wmem); both take p and never fail: the caller checked the
 * limits. vsock_dgram_restore_tx returns true if the transport must be told (tx_ready).
 */
void vsock_dgram_foreach_tx(struct vsock_engine *e,
			    void (*fn)(void *arg, const struct dgram_pkt *p), void *arg);
struct dgram_pkt *vsock_dgram_pkt_new(struct vsock_engine *e, uint32_t len);
void vsock_dgram_pkt_free(struct vsock_engine *e, struct dgram_pkt *p);
void vsock_dgram_rx_append(struct vsock_sock *s, struct dgram_pkt *p);
bool vsock_dgram_restore_tx(struct vsock_sock *s, struct dgram_pkt *p);
/* The charge of one datagram against SO_RCVBUF / SO_SNDBUF (payload + VSOCK_DGRAM_OVERHEAD). */
static inline uint64_t vsock_dgram_cost(uint32_t len)
{
	return (uint64_t)len + VSOCK_DGRAM_OVERHEAD;
}

/*
 * sock.c: the send ring. vsock_sk_tx_reserve makes room for `need` queued bytes in all (0 or
 * -ENOMEM); vsock_sk_tx_write appends n bytes of the iov (room reserved). s locked.
 */
int vsock_sk_tx_reserve(struct vsock_sock *s, uint32_t need);
void vsock_sk_tx_write(struct vsock_sock *s, const struct iovec *iov, int iovcnt, uint32_t n);
/* engine.c: queues an RST that answers no socket (save.c restores the saved ones); false when
 * the ring is full. */
bool vsock_sk_nosock_put(struct vsock_engine *e, const struct vsock_hdr *rst);
/* sock.c: bind of a locked socket (bind(2), listen's and the datagram send's auto-bind). */
int vsock_sk_bind_locked(struct vsock_sock *s, uint32_t cid, uint32_t port);

/* ---- provided by engine.c to sock.c; all but vsock_sk_alloc are called with s locked ------ */

/*
 * A new socket with the engine's defaults, one reference held by the caller; NULL and *err set
 * to -EMFILE (max_socks) or -ENOMEM. Takes all_lock (a leaf), so any socket lock may be held.
 */
struct vsock_sock *vsock_sk_alloc(struct vsock_engine *e, enum vsock_type type, int *err);
/* Snapshot of every live socket, each referenced. Returns the count, or -ENOMEM. */
ssize_t vsock_sk_collect(struct vsock_engine *e, struct vsock_sock ***ret);
/* s's current poll mask (VSOCK_POLL*). */
unsigned vsock_sk_poll_locked(const struct vsock_sock *s);
/* Reports a possible poll-mask change of s (ops->sock_event), deferred to a batch's end by cx. */
void vsock_sk_event(struct rx_ctx *cx, struct vsock_sock *s);
/* Puts s on the send list if it has something to pull. */
void vsock_sk_kick_tx(struct vsock_sock *s);
/* Sets / clears PEND_* bits, keeping the engine's reply count; setting also kicks the send list. */
void vsock_sk_pend_set(struct vsock_sock *s, unsigned bits);
void vsock_sk_pend_clear(struct vsock_sock *s, unsigned bits);
/* Arms (or re-arms) s's single timer at deadline (ops->now() ns). */
void vsock_sk_timer_arm(struct vsock_sock *s, enum sock_timer kind, uint64_t deadline);
/* Takes s out of the connected / bound table, dropping the table's reference, if it is in it. */
void vsock_sk_unlink_conn(struct vsock_sock *s);
void vsock_sk_unlink_bound(struct vsock_sock *s);
/*
 * Ends the connection locally (state CLOSED); with send_rst an RST is queued; err (positive
 * errno or 0) becomes the pending error.
 */
void vsock_sk_terminate(struct rx_ctx *cx, struct vsock_sock *s, bool send_rst, int err);
/*
 * n received bytes were consumed (read by the application, or taken in place by ops->deliver):
 * fwd_cnt moves and a credit update is queued if the peer needs one (docs/vsock-protocol.md §3;
 * always for a whole message, and after every read with the credit-reduce switch off).
 */
void vsock_sk_consumed(struct vsock_sock *s, uint32_t n, bool message);
/* An outgoing header of s: addresses and type set, everything else 0. */
void vsock_sk_hdr_init(const struct vsock_sock *s, struct vsock_hdr *h);
/*
 * Completes an outgoing header of s with len and our credit (every packet carries it, so a
 * pending CREDIT_UPDATE is answered) and counts the packet.
 */
void vsock_sk_hdr_finish(struct vsock_sock *s, struct vsock_hdr *h, uint32_t len);

#endif
