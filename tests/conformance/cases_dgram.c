/* SPDX-License-Identifier: MIT */
/*
 * The datagram rows of the conformance table (docs/api.md "Datagrams"): SOCK_DGRAM between the
 * runner's client and server contexts, written against the public API only, with UDP's errno
 * where vsock has no rule of its own. A transport that did not negotiate datagrams (socket()
 * fails with ENODEV, e.g. a guest whose device does not offer VIRTIO_VSOCK_F_DGRAM) skips every
 * row. conf.c runs these after the rows of cases.c.
 */
#include <poll.h>
#include <string.h>

#include "conf.h"

#define DG_MAX 65492

/* A datagram socket of ctx bound to port (VMADDR_PORT_ANY: unbound), or the case is skipped. */
static int dg_socket(struct uvsock_ctx *ctx, uint32_t port)
{
	struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);
	int fd = uvsock_socket(ctx, SOCK_DGRAM, 0);

	if (fd < 0 && errno == ENODEV)
		test_skip("the transport did not negotiate datagrams");
	ASSERT_GE(fd, 0);
	if (port != VMADDR_PORT_ANY)
		ASSERT_SYS(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)));
	return fd;
}

static void dg_fill(char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)(seed + i * 31u);
}

/* Waits (bounded) for a datagram on fd. */
static void dg_wait(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	ASSERT_EQ(uvsock_poll(&p, 1, 10000), 1);
	ASSERT_TRUE(p.revents & POLLIN);
}

/* ---- sendto/recvfrom with boundaries, and a reply to the source address ----------------- */

static const size_t dg_sizes[] = { 1, 0, 1000, 4096, DG_MAX };
#define DG_NSIZES (sizeof(dg_sizes) / sizeof(dg_sizes[0]))

static void dg_echo_client(struct conf_args *a)
{
	struct sockaddr_vm to = vm_addr(a->env->server_cid, a->port), src;
	int fd = dg_socket(a->env->client_ctx, VMADDR_PORT_ANY);
	static char buf[DG_MAX], got[DG_MAX];
	socklen_t slen;

	ctl_expect(a, "BOUND");
	for (size_t i = 0; i < DG_NSIZES; i++) {
		dg_fill(buf, dg_sizes[i], (unsigned)i);
		ASSERT_EQ(uvsock_sendto(fd, buf, dg_sizes[i], 0, (struct sockaddr *)&to, sizeof(to)),
			  (ssize_t)dg_sizes[i]);
	}
	dg_wait(fd);
	slen = sizeof(src);
	ASSERT_EQ(uvsock_recvfrom(fd, got, sizeof(got), 0, (struct sockaddr *)&src, &slen), 5);
	ASSERT_EQ(memcmp(got, "reply", 5), 0);
	ASSERT_EQ(src.svm_cid, a->env->server_cid);
	ASSERT_EQ(src.svm_port, a->port);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void dg_echo_server(struct conf_args *a)
{
	int fd = dg_socket(a->env->server_ctx, a->port);
	static char got[DG_MAX + 1], want[DG_MAX];
	struct sockaddr_vm src;
	socklen_t slen;

	ctl_send(a, "BOUND");
	for (size_t i = 0; i < DG_NSIZES; i++) {
		dg_wait(fd);
		slen = sizeof(src);
		ASSERT_EQ(uvsock_recvfrom(fd, got, sizeof(got), 0, (struct sockaddr *)&src, &slen),
			  (ssize_t)dg_sizes[i]);
		dg_fill(want, dg_sizes[i], (unsigned)i);
		ASSERT_EQ(memcmp(got, want, dg_sizes[i]), 0);
		ASSERT_EQ(slen, sizeof(src));
		ASSERT_EQ(src.svm_cid, a->env->client_cid);
		ASSERT_GE(src.svm_port, 1024u); /* the client was auto-bound */
	}
	ASSERT_EQ(uvsock_sendto(fd, "reply", 5, 0, (struct sockaddr *)&src, slen), 5);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- MSG_TRUNC both ways, MSG_PEEK ----------------------------------------------------- */

static void dg_trunc_client(struct conf_args *a)
{
	struct sockaddr_vm to = vm_addr(a->env->server_cid, a->port);
	int fd = dg_socket(a->env->client_ctx, VMADDR_PORT_ANY);
	char msg[32];

	/* connect only names the default peer: it needs nothing of the server yet. */
	ASSERT_SYS(uvsock_connect(fd, (struct sockaddr *)&to, sizeof(to)));
	memset(msg, 'm', sizeof(msg));
	ctl_expect(a, "BOUND");
	ASSERT_EQ(uvsock_send(fd, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
	/* An explicit address on a connected socket is fine (UDP: never EISCONN). */
	ASSERT_EQ(uvsock_sendto(fd, msg, sizeof(msg), 0, (struct sockaddr *)&to, sizeof(to)),
		  (ssize_t)sizeof(msg));
	ASSERT_EQ(uvsock_send(fd, "z", 1, 0), 1);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void dg_trunc_server(struct conf_args *a)
{
	int fd = dg_socket(a->env->server_ctx, a->port);
	char buf[16];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	ctl_send(a, "BOUND");
	dg_wait(fd);
	ASSERT_EQ(uvsock_recv(fd, buf, 4, MSG_PEEK), 4);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, MSG_TRUNC), 32); /* full length, consumed */
	ASSERT_TRUE(msg.msg_flags & MSG_TRUNC);
	dg_wait(fd);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), (ssize_t)sizeof(buf)); /* cut, rest discarded */
	ASSERT_TRUE(msg.msg_flags & MSG_TRUNC);
	dg_wait(fd);
	ASSERT_EQ(uvsock_recvmsg(fd, &msg, 0), 1);
	ASSERT_FALSE(msg.msg_flags & MSG_TRUNC);
	ASSERT_EQ(buf[0], 'z');
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

/* ---- default peer, AF_UNSPEC, errno ---------------------------------------------------- */

static void dg_errors_client(struct conf_args *a)
{
	struct sockaddr_vm to = vm_addr(a->env->server_cid, a->port), pa;
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };
	int fd = dg_socket(a->env->client_ctx, VMADDR_PORT_ANY), type = 0;
	socklen_t len = sizeof(type);
	static char big[DG_MAX + 1];

	ctl_expect(a, "BOUND");
	ASSERT_SYS(uvsock_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len));
	ASSERT_EQ(type, SOCK_DGRAM);
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, 0), EDESTADDRREQ);
	len = sizeof(pa);
	ASSERT_ERRNO(uvsock_getpeername(fd, (struct sockaddr *)&pa, &len), ENOTCONN);
	ASSERT_ERRNO(uvsock_listen(fd, 1), EOPNOTSUPP);
	ASSERT_ERRNO(uvsock_accept(fd, NULL, NULL), EOPNOTSUPP);
	ASSERT_ERRNO(uvsock_sendto(fd, big, sizeof(big), 0, (struct sockaddr *)&to, sizeof(to)),
		     EMSGSIZE);
	ASSERT_SYS(uvsock_connect(fd, (struct sockaddr *)&to, sizeof(to)));
	len = sizeof(pa);
	ASSERT_SYS(uvsock_getpeername(fd, (struct sockaddr *)&pa, &len));
	ASSERT_EQ(pa.svm_port, a->port);
	ASSERT_EQ(uvsock_send(fd, "one", 3, 0), 3);
	/* A second connect just moves the default peer (never EISCONN). */
	ASSERT_SYS(uvsock_connect(fd, (struct sockaddr *)&to, sizeof(to)));
	ASSERT_SYS(uvsock_connect(fd, &unspec, sizeof(unspec)));
	ASSERT_ERRNO(uvsock_send(fd, "x", 1, 0), EDESTADDRREQ);
	ASSERT_ERRNO(uvsock_recv(fd, big, 1, MSG_DONTWAIT), EAGAIN);
	ctl_expect(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

/* Server side of a row whose client sends one datagram `want` (4 bytes or less) to a->port. */
static void dg_expect_one(struct conf_args *a, const char *want)
{
	int fd = dg_socket(a->env->server_ctx, a->port);
	char buf[8];

	ctl_send(a, "BOUND");
	dg_wait(fd);
	ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), (ssize_t)strlen(want));
	ASSERT_EQ(memcmp(buf, want, strlen(want)), 0);
	ctl_send(a, "DONE");
	ASSERT_SYS(uvsock_close(fd));
}

