/* SPDX-License-Identifier: MIT */
/*
 * The ceiling of uvsock-perf: a plain single-producer single-consumer byte ring in anonymous
 * shared memory (mmap MAP_SHARED | MAP_ANONYMOUS, as two processes would share it), one copy in
 * (the writer's memcpy into the ring) and one copy out (the reader's memcpy out of it). An empty
 * or full ring is waited for with a short spin and then a futex on the index the other side
 * moves; the side that moves an index wakes the other only if it announced that it sleeps.
 * One writer thread and one reader thread per ring.
 */
#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "perf.h"

#define SHM_RING_SIZE (1u << 20)
#define SHM_SPIN      2000

struct shm_ring {
	_Alignas(64) _Atomic uint32_t head; /* bytes written (wrapping); the writer moves it */
	_Atomic uint32_t closed;            /* the writer is done */
	_Atomic uint32_t rsleep;            /* the reader waits on head */
	_Alignas(64) _Atomic uint32_t tail; /* bytes read (wrapping); the reader moves it */
	_Atomic uint32_t wsleep;            /* the writer waits on tail */
	_Atomic uint32_t ends;              /* ends still holding the ring (freed at 0) */
	_Alignas(64) uint8_t data[SHM_RING_SIZE];
};

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };

	/* Bounded: a lost wake-up costs at most 100 ms, never a hang. */
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/*
 * Waits until *idx differs from `seen` or *stop is set. The sleeper announces itself in *sleep
 * (seq_cst store) and then re-reads *idx (seq_cst): the mover stores *idx (seq_cst) and then
 * reads *sleep (seq_cst), so at least one of the two sees the other (no lost wake-up).
 */
static void wait_move(_Atomic uint32_t *idx, uint32_t seen, _Atomic uint32_t *sleep,
                      _Atomic uint32_t *stop)
{
	for (int i = 0; i < SHM_SPIN; i++) {
		/* Relaxed: a hint only; the caller re-reads with acquire. */
		if (atomic_load_explicit(idx, memory_order_relaxed) != seen ||
		    (stop && atomic_load_explicit(stop, memory_order_relaxed)))
			return;
	}
	atomic_store_explicit(sleep, 1, memory_order_seq_cst); /* see the comment above */
	if (atomic_load_explicit(idx, memory_order_seq_cst) == seen &&
	    !(stop && atomic_load_explicit(stop, memory_order_seq_cst)))
		futex_wait(idx, seen);
	atomic_store_explicit(sleep, 0, memory_order_relaxed);
}

static void wake_if(_Atomic uint32_t *idx, _Atomic uint32_t *sleep)
{
	/* Seq_cst: pairs with the sleeper's store/load in wait_move. */
	if (atomic_load_explicit(sleep, memory_order_seq_cst))
		futex_wake(idx);
}

static struct shm_ring *ring_new(void)
{
	struct shm_ring *r =
	        mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (r == MAP_FAILED)
		die("mmap shared ring: %s", strerror(errno));
	atomic_init(&r->ends, 2);
	return r;
}

/* Two rings, one per direction: tx->tx is rx->rx and the reverse. */
void shm_pair(struct conn *tx, struct conn *rx)
{
	struct shm_ring *a = ring_new(), *b = ring_new();

	*tx = (struct conn){ .kind = C_SHM, .fd = -1, .tx = a, .rx = b };
	*rx = (struct conn){ .kind = C_SHM, .fd = -1, .tx = b, .rx = a };
}

ssize_t shm_send(struct shm_ring *r, const void *buf, size_t n)
{
	/* Acquire on tail: the reader's copy out is done before we overwrite those bytes. */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
	size_t room, off, first;

	while ((room = SHM_RING_SIZE - (head - tail)) == 0) {
		wait_move(&r->tail, tail, &r->wsleep, NULL);
		tail = atomic_load_explicit(&r->tail, memory_order_acquire); /* as above */
	}
	if (n > room)
		n = room;
	off = head % SHM_RING_SIZE;
	first = SHM_RING_SIZE - off < n ? SHM_RING_SIZE - off : n;
	memcpy(r->data + off, buf, first);
	memcpy(r->data, (const uint8_t *)buf + first, n - first);
	/* Seq_cst: publishes the bytes (release) and orders against reading rsleep (wake_if). */
	atomic_store_explicit(&r->head, head + (uint32_t)n, memory_order_seq_cst);
	wake_if(&r->head, &r->rsleep);
	return (ssize_t)n;
}

ssize_t shm_recv(struct shm_ring *r, void *buf, size_t n)
{
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
	/* Acquire on head: the writer's bytes up to head are visible. */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
	size_t avail, off, first;

	while ((avail = head - tail) == 0) {
		/* Acquire: closed is set after the last head store (shm_close_wr). */
		if (atomic_load_explicit(&r->closed, memory_order_acquire)) {
			head = atomic_load_explicit(&r->head, memory_order_acquire);
			if (head == tail)
				return 0;
			continue;
		}
		wait_move(&r->head, head, &r->rsleep, &r->closed);
		head = atomic_load_explicit(&r->head, memory_order_acquire); /* as above */
	}
	if (n > avail)
		n = avail;
	off = tail % SHM_RING_SIZE;
	first = SHM_RING_SIZE - off < n ? SHM_RING_SIZE - off : n;
	memcpy(buf, r->data + off, first);
	memcpy((uint8_t *)buf + first, r->data, n - first);
	/* Seq_cst: frees the room (release) and orders against reading wsleep (wake_if). */
	atomic_store_explicit(&r->tail, tail + (uint32_t)n, memory_order_seq_cst);
	wake_if(&r->tail, &r->wsleep);
	return (ssize_t)n;
}

void shm_close_wr(struct shm_ring *r)
{
	/* Seq_cst: after the last head store, and ordered against reading rsleep. */
	atomic_store_explicit(&r->closed, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&r->rsleep, memory_order_seq_cst))
		futex_wake(&r->head);
}

/* Drops one end's hold on both rings of the pair this ring belongs to. */
void shm_free(struct shm_ring *r)
{
	if (!r)
		return;
	/* Acq_rel: the last end sees every access of the other before unmapping. */
	if (atomic_fetch_sub_explicit(&r->ends, 1, memory_order_acq_rel) == 1)
		munmap(r, sizeof(*r));
}
