/* SPDX-License-Identifier: MIT */
/*
 * Host-side failures an operator must see at uvsockd's default log level (suite 'integration'):
 * each is logged at warn (with the VM, the ports it knows and the errno text) and counted by
 * reason in the control socket's `stats` answer, which uvsock-stat prints:
 *
 *   - a host listener <uds-path>_<port> uvsockd may not connect to (EACCES): host_listeners_denied;
 *   - a host CONNECT while no VMM is attached: host_clients_no_guest;
 *   - a CONNECT line that does not parse: host_connect_bad_lines;
 *   - a host CONNECT to a guest port nobody listens on: host_clients_guest_refused.
 *
 * The daemon runs with no --log-level. As root, it runs as nobody (setpriv keeps the PID) in a
 * directory open to it, so a socket of root's with mode 0755 is a real EACCES for it; as another
 * user, the socket's mode is 0 instead.
 */
#include <sys/stat.h>

#include "ctlquery.h"
#include "guestside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "test.h"
#include "uvsockd-proc.h"

#define SETPRIV "/usr/bin/setpriv"

/* uvsockd with VM 3 at the default log level, its control socket answering. */
static void start_default_level(struct uvd *u)
{
	static char vmarg[400];
	char *argv[8];
	char ctl[200];
	int argc = 0, fd = -1;

	memset(u, 0, sizeof(*u));
	u->nvms = 1;
	u->cid[0] = 3;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-hf-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	snprintf(u->sock[0], sizeof(u->sock[0]), "%s/vm3.sock", u->dir);
	snprintf(u->uds[0], sizeof(u->uds[0]), "%s/vm3.vsock", u->dir);
	snprintf(vmarg, sizeof(vmarg), "guest-cid=3,socket=%s,uds-path=%s", u->sock[0], u->uds[0]);
	if (geteuid() == 0) {
		if (access(SETPRIV, X_OK) != 0)
			test_skip("running as root without " SETPRIV
				  " (needed to drop privileges)");
		ASSERT_EQ(chmod(u->dir, 0777), 0);
		argv[argc++] = SETPRIV;
		argv[argc++] = "--reuid=65534";
		argv[argc++] = "--regid=65534";
		argv[argc++] = "--clear-groups";
	}
	argv[argc++] = (char *)uvd_binary();
	argv[argc++] = "--vm";
	argv[argc++] = vmarg;
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	if (!WAIT_FOR(ops_ctl_connect(ctl, &fd) >= 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

/* Lines of the daemon's stderr that hold both a and b. */
static unsigned log_lines_with(const struct uvd *u, const char *a, const char *b)
{
	char line[1024];
	unsigned n = 0;
	FILE *f = fopen(u->log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, a) && strstr(line, b))
			n++;
	fclose(f);
	return n;
}

/* Waits (bounded) for exactly one warn line holding `what` (and `tag`). */
static void expect_one_warn(const struct uvd *u, const char *tag, const char *what)
{
	if (!WAIT_FOR(log_lines_with(u, "uvsockd warn: vm=3", what) >= 1, WAIT_MS))
		test_fail(__FILE__, __LINE__, "no warn line with '%s' in %s", what, u->log);
	ASSERT_EQ(log_lines_with(u, "uvsockd warn: vm=3", what), 1);
	ASSERT_EQ(log_lines_with(u, tag, what), 1);
}

/*
 * A raw host connection to the VM's uds-path that writes `line` (best effort: the daemon may
 * have closed it already when it refuses without reading).
 */
static int host_send_line(const struct uvd *u, const char *line)
{
	struct sockaddr_un a = hs_addr(u->uds[0]);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	(void)!send(fd, line, strlen(line), MSG_NOSIGNAL);
	return fd;
}

TEST(denied_host_listener_is_a_warning_and_counted)
{
	struct uvsock_ctx *g;
	struct uvd u;
	char path[200];
	int lfd;

	start_default_level(&u);
	g = g_guest_new(u.sock[0], NULL);
	lfd = hs_listen_port(u.uds[0], 6000, SOCK_STREAM);
	snprintf(path, sizeof(path), "%s_6000", u.uds[0]);
	if (geteuid() != 0)
		ASSERT_EQ(chmod(path, 0), 0);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 6000), -1);
	ASSERT_EQ(errno, ECONNRESET);
	expect_one_warn(&u, "pp=", "may not connect to vm3.vsock_6000 (Permission denied");
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_listeners_denied"), 1);
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_connects_refused"), 1);
	close(lfd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(host_connect_without_vmm_is_a_warning_and_counted)
{
	struct uvd u;
	int fd;

	start_default_level(&u);
	fd = host_send_line(&u, "CONNECT 5000\n");
	ASSERT_TRUE(hs_wait_eof(fd, WAIT_MS));
	close(fd);
	expect_one_warn(&u, "lp=0", "no VMM attached or guest driver not running");
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_clients_no_guest"), 1);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(unparsable_connect_line_is_a_warning_and_counted)
{
	struct uvsock_ctx *g;
	struct uvd u;
	int fd;

	start_default_level(&u);
	g = g_guest_new(u.sock[0], NULL);
	fd = host_send_line(&u, "HELLO 5000\n");
	ASSERT_TRUE(hs_wait_eof(fd, WAIT_MS));
	close(fd);
	expect_one_warn(&u, "vm=3:", "CONNECT line rejected: Protocol error");
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_connect_bad_lines"), 1);
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_clients_no_guest"), 0);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(connect_to_an_unused_guest_port_is_a_warning_and_counted)
{
	struct uvsock_ctx *g;
	struct uvd u;

	start_default_level(&u);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_EQ(hs_connect_guest(u.uds[0], 7777, SOCK_STREAM, WAIT_MS), -1);
	expect_one_warn(&u, "pp=7777", "nobody listens on guest port 7777");
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "host_clients_guest_refused"), 1);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
