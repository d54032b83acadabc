/* SPDX-License-Identifier: MIT */
/*
 * The sibling port of a device (sibling.h, vsock_dev.h: guest-to-guest routing between devices of one
 * process, as vhost-device-vsock's groups): the reference-counted struct sib_port with its
 * bounded inbox (device_internal.h), the hand-off of our guest's packets to a sibling's inbox
 * (copied into a buffer of our pool, below; held per sibling while it is full, dropped once it
 * is congested), the delivery of our inbox to our guest's RX ring in pieces (dev_sib_rx, for
 * rx_fill in device.c), the budget of REQUESTs a sibling did not accept (a REQUEST beyond it
 * waits in the sender: "REQUESTs a sibling does not accept" below), the wakeups between the
 * devices' loops, linking (vsock_dev_link_sibling), and the detach of a device that is freed
 * while its siblings run (dev_sib_detach: what was queued for it is dropped and answered with
 * an RST, as sib_reject does for what is sent to it later).
 *
 * A sibling whose inbox is full does not stop our TX ring (only our own excess does, see the
 * end of this comment). A sibling's inbox is the RX queue of
 * a peer, and a full peer RX queue is the peer's problem, not the sender's: vhost-net drops
 * what a guest sends to a backend that takes nothing (the tap queue is full; the TX ring goes
 * on), and Linux vhost-vsock never blocks a guest's TX on another VM. Waiting in the ring for
 * one destination (as this file did: one staged packet stopped the whole ring for up to
 * DEV_SIB_STALL_NS) lets any sibling that does not drain stall everything else our guest sends,
 * its host traffic included: a sibling that floods us with REQUESTs to closed ports and takes
 * no RX packet fills its inbox with our guest's RSTs, and each further RST stopped the ring.
 * vsock, unlike a network, has no retransmission, so data cannot simply be dropped either; the
 * ring order is not needed though (every chain is copied, so its buffer can go back at once),
 * only the order per destination. Hence, per packet of our guest for a full sibling:
 *  - an RST is a reply, and is dropped (sibling_replies_dropped): the peer that does not drain
 *    loses an answer it would get again for its next packet on that connection (a packet for
 *    no socket is answered with an RST, virtio 1.2 §5.10.6.3; Linux
 *    net/vmw_vsock/virtio_transport_common.c, virtio_transport_recv_pkt());
 *  - anything else is held for that sibling (struct sib_hold, in order) and handed over as soon
 *    as its inbox has room; packets to it that come later queue behind, packets to every other
 *    destination go on. What is held is bounded per device (DEV_SIB_HOLD_PKTS / _BYTES) and in
 *    time: a sibling that makes no room within DEV_SIB_STALL_NS is congested, its held packets
 *    are dropped, and from then on, until it drains to half, what is sent to it is dropped at
 *    once. A packet dropped this way is answered with an RST from the sibling to our guest, so
 *    that its connection fails at once (ECONNRESET) instead of hanging with a hole in its
 *    stream, as for a sibling that is gone. When the bound is reached (our guest sends faster
 *    than a live sibling drains: credit allows many small packets in flight, more than the inbox
 *    and the hold take), the packet is held anyway and the TX ring waits (DEV_TX_SIBLING_FULL)
 *    until the sibling makes room or is found congested: back-pressure on the guest that sends,
 *    never an RST on a healthy connection, and never longer than DEV_SIB_STALL_NS.
 * RSTs the device makes (for our guest, or for a freed sibling's senders) are dropped too when
 * the inbox they are for is full.
 *
 * Packet buffers, with no allocation per packet (docs/performance.md §8): a sibling packet
 * is copied once out of our guest's TX buffer into a buffer of our port's pool (struct
 * sib_pool), and once from there into the sibling guest's RX buffer by the sibling's thread,
 * which then gives the buffer back to our pool. The pool keeps freed buffers in three size
 * classes (a header, 4 KiB, 64 KiB of payload) up to a bounded number each; its owner (our
 * device's thread) takes from and puts back to its free lists without a lock or an atomic, and
 * other threads return buffers through a lock-free stack (push only; the owner takes the whole
 * stack at once with an exchange, so no ABA). Each buffer handed out holds a reference to its
 * pool, so a pool outlives its device for as long as a sibling still holds one of its buffers;
 * buffers returned to a pool whose device is gone are freed.
 *
 * Threads: everything here runs on the owning device's thread, except what touches another
 * device's port: its inbox under inbox.lock, its wakeups only while it is not closed, its pool's
 * return stack.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_internal.h"
#include "ops/vmlog.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/time.h"

static void sib_pend_drop(struct vsock_dev *d);

/* ---- packet buffers: the port's pool ---------------------------------------------------- */

#define SIB_CLASSES 3

/* Payload room and number of free buffers kept, per class (at most ~1.4 MiB per device). */
static const uint32_t sib_class_room[SIB_CLASSES] = { 256, 4096, VSOCK_MAX_PKT_PAYLOAD };
static const unsigned sib_class_keep[SIB_CLASSES] = { 256, 64, 16 };

/* In front of every struct sib_pkt; the packet starts SIB_BUF_OFF bytes after it. */
struct sib_buf {
	struct sib_pool *pool;   /* NULL: allocated without a pool (freed at once) */
	struct sib_buf *next;    /* in a free list or the return stack */
	unsigned cls;
};

#define SIB_BUF_OFF ((sizeof(struct sib_buf) + _Alignof(max_align_t) - 1) & \
		     ~(_Alignof(max_align_t) - 1))

struct sib_pool {
	_Atomic(struct sib_buf *) returned; /* buffers given back by other threads */
	struct sib_buf *free[SIB_CLASSES];   /* owner's thread only */
	unsigned nfree[SIB_CLASSES];
	atomic_uint refs;                    /* the owning port's + one per buffer handed out */
	atomic_bool dead;                    /* the owner is gone: returned buffers are freed */
};

static struct sib_buf *sib_buf_of(struct sib_pkt *p)
{
	return (struct sib_buf *)((uint8_t *)p - SIB_BUF_OFF);
}

static struct sib_pkt *sib_pkt_of(struct sib_buf *b)
{
	return (struct sib_pkt *)((uint8_t *)b + SIB_BUF_OFF);
}

/* Frees every buffer of the list b. */
static void sib_buf_free_list(struct sib_buf *b)
{
	while (b) {
		struct sib_buf *next = b->next;

		free(b);
		b = next;
	}
}

static void sib_pool_unref(struct sib_pool *pl)
{
	/* acq_rel: every holder's use of the pool happens before the last one frees it. */
	if (atomic_fetch_sub_explicit(&pl->refs, 1, memory_order_acq_rel) != 1)
		return;
	sib_buf_free_list(atomic_exchange_explicit(&pl->returned, NULL, memory_order_acquire));
	for (unsigned c = 0; c < SIB_CLASSES; c++)
		sib_buf_free_list(pl->free[c]);
	free(pl);
}

/* Puts b on the owner's free list of its class, or frees it if that list is full. Owner only. */
static void sib_pool_keep(struct sib_pool *pl, struct sib_buf *b)
{
	if (pl->nfree[b->cls] >= sib_class_keep[b->cls]) {
		free(b);
		return;
	}
	b->next = pl->free[b->cls];
	pl->free[b->cls] = b;
	pl->nfree[b->cls]++;
}

/*
 * A buffer for a packet with len payload bytes, from the pool of d's port (d's thread). Returns
 * the packet (header fields zeroed) or NULL (-ENOMEM).
 */
static struct sib_pkt *sib_pkt_alloc(struct vsock_dev *d, uint32_t len)
{
	struct sib_pool *pl = d->sib.port ? d->sib.port->pool : NULL;
	struct sib_buf *b = NULL;
	unsigned c = 0;

	while (c < SIB_CLASSES - 1 && len > sib_class_room[c])
		c++;
	if (pl && !pl->free[c]) {
		/* Acquire: pairs with the release CAS of sib_pkt_free; takes the whole stack. */
		struct sib_buf *r = atomic_exchange_explicit(&pl->returned, NULL,
							     memory_order_acquire);

		while (r) {
			struct sib_buf *next = r->next;

			sib_pool_keep(pl, r);
			r = next;
		}
	}
	if (pl && pl->free[c]) {
		b = pl->free[c];
		pl->free[c] = b->next;
		pl->nfree[c]--;
	} else {
		b = malloc(SIB_BUF_OFF + sizeof(struct sib_pkt) + sib_class_room[c]);
		if (!b)
			return NULL;
		b->cls = c;
	}
	b->pool = pl;
	if (pl)
		atomic_fetch_add_explicit(&pl->refs, 1, memory_order_relaxed);
	memset(sib_pkt_of(b), 0, sizeof(struct sib_pkt));
	return sib_pkt_of(b);
}

/*
 * Gives p's buffer back to its pool: straight to the free list if d's port owns the pool (we
 * are its thread), else through the pool's return stack; freed if the pool's device is gone.
 */
static void sib_pkt_free(struct vsock_dev *d, struct sib_pkt *p)
{
	struct sib_buf *b, *head;
	struct sib_pool *pl;

	if (!p)
		return;
	b = sib_buf_of(p);
	pl = b->pool;
	if (!pl) {
		free(b);
		return;
	}
	if (d->sib.port && d->sib.port->pool == pl && !atomic_load_explicit(&pl->dead,
								    memory_order_relaxed)) {
		sib_pool_keep(pl, b);
	} else if (atomic_load_explicit(&pl->dead, memory_order_relaxed)) {
		free(b);
	} else {
		head = atomic_load_explicit(&pl->returned, memory_order_relaxed);
		/* Release: b->next (and the buffer) visible to the owner's acquire exchange. */
		do {
			b->next = head;
		} while (!atomic_compare_exchange_weak_explicit(&pl->returned, &head, b,
							       memory_order_release,
							       memory_order_relaxed));
	}
	/* Our reference, held while the buffer was out (also across the push above). */
	sib_pool_unref(pl);
}

