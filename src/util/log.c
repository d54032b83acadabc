/* SPDX-License-Identifier: MIT */
/*
 * Logging to stderr with a level and per-call-site rate limiting; the line's prefix (journald
 * priority or timestamp) and tag (see log.h).
 */
#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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

/* Set by log_setup() before other threads log; read-only afterwards. */
static char tag[32] = "uvsock";
static enum { PREFIX_NONE, PREFIX_JOURNAL, PREFIX_TIME } prefix_style;
static const char journal_prio[_LOG_LVL_MAX] = {
	[LOG_LVL_ERROR] = '3',
	[LOG_LVL_WARN] = '4',
	[LOG_LVL_INFO] = '6',
	[LOG_LVL_DEBUG] = '7',
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

/* True if JOURNAL_STREAM ("device:inode", systemd.exec(5)) names stderr. */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char end;

	if (!js || sscanf(js, "%llu:%llu%c", &dev, &ino, &end) != 2 || fstat(2, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

bool log_setup(const char *program)
{
	snprintf(tag, sizeof(tag), "%s", program);
	prefix_style = stderr_is_journal() ? PREFIX_JOURNAL : PREFIX_TIME;
	return prefix_style == PREFIX_JOURNAL;
}

void log_emit(enum log_level lvl, const char *msg)
{
	log_sink_fn f = atomic_load_explicit(&sink, memory_order_relaxed);
	char pre[40] = "";

	if (f) {
		f(lvl, msg);
		return;
	}

	if (prefix_style == PREFIX_JOURNAL) {
		snprintf(pre, sizeof(pre), "<%c>", journal_prio[lvl]);
	} else if (prefix_style == PREFIX_TIME) {
		/* Wall-clock time for the reader of the log; intervals use util/time.h. */
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		strftime(pre, sizeof(pre), "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(pre + strlen(pre), sizeof(pre) - strlen(pre), ".%03ldZ ",
			 ts.tv_nsec / 1000000);
	}
	/* One write per message keeps lines from different threads whole. */
	fprintf(stderr, "%s%s %s: %s\n", pre, tag, level_names[lvl], msg);
}

static void vlog(enum log_level lvl, const char *fmt, va_list ap)
{
	char buf[1024];
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);

	if (n < 0)
		return;
	log_emit(lvl, buf);
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
