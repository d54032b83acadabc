/* SPDX-License-Identifier: MIT */
/*
 * The engine's state, saved into and restored from a state record (src/util/rec.h; engine.h,
 * "State save and restore"; the schema is the table of docs/upgrade.md, "The engine's part").
 *
 * Save walks every socket under its lock (listeners before the children queued on them) and
 * writes what the engine needs to go on exactly where it stopped; pointers, locks, list links
 * and reference counts are never written, they are rebuilt.
 *
 * Restore runs in two phases so that a bad record changes nothing anyone can see:
 *   1. every socket is created, filled and checked, and linked into the connection tables
 *      (whose inserts are themselves checks: a tuple or port twice is refused); nothing is put
 *      on the send list, no timer is armed, no callback runs. Any error unwinds exactly this.
 *   2. (cannot fail) pending replies and queued bytes go on the send list, timers are armed,
 *      the queued datagrams and no-socket RSTs are queued, the allocators and counters are
 *      set, and the sockets the application held are handed to it.
 *
 * Security model: the record is untrusted (it was checked for integrity by rec_open(), not for
 * sense). Every value is checked against what the engine itself could have produced: states,
 * flags and bits in range, addresses consistent with the state, queued bytes within the credit
 * the socket gave (rx_limit) and the receive-memory rules, message boundaries adding up to the
 * queued bytes, at most max_socks sockets, counts within the engine's own bounds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/macros.h"
#include "util/rec.h"
#include "vsock/credit.h"
#include "vsock/engine_internal.h"

/* Engine items. */
enum {
	E_SCHEMA = 1,
	E_LOCAL_CID,
	E_NEXT_ID,
	E_PORT_CURSOR,
	E_DGRAM_CURSOR,
	E_SOCKS,     /* list of E_SOCK */
	E_NOSOCK,    /* bytes: queued no-socket RSTs, VSOCK_HDR_SIZE each, wire format */
	E_COUNTERS,  /* list of E_COUNTER */
	E_DGRAM_TX,  /* list of E_DGRAM: datagrams waiting to be pulled, oldest first */
	E_SOCK = 0x10,
	E_COUNTER,
	E_DGRAM,
};

/* Socket items (inside E_SOCK). */
enum {
	S_ID = 1, S_TYPE, S_STATE, S_FLAGS, S_BOUND_CID, S_LOCAL_PORT, S_PEER_CID, S_PEER_PORT,
	S_ERR, S_SHUTDOWN, S_PEND, S_BUF_SIZE, S_BUF_MIN, S_BUF_MAX, S_CONNECT_TIMEOUT,
	S_RCVLOWAT, S_BUF_ALLOC, S_RX_LIMIT, S_FWD_CNT, S_LAST_FWD_CNT, S_PEER_BUF_ALLOC,
	S_PEER_FWD_CNT, S_TX_CNT, S_BYTES_IN, S_BYTES_OUT, S_TIMER, S_TIMER_LEFT,
	S_RXQ,      /* list of S_CHUNK */
	S_TXQ,      /* bytes: the send ring, oldest first */
	S_TX_MSGS,  /* bytes: SEQPACKET message boundaries, (u32 len, u32 eor) each */
	S_MSG_SENT, S_PACING /* bytes: u32 each */, S_TX_PIECE, S_BACKLOG,
	S_ACCEPTQ,  /* list of E_SOCK, in accept order */
	S_DG_PEER, S_DG_SNDBUF, S_DG_RCVBUF,
	S_DG_RXQ,   /* list of E_DGRAM */
	_S_MAX,
	S_CHUNK = 0x30, /* bytes: a flags byte (CHUNK_EOM, CHUNK_EOR) then the payload */
};

/* Datagram items (inside E_DGRAM). */
enum { D_SOCK = 1, D_CID, D_PORT, D_SRC_PORT, D_DATA };
/* Counter items (inside E_COUNTER). */
enum { C_NAME = 1, C_VALUE };

enum {
	F_BOUND = 1u << 0, F_IN_CONN = 1u << 1, F_APP_CLOSED = 1u << 2, F_DEFERRED = 1u << 3,
	F_WILDCARD = 1u << 4, F_WAS_CONNECTED = 1u << 5, F_DONE = 1u << 6,
	F_REQUEST_SENT = 1u << 7,
};
#define F_ALL 0xffu
#define PEND_ALL (PEND_RST | PEND_RESPONSE | PEND_REQUEST | PEND_SHUTDOWN | PEND_CREDIT_UPDATE | \
		  PEND_CREDIT_REQUEST)
#define CHUNK_EOM 1u
#define CHUNK_EOR 2u
#define BACKLOG_MAX 4096u /* sock_listen_common's clamp */

/* The counters by name (socks_open is not one: it is counted from the sockets). */
struct counter_def {
	const char *name;
	size_t off;
};
static const struct counter_def counter_defs[] = {
#define COUNTER_DEF(n) {#n, offsetof(struct vsock_engine, st.n)},
	VSOCK_ENGINE_STATS(COUNTER_DEF)
#undef COUNTER_DEF
};

static _Atomic uint64_t *counter_at(struct vsock_engine *e, size_t off)
{
	return (_Atomic uint64_t *)((char *)e + off);
}

/* ---- save ------------------------------------------------------------------------------------ */

static void save_sock(struct rec_writer *w, struct vsock_sock *s, uint64_t now);

static uint32_t sock_flags(const struct vsock_sock *s)
{
	return (s->bound ? F_BOUND : 0) | (s->in_conn ? F_IN_CONN : 0) |
	       (s->app_closed ? F_APP_CLOSED : 0) | (s->deferred ? F_DEFERRED : 0) |
	       (s->wildcard ? F_WILDCARD : 0) | (s->was_connected ? F_WAS_CONNECTED : 0) |
	       (s->done ? F_DONE : 0) | (s->request_sent ? F_REQUEST_SENT : 0);
}

static void save_rxq(struct rec_writer *w, const struct vsock_sock *s)
{
	rec_begin(w, S_RXQ);
	for (const struct rx_chunk *c = s->rxq.head; c; c = c->next) {
		uint8_t fl = (uint8_t)((c->eom ? CHUNK_EOM : 0) | (c->eor ? CHUNK_EOR : 0));
		struct iovec iov[2] = {{&fl, 1}, {(void *)(c->data + c->start), c->end - c->start}};

		rec_put_iov(w, S_CHUNK, iov, 2);
	}
	rec_end(w);
}

static void save_tx(struct rec_writer *w, const struct vsock_sock *s)
{
	struct iovec iov[2] = {{NULL, 0}, {NULL, 0}};
	uint8_t *b;

	if (s->tx_len) {
		uint32_t first = MIN(s->tx_len, s->tx_cap - s->tx_head);

		iov[0] = (struct iovec){s->txbuf + s->tx_head, first};
		iov[1] = (struct iovec){s->txbuf, s->tx_len - first};
	}
	rec_put_iov(w, S_TXQ, iov, s->tx_len ? 2 : 0);
	if (s->type != VSOCK_TYPE_SEQPACKET)
		return;
	b = malloc((size_t)s->msg_n * 8 + (size_t)s->pk_n * 4 + 1);
	if (!b) {
		if (!w->err)
			w->err = -ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < s->msg_n; i++) {
		const struct tx_msg *m = &s->msgs[(s->msg_head + i) & (s->msg_cap - 1)];

		for (int k = 0; k < 4; k++) {
			b[8 * i + k] = (uint8_t)(m->len >> (8 * k));
			b[8 * i + 4 + k] = (uint8_t)(m->eor >> (8 * k));
		}
	}
	rec_put_bytes(w, S_TX_MSGS, b, (size_t)s->msg_n * 8);
	rec_put_u32(w, S_MSG_SENT, s->msg_sent);
	for (uint32_t i = 0; i < s->pk_n; i++) {
		uint32_t v = s->pk_end[(s->pk_head + i) & (s->pk_cap - 1)];

		for (int k = 0; k < 4; k++)
			b[4 * i + k] = (uint8_t)(v >> (8 * k));
	}
	rec_put_bytes(w, S_PACING, b, (size_t)s->pk_n * 4);
	rec_put_u32(w, S_TX_PIECE, s->tx_piece);
	free(b);
}

