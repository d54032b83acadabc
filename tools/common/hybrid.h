/* SPDX-License-Identifier: MIT */
/*
 * The host side of a hybrid vsock back-end (uvsockd, vhost-device-vsock, Firecracker's and Cloud
 * Hypervisor's convention), for the tools that play the host application: a host program reaches
 * guest port P by connecting to <uds> and sending "CONNECT P\n" (answered "OK <host port>\n"), and
 * a guest connection to host port P arrives on the listener at <uds>_P. uvsockd also carries
 * SOCK_SEQPACKET: <uds>_seqpacket for host connections (the line is one message) and a
 * SOCK_SEQPACKET listener at <uds>_P (docs/uvsockd.md, "SEQPACKET").
 *
 * Every call returns -1 with errno set on failure; nothing exits. Context: any thread.
 */
#ifndef UVSOCK_TOOLS_HYBRID_H
#define UVSOCK_TOOLS_HYBRID_H

/* A Unix socket of type (SOCK_STREAM or SOCK_SEQPACKET) connected to path. */
int hybrid_unix_connect(const char *path, int type);

/* A Unix socket of type bound to path (an old file there is removed first), listening. */
int hybrid_listen(const char *path, int type);

/* accept4(lfd) once lfd is readable within ms; -1 with errno ETIMEDOUT when it is not. */
int hybrid_accept(int lfd, int ms);

/*
 * Host -> guest: "CONNECT <port>\n" on uds (or <uds>_seqpacket, one message, for
 * SOCK_SEQPACKET), then the answer "OK ...\n", each step within timeout_ms. Stream answers are
 * read byte by byte, so no payload behind the line is eaten. Returns the connected fd, or -1
 * with errno: ECONNREFUSED (the back-end closed the socket or answered something else: the guest
 * refused), ETIMEDOUT, or the connect's errno.
 */
int hybrid_connect(const char *uds, unsigned port, int type, int timeout_ms);

#endif
