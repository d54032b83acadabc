/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for uvsockd's option parser (daemon/options.c): --vm and single-VM forms, key
 * spellings, defaults, every rejected value (reserved, duplicate and oversized CIDs, path
 * limits, sizes, groups), actions, --isolate with cgroup= and the split into workers, and the
 * file-system checks on a temporary directory.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "manpage.h"
#include "options.h"
#include "test.h"
#include "vmconfig.h"

static char err[512];

/* Parses a NULL-terminated list of arguments (argv[0] added). */
static int parse_v(struct uvsockd_config *c, va_list ap)
{
	char *argv[32] = { "uvsockd" };
	int argc = 1;
	const char *a;

	while ((a = va_arg(ap, const char *)) && argc < 31)
		argv[argc++] = (char *)a;
	argv[argc] = NULL;
	return uvsockd_parse_args(argc, argv, c, err, sizeof(err));
}

static int parse(struct uvsockd_config *c, ...)
{
	va_list ap;
	int r;

	memset(c, 0, sizeof(*c));
	va_start(ap, c);
	r = parse_v(c, ap);
	va_end(ap);
	return r;
}

/* Asserts that parsing fails with -EINVAL and the message contains `needle`. */
#define ASSERT_REJECTS(needle, ...)                                                                \
	do {                                                                                       \
		struct uvsockd_config c_;                                                          \
		int r_ = parse(&c_, __VA_ARGS__, NULL);                                            \
		if (r_ != -EINVAL || !strstr(err, needle))                                         \
			test_fail(__FILE__, __LINE__, "r=%d err='%s' (wanted '%s')", r_, err,       \
				  needle);                                                         \
		ASSERT_TRUE(c_.vms == NULL);                                                       \
	} while (0)

TEST(vm_full_spec)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--vm",
			"guest-cid=4,socket=/tmp/a.sock,uds-path=/tmp/a.vsock,tx-buffer-size=65536,"
			"queue-size=256,groups=g1+g2",
			"--vm=guest_cid=5,socket=/tmp/b.sock,uds_path=/tmp/b.vsock", "--log-level",
			"debug", NULL));
	ASSERT_EQ(c.action, UVSOCKD_RUN);
	ASSERT_EQ(c.log_level, LOG_LVL_DEBUG);
	ASSERT_EQ(c.n_vms, 2);
	ASSERT_VM(c.vms[0], 4, "/tmp/a.sock", "/tmp/a.vsock", 65536, 256, 2);
	ASSERT_STREQ(c.vms[0].groups[0], "g1");
	ASSERT_STREQ(c.vms[0].groups[1], "g2");
	ASSERT_EQ(c.vms[1].guest_cid, 5);
	ASSERT_VM_DEFAULTS(c.vms[1]);
	ASSERT_FALSE(uvsockd_vms_share_group(&c.vms[0], &c.vms[1]));
	uvsockd_config_clear(&c);
	uvsockd_config_clear(&c);
}

TEST(single_vm_options)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--socket", "/tmp/s", "--uds-path=/tmp/u", "--groups", "x+default",
			"--tx-buffer-size", "8192", "--queue-size=128", NULL));
	ASSERT_EQ(c.n_vms, 1);
	ASSERT_EQ(c.vms[0].guest_cid, UVSOCKD_DEFAULT_GUEST_CID);
	ASSERT_EQ(c.vms[0].tx_buffer_size, 8192);
	ASSERT_EQ(c.vms[0].queue_size, 128);
	ASSERT_EQ(c.vms[0].n_groups, 2);
	uvsockd_config_clear(&c);

	ASSERT_OK(parse(&c, "--guest-cid", "4294967294", "--socket-path", "/tmp/s", "--uds-path",
			"/tmp/u", NULL));
	ASSERT_EQ_U64(c.vms[0].guest_cid, 4294967294u);
	uvsockd_config_clear(&c);
}

TEST(groups_sharing)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--vm", "guest-cid=3,socket=/t/a,uds-path=/t/b,groups=red+blue",
			"--vm", "guest-cid=4,socket=/t/c,uds-path=/t/d,groups=green+blue", "--vm",
			"guest-cid=5,socket=/t/e,uds-path=/t/f,groups=green", NULL));
	ASSERT_TRUE(uvsockd_vms_share_group(&c.vms[0], &c.vms[1]));
	ASSERT_TRUE(uvsockd_vms_share_group(&c.vms[1], &c.vms[2]));
	ASSERT_FALSE(uvsockd_vms_share_group(&c.vms[0], &c.vms[2]));
	uvsockd_config_clear(&c);
}

TEST(actions)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--help", NULL));
	ASSERT_EQ(c.action, UVSOCKD_HELP);
	ASSERT_OK(parse(&c, "-V", NULL));
	ASSERT_EQ(c.action, UVSOCKD_VERSION);
	ASSERT_OK(parse(&c, "--print-capabilities", NULL));
	ASSERT_EQ(c.action, UVSOCKD_PRINT_CAPABILITIES);
	/* --help wins over anything else and needs no VM. */
	ASSERT_OK(parse(&c, "--version", "-h", NULL));
	ASSERT_EQ(c.action, UVSOCKD_HELP);
}

