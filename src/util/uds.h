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
 *
 * Two process-wide settings, made once at start-up before any listener exists (uvsockd's
 * main thread), change what uds_listen does:
 *   - uds_set_default_perms(): the mode and group of the sockets listened on with mode 0 (the
 *     ones other programs connect to: --socket-mode, --socket-group);
 *   - uds_adopt(): a socket inherited from the parent (systemd socket activation, --fd) stands
 *     for a path; uds_listen on that path returns it instead of binding, and its file (if any)
 *     belongs to whoever created it: uds_unlink_owned never removes it.
 */
#ifndef UVSOCK_UTIL_UDS_H
#define UVSOCK_UTIL_UDS_H

#include <stdbool.h>
#include <sys/types.h>

#define UDS_REPLACED_STALE 1u
#define UDS_INHERITED 2u /* an adopted socket: nothing was bound, nothing is removed */

struct uds_listener {
	int fd;
	dev_t dev;
	ino_t ino;
	unsigned flags; /* UDS_REPLACED_STALE, UDS_INHERITED */
};

/*
 * Probes the path (connect with the socket's type): 0 if nothing is there or a stale socket,
 * -EADDRINUSE if something accepts (or a socket of another type is bound there), -EEXIST if the
 * path is not a socket, -ENAMETOOLONG, or the errno of a connect that tells neither (-EACCES...).
 */
int uds_probe(const char *path, int type);

/*
 * uds_probe() that also tells who listens: when the result is -EADDRINUSE and the probe's
 * connection was taken, *owner is the listener's PID (SO_PEERCRED), else 0. The probe connection
 * is closed at once; a listener that accepts it sees a client that left.
 */
int uds_probe_owner(const char *path, int type, pid_t *owner);

/*
 * Checks that fd is a Unix socket of the given type and tells whether it listens (*listening)
 * or is connected. Returns 0, -EBADF (not open), -ENOTSOCK (not a socket or not AF_UNIX),
 * -EPROTOTYPE (another type) or -ENOTCONN (neither listening nor connected).
 */
int uds_check_fd(int fd, int type, bool *listening);

/*
 * Mode (0: as the umask leaves it) and group ((gid_t)-1: the process's) of every socket that
 * uds_listen() creates with mode 0. Context: start-up, before any listener.
 */
void uds_set_default_perms(unsigned mode, gid_t gid);

/*
 * Lets fd, an inherited socket, stand for path (ownership passes to the registry until taken).
 * Returns 0, -EEXIST (path already has one) or -ENOMEM. Context: start-up; any thread.
 */
int uds_adopt(const char *path, int fd);

/*
 * Takes the socket adopted for path out of the registry: returns its fd (the caller owns it) or
 * -ENOENT. uds_listen() calls it first; vhost-user (src/device/vhu.c) calls it itself because
 * its inherited socket may also be a connected one.
 */
int uds_take_adopted(const char *path);

/* True if a socket was adopted for path and not taken yet. */
bool uds_is_adopted(const char *path);

/*
 * Closes every socket still adopted and not taken (a process that will not use them: uvsockd's
 * --isolate main process once the workers have theirs, a worker once its devices exist), so that
 * a connected VMM sees the end of its connection when the one user closes it.
 */
void uds_drop_adopted(void);

/*
 * Listens on path: type SOCK_STREAM or SOCK_SEQPACKET (SOCK_DGRAM: bound, no listen(); a live
 * datagram socket there is one a probe can connect to), the fd non-blocking and close-on-exec,
 * mode applied with chmod when non-zero (mode 0: the default perms above, group included). A
 * socket adopted for path is returned instead (it must be a listener of that type: else
 * -EPROTOTYPE or -EINVAL, and it is closed). Returns 0 with *l filled, or -errno (see above).
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
