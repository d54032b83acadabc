/* SPDX-License-Identifier: MIT */
/*
 * The device core (see vsock_dev.h): the TX and RX rings, the engine, settling what an event made
 * possible, the entry points of the device API (queue start/stop, reset), calls handed over from
 * other threads, and construction. Around it: sibling.c (the sibling port: hand-off between
 * VMs), vhu.c (the vhost-user glue, a user of the public device API), host_uds.c (host
 * sockets), embed.c (the public device API, <uvsock/device.h>), counters.c (what readers on
 * other threads see).
 *
 * TX (guest to device): kicks or a continuation drain the TX ring in batches of up to
 * DEV_TX_BATCH chains: each chain is validated (readable-only, header present, hdr.len fits the
 * chain, payload <= 64 KiB), its src_cid must be the VM's CID, and it is routed by dst_cid:
 * 2 goes to the engine (vsock_engine_feed_batch, payload borrowed straight from guest memory),
 * a linked sibling's CID to that sibling's inbox (copied, sibling.c), anything else is dropped
 * and counted.
 * Every chain is returned with used.len 0; one used-index publication and at most one interrupt
 * per batch. Draining stops while the engine cannot take more (queued replies at the TX ring size,
 * docs/vsock-protocol.md §5, as Linux drivers/vhost/vsock.c, vhost_vsock_more_replies()), and
 * after DEV_PASS_PKTS / DEV_PASS_BYTES per pass; a sibling with a full inbox stops it only once
 * what is held for full siblings reached its bound (sibling.c: replies are dropped, other
 * packets held, at most DEV_SIB_STALL_NS).
 *
 * RX (device to guest): each guest RX chain gets one packet from one of three producers behind
 * one table (struct dev_rx_src, device_internal.h): the engine (pulled with max_payload = chain
 * room - 44, so it always fits), the host bytes read in place (host_uds.c: one readv over up to
 * DEV_RX_GATHER chains, credit reserved once), or the sibling inbox (sibling.c: split over as
 * many chains as needed), the inbox given its share (DEV_RX_ENG_SHARE). used.len = 44 + payload.
 *
 * Lifetimes: the engine exists while the TX ring has been started since the last reset; when
 * the rings stop (guest reset) or the VMM disconnects, every connection is dropped (the guest's
 * sockets are gone), host sockets are closed, and the next start builds a fresh engine. A VMM
 * disconnect never frees the device. Siblings reach each other only through their
 * reference-counted ports (struct sib_port), so a device can be freed while its siblings run
 * (dev_sib_detach); packets for it are then dropped and answered with an RST.
 */
#include "device/vsock_dev.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/vhu.h"
#include "ops/vmlog.h"
#include "uvsock/device.h"
#include "util/fdcheck.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/tune.h"
#include "vring/guest_mem.h"

struct vsock_router {
	pthread_mutex_t lock;
	struct vsock_dev *devs;
};

/* sock_event user value of the two wildcard listeners. */
static char listener_mark;

/* The moved connections of a loaded state (dev_end_moved_conns, below). */
static void moved_decide(struct vsock_dev *d);
static void moved_chain(struct vsock_dev *d);

/* ---- small helpers ---------------------------------------------------------------------- */

/*
 * Interrupts the guest. Never blocks, even on a call eventfd the VMM left in blocking mode: a
 * saturated counter (-EAGAIN) means an interrupt is pending already.
 */
static void signal_fd(struct vsock_dev *d, int fd)
{
	int r;

	if (fd < 0)
		return;
	r = eventfd_signal_nb(fd);
	if (r < 0 && r != -EAGAIN)
		log_vm_dev(LOG_LVL_WARN, d->cid, "call eventfd write failed: %s", strerror(-r));
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
	if (dev_broken(d))
		return;
	atomic_store_explicit(&d->broken, true, memory_order_relaxed);
	DEV_STAT_ADD(d, ring_errors, 1);
	log_vm_dev(LOG_LVL_WARN, d->cid,
		   "%s ring error: %s; device stopped until the rings restart",
		   dq == &d->rxq ? "rx" : "tx",
		   vring_dev_error(&dq->q) != VRING_ERR_NONE ? vring_dev_error_msg(&dq->q) : what);
}

/*
 * False (and the device marked broken) once the front-end truncated the guest memory under us:
 * the SIGBUS guard (src/vring/fault.h) mapped zeros over the region and poisoned the map, so
 * nothing read from it since can be trusted. The map stays poisoned until a new memory table.
 */
static bool mem_intact(struct vsock_dev *d, struct dev_queue *dq)
{
	if (!d->mem || !guest_mem_poisoned(d->mem))
		return true;
	mark_broken(d, dq, "guest memory shrank under the device");
	return false;
}

static void cont_schedule(struct vsock_dev *d)
{
	if (!loop_timer_armed(d->cont_timer))
		loop_timer_arm(d->cont_timer, 0);
}

/* ---- RX: device to guest ----------------------------------------------------------------- */

/*
 * The engine as an RX producer (struct dev_rx_src): its queued packets (control, replies, bytes
 * queued by send), each pulled with the buffer's room as its largest payload, so it always fits.
 */
static size_t eng_rx_pending(struct vsock_dev *d)
{
	return d->eng && vsock_engine_has_pending(d->eng) ? 1 : 0;
}

static unsigned eng_rx_fill(struct vsock_dev *d, struct dev_rx_buf *b, unsigned nb)
{
	struct iovec piov[DEV_RX_IOV_MAX];
	unsigned k = 0;

	for (; k < nb && d->eng; k++) {
		int pn = iov_slice(b[k].iov, b[k].iovcnt, VSOCK_HDR_SIZE, b[k].room, piov,
				   DEV_RX_IOV_MAX);

		if (pn < 0 || vsock_engine_pull(d->eng, &b[k].h, piov, pn, b[k].room) < 0)
			break;
	}
	return k;
}

static const struct dev_rx_src eng_rx = {
	.pending = eng_rx_pending,
	.fill = eng_rx_fill,
	.max_bufs = 1,
};

/*
 * Which producer fills the next RX buffer (at least one has packets): the sibling inbox when
 * the VM's own (engine, host) have none, or when they have had their DEV_RX_ENG_SHARE buffers
 * since the inbox's last one; the VM's own otherwise.
 */
static bool rx_sib_next(const struct vsock_dev *d, bool have_own, bool have_sib)
{
	return !have_own || (have_sib && d->rx_eng_run >= DEV_RX_ENG_SHARE);
}

/* Counts k RX buffers filled by the sibling inbox (sib) or the VM's own producers. */
static void rx_account(struct vsock_dev *d, bool sib, unsigned k)
{
	if (k == 0)
		return;
	if (sib)
		d->rx_eng_run = 0;
	else
		d->rx_eng_run = MIN(d->rx_eng_run + k, DEV_RX_ENG_SHARE);
}

/* Puts packet h (payload already in place) into RX buffer b and counts it. */
static void rx_put(struct vsock_dev *d, const struct dev_rx_buf *b)
{
	struct iovec piov[DEV_RX_IOV_MAX];
	uint8_t wire[VSOCK_HDR_SIZE];
	int pn = iov_slice(b->iov, b->iovcnt, VSOCK_HDR_SIZE, b->h.len, piov, DEV_RX_IOV_MAX);

	vsock_hdr_encode(&b->h, wire);
	OPS_TAP(&d->tap, &b->h, piov, pn);
	iov_write_at(b->iov, b->iovcnt, 0, wire, VSOCK_HDR_SIZE);
	/* Migration: the pages of header and payload go into the dirty log (when it is on). */
	vring_dev_log_written(&d->rxq.q, b->iov, b->iovcnt, VSOCK_HDR_SIZE + b->h.len);
	(void)vring_dev_fill(&d->rxq.q, b->head, VSOCK_HDR_SIZE + b->h.len);
}

