/* SPDX-License-Identifier: MIT */
/*
 * The simulated network: the two engines, the virtio rings between them, the transport that
 * drives them, and the checks made on what crosses the wire.
 *
 * Rings. Guest -> host is the guest's TX ring (tx_ring slots): the guest pulls a packet while a
 * slot is free, the host feeds it while vsock_engine_can_feed() (device role; pending replies
 * are bounded, docs/vsock-protocol.md §5). Host -> guest goes through RX buffers the guest
 * posted: the host pulls only into a posted buffer (max_payload = the buffer's room), the
 * guest feeds what was filled while it can feed or while its own TX ring is full (as src/driver
 * does, so that both sides never stop at once) and reposts the buffer unless it withholds them.
 * Virtio never loses a packet: a side with no room leaves the packet queued in the engine.
 * Packets of one flow (port pair) are delivered in pull order, as a ring keeps them; packets of
 * different flows may be delivered in any order, and any packet may be delayed for some steps
 * (CREDIT_UPDATEs more often and longer).
 *
 * Checks. Every pulled header passes vsock_hdr_check and carries the sender's CIDs; an RW payload
 * never exceeds the receiver's credit as the sender last heard it (tracked from the wire alone:
 * RW bytes pulled versus the buf_alloc/fwd_cnt of the packets fed back to the sender); no engine
 * counts a credit violation, a receive-memory reset or a malformed packet; a transport that
 * found nothing to pull is told by tx_ready when something appears, and by tx_ready when a
 * timer deadline moves earlier than the one it waits for; has_pending never stays true when a
 * pull finds nothing (a transport would spin).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define WATCH_TX_FULL(s) ((s)->w[SIM_GUEST].n >= (s)->tx_ring)

static uint64_t ep_now(void *opaque)
{
	return ((struct sim_ep *)opaque)->sim->now;
}

static void ep_tx_ready(void *opaque)
{
	struct sim_ep *ep = opaque;
	struct sim *s = ep->sim;

	/* The transport wakes: it will pull again and re-read the deadline it waits for. */
	s->idle[ep->side] = false;
	s->tx_ready_calls[ep->side]++;
	s->known_deadline[ep->side] = vsock_engine_next_deadline(s->e[ep->side]);
}

static void ep_sock_event(void *opaque, struct vsock_sock *vs, void *user, unsigned mask)
{
	struct sim_sock *ss = user;

	(void)opaque;
	(void)vs;
	/* Called under the socket's lock: only record what a waiter would see. */
	if (ss)
		ss->mask_seen = mask;
}

static const struct vsock_engine_ops sim_ops = {
	.now = ep_now,
	.tx_ready = ep_tx_ready,
	.sock_event = ep_sock_event,
};

const struct vsock_engine_ops *sim_engine_ops(void)
{
	return &sim_ops;
}

static uint32_t pick_u32(struct sim *s, const uint32_t *v, unsigned n)
{
	return v[sim_below(s, n)];
}

/* Per-seed engine configuration: buffer sizes, packet sizes, limits and timeouts vary. */
static void engine_config(struct sim *s, int side, struct vsock_engine_config *cfg)
{
	static const uint32_t bufs[] = { 256 * 1024, 64 * 1024, 16 * 1024, 4096, 1024, 300 };
	static const uint32_t pkts[] = { VSOCK_MAX_PKT_PAYLOAD, 4096, 1500, 64 };

	vsock_engine_config_default(cfg);
	cfg->local_cid = side == SIM_GUEST ? 3 : VMADDR_CID_HOST;
	cfg->ops = &sim_ops;
	cfg->opaque = &s->ep[side];
	s->ep[side] = (struct sim_ep){ s, side };
	cfg->buf_size = pick_u32(s, bufs, sizeof(bufs) / sizeof(bufs[0]));
	cfg->max_pkt = sim_chance(s, 20) ? 1 + (uint32_t)sim_below(s, VSOCK_MAX_PKT_PAYLOAD)
	                                 : pick_u32(s, pkts, sizeof(pkts) / sizeof(pkts[0]));
	if (sim_chance(s, 30))
		cfg->reply_limit = 1 + (uint32_t)sim_below(s, 8);
	if (sim_chance(s, 10))
		cfg->max_socks = 4 + (uint32_t)sim_below(s, 12);
	if (sim_chance(s, 50))
		cfg->connect_timeout_ns = (1 + sim_below(s, 2000)) * 1000000ull;
	if (sim_chance(s, 50))
		cfg->close_timeout_ns = (1 + sim_below(s, 8000)) * 1000000ull;
}

