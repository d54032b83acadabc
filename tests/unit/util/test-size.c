/* SPDX-License-Identifier: MIT */
/* src/util/size.c: byte counts with K/M/G/T suffixes, bounds and every malformed form. */
#include "test.h"
#include "util/size.h"

static uint64_t ok(const char *s)
{
	uint64_t v = 12345;

	ASSERT_OK(size_parse(s, 0, UINT64_MAX, &v));
	return v;
}

TEST(numbers_and_suffixes)
{
	ASSERT_EQ_U64(ok("0"), 0);
	ASSERT_EQ_U64(ok("4096"), 4096);
	ASSERT_EQ_U64(ok("64K"), 65536);
	ASSERT_EQ_U64(ok("64k"), 65536);
	ASSERT_EQ_U64(ok("3M"), 3ull << 20);
	ASSERT_EQ_U64(ok("2g"), 2ull << 30);
	ASSERT_EQ_U64(ok("1T"), 1ull << 40);
	ASSERT_EQ_U64(ok("18446744073709551615"), UINT64_MAX);
	ASSERT_EQ_U64(ok("16777215T"), 16777215ull << 40);
}

TEST(malformed_and_out_of_range)
{
	static const char *const bad[] = { "", "K", "-1", "+1", " 1", "1 ", "1KB", "1KiB", "1P",
					   "1.5M", "0x10", "1K1" };
	uint64_t v = 7;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (size_parse(bad[i], 0, UINT64_MAX, &v) != -EINVAL)
			test_fail(__FILE__, __LINE__, "'%s' was accepted", bad[i]);
	}
	ASSERT_ERR(size_parse(NULL, 0, 1, &v), EINVAL);
	ASSERT_ERR(size_parse("18446744073709551616", 0, UINT64_MAX, &v), ERANGE);
	ASSERT_ERR(size_parse("16777216T", 0, UINT64_MAX, &v), ERANGE);
	ASSERT_ERR(size_parse("1023", 1024, 2048, &v), ERANGE);
	ASSERT_ERR(size_parse("3K", 1024, 2048, &v), ERANGE);
	ASSERT_EQ_U64(v, 7); /* untouched on error */
	ASSERT_OK(size_parse("2K", 1024, 2048, &v));
	ASSERT_EQ_U64(v, 2048);
}

TEST_MAIN()
