/* SPDX-License-Identifier: MIT */
/*
 * The device role (see device.h): vhost-user glue, the TX and RX rings, the engine, and sibling
 * routing. Host sockets are in host_uds.c.
 *
 * TX (guest to device): kicks or a continuation drain the TX ring in batches of up to
 * DEV_TX_BATCH chains: each chain is validated (readable-only, header present, hdr.len fits the
 * chain, payload <= 64 KiB), its src_cid must be the VM's CID, and it is routed by dst_cid:
 * 2 goes to the engine (vsock_engine_feed_batch, payload borrowed straight from guest memory),
 * a linked sibling's CID to that sibling's inbox (copied), anything else is dropped and counted.
 * Every chain is returned with used.len 0; one used-index publication and at most one interrupt
 * per batch. Draining stops while the engine cannot take more (queued replies at the TX ring size,
 * reference 5.5) or a sibling's inbox is full, and after DEV_PASS_PKTS / DEV_PASS_BYTES per pass.
 *
 * RX (device to guest): each guest RX chain gets one packet: from the engine (pulled with
 * max_payload = chain room - 44, so it always fits) or from the sibling inbox (split over as
 * many chains as needed, vhost-style: each piece has its own header with len = piece, EOM/EOR only
 * on the last piece), alternating between the two sources. used.len = 44 + payload.
 *
 * Lifetimes: the engine exists while the TX ring has been started since the last reset; when
 * the rings stop (guest reset) or the VMM disconnects, every connection is dropped (the guest's
 * sockets are gone), host sockets are closed, and the next start builds a fresh engine. A VMM
 * disconnect never frees the device. Siblings reach each other only through their
 * reference-counted ports (struct sib_port), so a device can be freed while its siblings run
 * (sib_detach); packets for it are then dropped and answered with an RST (sib_gone).
 */
#include "device/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "ops/vmlog.h"
#include "uvsock/device.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/macros.h"

struct vsock_router {
	pthread_mutex_t lock;
	struct vsock_dev *devs;
};

/* sock_event user value of the two wildcard listeners. */
static char listener_mark;

/* ---- small helpers ---------------------------------------------------------------------- */

