/* SPDX-License-Identifier: MIT */
/*
 * uvsock-stat against a live uvsockd (suite 'integration'): the daemon runs as a child process
 * (tests/harness/uvsockd-proc.h: temp directory, bounded waits, stopped by PID), a guest is a
 * guest-role context in this process over real vhost-user and shared-memory rings, host programs
 * are plain Unix sockets. uvsock-stat runs in-process (uvsock_stat_main) against the daemon's
 * default control socket (<vhost-user socket>.ctl), reached through the vhost-user socket path.
 */
#include <sys/prctl.h>
#include <sys/wait.h>

#include "guestside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "statcli.h"
#include "statrun.h"
#include "test.h"
#include "uvsockd-proc.h"

static struct run stat_run(const char *const *args)
{
	return stat_run_version("live", args);
}

static struct ops_jv *stat_json(const char *sock)
{
	struct run r = stat_run((const char *[]){ "-s", sock, "--json", NULL });
	struct ops_jv *v;

	if (r.rc != 0)
		test_fail(__FILE__, __LINE__, "uvsock-stat failed (%d): %s", r.rc, r.err);
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), &v));
	free(r.out);
	free(r.err);
	return v;
}

static const struct ops_jv *vm0(const struct ops_jv *v)
{
	const struct ops_jv *vms = ops_json_get(ops_json_get(v, "stats"), "vms");

	ASSERT_TRUE(vms && vms->child);
	return vms->child;
}

/*
 * uvd_start() returns once the vhost-user socket files exist; the daemon creates its control
 * socket after them. Wait (bounded) until the control socket answers, so that uvsock-stat -s
 * finds <socket>.ctl (it never falls back to the vhost-user socket itself).
 */
