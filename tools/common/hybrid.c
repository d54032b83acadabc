/* SPDX-License-Identifier: MIT */
/* The host side of a hybrid vsock back-end (hybrid.h). */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "hybrid.h"

/* A Unix socket of type at path: connected to it, or bound there and listening. */
static int unix_at(const char *path, int type, bool listening)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd, err;

	if (strlen(path) >= sizeof(a.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(a.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (listening)
		unlink(path);
	if (listening ? bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1024) == 0
		      : connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		return fd;
	err = errno;
	close(fd);
	errno = err;
	return -1;
}

int hybrid_unix_connect(const char *path, int type)
{
	return unix_at(path, type, false);
}

int hybrid_listen(const char *path, int type)
{
	return unix_at(path, type, true);
}

int hybrid_accept(int lfd, int ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	int r;

	do {
		r = poll(&p, 1, ms);
	} while (r < 0 && errno == EINTR);
	if (r == 0)
		errno = ETIMEDOUT;
	if (r <= 0)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

int hybrid_connect(const char *uds, unsigned port, int type, int timeout_ms)
{
	char line[64], path[256];
	size_t got = 0;
	int fd, n, err = ECONNREFUSED;

	if ((size_t)snprintf(path, sizeof(path), "%s%s", uds,
			     type == SOCK_SEQPACKET ? "_seqpacket" : "") >= sizeof(path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	fd = hybrid_unix_connect(path, type);
	if (fd < 0)
		return -1;
	n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	if (write(fd, line, (size_t)n) != n)
		goto fail;
	while (got + 1 < sizeof(line)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;
		int pr = poll(&p, 1, timeout_ms);

		if (pr == 0)
			err = ETIMEDOUT;
		if (pr <= 0)
			goto fail;
		/* Stream: byte by byte, so no payload is eaten; seqpacket: one message. */
		r = read(fd, line + got, type == SOCK_SEQPACKET ? sizeof(line) - 1 - got : 1);
		if (r <= 0)
			goto fail;
		got += (size_t)r;
		if (line[got - 1] == '\n')
			break;
	}
	if (got >= 3 && strncmp(line, "OK ", 3) == 0)
		return fd;
fail:
	close(fd);
	errno = err;
	return -1;
}
