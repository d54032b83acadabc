/* SPDX-License-Identifier: MIT */
/*
 * An AF_VSOCK host program for the shim's tests (tests/shim/test-shim.c): plain libc socket
 * calls, as a program written for the kernel's vsock makes them, one mode per argv[1]. Prints
 * what it sees on stdout, one line per fact; exits 0 when every check held, 1 otherwise.
 *
 * SAFETY: it refuses to start unless libuvsock-preload.so is preloaded and a seccomp filter is
 * in place (uvsock-run), so it can never create a kernel AF_VSOCK socket on the test machine.
 *
 *   client CID PORT stream|seq MSG   connect, print names, send MSG, half-close, print the echo
 *   serve PORT stream|seq N          bind + listen, accept N connections, print each peer, echo
 *   errors CID PORT                  errno of refused/unknown connects, DGRAM, options, ioctl
 *   nonblock CID PORT CLOSED_PORT    non-blocking connects, good and refused, through poll
 *   threads CID PORT N               N threads, one connection each, all at once
 *   fork CID PORT                    connect, fork: the child writes, then the parent
 *   exec CID PORT                    connect, exec this program ("after-exec FD"): names kept
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static bool failed;

#define CHECK(c, ...)                                                                              \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                \
			printf(__VA_ARGS__);                                                       \
			printf(" (%s)\n", strerror(errno));                                        \
			failed = true;                                                             \
		}                                                                                  \
	} while (0)

static void refuse_unless_guarded(void)
{
	const char *pre = getenv("LD_PRELOAD");
	char line[256];
	bool filtered = false;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "Seccomp:", 8) && atoi(line + 8) == 2)
			filtered = true;
	if (f)
		fclose(f);
	if (!pre || !strstr(pre, "libuvsock-preload.so") || !filtered) {
		fprintf(stderr, "shim-prog: run me through uvsock-run only\n");
		exit(3);
	}
}

static struct sockaddr_vm addr(unsigned cid, unsigned port)
{
	return (struct sockaddr_vm){ .svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port };
}

static int type_of(const char *s)
{
	return strcmp(s, "seq") == 0 ? SOCK_SEQPACKET : SOCK_STREAM;
}

static int vconnect(unsigned cid, unsigned port, int type)
{
	struct sockaddr_vm a = addr(cid, port);
	int fd = socket(AF_VSOCK, type | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static void print_names(int fd)
{
	struct sockaddr_vm l, p;
	socklen_t ll = sizeof(l), pl = sizeof(p);

	CHECK(getsockname(fd, (struct sockaddr *)&l, &ll) == 0 && ll == sizeof(l) &&
	      l.svm_family == AF_VSOCK, "getsockname");
	CHECK(getpeername(fd, (struct sockaddr *)&p, &pl) == 0 && pl == sizeof(p) &&
	      p.svm_family == AF_VSOCK, "getpeername");
	printf("local %u %u peer %u %u\n", l.svm_cid, l.svm_port, p.svm_cid, p.svm_port);
}

/* Reads until EOF (stream) or one message (seq) into buf; returns the length. */
static size_t read_all(int fd, char *buf, size_t cap, int type)
{
	size_t len = 0;

	for (;;) {
		ssize_t n = read(fd, buf + len, cap - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (type == SOCK_SEQPACKET || len == cap - 1)
			break;
	}
	buf[len] = '\0';
	return len;
}

static int mode_client(unsigned cid, unsigned port, int type, const char *msg)
{
	char buf[4096];
	int fd = vconnect(cid, port, type);

	CHECK(fd >= 0, "connect");
	if (fd < 0)
		return 1;
	print_names(fd);
	CHECK(write(fd, msg, strlen(msg)) == (ssize_t)strlen(msg), "write");
	if (type == SOCK_STREAM)
		CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
	read_all(fd, buf, sizeof(buf), type);
	printf("got %s\n", buf);
	close(fd);
	return 0;
}

static int mode_serve(unsigned port, int type, int n)
{
	struct sockaddr_vm a = addr(VMADDR_CID_ANY, port), p;
	int lfd = socket(AF_VSOCK, type, 0), dom = 0;
	socklen_t dl = sizeof(dom);

	CHECK(lfd >= 0, "socket");
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind");
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno == EINVAL, "bind twice");
	CHECK(listen(lfd, 16) == 0, "listen");
	CHECK(getsockopt(lfd, SOL_SOCKET, SO_DOMAIN, &dom, &dl) == 0 && dom == AF_VSOCK, "domain");
	printf("listening\n");
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		socklen_t pl = sizeof(p);
		char buf[4096];
		size_t len;
		int c = accept(lfd, (struct sockaddr *)&p, &pl);

		CHECK(c >= 0 && pl == sizeof(p), "accept");
		if (c < 0)
			break;
		printf("accepted %u %u\n", p.svm_cid, p.svm_port);
		print_names(c);
		len = read_all(c, buf, sizeof(buf), type);
		printf("got %s\n", buf);
		fflush(stdout);
		CHECK(write(c, buf, len) == (ssize_t)len, "echo");
		close(c);
	}
	close(lfd);
	return 0;
}

