/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the text parsers. The first input byte picks one, the rest is its input:
 *
 *   0  the hybrid-vsock CONNECT line (src/device/uds_connect.h): uds_connect_parse() on the
 *      whole input against a reference parser written here from the contract in
 *      uds_connect.h and docs/uvsockd.md, then uds_connect_read() on a stream socketpair fed in
 *      chunks: the same verdict, and not one byte consumed past the newline;
 *   1  the same line as one SOCK_SEQPACKET message;
 *   2  the config file parser (daemon/config.h): an error is one line "NAME:..." (no newline);
 *      a parsed config has every value in range and unique CIDs, and written back as YAML it
 *      parses to the same config;
 *   3  the JSON reader and writer (src/ctlproto/json.h): what parses is written back with the writer
 *      and parses to the same tree (numbers the writer cannot write become null); with a small
 *      cap the writer stops cleanly;
 *   4  control-socket requests (ctl_cmd_run of daemon/ctl_internal.h) against a fake daemon
 *      (VM names, counters, connection host paths from the input; capture taps optional): every
 *      answer is exactly one line of valid JSON with "proto":1 and a boolean "ok" (and an
 *      "error" string when ok is false). Capture files can only be created in a temporary
 *      directory: '/' in a request becomes '_', and a word starting with '@' names a file
 *      there.
 *
 * Nothing may crash or leak memory or file descriptors (counted in /proc/self/fd) either way.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"      /* daemon/ */
#include "ctl_internal.h" /* daemon/ */
#include "ctlproto/json.h"
#include "device/uds_connect.h"
#include "fuzz-input.h"
#include "util/log.h"

static char fz_dir[64]; /* the control requests' capture files */

static void fz_cleanup(void)
{
	if (fz_dir[0]) {
		fz_dir_clean(fz_dir);
		(void)rmdir(fz_dir);
	}
}

/* ---- CONNECT line ----------------------------------------------------------------------- */

static bool blank(uint8_t c)
{
	return c == ' ' || c == '\t';
}

/*
 * The contract, written independently of uds_connect.c: "CONNECT" in any letter case, one or
 * more blanks, 1 to 10 decimal digits (no sign) worth at most 4294967294 (VMADDR_PORT_ANY is no
 * port), optional blanks or '\r', '\n' as the last byte, at most UDS_CONNECT_LINE_MAX bytes.
 */
