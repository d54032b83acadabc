/* SPDX-License-Identifier: MIT */
/* uvsock-ctl (see ctlcli.h): options, the one request, its answer in words or as JSON. */
#include "ctlcli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctlproto/client.h"

#define CTLCLI_TIMEOUT_MS 30000
/* How long a socket given with --control has to answer "stats" (a live daemon: microseconds). */
#define CONTROL_PROBE_MS 2000

enum { OPT_CONTROL = 256 };

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: uvsock-ctl [-s PATH | --control PATH] [--json] add-vm SPEC\n"
		"       uvsock-ctl [-s PATH | --control PATH] [--json] remove-vm CID|NAME\n"
		"       uvsock-ctl [-s PATH | --control PATH] [--json] upgrade [--binary PATH]\n"
		"\n"
		"Adds or removes a VM of a running uvsockd through its control socket; the\n"
		"other VMs and their connections are not touched. upgrade hands every VM,\n"
		"with its connections, to a new uvsockd process (docs/upgrade.md).\n"
		"\n"
		"Commands:\n"
		"  add-vm SPEC         SPEC as uvsockd --vm: guest-cid=N,socket=PATH,\n"
		"                      uds-path=PATH[,KEY=VALUE...] (no spaces)\n"
		"  remove-vm CID|NAME  stop the VM with that guest CID or name\n"
		"  upgrade [--binary PATH]  start PATH (default: uvsockd's own binary, read\n"
		"                      again from disk) and hand it every VM; prints each VM's\n"
		"                      pause; on failure the old uvsockd goes on serving\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   uvsockd's control socket, or a VM's vhost-user socket\n"
		"                      (then PATH.ctl); default $" OPS_STATCLI_ENV ", else\n"
		"                      " OPS_CTL_DEFAULT_PATH "\n"
		"  --control PATH      uvsockd's control socket, whatever its name (checked\n"
		"                      with one 'stats' request of at most 2 s)\n"
		"  --json              print the daemon's answer as it came (one JSON line)\n"
		"  -h, --help          print this help\n"
		"  -V, --version       print the version\n");
}

/* The request line for the command in argv[0..argc), into buf; -EINVAL on a usage error. */
static int build_request(int argc, char **argv, char *buf, size_t len)
{
	const char *verb;
	int n;

	if (argc >= 1 && strcmp(argv[0], "upgrade") == 0) {
		if (argc == 1)
			n = snprintf(buf, len, "v1 upgrade");
		else if (argc == 3 && strcmp(argv[1], "--binary") == 0 && argv[2][0] &&
			 !strpbrk(argv[2], " \t\r\n")) {
			/* The daemon runs it from its own working directory: give it our path. */
			char abs[PATH_MAX];
			const char *b = argv[2][0] != '/' && realpath(argv[2], abs) ? abs : argv[2];

			n = snprintf(buf, len, "v1 upgrade binary %s", b);
		}
		else
			return -EINVAL;
		return n < 0 || (size_t)n >= len ? -E2BIG : 0;
	}
	if (argc != 2)
		return -EINVAL;
	if (strcmp(argv[0], "add-vm") == 0)
		verb = "vm-add";
	else if (strcmp(argv[0], "remove-vm") == 0)
		verb = "vm-remove";
	else
		return -EINVAL;
	if (!argv[1][0] || strpbrk(argv[1], " \t\r\n"))
		return -EINVAL;
	n = snprintf(buf, len, "v1 %s %s", verb, argv[1]);
	return n < 0 || (size_t)n >= len ? -E2BIG : 0;
}

