/* SPDX-License-Identifier: MIT */
/*
 * Replay main for the fuzz targets: runs LLVMFuzzerTestOneInput() once over every regular file
 * of the corpus directories given as arguments (files in name order, so runs are reproducible)
 * and prints TAP, one case per file. Built into every fuzz-<target> replay binary and run by
 * `meson test --suite fuzz`; the libFuzzer builds (-Dfuzzing=true, clang) link libFuzzer's own
 * main instead. A crash or sanitizer report in a target fails the run.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_INPUT (4u << 20) /* corpus files are small; refuse anything absurd */

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads a whole file into a malloc'd buffer. Returns 0 or -errno. */
static int read_file(const char *path, uint8_t **ret, size_t *ret_len)
{
	struct stat st;
	uint8_t *buf;
	size_t n;
	FILE *f;

	f = fopen(path, "rb");
	if (!f)
		return -errno;
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > FUZZ_MAX_INPUT) {
		fclose(f);
		return -EINVAL;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		fclose(f);
		return -ENOMEM;
	}
	n = fread(buf, 1, (size_t)st.st_size, f);
	fclose(f);
	if (n != (size_t)st.st_size) {
		free(buf);
		return -EIO;
	}
	*ret = buf;
	*ret_len = n;
	return 0;
}

int main(int argc, char **argv)
{
	char **names = NULL;
	size_t count = 0, cap = 0;
	int failed = 0;

	for (int a = 1; a < argc; a++) {
		DIR *d = opendir(argv[a]);
		struct dirent *de;

		if (!d) {
			fprintf(stderr, "fuzz-main: %s: %s\n", argv[a], strerror(errno));
			return 1;
		}
		while ((de = readdir(d))) {
			char *p;

			if (de->d_name[0] == '.')
				continue;
			if (count == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				char **nn = realloc(names, ncap * sizeof(*names));

				if (!nn)
					return 1;
				names = nn;
				cap = ncap;
			}
			if (asprintf(&p, "%s/%s", argv[a], de->d_name) < 0)
				return 1;
			names[count++] = p;
		}
		closedir(d);
	}
	if (count == 0) {
		printf("1..0 # SKIP empty corpus\n");
		return 77;
	}
	qsort(names, count, sizeof(*names), name_cmp);
	printf("TAP version 13\n1..%zu\n", count);
	for (size_t i = 0; i < count; i++) {
		uint8_t *buf = NULL;
		size_t len = 0;
		int r = read_file(names[i], &buf, &len);

		if (r < 0) {
			printf("not ok %zu - %s # read: %s\n", i + 1, names[i], strerror(-r));
			failed = 1;
		} else {
			(void)LLVMFuzzerTestOneInput(buf, len);
			free(buf);
			printf("ok %zu - %s\n", i + 1, names[i]);
		}
		fflush(stdout);
		free(names[i]);
	}
	free(names);
	return failed;
}