static void signal_fd(struct vsock_dev *d, int fd)
{
	uint64_t one = 1;

	if (fd < 0)
		return;
	if (write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_vm_dev(LOG_LVL_WARN, d->cid, "call eventfd write failed: %s", strerror(errno));
	DEV_STAT_ADD(d, interrupts, 1);
}

static void queue_notify(struct vsock_dev *d, struct dev_queue *dq)
{
	vring_dev_flush(&dq->q);
	if (vring_dev_should_notify(&dq->q))
		signal_fd(d, dq->call_fd);
}

static void mark_broken(struct vsock_dev *d, struct dev_queue *dq, const char *what)
{
	if (d->broken)
		return;
	__atomic_store_n(&d->broken, true, __ATOMIC_RELAXED);
	DEV_STAT_ADD(d, ring_errors, 1);
	log_vm_dev(LOG_LVL_WARN, d->cid,
		   "%s ring error: %s; device stopped until the rings restart",
		   dq == &d->rxq ? "rx" : "tx",
		   vring_dev_error(&dq->q) != VRING_ERR_NONE ? vring_dev_error_msg(&dq->q) : what);
}

static void cont_schedule(struct vsock_dev *d)
{
	if (!loop_timer_armed(d->cont_timer))
		loop_timer_arm(d->cont_timer, 0);
}

/* ---- siblings ----------------------------------------------------------------------------- */

static struct sib_port *sib_lookup(struct vsock_dev *d, uint64_t cid)
{
	unsigned lo = 0, hi = d->n_sibs;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		struct sib_port *s = d->sibs[mid];

		if (s->cid == cid)
			return s;
		if (s->cid < cid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static void sib_port_unref(struct sib_port *p)
{
	if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	/* Closed by its device before the device's own reference went: the inbox is empty. */
	pthread_mutex_destroy(&p->inbox.lock);
	free(p);
}

static bool sib_port_closed(struct sib_port *p)
{
	return __atomic_load_n(&p->closed, __ATOMIC_RELAXED);
}

/*
 * Wakes the loop of p's device: its inbox_async (room false) or its room_async (room true),
 * unless the device was freed. Under p's lock: vsock_dev_free closes p under it before it frees
 * the loop the wakeups belong to.
 */
static void sib_port_signal(struct sib_port *p, bool room)
{
	pthread_mutex_lock(&p->inbox.lock);
	if (!p->closed)
		loop_async_send(room ? p->room_async : p->inbox_async);
	pthread_mutex_unlock(&p->inbox.lock);
}

/*
 * Hands p to t's inbox. Returns 0, -ENOBUFS if full (t will wake our room_async later), -EBUSY
 * if full and congested (drop p), or -EPIPE if t's device was freed (drop p).
 */
static int sib_push(struct sib_port *t, struct sib_pkt *p)
{
	struct sib_inbox *in = &t->inbox;
	int r = 0;

	pthread_mutex_lock(&in->lock);
	if (t->closed) {
		r = -EPIPE;
	} else if (in->count == DEV_INBOX_PKTS || in->bytes + p->hdr.len > DEV_INBOX_BYTES) {
		/* A congested target is not waited for: its guest is not taking packets. */
		r = in->congested ? -EBUSY : -ENOBUFS;
		if (r == -ENOBUFS)
			in->want_room = true;
	} else {
		in->ring[(in->head + in->count) % DEV_INBOX_PKTS] = p;
		/* Published under the lock; count is also read without it as a hint (atomic). */
		__atomic_store_n(&in->count, in->count + 1, __ATOMIC_RELAXED);
		in->bytes += p->hdr.len;
	}
	pthread_mutex_unlock(&in->lock);
	return r;
}

/*
 * Queues an RST from h's destination to h's source (a packet h sent to the sibling port t, whose
 * device was freed) into t2's inbox, as Linux answers a packet for which no socket exists: the
 * guest's connection to the freed VM fails at once instead of waiting for its own timeouts.
 * Nothing is sent for an RST, if t2's inbox is full (the guest times out instead), or if t2 is
 * closed too. Returns true if queued (the caller wakes t2's device).
 */
static bool sib_queue_rst(struct sib_port *t2, const struct vsock_hdr *h)
{
	struct sib_inbox *in = &t2->inbox;
	struct sib_pkt *p;
	bool queued = false;

	if (h->op == VSOCK_OP_RST)
		return false;
	p = malloc(sizeof(*p));
	if (!p)
		return false;
	p->hdr = (struct vsock_hdr){
		.src_cid = h->dst_cid, .dst_cid = h->src_cid, .src_port = h->dst_port,
		.dst_port = h->src_port, .type = h->type, .op = VSOCK_OP_RST,
	};
	p->off = 0;
	pthread_mutex_lock(&in->lock);
	if (!t2->closed && in->count < DEV_INBOX_PKTS) {
		in->ring[(in->head + in->count) % DEV_INBOX_PKTS] = p;
		__atomic_store_n(&in->count, in->count + 1, __ATOMIC_RELAXED);
		queued = true;
	}
	pthread_mutex_unlock(&in->lock);
	if (!queued)
		free(p);
	return queued;
}

/*
 * Our guest sent h to a sibling whose device was freed: dropped (counted as a sibling drop, which
 * operators see as no_route) and answered with an RST from that CID (to be delivered by rx_fill).
 */
static void sib_gone(struct vsock_dev *d, const struct vsock_hdr *h)
{
	DEV_STAT_ADD(d, sibling_dropped, 1);
	if (sib_queue_rst(d->port, h))
		d->rx_more = true;
}

static void sib_wake_senders(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->n_sibs; i++)
		sib_port_signal(d->sibs[i], true);
}

/* Takes the oldest packet of our inbox, or NULL. */
static struct sib_pkt *sib_take(struct vsock_dev *d)
{
	struct sib_inbox *in = &d->port->inbox;
	struct sib_pkt *p = NULL;
	bool wake = false;

	if (!__atomic_load_n(&in->count, __ATOMIC_RELAXED))
		return NULL;
	pthread_mutex_lock(&in->lock);
	if (in->count) {
		p = in->ring[in->head];
		in->head = (in->head + 1) % DEV_INBOX_PKTS;
		__atomic_store_n(&in->count, in->count - 1, __ATOMIC_RELAXED);
		in->bytes -= p->hdr.len;
		if (in->count <= DEV_INBOX_PKTS / 2 && in->bytes <= DEV_INBOX_BYTES / 2) {
			in->congested = false;
			if (in->want_room) {
				in->want_room = false;
				wake = true;
			}
		}
	}
	pthread_mutex_unlock(&in->lock);
	if (wake)
		sib_wake_senders(d);
	return p;
}

static bool sib_pending(struct vsock_dev *d)
{
	return d->rx_cur || __atomic_load_n(&d->port->inbox.count, __ATOMIC_RELAXED);
}

/* Drops everything queued for our guest (RX not running). */
static void sib_drop_all(struct vsock_dev *d)
{
	struct sib_pkt *p;

	if (d->rx_cur) {
		free(d->rx_cur);
		d->rx_cur = NULL;
		DEV_STAT_ADD(d, sibling_dropped, 1);
	}
	while ((p = sib_take(d))) {
		free(p);
		DEV_STAT_ADD(d, sibling_dropped, 1);
	}
}

static void sib_wake_targets(struct vsock_dev *d)
{
	for (unsigned i = 0; i < d->n_wake; i++)
		sib_port_signal(d->wake[i], false);
	d->n_wake = 0;
}

static void sib_note_target(struct vsock_dev *d, struct sib_port *t)
{
	for (unsigned i = 0; i < d->n_wake; i++)
		if (d->wake[i] == t)
			return;
	d->wake[d->n_wake++] = t;
}

/* ---- RX: device to guest ----------------------------------------------------------------- */

static void rx_fill(struct vsock_dev *d)
{
	struct dev_queue *dq = &d->rxq;
	struct iovec iov[DEV_RX_IOV_MAX], piov[DEV_RX_IOV_MAX], out_iov[1];
	unsigned pkts = 0;
	size_t bytes = 0;
	bool filled = false;

	d->rx_more = false;
	if (!dq->running || d->broken) {
		if (!dq->running)
			sib_drop_all(d);
		return;
	}
	vring_dev_disable_notify(&dq->q);
	for (;;) {
		bool have_eng = d->eng && vsock_engine_has_pending(d->eng);
		bool have_sib = sib_pending(d);
		struct vring_chain ch;
		struct vsock_hdr h;
		uint8_t wire[VSOCK_HDR_SIZE];
		size_t room;
		ssize_t n;
		int r, pn;

		if (!have_eng && !have_sib)
			break;
		if (pkts >= DEV_PASS_PKTS || bytes >= DEV_PASS_BYTES) {
			d->rx_more = true;
			break;
		}
		r = vring_dev_pop(&dq->q, out_iov, 0, iov, DEV_RX_IOV_MAX, &ch);
		if (r == -EAGAIN) {
			/* Out of guest buffers: ask for a kick, unless some arrived meanwhile. */
			if (vring_dev_enable_notify(&dq->q)) {
				vring_dev_disable_notify(&dq->q);
				continue;
			}
			break;
		}
		if (r == -ENOBUFS) {
			uint16_t head;

			if (vring_dev_skip(&dq->q, &head) == 0)
				(void)vring_dev_fill(&dq->q, head, 0);
			mark_broken(d, dq, "rx buffer with readable descriptors or too many segments");
			break;
		}
		if (r < 0) {
			mark_broken(d, dq, "rx pop failed");
			break;
		}
		if (ch.in_len < VSOCK_HDR_SIZE) {
			(void)vring_dev_fill(&dq->q, ch.head, 0);
			filled = true;
			mark_broken(d, dq, "rx buffer shorter than the 44-byte header");
			break;
		}
		room = MIN(ch.in_len - VSOCK_HDR_SIZE, (uint64_t)VSOCK_MAX_PKT_PAYLOAD);
		pn = iov_slice(iov, ch.in_num, VSOCK_HDR_SIZE, room, piov, DEV_RX_IOV_MAX);
		if (pn < 0) {
			(void)vring_dev_fill(&dq->q, ch.head, 0);
			filled = true;
			mark_broken(d, dq, "rx buffer layout");
			break;
		}
		if (have_eng && (!have_sib || !d->rx_sib_turn)) {
			n = vsock_engine_pull(d->eng, &h, piov, pn, room);
			if (n < 0) {
				/* has_pending said yes; nothing came: return the buffer unused. */
				(void)vring_dev_fill(&dq->q, ch.head, 0);
				filled = true;
				break;
			}
		} else {
			struct sib_pkt *p = d->rx_cur ? d->rx_cur : sib_take(d);
			size_t left;

			if (!p) {
				(void)vring_dev_fill(&dq->q, ch.head, 0);
				filled = true;
				break;
			}
			d->rx_cur = p;
			left = p->hdr.len - p->off;
			n = (ssize_t)MIN(left, room);
			h = p->hdr;
			h.len = (uint32_t)n;
			if ((size_t)n < left)
				h.flags &= ~(VSOCK_SEQ_EOM | VSOCK_SEQ_EOR);
			iov_write_at(piov, (unsigned)pn, 0, p->data + p->off, (size_t)n);
			p->off += (uint32_t)n;
			if (p->off == p->hdr.len) {
				free(p);
				d->rx_cur = NULL;
			}
		}
		if (have_eng && have_sib)
			d->rx_sib_turn = !d->rx_sib_turn;
		vsock_hdr_encode(&h, wire);
		OPS_TAP(&d->tap, &h, piov, pn);
		iov_write_at(iov, ch.in_num, 0, wire, VSOCK_HDR_SIZE);
		(void)vring_dev_fill(&dq->q, ch.head, VSOCK_HDR_SIZE + (uint32_t)n);
		filled = true;
		pkts++;
		bytes += (size_t)n;
	}
	if (filled)
		queue_notify(d, dq);
	DEV_STAT_ADD(d, rx_pkts, pkts);
	DEV_STAT_ADD(d, rx_bytes, bytes);
}

/* ---- TX: guest to device ----------------------------------------------------------------- */

enum tx_verdict { TX_ENGINE, TX_SIBLING_SENT, TX_SIBLING_FULL, TX_DROP };

/* Copies a sibling-bound packet and hands it over (or stages it if the target is full). */
static enum tx_verdict tx_to_sibling(struct vsock_dev *d, struct sib_port *t,
				     const struct vsock_hdr *h, const struct iovec *iov,
				     unsigned n)
{
	struct sib_pkt *p;

	/* A hint: a port closed after this check makes sib_push fail with -EPIPE instead. */
	if (sib_port_closed(t)) {
		sib_gone(d, h);
		return TX_DROP;
	}
	p = malloc(sizeof(*p) + h->len);
	if (!p) {
		DEV_STAT_ADD(d, sibling_dropped, 1);
		return TX_DROP;
	}
	p->hdr = *h;
	p->off = 0;
	iov_read_at(iov, n, VSOCK_HDR_SIZE, p->data, h->len);
	/* Before the push: once in the target's inbox, p belongs to the target's thread. A staged
	 * packet is not captured again when it is handed over later. */
	OPS_TAP(&d->tap, &p->hdr, (&(struct iovec){ p->data, p->hdr.len }), 1);
	switch (sib_push(t, p)) {
	case 0:
		break;
	case -ENOBUFS:
		d->tx_staged = p;
		d->tx_staged_to = t;
		loop_timer_arm(d->stage_timer, loop_now_ns() + DEV_SIB_STALL_NS);
		return TX_SIBLING_FULL;
	case -EPIPE:
		sib_gone(d, &p->hdr);
		free(p);
		return TX_DROP;
	default:
		free(p);
		DEV_STAT_ADD(d, sibling_dropped, 1);
		return TX_DROP;
	}
	DEV_STAT_ADD(d, sibling_fwd_pkts, 1);
	sib_note_target(d, t);
	return TX_SIBLING_SENT;
}

/* Retries the staged sibling packet. Returns true if it is gone (delivered or dropped). */
static bool tx_retry_staged(struct vsock_dev *d)
{
	int r;

	if (!d->tx_staged)
		return true;
	r = sib_push(d->tx_staged_to, d->tx_staged);
	if (r == -ENOBUFS)
		return false;
	if (r == -EPIPE) {
		/* The target was freed while we waited for room: its vsock_dev_free woke us. */
		sib_gone(d, &d->tx_staged->hdr);
		free(d->tx_staged);
	} else if (r < 0) {
		free(d->tx_staged);
		DEV_STAT_ADD(d, sibling_dropped, 1);
	} else {
		DEV_STAT_ADD(d, sibling_fwd_pkts, 1);
		sib_note_target(d, d->tx_staged_to);
	}
	loop_timer_disarm(d->stage_timer);
	d->tx_staged = NULL;
	d->tx_staged_to = NULL;
	return true;
}

/* Validates one popped TX chain and routes it. *ref is filled for TX_ENGINE. */
static enum tx_verdict tx_classify(struct vsock_dev *d, const struct vring_chain *ch,
				   struct iovec *iov, struct vsock_pkt_ref *ref)
{
	uint8_t wire[VSOCK_HDR_SIZE];
	struct vsock_hdr h;
	struct sib_port *t;
	int pn;

	if (ch->in_num || ch->out_len < VSOCK_HDR_SIZE ||
	    ch->out_len > VSOCK_HDR_SIZE + VSOCK_MAX_PKT_PAYLOAD) {
		DEV_STAT_ADD(d, tx_bad_chain, 1);
		log_vm_dev(LOG_LVL_WARN, d->cid,
			   "tx chain dropped: %llu readable bytes, %u writable descriptors",
			   (unsigned long long)ch->out_len, ch->in_num);
		return TX_DROP;
	}
	if (iov[0].iov_len >= VSOCK_HDR_SIZE) {
		vsock_hdr_decode(iov[0].iov_base, &h);
	} else {
		iov_read_at(iov, ch->out_num, 0, wire, VSOCK_HDR_SIZE);
		vsock_hdr_decode(wire, &h);
	}
	/* The payload must fit the chain (Linux vhost rule); extra chain bytes are ignored. */
	if (h.len > ch->out_len - VSOCK_HDR_SIZE) {
		DEV_STAT_ADD(d, tx_bad_chain, 1);
		log_vm(LOG_LVL_WARN, d->cid, h.dst_port, h.src_port,
		       "tx packet dropped: len %u beyond its chain (%llu payload bytes)", h.len,
		       (unsigned long long)(ch->out_len - VSOCK_HDR_SIZE));
		return TX_DROP;
	}
	if (h.src_cid != d->cid) {
		DEV_STAT_ADD(d, tx_bad_src_cid, 1);
		log_vm(LOG_LVL_WARN, d->cid, h.dst_port, h.src_port,
		       "tx packet with spoofed src_cid %llu dropped", (unsigned long long)h.src_cid);
		return TX_DROP;
	}
	DEV_STAT_ADD(d, tx_pkts, 1);
	DEV_STAT_ADD(d, tx_bytes, h.len);
	if (h.dst_cid == VMADDR_CID_HOST) {
		struct iovec *piov = iov + ch->out_num;

		/* The payload slice goes after the chain's own entries in the same row. */
		pn = iov_slice(iov, ch->out_num, VSOCK_HDR_SIZE, h.len, piov,
			       DEV_TX_IOV_MAX - ch->out_num);
		if (pn < 0) {
			DEV_STAT_ADD(d, tx_bad_chain, 1);
			return TX_DROP;
		}
		OPS_TAP(&d->tap, &h, piov, pn);
		ref->hdr = h;
		ref->iov = piov;
		ref->iovcnt = pn;
		return TX_ENGINE;
	}
	t = sib_lookup(d, h.dst_cid);
	if (!t) {
		DEV_STAT_ADD(d, tx_bad_dst_cid, 1);
		log_vm(LOG_LVL_WARN, d->cid, h.dst_port, h.src_port,
		       "tx packet to cid %llu dropped: no route (not the host or a sibling)",
		       (unsigned long long)h.dst_cid);
		return TX_DROP;
	}
	return tx_to_sibling(d, t, &h, iov, ch->out_num);
}

static void tx_drain(struct vsock_dev *d)
{
	struct dev_queue *dq = &d->txq;
	struct iovec in_iov[1];
	unsigned pkts = 0;
	size_t bytes = 0;
	bool stop = false;

	d->tx_more = false;
	d->tx_throttled = false;
	if (!dq->running || d->broken || !d->eng)
		return;
	if (!tx_retry_staged(d)) {
		d->tx_throttled = true;
		return;
	}
	vring_dev_disable_notify(&dq->q);
	while (!stop) {
		unsigned n = 0, nh = 0;

		if (!vsock_engine_can_feed(d->eng)) {
			d->tx_throttled = true;
			break;
		}
		while (nh < DEV_TX_BATCH) {
			struct vring_chain ch;
			int r;

			if (pkts >= DEV_PASS_PKTS || bytes >= DEV_PASS_BYTES) {
				d->tx_more = true;
				stop = true;
				break;
			}
			/* Leave room in the row for the payload slice built by tx_classify. */
			r = vring_dev_pop(&dq->q, d->tx_iov[n], DEV_TX_IOV_MAX / 2, in_iov, 0, &ch);
			if (r == -EAGAIN) {
				stop = true;
				break;
			}
			if (r == -ENOBUFS) {
				uint16_t head;

				DEV_STAT_ADD(d, tx_bad_chain, 1);
				if (vring_dev_skip(&dq->q, &head) < 0) {
					mark_broken(d, dq, "tx skip failed");
					stop = true;
					break;
				}
				d->tx_heads[nh++] = head;
				continue;
			}
			if (r < 0) {
				mark_broken(d, dq, "tx pop failed");
				stop = true;
				break;
			}
			d->tx_heads[nh++] = ch.head;
			pkts++;
			switch (tx_classify(d, &ch, d->tx_iov[n], &d->tx_refs[n])) {
			case TX_ENGINE:
				bytes += d->tx_refs[n].hdr.len;
				n++;
				break;
			case TX_SIBLING_FULL:
				d->tx_throttled = true;
				stop = true;
				break;
			case TX_SIBLING_SENT:
			case TX_DROP:
				break;
			}
			if (stop)
				break;
		}
		if (n)
			vsock_engine_feed_batch(d->eng, d->tx_refs, n);
		for (unsigned i = 0; i < nh; i++)
			(void)vring_dev_fill(&dq->q, d->tx_heads[i], 0);
		if (nh)
			queue_notify(d, dq);
		sib_wake_targets(d);
	}
	if (!d->tx_more && !d->tx_throttled && !d->broken && vring_dev_enable_notify(&dq->q))
		d->tx_more = true;
}

/* ---- engine ------------------------------------------------------------------------------- */

static uint64_t eng_now(void *opaque)
{
	(void)opaque;
	return loop_now_ns();
}

static void eng_tx_ready(void *opaque)
{
	struct vsock_dev *d = opaque;

	d->rx_more = true;
}

static void eng_sock_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	struct vsock_dev *d = opaque;

	(void)s;
	(void)mask;
	if (!user)
		return;
	if (user == &listener_mark) {
		d->accept_pending = true;
		return;
	}
	host_mark_dirty(user);
}

static const struct vsock_engine_ops eng_ops = {
	.now = eng_now,
	.tx_ready = eng_tx_ready,
	.sock_event = eng_sock_event,
};

static int engine_create(struct vsock_dev *d, unsigned tx_num)
{
	struct vsock_engine_config cfg;
	struct vsock_engine *e;
	int r;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = VMADDR_CID_HOST;
	cfg.buf_size = d->buf_alloc;
	if (cfg.buf_max < d->buf_alloc)
		cfg.buf_max = d->buf_alloc;
	cfg.max_pkt = VSOCK_MAX_PKT_PAYLOAD;
	cfg.max_socks = d->max_conns + 8;
	cfg.reply_limit = tx_num;
	cfg.port_lo = DEV_HOST_PORT_LO;
	cfg.port_hi = DEV_HOST_PORT_HI;
	cfg.seqpacket = !!(d->features & (1ull << VIRTIO_VSOCK_F_SEQPACKET));
	cfg.ops = &eng_ops;
	cfg.opaque = d;
	r = vsock_engine_new(&cfg, &e);
	if (r < 0)
		return r;
	for (int i = 0; i < 2; i++) {
		enum vsock_type type = i == 0 ? VSOCK_TYPE_STREAM : VSOCK_TYPE_SEQPACKET;

		if (type == VSOCK_TYPE_SEQPACKET && !cfg.seqpacket)
			break;
		r = vsock_sock_new(e, type, &d->lst[i]);
		if (r < 0)
			goto out_free;
		vsock_sock_set_user(d->lst[i], &listener_mark);
		r = vsock_sock_listen_deferred(d->lst[i], 4096, true);
		if (r < 0)
			goto out_free;
	}
	pthread_mutex_lock(&d->eng_lock);
	d->eng = e;
	pthread_mutex_unlock(&d->eng_lock);
	return 0;

out_free:
	log_error("%s: engine listener set-up failed: %s", d->name, strerror(-r));
	vsock_engine_free(e);
	d->lst[0] = d->lst[1] = NULL;
	return r;
}

/* Drops every connection of the VM: host sockets closed, engine freed (nothing is sent). */
static void engine_destroy(struct vsock_dev *d)
{
	struct vsock_engine *e;

	/* Withdrawn from readers first, its counters moved into eng_past in the same step so that
	 * readers never see them missing; host sockets are closed before the engine goes. */
	pthread_mutex_lock(&d->eng_lock);
	e = d->eng;
	if (e) {
		struct vsock_engine_stats es;

		vsock_engine_get_stats(e, &es);
		dev_eng_stats_accumulate(&d->eng_past, &es, !!d->lst[0] + !!d->lst[1]);
	}
	d->eng = NULL;
	pthread_mutex_unlock(&d->eng_lock);
	host_close_all(d);
	vsock_engine_free(e);
	d->lst[0] = d->lst[1] = NULL;
	d->accept_pending = false;
	d->tx_throttled = false;
	d->tx_more = d->rx_more = false;
	if (d->tx_staged) {
		free(d->tx_staged);
		d->tx_staged = NULL;
		d->tx_staged_to = NULL;
	}
	if (d->stage_timer)
		loop_timer_disarm(d->stage_timer);
	if (d->eng_timer)
		loop_timer_disarm(d->eng_timer);
}

/* ---- settle: run what the last event made possible ---------------------------------------- */

void dev_settle(struct vsock_dev *d)
{
	for (int round = 0; round < 4; round++) {
		if (d->accept_pending && d->eng)
			host_accept_guest_conns(d);
		host_service_dirty(d);
		rx_fill(d);
		/* Pulling replies may have made room for TX again (reference 5.5). */
		if (d->eng && d->tx_throttled && !d->tx_staged && vsock_engine_can_feed(d->eng))
			tx_drain(d);
		if (!d->dirty && !(d->accept_pending && d->eng) && !d->rx_more)
			break;
	}
	if (d->rx_more || d->tx_more || d->dirty ||
	    (d->eng && d->tx_throttled && !d->tx_staged && vsock_engine_can_feed(d->eng)))
		cont_schedule(d);
	if (d->eng) {
		uint64_t dl = vsock_engine_next_deadline(d->eng);

		if (dl == UINT64_MAX)
			loop_timer_disarm(d->eng_timer);
		else
			loop_timer_arm(d->eng_timer, dl);
	}
}

static void cont_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)t;
	if (d->tx_more)
		tx_drain(d);
	dev_settle(d);
}

