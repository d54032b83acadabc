/* SPDX-License-Identifier: MIT */
/*
 * uvsock-stat (see statcli.h): counters and an `ss --vsock`-like connection listing from a
 * running uvsockd, as text or JSON, once or every N seconds; and packet capture through the
 * daemon into a file opened here (passed to the daemon over the control socket).
 */
#include "statcli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctlproto/client.h"
#include "ops/pcap.h"
#include "ops/stats.h"
#include "util/macros.h"
#include "util/size.h"
#include "util/time.h"

#define REQ_TIMEOUT_MS 10000
/* The first answer of a socket named with --control, which the daemon gives at once. */
#define CONTROL_PROBE_MS 2000

/* ---- the program ----------------------------------------------------------------------- */

enum { PROM_TEXT = 1, PROM_OPENMETRICS };

struct opts {
	const char *socket;  /* -s: a control socket (*.ctl) or a VM's vhost-user socket */
	const char *control; /* --control: the control socket, whatever its name */
	bool json, counters, conns;
	int prometheus;      /* 0: no; PROM_TEXT or PROM_OPENMETRICS */
	bool have_vm;
	uint32_t vm;
	bool watch;
	unsigned interval_s;
	long count;          /* iterations in watch mode; -1: forever */
	const char *capture;
	unsigned duration_s; /* 0: until SIGINT/SIGTERM */
	unsigned snaplen;
	bool ns;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: uvsock-stat [-s PATH|--control PATH] [--vm CID] [--counters|--conns]\n"
		"                   [--json|--prometheus[=FORMAT]] [--watch [SECONDS]] [--count N]\n"
		"       uvsock-stat [-s PATH] --capture FILE|- [--vm CID] [--duration SECONDS]\n"
		"                   [--snaplen BYTES] [--ns]\n"
		"Counters and connections of a running uvsockd, or a packet capture (pcap,\n"
		"LINKTYPE_VSOCK) of its traffic.\n"
		"\n"
		"  -s, --socket PATH   the control socket (*.ctl) or a VM's vhost-user socket: then\n"
		"                      the control socket listing it (PATH.ctl or *.ctl next to\n"
		"                      it; never the vhost-user socket); default: $" OPS_STATCLI_ENV
		"\n"
		"      --control PATH  the control socket, whatever its name\n"
		"      --vm CID        only this VM\n"
		"      --counters      counters only      --conns   connection listing only\n"
		"  -j, --json          one JSON object per refresh: {\"stats\":...,\"conns\":...}\n"
		"      --prometheus[=text|openmetrics]\n"
		"                      the counters as Prometheus text (node_exporter's textfile\n"
		"                      collector) or OpenMetrics text\n"
		"  -w, --watch [S]     refresh every S seconds (default 1) until interrupted,\n"
		"                      each with its UTC time and, per VM, the rates since\n"
		"                      the previous refresh\n"
		"      --count N       with --watch: stop after N refreshes\n"
		"  -c, --capture FILE  capture into FILE ('-': stdout) until --duration or Ctrl-C\n"
		"      --duration S    capture for S seconds\n"
		"      --snaplen N     keep at most N bytes per packet (headers are 76)\n"
		"      --ns            nanosecond timestamps\n"
		"  -h, --help          this text     -V, --version\n");
}

static int parse_uint(const char *s, unsigned long max, unsigned long *ret)
{
	char *end;
	unsigned long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

enum {
	OPT_CONTROL = 256,
	OPT_VM,
	OPT_COUNTERS,
	OPT_CONNS,
	OPT_PROMETHEUS,
	OPT_COUNT,
	OPT_DURATION,
	OPT_SNAPLEN,
	OPT_NS,
};

static const struct option long_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "control", required_argument, NULL, OPT_CONTROL },
	{ "vm", required_argument, NULL, OPT_VM },
	{ "counters", no_argument, NULL, OPT_COUNTERS },
	{ "conns", no_argument, NULL, OPT_CONNS },
	{ "json", no_argument, NULL, 'j' },
	{ "prometheus", optional_argument, NULL, OPT_PROMETHEUS },
	{ "watch", optional_argument, NULL, 'w' },
	{ "count", required_argument, NULL, OPT_COUNT },
	{ "capture", required_argument, NULL, 'c' },
	{ "duration", required_argument, NULL, OPT_DURATION },
	{ "snaplen", required_argument, NULL, OPT_SNAPLEN },
	{ "ns", no_argument, NULL, OPT_NS },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

