/* SPDX-License-Identifier: MIT */
/*
 * The client side of uvsockd's control socket (proto.h; the server is daemon/ctl.h): finding a
 * daemon's control socket without ever connecting to a vhost-user socket (find.c), connecting,
 * and one request / one answer with an optional passed file descriptor (client.c). Used by
 * uvsock-stat, uvsock-ctl and libuvsock-preload.so.
 *
 * Security model: the answer comes from a daemon that may be of another version or broken: it is
 * size-bounded (OPS_STATCLI_MAX_ANSWER), time-bounded and parsed with the bounded JSON reader.
 */
#ifndef UVSOCK_CTLPROTO_CLIENT_H
#define UVSOCK_CTLPROTO_CLIENT_H

#include <stddef.h>

#include "ctlproto/json.h"
#include "ctlproto/proto.h"

#define OPS_STATCLI_MAX_ANSWER (64u << 20)

/* At most this many "*.ctl" sockets of one directory are asked by ops_ctl_find. */
#define OPS_CTL_FIND_MAX 64

/*
 * Finds the control socket for path and connects to it, never connecting to a vhost-user
 * socket (find.c):
 *  - path's name ends in ".ctl": it is a control socket, connected to as is;
 *  - otherwise path is taken as a VM's vhost-user socket and is only stat()ed; the candidates
 *    are "<path>.ctl", then the "*.ctl" sockets of path's directory (name order, at most
 *    OPS_CTL_FIND_MAX); each is asked "stats" (at most 2 s) and the first whose VM list has a
 *    VM with socket path (the same file) is the answer; "<path>.ctl" is also taken when its
 *    daemon lists no socket paths at all (a daemon from before the "socket" member).
 * On success *ret_fd is connected (the "stats" exchange done) and found (if not NULL) holds
 * the control socket's path. Returns 0, -ENOENT/-EACCES... (stat of path), -ENOTSOCK (path is
 * not a socket), -EACCES when no candidate lists path and one refused us (the 0600 control
 * socket of another user's daemon: found then holds that candidate, as it does for a *.ctl
 * path that refused us), -ESRCH (no control socket lists path), or the errno of connect for a
 * *.ctl path. Context: any thread; blocks at most 2 s per candidate.
 */
int ops_ctl_find(const char *path, int *ret_fd, char *found, size_t found_len);

/*
 * What a failed connect to a control socket means, for a client's message (ENOENT: no daemon
 * there; ECONNREFUSED: a socket file left by a daemon that is gone; EACCES: the socket is the
 * daemon's user's and root's only...), else strerror. Never NULL.
 */
const char *ops_ctl_why(int err);

/* ops_ctl_find(path, ret_fd, NULL, 0). */
int ops_ctl_connect(const char *path, int *ret_fd);

/* Connects to path as it is, for a path the caller knows is a control socket. 0 or -errno. */
int ops_ctl_connect_exact(const char *path, int *ret_fd);

/*
 * Connects to path as it is, for a path the caller was told is a control socket (--control),
 * and checks it is one: it must answer "stats" within timeout_ms. Returns 0 (*ret_fd open, the
 * exchange done), the errno of connect, or -EBADMSG when it did not answer as a control socket,
 * with *ret_probe the reason (-ETIMEDOUT, -ECONNRESET, -EPROTO: not the control protocol...).
 */
int ops_ctl_connect_probed(const char *path, int timeout_ms, int *ret_fd, int *ret_probe);

/*
 * Sends `req` plus a newline (with pass_fd as SCM_RIGHTS if >= 0; the caller keeps its copy)
 * and reads one answer line within timeout_ms. On success *ret_raw is the line without the
 * newline (malloc'd) and *ret the parsed JSON (either may be NULL if not wanted).
 * Returns 0, -ETIMEDOUT, -ECONNRESET (closed before a full line), -E2BIG (answer over the
 * bound), -EPROTO (not JSON), -ENOMEM, or the errno of send/recv.
 */
int ops_ctl_request(int fd, const char *req, int pass_fd, int timeout_ms, char **ret_raw,
		    struct ops_jv **ret);

#endif
