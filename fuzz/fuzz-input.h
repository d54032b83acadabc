/* SPDX-License-Identifier: MIT */
/*
 * What the fuzz targets share: a cursor over the input that hands out little-endian integers
 * (zeros once the input is used up, so every input is a complete program), FZ_CHECK, the
 * invariant check that aborts (a crash libFuzzer records, a failed case in the replay run),
 * fz_count_fds() for the fd-leak checks and fz_dir_clean() for the targets' temporary directory.
 * Header-only; each target includes it once.
 */
#ifndef UVSOCK_FUZZ_INPUT_H
#define UVSOCK_FUZZ_INPUT_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The libFuzzer entry point every target defines (fuzz-main.c calls it in the replay runs). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(c)                                                                                \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #c);  \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* The unread rest of the input. */
struct fz_in {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fz_u8(struct fz_in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static inline uint16_t fz_u16(struct fz_in *in)
{
	uint16_t lo = fz_u8(in);

	return (uint16_t)(lo | fz_u8(in) << 8);
}

static inline uint32_t fz_u32(struct fz_in *in)
{
	uint32_t lo = fz_u16(in);

	return lo | (uint32_t)fz_u16(in) << 16;
}

static inline uint64_t fz_u64(struct fz_in *in)
{
	uint64_t lo = fz_u32(in);

	return lo | (uint64_t)fz_u32(in) << 32;
}

/* Up to n bytes of input (fewer at its end): returns where they start and sets *ret_n. */
static inline const uint8_t *fz_bytes(struct fz_in *in, size_t n, size_t *ret_n)
{
	const uint8_t *p = in->p;

	if (n > in->n)
		n = in->n;
	in->p += n;
	in->n -= n;
	*ret_n = n;
	return p;
}

/* Open file descriptors of the process (entries of /proc/self/fd, ours excluded). */
static inline int fz_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	FZ_CHECK(d != NULL);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

/* Removes every entry but "." and ".." of dir (files only; a target's sockets and captures). */
static inline void fz_dir_clean(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			(void)unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
}

#endif
