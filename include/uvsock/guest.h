/* SPDX-License-Identifier: MIT */
/*
 * libuvsock guest role: a uvsock context whose transport is a userspace virtio-vsock guest
 * driver talking to any vhost-user vsock back-end (uvsockd, vhost-device-vsock, ...) through real
 * shared-memory virtqueues, with no VM. Every call of <uvsock/uvsock.h> works on it unchanged:
 * the context's local CID is the guest CID the back-end reports (GET_CONFIG); connecting to
 * CID 2 reaches the host side of the back-end, other CIDs reach sibling VMs if the back-end
 * routes them.
 */
#ifndef UVSOCK_GUEST_H
#define UVSOCK_GUEST_H

#include <stdint.h>

#include <uvsock/uvsock.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is libuvsock's API: exported (src/libuvsock.map). */
#pragma GCC visibility push(default)

/* Options for uvsock_ctx_new_guest(). Set size, zero the rest (see "Structs that grow" in
 * <uvsock/uvsock.h>), then set what you need. */
/*
 * struct uvsock_guest_opts flag: hand the event queue to the back-end too (three virtqueues, as
 * Cloud Hypervisor and crosvm do; QEMU keeps it, so the default is two) and act on the device's
 * TRANSPORT_RESET events there as a Linux guest does (uvsock_ctx_guest_transport_reset). The
 * back-end must accept a third queue (uvsockd does).
 */
#define UVSOCK_GUEST_EVENT_QUEUE 0x100u

struct uvsock_guest_opts {
	uint32_t size;           /* sizeof(struct uvsock_guest_opts) */
	unsigned flags;          /* UVSOCK_CTX_UNPRIVILEGED, UVSOCK_GUEST_EVENT_QUEUE,
				  * UVSOCK_GUEST_NO_DGRAM */
	uint32_t max_sockets;    /* cap on live sockets; 0: 65536 */
	unsigned queue_size;     /* virtqueue size, power of two <= 1024; 0: 128 (as QEMU) */
	uint32_t rx_buf_min;     /* RX buffer payload room bounds (adaptive in between); */
	uint32_t rx_buf_max;     /*   0: 4096 and 65536 */
	uint32_t buf_size;       /* default SO_VM_SOCKETS_BUFFER_SIZE (and max) of new sockets;
				  * 0: 256 KiB */
	int timeout_ms;          /* vhost-user connect and request deadline; 0: 5000 */
	unsigned busy_poll_us;   /* the driver thread spins this long before sleeping; 0: never */
};

/*
 * Do not ask the back-end for VIRTIO_VSOCK_F_DGRAM: SOCK_DGRAM sockets then fail with ENODEV, and
 * RX buffers follow the adaptive size alone (docs/guest-role.md, "Datagrams").
 */
#define UVSOCK_GUEST_NO_DGRAM 0x200u

/*
 * Connects to the vhost-user vsock back-end listening at socket_path, negotiates (VERSION_1,
 * EVENT_IDX, INDIRECT_DESC, SEQPACKET as offered), reads the guest CID, sets up guest memory and
 * the rx/tx rings, and starts the driver thread. opts may be NULL.
 * Returns the context, or NULL with errno: EINVAL (bad option or size), ENOMEM, ENAMETOOLONG,
 * ETIMEDOUT (nobody listening within timeout_ms, or no reply), ECONNRESET/EPIPE (back-end hung
 * up), EPROTONOSUPPORT (not a vsock back-end: no VERSION_1, CONFIG...), EPROTO (malformed reply).
 */
struct uvsock_ctx *uvsock_ctx_new_guest(const char *socket_path,
					const struct uvsock_guest_opts *opts);

/*
 * Delivers a TRANSPORT_RESET event as a Linux guest handles it: the CID is read again, every
 * connected socket fails with ECONNRESET (no RST is sent), listeners survive with the new CID.
 * (With vhost-user the event queue belongs to the VMM, which is the one to call this; with
 * UVSOCK_GUEST_EVENT_QUEUE the device's own events on it do the same.)
 * Returns 0, or -1 with errno EINVAL (not a guest context) or the back-end error.
 */
int uvsock_ctx_guest_transport_reset(struct uvsock_ctx *ctx);

/*
 * Closes the vhost-user connection and opens a new one on the same socket path, as a VMM does
 * when a VM is reset: connected sockets fail with ECONNRESET, listeners survive.
 * Returns 0, or -1 with errno EINVAL (not a guest context) or the connect/back-end error.
 */
int uvsock_ctx_guest_reconnect(struct uvsock_ctx *ctx);

/* Driver counters (a snapshot; monotonic unless said otherwise). */
struct uvsock_guest_stats {
	uint32_t size;              /* sizeof(struct uvsock_guest_stats), set by the caller */
	uint64_t rx_bufs;           /* RX buffers returned by the device */
	uint64_t rx_batches;        /* batches fed to the protocol engine */
	uint64_t rx_dropped;        /* malformed RX buffers dropped */
	uint64_t rx_buf_len;        /* length of the RX buffers posted last (adaptive) */
	uint64_t rx_posted;         /* RX buffers posted now */
	uint64_t tx_pkts, tx_bytes; /* packets / payload bytes put on the TX ring */
	uint64_t tx_full;           /* times the TX pool or ring was full */
	uint64_t kicks;             /* notifications sent to the device */
	uint64_t kicks_suppressed;  /* publications the device asked not to be told about */
	uint64_t wakeups;           /* driver thread wake-ups */
	uint64_t resets;            /* transport resets */
	uint64_t backend_lost;      /* back-end hang-ups or ring errors */
	uint64_t tx_inflight;       /* TX buffers the device has not returned yet (now) */
	uint64_t sleep_state;       /* why the driver thread last slept: 1 TX full, 2 RX held
				     * back (reply queue full), 4 back-end gone (diagnostics) */
	uint64_t rx_direct;         /* RX passes run by a blocked recv/send/poll caller itself
				     * (direct RX) that took packets */
	uint64_t rx_direct_sleeps;  /* times such a caller slept on the RX interrupt itself */
};
/* Returns 0, or -1 with errno EINVAL (not a guest context, ret NULL, bad ret->size). */
int uvsock_ctx_guest_get_stats(struct uvsock_ctx *ctx, struct uvsock_guest_stats *ret);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
