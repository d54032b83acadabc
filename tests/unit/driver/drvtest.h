/* SPDX-License-Identifier: MIT */
/*
 * What the guest-role tests of this folder share: the in-process device (tests/harness/tdev.h)
 * started for one guest CID and stopped with its temporary directory emptied and removed, and
 * (with guestside.h) one guest connection accepted from the host.
 */
#ifndef UVSOCK_TESTS_DRVTEST_H
#define UVSOCK_TESTS_DRVTEST_H

#include <dirent.h>
#include <unistd.h>

#include "tdev.h"
#include "test.h"

static inline void tdev_start(struct tdev *t, uint32_t cid)
{
	tdev_new(t, NULL, cid);
	tdev_run(t);
}

static inline void tdev_stop(struct tdev *t)
{
	tdev_halt(t);
	/* The device removed its sockets; the test's host listeners (<uds>_<port>) go here. */
	{
		DIR *dir = opendir(t->dir);
		struct dirent *de;
		char path[400];

		while (dir && (de = readdir(dir)) != NULL) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "%s/%s", t->dir, de->d_name);
			unlink(path);
		}
		if (dir)
			closedir(dir);
	}
	ASSERT_EQ(rmdir(t->dir), 0);
}

/*
 * A device for CID 3 and a guest on it, with one host connection accepted on port 6000
 * (the file including this includes guestside.h and <uvsock/uvsock.h> first).
 */
struct conn {
	struct tdev t;
	struct uvsock_ctx *g;
	int ls, gfd, hfd;
};

static inline void conn_open(struct conn *c)
{
	/* Without datagrams: the RX sizing these tests check is the adaptive one. */
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = UVSOCK_GUEST_NO_DGRAM };

	tdev_start(&c->t, 3);
	c->g = g_guest_new(c->t.sock, &o);
	c->ls = g_listen(c->g, SOCK_STREAM, 6000);
	c->gfd = g_accept_host(c->ls, c->t.uds, SOCK_STREAM, 6000, &c->hfd);
	g_set_timeouts(c->gfd, WAIT_MS);
}

static inline void conn_close(struct conn *c)
{
	uvsock_close(c->gfd);
	close(c->hfd);
	uvsock_close(c->ls);
	uvsock_ctx_free(c->g);
	tdev_stop(&c->t);
}

#endif
