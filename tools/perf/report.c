/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf results: the records (one per measured point and switch setting, one sample per
 * run), and their output: the terminal table (medians, [CPU s/GB], spread), ratios to the Unix
 * stream socket, the --compare before/after table, CSV, JSON and the gnuplot plot. Main thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perf.h"

struct results g_res;

/* Makes room for one more element in a growing array of n elements (capacity *cap). */
void *res_grow(void *arr, int n, int *cap, size_t elem)
{
	if (n < *cap)
		return arr;
	*cap = *cap ? *cap * 2 : 32;
	arr = realloc(arr, (size_t)*cap * elem);
	if (!arr)
		die("out of memory");
	return arr;
}

struct res_stream *res_stream_get(enum tr t, size_t size, enum rxmode rx, int streams,
                                  const char *variant)
{
	struct res_stream *r;

	for (int i = 0; i < g_res.nst; i++) {
		r = &g_res.st[i];
		if (r->t == t && r->size == size && r->rx == rx && r->streams == streams &&
		    strcmp(r->variant, variant) == 0)
			return r;
	}
	g_res.st = res_grow(g_res.st, g_res.nst, &g_res.cst, sizeof(*g_res.st));
	r = &g_res.st[g_res.nst++];
	memset(r, 0, sizeof(*r));
	*r = (struct res_stream){ .t = t, .size = size, .rx = rx, .streams = streams };
	snprintf(r->variant, sizeof(r->variant), "%s", variant);
	return r;
}

struct res_rtt *res_rtt_get(enum tr t, size_t size, const char *variant)
{
	struct res_rtt *r;

	for (int i = 0; i < g_res.nrt; i++) {
		r = &g_res.rt[i];
		if (r->t == t && r->size == size && strcmp(r->variant, variant) == 0)
			return r;
	}
	g_res.rt = res_grow(g_res.rt, g_res.nrt, &g_res.crt, sizeof(*g_res.rt));
	r = &g_res.rt[g_res.nrt++];
	memset(r, 0, sizeof(*r));
	r->t = t;
	r->size = size;
	snprintf(r->variant, sizeof(r->variant), "%s", variant);
	return r;
}

/* Median, min and max of one field over a record's samples. */
struct stat3 {
	double med, min, max;
};

#define STAT_OF(rec, field)                                                                        \
	({                                                                                         \
		double v_[PERF_MAX_RUNS];                                                          \
		for (int i_ = 0; i_ < (rec)->n; i_++)                                              \
			v_[i_] = (rec)->s[i_].field;                                               \
		stat3_of(v_, (rec)->n);                                                            \
	})

static struct stat3 stat3_of(double *v, int n)
{
	struct stat3 s = { 0 };

	if (n <= 0)
		return s;
	s.med = median(v, n); /* sorts v */
	s.min = v[0];
	s.max = v[n - 1];
	return s;
}

static const struct res_stream *find_stream(enum tr t, size_t size, enum rxmode rx, int streams,
                                            const char *variant)
{
	for (int i = 0; i < g_res.nst; i++) {
		const struct res_stream *r = &g_res.st[i];

		if (r->t == t && r->size == size && r->rx == rx && r->streams == streams &&
		    strcmp(r->variant, variant) == 0 && r->n)
			return r;
	}
	return NULL;
}

static const struct res_rtt *find_rtt(enum tr t, size_t size, const char *variant)
{
	for (int i = 0; i < g_res.nrt; i++) {
		const struct res_rtt *r = &g_res.rt[i];

		if (r->t == t && r->size == size && strcmp(r->variant, variant) == 0 && r->n)
			return r;
	}
	return NULL;
}

/* Throughput of r over the Unix stream socket's at the same point; 0 if there is none. */
static double ratio_unix(const struct res_stream *r)
{
	const struct res_stream *u = find_stream(T_UNIX, r->size, r->rx, r->streams, r->variant);
	double a = STAT_OF(r, gbps).med, b = u ? STAT_OF(u, gbps).med : 0;

	return b > 0 ? a / b : 0;
}

static void fmt_size(char *buf, size_t cap, size_t sz)
{
	if (sz >= 1024 && sz % 1024 == 0)
		snprintf(buf, cap, "%zu KiB", sz / 1024);
	else
		snprintf(buf, cap, "%zu B", sz);
}

