/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the hybrid CONNECT line parser and reader: valid forms, every malformed form,
 * partial lines delivered byte by byte, overlong lines, early close, bytes after the newline left
 * in the socket, and SOCK_SEQPACKET messages.
 */
#include <sys/socket.h>
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

TEST_MAIN()
