/* SPDX-License-Identifier: MIT */
/*
 * The socket calls of engine.h (vsock_sock_*): create, bind, listen, accept, connect, send,
 * recv, shutdown, close, options and getters, with Linux AF_VSOCK semantics and errno (Linux
 * net/vmw_vsock/af_vsock.c over virtio_transport_common.c). Each call takes the socket's lock,
 * changes its state, and leaves what must go on the wire as pending bits that the engine
 * (engine.c) hands out through pull. Also here: the send ring that holds data from send() until
 * it is pulled, and the credit update a read may owe the peer (docs/vsock-protocol.md §3).
 *
 * Threads: any thread; see the lock order in engine_internal.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/iov.h"
#include "util/macros.h"
#include "vsock/credit.h"
#include "vsock/engine_internal.h"

static uint32_t pow2_at_least(uint64_t v, uint32_t min)
{
	uint64_t p = min;

	while (p < v)
		p <<= 1;
	return p > (1u << 31) ? (1u << 31) : (uint32_t)p;
}

int vsock_sock_new(struct vsock_engine *e, enum vsock_type type, struct vsock_sock **ret)
{
	struct vsock_sock *s;
	int r;

	if (type == VSOCK_TYPE_DGRAM && !vsock_engine_dgram_enabled(e))
		return -ENODEV;
	if (type != VSOCK_TYPE_STREAM && type != VSOCK_TYPE_SEQPACKET && type != VSOCK_TYPE_DGRAM)
		return -ESOCKTNOSUPPORT;
	s = vsock_sk_alloc(e, type, &r);
	if (!s)
		return r;
	*ret = s;
	return 0;
}

void vsock_sock_set_user(struct vsock_sock *s, void *user)
{
	sock_lock(s);
	atomic_store_explicit(&s->user, user, memory_order_relaxed);
	sock_unlock(s);
}

void *vsock_sock_get_user(const struct vsock_sock *s)
{
	return atomic_load_explicit(&s->user, memory_order_relaxed);
}

static int sock_bind_locked(struct vsock_sock *s, uint32_t cid, uint32_t port)
{
	struct vsock_engine *e = s->e;
	int r;

	if (s->bound || s->local_port != VMADDR_PORT_ANY)
		return -EINVAL;
	if (cid != VMADDR_CID_ANY && cid != vsock_engine_local_cid(e))
		return -EADDRNOTAVAIL;
	if (port == VMADDR_PORT_ANY) {
		uint32_t p = 0;

		r = vsock_ct_bind_auto(sock_bound_table(s), &s->bnode, cid, e->cfg.port_lo, e->cfg.port_hi, &p);
		if (r < 0)
			return r == -EINVAL ? -EADDRNOTAVAIL : r;
		port = p;
	} else {
		r = vsock_ct_insert_bound(sock_bound_table(s), &s->bnode, cid, port);
		if (r < 0)
			return r;
	}
	sock_ref(s); /* the bound table's reference */
	s->bound = true;
	s->bound_cid = cid;
	s->local_port = port;
	if (s->type == VSOCK_TYPE_DGRAM)
		vsock_dgram_bound(s);
	return 0;
}

int vsock_sk_bind_locked(struct vsock_sock *s, uint32_t cid, uint32_t port)
{
	return sock_bind_locked(s, cid, port);
}

int vsock_sock_bind(struct vsock_sock *s, uint32_t cid, uint32_t port)
{
	int r;

	sock_lock(s);
	r = sock_bind_locked(s, cid, port);
	sock_unlock(s);
	return r;
}

/* What listen and connect refuse first, with s's lock held: datagrams, and SEQPACKET when the
 * engine does not offer it. Returns 0 or the negative errno. */
static int sock_conn_type_check(const struct vsock_sock *s)
{
	if (s->type == VSOCK_TYPE_DGRAM)
		return -EOPNOTSUPP; /* vsock_dgram_connect(); datagrams do not listen */
	if (s->type == VSOCK_TYPE_SEQPACKET && !s->e->cfg.seqpacket)
		return -EPROTONOSUPPORT;
	return 0;
}

