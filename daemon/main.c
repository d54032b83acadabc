/* SPDX-License-Identifier: MIT */
/*
 * uvsockd: the vhost-user-vsock back-end daemon. Parses the command line (options.c), checks
 * paths, creates one device per --vm (src/device), links the devices that share a group so
 * their guests can reach each other, runs each device on its own thread, and exits cleanly
 * (socket files removed) on SIGTERM or SIGINT.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"
#include "options.h"
#include "util/log.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

struct vm_thread {
	struct vsock_dev *dev;
	pthread_t th;
	bool started;
	int rc;
};

static void *vm_main(void *arg)
{
	struct vm_thread *t = arg;
	char name[16];

	snprintf(name, sizeof(name), "uvsockd-%u", vsock_dev_guest_cid(t->dev));
	pthread_setname_np(pthread_self(), name);
	t->rc = vsock_dev_run(t->dev);
	if (t->rc < 0) {
		log_error("cid %u: event loop failed: %s; shutting down",
			  vsock_dev_guest_cid(t->dev), strerror(-t->rc));
		kill(getpid(), SIGTERM);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct uvsockd_config cfg = { 0 };
	struct vsock_router *router = NULL;
	struct vm_thread *vms = NULL;
	char err[512];
	sigset_t sigs;
	int r, sig, rc = 1;

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
	if (cfg.control_path[0])
		log_warn("control socket %s (from --config) is not served by this uvsockd; ignored",
			 cfg.control_path);
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

	if (vsock_router_new(&router) < 0 || !(vms = calloc(cfg.n_vms, sizeof(*vms)))) {
		fprintf(stderr, "uvsockd: out of memory\n");
		goto out;
	}
	for (unsigned i = 0; i < cfg.n_vms; i++) {
		const struct uvsockd_vm_config *v = &cfg.vms[i];
		struct vsock_dev_config dc = {
			.guest_cid = v->guest_cid,
			.socket_path = v->socket_path,
			.uds_path = v->uds_path,
			.buf_alloc = v->tx_buffer_size,
			.queue_size_max = v->queue_size,
		};
		char name[32];

		snprintf(name, sizeof(name), "vm%u", v->guest_cid);
		dc.name = name;
		r = vsock_dev_new(router, &dc, &vms[i].dev);
		if (r < 0) {
			fprintf(stderr, "uvsockd: guest-cid %u: cannot set up sockets: %s\n",
				v->guest_cid, strerror(-r));
			goto out;
		}
	}
	for (unsigned i = 0; i < cfg.n_vms; i++)
		for (unsigned j = i + 1; j < cfg.n_vms; j++)
			if (uvsockd_vms_share_group(&cfg.vms[i], &cfg.vms[j]) &&
			    vsock_dev_link_sibling(vms[i].dev, vms[j].dev) < 0) {
				fprintf(stderr, "uvsockd: out of memory\n");
				goto out;
			}
	for (unsigned i = 0; i < cfg.n_vms; i++) {
		r = pthread_create(&vms[i].th, NULL, vm_main, &vms[i]);
		if (r) {
			fprintf(stderr, "uvsockd: cannot start a thread: %s\n", strerror(r));
			goto out;
		}
		vms[i].started = true;
		log_info("vm%u: listening on %s (host side %s)", cfg.vms[i].guest_cid,
			 cfg.vms[i].socket_path, cfg.vms[i].uds_path);
	}
	do {
		r = sigwait(&sigs, &sig);
	} while (r == 0 && sig == SIGHUP);
	log_info("signal %d: shutting down", sig);
	rc = 0;

out:
	if (vms) {
		for (unsigned i = 0; i < cfg.n_vms; i++)
			if (vms[i].started)
				vsock_dev_stop(vms[i].dev);
		for (unsigned i = 0; i < cfg.n_vms; i++) {
			if (vms[i].started) {
				pthread_join(vms[i].th, NULL);
				if (vms[i].rc < 0)
					rc = 1;
			}
		}
		for (unsigned i = 0; i < cfg.n_vms; i++)
			vsock_dev_free(vms[i].dev);
		free(vms);
	}
	vsock_router_free(router);
	uvsockd_config_clear(&cfg);
	return rc;
}
