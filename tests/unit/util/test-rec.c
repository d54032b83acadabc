/* SPDX-License-Identifier: MIT */
/*
 * The state record (src/util/rec.h): CRC32C against its check value, a round trip of every
 * value type through a sealed memfd, and each refusal of the reader: magic, kind, version,
 * truncation, checksum, fd count and indices, item bounds, depth, unknown, duplicate and
 * missing fields, scalar sizes.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../vhost_user/fdutil.h" /* fd_count() */
#include "test.h"
#include "util/rec.h"

enum { T_A = 1, T_B, T_LIST, T_FD, T_BYTES, T_INNER };

static const struct rec_field fields[] = {
	{T_A, REC_U32, true, "a"},
	{T_B, REC_U64, false, "b"},
	{T_LIST, REC_LIST, false, "list"},
	{T_FD, REC_FD, false, "fd"},
	{T_BYTES, REC_BYTES, false, "bytes"},
};
#define NF (sizeof(fields) / sizeof(fields[0]))


/* A copy of a finished record built by fill(), in malloc'd memory (the caller frees it). */
static uint8_t *build(void (*fill)(struct rec_writer *w), uint32_t version, size_t *ret_len,
		      uint32_t *ret_nfds)
{
	struct rec_writer w;
	const uint8_t *b;
	uint8_t *copy;

	rec_writer_init(&w, REC_KIND_ENGINE, version);
	fill(&w);
	ASSERT_OK(rec_writer_finish(&w, &b, ret_len));
	copy = malloc(*ret_len);
	ASSERT_TRUE(copy != NULL);
	memcpy(copy, b, *ret_len);
	if (ret_nfds)
		*ret_nfds = w.nfds;
	rec_writer_free(&w);
	return copy;
}

static void fill_good(struct rec_writer *w)
{
	struct iovec iov[2] = {{(void *)"ab", 2}, {(void *)"cde", 3}};

	rec_put_u32(w, T_A, 0xdeadbeef);
	rec_put_u64(w, T_B, 0x0123456789abcdefull);
	rec_begin(w, T_LIST);
	rec_put_u32(w, T_INNER, 7);
	rec_put_u32(w, T_INNER, 8);
	rec_end(w);
	rec_put_fd(w, T_FD, 0);
	rec_put_iov(w, T_BYTES, iov, 2);
}

/* Opens buf with one fake fd (fd numbers are not used by the reader) and scans its body. */
static int open_scan(const uint8_t *buf, size_t len, size_t nfds, struct rec_doc *d,
		     struct rec_val *vals)
{
	static const int fds[2] = {100, 101};
	struct rec_reader r;
	int e = rec_open(d, buf, len, REC_KIND_ENGINE, 1, 2, fds, nfds);

	if (e < 0)
		return e;
	rec_root(d, &r, "test");
	e = rec_scan(&r, fields, NF, vals);
	if (e == 0)
		e = rec_check_fds_claimed(d);
	rec_doc_fini(d);
	return e;
}

