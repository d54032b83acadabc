/* SPDX-License-Identifier: MIT */
/*
 * The guest role: a userspace counterpart of Linux's virtio-vsock guest driver
 * (net/vmw_vsock/virtio_transport.c) that drives any vhost-user vsock back-end through real
 * shared-memory virtqueues, with no VM. It owns:
 *
 *   - the vhost-user front-end connection (src/vhost_user/frontend.h): features, GET_CONFIG
 *     (guest CID), guest memory in a memfd, the rx (0) and tx (1) rings placed in it;
 *   - RX buffers in guest memory, kept posted (refilled when fewer than half remain), one
 *     descriptor each, sized by an EWMA of received packet sizes between 4 and 64 KiB (rxsize.h);
 *   - a TX buffer pool in guest memory: header and payload in one descriptor; completions reclaim
 *     buffers; while the pool or the ring is full nothing more is pulled from the engine;
 *   - one I/O thread that waits on the call eventfds, a wake eventfd and the engine's next timer
 *     deadline, feeds received packets to the engine in batches (vsock_engine_feed_batch: one
 *     socket lookup and lock per run of same-flow packets, readable events deferred to the end of
 *     the batch), pulls what the engine has to send, and runs the engine's timers.
 *
 * The protocol engine is not created here: the caller (src/lib/guest.c, the socket API's
 * guest transport) creates it with the CID this module read and attaches it with vdrv_start().
 *
 * Notifications use the event index both ways when the back-end offers it: while the I/O thread
 * is working it keeps device interrupts off (vring_drv_disable_cb) and re-enables them only
 * before it sleeps (re-checking the ring after the re-enable), and it kicks only when the
 * device's avail_event asks for it (vring_drv_kick_prepare). A busy device and a busy driver so
 * stop signalling each other.
 *
 * Security model: the back-end is not trusted. Used lengths and headers it writes are checked
 * (a used buffer shorter than a header, or whose header claims more payload than was written, is
 * dropped and counted); a used ring error breaks the rings (every socket is reset, nothing
 * crashes); a back-end that hangs up resets every connected socket.
 *
 * Direct RX (tune direct_rx): an application thread blocked in the socket API may drain the RX
 * ring itself (vdrv_rx_wait) instead of waiting for the I/O thread: whoever holds the RX drain
 * token owns the RX ring's driver side (docs/guest-role.md, "Direct RX").
 *
 * Direct TX (tune tx_direct): an application thread sending on a STREAM socket whose engine
 * queue is empty copies its bytes straight into TX buffers and publishes them (vdrv_tx_send):
 * one copy, no engine send ring, no I/O thread wake-up (docs/guest-role.md, "Direct TX").
 *
 * Threads: vdrv_tx_ready(), vdrv_rx_wait(), vdrv_rx_wake() and vdrv_tx_send() may be called
 * from any thread
 * (tx_ready is the engine's hook). The other calls are control-path calls, made by one thread at
 * a time.
 */
#ifndef UVSOCK_DRIVER_DRIVER_H
#define UVSOCK_DRIVER_DRIVER_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "vsock/engine.h"

struct vdrv;

struct vdrv_config {
	const char *socket_path;   /* the back-end's vhost-user socket (copied) */
	unsigned queue_size;       /* ring size, power of two <= 1024; 0: 128 (QEMU's) */
	uint32_t rx_buf_min;       /* RX payload room bounds; 0: 4096 and 65536 */
	uint32_t rx_buf_max;
	unsigned tx_bufs;          /* TX pool buffers (64 KiB + header each); 0: queue_size */
	int timeout_ms;            /* deadline of each vhost-user exchange and connect; 0: 5000 */
	unsigned busy_poll_us;     /* spin this long on the rings before sleeping; 0: never */
	bool event_queue;          /* hand the event queue to the back-end too (three queues) and
				    * act on its TRANSPORT_RESET events (vdrv_transport_reset) */
	bool no_dgram;             /* do not ask for VIRTIO_VSOCK_F_DGRAM */
};

