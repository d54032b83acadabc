/* SPDX-License-Identifier: MIT */
/*
 * libuvsock public socket API: AF_VSOCK stream and seqpacket sockets in userspace.
 *
 * The calls mirror the POSIX socket calls a Linux AF_VSOCK program uses (socket, bind, listen,
 * accept, connect, send, recv, shutdown, close, get/setsockopt...) over `struct sockaddr_vm`
 * from <linux/vm_sockets.h>, so porting is mostly a matter of adding the `uvsock_` prefix.
 * Every call returns -1 (or NULL) and sets errno on failure, with the errno values a Linux
 * AF_VSOCK program sees; the errno list of each call is documented below and in docs/api.md.
 *
 * Contexts. A `struct uvsock_ctx` is one transport instance with its own vsock namespace (one
 * local CID): uvsock_ctx_new_loopback() gives the in-process loopback (CID 1, as Linux's
 * vsock_loopback); the guest role adds a constructor for a context that talks to a vhost-user
 * vsock device.
 *
 * Descriptors. A uvsock socket is a small integer, and that integer is a real file descriptor
 * (an eventfd owned by the library), so it is unique in the process, works with poll/epoll, and
 * never collides with another socket of any context. It is NOT a kernel socket: pass it only to
 * uvsock_* calls (and to poll/epoll, see "Polling"), and release it with uvsock_close(), never
 * with close(2).
 *
 * Polling. The descriptor is readable (POLLIN/EPOLLIN) while the socket's current event mask
 * (uvsock_poll_events()) intersects the interest set with uvsock_poll_interest() plus
 * POLLERR|POLLHUP. With no interest set (the default) it never becomes readable. It is level
 * triggered from the library's point of view but may be spuriously readable for a moment after a
 * state change: always confirm with uvsock_poll_events(). Never read from or write to it.
 * uvsock_poll() wraps this for poll(2)-style waiting on many sockets.
 *
 * Threads. Every call may be made from any thread, concurrently, on the same or different
 * sockets, while the transport delivers packets. Concurrent blocking senders on one socket are
 * serialized, so each send() call's bytes are contiguous in a STREAM; concurrent receivers are
 * serialized likewise. uvsock_close() wakes every thread blocked on the socket, which then fails
 * with EBADF. No call raises a signal (no SIGPIPE).
 */
#ifndef UVSOCK_UVSOCK_H
#define UVSOCK_UVSOCK_H

#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <linux/vm_sockets.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is libuvsock's API: exported (src/libuvsock.map). */
#pragma GCC visibility push(default)

struct uvsock_ctx;

/* ---- Contexts -------------------------------------------------------------------------- */

/*
 * Structs that grow. Every option and stats struct of the API starts with `size`, which the
 * caller sets to sizeof() the struct (`struct uvsock_loopback_opts o = { .size = sizeof(o) };`),
 * the rest zero-initialised. Structs only grow at their end and a new field's zero keeps the old
 * behaviour, so a program keeps working with a newer library, and a newer program with an older
 * one as long as it leaves the fields that library lacks at zero. A call given a size smaller
 * than the struct's first version (e.g. 0: not set), or larger with a non-zero byte past the end
 * the library knows, fails with EINVAL. A stats call fills as much as both sides know, zeroes
 * the rest of the caller's struct and sets size to the bytes it filled.
 */

/* Options for uvsock_ctx_new_loopback(). Set size, zero the rest, then set what you need. */
struct uvsock_loopback_opts {
	uint32_t size;         /* sizeof(struct uvsock_loopback_opts) */
	unsigned flags;        /* UVSOCK_CTX_* and UVSOCK_LOOPBACK_* */
	uint32_t max_sockets;  /* cap on live sockets including lingering closed ones; 0: 65536 */
};

/* bind() to a port <= 1023 fails with EACCES (as for a process without CAP_NET_BIND_SERVICE). */
#define UVSOCK_CTX_UNPRIVILEGED 0x1u
/*
 * Deliver loopback packets on a dedicated pump thread instead of in the thread whose call
 * produced them (the default). Exists for benchmarking the two strategies.
 */
#define UVSOCK_LOOPBACK_PUMP_THREAD 0x100u

