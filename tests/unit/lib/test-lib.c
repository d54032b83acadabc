/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the socket-API layer itself (src/lib): context lifecycle, descriptor table,
 * context options, the pump-thread loopback mode, pollable-descriptor arming, concurrent close.
 * Socket semantics as such are covered by the conformance table (tests/conformance).
 */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <uvsock/uvsock.h>

#include "test.h"
#include "vmaddr.h"

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	ASSERT_TRUE(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static int listener(struct uvsock_ctx *ctx, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);
	int fd = uvsock_socket(ctx, SOCK_STREAM, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(uvsock_listen(fd, 16), 0);
	return fd;
}

static int connector(struct uvsock_ctx *ctx, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_LOCAL, port);
	int fd = uvsock_socket(ctx, SOCK_STREAM, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(uvsock_connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

TEST(ctx_bad_flags)
{
	struct uvsock_loopback_opts o = { .size = sizeof(o), .flags = 0x80000000u };

	errno = 0;
	ASSERT_TRUE(uvsock_ctx_new_loopback(&o) == NULL);
	ASSERT_EQ(errno, EINVAL);
	uvsock_ctx_free(NULL);
	ASSERT_EQ(uvsock_ctx_local_cid(NULL), VMADDR_CID_ANY);
}

TEST(ctx_free_closes_sockets_and_fds)
{
	int before = count_fds(), l, c, s;
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);

	ASSERT_TRUE(ctx);
	ASSERT_EQ(uvsock_ctx_local_cid(ctx), VMADDR_CID_LOCAL);
	l = listener(ctx, 500);
	c = connector(ctx, 500);
	s = uvsock_accept(l, NULL, NULL);
	ASSERT_GE(s, 0);
	ASSERT_EQ(count_fds(), before + 3);
	/* The descriptor is a real fd and honours SOCK_CLOEXEC. */
	ASSERT_EQ(fcntl(c, F_GETFD) & FD_CLOEXEC, 0);
	uvsock_ctx_free(ctx);
	ASSERT_EQ(count_fds(), before);
	errno = 0;
	ASSERT_EQ(uvsock_send(c, "x", 1, 0), -1);
	ASSERT_TRUE(errno == EBADF || errno == ENOTSOCK);
}

TEST(cloexec_descriptor)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);
	int fd;

	ASSERT_TRUE(ctx);
	fd = uvsock_socket(ctx, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	uvsock_ctx_free(ctx);
}

TEST(unprivileged_reserved_port)
{
	struct uvsock_loopback_opts o = { .size = sizeof(o), .flags = UVSOCK_CTX_UNPRIVILEGED };
	struct uvsock_ctx *priv = uvsock_ctx_new_loopback(NULL), *unpriv;
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, 80);
	int fd;

	ASSERT_TRUE(priv);
	fd = uvsock_socket(priv, SOCK_STREAM, 0);
	ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	uvsock_ctx_free(priv);

	unpriv = uvsock_ctx_new_loopback(&o);
	ASSERT_TRUE(unpriv);
	fd = uvsock_socket(unpriv, SOCK_STREAM, 0);
	errno = 0;
	ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), -1);
	ASSERT_EQ(errno, EACCES);
	a.svm_port = 1024;
	ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	uvsock_ctx_free(unpriv);
}

TEST(max_sockets)
{
	struct uvsock_loopback_opts o = { .size = sizeof(o), .max_sockets = 4 };
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(&o);

	ASSERT_TRUE(ctx);
	for (int i = 0; i < 4; i++)
		ASSERT_GE(uvsock_socket(ctx, SOCK_STREAM, 0), 0);
	errno = 0;
	ASSERT_EQ(uvsock_socket(ctx, SOCK_STREAM, 0), -1);
	ASSERT_EQ(errno, EMFILE);
	uvsock_ctx_free(ctx);
}

TEST(contexts_are_isolated)
{
	struct uvsock_ctx *a = uvsock_ctx_new_loopback(NULL), *b = uvsock_ctx_new_loopback(NULL);
	struct sockaddr_vm sa = vm_addr(VMADDR_CID_LOCAL, 600);
	int fd;

	ASSERT_TRUE(a && b);
	listener(a, 600);
	fd = uvsock_socket(b, SOCK_STREAM, 0);
	errno = 0;
	ASSERT_EQ(uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)), -1);
	ASSERT_EQ(errno, ECONNRESET);
	uvsock_ctx_free(a);
	uvsock_ctx_free(b);
}

TEST(stats_and_dropped)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);
	struct sockaddr_vm sa = vm_addr(42, 1);
	struct uvsock_ctx_stats st = { .size = sizeof(st) };
	int fd;

	ASSERT_TRUE(ctx);
	fd = uvsock_socket(ctx, SOCK_STREAM | SOCK_NONBLOCK, 0);
	errno = 0;
	ASSERT_EQ(uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)), -1);
	ASSERT_EQ(errno, EINPROGRESS);
	ASSERT_EQ(uvsock_ctx_get_stats(ctx, &st), 0);
	ASSERT_EQ_U64(st.dropped, 1);
	ASSERT_GE(st.tx_pkts, 1);
	errno = 0;
	ASSERT_EQ(uvsock_ctx_get_stats(NULL, &st), -1);
	ASSERT_EQ(errno, EINVAL);
	uvsock_ctx_free(ctx);
}

