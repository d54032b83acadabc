/* SPDX-License-Identifier: MIT */
/*
 * The guest role (see driver.h): a vhost-user front-end, two split rings driven from the driver
 * side, RX and TX buffers in guest memory, and one I/O thread that moves packets between the
 * rings and the protocol engine, as Linux's virtio_transport.c does with its rx/tx work items.
 *
 * Memory. Guest memory is one memfd (the front-end's); this module takes two arenas from it,
 * each cut into slots of 44 + 64 KiB (rounded to 64 bytes): one slot per RX descriptor and one
 * per TX pool buffer. An RX slot is posted with the length the sizing EWMA chooses (rxsize.h); a
 * TX slot always holds a whole packet, so header and payload go in one descriptor. Slot state
 * (free lists, posted lengths) is private memory the back-end cannot touch.
 *
 * The I/O thread loop: reclaim TX completions, take up to RX_BUDGET used RX buffers in batches of
 * RX_BATCH (validated, fed with vsock_engine_feed_batch, slots reused at once since the engine
 * copies), refill RX when fewer than half are posted, pull from the engine into free TX slots
 * (kicking every TX_KICK_BATCH packets and at the end, only if the device's avail_event asks for
 * it), run due timers. While any of this makes progress the loop goes round again with device
 * interrupts off. Before sleeping it re-enables the RX interrupt (and the TX one only if it is
 * waiting for TX space) and re-checks the rings, then polls the call eventfds, its wake eventfd
 * and the front-end socket (for hang-up) until the next timer deadline.
 *
 * Direct RX: RX work (rx_pass, refills, the RX interrupt flags) is done by whoever holds the RX
 * drain token rx_tok: the I/O thread (io_rx) or an application thread waiting in vdrv_rx_wait,
 * which then sleeps on the RX call eventfd itself. The rules (who reads that eventfd, when the
 * I/O thread watches it, who wakes whom on release) are at the functions of the token section
 * and in docs/guest-role.md "Direct RX".
 *
 * Direct TX (tune tx_direct): an application thread sending on a STREAM socket whose engine
 * queue is empty copies its bytes straight into TX slots and publishes them itself
 * (vdrv_tx_send). tx_mu orders the TX ring's producers: the I/O thread holds it for TX reclaim,
 * pulls and the TX interrupt flags; a direct sender takes a slot under it (tx_held keeps a
 * descriptor reserved for it), copies outside it, and commits and publishes under it again.
 * So the avail ring keeps one producer at a time, the lock is never held across a 64 KiB copy
 * by an application thread, and nothing the engine queues for the socket after the commit
 * reaches the ring before the packet (a commit that finds packets queued fails: fallback).
 *
 * Waking the thread: vdrv_tx_ready() sets tx_work; it writes the wake eventfd only if the
 * thread said it is about to sleep. The thread sets `sleeping` and then re-reads tx_work before
 * it polls. Both sides use sequentially consistent accesses, so at least one of them sees the
 * other's store (a Dekker pair) and a wake-up is never lost; a busy thread costs callers no
 * system call.
 */
#include "driver/driver.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "driver/rxsize.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/time.h"
#include "util/tune.h"
#include "vhost_user/frontend.h"
#include "vring/vring.h"
#include "vring/vring_drv.h"

#define SLOT_STRIDE (((VSOCK_HDR_SIZE + VSOCK_MAX_PKT_PAYLOAD) + 63u) & ~63u)
#define TX_PAYLOAD VSOCK_MAX_PKT_PAYLOAD
#define RX_BATCH 64u         /* packets per vsock_engine_feed_batch call */
#define RX_BUDGET 256u       /* RX packets per loop round before TX gets a turn */
#define TX_KICK_BATCH 32u    /* publish and maybe kick at least this often while pulling */
#define TX_DIRECT_SMALL 16384u /* direct TX: a smaller packet goes direct only while the device
			      * holds no TX buffer (else the engine merges it with others) */
#define MAX_QUEUE_SIZE 1024u
#define FLUSH_MS 200u        /* bound of the last TX flush at stop */
#define POLL_MAX_MS 1000     /* safety net: re-check timers at least once a second */
#define NORX_MAX_MS 1        /* I/O thread sleep while an application thread drains RX */

#define STAT_ADD(d, field, n) atomic_fetch_add_explicit(&(d)->st.field, (n), memory_order_relaxed)
#define STAT_SET(d, field, v) atomic_store_explicit(&(d)->st.field, (v), memory_order_relaxed)

struct vdrv_atomic_stats {
	_Atomic uint64_t rx_bufs, rx_batches, rx_dropped, rx_buf_len, rx_posted;
	_Atomic uint64_t tx_pkts, tx_bytes, tx_full, kicks, kicks_suppressed, wakeups, resets;
	_Atomic uint64_t backend_lost, tx_inflight, sleep_state, rx_direct, rx_direct_sleeps;
	_Atomic uint64_t tx_direct_pkts, tx_direct_bytes;
	_Atomic uint64_t ev_resets;
};

struct vdrv {
	struct vdrv_config cfg;
	char *path;
	pthread_mutex_t ctl_mu;    /* serialises the control calls */
	struct vhu_front *f;       /* NULL while disconnected */
	uint64_t mem_size;
	_Atomic uint32_t cid;      /* written under ctl_mu, read anywhere */
	bool seqpacket;
	bool dgram;                /* VIRTIO_VSOCK_F_DGRAM negotiated (control thread) */
	struct vsock_engine *e;    /* borrowed, set by vdrv_start */

	/* Session: rings and buffers of the current front-end; owned by the I/O thread while it
	 * runs, by the control thread otherwise. */
	bool have_session;
	unsigned num, ntx;
	struct vring_drv *rx, *tx;
	int rx_kick, rx_call, tx_kick, tx_call, front_fd;
	struct vring_drv *ev;      /* the event queue (cfg.event_queue), I/O thread's */
	int ev_kick, ev_call;
	uint8_t *ev_arena;         /* one VSOCK_EVENT_LEN buffer per descriptor */
	uint64_t ev_gpa;
	uint8_t *rx_arena, *tx_arena;
	uint64_t rx_gpa, tx_gpa;
	uint32_t *rx_len;          /* posted length per RX slot (0: not posted) */
	uint16_t *rx_free, *tx_free;
	unsigned rx_nfree, tx_nfree, rx_posted; /* tx_free, tx_nfree: under tx_mu */
	struct vdrv_rxsize rxs;
	atomic_bool tx_blocked;    /* engine has packets but the TX pool or ring is full (written
				    * by the I/O thread under tx_mu, read by RX drains) */
	/*
	 * TX producers (direct TX): tx_mu guards the TX ring's driver side (add, kick, reclaim,
	 * interrupt flags), the TX pool (tx_free, tx_nfree) and tx_ok. Lock order: tx_mu ->
	 * engine locks (pull, reserve, commit); never taken under an engine lock.
	 */
	pthread_mutex_t tx_mu;
	bool tx_direct;            /* tune tx_direct at vdrv_new */
	bool tx_ok;                /* a session runs: application threads may publish TX */
	unsigned tx_held;          /* slots direct senders took from the pool and fill outside
				    * tx_mu; each keeps a TX descriptor reserved */
	pthread_cond_t tx_cond;    /* signalled when tx_held drops to 0 (tx_quiesce waits) */
	bool rx_stalled;           /* engine's reply queue is full: RX waits for TX (RX state) */
	atomic_bool dead;          /* back-end lost or rings broken: no ring work */
	struct vsock_pkt_ref refs[RX_BATCH];
	struct iovec iovs[RX_BATCH];
	uint16_t batch_slots[RX_BATCH];

