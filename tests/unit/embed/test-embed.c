/* SPDX-License-Identifier: MIT */
/*
 * The device API of <uvsock/device.h> without vhost-user: the test is the VMM (memfd guest RAM,
 * rings and eventfds from examples/embed-guest.h), a hand-written guest (packets built byte by
 * byte) and the host programs (plain Unix sockets). Covers argument checks and their errno,
 * data both ways for host- and guest-initiated connections, configuration before and after the
 * device thread starts, refused connects, stopping the queues and replacing the memory table
 * with connections kept, guest driver reset, host-pointer memory tables, sibling devices, and
 * a ring error repaired by a reset.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "../../../examples/embed-guest.h"
#include "device/device_internal.h"
#include "test.h"

#define WAIT_MS 5000

struct env {
	char dir[64];
	char uds[128];
	struct uvsock_dev *dev;
	struct eg_guest g;
};

static void env_new(struct env *e, uint32_t cid)
{
	struct uvsock_dev_config cfg = { .guest_cid = cid };

	snprintf(e->dir, sizeof(e->dir), "/tmp/uvsock-embed-XXXXXX");
	ASSERT_TRUE(mkdtemp(e->dir) != NULL);
	snprintf(e->uds, sizeof(e->uds), "%s/vm%u.vsock", e->dir, cid);
	cfg.uds_path = e->uds;
	ASSERT_OK(uvsock_dev_new(&cfg, &e->dev));
	ASSERT_OK(eg_init(&e->g, cid, uvsock_dev_features()));
}

/* What a VMM does at FEATURES_OK and DRIVER_OK. */
static void env_configure(struct env *e)
{
	struct uvsock_dev_mem_region r = eg_region(&e->g);

	ASSERT_OK(uvsock_dev_set_features(e->dev, e->g.features));
	ASSERT_OK(uvsock_dev_set_mem_table(e->dev, &r, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&e->g, q);

		ASSERT_OK(uvsock_dev_queue_start(e->dev, q, &dq));
	}
	ASSERT_OK(eg_post_all_rx(&e->g));
}

