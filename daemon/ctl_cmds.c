/* SPDX-License-Identifier: MIT */
/*
 * The control socket's commands and their JSON answers (the protocol of ctl.h): version, stats,
 * conns, capture start|stop|status, vm-add, vm-remove, upgrade, quit, the "v1 " prefix and every error
 * answer. The capture a
 * `capture start` begins lives here too (struct ctl_capture); the server (ctl.c) only ends it
 * when its owner disconnects, its duration is up or the daemon stops. Runs on the control
 * thread; touches VM state only through struct ops_ctl_ops and the taps' own locks.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_internal.h"
#include "util/log.h"
#include "util/loop.h"
#include "util/macros.h"
#include "util/time.h"

#define CTL_MAX_ARGS 16

static void begin(struct ops_jw *w, bool ok)
{
	ops_jw_obj_begin(w, NULL);
	ops_jw_u64(w, "proto", OPS_CTL_PROTO);
	ops_jw_bool(w, "ok", ok);
}

static const char *errno_name(int e)
{
	switch (e) {
	case EINVAL: return "EINVAL";
	case ENOENT: return "ENOENT";
	case EBUSY: return "EBUSY";
	case EEXIST: return "EEXIST";
	case ENOTSUP: return "ENOTSUP";
	case E2BIG: return "E2BIG";
	case EACCES: return "EACCES";
	case EADDRINUSE: return "EADDRINUSE";
	case EMFILE: return "EMFILE";
	case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
	case ENOMEM: return "ENOMEM";
	/* upgrade: refused by the new binary, not executable, silent, dead */
	case EPROTO: return "EPROTO";
	case ENOEXEC: return "ENOEXEC";
	case ETIMEDOUT: return "ETIMEDOUT";
	case ECONNRESET: return "ECONNRESET";
	default: return "EIO";
	}
}

void ctl_error_answer(struct ops_jw *w, int e, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	w->len = 0;
	w->depth = 0;
	w->first[0] = true;
	w->overflow = false;
	begin(w, false);
	ops_jw_str(w, "error", msg);
	ops_jw_str(w, "errno", errno_name(e));
	ops_jw_obj_end(w);
}

static void counters_json(struct ops_jw *w, const char *key, const struct ops_vm_counters *c)
{
	ops_jw_obj_begin(w, key);
#define OPS_X_JSON_(f, name, help) ops_jw_u64(w, name, c->f);
	OPS_VM_COUNTERS(OPS_X_JSON_)
#undef OPS_X_JSON_
	ops_jw_obj_begin(w, "dropped");
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		ops_jw_u64(w, ops_drop_reason_name(i), c->dropped[i]);
	ops_jw_obj_end(w);
	ops_jw_obj_end(w);
}

static void engine_json(struct ops_jw *w, const struct vsock_engine_stats *e)
{
	ops_jw_obj_begin(w, "engine");
#define E_(f) ops_jw_u64(w, #f, e->f)
	E_(rx_pkts);
	E_(rx_bytes);
	E_(tx_pkts);
	E_(tx_bytes);
	ops_jw_obj_begin(w, "rx_dropped");
	for (unsigned i = 1; i < _VSOCK_HDR_ERROR_MAX; i++)
		ops_jw_u64(w, vsock_hdr_error_to_string(i), e->rx_dropped[i]);
	ops_jw_obj_end(w);
	E_(rx_no_socket);
	E_(rx_type_mismatch);
	E_(rx_unexpected);
	E_(rst_sent);
	E_(rst_received);
	E_(credit_violations);
	E_(rx_mem_resets);
	E_(credit_stalls);
	E_(credit_updates_sent);
	E_(credit_requests_sent);
	E_(backlog_refused);
	E_(socks_open);
	E_(socks_total);
	E_(connects_timed_out);
	E_(close_timeouts);
	E_(rst_dropped);
#undef E_
	ops_jw_obj_end(w);
}

