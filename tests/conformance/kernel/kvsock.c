/* SPDX-License-Identifier: MIT */
/*
 * The uvsock_* socket API of include/uvsock/uvsock.h mapped onto Linux's own AF_VSOCK, so that
 * the conformance table (tests/conformance/cases.c) runs unchanged against the kernel inside the
 * interop guest. A context is only the CID it stands for; every socket call is the system call
 * of the same name on a real AF_VSOCK descriptor, and the poll helpers are poll(2) with a zero
 * timeout. Engine counters do not exist here: uvsock_ctx_get_stats() fails ENOTSUP and the cases
 * skip what they would read (conf_on_kernel()). Any thread; nothing here keeps state but the
 * context.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/uvsock.h>

#include "kvsock.h"

struct uvsock_ctx {
	uint32_t cid;
};

struct uvsock_ctx *kvsock_ctx_new(uint32_t cid)
{
	struct uvsock_ctx *ctx = calloc(1, sizeof(*ctx));

	if (ctx)
		ctx->cid = cid;
	return ctx;
}

void uvsock_ctx_free(struct uvsock_ctx *ctx)
{
	free(ctx);
}

uint32_t uvsock_ctx_local_cid(const struct uvsock_ctx *ctx)
{
	return ctx ? ctx->cid : VMADDR_CID_ANY;
}

int uvsock_ctx_get_stats(struct uvsock_ctx *ctx, struct uvsock_ctx_stats *ret)
{
	(void)ctx;
	(void)ret;
	errno = ENOTSUP;
	return -1;
}

int uvsock_socket(struct uvsock_ctx *ctx, int type, int protocol)
{
	if (!ctx) {
		errno = EINVAL;
		return -1;
	}
	return socket(AF_VSOCK, type, protocol);
}

int uvsock_bind(int fd, const struct sockaddr *addr, socklen_t addrlen)
{
	return bind(fd, addr, addrlen);
}

int uvsock_listen(int fd, int backlog)
{
	return listen(fd, backlog);
}

int uvsock_accept(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return accept(fd, addr, addrlen);
}

int uvsock_accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
	return accept4(fd, addr, addrlen, flags);
}

int uvsock_connect(int fd, const struct sockaddr *addr, socklen_t addrlen)
{
	return connect(fd, addr, addrlen);
}

/*
 * The runner ignores SIGPIPE (Linux raises it for a send on a shut-down vsock socket without
 * MSG_NOSIGNAL; uvsock never does), so EPIPE comes back as the return value in both.
 */
ssize_t uvsock_send(int fd, const void *buf, size_t len, int flags)
{
	return send(fd, buf, len, flags);
}

ssize_t uvsock_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	return sendmsg(fd, msg, flags);
}

ssize_t uvsock_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
		      socklen_t addrlen)
{
	return sendto(fd, buf, len, flags, addr, addrlen);
}

ssize_t uvsock_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *addrlen)
{
	return recvfrom(fd, buf, len, flags, addr, addrlen);
}

ssize_t uvsock_recv(int fd, void *buf, size_t len, int flags)
{
	return recv(fd, buf, len, flags);
}

ssize_t uvsock_recvmsg(int fd, struct msghdr *msg, int flags)
{
	return recvmsg(fd, msg, flags);
}

int uvsock_shutdown(int fd, int how)
{
	return shutdown(fd, how);
}

int uvsock_close(int fd)
{
	return close(fd);
}

int uvsock_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return getsockname(fd, addr, addrlen);
}

int uvsock_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return getpeername(fd, addr, addrlen);
}

int uvsock_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
{
	return getsockopt(fd, level, optname, optval, optlen);
}

int uvsock_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen)
{
	return setsockopt(fd, level, optname, optval, optlen);
}

int uvsock_fcntl(int fd, int cmd, int arg)
{
	return fcntl(fd, cmd, arg);
}

int uvsock_set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL, 0);

	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* EBADF for a closed descriptor, ENOTSOCK for anything but an AF_VSOCK socket. */
static int check_vsock(int fd)
{
	int dom = 0;
	socklen_t len = sizeof(dom);

	if (fcntl(fd, F_GETFD) < 0)
		return -1;
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) < 0 || dom != AF_VSOCK) {
		errno = ENOTSOCK;
		return -1;
	}
	return 0;
}

int uvsock_poll_events(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP | POLLPRI };

	if (check_vsock(fd) < 0)
		return -1;
	if (poll(&p, 1, 0) < 0)
		return -1;
	return (unsigned short)p.revents;
}

/* A kernel socket is always pollable; only the arguments are checked, as uvsock does. */
int uvsock_poll_interest(int fd, short events)
{
	if (check_vsock(fd) < 0)
		return -1;
	if (events & ~(POLLIN | POLLOUT | POLLRDHUP)) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

int uvsock_poll(struct pollfd *fds, nfds_t nfds, int timeout_ms)
{
	return poll(fds, nfds, timeout_ms);
}
