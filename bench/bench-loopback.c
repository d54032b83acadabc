/* SPDX-License-Identifier: MIT */
/*
 * uvsock-bench-loopback: STREAM throughput at several write sizes and 64-byte round-trip time
 * over the uvsock loopback transport (inline pump and pump thread), next to TCP over 127.0.0.1
 * and a Unix stream socket, measured in the same run with the same method:
 *
 *   throughput  one sender thread writes `size`-byte buffers for --duration seconds, then shuts
 *               down sending; one receiver thread reads 64 KiB at a time until EOF. Rate =
 *               bytes received / (EOF time - start). MiB/s, median of --runs runs.
 *   latency     one thread sends 64 bytes, the other echoes them back; round trip = elapsed /
 *               iterations, in microseconds, median of --runs runs.
 *
 * Usage: uvsock-bench-loopback [--runs N] [--duration SECONDS] [--quick]
 *
 * Fixed workloads for instruction counting (valgrind --tool=callgrind, perf stat), one thread,
 * no waiting, so the counts are repeatable; the timed part is the function ops_run (use
 * callgrind's --toggle-collect=ops_run) and the program prints ns per operation:
 *
 *   --ops stream SIZE COUNT      loopback API, inline pump: COUNT x (send SIZE on one end, recv
 *                                SIZE on the other)
 *   --ops rtt COUNT              loopback API: COUNT x (64 B a->b, 64 B b->a)
 *   --ops engine SIZE COUNT B    the engine alone (src/vsock): COUNT rounds of B sends of SIZE,
 *                                pull them as B packets of SIZE (as from a peer that sends one
 *                                packet per write), feed them with one vsock_engine_feed_batch,
 *                                recv everything, then pull and feed the replies
 *   --ops engine1 SIZE COUNT B   the same, feeding each packet with vsock_engine_feed
 *   --ops enginer SIZE COUNT B   as engine, but the receiver reads SIZE bytes per recv call
 *                                (the queue is drained only by the last one)
 *   --ops threads SIZE COUNT     loopback API with the receiver on a second thread (as the
 *                                throughput test, but a fixed COUNT of SIZE-byte sends): for
 *                                `strace -f -c` (syscalls per packet); not repeatable under
 *                                callgrind
 *   --ops threadsp SIZE COUNT    the same with POLLIN interest armed on the receiving socket
 *                                (its eventfd is written when the mask turns readable)
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/uvsock.h>

#include "util/time.h"
#include "vsock/engine.h"

#define MAX_RUNS 15
#define RTT_SIZE 64
#define RECV_BUF (64 * 1024)

static double duration_s = 0.3;
static int runs = 5;
static int rtt_iters = 20000;

/* Seconds on the tree's monotonic clock (util/time.h), for rates. */
static double now_s(void)
{
	return (double)mono_ns() / (double)NS_PER_SEC;
}

static void die(const char *what)
{
	fprintf(stderr, "uvsock-bench-loopback: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* A transport under test: makes a connected pair and moves bytes. */
struct transport {
	const char *name;
	int (*pair)(struct transport *t, int *a, int *b);
	void (*close_pair)(struct transport *t, int a, int b);
	ssize_t (*send)(int fd, const void *buf, size_t len);
	ssize_t (*recv)(int fd, void *buf, size_t len);
	int (*shut_wr)(int fd);
	struct uvsock_ctx *ctx;
	unsigned flags;
	uint32_t next_port;
};

/* ---- uvsock loopback ---- */

static int uv_pair(struct transport *t, int *a, int *b)
{
	struct sockaddr_vm sa;
	int l, c, s;

	memset(&sa, 0, sizeof(sa));
	sa.svm_family = AF_VSOCK;
	sa.svm_cid = VMADDR_CID_ANY;
	sa.svm_port = t->next_port++;
	l = uvsock_socket(t->ctx, SOCK_STREAM, 0);
	if (l < 0 || uvsock_bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || uvsock_listen(l, 1) < 0)
		die("uvsock listen");
	c = uvsock_socket(t->ctx, SOCK_STREAM, 0);
	sa.svm_cid = VMADDR_CID_LOCAL;
	if (c < 0 || uvsock_connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("uvsock connect");
	s = uvsock_accept(l, NULL, NULL);
	if (s < 0)
		die("uvsock accept");
	uvsock_close(l);
	*a = c;
	*b = s;
	return 0;
}

static void uv_close_pair(struct transport *t, int a, int b)
{
	uvsock_close(a);
	uvsock_close(b);
}

static ssize_t uv_send(int fd, const void *buf, size_t len)
{
	return uvsock_send(fd, buf, len, 0);
}

static ssize_t uv_recv(int fd, void *buf, size_t len)
{
	return uvsock_recv(fd, buf, len, 0);
}

static int uv_shut_wr(int fd)
{
	return uvsock_shutdown(fd, SHUT_WR);
}

/* ---- kernel sockets ---- */

static int tcp_pair(struct transport *t, int *a, int *b)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int l, c, s, one = 1;

	l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 1) < 0 ||
	    getsockname(l, (struct sockaddr *)&sa, &len) < 0)
		die("tcp listen");
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("tcp connect");
	s = accept(l, NULL, NULL);
	if (s < 0)
		die("tcp accept");
	close(l);
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*a = c;
	*b = s;
	return 0;
}

