/* SPDX-License-Identifier: MIT */
/*
 * The guest role against a scripted, misbehaving back-end: a real vhost-user back-end
 * (src/vhost_user/backend.h) serves the control messages on a thread, and the test writes the
 * device side of the rings by hand (src/vring/vring.h) to return malformed RX buffers: a used
 * length shorter than a header, a header claiming more payload than was written, a used id out
 * of range, a used length beyond the buffer. The guest must drop and count the first two and keep
 * working (a valid connection request afterwards is answered), and must treat the last two as a
 * broken device: every socket reset, connect() failing at once, no crash, no hang.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "guestside.h"
#undef VMADDR_CID_HYPERVISOR
#undef VMADDR_CID_LOCAL
#undef VMADDR_CID_HOST
#undef VMADDR_CID_ANY
#undef VMADDR_PORT_ANY
#include "test.h"
#include "vhost_user/backend.h"
#include "vring/vring.h"
#include "vsock/hdr.h"

struct evil {
	char dir[40], path[64];
	int lfd, stop_fd;
	pthread_t th;
	pthread_mutex_t mu;
	struct vhu_vring_info info[2];
	atomic_int started;            /* bit per started ring */
	uint64_t features;             /* offered (VHU_BACKEND_OPTIONAL_FEATURES subset) */
	struct vring_dev_queue q[2];   /* driven by the test thread */
};

static int ev_start(void *opaque, unsigned q, const struct vhu_vring_info *info)
{
	struct evil *e = opaque;

	pthread_mutex_lock(&e->mu);
	e->info[q] = *info;
	pthread_mutex_unlock(&e->mu);
	atomic_fetch_or(&e->started, 1 << q);
	return 0;
}

static uint16_t ev_stop(void *opaque, unsigned q)
{
	struct evil *e = opaque;

	atomic_fetch_and(&e->started, ~(1 << q));
	return 0;
}

static const struct vhu_backend_ops evil_ops = {
	.queue_start = ev_start,
	.queue_stop = ev_stop,
};