/* Distinct values seen, in first-seen order (sizes, stream counts, variants). */
static int distinct_sizes(size_t *out, int cap, int streams, bool seq)
{
	int n = 0;

	for (int i = 0; i < g_res.nst; i++) {
		const struct res_stream *r = &g_res.st[i];
		bool is_seq =
		        r->t == T_VSOCK_SEQ_G2H || r->t == T_VSOCK_SEQ_H2G || r->t == T_UNIX_SEQ;
		int j;

		if (r->streams != streams || is_seq != seq)
			continue;
		for (j = 0; j < n && out[j] != r->size; j++)
			;
		if (j == n && n < cap)
			out[n++] = r->size;
	}
	return n;
}

static int distinct_variants(const char **out, int cap)
{
	int n = 0;

	for (int i = 0; i < g_res.nst + g_res.nrt; i++) {
		const char *v =
		        i < g_res.nst ? g_res.st[i].variant : g_res.rt[i - g_res.nst].variant;
		int j;

		for (j = 0; j < n && strcmp(out[j], v) != 0; j++)
			;
		if (j == n && n < cap)
			out[n++] = v;
	}
	return n;
}

/* One row of a stream table: medians [CPU s/GB] min-max, or with u the ratios to u (Unix). */
static void stream_row(FILE *f, const enum tr *ts, int nt, const bool *any, size_t size,
                       enum rxmode rx, int streams, const char *variant, const struct res_stream *u)
{
	char sz[32];

	fmt_size(sz, sizeof(sz), size);
	fprintf(f, "%-8s", sz);
	for (int k = 0; k < nt; k++) {
		const struct res_stream *r = find_stream(ts[k], size, rx, streams, variant);
		char cell[64] = "-";

		if (!any[ts[k]])
			continue;
		if (r && u) {
			double cu = STAT_OF(u, cpu_s_per_gb).med;

			snprintf(cell, sizeof(cell), "%.2fx [%.2fx]", ratio_unix(r),
			         cu > 0 ? STAT_OF(r, cpu_s_per_gb).med / cu : 0);
		} else if (r) {
			struct stat3 g = STAT_OF(r, gbps), c = STAT_OF(r, cpu_s_per_gb);

			snprintf(cell, sizeof(cell), "%.3g [%.3g] %.3g-%.3g", g.med, c.med, g.min,
			         g.max);
		}
		fprintf(f, " %-28s", cell);
	}
	fprintf(f, "\n");
}

static void table_stream(FILE *f, const char *variant, enum rxmode rx, int streams, bool seq)
{
	static const enum tr plain[] = { T_VSOCK_G2H, T_VSOCK_H2G,   T_INPROC_G2H, T_INPROC_H2G,
		                         T_TCP,       T_TCP_NODELAY, T_UNIX,       T_SHM };
	static const enum tr seqs[] = { T_VSOCK_SEQ_G2H, T_VSOCK_SEQ_H2G, T_UNIX_SEQ };
	const enum tr *ts = seq ? seqs : plain;
	int nt = seq ? 3 : 8;
	size_t sizes[PERF_MAX_SIZES * 2];
	int ns = distinct_sizes(sizes, PERF_MAX_SIZES * 2, streams, seq);
	bool any[T_MAX] = { 0 }, printed = false;

	for (int si = 0; si < ns; si++)
		for (int k = 0; k < nt; k++)
			any[ts[k]] |= find_stream(ts[k], sizes[si], rx, streams, variant) != NULL;
	for (int si = 0; si < ns; si++) {
		bool row = false;

		for (int k = 0; k < nt; k++)
			row |= find_stream(ts[k], sizes[si], rx, streams, variant) != NULL;
		if (!row)
			continue;
		if (!printed) {
			fprintf(f,
			        "\n%s stream, %d stream%s, receive mode %s%s%s: Gbit/s "
			        "[CPU s/GB] medians, then the worst-best run\n",
			        seq ? "SEQPACKET" : "STREAM", streams,
			        streams > 1 ? "s in parallel" : "", rxmode_name[rx],
			        *variant ? ", " : "", variant);
			fprintf(f, "%-8s", "size");
			for (int k = 0; k < nt; k++)
				if (any[ts[k]])
					fprintf(f, " %-28s", tr_name[ts[k]]);
			fprintf(f, "\n");
			printed = true;
		}
		stream_row(f, ts, nt, any, sizes[si], rx, streams, variant, NULL);
	}
	if (!printed || seq)
		return;
	fprintf(f, "ratio to unix (throughput; CPU per byte in brackets)\n");
	for (int si = 0; si < ns; si++) {
		const struct res_stream *u = find_stream(T_UNIX, sizes[si], rx, streams, variant);

		if (!u)
			continue;
		stream_row(f, ts, nt, any, sizes[si], rx, streams, variant, u);
	}
}