/*
 * Pops one guest RX buffer into *b, its chain described in iov (DEV_RX_IOV_MAX entries):
 * RX_POP_OK, RX_POP_EMPTY (the ring has none), or RX_POP_BAD (a bad buffer: returned empty, the
 * device marked broken).
 */
enum rx_pop_res { RX_POP_OK, RX_POP_EMPTY, RX_POP_BAD };

static enum rx_pop_res rx_pop(struct vsock_dev *d, struct iovec *iov, struct dev_rx_buf *b)
{
	struct dev_queue *dq = &d->rxq;
	struct iovec out_none[1], piov[DEV_RX_IOV_MAX];
	struct vring_chain ch;
	int r = vring_dev_pop(&dq->q, out_none, 0, iov, DEV_RX_IOV_MAX, &ch);
	size_t room;

	if (r == -EAGAIN)
		return RX_POP_EMPTY;
	if (r == -ENOBUFS) {
		uint16_t head;

		if (vring_dev_skip(&dq->q, &head) == 0)
			(void)vring_dev_fill(&dq->q, head, 0);
		mark_broken(d, dq, "rx buffer with readable descriptors or too many segments");
		return RX_POP_BAD;
	}
	if (r < 0) {
		mark_broken(d, dq, "rx pop failed");
		return RX_POP_BAD;
	}
	if (ch.in_len < VSOCK_HDR_SIZE) {
		(void)vring_dev_fill(&dq->q, ch.head, 0);
		mark_broken(d, dq, "rx buffer shorter than the 44-byte header");
		return RX_POP_BAD;
	}
	room = MIN(ch.in_len - VSOCK_HDR_SIZE, (uint64_t)d->max_pkt);
	if (iov_slice(iov, ch.in_num, VSOCK_HDR_SIZE, room, piov, DEV_RX_IOV_MAX) < 0) {
		(void)vring_dev_fill(&dq->q, ch.head, 0);
		mark_broken(d, dq, "rx buffer layout");
		return RX_POP_BAD;
	}
	*b = (struct dev_rx_buf){ .head = ch.head, .iov = iov, .iovcnt = ch.in_num, .room = room };
	return RX_POP_OK;
}

/* Every producer stops until the next fill (the ring has no buffer, or does not run). */
static void rx_park(struct vsock_dev *d, bool stopped)
{
	dev_sib_rx.park(d, stopped);
	dev_host_rx.park(d, stopped);
}

/*
 * One RX pass: each guest buffer gets one packet from one producer (struct dev_rx_src): the
 * engine first, then the host bytes waiting to be read in place, with the sibling inbox given
 * its share (rx_sib_next). A producer that takes several buffers (the host: one readv over up
 * to DEV_RX_GATHER buffers, DEV_RX_GATHER_BYTES) gets as many as its pending bytes need; what
 * it leaves unused goes to the engine (what reading left there: a SHUTDOWN at host EOF, an
 * RST), else back empty. One used-index publication and at most one interrupt per pass.
 */
static void rx_fill(struct vsock_dev *d)
{
	struct dev_queue *dq = &d->rxq;
	struct dev_rx_buf b[DEV_RX_GATHER];
	unsigned pkts = 0;
	size_t bytes = 0;
	bool filled = false;

	d->rx_more = false;
	if (!dq->running || dev_broken(d) || !mem_intact(d, dq)) {
		rx_park(d, !dq->running);
		return;
	}
	dev_evq_flush(d); /* a pending reset goes before the new session's first packet */
	vring_dev_disable_notify(&dq->q);
	for (;;) {
		bool have_eng = eng_rx.pending(d) > 0;
		size_t want = have_eng ? 1 : dev_host_rx.pending(d);
		bool have_sib = dev_sib_rx.pending(d) > 0;
		const struct dev_rx_src *src;
		unsigned nb = 1, k, max;
		enum rx_pop_res pr;
		bool sib;

		if (!want && !have_sib)
			break;
		if (pkts >= DEV_PASS_PKTS || bytes >= DEV_PASS_BYTES) {
			d->rx_more = true;
			break;
		}
		pr = rx_pop(d, d->rx_gather_iov[0], &b[0]);
		if (pr == RX_POP_EMPTY) {
			/* Out of guest buffers: ask for a kick, unless some arrived meanwhile. */
			if (vring_dev_enable_notify(&dq->q)) {
				vring_dev_disable_notify(&dq->q);
				continue;
			}
			rx_park(d, false);
			break;
		}
		filled = true;
		if (pr == RX_POP_BAD)
			break;
		sib = rx_sib_next(d, want > 0, have_sib);
		src = sib ? &dev_sib_rx : have_eng ? &eng_rx : &dev_host_rx;
		/* More buffers for what the producer has (anything but a good one ends this; the
		 * next pop handles it). */
		max = MIN(src->max_bufs, MIN(DEV_PASS_PKTS - pkts, DEV_RX_GATHER));
		want = MIN(want, (size_t)DEV_RX_GATHER_BYTES);
		for (size_t got = b[0].room; nb < max && got < want; got += b[nb++].room)
			if (vring_dev_empty(&dq->q) || rx_pop(d, d->rx_gather_iov[nb], &b[nb]) != RX_POP_OK)
				break;
		k = src->fill(d, b, nb);
		rx_account(d, sib, k);
		if (src != &eng_rx) {
			unsigned e = eng_rx_fill(d, b + k, nb - k);

			rx_account(d, false, e);
			k += e;
		}
		for (unsigned i = 0; i < nb; i++) {
			if (i >= k) {
				(void)vring_dev_fill(&dq->q, b[i].head, 0);
				continue;
			}
			rx_put(d, &b[i]);
			bytes += b[i].h.len;
			pkts++;
		}
		if (k == 0) {
			/* pending said yes; nothing came: the buffer went back unused. */
			rx_park(d, false);
			break;
		}
		if (dev_broken(d))
			break; /* a bad buffer among the gathered ones */
	}
	if (filled)
		queue_notify(d, dq);
	DEV_STAT_ADD(d, rx_pkts, pkts);
	DEV_STAT_ADD(d, rx_bytes, bytes);
}

/* ---- TX: guest to device ----------------------------------------------------------------- */