/*
 * Creates a loopback context: one vsock namespace with local CID 1 (VMADDR_CID_LOCAL) where
 * every packet sent is delivered back into the same namespace, so a client connecting to
 * (VMADDR_CID_LOCAL, port) reaches a listener of the same context. Packets addressed to any other
 * CID are discarded, as by a peer that never answers (connect() then fails with ETIMEDOUT).
 * opts may be NULL for defaults. Starts one timer thread (and the pump thread if asked).
 * Returns the context, or NULL with errno EINVAL (unknown flag, bad size), ENOMEM, EAGAIN
 * (thread).
 */
struct uvsock_ctx *uvsock_ctx_new_loopback(const struct uvsock_loopback_opts *opts);

/*
 * Closes every socket of the context that is still open (their descriptors become invalid), stops
 * the transport and frees everything. No call on a socket of this context may be in progress or
 * start during or after this call. Safe on NULL.
 */
void uvsock_ctx_free(struct uvsock_ctx *ctx);

/* The context's local CID (1 for loopback). */
uint32_t uvsock_ctx_local_cid(const struct uvsock_ctx *ctx);

/* Counters of the context's protocol engine (a subset; monotonic unless said otherwise). */
struct uvsock_ctx_stats {
	uint32_t size;                 /* sizeof(struct uvsock_ctx_stats), set by the caller */
	uint64_t tx_pkts, tx_bytes;    /* packets / payload bytes produced by the engine */
	uint64_t rx_pkts, rx_bytes;    /* packets / payload bytes fed into the engine */
	uint64_t rst_sent, rst_received;
	uint64_t rx_mem_resets;        /* connections reset for exceeding the receive memory bound */
	uint64_t credit_violations;
	uint64_t backlog_refused;
	uint64_t socks_open;           /* live sockets now (not monotonic), lingering ones included */
	uint64_t connects_timed_out;
	uint64_t dropped;              /* packets the transport discarded (loopback: foreign CID) */
	uint64_t dgram_tx, dgram_tx_bytes; /* datagrams / payload bytes sent */
	uint64_t dgram_rx, dgram_rx_bytes; /* datagrams / payload bytes delivered to a socket */
	uint64_t dgram_drop_no_listener;   /* received for a port no datagram socket is bound to */
	uint64_t dgram_drop_full;          /* received while the socket's SO_RCVBUF was full */
	uint64_t dgram_drop_oversize;      /* over the maximum, or beyond the transport's buffer */
	uint64_t dgram_drop_not_negotiated; /* received without datagrams negotiated */
};
/* Returns 0, or -1 with errno EINVAL (ctx or ret NULL, bad ret->size). */
int uvsock_ctx_get_stats(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *ret);

/* ---- Logging --------------------------------------------------------------------------- */

/* Log levels, most severe first: a level lets through itself and every level before it. */
#define UVSOCK_LOG_ERROR 0
#define UVSOCK_LOG_WARN 1
#define UVSOCK_LOG_INFO 2  /* the default */
#define UVSOCK_LOG_DEBUG 3

/*
 * Receives one log line: level is UVSOCK_LOG_*, msg the text alone (no prefix, no newline),
 * valid only during the call. Called from whichever thread logs (the caller's, a device thread,
 * the driver or timer thread), possibly from several at once; it must not call libuvsock.
 */
typedef void (*uvsock_log_fn)(int level, const char *msg);

/*
 * Sends the library's log lines to fn instead of stderr (the default) and sets the process-wide
 * level (lines less severe than level are not produced). fn NULL: back to stderr, at level.
 * Any thread; takes effect for lines started after it returns.
 * Returns 0, or -1 with errno EINVAL (level not a UVSOCK_LOG_* value).
 */
int uvsock_set_log_fn(uvsock_log_fn fn, int level);

/* ---- Sockets --------------------------------------------------------------------------- */