static void dg_errors_server(struct conf_args *a)
{
	dg_expect_one(a, "one");
}

/* ---- no listener: the send succeeds, nothing comes back -------------------------------- */

static void dg_no_listener_client(struct conf_args *a)
{
	struct sockaddr_vm to = vm_addr(a->env->server_cid, a->port + 1);
	int fd = dg_socket(a->env->client_ctx, VMADDR_PORT_ANY);
	char buf[8];

	ctl_expect(a, "BOUND");
	for (int i = 0; i < 3; i++)
		ASSERT_EQ(uvsock_sendto(fd, "lost", 4, 0, (struct sockaddr *)&to, sizeof(to)), 4);
	/* The bound port still gets its datagram afterwards (nothing was reset). */
	to.svm_port = a->port;
	ASSERT_EQ(uvsock_sendto(fd, "kept", 4, 0, (struct sockaddr *)&to, sizeof(to)), 4);
	ctl_expect(a, "DONE");
	ASSERT_ERRNO(uvsock_recv(fd, buf, sizeof(buf), MSG_DONTWAIT), EAGAIN);
	ASSERT_SYS(uvsock_close(fd));
}

static void dg_no_listener_server(struct conf_args *a)
{
	dg_expect_one(a, "kept");
}

#define CASE(n, c, s) { .name = n, .run_client = c, .run_server = s }

const struct conf_case conf_dgram_cases[] = {
	CASE("dgram_sendto_recvfrom_boundaries", dg_echo_client, dg_echo_server),
	CASE("dgram_msg_trunc_peek", dg_trunc_client, dg_trunc_server),
	CASE("dgram_default_peer_and_errors", dg_errors_client, dg_errors_server),
	CASE("dgram_no_listener_dropped", dg_no_listener_client, dg_no_listener_server),
};
const unsigned conf_dgram_ncases = sizeof(conf_dgram_cases) / sizeof(conf_dgram_cases[0]);
