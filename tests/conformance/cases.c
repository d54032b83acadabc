/* SPDX-License-Identifier: MIT */
/*
 * The conformance case table: Linux AF_VSOCK behaviour through the public uvsock API, client and
 * server sides of each case (the first entries follow the kernel's vsock_test). Cases use only
 * include/uvsock/uvsock.h and the env the factory gives them, so the same table runs over
 * loopback and over the real transport.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <unistd.h>

#include "conf.h"

#define MIB (1024u * 1024u)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static struct sockaddr *sa(struct sockaddr_vm *a)
{
	return (struct sockaddr *)a;
}

static void set_timeval_opt(int fd, int level, int name, long ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	ASSERT_SYS(uvsock_setsockopt(fd, level, name, &tv, sizeof(tv)));
}

static int get_so_error(int fd)
{
	int err = -1;
	socklen_t len = sizeof(err);

	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len));
	ASSERT_EQ(len, sizeof(int));
	return err;
}

static void noop(struct conf_args *a)
{
	(void)a;
}

/*
 * What epoll waits for on a descriptor armed with uvsock_poll_interest(fd, interest): uvsock's
 * descriptor polls readable while any of those events is set; a kernel socket reports the
 * events themselves.
 */
static uint32_t armed_events(const struct conf_args *a, short interest)
{
	return conf_on_kernel(a) ? (uint16_t)interest : EPOLLIN;
}

static void fill_pattern(uint64_t *seed, uint8_t *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(test_xorshift64(seed) >> 24);
}

/* ---- vsock_test 0: connection reset ---------------------------------------------------- */

static void reset_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	uint64_t t0 = test_now_ms();

	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), ECONNRESET);
	/* An RST, not the 2 s connect timeout. */
	ASSERT_LT(test_now_ms() - t0, 1000);
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- vsock_test 1: bind only ------------------------------------------------------------ */

static void bind_only_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd;

	ctl_expect(a, "BIND");
	fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), ECONNRESET);
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "DONE");
}

static void bind_only_server(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(VMADDR_CID_ANY, a->port);
	int fd = uvsock_socket(a->env->server_ctx, SOCK_STREAM, 0);

	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_bind(fd, sa(&addr), sizeof(addr)));
	ctl_send(a, "BIND");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- vsock_test 2/3: client close, server close ------------------------------------------ */

static void closer_side(struct conf_args *a, int fd)
{
	conf_send_all(fd, "x", 1);
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "CLOSED");
}

static void survivor_side(struct conf_args *a, int fd)
{
	char c = 0;
	unsigned ev;

	ctl_expect(a, "CLOSED");
	ev = conf_wait_events(fd, POLLRDHUP, 5000);
	ASSERT_TRUE(ev & POLLRDHUP);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLIN);
	/* Linux: send to a peer that closed fails EPIPE, with no SIGPIPE. */
	ASSERT_ERRNO(uvsock_send(fd, "y", 1, 0), EPIPE);
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 1);
	ASSERT_EQ(c, 'x');
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_SYS(uvsock_close(fd));
}

static void client_close_client(struct conf_args *a)
{
	ctl_expect(a, "LISTENING");
	closer_side(a, conf_connect(a, SOCK_STREAM, a->port));
}

static void client_close_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1);

	ctl_send(a, "LISTENING");
	survivor_side(a, conf_accept(lfd));
	ASSERT_SYS(uvsock_close(lfd));
}

static void server_close_client(struct conf_args *a)
{
	ctl_expect(a, "LISTENING");
	survivor_side(a, conf_connect(a, SOCK_STREAM, a->port));
}

static void server_close_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1);

	ctl_send(a, "LISTENING");
	closer_side(a, conf_accept(lfd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 4: multiple connections ------------------------------------------------- */

#define MULTICONN_N 100

static void multiconn_client(struct conf_args *a)
{
	ctl_expect(a, "LISTENING");
	for (int i = 0; i < MULTICONN_N; i++) {
		int fd = conf_connect(a, SOCK_STREAM, a->port);
		uint8_t c = (uint8_t)i;

		if (i % 2) {
			conf_send_all(fd, &c, 1);
		} else {
			conf_recv_all(fd, &c, 1);
			ASSERT_EQ(c, (uint8_t)i);
		}
		ASSERT_SYS(uvsock_close(fd));
	}
}

static void multiconn_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, MULTICONN_N);

	ctl_send(a, "LISTENING");
	for (int i = 0; i < MULTICONN_N; i++) {
		int fd = conf_accept(lfd);
		uint8_t c = (uint8_t)i;

		if (i % 2) {
			conf_recv_all(fd, &c, 1);
			ASSERT_EQ(c, (uint8_t)i);
		} else {
			conf_send_all(fd, &c, 1);
		}
		ASSERT_SYS(uvsock_close(fd));
	}
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 5: MSG_PEEK ----------------------------------------------------------- */

static void peek_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, "abcdef", 6);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void peek_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char buf[8] = { 0 };

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	/* Wait until all 6 bytes are there, then peek twice, then read. */
	ASSERT_SYS(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &(int){ 6 }, sizeof(int)));
	conf_wait_events(fd, POLLIN, 5000);
	ASSERT_EQ(uvsock_recv(fd, buf, 1, MSG_PEEK), 1);
	ASSERT_EQ(buf[0], 'a');
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), MSG_PEEK), 6);
	ASSERT_MEMEQ(buf, "abcdef", 6);
	memset(buf, 0, sizeof(buf));
	ASSERT_EQ(uvsock_recv(fd, buf, 2, 0), 2);
	ASSERT_MEMEQ(buf, "ab", 2);
	ASSERT_SYS(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &(int){ 1 }, sizeof(int)));
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), MSG_PEEK), 4);
	ASSERT_MEMEQ(buf, "cdef", 4);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 4);
	ASSERT_MEMEQ(buf, "cdef", 4);
	ASSERT_ERRNO(uvsock_recv(fd, buf, 1, MSG_PEEK | MSG_DONTWAIT), EAGAIN);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 6: SEQPACKET message bounds + MSG_EOR ----------------------------------- */

#define BOUNDS_N 7
#define BOUNDS_EOR_AT 3

static void seq_bounds_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	for (int i = 0; i < BOUNDS_N; i++) {
		char c = (char)('0' + i);

		ASSERT_EQ(uvsock_send(fd, &c, 1, i == BOUNDS_EOR_AT ? MSG_EOR : 0), 1);
	}
	ctl_send(a, "SENDDONE");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_bounds_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_expect(a, "SENDDONE");
	for (int i = 0; i < BOUNDS_N; i++) {
		char buf[16] = { 0 };
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

		ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), 1);
		ASSERT_EQ(buf[0], '0' + i);
		ASSERT_EQ(!!(msg.msg_flags & MSG_EOR), i == BOUNDS_EOR_AT);
		ASSERT_FALSE(msg.msg_flags & MSG_TRUNC);
	}
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 7: SEQPACKET MSG_TRUNC ------------------------------------------------- */

static void seq_trunc_client(struct conf_args *a)
{
	char msg[32];
	int fd;

	memset(msg, 'm', sizeof(msg));
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	ASSERT_EQ(uvsock_send(fd, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	ASSERT_EQ(uvsock_send(fd, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	ASSERT_EQ(uvsock_send(fd, "z", 1, 0), 1);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_trunc_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	char buf[16];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	/* MSG_TRUNC in flags: the real length comes back. */
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, MSG_TRUNC), 32);
	ASSERT_TRUE(msg.msg_flags & MSG_TRUNC);
	/* Without it: the copied length; the flag is still set. */
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), (ssize_t)sizeof(buf));
	ASSERT_TRUE(msg.msg_flags & MSG_TRUNC);
	/* The rest of the truncated message was discarded: the next message is intact. */
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), 1);
	ASSERT_EQ(buf[0], 'z');
	ASSERT_FALSE(msg.msg_flags & MSG_TRUNC);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 8: SEQPACKET SO_RCVTIMEO --------------------------------------------------- */

static void seq_timeout_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_timeout_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	struct timeval tv = { 0 };
	socklen_t len = sizeof(tv);
	uint64_t t0, dt;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	set_timeval_opt(fd, SOL_SOCKET, SO_RCVTIMEO, 300);
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len));
	ASSERT_EQ(tv.tv_sec, 0);
	ASSERT_EQ(tv.tv_usec, 300000);
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_recv(fd, &c, 1, 0), EAGAIN);
	dt = test_now_ms() - t0;
	ASSERT_GE(dt, conf_min_wait(a, 299));
	ASSERT_LT(dt, 300 + 1000);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 10: poll + SO_RCVLOWAT ------------------------------------------------- */

#define LOWAT 128

