/* SPDX-License-Identifier: MIT */
/*
 * Datagrams through a real uvsockd (suite 'integration'; docs/uvsockd.md "Datagrams"): two VMs
 * of one group (CIDs 3 and 4), each guest a front-end (src/vhost_user/frontend.h) whose rings
 * the test drives by hand (src/vring/vring_drv.h) and whose DGRAM packets it builds itself, so
 * the device side is tested without the guest role; host programs are plain AF_UNIX SOCK_DGRAM
 * sockets, and socat when Debian's socat is installed (the hand test of docs/uvsockd.md). Covers:
 * guest -> host and host -> guest with the "<port>\n" line, replies to bound and unbound host
 * senders, the counters through uvsock-stat (JSON and text), a guest that does not negotiate
 * DGRAM (a Linux guest: dropped and counted, streams unchanged), sibling datagrams with and
 * without DGRAM on the target, --no-dgram, --dgram-max, and datagrams in the --capture file.
 * Every wait is bounded; nothing is timed.
 */
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostile.h"
#include "test.h"
#include "util/time.h"
#include "uvsockd-proc.h"
#include "vhost_user/frontend.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define DG_WAIT_MS 5000
#define DG_RX_BUFS 32
#define DG_RX_LEN  (VSOCK_HDR_SIZE + 4096)
#define DG_TX_BUFS 16
#define DG_TX_LEN  (VSOCK_HDR_SIZE + 8192)
#define DG_UNBOUND_PORT 0x7fffffffu

/* One hand-driven guest: RX buffers kept posted, TX buffers used one packet at a time. */
struct dguest {
	struct vhu_front *f;
	struct vring_drv *rx, *tx;
	uint32_t cid;
	uint8_t *rxp[DG_RX_BUFS], *txp[DG_TX_BUFS];
	uint64_t rxa[DG_RX_BUFS], txa[DG_TX_BUFS];
	bool tx_out[DG_TX_BUFS];
};

static void dg_notify(struct dguest *g, unsigned q)
{
	struct vring_drv *r = q ? g->tx : g->rx;
	uint64_t v = 1;

	if (vring_drv_kick_prepare(r))
		(void)!write(vhu_front_ring(g->f, q)->kick_fd, &v, sizeof(v));
}

static void dg_post(struct dguest *g, unsigned i)
{
	struct vring_drv_buf b = { .addr = g->rxa[i], .len = DG_RX_LEN, .write = true };

	ASSERT_GE(vring_drv_add(g->rx, &b, 1, (void *)(uintptr_t)(i + 1)), 0);
}