void sim_net_init(struct sim *s)
{
	static const uint32_t rxlens[] = { 4096, 4096, VSOCK_MAX_PKT_PAYLOAD, 256, 1 };
	static const unsigned rings[] = { 1, 2, 4, 8, 16, 64 };

	for (int side = 0; side < 2; side++) {
		int r;

		engine_config(s, side, &s->cfg[side]);
		r = vsock_engine_new(&s->cfg[side], &s->e[side]);
		SIM_CHECK(s, r == 0, "vsock_engine_new: %d", r);
		s->known_deadline[side] = UINT64_MAX;
	}
	s->tx_ring = rings[sim_below(s, 6)];
	s->rx_ring = rings[sim_below(s, 6)];
	s->rx_posted = s->rx_ring;
	s->rx_buf_len = sim_chance(s, 15) ? 1 + (uint32_t)sim_below(s, VSOCK_MAX_PKT_PAYLOAD)
	                                  : rxlens[sim_below(s, 5)];
	s->tx_buf_len = sim_chance(s, 50) ? VSOCK_MAX_PKT_PAYLOAD
	                                  : 1 + (uint32_t)sim_below(s, VSOCK_MAX_PKT_PAYLOAD);
	s->delay_pct = (unsigned)sim_below(s, 30);
	s->credit_hold_pct = (unsigned)sim_below(s, 60);
	sim_trace(s,
	          "config: buf %u/%u max_pkt %u/%u reply_limit %u/%u max_socks %u/%u "
	          "timeouts %llu/%llu ms tx_ring %u rx_ring %u rx_buf %u tx_buf %u",
	          s->cfg[0].buf_size, s->cfg[1].buf_size, s->cfg[0].max_pkt, s->cfg[1].max_pkt,
	          s->cfg[0].reply_limit, s->cfg[1].reply_limit, s->cfg[0].max_socks,
	          s->cfg[1].max_socks, (unsigned long long)(s->cfg[0].connect_timeout_ns / 1000000),
	          (unsigned long long)(s->cfg[0].close_timeout_ns / 1000000), s->tx_ring,
	          s->rx_ring, s->rx_buf_len, s->tx_buf_len);
}

void sim_net_free(struct sim *s)
{
	for (int side = 0; side < 2; side++) {
		for (unsigned i = 0; i < s->w[side].n; i++)
			free(s->w[side].p[i].buf);
		s->w[side].n = 0;
		vsock_engine_free(s->e[side]);
		s->e[side] = NULL;
	}
}

/* Splits [buf, buf+len) into 1..3 iovecs at random points. Returns the count. */
static int split_iov(struct sim *s, uint8_t *buf, size_t len, struct iovec *iov)
{
	int n = 1 + (int)sim_below(s, 3);
	size_t off = 0;

	for (int i = 0; i < n; i++) {
		size_t take = i == n - 1 ? len - off : (size_t)sim_below(s, len - off + 1);

		iov[i] = (struct iovec){ buf + off, take };
		off += take;
	}
	return n;
}

/* ---- credit, from the wire -------------------------------------------------------------- */

static struct sim_cred *cred_find(struct sim *s, int side, uint32_t lport, uint32_t pport)
{
	for (unsigned i = 0; i < s->ncred; i++) {
		struct sim_cred *c = &s->cred[i];

		if (c->side == side && c->lport == lport && c->pport == pport)
			return c;
	}
	return NULL;
}

/* A new connection on (side, lport, pport): nothing sent, the peer's credit as given. */
void sim_cred_reset(struct sim *s, int side, uint32_t lport, uint32_t pport, uint32_t ba,
                    uint32_t fwd)
{
	struct sim_cred *c = cred_find(s, side, lport, pport);

	if (!c) {
		SIM_CHECK(s, s->ncred < SIM_MAX_CRED, "credit table full");
		c = &s->cred[s->ncred++];
	}
	*c = (struct sim_cred){ side, lport, pport, 0, ba, fwd };
}

