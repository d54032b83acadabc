/* SPDX-License-Identifier: MIT */
#include "test.h"
#include "util/log.h"

TEST(level_from_string)
{
	ASSERT_EQ(log_level_from_string("debug"), LOG_LVL_DEBUG);
	ASSERT_EQ(log_level_from_string("error"), LOG_LVL_ERROR);
	ASSERT_ERR(log_level_from_string("loud"), EINVAL);
}

TEST(ratelimit_suppresses_after_burst)
{
	struct log_ratelimit rl = {0};

	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 25; i++)
		log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", i);
	ASSERT_EQ(rl.printed, 10);
	ASSERT_EQ(rl.suppressed, 15);
}

TEST_MAIN()
