/* SPDX-License-Identifier: MIT */
/*
 * Crash survival without --isolate: systemd's file descriptor store as the keeper of
 * src/device/vhu_keep.h (docs/upgrade.md, "Without --isolate: the systemd fd store").
 *
 * Each VM's record goes to the service manager (sd_pid_notify_with_fds, FDSTORE=1) as a sealed
 * memfd named `uvsock-crash-<cid>-r<gen>` holding a small index (which stored fd is each of the
 * record's fds) then the record; each distinct fd the records name is stored once, as
 * `uvsock-crash-<cid>-f<id>`. systemd keeps one copy of an open file however often it is sent
 * (a second FDSTORE=1 of the same file is dropped as a duplicate), so an fd already stored keeps
 * its name from one record to the next; a new record is stored before the previous one and the
 * fds no record names any more are removed (FDSTOREREMOVE=1). A process started after a crash
 * gets them back as LISTEN_FDS (named in LISTEN_FDNAMES), rebuilds each record and offers it
 * (dev_vhu_adopt_offer) before its devices are made.
 *
 * Context: the main thread at start-up and shutdown; the keeper function runs on the device
 * threads and serialises itself.
 */
#ifndef UVSOCK_DAEMON_FDSTORE_H
#define UVSOCK_DAEMON_FDSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include "options.h"

/* Names of the store's fds start with this. */
#define FDSTORE_PREFIX "uvsock-crash-"

/* Per VM the store holds at most 1 + VHU_KEEP_MAX_FDS fds, and while a record replaces the
 * previous one (one VM at a time) 1 + VHU_KEEP_MAX_FDS more: the unit's FileDescriptorStoreMax=
 * should be at least FDSTORE_PER_VM * VMs + FDSTORE_PER_VM. */
#define FDSTORE_PER_VM 25u

/*
 * An fd inherited in LISTEN_FDS whose name starts with FDSTORE_PREFIX: taken over (kept until
 * daemon_fdstore_offer, or closed with a log line if its name is not one this module writes).
 */
void daemon_fdstore_take(int fd, const char *name);

/*
 * Whether the store is used: NOTIFY_SOCKET is set and $FDSTORE is above 0 (systemd 254 and
 * later set it to FileDescriptorStoreMax=; the packaged units set it for older ones). Opens the
 * socket the keeper sends on. why gets the start-up log line's reason.
 */
bool daemon_fdstore_available(const struct uvsockd_config *cfg, char *why, size_t whylen);

/*
 * Rebuilds the records taken at start-up and offers each configured VM's newest complete one
 * (dev_vhu_adopt_offer); every other stored fd is closed and removed from the store with a log
 * line. Then installs the keeper (dev_vhu_set_keeper). Call before the devices are made.
 */
void daemon_fdstore_start(const struct uvsockd_config *cfg);

/*
 * The devices are made: what was kept at start-up for a VM whose device wrote no record since
 * (its offer was not taken) is removed from the store.
 */
void daemon_fdstore_settled(void);

/*
 * A clean stop (the devices are gone): the keeper is removed and every fd it stored is removed
 * from the store, so that the next start adopts nothing (its VMMs' connections end with this
 * process, as without the store). Also closes start-up fds nothing took.
 */
void daemon_fdstore_stop(void);

#endif
