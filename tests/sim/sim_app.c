/* SPDX-License-Identifier: MIT */
/*
 * The simulated applications: sockets on both sides (listeners, deferred listeners, clients,
 * accepted children), random socket calls at random moments, and the checks on what they see.
 *
 * Every connection has a record (struct sim_conn) with one struct sim_dir per direction. The
 * sender writes pattern bytes keyed by stream offset (SEQPACKET: consecutive messages take
 * consecutive offsets), so the receiver checks each byte it reads against the pattern at its own
 * offset: every byte arrives once and in order, and never more than was sent; SEQPACKET messages
 * arrive whole, in order, with their length, EOR flag and MSG_TRUNC as sent.
 *
 * End of stream. A receiver may see EOF (recv returns 0) only when the sender shut down SEND or
 * closed, an RST reached the receiver, or a transport reset happened; if none of the last two
 * happened, EOF means every byte (message) sent was read. Once EOF was seen, no data follows.
 *
 * Other checks: accept returns a child exactly when the listener's engine took a REQUEST for it
 * (in REQUEST order, with the client's port as peer); a client reaches CONNECTED only for a
 * REQUEST that made a child; poll's POLLIN/POLLOUT agree with what recv/send then do; and no
 * poll bit appears on a socket without a sock_event (a blocked caller would never wake).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define WATCH_BITS  (VSOCK_POLLIN | VSOCK_POLLOUT | VSOCK_POLLERR | VSOCK_POLLHUP | VSOCK_POLLRDHUP)
#define LISTEN_PORT 100u
#define CLIENT_PORT 1024u
#define IO_MAX      (300u * 1024u)

static const char *side_name(int side)
{
	return side ? "host" : "guest";
}

static const char *type_name(enum vsock_type t)
{
	return t == VSOCK_TYPE_STREAM ? "stream" : "seqpacket";
}

static bool is_live(const struct sim_sock *ss)
{
	return ss->s != NULL;
}

static bool is_conn(const struct sim_sock *ss)
{
	return ss->s && ss->role != ROLE_LISTENER;
}

static bool is_listener(const struct sim_sock *ss)
{
	return ss->s && ss->role == ROLE_LISTENER;
}

static bool is_undecided(const struct sim_sock *ss)
{
	return ss->s && ss->undecided;
}

/* The direction this socket sends on (client: 0, child: 1). */
static int dir_out(const struct sim_sock *ss)
{
	return ss->role == ROLE_CHILD;
}

static struct sim_sock *pick(struct sim *s, bool (*pred)(const struct sim_sock *))
{
	struct sim_sock *r = NULL;
	unsigned seen = 0;

	for (unsigned i = 0; i < s->nsocks; i++)
		if (pred(&s->socks[i]) && sim_below(s, ++seen) == 0)
			r = &s->socks[i];
	return r;
}

unsigned sim_app_live(struct sim *s, int side)
{
	unsigned n = 0;

	for (unsigned i = 0; i < s->nsocks; i++)
		n += is_live(&s->socks[i]) && s->socks[i].side == side;
	return n;
}

static int sock_idx(struct sim *s, const struct sim_sock *ss)
{
	return (int)(ss - s->socks);
}

/* The application looked at the socket itself: it knows its mask now. */
static void resync(struct sim_sock *ss)
{
	if (ss->s)
		ss->mask_seen = vsock_sock_poll(ss->s);
}

static struct sim_sock *sock_add(struct sim *s, int side, enum sim_role role, enum vsock_type t,
                                 struct vsock_sock *vs, uint32_t port, int conn)
{
	struct sim_sock *ss = &s->socks[s->nsocks++];

	*ss = (struct sim_sock){
		.s = vs, .side = side, .role = role, .type = t, .conn = conn, .port = port
	};
	vsock_sock_set_user(vs, ss);
	resync(ss);
	return ss;
}

static bool room_for_sock(struct sim *s, int side)
{
	return s->nsocks < SIM_MAX_SOCKS && sim_app_live(s, side) < SIM_MAX_LIVE;
}

static void buffer_opt(struct sim *s, struct vsock_sock *vs)
{
	static const uint64_t sizes[] = { 128, 1000, 4096, 65536, 256 * 1024 };
	int r;

	if (!sim_chance(s, 40))
		return;
	r = vsock_sock_setopt(vs, VSOCK_OPT_BUFFER_SIZE, sizes[sim_below(s, 5)]);
	SIM_CHECK(s, r == 0, "setopt BUFFER_SIZE: %d", r);
}

/* ---- creating sockets ------------------------------------------------------------------- */

/*
 * A new socket bound to port, maybe with another buffer size; NULL when the engine is at
 * max_socks or the port is still taken (an old socket lingers there).
 */
static struct vsock_sock *sock_new_bound(struct sim *s, int side, enum vsock_type t, uint32_t port)
{
	struct vsock_sock *vs;
	int r = vsock_sock_new(s->e[side], t, &vs);

