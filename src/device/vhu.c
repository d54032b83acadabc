/* SPDX-License-Identifier: MIT */
/*
 * The vhost-user glue of a device (vhu.h): listens on the vhost-user socket, accepts one VMM at a
 * time into a vhost-user back-end (src/vhost_user/backend.h), and turns the back-end's callbacks
 * into calls of the public device API (<uvsock/device.h>): queue_start -> uvsock_dev_queue_start
 * (ring addresses already translated: UVSOCK_DEV_QUEUE_HOST_ADDRS), queue_stop ->
 * uvsock_dev_queue_stop, call_fd_changed -> uvsock_dev_set_call_fd, features_set ->
 * uvsock_dev_set_features, and a VMM disconnect -> uvsock_dev_reset. What the public API lacks
 * for this (the loop, the borrowed memory map, the VMM state, the end of a message) comes from
 * the device core through vhu.h. The socket may be inherited (uds_adopt: systemd socket
 * activation, uvsockd --fd), listening or already connected to the VMM. For uvsockd's live
 * upgrade it also saves a VM whole (its listener, the back-end, the device) at a consistent point
 * of the device's thread and restores it in the new process (docs/upgrade.md, "A VM of
 * uvsockd"). Crash survival (vhu_keep.h, its section at the end): with a keeper, each VM's
 * configuration and connections are handed to it as they change, and a record kept by a
 * process that died is adopted in place of waiting for a VMM. The state transfer of
 * VHOST_USER_PROTOCOL_F_DEVICE_STATE is vhu_state.c's. Everything runs on the device's thread.
 */
#include "device/vhu.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/evq.h"
#include "device/vhu_keep.h"
#include "device/vhu_state.h"
#include "device/vsock_dev.h"
#include "ops/vmlog.h"
#include "util/log.h"
#include "util/loop.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/time.h"
#include "util/uds.h"
#include "uvsock/device.h"
#include "vhost_user/backend.h"
#include "vsock/engine.h"

struct dev_vhu {
	struct vsock_dev *d;
	uint32_t queue_size_max;
	char path[108];
	struct uds_listener listener;  /* the vhost-user socket; fd -1: an inherited connection */
	struct loop_watch *listen_w;
	struct vhu_backend *vhu;       /* the VMM's connection, or NULL */
	struct loop_watch *vhu_w;
	/* The connection's first vhost-user message came, and "VMM connected" was logged. Until
	 * then it may be another uvsockd's liveness probe (util/uds.c, uds_probe_owner: connect
	 * and close) or a host program on the wrong socket: neither is logged as a VMM. */
	bool announced;
	/* The VM went to another process (upgrade.c): its socket file is that one's, never
	 * removed here. */
	bool given;
	/* Crash survival (vhu_keep.h): the keeper holds a record of this VM; when its list of
	 * connections was last written (ns), and the timer of a write put off. */
	bool kept;
	uint64_t conns_kept_ns;
	struct loop_timer *keep_timer;
	/* VHOST_USER_PROTOCOL_F_DEVICE_STATE: the state transfer (vhu_state.h). */
	struct vhu_state *st;
};

static void keep_update(struct dev_vhu *v);
static void keep_changed(void *arg);
static int adopt_offered(struct dev_vhu *v);
static int keep_init(struct dev_vhu *v);
static void keep_fini(struct dev_vhu *v);

static struct uvsock_dev *api(struct dev_vhu *v)
{
	return dev_api(v->d);
}

/* ---- the back-end's callbacks: the device API ------------------------------------------------ */

static int vq_start(void *opaque, unsigned qidx, const struct vhu_vring_info *info)
{
	struct dev_vhu *v = opaque;
	struct uvsock_dev_queue q = {
		.size = sizeof(q),
		.num = info->num,
		.desc_addr = (uint64_t)(uintptr_t)info->desc,
		.avail_addr = (uint64_t)(uintptr_t)info->avail,
		.used_addr = (uint64_t)(uintptr_t)info->used,
		.last_avail_idx = info->last_avail_idx,
		.kick_fd = info->kick_fd,
		.call_fd = info->call_fd,
		.flags = UVSOCK_DEV_QUEUE_HOST_ADDRS,
	};
	int r;

	if (info->kick_fd < 0) {
		log_error("%s: ring %u without a kick eventfd (polling mode) is not supported",
			  vsock_dev_name(v->d), qidx);
		return -EOPNOTSUPP;
	}
	/* The back-end's map (borrowed until mem_table_changing); features as acked. */
	dev_borrow_mem(v->d, info->mem, info->features);
	r = uvsock_dev_queue_start(api(v), qidx, &q);
	if (r == 0 && qidx == 1)
		vhu_state_tx_started(v->st);
	if (r == 0 && qidx == 2)
		vhu_state_evq_started(v->st);
	return r;
}

