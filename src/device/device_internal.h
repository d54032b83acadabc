/* SPDX-License-Identifier: MIT */
/*
 * The device core's private state (device.c: rings, engine, settle, calls, construction) and
 * what the files of src/device share: the RX producer table (struct dev_rx_src) and the core's
 * functions (dev_*). Each other part of a device is declared in its owner's header and embedded
 * in struct vsock_dev: host_uds.h (d->host), host_dgram.h (d->dgram), sibling.h (d->sib),
 * embed.h (d->embed). The vhost-user glue (vhu.c) does not see any of it (vhu.h).
 * Everything is owned by the device's thread except where a field says otherwise: the sibling
 * port (its own lock and reference count, shared with the linked devices), eng under eng_lock
 * for readers, the call mailbox under call_lock, and the counters (single writer, read with
 * relaxed atomics).
 */
#ifndef UVSOCK_DEVICE_DEVICE_INTERNAL_H
#define UVSOCK_DEVICE_DEVICE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include "device/vsock_dev.h"
#include "device/embed.h"
#include "device/evq.h"
#include "device/host_dgram.h"
#include "device/host_uds.h"
#include "device/sibling.h"
#include "ops/pcap.h"
#include "util/loop.h"
#include "util/uds.h"
#include "vhost_user/backend.h"
#include "vring/vring.h"
#include "vsock/engine.h"

/* Work per pass, as vhost (VHOST_VSOCK_PKT_WEIGHT / VHOST_VSOCK_WEIGHT). */
#define DEV_PASS_PKTS 256u
#define DEV_PASS_BYTES (512u * 1024)
/* TX chains fed to the engine as one batch, and iovecs per row (half for the chain, half for
 * its payload slice: chains of up to 64 segments are accepted, e.g. Linux 6.17 nonlinear skbs). */
#define DEV_TX_BATCH 64u
#define DEV_TX_IOV_MAX 128u
/*
 * Zero-copy host reads (dev_host_rx): one readv fills up to DEV_RX_GATHER guest RX buffers
 * (each one packet) with at most DEV_RX_GATHER_BYTES, so a guest posting small buffers (Linux:
 * 4 KiB) costs one read per 64 KiB, not one per buffer, and one posting 64 KiB buffers gets up
 * to a Linux guest's whole default credit (256 KiB) in one read: one wake-up of a host writer
 * blocked on its full socket per read, not one per 64 KiB.
 */
#define DEV_RX_GATHER 16u
#define DEV_RX_GATHER_BYTES (256u * 1024)
/* Largest packet payload with the pkt64k switch off (src/util/tune.h), as Linux before 6.x. */
#define DEV_PKT_SMALL 4096u
/* RX chain iovecs (Linux posts one or two elements per RX buffer). */
#define DEV_RX_IOV_MAX 64u
/*
 * RX share while both the VM's own engine and the sibling inbox have packets: the inbox gets one
 * RX buffer after every DEV_RX_ENG_SHARE buffers of the engine, so the VM's own (host) traffic
 * keeps at least 4/5 of its RX ring, the 80 % a flooding sibling may not push it under
 * (docs/hostile-scenarios.md, scenario k), while a legitimate sibling still gets 1/5 when the
 * engine is busy. Work-conserving: buffers the engine does not need go to the inbox.
 */
#define DEV_RX_ENG_SHARE 4u
/* The device's counters as it keeps them (vsock_dev_get_stats copies them out). */
struct dev_counters {
#define DEV_COUNTER_FIELD_(f) _Atomic uint64_t f;
	VSOCK_DEV_STATS(DEV_COUNTER_FIELD_)
#undef DEV_COUNTER_FIELD_
};

/* Single-writer update (the device thread only): a relaxed load and store, no read-modify-write;
 * readers on other threads load each counter relaxed (a whole value, no ordering needed). */