static int unix_pair(struct transport *t, int *a, int *b)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair");
	*a = sv[0];
	*b = sv[1];
	return 0;
}

static void k_close_pair(struct transport *t, int a, int b)
{
	close(a);
	close(b);
}

static ssize_t k_send(int fd, const void *buf, size_t len)
{
	return send(fd, buf, len, MSG_NOSIGNAL);
}

static ssize_t k_recv(int fd, void *buf, size_t len)
{
	return recv(fd, buf, len, 0);
}

static int k_shut_wr(int fd)
{
	return shutdown(fd, SHUT_WR);
}

/* ---- measurements ---- */

struct tput {
	struct transport *t;
	int fd;
	size_t size;
	double start;
	uint64_t bytes;
	double end;
};

static void *tput_receiver(void *p)
{
	struct tput *x = p;
	char *buf = malloc(RECV_BUF);
	ssize_t n;

	if (!buf)
		die("malloc");
	while ((n = x->t->recv(x->fd, buf, RECV_BUF)) > 0)
		x->bytes += (uint64_t)n;
	if (n < 0)
		die("recv");
	x->end = now_s();
	free(buf);
	return NULL;
}

static double measure_tput(struct transport *t, size_t size)
{
	struct tput rx = { .t = t, .size = size };
	char *buf = calloc(1, size);
	pthread_t th;
	double stop;
	int a, b;

	if (!buf)
		die("calloc");
	t->pair(t, &a, &b);
	rx.fd = b;
	rx.start = now_s();
	if (pthread_create(&th, NULL, tput_receiver, &rx))
		die("pthread_create");
	stop = rx.start + duration_s;
	for (unsigned i = 0;; i++) {
		size_t off = 0;

		while (off < size) {
			ssize_t n = t->send(a, buf + off, size - off);

			if (n < 0)
				die("send");
			off += (size_t)n;
		}
		if ((i & 15) == 0 && now_s() >= stop)
			break;
	}
	t->shut_wr(a);
	pthread_join(th, NULL);
	t->close_pair(t, a, b);
	free(buf);
	return (double)rx.bytes / (1024.0 * 1024.0) / (rx.end - rx.start);
}

struct echo {
	struct transport *t;
	int fd;
};

static void *echo_main(void *p)
{
	struct echo *e = p;
	char buf[RTT_SIZE];

	for (;;) {
		size_t got = 0;

		while (got < RTT_SIZE) {
			ssize_t n = e->t->recv(e->fd, buf + got, RTT_SIZE - got);

			if (n <= 0)
				return NULL;
			got += (size_t)n;
		}
		if (e->t->send(e->fd, buf, RTT_SIZE) != RTT_SIZE)
			return NULL;
	}
}

