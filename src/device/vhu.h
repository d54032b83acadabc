/* SPDX-License-Identifier: MIT */
/*
 * The vhost-user glue of a device (vhu.c) and what it needs of the device core (device.c).
 *
 * The glue is a user of the public device API (<uvsock/device.h>) like any VMM: the back-end's
 * ring, feature, call-fd and reset callbacks become uvsock_dev_queue_start/_queue_stop/
 * _set_call_fd/_set_features/_reset on the device's handle (dev_api). It runs on the device's
 * thread (its sockets are watched by the device's loop), where the API calls run directly.
 * The services below are what a vhost-user back-end needs that the public API does not offer
 * (why, in each comment); each runs on the device thread.
 */
#ifndef UVSOCK_DEVICE_VHU_H
#define UVSOCK_DEVICE_VHU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dev_vhu;
struct guest_mem;
struct loop;
struct uvsock_dev;
struct vsock_dev;

/* ---- the glue (vhu.c), for the program that attaches it ------------------------------------- */

/*
 * Listens on the vhost-user socket at path (a stale socket file is replaced) on d's loop and
 * serves one VMM at a time with rings of at most queue_size_max entries (0: 1024); a VMM that
 * disconnects resets the device (uvsock_dev_reset) and the next one is accepted. A socket
 * adopted for path (util/uds.h: socket activation, uvsockd --fd) is used instead of binding: a
 * listener as above, a connected socket as the VMM's connection (once it ends, the VM stays
 * detached). The program attaches it right after creating the device (uvsockd, daemon/vms.c:
 * uvsock_dev_new, then this on vsock_dev_of(); the device-role tests: vsock_dev_new), before
 * the device runs, and frees it (dev_vhu_free) after the device stopped and before the device
 * is freed. A listening error is logged. A record kept across a crash for the device's CID
 * (vhu_keep.h, dev_vhu_adopt_offer) is adopted: its VMM's connection is served at once.
 * Returns 0, -ENOMEM, or the errno of listening (-EEXIST, -EADDRINUSE, ...).
 */
int dev_vhu_new(struct vsock_dev *d, const char *path, uint32_t queue_size_max,
		struct dev_vhu **ret);

/*
 * Drops the VMM connection (its rings are stopped through the API), closes the listening socket
 * and removes its file if it is still ours. The device is not running. Safe on NULL.
 */
void dev_vhu_free(struct dev_vhu *v);

/* ---- upgrade: the glue's part of uvsockd's VM record (docs/upgrade.md, "A VM of uvsockd") ---- */

struct rec_reader;
struct rec_writer;
struct uvsock_dev_config;

struct dev_vhu_saved {
	uint64_t stop_ns;  /* CLOCK_MONOTONIC (loop_now_ns) when the VM stopped serving */
	unsigned conns;    /* the engine's connections (its own listeners not counted) */
};

/*
 * On the device's thread (waits for it; the thread must run, or none does), at the consistent
 * point between two loop callbacks: stops watching the VMM connection and the listener, saves
 * the back-end (its rings stopped: their next avail indices), freezes the device and writes
 * the glue's items into the list w is in (its listener, flags, the back-end's part and the
 * device's part). fds are borrowed by w. On failure the VM serves again at once. Returns 0, or
 * -EOPNOTSUPP (linked to siblings), -EIO (the VMM connection failed) or the writer's error.
 */
int dev_vhu_save(struct dev_vhu *v, struct rec_writer *w, struct dev_vhu_saved *ret);
/* The hand-over failed: the saved VM serves again (rings restarted, watches back, one call). */
int dev_vhu_resume(struct dev_vhu *v);
/* The hand-over succeeded: v's socket files are the new process's (never removed here). */
void dev_vhu_given(struct dev_vhu *v);
/*
 * Builds the glue of d (a device made by dev_vhu_new_device_frozen) from the items r reads,
 * checking every one (the back-end's and the device's decoders included); nothing runs and
 * nothing is watched until dev_vhu_go. Returns 0 or -errno with rec_error() saying why.
 */
int dev_vhu_restore(struct vsock_dev *d, struct rec_reader *r, const char *path,
		    uint32_t queue_size_max, struct dev_vhu **ret);
/* Go: the restored back-end resumes (rings at their indices), the device thaws, watches. */
int dev_vhu_go(struct dev_vhu *v);
/* uvsock_dev_new's device, frozen and binding nothing, to restore a record into. */
int dev_vhu_new_device_frozen(const struct uvsock_dev_config *cfg, struct uvsock_dev **ret);

/* ---- services of the core (device.c), for the glue ------------------------------------------- */

/* The public handle of d (a struct vsock_dev is a struct uvsock_dev). */
struct uvsock_dev *dev_api(struct vsock_dev *d);

