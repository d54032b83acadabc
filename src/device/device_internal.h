/* SPDX-License-Identifier: MIT */
/*
 * Private state of a device, shared by the files of src/device: device.c (the core: rings, engine,
 * settle, construction), sibling.c (the sibling port), host_uds.c (host sockets), embed.c (the
 * device API), counters.c (readers). The vhost-user glue (vhu.c) does not see it (vhu.h).
 * Everything here is owned by the device's thread except the sibling port (its own lock and
 * reference count, shared with the linked devices) and the counters (single writer, read with
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

#include "device/device.h"
#include "device/evq.h"
#include "device/uds_connect.h"
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
 * Zero-copy host reads (host_rx_read): one readv fills up to DEV_RX_GATHER guest RX buffers
 * (each one packet) with at most DEV_RX_GATHER_BYTES, so a guest posting small buffers (Linux:
 * 4 KiB) costs one read per 64 KiB, not one per buffer.
 */
#define DEV_RX_GATHER 16u
#define DEV_RX_GATHER_BYTES (64u * 1024)
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
/* Sibling hand-off queue per target device. */
#define DEV_INBOX_PKTS 512u
#define DEV_INBOX_BYTES (4u * 1024 * 1024)
/* Longest our guest's packets for a sibling whose inbox is full are held (sib_hold) without the
 * sibling making room; then they are dropped and the target is "congested": what is sent to it
 * is dropped at once until it drains to half. */
#define DEV_SIB_STALL_NS (1000ull * 1000000ull)
/* Packets and payload bytes held per sending device, over all its full siblings. */
#define DEV_SIB_HOLD_PKTS 256u
#define DEV_SIB_HOLD_BYTES (1u << 20)
/* Host side: the CONNECT line and the guest's answer must both come within this. */
#define DEV_HOST_CONNECT_TIMEOUT_NS (2ull * 1000000000ull)
/* Host-initiated connections get local ports in [2^30, 2^31), as Firecracker. */
#define DEV_HOST_PORT_LO (1u << 30)
#define DEV_HOST_PORT_HI ((1u << 31) - 1)

/*
 * Datagrams (host_dgram.c, docs/uvsockd.md "Datagrams"): the largest payload (64 KiB - the
 * header, the design's VSOCK_DGRAM_MAX), host senders remembered for replies (bounded, LRU), the
 * host port of datagrams from an unbound host sender (replies to it are dropped), and the host
 * datagrams read per wakeup of the per-VM socket.
 */
#define DEV_DGRAM_MAX (65536u - VSOCK_HDR_SIZE)
#define DEV_DGRAM_PEERS 256u
#define DEV_DGRAM_UNBOUND_PORT DEV_HOST_PORT_HI
#define DEV_DGRAM_READ_BATCH 64u
/* Host datagrams taken by one recvmmsg (each into its own buffer of dev->dgram_rlen bytes). */
#define DEV_DGRAM_MMSG 8u
/*
 * Host destinations <uds_path>_<port>.dgram with a socket connected to them (host_dgram.c), how
 * often the path is checked again for a socket bound there anew while the old one lives, and
 * the SO_SNDBUF of those sockets.
 */
#define DEV_DGRAM_DESTS 8u
#define DEV_DGRAM_RECHECK_MS 50u
/* What a host program connected back to one may have queued (twice this, kernel accounting). */
#define DEV_DGRAM_SNDBUF (512 * 1024)

struct dgram_dest {
	bool live;          /* sfd is open and watched */
	uint32_t port;
	int sfd;            /* connected to the socket file; autobound abstract name, replies read */
	struct loop_watch *w;
	dev_t dev;          /* the socket file it was connected to: a replaced file is connected */
	ino_t ino;          /* to again */
	uint64_t checked_ms; /* mono_ms() of the last check of the path */
	uint64_t used;      /* dev->dgram_tick (LRU) */
};

/* A host datagram sender not bound at <uds_path>_<port>.dgram, and the host port it got. */
struct dgram_peer {
	struct sockaddr_un sa;
	socklen_t salen;
	uint32_t port;
	uint64_t used; /* dev->dgram_tick when last seen or replied to (LRU) */
};

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

