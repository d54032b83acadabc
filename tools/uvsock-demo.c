/* SPDX-License-Identifier: MIT */
/*
 * uvsock-demo: a client and a server talking AF_VSOCK semantics through libuvsock. The server
 * listens on CID 1 (loopback) port 1234 and echoes a greeting, then sinks a bulk transfer per
 * write size; the client prints what it got and a short throughput table.
 *
 * Usage: uvsock-demo [--bytes MIB]
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uvsock/uvsock.h>

#define DEMO_PORT 1234

static const size_t sizes[] = { 64, 4096, 65536 };
static size_t bytes_per_size = 64u << 20;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "uvsock-demo: %s: %s\n", what, strerror(errno));
	exit(1);
}

struct server {
	struct uvsock_ctx *ctx;
	int lfd;
};

static void *server_main(void *p)
{
	struct server *s = p;
	char buf[65536];
	ssize_t n;
	int fd;

	/* First connection: greeting echo. */
	fd = uvsock_accept(s->lfd, NULL, NULL);
	if (fd < 0)
		die("accept");
	n = uvsock_recv(fd, buf, sizeof(buf) - 1, 0);
	if (n < 0)
		die("recv");
	buf[n] = '\0';
	printf("server: got \"%s\"\n", buf);
	if (uvsock_send(fd, "hello from the vsock server", 27, 0) != 27)
		die("send");
	uvsock_close(fd);
	/* One connection per write size: sink everything, then report the count. */
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned long long total = 0;

		fd = uvsock_accept(s->lfd, NULL, NULL);
		if (fd < 0)
			die("accept");
		while ((n = uvsock_recv(fd, buf, sizeof(buf), 0)) > 0)
			total += (unsigned long long)n;
		if (n < 0)
			die("recv");
		n = uvsock_send(fd, &total, sizeof(total), 0);
		if (n != sizeof(total))
			die("send count");
		uvsock_close(fd);
	}
	return NULL;
}

static int connect_server(struct uvsock_ctx *ctx)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_LOCAL,
				  .svm_port = DEMO_PORT };
	int fd = uvsock_socket(ctx, SOCK_STREAM, 0);

	if (fd < 0 || uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("connect");
	return fd;
}

int main(int argc, char **argv)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				  .svm_port = DEMO_PORT };
	struct server srv;
	char buf[128], *data;
	pthread_t th;
	ssize_t n;
	int fd;

	if (argc == 3 && strcmp(argv[1], "--bytes") == 0 && atoi(argv[2]) > 0) {
		bytes_per_size = (size_t)atoi(argv[2]) << 20;
	} else if (argc != 1) {
		fprintf(stderr, "usage: %s [--bytes MIB]\n", argv[0]);
		return 2;
	}
	srv.ctx = uvsock_ctx_new_loopback(NULL);
	if (!srv.ctx)
		die("uvsock_ctx_new_loopback");
	srv.lfd = uvsock_socket(srv.ctx, SOCK_STREAM, 0);
	if (srv.lfd < 0 || uvsock_bind(srv.lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    uvsock_listen(srv.lfd, 4) < 0)
		die("listen");
	printf("server: listening on vsock CID %u port %u (uvsock loopback transport)\n",
	       uvsock_ctx_local_cid(srv.ctx), DEMO_PORT);
	if (pthread_create(&th, NULL, server_main, &srv))
		die("pthread_create");

	fd = connect_server(srv.ctx);
	if (uvsock_send(fd, "hello from the vsock client", 27, 0) != 27)
		die("send");
	n = uvsock_recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL);
	if (n < 0)
		die("recv");
	buf[n] = '\0';
	printf("client: got \"%s\"\n", buf);
	uvsock_close(fd);

	data = calloc(1, 65536);
	if (!data)
		die("calloc");
	printf("\n%-12s %12s %10s %12s\n", "write size", "bytes", "seconds", "MiB/s");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned long long got = 0;
		size_t sent = 0;
		double t0, t1;

		/* 64-byte writes are per-call bound: move an eighth of the bytes. */
		size_t want = sizes[i] < 4096 ? bytes_per_size / 8 : bytes_per_size;

		fd = connect_server(srv.ctx);
		t0 = now_s();
		while (sent < want) {
			n = uvsock_send(fd, data, sizes[i], 0);
			if (n < 0)
				die("send");
			sent += (size_t)n;
		}
		uvsock_shutdown(fd, SHUT_WR);
		if (uvsock_recv(fd, &got, sizeof(got), MSG_WAITALL) != sizeof(got))
			die("recv count");
		t1 = now_s();
		uvsock_close(fd);
		if (got != sent) {
			fprintf(stderr, "uvsock-demo: server got %llu of %zu bytes\n", got, sent);
			return 1;
		}
		printf("%-12zu %12zu %10.3f %12.1f\n", sizes[i], sent, t1 - t0,
		       (double)sent / (1024.0 * 1024.0) / (t1 - t0));
	}
	pthread_join(th, NULL);
	free(data);
	uvsock_close(srv.lfd);
	uvsock_ctx_free(srv.ctx);
	return 0;
}
