/* SPDX-License-Identifier: MIT */
/* Per-VM counters: names, sum, relaxed snapshot under a concurrent writer. */
#include <pthread.h>

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

TEST_MAIN()
