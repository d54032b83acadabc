/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf's results: one record per measured point with one sample per run, kept in the
 * process-wide g_res (filled by stream.c, rtt.c, mem.c, dgram.c; printed by report.c as tables,
 * CSV, JSON and a plot, each showing the median and the worst run).
 */
#ifndef UVSOCK_PERF_RESULTS_H
#define UVSOCK_PERF_RESULTS_H

#include <stddef.h>
#include <stdint.h>

/* Transports; the names are the JSON/CSV "transport" values. */
enum tr {
	T_VSOCK_G2H,
	T_VSOCK_H2G,
	T_TCP,
	T_TCP_NODELAY,
	T_UNIX,
	T_SHM,
	T_VSOCK_SEQ_G2H,
	T_VSOCK_SEQ_H2G,
	T_UNIX_SEQ,
	T_INPROC_G2H,
	T_INPROC_H2G,
	T_MAX
};
extern const char *const tr_name[T_MAX];

/* Receive modes of the stream test: 64 KiB reads with SO_RCVLOWAT 1, or read size = write size. */
enum rxmode { RX_64K, RX_SIZE };
extern const char *const rxmode_name[2];

/* Datagram transports (--dgram); the names are the JSON/CSV "transport" values. */
enum dgtr { D_UDP, D_UNIX, D_LOOP, D_LOOP_LOCKED, D_UVSOCKD, D_UVSOCKD_H2G, D_MAX };
extern const char *const dg_name[D_MAX];

/* Results: each record keeps one sample per run; the report prints medians and min/max. */
#define PERF_MAX_RUNS 64
struct sample {
	double gbps;
	double cpu_s_per_gb, cpu_writer, cpu_reader, cpu_rest, cpu_backend; /* CPU s per GB */
	double mbit_per_cpu_pct;
};

struct res_stream {
	enum tr t;
	size_t size;
	enum rxmode rx;
	int streams;
	char variant[48];
	int n;
	struct sample s[PERF_MAX_RUNS];
};

struct rtt_sample {
	double mean_us, p50_us, p99_us, p999_us;
	double cpu_us_per_rt; /* CPU microseconds per round trip, all processes involved */
};

struct res_rtt {
	enum tr t;
	size_t size;
	char variant[48];
	int n;
	struct rtt_sample s[PERF_MAX_RUNS];
};

struct res_mem {
	char name[48];
	char variant[48];
	double value;
	char unit[16];
	char note[160];
};

/* One datagram run: payload MB/s at the receiver, and where the datagrams went. */
struct dg_sample {
	double mbps, tx_mbps;          /* received payload rate; sent rate over the senders' run */
	uint64_t sent, received, lost; /* lost = sent - arrived */
	uint64_t counted;              /* drops the transport counted itself */
	uint64_t busy;                 /* sends refused with EAGAIN/ENOBUFS, retried */
	uint64_t bad;                  /* arrived with a wrong length */
};

struct res_dgram {
	enum dgtr t;
	int senders;
	size_t size;
	char variant[48];
	int n;
	struct dg_sample s[PERF_MAX_RUNS];
};

struct results {
	struct res_dgram *dg;
	int ndg, cdg;
	struct res_stream *st;
	int nst, cst;
	struct res_rtt *rt;
	int nrt, crt;
	struct res_mem *mem;
	int nmem, cmem;
	char tune_desc[512];
	char backend[200];
	char build_self[32];    /* what kind of build this uvsock-perf is (util/build.h) */
	char build_backend[64]; /* and the back-end, as its --version says */
	double seconds;
};
extern struct results g_res;

/* report.c: the records (found or created by key). */
void *res_grow(void *arr, int n, int *cap, size_t elem);
struct res_stream *res_stream_get(enum tr t, size_t size, enum rxmode rx, int streams,
                                  const char *variant);
struct res_rtt *res_rtt_get(enum tr t, size_t size, const char *variant);


#endif