/* A guest packet on its way to a sibling (header in host order, payload copied). */
struct sib_pkt {
	struct vsock_hdr hdr;
	uint32_t off; /* payload bytes already delivered (RX splitting) */
	bool made;    /* an RST a device made (sib_queue_rst), not a guest's packet */
	struct sib_pkt *next; /* in a struct sib_hold */
	uint8_t data[];
};

/*
 * The sender's side of one sibling link: our guest's packets for that sibling, in order, while
 * its inbox is full (sibling.c). Owned by the sending device's thread.
 */
struct sib_hold {
	struct sib_pkt *head, *tail;
	uint64_t deadline; /* mono_ns(): dropped unless the sibling makes room by then */
};

/* Bounded multi-producer queue of packets for one device. Protected by lock. */
struct sib_inbox {
	pthread_mutex_t lock;
	struct sib_pkt *ring[DEV_INBOX_PKTS];
	unsigned head;
	atomic_uint count; /* written under lock; read without it as a hint (relaxed) */
	size_t bytes;
	bool want_room; /* a sender found it full and waits for room_async */
	bool congested; /* a sender waited DEV_SIB_STALL_NS in vain: drop while full */
};

/*
 * A device's end of its sibling links: everything a linked device may touch from its own thread
 * (the inbox, the two wakeups of the owner's loop, CID and name for routing and logs). It is
 * reference-counted, one reference held by its device and one by every device linked to it, so
 * a sibling's pointer to it stays valid after its device is freed. vsock_dev_free closes it
 * under inbox.lock: from then on pushes fail (-EPIPE) and the wakeups are not used (they belong
 * to the freed device's loop), so holding inbox.lock and seeing !closed is what makes touching
 * inbox_async / room_async safe. Senders take that lock once per packet pushed (as before) and
 * once per target per TX batch for the wakeup; nothing else on the data path locks.
 */
struct sib_port {
	struct sib_inbox inbox;
	atomic_uint refs;              /* the last sib_port_unref frees the port */
	uint32_t cid;                  /* constant */
	char name[32];                 /* constant (log name of the device) */
	atomic_bool closed;            /* written under inbox.lock; read without it as a hint */
	struct loop_async *inbox_async; /* the owner's: packets arrived (valid while !closed) */
	struct loop_async *room_async;  /* the owner's: a sibling's inbox has room again (same) */
	/* this device's guest packets dropped because the sibling holding them was freed (added by
	 * that sibling's vsock_dev_free; reported in sibling_dropped); relaxed */
	_Atomic uint64_t peer_dropped;
	struct sib_pool *pool;         /* our guest's sibling packet buffers (sibling.c) */
	/* our guest negotiated VIRTIO_VSOCK_F_DGRAM at its last queue start (a hint for senders:
	 * the owner checks again at delivery); relaxed */
	atomic_bool dgram;
};

enum hconn_state {
	HC_READ_CONNECT,   /* host-initiated: reading "CONNECT <port>\n" */
	HC_GUEST_CONNECT,  /* host-initiated: REQUEST sent, waiting for the guest */
	HC_HOST_CONNECT,   /* guest-initiated: connect(<uds>_<port>) in progress */
	HC_OPEN,           /* data flows */
};

