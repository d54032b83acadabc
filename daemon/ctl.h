/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's control socket (the server; the protocol's shared part and its client are
 * src/ctlproto/): a Unix stream socket served by a thread of its own, speaking a
 * line-based, versioned protocol answered in JSON (docs/operations.md is the reference):
 *
 *   version                             -> {"proto":1,"ok":true,"server":"uvsockd 0.1.0",...}
 *   stats [vm=CID]                      -> per-VM counters (src/ops/stats.h) + engine counters
 *   conns [vm=CID]                      -> connection listing (struct ops_conn_info)
 *   capture start FILE|- [vm=CID] [snaplen=N] [ns] [duration=S] [maxbytes=N] [detach]
 *   capture stop | capture status
 *   vm-add SPEC                         -> a new VM (SPEC as uvsockd's --vm, no spaces)
 *   vm-remove CID|NAME                  -> that VM stopped and removed
 *   vms                                 -> each VM's cid and uds_path (libuvsock-preload.so)
 *   upgrade [binary PATH]               -> every VM handed to a new uvsockd (docs/upgrade.md)
 *   quit
 *
 * A request may start with "v1 " to require protocol version 1; every answer is one line of JSON
 * with "proto":1 and "ok". `capture start -` writes to the file descriptor passed with that
 * request (SCM_RIGHTS), so the file is opened with the client's rights; with a path the daemon
 * creates the file itself (O_EXCL|O_NOFOLLOW, mode 0600). A capture stops when its duration is up,
 * on `capture stop`, or when the connection that started it closes (unless `detach`).
 *
 * The control thread knows nothing of devices: it gathers data through struct ops_ctl_ops,
 * implemented by the daemon. Those callbacks run on the control thread; they must not block a
 * VM thread for long (read counters with relaxed loads; take at most short locks).
 *
 * Bounds: requests of at most OPS_CTL_MAX_REQUEST bytes, at most max_clients connections (more
 * are answered with an error and closed), answers of at most max_response bytes (a listing that
 * would exceed it ends with "truncated":true), idle clients closed after idle_timeout_ms, a
 * client that does not read its answer within the same time is dropped. Only clients with the
 * daemon's uid or root are served (SO_PEERCRED), and the socket file is mode 0600.
 */
#ifndef UVSOCK_DAEMON_CTL_H
#define UVSOCK_DAEMON_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "ctlproto/proto.h"
#include "ops/pcap.h"
#include "ops/stats.h"
#include "util/uds.h"

struct ops_ctl;

/* What an upgrade did (the `upgrade` answer). */
struct ops_ctl_upgrade_vm {
	uint32_t cid;
	uint64_t pause_us; /* from when it stopped serving here to when the new process served */
	unsigned conns;    /* its connections */
	int worker_pid;    /* --isolate: the worker that serves it now (0: not said) */
};
struct ops_ctl_upgrade {
	int old_pid, new_pid;
	unsigned n;
	struct ops_ctl_upgrade_vm *vms;
	int exit_after; /* -1: the VMs are still ours; else exit with it once answered */
};

struct ops_ctl_ops {
	/*
	 * Number of VMs; indexes below are 0 .. n-1. Required. They are stable while the lock
	 * below is held; without lock/unlock, for the daemon's life.
	 */
	unsigned (*vm_count)(void *opaque);
	/* CID of VM idx. Required. */
	uint32_t (*vm_cid)(void *opaque, unsigned idx);
	/* VM idx's host-side socket path (uds-path), borrowed. Optional (`vms` needs it). */
	const char *(*vm_uds_path)(void *opaque, unsigned idx);
	/* Fills *ret (zeroed by the caller) for VM idx. Required. */
	void (*vm_stats)(void *opaque, unsigned idx, struct ops_vm_stats *ret);
	/*
	 * Calls emit once per connection of VM idx. emit returns false when the answer is full:
	 * stop then. Optional (no listing without it).
	 */
	void (*vm_conns)(void *opaque, unsigned idx,
			 bool (*emit)(void *arg, const struct ops_conn_info *ci), void *arg);
	/* The VM's capture tap (lives as long as the daemon). Optional (no capture without it). */
	struct ops_tap *(*vm_tap)(void *opaque, unsigned idx);
	/*
	 * Optional: the control thread holds this lock around each request and each end of a
	 * capture, while it uses VM indexes. Whoever adds or removes VMs holds it too, and calls
	 * ops_ctl_vm_removed() before a VM's index goes away.
	 */
	void (*lock)(void *opaque);
	void (*unlock)(void *opaque);
	/*
	 * Optional (`vm-add`/`vm-remove` answer ENOTSUP without them). Called with the lock held.
	 * vm_add creates and starts a VM from spec (uvsockd's --vm syntax) and sets *ret_cid;
	 * vm_remove stops and removes the VM whose CID or name is `which` and sets *ret_cid. On
	 * failure both write a one-line reason to err. Return 0 or a negative errno.
	 */
	int (*vm_add)(void *opaque, const char *spec, uint32_t *ret_cid, char *err, size_t errlen);
	int (*vm_remove)(void *opaque, const char *which, uint32_t *ret_cid, char *err,
			 size_t errlen);
	/*
	 * Optional (`upgrade` answers ENOTSUP without it): hands every VM to a new process
	 * running binary (NULL: the daemon's own path) (docs/upgrade.md). Called with the lock
	 * held. Fills *ret (its vms array malloc'd, freed by the caller) on success. When
	 * ret->exit_after is 0 or more the VMs are gone from this process: the control thread
	 * answers, stops accepting and the process exits with that status. Returns 0 or a
	 * negative errno with a one-line reason in err.
	 */
	int (*upgrade)(void *opaque, const char *binary, struct ops_ctl_upgrade *ret, char *err,
		       size_t errlen);
};

struct ops_ctl_config {
	const char *path;               /* socket path, <= 107 bytes */
	const struct ops_ctl_ops *ops;  /* borrowed: must outlive the ctl */
	void *opaque;
	const char *server;             /* "uvsockd 0.1.0", copied; NULL: "uvsock" */
	unsigned max_clients;           /* 0: 8 */
	size_t max_response;            /* 0: 16 MiB */
	unsigned idle_timeout_ms;       /* 0: 30000 */
	bool any_uid;                   /* serve every uid that can connect (tests) */
	/* a listening socket taken over from the process this one upgraded (its socket file is
	 * removed at the end like one bound here), or NULL: bind path */
	const struct uds_listener *listener;
};

/* The listening socket (for an upgrade to hand over), or NULL. */
const struct uds_listener *ops_ctl_listener(const struct ops_ctl *c);

/*
 * Binds and listens on cfg->path with uds_listen() (a stale socket file is replaced; a live one
 * is -EADDRINUSE; another kind of file is -EEXIST), makes it mode 0600 and starts the control
 * thread. Context: any thread, typically main() before the VM threads start.
 * Returns 0, -EINVAL (missing ops, path too long), -ENOMEM, or the errno of epoll_create1/
 * eventfd/socket/bind/listen/pthread_create.
 */
int ops_ctl_start(const struct ops_ctl_config *cfg, struct ops_ctl **ret);

/*
 * Stops the thread, ends a running capture (detaching every tap), closes every client and
 * removes the socket file if it is still the one we bound (uds_unlink_owned). Safe on NULL.
 * Context: any thread but the control thread.
 */
void ops_ctl_stop(struct ops_ctl *c);

/*
 * VM idx is about to go away (the indexes above it move down by one): a running capture
 * detaches its tap and forgets it. Context: with the ops' lock held, any thread. Safe on NULL.
 */
void ops_ctl_vm_removed(struct ops_ctl *c, unsigned idx);

#endif