static void rcvlowat_client(struct conf_args *a)
{
	char buf[LOWAT];
	int fd;

	memset(buf, 'l', sizeof(buf));
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, buf, 1);
	ctl_send(a, "SENT1");
	ctl_expect(a, "CHECKED");
	conf_send_all(fd, buf, LOWAT);
	ctl_send(a, "SENTALL");
	ctl_expect(a, "ONEMORE");
	conf_send_all(fd, buf, 1);
	ctl_send(a, "SENTONE");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void rcvlowat_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd, lowat = LOWAT, got = 0;
	socklen_t len = sizeof(got);
	struct pollfd p;
	uint64_t t0;
	char buf[LOWAT];

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_SYS(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)));
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &got, &len));
	ASSERT_EQ(got, LOWAT);
	ctl_expect(a, "SENT1");
	/* 1 byte queued: below the low-water mark, no POLLIN (library and pollable fd). */
	ASSERT_FALSE(uvsock_poll_events(fd) & POLLIN);
	ASSERT_SYS(uvsock_poll_interest(fd, POLLIN));
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	ASSERT_EQ(poll(&p, 1, 100), 0);
	/*
	 * ... but a non-blocking recv returns the byte: Linux waits only while nothing is queued
	 * (net/vmw_vsock/af_vsock.c vsock_connectible_wait_data), and a non-blocking
	 * __vsock_stream_recvmsg returns what it read below the SO_RCVLOWAT target.
	 */
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), MSG_DONTWAIT), 1);
	ASSERT_ERRNO(uvsock_recv(fd, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	ctl_send(a, "CHECKED");
	ctl_expect(a, "SENTALL");
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	ASSERT_EQ(poll(&p, 1, 5000), 1);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLIN);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), MSG_DONTWAIT), LOWAT);
	/* A blocking recv below the mark takes the byte, waits for more until SO_RCVTIMEO, and
	 * then returns what it has (af_vsock.c __vsock_stream_recvmsg). */
	ctl_send(a, "ONEMORE");
	ctl_expect(a, "SENTONE");
	set_timeval_opt(fd, SOL_SOCKET, SO_RCVTIMEO, 200);
	t0 = test_now_ms();
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 1);
	ASSERT_GE(test_now_ms() - t0, conf_min_wait(a, 199));
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- vsock_test 11: SEQPACKET big message --------------------------------------------- */

/*
 * A SEQPACKET transport error as the caller sees it: Linux before 6.3 turned every one into
 * ENOMEM (af_vsock.c vsock_connectible_sendmsg / vsock_connectible_recvmsg, until "vsock:
 * return errors other than -ENOMEM to socket").
 */
static int seq_errno(const struct conf_args *a, int e)
{
	return conf_kernel_before(a, 6, 3) ? ENOMEM : e;
}

static void seq_bigmsg_client(struct conf_args *a)
{
	uint64_t bufsz = 0;
	socklen_t len = sizeof(bufsz);
	char *buf;
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	ASSERT_SYS(uvsock_getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &bufsz, &len));
	buf = calloc(1, bufsz + 1);
	ASSERT_TRUE(buf);
	ASSERT_ERRNO(uvsock_send(fd, buf, bufsz + 1, 0), seq_errno(a, EMSGSIZE));
	/* Non-blocking: the same answer, not EAGAIN. */
	ASSERT_ERRNO(uvsock_send(fd, buf, bufsz + 1, MSG_DONTWAIT), seq_errno(a, EMSGSIZE));
	/* A message of exactly the maximum size goes through. */
	ASSERT_EQ(uvsock_send(fd, buf, bufsz, 0), (ssize_t)bufsz);
	ctl_expect(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_bigmsg_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	size_t sz = 256 * 1024 + 16;
	char *buf = malloc(sz);
	struct iovec iov = { .iov_base = buf, .iov_len = sz };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	ASSERT_TRUE(buf);
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), 256 * 1024);
	ASSERT_FALSE(msg.msg_flags & MSG_TRUNC);
	ctl_send(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Stream echo ------------------------------------------------------------------------ */

static const size_t echo_sizes[] = { 1, 7, 100, 4096, 65535, 65536, 65537, 200000 };

static void echo_client(struct conf_args *a)
{
	size_t max = 200000;
	uint8_t *out = malloc(max), *in = malloc(max);
	uint64_t seed = 42;
	int fd;

	ASSERT_TRUE(out && in);
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	for (size_t i = 0; i < sizeof(echo_sizes) / sizeof(echo_sizes[0]); i++) {
		fill_pattern(&seed, out, echo_sizes[i]);
		conf_send_all(fd, out, echo_sizes[i]);
		conf_recv_all(fd, in, echo_sizes[i]);
		ASSERT_MEMEQ(in, out, echo_sizes[i]);
	}
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ASSERT_EQ(uvsock_recv(fd, in, 1, 0), 0);
	ASSERT_SYS(uvsock_close(fd));
	free(out);
	free(in);
}

static void echo_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	uint8_t buf[8192];
	ssize_t n;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	while ((n = uvsock_recv(fd, buf, sizeof(buf), 0)) > 0)
		conf_send_all(fd, buf, (size_t)n);
	ASSERT_EQ(n, 0);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Shutdown each way (vsock_test 16/17 without SIGPIPE) -------------------------------- */

static void shut_wr_client(struct conf_args *a)
{
	char c;
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, "w", 1);
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, 0), EPIPE);
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, MSG_NOSIGNAL), EPIPE);
	/* The other direction still works. */
	conf_recv_all(fd, &c, 1);
	ASSERT_EQ(c, 'r');
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLHUP);
	ASSERT_SYS(uvsock_close(fd));
}

static void shut_wr_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	conf_recv_all(fd, &c, 1);
	ASSERT_EQ(c, 'w');
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLRDHUP);
	conf_send_all(fd, "r", 1);
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

static void shut_rd_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ctl_expect(a, "SHUTRD");
	/*
	 * The peer shut down receiving: sends fail with EPIPE, as on Linux, once its SHUTDOWN has
	 * arrived. The control channel can overtake the SHUTDOWN packet (a transport may deliver
	 * later), and no poll bit announces a peer's receive shutdown, so retry until EPIPE.
	 */
	ssize_t r;
	int err = 0;
	WAIT_FOR((r = uvsock_send(fd, "x", 1, MSG_DONTWAIT)) != 1, 5000);
	if (r < 0)
		err = errno;
	ASSERT_EQ(r, -1);
	ASSERT_EQ(err, EPIPE);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void shut_rd_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_RD));
	/* Local SHUT_RD: recv returns 0 at once, POLLRDHUP is set. */
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLRDHUP);
	ctl_send(a, "SHUTRD");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- SEQPACKET MSG_EOR on multi-packet messages ----------------------------------------- */

static void seq_eor_client(struct conf_args *a)
{
	size_t big = 150000; /* more than two 64 KiB packets */
	char *buf = malloc(big);
	int fd;

	ASSERT_TRUE(buf);
	for (size_t i = 0; i < big; i++)
		buf[i] = (char)(i * 7);
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	ASSERT_EQ(uvsock_send(fd, buf, big, MSG_EOR), (ssize_t)big);
	ASSERT_EQ(uvsock_send(fd, buf, big, 0), (ssize_t)big);
	ASSERT_EQ(uvsock_send(fd, buf, 10, MSG_EOR), 10);
	ctl_expect(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_eor_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	size_t big = 150000;
	char *buf = malloc(big + 10);
	struct iovec iov = { .iov_base = buf, .iov_len = big + 10 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	ASSERT_TRUE(buf);
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), (ssize_t)big);
	ASSERT_TRUE(msg.msg_flags & MSG_EOR);
	for (size_t i = 0; i < big; i++)
		if (buf[i] != (char)(i * 7))
			test_fail(__FILE__, __LINE__, "byte %zu differs", i);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), (ssize_t)big);
	ASSERT_FALSE(msg.msg_flags & MSG_EOR);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), 10);
	ASSERT_TRUE(msg.msg_flags & MSG_EOR);
	ctl_send(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- 100 MiB checksummed transfer ------------------------------------------------------ */

#define BULK_BYTES (100ull * MIB)
/* The kernel run, in a TCG guest, moves 16 MiB (the interop run's time budget). */
#define KERNEL_BULK_BYTES (16ull * MIB)

static void bulk_client(struct conf_args *a)
{
	size_t chunk = 256 * 1024;
	uint8_t *buf = malloc(chunk);
	uint64_t seed = 7, h = 0xcbf29ce484222325ull, sent = 0;
	uint64_t total = conf_on_kernel(a) ? KERNEL_BULK_BYTES : BULK_BYTES;
	int fd;

	ASSERT_TRUE(buf);
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	while (sent < total) {
		/* Vary the write size so packet and buffer boundaries move around. */
		size_t n = 1 + (size_t)(test_xorshift64(&seed) % chunk);

		if (n > total - sent)
			n = (size_t)(total - sent);
		for (size_t i = 0; i < n; i += 8) {
			uint64_t v = test_xorshift64(&seed);

			memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
		}
		h = conf_fnv1a(h, buf, n);
		conf_send_all(fd, buf, n);
		sent += n;
	}
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ASSERT_EQ_U64(ctl_recv_u64(a), sent);
	ASSERT_EQ_U64(ctl_recv_u64(a), h);
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
}

static void bulk_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	size_t cap = 100000;
	uint8_t *buf = malloc(cap);
	uint64_t h = 0xcbf29ce484222325ull, got = 0, seed = 3;
	ssize_t n;

	ASSERT_TRUE(buf);
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	for (;;) {
		size_t want = 1 + (size_t)(test_xorshift64(&seed) % cap);

		n = uvsock_recv(fd, buf, want, 0);
		ASSERT_SYS(n);
		if (n == 0)
			break;
		h = conf_fnv1a(h, buf, (size_t)n);
		got += (uint64_t)n;
	}
	ctl_send_u64(a, got);
	ctl_send_u64(a, h);
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- 1000 concurrent connections --------------------------------------------------------- */

#define MANY_N 1000

static void many_client(struct conf_args *a)
{
	int *fds = calloc(MANY_N, sizeof(int));

	ASSERT_TRUE(fds);
	ctl_expect(a, "LISTENING");
	for (int i = 0; i < MANY_N; i++) {
		uint32_t v = (uint32_t)i;

		fds[i] = conf_connect(a, SOCK_STREAM, a->port);
		conf_send_all(fds[i], &v, sizeof(v));
	}
	/* All open at once; each gets its own answer back. */
	for (int i = 0; i < MANY_N; i++) {
		uint32_t v = 0;

		conf_recv_all(fds[i], &v, sizeof(v));
		ASSERT_EQ(v, (uint32_t)i * 3 + 1);
	}
	ctl_send(a, "ALLREAD");
	for (int i = 0; i < MANY_N; i++)
		ASSERT_SYS(uvsock_close(fds[i]));
	free(fds);
}

static void many_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, MANY_N), *fds = calloc(MANY_N, sizeof(int));

	ASSERT_TRUE(fds);
	ctl_send(a, "LISTENING");
	for (int i = 0; i < MANY_N; i++) {
		uint32_t v = 0;

		fds[i] = conf_accept(lfd);
		conf_recv_all(fds[i], &v, sizeof(v));
		v = v * 3 + 1;
		conf_send_all(fds[i], &v, sizeof(v));
	}
	ctl_expect(a, "ALLREAD");
	for (int i = 0; i < MANY_N; i++)
		ASSERT_SYS(uvsock_close(fds[i]));
	free(fds);
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Non-blocking connect + poll on the pollable descriptor ---------------------------- */