/* One host Unix socket paired with one engine socket. */
struct hconn {
	struct vsock_dev *dev;
	struct hconn *prev, *next;   /* dev->conns */
	struct hconn *next_dirty;    /* dev->dirty while dirty */
	bool dirty;
	enum hconn_state state;
	bool seqpacket;
	int fd;
	struct loop_watch *w;
	struct vsock_sock *s;         /* NULL until created (host-initiated) */
	struct loop_timer *timer;     /* HC_READ_CONNECT / HC_GUEST_CONNECT deadline */
	struct uds_connect_reader rd;
	uint32_t local_port;          /* our port (host side) */
	bool host_rd_eof;             /* read 0 from the host: SHUTDOWN(SEND) sent to the guest */
	bool host_wr_shut;            /* shutdown(SHUT_WR) done on the host socket */
	bool host_wr_blocked;         /* the host socket would block: EPOLLOUT wanted */
	bool guest_blocked;           /* no guest credit: EPOLLIN off until POLLOUT */
	bool host_hup;                /* epoll said EPOLLHUP/EPOLLERR: the host hung up */
	/* zero-copy host -> guest (host_rx_read): on dev->rd_head's list while the host socket
	 * has bytes (or EOF) for the guest's RX buffers */
	struct hconn *rd_next;
	bool rd_queued;
	bool rd_parked;               /* EPOLLIN off while queued: the RX ring has no buffers */
	/* guest per-packet overhead (h2g_budget.h): small packets and bytes of big ones sent and
	 * maybe still queued in the guest, each with the stream offset the guest must pass to
	 * have consumed them */
	uint32_t h2g_small, h2g_small_end, h2g_big_end;
	uint64_t h2g_big;
};

/* One guest RX buffer of a zero-copy host read: the chain, the room after its header. */
struct host_rx_piece {
	uint16_t head;
	const struct iovec *iov;  /* the whole chain (header first), borrowed guest memory */
	unsigned iovcnt;
	size_t room;              /* payload bytes it takes (<= max_pkt) */
	struct vsock_hdr h;       /* set by host_rx_read for the pieces it filled */
};

/* One of the two rings (0 rx, 1 tx). */
struct dev_queue {
	struct vsock_dev *dev;
	unsigned idx;                  /* 0 rx, 1 tx */
	struct vring_dev_queue q;
	bool running;
	unsigned num;
	int kick_fd, call_fd;          /* borrowed from the vhost-user back-end */
	struct loop_watch *kick_w;
};

struct vsock_dev {
	char name[32];
	uint32_t cid;
	char uds_path[108], uds_seq_path[108];
	uint32_t buf_alloc, queue_size_max, max_conns;
	bool ok_guest_port;            /* vsock_dev_config.ok_guest_port */
	struct vsock_router *router;
	struct loop *loop;

	struct dev_vhu *vhu;           /* the vhost-user glue (vhu.c), or NULL (device API) */
	struct dev_queue rxq, txq;
	struct dev_queue evq;          /* queue 2, when the front-end hands it over (evq.c) */
	bool evq_reset_pending;        /* a TRANSPORT_RESET waits for an event buffer (evq.h) */
	/* guest memory the rings use: the vhost-user back-end's map (borrowed) or, for the device
	 * API, mem_owned (uvsock_dev_set_mem_table) */
	const struct guest_mem *mem;
	struct guest_mem *mem_owned;
	uint64_t features;
	atomic_bool broken; /* ring error: no processing until the rings restart; relaxed */
	atomic_bool vmm_connected; /* a VMM is connected (dev_vhu_vmm_state); relaxed */

	/* engine: exists while the device runs (TX ring started since the last reset); eng is
	 * written under eng_lock (readers on other threads: status, listing) */
	pthread_mutex_t eng_lock;
	struct vsock_engine *eng;
	/* counters of the engines of ended sessions (socks_open left 0, socks_total without our
	 * listeners), under eng_lock: operators' counters do not restart with each VMM session */
	struct vsock_engine_stats eng_past;
	struct vsock_sock *lst[2];     /* deferred wildcard listeners: STREAM, SEQPACKET */
	bool accept_pending;           /* a listener has children to confirm */
	struct loop_timer *eng_timer;
	struct loop_timer *cont_timer; /* zero-delay continuation when a pass hit its budget */
	bool rx_more, tx_more;         /* work left over for the continuation */
	bool tx_throttled;             /* stopped draining TX: !can_feed or sibling full */

