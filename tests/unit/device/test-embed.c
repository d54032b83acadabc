/* SPDX-License-Identifier: MIT */
/*
 * The device API of <uvsock/device.h> without vhost-user: the test is the VMM (memfd guest RAM,
 * rings and eventfds from examples/embed-guest.h), a hand-written guest (packets built byte by
 * byte) and the host programs (plain Unix sockets). Covers argument checks and their errno,
 * data both ways for host- and guest-initiated connections, configuration before and after the
 * device thread starts, refused connects, stopping the queues and replacing the memory table
 * with connections kept, guest driver reset, host-pointer memory tables, sibling devices (one
 * of them freed while the others run, also under concurrent traffic), a ring error repaired
 * by a reset, and a hostile VMM (guest memory truncated under the device, a saturated blocking
 * call eventfd, kick and call fds that are not eventfds).
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "util/macros.h"
#include "util/rec.h"
#include "util/tune.h"
#include "../../../examples/embed-guest.h"
#include "device/device_internal.h"
#include "hostside.h"
#include "test.h"

#define WAIT_MS 5000

struct env {
	char dir[64];
	char uds[128];
	struct uvsock_dev *dev;
	struct eg_guest g;
};

/*
 * The external-loop device the test's own poll() loop runs while it waits for a host socket
 * (read_full), or NULL (device-thread tests). The guest side's waits run it too (loop_dev).
 */
static struct uvsock_dev *loop_dev;

static void env_new_cfg(struct env *e, uint32_t cid, unsigned flags, uint32_t max_conns)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = cid, .flags = flags,
					 .max_conns = max_conns };

	snprintf(e->dir, sizeof(e->dir), "/tmp/uvsock-embed-XXXXXX");
	ASSERT_TRUE(mkdtemp(e->dir) != NULL);
	snprintf(e->uds, sizeof(e->uds), "%s/vm%u.vsock", e->dir, cid);
	cfg.uds_path = e->uds;
	ASSERT_OK(uvsock_dev_new(&cfg, &e->dev));
	ASSERT_OK(eg_init(&e->g, cid, uvsock_dev_features()));
	if (flags & UVSOCK_DEV_EXTERNAL_LOOP) {
		e->g.loop_dev = e->dev;
		loop_dev = e->dev;
	}
}

static void env_new(struct env *e, uint32_t cid)
{
	env_new_cfg(e, cid, 0, 0);
}

/* What a VMM does at FEATURES_OK and DRIVER_OK; post_rx false: the guest posts no RX buffer. */
static void env_configure_rx(struct env *e, bool post_rx)
{
	struct uvsock_dev_mem_region r = eg_region(&e->g);

	ASSERT_OK(uvsock_dev_set_features(e->dev, e->g.features));
	ASSERT_OK(uvsock_dev_set_mem_table(e->dev, &r, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&e->g, q);

		ASSERT_OK(uvsock_dev_queue_start(e->dev, q, &dq));
	}
	if (post_rx)
		ASSERT_OK(eg_post_all_rx(&e->g));
}

static void env_configure(struct env *e)
{
	env_configure_rx(e, true);
}

static void env_free(struct env *e)
{
	if (loop_dev == e->dev)
		loop_dev = NULL;
	uvsock_dev_free(e->dev);
	eg_destroy(&e->g);
	/* The device removed its socket files. */
	ASSERT_OK(rmdir(e->dir));
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

/* A Unix socket of type bound at path. */
static int unix_bound(const char *path, int type)
{
	struct sockaddr_un sa = hs_addr(path);
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	return fd;
}

static int unix_listen(const char *path)
{
	int fd = unix_bound(path, SOCK_STREAM);

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

		if (now >= end)
			break;
		if (loop_dev) {
			/* The device runs in this thread: our poll loop runs it while we wait. */
			int r = eg_loop_once(loop_dev, fd, POLLIN, end);

			ASSERT_GE(r, 0);
			if (r == 0)
				continue;
		} else if (poll(&p, 1, (int)(end - now)) <= 0) {
			break;
		}
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

/* A started, configured device for guest CID 3 with one host-initiated connection. */
static int env_with_host_conn(struct env *e, uint32_t *ret_host_port)
{
	env_new(e, 3);
	ASSERT_OK(uvsock_dev_start(e->dev));
	env_configure(e);
	return host_connects(e, ret_host_port);
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

/*
 * The guest's port 40000 connects to host port 5000: a host listener at <uds>_5000 (path, *lfd),
 * REQUEST, RESPONSE, the host accepts (connected before the RESPONSE: queued), then "ping" up and
 * "pong" down. Returns the accepted host fd.
 */
static int guest_connects(struct env *e, char *path, size_t cap, int *lfd)
{
	struct vsock_hdr h, o;
	char buf[64];
	int fd;

	snprintf(path, cap, "%s_5000", e->uds);
	*lfd = unix_listen(path);
	o = eg_hdr(&e->g, 40000, 5000, VSOCK_OP_REQUEST, 0, 0);
	ASSERT_OK(eg_send(&e->g, &o, NULL, WAIT_MS));
	recv_pkt(&e->g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(h.src_port, 5000);
	ASSERT_EQ(h.dst_port, 40000);
	fd = accept4(*lfd, NULL, NULL, SOCK_CLOEXEC);
	ASSERT_GE(fd, 0);
	o = eg_hdr(&e->g, 40000, 5000, VSOCK_OP_RW, 4, 0);
	ASSERT_OK(eg_send(&e->g, &o, "ping", WAIT_MS));
	ASSERT_EQ(read_full(fd, buf, 4), 4);
	ASSERT_MEMEQ(buf, "ping", 4);
	ASSERT_EQ(write(fd, "pong", 4), 4);
	recv_pkt(&e->g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(h.dst_port, 40000);
	ASSERT_EQ(h.len, 4);
	ASSERT_MEMEQ(buf, "pong", 4);
	return fd;
}

/* ---- tests -------------------------------------------------------------------------------- */

TEST(features_and_argument_errors)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3 };
	struct uvsock_dev_mem_region regs[9];
	struct uvsock_dev_queue q = { .size = sizeof(q) };
	struct uvsock_dev *d2;
	struct env e;
	uint64_t f = uvsock_dev_features();
	char longp[200];

	/* RING_PACKED (34) unless UVSOCK_TUNE has no-packed, IN_ORDER (35) unless no-in-order. */
	ASSERT_EQ(f & ~((1ull << 34) | (1ull << 35)),
		  (1ull << 1) | (1ull << 3) | (1ull << 28) | (1ull << 29) | (1ull << 32));
	ASSERT_EQ(!!(f & (1ull << 34)), tune_get()->packed);
	ASSERT_EQ(!!(f & (1ull << 35)), tune_get()->in_order);
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
	cfg.queue_size_max = 0;
	cfg.dgram_max = 65493; /* over 64 KiB less the header */
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);
	cfg.dgram_max = 0;
	cfg.flags = 1u << 30; /* unknown */
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);
	cfg.flags = 0;

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
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, 3, &q), EINVAL); /* 2 is the event queue */
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
	ASSERT_OK(uvsock_dev_link(e.dev, d2)); /* e.dev's thread makes the link */
	uvsock_dev_free(d2);
	ASSERT_TRUE(access(longp, F_OK) < 0 && errno == ENOENT);
	uvsock_dev_free(NULL);
	env_free(&e);
}

/* Configured before the thread starts (calls run on the caller's thread). */
TEST(host_initiated_data_both_ways)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
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
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h, o;
	char path[200], buf[64];
	struct env e;
	int lfd, fd;

	env_new(&e, 5);
	ASSERT_OK(uvsock_dev_start(e.dev));
	env_configure(&e);
	fd = guest_connects(&e, path, sizeof(path), &lfd);
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
	WAIT_FOR((uvsock_dev_get_stats(e.dev, &st), st.dropped), WAIT_MS);
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

	fd = env_with_host_conn(&e, &port);
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
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	uint32_t port, fwd = 0;
	struct env e;
	int fd;

	fd = env_with_host_conn(&e, &port);
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
	struct uvsock_dev_stats st = { .size = sizeof(st) };
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
	WAIT_FOR((uvsock_dev_get_stats(a.dev, &st), st.dropped), WAIT_MS);
	ASSERT_EQ(st.dropped, 1);
	env_free(&a);
	env_free(&b);
}

/*
 * Devices already running are linked (a VM added to a group at run time, as uvsockd's vm-add):
 * the new pair routes at once; a device linked to neither stays unreachable from both.
 */
