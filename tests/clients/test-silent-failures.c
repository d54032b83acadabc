/* SPDX-License-Identifier: MIT */
/*
 * Mistakes that used to fail silently, each now one log line at uvsockd's default level that
 * names the cause (suite 'integration'):
 *
 *   - a guest connect to a host port nobody listens on: an info line naming the path tried;
 *   - the two sockets swapped: a VMM (a vhost-user header) on the host-side socket, and a host
 *     program's CONNECT line on the vhost-user socket: a warning naming the other socket;
 *   - the liveness probe of a second uvsockd started on the same paths: the running one logs no
 *     "VMM connected" and no warning for it.
 */
#include <sys/stat.h>

#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"

/* Lines of the daemon's log that hold both a and b. */
static unsigned log_lines_with(const struct uvd *u, const char *a, const char *b)
{
	char line[2048];
	unsigned n = 0;
	FILE *f = fopen(u->log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, a) && (!b || strstr(line, b)))
			n++;
	fclose(f);
	return n;
}

static void start_info(struct uvd *u)
{
	uint32_t cid = 3;

	uvd_start(u, 1, &cid, NULL, "--log-level=info");
}

/* A raw Unix stream connection to path. */
static int raw_connect(const char *path)
{
	struct sockaddr_un a = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

TEST(guest_connect_without_listener_names_the_path)
{
	char want[200];
	struct uvsock_ctx *g;
	struct uvd u;

	start_info(&u);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 7000), -1);
	snprintf(want, sizeof(want), "nobody listens on %s_7000", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " info: ", want) == 1, WAIT_MS);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(vmm_on_the_host_side_socket_is_named)
{
	/* What QEMU sends first: VHOST_USER_GET_FEATURES (1), flags version 1, no payload. */
	static const uint32_t hdr[3] = { 1, 1, 0 };
	struct uvsock_ctx *g;
	char want[200];
	struct uvd u;
	int fd;

	start_info(&u);
	/* With a guest attached the header may come after the accept (the handshake path); a
	 * VMM-less uvsockd sees it only if it came with the connection (the usual case). */
	g = g_guest_new(u.sock[0], NULL);
	fd = raw_connect(u.uds[0]);
	ASSERT_EQ(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	snprintf(want, sizeof(want), "vhost-user message on the host-side socket %s:", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " warn: ", want) == 1, WAIT_MS);
	ASSERT_EQ(log_lines_with(&u, " warn: ", "VM's vhost-user socket"), 1);
	close(fd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(connect_line_on_the_vhost_user_socket_is_named)
{
	static const char line[] = "CONNECT 5000\n";
	char want[200];
	struct uvd u;
	int fd;

	start_info(&u);
	fd = raw_connect(u.sock[0]);
	ASSERT_EQ(write(fd, line, strlen(line)), (ssize_t)strlen(line));
	snprintf(want, sizeof(want), "uds-path (%s)", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " warn: ", want) == 1, WAIT_MS);
	ASSERT_EQ(log_lines_with(&u, "VMM connected", NULL), 0);
	close(fd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(second_daemons_probe_is_not_a_vmm)
{
	char vm[400], out[1024] = "", cmd[600];
	uint32_t cid = 3;
	struct uvd u;
	size_t n;
	FILE *p;

	/* At debug level, to see when the probe's connection has been handled. */
	uvd_start(&u, 1, &cid, NULL, "--log-level=debug");
	snprintf(vm, sizeof(vm), "guest-cid=3,socket=%s,uds-path=%s", u.sock[0], u.uds[0]);
	snprintf(cmd, sizeof(cmd), "%s --vm %s 2>&1", uvd_binary(), vm);
	p = popen(cmd, "r");
	ASSERT_TRUE(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	ASSERT_TRUE(WEXITSTATUS(pclose(p)) == 1);
	ASSERT_TRUE(strstr(out, "another process serves it") != NULL);
	/* The running daemon saw a connection come and go: nothing above debug about it. */
	ASSERT_WAIT_FOR(log_lines_with(&u, " debug: ", "before any vhost-user message") == 1,
			WAIT_MS);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(log_lines_with(&u, "VMM connected", NULL), 0);
	ASSERT_EQ(log_lines_with(&u, "VMM disconnected", NULL), 0);
	ASSERT_EQ(log_lines_with(&u, " warn: ", NULL), 0);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
