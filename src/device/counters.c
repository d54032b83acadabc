/* SPDX-License-Identifier: MIT */
/*
 * What readers on other threads see of a device (vsock_dev.h): its own counters
 * (vsock_dev_get_stats), its state and its engines' counters (vsock_dev_get_status), the
 * connection walk (vsock_dev_foreach_sock), and the operators' counters of src/ops/stats.h built
 * from those (vsock_dev_counters_from, vsock_dev_get_ops_stats): the one derivation, used by
 * uvsockd's control socket and by uvsock_dev_get_stats (embed.c).
 */
#include "device/vsock_dev.h"

#include <stdio.h>
#include <string.h>

#include "device/device_internal.h"
#include "ops/stats.h"
#include "util/loop.h"
#include "util/macros.h"

void dev_counters_eng_accumulate(struct vsock_engine_stats *acc, const struct vsock_engine_stats *s,
			      unsigned listeners)
{
	/* Every counter adds up over engines but the gauge socks_open, which is kept as it was. */
	uint64_t open = acc->socks_open;

#define ENG_ADD_(f) acc->f += s->f;
	VSOCK_ENGINE_STATS(ENG_ADD_)
#undef ENG_ADD_
	acc->socks_open = open;
	for (unsigned i = 0; i < _VSOCK_HDR_ERROR_MAX; i++)
		acc->rx_dropped[i] += s->rx_dropped[i];
	acc->socks_total -= MIN((uint64_t)listeners, s->socks_total);
}

void vsock_dev_get_stats(struct vsock_dev *d, struct vsock_dev_stats *ret)
{
	struct loop_stats ls;

	/* Relaxed: each counter is a whole value; the set is not a consistent snapshot. */
#define DEV_STATS_READ_(f) ret->f = atomic_load_explicit(&d->stats.f, memory_order_relaxed);
	VSOCK_DEV_STATS(DEV_STATS_READ_)
#undef DEV_STATS_READ_
	ret->sibling_dropped += atomic_load_explicit(&d->sib.port->peer_dropped, memory_order_relaxed);
	loop_get_stats(d->loop, &ls);
	ret->busy_poll_ns = ls.spin_ns;
	ret->busy_poll_found = ls.spin_found;
}

void vsock_dev_get_status(struct vsock_dev *d, struct vsock_dev_status *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->vmm_connected = atomic_load_explicit(&d->vmm_connected, memory_order_relaxed);
	ret->broken = dev_broken(d);
	pthread_mutex_lock(&d->eng_lock);
	ret->eng_total = d->eng_past;
	if (d->eng) {
		ret->have_engine = true;
		/* lst[] is set before eng is published and cleared after it is withdrawn. */
		ret->listeners = !!d->lst[0] + !!d->lst[1];
		vsock_engine_get_stats(d->eng, &ret->eng);
		dev_counters_eng_accumulate(&ret->eng_total, &ret->eng, 0);
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

/* The datagram counters: the device's own, one for one, under the same names. */
#define DEV_DGRAM_COUNTERS_(X)                                                                     \
	X(dgram_tx) X(dgram_tx_bytes) X(dgram_rx) X(dgram_rx_bytes) X(dgram_drop_no_listener)      \
	X(dgram_drop_full) X(dgram_drop_oversize) X(dgram_drop_not_negotiated)                     \
	X(dgram_drop_malformed)

static void dev_dgram_counters(struct ops_vm_counters *ret, const struct vsock_dev_stats *d)
{
#define DEV_DGRAM_ONE_(f) OPS_CTR_ADD(ret, f, d->f);
	DEV_DGRAM_COUNTERS_(DEV_DGRAM_ONE_)
#undef DEV_DGRAM_ONE_
}

void vsock_dev_counters_from(struct ops_vm_counters *ret, const struct vsock_dev_stats *d,
			     const struct vsock_engine_stats *e, unsigned listeners)
{
	/* ret is zeroed, then each source is added into its model field. */
	memset(ret, 0, sizeof(*ret));
	if (d) {
		OPS_CTR_ADD(ret, tx_pkts, d->tx_pkts);
		OPS_CTR_ADD(ret, tx_bytes, d->tx_bytes);
		OPS_CTR_ADD(ret, rx_pkts, d->rx_pkts);
		OPS_CTR_ADD(ret, rx_bytes, d->rx_bytes);
		OPS_CTR_ADD(ret, ring_errors, d->ring_errors);
		OPS_CTR_ADD(ret, host_connects_refused, d->guest_conns_refused);
		OPS_CTR_ADD(ret, host_clients_refused,
			    d->host_conns_refused + d->host_accept_shed + d->host_handshakes_refused);
		OPS_CTR_ADD(ret, host_handshake_timeouts, d->host_handshake_timeouts);
		OPS_CTR_ADD(ret, host_symlinks_refused, d->guest_conns_symlink);
		OPS_CTR_ADD(ret, host_listeners_denied, d->guest_conns_denied);
		OPS_CTR_ADD(ret, host_clients_no_guest, d->host_conns_no_guest);
		OPS_CTR_ADD(ret, host_connect_bad_lines, d->host_connect_bad_line);
		OPS_CTR_ADD(ret, host_clients_guest_refused, d->host_conns_guest_refused);
		OPS_CTR_ADD(ret, guest_mem_unshared, d->guest_mem_unshared);
		OPS_CTR_ADD(ret, busy_poll_ns, d->busy_poll_ns);
		OPS_CTR_ADD(ret, busy_poll_found, d->busy_poll_found);
		dev_dgram_counters(ret, d);
		OPS_CTR_ADD(ret, sibling_requests_paced, d->sibling_requests_paced);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_SPOOFED_CID], d->tx_bad_src_cid);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_NO_ROUTE],
			    d->tx_bad_dst_cid + d->sibling_dropped + d->sibling_replies_dropped);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_MALFORMED], d->tx_bad_chain);
	}
	if (e) {
		OPS_CTR_ADD(ret, conns_open,
			    e->socks_open > listeners ? e->socks_open - listeners : 0);
		OPS_CTR_ADD(ret, conns_total,
			    e->socks_total > listeners ? e->socks_total - listeners : 0);
		OPS_CTR_ADD(ret, rst_sent, e->rst_sent);
		OPS_CTR_ADD(ret, rst_received, e->rst_received);
		OPS_CTR_ADD(ret, credit_stalls, e->credit_stalls);
		/* The engine's only listeners are the device's: a full backlog refused a guest. */
		OPS_CTR_ADD(ret, host_connects_refused, e->backlog_refused);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_BAD_OP], e->rx_dropped[VSOCK_HDR_BAD_OP]);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_BAD_TYPE], e->rx_dropped[VSOCK_HDR_BAD_TYPE]);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_OVERSIZE], e->rx_dropped[VSOCK_HDR_OVERSIZE]);
		OPS_CTR_ADD(ret, dropped[OPS_DROP_MALFORMED],
			    e->rx_dropped[VSOCK_HDR_BAD_CID] + e->rx_dropped[VSOCK_HDR_BAD_LEN] +
				    e->rx_dropped[VSOCK_HDR_BAD_FLAGS]);
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
