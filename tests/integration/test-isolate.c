/* SPDX-License-Identifier: MIT */
/*
 * uvsockd --isolate with real processes (suite 'integration'): the daemon runs as a child of
 * this process (tests/harness/uvsockd-proc.h), guests are guest-role contexts or a hand-driven
 * vhost-user front-end over real vhost-user sockets and memfd guest memory, and uvsock-stat runs
 * in-process against the daemon's control socket.
 *
 * Covers: one worker process per sibling group ("uvsockd vmN", children of the daemon), each
 * VM's transfers through its worker, a killed worker leaving the other VM and the control socket
 * working and started again (its VM served by the new worker), the main exiting when every
 * worker is gone (stopped on its own), workers dying with the main; the memory
 * finding (a guest whose TX descriptors point at pages it never touched: without --isolate
 * uvsockd's own RSS grows by what it was made to touch, with --isolate only the worker's does);
 * and, where a writable cgroup2 hierarchy exists, cgroup=DIR placing the worker there (with the
 * memory controller: memory.current of that cgroup grows, not uvsockd's).
 */
#include <sys/statfs.h>

#include "guestside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "statrun.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "workers.h"
/* The raw front-end below uses the project's own vsock definitions. */
#undef VMADDR_CID_HYPERVISOR
#undef VMADDR_CID_LOCAL
#undef VMADDR_CID_HOST
#undef VMADDR_CID_ANY
#undef VMADDR_PORT_ANY
#include "vhost_user/frontend.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define MiB (1024u * 1024u)
#define KiB_PER_MiB 1024u

static uint64_t rss_kib(pid_t pid)
{
	return proc_status_kib(pid, "VmRSS");
}

/* Waits until u's control socket (<first socket>.ctl) answers. */
static void wait_ctl(const struct uvd *u)
{
	char ctl[200];
	int fd = -1;

	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	if (!WAIT_FOR(ops_ctl_connect(ctl, &fd) >= 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

/* `uvsock-stat -s SOCK --json`, parsed. */
static struct ops_jv *stat_json(const char *sock)
{
	struct run r = stat_run_version("isolate", (const char *[]){ "-s", sock, "--json", NULL });
	struct ops_jv *v;

	if (r.rc != 0)
		test_fail(__FILE__, __LINE__, "uvsock-stat failed (%d): %s", r.rc, r.err);
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), &v));
	run_free(&r);
	return v;
}

/* The stats entry of VM cid in a stat_json() answer. */
static const struct ops_jv *stat_vm(const struct ops_jv *v, uint32_t cid)
{
	const struct ops_jv *vms = ops_json_get(ops_json_get(v, "stats"), "vms");

	for (const struct ops_jv *e = vms ? vms->child : NULL; e; e = e->next)
		if (ops_json_u64(e, "cid", 0) == cid)
			return e;
	test_fail(__FILE__, __LINE__, "VM %u is not in the stats", cid);
}

/* True once the control socket names VM cid's worker `name` ("vm3 pid 123"). */
static bool stat_name_is(const struct uvd *u, uint32_t cid, const char *name)
{
	struct ops_jv *v = stat_json(u->sock[0]);
	bool same = strcmp(ops_json_str(stat_vm(v, cid), "name", ""), name) == 0;

	ops_json_free(v);
	return same;
}

/* A guest of u's VM i sends 4 MiB to a host listener and the host answers "pong". */
static void transfer_ok(const struct uvd *u, int i, uint32_t port)
{
	struct uvsock_ctx *g = g_guest_new(u->sock[i], NULL);
	struct host_io hr;
	pthread_t th;
	char buf[8];
	int lfd, hfd, gfd;

	gfd = g_connect_host(g, u->uds[i], SOCK_STREAM, port, WAIT_MS, &lfd, &hfd);
	hr = (struct host_io){ .fd = hfd, .total = 4 * MiB, .seed = port };
	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	g_send_pattern(gfd, 4 * MiB, 65536, port);
	pthread_join(th, NULL);
	ASSERT_TRUE(hr.ok);
	hs_write_all(hfd, "pong", 4);
	ASSERT_EQ(uvsock_recv(gfd, buf, 4, MSG_WAITALL), 4);
	ASSERT_MEMEQ(buf, "pong", 4);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
}