static void save_dgram(struct rec_writer *w, const struct dgram_pkt *p, const struct vsock_sock *s)
{
	rec_begin(w, E_DGRAM);
	if (s) {
		rec_put_u64(w, D_SOCK, s->id);
		rec_put_u32(w, D_SRC_PORT, p->src_port);
	}
	rec_put_u32(w, D_CID, p->cid);
	rec_put_u32(w, D_PORT, p->port);
	rec_put_bytes(w, D_DATA, p->data, p->len);
	rec_end(w);
}

static void save_dgram_sock(struct rec_writer *w, const struct vsock_sock *s)
{
	rec_put_u64(w, S_DG_PEER, atomic_load_explicit(&s->dg_peer, memory_order_relaxed));
	rec_put_u64(w, S_DG_SNDBUF, atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed));
	rec_put_u64(w, S_DG_RCVBUF, s->dg_rcvbuf);
	rec_begin(w, S_DG_RXQ);
	for (const struct dgram_pkt *p = s->dg_rx_head; p;
	     p = atomic_load_explicit(&p->next, memory_order_relaxed))
		save_dgram(w, p, NULL);
	rec_end(w);
}

/* One socket, s locked by the caller. */
static void save_sock_locked(struct rec_writer *w, struct vsock_sock *s, uint64_t now)
{
	struct vsock_engine *e = s->e;
	enum sock_timer kind = TIMER_NONE;
	uint64_t left = 0;

	pthread_mutex_lock(&e->timer_lock);
	if (s->heap_idx >= 0) {
		kind = s->timer;
		left = s->deadline > now ? s->deadline - now : 0;
	}
	pthread_mutex_unlock(&e->timer_lock);

	rec_begin(w, E_SOCK);
	rec_put_u64(w, S_ID, s->id);
	rec_put_u32(w, S_TYPE, s->type);
	rec_put_u32(w, S_STATE, s->state);
	rec_put_u32(w, S_FLAGS, sock_flags(s));
	rec_put_u32(w, S_BOUND_CID, s->bound_cid);
	rec_put_u32(w, S_LOCAL_PORT, s->local_port);
	rec_put_u32(w, S_PEER_CID, s->peer_cid);
	rec_put_u32(w, S_PEER_PORT, s->peer_port);
	rec_put_u32(w, S_ERR, (uint32_t)s->err);
	rec_put_u32(w, S_SHUTDOWN, s->shutdown | s->shutdown_sent << 2 | s->peer_shutdown << 4);
	rec_put_u32(w, S_PEND, s->pend);
	rec_put_u64(w, S_BUF_SIZE, s->buf_size);
	rec_put_u64(w, S_BUF_MIN, s->buf_min);
	rec_put_u64(w, S_BUF_MAX, s->buf_max);
	rec_put_u64(w, S_CONNECT_TIMEOUT, s->connect_timeout_ns);
	rec_put_u32(w, S_RCVLOWAT, s->rcvlowat);
	rec_put_u32(w, S_BUF_ALLOC, s->buf_alloc);
	rec_put_u32(w, S_RX_LIMIT, s->rx_limit);
	rec_put_u32(w, S_FWD_CNT, s->fwd_cnt);
	rec_put_u32(w, S_LAST_FWD_CNT, s->last_fwd_cnt);
	rec_put_u32(w, S_PEER_BUF_ALLOC, s->peer_buf_alloc);
	rec_put_u32(w, S_PEER_FWD_CNT, s->peer_fwd_cnt);
	rec_put_u32(w, S_TX_CNT, s->tx_cnt);
	rec_put_u64(w, S_BYTES_IN, s->bytes_in);
	rec_put_u64(w, S_BYTES_OUT, s->bytes_out);
	rec_put_u32(w, S_TIMER, kind);
	rec_put_u64(w, S_TIMER_LEFT, left);
	if (s->type == VSOCK_TYPE_DGRAM) {
		save_dgram_sock(w, s);
	} else {
		save_rxq(w, s);
		save_tx(w, s);
	}
	if (s->state == VSOCK_SS_LISTEN) {
		rec_put_u32(w, S_BACKLOG, (uint32_t)s->backlog);
		rec_begin(w, S_ACCEPTQ);
		/* Lock order: listener, then child. */
		for (struct vsock_sock *c = s->acc_head; c; c = c->acc_next)
			save_sock(w, c, now);
		rec_end(w);
	}
	rec_end(w);
}

static void save_sock(struct rec_writer *w, struct vsock_sock *s, uint64_t now)
{
	sock_lock(s);
	save_sock_locked(w, s, now);
	pthread_mutex_unlock(&s->lock); /* nothing to kick: save changes nothing */
}

struct dgram_save_ctx {
	struct rec_writer *w;
};

static void save_dgram_tx(void *arg, const struct dgram_pkt *p)
{
	struct dgram_save_ctx *cx = arg;

	save_dgram(cx->w, p, p->s);
}

static void save_nosock(struct rec_writer *w, struct vsock_engine *e)
{
	uint8_t *b;
	uint32_t n;

	pthread_mutex_lock(&e->tx_lock);
	n = e->nosock_n;
	b = malloc((size_t)n * VSOCK_HDR_SIZE + 1);
	if (b)
		for (uint32_t i = 0; i < n; i++)
			vsock_hdr_encode(&e->nosock[(e->nosock_head + i) % e->nosock_cap],
					 b + (size_t)i * VSOCK_HDR_SIZE);
	pthread_mutex_unlock(&e->tx_lock);
	if (!b) {
		if (!w->err)
			w->err = -ENOMEM;
		return;
	}
	rec_put_bytes(w, E_NOSOCK, b, (size_t)n * VSOCK_HDR_SIZE);
	free(b);
}

static void save_counter(struct rec_writer *w, const char *name, uint64_t v)
{
	rec_begin(w, E_COUNTER);
	rec_put_bytes(w, C_NAME, name, strlen(name));
	rec_put_u64(w, C_VALUE, v);
	rec_end(w);
}

static void save_counters(struct rec_writer *w, struct vsock_engine *e)
{
	rec_begin(w, E_COUNTERS);
	for (size_t i = 0; i < ARRAY_SIZE(counter_defs); i++) {
		if (strcmp(counter_defs[i].name, "socks_open") == 0)
			continue;
		save_counter(w, counter_defs[i].name,
			     atomic_load_explicit(counter_at(e, counter_defs[i].off),
						  memory_order_relaxed));
	}
	for (size_t i = 0; i < ARRAY_SIZE(e->st.rx_dropped); i++) {
		char name[32];

		snprintf(name, sizeof(name), "rx_dropped.%zu", i);
		save_counter(w, name, atomic_load_explicit(&e->st.rx_dropped[i],
							   memory_order_relaxed));
	}
	rec_end(w);
}

int vsock_engine_save(struct vsock_engine *e, struct rec_writer *w)
{
	uint64_t now = now_ns(e);
	struct dgram_save_ctx dcx = {w};
	struct vsock_sock **v;
	ssize_t n = vsock_sk_collect(e, &v);

	if (n < 0)
		return (int)n;
	rec_put_u32(w, E_SCHEMA, VSOCK_ENGINE_SAVE_SCHEMA);
	rec_put_u32(w, E_LOCAL_CID, vsock_engine_local_cid(e));
	rec_put_u64(w, E_NEXT_ID, atomic_load_explicit(&e->next_id, memory_order_relaxed));
	rec_put_u32(w, E_PORT_CURSOR, vsock_ct_port_cursor(e->ct));
	rec_put_u32(w, E_DGRAM_CURSOR, vsock_ct_port_cursor(e->dct));

	/* Children queued on a listener are written inside it, not at the top. */
	for (ssize_t i = 0; i < n; i++) {
		sock_lock(v[i]);
		if (v[i]->state == VSOCK_SS_LISTEN)
			for (struct vsock_sock *c = v[i]->acc_head; c; c = c->acc_next)
				c->save_mark = true;
		pthread_mutex_unlock(&v[i]->lock);
	}
	rec_begin(w, E_SOCKS);
	for (ssize_t i = 0; i < n; i++)
		if (!v[i]->save_mark)
			save_sock(w, v[i], now);
	rec_end(w);
	for (ssize_t i = 0; i < n; i++) {
		v[i]->save_mark = false;
		sock_unref(v[i]);
	}
	free(v);

	save_nosock(w, e);
	rec_begin(w, E_DGRAM_TX);
	vsock_dgram_foreach_tx(e, save_dgram_tx, &dcx);
	rec_end(w);
	save_counters(w, e);
	return w->err;
}

