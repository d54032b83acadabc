/* SPDX-License-Identifier: MIT */
/*
 * A small epoll event loop owned by one thread: fd watches with callbacks, one-shot timers on
 * the monotonic clock (a binary heap), and "async" handles, eventfd-backed wakeups that any
 * thread may trigger to hand the owning thread work (coalesced: many sends, one callback).
 *
 * Threads. Everything here is called from the loop's own thread only, except loop_async_send()
 * and loop_stop(), which any thread may call. Callbacks run on the loop thread and may add,
 * modify or remove any watch, timer or async of the same loop, including their own: removal is
 * safe during dispatch (the object is freed after the current batch of events).
 */
#ifndef UVSOCK_UTIL_LOOP_H
#define UVSOCK_UTIL_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;
struct loop_watch;
struct loop_timer;
struct loop_async;

/* Called with the epoll event mask (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, EPOLLRDHUP...). */
typedef void (*loop_fd_cb)(struct loop *l, int fd, uint32_t events, void *opaque);
typedef void (*loop_timer_cb)(struct loop *l, struct loop_timer *t, void *opaque);
typedef void (*loop_async_cb)(struct loop *l, void *opaque);

/* The timers' time base: mono_ns() of util/time.h (CLOCK_MONOTONIC, ns). Any thread. */
uint64_t loop_now_ns(void);

/*
 * Creates a loop (an epoll fd and the eventfd behind loop_stop).
 * Returns 0, -ENOMEM, or the errno of epoll_create1/eventfd (-EMFILE...).
 */
int loop_new(struct loop **ret);

/*
 * Frees the loop and every watch, timer and async still registered (their fds are not closed:
 * watches borrow fds). Safe on NULL. Loop thread only, never from a callback.
 */
void loop_free(struct loop *l);

/*
 * Watches fd for `events` (EPOLLIN/EPOLLOUT/..., level-triggered unless EPOLLET is given).
 * Borrows fd: the caller closes it after loop_watch_del(). *ret is owned by the loop.
 * Returns 0, -ENOMEM, or the errno of epoll_ctl (-EEXIST if fd is already watched, -EBADF...).
 */
int loop_watch_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb, void *opaque,
		   struct loop_watch **ret);

/* Changes the event mask (no syscall if unchanged). Returns 0 or the errno of epoll_ctl. */
int loop_watch_mod(struct loop_watch *w, uint32_t events);
/* Current event mask of w. */
uint32_t loop_watch_events(const struct loop_watch *w);

/*
 * Stops watching and releases w (deferred while dispatching, so pending events for it are
 * dropped, never delivered). Call before closing the fd. Safe on NULL.
 */
void loop_watch_del(struct loop_watch *w);

/* Creates a disarmed timer. Returns 0 or -ENOMEM. *ret is owned by the caller (loop_timer_free). */
int loop_timer_new(struct loop *l, loop_timer_cb cb, void *opaque, struct loop_timer **ret);
/* Arms (or re-arms) t to fire once at `deadline_ns` (loop_now_ns() time base). */
void loop_timer_arm(struct loop_timer *t, uint64_t deadline_ns);
/* Disarms t if armed. */
void loop_timer_disarm(struct loop_timer *t);
bool loop_timer_armed(const struct loop_timer *t);
/* Disarms and frees. Safe on NULL and from t's own callback. */
void loop_timer_free(struct loop_timer *t);

/*
 * Creates an async handle: an eventfd in the loop; cb runs on the loop thread after one or more
 * loop_async_send() calls (coalesced). Returns 0, -ENOMEM or the errno of eventfd/epoll_ctl.
 */
int loop_async_new(struct loop *l, loop_async_cb cb, void *opaque, struct loop_async **ret);
/*
 * Requests a callback. Any thread, async-signal-safe. At most one eventfd write per wakeup:
 * while a callback is already requested and not yet started, further sends cost one atomic.
 * Everything the sender wrote before the call is visible to the callback.
 */
void loop_async_send(struct loop_async *a);
/* Frees the handle (closes its eventfd). Safe on NULL. Loop thread only. */
void loop_async_free(struct loop_async *a);

/*
 * Runs one iteration: waits up to timeout_ms (-1: until something happens; 0: does not wait;
 * the nearest timer shortens it), dispatches ready fds, then due timers.
 * Returns the number of callbacks run (>= 0), or -errno from epoll_wait (never -EINTR).
 */
int loop_run_once(struct loop *l, int timeout_ms);

/*
 * Embedding the loop in another event loop (the device API's UVSOCK_DEV_EXTERNAL_LOOP mode): the
 * outer loop polls loop_fd() for POLLIN and sleeps at most loop_next_timeout_ms(), then calls
 * loop_run_once(l, 0), which never blocks.
 */

/*
 * The loop's epoll fd: readable (POLLIN) while a watched fd or an async handle has an event
 * pending (timers do not make it readable: see loop_next_timeout_ms). Owned by the loop (do not
 * close, read or epoll_ctl it); valid until loop_free(). Any thread.
 */
int loop_fd(const struct loop *l);

/*
 * Milliseconds until the earliest armed timer is due, rounded up so that a sleep of that long
 * never wakes before it: 0 if one is due now, -1 if no timer is armed. Loop thread only.
 */
int loop_next_timeout_ms(struct loop *l);

/*
 * Busy polling (vhost's busyloop_timeout; docs/performance.md "wake-ups and busy polling"):
 * after an iteration that ran at least one callback, the next loop_run_once() with a non-zero
 * timeout first polls epoll without sleeping (epoll_wait with timeout 0) for up to `us`
 * microseconds, and only then sleeps for what is left of its timeout. The spin ends early when
 * an event arrives (dispatched at once, no wake-up of a sleeping thread) or a timer falls due
 * (timers are honoured exactly as without spinning). 0 (the default) turns it off. A loop run
 * with loop_run_once(l, 0) (an embedding outer loop) never spins. Loop thread only, or before
 * the loop runs.
 */
void loop_set_busy_poll(struct loop *l, unsigned us);

/* What busy polling cost and found; monotonic counters. */
struct loop_stats {
	uint64_t spin_ns;     /* time spent spinning (ns of CPU burnt waiting for work) */
	uint64_t spins;       /* spins started */
	uint64_t spin_found;  /* spins that ended with work (an event or a due timer) */
	uint64_t sleeps;      /* epoll_wait calls that could block (after a spin or without one) */
};

/* Snapshot of the counters. Any thread (relaxed loads of single-writer counters). */
void loop_get_stats(const struct loop *l, struct loop_stats *ret);

/* Runs until loop_stop(). Returns 0, or -errno if epoll_wait failed. */
int loop_run(struct loop *l);

/* Makes loop_run() return after the current iteration. Any thread, async-signal-safe. */
void loop_stop(struct loop *l);

#endif