static uint16_t vq_stop(void *opaque, unsigned qidx)
{
	struct dev_vhu *v = opaque;
	uint16_t idx = 0;

	/* The connections end with this message (dev_message_done): a state saved after it must
	 * still name them. Only when the front-end may ask for the state. */
	if (qidx == 1 && v->vhu &&
	    (vhu_backend_protocol_features(v->vhu) & VHU_BIT(VHU_PROTO_F_DEVICE_STATE)))
		vhu_state_tx_stopping(v->st, vhu_backend_features(v->vhu));
	(void)uvsock_dev_queue_stop(api(opaque), qidx, &idx);
	return idx;
}

static void vq_call_changed(void *opaque, unsigned qidx, int call_fd)
{
	(void)uvsock_dev_set_call_fd(api(opaque), qidx, call_fd);
}

static void vq_features_set(void *opaque, uint64_t features)
{
	/* PROTOCOL_FEATURES and other transport bits are vhost-user's business, not the device's. */
	(void)uvsock_dev_set_features(api(opaque), features & uvsock_dev_features());
}

static void vq_mem_changing(void *opaque)
{
	struct dev_vhu *v = opaque;

	/* Every ring was stopped by the back-end: no guest pointer is in use. */
	dev_drop_mem(v->d);
}

/* ---- the device state (VHOST_USER_PROTOCOL_F_DEVICE_STATE, vhu_state.c) ----------------------- */

static int vq_state_save(void *opaque, int fd)
{
	struct dev_vhu *v = opaque;

	return vhu_state_save(v->st, fd, vhu_backend_features(v->vhu));
}

static int vq_state_load(void *opaque, int fd)
{
	return vhu_state_load(((struct dev_vhu *)opaque)->st, fd);
}

static int vq_state_check(void *opaque)
{
	struct dev_vhu *v = opaque;

	return vhu_state_check(v->st, vhu_backend_features(v->vhu));
}

static const struct vhu_backend_ops vhu_ops = {
	.queue_start = vq_start,
	.queue_stop = vq_stop,
	.call_fd_changed = vq_call_changed,
	.features_set = vq_features_set,
	.mem_table_changing = vq_mem_changing,
	.state_save = vq_state_save,
	.state_load = vq_state_load,
	.state_check = vq_state_check,
};

/* ---- the VMM connection ---------------------------------------------------------------------- */

static void vmm_disconnect(struct dev_vhu *v, int why)
{
	if (!v->vhu)
		return;
	dev_set_vmm_state(v->d, false);
	/* Rate-limited per VM: a VMM that reconnects in a loop must not grow the log unbounded. */
	if (!v->announced && why == -ECONNRESET)
		log_vm_dev(LOG_LVL_DEBUG, vsock_dev_guest_cid(v->d),
			   "%s: a connection to %s closed before any vhost-user message (another "
			   "uvsockd's liveness probe, or not a VMM)", vsock_dev_name(v->d), v->path);
	else if (why == -ECONNRESET)
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(v->d), "%s: VMM disconnected",
			   vsock_dev_name(v->d));
	else
		log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(v->d), "%s: closing VMM connection: %s",
			   vsock_dev_name(v->d), strerror(-why));
	loop_watch_del(v->vhu_w);
	v->vhu_w = NULL;
	vhu_backend_free(v->vhu); /* stops both rings through vq_stop */
	v->vhu = NULL;
	keep_update(v); /* the keeper's copy of the connection must close too */
	vhu_state_reset(v->st);
	(void)uvsock_dev_reset(api(v));
	/* Serve the socket again: the next VMM (a restarted VM) is accepted by vhu_listen_cb. */
	if (v->listen_w)
		(void)loop_watch_mod(v->listen_w, EPOLLIN);
	else
		log_warn("%s: the inherited vhost-user connection ended; this VM cannot attach "
			 "again until uvsockd is restarted", vsock_dev_name(v->d));
}

static void vhu_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct dev_vhu *v = opaque;
	int r;

	(void)l;
	(void)events;
	if (!v->announced) {
		char head[8];
		ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);

		/* The two sockets swapped: a host program's "CONNECT <port>" line on this one. */
		if (n == (ssize_t)sizeof(head) && strncasecmp(head, "CONNECT", 7) == 0 &&
		    (head[7] == ' ' || head[7] == '\t')) {
			log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(v->d),
				   "%s: a host program wrote a CONNECT line to the vhost-user socket "
				   "%s; host programs connect to the VM's uds-path (%s)",
				   vsock_dev_name(v->d), v->path, vsock_dev_uds_path(v->d));
			vmm_disconnect(v, -ECONNRESET);
			return;
		}
	}
	r = vhu_backend_process(v->vhu);
	if (r < 0) {
		vmm_disconnect(v, r);
		return;
	}
	if (!v->announced) {
		v->announced = true;
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(v->d), "%s: VMM connected",
			   vsock_dev_name(v->d));
	}
	dev_message_done(v->d);
}

