/* SPDX-License-Identifier: MIT */
/*
 * uvsockd option parsing (see options.h) on GNU getopt_long: `--opt=value` and `--opt value`,
 * as clap (vhost-device-vsock) accepts them, and unambiguous abbreviations. getopt_long's state
 * (optind) is reset on every call, so unit tests may call the parser many times; its own
 * messages are off (opterr = 0): every error is one line of ours in err.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "util/macros.h"
#include "config.h"
#include "ctl.h"
#include "paths.h"
#include "util/size.h"
#include "util/uds.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Parses a decimal unsigned integer that fills the whole string. */
static int parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (!*s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (*end)
		return -EINVAL;
	*ret = v;
	return 0;
}

/*
 * A byte count with an optional binary suffix K, M, G or T (KiB ... TiB; lower case too, as
 * uvsock-perf takes them). Returns 0, -EINVAL or -ERANGE.
 */
/* A byte count with K/M/G/T (util/size.h: the one parser of the tools' sizes). */
static int parse_bytes(const char *v, uint64_t *ret)
{
	return size_parse(v, 0, UINT64_MAX, ret);
}

/* A guest memory cap: a byte count (parse_bytes), at least 1 MiB. */
static int set_bytes(uint64_t *dst, const char *name, const char *v, char *err, size_t errlen)
{
	uint64_t x;

	if (parse_bytes(v, &x) < 0)
		return fail(err, errlen, "%s '%s' is not a size (a number with K, M, G or T)", name,
			    v);
	if (x < (1ull << 20))
		return fail(err, errlen, "%s %s is below the 1M minimum", name, v);
	*dst = x;
	return 0;
}

static int set_cid(struct uvsockd_vm_config *vm, const char *v, char *err, size_t errlen)
{
	uint64_t cid;
	int r = parse_u64(v, &cid);

	if (r == -ERANGE || (r == 0 && cid > UINT32_MAX))
		return fail(err, errlen, "guest-cid %s is out of range (CIDs are 32-bit)", v);
	if (r < 0)
		return fail(err, errlen, "guest-cid '%s' is not a number", v);
	if (cid <= 2 || cid == UINT32_MAX)
		return fail(err, errlen,
			    "guest-cid %s is reserved (0, 1, 2 and 4294967295 cannot be a guest CID)",
			    v);
	vm->guest_cid = (uint32_t)cid;
	return 0;
}

/* A number in [lo, hi]; with bytes, K/M/G/T suffixes are taken (parse_bytes). */
static int set_size(uint32_t *dst, const char *name, const char *v, uint64_t lo, uint64_t hi,
		    bool pow2, bool bytes, char *err, size_t errlen)
{
	uint64_t n;

	if ((bytes ? parse_bytes(v, &n) : parse_u64(v, &n)) < 0 || n < lo || n > hi)
		return fail(err, errlen, "%s '%s' must be a number in [%llu, %llu]", name, v,
			    (unsigned long long)lo, (unsigned long long)hi);
	if (pow2 && (n & (n - 1)))
		return fail(err, errlen, "%s %s must be a power of two", name, v);
	*dst = (uint32_t)n;
	return 0;
}

static int set_path(char *dst, const char *name, const char *v, size_t max, char *err,
		    size_t errlen)
{
	size_t n = strlen(v);

	if (n == 0)
		return fail(err, errlen, "%s must not be empty", name);
	if (n > max && max == UVSOCKD_CGROUP_PATH_MAX)
		return fail(err, errlen, "%s is too long: %zu bytes, the limit is %zu ('%.40s...')",
			    name, n, max, v);
	if (n > max)
		return fail(err, errlen,
			    "%s '%s' is too long: %zu bytes, the limit is %zu (Unix socket paths "
			    "have 108 bytes%s)",
			    name, v, n, max,
			    max < UVSOCKD_SUN_PATH_MAX ? ", and `<uds-path>_<port>` must fit" : "");
	memcpy(dst, v, n + 1);
	return 0;
}

