/* SPDX-License-Identifier: MIT */
/*
 * Conformance runner and helpers (conf.h): registers each table entry with the test harness
 * through a fixed set of trampolines, and runs one case as client (main thread) + server
 * (second thread) over the factory's contexts.
 */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"

/* The control channel's hang bound: the case's own time limit (tests/harness/test.c: 60 s, or
 * $UVSOCK_TEST_TIMEOUT), not a tighter one that a sanitizer build on a loaded machine exceeds
 * (stream_1byte_flood_bounded's 256 Ki one-byte sends took over 10 s under ThreadSanitizer). */
#define CTL_TIMEOUT_DEFAULT_S 60
#define CTL_MAX 256
#define PORT_BASE 10000u
#define PORTS_PER_CASE 16u

static const struct conf_factory *factory;

uint64_t conf_fnv1a(uint64_t h, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* ---- Control channel ---- */

static int ctl_timeout_ms(void)
{
	const char *e = getenv("UVSOCK_TEST_TIMEOUT");
	int s = e && atoi(e) > 0 ? atoi(e) : CTL_TIMEOUT_DEFAULT_S;

	return s > INT32_MAX / 1000 ? INT32_MAX : s * 1000;
}

static void ctl_wait(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r, ms = ctl_timeout_ms();

	do {
		r = poll(&p, 1, ms);
	} while (r < 0 && errno == EINTR);
	if (r == 0)
		test_fail(__FILE__, __LINE__, "control channel: no message within %d ms", ms);
	if (r < 0)
		test_fail(__FILE__, __LINE__, "control channel: poll: %s", strerror(errno));
}

void ctl_send(struct conf_args *a, const char *msg)
{
	size_t n = strlen(msg);

	if (n >= CTL_MAX || send(a->ctl, msg, n, MSG_NOSIGNAL) != (ssize_t)n)
		test_fail(__FILE__, __LINE__, "control channel: send '%s': %s", msg,
			  strerror(errno));
}

static void ctl_recv(struct conf_args *a, char *buf)
{
	ssize_t n;

	ctl_wait(a->ctl);
	n = recv(a->ctl, buf, CTL_MAX - 1, 0);
	if (n <= 0)
		test_fail(__FILE__, __LINE__, "control channel: recv: %s",
			  n == 0 ? "peer gone" : strerror(errno));
	buf[n] = '\0';
}

void ctl_expect(struct conf_args *a, const char *msg)
{
	char buf[CTL_MAX];

	ctl_recv(a, buf);
	if (strcmp(buf, msg) != 0)
		test_fail(__FILE__, __LINE__, "control channel: expected '%s', got '%s'", msg, buf);
}

void ctl_send_u64(struct conf_args *a, uint64_t v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	ctl_send(a, buf);
}

uint64_t ctl_recv_u64(struct conf_args *a)
{
	char buf[CTL_MAX], *end;
	unsigned long long v;

	ctl_recv(a, buf);
	v = strtoull(buf, &end, 10);
	if (*end != '\0')
		test_fail(__FILE__, __LINE__, "control channel: expected a number, got '%s'", buf);
	return v;
}

/* ---- Helpers ---- */

int conf_listen(struct conf_args *a, int type, uint32_t port, int backlog)
{
	struct sockaddr_vm sa = vm_addr(VMADDR_CID_ANY, port);
	int fd = uvsock_socket(a->env->server_ctx, type, 0);

	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_SYS(uvsock_listen(fd, backlog));
	return fd;
}

int conf_connect(struct conf_args *a, int type, uint32_t port)
{
	struct sockaddr_vm sa = vm_addr(a->env->server_cid, port);
	int fd = uvsock_socket(a->env->client_ctx, type, 0);

	ASSERT_SYS(fd);
	ASSERT_SYS(uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

int conf_accept(int lfd)
{
	int fd = uvsock_accept(lfd, NULL, NULL);

	ASSERT_SYS(fd);
	return fd;
}

void conf_send_all(int fd, const void *buf, size_t len)
{
	ssize_t n = uvsock_send(fd, buf, len, 0);

	ASSERT_SYS(n);
	ASSERT_EQ(n, (ssize_t)len);
}

void conf_recv_all(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = uvsock_recv(fd, (char *)buf + got, len - got, 0);

		ASSERT_SYS(n);
		if (n == 0)
			test_fail(__FILE__, __LINE__, "unexpected EOF after %zu of %zu bytes", got,
				  len);
		got += (size_t)n;
	}
}

unsigned conf_wait_events(int fd, unsigned events, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = (short)events };
	int r;

	r = uvsock_poll(&p, 1, timeout_ms);
	ASSERT_SYS(r);
	if (r == 0)
		test_fail(__FILE__, __LINE__, "no event 0x%x within %d ms (mask 0x%x)", events,
			  timeout_ms, (unsigned)uvsock_poll_events(fd));
	return (unsigned short)p.revents;
}

/* ---- Runner ---- */

struct server_thread {
	const struct conf_case *c;
	struct conf_args args;
};

static void *server_main(void *arg)
{
	struct server_thread *st = arg;

	st->c->run_server(&st->args);
	return NULL;
}

/* Row idx of the table: cases.c's rows, then cases_dgram.c's. */
static const struct conf_case *case_at(unsigned idx)
{
	return idx < conf_ncases ? &conf_cases[idx] : &conf_dgram_cases[idx - conf_ncases];
}

void conf_run_case(const struct conf_factory *f, unsigned idx, enum conf_role role, int ctl)
{
	const struct conf_case *c = case_at(idx);
	struct server_thread st = { .c = c };
	struct conf_args ca = { 0 };
	struct conf_env env;
	pthread_t th;
	int sv[2] = { ctl, ctl }, r;

	memset(&env, 0, sizeof(env));
	r = f->setup(&env);
	if (r < 0)
		test_fail(__FILE__, __LINE__, "factory %s setup: %s", f->name, strerror(-r));
	env.split = role != CONF_BOTH;
	if (env.kernel && c->uvsock_only) {
		f->teardown(&env);
		test_skip(c->uvsock_only);
	}
	if (role == CONF_BOTH)
		ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
	ca.env = &env;
	ca.ctl = sv[0];
	ca.port = PORT_BASE + idx * PORTS_PER_CASE;
	st.args = ca;
	st.args.ctl = sv[1];
	st.args.is_server = true;
	if (role == CONF_SERVER) {
		c->run_server(&st.args);
	} else if (role == CONF_CLIENT) {
		c->run_client(&ca);
	} else {
		ASSERT_EQ(pthread_create(&th, NULL, server_main, &st), 0);
		c->run_client(&ca);
		ASSERT_EQ(pthread_join(th, NULL), 0);
		close(sv[0]);
		close(sv[1]);
	}
	f->teardown(&env);
}

static void run_case(unsigned idx)
{
	conf_run_case(factory, idx, CONF_BOTH, -1);
}

#define T1(i)                                                                                      \
	static void tramp_##i(void)                                                                \
	{                                                                                          \
		run_case(i);                                                                       \
	}
#define T10(a) T1(a##0) T1(a##1) T1(a##2) T1(a##3) T1(a##4) T1(a##5) T1(a##6) T1(a##7) T1(a##8) \
	T1(a##9)
T10() T10(1) T10(2) T10(3) T10(4) T10(5) T10(6) T10(7) T10(8) T10(9)
#undef T1
#undef T10

#define R1(i) tramp_##i,
#define R10(a) R1(a##0) R1(a##1) R1(a##2) R1(a##3) R1(a##4) R1(a##5) R1(a##6) R1(a##7) R1(a##8) \
	R1(a##9)
static const test_fn tramps[] = { R10() R10(1) R10(2) R10(3) R10(4) R10(5) R10(6) R10(7) R10(8)
				  R10(9) };
#undef R1
#undef R10

int conf_main(int argc, char **argv, const struct conf_factory *f)
{
	struct rlimit rl;

	factory = f;
	if (conf_ncases + conf_dgram_ncases > sizeof(tramps) / sizeof(tramps[0])) {
		fprintf(stderr, "conformance: %u cases, only %zu trampolines\n",
			conf_ncases + conf_dgram_ncases, sizeof(tramps) / sizeof(tramps[0]));
		return 2;
	}
	/* 1000 concurrent connections need ~2000 descriptors. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	for (unsigned i = 0; i < conf_ncases + conf_dgram_ncases; i++)
		test_register(case_at(i)->name, tramps[i]);
	return test_main(argc, argv);
}
