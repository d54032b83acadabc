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
#include <sys/socket.h>
#include <unistd.h>

#include "device/device.h"
#include "fd_budget.h"
#include "ops/ctl.h"
#include "ops/pcap.h"
#include "ops/stats.h"
#include "options.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/uds.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

struct vm_thread {
	struct vsock_dev *dev;
	pthread_t th;
	bool started;
	int rc;
};

/* ---- control socket: what uvsock-stat reads ---------------------------------------------- */

struct daemon_ctx {
	struct vm_thread *vms;
	unsigned n;
};

static unsigned ctl_vm_count(void *opaque)
{
	return ((struct daemon_ctx *)opaque)->n;
}

static uint32_t ctl_vm_cid(void *opaque, unsigned idx)
{
	return vsock_dev_guest_cid(((struct daemon_ctx *)opaque)->vms[idx].dev);
}

static void ctl_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *ret)
{
	vsock_dev_get_ops_stats(((struct daemon_ctx *)opaque)->vms[idx].dev, ret);
}

struct conns_walk {
	struct vsock_dev *d;
	bool (*emit)(void *arg, const struct ops_conn_info *ci);
	void *arg;
	bool full;
};

static void conns_one(void *arg, const struct vsock_sock_info *info)
{
	struct conns_walk *w = arg;
	struct ops_conn_info ci = { 0 };

	if (w->full || info->state == VSOCK_SS_LISTEN)
		return;
	ci.vm_cid = vsock_dev_guest_cid(w->d);
	ci.sock = *info;
	/* Host-initiated connections have local ports from [2^30, 2^31); see host_uds.c. */
	if (info->local_port >= (1u << 30) && info->local_port < (1u << 31))
		snprintf(ci.host, sizeof(ci.host), "%.100s", vsock_dev_uds_path(w->d));
	else
		snprintf(ci.host, sizeof(ci.host), "%.96s_%u", vsock_dev_uds_path(w->d),
			 info->local_port);
	if (!w->emit(w->arg, &ci))
		w->full = true;
}

static void ctl_vm_conns(void *opaque, unsigned idx,
			 bool (*emit)(void *arg, const struct ops_conn_info *ci), void *arg)
{
	struct conns_walk w = { .d = ((struct daemon_ctx *)opaque)->vms[idx].dev, .emit = emit,
				.arg = arg };

	vsock_dev_foreach_sock(w.d, conns_one, &w);
}

static struct ops_tap *ctl_vm_tap(void *opaque, unsigned idx)
{
	return vsock_dev_tap(((struct daemon_ctx *)opaque)->vms[idx].dev);
}

static const struct ops_ctl_ops ctl_ops = {
	.vm_count = ctl_vm_count,
	.vm_cid = ctl_vm_cid,
	.vm_stats = ctl_vm_stats,
	.vm_conns = ctl_vm_conns,
	.vm_tap = ctl_vm_tap,
};

/* --capture FILE: one file for every VM, attached before the VM threads start. */
static int capture_at_startup(const char *path, struct vm_thread *vms, unsigned n,
			      struct ops_pcap **ret)
{
	struct ops_pcap *p;
	int r;

	r = ops_pcap_open_path(path, &(struct ops_pcap_opts){ 0 }, &p);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < n; i++)
		(void)ops_tap_attach(vsock_dev_tap(vms[i].dev), p);
	*ret = p;
	return 0;
}

/*
 * Why vsock_dev_new failed for v. -EADDRINUSE: a live listener is on one of its paths (another
 * uvsockd, or anything else); name that path instead of replacing it.
 */
static void print_dev_error(const struct uvsockd_vm_config *v, int r)
{
	char seq[UVSOCKD_SUN_PATH_MAX + 16];
	const char *paths[3] = { v->socket_path, v->uds_path, seq };
	const int types[3] = { SOCK_STREAM, SOCK_STREAM, SOCK_SEQPACKET };

	snprintf(seq, sizeof(seq), "%s_seqpacket", v->uds_path);
	for (unsigned i = 0; r == -EADDRINUSE && i < ARRAY_SIZE(paths); i++) {
		if (uds_probe(paths[i], types[i]) == -EADDRINUSE) {
			fprintf(stderr,
				"uvsockd: guest-cid %u: %s is in use: another process serves it "
				"(stop it, or choose another path)\n",
				v->guest_cid, paths[i]);
			return;
		}
	}
	fprintf(stderr, "uvsockd: guest-cid %u: cannot set up sockets: %s\n", v->guest_cid,
		strerror(-r));
}

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
	struct daemon_ctx ctx = { 0 };
	struct ops_ctl *ctl = NULL;
	struct ops_pcap *capture = NULL;
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
			.max_conns = uvsockd_fd_budget_per_vm(cfg.n_vms),
		};
		char name[32];

		snprintf(name, sizeof(name), "vm%u", v->guest_cid);
		dc.name = name;
		r = vsock_dev_new(router, &dc, &vms[i].dev);
		if (r < 0) {
			print_dev_error(v, r);
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
	if (cfg.capture_path[0]) {
		r = capture_at_startup(cfg.capture_path, vms, cfg.n_vms, &capture);
		if (r < 0) {
			fprintf(stderr, "uvsockd: --capture %s: %s\n", cfg.capture_path,
				strerror(-r));
			goto out;
		}
		log_info("capturing every VM into %s", cfg.capture_path);
	}
	if (!cfg.control_off) {
		struct ops_ctl_config cc = {
			.ops = &ctl_ops,
			.opaque = &ctx,
			.server = "uvsockd " UVSOCK_VERSION,
		};
		char def[UVSOCKD_SUN_PATH_MAX + 1];

		ctx.vms = vms;
		ctx.n = cfg.n_vms;
		cc.path = cfg.control_path;
		if (!cfg.control_path[0]) {
			if (ops_ctl_default_path(cfg.vms[0].socket_path, def, sizeof(def)) < 0) {
				fprintf(stderr,
					"uvsockd: %s.ctl is too long for a control socket; use "
					"--control PATH or --control none\n",
					cfg.vms[0].socket_path);
				goto out;
			}
			cc.path = def;
		}
		r = ops_ctl_start(&cc, &ctl);
		if (r < 0) {
			fprintf(stderr, "uvsockd: control socket %s: %s\n", cc.path, strerror(-r));
			goto out;
		}
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
	/* The control thread reads the devices: stop it first. */
	ops_ctl_stop(ctl);
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
		/* Detach the start-up capture: the last reference below flushes the file. */
		for (unsigned i = 0; i < cfg.n_vms && capture; i++)
			if (vms[i].dev)
				(void)ops_tap_detach(vsock_dev_tap(vms[i].dev));
		for (unsigned i = 0; i < cfg.n_vms; i++)
			vsock_dev_free(vms[i].dev);
		free(vms);
	}
	ops_pcap_unref(capture);
	vsock_router_free(router);
	uvsockd_config_clear(&cfg);
	return rc;
}