static int set_groups(struct uvsockd_vm_config *vm, const char *v, char *err, size_t errlen)
{
	const char *p = v;

	vm->n_groups = 0;
	for (;;) {
		const char *e = strchr(p, '+');
		size_t n = e ? (size_t)(e - p) : strlen(p);

		if (n == 0)
			return fail(err, errlen, "groups '%s': empty group name", v);
		if (n > UVSOCKD_GROUP_NAME_MAX)
			return fail(err, errlen, "groups '%s': a name is longer than %d bytes", v,
				    UVSOCKD_GROUP_NAME_MAX);
		for (size_t i = 0; i < n; i++) {
			char c = p[i];

			if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			      (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
				return fail(err, errlen,
					    "groups '%s': names use letters, digits, '-', '_', '.'",
					    v);
		}
		if (vm->n_groups == UVSOCKD_MAX_GROUPS)
			return fail(err, errlen, "groups '%s': more than %d groups", v,
				    UVSOCKD_MAX_GROUPS);
		memcpy(vm->groups[vm->n_groups], p, n);
		vm->groups[vm->n_groups][n] = '\0';
		vm->n_groups++;
		if (!e)
			return 0;
		p = e + 1;
	}
}

/* Which keys were given for one VM (to reject repeats and find missing ones). */
enum vm_key {
	KEY_CID,
	KEY_SOCKET,
	KEY_UDS,
	KEY_TXBUF,
	KEY_QSIZE,
	KEY_GROUPS,
	KEY_CGROUP,
	KEY_FD,
	KEY_NAME,
	KEY_MAXCONNS,
	KEY_CONNREPLY,
	_KEY_MAX,
};

static const char *const key_names[_KEY_MAX] = {
	[KEY_CID] = "guest-cid",
	[KEY_SOCKET] = "socket",
	[KEY_UDS] = "uds-path",
	[KEY_TXBUF] = "tx-buffer-size",
	[KEY_QSIZE] = "queue-size",
	[KEY_GROUPS] = "groups",
	[KEY_CGROUP] = "cgroup",
	[KEY_FD] = "fd",
	[KEY_NAME] = "name",
	[KEY_MAXCONNS] = "max-conns",
	[KEY_CONNREPLY] = "connect-reply",
};

/* Key names compare with '_' and '-' equal (vhost-device-vsock accepts both). */
static bool key_eq(const char *a, size_t alen, const char *b)
{
	size_t i;

	for (i = 0; i < alen && b[i]; i++) {
		char x = a[i] == '_' ? '-' : a[i];

		if (x != b[i])
			return false;
	}
	return i == alen && b[i] == '\0';
}

static int key_lookup(const char *k, size_t n)
{
	for (int i = 0; i < _KEY_MAX; i++)
		if (key_eq(k, n, key_names[i]))
			return i;
	if (key_eq(k, n, "socket-path"))
		return KEY_SOCKET;
	return -1;
}

static int set_key(struct uvsockd_vm_config *vm, int key, const char *v, char *err, size_t errlen)
{
	switch (key) {
	case KEY_CID:
		return set_cid(vm, v, err, errlen);
	case KEY_SOCKET:
		return set_path(vm->socket_path, "socket", v, UVSOCKD_SUN_PATH_MAX, err, errlen);
	case KEY_UDS:
		return set_path(vm->uds_path, "uds-path", v,
				UVSOCKD_SUN_PATH_MAX - UVSOCKD_UDS_SUFFIX_MAX, err, errlen);
	case KEY_TXBUF:
		return set_size(&vm->tx_buffer_size, "tx-buffer-size", v,
				UVSOCKD_MIN_TX_BUFFER_SIZE, UVSOCKD_MAX_TX_BUFFER_SIZE, false, true,
				err, errlen);
	case KEY_QSIZE:
		return set_size(&vm->queue_size, "queue-size", v, 1, UVSOCKD_MAX_QUEUE_SIZE, true,
				false, err, errlen);
	case KEY_GROUPS:
		return set_groups(vm, v, err, errlen);
	case KEY_CGROUP:
		if (v[0] != '/')
			return fail(err, errlen,
				    "cgroup '%s' must be an absolute path (a cgroup v2 directory, "
				    "e.g. /sys/fs/cgroup/machine.slice/NAME)", v);
		return set_path(vm->cgroup, "cgroup", v, UVSOCKD_CGROUP_PATH_MAX, err, errlen);
	case KEY_FD: {
		uint64_t fd;

		/* 0..2 are stdio: a vhost-user socket is never passed there. */
		if (parse_u64(v, &fd) < 0 || fd < 3 || fd > INT32_MAX)
			return fail(err, errlen,
				    "fd '%s' must be the number of an inherited file descriptor (3 "
				    "or more)", v);
		vm->fd = (int)fd;
		return 0;
	}
	case KEY_NAME:
		return config_set_name(vm->name, "name", v, err, errlen);
	case KEY_MAXCONNS:
		return config_set_max_conns(&vm->max_conns, "max-conns", v, err, errlen);
	case KEY_CONNREPLY:
		return config_set_connect_reply(&vm->ok_guest_port, "connect-reply", v, err,
						errlen);
	}
	return -EINVAL;
}

static void vm_defaults(struct uvsockd_vm_config *vm)
{
	memset(vm, 0, sizeof(*vm));
	vm->guest_cid = UVSOCKD_DEFAULT_GUEST_CID;
	vm->tx_buffer_size = UVSOCKD_DEFAULT_TX_BUFFER_SIZE;
	vm->queue_size = UVSOCKD_DEFAULT_QUEUE_SIZE;
	vm->n_groups = 1;
	strcpy(vm->groups[0], "default");
}

/*
 * The vhost-user socket is a path or an inherited fd (then socket_path names it /dev/fd/N, the
 * key of its uds_adopt() entry and its name in messages); uds-path is always needed.
 */
static int check_required(struct uvsockd_vm_config *vm, const bool *seen, const char *what,
			  char *err, size_t errlen)
{
	if (seen[KEY_SOCKET] && seen[KEY_FD])
		return fail(err, errlen,
			    "%s: socket and fd exclude each other (the vhost-user socket is a path "
			    "or an inherited fd)", what);
	if (!seen[KEY_SOCKET] && !seen[KEY_FD])
		return fail(err, errlen,
			    "%s: socket is required (the vhost-user socket path; or fd=N)", what);
	if (!seen[KEY_UDS])
		return fail(err, errlen, "%s: uds-path is required (the host-side socket path)",
			    what);
	if (seen[KEY_FD])
		snprintf(vm->socket_path, sizeof(vm->socket_path), "/dev/fd/%d", vm->fd);
	return 0;
}

/* Parses the value of one --vm: comma-separated key=value pairs. */
static int parse_vm(struct uvsockd_vm_config *vm, const char *spec, char *err, size_t errlen)
{
	bool seen[_KEY_MAX] = { 0 };
	char val[4096];
	const char *p = spec;

	vm_defaults(vm);
	if (!*spec)
		return fail(err, errlen, "--vm needs key=value pairs");
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		const char *eq = memchr(p, '=', n);
		size_t vlen;
		int key, r;

		if (!eq)
			return fail(err, errlen, "--vm '%s': expected key=value, got '%.*s'", spec,
				    (int)n, p);
		key = key_lookup(p, (size_t)(eq - p));
		if (key < 0) {
			if (key_eq(p, (size_t)(eq - p), "forward-cid") ||
			    key_eq(p, (size_t)(eq - p), "forward-listen"))
				return fail(err, errlen,
					    "--vm: %.*s is not supported by uvsockd (no host "
					    "AF_VSOCK forwarding; use uds-path)",
					    (int)(eq - p), p);
			return fail(err, errlen, "--vm: unknown key '%.*s'", (int)(eq - p), p);
		}
		if (seen[key])
			return fail(err, errlen, "--vm: %s given twice", key_names[key]);
		seen[key] = true;
		vlen = n - (size_t)(eq + 1 - p);
		if (vlen >= sizeof(val))
			return fail(err, errlen, "--vm: value of %s is too long", key_names[key]);
		memcpy(val, eq + 1, vlen);
		val[vlen] = '\0';
		r = set_key(vm, key, val, err, errlen);
		if (r < 0)
			return r;
		if (!comma)
			break;
		p = comma + 1;
	}
	return check_required(vm, seen, "--vm", err, errlen);
}

