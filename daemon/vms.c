/* SPDX-License-Identifier: MIT */
/*
 * The VMs of one uvsockd process (see vms.h): devices, sibling links, the start-up capture, one
 * thread per device, the signal wait and the ordered shutdown, plus the control socket's
 * callbacks over those devices. main.c runs every VM through here; an --isolate worker runs its
 * sibling group through here (isolate.c).
 */
#include "vms.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "device/device.h"
#include "fd_budget.h"
#include "ops/pcap.h"
#include "ops/stats.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/uds.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

struct vm_thread {
	const struct uvsockd_vm_config *cfg;
	struct vsock_dev *dev;
	pthread_t th;
	bool started;
	int rc;
};

struct vm_set {
	struct vsock_router *router;
	struct vm_thread *vms;
	unsigned n;
	struct ops_pcap *capture;
};

unsigned vm_set_count(const struct vm_set *s)
{
	return s->n;
}

const struct uvsockd_vm_config *vm_set_vm(const struct vm_set *s, unsigned i)
{
	return s->vms[i].cfg;
}

/* ---- control socket: what uvsock-stat reads ---------------------------------------------- */

static unsigned ctl_vm_count(void *opaque)
{
	return ((struct vm_set *)opaque)->n;
}

static uint32_t ctl_vm_cid(void *opaque, unsigned idx)
{
	return vsock_dev_guest_cid(((struct vm_set *)opaque)->vms[idx].dev);
}

static const char *ctl_vm_uds_path(void *opaque, unsigned idx)
{
	return vsock_dev_uds_path(((struct vm_set *)opaque)->vms[idx].dev);
}

static void ctl_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *ret)
{
	vsock_dev_get_ops_stats(((struct vm_set *)opaque)->vms[idx].dev, ret);
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
	struct conns_walk w = { .d = ((struct vm_set *)opaque)->vms[idx].dev, .emit = emit,
				.arg = arg };

	vsock_dev_foreach_sock(w.d, conns_one, &w);
}

static struct ops_tap *ctl_vm_tap(void *opaque, unsigned idx)
{
	return vsock_dev_tap(((struct vm_set *)opaque)->vms[idx].dev);
}

const struct ops_ctl_ops vm_set_ctl_ops = {
	.vm_count = ctl_vm_count,
	.vm_cid = ctl_vm_cid,
	.vm_uds_path = ctl_vm_uds_path,
	.vm_stats = ctl_vm_stats,
	.vm_conns = ctl_vm_conns,
	.vm_tap = ctl_vm_tap,
};

int daemon_ctl_start(const struct uvsockd_config *cfg, const struct ops_ctl_ops *ops,
		     void *opaque, struct ops_ctl **ret)
{
	struct ops_ctl_config cc = {
		.ops = ops,
		.opaque = opaque,
		.server = "uvsockd " UVSOCK_VERSION,
		.path = cfg->control_path,
	};
	char def[UVSOCKD_SUN_PATH_MAX + 1];
	int r;

	*ret = NULL;
	if (cfg->control_off)
		return 0;
	if (!cfg->control_path[0]) {
		if (ops_ctl_default_path(cfg->vms[0].socket_path, def, sizeof(def)) < 0) {
			fprintf(stderr,
				"uvsockd: %s.ctl is too long for a control socket; use "
				"--control PATH or --control none\n",
				cfg->vms[0].socket_path);
			return -ENAMETOOLONG;
		}
		cc.path = def;
	}
	r = ops_ctl_start(&cc, ret);
	if (r < 0)
		fprintf(stderr, "uvsockd: control socket %s: %s\n", cc.path, strerror(-r));
	return r;
}

/* ---- the VMs ------------------------------------------------------------------------------- */

/* --capture FILE: one file for every VM, attached before the VM threads start. */
static int capture_at_startup(const char *path, struct vm_set *s)
{
	struct ops_pcap *p;
	int r;

	r = ops_pcap_open_path(path, &(struct ops_pcap_opts){ 0 }, &p);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < s->n; i++)
		(void)ops_tap_attach(vsock_dev_tap(s->vms[i].dev), p);
	s->capture = p;
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

