/* SPDX-License-Identifier: MIT */
/*
 * util/log: level names and the rate limiter, whose windows are driven by a fake clock
 * (log_set_clock) instead of by sleeping. stderr is redirected to a memfd in each (forked) case.
 */
#include "stderr-capture.h"
#include "test.h"
#include "util/log.h"

#define BURST 10         /* log.c RL_BURST */
#define INTERVAL_MS 5000 /* log.c RL_INTERVAL_MS */

static uint64_t fake_ms = 1000000;

static uint64_t fake_now_ms(void)
{
	return fake_ms;
}

TEST(level_from_string)
{
	ASSERT_EQ(log_level_from_string("debug"), LOG_LVL_DEBUG);
	ASSERT_EQ(log_level_from_string("error"), LOG_LVL_ERROR);
	ASSERT_ERR(log_level_from_string("loud"), EINVAL);
}

TEST(ratelimit_suppresses_after_burst)
{
	struct log_ratelimit rl = {0};

	log_set_clock(fake_now_ms);
	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 25; i++)
		log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", i);
	ASSERT_EQ(rl.printed, BURST);
	ASSERT_EQ(rl.suppressed, 15);
}

/* The window ends exactly INTERVAL_MS after it began; the next message reports the count. */
TEST(ratelimit_window_reports_suppressed)
{
	struct log_ratelimit rl = {0};
	int fd = capture_stderr();

	log_set_clock(fake_now_ms);
	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 25; i++)
		log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", i);
	fake_ms += INTERVAL_MS - 1;
	log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", 100);
	ASSERT_EQ(rl.suppressed, 16);
	ASSERT_TRUE(strstr(captured(fd), "suppressed") == NULL);
	fake_ms += 1;
	log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", 200);
	const char *out = captured(fd);
	ASSERT_TRUE(strstr(out, "uvsock warn: 16 similar messages suppressed\n") != NULL);
	ASSERT_TRUE(strstr(out, "uvsock warn: guest message 200\n") != NULL);
	ASSERT_TRUE(strstr(out, "guest message 100\n") == NULL);
	ASSERT_EQ(rl.printed, 1);
	ASSERT_EQ(rl.suppressed, 0);
	/* A quiet window reports nothing. */
	fake_ms += INTERVAL_MS;
	log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", 300);
	ASSERT_TRUE(strstr(captured(fd), "0 similar") == NULL);
}

/* NULL puts the real clock back: a zeroed state then opens a fresh window at once. */
TEST(ratelimit_real_clock_restored)
{
	struct log_ratelimit rl = {0};

	fake_ms = 0;
	log_set_clock(fake_now_ms);
	log_set_clock(NULL);
	log_set_level(LOG_LVL_INFO);
	log_ratelimited(&rl, LOG_LVL_WARN, "guest message %d", 0);
	ASSERT_TRUE(rl.window_start_ms > 0);
}

TEST_MAIN()
