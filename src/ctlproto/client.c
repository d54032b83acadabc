/* SPDX-License-Identifier: MIT */
/*
 * The control protocol's client (client.h): one request, with an optional file descriptor passed
 * along, and its one-line answer read within a deadline and a size bound.
 */
#include "ctlproto/client.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/time.h"

static int send_all(int fd, const char *buf, size_t len, int pass_fd)
{
	bool first = true;

	while (len) {
		union {
			char b[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} cm;
		struct iovec iov = { (void *)buf, len };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (first && pass_fd >= 0) {
			struct cmsghdr *h;

			memset(&cm, 0, sizeof(cm));
			msg.msg_control = cm.b;
			msg.msg_controllen = sizeof(cm.b);
			h = CMSG_FIRSTHDR(&msg);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(h), &pass_fd, sizeof(int));
		}
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		first = false;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

int ops_ctl_request(int fd, const char *req, int pass_fd, int timeout_ms, char **ret_raw,
		    struct ops_jv **ret)
{
	size_t reqlen = strlen(req), cap = 4096, len = 0;
	uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;
	char *line = malloc(reqlen + 2), *buf = NULL, *nl = NULL;
	int r;

	if (!line)
		return -ENOMEM;
	memcpy(line, req, reqlen);
	line[reqlen] = '\n';
	r = send_all(fd, line, reqlen + 1, pass_fd);
	free(line);
	if (r < 0)
		return r;
	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	while (!nl) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = mono_ms();
		ssize_t n;

		if (now >= deadline) {
			r = -ETIMEDOUT;
			goto fail;
		}
		r = poll(&p, 1, (int)(deadline - now));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			r = r == 0 ? -ETIMEDOUT : -errno;
			goto fail;
		}
		if (len + 1 >= cap) {
			char *b;

			if (cap >= OPS_STATCLI_MAX_ANSWER) {
				r = -E2BIG;
				goto fail;
			}
			b = realloc(buf, cap * 2);
			if (!b) {
				r = -ENOMEM;
				goto fail;
			}
			buf = b;
			cap *= 2;
		}
		/* Read no further than the line: a pipelined second answer stays in the socket. */
		n = recv(fd, buf + len, cap - len - 1, MSG_PEEK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			goto fail;
		}
		if (n == 0) {
			r = -ECONNRESET;
			goto fail;
		}
		nl = memchr(buf + len, '\n', (size_t)n);
		if (nl)
			n = nl - (buf + len) + 1;
		n = recv(fd, buf + len, (size_t)n, 0);
		if (n <= 0) {
			r = n == 0 ? -ECONNRESET : -errno;
			goto fail;
		}
		len += (size_t)n;
	}
	buf[len - 1] = '\0';
	if (ret) {
		r = ops_json_parse(buf, len - 1, ret);
		if (r < 0) {
			r = r == -ENOMEM ? r : -EPROTO;
			goto fail;
		}
	}
	if (ret_raw)
		*ret_raw = buf;
	else
		free(buf);
	return 0;
fail:
	free(buf);
	return r;
}

const char *ops_ctl_why(int err)
{
	switch (err < 0 ? -err : err) {
	case ENOENT:
		return "no such socket: is uvsockd running, and is this its control socket? (uvsockd "
		       "logs its control socket at start-up)";
	case ECONNREFUSED:
		return "nobody listens there: a socket file left by a uvsockd that is gone";
	case EACCES:
	case EPERM:
		return "permission denied: the control socket (mode 0600) serves uvsockd's own user "
		       "and root only";
	case ENOTSOCK:
		return "not a socket";
	case ESRCH:
		return "not a control socket, and no uvsockd control socket next to it (PATH.ctl, "
		       "*.ctl) lists it as a VM's socket (uvsockd logs its control socket at "
		       "start-up)";
	default:
		return strerror(err < 0 ? -err : err);
	}
}
