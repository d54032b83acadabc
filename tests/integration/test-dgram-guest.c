/* SPDX-License-Identifier: MIT */
/*
 * Datagrams end to end: the guest role in this process (uvsock_ctx_new_guest) through the
 * uvsockd binary (a child process, by PID, in a temporary directory) to host programs that use
 * plain AF_UNIX SOCK_DGRAM sockets, per the host-side convention of docs/uvsockd.md: every
 * host-side datagram starts with "<guest port>\n"; guest -> host port P arrives at the socket
 * bound at <uds-path>_<P>.dgram; host -> guest is sent to <uds-path>.dgram.
 *
 * Covers: both directions with the addresses each side sees and a reply each way; every size
 * boundary (0, 1, 4 KiB, the 65 492-byte maximum, one more is EMSGSIZE) both ways, content
 * checked; a host sender bound at another path gets an ephemeral port and the guest's reply;
 * 16 guest threads sending on one socket and 16 host threads sending to one guest socket, every
 * datagram intact and unique, and sent = received + the drops uvsockd and the engine counted;
 * a guest that does not negotiate datagrams (ENODEV, the host's datagrams dropped and counted,
 * streams unaffected).
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "ctlquery.h"
#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"

#define DG_MAX     65492u
#define HOST_PORT  5100u
#define GUEST_PORT 7000u
#define NTHREADS   16
#define PER_THREAD 400
#define FLOOD_SIZE 1024u
#define QUIET_MS   300
#define ANY_PORT   UINT32_MAX

struct dg_env {
	struct uvd u;
	struct uvsock_ctx *g;
	char vm_path[160]; /* <uds>.dgram, uvsockd's per-VM socket */
};

static void env_up(struct dg_env *d, unsigned guest_flags)
{
	static const uint32_t cid3[] = { 3 };
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = guest_flags };

	uvd_start(&d->u, 1, cid3, NULL, NULL);
	d->g = g_guest_new(d->u.sock[0], &o);
	snprintf(d->vm_path, sizeof(d->vm_path), "%s.dgram", d->u.uds[0]);
}

static void env_down(struct dg_env *d)
{
	uvsock_ctx_free(d->g);
	ASSERT_EQ(uvd_stop(&d->u), 0);
}

static struct sockaddr_un un_addr(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	ASSERT_LT(strlen(path), sizeof(a.sun_path));
	memcpy(a.sun_path, path, strlen(path) + 1);
	return a;
}

/* A host AF_UNIX datagram socket bound at path (NULL: unbound), 5 s receive timeout. */
static int host_dgram(const char *path)
{
	struct timeval tv = { .tv_sec = WAIT_MS / 1000 };
	int big = 4 << 20, fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	if (path) {
		struct sockaddr_un a = un_addr(path);

		ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	}
	return fd;
}

/* The path a host program binds to receive guest datagrams sent to host port p. */
static void port_path(const struct dg_env *d, uint32_t p, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s_%u.dgram", d->u.uds[0], p);
}

/* A guest datagram socket bound at port (VMADDR_PORT_ANY: automatic on first send). */
static int guest_dgram(struct dg_env *d, uint32_t port)
{
	int fd = uvsock_socket(d->g, SOCK_DGRAM, 0);

	ASSERT_GE(fd, 0);
	if (port != VMADDR_PORT_ANY) {
		struct sockaddr_vm a = vm_addr(VMADDR_CID_ANY, port);

		ASSERT_EQ(uvsock_bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	}
	g_set_timeouts(fd, WAIT_MS);
	return fd;
}

/* Sends "<port>\n" + payload from host socket fd to uvsockd's per-VM socket. */
static void host_send(const struct dg_env *d, int fd, uint32_t port, const void *p, size_t n)
{
	struct sockaddr_un a = un_addr(d->vm_path);
	char line[16];
	int l = snprintf(line, sizeof(line), "%u\n", port);
	struct iovec iov[2] = { { line, (size_t)l }, { (void *)p, n } };
	struct msghdr m = {
		.msg_name = &a, .msg_namelen = sizeof(a), .msg_iov = iov, .msg_iovlen = 2
	};

	ASSERT_EQ(sendmsg(fd, &m, 0), (ssize_t)(l + (int)n));
}

/*
 * Receives one host datagram: checks its "<want_port>\n" line (ANY_PORT: any port), returns the
 * payload length.
 */
static size_t host_recv(int fd, uint32_t want_port, void *buf, size_t cap)
{
	char *tmp = malloc(cap + 16), *nl;
	ssize_t n;
	size_t pl;

	ASSERT_TRUE(tmp != NULL);
	n = recv(fd, tmp, cap + 16, 0);
	if (n < 0)
		test_fail(__FILE__, __LINE__, "host recv: %s", strerror(errno));
	nl = memchr(tmp, '\n', (size_t)n);
	ASSERT_TRUE(nl != NULL);
	*nl = 0;
	if (want_port != ANY_PORT)
		ASSERT_EQ(strtoul(tmp, NULL, 10), want_port);
	pl = (size_t)(tmp + n - (nl + 1));
	ASSERT_LE(pl, cap);
	memcpy(buf, nl + 1, pl);
	free(tmp);
	return pl;
}

/*
 * uvsockd with guest 3 (datagrams on), a host socket bound at <uds>_HOST_PORT.dgram (its path in
 * path) and a guest datagram socket bound at GUEST_PORT.
 */
static void pair_up(struct dg_env *d, char *path, size_t cap, int *gfd, int *hfd)
{
	env_up(d, 0);
	port_path(d, HOST_PORT, path, cap);
	*hfd = host_dgram(path);
	*gfd = guest_dgram(d, GUEST_PORT);
}

static void pair_down(struct dg_env *d, const char *path, int gfd, int hfd)
{
	uvsock_close(gfd);
	close(hfd);
	unlink(path);
	env_down(d);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7u + seed);
}

