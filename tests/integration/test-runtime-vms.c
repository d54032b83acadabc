/* SPDX-License-Identifier: MIT */
/*
 * Runtime VMs of a live uvsockd (suite 'integration'): uvsock-ctl (in-process, uvsock_ctl_main)
 * adds and removes a VM through the control socket, and SIGHUP re-reads --config, while a
 * guest-role VM of this process transfers to a host program through the same daemon. The
 * transfer is stopped half-way by its reader (the guest's sends wait for credit) for the whole
 * time the other VM comes and goes, then read to the end and checked byte by byte.
 *
 *   - add-vm joins the new VM to its group (a sibling connection to it works), with its name=
 *     and max-conns= (a second host program over max-conns=1 is refused); remove-vm by name
 *     takes its socket files away; the same CID added again is reachable again from its
 *     sibling; a max-conns= over the fd budget is refused;
 *   - SIGHUP: a VM gone from the file is removed, a new one added, a changed one restarted, an
 *     unchanged one (with an open connection) untouched; a file that does not parse changes
 *     nothing;
 *   - with --isolate, add-vm is refused with a message saying why.
 */
#include <sys/stat.h>

#include "ctlquery.h"
#include "guestside.h"
#include "ctlcli.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "test.h"
#include "uvsockd-proc.h"

#define XFER_TOTAL (8u << 20)
#define XFER_SEED 77

struct ctl_out {
	int rc;
	char out[512], err[512];
};

/* uvsock-ctl -s CTL VERB ARG, in-process. */
static struct ctl_out ctl_run(const char *ctl, const char *verb, const char *arg)
{
	char *argv[] = { "uvsock-ctl", "-s", (char *)ctl, (char *)verb, (char *)arg, NULL };
	struct ctl_out o = { 0 };
	FILE *out = fmemopen(o.out, sizeof(o.out) - 1, "w");
	FILE *err = fmemopen(o.err, sizeof(o.err) - 1, "w");

	ASSERT_TRUE(out && err);
	o.rc = uvsock_ctl_main(5, argv, "test", out, err);
	fclose(out);
	fclose(err);
	return o;
}

static void ctl_path(const struct uvd *u, char *buf, size_t len)
{
	snprintf(buf, len, "%s.ctl", u->sock[0]);
}

