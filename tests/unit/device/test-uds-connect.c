/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the hybrid CONNECT line parser and reader: valid forms, every malformed form,
 * partial lines delivered byte by byte, overlong lines, early close, bytes after the newline left
 * in the socket, and SOCK_SEQPACKET messages; the guest -> host connect that follows no symlink
 * (uds_connect_at): a real socket works, a symlink to a live listener is refused and the listener
 * sees nothing, other files are refused.
 */
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/uds_connect.h"
#include "test.h"

static int parse(const char *s, uint32_t *port)
{
	return uds_connect_parse(s, strlen(s), port);
}

TEST(parse_valid_forms)
{
	uint32_t p = 7;

	ASSERT_OK(parse("CONNECT 1234\n", &p));
	ASSERT_EQ(p, 1234);
	ASSERT_OK(parse("connect 0\n", &p));
	ASSERT_EQ(p, 0);
	ASSERT_OK(parse("CoNnEcT \t 52\r\n", &p));
	ASSERT_EQ(p, 52);
	ASSERT_OK(parse("CONNECT 4294967294\n", &p));
	ASSERT_EQ_U64(p, 4294967294u);
	ASSERT_OK(parse("CONNECT 0000000009  \n", &p));
	ASSERT_EQ(p, 9);
}

TEST(parse_rejects_garbage)
{
	static const char *const bad[] = {
		"CONNECT 1234",           /* no newline */
		"\n",
		"CONNECT\n",
		"CONNECT \n",
		"CONNECT1234\n",
		"CONNECTX 1\n",
		"CONNEC 1\n",
		"LISTEN 1\n",
		" CONNECT 1\n",
		"CONNECT -1\n",
		"CONNECT +1\n",
		"CONNECT 0x10\n",
		"CONNECT 12a\n",
		"CONNECT 1 2\n",
		"CONNECT 4294967295\n",   /* VMADDR_PORT_ANY */
		"CONNECT 4294967296\n",
		"CONNECT 00000000001\n",  /* 11 digits */
		"CONNECT 99999999999999999999999\n",
		"CONNECT 1\r\r x\n",
		"CONNECT 1234567890123456789012345\n", /* over 32 bytes */
	};
	uint32_t p = 77;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int r = parse(bad[i], &p);

		if (r != -EPROTO)
			test_fail(__FILE__, __LINE__, "accepted or wrong error for '%s': %d", bad[i],
				  r);
	}
	ASSERT_EQ(p, 77);
	/* Embedded NUL is garbage, not a terminator. */
	ASSERT_ERR(uds_connect_parse("CONNECT 1\0\n", 11, &p), EPROTO);
}

static void pair(int type, int sv[2])
{
	ASSERT_OK(socketpair(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv));
}

TEST(read_byte_by_byte_and_leaves_data)
{
	const char *line = "CONNECT 5000\nhello";
	struct uds_connect_reader r = { 0 };
	uint32_t p = 0;
	char rest[16];
	int sv[2];

	pair(SOCK_STREAM, sv);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EAGAIN);
	for (size_t i = 0; i < 12; i++) {
		ASSERT_EQ(write(sv[1], line + i, 1), 1);
		ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EAGAIN);
	}
	ASSERT_EQ(write(sv[1], line + 12, strlen(line) - 12), (ssize_t)strlen(line) - 12);
	ASSERT_OK(uds_connect_read(&r, sv[0], false, &p));
	ASSERT_EQ(p, 5000);
	/* The stream bytes after the newline are still in the socket. */
	ASSERT_EQ(read(sv[0], rest, sizeof(rest)), 5);
	ASSERT_MEMEQ(rest, "hello", 5);
	close(sv[0]);
	close(sv[1]);
}

TEST(read_every_split_point)
{
	const char *line = "connect 42\r\nDATA";
	size_t len = strlen(line);

	for (size_t cut = 1; cut < len; cut++) {
		struct uds_connect_reader r = { 0 };
		uint32_t p = 0;
		char rest[8];
		int sv[2], rc;

		pair(SOCK_STREAM, sv);
		ASSERT_EQ(write(sv[1], line, cut), (ssize_t)cut);
		rc = uds_connect_read(&r, sv[0], false, &p);
		if (cut < 12) {
			ASSERT_ERR(rc, EAGAIN);
			ASSERT_EQ(write(sv[1], line + cut, len - cut), (ssize_t)(len - cut));
			rc = uds_connect_read(&r, sv[0], false, &p);
		} else {
			ASSERT_EQ(write(sv[1], line + cut, len - cut), (ssize_t)(len - cut));
		}
		ASSERT_OK(rc);
		ASSERT_EQ(p, 42);
		ASSERT_EQ(read(sv[0], rest, sizeof(rest)), 4);
		close(sv[0]);
		close(sv[1]);
	}
}

