/* SPDX-License-Identifier: MIT */
/*
 * util/log: level names and the rate limiter, whose windows are driven by a fake clock
 * (log_set_clock) instead of by sleeping; the line prefixes of log_setup (journald priorities
 * when JOURNAL_STREAM names stderr, timestamps otherwise). stderr is redirected to a memfd in
 * each (forked) case.
 */
#include <sys/stat.h>

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

TEST(journald_priority_prefix_when_stderr_is_the_journal)
{
	int fd = capture_stderr();
	char js[64];
	struct stat st;

	ASSERT_OK(fstat(2, &st));
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	setenv("JOURNAL_STREAM", js, 1);
	ASSERT_TRUE(log_setup("uvsockd"));
	log_set_level(LOG_LVL_DEBUG);
	log_error("e %d", 1);
	log_warn("w");
	log_info("i");
	log_debug("d");
	ASSERT_STREQ(captured(fd), "<3>uvsockd error: e 1\n<4>uvsockd warn: w\n"
				   "<6>uvsockd info: i\n<7>uvsockd debug: d\n");
}

TEST(timestamps_when_stderr_is_not_the_journal)
{
	int fd = capture_stderr();
	const char *out;

	/* Another file's device:inode, or garbage: not the journal. */
	setenv("JOURNAL_STREAM", "1:1", 1);
	ASSERT_FALSE(log_setup("uvsockd"));
	setenv("JOURNAL_STREAM", "x", 1);
	ASSERT_FALSE(log_setup("uvsockd"));
	log_set_level(LOG_LVL_INFO);
	log_warn("hello");
	out = captured(fd);
	/* 2026-12-01T23:30:00.123Z uvsockd warn: hello */
	ASSERT_EQ(strlen(out), 24 + 1 + strlen("uvsockd warn: hello\n"));
	ASSERT_TRUE(out[4] == '-' && out[7] == '-' && out[10] == 'T' && out[13] == ':' &&
		    out[19] == '.' && out[23] == 'Z');
	ASSERT_STREQ(out + 25, "uvsockd warn: hello\n");
}

TEST(default_lines_have_the_library_tag_only)
{
	int fd = capture_stderr();

	log_set_level(LOG_LVL_INFO);
	log_emit(LOG_LVL_WARN, "plain");
	ASSERT_STREQ(captured(fd), "uvsock warn: plain\n");
}

TEST_MAIN()