/* ---- restore: phase 1, build and check ------------------------------------------------------ */

struct restore {
	struct vsock_engine *e;
	struct rec_doc *doc;
	uint32_t local_cid;
	struct vsock_sock **socks; /* every socket created, in creation order */
	size_t n, cap;
	struct vsock_sock **by_id; /* socks sorted by id */
	uint8_t *top;              /* per socks[i]: created at the top level (not queued) */
	uint8_t *timer;            /* per socks[i]: its saved timer kind */
	uint64_t *left;            /* per socks[i]: its timer's time left */
	struct dgram_pkt *dg_tx;   /* the datagrams to queue, in order (linked by next) */
	struct dgram_pkt **dg_tail;
	struct vsock_hdr *rst;     /* the no-socket RSTs */
	uint32_t nrst;
	char where[64];
};

#define FAIL(rs, ...) rec_fail((rs)->doc, -EBADMSG, __VA_ARGS__)

static const struct rec_field sock_fields[] = {
	{S_ID, REC_U64, true, "id"},
	{S_TYPE, REC_U32, true, "type"},
	{S_STATE, REC_U32, true, "state"},
	{S_FLAGS, REC_U32, true, "flags"},
	{S_BOUND_CID, REC_U32, true, "bound_cid"},
	{S_LOCAL_PORT, REC_U32, true, "local_port"},
	{S_PEER_CID, REC_U32, true, "peer_cid"},
	{S_PEER_PORT, REC_U32, true, "peer_port"},
	{S_ERR, REC_U32, true, "err"},
	{S_SHUTDOWN, REC_U32, true, "shutdown"},
	{S_PEND, REC_U32, true, "pend"},
	{S_BUF_SIZE, REC_U64, true, "buf_size"},
	{S_BUF_MIN, REC_U64, true, "buf_min"},
	{S_BUF_MAX, REC_U64, true, "buf_max"},
	{S_CONNECT_TIMEOUT, REC_U64, true, "connect_timeout"},
	{S_RCVLOWAT, REC_U32, true, "rcvlowat"},
	{S_BUF_ALLOC, REC_U32, true, "buf_alloc"},
	{S_RX_LIMIT, REC_U32, true, "rx_limit"},
	{S_FWD_CNT, REC_U32, true, "fwd_cnt"},
	{S_LAST_FWD_CNT, REC_U32, true, "last_fwd_cnt"},
	{S_PEER_BUF_ALLOC, REC_U32, true, "peer_buf_alloc"},
	{S_PEER_FWD_CNT, REC_U32, true, "peer_fwd_cnt"},
	{S_TX_CNT, REC_U32, true, "tx_cnt"},
	{S_BYTES_IN, REC_U64, true, "bytes_in"},
	{S_BYTES_OUT, REC_U64, true, "bytes_out"},
	{S_TIMER, REC_U32, true, "timer"},
	{S_TIMER_LEFT, REC_U64, true, "timer_left"},
	{S_RXQ, REC_LIST, false, "rx_queue"},
	{S_TXQ, REC_BYTES, false, "tx_queue"},
	{S_TX_MSGS, REC_BYTES, false, "tx_msgs"},
	{S_MSG_SENT, REC_U32, false, "msg_sent"},
	{S_PACING, REC_BYTES, false, "pacing"},
	{S_TX_PIECE, REC_U32, false, "tx_piece"},
	{S_BACKLOG, REC_U32, false, "backlog"},
	{S_ACCEPTQ, REC_LIST, false, "accept_queue"},
	{S_DG_PEER, REC_U64, false, "dgram_peer"},
	{S_DG_SNDBUF, REC_U64, false, "dgram_sndbuf"},
	{S_DG_RCVBUF, REC_U64, false, "dgram_rcvbuf"},
	{S_DG_RXQ, REC_LIST, false, "dgram_rx_queue"},
};
/* vals[] of a socket are indexed by tag - 1: the table is in tag order. */
#define SV(tag) vals[(tag) - 1]
_Static_assert(ARRAY_SIZE(sock_fields) == _S_MAX - 1, "sock_fields: one per tag, in order");

static const struct rec_field dgram_fields[] = {
	{D_SOCK, REC_U64, false, "socket"},
	{D_CID, REC_U32, true, "cid"},
	{D_PORT, REC_U32, true, "port"},
	{D_SRC_PORT, REC_U32, false, "src_port"},
	{D_DATA, REC_BYTES, true, "data"},
};

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t pow2_ceil(uint32_t v, uint32_t min)
{
	uint32_t p = min;

	while (p < v)
		p <<= 1;
	return p;
}

static int track(struct restore *rs, struct vsock_sock *s, bool top)
{
	if (rs->n == rs->cap) {
		size_t ncap = rs->cap ? rs->cap * 2 : 64;
		struct vsock_sock **ns = realloc(rs->socks, ncap * sizeof(*ns));
		uint8_t *nt, *ntm;
		uint64_t *nl;

		if (!ns)
			return -ENOMEM;
		rs->socks = ns;
		nt = realloc(rs->top, ncap);
		if (!nt)
			return -ENOMEM;
		rs->top = nt;
		ntm = realloc(rs->timer, ncap);
		if (!ntm)
			return -ENOMEM;
		rs->timer = ntm;
		nl = realloc(rs->left, ncap * sizeof(*nl));
		if (!nl)
			return -ENOMEM;
		rs->left = nl;
		rs->cap = ncap;
	}
	rs->socks[rs->n] = s;
	rs->top[rs->n] = top;
	rs->timer[rs->n] = TIMER_NONE;
	rs->left[rs->n] = 0;
	rs->n++;
	return 0;
}

/* Reads one datagram item: its fields, and a packet holding its payload (the caller's). */
static int read_dgram(struct restore *rs, struct rec_reader *r, const struct rec_item *it,
		      bool tx, struct rec_val *vals, struct dgram_pkt **ret)
{
	struct vsock_engine *e = rs->e;
	struct rec_reader sub;
	struct dgram_pkt *p;
	int k;

	k = rec_enter(r, it, rs->where, &sub);
	if (k < 0)
		return k;
	k = rec_scan(&sub, dgram_fields, ARRAY_SIZE(dgram_fields), vals);
	if (k < 0)
		return k;
	if (vals[D_SOCK - 1].present != tx || vals[D_SRC_PORT - 1].present != tx)
		return FAIL(rs, "%s: a %s datagram %s socket and source port", rs->where,
			    tx ? "queued" : "received", tx ? "needs its" : "has no");
	if (vals[D_DATA - 1].it.len > e->cfg.dgram_max)
		return FAIL(rs, "%s: datagram of %u bytes, over this engine's maximum %u",
			    rs->where, vals[D_DATA - 1].it.len, e->cfg.dgram_max);
	p = vsock_dgram_pkt_new(e, vals[D_DATA - 1].it.len);
	if (!p)
		return rec_fail(rs->doc, -ENOMEM, "out of memory");
	memcpy(p->data, vals[D_DATA - 1].it.val, p->len);
	p->cid = (uint32_t)vals[D_CID - 1].u;
	p->port = (uint32_t)vals[D_PORT - 1].u;
	p->src_port = (uint32_t)vals[D_SRC_PORT - 1].u;
	*ret = p;
	return 0;
}