static void table_cpu_split(FILE *f, const char *variant)
{
	bool head = false;

	for (int i = 0; i < g_res.nst; i++) {
		const struct res_stream *r = &g_res.st[i];
		char sz[32];

		if (strcmp(r->variant, variant) || r->streams != 1 || r->rx != RX_64K || !r->n ||
		    (r->t != T_VSOCK_G2H && r->t != T_VSOCK_H2G && r->t != T_INPROC_G2H &&
		     r->t != T_INPROC_H2G && r->t != T_UNIX))
			continue;
		if (!head) {
			fprintf(f,
			        "\nCPU per process, s/GB (64k reads, 1 stream): writer app / reader"
			        " app / rest of this process (guest driver, in-process device) / "
			        "back-end; Mbit/s per %%CPU\n");
			head = true;
		}
		fmt_size(sz, sizeof(sz), r->size);
		fprintf(f, "  %-20s %-8s %6.3g / %6.3g / %6.3g / %6.3g   %8.3g\n", tr_name[r->t],
		        sz, STAT_OF(r, cpu_writer).med, STAT_OF(r, cpu_reader).med,
		        STAT_OF(r, cpu_rest).med, STAT_OF(r, cpu_backend).med,
		        STAT_OF(r, mbit_per_cpu_pct).med);
	}
}

static void table_rtt(FILE *f, const char *variant)
{
	bool head = false;

	for (int i = 0; i < g_res.nrt; i++) {
		const struct res_rtt *r = &g_res.rt[i], *u;
		char sz[32], ratio[16] = "-";

		if (strcmp(r->variant, variant) || !r->n)
			continue;
		if (!head) {
			fprintf(f,
			        "\nround trips%s%s, microseconds: mean / p50 / p99 / p99.9 "
			        "(p50 best-worst run, p99 worst run); CPU us per round trip; p50 / "
			        "unix\n",
			        *variant ? ", " : "", variant);
			head = true;
		}
		u = find_rtt(T_UNIX, r->size, variant);
		if (u)
			snprintf(ratio, sizeof(ratio), "%.2fx",
			         STAT_OF(r, p50_us).med / STAT_OF(u, p50_us).med);
		fmt_size(sz, sizeof(sz), r->size);
		fprintf(f, "  %-20s %-8s %7.1f / %7.1f / %7.1f / %7.1f (%.1f-%.1f, %.1f)  %6.1f  %s\n",
		        tr_name[r->t], sz, STAT_OF(r, mean_us).med, STAT_OF(r, p50_us).med,
		        STAT_OF(r, p99_us).med, STAT_OF(r, p999_us).med, STAT_OF(r, p50_us).min,
		        STAT_OF(r, p50_us).max, STAT_OF(r, p99_us).max, STAT_OF(r, cpu_us_per_rt).med,
		        ratio);
	}
}

bool report_not_optimized(void)
{
	return strcmp(g_res.build_self, "optimized") != 0 ||
	       (strcmp(g_res.build_backend, "optimized") != 0 &&
	        strncmp(g_res.build_backend, "unknown", 7) != 0);
}

void report_table(FILE *f)
{
	const char *vs[64];
	int nv = distinct_variants(vs, 64);
	int par[] = { 4, 16, 64, 2, 8, 32 };

	fprintf(f, "uvsock-perf: back-end %s; switches %s; build: uvsock-perf %s, back-end %s%s\n",
	        g_res.backend, g_res.tune_desc, g_res.build_self, g_res.build_backend,
	        report_not_optimized() ? " -- NOT AN OPTIMIZED BUILD: these figures are not "
	                                 "those of a release build"
	                               : "");
	for (int v = 0; v < nv; v++) {
		for (int rx = 0; rx < 2; rx++)
			table_stream(f, vs[v], (enum rxmode)rx, 1, false);
		for (unsigned p = 0; p < sizeof(par) / sizeof(par[0]); p++)
			table_stream(f, vs[v], RX_64K, par[p], false);
		for (int rx = 0; rx < 2; rx++)
			table_stream(f, vs[v], (enum rxmode)rx, 1, true);
		table_cpu_split(f, vs[v]);
		table_rtt(f, vs[v]);
	}
	if (g_res.nmem)
		fprintf(f, "\nmemory and scale\n");
	for (int i = 0; i < g_res.nmem; i++) {
		const struct res_mem *m = &g_res.mem[i];

		fprintf(f, "  %-22s %12.4g %-7s %s%s%s\n", m->name, m->value, m->unit, m->note,
		        *m->variant ? "; " : "", m->variant);
	}
	dgram_table(f);
	fprintf(f, "total time %.0f s\n", g_res.seconds);
}

