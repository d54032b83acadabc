/* SPDX-License-Identifier: MIT */
/*
 * Control socket: the protocol (version, stats, conns, capture, errors, versioned requests,
 * pipelining) against a fake daemon, and its bounds (request size, clients, idle clients,
 * answer size), socket-file handling and capture life cycle (path, passed fd, busy, owner gone,
 * duration).
 */
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "fakectl.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "util/time.h"

static int conn(struct fake_daemon *f)
{
	int fd;

	ASSERT_OK(ops_ctl_connect(f->path, &fd));
	return fd;
}

/* One request; asserts the answer parses and has proto 1; returns it. */
static struct ops_jv *req(int fd, const char *line)
{
	struct ops_jv *v = NULL;

	ASSERT_OK(ops_ctl_request(fd, line, -1, 5000, NULL, &v));
	ASSERT_EQ_U64(ops_json_u64(v, "proto", 0), 1);
	return v;
}

static void expect_error(int fd, const char *line, const char *errno_name, const char *msg)
{
	struct ops_jv *v = req(fd, line);

	ASSERT_FALSE(ops_json_bool(v, "ok", true));
	ASSERT_STREQ(ops_json_str(v, "errno", ""), errno_name);
	if (msg && !strstr(ops_json_str(v, "error", ""), msg))
		test_fail(__FILE__, __LINE__, "error '%s' lacks '%s'", ops_json_str(v, "error", ""),
			  msg);
	ops_json_free(v);
}