	/* I/O thread. */
	pthread_t th;
	atomic_bool running;       /* written under ctl_mu, read anywhere */
	int wake_fd;
	atomic_bool stop;
	atomic_bool tx_work;
	atomic_bool sleeping;
	atomic_bool wake_sent;

	/*
	 * Direct RX (vdrv_rx_wait). rx_tok is the RX drain token: its holder (the I/O thread or
	 * an application thread) owns the RX ring's driver side and the RX state above (rx_len,
	 * rx_free, rx_posted, rxs, rx_stalled, refs, iovs, batch_slots). Claimed with an exchange
	 * (acquire) and released with a store (release), all seq_cst for the Dekker pairs below.
	 * Held by the control path while no session runs.
	 */
	bool direct;               /* tune direct_rx at vdrv_new */
	bool rx_batch;             /* tune rx_batch at vdrv_new */
	atomic_bool rx_tok;
	atomic_bool direct_ok;     /* a session runs: application threads may claim rx_tok */
	atomic_bool rx_contended;  /* a waiter failed to claim rx_tok: the releaser makes sure
				    * the I/O thread serves RX */
	atomic_bool io_norx;       /* the I/O thread sleeps without watching the RX interrupt */
	atomic_bool holder_sleeping; /* an application thread holding rx_tok sleeps in poll() */
	atomic_bool io_rx_off;     /* test hook: the I/O thread never drains RX */
	atomic_bool io_tx_off;     /* test hook: the I/O thread pulls nothing from the engine */
	int hold_fd;               /* eventfd: wakes the sleeping holder (socket events, stop) */

	struct vdrv_atomic_stats st;
};

/* The driver whose I/O thread is the current thread, if any. */
static __thread struct vdrv *tls_io;
/* The driver whose RX drain token an application thread (this one) holds, if any. */
static __thread struct vdrv *tls_rx;

void vdrv_config_default(struct vdrv_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->queue_size = 128;
	cfg->rx_buf_min = VDRV_RXSIZE_MIN_DEFAULT;
	cfg->rx_buf_max = VDRV_RXSIZE_MAX_DEFAULT;
	cfg->timeout_ms = 5000;
}

/* ---- session: rings and buffers --------------------------------------------------------- */

/*
 * Signals one of our non-blocking eventfds (a kick, a wake-up). A full counter (EAGAIN) still
 * means "signalled"; nothing else can fail here. `what` names it in the debug log.
 */
static void signal_eventfd(int fd, const char *what)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_msg(LOG_LVL_DEBUG, "vdrv: %s: %s", what, strerror(errno));
}

static void kick(struct vdrv *d, struct vring_drv *r, int fd)
{
	if (!vring_drv_kick_prepare(r)) {
		STAT_ADD(d, kicks_suppressed, 1);
		return;
	}
	signal_eventfd(fd, "kick");
	STAT_ADD(d, kicks, 1);
}

static void session_free(struct vdrv *d)
{
	vring_drv_free(d->rx);
	vring_drv_free(d->tx);
	vring_drv_free(d->ev);
	d->rx = d->tx = d->ev = NULL;
	free(d->rx_len);
	free(d->rx_free);
	free(d->tx_free);
	d->rx_len = NULL;
	d->rx_free = d->tx_free = NULL;
	d->have_session = false;
}

static void rx_refill(struct vdrv *d)
{
	uint32_t len;
	unsigned added = 0;

	/* Linux refills when fewer than half of the buffers remain posted. */
	if (d->rx_posted >= d->num / 2)
		return;
	len = vdrv_rxsize_buf_len(&d->rxs);
	while (d->rx_nfree > 0 && vring_drv_num_free(d->rx) > 0) {
		uint16_t slot = d->rx_free[d->rx_nfree - 1];
		struct vring_drv_buf b = {
			.addr = d->rx_gpa + (uint64_t)slot * SLOT_STRIDE,
			.len = len,
			.write = true,
		};

		if (vring_drv_add(d->rx, &b, 1, (void *)(uintptr_t)(slot + 1u)) < 0)
			break;
		d->rx_nfree--;
		d->rx_len[slot] = len;
		d->rx_posted++;
		added++;
	}
	STAT_SET(d, rx_posted, d->rx_posted);
	STAT_SET(d, rx_buf_len, len);
	if (added)
		kick(d, d->rx, d->rx_kick);
}

/*
 * The event queue (virtio 1.2 §5.10.2): every descriptor holds one 4-byte event buffer, as Linux
 * posts them (net/vmw_vsock/virtio_transport.c, virtio_vsock_event_fill). Cookie: slot + 1.
 */
#define VSOCK_EVENT_LEN 4u
#define VSOCK_EVENT_TRANSPORT_RESET 0u
#define EVENT_QUEUE 2u /* its index (virtio 1.2 §5.10.2) */

static void backend_lost(struct vdrv *d, const char *why);

static void ev_post(struct vdrv *d, unsigned slot)
{
	struct vring_drv_buf b = {
		.addr = d->ev_gpa + (uint64_t)slot * VSOCK_EVENT_LEN,
		.len = VSOCK_EVENT_LEN,
		.write = true,
	};

	(void)vring_drv_add(d->ev, &b, 1, (void *)(uintptr_t)(slot + 1u));
}

static int ev_open(struct vdrv *d, uint64_t feats)
{
	const struct vhu_front_ring *er = vhu_front_ring(d->f, EVENT_QUEUE);
	int r;

	if (!er)
		return -EPROTO;
	r = vhu_front_alloc(d->f, (size_t)er->num * VSOCK_EVENT_LEN, 8, (void **)&d->ev_arena,
			    &d->ev_gpa);
	if (r == 0)
		r = vring_drv_new(er->num, er->desc, er->avail, er->used, feats, &d->ev);
	if (r < 0)
		return r;
	d->ev_kick = er->kick_fd;
	d->ev_call = er->call_fd;
	for (unsigned i = 0; i < er->num; i++)
		ev_post(d, i);
	kick(d, d->ev, d->ev_kick);
	return 0;
}

/*
 * A TRANSPORT_RESET from the device, on the I/O thread: as Linux's virtio_vsock_event_handle,
 * the guest CID is read again (when no control call holds the front-end: it would be one of
 * those that reset the connections themselves) and every connected socket is reset; listeners
 * stay. Counted in resets.
 */
static void ev_transport_reset(struct vdrv *d)
{
	uint32_t cid = VMADDR_CID_ANY;
	uint8_t cfg[8];

	if (pthread_mutex_trylock(&d->ctl_mu) == 0) {
		if (vhu_front_get_config(d->f, 0, sizeof(cfg), cfg) == 0) {
			uint64_t c = vsock_le64_get_(cfg);

			if (c > 2 && c < VMADDR_CID_ANY)
				d->cid = cid = (uint32_t)c;
		}
		pthread_mutex_unlock(&d->ctl_mu);
	}
	log_msg(LOG_LVL_DEBUG, "vdrv: cid %u: transport reset from the device", d->cid);
	vsock_engine_transport_reset(d->e, cid);
	/* Counted once the sockets carry ECONNRESET: whoever sees the count sees the error. */
	STAT_ADD(d, resets, 1);
	STAT_ADD(d, ev_resets, 1);
}