/* d's event loop, where the glue watches its sockets (the API has no way to add an fd). */
struct loop *dev_loop(struct vsock_dev *d);

/*
 * The rings started next use the back-end's own guest memory map, borrowed until
 * dev_drop_mem (uvsock_dev_set_mem_table would map the regions a second time), and the
 * features exactly as acked (transport bits included), as vring_dev_init takes them.
 */
void dev_borrow_mem(struct vsock_dev *d, const struct guest_mem *mem, uint64_t features);
/* A new memory table arrives; the back-end stopped every ring: no guest pointer is in use. */
void dev_drop_mem(struct vsock_dev *d);

/* A restored VMM connection: vmm_connected again, nothing counted (upgrade). */
void dev_vmm_restored(struct vsock_dev *d);
/* One write to each running ring's call eventfd (after an upgrade: no interrupt lost). */
void dev_signal_calls(struct vsock_dev *d);
/* A VMM connected (counted in vmm_connects) or disconnected: the operators' vmm_connected. */
void dev_set_vmm_state(struct vsock_dev *d, bool connected);

/*
 * After each vhost-user message: if the TX ring was stopped and not restarted within it (the
 * guest reset the device), drops every connection but leaves the RX ring to the back-end (the
 * API's uvsock_dev_reset would stop it too); then runs what the message made possible, as the
 * device thread does after each API call.
 */
void dev_message_done(struct vsock_dev *d);
/* The device offers VIRTIO_VSOCK_F_DGRAM (host_dgram.c: not made with no_dgram). */
bool dev_dgram_offered(const struct vsock_dev *d);

/*
 * Crash survival (vhu_keep.h): fn(arg) runs on the device thread after a pass in which the set
 * of the engine's connections changed (NULL: never).
 */
void dev_set_conns_hook(struct vsock_dev *d, void (*fn)(void *arg), void *arg);

/* ---- the guest's connections, for crash survival (vhu.c) and the state transfer ------------- */

struct rec_writer;
struct vsock_conn_addr;

/*
 * The addresses of the guest's open connections (vsock_engine_save_conns items) into the list w
 * is in. Returns 1 when a session runs (the engine exists), 0 when none does (nothing written),
 * or the writer's -errno (kept in w too).
 */
int dev_save_conns(struct vsock_dev *d, struct rec_writer *w);
/*
 * Queues an RST to the guest for each of n connections this device does not have
 * (vsock_engine_reset_conn; one the engine has now is skipped) as far as the engine's queue of
 * such RSTs has room (cfg.reply_limit; the rest are logged: their next packet ends them).
 * Returns how many were queued; they go out with the next RX pass. Never together with a
 * TRANSPORT_RESET for the same connections (dev_end_moved_conns says why).
 */
size_t dev_reset_conns(struct vsock_dev *d, const struct vsock_conn_addr *a, size_t n);
/*
 * A state loaded from another back-end (VHOST_USER_PROTOCOL_F_DEVICE_STATE) named n connections
 * of this guest that this device does not have (c is copied). Call once TX runs. They end one
 * way: a TRANSPORT_RESET where the event queue is the back-end's, else an RST each, decided when
 * that is known: the event queue starting, or the first TX chain the guest makes available
 * after this call (device.c, moved_decide, says why). Dropped with the session.
 */
void dev_end_moved_conns(struct vsock_dev *d, const struct vsock_conn_addr *c, size_t n);

/* ---- services of the core for the state transfer (vhu_state.c) ----------------------------- */

/*
 * Holding the session for a state save: with on, a TX stop keeps the connections (the device
 * freezes, dev_message_done) until TX starts again (at a new driver's index they end, at any
 * other they go on), dev_session_handed_over, or this with on false (the VMM left: the device
 * thaws for its reset).
 */
void dev_session_hold(struct vsock_dev *d, bool on);
/* A session is held: frozen, with its engine, rings stopped (what vsock_dev_save takes). */
bool dev_session_held(const struct vsock_dev *d);
/* The held session went to another device: its host sockets are closed here, unread. */
void dev_session_handed_over(struct vsock_dev *d);
/*
 * Restores the device record in doc (the saving device's, with its fds: vsock_dev_save) into d,
 * which has no session and keeps its own listeners and datagram socket (the record's are
 * closed). d is then held: frozen until TX starts. Returns 0, or -errno with rec_error(doc)
 * saying why and d as it was.
 */
struct rec_doc;
int dev_restore_moved(struct vsock_dev *d, struct rec_doc *doc);
/* vsock_dev_save of a held session, with the device's own feature bits (what the reader takes). */
int dev_save_moved(struct vsock_dev *d, struct rec_writer *w);

#endif
