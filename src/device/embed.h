/* SPDX-License-Identifier: MIT */
/*
 * The public device API's own state (embed.c, <uvsock/device.h>), declared next to its code:
 * struct dev_embed is embed.c's part of struct vsock_dev (d->embed).
 */
#ifndef UVSOCK_DEVICE_EMBED_H
#define UVSOCK_DEVICE_EMBED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/*
 * Who runs the device. thread and thread_started: set by uvsock_dev_start, before the thread
 * runs, and read by uvsock_dev_free (any thread, the device stopped). ext_loop: constant.
 * owner: the loop thread's mark (UVSOCK_DEV_EXTERNAL_LOOP), set once by the first
 * uvsock_dev_process, read by every call (atomic).
 */
struct dev_embed {
	bool thread_started;           /* embed.c started `thread` (joined by uvsock_dev_free) */
	pthread_t thread;
	/* UVSOCK_DEV_EXTERNAL_LOOP: no device thread; the VMM's loop thread runs the loop through
	 * uvsock_dev_process */
	bool ext_loop;
	const void *_Atomic owner;     /* the loop thread's mark once it ran, or NULL */
	/* uvsock_dev_save succeeded and no uvsock_dev_resume followed: calls but resume, free
	 * and get_stats are refused; written by the device thread (relaxed: a flag) */
	atomic_bool saved;
};

/* Devices of uvsock_dev_new alive, i.e. references on their shared router (0: the router is
 * freed). For tests. Any thread. */
unsigned dev_embed_router_refs(void);

#endif