/* Takes the device's events and posts their buffers again. Returns true if it took any. */
static bool ev_pass(struct vdrv *d)
{
	bool took = false;
	uint32_t len;
	void *ck;

	if (!d->ev)
		return false;
	while (vring_drv_get_used(d->ev, &len, &ck) == 0) {
		unsigned slot = (unsigned)((uintptr_t)ck - 1u);
		uint32_t id;

		took = true;
		memcpy(&id, d->ev_arena + (size_t)slot * VSOCK_EVENT_LEN, sizeof(id));
		if (len >= VSOCK_EVENT_LEN && le32toh(id) == VSOCK_EVENT_TRANSPORT_RESET)
			ev_transport_reset(d);
		/* Other ids (none defined) and short events are ignored, as Linux does. */
		ev_post(d, slot);
	}
	if (vring_drv_broken(d->ev)) {
		backend_lost(d, "event queue broken");
		return took;
	}
	if (took)
		kick(d, d->ev, d->ev_kick);
	return took;
}

/* Builds rings and buffers on the connected, initialised front-end d->f. */
static int session_open(struct vdrv *d)
{
	const struct vhu_front_ring *rr, *tr;
	uint64_t feats;
	int r;

	d->num = d->cfg.queue_size;
	d->ntx = d->cfg.tx_bufs ? d->cfg.tx_bufs : d->num;
	d->rx_len = calloc(d->num, sizeof(*d->rx_len));
	d->rx_free = calloc(d->num, sizeof(*d->rx_free));
	d->tx_free = calloc(d->ntx, sizeof(*d->tx_free));
	if (!d->rx_len || !d->rx_free || !d->tx_free) {
		r = -ENOMEM;
		goto fail;
	}
	r = vhu_front_alloc(d->f, (size_t)d->num * SLOT_STRIDE, 64, (void **)&d->rx_arena,
			    &d->rx_gpa);
	if (r < 0)
		goto fail;
	r = vhu_front_alloc(d->f, (size_t)d->ntx * SLOT_STRIDE, 64, (void **)&d->tx_arena,
			    &d->tx_gpa);
	if (r < 0)
		goto fail;
	r = vhu_front_start(d->f);
	if (r < 0)
		goto fail;
	/* Measurement setting: logging on as during a live migration (the back-end must offer it). */
	if (tune_get()->dirty_log) {
		r = vhu_front_set_log_base(d->f, 0);
		if (r == 0)
			r = vhu_front_set_logging(d->f, true);
		if (r < 0)
			goto fail;
	}
	feats = vhu_front_features(d->f);
	rr = vhu_front_ring(d->f, 0);
	tr = vhu_front_ring(d->f, 1);
	/*
	 * Fresh rings: the back-end starts from index 0 (SET_VRING_BASE 0), as we do. The
	 * front-end places the rings at its first start, so the back-end may already have written
	 * its initial used->flags / avail_event when vring_drv_new() zeroes the parts: those
	 * initial values are zero too (notifications on, event at index 0).
	 */
	r = vring_drv_new(rr->num, rr->desc, rr->avail, rr->used, feats, &d->rx);
	if (r < 0)
		goto fail;
	r = vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, feats, &d->tx);
	if (r < 0)
		goto fail;
	d->rx_kick = rr->kick_fd;
	d->rx_call = rr->call_fd;
	d->tx_kick = tr->kick_fd;
	d->tx_call = tr->call_fd;
	d->front_fd = vhu_front_fd(d->f);
	d->ev_call = -1;
	if (d->cfg.event_queue) {
		r = ev_open(d, feats);
		if (r < 0)
			goto fail;
	}
	/* Datagrams: no buffer smaller than the largest datagram (driver.h, vdrv_dgram). */
	r = vdrv_rxsize_init(&d->rxs, d->dgram ? MAX(d->cfg.rx_buf_min, VDRV_RXSIZE_DGRAM)
					       : d->cfg.rx_buf_min,
			     d->dgram ? MAX(d->cfg.rx_buf_max, VDRV_RXSIZE_DGRAM) : d->cfg.rx_buf_max);
	if (r < 0)
		goto fail;
	for (unsigned i = 0; i < d->num; i++)
		d->rx_free[i] = (uint16_t)(d->num - 1 - i);
	d->rx_nfree = d->num;
	for (unsigned i = 0; i < d->ntx; i++)
		d->tx_free[i] = (uint16_t)(d->ntx - 1 - i);
	d->tx_nfree = d->ntx;
	d->rx_posted = 0;
	d->tx_blocked = d->rx_stalled = false;
	atomic_store(&d->dead, false);
	d->have_session = true;
	rx_refill(d);
	return 0;

fail:
	session_free(d);
	return r;
}

/* ---- the data path (I/O thread) --------------------------------------------------------- */

static void backend_lost(struct vdrv *d, const char *why)
{
	if (atomic_exchange(&d->dead, true))
		return;
	log_msg(LOG_LVL_DEBUG, "vdrv: cid %u: %s: resetting every connection", d->cid, why);
	STAT_ADD(d, backend_lost, 1);
	STAT_ADD(d, resets, 1);
	vsock_engine_transport_reset(d->e, VMADDR_CID_ANY);
}

static bool tx_reclaim(struct vdrv *d)
{
	bool any = false;

	for (;;) {
		uint32_t len;
		void *cookie;
		int r = vring_drv_get_used(d->tx, &len, &cookie);

		if (r == -EAGAIN)
			break;
		if (r < 0) {
			backend_lost(d, "TX used ring error");
			break;
		}
		d->tx_free[d->tx_nfree++] = (uint16_t)((uintptr_t)cookie - 1u);
		any = true;
	}
	return any;
}

/* True if a TX slot is free and a descriptor is left beyond those direct senders hold. */
static bool tx_room(struct vdrv *d)
{
	return d->tx_nfree > 0 && vring_drv_num_free(d->tx) > d->tx_held;
}

/*
 * The next free TX slot (the pool's last), reclaiming completions if none is free, or -1
 * (pool or ring full). The caller pops it (tx_nfree--) once it uses it. tx_mu held.
 */
static int tx_slot_get(struct vdrv *d)
{
	if (!tx_room(d)) {
		tx_reclaim(d);
		if (!tx_room(d))
			return -1;
	}
	return d->tx_free[d->tx_nfree - 1];
}

/*
 * Puts the packet in TX slot `slot` (taken from the pool; header h, n payload bytes already
 * in place) on the TX ring, and kicks (if the device asks) every TX_KICK_BATCH
 * publications counted in *since_kick. Returns 0, or -EIO if the ring is broken (then the
 * back-end is lost). tx_mu held.
 */
static int tx_publish(struct vdrv *d, uint16_t slot, const struct vsock_hdr *h, uint32_t n,
		      unsigned *since_kick)
{
	struct vring_drv_buf b = {
		.addr = d->tx_gpa + (uint64_t)slot * SLOT_STRIDE,
		.len = VSOCK_HDR_SIZE + n,
		.write = false,
	};

	vsock_hdr_encode(h, d->tx_arena + (size_t)slot * SLOT_STRIDE);
	if (vring_drv_add(d->tx, &b, 1, (void *)(uintptr_t)(slot + 1u)) < 0) {
		/* Cannot happen with a free descriptor checked before, unless broken. */
		backend_lost(d, "TX ring broken");
		return -EIO;
	}
	STAT_ADD(d, tx_pkts, 1);
	STAT_ADD(d, tx_bytes, n);
	if (++*since_kick == TX_KICK_BATCH) {
		kick(d, d->tx, d->tx_kick);
		*since_kick = 0;
	}
	return 0;
}