static void eng_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)t;
	if (d->eng)
		vsock_engine_run_timers(d->eng);
	dev_settle(d);
}

/* A sibling did not make room within DEV_SIB_STALL_NS: drop the packet, mark it congested. */
static void stage_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;
	struct sib_inbox *in;

	(void)l;
	(void)t;
	if (!d->tx_staged || tx_retry_staged(d)) {
		dev_settle(d);
		return;
	}
	/* The port stays valid (our reference) even if its device was freed meanwhile. */
	in = &d->tx_staged_to->inbox;
	pthread_mutex_lock(&in->lock);
	in->congested = true;
	pthread_mutex_unlock(&in->lock);
	log_vm_dev(LOG_LVL_WARN, d->cid, "sibling %s takes no packets; dropping what is sent to it",
		   d->tx_staged_to->name);
	free(d->tx_staged);
	d->tx_staged = NULL;
	d->tx_staged_to = NULL;
	DEV_STAT_ADD(d, sibling_dropped, 1);
	tx_drain(d);
	dev_settle(d);
}

static void inbox_cb(struct loop *l, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	dev_settle(d);
}

static void room_cb(struct loop *l, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	if (d->tx_staged) {
		if (!tx_retry_staged(d))
			return;
		sib_wake_targets(d);
	}
	if (d->tx_throttled)
		tx_drain(d);
	dev_settle(d);
}

