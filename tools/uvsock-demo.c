/* SPDX-License-Identifier: MIT */
/*
 * uvsock-demo: the README's demo. Against a running uvsockd, this program plays both ends of one
 * VM's vsock device: the guest (a libuvsock guest context, i.e. a userspace virtio-vsock driver
 * on real shared-memory virtqueues, driven only through the public <uvsock/uvsock.h> and
 * <uvsock/guest.h> calls) and a host program (plain AF_UNIX sockets following the hybrid
 * convention of Firecracker and vhost-device-vsock, nothing of libuvsock). It shows greetings
 * both ways over STREAM, message boundaries over SEQPACKET both ways, a short throughput table,
 * and the commands to try the same by hand. scripts/demo.sh starts uvsockd and runs this.
 *
 * Every wait has a deadline (socket timeouts, plus a watchdog for the whole run); any failure
 * prints one clear line on stderr and exits 1.
 *
 * Usage: uvsock-demo --socket PATH --uds-path PATH [--seconds S] [--uvsockd PATH]
 *        uvsock-demo --loopback [--bytes SIZE]     (the in-process loopback transport, CID 1)
 * (GNU getopt_long; usage errors exit 2, as in every uvsock tool.)
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "util/size.h"
#include "util/time.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

#define G2H_PORT 5000      /* guest -> host STREAM greeting (host listens on <uds>_5000) */
#define G2H_SEQ_PORT 5001  /* guest -> host SEQPACKET (<uds>_5001) */
#define G2H_BULK_PORT 5002 /* guest -> host throughput (<uds>_5002) */
#define H2G_PORT 6000      /* host -> guest STREAM: greeting and throughput */
#define H2G_SEQ_PORT 6001  /* host -> guest SEQPACKET */
#define IO_TIMEOUT_S 5     /* any single socket wait */
#define WATCHDOG_S 60      /* the whole run */
#define BULK_BUF (256u << 10)
#define BULK_RUNS 3        /* throughput: median of this many runs per cell */
#define STR_(x) #x
#define STR(x) STR_(x)

static const size_t bulk_sizes[] = { 64, 4096, 65536 };
static const size_t seq_sizes[] = { 5, 1500, 30000 };

/* ---- failure and time ------------------------------------------------------------------ */

static pthread_mutex_t die_lock = PTHREAD_MUTEX_INITIALIZER;

/* Prints one line and exits 1. When two threads fail at once, the first one's line is shown. */
static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&die_lock); /* never unlocked: a second failing thread waits here */
	fflush(stdout);
	fputs("uvsock-demo: FAILED: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	/* Other threads may still be inside libuvsock: leave without running destructors. */
	_exit(1);
}

static void on_alarm(int sig)
{
	static const char msg[] = "uvsock-demo: FAILED: not done after " STR(WATCHDOG_S) " s (watchdog)\n";

	(void)sig;
	if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
		/* Nothing else to do: exiting is the message. */
	}
	_exit(1);
}

/* Seconds on the tree's monotonic clock (util/time.h), for rates. */
static double now_s(void)
{
	return (double)mono_ns() / (double)NS_PER_SEC;
}

/* ---- the host program: plain Unix sockets ---------------------------------------------- */

static const char *uds_path;

/* The file name part of a path, for short output (the directory is printed once). */
static const char *base(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

static void host_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = IO_TIMEOUT_S };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		die("host: setsockopt: %s", strerror(errno));
}

static void unix_addr(struct sockaddr_un *a, const char *path)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(a->sun_path))
		die("socket path too long: %s", path);
	memcpy(a->sun_path, path, strlen(path) + 1);
}

/* Listens at <uds>_<port>, where uvsockd connects when the guest connects to CID 2 port. */
static int host_listen(unsigned port, int type, char *path, size_t cap)
{
	struct sockaddr_un a;
	int fd;

	snprintf(path, cap, "%s_%u", uds_path, port);
	unix_addr(&a, path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 8) < 0)
		die("host: listen on %s: %s", path, strerror(errno));
	return fd;
}

