/* SPDX-License-Identifier: MIT */
/*
 * --config FILE parser: good files (our example, vhost-device-vsock's layout, YAML spellings),
 * the result equals what uvsockd's own command-line parser makes of the same VMs, and a table of
 * bad files with their exact "FILE:LINE: message".
 */
#include <sys/stat.h>
#include <unistd.h>

#include "config.h" /* daemon/config.h, with daemon/options.h */
#include "test.h"
#include "util/macros.h"
#include "vmconfig.h"

static int parse(const char *text, struct config_file *c, char *err, size_t errlen)
{
	return config_file_parse("t.yaml", text, strlen(text), c, err, errlen);
}

static void parse_ok(const char *text, struct config_file *c)
{
	char err[512];
	int r = parse(text, c, err, sizeof(err));

	if (r < 0)
		test_fail(__FILE__, __LINE__, "parse failed: %s", err);
}

TEST(documented_example)
{
	struct config_file c;

	parse_ok("# uvsockd.yaml\n"
		 "control: /run/uvsockd.ctl        # optional\n"
		 "log_level: debug\n"
		 "vms:\n"
		 "  - guest_cid: 4\n"
		 "    socket: /run/vhost4.socket\n"
		 "    uds_path: /run/vm4.vsock\n"
		 "    tx_buffer_size: 65536\n"
		 "    queue_size: 512\n"
		 "    groups: group1+groupA\n"
		 "  - guest_cid: 5\n"
		 "    socket: /run/vhost5.socket\n"
		 "    uds_path: /run/vm5.vsock\n",
		 &c);
	ASSERT_TRUE(c.have_control);
	ASSERT_STREQ(c.control_path, "/run/uvsockd.ctl");
	ASSERT_TRUE(c.have_log_level);
	ASSERT_EQ(c.log_level, LOG_LVL_DEBUG);
	ASSERT_EQ(c.n_vms, 2);
	ASSERT_VM(c.vms[0], 4, "/run/vhost4.socket", "/run/vm4.vsock", 65536, 512, 2);
	ASSERT_EQ(c.vms[0].line, 5);
	ASSERT_STREQ(c.vms[0].groups[0], "group1");
	ASSERT_STREQ(c.vms[0].groups[1], "groupA");
	/* Defaults as the command line. */
	ASSERT_EQ(c.vms[1].guest_cid, 5);
	ASSERT_VM_DEFAULTS(c.vms[1]);
	config_file_clear(&c);
	config_file_clear(&c); /* twice: safe */
}

/* vhost-device-vsock's README layout (4-space indent) parses unchanged. */
TEST(vhost_device_vsock_layout)
{
	struct config_file c;

	parse_ok("vms:\n"
		 "    - guest_cid: 4\n"
		 "      socket: /tmp/vhost4.socket\n"
		 "      uds_path: /tmp/vm4.vsock\n"
		 "      tx_buffer_size: 65536\n"
		 "      queue_size: 1024\n"
		 "      groups: group1+groupA\n"
		 "    - guest_cid: 5\n"
		 "      socket: /tmp/vhost5.socket\n"
		 "      uds_path: /tmp/vm5.vsock\n"
		 "      tx_buffer_size: 65536\n"
		 "      queue_size: 1024\n"
		 "      groups: group2+groupB\n",
		 &c);
	ASSERT_EQ(c.n_vms, 2);
	ASSERT_FALSE(c.have_control);
	ASSERT_FALSE(c.have_log_level);
	ASSERT_STREQ(c.vms[1].groups[1], "groupB");
	config_file_clear(&c);
}

