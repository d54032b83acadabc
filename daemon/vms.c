/* SPDX-License-Identifier: MIT */
/*
 * The VMs of one uvsockd process (see vms.h): devices, sibling links, the start-up capture, one
 * thread per device, the signal wait and the ordered shutdown, plus the control socket's
 * callbacks over those devices. main.c runs every VM through here; an --isolate worker runs its
 * sibling group through here (isolate.c).
 *
 * Each VM's device is made with the public device API (uvsock_dev_new, <uvsock/device.h>), as a
 * VMM would, and VMs of a shared group are linked with uvsock_dev_link: VMs of different groups
 * are never linked, so their guests cannot reach each other (with --isolate, neither are they in
 * the same process). What uvsockd adds beyond the API goes through the device's core
 * (vsock_dev_of, device/vsock_dev.h): the vhost-user glue (dev_vhu_new), its own thread per VM
 * (vsock_dev_run), the tap, the connection listing and the operators' counters.
 */
#include "vms.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "device/vhu.h"
#include "device/vsock_dev.h"
#include "fd_budget.h"
#include "ops/pcap.h"
#include "ops/stats.h"
#include "paths.h"
#include "upgrade.h"
#include "sd.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/uds.h"
#include "uvsock/device.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

struct vm_thread {
	struct uvsockd_vm_config cfg; /* a copy; name filled in (vm<cid> by default) */
	uint32_t max_conns;           /* the host-side connections it got from the fd budget */
	struct uvsock_dev *dev;       /* uvsock_dev_new's */
	struct vsock_dev *core;       /* vsock_dev_of(dev): what uvsockd uses beyond the API */
	struct dev_vhu *vhu;          /* its vhost-user glue, listening on cfg.socket_path */
	pthread_t th;
	bool started;
	int rc;
};

struct vm_set {
	/*
	 * Held by whoever changes vms/n (the main thread on SIGHUP, the control thread for
	 * vm-add/vm-remove) and by the control thread while it uses VM indexes (ops lock). The
	 * VM threads never take it.
	 */
	pthread_mutex_t lock;
	struct vm_thread **vms; /* n entries, each allocated on its own (a VM thread keeps its) */
	unsigned n;
	struct ops_pcap *capture;
	struct ops_ctl *ctl;    /* the in-process control socket over this set, or NULL */
	bool runtime;           /* VMs may be added and removed (not an --isolate worker) */
	bool threads;           /* the VM threads run (after vm_set_start) */
	uint64_t nofile;        /* RLIMIT_NOFILE in force: the fd budget's total */
	uint32_t default_conns; /* host-side connections of a start-up VM without max-conns= */
	bool no_dgram;          /* --no-dgram, --dgram-max: the same for every VM */
	uint32_t dgram_max;
	char control[UVSOCKD_SUN_PATH_MAX + 16]; /* the control socket's path, "" if none */
};

/* argv of uvsockd, for SIGHUP (vm_set_reload_args) and the upgrade's new process. */
static int reload_argc;
static char *const *reload_argv;
/* --takeover FD (vm_set_takeover_fd), and the control socket taken over with it. */
static int takeover_fd = -1;
static struct uds_listener takeover_ctl = { .fd = -1 };

void vm_set_takeover_fd(int fd)
{
	takeover_fd = fd;
}

void vm_set_takeover_ctl(const struct uds_listener *l)
{
	takeover_ctl = *l;
}

void vm_set_reload_args(int argc, char *const *argv)
{
	reload_argc = argc;
	reload_argv = argv;
}

int vm_set_args(char *const **argv)
{
	*argv = reload_argv;
	return reload_argc;
}

unsigned vm_set_count(const struct vm_set *s)
{
	return s->n;
}

const struct uvsockd_vm_config *vm_set_vm(const struct vm_set *s, unsigned i)
{
	return &s->vms[i]->cfg;
}

/* ---- control socket: what uvsock-stat reads ---------------------------------------------- */

static struct vsock_dev *dev_at(void *opaque, unsigned idx)
{
	return ((struct vm_set *)opaque)->vms[idx]->core;
}

static unsigned ctl_vm_count(void *opaque)
{
	return ((struct vm_set *)opaque)->n;
}

static uint32_t ctl_vm_cid(void *opaque, unsigned idx)
{
	return vsock_dev_guest_cid(dev_at(opaque, idx));
}

static const char *ctl_vm_uds_path(void *opaque, unsigned idx)
{
	return vsock_dev_uds_path(dev_at(opaque, idx));
}

static void ctl_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *ret)
{
	const struct vm_thread *t = ((struct vm_set *)opaque)->vms[idx];

	vsock_dev_get_ops_stats(t->core, ret);
	snprintf(ret->socket, sizeof(ret->socket), "%s", t->cfg.socket_path);
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
	struct conns_walk w = { .d = dev_at(opaque, idx), .emit = emit, .arg = arg };

	vsock_dev_foreach_sock(w.d, conns_one, &w);
}