TEST(rejects_cids)
{
	ASSERT_REJECTS("reserved", "--vm", "guest-cid=0,socket=/a,uds-path=/b");
	ASSERT_REJECTS("reserved", "--vm", "guest-cid=1,socket=/a,uds-path=/b");
	ASSERT_REJECTS("reserved", "--vm", "guest-cid=2,socket=/a,uds-path=/b");
	ASSERT_REJECTS("reserved", "--guest-cid", "4294967295", "--socket", "/a", "--uds-path",
		       "/b");
	ASSERT_REJECTS("out of range", "--guest-cid", "4294967296", "--socket", "/a",
		       "--uds-path", "/b");
	ASSERT_REJECTS("out of range", "--guest-cid", "99999999999999999999999", "--socket", "/a",
		       "--uds-path", "/b");
	ASSERT_REJECTS("not a number", "--guest-cid", "-3", "--socket", "/a", "--uds-path", "/b");
	ASSERT_REJECTS("not a number", "--guest-cid", "3x", "--socket", "/a", "--uds-path", "/b");
	ASSERT_REJECTS("not a number", "--guest-cid", "", "--socket", "/a", "--uds-path", "/b");
	ASSERT_REJECTS("used by two VMs", "--vm", "guest-cid=3,socket=/a,uds-path=/b", "--vm",
		       "guest-cid=3,socket=/c,uds-path=/d");
}

TEST(rejects_paths)
{
	char longp[200], opt[300];

	ASSERT_REJECTS("socket is required", "--vm", "guest-cid=3,uds-path=/b");
	ASSERT_REJECTS("uds-path is required", "--vm", "guest-cid=3,socket=/b");
	ASSERT_REJECTS("--uds-path is required", "--socket", "/a");
	ASSERT_REJECTS("--socket is required", "--uds-path", "/a");
	ASSERT_REJECTS("must not be empty", "--vm", "socket=,uds-path=/b");
	ASSERT_REJECTS("used twice", "--vm", "guest-cid=3,socket=/a,uds-path=/b", "--vm",
		       "guest-cid=4,socket=/a,uds-path=/c");
	ASSERT_REJECTS("used twice", "--vm", "guest-cid=3,socket=/a,uds-path=/b", "--vm",
		       "guest-cid=4,socket=/c,uds-path=/b");
	ASSERT_REJECTS("same path", "--socket", "/a", "--uds-path", "/a");

	/* socket: 107 bytes fit, 108 do not. */
	memset(longp, 'a', sizeof(longp));
	longp[0] = '/';
	longp[107] = '\0';
	snprintf(opt, sizeof(opt), "socket=%s,uds-path=/u", longp);
	{
		struct uvsockd_config c;

		ASSERT_OK(parse(&c, "--vm", opt, NULL));
		uvsockd_config_clear(&c);
	}
	longp[107] = 'a';
	longp[108] = '\0';
	snprintf(opt, sizeof(opt), "socket=%s,uds-path=/u", longp);
	ASSERT_REJECTS("too long", "--vm", opt);

	/* uds-path: 96 bytes fit (96 + "_4294967295" = 107), 97 do not. */
	longp[96] = '\0';
	snprintf(opt, sizeof(opt), "socket=/s,uds-path=%s", longp);
	{
		struct uvsockd_config c;

		ASSERT_OK(parse(&c, "--vm", opt, NULL));
		ASSERT_EQ(strlen(c.vms[0].uds_path) + strlen("_4294967295"),
			  sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		uvsockd_config_clear(&c);
	}
	longp[96] = 'a';
	longp[97] = '\0';
	snprintf(opt, sizeof(opt), "socket=/s,uds-path=%s", longp);
	ASSERT_REJECTS("_<port>` must fit", "--vm", opt);
}

TEST(rejects_sizes_groups_and_syntax)
{
	ASSERT_REJECTS("tx-buffer-size", "--vm", "socket=/a,uds-path=/b,tx-buffer-size=100");
	ASSERT_REJECTS("tx-buffer-size", "--vm", "socket=/a,uds-path=/b,tx-buffer-size=1g");
	ASSERT_REJECTS("queue-size", "--vm", "socket=/a,uds-path=/b,queue-size=0");
	ASSERT_REJECTS("power of two", "--vm", "socket=/a,uds-path=/b,queue-size=100");
	ASSERT_REJECTS("queue-size", "--vm", "socket=/a,uds-path=/b,queue-size=65536");
	ASSERT_REJECTS("empty group", "--vm", "socket=/a,uds-path=/b,groups=a++b");
	ASSERT_REJECTS("empty group", "--vm", "socket=/a,uds-path=/b,groups=");
	ASSERT_REJECTS("names use", "--vm", "socket=/a,uds-path=/b,groups=a b");
	ASSERT_REJECTS("unknown key", "--vm", "socket=/a,uds-path=/b,colour=red");
	ASSERT_REJECTS("not supported", "--vm", "socket=/a,forward-cid=1");
	ASSERT_REJECTS("not supported", "--forward-cid", "1");
	ASSERT_REJECTS("expected key=value", "--vm", "socket=/a,uds-path");
	ASSERT_REJECTS("given twice", "--vm", "socket=/a,uds-path=/b,socket=/c");
	ASSERT_REJECTS("given twice", "--socket", "/a", "--socket", "/b");
	ASSERT_REJECTS("cannot be combined", "--vm", "socket=/a,uds-path=/b", "--guest-cid", "4");
	ASSERT_REJECTS("needs a value", "--socket");
	ASSERT_REJECTS("unknown argument", "--bogus");
	ASSERT_REJECTS("unknown argument", "--sockets=/a");
	ASSERT_REJECTS("no VM given", "--log-level=info");
	ASSERT_REJECTS("--log-level", "--log-level", "loud", "--socket", "/a", "--uds-path", "/b");
}

TEST(check_paths_on_filesystem)
{
	char dir[] = "/tmp/uvsockd-opt-XXXXXX";
	char sock[128], uds[128], file[128], spec[400];
	struct uvsockd_config c;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/vm.sock", dir);
	snprintf(uds, sizeof(uds), "%s/vm.vsock", dir);
	snprintf(file, sizeof(file), "%s/plain", dir);
	snprintf(spec, sizeof(spec), "socket=%s,uds-path=%s", sock, uds);
	ASSERT_OK(parse(&c, "--vm", spec, NULL));
	ASSERT_OK(uvsockd_check_paths(&c, err, sizeof(err)));
	uvsockd_config_clear(&c);

	/* Missing directory. */
	snprintf(spec, sizeof(spec), "socket=%s/nope/vm.sock,uds-path=%s", dir, uds);
	ASSERT_OK(parse(&c, "--vm", spec, NULL));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), ENOENT);
	ASSERT_TRUE(strstr(err, "nope") != NULL);
	uvsockd_config_clear(&c);

	/* An existing regular file where a socket should go. */
	ASSERT_OK(close(creat(file, 0600)));
	snprintf(spec, sizeof(spec), "socket=%s,uds-path=%s", sock, file);
	ASSERT_OK(parse(&c, "--vm", spec, NULL));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), EEXIST);
	uvsockd_config_clear(&c);
	unlink(file);

	/* Unwritable directory (root bypasses permissions: then only the message is unchecked). */
	ASSERT_OK(chmod(dir, 0500));
	snprintf(spec, sizeof(spec), "socket=%s,uds-path=%s", sock, uds);
	ASSERT_OK(parse(&c, "--vm", spec, NULL));
	if (geteuid() != 0) {
		ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), EACCES);
		ASSERT_TRUE(strstr(err, "cannot create sockets") != NULL);
	}
	uvsockd_config_clear(&c);
	chmod(dir, 0700);
	ASSERT_OK(rmdir(dir));
}