static bool tx_pass(struct vdrv *d)
{
	unsigned n = 0, since_kick = 0;

	if (atomic_load_explicit(&d->io_tx_off, memory_order_relaxed))
		return false;
	d->tx_blocked = false;
	for (;;) {
		struct vsock_hdr h;
		struct iovec iov;
		uint8_t *base;
		ssize_t r;
		int slot = tx_slot_get(d);

		if (slot < 0) {
			/* Stop pulling until completions come back. */
			if (vsock_engine_has_pending(d->e)) {
				d->tx_blocked = true;
				STAT_ADD(d, tx_full, 1);
			}
			break;
		}
		base = d->tx_arena + (size_t)slot * SLOT_STRIDE;
		iov.iov_base = base + VSOCK_HDR_SIZE;
		iov.iov_len = TX_PAYLOAD;
		r = vsock_engine_pull(d->e, &h, &iov, 1, TX_PAYLOAD);
		if (r < 0)
			break;
		d->tx_nfree--;
		if (tx_publish(d, (uint16_t)slot, &h, (uint32_t)r, &since_kick) < 0)
			break;
		n++;
	}
	if (since_kick)
		kick(d, d->tx, d->tx_kick);
	return n > 0;
}

/* With the back-end gone, queued packets (RSTs of closing sockets...) are pulled and dropped. */
static bool tx_discard(struct vdrv *d)
{
	static uint8_t sink[VSOCK_MAX_PKT_PAYLOAD];
	struct iovec iov = { .iov_base = sink, .iov_len = sizeof(sink) };
	struct vsock_hdr h;
	bool any = false;

	while (vsock_engine_pull(d->e, &h, &iov, 1, sizeof(sink)) >= 0)
		any = true;
	return any;
}

static void rx_feed(struct vdrv *d, unsigned n)
{
	if (n > 1 && d->rx_batch) {
		vsock_engine_feed_batch(d->e, d->refs, n);
	} else {
		/* tune no-rx-batch: one lookup and socket lock per packet, as before batching. */
		for (unsigned i = 0; i < n; i++)
			vsock_engine_feed(d->e, &d->refs[i].hdr, d->refs[i].iov, d->refs[i].iovcnt);
	}
	STAT_ADD(d, rx_batches, n > 1 && d->rx_batch ? 1 : n);
	/* The engine copied what it keeps: the slots are free again. */
	for (unsigned i = 0; i < n; i++)
		d->rx_free[d->rx_nfree++] = d->batch_slots[i];
}

static bool rx_pass(struct vdrv *d)
{
	unsigned total = 0;

	d->rx_stalled = false;
	while (total < RX_BUDGET) {
		unsigned n = 0, taken = 0;

		/*
		 * While queued replies are at the limit, RX waits for TX to drain them, as Linux
		 * does (net/vmw_vsock/virtio_transport.c, virtio_transport_more_replies();
		 * docs/guest-role.md "Reply limit"). But not while the TX ring itself is full:
		 * then the device holds our TX buffers, and it may be waiting for room in our RX
		 * ring to deliver its own replies (its TX draining stops at its reply limit too).
		 * Stopping both rings would deadlock; the engine keeps replies as per-socket bits
		 * plus a capped ring, so taking more RX cannot grow memory without bound.
		 */
		if (!vsock_engine_can_feed(d->e) && !d->tx_blocked) {
			d->rx_stalled = true;
			break;
		}
		while (n < RX_BATCH) {
			uint32_t len, buf_len;
			struct vsock_hdr h;
			uint16_t slot;
			uint8_t *base;
			void *cookie;
			int r = vring_drv_get_used(d->rx, &len, &cookie);

			if (r == -EAGAIN)
				break;
			if (r < 0) {
				rx_feed(d, n);
				backend_lost(d, "RX used ring error");
				return true;
			}
			taken++;
			slot = (uint16_t)((uintptr_t)cookie - 1u);
			buf_len = d->rx_len[slot];
			d->rx_len[slot] = 0;
			d->rx_posted--;
			base = d->rx_arena + (size_t)slot * SLOT_STRIDE;
			/* Linux drops a buffer shorter than a header or whose header claims more
			 * payload than the device wrote. */
			if (len < VSOCK_HDR_SIZE) {
				STAT_ADD(d, rx_dropped, 1);
				d->rx_free[d->rx_nfree++] = slot;
				continue;
			}
			vsock_hdr_decode(base, &h);
			if (h.len > len - VSOCK_HDR_SIZE) {
				STAT_ADD(d, rx_dropped, 1);
				d->rx_free[d->rx_nfree++] = slot;
				continue;
			}
			vdrv_rxsize_sample(&d->rxs, len, buf_len);
			d->refs[n].hdr = h;
			d->iovs[n].iov_base = base + VSOCK_HDR_SIZE;
			d->iovs[n].iov_len = h.len;
			d->refs[n].iov = &d->iovs[n];
			d->refs[n].iovcnt = h.len ? 1 : 0;
			d->batch_slots[n] = slot;
			n++;
		}
		if (taken == 0)
			break;
		STAT_ADD(d, rx_bufs, taken);
		if (n)
			rx_feed(d, n);
		total += taken;
		rx_refill(d);
	}
	return total > 0;
}

static void drain_eventfd(int fd)
{
	uint64_t v;

	/* Non-blocking eventfd: EAGAIN when already clear. */
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_msg(LOG_LVL_DEBUG, "vdrv: eventfd read: %s", strerror(errno));
}

/* Takes the RX drain token if it is free. seq_cst: see the Dekker pairs at rx_put_app/io_sleep. */
static bool rx_try(struct vdrv *d)
{
	return !atomic_exchange(&d->rx_tok, true);
}

/* True if the rings have work for us (busy polling; RX only while we can take the token). */
static bool ring_work(struct vdrv *d)
{
	bool rx = false;

	if (atomic_load_explicit(&d->tx_work, memory_order_relaxed))
		return true;
	if (atomic_load(&d->dead))
		return false;
	if (!atomic_load_explicit(&d->io_rx_off, memory_order_relaxed) &&
	    !atomic_load_explicit(&d->rx_tok, memory_order_relaxed) && rx_try(d)) {
		rx = !d->rx_stalled && vring_drv_more_used(d->rx);
		atomic_store(&d->rx_tok, false);
	}
	if (rx || !d->tx_blocked)
		return rx;
	/* A direct sender holding tx_mu is TX work too: tx_pass will wait for it. */
	if (pthread_mutex_trylock(&d->tx_mu) != 0)
		return true;
	rx = vring_drv_more_used(d->tx);
	pthread_mutex_unlock(&d->tx_mu);
	return rx;
}

/*
 * Last passes when stopping, so that what close() queued (SHUTDOWN, RST) reaches the device
 * before the rings stop: until every TX buffer is back and the engine has nothing more, at most
 * FLUSH_MS.
 */
