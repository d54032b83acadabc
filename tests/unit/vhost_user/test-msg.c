/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the vhost-user framing layer (src/vhost_user/msg.c): round trips with and
 * without fds, short reads, end of stream at every position, oversize payloads, too many fds,
 * deadlines, and fd accounting on every path.
 */
#include <pthread.h>
#include <sys/socket.h>

#include "fdutil.h"
#include "test.h"
#include "vhost_user/msg.h"

static void sp(int sv[2])
{
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
}

static struct vhu_msg m; /* large; keep off the stack */

TEST(roundtrip_no_fds)
{
	int sv[2];
	uint64_t v = 0x123456789abcdefull;

	sp(sv);
	ASSERT_OK(vhu_msg_send(sv[0], VHU_REQ_SET_FEATURES, VHU_FLAG_VERSION, &v, 8, NULL, 0, 1000));
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 1000));
	ASSERT_EQ(m.request, VHU_REQ_SET_FEATURES);
	ASSERT_EQ(m.flags, VHU_FLAG_VERSION);
	ASSERT_EQ(m.size, 8);
	ASSERT_EQ_U64(m.payload.u64, v);
	ASSERT_EQ(m.nfds, 0);
	close(sv[0]);
	close(sv[1]);
}

TEST(roundtrip_empty_payload_then_next_message)
{
	int sv[2];
	uint64_t v = 42;

	sp(sv);
	ASSERT_OK(vhu_msg_send(sv[0], VHU_REQ_GET_FEATURES, VHU_FLAG_VERSION, NULL, 0, NULL, 0, 1000));
	ASSERT_OK(vhu_msg_send(sv[0], VHU_REQ_SET_OWNER, 1, &v, 8, NULL, 0, 1000));
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 1000));
	ASSERT_EQ(m.request, VHU_REQ_GET_FEATURES);
	ASSERT_EQ(m.size, 0);
	/* The reader must not have consumed the next message. */
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 1000));
	ASSERT_EQ(m.request, VHU_REQ_SET_OWNER);
	ASSERT_EQ_U64(m.payload.u64, 42);
	close(sv[0]);
	close(sv[1]);
}

TEST(fds_travel_and_are_owned_by_message)
{
	int sv[2], efd[3];
	uint64_t v = 0;
	int before;

	sp(sv);
	for (int i = 0; i < 3; i++)
		efd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	before = fd_count();
	ASSERT_OK(vhu_msg_send(sv[0], VHU_REQ_SET_VRING_KICK, 1, &v, 8, efd, 3, 1000));
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 1000));
	ASSERT_EQ(m.nfds, 3);
	ASSERT_EQ(fd_count(), before + 3);
	for (int i = 0; i < 3; i++) {
		ASSERT_GE(m.fds[i], 0);
		ASSERT_TRUE(same_eventfd(efd[i], m.fds[i]));
	}
	int fd1 = vhu_msg_take_fd(&m, 1);
	ASSERT_GE(fd1, 0);
	ASSERT_EQ(m.fds[1], -1);
	ASSERT_EQ(vhu_msg_take_fd(&m, 1), -1);
	ASSERT_EQ(vhu_msg_take_fd(&m, 7), -1);
	vhu_msg_close_fds(&m);
	ASSERT_EQ(m.nfds, 0);
	ASSERT_EQ(fd_count(), before + 1); /* only the claimed one is still open */
	close(fd1);
	vhu_msg_close_fds(&m); /* idempotent */
	ASSERT_EQ(fd_count(), before);
	for (int i = 0; i < 3; i++)
		close(efd[i]);
	close(sv[0]);
	close(sv[1]);
}

struct dribble {
	int fd;
	const uint8_t *buf;
	size_t len;
	int efd; /* attached to byte 5 */
};

/* Writes one byte per send, so the reader sees every possible short read. */
static void *dribble_writer(void *arg)
{
	struct dribble *d = arg;

	for (size_t i = 0; i < d->len; i++) {
		struct iovec iov = { .iov_base = (void *)(d->buf + i), .iov_len = 1 };
		union {
			char b[CMSG_SPACE(sizeof(int))];
			struct cmsghdr a;
		} ctl;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (i == 5 && d->efd >= 0) {
			struct cmsghdr *c;

			mh.msg_control = ctl.b;
			mh.msg_controllen = sizeof(ctl.b);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &d->efd, sizeof(int));
		}
		if (sendmsg(d->fd, &mh, MSG_NOSIGNAL) != 1)
			return (void *)1;
	}
	return NULL;
}