/* Waits (bounded) until the peer closes fd; returns true if it did within ms. */
static bool closed_within(int fd, int ms)
{
	uint64_t end = mono_ms() + (uint64_t)ms;
	char b[4096];

	while (mono_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, (int)(end - mono_ms())) <= 0)
			continue;
		ssize_t n = recv(fd, b, sizeof(b), 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

TEST(version)
{
	struct fake_daemon f;
	int fd;

	fake_start(&f, 2, NULL);
	fd = conn(&f);
	struct ops_jv *v = req(fd, "version");
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	ASSERT_STREQ(ops_json_str(v, "server", ""), "fake 1.0");
	ASSERT_EQ_U64(ops_json_u64(v, "vms", 0), 2);
	ops_json_free(v);
	/* Versioned form. */
	v = req(fd, "v1 version");
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	ops_json_free(v);
	expect_error(fd, "v2 version", "EPROTONOSUPPORT", "this server speaks v1");
	expect_error(fd, "vx version", "EINVAL", "unknown request");
	close(fd);
	fake_stop(&f);
}

TEST(stats_all_and_one)
{
	struct fake_daemon f;
	int fd;

	fake_start(&f, 2, NULL);
	fd = conn(&f);
	struct ops_jv *v = req(fd, "stats");
	const struct ops_jv *vms = ops_json_get(v, "vms");
	ASSERT_TRUE(vms && vms->type == OPS_J_ARR);
	const struct ops_jv *a = vms->child, *b = a ? a->next : NULL;
	ASSERT_TRUE(a && b && !b->next);
	ASSERT_EQ_U64(ops_json_u64(a, "cid", 0), 3);
	ASSERT_STREQ(ops_json_str(a, "name", ""), "vm3");
	ASSERT_TRUE(ops_json_bool(a, "vmm_connected", false));
	ASSERT_FALSE(ops_json_bool(b, "vmm_connected", true));
	const struct ops_jv *c = ops_json_get(a, "counters");
#define CHECK_(f, name, help) ASSERT_TRUE(ops_json_u64(c, name, 0) > 1000);
	OPS_VM_COUNTERS(CHECK_)
#undef CHECK_
	ASSERT_EQ_U64(ops_json_u64(c, "tx_pkts", 0), 1001);
	ASSERT_EQ_U64(ops_json_u64(c, "host_connects_refused", 0), 1011);
	const struct ops_jv *d = ops_json_get(c, "dropped");
	ASSERT_EQ_U64(ops_json_u64(d, "spoofed_cid", 0), 1020);
	ASSERT_EQ_U64(ops_json_u64(d, "malformed", 0), 1025);
	const struct ops_jv *e = ops_json_get(a, "engine");
	ASSERT_EQ_U64(ops_json_u64(e, "rst_sent", 0), 42);
	ASSERT_EQ_U64(ops_json_u64(ops_json_get(e, "rx_dropped"), "bad-op", 0), 43);
	ASSERT_EQ(ops_json_get(b, "engine")->type, OPS_J_NULL);
	/* Totals are the sums. */
	const struct ops_jv *t = ops_json_get(v, "totals");
	ASSERT_EQ_U64(ops_json_u64(t, "tx_pkts", 0), 1001 + 2001);
	ASSERT_EQ_U64(ops_json_u64(ops_json_get(t, "dropped"), "no_route", 0), 1024 + 2024);
	ops_json_free(v);

	v = req(fd, "stats vm=4");
	vms = ops_json_get(v, "vms");
	ASSERT_TRUE(vms->child && !vms->child->next);
	ASSERT_EQ_U64(ops_json_u64(vms->child, "cid", 0), 4);
	ops_json_free(v);
	expect_error(fd, "stats vm=9", "ENOENT", "no VM with CID 9");
	expect_error(fd, "stats vm=x", "EINVAL", "usage: stats [vm=CID]");
	expect_error(fd, "stats vm=3 vm=4", "EINVAL", "usage");
	close(fd);
	fake_stop(&f);
}

TEST(conns_listing)
{
	struct fake_daemon f;
	int fd;

	fake_start(&f, 2, NULL);
	fd = conn(&f);
	struct ops_jv *v = req(fd, "conns");
	const struct ops_jv *l = ops_json_get(v, "conns");
	unsigned n = 0;

	ASSERT_EQ_U64(ops_json_u64(v, "count", 0), 4);
	ASSERT_FALSE(ops_json_bool(v, "truncated", true));
	for (const struct ops_jv *c = l->child; c; c = c->next, n++) {
		ASSERT_STREQ(ops_json_str(c, "state", ""), "CONNECTED");
		ASSERT_EQ_U64(ops_json_u64(c, "local_cid", 0), 2);
		ASSERT_EQ_U64(ops_json_u64(c, "in_flight", 0), 1000);
		ASSERT_EQ_U64(ops_json_u64(c, "peer_credit", 0), 65536 - 1000);
		ASSERT_EQ_U64(ops_json_u64(c, "bytes_in", 0), 123456);
		ASSERT_EQ_U64(ops_json_u64(c, "bytes_out", 0), 654321);
		ASSERT_EQ_U64(ops_json_u64(c, "rx_queued", 0), 7);
		ASSERT_EQ_U64(ops_json_u64(c, "tx_queued", 0), 11);
	}
	ASSERT_EQ(n, 4);
	const struct ops_jv *c1 = l->child->next;
	ASSERT_STREQ(ops_json_str(c1, "type", ""), "seqpacket");
	ASSERT_EQ_U64(ops_json_u64(c1, "local_port", 0), 5001);
	ASSERT_EQ_U64(ops_json_u64(c1, "peer_port", 0), 1235);
	ASSERT_STREQ(ops_json_str(c1, "host", ""), "/tmp/u3_5001");
	ops_json_free(v);
	v = req(fd, "conns vm=4");
	ASSERT_EQ_U64(ops_json_u64(v, "count", 0), 2);
	ops_json_free(v);
	close(fd);
	fake_stop(&f);
}

/* A listing larger than the answer cap ends cleanly with truncated:true. */
TEST(conns_truncated_at_answer_cap)
{
	struct fake_daemon f;
	struct ops_ctl_config cfg = { .max_response = 64 * 1024 };
	char *raw = NULL;
	struct ops_jv *v;
	int fd;

	fake_start(&f, 2, &cfg);
	f.conns_per_vm = 100000;
	fd = conn(&f);
	ASSERT_OK(ops_ctl_request(fd, "conns", -1, 5000, &raw, &v));
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	ASSERT_TRUE(ops_json_bool(v, "truncated", false));
	ASSERT_GT(ops_json_u64(v, "count", 0), 50);
	ASSERT_LE(strlen(raw) + 1, 64 * 1024);
	free(raw);
	ops_json_free(v);
	close(fd);
	fake_stop(&f);
}

TEST(bad_requests)
{
	struct fake_daemon f;
	int fd;

	fake_start(&f, 1, NULL);
	fd = conn(&f);
	expect_error(fd, "", "EINVAL", "empty request");
	expect_error(fd, "frobnicate", "EINVAL", "unknown request 'frobnicate'");
	expect_error(fd, "a b c d e f g h i j k l m n o p q", "E2BIG", "too many words");
	expect_error(fd, "capture", "EINVAL", "usage: capture");
	expect_error(fd, "capture stop", "ENOENT", "no capture is running");
	expect_error(fd, "capture start", "EINVAL", "usage: capture start");
	expect_error(fd, "capture start relative.pcap", "EINVAL", "absolute path");
	expect_error(fd, "capture start -", "EINVAL", "needs a file descriptor");
	expect_error(fd, "capture start /tmp/x.pcap vm=77", "ENOENT", "no VM with CID 77");
	expect_error(fd, "capture start /tmp/x.pcap snaplen=10", "EINVAL", "snaplen");
	expect_error(fd, "capture start /tmp/x.pcap bogus", "EINVAL", "bad capture argument");
	/* Still serving after all that. */
	struct ops_jv *v = req(fd, "version");
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	ops_json_free(v);
	close(fd);
	fake_stop(&f);
}

TEST(overlong_request_closes_the_client)
{
	struct fake_daemon f;
	char big[OPS_CTL_MAX_REQUEST + 10];
	char *raw = NULL;
	int fd;

	fake_start(&f, 1, NULL);
	fd = conn(&f);
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	struct ops_jv *v;
	ASSERT_OK(ops_ctl_request(fd, big, -1, 5000, &raw, &v));
	ASSERT_STREQ(ops_json_str(v, "errno", ""), "E2BIG");
	ops_json_free(v);
	free(raw);
	ASSERT_TRUE(closed_within(fd, 5000));
	close(fd);
	/* NUL inside a request line. */
	fd = conn(&f);
	ASSERT_EQ(send(fd, "ver\0sion\n", 9, 0), 9);
	char buf[512];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
	ASSERT_GT(n, 0);
	buf[n] = '\0';
	ASSERT_TRUE(strstr(buf, "NUL byte") != NULL);
	ASSERT_TRUE(closed_within(fd, 5000));
	close(fd);
	fake_stop(&f);
}

/* Several requests in one write: answered in order, one line each. */
TEST(pipelined_requests)
{
	struct fake_daemon f;
	char buf[65536];
	size_t len = 0;
	int fd, lines = 0;

	fake_start(&f, 2, NULL);
	fd = conn(&f);
	const char *reqs = "version\r\nstats vm=3\nconns vm=4\nquit\nversion\n";
	ASSERT_EQ(send(fd, reqs, strlen(reqs), 0), (ssize_t)strlen(reqs));
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		ASSERT_GT(poll(&p, 1, 5000), 0);
		ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
		ASSERT_TRUE(n >= 0);
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	char *save = NULL;
	for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save), lines++) {
		struct ops_jv *v;

		ASSERT_OK(ops_json_parse(l, strlen(l), &v));
		ASSERT_TRUE(ops_json_bool(v, "ok", false));
		if (lines == 0)
			ASSERT_STREQ(ops_json_str(v, "server", ""), "fake 1.0");
		if (lines == 1)
			ASSERT_EQ_U64(ops_json_u64(ops_json_get(v, "vms")->child, "cid", 0), 3);
		if (lines == 2)
			ASSERT_EQ_U64(ops_json_u64(v, "count", 0), 2);
		ops_json_free(v);
	}
	ASSERT_EQ(lines, 4); /* nothing after quit */
	close(fd);
	fake_stop(&f);
}

