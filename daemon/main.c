/* SPDX-License-Identifier: MIT */
/*
 * uvsockd: the vhost-user-vsock back-end daemon. Parses the command line (options.c), checks
 * paths, then runs the VMs (vms.c: one device per --vm, the devices that share a group linked
 * so their guests can reach each other, each device on its own thread) either in this process
 * with the control socket beside them, or with --isolate in one worker process per sibling
 * group supervised from here (isolate.c), and exits cleanly (socket files removed) on SIGTERM
 * or SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "isolate.h"
#include "ops/ctl.h"
#include "options.h"
#include "util/log.h"
#include "vring/guest_mem.h"
#include "vms.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

/* In-process mode: the control socket serves the devices of this process. */
struct in_process {
	const struct uvsockd_config *cfg;
	struct ops_ctl *ctl;
};

static int ctl_ready(struct vm_set *s, void *arg)
{
	struct in_process *p = arg;

	return daemon_ctl_start(p->cfg, &vm_set_ctl_ops, s, &p->ctl);
}

static void ctl_stopping(struct vm_set *s, void *arg)
{
	(void)s;
	ops_ctl_stop(((struct in_process *)arg)->ctl);
}

int main(int argc, char **argv)
{
	struct uvsockd_config cfg = { 0 };
	struct in_process ip = { .cfg = &cfg };
	char err[512];
	sigset_t sigs;
	int r, rc = 1;

	r = uvsockd_parse_args(argc, argv, &cfg, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "uvsockd: %s\n", err);
		return 1;
	}
	switch (cfg.action) {
	case UVSOCKD_HELP:
		uvsockd_print_usage(stdout, "uvsockd");
		return 0;
	case UVSOCKD_VERSION:
		printf("uvsockd %s\n", UVSOCK_VERSION);
		return 0;
	case UVSOCKD_PRINT_CAPABILITIES:
		uvsockd_print_capabilities(stdout);
		return 0;
	default:
		break;
	}
	log_set_level(cfg.log_level);
	/* Before any VM exists; workers of --isolate inherit the caps (each has its own total). */
	guest_mem_set_limits(cfg.guest_memory_max, cfg.guest_memory_total_max);
	r = uvsockd_check_paths(&cfg, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "uvsockd: %s\n", err);
		goto out;
	}

	/* Signals are taken synchronously by the main thread; device threads inherit the mask. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	vm_set_reload_args(argc, argv); /* for SIGHUP */
	if (cfg.isolate)
		rc = isolate_run(&cfg, &sigs);
	else
		rc = vm_set_run(&cfg, NULL, 0, &sigs,
				&(struct vm_set_hooks){ ctl_ready, ctl_stopping, &ip });
out:
	uvsockd_config_clear(&cfg);
	return rc;
}