TEST(yaml_spellings)
{
	struct config_file c;

	parse_ok("---\r\n"
		 "vms:\r\n"
		 "- \r\n"                                   /* dash alone, keys below, column 0 */
		 "  guest-cid: 7\r\n"                       /* '-' and '_' alike */
		 "  socket: \"/tmp/a b \\\"q\\\" #x.sock\" # comment\r\n"
		 "  uds_path: '/tmp/it''s'\r\n"
		 "  groups: [ g1, g-2 ,g.3 ]\r\n"
		 "\r\n"
		 "  # comment inside an entry\r\n"
		 "- socket_path: /tmp/s2#not-a-comment\r\n" /* vhost-user spelling; '#' in a word */
		 "  uds_path: /tmp/u2\r\n"
		 "  guest_cid: 8\r\n"
		 "...\r\n"
		 "this: is after the end marker\n",
		 &c);
	ASSERT_EQ(c.n_vms, 2);
	ASSERT_EQ(c.vms[0].guest_cid, 7);
	ASSERT_STREQ(c.vms[0].socket_path, "/tmp/a b \"q\" #x.sock");
	ASSERT_STREQ(c.vms[0].uds_path, "/tmp/it's");
	ASSERT_EQ(c.vms[0].n_groups, 3);
	ASSERT_STREQ(c.vms[0].groups[1], "g-2");
	ASSERT_STREQ(c.vms[0].groups[2], "g.3");
	ASSERT_STREQ(c.vms[1].socket_path, "/tmp/s2#not-a-comment");
	config_file_clear(&c);
}

/* The file's VMs, appended, equal what uvsockd_parse_args makes of the same VMs given as --vm. */
TEST(same_structure_as_the_command_line)
{
	struct config_file c;
	struct uvsockd_config fromfile = { .log_level = LOG_LVL_INFO }, fromargs = { 0 };
	char *const argv[] = {
		"uvsockd",
		"--vm", "guest-cid=4,socket=/tmp/v4.sock,uds-path=/tmp/u4,tx-buffer-size=8192,"
			"queue-size=256,groups=a+b,name=web-4,max-conns=4096",
		"--vm", "guest-cid=9,socket=/tmp/v9.sock,uds-path=/tmp/u9",
		"--log-level", "warn",
	};
	char err[256];

	parse_ok("log_level: warn\nvms:\n"
		 "  - guest_cid: 4\n    socket: /tmp/v4.sock\n    uds_path: /tmp/u4\n"
		 "    tx_buffer_size: 8192\n    queue_size: 256\n    groups: a+b\n"
		 "    name: web-4\n    max_conns: 4096\n"
		 "  - guest_cid: 9\n    socket: /tmp/v9.sock\n    uds_path: /tmp/u9\n",
		 &c);
	ASSERT_STREQ(c.vms[0].name, "web-4");
	ASSERT_EQ(c.vms[0].max_conns, 4096);
	ASSERT_STREQ(c.vms[1].name, "");
	ASSERT_EQ(c.vms[1].max_conns, 0);
	ASSERT_OK(config_file_apply(&c, &fromfile));
	ASSERT_OK(uvsockd_parse_args((int)ARRAY_SIZE(argv), argv, &fromargs, err, sizeof(err)));
	ASSERT_EQ(fromfile.n_vms, fromargs.n_vms);
	ASSERT_EQ(fromfile.log_level, fromargs.log_level);
	/* The same struct either way; only the file's entries know their line. */
	for (unsigned i = 0; i < fromargs.n_vms; i++) {
		ASSERT_EQ(fromargs.vms[i].line, 0);
		ASSERT_TRUE(fromfile.vms[i].line > 0);
		fromfile.vms[i].line = 0;
		ASSERT_MEMEQ(&fromfile.vms[i], &fromargs.vms[i], sizeof(fromargs.vms[i]));
	}
	/* Appending after command-line VMs keeps them; too many is refused whole. */
	ASSERT_OK(config_file_apply(&c, &fromargs));
	ASSERT_EQ(fromargs.n_vms, 4);
	ASSERT_EQ(fromargs.vms[2].guest_cid, 4);
	fromargs.n_vms = UVSOCKD_MAX_VMS - 1;
	ASSERT_ERR(config_file_apply(&c, &fromargs), E2BIG);
	ASSERT_EQ(fromargs.n_vms, UVSOCKD_MAX_VMS - 1);
	fromargs.n_vms = 4;
	uvsockd_config_clear(&fromfile);
	uvsockd_config_clear(&fromargs);
	config_file_clear(&c);
}