/* What this device's back-end offers and accepts (a new VMM's, a restored or an adopted one's). */
static void backend_config(const struct dev_vhu *v, struct vhu_backend_config *cfg)
{
	vhu_backend_config_init(cfg);
	/* What the device implements (event-idx switch), and dirty logging, which is the vring
	 * module's (src/vring/dirty_log.h) and needs nothing of the device. */
	cfg->features &= uvsock_dev_features() | VHU_BIT(VHU_F_LOG_ALL);
	if (dev_dgram_offered(v->d))
		cfg->features |= VHU_BIT(VHU_VSOCK_F_DGRAM);
	cfg->guest_cid = vsock_dev_guest_cid(v->d);
	cfg->queue_size_max = v->queue_size_max;
	cfg->name = vsock_dev_name(v->d);
}

/* Serves the VMM connected on s (owned from here on). Returns 0 or -errno (s closed). */
static int vmm_attach(struct dev_vhu *v, int s)
{
	struct vhu_backend_config cfg;
	int r;

	backend_config(v, &cfg);
	r = vhu_backend_new(s, &cfg, &vhu_ops, v, &v->vhu);
	if (r < 0) {
		log_vm_dev(LOG_LVL_ERROR, cfg.guest_cid, "%s: vhost-user set-up failed: %s", cfg.name,
			   strerror(-r));
		close(s);
		return r;
	}
	r = loop_watch_add(dev_loop(v->d), vhu_backend_fd(v->vhu), EPOLLIN, vhu_cb, v, &v->vhu_w);
	if (r < 0) {
		vhu_backend_free(v->vhu);
		v->vhu = NULL;
		return r;
	}
	vhu_backend_set_change_hook(v->vhu, keep_changed, v);
	/* One VMM at a time: further connections wait in the backlog. */
	if (v->listen_w)
		(void)loop_watch_mod(v->listen_w, 0);
	dev_set_vmm_state(v->d, true);
	/* "VMM connected" waits for its first message (vhu_cb). */
	v->announced = false;
	log_vm_dev(LOG_LVL_DEBUG, cfg.guest_cid, "%s: connection on %s", cfg.name, v->path);
	return 0;
}

static void vhu_listen_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct dev_vhu *v = opaque;
	int s;

	(void)l;
	(void)events;
	s = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
	if (s < 0)
		return;
	if (v->vhu) {
		close(s);
		return;
	}
	(void)vmm_attach(v, s);
}

/*
 * An inherited socket adopted for path (uds.h): a listener goes through uds_listen like a bound
 * one; a connected one (QEMU's --fd convention, a socketpair end) is the VMM itself. Returns 1
 * if a connection was attached, 0 to listen, or -errno.
 */
