/* SPDX-License-Identifier: MIT */
/*
 * The small JSON the control socket needs: a writer that builds one response in a growing buffer
 * with a hard size cap, and a reader (uvsock-stat's side) that parses one response into a tree.
 *
 * Writer: calls nest (object/array begin/end); `key` is the member name inside an object, NULL
 * inside an array. Past the cap nothing more is appended and ops_jw_overflowed() says so; callers
 * that list many items check ops_jw_room() first and stop cleanly (`"truncated": true`).
 *
 * Reader: integers up to 2^64-1 are kept exactly (counters), other numbers as double. Depth is
 * capped at OPS_JSON_MAX_DEPTH; memory is proportional to the input. Input is untrusted (a
 * control socket answer), so every error is a clean -EINVAL / -ENOMEM.
 */
#ifndef UVSOCK_OPS_JSON_H
#define UVSOCK_OPS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OPS_JSON_MAX_DEPTH 32

struct ops_jw {
	char *buf;      /* NUL-terminated while not overflowed; owned */
	size_t len, cap, max;
	bool overflow;
	int depth;
	bool first[OPS_JSON_MAX_DEPTH + 1]; /* no member written yet at this depth */
};

/* Starts an empty document with a cap of max bytes. Returns 0 or -ENOMEM. */
int ops_jw_init(struct ops_jw *w, size_t max);
void ops_jw_free(struct ops_jw *w);
void ops_jw_obj_begin(struct ops_jw *w, const char *key);
void ops_jw_obj_end(struct ops_jw *w);
void ops_jw_arr_begin(struct ops_jw *w, const char *key);
void ops_jw_arr_end(struct ops_jw *w);
void ops_jw_u64(struct ops_jw *w, const char *key, uint64_t v);
void ops_jw_i64(struct ops_jw *w, const char *key, int64_t v);
/* A number with three decimals from an integer count of thousandths (µs as "pause_ms"). */
void ops_jw_milli(struct ops_jw *w, const char *key, uint64_t thousandths);
void ops_jw_str(struct ops_jw *w, const char *key, const char *s);
void ops_jw_bool(struct ops_jw *w, const char *key, bool v);
void ops_jw_null(struct ops_jw *w, const char *key);
/* True if n more bytes fit under the cap. */
bool ops_jw_room(const struct ops_jw *w, size_t n);
bool ops_jw_overflowed(const struct ops_jw *w);

enum ops_jtype { OPS_J_NULL, OPS_J_BOOL, OPS_J_NUM, OPS_J_STR, OPS_J_ARR, OPS_J_OBJ };

struct ops_jv {
	enum ops_jtype type;
	char *key;               /* member name when inside an object */
	bool b;
	bool is_uint;            /* number is a non-negative integer that fits u64: see u */
	uint64_t u;
	double d;
	char *s;                 /* string (NUL-terminated; embedded NULs are refused) */
	struct ops_jv *child;    /* first element / member */
	struct ops_jv *next;     /* next sibling */
};

/*
 * Parses exactly one JSON value (surrounding whitespace allowed). *ret is freed with
 * ops_json_free. Returns 0, -EINVAL (syntax, depth, trailing data), -ENOMEM.
 */
int ops_json_parse(const char *text, size_t len, struct ops_jv **ret);
void ops_json_free(struct ops_jv *v);
/* Member `key` of an object, or NULL (also when v is NULL or not an object). */
const struct ops_jv *ops_json_get(const struct ops_jv *v, const char *key);
/* Member as u64 / string / bool, or the default when missing or of another type. */
uint64_t ops_json_u64(const struct ops_jv *v, const char *key, uint64_t def);
const char *ops_json_str(const struct ops_jv *v, const char *key, const char *def);
bool ops_json_bool(const struct ops_jv *v, const char *key, bool def);

#endif