	if (r == -EMFILE)
		return NULL;
	SIM_CHECK(s, r == 0, "sock_new: %d", r);
	r = vsock_sock_bind(vs, VMADDR_CID_ANY, port);
	if (r == -EADDRINUSE) {
		vsock_sock_close(vs);
		return NULL;
	}
	SIM_CHECK(s, r == 0, "bind %u: %d", port, r);
	buffer_opt(s, vs);
	return vs;
}

static struct sim_sock *listener_at(struct sim *s, int side, uint32_t port)
{
	for (unsigned i = 0; i < s->nsocks; i++) {
		struct sim_sock *ss = &s->socks[i];

		if (is_listener(ss) && ss->side == side && ss->port == port)
			return ss;
	}
	return NULL;
}

static void app_listen(struct sim *s, int side)
{
	enum vsock_type t = sim_chance(s, 50) ? VSOCK_TYPE_STREAM : VSOCK_TYPE_SEQPACKET;
	uint32_t port = LISTEN_PORT + (uint32_t)sim_below(s, SIM_NPORTS - 1);
	int backlog = (int)sim_below(s, 7);
	bool deferred = sim_chance(s, 25);
	struct vsock_sock *vs;
	struct sim_sock *ss;
	int r;

	if (!room_for_sock(s, side) || listener_at(s, side, port))
		return;
	vs = sock_new_bound(s, side, t, port);
	if (!vs)
		return;
	r = deferred ? vsock_sock_listen_deferred(vs, backlog, false)
	             : vsock_sock_listen(vs, backlog);
	SIM_CHECK(s, r == 0, "listen: %d", r);
	ss = sock_add(s, side, ROLE_LISTENER, t, vs, port, -1);
	ss->deferred = deferred;
	sim_trace(s, "app %s: listen #%d %s port %u backlog %d%s", side_name(side), sock_idx(s, ss),
	          type_name(t), port, backlog, deferred ? " deferred" : "");
}

struct tuple_q {
	uint32_t lport, pport;
	bool busy;
};

static void tuple_match(void *arg, const struct vsock_sock_info *i)
{
	struct tuple_q *q = arg;

	if (i->local_port == q->lport && i->peer_port == q->pport)
		q->busy = true;
}

/*
 * Whether an older connection on this port pair may still have a socket or a packet anywhere.
 * The protocol has no connection identifier: a RESPONSE, RW or RST of an old incarnation still
 * in flight is taken by a new one on the same ports (Linux does the same), which no check here
 * could tell from an engine bug. So a pair is reused only once nothing of it is left.
 */
static bool tuple_busy(struct sim *s, int side, uint32_t cport, uint32_t lport)
{
	struct tuple_q q = { cport, lport, false };

	vsock_engine_foreach_sock(s->e[side], tuple_match, &q);
	q = (struct tuple_q){ lport, cport, q.busy };
	vsock_engine_foreach_sock(s->e[!side], tuple_match, &q);
	for (int w = 0; w < 2 && !q.busy; w++) {
		for (unsigned i = 0; i < s->w[w].n; i++) {
			const struct vsock_hdr *h = &s->w[w].p[i].h;

			if ((h->src_port == cport && h->dst_port == lport) ||
			    (h->src_port == lport && h->dst_port == cport))
				q.busy = true;
		}
	}
	return q.busy;
}

static void app_connect(struct sim *s, int side)
{
	uint32_t lport = LISTEN_PORT + (uint32_t)sim_below(s, SIM_NPORTS);
	uint32_t cport = CLIENT_PORT + (uint32_t)sim_below(s, SIM_CLIENT_PORTS);
	struct sim_sock *l = listener_at(s, !side, lport);
	enum vsock_type t;

	/* Mostly to a live listener; sometimes to a port nobody listens on. */
	for (int i = 0; !l && i < 4 && sim_chance(s, 80); i++) {
		lport = LISTEN_PORT + (uint32_t)sim_below(s, SIM_NPORTS - 1);
		l = listener_at(s, !side, lport);
	}
	struct sim_conn *c;
	struct vsock_sock *vs;
	struct sim_sock *ss;
	int r;

	if (!room_for_sock(s, side) || s->nconns >= SIM_MAX_CONNS ||
	    tuple_busy(s, side, cport, lport))
		return;
	if (l && sim_chance(s, 90))
		t = l->type;
	else
		t = sim_chance(s, 50) ? VSOCK_TYPE_STREAM : VSOCK_TYPE_SEQPACKET;
	vs = sock_new_bound(s, side, t, cport);
	if (!vs)
		return;
	if (sim_chance(s, 10)) {
		r = vsock_sock_setopt(vs, VSOCK_OPT_CONNECT_TIMEOUT,
		                      (1 + sim_below(s, 1000)) * 1000000ull);
		SIM_CHECK(s, r == 0, "setopt CONNECT_TIMEOUT: %d", r);
	}
	c = &s->conns[s->nconns];
	*c = (struct sim_conn){ .type = t,
		                .cside = side,
		                .client = (int)s->nsocks,
		                .server = -1,
		                .cport = cport,
		                .lport = lport };
	c->d[0].key = sim_rand(s);
	c->d[1].key = sim_rand(s);
	sim_cred_reset(s, side, cport, lport, 0, 0);
	r = vsock_sock_connect(vs, s->cfg[!side].local_cid, lport);
	SIM_CHECK(s, r == -EINPROGRESS, "connect: %d", r);
	ss = sock_add(s, side, ROLE_CLIENT, t, vs, cport, (int)s->nconns);
	s->nconns++;
	sim_trace(s, "app %s: connect #%d conn %d %s %u->%u", side_name(side), sock_idx(s, ss),
	          ss->conn, type_name(t), cport, lport);
}