#define DEV_STAT_ADD(d, field, n)                                                                  \
	atomic_store_explicit(&(d)->stats.field,                                                   \
			      atomic_load_explicit(&(d)->stats.field, memory_order_relaxed) +      \
				      (uint64_t)(n),                                               \
			      memory_order_relaxed)

/* One guest RX buffer handed to a producer (struct dev_rx_src): one packet goes in it. */
struct dev_rx_buf {
	uint16_t head;
	const struct iovec *iov;  /* the whole chain (header first), borrowed guest memory */
	unsigned iovcnt;
	size_t room;              /* payload bytes it takes (<= max_pkt) */
	struct vsock_hdr h;       /* set by the producer's fill for each buffer it used */
};

/*
 * A producer of RX packets: the engine (device.c), the sibling inbox (sibling.c) and the host
 * bytes read in place (host_uds.c). rx_fill (device.c) is their one consumer, in the shape of
 * libuv's alloc_cb/read_cb: it asks pending, pops as many guest buffers as that needs (up to
 * max_bufs; rx_fill pops, counts, publishes and interrupts), and hands them to fill. Device
 * thread.
 * - pending: payload bytes ready now (at least 1 when a packet is, whatever its size), 0 for
 *   none. What the producer must check or reserve to send them (credit, pacing) it does here,
 *   once: nothing feeds the engine before the fill that follows.
 * - fill: puts one packet into each of b[0..nb), in order, from the start of b[0] (the payload
 *   after the header; the header in b[i].h). Returns how many it filled (0: nothing came).
 * - park: the RX ring has no buffer (or does not run: stopped): stop making work until the
 *   next fill (NULL: nothing to do).
 */
struct dev_rx_src {
	size_t (*pending)(struct vsock_dev *d);
	unsigned (*fill)(struct vsock_dev *d, struct dev_rx_buf *b, unsigned nb);
	void (*park)(struct vsock_dev *d, bool stopped);
	unsigned max_bufs;
};
extern const struct dev_rx_src dev_host_rx; /* host_uds.c */
extern const struct dev_rx_src dev_sib_rx;  /* sibling.c */

/* One of the two rings (0 rx, 1 tx). */
struct dev_queue {
	struct vsock_dev *dev;
	unsigned idx;                  /* 0 rx, 1 tx */
	struct vring_dev_queue q;
	bool running;
	unsigned num;
	int kick_fd, call_fd;          /* borrowed from the vhost-user back-end */
	struct loop_watch *kick_w;
	uint16_t start_avail;          /* next avail index at the start (dev_mem_check_kick) */
};

/*
 * A device. The core (device.c) owns what is declared here: the rings, the engine, the settle
 * loop, calls handed over from other threads, construction; device thread only unless a field
 * says otherwise. Every other part lives in its owner's struct, declared next to its code:
 * d->host (host_uds.h), d->dgram (host_dgram.h), d->sib (sibling.h), d->embed (embed.h).
 */
struct vsock_dev {
	/* identity and limits: constant after vsock_dev_new (any thread may read them) */
	char name[32];
	uint32_t cid;
	char uds_path[108];
	uint32_t buf_alloc, queue_size_max, max_conns;
	bool ok_guest_port;            /* vsock_dev_config.ok_guest_port */
	struct vsock_router *router;
	struct vsock_dev *router_next; /* under router->lock */
	struct loop *loop;
	/* the data-path switches of src/util/tune.h, read at creation (constant) */
	bool zerocopy;                 /* STREAM host I/O straight from/into guest buffers */
	bool tx_batch;                 /* off: one TX chain per batch, one interrupt each */
	uint32_t max_pkt;              /* largest payload put in one RX buffer (pkt64k: 64 KiB) */

