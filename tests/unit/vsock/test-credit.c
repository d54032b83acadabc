/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the pure credit math of src/vsock/credit.h: wraparound of the free-running
 * counters, the cap at our own buf_alloc, a peer shrinking buf_alloc with bytes in flight, the
 * receive-side fit check, the credit-update rule of Linux 6.1.76+ and the buf_alloc a receiver
 * advertises while it holds an open SEQPACKET message.
 */
#include "test.h"
#include "vsock/credit.h"

TEST(avail_basic)
{
	ASSERT_EQ(vsock_credit_avail(262144, 262144, 0, 0), 262144);
	ASSERT_EQ(vsock_credit_avail(262144, 262144, 1000, 0), 262144 - 1000);
	ASSERT_EQ(vsock_credit_avail(262144, 262144, 1000, 1000), 262144);
	ASSERT_EQ(vsock_credit_avail(262144, 262144, 262144, 0), 0);
}

TEST(avail_wraps_at_uint32_max)
{
	uint32_t tx = UINT32_MAX - 99; /* 100 bytes before the wrap */
	uint32_t fwd = UINT32_MAX - 999;

	ASSERT_EQ(vsock_credit_in_flight(tx, fwd), 900);
	ASSERT_EQ(vsock_credit_avail(4096, 4096, tx, fwd), 4096 - 900);
	/* tx_cnt crosses zero, fwd_cnt has not yet. */
	tx += 200;
	ASSERT_EQ(tx, 100);
	ASSERT_EQ(vsock_credit_in_flight(tx, fwd), 1100);
	ASSERT_EQ(vsock_credit_avail(4096, 4096, tx, fwd), 4096 - 1100);
	/* Both crossed. */
	fwd += 1100;
	ASSERT_EQ(vsock_credit_avail(4096, 4096, tx, fwd), 4096);
}

TEST(avail_capped_at_own_buf_alloc)
{
	ASSERT_EQ(vsock_credit_avail(1u << 30, 65536, 0, 0), 65536);
	ASSERT_EQ(vsock_credit_avail(4096, 65536, 0, 0), 4096);
	ASSERT_EQ(vsock_credit_max_msg(1u << 30, 65536), 65536);
	ASSERT_EQ(vsock_credit_max_msg(100, 65536), 100);
}

TEST(peer_shrinks_buf_alloc_with_bytes_in_flight)
{
	/* 200 KiB in flight, then the peer announces a 64 KiB buffer: credit is 0, not 4 GiB. */
	uint32_t tx = 200 * 1024, fwd = 0;

	ASSERT_EQ(vsock_credit_avail(262144, 262144, tx, fwd), 262144 - 200 * 1024);
	ASSERT_EQ(vsock_credit_avail(65536, 262144, tx, fwd), 0);
	/* The peer consumes until in-flight is below its new size: credit comes back. */
	fwd = tx - 1000;
	ASSERT_EQ(vsock_credit_avail(65536, 262144, tx, fwd), 65536 - 1000);
	/* Across the wrap too. */
	tx = 5000;
	fwd = UINT32_MAX - 100000;
	ASSERT_EQ(vsock_credit_avail(65536, 262144, tx, fwd), 0);
	/* A peer reporting fwd_cnt ahead of what we sent gets no credit either. */
	ASSERT_EQ(vsock_credit_avail(65536, 262144, 100, 200), 0);
}

TEST(zero_credit_stall_and_resume)
{
	uint32_t buf = 4096, tx = 0, fwd = 0;

	tx += vsock_credit_avail(buf, 262144, tx, fwd);
	ASSERT_EQ(tx, 4096);
	ASSERT_EQ(vsock_credit_avail(buf, 262144, tx, fwd), 0);
	fwd += 1;
	ASSERT_EQ(vsock_credit_avail(buf, 262144, tx, fwd), 1);
	/* buf_alloc = 0 in a REQUEST starves the peer until it is raised. */
	ASSERT_EQ(vsock_credit_avail(0, 262144, 0, 0), 0);
	ASSERT_EQ(vsock_credit_avail(10, 262144, 0, 0), 10);
}

TEST(rx_fits)
{
	ASSERT_TRUE(vsock_credit_rx_fits(0, 65536, 65536));
	ASSERT_FALSE(vsock_credit_rx_fits(1, 65536, 65536));
	ASSERT_TRUE(vsock_credit_rx_fits(262143, 1, 262144));
	ASSERT_FALSE(vsock_credit_rx_fits(UINT32_MAX, 1, UINT32_MAX));
	ASSERT_FALSE(vsock_credit_rx_fits(10, UINT32_MAX, UINT32_MAX));
}