static int host_accept(int lfd)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	int fd;

	if (poll(&p, 1, IO_TIMEOUT_S * 1000) != 1)
		die("host: no connection from uvsockd within %d s", IO_TIMEOUT_S);
	fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		die("host: accept: %s", strerror(errno));
	host_timeouts(fd);
	return fd;
}

static void host_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("host: write: %s", n < 0 ? strerror(errno) : "nothing written");
		p += n;
		len -= (size_t)n;
	}
}

/* Reads one line (without its newline) byte by byte, so nothing after it is consumed. */
static void host_read_line(int fd, char *line, size_t cap)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = read(fd, line + got, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("host: read: %s", n < 0 ? strerror(errno) : "connection closed");
		if (line[got] == '\n')
			break;
		if (++got + 1 >= cap)
			die("host: line too long");
	}
	line[got] = '\0';
}

/*
 * Host -> guest: connects to <uds> (STREAM) or <uds>_seqpacket, sends "CONNECT <port>\n" and
 * reads uvsockd's "OK <host-port>\n". Stores the host's vsock port in *ret_port.
 */
static int host_connect_guest(int type, unsigned port, unsigned *ret_port)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 16], line[64];
	struct sockaddr_un a;
	int fd, n;

	if (type == SOCK_SEQPACKET)
		snprintf(path, sizeof(path), "%s_seqpacket", uds_path);
	else
		snprintf(path, sizeof(path), "%s", uds_path);
	unix_addr(&a, path);
	fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("host: connect to %s: %s", path, strerror(errno));
	host_timeouts(fd);
	n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	host_write_all(fd, line, (size_t)n);
	if (type == SOCK_SEQPACKET) {
		ssize_t r = recv(fd, line, sizeof(line) - 1, 0);

		if (r <= 0)
			die("host: no answer to CONNECT %u on %s: %s", port, path,
			    r < 0 ? strerror(errno) : "closed (nobody listens?)");
		line[r] = '\0';
		line[strcspn(line, "\n")] = '\0';
	} else {
		host_read_line(fd, line, sizeof(line));
	}
	if (sscanf(line, "OK %u", ret_port) != 1)
		die("host: uvsockd answered \"%s\" to CONNECT %u", line, port);
	return fd;
}

/* ---- the guest: a libuvsock guest context ---------------------------------------------- */

static struct uvsock_ctx *guest;

static void guest_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = IO_TIMEOUT_S };

	if (uvsock_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    uvsock_setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		die("guest: setsockopt: %s", strerror(errno));
}

static int guest_connect_host(int type, unsigned port, unsigned *ret_local_port)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_HOST,
				  .svm_port = port };
	socklen_t len = sizeof(sa);
	int fd = uvsock_socket(guest, type, 0);

	if (fd < 0)
		die("guest: socket: %s", strerror(errno));
	guest_timeouts(fd);
	if (uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("guest: connect to cid 2 port %u: %s", port, strerror(errno));
	if (uvsock_getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
		die("guest: getsockname: %s", strerror(errno));
	*ret_local_port = sa.svm_port;
	return fd;
}

static int guest_listen(int type, unsigned port)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				  .svm_port = port };
	int fd = uvsock_socket(guest, type, 0);

	if (fd < 0 || uvsock_bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    uvsock_listen(fd, 8) < 0)
		die("guest: listen on port %u: %s", port, strerror(errno));
	guest_timeouts(fd);
	return fd;
}

static int guest_accept(int lfd, struct sockaddr_vm *ret_peer)
{
	socklen_t len = sizeof(*ret_peer);
	int fd = uvsock_accept(lfd, (struct sockaddr *)ret_peer, &len);

	if (fd < 0)
		die("guest: accept: %s", strerror(errno));
	guest_timeouts(fd);
	return fd;
}