static void env_free(struct env *e)
{
	uvsock_dev_free(e->dev);
	eg_destroy(&e->g);
	/* The device removed its socket files. */
	ASSERT_OK(rmdir(e->dir));
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_LT(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ASSERT_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

static int unix_listen(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_LT(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(fd, 4));
	return fd;
}

/* Reads exactly len bytes within WAIT_MS; returns the count read (short on EOF/timeout). */
static size_t read_full(int fd, void *buf, size_t len)
{
	uint64_t end = eg_now_ms() + WAIT_MS;
	size_t got = 0;

	while (got < len) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = eg_now_ms();
		ssize_t n;

		if (now >= end || poll(&p, 1, (int)(end - now)) <= 0)
			break;
		n = read(fd, (uint8_t *)buf + got, len - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	return got;
}

/* True if the peer closed fd within WAIT_MS. */
static bool wait_eof(int fd)
{
	char c;

	return read_full(fd, &c, 1) == 0;
}

/* Next packet that is not a bare credit update. */
static void recv_pkt(struct eg_guest *g, struct vsock_hdr *h, void *buf, size_t cap)
{
	do {
		ASSERT_OK(eg_recv(g, h, buf, cap, WAIT_MS));
	} while (h->op == VSOCK_OP_CREDIT_UPDATE);
}

/*
 * A host program connects to guest port 1234 (CONNECT line), the guest accepts. Returns the
 * host fd; *ret_host_port is the device's port for it.
 */
static int host_connects(struct env *e, uint32_t *ret_host_port)
{
	struct vsock_hdr h, o;
	char line[64], buf[64];
	int fd = unix_connect(e->uds);
	size_t n = 0;

	ASSERT_EQ(write(fd, "CONNECT 1234\n", 13), 13);
	recv_pkt(&e->g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(h.src_cid, 2);
	ASSERT_EQ(h.dst_cid, e->g.cid);
	ASSERT_EQ(h.dst_port, 1234);
	o = eg_hdr(&e->g, 1234, h.src_port, VSOCK_OP_RESPONSE, 0, 0);
	ASSERT_OK(eg_send(&e->g, &o, NULL, WAIT_MS));
	while (n < sizeof(line) - 1 && read_full(fd, line + n, 1) == 1 && line[n++] != '\n')
		;
	line[n] = '\0';
	ASSERT_EQ(sscanf(line, "OK %u\n", ret_host_port), 1);
	ASSERT_EQ(*ret_host_port, h.src_port);
	return fd;
}

/* Host -> guest and guest -> host bytes on an open host-initiated connection. */
static void exchange(struct env *e, int fd, uint32_t host_port, uint32_t *fwd_cnt,
		     const char *down, const char *up)
{
	struct vsock_hdr h, o;
	char buf[256];

	ASSERT_EQ(write(fd, down, strlen(down)), (ssize_t)strlen(down));
	recv_pkt(&e->g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(h.len, strlen(down));
	ASSERT_MEMEQ(buf, down, h.len);
	*fwd_cnt += h.len;
	o = eg_hdr(&e->g, 1234, host_port, VSOCK_OP_RW, (uint32_t)strlen(up), *fwd_cnt);
	ASSERT_OK(eg_send(&e->g, &o, up, WAIT_MS));
	ASSERT_EQ(read_full(fd, buf, strlen(up)), strlen(up));
	ASSERT_MEMEQ(buf, up, strlen(up));
}

/* ---- tests -------------------------------------------------------------------------------- */

TEST(features_and_argument_errors)
{
	struct uvsock_dev_config cfg = { .guest_cid = 3 };
	struct uvsock_dev_mem_region regs[9];
	struct uvsock_dev_queue q;
	struct uvsock_dev *d2;
	struct env e;
	uint64_t f = uvsock_dev_features();
	char longp[200];

	ASSERT_EQ(f, (1ull << 1) | (1ull << 28) | (1ull << 29) | (1ull << 32));
	ASSERT_ERR(uvsock_dev_new(NULL, &d2), EINVAL);
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL); /* no uds_path */
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	cfg.uds_path = longp;
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);
	cfg.uds_path = "/nonexistent-dir/vm.vsock";
	cfg.guest_cid = 2;
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);
	cfg.guest_cid = 3;
	cfg.queue_size_max = 100;
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);

	env_new(&e, 3);
	ASSERT_ERR(uvsock_dev_set_features(e.dev, f | (1ull << 30)), EINVAL);
	q = eg_queue(&e.g, 0);
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL); /* no memory table yet */
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, NULL, 0), EINVAL);
	for (int i = 0; i < 9; i++)
		regs[i] = (struct uvsock_dev_mem_region){ .guest_phys_addr = (uint64_t)i << 30,
							  .size = 4096, .fd = e.g.memfd };
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 9), E2BIG);
	regs[1].host_addr = e.g.ram; /* mixed kinds */
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 2), EINVAL);
	regs[1] = regs[0]; /* overlap */
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 2), EINVAL);
	regs[0].size = (uint64_t)EG_RAM_SIZE * 2; /* file too short */
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 1), EINVAL);
	regs[0] = eg_region(&e.g);
	ASSERT_OK(uvsock_dev_set_mem_table(e.dev, regs, 1));
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 2, &q), EINVAL);
	q.num = 100;
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL);
	q.num = 2048; /* above queue_size_max (1024) */
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL);
	q = eg_queue(&e.g, 0);
	q.kick_fd = -1;
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL);
	q = eg_queue(&e.g, 0);
	q.flags = 2;
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL);
	q = eg_queue(&e.g, 0);
	q.used_addr = EG_RAM_SIZE - 8; /* outside guest memory */
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EFAULT);
	q = eg_queue(&e.g, 0);
	q.desc_addr += 4; /* misaligned */
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EINVAL);
	q = eg_queue(&e.g, 0);
	ASSERT_OK(uvsock_dev_queue_start(e.dev, 0, &q));
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 0, &q), EBUSY);
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 1), EBUSY);
	ASSERT_ERR(uvsock_dev_queue_stop(e.dev, 5, NULL), EINVAL);
	ASSERT_ERR(uvsock_dev_set_call_fd(e.dev, 5, -1), EINVAL);
	ASSERT_OK(uvsock_dev_start(e.dev));
	ASSERT_ERR(uvsock_dev_start(e.dev), EALREADY);
	ASSERT_ERR(uvsock_dev_set_mem_table(e.dev, regs, 1), EBUSY); /* through the thread too */
	ASSERT_OK(uvsock_dev_queue_stop(e.dev, 0, NULL));
	ASSERT_OK(uvsock_dev_set_mem_table(e.dev, regs, 1));
	cfg.queue_size_max = 0;
	snprintf(longp, sizeof(longp), "%s/vm4.vsock", e.dir);
	cfg.uds_path = longp;
	cfg.guest_cid = 4;
	ASSERT_OK(uvsock_dev_new(&cfg, &d2));
	ASSERT_OK(access(longp, F_OK));
	ASSERT_ERR(uvsock_dev_link(e.dev, d2), EINVAL); /* e.dev already started */
	uvsock_dev_free(d2);
	ASSERT_TRUE(access(longp, F_OK) < 0 && errno == ENOENT);
	uvsock_dev_free(NULL);
	env_free(&e);
}