/* Flow style (refused by the line reader of earlier versions) gives what block style gives. */
TEST(flow_style_equals_block_style)
{
	struct config_file f, b;

	parse_ok("{log_level: warn, vms: [{guest_cid: 4, socket: /x, uds_path: /y, groups: [a, b]},\n"
		 "  {guest_cid: 5, socket: \"/x 5\", uds_path: '/y5', name: five}]}\n", &f);
	parse_ok("log_level: warn\nvms:\n"
		 "  - {guest_cid: 4, socket: /x, uds_path: /y, groups: a+b}\n"
		 "  - guest_cid: 5\n    socket: /x 5\n    uds_path: /y5\n    name: five\n", &b);
	ASSERT_EQ(f.n_vms, 2);
	ASSERT_EQ(f.log_level, b.log_level);
	for (unsigned i = 0; i < 2; i++) {
		f.vms[i].line = b.vms[i].line = 0;
		ASSERT_MEMEQ(&f.vms[i], &b.vms[i], sizeof(f.vms[i]));
	}
	ASSERT_VM(f.vms[0], 4, "/x", "/y", UVSOCKD_DEFAULT_TX_BUFFER_SIZE, UVSOCKD_DEFAULT_QUEUE_SIZE,
		  2);
	ASSERT_STREQ(f.vms[1].socket_path, "/x 5");
	ASSERT_STREQ(f.vms[1].name, "five");
	config_file_clear(&f);
	config_file_clear(&b);
}

#define VM_(cid, n) "  - guest_cid: " #cid "\n    socket: /tmp/s" #n "\n    uds_path: /tmp/u" #n "\n"

