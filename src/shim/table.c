/* SPDX-License-Identifier: MIT */
/*
 * The shim's fd table (shim.h): fd -> struct vsk, two levels of pages allocated on first use,
 * each slot an atomic pointer so the hot paths (recvfrom, recvmsg) test an fd without the lock.
 * Updates and references are under one mutex; fork() takes it so the child's copy is unlocked.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim/shim.h"

#define PAGE_BITS 12
#define PAGE_SIZE_FDS (1u << PAGE_BITS)
#define N_PAGES (SHIM_MAX_FD >> PAGE_BITS)

/* Pages are created under the lock and never freed. */
static _Atomic(_Atomic(struct vsk *) *) pages[N_PAGES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct vsk *shim_vsk_new(enum vsk_kind kind, int type)
{
	struct vsk *v = calloc(1, sizeof(*v));

	if (!v)
		return NULL;
	v->refs = 1; /* the caller's */
	v->kind = kind;
	v->type = type;
	v->state = VS_NEW;
	v->lcid = v->pcid = SHIM_CID_ANY;
	v->lport = v->pport = SHIM_PORT_ANY;
	v->connect_timeout_ns = SHIM_DEFAULT_CONNECT_TIMEOUT_NS;
	v->buf_size = v->buf_max = SHIM_DEFAULT_BUF;
	v->buf_min = SHIM_DEFAULT_BUF_MIN;
	return v;
}

/* The slot of fd, allocating its page if `create`; NULL if out of range or out of memory. */
static _Atomic(struct vsk *) *slot(int fd, bool create)
{
	unsigned p;

	if (fd < 0 || fd >= SHIM_MAX_FD)
		return NULL;
	p = (unsigned)fd >> PAGE_BITS;
	/* Acquire: pairs with the release below, so the page's zeroed slots are seen. */
	if (!atomic_load_explicit(&pages[p], memory_order_acquire)) {
		_Atomic(struct vsk *) *pg;

		if (!create)
			return NULL;
		pg = calloc(PAGE_SIZE_FDS, sizeof(*pg));
		if (!pg)
			return NULL;
		/* Release: the zeroed page before its pointer (readers load with acquire). */
		atomic_store_explicit(&pages[p], pg, memory_order_release);
	}
	/* Acquire: as above (the page may have been created by another thread meanwhile). */
	return &atomic_load_explicit(&pages[p], memory_order_acquire)[(unsigned)fd &
								      (PAGE_SIZE_FDS - 1)];
}

/* Drops one reference; the last frees v. Called with the lock held; returns v if it must be
 * released (its extra listener fds closed) after the lock is dropped, else NULL. */
static struct vsk *unref_locked(struct vsk *v)
{
	return --v->refs == 0 ? v : NULL;
}

static void release(struct vsk *v)
{
	if (!v)
		return;
	if (v->state == VS_LISTEN) {
		for (int i = 0; i < v->nl; i++) {
			if (v->owner == getpid())
				(void)uds_unlink_owned(v->l[i].path, &v->l[i].ul);
			/* With one listener, l[0].fd was the socket's own fd (the caller closes
			 * it). */
			if (v->nl > 1 && v->l[i].fd >= 0)
				shim_real.close(v->l[i].fd);
		}
	}
	free(v->l);
	free(v);
}

struct vsk *shim_get(int fd)
{
	_Atomic(struct vsk *) *s = slot(fd, false);
	struct vsk *v;

	/* Relaxed: a NULL answer needs no ordering, and a hit is re-read under the lock. */
	if (!s || !atomic_load_explicit(s, memory_order_relaxed))
		return NULL;
	pthread_mutex_lock(&lock);
	v = atomic_load_explicit(s, memory_order_relaxed);
	if (v)
		v->refs++;
	pthread_mutex_unlock(&lock);
	return v;
}

void shim_put(struct vsk *v)
{
	struct vsk *dead;

	if (!v)
		return;
	pthread_mutex_lock(&lock);
	dead = unref_locked(v);
	pthread_mutex_unlock(&lock);
	release(dead);
}

int shim_set(int fd, struct vsk *v)
{
	_Atomic(struct vsk *) *s;
	struct vsk *old, *dead = NULL;

	pthread_mutex_lock(&lock);
	s = slot(fd, true);
	if (!s) {
		pthread_mutex_unlock(&lock);
		return fd < 0 || fd >= SHIM_MAX_FD ? -EMFILE : -ENOMEM;
	}
	old = atomic_load_explicit(s, memory_order_relaxed);
	v->refs++;
	/* Relaxed: every reader that dereferences the pointer takes the lock first. */
	atomic_store_explicit(s, v, memory_order_relaxed);
	if (old)
		dead = unref_locked(old);
	pthread_mutex_unlock(&lock);
	release(dead);
	return 0;
}

void shim_drop(int fd)
{
	_Atomic(struct vsk *) *s = slot(fd, false);
	struct vsk *old, *dead = NULL;

	if (!s || !atomic_load_explicit(s, memory_order_relaxed))
		return;
	pthread_mutex_lock(&lock);
	old = atomic_exchange_explicit(s, NULL, memory_order_relaxed);
	if (old)
		dead = unref_locked(old);
	pthread_mutex_unlock(&lock);
	release(dead);
}

void shim_drop_range(unsigned first, unsigned last)
{
	if (last >= SHIM_MAX_FD)
		last = SHIM_MAX_FD - 1;
	for (unsigned fd = first; fd <= last; fd++) {
		/* Acquire: pairs with the page's publication in slot(). */
		if (!atomic_load_explicit(&pages[fd >> PAGE_BITS], memory_order_acquire)) {
			fd |= PAGE_SIZE_FDS - 1; /* a page never used: nothing of ours in it */
			continue;
		}
		shim_drop((int)fd);
	}
}

bool shim_is_ours(int fd)
{
	_Atomic(struct vsk *) *s = slot(fd, false);

	/* Relaxed: the answer is only as current as the program's own fd use makes it. */
	return s && atomic_load_explicit(s, memory_order_relaxed) != NULL;
}

void shim_foreach(void (*fn)(int fd, struct vsk *v, void *arg), void *arg)
{
	pthread_mutex_lock(&lock);
	for (unsigned p = 0; p < N_PAGES; p++) {
		/* Acquire: pairs with the page's publication in slot(). */
		_Atomic(struct vsk *) *pg = atomic_load_explicit(&pages[p], memory_order_acquire);

		if (!pg)
			continue;
		for (unsigned i = 0; i < PAGE_SIZE_FDS; i++) {
			struct vsk *v = atomic_load_explicit(&pg[i], memory_order_relaxed);

			if (v)
				fn((int)((p << PAGE_BITS) | i), v, arg);
		}
	}
	pthread_mutex_unlock(&lock);
}

struct taken_arg {
	uint32_t port;
	int type;
	const struct vsk *except;
	bool taken;
};

static void taken_one(int fd, struct vsk *v, void *arg)
{
	struct taken_arg *a = arg;

	(void)fd;
	if (v != a->except && v->kind == VK_SOCKET && v->type == a->type &&
	    (v->state == VS_BOUND || v->state == VS_LISTEN) && v->lport == a->port)
		a->taken = true;
}

bool shim_port_taken(uint32_t port, int type, const struct vsk *except)
{
	struct taken_arg a = { port, type, except, false };

	shim_foreach(taken_one, &a);
	return a.taken;
}

void shim_table_atfork_prepare(void)
{
	shim_vms_atfork_prepare();
	pthread_mutex_lock(&lock);
}

void shim_table_atfork_parent(void)
{
	pthread_mutex_unlock(&lock);
	shim_vms_atfork_release();
}

void shim_table_atfork_child(void)
{
	pthread_mutex_unlock(&lock);
	shim_vms_atfork_release();
}
