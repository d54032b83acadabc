/* SPDX-License-Identifier: MIT */
/*
 * The `--config FILE` parser (see config.h). libyaml (Debian's libyaml-dev) reads the YAML; this
 * file walks its event stream once: a document whose root is a mapping of the top-level keys,
 * `vms:` a sequence of mappings, one per VM, `groups:` a scalar or a sequence of scalars, every
 * other value one scalar. What YAML can say and a config does not need is refused with the line
 * it is on: anchors, aliases, tags, multi-line (block) scalars, a second document. Before
 * libyaml sees the text, a pre-scan bounds it (size, line length, NUL bytes), refuses tabs in
 * indentation and cuts the text at a `...` line, as the line-oriented reader of earlier versions
 * did, so that every file it accepted is accepted alike.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

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
	struct config_file c;
	unsigned top_seen[_T_MAX]; /* line where seen, 0 if not */
	struct uvsockd_vm_config *cur; /* current item (last element of c.vms), or NULL */
	unsigned seen[_K_MAX];     /* line where each key of cur was given */
	bool quoted;               /* the last value parsed was quoted ('' is empty, not null) */
	const char *text;          /* the input, for the line of a reader error */
	size_t len;
	yaml_parser_t y;
	yaml_event_t ev;           /* the current event (valid while have_ev) */
	bool have_ev;
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
		/* One line whatever the file holds (a key may contain an escaped newline). */
		for (char *c = p->err; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
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
	if (n > max && max == UVSOCKD_CGROUP_PATH_MAX)
		return fail(p, "%s is too long: %zu bytes, the limit is %zu ('%.40s...')", key, n,
			    max, v);
	if (n > max)
		return fail(p, "%s '%s' is too long: %zu bytes, the limit is %zu (Unix socket paths "
			    "have 108 bytes%s)", key, v, n, max,
			    max < UVSOCKD_SUN_PATH_MAX ? ", and `<uds_path>_<port>` must fit" : "");
	memcpy(dst, v, n + 1);
	return 0;
}

/* groups: "a+b" or, from a flow list, "a, b". */
static int set_groups(struct parser *p, struct uvsockd_vm_config *vm, const char *v, bool flow)
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
		if (n > UVSOCKD_GROUP_NAME_MAX)
			return fail(p, "groups '%s': a name is longer than %d bytes", v,
				    UVSOCKD_GROUP_NAME_MAX);
		for (size_t i = 0; i < n; i++) {
			char ch = s[i];

			if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
				return fail(p, "groups '%s': names use letters, digits, '-', '_', '.'",
					    v);
		}
		if (vm->n_groups == UVSOCKD_MAX_GROUPS)
			return fail(p, "groups '%s': more than %d groups", v, UVSOCKD_MAX_GROUPS);
		memcpy(vm->groups[vm->n_groups], s, n);
		vm->groups[vm->n_groups][n] = '\0';
		vm->n_groups++;
		if (!*e)
			return 0;
		s = e + 1;
	}
}

static int set_cid(struct parser *p, struct uvsockd_vm_config *vm, const char *v)
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
	struct uvsockd_vm_config *vm = p->cur;

	if (flow && key != K_GROUPS)
		return fail(p, "%s takes one value, not a list", vm_key_names[key]);
	if (!*v && !flow && !p->quoted)
		return fail(p, "%s has no value", vm_key_names[key]);
	switch (key) {
	case K_CID:
		return set_cid(p, vm, v);
	case K_SOCKET:
		return set_path(p, vm->socket_path, "socket", v, UVSOCKD_SUN_PATH_MAX);
	case K_UDS:
		return set_path(p, vm->uds_path, "uds_path", v,
				UVSOCKD_SUN_PATH_MAX - UVSOCKD_UDS_SUFFIX_MAX);
	case K_TXBUF:
		return set_size(p, &vm->tx_buffer_size, "tx_buffer_size", v,
				UVSOCKD_MIN_TX_BUFFER_SIZE, UVSOCKD_MAX_TX_BUFFER_SIZE, false);
	case K_QSIZE:
		return set_size(p, &vm->queue_size, "queue_size", v, 1, UVSOCKD_MAX_QUEUE_SIZE, true);
	case K_GROUPS:
		return set_groups(p, vm, v, flow);
	case K_CGROUP:
		/* Whether isolate is on is known at the end: daemon/options.c checks that. */
		if (v[0] != '/')
			return fail(p, "cgroup '%s' must be an absolute path (a cgroup directory)",
				    v);
		return set_path(p, vm->cgroup, "cgroup", v, UVSOCKD_CGROUP_PATH_MAX);
	case K_NAME:
	case K_MAXCONNS: {
		char msg[256];
		int r = key == K_NAME ? config_set_name(vm->name, "name", v, msg, sizeof(msg))
				      : config_set_max_conns(&vm->max_conns, "max_conns", v, msg,
							      sizeof(msg));

		return r < 0 ? fail(p, "%s", msg) : 0;
	}
	}
	return -EINVAL;
}

