/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/counters.c, what readers on other threads see: status and the
 * socket listing, the operators' counters mapping (datagrams included).
 * Shared set-up: devtest.h.
 */
#include "devtest.h"

TEST(status_and_socket_listing_for_operators)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req;
	struct vsock_dev_status st;
	struct walk w = { 0 };
	int fd;

	tdev_new(&t, NULL, 3);
	vsock_dev_get_status(t.d, &st);
	ASSERT_FALSE(st.vmm_connected);
	ASSERT_FALSE(st.have_engine);
	tdev_run(&t);
	tg_connect(&g, &t);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	vsock_dev_get_status(t.d, &st);
	ASSERT_TRUE(st.vmm_connected);
	ASSERT_FALSE(st.broken);
	ASSERT_TRUE(st.have_engine);
	ASSERT_EQ(st.listeners, 2); /* STREAM and SEQPACKET wildcard listeners */
	ASSERT_EQ(st.eng.socks_open, 3);
	vsock_dev_foreach_sock(t.d, walk_one, &w);
	ASSERT_EQ(w.listeners, 2);
	ASSERT_EQ(w.conns, 1);
	ASSERT_EQ(w.port, req.src_port);
	tg_disconnect(&g);
	ASSERT_EQ(read_wait(fd, &w, 1, WAIT_MS), 0);
	close(fd);
	vsock_dev_get_status(t.d, &st);
	ASSERT_FALSE(st.vmm_connected);
	ASSERT_FALSE(st.have_engine);
	/* The ended session's counters stay: one connection (listeners not counted), none open. */
	ASSERT_EQ(st.eng_total.socks_total, 1);
	ASSERT_EQ(st.eng_total.socks_open, 0);
	memset(&w, 0, sizeof(w));
	vsock_dev_foreach_sock(t.d, walk_one, &w);
	ASSERT_EQ(w.conns + w.listeners, 0);
	/* A second session adds to them: its own connection plus its two listeners. */
	tg_connect(&g, &t);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	vsock_dev_get_status(t.d, &st);
	ASSERT_EQ(st.eng.socks_total, 3);
	ASSERT_EQ(st.eng_total.socks_total, 1 + 3);
	ASSERT_EQ(st.eng_total.socks_open, 3);
	ASSERT_GE(st.eng_total.rx_pkts, 2 * st.eng.rx_pkts);
	tg_disconnect(&g);
	ASSERT_EQ(read_wait(fd, &w, 1, WAIT_MS), 0);
	close(fd);
	vsock_dev_get_status(t.d, &st);
	ASSERT_EQ(st.eng_total.socks_total, 2);
	tdev_stop(&t);
}

/*
 * The operators' counters are built from the device's and the engine's counters in one place
 * (vsock_dev_counters_from): every source field lands in its model field, the device's own
 * listeners are not connections, and a missing source leaves its fields zero.
 */
TEST(operator_counters_mapping)
{
	struct vsock_dev_stats ds = { 0 };
	struct vsock_engine_stats es = { 0 };
	struct ops_vm_counters m;

	ds.tx_pkts = 1;
	ds.tx_bytes = 2;
	ds.rx_pkts = 3;
	ds.rx_bytes = 4;
	ds.ring_errors = 5;
	ds.guest_conns_refused = 6;
	ds.tx_bad_src_cid = 7;
	ds.tx_bad_dst_cid = 8;
	ds.sibling_dropped = 9;
	ds.tx_bad_chain = 10;
	es.socks_open = 3;
	es.socks_total = 30;
	es.rst_sent = 11;
	es.rst_received = 12;
	es.credit_stalls = 13;
	es.backlog_refused = 14;
	for (unsigned i = 0; i < _VSOCK_HDR_ERROR_MAX; i++)
		es.rx_dropped[i] = 100u << i;
	vsock_dev_counters_from(&m, &ds, &es, 2);
	ASSERT_EQ_U64(m.tx_pkts + m.tx_bytes + m.rx_pkts + m.rx_bytes, 10);
	ASSERT_EQ_U64(m.ring_errors, 5);
	ASSERT_EQ_U64(m.host_connects_refused, 6 + 14);
	ASSERT_EQ_U64(m.conns_open, 1);
	ASSERT_EQ_U64(m.conns_total, 28);
	ASSERT_EQ_U64(m.rst_sent + m.rst_received + m.credit_stalls, 36);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_SPOOFED_CID], 7);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_NO_ROUTE], 17);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_BAD_OP], es.rx_dropped[VSOCK_HDR_BAD_OP]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_BAD_TYPE], es.rx_dropped[VSOCK_HDR_BAD_TYPE]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_OVERSIZE], es.rx_dropped[VSOCK_HDR_OVERSIZE]);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED],
		      10 + es.rx_dropped[VSOCK_HDR_BAD_CID] + es.rx_dropped[VSOCK_HDR_BAD_LEN] +
			      es.rx_dropped[VSOCK_HDR_BAD_FLAGS]);

	vsock_dev_counters_from(&m, NULL, &es, 5);
	ASSERT_EQ_U64(m.tx_pkts, 0);
	ASSERT_EQ_U64(m.conns_open, 0);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED], es.rx_dropped[VSOCK_HDR_BAD_CID] +
		      es.rx_dropped[VSOCK_HDR_BAD_LEN] + es.rx_dropped[VSOCK_HDR_BAD_FLAGS]);
	vsock_dev_counters_from(&m, &ds, NULL, 2);
	ASSERT_EQ_U64(m.rst_sent, 0);
	ASSERT_EQ_U64(m.host_connects_refused, 6);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_MALFORMED], 10);
}

TEST(dgram_counters_map_one_for_one)
{
	struct vsock_dev_stats ds = { 0 };
	struct ops_vm_counters m;

	ds.dgram_tx = 1;
	ds.dgram_tx_bytes = 2;
	ds.dgram_rx = 3;
	ds.dgram_rx_bytes = 4;
	ds.dgram_drop_no_listener = 5;
	ds.dgram_drop_full = 6;
	ds.dgram_drop_oversize = 7;
	ds.dgram_drop_not_negotiated = 8;
	ds.dgram_drop_malformed = 9;
	vsock_dev_counters_from(&m, &ds, NULL, 0);
	ASSERT_EQ_U64(m.dgram_tx, 1);
	ASSERT_EQ_U64(m.dgram_tx_bytes, 2);
	ASSERT_EQ_U64(m.dgram_rx, 3);
	ASSERT_EQ_U64(m.dgram_rx_bytes, 4);
	ASSERT_EQ_U64(m.dgram_drop_no_listener, 5);
	ASSERT_EQ_U64(m.dgram_drop_full, 6);
	ASSERT_EQ_U64(m.dgram_drop_oversize, 7);
	ASSERT_EQ_U64(m.dgram_drop_not_negotiated, 8);
	ASSERT_EQ_U64(m.dgram_drop_malformed, 9);
	/* Not in the stream counters. */
	ASSERT_EQ_U64(m.tx_pkts + m.rx_pkts + m.dropped[OPS_DROP_MALFORMED], 0);
}

TEST(sibling_requests_paced_maps_one_for_one)
{
	struct vsock_dev_stats ds = { 0 };
	struct ops_vm_counters m;

	ds.sibling_requests_paced = 7;
	vsock_dev_counters_from(&m, &ds, NULL, 0);
	ASSERT_EQ_U64(m.sibling_requests_paced, 7);
	ASSERT_EQ_U64(m.dropped[OPS_DROP_NO_ROUTE], 0);
}

TEST_MAIN()
