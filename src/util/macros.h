/* SPDX-License-Identifier: MIT */
/*
 * Small helpers every module uses: array size, container_of, min/max, branch hints.
 */
#ifndef UVSOCK_UTIL_MACROS_H
#define UVSOCK_UTIL_MACROS_H

#include <stddef.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define UVSOCK_EXPORT __attribute__((visibility("default")))

#endif
