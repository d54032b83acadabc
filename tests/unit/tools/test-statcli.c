/* SPDX-License-Identifier: MIT */
/*
 * uvsock-stat, run in-process (uvsock_stat_main) against a control server: the real one over a
 * fake daemon (fakectl.h) for text, JSON, filters, watch and capture; and a scripted fake server
 * thread for what a broken or foreign daemon may answer.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "fakectl.h"
#include "hostside.h"
#include "manpage.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "statcli.h"
#include "statrun.h"

static struct run stat_run(const char *const *args)
{
	return stat_run_version("9.9", args);
}

static int count_lines(const char *s, const char *needle)
{
	int n = 0;

	for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

TEST(text_output)
{
	struct fake_daemon f;

	fake_start(&f, 2, NULL);
	struct run r = stat_run((const char *[]){ "-s", f.path, NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_STREQ(r.err, "");
	ASSERT_TRUE(strstr(r.out, "VM 3 (vm3)  vmm connected\n") != NULL);
	ASSERT_TRUE(strstr(r.out, "VM 4 (vm4)  vmm not connected\n") != NULL);
	ASSERT_TRUE(strstr(r.out, "from guest  1001 pkts, 1002 bytes    to guest  1003 pkts, "
				  "1004 bytes") != NULL);
	ASSERT_TRUE(strstr(r.out, "conns       1005 open, 1006 total    rst  1007 sent, 1008 "
				  "received") != NULL);
	ASSERT_TRUE(strstr(r.out, "credit stalls 1009    ring errors 1010    host connects "
				  "refused 1011") != NULL);
	ASSERT_TRUE(strstr(r.out, "spoofed_cid 1020 bad_op 1021 bad_type 1022 oversize 1023 "
				  "no_route 1024 malformed 1025") != NULL);
	ASSERT_TRUE(strstr(r.out, "All 2 VMs\n  from guest  3002 pkts") != NULL);
	/* Listing: header + 4 rows. */
	ASSERT_TRUE(strstr(r.out, "VM     Type      State      Local            Peer") != NULL);
	ASSERT_EQ(count_lines(r.out, " CONNECTED "), 4);
	ASSERT_TRUE(strstr(r.out, "3      stream    CONNECTED  2:5000           3:1234") != NULL);
	ASSERT_TRUE(strstr(r.out, "4      seqpacket CONNECTED  2:5001           4:1235") != NULL);
	ASSERT_TRUE(strstr(r.out, "123456       654321        7    64536     1000       11  "
				  "/tmp/u4_5001\n") != NULL);
	run_free(&r);
	fake_stop(&f);
}

TEST(filters_and_sections)
{
	struct fake_daemon f;

	fake_start(&f, 2, NULL);
	struct run r = stat_run((const char *[]){ "-s", f.path, "--vm", "4", "--conns", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "VM 4") == NULL);   /* no counters */
	ASSERT_EQ(count_lines(r.out, " CONNECTED "), 2);
	ASSERT_TRUE(strstr(r.out, "\n3 ") == NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "--vm", "3", "--counters", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "VM 3 (vm3)") != NULL);
	ASSERT_TRUE(strstr(r.out, "VM 4") == NULL);
	ASSERT_TRUE(strstr(r.out, "All ") == NULL);   /* one VM: no totals */
	ASSERT_TRUE(strstr(r.out, "CONNECTED") == NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "--vm", "99", NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_STREQ(r.err, "uvsock-stat: no VM with CID 99\n");
	run_free(&r);
	fake_stop(&f);
}

TEST(json_output)
{
	struct fake_daemon f;
	struct ops_jv *v;

	fake_start(&f, 2, NULL);
	setenv(OPS_STATCLI_ENV, f.path, 1); /* socket from the environment */
	struct run r = stat_run((const char *[]){ "--json", NULL });
	unsetenv(OPS_STATCLI_ENV);
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "\n"), 1);
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), &v));
	const struct ops_jv *st = ops_json_get(v, "stats"), *cs = ops_json_get(v, "conns");
	ASSERT_TRUE(ops_json_bool(st, "ok", false));
	ASSERT_EQ_U64(ops_json_u64(ops_json_get(st, "totals"), "rx_bytes", 0), 1004 + 2004);
	ASSERT_EQ_U64(ops_json_u64(cs, "count", 0), 4);
	ops_json_free(v);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "-j", "--counters", NULL });
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), &v));
	ASSERT_TRUE(ops_json_get(v, "conns") == NULL);
	ops_json_free(v);
	run_free(&r);
	fake_stop(&f);
}