	/* the rings (device thread) */
	struct dev_queue rxq, txq;
	struct dev_queue evq;          /* queue 2, when the front-end hands it over (evq.c) */
	bool evq_reset_pending;        /* a TRANSPORT_RESET waits for an event buffer (evq.h) */
	/* guest memory the rings use: the vhost-user back-end's map (borrowed) or, for the device
	 * API, mem_owned (uvsock_dev_set_mem_table) */
	const struct guest_mem *mem;
	struct guest_mem *mem_owned;
	uint64_t features;
	atomic_bool broken; /* ring error: no processing until the rings restart; relaxed */
	atomic_bool vmm_connected; /* a VMM is connected (dev_set_vmm_state); relaxed */
	/* this VMM session's check that guest memory is shared (dev_mem_check_kick): done once a
	 * ring moved or the warning was given; kicks seen while no ring had moved */
	bool mem_checked;
	unsigned mem_idle_kicks;
	/* TX batch storage (allocated once) */
	struct iovec (*tx_iov)[DEV_TX_IOV_MAX];
	struct vsock_pkt_ref *tx_refs;
	uint16_t *tx_heads;
	/* RX: chains of a gathered fill (once), and the engine's share against the sibling inbox */
	struct iovec (*rx_gather_iov)[DEV_RX_IOV_MAX];
	unsigned rx_eng_run;           /* engine RX buffers since the last sibling one, at most
					* DEV_RX_ENG_SHARE (rx_fill) */

	/* engine: exists while the device runs (TX ring started since the last reset); eng is
	 * written under eng_lock (readers on other threads: status, listing) */
	pthread_mutex_t eng_lock;
	struct vsock_engine *eng;
	/* counters of the engines of ended sessions (socks_open left 0, socks_total without our
	 * listeners), under eng_lock: operators' counters do not restart with each VMM session */
	struct vsock_engine_stats eng_past;
	struct vsock_sock *lst[2];     /* deferred wildcard listeners: STREAM, SEQPACKET */
	bool accept_pending;           /* a listener has children to confirm */

	/* the settle loop: timers and the work a pass left over */
	struct loop_timer *eng_timer;
	struct loop_timer *cont_timer; /* zero-delay continuation when a pass hit its budget */
	bool rx_more, tx_more;         /* work left over for the continuation */
	bool tx_throttled;             /* stopped draining TX: !can_feed or sibling full */

	/* calls handed to the device thread (dev_call): the thread that runs the loop, and the
	 * call waiting for it, under call_lock */
	pthread_t thread;
	atomic_bool thread_running;    /* vsock_dev_run() runs on `thread` (release/acquire) */
	pthread_mutex_t call_lock;
	pthread_cond_t call_cond;
	struct dev_call *call;
	struct loop_async *call_async;

	/* for readers on other threads: single-writer counters (relaxed), the tap (own lock) */
	struct dev_counters stats;
	struct ops_tap tap;            /* packet capture: every packet each way, once */

	/* the parts, each owned by one file */
	struct dev_host host;          /* host_uds.c: host sockets (device thread) */
	struct dev_dgram dgram;        /* host_dgram.c: datagrams (device thread) */
	struct dev_sib sib;            /* sibling.c: links to siblings (device thread; the port
					* under its own lock) */
	struct dev_embed embed;        /* embed.c: who runs the device */

	/* state save and restore (vsock_dev_freeze, vsock_dev_hand_over): device thread */
	bool frozen;                   /* no host fd watched, no timer: nothing changes */
	bool handed_over;              /* the socket files are another device's: never unlinked */

	/* crash survival (vhu.h dev_set_conns_hook): device thread */
	void (*conns_hook)(void *arg); /* the set of connections changed since conns_seen */
	void *conns_hook_arg;
	uint64_t conns_seen;
	/* The session is held across a TX stop (dev_session_hold, vhu_state.c): the device is frozen
	 * with its connections instead of dropping them, until TX starts again, the state goes to
	 * another device, or the VMM leaves. */
	bool held;
	/* Connections a loaded state named that this device does not have (dev_end_moved_conns):
	 * they end one way, decided once (moved_decide, while moved_wait) when the event queue
	 * runs or the guest does. moved_old: TX chains that were available when they were named (the guest wrote
	 * them before the move), popped before its first new one. */
	bool moved_wait;
	struct vsock_conn_addr *moved;
	size_t nmoved;
	unsigned moved_old;
};



