/* SPDX-License-Identifier: MIT */
/*
 * util/tune: the optimization switches' defaults, the list syntax (NAME, no-NAME,
 * busy-poll-us=N), refusal of unknown names with the previous state kept, and UVSOCK_TUNE.
 */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/tune.h"

TEST(defaults_all_on)
{
	const struct tune *t;

	unsetenv("UVSOCK_TUNE");
	t = tune_get();
	ASSERT_TRUE(t->zerocopy && t->tx_batch && t->event_idx && t->rx_batch);
	ASSERT_TRUE(t->credit_reduce && t->merge && t->pkt64k && t->rx_adaptive && t->direct_rx);
	ASSERT_TRUE(t->tx_direct);
	ASSERT_EQ(t->busy_poll_us, 0u);
}

TEST(list_sets_and_clears)
{
	char err[160];

	unsetenv("UVSOCK_TUNE");
	ASSERT_OK(tune_set("no-zerocopy,no-merge,busy-poll-us=50", err, sizeof(err)));
	ASSERT_FALSE(tune_get()->zerocopy);
	ASSERT_FALSE(tune_get()->merge);
	ASSERT_TRUE(tune_get()->event_idx);
	ASSERT_EQ(tune_get()->busy_poll_us, 50u);
	ASSERT_OK(tune_set("zerocopy,,", err, sizeof(err)));
	ASSERT_TRUE(tune_get()->zerocopy);
	ASSERT_FALSE(tune_get()->merge);
}

TEST(bad_item_refused_state_kept)
{
	char err[160];

	unsetenv("UVSOCK_TUNE");
	ASSERT_OK(tune_set("no-event-idx", err, sizeof(err)));
	ASSERT_EQ(tune_set("no-event-idx,bogus", err, sizeof(err)), -EINVAL);
	ASSERT_TRUE(strstr(err, "bogus") != NULL);
	ASSERT_EQ(tune_set("busy-poll-us=x", err, sizeof(err)), -EINVAL);
	ASSERT_EQ(tune_set("zerocopy=1", err, sizeof(err)), -EINVAL);
	ASSERT_FALSE(tune_get()->event_idx);
	ASSERT_EQ(tune_get()->busy_poll_us, 0u);
}

TEST(environment_read_first)
{
	char buf[256];

	setenv("UVSOCK_TUNE", "no-pkt64k,busy-poll-us=7", 1);
	ASSERT_FALSE(tune_get()->pkt64k);
	ASSERT_EQ(tune_get()->busy_poll_us, 7u);
	tune_describe(buf, sizeof(buf));
	ASSERT_TRUE(strstr(buf, "pkt64k=off") != NULL);
	ASSERT_TRUE(strstr(buf, "zerocopy=on") != NULL);
	ASSERT_TRUE(strstr(buf, "busy-poll-us=7") != NULL);
}

TEST_MAIN()