static int sock_listen_common(struct vsock_sock *s, int backlog, bool deferred, bool wildcard)
{
	struct vsock_engine *e = s->e;
	int r = 0;

	sock_lock(s);
	r = sock_conn_type_check(s);
	if (r < 0)
		goto out;
	if (!(s->state == VSOCK_SS_FREE || s->state == VSOCK_SS_LISTEN ||
	      (s->state == VSOCK_SS_CLOSED && !s->was_connected && !s->in_conn))) {
		r = -EINVAL;
		goto out;
	}
	if (!s->bound) {
		r = sock_bind_locked(s, VMADDR_CID_ANY, VMADDR_PORT_ANY);
		if (r < 0)
			goto out;
	}
	if (wildcard && !s->wildcard) {
		pthread_mutex_lock(&e->all_lock);
		if (e->wildcard[s->type])
			r = -EADDRINUSE;
		else
			e->wildcard[s->type] = s;
		pthread_mutex_unlock(&e->all_lock);
		if (r < 0)
			goto out;
		s->wildcard = true;
	}
	if (backlog < 0)
		backlog = 0;
	if (backlog > 4096)
		backlog = 4096;
	s->backlog = backlog;
	s->deferred = deferred;
	s->err = 0;
	s->state = VSOCK_SS_LISTEN;
out:
	sock_unlock(s);
	return r;
}

int vsock_sock_listen(struct vsock_sock *s, int backlog)
{
	return sock_listen_common(s, backlog, false, false);
}

int vsock_sock_listen_deferred(struct vsock_sock *s, int backlog, bool wildcard)
{
	return sock_listen_common(s, backlog, true, wildcard);
}

int vsock_sock_accept_pending(struct vsock_sock *c)
{
	int r = 0;

	sock_lock(c);
	if (c->state == VSOCK_SS_PENDING) {
		c->state = VSOCK_SS_CONNECTED;
		vsock_sk_pend_set(c, PEND_RESPONSE);
		vsock_sk_event(NULL, c);
	} else if (c->state == VSOCK_SS_CLOSED) {
		r = -ECONNRESET;
	} else {
		r = -EINVAL;
	}
	sock_unlock(c);
	return r;
}

void vsock_sock_reject(struct vsock_sock *c)
{
	sock_lock(c);
	if (c->state == VSOCK_SS_PENDING) {
		c->done = true;
		vsock_sk_terminate(NULL, c, true, ECONNREFUSED);
	}
	sock_unlock(c);
}

int vsock_sock_accept(struct vsock_sock *s, struct vsock_sock **ret)
{
	struct vsock_sock *c;
	int r = 0;

	sock_lock(s);
	if (s->state != VSOCK_SS_LISTEN) {
		r = -EINVAL;
	} else if (!s->acc_head) {
		r = -EAGAIN;
	} else {
		c = s->acc_head;
		s->acc_head = c->acc_next;
		if (!s->acc_head)
			s->acc_tail = NULL;
		s->acc_len--;
		c->acc_next = NULL;
		*ret = c; /* the queue's reference goes to the caller */
	}
	sock_unlock(s);
	return r;
}

int vsock_sock_connect(struct vsock_sock *s, uint32_t cid, uint32_t port)
{
	struct vsock_engine *e = s->e;
	int r;

	sock_lock(s);
	r = sock_conn_type_check(s);
	if (r < 0)
		goto out;
	switch (s->state) {
	case VSOCK_SS_CONNECTED:
	case VSOCK_SS_PENDING:
	case VSOCK_SS_CLOSING:
		r = -EISCONN;
		goto out;
	case VSOCK_SS_CONNECTING:
		r = -EALREADY;
		goto out;
	case VSOCK_SS_LISTEN:
		r = -EINVAL;
		goto out;
	case VSOCK_SS_CLOSED:
		if (s->was_connected) {
			r = -EISCONN;
			goto out;
		}
		break;
	default:
		break;
	}
	if (cid == VMADDR_CID_ANY) {
		r = -ENETUNREACH;
		goto out;
	}
	if (!s->bound) {
		r = sock_bind_locked(s, VMADDR_CID_ANY, VMADDR_PORT_ANY);
		if (r < 0)
			goto out;
	}
	r = vsock_ct_insert_connected(e->ct, &s->cnode, cid, port, s->local_port);
	if (r < 0) {
		r = -EADDRINUSE;
		goto out;
	}
	sock_ref(s);
	s->in_conn = true;
	s->peer_cid = cid;
	s->peer_port = port;
	s->err = 0;
	s->done = false;
	s->shutdown = s->shutdown_sent = s->peer_shutdown = 0;
	s->request_sent = false;
	s->peer_buf_alloc = s->peer_fwd_cnt = s->tx_cnt = 0;
	s->fwd_cnt = s->last_fwd_cnt = 0;
	s->buf_alloc = (uint32_t)s->buf_size;
	s->rx_limit = s->buf_alloc;
	vsock_rxq_free(&s->rxq);
	s->state = VSOCK_SS_CONNECTING;
	vsock_sk_pend_clear(s, ~0u); /* e.g. the RST of a previous, failed attempt */
	vsock_sk_pend_set(s, PEND_REQUEST);
	vsock_sk_timer_arm(s, TIMER_CONNECT, now_ns(e) + s->connect_timeout_ns);
	r = -EINPROGRESS;
out:
	sock_unlock(s);
	return r;
}

