/* SPDX-License-Identifier: MIT */
/*
 * `uvsock-stat --prometheus` against the fake daemon (fakectl.h, every value distinct): the
 * output of both formats is parsed back by a strict reader written here (HELP and TYPE before
 * each family's samples, sample names of that family, labels, `# EOF` last in OpenMetrics only)
 * and every counter of every VM must be there with the value of the JSON answer. When Debian's
 * python3-prometheus-client is installed, its own text and OpenMetrics parsers must accept the
 * output too and count the same samples.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakectl.h"
#include "ctlproto/json.h"
#include "statcli.h"
#include "ops/stats.h"
#include "statrun.h"

#define MAX_SAMPLES 256

struct sample {
	char name[96], vm[64], cid[16], reason[32];
	uint64_t v;
};

static struct run stat_run(const char *const *args)
{
	return stat_run_version("9.9", args);
}

/* Parses one `key="value"` list ("{...}" without the braces) into s. */
static void parse_labels(char *p, struct sample *s, int line)
{
	while (*p) {
		char *eq = strchr(p, '='), *val, *w;

		if (!eq || eq[1] != '"')
			test_fail(__FILE__, __LINE__, "line %d: bad label list at '%s'", line, p);
		*eq = '\0';
		val = w = eq + 2;
		for (; *val && *val != '"'; val++) {
			if (*val == '\\' && val[1])
				val++;
			*w++ = *val;
		}
		if (*val != '"')
			test_fail(__FILE__, __LINE__, "line %d: unterminated label value", line);
		*w = '\0';
		if (!strcmp(p, "vm"))
			snprintf(s->vm, sizeof(s->vm), "%s", eq + 2);
		else if (!strcmp(p, "cid"))
			snprintf(s->cid, sizeof(s->cid), "%s", eq + 2);
		else if (!strcmp(p, "reason"))
			snprintf(s->reason, sizeof(s->reason), "%s", eq + 2);
		else
			test_fail(__FILE__, __LINE__, "line %d: unknown label '%s'", line, p);
		p = val + 1;
		if (*p == ',')
			p++;
	}
}

/*
 * Reads an exposition strictly. Returns the number of samples. Checks: every family has HELP
 * then TYPE naming it; each sample belongs to the family just declared (OpenMetrics: a counter
 * family F has samples F_total; the text format: TYPE names the sample); no family twice;
 * "# EOF" is the last line with openmetrics and absent otherwise.
 */
static int parse_expo(const char *text, bool om, struct sample *out, int max)
{
	char *copy = strdup(text), *save = NULL, fam[96] = "", type[16] = "";
	char seen[64][96];
	int n = 0, nseen = 0, line = 0;
	bool eof = false, help = false;

	ASSERT_TRUE(copy != NULL);
	ASSERT_TRUE(text[0] && text[strlen(text) - 1] == '\n');
	for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		line++;
		if (eof)
			test_fail(__FILE__, __LINE__, "line %d after # EOF", line);
		if (!strcmp(l, "# EOF")) {
			ASSERT_TRUE(om);
			eof = true;
		} else if (!strncmp(l, "# HELP ", 7)) {
			char *sp = strchr(l + 7, ' ');

			ASSERT_TRUE(sp != NULL && sp[1] != '\0');
			*sp = '\0';
			snprintf(fam, sizeof(fam), "%s", l + 7);
			for (int i = 0; i < nseen; i++)
				if (!strcmp(seen[i], fam))
					test_fail(__FILE__, __LINE__, "family %s twice", fam);
			ASSERT_LT(nseen, 64);
			snprintf(seen[nseen++], sizeof(seen[0]), "%s", fam);
			help = true;
			type[0] = '\0';
		} else if (!strncmp(l, "# TYPE ", 7)) {
			char *sp = strchr(l + 7, ' ');

			ASSERT_TRUE(help && sp != NULL);
			*sp = '\0';
			ASSERT_STREQ(l + 7, fam);
			ASSERT_TRUE(!strcmp(sp + 1, "counter") || !strcmp(sp + 1, "gauge"));
			snprintf(type, sizeof(type), "%s", sp + 1);
			help = false;
		} else {
			struct sample s = { 0 };
			char *lb = strchr(l, '{'), *rb = lb ? strchr(lb, '}') : NULL, *end;
			char want[112];

			if (!lb || !rb || rb[1] != ' ' || !type[0])
				test_fail(__FILE__, __LINE__, "line %d: not a sample: %s", line, l);
			*lb = *rb = '\0';
			snprintf(s.name, sizeof(s.name), "%s", l);
			snprintf(want, sizeof(want), "%s%s", fam,
				 om && !strcmp(type, "counter") ? "_total" : "");
			ASSERT_STREQ(s.name, want);
			if (!om && !strcmp(type, "counter")) {
				size_t fl = strlen(fam);

				ASSERT_TRUE(fl > 6 && !strcmp(fam + fl - 6, "_total"));
			}
			parse_labels(lb + 1, &s, line);
			s.v = strtoull(rb + 2, &end, 10);
			ASSERT_TRUE(*end == '\0' && end != rb + 2);
			ASSERT_LT(n, max);
			out[n++] = s;
		}
	}
	ASSERT_EQ(eof, om);
	free(copy);
	return n;
}

