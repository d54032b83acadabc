/* SPDX-License-Identifier: MIT */
/*
 * The manual pages of the programs say what their --help says: for uvsock-perf, uvsock-conform
 * and uvsock-demo, every long option printed by `PROGRAM --help` appears in man/PROGRAM.1 and the
 * reverse
 * (--help itself excepted: every program takes it, not every usage text lists it). uvsockd has
 * the same both-ways check in tests/unit/daemon/test-options.c; uvsock-stat's, in
 * tests/unit/tools/test-statcli.c, is one-way (man_check_help_documented), because its page also
 * names other programs' options. The programs run as child processes from the build tree
 * (paths compiled in from their meson targets); the comparison is tests/harness/manpage.h.
 *
 * Every page of man/ is installed (named in an install_man() of a meson.build) and has the
 * sections an operator looks for: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, SIGNALS,
 * FILES, ENVIRONMENT, EXIT STATUS and SEE ALSO.
 *
 * And what the README and docs/uvsockd.md promise operators: README's "Installing" names every
 * installed program; uvsockd(1)'s FILES names the package's paths (debian/uvsockd.install); the
 * README points restarts to the upgrade design; docs/uvsockd.md lists the host-side address
 * forms and who uses them.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

TEST(uvsock_conform_help_matches_its_man_page)
{
	check(UVSOCK_CONFORM_PATH, MAN_DIR "/uvsock-conform.1");
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

/* ---- what the README and docs/uvsockd.md promise operators (issue "operator-2") ---------- */

/* The text of the Markdown section of file that starts with heading, up to the next heading of
 * the same or a higher level (malloc'd); fails the case if there is none. */
static char *md_section(const char *file, const char *heading)
{
	char path[512], *text, *start, *end;
	size_t level = strspn(heading, "#");

	snprintf(path, sizeof(path), "%s/%s", SRC_DIR, file);
	text = slurp_path(path);
	ASSERT_TRUE(text != NULL);
	start = strstr(text, heading);
	if (!start || (start != text && start[-1] != '\n'))
		test_fail(__FILE__, __LINE__, "%s has no heading '%s'", file, heading);
	for (end = strchr(start, '\n'); end; end = strchr(end + 1, '\n'))
		if (end[1] == '#' && strspn(end + 1, "#") <= level && end[1 + level] == ' ')
			break;
	if (end)
		*end = '\0';
	memmove(text, start, strlen(start) + 1);
	return text;
}

/*
 * The names of the programs a meson.build installs (executable('NAME', ... install: true)),
 * appended to names (comma-terminated, "uvsockd,uvsock-stat,").
 */
static void installed_programs(const char *build, char *names, size_t cap)
{
	char path[512], *text, *p;

	snprintf(path, sizeof(path), "%s/%s", SRC_DIR, build);
	text = slurp_path(path);
	ASSERT_TRUE(text != NULL);
	for (p = text; (p = strstr(p, "executable('")) != NULL;) {
		char *name = p + strlen("executable('"), *q = strchr(name, '\''), *c;
		int depth = 1;
		bool quoted = false;

		ASSERT_TRUE(q != NULL);
		/* The end of the call: parentheses outside quoted strings. */
		for (c = strchr(p, '(') + 1; *c && depth; c++) {
			if (*c == '\'')
				quoted = !quoted;
			else if (!quoted && *c == '(')
				depth++;
			else if (!quoted && *c == ')')
				depth--;
		}
		*q = '\0';
		if (c > q) {
			char save = *c;

			*c = '\0';
			if (strstr(q + 1, "install: true"))
				snprintf(names + strlen(names), cap - strlen(names), "%s,", name);
			*c = save;
		}
		p = c;
	}
	free(text);
}

/*
 * README's "Installing" names every program the package installs (every executable the
 * meson.build files install), each with its man page, and the preload library.
 */
