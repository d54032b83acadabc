/* SPDX-License-Identifier: MIT */
/*
 * uvsock-conform: conformance tester for any vhost-user vsock back-end (man/uvsock-conform.1).
 * Runs each check of checks.c in a fresh guest session against the back-end at --socket, playing
 * the host on --uds-path, and prints TAP (or one JSON object with --json).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conform.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"usage: uvsock-conform --socket PATH --uds-path PATH [OPTIONS]\n"
		"Checks a vhost-user vsock back-end against the virtio-vsock protocol, without a VM.\n"
		"  --socket PATH      the back-end's vhost-user socket (one VM)\n"
		"  --uds-path PATH    that VM's hybrid host socket (CONNECT; <PATH>_<port> listeners)\n"
		"  --cid N            fail unless the back-end's guest CID is N\n"
		"  --json             one JSON object instead of TAP\n"
		"  --only LIST        run only these checks (comma-separated names)\n"
		"  --list             print the checks and exit\n"
		"  --timeout-ms N     bound of every wait (default 5000)\n"
		"  --quiet-ms N       how long nothing more may arrive beyond a credit (default 300)\n"
		"  --conns N          connections of many_connections (default 128, at most 1000)\n"
		"  --version          print the version and exit\n"
		"  --help             this text\n");
}

static bool selected(const char *only, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = only; p && *p;) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len == n && strncmp(p, name, n) == 0)
			return true;
		p = e ? e + 1 : NULL;
	}
	return only == NULL;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "uds-path", required_argument, NULL, 'u' },
		{ "cid", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "only", required_argument, NULL, 'o' },
		{ "list", no_argument, NULL, 'l' },
		{ "timeout-ms", required_argument, NULL, 't' },
		{ "quiet-ms", required_argument, NULL, 'q' },
		{ "conns", required_argument, NULL, 'n' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct opts o = { .timeout_ms = 5000, .quiet_ms = 300, .conns = 128 };
	long cid = -1;
	unsigned pass = 0, fail = 0, skip = 0, run = 0, idx = 0;
	bool bail = false; /* the back-end cannot be reached: the other checks are not run */
	uint32_t gport, hport;
	int opt;
	static struct ck c; /* large: the connection table */

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		char *end = NULL;
		long v = 0;

		if (optarg && strchr("ctqn", opt)) {
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || v < 0 || v > 600000) {
				fprintf(stderr, "uvsock-conform: bad number '%s'\n", optarg);
				return 2;
			}
		}
		switch (opt) {
		case 's': o.socket = optarg; break;
		case 'u': o.uds = optarg; break;
		case 'c': cid = v; break;
		case 'j': o.json = true; break;
		case 'o': o.only = optarg; break;
		case 't': o.timeout_ms = v ? (int)v : 1; break;
		case 'q': o.quiet_ms = (int)v; break;
		case 'n':
			if (v < 2 || v > 1000) {
				fprintf(stderr, "uvsock-conform: --conns takes 2 ... 1000\n");
				return 2;
			}
			o.conns = (unsigned)v;
			break;
		case 'l':
			for (unsigned i = 0; i < nchecks; i++)
				printf("%-26s %s\n", checks[i].name, checks[i].what);
			return 0;
		case 'V': printf("uvsock-conform %s\n", UVSOCK_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !o.socket || !o.uds) {
		fprintf(stderr, "uvsock-conform: --socket and --uds-path are required\n");
		usage(stderr);
		return 2;
	}
	for (unsigned i = 0; i < nchecks; i++)
		run += selected(o.only, checks[i].name);
	if (run == 0) {
		fprintf(stderr, "uvsock-conform: --only names no check (--list shows them)\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	/* Ports of this run: spread by PID so that a back-end's leftovers of an earlier run (a
	 * connection it has not reaped yet) do not meet this run's packets. */
	gport = 10000u + (uint32_t)(getpid() % 64) * 500u;
	hport = 40000u + (uint32_t)(getpid() % 64) * 32u;
	if (o.json)
		printf("{\"program\": \"uvsock-conform\", \"version\": \"%s\", \"socket\": ",
		       UVSOCK_VERSION);
	else
		printf("TAP version 13\n1..%u\n# uvsock-conform %s: back-end %s, host side %s\n", run,
		       UVSOCK_VERSION, o.socket, o.uds);
	if (o.json) {
		json_str(stdout, o.socket);
		printf(", \"uds_path\": ");
		json_str(stdout, o.uds);
		printf(", \"checks\": [");
	}
	for (unsigned i = 0; i < nchecks; i++) {
		const struct check *k = &checks[i];

		if (!selected(o.only, k->name))
			continue;
		memset(&c, 0, sizeof(c));
		c.o = &o;
		c.lfd = -1;
		c.next_port = gport;
		c.host_port = hport + i;
		k->run(&c);
		/* --cid: checked in the first session that opened. */
		if (c.open && cid >= 0) {
			if (c.g.cid != (uint32_t)cid)
				ck_fail(&c, REF_ADDR, "the back-end's guest CID is %u, --cid says %ld",
					c.g.cid, cid);
			cid = -1;
		}
		gport = c.next_port + 8;
		ck_end(&c);
		idx++;
		if (c.unreachable && !o.json) {
			printf("Bail out! %s\n", c.msg);
			return 1;
		}
		if (c.unreachable)
			bail = true;
		if (c.failed)
			fail++;
		else if (c.skipped)
			skip++;
		else
			pass++;
		if (o.json) {
			printf("%s\n  {\"name\": \"%s\", \"result\": \"%s\", \"what\": ", idx > 1 ? "," : "",
			       k->name, c.failed ? "fail" : c.skipped ? "skip" : "pass");
			json_str(stdout, k->what);
			if (c.failed || c.skipped) {
				printf(", \"%s\": ", c.failed ? "deviation" : "reason");
				json_str(stdout, c.msg);
			}
			if (c.failed) {
				printf(", \"reference\": ");
				json_str(stdout, c.ref);
				printf(", \"deviations\": %u", c.deviations);
			}
			if (c.note[0]) {
				printf(", \"note\": ");
				json_str(stdout, c.note);
			}
			printf("}");
		} else if (c.failed) {
			printf("not ok %u - %s\n#   deviation: %s\n#   contradicts: %s\n", idx, k->name,
			       c.msg, c.ref);
			if (c.deviations > 1)
				printf("#   (%u deviations in this check; the first is shown)\n",
				       c.deviations);
		} else if (c.skipped) {
			printf("ok %u - %s # SKIP %s\n", idx, k->name, c.msg);
		} else {
			printf("ok %u - %s\n", idx, k->name);
			if (c.note[0])
				printf("#   %s\n", c.note);
		}
		fflush(stdout);
		if (bail)
			break;
	}
	if (o.json)
		printf("\n], \"passed\": %u, \"failed\": %u, \"skipped\": %u, \"not_run\": %u}\n", pass,
		       fail, skip, run - idx);
	else
		printf("# %u passed, %u failed, %u skipped\n", pass, fail, skip);
	return fail ? 1 : 0;
}