/* An RW of len bytes left `side`: the receiver's last advertisement must cover it. */
static void cred_sent(struct sim *s, int side, const struct vsock_hdr *h)
{
	struct sim_cred *c = cred_find(s, side, h->src_port, h->dst_port);
	uint32_t in_flight;

	SIM_CHECK(s, c, "side %d sent RW %u->%u on a flow it never connected", side, h->src_port,
	          h->dst_port);
	c->tx += h->len;
	in_flight = c->tx - c->peer_fwd;
	SIM_CHECK(s, in_flight <= c->peer_ba,
	          "credit exceeded: side %d flow %u->%u has %u bytes in flight, peer buf_alloc %u "
	          "(fwd_cnt %u)",
	          side, h->src_port, h->dst_port, in_flight, c->peer_ba, c->peer_fwd);
}

/* A packet reached `side`: its credit fields are what the side now knows of the peer. */
static void cred_heard(struct sim *s, int side, const struct vsock_hdr *h)
{
	struct sim_cred *c = cred_find(s, side, h->dst_port, h->src_port);

	if (c) {
		c->peer_ba = h->buf_alloc;
		c->peer_fwd = h->fwd_cnt;
	}
}

/* ---- pulling ---------------------------------------------------------------------------- */

static uint64_t pkt_delay(struct sim *s, const struct vsock_hdr *h)
{
	if (s->draining)
		return 0;
	if (h->op == VSOCK_OP_CREDIT_UPDATE && sim_chance(s, s->credit_hold_pct))
		return 20 + sim_below(s, 300);
	if (sim_chance(s, s->delay_pct))
		return 1 + sim_below(s, 50);
	return 0;
}

bool sim_pull(struct sim *s, int side)
{
	struct vsock_engine *e = s->e[side];
	struct sim_wire *w = &s->w[side];
	uint32_t cap = side == SIM_GUEST ? s->tx_buf_len : s->rx_buf_len;
	struct iovec iov[3];
	struct sim_pkt *p;
	struct vsock_hdr h;
	enum vsock_hdr_error herr;
	bool pending;
	uint8_t *buf;
	ssize_t r;
	int n;

	if (side == SIM_GUEST ? w->n >= s->tx_ring : s->rx_posted == 0)
		return false;
	if (side == SIM_GUEST && !s->draining && sim_chance(s, 3))
		cap = (uint32_t)sim_below(s, 200); /* a short buffer now and then, even 0 */
	pending = vsock_engine_has_pending(e);
	buf = malloc(cap ? cap : 1);
	SIM_CHECK(s, buf, "out of memory");
	n = split_iov(s, buf, cap, iov);
	r = vsock_engine_pull(e, &h, iov, n, cap);
	if (r == -EAGAIN) {
		free(buf);
		if (cap > 0) {
			SIM_CHECK(s, !vsock_engine_has_pending(e),
			          "side %d: has_pending still true after pull found nothing (%s)",
			          side, pending ? "it was true before" : "false before");
			s->idle[side] = true;
		}
		sim_net_observe(s, side);
		return false;
	}
	SIM_CHECK(s, r >= 0, "side %d: pull returned %zd", side, r);
	SIM_CHECK(s, pending, "side %d: pull produced a packet while has_pending was false", side);
	SIM_CHECK(s, (size_t)r == h.len && h.len <= cap,
	          "side %d: pull returned %zd, len %u, cap %u", side, r, h.len, cap);
	herr = vsock_hdr_check(&h, h.len);
	SIM_CHECK(s, herr == VSOCK_HDR_OK, "side %d pulled a bad header: %s", side,
	          vsock_hdr_error_to_string(herr));
	SIM_CHECK(s, h.src_cid == s->cfg[side].local_cid && h.dst_cid == s->cfg[!side].local_cid,
	          "side %d pulled %llu->%llu", side, (unsigned long long)h.src_cid,
	          (unsigned long long)h.dst_cid);
	SIM_CHECK(s, h.len <= s->cfg[side].max_pkt, "side %d: RW of %u > max_pkt %u", side, h.len,
	          s->cfg[side].max_pkt);
	s->idle[side] = false;
	p = &w->p[w->n++];
	*p = (struct sim_pkt){ .h = h, .buf = buf, .conn = -1 };
	if (side == SIM_HOST)
		s->rx_posted--;
	if (h.op == VSOCK_OP_RW)
		cred_sent(s, side, &h);
	else if (h.op == VSOCK_OP_REQUEST)
		p->conn = sim_app_request_pulled(s, side, &h);
	p->ready = s->step + pkt_delay(s, &h);
	sim_trace(s, "pull %s %s %u->%u len %u flags %u ba %u fwd %u%s", side ? "host" : "guest",
	          vsock_op_to_string(h.op), h.src_port, h.dst_port, h.len, h.flags, h.buf_alloc,
	          h.fwd_cnt, p->ready > s->step ? " (delayed)" : "");
	sim_net_observe(s, side);
	return true;
}