TEST(guest_to_host_and_back)
{
	struct dg_env d;
	struct sockaddr_vm from;
	socklen_t fl = sizeof(from);
	char path[200], buf[64];
	int gfd, hfd;

	pair_up(&d, path, sizeof(path), &gfd, &hfd);
	{
		struct sockaddr_vm host = vm_addr(VMADDR_CID_HOST, HOST_PORT);

		ASSERT_EQ(uvsock_sendto(gfd, "hello", 5, 0, (struct sockaddr *)&host, sizeof(host)),
		          5);
	}
	ASSERT_EQ(host_recv(hfd, GUEST_PORT, buf, sizeof(buf)), 5);
	ASSERT_EQ(memcmp(buf, "hello", 5), 0);
	/* The reply, from the socket bound at <uds>_5100.dgram: host source port 5100. */
	host_send(&d, hfd, GUEST_PORT, "world", 5);
	ASSERT_EQ(uvsock_recvfrom(gfd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fl), 5);
	ASSERT_EQ(memcmp(buf, "world", 5), 0);
	ASSERT_EQ(from.svm_cid, VMADDR_CID_HOST);
	ASSERT_EQ(from.svm_port, HOST_PORT);
	pair_down(&d, path, gfd, hfd);
}

TEST(size_boundaries_both_ways)
{
	static const size_t sizes[] = { 0, 1, 4096, DG_MAX };
	struct sockaddr_vm host = vm_addr(VMADDR_CID_HOST, HOST_PORT);
	uint8_t *out = malloc(DG_MAX + 1), *in = malloc(DG_MAX + 1);
	struct dg_env d;
	char path[200];
	int gfd, hfd;

	ASSERT_TRUE(out && in);
	pair_up(&d, path, sizeof(path), &gfd, &hfd);
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		fill(out, sizes[i], i);
		ASSERT_EQ(uvsock_sendto(gfd, out, sizes[i], 0, (struct sockaddr *)&host,
		                        sizeof(host)),
		          (ssize_t)sizes[i]);
		ASSERT_EQ(host_recv(hfd, GUEST_PORT, in, DG_MAX), sizes[i]);
		ASSERT_EQ(memcmp(in, out, sizes[i]), 0);
		fill(out, sizes[i], i + 100);
		host_send(&d, hfd, GUEST_PORT, out, sizes[i]);
		ASSERT_EQ(uvsock_recvfrom(gfd, in, DG_MAX + 1, 0, NULL, NULL), (ssize_t)sizes[i]);
		ASSERT_EQ(memcmp(in, out, sizes[i]), 0);
	}
	errno = 0;
	ASSERT_EQ(uvsock_sendto(gfd, out, DG_MAX + 1, 0, (struct sockaddr *)&host, sizeof(host)),
	          -1);
	ASSERT_EQ(errno, EMSGSIZE);
	free(out);
	free(in);
	pair_down(&d, path, gfd, hfd);
}

/* A host sender bound outside the <uds>_<P>.dgram names gets an ephemeral port; replies reach
 * it. */
