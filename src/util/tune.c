/* SPDX-License-Identifier: MIT */
/*
 * Data-path optimization switches (see tune.h): one process-wide struct, defaults on, parsed from
 * a comma-separated list.
 */
#include "util/tune.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tune g_tune = {
#define TUNE_ON(f, n, d) .f = true,
	TUNE_SWITCHES(TUNE_ON)
#undef TUNE_ON
};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int parse_item(struct tune *t, const char *item, size_t len)
{
	bool on = true;
	char name[32];
	const char *eq = memchr(item, '=', len);

	if (len >= sizeof(name))
		return -EINVAL;
	if (eq) {
		char num[16];
		char *end;
		unsigned long v;
		size_t nl = (size_t)(eq - item), vl = len - nl - 1;

		if (nl != strlen("busy-poll-us") || memcmp(item, "busy-poll-us", nl) != 0 ||
		    vl == 0 || vl >= sizeof(num))
			return -EINVAL;
		memcpy(num, eq + 1, vl);
		num[vl] = '\0';
		errno = 0;
		v = strtoul(num, &end, 10);
		if (errno || *end || v > 1000000)
			return -EINVAL;
		t->busy_poll_us = (unsigned)v;
		return 0;
	}
	memcpy(name, item, len);
	name[len] = '\0';
	if (strncmp(name, "no-", 3) == 0) {
		on = false;
		memmove(name, name + 3, len - 2);
	}
	if (strcmp(name, "dirty-log") == 0) {
		t->dirty_log = on;
		return 0;
	}
#define TUNE_MATCH(f, n, d)                                                                        \
	if (strcmp(name, n) == 0) {                                                                \
		t->f = on;                                                                         \
		return 0;                                                                          \
	}
	TUNE_SWITCHES(TUNE_MATCH)
#undef TUNE_MATCH
	return -EINVAL;
}

static int parse_list(struct tune *t, const char *list, char *err, size_t errlen)
{
	const char *p = list;

	while (*p) {
		size_t len = strcspn(p, ",");

		if (len && parse_item(t, p, len) < 0) {
			if (err)
				snprintf(err, errlen, "unknown or bad switch '%.*s' (see tune.h: "
					 "NAME, no-NAME, busy-poll-us=N, dirty-log)", (int)len, p);
			return -EINVAL;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

static void init_from_env(void)
{
	const char *env = getenv("UVSOCK_TUNE");
	struct tune t = g_tune;
	char err[160];

	if (!env)
		return;
	if (parse_list(&t, env, err, sizeof(err)) < 0) {
		fprintf(stderr, "UVSOCK_TUNE ignored: %s\n", err);
		return;
	}
	g_tune = t;
}

const struct tune *tune_get(void)
{
	pthread_once(&g_once, init_from_env);
	return &g_tune;
}

int tune_set(const char *list, char *err, size_t errlen)
{
	struct tune t = *tune_get();
	int r = parse_list(&t, list, err, errlen);

	if (r == 0)
		g_tune = t;
	return r;
}

void tune_describe(char *buf, size_t len)
{
	const struct tune *t = tune_get();
	size_t off = 0;

	buf[0] = '\0';
#define TUNE_DESC(f, n, d)                                                                         \
	if (off < len)                                                                             \
		off += (size_t)snprintf(buf + off, len - off, "%s=%s,", n, t->f ? "on" : "off");
	TUNE_SWITCHES(TUNE_DESC)
#undef TUNE_DESC
	if (off < len)
		off += (size_t)snprintf(buf + off, len - off, "busy-poll-us=%u", t->busy_poll_us);
	if (t->dirty_log && off < len)
		snprintf(buf + off, len - off, ",dirty-log=on");
}
