/* SPDX-License-Identifier: MIT */
/* JSON writer with a size cap and a recursive-descent reader with a depth cap (see json.h). */
#include "ctlproto/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ---------------------------------------------------------------------------- */

int ops_jw_init(struct ops_jw *w, size_t max)
{
	memset(w, 0, sizeof(*w));
	w->cap = max < 4096 ? max + 1 : 4096;
	w->max = max;
	w->buf = malloc(w->cap);
	if (!w->buf)
		return -ENOMEM;
	w->buf[0] = '\0';
	w->first[0] = true;
	return 0;
}

void ops_jw_free(struct ops_jw *w)
{
	free(w->buf);
	w->buf = NULL;
}

bool ops_jw_room(const struct ops_jw *w, size_t n)
{
	return !w->overflow && w->len + n <= w->max;
}

bool ops_jw_overflowed(const struct ops_jw *w)
{
	return w->overflow;
}

static void put(struct ops_jw *w, const char *s, size_t n)
{
	if (w->overflow)
		return;
	if (w->len + n > w->max) {
		w->overflow = true;
		return;
	}
	if (w->len + n + 1 > w->cap) {
		size_t cap = w->cap;
		char *b;

		while (w->len + n + 1 > cap)
			cap *= 2;
		if (cap > w->max + 1)
			cap = w->max + 1;
		b = realloc(w->buf, cap);
		if (!b) {
			w->overflow = true;
			return;
		}
		w->buf = b;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, s, n);
	w->len += n;
	w->buf[w->len] = '\0';
}

static void puts_(struct ops_jw *w, const char *s)
{
	put(w, s, strlen(s));
}

static void put_string(struct ops_jw *w, const char *s)
{
	put(w, "\"", 1);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		char esc[8];

		if (ch == '"' || ch == '\\') {
			esc[0] = '\\';
			esc[1] = (char)ch;
			put(w, esc, 2);
		} else if (ch < 0x20 || ch == 0x7f) {
			snprintf(esc, sizeof(esc), "\\u%04x", ch);
			put(w, esc, 6);
		} else {
			put(w, s, 1);
		}
	}
	put(w, "\"", 1);
}

/* Comma and key before a value at the current depth. */
static void member(struct ops_jw *w, const char *key)
{
	if (!w->first[w->depth])
		put(w, ",", 1);
	w->first[w->depth] = false;
	if (key) {
		put_string(w, key);
		put(w, ":", 1);
	}
}

static void open_(struct ops_jw *w, const char *key, const char *brace)
{
	member(w, key);
	puts_(w, brace);
	if (w->depth < OPS_JSON_MAX_DEPTH)
		w->depth++;
	else
		w->overflow = true;
	w->first[w->depth] = true;
}

static void close_(struct ops_jw *w, const char *brace)
{
	if (w->depth > 0)
		w->depth--;
	puts_(w, brace);
}

void ops_jw_obj_begin(struct ops_jw *w, const char *key)
{
	open_(w, key, "{");
}

void ops_jw_obj_end(struct ops_jw *w)
{
	close_(w, "}");
}

void ops_jw_arr_begin(struct ops_jw *w, const char *key)
{
	open_(w, key, "[");
}

void ops_jw_arr_end(struct ops_jw *w)
{
	close_(w, "]");
}

void ops_jw_u64(struct ops_jw *w, const char *key, uint64_t v)
{
	char b[24];

	member(w, key);
	put(w, b, (size_t)snprintf(b, sizeof(b), "%" PRIu64, v));
}

void ops_jw_milli(struct ops_jw *w, const char *key, uint64_t thousandths)
{
	char b[32];

	member(w, key);
	put(w, b, (size_t)snprintf(b, sizeof(b), "%" PRIu64 ".%03u", thousandths / 1000,
				   (unsigned)(thousandths % 1000)));
}

void ops_jw_i64(struct ops_jw *w, const char *key, int64_t v)
{
	char b[24];

	member(w, key);
	put(w, b, (size_t)snprintf(b, sizeof(b), "%" PRId64, v));
}

void ops_jw_str(struct ops_jw *w, const char *key, const char *s)
{
	member(w, key);
	put_string(w, s);
}

