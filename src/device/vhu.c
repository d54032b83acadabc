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
 * uvsockd"). Everything runs on the device's thread.
 */
#include "device/vhu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/vsock_dev.h"
#include "ops/vmlog.h"
#include "util/log.h"
#include "util/loop.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/uds.h"
#include "uvsock/device.h"
#include "vhost_user/backend.h"

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
};

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

	if (info->kick_fd < 0) {
		log_error("%s: ring %u without a kick eventfd (polling mode) is not supported",
			  vsock_dev_name(v->d), qidx);
		return -EOPNOTSUPP;
	}
	/* The back-end's map (borrowed until mem_table_changing); features as acked. */
	dev_borrow_mem(v->d, info->mem, info->features);
	return uvsock_dev_queue_start(api(v), qidx, &q);
}

static uint16_t vq_stop(void *opaque, unsigned qidx)
{
	uint16_t idx = 0;

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

static const struct vhu_backend_ops vhu_ops = {
	.queue_start = vq_start,
	.queue_stop = vq_stop,
	.call_fd_changed = vq_call_changed,
	.features_set = vq_features_set,
	.mem_table_changing = vq_mem_changing,
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

/* What this device's back-end offers and accepts (a new VMM's, or a restored one's). */
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
	*ret = v;
	return 0;
}

void dev_vhu_free(struct dev_vhu *v)
{
	if (!v)
		return;
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

int dev_vhu_go(struct dev_vhu *v)
{
	return dev_call(v->d, do_glue_resume, v);
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
	if (e < 0)
		goto fail;
	*ret = v;
	return 0;

fail:
	dev_vhu_free(v);
	return e;
}
