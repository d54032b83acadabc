/* SPDX-License-Identifier: MIT */
/*
 * The Unix socket paths uvsockd binds and connects for each VM, and the rule that keeps two VMs
 * apart: no name of one VM is a name of another VM or the control socket.
 *
 * A VM's names: its vhost-user `socket` (unless inherited, fd=N), and from its `uds-path` U:
 * U and U_seqpacket (host programs connect here), U.dgram (host datagrams to the guest), and
 * the families U_<P> (a guest connect to host port P: uvsockd connects there) and U_<P>.dgram
 * (a guest datagram to host port P). A literal comparison of socket and uds-path is not enough:
 * a VM whose uds-path is another VM's U_7 gets that VM's guest connections to host port 7, and
 * its own U_<P> listeners then serve them, which connects the two guests across their groups; a
 * control socket at U_<P> would serve a guest's connect with the daemon's own credentials. Each
 * path must also be absolute: a relative one names a different file for the daemon (its working
 * directory) than for host programs, and a host datagram's source path is compared as a string.
 * Recommended: a directory per VM (docs/uvsockd.md "Where to put uds-path").
 */
#ifndef UVSOCK_DAEMON_PATHS_H
#define UVSOCK_DAEMON_PATHS_H

#include <stddef.h>

#include "options.h"

/*
 * Checks v's paths: absolute, its socket none of its own uds-path's names, and no name of v a
 * name of others[0..n) or the control socket `control` (NULL: none). The --vm/--config parser
 * (options.c: every VM against the ones before it) and vm-add/SIGHUP (vms.c: the new VM against
 * the running ones) both call it. Returns 0 or -EINVAL with the reason in err.
 */
int uvsockd_check_vm_paths(const struct uvsockd_vm_config *v,
			   const struct uvsockd_vm_config *const *others, unsigned n,
			   const char *control, char *err, size_t errlen);

/*
 * The control socket's path of c into buf: --control PATH, else the default beside the first
 * VM's socket. Returns buf, or NULL (--control none, an inherited first socket without
 * --control, or a default too long: the control socket's start reports that).
 */
const char *uvsockd_control_path(const struct uvsockd_config *c, char *buf, size_t len);

#endif