/*
 * The device of port is being freed: its pool keeps no buffers any more, and buffers still held
 * by siblings are freed when they come back (the last one frees the pool).
 */
static void sib_pool_close(struct sib_port *port)
{
	struct sib_pool *pl = port->pool;

	if (!pl)
		return;
	atomic_store_explicit(&pl->dead, true, memory_order_relaxed);
	for (unsigned c = 0; c < SIB_CLASSES; c++) {
		sib_buf_free_list(pl->free[c]);
		pl->free[c] = NULL;
		pl->nfree[c] = 0;
	}
	port->pool = NULL;
	sib_pool_unref(pl);
}

/* ---- the ports and the inbox ----------------------------------------------------------------- */

/* Packets in the inbox: exact under in->lock, a hint without it (relaxed: the lock, not count,
 * publishes the packets). */
static unsigned inbox_count(struct sib_inbox *in)
{
	return atomic_load_explicit(&in->count, memory_order_relaxed);
}

/*
 * Fair shares. Every packet in an inbox is counted to its sender, told by the packet's source
 * CID (a sibling's guest, the host for datagrams from host programs, the sibling an RST a device
 * made is from), in in->src[]. While the inbox is less than half full, anyone's packet goes in.
 * From half full on, a sender gets at most an equal part of it, DEV_INBOX_PKTS / n packets and
 * DEV_INBOX_BYTES / n bytes, n being the senders with packets queued or refused within
 * DEV_SIB_STALL_NS: a sender that floods a slow target keeps what it has, and the room the
 * target makes goes to the others until the flood is down to its share. Without this, a
 * sibling's datagram flood refilled every slot the target freed before anyone else could: the
 * target's host datagrams and a third sibling's datagrams were dropped and its connects held
 * until they timed out with an RST (docs/hostile-scenarios.md). A refused sender that waits
 * (want_room) is woken as soon as a packet taken leaves it under its share, not only when the
 * inbox is down to half.
 */

/*
 * in->src's slot of the sender cid: its own, or a free one taken for it (never used, or whose
 * sender has nothing queued and was not refused within DEV_SIB_STALL_NS), or -1 when all
 * DEV_INBOX_SRCS are in use. *now: mono_ns(), read here if 0 and needed. Under in->lock.
 */
static int inbox_src(struct sib_inbox *in, uint32_t cid, uint64_t *now)
{
	int idle = -1;

	for (unsigned i = 0; i < in->n_src; i++) {
		const struct sib_src *s = &in->src[i];

		if (s->cid == cid)
			return (int)i;
		if (idle < 0 && !s->cid)
			idle = (int)i;
	}
	if (idle < 0 && in->n_src < DEV_INBOX_SRCS)
		idle = (int)in->n_src++;
	for (unsigned i = 0; idle < 0 && i < in->n_src; i++) {
		const struct sib_src *s = &in->src[i];

		if (!*now)
			*now = mono_ns();
		if (!s->pkts && *now - s->refused_ns >= DEV_SIB_STALL_NS)
			idle = (int)i;
	}
	if (idle >= 0)
		in->src[idle] = (struct sib_src){ .cid = cid };
	return idle;
}

/* Senders that want a share of in: packets queued, or refused within DEV_SIB_STALL_NS of now;
 * slot self counts in any case (-1: a sender without a slot, which counts; -2: none). Under
 * in->lock. */
static unsigned inbox_senders(const struct sib_inbox *in, uint64_t now, int self)
{
	unsigned n = self == -1 ? 1 : 0;

	for (unsigned i = 0; i < in->n_src; i++) {
		const struct sib_src *s = &in->src[i];

		if ((int)i == self ||
		    (s->cid && (s->pkts || (s->refused_ns && now - s->refused_ns < DEV_SIB_STALL_NS))))
			n++;
	}
	return n;
}

/* Slot s (-1: a sender without one) would be over its share with len more bytes. */
static bool inbox_over_share(const struct sib_inbox *in, int s, uint32_t len, uint64_t now)
{
	unsigned n = inbox_senders(in, now, s);

	if (s < 0)
		return true;
	return in->src[s].pkts + 1 > DEV_INBOX_PKTS / n ||
	       in->src[s].bytes + len > DEV_INBOX_BYTES / n;
}

/*
 * Whether p may go into in now (see "Fair shares"): 0 (and p is counted to its sender), -ENOBUFS
 * (full, or half full and its sender has its share; the refusal is noted), -EBUSY (as -ENOBUFS,
 * and the inbox is congested: p is not to be held). Under in->lock.
 */
static int inbox_admit(struct sib_inbox *in, struct sib_pkt *p)
{
	uint32_t len = p->hdr.len;
	unsigned count = inbox_count(in);
	bool full = count == DEV_INBOX_PKTS || in->bytes + len > DEV_INBOX_BYTES;
	bool busy = count >= DEV_INBOX_PKTS / 2 || in->bytes + len > DEV_INBOX_BYTES / 2;
	uint64_t now = 0;
	bool over = false;
	int s = inbox_src(in, (uint32_t)p->hdr.src_cid, &now);

	if (busy) {
		if (!now)
			now = mono_ns();
		over = inbox_over_share(in, s, len, now);
	}
	if (full || over) {
		if (s >= 0)
			in->src[s].refused_ns = now;
		return in->congested && (over || s < 0) ? -EBUSY : -ENOBUFS;
	}
	p->src = s < 0 ? DEV_INBOX_SRC_NONE : (uint16_t)s;
	if (s >= 0) {
		in->src[s].pkts++;
		in->src[s].bytes += len;
	}
	return 0;
}

/*
 * A sender refused within DEV_SIB_STALL_NS of now has less than half its share queued (so the
 * one sender of a stream to a slow target is still woken only at half, as before shares: one
 * wakeup per half an inbox, not per packet). Under in->lock.
 */
static bool inbox_refused_starved(struct sib_inbox *in, uint64_t now)
{
	unsigned n = 0;

	if (inbox_count(in) == DEV_INBOX_PKTS)
		return false;
	for (unsigned i = 0; i < in->n_src; i++) {
		const struct sib_src *s = &in->src[i];

		if (!s->cid || !s->refused_ns || now - s->refused_ns >= DEV_SIB_STALL_NS)
			continue;
		if (!n)
			n = inbox_senders(in, now, -2);
		if (s->pkts * 2 < DEV_INBOX_PKTS / n && s->bytes * 2 < DEV_INBOX_BYTES / n)
			return true;
	}
	return false;
}

/* Appends p (room checked by the caller). Under in->lock. */
static void inbox_put(struct sib_inbox *in, struct sib_pkt *p)
{
	unsigned n = inbox_count(in);

	in->ring[(in->head + n) % DEV_INBOX_PKTS] = p;
	atomic_store_explicit(&in->count, n + 1, memory_order_relaxed);
}

/* Removes the oldest packet (the inbox is not empty). Under in->lock. */
static struct sib_pkt *inbox_get(struct sib_inbox *in)
{
	struct sib_pkt *p = in->ring[in->head];

	in->head = (in->head + 1) % DEV_INBOX_PKTS;
	atomic_store_explicit(&in->count, inbox_count(in) - 1, memory_order_relaxed);
	if (p->src != DEV_INBOX_SRC_NONE) {
		struct sib_src *s = &in->src[p->src];

		s->pkts--;
		s->bytes -= p->hdr.len;
		if (!s->pkts && !s->refused_ns)
			s->cid = 0; /* free */
	}
	return p;
}

