/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf --in-process: the transport alone. The virtio-vsock device is embedded in this
 * process through <uvsock/device.h> (as examples/embed-device.c does: memfd guest RAM, split
 * rings, eventfds, the device's own thread), the guest is the stand-in driver of
 * examples/embed-guest.h (raw vsock packets on the rings, credit kept here), and the host
 * application is a thread of this process on the device's Unix socket. No daemon, no vhost-user.
 *
 * One connection at a time. The guest end (struct conn C_INPROC) is used by one thread at a
 * time (the writer for g2h, the reader for h2g, the pinging thread for round trips); the device
 * runs on its own thread. The stand-in guest has 4 KiB RX buffers (so host -> guest packets are
 * at most 4 KiB) and 64 KiB TX buffers.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../examples/embed-guest.h"
#include "../common/hybrid.h"
#include "perf.h"

#define IP_BUF_ALLOC      (256u * 1024u) /* the guest's receive buffer, advertised */
#define IP_HOST_PORT      7000u
#define IP_GUEST_PORT     7001u
#define IP_CREDIT_WAIT_MS 50

struct inproc {
	struct eg_guest g;
	struct uvsock_dev *dev;
	char dir[40], uds[64], lpath[80];
	int lfd;
	/* The current connection. */
	uint32_t lport, pport;
	bool connected, peer_shut, closed;
	uint32_t peer_buf_alloc, peer_fwd_cnt, tx_cnt;
	uint32_t fwd_cnt, fwd_sent;
	uint8_t stage[EG_RXBUF];
	uint32_t stage_off, stage_len;
	uint32_t next_port;
};

static int ip_send_op(struct inproc *ip, uint16_t op, uint32_t flags, const void *p, uint32_t n)
{
	struct vsock_hdr h = eg_hdr(&ip->g, ip->lport, ip->pport, op, n, ip->fwd_cnt);

	h.buf_alloc = IP_BUF_ALLOC;
	h.flags = flags;
	ip->fwd_sent = ip->fwd_cnt;
	return eg_send(&ip->g, &h, p, PERF_WAIT_MS);
}

/*
 * Takes one packet from the RX ring (waiting up to ms) and applies it to the connection.
 * Returns 0 (a packet handled), -ETIMEDOUT, or another -errno from the rings.
 */
static int ip_rx_one(struct inproc *ip, int ms)
{
	struct vsock_hdr h = { 0 };
	int r = eg_recv(&ip->g, &h, ip->stage, sizeof(ip->stage), ms);

	if (r < 0)
		return r;
	if (h.op == VSOCK_OP_REQUEST && h.dst_port == IP_GUEST_PORT && !ip->connected) {
		ip->lport = IP_GUEST_PORT;
		ip->pport = h.src_port;
	}
	if (h.dst_port != ip->lport || h.src_port != ip->pport)
		return 0; /* an earlier connection's late packet */
	ip->peer_buf_alloc = h.buf_alloc;
	ip->peer_fwd_cnt = h.fwd_cnt;
	switch (h.op) {
	case VSOCK_OP_REQUEST:
		ip->connected = true;
		return ip_send_op(ip, VSOCK_OP_RESPONSE, 0, NULL, 0);
	case VSOCK_OP_RESPONSE:
		ip->connected = true;
		break;
	case VSOCK_OP_RW:
		ip->stage_off = 0;
		ip->stage_len = h.len;
		break;
	case VSOCK_OP_CREDIT_REQUEST:
		return ip_send_op(ip, VSOCK_OP_CREDIT_UPDATE, 0, NULL, 0);
	case VSOCK_OP_SHUTDOWN:
	case VSOCK_OP_RST:
		ip->peer_shut = true;
		break;
	default:
		break;
	}
	return 0;
}

static void ip_wait_connected(struct inproc *ip)
{
	while (!ip->connected && !ip->peer_shut)
		if (ip_rx_one(ip, PERF_WAIT_MS) < 0)
			die("in-process: no answer from the device");
	if (!ip->connected)
		die("in-process: connection refused by the device");
}

ssize_t inproc_send(struct inproc *ip, const void *buf, size_t n)
{
	int waited_ms = 0, r;
	uint32_t credit;

	/* Take what the device has sent (credit updates) without waiting. */
	while (ip->stage_len == 0 && ip_rx_one(ip, 0) == 0)
		;
	for (;;) {
		if (ip->peer_shut || ip->closed) {
			errno = EPIPE;
			return -1;
		}
		credit = ip->peer_buf_alloc - (ip->tx_cnt - ip->peer_fwd_cnt);
		if (credit)
			break;
		if (ip->stage_len) {
			errno = ENOBUFS; /* unread data: a usage this tool never has */
			return -1;
		}
		/* No credit: wait for an update, asking for one every 50 ms, 10 s at most. */
		r = ip_rx_one(ip, IP_CREDIT_WAIT_MS);
		if (r == -ETIMEDOUT) {
			waited_ms += IP_CREDIT_WAIT_MS;
			if (waited_ms >= PERF_WAIT_MS ||
			    ip_send_op(ip, VSOCK_OP_CREDIT_REQUEST, 0, NULL, 0) < 0)
				r = -ETIMEDOUT;
			else
				r = 0;
		}
		if (r < 0) {
			errno = -r;
			return -1;
		}
	}
	if (n > credit)
		n = credit;
	if (n > EG_TXBUF - VSOCK_HDR_SIZE)
		n = EG_TXBUF - VSOCK_HDR_SIZE;
	if (ip_send_op(ip, VSOCK_OP_RW, 0, buf, (uint32_t)n) < 0) {
		errno = EIO;
		return -1;
	}
	ip->tx_cnt += (uint32_t)n;
	return (ssize_t)n;
}

ssize_t inproc_recv(struct inproc *ip, void *buf, size_t n)
{
	while (ip->stage_len == 0) {
		int r;

		if (ip->peer_shut)
			return 0;
		r = ip_rx_one(ip, PERF_WAIT_MS);
		if (r < 0) {
			errno = -r;
			return -1;
		}
	}
	if (n > ip->stage_len - ip->stage_off)
		n = ip->stage_len - ip->stage_off;
	memcpy(buf, ip->stage + ip->stage_off, n);
	ip->stage_off += (uint32_t)n;
	if (ip->stage_off == ip->stage_len)
		ip->stage_len = ip->stage_off = 0;
	ip->fwd_cnt += (uint32_t)n;
	/* A credit update when a quarter of the buffer was consumed since the last one. */
	if (ip->fwd_cnt - ip->fwd_sent >= IP_BUF_ALLOC / 4)
		ip_send_op(ip, VSOCK_OP_CREDIT_UPDATE, 0, NULL, 0);
	return (ssize_t)n;
}

/* Ends the connection from the guest: SHUTDOWN both ways (the host sees EOF). Idempotent. */
void inproc_close(struct inproc *ip)
{
	if (ip->closed || !ip->connected)
		return;
	ip->closed = true;
	if (!ip->peer_shut)
		ip_send_op(ip, VSOCK_OP_SHUTDOWN, 3, NULL, 0);
}

static void ip_reset_conn(struct inproc *ip)
{
	ip->connected = ip->peer_shut = ip->closed = false;
	ip->peer_buf_alloc = ip->peer_fwd_cnt = ip->tx_cnt = 0;
	ip->fwd_cnt = ip->fwd_sent = 0;
	ip->stage_len = ip->stage_off = 0;
	ip->lport = ip->pport = 0;
}

static int read_ok_line(int fd)
{
	char c = 0;
	char line[64];
	size_t got = 0;

	while (c != '\n' && got + 1 < sizeof(line)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, PERF_WAIT_MS) <= 0 || read(fd, &c, 1) != 1)
			return -1;
		line[got++] = c;
	}
	return got > 3 && strncmp(line, "OK ", 3) == 0 ? 0 : -1;
}

