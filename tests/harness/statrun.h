/* SPDX-License-Identifier: MIT */
/*
 * Runs uvsock-stat in-process: uvsock_stat_main with its output and error streams captured in
 * memory. Used by tests/unit/tools/test-statcli.c (against a fake daemon) and
 * tests/integration/test-ops-live.c (against a live uvsockd).
 */
#ifndef UVSOCK_TEST_STATRUN_H
#define UVSOCK_TEST_STATRUN_H

#include <stdio.h>
#include <stdlib.h>

#include "statcli.h"
#include "test.h"

/* Exit code and the captured streams (NUL-terminated; free both, or run_free). */
struct run {
	int rc;
	char *out, *err;
};

/* Runs "uvsock-stat args..." (args NULL-terminated) reporting `version` for --version. */
static inline struct run stat_run_version(const char *version, const char *const *args)
{
	char *argv[32];
	int argc = 0;
	size_t ol, el;
	struct run r;
	FILE *out, *err;

	argv[argc++] = "uvsock-stat";
	for (; *args; args++) {
		if (argc == (int)(sizeof(argv) / sizeof(argv[0])) - 1)
			test_fail(__FILE__, __LINE__, "too many uvsock-stat arguments");
		argv[argc++] = (char *)*args;
	}
	argv[argc] = NULL;
	out = open_memstream(&r.out, &ol);
	err = open_memstream(&r.err, &el);
	r.rc = uvsock_stat_main(argc, argv, version, out, err);
	fclose(out);
	fclose(err);
	return r;
}

static inline void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
}

#endif
