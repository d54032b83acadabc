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
 * activation, uvsockd --fd), listening or already connected to the VMM. Everything runs on the
 * device's thread.
 */
#include "device/vhu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "device/vhu_state.h"
#include "device/vsock_dev.h"
#include "ops/vmlog.h"
#include "util/log.h"
#include "util/loop.h"
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
	/* VHOST_USER_PROTOCOL_F_DEVICE_STATE: the state transfer (vhu_state.h). */
	struct vhu_state *st;
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

/* Serves the VMM connected on s (owned from here on). Returns 0 or -errno (s closed). */
static int vmm_attach(struct dev_vhu *v, int s)
{
	struct vhu_backend_config cfg;
	int r;

	vhu_backend_config_init(&cfg);
	/* What the device implements (event-idx switch), and dirty logging, which is the vring
	 * module's (src/vring/dirty_log.h) and needs nothing of the device. */
	cfg.features &= uvsock_dev_features() | VHU_BIT(VHU_F_LOG_ALL);
	if (dev_dgram_offered(v->d))
		cfg.features |= VHU_BIT(VHU_VSOCK_F_DGRAM);
	cfg.guest_cid = vsock_dev_guest_cid(v->d);
	cfg.queue_size_max = v->queue_size_max;
	cfg.name = vsock_dev_name(v->d);
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
	v->st = vhu_state_new(d);
	if (!v->st) {
		free(v);
		return -ENOMEM;
	}
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
		(void)uds_unlink_owned(v->path, &v->listener); /* before the close: see uds.h */
		close(v->listener.fd);
	}
	vhu_state_free(v->st);
	free(v);
}