static struct ops_tap *ctl_vm_tap(void *opaque, unsigned idx)
{
	return vsock_dev_tap(dev_at(opaque, idx));
}

static void ctl_lock(void *opaque)
{
	pthread_mutex_lock(&((struct vm_set *)opaque)->lock);
}

static void ctl_unlock(void *opaque)
{
	pthread_mutex_unlock(&((struct vm_set *)opaque)->lock);
}

static int ctl_vm_add(void *opaque, const char *spec, uint32_t *ret_cid, char *err,
		      size_t errlen);
static int ctl_vm_remove(void *opaque, const char *which, uint32_t *ret_cid, char *err,
			 size_t errlen);
static int ctl_upgrade(void *opaque, const char *binary, struct ops_ctl_upgrade *ret,
		       char *err, size_t errlen);

const struct ops_ctl_ops vm_set_ctl_ops = {
	.vm_count = ctl_vm_count,
	.vm_cid = ctl_vm_cid,
	.vm_uds_path = ctl_vm_uds_path,
	.vm_stats = ctl_vm_stats,
	.vm_conns = ctl_vm_conns,
	.vm_tap = ctl_vm_tap,
	.lock = ctl_lock,
	.unlock = ctl_unlock,
	.vm_add = ctl_vm_add,
	.vm_remove = ctl_vm_remove,
	.upgrade = ctl_upgrade,
};

int daemon_ctl_start(const struct uvsockd_config *cfg, const struct ops_ctl_ops *ops,
		     void *opaque, struct ops_ctl **ret)
{
	struct ops_ctl_config cc = {
		.ops = ops,
		.opaque = opaque,
		.server = "uvsockd " UVSOCK_VERSION,
		.path = cfg->control_path,
		.listener = takeover_ctl.fd >= 0 ? &takeover_ctl : NULL,
	};
	char def[UVSOCKD_SUN_PATH_MAX + 1];
	int r;

	*ret = NULL;
	if (cfg->control_off)
		return 0;
	if (!cfg->control_path[0]) {
		if (ops_ctl_default_path(cfg->vms[0].socket_path, def, sizeof(def)) < 0) {
			log_error("%s.ctl is too long for a control socket; use --control PATH or "
				  "--control none", cfg->vms[0].socket_path);
			return -ENAMETOOLONG;
		}
		cc.path = def;
	}
	r = ops_ctl_start(&cc, ret);
	if (r < 0)
		log_error("control socket %s: %s", cc.path, strerror(-r));
	else if (ops == &vm_set_ctl_ops)
		((struct vm_set *)opaque)->ctl = *ret; /* removals tell its capture */
	return r;
}

/* ---- the VMs ------------------------------------------------------------------------------- */

/*
 * Why uvsock_dev_new or dev_vhu_new failed for v, into err. -EADDRINUSE: a live listener is on
 * one of its paths (another uvsockd, or anything else); name that path instead of replacing it.
 */
static void dev_error(const struct uvsockd_vm_config *v, int r, char *err, size_t errlen)
{
	char seq[UVSOCKD_SUN_PATH_MAX + 16];
	const char *paths[3] = { v->socket_path, v->uds_path, seq };
	const int types[3] = { SOCK_STREAM, SOCK_STREAM, SOCK_SEQPACKET };

	snprintf(seq, sizeof(seq), "%s_seqpacket", v->uds_path);
	for (unsigned i = 0; r == -EADDRINUSE && i < ARRAY_SIZE(paths); i++) {
		if (uds_probe(paths[i], types[i]) == -EADDRINUSE) {
			snprintf(err, errlen,
				 "guest-cid %u: %s is in use: another process serves it (stop it, "
				 "or choose another path)", v->guest_cid, paths[i]);
			return;
		}
	}
	snprintf(err, errlen, "guest-cid %u: cannot set up sockets: %s", v->guest_cid,
		 strerror(-r));
}

static void *vm_main(void *arg)
{
	struct vm_thread *t = arg;
	char name[16];

	snprintf(name, sizeof(name), "uvsockd-%u", t->cfg.guest_cid);
	pthread_setname_np(pthread_self(), name);
	t->rc = vsock_dev_run(t->core);
	if (t->rc < 0) {
		log_error("cid %u: event loop failed: %s; shutting down", t->cfg.guest_cid,
			  strerror(-t->rc));
		kill(getpid(), SIGTERM);
	}
	return NULL;
}

