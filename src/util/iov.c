/* SPDX-License-Identifier: MIT */
#include "util/iov.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "util/macros.h"

size_t iov_total(const struct iovec *iov, size_t n)
{
	size_t total = 0;

	for (size_t i = 0; i < n; i++)
		total += iov[i].iov_len;
	return total;
}

ssize_t iov_check(const struct iovec *iov, size_t n)
{
	size_t total = 0;

	if (n > IOV_MAX)
		return -EMSGSIZE;
	if (n && !iov)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (iov[i].iov_len && !iov[i].iov_base)
			return -EINVAL;
		if (iov[i].iov_len > (size_t)SSIZE_MAX - total)
			return -EINVAL;
		total += iov[i].iov_len;
	}
	return (ssize_t)total;
}

/* Moves up to len bytes between bytes [off, off + len) of the entries and buf (to_iov: into them). */
static size_t range_copy(const struct iovec *iov, size_t n, size_t off, uint8_t *buf, size_t len,
			 int to_iov)
{
	size_t done = 0;

	for (size_t i = 0; i < n && done < len; i++) {
		size_t l = iov[i].iov_len;
		uint8_t *p = iov[i].iov_base;

		if (off >= l) {
			off -= l;
			continue;
		}
		l = MIN(l - off, len - done);
		memcpy(to_iov ? p + off : buf + done, to_iov ? buf + done : p + off, l);
		done += l;
		off = 0;
	}
	return done;
}

size_t iov_write_at(const struct iovec *iov, size_t n, size_t off, const void *src, size_t len)
{
	return range_copy(iov, n, off, (uint8_t *)src, len, 1);
}

size_t iov_read_at(const struct iovec *iov, size_t n, size_t off, void *dst, size_t len)
{
	return range_copy(iov, n, off, dst, len, 0);
}

int iov_slice(const struct iovec *src, size_t n, size_t off, size_t len, struct iovec *dst,
	      size_t max)
{
	size_t k = 0;

	for (size_t i = 0; i < n && len; i++) {
		size_t l = src[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		if (k == max)
			return -1;
		l = MIN(l - off, len);
		dst[k].iov_base = (uint8_t *)src[i].iov_base + off;
		dst[k].iov_len = l;
		k++;
		len -= l;
		off = 0;
	}
	return len ? -1 : (int)k;
}

/* Moves up to len bytes between the cursor and buf (to_iov: into the iovecs). */
static size_t cur_copy(struct iov_cur *c, uint8_t *buf, size_t len, int to_iov)
{
	size_t done = 0;

	while (done < len && c->idx < c->cnt) {
		size_t n = MIN(c->iov[c->idx].iov_len - c->off, len - done);
		uint8_t *p = (uint8_t *)c->iov[c->idx].iov_base + c->off;

		if (n && buf)
			memcpy(to_iov ? p : buf + done, to_iov ? buf + done : p, n);
		done += n;
		c->off += n;
		if (c->off == c->iov[c->idx].iov_len) {
			c->idx++;
			c->off = 0;
		}
	}
	return done;
}

size_t iov_cur_read(struct iov_cur *c, void *dst, size_t len)
{
	return cur_copy(c, dst, len, 0);
}

size_t iov_cur_write(struct iov_cur *c, const void *src, size_t len)
{
	return cur_copy(c, (uint8_t *)src, len, 1);
}

size_t iov_cur_skip(struct iov_cur *c, size_t len)
{
	return cur_copy(c, NULL, len, 0);
}