static int tx_reserve(struct vsock_sock *s, uint32_t need)
{
	uint8_t *nb;
	uint32_t ncap;

	if (need <= s->tx_cap)
		return 0;
	ncap = pow2_at_least(need, 4096);
	if (ncap < need)
		return -ENOMEM;
	nb = malloc(ncap);
	if (!nb)
		return -ENOMEM;
	if (s->tx_len) {
		uint32_t first = MIN(s->tx_len, s->tx_cap - s->tx_head);

		memcpy(nb, s->txbuf + s->tx_head, first);
		memcpy(nb + first, s->txbuf, s->tx_len - first);
	}
	free(s->txbuf);
	s->txbuf = nb;
	s->tx_cap = ncap;
	s->tx_head = 0;
	return 0;
}

static int msg_reserve(struct vsock_sock *s)
{
	struct tx_msg *nm;
	uint32_t ncap;

	if (s->msg_n < s->msg_cap)
		return 0;
	ncap = s->msg_cap ? s->msg_cap * 2 : 16;
	nm = malloc(ncap * sizeof(*nm));
	if (!nm)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->msg_n; i++)
		nm[i] = s->msgs[(s->msg_head + i) & (s->msg_cap - 1)];
	free(s->msgs);
	s->msgs = nm;
	s->msg_cap = ncap;
	s->msg_head = 0;
	return 0;
}

/* Appends n bytes from the iov to the TX ring (space reserved by the caller). */
static void tx_ring_write(struct vsock_sock *s, const struct iovec *iov, int iovcnt, uint32_t n)
{
	uint32_t tail = (s->tx_head + s->tx_len) & (s->tx_cap - 1);
	uint32_t first = MIN(n, s->tx_cap - tail);
	struct iov_cur cur;

	iov_cur_init(&cur, iov, iov_count(iovcnt));
	iov_cur_read(&cur, s->txbuf + tail, first);
	if (n > first)
		iov_cur_read(&cur, s->txbuf, n - first);
	s->tx_len += n;
}

ssize_t vsock_sock_send(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags)
{
	size_t total = iov_total(iov, iov_count(iovcnt));
	ssize_t r;
	uint32_t space;

	sock_lock(s);
	if ((s->shutdown & VSOCK_SHUTDOWN_SEND) || (s->peer_shutdown & VSOCK_SHUTDOWN_RCV)) {
		r = -EPIPE;
		goto out;
	}
	if (s->state != VSOCK_SS_CONNECTED) {
		r = -ENOTCONN; /* listeners too, as engine.h and Linux say */
		goto out;
	}
	if (total == 0) {
		r = 0;
		goto out;
	}
	space = sock_send_space(s);
	if (s->type == VSOCK_TYPE_SEQPACKET) {
		if (total > vsock_credit_max_msg(s->peer_buf_alloc, s->buf_alloc)) {
			r = -EMSGSIZE;
			goto out;
		}
		if (total > space) {
			STAT_INC(s->e, credit_stalls);
			r = -EAGAIN;
			goto out;
		}
		if (tx_reserve(s, s->tx_len + (uint32_t)total) < 0 || msg_reserve(s) < 0) {
			r = -ENOMEM;
			goto out;
		}
		tx_ring_write(s, iov, iovcnt, (uint32_t)total);
		s->msgs[(s->msg_head + s->msg_n) & (s->msg_cap - 1)] =
			(struct tx_msg){(uint32_t)total, (flags & VSOCK_MSG_EOR) ? 1u : 0u};
		s->msg_n++;
		r = (ssize_t)total;
	} else {
		uint32_t n;

		if (space == 0) {
			STAT_INC(s->e, credit_stalls);
			r = -EAGAIN;
			goto out;
		}
		n = (uint32_t)MIN((size_t)space, total);
		if (tx_reserve(s, s->tx_len + n) < 0) {
			r = -ENOMEM;
			goto out;
		}
		tx_ring_write(s, iov, iovcnt, n);
		r = n;
	}
	vsock_sk_kick_tx(s);
out:
	sock_unlock(s);
	return r;
}