static int take_inherited(struct dev_vhu *v)
{
	bool listening = false;
	int fd = uds_take_adopted(v->path), r;

	if (fd < 0)
		return 0;
	r = uds_check_fd(fd, SOCK_STREAM, &listening);
	if (r == 0 && listening) {
		r = uds_adopt(v->path, fd); /* back for uds_listen */
		if (r == 0)
			return 0;
	}
	if (r == 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		r = -errno;
	if (r < 0) {
		close(fd);
		return r;
	}
	v->listener.fd = -1;
	v->listener.flags = UDS_INHERITED;
	r = vmm_attach(v, fd);
	return r < 0 ? r : 1;
}

/* ---- life ------------------------------------------------------------------------------------ */

int dev_vhu_new(struct vsock_dev *d, const char *path, uint32_t queue_size_max,
		struct dev_vhu **ret)
{
	struct dev_vhu *v;
	int r;

	if (strlen(path) >= sizeof(v->path))
		return -ENAMETOOLONG;
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->d = d;
	v->queue_size_max = queue_size_max ? queue_size_max : 1024;
	strcpy(v->path, path);
	v->listener.fd = -1;
	v->st = vhu_state_new(d);
	if (!v->st) {
		free(v);
		return -ENOMEM;
	}
	r = keep_init(v);
	if (r == 0)
		r = take_inherited(v);
	if (r == 1) {
		log_info("%s: serving the inherited vhost-user connection (%s)", vsock_dev_name(d),
			 v->path);
		*ret = v;
		return 0;
	}
	if (r == 0)
		r = uds_listen(v->path, SOCK_STREAM, 128, 0, &v->listener);
	if (r < 0) {
		if (r == -EADDRINUSE)
			log_error("%s: cannot listen on %s: another process serves it",
				  vsock_dev_name(d), v->path);
		else
			log_error("%s: cannot listen on %s: %s", vsock_dev_name(d), v->path,
				  strerror(-r));
		keep_fini(v);
		vhu_state_free(v->st);
		free(v);
		return r;
	}
	if (v->listener.flags & UDS_REPLACED_STALE)
		log_info("%s: replaced the stale socket file %s", vsock_dev_name(d), v->path);
	r = loop_watch_add(dev_loop(d), v->listener.fd, EPOLLIN, vhu_listen_cb, v,
			   &v->listen_w);
	if (r < 0) {
		dev_vhu_free(v);
		return r;
	}
	(void)adopt_offered(v);
	*ret = v;
	return 0;
}

void dev_vhu_free(struct dev_vhu *v)
{
	if (!v)
		return;
	keep_fini(v);
	if (v->vhu) {
		loop_watch_del(v->vhu_w);
		vhu_backend_free(v->vhu);
		v->vhu = NULL;
	}
	if (v->listener.fd >= 0) {
		loop_watch_del(v->listen_w);
		if (!v->given)
			(void)uds_unlink_owned(v->path, &v->listener); /* before the close: uds.h */
		close(v->listener.fd);
	}
	vhu_state_free(v->st);
	free(v);
}

/* ---- upgrade: the glue's part of uvsockd's VM record (docs/upgrade.md, "A VM of uvsockd") --- */

enum {
	VG_LISTENER = 1, /* the vhost-user listening socket: fd (1), device (2), inode (3), flags (4) */
	VG_FLAGS = 2,    /* VG_F_* */
	VG_BACKEND = 3,  /* the back-end's part (vhost_user/backend.c), while a VMM is connected */
	VG_DEVICE = 4,   /* the device's part (device.c) */
};
enum {
	VGL_FD = 1,
	VGL_DEV = 2,
	VGL_INO = 3,
	VGL_FLAGS = 4,
};
#define VG_F_ANNOUNCED 1u  /* the VMM's first message came (no second "VMM connected") */
#define VG_F_INHERITED 2u  /* an inherited VMM connection, no listener (--fd) */
#define VG_F_ALL (VG_F_ANNOUNCED | VG_F_INHERITED)

static const struct rec_field glue_fields[] = {
	{ VG_LISTENER, REC_LIST, false, "vhost-user listener" },
	{ VG_FLAGS, REC_U32, true, "glue flags" },
	{ VG_BACKEND, REC_LIST, false, "vhost-user back-end" },
	{ VG_DEVICE, REC_LIST, true, "device" },
};
static const struct rec_field glue_lst_fields[] = {
	{ VGL_FD, REC_FD, true, "fd" },
	{ VGL_DEV, REC_U64, true, "device" },
	{ VGL_INO, REC_U64, true, "inode" },
	{ VGL_FLAGS, REC_U32, true, "flags" },
};

/* The glue's watches as its state asks: the VMM's connection, the listener while none is. */
static int watch_again(struct dev_vhu *v)
{
	int r = 0;

	if (v->vhu && !v->vhu_w)
		r = loop_watch_add(dev_loop(v->d), vhu_backend_fd(v->vhu), EPOLLIN, vhu_cb, v,
				   &v->vhu_w);
	if (r == 0 && v->listener.fd >= 0 && !v->listen_w)
		r = loop_watch_add(dev_loop(v->d), v->listener.fd, v->vhu ? 0 : EPOLLIN,
				   vhu_listen_cb, v, &v->listen_w);
	return r;
}

/* Serves again after a save (the hand-over failed) or a restore (go): device thread. */
static int serve_again(struct dev_vhu *v)
{
	int r = 0;

	if (v->vhu) {
		/* The rings start before the thaw: a thawed device whose RX ring is stopped would
		 * drop what waits in its sibling inbox (rx_park). */
		r = vhu_backend_resume(v->vhu);
		if (r == 0)
			dev_vmm_restored(v->d);
	}
	vsock_dev_hand_over(v->d, false);
	v->given = false;
	if (vsock_dev_frozen(v->d)) {
		int t = vsock_dev_thaw(v->d);

		if (t < 0 && r == 0)
			r = t;
	}
	if (r == 0)
		r = watch_again(v);
	if (r < 0 && v->vhu) {
		vmm_disconnect(v, r);
		r = watch_again(v);
	}
	dev_signal_calls(v->d);
	return r;
}

struct glue_save {
	struct dev_vhu *v;
	struct rec_writer *w;
	struct dev_vhu_saved *out;
};

static int do_glue_stop(struct vsock_dev *d, void *arg)
{
	struct glue_save *a = arg;
	struct dev_vhu *v = a->v;
	struct rec_writer *w = a->w;
	int r = 0;

	a->out->stop_ns = loop_now_ns();
	/* The consistent point: a call runs between two loop callbacks, so no message is half
	 * handled and no chain half processed; from here the VMM's next message and new VMM
	 * connections wait in their sockets. */
	loop_watch_del(v->vhu_w);
	v->vhu_w = NULL;
	loop_watch_del(v->listen_w);
	v->listen_w = NULL;
	if (v->listener.fd >= 0) {
		rec_begin(w, VG_LISTENER);
		rec_put_fd(w, VGL_FD, v->listener.fd);
		rec_put_u64(w, VGL_DEV, (uint64_t)v->listener.dev);
		rec_put_u64(w, VGL_INO, (uint64_t)v->listener.ino);
		rec_put_u32(w, VGL_FLAGS, v->listener.flags & UDS_INHERITED);
		rec_end(w);
	}
	rec_put_u32(w, VG_FLAGS, (v->announced ? VG_F_ANNOUNCED : 0) |
				       (v->listener.fd < 0 ? VG_F_INHERITED : 0));
	if (v->vhu) {
		rec_begin(w, VG_BACKEND);
		r = vhu_backend_save(v->vhu, w); /* stops the rings: the device's queue_stop */
		rec_end(w);
	}
	vsock_dev_freeze(d);
	if (r == 0 && w->err)
		r = w->err;
	if (r < 0)
		(void)serve_again(v); /* nothing was sent: the VM goes on */
	return r;
}

static int do_glue_save_device(struct vsock_dev *d, void *arg)
{
	struct glue_save *a = arg;
	struct rec_writer *w = a->w;
	struct vsock_dev_status st;
	int r;

	rec_begin(w, VG_DEVICE);
	r = vsock_dev_save(d, w);
	rec_end(w);
	if (r == 0 && w->err)
		r = w->err;
	vsock_dev_get_status(d, &st);
	a->out->conns = st.have_engine && st.eng.socks_open > st.listeners ?
		(unsigned)(st.eng.socks_open - st.listeners) : 0;
	return r;
}

int dev_vhu_stop(struct dev_vhu *v, struct rec_writer *w, struct dev_vhu_saved *ret)
{
	struct glue_save a = { .v = v, .w = w, .out = ret };

	return dev_call(v->d, do_glue_stop, &a);
}

int dev_vhu_save_device(struct dev_vhu *v, struct rec_writer *w, struct dev_vhu_saved *ret)
{
	struct glue_save a = { .v = v, .w = w, .out = ret };

	return dev_call(v->d, do_glue_save_device, &a);
}

static int do_glue_resume(struct vsock_dev *d, void *arg)
{
	(void)d;
	return serve_again(arg);
}

int dev_vhu_resume(struct dev_vhu *v)
{
	int r = dev_call(v->d, do_glue_resume, v);

	log_info("%s: serving again (the upgrade did not take it)", vsock_dev_name(v->d));
	return r;
}

void dev_vhu_given(struct dev_vhu *v)
{
	v->given = true;
	vsock_dev_hand_over(v->d, true);
}

/* go: serving here; with a keeper (an upgraded --isolate worker), its first record of the VM
 * replaces what the worker before it kept. */
static int do_glue_go(struct vsock_dev *d, void *arg)
{
	struct dev_vhu *v = arg;
	int r;

	(void)d;
	r = serve_again(v);
	keep_update(v);
	return r;
}

int dev_vhu_go(struct dev_vhu *v)
{
	return dev_call(v->d, do_glue_go, v);
}

int dev_vhu_restore(struct vsock_dev *d, struct rec_reader *r, const char *path,
		    uint32_t queue_size_max, struct dev_vhu **ret)
{
	struct rec_val gv[ARRAY_SIZE(glue_fields)];
	struct vhu_backend_config cfg;
	struct rec_reader sub;
	struct dev_vhu *v;
	int e;

	if (strlen(path) >= sizeof(v->path))
		return rec_fail(r->doc, -EBADMSG, "vhost-user socket path too long");
	e = rec_scan(r, glue_fields, ARRAY_SIZE(glue_fields), gv);
	if (e < 0)
		return e;
	if (gv[1].u & ~(uint64_t)VG_F_ALL)
		return rec_fail(r->doc, -EBADMSG, "glue flags %#llx", (unsigned long long)gv[1].u);
	if (!!(gv[1].u & VG_F_INHERITED) == gv[0].present)
		return rec_fail(r->doc, -EBADMSG, "a vhost-user listener %s",
				gv[0].present ? "beside an inherited connection" : "missing");
	/* An inherited connection that ended leaves a VM with neither: it stays detached, as
	 * in the old process. */
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->d = d;
	v->st = vhu_state_new(d); /* no state transfer runs across an upgrade: a new one */
	if (!v->st) {
		free(v);
		return -ENOMEM;
	}
	v->queue_size_max = queue_size_max ? queue_size_max : 1024;
	strcpy(v->path, path);
	v->listener.fd = -1;
	v->listener.flags = (gv[1].u & VG_F_INHERITED) ? UDS_INHERITED : 0;
	v->announced = gv[1].u & VG_F_ANNOUNCED;
	v->given = true; /* until go: the socket file is the old process's */
	if (gv[0].present) {
		struct rec_val lv[ARRAY_SIZE(glue_lst_fields)];

		e = rec_enter(r, &gv[0].it, "vhost-user listener", &sub);
		if (e == 0)
			e = rec_scan(&sub, glue_lst_fields, ARRAY_SIZE(glue_lst_fields), lv);
		if (e == 0 && (lv[3].u & ~(uint64_t)UDS_INHERITED))
			e = rec_fail(r->doc, -EBADMSG, "listener flags %#llx",
				     (unsigned long long)lv[3].u);
		if (e == 0)
			e = dev_rec_sock_fd(&sub, (int)lv[0].u, SOCK_STREAM, true, &v->listener.fd);
		if (e < 0)
			goto fail;
		v->listener.dev = (dev_t)lv[1].u;
		v->listener.ino = (ino_t)lv[2].u;
		v->listener.flags = (unsigned)lv[3].u;
	}
	if (gv[2].present) {
		backend_config(v, &cfg);
		e = rec_enter(r, &gv[2].it, "vhost-user back-end", &sub);
		if (e == 0)
			e = vhu_backend_restore(&sub, &cfg, &vhu_ops, v, &v->vhu);
		if (e < 0)
			goto fail;
	}
	e = rec_enter(r, &gv[3].it, "device", &sub);
	if (e == 0)
		e = vsock_dev_restore_at(d, &sub);
	/* With a keeper (an upgraded --isolate worker), as vmm_attach does for a new VMM. */
	if (e == 0)
		e = keep_init(v);
	if (e < 0)
		goto fail;
	if (v->vhu)
		vhu_backend_set_change_hook(v->vhu, keep_changed, v);
	*ret = v;
	return 0;

fail:
	dev_vhu_free(v);
	return e;
}
/* ---- crash survival (vhu_keep.h; docs/upgrade.md, "Crash survival") ------------------------ */

static struct {
	dev_vhu_keep_fn fn;
	void *arg;
} keeper;

/* Records kept by the previous process, offered to the devices made next (by CID). */
struct keep_offer {
	uint32_t cid;
	int memfd;
	int *fds;
	size_t nfds;
	struct keep_offer *next;
};
static pthread_mutex_t offers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct keep_offer *offers;

void dev_vhu_set_keeper(dev_vhu_keep_fn fn, void *arg)
{
	keeper.fn = fn;
	keeper.arg = arg;
}

/* Hands the keeper v's record: the back-end's configuration, or (no VMM) a drop. */
static void keep_update(struct dev_vhu *v)
{
	uint32_t cid = vsock_dev_guest_cid(v->d);
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;
	bool have = false;

	if (!keeper.fn || (!v->vhu && !v->kept))
		return;
	rec_writer_init(&w, REC_KIND_CRASH, VHU_KEEP_VERSION);
	rec_put_u32(&w, VHU_KEEP_T_CID, cid);
	if (v->vhu) {
		/* The back-end's first fd is its connection (vhu_backend_snapshot). */
		rec_put_u32(&w, VHU_KEEP_T_CONN, w.nfds);
		rec_begin(&w, VHU_KEEP_T_BACKEND);
		have = vhu_backend_snapshot(v->vhu, &w) == 0;
		rec_end(&w);
		rec_begin(&w, VHU_KEEP_T_CONNS);
		(void)dev_save_conns(v->d, &w); /* its errors stay in w */
		rec_end(&w);
		v->conns_kept_ns = loop_now_ns();
		loop_timer_disarm(v->keep_timer);
		if (!have) {
			/* A failed connection is closed right after: keep nothing of it. */
			rec_writer_free(&w);
			rec_writer_init(&w, REC_KIND_CRASH, VHU_KEEP_VERSION);
			rec_put_u32(&w, VHU_KEEP_T_CID, cid);
		}
	}
	if (rec_writer_finish(&w, &buf, &len) < 0) {
		log_warn("%s: cannot write the crash-survival record: out of memory",
			 vsock_dev_name(v->d));
	} else {
		keeper.fn(keeper.arg, cid, buf, len, w.fds, w.nfds);
		v->kept = have;
	}
	rec_writer_free(&w);
}

/* Undoes keep_init. */
static void keep_fini(struct dev_vhu *v)
{
	if (!v->keep_timer)
		return;
	dev_set_conns_hook(v->d, NULL, NULL);
	loop_timer_free(v->keep_timer);
	v->keep_timer = NULL;
}

/* The back-end's change hook: the keeper learns each change before the VMM has its reply. */
static void keep_changed(void *arg)
{
	keep_update(arg);
}

/* The device's connections changed: kept now, or at most VHU_KEEP_CONNS_MS after the last. */
static void keep_conns_changed(void *arg)
{
	struct dev_vhu *v = arg;
	uint64_t due = v->conns_kept_ns + VHU_KEEP_CONNS_MS * NS_PER_MS;

	if (!v->vhu || loop_timer_armed(v->keep_timer))
		return;
	if (loop_now_ns() >= due)
		keep_update(v);
	else
		loop_timer_arm(v->keep_timer, due);
}

static void keep_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	(void)l;
	(void)t;
	keep_update(opaque);
}

