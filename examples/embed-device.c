/* SPDX-License-Identifier: MIT */
/*
 * embed-device: the smallest VMM that embeds the uvsock virtio-vsock device through
 * <uvsock/device.h>, without vhost-user. It
 *   1. puts guest RAM in a memfd and places the two split rings in it (embed-guest.h),
 *   2. creates a device for guest CID 3 whose host side listens on UDS_PATH,
 *   3. hands the device the negotiated features, the memory table (the memfd), the rings and the
 *      kick/call eventfds, and starts it,
 *   4. plays a guest that listens on vsock port 1234 and answers each message in upper case,
 *   5. runs a host program (a thread here; any program, e.g. `socat - UNIX-CONNECT:UDS_PATH`)
 *      that connects with "CONNECT 1234\n", reads "OK <port>", sends a line and reads the answer.
 *
 * Two ways to run the device:
 *   default  the device has a thread of its own (uvsock_dev_start); the VMM's threads only make
 *            configuration calls.
 *   --poll   no device thread (UVSOCK_DEV_EXTERNAL_LOOP): the VMM's own poll() loop runs it.
 *            Each iteration (eg_loop_once in embed-guest.h) is
 *                timeout = uvsock_dev_timeout_ms(dev), shortened to the VMM's own timers;
 *                poll({ uvsock_dev_fd(dev): POLLIN, the VMM's own fds... }, timeout);
 *                uvsock_dev_process(dev);       never blocks
 *                ... the VMM's own work ...
 *            Here the loop runs whenever the stand-in guest waits (the guest, the VMM loop and
 *            the device share the main thread); every call on the device comes from it.
 *
 * Usage: embed-device [--poll] [UDS_PATH] [MESSAGE]   (default or "": a temporary directory;
 *                                                     "hello device")
 * Prints what the host program sent and received and the device counters; exit status 0 if the
 * answer came back right.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "embed-guest.h"

#define GUEST_PORT 1234u
#define WAIT_MS 5000

struct host_prog {
	const char *uds_path;
	const char *msg;
	char ok_line[64];
	char answer[256];
	int rc;
};

/* Reads up to '\n' (included) or cap - 1 bytes. Returns the length or -1. */
static int read_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		ssize_t k = read(fd, buf + n, 1);

		if (k <= 0)
			return -1;
		if (buf[n++] == '\n')
			break;
	}
	buf[n] = '\0';
	return (int)n;
}

/* What any host program does: CONNECT, OK, then a plain byte stream. */
static void *host_main(void *arg)
{
	struct host_prog *h = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = WAIT_MS / 1000 };
	char line[64];
	int fd;

	h->rc = -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", h->uds_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto out;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	snprintf(line, sizeof(line), "CONNECT %u\n", GUEST_PORT);
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		goto out;
	if (read_line(fd, h->ok_line, sizeof(h->ok_line)) < 0 || strncmp(h->ok_line, "OK ", 3))
		goto out;
	if (write(fd, h->msg, strlen(h->msg)) != (ssize_t)strlen(h->msg) || write(fd, "\n", 1) != 1)
		goto out;
	if (read_line(fd, h->answer, sizeof(h->answer)) < 0)
		goto out;
	h->rc = 0;
out:
	if (fd >= 0)
		close(fd);
	return NULL;
}

/*
 * The guest: accepts one connection on GUEST_PORT, upper-cases each message back, and ends when
 * the host closes. (A real guest is a kernel with AF_VSOCK; this is the same wire protocol.)
 */
static int guest_serve(struct eg_guest *g)
{
	uint8_t buf[EG_RXBUF];
	uint32_t fwd_cnt = 0, peer_port = 0;
	struct vsock_hdr h, o;

	for (;;) {
		int r = eg_recv(g, &h, buf, sizeof(buf), WAIT_MS);

		if (r < 0)
			return r;
		if (h.dst_port != GUEST_PORT)
			continue;
		switch (h.op) {
		case VSOCK_OP_REQUEST:
			peer_port = h.src_port;
			o = eg_hdr(g, GUEST_PORT, peer_port, VSOCK_OP_RESPONSE, 0, 0);
			r = eg_send(g, &o, NULL, WAIT_MS);
			break;
		case VSOCK_OP_RW:
			fwd_cnt += h.len; /* consumed by the "application" at once */
			for (uint32_t i = 0; i < h.len; i++)
				if (buf[i] >= 'a' && buf[i] <= 'z')
					buf[i] = (uint8_t)(buf[i] - 'a' + 'A');
			o = eg_hdr(g, GUEST_PORT, peer_port, VSOCK_OP_RW, h.len, fwd_cnt);
			r = eg_send(g, &o, buf, WAIT_MS);
			break;
		case VSOCK_OP_SHUTDOWN:
			/* The host closed: close our side too (RST ends the connection). */
			o = eg_hdr(g, GUEST_PORT, peer_port, VSOCK_OP_RST, 0, fwd_cnt);
			return eg_send(g, &o, NULL, WAIT_MS);
		case VSOCK_OP_RST:
			return 0;
		default:
			break; /* credit requests/updates: nothing to do at this size */
		}
		if (r < 0)
			return r;
	}
}