/* A fresh connection asks "version": true if it was served (not refused). */
static bool version_served(struct fake_daemon *f)
{
	struct ops_jv *v = NULL;
	int fd = conn(f);
	bool ok = ops_ctl_request(fd, "version", -1, 5000, NULL, &v) == 0 &&
		  ops_json_bool(v, "ok", false);

	close(fd);
	ops_json_free(v);
	return ok;
}

TEST(client_limit)
{
	struct fake_daemon f;
	struct ops_ctl_config cfg = { .max_clients = 3 };
	int fds[3], extra;
	char buf[512];

	fake_start(&f, 1, &cfg);
	for (int i = 0; i < 3; i++) {
		fds[i] = conn(&f);
		struct ops_jv *v = req(fds[i], "version"); /* accepted and served */
		ops_json_free(v);
	}
	extra = conn(&f);
	ssize_t n = recv(extra, buf, sizeof(buf) - 1, 0);
	ASSERT_GT(n, 0);
	buf[n] = '\0';
	ASSERT_TRUE(strstr(buf, "too many control clients") != NULL);
	ASSERT_TRUE(closed_within(extra, 5000));
	close(extra);
	/* One leaves: a new one is served. */
	close(fds[0]);
	ASSERT_WAIT_FOR(version_served(&f), 5000);
	close(fds[1]);
	close(fds[2]);
	fake_stop(&f);
}

