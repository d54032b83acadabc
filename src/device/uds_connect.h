/* SPDX-License-Identifier: MIT */
/*
 * The host side's Unix-socket primitives of the Firecracker "hybrid vsock" convention.
 *
 * Host -> guest: a host program connects to `<uds-path>` and writes `CONNECT <port>\n`; we answer
 * `OK <host-port>\n` once the guest accepted. This file reads and parses that line without
 * blocking and without consuming a single byte past the newline (bytes after it are stream data
 * for the guest).
 *
 * Accepted line: the keyword CONNECT in any letter case, one or more spaces or tabs, a decimal
 * port in [0, 4294967294] (no sign, at most 10 digits), optional trailing spaces, tabs or '\r',
 * then '\n'; at most UDS_CONNECT_LINE_MAX bytes including the newline (Firecracker reads at most
 * 32). On a SOCK_SEQPACKET socket the line is one message.
 *
 * Security model: the host program is not trusted to be well-behaved: a partial line, garbage, an
 * overlong line or an early close gives an error and the caller closes the socket; nothing here
 * allocates, blocks, or reads past the line.
 *
 * Guest -> host: uds_connect_at() below connects to `<uds-path>_<port>` without following a
 * symlink there.
 */
#ifndef UVSOCK_DEVICE_UDS_CONNECT_H
#define UVSOCK_DEVICE_UDS_CONNECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#define UDS_CONNECT_LINE_MAX 32

/*
 * Parses one complete line (len bytes, the last of which is '\n').
 * Returns 0 and *ret_port, or -EPROTO (not a CONNECT line, bad or out-of-range port).
 */
int uds_connect_parse(const char *line, size_t len, uint32_t *ret_port);

/* Per-connection reader state; zero-initialise. */
struct uds_connect_reader {
	char buf[UDS_CONNECT_LINE_MAX];
	size_t len;
};

/*
 * Reads what is available on the non-blocking socket fd (stream: never past the newline;
 * seqpacket: one message) and parses the line once complete.
 * Returns 0 and *ret_port when the line is complete and valid; -EAGAIN when more bytes are needed
 * (call again when fd is readable); -EPROTO garbage; -EMSGSIZE overlong line (or a SEQPACKET
 * message that is not exactly the line); -ECONNRESET the peer closed before the newline; other
 * -errno from recv.
 */
int uds_connect_read(struct uds_connect_reader *r, int fd, bool seqpacket, uint32_t *ret_port);

/* Formats "OK <port>\n" into buf (at least 16 bytes). Returns the length. */
size_t uds_connect_format_ok(char *buf, uint32_t port);

/*
 * Guest -> host: starts a non-blocking connect of a new Unix socket of `type` (SOCK_STREAM or
 * SOCK_SEQPACKET) to the socket file `name` (one path component) in the directory dirfd
 * (O_PATH | O_DIRECTORY is enough), following no symlink: `name` is opened O_PATH | O_NOFOLLOW,
 * must be a socket, and the connect goes to that very inode through /proc/self/fd/<fd>, so a
 * symlink planted or swapped in at any moment is never followed. Needs /proc.
 *
 * Security model: whoever can write to the directory may plant files there; a symlink could
 * point the daemon at any socket it can reach, so it is refused, not followed.
 *
 * Returns the socket (non-blocking, close-on-exec) with *ret_pending true while the connect is
 * in progress (wait for EPOLLOUT, then read SO_ERROR), or -EINVAL (name not one component),
 * -ELOOP (name is a symlink), -ENOTSOCK (not a socket file), -ENOENT (nothing there),
 * -ECONNREFUSED (nobody listens), -EPROTOTYPE (a listener of the other type), -EAGAIN (its
 * backlog is full), -EOPNOTSUPP (no /proc), or the errno of openat/socket (-EMFILE...).
 */
int uds_connect_at(int dirfd, const char *name, int type, bool *ret_pending);

/*
 * uds_connect_at() from a socket bound first to the abstract name `abstract` (given without its
 * leading NUL; NULL: unnamed), so the listener's accept()/getpeername() sees that name: the
 * guest's address for libuvsock-preload.so (docs/uvsockd.md "Who is calling"). A name already
 * taken (or too long) leaves the socket unnamed; the connect goes ahead. Same returns.
 */
int uds_connect_at_as(int dirfd, const char *name, int type, const char *abstract,
		      bool *ret_pending);

/*
 * uds_connect_at_as() that also gives the socket file's device and inode in *ret_st (what was
 * connected to, for a caller that keeps the connection and looks at the path again later).
 * abstract "" autobinds the socket (a fresh abstract name from the kernel, so that a datagram
 * peer can answer to it); an autobind failure is returned. Same returns.
 */
int uds_connect_at_st(int dirfd, const char *name, int type, const char *abstract,
		      bool *ret_pending, struct stat *ret_st);

#endif