static bool is_failed_client(const struct sim_sock *ss)
{
	return ss->s && ss->role == ROLE_CLIENT && vsock_sock_state(ss->s) == VSOCK_SS_CLOSED;
}

static void end_gone(struct sim_conn *c, int out);

/* connect() again on a client whose attempt failed (allowed while it never connected). */
static void app_reconnect(struct sim *s, struct sim_sock *ss)
{
	uint32_t lport = LISTEN_PORT + (uint32_t)sim_below(s, SIM_NPORTS - 1);
	struct sim_conn *old = &s->conns[ss->conn], *c;
	int r;

	if (old->connected || s->nconns >= SIM_MAX_CONNS ||
	    tuple_busy(s, ss->side, ss->port, lport))
		return;
	c = &s->conns[s->nconns];
	*c = (struct sim_conn){ .type = ss->type,
		                .cside = ss->side,
		                .client = sock_idx(s, ss),
		                .server = -1,
		                .cport = ss->port,
		                .lport = lport };
	c->d[0].key = sim_rand(s);
	c->d[1].key = sim_rand(s);
	sim_cred_reset(s, ss->side, ss->port, lport, 0, 0);
	r = vsock_sock_connect(ss->s, s->cfg[!ss->side].local_cid, lport);
	sim_trace(s, "app %s: reconnect #%d conn %d -> conn %d %u->%u: %d", side_name(ss->side),
	          sock_idx(s, ss), ss->conn, (int)s->nconns, ss->port, lport, r);
	if (r == -EISCONN && old->child)
		return; /* it did connect (and was reset) within one step: no second attempt */
	SIM_CHECK(s, r == -EINPROGRESS, "connect again after a failed attempt: %d", r);
	end_gone(old, 0);
	ss->conn = (int)s->nconns++;
	resync(ss);
}

/* ---- accepting -------------------------------------------------------------------------- */

/* The application will never use this end: nothing more is sent or read there. */
static void end_gone(struct sim_conn *c, int out)
{
	c->d[out].wr_done = true;
	c->d[!out].rd_shut = true;
}

static bool app_accept_one(struct sim *s, struct sim_sock *l)
{
	struct vsock_sock *child = NULL;
	struct sim_conn *c;
	struct sim_sock *ss;
	enum vsock_state st;
	uint32_t pcid, pport;
	int r, ci;

	r = vsock_sock_accept(l->s, &child);
	if (r == -EAGAIN) {
		SIM_CHECK(s, l->fifo_n == 0, "accept: EAGAIN but %u children were created",
		          l->fifo_n);
		return false;
	}
	SIM_CHECK(s, r == 0, "accept: %d", r);
	SIM_CHECK(s, l->fifo_n > 0, "accept returned a child no REQUEST created");
	ci = l->fifo[l->fifo_head];
	l->fifo_head = (l->fifo_head + 1) % SIM_BACKLOG_MAX;
	l->fifo_n--;
	c = &s->conns[ci];
	r = vsock_sock_peer_addr(child, &pcid, &pport);
	SIM_CHECK(s, r == 0 && pport == c->cport && pcid == s->cfg[c->cside].local_cid,
	          "accepted child of conn %d has peer %u:%u (r %d), want port %u", ci, pcid, pport,
	          r, c->cport);
	st = vsock_sock_state(child);
	if (l->deferred)
		SIM_CHECK(s, st == VSOCK_SS_PENDING || st == VSOCK_SS_CLOSED,
		          "deferred child in state %s", vsock_state_to_string(st));
	else
		SIM_CHECK(s, st == VSOCK_SS_CONNECTED || st == VSOCK_SS_CLOSED,
		          "accepted child in state %s", vsock_state_to_string(st));
	if (!room_for_sock(s, l->side)) {
		sim_trace(s, "app %s: accept conn %d and close it at once", side_name(l->side), ci);
		end_gone(c, 1);
		vsock_sock_close(child);
		return true;
	}
	ss = sock_add(s, l->side, ROLE_CHILD, l->type, child, l->port, ci);
	ss->undecided = l->deferred;
	c->server = sock_idx(s, ss);
	sim_trace(s, "app %s: accept #%d conn %d (%s)", side_name(l->side), c->server, ci,
	          vsock_state_to_string(st));
	return true;
}

static void app_decide(struct sim *s, struct sim_sock *ss, bool accept)
{
	enum vsock_state st = vsock_sock_state(ss->s);
	int r;

	ss->undecided = false;
	if (accept) {
		r = vsock_sock_accept_pending(ss->s);
		SIM_CHECK(s, st == VSOCK_SS_PENDING ? r == 0 : r == -ECONNRESET,
		          "accept_pending in %s: %d", vsock_state_to_string(st), r);
	} else {
		vsock_sock_reject(ss->s);
		end_gone(&s->conns[ss->conn], 1);
		r = 0;
	}
	sim_trace(s, "app %s: %s #%d conn %d: %d", side_name(ss->side),
	          accept ? "accept_pending" : "reject", sock_idx(s, ss), ss->conn, r);
	resync(ss);
}

