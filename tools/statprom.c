/* SPDX-License-Identifier: MIT */
/*
 * `uvsock-stat --prometheus` (see statcli.h, ops_stat_prometheus): the daemon's "stats" answer
 * as a Prometheus text exposition (format 0.0.4, what node_exporter's textfile collector reads)
 * or as OpenMetrics 1.0 text. One metric family per counter of OPS_VM_COUNTERS (so a new
 * counter appears here without a change), one sample per VM labelled vm="<name or CID>" and
 * cid="<CID>"; the drop reasons are one family with a reason label; two gauges say whether a
 * VMM is connected and whether the rings are broken.
 */
#include "statcli.h"

#include <inttypes.h>
#include <string.h>

#include "ops/stats.h"
#include "util/macros.h"

#define PREFIX "uvsock_"

/* The scalar counters that are gauges; every other one is a counter. */
static const char *const gauges[] = { "conns_open" };

static bool is_gauge(const char *key)
{
	for (size_t i = 0; i < ARRAY_SIZE(gauges); i++)
		if (strcmp(gauges[i], key) == 0)
			return true;
	return false;
}

/* A label value: backslash, double quote and newline escaped (both formats). */
static void put_label_value(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(out, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", out);
		else
			fputc(*s, out);
	}
}

/* HELP text: backslash and newline escaped (a double quote is literal in HELP). */
static void put_help(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\\\", out);
		else if (*s == '\n')
			fputs("\\n", out);
		else
			fputc(*s, out);
	}
}

/*
 * The family's metadata. key is the JSON name ("tx_pkts"); a counter's sample is
 * uvsock_<key>_total (uvsock_<key> if key ends in _total already). The Prometheus text format
 * names the sample in TYPE and HELP; OpenMetrics names the family, without _total.
 */
static void family(FILE *out, const char *key, const char *help, bool gauge, bool om,
		   char *sample, size_t sample_len)
{
	size_t n = strlen(key);
	bool has_total = n > 6 && strcmp(key + n - 6, "_total") == 0;
	char fam[96];

	if (gauge)
		snprintf(fam, sizeof(fam), PREFIX "%s", key);
	else
		snprintf(fam, sizeof(fam), PREFIX "%.*s", (int)(has_total ? n - 6 : n), key);
	snprintf(sample, sample_len, "%s%s", fam, gauge ? "" : "_total");
	fprintf(out, "# HELP %s ", om ? fam : sample);
	put_help(out, help);
	fprintf(out, "\n# TYPE %s %s\n", om ? fam : sample, gauge ? "gauge" : "counter");
}

static void labels(FILE *out, const struct ops_jv *vm)
{
	const char *name = ops_json_str(vm, "name", "");
	uint64_t cid = ops_json_u64(vm, "cid", 0);

	fputs("{vm=\"", out);
	if (*name)
		put_label_value(out, name);
	else
		fprintf(out, "%" PRIu64, cid);
	fprintf(out, "\",cid=\"%" PRIu64 "\"", cid);
}

/*
 * One family with a sample per VM: the scalar counter key of each VM's "counters" (in_counters)
 * or the VM's own boolean key.
 */
static void per_vm(FILE *out, const struct ops_jv *first, const char *key, const char *help,
		   bool gauge, bool in_counters, bool om)
{
	char sample[128];

	family(out, key, help, gauge, om, sample, sizeof(sample));
	for (const struct ops_jv *v = first; v; v = v->next) {
		fputs(sample, out);
		labels(out, v);
		if (in_counters)
			fprintf(out, "} %" PRIu64 "\n",
				ops_json_u64(ops_json_get(v, "counters"), key, 0));
		else
			fprintf(out, "} %d\n", ops_json_bool(v, key, false) ? 1 : 0);
	}
}

void ops_stat_prometheus(FILE *out, const struct ops_jv *stats, bool openmetrics)
{
	const struct ops_jv *vms = ops_json_get(stats, "vms");
	const struct ops_jv *first = vms ? vms->child : NULL;
	char sample[128];

#define OPS_X_PROM_(f, key, help) per_vm(out, first, key, help, is_gauge(key), true, openmetrics);
	OPS_VM_COUNTERS(OPS_X_PROM_)
#undef OPS_X_PROM_
	family(out, "dropped",
	       "guest packets the device dropped, by reason (dropped.* in docs/operations.md)",
	       false, openmetrics, sample, sizeof(sample));
	for (const struct ops_jv *v = first; v; v = v->next)
		for (unsigned r = 0; r < _OPS_DROP_MAX; r++) {
			const char *why = ops_drop_reason_name(r);

			fputs(sample, out);
			labels(out, v);
			fprintf(out, ",reason=\"%s\"} %" PRIu64 "\n", why,
				ops_json_u64(ops_json_get(ops_json_get(v, "counters"), "dropped"),
					     why, 0));
		}
	per_vm(out, first, "vmm_connected", "1 while a VMM is attached to its vhost-user socket",
	       true, false, openmetrics);
	per_vm(out, first, "broken", "1 while the VM's rings are marked broken (until the VMM "
	       "restarts them)", true, false, openmetrics);
	if (openmetrics)
		fputs("# EOF\n", out);
}