static void final_flush(struct vdrv *d)
{
	uint64_t until = mono_ns() + FLUSH_MS * NS_PER_MS;

	while (!atomic_load(&d->dead)) {
		struct pollfd p = { .fd = d->tx_call, .events = POLLIN };
		bool done, more;

		pthread_mutex_lock(&d->tx_mu);
		tx_reclaim(d);
		tx_pass(d);
		done = d->tx_nfree == d->ntx && !vsock_engine_has_pending(d->e);
		more = !done && vring_drv_enable_cb(d->tx);
		pthread_mutex_unlock(&d->tx_mu);
		if (done || mono_ns() >= until)
			break;
		if (more)
			continue;
		poll(&p, 1, 10);
		if (p.revents & POLLIN)
			drain_eventfd(d->tx_call);
	}
}

/* ---- the RX drain token ----------------------------------------------------------------- */

/*
 * The I/O thread's turn at RX, if the token is free (and the test hook allows): interrupts off
 * while it works, then one RX pass. *signalled says the RX interrupt fired while we slept: its
 * eventfd is read only here, under the token, so that a sleeping holder polling the same
 * eventfd never loses the interrupt to us. Returns true if it took packets.
 */
static bool io_rx(struct vdrv *d, bool *signalled)
{
	bool any;

	if (atomic_load_explicit(&d->io_rx_off, memory_order_relaxed) || !rx_try(d))
		return false;
	if (*signalled) {
		drain_eventfd(d->rx_call);
		*signalled = false;
	}
	vring_drv_disable_cb(d->rx);
	any = rx_pass(d);
	atomic_store(&d->rx_tok, false);
	return any;
}

/*
 * An application thread gives the token back. The RX interrupt is left on (the I/O thread
 * may be asleep on it); used buffers that arrived before it was re-enabled raise no interrupt,
 * so if there are some, or if a waiter could not claim the token while we held it and the I/O
 * thread sleeps without watching RX, the I/O thread is woken to serve them.
 */
static void rx_put_app(struct vdrv *d)
{
	/* RX state is read before the token goes: afterwards it is someone else's. */
	bool stalled = d->rx_stalled;
	bool more = !atomic_load(&d->dead) && !stalled && vring_drv_enable_cb(d->rx);

	tls_rx = NULL;
	/* seq_cst store, then loads of rx_contended / io_norx: pairs with io_sleep_rx(). */
	atomic_store(&d->rx_tok, false);
	if ((atomic_exchange(&d->rx_contended, false) && atomic_load(&d->io_norx)) || more ||
	    stalled)
		vdrv_tx_ready(d);
}

/*
 * The I/O thread's RX state before it sleeps. Returns 1 to sleep watching the RX interrupt
 * (re-enabled here), 0 to sleep without it (an application thread holds the token and watches
 * it; the sleep is then at most NORX_MAX_MS, and a holder that leaves others waiting wakes
 * us), -1 to go round again (buffers came back meanwhile, or the token came free). *stalled
 * is what the last RX pass found.
 */
static int io_sleep_rx(struct vdrv *d, bool *stalled)
{
	if (atomic_load_explicit(&d->io_rx_off, memory_order_relaxed)) {
		*stalled = false;
		return 0;
	}
	if (!rx_try(d)) {
		/* seq_cst store, then load of rx_tok: pairs with rx_put_app(). */
		atomic_store(&d->io_norx, true);
		if (!atomic_load(&d->rx_tok)) {
			atomic_store(&d->io_norx, false);
			return -1;
		}
		*stalled = false;
		return 0;
	}
	*stalled = d->rx_stalled;
	if (!*stalled && vring_drv_enable_cb(d->rx)) {
		/* Buffers came back after our last look: no interrupt announces them. */
		vring_drv_disable_cb(d->rx);
		atomic_store(&d->rx_tok, false);
		return -1;
	}
	atomic_store(&d->rx_tok, false);
	return 1;
}

/* The TX interrupt flags, under tx_mu (direct senders reclaim and publish concurrently). */
static void tx_disable_cb(struct vdrv *d)
{
	pthread_mutex_lock(&d->tx_mu);
	vring_drv_disable_cb(d->tx);
	pthread_mutex_unlock(&d->tx_mu);
}

/* Re-enables the TX interrupt; true if completions arrived meanwhile (as vring_drv_enable_cb). */
static bool tx_enable_cb(struct vdrv *d)
{
	bool more;

	pthread_mutex_lock(&d->tx_mu);
	more = vring_drv_enable_cb(d->tx);
	pthread_mutex_unlock(&d->tx_mu);
	return more;
}

static void *io_main(void *arg)
{
	struct vdrv *d = arg;
	uint64_t deadline = UINT64_MAX;
	bool rx_signalled = false;

	tls_io = d;
	tx_disable_cb(d);
	for (;;) {
		bool busy = false, dead, stalled = false;
		struct pollfd pfd[5];
		uint64_t now;
		int timeout, n, rxw = 0;

		if (atomic_load(&d->stop))
			break;
		atomic_store(&d->tx_work, false);
		dead = atomic_load(&d->dead);
		if (!dead) {
			pthread_mutex_lock(&d->tx_mu);
			busy |= tx_reclaim(d);
			pthread_mutex_unlock(&d->tx_mu);
			busy |= io_rx(d, &rx_signalled);
			busy |= ev_pass(d);
			pthread_mutex_lock(&d->tx_mu);
			busy |= tx_pass(d);
			pthread_mutex_unlock(&d->tx_mu);
		} else {
			busy |= tx_discard(d);
		}
		now = mono_ns();
		deadline = vsock_engine_next_deadline(d->e);
		if (deadline <= now) {
			vsock_engine_run_timers(d->e);
			busy = true;
		}
		if (busy)
			continue;
		if (d->cfg.busy_poll_us && !dead) {
			uint64_t until = now + (uint64_t)d->cfg.busy_poll_us * 1000u;
			bool work = false;

			while (!(work = ring_work(d)) && mono_ns() < until && !atomic_load(&d->stop))
				;
			if (work)
				continue;
		}

		/* About to sleep: announce it, then re-check (pairs with vdrv_tx_ready). */
		atomic_store(&d->sleeping, true);
		if (atomic_load(&d->tx_work) || atomic_load(&d->stop)) {
			atomic_store(&d->sleeping, false);
			continue;
		}
		dead = atomic_load(&d->dead);
		if (!dead && (rxw = io_sleep_rx(d, &stalled)) < 0) {
			atomic_store(&d->sleeping, false);
			continue;
		}
		if (!dead && (d->tx_blocked || stalled) && tx_enable_cb(d)) {
			tx_disable_cb(d);
			atomic_store(&d->io_norx, false);
			atomic_store(&d->sleeping, false);
			continue;
		}
		pthread_mutex_lock(&d->tx_mu);
		STAT_SET(d, tx_inflight, d->ntx - d->tx_nfree);
		pthread_mutex_unlock(&d->tx_mu);
		STAT_SET(d, sleep_state, (d->tx_blocked ? VDRV_SLEPT_TX_BLOCKED : 0u) |
					 (stalled ? VDRV_SLEPT_RX_STALLED : 0u) |
					 (dead ? VDRV_SLEPT_DEAD : 0u));
		timeout = POLL_MAX_MS;
		if (!dead && rxw == 0)
			timeout = NORX_MAX_MS;
		deadline = vsock_engine_next_deadline(d->e);
		now = mono_ns();
		if (deadline != UINT64_MAX) {
			uint64_t ms = deadline > now ? (deadline - now + 999999u) / 1000000u : 0;

			if (ms < (uint64_t)timeout)
				timeout = (int)ms;
		}
		n = 0;
		pfd[n++] = (struct pollfd){ .fd = d->wake_fd, .events = POLLIN };
		if (!dead) {
			if (rxw > 0)
				pfd[n++] = (struct pollfd){ .fd = d->rx_call, .events = POLLIN };
			pfd[n++] = (struct pollfd){ .fd = d->tx_call, .events = POLLIN };
			if (d->ev)
				pfd[n++] = (struct pollfd){ .fd = d->ev_call, .events = POLLIN };
			/* No events: only POLLHUP/POLLERR, i.e. the back-end went away. */
			pfd[n++] = (struct pollfd){ .fd = d->front_fd, .events = 0 };
		}
		poll(pfd, (nfds_t)n, timeout);
		atomic_store(&d->io_norx, false);
		atomic_store(&d->sleeping, false);
		atomic_store(&d->wake_sent, false);
		STAT_ADD(d, wakeups, 1);
		if (!dead)
			tx_disable_cb(d);
		for (int i = 0; i < n; i++) {
			if (pfd[i].fd == d->front_fd && i > 0) {
				if (pfd[i].revents & (POLLHUP | POLLERR))
					backend_lost(d, "back-end hung up");
			} else if (pfd[i].fd == d->rx_call && i > 0) {
				/* Read by io_rx under the token (a holder may need it). */
				rx_signalled |= !!(pfd[i].revents & POLLIN);
			} else if (pfd[i].revents & POLLIN) {
				drain_eventfd(pfd[i].fd);
			}
		}
	}
	final_flush(d);
	tls_io = NULL;
	return NULL;
}