static void guest_send_all(int fd, const void *buf, size_t len)
{
	ssize_t n = uvsock_send(fd, buf, len, 0);

	if (n != (ssize_t)len)
		die("guest: send: %s", n < 0 ? strerror(errno) : "short send");
}

static void guest_read_line(int fd, char *line, size_t cap)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = uvsock_recv(fd, line + got, 1, 0);

		if (n <= 0)
			die("guest: recv: %s", n < 0 ? strerror(errno) : "connection closed");
		if (line[got] == '\n')
			break;
		if (++got + 1 >= cap)
			die("guest: line too long");
	}
	line[got] = '\0';
}

/* ---- 1 and 2: greetings over STREAM ---------------------------------------------------- */

static void demo_guest_to_host(void)
{
	char path[160], line[128];
	unsigned gport;
	int lfd, hfd, gfd;

	lfd = host_listen(G2H_PORT, SOCK_STREAM, path, sizeof(path));
	printf("1. guest -> host, STREAM: the guest connects to cid 2 port %u; uvsockd connects\n"
	       "   that to the host program listening on %s\n", G2H_PORT, base(path));
	gfd = guest_connect_host(SOCK_STREAM, G2H_PORT, &gport);
	hfd = host_accept(lfd);
	guest_send_all(gfd, "hello from the guest\n", 21);
	host_read_line(hfd, line, sizeof(line));
	printf("   guest(cid %u:port %u) -> host: \"%s\"\n", uvsock_ctx_local_cid(guest), gport,
	       line);
	host_write_all(hfd, "hello from the host\n", 20);
	guest_read_line(gfd, line, sizeof(line));
	printf("   host -> guest(cid %u:port %u): \"%s\"\n", uvsock_ctx_local_cid(guest), gport,
	       line);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	unlink(path);
}

static void demo_host_to_guest(int glfd)
{
	struct sockaddr_vm peer;
	char line[128];
	unsigned hport;
	int hfd, gfd;

	hfd = host_connect_guest(SOCK_STREAM, H2G_PORT, &hport);
	gfd = guest_accept(glfd, &peer);
	printf("2. host -> guest, STREAM: the guest listens on port %u; the host program connects\n"
	       "   to %s, writes \"CONNECT %u\", and uvsockd answers \"OK %u\"\n", H2G_PORT,
	       base(uds_path), H2G_PORT, hport);
	host_write_all(hfd, "hello guest, the host here\n", 27);
	guest_read_line(gfd, line, sizeof(line));
	printf("   host(cid %u:port %u) -> guest(port %u): \"%s\"\n", peer.svm_cid, peer.svm_port,
	       H2G_PORT, line);
	guest_send_all(gfd, "hello host, the guest here\n", 27);
	host_read_line(hfd, line, sizeof(line));
	printf("   guest(cid %u:port %u) -> host: \"%s\"\n", uvsock_ctx_local_cid(guest), H2G_PORT,
	       line);
	uvsock_close(gfd);
	close(hfd);
}

/* ---- 3: SEQPACKET message boundaries --------------------------------------------------- */

static unsigned char seq_byte(size_t msg, size_t off)
{
	return (unsigned char)(msg * 131 + off * 7 + 1);
}

static void seq_fill(unsigned char *buf, size_t msg)
{
	for (size_t j = 0; j < seq_sizes[msg]; j++)
		buf[j] = seq_byte(msg, j);
}

/* Checks message msg (n bytes received); returns its length for printing. */
static size_t seq_check(const char *who, const unsigned char *buf, ssize_t n, size_t msg)
{
	if (n < 0)
		die("%s: recv of SEQPACKET message %zu: %s", who, msg + 1, strerror(errno));
	if ((size_t)n != seq_sizes[msg])
		die("%s: SEQPACKET message %zu has %zd bytes, %zu were sent: boundaries lost", who,
		    msg + 1, n, seq_sizes[msg]);
	for (size_t j = 0; j < (size_t)n; j++)
		if (buf[j] != seq_byte(msg, j))
			die("%s: SEQPACKET message %zu differs at byte %zu", who, msg + 1, j);
	return (size_t)n;
}

