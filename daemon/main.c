/* SPDX-License-Identifier: MIT */
/*
 * uvsockd: the vhost-user-vsock back-end daemon. Parses the command line (options.c), checks
 * paths, then runs the VMs (vms.c: one device per --vm, the devices that share a group linked
 * so their guests can reach each other, each device on its own thread) either in this process
 * with the control socket beside them, or with --isolate in one worker process per sibling
 * group supervised from here (isolate.c), and exits cleanly (socket files removed) on SIGTERM
 * or SIGINT. Start-up order: parse (usage errors exit 2), adopt inherited sockets (sd.c), check
 * and probe every path before any is bound (a path a live process serves is an error naming it),
 * then bind everything, then tell systemd READY=1.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "fdstore.h"
#include "isolate.h"
#include "options.h"
#include "sd.h"
#include "util/build.h"
#include "util/log.h"
#include "util/tune.h"
#include "util/uds.h"
#include "vring/guest_mem.h"
#include "vms.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

/* In-process mode: the control socket serves the devices of this process. */
struct in_process {
	const struct uvsockd_config *cfg;
	struct ops_ctl *ctl;
	bool fdstore; /* crash survival through systemd's fd store (fdstore.h) */
};

static int ctl_ready(struct vm_set *s, void *arg)
{
	struct in_process *p = arg;
	int r = daemon_ctl_start(p->cfg, &vm_set_ctl_ops, s, &p->ctl);

	/* Every listener is up (the devices bound theirs, the control socket is there). */
	if (r == 0)
		daemon_sd_ready(vm_set_count(s), 0);
	if (p->fdstore)
		daemon_fdstore_settled(); /* every device adopted what it would by now */
	return r;
}

static void ctl_stopping(struct vm_set *s, void *arg)
{
	(void)s;
	daemon_sd_stopping();
	ops_ctl_stop(((struct in_process *)arg)->ctl);
}

/* Where uvsock-stat finds this daemon, for the start-up line. */
static const char *control_path(const struct uvsockd_config *cfg, char *buf, size_t len)
{
	if (cfg->control_off)
		return "none";
	if (cfg->control_path[0])
		return cfg->control_path;
	if (ops_ctl_default_path(cfg->vms[0].socket_path, buf, len) < 0)
		return "(too long)";
	return buf;
}

/* The process-wide settings of the command line: tune switches, socket permissions. */
static int apply_settings(const struct uvsockd_config *cfg, char *err, size_t errlen)
{
	gid_t gid;
	int r;

	if (cfg->tune[0]) {
		r = tune_set(cfg->tune, err, errlen);
		if (r < 0)
			return r;
	}
	r = uvsockd_socket_gid(cfg, &gid, err, errlen);
	if (r < 0)
		return r;
	uds_set_default_perms(cfg->socket_mode, gid);
	return 0;
}