TEST(idle_client_is_closed)
{
	struct fake_daemon f;
	struct ops_ctl_config cfg = { .idle_timeout_ms = 200 };
	int fd;

	fake_start(&f, 1, &cfg);
	fd = conn(&f);
	ASSERT_TRUE(closed_within(fd, 5000));
	close(fd);
	fake_stop(&f);
}

TEST(socket_file_handling)
{
	struct fake_daemon f;
	struct ops_ctl *c2;
	struct ops_ctl_config cfg = { .ops = &fake_ops, .any_uid = true };
	struct stat st;
	char path[160];

	fake_start(&f, 1, NULL);
	cfg.opaque = &f;
	ASSERT_EQ(stat(f.path, &st), 0);
	ASSERT_EQ(st.st_mode & 0777, 0600);
	/* A live socket is not stolen. */
	cfg.path = f.path;
	ASSERT_ERR(ops_ctl_start(&cfg, &c2), EADDRINUSE);
	/* A regular file is not replaced. */
	snprintf(path, sizeof(path), "%s/file", f.dir);
	FILE *fp = fopen(path, "w");
	fclose(fp);
	cfg.path = path;
	ASSERT_ERR(ops_ctl_start(&cfg, &c2), EEXIST);
	unlink(path);
	/* A stale socket (nobody listening) is replaced. */
	snprintf(path, sizeof(path), "%s/stale", f.dir);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	strcpy(sa.sun_path, path);
	ASSERT_EQ(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(s);
	cfg.path = path;
	ASSERT_OK(ops_ctl_start(&cfg, &c2));
	ops_ctl_stop(c2);
	ASSERT_TRUE(access(path, F_OK) < 0);
	/* Bad configs. */
	cfg.path = NULL;
	ASSERT_ERR(ops_ctl_start(&cfg, &c2), EINVAL);
	fake_stop(&f);
	ops_ctl_stop(NULL);
}

TEST(default_path)
{
	char buf[128];
	char longp[120];

	ASSERT_OK(ops_ctl_default_path("/run/vhost3.sock", buf, sizeof(buf)));
	ASSERT_STREQ(buf, "/run/vhost3.sock.ctl");
	memset(longp, 'a', 104);
	longp[104] = '\0';
	ASSERT_ERR(ops_ctl_default_path(longp, buf, sizeof(buf)), ENAMETOOLONG);
}

static void tap_some(struct fake_daemon *f, unsigned idx, int n)
{
	for (int i = 0; i < n; i++) {
		struct vsock_hdr h = { .src_cid = fake_cid(idx), .dst_cid = 2, .src_port = 1,
				       .dst_port = 2, .type = 1, .op = VSOCK_OP_RW, .len = 3 };
		struct iovec iov = { "abc", 3 };

		OPS_TAP(&f->taps[idx], &h, &iov, 1);
	}
}

static struct ops_jv *status(int fd)
{
	struct ops_jv *v = req(fd, "capture status");

	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	return v;
}

/* The status answer once no capture runs anymore; NULL while one still does. */
static struct ops_jv *stopped_status(int fd)
{
	struct ops_jv *v = status(fd);

	if (!ops_json_bool(ops_json_get(v, "capture"), "running", true))
		return v;
	ops_json_free(v);
	return NULL;
}

TEST(capture_to_path_one_vm)
{
	struct fake_daemon f;
	char cmd[256], file[160];
	int fd;

	fake_start(&f, 2, NULL);
	snprintf(file, sizeof(file), "%s/c.pcap", f.dir);
	fd = conn(&f);
	snprintf(cmd, sizeof(cmd), "capture start %s vm=4 snaplen=100", file);
	struct ops_jv *v = req(fd, cmd);
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	const struct ops_jv *cap = ops_json_get(v, "capture");
	ASSERT_TRUE(ops_json_bool(cap, "running", false));
	ASSERT_EQ_U64(ops_json_get(cap, "vms")->child->u, 4);
	ASSERT_EQ_U64(ops_json_u64(cap, "snaplen", 0), 100);
	ops_json_free(v);
	ASSERT_FALSE(ops_tap_attached(&f.taps[0]));
	ASSERT_TRUE(ops_tap_attached(&f.taps[1]));
	/* stats shows who is captured. */
	v = req(fd, "stats");
	ASSERT_FALSE(ops_json_bool(ops_json_get(v, "vms")->child, "capturing", true));
	ASSERT_TRUE(ops_json_bool(ops_json_get(v, "vms")->child->next, "capturing", false));
	ops_json_free(v);
	tap_some(&f, 0, 5);
	tap_some(&f, 1, 7);
	snprintf(cmd, sizeof(cmd), "capture start %s.2", file);
	expect_error(fd, cmd, "EBUSY", "is running");
	/* The file exists: never overwritten. */
	v = req(fd, "capture stop");
	cap = ops_json_get(v, "capture");
	ASSERT_FALSE(ops_json_bool(cap, "running", true));
	ASSERT_EQ_U64(ops_json_u64(cap, "pkts", 0), 7);
	ASSERT_EQ_U64(ops_json_u64(cap, "bytes", 0), 24 + 7 * (16 + 79));
	ASSERT_STREQ(ops_json_str(cap, "stopped_by", ""), "request");
	ops_json_free(v);
	ASSERT_FALSE(ops_tap_attached(&f.taps[1]));
	struct stat st;
	ASSERT_EQ(stat(file, &st), 0);
	ASSERT_EQ(st.st_size, 24 + 7 * (16 + 79));
	ASSERT_EQ(st.st_mode & 0777, 0600);
	snprintf(cmd, sizeof(cmd), "capture start %s", file);
	expect_error(fd, cmd, "EEXIST", "cannot start a capture");
	unlink(file);
	close(fd);
	fake_stop(&f);
}

static int send_with_fd(int sock, const char *line, int fd)
{
	char *raw = NULL;
	struct ops_jv *v = NULL;
	int r = ops_ctl_request(sock, line, fd, 5000, &raw, &v);

	ASSERT_OK(r);
	r = ops_json_bool(v, "ok", false) ? 0 : -1;
	ops_json_free(v);
	free(raw);
	return r;
}

/* The file descriptor passed with the request; the capture ends when its client leaves. */
TEST(capture_to_passed_fd_ends_with_owner)
{
	struct fake_daemon f;
	int fd, mfd = memfd_create("cap", 0);

	ASSERT_TRUE(mfd >= 0);
	fake_start(&f, 2, NULL);
	fd = conn(&f);
	ASSERT_OK(send_with_fd(fd, "capture start - ns", mfd));
	ASSERT_TRUE(ops_tap_attached(&f.taps[0]));
	ASSERT_TRUE(ops_tap_attached(&f.taps[1]));
	tap_some(&f, 0, 2);
	tap_some(&f, 1, 3);
	close(fd); /* owner gone */
	int other = conn(&f);
	struct ops_jv *v = NULL;
	ASSERT_WAIT_FOR((v = stopped_status(other)) != NULL, 5000);
	const struct ops_jv *cap = ops_json_get(v, "capture");
	ASSERT_STREQ(ops_json_str(cap, "stopped_by", ""), "client closed");
	ASSERT_EQ_U64(ops_json_u64(cap, "pkts", 0), 5);
	ASSERT_TRUE(ops_json_bool(cap, "nanosecond", false));
	ops_json_free(v);
	ASSERT_FALSE(ops_tap_attached(&f.taps[0]));
	ASSERT_EQ(lseek(mfd, 0, SEEK_END), 24 + 5 * (16 + 79));
	uint8_t magic[4];
	ASSERT_EQ(pread(mfd, magic, 4, 0), 4);
	ASSERT_EQ(vsock_le32_get_(magic), 0xa1b23c4du);
	close(other);
	close(mfd);
	fake_stop(&f);
}

/* `detach` survives its client; `duration` ends it on the server side. */
TEST(capture_detached_with_duration)
{
	struct fake_daemon f;
	int fd, mfd = memfd_create("cap", 0);

	fake_start(&f, 1, NULL);
	fd = conn(&f);
	ASSERT_OK(send_with_fd(fd, "capture start - detach duration=1", mfd));
	close(fd);
	fd = conn(&f);
	struct ops_jv *v = status(fd);
	ASSERT_TRUE(ops_json_bool(ops_json_get(v, "capture"), "running", false));
	ASSERT_TRUE(ops_json_bool(ops_json_get(v, "capture"), "detached", false));
	ASSERT_LE(ops_json_u64(ops_json_get(v, "capture"), "remaining_ms", 99999), 1000);
	ops_json_free(v);
	tap_some(&f, 0, 4);
	ASSERT_WAIT_FOR((v = stopped_status(fd)) != NULL, 10000);
	const struct ops_jv *cap = ops_json_get(v, "capture");
	ASSERT_STREQ(ops_json_str(cap, "stopped_by", ""), "duration");
	ASSERT_EQ_U64(ops_json_u64(cap, "pkts", 0), 4);
	ops_json_free(v);
	close(fd);
	close(mfd);
	fake_stop(&f);
}

/* Stopping the server ends a running capture and flushes it. */
TEST(stop_ends_capture)
{
	struct fake_daemon f;
	int fd, mfd = memfd_create("cap", 0);

	fake_start(&f, 1, NULL);
	fd = conn(&f);
	ASSERT_OK(send_with_fd(fd, "capture start -", mfd));
	tap_some(&f, 0, 3);
	ops_ctl_stop(f.ctl);
	f.ctl = NULL;
	ASSERT_FALSE(ops_tap_attached(&f.taps[0]));
	ASSERT_EQ(lseek(mfd, 0, SEEK_END), 24 + 3 * (16 + 79));
	close(fd);
	close(mfd);
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++)
		ops_tap_destroy(&f.taps[i]);
	rmdir(f.dir);
}