/* "3 messages (5, 1500, 30000 bytes)" */
static void print_sizes(const size_t *len, size_t count)
{
	printf("%zu messages (", count);
	for (size_t i = 0; i < count; i++)
		printf("%s%zu", i ? ", " : "", len[i]);
	printf(" bytes)");
}

static void print_seq_line(const char *from, const char *to, const size_t *got, size_t count)
{
	printf("   %s sent ", from);
	print_sizes(seq_sizes, count);
	printf(", %s received ", to);
	print_sizes(got, count);
	printf("\n");
}

static void demo_seqpacket(unsigned char *buf)
{
	const size_t nmsg = sizeof(seq_sizes) / sizeof(seq_sizes[0]);
	size_t got[sizeof(seq_sizes) / sizeof(seq_sizes[0])];
	struct sockaddr_vm peer;
	char path[160];
	unsigned gport, hport;
	int lfd, hfd, gfd, glfd;

	lfd = host_listen(G2H_SEQ_PORT, SOCK_SEQPACKET, path, sizeof(path));
	printf("3. SEQPACKET keeps message boundaries: guest -> cid 2 port %u (host listening on\n"
	       "   %s), then host -> guest port %u (host connected to %s_seqpacket)\n",
	       G2H_SEQ_PORT, base(path), H2G_SEQ_PORT, base(uds_path));
	gfd = guest_connect_host(SOCK_SEQPACKET, G2H_SEQ_PORT, &gport);
	hfd = host_accept(lfd);
	for (size_t i = 0; i < nmsg; i++) {
		seq_fill(buf, i);
		guest_send_all(gfd, buf, seq_sizes[i]);
	}
	for (size_t i = 0; i < nmsg; i++)
		got[i] = seq_check("host", buf, recv(hfd, buf, BULK_BUF, 0), i);
	print_seq_line("guest", "host", got, nmsg);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	unlink(path);

	glfd = guest_listen(SOCK_SEQPACKET, H2G_SEQ_PORT);
	hfd = host_connect_guest(SOCK_SEQPACKET, H2G_SEQ_PORT, &hport);
	gfd = guest_accept(glfd, &peer);
	for (size_t i = 0; i < nmsg; i++) {
		seq_fill(buf, i);
		host_write_all(hfd, buf, seq_sizes[i]);
	}
	for (size_t i = 0; i < nmsg; i++)
		got[i] = seq_check("guest", buf, uvsock_recv(gfd, buf, BULK_BUF, 0), i);
	print_seq_line("host", "guest", got, nmsg);
	uvsock_close(gfd);
	uvsock_close(glfd);
	close(hfd);
}

/* ---- 4: throughput --------------------------------------------------------------------- */

/* The receiving end of one run: reads to end of stream, then answers with the byte count. */
struct sink {
	int fd;
	bool is_guest;
	unsigned char *buf;
};

static void *sink_main(void *p)
{
	struct sink *s = p;
	unsigned long long total = 0;
	ssize_t n;

	for (;;) {
		n = s->is_guest ? uvsock_recv(s->fd, s->buf, BULK_BUF, 0)
				: read(s->fd, s->buf, BULK_BUF);
		if (n < 0 && errno == EINTR && !s->is_guest)
			continue;
		if (n <= 0)
			break;
		total += (unsigned long long)n;
	}
	if (n < 0)
		die("%s: receive: %s", s->is_guest ? "guest" : "host", strerror(errno));
	if (s->is_guest)
		guest_send_all(s->fd, &total, sizeof(total));
	else
		host_write_all(s->fd, &total, sizeof(total));
	return NULL;
}

