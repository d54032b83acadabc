/* SPDX-License-Identifier: MIT */
/*
 * The manual pages of the programs say what their --help says: for uvsock-perf and uvsock-demo,
 * every long option printed by `PROGRAM --help` appears in man/PROGRAM.1 and the reverse
 * (--help itself excepted: every program takes it, not every usage text lists it). uvsockd has
 * the same both-ways check in tests/unit/daemon/test-options.c; uvsock-stat's, in
 * tests/unit/ops/test-statcli.c, is one-way (man_check_help_documented), because its page also
 * names other programs' options. The programs run as child processes from the build tree
 * (paths compiled in); the comparison is tests/harness/manpage.h.
 */
#include <stdio.h>
#include <stdlib.h>

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
	check(TOOLS_DIR "/uvsock-perf", MAN_DIR "/uvsock-perf.1");
}

TEST(uvsock_demo_help_matches_its_man_page)
{
	check(TOOLS_DIR "/uvsock-demo", MAN_DIR "/uvsock-demo.1");
}

TEST_MAIN()