TEST(linking_running_devices)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h, o;
	struct env a, b, c;
	char buf[64];

	env_new(&a, 3);
	env_new(&b, 4);
	env_new(&c, 5);
	env_configure(&a);
	env_configure(&b);
	env_configure(&c);
	ASSERT_OK(uvsock_dev_start(a.dev));
	ASSERT_OK(uvsock_dev_start(b.dev));
	ASSERT_OK(uvsock_dev_start(c.dev));
	ASSERT_OK(uvsock_dev_link(a.dev, b.dev));
	o = eg_hdr(&a.g, 40000, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 4;
	ASSERT_OK(eg_send(&a.g, &o, NULL, WAIT_MS));
	recv_pkt(&b.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(h.src_cid, 3);
	/* c is in no group with a or b: dropped both ways, nothing reaches it. */
	o = eg_hdr(&a.g, 40001, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 5;
	ASSERT_OK(eg_send(&a.g, &o, NULL, WAIT_MS));
	WAIT_FOR((uvsock_dev_get_stats(a.dev, &st), st.dropped), WAIT_MS);
	ASSERT_EQ(st.dropped, 1);
	o = eg_hdr(&c.g, 40002, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 4;
	ASSERT_OK(eg_send(&c.g, &o, NULL, WAIT_MS));
	WAIT_FOR((uvsock_dev_get_stats(c.dev, &st), st.dropped), WAIT_MS);
	ASSERT_EQ(st.dropped, 1);
	ASSERT_OK(uvsock_dev_get_stats(b.dev, &st));
	ASSERT_EQ(st.rx_pkts, 1); /* a's REQUEST only */
	env_free(&a);
	env_free(&b);
	env_free(&c);
}

/* UVSOCK_DEV_NO_DGRAM: no datagram socket; without it, <uds_path>.dgram is bound. */
TEST(no_dgram_binds_no_datagram_socket)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3, .dgram_max = 1000 };
	char dir[] = "/tmp/uvsock-embed-XXXXXX", uds[64], dg[80];
	struct uvsock_dev *d;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(uds, sizeof(uds), "%s/vm.vsock", dir);
	snprintf(dg, sizeof(dg), "%s.dgram", uds);
	cfg.uds_path = uds;
	ASSERT_OK(uvsock_dev_new(&cfg, &d));
	ASSERT_OK(access(dg, F_OK));
	uvsock_dev_free(d);
	cfg.flags = UVSOCK_DEV_NO_DGRAM;
	ASSERT_OK(uvsock_dev_new(&cfg, &d));
	ASSERT_OK(access(uds, F_OK));
	ASSERT_TRUE(access(dg, F_OK) < 0 && errno == ENOENT);
	uvsock_dev_free(d);
	ASSERT_OK(rmdir(dir));
}

/* A ring error marks the device broken (counted); a reset and restart repair it. */
TEST(ring_error_is_repaired_by_reset)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
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
	/* Published as every avail index is (release); no new descriptor is behind it. */
	vring_store16_release(&avail->idx, (uint16_t)(EG_QSIZE * 4));
	if (e.g.features & (1ull << UVSOCK_DEV_F_RING_PACKED)) {
		/* Packed ring: an available descriptor with a buffer id past the ring. */
		struct vring_pk_desc_le *pd = (void *)(uint8_t *)eg_host(&e.g, EG_RING_GPA(1));

		pd->id = htole16(0xffff);
		vring_store16_release(&pd->flags, VRING_PK_DESC_F_AVAIL);
	}
	ASSERT_EQ(write(e.g.kick[1], &one, 8), 8);
	WAIT_FOR((uvsock_dev_get_stats(e.dev, &st), st.broken), WAIT_MS);
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

/* ---- external loop: the test's poll() loop runs the device ------------------------------- */

/* One pass of the test's own loop (at most 10 ms): an external-loop device runs in it. */
static void loop_step(struct uvsock_dev *dev)
{
	ASSERT_GE(eg_loop_once(dev, -1, 0, eg_now_ms() + 10), 0);
}

/* Threads of this process now (/proc/self/status), or -1. */
static int thread_count(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	int n = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	fclose(f);
	return n;
}

/*
 * No device thread: the test's own poll() loop (eg_loop_once: the device's fd, the host socket
 * or call eventfd waited for, the device's timeout) runs the device. Data both ways on a host-
 * and a guest-initiated connection; the process never has more threads than at the start.
 */
TEST(external_loop_data_both_ways_without_a_thread)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h, o;
	char path[200], buf[64];
	uint32_t port, fwd = 0;
	struct env e;
	int threads = thread_count(), hfd, lfd, fd;

	ASSERT_GE(threads, 1);
	env_new_cfg(&e, 3, UVSOCK_DEV_EXTERNAL_LOOP, 0);
	ASSERT_ERR(uvsock_dev_start(e.dev), EINVAL);
	ASSERT_GE(uvsock_dev_fd(e.dev), 0);
	env_configure(&e);
	ASSERT_EQ(thread_count(), threads);

	/* Host-initiated: CONNECT line, REQUEST, RESPONSE, "OK <port>", then bytes both ways. */
	hfd = host_connects(&e, &port);
	ASSERT_GE(port, 1u << 30);
	exchange(&e, hfd, port, &fwd, "hello guest", "hello host");
	exchange(&e, hfd, port, &fwd, "second", "answer two");

	/* Guest-initiated: the device connects to <uds>_5000. */
	fd = guest_connects(&e, path, sizeof(path), &lfd);
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.conns_open, 2);
	ASSERT_EQ(st.conns_total, 2);
	ASSERT_EQ(st.rx_bytes, 11 + 6 + 4);
	ASSERT_EQ(st.tx_bytes, 10 + 10 + 4);
	ASSERT_EQ(st.running, 1);
	ASSERT_EQ(thread_count(), threads);

	/* The host closes each: the guest is told (SHUTDOWN), answers RST. */
	close(fd);
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(h.dst_port, 40000);
	o = eg_hdr(&e.g, 40000, 5000, VSOCK_OP_RST, 0, 4);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	close(hfd);
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(h.dst_port, 1234);
	o = eg_hdr(&e.g, 1234, port, VSOCK_OP_RST, 0, fwd);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	WAIT_FOR((loop_step(e.dev), uvsock_dev_get_stats(e.dev, &st), st.conns_open == 0), WAIT_MS);
	ASSERT_EQ(st.conns_open, 0);
	ASSERT_EQ(thread_count(), threads);
	close(lfd);
	unlink(path);
	env_free(&e);
}

/*
 * Guest connects refused count every RST, also those the engine gives before the device sees
 * the REQUEST (its sockets are limited to max_conns + 8). With an external loop the device runs
 * only when we say so: the whole burst is in the TX ring when it first looks.
 */
TEST(every_refused_guest_connect_is_counted)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h, o;
	unsigned rst = 0, n = 24; /* more than the engine's 1 + 8 sockets, two of them listeners */
	bool seen[24] = { false };
	char buf[64];
	struct env e;

	env_new_cfg(&e, 3, UVSOCK_DEV_EXTERNAL_LOOP, 1);
	env_configure(&e);
	for (unsigned i = 0; i < n; i++) {
		o = eg_hdr(&e.g, 40000 + i, 5000, VSOCK_OP_REQUEST, 0, 0); /* nobody listens */
		ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	}
	/* One RST each (the engine's come first: they are queued while the burst is fed). */
	while (rst < n) {
		recv_pkt(&e.g, &h, buf, sizeof(buf));
		ASSERT_EQ(h.op, VSOCK_OP_RST);
		ASSERT_GE(h.dst_port, 40000);
		ASSERT_LT(h.dst_port, 40000 + n);
		ASSERT_FALSE(seen[h.dst_port - 40000]);
		seen[h.dst_port - 40000] = true;
		rst++;
	}
	uvsock_dev_get_stats(e.dev, &st);
	ASSERT_EQ(st.host_connects_refused, n);
	ASSERT_EQ(st.conns_open, 0);
	env_free(&e);
}

/* What another thread gets when it calls into an external-loop device. */
struct other_calls {
	struct uvsock_dev *dev;
	struct env *env;
	bool configure; /* before the first uvsock_dev_process: do the VMM's set-up */
	int set_up, features, mem, stop, call_fd, reset, process, timeout, fd;
	struct uvsock_dev_stats st;
};

