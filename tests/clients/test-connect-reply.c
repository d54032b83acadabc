/* SPDX-License-Identifier: MIT */
/*
 * The "OK <port>" answer to a host program's CONNECT, as the clients people use read it (suite
 * 'integration'): uvsockd with a guest-role VM listening on port 22 and a host program that
 * connects through <uds-path> the way systemd's `ssh vsock-mux/PATH` proxy does.
 *
 * That proxy (systemd-ssh-proxy, systemd 256 and later) writes "CONNECT <port>\n" and then looks
 * for an OK line by peeking at most strlen("OK 65535\n") = 9 bytes: a line that ends within them
 * is consumed, anything longer (or not starting "OK ") is left unread and the socket goes to ssh
 * as it is. peek_ok_line() below is that rule, written from its documented behaviour. The cases:
 *
 *   - default (connect-reply=host-port): "OK <host-side port>\n", the port in [2^30, 2^31) as
 *     Firecracker answers: 14 bytes, so the rule leaves it unread and the guest's first bytes
 *     come after it (OpenSSH's client skips it as a line before the server's version string:
 *     tests/clients/ssh-vsock-mux.sh shows a real login both ways);
 *   - connect-reply=guest-port (on --vm and as connect_reply: in --config): "OK 22\n", which the
 *     rule consumes, so the stream starts with the guest's bytes;
 *   - a bad value is a one-line start-up error naming both forms.
 */
#include <sys/stat.h>

#include "ctlquery.h"
#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"

#define GUEST_PORT 22
#define BANNER "SSH-2.0-guest\r\n"

enum peek_result {
	PEEK_CONSUMED, /* an OK line of at most 9 bytes was read off the socket */
	PEEK_UNREAD,   /* no such line: nothing was read, the socket is handed on as it is */
	PEEK_FAILED,   /* bytes were read and then the rule gave up: the connection is dropped */
};

/*
 * systemd-ssh-proxy's handling of the answer to CONNECT (src/ssh-generator/ssh-proxy.c in
 * systemd 258): a buffer of 9 bytes; peek what is there; a byte that breaks the "OK " prefix, a
 * full buffer without a newline, or a 5 s receive timeout hands the socket on untouched if
 * nothing was consumed yet (and fails otherwise); a short peek without a newline consumes what
 * was peeked and peeks again; the newline ends the line, which is then consumed.
 */
static enum peek_result peek_ok_line(int fd, char *line, size_t *ret_len)
{
	static const char prefix[] = "OK ";
	struct timeval tv = { .tv_sec = 5 };
	char buf[sizeof("OK 65535\n") - 1];
	size_t consumed = 0, avail = 0, pos = 0;

	ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	for (;;) {
		if (pos >= avail) {
			ssize_t n;

			if (avail >= sizeof(buf))
				return consumed == 0 ? PEEK_UNREAD : PEEK_FAILED;
			if (avail > consumed) {
				n = recv(fd, buf + consumed, avail - consumed, 0);
				if (n != (ssize_t)(avail - consumed))
					return PEEK_FAILED;
				consumed = avail;
			}
			n = recv(fd, buf + avail, sizeof(buf) - avail, MSG_PEEK);
			if (n < 0)
				return errno == EAGAIN && consumed == 0 ? PEEK_UNREAD : PEEK_FAILED;
			if (n == 0)
				return PEEK_FAILED;
			avail += (size_t)n;
		}
		if (pos < strlen(prefix) && buf[pos] != prefix[pos])
			return consumed == 0 ? PEEK_UNREAD : PEEK_FAILED;
		if (buf[pos++] == '\n')
			break;
	}
	if (consumed < pos && recv(fd, buf + consumed, pos - consumed, 0) != (ssize_t)(pos - consumed))
		return PEEK_FAILED;
	memcpy(line, buf, pos);
	line[pos] = '\0';
	*ret_len = pos;
	return PEEK_CONSUMED;
}

/* uvsockd with VM 3; vm_extra is appended to its --vm spec ("" for none), or with as_config the
 * VM comes from a --config file with `connect_reply: <as_config>`. */
static void start(struct uvd *u, const char *vm_extra, const char *as_config)
{
	static char arg[600];
	char cfg[128];
	char *argv[6];
	int argc = 0;

	memset(u, 0, sizeof(*u));
	u->nvms = 1;
	u->cid[0] = 3;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-cr-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	snprintf(u->sock[0], sizeof(u->sock[0]), "%s/vm3.sock", u->dir);
	snprintf(u->uds[0], sizeof(u->uds[0]), "%s/vm3.vsock", u->dir);
	argv[argc++] = (char *)uvd_binary();
	if (as_config) {
		FILE *f;

		snprintf(cfg, sizeof(cfg), "%s/uvsockd.yaml", u->dir);
		f = fopen(cfg, "w");
		ASSERT_TRUE(f != NULL);
		fprintf(f, "vms:\n  - guest_cid: 3\n    socket: %s\n    uds_path: %s\n"
			"    connect_reply: %s\n", u->sock[0], u->uds[0], as_config);
		ASSERT_EQ(fclose(f), 0);
		argv[argc++] = "--config";
		argv[argc++] = cfg;
	} else {
		snprintf(arg, sizeof(arg), "guest-cid=3,socket=%s,uds-path=%s%s", u->sock[0],
			 u->uds[0], vm_extra);
		argv[argc++] = "--vm";
		argv[argc++] = arg;
	}
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
}