static void uvd_start_ctl(struct uvd *u, const uint32_t *cid)
{
	char ctl[200];
	int fd = -1;

	uvd_start(u, 1, cid, NULL, NULL);
	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	if (!WAIT_FOR(ops_ctl_connect(ctl, &fd) >= 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

TEST(counters_and_listing_of_a_live_daemon)
{
	static const uint32_t cid3[] = { 3 };
	struct uvd u;
	struct uvsock_ctx *g;
	char lpath[200], buf[16];
	int lfd, hfd, gfd;
	struct ops_jv *v;

	uvd_start_ctl(&u, cid3);
	/* No VMM yet. */
	v = stat_json(u.sock[0]);
	ASSERT_EQ_U64(ops_json_u64(vm0(v), "cid", 0), 3);
	ASSERT_FALSE(ops_json_bool(vm0(v), "vmm_connected", true));
	ASSERT_EQ_U64(ops_json_u64(ops_json_get(v, "conns"), "count", 99), 0);
	ops_json_free(v);

	/* A guest connects to host port 5000 and sends "hello". */
	g = g_guest_new(u.sock[0], NULL);
	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	snprintf(lpath, sizeof(lpath), "%s_5000", u.uds[0]); /* the listener, as listed below */
	ASSERT_EQ(uvsock_send(gfd, "hello", 5, 0), 5);
	ASSERT_EQ(hs_read_full(hfd, buf, 5, WAIT_MS), 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	/* A refused one: nobody listens on 5001. */
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5001), -1);
	ASSERT_EQ(errno, ECONNRESET);

	v = stat_json(u.sock[0]);
	const struct ops_jv *c = ops_json_get(vm0(v), "counters");
	ASSERT_TRUE(ops_json_bool(vm0(v), "vmm_connected", false));
	ASSERT_TRUE(ops_json_get(vm0(v), "engine")->type == OPS_J_OBJ);
	ASSERT_GE(ops_json_u64(c, "tx_pkts", 0), 3);   /* 2 REQUESTs, RW */
	ASSERT_GE(ops_json_u64(c, "tx_bytes", 0), 5);
	ASSERT_GE(ops_json_u64(c, "rx_pkts", 0), 2);   /* RESPONSE, RST */
	ASSERT_EQ_U64(ops_json_u64(c, "conns_open", 0), 1);
	ASSERT_GE(ops_json_u64(c, "rst_sent", 0), 1);
	ASSERT_EQ_U64(ops_json_u64(c, "host_connects_refused", 0), 1);
	ASSERT_EQ_U64(ops_json_u64(ops_json_get(c, "dropped"), "spoofed_cid", 99), 0);
	const struct ops_jv *cs = ops_json_get(v, "conns");
	ASSERT_EQ_U64(ops_json_u64(cs, "count", 0), 1);
	const struct ops_jv *k = ops_json_get(cs, "conns")->child;
	ASSERT_STREQ(ops_json_str(k, "state", ""), "CONNECTED");
	ASSERT_STREQ(ops_json_str(k, "type", ""), "stream");
	ASSERT_EQ_U64(ops_json_u64(k, "local_cid", 0), 2);
	ASSERT_EQ_U64(ops_json_u64(k, "local_port", 0), 5000);
	ASSERT_EQ_U64(ops_json_u64(k, "peer_cid", 0), 3);
	ASSERT_STREQ(ops_json_str(k, "host", ""), lpath);
	ASSERT_EQ_U64(ops_json_u64(k, "bytes_in", 0), 5);
	ops_json_free(v);

	/* The text form. */
	struct run r = stat_run((const char *[]){ "-s", u.sock[0], NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "VM 3 (vm3)  vmm connected") != NULL);
	ASSERT_TRUE(strstr(r.out, " CONNECTED  2:5000 ") != NULL);
	free(r.out);
	free(r.err);

	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* What the daemon says of VM 3's VMM (dflt if it does not say). */
static bool vmm_connected(const char *sock, bool dflt)
{
	struct ops_jv *v = stat_json(sock);
	bool c = ops_json_bool(vm0(v), "vmm_connected", dflt);

	ops_json_free(v);
	return c;
}

/* Waits until the daemon says whether a VMM is connected to VM 3. */
static void wait_vmm(const char *sock, bool connected)
{
	if (!WAIT_FOR(vmm_connected(sock, !connected) == connected, WAIT_MS))
		test_fail(__FILE__, __LINE__, "vmm_connected did not become %d", connected);
}

struct ctr_snap {
	uint64_t conns_total, rst_sent, rst_received, refused, tx_pkts;
};

static struct ctr_snap ctr_snap(const char *sock)
{
	struct ops_jv *v = stat_json(sock);
	const struct ops_jv *c = ops_json_get(vm0(v), "counters");
	struct ctr_snap s = {
		.conns_total = ops_json_u64(c, "conns_total", 0),
		.rst_sent = ops_json_u64(c, "rst_sent", 0),
		.rst_received = ops_json_u64(c, "rst_received", 0),
		.refused = ops_json_u64(c, "host_connects_refused", 0),
		.tx_pkts = ops_json_u64(c, "tx_pkts", 0),
	};

	ops_json_free(v);
	return s;
}

/* One session: a connection to host port 5000 (then reset by the guest) and one refused. */
static void session(struct uvd *u, int lfd)
{
	struct uvsock_ctx *g = g_guest_new(u->sock[0], NULL);
	char buf[4];
	int gfd, hfd;

	gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
	g_set_timeouts(gfd, WAIT_MS);
	ASSERT_EQ(uvsock_send(gfd, "ping", 4, 0), 4);
	ASSERT_EQ(hs_read_full(hfd, buf, 4, WAIT_MS), 4);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5001), -1);
	ASSERT_EQ(errno, ECONNRESET);
	/* The VMM goes away with the connection open (as a VM shutting down). */
	uvsock_ctx_free(g);
	close(hfd);
	(void)gfd;
}

/*
 * Engine-derived counters (connections, RSTs, refusals) are summed over VMM sessions: each
 * session gets a new engine, and the counters keep growing instead of restarting at zero.
 */
TEST(counters_keep_growing_across_vmm_sessions)
{
	static const uint32_t cid3[] = { 3 };
	struct ctr_snap a, b, c;
	struct uvd u;
	int lfd;

	uvd_start_ctl(&u, cid3);
	lfd = hs_listen_port(u.uds[0], 5000, SOCK_STREAM);
	session(&u, lfd);
	wait_vmm(u.sock[0], false);
	a = ctr_snap(u.sock[0]);
	ASSERT_EQ_U64(a.conns_total, 2);  /* accepted + refused (both were engine sockets) */
	ASSERT_GE(a.rst_sent, 1);
	ASSERT_EQ_U64(a.refused, 1);

	session(&u, lfd);
	b = ctr_snap(u.sock[0]);  /* the VMM may still be connected: current + past sessions */
	ASSERT_GE(b.conns_total, 2 * a.conns_total);
	wait_vmm(u.sock[0], false);
	c = ctr_snap(u.sock[0]);
	ASSERT_EQ_U64(c.conns_total, 2 * a.conns_total);
	ASSERT_GE(c.rst_sent, 2 * a.rst_sent);
	ASSERT_EQ_U64(c.refused, 2);
	ASSERT_GT(c.tx_pkts, a.tx_pkts);
	close(lfd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Whether the daemon's capture runs, asked over the control connection cfd. */
static bool capture_running(int cfd)
{
	struct ops_jv *v;
	bool running;

	ASSERT_OK(ops_ctl_request(cfd, "capture status", -1, 5000, NULL, &v));
	running = ops_json_bool(ops_json_get(v, "capture"), "running", false);
	ops_json_free(v);
	return running;
}

/* Waits until the daemon's capture is running (started by the uvsock-stat child). */
static void wait_capture_running(const char *ctl)
{
	int cfd;

	ASSERT_OK(ops_ctl_connect(ctl, &cfd));
	if (!WAIT_FOR(capture_running(cfd), WAIT_MS))
		test_fail(__FILE__, __LINE__, "capture did not start within %d ms", WAIT_MS);
	close(cfd);
}

/* One decoded packet of the capture (tshark -T fields). */
struct cap_pkt {
	unsigned op, src_cid, src_port, dst_cid, dst_port;
	char payload[64];
};

/*
 * Decodes file with tshark. Returns the number of packets (at most max), or -1 if tshark is not
 * installed.
 */
static int tshark_decode(const char *file, struct cap_pkt *pkts, int max)
{
	char cmd[512], line[512];
	FILE *p;
	int n = 0;

	if (system("command -v tshark >/dev/null 2>&1") != 0)
		return -1;
	snprintf(cmd, sizeof(cmd),
		 "timeout 60 tshark -r '%s' -T fields -E separator=/s -E occurrence=f "
		 "-e vsock.virtio.op -e vsock.src_cid -e vsock.src_port -e vsock.dst_cid "
		 "-e vsock.dst_port -e vsock.payload 2>/dev/null", file);
	p = popen(cmd, "r");
	ASSERT_TRUE(p != NULL);
	while (fgets(line, sizeof(line), p)) {
		struct cap_pkt k = { 0 };

		if (sscanf(line, "%u %u %u %u %u %63s", &k.op, &k.src_cid, &k.src_port, &k.dst_cid,
			   &k.dst_port, k.payload) < 5)
			continue;
		if (n < max)
			pkts[n++] = k;
	}
	ASSERT_EQ(pclose(p), 0);
	return n;
}

static int count_pkts(const struct cap_pkt *pkts, int n, unsigned op, unsigned src_cid,
		      unsigned port, const char *payload)
{
	int c = 0;

	for (int i = 0; i < n; i++) {
		const struct cap_pkt *k = &pkts[i];
		unsigned p = src_cid == 2 ? k->src_port : k->dst_port;

		if (k->op == op && k->src_cid == src_cid && p == port &&
		    (!payload || strcmp(k->payload, payload) == 0))
			c++;
	}
	return c;
}

/*
 * `uvsock-stat --capture FILE` (a child process, ended with SIGINT as an operator's Ctrl-C)
 * while a guest talks to the host both ways and is refused once; the file decoded by tshark
 * holds each packet exactly once with the right ops, ports and payloads.
 */
TEST(capture_of_a_live_daemon_with_uvsock_stat)
{
	static const uint32_t cid3[] = { 3 };
	static struct cap_pkt pkts[256];
	struct uvd u;
	struct uvsock_ctx *g;
	char file[200], ctl[200], buf[8];
	int lfd, hfd, gfd, n, st;
	pid_t child;

	uvd_start_ctl(&u, cid3);
	g = g_guest_new(u.sock[0], NULL);
	snprintf(file, sizeof(file), "%s/live.pcap", u.dir);
	snprintf(ctl, sizeof(ctl), "%s.ctl", u.sock[0]);
	child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		char *argv[] = { "uvsock-stat", "-s", u.sock[0], "--capture", file, "--vm", "3",
				 NULL };

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(uvsock_stat_main(7, argv, "live", stdout, stderr));
	}
	wait_capture_running(ctl);

	gfd = g_connect_host(g, u.uds[0], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ASSERT_EQ(uvsock_send(gfd, "hello", 5, 0), 5);
	ASSERT_EQ(hs_read_full(hfd, buf, 5, WAIT_MS), 5);
	hs_write_all(hfd, "world", 5);
	ASSERT_EQ(uvsock_recv(gfd, buf, 5, MSG_WAITALL), 5);
	ASSERT_MEMEQ(buf, "world", 5);
	/* Refused: nobody listens on 5001 (an RST from the device). */
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5001), -1);
	ASSERT_EQ(errno, ECONNRESET);

	/* Ctrl-C: uvsock-stat stops the capture cleanly (the daemon flushes and closes the file)
	 * and exits 0. */
	ASSERT_OK(kill(child, SIGINT));
	{
		pid_t w = 0;

		WAIT_FOR((w = waitpid(child, &st, WNOHANG)) != 0, WAIT_MS);
		if (w != child) {
			kill(child, SIGKILL);
			waitpid(child, &st, 0);
			test_fail(__FILE__, __LINE__, "uvsock-stat did not stop on SIGINT");
		}
	}
	ASSERT_TRUE(WIFEXITED(st));
	ASSERT_EQ(WEXITSTATUS(st), 0);

	n = tshark_decode(file, pkts, 256);
	if (n < 0) {
		uvsock_close(gfd);
		close(hfd);
		close(lfd);
		uvsock_ctx_free(g);
		uvd_stop(&u);
		test_skip("tshark is not installed");
	}
	/* hello = 68656c6c6f, world = 776f726c64; ops: 1 REQUEST, 2 RESPONSE, 3 RST, 5 RW. */
	ASSERT_EQ(count_pkts(pkts, n, 1, 3, 5000, NULL), 1);
	ASSERT_EQ(count_pkts(pkts, n, 2, 2, 5000, NULL), 1);
	ASSERT_EQ(count_pkts(pkts, n, 5, 3, 5000, "68656c6c6f"), 1);
	ASSERT_EQ(count_pkts(pkts, n, 5, 2, 5000, "776f726c64"), 1);
	ASSERT_EQ(count_pkts(pkts, n, 1, 3, 5001, NULL), 1);
	ASSERT_EQ(count_pkts(pkts, n, 3, 2, 5001, NULL), 1);
	for (int i = 0; i < n; i++)
		ASSERT_TRUE((pkts[i].src_cid == 3 && pkts[i].dst_cid == 2) ||
			    (pkts[i].src_cid == 2 && pkts[i].dst_cid == 3));
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * uvsockd --capture FILE: every packet from start-up until the daemon exits (SIGTERM flushes and
 * closes the file); a file that exists already is refused at start-up.
 */
TEST(capture_from_start_up_with_the_daemon_option)
{
	static const uint32_t cid3[] = { 3 };
	static struct cap_pkt pkts[256];
	char file[128], arg[160], buf[8];
	struct uvsock_ctx *g;
	struct uvd u;
	int lfd, hfd, gfd, n;

	snprintf(file, sizeof(file), "/tmp/uvsock-live-cap-%d.pcap", (int)getpid());
	unlink(file);
	snprintf(arg, sizeof(arg), "--capture=%s", file);
	uvd_start(&u, 1, cid3, NULL, arg);
	g = g_guest_new(u.sock[0], NULL);
	lfd = hs_listen_port(u.uds[0], 5000, SOCK_STREAM);
	gfd = g_connect_accept(g, lfd, SOCK_STREAM, 5000, &hfd);
	ASSERT_EQ(uvsock_send(gfd, "early", 5, 0), 5);
	ASSERT_EQ(hs_read_full(hfd, buf, 5, WAIT_MS), 5);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);

	n = tshark_decode(file, pkts, 256);
	if (n < 0) {
		unlink(file);
		test_skip("tshark is not installed");
	}
	ASSERT_EQ(count_pkts(pkts, n, 1, 3, 5000, NULL), 1);
	ASSERT_EQ(count_pkts(pkts, n, 2, 2, 5000, NULL), 1);
	ASSERT_EQ(count_pkts(pkts, n, 5, 3, 5000, "6561726c79"), 1); /* "early" */

	/* The file exists now: a second daemon refuses to overwrite it. */
	{
		char cmd[512];

		snprintf(cmd, sizeof(cmd),
			 "'%s' --guest-cid 3 --socket /tmp/uvsock-live-cap-%d.sock --uds-path "
			 "/tmp/uvsock-live-cap-%d.vsock --control none --capture %s 2>&1 | "
			 "grep -q 'File exists'", uvd_binary(), (int)getpid(), (int)getpid(), file);
		ASSERT_EQ(system(cmd), 0);
	}
	unlink(file);
}

TEST_MAIN()
