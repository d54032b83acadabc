/* SPDX-License-Identifier: MIT */
/*
 * The `--config FILE` parser (see config.h): a line-oriented reader of the YAML subset. One pass,
 * one line at a time; the state is "top level" or "inside vms:", plus the indentation of the
 * current list item's `-` and of its keys. Anything outside the subset is an error with its line
 * number rather than a guess.
 */
#include "ops/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/macros.h"

enum vm_key {
	K_CID, K_SOCKET, K_UDS, K_TXBUF, K_QSIZE, K_GROUPS, K_CGROUP, K_NAME, K_MAXCONNS, _K_MAX
};

static const char *const vm_key_names[_K_MAX] = {
	[K_CID] = "guest_cid",
	[K_SOCKET] = "socket",
	[K_UDS] = "uds_path",
	[K_TXBUF] = "tx_buffer_size",
	[K_QSIZE] = "queue_size",
	[K_GROUPS] = "groups",
	[K_CGROUP] = "cgroup",
	[K_NAME] = "name",
	[K_MAXCONNS] = "max_conns",
};

enum top_key { T_VMS, T_CONTROL, T_LOG_LEVEL, T_ISOLATE, _T_MAX };

static const char *const top_key_names[_T_MAX] = {
	[T_VMS] = "vms",
	[T_CONTROL] = "control",
	[T_LOG_LEVEL] = "log_level",
	[T_ISOLATE] = "isolate",
};

struct parser {
	const char *name;
	char *err;
	size_t errlen;
	unsigned line;
	struct ops_config c;
	unsigned top_seen[_T_MAX]; /* line where seen, 0 if not */
	bool in_vms;
	bool content;              /* a non-comment line was seen (for `---`) */
	int dash_indent;           /* column of the items' `-`, -1 before the first item */
	int key_indent;            /* column of the current item's keys, -1 before the first key */
	struct ops_vm_config *cur; /* current item (last element of c.vms), or NULL */
	unsigned seen[_K_MAX];     /* line where each key of cur was given */
	bool quoted;               /* the last value parsed was quoted ('' is empty, not null) */
};