static double measure_rtt(struct transport *t)
{
	struct echo e = { .t = t };
	char buf[RTT_SIZE] = { 0 };
	pthread_t th;
	double t0, t1;
	int a, b;

	t->pair(t, &a, &b);
	e.fd = b;
	if (pthread_create(&th, NULL, echo_main, &e))
		die("pthread_create");
	t0 = now_s();
	for (int i = 0; i < rtt_iters; i++) {
		size_t got = 0;

		if (t->send(a, buf, RTT_SIZE) != RTT_SIZE)
			die("rtt send");
		while (got < RTT_SIZE) {
			ssize_t n = t->recv(a, buf + got, RTT_SIZE - got);

			if (n <= 0)
				die("rtt recv");
			got += (size_t)n;
		}
	}
	t1 = now_s();
	t->shut_wr(a);
	pthread_join(th, NULL);
	t->close_pair(t, a, b);
	return (t1 - t0) / rtt_iters * 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* ---- fixed workloads (--ops) ---- */

struct ops_args {
	const char *mode;
	size_t size;
	long count;
	int batch;
};

/* The engine-only workload: one engine (CID 1) whose pulled packets are fed straight back. */
struct eng_bench {
	struct vsock_engine *e;
	struct vsock_sock *cli, *srv;
	uint8_t *arena;
	struct vsock_pkt_ref *refs;
	struct iovec *iovs;
	int cap;
	size_t pkt;      /* payload per pulled packet, as a peer that sends one packet per write */
	size_t rsize;    /* bytes per recv call */
	bool one_by_one;
	uint64_t events;
};

static uint64_t eng_now(void *opaque)
{
	(void)opaque;
	return mono_ns();
}

static void eng_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	struct eng_bench *b = opaque;

	(void)s;
	(void)user;
	(void)mask;
	b->events++;
}

/* Pulls everything pending and feeds it back (in batches of at most b->cap). */
static void eng_pump(struct eng_bench *b)
{
	for (;;) {
		int n = 0;

		while (n < b->cap) {
			struct iovec iov = { b->arena + (size_t)n * VSOCK_MAX_PKT_PAYLOAD, b->pkt };
			ssize_t r = vsock_engine_pull(b->e, &b->refs[n].hdr, &iov, 1, iov.iov_len);

			if (r < 0)
				break;
			b->iovs[n] = (struct iovec){ iov.iov_base, (size_t)r };
			b->refs[n].iov = &b->iovs[n];
			b->refs[n].iovcnt = r > 0 ? 1 : 0;
			n++;
		}
		if (n == 0)
			return;
		if (b->one_by_one) {
			for (int i = 0; i < n; i++)
				vsock_engine_feed(b->e, &b->refs[i].hdr, b->refs[i].iov,
						  b->refs[i].iovcnt);
		} else {
			vsock_engine_feed_batch(b->e, b->refs, (size_t)n);
		}
	}
}

static const struct vsock_engine_ops eng_ops = { .now = eng_now, .sock_event = eng_event };

static void eng_setup(struct eng_bench *b, int cap)
{
	struct vsock_engine_config cfg;
	struct vsock_sock *l;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = VMADDR_CID_LOCAL;
	cfg.ops = &eng_ops;
	cfg.opaque = b;
	b->cap = cap;
	b->arena = malloc((size_t)cap * VSOCK_MAX_PKT_PAYLOAD);
	b->refs = calloc((size_t)cap, sizeof(*b->refs));
	b->iovs = calloc((size_t)cap, sizeof(*b->iovs));
	if (!b->arena || !b->refs || !b->iovs || vsock_engine_new(&cfg, &b->e) < 0 ||
	    vsock_sock_new(b->e, VSOCK_TYPE_STREAM, &l) < 0 ||
	    vsock_sock_bind(l, VMADDR_CID_ANY, 5000) < 0 || vsock_sock_listen(l, 1) < 0 ||
	    vsock_sock_new(b->e, VSOCK_TYPE_STREAM, &b->cli) < 0 ||
	    vsock_sock_connect(b->cli, VMADDR_CID_LOCAL, 5000) != -EINPROGRESS)
		die("engine setup");
	eng_pump(b);
	if (vsock_sock_accept(l, &b->srv) < 0)
		die("engine accept");
	vsock_sock_close(l);
	eng_pump(b);
}

static void eng_teardown(struct eng_bench *b)
{
	vsock_sock_close(b->cli);
	vsock_sock_close(b->srv);
	eng_pump(b);
	vsock_engine_free(b->e);
	free(b->arena);
	free(b->refs);
	free(b->iovs);
}

/* The measured part: callgrind --toggle-collect=ops_run. */
__attribute__((noinline)) void ops_run(const struct ops_args *o, int a, int b,
				       struct eng_bench *eb, char *buf);
