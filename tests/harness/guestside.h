/* SPDX-License-Identifier: MIT */
/*
 * Guest-side helpers shared by the guest-role tests: sockets through the public uvsock API
 * (connect, listen, timeouts, bounded event waits) and patterned bulk transfers checked byte
 * by byte, plus host-side transfer threads over plain file descriptors.
 */
#ifndef UVSOCK_TESTS_GUESTSIDE_H
#define UVSOCK_TESTS_GUESTSIDE_H

#include <pthread.h>
#include <stdlib.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "hostside.h"
#include "vmaddr.h"

#ifndef WAIT_MS
#define WAIT_MS 5000
#endif

/* A guest-role context on the vhost-user socket `sock` (opts may be NULL); fails the case if none. */
static inline struct uvsock_ctx *g_guest_new(const char *sock, const struct uvsock_guest_opts *o)
{
	struct uvsock_ctx *ctx = uvsock_ctx_new_guest(sock, o);

	if (!ctx)
		test_fail(__FILE__, __LINE__, "uvsock_ctx_new_guest(%s): %s", sock,
			  strerror(errno));
	return ctx;
}

static inline int g_connect(struct uvsock_ctx *ctx, int type, uint32_t cid, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(cid, port);
	int fd = uvsock_socket(ctx, type, 0);

	ASSERT_GE(fd, 0);
	if (uvsock_connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;

		uvsock_close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static inline int g_listen(struct uvsock_ctx *ctx, int type, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);
	int fd = uvsock_socket(ctx, type, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(uvsock_listen(fd, 64), 0);
	return fd;
}

static inline void g_set_timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	ASSERT_EQ(uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	ASSERT_EQ(uvsock_setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
}

/*
 * A guest → host connection to a host listener that is already there (lfd, from
 * hs_listen_port): connects a guest socket of ctx to host port `port` (asserted) and accepts the
 * host end within WAIT_MS (asserted). Returns the guest fd; *ret_hfd gets the accepted fd.
 */
static inline int g_connect_accept(struct uvsock_ctx *ctx, int lfd, int type, uint32_t port,
				   int *ret_hfd)
{
	int gfd = g_connect(ctx, type, VMADDR_CID_HOST, port);

	ASSERT_GE(gfd, 0);
	*ret_hfd = hs_accept(lfd, WAIT_MS);
	ASSERT_GE(*ret_hfd, 0);
	return gfd;
}

/*
 * A guest → host connection through the host-side convention: listens on <uds>_<port> (type),
 * connects a guest socket of ctx to host port `port` (asserted), gives it timeout_ms send and
 * receive timeouts, and accepts the host end within WAIT_MS (asserted). Returns the guest fd;
 * *ret_lfd and *ret_hfd get the host listener and the accepted fd (the caller closes all three).
 */
static inline int g_connect_host(struct uvsock_ctx *ctx, const char *uds, int type, uint32_t port,
				 int timeout_ms, int *ret_lfd, int *ret_hfd)
{
	int gfd;

	*ret_lfd = hs_listen_port(uds, port, type);
	gfd = g_connect_accept(ctx, *ret_lfd, type, port, ret_hfd);
	g_set_timeouts(gfd, timeout_ms);
	return gfd;
}

/*
 * A host → guest connection to the guest listener ls (port `port`, type): the host connects
 * through <uds> with CONNECT (asserted within WAIT_MS) and the guest accepts (asserted). Returns
 * the accepted guest fd; *ret_hfd gets the host end.
 */
static inline int g_accept_host(int ls, const char *uds, int type, uint32_t port, int *ret_hfd)
{
	int hfd, gfd;

	hfd = hs_connect_guest(uds, port, type, WAIT_MS);
	ASSERT_GE(hfd, 0);
	gfd = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(gfd, 0);
	*ret_hfd = hfd;
	return gfd;
}

static inline void g_send_pattern(int fd, size_t total, size_t chunk, uint64_t seed)
{
	uint8_t *buf = malloc(chunk);

	ASSERT_TRUE(buf != NULL);
	for (size_t off = 0; off < total;) {
		size_t n = total - off < chunk ? total - off : chunk;
		ssize_t r;

		hs_fill(buf, n, seed, off);
		r = uvsock_send(fd, buf, n, 0);
		if (r <= 0)
			test_fail(__FILE__, __LINE__, "uvsock_send at %zu: %zd %s", off, r,
				  strerror(errno));
		off += (size_t)r;
	}
	free(buf);
}

/* Receives total bytes in reads of at most chunk bytes, checking the pattern. */
static inline void g_recv_pattern_chunk(int fd, size_t total, uint64_t seed, size_t chunk)
{
	uint8_t *buf = malloc(chunk);

	ASSERT_TRUE(buf != NULL);
	for (size_t off = 0; off < total;) {
		ssize_t r = uvsock_recv(fd, buf, chunk, 0);

		if (r <= 0)
			test_fail(__FILE__, __LINE__, "uvsock_recv at %zu: %zd %s", off, r,
				  strerror(errno));
		ASSERT_EQ(hs_check(buf, (size_t)r, seed, off), (size_t)r);
		off += (size_t)r;
	}
	free(buf);
}

/* Receives total bytes in reads of at most 64 KiB, checking the pattern. */
static inline void g_recv_pattern(int fd, size_t total, uint64_t seed)
{
	g_recv_pattern_chunk(fd, total, seed, 65536);
}

/* Waits (bounded) until the socket's event mask has any of events; returns those it has. */
static inline unsigned g_wait_events(int fd, unsigned events, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = (short)(events & (POLLIN | POLLOUT | POLLRDHUP)) };

	if (uvsock_poll(&p, 1, timeout_ms) < 0)
		test_fail(__FILE__, __LINE__, "uvsock_poll: %s", strerror(errno));
	return (unsigned)uvsock_poll_events(fd) & events;
}

struct g_io {
	int fd;
	size_t total, chunk;
	uint64_t seed;
};

static inline void *g_send_main(void *arg)
{
	struct g_io *io = arg;

	g_send_pattern(io->fd, io->total, io->chunk, io->seed);
	return NULL;
}

/*
 * Guest to guest: sends total patterned bytes (seed) on `from` in writes of chunk bytes from a
 * thread, while this thread receives and checks them on `to`.
 */
static inline void g_transfer(int from, int to, size_t total, size_t chunk, uint64_t seed)
{
	struct g_io io = { .fd = from, .total = total, .chunk = chunk, .seed = seed };
	pthread_t th;

	ASSERT_EQ(pthread_create(&th, NULL, g_send_main, &io), 0);
	g_recv_pattern(to, total, seed);
	pthread_join(th, NULL);
}

/* A host-side transfer on a plain fd, run on its own thread; chunk 0 means 64 KiB. */
struct host_io {
	int fd;
	size_t total;
	uint64_t seed;
	size_t chunk;
	bool ok;
};

static inline void *host_send_main(void *arg)
{
	struct host_io *h = arg;
	size_t chunk = h->chunk ? h->chunk : 65536;
	uint8_t *buf = malloc(chunk);

	for (size_t off = 0; buf && off < h->total;) {
		size_t n = h->total - off < chunk ? h->total - off : chunk;

		hs_fill(buf, n, h->seed, off);
		hs_write_all(h->fd, buf, n);
		off += n;
	}
	h->ok = buf != NULL;
	free(buf);
	return NULL;
}

static inline void *host_recv_main(void *arg)
{
	struct host_io *h = arg;
	size_t chunk = h->chunk ? h->chunk : 65536;
	uint8_t *buf = malloc(chunk);
	size_t off = 0;

	h->ok = false;
	while (buf && off < h->total) {
		size_t want = h->total - off < chunk ? h->total - off : chunk;
		ssize_t got;

		if (hs_wait_fd(h->fd, POLLIN, WAIT_MS) <= 0)
			break;
		got = read(h->fd, buf, want);
		if (got <= 0 || hs_check(buf, (size_t)got, h->seed, off) != (size_t)got)
			break;
		off += (size_t)got;
	}
	h->ok = off == h->total;
	free(buf);
	return NULL;
}

#endif