TEST(short_reads_and_fd_in_middle_of_header)
{
	int sv[2];
	uint8_t buf[12 + 8];
	uint32_t hdr[3] = { VHU_REQ_SET_VRING_CALL, 1, 8 };
	uint64_t v = 1;
	struct dribble d;
	pthread_t t;
	void *res;

	sp(sv);
	memcpy(buf, hdr, 12);
	memcpy(buf + 12, &v, 8);
	d = (struct dribble){ .fd = sv[0], .buf = buf, .len = sizeof(buf),
			      .efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) };
	ASSERT_OK(-pthread_create(&t, NULL, dribble_writer, &d));
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 5000));
	pthread_join(t, &res);
	ASSERT_TRUE(res == NULL);
	ASSERT_EQ(m.request, VHU_REQ_SET_VRING_CALL);
	ASSERT_EQ(m.size, 8);
	ASSERT_EQ_U64(m.payload.u64, 1);
	ASSERT_EQ(m.nfds, 1);
	ASSERT_TRUE(same_eventfd(d.efd, m.fds[0]));
	vhu_msg_close_fds(&m);
	close(d.efd);
	close(sv[0]);
	close(sv[1]);
}

TEST(eof_before_message_is_econnreset)
{
	int sv[2];

	sp(sv);
	close(sv[0]);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), ECONNRESET);
	close(sv[1]);
}

/* End of stream after every possible prefix of a message with an fd: -EPROTO, no fd leaks. */
TEST(eof_at_every_position_mid_message)
{
	uint8_t buf[12 + 40];
	uint32_t hdr[3] = { VHU_REQ_SET_VRING_ADDR, 1, 40 };
	int efd = eventfd(0, EFD_CLOEXEC);
	int before = fd_count();

	memcpy(buf, hdr, 12);
	memset(buf + 12, 0xab, 40);
	for (size_t cut = 1; cut < sizeof(buf); cut++) {
		int sv[2];
		struct iovec iov = { .iov_base = buf, .iov_len = cut };
		union {
			char b[CMSG_SPACE(sizeof(int))];
			struct cmsghdr a;
		} ctl;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
				     .msg_controllen = sizeof(ctl.b) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &efd, sizeof(int));
		sp(sv);
		ASSERT_EQ(sendmsg(sv[0], &mh, 0), (ssize_t)cut);
		close(sv[0]);
		ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
		ASSERT_EQ(m.nfds, 0);
		close(sv[1]);
		ASSERT_EQ(fd_count(), before);
	}
	close(efd);
}

TEST(oversize_payload_refused_before_reading)
{
	int sv[2];
	uint32_t hdr[3] = { VHU_REQ_SET_MEM_TABLE, 1, VHU_PAYLOAD_MAX + 1 };

	sp(sv);
	ASSERT_EQ(write(sv[0], hdr, 12), 12);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
	hdr[2] = 0xffffffffu;
	ASSERT_EQ(write(sv[0], hdr, 12), 12);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
	close(sv[0]);
	close(sv[1]);
}

static void send_raw_fds(int sock, const void *buf, size_t len, const int *fds, unsigned n)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	union {
		char b[CMSG_SPACE(sizeof(int) * 32)];
		struct cmsghdr a;
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			     .msg_controllen = CMSG_SPACE(sizeof(int) * n) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	ASSERT_EQ(sendmsg(sock, &mh, 0), (ssize_t)len);
}

TEST(nine_fds_refused_and_all_closed)
{
	int sv[2], fds[9];
	uint32_t hdr[3] = { VHU_REQ_SET_MEM_TABLE, 1, 0 };
	int before;

	sp(sv);
	for (int i = 0; i < 9; i++)
		fds[i] = eventfd(0, EFD_CLOEXEC);
	before = fd_count();
	send_raw_fds(sv[0], hdr, 12, fds, 9);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
	ASSERT_EQ(m.nfds, 0);
	ASSERT_EQ(fd_count(), before);
	for (int i = 0; i < 9; i++)
		close(fds[i]);
	close(sv[0]);
	close(sv[1]);
}

