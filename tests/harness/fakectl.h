/* SPDX-License-Identifier: MIT */
/*
 * A fake daemon behind uvsockd's control-socket server (daemon/ctl.h), for the tests of that
 * server (tests/unit/daemon) and of its clients (tests/unit/tools): N VMs with fixed counters,
 * a few connections each, and real capture taps, behind struct ops_ctl_ops. Values are chosen
 * so that every field is distinct and checkable. The includer links uvsockd_dep.
 */
#ifndef UVSOCK_TEST_FAKECTL_H
#define UVSOCK_TEST_FAKECTL_H

#include <stdio.h>
#include <unistd.h>

#include "ctl.h"
#include "test.h"

#define FAKE_MAX_VMS 4

struct fake_daemon {
	unsigned n_vms;
	unsigned conns_per_vm;
	struct ops_tap taps[FAKE_MAX_VMS];
	char dir[64];
	char path[128];
	struct ops_ctl *ctl;
};

static inline uint32_t fake_cid(unsigned idx)
{
	return 3 + idx;
}

static unsigned fake_vm_count(void *opaque)
{
	return ((struct fake_daemon *)opaque)->n_vms;
}

static uint32_t fake_vm_cid(void *opaque, unsigned idx)
{
	return fake_cid(idx);
}

static void fake_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *s)
{
	uint64_t base = 1000 * (idx + 1);

	s->cid = fake_cid(idx);
	snprintf(s->name, sizeof(s->name), "vm%u", fake_cid(idx));
	s->vmm_connected = idx == 0;
	s->broken = false;
	s->c.tx_pkts = base + 1;
	s->c.tx_bytes = base + 2;
	s->c.rx_pkts = base + 3;
	s->c.rx_bytes = base + 4;
	s->c.conns_open = base + 5;
	s->c.conns_total = base + 6;
	s->c.rst_sent = base + 7;
	s->c.rst_received = base + 8;
	s->c.credit_stalls = base + 9;
	s->c.ring_errors = base + 10;
	s->c.host_connects_refused = base + 11;
	s->c.host_clients_refused = base + 12;
	s->c.host_handshake_timeouts = base + 13;
	s->c.host_symlinks_refused = base + 14;
	s->c.host_listeners_denied = base + 15;
	s->c.host_clients_no_guest = base + 16;
	s->c.host_connect_bad_lines = base + 17;
	s->c.host_clients_guest_refused = base + 18;
	s->c.guest_mem_unshared = base + 19;
	s->c.busy_poll_ns = base + 50;
	s->c.busy_poll_found = base + 51;
	s->c.dgram_tx = base + 60;
	s->c.dgram_tx_bytes = base + 61;
	s->c.dgram_rx = base + 62;
	s->c.dgram_rx_bytes = base + 63;
	s->c.dgram_drop_no_listener = base + 64;
	s->c.dgram_drop_full = base + 65;
	s->c.dgram_drop_oversize = base + 66;
	s->c.dgram_drop_not_negotiated = base + 67;
	s->c.dgram_drop_malformed = base + 68;
	s->c.sibling_requests_paced = base + 69;
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		s->c.dropped[i] = base + 20 + i;
	s->have_engine = idx == 0;
	s->eng.rst_sent = 42;
	s->eng.rx_dropped[VSOCK_HDR_BAD_OP] = 43;
	s->eng.socks_open = 44;
}

static void fake_vm_conns(void *opaque, unsigned idx,
			  bool (*emit)(void *arg, const struct ops_conn_info *ci), void *arg)
{
	struct fake_daemon *f = opaque;

	for (unsigned k = 0; k < f->conns_per_vm; k++) {
		struct ops_conn_info ci = {
			.vm_cid = fake_cid(idx),
			.sock = {
				.type = k % 2 ? VSOCK_TYPE_SEQPACKET : VSOCK_TYPE_STREAM,
				.state = VSOCK_SS_CONNECTED,
				.local_cid = 2, .local_port = 5000 + k,
				.peer_cid = fake_cid(idx), .peer_port = 1234 + k,
				.buf_alloc = 262144, .fwd_cnt = 100, .rx_bytes = 7,
				.peer_buf_alloc = 65536, .peer_fwd_cnt = 4294967000u,
				.tx_cnt = 704, /* wrapped: 1000 bytes in flight */
				.tx_queued = 11, .bytes_in = 123456, .bytes_out = 654321,
			},
		};

		snprintf(ci.host, sizeof(ci.host), "/tmp/u%u_%u", fake_cid(idx), 5000 + k);
		if (!emit(arg, &ci))
			return;
	}
}

static struct ops_tap *fake_vm_tap(void *opaque, unsigned idx)
{
	return &((struct fake_daemon *)opaque)->taps[idx];
}

static const struct ops_ctl_ops fake_ops = {
	.vm_count = fake_vm_count,
	.vm_cid = fake_vm_cid,
	.vm_stats = fake_vm_stats,
	.vm_conns = fake_vm_conns,
	.vm_tap = fake_vm_tap,
};

/* Starts the fake daemon's control socket in a fresh temporary directory. */
static inline void fake_start(struct fake_daemon *f, unsigned n_vms, struct ops_ctl_config *cfg)
{
	struct ops_ctl_config def = { 0 };

	memset(f, 0, sizeof(*f));
	f->n_vms = n_vms;
	f->conns_per_vm = 2;
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++)
		ops_tap_init(&f->taps[i]);
	snprintf(f->dir, sizeof(f->dir), "/tmp/uvsock-ctl-XXXXXX");
	ASSERT_TRUE(mkdtemp(f->dir) != NULL);
	snprintf(f->path, sizeof(f->path), "%s/vhost.sock.ctl", f->dir);
	if (!cfg)
		cfg = &def;
	cfg->path = f->path;
	cfg->ops = &fake_ops;
	cfg->opaque = f;
	cfg->server = "fake 1.0";
	cfg->any_uid = true;
	ASSERT_OK(ops_ctl_start(cfg, &f->ctl));
}

static inline void fake_stop(struct fake_daemon *f)
{
	ops_ctl_stop(f->ctl);
	f->ctl = NULL;
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++)
		ops_tap_destroy(&f->taps[i]);
	ASSERT_TRUE(access(f->path, F_OK) < 0); /* the socket file is removed */
	rmdir(f->dir);
}

#endif