/* Index of the sibling with that CID in d->sib.sibs (and d->sib.hold), or -1. */
static int sib_find(const struct vsock_dev *d, uint64_t cid)
{
	unsigned lo = 0, hi = d->sib.n_sibs;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		const struct sib_port *s = d->sib.sibs[mid];

		if (s->cid == cid)
			return (int)mid;
		if (s->cid < cid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

struct sib_port *dev_sib_lookup(struct vsock_dev *d, uint64_t cid)
{
	int i = sib_find(d, cid);

	return i < 0 ? NULL : d->sib.sibs[i];
}

static void sib_port_unref(struct sib_port *p)
{
	/* acq_rel: each holder's use of p happens before the last one frees it. */
	if (!p || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
		return;
	/* Closed by its device before the device's own reference went: the inbox is empty. */
	pthread_mutex_destroy(&p->inbox.lock);
	free(p);
}

static bool sib_port_closed(struct sib_port *p)
{
	return atomic_load_explicit(&p->closed, memory_order_relaxed);
}

/*
 * Wakes the loop of p's device: its inbox_async (room false) or its room_async (room true),
 * unless the device was freed. Under p's lock: vsock_dev_free closes p under it before it frees
 * the loop the wakeups belong to.
 */
static void sib_port_signal(struct sib_port *p, bool room)
{
	pthread_mutex_lock(&p->inbox.lock);
	if (!sib_port_closed(p))
		loop_async_send(room ? p->room_async : p->inbox_async);
	pthread_mutex_unlock(&p->inbox.lock);
}

/*
 * Hands p to t's inbox. Returns 0, -ENOBUFS if full (if wait, t will wake our room_async when it
 * has room again), -EBUSY if full and congested (drop p), or -EPIPE if t's device was freed
 * (drop p).
 */
static int sib_push(struct sib_port *t, struct sib_pkt *p, bool wait)
{
	struct sib_inbox *in = &t->inbox;
	int r = 0;

	pthread_mutex_lock(&in->lock);
	if (sib_port_closed(t)) {
		r = -EPIPE;
	} else if ((r = inbox_admit(in, p)) < 0) {
		/* A congested target is not waited for: its guest is not taking packets. */
		if (r == -ENOBUFS && wait)
			in->want_room = true;
	} else {
		/* Published under the lock; count is also read without it as a hint. */
		inbox_put(in, p);
		in->bytes += p->hdr.len;
	}
	pthread_mutex_unlock(&in->lock);
	return r;
}

/*
 * Queues an RST from h's destination to h's source into t2's inbox (h: a packet sent to a
 * sibling that is gone or takes nothing), as Linux answers a packet for which no socket exists:
 * the connection fails at once instead of waiting for its own timeouts. Nothing is sent for an
 * RST. Returns 0 if queued (the caller wakes t2's device), -EINVAL for an RST, -ENOBUFS if t2's
 * inbox is full (its guest times out instead), -EPIPE if t2 is closed too, -ENOMEM.
 */
static int sib_queue_rst(struct vsock_dev *d, struct sib_port *t2, const struct vsock_hdr *h)
{
	struct sib_inbox *in = &t2->inbox;
	struct sib_pkt *p;
	int r = 0;

	if (h->op == VSOCK_OP_RST)
		return -EINVAL;
	p = sib_pkt_alloc(d, 0);
	if (!p)
		return -ENOMEM;
	*p = (struct sib_pkt){
		.hdr = { .src_cid = h->dst_cid, .dst_cid = h->src_cid, .src_port = h->dst_port,
			 .dst_port = h->src_port, .type = h->type, .op = VSOCK_OP_RST },
		.made = true,
	};
	pthread_mutex_lock(&in->lock);
	if (sib_port_closed(t2))
		r = -EPIPE;
	else if (inbox_admit(in, p) < 0)
		r = -ENOBUFS;
	else
		inbox_put(in, p);
	pthread_mutex_unlock(&in->lock);
	if (r < 0)
		sib_pkt_free(d, p);
	return r;
}

/*
 * Our guest's packet h for a sibling is dropped (the sibling is gone or congested): counted as
 * a sibling drop (which operators see as no_route) and answered with an RST from that sibling,
 * delivered by rx_fill.
 */
static void sib_reject(struct vsock_dev *d, const struct vsock_hdr *h)
{
	DEV_STAT_ADD(d, sibling_dropped, 1);
	switch (sib_queue_rst(d, d->sib.port, h)) {
	case 0:
		d->rx_more = true;
		break;
	case -ENOBUFS:
	case -ENOMEM:
		DEV_STAT_ADD(d, sibling_replies_dropped, 1);
		break;
	}
}

static void sib_wake_senders(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->sib.n_sibs; i++)
		sib_port_signal(d->sib.sibs[i], true);
}

/*
 * Takes the oldest packet of our inbox, or NULL. The inbox is emptied in batches, up to
 * DEV_SIB_TAKE packets / DEV_SIB_TAKE_BYTES under one lock into d->sib.taken (one lock and
 * unlock per batch, not per packet: under a sibling's flood they were a sixth of the victim's
 * device thread, docs/hostile-scenarios.md), and handed out from there in order.
 */
static struct sib_pkt *sib_take(struct vsock_dev *d)
{
	struct sib_inbox *in = &d->sib.port->inbox;
	size_t bytes = 0;
	bool wake = false;
	unsigned n = 0;

	if (d->sib.i_taken < d->sib.n_taken)
		return d->sib.taken[d->sib.i_taken++];
	if (!inbox_count(in))
		return NULL;
	pthread_mutex_lock(&in->lock);
	while (n < DEV_SIB_TAKE && inbox_count(in) &&
	       (!n || bytes + in->ring[in->head]->hdr.len <= DEV_SIB_TAKE_BYTES)) {
		struct sib_pkt *p = inbox_get(in);

		in->bytes -= p->hdr.len;
		bytes += p->hdr.len;
		d->sib.taken[n++] = p;
	}
	if (n) {
		if (inbox_count(in) <= DEV_INBOX_PKTS / 2 && in->bytes <= DEV_INBOX_BYTES / 2) {
			in->congested = false;
			wake = in->want_room;
		} else if (in->want_room) {
			/* A waiting sender under its share need not wait for half (Fair shares). */
			wake = inbox_refused_starved(in, mono_ns());
		}
		if (wake)
			in->want_room = false;
	}
	pthread_mutex_unlock(&in->lock);
	if (wake)
		sib_wake_senders(d);
	d->sib.n_taken = n;
	d->sib.i_taken = n ? 1 : 0;
	return n ? d->sib.taken[0] : NULL;
}

/* The sibling inbox as an RX producer (struct dev_rx_src): something waits for our RX ring. */
static size_t sib_rx_pending(struct vsock_dev *d)
{
	return d->sib.rx_cur || d->sib.i_taken < d->sib.n_taken ||
	       inbox_count(&d->sib.port->inbox) ? 1 : 0;
}

/* Drops everything queued for our guest (RX not running). */
void dev_sib_drop_all(struct vsock_dev *d)
{
	struct sib_pkt *p;

	if (d->sib.rx_cur) {
		sib_pkt_free(d, d->sib.rx_cur);
		d->sib.rx_cur = NULL;
		DEV_STAT_ADD(d, sibling_dropped, 1);
	}
	while ((p = sib_take(d))) {
		sib_pkt_free(d, p);
		DEV_STAT_ADD(d, sibling_dropped, 1);
	}
}

/*
 * The packet sib_rx_fill delivers next: the one partly delivered, or the oldest of the inbox
 * that is not a datagram our guest cannot take whole in room bytes (those are dropped,
 * counted by dev_dgram_rx_ok; rx_more set so that the engine's packets are not left waiting if
 * nothing is left). NULL if none.
 */
static struct sib_pkt *sib_next_rx(struct vsock_dev *d, size_t room)
{
	struct sib_pkt *p;

	if (d->sib.rx_cur)
		return d->sib.rx_cur;
	while ((p = sib_take(d)) && p->hdr.type == VSOCK_TYPE_DGRAM &&
	       !dev_dgram_rx_ok(d, &p->hdr, room)) {
		sib_pkt_free(d, p);
		d->rx_more = true;
	}
	return p;
}

/* ---- REQUESTs a sibling does not accept --------------------------------------------------- */

/*
 * A sibling's guest that floods another with REQUESTs to ports where nobody listens costs the
 * target's device and guest the work of taking each REQUEST and answering it with an RST, on
 * CPU the two share with everything else (docs/hostile-scenarios.md, k: the victim kept 28 %
 * of its throughput). In Linux a refused connect costs the one that connects: its own CPU (for
 * a guest, the VM's own vCPU and vhost worker). Here the sender is paced instead: each sender
 * has, per sibling, a budget of REQUESTs that sibling did not accept, DEV_SIB_REQ_BURST at
 * once and one more every DEV_SIB_REQ_NS. Every REQUEST our guest sends it is charged; a
 * RESPONSE from it that our guest takes pays one back (the connection was accepted), and time
 * pays back the rest. A REQUEST beyond the budget is not dropped and not answered here: it
 * waits (d->sib.paced) and our TX ring waits with it, until the budget has room (pace_timer),
 * and then goes to the sibling like any other (so its answer, RST or RESPONSE, is the
 * sibling's own, never a guess from the past: a port that listens now is connected to, and a
 * closed one answers with its RST, at most DEV_SIB_REQ_NS later than without the budget). A
 * guest whose connects are accepted, or that is refused fewer than 1000 times a second, never
 * waits; a flooder's ring stops, so its own guest and device thread stop spending CPU on it.
 * All of this is the sender's device thread's own state (struct sib_hold), without a lock.
 */

/* What time paid back of ho's debt by now. */
static void sib_req_refill(const struct vsock_dev *d, struct sib_hold *ho, uint64_t now)
{
	uint64_t k;

	if (!ho->req_debt || !d->sib.req_ns || now <= ho->req_since)
		return;
	k = (now - ho->req_since) / d->sib.req_ns;
	if (k >= ho->req_debt) {
		ho->req_debt = 0;
		return;
	}
	ho->req_debt -= (uint32_t)k;
	ho->req_since += k * d->sib.req_ns;
}

/* Charges one REQUEST to ho's budget. Returns false (nothing charged) if it has no room. */
static bool sib_req_charge(struct vsock_dev *d, struct sib_hold *ho)
{
	uint64_t now = mono_ns();

	sib_req_refill(d, ho, now);
	if (ho->req_debt >= d->sib.req_burst)
		return false;
	if (!ho->req_debt)
		ho->req_since = now;
	ho->req_debt++;
	return true;
}

/* Arms pace_timer for when the budget the paced REQUEST waits for has room (never, if only a
 * RESPONSE can make it: req_ns 0). */
static void sib_pace_arm(struct vsock_dev *d)
{
	int i = sib_find(d, d->sib.paced_cid);

	if (i >= 0 && d->sib.req_ns)
		loop_timer_arm(d->sib.pace_timer, d->sib.hold[i].req_since + d->sib.req_ns);
}

/* Our guest took a RESPONSE from sibling cid: one REQUEST of the budget towards it is paid
 * back, and a REQUEST waiting for that budget is retried at once. */
static void sib_req_accepted(struct vsock_dev *d, uint64_t cid)
{
	int i = sib_find(d, cid);

	if (i < 0 || !d->sib.hold[i].req_debt)
		return;
	d->sib.hold[i].req_debt--;
	if (d->sib.paced && d->sib.paced_cid == cid)
		loop_timer_arm(d->sib.pace_timer, 0);
}

void dev_sib_set_req_budget(struct vsock_dev *d, uint32_t burst, uint64_t ns)
{
	d->sib.req_burst = burst;
	d->sib.req_ns = ns;
}

/*
 * The sibling half of rx_fill: puts the next piece of the oldest sibling packet (taken from the
 * inbox, or the one partly delivered) into each buffer (room bytes at most), vhost-style: each
 * piece has its own header with len = piece, EOM/EOR only on the last piece. Returns the
 * buffers filled (fewer than nb when no packet is left).
 */
static unsigned sib_rx_fill(struct vsock_dev *d, struct dev_rx_buf *b, unsigned nb)
{
	struct iovec piov[DEV_RX_IOV_MAX];
	unsigned k;

	for (k = 0; k < nb; k++) {
		int pn = iov_slice(b[k].iov, b[k].iovcnt, VSOCK_HDR_SIZE, b[k].room, piov,
				   DEV_RX_IOV_MAX);
		struct sib_pkt *p = pn < 0 ? NULL : sib_next_rx(d, b[k].room);
		struct vsock_hdr *h = &b[k].h;
		size_t left, n;

		if (!p)
			break;
		if (!p->off && p->hdr.op == VSOCK_OP_RESPONSE && !p->made)
			sib_req_accepted(d, p->hdr.src_cid);
		d->sib.rx_cur = p;
		left = p->hdr.len - p->off;
		n = MIN(left, b[k].room);
		*h = p->hdr;
		h->len = (uint32_t)n;
		if (n < left)
			h->flags &= ~(VSOCK_SEQ_EOM | VSOCK_SEQ_EOR);
		iov_write_at(piov, (unsigned)pn, 0, p->data + p->off, n);
		p->off += (uint32_t)n;
		if (p->off == p->hdr.len) {
			sib_pkt_free(d, p);
			d->sib.rx_cur = NULL;
		}
	}
	return k;
}

/* RX does not run: what waits for our guest is dropped (a full ring keeps it). */
static void sib_rx_park(struct vsock_dev *d, bool stopped)
{
	if (stopped)
		dev_sib_drop_all(d);
}

const struct dev_rx_src dev_sib_rx = {
	.pending = sib_rx_pending,
	.fill = sib_rx_fill,
	.park = sib_rx_park,
	.max_bufs = 1,
};

void dev_sib_wake_targets(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->sib.n_wake; i++)
		sib_port_signal(d->sib.wake[i], false);
	d->sib.n_wake = 0;
}

static void sib_note_target(struct vsock_dev *d, struct sib_port *t)
{
	for (unsigned i = 0; i < d->sib.n_wake; i++)
		if (d->sib.wake[i] == t)
			return;
	d->sib.wake[d->sib.n_wake++] = t;
}

/* ---- TX: our guest's packets to a sibling ------------------------------------------------- */

/* The one copy out of our guest: header and payload of the chain iov into a pool buffer. */
static struct sib_pkt *sib_pkt_copy(struct vsock_dev *d, const struct vsock_hdr *h,
				    const struct iovec *iov, unsigned n)
{
	struct sib_pkt *p = sib_pkt_alloc(d, h->len);

	if (!p)
		return NULL;
	p->hdr = *h;
	iov_read_at(iov, n, VSOCK_HDR_SIZE, p->data, h->len);
	return p;
}

/* Arms the stall timer for the earliest deadline of the held packets, or disarms it. */
static void sib_hold_arm(struct vsock_dev *d)
{
	uint64_t dl = UINT64_MAX;

	for (unsigned i = 0; i < d->sib.n_sibs; i++)
		if (d->sib.hold[i].head && d->sib.hold[i].deadline < dl)
			dl = d->sib.hold[i].deadline;
	if (dl == UINT64_MAX)
		loop_timer_disarm(d->sib.stage_timer);
	else
		loop_timer_arm(d->sib.stage_timer, dl);
}

/* Unlinks the oldest held packet of ho (not empty), whose next and len the caller read. */
static void sib_hold_unlink(struct vsock_dev *d, struct sib_hold *ho, struct sib_pkt *next,
			    uint32_t len)
{
	ho->head = next;
	if (!next) {
		ho->tail = NULL;
		ho->deadline = 0;
	}
	d->sib.hold_pkts--;
	d->sib.hold_bytes -= len;
}

/* Drops everything held in ho: answered with RSTs and counted if reject, else silently. */
static void sib_hold_drop(struct vsock_dev *d, struct sib_hold *ho, bool reject)
{
	while (ho->head) {
		struct sib_pkt *p = ho->head;

		sib_hold_unlink(d, ho, p->next, p->hdr.len);
		if (reject)
			sib_reject(d, &p->hdr);
		sib_pkt_free(d, p);
	}
}

bool dev_sib_hold_full(const struct vsock_dev *d)
{
	return d->sib.hold_pkts >= DEV_SIB_HOLD_PKTS || d->sib.hold_bytes >= DEV_SIB_HOLD_BYTES ||
	       d->sib.paced;
}

/*
 * Holds p (captured already) for t, whose inbox is full, behind what is held for it already.
 * Returns DEV_TX_SIBLING_FULL once the hold has reached its bound (the TX ring must wait).
 */
static enum dev_tx_verdict sib_hold_put(struct vsock_dev *d, struct sib_hold *ho,
					struct sib_pkt *p)
{
	p->next = NULL;
	if (ho->tail)
		ho->tail->next = p;
	else
		ho->head = p;
	ho->tail = p;
	d->sib.hold_pkts++;
	d->sib.hold_bytes += p->hdr.len;
	if (!ho->deadline) {
		ho->deadline = mono_ns() + DEV_SIB_STALL_NS;
		sib_hold_arm(d);
	}
	return dev_sib_hold_full(d) ? DEV_TX_SIBLING_FULL : DEV_TX_SIBLING_SENT;
}

/*
 * Hands what is held for t over, in order, while t's inbox has room; a sibling that took some
 * gets DEV_SIB_STALL_NS more. Returns true if nothing is held for t any more.
 */
static bool sib_hold_flush(struct vsock_dev *d, struct sib_port *t, struct sib_hold *ho)
{
	bool moved = false;

	while (ho->head) {
		struct sib_pkt *p = ho->head, *next = p->next;
		uint32_t len = p->hdr.len;
		int r = sib_push(t, p, true);

		if (r == -ENOBUFS)
			break;
		/* Once pushed, p is t's (it may be gone already): unlinked with what was read. */
		sib_hold_unlink(d, ho, next, len);
		if (r == 0) {
			DEV_STAT_ADD(d, sibling_fwd_pkts, 1);
			moved = true;
		} else {
			/* Gone, or congested meanwhile (another sender's stall limit). */
			sib_reject(d, &p->hdr);
			sib_pkt_free(d, p);
		}
	}
	if (moved) {
		sib_note_target(d, t);
		if (ho->head)
			ho->deadline = mono_ns() + DEV_SIB_STALL_NS;
	}
	return !ho->head;
}

/* Hands p (captured already) over to t, or holds it, or drops it (see the top). */
static enum dev_tx_verdict sib_hand_over(struct vsock_dev *d, struct sib_port *t,
					 struct sib_hold *ho, struct sib_pkt *p)
{
	bool reply = p->hdr.op == VSOCK_OP_RST;
	int r;

	if (ho->head)
		return sib_hold_put(d, ho, p);
	r = sib_push(t, p, !reply);
	if (r == 0) {
		DEV_STAT_ADD(d, sibling_fwd_pkts, 1);
		sib_note_target(d, t);
		return DEV_TX_SIBLING_SENT;
	}
	if ((r == -ENOBUFS || r == -EBUSY) && reply) {
		sib_pkt_free(d, p);
		DEV_STAT_ADD(d, sibling_replies_dropped, 1);
		return DEV_TX_DROP;
	}
	if (r == -ENOBUFS)
		return sib_hold_put(d, ho, p);
	/* Gone, or congested: dropped, and the connection fails at once. */
	sib_reject(d, &p->hdr);
	sib_pkt_free(d, p);
	return DEV_TX_DROP;
}

/* Copies a sibling-bound packet and hands it over (or holds it, or drops it: see the top; or
 * keeps a REQUEST beyond its budget: "REQUESTs a sibling does not accept"). */
enum dev_tx_verdict dev_sib_send(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
				 const struct iovec *iov, unsigned n)
{
	struct sib_hold *ho = &d->sib.hold[sib_find(d, t->cid)];
	bool reply = h->op == VSOCK_OP_RST;
	struct sib_pkt *p;

	/* A hint: a port closed after this check makes sib_push fail with -EPIPE instead. */
	if (sib_port_closed(t)) {
		sib_reject(d, h);
		return DEV_TX_DROP;
	}
	/* Something held for t: t is full unless it took all of that now. */
	if (ho->head && !sib_hold_flush(d, t, ho) && reply) {
		DEV_STAT_ADD(d, sibling_replies_dropped, 1);
		return DEV_TX_DROP;
	}
	p = sib_pkt_copy(d, h, iov, n);
	if (!p) {
		DEV_STAT_ADD(d, sibling_dropped, 1);
		return DEV_TX_DROP;
	}
	/* Before the push: once in the target's inbox, p belongs to the target's thread. A held
	 * packet is not captured again when it is handed over later. */
	OPS_TAP(&d->tap, &p->hdr, (&(struct iovec){ p->data, p->hdr.len }), 1);
	if (h->op == VSOCK_OP_REQUEST && !sib_req_charge(d, ho)) {
		d->sib.paced = p;
		d->sib.paced_cid = t->cid;
		DEV_STAT_ADD(d, sibling_requests_paced, 1);
		sib_pace_arm(d);
		return DEV_TX_SIBLING_FULL;
	}
	return sib_hand_over(d, t, ho, p);
}

/*
 * The REQUEST that waits for its budget goes on if the budget has room now (to its sibling, or
 * held for it, or answered with an RST if the sibling is gone). Returns false if it still waits.
 */
static bool sib_pace_release(struct vsock_dev *d)
{
	int i = sib_find(d, d->sib.paced_cid);
	struct sib_pkt *p = d->sib.paced;

	if (!p)
		return true;
	/* Siblings are only ever added or replaced (link_one): the CID stays. */
	if (i >= 0 && !sib_req_charge(d, &d->sib.hold[i])) {
		sib_pace_arm(d);
		return false;
	}
	d->sib.paced = NULL;
	if (i < 0 || sib_port_closed(d->sib.sibs[i])) {
		sib_reject(d, &p->hdr);
		sib_pkt_free(d, p);
		return true;
	}
	(void)sib_hand_over(d, d->sib.sibs[i], &d->sib.hold[i], p);
	return true;
}

int dev_sib_send_dgram(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
		       const struct iovec *iov, unsigned n)
{
	struct sib_pkt *p;
	int r;

	/* Hints: a port closed after this check makes sib_push fail with -EPIPE instead. */
	if (sib_port_closed(t))
		return -EPIPE;
	if (!atomic_load_explicit(&t->dgram, memory_order_relaxed))
		return -EPROTONOSUPPORT;
	p = sib_pkt_copy(d, h, iov, n);
	if (!p)
		return -ENOMEM;
	OPS_TAP(&d->tap, &p->hdr, (&(struct iovec){ p->data, p->hdr.len }), 1);
	/* Never held, never answered: a datagram that finds no room is dropped. */
	r = sib_push(t, p, false);
	if (r < 0) {
		sib_pkt_free(d, p);
		return r == -EBUSY ? -ENOBUFS : r;
	}
	DEV_STAT_ADD(d, sibling_fwd_pkts, 1);
	sib_note_target(d, t);
	return 0;
}

int dev_sib_queue_self(struct vsock_dev *d, const struct vsock_hdr *h, const void *data)
{
	struct sib_pkt *p = sib_pkt_alloc(d, h->len);
	int r;

	if (!p)
		return -ENOMEM;
	p->hdr = *h;
	p->made = true; /* not a sibling's: dev_sib_detach answers nothing for it */
	memcpy(p->data, data, h->len);
	r = sib_push(d->sib.port, p, false);
	if (r < 0) {
		sib_pkt_free(d, p);
		return r == -EBUSY ? -ENOBUFS : r;
	}
	d->rx_more = true;
	return 0;
}

bool dev_sib_retry_staged(struct vsock_dev *d)
{
	bool released = sib_pace_release(d);

	for (unsigned i = 0; i < d->sib.n_sibs; i++)
		if (d->sib.hold[i].head)
			(void)sib_hold_flush(d, d->sib.sibs[i], &d->sib.hold[i]);
	sib_hold_arm(d);
	return released && !dev_sib_hold_full(d);
}

/* ---- wakeups and the stall timer ------------------------------------------------------- */

/*
 * A deadline of the held packets passed: each sibling that made no room within DEV_SIB_STALL_NS
 * is marked congested, and what is held for it is dropped and answered with RSTs.
 */
static void stage_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;
	uint64_t now = mono_ns();

	(void)l;
	(void)t;
	if (d->frozen)
		return; /* a live upgrade's save: dev_sib_thaw arms it again */
	for (unsigned i = 0; i < d->sib.n_sibs; i++) {
		struct sib_hold *ho = &d->sib.hold[i];
		/* The port stays valid (our reference) even if its device was freed meanwhile. */
		struct sib_port *to = d->sib.sibs[i];

		/* A sibling that took some of it meanwhile got more time (sib_hold_flush). */
		if (!ho->head || ho->deadline > now || sib_hold_flush(d, to, ho) ||
		    ho->deadline > now)
			continue;
		pthread_mutex_lock(&to->inbox.lock);
		to->inbox.congested = true;
		pthread_mutex_unlock(&to->inbox.lock);
		log_vm_dev(LOG_LVL_WARN, d->cid,
			   "sibling %s takes no packets; dropping what is sent to it", to->name);
		sib_hold_drop(d, ho, true);
	}
	sib_hold_arm(d);
	dev_sib_wake_targets(d);
	dev_up.settle(d);
}