/* The soft RLIMIT_NOFILE now (after uvsockd_fd_budget_per_vm raised it). */
static uint64_t nofile_now(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

/* Host connections one more VM could get: the budget's total less what every VM has. */
static uint64_t conns_room(const struct vm_set *s)
{
	uint64_t used = UVSOCKD_FDS_GLOBAL + UVSOCKD_FDS_PER_VM;

	for (unsigned i = 0; i < s->n; i++)
		used += UVSOCKD_FDS_PER_VM + s->vms[i]->max_conns;
	return s->nofile > used ? s->nofile - used : 0;
}

/*
 * The host-side connections v gets (daemon/fd_budget.h): max-conns= if it fits in what the
 * other VMs leave, else an error; without it, the start-up share, at run time no more than
 * what is left (and an error if nothing is). Returns 0 or -EMFILE with err.
 */
static int conns_for(const struct vm_set *s, const struct uvsockd_vm_config *v, bool startup,
		     uint32_t *ret, char *err, size_t errlen)
{
	uint64_t room = conns_room(s);

	if (v->max_conns && v->max_conns > room) {
		snprintf(err, errlen,
			 "guest-cid %u: max-conns=%u does not fit the fd budget: room for %llu "
			 "more host connections under RLIMIT_NOFILE %llu (raise the hard limit, "
			 "e.g. LimitNOFILE=, or lower max-conns)", v->guest_cid, v->max_conns,
			 (unsigned long long)room, (unsigned long long)s->nofile);
		return -EMFILE;
	}
	if (v->max_conns) {
		*ret = v->max_conns;
		return 0;
	}
	if (!startup && room == 0) {
		snprintf(err, errlen,
			 "guest-cid %u: no file descriptors left for another VM under "
			 "RLIMIT_NOFILE %llu", v->guest_cid, (unsigned long long)s->nofile);
		return -EMFILE;
	}
	*ret = startup ? s->default_conns : (uint32_t)MIN((uint64_t)s->default_conns, room);
	return 0;
}

/* v (name filled in) against the VMs of the set: CIDs, paths and names are unique. */
static int check_unique(const struct vm_set *s, const struct uvsockd_vm_config *v, char *err,
			size_t errlen)
{
	for (unsigned i = 0; i < s->n; i++) {
		const struct uvsockd_vm_config *o = &s->vms[i]->cfg;
		const char *path = NULL;

		if (o->guest_cid == v->guest_cid) {
			snprintf(err, errlen, "guest-cid %u is already served", v->guest_cid);
			return -EEXIST;
		}
		if (!strcmp(v->socket_path, o->socket_path) || !strcmp(v->socket_path, o->uds_path))
			path = v->socket_path;
		else if (!strcmp(v->uds_path, o->socket_path) || !strcmp(v->uds_path, o->uds_path))
			path = v->uds_path;
		if (path || !strcmp(v->name, o->name)) {
			snprintf(err, errlen,
				 "guest-cid %u: %s '%s' is already used by guest-cid %u", v->guest_cid,
				 path ? "path" : "name", path ? path : v->name, o->guest_cid);
			return -EEXIST;
		}
	}
	if (s->n == UVSOCKD_MAX_VMS) {
		snprintf(err, errlen, "too many VMs (at most %d)", UVSOCKD_MAX_VMS);
		return -E2BIG;
	}
	{
		const struct uvsockd_vm_config *others[UVSOCKD_MAX_VMS];

		for (unsigned i = 0; i < s->n; i++)
			others[i] = &s->vms[i]->cfg;
		return uvsockd_check_vm_paths(v, others, s->n, s->control, err, errlen);
	}
}

static int vm_thread_start(struct vm_thread *t, char *err, size_t errlen)
{
	int r = pthread_create(&t->th, NULL, vm_main, t);

	if (r) {
		snprintf(err, errlen, "cannot start a thread: %s", strerror(r));
		return -r;
	}
	t->started = true;
	log_info("%s: listening on %s (host side %s, up to %u host connections)", t->cfg.name,
		 t->cfg.socket_path, t->cfg.uds_path, t->max_conns);
	return 0;
}

/* Stops t's thread (if it runs), detaches the start-up capture, frees t and its device. */
static int vm_free(struct vm_set *s, struct vm_thread *t)
{
	int rc = 0;

	if (t->started) {
		vsock_dev_stop(t->core);
		pthread_join(t->th, NULL);
		rc = t->rc < 0;
	}
	/* Detach the start-up capture: the last reference flushes the file. */
	if (s->capture && t->dev)
		(void)ops_tap_detach(vsock_dev_tap(t->core));
	dev_vhu_free(t->vhu);
	uvsock_dev_free(t->dev);
	free(t);
	return rc;
}

/*
 * Creates v's device, links it with every VM of a shared group, attaches the start-up capture
 * and, once the set runs, starts its thread. Context: s->lock held or the set not running.
 * Returns 0 or a negative errno with err.
 */
static int vm_create(struct vm_set *s, const struct uvsockd_vm_config *v, bool startup,
		     char *err, size_t errlen)
{
	struct uvsock_dev_config dc = { .size = sizeof(dc) };
	struct vm_thread *t, **vv;
	int r;

	t = calloc(1, sizeof(*t));
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->cfg = *v;
	if (!t->cfg.name[0])
		snprintf(t->cfg.name, sizeof(t->cfg.name), "vm%u", v->guest_cid);
	r = check_unique(s, &t->cfg, err, errlen);
	if (r == 0)
		r = conns_for(s, v, startup, &t->max_conns, err, errlen);
	if (r < 0) {
		free(t);
		return r;
	}
	dc.guest_cid = v->guest_cid;
	dc.uds_path = v->uds_path;
	dc.buf_alloc = v->tx_buffer_size;
	dc.queue_size_max = v->queue_size;
	dc.max_conns = t->max_conns;
	dc.name = t->cfg.name;
	/* A device thread: ours (vm_main). */
	dc.flags = (s->no_dgram ? UVSOCK_DEV_NO_DGRAM : 0) |
		   (v->ok_guest_port ? UVSOCK_DEV_OK_GUEST_PORT : 0);
	dc.dgram_max = s->dgram_max;
	/* The device, then the vhost-user glue that drives it (its rings through the device API). */
	r = uvsock_dev_new(&dc, &t->dev);
	if (r == 0) {
		t->core = vsock_dev_of(t->dev);
		r = dev_vhu_new(t->core, v->socket_path, dc.queue_size_max, &t->vhu);
		if (r < 0) {
			uvsock_dev_free(t->dev);
			t->dev = NULL;
		}
	}
	if (r < 0) {
		dev_error(v, r, err, errlen);
		free(t);
		return r;
	}
	vv = realloc(s->vms, (s->n + 1) * sizeof(*vv));
	r = vv ? 0 : -ENOMEM;
	if (vv)
		s->vms = vv;
	for (unsigned i = 0; i < s->n && r == 0; i++)
		if (uvsockd_vms_share_group(&s->vms[i]->cfg, &t->cfg))
			r = uvsock_dev_link(s->vms[i]->dev, t->dev);
	if (r < 0)
		snprintf(err, errlen, "out of memory");
	if (r == 0 && s->capture)
		(void)ops_tap_attach(vsock_dev_tap(t->core), s->capture);
	if (r == 0 && s->threads)
		r = vm_thread_start(t, err, errlen);
	if (r < 0) {
		vm_free(s, t); /* its siblings drop their links to it */
		return r;
	}
	s->vms[s->n++] = t;
	return 0;
}

/*
 * Removes VM i: a capture of the control socket forgets it, its thread stops, its device is
 * freed (socket files removed; its siblings go on). Context: s->lock held. Returns 1 if its
 * event loop had failed.
 */
static int vm_remove_at(struct vm_set *s, unsigned i)
{
	struct vm_thread *t = s->vms[i];

	ops_ctl_vm_removed(s->ctl, i);
	memmove(&s->vms[i], &s->vms[i + 1], (s->n - i - 1) * sizeof(*s->vms));
	s->n--;
	log_info("%s: removed (guest-cid %u)", t->cfg.name, t->cfg.guest_cid);
	return vm_free(s, t);
}

/* ---- runtime changes: the control socket's vm-add / vm-remove, SIGHUP ---------------------- */

static const char no_runtime[] = "VMs cannot be added or removed at runtime with --isolate "
				 "(restart uvsockd with the new VMs)";

/*
 * vm-add SPEC: parsed and checked as one --vm of the command line. uvsockd_parse_args runs
 * under s->lock only (the control thread here, the main thread for SIGHUP: getopt's state is
 * global).
 */
static int ctl_vm_add(void *opaque, const char *spec, uint32_t *ret_cid, char *err,
		      size_t errlen)
{
	struct vm_set *s = opaque;
	char *argv[] = { "uvsockd", "--vm", (char *)spec, NULL };
	struct uvsockd_config nc = { 0 };
	int r;

	if (!s->runtime) {
		snprintf(err, errlen, "%s", no_runtime);
		return -ENOTSUP;
	}
	r = uvsockd_parse_args(3, argv, &nc, err, errlen);
	if (r == 0)
		r = uvsockd_check_dirs(&nc, err, errlen);
	if (r == 0)
		r = vm_create(s, &nc.vms[0], false, err, errlen);
	if (r == 0) {
		*ret_cid = nc.vms[0].guest_cid;
		log_info("%s: added (control socket)", s->vms[s->n - 1]->cfg.name);
	} else {
		log_warn("control socket: vm-add refused: %s", err);
	}
	uvsockd_config_clear(&nc);
	return r;
}

/* Index of the VM with CID or name `which`, or -ENOENT. */
static int find_vm(const struct vm_set *s, const char *which)
{
	bool cid = which[0] && strspn(which, "0123456789") == strlen(which);

	for (unsigned i = 0; i < s->n; i++) {
		const struct uvsockd_vm_config *v = &s->vms[i]->cfg;

		if (cid ? strtoull(which, NULL, 10) == v->guest_cid : !strcmp(which, v->name))
			return (int)i;
	}
	return -ENOENT;
}

static int ctl_vm_remove(void *opaque, const char *which, uint32_t *ret_cid, char *err,
			 size_t errlen)
{
	struct vm_set *s = opaque;
	int i;

	if (!s->runtime) {
		snprintf(err, errlen, "%s", no_runtime);
		return -ENOTSUP;
	}
	i = find_vm(s, which);
	if (i < 0) {
		snprintf(err, errlen, "no VM with CID or name '%s'", which);
		return i;
	}
	*ret_cid = s->vms[i]->cfg.guest_cid;
	(void)vm_remove_at(s, (unsigned)i);
	return 0;
}

static bool same_vm(const struct uvsockd_vm_config *a, const struct uvsockd_vm_config *b)
{
	if (a->guest_cid != b->guest_cid || strcmp(a->socket_path, b->socket_path) ||
	    strcmp(a->uds_path, b->uds_path) || a->tx_buffer_size != b->tx_buffer_size ||
	    a->queue_size != b->queue_size || a->n_groups != b->n_groups ||
	    strcmp(a->cgroup, b->cgroup) || a->max_conns != b->max_conns ||
	    a->ok_guest_port != b->ok_guest_port)
		return false;
	for (unsigned g = 0; g < a->n_groups; g++)
		if (strcmp(a->groups[g], b->groups[g]))
			return false;
	/* a is running (name filled in); b is from the file ("" is vm<cid>). */
	if (b->name[0])
		return !strcmp(a->name, b->name);
	return !strncmp(a->name, "vm", 2) &&
	       strspn(a->name + 2, "0123456789") == strlen(a->name + 2) &&
	       strtoull(a->name + 2, NULL, 10) == a->guest_cid;
}

static const struct uvsockd_vm_config *find_cid(const struct uvsockd_config *c, uint32_t cid)
{
	for (unsigned i = 0; i < c->n_vms; i++)
		if (c->vms[i].guest_cid == cid)
			return &c->vms[i];
	return NULL;
}

static bool started_with_config(void)
{
	for (int i = 1; i < reload_argc; i++)
		if (!strcmp(reload_argv[i], "--config") || !strncmp(reload_argv[i], "--config=", 9))
			return true;
	return false;
}

/* What SIGHUP cannot change: said, and the rest applied. */
static void warn_fixed(const struct uvsockd_config *was, const struct uvsockd_config *nc)
{
	if (was->control_off != nc->control_off || strcmp(was->control_path, nc->control_path))
		log_warn("SIGHUP: the control socket cannot move at runtime (restart uvsockd for "
			 "the new control:)");
	if (strcmp(was->capture_path, nc->capture_path))
		log_warn("SIGHUP: --capture cannot change at runtime");
	if (was->guest_memory_max != nc->guest_memory_max ||
	    was->guest_memory_total_max != nc->guest_memory_total_max)
		log_warn("SIGHUP: the guest memory caps cannot change at runtime");
	if (was->no_dgram != nc->no_dgram || was->dgram_max != nc->dgram_max)
		log_warn("SIGHUP: --no-dgram and --dgram-max cannot change at runtime");
}

/*
 * SIGHUP: re-reads --config (the whole command line again, so the file's VMs are checked as
 * at start) and applies the difference: VMs gone or changed are removed, then new and changed
 * ones added; unchanged VMs are not touched. A file that does not parse changes nothing. VMs
 * added with vm-add and not in the file are removed (the file is the configuration).
 */
static void vm_set_reload(struct vm_set *s, const struct uvsockd_config *was)
{
	struct uvsockd_config nc = { 0 };
	unsigned added = 0, removed = 0, failed = 0;
	char err[512];
	int r;

	if (!s->runtime) {
		log_warn("SIGHUP: %s", no_runtime);
		return;
	}
	if (!reload_argv || !started_with_config()) {
		log_warn("SIGHUP: uvsockd was started without --config: nothing to re-read");
		return;
	}
	pthread_mutex_lock(&s->lock);
	r = uvsockd_parse_args(reload_argc, reload_argv, &nc, err, sizeof(err));
	if (r == 0)
		r = uvsockd_check_dirs(&nc, err, sizeof(err));
	if (r == 0 && nc.isolate) {
		snprintf(err, sizeof(err),
			 "isolate cannot be turned on at runtime (restart uvsockd)");
		r = -ENOTSUP;
	}
	if (r < 0) {
		log_error("SIGHUP: %s; the running VMs stay as they are", err);
		goto out;
	}
	warn_fixed(was, &nc);
	log_set_level(nc.log_level);
	/* Gone and changed VMs first: a changed VM's paths are free again for its new form. */
	for (unsigned i = s->n; i-- > 0;) {
		const struct uvsockd_vm_config *v = find_cid(&nc, s->vms[i]->cfg.guest_cid);

		if (v && same_vm(&s->vms[i]->cfg, v))
			continue;
		(void)vm_remove_at(s, i);
		removed++;
	}
	for (unsigned i = 0; i < nc.n_vms; i++) {
		bool have = false;

		for (unsigned j = 0; j < s->n && !have; j++)
			have = s->vms[j]->cfg.guest_cid == nc.vms[i].guest_cid;
		if (have)
			continue;
		if (vm_create(s, &nc.vms[i], false, err, sizeof(err)) < 0) {
			log_error("SIGHUP: %s", err);
			failed++;
		} else {
			added++;
		}
	}
	log_info("SIGHUP: configuration re-read: %u VMs added, %u removed (a changed VM is both), "
		 "%u failed; %u VMs running", added, removed, failed, s->n);
out:
	pthread_mutex_unlock(&s->lock);
	uvsockd_config_clear(&nc);
}

/* ---- live upgrade (upgrade.c; docs/upgrade.md) -------------------------------------------- */

/* What upgrade.c is given of each VM of s, into uv[0..s->n). */
static void upgrade_vms_of(const struct vm_set *s, struct upgrade_vm *uv)
{
	for (unsigned i = 0; i < s->n; i++)
		uv[i] = (struct upgrade_vm){ .cfg = &s->vms[i]->cfg, .max_conns = s->vms[i]->max_conns,
					     .core = s->vms[i]->core, .vhu = s->vms[i]->vhu };
}

/* The control socket's answer of an upgrade that returned r with res; frees uv. */
static void upgrade_answer(const struct vm_set *s, struct upgrade_vm *uv,
			   const struct upgrade_result *res, int r, struct ops_ctl_upgrade *ret)
{
	if (res->committed)
		ret->exit_after = r == 0 ? 0 : 1;
	ret->old_pid = (int)res->old_pid;
	ret->new_pid = (int)res->new_pid;
	ret->n = s->n;
	for (unsigned i = 0; i < s->n; i++)
		ret->vms[i] = (struct ops_ctl_upgrade_vm){ .cid = s->vms[i]->cfg.guest_cid,
							   .pause_us = uv[i].pause_ns / 1000,
							   .conns = uv[i].conns };
	free(uv);
}

/*
 * Hands every VM to a new process. Context: s->lock held (the control thread, or the main
 * thread on SIGUSR2). Returns 0 (the VMs are gone: ret->exit_after is 0) or -errno with err;
 * ret->exit_after is 1 if the VMs went and the new process did not confirm.
 */
static int vm_set_upgrade(struct vm_set *s, const char *binary, struct ops_ctl_upgrade *ret,
			  char *err, size_t errlen)
{
	struct upgrade_result res = { 0 };
	struct upgrade_vm *uv;
	int r;

	ret->exit_after = -1;
	if (!s->runtime) {
		snprintf(err, errlen, "uvsockd --isolate cannot be upgraded in place yet "
			 "(docs/upgrade.md): restart it");
		return -ENOTSUP;
	}
	if (!reload_argv) {
		snprintf(err, errlen, "upgrade: the command line is not known");
		return -EINVAL;
	}
	uv = calloc(s->n ? s->n : 1, sizeof(*uv));
	ret->vms = calloc(s->n ? s->n : 1, sizeof(*ret->vms));
	if (!uv || !ret->vms) {
		free(uv);
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	upgrade_vms_of(s, uv);
	r = upgrade_run(binary, reload_argc, reload_argv, uv, s->n, ops_ctl_listener(s->ctl), &res,
			err, errlen);
	upgrade_answer(s, uv, &res, r, ret);
	return r;
}

static int ctl_upgrade(void *opaque, const char *binary, struct ops_ctl_upgrade *ret,
		       char *err, size_t errlen)
{
	return vm_set_upgrade(opaque, binary, ret, err, errlen);
}

/*
 * An --isolate worker's VMs to the new worker pid (binary path) that the main process started,
 * over sock (docs/upgrade.md, "Under --isolate"). Context: the worker's responder thread.
 * Returns as vm_set_upgrade; ret->exit_after is 0 or 1 once the VMs are gone.
 */
int vm_set_hand_over(struct vm_set *s, int sock, pid_t pid, const char *path,
		     struct ops_ctl_upgrade *ret, char *err, size_t errlen)
{
	struct upgrade_result res = { 0 };
	struct upgrade_vm *uv;
	int r;

	pthread_mutex_lock(&s->lock);
	ret->exit_after = -1;
	uv = calloc(s->n ? s->n : 1, sizeof(*uv));
	ret->vms = calloc(s->n ? s->n : 1, sizeof(*ret->vms));
	if (!uv || !ret->vms) {
		free(uv);
		close(sock);
		pthread_mutex_unlock(&s->lock);
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	upgrade_vms_of(s, uv);
	r = upgrade_hand_over(sock, pid, path, uv, s->n, &res, err, errlen);
	upgrade_answer(s, uv, &res, r, ret);
	/* Committed: the set stays locked, nothing here touches the VMs again. */
	if (ret->exit_after < 0)
		pthread_mutex_unlock(&s->lock);
	return r;
}

/* SIGUSR2: the same with this binary's path; the log says how it went. */
static void vm_set_upgrade_signal(struct vm_set *s)
{
	struct ops_ctl_upgrade u = { .exit_after = -1 };
	char err[640] = "";
	int r;

	pthread_mutex_lock(&s->lock);
	r = vm_set_upgrade(s, NULL, &u, err, sizeof(err));
	if (r < 0)
		log_error("SIGUSR2: %s", err);
	free(u.vms);
	if (u.exit_after >= 0) {
		log_info("SIGUSR2: upgraded: pid %d serves every VM; exiting", u.new_pid);
		_exit(u.exit_after); /* nothing of ours may be shut down or removed */
	}
	pthread_mutex_unlock(&s->lock);
}

/* The new process: one VM from its record (upgrade_restore_fn). */
static int vm_restore(void *arg, const struct uvsockd_vm_config *v, uint32_t max_conns,
		      struct rec_reader *rr, char *err, size_t errlen)
{
	struct vm_set *s = arg;
	struct uvsock_dev_config dc = { .size = sizeof(dc) };
	struct vm_thread *t, **vv;
	int r;

	for (unsigned i = 0; i < s->n; i++)
		if (s->vms[i]->cfg.guest_cid == v->guest_cid) {
			snprintf(err, errlen, "guest-cid %u twice", v->guest_cid);
			return -EEXIST;
		}
	t = calloc(1, sizeof(*t));
	vv = realloc(s->vms, (s->n + 1) * sizeof(*vv));
	if (vv)
		s->vms = vv;
	if (!t || !vv) {
		free(t);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->cfg = *v;
	t->max_conns = max_conns;
	dc.guest_cid = v->guest_cid;
	dc.uds_path = v->uds_path;
	dc.buf_alloc = v->tx_buffer_size;
	dc.queue_size_max = v->queue_size;
	dc.max_conns = max_conns;
	dc.name = t->cfg.name;
	dc.flags = (s->no_dgram ? UVSOCK_DEV_NO_DGRAM : 0) |
		   (v->ok_guest_port ? UVSOCK_DEV_OK_GUEST_PORT : 0);
	dc.dgram_max = s->dgram_max;
	r = dev_vhu_new_device_frozen(&dc, &t->dev);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot make its device: %s", t->cfg.name, strerror(-r));
		free(t);
		return r;
	}
	t->core = vsock_dev_of(t->dev);
	r = dev_vhu_restore(t->core, rr, v->socket_path, dc.queue_size_max, &t->vhu);
	if (r < 0) {
		/* Not freed: this process exits without touching what the old one serves. */
		const char *why = rec_error(rr->doc);

		/* The device's own messages already start with its name. */
		if (!strncmp(why, t->cfg.name, strlen(t->cfg.name)))
			snprintf(err, errlen, "%s", why);
		else
			snprintf(err, errlen, "%s: %s", t->cfg.name, why[0] ? why : strerror(-r));
		return r;
	}
	/* Linked as at start-up (vm_create), before any thread runs; the held packets the record
	 * gave back go to their siblings at go (dev_sib_thaw), once every link is made. */
	for (unsigned i = 0; i < s->n && r == 0; i++)
		if (uvsockd_vms_share_group(&s->vms[i]->cfg, &t->cfg))
			r = uvsock_dev_link(s->vms[i]->dev, t->dev);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot link it to its siblings: %s", t->cfg.name,
			 strerror(-r));
		return r;
	}
	if (s->capture)
		(void)ops_tap_attach(vsock_dev_tap(t->core), s->capture);
	s->vms[s->n++] = t;
	return 0;
}

static uint64_t mono_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* --takeover: the VMs come from the old process; until go nothing is ours. */
static int vm_set_take_over(struct vm_set *s, const struct uvsockd_config *cfg)
{
	int r;

	s->default_conns = uvsockd_fd_budget_per_vm(cfg->n_vms);
	s->nofile = nofile_now();
	if (cfg->capture_path[0])
		log_warn("takeover: --capture is not started again by an upgrade");
	r = upgrade_takeover(takeover_fd, vm_restore, s, &takeover_ctl);
	if (r < 0)
		_exit(1); /* nothing here may shut down or remove what the old process serves */
	log_info("takeover: %u VM%s taken over", s->n, s->n == 1 ? "" : "s");
	if (s->runtime) /* an --isolate worker is not the service's main process */
		daemon_sd_mainpid();
	return 0;
}

/* After go: every VM serves here (its rings at their indices), then the old one is told. */
static int vm_set_take_over_start(struct vm_set *s)
{
	uint64_t *when = calloc(s->n ? s->n : 1, sizeof(*when));
	char err[128];

	for (unsigned i = 0; i < s->n; i++) {
		struct vm_thread *t = s->vms[i];
		int r = dev_vhu_go(t->vhu);

		if (r < 0)
			log_error("%s: after the takeover: %s", t->cfg.name, strerror(-r));
		if (vm_thread_start(t, err, sizeof(err)) < 0) {
			log_error("%s", err);
			free(when);
			return -EAGAIN;
		}
		if (when)
			when[i] = mono_now_ns();
	}
	s->threads = true;
	if (when)
		upgrade_takeover_done(takeover_fd, when, s->n);
	free(when);
	takeover_fd = -1;
	return 0;
}

/* ---- start and stop ------------------------------------------------------------------------ */

/* Devices of every VM of the set, the sibling links and the start-up capture. */
static int vm_set_create(struct vm_set *s, const struct uvsockd_config *cfg, const unsigned *idx,
			 unsigned n)
{
	uint64_t explicit_conns = 0;
	unsigned n_explicit = 0;
	char err[512];
	int r;

	/* fds are per process: the budget is shared by this process's VMs only */
	s->default_conns = uvsockd_fd_budget_per_vm(n);
	s->nofile = nofile_now();
	for (unsigned i = 0; i < n; i++) {
		uint32_t m = cfg->vms[idx ? idx[i] : i].max_conns;

		explicit_conns += m;
		n_explicit += m != 0;
	}
	/* The VMs without max-conns= share what those with it leave. */
	if (n_explicit && n_explicit < n) {
		uint64_t taken = explicit_conns + (uint64_t)n_explicit * UVSOCKD_FDS_PER_VM;

		s->default_conns = s->nofile > taken ?
			MAX(1u, uvsockd_host_conn_budget(s->nofile - taken, n - n_explicit)) : 1;
	}
	if (cfg->capture_path[0]) {
		struct ops_pcap_opts po = { 0 };

		r = ops_pcap_open_path(cfg->capture_path, &po, &s->capture);
		if (r < 0) {
			log_error("--capture %s: %s", cfg->capture_path, strerror(-r));
			return r;
		}
		log_info("capturing every VM into %s", cfg->capture_path);
	}
	for (unsigned i = 0; i < n; i++) {
		r = vm_create(s, &cfg->vms[idx ? idx[i] : i], true, err, sizeof(err));
		if (r < 0) {
			log_error("%s", err);
			return r;
		}
	}
	return 0;
}

static int vm_set_start(struct vm_set *s)
{
	char err[128];

	for (unsigned i = 0; i < s->n; i++) {
		if (vm_thread_start(s->vms[i], err, sizeof(err)) < 0) {
			log_error("%s", err);
			return -EAGAIN;
		}
	}
	s->threads = true;
	return 0;
}

/* Stops and joins the threads, frees the devices; returns 1 if a VM's event loop failed. */
static int vm_set_destroy(struct vm_set *s)
{
	int rc = 0;

	/* Every thread told first, so that they end together. */
	for (unsigned i = 0; i < s->n; i++)
		if (s->vms[i]->started)
			vsock_dev_stop(s->vms[i]->core);
	for (unsigned i = 0; i < s->n; i++)
		if (vm_free(s, s->vms[i]))
			rc = 1;
	ops_pcap_unref(s->capture);
	free(s->vms);
	pthread_mutex_destroy(&s->lock);
	return rc;
}

int vm_set_run(const struct uvsockd_config *cfg, const unsigned *idx, unsigned n,
	       const sigset_t *sigs, const struct vm_set_hooks *hooks)
{
	static const struct vm_set_hooks none;
	struct vm_set s = { .runtime = idx == NULL, .no_dgram = cfg->no_dgram,
			    .dgram_max = cfg->dgram_max };
	bool hooked = false;
	int sig = 0, rc = 1;

	if (!hooks)
		hooks = &none;
	pthread_mutex_init(&s.lock, NULL);
	(void)uvsockd_control_path(cfg, s.control, sizeof(s.control));
	if (takeover_fd >= 0) {
		if (vm_set_take_over(&s, cfg) < 0)
			goto out;
	} else if (vm_set_create(&s, cfg, idx, idx ? n : cfg->n_vms) < 0) {
		goto out;
	}
	hooked = true;
	if (hooks->ready && hooks->ready(&s, hooks->arg) < 0)
		goto out;
	if (takeover_fd >= 0 ? vm_set_take_over_start(&s) < 0 : vm_set_start(&s) < 0)
		goto out;
	for (;;) {
		siginfo_t si;

		sig = sigwaitinfo(sigs, &si);
		if (sig < 0)
			continue;
		if (hooks->signal && hooks->signal(&si, hooks->arg))
			continue;
		if (sig == SIGUSR2) {
			vm_set_upgrade_signal(&s);
			continue;
		}
		if (sig != SIGHUP)
			break;
		vm_set_reload(&s, cfg);
	}
	log_info("signal %d: shutting down", sig);
	rc = 0;
out:
	/* The control socket (or the worker's responder) reads the devices: stop it first. */
	if (hooked && hooks->stopping)
		hooks->stopping(&s, hooks->arg);
	s.ctl = NULL;
	if (vm_set_destroy(&s))
		rc = 1;
	return rc;
}
