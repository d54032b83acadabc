/* SPDX-License-Identifier: MIT */
/*
 * uvsockd --isolate: one worker process per sibling group (VMs that share a group, directly or
 * through others, route to each other in-process, so they share a worker; a VM in no shared
 * group is a worker of its own). Each worker is a fork of uvsockd named "uvsockd vmN" (N the
 * CID of its first VM) that joins its VMs' cgroup= directory first, then runs exactly what
 * uvsockd runs without --isolate for its VMs (vms.c). Guest memory the worker touches is
 * charged to the worker's memory cgroup, not to uvsockd's: the reason for the mode (a VM could
 * otherwise make the daemon's cgroup pay for its RAM by pointing descriptors at pages it never
 * touched).
 *
 * The main process keeps the control socket and supervises: SIGTERM, SIGINT and SIGHUP are
 * forwarded to the workers; a worker that fails (a signal, a non-zero status) is logged and
 * forked again after a back-off (isolate.c ISO_RESTART_*), the others keep running; one that
 * stops with status 0 is not; the main exits when no worker is left, or on
 * SIGTERM/SIGINT once the workers are reaped. Each worker has PR_SET_PDEATHSIG SIGTERM, so none
 * outlives the main. Crash survival (docs/upgrade.md): the main keeps each VM's vhost-user
 * connection and configuration, sent by the worker whenever they change, and hands them to the
 * worker it forks again, which adopts the VMMs (src/device/vhu_keep.h). Live upgrade
 * (docs/upgrade.md, "Under --isolate"): one worker at a time, the main starts the new binary as
 * that group's worker and the old worker hands its VMs to it; then the main process itself is
 * handed to a new one (isolate_takeover), which supervises the workers it did not fork through
 * pidfds (each worker's PR_SET_PDEATHSIG is cleared first, on request).
 *
 * The control socket answers for every VM through a SOCK_SEQPACKET socketpair per worker: the
 * main sends "stats of VM i" / "conns of VM i", a responder thread in the worker answers with
 * the filled struct ops_vm_stats / the struct ops_conn_info records. Every wait is bounded
 * (ISO_ANSWER_TIMEOUT_MS); a VM whose worker is gone or does not answer is listed with zero
 * counters and the name "vmN worker gone" / "vmN no answer"; otherwise its name is
 * "vmN pid P" (the worker's PID). Packet capture needs the VM's tap in this process, so it is
 * not offered in this mode (`capture start` answers ENOTSUP; --capture is refused).
 */
#ifndef UVSOCK_DAEMON_ISOLATE_H
#define UVSOCK_DAEMON_ISOLATE_H

#include <signal.h>

#include "options.h"

/* How long the control thread waits for one answer of a worker. */
#define ISO_ANSWER_TIMEOUT_MS 1000u
/* After a worker missed that deadline, requests to it fail at once for this long. */
#define ISO_QUIET_MS 5000u
/* How long start-up waits for every worker to report its devices up. */
#define ISO_START_TIMEOUT_MS 10000u
/* How long a stop waits for the workers to exit before SIGKILL. */
#define ISO_STOP_TIMEOUT_MS 5000u

/*
 * Runs cfg (cfg->isolate set, paths checked) as the main process of --isolate: forks the
 * workers, waits until each one reports its devices up (a worker that fails fails start-up:
 * the others are stopped), starts the control socket, supervises until the end. *sigs (SIGTERM,
 * SIGINT, SIGHUP) is blocked by the caller; SIGCHLD is added here. Context: main thread, no
 * other thread running. Returns the exit status: 0 after SIGTERM/SIGINT with every worker
 * stopping cleanly, 1 on a start-up failure, when every worker is gone without a signal, or
 * when a worker failed while stopping.
 */
int isolate_run(const struct uvsockd_config *cfg, const sigset_t *sigs);

/*
 * uvsockd --takeover FD --isolate ...: the new main process of an upgrade (docs/upgrade.md,
 * "Under --isolate"): takes the old main's state (record kind 7) from FD, answers ready or
 * refused, and after go supervises the workers it did not fork (pidfds) and serves the control
 * socket. Returns as isolate_run; 1 at once if the hand-over did not happen.
 */
int isolate_takeover(const struct uvsockd_config *cfg, int fd, const sigset_t *sigs);

/*
 * uvsockd --iso-worker W,H,R,K ARGS: a worker process that the main process started from a
 * (new) binary, for worker W of the configuration ARGS, with its request socket R and keeper
 * socket K; H, if not -1, is the hand-over socket from the worker it replaces (an upgrade: its
 * VMs come from there, upgrade.c), else it makes its VMs as a restarted worker does. Never
 * returns but on a bad spec (1). Context: main thread, *sigs blocked.
 */
int isolate_worker_exec(const struct uvsockd_config *cfg, const char *spec, const sigset_t *sigs);

#endif
