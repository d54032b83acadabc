/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the connection table: connected and bound lookups, conflicts, reference taking
 * on lookup, Linux port auto-assignment (cursor, wrap, never PORT_ANY, 24 tries) and a
 * configured range, and concurrent use from several threads.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "test.h"
#include "vsock/conn_table.h"
#include "vsock/hdr.h"

static atomic_int refs; /* references taken through ref_cb, from any worker thread */
static void ref_cb(struct vsock_ct_node *n, bool connected)
{
	(void)n;
	(void)connected;
	atomic_fetch_add_explicit(&refs, 1, memory_order_relaxed);
}

static struct vsock_conn_table *table(void)
{
	struct vsock_conn_table *t = NULL;

	ASSERT_OK(vsock_conn_table_new(128, ref_cb, &t));
	atomic_store_explicit(&refs, 0, memory_order_relaxed);
	return t;
}

TEST(connected_lookup)
{
	struct vsock_conn_table *t = table();
	struct vsock_ct_node a = {0}, b = {0}, c = {0};

	ASSERT_OK(vsock_ct_insert_connected(t, &a, 3, 1000, 5000));
	ASSERT_OK(vsock_ct_insert_connected(t, &b, 3, 1001, 5000));
	ASSERT_OK(vsock_ct_insert_connected(t, &c, 4, 1000, 5000));
	ASSERT_ERR(vsock_ct_insert_connected(t, &c, 4, 1000, 5000), EINVAL);
	struct vsock_ct_node d = {0};
	ASSERT_ERR(vsock_ct_insert_connected(t, &d, 3, 1000, 5000), EEXIST);
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 3, 1000, 5000) == &a);
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 3, 1001, 5000) == &b);
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 4, 1000, 5000) == &c);
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 4, 1000, 5001) == NULL);
	ASSERT_EQ(atomic_load_explicit(&refs, memory_order_relaxed), 3);
	ASSERT_TRUE(vsock_ct_remove_connected(t, &b));
	ASSERT_FALSE(vsock_ct_remove_connected(t, &b));
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 3, 1001, 5000) == NULL);
	ASSERT_TRUE(vsock_ct_lookup_connected(t, 3, 1000, 5000) == &a);
	vsock_conn_table_free(t);
}

TEST(bound_lookup_and_conflicts)
{
	struct vsock_conn_table *t = table();
	struct vsock_ct_node any = {0}, own = {0}, other = {0};

	ASSERT_OK(vsock_ct_insert_bound(t, &any, VMADDR_CID_ANY, 1234));
	/* Same port: conflicts with a CID_ANY binding whatever the cid. */
	ASSERT_ERR(vsock_ct_insert_bound(t, &own, 2, 1234), EADDRINUSE);
	ASSERT_ERR(vsock_ct_insert_bound(t, &own, 1, VMADDR_PORT_ANY), EINVAL);
	ASSERT_OK(vsock_ct_insert_bound(t, &own, 2, 1235));
	ASSERT_ERR(vsock_ct_insert_bound(t, &other, VMADDR_CID_ANY, 1235), EADDRINUSE);
	ASSERT_ERR(vsock_ct_insert_bound(t, &other, 2, 1235), EADDRINUSE);
	/* Distinct specific cids on one port do not conflict (e.g. loopback and own cid). */
	ASSERT_OK(vsock_ct_insert_bound(t, &other, 1, 1235));

	ASSERT_TRUE(vsock_ct_lookup_bound(t, 77, 1234) == &any);
	ASSERT_TRUE(vsock_ct_lookup_bound(t, 2, 1235) == &own);
	ASSERT_TRUE(vsock_ct_lookup_bound(t, 1, 1235) == &other);
	ASSERT_TRUE(vsock_ct_lookup_bound(t, 3, 1235) == NULL);
	ASSERT_TRUE(vsock_ct_lookup_bound(t, 2, 1236) == NULL);
	ASSERT_EQ(atomic_load_explicit(&refs, memory_order_relaxed), 3);
	ASSERT_TRUE(vsock_ct_remove_bound(t, &any));
	ASSERT_TRUE(vsock_ct_lookup_bound(t, 77, 1234) == NULL);
	ASSERT_OK(vsock_ct_insert_bound(t, &any, 2, 1234));
	vsock_conn_table_free(t);
}

TEST(auto_bind_linux_cursor)
{
	struct vsock_conn_table *t = table();
	struct vsock_ct_node n[4] = {0};
	uint32_t port = 0;

	/* Cursor just below PORT_ANY: 0xfffffffe, then wrap to 1024 (never 0xffffffff). */
	vsock_ct_set_port_cursor(t, 0xfffffffeu);
	ASSERT_OK(vsock_ct_bind_auto(t, &n[0], VMADDR_CID_ANY, 0, 0, &port));
	ASSERT_EQ(port, 0xfffffffeu);
	ASSERT_OK(vsock_ct_bind_auto(t, &n[1], VMADDR_CID_ANY, 0, 0, &port));
	ASSERT_EQ(port, 1024);
	ASSERT_OK(vsock_ct_bind_auto(t, &n[2], VMADDR_CID_ANY, 0, 0, &port));
	ASSERT_EQ(port, 1025);
	/* A taken port is skipped. */
	struct vsock_ct_node taken = {0};
	ASSERT_OK(vsock_ct_insert_bound(t, &taken, VMADDR_CID_ANY, 1026));
	ASSERT_OK(vsock_ct_bind_auto(t, &n[3], VMADDR_CID_ANY, 0, 0, &port));
	ASSERT_EQ(port, 1027);
	vsock_conn_table_free(t);
}

