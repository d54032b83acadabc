/* SPDX-License-Identifier: MIT */
/*
 * Minimal test harness: TEST() registers a case, ASSERT_*() print both values on failure,
 * the runner prints TAP ("ok N - name" / "not ok N - name") and exits 1 if anything failed,
 * 77 if every case skipped. Options: --list, --pick NAME (repeatable), --skip NAME (repeatable).
 *
 * Each case runs in a forked child with a time limit (TEST_TIMEOUT_S, default 60 s; env
 * UVSOCK_TEST_TIMEOUT overrides), so a crash, a hang or a failed assertion in any thread of one
 * case never takes the others down. UVSOCK_TEST_NOFORK=1 runs cases in-process (for gdb).
 */
#ifndef UVSOCK_TEST_H
#define UVSOCK_TEST_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);

void test_register(const char *name, test_fn fn);
int test_main(int argc, char **argv);
__attribute__((noreturn)) void test_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Ends the current case as skipped (exit 77 semantics for that case). */
__attribute__((noreturn)) void test_skip(const char *why);
/* Prints a TAP diagnostic line ("# ..."). */
void test_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TEST(name)                                                                                 \
	static void test_##name(void);                                                             \
	__attribute__((constructor)) static void test_reg_##name(void)                             \
	{                                                                                          \
		test_register(#name, test_##name);                                                 \
	}                                                                                          \
	static void test_##name(void)

#define TEST_MAIN()                                                                                \
	int main(int argc, char **argv)                                                            \
	{                                                                                          \
		return test_main(argc, argv);                                                      \
	}

#define ASSERT_TRUE(c)                                                                             \
	do {                                                                                       \
		if (!(c))                                                                          \
			test_fail(__FILE__, __LINE__, "ASSERT_TRUE(%s)", #c);                      \
	} while (0)
#define ASSERT_FALSE(c) ASSERT_TRUE(!(c))

#define ASSERT_CMP_(a, op, b)                                                                      \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		if (!(a_ op b_))                                                                   \
			test_fail(__FILE__, __LINE__, "%s %s %s: %lld vs %lld", #a, #op, #b, a_,   \
				  b_);                                                             \
	} while (0)
#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b)

/* Unsigned 64-bit comparison, for counters that may exceed LLONG_MAX. */
#define ASSERT_EQ_U64(a, b)                                                                        \
	do {                                                                                       \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                   \
		if (a_ != b_)                                                                      \
			test_fail(__FILE__, __LINE__, "%s == %s: %" PRIu64 " vs %" PRIu64, #a, #b, \
				  a_, b_);                                                         \
	} while (0)

/* r is a 0/positive success or a -errno: assert success. */
#define ASSERT_OK(r)                                                                               \
	do {                                                                                       \
		long long r_ = (long long)(r);                                                     \
		if (r_ < 0)                                                                        \
			test_fail(__FILE__, __LINE__, "%s failed: %lld (%s)", #r, r_,              \
				  strerror((int)-r_));                                             \
	} while (0)

/* r is a -errno result: assert it equals -e. */
#define ASSERT_ERR(r, e)                                                                           \
	do {                                                                                       \
		long long r_ = (long long)(r);                                                     \
		if (r_ != -(long long)(e))                                                         \
			test_fail(__FILE__, __LINE__, "%s: expected -%s, got %lld (%s)", #r, #e,   \
				  r_, r_ < 0 ? strerror((int)-r_) : "success");                    \
	} while (0)

#define ASSERT_STREQ(a, b)                                                                         \
	do {                                                                                       \
		const char *a_ = (a), *b_ = (b);                                                   \
		if (strcmp(a_, b_) != 0)                                                           \
			test_fail(__FILE__, __LINE__, "%s == %s: '%s' vs '%s'", #a, #b, a_, b_);   \
	} while (0)

#define ASSERT_MEMEQ(a, b, n)                                                                      \
	do {                                                                                       \
		if (memcmp((a), (b), (n)) != 0)                                                    \
			test_fail(__FILE__, __LINE__, "memcmp(%s, %s, %s) != 0", #a, #b, #n);      \
	} while (0)

/* xorshift64: the next of a fixed pseudo-random sequence (*state != 0), for the fuzz loops. */
static inline uint64_t test_xorshift64(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*state = x;
	return x;
}

/*
 * Polls cond every millisecond until it holds or timeout_ms passes; true if it held. For
 * conditions another thread or process makes true (a counter, a file, a state): tests wait on
 * the event itself, never on a fixed sleep. The bound keeps a hang from eating the case's limit.
 */
#define WAIT_FOR(cond, timeout_ms)                                                                 \
	({                                                                                         \
		uint64_t until_ = test_now_ms() + (uint64_t)(timeout_ms);                          \
		bool ok_;                                                                          \
		while (!(ok_ = (cond)) && test_now_ms() < until_)                                  \
			test_sleep_ms(1);                                                          \
		ok_;                                                                               \
	})
/* WAIT_FOR that fails the case, naming the condition, when the time runs out. */
#define ASSERT_WAIT_FOR(cond, timeout_ms)                                                          \
	do {                                                                                       \
		if (!WAIT_FOR(cond, timeout_ms))                                                   \
			test_fail(__FILE__, __LINE__, "timed out after %u ms waiting for %s",      \
				  (unsigned)(timeout_ms), #cond);                                  \
	} while (0)
/* Sleeps ms milliseconds (restarted on EINTR). */
void test_sleep_ms(unsigned ms);
/* CLOCK_MONOTONIC in milliseconds: mono_ms() of src/util/time.h, for test files. */
uint64_t test_now_ms(void);

#endif