static void *evil_main(void *arg)
{
	struct evil *e = arg;
	struct vhu_backend_config cfg;
	struct vhu_backend *b = NULL;
	int fd = -1;

	vhu_backend_config_init(&cfg);
	cfg.guest_cid = 3;
	cfg.features = e->features;
	for (;;) {
		struct pollfd p[2] = { { .fd = e->stop_fd, .events = POLLIN },
				       { .fd = b ? vhu_backend_fd(b) : e->lfd, .events = POLLIN } };

		if (poll(p, 2, 100) < 0)
			break;
		if (p[0].revents)
			break;
		if (!(p[1].revents & (POLLIN | POLLHUP)))
			continue;
		if (!b) {
			fd = accept4(e->lfd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0 && vhu_backend_new(fd, &cfg, &evil_ops, e, &b) < 0)
				close(fd);
			continue;
		}
		if (vhu_backend_process(b) < 0) {
			/* Under mu: see evil_signal. */
			pthread_mutex_lock(&e->mu);
			vhu_backend_free(b);
			pthread_mutex_unlock(&e->mu);
			b = NULL;
		}
	}
	/* Under mu too: the test may stop us before the guest's disconnect was processed. */
	pthread_mutex_lock(&e->mu);
	vhu_backend_free(b);
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

static struct uvsock_ctx *evil_start_features(struct evil *e, uint64_t features)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct uvsock_ctx *g;

	memset(e, 0, sizeof(*e));
	e->features = features;
	pthread_mutex_init(&e->mu, NULL);
	snprintf(e->dir, sizeof(e->dir), "/tmp/uvsock-evil-XXXXXX");
	ASSERT_TRUE(mkdtemp(e->dir) != NULL);
	snprintf(e->path, sizeof(e->path), "%s/vm.sock", e->dir);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", e->path);
	e->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(e->lfd, 0);
	ASSERT_EQ(bind(e->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(listen(e->lfd, 4), 0);
	e->stop_fd = eventfd(0, EFD_CLOEXEC);
	ASSERT_GE(e->stop_fd, 0);
	ASSERT_EQ(pthread_create(&e->th, NULL, evil_main, e), 0);
	g = uvsock_ctx_new_guest(e->path, NULL);
	if (!g)
		test_fail(__FILE__, __LINE__, "uvsock_ctx_new_guest: %s", strerror(errno));
	ASSERT_WAIT_FOR(atomic_load(&e->started) == 3, WAIT_MS);
	pthread_mutex_lock(&e->mu);
	for (unsigned q = 0; q < 2; q++) {
		struct vring_dev_config c = {
			.mem = e->info[q].mem,
			.num = e->info[q].num,
			.addr_kind = VRING_ADDR_HOST,
			.desc_addr = (uint64_t)(uintptr_t)e->info[q].desc,
			.avail_addr = (uint64_t)(uintptr_t)e->info[q].avail,
			.used_addr = (uint64_t)(uintptr_t)e->info[q].used,
			.features = e->info[q].features,
			.last_avail_idx = e->info[q].last_avail_idx,
		};

		ASSERT_OK(vring_dev_init(&e->q[q], &c));
	}
	pthread_mutex_unlock(&e->mu);
	return g;
}

static struct uvsock_ctx *evil_start(struct evil *e)
{
	/* Split rings: the cases below write split used elements by hand (the packed ring's
	 * hostile-device rules are in tests/unit/vring/test-packed-pair.c). */
	return evil_start_features(e, VHU_BACKEND_DEFAULT_FEATURES & ~VHU_BIT(VHU_F_RING_PACKED));
}

static void evil_stop(struct evil *e, struct uvsock_ctx *g)
{
	uint64_t one = 1;

	uvsock_ctx_free(g);
	ASSERT_EQ(write(e->stop_fd, &one, 8), 8);
	pthread_join(e->th, NULL);
	close(e->stop_fd);
	close(e->lfd);
	unlink(e->path);
	rmdir(e->dir);
	pthread_mutex_destroy(&e->mu);
}

/*
 * Ends each ring operation of the test thread. Taking mu afterwards orders the operation before
 * a later vhu_backend_free on the back-end thread (which unmaps the rings and closes call_fd,
 * under mu) for ThreadSanitizer too: that free follows the guest's disconnect, an order through
 * the socket that TSan does not see.
 */
static void evil_signal(struct evil *e, unsigned q)
{
	uint64_t one = 1;

	ASSERT_EQ(write(e->info[q].call_fd, &one, 8), 8);
	pthread_mutex_lock(&e->mu);
	pthread_mutex_unlock(&e->mu);
}

/* Pops an RX buffer, writes h (and len_written - 44 payload bytes of 'p') and pushes it with
 * used length len_written. */
static void evil_rx(struct evil *e, const struct vsock_hdr *h, uint32_t len_written)
{
	struct iovec in[4];
	struct vring_chain ch;
	uint8_t *p;

	ASSERT_OK(vring_dev_pop(&e->q[0], NULL, 0, in, 4, &ch));
	ASSERT_EQ(ch.in_num, 1);
	ASSERT_GE(in[0].iov_len, VSOCK_HDR_SIZE + 64);
	p = in[0].iov_base;
	vsock_hdr_encode(h, p);
	if (len_written > VSOCK_HDR_SIZE)
		memset(p + VSOCK_HDR_SIZE, 'p', len_written - VSOCK_HDR_SIZE);
	ASSERT_OK(vring_dev_push(&e->q[0], ch.head, len_written));
	evil_signal(e, 0);
}

/* Waits (bounded) for the guest's next TX packet and returns its header. */
static struct vsock_hdr evil_tx(struct evil *e)
{
	struct iovec out[4];
	struct vring_chain ch;
	struct vsock_hdr h;
	int r;

	ASSERT_WAIT_FOR((r = vring_dev_pop(&e->q[1], out, 4, NULL, 0, &ch)) != -EAGAIN, WAIT_MS);
	ASSERT_OK(r);
	ASSERT_GE(out[0].iov_len, VSOCK_HDR_SIZE);
	vsock_hdr_decode(out[0].iov_base, &h);
	ASSERT_OK(vring_dev_push(&e->q[1], ch.head, 0));
	evil_signal(e, 1);
	return h;
}

/* Next TX packet with the given op, skipping others (SHUTDOWN, CREDIT_UPDATE...). */
static struct vsock_hdr evil_tx_op(struct evil *e, unsigned op)
{
	for (int i = 0; i < 16; i++) {
		struct vsock_hdr h = evil_tx(e);

		if (h.op == op)
			return h;
	}
	test_fail(__FILE__, __LINE__, "no TX packet with op %u", op);
}

static struct vsock_hdr request(uint32_t dport)
{
	return (struct vsock_hdr){
		.src_cid = 2, .dst_cid = 3, .src_port = 1234, .dst_port = dport,
		.type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_REQUEST, .buf_alloc = 65536,
	};
}

/* The guest's stats now (asserted to be readable). */
static struct uvsock_guest_stats guest_stats(struct uvsock_ctx *g)
{
	struct uvsock_guest_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	return st;
}

/* Waits (up to WAIT_MS) until the guest's counter `field` reaches want; its value then. */
#define WAIT_STAT(g, field, want)                                                                  \
	({                                                                                         \
		uint64_t v_, want_ = (want);                                                       \
		WAIT_FOR((v_ = guest_stats(g).field) >= want_, WAIT_MS);                           \
		v_;                                                                                \
	})

TEST(malformed_rx_buffers_are_dropped_and_the_guest_keeps_working)
{
	struct evil e;
	struct uvsock_ctx *g = evil_start(&e);
	struct vsock_hdr h = request(6000), r;
	int ls = g_listen(g, SOCK_STREAM, 6000), fd;

	/* Shorter than a header. */
	evil_rx(&e, &h, 10);
	ASSERT_EQ(WAIT_STAT(g, rx_dropped, 1), 1);
	/* A header claiming more payload than was written. */
	h.op = VSOCK_OP_RW;
	h.len = 1000;
	evil_rx(&e, &h, VSOCK_HDR_SIZE + 10);
	ASSERT_EQ(WAIT_STAT(g, rx_dropped, 2), 2);
	/* Zero used length. */
	evil_rx(&e, &h, 0);
	ASSERT_EQ(WAIT_STAT(g, rx_dropped, 3), 3);

	/* The guest still works: a valid REQUEST is answered with a RESPONSE and accepted. */
	h = request(6000);
	evil_rx(&e, &h, VSOCK_HDR_SIZE);
	r = evil_tx(&e);
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	ASSERT_EQ(r.src_cid, 3);
	ASSERT_EQ(r.dst_cid, 2);
	ASSERT_EQ(r.dst_port, 1234);
	ASSERT_EQ(r.src_port, 6000);
	ASSERT_GT(r.buf_alloc, 0);
	fd = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(fd, 0);
	/* ... and data in a valid RW arrives. */
	h.op = VSOCK_OP_RW;
	h.len = 5;
	evil_rx(&e, &h, VSOCK_HDR_SIZE + 5);
	{
		char buf[8];

		g_set_timeouts(fd, WAIT_MS);
		ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 5);
		ASSERT_MEMEQ(buf, "ppppp", 5);
	}
	ASSERT_EQ(WAIT_STAT(g, backend_lost, 0), 0);
	uvsock_close(fd);
	uvsock_close(ls);
	evil_stop(&e, g);
}

/* Writes a raw used element (id, len) and publishes it: what a broken device might do. */
static void evil_raw_used(struct evil *e, uint32_t id, uint32_t len)
{
	struct vring_used_le *u = e->info[0].used;
	uint16_t idx = le16toh(u->idx);

	u->ring[idx % e->info[0].num].id = htole32(id);
	u->ring[idx % e->info[0].num].len = htole32(len);
	/* Release: the element above is written before the index that publishes it. */
	vring_store16_release(&u->idx, (uint16_t)(idx + 1));
	evil_signal(e, 0);
}

static void broken_device_case(uint32_t id, uint32_t len)
{
	struct evil e;
	struct uvsock_ctx *g = evil_start(&e);
	struct vsock_hdr h = request(6000), r;
	int ls = g_listen(g, SOCK_STREAM, 6000), fd;
	uint64_t t0;

	/* One established connection first. */
	evil_rx(&e, &h, VSOCK_HDR_SIZE);
	r = evil_tx(&e);
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	fd = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(fd, 0);

	evil_raw_used(&e, id == UINT32_MAX ? e.info[0].num + 7 : id, len);
	ASSERT_EQ(WAIT_STAT(g, backend_lost, 1), 1);
	ASSERT_NE(g_wait_events(fd, POLLERR | POLLHUP, WAIT_MS), 0);
	t0 = test_now_ms();
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 5000), -1);
	ASSERT_EQ(errno, ENETUNREACH);
	ASSERT_LT(test_now_ms() - t0, 1000);
	uvsock_close(fd);
	uvsock_close(ls);
	evil_stop(&e, g);
}

