/* SPDX-License-Identifier: MIT */
/*
 * The VMs one uvsockd process serves: every VM of the command line (the default), or the VMs of
 * one sibling group in an --isolate worker (daemon/isolate.c). The same code runs both: it
 * creates one device per VM (src/device), links the devices that share a group, attaches the
 * --capture file, runs each device on its own thread until SIGTERM or SIGINT, and stops and
 * frees everything in order (socket files removed). The per-VM callbacks of the control socket
 * (struct ops_ctl_ops) read these devices; in a worker its responder thread calls them.
 *
 * In the main process (not in an --isolate worker) the set changes at runtime: the control
 * socket's vm-add / vm-remove add and remove a VM, and SIGHUP re-reads --config and applies the
 * difference (docs/uvsockd.md, "Runtime VMs"); the other VMs and their connections are not
 * touched. A lock in the set orders those changes against the control thread's reads.
 *
 * Context: one struct vm_set per process, driven by the main thread.
 */
#ifndef UVSOCK_DAEMON_VMS_H
#define UVSOCK_DAEMON_VMS_H

#include <signal.h>
#include <stdbool.h>

#include "ctl.h"
#include "options.h"

struct vm_set;

/*
 * What the caller adds around the VM threads. ready runs once the devices exist and before
 * their threads start (the control socket starts there; a worker starts its responder and
 * reports that it is up); a negative return ends the run with exit status 1. stopping runs on
 * the way out before the devices stop (whatever reads them must stop first) whenever ready was
 * called, also after a failed ready. Both may be NULL.
 */
struct vm_set_hooks {
	int (*ready)(struct vm_set *s, void *arg);
	void (*stopping)(struct vm_set *s, void *arg);
	void *arg;
	/* Optional: sees each signal sigwaited first; true when it took it (the loop goes on). */
	bool (*signal)(const siginfo_t *si, void *arg);
};

/*
 * Runs the VMs cfg->vms[idx[0..n)] (idx NULL: all of them) until sigwait() on *sigs returns
 * SIGTERM or SIGINT. SIGHUP re-reads the configuration (idx NULL only; a worker logs that it
 * cannot). The caller blocked *sigs in every thread. Failures are printed on stderr. Returns
 * the process exit status: 0 after a signal, 1 on a start-up failure or when a VM's event loop
 * failed (which sends SIGTERM to this process).
 */
int vm_set_run(const struct uvsockd_config *cfg, const unsigned *idx, unsigned n,
	       const sigset_t *sigs, const struct vm_set_hooks *hooks);

/*
 * The control socket's view of the set: an ops_ctl_ops whose opaque is the struct vm_set, VM
 * indexes being positions in the set. Valid from ready until stopping.
 */
extern const struct ops_ctl_ops vm_set_ctl_ops;

/*
 * The command line SIGHUP parses again (uvsockd_parse_args) when it has --config; borrowed
 * for the process's life. Context: main thread, before vm_set_run.
 */
void vm_set_reload_args(int argc, char *const *argv);
/* That command line (argc; 0 and *argv NULL if none was given). */
int vm_set_args(char *const **argv);

/*
 * --takeover FD (docs/upgrade.md): vm_set_run takes its VMs from the old process on FD
 * (upgrade.c) instead of creating them, the control socket's listener too. Context: main
 * thread, before vm_set_run.
 */
void vm_set_takeover_fd(int fd);
/* The control socket's listener that daemon_ctl_start takes instead of binding (the main
 * process of --isolate taken over: isolate.c). Borrowed until then. */
void vm_set_takeover_ctl(const struct uds_listener *l);

struct ops_ctl_upgrade;
/*
 * An --isolate worker's VMs handed to the new worker pid (running path) that the main process
 * started, over sock (closed here): upgrade_hand_over (upgrade.h). Takes the set's lock; when
 * the VMs went (ret->exit_after >= 0) it stays held and the caller ends the process with
 * _exit(ret->exit_after) without touching them. ret->vms is malloc'd. Returns 0 or -errno with
 * err.
 */
int vm_set_hand_over(struct vm_set *s, int sock, pid_t pid, const char *path,
		     struct ops_ctl_upgrade *ret, char *err, size_t errlen);
/* Number of VMs of the set; the config of its VM i (its name filled in). */
unsigned vm_set_count(const struct vm_set *s);
const struct uvsockd_vm_config *vm_set_vm(const struct vm_set *s, unsigned i);

/*
 * Starts the control socket at cfg's --control path (or the default `<first VM's socket>.ctl`)
 * serving ops/opaque, unless --control none (then *ret is NULL). Errors are printed on stderr.
 * Returns 0 or a negative errno.
 */
int daemon_ctl_start(const struct uvsockd_config *cfg, const struct ops_ctl_ops *ops,
		     void *opaque, struct ops_ctl **ret);

#endif