/* getopt_long values: single-VM options are OPT_SINGLE + their key. */
enum {
	OPT_VM = 256,
	OPT_CONFIG,
	OPT_CONTROL,
	OPT_CAPTURE,
	OPT_GMEM,
	OPT_GMEM_TOTAL,
	OPT_LOG_LEVEL,
	OPT_ISOLATE,
	OPT_PRINT_CAPS,
	OPT_CHECK_CONFIG,
	OPT_TUNE,
	OPT_BUSY_POLL,
	OPT_SOCKET_MODE,
	OPT_SOCKET_GROUP,
	OPT_FORWARD,
	OPT_NO_DGRAM,
	OPT_DGRAM_MAX,
	OPT_SINGLE,
};

static const struct option long_opts[] = {
	{ "vm", required_argument, NULL, OPT_VM },
	{ "config", required_argument, NULL, OPT_CONFIG },
	{ "control", required_argument, NULL, OPT_CONTROL },
	{ "capture", required_argument, NULL, OPT_CAPTURE },
	{ "guest-memory-max", required_argument, NULL, OPT_GMEM },
	{ "guest-memory-total-max", required_argument, NULL, OPT_GMEM_TOTAL },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "isolate", no_argument, NULL, OPT_ISOLATE },
	{ "print-capabilities", no_argument, NULL, OPT_PRINT_CAPS },
	{ "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
	{ "tune", required_argument, NULL, OPT_TUNE },
	{ "busy-poll-us", required_argument, NULL, OPT_BUSY_POLL },
	{ "socket-mode", required_argument, NULL, OPT_SOCKET_MODE },
	{ "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
	{ "no-dgram", no_argument, NULL, OPT_NO_DGRAM },
	{ "dgram-max", required_argument, NULL, OPT_DGRAM_MAX },
	{ "forward-cid", optional_argument, NULL, OPT_FORWARD },
	{ "forward-listen", optional_argument, NULL, OPT_FORWARD },
	{ "guest-cid", required_argument, NULL, OPT_SINGLE + KEY_CID },
	{ "socket", required_argument, NULL, OPT_SINGLE + KEY_SOCKET },
	{ "socket-path", required_argument, NULL, OPT_SINGLE + KEY_SOCKET },
	{ "uds-path", required_argument, NULL, OPT_SINGLE + KEY_UDS },
	{ "tx-buffer-size", required_argument, NULL, OPT_SINGLE + KEY_TXBUF },
	{ "queue-size", required_argument, NULL, OPT_SINGLE + KEY_QSIZE },
	{ "groups", required_argument, NULL, OPT_SINGLE + KEY_GROUPS },
	{ "cgroup", required_argument, NULL, OPT_SINGLE + KEY_CGROUP },
	{ "fd", required_argument, NULL, OPT_SINGLE + KEY_FD },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

/* "--name" of a getopt_long value (the single-VM options by their first spelling). */
static const char *opt_name(int val, char *buf, size_t len)
{
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == val) {
			snprintf(buf, len, "--%s", o->name);
			return buf;
		}
	snprintf(buf, len, "-%c", val > 0 && val < 128 ? val : '?');
	return buf;
}

/* --dgram-max SIZE: 1 .. 65492 bytes (64 KiB less the 44-byte header), K suffix allowed. */
static int set_dgram_max(struct uvsockd_config *c, const char *v, char *err, size_t errlen)
{
	uint64_t x;

	if (size_parse(v, 1, 65536 - 44, &x) < 0)
		return fail(err, errlen, "--dgram-max '%s' must be a size from 1 to 65492 bytes", v);
	c->dgram_max = (uint32_t)x;
	return 0;
}

/* --tune LIST / --busy-poll-us N: appended to c->tune, checked by tune_set() at start-up. */
static int add_tune(struct uvsockd_config *c, bool busy_poll, const char *v, char *err,
		    size_t errlen)
{
	size_t n = strlen(c->tune);
	uint64_t us;
	int w;

	if (!*v)
		return fail(err, errlen, "%s needs a value",
			    busy_poll ? "--busy-poll-us" : "--tune");
	if (busy_poll && (parse_u64(v, &us) < 0 || us > 1000000))
		return fail(err, errlen, "--busy-poll-us '%s' must be a number of microseconds in "
			    "[0, 1000000]", v);
	w = snprintf(c->tune + n, sizeof(c->tune) - n, "%s%s%s", n ? "," : "",
		     busy_poll ? "busy-poll-us=" : "", v);
	if (w < 0 || (size_t)w >= sizeof(c->tune) - n)
		return fail(err, errlen, "--tune: the list is too long (at most %zu bytes)",
			    sizeof(c->tune) - 1);
	return 0;
}

/* --socket-mode MODE: octal permission bits, as chmod(1) takes them numerically. */
static int set_mode(struct uvsockd_config *c, const char *v, char *err, size_t errlen)
{
	char *end;
	unsigned long m;

	errno = 0;
	m = strtoul(v, &end, 8);
	if (!*v || *v == '-' || *end || errno || m > 0777 || m == 0)
		return fail(err, errlen,
			    "--socket-mode '%s' must be octal permission bits (e.g. 0660)", v);
	c->socket_mode = (unsigned)m;
	return 0;
}

static int set_group(struct uvsockd_config *c, const char *v, char *err, size_t errlen)
{
	if (!*v || strlen(v) >= sizeof(c->socket_group))
		return fail(err, errlen, "--socket-group '%s' is not a group name", v);
	snprintf(c->socket_group, sizeof(c->socket_group), "%s", v);
	return 0;
}

int uvsockd_socket_gid(const struct uvsockd_config *c, gid_t *gid, char *err, size_t errlen)
{
	struct group gr, *res = NULL;
	char buf[4096];
	uint64_t n;
	int e;

	*gid = (gid_t)-1;
	if (!c->socket_group[0])
		return 0;
	if (parse_u64(c->socket_group, &n) == 0 && n < UINT32_MAX) {
		*gid = (gid_t)n;
		return 0;
	}
	e = getgrnam_r(c->socket_group, &gr, buf, sizeof(buf), &res);
	if (e || !res) {
		snprintf(err, errlen, "--socket-group %s: %s", c->socket_group,
			 e ? strerror(e) : "no such group");
		return e ? -e : -ENOENT;
	}
	*gid = gr.gr_gid;
	return 0;
}

static int add_vm(struct uvsockd_config *c, const struct uvsockd_vm_config *vm, char *err,
		  size_t errlen)
{
	struct uvsockd_vm_config *v;

	if (c->n_vms == UVSOCKD_MAX_VMS)
		return fail(err, errlen, "too many --vm (at most %d)", UVSOCKD_MAX_VMS);
	v = realloc(c->vms, (c->n_vms + 1) * sizeof(*v));
	if (!v) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->vms = v;
	c->vms[c->n_vms++] = *vm;
	return 0;
}

/* Derived names and relative paths, across every VM and the control socket (paths.h). */
static int check_derived_paths(const struct uvsockd_config *c, char *err, size_t errlen)
{
	const struct uvsockd_vm_config *prev[UVSOCKD_MAX_VMS];
	char ctl[UVSOCKD_SUN_PATH_MAX + 16];
	const char *control = uvsockd_control_path(c, ctl, sizeof(ctl));

	for (unsigned i = 0; i < c->n_vms; i++) {
		int r = uvsockd_check_vm_paths(&c->vms[i], prev, i, control, err, errlen);

		if (r < 0)
			return r;
		prev[i] = &c->vms[i];
	}
	return 0;
}

static int check_unique(const struct uvsockd_config *c, char *err, size_t errlen)
{
	for (unsigned i = 0; i < c->n_vms; i++) {
		const struct uvsockd_vm_config *a = &c->vms[i];

		if (strcmp(a->socket_path, a->uds_path) == 0)
			return fail(err, errlen, "socket and uds-path are the same path '%s'",
				    a->socket_path);
		for (unsigned j = i + 1; j < c->n_vms; j++) {
			const struct uvsockd_vm_config *b = &c->vms[j];

			if (a->fd > 0 && a->fd == b->fd)
				return fail(err, errlen, "fd %d is used by two VMs", a->fd);
			if (a->guest_cid == b->guest_cid)
				return fail(err, errlen, "guest-cid %u is used by two VMs",
					    a->guest_cid);
			if (strcmp(a->socket_path, b->socket_path) == 0 ||
			    strcmp(a->socket_path, b->uds_path) == 0)
				return fail(err, errlen, "socket path '%s' is used twice",
					    a->socket_path);
			if (strcmp(a->uds_path, b->uds_path) == 0 ||
			    strcmp(a->uds_path, b->socket_path) == 0)
				return fail(err, errlen, "uds-path '%s' is used twice", a->uds_path);
		}
	}
	return check_derived_paths(c, err, errlen);
}

/* Root of VM i in the union-find forest kept in p (p[i] == i for a root), compressing paths. */
static unsigned uf_root(unsigned *p, unsigned i)
{
	unsigned r = i;

	while (p[r] != r)
		r = p[r];
	while (p[i] != r) {
		unsigned next = p[i];

		p[i] = r;
		i = next;
	}
	return r;
}

unsigned uvsockd_workers(const struct uvsockd_config *c, unsigned *worker_of)
{
	const unsigned label = 1u << 31; /* marks a finished label; VM indexes stay below */
	unsigned n = 0;

	for (unsigned i = 0; i < c->n_vms; i++)
		worker_of[i] = i;
	/* Union by the smaller index: a component's root is its first VM. */
	for (unsigned i = 0; i < c->n_vms; i++)
		for (unsigned j = i + 1; j < c->n_vms; j++)
			if (uvsockd_vms_share_group(&c->vms[i], &c->vms[j])) {
				unsigned a = uf_root(worker_of, i), b = uf_root(worker_of, j);

				worker_of[a > b ? a : b] = a > b ? b : a;
			}
	for (unsigned i = 0; i < c->n_vms; i++)
		(void)uf_root(worker_of, i);
	/* Every entry now names its root, which comes first: label roots in order, copy to rest. */
	for (unsigned i = 0; i < c->n_vms; i++)
		worker_of[i] = worker_of[i] == i ? (n++ | label) : worker_of[worker_of[i]];
	for (unsigned i = 0; i < c->n_vms; i++)
		worker_of[i] &= ~label;
	return n;
}

/* --isolate rules: cgroup= needs it, --capture excludes it, one cgroup per worker. */
static int check_isolation(const struct uvsockd_config *c, char *err, size_t errlen)
{
	unsigned *w, *first;
	int r = 0;

	for (unsigned i = 0; i < c->n_vms && !c->isolate; i++)
		if (c->vms[i].cgroup[0])
			return fail(err, errlen,
				    "guest-cid %u: cgroup=%s needs --isolate (or isolate: true in "
				    "--config): only a worker process of its own can join a VM's "
				    "cgroup", c->vms[i].guest_cid, c->vms[i].cgroup);
	if (!c->isolate)
		return 0;
	if (c->capture_path[0])
		return fail(err, errlen,
			    "--capture cannot be combined with --isolate: the VMs run in worker "
			    "processes of their own (see uvsockd(1), ISOLATION)");
	w = calloc(c->n_vms, sizeof(*w));
	first = calloc(c->n_vms, sizeof(*first));
	if (!w || !first) {
		free(w);
		free(first);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < c->n_vms; i++)
		first[i] = UINT32_MAX;
	uvsockd_workers(c, w);
	for (unsigned i = 0; i < c->n_vms && r == 0; i++) {
		const struct uvsockd_vm_config *a, *b = &c->vms[i];

		if (first[w[i]] == UINT32_MAX) {
			first[w[i]] = i;
			continue;
		}
		a = &c->vms[first[w[i]]];
		if (strcmp(a->cgroup, b->cgroup) != 0)
			r = fail(err, errlen,
				 "guest-cid %u and %u are in one worker process (their sibling "
				 "groups connect them) but name different cgroups ('%s' and '%s'): "
				 "give every VM of a group the same cgroup=", a->guest_cid,
				 b->guest_cid, a->cgroup, b->cgroup);
	}
	free(w);
	free(first);
	return r;
}

int uvsockd_parse_args(int argc, char *const *argv, struct uvsockd_config *ret, char *err,
		       size_t errlen)
{
	struct uvsockd_config c = { .action = UVSOCKD_RUN, .log_level = LOG_LVL_INFO };
	struct uvsockd_vm_config single;
	bool single_seen[_KEY_MAX] = { 0 };
	bool any_single = false, log_level_given = false, control_given = false;
	const char *config_path = NULL;
	int r = 0;

	if (errlen)
		err[0] = '\0';
	vm_defaults(&single);
	/* --print-capabilities ignores every other option (vhost-user.rst, backend conventions). */
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (strcmp(argv[i], "--print-capabilities") == 0) {
			c.action = UVSOCKD_PRINT_CAPABILITIES;
			*ret = c;
			return 0;
		}
	optind = 0; /* glibc: a full re-initialisation, for repeated calls */
	opterr = 0;
	for (;;) {
		char name[48];
		int o = getopt_long(argc, argv, "-:hV", long_opts, NULL);
		const char *v = optarg;

		if (o == -1)
			break;
		r = 0;
		switch (o) {
		case 'h':
			c.action = UVSOCKD_HELP;
			break;
		case 'V':
			if (c.action == UVSOCKD_RUN)
				c.action = UVSOCKD_VERSION;
			break;
		case OPT_ISOLATE:
			c.isolate = true;
			break;
		case OPT_CHECK_CONFIG:
			c.check_config = true;
			break;
		case OPT_VM: {
			struct uvsockd_vm_config vm;

			r = parse_vm(&vm, v, err, errlen);
			if (r == 0)
				r = add_vm(&c, &vm, err, errlen);
			break;
		}
		case OPT_CONFIG:
			if (config_path)
				r = fail(err, errlen, "--config given twice");
			config_path = v;
			break;
		case OPT_CONTROL:
			if (control_given)
				r = fail(err, errlen, "--control given twice");
			control_given = true;
			if (r == 0 && strcmp(v, "none") == 0)
				c.control_off = true;
			else if (r == 0)
				r = set_path(c.control_path, "--control", v, UVSOCKD_SUN_PATH_MAX,
					     err, errlen);
			break;
		case OPT_CAPTURE:
			if (c.capture_path[0])
				r = fail(err, errlen, "--capture given twice");
			else
				r = set_path(c.capture_path, "--capture", v,
					     sizeof(c.capture_path) - 1, err, errlen);
			break;
		case OPT_GMEM:
			r = set_bytes(&c.guest_memory_max, "--guest-memory-max", v, err, errlen);
			break;
		case OPT_GMEM_TOTAL:
			r = set_bytes(&c.guest_memory_total_max, "--guest-memory-total-max", v, err,
				      errlen);
			break;
		case OPT_LOG_LEVEL: {
			int lvl = log_level_from_string(v);

			if (lvl < 0)
				r = fail(err, errlen,
					 "--log-level '%s': expected error, warn, info or debug", v);
			c.log_level = (enum log_level)(lvl < 0 ? 0 : lvl);
			log_level_given = true;
			break;
		}
		case OPT_TUNE:
		case OPT_BUSY_POLL:
			r = add_tune(&c, o == OPT_BUSY_POLL, v, err, errlen);
			break;
		case OPT_SOCKET_MODE:
			r = set_mode(&c, v, err, errlen);
			break;
		case OPT_SOCKET_GROUP:
			r = set_group(&c, v, err, errlen);
			break;
		case OPT_NO_DGRAM:
			c.no_dgram = true;
			break;
		case OPT_DGRAM_MAX:
			r = set_dgram_max(&c, v, err, errlen);
			break;
		case OPT_FORWARD:
			r = fail(err, errlen, "%s is not supported by uvsockd (see uvsockd --help)",
				 argv[optind - 1]);
			break;
		case ':':
			r = fail(err, errlen, "%s needs a value", opt_name(optopt, name,
									 sizeof(name)));
			break;
		case '?':
		case 1: /* a word that is not an option */
			r = fail(err, errlen, "unknown argument '%s' (see uvsockd --help)",
				 o == 1 ? v : argv[optind - 1]);
			break;
		default: {
			int key = o - OPT_SINGLE;

			if (single_seen[key]) {
				r = fail(err, errlen, "%s given twice", opt_name(o, name,
										 sizeof(name)));
				break;
			}
			single_seen[key] = true;
			any_single = true;
			r = set_key(&single, key, v, err, errlen);
			break;
		}
		}
		if (r < 0)
			goto out_fail;
	}
	if (optind < argc) { /* words after "--" */
		r = fail(err, errlen, "unknown argument '%s' (see uvsockd --help)", argv[optind]);
		goto out_fail;
	}
	if (c.action != UVSOCKD_RUN) {
		*ret = c;
		return 0;
	}
	if (config_path) {
		struct config_file oc = { 0 };
		enum log_level cli_level = c.log_level;

		if (any_single || c.n_vms) {
			r = fail(err, errlen,
				 "--config cannot be combined with --vm or the single-VM options");
			goto out_fail;
		}
		r = config_file_load(config_path, &oc, err, errlen);
		if (r < 0) {
			if (errlen && !err[0])
				snprintf(err, errlen, "--config %s: %s", config_path, strerror(-r));
			goto out_fail;
		}
		r = config_file_apply(&oc, &c);
		/* The command line's --control wins over the file's. */
		if (r == 0 && oc.have_control && !control_given)
			snprintf(c.control_path, sizeof(c.control_path), "%s", oc.control_path);
		config_file_clear(&oc);
		if (r < 0) {
			snprintf(err, errlen, "--config %s: %s", config_path, strerror(-r));
			goto out_fail;
		}
		/* The command line wins over the file (--isolate has no "off" form: it adds). */
		if (log_level_given)
			c.log_level = cli_level;
	}
	if (any_single && c.n_vms) {
		r = fail(err, errlen,
			 "--vm cannot be combined with --guest-cid/--socket/--uds-path/...");
		goto out_fail;
	}
	if (any_single) {
		r = check_required(&single, single_seen, "single-VM options", err, errlen);
		if (r < 0) {
			/* Say it with the option names the user typed. */
			if (single_seen[KEY_SOCKET] && single_seen[KEY_FD])
				r = fail(err, errlen, "--socket and --fd exclude each other");
			else
				r = fail(err, errlen, "%s is required (or use --vm)",
					 single_seen[KEY_SOCKET] || single_seen[KEY_FD] ?
						 "--uds-path" : "--socket");
			goto out_fail;
		}
		r = add_vm(&c, &single, err, errlen);
		if (r < 0)
			goto out_fail;
	}
	if (c.n_vms == 0) {
		r = fail(err, errlen,
			 "no VM given: use --vm guest-cid=N,socket=PATH,uds-path=PATH "
			 "(see uvsockd --help)");
		goto out_fail;
	}
	r = check_unique(&c, err, errlen);
	if (r < 0)
		goto out_fail;
	/* No default control path beside an inherited socket: --control PATH gives one. */
	if (c.vms[0].fd > 0 && !c.control_path[0])
		c.control_off = true;
	r = check_isolation(&c, err, errlen);
	if (r < 0)
		goto out_fail;
	*ret = c;
	return 0;

out_fail:
	uvsockd_config_clear(&c);
	return r < 0 ? r : -EINVAL;
}

static int check_dir_of(const char *path, const char *what, char *err, size_t errlen)
{
	char copy[UVSOCKD_SUN_PATH_MAX + 1];
	struct stat st;
	const char *dir;

	snprintf(copy, sizeof(copy), "%s", path);
	dir = dirname(copy);
	if (stat(dir, &st) < 0) {
		int e = errno;

		snprintf(err, errlen, "%s '%s': directory '%s': %s", what, path, dir, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s '%s': '%s' is not a directory", what, path, dir);
		return -ENOTDIR;
	}
	if (access(dir, W_OK | X_OK) < 0) {
		int e = errno;

		snprintf(err, errlen, "%s '%s': cannot create sockets in '%s': %s", what, path, dir,
			 strerror(e));
		return -e;
	}
	if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s '%s' exists and is not a socket", what, path);
		return -EEXIST;
	}
	return 0;
}

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif

/*
 * cgroup=DIR: a directory of a cgroup file system (v2; a v1 hierarchy's directory works the
 * same) whose cgroup.procs we may write (the worker writes its PID there).
 */
static int check_cgroup(const char *dir, char *err, size_t errlen)
{
	char procs[UVSOCKD_CGROUP_PATH_MAX + 16];
	struct statfs sf;
	struct stat st;
	int e;

	e = stat(dir, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
	if (e) {
		snprintf(err, errlen, "cgroup '%s': %s", dir, strerror(e));
		return -e;
	}
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
	if (access(procs, W_OK) < 0) {
		e = errno;
		snprintf(err, errlen,
			 "cgroup '%s': cannot write %s: %s (a cgroup v2 directory is needed, "
			 "writable by uvsockd)", dir, procs, strerror(e));
		return -e;
	}
	if (statfs(dir, &sf) < 0 ||
	    (sf.f_type != CGROUP2_SUPER_MAGIC && sf.f_type != CGROUP_SUPER_MAGIC)) {
		snprintf(err, errlen,
			 "cgroup '%s' is not a cgroup directory (cgroup2 is mounted at "
			 "/sys/fs/cgroup on most systems)", dir);
		return -EINVAL;
	}
	return 0;
}

/*
 * A path uvsockd will listen on must not be served by a live process (another uvsockd): probe
 * it now, before anything is bound, and name the owner's PID when the probe learns it. A stale
 * socket file passes (uds_listen replaces it and the device logs that).
 */
static int check_not_served(const char *path, int type, const char *what, uint32_t cid,
			    char *err, size_t errlen)
{
	char pid[32] = "";
	pid_t owner;
	int r = uds_probe_owner(path, type, &owner);

	if (r == 0 || r == -EEXIST) /* EEXIST: not a socket, reported by check_dir_of */
		return 0;
	if (owner > 0)
		snprintf(pid, sizeof(pid), " (pid %d)", (int)owner);
	if (r == -EADDRINUSE && cid)
		snprintf(err, errlen,
			 "guest-cid %u: %s %s is in use: another process serves it%s; stop it, or "
			 "choose another path", cid, what, path, pid);
	else if (r == -EADDRINUSE)
		snprintf(err, errlen,
			 "%s %s is in use: another process serves it%s; stop it, or choose another "
			 "path (--control)", what, path, pid);
	else
		snprintf(err, errlen, "%s %s: cannot probe it: %s", what, path, strerror(-r));
	return r;
}

/* Every path of every VM and the control socket, probed before any is bound (uvsockd.md). */
static int check_all_unserved(const struct uvsockd_config *c, char *err, size_t errlen)
{
	char path[UVSOCKD_SUN_PATH_MAX + 16];
	int r;

	for (unsigned i = 0; i < c->n_vms; i++) {
		const struct uvsockd_vm_config *v = &c->vms[i];

		if (v->fd <= 0 && !uds_is_adopted(v->socket_path)) {
			r = check_not_served(v->socket_path, SOCK_STREAM, "socket", v->guest_cid,
					     err, errlen);
			if (r < 0)
				return r;
		}
		r = check_not_served(v->uds_path, SOCK_STREAM, "uds-path", v->guest_cid, err,
				     errlen);
		if (r < 0)
			return r;
		snprintf(path, sizeof(path), "%s_seqpacket", v->uds_path);
		r = check_not_served(path, SOCK_SEQPACKET, "uds-path", v->guest_cid, err, errlen);
		if (r < 0)
			return r;
		if (c->no_dgram)
			continue;
		snprintf(path, sizeof(path), "%s.dgram", v->uds_path);
		r = check_not_served(path, SOCK_DGRAM, "uds-path", v->guest_cid, err, errlen);
		if (r < 0)
			return r;
	}
	if (c->control_off)
		return 0;
	if (c->control_path[0])
		snprintf(path, sizeof(path), "%s", c->control_path);
	else if (ops_ctl_default_path(c->vms[0].socket_path, path, sizeof(path)) < 0)
		return 0; /* too long: the control socket's start reports it */
	return check_not_served(path, SOCK_STREAM, "control socket", 0, err, errlen);
}

int uvsockd_check_dirs(const struct uvsockd_config *c, char *err, size_t errlen)
{
	for (unsigned i = 0; i < c->n_vms; i++) {
		int r = 0;

		if (c->vms[i].fd <= 0 && !uds_is_adopted(c->vms[i].socket_path))
			r = check_dir_of(c->vms[i].socket_path, "socket", err, errlen);
		if (r < 0)
			return r;
		r = check_dir_of(c->vms[i].uds_path, "uds-path", err, errlen);
		if (r < 0)
			return r;
		if (c->vms[i].cgroup[0]) {
			r = check_cgroup(c->vms[i].cgroup, err, errlen);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

int uvsockd_check_paths(const struct uvsockd_config *c, char *err, size_t errlen)
{
	int r = uvsockd_check_dirs(c, err, errlen);

	return r < 0 ? r : check_all_unserved(c, err, errlen);
}

void uvsockd_config_clear(struct uvsockd_config *c)
{
	free(c->vms);
	c->vms = NULL;
	c->n_vms = 0;
}

bool uvsockd_vms_share_group(const struct uvsockd_vm_config *a, const struct uvsockd_vm_config *b)
{
	for (unsigned i = 0; i < a->n_groups; i++)
		for (unsigned j = 0; j < b->n_groups; j++)
			if (strcmp(a->groups[i], b->groups[j]) == 0)
				return true;
	return false;
}

void uvsockd_print_usage(FILE *f, const char *prog)
{
	fprintf(f,
		"Usage: %s --vm guest-cid=N,socket=PATH,uds-path=PATH[,KEY=VALUE...] [--vm ...]\n"
		"       %s --guest-cid N --socket PATH --uds-path PATH [OPTIONS]\n"
		"       %s --config FILE [OPTIONS]\n"
		"\n"
		"vhost-user-vsock backend: serves virtio-vsock to one or more VMs; guest<->host\n"
		"traffic goes to Unix sockets (Firecracker hybrid convention), guest<->guest\n"
		"traffic is routed between VMs that share a group.\n"
		"\n"
		"Options:\n"
		"  --vm KEY=VALUE[,KEY=VALUE...]\n"
		"                          one VM (repeatable); keys: guest-cid, socket, fd,\n"
		"                          uds-path, tx-buffer-size, queue-size, groups,\n"
		"                          cgroup, name, max-conns, connect-reply\n"
		"                          ('_' may replace '-')\n"
		"  --guest-cid N           guest CID (3..4294967294, default 3)\n"
		"  --socket PATH           vhost-user socket the VMM connects to\n"
		"                          (alias: --socket-path)\n"
		"  --fd FDNUM              an inherited vhost-user socket instead (listening,\n"
		"                          or connected to the VMM)\n"
		"  --uds-path PATH         host-side Unix socket: host programs connect here and\n"
		"                          send \"CONNECT <port>\\n\"; guest connections to host\n"
		"                          port P go to PATH_P\n"
		"                          datagrams: AF_UNIX SOCK_DGRAM, \"<guest port>\\n\" then\n"
		"                          the payload; send to PATH.dgram; guest datagrams to\n"
		"                          host port P go to the socket bound at PATH_P.dgram\n"
		"  --tx-buffer-size BYTES  receive buffer per connection advertised to the guest\n"
		"                          (buf_alloc; 4096..67108864 or 4K..64M, default 256K)\n"
		"  --queue-size N          largest virtqueue size accepted (power of two,\n"
		"                          up to 32768, default 1024)\n"
		"  --groups NAME[+NAME...] sibling groups: VMs sharing a group may connect to\n"
		"                          each other by CID (default: default)\n"
		"  --cgroup DIR            with --isolate: the cgroup v2 directory the VM's\n"
		"                          worker process joins before it touches guest memory\n"
		"  --config FILE           read the VMs from a YAML file (vhost-device-vsock's\n"
		"                          vms: list); not combinable with --vm\n"
		"  --control PATH|none     control socket for uvsock-stat (default: the first\n"
		"                          VM's socket path + \".ctl\"; none: no control socket)\n"
		"  --capture FILE          write every packet of every VM into FILE (pcap,\n"
		"                          vsockmon format), from start-up until exit; FILE\n"
		"                          must not exist\n"
		"  --isolate               run each sibling group's VMs in a worker process of\n"
		"                          its own (\"uvsockd vmN\"), which can be placed in the\n"
		"                          VM's cgroup so that guest memory uvsockd touches is\n"
		"                          charged there; not combinable with --capture\n"
		"  --guest-memory-max SIZE guest memory one VM may map (K, M, G, T suffixes;\n"
		"                          default 1T)\n"
		"  --guest-memory-total-max SIZE\n"
		"                          guest memory all VMs of one process may map\n"
		"                          (default 16T)\n"
		"  --socket-mode MODE      permissions (octal) of the vhost-user and host-side\n"
		"                          sockets (default: as the umask leaves them)\n"
		"  --socket-group GROUP    group of those sockets (name or number)\n"
		"  --tune LIST             data-path switches for benchmarks: NAME, no-NAME,\n"
		"                          busy-poll-us=N, comma-separated (repeatable)\n"
		"  --busy-poll-us N        device threads spin N us for work before sleeping\n"
		"                          (the same as --tune busy-poll-us=N; default 0)\n"
		"  --no-dgram              do not offer datagrams (VIRTIO_VSOCK_F_DGRAM)\n"
		"  --dgram-max SIZE        largest datagram payload (1..65492, default 65492)\n"
		"  --log-level LEVEL       error, warn, info (default) or debug\n"
		"  --print-capabilities    print the vhost-user backend capabilities as JSON\n"
		"  --check-config          check the command line and the --config file, say\n"
		"                          so and exit (0, or 2 with the error); binds nothing\n"
		"                          and exit, ignoring every other option\n"
		"  --takeover FD           internal, first on the command line: the new process\n"
		"                          of a live upgrade (uvsock-ctl upgrade, SIGUSR2;\n"
		"                          with --isolate its new main process)\n"
		"  --iso-worker SPEC       internal, first on the command line: a worker of\n"
		"                          --isolate started by its main process (upgrade)\n"
		"  -h, --help              print this help\n"
		"  -V, --version           print the version\n"
		"\n"
		"Values follow as the next argument or after '='. Exit status: 0, 1 (start-up\n"
		"or run-time failure), 2 (usage error: the command line or --config file).\n",
		prog, prog, prog);
}

void uvsockd_print_capabilities(FILE *f)
{
	/* QEMU's docs/interop/vhost-user.json defines capability members only for the "input",
	 * "gpu" and "block" types; like virtiofsd we list our own: migrate-precopy (dirty logging:
	 * LOG_ALL, LOG_SHMFD, as virtiofsd names it), the socket types and the sibling routing. */
	fprintf(f, "{\n  \"type\": \"vsock\",\n  \"features\": [\n    \"migrate-precopy\",\n"
		   "    \"seqpacket\",\n    \"dgram\",\n    \"siblings\"\n  ]\n}\n");
}