/*
 * uvsockd derives names from each uds-path U (U_<P>, U_seqpacket, U.dgram, U_<P>.dgram): no VM
 * may use another's, nor may the control socket; relative paths are refused (daemon/paths.h).
 */
TEST(rejects_derived_and_relative_paths)
{
	static const char *const bad[][2] = {
		/* B's uds-path is A's host port 7: A's guest connects would reach B's host side. */
		{ "guest-cid=4,socket=/r/b.sock,uds-path=/r/a.vsock_7", "host port path" },
		{ "guest-cid=4,socket=/r/b.sock,uds-path=/r/a.vsock_seqpacket", "SEQPACKET" },
		{ "guest-cid=4,socket=/r/b.sock,uds-path=/r/a.vsock.dgram", "datagram socket" },
		{ "guest-cid=4,socket=/r/a.vsock_5000,uds-path=/r/b.vsock", "host port path" },
		{ "guest-cid=4,socket=/r/a.vsock_53.dgram,uds-path=/r/b.vsock", "host datagram" },
	};
	struct uvsockd_config c;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		test_note("%s", bad[i][0]);
		ASSERT_REJECTS(bad[i][1], "--vm", "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock",
			       "--vm", bad[i][0]);
		/* Whichever comes first. */
		ASSERT_REJECTS(bad[i][1], "--vm", bad[i][0], "--vm",
			       "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock");
	}
	/* The other way round: an earlier VM's socket in the later VM's families. */
	ASSERT_REJECTS("guest-cid 3's socket", "--vm", "guest-cid=3,socket=/r/x_1,uds-path=/r/a",
		       "--vm", "guest-cid=4,socket=/r/b.sock,uds-path=/r/x");
	ASSERT_REJECTS("guest-cid 3's socket", "--vm", "guest-cid=3,socket=/r/x_1.dgram,uds-path=/r/a",
		       "--vm", "guest-cid=4,socket=/r/b.sock,uds-path=/r/x");
	/* The uds-path's own names are not its socket. */
	ASSERT_REJECTS("its socket and host port path", "--socket", "/r/a_1", "--uds-path", "/r/a");
	ASSERT_REJECTS("SEQPACKET", "--socket", "/r/a_seqpacket", "--uds-path", "/r/a");
	/* The control socket is no VM's path: a guest connect to host port 9 would reach it. */
	ASSERT_REJECTS("the control socket", "--control", "/r/a.vsock_9", "--vm",
		       "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock");
	ASSERT_REJECTS("the control socket", "--control", "/r/a.vsock", "--vm",
		       "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock");
	/* Relative paths name another file for the daemon than for a host program. */
	ASSERT_REJECTS("absolute path", "--vm", "guest-cid=3,socket=a.sock,uds-path=/r/a.vsock");
	ASSERT_REJECTS("absolute path", "--vm", "guest-cid=3,socket=/r/a.sock,uds-path=a.vsock");
	/* Near names that uvsockd never derives are fine. */
	ASSERT_OK(parse(&c, "--vm", "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock", "--vm",
			"guest-cid=4,socket=/r/a.vsock_x,uds-path=/r/a.vsock_1x", "--control",
			"/r/a.vsock_7.ctl", NULL));
	uvsockd_config_clear(&c);
}