/*
 * socket(2). type: SOCK_STREAM, SOCK_SEQPACKET or SOCK_DGRAM, optionally or'ed with
 * SOCK_NONBLOCK and SOCK_CLOEXEC (applies to the descriptor). protocol: 0 or PF_VSOCK.
 * SOCK_DGRAM needs a transport that negotiated datagrams (loopback always does; the guest role
 * when the device offers VIRTIO_VSOCK_F_DGRAM): docs/api.md "Datagrams".
 * Returns a descriptor >= 0, or -1 with errno: EINVAL (ctx NULL, unknown type flag),
 * EPROTONOSUPPORT (protocol), ESOCKTNOSUPPORT (any other type), ENODEV (SOCK_DGRAM, not
 * negotiated), EMFILE (process fd limit, or the context's max_sockets), ENFILE, ENOMEM.
 */
int uvsock_socket(struct uvsock_ctx *ctx, int type, int protocol);

/*
 * bind(2). addr must be a struct sockaddr_vm with svm_family AF_VSOCK; svm_cid VMADDR_CID_ANY or
 * the context's CID (loopback also accepts VMADDR_CID_LOCAL); svm_port VMADDR_PORT_ANY picks a
 * free port >= 1024.
 * Errors: EBADF, ENOTSOCK, EFAULT (addr NULL, addrlen > 0), EINVAL (bad address or length or
 * family, or already bound),
 * EADDRNOTAVAIL (CID not local, or no free port), EADDRINUSE, EACCES (port <= 1023 in an
 * UVSOCK_CTX_UNPRIVILEGED context).
 */
int uvsock_bind(int fd, const struct sockaddr *addr, socklen_t addrlen);

/*
 * listen(2). The socket must be bound (as on Linux, listen() does not auto-bind). backlog is
 * clamped to [0, 4096]; connection requests beyond backlog + 1 pending ones are refused (the
 * client sees ECONNRESET).
 * Errors: EBADF, ENOTSOCK, EINVAL (not bound, connected, connecting), EPROTONOSUPPORT.
 */
int uvsock_listen(int fd, int backlog);

/*
 * accept(2) / accept4(2). Waits for a connection (unless the socket is non-blocking); honours
 * SO_RCVTIMEO. addr/addrlen may be NULL; otherwise *addrlen is in/out as in accept(2) and the
 * address is truncated to it. flags: SOCK_NONBLOCK, SOCK_CLOEXEC (accept4 only).
 * Errors: EBADF (also: closed while waiting), ENOTSOCK, EINVAL (not listening, bad flags),
 * EAGAIN (non-blocking and none pending, or SO_RCVTIMEO expired), EMFILE, ENFILE, ENOMEM.
 */
int uvsock_accept(int fd, struct sockaddr *addr, socklen_t *addrlen);
int uvsock_accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags);

/*
 * connect(2). Blocking: waits until connected, refused or SO_VM_SOCKETS_CONNECT_TIMEOUT
 * (default 2 s). Non-blocking: returns EINPROGRESS; completion shows as POLLOUT (success) or
 * POLLERR with the result in SO_ERROR.
 * Errors: EBADF, ENOTSOCK, EFAULT (addr NULL, addrlen > 0), EINVAL (bad address, listening
 * socket, shutting down), EISCONN,
 * EALREADY (non-blocking, attempt in progress), EINPROGRESS, ECONNRESET (refused: nothing
 * listens on the port), ETIMEDOUT, ENETUNREACH, EADDRNOTAVAIL (no free local port),
 * EPROTONOSUPPORT (SEQPACKET not supported by the peer transport).
 */
int uvsock_connect(int fd, const struct sockaddr *addr, socklen_t addrlen);

