/* SPDX-License-Identifier: MIT */
/*
 * What the tests of a uvsockd that is replaced under a running VMM share (test-crash.c,
 * test-fdstore.c, test-upgrade.c): reading the daemon's log file, and what the project's own
 * guest (guestside.h) saw. Header-only, after test.h.
 */
#ifndef UVSOCK_TESTS_RESTARTS_H
#define UVSOCK_TESTS_RESTARTS_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guestside.h"
#include "test.h"

/* The text after the last line of the file at path holding key contains needle. */
static inline bool log_last_has(const char *path, const char *key, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[1024], last[1024] = "";

	ASSERT_TRUE(f != NULL);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, key))
			snprintf(last, sizeof(last), "%s", line);
	fclose(f);
	return strstr(last, needle) != NULL;
}

/* How many times needle is in the file at path (its first MiB). */
static inline int log_count(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char *text;
	int n = 0;

	ASSERT_TRUE(f != NULL);
	text = calloc(1, 1 << 20);
	ASSERT_TRUE(text != NULL);
	(void)!fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
		n++;
	free(text);
	return n;
}

static inline struct uvsock_guest_stats guest_stats(struct uvsock_ctx *g)
{
	struct uvsock_guest_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	return st;
}

/* The guest socket gfd ended: POLLHUP within WAIT_MS, then a read gives 0 or ECONNRESET. */
static inline void guest_conn_ended(int gfd)
{
	char b;
	ssize_t n;

	ASSERT_TRUE(g_wait_events(gfd, POLLHUP, WAIT_MS) & POLLHUP);
	n = uvsock_recv(gfd, &b, 1, MSG_DONTWAIT);
	ASSERT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET));
}

#endif
