/* SPDX-License-Identifier: MIT */
/*
 * SOCK_DGRAM through the socket API over the loopback transport (src/lib/socket.c "Datagrams"):
 * delivery and boundaries, zero-length datagrams, truncation both ways, MSG_PEEK, the default
 * peer (connect, AF_UNSPEC), auto-bind, errno (EMSGSIZE, EDESTADDRREQ, EOPNOTSUPP), poll,
 * SO_RCVBUF with the drops it causes counted, and 16 threads sending on one socket, lock-free
 * and with UVSOCK_DGRAM_LOCKED=1 (every datagram received intact or counted as dropped; also run
 * under TSan by scripts/tsan.sh).
 */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <uvsock/uvsock.h>

#include "test.h"
#include "vmaddr.h"

#define DG_MAX 65492
#define NSIZES 5

static int dg_socket(struct uvsock_ctx *ctx, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);
	int fd = uvsock_socket(ctx, SOCK_DGRAM, 0);

	ASSERT_GE(fd, 0);
	if (port != VMADDR_PORT_ANY)
		ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static ssize_t dg_sendto(int fd, const void *p, size_t n, int flags, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_LOCAL, port);

	return uvsock_sendto(fd, p, n, flags, (struct sockaddr *)&a, sizeof(a));
}

static uint32_t local_port(int fd)
{
	struct sockaddr_vm a;
	socklen_t len = sizeof(a);

	ASSERT_EQ(uvsock_getsockname(fd, (struct sockaddr *)&a, &len), 0);
	return a.svm_port;
}

/* A loopback context with a receiver bound to port and an unbound sender. */
struct pair {
	struct uvsock_ctx *ctx;
	int rx, tx;
};

static struct pair pair_open(uint32_t port)
{
	struct pair p = { .ctx = uvsock_ctx_new_loopback(NULL) };

	ASSERT_TRUE(p.ctx != NULL);
	p.rx = dg_socket(p.ctx, port);
	p.tx = dg_socket(p.ctx, VMADDR_PORT_ANY);
	return p;
}

static void pair_close(struct pair *p)
{
	ASSERT_EQ(uvsock_close(p->rx), 0);
	ASSERT_EQ(uvsock_close(p->tx), 0);
	uvsock_ctx_free(p->ctx);
}

static struct uvsock_ctx_stats ctx_stats(struct uvsock_ctx *ctx)
{
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_get_stats(ctx, &st), 0);
	return st;
}

TEST(dgram_delivery_boundaries_and_source)
{
	struct pair pr = pair_open(5000);
	struct uvsock_ctx *ctx = pr.ctx;
	int rx = pr.rx, tx = pr.tx;
	static char big[DG_MAX], got[DG_MAX + 16];
	static const size_t sizes[NSIZES] = { 1, 100, 0, 4096, DG_MAX };
	struct sockaddr_vm src;
	socklen_t slen;

	ASSERT_EQ(local_port(tx), VMADDR_PORT_ANY);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7 + 1);
	for (size_t i = 0; i < NSIZES; i++)
		ASSERT_EQ(dg_sendto(tx, big, sizes[i], 0, 5000), (ssize_t)sizes[i]);
	ASSERT_GE(local_port(tx), 1024u); /* auto-bound by the first send */
	for (size_t i = 0; i < NSIZES; i++) {
		slen = sizeof(src);
		memset(&src, 0, sizeof(src));
		ASSERT_EQ(uvsock_recvfrom(rx, got, sizeof(got), MSG_DONTWAIT, (struct sockaddr *)&src,
					  &slen),
			  (ssize_t)sizes[i]);
		ASSERT_MEMEQ(got, big, sizes[i]);
		ASSERT_EQ(slen, sizeof(src));
		ASSERT_EQ(src.svm_family, AF_VSOCK);
		ASSERT_EQ(src.svm_cid, VMADDR_CID_LOCAL);
		ASSERT_EQ(src.svm_port, local_port(tx));
	}
	errno = 0;
	ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), MSG_DONTWAIT), -1);
	ASSERT_EQ(errno, EAGAIN);
	errno = 0;
	ASSERT_EQ(dg_sendto(tx, big, DG_MAX + 1, 0, 5000), -1);
	ASSERT_EQ(errno, EMSGSIZE);
	errno = 0;
	ASSERT_EQ(uvsock_send(tx, big, 1, 0), -1);
	ASSERT_EQ(errno, EDESTADDRREQ);
	ASSERT_EQ(ctx_stats(ctx).dgram_tx, NSIZES);
	ASSERT_EQ(ctx_stats(ctx).dgram_rx, NSIZES);
	pair_close(&pr);
}

