/* SPDX-License-Identifier: MIT */
/*
 * Capture files decoded by Debian's tshark (suite 'capture'): a short STREAM exchange (REQUEST,
 * RESPONSE, RW "hello", SHUTDOWN, RST) written through two VM taps into one file by the
 * src/ops/pcap module, read back with
 *   tshark -r FILE -T fields -e vsock.op -e vsock.virtio.op -e vsock.src_cid -e vsock.src_port
 *          -e vsock.dst_cid -e vsock.dst_port -e vsock.virtio.len -e vsock.payload
 * and compared field by field; then the nanosecond format and a truncated snap length.
 *
 * tshark comes from scripts/install-deps.sh (set 'test' or 'capture'; `make check` runs it before
 * the tests). The test installs nothing itself: without tshark it skips, loudly.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/pcap.h"
#include "test.h"
#include "util/macros.h"

static bool have_tshark(void)
{
	return system("tshark --version >/dev/null 2>&1") == 0;
}

static void need_tshark(void)
{
	if (have_tshark())
		return;
	fprintf(stderr, "\n*** SKIPPING CAPTURE TESTS: tshark is not installed (make deps, or "
			"scripts/install-deps.sh capture as root) ***\n\n");
	test_skip("tshark is not installed");
}

/* Runs tshark on path with the given extra arguments; returns its stdout (malloc'd). */
static char *run_tshark(const char *path, const char *const *fields, int nfields)
{
	const char *argv[64];
	int n = 0, pfd[2];
	pid_t pid;
	size_t cap = 1 << 16, len = 0;
	char *out = malloc(cap);
	int status;

	ASSERT_TRUE(out != NULL);
	argv[n++] = "tshark";
	argv[n++] = "-n";
	argv[n++] = "-r";
	argv[n++] = path;
	argv[n++] = "-T";
	argv[n++] = "fields";
	argv[n++] = "-E";
	argv[n++] = "separator=|";
	for (int i = 0; i < nfields; i++) {
		argv[n++] = "-e";
		argv[n++] = fields[i];
	}
	argv[n] = NULL;
	ASSERT_EQ(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	ASSERT_TRUE(pid >= 0);
	if (pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		dup2(pfd[1], 1);
		dup2(devnull, 2); /* "Running as user root" and friends */
		execvp("tshark", (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		int r = poll(&p, 1, 30000);
		ssize_t k;

		if (r <= 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			test_fail(__FILE__, __LINE__, "tshark did not finish within 30 s");
		}
		if (len + 1 == cap) {
			cap *= 2;
			out = realloc(out, cap);
			ASSERT_TRUE(out != NULL);
		}
		k = read(pfd[0], out + len, cap - len - 1);
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	out[len] = '\0';
	close(pfd[0]);
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(WEXITSTATUS(status), 0);
	return out;
}

struct pkt {
	uint32_t src_cid, src_port, dst_cid, dst_port;
	uint16_t op;
	uint32_t flags;
	const char *payload;
};

/* Guest 3 port 1234 connects to host port 5000, says hello, shuts down; the host resets. */
static const struct pkt exchange[] = {
	{ 3, 1234, 2, 5000, VSOCK_OP_REQUEST, 0, NULL },
	{ 2, 5000, 3, 1234, VSOCK_OP_RESPONSE, 0, NULL },
	{ 3, 1234, 2, 5000, VSOCK_OP_RW, 0, "hello" },
	{ 3, 1234, 2, 5000, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_MASK, NULL },
	{ 2, 5000, 3, 1234, VSOCK_OP_RST, 0, NULL },
};

static void write_exchange(struct ops_tap *tx, struct ops_tap *rx)
{
	for (size_t i = 0; i < ARRAY_SIZE(exchange); i++) {
		const struct pkt *k = &exchange[i];
		struct vsock_hdr h = {
			.src_cid = k->src_cid, .dst_cid = k->dst_cid, .src_port = k->src_port,
			.dst_port = k->dst_port, .type = VSOCK_TYPE_STREAM, .op = k->op,
			.flags = k->flags, .buf_alloc = 262144,
			.len = k->payload ? (uint32_t)strlen(k->payload) : 0,
		};
		struct iovec iov = { (void *)k->payload, h.len };

		/* Guest-to-host packets go through the "TX" tap, host-to-guest through "RX". */
		OPS_TAP(k->src_cid == 3 ? tx : rx, &h, &iov, k->payload ? 1 : 0);
	}
}

static char *tmp_path(char *dir, size_t n, const char *name)
{
	char *p = malloc(n + 32);

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(p, n + 32, "%s/%s", dir, name);
	return p;
}

static void cleanup(char *dir, char *path)
{
	unlink(path);
	rmdir(dir);
	free(path);
}

static void check_exchange(const char *path, bool truncated)
{
	static const char *const fields[] = {
		"vsock.op", "vsock.virtio.op", "vsock.src_cid", "vsock.src_port",
		"vsock.dst_cid", "vsock.dst_port", "vsock.virtio.flags", "vsock.payload",
		"frame.len", "frame.cap_len",
	};
	char *out = run_tshark(path, fields, 10);
	char *save = NULL, *line = strtok_r(out, "\n", &save);

	for (size_t i = 0; i < ARRAY_SIZE(exchange); i++) {
		const struct pkt *k = &exchange[i];
		char want[256];
		unsigned len = 32 + 44 + (k->payload ? (unsigned)strlen(k->payload) : 0);

		ASSERT_TRUE(line != NULL);
		/* A truncated payload is not shown by tshark ("Packet size limited during
		 * capture"): the frame lengths say what was kept. */
		snprintf(want, sizeof(want), "%u|%u|%u|%u|%u|%u|0x%08x|%s|%u|%u",
			 ops_vsockmon_op(k->op), k->op, k->src_cid, k->src_port, k->dst_cid,
			 k->dst_port, k->flags, k->payload && !truncated ? "68656c6c6f" : "", len,
			 truncated && len > 78 ? 78 : len);
		test_note("tshark: %s", line);
		ASSERT_STREQ(line, want);
		line = strtok_r(NULL, "\n", &save);
	}
	ASSERT_TRUE(line == NULL);
	free(out);
}

TEST(exchange_decodes_in_tshark)
{
	char dir[] = "/tmp/uvsock-capture-XXXXXX";
	char *path = tmp_path(dir, sizeof(dir), "x.pcap");
	struct ops_tap tx, rx;
	struct ops_pcap *p;

	need_tshark();
	ops_tap_init(&tx);
	ops_tap_init(&rx);
	ASSERT_OK(ops_pcap_open_path(path, NULL, &p));
	ASSERT_OK(ops_tap_attach(&tx, p));
	ASSERT_OK(ops_tap_attach(&rx, p));
	ops_pcap_unref(p);
	write_exchange(&tx, &rx);
	ops_tap_destroy(&tx);
	ops_tap_destroy(&rx);
	check_exchange(path, false);
	cleanup(dir, path);
}

TEST(nanosecond_timestamps_in_tshark)
{
	char dir[] = "/tmp/uvsock-capture-XXXXXX";
	char *path = tmp_path(dir, sizeof(dir), "ns.pcap");
	struct ops_pcap_opts o = { .nanosecond = true };
	struct ops_pcap *p;
	struct vsock_hdr h = { .src_cid = 3, .dst_cid = 2, .src_port = 1, .dst_port = 2,
			       .type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_CREDIT_REQUEST };
	static const char *const fields[] = { "frame.time_epoch", "vsock.op" };

	need_tshark();
	ASSERT_OK(ops_pcap_open_path(path, &o, &p));
	ops_pcap_write(p, &h, NULL, 0, 1700000000123456789ull);
	ops_pcap_unref(p);
	char *out = run_tshark(path, fields, 2);
	ASSERT_STREQ(out, "1700000000.123456789|3\n");
	out[strcspn(out, "\n")] = '\0';
	test_note("tshark: %s", out);
	free(out);
	cleanup(dir, path);
}

TEST(snaplen_truncates_payload_in_tshark)
{
	char dir[] = "/tmp/uvsock-capture-XXXXXX";
	char *path = tmp_path(dir, sizeof(dir), "snap.pcap");
	struct ops_pcap_opts o = { .snaplen = 32 + 44 + 2 };
	struct ops_tap t;
	struct ops_pcap *p;

	need_tshark();
	ops_tap_init(&t);
	ASSERT_OK(ops_pcap_open_path(path, &o, &p));
	ASSERT_OK(ops_tap_attach(&t, p));
	ops_pcap_unref(p);
	write_exchange(&t, &t);
	ops_tap_destroy(&t);
	check_exchange(path, true);
	cleanup(dir, path);
}

TEST_MAIN()