	/* host side */
	struct uds_listener uds_l, uds_seq_l; /* <uds_path>, <uds_path>_seqpacket */
	struct loop_watch *uds_w, *uds_seq_w;
	struct hconn *conns;
	struct hconn *dirty;
	unsigned n_conns;
	uint8_t *scratch;              /* bounce buffer: seqpacket messages, and host reads with
					* the zerocopy switch off */
	size_t scratch_len;
	/* the data-path switches of src/util/tune.h, read at creation (constant) */
	bool zerocopy;                 /* STREAM host I/O straight from/into guest buffers */
	bool tx_batch;                 /* off: one TX chain per batch, one interrupt each */
	uint32_t max_pkt;              /* largest payload put in one RX buffer (pkt64k: 64 KiB) */
	struct hconn *rd_head, *rd_tail; /* STREAM connections whose host bytes wait for RX */
	struct iovec (*rx_gather_iov)[DEV_RX_IOV_MAX]; /* chains of a gathered host read (once) */

	/* siblings: only their ports are touched (a linked device may be freed while we run) */
	struct sib_port *port;          /* ours: our inbox and wakeups */
	struct loop_async *inbox_async; /* packets arrived in our inbox */
	struct loop_async *room_async;  /* a sibling's inbox has room again */
	struct sib_port **sibs;         /* linked devices' ports (references), sorted by cid;
					 * fixed once the device runs; a closed one is a freed
					 * sibling: packets to it are dropped, answered with RST */
	unsigned n_sibs;
	struct sib_pkt *rx_cur;         /* taken from the inbox, partly delivered */
	struct loop_timer *stage_timer; /* the earliest DEV_SIB_STALL_NS deadline of hold[] */
	struct sib_hold *hold;          /* parallel to sibs: what waits for room in each */
	unsigned hold_pkts;             /* packets and payload bytes in hold[], bounded by */
	size_t hold_bytes;              /* DEV_SIB_HOLD_PKTS / DEV_SIB_HOLD_BYTES */
	unsigned rx_eng_run;            /* engine RX buffers since the last sibling one, at most
					 * DEV_RX_ENG_SHARE (rx_fill) */
	struct sib_port **wake;         /* targets to wake at the end of a TX batch */
	unsigned n_wake;

	/* TX batch storage (allocated once) */
	struct iovec (*tx_iov)[DEV_TX_IOV_MAX];
	struct vsock_pkt_ref *tx_refs;
	uint16_t *tx_heads;

	/* device API (embed.c): the device thread, and calls handed to it from other threads */
	pthread_t thread;
	atomic_bool thread_running;    /* vsock_dev_run() runs on `thread` (release/acquire) */
	bool api_thread;               /* embed.c started api_th (joined by uvsock_dev_free) */
	pthread_t api_th;
	pthread_mutex_t call_lock;
	pthread_cond_t call_cond;
	struct dev_call *call;         /* the call waiting for the device thread, under call_lock */
	struct loop_async *call_async;
	/* device API, UVSOCK_DEV_EXTERNAL_LOOP: no device thread; the VMM's loop thread runs the
	 * loop through uvsock_dev_process (embed.c) */
	bool api_ext_loop;
	const void *_Atomic api_owner; /* the loop thread's mark once it ran, or NULL */

	struct dev_counters stats;
	struct ops_tap tap;            /* packet capture: every packet each way, once */
	struct vsock_dev *router_next;

	/* host side against hostile host programs (host_uds.c, from host_open_listeners) */
	bool host_aux;                 /* host_reserve_fd, host_dir_fd, host_pause_timer are set */
	int host_reserve_fd;           /* /dev/null, given up to shed one connection at EMFILE */
	struct loop_timer *host_pause_timer; /* accepting paused (no fd left): resume then */
	unsigned n_handshakes;         /* host connections in HC_READ_CONNECT (capped) */
	int host_dir_fd;               /* O_PATH of uds_path's directory: <uds-path>_<port> */