/* ---- delivering ------------------------------------------------------------------------- */

static bool same_flow(const struct vsock_hdr *a, const struct vsock_hdr *b)
{
	return a->src_port == b->src_port && a->dst_port == b->dst_port;
}

/*
 * Index of a random deliverable packet of w (the first of its flow, not held, not taken), or
 * -1. Packets marked in `taken` count as gone; REQUESTs are skipped when no_request.
 */
static int pick_head(struct sim *s, const struct sim_wire *w, const bool *taken, bool ignore_holds,
                     bool no_request)
{
	int cand[SIM_RING_MAX], nc = 0;

	for (unsigned i = 0; i < w->n; i++) {
		bool head = true;

		if (taken[i])
			continue;
		for (unsigned j = 0; j < i && head; j++)
			if (!taken[j] && same_flow(&w->p[j].h, &w->p[i].h))
				head = false;
		if (!head || (!ignore_holds && w->p[i].ready > s->step))
			continue;
		if (no_request && w->p[i].h.op == VSOCK_OP_REQUEST)
			continue;
		cand[nc++] = (int)i;
	}
	return nc ? cand[sim_below(s, (uint64_t)nc)] : -1;
}

static void pkt_trace(struct sim *s, int to, const struct sim_pkt *p, const char *how, int r)
{
	sim_trace(s, "feed %s %s %u->%u len %u flags %u ba %u fwd %u%s: %d", to ? "host" : "guest",
	          vsock_op_to_string(p->h.op), p->h.src_port, p->h.dst_port, p->h.len, p->h.flags,
	          p->h.buf_alloc, p->h.fwd_cnt, how, r);
}

/* What `to` learns from a packet before the engine sees it. */
static void pkt_heard(struct sim *s, int to, const struct sim_pkt *p)
{
	cred_heard(s, to, &p->h);
	if (p->h.op == VSOCK_OP_RST)
		sim_app_rst_fed(s, to, &p->h);
	if (p->h.op == VSOCK_OP_RW) {
		s->bytes_moved += p->h.len;
		s->msgs_moved++;
	}
}

bool sim_deliver(struct sim *s, int to, bool batch, bool ignore_holds)
{
	struct sim_wire *w = &s->w[!to];
	bool taken[SIM_RING_MAX] = { false };
	struct vsock_pkt_ref refs[8];
	struct iovec iovs[8][3];
	unsigned n = 0, keep = 0;
	int i;

	if (w->n == 0)
		return false;
	if (to == SIM_HOST && !vsock_engine_can_feed(s->e[SIM_HOST]))
		return false;
	if (to == SIM_GUEST && !vsock_engine_can_feed(s->e[SIM_GUEST]) && !WATCH_TX_FULL(s))
		return false;
	i = pick_head(s, w, taken, ignore_holds, false);
	if (i < 0)
		return false;
	if (!batch || w->p[i].h.op == VSOCK_OP_REQUEST) {
		struct sim_pkt *p = &w->p[i];
		struct iovec iov[3];
		int cnt = split_iov(s, p->buf, p->h.len, iov);
		int r;

		pkt_heard(s, to, p);
		r = vsock_engine_feed(s->e[to], &p->h, iov, cnt);
		pkt_trace(s, to, p, "", r);
		if (p->h.op == VSOCK_OP_REQUEST)
			sim_app_request_fed(s, to, p, r);
		taken[i] = true;
		n = 1;
	} else {
		unsigned want = 2 + (unsigned)sim_below(s, 7);

		while (i >= 0 && n < want) {
			struct sim_pkt *p = &w->p[i];

			pkt_heard(s, to, p);
			refs[n] = (struct vsock_pkt_ref){ p->h, iovs[n], 0 };
			refs[n].iovcnt = split_iov(s, p->buf, p->h.len, iovs[n]);
			pkt_trace(s, to, p, " (batch)", 0);
			taken[i] = true;
			n++;
			i = pick_head(s, w, taken, ignore_holds, true);
		}
		vsock_engine_feed_batch(s->e[to], refs, n);
	}
	for (unsigned j = 0; j < w->n; j++) {
		if (taken[j])
			free(w->p[j].buf);
		else
			w->p[keep++] = w->p[j];
	}
	w->n = keep;
	if (to == SIM_GUEST) {
		if (s->step < s->withhold_until)
			s->rx_owed += n;
		else
			s->rx_posted += n;
	}
	sim_net_observe(s, to);
	return true;
}