/* The option getopt_long just refused, as the user wrote it. */
static const char *bad_opt(char **argv, char *buf, size_t len)
{
	const char *a = argv[optind - 1];

	if (optopt && optopt < 256 && strncmp(a, "--", 2) != 0) {
		snprintf(buf, len, "-%c", optopt);
		return buf;
	}
	return a;
}

/*
 * GNU getopt_long ("--opt=value" and "--opt value"); stops at the first non-option ('+'), so
 * that `--watch S` can take S from the next word. Not reentrant (getopt's globals): one call at
 * a time per process. Returns 0, 1 (handled: exit 0), or -1 (usage error, message printed).
 */
static int parse_opts(int argc, char **argv, const char *version, struct opts *o, FILE *out,
		      FILE *err)
{
	const char *env = getenv(OPS_STATCLI_ENV);
	char obuf[8];
	int c;

	*o = (struct opts){ .socket = env, .interval_s = 1, .count = -1 };
	optind = 0; /* glibc: a full re-initialisation, for repeated in-process runs */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:s:jw::c:hV", long_opts, NULL)) != -1) {
		const char *next = optind < argc ? argv[optind] : NULL;
		unsigned long v;
		uint64_t sz;

		switch (c) {
		case 'h':
			usage(out);
			return 1;
		case 'V':
			fprintf(out, "uvsock-stat %s\n", version ? version : "?");
			return 1;
		case 's':
			o->socket = optarg;
			break;
		case OPT_CONTROL:
			o->control = optarg;
			break;
		case OPT_VM:
			if (parse_uint(optarg, UINT32_MAX, &v) < 0) {
				fprintf(err, "uvsock-stat: --vm '%s' is not a CID\n", optarg);
				return -1;
			}
			o->have_vm = true;
			o->vm = (uint32_t)v;
			break;
		case 'j':
			o->json = true;
			break;
		case OPT_PROMETHEUS:
			if (!optarg || !strcmp(optarg, "text")) {
				o->prometheus = PROM_TEXT;
			} else if (!strcmp(optarg, "openmetrics")) {
				o->prometheus = PROM_OPENMETRICS;
			} else {
				fprintf(err, "uvsock-stat: --prometheus=%s: the formats are text and "
					     "openmetrics\n", optarg);
				return -1;
			}
			break;
		case OPT_COUNTERS:
			o->counters = true;
			break;
		case OPT_CONNS:
			o->conns = true;
			break;
		case 'w':
			/* --watch=S, -wS, or --watch S when the next word is a number */
			o->watch = true;
			if (!optarg && next && parse_uint(next, 86400, &v) == 0)
				optarg = argv[optind++];
			if (!optarg)
				break;
			if (parse_uint(optarg, 86400, &v) < 0 || v == 0) {
				fprintf(err, "uvsock-stat: --watch interval must be 1..86400 seconds\n");
				return -1;
			}
			o->interval_s = (unsigned)v;
			break;
		case OPT_COUNT:
			if (parse_uint(optarg, 1000000000, &v) < 0 || v == 0) {
				fprintf(err, "uvsock-stat: --count '%s' must be a positive number\n",
					optarg);
				return -1;
			}
			o->count = (long)v;
			break;
		case 'c':
			o->capture = optarg;
			break;
		case OPT_DURATION:
			if (parse_uint(optarg, 7 * 86400, &v) < 0 || v == 0) {
				fprintf(err, "uvsock-stat: --duration '%s' must be 1..604800 seconds\n",
					optarg);
				return -1;
			}
			o->duration_s = (unsigned)v;
			break;
		case OPT_SNAPLEN:
			if (size_parse(optarg, OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE,
				       OPS_PCAP_SNAPLEN_MAX, &sz) < 0) {
				fprintf(err, "uvsock-stat: --snaplen must be in [%u, %u] (K, M "
					     "suffixes)\n",
					OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE, OPS_PCAP_SNAPLEN_MAX);
				return -1;
			}
			o->snaplen = (unsigned)sz;
			break;
		case OPT_NS:
			o->ns = true;
			break;
		case ':':
			fprintf(err, "uvsock-stat: %s needs a value\n", bad_opt(argv, obuf,
										sizeof(obuf)));
			return -1;
		default:
			fprintf(err, "uvsock-stat: unknown option '%s' (see --help)\n",
				bad_opt(argv, obuf, sizeof(obuf)));
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(err, "uvsock-stat: unexpected argument '%s' (see --help)\n", argv[optind]);
		return -1;
	}
	if (o->control && o->socket && o->socket != env) {
		fprintf(err, "uvsock-stat: give either --socket or --control\n");
		return -1;
	}
	if (o->control)
		o->socket = NULL;
	else if (!o->socket || !*o->socket)
		o->socket = OPS_CTL_DEFAULT_PATH; /* the packaged uvsockd.service's */
	if (o->capture && (o->watch || o->json || o->counters || o->conns)) {
		fprintf(err, "uvsock-stat: --capture does not combine with --watch, --json, "
			     "--counters or --conns\n");
		return -1;
	}
	if (!o->capture && (o->duration_s || o->snaplen || o->ns)) {
		fprintf(err, "uvsock-stat: --duration, --snaplen and --ns go with --capture\n");
		return -1;
	}
	if (o->prometheus && (o->json || o->conns || o->capture)) {
		fprintf(err, "uvsock-stat: --prometheus does not combine with --json, --conns or "
			     "--capture\n");
		return -1;
	}
	if (o->prometheus)
		o->counters = true;
	if (o->count >= 0 && !o->watch) {
		fprintf(err, "uvsock-stat: --count goes with --watch\n");
		return -1;
	}
	if (!o->counters && !o->conns)
		o->counters = o->conns = true;
	return 0;
}

