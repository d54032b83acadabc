/* SPDX-License-Identifier: MIT */
/*
 * For tests of what the logger prints: stderr redirected into a memfd for the rest of the
 * (forked) case, and the text written so far. Used by tests/unit/util/test-log.c,
 * tests/unit/ops/test-vmlog.c and tests/unit/device/test-device.c.
 */
#ifndef UVSOCK_TEST_STDERR_CAPTURE_H
#define UVSOCK_TEST_STDERR_CAPTURE_H

#include <sys/mman.h>
#include <unistd.h>

#include "test.h"

/* Points stderr at a fresh memfd and returns it. */
static inline int capture_stderr(void)
{
	int fd = memfd_create("stderr", 0);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(dup2(fd, 2), 2);
	return fd;
}

/* Returns the text captured in fd so far (a static buffer, NUL-terminated). */
static inline const char *captured(int fd)
{
	static char buf[1 << 16];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	ASSERT_TRUE(n >= 0);
	buf[n] = '\0';
	return buf;
}

#endif