static void nb_connect_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM | SOCK_NONBLOCK, 0), ep;
	struct epoll_event ev = { .events = armed_events(a, POLLOUT) }, out;

	ASSERT_SYS(fd);
	ASSERT_EQ(uvsock_fcntl(fd, F_GETFL, 0) & O_NONBLOCK, O_NONBLOCK);
	ctl_expect(a, "LISTENING");
	ep = epoll_create1(EPOLL_CLOEXEC);
	ASSERT_SYS(ep);
	ASSERT_SYS(uvsock_poll_interest(fd, POLLOUT));
	ASSERT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EINPROGRESS);
	ASSERT_EQ(epoll_wait(ep, &out, 1, 5000), 1);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLOUT);
	ASSERT_EQ(get_so_error(fd), 0);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EISCONN);
	conf_send_all(fd, "n", 1);
	close(ep);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void nb_connect_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	conf_recv_all(fd, &c, 1);
	ASSERT_EQ(c, 'n');
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

static void nb_refused_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM | SOCK_NONBLOCK, 0);
	unsigned ev;

	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EINPROGRESS);
	ev = conf_wait_events(fd, POLLOUT, 5000);
	ASSERT_TRUE(ev & POLLERR);
	ASSERT_EQ(get_so_error(fd), ECONNRESET);
	/* SO_ERROR is cleared by reading it. */
	ASSERT_EQ(get_so_error(fd), 0);
	ASSERT_SYS(uvsock_close(fd));
}

/* Live sockets of the client context (lingering ones included). */
static uint64_t client_socks(struct conf_args *a)
{
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	ASSERT_SYS(uvsock_ctx_get_stats(a->env->client_ctx, &st));
	return st.socks_open;
}

/* ---- Close with unread data ------------------------------------------------------------- */

static void wait_client_socks(struct conf_args *a, uint64_t expect_max_shared,
			      uint64_t expect_max_separate, int timeout_ms);

/* Shared-engine only: waits for the one engine both sides use to drain to expect_max sockets. */
static void wait_socks_drained(struct conf_args *a, uint64_t expect_max, int timeout_ms)
{
	if (a->env->shared_engine)
		wait_client_socks(a, expect_max, 0, timeout_ms);
}

/*
 * Waits until the client context has at most expect_max live sockets (lingering ones included).
 * expect_max counts the server's sockets too when both sides share one engine; with separate
 * contexts the server's sockets live elsewhere, so the bound is expect_max_separate.
 */
static void wait_client_socks(struct conf_args *a, uint64_t expect_max_shared,
			      uint64_t expect_max_separate, int timeout_ms)
{
	uint64_t expect_max = a->env->shared_engine ? expect_max_shared : expect_max_separate;

	/* The kernel has no socket counter to read; its ports are free again at once. */
	if (conf_on_kernel(a))
		return;
	if (!WAIT_FOR(client_socks(a) <= expect_max, timeout_ms))
		test_fail(__FILE__, __LINE__, "%llu sockets still open after %d ms",
			  (unsigned long long)client_socks(a), timeout_ms);
}

static void close_unread_client(struct conf_args *a)
{
	char buf[4096];
	int fd;

	memset(buf, 'u', sizeof(buf));
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, buf, sizeof(buf));
	ctl_expect(a, "SERVERCLOSED");
	/* The server closed without reading: we see EOF and EPIPE, and nothing hangs. */
	conf_wait_events(fd, POLLRDHUP, 5000);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 0);
	ASSERT_ERRNO(uvsock_send(fd, buf, 1, 0), EPIPE);
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "CLIENTCLOSED");
}

static void close_unread_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_TRUE(conf_wait_events(fd, POLLIN, 5000) & POLLIN);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
	ctl_send(a, "SERVERCLOSED");
	ctl_expect(a, "CLIENTCLOSED");
	/* Both ends released well before the 8 s close linger. */
	wait_socks_drained(a, 0, 3000);
}

/* The other way round: the client closes while the server has unread data. */
static void close_unread2_client(struct conf_args *a)
{
	char buf[1000];
	int fd;

	memset(buf, 'v', sizeof(buf));
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, buf, sizeof(buf));
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "CLOSED");
}

static void close_unread2_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char buf[2000];

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_expect(a, "CLOSED");
	/* The data sent before close is still delivered, then EOF. */
	conf_recv_all(fd, buf, 1000);
	ASSERT_EQ(buf[999], 'v');
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 0);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
	wait_socks_drained(a, 0, 3000);
}

/* ---- 1-byte flood: memory stays bounded by the advertised buffer ------------------------- */

static void flood_client(struct conf_args *a)
{
	uint64_t sent = 0;
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	for (;;) {
		ssize_t n = uvsock_send(fd, "f", 1, MSG_DONTWAIT);

		if (n < 0 && errno == EAGAIN)
			break;
		ASSERT_EQ(n, 1);
		sent++;
		ASSERT_LE(sent, 256 * 1024);
	}
	ctl_send_u64(a, sent);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void flood_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	struct uvsock_ctx_stats st = { .size = sizeof(st) };
	/* The kernel run takes 32 KiB: one-byte sends in a TCG guest cost ~40 us each. */
	uint64_t sent, got = 0, bufsz = conf_on_kernel(a) ? 32 * 1024 : 256 * 1024;
	char buf[65536];

	ASSERT_SYS(uvsock_setsockopt(lfd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &bufsz,
				     sizeof(bufsz)));
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	sent = ctl_recv_u64(a);
	/* Credit stops the sender at our buffer size (256 KiB by default). */
	ASSERT_GT(sent, 0);
	ASSERT_LE(sent, bufsz);
	while (got < sent) {
		ssize_t n = uvsock_recv(fd, buf, sizeof(buf), 0);

		ASSERT_GT(n, 0);
		for (ssize_t i = 0; i < n; i++)
			ASSERT_EQ(buf[i], 'f');
		got += (uint64_t)n;
	}
	ASSERT_EQ_U64(got, sent);
	/* A well-behaved sender is never reset for it (the kernel has no such counters). */
	if (!conf_on_kernel(a)) {
		ASSERT_SYS(uvsock_ctx_get_stats(a->env->server_ctx, &st));
		ASSERT_EQ_U64(st.rx_mem_resets, 0);
		ASSERT_EQ_U64(st.credit_violations, 0);
	}
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Connect timeout ----------------------------------------------------------------------- */

static void connect_timeout_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->blackhole_cid, a->port);
	struct timeval tv = { .tv_sec = 0, .tv_usec = 300000 }, got = { 0 };
	socklen_t len = sizeof(got);
	uint64_t t0, dt;
	int fd;

	if (a->env->blackhole_cid == VMADDR_CID_ANY)
		test_skip("factory has no CID that never answers");
	fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv)));
	ASSERT_SYS(uvsock_getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &got, &len));
	ASSERT_EQ(got.tv_sec, 0);
	ASSERT_EQ(got.tv_usec, 300000);
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), ETIMEDOUT);
	dt = test_now_ms() - t0;
	ASSERT_GE(dt, conf_min_wait(a, 290));
	ASSERT_LT(dt, 1900); /* not the 2 s default */
	ASSERT_SYS(uvsock_close(fd));
}

static void nb_connect_timeout_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->blackhole_cid, a->port);
	struct timeval tv = { .tv_sec = 0, .tv_usec = 200000 };
	uint64_t t0, dt;
	int fd;

	if (a->env->blackhole_cid == VMADDR_CID_ANY)
		test_skip("factory has no CID that never answers");
	fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM | SOCK_NONBLOCK, 0);
	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv)));
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EINPROGRESS);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EALREADY);
	ASSERT_TRUE(conf_wait_events(fd, POLLOUT, 5000) & POLLERR);
	dt = test_now_ms() - t0;
	ASSERT_GE(dt, conf_min_wait(a, 190));
	ASSERT_EQ(get_so_error(fd), ETIMEDOUT);
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- Backlog full --------------------------------------------------------------------- */

