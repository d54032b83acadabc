/* SPDX-License-Identifier: MIT */
/*
 * Per-VM counters of uvsockd: the numbers an operator reads with `uvsock-stat` (docs/operations.md
 * says what each one means). The fields are C11 atomics so that one struct ops_vm_counters can be
 * written by one thread (OPS_CTR_ADD: single writer, relaxed load + relaxed store, the same
 * instructions as `x += n` on every 64-bit target we build for, so the data path pays nothing
 * extra) while another reads it (ops_counters_read: relaxed loads; each value is whole, the set
 * is a "consistent enough" snapshot, as /proc/net/snmp). A snapshot is a struct of the same type
 * owned by its reader.
 *
 * The device role builds this model from the counters it and its engine keep
 * (vsock_dev_counters_from in src/device/counters.c); this file is only the model.
 *
 * OPS_VM_COUNTERS() lists the scalar fields once; the JSON writer, the JSON reader of uvsock-stat
 * and the tests iterate it, so a new counter is one line here.
 */
#ifndef UVSOCK_OPS_STATS_H
#define UVSOCK_OPS_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "vsock/engine.h"

/* Why the device dropped a guest packet without handing it to the engine or a sibling. */
enum ops_drop_reason {
	OPS_DROP_SPOOFED_CID, /* src_cid is not the VM's CID */
	OPS_DROP_BAD_OP,      /* op outside the known set */
	OPS_DROP_BAD_TYPE,    /* socket type neither STREAM nor SEQPACKET (answered with RST) */
	OPS_DROP_OVERSIZE,    /* payload larger than 64 KiB */
	OPS_DROP_NO_ROUTE,    /* dst_cid is neither the host nor a running sibling in a group */
	OPS_DROP_MALFORMED,   /* short or writable chain, length mismatch, bad flags or CID bits */
	_OPS_DROP_MAX,
};

/* X(field, json name, help): scalar counters, in output order. */
#define OPS_VM_COUNTERS(X)                                                                         \
	X(tx_pkts, "tx_pkts", "packets from the guest (TX ring) accepted")                         \
	X(tx_bytes, "tx_bytes", "payload bytes of those packets")                                  \
	X(rx_pkts, "rx_pkts", "packets put into the guest's RX ring")                              \
	X(rx_bytes, "rx_bytes", "payload bytes put into the guest's RX ring")                      \
	X(conns_open, "conns_open", "connections open now (gauge)")                               \
	X(conns_total, "conns_total", "connections ever opened")                                   \
	X(rst_sent, "rst_sent", "RST packets sent to the guest")                                   \
	X(rst_received, "rst_received", "RST packets received from the guest")                     \
	X(credit_stalls, "credit_stalls", "sends that found no guest credit")                      \
	X(ring_errors, "ring_errors", "times the rings were marked broken")                        \
	X(host_connects_refused, "host_connects_refused",                                          \
	  "guest connects refused on the host side (nobody listening at <uds-path>_<port>, or "     \
	  "any other reason)")                                                                     \
	X(host_clients_refused, "host_clients_refused",                                            \
	  "host programs' connections closed at once: over the VM's fd budget, out of fds, or "     \
	  "too many CONNECT handshakes pending")                                                   \
	X(host_handshake_timeouts, "host_handshake_timeouts",                                      \
	  "host connections closed because no complete CONNECT line came within 2 s")              \
	X(host_symlinks_refused, "host_symlinks_refused",                                          \
	  "guest connects refused because <uds-path>_<port> is a symlink")                         \
	X(host_listeners_denied, "host_listeners_denied",                                          \
	  "guest connects refused because uvsockd may not connect to <uds-path>_<port> "            \
	  "(EACCES/EPERM)")                                                                        \
	X(host_clients_no_guest, "host_clients_no_guest",                                          \
	  "host programs' connections closed at once: no VMM attached or guest driver not running") \
	X(host_connect_bad_lines, "host_connect_bad_lines",                                        \
	  "host connections closed because their CONNECT line did not parse")                      \
	X(host_clients_guest_refused, "host_clients_guest_refused",                                \
	  "host CONNECTs refused by the guest (nobody listens on that guest port)")                \
	X(guest_mem_unshared, "guest_mem_unshared",                                                \
	  "VMM sessions whose guest memory uvsockd could not see (memory backend without share=on)") \
	X(busy_poll_ns, "busy_poll_ns",                                                            \
	  "CPU time the VM's device thread spent busy polling, in ns (--busy-poll-us)")            \
	X(busy_poll_found, "busy_poll_found", "busy polls that ended with work")                  \
	X(dgram_tx, "dgram_tx", "guest datagrams sent on to a host socket or a sibling VM")        \
	X(dgram_tx_bytes, "dgram_tx_bytes", "payload bytes of those datagrams")                    \
	X(dgram_rx, "dgram_rx", "datagrams put into the guest's RX ring")                          \
	X(dgram_rx_bytes, "dgram_rx_bytes", "payload bytes of those datagrams")                    \
	X(dgram_drop_no_listener, "dgram_drop_no_listener",                                        \
	  "datagrams dropped: nothing bound at the destination")                                   \
	X(dgram_drop_full, "dgram_drop_full",                                                      \
	  "datagrams dropped: the receiving socket or queue was full")                             \
	X(dgram_drop_oversize, "dgram_drop_oversize",                                              \
	  "datagrams dropped: over the datagram maximum or the guest's RX buffer")                 \
	X(dgram_drop_not_negotiated, "dgram_drop_not_negotiated",                                  \
	  "datagrams dropped: the guest (or the sibling VM it was for) did not negotiate DGRAM")   \
	X(dgram_drop_malformed, "dgram_drop_malformed",                                            \
	  "datagrams dropped: an op other than RW from the guest, or a bad host port line")        \
	X(sibling_requests_paced, "sibling_requests_paced",                                        \
	  "guest connects to a sibling VM that waited: over the budget of connects it refused")