static void check_errno(int r, int want, const char *what)
{
	int e = errno;

	if (r < 0 && e == want)
		printf("ok %s\n", what);
	else
		printf("FAIL %s: r=%d errno=%s\n", what, r, strerror(e)), failed = true;
}

static int mode_errors(unsigned cid, unsigned closed_port)
{
	unsigned long long v = 0;
	socklen_t vl = sizeof(v);
	struct timeval tv = { .tv_sec = 1 };
	socklen_t tl = sizeof(tv);
	unsigned lcid = 0;
	int fd, d;

	check_errno(vconnect(cid, closed_port, SOCK_STREAM), ECONNRESET, "refused connect");
	check_errno(vconnect(cid, closed_port, SOCK_SEQPACKET), ECONNRESET, "refused seq connect");
	check_errno(vconnect(cid + 100, closed_port, SOCK_STREAM), ENODEV, "unknown cid");
	check_errno(socket(AF_VSOCK, SOCK_DGRAM, 0), EAFNOSUPPORT, "dgram");
	check_errno(socketpair(AF_VSOCK, SOCK_STREAM, 0, (int[2]){ 0 }), EOPNOTSUPP, "socketpair");
	fd = socket(AF_VSOCK, SOCK_STREAM, 0);
	CHECK(getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, &vl) == 0 && v == 262144,
	      "buffer size default");
	v = 1ull << 30;
	CHECK(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, sizeof(v)) == 0, "set");
	CHECK(getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, &vl) == 0 && v == 262144,
	      "buffer size clamped to the max");
	v = 1ull << 20;
	CHECK(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_MAX_SIZE, &v, sizeof(v)) == 0 &&
	      setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, sizeof(v)) == 0 &&
	      getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, &vl) == 0 && v == 1u << 20,
	      "buffer size after a larger max");
	check_errno(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE, &v, 4), EINVAL, "short");
	CHECK(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv)) == 0 &&
	      getsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, &tl) == 0 &&
	      tv.tv_sec == 1 && tv.tv_usec == 0, "connect timeout");
	tv.tv_usec = 1000000;
	check_errno(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv)),
		    ERANGE, "timeout range");
	check_errno(getpeername(fd, (struct sockaddr *)&(struct sockaddr_vm){ 0 },
				&(socklen_t){ sizeof(struct sockaddr_vm) }), ENOTCONN, "no peer");
	close(fd);
	d = open("/dev/vsock", O_RDONLY | O_CLOEXEC);
	CHECK(d >= 0 && ioctl(d, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &lcid) == 0 && lcid == 2,
	      "local cid");
	printf("local cid %u\n", lcid);
	close(d);
	return 0;
}

static int mode_nonblock(unsigned cid, unsigned port, unsigned closed_port)
{
	unsigned ports[2] = { port, closed_port };

	for (int i = 0; i < 2; i++) {
		struct sockaddr_vm a = addr(cid, ports[i]);
		int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK, 0), err = -1, r;
		socklen_t el = sizeof(err);
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		r = connect(fd, (struct sockaddr *)&a, sizeof(a));
		CHECK(r < 0 && errno == EINPROGRESS, "non-blocking connect");
		CHECK(poll(&p, 1, 5000) == 1, "poll");
		CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0, "SO_ERROR");
		printf("so_error %s\n", err ? strerror(err) : "0");
		if (i == 0) {
			r = connect(fd, (struct sockaddr *)&a, sizeof(a));
			CHECK(r < 0 && errno == EISCONN, "connect again");
		}
		close(fd);
	}
	/* A connect timeout shorter than any answer (1 us, spent before the first wait). */
	{
		struct sockaddr_vm a = addr(cid, port);
		struct timeval tv = { .tv_sec = 0, .tv_usec = 1 };
		int fd = socket(AF_VSOCK, SOCK_STREAM, 0), r;

		CHECK(setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv)) == 0,
		      "timeout");
		check_errno(connect(fd, (struct sockaddr *)&a, sizeof(a)), ETIMEDOUT, "timed out");
		/* The socket is usable again afterwards, as the kernel's. */
		tv.tv_sec = 5;
		r = setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv));
		CHECK(r == 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0,
		      "connect after a timeout");
		close(fd);
	}
	return 0;
}