/* A raw host connection to <uds> that has written "CONNECT 22\n" and nothing else. */
static int host_connect_raw(const char *uds)
{
	struct sockaddr_un a = hs_addr(uds);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	static const char line[] = "CONNECT 22\n";

	ASSERT_GE(fd, 0);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(write(fd, line, strlen(line)), (ssize_t)strlen(line));
	return fd;
}

/* Reads exactly n bytes within WAIT_MS into buf (NUL-terminated). */
static void read_exact(int fd, char *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r;

		ASSERT_GT(hs_wait_fd(fd, POLLIN, WAIT_MS), 0);
		r = read(fd, buf + got, n - got);
		ASSERT_GT(r, 0);
		got += (size_t)r;
	}
	buf[n] = '\0';
}

/*
 * One connection as systemd-ssh-proxy makes it, the guest answering like sshd (its version
 * string first). Returns what the rule did; *what_ssh_reads gets the first bytes ssh would read
 * (strlen(expect_first) of them).
 */
static enum peek_result proxy_connect(struct uvd *u, char *ok_line, char *what_ssh_reads,
				      size_t ssh_len)
{
	struct uvsock_ctx *g = g_guest_new(u->sock[0], NULL);
	int ls = g_listen(g, SOCK_STREAM, GUEST_PORT), gfd, hfd;
	enum peek_result r;
	size_t len = 0;

	hfd = host_connect_raw(u->uds[0]);
	gfd = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(gfd, 0);
	ASSERT_EQ(uvsock_send(gfd, BANNER, strlen(BANNER), 0), (ssize_t)strlen(BANNER));
	/* The banner is on its way before the rule looks: the worst case for a short read. */
	ok_line[0] = '\0';
	r = peek_ok_line(hfd, ok_line, &len);
	if (r != PEEK_FAILED)
		read_exact(hfd, what_ssh_reads, ssh_len);
	close(hfd);
	uvsock_close(gfd);
	uvsock_close(ls);
	uvsock_ctx_free(g);
	return r;
}

/* "OK <port>\n" with the port in [2^30, 2^31): always 14 bytes. */
static void assert_host_port_line(const char *s)
{
	unsigned long port;
	char *end;

	ASSERT_EQ(strncmp(s, "OK ", 3), 0);
	port = strtoul(s + 3, &end, 10);
	ASSERT_TRUE(port >= (1ul << 30) && port < (1ul << 31));
	ASSERT_TRUE(end == s + 13 && *end == '\n');
}

TEST(default_reply_is_the_host_port_and_left_for_ssh)
{
	char ok[16], first[64];
	struct uvd u;

	start(&u, "", NULL);
	/* 14 bytes of "OK <port>\n" and the banner. */
	ASSERT_EQ(proxy_connect(&u, ok, first, 14 + strlen(BANNER)), PEEK_UNREAD);
	assert_host_port_line(first);
	ASSERT_STREQ(first + 14, BANNER);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(guest_port_reply_is_consumed_by_the_proxy)
{
	char ok[16], first[64];
	struct uvd u;

	start(&u, ",connect-reply=guest-port", NULL);
	ASSERT_EQ(proxy_connect(&u, ok, first, strlen(BANNER)), PEEK_CONSUMED);
	ASSERT_STREQ(ok, "OK 22\n");
	ASSERT_STREQ(first, BANNER);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(guest_port_reply_from_the_config_file)
{
	char ok[16], first[64];
	struct uvd u;

	start(&u, NULL, "guest-port");
	ASSERT_EQ(proxy_connect(&u, ok, first, strlen(BANNER)), PEEK_CONSUMED);
	ASSERT_STREQ(ok, "OK 22\n");
	ASSERT_STREQ(first, BANNER);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(explicit_host_port_is_the_default)
{
	char ok[16], first[64];
	struct uvd u;

	start(&u, ",connect_reply=host-port", NULL);
	ASSERT_EQ(proxy_connect(&u, ok, first, 14), PEEK_UNREAD);
	assert_host_port_line(first);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(bad_value_is_a_start_up_error)
{
	char cmd[512], out[512] = "";
	size_t n;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd),
		 "%s --vm guest-cid=3,socket=/nonexistent/s,uds-path=/nonexistent/u,"
		 "connect-reply=short 2>&1", uvd_binary());
	p = popen(cmd, "r");
	ASSERT_TRUE(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	ASSERT_TRUE(strstr(out, "connect-reply 'short' must be host-port") != NULL);
	ASSERT_TRUE(strstr(out, "guest-port") != NULL);
}

TEST_MAIN()
