/* SPDX-License-Identifier: MIT */
/*
 * Data-path optimization switches, for before/after measurements (bench/README.md). Every
 * optimization of the data path has a name here and is on by default; a benchmark turns one off
 * to measure what it buys. The switches are process-wide, read-only once the data path runs:
 * set them at start-up (uvsockd --tune, or the environment variable UVSOCK_TUNE, read by
 * tune_get() the first time), before any device, engine or guest role is created.
 *
 * The list is comma-separated; "no-NAME" turns NAME off, "NAME" turns it on, "NAME=N" sets a
 * number (busy-poll-us); "dirty-log" (off by default) is a measurement setting, not a switch.
 * Example: UVSOCK_TUNE=no-zerocopy,no-event-idx
 */
#ifndef UVSOCK_UTIL_TUNE_H
#define UVSOCK_UTIL_TUNE_H

#include <stdbool.h>
#include <stddef.h>

/* X(field, "name", what it switches); every one defaults to on. */
#define TUNE_SWITCHES(X)                                                                           \
	X(zerocopy, "zerocopy", "device: host socket I/O straight from/into guest buffers")        \
	X(tx_batch, "tx-batch", "device: pop TX chains in batches, one interrupt per batch")       \
	X(event_idx, "event-idx", "offer VIRTIO_RING_F_EVENT_IDX (device and guest role)")        \
	X(rx_batch, "rx-batch", "guest role and engine: one socket-lock hold per flow per batch")  \
	X(credit_reduce, "credit-reduce", "engine: credit updates only when the peer needs one")   \
	X(merge, "merge", "engine: merge small payloads into one packet")                          \
	X(pkt64k, "pkt64k", "packets up to 64 KiB (off: 4 KiB, as Linux before 6.x)")              \
	X(rx_adaptive, "rx-adaptive", "guest role: adaptive RX buffer size")                       \
	X(direct_rx, "direct-rx", "guest role: a waiting recv/poll caller drains the RX ring")     \
	X(tx_direct, "tx-direct", "guest role: send copies once, straight into TX buffers")        \
	X(in_order, "in-order", "offer and negotiate VIRTIO_F_IN_ORDER (device and guest role)")   \
	X(packed, "packed", "offer/negotiate VIRTIO_F_RING_PACKED (device and guest role)")       \
	X(dgram_lockfree, "dgram-lockfree", "engine: datagram sends without the socket lock")

struct tune {
#define TUNE_FIELD(f, n, d) bool f;
	TUNE_SWITCHES(TUNE_FIELD)
#undef TUNE_FIELD
	unsigned busy_poll_us; /* device thread spins this long after work; 0: never (default) */
	/* "dirty-log": the guest role (the front-end) turns vhost-user dirty logging on once its
	 * rings run, as QEMU does during a live migration, to measure what logging costs the
	 * back-end (uvsock-perf --dirty-log). Not an optimization: off by default. */
	bool dirty_log;
};

/*
 * The process's switches: parsed from UVSOCK_TUNE on the first call (an unparsable variable is
 * reported on stderr once and ignored), or as set by tune_set(). Any thread.
 */
const struct tune *tune_get(void);

/*
 * Parses `list` over the current switches and installs the result. Returns 0, or -EINVAL with
 * a message naming the bad item in err. Call before the data path starts (not thread-safe
 * against concurrent tune_get() callers that already run).
 */
int tune_set(const char *list, char *err, size_t errlen);

/* Writes "name=on|off,..." of the current switches into buf (for logs and benchmark output). */
void tune_describe(char *buf, size_t len);

#endif