/* With a keeper: the timer and the device's hook that keep the list of connections. */
static int keep_init(struct dev_vhu *v)
{
	int r;

	if (!keeper.fn)
		return 0;
	r = loop_timer_new(dev_loop(v->d), keep_timer_cb, v, &v->keep_timer);
	if (r < 0)
		return r;
	dev_set_conns_hook(v->d, keep_conns_changed, v);
	return 0;
}

static const struct rec_field keep_fields[] = {
	{ VHU_KEEP_T_CID, REC_U32, true, "guest CID" },
	{ VHU_KEEP_T_BACKEND, REC_LIST, false, "vhost-user back-end" },
	{ VHU_KEEP_T_CONN, REC_U32, false, "connection" },
	{ VHU_KEEP_T_CONNS, REC_LIST, false, "connections" },
};

/* Opens a record in d and reads its top level into v[ARRAY_SIZE(keep_fields)]. */
static int keep_open(struct rec_doc *d, struct rec_val *v, const uint8_t *buf, size_t len,
		     const int *fds, size_t nfds)
{
	struct rec_reader r;
	int e;

	if (nfds > VHU_KEEP_MAX_FDS)
		return -E2BIG;
	e = rec_open(d, buf, len, REC_KIND_CRASH, VHU_KEEP_VERSION, VHU_KEEP_VERSION, fds, nfds);
	if (e < 0)
		return e;
	rec_root(d, &r, "crash record");
	e = rec_scan(&r, keep_fields, ARRAY_SIZE(keep_fields), v);
	if (e == 0 && v[1].present != v[2].present)
		e = rec_fail(d, -EBADMSG, "crash record: back-end and connection go together");
	if (e == 0 && v[2].present && v[2].u >= nfds)
		e = rec_fail(d, -EBADMSG, "crash record: connection fd %llu of %zu",
			     (unsigned long long)v[2].u, nfds);
	if (e < 0)
		rec_doc_fini(d);
	return e;
}