/* Configured before the thread starts (calls run on the caller's thread). */
TEST(host_initiated_data_both_ways)
{
	struct uvsock_dev_stats st;
	struct vsock_hdr h, o;
	uint32_t port, fwd = 0;
	char buf[64];
	struct env e;
	int fd;

	env_new(&e, 3);
	env_configure(&e);
	ASSERT_OK(uvsock_dev_start(e.dev));
	fd = host_connects(&e, &port);
	ASSERT_GE(port, 1u << 30);
	exchange(&e, fd, port, &fwd, "hello guest", "hello host");
	exchange(&e, fd, port, &fwd, "second", "answer two");
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.conns_open, 1);
	ASSERT_EQ(st.conns_total, 1);
	ASSERT_EQ(st.rx_bytes, 11 + 6);
	ASSERT_EQ(st.tx_bytes, 10 + 10);
	ASSERT_EQ(st.running, 1);
	ASSERT_EQ(st.broken, 0);
	ASSERT_GE(st.interrupts, 1);
	/* The host closes: the guest is told (SHUTDOWN both ways), answers RST. */
	close(fd);
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	o = eg_hdr(&e.g, 1234, port, VSOCK_OP_RST, 0, fwd);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	env_free(&e);
}

/* Configured after the thread started (calls handed to the device thread). */
TEST(guest_initiated_and_refused)
{
	struct uvsock_dev_stats st;
	struct vsock_hdr h, o;
	char path[200], buf[64];
	struct env e;
	int lfd, fd;

	env_new(&e, 5);
	ASSERT_OK(uvsock_dev_start(e.dev));
	env_configure(&e);
	snprintf(path, sizeof(path), "%s_5000", e.uds);
	lfd = unix_listen(path);
	o = eg_hdr(&e.g, 40000, 5000, VSOCK_OP_REQUEST, 0, 0);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(h.src_port, 5000);
	ASSERT_EQ(h.dst_port, 40000);
	fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	ASSERT_GE(fd, 0);
	o = eg_hdr(&e.g, 40000, 5000, VSOCK_OP_RW, 4, 0);
	ASSERT_OK(eg_send(&e.g, &o, "ping", WAIT_MS));
	ASSERT_EQ(read_full(fd, buf, 4), 4);
	ASSERT_MEMEQ(buf, "ping", 4);
	ASSERT_EQ(write(fd, "pong", 4), 4);
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(h.len, 4);
	ASSERT_MEMEQ(buf, "pong", 4);
	/* Nobody listens on 5001: RST at once, counted. */
	o = eg_hdr(&e.g, 40001, 5001, VSOCK_OP_REQUEST, 0, 0);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RST);
	ASSERT_EQ(h.dst_port, 40001);
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.host_connects_refused, 1);
	/* A spoofed source CID is dropped and counted. */
	o = eg_hdr(&e.g, 40002, 5000, VSOCK_OP_REQUEST, 0, 0);
	o.src_cid = 9;
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	for (uint64_t end = eg_now_ms() + WAIT_MS; eg_now_ms() < end; usleep(1000)) {
		uvsock_dev_get_stats(e.dev, &st);
		if (st.dropped)
			break;
	}
	ASSERT_EQ(st.dropped, 1);
	close(fd);
	close(lfd);
	unlink(path);
	env_free(&e);
}

