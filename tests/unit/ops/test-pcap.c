/* SPDX-License-Identifier: MIT */
/*
 * vsockmon pcap writer: the file is read back and parsed here byte by byte (tests/capture checks
 * the same files with tshark). Covers headers, op mapping, snap length, size limit, timestamps,
 * taps (attach, detach, busy), concurrent writers through two taps into one file, and a pipe
 * whose reader is slow (whole records dropped, stream still valid).
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hdrcheck.h"
#include "ops/pcap.h"
#include "test.h"

static int memfile(void)
{
	int fd = memfd_create("pcap", MFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	return fd;
}

/* Reads the whole memfd (duplicated fd) into a malloc'd buffer. */
static uint8_t *slurp(int fd, size_t *len)
{
	off_t n = lseek(fd, 0, SEEK_END);
	uint8_t *b = malloc((size_t)n + 1);

	ASSERT_TRUE(b != NULL);
	ASSERT_EQ(pread(fd, b, (size_t)n, 0), n);
	*len = (size_t)n;
	return b;
}

static struct vsock_hdr mkhdr(uint16_t op, uint32_t len)
{
	struct vsock_hdr h = {
		.src_cid = 3, .dst_cid = 2, .src_port = 1234, .dst_port = 5000, .len = len,
		.type = VSOCK_TYPE_STREAM, .op = op, .buf_alloc = 262144, .fwd_cnt = 77,
	};
	return h;
}

TEST(op_mapping_as_linux)
{
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_REQUEST), OPS_VSOCKMON_OP_CONNECT);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_RESPONSE), OPS_VSOCKMON_OP_CONNECT);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_RST), OPS_VSOCKMON_OP_DISCONNECT);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_SHUTDOWN), OPS_VSOCKMON_OP_DISCONNECT);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_RW), OPS_VSOCKMON_OP_PAYLOAD);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_CREDIT_UPDATE), OPS_VSOCKMON_OP_CONTROL);
	ASSERT_EQ(ops_vsockmon_op(VSOCK_OP_CREDIT_REQUEST), OPS_VSOCKMON_OP_CONTROL);
	ASSERT_EQ(ops_vsockmon_op(0), OPS_VSOCKMON_OP_UNKNOWN);
	ASSERT_EQ(ops_vsockmon_op(99), OPS_VSOCKMON_OP_UNKNOWN);
}

TEST(file_layout)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_pcap *p;
	struct vsock_hdr h = mkhdr(VSOCK_OP_RW, 5), d;
	struct iovec iov[2] = { { "he", 2 }, { "llo", 3 } };
	struct ops_pcap_status st;
	size_t len;

	ASSERT_OK(ops_pcap_open_fd(fd, NULL, &p));
	ops_pcap_write(p, &h, iov, 2, 1700000000123456789ull);
	ops_pcap_get_status(p, &st);
	ASSERT_EQ_U64(st.pkts, 1);
	ASSERT_EQ_U64(st.bytes, 24 + 16 + 32 + 44 + 5);
	ops_pcap_unref(p);

	uint8_t *b = slurp(dfd, &len);
	ASSERT_EQ(len, 24 + 16 + 32 + 44 + 5);
	ASSERT_EQ(vsock_le32_get_(b), 0xa1b2c3d4u);
	ASSERT_EQ(vsock_le16_get_(b + 4), 2);
	ASSERT_EQ(vsock_le16_get_(b + 6), 4);
	ASSERT_EQ(vsock_le32_get_(b + 16), OPS_PCAP_SNAPLEN_MAX);
	ASSERT_EQ(vsock_le32_get_(b + 20), 271);
	uint8_t *r = b + 24;
	ASSERT_EQ(vsock_le32_get_(r), 1700000000u);
	ASSERT_EQ(vsock_le32_get_(r + 4), 123456);
	ASSERT_EQ(vsock_le32_get_(r + 8), 81);
	ASSERT_EQ(vsock_le32_get_(r + 12), 81);
	uint8_t *m = r + 16;
	ASSERT_EQ_U64(vsock_le64_get_(m), 3);
	ASSERT_EQ_U64(vsock_le64_get_(m + 8), 2);
	ASSERT_EQ(vsock_le32_get_(m + 16), 1234);
	ASSERT_EQ(vsock_le32_get_(m + 20), 5000);
	ASSERT_EQ(vsock_le16_get_(m + 24), OPS_VSOCKMON_OP_PAYLOAD);
	ASSERT_EQ(vsock_le16_get_(m + 26), 2);
	ASSERT_EQ(vsock_le16_get_(m + 28), 44);
	ASSERT_EQ(m[30] | m[31], 0);
	vsock_hdr_decode(m + 32, &d);
	ASSERT_HDR_EQ(&d, &h);
	ASSERT_MEMEQ(m + 32 + 44, "hello", 5);
	free(b);
	close(dfd);
}