static void backlog_client(struct conf_args *a)
{
	int fds[3], extra;

	ctl_expect(a, "LISTENING");
	/* backlog 1 admits backlog + 1 = 2 pending connections (Linux). */
	fds[0] = conf_connect(a, SOCK_STREAM, a->port);
	fds[1] = conf_connect(a, SOCK_STREAM, a->port);
	{
		struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);

		fds[2] = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
		ASSERT_SYS(fds[2]);
		ASSERT_ERRNO(uvsock_connect(fds[2], sa(&addr), sizeof(addr)), ECONNRESET);
	}
	ctl_send(a, "FULL");
	ctl_expect(a, "ACCEPTED");
	extra = conf_connect(a, SOCK_STREAM, a->port);
	ctl_expect(a, "DONE");
	for (int i = 0; i < 3; i++)
		ASSERT_SYS(uvsock_close(fds[i]));
	ASSERT_SYS(uvsock_close(extra));
}

static void backlog_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	ctl_send(a, "LISTENING");
	ctl_expect(a, "FULL");
	if (!conf_on_kernel(a)) {
		ASSERT_SYS(uvsock_ctx_get_stats(a->env->server_ctx, &st));
		ASSERT_GE(st.backlog_refused, 1);
	}
	fd = conf_accept(lfd);
	ctl_send(a, "ACCEPTED");
	ASSERT_SYS(uvsock_close(conf_accept(lfd)));
	ASSERT_SYS(uvsock_close(conf_accept(lfd)));
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- getsockname / getpeername -------------------------------------------------------- */

static void names_client(struct conf_args *a)
{
	struct sockaddr_vm me, peer;
	socklen_t len;
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

	ASSERT_SYS(fd);
	len = sizeof(me);
	ASSERT_SYS(uvsock_getsockname(fd, sa(&me), &len));
	ASSERT_EQ(len, sizeof(me));
	ASSERT_EQ(me.svm_family, AF_VSOCK);
	ASSERT_EQ(me.svm_cid, VMADDR_CID_ANY);
	ASSERT_EQ(me.svm_port, VMADDR_PORT_ANY);
	len = sizeof(peer);
	ASSERT_ERRNO(uvsock_getpeername(fd, sa(&peer), &len), ENOTCONN);
	ASSERT_SYS(uvsock_close(fd));

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	len = sizeof(peer);
	ASSERT_SYS(uvsock_getpeername(fd, sa(&peer), &len));
	ASSERT_EQ(peer.svm_cid, a->env->server_cid);
	ASSERT_EQ(peer.svm_port, a->port);
	len = sizeof(me);
	ASSERT_SYS(uvsock_getsockname(fd, sa(&me), &len));
	ASSERT_GE(me.svm_port, 1024);
	ASSERT_NE(me.svm_port, VMADDR_PORT_ANY);
	ctl_send_u64(a, me.svm_port);
	/* A short buffer gets a truncated address and the full length. */
	len = 4;
	ASSERT_SYS(uvsock_getsockname(fd, sa(&me), &len));
	ASSERT_EQ(len, sizeof(me));
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void names_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	struct sockaddr_vm peer, acc, me;
	socklen_t len = sizeof(acc);
	uint64_t cport;

	ctl_send(a, "LISTENING");
	fd = uvsock_accept(lfd, sa(&acc), &len);
	ASSERT_SYS(fd);
	ASSERT_EQ(len, sizeof(acc));
	cport = ctl_recv_u64(a);
	ASSERT_EQ(acc.svm_port, cport);
	if (a->env->client_cid != VMADDR_CID_ANY)
		ASSERT_EQ(acc.svm_cid, a->env->client_cid);
	len = sizeof(peer);
	ASSERT_SYS(uvsock_getpeername(fd, sa(&peer), &len));
	ASSERT_EQ(peer.svm_port, cport);
	len = sizeof(me);
	ASSERT_SYS(uvsock_getsockname(fd, sa(&me), &len));
	ASSERT_EQ(me.svm_port, a->port);
	len = sizeof(me);
	ASSERT_SYS(uvsock_getsockname(lfd, sa(&me), &len));
	ASSERT_EQ(me.svm_port, a->port);
	ASSERT_EQ(me.svm_cid, VMADDR_CID_ANY);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Buffer size options and clamping --------------------------------------------------- */

static uint64_t get_u64opt(int fd, int name)
{
	uint64_t v = 0;
	socklen_t len = sizeof(v);

	ASSERT_SYS(uvsock_getsockopt(fd, AF_VSOCK, name, &v, &len));
	ASSERT_EQ(len, sizeof(v));
	return v;
}

static void set_u64opt(int fd, int name, uint64_t v)
{
	ASSERT_SYS(uvsock_setsockopt(fd, AF_VSOCK, name, &v, sizeof(v)));
}

static void bufsize_client(struct conf_args *a)
{
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	uint32_t small = 5;
	uint64_t v;
	socklen_t len;

	ASSERT_SYS(fd);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 256 * 1024);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_MIN_SIZE), 128);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_MAX_SIZE), 256 * 1024);
	/* Above max: clamped to max. */
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE, 4 * MIB);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 256 * 1024);
	/* Raise max first, then it fits. */
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_MAX_SIZE, 2 * MIB);
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE, 1 * MIB);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 1 * MIB);
	/* Below min: clamped to min. */
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_MIN_SIZE, 4096);
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE, 100);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 4096);
	/* Lowering max re-clamps the current size. */
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE, 1 * MIB);
	set_u64opt(fd, SO_VM_SOCKETS_BUFFER_MAX_SIZE, 64 * 1024);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 64 * 1024);
	/* Option length checks: short set and short get are EINVAL. */
	ASSERT_ERRNO(uvsock_setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &small,
				       sizeof(small)),
		     EINVAL);
	len = 4;
	ASSERT_ERRNO(uvsock_getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, &len), EINVAL);
	/* Unknown options. */
	ASSERT_ERRNO(uvsock_setsockopt(fd, AF_VSOCK, 99, &v, sizeof(v)), ENOPROTOOPT);
	ASSERT_ERRNO(uvsock_setsockopt(fd, 12345, 1, &v, sizeof(v)), ENOPROTOOPT);
	ASSERT_SYS(uvsock_close(fd));
}

/* Children inherit buffer sizes from the listener; a small buffer really limits credit. */
static void bufsize_inherit_client(struct conf_args *a)
{
	char buf[8192];
	uint64_t sent = 0;
	int fd;

	memset(buf, 'b', sizeof(buf));
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	for (;;) {
		ssize_t n = uvsock_send(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n < 0 && errno == EAGAIN)
			break;
		ASSERT_GT(n, 0);
		sent += (uint64_t)n;
		ASSERT_LE(sent, 16384);
	}
	ASSERT_EQ_U64(sent, 16384);
	ctl_send(a, "FULL");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void bufsize_inherit_server(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(VMADDR_CID_ANY, a->port);
	int lfd = uvsock_socket(a->env->server_ctx, SOCK_STREAM, 0), fd;

	ASSERT_SYS(lfd);
	set_u64opt(lfd, SO_VM_SOCKETS_BUFFER_SIZE, 16384);
	ASSERT_SYS(uvsock_bind(lfd, sa(&addr), sizeof(addr)));
	ASSERT_SYS(uvsock_listen(lfd, 1));
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_EQ_U64(get_u64opt(fd, SO_VM_SOCKETS_BUFFER_SIZE), 16384);
	ctl_expect(a, "FULL");
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- SO_RCVTIMEO / SO_SNDTIMEO ------------------------------------------------------------ */

static void rcvtimeo_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void rcvtimeo_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	struct timeval bad = { .tv_sec = 0, .tv_usec = 1000000 };
	uint64_t t0, dt;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_ERRNO(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bad, sizeof(bad)), EDOM);
	ASSERT_ERRNO(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bad, 4), EINVAL);
	set_timeval_opt(fd, SOL_SOCKET, SO_RCVTIMEO, 200);
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_recv(fd, &c, 1, 0), EAGAIN);
	dt = test_now_ms() - t0;
	ASSERT_GE(dt, conf_min_wait(a, 199));
	ASSERT_LT(dt, 1200);
	/* MSG_DONTWAIT does not wait at all. */
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_recv(fd, &c, 1, MSG_DONTWAIT), EAGAIN);
	ASSERT_LT(test_now_ms() - t0, 100);
	/* accept() honours SO_RCVTIMEO too. */
	set_timeval_opt(lfd, SOL_SOCKET, SO_RCVTIMEO, 100);
	ASSERT_ERRNO(uvsock_accept(lfd, NULL, NULL), EAGAIN);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

static void sndtimeo_client(struct conf_args *a)
{
	size_t big = 512 * 1024;
	char *buf = calloc(1, big);
	uint64_t t0, dt;
	ssize_t n;
	int fd;

	ASSERT_TRUE(buf);
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	set_timeval_opt(fd, SOL_SOCKET, SO_SNDTIMEO, 200);
	/* The peer does not read: 256 KiB of credit, then the timeout; partial count. */
	t0 = test_now_ms();
	n = uvsock_send(fd, buf, big, 0);
	dt = test_now_ms() - t0;
	ASSERT_EQ(n, 256 * 1024);
	ASSERT_GE(dt, conf_min_wait(a, 199));
	ASSERT_LT(dt, 1200);
	/* Nothing at all fits now: EAGAIN after the timeout. */
	ASSERT_ERRNO(uvsock_send(fd, buf, 10, 0), EAGAIN);
	ctl_send(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
}

static void sndtimeo_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Error paths on unconnected sockets ---------------------------------------------------- */

static void errors_unconnected_client(struct conf_args *a)
{
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	char c;

	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, 0), ENOTCONN);
	ASSERT_ERRNO(uvsock_recv(fd, &c, 1, 0), ENOTCONN);
	ASSERT_ERRNO(uvsock_accept(fd, NULL, NULL), EINVAL);
	ASSERT_ERRNO(uvsock_shutdown(fd, SHUT_RDWR), ENOTCONN);
	ASSERT_ERRNO(uvsock_shutdown(fd, 7), EINVAL);
	/* listen() needs a bound socket on Linux. */
	ASSERT_ERRNO(uvsock_listen(fd, 1), EINVAL);
	ASSERT_SYS(uvsock_close(fd));
}

