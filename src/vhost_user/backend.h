/* SPDX-License-Identifier: MIT */
/*
 * vhost-user back-end for a vsock device (what uvsockd serves to QEMU 7.2's
 * vhost-user-vsock-pci): one struct vhu_backend per front-end connection (one VM). It answers
 * the protocol, keeps the negotiated features, the guest memory map and the configuration of the
 * two queues (0 rx, 1 tx; the event queue stays in the front-end), and tells the device role,
 * through struct vhu_backend_ops, when a ring starts and stops. It never walks a ring itself.
 *
 * Security model: the front-end (and the guest behind it) is untrusted. Every message is checked
 * against a per-request policy (fd count, payload size, owner, protocol feature) before its
 * handler runs, and every field is validated; a violation makes vhu_backend_process() return a
 * -errno, after which the caller closes the connection (vhu_backend_free()). Nothing a
 * front-end sends can crash, assert, hang (every wait has a deadline) or allocate without bound.
 *
 * Ring lifecycle: a ring is *started* (vhost-user.rst "started") by SET_VRING_KICK and stopped
 * by GET_VRING_BASE. It is *enabled* from the start if VHOST_USER_F_PROTOCOL_FEATURES was not
 * acked in SET_FEATURES, otherwise only after SET_VRING_ENABLE(1). The device is told to run a
 * ring (ops->queue_start) when it is started, enabled, has a size, addresses that lie in guest
 * memory, and a memory table; it is told to stop (ops->queue_stop) as soon as any of these ends.
 *
 * Context: not thread-safe; one thread (the VM's device thread) calls every function and
 * receives every callback, from inside vhu_backend_process() or vhu_backend_free().
 */
#ifndef UVSOCK_VHOST_USER_BACKEND_H
#define UVSOCK_VHOST_USER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "vhost_user/protocol.h"
#include "vring/guest_mem.h"

/*
 * Queues served by the back-end: 0 = rx (device to guest), 1 = tx (guest to device), 2 = the
 * event queue (virtio 1.2 §5.10.2), which QEMU keeps for itself and other front-ends (Cloud
 * Hypervisor, crosvm) hand over; a ring the front-end never sets up simply never runs.
 */
#define VHU_NUM_QUEUES 3u

/* Device feature bits a back-end may offer besides VERSION_1 and PROTOCOL_FEATURES. */
#define VHU_BACKEND_OPTIONAL_FEATURES                                                              \
	(VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_NOTIFY_ON_EMPTY) |                         \
	 VHU_BIT(VHU_F_INDIRECT_DESC) | VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_IN_ORDER) |       \
	 VHU_BIT(VHU_F_RING_PACKED) | VHU_BIT(VHU_VSOCK_F_DGRAM) | VHU_BIT(VHU_F_LOG_ALL))
/* What vhu_backend_config_init() offers. VHU_F_LOG_ALL (dirty logging for live migration)
 * comes with the protocol feature LOG_SHMFD. */
#define VHU_BACKEND_DEFAULT_FEATURES                                                               \
	(VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_INDIRECT_DESC) | VHU_BIT(VHU_F_EVENT_IDX) | \
	 VHU_BIT(VHU_F_IN_ORDER) | VHU_BIT(VHU_F_RING_PACKED) | VHU_BIT(VHU_F_LOG_ALL))

struct vhu_backend_config {
	uint64_t guest_cid;     /* served by GET_CONFIG as le64 at offset 0 */
	uint64_t features;      /* subset of VHU_BACKEND_OPTIONAL_FEATURES to offer */
	uint32_t queue_size_max; /* largest SET_VRING_NUM accepted: power of 2, <= 32768 */
	bool offer_mq;          /* offer PROTOCOL_F_MQ (GET_QUEUE_NUM answers 2) */
	int msg_timeout_ms;     /* deadline for reading the rest of a message / writing a reply */
	const char *name;       /* for log messages ("vm3"); borrowed, may be NULL */
};

/* What the device needs to run one ring. Pointers and fds are borrowed (see ops). */
struct vhu_vring_info {
	unsigned num;            /* ring size, power of 2 (packed ring: any size) */
	void *desc;              /* descriptor table, 16 * num bytes, in guest memory */
	void *avail;             /* avail ring, 6 + 2 * num bytes (packed: driver event area, 4) */
	void *used;              /* used ring, 6 + 8 * num bytes (packed: device event area, 4) */
	uint16_t last_avail_idx; /* next avail index to process (SET_VRING_BASE / last stop;
				  * packed: next slot | wrap counter << 15) */
	int kick_fd;             /* eventfd the guest kicks; -1: none (front-end said "poll") */
	int call_fd;             /* eventfd to interrupt the guest; -1: none */
	uint64_t features;       /* acked virtio features (EVENT_IDX, INDIRECT_DESC, ...) */
	const struct guest_mem *mem; /* current guest memory map */
};

/*
 * Callbacks into the device role. Every one is optional (NULL); they are called from inside
 * vhu_backend_process() or vhu_backend_free(), never concurrently.
 */