static void *other_thread(void *arg)
{
	struct other_calls *c = arg;
	struct uvsock_dev_mem_region r = eg_region(&c->env->g);
	uint16_t idx;

	if (c->configure) {
		c->set_up = uvsock_dev_set_features(c->dev, c->env->g.features);
		if (c->set_up == 0)
			c->set_up = uvsock_dev_set_mem_table(c->dev, &r, 1);
		for (unsigned q = 0; c->set_up == 0 && q < 2; q++) {
			struct uvsock_dev_queue dq = eg_queue(&c->env->g, q);

			c->set_up = uvsock_dev_queue_start(c->dev, q, &dq);
		}
		return NULL;
	}
	c->features = uvsock_dev_set_features(c->dev, c->env->g.features);
	c->mem = uvsock_dev_set_mem_table(c->dev, &r, 1);
	c->stop = uvsock_dev_queue_stop(c->dev, 1, &idx);
	c->call_fd = uvsock_dev_set_call_fd(c->dev, 0, -1);
	c->reset = uvsock_dev_reset(c->dev);
	c->process = uvsock_dev_process(c->dev);
	c->timeout = uvsock_dev_timeout_ms(c->dev);
	c->fd = uvsock_dev_fd(c->dev);
	c->st.size = sizeof(c->st);
	uvsock_dev_get_stats(c->dev, &c->st);
	return NULL;
}

/*
 * Set-up from another thread before the first uvsock_dev_process; afterwards only the loop
 * thread may call (-EPERM, nothing done), except fd and stats. Mode mismatches are -EINVAL.
 */
TEST(external_loop_thread_rules)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 4 };
	struct other_calls c = { 0 };
	struct uvsock_dev *d2;
	uint32_t port, fwd = 0;
	char p2[200];
	pthread_t th;
	struct env e;
	int fd;

	env_new_cfg(&e, 3, UVSOCK_DEV_EXTERNAL_LOOP, 0);
	cfg.flags = 1u << 30; /* unknown flag */
	cfg.uds_path = e.uds;
	ASSERT_ERR(uvsock_dev_new(&cfg, &d2), EINVAL);
	/* A device-thread device has no fd, no timeout and nothing to process. */
	cfg.flags = 0;
	snprintf(p2, sizeof(p2), "%s/vm4.vsock", e.dir);
	cfg.uds_path = p2;
	ASSERT_OK(uvsock_dev_new(&cfg, &d2));
	ASSERT_ERR(uvsock_dev_fd(d2), EINVAL);
	ASSERT_ERR(uvsock_dev_process(d2), EINVAL);
	ASSERT_EQ(uvsock_dev_timeout_ms(d2), -1);
	ASSERT_ERR(uvsock_dev_fd(NULL), EINVAL);
	ASSERT_ERR(uvsock_dev_process(NULL), EINVAL);

	/* The VMM's main thread (here: another one) sets the device up; then its loop runs it. */
	c.dev = e.dev;
	c.env = &e;
	c.configure = true;
	ASSERT_OK(pthread_create(&th, NULL, other_thread, &c));
	ASSERT_OK(pthread_join(th, NULL));
	ASSERT_OK(c.set_up);
	ASSERT_OK(eg_post_all_rx(&e.g));
	ASSERT_OK(uvsock_dev_process(e.dev)); /* this thread is the loop thread from now on */
	ASSERT_ERR(uvsock_dev_link(e.dev, d2), EINVAL); /* too late: it has run */
	uvsock_dev_free(d2);

	c.configure = false;
	ASSERT_OK(pthread_create(&th, NULL, other_thread, &c));
	ASSERT_OK(pthread_join(th, NULL));
	ASSERT_ERR(c.features, EPERM);
	ASSERT_ERR(c.mem, EPERM);
	ASSERT_ERR(c.stop, EPERM);
	ASSERT_ERR(c.call_fd, EPERM);
	ASSERT_ERR(c.reset, EPERM);
	ASSERT_ERR(c.process, EPERM);
	ASSERT_EQ(c.timeout, 0);
	ASSERT_EQ(c.fd, uvsock_dev_fd(e.dev));
	ASSERT_EQ(c.st.running, 1);
	/* Nothing was done: the queues still run, the call fd is still used. */
	fd = host_connects(&e, &port);
	exchange(&e, fd, port, &fwd, "still", "running");
	close(fd);
	env_free(&e);
}

/* The device's timers run from the timeout the VMM's loop sleeps on (a CONNECT line's 2 s). */
TEST(external_loop_timers_run_from_the_timeout)
{
	struct pollfd p;
	uint64_t start;
	struct env e;
	int fd, ms = -1;

	env_new_cfg(&e, 3, UVSOCK_DEV_EXTERNAL_LOOP, 0);
	env_configure(&e);
	fd = unix_connect(e.uds); /* and never sends its CONNECT line */
	start = test_now_ms();
	WAIT_FOR((loop_step(e.dev), (ms = uvsock_dev_timeout_ms(e.dev)) > 0), WAIT_MS);
	/* Accepted: only its 2 s limit is left, and nothing makes the fd readable. */
	ASSERT_GT(ms, 1000);
	ASSERT_LE(ms, 2000);
	p = (struct pollfd){ .fd = uvsock_dev_fd(e.dev), .events = POLLIN };
	ASSERT_EQ(poll(&p, 1, 0), 0);
	/* Our loop sleeps until the timer; the device then closes the host socket. */
	ASSERT_TRUE(wait_eof(fd));
	ASSERT_GE(test_now_ms() - start, 1900);
	close(fd);
	env_free(&e);
}

/* ---- a linked device freed while its siblings run ------------------------------------------ */

/* Packets queued in u's sibling inbox (a relaxed read of the device's hint counter). */
static unsigned inbox_count(struct uvsock_dev *u)
{
	struct vsock_dev *d = (struct vsock_dev *)(void *)u;

	return atomic_load_explicit(&d->sib.port->inbox.count, memory_order_relaxed);
}

/* Waits until u's stats show `dropped` (within WAIT_MS) and returns what they show then. */
static uint64_t wait_dropped(struct uvsock_dev *u, uint64_t dropped)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };

	WAIT_FOR((uvsock_dev_get_stats(u, &st), st.dropped >= dropped), WAIT_MS);
	return st.dropped;
}

/* Guest `from` sends op (payload len bytes of buf) from port sp to CID to_cid's port dp. */
static void sib_send(struct env *from, uint32_t to_cid, uint32_t sp, uint32_t dp, uint16_t op,
		     const void *buf, uint32_t len)
{
	struct vsock_hdr o = eg_hdr(&from->g, sp, dp, op, len, 0);

	o.dst_cid = to_cid;
	ASSERT_OK(eg_send(&from->g, &o, buf, WAIT_MS));
}

/* sib_expect skips RSTs to this port (late RSTs of a run too slow to know their count), or 0. */
static uint32_t skip_rst_to;

/* Guest `to` receives the next packet: op, from `from`'s guest, ports sp -> dp. */
static void sib_expect(struct env *to, uint32_t from_cid, uint32_t sp, uint32_t dp, uint16_t op,
		       const char *payload)
{
	struct vsock_hdr h;
	char buf[256];

	do
		recv_pkt(&to->g, &h, buf, sizeof(buf));
	while (skip_rst_to && h.op == VSOCK_OP_RST && h.dst_port == skip_rst_to &&
	       !(op == VSOCK_OP_RST && dp == skip_rst_to));
	ASSERT_EQ(h.op, op);
	ASSERT_EQ(h.src_cid, from_cid);
	ASSERT_EQ(h.dst_cid, to->g.cid);
	ASSERT_EQ(h.src_port, sp);
	ASSERT_EQ(h.dst_port, dp);
	ASSERT_EQ(h.len, payload ? strlen(payload) : 0);
	if (payload)
		ASSERT_MEMEQ(buf, payload, h.len);
}

/* A guest-to-guest connection from a:sp to b:dp (REQUEST, RESPONSE) and data both ways. */
static void sib_connect(struct env *a, struct env *b, uint32_t sp, uint32_t dp)
{
	sib_send(a, b->g.cid, sp, dp, VSOCK_OP_REQUEST, NULL, 0);
	sib_expect(b, a->g.cid, sp, dp, VSOCK_OP_REQUEST, NULL);
	sib_send(b, a->g.cid, dp, sp, VSOCK_OP_RESPONSE, NULL, 0);
	sib_expect(a, b->g.cid, dp, sp, VSOCK_OP_RESPONSE, NULL);
}

