/* SPDX-License-Identifier: MIT */
/*
 * The guest role's side of VIRTIO_VSOCK_F_DGRAM (bit 3): negotiated when the back-end offers it
 * and the caller did not turn it off (UVSOCK_GUEST_NO_DGRAM), and then every RX buffer posted
 * is one 64 KiB buffer (header + the largest datagram) whatever the adaptive size or the
 * no-pkt64k switch would choose, since a datagram is delivered only whole. Without it, SOCK_DGRAM
 * sockets fail with ENODEV and RX sizing is unchanged. The back-end is a real vhost-user
 * back-end (src/vhost_user/backend.h) on a thread that serves the control messages and leaves
 * the rings alone: what is checked is what the guest negotiated and posted.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "test.h"
#include "util/tune.h"
#include "vhost_user/backend.h"

#define WAIT_MS 5000

/* A back-end that only negotiates: rings are started and stopped, never served. */
struct quiet_be {
	char dir[40], path[64];
	int lfd, stop_fd;
	uint64_t offer;
	atomic_uint started; /* bit per started ring */
	atomic_ullong acked; /* features the front-end acked (ring 0's) */
	pthread_t th;
};

static int qb_start(void *opaque, unsigned q, const struct vhu_vring_info *info)
{
	struct quiet_be *b = opaque;

	if (q == 0)
		atomic_store(&b->acked, info->features);
	atomic_fetch_or(&b->started, 1u << q);
	return 0;
}

static uint16_t qb_stop(void *opaque, unsigned q)
{
	struct quiet_be *b = opaque;

	atomic_fetch_and(&b->started, ~(1u << q));
	return 0;
}

static const struct vhu_backend_ops qb_ops = { .queue_start = qb_start, .queue_stop = qb_stop };

/* Serves one front-end at a time until stop_fd is signalled. */
static void *qb_main(void *arg)
{
	struct quiet_be *b = arg;
	struct vhu_backend_config cfg;
	struct vhu_backend *be = NULL;
	bool stop = false;

	vhu_backend_config_init(&cfg);
	cfg.guest_cid = 7;
	cfg.features = b->offer;
	while (!stop) {
		struct pollfd p[2] = { { .fd = b->stop_fd, .events = POLLIN },
			               { .fd = be ? vhu_backend_fd(be) : b->lfd,
			                 .events = POLLIN } };
		int fd;

		if (poll(p, 2, 100) < 0 || p[0].revents) {
			stop = true;
		} else if (!be && (p[1].revents & POLLIN)) {
			fd = accept4(b->lfd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0 && vhu_backend_new(fd, &cfg, &qb_ops, b, &be) < 0)
				close(fd);
		} else if (be && (p[1].revents & (POLLIN | POLLHUP)) &&
		           vhu_backend_process(be) < 0) {
			vhu_backend_free(be);
			be = NULL;
		}
	}
	vhu_backend_free(be);
	return NULL;
}

