/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf: the benchmark of a vhost-user vsock back-end. A userspace guest
 * driver (the guest role, uvsock_ctx_new_guest) drives the back-end through real shared-memory
 * virtqueues and this program plays the host application on the back-end's hybrid Unix-socket
 * side; in the same run, with the same method and sizes, it measures TCP loopback (TCP_NODELAY
 * off and on), a Unix stream socket and a shared-memory ring (the ceiling), and with
 * --in-process the device embedded through <uvsock/device.h>. Method, units and output:
 * man/uvsock-perf.1 and bench/README.md.
 *
 * This file: options, the run plan (which measurements, with which switch settings: --compare
 * alternates each switch off and on). Errors, progress and clocks: util.c.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/uvsock.h>

#include "perf.h"
#include "util/build.h"
#include "util/size.h"
#include "util/time.h"
#include "util/tune.h"

const char *const rxmode_name[2] = { "64k", "size" };
static struct env *g_env;

/* die(): the back-end this program started goes with it. */
static void die_teardown(void)
{
	struct env *e = g_env;

	g_env = NULL;
	if (e)
		env_teardown(e);
}

/* ---- options ---------------------------------------------------------------------------- */

/* A byte count with K/M/G/T (util/size.h, as every tool takes them), at least 1. */
static uint64_t parse_size(const char *s)
{
	uint64_t v;

	if (size_parse(s, 1, UINT64_MAX, &v) < 0)
		die("bad size '%s'", s);
	return v;
}

static int parse_int(const char *s, int lo, int hi, const char *what)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (end == s || *end || v < lo || v > hi)
		die("bad %s '%s' (%d..%d)", what, s, lo, hi);
	return (int)v;
}

/* A comma-separated size list into out (at most cap). */
static int parse_sizes(const char *arg, size_t *out, int cap, size_t max)
{
	char *list = strdup(arg), *save = NULL;
	int n = 0;

	if (!list)
		die("out of memory");
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == cap)
			die("at most %d sizes", cap);
		out[n] = (size_t)parse_size(t);
		if (out[n] > max)
			die("size %s above %zu", t, max);
		n++;
	}
	free(list);
	return n;
}

static unsigned parse_tests(const char *arg)
{
	static const struct {
		const char *n;
		unsigned m;
	} names[] = {
		{ "stream", M_STREAM },       { "rtt", M_RTT },     { "parallel", M_PARALLEL },
		{ "seqpacket", M_SEQPACKET }, { "mem", M_MEM },     { "vms", M_VMS },
		{ "inproc", M_INPROC },       { "dgram", M_DGRAM },
	};
	char *list = strdup(arg), *save = NULL;
	unsigned m = 0;

	if (!list)
		die("out of memory");
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		unsigned i;

		for (i = 0; i < sizeof(names) / sizeof(names[0]) && strcmp(names[i].n, t); i++)
			;
		if (i == sizeof(names) / sizeof(names[0]))
			die("unknown test '%s' (stream rtt parallel seqpacket mem vms inproc "
			    "dgram)",
			    t);
		m |= names[i].m;
	}
	free(list);
	return m;
}

/* A transport list into a bit mask over the n names (enum tr or enum dgtr). */
static unsigned parse_transports(const char *arg, const char *const *names, int n)
{
	char *list = strdup(arg), *save = NULL;
	unsigned m = 0;

	if (!list)
		die("out of memory");
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int i;

		for (i = 0; i < n && strcmp(names[i], t); i++)
			;
		if (i == n)
			die("unknown transport '%s'", t);
		m |= 1u << i;
	}
	free(list);
	return m;
}