/* Counters, monotonic; snapshot with vdrv_get_stats() from any thread. */
struct vdrv_stats {
	uint64_t rx_bufs;           /* used RX buffers taken from the ring */
	uint64_t rx_batches;        /* vsock_engine_feed_batch / feed calls */
	uint64_t rx_dropped;        /* used RX buffers dropped: short, or header longer than data */
	uint64_t rx_buf_len;        /* total length of the RX buffers posted last (not monotonic) */
	uint64_t rx_posted;         /* RX buffers currently posted (not monotonic) */
	uint64_t tx_pkts, tx_bytes; /* packets / payload bytes put on the TX ring */
	uint64_t tx_full;           /* times pulling stopped: TX pool or ring full */
	uint64_t kicks;             /* kick eventfd writes (both rings) */
	uint64_t kicks_suppressed;  /* publications where the device asked for no kick */
	uint64_t wakeups;           /* times the I/O thread slept and woke up */
	uint64_t resets;            /* transport resets (explicit, reconnect, back-end loss) */
	uint64_t backend_lost;      /* back-end hung up or broke the rings */
	uint64_t tx_inflight;       /* TX buffers on the ring now (not monotonic) */
	uint64_t sleep_state;       /* VDRV_SLEPT_* as of the last sleep (not monotonic) */
	uint64_t rx_direct;         /* RX passes run by application threads that took packets */
	uint64_t rx_direct_sleeps;  /* waits in which an application thread slept on the RX
				     * interrupt itself (vdrv_rx_wait) */
	uint64_t tx_direct_pkts;    /* packets an application thread put on the TX ring itself
				     * (vdrv_tx_send; also in tx_pkts) */
	uint64_t tx_direct_bytes;   /* their payload bytes (also in tx_bytes) */
	uint64_t ev_resets;         /* TRANSPORT_RESET events from the event queue (also in
				     * resets) */
};

/* Why the I/O thread last went to sleep (diagnostics, vdrv_stats.sleep_state). */
#define VDRV_SLEPT_TX_BLOCKED 0x1u  /* engine had packets, TX pool or ring full */
#define VDRV_SLEPT_RX_STALLED 0x2u  /* engine reply queue full: RX not taken */
#define VDRV_SLEPT_DEAD 0x4u        /* back-end gone */

/* Fills *cfg with the defaults (socket_path NULL). */
void vdrv_config_default(struct vdrv_config *cfg);

/*
 * Connects to the back-end at cfg->socket_path and initialises the device (features,
 * GET_CONFIG): afterwards vdrv_guest_cid() and vdrv_seqpacket() are known. No rings yet.
 * Returns 0, -EINVAL (bad config), -ENOMEM, or what vhu_front_connect/vhu_front_init return
 * (-ETIMEDOUT, -ECONNRESET, -EPROTONOSUPPORT, -EPROTO...). Context: any thread.
 */
int vdrv_new(const struct vdrv_config *cfg, struct vdrv **ret);

/* The guest CID read with GET_CONFIG (changes on vdrv_transport_reset / vdrv_reconnect). */
uint32_t vdrv_guest_cid(const struct vdrv *d);
/* The virtio features negotiated with the back-end (0 while disconnected). Control thread. */
uint64_t vdrv_features(const struct vdrv *d);
/* True if the back-end negotiated VIRTIO_VSOCK_F_SEQPACKET. */
bool vdrv_seqpacket(const struct vdrv *d);
/*
 * True if the back-end negotiated VIRTIO_VSOCK_F_DGRAM (bit 3; asked for unless cfg.no_dgram).
 * Then every RX buffer posted has at least VDRV_RXSIZE_DGRAM bytes of payload room (a 64 KiB
 * buffer with the header), whatever the adaptive size or the no-pkt64k cap would be: a datagram is delivered only whole, in one
 * buffer (docs/guest-role.md, "Datagrams").
 */
bool vdrv_dgram(const struct vdrv *d);

/*
 * Starts the device (SET_MEM_TABLE, rings, SET_VRING_ENABLE), posts RX buffers and starts the
 * I/O thread driving engine e (borrowed; must stay alive until vdrv_stop()). The engine's
 * tx_ready hook must call vdrv_tx_ready(). Returns 0, -EALREADY, or a front-end / pthread error.
 */
int vdrv_start(struct vdrv *d, struct vsock_engine *e);

/*
 * The engine has packets to pull, or its next timer deadline moved earlier: makes the I/O
 * thread look. Cheap when the thread is awake (no system call). Any thread, no lock held.
 */
void vdrv_tx_ready(struct vdrv *d);

/*
 * TRANSPORT_RESET as Linux handles it (net/vmw_vsock/virtio_transport.c,
 * virtio_vsock_event_handle() and virtio_vsock_reset_sock()): re-reads the guest CID with
 * GET_CONFIG, then every connected or connecting socket becomes closed with ECONNRESET (no RST
 * is sent) and
 * listeners survive, adopting the new CID. With vhost-user the event queue belongs to the VMM,
 * so this is how a VMM (or a test) delivers the event. Returns 0 or a front-end error (then the
 * sockets are still reset, with the old CID kept).
 */
int vdrv_transport_reset(struct vdrv *d);