static int ref_connect(const uint8_t *s, size_t len, uint32_t *ret)
{
	static const char kw[] = "CONNECT";
	size_t i, d0;
	uint64_t v = 0;

	if (len < 1 || len > UDS_CONNECT_LINE_MAX || s[len - 1] != '\n')
		return -EPROTO;
	len--;
	if (len < 7)
		return -EPROTO;
	for (i = 0; i < 7; i++)
		if ((s[i] & ~0x20) != kw[i]) /* ASCII letters only: kw has no other byte */
			return -EPROTO;
	if (i == len || !blank(s[i]))
		return -EPROTO;
	while (i < len && blank(s[i]))
		i++;
	for (d0 = i; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		if (i - d0 < 11)
			v = v * 10 + (s[i] - '0');
	if (i == d0 || i - d0 > 10 || v > 4294967294u)
		return -EPROTO;
	while (i < len && (blank(s[i]) || s[i] == '\r'))
		i++;
	if (i != len)
		return -EPROTO;
	*ret = (uint32_t)v;
	return 0;
}

static void connect_parse(const uint8_t *s, size_t len)
{
	uint32_t a = 0, b = 0;
	int ra = uds_connect_parse((const char *)s, len, &a);
	int rb = ref_connect(s, len, &b);

	FZ_CHECK(ra == rb);
	FZ_CHECK(ra < 0 || a == b);
	if (ra == 0) {
		char ok[16];
		unsigned back;

		/* The answer to a line is "OK <port>\n" and reads back as that port. */
		FZ_CHECK(uds_connect_format_ok(ok, a) == strlen(ok));
		FZ_CHECK(sscanf(ok, "OK %u\n", &back) == 1 && back == a);
	}
}

/* Bytes left unread in fd (the socketpair's reading end). */
static size_t pending(int fd)
{
	static uint8_t buf[65536];
	size_t n = 0;
	ssize_t r;

	while ((r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
		n += (size_t)r;
	return n;
}

/* uds_connect_read() on a stream socket fed `chunk` bytes at a time (0: everything at once). */
static void connect_stream(const uint8_t *s, size_t len, size_t chunk)
{
	struct uds_connect_reader rd = { 0 };
	const uint8_t *nl = memchr(s, '\n', len < UDS_CONNECT_LINE_MAX ? len
								: UDS_CONNECT_LINE_MAX);
	int sv[2], r = -EAGAIN, want;
	size_t sent = 0, used;
	uint32_t port = 0, wport = 0;

	if (len > 60000)
		len = 60000; /* fits the socket buffer */
	if (nl) {
		used = (size_t)(nl - s) + 1;
		want = ref_connect(s, used, &wport);
	} else if (len >= UDS_CONNECT_LINE_MAX) {
		used = UDS_CONNECT_LINE_MAX;
		want = -EMSGSIZE;
	} else {
		used = len;
		want = -ECONNRESET;
	}
	FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	while (r == -EAGAIN && sent < len) {
		size_t n = chunk && chunk < len - sent ? chunk : len - sent;

		FZ_CHECK(send(sv[1], s + sent, n, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)n);
		sent += n;
		r = uds_connect_read(&rd, sv[0], false, &port);
	}
	if (r == -EAGAIN) {
		shutdown(sv[1], SHUT_WR);
		r = uds_connect_read(&rd, sv[0], false, &port);
	}
	FZ_CHECK(r == want);
	FZ_CHECK(r < 0 || port == wport);
	FZ_CHECK(sent >= used && pending(sv[0]) == sent - used);
	close(sv[0]);
	close(sv[1]);
}

static void connect_seqpacket(const uint8_t *s, size_t len)
{
	struct uds_connect_reader rd = { 0 };
	uint32_t port = 0, wport = 0;
	int sv[2], r, want;

	if (len > 4096)
		len = 4096;
	if (len == 0)
		want = -ECONNRESET; /* an empty message reads as the end */
	else if (len > UDS_CONNECT_LINE_MAX)
		want = -EMSGSIZE;
	else
		want = ref_connect(s, len, &wport);
	FZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	FZ_CHECK(send(sv[1], s, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len);
	r = uds_connect_read(&rd, sv[0], true, &port);
	FZ_CHECK(r == want);
	FZ_CHECK(r < 0 || port == wport);
	close(sv[0]);
	close(sv[1]);
}

/* ---- config ----------------------------------------------------------------------------- */

static bool str_ok(const char *s, size_t size)
{
	return memchr(s, '\0', size) != NULL;
}

static void check_config(const struct config_file *c)
{
	FZ_CHECK(c->n_vms >= 1 && c->n_vms <= UVSOCKD_MAX_VMS && c->vms);
	FZ_CHECK(!c->have_control || str_ok(c->control_path, sizeof(c->control_path)));
	FZ_CHECK(!c->have_log_level || (unsigned)c->log_level < _LOG_LVL_MAX);
	for (unsigned i = 0; i < c->n_vms; i++) {
		const struct uvsockd_vm_config *v = &c->vms[i];

		FZ_CHECK(v->guest_cid > 2 && v->guest_cid != UINT32_MAX);
		FZ_CHECK(str_ok(v->socket_path, sizeof(v->socket_path)));
		FZ_CHECK(str_ok(v->uds_path, sizeof(v->uds_path)));
		FZ_CHECK(strlen(v->uds_path) <= UVSOCKD_SUN_PATH_MAX - UVSOCKD_UDS_SUFFIX_MAX);
		FZ_CHECK(v->tx_buffer_size >= UVSOCKD_MIN_TX_BUFFER_SIZE &&
			 v->tx_buffer_size <= UVSOCKD_MAX_TX_BUFFER_SIZE);
		FZ_CHECK(v->queue_size >= 1 && v->queue_size <= UVSOCKD_MAX_QUEUE_SIZE);
		FZ_CHECK(v->n_groups <= UVSOCKD_MAX_GROUPS);
		for (unsigned g = 0; g < v->n_groups; g++)
			FZ_CHECK(str_ok(v->groups[g], sizeof(v->groups[g])) && v->groups[g][0]);
		for (unsigned j = 0; j < i; j++)
			FZ_CHECK(c->vms[j].guest_cid != v->guest_cid);
	}
}

/* Appends "s" double-quoted (escaping \" and \\: the parser refuses control characters). */
static void yaml_quoted(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

static const char *const level_names[] = { "error", "warn", "info", "debug" };

/* Writes c back as a config file of the subset. Returns a malloc'd text (*len bytes). */
static char *config_write(const struct config_file *c, size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);

	FZ_CHECK(f != NULL);
	if (c->have_control) {
		fputs("control: ", f);
		yaml_quoted(f, c->control_path);
		fputc('\n', f);
	}
	if (c->have_log_level)
		fprintf(f, "log_level: %s\n", level_names[c->log_level]);
	fputs("vms:\n", f);
	for (unsigned i = 0; i < c->n_vms; i++) {
		const struct uvsockd_vm_config *v = &c->vms[i];

		fprintf(f, "  - guest_cid: %u\n    socket: ", v->guest_cid);
		yaml_quoted(f, v->socket_path);
		fputs("\n    uds_path: ", f);
		yaml_quoted(f, v->uds_path);
		fprintf(f, "\n    tx_buffer_size: %u\n    queue_size: %u\n", v->tx_buffer_size,
			v->queue_size);
		if (v->n_groups) {
			fputs("    groups: [", f);
			for (unsigned g = 0; g < v->n_groups; g++)
				fprintf(f, "%s%s", g ? ", " : "", v->groups[g]);
			fputs("]\n", f);
		}
		if (v->name[0])
			fprintf(f, "    name: %s\n", v->name);
		if (v->max_conns)
			fprintf(f, "    max_conns: %u\n", v->max_conns);
	}
	FZ_CHECK(fclose(f) == 0);
	return text;
}

static void same_config(const struct config_file *a, const struct config_file *b)
{
	FZ_CHECK(a->n_vms == b->n_vms);
	FZ_CHECK(a->have_control == b->have_control);
	FZ_CHECK(!a->have_control || strcmp(a->control_path, b->control_path) == 0);
	FZ_CHECK(a->have_log_level == b->have_log_level);
	FZ_CHECK(!a->have_log_level || a->log_level == b->log_level);
	for (unsigned i = 0; i < a->n_vms; i++) {
		const struct uvsockd_vm_config *x = &a->vms[i], *y = &b->vms[i];

		FZ_CHECK(x->guest_cid == y->guest_cid);
		FZ_CHECK(strcmp(x->socket_path, y->socket_path) == 0);
		FZ_CHECK(strcmp(x->uds_path, y->uds_path) == 0);
		FZ_CHECK(x->tx_buffer_size == y->tx_buffer_size && x->queue_size == y->queue_size);
		FZ_CHECK(x->n_groups == y->n_groups);
		for (unsigned g = 0; g < x->n_groups; g++)
			FZ_CHECK(strcmp(x->groups[g], y->groups[g]) == 0);
		FZ_CHECK(strcmp(x->name, y->name) == 0 && x->max_conns == y->max_conns);
	}
}

static void config_one(const uint8_t *s, size_t len)
{
	struct config_file c = { 0 }, back = { 0 };
	char err[256] = "", err2[256] = "";
	size_t tlen;
	char *text;
	int r = config_file_parse("fz.yaml", (const char *)s, len, &c, err, sizeof(err));

	if (r < 0) {
		FZ_CHECK(r == -EINVAL || r == -EFBIG || r == -ENOMEM);
		FZ_CHECK(strncmp(err, "fz.yaml:", 8) == 0 && !strchr(err, '\n'));
		return;
	}
	check_config(&c);
	text = config_write(&c, &tlen);
	r = config_file_parse("back.yaml", text, tlen, &back, err2, sizeof(err2));
	if (r < 0)
		fprintf(stderr, "fuzz-text: config written back does not parse: %s\n%s", err2, text);
	FZ_CHECK(r == 0);
	same_config(&c, &back);
	free(text);
	config_file_clear(&back);
	config_file_clear(&c);
}

/* ---- JSON ------------------------------------------------------------------------------- */

/* A number the writer can write: a u64, or an integral double in int64 range. */
static bool writable_num(const struct ops_jv *v)
{
	return v->is_uint || (v->d == floor(v->d) && fabs(v->d) < 9.2e18);
}

static int tree_depth(const struct ops_jv *v)
{
	int d = 0;

	if (v->type != OPS_J_ARR && v->type != OPS_J_OBJ)
		return 0;
	for (const struct ops_jv *c = v->child; c; c = c->next) {
		int cd = tree_depth(c);

		d = cd > d ? cd : d;
	}
	return d + 1;
}

static void json_write(struct ops_jw *w, const struct ops_jv *v, const char *key)
{
	switch (v->type) {
	case OPS_J_NULL: ops_jw_null(w, key); break;
	case OPS_J_BOOL: ops_jw_bool(w, key, v->b); break;
	case OPS_J_STR: ops_jw_str(w, key, v->s); break;
	case OPS_J_NUM:
		if (v->is_uint)
			ops_jw_u64(w, key, v->u);
		else if (writable_num(v))
			ops_jw_i64(w, key, (int64_t)v->d);
		else
			ops_jw_null(w, key);
		break;
	case OPS_J_ARR:
	case OPS_J_OBJ:
		if (v->type == OPS_J_ARR)
			ops_jw_arr_begin(w, key);
		else
			ops_jw_obj_begin(w, key);
		for (const struct ops_jv *c = v->child; c; c = c->next)
			json_write(w, c, v->type == OPS_J_OBJ ? c->key : NULL);
		if (v->type == OPS_J_ARR)
			ops_jw_arr_end(w);
		else
			ops_jw_obj_end(w);
		break;
	}
}

static void same_json(const struct ops_jv *a, const struct ops_jv *b)
{
	FZ_CHECK((a->key == NULL) == (b->key == NULL));
	FZ_CHECK(!a->key || strcmp(a->key, b->key) == 0);
	if (a->type == OPS_J_NUM && !writable_num(a)) {
		FZ_CHECK(b->type == OPS_J_NULL);
		return;
	}
	FZ_CHECK(a->type == b->type);
	switch (a->type) {
	case OPS_J_BOOL: FZ_CHECK(a->b == b->b); break;
	case OPS_J_STR: FZ_CHECK(strcmp(a->s, b->s) == 0); break;
	case OPS_J_NUM:
		if (a->is_uint)
			FZ_CHECK(b->is_uint && a->u == b->u);
		else
			FZ_CHECK(b->is_uint ? (double)b->u == a->d : b->d == a->d);
		break;
	case OPS_J_ARR:
	case OPS_J_OBJ: {
		const struct ops_jv *x = a->child, *y = b->child;

		for (; x && y; x = x->next, y = y->next)
			same_json(x, y);
		FZ_CHECK(!x && !y);
		break;
	}
	default:
		break;
	}
}

static void json_one(const uint8_t *s, size_t len)
{
	struct ops_jv *v = NULL, *back = NULL;
	struct ops_jw w;
	size_t small;
	int r;

	if (!len)
		return;
	small = s[0] % 64; /* a second, tiny cap */
	r = ops_json_parse((const char *)s + 1, len - 1, &v);
	if (r < 0) {
		FZ_CHECK(r == -EINVAL || r == -ENOMEM);
		return;
	}
	(void)ops_json_u64(v, "proto", 0);
	(void)ops_json_str(v, "error", NULL);
	(void)ops_json_bool(v, "ok", false);
	FZ_CHECK(ops_jw_init(&w, 16 * len + 4096) == 0);
	json_write(&w, v, NULL);
	if (ops_jw_overflowed(&w)) {
		/* Only a tree nested deeper than the writer's cap may fail to be written. */
		FZ_CHECK(tree_depth(v) > OPS_JSON_MAX_DEPTH);
	} else {
		FZ_CHECK(strlen(w.buf) == w.len);
		r = ops_json_parse(w.buf, w.len, &back);
		if (r < 0)
			fprintf(stderr, "fuzz-text: written JSON does not parse: %s\n", w.buf);
		FZ_CHECK(r == 0);
		same_json(v, back);
		ops_json_free(back);
	}
	ops_jw_free(&w);
	FZ_CHECK(ops_jw_init(&w, small) == 0);
	json_write(&w, v, NULL);
	FZ_CHECK(w.len <= small);
	if (!ops_jw_overflowed(&w)) {
		FZ_CHECK(ops_json_parse(w.buf, w.len, &back) == 0);
		ops_json_free(back);
	}
	ops_jw_free(&w);
	ops_json_free(v);
}

/* ---- control requests ------------------------------------------------------------------- */

#define FZ_CTL_VMS 4u

struct fz_ctl {
	struct fz_in in;
	unsigned n_vms, n_conns;
	bool taps;
	char name[32];
	char host[108];
	struct ops_tap tap[FZ_CTL_VMS];
};

static unsigned fc_vm_count(void *opaque)
{
	return ((struct fz_ctl *)opaque)->n_vms;
}

static uint32_t fc_vm_cid(void *opaque, unsigned idx)
{
	(void)opaque;
	return 3 + idx;
}

static void fc_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *s)
{
	struct fz_ctl *f = opaque;

	s->cid = 3 + idx;
	memcpy(s->name, f->name, sizeof(s->name));
	s->vmm_connected = idx & 1;
	s->broken = idx & 2;
	atomic_store_explicit(&s->c.tx_pkts, UINT64_MAX - idx, memory_order_relaxed);
	atomic_store_explicit(&s->c.dropped[OPS_DROP_NO_ROUTE], idx, memory_order_relaxed);
	s->have_engine = idx == 0;
	s->eng.socks_open = 7;
}

static void fc_vm_conns(void *opaque, unsigned idx,
			bool (*emit)(void *arg, const struct ops_conn_info *ci), void *arg)
{
	struct fz_ctl *f = opaque;

	for (unsigned k = 0; k < f->n_conns; k++) {
		struct ops_conn_info ci = {
			.vm_cid = 3 + idx,
			.sock = { .type = k % 2 ? VSOCK_TYPE_SEQPACKET : VSOCK_TYPE_STREAM,
				  .state = (enum vsock_state)(k % 8),
				  .local_cid = 2, .local_port = k, .peer_cid = 3 + idx,
				  .peer_port = UINT32_MAX - k, .tx_cnt = k, .peer_fwd_cnt = ~k },
		};

		memcpy(ci.host, f->host, sizeof(ci.host));
		if (!emit(arg, &ci))
			return;
	}
}

static struct ops_tap *fc_vm_tap(void *opaque, unsigned idx)
{
	return &((struct fz_ctl *)opaque)->tap[idx];
}

static const struct ops_ctl_ops fc_ops = {
	.vm_count = fc_vm_count, .vm_cid = fc_vm_cid, .vm_stats = fc_vm_stats,
	.vm_conns = fc_vm_conns, .vm_tap = fc_vm_tap,
};
static const struct ops_ctl_ops fc_ops_notap = {
	.vm_count = fc_vm_count, .vm_cid = fc_vm_cid, .vm_stats = fc_vm_stats,
};

/* Input bytes as a NUL-terminated string of at most size - 1 bytes (stopping at a NUL). */
static void take_string(struct fz_in *in, char *buf, size_t size)
{
	size_t n, want = fz_u8(in) % size;
	const uint8_t *p = fz_bytes(in, want, &n);

	memcpy(buf, p, n);
	buf[n] = '\0';
}

/* '/' becomes '_'; a word starting with '@' becomes a path in fz_dir. Returns false if too long. */
static bool sandbox_request(const char *in, char *out, size_t size)
{
	size_t o = 0;

	for (size_t i = 0; in[i]; i++) {
		bool word = i == 0 || in[i - 1] == ' ' || in[i - 1] == '\t';

		if (word && in[i] == '@') {
			int n = snprintf(out + o, size - o, "%s/", fz_dir);

			if (n < 0 || (size_t)n >= size - o)
				return false;
			o += (size_t)n;
			continue;
		}
		if (o + 1 >= size)
			return false;
		out[o++] = in[i] == '/' ? '_' : in[i];
	}
	out[o] = '\0';
	return true;
}

static void check_answer(const struct ops_jw *w)
{
	struct ops_jv *v = NULL;
	const struct ops_jv *ok, *proto;

	FZ_CHECK(!ops_jw_overflowed(w));
	FZ_CHECK(w->len > 0 && strlen(w->buf) == w->len && !strchr(w->buf, '\n'));
	if (ops_json_parse(w->buf, w->len, &v) < 0)
		fprintf(stderr, "fuzz-text: control answer is not JSON: %s\n", w->buf);
	FZ_CHECK(v != NULL && v->type == OPS_J_OBJ);
	proto = ops_json_get(v, "proto");
	ok = ops_json_get(v, "ok");
	FZ_CHECK(proto && proto->type == OPS_J_NUM && proto->is_uint && proto->u == OPS_CTL_PROTO);
	FZ_CHECK(ok && ok->type == OPS_J_BOOL);
	FZ_CHECK(ok->b || ops_json_str(v, "error", NULL) != NULL);
	ops_json_free(v);
}

static void ctl_one(const uint8_t *s, size_t size)
{
	static const size_t caps[] = { 16u << 20, 4096, 512, 128 };
	static struct fz_ctl f;
	static struct ops_ctl c;
	struct ctl_client cl = { .fd = -1, .pass_fd = -1 };
	uint8_t sel;

	memset(&f, 0, sizeof(f));
	f.in = (struct fz_in){ .p = s, .n = size };
	sel = fz_u8(&f.in);
	f.n_vms = sel % (FZ_CTL_VMS + 1);
	f.n_conns = (sel >> 3) % 4;
	f.taps = sel & 0x20;
	take_string(&f.in, f.name, sizeof(f.name));
	take_string(&f.in, f.host, sizeof(f.host));
	for (unsigned i = 0; i < FZ_CTL_VMS; i++)
		ops_tap_init(&f.tap[i]);
	memset(&c, 0, sizeof(c));
	c.ops = f.taps ? &fc_ops : &fc_ops_notap;
	c.opaque = &f;
	c.max_response = caps[(sel >> 6) % 4];
	snprintf(c.server, sizeof(c.server), "fuzz \"1\"\\");
	cl.ctl = &c;

	/* The rest: request lines, as ctl.c cuts them (newline, a trailing '\r', no NUL). */
	while (f.in.n > 0 && !cl.closing) {
		char line[OPS_CTL_MAX_REQUEST], req[OPS_CTL_MAX_REQUEST + 64];
		const uint8_t *nl = memchr(f.in.p, '\n', f.in.n);
		size_t n = nl ? (size_t)(nl - f.in.p) : f.in.n, got;
		const uint8_t *p = fz_bytes(&f.in, n + (nl != NULL), &got);
		struct ops_jw w;

		if (n >= sizeof(line) || memchr(p, '\0', n))
			continue;
		memcpy(line, p, n);
		line[n] = '\0';
		if (n && line[n - 1] == '\r')
			line[n - 1] = '\0';
		if (!sandbox_request(line, req, sizeof(req)))
			continue;
		if (strstr(req, " -"))
			cl.pass_fd = memfd_create("fuzz-capture", MFD_CLOEXEC);
		FZ_CHECK(ops_jw_init(&w, c.max_response) == 0);
		ctl_cmd_run(&c, &cl, req, &w);
		check_answer(&w);
		ops_jw_free(&w);
		if (cl.pass_fd >= 0) {
			close(cl.pass_fd);
			cl.pass_fd = -1;
		}
	}
	ctl_capture_end(&c, "fuzz");
	for (unsigned i = 0; i < FZ_CTL_VMS; i++)
		ops_tap_destroy(&f.tap[i]);
	fz_dir_clean(fz_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool init;
	int fds;

	if (!init) {
		init = true;
		log_set_level(LOG_LVL_ERROR);
		snprintf(fz_dir, sizeof(fz_dir), "/tmp/uvsock-fuzz-XXXXXX");
		FZ_CHECK(mkdtemp(fz_dir) != NULL);
		atexit(fz_cleanup);
	}
	if (size == 0)
		return 0;
	fds = fz_count_fds();
	switch (data[0] % 5) {
	case 0:
		connect_parse(data + 1, size - 1);
		if (size >= 2)
			connect_stream(data + 2, size - 2, data[1] % 40);
		break;
	case 1: connect_seqpacket(data + 1, size - 1); break;
	case 2: config_one(data + 1, size - 1); break;
	case 3: json_one(data + 1, size - 1); break;
	default: ctl_one(data + 1, size - 1); break;
	}
	FZ_CHECK(fz_count_fds() == fds);
	return 0;
}