/*
 * SOCK_DGRAM (docs/api.md "Datagrams"). bind as above, or automatic at the first send/connect.
 * connect sets the default destination at once (nothing goes on the wire); an address with
 * sa_family AF_UNSPEC clears it. listen/accept fail with EOPNOTSUPP. Sends never serialize
 * threads on one socket. Each send is one datagram of at most 65492 bytes (VSOCK_DGRAM_MAX of the
 * transport, maybe lower); it is queued whole or not at all, and it may be dropped on the way
 * (no listener, receiver's SO_RCVBUF full: counted in uvsock_ctx_stats). Each recv returns one
 * datagram: msg_flags MSG_TRUNC if it was cut to the buffer (the rest is discarded), the full
 * length with MSG_TRUNC in flags, the sender's address in msg_name / src_addr.
 * Blocking sends wait while the socket's SO_SNDBUF worth of datagrams waits to leave;
 * SO_RCVBUF/SO_SNDBUF (int, SOL_SOCKET; the value set is doubled as Linux does) bound the
 * queues, counting payload plus 64 bytes per datagram. POLLIN: a datagram is queued; POLLOUT:
 * the send quota has room.
 * Errors (as Linux UDP): EMSGSIZE (too long), EDESTADDRREQ (no address and no default peer),
 * EAGAIN (non-blocking: nothing to read / send quota full), EINVAL (bad address), EBADF,
 * ENOTSOCK, EOPNOTSUPP (MSG_OOB). Never EISCONN, ECONNREFUSED or ENOTCONN from send/recv.
 * On STREAM/SEQPACKET sockets sendto/recvfrom behave as sendmsg/recvmsg with msg_name.
 */
ssize_t uvsock_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
		      socklen_t addrlen);
ssize_t uvsock_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *addrlen);

/*
 * send(2) / sendmsg(2). STREAM: blocking calls return when every byte is queued (or when
 * SO_SNDTIMEO expires or an error occurs after some bytes: then the count so far); non-blocking
 * calls queue what peer credit allows. SEQPACKET: one message, all or nothing; MSG_EOR marks a
 * record end the receiver sees as MSG_EOR. flags: MSG_DONTWAIT, MSG_EOR, MSG_NOSIGNAL (accepted,
 * no signal is ever raised), MSG_MORE (ignored). msg->msg_name must be NULL/0 length.
 * Errors: EBADF, ENOTSOCK, ENOTCONN, EPIPE (shut down for sending, peer shut down receiving, or
 * connection reset), EAGAIN (non-blocking and no credit, or SO_SNDTIMEO expired),
 * EMSGSIZE (SEQPACKET message larger than min(peer buffer, own buffer)), EOPNOTSUPP (MSG_OOB, or
 * msg_name on an unconnected socket), EISCONN (msg_name on a connected socket), EFAULT (NULL
 * msg), EINVAL (bad iovec).
 */
ssize_t uvsock_send(int fd, const void *buf, size_t len, int flags);
ssize_t uvsock_sendmsg(int fd, const struct msghdr *msg, int flags);

/*
 * recv(2) / recvmsg(2). STREAM: blocking, waits for at least min(SO_RCVLOWAT, len) bytes (len
 * with MSG_WAITALL); non-blocking or at SO_RCVTIMEO, returns what is queued (as Linux); returns
 * 0 at end of stream (peer shut down sending or closed, local SHUT_RD).
 * SEQPACKET: one whole message; msg_flags gets MSG_TRUNC if it did not fit (the rest is
 * discarded) and MSG_EOR if the sender set it; with MSG_TRUNC in flags the full message length is
 * returned. flags: MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL, MSG_TRUNC. msg->msg_namelen is set to 0.
 * Errors: EBADF, ENOTSOCK, ENOTCONN (never connected, listening), EAGAIN (non-blocking and
 * nothing to read, or SO_RCVTIMEO expired), ENOMEM (STREAM: the wait target, SO_RCVLOWAT or
 * len with MSG_WAITALL, is >= the receive buffer size, as Linux), EOPNOTSUPP (MSG_OOB,
 * MSG_ERRQUEUE), EFAULT (NULL msg), EINVAL (bad iovec).
 */
ssize_t uvsock_recv(int fd, void *buf, size_t len, int flags);
ssize_t uvsock_recvmsg(int fd, struct msghdr *msg, int flags);

/*
 * shutdown(2). how: SHUT_RD, SHUT_WR or SHUT_RDWR. Wakes blocked readers/writers.
 * Errors: EBADF, ENOTSOCK, EINVAL (how), ENOTCONN (never connected).
 */
int uvsock_shutdown(int fd, int how);

/*
 * close(2). Invalidates the descriptor at once; threads blocked on the socket wake up and fail
 * with EBADF. A connected socket then closes as on Linux (SHUTDOWN to the peer, reset after the
 * peer's answer or 8 s). A listener resets its not-yet-accepted connections.
 * Errors: EBADF, ENOTSOCK.
 */