static void sib_data(struct env *a, struct env *b, uint32_t sp, uint32_t dp, const char *msg)
{
	sib_send(a, b->g.cid, sp, dp, VSOCK_OP_RW, msg, (uint32_t)strlen(msg));
	sib_expect(b, a->g.cid, sp, dp, VSOCK_OP_RW, msg);
}

/*
 * Three linked devices; C's guest takes no packets, so what A and B send it waits in C's inbox,
 * and A is blocked on it (C's 4 MiB full, A's next packet staged). C is freed while A and B run:
 * A is released at once, every packet A and B had queued for C, the staged one and those A
 * sends C later are dropped, counted on A and B, and answered with an RST from C (an RST is
 * not answered); A and B go on with their connection and open new ones.
 */
TEST(freeing_a_linked_device_while_its_siblings_run)
{
	static uint8_t big[65536];
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h;
	struct env a, b, c;
	bool b_rst[3] = { false, false, false };
	unsigned expect_rst;
	uint64_t t0, a_tx;
	bool fast;
	char buf[64];

	env_new(&a, 3);
	env_new(&b, 4);
	env_new(&c, 5);
	ASSERT_OK(uvsock_dev_link(a.dev, b.dev));
	ASSERT_OK(uvsock_dev_link(a.dev, c.dev));
	ASSERT_OK(uvsock_dev_link(b.dev, c.dev));
	env_configure(&a);
	env_configure(&b);
	env_configure_rx(&c, false);
	ASSERT_OK(uvsock_dev_start(a.dev));
	ASSERT_OK(uvsock_dev_start(b.dev));
	ASSERT_OK(uvsock_dev_start(c.dev));
	sib_connect(&a, &b, 40000, 77);
	sib_data(&a, &b, 40000, 77, "a to b");
	sib_data(&b, &a, 77, 40000, "b to a");

	/*
	 * A: 64 packets of 64 KiB, C's whole 4 MiB (A is C's only sender then: its fair share is
	 * the whole inbox, src/device/sibling.c "Fair shares"); then B: three connects to C,
	 * within B's share. They all wait.
	 */
	for (int i = 0; i < 64; i++)
		sib_send(&a, 5, 40001, 77, VSOCK_OP_RW, big, sizeof(big));
	ASSERT_WAIT_FOR(inbox_count(c.dev) >= 64, WAIT_MS);
	for (uint32_t i = 0; i < 3; i++)
		sib_send(&b, 5, 50000 + i, 77, VSOCK_OP_REQUEST, NULL, 0);
	ASSERT_WAIT_FOR(inbox_count(c.dev) >= 67, WAIT_MS);
	/* Three more: the first is staged in A (no room in C), A stops taking its TX ring. */
	uvsock_dev_get_stats(a.dev, &st);
	a_tx = st.tx_pkts;
	t0 = test_now_ms();
	for (int i = 0; i < 3; i++)
		sib_send(&a, 5, 40001, 77, VSOCK_OP_RW, "x", 1);
	ASSERT_WAIT_FOR((uvsock_dev_get_stats(a.dev, &st), st.tx_pkts >= a_tx + 1), WAIT_MS);
	ASSERT_EQ(inbox_count(c.dev), 67);

	env_free(&c);
	/*
	 * C was freed well within A's 1 s stall limit (DEV_SIB_STALL_NS, armed after t0): C was
	 * not found congested first, so A's three packets were refused by the freed C (RST each).
	 * In a very slow run (500 ms or more) A may have dropped some of them as congested, without
	 * RSTs (the drop count is the same): then the 64 RSTs are checked and later ones skipped.
	 */
	fast = test_now_ms() - t0 < 500;
	expect_rst = fast ? 64 + 3 : 64;
	for (unsigned i = 0; i < expect_rst; i++)
		sib_expect(&a, 5, 77, 40001, VSOCK_OP_RST, NULL);
	/*
	 * Released at once by the free, not by its own 1 s stall timer (armed after t0), which
	 * would have refused the staged packet too: 500 ms of slack for these few packets.
	 */
	if (fast)
		ASSERT_LT(test_now_ms() - t0, 1000);
	else
		skip_rst_to = 40001;
	for (int i = 0; i < 3; i++) {
		recv_pkt(&b.g, &h, buf, sizeof(buf));
		ASSERT_EQ(h.op, VSOCK_OP_RST);
		ASSERT_EQ(h.src_cid, 5);
		ASSERT_EQ(h.src_port, 77);
		ASSERT_TRUE(h.dst_port >= 50000 && h.dst_port < 50003);
		ASSERT_FALSE(b_rst[h.dst_port - 50000]);
		b_rst[h.dst_port - 50000] = true;
	}
	ASSERT_EQ(wait_dropped(a.dev, 67), 67);
	ASSERT_EQ(wait_dropped(b.dev, 3), 3);
	uvsock_dev_get_stats(a.dev, &st);
	ASSERT_EQ(st.tx_pkts, a_tx + 3);

	/* A and B go on: the old connection, a new one, and C's CID is refused. */
	sib_data(&a, &b, 40000, 77, "still here");
	sib_data(&b, &a, 77, 40000, "me too");
	sib_connect(&b, &a, 41000, 88);
	sib_send(&a, 5, 40002, 77, VSOCK_OP_REQUEST, NULL, 0);
	sib_expect(&a, 5, 77, 40002, VSOCK_OP_RST, NULL);
	sib_send(&a, 5, 40002, 77, VSOCK_OP_RST, NULL, 0);
	ASSERT_EQ(wait_dropped(a.dev, 69), 69);
	sib_data(&a, &b, 40000, 77, "bye");
	/* Nothing answered the RST: the next packet A's guest gets is B's. */
	sib_data(&b, &a, 41000, 88, "bye too");
	env_free(&a);
	env_free(&b);
}

/* One guest sending to its two siblings in turn and counting what it receives, by source. */
struct pump {
	struct env *e;
	uint32_t peers[2];
	pthread_t th;
	/* Relaxed: counters and flags read while the pump runs; pthread_join orders the rest. */
	atomic_bool stop;
	atomic_uint rx[8];  /* packets received from CID i */
	atomic_uint rst[8]; /* RSTs among them */
	atomic_int err;     /* eg_recv failed (0: no) */
};

static void *pump_main(void *arg)
{
	static const uint8_t payload[1000];
	struct pump *p = arg;
	uint8_t buf[EG_RXBUF];
	struct vsock_hdr h, o;
	int r;

	for (unsigned i = 0; !atomic_load_explicit(&p->stop, memory_order_relaxed); i++) {
		o = eg_hdr(&p->e->g, 30000 + (i & 7), 77, VSOCK_OP_RW, sizeof(payload), 0);
		o.dst_cid = p->peers[i % 2];
		/* -ETIMEDOUT: no free TX buffer for now (or the device is gone); go on. */
		(void)eg_send(&p->e->g, &o, payload, 20);
		while ((r = eg_recv(&p->e->g, &h, buf, sizeof(buf), 0)) == 0) {
			if (h.src_cid >= 8)
				continue;
			atomic_fetch_add_explicit(&p->rx[h.src_cid], 1, memory_order_relaxed);
			if (h.op == VSOCK_OP_RST)
				atomic_fetch_add_explicit(&p->rst[h.src_cid], 1,
							  memory_order_relaxed);
		}
		if (r != -ETIMEDOUT)
			atomic_store_explicit(&p->err, r, memory_order_relaxed);
	}
	return NULL;
}

static unsigned pump_rx(struct pump *p, uint32_t cid, bool rst)
{
	return atomic_load_explicit(rst ? &p->rst[cid] : &p->rx[cid], memory_order_relaxed);
}

/* Every one of the n pumps has received at least `want` packets from each of its peers. */
static bool pumps_got(struct pump *p, unsigned n, unsigned want)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; k < 2; k++)
			if (pump_rx(&p[i], p[i].peers[k], false) < want)
				return false;
	return true;
}

/*
 * Three linked devices with every guest sending to both others as fast as it can; C is freed in
 * the middle of that (its guest still sending: it just gets no more service). A and B keep
 * exchanging packets and get RSTs for what they send C. Run repeatedly under ASan to shake out
 * races between the freeing thread and the running devices.
 */
