/* SPDX-License-Identifier: MIT */
/*
 * vhost-user front-end for a vsock device: what QEMU does for vhost-user-vsock-pci, without a
 * VM. It negotiates features with any conforming vhost-user vsock back-end, reads the guest CID,
 * creates "guest memory" as one shared memfd region, places the rings (0 rx, 1 tx, optionally 2 event) in it,
 * hands everything over (SET_MEM_TABLE, SET_VRING_*) with a kick and a call eventfd per ring,
 * and tears down in order. The guest role (src/driver/) and uvsock-perf drive the rings through
 * vhu_front_ring() and place their buffers with vhu_front_alloc().
 *
 * Every request is synchronous: a reply (or, when REPLY_ACK was negotiated, an ack requested
 * with NEED_REPLY on every request that has no reply of its own) is awaited with a deadline.
 * The back-end is not trusted: replies are checked (flags exactly 0x5, request id, size).
 *
 * Context: not thread-safe; one thread uses a struct vhu_front. The ring memory and eventfds it
 * exposes may be used from other threads as the caller arranges.
 */
#ifndef UVSOCK_VHOST_USER_FRONTEND_H
#define UVSOCK_VHOST_USER_FRONTEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhost_user/protocol.h"

struct vhu_front_config {
	uint64_t mem_size;   /* bytes of guest memory (memfd), > 0, multiple of 4096 */
	uint64_t gpa_base;   /* guest-physical address of the region (default 0) */
	uint64_t features;   /* device features wanted (SEQPACKET, INDIRECT_DESC, EVENT_IDX,
			      * IN_ORDER, NOTIFY_ON_EMPTY, RING_PACKED); what the back-end offers of
			      * them is acked. With RING_PACKED the rings' desc/avail/used are the
			      * descriptor ring and the driver/device event areas. */
	unsigned queue_size; /* ring size, power of 2 <= 32768 (QEMU uses 128) */
	unsigned num_queues; /* rings handed to the back-end: 2 (0 means 2: rx and tx, as QEMU) or
			      * 3 (also the event queue, as Cloud Hypervisor and crosvm do) */
	int timeout_ms;      /* deadline of each request/reply exchange */
};

/* One ring as placed in guest memory. Pointers are into the memfd mapping; gpa/uva are the
 * guest-physical and front-end virtual (= our mapping) addresses of each part. */
struct vhu_front_ring {
	unsigned num;
	void *desc, *avail, *used;
	uint64_t desc_gpa, avail_gpa, used_gpa;
	int kick_fd; /* eventfd: write 1 to notify the back-end (borrowed; owned by the front-end) */
	int call_fd; /* eventfd: the back-end signals used buffers (borrowed, non-blocking) */
};

struct vhu_front;

/* Defaults: 64 MiB, gpa 0, SEQPACKET | INDIRECT_DESC | EVENT_IDX | IN_ORDER, queue size 128, two
 * queues, 5 s. */
void vhu_front_config_init(struct vhu_front_config *cfg);

/*
 * Creates a front-end over a connected Unix stream socket (taken over on success only) and its
 * guest memory (memfd + MAP_SHARED mapping, zero-filled) and eventfds. No I/O yet.
 * Returns 0, -EINVAL (bad config), -ENOMEM, or the errno of memfd_create/ftruncate/mmap/eventfd.
 */
int vhu_front_new(int sock, const struct vhu_front_config *cfg, struct vhu_front **ret);

/*
 * Connects to the back-end listening at path (retrying ECONNREFUSED/ENOENT until the timeout)
 * and calls vhu_front_new(). Returns 0, -ENAMETOOLONG, -ETIMEDOUT, or as vhu_front_new/connect.
 */
int vhu_front_connect(const char *path, const struct vhu_front_config *cfg,
		      struct vhu_front **ret);

/* Closes the socket, the eventfds and the memfd, unmaps guest memory. No messages are sent (see
 * vhu_front_stop()). Safe on NULL. */
void vhu_front_free(struct vhu_front *f);