int uvsock_ctl_main(int argc, char **argv, const char *version, FILE *out, FILE *err)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "control", required_argument, NULL, OPT_CONTROL },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = getenv(OPS_STATCLI_ENV), *control = NULL;
	char req[OPS_CTL_MAX_REQUEST - 1], *raw = NULL, found[PATH_MAX] = "";
	struct ops_jv *v = NULL;
	bool json = false, socket_given = false;
	int c, fd = -1, probe = 0, r, rc = 1;

	optind = 0; /* a fresh scan, also when called more than once (tests) */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+s:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			path = optarg;
			socket_given = true;
			break;
		case OPT_CONTROL:
			control = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(out);
			return 0;
		case 'V':
			fprintf(out, "uvsock-ctl %s\n", version);
			return 0;
		default:
			fprintf(err, "uvsock-ctl: unknown or incomplete option '%s' (see --help)\n",
				argv[optind - 1]);
			return 2;
		}
	}
	if (socket_given && control) {
		fprintf(err, "uvsock-ctl: give either -s or --control (see --help)\n");
		return 2;
	}
	r = build_request(argc - optind, argv + optind, req, sizeof(req));
	if (r < 0) {
		fprintf(err, "uvsock-ctl: %s (see --help)\n",
			r == -E2BIG	 ? "the request is too long"
			: argc == optind ? "no command given"
					 : "expected add-vm SPEC, remove-vm CID|NAME or "
					   "upgrade [--binary PATH]");
		return 2;
	}
	if (control)
		path = control; /* over $UVSOCK_CONTROL */
	else if (!path || !*path)
		path = OPS_CTL_DEFAULT_PATH; /* the packaged uvsockd.service's */
	r = control ? ops_ctl_connect_probed(path, CONTROL_PROBE_MS, &fd, &probe)
		    : ops_ctl_find(path, &fd, found, sizeof(found));
	if (r == -EBADMSG) {
		fprintf(err,
			"uvsock-ctl: %s did not answer as a uvsockd control socket within %d s (%s); "
			"a VM's vhost-user socket or uds-path is not one: give the path uvsockd logs "
			"as its control socket at start-up\n",
			path, CONTROL_PROBE_MS / 1000,
			probe == -EPROTO ? "the answer is not the control protocol's"
					 : strerror(-probe));
		return 1;
	}
	if (r == -EACCES && found[0] && strcmp(found, path) != 0) {
		fprintf(err, "uvsock-ctl: %s (the control socket next to %s): %s\n", found, path,
			ops_ctl_why(r));
		return 1;
	}
	if (r < 0) {
		fprintf(err, "uvsock-ctl: %s: %s%s\n", path, ops_ctl_why(r),
			strcmp(path, OPS_CTL_DEFAULT_PATH) ? "" : " (the default; give -s PATH or "
			"set $" OPS_STATCLI_ENV ")");
		return 1;
	}
	r = ops_ctl_request(fd, req, -1, CTLCLI_TIMEOUT_MS, &raw, &v);
	close(fd);
	if (r < 0) {
		fprintf(err, "uvsock-ctl: %s: %s\n", path, strerror(-r));
		goto out;
	}
	if (json)
		fprintf(out, "%s\n", raw);
	if (!ops_json_bool(v, "ok", false)) {
		fprintf(err, "uvsock-ctl: %s (%s)\n", ops_json_str(v, "error", "refused"),
			ops_json_str(v, "errno", "?"));
		goto out;
	}
	if (!json && ops_json_get(v, "new_pid")) {
		const struct ops_jv *vms = ops_json_get(v, "vms");

		fprintf(out, "upgraded: pid %llu -> %llu\n",
			(unsigned long long)ops_json_u64(v, "old_pid", 0),
			(unsigned long long)ops_json_u64(v, "new_pid", 0));
		for (const struct ops_jv *e = vms ? vms->child : NULL; e; e = e->next) {
			const struct ops_jv *pm = ops_json_get(e, "pause_ms");

			fprintf(out, "  VM %llu: paused %.3f ms, %llu connections\n",
				(unsigned long long)ops_json_u64(e, "cid", 0),
				pm && pm->type == OPS_J_NUM ? pm->d : 0.0,
				(unsigned long long)ops_json_u64(e, "conns", 0));
		}
	} else if (!json && ops_json_get(v, "added"))
		fprintf(out, "added VM %llu (%llu VMs now)\n",
			(unsigned long long)ops_json_u64(v, "added", 0),
			(unsigned long long)ops_json_u64(v, "vms", 0));
	else if (!json)
		fprintf(out, "removed VM %llu (%llu VMs now)\n",
			(unsigned long long)ops_json_u64(v, "removed", 0),
			(unsigned long long)ops_json_u64(v, "vms", 0));
	rc = 0;
out:
	ops_json_free(v);
	free(raw);
	return rc;
}