static int restore_dgram_sock(struct restore *rs, struct rec_reader *r, struct vsock_sock *s,
			      const struct rec_val *vals)
{
	struct rec_val dv[ARRAY_SIZE(dgram_fields)];
	struct rec_reader sub;
	struct rec_item it;
	int k;

	if (!SV(S_DG_PEER).present || !SV(S_DG_SNDBUF).present || !SV(S_DG_RCVBUF).present ||
	    !SV(S_DG_RXQ).present)
		return FAIL(rs, "%s: a datagram socket without its datagram fields", rs->where);
	if (SV(S_DG_SNDBUF).u < DG_BUF_MIN || SV(S_DG_SNDBUF).u > DG_BUF_MAX ||
	    SV(S_DG_RCVBUF).u < DG_BUF_MIN || SV(S_DG_RCVBUF).u > DG_BUF_MAX)
		return FAIL(rs, "%s: datagram buffer sizes %llu/%llu out of [%u, %u]", rs->where,
			    (unsigned long long)SV(S_DG_SNDBUF).u,
			    (unsigned long long)SV(S_DG_RCVBUF).u, DG_BUF_MIN, DG_BUF_MAX);
	atomic_store_explicit(&s->dg_peer, SV(S_DG_PEER).u, memory_order_relaxed);
	atomic_store_explicit(&s->dg_sndbuf, SV(S_DG_SNDBUF).u, memory_order_relaxed);
	s->dg_rcvbuf = SV(S_DG_RCVBUF).u;
	k = rec_enter(r, &SV(S_DG_RXQ).it, rs->where, &sub);
	if (k < 0)
		return k;
	while ((k = rec_next(&sub, &it)) > 0) {
		struct dgram_pkt *p;

		if (it.tag != E_DGRAM)
			return FAIL(rs, "%s: item 0x%x in the datagram queue", rs->where, it.tag);
		k = read_dgram(rs, &sub, &it, false, dv, &p);
		if (k < 0)
			return k;
		/* The receive rule of vsock_dgram_rx: an empty queue takes one of any size. */
		if (s->dg_rx_head && s->dg_rmem + vsock_dgram_cost(p->len) > s->dg_rcvbuf) {
			vsock_dgram_pkt_free(rs->e, p);
			return FAIL(rs, "%s: received datagrams over its SO_RCVBUF %llu", rs->where,
				    (unsigned long long)s->dg_rcvbuf);
		}
		vsock_dgram_rx_append(s, p);
	}
	return k;
}

static int restore_rxq(struct restore *rs, struct rec_reader *r, struct vsock_sock *s,
		       const struct rec_item *list)
{
	bool seq = s->type == VSOCK_TYPE_SEQPACKET;
	struct rec_reader sub;
	struct rec_item it;
	int k;

	k = rec_enter(r, list, rs->where, &sub);
	if (k < 0)
		return k;
	while ((k = rec_next(&sub, &it)) > 0) {
		struct iovec iov;
		uint32_t len;
		uint8_t fl;

		if (it.tag != S_CHUNK || it.len < 1)
			return FAIL(rs, "%s: receive queue item 0x%x of %u bytes is not a chunk",
				    rs->where, it.tag, it.len);
		fl = it.val[0];
		len = it.len - 1;
		if ((fl & ~(CHUNK_EOM | CHUNK_EOR)) || (!seq && fl) ||
		    ((fl & CHUNK_EOR) && !(fl & CHUNK_EOM)))
			return FAIL(rs, "%s: receive chunk flags 0x%x", rs->where, fl);
		if (len == 0 && !(fl & CHUNK_EOM))
			continue;
		/* The checks sock_rx_rw makes on a received payload. */
		if (!vsock_credit_rx_fits(s->rxq.bytes, len, s->rx_limit))
			return FAIL(rs, "%s: receive queue over its credit (rx_limit %u)", rs->where,
				    s->rx_limit);
		if (seq && s->rxq.open_bytes == 0 &&
		    !vsock_credit_rx_pkt_fits(s->rxq.msgs, s->rx_limit))
			return FAIL(rs, "%s: more queued messages than rx_limit %u allows",
				    rs->where, s->rx_limit);
		iov = (struct iovec){(void *)(it.val + 1), len};
		k = vsock_rxq_push(&s->rxq, &iov, 1, len, seq, fl & CHUNK_EOM, fl & CHUNK_EOR,
				   s->rx_limit);
		if (k == -ENOBUFS)
			return FAIL(rs, "%s: receive queue over its memory bound", rs->where);
		if (k < 0)
			return rec_fail(rs->doc, k, "out of memory");
	}
	return k;
}

static int restore_tx(struct restore *rs, struct vsock_sock *s, const struct rec_val *vals)
{
	uint32_t len = SV(S_TXQ).present ? SV(S_TXQ).it.len : 0;
	bool seq = s->type == VSOCK_TYPE_SEQPACKET;
	uint64_t sum = 0;
	uint32_t n, cap;

	if (len > s->rx_limit)
		return FAIL(rs, "%s: %u bytes queued to send, over rx_limit %u", rs->where, len,
			    s->rx_limit);
	if (seq != SV(S_TX_MSGS).present || seq != SV(S_MSG_SENT).present ||
	    seq != SV(S_PACING).present || seq != SV(S_TX_PIECE).present)
		return FAIL(rs, "%s: SEQPACKET send fields on a %s socket", rs->where,
			    seq ? "SEQPACKET socket without its" : "non-SEQPACKET");
	if (len) {
		struct iovec iov = {(void *)SV(S_TXQ).it.val, len};

		if (vsock_sk_tx_reserve(s, len) < 0)
			return rec_fail(rs->doc, -ENOMEM, "out of memory");
		vsock_sk_tx_write(s, &iov, 1, len);
	}
	if (!seq)
		return 0;

	/* Message boundaries: they must add up to the queued bytes plus what left of the first. */
	if (SV(S_TX_MSGS).it.len % 8)
		return FAIL(rs, "%s: tx_msgs of %u bytes", rs->where, SV(S_TX_MSGS).it.len);
	n = SV(S_TX_MSGS).it.len / 8;
	s->msg_sent = (uint32_t)SV(S_MSG_SENT).u;
	if (n) {
		cap = pow2_ceil(n, 16);
		s->msgs = malloc((size_t)cap * sizeof(*s->msgs));
		if (!s->msgs)
			return rec_fail(rs->doc, -ENOMEM, "out of memory");
		s->msg_cap = cap;
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *m = SV(S_TX_MSGS).it.val + 8 * i;

		s->msgs[i] = (struct tx_msg){le32(m), le32(m + 4)};
		if (s->msgs[i].len == 0 || s->msgs[i].eor > 1)
			return FAIL(rs, "%s: queued message %u: length %u, eor %u", rs->where, i,
				    s->msgs[i].len, s->msgs[i].eor);
		sum += s->msgs[i].len;
	}
	s->msg_n = n;
	if ((n == 0 && s->msg_sent) || (n && s->msg_sent >= s->msgs[0].len) ||
	    sum != (uint64_t)len + s->msg_sent)
		return FAIL(rs, "%s: queued messages (%llu bytes, %u of them sent) do not match the "
			    "%u bytes queued", rs->where, (unsigned long long)sum, s->msg_sent, len);

	/* Pacing ring: at most what sock_tx_record keeps. */
	if (SV(S_PACING).it.len % 4)
		return FAIL(rs, "%s: pacing of %u bytes", rs->where, SV(S_PACING).it.len);
	n = SV(S_PACING).it.len / 4;
	if (n > vsock_credit_peer_cap(s->peer_buf_alloc, s->rx_limit) / VSOCK_TX_PKT_COST + 2)
		return FAIL(rs, "%s: %u packets in the pacing ring, more than its credit allows",
			    rs->where, n);
	if (n) {
		cap = pow2_ceil(n, 16);
		s->pk_end = malloc((size_t)cap * sizeof(*s->pk_end));
		if (!s->pk_end)
			return rec_fail(rs->doc, -ENOMEM, "out of memory");
		s->pk_cap = cap;
		for (uint32_t i = 0; i < n; i++)
			s->pk_end[i] = le32(SV(S_PACING).it.val + 4 * i);
		s->pk_n = n;
	}
	s->tx_piece = (uint32_t)SV(S_TX_PIECE).u;
	return 0;
}