void sim_refill(struct sim *s)
{
	if (s->rx_owed)
		sim_trace(s, "guest reposts %u RX buffers", s->rx_owed);
	s->rx_posted += s->rx_owed;
	s->rx_owed = 0;
	s->withhold_until = 0;
}

/* ---- time and resets -------------------------------------------------------------------- */

void sim_net_observe(struct sim *s, int side)
{
	s->known_deadline[side] = vsock_engine_next_deadline(s->e[side]);
}

void sim_advance(struct sim *s, uint64_t ns)
{
	s->now += ns;
	for (int side = 0; side < 2; side++) {
		if (s->now < s->known_deadline[side])
			continue;
		sim_trace(s, "timers %s at %llu ms", side ? "host" : "guest",
		          (unsigned long long)(s->now / 1000000));
		vsock_engine_run_timers(s->e[side]);
		sim_net_observe(s, side);
		SIM_CHECK(s, s->known_deadline[side] > s->now,
		          "side %d: a timer is still due after run_timers", side);
	}
}

void sim_transport_reset(struct sim *s, int side)
{
	sim_trace(s, "TRANSPORT RESET %s", side ? "host" : "guest");
	s->had_reset = true;
	sim_app_transport_reset(s, side);
	vsock_engine_transport_reset(s->e[side], VMADDR_CID_ANY);
	sim_net_observe(s, side);
}

/* ---- checks ----------------------------------------------------------------------------- */

void sim_check_engines(struct sim *s)
{
	SIM_CHECK(s, s->rx_posted + s->rx_owed + s->w[SIM_HOST].n == s->rx_ring,
	          "RX buffer accounting: %u posted + %u owed + %u filled != %u", s->rx_posted,
	          s->rx_owed, s->w[SIM_HOST].n, s->rx_ring);
	for (int side = 0; side < 2; side++) {
		struct vsock_engine_stats st;
		uint64_t dl;

		vsock_engine_get_stats(s->e[side], &st);
		SIM_CHECK(s, st.credit_violations == 0,
		          "side %d counted a credit violation from an honest peer", side);
		SIM_CHECK(s, st.rx_mem_resets == 0,
		          "side %d reset an honest peer for receive memory", side);
		for (int i = 1; i < _VSOCK_HDR_ERROR_MAX; i++)
			SIM_CHECK(s, st.rx_dropped[i] == 0, "side %d dropped a packet as %s", side,
			          vsock_hdr_error_to_string((enum vsock_hdr_error)i));
		SIM_CHECK(s, !(s->idle[side] && vsock_engine_has_pending(s->e[side])),
		          "side %d: a packet became pullable without tx_ready (the transport "
		          "sleeps)",
		          side);
		dl = vsock_engine_next_deadline(s->e[side]);
		SIM_CHECK(s, dl >= s->known_deadline[side],
		          "side %d: a timer deadline moved earlier (%llu < %llu) without tx_ready",
		          side, (unsigned long long)dl,
		          (unsigned long long)s->known_deadline[side]);
	}
}

bool sim_net_quiet(struct sim *s)
{
	for (int side = 0; side < 2; side++) {
		struct vsock_engine_stats st;

		vsock_engine_get_stats(s->e[side], &st);
		if (s->w[side].n || vsock_engine_has_pending(s->e[side]) || st.socks_open ||
		    vsock_engine_next_deadline(s->e[side]) != UINT64_MAX)
			return false;
	}
	return true;
}
