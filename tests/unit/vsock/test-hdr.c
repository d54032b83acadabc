/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the virtio-vsock header: wire round-trips (little-endian, unaligned), the
 * validation rules of vsock_hdr_check() and the name tables.
 */
#include "hdrcheck.h"
#include "test.h"
#include "vsock/hdr.h"

static struct vsock_hdr good_hdr(void)
{
	struct vsock_hdr h = {
		.src_cid = 3, .dst_cid = 2, .src_port = 1234, .dst_port = 5678, .len = 0,
		.type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_REQUEST, .flags = 0,
		.buf_alloc = 262144, .fwd_cnt = 0,
	};
	return h;
}

TEST(roundtrip_all_fields)
{
	struct vsock_hdr h = {
		.src_cid = 0x11223344u, .dst_cid = 0xfffffffeu, .src_port = 0xa1b2c3d4u,
		.dst_port = 0x01020304u, .len = 65536, .type = VSOCK_TYPE_SEQPACKET,
		.op = VSOCK_OP_RW, .flags = 3, .buf_alloc = 0xdeadbeefu, .fwd_cnt = 0xffffffffu,
	};
	struct vsock_hdr d;
	uint8_t buf[VSOCK_HDR_SIZE + 1];

	/* Odd offset: accessors must not assume alignment. */
	vsock_hdr_encode(&h, buf + 1);
	vsock_hdr_decode(buf + 1, &d);
	ASSERT_HDR_EQ(&d, &h);
}

TEST(wire_layout_is_little_endian)
{
	struct vsock_hdr h = good_hdr();
	uint8_t buf[VSOCK_HDR_SIZE];

	h.src_cid = 0x0102030405060708ull;
	h.op = VSOCK_OP_RW;
	h.len = 0x11223344u;
	h.buf_alloc = 0x40000;
	vsock_hdr_encode(&h, buf);
	ASSERT_EQ(buf[0], 0x08);
	ASSERT_EQ(buf[7], 0x01);
	ASSERT_EQ(buf[24], 0x44);
	ASSERT_EQ(buf[27], 0x11);
	ASSERT_EQ(buf[28], VSOCK_TYPE_STREAM);
	ASSERT_EQ(buf[29], 0);
	ASSERT_EQ(buf[30], VSOCK_OP_RW);
	ASSERT_EQ(buf[36], 0x00);
	ASSERT_EQ(buf[38], 0x04);
}

TEST(check_accepts_valid)
{
	struct vsock_hdr h = good_hdr();

	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_OK);
	h.op = VSOCK_OP_RW;
	h.len = 100;
	ASSERT_EQ(vsock_hdr_check(&h, 100), VSOCK_HDR_OK);
	h.len = VSOCK_MAX_PKT_PAYLOAD;
	ASSERT_EQ(vsock_hdr_check(&h, VSOCK_MAX_PKT_PAYLOAD), VSOCK_HDR_OK);
	h.type = VSOCK_TYPE_SEQPACKET;
	h.flags = VSOCK_SEQ_EOM | VSOCK_SEQ_EOR;
	ASSERT_EQ(vsock_hdr_check(&h, h.len), VSOCK_HDR_OK);
	h = good_hdr();
	h.op = VSOCK_OP_SHUTDOWN;
	h.flags = 3;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_OK);
	/* STREAM RW flags carry no meaning; Linux ignores them, so do we. */
	h = good_hdr();
	h.op = VSOCK_OP_RW;
	h.flags = 0x80;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_OK);
}

TEST(check_rejects_upper_cid_bits)
{
	struct vsock_hdr h = good_hdr();

	h.src_cid = 1ull << 32 | 3;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_CID);
	h = good_hdr();
	h.dst_cid = 1ull << 63 | 2;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_CID);
	h = good_hdr();
	h.src_cid = VMADDR_CID_ANY;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_CID);
}

TEST(check_rejects_bad_op_and_type)
{
	struct vsock_hdr h = good_hdr();

	h.op = 8;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_OP);
	h.op = 0xffff;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_OP);
	h = good_hdr();
	h.type = 3; /* DGRAM proposals: not standard */
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_TYPE);
	h.type = 0;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_TYPE);
}

TEST(check_rejects_oversize_and_len_mismatch)
{
	struct vsock_hdr h = good_hdr();

	h.op = VSOCK_OP_RW;
	h.len = VSOCK_MAX_PKT_PAYLOAD + 1;
	ASSERT_EQ(vsock_hdr_check(&h, h.len), VSOCK_HDR_OVERSIZE);
	h.len = 0xffffffffu;
	ASSERT_EQ(vsock_hdr_check(&h, 10), VSOCK_HDR_OVERSIZE);
	h.len = 10;
	ASSERT_EQ(vsock_hdr_check(&h, 9), VSOCK_HDR_BAD_LEN);
	ASSERT_EQ(vsock_hdr_check(&h, 11), VSOCK_HDR_BAD_LEN);
	/* Control ops carry no payload. */
	for (unsigned op = 0; op < _VSOCK_OP_MAX; op++) {
		if (op == VSOCK_OP_RW)
			continue;
		h = good_hdr();
		h.op = op;
		h.len = 1;
		ASSERT_EQ(vsock_hdr_check(&h, 1), VSOCK_HDR_BAD_LEN);
	}
}

TEST(check_rejects_bad_flags)
{
	struct vsock_hdr h = good_hdr();

	h.op = VSOCK_OP_SHUTDOWN;
	h.flags = 4;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_FLAGS);
	h = good_hdr();
	h.op = VSOCK_OP_RW;
	h.type = VSOCK_TYPE_SEQPACKET;
	h.flags = VSOCK_SEQ_EOR; /* EOR only together with EOM */
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_FLAGS);
	h.flags = 4;
	ASSERT_EQ(vsock_hdr_check(&h, 0), VSOCK_HDR_BAD_FLAGS);
}

TEST(names)
{
	ASSERT_STREQ(vsock_op_to_string(VSOCK_OP_CREDIT_REQUEST), "CREDIT_REQUEST");
	ASSERT_STREQ(vsock_op_to_string(VSOCK_OP_RST), "RST");
	ASSERT_STREQ(vsock_op_to_string(99), "unknown");
	ASSERT_STREQ(vsock_type_to_string(VSOCK_TYPE_SEQPACKET), "SEQPACKET");
	ASSERT_STREQ(vsock_type_to_string(7), "unknown");
	for (int i = 0; i < _VSOCK_HDR_ERROR_MAX; i++)
		ASSERT_TRUE(vsock_hdr_error_to_string(i) != NULL &&
			    strcmp(vsock_hdr_error_to_string(i), "unknown") != 0);
	ASSERT_STREQ(vsock_hdr_error_to_string(VSOCK_HDR_OVERSIZE), "oversize");
}

TEST_MAIN()