TEST(nanosecond_and_snaplen)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_pcap_opts o = { .nanosecond = true, .snaplen = 80 };
	struct ops_pcap *p;
	char payload[1000];
	struct iovec iov = { payload, sizeof(payload) };
	struct vsock_hdr h = mkhdr(VSOCK_OP_RW, sizeof(payload));
	size_t len;

	memset(payload, 'x', sizeof(payload));
	ASSERT_OK(ops_pcap_open_fd(fd, &o, &p));
	ops_pcap_write(p, &h, &iov, 1, 5000000007ull);
	ops_pcap_unref(p);
	uint8_t *b = slurp(dfd, &len);
	ASSERT_EQ(vsock_le32_get_(b), 0xa1b23c4du);
	ASSERT_EQ(vsock_le32_get_(b + 16), 80);
	ASSERT_EQ(vsock_le32_get_(b + 24), 5);
	ASSERT_EQ(vsock_le32_get_(b + 28), 7);
	ASSERT_EQ(vsock_le32_get_(b + 32), 80);
	ASSERT_EQ(vsock_le32_get_(b + 36), 32 + 44 + 1000);
	ASSERT_EQ(len, 24 + 16 + 80);
	free(b);
	close(dfd);
}

TEST(snaplen_below_headers_is_rejected)
{
	struct ops_pcap_opts o = { .snaplen = 75 };
	struct ops_pcap *p = NULL;

	ASSERT_ERR(ops_pcap_open_fd(memfile(), &o, &p), EINVAL);
	ASSERT_TRUE(p == NULL);
}

TEST(payload_shorter_than_len_is_not_overread)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_pcap *p;
	struct iovec iov = { "abc", 3 };
	struct vsock_hdr h = mkhdr(VSOCK_OP_RW, 100);
	size_t len;

	ASSERT_OK(ops_pcap_open_fd(fd, NULL, &p));
	ops_pcap_write(p, &h, &iov, 1, 1);
	ops_pcap_unref(p);
	uint8_t *b = slurp(dfd, &len);
	ASSERT_EQ(len, 24 + 16 + 76 + 3);
	ASSERT_EQ(vsock_le32_get_(b + 24 + 12), 79);
	free(b);
	close(dfd);
}

TEST(size_limit_drops_whole_records)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_pcap_opts o = { .max_bytes = 24 + 3 * (16 + 76) + 10 };
	struct ops_pcap *p;
	struct vsock_hdr h = mkhdr(VSOCK_OP_CREDIT_UPDATE, 0);
	struct ops_pcap_status st;
	size_t len;

	ASSERT_OK(ops_pcap_open_fd(fd, &o, &p));
	for (int i = 0; i < 10; i++)
		ops_pcap_write(p, &h, NULL, 0, 0);
	ops_pcap_get_status(p, &st);
	ASSERT_EQ_U64(st.pkts, 3);
	ASSERT_EQ_U64(st.dropped, 7);
	ops_pcap_unref(p);
	uint8_t *b = slurp(dfd, &len);
	ASSERT_EQ(len, 24 + 3 * 92);
	free(b);
	close(dfd);
}

TEST(open_path_never_overwrites)
{
	char dir[] = "/tmp/uvsock-pcap-XXXXXX", path[64];
	struct ops_pcap *p;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/a.pcap", dir);
	ASSERT_OK(ops_pcap_open_path(path, NULL, &p));
	ops_pcap_unref(p);
	ASSERT_ERR(ops_pcap_open_path(path, NULL, &p), EEXIST);
	char link[80];
	snprintf(link, sizeof(link), "%s/l.pcap", dir);
	ASSERT_EQ(symlink("/nonexistent/x", link), 0);
	ASSERT_ERR(ops_pcap_open_path(link, NULL, &p), EEXIST);
	unlink(link);
	unlink(path);
	rmdir(dir);
}

TEST(tap_attach_detach)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_tap t;
	struct ops_pcap *p, *q;
	struct vsock_hdr h = mkhdr(VSOCK_OP_REQUEST, 0);
	struct ops_pcap_status st;

	ops_tap_init(&t);
	OPS_TAP(&t, &h, NULL, 0); /* off: nothing happens */
	ASSERT_FALSE(ops_tap_attached(&t));
	ASSERT_OK(ops_pcap_open_fd(fd, NULL, &p));
	ASSERT_OK(ops_tap_attach(&t, p));
	ASSERT_OK(ops_pcap_open_fd(memfile(), NULL, &q));
	ASSERT_ERR(ops_tap_attach(&t, q), EBUSY);
	ops_pcap_unref(q);
	OPS_TAP(&t, &h, NULL, 0);
	OPS_TAP(&t, &h, NULL, 0);
	ASSERT_TRUE(ops_tap_detach(&t));
	ASSERT_FALSE(ops_tap_detach(&t));
	OPS_TAP(&t, &h, NULL, 0); /* detached: not written */
	ops_pcap_get_status(p, &st);
	ASSERT_EQ_U64(st.pkts, 2);
	ops_pcap_unref(p); /* last reference: flushed, closed */
	ASSERT_EQ(lseek(dfd, 0, SEEK_END), 24 + 2 * 92);
	ops_tap_destroy(&t);
	close(dfd);
}