/* ---- rings and vhost-user ----------------------------------------------------------------- */

static void kick_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct dev_queue *dq = opaque;
	struct vsock_dev *d = dq->dev;
	uint64_t v;

	(void)l;
	(void)events;
	(void)!read(fd, &v, sizeof(v));
	if (dq == &d->txq)
		tx_drain(d);
	dev_settle(d);
}

/* ---- rings: the entry points of the device API (embed.c) and of vhost-user below -------- */

int dev_queue_start(struct vsock_dev *d, unsigned qidx, const struct vring_dev_config *cfg,
		    int kick_fd, int call_fd)
{
	struct dev_queue *dq;
	int r;

	if (qidx >= 2 || kick_fd < 0)
		return -EINVAL;
	dq = qidx == 0 ? &d->rxq : &d->txq;
	if (dq->running)
		return -EBUSY;
	r = vring_dev_init(&dq->q, cfg);
	if (r < 0)
		return r;
	r = loop_watch_add(d->loop, kick_fd, EPOLLIN, kick_cb, dq, &dq->kick_w);
	if (r < 0)
		return r;
	dq->kick_fd = kick_fd;
	dq->call_fd = call_fd;
	dq->num = cfg->num;
	dq->running = true;
	d->features = cfg->features;
	__atomic_store_n(&d->broken, false, __ATOMIC_RELAXED);
	if (qidx == 1 && !d->eng) {
		r = engine_create(d, cfg->num);
		if (r < 0) {
			loop_watch_del(dq->kick_w);
			dq->kick_w = NULL;
			dq->running = false;
			dq->kick_fd = dq->call_fd = -1;
			return r;
		}
	}
	if (qidx == 1)
		d->tx_more = true;
	else
		d->rx_more = true;
	cont_schedule(d);
	log_debug("%s: ring %u started (size %u)", d->name, qidx, cfg->num);
	return 0;
}

