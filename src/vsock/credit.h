/* SPDX-License-Identifier: MIT */
/*
 * Credit-based flow control (virtio 1.2 §5.10.6.3 "Buffer Space Management";
 * docs/vsock-protocol.md §3) as pure functions.
 *
 * All counters are free-running uint32_t that wrap modulo 2^32: tx_cnt (bytes we handed to the
 * transport), fwd_cnt (bytes our application consumed), and the peer's copies of its own. The
 * differences are taken modulo 2^32 and then widened to 64 bits before any comparison, so a wrap
 * at UINT32_MAX is harmless and a peer that shrinks buf_alloc below the bytes in flight (or
 * reports a nonsensical fwd_cnt) yields zero credit, never a huge one. These are the Linux fixes
 * "cap TX credit to local buffer size" (6.1.162) and the s64 clamp.
 */
#ifndef UVSOCK_VSOCK_CREDIT_H
#define UVSOCK_VSOCK_CREDIT_H

#include <stdbool.h>
#include <stdint.h>

#include "vsock/hdr.h"

/* Bytes we have sent that the peer's application has not consumed yet (modulo 2^32). */
static inline uint32_t vsock_credit_in_flight(uint32_t tx_cnt, uint32_t peer_fwd_cnt)
{
	return tx_cnt - peer_fwd_cnt;
}

/* The peer's buffer as we honour it: capped at our own buf_alloc (CVE-2026-23086). */
static inline uint32_t vsock_credit_peer_cap(uint32_t peer_buf_alloc, uint32_t own_buf_alloc)
{
	return peer_buf_alloc < own_buf_alloc ? peer_buf_alloc : own_buf_alloc;
}

/*
 * Bytes we may still send: min(peer_buf_alloc, own_buf_alloc) - (tx_cnt - peer_fwd_cnt),
 * computed in 64 bits and clamped at 0. For what send() may accept, own_buf_alloc is our current
 * buf_alloc; for pulling bytes send() already accepted, the largest buf_alloc of the connection,
 * so that lowering our buffer never strands them (docs/vsock-protocol.md §3, "Lowering the
 * buffer").
 */
static inline uint32_t vsock_credit_avail(uint32_t peer_buf_alloc, uint32_t own_buf_alloc,
					  uint32_t tx_cnt, uint32_t peer_fwd_cnt)
{
	int64_t avail = (int64_t)vsock_credit_peer_cap(peer_buf_alloc, own_buf_alloc) -
			(int64_t)vsock_credit_in_flight(tx_cnt, peer_fwd_cnt);

	return avail < 0 ? 0 : (uint32_t)avail;
}

/* Largest SEQPACKET message we accept for sending: min(peer buf_alloc, own buf_alloc). */
static inline uint32_t vsock_credit_max_msg(uint32_t peer_buf_alloc, uint32_t own_buf_alloc)
{
	return vsock_credit_peer_cap(peer_buf_alloc, own_buf_alloc);
}

/*
 * The buf_alloc a receiver advertises: its buf_alloc, except while the SEQPACKET message it holds
 * open (open_bytes received, no EOM yet) has reached it; then the largest buf_alloc it advertised
 * on the connection (rx_limit). That message was started under the larger value, only whole
 * messages are consumed, and with buf_alloc at or below the bytes in flight the sender would get
 * no credit ever again (docs/vsock-protocol.md §3, "Lowering the buffer").
 */
static inline uint32_t vsock_credit_adv(uint32_t buf_alloc, uint32_t rx_limit, uint32_t open_bytes)
{
	if (open_bytes > 0 && open_bytes >= buf_alloc && rx_limit > buf_alloc)
		return rx_limit;
	return buf_alloc;
}

/*
 * Receiver side: may a packet of `len` bytes be queued when `rx_bytes` are queued already and
 * the peer was promised `limit` bytes? False means the peer exceeded its credit.
 */
static inline bool vsock_credit_rx_fits(uint32_t rx_bytes, uint32_t len, uint32_t limit)
{
	return (uint64_t)rx_bytes + len <= limit;
}