size_t vsock_sock_send_space(struct vsock_sock *s)
{
	size_t r = 0;

	sock_lock(s);
	if (s->state == VSOCK_SS_CONNECTED && !(s->shutdown & VSOCK_SHUTDOWN_SEND) &&
	    !(s->peer_shutdown & VSOCK_SHUTDOWN_RCV))
		r = sock_send_space(s);
	sock_unlock(s);
	return r;
}

/* Why s cannot take a zero-copy RW packet now (vsock_sock_tx_reserve), or 0. s locked. */
static int tx_direct_check(const struct vsock_sock *s)
{
	if (s->type != VSOCK_TYPE_STREAM)
		return -EOPNOTSUPP;
	if ((s->shutdown & VSOCK_SHUTDOWN_SEND) || (s->peer_shutdown & VSOCK_SHUTDOWN_RCV))
		return -EPIPE;
	if (s->state != VSOCK_SS_CONNECTED)
		return -ENOTCONN;
	/* Order: what pull would hand out first (a RESPONSE, send()'s bytes) goes first. */
	if ((s->pend & ~(unsigned)PEND_CREDIT_UPDATE) || s->tx_len)
		return -EAGAIN;
	return 0;
}

ssize_t vsock_sock_tx_reserve(struct vsock_sock *s, size_t max)
{
	ssize_t r;

	sock_lock(s);
	r = tx_direct_check(s);
	if (r == 0) {
		r = (ssize_t)MIN(max, (size_t)sock_send_space(s));
		if (r == 0 && max)
			STAT_INC(s->e, credit_stalls);
	}
	sock_unlock(s);
	return r;
}

int vsock_sock_tx_commit(struct vsock_sock *s, size_t n, struct vsock_hdr *h)
{
	int r;

	sock_lock(s);
	r = tx_direct_check(s);
	if (r == 0 && (n > s->e->cfg.max_pkt || n > sock_send_space(s)))
		r = -EINVAL;
	if (r == 0) {
		vsock_sk_hdr_init(s, h);
		h->op = VSOCK_OP_RW;
		s->tx_cnt += (uint32_t)n;
		s->bytes_out += n;
		vsock_sk_hdr_finish(s, h, (uint32_t)n);
	}
	sock_unlock(s);
	return r;
}

int vsock_sock_request_credit(struct vsock_sock *s)
{
	int r = 0;

	sock_lock(s);
	if (s->state == VSOCK_SS_CONNECTED)
		vsock_sk_pend_set(s, PEND_CREDIT_REQUEST);
	else
		r = -ENOTCONN;
	sock_unlock(s);
	return r;
}

/* Consumes (or with peek, copies) up to len STREAM bytes into iov. Returns bytes. s locked. */
static uint32_t stream_copy_out(struct vsock_sock *s, const struct iovec *iov, size_t iovcnt,
				uint32_t len, bool peek)
{
	uint32_t done = vsock_rxq_read(&s->rxq, iov, iovcnt, len, peek);

	if (!peek && done)
		vsock_sk_consumed(s, done, false);
	return done;
}

/* The read side is finished: EOF (recv returns 0) once the queue is empty. */
static bool sock_rx_eof(const struct vsock_sock *s)
{
	return s->done || (s->peer_shutdown & VSOCK_SHUTDOWN_SEND) || s->state == VSOCK_SS_CLOSED;
}

static ssize_t seqpacket_recv(struct vsock_sock *s, const struct iovec *iov, int iovcnt,
			      int flags, int *ret_msg_flags)
{
	bool peek = flags & VSOCK_MSG_PEEK;
	uint32_t msglen, copied;
	int mflags = 0;
	bool eor;

	if (s->rxq.msgs == 0)
		return sock_rx_eof(s) ? 0 : -EAGAIN;
	msglen = vsock_rxq_read_msg(&s->rxq, iov, iov_count(iovcnt), peek, &copied, &eor);
	if (eor)
		mflags |= VSOCK_MSG_EOR;
	if (msglen > copied)
		mflags |= VSOCK_MSG_TRUNC;
	if (!peek)
		vsock_sk_consumed(s, msglen, true);
	if (ret_msg_flags)
		*ret_msg_flags = mflags;
	return (flags & VSOCK_MSG_TRUNC) ? (ssize_t)msglen : (ssize_t)copied;
}