TEST(freeing_a_linked_device_under_traffic)
{
	struct env e[3];
	struct pump p[3];
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	unsigned ab0, ba0;

	for (unsigned i = 0; i < 3; i++)
		env_new(&e[i], 3 + i);
	ASSERT_OK(uvsock_dev_link(e[0].dev, e[1].dev));
	ASSERT_OK(uvsock_dev_link(e[0].dev, e[2].dev));
	ASSERT_OK(uvsock_dev_link(e[1].dev, e[2].dev));
	for (unsigned i = 0; i < 3; i++) {
		env_configure(&e[i]);
		ASSERT_OK(uvsock_dev_start(e[i].dev));
	}
	for (unsigned i = 0; i < 3; i++) {
		p[i] = (struct pump){ .e = &e[i], .peers = { 3 + (i + 1) % 3, 3 + (i + 2) % 3 } };
		ASSERT_EQ(pthread_create(&p[i].th, NULL, pump_main, &p[i]), 0);
	}
	/* Traffic flows every way. */
	ASSERT_WAIT_FOR(pumps_got(p, 3, 20), WAIT_MS);
	uvsock_dev_free(e[2].dev);
	e[2].dev = NULL;
	ab0 = pump_rx(&p[1], 3, false);
	ba0 = pump_rx(&p[0], 4, false);
	/* A and B still reach each other; what they send C is refused. */
	ASSERT_WAIT_FOR(pump_rx(&p[0], 5, true) && pump_rx(&p[1], 5, true) &&
				pump_rx(&p[1], 3, false) >= ab0 + 50 &&
				pump_rx(&p[0], 4, false) >= ba0 + 50,
			WAIT_MS);
	for (unsigned i = 0; i < 3; i++) {
		atomic_store_explicit(&p[i].stop, true, memory_order_relaxed);
		pthread_join(p[i].th, NULL);
		ASSERT_EQ(p[i].err, 0);
	}
	for (unsigned i = 0; i < 2; i++) {
		uvsock_dev_get_stats(e[i].dev, &st);
		ASSERT_GE(st.dropped, pump_rx(&p[i], 5, true));
		printf("# cid %u: %u packets from cid %u, %u from the freed cid 5 (%u RSTs), %llu "
		       "dropped\n", 3 + i, pump_rx(&p[i], 4 - i, false), 4 - i,
		       pump_rx(&p[i], 5, false), pump_rx(&p[i], 5, true),
		       (unsigned long long)st.dropped);
	}
	for (unsigned i = 0; i < 3; i++)
		env_free(&e[i]);
}

/* The router the API's devices share lives from the first device to the last (no leak). */
TEST(shared_router_is_freed_with_the_last_device)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3 };
	struct uvsock_dev *a, *b, *c;
	char dir[64], pa[128], pb[128], pc[128];
	int fd;

	snprintf(dir, sizeof(dir), "/tmp/uvsock-embed-XXXXXX");
	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(pa, sizeof(pa), "%s/a.vsock", dir);
	snprintf(pb, sizeof(pb), "%s/b.vsock", dir);
	ASSERT_EQ(dev_embed_router_refs(), 0);
	cfg.uds_path = pa;
	ASSERT_OK(uvsock_dev_new(&cfg, &a));
	ASSERT_EQ(dev_embed_router_refs(), 1);
	cfg.guest_cid = 4;
	cfg.uds_path = pb;
	ASSERT_OK(uvsock_dev_new(&cfg, &b));
	ASSERT_EQ(dev_embed_router_refs(), 2);
	/* A failed creation gives its reference back (a regular file where the socket goes). */
	snprintf(pc, sizeof(pc), "%s/c.vsock", dir);
	fd = open(pc, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	ASSERT_GE(fd, 0);
	close(fd);
	cfg.uds_path = pc;
	cfg.guest_cid = 5;
	ASSERT_ERR(uvsock_dev_new(&cfg, &c), EEXIST);
	ASSERT_EQ(dev_embed_router_refs(), 2);
	ASSERT_OK(unlink(pc));
	ASSERT_OK(uvsock_dev_link(a, b));
	ASSERT_OK(uvsock_dev_start(a));
	uvsock_dev_free(a);
	ASSERT_EQ(dev_embed_router_refs(), 1);
	uvsock_dev_free(b);
	ASSERT_EQ(dev_embed_router_refs(), 0);
	/* And a new device after that gets a new router. */
	cfg.guest_cid = 6;
	cfg.uds_path = pa;
	ASSERT_OK(uvsock_dev_new(&cfg, &a));
	ASSERT_EQ(dev_embed_router_refs(), 1);
	uvsock_dev_free(a);
	ASSERT_EQ(dev_embed_router_refs(), 0);
	ASSERT_OK(rmdir(dir));
}

/* ---- a hostile VMM: memory and eventfds ---------------------------------------------------- */

/*
 * The VMM truncates the guest memory under a running device (a memfd without sealing, so the
 * device cannot seal it): the device thread's next ring access faults. Only that device breaks;
 * the process lives and another device keeps serving its guest. (Before the SIGBUS guard the
 * whole process died.) The test never touches a's RAM after the truncation: its own mapping
 * would fault too.
 */
TEST(truncated_guest_memory_breaks_only_that_device)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	uint32_t port, fwd = 0;
	struct env a, b;
	uint64_t one = 1;
	int fd;

	env_new(&a, 3);
	env_new(&b, 4);
	env_configure(&a);
	env_configure(&b);
	ASSERT_OK(uvsock_dev_start(a.dev));
	ASSERT_OK(uvsock_dev_start(b.dev));
	ASSERT_OK(ftruncate(a.g.memfd, 0));
	ASSERT_EQ(write(a.g.kick[1], &one, 8), 8);
	ASSERT_WAIT_FOR((uvsock_dev_get_stats(a.dev, &st), st.broken), WAIT_MS);
	ASSERT_EQ(st.ring_errors, 1);
	fd = host_connects(&b, &port);
	exchange(&b, fd, port, &fwd, "b is fine", "still");
	close(fd);
	uvsock_dev_get_stats(b.dev, &st);
	ASSERT_EQ(st.broken, 0);
	env_free(&a);
	env_free(&b);
}

/*
 * The VMM hands a blocking call eventfd whose counter is saturated (0xfffffffffffffffe): a
 * write() would block forever. The device must skip the interrupt (one is pending anyway) and
 * keep serving: the configuration call below needs the device thread, which hung before.
 */
TEST(saturated_blocking_call_fd_never_blocks_the_device)
{
	uint64_t full = 0xfffffffffffffffeull;
	struct uvsock_dev_stats st = { .size = sizeof(st) };
	struct vsock_hdr h, o;
	char line[64], buf[64];
	size_t n = 0;
	struct env e;
	uint32_t port;
	int sat, fd;

	env_new(&e, 3);
	env_configure(&e);
	ASSERT_OK(uvsock_dev_start(e.dev));
	sat = eventfd(0, EFD_CLOEXEC); /* blocking */
	ASSERT_GE(sat, 0);
	ASSERT_EQ(write(sat, &full, 8), 8);
	ASSERT_OK(uvsock_dev_set_call_fd(e.dev, UVSOCK_DEV_QUEUE_RX, sat));
	fd = unix_connect(e.uds);
	ASSERT_EQ(write(fd, "CONNECT 1234\n", 13), 13);
	/* The REQUEST reached the RX ring and its interrupt was attempted on the full eventfd. */
	ASSERT_WAIT_FOR((uvsock_dev_get_stats(e.dev, &st), st.rx_pkts >= 1 && st.interrupts >= 1),
			WAIT_MS);
	ASSERT_OK(uvsock_dev_set_call_fd(e.dev, UVSOCK_DEV_QUEUE_RX, e.g.call[0]));
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	o = eg_hdr(&e.g, 1234, h.src_port, VSOCK_OP_RESPONSE, 0, 0);
	ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
	while (n < sizeof(line) - 1 && read_full(fd, line + n, 1) == 1 && line[n++] != '\n')
		;
	line[n] = '\0';
	ASSERT_EQ(sscanf(line, "OK %u\n", &port), 1);
	close(fd);
	close(sat);
	env_free(&e);
}

/* Kick and call fds must be eventfds: a pipe whose writer closed is always readable (a spinning
 * device thread), a full pipe blocks its writer. */