/* Validates one popped TX chain and routes it. *ref is filled for DEV_TX_ENGINE. */
static enum dev_tx_verdict tx_classify(struct vsock_dev *d, const struct vring_chain *ch,
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
		return DEV_TX_DROP;
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
		return DEV_TX_DROP;
	}
	if (h.src_cid != d->cid) {
		DEV_STAT_ADD(d, tx_bad_src_cid, 1);
		log_vm(LOG_LVL_WARN, d->cid, h.dst_port, h.src_port,
		       "tx packet with spoofed src_cid %llu dropped", (unsigned long long)h.src_cid);
		return DEV_TX_DROP;
	}
	DEV_STAT_ADD(d, tx_pkts, 1);
	DEV_STAT_ADD(d, tx_bytes, h.len);
	if (h.type == VSOCK_TYPE_DGRAM)
		return dev_dgram_tx(d, &h, iov, ch->out_num);
	if (h.dst_cid == VMADDR_CID_HOST) {
		struct iovec *piov = iov + ch->out_num;

		/* The payload slice goes after the chain's own entries in the same row. */
		pn = iov_slice(iov, ch->out_num, VSOCK_HDR_SIZE, h.len, piov,
			       DEV_TX_IOV_MAX - ch->out_num);
		if (pn < 0) {
			DEV_STAT_ADD(d, tx_bad_chain, 1);
			return DEV_TX_DROP;
		}
		OPS_TAP(&d->tap, &h, piov, pn);
		ref->hdr = h;
		ref->iov = piov;
		ref->iovcnt = pn;
		return DEV_TX_ENGINE;
	}
	t = dev_sib_lookup(d, h.dst_cid);
	if (!t) {
		DEV_STAT_ADD(d, tx_bad_dst_cid, 1);
		log_vm(LOG_LVL_WARN, d->cid, h.dst_port, h.src_port,
		       "tx packet to cid %llu dropped: no route (not the host or a sibling)",
		       (unsigned long long)h.dst_cid);
		return DEV_TX_DROP;
	}
	return dev_sib_send(d, t, &h, iov, ch->out_num);
}

static void dev_tx_drain(struct vsock_dev *d)
{
	struct dev_queue *dq = &d->txq;
	struct iovec in_iov[1];
	unsigned pkts = 0;
	size_t bytes = 0;
	bool stop = false;

	d->tx_more = false;
	d->tx_throttled = false;
	if (!dq->running || dev_broken(d) || !d->eng || !mem_intact(d, dq))
		return;
	if (!dev_sib_retry_staged(d)) {
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
		while (nh < (d->tx_batch ? DEV_TX_BATCH : 1u)) {
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
			if (d->moved_wait && (r == 0 || r == -ENOBUFS))
				moved_chain(d);
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
			case DEV_TX_ENGINE:
				bytes += d->tx_refs[n].hdr.len;
				n++;
				break;
			case DEV_TX_SIBLING_FULL:
				d->tx_throttled = true;
				stop = true;
				break;
			case DEV_TX_SIBLING_SENT:
			case DEV_TX_DROP:
				break;
			}
			if (stop)
				break;
		}
		if (!mem_intact(d, dq))
			return;
		if (n)
			vsock_engine_feed_batch(d->eng, d->tx_refs, n);
		for (unsigned i = 0; i < nh; i++)
			(void)vring_dev_fill(&dq->q, d->tx_heads[i], 0);
		if (nh)
			queue_notify(d, dq);
		dev_sib_wake_targets(d);
	}
	if (!d->tx_more && !d->tx_throttled && !dev_broken(d) && vring_dev_enable_notify(&dq->q))
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
	dev_host_mark_dirty(user);
}

static size_t eng_deliver(void *opaque, struct vsock_sock *s, void *user, const struct iovec *iov,
			  int iovcnt, size_t len)
{
	(void)s;
	if (user == &listener_mark)
		return 0;
	return dev_host_deliver(opaque, user, iov, iovcnt, len);
}

static void eng_tx_sent(void *opaque, struct vsock_sock *s, void *user, uint32_t len,
			uint32_t end)
{
	(void)opaque;
	(void)s;
	if (user && user != &listener_mark)
		dev_host_tx_sent(user, len, end);
}

static const struct vsock_engine_ops eng_ops = {
	.now = eng_now,
	.tx_ready = eng_tx_ready,
	.sock_event = eng_sock_event,
	.deliver = eng_deliver,
	.tx_sent = eng_tx_sent,
};

/* The zerocopy switch off: every guest payload is queued in the engine (the copying path). */
static const struct vsock_engine_ops eng_ops_copy = {
	.now = eng_now,
	.tx_ready = eng_tx_ready,
	.sock_event = eng_sock_event,
	.tx_sent = eng_tx_sent,
};

/* A new engine for d (no socket yet), its reply ring as large as the TX ring (tx_num). */
static int engine_new(struct vsock_dev *d, unsigned tx_num, struct vsock_engine **ret)
{
	struct vsock_engine_config cfg;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = VMADDR_CID_HOST;
	cfg.buf_size = d->buf_alloc;
	if (cfg.buf_max < d->buf_alloc)
		cfg.buf_max = d->buf_alloc;
	cfg.max_pkt = d->max_pkt;
	cfg.max_socks = d->max_conns + 8;
	cfg.reply_limit = tx_num;
	cfg.port_lo = DEV_HOST_PORT_LO;
	cfg.port_hi = DEV_HOST_PORT_HI;
	cfg.seqpacket = !!(d->features & (1ull << VIRTIO_VSOCK_F_SEQPACKET));
	/* Host bytes in flight are in the guest's RX buffers, not ours: the guest's credit alone
	 * bounds them (docs/vsock-protocol.md §3, "The device role's window"). */
	cfg.tx_window_peer = true;
	cfg.ops = d->zerocopy ? &eng_ops : &eng_ops_copy;
	cfg.opaque = d;
	return vsock_engine_new(&cfg, ret);
}

static int engine_create(struct vsock_dev *d, unsigned tx_num)
{
	bool seqpacket = !!(d->features & (1ull << VIRTIO_VSOCK_F_SEQPACKET));
	struct vsock_engine *e;
	int r;

	r = engine_new(d, tx_num, &e);
	if (r < 0)
		return r;
	for (int i = 0; i < 2; i++) {
		enum vsock_type type = i == 0 ? VSOCK_TYPE_STREAM : VSOCK_TYPE_SEQPACKET;

		if (type == VSOCK_TYPE_SEQPACKET && !seqpacket)
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
	uint64_t es_conns = 0;

	/* Withdrawn from readers first, its counters moved into eng_past in the same step so that
	 * readers never see them missing; host sockets are closed before the engine goes. */
	pthread_mutex_lock(&d->eng_lock);
	e = d->eng;
	if (e) {
		struct vsock_engine_stats es;

		vsock_engine_get_stats(e, &es);
		dev_counters_eng_accumulate(&d->eng_past, &es, !!d->lst[0] + !!d->lst[1]);
		es_conns = es.socks_open - MIN(es.socks_open, (uint64_t)(!!d->lst[0] + !!d->lst[1]));
	}
	d->eng = NULL;
	pthread_mutex_unlock(&d->eng_lock);
	dev_host_close_all(d);
	vsock_engine_free(e);
	d->lst[0] = d->lst[1] = NULL;
	d->accept_pending = false;
	d->tx_throttled = false;
	d->tx_more = d->rx_more = false;
	dev_sib_drop_staged(d);
	if (d->eng_timer)
		loop_timer_disarm(d->eng_timer);
	/* Moved connections not ended yet are the guest's too (dev_end_moved_conns). */
	if (d->moved_wait)
		es_conns++;
	d->moved_wait = false;
	free(d->moved);
	d->moved = NULL;
	d->nmoved = 0;
	/* The guest may still hold connections the device no longer has: tell it (evq.h). */
	if (es_conns)
		dev_evq_reset_needed(d);
}

/* ---- settle: run what the last event made possible ---------------------------------------- */

void dev_settle(struct vsock_dev *d)
{
	if (d->frozen)
		return;
	for (int round = 0; round < 4; round++) {
		if (d->accept_pending && d->eng)
			dev_host_accept_guest_conns(d);
		dev_host_service_dirty(d);
		rx_fill(d);
		/* Pulling replies may have made room for TX again (docs/vsock-protocol.md §5). */
		if (d->eng && d->tx_throttled && !dev_sib_hold_full(d) &&
		    vsock_engine_can_feed(d->eng))
			dev_tx_drain(d);
		if (!dev_host_has_dirty(d) && !(d->accept_pending && d->eng) && !d->rx_more)
			break;
	}
	if (d->rx_more || d->tx_more || dev_host_has_dirty(d) ||
	    (d->eng && d->tx_throttled && !dev_sib_hold_full(d) &&
		    vsock_engine_can_feed(d->eng)))
		cont_schedule(d);
	if (d->eng) {
		uint64_t dl = vsock_engine_next_deadline(d->eng);

		if (dl == UINT64_MAX)
			loop_timer_disarm(d->eng_timer);
		else
			loop_timer_arm(d->eng_timer, dl);
	}
	/* Crash survival: the list of connections kept outside (one relaxed load per pass). */
	if (d->conns_hook && d->eng && vsock_engine_conn_changes(d->eng) != d->conns_seen) {
		d->conns_seen = vsock_engine_conn_changes(d->eng);
		d->conns_hook(d->conns_hook_arg);
	}
}

static void cont_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)t;
	if (d->frozen)
		return;
	if (d->tx_more)
		dev_tx_drain(d);
	dev_settle(d);
}