TEST(config_file)
{
	char dir[] = "/tmp/uvsockd-cfg-XXXXXX", path[128], arg[160];
	struct uvsockd_config c;
	FILE *f;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/u.yaml", dir);
	f = fopen(path, "w");
	ASSERT_TRUE(f != NULL);
	fputs("log_level: debug\nvms:\n"
	      "  - guest_cid: 4\n    socket: /run/vm4.sock\n    uds_path: /run/vm4.vsock\n"
	      "    groups: a+b\n"
	      "  - guest-cid: 5\n    socket: /run/vm5.sock\n    uds-path: /run/vm5.vsock\n"
	      "    tx_buffer_size: 65536\n",
	      f);
	fclose(f);
	ASSERT_OK(parse(&c, "--config", path, NULL));
	ASSERT_EQ(c.n_vms, 2);
	ASSERT_EQ(c.log_level, LOG_LVL_DEBUG);
	ASSERT_EQ(c.vms[0].guest_cid, 4);
	ASSERT_STREQ(c.vms[0].uds_path, "/run/vm4.vsock");
	ASSERT_EQ(c.vms[0].n_groups, 2);
	ASSERT_EQ(c.vms[1].tx_buffer_size, 65536);
	ASSERT_EQ(c.vms[1].n_groups, 1);
	ASSERT_STREQ(c.vms[1].groups[0], "default");
	ASSERT_STREQ(c.control_path, "");
	uvsockd_config_clear(&c);
	/* The command line's log level wins. */
	snprintf(arg, sizeof(arg), "--config=%s", path);
	ASSERT_OK(parse(&c, arg, "--log-level", "warn", NULL));
	ASSERT_EQ(c.log_level, LOG_LVL_WARN);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("cannot be combined", "--config", path, "--vm", "socket=/a,uds-path=/b");
	ASSERT_REJECTS("cannot be combined", "--config", path, "--guest-cid", "9");
	ASSERT_REJECTS("given twice", "--config", path, "--config", path);

	f = fopen(path, "w");
	ASSERT_TRUE(f != NULL);
	fputs("vms:\n  - guest_cid: 2\n    socket: /a\n    uds_path: /b\n", f);
	fclose(f);
	ASSERT_REJECTS("u.yaml:2", "--config", path);
	/* Derived paths across the file's VMs too. */
	f = fopen(path, "w");
	ASSERT_TRUE(f != NULL);
	fputs("vms:\n  - guest_cid: 3\n    socket: /r/a.sock\n    uds_path: /r/a.vsock\n"
	      "  - guest_cid: 4\n    socket: /r/b.sock\n    uds_path: /r/a.vsock_7\n", f);
	fclose(f);
	ASSERT_REJECTS("guest-cid 3's host port path", "--config", path);
	unlink(path);
	{
		struct uvsockd_config c2;

		memset(&c2, 0, sizeof(c2));
		ASSERT_TRUE(parse(&c2, "--config", path, NULL) < 0);
		ASSERT_TRUE(c2.vms == NULL);
	}
	ASSERT_OK(rmdir(dir));
}

#define VM_A "guest-cid=3,socket=/r/a.sock,uds-path=/r/a.vsock"
#define VM_B "guest-cid=4,socket=/r/b.sock,uds-path=/r/b.vsock"
#define VM_C "guest-cid=5,socket=/r/c.sock,uds-path=/r/c.vsock"

