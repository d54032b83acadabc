/* SPDX-License-Identifier: MIT */
/*
 * The receive queue of one socket: received payload bytes, held in a list of chunks until the
 * application reads them (docs/vsock-protocol.md §4). A payload of at most VSOCK_GOOD_COPY_LEN
 * bytes is merged into the tail chunk when it fits (as Linux virtio_transport_recv_enqueue()
 * does); the memory the queue allocates, counting RX_CHUNK_OVERHEAD per chunk, is bounded by
 * vsock_rxq_mem_limit(); a STREAM queue that would cross the bound is compacted into one chunk
 * first. A few emptied chunks are kept as spares for the next payloads that fit them.
 *
 * A plain data structure: no locks (the owner serialises; the engine holds the socket lock), no
 * credit (the caller checks a payload against the credit it gave before pushing it), no sockets.
 * An all-zero struct vsock_rxq is an empty queue.
 */
#ifndef UVSOCK_VSOCK_RXQ_H
#define UVSOCK_VSOCK_RXQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vsock/hdr.h"

/* A received payload buffer. */
struct rx_chunk {
	struct rx_chunk *next;
	uint32_t cap;   /* bytes allocated in data[] */
	uint32_t start; /* first unread byte */
	uint32_t end;   /* one past the last written byte */
	uint8_t eom;    /* SEQPACKET: this chunk ends a message */
	uint8_t eor;    /* SEQPACKET: that message carried EOR */
	uint8_t data[];
};
/* What one chunk costs besides its payload room: the struct and a malloc header. */
#define RX_CHUNK_OVERHEAD ((uint32_t)sizeof(struct rx_chunk) + 16u)
/* Room given to a new chunk started by a small payload, so later small ones merge into it. */
#define RX_SMALL_CHUNK 4096u
/*
 * Emptied chunks a queue keeps as spares for the next payloads that fit them (within the
 * queue's bound, counted in mem once reused), so a steady flow allocates nothing per packet:
 * at most RX_SPARES chunks of at most RX_SPARE_MAX room each, outside mem (a burst of a few
 * 64 KiB packets between two reads, the credit a Linux peer gives, reuses them all).
 */
#define RX_SPARE_MAX VSOCK_MAX_PKT_PAYLOAD
#define RX_SPARES 4u

struct vsock_rxq {
	struct rx_chunk *head, *tail;
	struct rx_chunk *spare; /* emptied chunks kept for reuse (cap <= RX_SPARE_MAX), a list */
	uint32_t n_spare;       /* chunks on spare, at most RX_SPARES */
	uint64_t mem;           /* room of the queued chunks plus RX_CHUNK_OVERHEAD each */
	uint32_t bytes;         /* payload bytes queued, not yet read */
	uint32_t msgs;          /* SEQPACKET: whole messages queued (chunks with eom) */
	uint32_t open_bytes;    /* SEQPACKET: bytes of the message still open at the tail (no eom) */
	bool no_merge;          /* set by the owner: small payloads get chunks of their own (the
				 * "merge" switch of src/util/tune.h off); kept by vsock_rxq_free */
};

/*
 * The bound on mem for a queue whose owner promised the peer at most rx_limit bytes:
 * 2 * rx_limit + one maximum packet + two chunk overheads.
 */
uint64_t vsock_rxq_mem_limit(uint32_t rx_limit);

/*
 * Appends len bytes read from iov (which holds at least len). seqpacket: the queue holds
 * messages (never compacted); eom: this payload ends one, eor: with EOR (eom only). len may be
 * 0 with eom (an empty message). rx_limit is the credit given, for vsock_rxq_mem_limit().
 * Copies; borrows iov for the call only.
 * Returns 0, -ENOBUFS (the memory bound would be crossed: the caller resets the connection),
 * -ENOMEM. On error the queue is unchanged.
 */
int vsock_rxq_push(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt, uint32_t len,
		   bool seqpacket, bool eom, bool eor, uint32_t rx_limit);

/*
 * STREAM: copies up to len queued bytes into iov (iovcnt 0: none are copied) and, unless peek,
 * consumes them. Returns the number of bytes consumed (or, with peek, that would have been).
 */
uint32_t vsock_rxq_read(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt,
			uint32_t len, bool peek);

/*
 * SEQPACKET: copies the first message into iov, as much as fits, and unless peek consumes all of
 * it. *ret_copied gets the bytes copied, *ret_eor whether the message carried EOR.
 * Returns the message length (0 with nothing copied if no whole message is queued).
 */
uint32_t vsock_rxq_read_msg(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt,
			    bool peek, uint32_t *ret_copied, bool *ret_eor);

/*
 * Fills up to iovcnt entries of iov with the queued bytes, in order, one entry per non-empty
 * chunk, without consuming them. Returns the bytes described. The entries point into the queue:
 * they stay valid until the next push, read or free.
 */
size_t vsock_rxq_peek_iov(const struct vsock_rxq *q, struct iovec *iov, size_t iovcnt);

/* Frees every chunk and the spares; the queue is empty (zeroed but for no_merge) afterwards. */
void vsock_rxq_free(struct vsock_rxq *q);

#endif
