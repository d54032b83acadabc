/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf memory and scale measurements of a uvsockd this program started (its VmRSS from
 * /proc/PID/status): RSS per open idle guest -> host connection on one VM (--idle-conns, capped
 * by the VM's connection cap and this process's descriptor limit; the count used is printed),
 * RSS per connection while guests flood 1-byte writes that the host does not read, and one
 * daemon with --vms VMs moving data at once against one of them alone (medians of --runs
 * runs, alternating one VM and all). Main thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "../common/hybrid.h"
#include "perf.h"

#define FLOOD_CONNS 16
#define DEFAULT_CAP 1024 /* uvsockd's per-VM host connection cap without max-conns= */

void add_mem(const struct env *e, const char *name, double v, const char *unit, const char *fmt,
             ...)
{
	struct res_mem *m;
	va_list ap;

	g_res.mem = res_grow(g_res.mem, g_res.nmem, &g_res.cmem, sizeof(*g_res.mem));
	m = &g_res.mem[g_res.nmem++];
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", name);
	snprintf(m->variant, sizeof(m->variant), "%s", e->variant);
	snprintf(m->unit, sizeof(m->unit), "%s", unit);
	m->value = v;
	va_start(ap, fmt);
	vsnprintf(m->note, sizeof(m->note), fmt, ap);
	va_end(ap);
}

static long nofile_raise(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	getrlimit(RLIMIT_NOFILE, &rl);
	return (long)rl.rlim_cur;
}

static void idle_conns(struct env *e)
{
	long nofile = nofile_raise();
	int want = e->o->idle_conns, n = want, made = 0;
	int *g = calloc((size_t)want, sizeof(int)), *h = calloc((size_t)want, sizeof(int));
	long before, after;
	const char *why = "as asked";

	if (!g || !h)
		die("out of memory");
	/* Each connection holds a guest socket (an eventfd) and the host end here. */
	if (n > (nofile - 512) / 2) {
		n = (int)((nofile - 512) / 2);
		why = "this process's RLIMIT_NOFILE";
	}
	if (!e->max_conns_key && n > DEFAULT_CAP - 16) {
		n = DEFAULT_CAP - 16;
		why = "uvsockd's per-VM cap (no max-conns= key in this uvsockd)";
	}
	progress("memory: %d idle guest->host connections (%s)", n, why);
	before = rss_kib(e->daemon);
	for (; made < n; made++) {
		struct conn tx, rx;

		pair_open(e, T_VSOCK_G2H, &tx, &rx);
		g[made] = tx.fd;
		h[made] = rx.fd;
	}
	usleep(200 * 1000);
	after = rss_kib(e->daemon);
	add_mem(e, "idle_conns", n, "count", "asked %d, used %d: %s", want, n, why);
	add_mem(e, "rss_per_idle_conn", (double)(after - before) * 1024.0 / (n ? n : 1), "bytes",
	        "uvsockd VmRSS %ld -> %ld KiB", before, after);
	for (int i = 0; i < made; i++) {
		uvsock_close(g[i]);
		close(h[i]);
	}
	free(g);
	free(h);
}

static void flood(struct env *e)
{
	struct conn tx[FLOOD_CONNS], rx[FLOOD_CONNS];
	long before, after;
	uint64_t sent = 0;
	char one = 'f', buf[65536];

	before = rss_kib(e->daemon);
	for (int i = 0; i < FLOOD_CONNS; i++) {
		pair_open(e, T_VSOCK_G2H, &tx[i], &rx[i]);
		uvsock_set_nonblock(tx[i].fd, 1);
	}
	progress("memory: 1-byte flood on %d connections, host not reading", FLOOD_CONNS);
	/* Until every sender is blocked (credit and send buffer full), at most the duration x 4. */
	for (int round = 0, blocked = 0; blocked < FLOOD_CONNS && round < 4; round++) {
		blocked = 0;
		for (int i = 0; i < FLOOD_CONNS; i++) {
			int k = 0;

			while (k < 1000000 && uvsock_send(tx[i].fd, &one, 1, 0) == 1)
				k++;
			sent += (uint64_t)k;
			blocked += k < 1000000;
		}
		usleep((useconds_t)e->o->duration_ms * 1000u);
	}
	after = rss_kib(e->daemon);
	add_mem(e, "rss_per_flooded_conn", (double)(after - before) * 1024.0 / FLOOD_CONNS, "bytes",
	        "%d connections, %llu 1-byte writes, uvsockd VmRSS %ld -> %ld KiB (buf_alloc "
	        "256 KiB)",
	        FLOOD_CONNS, (unsigned long long)sent, before, after);
	for (int i = 0; i < FLOOD_CONNS; i++) {
		uvsock_close(tx[i].fd);
		while (read(rx[i].fd, buf, sizeof(buf)) > 0)
			;
		close(rx[i].fd);
	}
}

void run_mem(struct env *e)
{
	if (e->daemon <= 0) {
		add_mem(e, "skipped", 0, "", "memory: needs a uvsockd started by uvsock-perf");
		return;
	}
	/* A fresh daemon: after the stream tests its heap has free memory new connections reuse. */
	env_teardown(e);
	env_setup(e);
	usleep(100 * 1000);
	add_mem(e, "rss_one_vm", (double)rss_kib(e->daemon), "KiB",
	        "a fresh uvsockd's VmRSS, one VM, one guest");
	idle_conns(e);
	flood(e);
}

