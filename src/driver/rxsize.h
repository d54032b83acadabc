/* SPDX-License-Identifier: MIT */
/*
 * Adaptive RX buffer sizing for the guest role: the size of the receive buffers the driver
 * posts follows the traffic, between a minimum (4 KiB of payload, what Linux posts) and a maximum
 * (64 KiB, the largest vsock packet), the way virtio-net sizes its mergeable RX buffers: an
 * exponentially weighted moving average (EWMA) of received packet sizes, rounded up so that the
 * whole buffer (header included) is a multiple of a cache line, instead of a fixed size: Linux's
 * virtio-vsock driver posts fixed 4 KiB buffers (VIRTIO_VSOCK_DEFAULT_RX_BUF_SIZE).
 *
 * One subtlety the kernel's fixed size never had to face: a device fills a buffer with at most
 * what fits, so with small buffers every bulk packet arrives exactly as large as the buffer and
 * the average of what arrives can never grow. A buffer that came back completely full therefore
 * counts as a sample of twice its payload room (capped at the maximum), so bulk traffic doubles
 * the size within a few refills, while a workload of small packets pulls it back down.
 *
 * Pure arithmetic, no locks: one struct belongs to the driver's I/O thread.
 */
#ifndef UVSOCK_DRIVER_RXSIZE_H
#define UVSOCK_DRIVER_RXSIZE_H

#include <stdint.h>

#include "vsock/hdr.h"

#define VDRV_RXSIZE_MIN_DEFAULT 4096u   /* payload; Linux's VIRTIO_VSOCK_DEFAULT_RX_BUF_SIZE */
#define VDRV_RXSIZE_MAX_DEFAULT 65536u  /* payload bytes; VIRTIO_VSOCK_MAX_PKT_BUF_SIZE */
#define VDRV_RXSIZE_WEIGHT 16u          /* EWMA weight: each sample moves the average by 1/16 */
#define VDRV_RXSIZE_ALIGN 64u           /* header + payload room is a multiple of this */
/* Payload room of every RX buffer while datagrams are negotiated: the largest datagram, so
 * that header + payload is one 64 KiB buffer (docs/vsock-protocol.md, "Datagrams"). */
#define VDRV_RXSIZE_DGRAM VSOCK_DGRAM_MAX

struct vdrv_rxsize {
	uint32_t min, max;   /* bounds of the payload room, bytes */
	uint64_t avg_fp;     /* EWMA of payload sizes, fixed point with 8 fraction bits */
	uint64_t samples;
};

/*
 * Initialises *s with payload bounds [min, max]; the average starts at min (Linux's size).
 * Returns 0, or -EINVAL unless 44 < min <= max <= 65536 (a buffer must hold a header and a
 * small packet; no vsock packet carries more than 64 KiB).
 */
int vdrv_rxsize_init(struct vdrv_rxsize *s, uint32_t min, uint32_t max);

/*
 * Records one received buffer: used_len bytes written by the device (header included) into a
 * buffer of buf_len bytes. used_len < 44 (a malformed buffer) is ignored.
 */
void vdrv_rxsize_sample(struct vdrv_rxsize *s, uint32_t used_len, uint32_t buf_len);

/*
 * Total length (44-byte header + payload room) of the next buffer to post: the average rounded
 * up so that the total is a multiple of VDRV_RXSIZE_ALIGN, clamped so the payload room stays in
 * [min, max].
 */
uint32_t vdrv_rxsize_buf_len(const struct vdrv_rxsize *s);

#endif
