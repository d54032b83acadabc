/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf stream throughput, the same method over every transport: for each of n connected
 * pairs a writer thread sends `size`-byte writes (messages for SEQPACKET) until the main thread
 * raises the stop flag after the run's duration, then shuts down sending; a reader thread reads
 * until end of stream, in 64 KiB reads with SO_RCVLOWAT 1 (mode "64k") or in reads of the write
 * size (mode "size"). Rate = bytes read / (last end of stream - start). CPU: each thread's own
 * clock (writers = the sending application, readers = the receiving one), the rest of this
 * process (guest driver thread, in-process device thread) and the back-end's utime+stime when
 * this program started it (or --backend-pid names it).
 *
 * --end count, for back-ends that never pass a guest's half-close on to the host (the reader
 * would wait for an end of stream forever): each writer publishes how many bytes it wrote when
 * it stops, and its reader ends at the last of them instead of at end of stream, polling the
 * count between reads with a 10 ms receive timeout. The ring and the in-process guest, which
 * always see the end of stream, keep reading to it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"
#include "util/time.h"

#define WBUF_SIZE (512u * 1024u)

struct side {
	struct conn *c;
	size_t size, rsize;
	bool writer;
	pthread_barrier_t *go;
	_Atomic int *stop;
	_Atomic uint64_t written; /* reader side: its writer's final count (--end count) */
	_Atomic bool wrote;       /* ... published */
	struct side *peer;        /* writer: its reader */
	bool count;               /* reader: end at the writer's count */
	uint64_t bytes;
	uint64_t t_end;
	double cpu;
	int err;
};

static uint8_t g_wbuf[WBUF_SIZE];

static void *side_main(void *arg)
{
	struct side *s = arg;
	uint8_t *rbuf = s->writer ? NULL : malloc(s->rsize);
	double c0;

	if (!s->writer && !rbuf)
		s->err = ENOMEM;
	pthread_barrier_wait(s->go);
	c0 = cpu_thread_s();
	if (s->err)
		goto out;
	if (s->writer) {
		/*
		 * At least one write, even if the stop came before this thread ran (a loaded
		 * machine). Relaxed: a stop hint; the join publishes what matters.
		 */
		for (bool once = true; once || !atomic_load_explicit(s->stop, memory_order_relaxed);
		     once = false) {
			ssize_t r = c_send(s->c, g_wbuf, s->size);

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				s->err = r < 0 ? errno : EPIPE;
				break;
			}
			s->bytes += (uint64_t)r;
		}
		atomic_store(&s->peer->written, s->bytes);
		atomic_store(&s->peer->wrote, true);
		c_shutdown_wr(s->c);
	} else {
		for (;;) {
			ssize_t r;

			if (s->count && atomic_load(&s->wrote) && s->bytes >= atomic_load(&s->written))
				break;
			r = c_recv(s->c, rbuf, s->rsize);
			if (r < 0 && (errno == EINTR || (s->count && errno == EAGAIN)))
				continue;
			if (r < 0)
				s->err = errno;
			if (r <= 0)
				break;
			s->bytes += (uint64_t)r;
		}
		s->t_end = mono_ns();
	}
out:
	s->cpu = cpu_thread_s() - c0;
	free(rbuf);
	return NULL;
}

