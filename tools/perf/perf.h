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

#include "results.h"
#include "util.h"

#define PERF_MAX_SIZES      24
#define PERF_HOST_PORT      5000u
#define PERF_HOST_SEQ_PORT  5001u
#define PERF_GUEST_PORT     6000u
#define PERF_GUEST_SEQ_PORT 6001u
#define PERF_WAIT_MS        10000
#define PERF_BIG_READ       (64u * 1024u) /* receive mode "64k" */

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
	bool end_count;  /* --end count: readers stop at the writer's byte count, not at EOF */
	pid_t backend_pid; /* --backend-pid: the CPU of a back-end not started here */
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
	pid_t cpu_pid;            /* the back-end whose CPU is counted: daemon or --backend-pid */
	char backend_build[64];   /* what the back-end's --version says of its build */
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
int c_set_rcvtimeo(struct conn *c, int ms);
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

/* stream.c, rtt.c, mem.c: each appends to g_res. */
struct sample measure_pairs(struct conn *tx, struct conn *rx, int n, size_t size, enum rxmode mode,
                            pid_t backend, int duration_ms, bool end_count);
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
/* True when uvsock-perf or the back-end it can tell of is a sanitizer or unoptimized build. */
bool report_not_optimized(void);
void report_table(FILE *f);
int report_csv(const char *path);
int report_json(const char *path, const struct opts *o);
int report_plot(const char *path);
void report_compare(FILE *f);

#endif
