/* SPDX-License-Identifier: MIT */
/*
 * The control socket thread (see ctl.h). One poll() loop over an eventfd (stop), the listening
 * socket and at most max_clients non-blocking clients. A client is either reading a request or
 * writing an answer, never both: one request is answered at a time, in order, so a client that
 * pipelines requests gets the answers in order and a client that never reads cannot make us
 * buffer more than one answer. Nothing here ever touches a VM thread's data except through
 * struct ops_ctl_ops and the taps' own locks.
 */
#include "ops/ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ops/json.h"
#include "util/log.h"
#include "util/macros.h"

#define CTL_DEFAULT_CLIENTS 8u
#define CTL_DEFAULT_RESPONSE (16u << 20)
#define CTL_DEFAULT_IDLE_MS 30000u
#define CTL_MAX_ARGS 16
#define CTL_FLUSH_MS 1000u
#define CTL_ACCEPT_PAUSE_MS 100u
/* Room kept free in an answer for the members written after a listing. */
#define CTL_TAIL_ROOM 512u
/* Largest JSON of one connection in a listing (host path escaped included). */
#define CTL_CONN_ROOM 1536u

struct client {
	int fd;
	uid_t uid;
	char in[OPS_CTL_MAX_REQUEST];
	size_t in_len;
	int pass_fd;          /* received with SCM_RIGHTS, for `capture start -`; -1 if none */
	char *out;            /* answer being written */
	size_t out_len, out_off;
	bool closing;         /* close once the answer is written */
	uint64_t deadline_ms; /* idle (reading) or write deadline */
};

struct capture {
	bool active;
	struct ops_pcap *pcap;
	char file[128];
	uint32_t vm;          /* VMADDR_CID_ANY: every VM */
	unsigned *idx;        /* VMs whose tap we attached */
	unsigned n_idx;
	uint64_t end_ms;      /* 0: no duration */
	struct client *owner; /* stops when it disconnects; NULL: detached */
	bool have_last;       /* the last capture's final status, for `capture status` */
	struct ops_pcap_status last;
	char last_file[128];
	char last_reason[32];
};

struct ops_ctl {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char server[64];
	const struct ops_ctl_ops *ops;
	void *opaque;
	unsigned max_clients;
	size_t max_response;
	unsigned idle_ms;
	bool any_uid;
	int lfd, wake_fd;
	uint64_t accept_pause_until; /* accept failed for lack of resources: retry then */
	pthread_t th;
	struct client **clients;
	unsigned n_clients;
	struct capture cap;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int ops_ctl_default_path(const char *vhost_socket, char *buf, size_t len)
{
	size_t n = strlen(vhost_socket) + strlen(OPS_CTL_SUFFIX);

	if (n > sizeof(((struct sockaddr_un *)0)->sun_path) - 1 || n + 1 > len)
		return -ENAMETOOLONG;
	snprintf(buf, len, "%s%s", vhost_socket, OPS_CTL_SUFFIX);
	return 0;
}

/* ---- answers --------------------------------------------------------------------------- */

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
	case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
	case ENOMEM: return "ENOMEM";
	default: return "EIO";
	}
}