/* Random request lines (words from the protocol and junk): each gets one JSON answer. */
TEST(random_requests_each_get_one_answer)
{
	static const char *const words[] = {
		"v1", "v2", "version", "stats", "conns", "capture", "start", "stop", "status",
		"vm=3", "vm=4", "vm=", "vm=99999999999", "snaplen=80", "ns", "duration=0", "-",
		"/nonexistent/dir/x.pcap", "bogus", "\t", "é", "maxbytes=1",
	};
	struct fake_daemon f;
	uint64_t x = 0x853c49e6748fea9bull;
	int fd;

	fake_start(&f, 2, NULL);
	fd = conn(&f);
	for (int i = 0; i < 2000; i++) {
		char line[256] = "";
		size_t len = 0;
		int nw = 1 + i % 5;
		struct ops_jv *v = NULL;

		for (int k = 0; k < nw; k++) {
			test_xorshift64(&x);
			len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%s", k ? " " : "",
						words[x % (sizeof(words) / sizeof(words[0]))]);
		}
		ASSERT_OK(ops_ctl_request(fd, line, -1, 5000, NULL, &v));
		ASSERT_EQ_U64(ops_json_u64(v, "proto", 0), 1);
		ASSERT_TRUE(ops_json_get(v, "ok") != NULL);
		ops_json_free(v);
	}
	close(fd);
	/* Whatever was started is stopped by fake_stop (ops_ctl_stop). */
	fake_stop(&f);
}