/* Links s into the connection tables as its flags say; the inserts refuse duplicates. */
static int restore_links(struct restore *rs, struct vsock_sock *s, uint32_t flags)
{
	struct vsock_engine *e = rs->e;
	int k;

	if (flags & F_IN_CONN) {
		k = vsock_ct_insert_connected(e->ct, &s->cnode, s->peer_cid, s->peer_port,
					      s->local_port);
		if (k < 0)
			return FAIL(rs, "%s: connection %u:%u -> port %u appears twice", rs->where,
				    s->peer_cid, s->peer_port, s->local_port);
		sock_ref(s); /* the connected table's */
		s->in_conn = true;
	}
	if (flags & F_BOUND) {
		k = vsock_ct_insert_bound(sock_bound_table(s), &s->bnode, s->bound_cid,
					  s->local_port);
		if (k < 0)
			return FAIL(rs, "%s: port %u bound twice", rs->where, s->local_port);
		sock_ref(s); /* the bound table's */
		s->bound = true;
		if (s->type == VSOCK_TYPE_DGRAM)
			vsock_dgram_bound(s);
	}
	if (flags & F_WILDCARD) {
		pthread_mutex_lock(&e->all_lock);
		k = e->wildcard[s->type] ? -EADDRINUSE : 0;
		if (k == 0)
			e->wildcard[s->type] = s;
		pthread_mutex_unlock(&e->all_lock);
		if (k < 0)
			return FAIL(rs, "%s: a second wildcard listener", rs->where);
		s->wildcard = true;
	}
	return 0;
}

/* The consistency of a socket's scalar fields: what the engine itself can produce. */
static int check_sock(struct restore *rs, const struct rec_val *vals, struct vsock_sock *listener)
{
	struct vsock_engine *e = rs->e;
	uint32_t type = (uint32_t)SV(S_TYPE).u, st = (uint32_t)SV(S_STATE).u;
	uint32_t fl = (uint32_t)SV(S_FLAGS).u, timer = (uint32_t)SV(S_TIMER).u;
	bool live = st == VSOCK_SS_CONNECTING || st == VSOCK_SS_PENDING ||
		    st == VSOCK_SS_CONNECTED || st == VSOCK_SS_CLOSING;

	if (type != VSOCK_TYPE_STREAM && type != VSOCK_TYPE_SEQPACKET && type != VSOCK_TYPE_DGRAM)
		return FAIL(rs, "%s: type %u", rs->where, type);
	if (type == VSOCK_TYPE_DGRAM && !e->cfg.dgram)
		return FAIL(rs, "%s: a datagram socket, and this engine has no datagrams",
			    rs->where);
	if (st >= _VSOCK_SS_MAX || (type == VSOCK_TYPE_DGRAM && st != VSOCK_SS_FREE))
		return FAIL(rs, "%s: state %u", rs->where, st);
	if (type == VSOCK_TYPE_SEQPACKET && !e->cfg.seqpacket && (live || st == VSOCK_SS_LISTEN))
		return FAIL(rs, "%s: a SEQPACKET connection, and this engine has no SEQPACKET",
			    rs->where);
	if ((fl & ~F_ALL) || (SV(S_SHUTDOWN).u & ~0x3fu) || (SV(S_PEND).u & ~PEND_ALL) ||
	    timer > TIMER_CLOSE || SV(S_ERR).u >= 4096)
		return FAIL(rs, "%s: flags 0x%x, shutdown 0x%llx, pend 0x%llx, timer %u, err %llu",
			    rs->where, fl, (unsigned long long)SV(S_SHUTDOWN).u,
			    (unsigned long long)SV(S_PEND).u, timer,
			    (unsigned long long)SV(S_ERR).u);
	/* close() leaves FREE (a datagram socket), CLOSING or CLOSED; only close() makes CLOSING. */
	if (!!(fl & F_APP_CLOSED) != (st == VSOCK_SS_CLOSING) &&
	    !((fl & F_APP_CLOSED) && (st == VSOCK_SS_FREE || st == VSOCK_SS_CLOSED)))
		return FAIL(rs, "%s: state %s %s closed by the application", rs->where,
			    vsock_state_to_string(st), (fl & F_APP_CLOSED) ? "yet" : "but not");
	if ((timer == TIMER_CONNECT && st != VSOCK_SS_CONNECTING) ||
	    (timer == TIMER_CLOSE && st != VSOCK_SS_CLOSING))
		return FAIL(rs, "%s: timer %u in state %s", rs->where, timer,
			    vsock_state_to_string(st));
	/* The connected table holds exactly the live connections. */
	if (!!(fl & F_IN_CONN) != live)
		return FAIL(rs, "%s: state %s %s in the connection table", rs->where,
			    vsock_state_to_string(st), live ? "but not" : "yet");
	if ((fl & F_IN_CONN) &&
	    (SV(S_PEER_CID).u == VMADDR_CID_ANY || SV(S_LOCAL_PORT).u == VMADDR_PORT_ANY))
		return FAIL(rs, "%s: a connection without both addresses", rs->where);
	if ((fl & F_BOUND) && (SV(S_LOCAL_PORT).u == VMADDR_PORT_ANY ||
			       (SV(S_BOUND_CID).u != VMADDR_CID_ANY &&
				SV(S_BOUND_CID).u != rs->local_cid)))
		return FAIL(rs, "%s: bound to %llu:%llu", rs->where,
			    (unsigned long long)SV(S_BOUND_CID).u,
			    (unsigned long long)SV(S_LOCAL_PORT).u);
	if (st == VSOCK_SS_LISTEN &&
	    (!(fl & F_BOUND) || !SV(S_BACKLOG).present || SV(S_BACKLOG).u > BACKLOG_MAX))
		return FAIL(rs, "%s: a listener unbound or without a valid backlog", rs->where);
	if (st != VSOCK_SS_LISTEN &&
	    (SV(S_ACCEPTQ).present || SV(S_BACKLOG).present || (fl & (F_DEFERRED | F_WILDCARD))))
		return FAIL(rs, "%s: listener fields on a socket in state %s", rs->where,
			    vsock_state_to_string(st));
	if ((fl & F_WILDCARD) && !(fl & F_DEFERRED))
		return FAIL(rs, "%s: a wildcard listener that is not deferred", rs->where);
	if (type == VSOCK_TYPE_DGRAM && (SV(S_RXQ).present || SV(S_TXQ).present))
		return FAIL(rs, "%s: stream queues on a datagram socket", rs->where);
	if (type != VSOCK_TYPE_DGRAM &&
	    (SV(S_DG_PEER).present || SV(S_DG_SNDBUF).present || SV(S_DG_RCVBUF).present ||
	     SV(S_DG_RXQ).present || !SV(S_RXQ).present || !SV(S_TXQ).present))
		return FAIL(rs, "%s: datagram fields on a stream socket, or its queues missing",
			    rs->where);
	if (SV(S_BUF_ALLOC).u > SV(S_RX_LIMIT).u || SV(S_RCVLOWAT).u == 0)
		return FAIL(rs, "%s: buf_alloc %llu over rx_limit %llu, or rcvlowat 0", rs->where,
			    (unsigned long long)SV(S_BUF_ALLOC).u,
			    (unsigned long long)SV(S_RX_LIMIT).u);
	if (listener) {
		/* A child waiting to be accepted: what listener_rx makes, then at most a reset. */
		if (type != listener->type ||
		    !(st == VSOCK_SS_CONNECTED || st == VSOCK_SS_CLOSED ||
		      (st == VSOCK_SS_PENDING && listener->deferred)) ||
		    (fl & (F_APP_CLOSED | F_BOUND)))
			return FAIL(rs, "%s: not a child the listener could have queued",
				    rs->where);
	}
	return 0;
}

static int restore_sock(struct restore *rs, struct rec_reader *r, const struct rec_item *item,
			struct vsock_sock *listener);

static int restore_acceptq(struct restore *rs, struct rec_reader *r, struct vsock_sock *s,
			   const struct rec_item *list)
{
	struct rec_reader sub;
	struct rec_item it;
	int k;

	k = rec_enter(r, list, "accept queue", &sub);
	if (k < 0)
		return k;
	while ((k = rec_next(&sub, &it)) > 0) {
		if (it.tag != E_SOCK)
			return FAIL(rs, "accept queue: item 0x%x", it.tag);
		if (s->acc_len > (uint32_t)s->backlog)
			return FAIL(rs, "accept queue longer than backlog %d + 1", s->backlog);
		k = restore_sock(rs, &sub, &it, s);
		if (k < 0)
			return k;
	}
	return k;
}

