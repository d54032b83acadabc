/* SPDX-License-Identifier: MIT */
/*
 * A recording fake of the device role for the vhost-user tests: every callback appends a short
 * token to an event log ("start0 stop1 memchg memnew call0 feat"), keeps what queue_start got,
 * and reads the used index through the host pointer it was given (as a real device does), so
 * a bad translation shows up as a wrong value or an ASan report. Thread-safe, because the
 * front-end tests run the back-end in a thread of its own.
 */
#ifndef UVSOCK_TEST_VHU_FAKEDEV_H
#define UVSOCK_TEST_VHU_FAKEDEV_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vhost_user/backend.h"

struct fakedev {
	pthread_mutex_t lock;
	char log[2048];
	int starts[VHU_NUM_QUEUES], stops[VHU_NUM_QUEUES];
	struct vhu_vring_info info[VHU_NUM_QUEUES]; /* last queue_start */
	uint16_t used_idx_seen[VHU_NUM_QUEUES]; /* used->idx read at queue_start */
	uint16_t stop_ret[VHU_NUM_QUEUES];      /* what queue_stop returns */
	int call_fd[VHU_NUM_QUEUES];            /* last call fd seen (start or change) */
	int start_error;               /* queue_start returns this if non-zero */
	uint64_t features;
	const struct guest_mem *mem;
};

/* Appends token name followed by q when q >= 0. */
static inline void fakedev_log(struct fakedev *d, const char *name, int q)
{
	char tok[32];
	size_t n = strlen(d->log);

	if (q >= 0)
		snprintf(tok, sizeof(tok), "%s%d", name, q);
	else
		snprintf(tok, sizeof(tok), "%s", name);
	if (n + strlen(tok) + 2 < sizeof(d->log))
		snprintf(d->log + n, sizeof(d->log) - n, "%s%s", n ? " " : "", tok);
}

static inline int fakedev_queue_start(void *opaque, unsigned q, const struct vhu_vring_info *info)
{
	struct fakedev *d = opaque;
	uint16_t used_idx;

	pthread_mutex_lock(&d->lock);
	if (d->start_error) {
		pthread_mutex_unlock(&d->lock);
		return d->start_error;
	}
	memcpy(&used_idx, (const char *)info->used + 2, sizeof(used_idx));
	d->used_idx_seen[q] = used_idx;
	d->info[q] = *info;
	d->call_fd[q] = info->call_fd;
	d->starts[q]++;
	fakedev_log(d, "start", (int)q);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

static inline uint16_t fakedev_queue_stop(void *opaque, unsigned q)
{
	struct fakedev *d = opaque;
	uint16_t r;

	pthread_mutex_lock(&d->lock);
	d->stops[q]++;
	fakedev_log(d, "stop", (int)q);
	r = d->stop_ret[q];
	pthread_mutex_unlock(&d->lock);
	return r;
}

static inline void fakedev_call_changed(void *opaque, unsigned q, int fd)
{
	struct fakedev *d = opaque;

	pthread_mutex_lock(&d->lock);
	d->call_fd[q] = fd;
	fakedev_log(d, "call", (int)q);
	pthread_mutex_unlock(&d->lock);
}

static inline void fakedev_mem_changing(void *opaque)
{
	struct fakedev *d = opaque;

	pthread_mutex_lock(&d->lock);
	d->mem = NULL;
	fakedev_log(d, "memchg", -1);
	pthread_mutex_unlock(&d->lock);
}

static inline void fakedev_mem_changed(void *opaque, const struct guest_mem *mem)
{
	struct fakedev *d = opaque;

	pthread_mutex_lock(&d->lock);
	d->mem = mem;
	fakedev_log(d, "memnew", -1);
	pthread_mutex_unlock(&d->lock);
}

static inline void fakedev_features(void *opaque, uint64_t f)
{
	struct fakedev *d = opaque;

	pthread_mutex_lock(&d->lock);
	d->features = f;
	fakedev_log(d, "feat", -1);
	pthread_mutex_unlock(&d->lock);
}

static const struct vhu_backend_ops fakedev_ops = {
	.queue_start = fakedev_queue_start,
	.queue_stop = fakedev_queue_stop,
	.call_fd_changed = fakedev_call_changed,
	.mem_table_changing = fakedev_mem_changing,
	.mem_table_changed = fakedev_mem_changed,
	.features_set = fakedev_features,
};

static inline void fakedev_init(struct fakedev *d)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	d->call_fd[0] = d->call_fd[1] = -1;
}

/* Copies the log and clears it. */
static inline void fakedev_take_log(struct fakedev *d, char *buf, size_t len)
{
	pthread_mutex_lock(&d->lock);
	size_t n = strlen(d->log);

	if (n >= len)
		n = len - 1;
	memcpy(buf, d->log, n);
	buf[n] = 0;
	d->log[0] = 0;
	pthread_mutex_unlock(&d->lock);
}

#endif