/* Stop both queues, replace the memory table, restart where they stopped: the connection lives. */
TEST(queue_stop_and_memory_replacement_keep_connections)
{
	struct uvsock_dev_mem_region r;
	uint16_t idx[2];
	uint32_t port, fwd = 0;
	struct env e;
	int fd;

	env_new(&e, 3);
	ASSERT_OK(uvsock_dev_start(e.dev));
	env_configure(&e);
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "before", "reply one");
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(uvsock_dev_queue_stop(e.dev, q, &idx[q]));
	/* RX: every buffer posted was taken or is still available (64 posted, some used). */
	ASSERT_GT(idx[0], 0);
	ASSERT_GT(idx[1], 0);
	/* Bytes from the host wait in the device while the rings are stopped. */
	ASSERT_EQ(write(fd, "while stopped", 13), 13);
	r = eg_region(&e.g);
	ASSERT_OK(uvsock_dev_set_mem_table(e.dev, &r, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&e.g, q);

		dq.last_avail_idx = idx[q];
		ASSERT_OK(uvsock_dev_queue_start(e.dev, q, &dq));
	}
	{
		struct vsock_hdr h, o;
		char buf[64];

		recv_pkt(&e.g, &h, buf, sizeof(buf));
		ASSERT_EQ(h.op, VSOCK_OP_RW);
		ASSERT_EQ(h.len, 13);
		ASSERT_MEMEQ(buf, "while stopped", 13);
		fwd += 13;
		o = eg_hdr(&e.g, 1234, port, VSOCK_OP_RW, 5, fwd);
		ASSERT_OK(eg_send(&e.g, &o, "after", WAIT_MS));
		ASSERT_EQ(read_full(fd, buf, 5), 5);
		ASSERT_MEMEQ(buf, "after", 5);
	}
	exchange(&e, fd, port, &fwd, "again", "still here");
	close(fd);
	env_free(&e);
}

/* Guest driver reset: connections dropped, a fresh session afterwards, counters go on. */
TEST(reset_drops_connections_and_a_new_session_works)
{
	struct uvsock_dev_stats st;
	uint32_t port, fwd = 0;
	struct env e;
	int fd;

	env_new(&e, 3);
	ASSERT_OK(uvsock_dev_start(e.dev));
	env_configure(&e);
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "one", "uno");
	ASSERT_OK(uvsock_dev_reset(e.dev));
	ASSERT_TRUE(wait_eof(fd));
	close(fd);
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.running, 0);
	ASSERT_EQ(st.conns_open, 0);
	ASSERT_EQ(st.conns_total, 1);
	/* The guest driver starts over: new rings (zeroed), same RAM. */
	for (unsigned q = 0; q < 2; q++) {
		struct vring_layout l;
		uint8_t *base = eg_host(&e.g, EG_RING_GPA(q));

		vring_drv_free(e.g.vq[q]);
		ASSERT_OK(vring_layout(EG_QSIZE, &l));
		ASSERT_OK(vring_drv_new(EG_QSIZE, base + l.desc_off, base + l.avail_off,
					base + l.used_off, e.g.features, &e.g.vq[q]));
	}
	memset(e.g.txbusy, 0, sizeof(e.g.txbusy));
	env_configure(&e);
	fwd = 0;
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "two", "dos");
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.conns_total, 2);
	ASSERT_EQ(st.conns_open, 1);
	close(fd);
	env_free(&e);
}