uint16_t dev_queue_stop(struct vsock_dev *d, unsigned qidx)
{
	struct dev_queue *dq = qidx == 0 ? &d->rxq : &d->txq;

	if (!dq->running)
		return vring_dev_last_avail_idx(&dq->q);
	loop_watch_del(dq->kick_w);
	dq->kick_w = NULL;
	dq->running = false;
	dq->kick_fd = dq->call_fd = -1;
	log_debug("%s: ring %u stopped", d->name, qidx);
	return vring_dev_last_avail_idx(&dq->q);
}

void dev_set_call_fd(struct vsock_dev *d, unsigned qidx, int call_fd)
{
	if (qidx < 2)
		(qidx == 0 ? &d->rxq : &d->txq)->call_fd = call_fd;
}

void dev_reset(struct vsock_dev *d)
{
	dev_queue_stop(d, 0);
	dev_queue_stop(d, 1);
	engine_destroy(d);
	sib_drop_all(d);
	__atomic_store_n(&d->broken, false, __ATOMIC_RELAXED);
}

/* ---- vhost-user: a thin layer over the device API ------------------------------------------ */

static struct uvsock_dev *api(struct vsock_dev *d)
{
	return (struct uvsock_dev *)(void *)d;
}

static int vq_start(void *opaque, unsigned qidx, const struct vhu_vring_info *info)
{
	struct vsock_dev *d = opaque;
	struct uvsock_dev_queue q = {
		.num = info->num,
		.desc_addr = (uint64_t)(uintptr_t)info->desc,
		.avail_addr = (uint64_t)(uintptr_t)info->avail,
		.used_addr = (uint64_t)(uintptr_t)info->used,
		.last_avail_idx = info->last_avail_idx,
		.kick_fd = info->kick_fd,
		.call_fd = info->call_fd,
		.flags = UVSOCK_DEV_QUEUE_HOST_ADDRS,
	};

	if (info->kick_fd < 0) {
		log_error("%s: ring %u without a kick eventfd (polling mode) is not supported",
			  d->name, qidx);
		return -EOPNOTSUPP;
	}
	/* The back-end's map (borrowed until mem_table_changing); features as acked. */
	d->mem = info->mem;
	d->features = info->features;
	return uvsock_dev_queue_start(api(d), qidx, &q);
}