TEST(dgram_truncation_and_peek)
{
	struct pair pr = pair_open(5001);
	int rx = pr.rx, tx = pr.tx;
	char data[100], got[100];
	struct iovec iov = { got, 10 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	for (int i = 0; i < 100; i++)
		data[i] = (char)i;
	ASSERT_EQ(dg_sendto(tx, data, 100, 0, 5001), 100);
	ASSERT_EQ(dg_sendto(tx, data, 100, 0, 5001), 100);
	ASSERT_EQ(dg_sendto(tx, data, 50, 0, 5001), 50);
	/* Peek leaves it queued, with the whole length on request. */
	ASSERT_EQ(uvsock_recv(rx, got, 10, MSG_PEEK | MSG_TRUNC), 100);
	ASSERT_EQ(uvsock_recvmsg(rx, &m, MSG_PEEK), 10);
	ASSERT_EQ(m.msg_flags, MSG_TRUNC);
	/* Cut to the buffer: the rest is discarded, MSG_TRUNC out. */
	ASSERT_EQ(uvsock_recvmsg(rx, &m, 0), 10);
	ASSERT_EQ(m.msg_flags, MSG_TRUNC);
	ASSERT_MEMEQ(got, data, 10);
	/* MSG_TRUNC in: the full length of the datagram, which is consumed. */
	ASSERT_EQ(uvsock_recvmsg(rx, &m, MSG_TRUNC), 100);
	ASSERT_EQ(m.msg_flags, MSG_TRUNC);
	iov.iov_len = sizeof(got);
	ASSERT_EQ(uvsock_recvmsg(rx, &m, 0), 50);
	ASSERT_EQ(m.msg_flags, 0);
	ASSERT_MEMEQ(got, data, 50);
	pair_close(&pr);
}

TEST(dgram_default_peer_and_errors)
{
	struct pair pr = pair_open(5002);
	struct uvsock_ctx *ctx = pr.ctx;
	int rx = pr.rx, tx = pr.tx;
	struct sockaddr_vm peer = vm_addr(VMADDR_CID_LOCAL, 5002), a;
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };
	socklen_t len = sizeof(a);
	char got[8];

	errno = 0;
	ASSERT_EQ(uvsock_getpeername(tx, (struct sockaddr *)&a, &len), -1);
	ASSERT_EQ(errno, ENOTCONN);
	ASSERT_EQ(uvsock_connect(tx, (struct sockaddr *)&peer, sizeof(peer)), 0);
	ASSERT_GE(local_port(tx), 1024u); /* connect auto-binds, as Linux */
	len = sizeof(a);
	ASSERT_EQ(uvsock_getpeername(tx, (struct sockaddr *)&a, &len), 0);
	ASSERT_EQ(a.svm_port, 5002u);
	ASSERT_EQ(uvsock_send(tx, "ab", 2, 0), 2);
	/* An explicit address still works on a connected socket (never EISCONN). */
	ASSERT_EQ(dg_sendto(tx, "cd", 2, 0, 5002), 2);
	ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), 0), 2);
	ASSERT_MEMEQ(got, "ab", 2);
	ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), 0), 2);
	ASSERT_MEMEQ(got, "cd", 2);
	ASSERT_EQ(uvsock_connect(tx, &unspec, sizeof(unspec)), 0);
	errno = 0;
	ASSERT_EQ(uvsock_send(tx, "ab", 2, 0), -1);
	ASSERT_EQ(errno, EDESTADDRREQ);
	/* Nobody on the port: dropped and counted, never ECONNREFUSED. */
	ASSERT_EQ(dg_sendto(tx, "x", 1, 0, 5999), 1);
	ASSERT_EQ(dg_sendto(tx, "x", 1, 0, 5999), 1);
	ASSERT_EQ(ctx_stats(ctx).dgram_drop_no_listener, 2u);
	errno = 0;
	ASSERT_EQ(uvsock_listen(rx, 1), -1);
	ASSERT_EQ(errno, EOPNOTSUPP);
	errno = 0;
	ASSERT_EQ(uvsock_accept(rx, NULL, NULL), -1);
	ASSERT_EQ(errno, EOPNOTSUPP);
	errno = 0;
	ASSERT_EQ(uvsock_send(tx, "x", 1, MSG_OOB), -1);
	ASSERT_EQ(errno, EOPNOTSUPP);
	pair_close(&pr);
}