TEST(read_overlong_line)
{
	struct uds_connect_reader r = { 0 };
	char big[100];
	uint32_t p;
	int sv[2];

	memset(big, '1', sizeof(big));
	memcpy(big, "CONNECT ", 8);
	pair(SOCK_STREAM, sv);
	ASSERT_EQ(write(sv[1], big, sizeof(big)), (ssize_t)sizeof(big));
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EMSGSIZE);
	close(sv[0]);
	close(sv[1]);

	/* Exactly 32 bytes without a newline, delivered in two parts. */
	memset(&r, 0, sizeof(r));
	pair(SOCK_STREAM, sv);
	ASSERT_EQ(write(sv[1], big, 20), 20);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EAGAIN);
	ASSERT_EQ(write(sv[1], big, 12), 12);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EMSGSIZE);
	close(sv[0]);
	close(sv[1]);
}

TEST(read_garbage_and_early_close)
{
	struct uds_connect_reader r = { 0 };
	uint32_t p;
	int sv[2];

	pair(SOCK_STREAM, sv);
	ASSERT_EQ(write(sv[1], "GET / HTTP/1.0\n", 15), 15);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EPROTO);
	close(sv[0]);
	close(sv[1]);

	memset(&r, 0, sizeof(r));
	pair(SOCK_STREAM, sv);
	ASSERT_EQ(write(sv[1], "CONNECT 12", 10), 10);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), EAGAIN);
	close(sv[1]);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), ECONNRESET);
	close(sv[0]);

	memset(&r, 0, sizeof(r));
	pair(SOCK_STREAM, sv);
	close(sv[1]);
	ASSERT_ERR(uds_connect_read(&r, sv[0], false, &p), ECONNRESET);
	close(sv[0]);
}

TEST(read_seqpacket_messages)
{
	struct uds_connect_reader r = { 0 };
	uint32_t p = 0;
	char big[64];
	int sv[2];

	pair(SOCK_SEQPACKET, sv);
	ASSERT_ERR(uds_connect_read(&r, sv[0], true, &p), EAGAIN);
	ASSERT_EQ(write(sv[1], "CONNECT 7\n", 10), 10);
	ASSERT_EQ(write(sv[1], "payload", 7), 7);
	ASSERT_OK(uds_connect_read(&r, sv[0], true, &p));
	ASSERT_EQ(p, 7);
	/* The next message is untouched. */
	ASSERT_EQ(read(sv[0], big, sizeof(big)), 7);
	close(sv[0]);
	close(sv[1]);

	pair(SOCK_SEQPACKET, sv);
	ASSERT_EQ(write(sv[1], "CONNECT 7", 9), 9);
	ASSERT_ERR(uds_connect_read(&r, sv[0], true, &p), EPROTO);
	memset(big, 'x', sizeof(big));
	big[63] = '\n';
	ASSERT_EQ(write(sv[1], big, sizeof(big)), (ssize_t)sizeof(big));
	ASSERT_ERR(uds_connect_read(&r, sv[0], true, &p), EMSGSIZE);
	close(sv[1]);
	ASSERT_ERR(uds_connect_read(&r, sv[0], true, &p), ECONNRESET);
	close(sv[0]);
}

TEST(format_ok)
{
	char b[16];

	ASSERT_EQ(uds_connect_format_ok(b, 1073741824u), 14);
	ASSERT_STREQ(b, "OK 1073741824\n");
	ASSERT_EQ(uds_connect_format_ok(b, 4294967295u), 14);
}

/* A temporary directory, its O_PATH fd, and a listener at <dir>/<name>. */
struct at_dir {
	char path[64];
	int dfd;
};

static void at_dir_new(struct at_dir *a)
{
	snprintf(a->path, sizeof(a->path), "/tmp/uvsock-udsc-XXXXXX");
	ASSERT_TRUE(mkdtemp(a->path) != NULL);
	a->dfd = open(a->path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ASSERT_GE(a->dfd, 0);
}

static void at_path(const struct at_dir *a, const char *name, char *buf, size_t len)
{
	ASSERT_LT(snprintf(buf, len, "%s/%s", a->path, name), (int)len);
}

static int at_listen(const struct at_dir *a, const char *name, int type)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	at_path(a, name, sa.sun_path, sizeof(sa.sun_path));
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(fd, 8));
	return fd;
}