static const struct {
	const char *text;
	const char *err;
} bad[] = {
	{ "vms:\n  - guest_cid: 4\n    sockt: /a\n", "t.yaml:3: unknown key 'sockt'" },
	{ "vmz:\n", "t.yaml:1: unknown key 'vmz'" },
	{ "vms:\n  - socket: /a\n\tuds_path: /b\n",
	  "t.yaml:3: tab in indentation (YAML indents with spaces)" },
	{ "vms:\n  - guest_cid: 4\n    uds_path: /b\n",
	  "t.yaml:2: this VM has no socket (the vhost-user socket path)" },
	{ "vms:\n  - guest_cid: 4\n    socket: /a\n  - guest_cid: 5\n",
	  "t.yaml:2: this VM has no uds_path (the host-side socket path)" },
	{ "vms:\n  - guest_cid: 4\n    guest_cid: 5\n",
	  "t.yaml:3: guest_cid given twice (first on line 2)" },
	{ "vms:\n" VM_(4, 1) VM_(4, 2), "t.yaml:5: guest_cid 4 is already used by the VM on line 2" },
	{ "vms:\n" VM_(4, 1) "  - guest_cid: 5\n    socket: /tmp/u1\n    uds_path: /tmp/x\n",
	  "t.yaml:5: socket path '/tmp/u1' is already used by the VM on line 2" },
	{ "vms:\n  - socket: /a\n    uds_path: /a\n",
	  "t.yaml:2: socket and uds_path are the same path '/a'" },
	{ "vms:\n  - guest_cid: 2\n",
	  "t.yaml:2: guest_cid 2 is reserved (0, 1, 2 and 4294967295 cannot be a guest CID)" },
	{ "vms:\n  - guest_cid: 4294967296\n",
	  "t.yaml:2: guest_cid 4294967296 is out of range (CIDs are 32-bit)" },
	{ "vms:\n  - guest_cid: four\n", "t.yaml:2: guest_cid 'four' is not a number" },
	{ "vms:\n  - guest_cid: -4\n", "t.yaml:2: guest_cid '-4' is not a number" },
	{ "vms:\n  - tx_buffer_size: 100\n",
	  "t.yaml:2: tx_buffer_size '100' must be a number in [4096, 67108864]" },
	{ "vms:\n  - queue_size: 1000\n", "t.yaml:2: queue_size 1000 must be a power of two" },
	{ "vms:\n  - uds_path: /tmp/"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "\n",
	  "t.yaml:2: uds_path '/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaa' is too long: 98 bytes, the limit is 96 (Unix socket paths have 108 "
	  "bytes, and `<uds_path>_<port>` must fit)" },
	{ "vms:\n  - forward_cid: 1\n",
	  "t.yaml:2: forward_cid is not supported by uvsockd (no host AF_VSOCK forwarding; use "
	  "uds_path)" },
	{ "vms:\n  - groups: a++b\n", "t.yaml:2: groups 'a++b': empty group name" },
	{ "vms:\n  - groups: [a, b/c]\n",
	  "t.yaml:2: groups 'a, b/c': names use letters, digits, '-', '_', '.'" },
	{ "vms:\n  - socket: [a, b]\n", "t.yaml:2: socket takes one value, not a list" },
	{ "vms:\n  - socket:\n", "t.yaml:2: socket has no value" },
	{ "vms:\n  - socket: ''\n", "t.yaml:2: socket must not be empty" },
	{ "vms:\n  - socket: \"/a\n",
	  "t.yaml:3: YAML: found unexpected end of stream (while scanning a quoted scalar on line 2)" },
	{ "vms:\n  - socket: \"/a\\n\"\n", "t.yaml:2: socket: control character in the value" },
	{ "vms:\n  - socket: '/a' x\n",
	  "t.yaml:2: YAML: did not find expected key while parsing a block mapping" },
	{ "vms:\n  - socket: &anchor /a\n", "t.yaml:2: anchors ('&anchor') are not supported" },
	{ "vms:\n  - socket: &a /a\n    uds_path: *a\n", "t.yaml:2: anchors ('&a') are not supported" },
	{ "vms:\n  - socket: *a\n", "t.yaml:2: aliases ('*a') are not supported" },
	{ "vms:\n  - socket: !!str /a\n", "t.yaml:2: tags ('tag:yaml.org,2002:str') are not supported" },
	{ "vms: !x\n", "t.yaml:1: tags ('!x') are not supported" },
	{ "vms:\n  - socket: |\n      /a\n",
	  "t.yaml:2: socket: multi-line strings ('|', '>') are not supported" },
	{ "vms:\n  - {guest_cid: 4}\n", "t.yaml:2: this VM has no socket (the vhost-user socket path)" },
	{ "vms: [{guest_cid: 4, socket: /a, uds_path: /b, socket: /c}]\n",
	  "t.yaml:1: socket given twice (first on line 1)" },
	{ "vms:\n  - guest_cid: 4\n      socket: /a\n",
	  "t.yaml:2: guest_cid: the value goes on over line 3 (check the indentation there)" },
	{ "vms:\n  - socket: /a\n    uds_path: /b\n - guest_cid: 5\n",
	  "t.yaml:4: YAML: did not find expected key (while parsing a block mapping on line 1)" },
	{ "- guest_cid: 4\n", "t.yaml:1: a list item here; list items belong under 'vms:'" },
	{ "  socket: /a\n", "t.yaml:1: unknown key 'socket'" },
	{ "vms:\n  guest_cid: 4\n",
	  "t.yaml:2: vms: expected a list of VMs, one '- ' entry each (or [{...}, ...])" },
	{ "vms: 4\n", "t.yaml:1: vms: expected a list of VMs, one '- ' entry each (or [{...}, ...])" },
	{ "vms: [4]\n",
	  "t.yaml:1: a VM is a mapping of keys (guest_cid: ..., socket: ..., uds_path: ...)" },
	{ "vms: [{groups: [a, [b]]}]\n", "t.yaml:1: groups: a list of names, not of lists or mappings" },
	{ "vms: [{socket: {a: b}}]\n", "t.yaml:1: socket takes one value, not a mapping" },
	{ "vms:\n  - name: 123\n",
	  "t.yaml:2: name '123' must be 1 to 31 letters, digits, '.', '_' or '-', not only digits" },
	{ "vms:\n  - max_conns: 0\n", "t.yaml:2: max_conns '0' must be a number in [1, 65536]" },
	{ "vms:\n" VM_(4, 1) "    name: a\n" VM_(5, 2) "    name: a\n",
	  "t.yaml:6: name 'a' is already used by the VM on line 2" },
	{ "vms\n", "t.yaml:1: expected 'key: value', got 'vms'" },
	{ "vms:x\n", "t.yaml:1: expected 'key: value', got 'vms:x'" },
	{ "log_level: loud\n", "t.yaml:1: log_level 'loud' is not one of error, warn, info, debug" },
	{ "control: /a\ncontrol: /b\n", "t.yaml:2: control given twice (first on line 1)" },
	{ "# nothing\n", "t.yaml: no VMs (expected a 'vms:' list)" },
	{ "vms:\n# none\n", "t.yaml: 'vms:' lists no VM" },
	{ "", "t.yaml: no VMs (expected a 'vms:' list)" },
	{ "vms:\n---\n", "t.yaml:2: only one document ('---') per file" },
};