TEST(dgram_poll_and_blocking_recv)
{
	struct pair pr = pair_open(5003);
	int rx = pr.rx, tx = pr.tx;
	struct pollfd p[2] = { { .fd = rx, .events = POLLIN }, { .fd = tx, .events = POLLOUT } };
	struct timeval tv = { .tv_sec = 0, .tv_usec = 20000 };
	char got[8];

	ASSERT_EQ(uvsock_poll(p, 1, 0), 0);
	ASSERT_EQ(uvsock_poll(&p[1], 1, 0), 1);
	ASSERT_EQ(p[1].revents, POLLOUT);
	/* A blocking recv with nothing queued ends at SO_RCVTIMEO. */
	ASSERT_EQ(uvsock_setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	errno = 0;
	ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), 0), -1);
	ASSERT_EQ(errno, EAGAIN);
	ASSERT_EQ(dg_sendto(tx, "hi", 2, 0, 5003), 2);
	ASSERT_EQ(uvsock_poll(p, 1, 1000), 1);
	ASSERT_EQ(p[0].revents, POLLIN);
	ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), 0), 2);
	ASSERT_EQ(uvsock_poll(p, 1, 0), 0);
	pair_close(&pr);
}

TEST(dgram_rcvbuf_full_drops_counted)
{
	struct pair pr = pair_open(5004);
	struct uvsock_ctx *ctx = pr.ctx;
	int rx = pr.rx, tx = pr.tx;
	int v = 4096, got_v = 0, n = 0;
	socklen_t len = sizeof(got_v);
	char data[1000], got[1000];
	struct uvsock_ctx_stats st;

	memset(data, 'z', sizeof(data));
	ASSERT_EQ(uvsock_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)), 0);
	ASSERT_EQ(uvsock_getsockopt(rx, SOL_SOCKET, SO_RCVBUF, &got_v, &len), 0);
	ASSERT_EQ(got_v, 8192); /* doubled, as Linux */
	for (int i = 0; i < 20; i++)
		ASSERT_EQ(dg_sendto(tx, data, sizeof(data), 0, 5004), (ssize_t)sizeof(data));
	/* The loopback pump has delivered or dropped each one; count what arrived. */
	ASSERT_WAIT_FOR(ctx_stats(ctx).dgram_rx + ctx_stats(ctx).dgram_drop_full == 20, 5000);
	while (uvsock_recv(rx, got, sizeof(got), MSG_DONTWAIT) == (ssize_t)sizeof(got))
		n++;
	st = ctx_stats(ctx);
	ASSERT_EQ(n, 8192 / (1000 + 64));
	ASSERT_EQ(st.dgram_drop_full, 20u - (uint64_t)n);
	/* A receiver that keeps up loses nothing. */
	for (int i = 0; i < 50; i++) {
		ASSERT_EQ(dg_sendto(tx, data, sizeof(data), 0, 5004), (ssize_t)sizeof(data));
		ASSERT_EQ(uvsock_recv(rx, got, sizeof(got), 0), (ssize_t)sizeof(got));
	}
	ASSERT_EQ(ctx_stats(ctx).dgram_drop_full, st.dgram_drop_full);
	pair_close(&pr);
}

/* ---- 16 senders on one socket -------------------------------------------------------------- */

#define CS_THREADS 16
#define CS_PER_THREAD 400

struct cs {
	struct uvsock_ctx *ctx;
	int tx;
	uint32_t port;
	unsigned id;
};