/* Connects a guest to the VM's vhost-user socket, asking for DGRAM if dgram; rings started. */
static void dg_open(struct dguest *g, const char *sock, bool dgram)
{
	const struct vhu_front_ring *r0, *r1;
	struct vhu_front_config fc;

	memset(g, 0, sizeof(*g));
	vhu_front_config_init(&fc);
	fc.features |= dgram ? VHU_BIT(VHU_VSOCK_F_DGRAM) : 0;
	fc.timeout_ms = DG_WAIT_MS;
	fc.mem_size = 4u << 20;
	ASSERT_OK(vhu_front_connect(sock, &fc, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	g->cid = (uint32_t)vhu_front_guest_cid(g->f);
	for (unsigned i = 0; i < DG_RX_BUFS; i++)
		ASSERT_OK(vhu_front_alloc(g->f, DG_RX_LEN, 64, (void **)&g->rxp[i], &g->rxa[i]));
	for (unsigned i = 0; i < DG_TX_BUFS; i++)
		ASSERT_OK(vhu_front_alloc(g->f, DG_TX_LEN, 64, (void **)&g->txp[i], &g->txa[i]));
	ASSERT_OK(vhu_front_start(g->f));
	r0 = vhu_front_ring(g->f, 0);
	r1 = vhu_front_ring(g->f, 1);
	ASSERT_OK(vring_drv_new(r0->num, r0->desc, r0->avail, r0->used, vhu_front_features(g->f),
				&g->rx));
	ASSERT_OK(vring_drv_new(r1->num, r1->desc, r1->avail, r1->used, vhu_front_features(g->f),
				&g->tx));
	for (unsigned i = 0; i < DG_RX_BUFS; i++)
		dg_post(g, i);
	dg_notify(g, 0);
}

static bool dg_acked(const struct dguest *g)
{
	return vhu_front_features(g->f) & VHU_BIT(VHU_VSOCK_F_DGRAM);
}

static void dg_close(struct dguest *g)
{
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
	memset(g, 0, sizeof(*g));
}

/* A TX buffer the device gave back (or -1). */
static int dg_tx_slot(struct dguest *g)
{
	void *ck;
	uint32_t n;

	while (vring_drv_get_used(g->tx, &n, &ck) == 0)
		g->tx_out[(uintptr_t)ck - 1] = false;
	for (int i = 0; i < DG_TX_BUFS; i++)
		if (!g->tx_out[i])
			return i;
	return -1;
}

/* Puts one packet (header h, h->len payload bytes from data) on the TX ring and kicks. */
static void dg_put(struct dguest *g, const struct vsock_hdr *h, const void *data)
{
	struct vring_drv_buf b;
	int s;

	ASSERT_LE(h->len, DG_TX_LEN - VSOCK_HDR_SIZE);
	ASSERT_TRUE(WAIT_FOR((s = dg_tx_slot(g)) >= 0, DG_WAIT_MS));
	vsock_hdr_encode(h, g->txp[s]);
	if (h->len)
		memcpy(g->txp[s] + VSOCK_HDR_SIZE, data, h->len);
	b = (struct vring_drv_buf){ .addr = g->txa[s], .len = VSOCK_HDR_SIZE + h->len };
	g->tx_out[s] = true;
	ASSERT_GE(vring_drv_add(g->tx, &b, 1, (void *)(uintptr_t)(s + 1)), 0);
	dg_notify(g, 1);
}

static struct vsock_hdr dg_hdr(const struct dguest *g, uint32_t cid, uint32_t sport,
			       uint32_t dport, uint16_t type, uint16_t op, uint32_t len)
{
	struct vsock_hdr h = { .src_cid = g->cid, .dst_cid = cid, .src_port = sport,
			       .dst_port = dport, .type = type, .op = op, .len = len };

	if (type != VSOCK_TYPE_DGRAM)
		h.buf_alloc = 256 * 1024;
	return h;
}

/* The guest's datagram from sport to cid:dport, payload the string s. */
static void dg_sendto(struct dguest *g, uint32_t cid, uint32_t sport, uint32_t dport,
		      const char *s)
{
	struct vsock_hdr h = dg_hdr(g, cid, sport, dport, VSOCK_TYPE_DGRAM, VSOCK_OP_RW,
				    (uint32_t)strlen(s));

	dg_put(g, &h, s);
}

/*
 * The next packet for the guest within DG_WAIT_MS (payload into buf, at most cap); buffers
 * given back unused are posted again. Returns 0 or -ETIMEDOUT.
 */
static int dg_next(struct dguest *g, struct vsock_hdr *h, void *buf, size_t cap)
{
	uint64_t end = test_now_ms() + DG_WAIT_MS;
	int call = vhu_front_ring(g->f, 0)->call_fd;

	while (test_now_ms() < end) {
		struct pollfd p = { .fd = call, .events = POLLIN };
		uint32_t n;
		void *ck;
		uint64_t v;

		if (vring_drv_get_used(g->rx, &n, &ck) == 0) {
			unsigned i = (unsigned)(uintptr_t)ck - 1;
			bool got = n >= VSOCK_HDR_SIZE;

			if (got) {
				vsock_hdr_decode(g->rxp[i], h);
				ASSERT_EQ(n, VSOCK_HDR_SIZE + h->len);
				ASSERT_LE(h->len, cap);
				memcpy(buf, g->rxp[i] + VSOCK_HDR_SIZE, h->len);
			}
			dg_post(g, i);
			dg_notify(g, 0);
			if (got)
				return 0;
			continue;
		}
		if (vring_drv_enable_cb(g->rx))
			continue;
		if (poll(&p, 1, 200) > 0)
			(void)!read(call, &v, sizeof(v));
	}
	return -ETIMEDOUT;
}

/* Everything the guest sent so far was handled: a REQUEST to a host port nobody serves comes
 * back as an RST, after the packets before it (one TX ring, in order). */
static void dg_barrier(struct dguest *g, uint32_t sport)
{
	struct vsock_hdr h = dg_hdr(g, 2, sport, 4999, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	char buf[64];

	dg_put(g, &h, NULL);
	ASSERT_OK(dg_next(g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.type, VSOCK_TYPE_STREAM);
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.dst_port, sport);
}

/* A host datagram socket bound at path (NULL: unbound). */
static int host_dgram(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a;

	ASSERT_GE(fd, 0);
	if (path) {
		a = hs_addr(path);
		ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
	}
	return fd;
}

static void host_sendto(int fd, const char *to, const char *msg)
{
	struct sockaddr_un a = hs_addr(to);

	ASSERT_EQ(sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&a, sizeof(a)),
		  (ssize_t)strlen(msg));
}

/* One datagram on fd within DG_WAIT_MS, NUL-terminated; the sender's address into from. */
static ssize_t host_recvfrom(int fd, char *buf, size_t cap, struct sockaddr_un *from,
			     socklen_t *fromlen)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct sockaddr_un a = { 0 };
	socklen_t alen = sizeof(a);
	ssize_t n;

	ASSERT_EQ(poll(&p, 1, DG_WAIT_MS), 1);
	n = recvfrom(fd, buf, cap - 1, 0, (struct sockaddr *)&a, &alen);
	ASSERT_GE(n, 0);
	buf[n] = '\0';
	if (from) {
		*from = a;
		*fromlen = alen;
	}
	return n;
}

static void path_of(char *dst, size_t cap, const char *uds, const char *suffix)
{
	snprintf(dst, cap, "%s%s", uds, suffix);
}

TEST(guest_and_host_exchange_datagrams_through_uvsockd)
{
	static const uint32_t cids[] = { 3, 4 };
	char dgp[200], p5000[200], other[200], buf[256];
	struct sockaddr_un from;
	socklen_t fromlen;
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;
	int hfd, ofd, afd;
	uint32_t eph;
	struct run r;

	uvd_start(&u, 2, cids, "dg", NULL);
	hv_wait_ctl(u.sock[0]);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	path_of(other, sizeof(other), u.dir, "/someone.sock");
	hfd = host_dgram(p5000);
	ofd = host_dgram(other);
	afd = host_dgram(NULL);
	dg_open(&g, u.sock[0], true);
	ASSERT_TRUE(dg_acked(&g));

	dg_sendto(&g, 2, 1234, 5000, "ping");
	ASSERT_EQ(host_recvfrom(hfd, buf, sizeof(buf), &from, &fromlen), 9);
	ASSERT_STREQ(buf, "1234\nping");
	/* From uvsockd's socket connected to this one: an abstract name, and answers to it work
	 * as answers to <uds-path>.dgram do. */
	ASSERT_GT(fromlen, (socklen_t)sizeof(sa_family_t) + 1);
	ASSERT_EQ(from.sun_path[0], '\0');
	host_sendto(hfd, dgp, "1234\npong");
	ASSERT_EQ(sendto(hfd, "1234\nback", 9, 0, (struct sockaddr *)&from, fromlen), 9);
	/* Two sockets of uvsockd: either may be read first. */
	for (int i = 0, seen = 0; i < 2; i++) {
		ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
		ASSERT_TRUE(h.type == VSOCK_TYPE_DGRAM && h.op == VSOCK_OP_RW && h.len == 4);
		ASSERT_TRUE(h.src_cid == 2 && h.src_port == 5000 && h.dst_port == 1234);
		ASSERT_TRUE(!memcmp(buf, "pong", 4) || !memcmp(buf, "back", 4));
		seen |= buf[0] == 'p' ? 1 : 2;
		if (i == 1)
			ASSERT_EQ(seen, 3);
	}

	/* Bound elsewhere: an ephemeral port, and replies to it come back. */
	host_sendto(ofd, dgp, "1234\nwho");
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	eph = h.src_port;
	ASSERT_GE(eph, 1u << 30);
	ASSERT_LT(eph, DG_UNBOUND_PORT);
	dg_sendto(&g, 2, 1234, eph, "you");
	host_recvfrom(ofd, buf, sizeof(buf), NULL, NULL);
	ASSERT_STREQ(buf, "1234\nyou");
	/* Unbound: replies dropped and counted; a malformed line dropped and counted. */
	host_sendto(afd, dgp, "1234\nanon");
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.src_port, DG_UNBOUND_PORT);
	dg_sendto(&g, 2, 1234, DG_UNBOUND_PORT, "void");
	host_sendto(afd, dgp, "port 1234\nx");
	dg_barrier(&g, 40000);
	ASSERT_TRUE(WAIT_FOR(hv_stat(u.sock[0], 3, "dgram_drop_malformed") == 1, DG_WAIT_MS));
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_tx"), 2);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_tx_bytes"), 4 + 3);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_rx"), 4);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_rx_bytes"), 4 + 4 + 3 + 4);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_drop_no_listener"), 1);
	/* The text output has the datagram lines for this VM. */
	r = stat_run_version("dgram", (const char *[]){ "-s", u.sock[0], "--vm", "3", "--counters",
							NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "datagrams   from guest 2, 7 bytes    to guest 4, 15 bytes") !=
		    NULL);
	ASSERT_TRUE(strstr(r.out, "dgram drops no_listener 1 full 0 oversize 0 not_negotiated 0 "
				  "malformed 1") != NULL);
	run_free(&r);

	dg_close(&g);
	close(afd);
	close(ofd);
	close(hfd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * A sender of another user binds the string <uds-path>_5.dgram in a mount namespace of its own
 * (a tmpfs over the directory), while the real <uds-path>_5.dgram, which uvsockd sees, belongs
 * to root. Its datagram must not come from host port 5: it gets an ephemeral port. Child
 * process: 0 sent, else the step that failed.
 */
static int spoof_main(const char *dgp, const char *dir, const char *p5)
{
	struct sockaddr_un to = hs_addr(dgp), me = hs_addr(p5);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0)
		return 10;
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("tmpfs", dir, "tmpfs", 0, "mode=1777") < 0)
		return 11;
	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 12;
	if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0)
		return 13;
	if (send(fd, "1234\nspoof", 10, 0) != 10)
		return 14;
	return 0;
}