struct thr {
	unsigned cid, port;
	int id;
	bool ok;
};

static void *thread_main(void *arg)
{
	struct thr *t = arg;
	char msg[32], buf[64];
	int fd = vconnect(t->cid, t->port, SOCK_STREAM);

	if (fd < 0)
		return NULL;
	snprintf(msg, sizeof(msg), "thread %d", t->id);
	if (write(fd, msg, strlen(msg)) == (ssize_t)strlen(msg) && shutdown(fd, SHUT_WR) == 0) {
		read_all(fd, buf, sizeof(buf), SOCK_STREAM);
		t->ok = strcmp(buf, msg) == 0;
	}
	close(fd);
	return NULL;
}

static int mode_threads(unsigned cid, unsigned port, int n)
{
	pthread_t th[256];
	struct thr t[256];
	int ok = 0;

	if (n > 256)
		n = 256;
	for (int i = 0; i < n; i++) {
		t[i] = (struct thr){ cid, port, i, false };
		CHECK(pthread_create(&th[i], NULL, thread_main, &t[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		ok += t[i].ok;
	}
	printf("echoed %d of %d\n", ok, n);
	CHECK(ok == n, "all echoed");
	return 0;
}

static int mode_fork(unsigned cid, unsigned port)
{
	char buf[256];
	int fd = vconnect(cid, port, SOCK_STREAM), st = 0;
	pid_t pid;

	CHECK(fd >= 0, "connect");
	if (fd < 0)
		return 1;
	pid = fork();
	if (pid == 0) {
		struct sockaddr_vm p;
		socklen_t pl = sizeof(p);
		bool ok = getpeername(fd, (struct sockaddr *)&p, &pl) == 0 && p.svm_cid == cid &&
			  p.svm_port == port;

		_exit(ok && write(fd, "child;", 6) == 6 ? 0 : 1);
	}
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "child");
	CHECK(write(fd, "parent", 6) == 6 && shutdown(fd, SHUT_WR) == 0, "parent write");
	read_all(fd, buf, sizeof(buf), SOCK_STREAM);
	printf("got %s\n", buf);
	close(fd);
	return 0;
}

static int mode_exec(const char *self, unsigned cid, unsigned port)
{
	int fd = vconnect(cid, port, SOCK_STREAM);
	char num[16];

	CHECK(fd >= 0, "connect");
	if (fd < 0)
		return 1;
	CHECK(fcntl(fd, F_SETFD, 0) == 0, "inheritable");
	snprintf(num, sizeof(num), "%d", fd);
	execl(self, self, "after-exec", num, (char *)NULL);
	CHECK(0, "exec");
	return 1;
}

static int mode_after_exec(int fd)
{
	char buf[256];

	print_names(fd);
	CHECK(write(fd, "exec'd", 6) == 6 && shutdown(fd, SHUT_WR) == 0, "write");
	read_all(fd, buf, sizeof(buf), SOCK_STREAM);
	printf("got %s\n", buf);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned a2 = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 0;
	unsigned a3 = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 0;
	int r = 2;

	refuse_unless_guarded();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 6 && !strcmp(argv[1], "client"))
		r = mode_client(a2, a3, type_of(argv[4]), argv[5]);
	else if (argc == 5 && !strcmp(argv[1], "serve"))
		r = mode_serve(a2, type_of(argv[3]), atoi(argv[4]));
	else if (argc == 4 && !strcmp(argv[1], "errors"))
		r = mode_errors(a2, a3);
	else if (argc == 5 && !strcmp(argv[1], "nonblock"))
		r = mode_nonblock(a2, a3, (unsigned)atoi(argv[4]));
	else if (argc == 5 && !strcmp(argv[1], "threads"))
		r = mode_threads(a2, a3, atoi(argv[4]));
	else if (argc == 4 && !strcmp(argv[1], "fork"))
		r = mode_fork(a2, a3);
	else if (argc == 4 && !strcmp(argv[1], "exec"))
		r = mode_exec(argv[0], a2, a3);
	else if (argc == 3 && !strcmp(argv[1], "after-exec"))
		r = mode_after_exec(atoi(argv[2]));
	else
		fprintf(stderr, "shim-prog: bad arguments\n");
	return r ? r : failed;
}