int dev_vhu_keep_peek(const uint8_t *buf, size_t len, const int *fds, size_t nfds,
		      uint32_t *ret_cid, int *ret_conn, size_t *ret_nconns)
{
	struct rec_val v[ARRAY_SIZE(keep_fields)] = { 0 };
	struct rec_reader root, sub;
	struct rec_item it;
	struct rec_doc d;
	size_t n = 0;
	int e = keep_open(&d, v, buf, len, fds, nfds);

	if (e < 0)
		return e;
	*ret_cid = (uint32_t)v[0].u;
	*ret_conn = v[2].present ? fds[v[2].u] : -1;
	/* Counted, not read: each one is checked where it is used (adopt_restore). */
	rec_root(&d, &root, "crash record");
	if (v[3].present && rec_enter(&root, &v[3].it, "connections", &sub) == 0)
		while (rec_next(&sub, &it) > 0)
			n++;
	if (ret_nconns)
		*ret_nconns = n;
	rec_doc_fini(&d);
	return 0;
}

static void offer_free(struct keep_offer *o)
{
	close(o->memfd);
	for (size_t i = 0; i < o->nfds; i++)
		close(o->fds[i]);
	free(o->fds);
	free(o);
}

int dev_vhu_adopt_offer(int memfd, int *fds, size_t nfds)
{
	struct keep_offer *o = calloc(1, sizeof(*o));
	const uint8_t *buf = NULL;
	size_t len = 0;
	int conn = -1, e = -ENOMEM;

	if (o) {
		*o = (struct keep_offer){ .memfd = memfd, .fds = fds, .nfds = nfds };
		e = rec_map_fd(memfd, &buf, &len);
	}
	if (e == 0) {
		e = dev_vhu_keep_peek(buf, len, fds, nfds, &o->cid, &conn, NULL);
		rec_unmap(buf, len);
	}
	if (e == 0 && conn < 0)
		e = -ENOENT; /* a drop: nothing to adopt */
	if (e < 0) {
		if (o) {
			offer_free(o);
		} else {
			close(memfd);
			for (size_t i = 0; i < nfds; i++)
				close(fds[i]);
			free(fds);
		}
		return e;
	}
	pthread_mutex_lock(&offers_lock);
	o->next = offers;
	offers = o;
	pthread_mutex_unlock(&offers_lock);
	return 0;
}