/*
 * A listening socket at path that must never be connected to (a stand-in for a VM's vhost-user
 * socket): non-blocking, so that accept() tells whether anyone connected.
 */
static int never_connected_listener(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);

	ASSERT_GE(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ASSERT_EQ(listen(fd, 4), 0);
	return fd;
}

static void assert_never_connected(int fd, const char *path)
{
	ASSERT_EQ(accept(fd, NULL, NULL), -1);
	ASSERT_EQ(errno, EAGAIN);
	close(fd);
	unlink(path);
}

/*
 * A VM's vhost-user socket works too, and is never connected to: PATH.ctl is used (the fake
 * daemon, like one from before the "socket" member, lists no socket paths); a socket without a
 * control socket next to it fails with the rule in the message; so does a path that is not a
 * socket.
 */
TEST(vhost_socket_path_resolves_to_ctl)
{
	struct fake_daemon f;
	char vhost[160], other[160];
	int vfd, ofd;

	fake_start(&f, 1, NULL);
	snprintf(vhost, sizeof(vhost), "%s/vhost.sock", f.dir);
	snprintf(other, sizeof(other), "%s/other.sock", f.dir);
	vfd = never_connected_listener(vhost);
	ofd = never_connected_listener(other);
	struct run r = stat_run((const char *[]){ "-s", vhost, "--counters", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "VM 3") != NULL);
	run_free(&r);
	/* vhost.sock.ctl lists no socket, and is not other.sock's default: not taken. */
	r = stat_run((const char *[]){ "-s", other, "--counters", NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, "other.sock is not a control socket") != NULL);
	ASSERT_TRUE(strstr(r.err, "--control PATH") != NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "--control", f.path, "--counters", NULL });
	ASSERT_EQ(r.rc, 0);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.dir, NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, "is not a socket") != NULL);
	run_free(&r);
	assert_never_connected(vfd, vhost);
	assert_never_connected(ofd, other);
	fake_stop(&f);
}

TEST(watch_count)
{
	struct fake_daemon f;

	fake_start(&f, 1, NULL);
	struct run r = stat_run((const char *[]){ "-s", f.path, "--json", "--watch", "1", "--count",
						  "2", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "{\"stats\":"), 2);
	run_free(&r);
	fake_stop(&f);
}

/* Text --watch: each refresh starts with its UTC time; from the second on, each VM has a rates
 * line (the fake daemon's counters do not move: zero rates). */
