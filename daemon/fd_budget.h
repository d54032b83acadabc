/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's file-descriptor budget. Every host-side connection of a VM (a host program on
 * <uds-path>, or a guest connect to <uds-path>_<port>) holds one fd of the one process, so a VM
 * whose host side took fds without bound could starve the others: their guest -> host connects
 * would fail and their VMM would be dropped on its next fd-carrying vhost-user message. At start
 * the daemon raises the soft RLIMIT_NOFILE to the hard limit and gives each VM a host-side
 * connection budget (the device's max_conns) such that the budgets of all VMs plus what the rest
 * needs fit under it:
 *
 *   per VM (UVSOCKD_FDS_PER_VM): the vhost-user listener, the VMM's connection and one refused
 *     while it is served, kick/call/err of the rings, up to 8 memory-region fds of one
 *     SET_MEM_TABLE in flight, the epoll fd and eventfds of its loop, the two host listeners, the
 *     uds-path directory, the reserve fd and the short-lived fds of a connect or a refusal, the
 *     datagram socket <uds-path>.dgram, the sockets connected to up to 8 of its destinations
 *     (DEV_DGRAM_DESTS) and to up to 8 remembered host senders (DEV_DGRAM_PEER_SOCKS), one
 *     O_PATH fd of a destination being opened;
 *   once (UVSOCKD_FDS_GLOBAL): stdio, the control socket and its clients, capture files, libc.
 *
 * Each VM's host side enforces its budget on its own (src/device/host_uds.c): connections beyond
 * it are accepted and closed at once and counted, so one VM's host programs can only exhaust
 * that VM's share.
 */
#ifndef UVSOCK_DAEMON_FD_BUDGET_H
#define UVSOCK_DAEMON_FD_BUDGET_H

#include <stdint.h>

#define UVSOCKD_FDS_PER_VM 56u
#define UVSOCKD_FDS_GLOBAL 64u
/* The device's own default: a VM never gets more host-side connections than this. */
#define UVSOCKD_HOST_CONNS_MAX 1024u

/*
 * The per-VM host-side connection budget for a process allowed `nofile` fds serving n_vms VMs
 * (n_vms >= 1): (nofile - UVSOCKD_FDS_GLOBAL) / n_vms - UVSOCKD_FDS_PER_VM, at most
 * UVSOCKD_HOST_CONNS_MAX. Returns 0 when not even one connection per VM fits. Pure.
 */
uint32_t uvsockd_host_conn_budget(uint64_t nofile, unsigned n_vms);

/*
 * Raises the soft RLIMIT_NOFILE to the hard limit (the first call only; later calls return the
 * same result) and returns the budget for n_vms VMs under it, at least 1. Logs the budget (info),
 * and warns when it is below UVSOCKD_HOST_CONNS_MAX. Context: the main thread, at start, before
 * any device exists.
 */
uint32_t uvsockd_fd_budget_per_vm(unsigned n_vms);

#endif