	/* datagrams (host_dgram.c); device thread */
	bool dgram_off;                /* not offered (vsock_dev_config.no_dgram) */
	uint32_t dgram_max;            /* largest payload accepted either way */
	char dgram_path[108];          /* <uds_path>.dgram */
	struct uds_listener dgram_l;   /* bound there (fd -1: datagrams off) */
	struct loop_watch *dgram_w;
	struct dgram_peer *dgram_peers; /* DEV_DGRAM_PEERS entries, n_dgram_peers used */
	unsigned n_dgram_peers;
	uint32_t dgram_next_port;      /* next ephemeral host port to try */
	struct dgram_dest dgram_dests[DEV_DGRAM_DESTS];
	uint64_t dgram_tick;
	uint8_t *dgram_rbuf;           /* DEV_DGRAM_MMSG buffers of dgram_rlen bytes (recvmmsg) */
	size_t dgram_rlen;             /* dgram_max + the longest line + 1: more is oversize */
};



/* host_uds.c */
int host_open_listeners(struct vsock_dev *d);
void host_close_listeners(struct vsock_dev *d);
/* Closes every host connection (their engine sockets are released without sending). */
void host_close_all(struct vsock_dev *d);
/* Confirms or rejects the pending children of the wildcard listeners (guest-initiated). */
void host_accept_guest_conns(struct vsock_dev *d);
/* Services every connection whose engine socket changed state. */
void host_service_dirty(struct vsock_dev *d);
void host_mark_dirty(struct hconn *c);
/*
 * Zero-copy guest -> host (the engine's ops->deliver, engine.h): writes what the host socket of
 * the connection `user` takes of the guest's payload, straight from its TX buffer. Returns the
 * bytes taken; 0 when the connection cannot take bytes now (not open yet, blocked, shut down).
 * Called by the engine with that socket's lock held: touches only the connection.
 */
size_t host_deliver(struct vsock_dev *d, void *user, const struct iovec *iov, int iovcnt,
		    size_t len);
/*
 * Zero-copy host -> guest (device thread). host_rx_pending: the bytes the first connection of
 * the read list has for the guest now (what its host socket holds, capped by the guest's
 * credit; at least 1 if its engine packets must go first), 0 if none has any (those without
 * credit or input leave the list; EOF leaves its SHUTDOWN in the engine). host_rx_read: reads
 * that connection's bytes with one readv straight into the payload areas of the np buffers
 * (each at most its room, all together at most the credit) and fills the header of each buffer
 * it used, in order; returns how many it used (>= 1), or -EAGAIN if it read nothing (EOF and
 * errors leave a SHUTDOWN or RST in the engine instead). host_rx_park: the RX ring cannot take
 * more now: stop polling the waiting connections for input (a readable socket would make the
 * loop spin) until host_rx_read serves them.
 */
size_t host_rx_pending(struct vsock_dev *d);
int host_rx_read(struct vsock_dev *d, struct host_rx_piece *p, unsigned np);
void host_rx_park(struct vsock_dev *d);

/* counters.c */
/*
 * acc += s for every counter of an ended engine, except the gauge socks_open; socks_total without
 * the device's own listeners.
 */
void dev_eng_stats_accumulate(struct vsock_engine_stats *acc, const struct vsock_engine_stats *s,
			      unsigned listeners);

/* sibling.c */
enum dev_tx_verdict { DEV_TX_ENGINE, DEV_TX_SIBLING_SENT, DEV_TX_SIBLING_FULL, DEV_TX_DROP };
/* Creates d's port and the loop objects siblings wake it with. Returns 0, -ENOMEM. */
int dev_sib_init(struct vsock_dev *d);
/* The port of the sibling with that CID, or NULL (not linked). */
struct sib_port *dev_sib_lookup(struct vsock_dev *d, uint64_t cid);
/*
 * Copies a packet of our guest for sibling t and hands it over, holds it if t is full, or drops
 * it (an RST for a full t; anything for a congested, gone or over-full one; see sibling.c).
 * Returns DEV_TX_SIBLING_SENT (handed over or held), DEV_TX_SIBLING_FULL (held, and the hold
 * reached its bound: the TX ring waits) or DEV_TX_DROP.
 */
enum dev_tx_verdict dev_sib_send(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
				 const struct iovec *iov, unsigned n);
/* Hands held packets over to the siblings that have room now. Returns false while the hold is
 * at its bound (the TX ring waits for room). */