/* Devices of every VM of the set, the sibling links and the start-up capture. */
static int vm_set_create(struct vm_set *s, const struct uvsockd_config *cfg)
{
	int r;

	if (vsock_router_new(&s->router) < 0) {
		fprintf(stderr, "uvsockd: out of memory\n");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < s->n; i++) {
		const struct uvsockd_vm_config *v = s->vms[i].cfg;
		struct vsock_dev_config dc = {
			.guest_cid = v->guest_cid,
			.socket_path = v->socket_path,
			.uds_path = v->uds_path,
			.buf_alloc = v->tx_buffer_size,
			.queue_size_max = v->queue_size,
			/* fds are per process: the budget is shared by this process's VMs only */
			.max_conns = uvsockd_fd_budget_per_vm(s->n),
		};
		char name[32];

		snprintf(name, sizeof(name), "vm%u", v->guest_cid);
		dc.name = name;
		r = vsock_dev_new(s->router, &dc, &s->vms[i].dev);
		if (r < 0) {
			print_dev_error(v, r);
			return r;
		}
	}
	for (unsigned i = 0; i < s->n; i++)
		for (unsigned j = i + 1; j < s->n; j++)
			if (uvsockd_vms_share_group(s->vms[i].cfg, s->vms[j].cfg) &&
			    vsock_dev_link_sibling(s->vms[i].dev, s->vms[j].dev) < 0) {
				fprintf(stderr, "uvsockd: out of memory\n");
				return -ENOMEM;
			}
	if (cfg->capture_path[0]) {
		r = capture_at_startup(cfg->capture_path, s);
		if (r < 0) {
			fprintf(stderr, "uvsockd: --capture %s: %s\n", cfg->capture_path,
				strerror(-r));
			return r;
		}
		log_info("capturing every VM into %s", cfg->capture_path);
	}
	return 0;
}

static int vm_set_start(struct vm_set *s)
{
	for (unsigned i = 0; i < s->n; i++) {
		int r = pthread_create(&s->vms[i].th, NULL, vm_main, &s->vms[i]);

		if (r) {
			fprintf(stderr, "uvsockd: cannot start a thread: %s\n", strerror(r));
			return -r;
		}
		s->vms[i].started = true;
		log_info("vm%u: listening on %s (host side %s)", s->vms[i].cfg->guest_cid,
			 s->vms[i].cfg->socket_path, s->vms[i].cfg->uds_path);
	}
	return 0;
}

/* Stops and joins the threads, frees the devices; returns 1 if a VM's event loop failed. */
static int vm_set_destroy(struct vm_set *s)
{
	int rc = 0;

	for (unsigned i = 0; i < s->n; i++)
		if (s->vms[i].started)
			vsock_dev_stop(s->vms[i].dev);
	for (unsigned i = 0; i < s->n; i++) {
		if (s->vms[i].started) {
			pthread_join(s->vms[i].th, NULL);
			if (s->vms[i].rc < 0)
				rc = 1;
		}
	}
	/* Detach the start-up capture: the last reference below flushes the file. */
	for (unsigned i = 0; i < s->n && s->capture; i++)
		if (s->vms[i].dev)
			(void)ops_tap_detach(vsock_dev_tap(s->vms[i].dev));
	for (unsigned i = 0; i < s->n; i++)
		vsock_dev_free(s->vms[i].dev);
	ops_pcap_unref(s->capture);
	vsock_router_free(s->router);
	free(s->vms);
	return rc;
}

int vm_set_run(const struct uvsockd_config *cfg, const unsigned *idx, unsigned n,
	       const sigset_t *sigs, const struct vm_set_hooks *hooks)
{
	static const struct vm_set_hooks none;
	struct vm_set s = { .n = idx ? n : cfg->n_vms };
	bool hooked = false;
	int r, sig = 0, rc = 1;

	if (!hooks)
		hooks = &none;
	s.vms = calloc(s.n, sizeof(*s.vms));
	if (!s.vms) {
		fprintf(stderr, "uvsockd: out of memory\n");
		return 1;
	}
	for (unsigned i = 0; i < s.n; i++)
		s.vms[i].cfg = &cfg->vms[idx ? idx[i] : i];
	if (vm_set_create(&s, cfg) < 0)
		goto out;
	hooked = true;
	if (hooks->ready && hooks->ready(&s, hooks->arg) < 0)
		goto out;
	if (vm_set_start(&s) < 0)
		goto out;
	do {
		r = sigwait(sigs, &sig);
	} while (r == 0 && sig == SIGHUP);
	log_info("signal %d: shutting down", sig);
	rc = 0;
out:
	/* The control socket (or the worker's responder) reads the devices: stop it first. */
	if (hooked && hooks->stopping)
		hooks->stopping(&s, hooks->arg);
	if (vm_set_destroy(&s))
		rc = 1;
	return rc;
}
