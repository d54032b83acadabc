/* SPDX-License-Identifier: MIT */
/*
 * The epoll event loop of loop.h: watches keyed by epoll_event.data.ptr, a binary min-heap of
 * timers, eventfd-backed async handles. Objects removed during dispatch are parked on a zombie
 * list and freed when the batch is done, so an event already fetched for them is skipped.
 *
 * Busy polling (loop_set_busy_poll): an iteration that ran a callback sets `worked`; the next
 * blocking iteration spins on epoll_wait(0) until an event, a due timer, the end of its own
 * timeout or busy_poll_us, then sleeps for the rest. The counters are written by the loop thread
 * only and read by any thread (relaxed atomics: statistics, they publish nothing).
 */
#include "util/loop.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "util/macros.h"
#include "util/time.h"

#define LOOP_MAX_EVENTS 64

enum watch_kind { WATCH_FD, WATCH_ASYNC };

struct loop_watch {
	struct loop *loop;
	enum watch_kind kind;
	int fd;
	uint32_t events;
	bool dead;
	loop_fd_cb cb;
	void *opaque;
	struct loop_watch *next_zombie;
};

struct loop_timer {
	struct loop *loop;
	uint64_t deadline;
	size_t heap_idx; /* SIZE_MAX while disarmed */
	loop_timer_cb cb;
	void *opaque;
};

struct loop_async {
	struct loop_watch w; /* kind WATCH_ASYNC; w.fd is the eventfd */
	atomic_int pending;  /* 1 while a wakeup is requested and not yet started */
	loop_async_cb cb;
	void *opaque;
};

struct loop {
	int epfd;
	bool dispatching;
	atomic_int stop;          /* set by loop_stop(), any thread */
	struct loop_async *stop_async;
	struct loop_watch *zombies;
	struct loop_timer **heap; /* min-heap on deadline */
	size_t heap_len, heap_cap;
	size_t ntimers;           /* timers alive; heap_cap >= ntimers, so arming never allocates */
	unsigned busy_poll_us;    /* 0: never spin */
	bool worked;              /* the last iteration ran a callback */
	_Atomic uint64_t spin_ns, spins, spin_found, sleeps;
};

uint64_t loop_now_ns(void)
{
	return mono_ns();
}

/* ---- timers: binary heap ------------------------------------------------------------------ */

static void heap_set(struct loop *l, size_t i, struct loop_timer *t)
{
	l->heap[i] = t;
	t->heap_idx = i;
}

static void heap_up(struct loop *l, size_t i)
{
	struct loop_timer *t = l->heap[i];

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (l->heap[p]->deadline <= t->deadline)
			break;
		heap_set(l, i, l->heap[p]);
		i = p;
	}
	heap_set(l, i, t);
}

static void heap_down(struct loop *l, size_t i)
{
	struct loop_timer *t = l->heap[i];

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= l->heap_len)
			break;
		if (c + 1 < l->heap_len && l->heap[c + 1]->deadline < l->heap[c]->deadline)
			c++;
		if (t->deadline <= l->heap[c]->deadline)
			break;
		heap_set(l, i, l->heap[c]);
		i = c;
	}
	heap_set(l, i, t);
}

static void heap_remove(struct loop *l, struct loop_timer *t)
{
	size_t i = t->heap_idx;
	struct loop_timer *last;

	t->heap_idx = SIZE_MAX;
	last = l->heap[--l->heap_len];
	if (last == t)
		return;
	heap_set(l, i, last);
	heap_up(l, i);
	heap_down(l, last->heap_idx);
}

int loop_timer_new(struct loop *l, loop_timer_cb cb, void *opaque, struct loop_timer **ret)
{
	struct loop_timer *t;

	if (l->ntimers == l->heap_cap) {
		size_t cap = l->heap_cap ? l->heap_cap * 2 : 16;
		struct loop_timer **h = realloc(l->heap, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		l->heap = h;
		l->heap_cap = cap;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	l->ntimers++;
	t->loop = l;
	t->cb = cb;
	t->opaque = opaque;
	t->heap_idx = SIZE_MAX;
	*ret = t;
	return 0;
}

void loop_timer_arm(struct loop_timer *t, uint64_t deadline_ns)
{
	struct loop *l = t->loop;

	if (t->heap_idx != SIZE_MAX) {
		uint64_t old = t->deadline;

		t->deadline = deadline_ns;
		if (deadline_ns < old)
			heap_up(l, t->heap_idx);
		else
			heap_down(l, t->heap_idx);
		return;
	}
	/* loop_timer_new reserved a heap slot for every timer, so this never allocates. */
	t->deadline = deadline_ns;
	heap_set(l, l->heap_len++, t);
	heap_up(l, t->heap_idx);
}

void loop_timer_disarm(struct loop_timer *t)
{
	if (t->heap_idx != SIZE_MAX)
		heap_remove(t->loop, t);
}

bool loop_timer_armed(const struct loop_timer *t)
{
	return t->heap_idx != SIZE_MAX;
}

void loop_timer_free(struct loop_timer *t)
{
	if (!t)
		return;
	loop_timer_disarm(t);
	t->loop->ntimers--;
	free(t);
}

/* ---- fd watches ------------------------------------------------------------------------------ */

static int watch_register(struct loop *l, struct loop_watch *w)
{
	struct epoll_event ev = { .events = w->events, .data.ptr = w };

	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, w->fd, &ev) < 0)
		return -errno;
	return 0;
}