/* Parses "vm=CID" into *cid. */
static int parse_vm_arg(const char *a, uint32_t *cid)
{
	char *end;
	unsigned long v;

	if (strncmp(a, "vm=", 3) != 0 || a[3] < '0' || a[3] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoul(a + 3, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -EINVAL;
	*cid = (uint32_t)v;
	return 0;
}

/* Finds VM index by CID; -ENOENT if none. */
static int find_vm(struct ops_ctl *c, uint32_t cid)
{
	unsigned n = c->ops->vm_count(c->opaque);

	for (unsigned i = 0; i < n; i++)
		if (c->ops->vm_cid(c->opaque, i) == cid)
			return (int)i;
	return -ENOENT;
}

/* Common `[vm=CID]` handling: [*lo, *hi) is the index range to report. */
static int vm_range(struct ops_ctl *c, struct ops_jw *w, int argc, char **argv, unsigned *lo,
		    unsigned *hi)
{
	uint32_t cid;
	int i;

	*lo = 0;
	*hi = c->ops->vm_count(c->opaque);
	if (argc == 1)
		return 0;
	if (argc > 2 || parse_vm_arg(argv[1], &cid) < 0) {
		ctl_error_answer(w, EINVAL, "usage: %s [vm=CID]", argv[0]);
		return -EINVAL;
	}
	i = find_vm(c, cid);
	if (i < 0) {
		ctl_error_answer(w, ENOENT, "no VM with CID %u", cid);
		return -ENOENT;
	}
	*lo = (unsigned)i;
	*hi = (unsigned)i + 1;
	return 0;
}

static bool tap_attached_to(struct ops_ctl *c, unsigned idx)
{
	for (unsigned i = 0; i < c->cap.n_idx; i++)
		if (c->cap.idx[i] == idx)
			return true;
	return false;
}

static void cmd_stats(struct ops_ctl *c, struct ops_jw *w, int argc, char **argv)
{
	struct ops_vm_counters total = { 0 };
	unsigned lo, hi;

	if (vm_range(c, w, argc, argv, &lo, &hi) < 0)
		return;
	begin(w, true);
	ops_jw_arr_begin(w, "vms");
	for (unsigned i = lo; i < hi; i++) {
		struct ops_vm_stats s;

		memset(&s, 0, sizeof(s));
		c->ops->vm_stats(c->opaque, i, &s);
		s.name[sizeof(s.name) - 1] = '\0';
		s.socket[sizeof(s.socket) - 1] = '\0';
		ops_jw_obj_begin(w, NULL);
		ops_jw_u64(w, "cid", s.cid);
		ops_jw_str(w, "name", s.name);
		ops_jw_str(w, "socket", s.socket);
		ops_jw_bool(w, "vmm_connected", s.vmm_connected);
		ops_jw_bool(w, "broken", s.broken);
		ops_jw_bool(w, "capturing", c->cap.active && tap_attached_to(c, i));
		counters_json(w, "counters", &s.c);
		if (s.have_engine)
			engine_json(w, &s.eng);
		else
			ops_jw_null(w, "engine");
		ops_jw_obj_end(w);
		ops_counters_add(&total, &s.c);
	}
	ops_jw_arr_end(w);
	counters_json(w, "totals", &total);
	ops_jw_obj_end(w);
}

struct conns_ctx {
	struct ops_jw *w;
	bool truncated;
	uint64_t count;
};

static const char *type_name(enum vsock_type t)
{
	return t == VSOCK_TYPE_STREAM ? "stream" : t == VSOCK_TYPE_SEQPACKET ? "seqpacket" : "?";
}

static bool emit_conn(void *arg, const struct ops_conn_info *ci)
{
	struct conns_ctx *x = arg;
	struct ops_jw *w = x->w;
	const struct vsock_sock_info *s = &ci->sock;
	uint32_t in_flight = s->tx_cnt - s->peer_fwd_cnt;
	char host[sizeof(ci->host)];

	if (!ops_jw_room(w, CTL_CONN_ROOM + CTL_TAIL_ROOM)) {
		x->truncated = true;
		return false;
	}
	memcpy(host, ci->host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	ops_jw_obj_begin(w, NULL);
	ops_jw_u64(w, "vm", ci->vm_cid);
	ops_jw_str(w, "type", type_name(s->type));
	ops_jw_str(w, "state", vsock_state_to_string(s->state));
	ops_jw_u64(w, "local_cid", s->local_cid);
	ops_jw_u64(w, "local_port", s->local_port);
	ops_jw_u64(w, "peer_cid", s->peer_cid);
	ops_jw_u64(w, "peer_port", s->peer_port);
	ops_jw_str(w, "host", host);
	ops_jw_u64(w, "bytes_in", s->bytes_in);
	ops_jw_u64(w, "bytes_out", s->bytes_out);
	ops_jw_u64(w, "buf_alloc", s->buf_alloc);
	ops_jw_u64(w, "fwd_cnt", s->fwd_cnt);
	ops_jw_u64(w, "rx_queued", s->rx_bytes);
	ops_jw_u64(w, "rx_mem", s->rx_mem);
	ops_jw_u64(w, "peer_buf_alloc", s->peer_buf_alloc);
	ops_jw_u64(w, "peer_fwd_cnt", s->peer_fwd_cnt);
	ops_jw_u64(w, "tx_cnt", s->tx_cnt);
	ops_jw_u64(w, "in_flight", in_flight);
	/* Wrapping u32 counters; a peer that shrank buf_alloc can leave in_flight above it. */
	ops_jw_u64(w, "peer_credit",
		   s->peer_buf_alloc > in_flight ? s->peer_buf_alloc - in_flight : 0);
	ops_jw_u64(w, "tx_queued", s->tx_queued);
	ops_jw_u64(w, "shutdown", s->shutdown);
	ops_jw_u64(w, "peer_shutdown", s->peer_shutdown);
	ops_jw_obj_end(w);
	x->count++;
	return true;
}

static void cmd_conns(struct ops_ctl *c, struct ops_jw *w, int argc, char **argv)
{
	struct conns_ctx x = { .w = w };
	unsigned lo, hi;

	if (!c->ops->vm_conns) {
		ctl_error_answer(w, ENOTSUP, "this server has no connection listing");
		return;
	}
	if (vm_range(c, w, argc, argv, &lo, &hi) < 0)
		return;
	begin(w, true);
	ops_jw_arr_begin(w, "conns");
	for (unsigned i = lo; i < hi && !x.truncated; i++)
		c->ops->vm_conns(c->opaque, i, emit_conn, &x);
	ops_jw_arr_end(w);
	ops_jw_u64(w, "count", x.count);
	ops_jw_bool(w, "truncated", x.truncated);
	ops_jw_obj_end(w);
}

static void capture_status_json(struct ops_ctl *c, struct ops_jw *w)
{
	struct ctl_capture *k = &c->cap;
	struct ops_pcap_status st;

	ops_jw_obj_begin(w, "capture");
	ops_jw_bool(w, "running", k->active);
	if (!k->active && !k->have_last) {
		ops_jw_obj_end(w);
		return;
	}
	if (k->active)
		ops_pcap_get_status(k->pcap, &st);
	else
		st = k->last;
	ops_jw_str(w, "file", k->active ? k->file : k->last_file);
	if (k->active) {
		ops_jw_arr_begin(w, "vms");
		for (unsigned i = 0; i < k->n_idx; i++)
			ops_jw_u64(w, NULL, c->ops->vm_cid(c->opaque, k->idx[i]));
		ops_jw_arr_end(w);
		ops_jw_bool(w, "detached", k->owner == NULL);
		if (k->end_ms) {
			uint64_t now = mono_ms();

			ops_jw_u64(w, "remaining_ms", k->end_ms > now ? k->end_ms - now : 0);
		}
	} else {
		ops_jw_str(w, "stopped_by", k->last_reason);
	}
	ops_jw_u64(w, "pkts", st.pkts);
	ops_jw_u64(w, "bytes", st.bytes);
	ops_jw_u64(w, "dropped", st.dropped);
	ops_jw_u64(w, "snaplen", st.snaplen);
	ops_jw_bool(w, "nanosecond", st.nanosecond);
	if (st.error)
		ops_jw_str(w, "error", strerror(st.error));
	else
		ops_jw_null(w, "error");
	ops_jw_obj_end(w);
}

void ctl_capture_end(struct ops_ctl *c, const char *reason)
{
	struct ctl_capture *k = &c->cap;

	if (!k->active)
		return;
	for (unsigned i = 0; i < k->n_idx; i++)
		ops_tap_detach(c->ops->vm_tap(c->opaque, k->idx[i]));
	/* Every tap is detached: no VM thread writes anymore; flush and read the final numbers. */
	ops_pcap_flush(k->pcap);
	ops_pcap_get_status(k->pcap, &k->last);
	ops_pcap_unref(k->pcap);
	k->pcap = NULL;
	memcpy(k->last_file, k->file, sizeof(k->file));
	snprintf(k->last_reason, sizeof(k->last_reason), "%s", reason);
	k->have_last = true;
	free(k->idx);
	k->idx = NULL;
	k->n_idx = 0;
	k->owner = NULL;
	k->end_ms = 0;
	k->active = false;
	log_info("capture to %s stopped (%s): %llu packets, %llu dropped", k->last_file, reason,
		 (unsigned long long)k->last.pkts, (unsigned long long)k->last.dropped);
}

void ops_ctl_vm_removed(struct ops_ctl *c, unsigned idx)
{
	struct ctl_capture *k;
	unsigned n = 0;

	if (!c || !c->cap.active)
		return;
	k = &c->cap;
	for (unsigned i = 0; i < k->n_idx; i++) {
		if (k->idx[i] == idx) {
			(void)ops_tap_detach(c->ops->vm_tap(c->opaque, idx));
			continue;
		}
		k->idx[n++] = k->idx[i] > idx ? k->idx[i] - 1 : k->idx[i];
	}
	k->n_idx = n;
}

static int parse_u64_arg(const char *s, uint64_t *ret)
{
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*ret = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static void cmd_capture_start(struct ops_ctl *c, struct ctl_client *cl, struct ops_jw *w,
			      int argc, char **argv)
{
	struct ctl_capture *k = &c->cap;
	struct ops_pcap_opts o = { 0 };
	uint32_t cid = VMADDR_CID_ANY;
	uint64_t duration_s = 0;
	bool detach = false;
	struct ops_pcap *p = NULL;
	unsigned n, *idx;
	int r;

	if (!c->ops->vm_tap) {
		ctl_error_answer(w, ENOTSUP, "this server cannot capture");
		return;
	}
	if (argc < 3) {
		ctl_error_answer(w, EINVAL, "usage: capture start FILE|- [vm=CID] [snaplen=N] [ns] "
			     "[duration=S] [maxbytes=N] [detach]");
		return;
	}
	if (k->active) {
		ctl_error_answer(w, EBUSY, "a capture to %s is running (capture stop first)", k->file);
		return;
	}
	for (int i = 3; i < argc; i++) {
		const char *a = argv[i];
		uint64_t v;

		if (strncmp(a, "vm=", 3) == 0) {
			if (parse_vm_arg(a, &cid) < 0)
				goto bad_arg;
		} else if (strncmp(a, "snaplen=", 8) == 0) {
			if (parse_u64_arg(a + 8, &v) < 0 || v < OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE ||
			    v > OPS_PCAP_SNAPLEN_MAX) {
				ctl_error_answer(w, EINVAL, "snaplen must be in [%u, %u]",
					     OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE,
					     OPS_PCAP_SNAPLEN_MAX);
				return;
			}
			o.snaplen = (uint32_t)v;
		} else if (strncmp(a, "duration=", 9) == 0) {
			if (parse_u64_arg(a + 9, &duration_s) < 0 || duration_s == 0 ||
			    duration_s > 7 * 86400)
				goto bad_arg;
		} else if (strncmp(a, "maxbytes=", 9) == 0) {
			if (parse_u64_arg(a + 9, &o.max_bytes) < 0 || o.max_bytes == 0)
				goto bad_arg;
		} else if (strcmp(a, "ns") == 0) {
			o.nanosecond = true;
		} else if (strcmp(a, "detach") == 0) {
			detach = true;
		} else {
			goto bad_arg;
		}
	}
	if (cid != VMADDR_CID_ANY && find_vm(c, cid) < 0) {
		ctl_error_answer(w, ENOENT, "no VM with CID %u", cid);
		return;
	}
	n = c->ops->vm_count(c->opaque);
	idx = calloc(n ? n : 1, sizeof(*idx));
	if (!idx) {
		ctl_error_answer(w, ENOMEM, "out of memory");
		return;
	}
	if (strcmp(argv[2], "-") == 0) {
		if (cl->pass_fd < 0) {
			free(idx);
			ctl_error_answer(w, EINVAL, "'capture start -' needs a file descriptor passed "
				     "with the request (SCM_RIGHTS)");
			return;
		}
		r = ops_pcap_open_fd(cl->pass_fd, &o, &p);
		cl->pass_fd = -1; /* taken over, even on failure */
	} else if (argv[2][0] != '/') {
		free(idx);
		ctl_error_answer(w, EINVAL, "capture file must be an absolute path (or '-' with a "
			     "passed file descriptor)");
		return;
	} else {
		r = ops_pcap_open_path(argv[2], &o, &p);
	}
	if (r < 0) {
		free(idx);
		ctl_error_answer(w, -r, "cannot start a capture to %s: %s", argv[2], strerror(-r));
		return;
	}
	k->n_idx = 0;
	for (unsigned i = 0; i < n; i++) {
		if (cid != VMADDR_CID_ANY && c->ops->vm_cid(c->opaque, i) != cid)
			continue;
		if (ops_tap_attach(c->ops->vm_tap(c->opaque, i), p) == 0)
			idx[k->n_idx++] = i;
	}
	k->pcap = p; /* our reference (the taps hold their own); dropped by ctl_capture_end() */
	k->idx = idx;
	k->active = true;
	k->owner = detach ? NULL : cl;
	k->end_ms = duration_s ? mono_ms() + duration_s * 1000 : 0;
	snprintf(k->file, sizeof(k->file), "%s", strcmp(argv[2], "-") ? argv[2] : "(passed fd)");
	log_info("capture to %s started (%u VMs)", k->file, k->n_idx);
	begin(w, true);
	capture_status_json(c, w);
	ops_jw_obj_end(w);
	return;

bad_arg:
	ctl_error_answer(w, EINVAL, "bad capture argument (see 'capture start' usage)");
}

static void cmd_capture(struct ops_ctl *c, struct ctl_client *cl, struct ops_jw *w,
			int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "start") == 0) {
		cmd_capture_start(c, cl, w, argc, argv);
		return;
	}
	if (argc == 2 && strcmp(argv[1], "stop") == 0) {
		if (!c->cap.active) {
			ctl_error_answer(w, ENOENT, "no capture is running");
			return;
		}
		ctl_capture_end(c, "request");
		begin(w, true);
		capture_status_json(c, w);
		ops_jw_obj_end(w);
		return;
	}
	if (argc == 2 && strcmp(argv[1], "status") == 0) {
		begin(w, true);
		capture_status_json(c, w);
		ops_jw_obj_end(w);
		return;
	}
	ctl_error_answer(w, EINVAL, "usage: capture start|stop|status");
}

/* vm-add SPEC, vm-remove CID|NAME: the daemon does the work (ops vm_add / vm_remove). */
static void cmd_vm(struct ops_ctl *c, struct ops_jw *w, int argc, char **argv)
{
	bool add = strcmp(argv[0], "vm-add") == 0;
	char err[256] = "";
	uint32_t cid = 0;
	int r;

	if (!(add ? c->ops->vm_add : c->ops->vm_remove)) {
		ctl_error_answer(w, ENOTSUP, "this server cannot %s VMs at runtime (uvsockd "
				 "--isolate cannot: restart it with the new VMs)",
				 add ? "add" : "remove");
		return;
	}
	if (argc != 2) {
		ctl_error_answer(w, EINVAL, add ? "usage: vm-add guest-cid=N,socket=PATH,"
					    "uds-path=PATH[,KEY=VALUE...] (no spaces)"
					  : "usage: vm-remove CID|NAME");
		return;
	}
	r = add ? c->ops->vm_add(c->opaque, argv[1], &cid, err, sizeof(err))
		: c->ops->vm_remove(c->opaque, argv[1], &cid, err, sizeof(err));
	if (r < 0) {
		ctl_error_answer(w, -r, "%s", err[0] ? err : strerror(-r));
		return;
	}
	begin(w, true);
	ops_jw_u64(w, add ? "added" : "removed", cid);
	ops_jw_u64(w, "vms", c->ops->vm_count(c->opaque));
	ops_jw_obj_end(w);
}

/*
 * upgrade [binary PATH]: every VM to a new uvsockd (docs/upgrade.md, "The protocol"). On
 * success this process stops accepting at once and exits once the answer is out (ctl.c).
 */
static void cmd_upgrade(struct ops_ctl *c, struct ops_jw *w, int argc, char **argv)
{
	struct ops_ctl_upgrade u = { .exit_after = -1 };
	char err[640] = "";
	int r;

	if (!c->ops->upgrade) {
		ctl_error_answer(w, ENOTSUP, "this server cannot be upgraded in place "
				 "(docs/upgrade.md)");
		return;
	}
	if (!(argc == 1 || (argc == 3 && strcmp(argv[1], "binary") == 0))) {
		ctl_error_answer(w, EINVAL, "usage: upgrade [binary PATH]");
		return;
	}
	if (argc == 3 && argv[2][0] != '/') {
		ctl_error_answer(w, EINVAL, "upgrade: binary %.200s: an absolute path is needed (the "
				 "daemon's working directory is not the client's)", argv[2]);
		return;
	}
	r = c->ops->upgrade(c->opaque, argc == 3 ? argv[2] : NULL, &u, err, sizeof(err));
	if (u.exit_after >= 0) {
		loop_watch_del(c->listen_watch);
		c->listen_watch = NULL;
		c->exit_after = u.exit_after;
	}
	if (r < 0) {
		ctl_error_answer(w, -r, "%s", err[0] ? err : strerror(-r));
		free(u.vms);
		return;
	}
	begin(w, true);
	ops_jw_i64(w, "old_pid", u.old_pid);
	ops_jw_i64(w, "new_pid", u.new_pid);
	ops_jw_arr_begin(w, "vms");
	for (unsigned i = 0; i < u.n; i++) {
		ops_jw_obj_begin(w, NULL);
		ops_jw_u64(w, "cid", u.vms[i].cid);
		ops_jw_milli(w, "pause_ms", u.vms[i].pause_us);
		ops_jw_u64(w, "conns", u.vms[i].conns);
		if (u.vms[i].worker_pid)
			ops_jw_i64(w, "worker_pid", u.vms[i].worker_pid);
		ops_jw_obj_end(w);
	}
	ops_jw_arr_end(w);
	ops_jw_obj_end(w);
	free(u.vms);
}

/*
 * vms: each VM's CID and host-side socket path, for libuvsock-preload.so (docs/shim.md),
 * which connects to <uds_path> and listens at <uds_path>_<port> in place of AF_VSOCK.
 */
static void cmd_vms(struct ops_ctl *c, struct ops_jw *w)
{
	unsigned n = c->ops->vm_count(c->opaque);

	if (!c->ops->vm_uds_path) {
		ctl_error_answer(w, ENOTSUP, "this server does not tell its VMs' uds-path");
		return;
	}
	begin(w, true);
	ops_jw_arr_begin(w, "vms");
	for (unsigned i = 0; i < n; i++) {
		ops_jw_obj_begin(w, NULL);
		ops_jw_u64(w, "cid", c->ops->vm_cid(c->opaque, i));
		ops_jw_str(w, "uds_path", c->ops->vm_uds_path(c->opaque, i));
		ops_jw_obj_end(w);
	}
	ops_jw_arr_end(w);
	ops_jw_obj_end(w);
}

static void cmd_version(struct ops_ctl *c, struct ops_jw *w)
{
	static const char *const cmds[] = { "version", "stats", "conns", "capture", "vm-add",
					    "vm-remove", "vms", "upgrade", "quit" };

	begin(w, true);
	ops_jw_str(w, "server", c->server);
	ops_jw_arr_begin(w, "commands");
	for (size_t i = 0; i < ARRAY_SIZE(cmds); i++)
		ops_jw_str(w, NULL, cmds[i]);
	ops_jw_arr_end(w);
	ops_jw_u64(w, "vms", c->ops->vm_count(c->opaque));
	ops_jw_obj_end(w);
}

void ctl_cmd_run(struct ops_ctl *c, struct ctl_client *cl, char *line, struct ops_jw *w)
{
	char *argv[CTL_MAX_ARGS], *save = NULL;
	int argc = 0;

	for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
		if (argc == CTL_MAX_ARGS) {
			ctl_error_answer(w, E2BIG, "too many words");
			goto out;
		}
		argv[argc++] = t;
	}
	if (argc && argv[0][0] == 'v' && argv[0][1] >= '0' && argv[0][1] <= '9') {
		char *end;
		unsigned long v = strtoul(argv[0] + 1, &end, 10);

		if (*end || v != OPS_CTL_PROTO) {
			ctl_error_answer(w, EPROTONOSUPPORT,
				     "unsupported protocol version '%s' (this server speaks v%d)",
				     argv[0], OPS_CTL_PROTO);
			goto out;
		}
		memmove(argv, argv + 1, (size_t)--argc * sizeof(argv[0]));
	}
	if (argc == 0)
		ctl_error_answer(w, EINVAL, "empty request (try 'version')");
	else if (strcmp(argv[0], "version") == 0 && argc == 1)
		cmd_version(c, w);
	else if (strcmp(argv[0], "stats") == 0)
		cmd_stats(c, w, argc, argv);
	else if (strcmp(argv[0], "conns") == 0)
		cmd_conns(c, w, argc, argv);
	else if (strcmp(argv[0], "capture") == 0)
		cmd_capture(c, cl, w, argc, argv);
	else if (strcmp(argv[0], "vm-add") == 0 || strcmp(argv[0], "vm-remove") == 0)
		cmd_vm(c, w, argc, argv);
	else if (strcmp(argv[0], "vms") == 0 && argc == 1)
		cmd_vms(c, w);
	else if (strcmp(argv[0], "upgrade") == 0)
		cmd_upgrade(c, w, argc, argv);
	else if (strcmp(argv[0], "quit") == 0 && argc == 1) {
		begin(w, true);
		ops_jw_obj_end(w);
		cl->closing = true;
	} else
		ctl_error_answer(w, EINVAL, "unknown request '%.40s' (try 'version')", argv[0]);
out:
	if (ops_jw_overflowed(w))
		ctl_error_answer(w, E2BIG, "answer larger than %zu bytes", c->max_response);
}

