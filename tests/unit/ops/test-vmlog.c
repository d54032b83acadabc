/* SPDX-License-Identifier: MIT */
/*
 * log_vm(): tags and per-VM rate limiting. stderr is redirected to a memfd in each (forked) case
 * and the lines are counted.
 */
#include "stderr-capture.h"
#include "ops/vmlog.h"
#include "test.h"

static int count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* One call site, as a device would have for "guest sent garbage". */
static void guest_bad_packet(uint32_t cid, uint32_t lp, uint32_t pp, int i)
{
	log_vm(LOG_LVL_WARN, cid, lp, pp, "bad packet %d", i);
}

TEST(tags_every_line)
{
	int fd = capture_stderr();

	log_set_level(LOG_LVL_INFO);
	guest_bad_packet(3, 1234, 5000, 7);
	log_vm_dev(LOG_LVL_ERROR, 9, "ring error: %s", "bad index");
	const char *out = captured(fd);
	ASSERT_TRUE(strstr(out, "uvsock warn: vm=3 lp=1234 pp=5000: bad packet 7\n") != NULL);
	ASSERT_TRUE(strstr(out, "uvsock error: vm=9: ring error: bad index\n") != NULL);
}

TEST(guest_flood_is_suppressed)
{
	int fd = capture_stderr();

	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 5000; i++)
		guest_bad_packet(3, 1234, 5000, i);
	const char *out = captured(fd);
	ASSERT_EQ(count(out, "vm=3 lp=1234 pp=5000: bad packet"), 10);
	ASSERT_TRUE(strstr(out, "bad packet 9\n") != NULL);
	ASSERT_TRUE(strstr(out, "bad packet 10\n") == NULL);
}

TEST(flood_from_one_vm_does_not_silence_another)
{
	int fd = capture_stderr();

	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 1000; i++)
		guest_bad_packet(3, 1, 2, i);
	for (int i = 0; i < 5; i++)
		guest_bad_packet(4, 1, 2, i);
	const char *out = captured(fd);
	ASSERT_EQ(count(out, "vm=3 lp=1 pp=2:"), 10);
	ASSERT_EQ(count(out, "vm=4 lp=1 pp=2:"), 5);
}

TEST(below_level_prints_nothing)
{
	int fd = capture_stderr();

	log_set_level(LOG_LVL_ERROR);
	guest_bad_packet(3, 1, 2, 0);
	ASSERT_STREQ(captured(fd), "");
}

static uint64_t fake_ms = 1000000;

static uint64_t fake_now_ms(void)
{
	return fake_ms;
}

/* The suppressed count is reported once the 5 s window has passed (on a fake clock). */
TEST(suppressed_count_reported_after_window)
{
	int fd = capture_stderr();

	log_set_clock(fake_now_ms);
	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 110; i++)
		guest_bad_packet(5, 1, 2, i);
	fake_ms += 5000;
	guest_bad_packet(5, 1, 2, 999);
	const char *out = captured(fd);
	ASSERT_TRUE(strstr(out, "100 similar messages suppressed") != NULL);
	ASSERT_TRUE(strstr(out, "vm=5 lp=1 pp=2: bad packet 999\n") != NULL);
	ASSERT_EQ(count(out, "vm=5 lp=1 pp=2:"), 11);
}

TEST_MAIN()