TEST(isolate_and_cgroup)
{
	struct uvsockd_config c;
	char longpath[1100];

	ASSERT_OK(parse(&c, "--vm", VM_A, "--vm", VM_B, NULL));
	ASSERT_FALSE(c.isolate);
	ASSERT_STREQ(c.vms[0].cgroup, "");
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--isolate", "--vm", VM_A ",cgroup=/sys/fs/cgroup/vm3,groups=g3",
			"--vm", VM_B ",groups=g4", NULL));
	ASSERT_TRUE(c.isolate);
	ASSERT_STREQ(c.vms[0].cgroup, "/sys/fs/cgroup/vm3");
	ASSERT_STREQ(c.vms[1].cgroup, "");
	uvsockd_config_clear(&c);
	/* The single-VM form and the '_' spelling. */
	ASSERT_OK(parse(&c, "--socket", "/r/s", "--uds-path", "/r/u", "--cgroup=/cg", "--isolate",
			NULL));
	ASSERT_STREQ(c.vms[0].cgroup, "/cg");
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--isolate", "--vm", VM_A ",cgroup=/cg", NULL));
	uvsockd_config_clear(&c);

	ASSERT_REJECTS("needs --isolate", "--vm", VM_A ",cgroup=/sys/fs/cgroup/vm3");
	ASSERT_REJECTS("absolute path", "--isolate", "--vm", VM_A ",cgroup=vm3");
	ASSERT_REJECTS("absolute path", "--isolate", "--vm", VM_A ",cgroup=");
	ASSERT_REJECTS("given twice", "--isolate", "--vm", VM_A ",cgroup=/a,cgroup=/b");
	memset(longpath, 'x', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	ASSERT_REJECTS("too long", "--isolate", "--cgroup", longpath, "--socket", "/a",
		       "--uds-path", "/b");
	ASSERT_REJECTS("cannot be combined with --isolate", "--isolate", "--capture", "/tmp/x.pcap",
		       "--vm", VM_A);
	/* One worker (a shared group), two cgroups; also through a third VM, and "" vs a path. */
	ASSERT_REJECTS("different cgroups", "--isolate", "--vm", VM_A ",cgroup=/a", "--vm",
		       VM_B ",cgroup=/b");
	ASSERT_REJECTS("different cgroups", "--isolate", "--vm", VM_A ",groups=x,cgroup=/a", "--vm",
		       VM_B ",groups=x+y,cgroup=/a", "--vm", VM_C ",groups=y,cgroup=/c");
	ASSERT_REJECTS("different cgroups", "--isolate", "--vm", VM_A ",cgroup=/a", "--vm", VM_B);
	/* Separate groups may name separate cgroups. */
	ASSERT_OK(parse(&c, "--isolate", "--vm", VM_A ",groups=x,cgroup=/a", "--vm",
			VM_B ",groups=y,cgroup=/b", NULL));
	uvsockd_config_clear(&c);
}

TEST(workers_follow_sibling_groups)
{
	struct uvsockd_config c;
	unsigned w[5];

	/* 3 {a}, 4 {b}, 5 {a+c}, 6 {c}, 7 {e}: 3-5-6 through a and c, 4 alone, 7 alone. */
	ASSERT_OK(parse(&c, "--vm", VM_A ",groups=a", "--vm", VM_B ",groups=b", "--vm",
			VM_C ",groups=a+c", "--vm",
			"guest-cid=6,socket=/r/d.sock,uds-path=/r/d.vsock,groups=c", "--vm",
			"guest-cid=7,socket=/r/e.sock,uds-path=/r/e.vsock,groups=e", NULL));
	ASSERT_EQ(uvsockd_workers(&c, w), 3);
	ASSERT_EQ(w[0], 0);
	ASSERT_EQ(w[1], 1);
	ASSERT_EQ(w[2], 0);
	ASSERT_EQ(w[3], 0);
	ASSERT_EQ(w[4], 2);
	uvsockd_config_clear(&c);
	/* The default group: one worker for all. */
	ASSERT_OK(parse(&c, "--vm", VM_A, "--vm", VM_B, "--vm", VM_C, NULL));
	ASSERT_EQ(uvsockd_workers(&c, w), 1);
	ASSERT_EQ(w[0] + w[1] + w[2], 0);
	uvsockd_config_clear(&c);
	/* A later VM joins two earlier workers into one: 3 {a}, 4 {b}, 5 {a+b}. */
	ASSERT_OK(parse(&c, "--vm", VM_A ",groups=a", "--vm", VM_B ",groups=b", "--vm",
			VM_C ",groups=a+b", NULL));
	ASSERT_EQ(uvsockd_workers(&c, w), 1);
	ASSERT_EQ(w[0] + w[1] + w[2], 0);
	uvsockd_config_clear(&c);
}

