/* SPDX-License-Identifier: MIT */
/*
 * The device role: what Linux vhost-vsock does, in userspace, for one VM. A struct vsock_dev
 * owns one event loop, the TX and RX virtqueues (src/vring), one protocol engine with local
 * CID 2 (src/vsock), and the host side: Unix sockets in the Firecracker "hybrid vsock"
 * convention (host_uds.c). Its rings come from a transport: a VMM's own (the public API,
 * <uvsock/device.h>, embed.c) or vhost-user (the glue attached to it, vhu.h), as in uvsockd.
 * Several devices in one process may route guest-to-guest packets to each other ("siblings",
 * as vhost-device-vsock's groups) once linked; a struct vsock_router holds the devices that may
 * be linked.
 *
 * Threads: vsock_dev_run() runs the device's loop on the calling thread, which then owns
 * everything of that device; vsock_dev_stop() may be called from any thread (and from a signal
 * handler). Sibling packets cross threads through bounded per-device hand-off queues, each with
 * an eventfd wakeup; nothing else is shared. A device may be freed while its siblings run: the
 * queue and wakeup they reach it by outlive it (reference-counted) and tell them it is gone.
 *
 * Security model: the VMM and the guest are untrusted. Ring errors mark the device broken (logged,
 * rate-limited) until the VMM restarts the rings or reconnects; malformed or spoofed packets are
 * dropped and counted; every guest-driven resource (connections, queued replies, buffered bytes,
 * sibling hand-off) has a bound. Host programs are untrusted too: a bad CONNECT line closes their
 * socket.
 */
#ifndef UVSOCK_DEVICE_VSOCK_DEV_H
#define UVSOCK_DEVICE_VSOCK_DEV_H

#include <stdbool.h>
#include <stdint.h>

#include "vsock/engine.h"

struct vsock_dev;
struct vsock_router;

struct vsock_dev_config {
	uint32_t guest_cid;       /* 3 .. 0xfffffffe */
	const char *uds_path;     /* host side (we listen on it, connect to it + "_<port>"); copied */
	uint32_t buf_alloc;       /* receive buffer we advertise per connection */
	uint32_t queue_size_max;  /* largest ring size accepted from the VMM */
	uint32_t max_conns;       /* host-side connections per VM (0: 1024) */
	bool ok_guest_port;       /* answer a host CONNECT with "OK <guest port>" (as
				   * vhost-device-vsock), not "OK <host-side port>" */
	const char *name;         /* for logs ("vm3"); copied; NULL: "cid<N>" */
	bool no_dgram;            /* do not offer VIRTIO_VSOCK_F_DGRAM, no <uds_path>.dgram */
	uint32_t dgram_max;       /* largest datagram payload (0 or over: DEV_DGRAM_MAX, 65492) */
	bool restore;             /* made to restore a saved device into (vsock_dev_restore):
				   * nothing is bound (the listeners come from the record), and
				   * the device is frozen until vsock_dev_thaw */
};

/*
 * Creates the router that lets devices reach each other (one per process).
 * Returns 0 or -ENOMEM.
 */
int vsock_router_new(struct vsock_router **ret);
/* Frees the router; every device attached to it must be freed first. Safe on NULL. */
void vsock_router_free(struct vsock_router *r);

/*
 * Creates a device: binds and listens on uds_path and uds_path + "_seqpacket" (stale socket
 * files there are replaced; other files are an error), and attaches it to r (may be NULL: no
 * siblings). It has no transport yet: the program drives it with the core's entry points (the
 * device-role unit tests) or attaches the vhost-user glue to it (dev_vhu_new, vhu.h); a VMM and
 * uvsockd make theirs with uvsock_dev_new instead (embed.c), which calls this. Context: any
 * thread, also while other devices of r run.
 * Returns 0, -EINVAL (bad config, path too long), -ENOMEM, or the errno of socket/bind/listen.
 */
int vsock_dev_new(struct vsock_router *r, const struct vsock_dev_config *cfg,
		  struct vsock_dev **ret);

struct uvsock_dev;