static void accept_nonlistener_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ASSERT_ERRNO(uvsock_accept(fd, NULL, NULL), EINVAL);
	ASSERT_ERRNO(uvsock_listen(fd, 1), EINVAL);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void accept_nonlistener_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	/* recv and send on the listener itself. */
	ASSERT_ERRNO(uvsock_recv(lfd, &c, 1, MSG_DONTWAIT), ENOTCONN);
	ASSERT_ERRNO(uvsock_send(lfd, "x", 1, MSG_DONTWAIT), ENOTCONN);
	ASSERT_ERRNO(uvsock_accept4(lfd, NULL, NULL, 0x12345), EINVAL);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

static void double_connect_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EISCONN);
	addr.svm_port = a->port + 1;
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), EISCONN);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void one_accept_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- bind ----------------------------------------------------------------------------------- */

static void bind_in_use_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(VMADDR_CID_ANY, a->port + 3);
	int fd1 = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	int fd2 = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	int fd3 = uvsock_socket(a->env->client_ctx, SOCK_SEQPACKET, 0);

	ASSERT_SYS(fd1);
	ASSERT_SYS(fd2);
	ASSERT_SYS(fd3);
	ASSERT_SYS(uvsock_bind(fd1, sa(&addr), sizeof(addr)));
	ASSERT_ERRNO(uvsock_bind(fd2, sa(&addr), sizeof(addr)), EADDRINUSE);
	/* Ports are shared between STREAM and SEQPACKET. */
	ASSERT_ERRNO(uvsock_bind(fd3, sa(&addr), sizeof(addr)), EADDRINUSE);
	ASSERT_SYS(uvsock_listen(fd1, 1));
	ASSERT_ERRNO(uvsock_bind(fd2, sa(&addr), sizeof(addr)), EADDRINUSE);
	/* Once the first socket is gone, the port is free again. */
	ASSERT_SYS(uvsock_close(fd1));
	ASSERT_SYS(uvsock_bind(fd2, sa(&addr), sizeof(addr)));
	ASSERT_SYS(uvsock_close(fd2));
	ASSERT_SYS(uvsock_close(fd3));
}

static void bind_errors_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(VMADDR_CID_ANY, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_bind(fd, sa(&addr), sizeof(addr) - 1), EINVAL);
	/* Linux: copying in a NULL address fails (net/socket.c move_addr_to_kernel). */
	ASSERT_ERRNO(uvsock_bind(fd, NULL, sizeof(addr)), EFAULT);
	ASSERT_ERRNO(uvsock_bind(fd, NULL, 0), EINVAL);
	addr.svm_family = AF_UNIX;
	ASSERT_ERRNO(uvsock_bind(fd, sa(&addr), sizeof(addr)), EINVAL);
	addr = vm_addr(12345, a->port);
	ASSERT_ERRNO(uvsock_bind(fd, sa(&addr), sizeof(addr)), EADDRNOTAVAIL);
	addr = vm_addr(VMADDR_CID_ANY, a->port);
	ASSERT_SYS(uvsock_bind(fd, sa(&addr), sizeof(addr)));
	/* Already bound. */
	addr.svm_port = a->port + 1;
	ASSERT_ERRNO(uvsock_bind(fd, sa(&addr), sizeof(addr)), EINVAL);
	ASSERT_SYS(uvsock_close(fd));
	/* Binding the context's own CID works. */
	fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	ASSERT_SYS(fd);
	addr = vm_addr(uvsock_ctx_local_cid(a->env->client_ctx), a->port + 2);
	ASSERT_SYS(uvsock_bind(fd, sa(&addr), sizeof(addr)));
	ASSERT_SYS(uvsock_close(fd));
}

static void autobind_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(VMADDR_CID_ANY, VMADDR_PORT_ANY), me1, me2;
	int fd1 = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	int fd2 = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);
	socklen_t len;

	ASSERT_SYS(fd1);
	ASSERT_SYS(fd2);
	ASSERT_SYS(uvsock_bind(fd1, sa(&addr), sizeof(addr)));
	ASSERT_SYS(uvsock_bind(fd2, sa(&addr), sizeof(addr)));
	len = sizeof(me1);
	ASSERT_SYS(uvsock_getsockname(fd1, sa(&me1), &len));
	len = sizeof(me2);
	ASSERT_SYS(uvsock_getsockname(fd2, sa(&me2), &len));
	ASSERT_GT(me1.svm_port, 1023);
	ASSERT_GT(me2.svm_port, 1023);
	ASSERT_NE(me1.svm_port, VMADDR_PORT_ANY);
	ASSERT_NE(me2.svm_port, VMADDR_PORT_ANY);
	ASSERT_NE(me1.svm_port, me2.svm_port);
	/* An auto-bound socket can listen and be reached on its port. */
	ASSERT_SYS(uvsock_listen(fd1, 1));
	ctl_send_u64(a, me1.svm_port);
	ASSERT_SYS(uvsock_close(conf_accept(fd1)));
	ASSERT_SYS(uvsock_close(fd1));
	ASSERT_SYS(uvsock_close(fd2));
}

static void autobind_server(struct conf_args *a)
{
	/* Roles swapped: connect from the server context to the client's auto-bound port. */
	struct sockaddr_vm addr;
	uint64_t port = ctl_recv_u64(a);
	int fd = uvsock_socket(a->env->server_ctx, SOCK_STREAM, 0);

	addr = vm_addr(a->env->client_cid, (uint32_t)port);
	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_connect(fd, sa(&addr), sizeof(addr)));
	ASSERT_SYS(uvsock_close(fd));
}

/* vsock_test 21: bind a fixed local port, connect, close; again with the same port. */
static void double_bind_connect_client(struct conf_args *a)
{
	ctl_expect(a, "LISTENING");
	for (int i = 0; i < 2; i++) {
		struct sockaddr_vm local = vm_addr(VMADDR_CID_ANY, a->port + 5);
		struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
		int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

		ASSERT_SYS(fd);
		ASSERT_SYS(uvsock_bind(fd, sa(&local), sizeof(local)));
		ASSERT_SYS(uvsock_connect(fd, sa(&addr), sizeof(addr)));
		ctl_expect(a, "ACCEPTED");
		ASSERT_SYS(uvsock_close(fd));
		ctl_send(a, "CLOSED");
		ctl_expect(a, "SERVERCLOSED");
		/* The port is free again once our lingering socket got the peer's RST. */
		wait_client_socks(a, 1, 0, 3000);
	}
}

static void double_bind_connect_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 4);

	ctl_send(a, "LISTENING");
	for (int i = 0; i < 2; i++) {
		int fd = conf_accept(lfd);
		char c;

		ctl_send(a, "ACCEPTED");
		ctl_expect(a, "CLOSED");
		ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
		ASSERT_SYS(uvsock_close(fd));
		/* Give the RST time to reach the client's lingering socket. */
		wait_socks_drained(a, 1, 3000);
		ctl_send(a, "SERVERCLOSED");
	}
	ASSERT_SYS(uvsock_close(lfd));
}

