/* SPDX-License-Identifier: MIT */
/*
 * The manual pages of the programs say what their --help says: for uvsock-perf and uvsock-demo,
 * every long option printed by `PROGRAM --help` appears in man/PROGRAM.1 and the reverse
 * (--help itself excepted: every program takes it, not every usage text lists it). uvsockd and
 * uvsock-stat have the same check in tests/unit/device/test-options.c and
 * tests/unit/ops/test-statcli.c. The programs run as child processes from the build tree
 * (paths compiled in).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAX_OPTS 64

/* Reads a whole stream (at most 64 KiB) into a static-sized heap buffer. */
static char *slurp(FILE *f)
{
	char *buf = calloc(1, 1 << 16);
	size_t n;

	ASSERT_TRUE(buf != NULL);
	n = fread(buf, 1, (1 << 16) - 1, f);
	buf[n] = '\0';
	return buf;
}

/* Undoes the groff escapes the pages use: "\-" is '-', font changes "\fX" are dropped. */
static void ungroff(char *s)
{
	char *q = s;

	for (char *p = s; *p; p++) {
		if (p[0] == '\\' && p[1] == '-') {
			*q++ = '-';
			p++;
		} else if (p[0] == '\\' && p[1] == 'f' && p[2]) {
			p += 2;
		} else {
			*q++ = *p;
		}
	}
	*q = '\0';
}

/* Collects the distinct "--long-option" tokens of text (preceded by space, newline, [ | ( ). */
static unsigned collect(const char *text, char opts[][32])
{
	unsigned n = 0;

	for (const char *p = strstr(text, "--"); p; p = strstr(p + 2, "--")) {
		size_t len = 2;
		bool dup = false;

		while ((p[len] >= 'a' && p[len] <= 'z') || p[len] == '-')
			len++;
		if (len <= 2 || len >= 32 ||
		    (p > text && !strchr(" \n[|(", p[-1])) || (len == 6 && !memcmp(p, "--help", 6)))
			continue;
		for (unsigned i = 0; i < n; i++)
			dup |= strlen(opts[i]) == len && memcmp(opts[i], p, len) == 0;
		if (!dup && n < MAX_OPTS) {
			memcpy(opts[n], p, len);
			opts[n][len] = '\0';
			n++;
		}
	}
	return n;
}

static bool has(char opts[][32], unsigned n, const char *o)
{
	for (unsigned i = 0; i < n; i++)
		if (strcmp(opts[i], o) == 0)
			return true;
	return false;
}

static void check(const char *prog, const char *man_path)
{
	static char hopts[MAX_OPTS][32], mopts[MAX_OPTS][32];
	char cmd[1024], *help, *man;
	unsigned nh, nm;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", prog);
	f = popen(cmd, "r");
	ASSERT_TRUE(f != NULL);
	help = slurp(f);
	ASSERT_EQ(pclose(f), 0);
	f = fopen(man_path, "r");
	if (!f)
		test_fail(__FILE__, __LINE__, "no manual page %s", man_path);
	man = slurp(f);
	fclose(f);
	ungroff(man);
	nh = collect(help, hopts);
	nm = collect(man, mopts);
	ASSERT_GE(nh, 3);
	for (unsigned i = 0; i < nh; i++)
		if (!has(mopts, nm, hopts[i]))
			test_fail(__FILE__, __LINE__, "%s is in %s --help but not in %s", hopts[i],
				  prog, man_path);
	for (unsigned i = 0; i < nm; i++)
		if (!has(hopts, nh, mopts[i]))
			test_fail(__FILE__, __LINE__, "%s is in %s but not in %s --help", mopts[i],
				  man_path, prog);
	free(help);
	free(man);
}

TEST(uvsock_perf_help_matches_its_man_page)
{
	check(TOOLS_DIR "/uvsock-perf", MAN_DIR "/uvsock-perf.1");
}

TEST(uvsock_demo_help_matches_its_man_page)
{
	check(TOOLS_DIR "/uvsock-demo", MAN_DIR "/uvsock-demo.1");
}

TEST_MAIN()