/* Runs one request; on an error answer prints it and returns -1. */
static int request(int fd, const char *req, int pass_fd, char **raw, struct ops_jv **v, FILE *err)
{
	struct ops_jv *j = NULL;
	int r = ops_ctl_request(fd, req, pass_fd, REQ_TIMEOUT_MS, raw, &j);

	if (r < 0) {
		fprintf(err, "uvsock-stat: '%s': %s\n", req,
			r == -EPROTO ? "the daemon's answer is not JSON" : strerror(-r));
		return -1;
	}
	if (!ops_json_bool(j, "ok", false)) {
		fprintf(err, "uvsock-stat: %s\n", ops_json_str(j, "error", "request failed"));
		ops_json_free(j);
		if (raw) {
			free(*raw);
			*raw = NULL;
		}
		return -1;
	}
	if (v)
		*v = j;
	else
		ops_json_free(j);
	return 0;
}

/* The datagram lines, only for a VM that has seen datagrams (most guests never negotiate). */
static void print_dgram_counters(FILE *out, const struct ops_jv *c)
{
	static const char *const drops[] = { "no_listener", "full", "oversize", "not_negotiated",
					     "malformed" };
	uint64_t any = ops_json_u64(c, "dgram_tx", 0) + ops_json_u64(c, "dgram_rx", 0);
	char key[40];

	for (unsigned i = 0; i < ARRAY_SIZE(drops); i++) {
		snprintf(key, sizeof(key), "dgram_drop_%s", drops[i]);
		any += ops_json_u64(c, key, 0);
	}
	if (!any)
		return;
	fprintf(out, "  datagrams   from guest %" PRIu64 ", %" PRIu64 " bytes    to guest %" PRIu64
		     ", %" PRIu64 " bytes\n",
		ops_json_u64(c, "dgram_tx", 0), ops_json_u64(c, "dgram_tx_bytes", 0),
		ops_json_u64(c, "dgram_rx", 0), ops_json_u64(c, "dgram_rx_bytes", 0));
	fprintf(out, "  dgram drops");
	for (unsigned i = 0; i < ARRAY_SIZE(drops); i++) {
		snprintf(key, sizeof(key), "dgram_drop_%s", drops[i]);
		fprintf(out, " %s %" PRIu64, drops[i], ops_json_u64(c, key, 0));
	}
	fprintf(out, "\n");
}