int uvsock_close(int fd);

/*
 * getsockname(2) / getpeername(2). *addrlen in/out, the address is truncated to it and *addrlen
 * set to sizeof(struct sockaddr_vm). An unbound socket reports VMADDR_CID_ANY:VMADDR_PORT_ANY.
 * Errors: EBADF, ENOTSOCK, EINVAL (NULL pointer), ENOTCONN (getpeername, not connected).
 */
int uvsock_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen);
int uvsock_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen);

/*
 * getsockopt(2) / setsockopt(2).
 *   level AF_VSOCK: SO_VM_SOCKETS_BUFFER_SIZE, _BUFFER_MIN_SIZE, _BUFFER_MAX_SIZE (uint64_t;
 *     BUFFER_SIZE is clamped into [min, max]; setting min/max re-clamps it),
 *     SO_VM_SOCKETS_CONNECT_TIMEOUT (_OLD and _NEW, struct timeval; 0 resets to 2 s).
 *   level SOL_SOCKET: SO_RCVTIMEO, SO_SNDTIMEO (struct timeval; 0 = wait forever),
 *     SO_RCVLOWAT (int; 0 becomes 1, STREAM: must be <= buffer size), SO_ERROR (get: returns
 *     and clears the pending error), SO_TYPE, SO_DOMAIN, SO_PROTOCOL, SO_ACCEPTCONN (get only).
 * Errors: EBADF, ENOTSOCK, ENOPROTOOPT (unknown level or option, or set of a get-only option),
 * EINVAL (option length too small, NULL pointer, STREAM SO_RCVLOWAT above the buffer size), ERANGE
 * (connect timeout out of range), EDOM (tv_usec out of range for SO_RCVTIMEO/SO_SNDTIMEO).
 */
int uvsock_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen);
int uvsock_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen);

/*
 * fcntl(2) subset: F_GETFL (returns O_RDWR plus O_NONBLOCK if set), F_SETFL (only O_NONBLOCK is
 * honoured). uvsock_set_nonblock(fd, on) is a shorthand.
 * Errors: EBADF, ENOTSOCK, EINVAL (other cmd).
 */
int uvsock_fcntl(int fd, int cmd, int arg);
int uvsock_set_nonblock(int fd, int on);

/* ---- Polling --------------------------------------------------------------------------- */

/*
 * The socket's current event mask, computed like Linux's vsock_poll(): POLLIN (data to read,
 * end of stream, a SEQPACKET message, or a connection to accept; for STREAM at least SO_RCVLOWAT
 * bytes), POLLOUT (connected with peer credit; also set on a reset or closed socket not shut down
 * for sending, like INET), POLLERR (a pending SO_ERROR), POLLHUP (shut down both ways), POLLRDHUP
 * (peer will send no more, or local SHUT_RD).
 * Returns the mask (>= 0), or -1 with errno EBADF, ENOTSOCK.
 */
int uvsock_poll_events(int fd);

/*
 * Sets which events make the descriptor readable for poll/epoll: events is a mask of POLLIN,
 * POLLOUT, POLLRDHUP (POLLERR and POLLHUP are always included once events != 0); 0 disarms the
 * descriptor (the default; costs nothing on the data path). The descriptor then polls readable
 * while uvsock_poll_events(fd) & (events | POLLERR | POLLHUP) != 0.
 * Returns 0, or -1 with errno EBADF, ENOTSOCK, EINVAL (unknown bits).
 */
int uvsock_poll_interest(int fd, short events);

/*
 * poll(2) over uvsock descriptors: fds[i].fd are uvsock sockets (negative entries are ignored),
 * events as for uvsock_poll_interest(); fills revents (POLLNVAL for a bad descriptor).
 * Sets each socket's interest to its events. timeout_ms < 0 waits forever.
 * Returns the number of entries with revents != 0, 0 on timeout, or -1 with errno EINVAL
 * (nfds too large), ENOMEM, EINTR.
 */
int uvsock_poll(struct pollfd *fds, nfds_t nfds, int timeout_ms);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
