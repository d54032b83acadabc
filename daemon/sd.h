/* SPDX-License-Identifier: MIT */
/*
 * uvsockd and its service manager (systemd, through Debian's libsystemd): the sockets it
 * inherits (systemd socket activation's LISTEN_FDS/LISTEN_FDNAMES, and the --fd / fd= sockets of
 * QEMU's vhost-user backend program conventions), handed to the devices with uds_adopt()
 * (src/util/uds.h), and the readiness protocol (sd_notify: READY=1 and STATUS= once every
 * listener is up, STOPPING=1 on the way out; nothing when NOTIFY_SOCKET is unset).
 *
 * Context: the main thread of the main process, at start-up and shutdown.
 */
#ifndef UVSOCK_DAEMON_SD_H
#define UVSOCK_DAEMON_SD_H

#include <stddef.h>

#include "options.h"

/*
 * Checks every --fd socket (an AF_UNIX stream socket, listening or connected) and takes the
 * socket-activated ones: each must be a listening AF_UNIX stream socket and matches the VM whose
 * socket path it is bound to, or whose socket path's basename (or whole path) is its
 * LISTEN_FDNAMES name. An fd named FDSTORE_PREFIX... is the fd store's (fdstore.h:
 * daemon_fdstore_take), not a socket of socket activation. Every inherited socket is registered with uds_adopt() under the VM's
 * socket path; LISTEN_* are removed from the environment. Returns 0 or a negative errno with a
 * one-line message in err (a bad --fd, an activated socket no VM claims, two for one VM).
 */
int daemon_sd_adopt(const struct uvsockd_config *cfg, char *err, size_t errlen);

/* READY=1 with STATUS= naming the VM count (and the worker count, 0 = in-process). */
void daemon_sd_ready(unsigned n_vms, unsigned n_workers);

/*
 * MAINPID=<this pid>: an upgrade's new process is the service's main process now (before its
 * READY=1; the unit needs NotifyAccess=all, as the old process is still the main PID then).
 */
void daemon_sd_mainpid(void);
/* STOPPING=1 with a STATUS=. */
void daemon_sd_stopping(void);

#endif