struct writer_arg {
	struct ops_tap *tap;
	uint32_t cid;
	int n;
	atomic_int sent; /* packets offered to the tap so far (relaxed: a progress count only) */
};

static void *tap_writer(void *arg)
{
	struct writer_arg *a = arg;
	char buf[300];

	memset(buf, (int)a->cid, sizeof(buf));
	for (int i = 0; i < a->n; i++) {
		struct vsock_hdr h = mkhdr(VSOCK_OP_RW, (uint32_t)(i % 300));
		struct iovec iov = { buf, (size_t)(i % 300) };

		h.src_cid = a->cid;
		OPS_TAP(a->tap, &h, &iov, 1);
		atomic_fetch_add_explicit(&a->sent, 1, memory_order_relaxed);
	}
	return NULL;
}

/* Two VM threads write through their taps into one file while the control thread detaches. */
TEST(two_vms_one_file_concurrently)
{
	int fd = memfile(), dfd = dup(fd);
	struct ops_tap t[2];
	struct ops_pcap *p;
	pthread_t th[2];
	struct writer_arg a[2] = { { &t[0], 3, 20000 }, { &t[1], 4, 20000 } };
	size_t len, off;
	uint64_t recs[2] = { 0 };

	ASSERT_OK(ops_pcap_open_fd(fd, NULL, &p));
	for (int i = 0; i < 2; i++) {
		ops_tap_init(&t[i]);
		ASSERT_OK(ops_tap_attach(&t[i], p));
	}
	ops_pcap_unref(p); /* the taps hold it now */
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(pthread_create(&th[i], NULL, tap_writer, &a[i]), 0);
	ASSERT_WAIT_FOR(atomic_load_explicit(&a[1].sent, memory_order_relaxed) > 0, 5000);
	ops_tap_detach(&t[1]); /* mid-stream, while thread 1 may be writing */
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	ops_tap_destroy(&t[0]); /* last reference: file complete */
	ops_tap_destroy(&t[1]);

	uint8_t *b = slurp(dfd, &len);
	off = 24;
	while (off < len) {
		ASSERT_LE(off + 16, len);
		uint32_t incl = vsock_le32_get_(b + off + 8);
		struct vsock_hdr h;

		ASSERT_LE(off + 16 + incl, len);
		vsock_hdr_decode(b + off + 16 + 32, &h);
		ASSERT_EQ(incl, 76 + h.len);
		ASSERT_TRUE(h.src_cid == 3 || h.src_cid == 4);
		for (uint32_t k = 0; k < h.len; k++)
			ASSERT_EQ(b[off + 16 + 76 + k], h.src_cid);
		recs[h.src_cid - 3]++;
		off += 16 + incl;
	}
	ASSERT_EQ(off, len);
	ASSERT_EQ_U64(recs[0], 20000);
	ASSERT_LE(recs[1], 20000);
	free(b);
	close(dfd);
}

/* A pipe nobody reads: the writer never blocks; records are dropped whole. */
TEST(full_pipe_drops_without_blocking)
{
	int pfd[2];
	struct ops_pcap *p;
	char payload[4000];
	struct iovec iov = { payload, sizeof(payload) };
	struct vsock_hdr h = mkhdr(VSOCK_OP_RW, sizeof(payload));
	struct ops_pcap_status st;
	uint8_t hdr[24];

	ASSERT_EQ(pipe(pfd), 0);
	memset(payload, 'z', sizeof(payload));
	ASSERT_OK(ops_pcap_open_fd(pfd[1], NULL, &p));
	for (int i = 0; i < 1000; i++)
		ops_pcap_write(p, &h, &iov, 1, 0);
	ASSERT_EQ(ops_pcap_flush(p), 0);
	ops_pcap_get_status(p, &st);
	ASSERT_GT(st.dropped, 0);
	ASSERT_EQ_U64(st.pkts + st.dropped, 1000);
	ASSERT_EQ(read(pfd[0], hdr, sizeof(hdr)), 24);
	ASSERT_EQ(vsock_le32_get_(hdr), 0xa1b2c3d4u);
	ops_pcap_unref(p);
	close(pfd[0]);
}

TEST_MAIN()