TEST(need_update_rule)
{
	const uint32_t ba = 262144;

	/* Nothing consumed since the last announcement: never. */
	ASSERT_FALSE(vsock_credit_need_update(ba, 500, 500, 0, 1));
	/* Queue drained (rx_bytes 0 < rcvlowat 1): yes. */
	ASSERT_TRUE(vsock_credit_need_update(ba, 600, 500, 0, 1));
	/* Data still queued and less than buf_alloc - 64 KiB unannounced: no. */
	ASSERT_FALSE(vsock_credit_need_update(ba, 500 + 1000, 500, 10, 1));
	/* Exactly buf_alloc - 64 KiB unannounced: free space 64 KiB, not below: no. */
	ASSERT_FALSE(vsock_credit_need_update(ba, ba - 65536, 0, 10, 1));
	ASSERT_TRUE(vsock_credit_need_update(ba, ba - 65536 + 1, 0, 10, 1));
	/* Below rcvlowat. */
	ASSERT_TRUE(vsock_credit_need_update(ba, 10, 0, 99, 100));
	ASSERT_FALSE(vsock_credit_need_update(ba, 10, 0, 100, 100));
	/* Counters across the wrap. */
	ASSERT_TRUE(vsock_credit_need_update(ba, 5, UINT32_MAX - 10, 0, 1));
	ASSERT_FALSE(vsock_credit_need_update(ba, 5, UINT32_MAX - 10, 10, 1));
	/* Shrunk buffer: more unannounced than buf_alloc counts as low, not as huge. */
	ASSERT_TRUE(vsock_credit_need_update(4096, 100000, 0, 10, 1));
}

TEST(adv_keeps_the_larger_buffer_for_an_open_message)
{
	/* Nothing open, or an open message below buf_alloc: buf_alloc itself. */
	ASSERT_EQ(vsock_credit_adv(16384, 262144, 0), 16384);
	ASSERT_EQ(vsock_credit_adv(16384, 262144, 16383), 16384);
	/* An open message that reached a lowered buf_alloc: the largest value advertised. */
	ASSERT_EQ(vsock_credit_adv(16384, 262144, 16384), 262144);
	ASSERT_EQ(vsock_credit_adv(16384, 262144, 100000), 262144);
	/* Never below buf_alloc, and a zero buffer with nothing open stays zero. */
	ASSERT_EQ(vsock_credit_adv(262144, 262144, 300000), 262144);
	ASSERT_EQ(vsock_credit_adv(262144, 4096, 300000), 262144);
	ASSERT_EQ(vsock_credit_adv(0, 262144, 0), 0);
}

TEST(per_packet_bounds)
{
	/* Receiver: an empty queue always takes one, even below one packet's charge. */
	ASSERT_TRUE(vsock_credit_rx_pkt_fits(0, 128));
	ASSERT_FALSE(vsock_credit_rx_pkt_fits(1, 128));
	/* (queued + 1) * 576 <= limit: 28 queued fit in 16 KiB (29 * 576 = 16704 > 16384). */
	ASSERT_TRUE(vsock_credit_rx_pkt_fits(27, 16384));
	ASSERT_FALSE(vsock_credit_rx_pkt_fits(28, 16384));
	/* No overflow for huge counts. */
	ASSERT_FALSE(vsock_credit_rx_pkt_fits(UINT32_MAX, UINT32_MAX));
	/* Sender: nothing outstanding, anything (the credit decides). */
	ASSERT_TRUE(vsock_credit_tx_paced(16384, 0, 0, 1, 16384));
	ASSERT_TRUE(vsock_credit_tx_paced(128, 100, 0, 4, 100));
	/* (out + pkts) * 768 + in_flight + len <= cap, at the edge: 21 * 768 + 20 + 236 = 16384. */
	ASSERT_TRUE(vsock_credit_tx_paced(16384, 20, 20, 1, 236));
	ASSERT_FALSE(vsock_credit_tx_paced(16384, 20, 20, 1, 237));
	ASSERT_FALSE(vsock_credit_tx_paced(16384, 20, 19, 2, 237));
	ASSERT_FALSE(vsock_credit_tx_paced(UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX, 1));
}

TEST_MAIN()
