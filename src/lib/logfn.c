/* SPDX-License-Identifier: MIT */
/*
 * uvsock_set_log_fn(): the library user's log callback and level, on top of util/log's sink.
 * The public levels are util/log's enum values (checked below), so no table is needed.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

#include <uvsock/uvsock.h>

#include "util/log.h"

_Static_assert(UVSOCK_LOG_ERROR == LOG_LVL_ERROR && UVSOCK_LOG_WARN == LOG_LVL_WARN &&
	       UVSOCK_LOG_INFO == LOG_LVL_INFO && UVSOCK_LOG_DEBUG == LOG_LVL_DEBUG,
	       "UVSOCK_LOG_* must equal enum log_level");

/* The user's callback. Relaxed: a callback pointer orders nothing else. */
static _Atomic(uvsock_log_fn) user_fn;

/* util/log's sink while a user callback is set: hands the line over as an int level. */
static void to_user(enum log_level lvl, const char *msg)
{
	uvsock_log_fn fn = atomic_load_explicit(&user_fn, memory_order_relaxed);

	/* NULL only in the moment uvsock_set_log_fn(NULL, ...) runs: that line is dropped. */
	if (fn)
		fn((int)lvl, msg);
}

int uvsock_set_log_fn(uvsock_log_fn fn, int level)
{
	if (level < UVSOCK_LOG_ERROR || level > UVSOCK_LOG_DEBUG) {
		errno = EINVAL;
		return -1;
	}
	atomic_store_explicit(&user_fn, fn, memory_order_relaxed);
	log_set_sink(fn ? to_user : NULL);
	log_set_level((enum log_level)level);
	return 0;
}