static void usage(FILE *f)
{
	fputs("usage: uvsock-perf [options]\n"
	      "back-end:\n"
	      "  --uvsockd PATH        uvsockd to start and stop (default: $UVSOCKD, build tree,"
	      " $PATH)\n"
	      "  --socket PATH         use a running vhost-user vsock back-end at PATH instead\n"
	      "  --uds-path PATH       its hybrid host-side socket (required with --socket)\n"
	      "  --backend-pid PID     count the CPU of that process as the back-end's (one\n"
	      "                        not started here: with --socket)\n"
	      "  --end eof|count       how a stream reader ends: at end of stream (default), or\n"
	      "                        at the last byte its writer wrote (for back-ends that\n"
	      "                        never pass a guest's half-close on to the host)\n"
	      "  --in-process          also the device embedded through <uvsock/device.h>, a raw\n"
	      "                        guest and the host application in this process\n"
	      "what:\n"
	      "  --tests LIST          stream,rtt,parallel,seqpacket,mem,vms,inproc (default: all\n"
	      "                        but inproc; mem and vms need a uvsockd started here)\n"
	      "  --sizes LIST          write sizes (default 64,256,512,1K,...,512K)\n"
	      "  --rtt-sizes LIST      ping-pong sizes (default 64,256,4K)\n"
	      "  --streams LIST        parallel streams (default 4,16,64; 1: the stream test)\n"
	      "  --transports LIST     only these (vsock-g2h, vsock-h2g, tcp, tcp-nodelay, unix,\n"
	      "                        shm-ring, vsock-seqpacket-g2h, vsock-seqpacket-h2g,\n"
	      "                        unix-seqpacket, inproc-g2h, inproc-h2g; default: all)\n"
	      "  --runs N              runs per point, medians and min-max (default 5)\n"
	      "  --duration-ms N       one stream run (default 200)\n"
	      "  --rtt-count N         timed round trips per run (default 5000)\n"
	      "  --idle-conns N        idle connections of the memory test (default 10000)\n"
	      "  --vms N               VMs on one daemon for the scale test (default 64)\n"
	      "  --dgram               datagrams only (the \"dgram\" test): N sender threads on\n"
	      "                        one socket -> one receiver over udp, unix-dgram,\n"
	      "                        uvsock-loopback, uvsockd-g2h and uvsockd-h2g; MB/s\n"
	      "                        and drops\n"
	      "  --dgram-senders LIST  sender threads (default 1,2,4,16)\n"
	      "  --dgram-size N        datagram payload (default 4K, at most 65492)\n"
	      "  --dgram-transports L  only these datagram transports\n"
	      "  --dgram-locked        also the uvsock rows with UVSOCK_DGRAM_LOCKED=1 (the\n"
	      "                        socket-lock send path, the before/after figure)\n"
	      "  --quick               smoke run: 64 B and 64 KiB, 1 run, short runs\n"
	      "switches (src/util/tune.h: zerocopy tx-batch event-idx rx-batch credit-reduce\n"
	      "merge pkt64k rx-adaptive direct-rx tx-direct packed busy-poll-us=N; NAME, no-NAME):\n"
	      "  --tune-device LIST    for the uvsockd started here (--tune, or UVSOCK_TUNE)\n"
	      "  --tune-guest LIST     for the guest role in this process\n"
	      "  --compare LIST        each switch off and on, alternating, in this run; prints\n"
	      "                        the before/after table (busy-poll-us=N: 0 against N)\n"
	      "  --busy-poll-us N      guest driver thread spins N us before sleeping\n"
	      "  --dirty-log           vhost-user dirty logging on for the whole run, as during a\n"
	      "                        live migration (the back-end marks every page it writes)\n"
	      "output:\n"
	      "  --csv FILE  --json FILE  --plot FILE.png (gnuplot)   --quiet (no progress)\n"
	      "  -h, --help  -V, --version\n",
	      f);
}

/* ---- the plan --------------------------------------------------------------------------- */