TEST(used_id_out_of_range_breaks_the_device_and_resets_sockets)
{
	broken_device_case(UINT32_MAX, VSOCK_HDR_SIZE);
}

TEST(used_len_beyond_the_buffer_breaks_the_device)
{
	/* Head 0 is an RX buffer the guest posted; no buffer is larger than 64 KiB + 44. */
	broken_device_case(0, 1u << 20);
}

TEST(unposted_used_id_breaks_the_device)
{
	struct evil e;
	struct uvsock_ctx *g = evil_start(&e);
	struct iovec in[4];
	struct vring_chain ch;

	/* Return the same buffer twice: the second time it is no longer in flight. */
	ASSERT_OK(vring_dev_pop(&e.q[0], NULL, 0, in, 4, &ch));
	evil_raw_used(&e, ch.head, 0);
	ASSERT_GE(WAIT_STAT(g, rx_dropped, 1), 1);
	evil_raw_used(&e, ch.head, 0);
	ASSERT_EQ(WAIT_STAT(g, backend_lost, 1), 1);
	evil_stop(&e, g);
}

/* A back-end offering neither EVENT_IDX nor INDIRECT_DESC nor SEQPACKET: the driver uses the
 * flag-based notification scheme, and SEQPACKET sockets are refused as on Linux. */
