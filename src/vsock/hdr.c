/* SPDX-License-Identifier: MIT */
/*
 * Validation of decoded virtio-vsock headers and the name tables used in logs, counters and
 * tests. The header layout itself lives in hdr.h.
 *
 * Security model: vsock_hdr_check() is the first thing the engine does with every packet a peer
 * sends; it is pure, never trusts any field, and reports the first problem found so that the
 * engine can count drops by reason.
 */
#include "vsock/hdr.h"

#include "util/macros.h"

static const char *const hdr_error_names[_VSOCK_HDR_ERROR_MAX] = {
	[VSOCK_HDR_OK] = "ok",
	[VSOCK_HDR_BAD_CID] = "bad-cid",
	[VSOCK_HDR_BAD_TYPE] = "bad-type",
	[VSOCK_HDR_BAD_OP] = "bad-op",
	[VSOCK_HDR_OVERSIZE] = "oversize",
	[VSOCK_HDR_BAD_LEN] = "bad-len",
	[VSOCK_HDR_BAD_FLAGS] = "bad-flags",
};

static const char *const op_names[_VSOCK_OP_MAX] = {
	[VSOCK_OP_INVALID] = "INVALID",
	[VSOCK_OP_REQUEST] = "REQUEST",
	[VSOCK_OP_RESPONSE] = "RESPONSE",
	[VSOCK_OP_RST] = "RST",
	[VSOCK_OP_SHUTDOWN] = "SHUTDOWN",
	[VSOCK_OP_RW] = "RW",
	[VSOCK_OP_CREDIT_UPDATE] = "CREDIT_UPDATE",
	[VSOCK_OP_CREDIT_REQUEST] = "CREDIT_REQUEST",
};

const char *vsock_hdr_error_to_string(enum vsock_hdr_error e)
{
	if ((unsigned)e >= ARRAY_SIZE(hdr_error_names))
		return "unknown";
	return hdr_error_names[e];
}

const char *vsock_op_to_string(unsigned op)
{
	if (op >= ARRAY_SIZE(op_names))
		return "unknown";
	return op_names[op];
}

const char *vsock_type_to_string(unsigned type)
{
	switch (type) {
	case VSOCK_TYPE_STREAM:
		return "STREAM";
	case VSOCK_TYPE_SEQPACKET:
		return "SEQPACKET";
	default:
		return "unknown";
	}
}

enum vsock_hdr_error vsock_hdr_check(const struct vsock_hdr *h, size_t payload_len)
{
	/* CIDs are 32-bit in Linux; the upper half is reserved. CID_ANY is never a source. */
	if ((h->src_cid >> 32) != 0 || (h->dst_cid >> 32) != 0 || h->src_cid == VMADDR_CID_ANY)
		return VSOCK_HDR_BAD_CID;
	if (h->op >= _VSOCK_OP_MAX)
		return VSOCK_HDR_BAD_OP;
	if (h->len > VSOCK_MAX_PKT_PAYLOAD)
		return VSOCK_HDR_OVERSIZE;
	if (h->len != payload_len)
		return VSOCK_HDR_BAD_LEN;
	if (h->op != VSOCK_OP_RW && h->len != 0)
		return VSOCK_HDR_BAD_LEN;
	if (h->type != VSOCK_TYPE_STREAM && h->type != VSOCK_TYPE_SEQPACKET)
		return VSOCK_HDR_BAD_TYPE;
	if (h->op == VSOCK_OP_SHUTDOWN && (h->flags & ~VSOCK_SHUTDOWN_MASK) != 0)
		return VSOCK_HDR_BAD_FLAGS;
	if (h->op == VSOCK_OP_RW && h->type == VSOCK_TYPE_SEQPACKET &&
	    ((h->flags & ~(VSOCK_SEQ_EOM | VSOCK_SEQ_EOR)) != 0 ||
	     (h->flags & (VSOCK_SEQ_EOM | VSOCK_SEQ_EOR)) == VSOCK_SEQ_EOR))
		return VSOCK_HDR_BAD_FLAGS;
	return VSOCK_HDR_OK;
}
