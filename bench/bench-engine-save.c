/* SPDX-License-Identifier: MIT */
/*
 * uvsock-bench-engine-save: what the engine's part of an upgrade costs (docs/upgrade.md). Two
 * engines (CID 3 and 2) with N connections, each with B bytes queued both ways in the host
 * engine (unread in its receive queue, unsent in its send ring); then, --runs times: the host
 * engine is saved into a record (vsock_engine_save), the record is put into a sealed memfd,
 * mapped and checked (rec_open), and restored into a fresh engine (vsock_engine_restore), which
 * then replaces the old one. Prints the record's size and the median time of each step and of
 * the whole, in milliseconds, and checks at the end that every queued byte still arrives.
 *
 * Usage: uvsock-bench-engine-save [--conns N] [--bytes B] [--runs R]   (defaults 1000 4096 11)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/rec.h"
#include "util/time.h"
#include "vsock/engine.h"

static uint64_t fake_now = 1000000000ull;

static uint64_t now_cb(void *opaque)
{
	(void)opaque;
	return fake_now;
}

static const struct vsock_engine_ops ops = {.now = now_cb};

static struct vsock_engine *engine(uint32_t cid, uint32_t max_socks)
{
	struct vsock_engine_config cfg;
	struct vsock_engine *e;

	vsock_engine_config_default(&cfg);
	cfg.local_cid = cid;
	cfg.max_socks = max_socks;
	cfg.ops = &ops;
	if (vsock_engine_new(&cfg, &e) < 0) {
		fprintf(stderr, "vsock_engine_new failed\n");
		exit(1);
	}
	return e;
}

static uint8_t pbuf[65536];

static void pump(struct vsock_engine *a, struct vsock_engine *b)
{
	for (;;) {
		bool any = false;

		for (int d = 0; d < 2; d++) {
			struct vsock_engine *from = d ? b : a, *to = d ? a : b;
			struct iovec iov = {pbuf, sizeof(pbuf)};
			struct vsock_hdr h;
			ssize_t n = vsock_engine_pull(from, &h, &iov, 1, sizeof(pbuf));

			if (n < 0)
				continue;
			iov.iov_len = (size_t)n;
			(void)vsock_engine_feed(to, &h, &iov, 1);
			any = true;
		}
		if (!any)
			return;
	}
}

struct held {
	uint32_t n;
	uint64_t *ids;
	struct vsock_sock **s;
};

static void adopt(void *arg, struct vsock_sock *s)
{
	struct held *h = arg;

	h->s[h->n] = s;
	h->ids[h->n++] = vsock_sock_id(s);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double median_ms(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	return (double)v[n / 2] / 1e6;
}

int main(int argc, char **argv)
{
	uint32_t conns = 1000, bytes = 4096, runs = 11;
	struct vsock_engine *g, *h;
	struct vsock_sock **gs, *l;
	struct held held;
	uint64_t *t_save, *t_memfd, *t_restore, *t_total;
	size_t rec_len = 0;
	uint8_t *data;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--conns") == 0)
			conns = (uint32_t)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--bytes") == 0)
			bytes = (uint32_t)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--runs") == 0)
			runs = (uint32_t)atoi(argv[i + 1]);
	}
	if (!conns || !runs || bytes > 65536) {
		fprintf(stderr, "usage: %s [--conns N] [--bytes B<=65536] [--runs R]\n", argv[0]);
		return 2;
	}
	gs = calloc(conns, sizeof(*gs));
	held.s = calloc(conns + 1, sizeof(*held.s));
	held.ids = calloc(conns + 1, sizeof(*held.ids));
	t_save = calloc(runs, 8);
	t_memfd = calloc(runs, 8);
	t_restore = calloc(runs, 8);
	t_total = calloc(runs, 8);
	data = malloc(bytes ? bytes : 1);
	memset(data, 'x', bytes);
	g = engine(3, conns + 16);
	h = engine(2, conns + 16);

	/* The listener and N connections; B bytes each way, all queued in h. */
	if (vsock_sock_new(h, VSOCK_TYPE_STREAM, &l) < 0 || vsock_sock_bind(l, VMADDR_CID_ANY, 1000) < 0 ||
	    vsock_sock_listen(l, 4096) < 0)
		return 1;
	held.n = 0;
	held.s[held.n++] = l;
	for (uint32_t i = 0; i < conns; i++) {
		struct vsock_sock *a;
		struct iovec iov = {data, bytes};

		if (vsock_sock_new(g, VSOCK_TYPE_STREAM, &gs[i]) < 0 ||
		    vsock_sock_connect(gs[i], 2, 1000) != -EINPROGRESS)
			return 1;
		pump(g, h);
		if (vsock_sock_accept(l, &a) < 0)
			return 1;
		held.s[held.n++] = a;
		if (bytes && (vsock_sock_send(gs[i], &iov, 1, 0) != (ssize_t)bytes ||
			      (pump(g, h), vsock_sock_send(a, &iov, 1, 0)) != (ssize_t)bytes))
			return 1;
	}

	for (uint32_t r = 0; r < runs; r++) {
		struct rec_writer w;
		struct rec_reader rd;
		struct rec_doc d;
		const uint8_t *b, *m;
		size_t len, mlen;
		uint64_t t0, t1, t2, t3;
		struct vsock_engine *h2;
		int fd;

		t0 = mono_ns();
		rec_writer_init(&w, REC_KIND_ENGINE, 1);
		if (vsock_engine_save(h, &w) < 0 || rec_writer_finish(&w, &b, &len) < 0)
			return 1;
		t1 = mono_ns();
		if (rec_memfd(b, len, "uvsock-engine", &fd) < 0 || rec_map_fd(fd, &m, &mlen) < 0)
			return 1;
		rec_writer_free(&w);
		t2 = mono_ns();
		h2 = engine(2, conns + 16);
		held.n = 0;
		if (rec_open(&d, m, mlen, REC_KIND_ENGINE, 1, 1, NULL, 0) < 0)
			return 1;
		rec_root(&d, &rd, "engine");
		if (vsock_engine_restore(h2, &rd, adopt, &held) < 0) {
			fprintf(stderr, "restore: %s\n", rec_error(&d));
			return 1;
		}
		t3 = mono_ns();
		rec_doc_fini(&d);
		rec_unmap(m, mlen);
		close(fd);
		vsock_engine_free(h);
		h = h2;
		rec_len = len;
		t_save[r] = t1 - t0;
		t_memfd[r] = t2 - t1;
		t_restore[r] = t3 - t2;
		t_total[r] = t3 - t0;
	}

	/* Every queued byte still arrives, both ways. */
	{
		uint64_t got_g = 0, got_h = 0;
		uint8_t rb[65536];
		struct iovec riov = {rb, sizeof(rb)};

		pump(g, h);
		for (uint32_t i = 0; i < conns; i++) {
			ssize_t n = vsock_sock_recv(gs[i], &riov, 1, 0, NULL);

			got_g += n > 0 ? (uint64_t)n : 0;
		}
		for (uint32_t i = 0; i < held.n; i++) {
			ssize_t n;

			if (vsock_sock_state(held.s[i]) == VSOCK_SS_LISTEN)
				continue;
			n = vsock_sock_recv(held.s[i], &riov, 1, 0, NULL);
			got_h += n > 0 ? (uint64_t)n : 0;
		}
		if (got_g != (uint64_t)conns * bytes || got_h != (uint64_t)conns * bytes) {
			fprintf(stderr, "bytes lost: %llu and %llu of %llu\n",
				(unsigned long long)got_g, (unsigned long long)got_h,
				(unsigned long long)conns * bytes);
			return 1;
		}
	}
	printf("connections %u, bytes queued each way per connection %u, runs %u\n", conns, bytes,
	       runs);
	printf("record %zu bytes; median ms: save %.2f, memfd+map %.2f, check+restore %.2f, "
	       "total %.2f\n", rec_len, median_ms(t_save, (int)runs), median_ms(t_memfd, (int)runs),
	       median_ms(t_restore, (int)runs), median_ms(t_total, (int)runs));
	vsock_engine_free(g);
	vsock_engine_free(h);
	return 0;
}
