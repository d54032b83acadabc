/* SPDX-License-Identifier: MIT */
/* Per-VM counters: snapshot, sum, and the bridge from the device's and engine's counters. */
#include "ops/stats.h"

#include <string.h>

#include "device/device.h"
#include "util/macros.h"

static const char *const drop_names[_OPS_DROP_MAX] = {
	[OPS_DROP_SPOOFED_CID] = "spoofed_cid",
	[OPS_DROP_BAD_OP] = "bad_op",
	[OPS_DROP_BAD_TYPE] = "bad_type",
	[OPS_DROP_OVERSIZE] = "oversize",
	[OPS_DROP_NO_ROUTE] = "no_route",
	[OPS_DROP_MALFORMED] = "malformed",
};

const char *ops_drop_reason_name(enum ops_drop_reason r)
{
	if ((unsigned)r >= ARRAY_SIZE(drop_names))
		return "unknown";
	return drop_names[r];
}

void ops_counters_read(const struct ops_vm_counters *src, struct ops_vm_counters *ret)
{
#define OPS_X_READ_(f, name, help) ret->f = __atomic_load_n(&src->f, __ATOMIC_RELAXED);
	OPS_VM_COUNTERS(OPS_X_READ_)
#undef OPS_X_READ_
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		ret->dropped[i] = __atomic_load_n(&src->dropped[i], __ATOMIC_RELAXED);
}

void ops_counters_add(struct ops_vm_counters *acc, const struct ops_vm_counters *c)
{
#define OPS_X_ADD_(f, name, help) acc->f += c->f;
	OPS_VM_COUNTERS(OPS_X_ADD_)
#undef OPS_X_ADD_
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		acc->dropped[i] += c->dropped[i];
}

void ops_counters_from_sources(struct ops_vm_counters *ret, const struct vsock_dev_stats *d,
			       const struct vsock_engine_stats *e, unsigned listeners)
{
	memset(ret, 0, sizeof(*ret));
	if (d) {
		ret->tx_pkts = d->tx_pkts;
		ret->tx_bytes = d->tx_bytes;
		ret->rx_pkts = d->rx_pkts;
		ret->rx_bytes = d->rx_bytes;
		ret->ring_errors = d->ring_errors;
		ret->host_connects_refused = d->guest_conns_refused;
		ret->dropped[OPS_DROP_SPOOFED_CID] = d->tx_bad_src_cid;
		ret->dropped[OPS_DROP_NO_ROUTE] = d->tx_bad_dst_cid + d->sibling_dropped;
		ret->dropped[OPS_DROP_MALFORMED] = d->tx_bad_chain;
	}
	if (e) {
		ret->conns_open = e->socks_open > listeners ? e->socks_open - listeners : 0;
		ret->conns_total = e->socks_total > listeners ? e->socks_total - listeners : 0;
		ret->rst_sent = e->rst_sent;
		ret->rst_received = e->rst_received;
		ret->credit_stalls = e->credit_stalls;
		/* The engine's only listeners are the device's: a full backlog refused a guest. */
		ret->host_connects_refused += e->backlog_refused;
		ret->dropped[OPS_DROP_BAD_OP] = e->rx_dropped[VSOCK_HDR_BAD_OP];
		ret->dropped[OPS_DROP_BAD_TYPE] = e->rx_dropped[VSOCK_HDR_BAD_TYPE];
		ret->dropped[OPS_DROP_OVERSIZE] = e->rx_dropped[VSOCK_HDR_OVERSIZE];
		ret->dropped[OPS_DROP_MALFORMED] += e->rx_dropped[VSOCK_HDR_BAD_CID] +
						    e->rx_dropped[VSOCK_HDR_BAD_LEN] +
						    e->rx_dropped[VSOCK_HDR_BAD_FLAGS];
	}
}