static uint16_t vq_stop(void *opaque, unsigned qidx)
{
	uint16_t idx = 0;

	(void)uvsock_dev_queue_stop(api(opaque), qidx, &idx);
	return idx;
}

static void vq_call_changed(void *opaque, unsigned qidx, int call_fd)
{
	(void)uvsock_dev_set_call_fd(api(opaque), qidx, call_fd);
}

static void vq_features_set(void *opaque, uint64_t features)
{
	/* PROTOCOL_FEATURES and other transport bits are vhost-user's business, not the device's. */
	(void)uvsock_dev_set_features(api(opaque), features & uvsock_dev_features());
}

static void vq_mem_changing(void *opaque)
{
	struct vsock_dev *d = opaque;

	/* Every ring was stopped by the back-end: no guest pointer is in use. */
	d->mem = NULL;
}

static const struct vhu_backend_ops vhu_ops = {
	.queue_start = vq_start,
	.queue_stop = vq_stop,
	.call_fd_changed = vq_call_changed,
	.features_set = vq_features_set,
	.mem_table_changing = vq_mem_changing,
};

static void vmm_disconnect(struct vsock_dev *d, int why)
{
	if (!d->vhu)
		return;
	__atomic_store_n(&d->vmm_connected, false, __ATOMIC_RELAXED);
	if (why == -ECONNRESET)
		log_info("%s: VMM disconnected", d->name);
	else
		log_warn("%s: closing VMM connection: %s", d->name, strerror(-why));
	loop_watch_del(d->vhu_w);
	d->vhu_w = NULL;
	vhu_backend_free(d->vhu); /* stops both rings through vq_stop */
	d->vhu = NULL;
	(void)uvsock_dev_reset(api(d));
	/* Serve the socket again: the next VMM (a restarted VM) is accepted by vhu_listen_cb. */
	(void)loop_watch_mod(d->vhu_listen_w, EPOLLIN);
}

static void vhu_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vsock_dev *d = opaque;
	int r;

	(void)l;
	(void)fd;
	(void)events;
	r = vhu_backend_process(d->vhu);
	if (r < 0) {
		vmm_disconnect(d, r);
		return;
	}
	/* Rings stopped and not restarted within the message: the guest reset the device. */
	if (d->eng && !d->txq.running) {
		log_info("%s: rings stopped: resetting every connection", d->name);
		/* Only the connections: the RX ring is the back-end's to stop (vq_stop). */
		engine_destroy(d);
	}
	dev_settle(d);
}

static void vhu_listen_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vsock_dev *d = opaque;
	struct vhu_backend_config cfg;
	int s, r;

	(void)l;
	(void)events;
	s = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
	if (s < 0)
		return;
	if (d->vhu) {
		close(s);
		return;
	}
	vhu_backend_config_init(&cfg);
	cfg.guest_cid = d->cid;
	cfg.queue_size_max = d->queue_size_max;
	cfg.name = d->name;
	r = vhu_backend_new(s, &cfg, &vhu_ops, d, &d->vhu);
	if (r < 0) {
		log_error("%s: vhost-user set-up failed: %s", d->name, strerror(-r));
		close(s);
		return;
	}
	r = loop_watch_add(d->loop, vhu_backend_fd(d->vhu), EPOLLIN, vhu_cb, d, &d->vhu_w);
	if (r < 0) {
		vhu_backend_free(d->vhu);
		d->vhu = NULL;
		return;
	}
	/* One VMM at a time: further connections wait in the backlog. */
	(void)loop_watch_mod(d->vhu_listen_w, 0);
	__atomic_store_n(&d->vmm_connected, true, __ATOMIC_RELAXED);
	DEV_STAT_ADD(d, vmm_connects, 1);
	log_info("%s: VMM connected", d->name);
}

/* ---- calls from other threads (device API) ------------------------------------------------ */

