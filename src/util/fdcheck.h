/* SPDX-License-Identifier: MIT */
/*
 * Checks and non-blocking operations on file descriptors a peer handed us (a vhost-user
 * front-end's kick, call and error eventfds and its guest-memory fds).
 *
 * Security model: the fd and its open file description are shared with a process we do not
 * trust. We never change its flags (O_NONBLOCK belongs to the open file description, so setting
 * it would change the peer's fd too), and we must still never block on it: the helpers below
 * use poll() with a zero timeout or preadv2(RWF_NOWAIT) instead.
 */
#ifndef UVSOCK_UTIL_FDCHECK_H
#define UVSOCK_UTIL_FDCHECK_H

#include <stdint.h>

/*
 * 0 if fd is an eventfd (its /proc/self/fd link reads "anon_inode:[eventfd]"), -EINVAL if it is
 * anything else (a pipe, a socket, a file), -EBADF if it is not open.
 */
int fd_check_eventfd(int fd);

/*
 * Adds 1 to the eventfd fd without ever blocking, whatever its O_NONBLOCK flag. A counter that
 * cannot take 1 more (saturated at 0xfffffffffffffffe) already has an interrupt pending, so
 * nothing is written then. Returns 0 if written, -EAGAIN if skipped because the counter is
 * saturated, another -errno if write() failed.
 *
 * The poll() and the write() are two steps: another writer of the same eventfd (only the peer
 * holds one) that adds almost 2^64 in between can still make the write() wait until the counter
 * is read. That peer can only stall the thread that serves it.
 */
int eventfd_signal_nb(int fd);

/*
 * Reads and resets the eventfd fd without ever blocking, whatever its O_NONBLOCK flag (the peer
 * may read its own eventfd between our poll and our read). *value gets the counter if non-NULL.
 * Returns 0, -EAGAIN if the counter was 0, another -errno on failure. Uses preadv2(RWF_NOWAIT),
 * which eventfds honour since Linux 5.12; on older kernels a poll() with a zero timeout comes
 * first (with the same two-step caveat as eventfd_signal_nb()).
 */
int eventfd_consume_nb(int fd, uint64_t *value);

/*
 * Checks an fd offered as guest memory: it must be a regular file (a memfd, a tmpfs, hugetlbfs
 * or other file; not a device, pipe or socket) at least need_size bytes long, so that a mapping
 * of need_size bytes from offset 0 is backed by the file when we map it. Returns 0, -EINVAL (not
 * a regular file), -ERANGE (shorter than need_size), -EBADF (not open).
 */
int fd_check_guest_memory(int fd, uint64_t need_size);

#endif
