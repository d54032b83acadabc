/* SPDX-License-Identifier: MIT */
/*
 * iovec helpers shared by the engine, the device role and the socket API: length, copies at an
 * offset, slices, and a sequential cursor. None of them allocates; none validates pointers
 * (iov_check does, for iovecs that come from an API caller).
 */
#ifndef UVSOCK_UTIL_IOV_H
#define UVSOCK_UTIL_IOV_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Sum of the lengths of n entries. */
size_t iov_total(const struct iovec *iov, size_t n);

/*
 * Validates an iovec array handed in by an API caller and returns its total length: -EMSGSIZE
 * for more than IOV_MAX entries, -EINVAL for a NULL array with n > 0, a NULL base with a
 * non-zero length, or a total above SSIZE_MAX.
 */
ssize_t iov_check(const struct iovec *iov, size_t n);

/* Copies up to len bytes from src into the entries, starting at byte offset off; returns bytes copied. */
size_t iov_write_at(const struct iovec *iov, size_t n, size_t off, const void *src, size_t len);

/* Copies up to len bytes out of the entries, starting at byte offset off; returns bytes copied. */
size_t iov_read_at(const struct iovec *iov, size_t n, size_t off, void *dst, size_t len);

/*
 * Makes dst describe bytes [off, off + len) of src, in at most max entries. Returns the count,
 * or -1 if more than max entries would be needed or src is shorter than off + len.
 */
int iov_slice(const struct iovec *src, size_t n, size_t off, size_t len, struct iovec *dst,
	      size_t max);

/* Sequential reader/writer over an iovec array. */
struct iov_cur {
	const struct iovec *iov;
	size_t cnt, idx;
	size_t off;
};

static inline void iov_cur_init(struct iov_cur *c, const struct iovec *iov, size_t cnt)
{
	c->iov = iov;
	c->cnt = cnt;
	c->idx = 0;
	c->off = 0;
}

/* Copies up to len bytes from the cursor into dst and advances; returns bytes copied. */
size_t iov_cur_read(struct iov_cur *c, void *dst, size_t len);
/* Copies up to len bytes from src to the cursor and advances; returns bytes copied. */
size_t iov_cur_write(struct iov_cur *c, const void *src, size_t len);
/* Advances the cursor by up to len bytes; returns bytes skipped. */
size_t iov_cur_skip(struct iov_cur *c, size_t len);

#endif