bool dev_sib_retry_staged(struct vsock_dev *d);
/* The packets held for full siblings reached DEV_SIB_HOLD_PKTS or DEV_SIB_HOLD_BYTES. */
bool dev_sib_hold_full(const struct vsock_dev *d);
/* Drops every held packet uncounted (the session ends) and stops their timer. */
void dev_sib_drop_staged(struct vsock_dev *d);
/* Wakes the siblings our last TX batch handed packets to. */
void dev_sib_wake_targets(struct vsock_dev *d);
/* Something of a sibling waits for our guest's RX ring. */
bool dev_sib_pending(struct vsock_dev *d);
ssize_t dev_sib_pull(struct vsock_dev *d, struct vsock_hdr *h, const struct iovec *piov,
		     unsigned pn, size_t room);
/*
 * Datagrams through the sibling port (host_dgram.c uses them). dev_sib_send_dgram: copies our
 * guest's datagram h for sibling t and hands it over, or drops it (full, gone: no hold, no RST).
 * dev_sib_queue_self: queues a datagram from the host (h, payload data) for our own guest's RX
 * ring. Both return 0, -ENOBUFS (full), -EPIPE (gone), -ENOMEM.
 */
int dev_sib_send_dgram(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
		       const struct iovec *iov, unsigned n);
int dev_sib_queue_self(struct vsock_dev *d, const struct vsock_hdr *h, const void *data);
/* Drops everything queued for our guest (RX not running), counted in sibling_dropped. */
void dev_sib_drop_all(struct vsock_dev *d);
/* vsock_dev_free's part: see sibling.c. */
void dev_sib_detach(struct vsock_dev *d);

/* host_dgram.c */
/* Binds <uds_path>.dgram (datagrams on; stale/live rules of uds_listen). Returns 0 or -errno. */
int host_dgram_open(struct vsock_dev *d, const struct vsock_dev_config *cfg);
/* Unbinds and removes <uds_path>.dgram (if still ours). Safe when never opened. */
void host_dgram_close(struct vsock_dev *d);
/* Our guest negotiated VIRTIO_VSOCK_F_DGRAM (and the device offers it). */
bool dev_dgram_negotiated(const struct vsock_dev *d);
/* The rings started with new features: tells senders whether our guest takes datagrams. */
void dev_dgram_features(struct vsock_dev *d);
/*
 * A DGRAM packet h (src_cid checked) from our guest's TX chain iov (n entries, header first;
 * the row has DEV_TX_IOV_MAX entries): sent to the host socket of its port, handed to a sibling,
 * or dropped and counted. Never an RST. Returns DEV_TX_SIBLING_SENT or DEV_TX_DROP.
 */
enum dev_tx_verdict dev_dgram_tx(struct vsock_dev *d, const struct vsock_hdr *h, struct iovec *iov,
				 unsigned n);
/*
 * The RX half (dev_sib_pull): a datagram p about to go into a guest RX buffer of room payload
 * bytes. Returns true if it goes in whole (counted), false if it is dropped (counted: not
 * negotiated, or larger than the buffer).
 */
bool dev_dgram_rx_ok(struct vsock_dev *d, const struct vsock_hdr *h, size_t room);

/* device.c */
/* Ring error: nothing is processed until the rings restart. Device thread (other threads load
 * it too, relaxed: a status flag, nothing is published with it). */
static inline bool dev_broken(struct vsock_dev *d)
{
	return atomic_load_explicit(&d->broken, memory_order_relaxed);
}
void dev_settle(struct vsock_dev *d);
/* Logs that listening on path failed (-EADDRINUSE: another process serves it). */
void dev_log_listen_error(const struct vsock_dev *d, const char *path, int err);
/* Drains the TX ring (one pass, within DEV_PASS_PKTS / DEV_PASS_BYTES). */
void dev_tx_drain(struct vsock_dev *d);
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
/* embed.c: devices of uvsock_dev_new alive, i.e. references on their shared router (0: the
 * router is freed). For tests. Any thread. */
unsigned dev_api_router_refs(void);

#endif