TEST(kick_and_call_fds_must_be_eventfds)
{
	struct uvsock_dev_mem_region r;
	struct uvsock_dev_queue q = { .size = sizeof(q) };
	int p[2];
	struct env e;

	env_new(&e, 3);
	ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
	close(p[1]);
	r = eg_region(&e.g);
	ASSERT_OK(uvsock_dev_set_features(e.dev, e.g.features));
	ASSERT_OK(uvsock_dev_set_mem_table(e.dev, &r, 1));
	q = eg_queue(&e.g, UVSOCK_DEV_QUEUE_TX);
	q.kick_fd = p[0];
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, UVSOCK_DEV_QUEUE_TX, &q), EINVAL);
	q = eg_queue(&e.g, UVSOCK_DEV_QUEUE_TX);
	q.call_fd = p[0];
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, UVSOCK_DEV_QUEUE_TX, &q), EINVAL);
	ASSERT_ERR(uvsock_dev_set_call_fd(e.dev, UVSOCK_DEV_QUEUE_TX, p[0]), EINVAL);
	/* A kick fd that is not open at all is -EBADF, as device.h documents. */
	q = eg_queue(&e.g, UVSOCK_DEV_QUEUE_TX);
	q.kick_fd = 1 << 20; /* never open: above any fd this test has */
	ASSERT_ERR(uvsock_dev_queue_start(e.dev, UVSOCK_DEV_QUEUE_TX, &q), EBADF);
	q = eg_queue(&e.g, UVSOCK_DEV_QUEUE_TX);
	ASSERT_OK(uvsock_dev_queue_start(e.dev, UVSOCK_DEV_QUEUE_TX, &q));
	close(p[0]);
	env_free(&e);
}

/* ---- state save and restore (uvsock_dev_save / _restore / _resume) ------------------------- */

/* The byte at stream offset i of direction dir: a pattern that a lost, doubled or reordered
 * byte breaks. */
static uint8_t xfer_byte(uint64_t i, unsigned dir)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull + dir;

	return (uint8_t)(x >> 56 ^ x >> 29);
}

#define XFER_TOTAL (1536u * 1024)
#define XFER_CHUNK (16u * 1024)
#define DEV_BUF_ALLOC (256u * 1024)

/* One host-initiated connection with data both ways (guest port 1234, host fd). */
struct xfer {
	struct env *e;
	int fd;
	uint32_t port;
	uint64_t h2g_sent, h2g_got;   /* host wrote / guest received, in order */
	uint64_t g2h_sent, g2h_got;   /* guest sent / host read, in order */
	uint32_t fwd, fwd_told;       /* the guest's fwd_cnt, and what it last told the device */
	uint32_t dev_fwd;             /* the device's fwd_cnt as the guest last saw it */
};

/* Stream bytes with a pattern, checked where they are read. */
static void xfer_check(const uint8_t *p, size_t n, uint64_t off, unsigned dir)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != xfer_byte(off + i, dir)) {
			ASSERT_EQ(p[i], xfer_byte(off + i, dir));
		}
}

/*
 * One round of both sides: the host writes what its socket takes and (host_reads) reads what
 * it got; the guest takes one packet if one comes within 20 ms (guest_reads) and sends one
 * chunk within the device's credit (guest_sends). Never an RST or a SHUTDOWN.
 */
static void xfer_round(struct xfer *x, bool host_reads, bool guest_reads, bool guest_sends)
{
	static uint8_t buf[XFER_CHUNK];
	struct vsock_hdr h, o;
	ssize_t n;

	if (x->h2g_sent < XFER_TOTAL) {
		size_t len = MIN((size_t)(XFER_TOTAL - x->h2g_sent), sizeof(buf));

		for (size_t i = 0; i < len; i++)
			buf[i] = xfer_byte(x->h2g_sent + i, 0);
		n = send(x->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0)
			ASSERT_EQ(errno, EAGAIN);
		else
			x->h2g_sent += (size_t)n;
	}
	if (host_reads) {
		n = recv(x->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0)
			ASSERT_EQ(errno, EAGAIN);
		ASSERT_TRUE(n != 0); /* no EOF: the connection stays open */
		if (n > 0) {
			xfer_check(buf, (size_t)n, x->g2h_got, 1);
			x->g2h_got += (size_t)n;
		}
	}
	if (guest_reads && eg_recv(&x->e->g, &h, buf, sizeof(buf), 20) == 0) {
		ASSERT_EQ(h.dst_port, 1234);
		ASSERT_EQ(h.src_port, x->port);
		ASSERT_TRUE(h.op == VSOCK_OP_RW || h.op == VSOCK_OP_CREDIT_UPDATE ||
			    h.op == VSOCK_OP_CREDIT_REQUEST);
		ASSERT_EQ(h.buf_alloc, DEV_BUF_ALLOC);
		x->dev_fwd = h.fwd_cnt;
		if (h.op == VSOCK_OP_RW) {
			xfer_check(buf, h.len, x->h2g_got, 0);
			x->h2g_got += h.len;
			x->fwd += h.len;
		}
		if (h.op == VSOCK_OP_CREDIT_REQUEST || x->fwd - x->fwd_told >= 16384) {
			o = eg_hdr(&x->e->g, 1234, x->port, VSOCK_OP_CREDIT_UPDATE, 0, x->fwd);
			ASSERT_OK(eg_send(&x->e->g, &o, NULL, WAIT_MS));
			x->fwd_told = x->fwd;
		}
	}
	if (guest_sends && x->g2h_sent < XFER_TOTAL) {
		uint32_t credit = DEV_BUF_ALLOC - (uint32_t)(x->g2h_sent - x->dev_fwd);
		size_t len = MIN(MIN((size_t)(XFER_TOTAL - x->g2h_sent), sizeof(buf)),
				 (size_t)credit);

		if (len) {
			for (size_t i = 0; i < len; i++)
				buf[i] = xfer_byte(x->g2h_sent + i, 1);
			o = eg_hdr(&x->e->g, 1234, x->port, VSOCK_OP_RW, (uint32_t)len, x->fwd);
			ASSERT_OK(eg_send(&x->e->g, &o, buf, WAIT_MS));
			x->g2h_sent += len;
			x->fwd_told = x->fwd;
		}
	}
}

/* Rounds until cond or 60 s (a bound, not a timing check). */
#define XFER_UNTIL(x, hr, gr, gs, cond)                                                            \
	do {                                                                                       \
		uint64_t end_ = eg_now_ms() + 60000;                                               \
		while (!(cond)) {                                                                  \
			ASSERT_TRUE(eg_now_ms() < end_);                                           \
			xfer_round(x, hr, gr, gs);                                                 \
		}                                                                                  \
	} while (0)

/*
 * Mid-transfer both ways, with bytes in every place at once: host -> guest in the guest's RX
 * ring (delivered, not read) and in the host socket; guest -> host in the host socket and
 * queued in the device (the host stopped reading until the guest ran out of credit). Stops
 * the queues; returns their indices in idx.
 */
static void xfer_to_save_point(struct xfer *x, uint16_t idx[2])
{
	XFER_UNTIL(x, true, true, x->g2h_sent < XFER_TOTAL / 3,
		   x->h2g_got >= XFER_TOTAL / 3 && x->g2h_got >= XFER_TOTAL / 3);
	/* The host stops reading: the guest fills its socket, then the device's queue. */
	XFER_UNTIL(x, false, true, true,
		   x->g2h_sent - x->dev_fwd >= DEV_BUF_ALLOC || x->g2h_sent == XFER_TOTAL);
	/* The guest stops reading for a moment: packets wait in its RX ring. */
	for (int i = 0; i < 10; i++)
		xfer_round(x, false, false, false);
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(uvsock_dev_queue_stop(x->e->dev, q, &idx[q]));
	ASSERT_LT(x->g2h_got, x->g2h_sent);
	ASSERT_LT(x->h2g_got, x->h2g_sent);
}