/* Sends size-byte writes for `seconds`, then half-closes; returns MiB/s (drain included). */
static double bulk_run(bool from_guest, size_t size, double seconds, int hlfd, int glfd,
		       unsigned char *sbuf, unsigned char *rbuf)
{
	struct sink s = { .buf = rbuf };
	unsigned long long sent = 0, got = 0;
	struct sockaddr_vm peer;
	unsigned port;
	double t0, t1;
	pthread_t th;
	int fd;
	ssize_t n;

	if (from_guest) {
		fd = guest_connect_host(SOCK_STREAM, G2H_BULK_PORT, &port);
		s.fd = host_accept(hlfd);
		s.is_guest = false;
	} else {
		fd = host_connect_guest(SOCK_STREAM, H2G_PORT, &port);
		s.fd = guest_accept(glfd, &peer);
		s.is_guest = true;
	}
	if (pthread_create(&th, NULL, sink_main, &s))
		die("pthread_create failed");
	t0 = now_s();
	do {
		if (from_guest) {
			guest_send_all(fd, sbuf, size);
		} else {
			host_write_all(fd, sbuf, size);
		}
		sent += size;
	} while (now_s() - t0 < seconds);
	if (from_guest) {
		if (uvsock_shutdown(fd, SHUT_WR) < 0)
			die("guest: shutdown: %s", strerror(errno));
		n = uvsock_recv(fd, &got, sizeof(got), MSG_WAITALL);
	} else {
		if (shutdown(fd, SHUT_WR) < 0)
			die("host: shutdown: %s", strerror(errno));
		n = recv(fd, &got, sizeof(got), MSG_WAITALL);
	}
	t1 = now_s();
	if (n != sizeof(got))
		die("%s: no byte count back from the receiver: %s", from_guest ? "guest" : "host",
		    n < 0 ? strerror(errno) : "connection closed");
	pthread_join(th, NULL);
	if (got != sent)
		die("%s -> %s: the receiver got %llu of %llu bytes", from_guest ? "guest" : "host",
		    from_guest ? "host" : "guest", got, sent);
	if (from_guest) {
		uvsock_close(fd);
		close(s.fd);
	} else {
		close(fd);
		uvsock_close(s.fd);
	}
	return (double)sent / (1024.0 * 1024.0) / (t1 - t0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of BULK_RUNS runs (a preempted run on a busy machine does not make the figure). */
static double bulk_median(bool from_guest, size_t size, double seconds, int hlfd, int glfd,
			  unsigned char *sbuf, unsigned char *rbuf)
{
	double r[BULK_RUNS];

	for (int i = 0; i < BULK_RUNS; i++)
		r[i] = bulk_run(from_guest, size, seconds, hlfd, glfd, sbuf, rbuf);
	qsort(r, BULK_RUNS, sizeof(r[0]), cmp_double);
	return r[BULK_RUNS / 2];
}

static void demo_throughput(double seconds, int glfd, unsigned char *rbuf)
{
	unsigned char *sbuf = calloc(1, 65536);
	char path[160];
	double g2h_small = 0, h2g_small = 0;
	int hlfd;

	if (!sbuf)
		die("out of memory");
	memset(sbuf, 'x', 65536);
	hlfd = host_listen(G2H_BULK_PORT, SOCK_STREAM, path, sizeof(path));
	printf("4. Throughput of one connection (median of %d runs of %.2g s): a quick demo figure,\n"
	       "   not a benchmark (that is uvsock-perf: make bench)\n", BULK_RUNS, seconds);
	printf("   %-10s  %-24s  %s\n", "write size", "guest -> host", "host -> guest");
	for (size_t i = 0; i < sizeof(bulk_sizes) / sizeof(bulk_sizes[0]); i++) {
		double g2h = bulk_median(true, bulk_sizes[i], seconds, hlfd, glfd, sbuf, rbuf);
		double h2g = bulk_median(false, bulk_sizes[i], seconds, hlfd, glfd, sbuf, rbuf);
		char sz[32];

		if (bulk_sizes[i] >= 1024)
			snprintf(sz, sizeof(sz), "%zu KiB", bulk_sizes[i] / 1024);
		else
			snprintf(sz, sizeof(sz), "%zu B", bulk_sizes[i]);
		printf("   %-10s  %7.0f MiB/s %5.2f Gbit/s  %7.0f MiB/s %5.2f Gbit/s\n", sz, g2h,
		       g2h * 8 * 1.048576 / 1000, h2g, h2g * 8 * 1.048576 / 1000);
		if (i == 0) {
			g2h_small = g2h;
			h2g_small = h2g;
		}
	}
	/*
	 * The explanation, only when the figures show it: the host program's writes are system
	 * calls into a Unix socket (about 2.5 us per 64 B write through a plain socketpair on a
	 * 2-core test machine, no faster than this column), the guest's are calls into libuvsock
	 * in this process, gathered into packets of up to 64 KiB.
	 */
	if (h2g_small < g2h_small)
		printf("   Why 64 B host -> guest is slower: the host makes a write() system call per "
		       "64 B, the guest none\n");
	close(hlfd);
	unlink(path);
	free(sbuf);
}

/* ---- 5: try it yourself ---------------------------------------------------------------- */

static void demo_try_it(const char *uvsockd)
{
	printf("\nTry it yourself (the demo's sockets are gone by now; these use /tmp):\n"
	       "  %s --vm guest-cid=3,socket=/tmp/vm3.sock,uds-path=/tmp/vm3.vsock &\n"
	       "  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem0,size=512M,share=on \\\n"
	       "    -machine q35,memory-backend=mem0 -chardev socket,id=char0,path=/tmp/vm3.sock \\\n"
	       "    -device vhost-user-vsock-pci,chardev=char0\n"
	       "  or a ready-made VM: scripts/vm-shell.sh /tmp/vm3.sock"
	       "  (in it: uvsock-guest listen 5000)\n"
	       "  host -> guest port 5000: socat - UNIX-CONNECT:/tmp/vm3.vsock  then type: CONNECT 5000\n"
	       "  guest -> host port 5000: socat UNIX-LISTEN:/tmp/vm3.vsock_5000,fork -\n",
	       uvsockd);
}

/* ---- the loopback demo (no uvsockd) ---------------------------------------------------- */

struct lo_server {
	struct uvsock_ctx *ctx;
	int lfd;
};

static void *lo_server_main(void *p)
{
	struct lo_server *s = p;
	static unsigned char buf[65536];
	ssize_t n;
	int fd;

	fd = uvsock_accept(s->lfd, NULL, NULL);
	if (fd < 0)
		die("loopback server: accept: %s", strerror(errno));
	n = uvsock_recv(fd, buf, sizeof(buf) - 1, 0);
	if (n < 0)
		die("loopback server: recv: %s", strerror(errno));
	buf[n] = '\0';
	printf("server: got \"%s\"\n", (char *)buf);
	guest_send_all(fd, "hello from the vsock server", 27);
	uvsock_close(fd);
	for (size_t i = 0; i < sizeof(bulk_sizes) / sizeof(bulk_sizes[0]); i++) {
		unsigned long long total = 0;

		fd = uvsock_accept(s->lfd, NULL, NULL);
		if (fd < 0)
			die("loopback server: accept: %s", strerror(errno));
		while ((n = uvsock_recv(fd, buf, sizeof(buf), 0)) > 0)
			total += (unsigned long long)n;
		if (n < 0)
			die("loopback server: recv: %s", strerror(errno));
		guest_send_all(fd, &total, sizeof(total));
		uvsock_close(fd);
	}
	return NULL;
}

static int lo_connect(struct uvsock_ctx *ctx, unsigned port)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_LOCAL,
				  .svm_port = port };
	int fd = uvsock_socket(ctx, SOCK_STREAM, 0);

	if (fd < 0 || uvsock_connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("loopback client: connect: %s", strerror(errno));
	return fd;
}

static int demo_loopback(size_t bytes_per_size)
{
	struct sockaddr_vm sa = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				  .svm_port = 1234 };
	struct lo_server srv;
	char buf[128], *data;
	pthread_t th;
	ssize_t n;
	int fd;

	srv.ctx = uvsock_ctx_new_loopback(NULL);
	if (!srv.ctx)
		die("uvsock_ctx_new_loopback: %s", strerror(errno));
	srv.lfd = uvsock_socket(srv.ctx, SOCK_STREAM, 0);
	if (srv.lfd < 0 || uvsock_bind(srv.lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    uvsock_listen(srv.lfd, 4) < 0)
		die("loopback server: listen: %s", strerror(errno));
	printf("server: listening on vsock CID %u port %u (uvsock loopback transport)\n",
	       uvsock_ctx_local_cid(srv.ctx), 1234);
	if (pthread_create(&th, NULL, lo_server_main, &srv))
		die("pthread_create failed");
	fd = lo_connect(srv.ctx, 1234);
	guest_send_all(fd, "hello from the vsock client", 27);
	n = uvsock_recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL);
	if (n < 0)
		die("loopback client: recv: %s", strerror(errno));
	buf[n] = '\0';
	printf("client: got \"%s\"\n", buf);
	uvsock_close(fd);

	data = calloc(1, 65536);
	if (!data)
		die("out of memory");
	printf("\n%-12s %12s %10s %12s\n", "write size", "bytes", "seconds", "MiB/s");
	for (size_t i = 0; i < sizeof(bulk_sizes) / sizeof(bulk_sizes[0]); i++) {
		/* 64-byte writes are per-call bound: move an eighth of the bytes. */
		size_t want = bulk_sizes[i] < 4096 ? bytes_per_size / 8 : bytes_per_size;
		unsigned long long got = 0;
		size_t sent = 0;
		double t0, t1;

		fd = lo_connect(srv.ctx, 1234);
		t0 = now_s();
		while (sent < want) {
			guest_send_all(fd, data, bulk_sizes[i]);
			sent += bulk_sizes[i];
		}
		uvsock_shutdown(fd, SHUT_WR);
		if (uvsock_recv(fd, &got, sizeof(got), MSG_WAITALL) != sizeof(got))
			die("loopback client: no byte count back");
		t1 = now_s();
		uvsock_close(fd);
		if (got != sent)
			die("loopback server got %llu of %zu bytes", got, sent);
		printf("%-12zu %12zu %10.3f %12.1f\n", bulk_sizes[i], sent, t1 - t0,
		       (double)sent / (1024.0 * 1024.0) / (t1 - t0));
	}
	pthread_join(th, NULL);
	free(data);
	uvsock_close(srv.lfd);
	uvsock_ctx_free(srv.ctx);
	return 0;
}