TEST(crc32c_check_value)
{
	/* The standard check value of CRC-32C (iSCSI, RFC 3720 B.4 lists it among others). */
	ASSERT_EQ(rec_crc32c(0, "123456789", 9), 0xe3069283u);
	/* Continuation equals the whole. */
	ASSERT_EQ(rec_crc32c(rec_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
	/* The table and the instruction agree, on every length and alignment up to 64. */
	ASSERT_EQ(rec_crc32c_sw(0, "123456789", 9), 0xe3069283u);
	{
		uint8_t b[80];

		for (size_t i = 0; i < sizeof(b); i++)
			b[i] = (uint8_t)(i * 37 + 11);
		for (size_t off = 0; off < 8; off++)
			for (size_t n = 0; n <= 64; n++)
				ASSERT_EQ(rec_crc32c(0x1234, b + off, n), rec_crc32c_sw(0x1234, b + off, n));
	}
}

TEST(round_trip_through_memfd)
{
	struct rec_writer w;
	const uint8_t *b, *m;
	struct rec_val v[NF];
	struct rec_reader r, sub;
	struct rec_item it;
	struct rec_doc d;
	size_t len, mlen;
	uint32_t u, n = 0;
	int fd, pipefd[2];

	ASSERT_OK(pipe(pipefd));
	rec_writer_init(&w, REC_KIND_ENGINE, 2);
	fill_good(&w);
	w.fds[0] = pipefd[0];
	ASSERT_OK(rec_writer_finish(&w, &b, &len));
	ASSERT_OK(rec_memfd(b, len, "test-rec", &fd));
	/* Sealed: nobody can change it under a reader. */
	ASSERT_TRUE(write(fd, "x", 1) < 0);
	ASSERT_OK(rec_map_fd(fd, &m, &mlen));
	ASSERT_EQ(mlen, len);

	ASSERT_OK(rec_open(&d, m, mlen, REC_KIND_ENGINE, 1, 2, w.fds, w.nfds));
	ASSERT_EQ(d.version, 2);
	rec_root(&d, &r, "test");
	ASSERT_OK(rec_scan(&r, fields, NF, v));
	ASSERT_EQ(v[0].u, 0xdeadbeefu);
	ASSERT_EQ_U64(v[1].u, 0x0123456789abcdefull);
	ASSERT_EQ(v[3].u, pipefd[0]);
	ASSERT_EQ(v[4].it.len, 5);
	ASSERT_TRUE(memcmp(v[4].it.val, "abcde", 5) == 0);
	ASSERT_OK(rec_enter(&r, &v[2].it, "list", &sub));
	while (rec_next(&sub, &it) > 0) {
		ASSERT_EQ(it.tag, T_INNER);
		ASSERT_OK(rec_get_u32(&sub, &it, &u));
		ASSERT_EQ(u, 7 + n);
		n++;
	}
	ASSERT_EQ(n, 2);
	ASSERT_OK(rec_check_fds_claimed(&d));
	rec_doc_fini(&d);
	rec_unmap(m, mlen);
	close(fd);
	close(pipefd[0]);
	close(pipefd[1]);
	rec_writer_free(&w);
}

TEST(unsealed_memfd_refused)
{
	const uint8_t *m;
	size_t len;
	int fd = memfd_create("plain", MFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(write(fd, "x", 1), 1);
	ASSERT_ERR(rec_map_fd(fd, &m, &len), EPERM);
	close(fd);
}

TEST(header_refusals)
{
	struct rec_val v[NF];
	struct rec_doc d;
	uint32_t nfds;
	size_t len;
	uint8_t *b = build(fill_good, 1, &len, &nfds);

	ASSERT_EQ(nfds, 1);
	ASSERT_OK(open_scan(b, len, 1, &d, v));

	/* Truncated anywhere: refused by the length field. */
	for (size_t cut = 0; cut < len; cut += 7)
		ASSERT_ERR(open_scan(b, cut, 1, &d, v), EBADMSG);
	/* Wrong fd count. */
	ASSERT_ERR(open_scan(b, len, 0, &d, v), EBADMSG);
	ASSERT_ERR(open_scan(b, len, 2, &d, v), EBADMSG);
	/* Any flipped bit of the body or header: the checksum (or an earlier check) refuses it. */
	for (size_t i = 0; i < len; i++) {
		b[i] ^= 0x10;
		ASSERT_TRUE(open_scan(b, len, 1, &d, v) < 0);
		b[i] ^= 0x10;
	}
	b[len - 1] ^= 1;
	ASSERT_ERR(open_scan(b, len, 1, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "checksum") != NULL);
	b[len - 1] ^= 1;
	/* Unknown version, even with a good checksum. */
	b[12] = 3;
	rec_reseal(b, len);
	ASSERT_ERR(open_scan(b, len, 1, &d, v), EPROTONOSUPPORT);
	ASSERT_TRUE(strstr(rec_error(&d), "version 3") != NULL);
	b[12] = 1;
	/* Another kind. */
	b[8] = 9;
	rec_reseal(b, len);
	ASSERT_ERR(open_scan(b, len, 1, &d, v), EBADMSG);
	b[8] = REC_KIND_ENGINE;
	/* Flags. */
	b[28] = 1;
	rec_reseal(b, len);
	ASSERT_ERR(open_scan(b, len, 1, &d, v), EBADMSG);
	b[28] = 0;
	rec_reseal(b, len);
	ASSERT_OK(open_scan(b, len, 1, &d, v));
	free(b);
}

static void fill_dup(struct rec_writer *w)
{
	rec_put_u32(w, T_A, 1);
	rec_put_u32(w, T_A, 2);
}

static void fill_missing(struct rec_writer *w)
{
	rec_put_u64(w, T_B, 1);
}

static void fill_unknown(struct rec_writer *w)
{
	rec_put_u32(w, T_A, 1);
	rec_put_u32(w, 99, 1);
}

static void fill_badsize(struct rec_writer *w)
{
	rec_put_u64(w, T_A, 1);
}

static void fill_two_fds_one_index(struct rec_writer *w)
{
	rec_put_u32(w, T_A, 1);
	rec_put_fd(w, T_FD, 0);
	rec_put_fd(w, T_INNER, 0); /* a second fd, to be named by the first index below */
}

static void fill_deep(struct rec_writer *w)
{
	rec_put_u32(w, T_A, 1);
	for (unsigned i = 0; i < REC_MAX_DEPTH; i++)
		rec_begin(w, T_LIST);
	for (unsigned i = 0; i < REC_MAX_DEPTH; i++)
		rec_end(w);
}

/* Descends into every list as far as it goes. */
static int walk(struct rec_reader *r)
{
	struct rec_item it;
	int k;

	while ((k = rec_next(r, &it)) > 0) {
		struct rec_reader sub;

		if (it.tag != T_LIST)
			continue;
		k = rec_enter(r, &it, "list", &sub);
		if (k < 0 || (k = walk(&sub)) < 0)
			return k;
	}
	return k;
}

TEST(field_refusals)
{
	struct rec_val v[NF];
	struct rec_reader r;
	struct rec_doc d;
	uint8_t *b;
	size_t len;
	uint32_t nfds;
	static const int fds[2] = {100, 101};

	b = build(fill_dup, 1, &len, NULL);
	ASSERT_ERR(open_scan(b, len, 0, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "a appears twice") != NULL);
	free(b);

	b = build(fill_missing, 1, &len, NULL);
	ASSERT_ERR(open_scan(b, len, 0, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "required field a") != NULL);
	free(b);

	b = build(fill_unknown, 1, &len, NULL);
	ASSERT_ERR(open_scan(b, len, 0, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "unknown field 0x63") != NULL);
	free(b);

	b = build(fill_badsize, 1, &len, NULL);
	ASSERT_ERR(open_scan(b, len, 0, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "expected 4") != NULL);
	free(b);

	/* An fd item naming an index past the fd array, or naming one fd twice. */
	b = build(fill_two_fds_one_index, 1, &len, &nfds);
	ASSERT_EQ(nfds, 2);
	/* The second fd item (T_INNER, outside the schema) names index 1: point it at 0. */
	b[len - 4] = 0;
	rec_reseal(b, len);
	ASSERT_OK(rec_open(&d, b, len, REC_KIND_ENGINE, 1, 1, fds, 2));
	{
		struct rec_item it;
		int fd;

		rec_root(&d, &r, "test");
		ASSERT_EQ(rec_next(&r, &it), 1);
		ASSERT_EQ(rec_next(&r, &it), 1);
		ASSERT_OK(rec_get_fd(&r, &it, &fd));
		ASSERT_EQ(fd, 100);
		ASSERT_EQ(rec_next(&r, &it), 1);
		ASSERT_ERR(rec_get_fd(&r, &it, &fd), EBADMSG);
		ASSERT_TRUE(strstr(rec_error(&d), "named twice") != NULL);
		ASSERT_ERR(rec_check_fds_claimed(&d), EBADMSG);
		b[len - 4] = 5;
		ASSERT_ERR(rec_get_fd(&r, &it, &fd), EBADMSG);
		ASSERT_TRUE(strstr(rec_error(&d), "fd index 5") != NULL);
	}
	rec_doc_fini(&d);
	free(b);

	/* REC_MAX_DEPTH levels are read; one more, which the writer cannot write, is refused. */
	b = build(fill_deep, 1, &len, NULL);
	ASSERT_OK(rec_open(&d, b, len, REC_KIND_ENGINE, 1, 1, NULL, 0));
	rec_root(&d, &r, "test");
	ASSERT_OK(walk(&r));
	rec_doc_fini(&d);
	free(b);
	{
		struct rec_writer w;

		rec_writer_init(&w, REC_KIND_ENGINE, 1);
		for (unsigned i = 0; i <= REC_MAX_DEPTH; i++)
			rec_begin(&w, T_LIST);
		ASSERT_ERR(rec_writer_finish(&w, (const uint8_t **)&b, &len), E2BIG);
		rec_writer_free(&w);
	}
	{
		/* By hand: REC_MAX_DEPTH + 1 lists, each holding the next. */
		size_t n = REC_HDR_SIZE + 8 * (REC_MAX_DEPTH + 1);

		b = calloc(1, n);
		ASSERT_TRUE(b != NULL);
		memcpy(b, REC_MAGIC, 8);
		b[8] = REC_KIND_ENGINE;
		b[12] = 1;
		b[16] = (uint8_t)n;
		for (unsigned i = 0; i <= REC_MAX_DEPTH; i++) {
			uint8_t *it = b + REC_HDR_SIZE + 8 * i;

			it[0] = T_LIST;
			it[4] = (uint8_t)(8 * (REC_MAX_DEPTH - i));
		}
		rec_reseal(b, n);
		ASSERT_OK(rec_open(&d, b, n, REC_KIND_ENGINE, 1, 1, NULL, 0));
		rec_root(&d, &r, "test");
		ASSERT_ERR(walk(&r), EBADMSG);
		ASSERT_TRUE(strstr(rec_error(&d), "too deep") != NULL);
		rec_doc_fini(&d);
		free(b);
	}
}

TEST(item_bounds)
{
	struct rec_val v[NF];
	struct rec_doc d;
	size_t len;
	uint8_t *b = build(fill_good, 1, &len, NULL);

	/* The first item's length points past the end of the record. */
	b[REC_HDR_SIZE + 4] = 0xff;
	b[REC_HDR_SIZE + 5] = 0xff;
	rec_reseal(b, len);
	ASSERT_ERR(open_scan(b, len, 1, &d, v), EBADMSG);
	ASSERT_TRUE(strstr(rec_error(&d), "only") != NULL);
	free(b);

	/* A nested list whose inner item overruns the list (but not the record). */
	b = build(fill_good, 1, &len, NULL);
	{
		/* T_A (12 bytes) and T_B (16) come first; then the list header and its first item. */
		size_t inner = REC_HDR_SIZE + 12 + 16 + 8;
		static const int one_fd[1] = {1};
		struct rec_reader r, sub;

		b[inner + 4] = 20; /* longer than the 24-byte list it sits in allows */
		rec_reseal(b, len);
		ASSERT_OK(open_scan(b, len, 1, &d, v)); /* the top level is intact */
		ASSERT_OK(rec_open(&d, b, len, REC_KIND_ENGINE, 1, 1, one_fd, 1));
		rec_root(&d, &r, "test");
		ASSERT_OK(rec_scan(&r, fields, NF, v));
		ASSERT_OK(rec_enter(&r, &v[2].it, "list", &sub));
		ASSERT_ERR(walk(&sub), EBADMSG);
		rec_doc_fini(&d);
	}
	free(b);
}

TEST(writer_errors_are_sticky)
{
	struct rec_writer w;
	const uint8_t *b;
	size_t len;

	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	rec_end(&w); /* unbalanced */
	rec_put_u32(&w, T_A, 1);
	ASSERT_ERR(rec_writer_finish(&w, &b, &len), EINVAL);
	rec_writer_free(&w);

	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	rec_begin(&w, T_LIST); /* never ended */
	ASSERT_ERR(rec_writer_finish(&w, &b, &len), EINVAL);
	rec_writer_free(&w);

	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	rec_put_u32(&w, 0, 1); /* tag 0 is reserved */
	ASSERT_ERR(rec_writer_finish(&w, &b, &len), EINVAL);
	rec_writer_free(&w);
}


#define XFER_N 260 /* two batches: 250 + 10 */

TEST(pass_record_and_fds_over_seqpacket)
{
	int sv[2], fds[XFER_N], memfd, got_memfd, *got = NULL, before;
	const uint8_t *b, *m;
	struct rec_writer w;
	struct rec_doc d;
	size_t len, mlen, n = 0;

	ASSERT_OK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
	before = fd_count();
	/* Each fd a memfd whose size is its index: the order is checked at the other end. */
	for (int i = 0; i < XFER_N; i++) {
		fds[i] = memfd_create("x", MFD_CLOEXEC);
		ASSERT_TRUE(fds[i] >= 0);
		ASSERT_OK(ftruncate(fds[i], i));
	}
	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	for (int i = 0; i < XFER_N; i++)
		rec_put_fd(&w, T_FD, fds[i]);
	ASSERT_OK(rec_writer_finish(&w, &b, &len));
	ASSERT_OK(rec_memfd(b, len, "test-rec", &memfd));
	ASSERT_OK(rec_send(sv[0], memfd, w.fds, w.nfds));
	rec_writer_free(&w);
	close(memfd);
	for (int i = 0; i < XFER_N; i++)
		close(fds[i]);

	ASSERT_OK(rec_recv(sv[1], 5000, &got_memfd, &got, &n));
	ASSERT_EQ(n, XFER_N);
	for (size_t i = 0; i < n; i++) {
		struct stat st;

		ASSERT_OK(fstat(got[i], &st));
		ASSERT_EQ(st.st_size, (off_t)i);
		ASSERT_TRUE(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
	}
	ASSERT_OK(rec_map_fd(got_memfd, &m, &mlen));
	ASSERT_OK(rec_open(&d, m, mlen, REC_KIND_ENGINE, 1, 1, got, n));
	rec_doc_fini(&d);
	rec_unmap(m, mlen);
	close(got_memfd);
	for (size_t i = 0; i < n; i++)
		close(got[i]);
	free(got);
	ASSERT_EQ(fd_count(), before);
	close(sv[0]);
	close(sv[1]);
}

/* Sends raw transfer messages: the header claiming `claim` fds, then one batch of `batch` fds
 * that says it holds `says`. */
static void send_raw(int sock, uint32_t claim, int batch, uint32_t says)
{
	char cbuf[CMSG_SPACE(8 * sizeof(int))] __attribute__((aligned(8)));
	uint8_t hdr[16] = "UVSKFDS1";
	int fds[8];
	struct iovec iov = {hdr, 16};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf};
	struct cmsghdr *c;

	for (int i = 0; i < 8; i++)
		fds[i] = dup(0);
	hdr[8] = (uint8_t)claim;
	msg.msg_controllen = CMSG_SPACE(sizeof(int));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), fds, sizeof(int));
	ASSERT_EQ(sendmsg(sock, &msg, 0), 16);
	if (batch >= 0) {
		uint8_t b[8] = {0, 0, 0, 0, (uint8_t)says, 0, 0, 0};

		iov = (struct iovec){b, 8};
		msg.msg_controllen = batch ? CMSG_SPACE(batch * sizeof(int)) : 0;
		msg.msg_control = batch ? cbuf : NULL;
		if (batch) {
			c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(batch * sizeof(int));
			memcpy(CMSG_DATA(c), fds + 1, batch * sizeof(int));
		}
		ASSERT_EQ(sendmsg(sock, &msg, 0), 8);
	}
	for (int i = 0; i < 8; i++)
		close(fds[i]);
}

TEST(recv_refusals_close_everything)
{
	int sv[2], memfd, *got, before;
	size_t n;

	ASSERT_OK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
	before = fd_count();
	/* Nothing comes: a timeout. */
	ASSERT_ERR(rec_recv(sv[1], 50, &memfd, &got, &n), ETIMEDOUT);
	/* A header for 3 fds, then a batch that says 3 and brings 2. */
	send_raw(sv[0], 3, 2, 3);
	ASSERT_ERR(rec_recv(sv[1], 1000, &memfd, &got, &n), EBADMSG);
	ASSERT_EQ(fd_count(), before);
	/* A header for 3, a batch of 2 saying 2, then nothing: a timeout, all closed. */
	send_raw(sv[0], 3, 2, 2);
	ASSERT_ERR(rec_recv(sv[1], 50, &memfd, &got, &n), ETIMEDOUT);
	ASSERT_EQ(fd_count(), before);
	/* A header for 2, then the sender goes away. */
	send_raw(sv[0], 2, -1, 0);
	close(sv[0]);
	ASSERT_ERR(rec_recv(sv[1], 1000, &memfd, &got, &n), ECONNRESET);
	close(sv[1]);
	ASSERT_EQ(fd_count(), before - 2);
}

TEST_MAIN()