/* Starts the rings of e->dev again where they stopped, and the device thread. */
static void restart_queues(struct env *e, const uint16_t idx[2], bool start_thread)
{
	struct uvsock_dev_mem_region r = eg_region(&e->g);

	ASSERT_OK(uvsock_dev_set_mem_table(e->dev, &r, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(&e->g, q);

		dq.last_avail_idx = idx[q];
		ASSERT_OK(uvsock_dev_queue_start(e->dev, q, &dq));
	}
	if (start_thread)
		ASSERT_OK(uvsock_dev_start(e->dev));
}

static void xfer_finish(struct xfer *x)
{
	XFER_UNTIL(x, true, true, true, x->h2g_got == XFER_TOTAL && x->g2h_got == XFER_TOTAL);
	ASSERT_EQ(x->h2g_sent, XFER_TOTAL);
	ASSERT_EQ(x->g2h_sent, XFER_TOTAL);
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	free(fds);
}

/*
 * With UVSOCK_TEST_DUMP_DEVREC=DIR, writes the record of a save as a seed of fuzz/fuzz-devrec.c
 * (DIR/name: a flag byte, the kind of each fd as that target makes them, the record): how the
 * committed corpus fuzz/corpus/devrec was made.
 */
static void dump_record(int memfd, const int *fds, size_t nfds, const char *name)
{
	const char *dir = getenv("UVSOCK_TEST_DUMP_DEVREC");
	uint8_t kinds[9] = { 0 };
	const uint8_t *map;
	char path[256];
	size_t len;
	FILE *f;

	if (!dir)
		return;
	ASSERT_LE(nfds, 8);
	for (size_t i = 0; i < nfds; i++) {
		int type = 0, acc = 0;

		ASSERT_OK(getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &type, &(socklen_t){ sizeof(int) }));
		ASSERT_OK(getsockopt(fds[i], SOL_SOCKET, SO_ACCEPTCONN, &acc,
				     &(socklen_t){ sizeof(int) }));
		kinds[1 + i] = acc ? (type == SOCK_STREAM ? 0 : 1)
			       : type == SOCK_DGRAM ? 2 : type == SOCK_STREAM ? 3 : 4;
	}
	ASSERT_OK(rec_map_fd(memfd, &map, &len));
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	ASSERT_TRUE(f != NULL);
	ASSERT_EQ(fwrite(kinds, 1, sizeof(kinds), f), sizeof(kinds));
	ASSERT_EQ(fwrite(map, 1, len, f), len);
	ASSERT_OK(fclose(f));
	rec_unmap(map, len);
}

/*
 * A device stopped mid-transfer is restored into a second device over the same guest memory
 * and the same host sockets, and the transfer goes on there: every byte once and in order both
 * ways, no RST, the connection open; the old device, freed, leaves the socket files to the
 * new one, whose listener takes a new host connection.
 */
TEST(save_and_restore_into_a_second_device_keeps_a_transfer)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3 };
	struct uvsock_dev_stats st = { .size = sizeof(st) }, st2 = { .size = sizeof(st2) };
	struct xfer x = { 0 };
	struct uvsock_dev *dev2;
	uint16_t idx[2];
	struct env e;
	size_t nfds;
	int memfd, *fds, fd2;
	uint32_t port2, fwd2 = 0;
	struct stat sb;

	x.e = &e;
	x.fd = env_with_host_conn(&e, &x.port);
	xfer_to_save_point(&x, idx);
	ASSERT_OK(uvsock_dev_get_stats(e.dev, &st));
	ASSERT_OK(uvsock_dev_save(e.dev, &memfd, &fds, &nfds));
	dump_record(memfd, fds, nfds, "mid-transfer");
	/* Listeners (2), the datagram socket, the connection. */
	ASSERT_EQ(nfds, 4);
	ASSERT_EQ(uvsock_dev_set_features(e.dev, e.g.features), -EBUSY);
	ASSERT_EQ(uvsock_dev_save(e.dev, &memfd, &fds, &nfds), -EALREADY);
	cfg.uds_path = e.uds;
	ASSERT_OK(uvsock_dev_restore(&cfg, memfd, fds, nfds, &dev2));
	close(memfd);
	close_all(fds, nfds);
	uvsock_dev_free(e.dev);
	e.dev = dev2;
	/* The old device left the socket files to the new one. */
	ASSERT_OK(stat(e.uds, &sb));
	ASSERT_TRUE(S_ISSOCK(sb.st_mode));
	/* Counters go on. */
	ASSERT_OK(uvsock_dev_get_stats(e.dev, &st2));
	ASSERT_EQ(st2.rx_bytes, st.rx_bytes);
	ASSERT_EQ(st2.tx_bytes, st.tx_bytes);
	ASSERT_EQ(st2.conns_total, st.conns_total);
	restart_queues(&e, idx, true);
	xfer_finish(&x);
	/* The restored listener takes new host connections. */
	fd2 = host_connects(&e, &port2);
	exchange(&e, fd2, port2, &fwd2, "new", "conn");
	ASSERT_OK(uvsock_dev_get_stats(e.dev, &st2));
	ASSERT_EQ(st2.conns_open, 2);
	close(fd2);
	close(x.fd);
	env_free(&e);
}

/* A save that is not restored: the device resumes, and the transfer goes on as if nothing. */
TEST(save_then_resume_keeps_a_transfer)
{
	struct xfer x = { 0 };
	uint16_t idx[2];
	struct env e;
	size_t nfds;
	int memfd, *fds;

	x.e = &e;
	x.fd = env_with_host_conn(&e, &x.port);
	xfer_to_save_point(&x, idx);
	ASSERT_EQ(uvsock_dev_resume(e.dev), -EINVAL);
	ASSERT_OK(uvsock_dev_save(e.dev, &memfd, &fds, &nfds));
	close(memfd);
	close_all(fds, nfds);
	ASSERT_OK(uvsock_dev_resume(e.dev));
	restart_queues(&e, idx, false);
	xfer_finish(&x);
	close(x.fd);
	env_free(&e);
}

/* The record copied into a new sealed memfd, changed by edit (resealed: the CRC holds). */
static int record_edited(int memfd, void (*edit)(uint8_t *buf, size_t len), bool reseal)
{
	const uint8_t *map;
	uint8_t *copy;
	size_t len;
	int fd;

	ASSERT_OK(rec_map_fd(memfd, &map, &len));
	copy = malloc(len);
	ASSERT_TRUE(copy != NULL);
	memcpy(copy, map, len);
	rec_unmap(map, len);
	edit(copy, len);
	if (reseal)
		rec_reseal(copy, len);
	ASSERT_OK(rec_memfd(copy, len, "edited", &fd));
	free(copy);
	return fd;
}

static void edit_version(uint8_t *buf, size_t len)
{
	(void)len;
	buf[12] = VSOCK_DEV_SAVE_VERSION + 1; /* u32 version, little-endian */
}

static void edit_last_byte(uint8_t *buf, size_t len)
{
	buf[len - 1] ^= 0x5a; /* inside the last item: a counter's value */
}

/*
 * Restores that must be refused, each leaving the saved device able to resume with nothing
 * lost: another CID, a version this library does not know, an fd missing, a record that is
 * not sealed, a corrupted checksum. The refusal creates nothing (the socket files stay the
 * saved device's).
 */
TEST(refused_restores_leave_the_saved_device_to_resume)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3 };
	struct uvsock_dev *dev2 = NULL;
	struct xfer x = { 0 };
	uint16_t idx[2];
	struct env e;
	size_t nfds;
	int memfd, *fds, bad;
	struct stat sb;

	x.e = &e;
	x.fd = env_with_host_conn(&e, &x.port);
	xfer_to_save_point(&x, idx);
	ASSERT_OK(uvsock_dev_save(e.dev, &memfd, &fds, &nfds));
	cfg.uds_path = e.uds;
	cfg.guest_cid = 4;
	ASSERT_EQ(uvsock_dev_restore(&cfg, memfd, fds, nfds, &dev2), -EBADMSG);
	cfg.guest_cid = 3;
	bad = record_edited(memfd, edit_version, true);
	ASSERT_EQ(uvsock_dev_restore(&cfg, bad, fds, nfds, &dev2), -EPROTONOSUPPORT);
	close(bad);
	ASSERT_EQ(uvsock_dev_restore(&cfg, memfd, fds, nfds - 1, &dev2), -EBADMSG);
	/* One byte changed: the checksum no longer holds. */
	bad = record_edited(memfd, edit_last_byte, false);
	ASSERT_EQ(uvsock_dev_restore(&cfg, bad, fds, nfds, &dev2), -EBADMSG);
	close(bad);
	{
		/* An unsealed memfd is refused. */
		int plain = memfd_create("plain", MFD_CLOEXEC);
		const uint8_t *map;
		size_t len;

		ASSERT_GE(plain, 0);
		ASSERT_OK(rec_map_fd(memfd, &map, &len));
		ASSERT_EQ(write(plain, map, len), (ssize_t)len);
		rec_unmap(map, len);
		ASSERT_EQ(uvsock_dev_restore(&cfg, plain, fds, nfds, &dev2), -EPERM);
		close(plain);
	}
	close(memfd);
	close_all(fds, nfds);
	ASSERT_TRUE(dev2 == NULL);
	/* The refused restores removed nothing. */
	ASSERT_OK(stat(e.uds, &sb));
	ASSERT_OK(uvsock_dev_resume(e.dev));
	restart_queues(&e, idx, false);
	xfer_finish(&x);
	close(x.fd);
	env_free(&e);
}