static void print_counters(FILE *out, const struct ops_jv *c)
{
	const struct ops_jv *d = ops_json_get(c, "dropped");

	fprintf(out, "  from guest  %" PRIu64 " pkts, %" PRIu64 " bytes    to guest  %" PRIu64
		     " pkts, %" PRIu64 " bytes\n",
		ops_json_u64(c, "tx_pkts", 0), ops_json_u64(c, "tx_bytes", 0),
		ops_json_u64(c, "rx_pkts", 0), ops_json_u64(c, "rx_bytes", 0));
	fprintf(out, "  conns       %" PRIu64 " open, %" PRIu64 " total    rst  %" PRIu64
		     " sent, %" PRIu64 " received\n",
		ops_json_u64(c, "conns_open", 0), ops_json_u64(c, "conns_total", 0),
		ops_json_u64(c, "rst_sent", 0), ops_json_u64(c, "rst_received", 0));
	fprintf(out, "  credit stalls %" PRIu64 "    ring errors %" PRIu64
		     "    host connects refused %" PRIu64 "\n",
		ops_json_u64(c, "credit_stalls", 0), ops_json_u64(c, "ring_errors", 0),
		ops_json_u64(c, "host_connects_refused", 0));
	fprintf(out, "  host side   %" PRIu64 " clients refused, %" PRIu64
		     " handshake timeouts, %" PRIu64 " symlinks refused\n",
		ops_json_u64(c, "host_clients_refused", 0),
		ops_json_u64(c, "host_handshake_timeouts", 0),
		ops_json_u64(c, "host_symlinks_refused", 0));
	fprintf(out, "  host fails  %" PRIu64 " listeners denied, %" PRIu64
		     " with no guest, %" PRIu64 " bad CONNECT lines, %" PRIu64
		     " refused by the guest\n",
		ops_json_u64(c, "host_listeners_denied", 0),
		ops_json_u64(c, "host_clients_no_guest", 0),
		ops_json_u64(c, "host_connect_bad_lines", 0),
		ops_json_u64(c, "host_clients_guest_refused", 0));
	if (ops_json_u64(c, "busy_poll_ns", 0))
		fprintf(out, "  busy poll   %.3f s CPU, %" PRIu64 " polls found work\n",
			(double)ops_json_u64(c, "busy_poll_ns", 0) / 1e9,
			ops_json_u64(c, "busy_poll_found", 0));
	print_dgram_counters(out, c);
	fprintf(out, "  dropped    ");
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		fprintf(out, " %s %" PRIu64, ops_drop_reason_name(i),
			ops_json_u64(d, ops_drop_reason_name(i), 0));
	fprintf(out, "\n");
}

/*
 * --watch: the counters of the previous refresh, per VM, for the rates line. Counters are
 * monotonic for the daemon's life; a VM that is new, or a daemon that restarted (a counter
 * went down), gets no rates this time.
 */
#define WATCH_VMS 64
enum { W_TX_PKTS, W_TX_BYTES, W_RX_PKTS, W_RX_BYTES, W_CONNS, W_RST, _W_MAX };
static const char *const watch_keys[_W_MAX] = { "tx_pkts", "tx_bytes", "rx_pkts", "rx_bytes",
						"conns_total", "rst_sent" };
struct watch_prev {
	uint64_t t_ns;                 /* CLOCK_MONOTONIC of the previous refresh; 0: none yet */
	unsigned n;
	uint64_t cid[WATCH_VMS];
	uint64_t v[WATCH_VMS][_W_MAX];
};