TEST(isolate_in_config_file_and_cgroup_checks)
{
	char dir[] = "/tmp/uvsockd-iso-XXXXXX", path[128], cg[128], procs[160], spec[400];
	struct uvsockd_config c;
	FILE *f;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/u.yaml", dir);
	snprintf(cg, sizeof(cg), "%s/cg", dir);
	f = fopen(path, "w");
	ASSERT_TRUE(f != NULL);
	fprintf(f, "isolate: true\nvms:\n  - guest_cid: 4\n    socket: %s/a.sock\n"
		   "    uds_path: %s/a.vsock\n    cgroup: %s\n", dir, dir, cg);
	fclose(f);
	ASSERT_OK(parse(&c, "--config", path, NULL));
	ASSERT_TRUE(c.isolate);
	ASSERT_STREQ(c.vms[0].cgroup, cg);
	/* The cgroup directory does not exist yet, then has no cgroup.procs, then has one. */
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), ENOENT);
	ASSERT_TRUE(strstr(err, "cgroup") != NULL);
	ASSERT_OK(mkdir(cg, 0700));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), ENOENT);
	ASSERT_TRUE(strstr(err, "cgroup.procs") != NULL);
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
	ASSERT_OK(close(creat(procs, 0600)));
	/* ... but /tmp is no cgroup file system (the integration test has the real thing). */
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), EINVAL);
	ASSERT_TRUE(strstr(err, "not a cgroup directory") != NULL);
	uvsockd_config_clear(&c);
	/* A cgroup that is a file. */
	snprintf(spec, sizeof(spec), "socket=%s/a.sock,uds-path=%s/a.vsock,cgroup=%s", dir, dir,
		 procs);
	ASSERT_OK(parse(&c, "--isolate", "--vm", spec, NULL));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), ENOTDIR);
	uvsockd_config_clear(&c);

	/* isolate: false with a cgroup is refused, unless the command line turns isolation on. */
	static const char *const files[] = {
		"isolate: false\nvms:\n  - socket: /a\n    uds_path: /b\n    cgroup: /c\n",
		"isolate: yes please\nvms:\n  - socket: /a\n    uds_path: /b\n",
	};
	for (unsigned i = 0; i < 2; i++) {
		f = fopen(path, "w");
		ASSERT_TRUE(f != NULL);
		fputs(files[i], f);
		fclose(f);
		if (i == 1) {
			ASSERT_REJECTS("u.yaml:1", "--config", path);
			continue;
		}
		ASSERT_REJECTS("needs --isolate", "--config", path);
		ASSERT_OK(parse(&c, "--config", path, "--isolate", NULL));
		ASSERT_TRUE(c.isolate);
		uvsockd_config_clear(&c);
	}
	unlink(path);
	unlink(procs);
	ASSERT_OK(rmdir(cg));
	ASSERT_OK(rmdir(dir));
}

TEST(guest_memory_caps)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--vm", "socket=/a,uds-path=/b", NULL));
	ASSERT_EQ_U64(c.guest_memory_max, 0); /* the default of guest_mem.h */
	ASSERT_EQ_U64(c.guest_memory_total_max, 0);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--vm", "socket=/a,uds-path=/b", "--guest-memory-max", "64G",
			"--guest-memory-total-max=2T", NULL));
	ASSERT_EQ_U64(c.guest_memory_max, 64ull << 30);
	ASSERT_EQ_U64(c.guest_memory_total_max, 2ull << 40);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--vm", "socket=/a,uds-path=/b", "--guest-memory-max", "1048576", NULL));
	ASSERT_EQ_U64(c.guest_memory_max, 1ull << 20);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("1M minimum", "--vm", "socket=/a,uds-path=/b", "--guest-memory-max", "4K");
	ASSERT_REJECTS("not a size", "--vm", "socket=/a,uds-path=/b", "--guest-memory-max", "1P");
	ASSERT_REJECTS("not a size", "--vm", "socket=/a,uds-path=/b", "--guest-memory-max", "G");
	ASSERT_REJECTS("not a size", "--vm", "socket=/a,uds-path=/b", "--guest-memory-total-max",
		       "99999999999999999999T");
}

TEST(getopt_long_forms)
{
	struct uvsockd_config c;

	/* `--opt=value` and `--opt value` for every option that takes one; abbreviations. */
	ASSERT_OK(parse(&c, "--guest-cid=7", "--socket-path=/t/s", "--uds-path", "/t/u",
			"--log-lev=debug", "--control=/t/c", NULL));
	ASSERT_EQ(c.vms[0].guest_cid, 7);
	ASSERT_STREQ(c.vms[0].socket_path, "/t/s");
	ASSERT_EQ(c.log_level, LOG_LVL_DEBUG);
	ASSERT_STREQ(c.control_path, "/t/c");
	uvsockd_config_clear(&c);
	/* Repeated calls start afresh (optind is reset). */
	ASSERT_OK(parse(&c, "--vm=socket=/t/a,uds-path=/t/b", NULL));
	ASSERT_EQ(c.n_vms, 1);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("unknown argument 'stray'", "--vm", "socket=/a,uds-path=/b", "stray");
	ASSERT_REJECTS("--vm needs a value", "--vm");
	ASSERT_REJECTS("--guest-memory-max needs a value", "--vm", "socket=/a,uds-path=/b",
		       "--guest-memory-max");
	ASSERT_REJECTS("unknown argument '--isolate=yes'", "--vm", "socket=/a,uds-path=/b",
		       "--isolate=yes");
	ASSERT_REJECTS("unknown argument '--so=/a'", "--so=/a", "--uds-path", "/b");
}