static void wait_ctl(const struct uvd *u)
{
	char ctl[200];
	int fd = -1;

	ctl_path(u, ctl, sizeof(ctl));
	if (!WAIT_FOR(ops_ctl_connect(ctl, &fd) >= 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

/* The running VMs' CIDs, in order, as "3,5"; names (if names) as "3=a,5=vm5". */
static void vm_list(const struct uvd *u, bool names, char *buf, size_t len)
{
	struct ops_jv *v = uvd_ctl_query(u, "stats");
	const struct ops_jv *vms = ops_json_get(v, "vms");
	size_t n = 0;

	buf[0] = '\0';
	for (const struct ops_jv *e = vms ? vms->child : NULL; e && n < len; e = e->next)
		n += (size_t)snprintf(buf + n, len - n, "%s%llu%s%s", n ? "," : "",
				      (unsigned long long)ops_json_u64(e, "cid", 0),
				      names ? "=" : "", names ? ops_json_str(e, "name", "?") : "");
	ops_json_free(v);
}

static bool vms_are(const struct uvd *u, const char *want)
{
	char got[256];

	vm_list(u, false, got, sizeof(got));
	return strcmp(got, want) == 0;
}

/* Reads n bytes of the pattern at *off from the host end of the transfer, checked. */
static void read_checked(int hfd, size_t *off, size_t n)
{
	uint8_t *buf = malloc(n);

	ASSERT_TRUE(buf != NULL);
	ASSERT_EQ(hs_read_full(hfd, buf, n, WAIT_MS), n);
	ASSERT_EQ(hs_check(buf, n, XFER_SEED, *off), n);
	*off += n;
	free(buf);
}

/* A guest-to-guest connection from ctx to cid:port, where lfd (of the peer) listens. */
static void sibling_round_trip(struct uvsock_ctx *from, uint32_t cid, int lfd)
{
	char buf[4];
	int a, b;

	a = g_connect(from, SOCK_STREAM, cid, 9000);
	ASSERT_GE(a, 0);
	b = uvsock_accept(lfd, NULL, NULL);
	ASSERT_GE(b, 0);
	g_set_timeouts(b, WAIT_MS);
	ASSERT_EQ(uvsock_send(a, "sib!", 4, 0), 4);
	ASSERT_EQ(uvsock_recv(b, buf, 4, MSG_WAITALL), 4);
	ASSERT_MEMEQ(buf, "sib!", 4);
	uvsock_close(a);
	uvsock_close(b);
}

/* A host program on uds is closed at once, before its CONNECT line is answered. */
static bool host_refused(const char *uds)
{
	struct sockaddr_un a = hs_addr(uds);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool closed;

	ASSERT_GE(fd, 0);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	(void)!send(fd, "CONNECT 9000\n", 13, MSG_NOSIGNAL);
	closed = hs_wait_eof(fd, WAIT_MS);
	close(fd);
	return closed;
}

/*
 * A VM B (CID 4, group g) appears: its guest listens on 9000 and A's guest reaches it. With
 * max_conns 1 (its spec says max-conns=1), a second host program is refused while one is in.
 */
static void b_serves(struct uvd *u, struct uvsock_ctx *ga, const char *spec, const char *sock,
		     unsigned max_conns)
{
	struct ctl_out o = ctl_run(u->sock[0], "add-vm", spec);
	char uds[160];
	struct uvsock_ctx *gb;
	int lb, h1, g1;

	if (o.rc != 0)
		test_fail(__FILE__, __LINE__, "add-vm %s: %d %s", spec, o.rc, o.err);
	ASSERT_TRUE(strstr(o.out, "added VM 4 (2 VMs now)") != NULL);
	gb = g_guest_new(sock, NULL);
	lb = g_listen(gb, SOCK_STREAM, 9000);
	sibling_round_trip(ga, 4, lb);
	if (max_conns == 1) {
		snprintf(uds, sizeof(uds), "%s/vm4.vsock", u->dir);
		g1 = g_accept_host(lb, uds, SOCK_STREAM, 9000, &h1);
		ASSERT_TRUE(host_refused(uds));
		ASSERT_EQ_U64(uvd_vm_counter(u, 4, "host_clients_refused"), 1);
		uvsock_close(g1);
		close(h1);
	}
	uvsock_close(lb);
	uvsock_ctx_free(gb);
}

/* VM A (CID 3, group g) with a guest sending XFER_TOTAL bytes to host port 5000, stalled. */
struct xfer {
	struct uvsock_ctx *ga;
	struct g_io io;
	pthread_t th;
	int lfd, hfd;
	size_t off;
};

static void xfer_start(struct uvd *u, struct xfer *x)
{
	memset(x, 0, sizeof(*x));
	x->ga = g_guest_new(u->sock[0], NULL);
	x->io = (struct g_io){ .total = XFER_TOTAL, .chunk = 65536, .seed = XFER_SEED };
	x->io.fd = g_connect_host(x->ga, u->uds[0], SOCK_STREAM, 5000, WAIT_MS, &x->lfd, &x->hfd);
	/* The reader stops for a while: the sender waits for credit meanwhile. */
	g_set_timeouts(x->io.fd, 120000);
	ASSERT_EQ(pthread_create(&x->th, NULL, g_send_main, &x->io), 0);
	read_checked(x->hfd, &x->off, 1u << 20);
}

/* The rest of the transfer arrives intact on the same connection. */
static void xfer_finish(struct xfer *x)
{
	read_checked(x->hfd, &x->off, XFER_TOTAL - x->off);
	pthread_join(x->th, NULL);
	uvsock_close(x->io.fd);
	close(x->hfd);
	close(x->lfd);
	uvsock_ctx_free(x->ga);
}

TEST(vm_added_and_removed_while_another_transfers)
{
	static const uint32_t cid3[] = { 3 };
	char spec[512], sock4[160], names[256];
	struct ctl_out o;
	struct xfer x;
	struct uvd u;

	uvd_start(&u, 1, cid3, "g", NULL);
	wait_ctl(&u);
	xfer_start(&u, &x);

	snprintf(sock4, sizeof(sock4), "%s/vm4.sock", u.dir);
	snprintf(spec, sizeof(spec),
		 "guest-cid=4,socket=%s,uds-path=%s/vm4.vsock,groups=g,name=vmb,max-conns=1",
		 sock4, u.dir);
	b_serves(&u, x.ga, spec, sock4, 1);
	vm_list(&u, true, names, sizeof(names));
	ASSERT_STREQ(names, "3=vm3,4=vmb");
	/* The same CID, path or name again is refused, and so is a budget that does not fit. */
	o = ctl_run(u.sock[0], "add-vm", spec);
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "guest-cid 4 is already served") != NULL);
	o = ctl_run(u.sock[0], "add-vm", "guest-cid=5,socket=/tmp/x5.sock,uds-path=/tmp/x5.vsock,"
		    "max-conns=65536");
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "does not fit the fd budget") != NULL);

	o = ctl_run(u.sock[0], "remove-vm", "vmb");
	ASSERT_EQ(o.rc, 0);
	ASSERT_TRUE(strstr(o.out, "removed VM 4 (1 VMs now)") != NULL);
	ASSERT_TRUE(vms_are(&u, "3"));
	ASSERT_NE(access(sock4, F_OK), 0);
	o = ctl_run(u.sock[0], "remove-vm", "vmb");
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "no VM with CID or name 'vmb'") != NULL);

	/* Back with the same CID (default name): its sibling reaches the new one. */
	snprintf(spec, sizeof(spec), "guest-cid=4,socket=%s,uds-path=%s/vm4.vsock,groups=g", sock4,
		 u.dir);
	b_serves(&u, x.ga, spec, sock4, 0);
	ASSERT_EQ(ctl_run(u.sock[0], "remove-vm", "4").rc, 0);

	xfer_finish(&x);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(uvd_stop(&u), 0);
}