/*
 * --compare: for every point measured with "NAME:off" and "NAME:on", the two medians and on/off.
 * Variants are named "<switch>:off" / "<switch>:on".
 */
void report_compare(FILE *f)
{
	const char *vs[64];
	int nv = distinct_variants(vs, 64);

	for (int v = 0; v < nv; v++) {
		char on[64];
		size_t l = strlen(vs[v]);

		if (l < 4 || strcmp(vs[v] + l - 4, ":off") != 0)
			continue;
		snprintf(on, sizeof(on), "%.*s:on", (int)(l - 4), vs[v]);
		fprintf(f, "\nbefore/after %.*s (off -> on; medians over the alternating runs)\n",
		        (int)(l - 4), vs[v]);
		for (int i = 0; i < g_res.nst; i++) {
			const struct res_stream *a = &g_res.st[i], *b;
			char sz[32];
			double ga, gb, ca, cb;

			if (strcmp(a->variant, vs[v]) || !a->n)
				continue;
			b = find_stream(a->t, a->size, a->rx, a->streams, on);
			if (!b)
				continue;
			ga = STAT_OF(a, gbps).med;
			gb = STAT_OF(b, gbps).med;
			ca = STAT_OF(a, cpu_s_per_gb).med;
			cb = STAT_OF(b, cpu_s_per_gb).med;
			fmt_size(sz, sizeof(sz), a->size);
			fprintf(f,
			        "  stream %-20s %-8s rx %-4s x%-2d  %7.3g -> %7.3g Gbit/s (%.2fx)"
			        "  [%.3g -> %.3g CPU s/GB]\n",
			        tr_name[a->t], sz, rxmode_name[a->rx], a->streams, ga, gb,
			        ga > 0 ? gb / ga : 0, ca, cb);
		}
		for (int i = 0; i < g_res.nrt; i++) {
			const struct res_rtt *a = &g_res.rt[i], *b;
			char sz[32];
			double pa, pb;

			if (strcmp(a->variant, vs[v]) || !a->n)
				continue;
			b = find_rtt(a->t, a->size, on);
			if (!b)
				continue;
			pa = STAT_OF(a, p50_us).med;
			pb = STAT_OF(b, p50_us).med;
			fmt_size(sz, sizeof(sz), a->size);
			fprintf(f,
			        "  rtt    %-20s %-8s p50 %7.1f -> %7.1f us (%.2fx)  p99 %.1f -> "
			        "%.1f us  [%.1f -> %.1f CPU us/rt]\n",
			        tr_name[a->t], sz, pa, pb, pa > 0 ? pb / pa : 0,
			        STAT_OF(a, p99_us).med, STAT_OF(b, p99_us).med,
			        STAT_OF(a, cpu_us_per_rt).med, STAT_OF(b, cpu_us_per_rt).med);
		}
	}
}