TEST(minimal_backend_without_event_idx_or_seqpacket)
{
	struct evil e;
	struct uvsock_ctx *g = evil_start_features(&e, 0);
	struct vsock_hdr h = request(6000), r;
	struct sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				 .svm_port = 6001 };
	int ls = g_listen(g, SOCK_STREAM, 6000), fd, q;
	char buf[8];

	ASSERT_EQ(e.info[0].features & (VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC) |
					VHU_BIT(VHU_VSOCK_F_SEQPACKET)), 0);
	for (int i = 0; i < 3; i++) {
		h = request(6000);
		h.src_port = 1234 + (uint32_t)i;
		evil_rx(&e, &h, VSOCK_HDR_SIZE);
		r = evil_tx_op(&e, VSOCK_OP_RESPONSE);
		ASSERT_EQ(r.dst_port, h.src_port);
		fd = uvsock_accept(ls, NULL, NULL);
		ASSERT_GE(fd, 0);
		h.op = VSOCK_OP_RW;
		h.len = 3;
		evil_rx(&e, &h, VSOCK_HDR_SIZE + 3);
		g_set_timeouts(fd, WAIT_MS);
		ASSERT_EQ(uvsock_recv(fd, buf, sizeof(buf), 0), 3);
		ASSERT_EQ(uvsock_send(fd, "abc", 3, 0), 3);
		r = evil_tx_op(&e, VSOCK_OP_RW);
		ASSERT_EQ(r.len, 3);
		uvsock_close(fd);
	}
	q = uvsock_socket(g, SOCK_SEQPACKET, 0);
	ASSERT_GE(q, 0);
	ASSERT_EQ(uvsock_bind(q, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(uvsock_listen(q, 1), -1);
	ASSERT_EQ(errno, EPROTONOSUPPORT);
	uvsock_close(q);
	uvsock_close(ls);
	evil_stop(&e, g);
}

TEST_MAIN()
