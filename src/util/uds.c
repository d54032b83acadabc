/* SPDX-License-Identifier: MIT */
/*
 * Listening on Unix socket paths (see uds.h): the probe of an existing path and its owner, the
 * listen policy, the default permissions, the registry of inherited sockets and the
 * inode-checked removal.
 */
#include "util/uds.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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

int uds_probe_owner(const char *path, int type, pid_t *owner)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, r;

	if (owner)
		*owner = 0;
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
	if (r == 0 && owner) {
		/* The credentials the listener had at listen() (unix(7), SO_PEERCRED). */
		struct ucred uc;
		socklen_t len = sizeof(uc);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0 && uc.pid > 0)
			*owner = uc.pid;
	}
	if (r == 0 || errno == EAGAIN || errno == EINPROGRESS || errno == EPROTOTYPE)
		r = -EADDRINUSE;
	else if (errno == ECONNREFUSED || errno == ENOENT)
		r = 0; /* stale, or removed since the lstat */
	else
		r = -errno;
	close(fd);
	return r;
}

int uds_probe(const char *path, int type)
{
	return uds_probe_owner(path, type, NULL);
}

int uds_check_fd(int fd, int type, bool *listening)
{
	int v = 0;
	socklen_t len = sizeof(v);
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) < 0)
		return -errno;
	if (v != AF_UNIX)
		return -ENOTSOCK;
	len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0)
		return -errno;
	if (v != type)
		return -EPROTOTYPE;
	len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) < 0)
		return -errno;
	*listening = v != 0;
	if (!*listening) {
		struct sockaddr_un peer;

		len = sizeof(peer);
		if (getpeername(fd, (struct sockaddr *)&peer, &len) < 0)
			return -ENOTCONN;
	}
	return 0;
}

/* ---- process-wide settings: default permissions, adopted sockets ----------------------- */

static unsigned default_mode;
static gid_t default_gid = (gid_t)-1;

void uds_set_default_perms(unsigned mode, gid_t gid)
{
	default_mode = mode;
	default_gid = gid;
}

struct adopted {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int fd;
};

static pthread_mutex_t adopted_lock = PTHREAD_MUTEX_INITIALIZER;
static struct adopted *adopted; /* n_adopted entries, under adopted_lock */
static unsigned n_adopted;

/* Index of path in the registry or -1. Called with adopted_lock held. */
static int adopted_find(const char *path)
{
	for (unsigned i = 0; i < n_adopted; i++)
		if (strcmp(adopted[i].path, path) == 0)
			return (int)i;
	return -1;
}

int uds_adopt(const char *path, int fd)
{
	struct adopted *a;
	int r = 0;

	if (strlen(path) >= sizeof(a->path))
		return -ENAMETOOLONG;
	pthread_mutex_lock(&adopted_lock);
	if (adopted_find(path) >= 0) {
		r = -EEXIST;
		goto out;
	}
	a = realloc(adopted, (n_adopted + 1) * sizeof(*a));
	if (!a) {
		r = -ENOMEM;
		goto out;
	}
	adopted = a;
	snprintf(a[n_adopted].path, sizeof(a->path), "%s", path);
	a[n_adopted++].fd = fd;
out:
	pthread_mutex_unlock(&adopted_lock);
	return r;
}

int uds_take_adopted(const char *path)
{
	int i, fd = -ENOENT;

	pthread_mutex_lock(&adopted_lock);
	i = adopted_find(path);
	if (i >= 0) {
		fd = adopted[i].fd;
		adopted[i] = adopted[--n_adopted];
		if (n_adopted == 0) {
			free(adopted);
			adopted = NULL;
		}
	}
	pthread_mutex_unlock(&adopted_lock);
	return fd;
}

bool uds_is_adopted(const char *path)
{
	bool r;

	pthread_mutex_lock(&adopted_lock);
	r = adopted_find(path) >= 0;
	pthread_mutex_unlock(&adopted_lock);
	return r;
}

void uds_drop_adopted(void)
{
	pthread_mutex_lock(&adopted_lock);
	for (unsigned i = 0; i < n_adopted; i++)
		close(adopted[i].fd);
	free(adopted);
	adopted = NULL;
	n_adopted = 0;
	pthread_mutex_unlock(&adopted_lock);
}

/* An adopted socket as the listener for path: a listener of the type, non-blocking, cloexec. */
static int listen_adopted(int fd, int type, struct uds_listener *l)
{
	bool listening = false;
	int r = uds_check_fd(fd, type, &listening);
	int fl = fcntl(fd, F_GETFL);

	if (r == 0 && !listening)
		r = -EINVAL;
	if (r == 0 && (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
		       fcntl(fd, F_SETFD, FD_CLOEXEC) < 0))
		r = -errno;
	if (r < 0) {
		close(fd);
		return r;
	}
	l->fd = fd;
	l->dev = 0;
	l->ino = 0;
	l->flags = UDS_INHERITED;
	return 0;
}

/* ---- listening -------------------------------------------------------------------------- */

int uds_listen(const char *path, int type, int backlog, unsigned mode, struct uds_listener *l)
{
	struct sockaddr_un sa;
	struct stat st;
	gid_t gid = (gid_t)-1;
	int fd, r;

	l->fd = -1;
	l->flags = 0;
	r = fill_addr(&sa, path);
	if (r < 0)
		return r;
	fd = uds_take_adopted(path);
	if (fd >= 0)
		return listen_adopted(fd, type, l);
	if (mode == 0) {
		mode = default_mode;
		gid = default_gid;
	}
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
	if ((mode && chmod(path, mode) < 0) ||
	    (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) ||
	    (type != SOCK_DGRAM && listen(fd, backlog) < 0) ||
	    stat(path, &st) < 0) {
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

	if ((l->flags & UDS_INHERITED) || lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
		return false;
	if (st.st_dev != l->dev || st.st_ino != l->ino)
		return false;
	return unlink(path) == 0;
}
