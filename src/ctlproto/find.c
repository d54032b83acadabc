/* SPDX-License-Identifier: MIT */
/*
 * Finding and connecting to a daemon's control socket (see client.h, ops_ctl_connect): the
 * rule that keeps uvsock-stat from ever talking to a vhost-user socket. Only paths whose name
 * says "control socket" (*.ctl) are connected to, unless the caller asserts one (--control);
 * a VM's vhost-user socket is only stat()ed, and its daemon is the one whose control socket
 * lists it in its "stats" answer (member "socket" of each VM).
 */
#include "ctlproto/client.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>


/* What one candidate may take to answer "stats": a live daemon answers in microseconds. */
#define FIND_TIMEOUT_MS 2000

int ops_ctl_default_path(const char *vhost_socket, char *buf, size_t len)
{
	size_t n = strlen(vhost_socket) + strlen(OPS_CTL_SUFFIX);

	if (n > sizeof(((struct sockaddr_un *)0)->sun_path) - 1 || n + 1 > len)
		return -ENAMETOOLONG;
	snprintf(buf, len, "%s%s", vhost_socket, OPS_CTL_SUFFIX);
	return 0;
}

int ops_ctl_connect_exact(const char *path, int *ret_fd)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(path);
	int fd;

	if (n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, n + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

int ops_ctl_connect_probed(const char *path, int timeout_ms, int *ret_fd, int *ret_probe)
{
	struct ops_jv *ans = NULL;
	int fd, r;

	*ret_probe = 0;
	r = ops_ctl_connect_exact(path, &fd);
	if (r < 0)
		return r;
	/* A control socket answers "stats" at once; another kind of socket does not (a VM's
	 * vhost-user socket waits for a vhost-user header). */
	r = ops_ctl_request(fd, "stats", -1, timeout_ms, NULL, &ans);
	if (r == 0 && !ops_json_get(ans, "ok"))
		r = -EPROTO;
	ops_json_free(ans);
	if (r < 0) {
		close(fd);
		*ret_probe = r;
		return -EBADMSG;
	}
	*ret_fd = fd;
	return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n > m && strcmp(s + n - m, suffix) == 0;
}

/*
 * Whether the daemon behind control connection fd names `want` (stat()ed as *want_st) as the
 * socket of VM v. The daemon reports the path as it was configured, possibly relative to its
 * own working directory: that one is looked up under /proc/PID/cwd (PID from SO_PEERCRED).
 */
static bool vm_is(int fd, const struct ops_jv *v, const char *want, const struct stat *want_st)
{
	const char *s = ops_json_str(v, "socket", "");
	char buf[PATH_MAX];
	struct stat st;

	if (!*s)
		return false;
	if (strcmp(s, want) == 0)
		return true;
	if (s[0] != '/') {
		struct ucred cr;
		socklen_t len = sizeof(cr);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
			return false;
		if (snprintf(buf, sizeof(buf), "/proc/%d/cwd/%s", (int)cr.pid, s) >=
		    (int)sizeof(buf))
			return false;
		s = buf;
	}
	return stat(s, &st) == 0 && st.st_dev == want_st->st_dev && st.st_ino == want_st->st_ino;
}

/*
 * Connects to the control socket candidate cand and asks "stats". Returns 1 (with *ret_fd open)
 * if it lists `want`, or if it lists no socket at all and cand is "<want>.ctl" (a daemon that
 * predates the "socket" member: that is the default control path of its first VM); -EACCES if
 * cand refused us (a control socket is its daemon's user's and root's only); 0 otherwise.
 */
static int try_candidate(const char *cand, const char *want, const struct stat *want_st,
			 bool is_default, int *ret_fd)
{
	struct ops_jv *ans = NULL;
	const struct ops_jv *vms;
	bool match = false, any_socket = false;
	int fd, r;

	r = ops_ctl_connect_exact(cand, &fd);
	if (r == -EACCES || r == -EPERM)
		return -EACCES;
	if (r < 0)
		return 0;
	if (ops_ctl_request(fd, "stats", -1, FIND_TIMEOUT_MS, NULL, &ans) < 0 ||
	    !ops_json_bool(ans, "ok", false)) {
		ops_json_free(ans);
		close(fd);
		return 0;
	}
	vms = ops_json_get(ans, "vms");
	for (const struct ops_jv *v = vms ? vms->child : NULL; v && !match; v = v->next) {
		any_socket |= *ops_json_str(v, "socket", "") != '\0';
		match = vm_is(fd, v, want, want_st);
	}
	ops_json_free(ans);
	if (match || (is_default && !any_socket)) {
		*ret_fd = fd;
		return 1;
	}
	close(fd);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.ctl sockets of dir, sorted, at most OPS_CTL_FIND_MAX; *ret and each entry malloc'd. */
static int list_ctl_sockets(const char *dir, char ***ret, unsigned *ret_n)
{
	DIR *d = opendir(dir);
	char **v = NULL;
	unsigned n = 0;
	struct dirent *de;

	*ret = NULL;
	*ret_n = 0;
	if (!d)
		return -errno;
	v = calloc(OPS_CTL_FIND_MAX, sizeof(*v));
	if (!v) {
		closedir(d);
		return -ENOMEM;
	}
	while (n < OPS_CTL_FIND_MAX && (de = readdir(d)) != NULL) {
		char p[PATH_MAX];
		struct stat st;

		if (!ends_with(de->d_name, OPS_CTL_SUFFIX) ||
		    snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= (int)sizeof(p) ||
		    lstat(p, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		v[n] = strdup(p);
		if (v[n])
			n++;
	}
	closedir(d);
	qsort(v, n, sizeof(*v), cmp_str);
	*ret = v;
	*ret_n = n;
	return 0;
}

/* Copies s into found (if any): the path ops_ctl_find names to its caller. */
static void set_found(char *found, size_t found_len, const char *s)
{
	if (found && found_len)
		snprintf(found, found_len, "%s", s);
}

int ops_ctl_find(const char *path, int *ret_fd, char *found, size_t found_len)
{
	char def[PATH_MAX], dir[PATH_MAX], denied[PATH_MAX] = "", *slash;
	struct stat st;
	char **cands;
	unsigned n;
	int r = -ESRCH, c;

	if (stat(path, &st) < 0)
		return -errno;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	if (ends_with(path, OPS_CTL_SUFFIX)) {
		r = ops_ctl_connect_exact(path, ret_fd);
		if (r == 0 || r == -EACCES || r == -EPERM)
			set_found(found, found_len, path);
		return r;
	}
	/* path is taken as a VM's vhost-user socket: from here on it is never connected to. */
	if (snprintf(def, sizeof(def), "%s%s", path, OPS_CTL_SUFFIX) < (int)sizeof(def)) {
		c = try_candidate(def, path, &st, true, ret_fd);
		if (c == 1) {
			set_found(found, found_len, def);
			return 0;
		}
		if (c == -EACCES)
			snprintf(denied, sizeof(denied), "%s", def);
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	/* An unreadable directory leaves "<path>.ctl" as the only candidate (cands NULL, n 0). */
	(void)list_ctl_sockets(dir, &cands, &n);
	for (unsigned i = 0; i < n; i++) {
		/* The same directory: "<path>.ctl" (asked above) is the one with its base name. */
		if (r == -ESRCH && strcmp(basename(cands[i]), basename(def)) != 0) {
			c = try_candidate(cands[i], path, &st, false, ret_fd);
			if (c == 1) {
				set_found(found, found_len, cands[i]);
				r = 0;
			} else if (c == -EACCES && !denied[0]) {
				snprintf(denied, sizeof(denied), "%s", cands[i]);
			}
		}
		free(cands[i]);
	}
	free(cands);
	/* None lists path, and one we may not ask could: permission is the cause to name. */
	if (r == -ESRCH && denied[0]) {
		set_found(found, found_len, denied);
		r = -EACCES;
	}
	return r;
}

int ops_ctl_connect(const char *path, int *ret_fd)
{
	return ops_ctl_find(path, ret_fd, NULL, 0);
}
