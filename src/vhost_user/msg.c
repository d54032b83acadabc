/* SPDX-License-Identifier: MIT */
/*
 * vhost-user message framing over a Unix stream socket with SCM_RIGHTS (see msg.h).
 *
 * Security model: the peer is untrusted. Reads are exact (never past the announced message),
 * the payload size is capped before anything is read, fds beyond VHU_MAX_FDS or a truncated
 * control buffer make the message fail with every received fd closed, and all waits are bounded
 * by a deadline.
 */
#include "vhost_user/msg.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/time.h"

/* Waits until fd has events or the deadline (-1: none) passes. */
static int wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = events };
		int timeout = -1;
		int r;

		if (deadline >= 0) {
			int64_t left = deadline - (int64_t)mono_ms();

			if (left <= 0)
				return -ETIMEDOUT;
			timeout = left > 1000000 ? 1000000 : (int)left;
		}
		r = poll(&pfd, 1, timeout);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r > 0)
			return 0; /* readable, writable, HUP or ERR: the next call reports which */
	}
}

void vhu_msg_close_fds(struct vhu_msg *m)
{
	for (unsigned i = 0; i < m->nfds && i < VHU_MAX_FDS; i++) {
		if (m->fds[i] >= 0)
			close(m->fds[i]);
		m->fds[i] = -1;
	}
	m->nfds = 0;
}

int vhu_msg_take_fd(struct vhu_msg *m, unsigned i)
{
	int fd;

	if (i >= m->nfds || i >= VHU_MAX_FDS)
		return -1;
	fd = m->fds[i];
	m->fds[i] = -1;
	return fd;
}

/*
 * Collects the SCM_RIGHTS fds of one recvmsg into m. Every fd is either stored or closed, so
 * that nothing leaks when the total goes over VHU_MAX_FDS; returns -EPROTO in that case.
 */
static int collect_fds(struct msghdr *mh, struct vhu_msg *m)
{
	int ret = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		if (c->cmsg_len < CMSG_LEN(0))
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (m->nfds < VHU_MAX_FDS) {
				m->fds[m->nfds++] = fd;
			} else {
				close(fd);
				ret = -EPROTO;
			}
		}
	}
	if (mh->msg_flags & MSG_CTRUNC)
		ret = -EPROTO;
	return ret;
}

/*
 * Reads exactly len bytes into buf, collecting fds. *got tells whether any byte of the message
 * was read before (to tell a clean end of stream from a truncated message).
 */
static int recv_exact(int fd, void *buf, size_t len, struct vhu_msg *m, bool *got,
		      int64_t deadline)
{
	size_t off = 0;

	while (off < len) {
		/* Room for more fds than allowed, so that extra ones are seen and closed, not
		 * silently dropped with MSG_CTRUNC alone. */
		union {
			char buf[CMSG_SPACE(sizeof(int) * VHU_MAX_FDS * 2)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { .iov_base = (char *)buf + off, .iov_len = len - off };
		struct msghdr mh = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = ctl.buf,
			.msg_controllen = sizeof(ctl.buf),
		};
		ssize_t n;
		int r;

		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				r = wait_fd(fd, POLLIN, deadline);
				if (r < 0)
					return r;
				continue;
			}
			return -errno;
		}
		r = collect_fds(&mh, m);
		if (r < 0)
			return r;
		if (n == 0)
			return *got ? -EPROTO : -ECONNRESET;
		*got = true;
		off += (size_t)n;
	}
	return 0;
}

int vhu_msg_recv(int fd, struct vhu_msg *m, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : (int64_t)mono_ms() + timeout_ms;
	uint32_t hdr[3];
	bool got = false;
	int r;

	m->nfds = 0;
	for (unsigned i = 0; i < VHU_MAX_FDS; i++)
		m->fds[i] = -1;

	r = recv_exact(fd, hdr, sizeof(hdr), m, &got, deadline);
	if (r < 0)
		goto fail;
	m->request = hdr[0];
	m->flags = hdr[1];
	m->size = hdr[2];
	if (m->size > VHU_PAYLOAD_MAX) {
		r = -EPROTO;
		goto fail;
	}
	r = recv_exact(fd, m->payload.raw, m->size, m, &got, deadline);
	if (r < 0)
		goto fail;
	/* Zero the rest of the small payload structs so short payloads never expose stale bytes. */
	if (m->size < sizeof(struct vhu_config))
		memset(m->payload.raw + m->size, 0, sizeof(struct vhu_config) - m->size);
	return 0;

fail:
	vhu_msg_close_fds(m);
	return r;
}

int vhu_msg_send(int fd, uint32_t request, uint32_t flags, const void *payload, uint32_t size,
		 const int *fds, unsigned nfds, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : (int64_t)mono_ms() + timeout_ms;
	uint32_t hdr[3] = { request, flags, size };
	union {
		char buf[CMSG_SPACE(sizeof(int) * VHU_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	size_t total = VHU_HDR_SIZE + size, off = 0;

	if (size > VHU_PAYLOAD_MAX || nfds > VHU_MAX_FDS || (size > 0 && !payload) ||
	    (nfds > 0 && !fds))
		return -EINVAL;

	while (off < total) {
		struct iovec iov[2];
		struct msghdr mh = { .msg_iov = iov };
		ssize_t n;

		if (off < VHU_HDR_SIZE) {
			iov[0].iov_base = (char *)hdr + off;
			iov[0].iov_len = VHU_HDR_SIZE - off;
			iov[1].iov_base = (void *)payload;
			iov[1].iov_len = size;
			mh.msg_iovlen = size > 0 ? 2 : 1;
		} else {
			iov[0].iov_base = (char *)payload + (off - VHU_HDR_SIZE);
			iov[0].iov_len = total - off;
			mh.msg_iovlen = 1;
		}
		if (off == 0 && nfds > 0) {
			struct cmsghdr *c;

			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int r = wait_fd(fd, POLLOUT, deadline);

				if (r < 0)
					return r;
				continue;
			}
			return -errno;
		}
		off += (size_t)n;
	}
	return 0;
}
