/* SPDX-License-Identifier: MIT */
/*
 * The worker processes of `uvsockd --isolate` as a test sees them (daemon/isolate.c): children
 * of the daemon named "uvsockd vm<CID>" after the first VM of their group, found through
 * /proc; and a look into the daemon's log. For tests/integration (test-isolate.c,
 * test-crash.c).
 */
#ifndef UVSOCK_TESTS_WORKERS_H
#define UVSOCK_TESTS_WORKERS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "uvsockd-proc.h"

#ifndef WAIT_MS
#define WAIT_MS 5000
#endif

/* Children of pid (scanning /proc/<n>/stat for the parent PID), at most max; returns the count. */
static inline int children_of(pid_t pid, pid_t *ret, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	ASSERT_TRUE(d != NULL);
	while ((de = readdir(d)) != NULL && n < max) {
		char path[300], buf[512], *p;
		int ppid = 0;
		FILE *f;

		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
		fclose(f);
		/* "pid (comm) S ppid ...": comm may hold spaces ("uvsockd vm3"). */
		if (p && sscanf(p + 1, " %*c %d", &ppid) == 1 && ppid == pid)
			ret[n++] = atoi(de->d_name);
	}
	closedir(d);
	return n;
}

/* /proc/<pid>/comm into buf ("" if gone). */
static inline void comm_of(pid_t pid, char *buf, size_t len)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	buf[0] = '\0';
	f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, (int)len, f))
		buf[strcspn(buf, "\n")] = '\0';
	fclose(f);
}

/* The child of u named "uvsockd vm<cid>", or 0. */
static inline pid_t worker_named(const struct uvd *u, uint32_t cid)
{
	pid_t kids[16];
	char want[32], name[32];
	int n = children_of(u->pid, kids, 16);

	snprintf(want, sizeof(want), "uvsockd vm%u", cid);
	for (int i = 0; i < n; i++) {
		comm_of(kids[i], name, sizeof(name));
		if (strcmp(name, want) == 0)
			return kids[i];
	}
	return 0;
}

/*
 * The worker of u whose name is "uvsockd vm<cid>"; fails the case if there is none. A worker
 * names itself right after its fork (daemon/isolate.c), so a child just forked (a restart) may
 * still bear the daemon's name for a moment: wait for the name.
 */
static inline pid_t worker_of(const struct uvd *u, uint32_t cid)
{
	pid_t w = 0;

	if (!WAIT_FOR((w = worker_named(u, cid)) != 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "no worker process 'uvsockd vm%u' among the children "
			  "of %d", cid, (int)u->pid);
	return w;
}

/* True once pid no longer runs: gone, or a zombie nobody reaped yet. */
static inline bool pid_gone(pid_t pid)
{
	char path[64], buf[256], *p;
	FILE *f;
	bool gone = true;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return true;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	if (p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X')
		gone = false;
	return gone;
}

/* True once the file at path holds needle (its first MiB). */
static inline bool file_has(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char *text;
	bool found;

	if (!f)
		return false;
	text = calloc(1, 1 << 20);
	ASSERT_TRUE(text != NULL);
	(void)!fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	found = strstr(text, needle) != NULL;
	free(text);
	return found;
}

#endif