TEST(size_suffixes)
{
	struct uvsockd_config c;

	/* K, M, G, T, binary, either case, as uvsock-perf takes them. */
	ASSERT_OK(parse(&c, "--vm", "socket=/a,uds-path=/b,tx-buffer-size=64K",
			"--guest-memory-max", "2g", "--guest-memory-total-max=1T", NULL));
	ASSERT_EQ(c.vms[0].tx_buffer_size, 65536);
	ASSERT_EQ_U64(c.guest_memory_max, 2ull << 30);
	ASSERT_EQ_U64(c.guest_memory_total_max, 1ull << 40);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--tx-buffer-size", "1m", NULL));
	ASSERT_EQ(c.vms[0].tx_buffer_size, 1 << 20);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("tx-buffer-size", "--vm", "socket=/a,uds-path=/b,tx-buffer-size=128M");
	ASSERT_REJECTS("tx-buffer-size", "--vm", "socket=/a,uds-path=/b,tx-buffer-size=2K");
	ASSERT_REJECTS("tx-buffer-size", "--vm", "socket=/a,uds-path=/b,tx-buffer-size=4Ki");
	ASSERT_REJECTS("queue-size", "--vm", "socket=/a,uds-path=/b,queue-size=1K");
}

TEST(print_capabilities_ignores_every_other_option)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--bogus", "--print-capabilities", "--vm", NULL));
	ASSERT_EQ(c.action, UVSOCKD_PRINT_CAPABILITIES);
	ASSERT_TRUE(c.vms == NULL);
	/* After "--" it is no option. */
	ASSERT_REJECTS("unknown argument", "--", "--print-capabilities");
}

TEST(tune_and_busy_poll)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--tune", "no-zerocopy",
			"--busy-poll-us=50", "--tune=no-merge", NULL));
	ASSERT_STREQ(c.tune, "no-zerocopy,busy-poll-us=50,no-merge");
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("--busy-poll-us 'x'", "--socket", "/a", "--uds-path", "/b",
		       "--busy-poll-us", "x");
	ASSERT_REJECTS("[0, 1000000]", "--socket", "/a", "--uds-path", "/b", "--busy-poll-us",
		       "1000001");
	ASSERT_REJECTS("--tune needs a value", "--socket", "/a", "--uds-path", "/b", "--tune=");
}

TEST(fd_socket)
{
	struct uvsockd_config c;

	ASSERT_OK(parse(&c, "--fd", "3", "--uds-path", "/b", NULL));
	ASSERT_EQ(c.vms[0].fd, 3);
	ASSERT_STREQ(c.vms[0].socket_path, "/dev/fd/3");
	/* No default control path beside an inherited socket. */
	ASSERT_TRUE(c.control_off);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--vm", "fd=5,uds-path=/b", "--vm", "socket=/c,uds-path=/d,guest-cid=4",
			"--control", "/t/ctl", NULL));
	ASSERT_EQ(c.vms[0].fd, 5);
	ASSERT_EQ(c.vms[1].fd, 0);
	ASSERT_FALSE(c.control_off);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("exclude each other", "--vm", "fd=5,socket=/a,uds-path=/b");
	ASSERT_REJECTS("--socket and --fd exclude", "--fd=5", "--socket=/a", "--uds-path=/b");
	ASSERT_REJECTS("3 or more", "--fd", "2", "--uds-path", "/b");
	ASSERT_REJECTS("3 or more", "--vm", "fd=x,uds-path=/b");
	ASSERT_REJECTS("--uds-path is required", "--fd", "4");
	ASSERT_REJECTS("fd 5 is used by two VMs", "--vm", "fd=5,uds-path=/b", "--vm",
		       "fd=5,uds-path=/c,guest-cid=4");
}

TEST(socket_mode_and_group)
{
	struct uvsockd_config c;
	gid_t gid;

	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--socket-mode", "0660",
			"--socket-group=0", NULL));
	ASSERT_EQ(c.socket_mode, 0660);
	ASSERT_OK(uvsockd_socket_gid(&c, &gid, err, sizeof(err)));
	ASSERT_EQ(gid, 0);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--socket-group=no-such-grp",
			NULL));
	ASSERT_ERR(uvsockd_socket_gid(&c, &gid, err, sizeof(err)), ENOENT);
	ASSERT_TRUE(strstr(err, "no-such-grp") != NULL);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", NULL));
	ASSERT_OK(uvsockd_socket_gid(&c, &gid, err, sizeof(err)));
	ASSERT_EQ(gid, (gid_t)-1);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("octal", "--socket", "/a", "--uds-path", "/b", "--socket-mode", "0999");
	ASSERT_REJECTS("octal", "--socket", "/a", "--uds-path", "/b", "--socket-mode", "1777");
	ASSERT_REJECTS("octal", "--socket", "/a", "--uds-path", "/b", "--socket-mode", "rw");
}