void inproc_pair(struct inproc *ip, bool g2h, struct conn *tx, struct conn *rx)
{
	struct conn guest = { .kind = C_INPROC, .fd = -1, .ip = ip }, host = { .kind = C_FD };

	ip_reset_conn(ip);
	if (g2h) {
		ip->lport = ip->next_port++;
		ip->pport = IP_HOST_PORT;
		if (ip_send_op(ip, VSOCK_OP_REQUEST, 0, NULL, 0) < 0)
			die("in-process: REQUEST");
		ip_wait_connected(ip);
		host.fd = hybrid_accept(ip->lfd, PERF_WAIT_MS);
		if (host.fd < 0)
			die("in-process: host accept: %s", strerror(errno));
		*tx = guest;
		*rx = host;
		return;
	}
	host.fd = hybrid_unix_connect(ip->uds, SOCK_STREAM);
	if (host.fd < 0 || write(host.fd, "CONNECT 7001\n", 13) != 13)
		die("in-process: host connect: %s", strerror(errno));
	ip_wait_connected(ip);
	if (read_ok_line(host.fd) < 0)
		die("in-process: no OK line");
	*tx = host;
	*rx = guest;
}

struct inproc *inproc_new(void)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3, .name = "perf" };
	struct uvsock_dev_mem_region region;
	struct uvsock_dev_queue q;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct inproc *ip = calloc(1, sizeof(*ip));
	int r;

	if (!ip)
		die("out of memory");
	ip->lfd = -1;
	ip->next_port = 40000;
	snprintf(ip->dir, sizeof(ip->dir), "/tmp/uvsock-perf-ip-XXXXXX");
	if (!mkdtemp(ip->dir))
		die("mkdtemp: %s", strerror(errno));
	snprintf(ip->uds, sizeof(ip->uds), "%s/vm.vsock", ip->dir);
	snprintf(ip->lpath, sizeof(ip->lpath), "%s_%u", ip->uds, IP_HOST_PORT);
	cfg.uds_path = ip->uds;
	r = eg_init(&ip->g, cfg.guest_cid, uvsock_dev_features());
	if (r == 0)
		r = uvsock_dev_new(&cfg, &ip->dev);
	region = eg_region(&ip->g);
	if (r == 0)
		r = uvsock_dev_set_features(ip->dev, ip->g.features);
	if (r == 0)
		r = uvsock_dev_set_mem_table(ip->dev, &region, 1);
	for (unsigned i = 0; r == 0 && i < 2; i++) {
		q = eg_queue(&ip->g, i);
		r = uvsock_dev_queue_start(ip->dev, i, &q);
	}
	if (r == 0)
		r = uvsock_dev_start(ip->dev);
	if (r == 0)
		r = eg_post_all_rx(&ip->g);
	if (r < 0)
		die("in-process device: %s", strerror(-r));
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", ip->lpath);
	ip->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ip->lfd < 0 || bind(ip->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(ip->lfd, 16) < 0)
		die("in-process host listener: %s", strerror(errno));
	return ip;
}

void inproc_free(struct inproc *ip)
{
	if (!ip)
		return;
	/* The device stops using the eventfds and memory before the guest side frees them. */
	uvsock_dev_free(ip->dev);
	eg_destroy(&ip->g);
	if (ip->lfd >= 0)
		close(ip->lfd);
	unlink(ip->lpath);
	rmdir(ip->dir);
	free(ip);
}