/*
 * Simulates a VM reset behind the same VMM socket: stops the I/O thread, closes the front-end
 * (the back-end sees the VMM go away), connects a new one to the same socket path, reads the
 * CID again, resets connected sockets as vdrv_transport_reset() does, and starts again with
 * fresh rings. Listeners survive. Returns 0 or a front-end error (the driver is then stopped and
 * every socket reset; a later vdrv_reconnect() may be tried again).
 */
int vdrv_reconnect(struct vdrv *d);

/*
 * Stops the I/O thread after a last TX pass (so SHUTDOWN/RST packets queued by close() go out),
 * then stops the rings (SET_VRING_ENABLE 0, GET_VRING_BASE). The engine may be freed afterwards.
 * Idempotent.
 */
void vdrv_stop(struct vdrv *d);

/* Stops if needed, closes the front-end and frees everything. Safe on NULL. */
void vdrv_free(struct vdrv *d);

/*
 * Direct RX (tune direct_rx, issue "one wake-up per hop"): one round of a wait of an
 * application thread blocked in the socket API, which drains the RX ring itself instead of
 * waiting for the I/O thread to hand packets over. If the RX drain token is free the caller
 * takes it, runs an RX pass (packets go through the engine, whose sock_event wakes their
 * waiters), and unless that changed *word from val (word may be NULL) or found packets, sleeps
 * in poll() on the RX interrupt, its holder wake-up (vdrv_rx_wake) and the caller's fds[0..nfds)
 * until one fires or deadline_ns (CLOCK_MONOTONIC, UINT64_MAX: none) passes; then one more RX
 * pass and the token goes back. fds must have room for nfds + 2 entries (the last two are
 * ours); revents of the caller's entries are set by poll().
 * Returns 1 (the caller re-checks its condition and may call again), -EINTR (a signal
 * interrupted the sleep; the token is given back), or 0 if the token is not
 * available (another thread drains, no session, back-end gone, direct RX off, RX held back
 * until TX drains): then the caller sleeps its own way, and whoever drains wakes it through the
 * engine's sock_event as before. Never spins: 1 without sleeping only after progress.
 * Context: any application thread, no engine or socket-API lock held except the API's
 * per-direction socket lock; not from the engine's callbacks.
 */
int vdrv_rx_wait(struct vdrv *d, struct pollfd *fds, unsigned nfds, atomic_uint *word,
		 unsigned val, uint64_t deadline_ns);

/*
 * Wakes the application thread sleeping in vdrv_rx_wait, if one sleeps (an event it may be
 * waiting for came from elsewhere: another thread's call, a timer). Cheap otherwise: one
 * atomic load. Any thread, including from sock_event (engine socket lock held).
 */
void vdrv_rx_wake(struct vdrv *d);

/*
 * Direct TX (tune tx_direct): sends up to len bytes of iov (iovcnt entries, already checked)
 * on the STREAM socket s in the calling thread: while the engine has nothing queued for s
 * (vsock_sock_tx_reserve), the peer's credit allows and TX buffers are free, the bytes are
 * copied straight into TX buffers in packets of at most max_pkt (the engine's cfg.max_pkt),
 * accounted with vsock_sock_tx_commit, put on the TX ring and the device kicked if it asks for
 * it. Returns the bytes sent, 0 included: whatever is left goes through vsock_sock_send() as
 * before (which also reports EPIPE, ENOTCONN, ECONNRESET, no credit...). Never blocks beyond
 * the TX lock held by another sender or the I/O thread.
 * Context: any application thread, holding the socket API's send lock of s (one sender per
 * socket), no engine lock; not from the engine's callbacks or the I/O thread (returns 0).
 */
ssize_t vdrv_tx_send(struct vdrv *d, struct vsock_sock *s, const struct iovec *iov, int iovcnt,
		     size_t len, size_t max_pkt);

/*
 * Test hook: with on false the I/O thread stops draining the RX ring (it leaves it to
 * application threads in vdrv_rx_wait), to show that a blocked call gets its data without it.
 * Any thread.
 */
void vdrv_test_io_rx(struct vdrv *d, bool on);

/*
 * Test hook: with on false the I/O thread pulls nothing from the engine (what send() queues
 * there stays queued; direct TX is not affected), to show that a send falls back behind
 * queued packets. Turn it back on before stopping. Any thread.
 */
void vdrv_test_io_tx(struct vdrv *d, bool on);

/* True while the I/O thread runs and the back-end is usable. Any thread. */
bool vdrv_alive(const struct vdrv *d);

/* Snapshot of the counters. Any thread. */
void vdrv_get_stats(struct vdrv *d, struct vdrv_stats *ret);

#endif