/* A temporary directory and the paths of n VMs (CIDs 3, 4, ...) for iso_spawn(). */
static void iso_paths(struct uvd *u, int n)
{
	ASSERT_LE(n, 2);
	memset(u, 0, sizeof(*u));
	u->nvms = n;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-iso-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	for (int i = 0; i < n; i++) {
		u->cid[i] = 3 + (uint32_t)i;
		snprintf(u->sock[i], sizeof(u->sock[i]), "%s/vm%u.sock", u->dir, u->cid[i]);
		snprintf(u->uds[i], sizeof(u->uds[i]), "%s/vm%u.vsock", u->dir, u->cid[i]);
	}
}

/*
 * Starts `uvsockd --isolate` on iso_paths() (each VM in a group of its own), VM i's --vm value
 * extended by keys[i] (",cgroup=..." or ""), without waiting for it.
 */
static void iso_spawn(struct uvd *u, const char *const *keys)
{
	char vm[2][600];
	char *argv[8] = { (char *)uvd_binary(), "--isolate" };
	int argc = 2;

	for (int i = 0; i < u->nvms; i++) {
		snprintf(vm[i], sizeof(vm[i]), "guest-cid=%u,socket=%s,uds-path=%s,groups=g%u%s",
			 u->cid[i], u->sock[i], u->uds[i], u->cid[i], keys[i]);
		argv[argc++] = "--vm";
		argv[argc++] = vm[i];
	}
	argv[argc++] = "--log-level=info";
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
}

/* ---- one VM per worker, a worker killed --------------------------------------------------- */

TEST(two_vms_two_workers_and_a_killed_worker_spares_the_other)
{
	static const uint32_t cids[] = { 3, 4 };
	struct ops_jv *v;
	struct uvd u;
	pid_t kids[8], w3, w4, w3b;
	char name[40], name3[40];

	uvd_start(&u, 2, cids, NULL, "--isolate");
	wait_ctl(&u);
	/* Two groups ("g3", "g4"): two workers, children of the daemon, named after their VM. */
	ASSERT_EQ(children_of(u.pid, kids, 8), 2);
	w3 = worker_of(&u, 3);
	w4 = worker_of(&u, 4);
	ASSERT_NE(w3, w4);
	transfer_ok(&u, 0, 5000);
	transfer_ok(&u, 1, 5001);
	/* The control socket answers for both, naming each VM's worker. */
	v = stat_json(u.sock[0]);
	snprintf(name, sizeof(name), "vm3 pid %d", (int)w3);
	ASSERT_STREQ(ops_json_str(stat_vm(v, 3), "name", ""), name);
	snprintf(name, sizeof(name), "vm4 pid %d", (int)w4);
	ASSERT_STREQ(ops_json_str(stat_vm(v, 4), "name", ""), name);
	ASSERT_GE(ops_json_u64(ops_json_get(stat_vm(v, 4), "counters"), "tx_bytes", 0), 4 * MiB);
	ops_json_free(v);

	/*
	 * Kill VM 3's worker: the daemon logs it and starts a new one after its back-off; VM 4's
	 * worker is untouched and keeps working; VM 3 works again through the new worker.
	 */
	ASSERT_OK(kill(w3, SIGKILL));
	ASSERT_WAIT_FOR(pid_gone(w3), WAIT_MS);
	ASSERT_WAIT_FOR(file_has(u.log, "was killed by signal 9 (Killed); starting it again in"),
			WAIT_MS);
	ASSERT_TRUE(uvd_alive(&u));
	transfer_ok(&u, 1, 5002);
	ASSERT_WAIT_FOR(file_has(u.log, "started again for vm3 (restart 1)"), WAIT_MS);
	ASSERT_WAIT_FOR(children_of(u.pid, kids, 8) == 2, WAIT_MS);
	w3b = worker_of(&u, 3);
	ASSERT_NE(w3b, w3);
	ASSERT_EQ(worker_of(&u, 4), w4);
	/* The new worker answers the control socket once its device is up. */
	snprintf(name3, sizeof(name3), "vm3 pid %d", (int)w3b);
	ASSERT_WAIT_FOR(stat_name_is(&u, 3, name3), WAIT_MS);
	transfer_ok(&u, 0, 5003);
	v = stat_json(u.sock[0]);
	ASSERT_STREQ(ops_json_str(stat_vm(v, 3), "name", ""), name3);
	ASSERT_STREQ(ops_json_str(stat_vm(v, 4), "name", ""), name);
	ASSERT_GE(ops_json_u64(ops_json_get(stat_vm(v, 4), "counters"), "tx_bytes", 0), 8 * MiB);
	ops_json_free(v);
	{
		/* `capture start` is refused in this mode, clearly. */
		char pcap[200];
		struct run r;

		snprintf(pcap, sizeof(pcap), "%s/never.pcap", u.dir);
		r = stat_run_version("isolate", (const char *[]){ "-s", u.sock[0], "--capture",
								   pcap, "--duration", "1", NULL });

		ASSERT_NE(r.rc, 0);
		ASSERT_TRUE(strstr(r.err, "cannot capture") != NULL);
		run_free(&r);
	}
	/* SIGTERM: both workers stop and remove their sockets, the daemon exits 0. */
	ASSERT_EQ(uvd_kill(&u), 0);
	ASSERT_TRUE(pid_gone(w4) && pid_gone(w3b));
	ASSERT_EQ(access(u.sock[0], F_OK), -1);
	ASSERT_EQ(access(u.sock[1], F_OK), -1);
	ASSERT_EQ(uvd_stop(&u), -1); /* already stopped: only the directory goes */
}