static void inbox_cb(struct loop *l, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	dev_up.settle(d);
}

/* Room in a sibling's inbox, or in the budget a paced REQUEST waits for: the TX ring goes on. */
static void room_retry(struct vsock_dev *d)
{
	if (d->frozen)
		return; /* nothing goes to a sibling until the thaw, which retries */
	dev_sib_retry_staged(d);
	dev_sib_wake_targets(d);
	if (d->tx_throttled)
		dev_up.tx_drain(d);
	dev_up.settle(d);
}

static void room_cb(struct loop *l, void *opaque)
{
	(void)l;
	room_retry(opaque);
}

static void pace_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	(void)l;
	(void)t;
	room_retry(opaque);
}

/* ---- life and links ----------------------------------------------------------------------- */

int dev_sib_init(struct vsock_dev *d)
{
	int r;

	d->sib.port = calloc(1, sizeof(*d->sib.port));
	if (!d->sib.port)
		return -ENOMEM;
	pthread_mutex_init(&d->sib.port->inbox.lock, NULL);
	atomic_init(&d->sib.port->refs, 1);
	d->sib.port->pool = calloc(1, sizeof(*d->sib.port->pool));
	if (!d->sib.port->pool)
		return -ENOMEM;
	atomic_init(&d->sib.port->pool->refs, 1);
	d->sib.port->cid = d->cid;
	memcpy(d->sib.port->name, d->name, sizeof(d->sib.port->name));
	d->sib.req_burst = DEV_SIB_REQ_BURST;
	d->sib.req_ns = DEV_SIB_REQ_NS;
	r = loop_timer_new(d->loop, stage_timer_cb, d, &d->sib.stage_timer);
	if (r < 0)
		return r;
	r = loop_timer_new(d->loop, pace_timer_cb, d, &d->sib.pace_timer);
	if (r < 0)
		return r;
	r = loop_async_new(d->loop, inbox_cb, d, &d->sib.inbox_async);
	if (r < 0)
		return r;
	r = loop_async_new(d->loop, room_cb, d, &d->sib.room_async);
	if (r < 0)
		return r;
	/* Siblings reach our loop through the port (nobody holds it yet). */
	d->sib.port->inbox_async = d->sib.inbox_async;
	d->sib.port->room_async = d->sib.room_async;
	return 0;
}

