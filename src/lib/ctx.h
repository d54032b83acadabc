/* SPDX-License-Identifier: MIT */
/*
 * Private to src/lib: the context structure and the hooks between the context (ctx.c) and the
 * socket layer (socket.c). Transports use lib.h only. Names internal to src/lib start with
 * lib_; uvsock_ is the public API's (include/uvsock/uvsock.h).
 */
#ifndef UVSOCK_LIB_CTX_H
#define UVSOCK_LIB_CTX_H

#include "lib/lib.h"

struct usock;

struct uvsock_ctx {
	const struct uvsock_transport_ops *tops;
	void *tp;                      /* transport state */
	struct vsock_engine *engine;
	struct vsock_engine_ops eops;  /* borrowed by the engine */
	unsigned flags;                /* UVSOCK_CTX_* */
	pthread_mutex_t mu;
	/* Protected by mu: every live usock of this context (for uvsock_ctx_free). */
	struct usock *socks;
};

/*
 * Engine sock_event for a socket whose user pointer is a usock: wakes blocked callers and
 * updates the pollable descriptor. Runs with the engine's socket lock held (see engine.h).
 */
void lib_sock_event(struct usock *us, unsigned mask);

/* Closes every socket of ctx still open (uvsock_ctx_free). No call may be in progress. */
void lib_ctx_close_all(struct uvsock_ctx *ctx);

#endif