/* One run of every selected stream and round-trip point, transport after transport. */
static void measure_round(struct env *e)
{
	static const enum tr st[] = { T_VSOCK_G2H, T_VSOCK_H2G,   T_INPROC_G2H, T_INPROC_H2G,
		                      T_TCP,       T_TCP_NODELAY, T_UNIX,       T_SHM };
	static const enum tr rt[] = {
		T_VSOCK_G2H, T_INPROC_G2H, T_TCP, T_TCP_NODELAY, T_UNIX, T_SHM
	};
	static const enum tr par[] = { T_VSOCK_G2H, T_VSOCK_H2G, T_TCP_NODELAY, T_UNIX };
	static const enum tr seq[] = { T_VSOCK_SEQ_G2H, T_VSOCK_SEQ_H2G, T_UNIX_SEQ };
	const struct opts *o = e->o;
#define ON(t) (tr_available(e, t) && (!o->transports || (o->transports & (1u << (t)))))

	if (o->tests & M_STREAM)
		for (int si = 0; si < o->nsizes; si++)
			for (int rx = 0; rx < 2; rx++)
				for (unsigned k = 0; k < sizeof(st) / sizeof(st[0]); k++)
					if (ON(st[k]))
						run_stream_point(e, st[k], o->sizes[si],
						                 (enum rxmode)rx, 1, 1);
	if (o->tests & M_PARALLEL)
		for (int i = 0; i < o->nstreams; i++)
			for (unsigned k = 0; k < sizeof(par) / sizeof(par[0]); k++)
				if (ON(par[k]))
					run_stream_point(e, par[k], 65536, RX_64K, o->streams[i],
					                 1);
	if ((o->tests & M_SEQPACKET) && e->guest_seq_lfd >= 0)
		for (int si = 0; si < o->nsizes; si++)
			for (unsigned k = 0; k < sizeof(seq) / sizeof(seq[0]); k++)
				if (o->sizes[si] <= 65536 && ON(seq[k]))
					run_stream_point(e, seq[k], o->sizes[si], RX_64K, 1, 1);
	if (o->tests & M_DGRAM)
		run_dgram_round(e);
	if (o->tests & M_RTT)
		for (int si = 0; si < o->nrtt_sizes; si++)
			for (unsigned k = 0; k < sizeof(rt) / sizeof(rt[0]); k++)
				if (ON(rt[k]))
					run_rtt_point(e, rt[k], o->rtt_sizes[si], 1);
#undef ON
}

/*
 * runs rounds of every point (so that a change of the machine's load during the run hits every
 * transport alike, and the ratios stay fair), then the memory and multi-VM measurements.
 */
static void measure(struct env *e, int runs)
{
	for (int r = 0; r < runs; r++) {
		if (runs > 1)
			progress("round %d of %d", r + 1, runs);
		measure_round(e);
	}
	if (e->o->tests & M_MEM)
		run_mem(e);
	if ((e->o->tests & M_VMS) && !e->o->socket)
		run_vms(e);
}

/* Applies the base switch lists plus `item` (NULL: none) and sets the environment up. */
static void setup_variant(struct env *e, const struct opts *o, const char *item, char *devlist,
                          size_t cap)
{
	static bool warned;
	char err[200];

	snprintf(devlist, cap, "%s%s%s", o->tune_device ? o->tune_device : "",
	         o->tune_device && item ? "," : "", item ? item : "");
	e->tune_dev = *devlist ? devlist : NULL;
	if ((o->tune_guest && tune_set(o->tune_guest, err, sizeof(err)) < 0) ||
	    (item && tune_set(item, err, sizeof(err)) < 0))
		die("--tune-guest/--compare: %s", err);
	tune_describe(g_res.tune_desc, sizeof(g_res.tune_desc));
	env_setup(e);
	snprintf(g_res.backend, sizeof(g_res.backend), "%s%s (guest CID %u)",
	         o->socket ? e->sock : "uvsockd", e->daemon > 0 ? " started by uvsock-perf" : "",
	         uvsock_ctx_local_cid(e->g));
	snprintf(g_res.build_backend, sizeof(g_res.build_backend), "%s", e->backend_build);
	if (report_not_optimized() && !warned) {
		warned = true;
		fprintf(stderr, "uvsock-perf: warning: build: uvsock-perf %s, back-end %s: not an "
		        "optimized build, the figures are not those of a release build\n",
		        g_res.build_self, g_res.build_backend);
	}
}

/* Adds the --in-process against ceiling ratio at 64 KiB (64k reads) if both were measured. */
static void inproc_ratio(struct env *e)
{
	for (int i = 0; i < g_res.nst; i++) {
		const struct res_stream *a = &g_res.st[i];
		double ga[PERF_MAX_RUNS], gb[PERF_MAX_RUNS];

		if (a->t != T_INPROC_G2H || a->size != 65536 || a->rx != RX_64K || a->streams != 1)
			continue;
		for (int j = 0; j < g_res.nst; j++) {
			const struct res_stream *b = &g_res.st[j];

			if (b->t != T_SHM || b->size != 65536 || b->rx != RX_64K ||
			    b->streams != 1 || strcmp(a->variant, b->variant) || !a->n || !b->n)
				continue;
			for (int k = 0; k < a->n; k++)
				ga[k] = a->s[k].gbps;
			for (int k = 0; k < b->n; k++)
				gb[k] = b->s[k].gbps;
			e->variant = a->variant;
			add_mem(e, "inproc_g2h_vs_shm_64KiB", median(ga, a->n) / median(gb, b->n),
			        "x", "--in-process guest->host at 64 KiB / shared-memory ring");
		}
	}
}