int loop_watch_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb, void *opaque,
		   struct loop_watch **ret)
{
	struct loop_watch *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	w->loop = l;
	w->kind = WATCH_FD;
	w->fd = fd;
	w->events = events;
	w->cb = cb;
	w->opaque = opaque;
	r = watch_register(l, w);
	if (r < 0) {
		free(w);
		return r;
	}
	*ret = w;
	return 0;
}

int loop_watch_mod(struct loop_watch *w, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = w };

	if (events == w->events)
		return 0;
	if (epoll_ctl(w->loop->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
		return -errno;
	w->events = events;
	return 0;
}

uint32_t loop_watch_events(const struct loop_watch *w)
{
	return w->events;
}

static void watch_release(struct loop_watch *w)
{
	if (w->kind == WATCH_ASYNC) {
		struct loop_async *a = container_of(w, struct loop_async, w);

		close(a->w.fd);
		free(a);
		return;
	}
	free(w);
}

static void watch_unlink(struct loop_watch *w)
{
	struct loop *l = w->loop;

	/* The fd may already be closed by a careless caller; nothing to do about it then. */
	(void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL);
	w->dead = true;
	if (l->dispatching) {
		w->next_zombie = l->zombies;
		l->zombies = w;
		return;
	}
	watch_release(w);
}

void loop_watch_del(struct loop_watch *w)
{
	if (!w)
		return;
	watch_unlink(w);
}

/* ---- async ----------------------------------------------------------------------------------- */

int loop_async_new(struct loop *l, loop_async_cb cb, void *opaque, struct loop_async **ret)
{
	struct loop_async *a = calloc(1, sizeof(*a));
	int r;

	if (!a)
		return -ENOMEM;
	a->w.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a->w.fd < 0) {
		r = -errno;
		free(a);
		return r;
	}
	a->w.loop = l;
	a->w.kind = WATCH_ASYNC;
	a->w.events = EPOLLIN;
	a->cb = cb;
	a->opaque = opaque;
	r = watch_register(l, &a->w);
	if (r < 0) {
		close(a->w.fd);
		free(a);
		return r;
	}
	*ret = a;
	return 0;
}