/* ---- sending ---------------------------------------------------------------------------- */

static void app_send(struct sim *s, struct sim_sock *ss)
{
	struct sim_conn *c = &s->conns[ss->conn];
	struct sim_dir *d = &c->d[dir_out(ss)];
	uint32_t len = sim_size(s, ss->type == VSOCK_TYPE_STREAM ? IO_MAX : 70000);
	bool eor = ss->type == VSOCK_TYPE_SEQPACKET && sim_chance(s, 50);
	unsigned pre = vsock_sock_poll(ss->s);
	enum vsock_state st = vsock_sock_state(ss->s);
	struct iovec iov[4];
	uint8_t *buf = malloc(len);
	ssize_t r;
	int n = 1 + (int)sim_below(s, 4);
	size_t off = 0;

	SIM_CHECK(s, buf, "out of memory");
	sim_pat_fill(d->key, d->sent, buf, len);
	for (int i = 0; i < n; i++) {
		size_t take = i == n - 1 ? len - off : (size_t)sim_below(s, len - off + 1);

		iov[i] = (struct iovec){ buf + off, take };
		off += take;
	}
	r = vsock_sock_send(ss->s, iov, n, eor ? VSOCK_MSG_EOR : 0);
	free(buf);
	sim_trace(s, "app %s: send #%d conn %d %u bytes%s: %zd", side_name(ss->side),
	          sock_idx(s, ss), ss->conn, len, eor ? " EOR" : "", r);
	if (r >= 0) {
		SIM_CHECK(s, !ss->wr_shut && !d->wr_done, "send succeeded after shutdown(SEND)");
		SIM_CHECK(s, st == VSOCK_SS_CONNECTED, "send succeeded in state %s",
		          vsock_state_to_string(st));
		if (ss->type == VSOCK_TYPE_SEQPACKET) {
			SIM_CHECK(s, r == (ssize_t)len, "SEQPACKET send of %u returned %zd", len,
			          r);
			if (d->nmsg == d->msg_cap) {
				struct sim_msg *m;

				d->msg_cap = d->msg_cap ? 2 * d->msg_cap : 16;
				m = realloc(d->msgs, d->msg_cap * sizeof(*m));
				SIM_CHECK(s, m, "out of memory");
				d->msgs = m;
			}
			d->msgs[d->nmsg++] = (struct sim_msg){ len, eor, d->sent };
		} else {
			SIM_CHECK(s, r > 0 && r <= (ssize_t)len, "STREAM send of %u returned %zd",
			          len, r);
		}
		d->sent += (uint64_t)r;
	} else if (r == -EAGAIN) {
		SIM_CHECK(s, st == VSOCK_SS_CONNECTED, "send EAGAIN in state %s",
		          vsock_state_to_string(st));
		SIM_CHECK(s, ss->type == VSOCK_TYPE_SEQPACKET || !(pre & VSOCK_POLLOUT),
		          "STREAM send: POLLOUT was set but send returned EAGAIN");
	} else if (r == -EMSGSIZE) {
		struct vsock_sock_info info;

		vsock_sock_get_info(ss->s, &info);
		SIM_CHECK(s,
		          ss->type == VSOCK_TYPE_SEQPACKET &&
		                  len > (info.peer_buf_alloc < info.buf_alloc ? info.peer_buf_alloc
		                                                              : info.buf_alloc),
		          "EMSGSIZE for %u bytes (peer buf_alloc %u, ours %u)", len,
		          info.peer_buf_alloc, info.buf_alloc);
	} else if (r == -ENOTCONN) {
		SIM_CHECK(s, st != VSOCK_SS_CONNECTED, "send ENOTCONN while connected");
	} else {
		SIM_CHECK(s, r == -EPIPE, "send: %zd", r);
	}
	SIM_CHECK(s, !ss->wr_shut || r == -EPIPE, "send after shutdown(SEND) returned %zd", r);
	resync(ss);
}

/* ---- receiving -------------------------------------------------------------------------- */

/* recv returned 0 (or the queue ended) on d: is an end allowed, and is it complete? */
static void saw_eof(struct sim *s, struct sim_sock *ss, struct sim_dir *d)
{
	struct sim_conn *c = &s->conns[ss->conn];

	if (d->rd_shut || d->eof)
		return;
	d->eof = true;
	SIM_CHECK(s, d->wr_done || d->rst || c->reset,
	          "conn %d: EOF at %s #%d but the peer neither shut down nor reset", ss->conn,
	          side_name(ss->side), sock_idx(s, ss));
	SIM_CHECK(s, !c->healthy || !d->rst,
	          "conn %d: open at both ends at the drain, but reset before %s #%d read to the "
	          "end (%llu of %llu bytes)",
	          ss->conn, side_name(ss->side), sock_idx(s, ss), (unsigned long long)d->recvd,
	          (unsigned long long)d->sent);
	if (d->rst || c->reset)
		return;
	s->clean_eofs++;
	SIM_CHECK(s, d->recvd == d->sent && d->next_msg == d->nmsg,
	          "conn %d: clean EOF at %s #%d after %llu of %llu bytes (%u of %u messages)",
	          ss->conn, side_name(ss->side), sock_idx(s, ss), (unsigned long long)d->recvd,
	          (unsigned long long)d->sent, d->next_msg, d->nmsg);
}