void dev_sib_drop_staged(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->sib.n_sibs; i++)
		sib_hold_drop(d, &d->sib.hold[i], false);
	if (d->sib.stage_timer)
		loop_timer_disarm(d->sib.stage_timer);
	sib_pkt_free(d, d->sib.paced);
	d->sib.paced = NULL;
	if (d->sib.pace_timer)
		loop_timer_disarm(d->sib.pace_timer);
}

/* Adds s's port to d's siblings (a reference). Returns 0 or -ENOMEM. */
static int sib_add(struct vsock_dev *d, struct vsock_dev *s)
{
	struct sib_port **v = realloc(d->sib.sibs, (d->sib.n_sibs + 1) * sizeof(*v));
	struct sib_port **w;
	struct sib_hold *ho;
	unsigned i;

	if (!v)
		return -ENOMEM;
	d->sib.sibs = v;
	w = realloc(d->sib.wake, (d->sib.n_sibs + 1) * sizeof(*w));
	if (!w)
		return -ENOMEM;
	d->sib.wake = w;
	ho = realloc(d->sib.hold, (d->sib.n_sibs + 1) * sizeof(*ho));
	if (!ho)
		return -ENOMEM;
	d->sib.hold = ho;
	for (i = d->sib.n_sibs; i > 0 && d->sib.sibs[i - 1]->cid > s->cid; i--) {
		d->sib.sibs[i] = d->sib.sibs[i - 1];
		d->sib.hold[i] = d->sib.hold[i - 1];
	}
	d->sib.hold[i] = (struct sib_hold){ 0 };
	/* relaxed: we hold a reference through s already (taking one orders nothing). */
	atomic_fetch_add_explicit(&s->sib.port->refs, 1, memory_order_relaxed);
	d->sib.sibs[i] = s->sib.port;
	d->sib.n_sibs++;
	return 0;
}

/*
 * Detaches a device that is being freed (not running) from its siblings, which may be running:
 * closes its port, so that no push or wakeup reaches it any more; drops what they had queued for
 * it, counted on each sender (peer_dropped) and answered with an RST as sib_reject does for what
 * they send later; drops what it held for them; wakes every sibling's room_async, so that one
 * holding packets for our inbox retries at once, finds the port closed and goes on; drops our
 * references.
 */
void dev_sib_detach(struct vsock_dev *d)
{
	struct sib_port *port = d->sib.port;
	struct sib_pkt *left[DEV_INBOX_PKTS + DEV_SIB_TAKE + 1];
	struct sib_inbox *in;
	unsigned n = 0;

	if (!port)
		return;
	in = &port->inbox;
	while (d->sib.i_taken < d->sib.n_taken)
		left[n++] = d->sib.taken[d->sib.i_taken++];
	pthread_mutex_lock(&in->lock);
	atomic_store_explicit(&port->closed, true, memory_order_relaxed);
	port->inbox_async = port->room_async = NULL;
	while (inbox_count(in))
		left[n++] = inbox_get(in);
	in->bytes = 0;
	pthread_mutex_unlock(&in->lock);
	if (d->sib.rx_cur) {
		left[n++] = d->sib.rx_cur;
		d->sib.rx_cur = NULL;
	}
	for (unsigned i = 0; i < n; i++) {
		struct sib_port *from = dev_sib_lookup(d, left[i]->hdr.src_cid);

		/* Not a sibling's guest packet: an RST a device made for our own guest. */
		if (from && !left[i]->made && left[i]->hdr.type != VSOCK_TYPE_DGRAM &&
		    !sib_port_closed(from)) {
			atomic_fetch_add_explicit(&from->peer_dropped, 1, memory_order_relaxed);
			if (sib_queue_rst(d, from, &left[i]->hdr) == 0)
				sib_port_signal(from, false);
		}
		sib_pkt_free(d, left[i]);
	}
	sib_pkt_free(d, d->sib.paced);
	d->sib.paced = NULL;
	sib_pend_drop(d);
	for (unsigned i = 0; i < d->sib.n_sibs; i++) {
		sib_hold_drop(d, &d->sib.hold[i], false);
		sib_port_signal(d->sib.sibs[i], true);
		sib_port_unref(d->sib.sibs[i]);
	}
	free(d->sib.sibs);
	d->sib.sibs = NULL;
	free(d->sib.hold);
	d->sib.hold = NULL;
	d->sib.n_sibs = 0;
	sib_pool_close(port);
	sib_port_unref(port);
	d->sib.port = NULL;
}