/* The VMM's own mapping as the memory table, rings given as host pointers. */
TEST(host_pointer_memory_and_ring_addresses)
{
	struct uvsock_dev_mem_region r;
	uint32_t port, fwd = 0;
	struct env e;
	int fd;

	env_new(&e, 3);
	r = (struct uvsock_dev_mem_region){ .guest_phys_addr = 0, .size = EG_RAM_SIZE,
					    .host_addr = e.g.ram, .fd = -1 };
	ASSERT_OK(uvsock_dev_set_features(e.dev, e.g.features));
	ASSERT_OK(uvsock_dev_set_mem_table(e.dev, &r, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&e.g, q);

		dq.flags = UVSOCK_DEV_QUEUE_HOST_ADDRS;
		dq.desc_addr += (uint64_t)(uintptr_t)e.g.ram;
		dq.avail_addr += (uint64_t)(uintptr_t)e.g.ram;
		dq.used_addr += (uint64_t)(uintptr_t)e.g.ram;
		if (q == 0) {
			struct uvsock_dev_queue bad = dq;

			bad.used_addr = (uint64_t)(uintptr_t)e.g.ram + EG_RAM_SIZE; /* just past */
			ASSERT_ERR(uvsock_dev_queue_start(e.dev, q, &bad), EFAULT);
		}
		ASSERT_OK(uvsock_dev_queue_start(e.dev, q, &dq));
	}
	ASSERT_OK(eg_post_all_rx(&e.g));
	ASSERT_OK(uvsock_dev_start(e.dev));
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "by pointer", "fine");
	close(fd);
	env_free(&e);
}

