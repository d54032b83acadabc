/* SPDX-License-Identifier: MIT */
/*
 * Manual page checks shared by the tests of the programs: a page (man/PROGRAM.1) and the
 * program's --help text list the same long options, or the page documents every option of
 * --help. The page is read as text with its groff escapes undone; an option is a "--name" token
 * that starts a word (after a space, a newline, '[', '|' or '('). Failures assert through the
 * harness.
 */
#ifndef UVSOCK_TESTS_MANPAGE_H
#define UVSOCK_TESTS_MANPAGE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAN_MAX_OPTS 64
#define MAN_MAX_TEXT (1 << 16)

/* Reads a whole stream (at most 64 KiB) into a NUL-terminated heap buffer (caller frees). */
static inline char *man_slurp(FILE *f)
{
	char *buf = calloc(1, MAN_MAX_TEXT);
	size_t n;

	ASSERT_TRUE(buf != NULL);
	n = fread(buf, 1, MAN_MAX_TEXT - 1, f);
	buf[n] = '\0';
	return buf;
}

/* Undoes the groff escapes the pages use, in place: "\-" is '-', font changes "\fX" go. */
static inline void man_ungroff(char *s)
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

/* Collects the distinct "--long-option" tokens of text into opts; skip_help leaves out --help. */
static inline unsigned man_collect_opts(const char *text, char opts[][32], bool skip_help)
{
	unsigned n = 0;

	for (const char *p = strstr(text, "--"); p; p = strstr(p + 2, "--")) {
		size_t len = 2;
		bool dup = false;

		while ((p[len] >= 'a' && p[len] <= 'z') || p[len] == '-')
			len++;
		if (len <= 2 || len >= 32 || (p > text && !strchr(" \n[|(", p[-1])) ||
		    (skip_help && len == 6 && !memcmp(p, "--help", 6)))
			continue;
		for (unsigned i = 0; i < n; i++)
			dup |= strlen(opts[i]) == len && memcmp(opts[i], p, len) == 0;
		if (!dup && n < MAN_MAX_OPTS) {
			memcpy(opts[n], p, len);
			opts[n][len] = '\0';
			n++;
		}
	}
	return n;
}

static inline bool man_has_opt(char opts[][32], unsigned n, const char *o)
{
	for (unsigned i = 0; i < n; i++)
		if (strcmp(opts[i], o) == 0)
			return true;
	return false;
}

/*
 * Asserts that every long option of help (the --help text of prog, at least min_opts options) is
 * on the page at man_path and, if both_ways, that every option the page names is in help;
 * skip_help: --help itself is not compared (not every usage text lists it).
 */
static inline void man_compare_options_(const char *help, const char *prog, const char *man_path,
					bool skip_help, unsigned min_opts, bool both_ways)
{
	static char hopts[MAN_MAX_OPTS][32], mopts[MAN_MAX_OPTS][32];
	unsigned nh, nm;
	char *man;
	FILE *f = fopen(man_path, "r");

	if (!f)
		test_fail(__FILE__, __LINE__, "no manual page %s", man_path);
	man = man_slurp(f);
	fclose(f);
	man_ungroff(man);
	nh = man_collect_opts(help, hopts, skip_help);
	nm = man_collect_opts(man, mopts, skip_help);
	ASSERT_GE(nh, min_opts);
	for (unsigned i = 0; i < nh; i++)
		if (!man_has_opt(mopts, nm, hopts[i]))
			test_fail(__FILE__, __LINE__, "%s is in %s --help but not in %s", hopts[i],
				  prog, man_path);
	for (unsigned i = 0; both_ways && i < nm; i++)
		if (!man_has_opt(hopts, nh, mopts[i]))
			test_fail(__FILE__, __LINE__, "%s is in %s but not in %s --help", mopts[i],
				  man_path, prog);
	free(man);
}

/* The page at man_path and help (prog's --help) list the same long options. */
static inline void man_check_options(const char *help, const char *prog, const char *man_path,
				     bool skip_help, unsigned min_opts)
{
	man_compare_options_(help, prog, man_path, skip_help, min_opts, true);
}

/*
 * The page at man_path documents every long option of help; it may name more (the options of
 * other programs it refers to, say).
 */
static inline void man_check_help_documented(const char *help, const char *prog,
					     const char *man_path, bool skip_help,
					     unsigned min_opts)
{
	man_compare_options_(help, prog, man_path, skip_help, min_opts, false);
}

#endif