static void call_cb(struct loop *l, void *opaque)
{
	struct vsock_dev *d = opaque;
	struct dev_call *c;

	(void)l;
	pthread_mutex_lock(&d->call_lock);
	c = d->call;
	pthread_mutex_unlock(&d->call_lock);
	if (!c)
		return;
	c->rc = c->fn(d, c->arg);
	dev_settle(d);
	pthread_mutex_lock(&d->call_lock);
	c->done = true;
	d->call = NULL;
	pthread_cond_broadcast(&d->call_cond);
	pthread_mutex_unlock(&d->call_lock);
}

int dev_call(struct vsock_dev *d, int (*fn)(struct vsock_dev *d, void *arg), void *arg)
{
	struct dev_call c = { .fn = fn, .arg = arg };

	if (!__atomic_load_n(&d->thread_running, __ATOMIC_ACQUIRE) ||
	    pthread_equal(pthread_self(), d->thread)) {
		/* No settle here: on the device thread the caller (a vhost-user message, a
		 * callback) settles when it is done; without a thread nothing runs yet. */
		return fn(d, arg);
	}
	/* One call at a time; the device thread takes it in call_cb and signals completion. */
	pthread_mutex_lock(&d->call_lock);
	while (d->call)
		pthread_cond_wait(&d->call_cond, &d->call_lock);
	d->call = &c;
	pthread_mutex_unlock(&d->call_lock);
	loop_async_send(d->call_async);
	pthread_mutex_lock(&d->call_lock);
	while (!c.done)
		pthread_cond_wait(&d->call_cond, &d->call_lock);
	pthread_mutex_unlock(&d->call_lock);
	return c.rc;
}

/* ---- construction ------------------------------------------------------------------------- */

int dev_listen_unix(const char *path, int type, int *ret_fd)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		unlink(path);
	}
	fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

int vsock_router_new(struct vsock_router **ret)
{
	struct vsock_router *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->lock, NULL);
	*ret = r;
	return 0;
}

void vsock_router_free(struct vsock_router *r)
{
	if (!r)
		return;
	pthread_mutex_destroy(&r->lock);
	free(r);
}

int vsock_dev_new(struct vsock_router *router, const struct vsock_dev_config *cfg,
		  struct vsock_dev **ret)
{
	struct vsock_dev *d;
	int r;

	if (cfg->guest_cid <= VMADDR_CID_HOST || cfg->guest_cid == VMADDR_CID_ANY ||
	    !cfg->uds_path || cfg->buf_alloc == 0)
		return -EINVAL;
	if ((cfg->socket_path && strlen(cfg->socket_path) >= sizeof(d->socket_path)) ||
	    strlen(cfg->uds_path) + 11 >= sizeof(d->uds_path))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->vhu_listen_fd = d->uds_fd = d->uds_seq_fd = -1;
	d->rxq.kick_fd = d->rxq.call_fd = d->txq.kick_fd = d->txq.call_fd = -1;
	d->rxq.dev = d->txq.dev = d;
	d->rxq.idx = 0;
	d->txq.idx = 1;
	d->cid = cfg->guest_cid;
	if (cfg->name)
		snprintf(d->name, sizeof(d->name), "%s", cfg->name);
	else
		snprintf(d->name, sizeof(d->name), "cid%u", cfg->guest_cid);
	if (cfg->socket_path)
		strcpy(d->socket_path, cfg->socket_path);
	strcpy(d->uds_path, cfg->uds_path);
	snprintf(d->uds_seq_path, sizeof(d->uds_seq_path), "%s_seqpacket", cfg->uds_path);
	d->buf_alloc = cfg->buf_alloc;
	d->queue_size_max = cfg->queue_size_max ? cfg->queue_size_max : 1024;
	d->max_conns = cfg->max_conns ? cfg->max_conns : 1024;
	d->router = router;
	d->port = calloc(1, sizeof(*d->port));
	if (d->port) {
		pthread_mutex_init(&d->port->inbox.lock, NULL);
		d->port->refs = 1;
		d->port->cid = d->cid;
		memcpy(d->port->name, d->name, sizeof(d->port->name));
	}
	pthread_mutex_init(&d->eng_lock, NULL);
	pthread_mutex_init(&d->call_lock, NULL);
	pthread_cond_init(&d->call_cond, NULL);
	ops_tap_init(&d->tap);

	d->scratch_len = MAX((size_t)d->buf_alloc, (size_t)VSOCK_MAX_PKT_PAYLOAD);
	d->scratch = malloc(d->scratch_len);
	d->tx_iov = calloc(DEV_TX_BATCH, sizeof(*d->tx_iov));
	d->tx_refs = calloc(DEV_TX_BATCH, sizeof(*d->tx_refs));
	d->tx_heads = calloc(DEV_TX_BATCH, sizeof(*d->tx_heads));
	if (!d->port || !d->scratch || !d->tx_iov || !d->tx_refs || !d->tx_heads) {
		r = -ENOMEM;
		goto out_free;
	}
	r = loop_new(&d->loop);
	if (r < 0)
		goto out_free;
	r = loop_timer_new(d->loop, eng_timer_cb, d, &d->eng_timer);
	if (r < 0)
		goto out_free;
	r = loop_timer_new(d->loop, cont_cb, d, &d->cont_timer);
	if (r < 0)
		goto out_free;
	r = loop_timer_new(d->loop, stage_timer_cb, d, &d->stage_timer);
	if (r < 0)
		goto out_free;
	r = loop_async_new(d->loop, inbox_cb, d, &d->inbox_async);
	if (r < 0)
		goto out_free;
	r = loop_async_new(d->loop, room_cb, d, &d->room_async);
	if (r < 0)
		goto out_free;
	/* Siblings reach our loop through the port (nobody holds it yet). */
	d->port->inbox_async = d->inbox_async;
	d->port->room_async = d->room_async;
	r = loop_async_new(d->loop, call_cb, d, &d->call_async);
	if (r < 0)
		goto out_free;
	/* Without a socket path the device is driven through the device API (embed.c). */
	if (cfg->socket_path) {
		r = dev_listen_unix(d->socket_path, SOCK_STREAM, &d->vhu_listen_fd);
		if (r < 0) {
			log_error("%s: cannot listen on %s: %s", d->name, d->socket_path,
				  strerror(-r));
			goto out_free;
		}
		r = loop_watch_add(d->loop, d->vhu_listen_fd, EPOLLIN, vhu_listen_cb, d,
				   &d->vhu_listen_w);
		if (r < 0)
			goto out_free;
	}
	r = host_open_listeners(d);
	if (r < 0)
		goto out_free;
	if (router) {
		pthread_mutex_lock(&router->lock);
		d->router_next = router->devs;
		router->devs = d;
		pthread_mutex_unlock(&router->lock);
	}
	*ret = d;
	return 0;

out_free:
	vsock_dev_free(d);
	return r;
}