struct vhu_backend_ops {
	/*
	 * Ring qidx may run now. info and everything it points to are borrowed: valid until
	 * queue_stop(qidx) (the call fd until call_fd_changed). The device initialises its used
	 * index from info->used in guest memory, not from 0. Returns 0, or a -errno that fails
	 * the message being processed (the connection is then closed).
	 */
	int (*queue_start)(void *opaque, unsigned qidx, const struct vhu_vring_info *info);
	/*
	 * Ring qidx must stop now: the device stops using its pointers and fds before returning
	 * and returns the next avail index it would have processed (answered in GET_VRING_BASE
	 * and used as last_avail_idx if the ring starts again).
	 */
	uint16_t (*queue_stop)(void *opaque, unsigned qidx);
	/* SET_VRING_CALL replaced the call fd of running ring qidx; the old fd is closed after
	 * this returns. call_fd is borrowed (-1: none). */
	void (*call_fd_changed)(void *opaque, unsigned qidx, int call_fd);
	/* A new memory table arrives: every running ring was stopped; drop any guest pointer. The
	 * old map is freed after this returns. */
	void (*mem_table_changing)(void *opaque);
	/* The new map is in place (borrowed until the next mem_table_changing or free). Rings that
	 * can run are restarted with queue_start after this. */
	void (*mem_table_changed)(void *opaque, const struct guest_mem *mem);
	/* SET_FEATURES was accepted (acked virtio features). */
	void (*features_set)(void *opaque, uint64_t features);
	/*
	 * VHOST_USER_PROTOCOL_F_DEVICE_STATE (vhost-user.rst "Migrating back-end state") is offered
	 * when all three are set. The back-end has checked SET_DEVICE_STATE_FD (phase "stopped",
	 * every ring stopped, a pipe or socket open the right way); fd is the device's from here on,
	 * on every path (it closes it when the transfer ends). state_save writes the device's state
	 * into fd and state_load reads one from it, both without blocking the caller (the transfer
	 * runs on the caller's loop). A new transfer ends one still running. Returns 0, or a
	 * -errno that the reply carries (the connection stays).
	 */
	int (*state_save)(void *opaque, int fd);
	int (*state_load)(void *opaque, int fd);
	/* CHECK_DEVICE_STATE: 0 when the last transfer succeeded (a load: read whole, checked and
	 * kept to apply), or a -errno (the reply carries it; the device logs why). */
	int (*state_check)(void *opaque);
};

struct vhu_backend;

/* Fills *cfg with defaults: guest_cid 3, VHU_BACKEND_DEFAULT_FEATURES, queue_size_max 32768,
 * no MQ, VHU_MSG_TIMEOUT_MS. */
void vhu_backend_config_init(struct vhu_backend_config *cfg);

/*
 * Creates the back-end of one front-end connection.
 * @sock: connected Unix stream socket; ownership is taken on success only (closed by
 *        vhu_backend_free()).
 * @cfg: copied (cfg->name is borrowed and must outlive the back-end).
 * @ops, @opaque: callbacks; ops is borrowed and must outlive the back-end; may be NULL.
 * Returns 0, -EINVAL (sock < 0, guest_cid < 3 or > UINT32_MAX - 1 reserved, features outside
 * VHU_BACKEND_OPTIONAL_FEATURES, queue_size_max not a power of 2 in [1, 32768]) or -ENOMEM.
 */
int vhu_backend_new(int sock, const struct vhu_backend_config *cfg,
		    const struct vhu_backend_ops *ops, void *opaque, struct vhu_backend **ret);

/*
 * Stops every running ring (ops->queue_stop), tells the device the memory goes away
 * (ops->mem_table_changing), unmaps guest memory, closes every fd and the socket. Safe on NULL.
 */
void vhu_backend_free(struct vhu_backend *b);

/* The socket to watch for POLLIN (level-triggered: one message is processed per call). */
int vhu_backend_fd(const struct vhu_backend *b);

/*
 * Reads and handles one message (waiting at most msg_timeout_ms for the rest of it once its
 * first byte is there) and sends its reply. Call when the socket is readable; if nothing is
 * readable it returns 0 at once.
 * Returns 0, or -errno when the connection must be closed: -ECONNRESET (front-end closed),
 * -EPROTO (framing: bad flags, fd count or payload size), -EOPNOTSUPP (unknown or unsupported
 * request), -EPERM (request before SET_OWNER or without the protocol feature it needs),
 * -EINVAL (invalid value: bad ring index or size, feature not offered...), -EFAULT (ring
 * outside guest memory), -EBUSY (request not allowed in the current ring state), -ETIMEDOUT,
 * the errno of a failed queue_start, mmap errors, or socket errors. After an error every later
 * call returns the same error.
 */
int vhu_backend_process(struct vhu_backend *b);

/*
 * Why the connection failed, e.g. "SET_VRING_NUM: queue 0 size 100 is not a power of 2"; "" while
 * it has not. Borrowed; valid until the next call on b. (The library does not log; the daemon
 * logs this string when it closes the connection.)
 */
const char *vhu_backend_error(const struct vhu_backend *b);