void dev_vhu_adopt_clear(void)
{
	pthread_mutex_lock(&offers_lock);
	while (offers) {
		struct keep_offer *o = offers;

		offers = o->next;
		offer_free(o);
	}
	pthread_mutex_unlock(&offers_lock);
}

/*
 * Restores o's back-end into v (frozen: nothing ran yet) and reads its list of connections
 * into *conns / *nconns. Returns 0 or -errno, logged.
 */
static int adopt_restore(struct dev_vhu *v, const struct keep_offer *o,
			 struct vsock_conn_addr **conns, size_t *nconns)
{
	struct rec_val val[ARRAY_SIZE(keep_fields)] = { 0 };
	struct vhu_backend_config cfg;
	struct rec_reader root, sub;
	const uint8_t *buf;
	struct rec_doc doc;
	size_t len;
	int e;

	e = rec_map_fd(o->memfd, &buf, &len);
	if (e < 0) {
		log_error("%s: cannot map the kept record: %s", vsock_dev_name(v->d), strerror(-e));
		return e;
	}
	e = keep_open(&doc, val, buf, len, o->fds, o->nfds);
	if (e < 0) {
		log_error("%s: the kept record is refused: %s", vsock_dev_name(v->d), strerror(-e));
		rec_unmap(buf, len);
		return e;
	}
	backend_config(v, &cfg);
	rec_root(&doc, &root, "crash record");
	if (val[3].present) {
		e = rec_enter(&root, &val[3].it, "connections", &sub);
		if (e == 0)
			e = vsock_engine_read_conns(&sub, VHU_KEEP_MAX_CONNS, conns, nconns);
		rec_root(&doc, &root, "crash record");
	}
	if (e == 0) {
		e = rec_enter(&root, &val[1].it, "vhost-user", &sub);
		if (e == 0)
			e = vhu_backend_restore(&sub, &cfg, &vhu_ops, v, &v->vhu);
	}
	if (e == 0 && (e = rec_check_fds_claimed(&doc)) < 0) {
		vhu_backend_free(v->vhu);
		v->vhu = NULL;
	}
	if (e < 0) {
		log_vm_dev(LOG_LVL_ERROR, cfg.guest_cid, "%s: cannot adopt the VMM after a crash: %s",
			   cfg.name, rec_error(&doc));
		free(*conns);
		*conns = NULL;
		*nconns = 0;
	}
	rec_doc_fini(&doc);
	rec_unmap(buf, len);
	return e;
}

