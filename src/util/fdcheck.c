/* SPDX-License-Identifier: MIT */
/*
 * Fd checks and never-blocking eventfd signal and read (see fdcheck.h).
 */
#include "util/fdcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

int fd_check_eventfd(int fd)
{
	static const char want[] = "anon_inode:[eventfd]";
	char path[32], link[sizeof(want) + 1];
	ssize_t n;

	if (fd < 0)
		return -EBADF;
	if (fcntl(fd, F_GETFD) < 0)
		return -errno;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link));
	if (n < 0)
		return -errno;
	/* n == sizeof(link) means a longer name: not ours. */
	if ((size_t)n != sizeof(want) - 1 || memcmp(link, want, sizeof(want) - 1) != 0)
		return -EINVAL;
	return 0;
}

/* 0 if fd is ready for events right now, -EAGAIN if not, -EBADF or the poll() errno. */
static int ready_now(int fd, short events)
{
	struct pollfd p = { .fd = fd, .events = events };
	int r;

	do
		r = poll(&p, 1, 0);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (p.revents & POLLNVAL)
		return -EBADF;
	return p.revents & events ? 0 : -EAGAIN;
}

int eventfd_signal_nb(int fd)
{
	uint64_t one = 1;
	ssize_t n;
	int r;

	if (fd < 0)
		return -EBADF;
	/* An eventfd is writable (POLLOUT) while its counter can take 1 more without blocking. */
	r = ready_now(fd, POLLOUT);
	if (r < 0)
		return r;
	do
		n = write(fd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == sizeof(one) ? 0 : -EIO;
}

int eventfd_consume_nb(int fd, uint64_t *value)
{
	uint64_t v;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };
	ssize_t n;

	do
		n = preadv2(fd, &iov, 1, -1, RWF_NOWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS)) {
		/* A kernel without RWF_NOWAIT for eventfds: poll first. */
		int r = ready_now(fd, POLLIN);

		if (r < 0)
			return r;
		do
			n = read(fd, &v, sizeof(v));
		while (n < 0 && errno == EINTR);
	}
	if (n < 0)
		return -errno;
	if (n != sizeof(v))
		return -EIO;
	if (value)
		*value = v;
	return 0;
}

int fd_check_guest_memory(int fd, uint64_t need_size)
{
	struct stat st;

	if (fd < 0)
		return -EBADF;
	if (fstat(fd, &st) < 0)
		return -errno;
	/* A memfd is a regular file; /dev/zero, a pipe or a socket is not. */
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	if (st.st_size < 0 || (uint64_t)st.st_size < need_size)
		return -ERANGE;
	return 0;
}