/* Writes the config file: VM 3 and the VMs of `more` (YAML list items, already indented). */
static void write_config(const char *path, const struct uvd *u, const char *more)
{
	FILE *f = fopen(path, "w");

	ASSERT_TRUE(f != NULL);
	fprintf(f, "vms:\n  - guest_cid: 3\n    socket: %s\n    uds_path: %s\n    name: a\n%s",
		u->sock[0], u->uds[0], more);
	ASSERT_EQ(fclose(f), 0);
}

/* A VM of the config file in u's directory: CID cid, tx_buffer_size txbuf. */
static void vm_item(const struct uvd *u, uint32_t cid, unsigned txbuf, char *buf, size_t len)
{
	snprintf(buf, len,
		 "  - guest_cid: %u\n    socket: %s/vm%u.sock\n    uds_path: %s/vm%u.vsock\n"
		 "    tx_buffer_size: %u\n", cid, u->dir, cid, u->dir, cid, txbuf);
}

static unsigned log_count(const struct uvd *u, const char *what)
{
	char line[1024];
	unsigned n = 0;
	FILE *f = fopen(u->log, "r");

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return n;
}

TEST(sighup_applies_the_config_difference)
{
	char conf[160], item4[400], item5[400], both[800], sock4[160], sock5[160];
	char *argv[] = { (char *)uvd_binary(), "--config", conf, NULL };
	struct xfer x;
	struct uvd u;

	memset(&u, 0, sizeof(u));
	snprintf(u.dir, sizeof(u.dir), "/tmp/uvsock-rv-XXXXXX");
	ASSERT_TRUE(mkdtemp(u.dir) != NULL);
	snprintf(u.log, sizeof(u.log), "%s/uvsockd.log", u.dir);
	snprintf(u.sock[0], sizeof(u.sock[0]), "%s/vm3.sock", u.dir);
	snprintf(u.uds[0], sizeof(u.uds[0]), "%s/vm3.vsock", u.dir);
	snprintf(conf, sizeof(conf), "%s/uvsockd.yaml", u.dir);
	snprintf(sock4, sizeof(sock4), "%s/vm4.sock", u.dir);
	snprintf(sock5, sizeof(sock5), "%s/vm5.sock", u.dir);
	u.nvms = 1;
	vm_item(&u, 4, 65536, item4, sizeof(item4));
	write_config(conf, &u, item4);
	uvd_spawn(&u, argv, false);
	uvd_wait_ready(&u, "start-up");
	wait_ctl(&u);
	ASSERT_TRUE(WAIT_FOR(access(sock4, F_OK) == 0, WAIT_MS));
	xfer_start(&u, &x);

	/* 4 goes, 5 comes, 3 (with the transfer) stays. */
	vm_item(&u, 5, 65536, item5, sizeof(item5));
	write_config(conf, &u, item5);
	ASSERT_EQ(kill(u.pid, SIGHUP), 0);
	ASSERT_WAIT_FOR(vms_are(&u, "3,5"), WAIT_MS);
	ASSERT_NE(access(sock4, F_OK), 0);
	ASSERT_EQ(access(sock5, F_OK), 0);

	/* A file that does not parse changes nothing. */
	write_config(conf, &u, "  - bogus: 1\n");
	ASSERT_EQ(kill(u.pid, SIGHUP), 0);
	ASSERT_WAIT_FOR(log_count(&u, "unknown key 'bogus'") == 1, WAIT_MS);
	ASSERT_TRUE(vms_are(&u, "3,5"));

	/* 5 changes (restarted), 4 comes back. */
	vm_item(&u, 5, 131072, item5, sizeof(item5));
	snprintf(both, sizeof(both), "%s%s", item4, item5);
	write_config(conf, &u, both);
	ASSERT_EQ(kill(u.pid, SIGHUP), 0);
	ASSERT_WAIT_FOR(vms_are(&u, "3,4,5"), WAIT_MS);
	ASSERT_EQ(log_count(&u, "vm5: removed (guest-cid 5)"), 1);
	ASSERT_EQ(log_count(&u, "a: removed"), 0);

	xfer_finish(&x);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(isolate_refuses_runtime_vms)
{
	static const uint32_t cid3[] = { 3 };
	struct ctl_out o;
	struct uvd u;

	uvd_start(&u, 1, cid3, NULL, "--isolate");
	wait_ctl(&u);
	o = ctl_run(u.sock[0], "add-vm", "guest-cid=9,socket=/tmp/x9.sock,uds-path=/tmp/x9.vsock");
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "--isolate") != NULL);
	ASSERT_TRUE(vms_are(&u, "3"));
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