struct sample measure_pairs(struct conn *tx, struct conn *rx, int n, size_t size, enum rxmode mode,
                            pid_t backend, int duration_ms, bool end_count)
{
	struct side *sd = calloc((size_t)n * 2, sizeof(*sd));
	pthread_t *th = calloc((size_t)n * 2, sizeof(*th));
	pthread_barrier_t go;
	_Atomic int stop = 0;
	uint64_t t0, t1 = 0, bytes = 0;
	double c0, c1, d0, d1, wcpu = 0, rcpu = 0, gb, secs, total;
	struct sample s;

	if (!sd || !th)
		die("out of memory");
	if (size > WBUF_SIZE)
		die("write size above %u", WBUF_SIZE);
	pthread_barrier_init(&go, NULL, (unsigned)n * 2 + 1);
	for (int i = 0; i < n * 2; i++) {
		struct side *x = &sd[i];

		*x = (struct side){ .c = i % 2 ? &rx[i / 2] : &tx[i / 2],
			            .writer = i % 2 == 0,
			            .size = size,
			            .go = &go,
			            .stop = &stop,
			            .rsize = mode == RX_64K ? PERF_BIG_READ : size };
		if (!x->writer && mode == RX_64K)
			c_set_rcvlowat(x->c, 1);
		if (!x->writer && end_count)
			x->count = c_set_rcvtimeo(x->c, 10) == 0;
		if (x->writer)
			x->peer = &sd[i + 1];
		if (pthread_create(&th[i], NULL, side_main, x) != 0)
			die("pthread_create: too many threads");
	}
	c0 = cpu_self_s();
	d0 = cpu_pid_s(backend);
	pthread_barrier_wait(&go);
	t0 = mono_ns();
	usleep((useconds_t)duration_ms * 1000u);
	atomic_store_explicit(&stop, 1, memory_order_relaxed); /* joined below */
	for (int i = 0; i < n * 2; i++) {
		pthread_join(th[i], NULL);
		if (sd[i].err && !(sd[i].writer && sd[i].err == EPIPE))
			die("stream: %s: %s", sd[i].writer ? "write" : "read", strerror(sd[i].err));
		if (sd[i].writer) {
			wcpu += sd[i].cpu;
			continue;
		}
		rcpu += sd[i].cpu;
		bytes += sd[i].bytes;
		if (sd[i].t_end > t1)
			t1 = sd[i].t_end;
	}
	c1 = cpu_self_s();
	d1 = cpu_pid_s(backend);
	pthread_barrier_destroy(&go);
	free(sd);
	free(th);
	if (!bytes)
		die("stream: nothing arrived in %d ms", duration_ms);
	gb = (double)bytes / 1e9;
	secs = (double)(t1 - t0) / 1e9;
	total = (c1 - c0) + (d1 - d0);
	s = (struct sample){
		.gbps = (double)bytes * 8.0 / (double)(t1 - t0),
		.cpu_s_per_gb = total / gb,
		.cpu_writer = wcpu / gb,
		.cpu_reader = rcpu / gb,
		.cpu_rest = ((c1 - c0) - wcpu - rcpu) / gb,
		.cpu_backend = (d1 - d0) / gb,
	};
	if (s.cpu_rest < 0)
		s.cpu_rest = 0; /* clock granularity of the process clock */
	s.mbit_per_cpu_pct =
	        total > 0 ? ((double)bytes * 8.0 / 1e6 / secs) / (total / secs * 100.0) : 0;
	return s;
}

void run_stream_point(struct env *e, enum tr t, size_t size, enum rxmode rx, int nstreams, int runs)
{
	struct res_stream *res = res_stream_get(t, size, rx, nstreams, e->variant);
	struct conn *tx = calloc((size_t)nstreams, sizeof(*tx));
	struct conn *rc = calloc((size_t)nstreams, sizeof(*rc));
	bool backend = t == T_VSOCK_G2H || t == T_VSOCK_H2G || t == T_VSOCK_SEQ_G2H ||
	               t == T_VSOCK_SEQ_H2G;

	if (!tx || !rc)
		die("out of memory");
	progress("stream %-20s %7zu B  rx %-4s  %2d stream%s %s", tr_name[t], size, rxmode_name[rx],
	         nstreams, nstreams > 1 ? "s" : "", e->variant);
	for (int r = 0; r < runs && res->n < PERF_MAX_RUNS; r++) {
		for (int i = 0; i < nstreams; i++)
			pair_open(e, t, &tx[i], &rc[i]);
		res->s[res->n++] = measure_pairs(tx, rc, nstreams, size, rx,
		                                 backend ? e->cpu_pid : 0, e->o->duration_ms,
		                                 e->o->end_count);
		for (int i = 0; i < nstreams; i++) {
			c_close(&tx[i]);
			c_close(&rc[i]);
		}
	}
	free(tx);
	free(rc);
}
