/* SPDX-License-Identifier: MIT */
/*
 * Guest-memory fault guard: keeps a SIGBUS in a mapped guest region from killing the process.
 *
 * A front-end that shrinks (ftruncate) the file behind guest memory we have mapped turns our
 * next access to the lost pages into SIGBUS, whose default action ends the whole process with
 * every VM it serves. Regions registered here are protected: on a SIGBUS inside one, the
 * handler maps anonymous zero pages over the whole region (MAP_FIXED), sets the region's
 * poisoned flag and returns, so the faulting access is retried on zeros and no later access to
 * that region can fault. The owner checks the flag and stops using the memory (guest_mem.h
 * guest_mem_poisoned()). A SIGBUS outside every registered region gets the action that was there
 * before the guard: a handler of the embedding program is called (the guard stays), the default
 * is put back and the signal happens again (a real bug still crashes).
 *
 * Registry: a fixed array read lock-free by the handler; each slot is a small seqlock, so the
 * handler never sees half of a registration. Thread-safe; fault_register()/fault_unregister() are
 * not async-signal-safe and must not be called from signal handlers.
 */
#ifndef UVSOCK_VRING_FAULT_H
#define UVSOCK_VRING_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* Slots: 1024 VMs (uvsockd's cap) x 8 regions, twice (old and new map while SET_MEM_TABLE). */
#define FAULT_MAX_REGIONS 16384

/*
 * Installs the SIGBUS handler (once per process; later calls return the first result).
 * Returns 0 or the -errno of sigaction().
 */
int fault_guard_init(void);

/*
 * Protects [base, base + len), a mapping the caller owns: a SIGBUS inside it replaces the whole
 * range with anonymous zero pages and stores true to *poisoned (which must stay valid until
 * fault_unregister()). Installs the handler if needed. Returns a slot id >= 0, -ENOSPC if all
 * FAULT_MAX_REGIONS slots are in use, -EINVAL for len 0, or fault_guard_init()'s error.
 */
int fault_register(void *base, size_t len, atomic_bool *poisoned);

/* Ends the protection of slot id (from fault_register()); call before munmap(). Safe on < 0. */
void fault_unregister(int id);

#endif