/* Adds s's port to d's siblings (a reference). Returns 0 or -ENOMEM. */
static int sib_add(struct vsock_dev *d, struct vsock_dev *s)
{
	struct sib_port **v = realloc(d->sibs, (d->n_sibs + 1) * sizeof(*v));
	struct sib_port **w;
	unsigned i;

	if (!v)
		return -ENOMEM;
	d->sibs = v;
	w = realloc(d->wake, (d->n_sibs + 1) * sizeof(*w));
	if (!w)
		return -ENOMEM;
	d->wake = w;
	for (i = d->n_sibs; i > 0 && d->sibs[i - 1]->cid > s->cid; i--)
		d->sibs[i] = d->sibs[i - 1];
	__atomic_add_fetch(&s->port->refs, 1, __ATOMIC_RELAXED);
	d->sibs[i] = s->port;
	d->n_sibs++;
	return 0;
}

/*
 * Detaches a device that is being freed (not running) from its siblings, which may be running:
 * closes its port, so that no push or wakeup reaches it any more; drops what they had queued for
 * it, counted on each sender (peer_dropped) and answered with an RST as sib_gone does for what
 * they send later; wakes every sibling's room_async, so that one waiting for room in our inbox
 * (tx_staged) retries at once, finds the port closed and goes on; drops our references.
 */
static void sib_detach(struct vsock_dev *d)
{
	struct sib_port *port = d->port;
	struct sib_pkt *left[DEV_INBOX_PKTS + 1];
	struct sib_inbox *in;
	unsigned n = 0;

	if (!port)
		return;
	in = &port->inbox;
	pthread_mutex_lock(&in->lock);
	__atomic_store_n(&port->closed, true, __ATOMIC_RELAXED);
	port->inbox_async = port->room_async = NULL;
	while (n < in->count) {
		left[n++] = in->ring[in->head];
		in->head = (in->head + 1) % DEV_INBOX_PKTS;
	}
	/* count is read without the lock as a hint (atomic), as in sib_push and sib_take. */
	__atomic_store_n(&in->count, 0, __ATOMIC_RELAXED);
	in->bytes = 0;
	pthread_mutex_unlock(&in->lock);
	if (d->rx_cur) {
		left[n++] = d->rx_cur;
		d->rx_cur = NULL;
	}
	for (unsigned i = 0; i < n; i++) {
		struct sib_port *from = sib_lookup(d, left[i]->hdr.src_cid);

		/* Not a sibling's: an RST sib_gone queued for our own guest. */
		if (from && !sib_port_closed(from)) {
			__atomic_add_fetch(&from->peer_dropped, 1, __ATOMIC_RELAXED);
			if (sib_queue_rst(from, &left[i]->hdr))
				sib_port_signal(from, false);
		}
		free(left[i]);
	}
	for (unsigned i = 0; i < d->n_sibs; i++) {
		sib_port_signal(d->sibs[i], true);
		sib_port_unref(d->sibs[i]);
	}
	free(d->sibs);
	d->sibs = NULL;
	d->n_sibs = 0;
	sib_port_unref(port);
	d->port = NULL;
}

int vsock_dev_link_sibling(struct vsock_dev *a, struct vsock_dev *b)
{
	int r;

	if (a == b || a->router != b->router || !a->router || a->cid == b->cid)
		return -EINVAL;
	if (sib_lookup(a, b->cid))
		return 0;
	r = sib_add(a, b);
	if (r < 0)
		return r;
	return sib_add(b, a);
}

int vsock_dev_run(struct vsock_dev *d)
{
	int r;

	d->thread = pthread_self();
	__atomic_store_n(&d->thread_running, true, __ATOMIC_RELEASE);
	r = loop_run(d->loop);
	__atomic_store_n(&d->thread_running, false, __ATOMIC_RELEASE);
	return r;
}

void vsock_dev_stop(struct vsock_dev *d)
{
	loop_stop(d->loop);
}

void vsock_dev_free(struct vsock_dev *d)
{
	if (!d)
		return;
	if (d->vhu) {
		loop_watch_del(d->vhu_w);
		vhu_backend_free(d->vhu);
		d->vhu = NULL;
	}
	dev_queue_stop(d, 0);
	dev_queue_stop(d, 1);
	engine_destroy(d);
	guest_mem_free(d->mem_owned);
	host_close_listeners(d);
	if (d->vhu_listen_fd >= 0) {
		loop_watch_del(d->vhu_listen_w);
		close(d->vhu_listen_fd);
		unlink(d->socket_path);
	}
	if (d->router) {
		struct vsock_dev **pp;

		pthread_mutex_lock(&d->router->lock);
		for (pp = &d->router->devs; *pp; pp = &(*pp)->router_next)
			if (*pp == d) {
				*pp = d->router_next;
				break;
			}
		pthread_mutex_unlock(&d->router->lock);
	}
	/* Before our loop and its wakeups go: siblings may still be running. */
	sib_detach(d);
	pthread_mutex_destroy(&d->eng_lock);
	pthread_mutex_destroy(&d->call_lock);
	pthread_cond_destroy(&d->call_cond);
	loop_async_free(d->call_async);
	ops_tap_destroy(&d->tap);
	loop_async_free(d->inbox_async);
	loop_async_free(d->room_async);
	loop_timer_free(d->eng_timer);
	loop_timer_free(d->cont_timer);
	loop_timer_free(d->stage_timer);
	loop_free(d->loop);
	free(d->wake);
	free(d->scratch);
	free(d->tx_iov);
	free(d->tx_refs);
	free(d->tx_heads);
	free(d);
}

uint32_t vsock_dev_guest_cid(const struct vsock_dev *d)
{
	return d->cid;
}

const char *vsock_dev_uds_path(const struct vsock_dev *d)
{
	return d->uds_path;
}

const char *vsock_dev_name(const struct vsock_dev *d)
{
	return d->name;
}

struct ops_tap *vsock_dev_tap(struct vsock_dev *d)
{
	return &d->tap;
}
