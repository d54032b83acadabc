/* SPDX-License-Identifier: MIT */
/* JSON writer (escaping, nesting, cap) and reader (types, u64 exactness, errors, depth). */
#include "ctlproto/json.h"
#include "test.h"

TEST(writer_roundtrip)
{
	struct ops_jw w;
	struct ops_jv *v;

	ASSERT_OK(ops_jw_init(&w, 1 << 20));
	ops_jw_obj_begin(&w, NULL);
	ops_jw_u64(&w, "max", UINT64_MAX);
	ops_jw_i64(&w, "neg", -5);
	ops_jw_str(&w, "s", "a\"b\\c\n\x01/é");
	ops_jw_bool(&w, "t", true);
	ops_jw_null(&w, "n");
	ops_jw_arr_begin(&w, "a");
	ops_jw_u64(&w, NULL, 1);
	ops_jw_obj_begin(&w, NULL);
	ops_jw_obj_end(&w);
	ops_jw_arr_begin(&w, NULL);
	ops_jw_arr_end(&w);
	ops_jw_arr_end(&w);
	ops_jw_obj_end(&w);
	ASSERT_STREQ(w.buf, "{\"max\":18446744073709551615,\"neg\":-5,\"s\":\"a\\\"b\\\\c\\u000a"
			    "\\u0001/é\",\"t\":true,\"n\":null,\"a\":[1,{},[]]}");
	ASSERT_OK(ops_json_parse(w.buf, w.len, &v));
	ASSERT_EQ_U64(ops_json_u64(v, "max", 0), UINT64_MAX);
	ASSERT_EQ_U64(ops_json_u64(v, "neg", 7), 7); /* not a u64 */
	ASSERT_TRUE(ops_json_get(v, "neg")->d == -5.0);
	ASSERT_STREQ(ops_json_str(v, "s", ""), "a\"b\\c\n\x01/é");
	ASSERT_TRUE(ops_json_bool(v, "t", false));
	ASSERT_EQ(ops_json_get(v, "n")->type, OPS_J_NULL);
	ASSERT_EQ(ops_json_get(v, "a")->child->next->type, OPS_J_OBJ);
	ASSERT_TRUE(ops_json_get(v, "missing") == NULL);
	ASSERT_STREQ(ops_json_str(v, "t", "def"), "def");
	ops_json_free(v);
	ops_jw_free(&w);
}

TEST(writer_cap)
{
	struct ops_jw w;

	ASSERT_OK(ops_jw_init(&w, 20));
	ops_jw_obj_begin(&w, NULL);
	ASSERT_TRUE(ops_jw_room(&w, 19));
	ASSERT_FALSE(ops_jw_room(&w, 20));
	ops_jw_str(&w, "key", "a long value that does not fit");
	ASSERT_TRUE(ops_jw_overflowed(&w));
	ASSERT_LE(w.len, 20);
	ops_jw_free(&w);
}

TEST(reader_accepts)
{
	static const char *const ok[] = {
		"0", "-1.5e3", " [1, 2 ,3] ", "{\"a\":{\"b\":[true,false,null]}}", "\"\\u00e9\\u20ac\"",
		"\"\\/\\b\\f\\r\\t\"", "18446744073709551616",
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct ops_jv *v;

		if (ops_json_parse(ok[i], strlen(ok[i]), &v) < 0)
			test_fail(__FILE__, __LINE__, "rejected: %s", ok[i]);
		ops_json_free(v);
	}
	struct ops_jv *v;
	ASSERT_OK(ops_json_parse("\"\\u00e9\\u20ac\"", 14, &v));
	ASSERT_STREQ(v->s, "é€");
	ops_json_free(v);
	ASSERT_OK(ops_json_parse("18446744073709551616", 20, &v));
	ASSERT_FALSE(v->is_uint); /* 2^64 does not fit */
	ops_json_free(v);
}

TEST(reader_rejects)
{
	static const char *const bad[] = {
		"", " ", "{", "}", "[1,]", "{\"a\"}", "{\"a\":}", "{a:1}", "[1 2]", "tru", "nul",
		"\"abc", "\"\\x\"", "\"\\u12\"", "\"\\u0000\"", "\"\\ud800\"", "\"a\x01\"", "01x",
		"-", "1 2", "{\"a\":1}x", "[\"\\", "--1", "1e", "+1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct ops_jv *v = NULL;

		if (ops_json_parse(bad[i], strlen(bad[i]), &v) != -EINVAL)
			test_fail(__FILE__, __LINE__, "accepted: '%s'", bad[i]);
		ASSERT_TRUE(v == NULL);
	}
	struct ops_jv *v = NULL;
	ASSERT_ERR(ops_json_parse("[1]\0", 4, &v), EINVAL);
}

TEST(reader_depth_bound)
{
	char deep[200];
	struct ops_jv *v;
	int n = 0;

	for (int i = 0; i < OPS_JSON_MAX_DEPTH; i++)
		deep[n++] = '[';
	for (int i = 0; i < OPS_JSON_MAX_DEPTH; i++)
		deep[n++] = ']';
	ASSERT_OK(ops_json_parse(deep, (size_t)n, &v));
	ops_json_free(v);
	n = 0;
	for (int i = 0; i < 100; i++)
		deep[n++] = '[';
	for (int i = 0; i < 100; i++)
		deep[n++] = ']';
	ASSERT_ERR(ops_json_parse(deep, (size_t)n, &v), EINVAL);
}

/* Deterministic mutations of a real answer: every result is a clean parse or -EINVAL. */
TEST(random_mutations_never_crash)
{
	static const char seed[] =
		"{\"proto\":1,\"ok\":true,\"vms\":[{\"cid\":3,\"name\":\"vm3\",\"counters\":"
		"{\"tx_pkts\":18446744073709551615,\"dropped\":{\"x\":0}},\"engine\":null}],"
		"\"s\":\"a\\u00e9\\n\",\"f\":-1.5e-3,\"b\":[true,false]}";
	char buf[sizeof(seed) + 8];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	unsigned ok = 0;

	for (int i = 0; i < 50000; i++) {
		size_t len = sizeof(seed) - 1;
		struct ops_jv *v;
		int r;

		memcpy(buf, seed, len);
		for (int k = 0; k < 1 + i % 4; k++) {
			test_xorshift64(&x);
			if (len == 0)
				break;
			size_t at = (size_t)(x % len);

			switch ((x >> 32) % 3) {
			case 0: buf[at] = (char)(x >> 40); break;                 /* replace */
			case 1: len = at; break;                                  /* truncate */
			case 2: memmove(buf + at, buf + at + 1, len - at - 1);    /* delete */
				len--;
				break;
			}
		}
		r = ops_json_parse(buf, len, &v);
		ASSERT_TRUE(r == 0 || r == -EINVAL);
		if (r == 0) {
			ok++;
			ops_json_free(v);
		}
	}
	test_note("%u of 50000 mutations still parse", ok);
}

TEST_MAIN()