TEST(auto_bind_random_seed_in_range)
{
	for (int i = 0; i < 20; i++) {
		struct vsock_conn_table *t = table();
		struct vsock_ct_node n = {0};
		uint32_t port = 0;

		ASSERT_OK(vsock_ct_bind_auto(t, &n, VMADDR_CID_ANY, 0, 0, &port));
		ASSERT_GE(port, 1024);
		ASSERT_NE(port, VMADDR_PORT_ANY);
		vsock_conn_table_free(t);
	}
}

TEST(auto_bind_gives_up_after_24_tries)
{
	struct vsock_conn_table *t = table();
	struct vsock_ct_node busy[24] = {0}, n = {0};
	uint32_t port = 0;

	for (int i = 0; i < 24; i++)
		ASSERT_OK(vsock_ct_insert_bound(t, &busy[i], VMADDR_CID_ANY, 5000 + i));
	vsock_ct_set_port_cursor(t, 5000);
	ASSERT_ERR(vsock_ct_bind_auto(t, &n, VMADDR_CID_ANY, 0, 0, &port), EADDRNOTAVAIL);
	/* The cursor moved on: the 25th candidate is free. */
	ASSERT_OK(vsock_ct_bind_auto(t, &n, VMADDR_CID_ANY, 0, 0, &port));
	ASSERT_EQ(port, 5024);
	vsock_conn_table_free(t);
}

TEST(auto_bind_configured_range)
{
	struct vsock_conn_table *t = table();
	const uint32_t lo = 1u << 30, hi = (1u << 31) - 1;
	struct vsock_ct_node n[3] = {0};
	uint32_t port = 0;

	for (int i = 0; i < 3; i++) {
		ASSERT_OK(vsock_ct_bind_auto(t, &n[i], VMADDR_CID_ANY, lo, hi, &port));
		ASSERT_GE(port, lo);
		ASSERT_LE(port, hi);
	}
	/* Wrap inside the range. */
	struct vsock_ct_node m[2] = {0};
	vsock_ct_set_port_cursor(t, hi);
	ASSERT_OK(vsock_ct_bind_auto(t, &m[0], VMADDR_CID_ANY, lo, hi, &port));
	ASSERT_EQ(port, hi);
	ASSERT_OK(vsock_ct_bind_auto(t, &m[1], VMADDR_CID_ANY, lo, hi, &port));
	ASSERT_EQ(port, lo);
	/* A tiny, full range. */
	struct vsock_ct_node x = {0}, y = {0};
	ASSERT_OK(vsock_ct_bind_auto(t, &x, VMADDR_CID_ANY, 7000, 7000, &port));
	ASSERT_EQ(port, 7000);
	ASSERT_ERR(vsock_ct_bind_auto(t, &y, VMADDR_CID_ANY, 7000, 7000, &port), EADDRNOTAVAIL);
	ASSERT_ERR(vsock_ct_bind_auto(t, &y, VMADDR_CID_ANY, 9, 8, &port), EINVAL);
	vsock_conn_table_free(t);
}

struct worker_arg {
	struct vsock_conn_table *t;
	int id;
};

static void *worker(void *p)
{
	struct worker_arg *a = p;
	static __thread struct vsock_ct_node nodes[64];

	for (int round = 0; round < 200; round++) {
		for (int i = 0; i < 64; i++) {
			nodes[i] = (struct vsock_ct_node){0};
			if (vsock_ct_insert_connected(a->t, &nodes[i], 3, a->id * 1000 + i, 80))
				abort();
		}
		for (int i = 0; i < 64; i++)
			if (vsock_ct_lookup_connected(a->t, 3, a->id * 1000 + i, 80) != &nodes[i])
				abort();
		for (int i = 0; i < 64; i++)
			if (!vsock_ct_remove_connected(a->t, &nodes[i]))
				abort();
	}
	return NULL;
}

TEST(concurrent_insert_lookup_remove)
{
	struct vsock_conn_table *t = table();
	pthread_t th[4];
	struct worker_arg args[4];

	for (int i = 0; i < 4; i++) {
		args[i] = (struct worker_arg){t, i + 1};
		ASSERT_EQ(pthread_create(&th[i], NULL, worker, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ASSERT_EQ(atomic_load_explicit(&refs, memory_order_relaxed), 4 * 200 * 64);
	vsock_conn_table_free(t);
}

TEST_MAIN()