static int fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct parser *p, const char *fmt, ...)
{
	va_list ap;
	int n = 0;

	if (p->errlen) {
		if (p->line)
			n = snprintf(p->err, p->errlen, "%s:%u: ", p->name, p->line);
		else
			n = snprintf(p->err, p->errlen, "%s: ", p->name);
		if (n < 0 || (size_t)n >= p->errlen)
			return -EINVAL;
		va_start(ap, fmt);
		vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Keys compare with '-' and '_' equal. */
static bool key_eq(const char *k, size_t n, const char *name)
{
	size_t i;

	for (i = 0; i < n && name[i]; i++) {
		char a = k[i] == '-' ? '_' : k[i];

		if (a != name[i])
			return false;
	}
	return i == n && name[i] == '\0';
}

static int lookup(const char *k, size_t n, const char *const *names, int count)
{
	for (int i = 0; i < count; i++)
		if (key_eq(k, n, names[i]))
			return i;
	return -1;
}

/*
 * Parses the value part of `key: value` (s points after the colon) into out (NUL-terminated).
 * *flow is set when the value is a flow sequence `[...]` (returned without the brackets).
 */
static int parse_value(struct parser *p, const char *s, char *out, size_t outlen, bool *flow)
{
	size_t n = 0;

	*flow = false;
	p->quoted = false;
	while (*s == ' ')
		s++;
	if (*s == '"' || *s == '\'') {
		char q = *s++;

		p->quoted = true;
		for (;;) {
			char ch = *s++;

			if (ch == '\0')
				return fail(p, "unterminated %s-quoted string",
					    q == '"' ? "double" : "single");
			if (ch == q) {
				if (q == '\'' && *s == '\'') {
					s++;
				} else {
					break;
				}
			} else if (q == '"' && ch == '\\') {
				ch = *s++;
				if (ch != '"' && ch != '\\')
					return fail(p, "unsupported escape '\\%c' (only \\\" and \\\\)",
						    ch ? ch : ' ');
			}
			if (n + 1 >= outlen)
				return fail(p, "value too long");
			out[n++] = ch;
		}
		while (*s == ' ')
			s++;
		if (*s && *s != '#')
			return fail(p, "unexpected text after the quoted value: '%s'", s);
		out[n] = '\0';
		return 0;
	}
	if (strchr("{&*!|>%@`", *s) && *s)
		return fail(p, "'%c' starts a YAML feature this file format does not support", *s);
	if (*s == '[') {
		const char *e = strchr(s, ']');

		if (!e)
			return fail(p, "unterminated '[' list");
		for (const char *t = e + 1; *t; t++) {
			if (*t == '#')
				break;
			if (*t != ' ')
				return fail(p, "unexpected text after ']'");
		}
		*flow = true;
		s++;
		n = (size_t)(e - s);
		if (n + 1 > outlen)
			return fail(p, "value too long");
		memcpy(out, s, n);
		out[n] = '\0';
		return 0;
	}
	/* Plain scalar: up to a " #" comment, trailing spaces trimmed. */
	for (; *s; s++) {
		if (*s == '#' && n && out[n - 1] == ' ')
			break;
		if (n + 1 >= outlen)
			return fail(p, "value too long");
		out[n++] = *s;
	}
	while (n && out[n - 1] == ' ')
		n--;
	out[n] = '\0';
	return 0;
}

static int parse_u64(const char *s, uint64_t *ret)
{
	uint64_t v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*ret = v;
	return 0;
}

static int set_size(struct parser *p, uint32_t *dst, const char *key, const char *v, uint64_t lo,
		    uint64_t hi, bool pow2)
{
	uint64_t n;

	if (parse_u64(v, &n) < 0 || n < lo || n > hi)
		return fail(p, "%s '%s' must be a number in [%llu, %llu]", key, v,
			    (unsigned long long)lo, (unsigned long long)hi);
	if (pow2 && (n & (n - 1)))
		return fail(p, "%s %s must be a power of two", key, v);
	*dst = (uint32_t)n;
	return 0;
}

static int set_path(struct parser *p, char *dst, const char *key, const char *v, size_t max)
{
	size_t n = strlen(v);

	if (n == 0)
		return fail(p, "%s must not be empty", key);
	if (n > max && max == OPS_CFG_CGROUP_PATH_MAX)
		return fail(p, "%s is too long: %zu bytes, the limit is %zu ('%.40s...')", key, n,
			    max, v);
	if (n > max)
		return fail(p, "%s '%s' is too long: %zu bytes, the limit is %zu (Unix socket paths "
			    "have 108 bytes%s)", key, v, n, max,
			    max < OPS_CFG_SUN_PATH_MAX ? ", and `<uds_path>_<port>` must fit" : "");
	memcpy(dst, v, n + 1);
	return 0;
}

/* groups: "a+b" or, from a flow list, "a, b". */
static int set_groups(struct parser *p, struct ops_vm_config *vm, const char *v, bool flow)
{
	const char *s = v;

	vm->n_groups = 0;
	for (;;) {
		const char *e;
		size_t n;

		if (flow)
			while (*s == ' ')
				s++;
		e = s + strcspn(s, flow ? "," : "+");
		n = (size_t)(e - s);
		if (flow)
			while (n && s[n - 1] == ' ')
				n--;
		if (n == 0)
			return fail(p, "groups '%s': empty group name", v);
		if (n > OPS_CFG_GROUP_NAME_MAX)
			return fail(p, "groups '%s': a name is longer than %d bytes", v,
				    OPS_CFG_GROUP_NAME_MAX);
		for (size_t i = 0; i < n; i++) {
			char ch = s[i];

			if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
				return fail(p, "groups '%s': names use letters, digits, '-', '_', '.'",
					    v);
		}
		if (vm->n_groups == OPS_CFG_MAX_GROUPS)
			return fail(p, "groups '%s': more than %d groups", v, OPS_CFG_MAX_GROUPS);
		memcpy(vm->groups[vm->n_groups], s, n);
		vm->groups[vm->n_groups][n] = '\0';
		vm->n_groups++;
		if (!*e)
			return 0;
		s = e + 1;
	}
}

static int set_cid(struct parser *p, struct ops_vm_config *vm, const char *v)
{
	uint64_t cid;
	int r = parse_u64(v, &cid);

	if (r == -ERANGE || (r == 0 && cid > UINT32_MAX))
		return fail(p, "guest_cid %s is out of range (CIDs are 32-bit)", v);
	if (r < 0)
		return fail(p, "guest_cid '%s' is not a number", v);
	if (cid <= 2 || cid == UINT32_MAX)
		return fail(p, "guest_cid %s is reserved (0, 1, 2 and 4294967295 cannot be a guest "
			    "CID)", v);
	vm->guest_cid = (uint32_t)cid;
	return 0;
}

static int set_vm_key(struct parser *p, int key, const char *v, bool flow)
{
	struct ops_vm_config *vm = p->cur;

	if (flow && key != K_GROUPS)
		return fail(p, "%s takes one value, not a list", vm_key_names[key]);
	if (!*v && !flow && !p->quoted)
		return fail(p, "%s has no value", vm_key_names[key]);
	switch (key) {
	case K_CID:
		return set_cid(p, vm, v);
	case K_SOCKET:
		return set_path(p, vm->socket_path, "socket", v, OPS_CFG_SUN_PATH_MAX);
	case K_UDS:
		return set_path(p, vm->uds_path, "uds_path", v,
				OPS_CFG_SUN_PATH_MAX - OPS_CFG_UDS_SUFFIX_MAX);
	case K_TXBUF:
		return set_size(p, &vm->tx_buffer_size, "tx_buffer_size", v,
				OPS_CFG_MIN_TX_BUFFER_SIZE, OPS_CFG_MAX_TX_BUFFER_SIZE, false);
	case K_QSIZE:
		return set_size(p, &vm->queue_size, "queue_size", v, 1, OPS_CFG_MAX_QUEUE_SIZE, true);
	case K_GROUPS:
		return set_groups(p, vm, v, flow);
	case K_CGROUP:
		/* Whether isolate is on is known at the end: daemon/options.c checks that. */
		if (v[0] != '/')
			return fail(p, "cgroup '%s' must be an absolute path (a cgroup directory)",
				    v);
		return set_path(p, vm->cgroup, "cgroup", v, OPS_CFG_CGROUP_PATH_MAX);
	case K_NAME:
	case K_MAXCONNS: {
		char msg[256];
		int r = key == K_NAME ? ops_cfg_set_name(vm->name, "name", v, msg, sizeof(msg))
				      : ops_cfg_set_max_conns(&vm->max_conns, "max_conns", v, msg,
							      sizeof(msg));

		return r < 0 ? fail(p, "%s", msg) : 0;
	}
	}
	return -EINVAL;
}

/* Checks the finished item: required keys, uniqueness against the earlier ones. */
static int finish_item(struct parser *p)
{
	struct ops_vm_config *a = p->cur;
	unsigned save = p->line;
	int r = 0;

	if (!a)
		return 0;
	p->line = a->line;
	if (!p->seen[K_SOCKET]) {
		r = fail(p, "this VM has no socket (the vhost-user socket path)");
		goto out;
	}
	if (!p->seen[K_UDS]) {
		r = fail(p, "this VM has no uds_path (the host-side socket path)");
		goto out;
	}
	if (strcmp(a->socket_path, a->uds_path) == 0) {
		r = fail(p, "socket and uds_path are the same path '%s'", a->socket_path);
		goto out;
	}
	for (unsigned i = 0; i + 1 < p->c.n_vms; i++) {
		const struct ops_vm_config *b = &p->c.vms[i];

		if (a->guest_cid == b->guest_cid) {
			r = fail(p, "guest_cid %u is already used by the VM on line %u",
				 a->guest_cid, b->line);
			goto out;
		}
		if (!strcmp(a->socket_path, b->socket_path) || !strcmp(a->socket_path, b->uds_path)) {
			r = fail(p, "socket path '%s' is already used by the VM on line %u",
				 a->socket_path, b->line);
			goto out;
		}
		if (a->name[0] && !strcmp(a->name, b->name)) {
			r = fail(p, "name '%s' is already used by the VM on line %u", a->name,
				 b->line);
			goto out;
		}
		if (!strcmp(a->uds_path, b->uds_path) || !strcmp(a->uds_path, b->socket_path)) {
			r = fail(p, "uds_path '%s' is already used by the VM on line %u",
				 a->uds_path, b->line);
			goto out;
		}
	}
	p->line = save;
	p->cur = NULL;
out:
	return r;
}

static int start_item(struct parser *p)
{
	struct ops_vm_config *v;

	if (p->c.n_vms == OPS_CFG_MAX_VMS)
		return fail(p, "too many VMs (at most %d)", OPS_CFG_MAX_VMS);
	v = realloc(p->c.vms, (p->c.n_vms + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	p->c.vms = v;
	p->cur = &v[p->c.n_vms++];
	memset(p->cur, 0, sizeof(*p->cur));
	p->cur->guest_cid = OPS_CFG_DEFAULT_GUEST_CID;
	p->cur->tx_buffer_size = OPS_CFG_DEFAULT_TX_BUFFER_SIZE;
	p->cur->queue_size = OPS_CFG_DEFAULT_QUEUE_SIZE;
	p->cur->n_groups = 1;
	strcpy(p->cur->groups[0], "default");
	p->cur->line = p->line;
	memset(p->seen, 0, sizeof(p->seen));
	p->key_indent = -1;
	return 0;
}

/* Splits "key: value" at the first ": " (or a final ':'); *klen and *val set. */
static int split_kv(struct parser *p, const char *s, size_t *klen, const char **val)
{
	size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");

	if (n == 0 || s[n] != ':' || (s[n + 1] != ' ' && s[n + 1] != '\0'))
		return fail(p, "expected 'key: value', got '%s'", s);
	*klen = n;
	*val = s + n + 1;
	return 0;
}

/* The VM keys not in vm_key_names: another program's name for one of ours, or a refusal. */
static int vm_key_alias(struct parser *p, const char *s, size_t klen)
{
	if (key_eq(s, klen, "socket_path"))
		return K_SOCKET;
	if (key_eq(s, klen, "forward_cid") || key_eq(s, klen, "forward_listen"))
		return fail(p, "%.*s is not supported by uvsockd (no host AF_VSOCK "
			    "forwarding; use uds_path)", (int)klen, s);
	return fail(p, "unknown key '%.*s'", (int)klen, s);
}

/*
 * Reads a "key: value" line: finds the key in names[0..count) (else through alias, when given),
 * refuses a key given twice (seen[key] is the line of its first use, 0 if none) and parses the
 * value into val[OPS_CFG_MAX_LINE]. Returns the key's index or -EINVAL (recorded).
 */
static int read_kv(struct parser *p, const char *s, const char *const *names, int count,
		   int (*alias)(struct parser *p, const char *s, size_t klen), unsigned *seen,
		   char *val, bool *flow)
{
	const char *v = NULL;
	size_t klen = 0;
	int key, r;

	r = split_kv(p, s, &klen, &v);
	if (r < 0)
		return r;
	key = lookup(s, klen, names, count);
	if (key < 0)
		key = alias ? alias(p, s, klen) : fail(p, "unknown key '%.*s'", (int)klen, s);
	if (key < 0)
		return key;
	if (seen[key])
		return fail(p, "%s given twice (first on line %u)", names[key], seen[key]);
	seen[key] = p->line;
	r = parse_value(p, v, val, OPS_CFG_MAX_LINE, flow);
	return r < 0 ? r : key;
}

static int item_key(struct parser *p, const char *s)
{
	char val[OPS_CFG_MAX_LINE];
	bool flow;
	int key = read_kv(p, s, vm_key_names, _K_MAX, vm_key_alias, p->seen, val, &flow);

	if (key < 0)
		return key;
	return set_vm_key(p, key, val, flow);
}

static int top_key(struct parser *p, const char *s)
{
	char val[OPS_CFG_MAX_LINE];
	bool flow;
	int r, key = read_kv(p, s, top_key_names, _T_MAX, NULL, p->top_seen, val, &flow);

	if (key < 0)
		return key;
	switch (key) {
	case T_VMS:
		if (flow || *val)
			return fail(p, "vms: the VMs follow on the next lines, one '- ' entry each");
		p->in_vms = true;
		p->dash_indent = -1;
		return 0;
	case T_CONTROL:
		if (flow)
			return fail(p, "control takes one path");
		r = set_path(p, p->c.control_path, "control", val, OPS_CFG_SUN_PATH_MAX);
		p->c.have_control = r == 0;
		return r;
	case T_LOG_LEVEL: {
		int lvl = flow ? -EINVAL : log_level_from_string(val);

		if (lvl < 0)
			return fail(p, "log_level '%s' is not one of error, warn, info, debug", val);
		p->c.log_level = (enum log_level)lvl;
		p->c.have_log_level = true;
		return 0;
	}
	case T_ISOLATE:
		if (!flow && (strcmp(val, "true") == 0 || strcmp(val, "false") == 0)) {
			p->c.isolate = val[0] == 't';
			return 0;
		}
		return fail(p, "isolate '%s' is not true or false", val);
	}
	return -EINVAL;
}

static int do_line(struct parser *p, char *s)
{
	int indent = 0, r;

	while (s[indent] == ' ')
		indent++;
	if (s[indent] == '\t')
		return fail(p, "tab in indentation (YAML indents with spaces)");
	s += indent;
	if (*s == '\0' || *s == '#')
		return 0;
	if (indent == 0 && (strcmp(s, "---") == 0 || strncmp(s, "--- ", 4) == 0)) {
		if (p->content)
			return fail(p, "only one document ('---') per file");
		p->content = true;
		return 0;
	}
	p->content = true;
	if (s[0] == '-' && (s[1] == ' ' || s[1] == '\0')) {
		if (!p->in_vms)
			return fail(p, "a list item here; list items belong under 'vms:'");
		if (p->dash_indent < 0)
			p->dash_indent = indent;
		else if (indent != p->dash_indent)
			return fail(p, "list item indented by %d, the list's items by %d", indent,
				    p->dash_indent);
		r = finish_item(p);
		if (r < 0)
			return r;
		r = start_item(p);
		if (r < 0)
			return r;
		s++;
		indent++;
		while (*s == ' ') {
			s++;
			indent++;
		}
		if (*s == '\0' || *s == '#')
			return 0;
		if (*s == '{')
			return fail(p, "'{...}' entries are not supported: one key per line");
		p->key_indent = indent;
		return item_key(p, s);
	}
	if (indent == 0) {
		r = finish_item(p);
		if (r < 0)
			return r;
		p->in_vms = false;
		return top_key(p, s);
	}
	if (!p->cur)
		return fail(p, "unexpected indentation");
	if (p->key_indent < 0) {
		if (indent <= p->dash_indent)
			return fail(p, "unexpected indentation");
		p->key_indent = indent;
	} else if (indent != p->key_indent) {
		return fail(p, "key indented by %d, this VM's keys by %d", indent, p->key_indent);
	}
	return item_key(p, s);
}

int ops_config_parse(const char *name, const char *text, size_t len, struct ops_config *ret,
		     char *err, size_t errlen)
{
	struct parser p = {
		.name = name, .err = err, .errlen = errlen, .dash_indent = -1, .key_indent = -1,
	};
	char line[OPS_CFG_MAX_LINE + 1];
	size_t off = 0;
	int r = 0;

	if (errlen)
		err[0] = '\0';
	if (len > OPS_CFG_MAX_FILE_SIZE) {
		fail(&p, "larger than %u bytes", OPS_CFG_MAX_FILE_SIZE);
		return -EFBIG;
	}
	while (off < len) {
		const char *nl = memchr(text + off, '\n', len - off);
		size_t n = nl ? (size_t)(nl - (text + off)) : len - off;
		size_t next = off + n + (nl ? 1 : 0);

		p.line++;
		if (n && text[off + n - 1] == '\r')
			n--;
		if (n > OPS_CFG_MAX_LINE) {
			r = fail(&p, "line longer than %u bytes", OPS_CFG_MAX_LINE);
			goto fail;
		}
		if (memchr(text + off, '\0', n)) {
			r = fail(&p, "NUL byte");
			goto fail;
		}
		memcpy(line, text + off, n);
		line[n] = '\0';
		off = next;
		if (strcmp(line, "...") == 0)
			break;
		r = do_line(&p, line);
		if (r < 0)
			goto fail;
	}
	r = finish_item(&p);
	if (r < 0)
		goto fail;
	if (p.c.n_vms == 0) {
		p.line = 0;
		r = fail(&p, p.top_seen[T_VMS] ? "'vms:' lists no VM"
						: "no VMs (expected a 'vms:' list)");
		goto fail;
	}
	*ret = p.c;
	return 0;

fail:
	if (r == -ENOMEM && errlen)
		snprintf(err, errlen, "%s: out of memory", name);
	ops_config_clear(&p.c);
	return r;
}

int ops_config_load(const char *path, struct ops_config *ret, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t len = 0;
	struct stat st;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: not a regular file", path);
		goto out;
	}
	buf = malloc(OPS_CFG_MAX_FILE_SIZE + 1);
	if (!buf) {
		r = -ENOMEM;
		snprintf(err, errlen, "%s: out of memory", path);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf + len, OPS_CFG_MAX_FILE_SIZE + 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
			goto out;
		}
		if (n == 0 || len + (size_t)n > OPS_CFG_MAX_FILE_SIZE) {
			len += (size_t)n;
			break;
		}
		len += (size_t)n;
	}
	r = ops_config_parse(path, buf, len, ret, err, errlen);
out:
	free(buf);
	close(fd);
	return r;
}

int ops_cfg_set_name(char *dst, const char *key, const char *v, char *err, size_t errlen)
{
	size_t n = strlen(v), digits = strspn(v, "0123456789");

	if (n == 0 || n > OPS_CFG_NAME_MAX || digits == n ||
	    strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n) {
		snprintf(err, errlen, "%s '%s' must be 1 to %d letters, digits, '.', '_' or '-', "
			 "not only digits", key, v, OPS_CFG_NAME_MAX);
		return -EINVAL;
	}
	memcpy(dst, v, n + 1);
	return 0;
}

int ops_cfg_set_max_conns(uint32_t *dst, const char *key, const char *v, char *err,
			  size_t errlen)
{
	uint64_t n;

	if (parse_u64(v, &n) < 0 || n < 1 || n > OPS_CFG_MAX_CONNS_MAX) {
		snprintf(err, errlen, "%s '%s' must be a number in [1, %u]", key, v,
			 OPS_CFG_MAX_CONNS_MAX);
		return -EINVAL;
	}
	*dst = (uint32_t)n;
	return 0;
}

void ops_config_clear(struct ops_config *c)
{
	if (!c)
		return;
	free(c->vms);
	memset(c, 0, sizeof(*c));
}