/* ---- direct RX: an application thread drains the RX ring ------------------------------- */

int vdrv_rx_wait(struct vdrv *d, struct pollfd *fds, unsigned nfds, atomic_uint *word,
		 unsigned val, uint64_t deadline_ns)
{
	struct pollfd *own = fds + nfds;
	int timeout = POLL_MAX_MS;
	bool fed, intr;
	uint64_t now;

	if (!d->direct || !atomic_load(&d->direct_ok) || atomic_load(&d->dead) || tls_io == d ||
	    tls_rx == d)
		return 0;
	if (!rx_try(d)) {
		/* seq_cst store, then the exchange: pairs with rx_put_app's store and exchange. */
		atomic_store(&d->rx_contended, true);
		if (!rx_try(d))
			return 0;
	}
	if (!atomic_load(&d->direct_ok) || atomic_load(&d->dead)) {
		atomic_store(&d->rx_tok, false);
		return 0;
	}
	tls_rx = d;
	vring_drv_disable_cb(d->rx);
	fed = rx_pass(d);
	if (!fed && !d->rx_stalled && vring_drv_enable_cb(d->rx)) {
		/* Buffers came back before the re-enable: take them now. */
		vring_drv_disable_cb(d->rx);
		fed = rx_pass(d);
	}
	if (fed)
		STAT_ADD(d, rx_direct, 1);
	if (d->rx_stalled || fed || (word && atomic_load(word) != val)) {
		bool stalled = d->rx_stalled;

		rx_put_app(d);
		return stalled && !fed ? 0 : 1;
	}
	/* The RX interrupt is on (enabled above) and nothing is pending: sleep on it. */
	/* seq_cst store, then the load of *word: pairs with the event's bump of *word and its load
	 * of holder_sleeping in vdrv_rx_wake(). */
	atomic_store(&d->holder_sleeping, true);
	if (word && atomic_load(word) != val) {
		atomic_store(&d->holder_sleeping, false);
		rx_put_app(d);
		return 1;
	}
	now = mono_ns();
	if (deadline_ns != UINT64_MAX) {
		uint64_t ms = deadline_ns > now ? (deadline_ns - now + 999999u) / 1000000u : 0;

		if (ms < (uint64_t)timeout)
			timeout = (int)ms;
	}
	own[0] = (struct pollfd){ .fd = d->rx_call, .events = POLLIN };
	own[1] = (struct pollfd){ .fd = d->hold_fd, .events = POLLIN };
	STAT_ADD(d, rx_direct_sleeps, 1);
	intr = poll(fds, (nfds_t)nfds + 2, timeout) < 0 && errno == EINTR;
	atomic_store(&d->holder_sleeping, false);
	if (intr) {
		rx_put_app(d);
		return -EINTR;
	}
	if (own[0].revents & POLLIN)
		drain_eventfd(d->rx_call);
	if (own[1].revents & POLLIN)
		drain_eventfd(d->hold_fd);
	if (atomic_load(&d->direct_ok) && !atomic_load(&d->dead)) {
		vring_drv_disable_cb(d->rx);
		if (rx_pass(d))
			STAT_ADD(d, rx_direct, 1);
	}
	rx_put_app(d);
	return 1;
}

void vdrv_rx_wake(struct vdrv *d)
{
	/* The holder itself feeding the engine needs no wake-up. */
	if (tls_rx == d || !atomic_load(&d->holder_sleeping))
		return;
	signal_eventfd(d->hold_fd, "holder wake");
}

void vdrv_test_io_rx(struct vdrv *d, bool on)
{
	atomic_store(&d->io_rx_off, !on);
	vdrv_tx_ready(d);
}

void vdrv_test_io_tx(struct vdrv *d, bool on)
{
	atomic_store_explicit(&d->io_tx_off, !on, memory_order_relaxed);
	vdrv_tx_ready(d);
}

/* ---- direct TX: an application thread publishes its own bytes ------------------------- */

/*
 * Takes a TX slot for a direct sender, to fill outside tx_mu with a packet of n bytes; -1 if
 * none may be taken. A packet below TX_DIRECT_SMALL is refused while the device still holds
 * TX buffers: it then goes through the engine, which queues it with the writes that follow and
 * hands the I/O thread packets of up to 64 KiB (the device works per packet).
 */
static int tx_slot_take(struct vdrv *d, size_t n)
{
	int slot = -1;

	pthread_mutex_lock(&d->tx_mu);
	if (d->tx_ok && !atomic_load(&d->dead))
		slot = tx_slot_get(d);
	if (slot >= 0 && n < TX_DIRECT_SMALL && d->tx_nfree + d->tx_held < d->ntx) {
		tx_reclaim(d);
		/* The pool's top may have changed: take the slot anew. */
		slot = d->tx_nfree + d->tx_held < d->ntx ? -1 : d->tx_free[d->tx_nfree - 1];
	}
	if (slot >= 0) {
		d->tx_nfree--;
		d->tx_held++;
	}
	pthread_mutex_unlock(&d->tx_mu);
	return slot;
}

/*
 * Commits the n bytes a direct sender copied into `slot` and publishes the packet, or gives
 * the slot back. Returns 0, or -1: nothing was accounted (s changed since the reserve), or the
 * ring broke.
 */