/*
 * The per-packet overhead of a receive queue (docs/vsock-protocol.md §3, "Per-packet overhead").
 * Linux 6.12.92+ and 7.x (net/vmw_vsock/virtio_transport_common.c,
 * virtio_transport_inc_rx_pkt(), "vsock/virtio: fix potential unbounded skb queue") charge each
 * queued sk_buff SKB_TRUESIZE(0), 576 bytes on x86-64, and reset the connection (ENOBUFS) when a
 * packet does not fit. The first form of that check refuses a packet of len bytes unless
 *
 *     (queued packets + 1) * SKB_TRUESIZE(0) + queued bytes + len <= buf_alloc,
 *
 * the later one ("allow at most buf_alloc * 2") unless queued bytes + len <= buf_alloc and
 * (queued packets + 1) * SKB_TRUESIZE(0) <= buf_alloc.
 *
 * As a receiver we enforce the later form with VSOCK_RX_PKT_COST (vsock_credit_rx_pkt_fits); as
 * a sender we pace SEQPACKET messages by the first, stricter one with VSOCK_TX_PKT_COST, the
 * charge plus a third for kernel configurations with larger sk_buffs (the same margin as
 * src/device/h2g_budget.h), so that neither kind of Linux receiver nor ours ever resets us.
 */
#define VSOCK_RX_PKT_COST 576u
#define VSOCK_TX_PKT_COST 768u

/*
 * Receiver side: may one more SEQPACKET message start when `queued` whole messages wait to be
 * read and the peer was promised `limit` bytes? Linux counts the sk_buffs of its receive queue,
 * on every packet; we count messages, on the packet that opens one, as a message is consumed
 * only whole and the sender can pace only whole messages (vsock_credit_tx_paced). An empty
 * queue always takes one, unlike Linux, which with buf_alloc below SKB_TRUESIZE(0) refuses
 * every packet.
 */
static inline bool vsock_credit_rx_pkt_fits(uint32_t queued, uint32_t limit)
{
	return queued == 0 || ((uint64_t)queued + 1) * VSOCK_RX_PKT_COST <= limit;
}

/*
 * Sender side: may a SEQPACKET message of `len` bytes, going out as `pkts` packets, start now?
 * @cap: the credit limit (vsock_credit_peer_cap), @in_flight: bytes the peer has not reported
 * consumed, @out: packets of ours it may still hold. With nothing outstanding the message may
 * always start (it cannot get better; the credit alone then decides, as it does on Linux), so
 * a message as large as the peer's buffer never waits forever. Once started, a message's pieces
 * follow by credit alone: the receiver consumes only whole messages, so waiting for it to
 * consume part of one would never end.
 */
static inline bool vsock_credit_tx_paced(uint32_t cap, uint32_t in_flight, uint32_t out,
					 uint32_t pkts, uint32_t len)
{
	if (out == 0)
		return true;
	return ((uint64_t)out + pkts) * VSOCK_TX_PKT_COST + in_flight + len <= cap;
}

/*
 * Whether a STREAM receiver should send a CREDIT_UPDATE after its application consumed bytes
 * (Linux 6.1.76+, net/vmw_vsock/virtio_transport_common.c, virtio_transport_stream_do_dequeue();
 * docs/vsock-protocol.md §3, rule 1): something unannounced was consumed, and either the free space
 * the peer believes in is below one maximum packet (64 KiB) or the queue fell below rcvlowat.
 * The free space is computed in 64 bits so a buf_alloc smaller than the unannounced count (the
 * buffer was shrunk) counts as "low" instead of wrapping to a huge value.
 */
static inline bool vsock_credit_need_update(uint32_t buf_alloc, uint32_t fwd_cnt,
					    uint32_t last_fwd_cnt, uint32_t rx_bytes,
					    uint32_t rcvlowat)
{
	uint32_t unannounced = fwd_cnt - last_fwd_cnt;
	int64_t free_space = (int64_t)buf_alloc - (int64_t)unannounced;

	if (unannounced == 0)
		return false;
	return free_space < (int64_t)VSOCK_MAX_PKT_PAYLOAD || rx_bytes < rcvlowat;
}

#endif