static uint64_t cpu_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Out of descriptors: accept fails; the server pauses instead of spinning, then recovers. */
TEST(accept_without_descriptors_does_not_spin)
{
	struct fake_daemon f;
	struct rlimit rl;
	int fds[4096], n = 0, fd;

	fake_start(&f, 1, NULL);
	ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = 256;
	ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	/* Use every descriptor but one, which the client socket takes. */
	for (;;) {
		int d = dup(0);

		if (d < 0)
			break;
		fds[n++] = d;
	}
	ASSERT_GT(n, 1);
	close(fds[--n]);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT_TRUE(fd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	strcpy(sa.sun_path, f.path);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0); /* in the backlog */
	uint64_t c0 = cpu_ms(), t0 = mono_ms();
	test_sleep_ms(500); /* a fixed window: the CPU the control thread burns in it */
	uint64_t used = cpu_ms() - c0, wall = mono_ms() - t0;
	test_note("control thread used %llu ms of CPU in %llu ms", (unsigned long long)used,
		  (unsigned long long)wall);
	ASSERT_LT(used, wall / 2);
	/* Descriptors back: the waiting client is served. */
	while (n)
		close(fds[--n]);
	struct ops_jv *v = req(fd, "version");
	ASSERT_TRUE(ops_json_bool(v, "ok", false));
	ops_json_free(v);
	close(fd);
	fake_stop(&f);
}

TEST_MAIN()