static int tx_slot_send(struct vdrv *d, struct vsock_sock *s, uint16_t slot, size_t n)
{
	unsigned since_kick = 0;
	struct vsock_hdr h;
	int r = -1;

	pthread_mutex_lock(&d->tx_mu);
	d->tx_held--;
	/*
	 * Under tx_mu, nothing the engine queues for s after this commit can reach the ring
	 * before the packet. A commit that fails (a packet fed meanwhile: RST, SHUTDOWN, a
	 * smaller credit; or a control packet queued) accounted nothing: the bytes are still
	 * the caller's, and send()'s own path takes it from here.
	 */
	if (d->tx_ok && !atomic_load(&d->dead) && vsock_sock_tx_commit(s, n, &h) == 0) {
		/* A broken ring resets every socket: the accounted bytes are moot then. */
		r = tx_publish(d, slot, &h, (uint32_t)n, &since_kick);
		if (r == 0)
			kick(d, d->tx, d->tx_kick);
	} else {
		d->tx_free[d->tx_nfree++] = slot;
	}
	if (!d->tx_held)
		pthread_cond_broadcast(&d->tx_cond);
	pthread_mutex_unlock(&d->tx_mu);
	return r;
}

ssize_t vdrv_tx_send(struct vdrv *d, struct vsock_sock *s, const struct iovec *iov, int iovcnt,
		     size_t len, size_t max_pkt)
{
	struct iov_cur cur;
	size_t done = 0;

	if (!d->tx_direct || iovcnt < 0 || tls_io == d)
		return 0;
	max_pkt = MIN(max_pkt, (size_t)TX_PAYLOAD);
	iov_cur_init(&cur, iov, (size_t)iovcnt);
	while (done < len) {
		ssize_t room;
		size_t n;
		int slot;

		/* -EAGAIN: control packets or queued bytes of s go first (through the engine);
		 * 0: no credit; other errors: send()'s own path reports them. Commit checks
		 * again. */
		room = vsock_sock_tx_reserve(s, MIN(len - done, max_pkt));
		if (room <= 0)
			break;
		slot = tx_slot_take(d, (size_t)room);
		if (slot < 0)
			break;
		/* The one copy, outside tx_mu: the slot is ours until tx_slot_send. */
		n = iov_cur_read(&cur, d->tx_arena + (size_t)slot * SLOT_STRIDE + VSOCK_HDR_SIZE,
				 (size_t)room);
		if (tx_slot_send(d, s, (uint16_t)slot, n) < 0)
			break;
		done += n;
		STAT_ADD(d, tx_direct_pkts, 1);
		STAT_ADD(d, tx_direct_bytes, (uint64_t)n);
	}
	return (ssize_t)done;
}

/* ---- control path ----------------------------------------------------------------------- */

void vdrv_tx_ready(struct vdrv *d)
{
	if (tls_io == d) {
		atomic_store_explicit(&d->tx_work, true, memory_order_relaxed);
		return;
	}
	/* seq_cst store of tx_work, then load of sleeping: pairs with the I/O thread's store of
	 * sleeping, then load of tx_work. */
	atomic_store(&d->tx_work, true);
	if (atomic_load(&d->sleeping) && !atomic_exchange(&d->wake_sent, true))
		signal_eventfd(d->wake_fd, "wake");
}

/*
 * Takes the RX token back from the data path before the session's rings go away: no
 * application thread may claim it any more, a sleeping holder is woken and gives it back (it
 * holds it for one pass and one poll() at most).
 */
static void rx_quiesce(struct vdrv *d)
{
	atomic_store(&d->direct_ok, false);
	while (!rx_try(d)) {
		signal_eventfd(d->hold_fd, "holder wake");
		poll(NULL, 0, 1);
	}
	/* A wake-up nobody took is stale for the next session. */
	drain_eventfd(d->hold_fd);
}

/*
 * Ends direct TX for the session: no sender takes a slot any more, and those filling one
 * outside tx_mu give it back or publish it before this returns.
 */
static void tx_quiesce(struct vdrv *d)
{
	pthread_mutex_lock(&d->tx_mu);
	d->tx_ok = false;
	while (d->tx_held)
		pthread_cond_wait(&d->tx_cond, &d->tx_mu);
	pthread_mutex_unlock(&d->tx_mu);
}

static int thread_start(struct vdrv *d)
{
	int r;

	atomic_store(&d->stop, false);
	atomic_store(&d->sleeping, false);
	atomic_store(&d->wake_sent, false);
	atomic_store(&d->tx_work, true);
	/* The control path held the RX token while no session ran: hand it to the data path. */
	atomic_store(&d->rx_tok, false);
	atomic_store(&d->direct_ok, true);
	pthread_mutex_lock(&d->tx_mu);
	d->tx_ok = true;
	pthread_mutex_unlock(&d->tx_mu);
	r = -pthread_create(&d->th, NULL, io_main, d);
	if (r < 0) {
		tx_quiesce(d);
		rx_quiesce(d);
		return r;
	}
	d->running = true;
	return 0;
}

static void thread_stop(struct vdrv *d)
{
	if (!d->running)
		return;
	/* No direct sender publishes from here on; the last one leaves before the flush. */
	tx_quiesce(d);
	atomic_store(&d->stop, true);
	signal_eventfd(d->wake_fd, "wake");
	pthread_join(d->th, NULL);
	rx_quiesce(d);
	d->running = false;
}

/* Connects and initialises a new front-end on the configured path. */
static int front_open(struct vdrv *d)
{
	struct vhu_front_config fc;
	struct vhu_front *f = NULL;
	uint64_t cid;
	int r;

	vhu_front_config_init(&fc);
	fc.mem_size = d->mem_size;
	fc.queue_size = d->cfg.queue_size;
	fc.timeout_ms = d->cfg.timeout_ms;
	fc.num_queues = d->cfg.event_queue ? 3 : 2;
	/* tune no-event-idx: notifications by flags only, as before the event index. */
	if (!tune_get()->event_idx)
		fc.features &= ~VHU_BIT(VHU_F_EVENT_IDX);
	if (!tune_get()->in_order) /* tune no-in-order: every used element read one by one */
		fc.features &= ~VHU_BIT(VHU_F_IN_ORDER);
	if (!d->cfg.no_dgram)
		fc.features |= VHU_BIT(VHU_VSOCK_F_DGRAM);
	/* Packed rings when the back-end offers them (tune no-packed: split only). */
	if (tune_get()->packed)
		fc.features |= VHU_BIT(VHU_F_RING_PACKED);
	r = vhu_front_connect(d->path, &fc, &f);
	if (r < 0)
		return r;
	r = vhu_front_init(f);
	if (r < 0) {
		vhu_front_free(f);
		return r;
	}
	cid = vhu_front_guest_cid(f);
	d->f = f;
	d->cid = (uint32_t)cid;
	d->seqpacket = !!(vhu_front_features(f) & VHU_BIT(VHU_VSOCK_F_SEQPACKET));
	d->dgram = !!(vhu_front_features(f) & VHU_BIT(VHU_VSOCK_F_DGRAM));
	return 0;
}