static void at_dir_free(struct at_dir *a, const char *const *names)
{
	char p[128];

	for (; *names; names++) {
		at_path(a, *names, p, sizeof(p));
		unlink(p);
	}
	close(a->dfd);
	ASSERT_OK(rmdir(a->path));
}

/* Something is waiting to be accepted on lfd (within ms). */
static bool has_pending(int lfd, int ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	return poll(&p, 1, ms) == 1;
}

TEST(connect_at_real_socket)
{
	static const char *const names[] = { "vm.vsock_5000", "vm.vsock_5001", NULL };
	struct at_dir a;
	bool pending = true;
	int lfd, sfd, fd, afd;

	at_dir_new(&a);
	lfd = at_listen(&a, names[0], SOCK_STREAM);
	sfd = at_listen(&a, names[1], SOCK_SEQPACKET);
	fd = uds_connect_at(a.dfd, names[0], SOCK_STREAM, &pending);
	ASSERT_OK(fd);
	ASSERT_FALSE(pending);
	ASSERT_TRUE(has_pending(lfd, 1000));
	afd = accept(lfd, NULL, NULL);
	ASSERT_GE(afd, 0);
	ASSERT_EQ(write(fd, "x", 1), 1);
	close(afd);
	close(fd);
	fd = uds_connect_at(a.dfd, names[1], SOCK_SEQPACKET, &pending);
	ASSERT_OK(fd);
	ASSERT_TRUE(has_pending(sfd, 1000));
	close(fd);
	/* A listener of the other type, nothing there, a path instead of a name. */
	ASSERT_ERR(uds_connect_at(a.dfd, names[1], SOCK_STREAM, &pending), EPROTOTYPE);
	ASSERT_ERR(uds_connect_at(a.dfd, "vm.vsock_6000", SOCK_STREAM, &pending), ENOENT);
	ASSERT_ERR(uds_connect_at(a.dfd, "../vm.vsock_5000", SOCK_STREAM, &pending), EINVAL);
	ASSERT_ERR(uds_connect_at(a.dfd, "", SOCK_STREAM, &pending), EINVAL);
	/* A socket file nobody listens on any more. */
	close(lfd);
	ASSERT_ERR(uds_connect_at(a.dfd, names[0], SOCK_STREAM, &pending), ECONNREFUSED);
	close(sfd);
	at_dir_free(&a, names);
}

TEST(connect_at_refuses_symlinks)
{
	static const char *const names[] = { "victim", "abs_5000", "rel_5001", "dangling_5002",
					     "file_5003", "dir_link_5004", NULL };
	char victim[128], p[128];
	struct at_dir a;
	bool pending;
	int vfd, fd;

	at_dir_new(&a);
	vfd = at_listen(&a, "victim", SOCK_STREAM);
	at_path(&a, "victim", victim, sizeof(victim));
	at_path(&a, "abs_5000", p, sizeof(p));
	ASSERT_OK(symlink(victim, p));
	at_path(&a, "rel_5001", p, sizeof(p));
	ASSERT_OK(symlink("victim", p));
	at_path(&a, "dangling_5002", p, sizeof(p));
	ASSERT_OK(symlink("/nonexistent/uvsock-socket", p));
	at_path(&a, "file_5003", p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ASSERT_GE(fd, 0);
	close(fd);
	at_path(&a, "dir_link_5004", p, sizeof(p));
	ASSERT_OK(symlink(a.path, p));

	ASSERT_ERR(uds_connect_at(a.dfd, "abs_5000", SOCK_STREAM, &pending), ELOOP);
	ASSERT_ERR(uds_connect_at(a.dfd, "rel_5001", SOCK_STREAM, &pending), ELOOP);
	ASSERT_ERR(uds_connect_at(a.dfd, "rel_5001", SOCK_SEQPACKET, &pending), ELOOP);
	ASSERT_ERR(uds_connect_at(a.dfd, "dangling_5002", SOCK_STREAM, &pending), ELOOP);
	ASSERT_ERR(uds_connect_at(a.dfd, "dir_link_5004", SOCK_STREAM, &pending), ELOOP);
	ASSERT_ERR(uds_connect_at(a.dfd, "file_5003", SOCK_STREAM, &pending), ENOTSOCK);
	/* The live listener the links point to saw nothing. */
	ASSERT_FALSE(has_pending(vfd, 100));
	/* And it is reachable by its own name. */
	fd = uds_connect_at(a.dfd, "victim", SOCK_STREAM, &pending);
	ASSERT_OK(fd);
	ASSERT_TRUE(has_pending(vfd, 1000));
	close(fd);
	close(vfd);
	at_dir_free(&a, names);
}

TEST_MAIN()