TEST(a_host_port_path_bound_elsewhere_is_not_believed)
{
	static const uint32_t cids[] = { 3 };
	char dgp[200], p5[200], buf[64];
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;
	pid_t pid;
	int hfd, st = 0;

	if (geteuid() != 0)
		test_skip("a mount namespace and another user need root");
	uvd_start(&u, 1, cids, NULL, NULL);
	hv_wait_ctl(u.sock[0]);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(p5, sizeof(p5), u.uds[0], "_5.dgram");
	hfd = host_dgram(p5);
	dg_open(&g, u.sock[0], true);
	ASSERT_TRUE(dg_acked(&g));
	/* The owner of <uds-path>_5.dgram is host port 5. */
	host_sendto(hfd, dgp, "1234\nreal");
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.src_port, 5);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		_exit(spoof_main(dgp, u.dir, p5));
	}
	ASSERT_WAIT_FOR(waitpid(pid, &st, WNOHANG) == pid, DG_WAIT_MS);
	ASSERT_TRUE(WIFEXITED(st));
	if (WEXITSTATUS(st) == 11)
		test_skip("no private mount namespace here");
	ASSERT_EQ(WEXITSTATUS(st), 0);
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_TRUE(h.len == 5 && !memcmp(buf, "spoof", 5));
	test_note("the spoofer's datagram came from host port %u", h.src_port);
	ASSERT_NE(h.src_port, 5);
	ASSERT_GE(h.src_port, 1u << 30);
	dg_close(&g);
	close(hfd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* The guest sends "<n>" to host port 5000 until the host socket fd has it (within DG_WAIT_MS). */
static bool dg_reaches(struct dguest *g, int fd, unsigned n)
{
	char msg[16], want[32], buf[64];
	uint64_t end = mono_ms() + DG_WAIT_MS;

	snprintf(msg, sizeof(msg), "%u", n);
	snprintf(want, sizeof(want), "1234\n%u", n);
	while (mono_ms() < end) {
		ssize_t r;

		dg_sendto(g, 2, 1234, 5000, msg);
		test_sleep_ms(5);
		while ((r = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) >= 0) {
			buf[r] = '\0';
			if (!strcmp(buf, want))
				return true;
		}
	}
	return false;
}

TEST(a_host_socket_bound_anew_gets_the_next_datagrams)
{
	static const uint32_t cids[] = { 3 };
	char p5000[200], tmp[200], other[200], buf[64];
	struct dguest g;
	struct uvd u;
	int hfd, nfd, ofd;

	uvd_start(&u, 1, cids, NULL, NULL);
	hv_wait_ctl(u.sock[0]);
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	path_of(tmp, sizeof(tmp), u.uds[0], "_5000.dgram.new");
	path_of(other, sizeof(other), u.dir, "/other.dgram");
	hfd = host_dgram(p5000);
	dg_open(&g, u.sock[0], true);
	dg_sendto(&g, 2, 1234, 5000, "one");
	host_recvfrom(hfd, buf, sizeof(buf), NULL, NULL);
	ASSERT_STREQ(buf, "1234\none");
	/* The program restarts: its old socket is closed, the next datagram finds the new one. */
	close(hfd);
	unlink(p5000);
	hfd = host_dgram(p5000);
	dg_sendto(&g, 2, 1234, 5000, "two");
	host_recvfrom(hfd, buf, sizeof(buf), NULL, NULL);
	ASSERT_STREQ(buf, "1234\ntwo");
	/* Another socket renamed over the path while the old one lives: found when looked at
	 * again. */
	nfd = host_dgram(tmp);
	ASSERT_OK(rename(tmp, p5000));
	ASSERT_TRUE(dg_reaches(&g, nfd, 3));
	/* A symlink planted there is never followed: nothing reaches its target. */
	ofd = host_dgram(other);
	unlink(p5000);
	ASSERT_OK(symlink(other, p5000));
	close(nfd);
	dg_sendto(&g, 2, 1234, 5000, "four");
	dg_barrier(&g, 40005);
	ASSERT_EQ(recv(ofd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_drop_no_listener"), 1);
	dg_close(&g);
	close(ofd);
	close(hfd);
	unlink(p5000);
	unlink(other);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* A host receiver connected back to uvsockd's socket is not cut at net.unix.max_dgram_qlen. */
TEST(a_host_receiver_connected_back_takes_a_burst)
{
	static const uint32_t cids[] = { 3 };
	char p5000[200], buf[64], want[32];
	struct sockaddr_un from;
	socklen_t fromlen;
	struct dguest g;
	struct uvd u;
	int hfd;

	uvd_start(&u, 1, cids, NULL, NULL);
	hv_wait_ctl(u.sock[0]);
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	hfd = host_dgram(p5000);
	dg_open(&g, u.sock[0], true);
	dg_sendto(&g, 2, 1234, 5000, "hi");
	host_recvfrom(hfd, buf, sizeof(buf), &from, &fromlen);
	ASSERT_OK(connect(hfd, (struct sockaddr *)&from, fromlen));
	/* 40 datagrams, none read until uvsockd handled them all (its default qlen is 10). */
	for (unsigned i = 0; i < 40; i++) {
		snprintf(want, sizeof(want), "%u", i);
		dg_sendto(&g, 2, 1234, 5000, want);
	}
	dg_barrier(&g, 40006);
	for (unsigned i = 0; i < 40; i++) {
		snprintf(want, sizeof(want), "1234\n%u", i);
		host_recvfrom(hfd, buf, sizeof(buf), NULL, NULL);
		ASSERT_STREQ(buf, want);
	}
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_drop_full"), 0);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_tx"), 41);
	dg_close(&g);
	close(hfd);
	unlink(p5000);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(a_guest_without_dgram_loses_datagrams_and_keeps_streams)
{
	static const uint32_t cids[] = { 3, 4 };
	char dgp[200], p5000[200], buf[64];
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;
	int hfd;

	uvd_start(&u, 2, cids, "dg", NULL);
	hv_wait_ctl(u.sock[0]);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	hfd = host_dgram(p5000);
	dg_open(&g, u.sock[0], false); /* as Linux: bit 3 never acked */
	ASSERT_FALSE(dg_acked(&g));
	dg_sendto(&g, 2, 1234, 5000, "lost");
	host_sendto(hfd, dgp, "1234\nlost too");
	/* The first thing the guest gets is the barrier's RST: no answer to the datagram. */
	dg_barrier(&g, 40001);
	ASSERT_TRUE(WAIT_FOR(hv_stat(u.sock[0], 3, "dgram_drop_not_negotiated") == 2,
			     DG_WAIT_MS));
	ASSERT_EQ(recv(hfd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	ASSERT_EQ(hv_stat(u.sock[0], 3, "broken"), 0);
	h = dg_hdr(&g, 2, 40002, 4999, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	dg_put(&g, &h, NULL);
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	dg_close(&g);
	close(hfd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(sibling_datagrams_need_dgram_on_the_target)
{
	static const uint32_t cids[] = { 3, 4 };
	struct dguest a, b;
	struct vsock_hdr h;
	char buf[64];
	struct uvd u;

	uvd_start(&u, 2, cids, "dg", NULL);
	hv_wait_ctl(u.sock[0]);
	dg_open(&a, u.sock[0], true);
	dg_open(&b, u.sock[1], true);
	dg_sendto(&a, 4, 700, 800, "over");
	ASSERT_OK(dg_next(&b, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(h.src_cid, 3);
	ASSERT_EQ(h.dst_cid, 4);
	ASSERT_EQ(h.src_port, 700);
	ASSERT_EQ(h.dst_port, 800);
	ASSERT_MEMEQ(buf, "over", 4);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 4, "dgram_rx"), 1);
	/* VM 4's next guest does not negotiate DGRAM: dropped and counted at VM 3. */
	dg_close(&b);
	dg_open(&b, u.sock[1], false);
	dg_barrier(&b, 40003); /* its rings run */
	dg_sendto(&a, 4, 700, 800, "lost");
	dg_barrier(&a, 40004);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_drop_not_negotiated"), 1);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_tx"), 1);
	dg_close(&a);
	dg_close(&b);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(no_dgram_offers_nothing_and_binds_nothing)
{
	static const uint32_t cids[] = { 3 };
	char dgp[200];
	struct dguest g;
	struct stat st;
	struct uvd u;

	uvd_start(&u, 1, cids, NULL, "--no-dgram");
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	ASSERT_EQ(stat(dgp, &st), -1);
	dg_open(&g, u.sock[0], true);
	ASSERT_FALSE(dg_acked(&g));
	dg_close(&g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(dgram_max_lowers_the_limit_both_ways)
{
	static const uint32_t cids[] = { 3 };
	char dgp[200], p5000[200], buf[64];
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;
	int hfd;

	uvd_start(&u, 1, cids, NULL, "--dgram-max=8");
	hv_wait_ctl(u.sock[0]);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	hfd = host_dgram(p5000);
	dg_open(&g, u.sock[0], true);
	dg_sendto(&g, 2, 1234, 5000, "123456789");
	dg_sendto(&g, 2, 1234, 5000, "12345678");
	ASSERT_EQ(host_recvfrom(hfd, buf, sizeof(buf), NULL, NULL), 13);
	ASSERT_STREQ(buf, "1234\n12345678");
	host_sendto(hfd, dgp, "1234\n123456789");
	host_sendto(hfd, dgp, "1234\n12345678");
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.len, 8);
	ASSERT_EQ_U64(hv_stat(u.sock[0], 3, "dgram_drop_oversize"), 2);
	dg_close(&g);
	close(hfd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Counts the records of the pcap file at path whose virtio-vsock header has type 3 and op RW. */
static unsigned pcap_dgram_records(const char *path)
{
	/* pcap: 24-byte file header; per record 16 bytes, then the 32-byte vsockmon header and the
	 * 44-byte virtio-vsock header (type at offset 28, op at 30, little endian). */
	static uint8_t file[1 << 20];
	unsigned found = 0;
	size_t n, off = 24;
	FILE *f = fopen(path, "rb");

	ASSERT_TRUE(f != NULL);
	n = fread(file, 1, sizeof(file), f);
	fclose(f);
	while (off + 16 <= n) {
		uint32_t incl = (uint32_t)file[off + 8] | (uint32_t)file[off + 9] << 8 |
				(uint32_t)file[off + 10] << 16 | (uint32_t)file[off + 11] << 24;
		const uint8_t *v = file + off + 16 + 32;

		if (incl >= 32 + VSOCK_HDR_SIZE && off + 16 + incl <= n && v[28] == 3 &&
		    v[29] == 0 && v[30] == VSOCK_OP_RW && v[31] == 0)
			found++;
		off += 16 + incl;
	}
	return found;
}

TEST(datagrams_are_in_the_capture)
{
	static const uint32_t cids[] = { 3 };
	char cap[100], arg[120], dgp[200], p5000[200], buf[64];
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;
	int hfd;

	snprintf(cap, sizeof(cap), "/tmp/uvsock-dgcap-%d.pcap", (int)getpid());
	unlink(cap);
	snprintf(arg, sizeof(arg), "--capture=%s", cap);
	uvd_start(&u, 1, cids, NULL, arg);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(p5000, sizeof(p5000), u.uds[0], "_5000.dgram");
	hfd = host_dgram(p5000);
	dg_open(&g, u.sock[0], true);
	dg_sendto(&g, 2, 1234, 5000, "out");
	host_recvfrom(hfd, buf, sizeof(buf), NULL, NULL);
	host_sendto(hfd, dgp, "1234\nin");
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	dg_close(&g);
	close(hfd);
	ASSERT_EQ(uvd_kill(&u), 0); /* the capture is complete once the daemon exited */
	ASSERT_EQ(pcap_dgram_records(cap), 2);
	unlink(cap);
	(void)uvd_stop(&u);
}

/* socat (if installed) as the host program of docs/uvsockd.md's hand test. */
static int run_sh(const char *cmd)
{
	int st = system(cmd);

	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(socat_sends_a_datagram_to_the_guest)
{
	static const uint32_t cids[] = { 3 };
	char cmd[800], bind[200], dgp[200], buf[64];
	struct vsock_hdr h;
	struct dguest g;
	struct uvd u;

	if (run_sh("command -v socat >/dev/null 2>&1") != 0) {
		test_skip("socat not installed");
	}
	uvd_start(&u, 1, cids, NULL, NULL);
	path_of(dgp, sizeof(dgp), u.uds[0], ".dgram");
	path_of(bind, sizeof(bind), u.uds[0], "_5000.dgram");
	dg_open(&g, u.sock[0], true);
	/* unlink-close=0: socat would remove its socket file as it exits, maybe before uvsockd
	 * reads the datagram, and a port is believed only while its file is there. */
	snprintf(cmd, sizeof(cmd),
		 "printf '1234\\nhello' | socat -u - UNIX-SENDTO:%s,bind=%s,unlink-close=0", dgp,
		 bind);
	ASSERT_EQ(run_sh(cmd), 0);
	ASSERT_OK(dg_next(&g, &h, buf, sizeof(buf)));
	ASSERT_EQ(h.src_port, 5000);
	ASSERT_EQ(h.dst_port, 1234);
	ASSERT_EQ(h.len, 5);
	ASSERT_MEMEQ(buf, "hello", 5);
	dg_close(&g);
	unlink(bind);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