TEST(bad_files_name_their_line)
{
	unsigned wrong = 0;

	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct config_file c = { .n_vms = 77 };
		char err[512];

		ASSERT_ERR(parse(bad[i].text, &c, err, sizeof(err)), EINVAL);
		if (strcmp(err, bad[i].err) != 0) {
			printf("# case %zu:\n#   got  '%s'\n#   want '%s'\n", i, err, bad[i].err);
			wrong++;
		}
		ASSERT_EQ(c.n_vms, 77); /* untouched */
	}
	ASSERT_EQ(wrong, 0);
}

/* A last line without a newline, ending in '\r' (found by the mutation test: it looped). */
TEST(last_line_cr_without_newline)
{
	struct config_file c;
	char err[256];
	static const char text[] = "vms:\n- socket: /a\n  uds_path: /b\r";

	ASSERT_OK(config_file_parse("t.yaml", text, sizeof(text) - 1, &c, err, sizeof(err)));
	ASSERT_STREQ(c.vms[0].uds_path, "/b");
	config_file_clear(&c);
}

TEST(input_bounds)
{
	struct config_file c;
	char err[256];
	size_t big = CONFIG_FILE_MAX_SIZE + 1;
	char *text = malloc(big);

	ASSERT_TRUE(text != NULL);
	memset(text, '#', big);
	ASSERT_ERR(config_file_parse("t.yaml", text, big, &c, err, sizeof(err)), EFBIG);
	ASSERT_STREQ(err, "t.yaml: larger than 1048576 bytes");
	memset(text, 'a', CONFIG_FILE_MAX_LINE + 1);
	ASSERT_ERR(config_file_parse("t.yaml", text, CONFIG_FILE_MAX_LINE + 1, &c, err, sizeof(err)),
		   EINVAL);
	ASSERT_STREQ(err, "t.yaml:1: line longer than 4096 bytes");
	ASSERT_ERR(config_file_parse("t.yaml", "vms:\n\0x\n", 8, &c, err, sizeof(err)), EINVAL);
	ASSERT_STREQ(err, "t.yaml:2: NUL byte");
	/* 1025 VMs. */
	size_t off = (size_t)sprintf(text, "vms:\n");
	for (int i = 0; i < UVSOCKD_MAX_VMS + 1; i++)
		off += (size_t)sprintf(text + off, "- guest_cid: %d\n  socket: /s%d\n  uds_path: /u%d\n",
				       i + 3, i, i);
	ASSERT_ERR(config_file_parse("t.yaml", text, off, &c, err, sizeof(err)), EINVAL);
	ASSERT_STREQ(err, "t.yaml:3074: too many VMs (at most 1024)");
	/* A tiny error buffer is never overrun. */
	ASSERT_ERR(parse("vmz:\n", &c, err, 4), EINVAL);
	ASSERT_EQ(strlen(err), 3);
	free(text);
}