/* Two linked devices route guest-to-guest; an unlinked CID is dropped. */
TEST(linked_devices_route_between_guests)
{
	struct uvsock_dev_stats st;
	struct vsock_hdr h, o;
	struct env a, b;
	char buf[64];

	env_new(&a, 3);
	env_new(&b, 4);
	ASSERT_OK(uvsock_dev_link(a.dev, b.dev));
	ASSERT_ERR(uvsock_dev_link(a.dev, a.dev), EINVAL);
	env_configure(&a);
	env_configure(&b);
	ASSERT_OK(uvsock_dev_start(a.dev));
	ASSERT_OK(uvsock_dev_start(b.dev));
	o = eg_hdr(&a.g, 40000, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 4;
	ASSERT_OK(eg_send(&a.g, &o, NULL, WAIT_MS));
	recv_pkt(&b.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(h.src_cid, 3);
	ASSERT_EQ(h.src_port, 40000);
	ASSERT_EQ(h.dst_port, 77);
	o = eg_hdr(&b.g, 77, 40000, VSOCK_OP_RESPONSE, 0, 0);
	o.dst_cid = 3;
	ASSERT_OK(eg_send(&b.g, &o, NULL, WAIT_MS));
	recv_pkt(&a.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(h.src_cid, 4);
	/* CID 6 is nobody's sibling. */
	o = eg_hdr(&a.g, 40001, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 6;
	ASSERT_OK(eg_send(&a.g, &o, NULL, WAIT_MS));
	for (uint64_t end = eg_now_ms() + WAIT_MS; eg_now_ms() < end; usleep(1000)) {
		uvsock_dev_get_stats(a.dev, &st);
		if (st.dropped)
			break;
	}
	ASSERT_EQ(st.dropped, 1);
	env_free(&a);
	env_free(&b);
}

/* A ring error marks the device broken (counted); a reset and restart repair it. */
TEST(ring_error_is_repaired_by_reset)
{
	struct uvsock_dev_stats st;
	struct vring_avail_le *avail;
	struct vring_layout l;
	uint32_t port, fwd = 0;
	struct env e;
	int fd;
	uint64_t one = 1;

	env_new(&e, 3);
	env_configure(&e);
	ASSERT_OK(uvsock_dev_start(e.dev));
	/* A hostile guest: the TX avail index jumps far beyond the ring size. */
	ASSERT_OK(vring_layout(EG_QSIZE, &l));
	avail = (struct vring_avail_le *)(void *)((uint8_t *)eg_host(&e.g, EG_RING_GPA(1)) +
						  l.avail_off);
	__atomic_store_n(&avail->idx, (uint16_t)(EG_QSIZE * 4), __ATOMIC_RELEASE);
	ASSERT_EQ(write(e.g.kick[1], &one, 8), 8);
	for (uint64_t end = eg_now_ms() + WAIT_MS; eg_now_ms() < end; usleep(1000)) {
		uvsock_dev_get_stats(e.dev, &st);
		if (st.broken)
			break;
	}
	ASSERT_EQ(st.broken, 1);
	ASSERT_EQ(st.ring_errors, 1);
	ASSERT_OK(uvsock_dev_reset(e.dev));
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.broken, 0);
	for (unsigned q = 0; q < 2; q++) {
		uint8_t *base = eg_host(&e.g, EG_RING_GPA(q));

		vring_drv_free(e.g.vq[q]);
		ASSERT_OK(vring_drv_new(EG_QSIZE, base + l.desc_off, base + l.avail_off,
					base + l.used_off, e.g.features, &e.g.vq[q]));
	}
	memset(e.g.txbusy, 0, sizeof(e.g.txbusy));
	env_configure(&e);
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "repaired", "yes");
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.ring_errors, 1);
	close(fd);
	env_free(&e);
}

/* The router the API's devices share lives from the first device to the last (no leak). */
TEST(shared_router_is_freed_with_the_last_device)
{
	struct uvsock_dev_config cfg = { .guest_cid = 3 };
	struct uvsock_dev *a, *b, *c;
	char dir[64], pa[128], pb[128], pc[128];
	int fd;

	snprintf(dir, sizeof(dir), "/tmp/uvsock-embed-XXXXXX");
	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(pa, sizeof(pa), "%s/a.vsock", dir);
	snprintf(pb, sizeof(pb), "%s/b.vsock", dir);
	ASSERT_EQ(dev_api_router_refs(), 0);
	cfg.uds_path = pa;
	ASSERT_OK(uvsock_dev_new(&cfg, &a));
	ASSERT_EQ(dev_api_router_refs(), 1);
	cfg.guest_cid = 4;
	cfg.uds_path = pb;
	ASSERT_OK(uvsock_dev_new(&cfg, &b));
	ASSERT_EQ(dev_api_router_refs(), 2);
	/* A failed creation gives its reference back (a regular file where the socket goes). */
	snprintf(pc, sizeof(pc), "%s/c.vsock", dir);
	fd = open(pc, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	ASSERT_GE(fd, 0);
	close(fd);
	cfg.uds_path = pc;
	cfg.guest_cid = 5;
	ASSERT_ERR(uvsock_dev_new(&cfg, &c), EEXIST);
	ASSERT_EQ(dev_api_router_refs(), 2);
	ASSERT_OK(unlink(pc));
	ASSERT_OK(uvsock_dev_link(a, b));
	ASSERT_OK(uvsock_dev_start(a));
	uvsock_dev_free(a);
	ASSERT_EQ(dev_api_router_refs(), 1);
	uvsock_dev_free(b);
	ASSERT_EQ(dev_api_router_refs(), 0);
	/* And a new device after that gets a new router. */
	cfg.guest_cid = 6;
	cfg.uds_path = pa;
	ASSERT_OK(uvsock_dev_new(&cfg, &a));
	ASSERT_EQ(dev_api_router_refs(), 1);
	uvsock_dev_free(a);
	ASSERT_EQ(dev_api_router_refs(), 0);
	ASSERT_OK(rmdir(dir));
}

TEST_MAIN()