int report_csv(const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -errno;
	fprintf(f, "kind,transport,size,rx_mode,streams,variant,runs,gbps,gbps_min,gbps_max,"
	           "cpu_s_per_gb,cpu_writer_s_per_gb,cpu_reader_s_per_gb,cpu_rest_s_per_gb,"
	           "cpu_backend_s_per_gb,mbit_per_cpu_pct,ratio_unix,mean_us,p50_us,p99_us,p999_us,"
	           "cpu_us_per_rt,mbps,mbps_min,mbps_max,sent,received,lost,counted_drops,"
	           "ratio_udp\n");
	for (int i = 0; i < g_res.nst; i++) {
		const struct res_stream *r = &g_res.st[i];
		struct stat3 g = STAT_OF(r, gbps);

		if (!r->n)
			continue;
		fprintf(f,
		        "stream,%s,%zu,%s,%d,%s,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,"
		        "%.3f,,,,,,,,,,,,,,\n",
		        tr_name[r->t], r->size, rxmode_name[r->rx], r->streams, r->variant, r->n,
		        g.med, g.min, g.max, STAT_OF(r, cpu_s_per_gb).med,
		        STAT_OF(r, cpu_writer).med, STAT_OF(r, cpu_reader).med,
		        STAT_OF(r, cpu_rest).med, STAT_OF(r, cpu_backend).med,
		        STAT_OF(r, mbit_per_cpu_pct).med, ratio_unix(r));
	}
	for (int i = 0; i < g_res.nrt; i++) {
		const struct res_rtt *r = &g_res.rt[i];

		if (!r->n)
			continue;
		fprintf(f, "rtt,%s,%zu,,1,%s,%d,,,,,,,,,,,%.2f,%.2f,%.2f,%.2f,%.2f,,,,,,,,\n",
		        tr_name[r->t], r->size, r->variant, r->n, STAT_OF(r, mean_us).med,
		        STAT_OF(r, p50_us).med, STAT_OF(r, p99_us).med, STAT_OF(r, p999_us).med,
		        STAT_OF(r, cpu_us_per_rt).med);
	}
	dgram_csv(f);
	return fclose(f) == 0 ? 0 : -errno;
}

/* A JSON string: the names and notes written here have no control characters. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

/* One "stream" record of the JSON output. */
static void json_stream(FILE *f, const struct res_stream *r, bool *first)
{
	struct stat3 g = STAT_OF(r, gbps);

	fprintf(f,
	        "%s\n    {\"transport\": \"%s\", \"size\": %zu, \"rx_mode\": \"%s\", "
	        "\"streams\": %d, \"variant\": ",
	        *first ? "" : ",", tr_name[r->t], r->size, rxmode_name[r->rx], r->streams);
	json_str(f, r->variant);
	fprintf(f,
	        ", \"runs\": %d, \"gbps\": %.4f, \"gbps_min\": %.4f, \"gbps_max\": %.4f, "
	        "\"gbps_worst\": %.4f, \"cpu_s_per_gb_worst\": %.4f, "
	        "\"cpu_s_per_gb\": %.4f, \"cpu_writer_s_per_gb\": %.4f, "
	        "\"cpu_reader_s_per_gb\": %.4f, \"cpu_rest_s_per_gb\": %.4f, "
	        "\"cpu_backend_s_per_gb\": %.4f, \"mbit_per_cpu_pct\": %.2f, "
	        "\"ratio_unix\": %.3f}",
	        r->n, g.med, g.min, g.max, g.min, STAT_OF(r, cpu_s_per_gb).max,
	        STAT_OF(r, cpu_s_per_gb).med, STAT_OF(r, cpu_writer).med,
	        STAT_OF(r, cpu_reader).med, STAT_OF(r, cpu_rest).med, STAT_OF(r, cpu_backend).med,
	        STAT_OF(r, mbit_per_cpu_pct).med, ratio_unix(r));
	*first = false;
}

