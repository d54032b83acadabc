/* SPDX-License-Identifier: MIT */
/* Logging to stderr with a level and per-call-site rate limiting. */
#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util/time.h"

#define RL_BURST 10
#define RL_INTERVAL_MS 5000

static _Atomic(enum log_level) cur_level = LOG_LVL_INFO; /* relaxed: orders nothing else */
static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *const level_names[_LOG_LVL_MAX] = {
	[LOG_LVL_ERROR] = "error",
	[LOG_LVL_WARN] = "warn",
	[LOG_LVL_INFO] = "info",
	[LOG_LVL_DEBUG] = "debug",
};

typedef uint64_t (*log_clock_fn)(void);

/* The rate limiter's clock; NULL: mono_ms(). Relaxed: it orders nothing else. */
static _Atomic(log_clock_fn) rl_clock;

/* Where lines go instead of stderr (log_set_sink); NULL: stderr. Relaxed: orders nothing else. */
static _Atomic(log_sink_fn) sink;

void log_set_sink(log_sink_fn fn)
{
	atomic_store_explicit(&sink, fn, memory_order_relaxed);
}

void log_set_clock(uint64_t (*now_ms)(void))
{
	atomic_store_explicit(&rl_clock, now_ms, memory_order_relaxed);
}

static uint64_t rl_now_ms(void)
{
	log_clock_fn f = atomic_load_explicit(&rl_clock, memory_order_relaxed);

	return f ? f() : mono_ms();
}

void log_set_level(enum log_level lvl)
{
	atomic_store_explicit(&cur_level, lvl, memory_order_relaxed);
}

enum log_level log_get_level(void)
{
	return atomic_load_explicit(&cur_level, memory_order_relaxed);
}

int log_level_from_string(const char *s)
{
	for (int i = 0; i < _LOG_LVL_MAX; i++)
		if (strcmp(s, level_names[i]) == 0)
			return i;
	return -EINVAL;
}

static void vlog(enum log_level lvl, const char *fmt, va_list ap)
{
	char buf[1024];
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	log_sink_fn f;

	if (n < 0)
		return;
	f = atomic_load_explicit(&sink, memory_order_relaxed);
	if (f) {
		f(lvl, buf);
		return;
	}
	/* One write per message keeps lines from different threads whole. */
	fprintf(stderr, "uvsock %s: %s\n", level_names[lvl], buf);
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	va_list ap;

	if (lvl > log_get_level())
		return;
	va_start(ap, fmt);
	vlog(lvl, fmt, ap);
	va_end(ap);
}

void log_ratelimited(struct log_ratelimit *rl, enum log_level lvl, const char *fmt, ...)
{
	uint64_t now = rl_now_ms();
	uint32_t suppressed = 0;
	int print;
	va_list ap;

	if (lvl > log_get_level())
		return;
	pthread_mutex_lock(&rl_lock);
	if (now - rl->window_start_ms >= RL_INTERVAL_MS) {
		suppressed = rl->suppressed;
		rl->window_start_ms = now;
		rl->printed = 0;
		rl->suppressed = 0;
	}
	print = rl->printed < RL_BURST;
	if (print)
		rl->printed++;
	else
		rl->suppressed++;
	pthread_mutex_unlock(&rl_lock);

	if (suppressed)
		log_msg(lvl, "%u similar messages suppressed", suppressed);
	if (!print)
		return;
	va_start(ap, fmt);
	vlog(lvl, fmt, ap);
	va_end(ap);
}