/*
 * The core of a device made by the public API's uvsock_dev_new (<uvsock/device.h>; embed.c),
 * for what a program of the project needs beyond that API. uvsockd (daemon/vms.c) creates each
 * VM with uvsock_dev_new and links groups with uvsock_dev_link, then through this attaches the
 * vhost-user glue (dev_vhu_new), runs the device on a thread of its own (vsock_dev_run and
 * vsock_dev_stop, not uvsock_dev_start: its thread's name, and a failed loop stops the daemon)
 * and reads what operators see (vsock_dev_tap, vsock_dev_foreach_sock,
 * vsock_dev_get_ops_stats). The device stays the API's: uvsock_dev_free frees it (after the
 * program's thread is joined). Pure; any thread.
 */
struct vsock_dev *vsock_dev_of(struct uvsock_dev *u);

/*
 * Allows a and b to route packets to each other (they share a group). Both directions.
 * Context: any thread; a device that runs is changed on its own thread (the call waits for it).
 * Either may later be freed while the other runs (see vsock_dev_free); a device of the same CID
 * linked afterwards replaces the freed one. Returns 0, -EINVAL (same device, different routers,
 * same CID, or a live sibling of b's CID), -ENOMEM.
 */
int vsock_dev_link_sibling(struct vsock_dev *a, struct vsock_dev *b);

/*
 * Runs the device on the calling thread until vsock_dev_stop() (with the vhost-user glue
 * attached: one VMM at a time, every connection of the VM reset when it leaves).
 * Returns 0 or a -errno if the event loop failed.
 */
int vsock_dev_run(struct vsock_dev *d);

/* Makes vsock_dev_run() return. Any thread, async-signal-safe. */
void vsock_dev_stop(struct vsock_dev *d);

/*
 * Closes everything, removes the socket files it created. The device must not be running; its
 * siblings may be, on other threads, and go on: packets they had queued for it are dropped
 * (counted in each sender's sibling_dropped and answered with an RST from its CID), a sibling
 * waiting for room in its queue is released at once, and packets they send its CID later are
 * dropped and answered the same way. Packets it had queued for them stay valid (copies).
 * Safe on NULL.
 */
void vsock_dev_free(struct vsock_dev *d);

/*
 * Device counters (monotonic), listed once: X(field) for each, in order. The device keeps them
 * as C11 atomics (single writer, the device thread); vsock_dev_get_stats copies them field by
 * field into this plain struct. Read from any thread.
 */