static void check_bytes(struct sim *s, struct sim_sock *ss, uint64_t key, uint64_t off,
                        const uint8_t *p, size_t n)
{
	long bad = sim_pat_check(key, off, p, n);

	SIM_CHECK(s, bad < 0, "conn %d: wrong byte at offset %llu at %s #%d", ss->conn,
	          (unsigned long long)(off + (uint64_t)bad), side_name(ss->side), sock_idx(s, ss));
}

static void got_stream(struct sim *s, struct sim_sock *ss, struct sim_dir *d, const uint8_t *p,
                       size_t n, bool peek)
{
	SIM_CHECK(s, !d->eof, "conn %d: data after EOF", ss->conn);
	SIM_CHECK(s, d->recvd + n <= d->sent, "conn %d: read %llu bytes, only %llu sent", ss->conn,
	          (unsigned long long)(d->recvd + n), (unsigned long long)d->sent);
	check_bytes(s, ss, d->key, d->recvd, p, n);
	if (!peek)
		d->recvd += n;
}

static void got_message(struct sim *s, struct sim_sock *ss, struct sim_dir *d, const uint8_t *p,
                        size_t cap, ssize_t r, int mflags, int flags)
{
	const struct sim_msg *m;
	size_t copied;

	SIM_CHECK(s, !d->eof, "conn %d: message after EOF", ss->conn);
	SIM_CHECK(s, d->next_msg < d->nmsg, "conn %d: a message nobody sent (%u sent)", ss->conn,
	          d->nmsg);
	m = &d->msgs[d->next_msg];
	copied = m->len < cap ? m->len : cap;
	SIM_CHECK(s, r == (ssize_t)((flags & VSOCK_MSG_TRUNC) ? m->len : copied),
	          "conn %d: message %u of %u bytes, buffer %zu, flags %#x: recv returned %zd",
	          ss->conn, d->next_msg, m->len, cap, flags, r);
	SIM_CHECK(s,
	          !!(mflags & VSOCK_MSG_TRUNC) == (m->len > cap) &&
	                  !!(mflags & VSOCK_MSG_EOR) == m->eor,
	          "conn %d: message %u (len %u, eor %d, buffer %zu) got msg flags %#x", ss->conn,
	          d->next_msg, m->len, m->eor, cap, mflags);
	check_bytes(s, ss, d->key, m->off, p, copied);
	if (!(flags & VSOCK_MSG_PEEK)) {
		d->next_msg++;
		d->recvd += m->len;
	}
}

/* One recv call; returns its result. */
static ssize_t do_recv(struct sim *s, struct sim_sock *ss, uint32_t cap, int flags)
{
	struct sim_dir *d = &s->conns[ss->conn].d[!dir_out(ss)];
	unsigned pre = vsock_sock_poll(ss->s);
	enum vsock_state st = vsock_sock_state(ss->s);
	uint8_t *buf = malloc(cap);
	struct iovec iov[3];
	int mflags = 0, n;
	ssize_t r;

	SIM_CHECK(s, buf, "out of memory");
	n = 1 + (int)sim_below(s, 3);
	for (int i = 0, off = 0; i < n; i++) {
		uint32_t take = i == n - 1 ? cap - (uint32_t)off
		                           : (uint32_t)sim_below(s, cap - (uint32_t)off + 1);

		iov[i] = (struct iovec){ buf + off, take };
		off += (int)take;
	}
	r = vsock_sock_recv(ss->s, iov, n, flags, &mflags);
	sim_trace(s, "app %s: recv #%d conn %d cap %u flags %#x: %zd (msg flags %#x)",
	          side_name(ss->side), sock_idx(s, ss), ss->conn, cap, flags, r, mflags);
	if (r > 0 || (r == 0 && ss->type == VSOCK_TYPE_SEQPACKET && (mflags & VSOCK_MSG_TRUNC))) {
		if (ss->type == VSOCK_TYPE_STREAM) {
			SIM_CHECK(s, (size_t)r <= cap, "recv returned %zd > %u", r, cap);
			got_stream(s, ss, d, buf, (size_t)r, flags & VSOCK_MSG_PEEK);
		} else {
			got_message(s, ss, d, buf, cap, r, mflags, flags);
		}
	} else if (r == 0) {
		saw_eof(s, ss, d);
	} else if (r == -EAGAIN) {
		SIM_CHECK(s, !d->eof || d->rd_shut, "conn %d: EAGAIN after EOF", ss->conn);
		SIM_CHECK(s, !(pre & VSOCK_POLLIN), "conn %d: POLLIN was set but recv said EAGAIN",
		          ss->conn);
	} else {
		SIM_CHECK(s, r == -ENOTCONN, "recv: %zd", r);
		SIM_CHECK(s,
		          st == VSOCK_SS_CONNECTING || st == VSOCK_SS_PENDING ||
		                  st == VSOCK_SS_CLOSED,
		          "recv ENOTCONN in state %s", vsock_state_to_string(st));
	}
	free(buf);
	resync(ss);
	return r;
}

