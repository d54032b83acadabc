/* SPDX-License-Identifier: MIT */
/*
 * Guest-memory fault guard (see fault.h): the SIGBUS handler and the registry of protected
 * regions it reads.
 *
 * What the handler does is async-signal-safe: atomic loads and stores of lock-free types, mmap()
 * (a system call; not on the POSIX list, but a plain syscall wrapper in every Linux libc),
 * sigaction() and raise(), or a call of the handler that was there before. It takes no lock and
 * allocates nothing.
 */
#include "vring/fault.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "the SIGBUS handler needs lock-free pointers");
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "the SIGBUS handler needs lock-free longs");
_Static_assert(ATOMIC_BOOL_LOCK_FREE == 2, "the SIGBUS handler needs lock-free bools");

/*
 * One protected region. owner says which registrant has the slot (claimed with a CAS). seq is a
 * seqlock for the handler: odd while base/len/flag are being written, bumped again after, so a
 * reader that sees the same even value before and after reading them has a consistent triple.
 */
struct fault_slot {
	atomic_bool owner;
	atomic_ulong seq;
	_Atomic(uintptr_t) base;
	atomic_size_t len; /* 0: empty */
	_Atomic(atomic_bool *) flag;
};

/* What replaces a faulting region: private anonymous zero pages at the same address. */
#define ZERO_MAP_FLAGS (MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)

static struct fault_slot slots[FAULT_MAX_REGIONS];
static atomic_uint slots_used; /* 1 + the highest slot index ever claimed: the handler's bound */

static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static int guard_error;
static struct sigaction prev_action; /* what SIGBUS did before the guard; written once */

/* Reads slot i consistently; false if it is empty or changing (then it is not in use). */
static bool slot_read(struct fault_slot *s, uintptr_t *base, size_t *len, atomic_bool **flag)
{
	/* Acquire: the field loads below see at least what the writer stored before this seq. */
	unsigned long s1 = atomic_load_explicit(&s->seq, memory_order_acquire), s2;

	if (s1 & 1)
		return false;
	*base = atomic_load_explicit(&s->base, memory_order_relaxed);
	*len = atomic_load_explicit(&s->len, memory_order_relaxed);
	*flag = atomic_load_explicit(&s->flag, memory_order_relaxed);
	/* Acquire fence: the field loads above happen before the seq re-read below. */
	atomic_thread_fence(memory_order_acquire);
	s2 = atomic_load_explicit(&s->seq, memory_order_relaxed);
	return s1 == s2 && *len != 0;
}

/* Writes slot s's fields under its seqlock (only its owner calls this). */
static void slot_write(struct fault_slot *s, uintptr_t base, size_t len, atomic_bool *flag)
{
	unsigned long seq = atomic_load_explicit(&s->seq, memory_order_relaxed);

	atomic_store_explicit(&s->seq, seq + 1, memory_order_relaxed);
	/* Release fence: a reader that sees any field store below also sees the odd seq. */
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&s->base, base, memory_order_relaxed);
	atomic_store_explicit(&s->len, len, memory_order_relaxed);
	atomic_store_explicit(&s->flag, flag, memory_order_relaxed);
	/* Release: a reader that sees the new even seq sees all three fields. */
	atomic_store_explicit(&s->seq, seq + 2, memory_order_release);
}

/*
 * A SIGBUS that is not ours gets what it would have got without the guard. A handler that was
 * there before (an embedding VMM's, for memory-error reports say) is called as it is, and the
 * guard stays. Otherwise the previous action (SIG_DFL, SIG_IGN) is put back for a fault, which
 * then happens again under it when the access is retried; a signal that retries no access (sent
 * with kill(), or an asynchronous memory-error report) is raised again under it, or, ignored
 * before the guard, ignored now.
 */
static void not_ours(int sig, siginfo_t *si, void *uctx)
{
	bool retried = si->si_code > 0 && si->si_code != BUS_MCEERR_AO;

	if (prev_action.sa_flags & SA_SIGINFO) {
		prev_action.sa_sigaction(sig, si, uctx);
		return;
	}
	if (prev_action.sa_handler != SIG_DFL && prev_action.sa_handler != SIG_IGN) {
		prev_action.sa_handler(sig);
		return;
	}
	if (prev_action.sa_handler == SIG_IGN && !retried)
		return;
	sigaction(SIGBUS, &prev_action, NULL);
	if (!retried)
		raise(sig);
}

static void sigbus_handler(int sig, siginfo_t *si, void *uctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	unsigned n = atomic_load_explicit(&slots_used, memory_order_acquire);
	int saved_errno = errno;

	/* Only a fault (si_code > 0) has an address; kill(SIGBUS) gets the previous action. */
	for (unsigned i = 0; si->si_code > 0 && i < n && i < FAULT_MAX_REGIONS; i++) {
		uintptr_t base;
		size_t len;
		atomic_bool *flag;

		if (!slot_read(&slots[i], &base, &len, &flag) || a - base >= len)
			continue;
		/* Ours: zero pages over the whole region; the faulting access is then retried. */
		if (mmap((void *)base, len, PROT_READ | PROT_WRITE, ZERO_MAP_FLAGS, -1, 0) ==
		    MAP_FAILED)
			break; /* cannot repair: crash as if there were no guard */
		/* Relaxed: the flag orders nothing; the owner reads it after the access. */
		atomic_store_explicit(flag, true, memory_order_relaxed);
		errno = saved_errno;
		return;
	}
	/* Not guest memory (or unrepairable): what would have happened without the guard. */
	not_ours(sig, si, uctx);
	errno = saved_errno;
}

static void guard_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = sigbus_handler;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev_action) < 0)
		guard_error = -errno;
}

int fault_guard_init(void)
{
	pthread_once(&guard_once, guard_install);
	return guard_error;
}

int fault_register(void *base, size_t len, atomic_bool *poisoned)
{
	int r;

	if (len == 0 || !base || !poisoned)
		return -EINVAL;
	r = fault_guard_init();
	if (r < 0)
		return r;
	for (unsigned i = 0; i < FAULT_MAX_REGIONS; i++) {
		bool expected = false;
		unsigned used;

		/* Acquire: pairs with the release in fault_unregister(), so our field writes
		 * come after the previous owner's. */
		if (!atomic_compare_exchange_strong_explicit(&slots[i].owner, &expected, true,
							     memory_order_acquire,
							     memory_order_relaxed))
			continue;
		slot_write(&slots[i], (uintptr_t)base, len, poisoned);
		used = atomic_load_explicit(&slots_used, memory_order_relaxed);
		/* Release: a handler that reads the new bound also sees the slot written above. */
		while (used < i + 1 &&
		       !atomic_compare_exchange_weak_explicit(&slots_used, &used, i + 1,
							      memory_order_release,
							      memory_order_relaxed))
			;
		return (int)i;
	}
	return -ENOSPC;
}

void fault_unregister(int id)
{
	if (id < 0 || id >= FAULT_MAX_REGIONS)
		return;
	slot_write(&slots[id], 0, 0, NULL);
	/* Release: the next owner (acquire CAS in fault_register()) writes after our clearing. */
	atomic_store_explicit(&slots[id].owner, false, memory_order_release);
}