#define VSOCK_DEV_STATS(X)                                                                         \
	X(tx_pkts)               /* guest TX packets accepted (to host or sibling) */              \
	X(tx_bytes)              /* their payload bytes */                                         \
	X(rx_pkts)               /* packets put in guest RX buffers */                             \
	X(rx_bytes)              /* their payload bytes */                                         \
	X(zc_tx_bytes)           /* guest bytes sent to host sockets straight from TX buffers */   \
	X(zc_rx_bytes)           /* host bytes read straight into guest RX buffers */              \
	X(tx_bad_chain)          /* TX chain dropped: short, writable, len mismatch, big */        \
	X(tx_bad_src_cid)        /* TX packet whose src_cid is not the VM's CID */                 \
	X(tx_bad_dst_cid)        /* TX packet to a CID that is neither 2 nor a sibling */          \
	X(sibling_fwd_pkts)      /* packets handed to a sibling VM */                              \
	X(sibling_dropped)       /* sibling packets dropped: target not running, congested, or  \
				  * freed (then also those it held) */                             \
	X(ring_errors)           /* times the device was marked broken */                          \
	X(interrupts)            /* call eventfd writes */                                         \
	X(host_conns_accepted)   /* host programs that connected to uds-path */                    \
	X(host_connect_bad_line) /* CONNECT lines rejected (garbage, overlong, early close) */     \
	X(host_connect_timeouts) /* CONNECT line or guest answer not within 2 s */                 \
	X(guest_conns_refused)   /* guest connects with no host listener: RST */                   \
	X(vmm_connects)          /* VMM sessions */                                                \
	X(guest_mem_unshared)    /* VMM sessions whose guest kicked while no ring's avail index    \
				  * ever moved in our mapping: memory not shared (share=off) */    \
	X(transport_resets)      /* TRANSPORT_RESET events posted on the event queue (evq.c) */    \
	X(host_conns_refused)    /* host connections closed at once: the VM's host fd budget       \
				  * (max_conns) was full */                                        \
	X(host_accept_shed)      /* host connections closed at once: the process was out of fds */ \
	X(host_handshakes_refused) /* host connections closed: no CONNECT line yet, the oldest     \
				    * pending when the cap (half the budget) was reached */        \
	X(host_handshake_timeouts) /* CONNECT line not complete within 2 s (these are also in      \
				    * host_connect_timeouts) */                                    \
	X(guest_conns_symlink)   /* guest connects refused (RST): <uds-path>_<port> is a symlink   \
				  * (also in guest_conns_refused) */                                \
	X(sibling_replies_dropped) /* RSTs dropped, the inbox they were for full: our guest's      \
				    * to a sibling, those the device made for our guest */\
	X(guest_conns_denied)    /* guest connects refused (RST): connecting to <uds-path>_<port>  \
				  * failed with EACCES/EPERM (also in guest_conns_refused) */      \
	X(host_conns_no_guest)   /* host connections closed at once: no VMM attached or the guest  \
				  * driver not running */                                          \
	X(host_conns_guest_refused) /* host CONNECTs the guest answered with RST (nobody listens   \
				     * on that guest port) */                                      \
	X(dgram_tx)              /* guest datagrams sent on (to a host socket or a sibling) */     \
	X(dgram_tx_bytes)        /* their payload bytes */                                         \
	X(dgram_rx)              /* datagrams put in guest RX buffers (host or sibling) */         \
	X(dgram_rx_bytes)        /* their payload bytes */                                         \
	X(dgram_drop_no_listener) /* datagrams dropped: nothing bound at the destination */       \
	X(dgram_drop_full)       /* datagrams dropped: the receiving queue (host socket, sibling   \
				  * or our RX inbox) was full */                                   \
	X(dgram_drop_oversize)   /* datagrams dropped: over the maximum or the RX buffer */        \
	X(dgram_drop_not_negotiated) /* datagrams dropped: DGRAM not negotiated by this guest, or  \
				      * by the sibling it was for */                               \
	X(dgram_drop_malformed)  /* datagrams dropped: an op other than RW, a bad host line */   \
	X(sibling_requests_paced) /* REQUESTs to a sibling beyond our guest's budget of REQUESTs   \
				   * that sibling did not accept: the TX ring waited (sibling.c) */

struct vsock_dev_stats {
#define VSOCK_DEV_STATS_FIELD_(f) uint64_t f;
	VSOCK_DEV_STATS(VSOCK_DEV_STATS_FIELD_)
#undef VSOCK_DEV_STATS_FIELD_
	/* The device loop's own counters (util/loop.c loop_get_stats, --busy-poll-us). */
	uint64_t busy_poll_ns;    /* CPU time the device thread spent busy polling */
	uint64_t busy_poll_found; /* busy polls that ended with work */
};
void vsock_dev_get_stats(struct vsock_dev *d, struct vsock_dev_stats *ret);

uint32_t vsock_dev_guest_cid(const struct vsock_dev *d);
/* The uds-path and the log name the device was created with (valid until vsock_dev_free). */
const char *vsock_dev_uds_path(const struct vsock_dev *d);
const char *vsock_dev_name(const struct vsock_dev *d);

struct ops_tap;
/*
 * The device's packet-capture tap (src/ops/pcap.h): every packet put into the guest's RX ring and
 * every guest TX packet accepted for the host or a sibling passes through it once, control
 * packets and the engine's no-socket RSTs included (dropped TX packets do not). Lives as long as
 * the device. Context: attach/detach from any thread (the tap has its own lock).
 */
struct ops_tap *vsock_dev_tap(struct vsock_dev *d);

/* State for operators (uvsock-stat through the control socket). */
struct vsock_dev_status {
	bool vmm_connected;              /* a VMM is connected on the vhost-user socket */
	bool broken;                     /* rings marked broken until restarted */
	bool have_engine;                /* eng and listeners are valid (rings started) */
	unsigned listeners;              /* sockets of the engine that are our own listeners */
	struct vsock_engine_stats eng;   /* the current engine's own counters (have_engine) */
	/* Summed over every VMM session of the device's life (the engine is new each session):
	 * the ended engines' counters plus the current one's; socks_open is the current gauge and
	 * socks_total counts the current engine's `listeners` but no earlier session's. */
	struct vsock_engine_stats eng_total;
};

