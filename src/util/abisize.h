/* SPDX-License-Identifier: MIT */
/*
 * Size-prefixed structs of the public API (include/uvsock/, docs/api.md "Structs that grow"):
 * each option, config and stats struct starts with `uint32_t size`, which the caller sets to the
 * sizeof() it was compiled with. A struct only ever grows at its end, and a new field's zero
 * keeps the old behaviour, so the library can serve callers built against an older or a newer
 * header. These helpers do the copies between the caller's struct and the library's own.
 * Pure functions; any thread.
 */
#ifndef UVSOCK_UTIL_ABISIZE_H
#define UVSOCK_UTIL_ABISIZE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The size of the first version of TYPE: up to the end of its last field then, MEMBER. */
#define ABI_SIZE_0(type, member) (offsetof(type, member) + sizeof(((type *)0)->member))

/*
 * An input struct: copies the caller's *src (its size from its first field) into dst (the
 * library's layout, dst_size bytes), zeroing what an older caller does not have.
 * Returns 0, or -EINVAL: size under min_size (unset, or not this struct), or larger than
 * dst_size with a non-zero byte past it (a field this library does not know was set).
 */
static inline int abi_struct_in(void *dst, size_t dst_size, const void *src, size_t min_size)
{
	const unsigned char *s = src;
	uint32_t usize;

	memcpy(&usize, src, sizeof(usize));
	if (usize < min_size)
		return -EINVAL;
	for (size_t i = dst_size; i < usize; i++)
		if (s[i])
			return -EINVAL;
	memset(dst, 0, dst_size);
	memcpy(dst, src, usize < dst_size ? usize : dst_size);
	return 0;
}

/*
 * An output struct: copies the library's *src (src_size bytes) into the caller's *dst, as far
 * as the caller's size (dst's first field) reaches; zeroes the caller's bytes beyond what the
 * library has, and sets dst's size to the bytes filled.
 * Returns 0, or -EINVAL (the caller's size under min_size).
 */
static inline int abi_struct_out(void *dst, const void *src, size_t src_size, size_t min_size)
{
	unsigned char *d = dst;
	uint32_t usize, filled;

	memcpy(&usize, dst, sizeof(usize));
	if (usize < min_size)
		return -EINVAL;
	filled = usize < src_size ? usize : (uint32_t)src_size;
	memcpy(d, src, filled);
	memset(d + filled, 0, usize - filled);
	memcpy(d, &filled, sizeof(filled));
	return 0;
}

#endif
