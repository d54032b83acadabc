/* SPDX-License-Identifier: MIT */
/*
 * vhost-user message framing: one message is a 12-byte header (request, flags, payload size),
 * the payload, and up to VHU_MAX_FDS file descriptors carried as SCM_RIGHTS on the same stream.
 * Used by both the back-end (backend.c) and the front-end (frontend.c).
 *
 * Security model: the peer is untrusted. The reader never reads past the announced message,
 * refuses headers announcing more than VHU_PAYLOAD_MAX bytes, refuses more than VHU_MAX_FDS fds
 * (closing every fd it received), and bounds every wait by a deadline, so a peer that stops
 * mid-message cannot hang the caller.
 *
 * Fd ownership rule: every fd received belongs to the struct vhu_msg until a handler claims it
 * with vhu_msg_take_fd() (which sets the slot to -1); whoever processes a message calls
 * vhu_msg_close_fds() on every path afterwards, which closes whatever nobody claimed.
 */
#ifndef UVSOCK_VHOST_USER_MSG_H
#define UVSOCK_VHOST_USER_MSG_H

#include <stdint.h>

#include "vhost_user/protocol.h"

struct vhu_msg {
	uint32_t request;
	uint32_t flags;
	uint32_t size; /* payload bytes, <= VHU_PAYLOAD_MAX */
	union {
		uint64_t u64;
		struct vhu_vring_state state;
		struct vhu_vring_addr addr;
		struct vhu_mem_table mem;
		struct vhu_log log;
		struct vhu_config config;
		struct vhu_device_state state_xfer;
		uint8_t raw[VHU_PAYLOAD_MAX];
	} payload;
	/* Received fds; slots [0, nfds) are valid fds or -1 once claimed. */
	int fds[VHU_MAX_FDS];
	unsigned nfds;
};

/* Default deadline for one message (both directions), in milliseconds. */
#define VHU_MSG_TIMEOUT_MS 5000

/*
 * Reads exactly one message from the stream socket fd into *m: header, then payload, collecting
 * SCM_RIGHTS fds from any part of it (opened with O_CLOEXEC). Uses non-blocking receives and
 * poll(), so fd may be blocking or not; the whole message must arrive within timeout_ms
 * (negative: no deadline).
 * Returns 0; -ECONNRESET on end of stream before the first byte; -EPROTO on end of stream
 * mid-message, a payload size above VHU_PAYLOAD_MAX, more than VHU_MAX_FDS fds or truncated
 * control data; -ETIMEDOUT; or the errno of recvmsg/poll. On error no fd is left open and
 * m->nfds is 0.
 * Ownership: on success the fds in m->fds belong to *m (see the rule above).
 */
int vhu_msg_recv(int fd, struct vhu_msg *m, int timeout_ms);

/*
 * Writes one message: header (request, flags, size) then size bytes of payload, with nfds fds
 * attached as SCM_RIGHTS to the first byte. Handles short writes and EINTR; MSG_NOSIGNAL.
 * Returns 0; -EINVAL (size > VHU_PAYLOAD_MAX, nfds > VHU_MAX_FDS, payload NULL with size > 0);
 * -ETIMEDOUT; -EPIPE / -ECONNRESET when the peer is gone; or the errno of sendmsg/poll.
 * Ownership: fds are borrowed (the kernel duplicates them into the peer).
 */
int vhu_msg_send(int fd, uint32_t request, uint32_t flags, const void *payload, uint32_t size,
		 const int *fds, unsigned nfds, int timeout_ms);

/* Claims fd slot i of m: returns the fd (or -1 if none / already claimed) and sets it to -1. */
int vhu_msg_take_fd(struct vhu_msg *m, unsigned i);

/* Closes every fd m still owns and sets nfds to 0. Safe to call repeatedly. */
void vhu_msg_close_fds(struct vhu_msg *m);

#endif