/* The host program on sfd sends "<port>\n<msg>" to the VM's datagram socket. */
static void dgram_to_guest(struct env *e, int sfd, uint32_t port, const char *msg)
{
	char path[160], buf[128];
	struct sockaddr_un sa;
	int n;

	snprintf(path, sizeof(path), "%s.dgram", e->uds);
	sa = hs_addr(path);
	n = snprintf(buf, sizeof(buf), "%u\n%s", port, msg);
	ASSERT_EQ(sendto(sfd, buf, (size_t)n, 0, (struct sockaddr *)&sa, sizeof(sa)), n);
}

/* The guest gets a datagram for port with msg; returns the host port it came from. */
static uint32_t guest_gets_dgram(struct env *e, uint32_t port, const char *msg)
{
	struct vsock_hdr h;
	char buf[128];

	recv_pkt(&e->g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.type, VSOCK_TYPE_DGRAM);
	ASSERT_EQ(h.dst_port, port);
	ASSERT_EQ(h.len, strlen(msg));
	ASSERT_MEMEQ(buf, msg, h.len);
	return h.src_port;
}

/* The guest's port 7 sends msg to host port hp; the host program on sfd reads "7\n<msg>". */
static void dgram_reply(struct env *e, int sfd, uint32_t hp, const char *msg)
{
	struct vsock_hdr o = eg_hdr(&e->g, 7, hp, VSOCK_OP_RW, (uint32_t)strlen(msg), 0);
	char want[64], buf[128];
	ssize_t n;

	o.type = VSOCK_TYPE_DGRAM;
	o.buf_alloc = o.fwd_cnt = 0;
	ASSERT_OK(eg_send(&e->g, &o, msg, WAIT_MS));
	snprintf(want, sizeof(want), "7\n%s", msg);
	ASSERT_TRUE(poll(&(struct pollfd){ .fd = sfd, .events = POLLIN }, 1, WAIT_MS) == 1);
	n = recv(sfd, buf, sizeof(buf), 0);
	ASSERT_EQ(n, (ssize_t)strlen(want));
	ASSERT_MEMEQ(buf, want, (size_t)n);
}

/*
 * Every other kind of host-side state across a restore: a guest-initiated connection, a host
 * program halfway through its CONNECT line, a datagram sender the device gave a port to (its
 * replies still reach it), and a datagram sent while the device was frozen (delivered by the
 * restored device). The old device's socket files stay, the new one removes them at its end.
 */
TEST(save_and_restore_keeps_guest_connections_handshakes_and_datagrams)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 5 };
	struct vsock_dev_stats ds;
	struct vsock_hdr h, o;
	char path[200], peer[200], line[64], buf[64];
	uint16_t idx[2];
	struct env e;
	struct uvsock_dev *dev2;
	int lfd, gfd, hfd, sfd, memfd, *fds;
	size_t nfds, n = 0;
	uint32_t hp, hp2, port = 0;

	env_new(&e, 5);
	ASSERT_OK(uvsock_dev_start(e.dev));
	env_configure(&e);
	gfd = guest_connects(&e, path, sizeof(path), &lfd);
	snprintf(peer, sizeof(peer), "%s/peer.dgram", e.dir);
	sfd = unix_bound(peer, SOCK_DGRAM);
	dgram_to_guest(&e, sfd, 7, "before");
	hp = guest_gets_dgram(&e, 7, "before");
	ASSERT_GE(hp, 1u << 30);
	hfd = unix_connect(e.uds);
	ASSERT_EQ(write(hfd, "CONNE", 5), 5);
	WAIT_FOR((vsock_dev_get_stats(vsock_dev_of(e.dev), &ds), ds.host_conns_accepted == 1),
		 WAIT_MS);
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(uvsock_dev_queue_stop(e.dev, q, &idx[q]));
	ASSERT_OK(uvsock_dev_save(e.dev, &memfd, &fds, &nfds));
	dump_record(memfd, fds, nfds, "handshake-guest-conn-dgram");
	/* Listeners (2), the datagram socket, the guest's connection, the handshake. */
	ASSERT_EQ(nfds, 5);
	/* While frozen: the kernel keeps a datagram and the rest of the line. */
	dgram_to_guest(&e, sfd, 7, "frozen");
	ASSERT_EQ(write(hfd, "CT 1234\n", 8), 8);
	cfg.uds_path = e.uds;
	ASSERT_OK(uvsock_dev_restore(&cfg, memfd, fds, nfds, &dev2));
	close(memfd);
	close_all(fds, nfds);
	uvsock_dev_free(e.dev);
	e.dev = dev2;
	restart_queues(&e, idx, true);
	/* The handshake completes on the restored device, the datagram comes, in any order. */
	for (int got = 0; got != 3;) {
		recv_pkt(&e.g, &h, buf, sizeof(buf));
		if (h.type == VSOCK_TYPE_DGRAM) {
			ASSERT_EQ(h.src_port, hp);
			ASSERT_EQ(h.len, 6);
			ASSERT_MEMEQ(buf, "frozen", 6);
			got |= 1;
			continue;
		}
		ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
		ASSERT_EQ(h.dst_port, 1234);
		port = h.src_port;
		o = eg_hdr(&e.g, 1234, port, VSOCK_OP_RESPONSE, 0, 0);
		ASSERT_OK(eg_send(&e.g, &o, NULL, WAIT_MS));
		got |= 2;
	}
	while (n < sizeof(line) - 1 && read_full(hfd, line + n, 1) == 1 && line[n++] != '\n')
		;
	line[n] = '\0';
	ASSERT_EQ(sscanf(line, "OK %u\n", &hp2), 1);
	ASSERT_EQ(hp2, port);
	/* The sender's port is remembered: the guest's reply reaches it. */
	dgram_reply(&e, sfd, hp, "reply");
	/* The guest's connection to host port 5000 goes on both ways. */
	o = eg_hdr(&e.g, 40000, 5000, VSOCK_OP_RW, 5, 4);
	ASSERT_OK(eg_send(&e.g, &o, "after", WAIT_MS));
	ASSERT_EQ(read_full(gfd, buf, 5), 5);
	ASSERT_MEMEQ(buf, "after", 5);
	ASSERT_EQ(write(gfd, "back", 4), 4);
	recv_pkt(&e.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_RW);
	ASSERT_EQ(h.dst_port, 40000);
	ASSERT_EQ(h.len, 4);
	ASSERT_MEMEQ(buf, "back", 4);
	close(hfd);
	close(gfd);
	close(lfd);
	close(sfd);
	unlink(path);
	unlink(peer);
	env_free(&e);
}

/*
 * A linked device is not saved alone (its siblings would stay behind: a group moves as one, as
 * uvsockd's upgrade moves it): -EOPNOTSUPP, and it goes on as before; a queue that runs: -EBUSY.
 */
TEST(save_refuses_a_linked_device_and_running_queues)
{
	struct vsock_hdr h, o;
	struct env a, b;
	uint16_t idx[2];
	char buf[64];
	size_t nfds;
	int memfd, *fds;

	env_new(&a, 3);
	env_new(&b, 4);
	ASSERT_OK(uvsock_dev_link(a.dev, b.dev));
	env_configure(&a);
	env_configure(&b);
	ASSERT_OK(uvsock_dev_start(a.dev));
	ASSERT_OK(uvsock_dev_start(b.dev));
	ASSERT_EQ(uvsock_dev_save(a.dev, &memfd, &fds, &nfds), -EBUSY);
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(uvsock_dev_queue_stop(a.dev, q, &idx[q]));
	ASSERT_EQ(uvsock_dev_save(a.dev, &memfd, &fds, &nfds), -EOPNOTSUPP);
	ASSERT_EQ(uvsock_dev_resume(a.dev), -EINVAL); /* not saved: nothing to resume */
	restart_queues(&a, idx, false);
	o = eg_hdr(&a.g, 40000, 77, VSOCK_OP_REQUEST, 0, 0);
	o.dst_cid = 4;
	ASSERT_OK(eg_send(&a.g, &o, NULL, WAIT_MS));
	recv_pkt(&b.g, &h, buf, sizeof(buf));
	ASSERT_EQ(h.op, VSOCK_OP_REQUEST);
	ASSERT_EQ(h.src_cid, 3);
	env_free(&a);
	env_free(&b);
}

TEST_MAIN()
