/* SPDX-License-Identifier: MIT */
/*
 * A program written as a libuvsock user outside this tree writes it: it includes only
 * <uvsock/uvsock.h> and is built with only `pkg-config --cflags --libs uvsock` against an
 * installed copy (test-link.sh). It routes the library's log lines to a callback, then sends a
 * message over a loopback connection and reads it back on the accepted socket.
 * Exit 0 on success; otherwise 1 with the failing step on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include <uvsock/uvsock.h>

#define PORT 5005

static int log_lines;

static void on_log(int level, const char *msg)
{
	(void)level;
	(void)msg;
	log_lines++;
}

static int fail(const char *what)
{
	fprintf(stderr, "link-prog: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(void)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_LOCAL,
				  .svm_port = PORT };
	const char msg[] = "ping through libuvsock.so";
	struct timeval tv = { .tv_sec = 10 };
	char buf[64];
	struct uvsock_ctx *ctx;
	int l, c, s;
	ssize_t n;

	if (uvsock_set_log_fn(on_log, UVSOCK_LOG_WARN) < 0)
		return fail("uvsock_set_log_fn");
	if (uvsock_set_log_fn(on_log, 42) != -1 || errno != EINVAL)
		return fail("uvsock_set_log_fn accepted level 42");
	ctx = uvsock_ctx_new_loopback(NULL);
	if (!ctx)
		return fail("uvsock_ctx_new_loopback");
	l = uvsock_socket(ctx, SOCK_STREAM, 0);
	if (l < 0 || uvsock_bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    uvsock_listen(l, 4) < 0)
		return fail("listener");
	c = uvsock_socket(ctx, SOCK_STREAM, 0);
	if (c < 0 || uvsock_connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return fail("connect");
	s = uvsock_accept(l, NULL, NULL);
	if (s < 0)
		return fail("accept");
	if (uvsock_send(c, msg, sizeof(msg), 0) != (ssize_t)sizeof(msg))
		return fail("send");
	if (uvsock_setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		return fail("SO_RCVTIMEO");
	n = uvsock_recv(s, buf, sizeof(msg), MSG_WAITALL);
	if (n != (ssize_t)sizeof(msg) || memcmp(buf, msg, sizeof(msg)) != 0) {
		fprintf(stderr, "link-prog: received %zd bytes, not the %zu sent\n", n, sizeof(msg));
		return 1;
	}
	uvsock_close(s);
	uvsock_close(c);
	uvsock_close(l);
	uvsock_ctx_free(ctx);
	printf("link-prog: %zu bytes over loopback, %d log lines\n", sizeof(msg), log_lines);
	return 0;
}