/* Acked virtio features (0 before SET_FEATURES). */
uint64_t vhu_backend_features(const struct vhu_backend *b);
/* Acked protocol features. */
uint64_t vhu_backend_protocol_features(const struct vhu_backend *b);
/* Current guest memory map or NULL (borrowed; see ops->mem_table_changing). */
const struct guest_mem *vhu_backend_mem(const struct vhu_backend *b);
/* The dirty log (vring/dirty_log.h): active while LOG_ALL is acked and a log is mapped. */
const struct vring_log *vhu_backend_log(const struct vhu_backend *b);

/* True while the device has been told to run ring qidx. */
bool vhu_backend_queue_running(const struct vhu_backend *b, unsigned qidx);

/*
 * State save and restore, for handing a running back-end to another process without the
 * front-end noticing (docs/upgrade.md, "The vhost-user back-end's part"). The record part is
 * schema VHU_BACKEND_SAVE_VERSION: the features offered and acked (virtio and protocol), the
 * owner flag, the connection socket, the memory table with each region's fd, each ring's size,
 * next avail index (packed: with the wrap counter in bit 15), addresses, state and kick, call
 * and error fds, and the dirty log's fd, size and offset and its eventfd. Call between two
 * vhu_backend_process() calls (no message is ever half handled there).
 */
#define VHU_BACKEND_SAVE_VERSION 1u
struct rec_writer;
struct rec_reader;

/*
 * Stops every running ring (ops->queue_stop: the device returns each next avail index) and
 * writes the back-end's items into the list w is in; its fds are borrowed by w (keep b until
 * they are sent). b is then frozen: vhu_backend_process() returns -EBUSY without reading,
 * so the caller stops watching the socket; vhu_backend_resume() serves again (the hand-over
 * failed) and vhu_backend_free() ends it (the hand-over succeeded: the socket and every fd
 * stay open in the new owner, which has its own duplicates). Returns 0, -EIO (the connection
 * already failed: nothing to hand over); writer errors stay in w.
 */
int vhu_backend_save(struct vhu_backend *b, struct rec_writer *w);

/*
 * Builds a new back-end from the items vhu_backend_save() wrote, read from r (the rest of
 * the record, rec_check_fds_claimed() included, is the caller's). Every field is checked
 * before use: the schema (-EPROTONOSUPPORT for another), the guest CID against cfg's
 * (-EINVAL), features acked within those offered, and those within what cfg lets this
 * back-end offer, ring sizes, indices, flags and addresses as the requests that set them
 * check them (a ring that will run must lie in the memory), the connection a connected Unix
 * stream socket, each region and the log a regular file or memfd long enough, each kick,
 * call, error and log fd an eventfd. The new back-end takes close-on-exec duplicates of the
 * fds (the record's stay the caller's), maps the memory and the log, and is frozen: no
 * callback has run yet. vhu_backend_resume() tells the device the features and the memory
 * and starts the rings that may run at their saved indices; nothing is sent to the
 * front-end. Returns 0 and *ret, or -errno with rec_error() saying why and nothing created.
 */
int vhu_backend_restore(struct rec_reader *r, const struct vhu_backend_config *cfg,
			const struct vhu_backend_ops *ops, void *opaque, struct vhu_backend **ret);

/*
 * Serves again after vhu_backend_save() or vhu_backend_restore(): a restored back-end first
 * calls ops->features_set and ops->mem_table_changed; then every ring that may run gets
 * ops->queue_start at its recorded next avail index. Returns 0, or the -errno that failed the
 * connection (a refused queue_start). No-op when not frozen.
 */
int vhu_backend_resume(struct vhu_backend *b);

/*
 * Crash survival (docs/upgrade.md, "Crash survival"): the same items as vhu_backend_save()
 * without stopping the rings or freezing b, so the next avail index of a running ring is
 * whatever was last known (a record to restore with vhu_backend_resume_adopted(), which does
 * not use it). The connection is the first fd put into w. Fds are borrowed by w. Returns 0 or
 * -EIO (the connection failed).
 */
int vhu_backend_snapshot(const struct vhu_backend *b, struct rec_writer *w);

/*
 * fn(arg) is called after each handled message that may change what vhu_backend_snapshot()
 * writes (every request but GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM and
 * GET_CONFIG), before its reply is sent: a snapshot taken there is what the front-end will
 * believe once it has the reply. NULL: none.
 */
void vhu_backend_set_change_hook(struct vhu_backend *b, void (*fn)(void *arg), void *arg);

/*
 * vhu_backend_resume() for a back-end restored from a vhu_backend_snapshot() of a process that
 * died: each running split ring starts at the used index found in guest memory (why that is
 * correct: backend.c), then each running ring's call eventfd is signalled once. A running
 * packed ring is refused (-EOPNOTSUPP, vhu_backend_error() says why). Returns 0, -EINVAL (b
 * is not a restored, frozen back-end) or the -errno that failed the connection.
 */
int vhu_backend_resume_adopted(struct vhu_backend *b);

/* "SET_MEM_TABLE" for a known id, "UNKNOWN" otherwise. */
const char *vhu_request_to_string(uint32_t request);

#endif