/* vsock_test 30: retry a failed connect() on the same socket. */
static void retry_connect_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

	ASSERT_SYS(fd);
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), ECONNRESET);
	ctl_send(a, "FAILED");
	ctl_expect(a, "LISTENING");
	ASSERT_SYS(uvsock_connect(fd, sa(&addr), sizeof(addr)));
	conf_send_all(fd, "r", 1);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void retry_connect_server(struct conf_args *a)
{
	int lfd, fd;
	char c;

	ctl_expect(a, "FAILED");
	lfd = conf_listen(a, SOCK_STREAM, a->port, 1);
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	conf_recv_all(fd, &c, 1);
	ASSERT_EQ(c, 'r');
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Many small writes and reads ---------------------------------------------------------- */

#define SMALL_N 20000
#define SMALL_SZ 7

static void small_writes_client(struct conf_args *a)
{
	uint8_t buf[SMALL_SZ];
	uint32_t k = 0;
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	for (int i = 0; i < SMALL_N; i++) {
		for (int j = 0; j < SMALL_SZ; j++)
			buf[j] = (uint8_t)(k++ % 251);
		conf_send_all(fd, buf, sizeof(buf));
	}
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void small_writes_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	uint8_t buf[13];
	uint32_t k = 0;
	ssize_t n;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	while ((n = uvsock_recv(fd, buf, sizeof(buf) - (k % 5), 0)) > 0)
		for (ssize_t i = 0; i < n; i++, k++)
			if (buf[i] != (uint8_t)(k % 251))
				test_fail(__FILE__, __LINE__, "byte %u: %u", k, buf[i]);
	ASSERT_EQ(n, 0);
	ASSERT_EQ(k, SMALL_N * SMALL_SZ);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Concurrent senders on one socket ------------------------------------------------- */

#define CS_THREADS 4
#define CS_RECORDS 3000
#define CS_RECSZ 64

struct cs_arg {
	int fd;
	uint32_t id;
};

static void *cs_sender(void *p)
{
	struct cs_arg *arg = p;
	uint8_t rec[CS_RECSZ];

	for (uint32_t i = 0; i < CS_RECORDS; i++) {
		memset(rec, (int)(arg->id * 16 + i % 16), sizeof(rec));
		memcpy(rec, &arg->id, 4);
		memcpy(rec + 4, &i, 4);
		conf_send_all(arg->fd, rec, sizeof(rec));
	}
	return NULL;
}

static void concurrent_senders_client(struct conf_args *a)
{
	struct cs_arg args[CS_THREADS];
	pthread_t th[CS_THREADS];
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	for (int i = 0; i < CS_THREADS; i++) {
		args[i] = (struct cs_arg){ .fd = fd, .id = (uint32_t)i };
		ASSERT_EQ(pthread_create(&th[i], NULL, cs_sender, &args[i]), 0);
	}
	for (int i = 0; i < CS_THREADS; i++)
		ASSERT_EQ(pthread_join(th[i], NULL), 0);
	ASSERT_SYS(uvsock_shutdown(fd, SHUT_WR));
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void concurrent_senders_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	uint32_t next[CS_THREADS] = { 0 };
	uint8_t rec[CS_RECSZ];

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	for (int n = 0; n < CS_THREADS * CS_RECORDS; n++) {
		uint32_t id, seq;

		ASSERT_EQ(uvsock_recv(fd, rec, sizeof(rec), MSG_WAITALL), (ssize_t)sizeof(rec));
		memcpy(&id, rec, 4);
		memcpy(&seq, rec + 4, 4);
		ASSERT_LT(id, CS_THREADS);
		/* Each record arrives whole and each sender's records in order. */
		ASSERT_EQ(seq, next[id]);
		next[id]++;
		for (int i = 8; i < CS_RECSZ; i++)
			ASSERT_EQ(rec[i], (uint8_t)(id * 16 + seq % 16));
	}
	ASSERT_EQ(uvsock_recv(fd, rec, 1, 0), 0);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Concurrent receivers + senders on different sockets (bidirectional) ---------------- */

struct bidir_arg {
	int fd;
	uint64_t seed;
	uint64_t bytes;
};

static void *bidir_sender(void *p)
{
	struct bidir_arg *b = p;
	uint8_t buf[3000];
	uint64_t s = b->seed;

	for (uint64_t sent = 0; sent < b->bytes;) {
		size_t n = sizeof(buf);

		if (n > b->bytes - sent)
			n = (size_t)(b->bytes - sent);
		fill_pattern(&s, buf, n);
		conf_send_all(b->fd, buf, n);
		sent += n;
	}
	return NULL;
}

static void bidir_check(int fd, uint64_t seed, uint64_t bytes)
{
	uint8_t buf[4096], want[4096];
	uint64_t s = seed;

	for (uint64_t got = 0; got < bytes;) {
		size_t n = sizeof(buf);

		if (n > bytes - got)
			n = (size_t)(bytes - got);
		conf_recv_all(fd, buf, n);
		fill_pattern(&s, want, n);
		ASSERT_MEMEQ(buf, want, n);
		got += n;
	}
}

static void bidir_side(int fd, uint64_t my_seed, uint64_t peer_seed)
{
	struct bidir_arg arg = { .fd = fd, .seed = my_seed, .bytes = 4 * MIB };
	pthread_t th;

	/* Write and read at the same time on one socket: neither side may deadlock on credit. */
	ASSERT_EQ(pthread_create(&th, NULL, bidir_sender, &arg), 0);
	bidir_check(fd, peer_seed, 4 * MIB);
	ASSERT_EQ(pthread_join(th, NULL), 0);
}

static void bidir_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	bidir_side(fd, 11, 22);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void bidir_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	bidir_side(fd, 22, 11);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- MSG_WAITALL ----------------------------------------------------------------------- */

static void waitall_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	conf_send_all(fd, "abc", 3);
	ctl_expect(a, "WAITING");
	usleep(50000);
	conf_send_all(fd, "defg", 4);
	usleep(20000);
	conf_send_all(fd, "hij", 3);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void waitall_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char buf[16] = { 0 };

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_send(a, "WAITING");
	ASSERT_EQ(uvsock_recv(fd, buf, 10, MSG_WAITALL), 10);
	ASSERT_MEMEQ(buf, "abcdefghij", 10);
	/* Linux: a MSG_WAITALL target >= the receive buffer size is ENOMEM. */
	{
		size_t big = 256 * 1024;
		char *b = malloc(big);

		ASSERT_TRUE(b);
		ASSERT_ERRNO(uvsock_recv(fd, b, big, MSG_WAITALL), ENOMEM);
		free(b);
	}
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Socket options: SO_TYPE, SO_RCVLOWAT bounds, bad levels ------------------------------ */

static void sockopt_misc_client(struct conf_args *a)
{
	int fd = uvsock_socket(a->env->client_ctx, SOCK_SEQPACKET, 0), v = 0;
	socklen_t len = sizeof(v);

	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len));
	ASSERT_EQ(v, SOCK_SEQPACKET);
	len = sizeof(v);
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len));
	ASSERT_EQ(v, AF_VSOCK);
	len = sizeof(v);
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len));
	ASSERT_EQ(v, 0);
	/* SO_RCVLOWAT: 0 means 1. */
	v = 0;
	ASSERT_SYS(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)));
	len = sizeof(v);
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &len));
	ASSERT_EQ(v, 1);
	/*
	 * Above the buffer size: SEQPACKET takes it, STREAM fails EINVAL (Linux: only
	 * vsock_stream_ops has the af_vsock.c vsock_set_rcvlowat check).
	 */
	v = 256 * 1024 + 1;
	ASSERT_SYS(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)));
	{
		int sfd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

		ASSERT_SYS(sfd);
		ASSERT_ERRNO(uvsock_setsockopt(sfd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)), EINVAL);
		ASSERT_SYS(uvsock_close(sfd));
	}
	ASSERT_ERRNO(uvsock_setsockopt(fd, SOL_SOCKET, SO_ERROR, &v, sizeof(v)), ENOPROTOOPT);
	ASSERT_ERRNO(uvsock_getsockopt(fd, SOL_SOCKET, 9999, &v, &len), ENOPROTOOPT);
	/* Connect timeout out of range. */
	{
		struct timeval tv = { .tv_sec = -1 };

		ASSERT_ERRNO(uvsock_setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv,
					       sizeof(tv)),
			     ERANGE);
		tv = (struct timeval){ 0 };
		/* 0 restores the 2 s default. */
		ASSERT_SYS(uvsock_setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv,
					     sizeof(tv)));
		len = sizeof(tv);
		ASSERT_SYS(uvsock_getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv,
					     &len));
		ASSERT_EQ(tv.tv_sec, 2);
		ASSERT_EQ(tv.tv_usec, 0);
	}
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- Descriptors ------------------------------------------------------------------------ */

static void bad_descriptor_client(struct conf_args *a)
{
	int fd, devnull;
	char c;

	ASSERT_ERRNO(uvsock_send(-1, "x", 1, 0), EBADF);
	ASSERT_ERRNO(uvsock_close(-1), EBADF);
	devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ASSERT_SYS(devnull);
	ASSERT_ERRNO(uvsock_recv(devnull, &c, 1, 0), ENOTSOCK);
	/* uvsock's own rule: uvsock_close() of a descriptor it does not own (Linux closes it). */
	if (!conf_on_kernel(a))
		ASSERT_ERRNO(uvsock_close(devnull), ENOTSOCK);
	close(devnull);
	ASSERT_ERRNO(uvsock_socket(a->env->client_ctx, SOCK_RDM, 0), ESOCKTNOSUPPORT);
	/* Linux has no datagram transport for virtio: af_vsock.c vsock_create -> ENODEV. */
	if (conf_on_kernel(a))
		ASSERT_ERRNO(uvsock_socket(a->env->client_ctx, SOCK_DGRAM, 0), ENODEV);
	ASSERT_ERRNO(uvsock_socket(a->env->client_ctx, SOCK_RAW, 0), ESOCKTNOSUPPORT);
	ASSERT_ERRNO(uvsock_socket(a->env->client_ctx, SOCK_STREAM, 17), EPROTONOSUPPORT);
	ASSERT_ERRNO(uvsock_socket(NULL, SOCK_STREAM, 0), EINVAL);
	fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM | SOCK_CLOEXEC, PF_VSOCK);
	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_ERRNO(uvsock_close(fd), EBADF);
	ASSERT_ERRNO(uvsock_poll_events(fd), EBADF);
}

/* close() from another thread wakes a blocked recv, which fails EBADF. */
struct closer {
	int fd;
};

static void *closer_main(void *p)
{
	struct closer *c = p;

	usleep(100000);
	ASSERT_SYS(uvsock_close(c->fd));
	return NULL;
}