TEST(daemon_exits_when_every_worker_is_gone_and_workers_die_with_it)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvd u;
	pid_t w3, w4;
	int st = 0;

	uvd_start(&u, 2, cids, NULL, "--isolate");
	w3 = worker_of(&u, 3);
	w4 = worker_of(&u, 4);
	/* Sockets exist before a worker reports ready: killed earlier, it "failed to start". */
	ASSERT_WAIT_FOR(file_has(u.log, "worker processes for 2 VMs"), WAIT_MS);
	/* A worker stopped on its own (status 0) is not started again. */
	ASSERT_OK(kill(w3, SIGTERM));
	ASSERT_WAIT_FOR(file_has(u.log, "(vm3) stopped on its own"), WAIT_MS);
	wait_ctl(&u);
	{
		/* VM 3's socket is gone with its worker: ask the control socket itself. */
		char ctl[200];
		struct ops_jv *v;

		snprintf(ctl, sizeof(ctl), "%s.ctl", u.sock[0]);
		v = stat_json(ctl);

		ASSERT_STREQ(ops_json_str(stat_vm(v, 3), "name", ""), "vm3 worker gone");
		ASSERT_FALSE(ops_json_bool(stat_vm(v, 3), "vmm_connected", true));
		ops_json_free(v);
	}
	ASSERT_OK(kill(w4, SIGTERM));
	/* Nothing left to serve: the daemon exits with status 1 and says why. */
	ASSERT_WAIT_FOR(uvd_exited(&u, &st), WAIT_MS);
	ASSERT_TRUE(WIFEXITED(st));
	ASSERT_EQ(WEXITSTATUS(st), 1);
	ASSERT_TRUE(file_has(u.log, "every worker process is gone"));
	uvd_stop(&u);

	/* The daemon killed outright: its workers get SIGTERM (PR_SET_PDEATHSIG) and go too. */
	uvd_start(&u, 2, cids, NULL, "--isolate");
	w3 = worker_of(&u, 3);
	w4 = worker_of(&u, 4);
	ASSERT_OK(kill(u.pid, SIGKILL));
	ASSERT_WAIT_FOR(uvd_exited(&u, &st), WAIT_MS);
	ASSERT_WAIT_FOR(pid_gone(w3) && pid_gone(w4), WAIT_MS);
	/* They stopped cleanly: their socket files are gone. */
	ASSERT_WAIT_FOR(access(u.sock[0], F_OK) < 0 && access(u.sock[1], F_OK) < 0, WAIT_MS);
	uvd_stop(&u);
}

