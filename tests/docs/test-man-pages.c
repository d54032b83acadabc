/* SPDX-License-Identifier: MIT */
/*
 * The manual pages of the programs say what their --help says: for uvsock-perf and uvsock-demo,
 * every long option printed by `PROGRAM --help` appears in man/PROGRAM.1 and the reverse
 * (--help itself excepted: every program takes it, not every usage text lists it). uvsockd has
 * the same both-ways check in tests/unit/daemon/test-options.c; uvsock-stat's, in
 * tests/unit/tools/test-statcli.c, is one-way (man_check_help_documented), because its page also
 * names other programs' options. The programs run as child processes from the build tree
 * (paths compiled in from their meson targets); the comparison is tests/harness/manpage.h.
 *
 * Every page of man/ is installed (named in an install_man() of a meson.build) and has the
 * sections an operator looks for: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, SIGNALS,
 * FILES, ENVIRONMENT, EXIT STATUS and SEE ALSO.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manpage.h"
#include "test.h"

static void check(const char *prog, const char *man_path)
{
	char cmd[1024], *help;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", prog);
	f = popen(cmd, "r");
	ASSERT_TRUE(f != NULL);
	help = man_slurp(f);
	ASSERT_EQ(pclose(f), 0);
	man_check_options(help, prog, man_path, true, 3);
	free(help);
}

TEST(uvsock_perf_help_matches_its_man_page)
{
	check(UVSOCK_PERF_PATH, MAN_DIR "/uvsock-perf.1");
}

TEST(uvsock_demo_help_matches_its_man_page)
{
	check(UVSOCK_DEMO_PATH, MAN_DIR "/uvsock-demo.1");
}

/* The whole file at path (NUL-terminated, caller frees), or NULL if it cannot be read. */
static char *slurp_path(const char *path)
{
	FILE *f = fopen(path, "r");
	char *s;

	if (!f)
		return NULL;
	s = man_slurp(f);
	fclose(f);
	return s;
}

/* Whether one of the meson.build files that install pages names man/<page> in install_man. */
static bool installed(const char *page)
{
	static const char *const builds[] = { "meson.build", "daemon/meson.build",
					      "tools/meson.build", "man/meson.build" };
	char path[512], *text, *p;

	for (size_t i = 0; i < sizeof(builds) / sizeof(builds[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", SRC_DIR, builds[i]);
		text = slurp_path(path);
		for (p = text; p && (p = strstr(p, "install_man(")) != NULL; p++) {
			char *end = strchr(p, ')'), *hit = strstr(p, page);

			if (end && hit && hit < end && (hit[-1] == '/' || hit[-1] == '\''))
				break;
		}
		free(text);
		if (p)
			return true;
	}
	return false;
}

TEST(every_page_is_installed_and_has_the_operator_sections)
{
	static const char *const sections[] = { "NAME",	   "SYNOPSIS",	  "DESCRIPTION",
						"OPTIONS", "SIGNALS",	  "FILES",
						"ENVIRONMENT", "EXIT STATUS", "SEE ALSO" };
	char missing[2048] = "", path[512];
	struct dirent *de;
	DIR *d = opendir(MAN_DIR);
	unsigned pages = 0;

	ASSERT_TRUE(d != NULL);
	while ((de = readdir(d)) != NULL) {
		size_t n = strlen(de->d_name), used = strlen(missing);
		char *text;

		if (n < 3 || strcmp(de->d_name + n - 2, ".1") != 0)
			continue;
		pages++;
		snprintf(path, sizeof(path), "%s/%s", MAN_DIR, de->d_name);
		text = slurp_path(path);
		ASSERT_TRUE(text != NULL);
		if (!installed(de->d_name))
			used += (size_t)snprintf(missing + used, sizeof(missing) - used,
						 "\n#   %s: not installed (no install_man)",
						 de->d_name);
		for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
			char want[64], *hit;

			snprintf(want, sizeof(want), ".SH %s\n", sections[i]);
			hit = strstr(text, want);
			if (!hit || (hit != text && hit[-1] != '\n'))
				used += (size_t)snprintf(missing + used, sizeof(missing) - used,
							 "\n#   %s: no section %s", de->d_name,
							 sections[i]);
			if (used >= sizeof(missing))
				used = sizeof(missing) - 1;
		}
		free(text);
	}
	closedir(d);
	ASSERT_GE(pages, 4); /* uvsockd, uvsock-perf, uvsock-stat, uvsock-demo */
	if (missing[0])
		test_fail(__FILE__, __LINE__, "manual pages lack:%s", missing);
}

TEST_MAIN()