/* Checks the finished item: required keys, uniqueness against the earlier ones. */
static int finish_item(struct parser *p)
{
	struct uvsockd_vm_config *a = p->cur;
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
		const struct uvsockd_vm_config *b = &p->c.vms[i];

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
	struct uvsockd_vm_config *v;

	if (p->c.n_vms == UVSOCKD_MAX_VMS)
		return fail(p, "too many VMs (at most %d)", UVSOCKD_MAX_VMS);
	v = realloc(p->c.vms, (p->c.n_vms + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	p->c.vms = v;
	p->cur = &v[p->c.n_vms++];
	memset(p->cur, 0, sizeof(*p->cur));
	p->cur->guest_cid = UVSOCKD_DEFAULT_GUEST_CID;
	p->cur->tx_buffer_size = UVSOCKD_DEFAULT_TX_BUFFER_SIZE;
	p->cur->queue_size = UVSOCKD_DEFAULT_QUEUE_SIZE;
	p->cur->n_groups = 1;
	strcpy(p->cur->groups[0], "default");
	p->cur->line = p->line;
	memset(p->seen, 0, sizeof(p->seen));
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

/* ---- the event stream ------------------------------------------------------------------- */

static unsigned ev_line(const yaml_event_t *e)
{
	return (unsigned)e->start_mark.line + 1;
}

/* Line (1-based) of byte offset off of the input. */
static unsigned line_of(const struct parser *p, size_t off)
{
	unsigned n = 1;

	for (size_t i = 0; i < off && i < p->len; i++)
		n += p->text[i] == '\n';
	return n;
}

/* libyaml's own error, with its line: "NAME:LINE: YAML: problem (context on line N)". */
static int syntax_error(struct parser *p)
{
	const yaml_parser_t *y = &p->y;

	if (y->error == YAML_MEMORY_ERROR)
		return -ENOMEM;
	if (y->error == YAML_READER_ERROR) {
		p->line = line_of(p, y->problem_offset);
		return fail(p, "YAML: %s", y->problem ? y->problem : "unreadable input");
	}
	p->line = (unsigned)y->problem_mark.line + 1;
	if (y->context && y->context_mark.line != y->problem_mark.line)
		return fail(p, "YAML: %s (%s on line %u)", y->problem ? y->problem : "syntax error",
			    y->context, (unsigned)y->context_mark.line + 1);
	return fail(p, "YAML: %s%s%s", y->problem ? y->problem : "syntax error",
		    y->context ? " " : "", y->context ? y->context : "");
}

/*
 * Moves to the next event (p->ev, p->line set to its line). Anchors, aliases and explicit tags
 * are refused here, wherever they are: a config has no use for them.
 */
static int next(struct parser *p)
{
	const char *anchor = NULL, *tag = NULL;

	if (p->have_ev)
		yaml_event_delete(&p->ev);
	p->have_ev = false;
	if (!yaml_parser_parse(&p->y, &p->ev))
		return syntax_error(p);
	p->have_ev = true;
	p->line = ev_line(&p->ev);
	switch (p->ev.type) {
	case YAML_ALIAS_EVENT:
		return fail(p, "aliases ('*%s') are not supported", p->ev.data.alias.anchor);
	case YAML_SCALAR_EVENT:
		anchor = (const char *)p->ev.data.scalar.anchor;
		tag = (const char *)p->ev.data.scalar.tag;
		break;
	case YAML_SEQUENCE_START_EVENT:
		anchor = (const char *)p->ev.data.sequence_start.anchor;
		tag = (const char *)p->ev.data.sequence_start.tag;
		break;
	case YAML_MAPPING_START_EVENT:
		anchor = (const char *)p->ev.data.mapping_start.anchor;
		tag = (const char *)p->ev.data.mapping_start.tag;
		break;
	default:
		break;
	}
	if (anchor)
		return fail(p, "anchors ('&%s') are not supported", anchor);
	if (tag)
		return fail(p, "tags ('%s') are not supported", tag);
	return 0;
}

/*
 * The current event as a value of `key`: a scalar, copied into val[CONFIG_FILE_MAX_LINE]
 * (p->quoted set for a quoted one: '' is empty, a plain empty value is no value). A list or a
 * mapping is an error naming key.
 */
static int scalar_value(struct parser *p, const char *key, char *val)
{
	const yaml_event_t *e = &p->ev;
	size_t n;

	if (e->type == YAML_SEQUENCE_START_EVENT)
		return fail(p, "%s takes one value, not a list", key);
	if (e->type != YAML_SCALAR_EVENT)
		return fail(p, "%s takes one value, not a mapping", key);
	if (e->data.scalar.style == YAML_LITERAL_SCALAR_STYLE ||
	    e->data.scalar.style == YAML_FOLDED_SCALAR_STYLE)
		return fail(p, "%s: multi-line strings ('|', '>') are not supported", key);
	if (e->end_mark.line != e->start_mark.line)
		return fail(p, "%s: the value goes on over line %u (check the indentation there)",
			    key, (unsigned)e->start_mark.line + 2);
	n = e->data.scalar.length;
	if (n >= CONFIG_FILE_MAX_LINE)
		return fail(p, "%s: value too long", key);
	for (size_t i = 0; i < n; i++)
		if (e->data.scalar.value[i] < 0x20 || e->data.scalar.value[i] == 0x7f)
			return fail(p, "%s: control character in the value", key);
	memcpy(val, e->data.scalar.value, n);
	val[n] = '\0';
	p->quoted = e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
	return 0;
}

/*
 * The current event as a key of a mapping: a scalar looked up in names[0..count) (else through
 * alias, when given), not given before in this mapping (seen[key] is the line of its first
 * use). Returns the key's index or -EINVAL (recorded).
 */
static int map_key(struct parser *p, const char *const *names, int count,
		   int (*alias)(struct parser *p, const char *s, size_t klen), unsigned *seen)
{
	const char *k = (const char *)p->ev.data.scalar.value;
	size_t n = p->ev.data.scalar.length;
	char val[CONFIG_FILE_MAX_LINE];
	int key;

	if (p->ev.type != YAML_SCALAR_EVENT)
		return fail(p, "expected 'key: value', got a %s as a key",
			    p->ev.type == YAML_MAPPING_START_EVENT ? "mapping" : "list");
	if (scalar_value(p, "a key", val) < 0)
		return -EINVAL;
	key = lookup(k, n, names, count);
	if (key < 0)
		key = alias ? alias(p, val, n) : fail(p, "unknown key '%s'", val);
	if (key < 0)
		return key;
	if (seen[key])
		return fail(p, "%s given twice (first on line %u)", names[key], seen[key]);
	seen[key] = p->line;
	return key;
}

/* groups: a scalar "a+b", or a list of names, joined "a, b" as set_groups takes them. */
static int groups_value(struct parser *p, char *val)
{
	size_t n = 0;

	if (p->ev.type != YAML_SEQUENCE_START_EVENT)
		return scalar_value(p, "groups", val) < 0 ? -EINVAL
							  : set_groups(p, p->cur, val, false);
	for (;;) {
		char name[CONFIG_FILE_MAX_LINE];
		size_t k;
		int r = next(p);

		if (r < 0)
			return r;
		if (p->ev.type == YAML_SEQUENCE_END_EVENT)
			break;
		if (p->ev.type != YAML_SCALAR_EVENT)
			return fail(p, "groups: a list of names, not of lists or mappings");
		if (scalar_value(p, "groups", name) < 0)
			return -EINVAL;
		k = strlen(name);
		if (n + k + 3 >= CONFIG_FILE_MAX_LINE)
			return fail(p, "groups: value too long");
		n += (size_t)snprintf(val + n, CONFIG_FILE_MAX_LINE - n, "%s%s", n ? ", " : "", name);
	}
	val[n] = '\0';
	return set_groups(p, p->cur, val, true);
}

/* One VM: the current event is its MAPPING_START; reads up to its MAPPING_END. */
static int vm_item(struct parser *p)
{
	char val[CONFIG_FILE_MAX_LINE];
	int r = start_item(p);

	while (r == 0) {
		int key;

		r = next(p);
		if (r < 0 || p->ev.type == YAML_MAPPING_END_EVENT)
			break;
		key = map_key(p, vm_key_names, _K_MAX, vm_key_alias, p->seen);
		if (key < 0)
			return key;
		r = next(p);
		if (r < 0)
			return r;
		if (key == K_GROUPS) {
			r = groups_value(p, val);
			continue;
		}
		if (scalar_value(p, vm_key_names[key], val) < 0)
			return -EINVAL;
		r = set_vm_key(p, key, val, false);
	}
	return r < 0 ? r : finish_item(p);
}

/* vms: the current event is the value; a list of mappings, or empty. */
static int vms_value(struct parser *p)
{
	int r;

	if (p->ev.type == YAML_SCALAR_EVENT && p->ev.data.scalar.length == 0 &&
	    p->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
		return 0; /* `vms:` and nothing: no VM (said at the end) */
	if (p->ev.type != YAML_SEQUENCE_START_EVENT)
		return fail(p, "vms: expected a list of VMs, one '- ' entry each "
			    "(or [{...}, ...])");
	for (;;) {
		r = next(p);
		if (r < 0 || p->ev.type == YAML_SEQUENCE_END_EVENT)
			return r;
		if (p->ev.type != YAML_MAPPING_START_EVENT)
			return fail(p, "a VM is a mapping of keys (guest_cid: ..., socket: ..., "
				    "uds_path: ...)");
		r = vm_item(p);
		if (r < 0)
			return r;
	}
}

static int top_value(struct parser *p, int key)
{
	char val[CONFIG_FILE_MAX_LINE];
	int r;

	if (key == T_VMS)
		return vms_value(p);
	if (scalar_value(p, top_key_names[key], val) < 0)
		return -EINVAL;
	switch (key) {
	case T_CONTROL:
		r = set_path(p, p->c.control_path, "control", val, UVSOCKD_SUN_PATH_MAX);
		p->c.have_control = r == 0;
		return r;
	case T_LOG_LEVEL: {
		int lvl = log_level_from_string(val);

		if (lvl < 0)
			return fail(p, "log_level '%s' is not one of error, warn, info, debug", val);
		p->c.log_level = (enum log_level)lvl;
		p->c.have_log_level = true;
		return 0;
	}
	case T_ISOLATE:
		if (strcmp(val, "true") == 0 || strcmp(val, "false") == 0) {
			p->c.isolate = val[0] == 't';
			return 0;
		}
		return fail(p, "isolate '%s' is not true or false", val);
	}
	return -EINVAL;
}

/* The document's root: the current event. A mapping of the top-level keys, or nothing. */
static int root(struct parser *p)
{
	char val[CONFIG_FILE_MAX_LINE];
	int r;

	if (p->ev.type == YAML_SEQUENCE_START_EVENT)
		return fail(p, "a list item here; list items belong under 'vms:'");
	if (p->ev.type == YAML_SCALAR_EVENT) {
		if (scalar_value(p, "the file", val) < 0)
			return -EINVAL;
		return !val[0] && !p->quoted ? 0 : fail(p, "expected 'key: value', got '%s'", val);
	}
	for (;;) {
		int key;

		r = next(p);
		if (r < 0 || p->ev.type == YAML_MAPPING_END_EVENT)
			return r;
		key = map_key(p, top_key_names, _T_MAX, NULL, p->top_seen);
		if (key < 0)
			return key;
		r = next(p);
		if (r == 0)
			r = top_value(p, key);
		if (r < 0)
			return r;
	}
}

/* The stream: nothing, or one document. */
static int stream(struct parser *p)
{
	int r = next(p); /* STREAM_START */

	if (r == 0)
		r = next(p);
	if (r < 0 || p->ev.type == YAML_STREAM_END_EVENT)
		return r;
	r = next(p); /* DOCUMENT_START was current: now the root */
	if (r == 0)
		r = root(p);
	if (r == 0)
		r = next(p); /* DOCUMENT_END */
	if (r == 0)
		r = next(p);
	if (r == 0 && p->ev.type != YAML_STREAM_END_EVENT)
		r = fail(p, "only one document ('---') per file");
	return r;
}

/*
 * What libyaml is not asked: the size, each line's length, NUL bytes, tabs in indentation.
 * Returns the length to parse (up to a `...` line, which ends the file as it ends a document)
 * or -errno (recorded).
 */
static ssize_t prescan(struct parser *p, const char *text, size_t len)
{
	size_t off = 0;

	if (len > CONFIG_FILE_MAX_SIZE) {
		fail(p, "larger than %u bytes", CONFIG_FILE_MAX_SIZE);
		return -EFBIG;
	}
	while (off < len) {
		const char *nl = memchr(text + off, '\n', len - off);
		const char *s = text + off;
		size_t n = nl ? (size_t)(nl - s) : len - off, lead = 0;
		size_t next = off + n + (nl ? 1 : 0);

		p->line++;
		if (n && s[n - 1] == '\r')
			n--;
		if (n > CONFIG_FILE_MAX_LINE)
			return fail(p, "line longer than %u bytes", CONFIG_FILE_MAX_LINE);
		if (memchr(s, '\0', n))
			return fail(p, "NUL byte");
		while (lead < n && (s[lead] == ' ' || s[lead] == '\t'))
			lead++;
		if (memchr(s, '\t', lead))
			return fail(p, "tab in indentation (YAML indents with spaces)");
		if (n == 3 && memcmp(s, "...", 3) == 0)
			return (ssize_t)off;
		off = next;
	}
	return (ssize_t)len;
}

int config_file_parse(const char *name, const char *text, size_t len, struct config_file *ret,
		      char *err, size_t errlen)
{
	struct parser p = { .name = name, .err = err, .errlen = errlen, .text = text };
	ssize_t n;
	int r;

	if (errlen)
		err[0] = '\0';
	n = prescan(&p, text, len);
	if (n < 0)
		return (int)n;
	p.len = (size_t)n;
	p.line = 0;
	if (!yaml_parser_initialize(&p.y)) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	yaml_parser_set_input_string(&p.y, (const unsigned char *)text, p.len);
	yaml_parser_set_encoding(&p.y, YAML_UTF8_ENCODING);
	r = stream(&p);
	if (p.have_ev)
		yaml_event_delete(&p.ev);
	yaml_parser_delete(&p.y);
	if (r == 0 && p.c.n_vms == 0) {
		p.line = 0;
		r = fail(&p, p.top_seen[T_VMS] ? "'vms:' lists no VM"
						: "no VMs (expected a 'vms:' list)");
	}
	if (r < 0) {
		if (r == -ENOMEM && errlen)
			snprintf(err, errlen, "%s: out of memory", name);
		config_file_clear(&p.c);
		return r;
	}
	*ret = p.c;
	return 0;
}

int config_file_load(const char *path, struct config_file *ret, char *err, size_t errlen)
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
	buf = malloc(CONFIG_FILE_MAX_SIZE + 1);
	if (!buf) {
		r = -ENOMEM;
		snprintf(err, errlen, "%s: out of memory", path);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf + len, CONFIG_FILE_MAX_SIZE + 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
			goto out;
		}
		if (n == 0 || len + (size_t)n > CONFIG_FILE_MAX_SIZE) {
			len += (size_t)n;
			break;
		}
		len += (size_t)n;
	}
	r = config_file_parse(path, buf, len, ret, err, errlen);
out:
	free(buf);
	close(fd);
	return r;
}

int config_set_name(char *dst, const char *key, const char *v, char *err, size_t errlen)
{
	size_t n = strlen(v), digits = strspn(v, "0123456789");

	if (n == 0 || n > UVSOCKD_NAME_MAX || digits == n ||
	    strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n) {
		snprintf(err, errlen, "%s '%s' must be 1 to %d letters, digits, '.', '_' or '-', "
			 "not only digits", key, v, UVSOCKD_NAME_MAX);
		return -EINVAL;
	}
	memcpy(dst, v, n + 1);
	return 0;
}

int config_set_max_conns(uint32_t *dst, const char *key, const char *v, char *err,
			 size_t errlen)
{
	uint64_t n;

	if (parse_u64(v, &n) < 0 || n < 1 || n > UVSOCKD_MAX_CONNS_MAX) {
		snprintf(err, errlen, "%s '%s' must be a number in [1, %u]", key, v,
			 UVSOCKD_MAX_CONNS_MAX);
		return -EINVAL;
	}
	*dst = (uint32_t)n;
	return 0;
}

void config_file_clear(struct config_file *c)
{
	if (!c)
		return;
	free(c->vms);
	memset(c, 0, sizeof(*c));
}

int config_file_apply(const struct config_file *src, struct uvsockd_config *dst)
{
	struct uvsockd_vm_config *v;

	if ((size_t)dst->n_vms + src->n_vms > UVSOCKD_MAX_VMS)
		return -E2BIG;
	v = realloc(dst->vms, (dst->n_vms + src->n_vms) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	dst->vms = v;
	memcpy(&v[dst->n_vms], src->vms, src->n_vms * sizeof(*v));
	dst->n_vms += src->n_vms;
	if (src->have_log_level)
		dst->log_level = src->log_level;
	dst->isolate = dst->isolate || src->isolate;
	return 0;
}