static void app_recv(struct sim *s, struct sim_sock *ss)
{
	int flags = 0;

	if (sim_chance(s, 10))
		flags |= VSOCK_MSG_PEEK;
	if (ss->type == VSOCK_TYPE_SEQPACKET && sim_chance(s, 10))
		flags |= VSOCK_MSG_TRUNC;
	(void)do_recv(s, ss, sim_size(s, IO_MAX), flags);
}

/* The device role's zero-copy receive: look at the queued bytes, consume some of them. */
static void app_peek_consume(struct sim *s, struct sim_sock *ss)
{
	struct sim_dir *d = &s->conns[ss->conn].d[!dir_out(ss)];
	struct iovec iov[4];
	ssize_t total = vsock_sock_rx_peek_iov(ss->s, iov, 4);
	size_t seen = 0, n;

	SIM_CHECK(s, total >= 0, "rx_peek_iov: %zd", total);
	SIM_CHECK(s, total == 0 || !d->eof, "conn %d: data after EOF", ss->conn);
	SIM_CHECK(s, d->recvd + (uint64_t)total <= d->sent,
	          "conn %d: %zd bytes queued after %llu read, only %llu sent", ss->conn, total,
	          (unsigned long long)d->recvd, (unsigned long long)d->sent);
	for (int i = 0; i < 4 && seen < (size_t)total; i++) {
		check_bytes(s, ss, d->key, d->recvd + seen, iov[i].iov_base, iov[i].iov_len);
		seen += iov[i].iov_len;
	}
	SIM_CHECK(s, seen == (size_t)total, "rx_peek_iov: iovecs hold %zu of %zd bytes", seen,
	          total);
	n = (size_t)sim_below(s, (uint64_t)total + 1);
	vsock_sock_rx_consume(ss->s, n);
	d->recvd += n;
	sim_trace(s, "app %s: peek_iov #%d conn %d: %zd, consume %zu", side_name(ss->side),
	          sock_idx(s, ss), ss->conn, total, n);
	resync(ss);
}

/* ---- shutdown, close, options ----------------------------------------------------------- */

static void app_shutdown(struct sim *s, struct sim_sock *ss, unsigned how)
{
	struct sim_conn *c = &s->conns[ss->conn];
	enum vsock_state st = vsock_sock_state(ss->s);
	int r = vsock_sock_shutdown(ss->s, how);

	sim_trace(s, "app %s: shutdown #%d conn %d how %u: %d", side_name(ss->side),
	          sock_idx(s, ss), ss->conn, how, r);
	if (r == 0) {
		if (how & VSOCK_SHUTDOWN_SEND) {
			ss->wr_shut = true;
			c->d[dir_out(ss)].wr_done = true;
		}
		if (how & VSOCK_SHUTDOWN_RCV)
			c->d[!dir_out(ss)].rd_shut = true;
	} else {
		SIM_CHECK(s, r == -ENOTCONN && st != VSOCK_SS_CONNECTED, "shutdown in %s: %d",
		          vsock_state_to_string(st), r);
	}
	resync(ss);
}

static void app_close(struct sim *s, struct sim_sock *ss)
{
	sim_trace(s, "app %s: close #%d (%s %s, conn %d)", side_name(ss->side), sock_idx(s, ss),
	          ss->role == ROLE_LISTENER ? "listener"
	          : ss->role == ROLE_CLIENT ? "client"
	                                    : "child",
	          vsock_state_to_string(vsock_sock_state(ss->s)), ss->conn);
	if (ss->role == ROLE_LISTENER) {
		/* The engine closes the children nobody accepted. */
		while (ss->fifo_n) {
			end_gone(&s->conns[ss->fifo[ss->fifo_head]], 1);
			ss->fifo_head = (ss->fifo_head + 1) % SIM_BACKLOG_MAX;
			ss->fifo_n--;
		}
	} else {
		end_gone(&s->conns[ss->conn], dir_out(ss));
	}
	vsock_sock_close(ss->s);
	ss->s = NULL;
}

static void app_setopt(struct sim *s, struct sim_sock *ss)
{
	uint64_t v = 128 + sim_below(s, 256 * 1024), cur = 0;
	int r;

	/*
	 * Shrinking a SEQPACKET buffer while a message is partly sent stalls the connection for
	 * good (the known engine bug that --seqpacket-shrink reproduces, see sim.c and
	 * bug-seqpacket-shrink.c): only with that flag.
	 */
	if (ss->type == VSOCK_TYPE_SEQPACKET && !s->seqpacket_shrink) {
		r = vsock_sock_getopt(ss->s, VSOCK_OPT_BUFFER_SIZE, &cur);
		SIM_CHECK(s, r == 0, "getopt BUFFER_SIZE: %d", r);
		if (v < cur)
			v = cur + sim_below(s, 4096);
	}
	r = vsock_sock_setopt(ss->s, VSOCK_OPT_BUFFER_SIZE, v);

	SIM_CHECK(s, r == 0, "setopt BUFFER_SIZE %llu: %d", (unsigned long long)v, r);
	sim_trace(s, "app %s: buffer size #%d conn %d = %llu", side_name(ss->side), sock_idx(s, ss),
	          ss->conn, (unsigned long long)v);
	resync(ss);
}