int vdrv_new(const struct vdrv_config *cfg, struct vdrv **ret)
{
	struct vring_layout l;
	struct vdrv *d;
	uint64_t need;
	int r;

	if (!cfg || !cfg->socket_path || !ret)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->cfg = *cfg;
	d->wake_fd = -1;
	d->hold_fd = -1;
	d->direct = tune_get()->direct_rx;
	d->rx_batch = tune_get()->rx_batch;
	/* No session yet: the control path holds the RX token (thread_start hands it over). */
	atomic_init(&d->rx_tok, true);
	pthread_mutex_init(&d->ctl_mu, NULL);
	pthread_mutex_init(&d->tx_mu, NULL);
	pthread_cond_init(&d->tx_cond, NULL);
	d->tx_direct = tune_get()->tx_direct;
	if (!d->cfg.queue_size)
		d->cfg.queue_size = 128;
	if (!d->cfg.rx_buf_min)
		d->cfg.rx_buf_min = VDRV_RXSIZE_MIN_DEFAULT;
	if (!d->cfg.rx_buf_max)
		d->cfg.rx_buf_max = VDRV_RXSIZE_MAX_DEFAULT;
	if (!d->cfg.timeout_ms)
		d->cfg.timeout_ms = 5000;
	/* tune no-pkt64k: RX buffers of at most 4 KiB (the device splits larger packets), as
	 * Linux's guest posts; no-rx-adaptive: one fixed size, the largest allowed. */
	if (!tune_get()->pkt64k && d->cfg.rx_buf_max > VDRV_RXSIZE_MIN_DEFAULT)
		d->cfg.rx_buf_max = VDRV_RXSIZE_MIN_DEFAULT;
	if (!tune_get()->pkt64k && d->cfg.rx_buf_min > d->cfg.rx_buf_max)
		d->cfg.rx_buf_min = d->cfg.rx_buf_max;
	if (!tune_get()->rx_adaptive)
		d->cfg.rx_buf_min = d->cfg.rx_buf_max;
	if (d->cfg.queue_size > MAX_QUEUE_SIZE || vring_layout(d->cfg.queue_size, &l) < 0 ||
	    d->cfg.tx_bufs > MAX_QUEUE_SIZE ||
	    vdrv_rxsize_init(&d->rxs, d->cfg.rx_buf_min, d->cfg.rx_buf_max) < 0) {
		r = -EINVAL;
		goto fail;
	}
	d->cfg.socket_path = NULL;
	d->path = strdup(cfg->socket_path);
	if (!d->path) {
		r = -ENOMEM;
		goto fail;
	}
	/* Two rings, one slot per RX descriptor and per TX buffer, rounded up to 1 MiB. */
	need = (d->cfg.event_queue ? 3 : 2) * (uint64_t)l.total + 4096 +
	       (d->cfg.event_queue ? 8 + VSOCK_EVENT_LEN * (uint64_t)d->cfg.queue_size : 0) +
	       (uint64_t)SLOT_STRIDE * (d->cfg.queue_size +
					(d->cfg.tx_bufs ? d->cfg.tx_bufs : d->cfg.queue_size));
	d->mem_size = (need + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	d->hold_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->wake_fd < 0 || d->hold_fd < 0) {
		r = -errno;
		goto fail;
	}
	r = front_open(d);
	if (r < 0)
		goto fail;
	*ret = d;
	return 0;

fail:
	vdrv_free(d);
	return r;
}

uint32_t vdrv_guest_cid(const struct vdrv *d)
{
	return d->cid;
}

uint64_t vdrv_features(const struct vdrv *d)
{
	return d->f ? vhu_front_features(d->f) : 0;
}

bool vdrv_seqpacket(const struct vdrv *d)
{
	return d->seqpacket;
}

bool vdrv_dgram(const struct vdrv *d)
{
	return d->dgram;
}

int vdrv_start(struct vdrv *d, struct vsock_engine *e)
{
	int r;

	if (!d || !e)
		return -EINVAL;
	pthread_mutex_lock(&d->ctl_mu);
	if (d->e || !d->f) {
		r = d->e ? -EALREADY : -ENOTCONN;
		goto out;
	}
	d->e = e;
	r = session_open(d);
	if (r < 0) {
		d->e = NULL;
		goto out;
	}
	r = thread_start(d);
	if (r < 0) {
		session_free(d);
		d->e = NULL;
	}
out:
	pthread_mutex_unlock(&d->ctl_mu);
	return r;
}

int vdrv_transport_reset(struct vdrv *d)
{
	uint8_t cfg[8];
	uint64_t cid;
	int r = -ENOTCONN;

	pthread_mutex_lock(&d->ctl_mu);
	if (d->f) {
		r = vhu_front_get_config(d->f, 0, sizeof(cfg), cfg);
		if (r == 0) {
			cid = vsock_le64_get_(cfg);
			if (cid > 2 && cid < VMADDR_CID_ANY)
				d->cid = (uint32_t)cid;
			else
				r = -EPROTO;
		}
	}
	if (d->e) {
		STAT_ADD(d, resets, 1);
		vsock_engine_transport_reset(d->e, r == 0 ? d->cid : VMADDR_CID_ANY);
	}
	pthread_mutex_unlock(&d->ctl_mu);
	return r;
}

int vdrv_reconnect(struct vdrv *d)
{
	int r;

	pthread_mutex_lock(&d->ctl_mu);
	if (!d->e) {
		r = -ENOTCONN;
		goto out;
	}
	thread_stop(d);
	session_free(d);
	vhu_front_free(d->f);
	d->f = NULL;
	r = front_open(d);
	STAT_ADD(d, resets, 1);
	/* Connected sockets of the old session are gone; listeners adopt the (new) CID. */
	vsock_engine_transport_reset(d->e, r == 0 ? d->cid : VMADDR_CID_ANY);
	if (r < 0)
		goto out;
	r = session_open(d);
	if (r < 0)
		goto out;
	r = thread_start(d);
	if (r < 0)
		session_free(d);
out:
	pthread_mutex_unlock(&d->ctl_mu);
	return r;
}

void vdrv_stop(struct vdrv *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->ctl_mu);
	thread_stop(d);
	if (d->have_session && d->f && !atomic_load(&d->dead))
		vhu_front_stop(d->f, NULL); /* best effort: the back-end may be gone */
	session_free(d);
	d->e = NULL;
	pthread_mutex_unlock(&d->ctl_mu);
}

void vdrv_free(struct vdrv *d)
{
	if (!d)
		return;
	vdrv_stop(d);
	vhu_front_free(d->f);
	if (d->wake_fd >= 0)
		close(d->wake_fd);
	if (d->hold_fd >= 0)
		close(d->hold_fd);
	pthread_mutex_destroy(&d->ctl_mu);
	pthread_mutex_destroy(&d->tx_mu);
	pthread_cond_destroy(&d->tx_cond);
	free(d->path);
	free(d);
}

bool vdrv_alive(const struct vdrv *d)
{
	return d->running && !atomic_load(&((struct vdrv *)d)->dead);
}

void vdrv_get_stats(struct vdrv *d, struct vdrv_stats *ret)
{
	struct vdrv_stats s;

#define LD(x) s.x = atomic_load_explicit(&d->st.x, memory_order_relaxed)
	LD(rx_bufs);
	LD(rx_batches);
	LD(rx_dropped);
	LD(rx_buf_len);
	LD(rx_posted);
	LD(tx_pkts);
	LD(tx_bytes);
	LD(tx_full);
	LD(kicks);
	LD(kicks_suppressed);
	LD(wakeups);
	LD(resets);
	LD(backend_lost);
	LD(tx_inflight);
	LD(sleep_state);
	LD(rx_direct);
	LD(rx_direct_sleeps);
	LD(tx_direct_pkts);
	LD(tx_direct_bytes);
	LD(ev_resets);
#undef LD
	*ret = s;
}