int main(int argc, char **argv)
{
	struct uvsockd_config cfg = { 0 };
	struct in_process ip = { .cfg = &cfg };
	char err[512];
	sigset_t sigs;
	int r, rc = 1, takeover = -1;
	const char *iso_worker = NULL;

	/* --takeover FD, first when present: an upgrade's new process (docs/upgrade.md), given
	 * the old process's command line after it (with --isolate: the new main process). The rest is parsed as that one was, and is
	 * what SIGHUP and the next upgrade use. */
	if (argc >= 3 && strcmp(argv[1], "--takeover") == 0) {
		char *end;
		long fd = strtol(argv[2], &end, 10);

		if (*end || fd < 3 || fd > INT32_MAX) {
			fprintf(stderr, "uvsockd: --takeover: bad fd '%s'\n", argv[2]);
			return UVSOCKD_EXIT_USAGE;
		}
		takeover = (int)fd;
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	/* --iso-worker SPEC, first when present: a worker of --isolate that its main process
	 * started from this binary (an upgrade, or a restart after one: isolate.h). */
	if (argc >= 3 && strcmp(argv[1], "--iso-worker") == 0) {
		iso_worker = argv[2];
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	r = uvsockd_parse_args(argc, argv, &cfg, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "uvsockd: %s\n", err);
		return UVSOCKD_EXIT_USAGE;
	}
	switch (cfg.action) {
	case UVSOCKD_HELP:
		uvsockd_print_usage(stdout, "uvsockd");
		return 0;
	case UVSOCKD_VERSION:
		printf("uvsockd %s (build: %s)\n", UVSOCK_VERSION, uvsock_build_flavour());
		return 0;
	case UVSOCKD_PRINT_CAPABILITIES:
		uvsockd_print_capabilities(stdout);
		return 0;
	default:
		break;
	}
	log_set_level(cfg.log_level);
	log_setup("uvsockd");
	if (apply_settings(&cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "uvsockd: %s\n", err);
		rc = UVSOCKD_EXIT_USAGE;
		goto out;
	}
	if (cfg.check_config) {
		/* What a start would refuse as a usage error has been refused (exit 2) by now. */
		printf("uvsockd: configuration OK: %u VM%s\n", cfg.n_vms, cfg.n_vms == 1 ? "" : "s");
		rc = 0;
		goto out;
	}
	if (!iso_worker) { /* a worker the main started says who it is in its own lines */
		char ctl[UVSOCKD_SUN_PATH_MAX + 8], tune[512];

		tune_describe(tune, sizeof(tune));
		log_info("uvsockd %s: %u VM%s, control socket %s, tune %s", UVSOCK_VERSION,
			 cfg.n_vms, cfg.n_vms == 1 ? "" : "s", control_path(&cfg, ctl, sizeof(ctl)),
			 tune);
	}
	/* Before any VM exists; workers of --isolate inherit the caps (each has its own total). */
	guest_mem_set_limits(cfg.guest_memory_max, cfg.guest_memory_total_max);
	if (iso_worker) {
		/* The main process checked and bound what it had to; the VMs are this one's. */
		r = 0;
		if (!cfg.isolate) {
			snprintf(err, sizeof(err), "--iso-worker: the command line has no --isolate");
			r = -EINVAL;
		}
	} else if (takeover >= 0) {
		/* Every socket is the old process's until go, and comes with the VMs (or, with
		 * --isolate, with the main process's state: isolate.h). */
		(void)fcntl(takeover, F_SETFD, FD_CLOEXEC);
		if (!cfg.isolate)
			vm_set_takeover_fd(takeover);
		r = 0;
	} else {
		r = daemon_sd_adopt(&cfg, err, sizeof(err));
		if (r == 0)
			r = uvsockd_check_paths(&cfg, err, sizeof(err));
	}
	if (r < 0) {
		log_error("%s", err);
		goto out;
	}

	/* Signals are taken synchronously by the main thread; device threads inherit the mask. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR2); /* upgrade (docs/upgrade.md) */
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	vm_set_reload_args(argc, argv); /* for SIGHUP */
	if (iso_worker) {
		rc = isolate_worker_exec(&cfg, iso_worker, &sigs);
	} else if (cfg.isolate) {
		daemon_fdstore_stop(); /* --isolate keeps its own: stored fds, if any, closed now */
		rc = takeover >= 0 ? isolate_takeover(&cfg, takeover, &sigs) : isolate_run(&cfg, &sigs);
	} else {
		char why[160];

		/* docs/upgrade.md, "Crash survival". An upgrade's new process does not use the
		 * store: the old one's copies are there (systemd keeps one copy of a file), and
		 * the old one removes them as it exits. */
		if (takeover >= 0)
			snprintf(why, sizeof(why), "not --isolate, the new process of an upgrade: "
				 "the fd store is used again from the next start");
		ip.fdstore = takeover < 0 && daemon_fdstore_available(&cfg, why, sizeof(why));
		if (ip.fdstore) {
			log_info("crash survival: on (%s)", why);
			daemon_fdstore_start(&cfg);
		} else {
			/* Nothing of this process outlives it; stored fds, if any, closed now. */
			log_info("crash survival: off (%s): a crash ends vsock for every VM until "
				 "each VM restarts", why);
			daemon_fdstore_stop();
		}
		rc = vm_set_run(&cfg, NULL, 0, &sigs,
				&(struct vm_set_hooks){ ctl_ready, ctl_stopping, &ip });
	}
out:
	/* The VMs' connections ended with a clean stop: a later start must not adopt them. */
	daemon_fdstore_stop();
	uvsockd_config_clear(&cfg);
	return rc;
}