/* A rate with a decimal prefix: "12.3 M". */
static const char *si(double x, char *buf, size_t len)
{
	static const char pre[] = " kMGT";
	unsigned i = 0;

	while (x >= 1000 && i + 1 < sizeof(pre) - 1) {
		x /= 1000;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %c" : "%.0f ", x, pre[i]);
	return buf;
}

/* The rates line of VM cid from c, against w's previous refresh; remembers c for the next. */
static void print_rates(FILE *out, struct watch_prev *w, uint64_t now_ns, uint64_t cid,
			const struct ops_jv *c)
{
	uint64_t cur[_W_MAX];
	unsigned i;

	for (unsigned k = 0; k < _W_MAX; k++)
		cur[k] = ops_json_u64(c, watch_keys[k], 0);
	for (i = 0; i < w->n && w->cid[i] != cid; i++)
		;
	if (i < w->n && w->t_ns && now_ns > w->t_ns) {
		double dt = (double)(now_ns - w->t_ns) / 1e9, r[_W_MAX];
		bool back = false;
		char b[6][24];

		for (unsigned k = 0; k < _W_MAX; k++) {
			back |= cur[k] < w->v[i][k];
			r[k] = (double)(cur[k] - w->v[i][k]) / dt;
		}
		if (!back)
			fprintf(out, "  rates       from guest %spkts/s, %sB/s    to guest %spkts/s, "
				     "%sB/s    conns %.1f/s  rst %.1f/s\n",
				si(r[W_TX_PKTS], b[0], 24), si(r[W_TX_BYTES], b[1], 24),
				si(r[W_RX_PKTS], b[2], 24), si(r[W_RX_BYTES], b[3], 24), r[W_CONNS],
				r[W_RST]);
	}
	if (i == w->n) {
		if (w->n == WATCH_VMS)
			return;
		w->n++;
		w->cid[i] = cid;
	}
	memcpy(w->v[i], cur, sizeof(cur));
}

static void print_stats(FILE *out, const struct ops_jv *st, struct watch_prev *w)
{
	const struct ops_jv *vms = ops_json_get(st, "vms");
	uint64_t now = w ? mono_ns() : 0;
	unsigned n = 0;

	for (const struct ops_jv *v = vms ? vms->child : NULL; v; v = v->next, n++) {
		fprintf(out, "VM %" PRIu64 " (%s)  vmm %s%s%s\n", ops_json_u64(v, "cid", 0),
			ops_json_str(v, "name", "?"),
			ops_json_bool(v, "vmm_connected", false) ? "connected" : "not connected",
			ops_json_bool(v, "broken", false) ? "  RINGS BROKEN" : "",
			ops_json_bool(v, "capturing", false) ? "  capturing" : "");
		print_counters(out, ops_json_get(v, "counters"));
		if (w)
			print_rates(out, w, now, ops_json_u64(v, "cid", 0), ops_json_get(v, "counters"));
	}
	if (w)
		w->t_ns = now;
	if (n > 1) {
		fprintf(out, "All %u VMs\n", n);
		print_counters(out, ops_json_get(st, "totals"));
	}
}

static void print_conns(FILE *out, const struct ops_jv *cs)
{
	const struct ops_jv *list = ops_json_get(cs, "conns");

	fprintf(out, "%-6s %-9s %-10s %-16s %-16s %12s %12s %8s %8s %8s %8s  %s\n", "VM", "Type",
		"State", "Local", "Peer", "Recv-Bytes", "Send-Bytes", "Rx-Q", "Credit", "InFlight",
		"Tx-Q", "Host");
	for (const struct ops_jv *c = list ? list->child : NULL; c; c = c->next) {
		char local[32], peer[32];

		snprintf(local, sizeof(local), "%" PRIu64 ":%" PRIu64, ops_json_u64(c, "local_cid", 0),
			 ops_json_u64(c, "local_port", 0));
		snprintf(peer, sizeof(peer), "%" PRIu64 ":%" PRIu64, ops_json_u64(c, "peer_cid", 0),
			 ops_json_u64(c, "peer_port", 0));
		fprintf(out,
			"%-6" PRIu64 " %-9s %-10s %-16s %-16s %12" PRIu64 " %12" PRIu64 " %8" PRIu64
			" %8" PRIu64 " %8" PRIu64 " %8" PRIu64 "  %s\n",
			ops_json_u64(c, "vm", 0), ops_json_str(c, "type", "?"),
			ops_json_str(c, "state", "?"), local, peer, ops_json_u64(c, "bytes_in", 0),
			ops_json_u64(c, "bytes_out", 0), ops_json_u64(c, "rx_queued", 0),
			ops_json_u64(c, "peer_credit", 0), ops_json_u64(c, "in_flight", 0),
			ops_json_u64(c, "tx_queued", 0), ops_json_str(c, "host", ""));
	}
	if (ops_json_bool(cs, "truncated", false))
		fprintf(out, "(listing truncated by the daemon)\n");
}

/* "2026-12-01T23:30:00Z", the refresh time of --watch (UTC, as uvsockd's log lines). */
static void utc_now(char *buf, size_t len)
{
	time_t t = time(NULL);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int show_once(int fd, const struct opts *o, struct watch_prev *w, FILE *out, FILE *err)
{
	char now[32];
	char req[64], *raw_s = NULL, *raw_c = NULL;
	struct ops_jv *st = NULL, *cs = NULL;
	int rc = 1;

	if (o->have_vm)
		snprintf(req, sizeof(req), "stats vm=%u", o->vm);
	else
		snprintf(req, sizeof(req), "stats");
	if (o->counters && request(fd, req, -1, &raw_s, &st, err) < 0)
		goto out;
	if (o->have_vm)
		snprintf(req, sizeof(req), "conns vm=%u", o->vm);
	else
		snprintf(req, sizeof(req), "conns");
	if (o->conns && request(fd, req, -1, &raw_c, &cs, err) < 0)
		goto out;
	if (o->prometheus) {
		ops_stat_prometheus(out, st, o->prometheus == PROM_OPENMETRICS);
	} else if (o->json) {
		fprintf(out, "{");
		if (raw_s)
			fprintf(out, "\"stats\":%s%s", raw_s, raw_c ? "," : "");
		if (raw_c)
			fprintf(out, "\"conns\":%s", raw_c);
		if (w) {
			utc_now(now, sizeof(now));
			fprintf(out, "%s\"time\":\"%s\"", raw_s || raw_c ? "," : "", now);
		}
		fprintf(out, "}\n");
	} else {
		if (w) {
			utc_now(now, sizeof(now));
			fprintf(out, "uvsock-stat  %s  every %u s\n\n", now, o->interval_s);
		}
		if (st)
			print_stats(out, st, w);
		if (st && cs)
			fprintf(out, "\n");
		if (cs)
			print_conns(out, cs);
	}
	fflush(out);
	rc = 0;
out:
	free(raw_s);
	free(raw_c);
	ops_json_free(st);
	ops_json_free(cs);
	return rc;
}

static int do_capture(int fd, const struct opts *o, FILE *out, FILE *err)
{
	char req[256], *p;
	struct ops_jv *ans = NULL;
	const struct ops_jv *cap;
	sigset_t sigs, old;
	int file_fd, sfd = -1, rc = 1;
	uint64_t end;

	if (strcmp(o->capture, "-") == 0) {
		file_fd = fileno(out);
		if (file_fd < 0) {
			fprintf(err, "uvsock-stat: --capture -: the output is not a file\n");
			return 1;
		}
		fflush(out);
	} else {
		file_fd = open(o->capture, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			       0600);
		if (file_fd < 0) {
			fprintf(err, "uvsock-stat: %s: %s\n", o->capture, strerror(errno));
			return 1;
		}
	}
	p = req + snprintf(req, sizeof(req), "capture start -");
	if (o->have_vm)
		p += snprintf(p, sizeof(req) - (size_t)(p - req), " vm=%u", o->vm);
	if (o->snaplen)
		p += snprintf(p, sizeof(req) - (size_t)(p - req), " snaplen=%u", o->snaplen);
	if (o->ns)
		snprintf(p, sizeof(req) - (size_t)(p - req), " ns");
	/* Block SIGINT/SIGTERM before starting so that Ctrl-C always ends with a clean stop. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
	if (request(fd, req, file_fd, NULL, NULL, err) < 0)
		goto out;
	if (file_fd != fileno(out)) {
		close(file_fd);
		file_fd = -1;
	}
	fprintf(err, "uvsock-stat: capturing to %s%s\n", o->capture,
		o->duration_s ? "" : " (Ctrl-C to stop)");
	end = o->duration_s ? mono_ms() + o->duration_s * 1000ull : UINT64_MAX;
	for (;;) {
		struct pollfd pf[2] = { { .fd = sfd, .events = POLLIN },
					{ .fd = fd, .events = POLLIN } };
		uint64_t now = mono_ms();
		int t = end == UINT64_MAX ? -1 : now >= end ? 0 : (int)(end - now);

		if (t == 0)
			break;
		if (poll(pf, 2, t) < 0 && errno != EINTR)
			break;
		if (pf[0].revents & POLLIN) {
			struct signalfd_siginfo si;

			/* Consume the signal, or it is delivered when the mask is restored. */
			(void)!read(sfd, &si, sizeof(si));
			break;
		}
		if (pf[1].revents) {
			fprintf(err, "uvsock-stat: the daemon closed the control connection\n");
			goto out;
		}
	}
	if (request(fd, "capture stop", -1, NULL, &ans, err) < 0)
		goto out;
	cap = ops_json_get(ans, "capture");
	fprintf(err, "uvsock-stat: %" PRIu64 " packets captured (%" PRIu64 " bytes, %" PRIu64
		     " dropped)%s%s\n",
		ops_json_u64(cap, "pkts", 0), ops_json_u64(cap, "bytes", 0),
		ops_json_u64(cap, "dropped", 0), ops_json_str(cap, "error", NULL) ? "; error: " : "",
		ops_json_str(cap, "error", ""));
	rc = 0;
out:
	ops_json_free(ans);
	if (file_fd >= 0 && file_fd != fileno(out))
		close(file_fd);
	if (sfd >= 0)
		close(sfd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/*
 * Connects to the control socket of o (see ops_ctl_find for -s). Prints the reason and
 * returns -1 on failure.
 */
static int connect_daemon(const struct opts *o, int *fd, FILE *err)
{
	const char *p = o->control ? o->control : o->socket;
	char found[PATH_MAX] = "";
	int probe = 0, r = o->control ? ops_ctl_connect_probed(p, CONTROL_PROBE_MS, fd, &probe)
				      : ops_ctl_find(p, fd, found, sizeof(found));

	if (r == -EBADMSG) {
		fprintf(err,
			"uvsock-stat: %s did not answer as a uvsockd control socket within %d s "
			"(%s); a VM's vhost-user socket or uds-path is not one: give the path "
			"uvsockd logs as its control socket at start-up\n",
			p, CONTROL_PROBE_MS / 1000,
			probe == -EPROTO ? "the answer is not the control protocol's"
					 : strerror(-probe));
		return -1;
	}
	if (r == 0)
		return 0;
	if (r == -ESRCH)
		fprintf(err,
			"uvsock-stat: %s is not a control socket, and no uvsockd control socket next "
			"to it (%s%s, *%s) lists it as a VM's socket; give the control socket with "
			"--control PATH (uvsockd logs its control socket at start-up)\n",
			p, p, OPS_CTL_SUFFIX, OPS_CTL_SUFFIX);
	else if (r == -ENOTSOCK)
		fprintf(err, "uvsock-stat: %s is not a socket\n", p);
	else if (r == -EACCES && found[0] && strcmp(found, p) != 0)
		fprintf(err, "uvsock-stat: cannot connect to %s (the control socket next to %s): "
			"%s\n", found, p, ops_ctl_why(r));
	else
		fprintf(err, "uvsock-stat: cannot connect to %s: %s%s\n", p, ops_ctl_why(r),
			strcmp(p, OPS_CTL_DEFAULT_PATH) ? "" : " (the default; give --socket PATH "
			"or set $" OPS_STATCLI_ENV ")");
	return -1;
}

int uvsock_stat_main(int argc, char **argv, const char *version, FILE *out, FILE *err)
{
	struct watch_prev *w = NULL;
	struct opts o;
	int fd, r, rc = 1;

	r = parse_opts(argc, argv, version, &o, out, err);
	if (r)
		return r > 0 ? 0 : 2;
	/* One connection per refresh: a long --watch interval never meets the idle timeout, and
	 * a restarted daemon is picked up. */
	for (long i = 0; o.count < 0 || i < o.count; i++) {
		if (i > 0) {
			struct timespec ts = { .tv_sec = o.interval_s };

			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		}
		if (connect_daemon(&o, &fd, err) < 0)
			return 1;
		if (o.capture) {
			rc = do_capture(fd, &o, out, err);
			close(fd);
			break;
		}
		if (o.watch && !o.json && isatty(fileno(out)))
			fprintf(out, "\033[H\033[2J");
		if (o.watch && !w && !(w = calloc(1, sizeof(*w)))) {
			close(fd);
			fprintf(err, "uvsock-stat: out of memory\n");
			return 1;
		}
		rc = show_once(fd, &o, w, out, err);
		close(fd);
		if (rc || !o.watch)
			break;
	}
	free(w);
	return rc;
}