TEST(siblings_share_one_worker)
{
	static const uint32_t cids[] = { 5, 6 };
	struct uvsock_ctx *a, *b;
	struct uvd u;
	pid_t kids[8];
	int ls, fa, fb;

	uvd_start(&u, 2, cids, "shared", "--isolate");
	ASSERT_EQ(children_of(u.pid, kids, 8), 1);
	(void)worker_of(&u, 5);
	/* Sibling routing is in-process: it works inside the one worker. */
	b = g_guest_new(u.sock[1], NULL);
	ls = g_listen(b, SOCK_STREAM, 7000);
	a = g_guest_new(u.sock[0], NULL);
	ASSERT_GE(fa = g_connect(a, SOCK_STREAM, 6, 7000), 0);
	ASSERT_GE(fb = uvsock_accept(ls, NULL, NULL), 0);
	g_set_timeouts(fb, WAIT_MS);
	g_transfer(fa, fb, 1 * MiB, 65536, 7);
	uvsock_close(fa);
	uvsock_close(fb);
	uvsock_close(ls);
	uvsock_ctx_free(a);
	uvsock_ctx_free(b);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(a_path_in_use_stops_the_start_before_any_worker)
{
	static const char *const keys[] = { "", "" };
	struct uvd u;
	int lfd, st = 0;

	/* Something else serves VM 4's vhost-user socket: every path is probed before any worker
	 * forks (daemon/options.c), so none starts and VM 3's socket is never made. */
	iso_paths(&u, 2);
	lfd = hs_listen(u.sock[1], SOCK_STREAM);
	iso_spawn(&u, keys);
	ASSERT_WAIT_FOR(uvd_exited(&u, &st), 2 * WAIT_MS);
	ASSERT_TRUE(WIFEXITED(st));
	ASSERT_EQ(WEXITSTATUS(st), 1);
	ASSERT_TRUE(file_has(u.log, "is in use: another process serves it"));
	ASSERT_FALSE(file_has(u.log, "worker pid"));
	ASSERT_EQ(access(u.sock[0], F_OK), -1);
	ASSERT_EQ(access(u.sock[1], F_OK), 0);
	close(lfd);
	uvd_stop(&u);
}

/* ---- the memory finding: TX payloads in pages the guest never touched --------------------- */

#define SG_NRX 32
#define SG_RXBUF 4096
#define SG_NTX 32
#define SG_PKT 65536u
#define SG_MEM (256u * MiB)

/*
 * A guest driven by hand: vhost-user front-end, split rings, one STREAM connection to a host
 * listener, RW packets whose payload descriptors point into `sparse`, memory this process never
 * touches (the memfd stays a hole there until the back-end reads it).
 */
struct sparse_guest {
	struct vhu_front *f;
	struct vring_drv *rx, *tx;
	uint32_t cid;
	uint8_t *rxb, *hdr;
	uint64_t rxg, hdrg, sparse, sparse_len;
	bool busy[SG_NTX];
	uint32_t port, peer_buf_alloc, peer_fwd_cnt, tx_cnt;
};

static void sg_kick(struct sparse_guest *g, unsigned q)
{
	uint64_t one = 1;

	if (vring_drv_kick_prepare(q ? g->tx : g->rx))
		ASSERT_EQ(write(vhu_front_ring(g->f, q)->kick_fd, &one, 8), 8);
}

static void sg_post_rx(struct sparse_guest *g, unsigned i)
{
	struct vring_drv_buf b = { .addr = g->rxg + i * SG_RXBUF, .len = SG_RXBUF, .write = true };

	ASSERT_GE(vring_drv_add(g->rx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
}

/* Takes the RX packets there are (credit from the host side); waits up to ms for one. */
static void sg_poll_rx(struct sparse_guest *g, int ms)
{
	struct pollfd p = { .fd = vhu_front_ring(g->f, 0)->call_fd, .events = POLLIN };
	bool any = false;
	uint32_t len;
	void *cookie;
	uint64_t v;

	if (!vring_drv_more_used(g->rx) && !vring_drv_enable_cb(g->rx) && poll(&p, 1, ms) > 0)
		(void)!read(p.fd, &v, 8);
	while (vring_drv_get_used(g->rx, &len, &cookie) == 0) {
		unsigned i = (unsigned)(uintptr_t)cookie - 1;
		struct vsock_hdr h;

		ASSERT_GE(len, VSOCK_HDR_SIZE);
		vsock_hdr_decode(g->rxb + i * SG_RXBUF, &h);
		ASSERT_NE(h.op, VSOCK_OP_RST);
		if (h.dst_port == g->port) {
			g->peer_buf_alloc = h.buf_alloc;
			g->peer_fwd_cnt = h.fwd_cnt;
		}
		sg_post_rx(g, i);
		any = true;
	}
	if (any)
		sg_kick(g, 0);
}

/* Takes back the TX buffers the device returned; returns a free header slot or -1. */
static int sg_free_slot(struct sparse_guest *g)
{
	uint32_t ulen;
	void *cookie;

	while (vring_drv_get_used(g->tx, &ulen, &cookie) == 0)
		g->busy[(uintptr_t)cookie - 1] = false;
	for (int i = 0; i < SG_NTX; i++)
		if (!g->busy[i])
			return i;
	return -1;
}

/* Puts one packet on the TX ring: header in a slot of ours, payload (len bytes) at gpa. */
static void sg_send(struct sparse_guest *g, uint16_t op, uint64_t gpa, uint32_t len)
{
	struct vsock_hdr h = {
		.src_cid = g->cid, .dst_cid = 2, .src_port = g->port, .dst_port = g->port,
		.len = len, .type = VSOCK_TYPE_STREAM, .op = op, .buf_alloc = 256 * 1024,
	};
	struct vring_drv_buf b[2];
	int i = -1;

	ASSERT_WAIT_FOR((i = sg_free_slot(g)) >= 0, WAIT_MS);
	vsock_hdr_encode(&h, g->hdr + i * 64);
	b[0] = (struct vring_drv_buf){ .addr = g->hdrg + i * 64, .len = VSOCK_HDR_SIZE };
	b[1] = (struct vring_drv_buf){ .addr = gpa, .len = len };
	g->busy[i] = true;
	ASSERT_GE(vring_drv_add(g->tx, b, len ? 2 : 1, (void *)(uintptr_t)(i + 1)), 0);
	sg_kick(g, 1);
	if (op == VSOCK_OP_RW)
		g->tx_cnt += len;
}

/* Connects to the back-end at sock and to host port `port` (a listener on lfd). */
static int sg_open(struct sparse_guest *g, const char *sock, int lfd, uint32_t port)
{
	struct vhu_front_config cfg;
	const struct vhu_front_ring *r, *t;
	int hfd;

	memset(g, 0, sizeof(*g));
	vhu_front_config_init(&cfg);
	cfg.mem_size = SG_MEM;
	ASSERT_OK(vhu_front_connect(sock, &cfg, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	g->cid = (uint32_t)vhu_front_guest_cid(g->f);
	g->port = port;
	ASSERT_OK(vhu_front_alloc(g->f, SG_NRX * SG_RXBUF, 4096, (void **)&g->rxb, &g->rxg));
	ASSERT_OK(vhu_front_alloc(g->f, SG_NTX * 64, 64, (void **)&g->hdr, &g->hdrg));
	ASSERT_OK(vhu_front_start(g->f));
	/* The rest of guest memory, page aligned, is the sparse part. */
	g->sparse_len = SG_MEM - 4 * MiB;
	ASSERT_OK(vhu_front_alloc(g->f, g->sparse_len, 4096, NULL, &g->sparse));
	r = vhu_front_ring(g->f, 0);
	t = vhu_front_ring(g->f, 1);
	ASSERT_OK(vring_drv_new(r->num, r->desc, r->avail, r->used, vhu_front_features(g->f),
				&g->rx));
	ASSERT_OK(vring_drv_new(t->num, t->desc, t->avail, t->used, vhu_front_features(g->f),
				&g->tx));
	for (unsigned i = 0; i < SG_NRX; i++)
		sg_post_rx(g, i);
	sg_kick(g, 0);
	sg_send(g, VSOCK_OP_REQUEST, 0, 0);
	hfd = hs_accept(lfd, WAIT_MS);
	ASSERT_GE(hfd, 0);
	ASSERT_WAIT_FOR((sg_poll_rx(g, 10), g->peer_buf_alloc != 0), WAIT_MS);
	return hfd;
}

/*
 * Sends `bytes` of payload from the untouched part of guest memory in 64 KiB packets within
 * the host side's credit (asking for credit when it runs out).
 */
static void sg_send_sparse(struct sparse_guest *g, uint64_t bytes)
{
	ASSERT_LE(bytes, g->sparse_len);
	for (uint64_t off = 0; off < bytes; off += SG_PKT) {
		uint64_t t0 = test_now_ms();

		while (g->peer_buf_alloc - (g->tx_cnt - g->peer_fwd_cnt) < SG_PKT) {
			if (test_now_ms() - t0 > 10000)
				test_fail(__FILE__, __LINE__, "no host credit at %llu",
					  (unsigned long long)off);
			sg_poll_rx(g, 20);
			if (g->peer_buf_alloc - (g->tx_cnt - g->peer_fwd_cnt) < SG_PKT)
				sg_send(g, VSOCK_OP_CREDIT_REQUEST, 0, 0);
		}
		sg_send(g, VSOCK_OP_RW, g->sparse + off, SG_PKT);
		sg_poll_rx(g, 0);
	}
}

static void sg_close(struct sparse_guest *g)
{
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
}

/* The host end: reads and drops `total` bytes. */
struct drain {
	int fd;
	uint64_t total, got;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	static char buf[1 << 16];

	while (d->got < d->total && hs_wait_fd(d->fd, POLLIN, WAIT_MS) > 0) {
		ssize_t n = read(d->fd, buf, sizeof(buf));

		if (n <= 0)
			break;
		d->got += (uint64_t)n;
	}
	return NULL;
}

/*
 * The sparse guest makes VM 0 of u read `bytes` of pages it never touched, while *pids are
 * measured: ret_kib[i] gets the VmRSS growth of pids[i] in KiB.
 */
static void touch_sparse(const struct uvd *u, uint64_t bytes, const pid_t *pids, int n,
			 int64_t *ret_kib)
{
	struct sparse_guest g;
	struct drain d = { .total = bytes };
	uint64_t before[4];
	pthread_t th;
	int lfd = hs_listen_port(u->uds[0], 5100, SOCK_STREAM);

	ASSERT_LE(n, 4);
	d.fd = sg_open(&g, u->sock[0], lfd, 5100);
	for (int i = 0; i < n; i++)
		before[i] = rss_kib(pids[i]);
	ASSERT_EQ(pthread_create(&th, NULL, drain_main, &d), 0);
	sg_send_sparse(&g, bytes);
	pthread_join(th, NULL);
	ASSERT_EQ_U64(d.got, bytes);
	for (int i = 0; i < n; i++)
		ret_kib[i] = (int64_t)rss_kib(pids[i]) - (int64_t)before[i];
	close(d.fd);
	close(lfd);
	sg_close(&g);
}

#define TOUCH_BYTES (192ull * MiB)
/* The main process of an isolated daemon maps no guest memory. */
#define MAIN_RSS_MAX_KIB (32u * KiB_PER_MiB)

TEST(sparse_guest_memory_is_charged_to_the_worker_not_the_daemon)
{
	static const uint32_t cid3[] = { 3 };
	int64_t grow[2];
	struct uvd u;
	pid_t pids[2];

	/* Before: in one process, uvsockd itself faults the guest's pages in. */
	uvd_start(&u, 1, cid3, NULL, NULL);
	pids[0] = u.pid;
	touch_sparse(&u, TOUCH_BYTES, pids, 1, grow);
	test_note("without --isolate: uvsockd VmRSS grew by %lld KiB after reading %llu MiB of "
		  "untouched guest pages", (long long)grow[0],
		  (unsigned long long)(TOUCH_BYTES / MiB));
	/* The test only means something if uvsockd was really made to touch them. */
	ASSERT_GE(grow[0], (int64_t)(TOUCH_BYTES / 1024 / 2));
	ASSERT_EQ(uvd_stop(&u), 0);

	/* After: the worker pays, the daemon's main process does not. */
	uvd_start(&u, 1, cid3, NULL, "--isolate");
	pids[0] = u.pid;
	pids[1] = worker_of(&u, 3);
	touch_sparse(&u, TOUCH_BYTES, pids, 2, grow);
	test_note("with --isolate: main VmRSS grew by %lld KiB (now %llu KiB), worker VmRSS grew "
		  "by %lld KiB", (long long)grow[0], (unsigned long long)rss_kib(u.pid),
		  (long long)grow[1]);
	ASSERT_LT(rss_kib(u.pid), MAIN_RSS_MAX_KIB);
	ASSERT_GE(grow[1], (int64_t)(TOUCH_BYTES / 1024 / 2));
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* ---- cgroup=DIR --------------------------------------------------------------------------- */

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* A writable cgroup2 mount: /sys/fs/cgroup, or the hybrid layout's /sys/fs/cgroup/unified. */
static const char *cgroup2_root(void)
{
	static const char *const cands[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified" };

	for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		struct statfs sf;
		char procs[64];

		snprintf(procs, sizeof(procs), "%s/cgroup.procs", cands[i]);
		if (statfs(cands[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC &&
		    access(cands[i], W_OK) == 0 && access(procs, W_OK) == 0)
			return cands[i];
	}
	return NULL;
}

static uint64_t read_u64_file(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* Moves every process still in cg to root's cgroup.procs and kills it (our descendants only). */
static void cgroup_evict(const char *root, const char *cg)
{
	char path[300], to[300];
	int pid;
	FILE *f;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cg);
	snprintf(to, sizeof(to), "%s/cgroup.procs", root);
	f = fopen(path, "r");
	while (f && fscanf(f, "%d", &pid) == 1) {
		FILE *t = fopen(to, "w");

		if (t) {
			fprintf(t, "%d\n", pid);
			fclose(t);
		}
		kill(pid, SIGKILL);
	}
	if (f)
		fclose(f);
}

/* The body, in a process of its own so that the cgroup is removed whatever happens here. */
static void cgroup_case(const char *cg)
{
	char key[300], memcur[300], procs[300], line[400], want[200];
	const char *keys[] = { key };
	struct uvd u;
	int64_t grow[1];
	uint64_t m0, m1;
	pid_t w;
	FILE *f;

	snprintf(key, sizeof(key), ",cgroup=%s", cg);
	iso_paths(&u, 1);
	iso_spawn(&u, keys);
	uvd_wait_ready(&u, "start-up");
	w = worker_of(&u, 3);
	/* The worker is in the cgroup (and the main is not). */
	snprintf(procs, sizeof(procs), "/proc/%d/cgroup", (int)w);
	f = fopen(procs, "r");
	ASSERT_TRUE(f != NULL);
	line[0] = '\0';
	while (fgets(line, sizeof(line), f) && strncmp(line, "0::", 3) != 0)
		;
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	snprintf(want, sizeof(want), "/%s", strrchr(cg, '/') + 1);
	if (strlen(line) < strlen(want) || strcmp(line + strlen(line) - strlen(want), want) != 0)
		test_fail(__FILE__, __LINE__, "worker %d is in '%s', not in %s", (int)w, line, cg);
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
	ASSERT_EQ(read_u64_file(procs), w);
	test_note("worker %d is in %s", (int)w, line);

	snprintf(memcur, sizeof(memcur), "%s/memory.current", cg);
	if (access(memcur, R_OK) != 0) {
		test_note("SKIPPED PART: no memory controller in %s (memory.current missing): the "
			  "charge of guest memory to the cgroup is not checked here", cg);
		ASSERT_EQ(uvd_stop(&u), 0);
		return;
	}
	m0 = read_u64_file(memcur);
	touch_sparse(&u, 64 * MiB, &w, 1, grow);
	m1 = read_u64_file(memcur);
	test_note("memory.current of %s: %llu -> %llu KiB (worker VmRSS +%lld KiB)", cg,
		  (unsigned long long)(m0 / 1024), (unsigned long long)(m1 / 1024),
		  (long long)grow[0]);
	ASSERT_GE(m1, m0 + 32ull * MiB);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(cgroup_places_the_worker_and_its_memory)
{
	const char *root = cgroup2_root();
	char cg[200];
	pid_t pid;
	int st = 0;

	if (!root) {
		test_note("SKIP: no writable cgroup2 hierarchy at /sys/fs/cgroup or "
			  "/sys/fs/cgroup/unified: cgroup=DIR is not tested");
		test_skip("no writable cgroup2 hierarchy");
	}
	snprintf(cg, sizeof(cg), "%s/uvsock-it-%d", root, (int)getpid());
	ASSERT_OK(mkdir(cg, 0755));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		cgroup_case(cg);
		_exit(0);
	}
	if (!WAIT_FOR(waitpid(pid, &st, WNOHANG) == pid, 45000)) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	/* The daemon dies with the body's process, its worker with the daemon; then clean up. */
	{
		char procs[300];
		struct stat sb;

		snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
		if (!WAIT_FOR(read_u64_file(procs) == 0, WAIT_MS))
			cgroup_evict(root, cg);
		ASSERT_WAIT_FOR(rmdir(cg) == 0 || (stat(cg, &sb) < 0 && errno == ENOENT), WAIT_MS);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		test_fail(__FILE__, __LINE__, "the cgroup case failed (status %d)", st);
}

TEST_MAIN()
