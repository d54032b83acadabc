/* SPDX-License-Identifier: MIT */
/*
 * The virtio-vsock packet header (virtio spec 5.10.6, Linux struct virtio_vsock_hdr): 44 bytes,
 * packed, little-endian. Wire bytes are read and written only through vsock_hdr_decode() /
 * vsock_hdr_encode(); the rest of the code works on struct vsock_hdr in host order.
 *
 * Security model: a decoded header is untrusted until vsock_hdr_check() has passed; the engine
 * calls it on every packet it is fed and counts each rejection by reason.
 */
#ifndef UVSOCK_VSOCK_HDR_H
#define UVSOCK_VSOCK_HDR_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#define VSOCK_HDR_SIZE 44u
#define VSOCK_MAX_PKT_PAYLOAD 65536u   /* VIRTIO_VSOCK_MAX_PKT_BUF_SIZE */
/* Largest datagram payload: header and payload fit 64 KiB (docs/vsock-protocol.md "Datagrams"). */
#define VSOCK_DGRAM_MAX (65536u - 44u)
/*
 * Small-payload merge threshold (Linux virtio_transport_recv_enqueue(), GOOD_COPY_LEN;
 * docs/vsock-protocol.md §4).
 */
#define VSOCK_GOOD_COPY_LEN 128u

/* Context IDs, as linux/vm_sockets.h defines them (kept compatible when both are included). */
#ifndef VMADDR_CID_HYPERVISOR
#define VMADDR_CID_HYPERVISOR 0
#endif
#ifndef VMADDR_CID_LOCAL
#define VMADDR_CID_LOCAL 1
#endif
#ifndef VMADDR_CID_HOST
#define VMADDR_CID_HOST 2
#endif
#ifndef VMADDR_CID_ANY
#define VMADDR_CID_ANY -1U
#endif
#ifndef VMADDR_PORT_ANY
#define VMADDR_PORT_ANY -1U
#endif
#define VSOCK_LAST_RESERVED_PORT 1023u

enum vsock_type {
	VSOCK_TYPE_STREAM = 1,
	VSOCK_TYPE_SEQPACKET = 2,
	VSOCK_TYPE_DGRAM = 3, /* only with VIRTIO_VSOCK_F_DGRAM negotiated (docs/vsock-protocol.md) */
};

enum vsock_op {
	VSOCK_OP_INVALID = 0,
	VSOCK_OP_REQUEST = 1,
	VSOCK_OP_RESPONSE = 2,
	VSOCK_OP_RST = 3,
	VSOCK_OP_SHUTDOWN = 4,
	VSOCK_OP_RW = 5,
	VSOCK_OP_CREDIT_UPDATE = 6,
	VSOCK_OP_CREDIT_REQUEST = 7,
	_VSOCK_OP_MAX,
};

/* SHUTDOWN flags are masks on the wire (Linux names; the spec's constants are bit numbers). */
#define VSOCK_SHUTDOWN_RCV 1u
#define VSOCK_SHUTDOWN_SEND 2u
#define VSOCK_SHUTDOWN_MASK 3u
/* RW flags on SEQPACKET. EOR is only ever set together with EOM. */
#define VSOCK_SEQ_EOM 1u
#define VSOCK_SEQ_EOR 2u

/* Feature bits (device-specific). */
#define VIRTIO_VSOCK_F_STREAM 0
#define VIRTIO_VSOCK_F_SEQPACKET 1
/*
 * Datagrams: bit 3 and type 3 as the virtio-vsock datagram series posted for Linux and the
 * virtio spec proposed them (rx/tx queues reused; never merged). Bit 2 is NO_IMPLIED_STREAM.
 */
#define VIRTIO_VSOCK_F_DGRAM 3

struct vsock_hdr {
	uint64_t src_cid;
	uint64_t dst_cid;
	uint32_t src_port;
	uint32_t dst_port;
	uint32_t len;       /* payload bytes following the header */
	uint16_t type;      /* enum vsock_type */
	uint16_t op;        /* enum vsock_op */
	uint32_t flags;
	uint32_t buf_alloc; /* sender's receive buffer size */
	uint32_t fwd_cnt;   /* sender's free-running count of bytes its app consumed; wraps */
};

static inline uint64_t vsock_le64_get_(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}
static inline uint32_t vsock_le32_get_(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}
static inline uint16_t vsock_le16_get_(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return le16toh(v);
}
static inline void vsock_le64_put_(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}
static inline void vsock_le32_put_(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}
static inline void vsock_le16_put_(uint8_t *p, uint16_t v)
{
	v = htole16(v);
	memcpy(p, &v, 2);
}

/* Decodes 44 wire bytes (any alignment) into host order. Never fails; see vsock_hdr_check(). */
static inline void vsock_hdr_decode(const void *wire, struct vsock_hdr *h)
{
	const uint8_t *p = wire;

	h->src_cid = vsock_le64_get_(p + 0);
	h->dst_cid = vsock_le64_get_(p + 8);
	h->src_port = vsock_le32_get_(p + 16);
	h->dst_port = vsock_le32_get_(p + 20);
	h->len = vsock_le32_get_(p + 24);
	h->type = vsock_le16_get_(p + 28);
	h->op = vsock_le16_get_(p + 30);
	h->flags = vsock_le32_get_(p + 32);
	h->buf_alloc = vsock_le32_get_(p + 36);
	h->fwd_cnt = vsock_le32_get_(p + 40);
}

/* Encodes into 44 wire bytes (any alignment). */
static inline void vsock_hdr_encode(const struct vsock_hdr *h, void *wire)
{
	uint8_t *p = wire;

	vsock_le64_put_(p + 0, h->src_cid);
	vsock_le64_put_(p + 8, h->dst_cid);
	vsock_le32_put_(p + 16, h->src_port);
	vsock_le32_put_(p + 20, h->dst_port);
	vsock_le32_put_(p + 24, h->len);
	vsock_le16_put_(p + 28, h->type);
	vsock_le16_put_(p + 30, h->op);
	vsock_le32_put_(p + 32, h->flags);
	vsock_le32_put_(p + 36, h->buf_alloc);
	vsock_le32_put_(p + 40, h->fwd_cnt);
}

/* Why a packet was rejected; also the index of the engine's drop counters. */
enum vsock_hdr_error {
	VSOCK_HDR_OK = 0,
	VSOCK_HDR_BAD_CID,      /* upper 32 bits of a CID set, or a reserved source CID */
	VSOCK_HDR_BAD_TYPE,     /* neither STREAM nor SEQPACKET: answered with RST */
	VSOCK_HDR_BAD_OP,       /* op outside 0..7 */
	VSOCK_HDR_OVERSIZE,     /* len > VSOCK_MAX_PKT_PAYLOAD */
	VSOCK_HDR_BAD_LEN,      /* non-RW op with len != 0, or len differs from the payload given */
	VSOCK_HDR_BAD_FLAGS,    /* SHUTDOWN flags > 3; SEQPACKET RW flags > 3 or EOR without EOM
				 * (STREAM RW flags are ignored, as Linux does) */
	_VSOCK_HDR_ERROR_MAX,
};

const char *vsock_hdr_error_to_string(enum vsock_hdr_error e);
const char *vsock_op_to_string(unsigned op);
const char *vsock_type_to_string(unsigned type);

/*
 * Validates a decoded header against the payload length actually present. Checks, in this
 * order: CIDs, op, size, length, type, flags.
 * Returns VSOCK_HDR_OK or the first problem found. Pure function.
 */
enum vsock_hdr_error vsock_hdr_check(const struct vsock_hdr *h, size_t payload_len);

#endif