/*
 * The previous process serving this VM died and its keeper kept the VMM's connection: serve it
 * again. The device is new (no connection survives); the guest learns that its connections are
 * gone from a TRANSPORT_RESET on the event queue where the back-end has it, and otherwise from
 * the RST each of its packets on an old connection gets. Runs before the device does.
 */
static int adopt_offered(struct dev_vhu *v)
{
	uint32_t cid = vsock_dev_guest_cid(v->d);
	struct keep_offer **pp, *o = NULL;
	struct vsock_conn_addr *conns = NULL;
	size_t nconns = 0, rst;
	bool evq;
	int e;

	pthread_mutex_lock(&offers_lock);
	for (pp = &offers; *pp; pp = &(*pp)->next)
		if ((*pp)->cid == cid) {
			o = *pp;
			*pp = o->next;
			break;
		}
	pthread_mutex_unlock(&offers_lock);
	if (!o)
		return 0;
	e = adopt_restore(v, o, &conns, &nconns);
	offer_free(o); /* the back-end has its own duplicates */
	if (e < 0) {
		v->kept = true;
		keep_update(v); /* a drop: the keeper closes its copies, the VMM sees the end */
		return e;
	}
	e = loop_watch_add(dev_loop(v->d), vhu_backend_fd(v->vhu), EPOLLIN, vhu_cb, v, &v->vhu_w);
	if (e == 0) {
		/* Pending until TX and the event queue run (evq.h); TX's used index 0 is a guest
		 * that never sent, with nothing to reset. */
		dev_evq_reset_needed(v->d);
		e = vhu_backend_resume_adopted(v->vhu);
	}
	if (e < 0) {
		log_vm_dev(LOG_LVL_ERROR, cid, "%s: cannot adopt the VMM after a crash: %s",
			   vsock_dev_name(v->d), v->vhu_w ? vhu_backend_error(v->vhu) : strerror(-e));
		v->kept = true;
		vmm_disconnect(v, e);
		free(conns);
		return e;
	}
	/*
	 * TX runs now, with a fresh engine. Where the event queue is ours, the pending
	 * TRANSPORT_RESET ends every connection of the guest (Linux: virtio_vsock_event_handle):
	 * RSTs would race it (the guest takes RX and events apart), and a reset event the guest
	 * took after an RST would end the guest's first new connection too. Otherwise (QEMU keeps
	 * the event queue) an RST for each kept connection; they go out with the first RX pass.
	 */
	evq = vhu_backend_queue_running(v->vhu, 2);
	rst = evq ? 0 : dev_reset_conns(v->d, conns, nconns);
	free(conns);
	(void)loop_watch_mod(v->listen_w, 0);
	dev_set_vmm_state(v->d, true);
	v->announced = true;
	v->kept = true;
	keep_update(v);
	vhu_backend_set_change_hook(v->vhu, keep_changed, v);
	if (evq)
		log_vm_dev(LOG_LVL_WARN, cid, "%s: adopted the VMM's vhost-user connection kept "
			   "across the crash of the previous process: the device starts afresh, the "
			   "guest's %zu connections end (the event queue's TRANSPORT_RESET ends them)",
			   vsock_dev_name(v->d), nconns);
	else
		log_vm_dev(LOG_LVL_WARN, cid, "%s: adopted the VMM's vhost-user connection kept "
			   "across the crash of the previous process: the device starts afresh, the "
			   "guest's connections end (%zu RSTs sent of %zu kept; the rest get theirs "
			   "when the guest sends on them)", vsock_dev_name(v->d), rst, nconns);
	return 0;
}