struct echo_arg {
	int lfd;
};

static void *echo_server(void *p)
{
	struct echo_arg *e = p;
	char buf[4096];
	ssize_t n;
	int fd = uvsock_accept(e->lfd, NULL, NULL);

	ASSERT_GE(fd, 0);
	while ((n = uvsock_recv(fd, buf, sizeof(buf), 0)) > 0)
		ASSERT_EQ(uvsock_send(fd, buf, (size_t)n, 0), n);
	ASSERT_EQ(n, 0);
	uvsock_close(fd);
	return NULL;
}

static void echo_roundtrips(struct uvsock_ctx *ctx, uint32_t port)
{
	struct echo_arg e = { .lfd = listener(ctx, port) };
	char out[1000], in[1000];
	pthread_t th;
	int fd;

	ASSERT_EQ(pthread_create(&th, NULL, echo_server, &e), 0);
	fd = connector(ctx, port);
	for (int i = 0; i < 200; i++) {
		size_t got = 0;

		memset(out, i, sizeof(out));
		ASSERT_EQ(uvsock_send(fd, out, sizeof(out), 0), (ssize_t)sizeof(out));
		while (got < sizeof(in)) {
			ssize_t n = uvsock_recv(fd, in + got, sizeof(in) - got, 0);

			ASSERT_GT(n, 0);
			got += (size_t)n;
		}
		ASSERT_MEMEQ(in, out, sizeof(in));
	}
	ASSERT_EQ(uvsock_shutdown(fd, SHUT_WR), 0);
	ASSERT_EQ(pthread_join(th, NULL), 0);
	uvsock_close(fd);
	uvsock_close(e.lfd);
}

TEST(inline_pump_echo)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);

	ASSERT_TRUE(ctx);
	echo_roundtrips(ctx, 700);
	uvsock_ctx_free(ctx);
}

TEST(pump_thread_echo)
{
	struct uvsock_loopback_opts o = { .size = sizeof(o), .flags = UVSOCK_LOOPBACK_PUMP_THREAD };
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(&o);

	ASSERT_TRUE(ctx);
	echo_roundtrips(ctx, 701);
	uvsock_ctx_free(ctx);
}

TEST(poll_interest_tracks_pollout)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);
	int l, c, s;
	char buf[65536];
	struct pollfd p;

	ASSERT_TRUE(ctx);
	l = listener(ctx, 800);
	c = connector(ctx, 800);
	s = uvsock_accept(l, NULL, NULL);
	ASSERT_GE(s, 0);
	ASSERT_EQ(uvsock_poll_interest(c, POLLOUT), 0);
	p = (struct pollfd){ .fd = c, .events = POLLIN };
	ASSERT_EQ(poll(&p, 1, 0), 1);
	/* Use up the peer's credit: POLLOUT goes away and so does readability. */
	memset(buf, 0, sizeof(buf));
	while (uvsock_send(c, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
	ASSERT_EQ(errno, EAGAIN);
	ASSERT_FALSE(uvsock_poll_events(c) & POLLOUT);
	ASSERT_EQ(poll(&p, 1, 0), 0);
	/* The reader makes room: writable again (credit update travels back). */
	while (uvsock_recv(s, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
	ASSERT_EQ(errno, EAGAIN);
	ASSERT_EQ(poll(&p, 1, 2000), 1);
	ASSERT_TRUE(uvsock_poll_events(c) & POLLOUT);
	uvsock_ctx_free(ctx);
}

struct hammer {
	int fd;
	int errs_badf;
};

static void *hammer_main(void *p)
{
	struct hammer *h = p;
	char buf[256] = { 0 };

	for (int i = 0; i < 100000; i++) {
		ssize_t n = uvsock_send(h->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n < 0 && errno == EBADF) {
			h->errs_badf++;
			break;
		}
		n = uvsock_recv(h->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0 && errno == EBADF) {
			h->errs_badf++;
			break;
		}
	}
	return NULL;
}

TEST(close_races_with_calls)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);

	ASSERT_TRUE(ctx);
	for (int round = 0; round < 20; round++) {
		int l = listener(ctx, 900 + (uint32_t)round), c = connector(ctx, 900 + (uint32_t)round);
		int s = uvsock_accept(l, NULL, NULL);
		struct hammer h[4];
		pthread_t th[4];

		ASSERT_GE(s, 0);
		for (int i = 0; i < 4; i++) {
			h[i] = (struct hammer){ .fd = i % 2 ? c : s };
			ASSERT_EQ(pthread_create(&th[i], NULL, hammer_main, &h[i]), 0);
		}
		test_sleep_ms(2); /* deliberately: let the hammers get into their calls first */
		ASSERT_EQ(uvsock_close(c), 0);
		ASSERT_EQ(uvsock_close(s), 0);
		for (int i = 0; i < 4; i++)
			ASSERT_EQ(pthread_join(th[i], NULL), 0);
		uvsock_close(l);
	}
	uvsock_ctx_free(ctx);
}

TEST_MAIN()
