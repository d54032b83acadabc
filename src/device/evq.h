/* SPDX-License-Identifier: MIT */
/*
 * The event queue of a device (virtio 1.2 §5.10.2, queue 2) and the one event the device posts
 * there: VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (§5.10.6.4, struct virtio_vsock_event { le32 id; },
 * id 0). QEMU keeps the event queue for itself (its vhost-user-vsock hands only rx and tx to the
 * back-end); front-ends that hand it over (Cloud Hypervisor, crosvm, our own front-end with
 * three queues) get a reset posted when the device dropped the guest's connections while the
 * guest may still think them alive: a VMM reconnect, or rings stopped inside one message (a
 * memory-table change). The guest then resets its sockets (Linux: virtio_vsock_event_handle)
 * instead of waiting on connections the device no longer has. docs/vhost-user.md, "Event queue".
 *
 * The reset is pending from the moment the connections were dropped until it is written into an
 * event buffer; it is written when a session runs and the event queue has a buffer: when TX or
 * the event queue starts, at the event queue's kick, and before RX is filled (so before the
 * first packet of the new session, when the queue already runs). A new guest driver (TX starts
 * at index 0) has nothing to reset: the pending reset is dropped then. At most one reset is pending: several drops before the guest sees one are one
 * event for it. Everything runs on the device thread.
 */
#ifndef UVSOCK_DEVICE_EVQ_H
#define UVSOCK_DEVICE_EVQ_H

#include <stdint.h>

#include "vring/vring.h"

struct vsock_dev;

/* virtio 1.2 §5.10.6.4: the only event id, and the size of an event. */
#define VSOCK_EVENT_TRANSPORT_RESET 0u
#define VSOCK_EVENT_SIZE 4u

/*
 * Starts the event queue over cfg (kick_fd watched, call_fd borrowed like the other queues') and
 * posts a pending reset if there is a buffer. Returns 0, -EBUSY (running), or as vring_dev_init
 * and loop_watch_add.
 */
int dev_evq_start(struct vsock_dev *d, const struct vring_dev_config *cfg, int kick_fd,
		  int call_fd);

/* Stops the event queue (no-op if it is not running); returns its next avail index. */
uint16_t dev_evq_stop(struct vsock_dev *d);

/* Replaces the event queue's call fd (-1: none). */
void dev_evq_set_call_fd(struct vsock_dev *d, int call_fd);

/* The guest's connections were dropped under it: a reset becomes pending and is posted if it can
 * be now. */
void dev_evq_reset_needed(struct vsock_dev *d);

/*
 * Posts the pending reset if a session runs (TX started), the event queue runs and has a
 * buffer. Cheap when none is pending.
 */
void dev_evq_flush(struct vsock_dev *d);

/*
 * TX started a new session at avail index tx_base (SET_VRING_BASE). 0 (packed rings: 0x8000,
 * slot 0 with the wrap counter at 1) is a driver that never used the ring: a new guest driver
 * (its reset, a reboot, our guest role's reconnect), which has no connection to reset, so a
 * pending reset is dropped (it would hit the new session's first connections). Anything else is
 * a guest that survived (a front-end that reconnects and gives the rings back): the reset is
 * posted. A surviving guest whose TX index wrapped to exactly that value misses it. Then
 * flushes.
 */
void dev_evq_session_start(struct vsock_dev *d, uint16_t tx_base);

#endif