int report_json(const char *path, const struct opts *o)
{
	FILE *f = fopen(path, "w");
	bool first = true;

	if (!f)
		return -errno;
	fprintf(f, "{\n  \"tool\": \"uvsock-perf\",\n  \"backend\": ");
	json_str(f, g_res.backend);
	fprintf(f, ",\n  \"switches\": ");
	json_str(f, g_res.tune_desc);
	fprintf(f, ",\n  \"build\": {\"uvsock_perf\": ");
	json_str(f, g_res.build_self);
	fprintf(f, ", \"backend\": ");
	json_str(f, g_res.build_backend);
	fprintf(f, ", \"optimized\": %s}", report_not_optimized() ? "false" : "true");
	fprintf(f, ",\n  \"end\": \"%s\"", o->end_count ? "count" : "eof");
	fprintf(f,
	        ",\n  \"runs\": %d,\n  \"duration_ms\": %d,\n  \"rtt_count\": %d,\n"
	        "  \"seconds\": %.1f,\n  \"datagram\": [",
	        o->runs, o->duration_ms, o->rtt_count, g_res.seconds);
	dgram_json(f);
	fprintf(f, "\n  ],\n  \"stream\": [");
	for (int i = 0; i < g_res.nst; i++)
		if (g_res.st[i].n)
			json_stream(f, &g_res.st[i], &first);
	fprintf(f, "\n  ],\n  \"rtt\": [");
	first = true;
	for (int i = 0; i < g_res.nrt; i++) {
		const struct res_rtt *r = &g_res.rt[i];
		struct stat3 p = STAT_OF(r, p50_us);

		if (!r->n)
			continue;
		fprintf(f, "%s\n    {\"transport\": \"%s\", \"size\": %zu, \"variant\": ",
		        first ? "" : ",", tr_name[r->t], r->size);
		json_str(f, r->variant);
		fprintf(f,
		        ", \"runs\": %d, \"mean_us\": %.2f, \"p50_us\": %.2f, \"p50_min_us\": %.2f,"
		        " \"p50_max_us\": %.2f, \"p50_worst_us\": %.2f, \"p99_us\": %.2f, "
		        "\"p99_worst_us\": %.2f, \"p999_us\": %.2f, \"cpu_us_per_rt\": %.2f}",
		        r->n, STAT_OF(r, mean_us).med, p.med, p.min, p.max, p.max,
		        STAT_OF(r, p99_us).med, STAT_OF(r, p99_us).max, STAT_OF(r, p999_us).med,
		        STAT_OF(r, cpu_us_per_rt).med);
		first = false;
	}
	fprintf(f, "\n  ],\n  \"memory\": [");
	for (int i = 0; i < g_res.nmem; i++) {
		const struct res_mem *m = &g_res.mem[i];

		fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
		json_str(f, m->name);
		fprintf(f, ", \"variant\": ");
		json_str(f, m->variant);
		fprintf(f, ", \"value\": %.6g, \"unit\": ", m->value);
		json_str(f, m->unit);
		fprintf(f, ", \"note\": ");
		json_str(f, m->note);
		fputc('}', f);
	}
	fprintf(f, "\n  ]\n}\n");
	return fclose(f) == 0 ? 0 : -errno;
}

/*
 * gnuplot: throughput against write size (log x and y), one line per stream transport (not
 * SEQPACKET), 64 KiB reads, one stream, the first variant measured. The data and script go
 * to a temporary directory.
 */
int report_plot(const char *path)
{
	char dir[] = "/tmp/uvsock-perf-plot-XXXXXX", data[128], script[128];
	const char *vs[64];
	const char *variant;
	FILE *d, *s;
	int nblk = 0, st;
	pid_t pid;
	bool used[T_MAX] = { 0 };

	if (distinct_variants(vs, 64) < 1)
		return -ENODATA;
	variant = vs[0];
	if (!mkdtemp(dir))
		return -errno;
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(script, sizeof(script), "%s/plot.gp", dir);
	d = fopen(data, "w");
	s = fopen(script, "w");
	if (!d || !s)
		return -errno;
	fprintf(s,
	        "set terminal pngcairo size 1100,700 noenhanced\nset output '%s'\n"
	        "set logscale x 2\nset logscale y 10\n"
	        "set xlabel 'write size (bytes)'\nset ylabel 'Gbit/s'\n"
	        "set title 'uvsock-perf: stream throughput, 64 KiB reads, 1 stream (medians)'\n"
	        "set key outside right\nset grid\nplot ",
	        path);
	for (int t = 0; t < T_MAX; t++) {
		for (int i = 0; i < g_res.nst; i++) {
			const struct res_stream *r = &g_res.st[i];

			if ((int)r->t != t || r->rx != RX_64K || r->streams != 1 || !r->n ||
			    strcmp(r->variant, variant) || t == T_VSOCK_SEQ_G2H ||
			    t == T_VSOCK_SEQ_H2G || t == T_UNIX_SEQ)
				continue;
			if (!used[t])
				fprintf(d, "%s# %s\n", nblk ? "\n\n" : "", tr_name[t]);
			used[t] = true;
			fprintf(d, "%zu %.4f\n", r->size, STAT_OF(r, gbps).med);
		}
		if (used[t]) {
			fprintf(s, "%s'%s' index %d using 1:2 with linespoints title '%s'",
			        nblk ? ", " : "", data, nblk, tr_name[t]);
			nblk++;
		}
	}
	fprintf(s, "\n");
	fclose(d);
	fclose(s);
	pid = nblk ? fork() : -1;
	if (pid == 0) {
		execlp("gnuplot", "gnuplot", script, (char *)NULL);
		_exit(127);
	}
	st = -1;
	if (pid > 0)
		waitpid(pid, &st, 0);
	unlink(data);
	unlink(script);
	rmdir(dir);
	if (!nblk)
		return -ENODATA;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ENOEXEC;
}
