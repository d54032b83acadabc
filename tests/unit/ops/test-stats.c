/* SPDX-License-Identifier: MIT */
/* Per-VM counters: names, sum, relaxed snapshot under a concurrent writer, bridge mapping. */
#include <pthread.h>

#include "device/device.h"
#include "ops/stats.h"
#include "test.h"

TEST(drop_reason_names)
{
	ASSERT_STREQ(ops_drop_reason_name(OPS_DROP_SPOOFED_CID), "spoofed_cid");
	ASSERT_STREQ(ops_drop_reason_name(OPS_DROP_NO_ROUTE), "no_route");
	ASSERT_STREQ(ops_drop_reason_name(OPS_DROP_MALFORMED), "malformed");
	ASSERT_STREQ(ops_drop_reason_name(_OPS_DROP_MAX), "unknown");
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		ASSERT_TRUE(strcmp(ops_drop_reason_name(i), "unknown") != 0);
}

TEST(add_and_gauge)
{
	struct ops_vm_counters a = { 0 }, b = { 0 };

	OPS_CTR_INC(&a, conns_open);
	OPS_CTR_INC(&a, conns_open);
	OPS_CTR_DEC(&a, conns_open);
	OPS_CTR_ADD(&a, tx_bytes, 1000);
	OPS_CTR_DROP(&a, OPS_DROP_OVERSIZE);
	ASSERT_EQ_U64(a.conns_open, 1);
	b.tx_bytes = 5;
	b.dropped[OPS_DROP_OVERSIZE] = 2;
	ops_counters_add(&b, &a);
	ASSERT_EQ_U64(b.tx_bytes, 1005);
	ASSERT_EQ_U64(b.conns_open, 1);
	ASSERT_EQ_U64(b.dropped[OPS_DROP_OVERSIZE], 3);
}

static struct ops_vm_counters shared;
#define WRITES 2000000u

static void *writer(void *arg)
{
	for (unsigned i = 0; i < WRITES; i++) {
		OPS_CTR_INC(&shared, tx_pkts);
		OPS_CTR_ADD(&shared, tx_bytes, 2);
	}
	return arg;
}

/* A reader never sees a counter go backwards, and sees the final values after join. */
TEST(snapshot_under_concurrent_writer)
{
	pthread_t th;
	uint64_t last = 0;

	ASSERT_EQ(pthread_create(&th, NULL, writer, NULL), 0);
	for (int i = 0; i < 100000; i++) {
		struct ops_vm_counters s;

		ops_counters_read(&shared, &s);
		ASSERT_TRUE(s.tx_pkts >= last);
		ASSERT_TRUE(s.tx_pkts <= WRITES);
		last = s.tx_pkts;
	}
	pthread_join(th, NULL);
	struct ops_vm_counters s;
	ops_counters_read(&shared, &s);
	ASSERT_EQ_U64(s.tx_pkts, WRITES);
	ASSERT_EQ_U64(s.tx_bytes, 2ull * WRITES);
}

TEST(from_sources_mapping)
{
	struct vsock_dev_stats d = {
		.tx_pkts = 10, .tx_bytes = 1000, .rx_pkts = 20, .rx_bytes = 2000,
		.tx_bad_chain = 1, .tx_bad_src_cid = 2, .tx_bad_dst_cid = 3, .sibling_dropped = 4,
		.ring_errors = 5, .guest_conns_refused = 6,
	};
	struct vsock_engine_stats e = {
		.rst_sent = 7, .rst_received = 8, .credit_stalls = 9, .socks_open = 12,
		.socks_total = 40, .backlog_refused = 50,
	};
	struct ops_vm_counters c;

	e.rx_dropped[VSOCK_HDR_BAD_OP] = 11;
	e.rx_dropped[VSOCK_HDR_BAD_TYPE] = 13;
	e.rx_dropped[VSOCK_HDR_OVERSIZE] = 17;
	e.rx_dropped[VSOCK_HDR_BAD_LEN] = 100;
	e.rx_dropped[VSOCK_HDR_BAD_FLAGS] = 200;
	e.rx_dropped[VSOCK_HDR_BAD_CID] = 400;
	ops_counters_from_sources(&c, &d, &e, 2);
	ASSERT_EQ_U64(c.tx_pkts, 10);
	ASSERT_EQ_U64(c.tx_bytes, 1000);
	ASSERT_EQ_U64(c.rx_pkts, 20);
	ASSERT_EQ_U64(c.rx_bytes, 2000);
	ASSERT_EQ_U64(c.ring_errors, 5);
	ASSERT_EQ_U64(c.host_connects_refused, 56); /* device refusals + full backlog */
	ASSERT_EQ_U64(c.rst_sent, 7);
	ASSERT_EQ_U64(c.rst_received, 8);
	ASSERT_EQ_U64(c.credit_stalls, 9);
	ASSERT_EQ_U64(c.conns_open, 10);
	ASSERT_EQ_U64(c.conns_total, 38);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_SPOOFED_CID], 2);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_NO_ROUTE], 7);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_BAD_OP], 11);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_BAD_TYPE], 13);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_OVERSIZE], 17);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_MALFORMED], 701);

	/* No engine (no VMM): engine-derived values are zero; fewer sockets than listeners. */
	ops_counters_from_sources(&c, &d, NULL, 2);
	ASSERT_EQ_U64(c.rst_sent, 0);
	ASSERT_EQ_U64(c.dropped[OPS_DROP_MALFORMED], 1);
	e.socks_open = 1;
	ops_counters_from_sources(&c, NULL, &e, 2);
	ASSERT_EQ_U64(c.conns_open, 0);
	ASSERT_EQ_U64(c.tx_pkts, 0);
}

TEST_MAIN()