static int restore_sock(struct restore *rs, struct rec_reader *r, const struct rec_item *item,
			struct vsock_sock *listener)
{
	struct vsock_engine *e = rs->e;
	struct rec_val vals[ARRAY_SIZE(sock_fields)];
	struct rec_reader sub;
	struct vsock_sock *s;
	uint32_t fl, sh;
	size_t idx;
	int k, err;

	k = rec_enter(r, item, "socket", &sub);
	if (k < 0)
		return k;
	k = rec_scan(&sub, sock_fields, ARRAY_SIZE(sock_fields), vals);
	if (k < 0)
		return k;
	snprintf(rs->where, sizeof(rs->where), "socket %llu", (unsigned long long)SV(S_ID).u);
	k = check_sock(rs, vals, listener);
	if (k < 0)
		return k;

	s = vsock_sk_alloc(e, (enum vsock_type)SV(S_TYPE).u, &err);
	if (!s) {
		if (err == -EMFILE)
			return rec_fail(rs->doc, -EMFILE,
					"more sockets than this engine's max_socks (%u)",
					e->cfg.max_socks);
		return rec_fail(rs->doc, err, "out of memory");
	}
	k = track(rs, s, !listener);
	if (k < 0) {
		sock_unref(s);
		return rec_fail(rs->doc, k, "out of memory");
	}
	idx = rs->n - 1;
	fl = (uint32_t)SV(S_FLAGS).u;
	sh = (uint32_t)SV(S_SHUTDOWN).u;
	s->id = SV(S_ID).u;
	s->state = (enum vsock_state)SV(S_STATE).u;
	s->app_closed = fl & F_APP_CLOSED;
	s->deferred = fl & F_DEFERRED;
	s->was_connected = fl & F_WAS_CONNECTED;
	s->done = fl & F_DONE;
	s->request_sent = fl & F_REQUEST_SENT;
	s->bound_cid = (uint32_t)SV(S_BOUND_CID).u;
	s->local_port = (uint32_t)SV(S_LOCAL_PORT).u;
	s->peer_cid = (uint32_t)SV(S_PEER_CID).u;
	s->peer_port = (uint32_t)SV(S_PEER_PORT).u;
	s->err = (int)SV(S_ERR).u;
	s->shutdown = sh & 3;
	s->shutdown_sent = (sh >> 2) & 3;
	s->peer_shutdown = (sh >> 4) & 3;
	s->pend = (unsigned)SV(S_PEND).u; /* counted and queued in phase 2 */
	s->buf_size = SV(S_BUF_SIZE).u;
	s->buf_min = SV(S_BUF_MIN).u;
	s->buf_max = SV(S_BUF_MAX).u;
	s->connect_timeout_ns = SV(S_CONNECT_TIMEOUT).u;
	s->rcvlowat = (uint32_t)SV(S_RCVLOWAT).u;
	s->buf_alloc = (uint32_t)SV(S_BUF_ALLOC).u;
	s->rx_limit = (uint32_t)SV(S_RX_LIMIT).u;
	s->fwd_cnt = (uint32_t)SV(S_FWD_CNT).u;
	s->last_fwd_cnt = (uint32_t)SV(S_LAST_FWD_CNT).u;
	s->peer_buf_alloc = (uint32_t)SV(S_PEER_BUF_ALLOC).u;
	s->peer_fwd_cnt = (uint32_t)SV(S_PEER_FWD_CNT).u;
	s->tx_cnt = (uint32_t)SV(S_TX_CNT).u;
	s->bytes_in = SV(S_BYTES_IN).u;
	s->bytes_out = SV(S_BYTES_OUT).u;
	rs->timer[idx] = (uint8_t)SV(S_TIMER).u;
	rs->left[idx] = SV(S_TIMER_LEFT).u;

	if (s->type == VSOCK_TYPE_DGRAM) {
		k = restore_dgram_sock(rs, &sub, s, vals);
	} else {
		k = restore_rxq(rs, &sub, s, &SV(S_RXQ).it);
		if (k == 0)
			k = restore_tx(rs, s, vals);
	}
	if (k == 0)
		k = restore_links(rs, s, fl);
	if (k < 0)
		return k;
	if (s->state == VSOCK_SS_LISTEN) {
		s->backlog = (int)SV(S_BACKLOG).u;
		if (SV(S_ACCEPTQ).present) {
			k = restore_acceptq(rs, &sub, s, &SV(S_ACCEPTQ).it);
			if (k < 0)
				return k;
		}
	}
	if (listener) {
		/* The accept queue holds the creation reference, as listener_rx leaves it. */
		s->acc_next = NULL;
		if (listener->acc_tail)
			listener->acc_tail->acc_next = s;
		else
			listener->acc_head = s;
		listener->acc_tail = s;
		listener->acc_len++;
	}
	return 0;
}

static int id_cmp(const void *a, const void *b)
{
	uint64_t x = (*(struct vsock_sock *const *)a)->id, y = (*(struct vsock_sock *const *)b)->id;

	return x < y ? -1 : x > y;
}

