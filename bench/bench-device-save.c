/* SPDX-License-Identifier: MIT */
/*
 * The pause a device's state move costs a VM (docs/upgrade.md, "The device API"): a device of
 * <uvsock/device.h> with N open host connections, each with 4 KiB the host wrote that wait for
 * the guest, is stopped, saved (uvsock_dev_save), restored into a second device
 * (uvsock_dev_restore) and started there (memory table, queues at the saved indices, device
 * thread), then the old device is freed; and back again, RUNS times. The VMM plays its own part
 * (the stand-in guest of examples/embed-guest.h). Prints, per N, the record's size and fds and
 * the median of: save, restore, the whole pause (from the first queue stop to the restored
 * device's thread running), and the old device's free (after the pause).
 *
 * Usage: uvsock-bench-device-save [N...]   (default: 1 100 1000; at most 1000)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "../examples/embed-guest.h"
#include "util/rec.h"

#define RUNS 7
#define WAIT_MS 10000
#define MAX_CONNS 1000

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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

#define CHECK(c)                                                                                   \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #c);             \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static char dir[48], uds[96];
static struct eg_guest g;

static void cfg_of(struct uvsock_dev_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
	cfg->guest_cid = 3;
	cfg->uds_path = uds;
	cfg->max_conns = MAX_CONNS + 8;
}

/* Memory table, both queues at idx (NULL: from the start), the device thread. */
static void start(struct uvsock_dev *d, const uint16_t *idx)
{
	struct uvsock_dev_mem_region r = eg_region(&g);

	CHECK(uvsock_dev_set_features(d, g.features) == 0);
	CHECK(uvsock_dev_set_mem_table(d, &r, 1) == 0);
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&g, q);

		if (idx)
			dq.last_avail_idx = idx[q];
		CHECK(uvsock_dev_queue_start(d, q, &dq) == 0);
	}
	CHECK(uvsock_dev_start(d) == 0);
}

/* A host program connects to guest port 1234 and the guest accepts; returns the host fd. */
static int host_conn(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct vsock_hdr h, o;
	char buf[64];
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", uds);
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(write(fd, "CONNECT 1234\n", 13) == 13);
	do
		CHECK(eg_recv(&g, &h, buf, sizeof(buf), WAIT_MS) == 0);
	while (h.op != VSOCK_OP_REQUEST);
	o = eg_hdr(&g, 1234, h.src_port, VSOCK_OP_RESPONSE, 0, 0);
	CHECK(eg_send(&g, &o, "", WAIT_MS) == 0);
	for (size_t n = 0; n < sizeof(buf) && read(fd, buf + n, 1) == 1 && buf[n] != '\n'; n++)
		;
	return fd;
}

static void run(unsigned n)
{
	uint64_t t_save[RUNS], t_restore[RUNS], t_pause[RUNS], t_free[RUNS];
	static int hfd[MAX_CONNS];
	static char four_k[4096];
	struct uvsock_dev_config cfg;
	struct uvsock_dev *d, *d2;
	size_t rec_len = 0, rec_fds = 0;

	CHECK(eg_init(&g, 3, uvsock_dev_features()) == 0);
	cfg_of(&cfg);
	CHECK(uvsock_dev_new(&cfg, &d) == 0);
	start(d, NULL);
	CHECK(eg_post_all_rx(&g) == 0);
	for (unsigned i = 0; i < n; i++)
		hfd[i] = host_conn();
	for (unsigned i = 0; i < n; i++)
		CHECK(write(hfd[i], four_k, sizeof(four_k)) == (ssize_t)sizeof(four_k));
	for (int r = 0; r < RUNS; r++) {
		uint16_t idx[2];
		int memfd, *fds;
		size_t nfds;
		struct stat st;
		uint64_t t0, t1, t2, t3;

		t0 = now_ns();
		for (unsigned q = 0; q < 2; q++)
			CHECK(uvsock_dev_queue_stop(d, q, &idx[q]) == 0);
		CHECK(uvsock_dev_save(d, &memfd, &fds, &nfds) == 0);
		t1 = now_ns();
		CHECK(uvsock_dev_restore(&cfg, memfd, fds, nfds, &d2) == 0);
		t2 = now_ns();
		start(d2, idx);
		t3 = now_ns();
		CHECK(fstat(memfd, &st) == 0);
		rec_len = (size_t)st.st_size;
		rec_fds = nfds;
		close(memfd);
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		free(fds);
		t_save[r] = t1 - t0;
		t_restore[r] = t2 - t1;
		t_pause[r] = t3 - t0;
		t0 = now_ns();
		uvsock_dev_free(d);
		t_free[r] = now_ns() - t0;
		d = d2;
	}
	printf("%u connections: record %zu bytes, %zu fds; median ms: save %.2f, restore %.2f, "
	       "pause %.2f (stop to running again), old device freed %.2f\n", n, rec_len, rec_fds,
	       median_ms(t_save, RUNS), median_ms(t_restore, RUNS), median_ms(t_pause, RUNS),
	       median_ms(t_free, RUNS));
	fflush(stdout);
	for (unsigned i = 0; i < n; i++)
		close(hfd[i]);
	uvsock_dev_free(d);
	eg_destroy(&g);
}

int main(int argc, char **argv)
{
	static const unsigned def[] = { 1, 100, 1000 };
	struct rlimit rl;

	/* N host sockets, and each device's duplicates of them. */
	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	rl.rlim_cur = rl.rlim_max;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	snprintf(dir, sizeof(dir), "/tmp/uvsock-bench-devsave-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(uds, sizeof(uds), "%s/vm.vsock", dir);
	if (argc > 1) {
		for (int i = 1; i < argc; i++) {
			unsigned n = (unsigned)strtoul(argv[i], NULL, 10);

			CHECK(n >= 1 && n <= MAX_CONNS);
			run(n);
		}
	} else {
		for (size_t i = 0; i < sizeof(def) / sizeof(def[0]); i++)
			run(def[i]);
	}
	CHECK(rmdir(dir) == 0);
	return 0;
}
