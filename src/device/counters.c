/* SPDX-License-Identifier: MIT */
/*
 * What readers on other threads see of a device (device.h): its own counters
 * (vsock_dev_get_stats), its state and its engines' counters (vsock_dev_get_status), the
 * connection walk (vsock_dev_foreach_sock), and the operators' counters of src/ops/stats.h built
 * from those (vsock_dev_counters_from, vsock_dev_get_ops_stats): the one derivation, used by
 * uvsockd's control socket and by uvsock_dev_get_stats (embed.c).
 */
#include "device/device.h"

#include <stdio.h>
#include <string.h>

#include "device/device_internal.h"
#include "ops/stats.h"
#include "util/macros.h"

void dev_eng_stats_accumulate(struct vsock_engine_stats *acc, const struct vsock_engine_stats *s,
			      unsigned listeners)
{
	uint64_t *a = (uint64_t *)acc;
	const uint64_t *v = (const uint64_t *)s;
	uint64_t open = acc->socks_open;

	for (size_t i = 0; i < sizeof(*acc) / sizeof(uint64_t); i++)
		a[i] += v[i];
	acc->socks_open = open;
	acc->socks_total -= MIN((uint64_t)listeners, s->socks_total);
}

void vsock_dev_get_stats(struct vsock_dev *d, struct vsock_dev_stats *ret)
{
	const uint64_t *src = (const uint64_t *)&d->stats;
	uint64_t *dst = (uint64_t *)ret;

	for (size_t i = 0; i < sizeof(*ret) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
	ret->sibling_dropped += __atomic_load_n(&d->port->peer_dropped, __ATOMIC_RELAXED);
}

void vsock_dev_get_status(struct vsock_dev *d, struct vsock_dev_status *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->vmm_connected = __atomic_load_n(&d->vmm_connected, __ATOMIC_RELAXED);
	ret->broken = __atomic_load_n(&d->broken, __ATOMIC_RELAXED);
	pthread_mutex_lock(&d->eng_lock);
	ret->eng_total = d->eng_past;
	if (d->eng) {
		ret->have_engine = true;
		/* lst[] is set before eng is published and cleared after it is withdrawn. */
		ret->listeners = !!d->lst[0] + !!d->lst[1];
		vsock_engine_get_stats(d->eng, &ret->eng);
		dev_eng_stats_accumulate(&ret->eng_total, &ret->eng, 0);
		ret->eng_total.socks_open = ret->eng.socks_open;
	}
	pthread_mutex_unlock(&d->eng_lock);
}

void vsock_dev_foreach_sock(struct vsock_dev *d,
			    void (*fn)(void *arg, const struct vsock_sock_info *info), void *arg)
{
	pthread_mutex_lock(&d->eng_lock);
	if (d->eng)
		vsock_engine_foreach_sock(d->eng, fn, arg);
	pthread_mutex_unlock(&d->eng_lock);
}

void vsock_dev_counters_from(struct ops_vm_counters *ret, const struct vsock_dev_stats *d,
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

void vsock_dev_get_ops_stats(struct vsock_dev *d, struct ops_vm_stats *ret)
{
	struct vsock_dev_status st;
	struct vsock_dev_stats ds;

	vsock_dev_get_status(d, &st);
	vsock_dev_get_stats(d, &ds);
	memset(ret, 0, sizeof(*ret));
	ret->cid = d->cid;
	snprintf(ret->name, sizeof(ret->name), "%s", d->name);
	ret->vmm_connected = st.vmm_connected;
	ret->broken = st.broken;
	ret->have_engine = st.have_engine;
	if (st.have_engine)
		ret->eng = st.eng;
	/* Engine-derived counters summed over VMM sessions: they do not restart on reconnect. */
	vsock_dev_counters_from(&ret->c, &ds, &st.eng_total, st.listeners);
}