TEST(load_file)
{
	char dir[] = "/tmp/uvsock-cfg-XXXXXX", path[64], err[256];
	struct config_file c;
	FILE *f;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/u.yaml", dir);
	ASSERT_ERR(config_file_load(path, &c, err, sizeof(err)), ENOENT);
	ASSERT_TRUE(strstr(err, "No such file") != NULL);
	ASSERT_ERR(config_file_load(dir, &c, err, sizeof(err)), EINVAL);
	ASSERT_TRUE(strstr(err, "not a regular file") != NULL);
	f = fopen(path, "w");
	ASSERT_TRUE(f != NULL);
	fputs("vms:\n  - socket: /a\n    uds_path: /b\n    bogus: 1\n", f);
	fclose(f);
	ASSERT_ERR(config_file_load(path, &c, err, sizeof(err)), EINVAL);
	char want[128];
	snprintf(want, sizeof(want), "%s:4: unknown key 'bogus'", path);
	ASSERT_STREQ(err, want);
	f = fopen(path, "w");
	fputs("vms:\n  - socket: /a\n    uds_path: /b\n", f);
	fclose(f);
	ASSERT_OK(config_file_load(path, &c, err, sizeof(err)));
	ASSERT_EQ(c.n_vms, 1);
	ASSERT_EQ(c.vms[0].guest_cid, 3);
	config_file_clear(&c);
	unlink(path);
	rmdir(dir);
}

/* Deterministic mutations of a good file: a clean parse or one "t.yaml:..." line, never more. */
TEST(random_mutations_never_crash)
{
	static const char seed[] =
		"---\ncontrol: /run/c.ctl # x\nlog_level: info\nvms:\n"
		"  - guest_cid: 4\n    socket: \"/run/a b\"\n    uds_path: '/run/u'\n"
		"    tx_buffer_size: 65536\n    queue_size: 512\n    groups: [a, b]\n"
		"  -\n    guest_cid: 5\n    socket: /run/s5\n    uds_path: /run/u5\n...\n";
	char buf[sizeof(seed)];
	uint64_t x = 0x2545f4914f6cdd1dull;
	unsigned ok = 0;

	for (int i = 0; i < 30000; i++) {
		size_t len = sizeof(seed) - 1;
		struct config_file c;
		char err[256];
		int r;

		memcpy(buf, seed, len);
		for (int k = 0; k < 1 + i % 3; k++) {
			test_xorshift64(&x);
			if (len == 0)
				break;
			size_t at = (size_t)(x % len);
			static const char pool[] = " -:#'\"[],\t\n\r\\0a9_{&";

			if ((x >> 33) % 2)
				buf[at] = pool[(x >> 40) % (sizeof(pool) - 1)];
			else
				len = at;
		}
		r = config_file_parse("t.yaml", buf, len, &c, err, sizeof(err));
		if (r == 0) {
			ok++;
			ASSERT_GE(c.n_vms, 1);
			config_file_clear(&c);
		} else {
			ASSERT_EQ(r, -EINVAL);
			ASSERT_EQ(strncmp(err, "t.yaml", 6), 0);
			ASSERT_TRUE(strchr(err, '\n') == NULL);
		}
	}
	test_note("%u of 30000 mutations still parse", ok);
}

TEST_MAIN()
