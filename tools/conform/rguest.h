/* SPDX-License-Identifier: MIT */
/*
 * uvsock-conform's raw guest: a vhost-user front-end (src/vhost_user/frontend.h) with both rings
 * started and driven by hand through the driver side of the split ring (src/vring/vring_drv.h),
 * so that any packet, any descriptor layout on TX and any RX buffer layout can be offered to the
 * back-end under test, and every RX buffer it returns is seen as written (header, used length,
 * room offered). The vsock protocol above it (connections, credit) is conform.c's.
 *
 * The back-end is not trusted: used lengths are checked against the buffer offered before any
 * byte is read, and a ring the back-end broke ends the session with -EIO.
 * Context: one thread uses one struct rguest.
 */
#ifndef UVSOCK_CONFORM_RGUEST_H
#define UVSOCK_CONFORM_RGUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "vsock/hdr.h"

#define RG_TX_SLOTS 64u
#define RG_RX_BUFS  128u
#define RG_MAX_SEGS 8u

/* RX buffers posted: payload room cycles through room[0..nroom); split: header and payload in
 * two descriptors (as Linux guests before 6.3 posted them), else one. */
struct rg_rx_layout {
	uint32_t room[8];
	unsigned nroom;
	bool split;
};

/* One RX buffer the back-end returned, decoded. data holds min(h.len, used_len - 44, room)
 * payload bytes (ndata) and stays valid until the next rg_recv(). */
struct rg_pkt {
	struct vsock_hdr h;
	uint32_t used_len; /* bytes the back-end says it wrote, header included */
	uint32_t room;     /* payload room of the buffer it used */
	uint32_t ndata;
	const uint8_t *data;
};

struct rg_queued;
struct vhu_front;
struct vhu_front_ring;
struct vring_drv;

struct rguest {
	struct vhu_front *f;
	const struct vhu_front_ring *rq, *tq;
	struct vring_drv *rx, *tx;
	uint32_t cid;
	uint64_t features; /* negotiated */
	int timeout_ms;
	struct rg_rx_layout lay;
	unsigned lay_next;
	uint8_t *slot[RG_TX_SLOTS];
	uint64_t slot_gpa[RG_TX_SLOTS];
	uint8_t *ind[RG_TX_SLOTS]; /* indirect tables */
	uint64_t ind_gpa[RG_TX_SLOTS];
	bool busy[RG_TX_SLOTS];
	uint8_t *rxb[RG_RX_BUFS];
	uint64_t rxb_gpa[RG_RX_BUFS];
	uint32_t rxb_room[RG_RX_BUFS]; /* room offered when posted */
	bool rxb_busy[RG_RX_BUFS];
	struct rg_queued *qhead, *qtail; /* RX packets taken while waiting for TX room */
	unsigned nqueued;
	uint8_t *cur; /* the packet rg_recv() returned last (freed at the next call) */
	uint64_t tx_pkts, rx_pkts;
};

/*
 * Connects to the back-end at sock, negotiates (vhu_front_init: VERSION_1, SEQPACKET and the
 * ring features it offers), starts both rings of 128 entries (QEMU's size) and posts up to
 * RG_RX_BUFS buffers of layout lay, as many as the ring holds (NULL: 4 KiB rooms in one
 * descriptor, as Linux 6.3+). Returns 0 or -errno (err says what failed).
 */
int rg_open(struct rguest *g, const char *sock, const struct rg_rx_layout *lay, int timeout_ms,
	    char *err, size_t errlen);

/* Stops the rings (SET_VRING_ENABLE 0, GET_VRING_BASE) and closes the session. Safe twice. */
void rg_close(struct rguest *g);

/* True if the back-end negotiated VIRTIO_VSOCK_F_SEQPACKET / VIRTIO_RING_F_INDIRECT_DESC. */
bool rg_seqpacket(const struct rguest *g);
bool rg_indirect(const struct rguest *g);

/*
 * Puts one packet on the TX ring: the 44-byte header then plen payload bytes, laid out in one
 * TX buffer and cut into descriptors at the offsets cuts[0..ncuts) (strictly increasing, inside
 * the packet; ncuts < RG_MAX_SEGS), through an indirect table if indirect. Waits (bounded) for a
 * free TX buffer, queueing RX packets that arrive meanwhile. Returns 0, -ETIMEDOUT, -EIO (ring
 * broken) or -EINVAL.
 */
int rg_send(struct rguest *g, const struct vsock_hdr *h, const void *payload, uint32_t plen,
	    const uint32_t *cuts, unsigned ncuts, bool indirect);

/* rg_send() of a header alone, in one descriptor. */
int rg_send_hdr(struct rguest *g, const struct vsock_hdr *h);

/*
 * The next RX buffer the back-end returned (queued ones first), its buffer posted again. Waits up
 * to ms. Returns 0, -ETIMEDOUT, -EIO (ring broken) or -EPROTO (used length beyond the buffer:
 * *p has the header fields zeroed and used_len/room set).
 */
int rg_recv(struct rguest *g, struct rg_pkt *p, int ms);

/* True if RX packets are waiting (queued or returned on the ring, not yet taken). */
bool rg_rx_pending(struct rguest *g);

/* Waits (bounded by ms) until the back-end returned every TX buffer; 0 or -ETIMEDOUT/-EIO. */
int rg_flush(struct rguest *g, int ms);

#endif