void loop_async_send(struct loop_async *a)
{
	uint64_t one = 1;

	/*
	 * acq_rel exchange: orders the sender's earlier writes (the work it queued) before the flag
	 * store, which the callback's exchange reads with acquire. If the flag was already set, the
	 * callback has not cleared it yet and will see those writes; otherwise wake it.
	 */
	if (atomic_exchange_explicit(&a->pending, 1, memory_order_acq_rel))
		return;
	/* EAGAIN only if the counter is saturated, which still means "wake up". */
	while (write(a->w.fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

void loop_async_free(struct loop_async *a)
{
	if (!a)
		return;
	watch_unlink(&a->w);
}

static void async_dispatch(struct loop *l, struct loop_async *a)
{
	uint64_t v;

	(void)!read(a->w.fd, &v, sizeof(v));
	/* Pairs with the exchange in loop_async_send: makes the senders' writes visible to cb. */
	atomic_exchange_explicit(&a->pending, 0, memory_order_acq_rel);
	a->cb(l, a->opaque);
}

/* ---- loop ------------------------------------------------------------------------------------ */

static void stop_cb(struct loop *l, void *opaque)
{
	(void)opaque;
	(void)l;
}

int loop_new(struct loop **ret)
{
	struct loop *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return -ENOMEM;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		r = -errno;
		free(l);
		return r;
	}
	r = loop_async_new(l, stop_cb, NULL, &l->stop_async);
	if (r < 0) {
		close(l->epfd);
		free(l);
		return r;
	}
	*ret = l;
	return 0;
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	/*
	 * Watches and asyncs still registered belong to their owners, who must delete them first;
	 * the loop only frees its own async and the timer heap storage.
	 */
	loop_async_free(l->stop_async);
	for (size_t i = 0; i < l->heap_len; i++)
		l->heap[i]->heap_idx = SIZE_MAX;
	free(l->heap);
	close(l->epfd);
	free(l);
}

static int timeout_for(struct loop *l, int timeout_ms)
{
	uint64_t now, d, ms;

	if (l->heap_len == 0)
		return timeout_ms;
	now = loop_now_ns();
	d = l->heap[0]->deadline;
	if (d <= now)
		return 0;
	/* Round up so that a timer never wakes us just before it is due. */
	ms = (d - now + NS_PER_MS - 1) / NS_PER_MS;
	if (ms > INT32_MAX)
		ms = INT32_MAX;
	if (timeout_ms < 0 || (uint64_t)timeout_ms > ms)
		return (int)ms;
	return timeout_ms;
}

int loop_fd(const struct loop *l)
{
	return l->epfd;
}

int loop_next_timeout_ms(struct loop *l)
{
	return timeout_for(l, -1);
}

static int run_timers(struct loop *l)
{
	uint64_t now = loop_now_ns();
	int n = 0;

	while (l->heap_len > 0 && l->heap[0]->deadline <= now) {
		struct loop_timer *t = l->heap[0];

		heap_remove(l, t);
		t->cb(l, t, t->opaque);
		n++;
	}
	return n;
}

#define STAT_ADD(l, f, n) atomic_fetch_add_explicit(&(l)->f, (n), memory_order_relaxed)

void loop_set_busy_poll(struct loop *l, unsigned us)
{
	l->busy_poll_us = us;
}

void loop_get_stats(const struct loop *l, struct loop_stats *ret)
{
	struct loop *m = (struct loop *)l;

	ret->spin_ns = atomic_load_explicit(&m->spin_ns, memory_order_relaxed);
	ret->spins = atomic_load_explicit(&m->spins, memory_order_relaxed);
	ret->spin_found = atomic_load_explicit(&m->spin_found, memory_order_relaxed);
	ret->sleeps = atomic_load_explicit(&m->sleeps, memory_order_relaxed);
}

/* True if the earliest timer is due at `now`. */
static bool timer_due(const struct loop *l, uint64_t now)
{
	return l->heap_len > 0 && l->heap[0]->deadline <= now;
}

/*
 * The spin of busy polling, before a wait of timeout_ms (> 0, or -1: none): epoll_wait(0) until
 * it returns events (or an error), a timer falls due, or the spin's time is up; *timeout_ms is
 * then reduced by the time spun. Returns what epoll_wait returned last; *due is set if the spin
 * ended on a due timer (nothing to wait for then).
 */
static int busy_poll(struct loop *l, struct epoll_event *evs, int *timeout_ms, bool *due)
{
	uint64_t start = loop_now_ns(), now = start, until = start + l->busy_poll_us * 1000ull;
	int n = 0;

	if (*timeout_ms > 0 && start + (uint64_t)*timeout_ms * NS_PER_MS < until)
		until = start + (uint64_t)*timeout_ms * NS_PER_MS;
	STAT_ADD(l, spins, 1);
	*due = false;
	while (now < until) {
		n = epoll_wait(l->epfd, evs, LOOP_MAX_EVENTS, 0);
		now = loop_now_ns();
		if (n != 0)
			break;
		if (timer_due(l, now)) {
			*due = true;
			break;
		}
	}
	STAT_ADD(l, spin_ns, now - start);
	if (n > 0 || *due)
		STAT_ADD(l, spin_found, 1);
	if (*timeout_ms > 0) {
		uint64_t spent_ms = (now - start) / NS_PER_MS;

		*timeout_ms = spent_ms >= (uint64_t)*timeout_ms ? 0 : *timeout_ms - (int)spent_ms;
	}
	return n;
}

int loop_run_once(struct loop *l, int timeout_ms)
{
	struct epoll_event evs[LOOP_MAX_EVENTS];
	int n = 0, ran = 0;
	bool due = false;

	if (l->busy_poll_us && l->worked && timeout_ms != 0)
		n = busy_poll(l, evs, &timeout_ms, &due);
	if (n == 0 && !due) {
		int to = timeout_for(l, timeout_ms);

		if (to != 0)
			STAT_ADD(l, sleeps, 1);
		n = epoll_wait(l->epfd, evs, LOOP_MAX_EVENTS, to);
	}
	if (n < 0) {
		if (errno == EINTR)
			n = 0;
		else
			return -errno;
	}
	l->dispatching = true;
	for (int i = 0; i < n; i++) {
		struct loop_watch *w = evs[i].data.ptr;

		if (w->dead)
			continue;
		if (w->kind == WATCH_ASYNC)
			async_dispatch(l, container_of(w, struct loop_async, w));
		else
			w->cb(l, w->fd, evs[i].events, w->opaque);
		ran++;
	}
	ran += run_timers(l);
	l->dispatching = false;
	while (l->zombies) {
		struct loop_watch *w = l->zombies;

		l->zombies = w->next_zombie;
		watch_release(w);
	}
	l->worked = ran > 0;
	return ran;
}

int loop_run(struct loop *l)
{
	int r = 0;

	/* Acquire: pairs with loop_stop's release; what its caller wrote before is visible here. */
	while (!atomic_load_explicit(&l->stop, memory_order_acquire)) {
		r = loop_run_once(l, -1);
		if (r < 0)
			break;
	}
	/* A stop requested before loop_run started still ends this run, not the next one. */
	atomic_store_explicit(&l->stop, 0, memory_order_relaxed);
	return r < 0 ? r : 0;
}

void loop_stop(struct loop *l)
{
	/* Release: orders the caller's earlier writes before the flag loop_run() reads. */
	atomic_store_explicit(&l->stop, 1, memory_order_release);
	loop_async_send(l->stop_async);
}
