/* SPDX-License-Identifier: MIT */
/*
 * A device role (struct vsock_dev, src/device/vsock_dev.h) in a temporary directory, run on its own
 * thread: the in-process back-end of the device tests (tests/unit/device/test-device.c, which
 * play the VMM themselves) and of the guest-role tests (tests/unit/driver/test-driver.c). The
 * vhost-user socket is <dir>/vm.sock, the host-side Unix socket <dir>/vm.vsock. Each test removes
 * the directory in its own way (empty, or with the host listeners it made there).
 */
#ifndef UVSOCK_TESTS_TDEV_H
#define UVSOCK_TESTS_TDEV_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/vsock_dev.h"
#include "device/vhu.h"
#include "test.h"

struct tdev {
	struct vsock_dev *d;
	struct dev_vhu *vhu; /* the vhost-user glue on sock, as uvsockd attaches it */
	pthread_t th;
	bool running; /* tdev_run started the thread, tdev_halt has not joined it */
	char dir[64];
	char sock[128], uds[128];
};

static inline void *tdev_thread_(void *arg)
{
	struct tdev *t = arg;

	vsock_dev_run(t->d);
	return NULL;
}

/* Creates the device for guest CID cid (router r, or NULL for a device of its own); not run. */
static inline void tdev_new(struct tdev *t, struct vsock_router *r, uint32_t cid)
{
	struct vsock_dev_config cfg = {
		.guest_cid = cid,
		.buf_alloc = 256 * 1024,
		.queue_size_max = 1024,
	};

	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "/tmp/uvsock-tdev-XXXXXX");
	ASSERT_TRUE(mkdtemp(t->dir) != NULL);
	snprintf(t->sock, sizeof(t->sock), "%s/vm.sock", t->dir);
	snprintf(t->uds, sizeof(t->uds), "%s/vm.vsock", t->dir);
	cfg.uds_path = t->uds;
	ASSERT_OK(vsock_dev_new(r, &cfg, &t->d));
	ASSERT_OK(dev_vhu_new(t->d, t->sock, cfg.queue_size_max, &t->vhu));
}

/* Runs the device's loop (vsock_dev_run) on a thread of its own. */
static inline void tdev_run(struct tdev *t)
{
	ASSERT_EQ(pthread_create(&t->th, NULL, tdev_thread_, t), 0);
	t->running = true;
}

/* Stops and joins the thread if it runs, and frees the device (which removes its sockets). */
static inline void tdev_halt(struct tdev *t)
{
	if (t->running) {
		vsock_dev_stop(t->d);
		pthread_join(t->th, NULL);
		t->running = false;
	}
	dev_vhu_free(t->vhu);
	t->vhu = NULL;
	vsock_dev_free(t->d);
	t->d = NULL;
}

#endif
