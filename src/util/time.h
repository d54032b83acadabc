/* SPDX-License-Identifier: MIT */
/*
 * The one monotonic clock of the tree. Every module that needs "now" for timeouts, rate limits
 * or statistics calls mono_ns(); the engine takes its time from a callback (engine.h), which the
 * transports implement with this.
 */
#ifndef UVSOCK_UTIL_TIME_H
#define UVSOCK_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

#define NS_PER_MS 1000000ull
#define NS_PER_SEC 1000000000ull

/* CLOCK_MONOTONIC in nanoseconds. Any thread. */
static inline uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mono_ms(void)
{
	return mono_ns() / NS_PER_MS;
}

/* The absolute CLOCK_MONOTONIC time ns nanoseconds from now, as a timespec. */
static inline struct timespec mono_deadline_ts(uint64_t ns_from_now)
{
	uint64_t t = mono_ns() + ns_from_now;

	return (struct timespec){ .tv_sec = (time_t)(t / NS_PER_SEC), .tv_nsec = (long)(t % NS_PER_SEC) };
}

#endif
