/* SPDX-License-Identifier: MIT */
/*
 * Conformance suite framework: a client/server case table in the shape of the kernel's
 * tools/testing/vsock/vsock_test (name, run_client, run_server), written against the public API
 * only. A runner supplies a context factory (loopback today, the guest role through uvsockd
 * later) and calls conf_main(); every case then runs in a forked child (tests/harness) with the
 * client in the main thread and the server in a second thread, synchronised through a small
 * in-process control channel (a SOCK_SEQPACKET socketpair, each wait bounded by 10 s).
 */
#ifndef UVSOCK_TESTS_CONF_H
#define UVSOCK_TESTS_CONF_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <uvsock/uvsock.h>

#include "test.h"
#include "vmaddr.h"

/* What a factory provides for one case. */
struct conf_env {
	struct uvsock_ctx *client_ctx;   /* contexts may be the same (loopback) */
	struct uvsock_ctx *server_ctx;
	uint32_t server_cid;             /* CID the client connects to */
	uint32_t client_cid;             /* CID the server sees as its peer */
	uint32_t blackhole_cid;          /* packets to it get no answer; VMADDR_CID_ANY if none */
	bool shared_engine;              /* both sides share one engine (stats cover both) */
	void *priv;                      /* factory-private */
};

struct conf_factory {
	const char *name;
	/* Fills *env for one case (runs in the forked child). Returns 0 or -errno. */
	int (*setup)(struct conf_env *env);
	/* Frees what setup made; called after both sides returned. */
	void (*teardown)(struct conf_env *env);
};

/* Per-side view handed to run_client / run_server. */
struct conf_args {
	const struct conf_env *env;
	int ctl;             /* control channel end */
	uint32_t port;       /* first of 16 ports reserved for this case */
	bool is_server;
};

struct conf_case {
	const char *name;
	void (*run_client)(struct conf_args *a);
	void (*run_server)(struct conf_args *a);
};

extern const struct conf_case conf_cases[];
extern const unsigned conf_ncases;
/* The datagram rows (cases_dgram.c), run after conf_cases. */
extern const struct conf_case conf_dgram_cases[];
extern const unsigned conf_dgram_ncases;

/* Registers every case with the harness and runs them (TAP). */
int conf_main(int argc, char **argv, const struct conf_factory *f);

/* ---- Control channel (each call asserts; 10 s limit per wait) ---- */
void ctl_send(struct conf_args *a, const char *msg);
void ctl_expect(struct conf_args *a, const char *msg);
void ctl_send_u64(struct conf_args *a, uint64_t v);
uint64_t ctl_recv_u64(struct conf_args *a);

/* socket + bind(CID_ANY, port) + listen(backlog). */
int conf_listen(struct conf_args *a, int type, uint32_t port, int backlog);
/* socket + connect(server_cid, port). */
int conf_connect(struct conf_args *a, int type, uint32_t port);
int conf_accept(int lfd);
void conf_send_all(int fd, const void *buf, size_t len);
void conf_recv_all(int fd, void *buf, size_t len);
/* Waits (bounded) until uvsock_poll_events(fd) has any of `events`; returns the mask. */
unsigned conf_wait_events(int fd, unsigned events, int timeout_ms);
uint64_t conf_fnv1a(uint64_t h, const void *buf, size_t len);

/* expr must fail with errno e. */
#define ASSERT_ERRNO(expr, e)                                                                      \
	do {                                                                                       \
		errno = 0;                                                                         \
		long long r_ = (long long)(expr);                                                  \
		int e_ = errno;                                                                    \
		if (r_ != -1 || e_ != (e))                                                         \
			test_fail(__FILE__, __LINE__, "%s: expected -1/%s, got %lld errno %d (%s)", \
				  #expr, #e, r_, e_, strerror(e_));                                \
	} while (0)

/* expr (a -1/errno call) must succeed. */
#define ASSERT_SYS(expr)                                                                           \
	do {                                                                                       \
		errno = 0;                                                                         \
		long long r_ = (long long)(expr);                                                  \
		if (r_ < 0)                                                                        \
			test_fail(__FILE__, __LINE__, "%s failed: %lld errno %d (%s)", #expr, r_,  \
				  errno, strerror(errno));                                         \
	} while (0)

#endif