static void error_answer(struct ops_jw *w, int e, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void error_answer(struct ops_jw *w, int e, const char *fmt, ...)
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
		error_answer(w, EINVAL, "usage: %s [vm=CID]", argv[0]);
		return -EINVAL;
	}
	i = find_vm(c, cid);
	if (i < 0) {
		error_answer(w, ENOENT, "no VM with CID %u", cid);
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
		ops_jw_obj_begin(w, NULL);
		ops_jw_u64(w, "cid", s.cid);
		ops_jw_str(w, "name", s.name);
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
		error_answer(w, ENOTSUP, "this server has no connection listing");
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
	struct capture *k = &c->cap;
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
			uint64_t now = now_ms();

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

static void capture_end(struct ops_ctl *c, const char *reason)
{
	struct capture *k = &c->cap;

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

static int parse_u64_arg(const char *s, uint64_t *ret)
{
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*ret = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static void cmd_capture_start(struct ops_ctl *c, struct client *cl, struct ops_jw *w, int argc,
			      char **argv)
{
	struct capture *k = &c->cap;
	struct ops_pcap_opts o = { 0 };
	uint32_t cid = VMADDR_CID_ANY;
	uint64_t duration_s = 0;
	bool detach = false;
	struct ops_pcap *p = NULL;
	unsigned n, *idx;
	int r;

	if (!c->ops->vm_tap) {
		error_answer(w, ENOTSUP, "this server cannot capture");
		return;
	}
	if (argc < 3) {
		error_answer(w, EINVAL, "usage: capture start FILE|- [vm=CID] [snaplen=N] [ns] "
			     "[duration=S] [maxbytes=N] [detach]");
		return;
	}
	if (k->active) {
		error_answer(w, EBUSY, "a capture to %s is running (capture stop first)", k->file);
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
				error_answer(w, EINVAL, "snaplen must be in [%u, %u]",
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
		error_answer(w, ENOENT, "no VM with CID %u", cid);
		return;
	}
	n = c->ops->vm_count(c->opaque);
	idx = calloc(n ? n : 1, sizeof(*idx));
	if (!idx) {
		error_answer(w, ENOMEM, "out of memory");
		return;
	}
	if (strcmp(argv[2], "-") == 0) {
		if (cl->pass_fd < 0) {
			free(idx);
			error_answer(w, EINVAL, "'capture start -' needs a file descriptor passed "
				     "with the request (SCM_RIGHTS)");
			return;
		}
		r = ops_pcap_open_fd(cl->pass_fd, &o, &p);
		cl->pass_fd = -1; /* taken over, even on failure */
	} else if (argv[2][0] != '/') {
		free(idx);
		error_answer(w, EINVAL, "capture file must be an absolute path (or '-' with a "
			     "passed file descriptor)");
		return;
	} else {
		r = ops_pcap_open_path(argv[2], &o, &p);
	}
	if (r < 0) {
		free(idx);
		error_answer(w, -r, "cannot start a capture to %s: %s", argv[2], strerror(-r));
		return;
	}
	k->n_idx = 0;
	for (unsigned i = 0; i < n; i++) {
		if (cid != VMADDR_CID_ANY && c->ops->vm_cid(c->opaque, i) != cid)
			continue;
		if (ops_tap_attach(c->ops->vm_tap(c->opaque, i), p) == 0)
			idx[k->n_idx++] = i;
	}
	k->pcap = p; /* our reference (the taps hold their own); dropped by capture_end() */
	k->idx = idx;
	k->active = true;
	k->owner = detach ? NULL : cl;
	k->end_ms = duration_s ? now_ms() + duration_s * 1000 : 0;
	snprintf(k->file, sizeof(k->file), "%s", strcmp(argv[2], "-") ? argv[2] : "(passed fd)");
	log_info("capture to %s started (%u VMs)", k->file, k->n_idx);
	begin(w, true);
	capture_status_json(c, w);
	ops_jw_obj_end(w);
	return;

bad_arg:
	error_answer(w, EINVAL, "bad capture argument (see 'capture start' usage)");
}

static void cmd_capture(struct ops_ctl *c, struct client *cl, struct ops_jw *w, int argc,
			char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "start") == 0) {
		cmd_capture_start(c, cl, w, argc, argv);
		return;
	}
	if (argc == 2 && strcmp(argv[1], "stop") == 0) {
		if (!c->cap.active) {
			error_answer(w, ENOENT, "no capture is running");
			return;
		}
		capture_end(c, "request");
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
	error_answer(w, EINVAL, "usage: capture start|stop|status");
}

static void cmd_version(struct ops_ctl *c, struct ops_jw *w)
{
	static const char *const cmds[] = { "version", "stats", "conns", "capture", "quit" };

	begin(w, true);
	ops_jw_str(w, "server", c->server);
	ops_jw_arr_begin(w, "commands");
	for (size_t i = 0; i < ARRAY_SIZE(cmds); i++)
		ops_jw_str(w, NULL, cmds[i]);
	ops_jw_arr_end(w);
	ops_jw_u64(w, "vms", c->ops->vm_count(c->opaque));
	ops_jw_obj_end(w);
}

/*
 * Queues the finished answer in w as cl's output, newline-terminated (the writer keeps one spare
 * byte past its maximum for the NUL: room for the newline). cl takes over w's buffer.
 */
static void client_answer(struct client *cl, struct ops_jw *w)
{
	w->buf[w->len++] = '\n';
	cl->out = w->buf;
	cl->out_len = w->len;
	cl->out_off = 0;
}

/* Answers one request line (NUL-terminated, no newline) into cl->out. */
static void handle_request(struct ops_ctl *c, struct client *cl, char *line)
{
	struct ops_jw w;
	char *argv[CTL_MAX_ARGS], *save = NULL;
	int argc = 0;

	if (ops_jw_init(&w, c->max_response) < 0) {
		cl->closing = true;
		return;
	}
	for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
		if (argc == CTL_MAX_ARGS) {
			error_answer(&w, E2BIG, "too many words");
			goto out;
		}
		argv[argc++] = t;
	}
	if (argc && argv[0][0] == 'v' && argv[0][1] >= '0' && argv[0][1] <= '9') {
		char *end;
		unsigned long v = strtoul(argv[0] + 1, &end, 10);

		if (*end || v != OPS_CTL_PROTO) {
			error_answer(&w, EPROTONOSUPPORT,
				     "unsupported protocol version '%s' (this server speaks v%d)",
				     argv[0], OPS_CTL_PROTO);
			goto out;
		}
		memmove(argv, argv + 1, (size_t)--argc * sizeof(argv[0]));
	}
	if (argc == 0)
		error_answer(&w, EINVAL, "empty request (try 'version')");
	else if (strcmp(argv[0], "version") == 0 && argc == 1)
		cmd_version(c, &w);
	else if (strcmp(argv[0], "stats") == 0)
		cmd_stats(c, &w, argc, argv);
	else if (strcmp(argv[0], "conns") == 0)
		cmd_conns(c, &w, argc, argv);
	else if (strcmp(argv[0], "capture") == 0)
		cmd_capture(c, cl, &w, argc, argv);
	else if (strcmp(argv[0], "quit") == 0 && argc == 1) {
		begin(&w, true);
		ops_jw_obj_end(&w);
		cl->closing = true;
	} else
		error_answer(&w, EINVAL, "unknown request '%.40s' (try 'version')", argv[0]);
out:
	if (ops_jw_overflowed(&w))
		error_answer(&w, E2BIG, "answer larger than %zu bytes", c->max_response);
	client_answer(cl, &w);
	/* An unused passed descriptor is not kept for a later request. */
	if (cl->pass_fd >= 0) {
		close(cl->pass_fd);
		cl->pass_fd = -1;
	}
}

/* ---- clients --------------------------------------------------------------------------- */

static void client_close(struct ops_ctl *c, unsigned i)
{
	struct client *cl = c->clients[i];

	if (c->cap.active && c->cap.owner == cl)
		capture_end(c, "client closed");
	close(cl->fd);
	if (cl->pass_fd >= 0)
		close(cl->pass_fd);
	free(cl->out);
	free(cl);
	c->clients[i] = c->clients[--c->n_clients];
}

/* Writes a short error line to a client we will not serve, best effort, and closes it. */
static void refuse(int fd, const char *msg)
{
	char line[256];
	int n = snprintf(line, sizeof(line),
			 "{\"proto\":%d,\"ok\":false,\"error\":\"%s\",\"errno\":\"EBUSY\"}\n",
			 OPS_CTL_PROTO, msg);

	(void)!send(fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	close(fd);
}

static void do_accept(struct ops_ctl *c)
{
	for (;;) {
		int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct client *cl;

		if (fd < 0) {
			/* Out of descriptors: the listener stays readable; pause it rather than
			 * spin (the pending connection waits in the backlog). */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				c->accept_pause_until = now_ms() + CTL_ACCEPT_PAUSE_MS;
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
		    (!c->any_uid && cred.uid != 0 && cred.uid != geteuid())) {
			refuse(fd, "permission denied");
			continue;
		}
		if (c->n_clients == c->max_clients) {
			refuse(fd, "too many control clients");
			continue;
		}
		cl = calloc(1, sizeof(*cl));
		if (!cl) {
			close(fd);
			continue;
		}
		cl->fd = fd;
		cl->uid = cred.uid;
		cl->pass_fd = -1;
		cl->deadline_ms = now_ms() + c->idle_ms;
		c->clients[c->n_clients++] = cl;
	}
}

/* Reads what is there; returns false when the client must be closed. */
static bool client_read(struct ops_ctl *c, struct client *cl)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { cl->in + cl->in_len, sizeof(cl->in) - cl->in_len };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
		.msg_controllen = sizeof(cm.buf),
	};
	ssize_t n = recvmsg(cl->fd, &msg, MSG_CMSG_CLOEXEC);

	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (cl->pass_fd < 0)
				cl->pass_fd = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return false;
	cl->in_len += (size_t)n;
	cl->deadline_ms = now_ms() + c->idle_ms;
	return true;
}

/* Answers the next complete request in the input, if any and if no answer is pending. */
static void client_process(struct ops_ctl *c, struct client *cl)
{
	char line[OPS_CTL_MAX_REQUEST];
	char *nl;
	size_t n;

	if (cl->out || cl->closing)
		return;
	nl = memchr(cl->in, '\n', cl->in_len);
	if (!nl) {
		if (cl->in_len == sizeof(cl->in)) {
			struct ops_jw w;

			if (ops_jw_init(&w, 512) == 0) {
				error_answer(&w, E2BIG, "request longer than %u bytes",
					     OPS_CTL_MAX_REQUEST);
				client_answer(cl, &w);
			}
			cl->closing = true;
		}
		return;
	}
	n = (size_t)(nl - cl->in);
	memcpy(line, cl->in, n);
	line[n] = '\0';
	cl->in_len -= n + 1;
	memmove(cl->in, nl + 1, cl->in_len);
	if (n && line[n - 1] == '\r')
		line[--n] = '\0';
	if (memchr(line, '\0', n)) {
		struct ops_jw w;

		if (ops_jw_init(&w, 512) == 0) {
			error_answer(&w, EINVAL, "NUL byte in request");
			client_answer(cl, &w);
		}
		cl->closing = true;
		return;
	}
	handle_request(c, cl, line);
	cl->deadline_ms = now_ms() + c->idle_ms;
}

/* Writes what it can; returns false when the client must be closed. */
static bool client_write(struct ops_ctl *c, struct client *cl)
{
	while (cl->out_off < cl->out_len) {
		ssize_t n = send(cl->fd, cl->out + cl->out_off, cl->out_len - cl->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return true;
		if (n <= 0)
			return false;
		cl->out_off += (size_t)n;
		cl->deadline_ms = now_ms() + c->idle_ms;
	}
	free(cl->out);
	cl->out = NULL;
	if (cl->closing)
		return false;
	client_process(c, cl); /* a pipelined request may be waiting */
	return true;
}

/* The client that owns a running capture may stay idle (it waits for the capture to end). */
static bool exempt_idle(struct ops_ctl *c, struct client *cl)
{
	return c->cap.active && c->cap.owner == cl && !cl->out;
}

static void *ctl_main(void *arg)
{
	struct ops_ctl *c = arg;
	struct pollfd *pfd = calloc(c->max_clients + 2, sizeof(*pfd));
	uint64_t last_flush = now_ms();

	if (!pfd) {
		log_error("control socket: out of memory; control thread ends");
		return NULL;
	}
	pthread_setname_np(pthread_self(), "uvsock-ctl");
	for (;;) {
		uint64_t now = now_ms(), next = now + CTL_FLUSH_MS;
		unsigned n = c->n_clients;
		int timeout, r;

		pfd[0] = (struct pollfd){ .fd = c->wake_fd, .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = c->lfd, .events = POLLIN };
		if (now < c->accept_pause_until) {
			pfd[1].fd = -1; /* poll ignores negative fds */
			next = MIN(next, c->accept_pause_until);
		}
		for (unsigned i = 0; i < n; i++) {
			struct client *cl = c->clients[i];

			pfd[2 + i] = (struct pollfd){ .fd = cl->fd,
						      .events = cl->out ? POLLOUT : POLLIN };
			if (!exempt_idle(c, cl))
				next = MIN(next, cl->deadline_ms);
		}
		if (c->cap.active && c->cap.end_ms)
			next = MIN(next, c->cap.end_ms);
		timeout = next > now ? (int)(next - now) : 0;
		r = poll(pfd, 2 + n, timeout);
		if (r < 0 && errno != EINTR) {
			log_error("control socket: poll: %s; control thread ends", strerror(errno));
			break;
		}
		if (r > 0 && (pfd[0].revents & POLLIN))
			break;
		now = now_ms();
		/* Clients first (indexes match pfd), from the end so removal keeps them valid. */
		for (unsigned i = n; i-- > 0;) {
			struct client *cl = c->clients[i];
			short ev = r > 0 ? pfd[2 + i].revents : 0;
			bool keep = true;

			if (ev & POLLOUT)
				keep = client_write(c, cl);
			else if (ev & POLLIN) {
				keep = client_read(c, cl);
				if (keep) {
					client_process(c, cl);
					if (cl->out)
						keep = client_write(c, cl);
				}
			} else if (ev & (POLLHUP | POLLERR | POLLNVAL))
				keep = false;
			if (keep && now >= cl->deadline_ms && !exempt_idle(c, cl))
				keep = false;
			if (!keep)
				client_close(c, i);
		}
		if (r > 0 && (pfd[1].revents & POLLIN))
			do_accept(c);
		if (c->cap.active && c->cap.end_ms && now >= c->cap.end_ms)
			capture_end(c, "duration");
		if (c->cap.active && now - last_flush >= CTL_FLUSH_MS) {
			ops_pcap_flush(c->cap.pcap);
			last_flush = now;
		}
	}
	free(pfd);
	return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

static int listen_unix(const char *path, int *ret_fd)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -EINVAL;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		int probe;

		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		/* A socket file: live (another daemon answers) or stale (left by a crash). */
		probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe < 0)
			return -errno;
		r = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
		close(probe);
		if (r == 0)
			return -EADDRINUSE;
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0600) < 0 ||
	    listen(fd, 16) < 0) {
		r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

int ops_ctl_start(const struct ops_ctl_config *cfg, struct ops_ctl **ret)
{
	struct ops_ctl *c;
	int r;

	if (!cfg->path || !cfg->ops || !cfg->ops->vm_count || !cfg->ops->vm_cid ||
	    !cfg->ops->vm_stats)
		return -EINVAL;
	if (strlen(cfg->path) >= sizeof(c->path))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->lfd = -1;
	c->wake_fd = -1;
	memcpy(c->path, cfg->path, strlen(cfg->path) + 1);
	snprintf(c->server, sizeof(c->server), "%s", cfg->server ? cfg->server : "uvsock");
	c->ops = cfg->ops;
	c->opaque = cfg->opaque;
	c->max_clients = cfg->max_clients ? cfg->max_clients : CTL_DEFAULT_CLIENTS;
	c->max_response = cfg->max_response ? cfg->max_response : CTL_DEFAULT_RESPONSE;
	if (c->max_response < 2 * CTL_TAIL_ROOM + CTL_CONN_ROOM)
		c->max_response = 2 * CTL_TAIL_ROOM + CTL_CONN_ROOM;
	c->idle_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms : CTL_DEFAULT_IDLE_MS;
	c->any_uid = cfg->any_uid;
	c->clients = calloc(c->max_clients, sizeof(*c->clients));
	if (!c->clients) {
		r = -ENOMEM;
		goto fail;
	}
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0) {
		r = -errno;
		goto fail;
	}
	r = listen_unix(c->path, &c->lfd);
	if (r < 0)
		goto fail;
	r = -pthread_create(&c->th, NULL, ctl_main, c);
	if (r < 0) {
		close(c->lfd);
		c->lfd = -1;
		unlink(c->path);
		goto fail;
	}
	*ret = c;
	return 0;

fail:
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c->clients);
	free(c);
	return r;
}

void ops_ctl_stop(struct ops_ctl *c)
{
	uint64_t one = 1;

	if (!c)
		return;
	(void)!write(c->wake_fd, &one, sizeof(one));
	pthread_join(c->th, NULL);
	capture_end(c, "shutdown");
	while (c->n_clients)
		client_close(c, c->n_clients - 1);
	close(c->lfd);
	unlink(c->path);
	close(c->wake_fd);
	free(c->clients);
	free(c);
}
