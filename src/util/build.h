/* SPDX-License-Identifier: MIT */
/*
 * What kind of build this translation unit is, from the compiler's own macros: a sanitizer build
 * (GCC's __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang's __has_feature) or an unoptimized
 * one (no __OPTIMIZE__). uvsockd prints it in --version and uvsock-perf beside its figures, since
 * a sanitizer or -O0 build moves several times fewer bytes and the numbers would be misread.
 */
#ifndef UVSOCK_UTIL_BUILD_H
#define UVSOCK_UTIL_BUILD_H

#if defined(__SANITIZE_ADDRESS__)
#define UVSOCK_BUILD_SAN "asan"
#elif defined(__SANITIZE_THREAD__)
#define UVSOCK_BUILD_SAN "tsan"
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UVSOCK_BUILD_SAN "asan"
#elif __has_feature(thread_sanitizer)
#define UVSOCK_BUILD_SAN "tsan"
#elif __has_feature(memory_sanitizer)
#define UVSOCK_BUILD_SAN "msan"
#endif
#endif

/* "optimized", "debug" (not optimized), "asan", "asan+debug", "tsan"... */
static inline const char *uvsock_build_flavour(void)
{
#if defined(UVSOCK_BUILD_SAN) && defined(__OPTIMIZE__)
	return UVSOCK_BUILD_SAN;
#elif defined(UVSOCK_BUILD_SAN)
	return UVSOCK_BUILD_SAN "+debug";
#elif defined(__OPTIMIZE__)
	return "optimized";
#else
	return "debug";
#endif
}

#endif
