/* SPDX-License-Identifier: MIT */
/*
 * Internals of the socket API (include/uvsock/uvsock.h): the context, the transport vtable a
 * role plugs in, and the per-socket object behind each descriptor.
 *
 * A context owns one protocol engine. The transport (loopback here; the guest role later) moves
 * the engine's packets: it is told through tx_ready() that the engine has something to pull (or
 * that a timer deadline moved earlier), and it feeds what it receives. The transport also runs
 * the engine's timers (vsock_engine_next_deadline / vsock_engine_run_timers): blocking connect()
 * relies on them for SO_VM_SOCKETS_CONNECT_TIMEOUT, and closed sockets for their 8 s linger. The API layer owns the
 * engine's sock_event callback and uses it to wake blocked callers and pollable descriptors.
 *
 * Lock order: descriptor-table stripe lock -> (nothing); usock tx_mu/rx_mu -> engine socket lock;
 * engine socket lock -> usock pmu (inside sock_event). The API never holds pmu while calling the
 * engine.
 */
#ifndef UVSOCK_LIB_LIB_H
#define UVSOCK_LIB_LIB_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <uvsock/uvsock.h>

#include "vsock/engine.h"

struct uvsock_ctx;

struct uvsock_transport_ops {
	const char *name;
	/*
	 * The engine has packets to pull, or a timer deadline moved earlier (engine ops->tx_ready).
	 * Called from any thread with no engine lock held, possibly re-entered from inside the
	 * transport's own feed/pull. Required.
	 */
	void (*tx_ready)(struct uvsock_ctx *ctx);
	/*
	 * Optional check at connect(): 0 if packets to cid can go anywhere, or a negative errno
	 * (-ENETUNREACH, -ENODEV) that connect() returns at once.
	 */
	int (*connect_check)(struct uvsock_ctx *ctx, uint32_t cid);
	/* Optional: CIDs other than the engine's local CID that bind() accepts as local. */
	bool (*cid_is_local)(struct uvsock_ctx *ctx, uint32_t cid);
	/*
	 * Optional (direct RX, docs/performance.md "wake-ups and busy polling"): one round of a
	 * wait of a blocked API caller that receives for itself: as vdrv_rx_wait() of
	 * src/driver/driver.h (fds with room for nfds + 2 entries; word/val: the caller's event
	 * counter and the value it sleeps on, or NULL). Returns 1 (re-check), or 0: not
	 * available, sleep as without it.
	 */
	int (*rx_wait)(struct uvsock_ctx *ctx, struct pollfd *fds, unsigned nfds,
		       atomic_uint *word, unsigned val, uint64_t deadline_ns);
	/* Optional, with rx_wait: wakes the caller sleeping in rx_wait (vdrv_rx_wake). Called
	 * from sock_event, under the engine socket's lock. */
	void (*rx_wake)(struct uvsock_ctx *ctx);
	/*
	 * Optional (direct TX, docs/guest-role.md "Direct TX"): sends up to len bytes of iov on
	 * the STREAM socket s straight to the transport, as vdrv_tx_send() of
	 * src/driver/driver.h. Returns the bytes it took (0: none); the rest goes through
	 * vsock_sock_send(). Called with the API socket's tx_mu held, no engine lock.
	 */
	ssize_t (*send_direct)(struct uvsock_ctx *ctx, struct vsock_sock *s,
			       const struct iovec *iov, int iovcnt, size_t len);
	/* Optional: transport-level counters added to uvsock_ctx_get_stats (e.g. dropped). */
	void (*get_stats)(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *st);
	/*
	 * Stops the transport's threads. Called by uvsock_ctx_free() after every socket is closed
	 * and before the engine is freed. Required.
	 */
	void (*stop)(struct uvsock_ctx *ctx);
	/* Frees the transport's state (the engine is already gone). Required. */
	void (*destroy)(struct uvsock_ctx *ctx);
};

/*
 * Creates a context around a new engine built from *cfg (cfg->ops and cfg->opaque are
 * overwritten: the context supplies them). `tp` is the transport's private pointer, returned by
 * lib_ctx_transport(). `flags` are UVSOCK_CTX_*. The transport must not start pumping before
 * this returns.
 * Returns 0, -EINVAL, -ENOMEM. On failure nothing of tp is touched.
 * Ownership: ops is borrowed for the context's lifetime; tp belongs to the transport, which frees
 * it in ops->destroy.
 */
int lib_ctx_create(const struct uvsock_transport_ops *ops, void *tp,
		   const struct vsock_engine_config *cfg, unsigned flags,
		   struct uvsock_ctx **ret);

/* The context's engine and transport state. Valid until uvsock_ctx_free(). Any thread. */
struct vsock_engine *lib_ctx_engine(struct uvsock_ctx *ctx);
void *lib_ctx_transport(struct uvsock_ctx *ctx);

/* The guest role's driver of ctx (src/driver/driver.h), or NULL if ctx is not a guest context:
 * for tests and tools that reach below the API (vdrv_test_io_rx). Any thread. */
struct vdrv;
struct vdrv *lib_ctx_guest_vdrv(struct uvsock_ctx *ctx);

/*
 * Waits until *word != val or the absolute CLOCK_MONOTONIC deadline (ns, UINT64_MAX = none).
 * Returns 0 (woken or value changed, may be spurious), -ETIMEDOUT.
 */
int lib_futex_wait(atomic_uint *word, unsigned val, uint64_t deadline_ns);
/* Wakes every waiter on word. */
void lib_futex_wake(atomic_uint *word);

#endif