TEST(watch_text_time_and_rates)
{
	struct fake_daemon f;

	fake_start(&f, 2, NULL);
	struct run r = stat_run((const char *[]){ "-s", f.path, "--counters", "--watch", "1",
						  "--count", "2", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "uvsock-stat  20"), 2);
	ASSERT_EQ(count_lines(r.out, "Z  every 1 s\n"), 2);
	ASSERT_EQ(count_lines(r.out, "  rates       from guest 0 pkts/s, 0 B/s    to guest 0 pkts/s, "
				     "0 B/s    conns 0.0/s  rst 0.0/s\n"), 2);
	run_free(&r);
	r = stat_run((const char *[]){ "-s", f.path, "--counters", "--json", "--watch", "1",
				       "--count", "1", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(strncmp(r.out, "{\"stats\":", 9), 0);
	ASSERT_TRUE(strstr(r.out, ",\"time\":\"20") != NULL);
	run_free(&r);
	/* Without --watch: no time, no rates (the output scripts parse is unchanged). */
	r = stat_run((const char *[]){ "-s", f.path, "--counters", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "rates"), 0);
	ASSERT_EQ(count_lines(r.out, "uvsock-stat  "), 0);
	run_free(&r);
	fake_stop(&f);
}

/* No --socket and no $UVSOCK_CONTROL: the packaged default, and a failure naming it and why. */
TEST(default_control_socket)
{
	char *saved = getenv("UVSOCK_CONTROL") ? strdup(getenv("UVSOCK_CONTROL")) : NULL;
	struct run r;

	unsetenv("UVSOCK_CONTROL");
	if (access("/run/uvsockd/control.sock", F_OK) == 0)
		test_skip("a uvsockd serves /run/uvsockd/control.sock on this machine");
	r = stat_run((const char *[]){ "--counters", NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, "cannot connect to /run/uvsockd/control.sock: no such socket: "
				  "is uvsockd running") != NULL);
	ASSERT_TRUE(strstr(r.err, "(the default; give --socket PATH or set $UVSOCK_CONTROL)") !=
		    NULL);
	run_free(&r);
	if (saved)
		setenv("UVSOCK_CONTROL", saved, 1);
	free(saved);
}

/* GNU getopt_long: --opt=value, --opt value and -oVALUE are the same. */
TEST(option_forms)
{
	struct fake_daemon f;
	char sarg[200];

	fake_start(&f, 2, NULL);
	snprintf(sarg, sizeof(sarg), "--socket=%s", f.path);
	struct run r = stat_run((const char *[]){ sarg, "--vm=4", "--counters", "--json",
						  "--watch=1", "--count=2", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "\n"), 2);
	ASSERT_TRUE(strstr(r.out, "\"cid\":3") == NULL);
	run_free(&r);
	snprintf(sarg, sizeof(sarg), "-s%s", f.path);
	r = stat_run((const char *[]){ sarg, "-j", "-w1", "--count", "1", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_EQ(count_lines(r.out, "\n"), 1);
	run_free(&r);
	fake_stop(&f);
}

TEST(usage_errors)
{
	static const struct {
		const char *args[8];
		const char *msg;
	} cases[] = {
		{ { "-s", "/x", "--bogus", NULL }, "unknown option '--bogus'" },
		{ { "-s", NULL }, "-s needs a value" },
		{ { "-s", "/x", "--vm", "abc", NULL }, "--vm 'abc' is not a CID" },
		{ { "-s", "/x", "--count", "2", NULL }, "--count goes with --watch" },
		{ { "-s", "/x", "--duration", "5", NULL }, "go with --capture" },
		{ { "-s", "/x", "--capture", "/tmp/f", "--json", NULL }, "does not combine" },
		{ { "-s", "/x", "--capture", "/tmp/f", "--snaplen", "10" }, "--snaplen must be" },
		{ { "-s", "/x", "--watch", "0", NULL }, "interval must be 1..86400" },
		{ { "-s", "/x", "--watch=x", NULL }, "interval must be 1..86400" },
		{ { "-s", "/x", "--json=1", NULL }, "unknown option '--json=1'" },
		{ { "-s", "/x", "-x", NULL }, "unknown option '-x'" },
		{ { "-s", "/x", "stray", NULL }, "unexpected argument 'stray'" },
		{ { "-s", "/x", "--count", NULL }, "--count needs a value" },
		{ { "-s", "/x", "--prometheus=yaml", NULL }, "the formats are text and openmetrics" },
		{ { "-s", "/x", "--capture", "/tmp/f", "--snaplen", "1G", NULL }, "--snaplen must be" },
		{ { "--control", "/x", "-s", "/y", NULL }, "either --socket or --control" },
	};

	unsetenv(OPS_STATCLI_ENV);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct run r = stat_run(cases[i].args);

		ASSERT_EQ(r.rc, 2);
		if (!strstr(r.err, cases[i].msg))
			test_fail(__FILE__, __LINE__, "case %zu: '%s' lacks '%s'", i, r.err,
				  cases[i].msg);
		run_free(&r);
	}
	struct run r = stat_run((const char *[]){ "--help", NULL });
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "Usage: uvsock-stat") != NULL);
	run_free(&r);
	r = stat_run((const char *[]){ "-V", NULL });
	ASSERT_STREQ(r.out, "uvsock-stat 9.9\n");
	run_free(&r);
	r = stat_run((const char *[]){ "-s", "/nonexistent/ctl", NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, "cannot connect to /nonexistent/ctl: no such socket: is uvsockd "
				  "running") != NULL);
	run_free(&r);
}

/* A control socket file nobody listens on (a daemon that is gone): ECONNREFUSED named. */
TEST(stale_control_socket_is_named)
{
	char dir[] = "/tmp/uvsock-statcli-XXXXXX", stale[200];

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(stale, sizeof(stale), "%s/gone.ctl", dir);
	close(hs_listen(stale, SOCK_STREAM)); /* the file stays, as a killed daemon leaves it */
	for (int i = 0; i < 2; i++) {
		struct run r = stat_run((const char *[]){ i ? "--control" : "-s", stale, NULL });

		ASSERT_EQ(r.rc, 1);
		ASSERT_TRUE(strstr(r.err, stale) != NULL);
		ASSERT_TRUE(strstr(r.err, "nobody listens there: a socket file left by a uvsockd "
					  "that is gone") != NULL);
		run_free(&r);
	}
	unlink(stale);
	rmdir(dir);
}

/* --help names every option, and the man page documents each (tests/harness/manpage.h). */
TEST(man_page_lists_every_option)
{
	static const char *const opts[] = { "socket", "vm", "counters", "conns", "json", "watch",
					    "count", "capture", "duration", "snaplen", "ns",
					    "help", "version" };
	struct run r = stat_run((const char *[]){ "--help", NULL });

	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		char a[32];

		snprintf(a, sizeof(a), "--%s", opts[i]);
		if (!strstr(r.out, a))
			test_fail(__FILE__, __LINE__, "--help lacks %s", a);
	}
	man_check_help_documented(r.out, "uvsock-stat", UVSOCK_STAT_MAN, false,
				  sizeof(opts) / sizeof(opts[0]));
	run_free(&r);
}