TEST(check_paths_refuses_a_live_listener)
{
	char dir[] = "/tmp/uvsockd-live-XXXXXX", s[64], u[64], arg[300];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct uvsockd_config c;
	int l;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(s, sizeof(s), "%s/s", dir);
	snprintf(u, sizeof(u), "%s/u", dir);
	snprintf(arg, sizeof(arg), "socket=%s,uds-path=%s", s, u);
	l = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", u);
	ASSERT_OK(bind(l, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(l, 4));
	ASSERT_OK(parse(&c, "--vm", arg, NULL));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), EADDRINUSE);
	ASSERT_TRUE(strstr(err, u) != NULL);
	{
		char pid[32];

		snprintf(pid, sizeof(pid), "(pid %d)", (int)getpid());
		ASSERT_TRUE(strstr(err, pid) != NULL);
	}
	uvsockd_config_clear(&c);
	close(l);
	unlink(u);
	/* Nothing listens now: the stale file passes (uds_listen replaces it). */
	ASSERT_OK(parse(&c, "--vm", arg, NULL));
	ASSERT_OK(uvsockd_check_paths(&c, err, sizeof(err)));
	uvsockd_config_clear(&c);
	rmdir(dir);
}

TEST(no_dgram_and_dgram_max)
{
	char dir[] = "/tmp/uvsockd-dg-XXXXXX", u[64], dg[80], arg[300];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct uvsockd_config c;
	int l;

	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", NULL));
	ASSERT_FALSE(c.no_dgram);
	ASSERT_EQ(c.dgram_max, 0); /* the device's maximum, 65492 */
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--no-dgram", "--dgram-max=1K",
			NULL));
	ASSERT_TRUE(c.no_dgram);
	ASSERT_EQ(c.dgram_max, 1024);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--socket", "/a", "--uds-path", "/b", "--dgram-max", "65492", NULL));
	ASSERT_EQ(c.dgram_max, 65492);
	uvsockd_config_clear(&c);
	ASSERT_REJECTS("from 1 to 65492", "--socket", "/a", "--uds-path", "/b", "--dgram-max",
		       "65493");
	ASSERT_REJECTS("from 1 to 65492", "--socket", "/a", "--uds-path", "/b", "--dgram-max",
		       "0");
	ASSERT_REJECTS("--dgram-max 'x'", "--socket", "/a", "--uds-path", "/b", "--dgram-max",
		       "x");

	/* A live datagram socket at <uds-path>.dgram is refused at start-up, unless --no-dgram. */
	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(u, sizeof(u), "%s/u", dir);
	snprintf(dg, sizeof(dg), "%s.dgram", u);
	snprintf(arg, sizeof(arg), "socket=%s/s,uds-path=%s", dir, u);
	l = socket(AF_UNIX, SOCK_DGRAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", dg);
	ASSERT_OK(bind(l, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(parse(&c, "--vm", arg, NULL));
	ASSERT_ERR(uvsockd_check_paths(&c, err, sizeof(err)), EADDRINUSE);
	ASSERT_TRUE(strstr(err, dg) != NULL);
	uvsockd_config_clear(&c);
	ASSERT_OK(parse(&c, "--vm", arg, "--no-dgram", NULL));
	ASSERT_OK(uvsockd_check_paths(&c, err, sizeof(err)));
	uvsockd_config_clear(&c);
	close(l);
	unlink(dg);
	rmdir(dir);
}

TEST(usage_mentions_every_option)
{
	static const char *const opts[] = { "--vm", "--config", "--guest-cid", "--socket",
					    "--uds-path",
					    "--tx-buffer-size", "--queue-size", "--groups",
					    "--log-level", "--print-capabilities", "--help",
					    "--version", "--isolate", "--cgroup", "--fd", "--tune",
					    "--busy-poll-us", "--socket-mode", "--socket-group",
					    "--socket-path", "--control", "--capture",
					    "--no-dgram", "--dgram-max" };
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	uvsockd_print_usage(f, "uvsockd");
	uvsockd_print_capabilities(f);
	fclose(f);
	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
		ASSERT_TRUE(strstr(buf, opts[i]) != NULL);
	ASSERT_TRUE(strstr(buf, "\"type\": \"vsock\"") != NULL);
	ASSERT_TRUE(strstr(buf, "\"migrate-precopy\"") != NULL);
	free(buf);
}

/* The man page and --help list the same long options (tests/harness/manpage.h). */
TEST(help_and_man_page_list_the_same_options)
{
	char *usage = NULL;
	size_t ulen = 0;
	FILE *f = open_memstream(&usage, &ulen);

	uvsockd_print_usage(f, "uvsockd");
	fclose(f);
	man_check_options(usage, "uvsockd", UVSOCKD_MAN_PAGE, false, 10);
	free(usage);
}

TEST_MAIN()
