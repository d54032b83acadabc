/* SPDX-License-Identifier: MIT */
/*
 * Host -> guest packet budget: how much payload the device may put into the next RX packet of a
 * stream connection so that a Linux guest never resets it for the per-packet overhead of its
 * receive queue (docs/performance.md §7, "Small host writes and the guest's per-packet
 * overhead"). Pure functions, no locking; the caller (src/device/host_uds.c, device thread)
 * keeps the per-connection state.
 *
 * The guest's rule (net/vmw_vsock/virtio_transport_common.c, virtio_transport_inc_rx_pkt(),
 * since "vsock/virtio: fix potential unbounded skb queue", 2026, and its stable back-ports): a
 * packet of len bytes is refused, and the connection reset, unless
 *
 *     (queued packets + 1) * SKB_TRUESIZE(0) + queued bytes + len <= 2 * buf_alloc
 *
 * besides the credit rule (queued bytes + len <= buf_alloc). Kernels that also carry "collapse
 * receive queue under memory pressure" merge small queued packets before the check; older ones
 * do not, and a stream of 129..512-byte packets (above the 128-byte merge of small packets into
 * the queue's tail) reaches the limit at about half the credit.
 *
 * What the device knows: in_flight = tx_cnt - peer_fwd_cnt (at least the bytes queued in the
 * guest) and the packets it sent. It sorts them by the guest's cost:
 *   - big (at least H2G_PKT_COST bytes): overhead no more than payload; @big counts their bytes
 *     that may still be queued (never more than in_flight);
 *   - tiny (at most H2G_MERGE_LEN bytes): the guest appends them to the queue's last packet when
 *     that one has room (virtio_transport_recv_enqueue(), GOOD_COPY_LEN), which every packet but
 *     a nearly full one has, and a nearly full one is big enough (more than 2 * H2G_PKT_COST)
 *     to cover the one after it too; only a tiny packet opening an empty queue costs extra;
 *   - small (the sizes in between): @small counts them (never more than in_flight / 129).
 * A count is dropped once peer_fwd_cnt passes the last packet it counted. A read of L bytes
 * becomes packets that each fill a guest RX buffer (at most the last one is not big), so every
 * one of them meets the guest's rule if
 *
 *     big + in_flight + 2 * L + (small + 2) * H2G_PKT_COST <= 2 * cap
 *
 * (cap <= the guest's buf_alloc), and the credit rule if L <= cap - in_flight. The bound depends
 * only on the state before the read, so the RX path asks for as many guest buffers as it then
 * fills. Into an empty queue (in_flight 0) the whole credit may go. Bulk transfers lose the last
 * H2G_PKT_COST bytes of credit at most; with many small packets queued the host's bytes wait in
 * its socket and leave as fewer, larger packets once the guest has consumed some (coalescing).
 * Guests whose RX buffers are smaller than 2 * H2G_PKT_COST (not Linux: 4 KiB, 3776 bytes since
 * 6.17) are not covered. A guest program that waits (SO_RCVLOWAT) for more than the budget lets
 * through sends no credit update, so nothing more comes until it reads (docs/performance.md §7).
 */
#ifndef UVSOCK_DEVICE_H2G_BUDGET_H
#define UVSOCK_DEVICE_H2G_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Per-packet cost charged for the guest's sk_buff: SKB_TRUESIZE(0), 576 on x86-64, + a third. */
#define H2G_PKT_COST 768u
/* Packets up to this size join the guest's previous queued packet (GOOD_COPY_LEN). */
#define H2G_MERGE_LEN 128u

/* Whether a packet of @len payload bytes counts as small for h2g_budget. */
static inline bool h2g_is_small(size_t len)
{
	return len > H2G_MERGE_LEN && len < H2G_PKT_COST;
}

/*
 * The most bytes the next read may send as packets (0: wait until the guest consumes).
 * @cap: the credit limit (the guest's buf_alloc: the device's window, docs/vsock-protocol.md
 * §3); @in_flight: bytes sent (or queued to send) that the guest has not reported consumed;
 * @big: bytes of packets of at least H2G_PKT_COST it may still hold; @small: packets it may
 * still hold for which h2g_is_small().
 */
static inline uint32_t h2g_budget(uint32_t cap, uint64_t in_flight, uint64_t big, uint32_t small)
{
	int64_t in = (int64_t)in_flight, b;
	int64_t nb = big < in_flight ? (int64_t)big : in;
	int64_t ns = (int64_t)small < in / (H2G_MERGE_LEN + 1) ? (int64_t)small
							       : in / (H2G_MERGE_LEN + 1);

	if (in_flight == 0)
		return cap;
	b = (2 * (int64_t)cap - nb - in - (ns + 2) * H2G_PKT_COST) / 2;
	if (b > (int64_t)cap - in)
		b = (int64_t)cap - in;
	return b > 0 ? (uint32_t)b : 0;
}

#endif