static void app_credit_request(struct sim *s, struct sim_sock *ss)
{
	enum vsock_state st = vsock_sock_state(ss->s);
	int r = vsock_sock_request_credit(ss->s);

	SIM_CHECK(s, st == VSOCK_SS_CONNECTED ? r == 0 : r == -ENOTCONN, "request_credit in %s: %d",
	          vsock_state_to_string(st), r);
	sim_trace(s, "app %s: credit request #%d: %d", side_name(ss->side), sock_idx(s, ss), r);
	resync(ss);
}

/* ---- the scheduler's application step --------------------------------------------------- */

void sim_app_setup(struct sim *s)
{
	for (int side = 0; side < 2; side++)
		for (int i = 0; i < 2; i++)
			if (sim_chance(s, 80))
				app_listen(s, side);
}

static void act_decide(struct sim *s, struct sim_sock *ss)
{
	app_decide(s, ss, sim_chance(s, 80));
}

static void act_recv(struct sim *s, struct sim_sock *ss)
{
	if (ss->stall_until <= s->step)
		app_recv(s, ss);
}

static void act_peek_consume(struct sim *s, struct sim_sock *ss)
{
	if (ss->stall_until <= s->step && ss->type == VSOCK_TYPE_STREAM)
		app_peek_consume(s, ss);
}

static void act_stall(struct sim *s, struct sim_sock *ss)
{
	ss->stall_until = s->step + 50 + sim_below(s, 2000);
	sim_trace(s, "app %s: #%d stops reading until step %llu", side_name(ss->side),
	          sock_idx(s, ss), (unsigned long long)ss->stall_until);
}

static void act_shutdown(struct sim *s, struct sim_sock *ss)
{
	app_shutdown(s, ss, 1 + (unsigned)sim_below(s, 3));
}

/* The actions on one existing socket: which sockets qualify, and what is done to one. */
static const struct {
	bool (*pred)(const struct sim_sock *ss);
	void (*fn)(struct sim *s, struct sim_sock *ss);
} sock_acts[_APP_MAX] = {
	[APP_DECIDE] = { is_undecided, act_decide },
	[APP_SEND] = { is_conn, app_send },
	[APP_RECV] = { is_conn, act_recv },
	[APP_PEEK_CONSUME] = { is_conn, act_peek_consume },
	[APP_STALL] = { is_conn, act_stall },
	[APP_SHUTDOWN] = { is_conn, act_shutdown },
	[APP_CLOSE] = { is_live, app_close },
	[APP_SETOPT] = { is_conn, app_setopt },
	[APP_CREDIT_REQ] = { is_conn, app_credit_request },
};

void sim_app_step(struct sim *s)
{
	enum sim_app_act a = (enum sim_app_act)sim_pick(s, s->w_app, _APP_MAX, s->w_app_sum);
	int side = (int)sim_below(s, 2);
	struct sim_sock *ss;

	if (sock_acts[a].fn) {
		ss = pick(s, sock_acts[a].pred);
		if (ss)
			sock_acts[a].fn(s, ss);
		return;
	}
	switch (a) {
	case APP_LISTEN:
		app_listen(s, side);
		break;
	case APP_CONNECT:
		ss = sim_chance(s, 20) ? pick(s, is_failed_client) : NULL;
		if (ss)
			app_reconnect(s, ss);
		else
			app_connect(s, side);
		break;
	case APP_ACCEPT:
		ss = pick(s, is_listener);
		if (ss && app_accept_one(s, ss) && sim_chance(s, 10)) {
			struct sim_sock *child = &s->socks[s->nsocks - 1];

			/* Closed right after accept (if accept made a record for it). */
			if (child->s && child->role == ROLE_CHILD && child->conn >= 0 &&
			    s->conns[child->conn].server == (int)s->nsocks - 1)
				app_close(s, child);
		}
		if (ss)
			resync(ss);
		break;
	default:
		break;
	}
}

/* ---- drain ------------------------------------------------------------------------------ */

void sim_app_drain_start(struct sim *s)
{
	for (unsigned i = 0; i < s->nconns; i++) {
		struct sim_conn *c = &s->conns[i];
		const struct sim_sock *cl = &s->socks[c->client];
		const struct sim_sock *sv = c->server >= 0 ? &s->socks[c->server] : NULL;

		c->healthy = cl->s && sv && sv->s && !sv->undecided && !c->reset && !c->d[0].rst &&
		             !c->d[1].rst && !c->d[0].rd_shut && !c->d[1].rd_shut &&
		             vsock_sock_state(cl->s) == VSOCK_SS_CONNECTED &&
		             vsock_sock_state(sv->s) == VSOCK_SS_CONNECTED;
	}
}