/*
 * Device initialisation as QEMU 7.2 realizes vhost-user-vsock: GET_FEATURES,
 * GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES (CONFIG, REPLY_ACK, MQ, LOG_SHMFD and DEVICE_STATE
 * as offered),
 * [GET_QUEUE_NUM], SET_OWNER, SET_VRING_CALL for each ring, GET_CONFIG (guest CID).
 * Returns 0; -EPROTONOSUPPORT if the back-end lacks VERSION_1, PROTOCOL_FEATURES or protocol
 * feature CONFIG, or offers fewer queues than cfg.num_queues; -EPROTO for a malformed reply (flags not 0x5,
 * wrong request id or size) or a failed REPLY_ACK; -EINVAL for a reserved guest CID; -ETIMEDOUT;
 * -ECONNRESET / -EPIPE when the back-end closes.
 */
int vhu_front_init(struct vhu_front *f);

/*
 * Driver start (what QEMU does at the guest's DRIVER_OK): SET_FEATURES, SET_MEM_TABLE, then per
 * ring SET_VRING_NUM, SET_VRING_BASE 0, SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL, then
 * SET_VRING_ENABLE 1 for both when PROTOCOL_FEATURES was negotiated. Rings are allocated in
 * guest memory on the first call (zeroed) and reused afterwards (their indices restart from the
 * bases returned by the last vhu_front_stop()). Returns 0, -EINVAL before a successful
 * vhu_front_init(), or as vhu_front_init().
 */
int vhu_front_start(struct vhu_front *f);

/*
 * Orderly stop (what QEMU does at reset/power-off): SET_VRING_ENABLE 0 for every ring (if
 * PROTOCOL_FEATURES), then GET_VRING_BASE for each. ret_bases (may be NULL) receives the
 * next-avail indices, one per queue (cfg.num_queues of them). Returns 0 or as vhu_front_init().
 */
int vhu_front_stop(struct vhu_front *f, uint16_t *ret_bases);

/* ---- single steps, for tests and custom sequences (each one request + reply/ack) ---- */
int vhu_front_get_features(struct vhu_front *f, uint64_t *ret);
int vhu_front_set_features(struct vhu_front *f, uint64_t features);
int vhu_front_set_mem_table(struct vhu_front *f);
/* SET_VRING_NUM, SET_VRING_BASE (base), SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL. */
int vhu_front_setup_ring(struct vhu_front *f, unsigned qidx, uint16_t base);
int vhu_front_enable_ring(struct vhu_front *f, unsigned qidx, bool enable);
int vhu_front_get_vring_base(struct vhu_front *f, unsigned qidx, uint16_t *ret);
/* GET_CONFIG for [offset, offset+size) of the device config into buf. */
int vhu_front_get_config(struct vhu_front *f, uint32_t offset, uint32_t size, void *buf);

/*
 * Sends one raw request (header flags: version 1, plus NEED_REPLY if need_reply) with fds
 * (borrowed) and, if reply_size > 0, reads the reply into reply (checking flags 0x5, request id
 * and exact size). For tests of back-end validation. Returns 0 or as vhu_front_init().
 */
int vhu_front_request(struct vhu_front *f, uint32_t request, bool need_reply, const void *payload,
		      uint32_t size, const int *fds, unsigned nfds, void *reply, uint32_t reply_size);

/* ---- device state (VHOST_USER_PROTOCOL_F_DEVICE_STATE, vhost-user.rst "Migrating back-end
 * state"; acked by vhu_front_init when offered) ---- */

/*
 * SET_DEVICE_STATE_FD with direction (VHU_STATE_DIR_SAVE/_LOAD), phase and fd (borrowed; the
 * back-end gets a copy: close yours after this returns for the transfer to end), the u64 reply
 * in *ret_reply (bits 0-7: the back-end's error, 0 on success; bit 8: it uses our fd). A reply
 * with an fd of the back-end's own is not used (closed). Returns 0 or as vhu_front_init().
 */