TEST(host_sender_elsewhere_gets_replies)
{
	struct dg_env d;
	struct sockaddr_vm from;
	socklen_t fl = sizeof(from);
	char path[200], buf[16];
	int gfd, hfd;

	env_up(&d, 0);
	snprintf(path, sizeof(path), "%s/client.sock", d.u.dir);
	hfd = host_dgram(path);
	gfd = guest_dgram(&d, GUEST_PORT);
	host_send(&d, hfd, GUEST_PORT, "ask", 3);
	ASSERT_EQ(uvsock_recvfrom(gfd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fl), 3);
	ASSERT_EQ(from.svm_cid, VMADDR_CID_HOST);
	ASSERT_GE(from.svm_port, 1u << 30);
	ASSERT_EQ(uvsock_sendto(gfd, "answer", 6, 0, (struct sockaddr *)&from, fl), 6);
	ASSERT_EQ(host_recv(hfd, GUEST_PORT, buf, sizeof(buf)), 6);
	ASSERT_EQ(memcmp(buf, "answer", 6), 0);
	pair_down(&d, path, gfd, hfd);
}

/* ---- 16 senders on one socket ----------------------------------------------------------- */

struct sender {
	int fd; /* guest socket (g2h) or host socket (h2g) */
	unsigned id;
	const struct dg_env *d;
	bool host;
	atomic_int *done; /* senders finished */
};

/* Datagram k of thread t: 8-byte id then a pattern of the id. */
static void flood_fill(uint8_t *p, unsigned t, unsigned k)
{
	uint32_t id[2] = { t, k };

	memcpy(p, id, sizeof(id));
	fill(p + sizeof(id), FLOOD_SIZE - sizeof(id), t * 131u + k);
}

static void *sender_main(void *arg)
{
	struct sender *s = arg;
	struct sockaddr_vm host = vm_addr(VMADDR_CID_HOST, HOST_PORT);
	uint8_t buf[FLOOD_SIZE];

	for (unsigned k = 0; k < PER_THREAD; k++) {
		flood_fill(buf, s->id, k);
		if (s->host)
			host_send(s->d, s->fd, GUEST_PORT, buf, sizeof(buf));
		else
			ASSERT_EQ(uvsock_sendto(s->fd, buf, sizeof(buf), 0,
			                        (struct sockaddr *)&host, sizeof(host)),
			          (ssize_t)sizeof(buf));
	}
	atomic_fetch_add(s->done, 1);
	return NULL;
}

/* Checks one flood datagram and marks it seen; fails on a bad or duplicate one. */
static void flood_check(const uint8_t *p, size_t n, bool *seen)
{
	uint8_t want[FLOOD_SIZE];
	uint32_t id[2];

	ASSERT_EQ(n, FLOOD_SIZE);
	memcpy(id, p, sizeof(id));
	ASSERT_LT(id[0], NTHREADS);
	ASSERT_LT(id[1], PER_THREAD);
	flood_fill(want, id[0], id[1]);
	ASSERT_EQ(memcmp(p, want, FLOOD_SIZE), 0);
	ASSERT_FALSE(seen[id[0] * PER_THREAD + id[1]]);
	seen[id[0] * PER_THREAD + id[1]] = true;
}

static uint64_t engine_drops(struct uvsock_ctx *g)
{
	struct uvsock_ctx_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_get_stats(g, &st), 0);
	return st.dgram_drop_no_listener + st.dgram_drop_full + st.dgram_drop_oversize +
	       st.dgram_drop_not_negotiated;
}

static uint64_t daemon_drops(const struct dg_env *d)
{
	static const char *const names[] = { "dgram_drop_no_listener", "dgram_drop_full",
		                             "dgram_drop_oversize", "dgram_drop_not_negotiated",
		                             "dgram_drop_malformed" };
	uint64_t n = 0;

	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		uint64_t v = uvd_vm_counter(&d->u, 3, names[i]);

		ASSERT_NE(v, UINT64_MAX);
		n += v;
	}
	return n;
}

/*
 * NTHREADS senders on one socket (the guest's, or host sockets to one guest socket); the
 * receiver reads until nothing came for QUIET_MS. Every datagram arrives intact and once, and
 * every one that did not is a drop counted by uvsockd or the guest's engine.
 */