static void eng_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)t;
	if (d->frozen)
		return;
	if (d->eng)
		vsock_engine_run_timers(d->eng);
	dev_settle(d);
}

/* ---- rings -------------------------------------------------------------------------------- */

/* Kicks while no ring moved that mean the VMM's guest memory is not shared with us (below). */
#define DEV_MEM_IDLE_KICKS 3u

/*
 * A driver kicks after it made buffers available (virtio 1.2 §2.7.13), so kicks while neither
 * ring's avail index ever moved in our mapping mean the guest writes memory we do not see: QEMU's
 * memory backend without share=on (a private copy-on-write mapping of the fd it gave us). Nothing
 * else says so: the rings start, the guest's connects just time out. The threshold leaves room
 * for one kick per ring that a VMM may send as a ring starts. Once per VMM session; a ring that
 * moved ends the check. Context: device thread, each kick until the check is done.
 */
static void dev_mem_check_kick(struct vsock_dev *d)
{
	struct dev_queue *qs[2] = { &d->rxq, &d->txq };

	for (unsigned i = 0; i < ARRAY_SIZE(qs); i++)
		if (qs[i]->running && (vring_dev_last_avail_idx(&qs[i]->q) != qs[i]->start_avail ||
				       vring_dev_avail_count(&qs[i]->q) != 0)) {
			d->mem_checked = true;
			return;
		}
	if (++d->mem_idle_kicks < DEV_MEM_IDLE_KICKS)
		return;
	d->mem_checked = true;
	DEV_STAT_ADD(d, guest_mem_unshared, 1);
	log_warn("%s: the guest kicked %u times but no ring's avail index ever moved in the guest "
		 "memory the VMM shared: its memory backend is not shared; give QEMU's "
		 "memory-backend-file or -memfd share=on (docs/vhost-user.md)",
		 d->name, d->mem_idle_kicks);
}

static void kick_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct dev_queue *dq = opaque;
	struct vsock_dev *d = dq->dev;

	(void)l;
	if (events & (EPOLLHUP | EPOLLERR)) {
		/* epoll reports these whatever was asked: stop watching, or the thread would spin. */
		loop_watch_del(dq->kick_w);
		dq->kick_w = NULL;
		mark_broken(d, dq, "kick fd hung up or failed");
		return;
	}
	/* Never blocks, even if the VMM read the counter between our wakeup and this read. */
	(void)eventfd_consume_nb(fd, NULL);
	if (!d->mem_checked)
		dev_mem_check_kick(d);
	if (dq == &d->txq)
		dev_tx_drain(d);
	dev_settle(d);
}

/* ---- rings: the entry points of the device API (embed.c) ------------------------------------ */

/*
 * TX starts on a held session (dev_session_hold): at the index of a new driver (the guest reset
 * the device while it was stopped) the connections end as at any reset; at any other index the
 * guest resumes where it stopped (a failed migration, a pause) and so do they.
 */
static void hold_release(struct vsock_dev *d, uint16_t tx_base)
{
	uint16_t fresh = d->features & (1ull << VRING_FEAT_RING_PACKED) ? 0x8000u : 0;

	d->held = false;
	if (!d->frozen)
		return; /* stopped and started within one message (a memory table): nothing held */
	/* A surviving guest whose TX index wrapped to exactly this value is taken for a new
	 * driver (evq.h has the same limit). */
	if (tx_base == fresh)
		engine_destroy(d);
	(void)vsock_dev_thaw(d);
}

