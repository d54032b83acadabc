/* SPDX-License-Identifier: MIT */
/*
 * The one parser of byte counts on the command lines (uvsockd, uvsock-stat, uvsock-demo,
 * uvsock-perf): a decimal number with an optional binary suffix,
 * K, M, G or T in either case (KiB, MiB, GiB, TiB: "64K" is 65536). A bare number is bytes.
 */
#ifndef UVSOCK_UTIL_SIZE_H
#define UVSOCK_UTIL_SIZE_H

#include <stdint.h>

/*
 * Parses s into *ret, which must lie in [min, max]. Returns 0, -EINVAL (not a size: empty,
 * a sign, other characters, a suffix not in KMGT), or -ERANGE (overflow, or outside
 * [min, max]). *ret is untouched on error. Pure; any thread.
 */
int size_parse(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

#endif