/*
 * Adds s's port to d's siblings, on d's thread (dev_call): d may be running. A closed port under
 * s's CID is a freed sibling of the same CID (a VM removed and added again): s's port replaces
 * it, and what d held for the old one is dropped with an RST to our guest, as for a sibling
 * that is gone.
 */
static int link_one(struct vsock_dev *d, void *arg)
{
	struct vsock_dev *s = arg;
	int i = sib_find(d, s->cid);

	if (i < 0)
		return sib_add(d, s);
	if (d->sib.sibs[i] == s->sib.port)
		return 0;
	if (!sib_port_closed(d->sib.sibs[i]))
		return -EINVAL;
	sib_hold_drop(d, &d->sib.hold[i], true);
	sib_port_unref(d->sib.sibs[i]);
	/* relaxed: we hold a reference through s already (taking one orders nothing). */
	atomic_fetch_add_explicit(&s->sib.port->refs, 1, memory_order_relaxed);
	d->sib.sibs[i] = s->sib.port;
	return 0;
}

int vsock_dev_link_sibling(struct vsock_dev *a, struct vsock_dev *b)
{
	int r;

	if (a == b || a->router != b->router || !a->router || a->cid == b->cid)
		return -EINVAL;
	r = dev_up.call(a, link_one, b);
	if (r < 0)
		return r;
	return dev_up.call(b, link_one, a);
}

void dev_sib_free(struct vsock_dev *d)
{
	loop_async_free(d->sib.inbox_async);
	loop_async_free(d->sib.room_async);
	loop_timer_free(d->sib.stage_timer);
	loop_timer_free(d->sib.pace_timer);
	free(d->sib.wake);
}

/* ---- live upgrade: the sibling part of the device's record (docs/upgrade.md) ------------- */

/* Tags of the sibling part (the device record's D_SIBLING list). */
enum {
	S_FLAGS = 1,        /* u32: S_F_* of our inbox */
	S_PKTS = 2,         /* list of S_PKT: our inbox, oldest first */
	S_SRCS = 3,         /* list of S_SRC: the senders' slots of our inbox (their shares) */
	S_HOLDS = 4,        /* list of S_HOLD: what our guest holds for a full sibling */
	S_PEER_DROPPED = 5, /* u64: our guest's packets a freed sibling dropped (peer_dropped) */
	S_PACED = 6,        /* list of one S_PKT: our guest's REQUEST waiting for its budget */
};
enum { S_PKT = 0x30, SP_HDR = 1, SP_DATA = 2, SP_OFF = 3, SP_FLAGS = 4, SP_SRC = 5 };
enum { S_SRC = 0x31, SS_SLOT = 1, SS_CID = 2, SS_REFUSED = 3 };
/* SH_REQ_DEBT, SH_REQ_SINCE: the REQUEST budget towards that sibling (struct sib_hold). */
enum { S_HOLD = 0x32, SH_CID = 1, SH_PKTS = 2, SH_REQ_DEBT = 3, SH_REQ_SINCE = 4 };
#define S_F_WANT_ROOM 1u
#define S_F_CONGESTED 2u
#define SP_F_MADE 1u  /* an RST or a host datagram a device made (sib_pkt.made) */
#define SP_F_TAKEN 2u /* taken out of the inbox (out of the senders' shares), waiting for RX */

static const struct rec_field sib_fields[] = {
	{ S_FLAGS, REC_U32, true, "inbox flags" },
	{ S_PKTS, REC_LIST, true, "inbox" },
	{ S_SRCS, REC_LIST, true, "inbox senders" },
	{ S_HOLDS, REC_LIST, true, "held packets" },
	{ S_PEER_DROPPED, REC_U64, true, "dropped by freed siblings" },
	{ S_PACED, REC_LIST, false, "paced REQUEST" },
};
static const struct rec_field sib_pkt_fields[] = {
	{ SP_HDR, REC_BYTES, true, "header" },
	{ SP_DATA, REC_BYTES, false, "payload" },
	{ SP_OFF, REC_U32, false, "delivered" },
	{ SP_FLAGS, REC_U32, true, "flags" },
	{ SP_SRC, REC_U32, false, "sender slot" },
};
static const struct rec_field sib_src_fields[] = {
	{ SS_SLOT, REC_U32, true, "slot" },
	{ SS_CID, REC_U32, true, "cid" },
	{ SS_REFUSED, REC_U64, true, "refused" },
};
static const struct rec_field sib_hold_fields[] = {
	{ SH_CID, REC_U32, true, "cid" },
	{ SH_PKTS, REC_LIST, false, "packets" },
	{ SH_REQ_DEBT, REC_U32, false, "REQUEST debt" },
	{ SH_REQ_SINCE, REC_U64, false, "REQUEST debt since" },
};

void dev_sib_freeze(struct vsock_dev *d)
{
	/* The stall timer would flush or drop held packets; room_cb and stage_timer_cb also look
	 * at d->frozen (an async may still fire). dev_sib_thaw arms it again. */
	if (d->sib.stage_timer)
		loop_timer_disarm(d->sib.stage_timer);
	/* The same for a paced REQUEST's timer (room_retry looks at d->frozen too). */
	if (d->sib.pace_timer)
		loop_timer_disarm(d->sib.pace_timer);
}

static void sib_save_pkt(struct rec_writer *w, const struct sib_pkt *p, uint32_t flags,
			 bool in_ring)
{
	uint8_t wire[VSOCK_HDR_SIZE];

	vsock_hdr_encode(&p->hdr, wire);
	rec_begin(w, S_PKT);
	rec_put_bytes(w, SP_HDR, wire, sizeof(wire));
	if (p->hdr.len)
		rec_put_bytes(w, SP_DATA, p->data, p->hdr.len);
	if (p->off)
		rec_put_u32(w, SP_OFF, p->off);
	rec_put_u32(w, SP_FLAGS, flags | (p->made ? SP_F_MADE : 0));
	/* Only an inbox packet is counted to a sender (a held one's src is not set yet). */
	if (in_ring && p->src != DEV_INBOX_SRC_NONE)
		rec_put_u32(w, SP_SRC, p->src);
	rec_end(w);
}

/* One S_HOLD: the packets head.., and the REQUEST budget towards cid if it owes any. */
static unsigned sib_save_hold(struct rec_writer *w, uint32_t cid, const struct sib_pkt *head,
			      uint32_t req_debt, uint64_t req_since)
{
	unsigned held = 0;

	rec_begin(w, S_HOLD);
	rec_put_u32(w, SH_CID, cid);
	if (head) {
		rec_begin(w, SH_PKTS);
		for (const struct sib_pkt *p = head; p; p = p->next, held++)
			sib_save_pkt(w, p, 0, false);
		rec_end(w);
	}
	if (req_debt) {
		rec_put_u32(w, SH_REQ_DEBT, req_debt);
		rec_put_u64(w, SH_REQ_SINCE, req_since);
	}
	rec_end(w);
	return held;
}

/*
 * Every device of the group is frozen: nobody pushes into our inbox or takes from it, and what
 * waits for our RX ring is, in delivery order, rx_cur (partly delivered), taken[i_taken..), the
 * inbox. The lock only orders our reads after the senders' last pushes.
 */
void dev_sib_save(struct vsock_dev *d, struct rec_writer *w)
{
	struct sib_inbox *in = &d->sib.port->inbox;
	unsigned n = 0, held = 0, waiting;

	pthread_mutex_lock(&in->lock);
	rec_put_u32(w, S_FLAGS, (in->want_room ? S_F_WANT_ROOM : 0) |
				      (in->congested ? S_F_CONGESTED : 0));
	rec_begin(w, S_PKTS);
	if (d->sib.rx_cur)
		sib_save_pkt(w, d->sib.rx_cur, SP_F_TAKEN, false);
	for (unsigned i = d->sib.i_taken; i < d->sib.n_taken; i++)
		sib_save_pkt(w, d->sib.taken[i], SP_F_TAKEN, false);
	n = inbox_count(in);
	for (unsigned i = 0; i < n; i++)
		sib_save_pkt(w, in->ring[(in->head + i) % DEV_INBOX_PKTS], 0, true);
	rec_end(w);
	waiting = n + (d->sib.rx_cur ? 1 : 0) + d->sib.n_taken - d->sib.i_taken;
	rec_begin(w, S_SRCS);
	for (unsigned i = 0; i < in->n_src; i++) {
		if (!in->src[i].cid)
			continue;
		rec_begin(w, S_SRC);
		rec_put_u32(w, SS_SLOT, i);
		rec_put_u32(w, SS_CID, in->src[i].cid);
		rec_put_u64(w, SS_REFUSED, in->src[i].refused_ns);
		rec_end(w);
	}
	rec_end(w);
	pthread_mutex_unlock(&in->lock);
	/* Per sibling: what is held for it, and what our guest owes of its REQUEST budget towards
	 * it (a flooding guest gets no fresh burst from an upgrade). req_since is mono_ns(),
	 * CLOCK_MONOTONIC: the same clock in the new process on this host. */
	rec_begin(w, S_HOLDS);
	for (unsigned i = 0; i < d->sib.n_sibs; i++) {
		const struct sib_hold *ho = &d->sib.hold[i];

		if (ho->head || ho->req_debt)
			held += sib_save_hold(w, d->sib.sibs[i]->cid, ho->head, ho->req_debt,
					      ho->req_since);
	}
	/* Restored and not handed to hold[] yet (saved again before its thaw). */
	for (unsigned i = 0; i < d->sib.n_pend; i++) {
		const struct sib_pend *pd = &d->sib.pend[i];

		held += sib_save_hold(w, pd->cid, pd->head, pd->req_debt, pd->req_since);
	}
	rec_end(w);
	rec_put_u64(w, S_PEER_DROPPED,
		    atomic_load_explicit(&d->sib.port->peer_dropped, memory_order_relaxed));
	/* The REQUEST waiting for its budget: our TX ring waits behind it, so it is the next
	 * packet our guest sends; lost, its connect would hang until the guest gives up. */
	if (d->sib.paced) {
		rec_begin(w, S_PACED);
		sib_save_pkt(w, d->sib.paced, 0, false);
		rec_end(w);
	}
	if (waiting || held || d->sib.paced)
		log_info("%s: %u packets waiting for its RX ring, %u held for full siblings and "
			 "%u REQUEST waiting for its budget go into the record", d->name, waiting,
			 held, d->sib.paced ? 1u : 0u);
}