struct feeder {
	struct fake_daemon *f;
	atomic_bool stop; /* relaxed: pthread_join orders what the feeder wrote */
	int n;
};

static void *feed(void *arg)
{
	struct feeder *x = arg;

	while (!atomic_load_explicit(&x->stop, memory_order_relaxed)) {
		struct vsock_hdr h = { .src_cid = 3, .dst_cid = 2, .src_port = 1, .dst_port = 2,
				       .type = 1, .op = VSOCK_OP_RW, .len = 5 };
		struct iovec iov = { "hello", 5 };

		OPS_TAP(&x->f->taps[0], &h, &iov, 1);
		x->n++;
		test_sleep_ms(1); /* pacing: a packet a millisecond while the capture runs */
	}
	return NULL;
}

TEST(capture_for_a_duration)
{
	struct fake_daemon f;
	struct feeder x = { .f = &f };
	pthread_t th;
	char file[160];

	fake_start(&f, 2, NULL);
	snprintf(file, sizeof(file), "%s/cap.pcap", f.dir);
	ASSERT_EQ(pthread_create(&th, NULL, feed, &x), 0);
	struct run r = stat_run((const char *[]){ "-s", f.path, "--capture", file, "--vm", "3",
						  "--duration", "1", "--snaplen", "80", NULL });
	atomic_store_explicit(&x.stop, true, memory_order_relaxed);
	pthread_join(th, NULL);
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.err, "capturing to ") != NULL);
	ASSERT_TRUE(strstr(r.err, "packets captured") != NULL);
	ASSERT_FALSE(ops_tap_attached(&f.taps[0]));
	/* The file holds whole records of the snap length, as many as the summary says. */
	FILE *fp = fopen(file, "r");
	uint8_t hdr[24];
	ASSERT_TRUE(fp != NULL);
	ASSERT_EQ(fread(hdr, 1, 24, fp), 24);
	ASSERT_EQ(vsock_le32_get_(hdr + 16), 80);
	ASSERT_EQ(vsock_le32_get_(hdr + 20), 271);
	fseek(fp, 0, SEEK_END);
	long size = ftell(fp);
	fclose(fp);
	ASSERT_GT(size, 24);
	ASSERT_EQ((size - 24) % (16 + 80), 0);
	char want[64];
	snprintf(want, sizeof(want), "%ld packets captured", (size - 24) / 96);
	ASSERT_TRUE(strstr(r.err, want) != NULL);
	run_free(&r);
	unlink(file);
	fake_stop(&f);
}

