/* SPDX-License-Identifier: MIT */
/*
 * Dirty logging end to end (docs/vhost-user.md, "Dirty logging and migration"): our front-end,
 * driven by hand as QEMU drives a migration (SET_LOG_BASE, SET_FEATURES with LOG_ALL,
 * SET_VRING_ADDR with VHOST_VRING_F_LOG while the rings run), against a real device on its own
 * thread. The guest asks the host for a connection nobody listens to; the device answers with
 * an RST in an RX buffer of two pages. With logging on exactly the page of the header and the
 * pages of the used rings it wrote are marked; the buffer's second page is not, nor is anything
 * else. With logging off nothing is marked. A log too small for the guest memory is refused.
 */
#include <unistd.h>

#include "device/vsock_dev.h"
#include "tdev.h"
#include "test.h"
#include "util/fdcheck.h"
#include "vhost_user/frontend.h"
#include "vring/vring.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define WAIT_MS 3000
#define PAGE 4096u

struct lguest {
	struct vhu_front *f;
	struct vring_drv *rx, *tx;
	uint8_t *pkt, *rxbuf;
	uint64_t pkt_gpa, rxbuf_gpa;
};

static int mark_rx, mark_tx;

static void lg_open(struct lguest *g, const char *sock)
{
	struct vhu_front_config cfg;
	const struct vhu_front_ring *rr, *tr;
	uint64_t feats;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 4u << 20;
	ASSERT_OK(vhu_front_connect(sock, &cfg, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	ASSERT_OK(vhu_front_alloc(g->f, 64, 64, (void **)&g->pkt, &g->pkt_gpa));
	/* Two whole pages: the RST's header lands in the first one only. */
	ASSERT_OK(vhu_front_alloc(g->f, 2 * PAGE, PAGE, (void **)&g->rxbuf, &g->rxbuf_gpa));
	ASSERT_OK(vhu_front_start(g->f));
	rr = vhu_front_ring(g->f, 0);
	tr = vhu_front_ring(g->f, 1);
	feats = vhu_front_features(g->f);
	ASSERT_OK(vring_drv_new(rr->num, rr->desc, rr->avail, rr->used, feats, &g->rx));
	ASSERT_OK(vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, feats, &g->tx));
}

static void lg_close(struct lguest *g)
{
	vhu_front_free(g->f);
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	*g = (struct lguest){ 0 };
}

/* Posts the RX buffer, sends a REQUEST to host port 1234 (no listener), waits for the RST. */
static void lg_request_refused(struct lguest *g, uint16_t src_port)
{
	struct vsock_hdr h = { .src_cid = vhu_front_guest_cid(g->f), .dst_cid = 2,
			       .src_port = src_port, .dst_port = 1234, .type = VSOCK_TYPE_STREAM,
			       .op = VSOCK_OP_REQUEST, .buf_alloc = 65536 };
	struct vring_drv_buf rb = { g->rxbuf_gpa, 2 * PAGE, true };
	struct vring_drv_buf tb = { g->pkt_gpa, VSOCK_HDR_SIZE, false };
	struct vsock_hdr got;
	uint32_t len;
	void *ck;

	ASSERT_GE(vring_drv_add(g->rx, &rb, 1, &mark_rx), 0);
	vring_drv_publish(g->rx);
	ASSERT_EQ(eventfd_signal_nb(vhu_front_ring(g->f, 0)->kick_fd), 0);
	vsock_hdr_encode(&h, g->pkt);
	ASSERT_GE(vring_drv_add(g->tx, &tb, 1, &mark_tx), 0);
	vring_drv_publish(g->tx);
	ASSERT_EQ(eventfd_signal_nb(vhu_front_ring(g->f, 1)->kick_fd), 0);
	ASSERT_WAIT_FOR(vring_drv_get_used(g->rx, &len, &ck) == 0, WAIT_MS);
	ASSERT_EQ(len, VSOCK_HDR_SIZE);
	vsock_hdr_decode(g->rxbuf, &got);
	ASSERT_EQ(got.op, VSOCK_OP_RST);
	ASSERT_WAIT_FOR(vring_drv_get_used(g->tx, &len, &ck) == 0, WAIT_MS);
}

static bool marked(const uint8_t *log, uint64_t gpa)
{
	uint64_t p = gpa / PAGE;

	return log[p / 8] & (1u << (p % 8));
}

/* Pages of [gpa, gpa + len). */
static bool in_range(uint64_t page, uint64_t gpa, uint64_t len)
{
	return page >= gpa / PAGE && page <= (gpa + len - 1) / PAGE;
}

TEST(rx_writes_mark_exactly_their_pages_while_logging_is_on)
{
	struct tdev t;
	struct lguest g;
	const uint8_t *log;
	uint64_t size, n = 0;
	const struct vhu_front_ring *rr, *tr;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	lg_open(&g, t.sock);
	rr = vhu_front_ring(g.f, 0);
	tr = vhu_front_ring(g.f, 1);

	/* Logging off: a log is there, LOG_ALL is not acked; nothing is marked. */
	ASSERT_OK(vhu_front_set_log_base(g.f, 0));
	log = vhu_front_log(g.f, &size);
	ASSERT_EQ_U64(size, vhu_front_log_size_needed(g.f));
	lg_request_refused(&g, 1024);
	for (uint64_t i = 0; i < size; i++)
		ASSERT_EQ(log[i], 0);

	/* On, as QEMU does at migration start: the rings keep running. */
	ASSERT_OK(vhu_front_set_logging(g.f, true));
	lg_request_refused(&g, 1025);
	ASSERT_TRUE(marked(log, g.rxbuf_gpa));          /* the RST's header */
	ASSERT_FALSE(marked(log, g.rxbuf_gpa + PAGE));  /* the buffer's untouched second page */
	ASSERT_TRUE(marked(log, rr->used_gpa + 2));     /* RX used->idx */
	ASSERT_TRUE(marked(log, tr->used_gpa + 2));     /* TX used->idx */
	/* Nothing else: every marked page is the header's or part of a used ring. */
	for (uint64_t p = 0; p < size * 8; p++) {
		if (!(log[p / 8] & (1u << (p % 8))))
			continue;
		n++;
		ASSERT_TRUE(p == g.rxbuf_gpa / PAGE ||
			    in_range(p, rr->used_gpa, vring_used_size(rr->num)) ||
			    in_range(p, tr->used_gpa, vring_used_size(tr->num)));
	}
	ASSERT_GE(n, 2);

	/* Off again: the guest's later writes are not logged. */
	ASSERT_OK(vhu_front_set_logging(g.f, false));
	memset((uint8_t *)log, 0, size);
	lg_request_refused(&g, 1026);
	for (uint64_t i = 0; i < size; i++)
		ASSERT_EQ(log[i], 0);

	lg_close(&g);
	tdev_halt(&t);
	ASSERT_OK(rmdir(t.dir));
}

TEST(a_log_too_small_for_the_memory_is_refused)
{
	struct tdev t;
	struct lguest g;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	lg_open(&g, t.sock);
	/* 4 MiB of guest memory needs 1024 bits (128 bytes); 8 bytes cover 256 KiB. */
	ASSERT_TRUE(vhu_front_set_log_base(g.f, 8) < 0);
	ASSERT_TRUE(vhu_front_log(g.f, NULL) == NULL);
	lg_close(&g);
	tdev_halt(&t);
	ASSERT_OK(rmdir(t.dir));
}

TEST_MAIN()
