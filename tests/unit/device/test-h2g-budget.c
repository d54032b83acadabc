/* SPDX-License-Identifier: MIT */
/*
 * The host -> guest packet budget (src/device/h2g_budget.h) as pure arithmetic: an empty guest
 * queue takes the whole credit, bulk transfers lose at most H2G_PKT_COST bytes of it, small
 * packets shrink it, tiny ones (merged by the guest) do not, and whatever it allows keeps
 * Linux's per-packet overhead rule.
 */
#include "device/h2g_budget.h"
#include "test.h"

#define CAP (256u * 1024)
#define TRUESIZE 576 /* SKB_TRUESIZE(0) on x86-64 */

TEST(empty_queue_takes_the_whole_credit)
{
	ASSERT_EQ(h2g_budget(CAP, 0, 0, 0), CAP);
	ASSERT_EQ(h2g_budget(100, 0, 0, 0), 100u);
}

TEST(bulk_loses_at_most_one_cost_of_the_credit)
{
	ASSERT_EQ(h2g_budget(CAP, 4052, 4052, 0), CAP - 4052 - H2G_PKT_COST);
	ASSERT_EQ(h2g_budget(CAP, CAP - H2G_PKT_COST, CAP, 0), 0u);
	ASSERT_EQ(h2g_budget(CAP, CAP, CAP, 0), 0u);
	ASSERT_EQ(h2g_budget(CAP, (uint64_t)CAP + 10, 0, 0), 0u); /* peer shrank its buffer */
	/* big bytes beyond in_flight (the guest consumed some) count as in_flight */
	ASSERT_EQ(h2g_budget(CAP, 4052, 1u << 30, 0), h2g_budget(CAP, 4052, 4052, 0));
}

TEST(small_packets_shrink_the_budget_tiny_ones_do_not)
{
	ASSERT_EQ(h2g_budget(CAP, 100000, 0, 0), CAP - 100000);
	ASSERT_LT(h2g_budget(CAP, 100000, 0, 300), CAP - 100000);
	ASSERT_EQ(h2g_budget(CAP, 100000, 0, 600), 0u);
	/* no more small packets than in_flight holds at 129 bytes each */
	ASSERT_EQ(h2g_budget(CAP, 1290, 0, 1000), h2g_budget(CAP, 1290, 0, 10));
	ASSERT_TRUE(h2g_is_small(129));
	ASSERT_TRUE(h2g_is_small(H2G_PKT_COST - 1));
	ASSERT_FALSE(h2g_is_small(H2G_MERGE_LEN));
	ASSERT_FALSE(h2g_is_small(H2G_PKT_COST));
}

/* Packets of one size sent while the budget allows, none consumed: the guest's rule holds. */
TEST(what_it_allows_keeps_the_guest_rule)
{
	for (uint32_t len = H2G_MERGE_LEN + 1; len <= 4052; len += 7) {
		uint64_t queued = 0, big = 0, pkts = 0;
		uint32_t small = 0;

		while (h2g_budget(CAP, queued, big, small) >= len) {
			/* virtio_transport_inc_rx_pkt() */
			ASSERT_LE((pkts + 1) * TRUESIZE + queued + len, 2ull * CAP);
			queued += len;
			pkts++;
			small += h2g_is_small(len);
			big += len >= H2G_PKT_COST ? len : 0;
		}
		ASSERT_LE(queued, (uint64_t)CAP);
		ASSERT_GT(queued, (uint64_t)CAP / 4);
	}
}

TEST_MAIN()