static void flood(bool h2g)
{
	struct sender s[NTHREADS];
	pthread_t th[NTHREADS];
	bool *seen = calloc(NTHREADS * PER_THREAD, 1);
	uint8_t buf[FLOOD_SIZE + 64];
	struct dg_env d;
	char path[200];
	uint64_t got = 0, drops0, drops;
	int gfd, hfd = -1, shared;
	atomic_int done = 0;

	ASSERT_TRUE(seen != NULL);
	env_up(&d, 0);
	port_path(&d, HOST_PORT, path, sizeof(path));
	gfd = guest_dgram(&d, h2g ? GUEST_PORT : VMADDR_PORT_ANY);
	if (!h2g)
		hfd = host_dgram(path);
	shared = h2g ? -1 : gfd;
	drops0 = daemon_drops(&d) + engine_drops(d.g);
	for (unsigned i = 0; i < NTHREADS; i++) {
		char hp[200];

		if (h2g) {
			/* Each host sender bound at its own <uds>_<P>.dgram. */
			port_path(&d, HOST_PORT + 1 + i, hp, sizeof(hp));
			shared = host_dgram(hp);
		}
		s[i] = (struct sender){
			.fd = shared, .id = i, .d = &d, .host = h2g, .done = &done
		};
		ASSERT_EQ(pthread_create(&th[i], NULL, sender_main, &s[i]), 0);
	}
	for (;;) {
		ssize_t n;

		if (h2g) {
			unsigned ev = g_wait_events(gfd, POLLIN, QUIET_MS);

			if (!(ev & POLLIN)) {
				if (atomic_load(&done) == NTHREADS)
					break;
				continue;
			}
			n = uvsock_recvfrom(gfd, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL);
			if (n < 0 && errno == EAGAIN)
				continue;
			ASSERT_GE(n, 0);
		} else {
			struct pollfd p = { .fd = hfd, .events = POLLIN };

			if (poll(&p, 1, QUIET_MS) <= 0) {
				if (atomic_load(&done) == NTHREADS)
					break;
				continue;
			}
			n = (ssize_t)host_recv(hfd, ANY_PORT, buf, sizeof(buf));
		}
		flood_check(buf, (size_t)n, seen);
		got++;
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	drops = daemon_drops(&d) + engine_drops(d.g) - drops0;
	test_note("%s: %d sent, %" PRIu64 " received, %" PRIu64 " dropped and counted (uvsockd "
	          "dgram_drop_full %" PRIu64 ")",
	          h2g ? "host->guest" : "guest->host", NTHREADS * PER_THREAD, got, drops,
	          uvd_vm_counter(&d.u, 3, "dgram_drop_full"));
	ASSERT_EQ(got + drops, (uint64_t)NTHREADS * PER_THREAD);
	ASSERT_GT(got, 0);
	for (unsigned i = 0; i < NTHREADS; i++) {
		char hp[200];

		if (h2g) {
			close(s[i].fd);
			port_path(&d, HOST_PORT + 1 + i, hp, sizeof(hp));
			unlink(hp);
		}
	}
	uvsock_close(gfd);
	if (hfd >= 0)
		close(hfd);
	unlink(path);
	free(seen);
	env_down(&d);
}

TEST(sixteen_guest_senders_on_one_socket)
{
	flood(false);
}

TEST(sixteen_host_senders_to_one_guest_socket)
{
	flood(true);
}

/* A guest that does not negotiate DGRAM: ENODEV, host datagrams dropped and counted. */
TEST(guest_without_dgram)
{
	struct dg_env d;
	char path[200];
	int hfd, ls, gfd, cfd;

	env_up(&d, UVSOCK_GUEST_NO_DGRAM);
	errno = 0;
	ASSERT_EQ(uvsock_socket(d.g, SOCK_DGRAM, 0), -1);
	ASSERT_EQ(errno, ENODEV);
	port_path(&d, HOST_PORT, path, sizeof(path));
	hfd = host_dgram(path);
	host_send(&d, hfd, GUEST_PORT, "x", 1);
	ASSERT_WAIT_FOR(uvd_vm_counter(&d.u, 3, "dgram_drop_not_negotiated") == 1, WAIT_MS);
	/* Streams are unaffected. */
	ls = g_listen(d.g, SOCK_STREAM, GUEST_PORT);
	gfd = g_accept_host(ls, d.u.uds[0], SOCK_STREAM, GUEST_PORT, &cfd);
	ASSERT_EQ(write(cfd, "ok", 2), 2);
	g_set_timeouts(gfd, WAIT_MS);
	{
		char b[2];

		ASSERT_EQ(uvsock_recv(gfd, b, 2, MSG_WAITALL), 2);
	}
	uvsock_close(gfd);
	uvsock_close(ls);
	close(cfd);
	close(hfd);
	unlink(path);
	env_down(&d);
}

TEST_MAIN()