static void close_wakes_client(struct conf_args *a)
{
	struct closer c;
	pthread_t th;
	char buf[4];
	uint64_t t0;

	ctl_expect(a, "LISTENING");
	c.fd = conf_connect(a, SOCK_STREAM, a->port);
	ASSERT_EQ(pthread_create(&th, NULL, closer_main, &c), 0);
	t0 = test_now_ms();
	ASSERT_ERRNO(uvsock_recv(c.fd, buf, sizeof(buf), 0), EBADF);
	ASSERT_LT(test_now_ms() - t0, 3000);
	ASSERT_EQ(pthread_join(th, NULL), 0);
	ctl_send(a, "DONE");
}

static void close_wakes_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char c;

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ctl_expect(a, "DONE");
	/* The client's close reached us as EOF. */
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Pollable descriptor with epoll, level semantics ------------------------------------ */

static void epoll_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ctl_expect(a, "ARMED");
	conf_send_all(fd, "ep", 2);
	ctl_expect(a, "DRAINED");
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "CLOSED");
	ctl_expect(a, "DONE");
}

static void epoll_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd, ep;
	struct epoll_event ev = { .events = armed_events(a, POLLIN) }, out;
	char buf[4];

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ep = epoll_create1(EPOLL_CLOEXEC);
	ASSERT_SYS(ep);
	ASSERT_SYS(uvsock_poll_interest(fd, POLLIN));
	ASSERT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	ASSERT_EQ(epoll_wait(ep, &out, 1, 50), 0);
	ctl_send(a, "ARMED");
	ASSERT_EQ(epoll_wait(ep, &out, 1, 5000), 1);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLIN);
	/* Level-triggered: still readable until the data is consumed. */
	ASSERT_EQ(epoll_wait(ep, &out, 1, 0), 1);
	ASSERT_SYS(uvsock_set_nonblock(fd, 1));
	ASSERT_EQ(uvsock_recv(fd, buf, 1, 0), 1);
	ASSERT_EQ(epoll_wait(ep, &out, 1, 0), 1);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 1);
	ASSERT_ERRNO(uvsock_recv(fd, buf, sizeof(buf), 0), EAGAIN);
	ASSERT_EQ(epoll_wait(ep, &out, 1, 0), 0);
	ctl_send(a, "DRAINED");
	ctl_expect(a, "CLOSED");
	/* Peer close: readable again (EOF), POLLRDHUP reported. */
	ASSERT_EQ(epoll_wait(ep, &out, 1, 5000), 1);
	ASSERT_TRUE(uvsock_poll_events(fd) & POLLRDHUP);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 0);
	/* Disarmed: never readable (uvsock's pollable descriptor only). */
	if (!conf_on_kernel(a)) {
		ASSERT_SYS(uvsock_poll_interest(fd, 0));
		ASSERT_EQ(epoll_wait(ep, &out, 1, 0), 0);
	}
	ASSERT_ERRNO(uvsock_poll_interest(fd, 0x4000), EINVAL);
	close(ep);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- uvsock_poll over several sockets, accept readiness ---------------------------------- */

static void poll_many_client(struct conf_args *a)
{
	int fds[3];

	ctl_expect(a, "LISTENING");
	for (int i = 0; i < 3; i++)
		fds[i] = conf_connect(a, SOCK_STREAM, a->port);
	ctl_expect(a, "ACCEPTED");
	conf_send_all(fds[1], "1", 1);
	ctl_expect(a, "DONE");
	for (int i = 0; i < 3; i++)
		ASSERT_SYS(uvsock_close(fds[i]));
}

static void poll_many_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 8), fds[3];
	struct pollfd p[5];

	ctl_send(a, "LISTENING");
	/* The listener polls readable while connections wait to be accepted. */
	ASSERT_TRUE(conf_wait_events(lfd, POLLIN, 5000) & POLLIN);
	for (int i = 0; i < 3; i++)
		fds[i] = conf_accept(lfd);
	ASSERT_FALSE(uvsock_poll_events(lfd) & POLLIN);
	ctl_send(a, "ACCEPTED");
	for (int i = 0; i < 3; i++)
		p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
	p[3] = (struct pollfd){ .fd = -1, .events = POLLIN };
	p[4] = (struct pollfd){ .fd = 1000000, .events = POLLIN };
	/* Only socket 1 gets data; wait for it, since POLLNVAL alone would end the poll. */
	ASSERT_EQ(uvsock_poll(p, 3, 5000), 1);
	ASSERT_EQ(uvsock_poll(p, 5, 5000), 2);
	ASSERT_EQ(p[0].revents, 0);
	ASSERT_EQ(p[1].revents, POLLIN);
	ASSERT_EQ(p[2].revents, 0);
	ASSERT_EQ(p[3].revents, 0);
	ASSERT_EQ(p[4].revents, POLLNVAL);
	/* Timeout with nothing ready. */
	ASSERT_EQ(uvsock_poll(p, 1, 30), 0);
	ctl_send(a, "DONE");
	for (int i = 0; i < 3; i++)
		ASSERT_SYS(uvsock_close(fds[i]));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Scatter/gather sendmsg/recvmsg; msg_name rules; MSG_OOB ------------------------------- */

static void iov_client(struct conf_args *a)
{
	char p1[] = "hello ", p2[] = "vsock ", p3[] = "world";
	struct iovec iov[3] = { { p1, 6 }, { p2, 6 }, { p3, 5 } };
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 3 };
	struct sockaddr_vm addr = vm_addr(1, 1);
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ASSERT_EQ(uvsock_sendmsg(fd, &msg, 0), 17);
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, MSG_OOB), EOPNOTSUPP);
	msg.msg_name = &addr;
	msg.msg_namelen = sizeof(addr);
	ASSERT_ERRNO(uvsock_sendmsg(fd, &msg, 0), EISCONN);
	/* Linux: net/socket.c copy_msghdr_from_user. */
	ASSERT_ERRNO(uvsock_sendmsg(fd, NULL, 0), EFAULT);
	/* A zero-length send on a connected socket is 0. */
	ASSERT_EQ(uvsock_send(fd, "", 0, 0), 0);
	ctl_send(a, "CHECKED");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void iov_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	char b1[3], b2[10], b3[4];
	struct iovec iov[3] = { { b1, 3 }, { b2, 10 }, { b3, 4 } };
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 3 };

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, MSG_WAITALL), 17);
	ASSERT_MEMEQ(b1, "hel", 3);
	ASSERT_MEMEQ(b2, "lo vsock w", 10);
	ASSERT_MEMEQ(b3, "orld", 4);
	ASSERT_ERRNO(uvsock_recv(fd, b1, 1, MSG_OOB), EOPNOTSUPP);
	/* A zero-length recv returns 0 without consuming anything. */
	ASSERT_EQ(uvsock_recv(fd, b1, 0, 0), 0);
	ctl_expect(a, "CHECKED");
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- Blocking send larger than credit with a slow reader --------------------------------- */

static void slow_reader_client(struct conf_args *a)
{
	size_t big = 2 * MIB;
	uint8_t *buf = malloc(big);
	uint64_t seed = 99;
	int fd;

	ASSERT_TRUE(buf);
	fill_pattern(&seed, buf, big);
	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	/* One send call for 8x the peer's buffer: blocks on credit, then completes. */
	conf_send_all(fd, buf, big);
	ctl_send_u64(a, conf_fnv1a(0xcbf29ce484222325ull, buf, big));
	ctl_expect(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
}

static void slow_reader_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1), fd;
	size_t big = 2 * MIB, got = 0;
	uint8_t *buf = malloc(big);

	ASSERT_TRUE(buf);
	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	while (got < big) {
		ssize_t n = uvsock_recv(fd, buf + got, MIN(big - got, 50000), 0);

		ASSERT_GT(n, 0);
		got += (size_t)n;
		if ((got / 50000) % 8 == 0)
			usleep(1000);
	}
	ASSERT_EQ_U64(ctl_recv_u64(a), conf_fnv1a(0xcbf29ce484222325ull, buf, big));
	ctl_send(a, "DONE");
	free(buf);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* ---- SEQPACKET: many messages, nonblocking recv, EOF ------------------------------------- */

#define SEQ_MANY 2000
/*
 * The sender waits for the reader after each batch: Linux (6.12.92+, 7.x) also charges every
 * unread packet SKB_TRUESIZE(0) (~576 B) against the buffer size
 * (net/vmw_vsock/virtio_transport_common.c virtio_transport_inc_rx_pkt) and resets a sender
 * that keeps more small messages unread than fit; 50 * (300 + 576) B stays far below 256 KiB.
 */
#define SEQ_BATCH 50