ssize_t vsock_sock_recv(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags,
			int *ret_msg_flags)
{
	size_t len = iov_total(iov, iov_count(iovcnt));
	ssize_t r;

	sock_lock(s);
	if (s->state == VSOCK_SS_LISTEN) {
		r = -EINVAL;
		goto out;
	}
	if (s->state != VSOCK_SS_CONNECTED && s->state != VSOCK_SS_CLOSING &&
	    !(s->state == VSOCK_SS_CLOSED && s->was_connected)) {
		r = -ENOTCONN;
		goto out;
	}
	if (s->shutdown & VSOCK_SHUTDOWN_RCV) {
		r = 0;
		goto out;
	}
	if (s->type == VSOCK_TYPE_SEQPACKET) {
		r = seqpacket_recv(s, iov, iovcnt, flags, ret_msg_flags);
		goto out;
	}
	if (ret_msg_flags)
		*ret_msg_flags = 0;
	if (len == 0) {
		r = 0;
		goto out;
	}
	/*
	 * Whatever is queued is returned, even below rcvlowat: Linux waits only while nothing is
	 * queued (net/vmw_vsock/af_vsock.c vsock_connectible_wait_data); waiting for the
	 * SO_RCVLOWAT target is the blocking caller's loop (__vsock_stream_recvmsg).
	 */
	if (s->rxq.bytes == 0) {
		r = sock_rx_eof(s) ? 0 : -EAGAIN;
		goto out;
	}
	r = stream_copy_out(s, iov, iov_count(iovcnt), (uint32_t)MIN(len, (size_t)UINT32_MAX),
			    flags & VSOCK_MSG_PEEK);
out:
	sock_unlock(s);
	return r;
}

ssize_t vsock_sock_rx_peek_iov(struct vsock_sock *s, struct iovec *iov, int iovcnt)
{
	ssize_t total = 0;

	sock_lock(s);
	if (s->type == VSOCK_TYPE_STREAM && !(s->shutdown & VSOCK_SHUTDOWN_RCV))
		total = (ssize_t)vsock_rxq_peek_iov(&s->rxq, iov, iov_count(iovcnt));
	sock_unlock(s);
	return total;
}

void vsock_sock_rx_consume(struct vsock_sock *s, size_t n)
{
	sock_lock(s);
	if (s->type == VSOCK_TYPE_STREAM)
		(void)stream_copy_out(s, NULL, 0, (uint32_t)MIN(n, (size_t)s->rxq.bytes), false);
	sock_unlock(s);
}

int vsock_sock_shutdown(struct vsock_sock *s, unsigned how)
{
	int r = 0;

	if (how == 0 || (how & ~VSOCK_SHUTDOWN_MASK))
		return -EINVAL;
	sock_lock(s);
	if (s->state == VSOCK_SS_CONNECTED) {
		if ((s->shutdown | how) != s->shutdown) {
			s->shutdown |= how;
			vsock_sk_pend_set(s, PEND_SHUTDOWN);
		}
		vsock_sk_event(NULL, s);
	} else if (s->state == VSOCK_SS_CLOSED && s->was_connected) {
		s->shutdown |= how;
		vsock_sk_event(NULL, s);
	} else {
		r = -ENOTCONN;
	}
	sock_unlock(s);
	return r;
}

