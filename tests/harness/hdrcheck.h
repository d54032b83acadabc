/* SPDX-License-Identifier: MIT */
/*
 * ASSERT_HDR_EQ: two decoded packet headers (struct vsock_hdr, src/vsock/hdr.h) agree field by
 * field; a failure names the field and the caller's line. For the header codec's tests
 * (tests/unit/vsock/test-hdr.c) and for what a capture recorded (tests/unit/ops/test-pcap.c).
 */
#ifndef UVSOCK_TESTS_HDRCHECK_H
#define UVSOCK_TESTS_HDRCHECK_H

#include "test.h"
#include "vsock/hdr.h"

#define ASSERT_HDR_EQ(got, want)                                                                   \
	do {                                                                                       \
		const struct vsock_hdr *g_ = (got), *w_ = (want);                                  \
		ASSERT_EQ_U64(g_->src_cid, w_->src_cid);                                           \
		ASSERT_EQ_U64(g_->dst_cid, w_->dst_cid);                                           \
		ASSERT_EQ(g_->src_port, w_->src_port);                                             \
		ASSERT_EQ(g_->dst_port, w_->dst_port);                                             \
		ASSERT_EQ(g_->len, w_->len);                                                       \
		ASSERT_EQ(g_->type, w_->type);                                                     \
		ASSERT_EQ(g_->op, w_->op);                                                         \
		ASSERT_EQ(g_->flags, w_->flags);                                                   \
		ASSERT_EQ(g_->buf_alloc, w_->buf_alloc);                                           \
		ASSERT_EQ(g_->fwd_cnt, w_->fwd_cnt);                                               \
	} while (0)

#endif
