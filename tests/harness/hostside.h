/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the guest-role tests (tests/unit/driver, tests/integration): the host side
 * of the hybrid Unix-socket convention (listeners at <uds>_<port>, CONNECT lines on <uds>), and
 * bounded waits. Every wait has a deadline; failures assert through the harness.
 */
#ifndef UVSOCK_TESTS_HOSTSIDE_H
#define UVSOCK_TESTS_HOSTSIDE_H

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "test.h"

static inline struct sockaddr_un hs_addr(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(a.sun_path))
		test_fail(__FILE__, __LINE__, "path too long: %s", path);
	strcpy(a.sun_path, path);
	return a;
}

/* Listens on path (SOCK_STREAM or SOCK_SEQPACKET). */
static inline int hs_listen(const char *path, int type)
{
	struct sockaddr_un a = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	unlink(path);
	ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(listen(fd, 1024), 0);
	return fd;
}

/* Listens where uvsockd delivers guest connections to host port `port`: <uds>_<port>. */
static inline int hs_listen_port(const char *uds, uint32_t port, int type)
{
	char path[200];

	snprintf(path, sizeof(path), "%s_%u", uds, port);
	return hs_listen(path, type);
}

static inline int hs_wait_fd(int fd, short ev, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int r;

	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	return r;
}

/* Accepts one connection within timeout_ms; -1 on timeout. */
static inline int hs_accept(int lfd, int timeout_ms)
{
	if (hs_wait_fd(lfd, POLLIN, timeout_ms) <= 0)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* Reads one line (up to '\n') byte by byte within timeout_ms. Returns its length or -1. */
static inline int hs_read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
	uint64_t end = test_now_ms() + (uint64_t)timeout_ms;
	size_t n = 0;

	while (n + 1 < cap) {
		uint64_t now = test_now_ms();
		ssize_t r;

		if (now >= end || hs_wait_fd(fd, POLLIN, (int)(end - now)) <= 0)
			return -1;
		r = read(fd, buf + n, 1);
		if (r <= 0)
			return -1;
		if (buf[n++] == '\n')
			break;
	}
	buf[n] = 0;
	return (int)n;
}

/*
 * Host → guest connection: connects to <uds> (STREAM) or <uds>_seqpacket (SEQPACKET), sends
 * CONNECT <port>, waits for "OK ". Returns the connected fd, or -1 if refused/closed/timed out.
 */
static inline int hs_connect_guest(const char *uds, uint32_t port, int type, int timeout_ms)
{
	char path[160], line[64];
	struct sockaddr_un a;
	int fd, n;

	snprintf(path, sizeof(path), type == SOCK_SEQPACKET ? "%s_seqpacket" : "%s", uds);
	a = hs_addr(path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	ASSERT_GE(fd, 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(fd);
		return -1;
	}
	n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	ASSERT_EQ(write(fd, line, (size_t)n), n);
	if (type == SOCK_SEQPACKET) {
		ssize_t r;

		if (hs_wait_fd(fd, POLLIN, timeout_ms) <= 0)
			goto fail;
		r = read(fd, line, sizeof(line) - 1);
		if (r <= 0)
			goto fail;
		line[r] = 0;
	} else if (hs_read_line(fd, line, sizeof(line), timeout_ms) < 0) {
		goto fail;
	}
	if (strncmp(line, "OK ", 3) != 0)
		goto fail;
	return fd;
fail:
	close(fd);
	return -1;
}

/* Writes all of buf (blocking fd). */
static inline void hs_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t r = write(fd, p, len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			test_fail(__FILE__, __LINE__, "write: %s", strerror(errno));
		p += r;
		len -= (size_t)r;
	}
}

/* Reads exactly len bytes within timeout_ms; returns bytes read (< len on EOF/timeout). */
static inline size_t hs_read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	uint64_t end = test_now_ms() + (uint64_t)timeout_ms;
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		uint64_t now = test_now_ms();
		ssize_t r;

		if (now >= end || hs_wait_fd(fd, POLLIN, (int)(end - now)) <= 0)
			break;
		r = read(fd, p + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return got;
}

/* Waits until fd reports EOF (read returns 0) within timeout_ms, discarding data. */
static inline bool hs_wait_eof(int fd, int timeout_ms)
{
	uint64_t end = test_now_ms() + (uint64_t)timeout_ms;
	char buf[4096];

	for (;;) {
		uint64_t now = test_now_ms();
		ssize_t r;

		if (now >= end || hs_wait_fd(fd, POLLIN, (int)(end - now)) <= 0)
			return false;
		r = read(fd, buf, sizeof(buf));
		if (r == 0)
			return true;
		if (r < 0 && errno != EINTR && errno != EAGAIN)
			return errno == ECONNRESET;
	}
}

/* Deterministic pseudo-random bytes: position-dependent, so any offset can be checked. */
static inline uint64_t hs_word(uint64_t seed, uint64_t w);
static inline uint8_t hs_pattern(uint64_t seed, uint64_t off)
{
	return (uint8_t)(hs_word(seed, off >> 3) >> ((off & 7) * 8));
}

/* One 64-bit word of the pattern: bytes 8w..8w+7, little-endian. */
static inline uint64_t hs_word(uint64_t seed, uint64_t w)
{
	uint64_t x = w * 0x9e3779b97f4a7c15ull ^ seed;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 32;
	return x;
}

static inline void hs_fill(uint8_t *buf, size_t len, uint64_t seed, uint64_t off)
{
	size_t i = 0;

	for (; i < len && ((off + i) & 7); i++)
		buf[i] = hs_pattern(seed, off + i);
	for (; i + 8 <= len; i += 8) {
		uint64_t w = htole64(hs_word(seed, (off + i) >> 3));

		memcpy(buf + i, &w, 8);
	}
	for (; i < len; i++)
		buf[i] = hs_pattern(seed, off + i);
}

/* Returns the first offset (relative to buf) that differs from the pattern, or len. */
static inline size_t hs_check(const uint8_t *buf, size_t len, uint64_t seed, uint64_t off)
{
	size_t i = 0;

	for (; i < len && ((off + i) & 7); i++)
		if (buf[i] != hs_pattern(seed, off + i))
			return i;
	for (; i + 8 <= len; i += 8) {
		uint64_t w = htole64(hs_word(seed, (off + i) >> 3));

		if (memcmp(buf + i, &w, 8) != 0)
			break;
	}
	for (; i < len; i++)
		if (buf[i] != hs_pattern(seed, off + i))
			return i;
	return len;
}

#endif