void vsock_sock_close(struct vsock_sock *s)
{
	struct vsock_sock *children = NULL;
	struct vsock_engine *e;

	if (!s)
		return;
	e = s->e;
	sock_lock(s);
	s->app_closed = true;
	switch (s->state) {
	case VSOCK_SS_LISTEN:
		children = s->acc_head;
		s->acc_head = s->acc_tail = NULL;
		s->acc_len = 0;
		s->state = VSOCK_SS_CLOSED;
		if (s->wildcard) {
			pthread_mutex_lock(&e->all_lock);
			if (e->wildcard[s->type] == s)
				e->wildcard[s->type] = NULL;
			pthread_mutex_unlock(&e->all_lock);
			s->wildcard = false;
		}
		vsock_sk_unlink_bound(s);
		break;
	case VSOCK_SS_CONNECTING:
		s->done = true;
		vsock_sk_terminate(NULL, s, s->request_sent, 0);
		break;
	case VSOCK_SS_PENDING:
		s->done = true;
		vsock_sk_terminate(NULL, s, true, 0);
		break;
	case VSOCK_SS_CONNECTED:
		vsock_rxq_free(&s->rxq); /* unread data is discarded, as Linux purges at release */
		if (s->peer_shutdown == VSOCK_SHUTDOWN_MASK) {
			s->done = true;
			vsock_sk_terminate(NULL, s, true, 0);
			break;
		}
		if (s->shutdown_sent != VSOCK_SHUTDOWN_MASK) {
			s->shutdown = VSOCK_SHUTDOWN_MASK;
			vsock_sk_pend_set(s, PEND_SHUTDOWN);
		}
		s->state = VSOCK_SS_CLOSING;
		vsock_sk_timer_arm(s, TIMER_CLOSE, now_ns(e) + e->cfg.close_timeout_ns);
		break;
	default: /* FREE, CLOSED */
		vsock_sk_unlink_conn(s);
		vsock_sk_unlink_bound(s);
		vsock_rxq_free(&s->rxq);
		if (!(s->pend & PEND_RST))
			vsock_sk_pend_clear(s, ~0u);
		break;
	}
	sock_unlock(s);
	while (children) {
		struct vsock_sock *c = children;

		children = c->acc_next;
		c->acc_next = NULL;
		vsock_sock_close(c); /* releases the queue's reference */
	}
	sock_unref(s);
}

unsigned vsock_sock_poll(struct vsock_sock *s)
{
	unsigned m;

	sock_lock(s);
	m = vsock_sk_poll_locked(s);
	sock_unlock(s);
	return m;
}

int vsock_sock_take_error(struct vsock_sock *s)
{
	int r;

	sock_lock(s);
	r = s->err;
	s->err = 0;
	sock_unlock(s);
	return r;
}

enum vsock_state vsock_sock_state(struct vsock_sock *s)
{
	enum vsock_state st;

	sock_lock(s);
	st = s->state;
	sock_unlock(s);
	return st;
}

enum vsock_type vsock_sock_type(const struct vsock_sock *s)
{
	return s->type;
}

int vsock_sock_local_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port)
{
	sock_lock(s);
	if (s->in_conn || s->state == VSOCK_SS_CONNECTED || s->state == VSOCK_SS_CLOSING ||
	    s->state == VSOCK_SS_PENDING)
		*ret_cid = vsock_engine_local_cid(s->e);
	else
		*ret_cid = s->bound_cid;
	*ret_port = s->local_port;
	sock_unlock(s);
	return 0;
}

int vsock_sock_peer_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port)
{
	int r = 0;

	sock_lock(s);
	if (s->state == VSOCK_SS_CONNECTED || s->state == VSOCK_SS_CLOSING ||
	    s->state == VSOCK_SS_PENDING || (s->state == VSOCK_SS_CLOSED && s->was_connected)) {
		*ret_cid = s->peer_cid;
		*ret_port = s->peer_port;
	} else {
		r = -ENOTCONN;
	}
	sock_unlock(s);
	return r;
}

static void sock_apply_buffer_size(struct vsock_sock *s, uint64_t val)
{
	/* Linux order: clamp to max, then min (min wins if they cross); u32 for virtio. */
	if (val > s->buf_max)
		val = s->buf_max;
	if (val < s->buf_min)
		val = s->buf_min;
	if (val > UINT32_MAX)
		val = UINT32_MAX;
	if (val != s->buf_size || val != s->buf_alloc) {
		s->buf_size = val;
		if (s->state == VSOCK_SS_FREE || s->state == VSOCK_SS_LISTEN ||
		    s->state == VSOCK_SS_CONNECTED || s->state == VSOCK_SS_CONNECTING ||
		    s->state == VSOCK_SS_PENDING) {
			s->buf_alloc = (uint32_t)val;
			if (s->buf_alloc > s->rx_limit)
				s->rx_limit = s->buf_alloc;
		}
		if (s->state == VSOCK_SS_CONNECTED)
			vsock_sk_pend_set(s, PEND_CREDIT_UPDATE); /* at once (§3 rule 4) */
		vsock_sk_event(NULL, s);
	}
}