/* What a restore read, kept aside until all of it is checked. */
struct sib_restoring {
	struct sib_pkt *taken[DEV_SIB_TAKE];
	unsigned n_taken;
	struct sib_pkt *ring[DEV_INBOX_PKTS];
	unsigned n_ring;
	size_t ring_bytes;
	struct sib_src src[DEV_INBOX_SRCS];
	unsigned n_src;
	struct sib_pend *pend;
	unsigned n_pend, hold_pkts;
	size_t hold_bytes;
	struct sib_pkt *paced;
};

static void sib_pend_free_list(struct vsock_dev *d, struct sib_pkt *p)
{
	while (p) {
		struct sib_pkt *next = p->next;

		sib_pkt_free(d, p);
		p = next;
	}
}

static void sib_restoring_free(struct vsock_dev *d, struct sib_restoring *s)
{
	for (unsigned i = 0; i < s->n_taken; i++)
		sib_pkt_free(d, s->taken[i]);
	for (unsigned i = 0; i < s->n_ring; i++)
		sib_pkt_free(d, s->ring[i]);
	for (unsigned i = 0; i < s->n_pend; i++)
		sib_pend_free_list(d, s->pend[i].head);
	free(s->pend);
	sib_pkt_free(d, s->paced);
	free(s);
}

/* One S_PKT item: a packet of our pool, its header checked as a guest's is (vsock_hdr_check). */
static int sib_restore_pkt(struct vsock_dev *d, struct rec_reader *r, const struct rec_item *it,
			   uint32_t *flags, uint32_t *src, struct sib_pkt **ret)
{
	struct rec_val v[ARRAY_SIZE(sib_pkt_fields)];
	struct rec_reader sub;
	struct vsock_hdr h;
	struct sib_pkt *p;
	uint32_t dlen;
	bool bad_hdr;
	int e;

	if (it->tag != S_PKT)
		return rec_fail(r->doc, -EBADMSG, "sibling packets: item %u at %zu", it->tag,
				it->off);
	e = rec_enter(r, it, "sibling packet", &sub);
	if (e == 0)
		e = rec_scan(&sub, sib_pkt_fields, ARRAY_SIZE(sib_pkt_fields), v);
	if (e < 0)
		return e;
	dlen = v[1].present ? v[1].it.len : 0;
	if (v[0].it.len != VSOCK_HDR_SIZE)
		return rec_fail(r->doc, -EBADMSG, "sibling packet at %zu: a header of %u bytes",
				it->off, v[0].it.len);
	vsock_hdr_decode(v[0].it.val, &h);
	/* A datagram (the device's own type 3, docs/vsock-protocol.md) is an RW packet; the rest
	 * as a guest's packet is checked. */
	if (h.type == VSOCK_TYPE_DGRAM)
		bad_hdr = h.op != VSOCK_OP_RW || (h.src_cid >> 32) || (h.dst_cid >> 32) ||
			  h.len > VSOCK_MAX_PKT_PAYLOAD;
	else
		bad_hdr = vsock_hdr_check(&h, dlen) != VSOCK_HDR_OK;
	if (h.len != dlen || bad_hdr ||
	    (v[1].present && !dlen) || (v[3].u & ~(uint64_t)(SP_F_MADE | SP_F_TAKEN)) ||
	    (v[2].present && (!v[2].u || v[2].u >= h.len || h.type == VSOCK_TYPE_DGRAM ||
			      !(v[3].u & SP_F_TAKEN))) ||
	    (v[4].present && (v[4].u >= DEV_INBOX_SRCS || (v[3].u & SP_F_TAKEN))))
		return rec_fail(r->doc, -EBADMSG, "sibling packet at %zu: header, payload, "
				"delivered part, flags or sender slot out of range", it->off);
	p = sib_pkt_alloc(d, h.len);
	if (!p)
		return -ENOMEM;
	p->hdr = h;
	if (dlen)
		memcpy(p->data, v[1].it.val, dlen);
	p->off = (uint32_t)v[2].u;
	p->made = v[3].u & SP_F_MADE;
	p->src = v[4].present ? (uint16_t)v[4].u : DEV_INBOX_SRC_NONE;
	*flags = (uint32_t)v[3].u;
	*src = v[4].present ? (uint32_t)v[4].u : DEV_INBOX_SRC_NONE;
	*ret = p;
	return 0;
}

/* The inbox (S_PKTS, S_SRCS) into s: taken packets first, the partly delivered one only first. */
static int sib_restore_inbox(struct vsock_dev *d, struct rec_reader *r, const struct rec_val *v,
			     struct sib_restoring *s)
{
	struct rec_reader sub;
	struct rec_item it;
	bool slot_seen[DEV_INBOX_SRCS] = { false };
	int e;

	e = rec_enter(r, &v[2].it, "inbox senders", &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		struct rec_val sv[ARRAY_SIZE(sib_src_fields)];
		struct rec_reader ss;

		if (it.tag != S_SRC)
			return rec_fail(r->doc, -EBADMSG, "inbox senders: item %u at %zu",
					it.tag, it.off);
		e = rec_enter(&sub, &it, "inbox sender", &ss);
		if (e == 0)
			e = rec_scan(&ss, sib_src_fields, ARRAY_SIZE(sib_src_fields), sv);
		if (e < 0)
			return e;
		if (sv[0].u >= DEV_INBOX_SRCS || slot_seen[sv[0].u] || !sv[1].u)
			return rec_fail(r->doc, -EBADMSG, "inbox sender at %zu: slot %llu twice, "
					"out of range, or CID 0", it.off,
					(unsigned long long)sv[0].u);
		slot_seen[sv[0].u] = true;
		s->src[sv[0].u] = (struct sib_src){ .cid = (uint32_t)sv[1].u,
						    .refused_ns = sv[2].u };
		if (sv[0].u + 1 > s->n_src)
			s->n_src = (unsigned)sv[0].u + 1;
	}
	if (e < 0)
		return e;
	e = rec_enter(r, &v[1].it, "inbox", &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		uint32_t flags, src;
		struct sib_pkt *p;

		e = sib_restore_pkt(d, &sub, &it, &flags, &src, &p);
		if (e < 0)
			return e;
		/* Kept at once: freed with s whatever comes next. */
		if (flags & SP_F_TAKEN) {
			if (s->n_ring || s->n_taken == DEV_SIB_TAKE || (p->off && s->n_taken)) {
				sib_pkt_free(d, p);
				return rec_fail(r->doc, -EBADMSG, "inbox: a taken packet at %zu "
						"after the inbox's, or more than %u", it.off,
						DEV_SIB_TAKE);
			}
			s->taken[s->n_taken++] = p;
			continue;
		}
		if (s->n_ring == DEV_INBOX_PKTS) {
			sib_pkt_free(d, p);
			return rec_fail(r->doc, -EBADMSG, "inbox: more than %u packets",
					DEV_INBOX_PKTS);
		}
		s->ring[s->n_ring++] = p;
		s->ring_bytes += p->hdr.len;
		if (p->hdr.dst_cid != d->cid || s->ring_bytes > DEV_INBOX_BYTES)
			return rec_fail(r->doc, -EBADMSG, "inbox: a packet at %zu for CID %llu, "
					"or more than %u bytes", it.off,
					(unsigned long long)p->hdr.dst_cid, DEV_INBOX_BYTES);
		if (src != DEV_INBOX_SRC_NONE) {
			struct sib_src *sl = &s->src[src];

			if (!slot_seen[src] || sl->cid != p->hdr.src_cid)
				return rec_fail(r->doc, -EBADMSG, "inbox: a packet at %zu from "
						"CID %llu counted to slot %u of another sender",
						it.off, (unsigned long long)p->hdr.src_cid, src);
			sl->pkts++;
			sl->bytes += p->hdr.len;
		}
	}
	if (e < 0)
		return e;
	for (unsigned i = 0; i < s->n_taken; i++)
		if (s->taken[i]->hdr.dst_cid != d->cid)
			return rec_fail(r->doc, -EBADMSG, "inbox: a taken packet for CID %llu",
					(unsigned long long)s->taken[i]->hdr.dst_cid);
	return 0;
}

/* What our guest held for full siblings (S_HOLDS) into s->pend, one entry per sibling. */
static int sib_restore_holds(struct vsock_dev *d, struct rec_reader *r, const struct rec_item *l,
			     struct sib_restoring *s)
{
	struct rec_reader sub;
	struct rec_item it;
	int e;

