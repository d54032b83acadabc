/* SPDX-License-Identifier: MIT */
#include "util/uds.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int fill_addr(struct sockaddr_un *sa, const char *path)
{
	size_t n = strlen(path);

	if (n == 0)
		return -EINVAL;
	if (n >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, n + 1);
	return 0;
}

int uds_probe(const char *path, int type)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, r;

	r = fill_addr(&sa, path);
	if (r < 0)
		return r;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	/*
	 * A connect to a Unix socket never waits for an accept: it succeeds as soon as the
	 * listener's backlog takes it, fails with ECONNREFUSED when no socket is bound there (stale)
	 * and with EAGAIN when a live listener's backlog is full (still live). EPROTOTYPE: a socket of
	 * the other type is bound there, somebody's too. Anything else (EACCES...) tells nothing:
	 * the path is not ours to replace.
	 */
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (r == 0 || errno == EAGAIN || errno == EINPROGRESS || errno == EPROTOTYPE)
		r = -EADDRINUSE;
	else if (errno == ECONNREFUSED || errno == ENOENT)
		r = 0; /* stale, or removed since the lstat */
	else
		r = -errno;
	close(fd);
	return r;
}

int uds_listen(const char *path, int type, int backlog, unsigned mode, struct uds_listener *l)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, r;

	l->fd = -1;
	l->flags = 0;
	r = fill_addr(&sa, path);
	if (r < 0)
		return r;
	r = uds_probe(path, type);
	if (r < 0)
		return r;
	if (lstat(path, &st) == 0) {
		if (unlink(path) < 0 && errno != ENOENT)
			return -errno;
		l->flags |= UDS_REPLACED_STALE;
	}
	fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	if ((mode && chmod(path, mode) < 0) || listen(fd, backlog) < 0 || stat(path, &st) < 0) {
		r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	l->fd = fd;
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	return 0;
}

bool uds_unlink_owned(const char *path, const struct uds_listener *l)
{
	struct stat st;

	if (lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
		return false;
	if (st.st_dev != l->dev || st.st_ino != l->ino)
		return false;
	return unlink(path) == 0;
}
