/* SPDX-License-Identifier: MIT */
/*
 * Test helpers shared by the vhost-user unit tests: counting this process's open fds (to prove
 * that nothing leaks on any path) and checking that two fds refer to the same eventfd.
 */
#ifndef UVSOCK_TEST_VHU_FDUTIL_H
#define UVSOCK_TEST_VHU_FDUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Number of open fds of this process (the directory fd itself excluded). */
static inline int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

/* True if a value written to eventfd a can be read back from fd b (same eventfd object). */
static inline int same_eventfd(int a, int b)
{
	uint64_t v = 7, r = 0;

	if (write(a, &v, sizeof(v)) != sizeof(v))
		return 0;
	if (read(b, &r, sizeof(r)) != sizeof(r))
		return 0;
	return r == 7;
}

#endif