int main(int argc, char **argv)
{
	enum {
		O_UVSOCKD = 256,
		O_SOCKET,
		O_UDS,
		O_INPROC,
		O_TESTS,
		O_SIZES,
		O_RTT_SIZES,
		O_STREAMS,
		O_RUNS,
		O_DURATION,
		O_RTT_COUNT,
		O_IDLE,
		O_VMS,
		O_QUICK,
		O_TUNE_DEV,
		O_TUNE_GUEST,
		O_COMPARE,
		O_BUSY,
		O_CSV,
		O_JSON,
		O_PLOT,
		O_QUIET,
		O_DIRTY_LOG,
		O_TRANSPORTS,
		O_DGRAM,
		O_DG_SENDERS,
		O_DG_SIZE,
		O_DG_TRANSPORTS,
		O_DG_LOCKED,
		O_BACKEND_PID,
		O_END
	};
	static const struct option lo[] = {
		{ "uvsockd", required_argument, NULL, O_UVSOCKD },
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "uds-path", required_argument, NULL, O_UDS },
		{ "in-process", no_argument, NULL, O_INPROC },
		{ "tests", required_argument, NULL, O_TESTS },
		{ "sizes", required_argument, NULL, O_SIZES },
		{ "rtt-sizes", required_argument, NULL, O_RTT_SIZES },
		{ "streams", required_argument, NULL, O_STREAMS },
		{ "runs", required_argument, NULL, O_RUNS },
		{ "duration-ms", required_argument, NULL, O_DURATION },
		{ "rtt-count", required_argument, NULL, O_RTT_COUNT },
		{ "idle-conns", required_argument, NULL, O_IDLE },
		{ "vms", required_argument, NULL, O_VMS },
		{ "quick", no_argument, NULL, O_QUICK },
		{ "tune-device", required_argument, NULL, O_TUNE_DEV },
		{ "tune-guest", required_argument, NULL, O_TUNE_GUEST },
		{ "compare", required_argument, NULL, O_COMPARE },
		{ "busy-poll-us", required_argument, NULL, O_BUSY },
		{ "csv", required_argument, NULL, O_CSV },
		{ "json", required_argument, NULL, O_JSON },
		{ "plot", required_argument, NULL, O_PLOT },
		{ "quiet", no_argument, NULL, O_QUIET },
		{ "dirty-log", no_argument, NULL, O_DIRTY_LOG },
		{ "transports", required_argument, NULL, O_TRANSPORTS },
		{ "dgram", no_argument, NULL, O_DGRAM },
		{ "dgram-senders", required_argument, NULL, O_DG_SENDERS },
		{ "dgram-size", required_argument, NULL, O_DG_SIZE },
		{ "dgram-transports", required_argument, NULL, O_DG_TRANSPORTS },
		{ "dgram-locked", no_argument, NULL, O_DG_LOCKED },
		{ "backend-pid", required_argument, NULL, O_BACKEND_PID },
		{ "end", required_argument, NULL, O_END },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	static struct opts o = { .runs = 5,
		                 .duration_ms = 200,
		                 .rtt_count = 5000,
		                 .idle_conns = 10000,
		                 .nvms = 64,
		                 .tests = M_STREAM | M_RTT | M_PARALLEL | M_SEQPACKET | M_MEM |
		                          M_VMS };
	static struct env env;
	bool inproc = false, tests_given = false, runs_given = false, dgram = false;
	char devlist[512];
	int c, rc = 0;

	perf_util_init();
	perf_at_die(die_teardown);
	snprintf(g_res.build_self, sizeof(g_res.build_self), "%s", uvsock_build_flavour());
	while ((c = getopt_long(argc, argv, "hV", lo, NULL)) != -1) {
		switch (c) {
		case O_UVSOCKD:
			o.uvsockd = optarg;
			break;
		case O_SOCKET:
			o.socket = optarg;
			break;
		case O_UDS:
			o.uds = optarg;
			break;
		case O_INPROC:
			inproc = true;
			break;
		case O_TESTS:
			o.tests = parse_tests(optarg);
			tests_given = true;
			break;
		case O_SIZES:
			o.nsizes = parse_sizes(optarg, o.sizes, PERF_MAX_SIZES, 512u << 10);
			break;
		case O_RTT_SIZES:
			o.nrtt_sizes = parse_sizes(optarg, o.rtt_sizes, 8, 64u << 10);
			break;
		case O_STREAMS: {
			size_t v[8];

			o.nstreams = parse_sizes(optarg, v, 8, 256);
			for (int i = 0; i < o.nstreams; i++)
				o.streams[i] = (int)v[i];
			break;
		}
		case O_RUNS:
			o.runs = parse_int(optarg, 1, PERF_MAX_RUNS, "--runs");
			runs_given = true;
			break;
		case O_DURATION:
			o.duration_ms = parse_int(optarg, 10, 60000, "--duration-ms");
			break;
		case O_RTT_COUNT:
			o.rtt_count = parse_int(optarg, 100, 10000000, "--rtt-count");
			break;
		case O_IDLE:
			o.idle_conns = parse_int(optarg, 1, 1000000, "--idle-conns");
			break;
		case O_VMS:
			o.nvms = parse_int(optarg, 1, 128, "--vms");
			break;
		case O_QUICK:
			o.quick = true;
			break;
		case O_TUNE_DEV:
			o.tune_device = optarg;
			break;
		case O_TUNE_GUEST:
			o.tune_guest = optarg;
			break;
		case O_COMPARE:
			o.compare = optarg;
			break;
		case O_BUSY:
			o.busy_poll_us = (unsigned)parse_int(optarg, 0, 1000000, "us");
			break;
		case O_CSV:
			o.csv = optarg;
			break;
		case O_JSON:
			o.json = optarg;
			break;
		case O_PLOT:
			o.plot = optarg;
			break;
		case O_QUIET:
			g_quiet = true;
			break;
		case O_DIRTY_LOG:
			/* The guest role turns logging on after its start (tune.h "dirty-log"). */
			if (tune_set("dirty-log", NULL, 0) < 0)
				die("--dirty-log");
			break;
		case O_TRANSPORTS:
			o.transports = parse_transports(optarg, tr_name, T_MAX);
			break;
		case O_DGRAM:
			dgram = true;
			break;
		case O_DG_SENDERS: {
			size_t v[8];

			o.ndg_senders = parse_sizes(optarg, v, 8, PERF_DGRAM_MAX_SENDERS);
			for (int i = 0; i < o.ndg_senders; i++)
				o.dg_senders[i] = (int)v[i];
			break;
		}
		case O_DG_SIZE:
			o.dg_size = (size_t)parse_size(optarg);
			if (o.dg_size > PERF_DGRAM_MAX)
				die("--dgram-size above %u", PERF_DGRAM_MAX);
			break;
		case O_DG_TRANSPORTS:
			o.dg_transports = parse_transports(optarg, dg_name, D_MAX);
			break;
		case O_DG_LOCKED:
			o.dg_locked = true;
			break;
		case O_BACKEND_PID: {
			char proc[64];

			o.backend_pid = (pid_t)parse_int(optarg, 1, INT32_MAX, "--backend-pid");
			snprintf(proc, sizeof(proc), "/proc/%d/stat", (int)o.backend_pid);
			if (access(proc, R_OK) < 0)
				die("--backend-pid %d: no such process (%s)", (int)o.backend_pid,
				    strerror(errno));
			break;
		}
		case O_END:
			if (strcmp(optarg, "eof") && strcmp(optarg, "count"))
				die("--end takes eof or count");
			o.end_count = !strcmp(optarg, "count");
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("uvsock-perf %s\n", UVSOCK_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc || !!o.socket != !!o.uds) {
		fprintf(stderr, "uvsock-perf: %s\n",
		        optind < argc ? "unexpected argument"
		                      : "--socket and --uds-path go together");
		usage(stderr);
		return 2;
	}
	if (o.backend_pid && !o.socket) {
		fprintf(stderr, "uvsock-perf: --backend-pid goes with --socket (the uvsockd started "
		                "here is measured anyway)\n");
		return 2;
	}
	if (o.socket && o.tune_device) {
		fprintf(stderr, "uvsock-perf: --tune-device needs a uvsockd started here\n");
		return 2;
	}
	if (inproc)
		o.tests |= M_INPROC;
	if (dgram)
		o.tests = tests_given ? o.tests | M_DGRAM : M_DGRAM;
	if (!o.ndg_senders) {
		static const int ds[] = { 1, 2, 4, 16 };

		memcpy(o.dg_senders, ds, sizeof(ds));
		o.ndg_senders = 4;
	}
	if (!o.dg_size)
		o.dg_size = 4096;
	if (o.quick) {
		static const size_t qs[] = { 64, 65536 };

		if (!o.nsizes) {
			memcpy(o.sizes, qs, sizeof(qs));
			o.nsizes = 2;
		}
		if (!o.nrtt_sizes)
			o.rtt_sizes[o.nrtt_sizes++] = 64;
		if (!o.nstreams)
			o.streams[o.nstreams++] = 4;
		if (!runs_given)
			o.runs = 1;
		o.duration_ms = o.duration_ms > 50 ? 50 : o.duration_ms;
		o.rtt_count = o.rtt_count > 200 ? 200 : o.rtt_count;
		o.idle_conns = o.idle_conns > 100 ? 100 : o.idle_conns;
		o.nvms = o.nvms > 4 ? 4 : o.nvms;
	}
	if (!o.nsizes)
		for (size_t s = 64; s <= (512u << 10); s = s == 64 ? 256 : s * 2)
			o.sizes[o.nsizes++] = s;
	if (!o.nrtt_sizes) {
		o.rtt_sizes[0] = 64;
		o.rtt_sizes[1] = 256;
		o.rtt_sizes[2] = 4096;
		o.nrtt_sizes = 3;
	}
	if (!o.nstreams) {
		o.streams[0] = 4;
		o.streams[1] = 16;
		o.streams[2] = 64;
		o.nstreams = 3;
	}
	if (o.socket && !tests_given)
		o.tests &= ~(unsigned)(M_MEM | M_VMS); /* they need a uvsockd of our own */
	signal(SIGPIPE, SIG_IGN);
	env.o = &o;
	env.variant = "";
	g_env = &env;
	if (!o.compare) {
		setup_variant(&env, &o, NULL, devlist, sizeof(devlist));
		measure(&env, o.runs);
		inproc_ratio(&env);
		env_teardown(&env);
	} else {
		char *list = strdup(o.compare), *save = NULL;

		if (!list)
			die("out of memory");
		for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			char name[64], item[2][80], var[2][96];
			const char *eq = strchr(t, '=');

			snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - t) : (int)strlen(t),
			         t);
			/* busy-poll-us=N: 0 against N; any other switch: no-NAME against NAME. */
			snprintf(item[0], sizeof(item[0]), eq ? "%s=0" : "no-%s", name);
			snprintf(item[1], sizeof(item[1]), "%s", t);
			snprintf(var[0], sizeof(var[0]), "%s:off", t);
			snprintf(var[1], sizeof(var[1]), "%s:on", t);
			for (int r = 0; r < o.runs; r++) {
				for (int on = 0; on < 2; on++) {
					progress("compare %s: round %d of %d", var[on], r + 1,
					         o.runs);
					env.variant = var[on];
					setup_variant(&env, &o, item[on], devlist, sizeof(devlist));
					measure(&env, 1);
					env_teardown(&env);
				}
			}
			/* Back to the base settings for the next switch. */
			if (tune_set(eq ? "busy-poll-us=0" : name, NULL, 0) < 0)
				die("switch '%s'", name);
			env.variant = var[0];
			inproc_ratio(&env);
			env.variant = var[1];
			inproc_ratio(&env);
		}
		free(list);
		/* The header shows the base settings, not the last compared one. */
		if (o.tune_guest)
			tune_set(o.tune_guest, NULL, 0);
		tune_describe(g_res.tune_desc, sizeof(g_res.tune_desc));
	}
	g_env = NULL;
	g_res.seconds = perf_elapsed_s();
	report_table(stdout);
	if (o.compare)
		report_compare(stdout);
	if (o.csv && report_csv(o.csv) < 0) {
		fprintf(stderr, "uvsock-perf: --csv %s: %s\n", o.csv, strerror(errno));
		rc = 1;
	}
	if (o.json && report_json(o.json, &o) < 0) {
		fprintf(stderr, "uvsock-perf: --json %s: %s\n", o.json, strerror(errno));
		rc = 1;
	}
	if (o.plot) {
		int r = report_plot(o.plot);

		if (r < 0) {
			fprintf(stderr, "uvsock-perf: --plot %s: %s (is gnuplot installed?)\n",
			        o.plot, strerror(-r));
			rc = 1;
		}
	}
	return rc;
}