/* ---- many VMs on one daemon -------------------------------------------------------------- */

void run_vms(struct env *e)
{
	int nv = e->o->nvms;
	char bin_buf[4200], dir[64] = "/tmp/uvsock-perf-vms-XXXXXX", logp[128];
	const char *bin = find_uvsockd(e->o->uvsockd, bin_buf, sizeof(bin_buf));
	char **args = calloc((size_t)nv + 1, sizeof(char *));
	struct uvsock_ctx **g = calloc((size_t)nv, sizeof(*g));
	int *lfd = calloc((size_t)nv, sizeof(int));
	struct conn *tx = calloc((size_t)nv, sizeof(*tx)), *rx = calloc((size_t)nv, sizeof(*rx));
	double one[PERF_MAX_RUNS], all[PERF_MAX_RUNS], m1, ma;
	int runs = e->o->runs;
	long rss_idle;
	pid_t pid;

	if (!args || !g || !lfd || !tx || !rx || !mkdtemp(dir))
		die("vms: %s", strerror(errno));
	nofile_raise();
	snprintf(logp, sizeof(logp), "%s/uvsockd.log", dir);
	for (int i = 0; i < nv; i++) {
		if (asprintf(&args[i], "guest-cid=%d,socket=%s/vm%d.sock,uds-path=%s/vm%d.vsock",
		             i + 3, dir, i, dir, i) < 0)
			die("out of memory");
	}
	progress("vms: one uvsockd with %d VMs", nv);
	pid = spawn_uvsockd(bin, e->tune_dev, args, logp);
	for (int i = 0; i < nv; i++) {
		char sock[128], lp[96];
		struct uvsock_guest_opts go = { .size = sizeof(go),
						 .busy_poll_us = e->o->busy_poll_us };

		snprintf(sock, sizeof(sock), "%s/vm%d.sock", dir, i);
		if (wait_socket(pid, sock, 10000) < 0)
			die("vms: %s did not start with %d VMs (see %s)", bin, nv, logp);
		g[i] = uvsock_ctx_new_guest(sock, &go);
		if (!g[i])
			die("vms: guest %d: %s", i, strerror(errno));
		snprintf(lp, sizeof(lp), "%s/vm%d.vsock_%u", dir, i, PERF_HOST_PORT);
		lfd[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		{
			struct sockaddr_un a = { .sun_family = AF_UNIX };

			snprintf(a.sun_path, sizeof(a.sun_path), "%s", lp);
			if (lfd[i] < 0 || bind(lfd[i], (struct sockaddr *)&a, sizeof(a)) < 0 ||
			    listen(lfd[i], 16) < 0)
				die("vms: listen %s: %s", lp, strerror(errno));
		}
	}
	usleep(200 * 1000);
	rss_idle = rss_kib(pid);
	for (int r = 0; r < runs; r++) {
		for (int k = 0; k < 2; k++) {
			int n = k ? nv : 1;
			struct sample s;

			for (int i = 0; i < n; i++) {
				struct sockaddr_vm va = { .svm_family = AF_VSOCK,
					                  .svm_cid = VMADDR_CID_HOST,
					                  .svm_port = PERF_HOST_PORT };
				int fd = uvsock_socket(g[i], SOCK_STREAM, 0);

				if (fd < 0 ||
				    uvsock_connect(fd, (struct sockaddr *)&va, sizeof(va)) < 0)
					die("vms: guest %d connect: %s", i, strerror(errno));
				tx[i] = (struct conn){ .kind = C_UV, .fd = fd };
				rx[i] = (struct conn){ .kind = C_FD,
					               .fd = hybrid_accept(lfd[i], PERF_WAIT_MS) };
				if (rx[i].fd < 0)
					die("vms: host accept %d", i);
			}
			s = measure_pairs(tx, rx, n, 65536, RX_64K, pid, e->o->duration_ms * 2,
						  e->o->end_count);
			(k ? all : one)[r] = s.gbps;
			for (int i = 0; i < n; i++) {
				c_close(&tx[i]);
				c_close(&rx[i]);
			}
		}
	}
	add_mem(e, "vms", nv, "count", "VMs on one uvsockd");
	add_mem(e, "vms_rss_idle", (double)rss_idle, "KiB", "uvsockd VmRSS with %d idle VMs", nv);
	m1 = median(one, runs);
	ma = median(all, runs);
	add_mem(e, "vms_gbps_one", m1, "Gbit/s",
	        "one VM's g2h stream, 64 KiB writes, median of %d runs", runs);
	add_mem(e, "vms_gbps_all", ma, "Gbit/s",
	        "%d VMs, one g2h stream each at once, median of %d runs", nv, runs);
	add_mem(e, "vms_ratio", m1 > 0 ? ma / m1 : 0, "x", "aggregate of %d VMs / one VM", nv);
	for (int i = 0; i < nv; i++) {
		char lp[160];

		uvsock_ctx_free(g[i]);
		close(lfd[i]);
		snprintf(lp, sizeof(lp), "%s/vm%d.vsock_%u", dir, i, PERF_HOST_PORT);
		unlink(lp);
		free(args[i]);
	}
	stop_pid(pid);
	unlink(logp);
	rmdir(dir);
	free(args);
	free(g);
	free(lfd);
	free(tx);
	free(rx);
}
