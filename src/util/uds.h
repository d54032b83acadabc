/* SPDX-License-Identifier: MIT */
/*
 * The one way the tree listens on a Unix socket path (vhost-user sockets, host-side sockets,
 * the control socket), with one policy for a path that already exists:
 *   - not a socket: -EEXIST, nothing touched;
 *   - a socket somebody accepts connections on (a live daemon), or one of another type bound
 *     there: -EADDRINUSE, nothing touched; one that cannot be probed (-EACCES...): that errno;
 *   - a socket nobody listens on (left by a crash): unlinked and replaced (the caller may log
 *     it: UDS_REPLACED_STALE is set in *flags_out).
 * uds_unlink_owned() removes the path at exit only if it is still the socket we bound (same
 * device and inode), so a daemon never deletes a path another instance has taken since.
 */
#ifndef UVSOCK_UTIL_UDS_H
#define UVSOCK_UTIL_UDS_H

#include <stdbool.h>
#include <sys/types.h>

#define UDS_REPLACED_STALE 1u

struct uds_listener {
	int fd;
	dev_t dev;
	ino_t ino;
	unsigned flags; /* UDS_REPLACED_STALE */
};

/*
 * Probes the path (connect with the socket's type): 0 if nothing is there or a stale socket,
 * -EADDRINUSE if something accepts (or a socket of another type is bound there), -EEXIST if the
 * path is not a socket, -ENAMETOOLONG, or the errno of a connect that tells neither (-EACCES...).
 */
int uds_probe(const char *path, int type);

/*
 * Listens on path: type SOCK_STREAM or SOCK_SEQPACKET, the fd non-blocking and close-on-exec,
 * mode applied with chmod when non-zero. Returns 0 with *l filled, or -errno (see above).
 */
int uds_listen(const char *path, int type, int backlog, unsigned mode, struct uds_listener *l);

/*
 * Removes path if it is still the socket l bound (same device and inode). Returns true if removed.
 * Call it before closing l->fd: the open socket keeps its inode, so no other socket created at
 * path meanwhile can have the same number; once it is closed and its file replaced, the new file
 * may well get the freed inode number (ext4 does) and would be removed as ours.
 */
bool uds_unlink_owned(const char *path, const struct uds_listener *l);

#endif
