/* SPDX-License-Identifier: MIT */
/*
 * The device state a vhost-user front-end moves between two back-ends with
 * VHOST_USER_PROTOCOL_F_DEVICE_STATE (vhu_state.c; docs/upgrade.md, "VHOST_USER_PROTOCOL_F_DEVICE_STATE"):
 * the glue's (vhu.c) transfer through the front-end's pipe, on the device's loop, and the state
 * it carries: a record of kind REC_KIND_DEVICE_STATE with the guest's CID, the acked device
 * features, whether a session ran, the addresses of the guest's connections and, on the same
 * host, the token of a rendezvous where the loading back-end takes the device record with its
 * host sockets (the pipe carries bytes only). Where the rendezvous fails the loading device ends
 * the named connections when its session starts: a TRANSPORT_RESET where the event queue is the
 * back-end's, else an RST each (dev_end_moved_conns). Everything runs on
 * the device thread.
 */
#ifndef UVSOCK_DEVICE_VHU_STATE_H
#define UVSOCK_DEVICE_VHU_STATE_H

#include <stdint.h>

struct vhu_state;
struct vsock_dev;

/* Version of the state record (REC_KIND_DEVICE_STATE) written and read: 2 adds the rendezvous
 * (a state without one is written as version 1). */
#define VHU_STATE_VERSION 2u
/* A loaded state larger than this is refused (-EFBIG): 1 MiB holds some 18,000 connections. */
#define VHU_STATE_MAX_BYTES (1u << 20)
/* CHECK_DEVICE_STATE waits at most this long for the rest of a state being loaded. */
#define VHU_STATE_CHECK_WAIT_MS 1000
/* The saving side's rendezvous stays open this long, then the held connections stay here. */
#define VHU_STATE_RV_SECONDS 60
/* The loading side waits this long for the record and its fds, the saving side to send them. */
#define VHU_STATE_RV_RECV_MS 2000
#define VHU_STATE_RV_SEND_MS 2000

/* Returns NULL on -ENOMEM. */
struct vhu_state *vhu_state_new(struct vsock_dev *d);
/* Ends a transfer (its fd closed) and drops what was saved or loaded. Safe on NULL. */
void vhu_state_free(struct vhu_state *s);
/* The VMM went: the same, the state kept for reuse. */
void vhu_state_reset(struct vhu_state *s);

/*
 * The TX ring stops (inside the message that stops it; the device drops the guest's
 * connections at its end): the state is taken now, with features the acked ones.
 */
void vhu_state_tx_stopping(struct vhu_state *s, uint64_t features);
/* The event queue was handed over in this VMM session. */
void vhu_state_evq_started(struct vhu_state *s);
/* The TX ring runs again: a state taken before is stale; a loaded one is applied now. */
void vhu_state_tx_started(struct vhu_state *s);

/* SET_DEVICE_STATE_FD, save: writes the state into fd (owned), without blocking. */
int vhu_state_save(struct vhu_state *s, int fd, uint64_t features);
/* SET_DEVICE_STATE_FD, load: reads a state from fd (owned) until end of file. */
int vhu_state_load(struct vhu_state *s, int fd);
/* CHECK_DEVICE_STATE with the features acked so far (0: none yet). 0 or -errno (logged). */
int vhu_state_check(struct vhu_state *s, uint64_t acked);

#endif