__attribute__((noinline)) void ops_run(const struct ops_args *o, int a, int b,
				       struct eng_bench *eb, char *buf)
{
	for (long i = 0; i < o->count; i++) {
		if (eb) {
			struct iovec iov = { buf, o->size };
			size_t got = 0, want = o->size * (size_t)o->batch;

			for (int k = 0; k < o->batch; k++)
				if (vsock_sock_send(eb->cli, &iov, 1, 0) != (ssize_t)o->size)
					die("engine send");
			eng_pump(eb);
			while (got < want) {
				struct iovec riov = { buf, eb->rsize };
				ssize_t n = vsock_sock_recv(eb->srv, &riov, 1, 0, NULL);

				if (n <= 0)
					die("engine recv");
				got += (size_t)n;
			}
			eng_pump(eb); /* credit updates, if any */
		} else if (strncmp(o->mode, "threads", 7) == 0) {
			size_t off = 0;

			while (off < o->size) {
				ssize_t n = uvsock_send(a, buf + off, o->size - off, 0);

				if (n < 0)
					die("threads send");
				off += (size_t)n;
			}
		} else if (strcmp(o->mode, "rtt") == 0) {
			if (uvsock_send(a, buf, RTT_SIZE, 0) != RTT_SIZE ||
			    uvsock_recv(b, buf, RTT_SIZE, MSG_WAITALL) != RTT_SIZE ||
			    uvsock_send(b, buf, RTT_SIZE, 0) != RTT_SIZE ||
			    uvsock_recv(a, buf, RTT_SIZE, MSG_WAITALL) != RTT_SIZE)
				die("rtt");
		} else {
			if (uvsock_send(a, buf, o->size, 0) != (ssize_t)o->size ||
			    uvsock_recv(b, buf, o->size, MSG_WAITALL) != (ssize_t)o->size)
				die("stream");
		}
	}
}

static int ops_main(int argc, char **argv)
{
	struct ops_args o = { .mode = argv[0], .size = RTT_SIZE, .batch = 1 };
	struct eng_bench eb = { 0 }, *ebp = NULL;
	struct transport t = { .next_port = 1000 };
	struct uvsock_ctx_stats st0 = { .size = sizeof(st0) }, st1 = { .size = sizeof(st1) };
	struct uvsock_ctx *ctx = NULL;
	int a = -1, b = -1;
	double t0, t1;
	char *buf;

	if (strcmp(o.mode, "rtt") == 0 && argc == 2) {
		o.count = atol(argv[1]);
	} else if ((strcmp(o.mode, "stream") == 0 || strcmp(o.mode, "threads") == 0 ||
		    strcmp(o.mode, "threadsp") == 0) && argc == 3) {
		o.size = (size_t)atol(argv[1]);
		o.count = atol(argv[2]);
	} else if ((strcmp(o.mode, "engine") == 0 || strcmp(o.mode, "engine1") == 0 ||
		    strcmp(o.mode, "enginer") == 0) && argc == 4) {
		o.size = (size_t)atol(argv[1]);
		o.count = atol(argv[2]);
		o.batch = atoi(argv[3]);
		ebp = &eb;
		eb.one_by_one = strcmp(o.mode, "engine1") == 0;
		eb.pkt = o.size;
		eb.rsize = strcmp(o.mode, "enginer") == 0 ? o.size : RECV_BUF;
	} else {
		fprintf(stderr, "usage: --ops stream|threads[p] SIZE COUNT | rtt COUNT | "
				"engine[1|r] SIZE COUNT B\n");
		return 2;
	}
	if (o.size == 0 || o.size > VSOCK_MAX_PKT_PAYLOAD || o.count <= 0 || o.batch <= 0 ||
	    o.size * (size_t)o.batch > 128 * 1024) {
		fprintf(stderr, "uvsock-bench-loopback: SIZE 1..65536, COUNT > 0, SIZE*B <= 128 KiB\n");
		return 2;
	}
	buf = calloc(1, RECV_BUF);
	if (!buf)
		die("calloc");
	if (ebp) {
		eng_setup(ebp, o.batch + 8);
	} else {
		ctx = uvsock_ctx_new_loopback(NULL);
		if (!ctx)
			die("uvsock_ctx_new_loopback");
		t.ctx = ctx;
		uv_pair(&t, &a, &b);
		uvsock_ctx_get_stats(ctx, &st0);
	}
	if (strncmp(o.mode, "threads", 7) == 0) {
		struct tput rx = { .t = &t, .fd = b, .size = o.size };
		pthread_t th;

		if (strcmp(o.mode, "threadsp") == 0 && uvsock_poll_interest(b, POLLIN) < 0)
			die("uvsock_poll_interest");
		t.recv = uv_recv;
		if (pthread_create(&th, NULL, tput_receiver, &rx))
			die("pthread_create");
		t0 = now_s();
		ops_run(&o, a, b, ebp, buf);
		uvsock_shutdown(a, SHUT_WR);
		pthread_join(th, NULL);
		t1 = now_s();
		if (rx.bytes != o.size * (uint64_t)o.count)
			die("threads: short transfer");
	} else {
		t0 = now_s();
		ops_run(&o, a, b, ebp, buf);
		t1 = now_s();
	}
	printf("%s size %zu count %ld batch %d: %.1f ns per round", o.mode, o.size, o.count,
	       o.batch, (t1 - t0) * 1e9 / (double)o.count);
	if (ebp) {
		struct vsock_engine_stats es;

		vsock_engine_get_stats(eb.e, &es);
		printf(", %.3f sock events per packet, %.2f credit updates per round\n",
		       (double)eb.events / (double)o.count / (double)o.batch,
		       (double)es.credit_updates_sent / (double)o.count);
		eng_teardown(ebp);
	} else {
		uvsock_ctx_get_stats(ctx, &st1);
		printf(", %.3f packets per round\n",
		       (double)(st1.tx_pkts - st0.tx_pkts) / (double)o.count);
		uv_close_pair(&t, a, b);
		uvsock_ctx_free(ctx);
	}
	free(buf);
	return 0;
}

