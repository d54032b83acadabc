/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's control protocol, what both ends share: the version, the request bound, where a
 * daemon puts its control socket by default and the environment variable that names one for the
 * clients. The server is daemon/ctl.h (docs/operations.md is the reference of the requests and
 * answers); the client is client.h; answers are JSON (json.h).
 *
 * src/ctlproto/ is a static library of its own, linked by uvsockd, uvsock-stat, uvsock-ctl and
 * libuvsock-preload.so; it is not part of libuvsock.so.
 */
#ifndef UVSOCK_CTLPROTO_PROTO_H
#define UVSOCK_CTLPROTO_PROTO_H

#include <stddef.h>

#define OPS_CTL_PROTO 1
#define OPS_CTL_MAX_REQUEST 1024u
#define OPS_CTL_SUFFIX ".ctl"
/* The control socket the clients (uvsock-stat, uvsock-ctl, the shim) use when given none. */
#define OPS_STATCLI_ENV "UVSOCK_CONTROL"

/*
 * The default control path for a daemon: "<vhost-user socket path>.ctl" into buf (find.c).
 * Returns 0 or -ENAMETOOLONG (over 107 bytes).
 */
int ops_ctl_default_path(const char *vhost_socket, char *buf, size_t len);

#endif