static const struct sample *find(const struct sample *s, int n, const char *name,
				 const char *cid, const char *reason)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(s[i].name, name) && !strcmp(s[i].cid, cid) &&
		    !strcmp(s[i].reason, reason))
			return &s[i];
	test_fail(__FILE__, __LINE__, "no sample %s{cid=\"%s\",reason=\"%s\"}", name, cid, reason);
}

/* The sample name of counter key: uvsock_<key>, with _total for every counter but the gauge. */
static void sample_name(char *buf, size_t len, const char *key)
{
	size_t n = strlen(key);
	bool total = n > 6 && !strcmp(key + n - 6, "_total");

	snprintf(buf, len, "uvsock_%s%s", key, total || !strcmp(key, "conns_open") ? "" : "_total");
}

/* Every counter of every VM of the JSON answer is in s with the same value. */
static void check_against_json(const struct sample *s, int n, const struct ops_jv *stats)
{
	static const char *const keys[] = {
#define X_KEY_(f, key, help) key,
		OPS_VM_COUNTERS(X_KEY_)
#undef X_KEY_
	};
	const struct ops_jv *vms = ops_json_get(stats, "vms");
	int nvms = 0;
	char name[112], cid[16];

	for (const struct ops_jv *v = vms->child; v; v = v->next, nvms++) {
		const struct ops_jv *c = ops_json_get(v, "counters");

		snprintf(cid, sizeof(cid), "%" PRIu64, ops_json_u64(v, "cid", 0));
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			const struct sample *p;

			sample_name(name, sizeof(name), keys[k]);
			p = find(s, n, name, cid, "");
			ASSERT_STREQ(p->vm, ops_json_str(v, "name", "?"));
			ASSERT_EQ_U64(p->v, ops_json_u64(c, keys[k], 0));
		}
		for (unsigned r = 0; r < _OPS_DROP_MAX; r++) {
			const char *why = ops_drop_reason_name(r);

			ASSERT_EQ_U64(find(s, n, "uvsock_dropped_total", cid, why)->v,
				      ops_json_u64(ops_json_get(c, "dropped"), why, 0));
		}
		ASSERT_EQ_U64(find(s, n, "uvsock_vmm_connected", cid, "")->v,
			      ops_json_bool(v, "vmm_connected", false));
		ASSERT_EQ_U64(find(s, n, "uvsock_broken", cid, "")->v, 0);
	}
	ASSERT_EQ(nvms, 2);
	ASSERT_EQ(n, nvms * (int)(sizeof(keys) / sizeof(keys[0]) + _OPS_DROP_MAX + 2));
}

/*
 * Samples python3-prometheus-client's parser finds in text (-1: not installed). A parse error
 * fails the test.
 */