static struct vsock_sock *find_id(struct restore *rs, uint64_t id)
{
	size_t lo = 0, hi = rs->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (rs->by_id[mid]->id == id)
			return rs->by_id[mid];
		if (rs->by_id[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int restore_ids(struct restore *rs, uint64_t next_id)
{
	rs->by_id = malloc((rs->n ? rs->n : 1) * sizeof(*rs->by_id));
	if (!rs->by_id)
		return rec_fail(rs->doc, -ENOMEM, "out of memory");
	if (rs->n)
		memcpy(rs->by_id, rs->socks, rs->n * sizeof(*rs->by_id));
	qsort(rs->by_id, rs->n, sizeof(*rs->by_id), id_cmp);
	for (size_t i = 0; i < rs->n; i++) {
		if (rs->by_id[i]->id == 0 || rs->by_id[i]->id >= next_id)
			return FAIL(rs, "socket id %llu outside [1, next id %llu)",
				    (unsigned long long)rs->by_id[i]->id,
				    (unsigned long long)next_id);
		if (i && rs->by_id[i]->id == rs->by_id[i - 1]->id)
			return FAIL(rs, "socket id %llu appears twice",
				    (unsigned long long)rs->by_id[i]->id);
	}
	return 0;
}

static int restore_dgram_tx(struct restore *rs, struct rec_reader *r, const struct rec_item *list)
{
	struct rec_val dv[ARRAY_SIZE(dgram_fields)];
	struct rec_reader sub;
	struct rec_item it;
	int k;

	snprintf(rs->where, sizeof(rs->where), "datagram send queue");
	k = rec_enter(r, list, rs->where, &sub);
	if (k < 0)
		return k;
	while ((k = rec_next(&sub, &it)) > 0) {
		struct vsock_sock *s;
		struct dgram_pkt *p;
		uint64_t lim;

		if (it.tag != E_DGRAM)
			return FAIL(rs, "%s: item 0x%x", rs->where, it.tag);
		k = read_dgram(rs, &sub, &it, true, dv, &p);
		if (k < 0)
			return k;
		/* Linked before any further check, so that a failure frees it with the rest. */
		*rs->dg_tail = p;
		rs->dg_tail = (struct dgram_pkt **)&p->next;
		s = find_id(rs, dv[D_SOCK - 1].u);
		if (!s || s->type != VSOCK_TYPE_DGRAM || !s->bound || s->local_port != p->src_port)
			return FAIL(rs, "%s: a datagram of socket %llu, which is not a datagram "
				    "socket bound to port %u", rs->where,
				    (unsigned long long)dv[D_SOCK - 1].u, p->src_port);
		/* The charge rule of dg_charge: queued only while the charge was below SO_SNDBUF. */
		lim = atomic_load_explicit(&s->dg_sndbuf, memory_order_relaxed);
		if (atomic_load_explicit(&s->dg_wmem, memory_order_relaxed) >= lim)
			return FAIL(rs, "%s: socket %llu has more queued than its SO_SNDBUF %llu",
				    rs->where, (unsigned long long)s->id, (unsigned long long)lim);
		/* Charged now (undone by the rollback's reset), so the next check sees it. */
		atomic_fetch_add_explicit(&s->dg_wmem, vsock_dgram_cost(p->len),
					  memory_order_relaxed);
		p->s = s;
	}
	return k;
}

static int restore_nosock(struct restore *rs, const struct rec_val *v)
{
	uint32_t n;

	if (!v->present)
		return 0;
	if (v->it.len % VSOCK_HDR_SIZE)
		return FAIL(rs, "no-socket RSTs: %u bytes", v->it.len);
	n = v->it.len / VSOCK_HDR_SIZE;
	if (n > rs->e->nosock_cap)
		return FAIL(rs, "%u no-socket RSTs, more than this engine queues (%u)", n,
			    rs->e->nosock_cap);
	rs->rst = malloc((n ? n : 1) * sizeof(*rs->rst));
	if (!rs->rst)
		return rec_fail(rs->doc, -ENOMEM, "out of memory");
	for (uint32_t i = 0; i < n; i++) {
		vsock_hdr_decode(v->it.val + (size_t)i * VSOCK_HDR_SIZE, &rs->rst[i]);
		if (rs->rst[i].op != VSOCK_OP_RST || rs->rst[i].len != 0)
			return FAIL(rs, "no-socket RST %u is not an RST", i);
	}
	rs->nrst = n;
	return 0;
}

static const struct rec_field counter_fields[] = {
	{C_NAME, REC_BYTES, true, "name"},
	{C_VALUE, REC_U64, true, "value"},
};

/* Reads the counters into vals (by counter_defs index, then rx_dropped); unknown names are
 * skipped (a counter is never needed to go on), duplicates refused. */
static int restore_counters(struct restore *rs, struct rec_reader *r, const struct rec_item *list,
			    uint64_t *vals, uint8_t *seen)
{
	const size_t ndefs = ARRAY_SIZE(counter_defs);
	struct rec_val cv[ARRAY_SIZE(counter_fields)];
	struct rec_reader sub, csub;
	struct rec_item it;
	int k;

	k = rec_enter(r, list, "counters", &sub);
	if (k < 0)
		return k;
	while ((k = rec_next(&sub, &it)) > 0) {
		char name[48];
		size_t len, i;

		if (it.tag != E_COUNTER)
			return FAIL(rs, "counters: item 0x%x", it.tag);
		k = rec_enter(&sub, &it, "counter", &csub);
		if (k < 0)
			return k;
		k = rec_scan(&csub, counter_fields, ARRAY_SIZE(counter_fields), cv);
		if (k < 0)
			return k;
		len = cv[0].it.len;
		if (len >= sizeof(name))
			continue;
		memcpy(name, cv[0].it.val, len);
		name[len] = '\0';
		for (i = 0; i < ndefs; i++)
			if (strcmp(name, counter_defs[i].name) == 0)
				break;
		if (i == ndefs) {
			unsigned d;
			int used = 0;

			if (sscanf(name, "rx_dropped.%u%n", &d, &used) != 1 || (size_t)used != len ||
			    d >= ARRAY_SIZE(rs->e->st.rx_dropped))
				continue;
			i = ndefs + d;
		}
		if (seen[i])
			return FAIL(rs, "counter %s appears twice", name);
		seen[i] = 1;
		vals[i] = cv[1].u;
	}
	return k;
}

/* Undoes phase 1: e is as fresh as it was. */
static void rollback(struct restore *rs, uint64_t socks_total, uint64_t next_id)
{
	struct vsock_engine *e = rs->e;
	struct dgram_pkt *p = rs->dg_tx;

	while (p) {
		struct dgram_pkt *n = atomic_load_explicit(&p->next, memory_order_relaxed);

		vsock_dgram_pkt_free(e, p);
		p = n;
	}
	for (size_t i = rs->n; i-- > 0;) {
		struct vsock_sock *s = rs->socks[i];

		sock_lock(s);
		if (s->wildcard) {
			pthread_mutex_lock(&e->all_lock);
			e->wildcard[s->type] = NULL;
			pthread_mutex_unlock(&e->all_lock);
			s->wildcard = false;
		}
		vsock_sk_unlink_conn(s);
		vsock_sk_unlink_bound(s);
		s->pend = 0; /* never counted */
		s->acc_head = s->acc_tail = NULL;
		pthread_mutex_unlock(&s->lock);
		sock_unref(s); /* the creation reference: the last */
	}
	atomic_store_explicit(&e->st.socks_total, socks_total, memory_order_relaxed);
	atomic_store_explicit(&e->next_id, next_id, memory_order_relaxed);
}

/* ---- restore: phase 2, publish ---------------------------------------------------------------- */

static void publish(struct restore *rs, const uint64_t *cvals, const uint8_t *cseen,
		    void (*adopt)(void *arg, struct vsock_sock *s), void *arg)
{
	struct vsock_engine *e = rs->e;
	const size_t ndefs = ARRAY_SIZE(counter_defs);
	uint64_t now = now_ns(e);
	struct dgram_pkt *p = rs->dg_tx;
	bool kick = false;

	for (size_t i = 0; i < rs->n; i++) {
		struct vsock_sock *s = rs->socks[i];
		unsigned pend = s->pend;

		sock_lock(s);
		s->pend = 0;
		vsock_sk_pend_set(s, pend); /* counts replies, puts s on the send list if due */
		if (rs->timer[i] != TIMER_NONE) {
			uint64_t left = rs->left[i];
			uint64_t deadline = now + left < now ? UINT64_MAX - 1 : now + left;

			vsock_sk_timer_arm(s, (enum sock_timer)rs->timer[i], deadline);
		}
		sock_unlock(s); /* tx_ready if the send list or the timers moved */
	}
	while (p) {
		struct dgram_pkt *n = atomic_load_explicit(&p->next, memory_order_relaxed);
		struct vsock_sock *s = p->s;

		kick |= vsock_dgram_restore_tx(s, p); /* charged by restore_dgram_tx */
		p = n;
	}
	rs->dg_tx = NULL;
	for (uint32_t i = 0; i < rs->nrst; i++)
		(void)vsock_sk_nosock_put(e, &rs->rst[i]); /* fits: checked against nosock_cap */
	if (kick && e->ops->tx_ready)
		e->ops->tx_ready(e->opaque);
	for (size_t i = 0; i < ndefs; i++)
		if (cseen[i])
			atomic_store_explicit(counter_at(e, counter_defs[i].off), cvals[i],
					      memory_order_relaxed);
	for (size_t i = 0; i < ARRAY_SIZE(e->st.rx_dropped); i++)
		if (cseen[ndefs + i])
			atomic_store_explicit(&e->st.rx_dropped[i], cvals[ndefs + i],
					      memory_order_relaxed);

	/* Last: the application gets its sockets back; closed ones keep only the engine's refs. */
	for (size_t i = 0; i < rs->n; i++) {
		struct vsock_sock *s = rs->socks[i];

		if (!rs->top[i])
			continue;
		if (s->app_closed)
			sock_unref(s);
		else
			adopt(arg, s);
	}
}

static const struct rec_field engine_fields[] = {
	{E_SCHEMA, REC_U32, true, "schema"},
	{E_LOCAL_CID, REC_U32, true, "local_cid"},
	{E_NEXT_ID, REC_U64, true, "next_id"},
	{E_PORT_CURSOR, REC_U32, true, "port_cursor"},
	{E_DGRAM_CURSOR, REC_U32, true, "dgram_port_cursor"},
	{E_SOCKS, REC_LIST, true, "sockets"},
	{E_NOSOCK, REC_BYTES, false, "nosock_rsts"},
	{E_COUNTERS, REC_LIST, false, "counters"},
	{E_DGRAM_TX, REC_LIST, false, "dgram_tx"},
};

_Static_assert(ARRAY_SIZE(engine_fields) == E_DGRAM_TX, "engine_fields: one per tag, in order");

static bool engine_fresh(struct vsock_engine *e)
{
	bool fresh;

	pthread_mutex_lock(&e->all_lock);
	fresh = e->all == NULL;
	pthread_mutex_unlock(&e->all_lock);
	pthread_mutex_lock(&e->tx_lock);
	fresh = fresh && e->nosock_n == 0;
	pthread_mutex_unlock(&e->tx_lock);
	return fresh && !vsock_dgram_pending(e);
}

int vsock_engine_restore(struct vsock_engine *e, struct rec_reader *r,
			 void (*adopt)(void *arg, struct vsock_sock *s), void *arg)
{
	struct rec_val ev[ARRAY_SIZE(engine_fields)];
	struct restore rs = {.e = e, .doc = r->doc};
	uint64_t socks_total = atomic_load_explicit(&e->st.socks_total, memory_order_relaxed);
	uint64_t next_id = atomic_load_explicit(&e->next_id, memory_order_relaxed);
	uint64_t cvals[ARRAY_SIZE(counter_defs) + _VSOCK_HDR_ERROR_MAX] = {0};
	uint8_t cseen[ARRAY_SIZE(counter_defs) + _VSOCK_HDR_ERROR_MAX] = {0};
	struct rec_reader sub;
	struct rec_item it;
	int k;

	if (!adopt)
		return -EINVAL;
	if (!engine_fresh(e))
		return rec_fail(r->doc, -EBUSY, "restore into an engine that is not fresh");
	rs.dg_tail = &rs.dg_tx;
	k = rec_scan(r, engine_fields, ARRAY_SIZE(engine_fields), ev);
	if (k < 0)
		goto fail;
	if (ev[E_SCHEMA - 1].u != VSOCK_ENGINE_SAVE_SCHEMA) {
		k = rec_fail(r->doc, -EPROTONOSUPPORT, "engine schema %llu, this engine reads %u",
			     (unsigned long long)ev[E_SCHEMA - 1].u, VSOCK_ENGINE_SAVE_SCHEMA);
		goto fail;
	}
	rs.local_cid = (uint32_t)ev[E_LOCAL_CID - 1].u;
	if (rs.local_cid != vsock_engine_local_cid(e)) {
		k = FAIL(&rs, "the record is of CID %u, this engine is CID %u", rs.local_cid,
			 vsock_engine_local_cid(e));
		goto fail;
	}
	k = rec_enter(r, &ev[E_SOCKS - 1].it, "sockets", &sub);
	while (k == 0 && (k = rec_next(&sub, &it)) > 0) {
		if (it.tag != E_SOCK) {
			k = FAIL(&rs, "sockets: item 0x%x", it.tag);
			break;
		}
		k = restore_sock(&rs, &sub, &it, NULL);
	}
	if (k == 0)
		k = restore_ids(&rs, ev[E_NEXT_ID - 1].u);
	if (k == 0 && ev[E_DGRAM_TX - 1].present)
		k = restore_dgram_tx(&rs, r, &ev[E_DGRAM_TX - 1].it);
	if (k == 0)
		k = restore_nosock(&rs, &ev[E_NOSOCK - 1]);
	if (k == 0 && ev[E_COUNTERS - 1].present)
		k = restore_counters(&rs, r, &ev[E_COUNTERS - 1].it, cvals, cseen);
	if (k < 0) {
		rollback(&rs, socks_total, next_id);
		goto fail;
	}

	vsock_ct_set_port_cursor(e->ct, (uint32_t)ev[E_PORT_CURSOR - 1].u);
	vsock_ct_set_port_cursor(e->dct, (uint32_t)ev[E_DGRAM_CURSOR - 1].u);
	atomic_store_explicit(&e->next_id, ev[E_NEXT_ID - 1].u, memory_order_relaxed);
	/* socks_total: not the sockets the restore itself created (the saved count, if any,
	 * replaces it in publish). */
	atomic_store_explicit(&e->st.socks_total, socks_total, memory_order_relaxed);
	publish(&rs, cvals, cseen, adopt, arg);
	k = 0;
fail:
	free(rs.socks);
	free(rs.by_id);
	free(rs.top);
	free(rs.timer);
	free(rs.left);
	free(rs.rst);
	return k;
}

/* ---- crash survival ------------------------------------------------------------------------- */

int vsock_engine_reset_conn(struct vsock_engine *e, enum vsock_type type, uint32_t local_port,
			    uint32_t peer_cid, uint32_t peer_port)
{
	struct vsock_ct_node *n;
	struct vsock_hdr rst;

	if (type != VSOCK_TYPE_STREAM && type != VSOCK_TYPE_SEQPACKET)
		return -EINVAL;
	n = vsock_ct_lookup_connected(e->ct, peer_cid, peer_port, local_port);
	if (n) {
		sock_unref(container_of(n, struct vsock_sock, cnode)); /* the lookup's */
		return -EEXIST;
	}
	rst = (struct vsock_hdr){
		.src_cid = vsock_engine_local_cid(e),
		.dst_cid = peer_cid,
		.src_port = local_port,
		.dst_port = peer_port,
		.type = (uint16_t)type,
		.op = VSOCK_OP_RST,
	};
	return vsock_sk_nosock_put(e, &rst) ? 0 : -ENOBUFS;
}

/* Items of vsock_engine_save_conns: one E_CONN (a list) per connection. */
enum { E_CONN = 0x13 };
enum { A_TYPE = 1, A_LOCAL_PORT, A_PEER_CID, A_PEER_PORT };

static const struct rec_field conn_fields[] = {
	{A_TYPE, REC_U32, true, "type"},
	{A_LOCAL_PORT, REC_U32, true, "local_port"},
	{A_PEER_CID, REC_U32, true, "peer_cid"},
	{A_PEER_PORT, REC_U32, true, "peer_port"},
};

int vsock_engine_save_conns(struct vsock_engine *e, struct rec_writer *w)
{
	struct vsock_sock **v;
	ssize_t n = vsock_sk_collect(e, &v);

	if (n < 0)
		return (int)n;
	for (ssize_t i = 0; i < n; i++) {
		struct vsock_sock *s = v[i];

		sock_lock(s);
		if (s->in_conn) {
			rec_begin(w, E_CONN);
			rec_put_u32(w, A_TYPE, s->type);
			rec_put_u32(w, A_LOCAL_PORT, s->local_port);
			rec_put_u32(w, A_PEER_CID, s->peer_cid);
			rec_put_u32(w, A_PEER_PORT, s->peer_port);
			rec_end(w);
		}
		pthread_mutex_unlock(&s->lock);
		sock_unref(s);
	}
	free(v);
	return w->err;
}

uint64_t vsock_engine_conn_changes(struct vsock_engine *e)
{
	return vsock_ct_conn_changes(e->ct);
}

int vsock_engine_read_conns(struct rec_reader *r, size_t max, struct vsock_conn_addr **ret,
			    size_t *ret_n)
{
	struct rec_val v[ARRAY_SIZE(conn_fields)];
	struct vsock_conn_addr *a = NULL;
	size_t n = 0, cap = 0;
	struct rec_reader sub;
	struct rec_item it;
	int k;

	while ((k = rec_next(r, &it)) > 0) {
		if (it.tag != E_CONN) {
			k = rec_fail(r->doc, -EBADMSG, "connections: item 0x%x", it.tag);
			break;
		}
		k = rec_enter(r, &it, "connection", &sub);
		if (k == 0)
			k = rec_scan(&sub, conn_fields, ARRAY_SIZE(conn_fields), v);
		if (k < 0)
			break;
		if ((v[0].u != VSOCK_TYPE_STREAM && v[0].u != VSOCK_TYPE_SEQPACKET) ||
		    v[1].u == VMADDR_PORT_ANY || v[2].u == VMADDR_CID_ANY ||
		    v[3].u == VMADDR_PORT_ANY) {
			k = rec_fail(r->doc, -EBADMSG, "connection %zu: type %llu, %llu -> %llu:%llu",
				     n, (unsigned long long)v[0].u, (unsigned long long)v[1].u,
				     (unsigned long long)v[2].u, (unsigned long long)v[3].u);
			break;
		}
		if (n == max) {
			k = rec_fail(r->doc, -E2BIG, "more than %zu connections", max);
			break;
		}
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			struct vsock_conn_addr *na = realloc(a, ncap * sizeof(*na));

			if (!na) {
				k = rec_fail(r->doc, -ENOMEM, "out of memory");
				break;
			}
			a = na;
			cap = ncap;
		}
		a[n++] = (struct vsock_conn_addr){(uint32_t)v[0].u, (uint32_t)v[1].u,
						  (uint32_t)v[2].u, (uint32_t)v[3].u};
	}
	if (k < 0) {
		free(a);
		return k;
	}
	*ret = a;
	*ret_n = n;
	return 0;
}