static void qb_open(struct quiet_be *b, uint64_t offer)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	memset(b, 0, sizeof(*b));
	b->offer = offer;
	snprintf(b->dir, sizeof(b->dir), "/tmp/uvsock-dgdrv-XXXXXX");
	ASSERT_TRUE(mkdtemp(b->dir) != NULL);
	snprintf(b->path, sizeof(b->path), "%s/vm.sock", b->dir);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", b->path);
	b->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ASSERT_GE(b->lfd, 0);
	ASSERT_EQ(bind(b->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ASSERT_EQ(listen(b->lfd, 4), 0);
	b->stop_fd = eventfd(0, EFD_CLOEXEC);
	ASSERT_GE(b->stop_fd, 0);
	ASSERT_EQ(pthread_create(&b->th, NULL, qb_main, b), 0);
}

static void qb_close(struct quiet_be *b)
{
	uint64_t one = 1;

	ASSERT_EQ(write(b->stop_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
	pthread_join(b->th, NULL);
	close(b->stop_fd);
	close(b->lfd);
	unlink(b->path);
	ASSERT_EQ(rmdir(b->dir), 0);
}

/* A guest on b with flags; waits until both rings run and the RX buffers are posted. */
static struct uvsock_ctx *guest_on(struct quiet_be *b, unsigned flags)
{
	struct uvsock_guest_opts o = { .size = sizeof(o), .flags = flags };
	struct uvsock_ctx *g = uvsock_ctx_new_guest(b->path, &o);
	struct uvsock_guest_stats st = { .size = sizeof(st) };

	if (!g)
		test_fail(__FILE__, __LINE__, "uvsock_ctx_new_guest: %s", strerror(errno));
	ASSERT_WAIT_FOR(atomic_load(&b->started) == 3u, WAIT_MS);
	ASSERT_WAIT_FOR(uvsock_ctx_guest_get_stats(g, &st) == 0 && st.rx_posted > 0, WAIT_MS);
	return g;
}

static uint64_t posted_len(struct uvsock_ctx *g)
{
	struct uvsock_guest_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_ctx_guest_get_stats(g, &st), 0);
	return st.rx_buf_len;
}

/* What a SOCK_DGRAM socket of g gives: its fd (closed here) or -errno. */
static int dgram_socket(struct uvsock_ctx *g)
{
	int fd = uvsock_socket(g, SOCK_DGRAM, 0);

	if (fd < 0)
		return -errno;
	ASSERT_EQ(uvsock_close(fd), 0);
	return 0;
}

#define DGRAM_BIT VHU_BIT(VHU_VSOCK_F_DGRAM)

TEST(offered_dgram_is_negotiated_with_64k_rx_buffers)
{
	struct quiet_be b;
	struct uvsock_ctx *g;

	qb_open(&b, VHU_BACKEND_DEFAULT_FEATURES | DGRAM_BIT);
	g = guest_on(&b, 0);
	ASSERT_TRUE(atomic_load(&b.acked) & DGRAM_BIT);
	ASSERT_EQ(posted_len(g), 65536);
	ASSERT_EQ(dgram_socket(g), 0);
	uvsock_ctx_free(g);
	qb_close(&b);
}

/* A back-end offering `offer`, a guest with `flags`: no datagrams, adaptive RX, ENODEV. */
static void without_dgram(uint64_t offer, unsigned flags)
{
	struct quiet_be b;
	struct uvsock_ctx *g;

	qb_open(&b, offer);
	g = guest_on(&b, flags);
	ASSERT_FALSE(atomic_load(&b.acked) & DGRAM_BIT);
	/* Linux's 4 KiB payload plus the header, rounded to the 64-byte line. */
	ASSERT_EQ(posted_len(g), 4160);
	ASSERT_EQ(dgram_socket(g), -ENODEV);
	uvsock_ctx_free(g);
	qb_close(&b);
}

TEST(no_dgram_flag_keeps_bit_3_off_and_adaptive_rx)
{
	without_dgram(VHU_BACKEND_DEFAULT_FEATURES | DGRAM_BIT, UVSOCK_GUEST_NO_DGRAM);
}

TEST(backend_without_dgram_gives_enodev)
{
	without_dgram(VHU_BACKEND_DEFAULT_FEATURES, 0);
}

/* no-pkt64k caps stream RX buffers at 4 KiB; datagrams still need (and get) whole 64 KiB. */
TEST(dgram_rx_buffers_ignore_the_4k_cap)
{
	struct quiet_be b;
	struct uvsock_ctx *g;

	ASSERT_EQ(tune_set("no-pkt64k", NULL, 0), 0);
	qb_open(&b, VHU_BACKEND_DEFAULT_FEATURES | DGRAM_BIT);
	g = guest_on(&b, 0);
	ASSERT_EQ(posted_len(g), 65536);
	uvsock_ctx_free(g);
	qb_close(&b);
	ASSERT_EQ(tune_set("pkt64k", NULL, 0), 0);
}

TEST_MAIN()