/* One pass of the ending: returns true when every application socket is closed. */
bool sim_app_drain(struct sim *s, bool *progress)
{
	bool done = true;

	for (unsigned i = 0; i < s->nsocks; i++) {
		struct sim_sock *ss = &s->socks[i];
		struct sim_dir *d;
		enum vsock_state st;
		ssize_t r;

		if (!ss->s)
			continue;
		done = false;
		if (ss->role == ROLE_LISTENER) {
			while (app_accept_one(s, ss))
				;
			app_close(s, ss);
			*progress = true;
			continue;
		}
		if (ss->undecided) {
			app_decide(s, ss, true);
			*progress = true;
		}
		st = vsock_sock_state(ss->s);
		if (st == VSOCK_SS_CONNECTING || st == VSOCK_SS_PENDING)
			continue;
		if (!ss->wr_shut && (st == VSOCK_SS_CONNECTED || st == VSOCK_SS_CLOSED)) {
			app_shutdown(s, ss, VSOCK_SHUTDOWN_SEND);
			*progress = true;
		}
		d = &s->conns[ss->conn].d[!dir_out(ss)];
		do {
			r = do_recv(s, ss, VSOCK_MAX_PKT_PAYLOAD, 0);
			if (r > 0)
				*progress = true;
		} while (r > 0);
		if (d->eof || d->rd_shut || r == -ENOTCONN) {
			app_close(s, ss);
			*progress = true;
		}
	}
	return done;
}

/* ---- hooks from the network ------------------------------------------------------------- */

int sim_app_request_pulled(struct sim *s, int side, const struct vsock_hdr *h)
{
	for (int i = (int)s->nconns - 1; i >= 0; i--) {
		struct sim_conn *c = &s->conns[i];

		if (c->cside == side && c->cport == h->src_port && c->lport == h->dst_port &&
		    !c->request_seen) {
			c->request_seen = true;
			return i;
		}
	}
	sim_fail(s, "side %d sent a REQUEST %u->%u nobody asked for", side, h->src_port,
	         h->dst_port);
}

void sim_app_request_fed(struct sim *s, int side, const struct sim_pkt *p, int r)
{
	struct sim_sock *l;
	struct sim_conn *c;

	if (r != 0)
		return;
	l = listener_at(s, side, p->h.dst_port);
	SIM_CHECK(s, l && p->conn >= 0, "side %d took a REQUEST for port %u without a listener",
	          side, p->h.dst_port);
	SIM_CHECK(s, l->fifo_n < SIM_BACKLOG_MAX, "listener queue beyond any backlog");
	c = &s->conns[p->conn];
	c->child = true;
	l->fifo[(l->fifo_head + l->fifo_n) % SIM_BACKLOG_MAX] = p->conn;
	l->fifo_n++;
	sim_cred_reset(s, side, p->h.dst_port, p->h.src_port, p->h.buf_alloc, p->h.fwd_cnt);
}

void sim_app_rst_fed(struct sim *s, int side, const struct vsock_hdr *h)
{
	for (unsigned i = 0; i < s->nconns; i++) {
		struct sim_conn *c = &s->conns[i];

		if (c->cside == side && c->cport == h->dst_port && c->lport == h->src_port)
			c->d[1].rst = true;
		else if (c->cside != side && c->lport == h->dst_port && c->cport == h->src_port)
			c->d[0].rst = true;
	}
}

void sim_app_transport_reset(struct sim *s, int side)
{
	(void)side;
	for (unsigned i = 0; i < s->nconns; i++)
		s->conns[i].reset = true;
}

void sim_check_events(struct sim *s, int side)
{
	for (unsigned i = 0; i < s->nsocks; i++) {
		struct sim_sock *ss = &s->socks[i];
		unsigned cur, gained;

		if (!ss->s || ss->side != side)
			continue;
		cur = vsock_sock_poll(ss->s);
		gained = cur & ~ss->mask_seen & WATCH_BITS;
		SIM_CHECK(s, gained == 0,
		          "%s #%d (%s) gained poll bits %#x without a sock_event (mask %#x, last "
		          "event %#x)",
		          side_name(side), (int)i, vsock_state_to_string(vsock_sock_state(ss->s)),
		          gained, cur, ss->mask_seen);
		ss->mask_seen = cur;
		if (ss->role == ROLE_CLIENT && !s->conns[ss->conn].connected &&
		    vsock_sock_state(ss->s) == VSOCK_SS_CONNECTED) {
			SIM_CHECK(s, s->conns[ss->conn].child,
			          "conn %d connected but no listener took its REQUEST", ss->conn);
			s->conns[ss->conn].connected = true;
		}
	}
}

void sim_app_close_all(struct sim *s)
{
	for (unsigned i = 0; i < s->nsocks; i++)
		if (s->socks[i].s)
			app_close(s, &s->socks[i]);
}

void sim_app_free(struct sim *s)
{
	for (unsigned i = 0; i < s->nconns; i++)
		for (int d = 0; d < 2; d++)
			free(s->conns[i].d[d].msgs);
	s->nconns = 0;
	s->nsocks = 0;
}
