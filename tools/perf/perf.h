/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf's shared declarations: options, the run environment (back-end, guest context,
 * comparison listeners), connection ends over every transport, and the result records the
 * report (report.c) prints as a table, CSV, JSON and a gnuplot plot.
 *
 * Threads: the main thread owns struct env and the result lists; measurement threads only touch
 * their own struct conn ends and the per-run structs they are handed.
 */
#ifndef UVSOCK_PERF_H
#define UVSOCK_PERF_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define PERF_MAX_SIZES      24
#define PERF_HOST_PORT      5000u
#define PERF_HOST_SEQ_PORT  5001u
#define PERF_GUEST_PORT     6000u
#define PERF_GUEST_SEQ_PORT 6001u
#define PERF_WAIT_MS        10000
#define PERF_BIG_READ       (64u * 1024u) /* receive mode "64k" */

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

/* Measurement groups (--tests). */
enum {
	M_STREAM = 1u << 0,
	M_RTT = 1u << 1,
	M_PARALLEL = 1u << 2,
	M_SEQPACKET = 1u << 3,
	M_MEM = 1u << 4,
	M_VMS = 1u << 5,
	M_INPROC = 1u << 6,
	M_DGRAM = 1u << 7,
};

/* Datagram transports (--dgram); the names are the JSON/CSV "transport" values. */
enum dgtr { D_UDP, D_UNIX, D_LOOP, D_LOOP_LOCKED, D_UVSOCKD, D_UVSOCKD_H2G, D_MAX };
extern const char *const dg_name[D_MAX];
#define PERF_DGRAM_MAX         65492u /* 64 KiB - the 44-byte vsock header */
#define PERF_DGRAM_MAX_SENDERS 64
#define PERF_HOST_DGRAM_PORT   5002u
#define PERF_GUEST_DGRAM_PORT  6002u

struct opts {
	const char *uvsockd;
	const char *socket;
	const char *uds;
	size_t sizes[PERF_MAX_SIZES];
	int nsizes;
	size_t rtt_sizes[8];
	int nrtt_sizes;
	int streams[8];
	int nstreams;
	unsigned tests;      /* M_* */
	unsigned transports; /* 1 << enum tr; 0: all */
	int runs;
	int duration_ms; /* per stream run */
	int rtt_count;
	int idle_conns;        /* memory test: idle connections on one VM */
	int nvms;              /* multi-VM test */
	unsigned busy_poll_us; /* guest role driver thread */
	const char *tune_device;
	const char *tune_guest;
	const char *compare;
	const char *csv, *json, *plot;
	bool quick;
	int dg_senders[8]; /* --dgram: sender threads per point */
	int ndg_senders;
	size_t dg_size;
	unsigned dg_transports; /* 1 << enum dgtr; 0: all */
	bool dg_locked;         /* also the UVSOCK_DGRAM_LOCKED=1 rows */
};

/* What one setting of the switches runs against: a back-end, a guest context, listeners. */
struct env {
	const struct opts *o;
	const char *variant;  /* compare: "name=off" / "name=on"; else "" */
	const char *tune_dev; /* the list passed to the uvsockd we start, or NULL */
	pid_t daemon;
	bool max_conns_key; /* the uvsockd we started took max-conns= */
	char dir[64], sock[128], uds[128], logpath[160];
	struct uvsock_ctx *g;
	int host_lfd, host_seq_lfd; /* host listeners at <uds>_PORT */
	char host_lpath[160], host_seq_lpath[160];
	int guest_lfd, guest_seq_lfd; /* guest listeners */
	int tcp_lfd;
	struct sockaddr_in tcp_addr;
	int unix_lfd, unix_seq_lfd;
	char unix_path[160], unix_seq_path[160];
	struct inproc *ip; /* --in-process transport, or NULL */
};

/* One end of a connection. */
enum conn_kind { C_FD, C_UV, C_SHM, C_INPROC };
struct shm_ring;
struct conn {
	enum conn_kind kind;
	int fd;
	struct shm_ring *tx, *rx; /* C_SHM */
	struct inproc *ip;        /* C_INPROC */
	bool seq;                 /* message-preserving (SEQPACKET) */
};

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern bool g_quiet;
double cpu_self_s(void);
double cpu_thread_s(void);
double cpu_pid_s(pid_t pid);
long rss_kib(pid_t pid);
int cmp_double(const void *a, const void *b);
double median(double *v, int n);

/* conn.c: transports and the back-end. */
void env_setup(struct env *e);
void env_teardown(struct env *e);
bool tr_available(const struct env *e, enum tr t);
void pair_open(struct env *e, enum tr t, struct conn *tx, struct conn *rx);
ssize_t c_send(struct conn *c, const void *buf, size_t n);
ssize_t c_recv(struct conn *c, void *buf, size_t n);
void c_shutdown_wr(struct conn *c);
void c_close(struct conn *c);
int c_set_rcvlowat(struct conn *c, int v);
int unix_connect_nb(const char *path, int type);
int accept_wait(int lfd, int ms);
int host_connect_guest_fd(const char *uds, unsigned port, int type);
const char *find_uvsockd(const char *given, char *buf, size_t cap);
pid_t spawn_uvsockd(const char *bin, const char *tune, char *const *vm_args, const char *log);
int wait_socket(pid_t pid, const char *path, int ms);
void stop_pid(pid_t pid);

/* shm.c: the shared-memory ring ceiling. */
void shm_pair(struct conn *tx, struct conn *rx);
ssize_t shm_send(struct shm_ring *r, const void *buf, size_t n);
ssize_t shm_recv(struct shm_ring *r, void *buf, size_t n);
void shm_close_wr(struct shm_ring *r);
void shm_free(struct shm_ring *r);

/* inproc.c: the device role embedded through <uvsock/device.h>, a raw guest in this process. */
struct inproc *inproc_new(void);
void inproc_free(struct inproc *ip);
void inproc_pair(struct inproc *ip, bool g2h, struct conn *tx, struct conn *rx);
ssize_t inproc_send(struct inproc *ip, const void *buf, size_t n);
ssize_t inproc_recv(struct inproc *ip, void *buf, size_t n);
void inproc_close(struct inproc *ip);

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
	double seconds;
};
extern struct results g_res;

/* report.c: the records (found or created by key). */
void *res_grow(void *arr, int n, int *cap, size_t elem);
struct res_stream *res_stream_get(enum tr t, size_t size, enum rxmode rx, int streams,
                                  const char *variant);
struct res_rtt *res_rtt_get(enum tr t, size_t size, const char *variant);

/* stream.c, rtt.c, mem.c: each appends to g_res. */
struct sample measure_pairs(struct conn *tx, struct conn *rx, int n, size_t size, enum rxmode mode,
                            pid_t backend, int duration_ms);
void run_stream_point(struct env *e, enum tr t, size_t size, enum rxmode rx, int nstreams,
                      int runs);
void run_rtt_point(struct env *e, enum tr t, size_t size, int runs);
void run_mem(struct env *e);
void run_vms(struct env *e);
void add_mem(const struct env *e, const char *name, double v, const char *unit, const char *fmt,
             ...) __attribute__((format(printf, 5, 6)));

/* dgram.c: the --dgram measurement and its part of the report. */
struct res_dgram *res_dgram_get(enum dgtr t, int senders, const char *variant);
void run_dgram_round(struct env *e);
void dgram_table(FILE *f);
void dgram_csv(FILE *f);
void dgram_json(FILE *f);

/* report.c */
void report_table(FILE *f);
int report_csv(const char *path);
int report_json(const char *path, const struct opts *o);
int report_plot(const char *path);
void report_compare(FILE *f);

#endif