/* ---- a scripted fake server: one connection, canned answers ------------------------------ */

struct script {
	char path[108];
	int lfd;
	const char *answers[4];
};

static void *serve(void *arg)
{
	struct script *s = arg;
	int fd = accept(s->lfd, NULL, NULL);
	char buf[1024];

	for (int i = 0; fd >= 0 && s->answers[i]; i++) {
		if (recv(fd, buf, sizeof(buf), 0) <= 0)
			break;
		if (send(fd, s->answers[i], strlen(s->answers[i]), MSG_NOSIGNAL) < 0)
			break;
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

static void script_run(struct script *s, const char *const *args, struct run *r)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	pthread_t th;
	const char *argv[8] = { "-s", s->path };
	int n = 2;

	snprintf(s->path, sizeof(s->path), "/tmp/uvsock-fake-%d.ctl", getpid());
	argv[1] = s->path;
	strcpy(sa.sun_path, s->path);
	unlink(s->path);
	s->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ASSERT_EQ(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ASSERT_EQ(listen(s->lfd, 1), 0);
	ASSERT_EQ(pthread_create(&th, NULL, serve, s), 0);
	for (; *args; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	*r = stat_run(argv);
	pthread_join(th, NULL);
	close(s->lfd);
	unlink(s->path);
}

TEST(garbage_answer)
{
	struct script s = { .answers = { "this is not json\n", NULL } };
	struct run r;

	script_run(&s, (const char *[]){ "--counters", NULL }, &r);
	ASSERT_EQ(r.rc, 1);
	ASSERT_STREQ(r.err, "uvsock-stat: 'stats': the daemon's answer is not JSON\n");
	run_free(&r);
}

TEST(server_closes_mid_answer)
{
	struct script s = { .answers = { "{\"proto\":1,\"ok\":tr", NULL } };
	struct run r;

	script_run(&s, (const char *[]){ "--counters", NULL }, &r);
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, strerror(ECONNRESET)) != NULL);
	run_free(&r);
}

/* An answer from a different version: missing and mistyped members print as 0 / "?". */
TEST(foreign_answer_prints_defaults)
{
	struct script s = { .answers = {
		"{\"proto\":1,\"ok\":true,\"vms\":[{\"cid\":\"three\",\"counters\":{\"tx_pkts\":5,"
		"\"extra\":[1,2]}}],\"future\":{}}\n",
		"{\"proto\":1,\"ok\":true,\"conns\":[{\"vm\":3,\"state\":7}],\"truncated\":true}\n",
		NULL } };
	struct run r;

	script_run(&s, (const char *[]){ NULL }, &r);
	ASSERT_EQ(r.rc, 0);
	ASSERT_TRUE(strstr(r.out, "VM 0 (?)  vmm not connected\n") != NULL);
	ASSERT_TRUE(strstr(r.out, "from guest  5 pkts, 0 bytes") != NULL);
	ASSERT_TRUE(strstr(r.out, "3      ?         ?          0:0") != NULL);
	ASSERT_TRUE(strstr(r.out, "(listing truncated by the daemon)") != NULL);
	run_free(&r);
}

TEST(error_answer_is_reported)
{
	struct script s = { .answers = {
		"{\"proto\":1,\"ok\":false,\"error\":\"something broke\",\"errno\":\"EIO\"}\n",
		NULL } };
	struct run r;

	script_run(&s, (const char *[]){ NULL }, &r);
	ASSERT_EQ(r.rc, 1);
	ASSERT_STREQ(r.err, "uvsock-stat: something broke\n");
	run_free(&r);
}

TEST_MAIN()