void ops_jw_bool(struct ops_jw *w, const char *key, bool v)
{
	member(w, key);
	puts_(w, v ? "true" : "false");
}

void ops_jw_null(struct ops_jw *w, const char *key)
{
	member(w, key);
	puts_(w, "null");
}

/* ---- reader ---------------------------------------------------------------------------- */

struct rd {
	const char *p, *end;
};

static void skip_ws(struct rd *r)
{
	while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
		r->p++;
}

static int hex4(struct rd *r, unsigned *ret)
{
	unsigned v = 0;

	if (r->end - r->p < 4)
		return -EINVAL;
	for (int i = 0; i < 4; i++) {
		char c = *r->p++;

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else
			return -EINVAL;
	}
	*ret = v;
	return 0;
}

/* Parses a string at r->p (on the opening quote) into a malloc'd NUL-terminated copy. */
static int parse_string(struct rd *r, char **ret)
{
	const char *start = ++r->p;
	size_t n = 0;
	char *out;

	/* Decoded length never exceeds the encoded one. */
	while (r->p < r->end && *r->p != '"') {
		if (*r->p == '\\')
			r->p++;
		r->p++;
	}
	if (r->p >= r->end)
		return -EINVAL;
	out = malloc((size_t)(r->p - start) + 1);
	if (!out)
		return -ENOMEM;
	r->p = start;
	while (*r->p != '"') {
		unsigned char c = (unsigned char)*r->p++;

		if (c < 0x20)
			goto bad;
		if (c != '\\') {
			out[n++] = (char)c;
			continue;
		}
		c = (unsigned char)*r->p++;
		switch (c) {
		case '"': case '\\': case '/':
			out[n++] = (char)c;
			break;
		case 'b': out[n++] = '\b'; break;
		case 'f': out[n++] = '\f'; break;
		case 'n': out[n++] = '\n'; break;
		case 'r': out[n++] = '\r'; break;
		case 't': out[n++] = '\t'; break;
		case 'u': {
			unsigned cp;

			if (hex4(r, &cp) < 0 || cp == 0 || (cp >= 0xd800 && cp <= 0xdfff))
				goto bad; /* NUL and surrogates are refused (we never send them) */
			if (cp < 0x80) {
				out[n++] = (char)cp;
			} else if (cp < 0x800) {
				out[n++] = (char)(0xc0 | (cp >> 6));
				out[n++] = (char)(0x80 | (cp & 0x3f));
			} else {
				out[n++] = (char)(0xe0 | (cp >> 12));
				out[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
				out[n++] = (char)(0x80 | (cp & 0x3f));
			}
			break;
		}
		default:
			goto bad;
		}
	}
	r->p++;
	out[n] = '\0';
	*ret = out;
	return 0;
bad:
	free(out);
	return -EINVAL;
}

static int parse_value(struct rd *r, int depth, struct ops_jv **ret);

static int parse_number(struct rd *r, struct ops_jv *v)
{
	const char *s = r->p;
	char buf[64], *endp;
	size_t n;
	bool integer = true;

	if (r->p < r->end && *r->p == '-') {
		integer = false;
		r->p++;
	}
	if (r->p >= r->end || *r->p < '0' || *r->p > '9')
		return -EINVAL;
	while (r->p < r->end && ((*r->p >= '0' && *r->p <= '9') || *r->p == '.' || *r->p == 'e' ||
				 *r->p == 'E' || *r->p == '+' || *r->p == '-')) {
		if (*r->p < '0' || *r->p > '9')
			integer = false;
		r->p++;
	}
	n = (size_t)(r->p - s);
	if (n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n);
	buf[n] = '\0';
	v->type = OPS_J_NUM;
	errno = 0;
	if (integer) {
		v->u = strtoull(buf, &endp, 10);
		v->is_uint = errno == 0 && *endp == '\0';
	}
	errno = 0;
	v->d = strtod(buf, &endp);
	if (*endp != '\0')
		return -EINVAL;
	return 0;
}

static int parse_members(struct rd *r, int depth, struct ops_jv *v, bool obj)
{
	struct ops_jv **tail = &v->child;
	char close = obj ? '}' : ']';
	int rc;

	r->p++;
	skip_ws(r);
	if (r->p < r->end && *r->p == close) {
		r->p++;
		return 0;
	}
	for (;;) {
		char *key = NULL;
		struct ops_jv *m;

		skip_ws(r);
		if (obj) {
			if (r->p >= r->end || *r->p != '"')
				return -EINVAL;
			rc = parse_string(r, &key);
			if (rc < 0)
				return rc;
			skip_ws(r);
			if (r->p >= r->end || *r->p != ':') {
				free(key);
				return -EINVAL;
			}
			r->p++;
		}
		rc = parse_value(r, depth + 1, &m);
		if (rc < 0) {
			free(key);
			return rc;
		}
		m->key = key;
		*tail = m;
		tail = &m->next;
		skip_ws(r);
		if (r->p >= r->end)
			return -EINVAL;
		if (*r->p == ',') {
			r->p++;
			continue;
		}
		if (*r->p == close) {
			r->p++;
			return 0;
		}
		return -EINVAL;
	}
}

static int parse_value(struct rd *r, int depth, struct ops_jv **ret)
{
	struct ops_jv *v;
	int rc = 0;

	if (depth > OPS_JSON_MAX_DEPTH)
		return -EINVAL;
	skip_ws(r);
	if (r->p >= r->end)
		return -EINVAL;
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	switch (*r->p) {
	case '{':
		v->type = OPS_J_OBJ;
		rc = parse_members(r, depth, v, true);
		break;
	case '[':
		v->type = OPS_J_ARR;
		rc = parse_members(r, depth, v, false);
		break;
	case '"':
		v->type = OPS_J_STR;
		rc = parse_string(r, &v->s);
		break;
	case 't':
	case 'f':
	case 'n': {
		static const char *const words[] = { "true", "false", "null" };

		rc = -EINVAL;
		for (int i = 0; i < 3; i++) {
			size_t n = strlen(words[i]);

			if ((size_t)(r->end - r->p) >= n && memcmp(r->p, words[i], n) == 0) {
				v->type = i == 2 ? OPS_J_NULL : OPS_J_BOOL;
				v->b = i == 0;
				r->p += n;
				rc = 0;
				break;
			}
		}
		break;
	}
	default:
		rc = parse_number(r, v);
		break;
	}
	if (rc < 0) {
		ops_json_free(v);
		return rc;
	}
	*ret = v;
	return 0;
}

int ops_json_parse(const char *text, size_t len, struct ops_jv **ret)
{
	struct rd r = { text, text + len };
	struct ops_jv *v;
	int rc;

	if (memchr(text, '\0', len))
		return -EINVAL;
	rc = parse_value(&r, 0, &v);
	if (rc < 0)
		return rc;
	skip_ws(&r);
	if (r.p != r.end) {
		ops_json_free(v);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

void ops_json_free(struct ops_jv *v)
{
	while (v) {
		struct ops_jv *next = v->next;

		ops_json_free(v->child);
		free(v->key);
		free(v->s);
		free(v);
		v = next;
	}
}

const struct ops_jv *ops_json_get(const struct ops_jv *v, const char *key)
{
	if (!v || v->type != OPS_J_OBJ)
		return NULL;
	for (const struct ops_jv *m = v->child; m; m = m->next)
		if (m->key && strcmp(m->key, key) == 0)
			return m;
	return NULL;
}

uint64_t ops_json_u64(const struct ops_jv *v, const char *key, uint64_t def)
{
	const struct ops_jv *m = ops_json_get(v, key);

	return m && m->type == OPS_J_NUM && m->is_uint ? m->u : def;
}

const char *ops_json_str(const struct ops_jv *v, const char *key, const char *def)
{
	const struct ops_jv *m = ops_json_get(v, key);

	return m && m->type == OPS_J_STR ? m->s : def;
}

bool ops_json_bool(const struct ops_jv *v, const char *key, bool def)
{
	const struct ops_jv *m = ops_json_get(v, key);

	return m && m->type == OPS_J_BOOL ? m->b : def;
}