struct ops_vm_counters {
#define OPS_X_FIELD_(f, name, help) _Atomic uint64_t f;
	OPS_VM_COUNTERS(OPS_X_FIELD_)
#undef OPS_X_FIELD_
	_Atomic uint64_t dropped[_OPS_DROP_MAX];
};

/* Single-writer update (VM thread only). n may be "negative" for the gauge: (uint64_t)-1. */
#define OPS_CTR_ADD(ctrs, field, n)                                                                \
	atomic_store_explicit(&(ctrs)->field,                                                      \
			      atomic_load_explicit(&(ctrs)->field, memory_order_relaxed) +         \
				      (uint64_t)(n),                                               \
			      memory_order_relaxed)
#define OPS_CTR_INC(ctrs, field) OPS_CTR_ADD(ctrs, field, 1)
/* One counter's value (relaxed: whole, orders nothing). Any thread. */
#define OPS_CTR_GET(ctrs, field) atomic_load_explicit(&(ctrs)->field, memory_order_relaxed)
#define OPS_CTR_DEC(ctrs, field) OPS_CTR_ADD(ctrs, field, (uint64_t)-1)
#define OPS_CTR_DROP(ctrs, reason) OPS_CTR_ADD(ctrs, dropped[reason], 1)

/* JSON key of a drop reason ("spoofed_cid", ...), "unknown" out of range. */
const char *ops_drop_reason_name(enum ops_drop_reason r);

/*
 * Copies src into *ret with one relaxed atomic load per field. Context: any thread, while the
 * owner may be writing src.
 */
void ops_counters_read(const struct ops_vm_counters *src, struct ops_vm_counters *ret);

/* acc += c, field by field (the gauge too). For totals over VMs or over engine lifetimes. */
void ops_counters_add(struct ops_vm_counters *acc, const struct ops_vm_counters *c);

/* What the control thread gathers for one VM (ops_ctl_ops.vm_stats fills it). */
struct ops_vm_stats {
	uint32_t cid;
	char name[32];             /* "vm3"; NUL-terminated */
	char socket[108];          /* its vhost-user socket path as configured; "" if none */
	bool vmm_connected;        /* a VMM is connected on the vhost-user socket */
	bool broken;               /* rings marked broken until restarted */
	struct ops_vm_counters c;
	bool have_engine;          /* eng is valid (an engine exists: rings started) */
	struct vsock_engine_stats eng;
};

/* One connection of a VM, for the `conns` listing (ops_ctl_ops.vm_conns emits them). */
struct ops_conn_info {
	uint32_t vm_cid;
	struct vsock_sock_info sock; /* local = host side (CID 2) in the device role */
	char host[108];              /* host endpoint ("/run/vm3.vsock_1234", "fd 17"); may be "" */
};

#endif