	e = rec_enter(r, l, "held packets", &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		struct rec_val hv[ARRAY_SIZE(sib_hold_fields)];
		struct rec_reader hs, ps;
		struct rec_item pit;
		struct sib_pend *pd;

		if (it.tag != S_HOLD || s->n_pend == DEV_SIB_HOLD_PKTS)
			return rec_fail(r->doc, -EBADMSG, "held packets: item %u at %zu (tag or "
					"count)", it.tag, it.off);
		e = rec_enter(&sub, &it, "held for a sibling", &hs);
		if (e == 0)
			e = rec_scan(&hs, sib_hold_fields, ARRAY_SIZE(sib_hold_fields), hv);
		if (e < 0)
			return e;
		if (hv[0].u == d->cid || hv[0].u < 3)
			return rec_fail(r->doc, -EBADMSG, "packets held for CID %llu",
					(unsigned long long)hv[0].u);
		for (unsigned i = 0; i < s->n_pend; i++)
			if (s->pend[i].cid == hv[0].u)
				return rec_fail(r->doc, -EBADMSG, "packets held for CID %llu "
						"twice", (unsigned long long)hv[0].u);
		pd = realloc(s->pend, (s->n_pend + 1) * sizeof(*pd));
		if (!pd)
			return -ENOMEM;
		s->pend = pd;
		pd = &s->pend[s->n_pend++];
		*pd = (struct sib_pend){ .cid = (uint32_t)hv[0].u };
		/* The budget as sib_req_charge keeps it: a debt counts from a time of this host's
		 * CLOCK_MONOTONIC that has passed, and is never beyond the burst. */
		if (hv[2].present != hv[3].present || (hv[2].present && !hv[2].u) ||
		    hv[2].u > d->sib.req_burst || hv[3].u > mono_ns())
			return rec_fail(r->doc, -EBADMSG, "REQUEST debt %llu towards CID %u since "
					"%llu: half of it, none, over the burst %u, or in the future",
					(unsigned long long)hv[2].u, pd->cid,
					(unsigned long long)hv[3].u, d->sib.req_burst);
		pd->req_debt = (uint32_t)hv[2].u;
		pd->req_since = hv[3].u;
		e = 0;
		if (hv[1].present)
			e = rec_enter(&hs, &hv[1].it, "held packets", &ps);
		while (e == 0 && hv[1].present && (e = rec_next(&ps, &pit)) > 0) {
			uint32_t flags, src;
			struct sib_pkt *p;

			e = sib_restore_pkt(d, &ps, &pit, &flags, &src, &p);
			if (e < 0)
				return e;
			p->next = NULL;
			if (pd->tail)
				pd->tail->next = p;
			else
				pd->head = p;
			pd->tail = p;
			s->hold_pkts++;
			s->hold_bytes += p->hdr.len;
			if ((flags & SP_F_TAKEN) || src != DEV_INBOX_SRC_NONE || p->made ||
			    p->hdr.src_cid != d->cid || p->hdr.dst_cid != pd->cid ||
			    s->hold_pkts > DEV_SIB_HOLD_PKTS ||
			    s->hold_bytes > DEV_SIB_HOLD_BYTES + VSOCK_MAX_PKT_PAYLOAD)
				return rec_fail(r->doc, -EBADMSG, "held packet at %zu: not our "
						"guest's for CID %u, or over the hold's bound",
						pit.off, pd->cid);
		}
		if (e < 0)
			return e;
		if (!pd->head && !pd->req_debt)
			return rec_fail(r->doc, -EBADMSG, "neither a packet held nor a REQUEST debt "
					"for CID %u", pd->cid);
	}
	return e < 0 ? e : 0;
}

/* Our guest's REQUEST waiting for its budget (S_PACED): one, its CID a sibling's. */
static int sib_restore_paced(struct vsock_dev *d, struct rec_reader *r, const struct rec_item *l,
			     struct sib_restoring *s)
{
	struct rec_reader sub;
	struct rec_item it;
	uint32_t flags, src;
	int e;

	e = rec_enter(r, l, "paced REQUEST", &sub);
	if (e == 0 && (e = rec_next(&sub, &it)) == 0)
		return rec_fail(r->doc, -EBADMSG, "an empty paced REQUEST");
	if (e < 0)
		return e;
	e = sib_restore_pkt(d, &sub, &it, &flags, &src, &s->paced);
	if (e < 0)
		return e;
	s->paced->next = NULL;
	if (flags || src != DEV_INBOX_SRC_NONE || s->paced->hdr.op != VSOCK_OP_REQUEST ||
	    s->paced->hdr.src_cid != d->cid || s->paced->hdr.dst_cid == d->cid ||
	    s->paced->hdr.dst_cid < 3)
		return rec_fail(r->doc, -EBADMSG, "the paced packet at %zu: not our guest's "
				"REQUEST to a sibling", it.off);
	e = rec_next(&sub, &it);
	if (e > 0)
		return rec_fail(r->doc, -EBADMSG, "a second paced packet at %zu", it.off);
	return e;
}

int dev_sib_restore(struct vsock_dev *d, struct rec_reader *r)
{
	struct rec_val v[ARRAY_SIZE(sib_fields)];
	struct sib_inbox *in;
	struct sib_restoring *s;
	int e;

	if (!d->sib.port || d->sib.rx_cur || d->sib.n_taken || d->sib.n_pend || d->sib.paced ||
	    inbox_count(&d->sib.port->inbox))
		return -EBUSY;
	in = &d->sib.port->inbox;
	e = rec_scan(r, sib_fields, ARRAY_SIZE(sib_fields), v);
	if (e < 0)
		return e;
	if (v[0].u & ~(uint64_t)(S_F_WANT_ROOM | S_F_CONGESTED))
		return rec_fail(r->doc, -EBADMSG, "inbox flags %#llx", (unsigned long long)v[0].u);
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	e = sib_restore_inbox(d, r, v, s);
	if (e == 0)
		e = sib_restore_holds(d, r, &v[3].it, s);
	if (e == 0 && v[5].present)
		e = sib_restore_paced(d, r, &v[5].it, s);
	if (e < 0) {
		sib_restoring_free(d, s);
		return e;
	}
	/* All checked: the inbox as it was, before any thread of the device runs. */
	pthread_mutex_lock(&in->lock);
	memcpy(in->src, s->src, sizeof(in->src));
	in->n_src = s->n_src;
	in->head = 0;
	memcpy(in->ring, s->ring, s->n_ring * sizeof(*s->ring));
	atomic_store_explicit(&in->count, s->n_ring, memory_order_relaxed);
	in->bytes = s->ring_bytes;
	in->want_room = v[0].u & S_F_WANT_ROOM;
	in->congested = v[0].u & S_F_CONGESTED;
	pthread_mutex_unlock(&in->lock);
	memcpy(d->sib.taken, s->taken, s->n_taken * sizeof(*s->taken));
	d->sib.n_taken = s->n_taken;
	d->sib.i_taken = 0;
	d->sib.pend = s->pend;
	d->sib.n_pend = s->n_pend;
	/* Retried at the thaw, once its sibling is linked (sib_pace_release). */
	d->sib.paced = s->paced;
	d->sib.paced_cid = s->paced ? (uint32_t)s->paced->hdr.dst_cid : 0;
	atomic_store_explicit(&d->sib.port->peer_dropped, v[4].u, memory_order_relaxed);
	free(s);
	return 0;
}

/* Drops what was restored for siblings and never handed to them (the device ends first). */
static void sib_pend_drop(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->sib.n_pend; i++)
		sib_pend_free_list(d, d->sib.pend[i].head);
	free(d->sib.pend);
	d->sib.pend = NULL;
	d->sib.n_pend = 0;
}

void dev_sib_thaw(struct vsock_dev *d)
{
	uint64_t now = mono_ns();

	/* Restored held packets go behind nothing: a new device held nothing for anyone. */
	for (unsigned k = 0; k < d->sib.n_pend; k++) {
		struct sib_pend *pd = &d->sib.pend[k];
		int i = sib_find(d, pd->cid);

		while (pd->head) {
			struct sib_pkt *p = pd->head;

			pd->head = p->next;
			if (i < 0 || sib_port_closed(d->sib.sibs[i])) {
				/* Not linked here (the records disagree): as for a sibling gone. */
				sib_reject(d, &p->hdr);
				sib_pkt_free(d, p);
				continue;
			}
			(void)sib_hold_put(d, &d->sib.hold[i], p);
		}
		if (i >= 0) {
			d->sib.hold[i].req_debt = pd->req_debt;
			d->sib.hold[i].req_since = pd->req_since;
		} else if (pd->tail) {
			log_warn("%s: packets held for CID %u, which is not linked to it: dropped",
				 d->name, pd->cid);
		}
	}
	free(d->sib.pend);
	d->sib.pend = NULL;
	d->sib.n_pend = 0;
	for (unsigned i = 0; i < d->sib.n_sibs; i++) {
		if (d->sib.hold[i].head)
			d->sib.hold[i].deadline = now + DEV_SIB_STALL_NS;
		/* Whatever wakeup the freeze swallowed: a spurious one costs a look. */
		sib_port_signal(d->sib.sibs[i], false);
		sib_port_signal(d->sib.sibs[i], true);
	}
	sib_hold_arm(d);
	/* A REQUEST waiting for its budget (restored, or here since before the freeze): tried at
	 * once, re-armed for its budget if it still has no room (sib_pace_release). */
	if (d->sib.paced)
		loop_timer_arm(d->sib.pace_timer, 0);
}

void dev_sib_unrestore(struct vsock_dev *d)
{
	struct sib_inbox *in = &d->sib.port->inbox;

	while (inbox_count(in))
		sib_pkt_free(d, inbox_get(in));
	in->bytes = 0;
	memset(in->src, 0, sizeof(in->src));
	in->n_src = 0;
	in->want_room = in->congested = false;
	while (d->sib.i_taken < d->sib.n_taken)
		sib_pkt_free(d, d->sib.taken[d->sib.i_taken++]);
	d->sib.n_taken = d->sib.i_taken = 0;
	sib_pend_drop(d);
	sib_pkt_free(d, d->sib.paced);
	d->sib.paced = NULL;
	atomic_store_explicit(&d->sib.port->peer_dropped, 0, memory_order_relaxed);
}