/* Datagram (thread, seq): a header of both, then bytes derived from them; length varies. */
static size_t cs_fill(char *buf, unsigned id, unsigned seq)
{
	size_t len = 8 + ((id * 131u + seq * 17u) % 2000u);

	memcpy(buf, &id, 4);
	memcpy(buf + 4, &seq, 4);
	for (size_t i = 8; i < len; i++)
		buf[i] = (char)(id + seq + i);
	return len;
}

static void *cs_sender(void *arg)
{
	struct cs *c = arg;
	char buf[2048];

	for (unsigned seq = 0; seq < CS_PER_THREAD; seq++) {
		size_t len = cs_fill(buf, c->id, seq);

		ASSERT_EQ(dg_sendto(c->tx, buf, len, 0, c->port), (ssize_t)len);
	}
	return NULL;
}

static void concurrent_senders(void)
{
	struct pair pr = pair_open(5005);
	struct uvsock_ctx *ctx = pr.ctx;
	int rx = pr.rx, tx = pr.tx;
	static unsigned char seen[CS_THREADS][CS_PER_THREAD];
	struct cs cs[CS_THREADS];
	pthread_t th[CS_THREADS];
	uint64_t total = CS_THREADS * CS_PER_THREAD, got = 0;
	int big = 1 << 20;
	char buf[2048], want[2048];

	memset(seen, 0, sizeof(seen));
	ASSERT_EQ(uvsock_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big)), 0);
	for (unsigned i = 0; i < CS_THREADS; i++) {
		cs[i] = (struct cs){ .ctx = ctx, .tx = tx, .port = 5005, .id = i };
		ASSERT_EQ(pthread_create(&th[i], NULL, cs_sender, &cs[i]), 0);
	}
	/* Receive until every datagram is accounted for: received, or dropped (receiver full). */
	while (got + ctx_stats(ctx).dgram_drop_full < total) {
		struct pollfd p = { .fd = rx, .events = POLLIN };
		unsigned id, seq;
		ssize_t n;

		if (uvsock_poll(&p, 1, 10000) != 1)
			test_fail(__FILE__, __LINE__, "no datagram for 10 s (%llu received)",
				  (unsigned long long)got);
		n = uvsock_recv(rx, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0)
			continue;
		ASSERT_GE(n, 8);
		memcpy(&id, buf, 4);
		memcpy(&seq, buf + 4, 4);
		ASSERT_LT(id, (unsigned)CS_THREADS);
		ASSERT_LT(seq, (unsigned)CS_PER_THREAD);
		ASSERT_EQ((size_t)n, cs_fill(want, id, seq));
		ASSERT_MEMEQ(buf, want, (size_t)n);
		ASSERT_EQ(seen[id][seq], 0); /* never twice */
		seen[id][seq] = 1;
		got++;
	}
	for (unsigned i = 0; i < CS_THREADS; i++)
		ASSERT_EQ(pthread_join(th[i], NULL), 0);
	ASSERT_EQ(ctx_stats(ctx).dgram_tx, total);
	ASSERT_EQ(got + ctx_stats(ctx).dgram_drop_full, total);
	test_note("16 senders: %llu received, %llu dropped (receiver full)",
		  (unsigned long long)got, (unsigned long long)ctx_stats(ctx).dgram_drop_full);
	pair_close(&pr);
}

TEST(dgram_16_senders_one_socket)
{
	concurrent_senders();
}

/* The same with every send under the socket lock (each case runs in a child of its own, so the
 * variable, read once per process, applies to this case only). */
TEST(dgram_16_senders_one_socket_locked)
{
	ASSERT_EQ(setenv("UVSOCK_DGRAM_LOCKED", "1", 1), 0);
	concurrent_senders();
}

TEST(dgram_nonblocking_empty_recv)
{
	/* Loopback always negotiates datagrams (the ENODEV path is tested in vsock-dgram). */
	struct uvsock_ctx *ctx = uvsock_ctx_new_loopback(NULL);
	int fd = uvsock_socket(ctx, SOCK_DGRAM | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	errno = 0;
	ASSERT_EQ(uvsock_recv(fd, NULL, 0, 0), -1);
	ASSERT_EQ(errno, EAGAIN);
	uvsock_close(fd);
	uvsock_ctx_free(ctx);
}

TEST_MAIN()
