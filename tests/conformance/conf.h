/* SPDX-License-Identifier: MIT */
/*
 * Conformance suite framework: a client/server case table in the shape of the kernel's
 * tools/testing/vsock/vsock_test (name, run_client, run_server), written against the public API
 * only. A runner supplies a context factory (loopback today, the guest role through uvsockd
 * later) and calls conf_main(); every case then runs in a forked child (tests/harness) with the
 * client in the main thread and the server in a second thread, synchronised through a small
 * in-process control channel (a SOCK_SEQPACKET socketpair, each wait bounded by 10 s).
 *
 * The same table also runs against Linux's own AF_VSOCK inside the interop guest
 * (tests/conformance/kernel/: the uvsock_* calls mapped onto the real system calls). There a
 * case marked uvsock_only is skipped, and a case may expect a per-kernel result through
 * conf_kernel_before(); every userspace run still runs every case.
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
	unsigned kernel;                 /* CONF_KV() of the Linux kernel under test; 0: uvsock */
	bool split;                      /* client and server run in different processes */
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
	/* Non-NULL: uvsock's own rule, not Linux's; the kernel run skips the case (the reason). */
	const char *uvsock_only;
};

/* A kernel version as compared by conf_kernel_before(). */
#define CONF_KV(major, minor) ((unsigned)(major) * 1000u + (unsigned)(minor))

/* True when the table runs against Linux's AF_VSOCK. */
static inline bool conf_on_kernel(const struct conf_args *a)
{
	return a->env->kernel != 0;
}

/* True when the table runs against a Linux kernel older than major.minor. */
static inline bool conf_kernel_before(const struct conf_args *a, unsigned major, unsigned minor)
{
	return a->env->kernel != 0 && a->env->kernel < CONF_KV(major, minor);
}

extern const struct conf_case conf_cases[];
extern const unsigned conf_ncases;
/* The datagram rows (cases_dgram.c), run after conf_cases. */
extern const struct conf_case conf_dgram_cases[];
extern const unsigned conf_dgram_ncases;

/*
 * The least time a timeout of ms may have taken, as the cases check it: ms itself on uvsock; on
 * the kernel three quarters of it, since the interop guest's timers under QEMU TCG fire early
 * against CLOCK_MONOTONIC (seen: 171 ms for SO_RCVTIMEO 200 ms on 6.1, 173 ms for a 200 ms
 * connect timeout on 7.3).
 */
static inline uint64_t conf_min_wait(const struct conf_args *a, uint64_t ms)
{
	return conf_on_kernel(a) ? ms * 3 / 4 : ms;
}

/* Registers every case with the harness and runs them (TAP). */
int conf_main(int argc, char **argv, const struct conf_factory *f);

/*
 * Runs case idx in the calling process through factory f: both sides (client in the calling
 * thread, server in a second one) when role is CONF_BOTH; one side when the two sides run in
 * different processes, with ctl the control channel to the other one (a SOCK_SEQPACKET socket).
 * Skips (test_skip) a uvsock_only case when the factory's env names a kernel.
 */
enum conf_role { CONF_BOTH, CONF_CLIENT, CONF_SERVER };
void conf_run_case(const struct conf_factory *f, unsigned idx, enum conf_role role, int ctl);

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