TEST(readme_install_list_names_every_installed_program)
{
	char names[1024] = "", missing[1024] = "", *section = md_section("README.md", "## Installing");
	unsigned n = 0;

	installed_programs("daemon/meson.build", names, sizeof(names));
	installed_programs("tools/meson.build", names, sizeof(names));
	test_note("installed programs: %s", names);
	for (char *name = names, *comma; (comma = strchr(name, ',')) != NULL; name = comma + 1) {
		char want[128], page[512];

		*comma = '\0';
		n++;
		snprintf(want, sizeof(want), "`%s`", name);
		if (!strstr(section, want))
			snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
				 " %s (README)", name);
		snprintf(page, sizeof(page), "%s/%s.1", MAN_DIR, name);
		if (access(page, F_OK) != 0)
			snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
				 " %s (man page)", name);
	}
	if (!strstr(section, "`libuvsock-preload.so`"))
		snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
			 " libuvsock-preload.so (README)");
	free(section);
	ASSERT_GE(n, 7); /* uvsockd and the six tools */
	if (missing[0])
		test_fail(__FILE__, __LINE__, "not named:%s", missing);
}

/*
 * uvsockd(1)'s FILES names where the package puts the units and the example config
 * (debian/uvsockd.install): /usr/lib/systemd/system, never the old /lib/systemd/system.
 */
TEST(uvsockd_page_files_name_the_packaged_paths)
{
	char path[512], *install, *page, *files, *line, *end;
	unsigned n = 0;

	snprintf(path, sizeof(path), "%s/debian/uvsockd.install", SRC_DIR);
	install = slurp_path(path);
	page = slurp_path(MAN_DIR "/uvsockd.1");
	ASSERT_TRUE(install != NULL && page != NULL);
	files = strstr(page, ".SH FILES\n");
	ASSERT_TRUE(files != NULL);
	end = strstr(files + 1, "\n.SH ");
	if (end)
		*end = '\0';
	for (line = install; *line; line = end ? end + 1 : line + strlen(line)) {
		char want[512];

		end = strchr(line, '\n');
		if (end)
			*end = '\0';
		if (strncmp(line, "usr/lib/systemd/system/", 23) != 0 && strncmp(line, "etc/", 4) != 0)
			continue;
		n++;
		snprintf(want, sizeof(want), "/%s", line);
		if (!strstr(files, want))
			test_fail(__FILE__, __LINE__, "uvsockd.1 FILES does not name %s", want);
		if (!end)
			break;
	}
	ASSERT_GE(n, 3); /* uvsockd.service, uvsockd@.service, /etc/uvsockd/example.yaml */
	for (char *p = files; (p = strstr(p, "lib/systemd/system")) != NULL; p++)
		if (p - files < 5 || strncmp(p - 5, "/usr/", 5) != 0)
			test_fail(__FILE__, __LINE__, "uvsockd.1 FILES names lib/systemd/system "
				  "without /usr");
	free(install);
	free(page);
}

/* README: restarting uvsockd cuts the VMs' vsock, and the way out is the upgrade design. */
TEST(readme_restart_points_to_the_upgrade_design)
{
	char *section = md_section("README.md", "## Installing"), *p, *end;

	p = strstr(section, "Restarting uvsockd");
	ASSERT_TRUE(p != NULL);
	end = strstr(p, "\n\n"); /* the paragraph */
	if (end)
		*end = '\0';
	ASSERT_TRUE(strstr(p, "docs/upgrade.md") != NULL);
	free(section);
}

/*
 * docs/uvsockd.md lists the host-side address forms other VMMs and tools use, whether uvsockd
 * serves each, and who uses it: Kata's hvsock://, systemd's vsock-mux/, the hybrid CONNECT.
 */
TEST(uvsockd_doc_lists_the_host_side_address_forms)
{
	static const char *const want[] = { "| `hvsock://PATH:PORT` |", "Kata",
					    "| `vsock-mux/PATH`",	"systemd-ssh-proxy",
					    "| `CONNECT <port>\\n`",	"Firecracker",
					    "Cloud Hypervisor",		"vhost-device-vsock" };
	char *section = md_section("docs/uvsockd.md", "### Host-side address forms");

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!strstr(section, want[i]))
			test_fail(__FILE__, __LINE__, "docs/uvsockd.md's address forms lack '%s'",
				  want[i]);
	free(section);
}

TEST_MAIN()