int dev_queue_start(struct vsock_dev *d, unsigned qidx, const struct vring_dev_config *cfg,
		    int kick_fd, int call_fd)
{
	struct dev_queue *dq;
	int r;

	if (qidx == UVSOCK_DEV_QUEUE_EVENT && kick_fd >= 0) {
		r = dev_evq_start(d, cfg, kick_fd, call_fd);
		if (r == 0 && d->moved_wait)
			moved_decide(d); /* the event queue is ours: a TRANSPORT_RESET */
		return r;
	}
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
	dq->start_avail = vring_dev_last_avail_idx(&dq->q);
	dq->num = cfg->num;
	dq->running = true;
	d->features = cfg->features;
	dev_dgram_features(d);
	atomic_store_explicit(&d->broken, false, memory_order_relaxed);
	if (qidx == 1 && d->held)
		hold_release(d, cfg->last_avail_idx);
	if (qidx == 1 && !d->eng) {
		r = engine_create(d, cfg->num);
		if (r < 0) {
			loop_watch_del(dq->kick_w);
			dq->kick_w = NULL;
			dq->running = false;
			dq->kick_fd = dq->call_fd = -1;
			return r;
		}
		dev_evq_session_start(d, cfg->last_avail_idx);
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

	if (qidx == UVSOCK_DEV_QUEUE_EVENT)
		return dev_evq_stop(d);

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
	else if (qidx == UVSOCK_DEV_QUEUE_EVENT)
		dev_evq_set_call_fd(d, call_fd);
}

void dev_reset(struct vsock_dev *d)
{
	dev_queue_stop(d, 0);
	dev_queue_stop(d, 1);
	dev_evq_stop(d);
	engine_destroy(d);
	dev_sib_drop_all(d);
	atomic_store_explicit(&d->broken, false, memory_order_relaxed);
}

int dev_transport_reset(struct vsock_dev *d)
{
	int r = 0;

	/* One event, whether or not engine_destroy found connections to drop. */
	d->evq_reset_pending = true;
	engine_destroy(d);
	dev_evq_flush(d);
	if (d->txq.running) {
		r = engine_create(d, d->txq.num);
		d->tx_more = d->rx_more = r == 0;
		cont_schedule(d);
	}
	return r;
}

/* ---- services for the vhost-user glue (vhu.h) --------------------------------------------- */

void dev_set_conns_hook(struct vsock_dev *d, void (*fn)(void *arg), void *arg)
{
	d->conns_hook = fn;
	d->conns_hook_arg = arg;
}

int dev_save_conns(struct vsock_dev *d, struct rec_writer *w)
{
	int r;

	if (!d->eng)
		return 0;
	r = vsock_engine_save_conns(d->eng, w);
	return r < 0 ? r : 1;
}

size_t dev_reset_conns(struct vsock_dev *d, const struct vsock_conn_addr *a, size_t n)
{
	size_t sent = 0, i = 0;

	if (!d->eng)
		return 0;
	for (; i < n; i++) {
		int r = vsock_engine_reset_conn(d->eng, (enum vsock_type)a[i].type, a[i].local_port,
						a[i].peer_cid, a[i].peer_port);

		if (r == -ENOBUFS)
			break;
		/* -EEXIST: a connection of this device has that address now; -EINVAL: no type
		 * that has connections. Neither gets an RST. */
		sent += r == 0;
	}
	if (i < n)
		log_vm_dev(LOG_LVL_WARN, d->cid, "%s: %zu of %zu lost connections get no RST (the "
			   "reply ring is full); their next packet ends them", d->name, n - i, n);
	if (sent) {
		d->rx_more = true;
		cont_schedule(d);
	}
	return sent;
}

struct uvsock_dev *dev_api(struct vsock_dev *d)
{
	return (struct uvsock_dev *)(void *)d;
}

struct loop *dev_loop(struct vsock_dev *d)
{
	return d->loop;
}

void dev_borrow_mem(struct vsock_dev *d, const struct guest_mem *mem, uint64_t features)
{
	d->mem = mem;
	d->features = features;
}

void dev_drop_mem(struct vsock_dev *d)
{
	d->mem = NULL;
}

void dev_set_vmm_state(struct vsock_dev *d, bool connected)
{
	atomic_store_explicit(&d->vmm_connected, connected, memory_order_relaxed);
	if (connected) {
		DEV_STAT_ADD(d, vmm_connects, 1);
		d->mem_checked = false;
		d->mem_idle_kicks = 0;
	}
}

void dev_vmm_restored(struct vsock_dev *d)
{
	atomic_store_explicit(&d->vmm_connected, true, memory_order_relaxed);
}

void dev_signal_calls(struct vsock_dev *d)
{
	const uint64_t one = 1;

	/* An interrupt the old process decided not to send (event index) is one the guest did not
	 * ask for; one it sent is seen twice at worst. A lost one would hang the guest. */
	if (d->rxq.running && d->rxq.call_fd >= 0)
		(void)!write(d->rxq.call_fd, &one, sizeof(one));
	if (d->txq.running && d->txq.call_fd >= 0)
		(void)!write(d->txq.call_fd, &one, sizeof(one));
}

void dev_message_done(struct vsock_dev *d)
{
	/* A session held for a state save (dev_session_hold) keeps its connections, frozen. */
	if (d->held && d->eng && !d->txq.running && !d->frozen) {
		log_info("%s: rings stopped: the connections are held for a state save", d->name);
		vsock_dev_freeze(d);
	}
	/* Rings stopped and not restarted within the message: the guest reset the device. */
	if (d->eng && !d->txq.running && !d->held) {
		log_info("%s: rings stopped: resetting every connection", d->name);
		/* Only the connections: the RX ring is the back-end's to stop (vq_stop). */
		engine_destroy(d);
	}
	dev_settle(d);
}

/* ---- services for the state transfer (vhu.h, vhu_state.c) --------------------------------- */

/*
 * Ends the moved connections (dev_end_moved_conns) one way, once. A guest with the event queue
 * handed over ends every socket at the TRANSPORT_RESET (Linux: virtio_vsock_event_handle), and
 * it takes RX and the event queue apart: RSTs as well would race the event, which would then
 * end the first connection the guest opened after taking them. So the reset alone where the
 * event queue runs, else an RST each (QEMU keeps the event queue). As crash survival does
 * (vhu.c, adopt_offered).
 */
static void moved_decide(struct vsock_dev *d)
{
	struct vsock_conn_addr *c = d->moved;
	size_t n = d->nmoved;

	d->moved_wait = false;
	d->moved = NULL;
	d->nmoved = 0;
	if (d->evq.running) {
		log_vm_dev(LOG_LVL_INFO, d->cid, "%s: the %zu moved connections end with a "
			   "TRANSPORT_RESET (the event queue is the back-end's)", d->name, n);
		dev_evq_reset_needed(d);
	} else {
		log_vm_dev(LOG_LVL_INFO, d->cid, "%s: the %zu moved connections end with an RST each "
			   "(the event queue is the front-end's)", d->name, n);
		(void)dev_reset_conns(d, c, n);
	}
	free(c);
}

/* dev_tx_drain popped a chain while moved connections wait: the first one the guest made
 * available after they were named means the guest runs. */
static void moved_chain(struct vsock_dev *d)
{
	if (d->moved_old)
		d->moved_old--;
	else
		moved_decide(d);
}

void dev_end_moved_conns(struct vsock_dev *d, const struct vsock_conn_addr *c, size_t n)
{
	int avail;

	/* n may be 0: a session ran, and its connections to sibling VMs (not the device's, so not
	 * named) end with the move too, which a TRANSPORT_RESET tells the guest. */
	if (!d->eng)
		return;
	free(d->moved);
	d->moved = n ? malloc(n * sizeof(*c)) : NULL;
	if (n && !d->moved) {
		/* Decided now: with no event queue yet, RSTs, which at worst race a reset that
		 * only a front-end starting the event queue after the guest resumed would bring. */
		d->nmoved = 0;
		d->moved_wait = false;
		if (d->evq.running)
			dev_evq_reset_needed(d);
		else
			(void)dev_reset_conns(d, c, n);
		return;
	}
	if (n)
		memcpy(d->moved, c, n * sizeof(*c));
	d->nmoved = n;
	d->moved_wait = true;
	/*
	 * Whether the event queue is ours is known only once the front-end has started the device:
	 * it starts the rings one message at a time (rx, tx, then the event queue, if it hands it
	 * over), and nothing says how many it will start. The guest resumes only after that. So
	 * the decision waits for whichever comes first: the event queue starting (it is ours: a
	 * reset), or a TX chain the guest made available after now (it runs, so the front-end is
	 * done: the event queue is ours if it runs then). Chains already in the ring were written
	 * before the move, while the source ran, and prove nothing. A guest that never sends
	 * after a move without the event queue gets the RSTs at its first packet; each packet on a
	 * moved connection gets its RST from the engine anyway.
	 */
	avail = vring_dev_avail_count(&d->txq.q);
	d->moved_old = avail > 0 ? (unsigned)avail : 0;
	if (d->evq.running)
		moved_decide(d);
}

void dev_session_hold(struct vsock_dev *d, bool on)
{
	if (on) {
		d->held = true;
		return;
	}
	/* Let go (the VMM left): unfrozen, so that the reset that follows finds a live device. */
	d->held = false;
	if (d->frozen)
		(void)vsock_dev_thaw(d);
}

bool dev_session_held(const struct vsock_dev *d)
{
	return d->held && d->frozen && d->eng;
}

void dev_session_handed_over(struct vsock_dev *d)
{
	/* The host sockets are the other device's now: closed here, never read or written (the
	 * engine is freed without a packet: the rings are stopped). The guest is told at the next
	 * TX start, as after any reset, if the front-end comes back to this device. */
	d->held = false;
	engine_destroy(d);
	(void)vsock_dev_thaw(d);
}

int dev_save_moved(struct vsock_dev *d, struct rec_writer *w)
{
	uint64_t acked = d->features;
	int r;

	/* The vhost-user glue's rings run with the transport bits as acked (dev_borrow_mem); the
	 * record holds the device's own, which is what its reader accepts. */
	d->features &= uvsock_dev_features();
	r = vsock_dev_save(d, w);
	d->features = acked;
	return r;
}

int dev_restore_moved(struct vsock_dev *d, struct rec_doc *doc)
{
	struct uds_listener own_l = d->host.uds_l, own_seq = d->host.uds_seq_l, own_dg = d->dgram.l;
	int r;

	if (d->eng || d->host.conns || d->txq.running || d->rxq.running)
		return rec_fail(doc, -EBUSY, "the device already has a session");
	vsock_dev_freeze(d);
	/* The record's listeners and datagram socket are the saving device's (its socket files);
	 * this device keeps its own: set aside while the record is read, the record's duplicates
	 * closed after. */
	d->host.uds_l.fd = d->host.uds_seq_l.fd = d->dgram.l.fd = -1;
	r = vsock_dev_restore(d, doc);
	if (r == 0)
		r = rec_check_fds_claimed(doc);
	if (r < 0 && d->eng) {
		/* Refused after the restore took it (an fd nobody claims): drop it unsent. */
		engine_destroy(d);
	}
	if (d->host.uds_l.fd >= 0)
		close(d->host.uds_l.fd);
	if (d->host.uds_seq_l.fd >= 0)
		close(d->host.uds_seq_l.fd);
	if (d->dgram.l.fd >= 0)
		close(d->dgram.l.fd);
	d->host.uds_l = own_l;
	d->host.uds_seq_l = own_seq;
	d->dgram.l = own_dg;
	if (r < 0) {
		(void)vsock_dev_thaw(d);
		return r;
	}
	/* Frozen until TX starts at the saved index (hold_release thaws it). */
	d->held = true;
	return 0;
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

	/* acquire: pairs with the release in vsock_dev_run, so d->thread is the running one's. */
	if (!atomic_load_explicit(&d->thread_running, memory_order_acquire) ||
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

static void dev_log_listen_error(const struct vsock_dev *d, const char *path, int err)
{
	if (err == -EADDRINUSE)
		log_error("%s: cannot listen on %s: another process serves it", d->name, path);
	else
		log_error("%s: cannot listen on %s: %s", d->name, path, strerror(-err));
}

const struct dev_up dev_up = {
	.settle = dev_settle,
	.tx_drain = dev_tx_drain,
	.call = dev_call,
	.listen_error = dev_log_listen_error,
};

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
	if (strlen(cfg->uds_path) + 11 >= sizeof(d->uds_path))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->rxq.kick_fd = d->rxq.call_fd = d->txq.kick_fd = d->txq.call_fd = -1;
	d->evq.kick_fd = d->evq.call_fd = -1;
	d->evq.dev = d;
	d->evq.idx = UVSOCK_DEV_QUEUE_EVENT;
	d->rxq.dev = d->txq.dev = d;
	d->rxq.idx = 0;
	d->txq.idx = 1;
	d->cid = cfg->guest_cid;
	if (cfg->name)
		snprintf(d->name, sizeof(d->name), "%s", cfg->name);
	else
		snprintf(d->name, sizeof(d->name), "cid%u", cfg->guest_cid);
	strcpy(d->uds_path, cfg->uds_path);
	dev_host_init(d);
	d->buf_alloc = cfg->buf_alloc;
	d->queue_size_max = cfg->queue_size_max ? cfg->queue_size_max : 1024;
	d->max_conns = cfg->max_conns ? cfg->max_conns : 1024;
	d->ok_guest_port = cfg->ok_guest_port;
	d->router = router;
	d->zerocopy = tune_get()->zerocopy;
	d->tx_batch = tune_get()->tx_batch;
	d->max_pkt = tune_get()->pkt64k ? VSOCK_MAX_PKT_PAYLOAD : DEV_PKT_SMALL;
	pthread_mutex_init(&d->eng_lock, NULL);
	pthread_mutex_init(&d->call_lock, NULL);
	pthread_cond_init(&d->call_cond, NULL);
	ops_tap_init(&d->tap);
	d->frozen = cfg->restore;

	d->tx_iov = calloc(DEV_TX_BATCH, sizeof(*d->tx_iov));
	d->tx_refs = calloc(DEV_TX_BATCH, sizeof(*d->tx_refs));
	d->tx_heads = calloc(DEV_TX_BATCH, sizeof(*d->tx_heads));
	d->rx_gather_iov = calloc(DEV_RX_GATHER, sizeof(*d->rx_gather_iov));
	if (!d->tx_iov || !d->tx_refs || !d->tx_heads || !d->rx_gather_iov) {
		r = -ENOMEM;
		goto out_free;
	}
	r = loop_new(&d->loop);
	if (r < 0)
		goto out_free;
	loop_set_busy_poll(d->loop, tune_get()->busy_poll_us);
	r = loop_timer_new(d->loop, eng_timer_cb, d, &d->eng_timer);
	if (r < 0)
		goto out_free;
	r = loop_timer_new(d->loop, cont_cb, d, &d->cont_timer);
	if (r < 0)
		goto out_free;
	r = dev_sib_init(d);
	if (r < 0)
		goto out_free;
	r = loop_async_new(d->loop, call_cb, d, &d->call_async);
	if (r < 0)
		goto out_free;
	r = dev_host_open(d);
	if (r < 0)
		goto out_free;
	r = dev_dgram_open(d, cfg);
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

int vsock_dev_run(struct vsock_dev *d)
{
	int r;

	d->thread = pthread_self();
	/* release: publishes d->thread to dev_call and uvsock_dev_start (acquire). */
	atomic_store_explicit(&d->thread_running, true, memory_order_release);
	r = loop_run(d->loop);
	/* release: everything the loop did happens before a dev_call that sees false runs fn. */
	atomic_store_explicit(&d->thread_running, false, memory_order_release);
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
	dev_queue_stop(d, 0);
	dev_queue_stop(d, 1);
	dev_evq_stop(d);
	engine_destroy(d);
	guest_mem_free(d->mem_owned);
	dev_host_close(d);
	dev_dgram_close(d);
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
	dev_sib_detach(d);
	dev_sib_free(d);
	pthread_mutex_destroy(&d->eng_lock);
	pthread_mutex_destroy(&d->call_lock);
	pthread_cond_destroy(&d->call_cond);
	loop_async_free(d->call_async);
	ops_tap_destroy(&d->tap);
	loop_timer_free(d->eng_timer);
	loop_timer_free(d->cont_timer);
	loop_free(d->loop);
	free(d->tx_iov);
	free(d->tx_refs);
	free(d->tx_heads);
	free(d->rx_gather_iov);
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


/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

/* Tags of the device record (kind REC_KIND_DEVICE, version 1), and of a counter. */
enum {
	D_CID = 1,        /* u32: the guest's CID (the restoring device's must be the same) */
	D_FEATURES,       /* u64: acked features */
	D_FLAGS,          /* u32: D_F_* */
	D_TX_NUM,         /* u32: TX ring size of the session (the engine's reply ring) */
	D_ENGINE,         /* list: vsock_engine_save's items (present while a session runs) */
	D_LST_STREAM,     /* u64: the engine id of the deferred wildcard STREAM listener */
	D_LST_SEQ,        /* u64: the SEQPACKET one */
	D_HOST,           /* list: dev_host_save */
	D_DGRAM,          /* list: dev_dgram_save */
	D_COUNTERS,       /* list of D_COUNTER: struct dev_counters */
	D_ENG_PAST,       /* list of D_COUNTER: eng_past (the ended sessions' engine counters) */
};
enum { D_COUNTER = 0x11, DC_NAME = 1, DC_VALUE = 2 };
#define D_F_EVQ_RESET 1u
#define D_F_BROKEN 2u
#define D_F_MEM_CHECKED 4u /* this VMM session's shared-memory check is done (dev_mem_check_kick) */
#define D_F_ALL 7u

int dev_rec_sock_fd(struct rec_reader *r, int fd, int type, bool listening, int *ret)
{
	int v, domain, acc = 0, nfd, fl;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0 || v != type ||
	    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &(socklen_t){ sizeof(int) }) < 0 ||
	    domain != AF_UNIX ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &(socklen_t){ sizeof(int) }) < 0 ||
	    !!acc != listening)
		return rec_fail(r->doc, -EBADMSG, "fd %d is not a Unix socket of type %d "
				"(%s)", fd, type, listening ? "listening" : "not listening");
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (nfd < 0)
		return -errno;
	fl = fcntl(nfd, F_GETFL);
	if (fl < 0 || fcntl(nfd, F_SETFL, fl | O_NONBLOCK) < 0) {
		int e = -errno;

		close(nfd);
		return e;
	}
	*ret = nfd;
	return 0;
}

bool vsock_dev_frozen(const struct vsock_dev *d)
{
	return d->frozen;
}

void vsock_dev_hand_over(struct vsock_dev *d, bool given)
{
	d->handed_over = given;
}

void vsock_dev_freeze(struct vsock_dev *d)
{
	d->frozen = true;
	loop_timer_disarm(d->eng_timer);
	loop_timer_disarm(d->cont_timer);
	dev_host_freeze(d);
	dev_dgram_freeze(d);
}

int vsock_dev_thaw(struct vsock_dev *d)
{
	int r;

	d->frozen = false;
	r = dev_host_thaw(d);
	if (r == 0)
		r = dev_dgram_thaw(d);
	if (r < 0) {
		log_error("%s: cannot watch its host sockets again: %s", d->name, strerror(-r));
		return r;
	}
	/* What the frozen passes would have done (re-derived: nothing of it is in the record). */
	d->accept_pending = d->eng != NULL;
	d->rx_more = d->tx_more = true;
	dev_settle(d);
	cont_schedule(d);
	return 0;
}

static void save_counter(struct rec_writer *w, const char *name, uint64_t v)
{
	rec_begin(w, D_COUNTER);
	rec_put_bytes(w, DC_NAME, name, strlen(name));
	rec_put_u64(w, DC_VALUE, v);
	rec_end(w);
}

int vsock_dev_save(struct vsock_dev *d, struct rec_writer *w)
{
	int r = 0;

	if (!d->frozen || d->rxq.running || d->txq.running || d->evq.running)
		return -EBUSY;
	if (d->sib.n_sibs)
		return -EOPNOTSUPP;
	rec_put_u32(w, D_CID, d->cid);

	/* The device's bits only: a vhost-user device holds the transport bits its back-end acked
	 * too (dev_borrow_mem), which the back-end's part carries and gives back at its resume. */
	rec_put_u64(w, D_FEATURES, d->features & uvsock_dev_features());
	rec_put_u32(w, D_FLAGS, (d->evq_reset_pending ? D_F_EVQ_RESET : 0) |
				       (dev_broken(d) ? D_F_BROKEN : 0) |
				       (d->mem_checked ? D_F_MEM_CHECKED : 0));
	if (d->eng) {
		rec_put_u32(w, D_TX_NUM, d->txq.num);
		rec_begin(w, D_ENGINE);
		r = vsock_engine_save(d->eng, w);
		rec_end(w);
		if (r < 0)
			return r;
		if (d->lst[0])
			rec_put_u64(w, D_LST_STREAM, vsock_sock_id(d->lst[0]));
		if (d->lst[1])
			rec_put_u64(w, D_LST_SEQ, vsock_sock_id(d->lst[1]));
	}
	rec_begin(w, D_HOST);
	dev_host_save(d, w);
	rec_end(w);
	rec_begin(w, D_DGRAM);
	dev_dgram_save(d, w);
	rec_end(w);
	rec_begin(w, D_COUNTERS);
#define SAVE_DEV_COUNTER_(f)                                                                       \
	save_counter(w, #f, atomic_load_explicit(&d->stats.f, memory_order_relaxed));
	VSOCK_DEV_STATS(SAVE_DEV_COUNTER_)
#undef SAVE_DEV_COUNTER_
	rec_end(w);
	rec_begin(w, D_ENG_PAST);
	pthread_mutex_lock(&d->eng_lock);
#define SAVE_ENG_COUNTER_(f) save_counter(w, #f, d->eng_past.f);
	VSOCK_ENGINE_STATS(SAVE_ENG_COUNTER_)
#undef SAVE_ENG_COUNTER_
	pthread_mutex_unlock(&d->eng_lock);
	rec_end(w);
	return w->err;
}

static const struct rec_field dev_fields[] = {
	{ D_CID, REC_U32, true, "cid" },
	{ D_FEATURES, REC_U64, true, "features" },
	{ D_FLAGS, REC_U32, true, "flags" },
	{ D_TX_NUM, REC_U32, false, "tx ring size" },
	{ D_ENGINE, REC_LIST, false, "engine" },
	{ D_LST_STREAM, REC_U64, false, "stream listener id" },
	{ D_LST_SEQ, REC_U64, false, "seqpacket listener id" },
	{ D_HOST, REC_LIST, true, "host side" },
	{ D_DGRAM, REC_LIST, true, "datagrams" },
	{ D_COUNTERS, REC_LIST, true, "counters" },
	{ D_ENG_PAST, REC_LIST, true, "past engine counters" },
};
static const struct rec_field counter_fields[] = {
	{ DC_NAME, REC_BYTES, true, "name" },
	{ DC_VALUE, REC_U64, true, "value" },
};

/*
 * Reads a counter list: each known name sets its counter through set(arg, name, value); an
 * unknown name is skipped (docs/upgrade.md: counters may be added without a new version).
 */
static int restore_counters(struct rec_reader *r, const struct rec_item *list, const char *what,
			    void (*set)(void *arg, const char *name, size_t len, uint64_t v),
			    void *arg)
{
	struct rec_reader sub, cs;
	struct rec_item it;
	int e;

	e = rec_enter(r, list, what, &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		struct rec_val v[ARRAY_SIZE(counter_fields)];

		if (it.tag != D_COUNTER)
			return rec_fail(r->doc, -EBADMSG, "%s: tag %u at %zu", what, it.tag,
					it.off);
		e = rec_enter(&sub, &it, what, &cs);
		if (e == 0)
			e = rec_scan(&cs, counter_fields, ARRAY_SIZE(counter_fields), v);
		if (e == 0)
			set(arg, (const char *)v[0].it.val, v[0].it.len, v[1].u);
	}
	return e;
}

static bool name_is(const char *name, size_t len, const char *want)
{
	return strlen(want) == len && !memcmp(name, want, len);
}

static void set_dev_counter(void *arg, const char *name, size_t len, uint64_t v)
{
	struct vsock_dev *d = arg;

#define SET_DEV_COUNTER_(f)                                                                        \
	if (name_is(name, len, #f))                                                                \
		atomic_store_explicit(&d->stats.f, v, memory_order_relaxed);
	VSOCK_DEV_STATS(SET_DEV_COUNTER_)
#undef SET_DEV_COUNTER_
}

static void set_nothing(void *arg, const char *name, size_t len, uint64_t v)
{
	(void)arg;
	(void)name;
	(void)len;
	(void)v;
}

static void set_eng_past(void *arg, const char *name, size_t len, uint64_t v)
{
	struct vsock_engine_stats *s = arg;

#define SET_ENG_COUNTER_(f)                                                                        \
	if (name_is(name, len, #f))                                                                \
		s->f = v;
	VSOCK_ENGINE_STATS(SET_ENG_COUNTER_)
#undef SET_ENG_COUNTER_
}

/* What vsock_engine_restore hands back, matched against the record's ids. */
struct dev_adopt {
	struct vsock_dev *d;
	uint64_t lst_id[2];
	uint64_t stray; /* id of a socket nobody in the record claims (0: none) */
};

static void dev_adopt(void *arg, struct vsock_sock *s)
{
	struct dev_adopt *a = arg;
	struct vsock_dev *d = a->d;
	uint64_t id = vsock_sock_id(s);

	for (int i = 0; i < 2; i++)
		if (a->lst_id[i] == id && !d->lst[i] && vsock_sock_state(s) == VSOCK_SS_LISTEN &&
		    vsock_sock_type(s) == (i ? VSOCK_TYPE_SEQPACKET : VSOCK_TYPE_STREAM)) {
			d->lst[i] = s;
			vsock_sock_set_user(s, &listener_mark);
			return;
		}
	if (!dev_host_adopt(d, s) && !a->stray)
		a->stray = id;
}

static int restore_engine(struct vsock_dev *d, struct rec_reader *r, const struct rec_val *v)
{
	struct dev_adopt a = { .d = d };
	struct vsock_engine *e;
	struct rec_reader sub;
	int k;

	if (!v[4].present) {
		if (v[3].present || v[5].present || v[6].present)
			return rec_fail(r->doc, -EBADMSG, "session fields without an engine");
		/* No session: no host connection may name an engine socket. */
		return dev_host_check_adopted(d, r);
	}
	if (!v[3].present || !vring_size_valid((uint32_t)v[3].u) ||
	    v[3].u > d->queue_size_max || !v[5].present)
		return rec_fail(r->doc, -EBADMSG, "engine without a valid TX ring size or "
				"its STREAM listener");
	a.lst_id[0] = v[5].u;
	a.lst_id[1] = v[6].present ? v[6].u : 0;
	k = rec_enter(r, &v[4].it, "engine", &sub);
	if (k < 0)
		return k;
	k = engine_new(d, (unsigned)v[3].u, &e);
	if (k < 0)
		return k;
	/* The engine's callbacks may run (tx_ready, deliver is not called): they touch d's flags. */
	k = vsock_engine_restore(e, &sub, dev_adopt, &a);
	if (k == 0 && a.stray)
		k = rec_fail(r->doc, -EBADMSG, "engine socket %llu belongs to nothing of "
			     "the device", (unsigned long long)a.stray);
	if (k == 0 && (!d->lst[0] || (a.lst_id[1] && !d->lst[1])))
		k = rec_fail(r->doc, -EBADMSG, "the device's listeners are not in the "
			     "engine");
	if (k == 0)
		k = dev_host_check_adopted(d, r);
	if (k < 0) {
		/* The connections let go of their sockets first; nothing is sent. */
		for (struct hconn *c = d->host.conns; c; c = c->next) {
			if (c->s)
				vsock_sock_set_user(c->s, NULL);
			c->s = NULL;
		}
		vsock_engine_free(e);
		d->lst[0] = d->lst[1] = NULL;
		return k;
	}
	pthread_mutex_lock(&d->eng_lock);
	d->eng = e;
	pthread_mutex_unlock(&d->eng_lock);
	/* The session's TX ring size (its reply ring), until TX starts again: a save before that
	 * writes it as it came. */
	d->txq.num = (unsigned)v[3].u;
	return 0;
}

int vsock_dev_restore(struct vsock_dev *d, struct rec_doc *doc)
{
	struct rec_reader r;

	rec_root(doc, &r, "device");
	return vsock_dev_restore_at(d, &r);
}

int vsock_dev_restore_at(struct vsock_dev *d, struct rec_reader *rr)
{
	struct rec_val v[ARRAY_SIZE(dev_fields)];
	struct vsock_engine_stats past = { 0 };
	struct rec_doc *doc = rr->doc;
	struct rec_reader r = *rr, sub;
	int k;

	if (!d->frozen || d->eng || d->host.conns || d->host.uds_l.fd >= 0)
		return -EBUSY;
	k = rec_scan(&r, dev_fields, ARRAY_SIZE(dev_fields), v);
	if (k < 0)
		return k;
	if (v[0].u != d->cid)
		return rec_fail(doc, -EBADMSG, "CID %llu, the device's is %u",
				(unsigned long long)v[0].u, d->cid);
	if (v[2].u & ~(uint64_t)D_F_ALL)
		return rec_fail(doc, -EBADMSG, "device flags %#llx",
				(unsigned long long)v[2].u);
	if (v[1].u & ~uvsock_dev_features())
		return rec_fail(doc, -EBADMSG, "features %#llx not offered",
				(unsigned long long)v[1].u);
	k = restore_counters(&r, &v[10].it, "past engine counters", set_eng_past, &past);
	if (k < 0)
		return k;
	/* Checked before anything is kept: the counters land only on success. */
	k = restore_counters(&r, &v[9].it, "counters", set_nothing, NULL);
	if (k < 0)
		return k;
	d->features = v[1].u;
	k = rec_enter(&r, &v[7].it, "host side", &sub);
	if (k == 0)
		k = dev_host_restore(d, &sub);
	if (k < 0)
		goto out;
	k = rec_enter(&r, &v[8].it, "datagrams", &sub);
	if (k == 0)
		k = dev_dgram_restore(d, &sub);
	if (k < 0)
		goto out_host;
	k = restore_engine(d, &r, v);
	if (k < 0)
		goto out_dgram;

	(void)restore_counters(&r, &v[9].it, "counters", set_dev_counter, d);
	pthread_mutex_lock(&d->eng_lock);
	d->eng_past = past;
	pthread_mutex_unlock(&d->eng_lock);
	d->evq_reset_pending = v[2].u & D_F_EVQ_RESET;
	d->mem_checked = v[2].u & D_F_MEM_CHECKED;
	atomic_store_explicit(&d->broken, !!(v[2].u & D_F_BROKEN), memory_order_relaxed);
	dev_dgram_features(d);
	return 0;

out_dgram:
	dev_dgram_restore_undo(d);
out_host:
	dev_host_unrestore(d);
out:
	d->features = 0;
	return k;
}