TEST(thirty_two_fds_truncated_refused_and_all_closed)
{
	int sv[2], fds[32];
	uint32_t hdr[3] = { VHU_REQ_SET_MEM_TABLE, 1, 0 };
	int before;

	sp(sv);
	for (int i = 0; i < 32; i++)
		fds[i] = eventfd(0, EFD_CLOEXEC);
	before = fd_count();
	send_raw_fds(sv[0], hdr, 12, fds, 32);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
	ASSERT_EQ(fd_count(), before);
	for (int i = 0; i < 32; i++)
		close(fds[i]);
	close(sv[0]);
	close(sv[1]);
}

TEST(fds_spread_over_chunks_counted_together)
{
	int sv[2], fds[5];
	uint32_t hdr[3] = { VHU_REQ_SET_MEM_TABLE, 1, 8 };
	uint64_t v = 0;
	int before;

	sp(sv);
	for (int i = 0; i < 5; i++)
		fds[i] = eventfd(0, EFD_CLOEXEC);
	before = fd_count();
	/* 5 fds with the header and 5 more with the payload: 10 > 8. */
	send_raw_fds(sv[0], hdr, 12, fds, 5);
	send_raw_fds(sv[0], &v, 8, fds, 5);
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 1000), EPROTO);
	ASSERT_EQ(fd_count(), before);
	/* 4 + 4 is fine. */
	send_raw_fds(sv[0], hdr, 12, fds, 4);
	send_raw_fds(sv[0], &v, 8, fds, 4);
	ASSERT_OK(vhu_msg_recv(sv[1], &m, 1000));
	ASSERT_EQ(m.nfds, 8);
	vhu_msg_close_fds(&m);
	ASSERT_EQ(fd_count(), before);
	for (int i = 0; i < 5; i++)
		close(fds[i]);
	close(sv[0]);
	close(sv[1]);
}

TEST(partial_message_times_out)
{
	int sv[2];
	uint32_t hdr[3] = { VHU_REQ_GET_FEATURES, 1, 8 };
	int efd = eventfd(0, EFD_CLOEXEC);
	int before;

	sp(sv);
	before = fd_count();
	send_raw_fds(sv[0], hdr, 12, &efd, 1); /* payload never comes */
	ASSERT_ERR(vhu_msg_recv(sv[1], &m, 50), ETIMEDOUT);
	ASSERT_EQ(m.nfds, 0);
	ASSERT_EQ(fd_count(), before);
	close(efd);
	close(sv[0]);
	close(sv[1]);
}

TEST(send_argument_checks_and_dead_peer)
{
	int sv[2];
	int fds[9] = { 0 };
	uint64_t v = 0;

	sp(sv);
	ASSERT_ERR(vhu_msg_send(sv[0], 1, 1, NULL, 8, NULL, 0, 100), EINVAL);
	ASSERT_ERR(vhu_msg_send(sv[0], 1, 1, &v, VHU_PAYLOAD_MAX + 1, NULL, 0, 100), EINVAL);
	ASSERT_ERR(vhu_msg_send(sv[0], 1, 1, &v, 8, fds, 9, 100), EINVAL);
	ASSERT_ERR(vhu_msg_send(sv[0], 1, 1, &v, 8, NULL, 1, 100), EINVAL);
	close(sv[1]);
	ASSERT_ERR(vhu_msg_send(sv[0], 1, 1, &v, 8, NULL, 0, 100), EPIPE);
	close(sv[0]);
}

TEST(send_blocks_until_deadline_when_peer_does_not_read)
{
	int sv[2];
	static uint8_t big[VHU_PAYLOAD_MAX];
	int r = 0;

	sp(sv);
	/* Fill the socket buffer; a send must end with -ETIMEDOUT, never hang. */
	for (int i = 0; i < 100000 && r == 0; i++)
		r = vhu_msg_send(sv[0], 1, 1, big, sizeof(big), NULL, 0, 20);
	ASSERT_ERR(r, ETIMEDOUT);
	close(sv[0]);
	close(sv[1]);
}

TEST_MAIN()
