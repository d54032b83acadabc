/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf round trips: ping-pong of `size` bytes from the connection's tx end (the guest for
 * vsock, so a round trip is guest -> back-end -> host -> back-end -> guest), an echo thread on
 * the other end. 200 warm-up round trips, then --rtt-count timed ones; per run the mean, p50,
 * p99 and p99.9 in microseconds and the CPU time per round trip of every process involved.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "util/time.h"

#define RTT_WARM     200
#define RTT_MAX_SIZE (64u * 1024u)

struct echo {
	struct conn *c;
	size_t size;
	int count;
	int err;
};

/* Sends or receives exactly n bytes. Returns 0 or an errno (EPIPE at end of stream). */
static int xfer_all(struct conn *c, uint8_t *buf, size_t n, bool send)
{
	for (size_t done = 0; done < n;) {
		ssize_t r =
		        send ? c_send(c, buf + done, n - done) : c_recv(c, buf + done, n - done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? errno : EPIPE;
		done += (size_t)r;
	}
	return 0;
}

static void *echo_main(void *arg)
{
	struct echo *ec = arg;
	uint8_t buf[RTT_MAX_SIZE];

	for (int i = 0; i < ec->count && !ec->err; i++) {
		ec->err = xfer_all(ec->c, buf, ec->size, false);
		if (!ec->err)
			ec->err = xfer_all(ec->c, buf, ec->size, true);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static struct rtt_sample rtt_once(struct env *e, enum tr t, size_t size, bool backend)
{
	int count = e->o->rtt_count;
	uint64_t *lat = calloc((size_t)count, sizeof(*lat)), sum = 0;
	static uint8_t buf[RTT_MAX_SIZE];
	struct conn tx, rx;
	struct echo ec;
	struct rtt_sample s;
	pthread_t th;
	double c0 = 0, d0 = 0;

	if (!lat)
		die("out of memory");
	memset(buf, 'p', size);
	pair_open(e, t, &tx, &rx);
	ec = (struct echo){ .c = &rx, .size = size, .count = count + RTT_WARM };
	if (pthread_create(&th, NULL, echo_main, &ec) != 0)
		die("pthread_create");
	for (int i = 0; i < count + RTT_WARM; i++) {
		uint64_t t0 = mono_ns();
		int err;

		if (i == RTT_WARM) {
			c0 = cpu_self_s();
			d0 = backend ? cpu_pid_s(e->cpu_pid) : 0;
		}
		err = xfer_all(&tx, buf, size, true);
		if (!err)
			err = xfer_all(&tx, buf, size, false);
		if (err)
			die("%s: ping-pong: %s", tr_name[t], strerror(err));
		if (i >= RTT_WARM)
			lat[i - RTT_WARM] = mono_ns() - t0;
	}
	s.cpu_us_per_rt =
	        ((cpu_self_s() - c0) + (backend ? cpu_pid_s(e->cpu_pid) - d0 : 0)) * 1e6 / count;
	pthread_join(th, NULL);
	if (ec.err)
		die("%s: echo: %s", tr_name[t], strerror(ec.err));
	c_close(&tx);
	c_close(&rx);
	qsort(lat, (size_t)count, sizeof(*lat), cmp_u64);
	for (int i = 0; i < count; i++)
		sum += lat[i];
	s.mean_us = (double)sum / count / 1000.0;
	s.p50_us = (double)lat[count / 2] / 1000.0;
	s.p99_us = (double)lat[(size_t)count * 99 / 100] / 1000.0;
	s.p999_us = (double)lat[(size_t)count * 999 / 1000] / 1000.0;
	free(lat);
	return s;
}

void run_rtt_point(struct env *e, enum tr t, size_t size, int runs)
{
	struct res_rtt *res = res_rtt_get(t, size, e->variant);
	bool backend = t == T_VSOCK_G2H || t == T_VSOCK_H2G;

	if (size > RTT_MAX_SIZE)
		die("round-trip size above %u", RTT_MAX_SIZE);
	progress("rtt    %-20s %7zu B  %d round trips %s", tr_name[t], size, e->o->rtt_count,
	         e->variant);
	for (int r = 0; r < runs && res->n < PERF_MAX_RUNS; r++)
		res->s[res->n++] = rtt_once(e, t, size, backend);
}
