/* SPDX-License-Identifier: MIT */
/*
 * What the guest-role tests of this folder share: the in-process device (tests/harness/tdev.h)
 * started for one guest CID and stopped with its temporary directory emptied and removed.
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

#endif