static int python_count(const char *text, bool om)
{
	char file[64], cmd[512];
	FILE *f, *p;
	int n = -1, st;

	if (system("/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1") != 0)
		return -1;
	snprintf(file, sizeof(file), "/tmp/uvsock-prom-%d.txt", (int)getpid());
	f = fopen(file, "w");
	ASSERT_TRUE(f != NULL);
	fputs(text, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/python3 -c 'import sys\n"
		 "from prometheus_client.%s import text_string_to_metric_families as p\n"
		 "print(sum(len(f.samples) for f in p(open(sys.argv[1]).read())))' %s 2>&1",
		 om ? "openmetrics.parser" : "parser", file);
	p = popen(cmd, "r");
	ASSERT_TRUE(p != NULL);
	if (fscanf(p, "%d", &n) != 1)
		n = -2;
	st = pclose(p);
	unlink(file);
	if (st != 0 || n < 0)
		test_fail(__FILE__, __LINE__, "prometheus_client refused the %s output",
			  om ? "OpenMetrics" : "text");
	return n;
}

static void check_format(const char *fmt_arg, bool om, const char *path, const struct ops_jv *st)
{
	static struct sample s[MAX_SAMPLES];
	struct run r = stat_run((const char *[]){ "-s", path, fmt_arg, NULL });
	int n, py;

	ASSERT_EQ(r.rc, 0);
	ASSERT_STREQ(r.err, "");
	n = parse_expo(r.out, om, s, MAX_SAMPLES);
	check_against_json(s, n, st);
	py = python_count(r.out, om);
	if (py >= 0)
		ASSERT_EQ(py, n);
	else
		test_note("python3-prometheus-client not installed: own parser only");
	run_free(&r);
}

TEST(prometheus_and_openmetrics_parsed_back)
{
	struct fake_daemon f;
	struct ops_jv *v;

	fake_start(&f, 2, NULL);
	struct run r = stat_run((const char *[]){ "-s", f.path, "--json", "--counters", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), &v));
	check_format("--prometheus", false, f.path, ops_json_get(v, "stats"));
	check_format("--prometheus=text", false, f.path, ops_json_get(v, "stats"));
	check_format("--prometheus=openmetrics", true, f.path, ops_json_get(v, "stats"));
	ops_json_free(v);
	run_free(&r);
	fake_stop(&f);
}

/* One VM only with --vm; the combinations that make no sense are usage errors. */
TEST(prometheus_filters_and_usage)
{
	struct fake_daemon f;

	fake_start(&f, 2, NULL);
	struct run r =
		stat_run((const char *[]){ "-s", f.path, "--prometheus", "--vm", "4", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "uvsock_tx_pkts_total{vm=\"vm4\",cid=\"4\"} 2001\n") != NULL);
	ASSERT_TRUE(strstr(r.out, "cid=\"3\"") == NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "--prometheus", "--json", NULL });
	ASSERT_EQ(r.rc, 2);
	ASSERT_TRUE(strstr(r.err, "does not combine") != NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "--prometheus=yaml", NULL });
	ASSERT_EQ(r.rc, 2);
	run_free(&r);
	fake_stop(&f);
}

/* Label values are escaped; a VM without a name is labelled by its CID; missing counters are 0. */
TEST(label_escaping_and_defaults)
{
	static const char ans[] = "{\"proto\":1,\"ok\":true,\"vms\":["
				  "{\"cid\":3,\"name\":\"a\\\"b\\\\c\","
				  "\"counters\":{\"tx_pkts\":5}},"
				  "{\"cid\":9,\"name\":\"\"}]}";
	static struct sample s[MAX_SAMPLES];
	struct ops_jv *v;
	char *buf = NULL;
	size_t len;
	FILE *f = open_memstream(&buf, &len);
	int n;

	ASSERT_OK(ops_json_parse(ans, strlen(ans), &v));
	ops_stat_prometheus(f, v, true);
	fclose(f);
	ASSERT_TRUE(strstr(buf, "uvsock_tx_pkts_total{vm=\"a\\\"b\\\\c\",cid=\"3\"} 5\n") != NULL);
	ASSERT_TRUE(strstr(buf, "uvsock_tx_pkts_total{vm=\"9\",cid=\"9\"} 0\n") != NULL);
	n = parse_expo(buf, true, s, MAX_SAMPLES);
	ASSERT_STREQ(find(s, n, "uvsock_tx_pkts_total", "3", "")->vm, "a\"b\\c");
	free(buf);
	ops_json_free(v);
}

TEST_MAIN()
