/* SPDX-License-Identifier: MIT */
/*
 * The host side's two Unix-socket primitives (see uds_connect.h): the CONNECT line reader and
 * parser of the hybrid handshake, and the connect to <uds-path>_<port> that follows no symlink.
 */
#include "device/uds_connect.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

int uds_connect_parse(const char *line, size_t len, uint32_t *ret_port)
{
	static const char kw[] = "connect";
	size_t i = 0, digits = 0;
	uint64_t port = 0;

	if (len == 0 || len > UDS_CONNECT_LINE_MAX || line[len - 1] != '\n')
		return -EPROTO;
	len--;
	for (; i < sizeof(kw) - 1; i++) {
		char c = i < len ? line[i] : '\0';

		if (c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		if (c != kw[i])
			return -EPROTO;
	}
	if (i >= len || !is_blank(line[i]))
		return -EPROTO;
	while (i < len && is_blank(line[i]))
		i++;
	while (i < len && line[i] >= '0' && line[i] <= '9') {
		if (++digits > 10)
			return -EPROTO;
		port = port * 10 + (uint64_t)(line[i] - '0');
		i++;
	}
	if (digits == 0 || port >= UINT32_MAX)
		return -EPROTO;
	while (i < len && (is_blank(line[i]) || line[i] == '\r'))
		i++;
	if (i != len)
		return -EPROTO;
	*ret_port = (uint32_t)port;
	return 0;
}

static int read_seqpacket(struct uds_connect_reader *r, int fd, uint32_t *ret_port)
{
	ssize_t n;

	n = recv(fd, r->buf, sizeof(r->buf), MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (n == 0)
		return -ECONNRESET;
	if ((size_t)n > sizeof(r->buf))
		return -EMSGSIZE;
	if (r->buf[n - 1] != '\n')
		return -EPROTO;
	return uds_connect_parse(r->buf, (size_t)n, ret_port);
}

int uds_connect_read(struct uds_connect_reader *r, int fd, bool seqpacket, uint32_t *ret_port)
{
	if (seqpacket)
		return read_seqpacket(r, fd, ret_port);
	for (;;) {
		size_t room = sizeof(r->buf) - r->len;
		char *nl;
		ssize_t n;
		size_t take;

		if (room == 0)
			return -EMSGSIZE;
		/* Peek first, then consume only up to the newline: what follows is stream data. */
		n = recv(fd, r->buf + r->len, room, MSG_DONTWAIT | MSG_PEEK);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		if (n == 0)
			return -ECONNRESET;
		nl = memchr(r->buf + r->len, '\n', (size_t)n);
		take = nl ? (size_t)(nl - (r->buf + r->len)) + 1 : (size_t)n;
		n = recv(fd, r->buf + r->len, take, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		/* A stream socket hands out peeked bytes in order, so n == take here. */
		r->len += (size_t)n;
		if (nl && (size_t)n == take)
			return uds_connect_parse(r->buf, r->len, ret_port);
		if (r->len == sizeof(r->buf))
			return -EMSGSIZE;
		/* Everything pending is consumed; wait for more. */
		if ((size_t)n == take)
			return -EAGAIN;
	}
}

size_t uds_connect_format_ok(char *buf, uint32_t port)
{
	return (size_t)snprintf(buf, 16, "OK %u\n", port);
}

/* Binds fd to the abstract name `abstract` (without its leading NUL). Returns 0 or -errno. */
static int bind_abstract(int fd, const char *abstract)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(abstract);

	if (n + 1 > sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path + 1, abstract, n);
	return bind(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
							  1 + n)) < 0 ? -errno : 0;
}

int uds_connect_at(int dirfd, const char *name, int type, bool *ret_pending)
{
	return uds_connect_at_as(dirfd, name, type, NULL, ret_pending);
}

int uds_connect_at_as(int dirfd, const char *name, int type, const char *abstract,
		      bool *ret_pending)
{
	struct stat st;

	return uds_connect_at_st(dirfd, name, type, abstract, ret_pending, &st);
}

int uds_connect_at_st(int dirfd, const char *name, int type, const char *abstract,
		      bool *ret_pending, struct stat *ret_st)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int pfd, fd, r;

	if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	/* O_PATH | O_NOFOLLOW: a symlink there gives an fd of the link itself, not its target. */
	pfd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		return -errno;
	if (fstat(pfd, &st) < 0) {
		r = -errno;
		goto out_path;
	}
	if (S_ISLNK(st.st_mode) || !S_ISSOCK(st.st_mode)) {
		r = S_ISLNK(st.st_mode) ? -ELOOP : -ENOTSOCK;
		goto out_path;
	}
	/* The magic link resolves to the very inode pfd holds: a file swapped in since is not
	 * looked at (connect() has no *at form, and this is the race-free one). */
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d", pfd);
	fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		goto out_path;
	}
	/* Autobind: a sun_family alone asks the kernel for a fresh abstract name. */
	if (abstract && !abstract[0] && bind(fd, (struct sockaddr *)&sa, sizeof(sa_family_t)) < 0) {
		r = -errno;
		close(fd);
		goto out_path;
	}
	/* Taken already (a name is never reused while its socket lives): connect unnamed. */
	if (abstract && abstract[0])
		(void)bind_abstract(fd, abstract);
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	close(pfd);
	if (r < 0 && r != -EINPROGRESS) {
		close(fd);
		/* The file was there (pfd): ENOENT now means /proc is not mounted. */
		return r == -ENOENT ? -EOPNOTSUPP : r;
	}
	*ret_pending = r == -EINPROGRESS;
	*ret_st = st;
	return fd;

out_path:
	close(pfd);
	return r;
}