/* ---- main ------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f, "usage: uvsock-demo --socket PATH --uds-path PATH [--seconds S] [--uvsockd PATH]\n"
		   "       uvsock-demo --loopback [--bytes SIZE]\n"
		   "  --socket PATH    vhost-user socket of a running uvsockd (the guest connects)\n"
		   "  --uds-path PATH  that VM's uds-path (the host program's side)\n"
		   "  --seconds S      duration of each throughput run (default 0.15, max 10)\n"
		   "  --uvsockd PATH   how to name uvsockd in the try-it-yourself commands\n"
		   "  --loopback       the in-process loopback transport instead (no uvsockd)\n"
		   "  --bytes SIZE     with --loopback: bytes per write size (K, M, G suffixes;\n"
		   "                   1M..4G, default 64M)\n"
		   "  -h, --help       this text\n"
		   "  -V, --version    the version\n");
}

enum { OPT_SOCKET = 256, OPT_UDS_PATH, OPT_UVSOCKD, OPT_SECONDS, OPT_BYTES, OPT_LOOPBACK };

static const struct option long_opts[] = {
	{ .name = "socket", .has_arg = required_argument, .val = OPT_SOCKET },
	{ .name = "uds-path", .has_arg = required_argument, .val = OPT_UDS_PATH },
	{ .name = "uvsockd", .has_arg = required_argument, .val = OPT_UVSOCKD },
	{ .name = "seconds", .has_arg = required_argument, .val = OPT_SECONDS },
	{ .name = "bytes", .has_arg = required_argument, .val = OPT_BYTES },
	{ .name = "loopback", .has_arg = no_argument, .val = OPT_LOOPBACK },
	{ .name = "help", .has_arg = no_argument, .val = 'h' },
	{ .name = "version", .has_arg = no_argument, .val = 'V' },
	{ .name = NULL },
};

/* A usage error: one line naming the problem, then exit status 2 (as every uvsock tool). */
static int __attribute__((format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("uvsock-demo: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see --help)\n", stderr);
	return 2;
}

int main(int argc, char **argv)
{
	const char *sock = NULL, *uvsockd = "uvsockd";
	struct uvsock_guest_opts gopts = { .size = sizeof(gopts),
					   .timeout_ms = IO_TIMEOUT_S * 1000 };
	double seconds = 0.15;
	bool loopback = false;
	uint64_t bytes = 64ull << 20;
	unsigned char *buf;
	int glfd, c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hV", long_opts, NULL)) != -1) {
		char *end;

		switch (c) {
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("uvsock-demo %s\n", UVSOCK_VERSION);
			return 0;
		case OPT_SOCKET:
			sock = optarg;
			break;
		case OPT_UDS_PATH:
			uds_path = optarg;
			break;
		case OPT_UVSOCKD:
			uvsockd = optarg;
			break;
		case OPT_LOOPBACK:
			loopback = true;
			break;
		case OPT_SECONDS:
			seconds = strtod(optarg, &end);
			if (*end || !(seconds > 0 && seconds <= 10))
				return usage_error("--seconds wants (0, 10]");
			break;
		case OPT_BYTES:
			if (size_parse(optarg, 1ull << 20, 4ull << 30, &bytes) < 0)
				return usage_error("--bytes '%s' wants 1M..4G (K, M, G suffixes)",
						   optarg);
			break;
		case ':':
			return usage_error("%s needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (!loopback && (!sock || !uds_path))
		return usage_error("--socket and --uds-path are needed (or --loopback)");
	signal(SIGALRM, on_alarm);
	alarm(WATCHDOG_S);
	if (loopback)
		return demo_loopback((size_t)bytes);
	setvbuf(stdout, NULL, _IOLBF, 0);

	guest = uvsock_ctx_new_guest(sock, &gopts);
	if (!guest)
		die("cannot start the guest on uvsockd's socket %s: %s", sock, strerror(errno));
	/* The directory of the vhost-user socket: everything up to its last '/'. */
	printf("uvsockd's sockets, in %.*s: %s (vhost-user: QEMU's end, here\n"
	       "the guest's) and %s* (host side). This process runs both the guest (a userspace\n"
	       "virtio-vsock driver, libuvsock; cid %u from uvsockd) and a host program (Unix sockets).\n",
	       base(sock) > sock ? (int)(base(sock) - sock - 1) : 1,
	       base(sock) > sock ? sock : ".", base(sock), base(uds_path),
	       uvsock_ctx_local_cid(guest));
	buf = malloc(BULK_BUF);
	if (!buf)
		die("out of memory");

	glfd = guest_listen(SOCK_STREAM, H2G_PORT);
	demo_guest_to_host();
	demo_host_to_guest(glfd);
	demo_seqpacket(buf);
	demo_throughput(seconds, glfd, buf);
	demo_try_it(uvsockd);

	uvsock_close(glfd);
	uvsock_ctx_free(guest);
	free(buf);
	return 0;
}