static void seq_many_client(struct conf_args *a)
{
	uint8_t buf[300];
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	for (int i = 0; i < SEQ_MANY; i++) {
		size_t len = 1 + (size_t)(i * 37) % sizeof(buf);

		memset(buf, i & 0xff, len);
		ASSERT_EQ(uvsock_send(fd, buf, len, 0), (ssize_t)len);
		if (i % SEQ_BATCH == SEQ_BATCH - 1)
			ctl_expect(a, "GOT");
	}
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_many_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	uint8_t buf[400];

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	for (int i = 0; i < SEQ_MANY; i++) {
		size_t len = 1 + (size_t)(i * 37) % 300;

		ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), (ssize_t)len);
		ASSERT_EQ(buf[0], i & 0xff);
		ASSERT_EQ(buf[len - 1], i & 0xff);
		if (i % SEQ_BATCH == SEQ_BATCH - 1)
			ctl_send(a, "GOT");
	}
	/* The client closed after the last message: EOF. */
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 0);
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* SEQPACKET MSG_PEEK (upstream vsock_test 15): peek returns the message, recv then gets it. */
static void seq_peek_client(struct conf_args *a)
{
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_SEQPACKET, a->port);
	ASSERT_EQ(uvsock_send(fd, "peekaboo", 8, 0), 8);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void seq_peek_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1), fd;
	char buf[16] = { 0 };

	ctl_send(a, "LISTENING");
	fd = conf_accept(lfd);
	conf_wait_events(fd, POLLIN, 5000);
	if (conf_kernel_before(a, 6, 4)) {
		/* No SEQPACKET MSG_PEEK before 6.4 (virtio_transport_common.c
		 * virtio_transport_seqpacket_dequeue refuses it). */
		ASSERT_ERRNO(uvsock_recv(fd, buf, 4, MSG_PEEK), seq_errno(a, EOPNOTSUPP));
	} else {
		ASSERT_EQ(uvsock_recv(fd, buf, 4, MSG_PEEK), 4);
		ASSERT_MEMEQ(buf, "peek", 4);
		ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), MSG_PEEK), 8);
	}
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 8);
	ASSERT_MEMEQ(buf, "peekaboo", 8);
	ASSERT_ERRNO(uvsock_recv(fd, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
	ASSERT_SYS(uvsock_close(lfd));
}

/* A STREAM client cannot reach a SEQPACKET listener (type mismatch: reset). */
static void type_mismatch_client(struct conf_args *a)
{
	struct sockaddr_vm addr = vm_addr(a->env->server_cid, a->port);
	int fd = uvsock_socket(a->env->client_ctx, SOCK_STREAM, 0);

	ASSERT_SYS(fd);
	ctl_expect(a, "LISTENING");
	ASSERT_ERRNO(uvsock_connect(fd, sa(&addr), sizeof(addr)), ECONNRESET);
	ASSERT_SYS(uvsock_close(fd));
	ctl_send(a, "DONE");
}

static void type_mismatch_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_SEQPACKET, a->port, 1);

	ctl_send(a, "LISTENING");
	ctl_expect(a, "DONE");
	/* Nothing was queued for accept. */
	ASSERT_SYS(uvsock_set_nonblock(lfd, 1));
	ASSERT_ERRNO(uvsock_accept(lfd, NULL, NULL), EAGAIN);
	ASSERT_SYS(uvsock_close(lfd));
}

/* Closing a listener resets connections that were never accepted. */
static void listener_close_client(struct conf_args *a)
{
	char c;
	int fd;

	ctl_expect(a, "LISTENING");
	fd = conf_connect(a, SOCK_STREAM, a->port);
	ctl_send(a, "CONNECTED");
	ctl_expect(a, "CLOSED");
	/* The pending child was reset: EOF here, sending fails. */
	conf_wait_events(fd, POLLRDHUP, 5000);
	ASSERT_EQ(uvsock_recv(fd, &c, 1, 0), 0);
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, 0), EPIPE);
	ASSERT_SYS(uvsock_close(fd));
}

static void listener_close_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 1);

	ctl_send(a, "LISTENING");
	ctl_expect(a, "CONNECTED");
	ASSERT_SYS(uvsock_close(lfd));
	ctl_send(a, "CLOSED");
}

/* Accepted sockets start blocking even from a non-blocking listener; accept4 flags apply. */
static void accept_flags_client(struct conf_args *a)
{
	int fds[2];

	ctl_expect(a, "LISTENING");
	fds[0] = conf_connect(a, SOCK_STREAM, a->port);
	fds[1] = conf_connect(a, SOCK_STREAM, a->port);
	ctl_send(a, "CONNECTED");
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fds[0]));
	ASSERT_SYS(uvsock_close(fds[1]));
}

static void accept_flags_server(struct conf_args *a)
{
	int lfd = conf_listen(a, SOCK_STREAM, a->port, 4), fd1, fd2;

	ASSERT_SYS(uvsock_set_nonblock(lfd, 1));
	ASSERT_ERRNO(uvsock_accept(lfd, NULL, NULL), EAGAIN);
	ctl_send(a, "LISTENING");
	ctl_expect(a, "CONNECTED");
	conf_wait_events(lfd, POLLIN, 5000);
	fd1 = uvsock_accept(lfd, NULL, NULL);
	ASSERT_SYS(fd1);
	ASSERT_EQ(uvsock_fcntl(fd1, F_GETFL, 0) & O_NONBLOCK, 0);
	fd2 = uvsock_accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	ASSERT_SYS(fd2);
	ASSERT_EQ(uvsock_fcntl(fd2, F_GETFL, 0) & O_NONBLOCK, O_NONBLOCK);
	ASSERT_ERRNO(uvsock_recv(fd2, &(char){ 0 }, 1, 0), EAGAIN);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd1));
	ASSERT_SYS(uvsock_close(fd2));
	ASSERT_SYS(uvsock_close(lfd));
}

#define CASE(n, c, s) { .name = n, .run_client = c, .run_server = s }
/* A case of uvsock's own rules; the kernel run skips it, saying why. */
#define UVSOCK_CASE(n, c, s, why) { .name = n, .run_client = c, .run_server = s, .uvsock_only = why }

const struct conf_case conf_cases[] = {
	CASE("stream_connection_reset", reset_client, noop),
	CASE("stream_bind_only", bind_only_client, bind_only_server),
	CASE("stream_client_close", client_close_client, client_close_server),
	CASE("stream_server_close", server_close_client, server_close_server),
	CASE("stream_multiple_connections", multiconn_client, multiconn_server),
	CASE("stream_msg_peek", peek_client, peek_server),
	CASE("seqpacket_msg_bounds", seq_bounds_client, seq_bounds_server),
	CASE("seqpacket_msg_trunc", seq_trunc_client, seq_trunc_server),
	CASE("seqpacket_timeout", seq_timeout_client, seq_timeout_server),
	CASE("stream_poll_rcvlowat", rcvlowat_client, rcvlowat_server),
	CASE("seqpacket_big_message", seq_bigmsg_client, seq_bigmsg_server),
	CASE("stream_echo", echo_client, echo_server),
	CASE("stream_shut_wr", shut_wr_client, shut_wr_server),
	CASE("stream_shut_rd", shut_rd_client, shut_rd_server),
	CASE("seqpacket_msg_eor", seq_eor_client, seq_eor_server),
	CASE("stream_100mib_checksum", bulk_client, bulk_server),
	CASE("stream_1000_connections", many_client, many_server),
	CASE("stream_nonblock_connect_poll", nb_connect_client, nb_connect_server),
	CASE("stream_nonblock_connect_refused", nb_refused_client, noop),
	CASE("stream_close_unread_server", close_unread_client, close_unread_server),
	CASE("stream_close_unread_client", close_unread2_client, close_unread2_server),
	CASE("stream_1byte_flood_bounded", flood_client, flood_server),
	CASE("stream_connect_timeout", connect_timeout_client, noop),
	CASE("stream_nonblock_connect_timeout", nb_connect_timeout_client, noop),
	CASE("stream_backlog_full", backlog_client, backlog_server),
	CASE("getsockname_getpeername", names_client, names_server),
	CASE("buffer_size_options", bufsize_client, noop),
	CASE("buffer_size_inherited_limits_credit", bufsize_inherit_client, bufsize_inherit_server),
	CASE("stream_so_rcvtimeo", rcvtimeo_client, rcvtimeo_server),
	CASE("stream_so_sndtimeo", sndtimeo_client, sndtimeo_server),
	CASE("errors_unconnected", errors_unconnected_client, noop),
	CASE("accept_non_listener", accept_nonlistener_client, accept_nonlistener_server),
	CASE("double_connect_eisconn", double_connect_client, one_accept_server),
	CASE("bind_in_use", bind_in_use_client, noop),
	CASE("bind_errors", bind_errors_client, noop),
	CASE("port_auto_assignment", autobind_client, autobind_server),
	CASE("stream_double_bind_connect", double_bind_connect_client, double_bind_connect_server),
	CASE("stream_retry_failed_connect", retry_connect_client, retry_connect_server),
	CASE("stream_many_small_writes", small_writes_client, small_writes_server),
	CASE("stream_concurrent_senders", concurrent_senders_client, concurrent_senders_server),
	CASE("stream_bidirectional", bidir_client, bidir_server),
	CASE("stream_msg_waitall", waitall_client, waitall_server),
	CASE("sockopt_misc", sockopt_misc_client, noop),
	CASE("bad_descriptors", bad_descriptor_client, noop),
	UVSOCK_CASE("close_wakes_blocked_recv", close_wakes_client, close_wakes_server,
		    "uvsock-only: Linux's close() from another thread does not wake a blocked recv"),
	CASE("pollfd_epoll_level", epoll_client, epoll_server),
	CASE("poll_many_and_accept_ready", poll_many_client, poll_many_server),
	CASE("sendmsg_recvmsg_iov", iov_client, iov_server),
	CASE("stream_blocking_send_slow_reader", slow_reader_client, slow_reader_server),
	CASE("seqpacket_many_messages", seq_many_client, seq_many_server),
	CASE("seqpacket_msg_peek", seq_peek_client, seq_peek_server),
	CASE("type_mismatch_reset", type_mismatch_client, type_mismatch_server),
	CASE("listener_close_resets_pending", listener_close_client, listener_close_server),
	CASE("accept_flags", accept_flags_client, accept_flags_server),
};
const unsigned conf_ncases = sizeof(conf_cases) / sizeof(conf_cases[0]);