int vhu_front_set_device_state_fd(struct vhu_front *f, uint32_t direction, uint32_t phase, int fd,
				  uint64_t *ret_reply);
/* CHECK_DEVICE_STATE: the back-end's u64 answer (0: the transfer succeeded) in *ret_result. */
int vhu_front_check_device_state(struct vhu_front *f, uint64_t *ret_result);
/*
 * The front-end moves to another back-end, connected on sock (taken over): the old socket is
 * closed; guest memory, the rings and their eventfds stay, and the next vhu_front_init() and
 * vhu_front_start() hand them to the new back-end, the rings at the indices of the last
 * vhu_front_stop(). What a VMM does when it migrates a VM to a back-end on the same host.
 */
void vhu_front_move(struct vhu_front *f, int sock);

/* ---- dirty logging (live migration; docs/vhost-user.md "Dirty logging and migration") ---- */

/* Bytes of dirty bitmap QEMU would allocate for this guest memory (64 pages per u64). */
uint64_t vhu_front_log_size_needed(const struct vhu_front *f);
/*
 * SET_LOG_BASE: a new zeroed memfd of size bytes (0: vhu_front_log_size_needed()) handed over
 * with LOG_SHMFD, the reply awaited; replaces the previous log. Returns 0, -EPROTONOSUPPORT
 * (LOG_SHMFD not negotiated), -EPROTO (the back-end refused: it closes the connection), or as
 * vhu_front_init().
 */
int vhu_front_set_log_base(struct vhu_front *f, uint64_t size);
/*
 * Logging on or off as QEMU does it: SET_FEATURES with or without LOG_ALL, then SET_VRING_ADDR
 * of every ring with or without VHOST_VRING_F_LOG (log_guest_addr = the used ring); the rings
 * keep running. Rings set up later follow. Returns 0, -EPROTONOSUPPORT (LOG_ALL not offered),
 * or as vhu_front_init().
 */
int vhu_front_set_logging(struct vhu_front *f, bool on);
/* The current log bitmap (bit p % 8 of byte p / 8: guest page p) and its size, or NULL. */
const uint8_t *vhu_front_log(const struct vhu_front *f, uint64_t *ret_size);

/* ---- accessors ---- */
int vhu_front_fd(const struct vhu_front *f);
uint64_t vhu_front_guest_cid(const struct vhu_front *f);          /* after vhu_front_init */
/* Negotiated virtio features: known once vhu_front_init() succeeded (VERSION_1,
 * PROTOCOL_FEATURES and the wanted device features the back-end offers), sent by
 * vhu_front_start() in SET_FEATURES. */
uint64_t vhu_front_features(const struct vhu_front *f);
uint64_t vhu_front_protocol_features(const struct vhu_front *f);  /* acked protocol features */
/* Ring qidx (0 rx, 1 tx); NULL before the first vhu_front_start or for qidx >= 2. Borrowed. */
const struct vhu_front_ring *vhu_front_ring(const struct vhu_front *f, unsigned qidx);

/* Guest memory: base of the mapping, size, memfd (borrowed). */
void *vhu_front_mem(const struct vhu_front *f);
uint64_t vhu_front_mem_size(const struct vhu_front *f);
int vhu_front_memfd(const struct vhu_front *f);

/*
 * Bump allocator in guest memory: size bytes aligned to align (a power of 2; 0 means 8),
 * zeroed at creation, never freed. Returns 0 with *ret_ptr / *ret_gpa (either may be NULL), or
 * -EINVAL (bad align, size 0) or -ENOMEM (guest memory exhausted).
 */
int vhu_front_alloc(struct vhu_front *f, size_t size, size_t align, void **ret_ptr,
		    uint64_t *ret_gpa);

/* Guest-physical address of a pointer into guest memory, or UINT64_MAX if outside. */
uint64_t vhu_front_gpa(const struct vhu_front *f, const void *ptr);
/* Host pointer of [gpa, gpa+len) if it lies in guest memory, else NULL. */
void *vhu_front_hva(const struct vhu_front *f, uint64_t gpa, uint64_t len);

#endif