/*
 * A socket fd named by a record (rec_get_fd's), checked to be an AF_UNIX socket of `type`,
 * listening or not as asked, and duplicated (close-on-exec, non-blocking) into *ret.
 * Returns 0, or -EBADMSG with the reason in r's document, or -errno of the duplication.
 */
struct rec_reader;
int dev_rec_sock_fd(struct rec_reader *r, int fd, int type, bool listening, int *ret);

/* counters.c */
/*
 * acc += s for every counter of an ended engine, except the gauge socks_open; socks_total without
 * the device's own listeners.
 */
void dev_counters_eng_accumulate(struct vsock_engine_stats *acc, const struct vsock_engine_stats *s,
			      unsigned listeners);

/* device.c */
/* Ring error: nothing is processed until the rings restart. Device thread (other threads load
 * it too, relaxed: a status flag, nothing is published with it). */
static inline bool dev_broken(struct vsock_dev *d)
{
	return atomic_load_explicit(&d->broken, memory_order_relaxed);
}
/* Runs what the last event or call made possible (RX, TX, host connections, timers). */
void dev_settle(struct vsock_dev *d);
/*
 * The device API's entry points (embed.c calls them on the device thread; the vhost-user
 * callbacks reach them through the API). dev_queue_start: cfg->mem must stay valid until the
 * queue stops; kick_fd and call_fd are borrowed. Returns 0, -EINVAL, -EBUSY (running), or the
 * errors of vring_dev_init, loop_watch_add and the engine.
 */
int dev_queue_start(struct vsock_dev *d, unsigned qidx, const struct vring_dev_config *cfg,
		    int kick_fd, int call_fd);
/* Stops a queue (no-op if stopped); returns the next avail index it would process. */
uint16_t dev_queue_stop(struct vsock_dev *d, unsigned qidx);
void dev_set_call_fd(struct vsock_dev *d, unsigned qidx, int call_fd);
/* Guest driver reset: both queues stopped, every connection dropped, broken cleared. */
void dev_reset(struct vsock_dev *d);
/*
 * The VMM's transport reset (uvsock_dev_transport_reset): every connection dropped, a
 * TRANSPORT_RESET posted (evq.h), a new session begun at once if TX runs. Returns 0 or the
 * engine's error.
 */
int dev_transport_reset(struct vsock_dev *d);
/* A call run on the device thread (embed.c). */
struct dev_call {
	int (*fn)(struct vsock_dev *d, void *arg);
	void *arg;
	int rc;
	bool done;
};
/* Runs fn on the device thread (directly if that is us or no thread runs) and returns its rc. */
int dev_call(struct vsock_dev *d, int (*fn)(struct vsock_dev *d, void *arg), void *arg);

/*
 * Everything the parts below the core (host_uds.c, host_dgram.c, sibling.c) call back up into
 * it, in one table (device.c): calls go down from the core to the parts, and only these come
 * back. Device thread, except call (any thread).
 */
struct dev_up {
	/* an event of the part (a loop callback of its own) ran: dev_settle */
	void (*settle)(struct vsock_dev *d);
	/* a sibling's inbox has room again: drain the TX ring (one pass, within DEV_PASS_PKTS /
	 * DEV_PASS_BYTES) */
	void (*tx_drain)(struct vsock_dev *d);
	/* dev_call */
	int (*call)(struct vsock_dev *d, int (*fn)(struct vsock_dev *d, void *arg), void *arg);
	/* listening on path failed: logged (-EADDRINUSE: another process serves it) */
	void (*listen_error)(const struct vsock_dev *d, const char *path, int err);
};
extern const struct dev_up dev_up;
#endif
