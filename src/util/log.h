/* SPDX-License-Identifier: MIT */
/*
 * Logging for the programs (uvsockd, tools). Library code stays silent except at debug level.
 * Messages a guest can trigger go through log_ratelimited() so that a hostile guest cannot flood
 * the log: each call site allows a burst, then counts what it suppressed and says so once.
 *
 * Every line has one form, "TAG LEVEL: message" (TAG "uvsock" unless log_setup() named the
 * program), written whole by log_emit(). A program that calls log_setup() gets, in front of it,
 * the journald priority prefix ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug, sd-daemon(3))
 * when stderr is the journal's stream (JOURNAL_STREAM names stderr's device:inode), else a UTC
 * timestamp ("2026-12-01T23:30:00.123Z").
 */
#ifndef UVSOCK_UTIL_LOG_H
#define UVSOCK_UTIL_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG, _LOG_LVL_MAX };

void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);
/* Returns the level for "error", "warn", "info" or "debug", or -EINVAL. */
int log_level_from_string(const char *s);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Names the program (the tag; copied, at most 31 bytes) and picks the line prefix: journald's
 * priority when stderr is the journal, else a timestamp. Context: start-up, before other threads
 * log. Returns true if stderr is the journal.
 */
bool log_setup(const char *program);

/* Writes one formatted message at lvl as a whole line (the prefix and tag added). Any thread. */
void log_emit(enum log_level lvl, const char *msg);

/* Per call site state for rate-limited messages: `burst` messages per `interval_ms`. */
struct log_ratelimit {
	uint64_t window_start_ms;
	uint32_t printed;
	uint32_t suppressed;
};
void log_ratelimited(struct log_ratelimit *rl, enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Replaces the rate limiter's clock (monotonic milliseconds) with now_ms; NULL restores the real
 * one, mono_ms() of util/time.h. For tests, which drive the windows without sleeping. Any
 * thread; now_ms must be callable from every thread that logs.
 */
void log_set_clock(uint64_t (*now_ms)(void));

/*
 * Sends every line that passes the level to fn (the message alone: no prefix, no newline; valid
 * during the call) instead of stderr; NULL restores stderr. For the library's users
 * (uvsock_set_log_fn). fn is called from any thread that logs, possibly concurrently.
 */
typedef void (*log_sink_fn)(enum log_level lvl, const char *msg);
void log_set_sink(log_sink_fn fn);

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
	do {                                                                                       \
		if (log_get_level() >= LOG_LVL_DEBUG)                                              \
			log_msg(LOG_LVL_DEBUG, __VA_ARGS__);                                       \
	} while (0)

/* Guest-triggered message, rate-limited per call site (10 per 5 s). */
#define log_guest(lvl, ...)                                                                        \
	do {                                                                                       \
		static struct log_ratelimit rl_;                                                   \
		log_ratelimited(&rl_, lvl, __VA_ARGS__);                                           \
	} while (0)

#endif