/* True if answer is msg in upper case followed by a newline. */
static bool answer_is_upper(const char *msg, const char *answer)
{
	size_t n = strlen(msg);

	if (strlen(answer) != n + 1 || answer[n] != '\n')
		return false;
	for (size_t i = 0; i < n; i++)
		if (answer[i] != (msg[i] >= 'a' && msg[i] <= 'z' ? msg[i] - 'a' + 'A' : msg[i]))
			return false;
	return true;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/embed-device-XXXXXX", path[108];
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3, .name = "embedded" };
	bool poll_mode = argc > 1 && strcmp(argv[1], "--poll") == 0;
	struct host_prog host;
	struct uvsock_dev *dev = NULL;
	struct uvsock_dev_mem_region region;
	struct uvsock_dev_queue q = { .size = sizeof(q) };
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct eg_guest g;
	bool tmpdir;
	pthread_t th;
	int r, rc = 1;

	if (poll_mode) {
		argc--;
		argv++;
		cfg.flags = UVSOCK_DEV_EXTERNAL_LOOP;
	}
	host = (struct host_prog){ .msg = argc > 2 ? argv[2] : "hello device" };
	tmpdir = argc < 2 || !argv[1][0];

	if (tmpdir) {
		if (!mkdtemp(dir)) {
			perror("mkdtemp");
			return 1;
		}
		snprintf(path, sizeof(path), "%s/vm3.vsock", dir);
	} else {
		snprintf(path, sizeof(path), "%s", argv[1]);
	}
	cfg.uds_path = path;
	host.uds_path = path;

	/* 1. Guest RAM and rings (a real VMM has them already). Features: all the device offers,
	 * as a Linux guest would accept them. */
	r = eg_init(&g, cfg.guest_cid, uvsock_dev_features());
	if (r < 0) {
		fprintf(stderr, "guest memory: %s\n", strerror(-r));
		goto out;
	}
	/* 2. The device, host side on uds_path. */
	r = uvsock_dev_new(&cfg, &dev);
	if (r < 0) {
		fprintf(stderr, "uvsock_dev_new(%s): %s\n", path, strerror(-r));
		goto out;
	}
	/* 3. What the virtio transport negotiated: features, memory, rings, eventfds. */
	region = eg_region(&g);
	r = uvsock_dev_set_features(dev, g.features);
	if (r == 0)
		r = uvsock_dev_set_mem_table(dev, &region, 1);
	for (unsigned i = 0; r == 0 && i < 2; i++) {
		q = eg_queue(&g, i);
		r = uvsock_dev_queue_start(dev, i, &q);
	}
	/* Its own thread runs the device from now on; or (--poll) our loop does: the guest's
	 * waits run eg_loop_once(), so every call on the device stays on this thread. */
	if (r == 0 && !poll_mode)
		r = uvsock_dev_start(dev);
	if (poll_mode)
		g.loop_dev = dev;
	if (r < 0) {
		fprintf(stderr, "device set-up: %s\n", strerror(-r));
		goto out;
	}
	r = eg_post_all_rx(&g);
	if (r < 0)
		goto out;
	printf("device for guest CID %u serving %s (%s)\n", cfg.guest_cid, path,
	       poll_mode ? "run by our poll loop" : "device thread");

	/* 4 and 5. The host program connects while the guest serves. */
	if (pthread_create(&th, NULL, host_main, &host) != 0)
		goto out;
	r = guest_serve(&g);
	pthread_join(th, NULL);
	uvsock_dev_get_stats(dev, &st);
	printf("host sent:     %s\nhost got:      %s%s", host.msg, host.ok_line, host.answer);
	printf("device: %llu packets from the guest (%llu bytes), %llu to it (%llu bytes), "
	       "%llu connections, %llu dropped\n",
	       (unsigned long long)st.tx_pkts, (unsigned long long)st.tx_bytes,
	       (unsigned long long)st.rx_pkts, (unsigned long long)st.rx_bytes,
	       (unsigned long long)st.conns_total, (unsigned long long)st.dropped);
	if (r < 0)
		fprintf(stderr, "guest: %s\n", strerror(-r));
	else if (host.rc < 0)
		fprintf(stderr, "host program: no answer\n");
	else if (!answer_is_upper(host.msg, host.answer))
		fprintf(stderr, "host program: wrong answer\n");
	else
		rc = 0;
out:
	/* The device stops using the eventfds and memory before the guest side frees them. */
	uvsock_dev_free(dev);
	eg_destroy(&g);
	if (tmpdir)
		rmdir(dir);
	return rc;
}