/*
 * Fills *ret. Context: any thread; takes the device's engine lock briefly (never held on the
 * data path, only while the engine is created or freed).
 */
void vsock_dev_get_status(struct vsock_dev *d, struct vsock_dev_status *ret);

/*
 * Calls fn for every socket of the device's engine (connections, pending ones and the device's
 * own listeners), if it has one. fn must not call into the engine or the device. Context: any
 * thread; holds the engine lock for the walk.
 */
void vsock_dev_foreach_sock(struct vsock_dev *d,
			    void (*fn)(void *arg, const struct vsock_sock_info *info), void *arg);

struct ops_vm_counters;
struct ops_vm_stats;

/*
 * The operators' counters (src/ops/stats.h) from what the device and its engine count: packets,
 * bytes, ring errors, spoofed/no-route/malformed drops and refused connects from d; RSTs, credit
 * stalls, header drops by reason (op, type, oversize, the rest as malformed) and connections
 * from e. e may be NULL (no engine: no VMM connected); `listeners` is how many of e's sockets
 * are listeners of the device itself, not connections (subtracted from socks_open/socks_total).
 * The one place this mapping is made (uvsockd's control socket and uvsock_dev_get_stats both
 * use it). Pure; ret is fully overwritten.
 */
void vsock_dev_counters_from(struct ops_vm_counters *ret, const struct vsock_dev_stats *d,
			     const struct vsock_engine_stats *e, unsigned listeners);

/*
 * Fills *ret (zeroed first) for uvsock-stat: CID, name, state, the current engine's counters and
 * the operators' counters (vsock_dev_counters_from over vsock_dev_get_stats and the engines of
 * every VMM session, vsock_dev_get_status). Context: any thread (as vsock_dev_get_status).
 */
void vsock_dev_get_ops_stats(struct vsock_dev *d, struct ops_vm_stats *ret);

/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

struct rec_writer;
struct rec_doc;

/* The device record (REC_KIND_DEVICE): the versions this binary writes and reads. */
#define VSOCK_DEV_SAVE_VERSION 1u

/*
 * Freezes d: no host fd is watched and no timer runs (the device's, its connections', the
 * engine's), so nothing of d changes until vsock_dev_thaw; host programs' bytes and connects
 * wait in the kernel. The rings must be stopped (the caller's consistent point). Device thread
 * (or no thread runs d).
 */
void vsock_dev_freeze(struct vsock_dev *d);
/* Watches and timers as the state asks, every connection serviced once. Returns 0 or -errno. */
int vsock_dev_thaw(struct vsock_dev *d);
/*
 * Writes the whole state of frozen d into w (a record of kind REC_KIND_DEVICE, version
 * VSOCK_DEV_SAVE_VERSION): features, the pending TRANSPORT_RESET, the engine (vsock/save.c),
 * the host side (host_uds.c), datagrams (host_dgram.c), counters. The rings' own state is the
 * front-end's (it restarts them at the index uvsock_dev_queue_stop gave). Returns 0,
 * -EBUSY (not frozen, or a ring runs), or the writer's error. A device linked to siblings is
 * saved with its sibling part (the inbox, what its guest holds for them, its REQUEST budget):
 * every device of its group must be frozen (sibling.c, dev_sib_save).
 */
int vsock_dev_save(struct vsock_dev *d, struct rec_writer *w);
/*
 * Restores the record opened in doc into d, made with vsock_dev_config.restore for the same
 * CID. Everything is checked before d takes it; on error d is as it was (frozen, empty) and
 * rec_error(doc) says why. fds are duplicated. d stays frozen: vsock_dev_thaw. Returns 0,
 * -EBADMSG, -E2BIG, -EMFILE, -ENOMEM.
 */
int vsock_dev_restore(struct vsock_dev *d, struct rec_doc *doc);
struct rec_reader;
/* The same from the list r reads (the device's part nested in a larger record: uvsockd's VM). */
int vsock_dev_restore_at(struct vsock_dev *d, struct rec_reader *r);
/*
 * The state of d went to another device (a successful restore): its socket files are that
 * device's, so freeing d leaves them in place (given true), or d goes on after all (false).
 */
void vsock_dev_hand_over(struct vsock_dev *d, bool given);
bool vsock_dev_frozen(const struct vsock_dev *d);

#endif
