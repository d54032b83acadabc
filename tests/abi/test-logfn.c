/* SPDX-License-Identifier: MIT */
/*
 * uvsock_set_log_fn(): the library's lines (log_msg and the rate-limited log_guest path of
 * src/util/log.c) reach the callback with their level and no prefix, only those the level lets
 * through; NULL brings stderr back; a level out of range is EINVAL and changes nothing.
 */
#include <uvsock/uvsock.h>

#include "stderr-capture.h"
#include "test.h"
#include "util/log.h"

static char got[8][128];
static int got_level[8];
static int ngot;

static void record(int level, const char *msg)
{
	if (ngot < 8) {
		snprintf(got[ngot], sizeof(got[ngot]), "%s", msg);
		got_level[ngot] = level;
	}
	ngot++;
}

TEST(callback_gets_lines_at_level)
{
	int err = capture_stderr();

	ASSERT_EQ(uvsock_set_log_fn(record, UVSOCK_LOG_WARN), 0);
	log_msg(LOG_LVL_WARN, "host listener %s: %d", "x", 13);
	log_info("an info line the level filters out");
	log_error("an error");
	log_guest(LOG_LVL_WARN, "a guest-triggered line");
	ASSERT_EQ(ngot, 3);
	ASSERT_STREQ(got[0], "host listener x: 13");
	ASSERT_EQ(got_level[0], UVSOCK_LOG_WARN);
	ASSERT_STREQ(got[1], "an error");
	ASSERT_EQ(got_level[1], UVSOCK_LOG_ERROR);
	ASSERT_STREQ(got[2], "a guest-triggered line");
	ASSERT_STREQ(captured(err), "");
}

TEST(debug_level_and_back_to_stderr)
{
	int err = capture_stderr();

	ASSERT_EQ(uvsock_set_log_fn(record, UVSOCK_LOG_DEBUG), 0);
	log_debug("debug %u", 7u);
	ASSERT_EQ(ngot, 1);
	ASSERT_EQ(got_level[0], UVSOCK_LOG_DEBUG);
	ASSERT_EQ(uvsock_set_log_fn(NULL, UVSOCK_LOG_INFO), 0);
	log_info("to stderr again");
	log_debug("filtered");
	ASSERT_EQ(ngot, 1);
	ASSERT_TRUE(strstr(captured(err), "to stderr again\n") != NULL);
	ASSERT_TRUE(strstr(captured(err), "filtered") == NULL);
}

TEST(bad_level_is_einval)
{
	ASSERT_EQ(uvsock_set_log_fn(record, UVSOCK_LOG_ERROR), 0);
	errno = 0;
	ASSERT_EQ(uvsock_set_log_fn(NULL, UVSOCK_LOG_DEBUG + 1), -1);
	ASSERT_EQ(errno, EINVAL);
	ASSERT_EQ(uvsock_set_log_fn(NULL, -1), -1);
	ASSERT_EQ(errno, EINVAL);
	/* Nothing changed: the callback and level ERROR are still in place. */
	log_warn("filtered");
	log_error("kept");
	ASSERT_EQ(ngot, 1);
	ASSERT_STREQ(got[0], "kept");
}

TEST_MAIN()