/* The u64 field behind a buffer or timeout option, or NULL for another option. */
static uint64_t *sock_opt_field(struct vsock_sock *s, enum vsock_sockopt opt)
{
	switch (opt) {
	case VSOCK_OPT_BUFFER_SIZE: return &s->buf_size;
	case VSOCK_OPT_BUFFER_MIN_SIZE: return &s->buf_min;
	case VSOCK_OPT_BUFFER_MAX_SIZE: return &s->buf_max;
	case VSOCK_OPT_CONNECT_TIMEOUT: return &s->connect_timeout_ns;
	default: return NULL;
	}
}

int vsock_sock_setopt(struct vsock_sock *s, enum vsock_sockopt opt, uint64_t val)
{
	int r = 0;

	sock_lock(s);
	switch (opt) {
	case VSOCK_OPT_BUFFER_SIZE:
		sock_apply_buffer_size(s, val);
		break;
	case VSOCK_OPT_BUFFER_MIN_SIZE:
	case VSOCK_OPT_BUFFER_MAX_SIZE:
		*sock_opt_field(s, opt) = MIN(val, (uint64_t)UINT32_MAX);
		sock_apply_buffer_size(s, s->buf_size);
		break;
	case VSOCK_OPT_CONNECT_TIMEOUT:
		s->connect_timeout_ns = val ? val : s->e->cfg.connect_timeout_ns;
		break;
	case VSOCK_OPT_RCVLOWAT:
		/* Linux checks it on STREAM only: af_vsock.c vsock_set_rcvlowat is a
		 * vsock_stream_ops callback, SEQPACKET takes any value. */
		if (s->type == VSOCK_TYPE_STREAM && val > s->buf_size) {
			r = -EINVAL;
			break;
		}
		s->rcvlowat = val ? (uint32_t)val : 1;
		if (s->state == VSOCK_SS_CONNECTED && s->type == VSOCK_TYPE_STREAM &&
		    vsock_credit_need_update(s->buf_alloc, s->fwd_cnt, s->last_fwd_cnt,
					     s->rxq.bytes, s->rcvlowat))
			vsock_sk_pend_set(s, PEND_CREDIT_UPDATE);
		vsock_sk_event(NULL, s);
		break;
	default:
		r = -ENOPROTOOPT;
		break;
	}
	sock_unlock(s);
	return r;
}

int vsock_sock_getopt(struct vsock_sock *s, enum vsock_sockopt opt, uint64_t *ret)
{
	const uint64_t *f;
	int r = 0;
	uint64_t v = 0;

	sock_lock(s);
	if (opt == VSOCK_OPT_RCVLOWAT)
		v = s->rcvlowat;
	else if ((f = sock_opt_field(s, opt)) != NULL)
		v = *f;
	else
		r = -ENOPROTOOPT;
	sock_unlock(s);
	if (r == 0)
		*ret = v;
	return r;
}

static void sock_info_locked(struct vsock_sock *s, struct vsock_sock_info *i)
{
	*i = (struct vsock_sock_info){
		.type = s->type,
		.state = s->state,
		.local_cid = (s->in_conn || s->was_connected) ? vsock_engine_local_cid(s->e)
							      : s->bound_cid,
		.local_port = s->local_port,
		.peer_cid = s->peer_cid,
		.peer_port = s->peer_port,
		.buf_alloc = s->buf_alloc,
		.fwd_cnt = s->fwd_cnt,
		.last_fwd_cnt = s->last_fwd_cnt,
		.rx_bytes = s->rxq.bytes,
		.rx_mem = (uint32_t)MIN(s->rxq.mem, (uint64_t)UINT32_MAX),
		.peer_buf_alloc = s->peer_buf_alloc,
		.peer_fwd_cnt = s->peer_fwd_cnt,
		.tx_cnt = s->tx_cnt,
		.tx_queued = s->tx_len,
		.bytes_in = s->bytes_in,
		.bytes_out = s->bytes_out,
		.shutdown = s->shutdown,
		.peer_shutdown = s->peer_shutdown,
	};
}

void vsock_sock_get_info(struct vsock_sock *s, struct vsock_sock_info *ret)
{
	sock_lock(s);
	sock_info_locked(s, ret);
	sock_unlock(s);
}