static const size_t sizes[] = { 64, 4096, 65536 };

int main(int argc, char **argv)
{
	struct transport ts[] = {
		{ "uvsock loopback (inline pump)", uv_pair, uv_close_pair, uv_send, uv_recv,
		  uv_shut_wr, NULL, 0, 1000 },
		{ "uvsock loopback (pump thread)", uv_pair, uv_close_pair, uv_send, uv_recv,
		  uv_shut_wr, NULL, UVSOCK_LOOPBACK_PUMP_THREAD, 1000 },
		{ "TCP 127.0.0.1", tcp_pair, k_close_pair, k_send, k_recv, k_shut_wr, NULL, 0, 0 },
		{ "Unix stream socket", unix_pair, k_close_pair, k_send, k_recv, k_shut_wr, NULL, 0,
		  0 },
	};
	const int nt = (int)(sizeof(ts) / sizeof(ts[0]));
	double res[4][4];

	if (argc >= 3 && strcmp(argv[1], "--ops") == 0)
		return ops_main(argc - 2, argv + 2);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
			runs = atoi(argv[++i]);
		} else if (strcmp(argv[i], "--duration") == 0 && i + 1 < argc) {
			duration_s = atof(argv[++i]);
		} else if (strcmp(argv[i], "--quick") == 0) {
			runs = 1;
			duration_s = 0.05;
			rtt_iters = 2000;
		} else {
			fprintf(stderr,
				"usage: %s [--runs N] [--duration SECONDS] [--quick]\n"
				"       %s --ops stream|threads[p] SIZE COUNT | rtt COUNT | "
				"engine[1|r] SIZE COUNT B\n",
				argv[0], argv[0]);
			return 2;
		}
	}
	if (runs < 1 || runs > MAX_RUNS || duration_s <= 0) {
		fprintf(stderr, "uvsock-bench-loopback: --runs 1..%d, --duration > 0\n", MAX_RUNS);
		return 2;
	}
	for (int k = 0; k < nt; k++) {
		if (ts[k].pair == uv_pair) {
			struct uvsock_loopback_opts o = { .size = sizeof(o), .flags = ts[k].flags };

			ts[k].ctx = uvsock_ctx_new_loopback(&o);
			if (!ts[k].ctx)
				die("uvsock_ctx_new_loopback");
		}
		for (size_t s = 0; s < 3; s++) {
			double v[MAX_RUNS];

			for (int r = 0; r < runs; r++)
				v[r] = measure_tput(&ts[k], sizes[s]);
			res[k][s] = median(v, runs);
		}
		{
			double v[MAX_RUNS];

			for (int r = 0; r < runs; r++)
				v[r] = measure_rtt(&ts[k]);
			res[k][3] = median(v, runs);
		}
		uvsock_ctx_free(ts[k].ctx);
	}
	printf("STREAM loopback, %d run(s) of %.2f s each, median; 1 sender + 1 receiver thread\n",
	       runs, duration_s);
	printf("%-32s %12s %12s %12s %14s\n", "transport", "64 B MiB/s", "4 KiB MiB/s",
	       "64 KiB MiB/s", "64 B RTT us");
	for (int k = 0; k < nt; k++)
		printf("%-32s %12.1f %12.1f %12.1f %14.2f\n", ts[k].name, res[k][0], res[k][1],
		       res[k][2], res[k][3]);
	return 0;
}
