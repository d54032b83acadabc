/* SPDX-License-Identifier: MIT */
/*
 * The device's event queue over a hand-driven guest (src/device/evq.h): our front-end with
 * three queues against a struct vsock_dev on its own thread, rings driven by vring_drv. A reset
 * the device owes the guest waits while the rings are stopped and is posted when they come back
 * with a used TX ring (a guest that survived: id 0, length 4, in one event buffer), it is
 * dropped for a new driver (TX starting at index 0, which has nothing to reset), and the event
 * buffers are left alone while nothing is owed. Short event buffers go back empty.
 */
#include <unistd.h>

#include "device/vsock_dev.h"
#include "device/device_internal.h"
#include "device/vhu.h"
#include "tdev.h"
#include "test.h"
#include "util/fdcheck.h"
#include "uvsock/device.h"
#include "vhost_user/frontend.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define EVQ_WAIT_MS 3000
#define NEV 4

/* A guest that only sends RSTs (which the device drops) and keeps event buffers posted. */
struct eguest {
	struct vhu_front *f;
	struct vring_drv *tx, *ev;
	uint8_t *pkt, *evb;
	uint64_t pkt_gpa, evb_gpa;
};

static int evmark[NEV];

static void eg_rings(struct eguest *g, unsigned ev_len)
{
	const struct vhu_front_ring *tr = vhu_front_ring(g->f, 1), *er = vhu_front_ring(g->f, 2);
	uint64_t feats = vhu_front_features(g->f);

	ASSERT_TRUE(tr && er);
	ASSERT_OK(vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, feats, &g->tx));
	ASSERT_OK(vring_drv_new(er->num, er->desc, er->avail, er->used, feats, &g->ev));
	for (int i = 0; i < NEV; i++) {
		struct vring_drv_buf b = { g->evb_gpa + 4u * i, ev_len, true };

		ASSERT_GE(vring_drv_add(g->ev, &b, 1, &evmark[i]), 0);
	}
	vring_drv_publish(g->ev);
	ASSERT_EQ(eventfd_signal_nb(er->kick_fd), 0);
}

static void eg_open(struct eguest *g, const char *sock, unsigned ev_len)
{
	struct vhu_front_config cfg;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 4u << 20;
	cfg.num_queues = 3;
	ASSERT_OK(vhu_front_connect(sock, &cfg, &g->f));
	ASSERT_OK(vhu_front_init(g->f));
	ASSERT_OK(vhu_front_alloc(g->f, 64, 64, (void **)&g->pkt, &g->pkt_gpa));
	ASSERT_OK(vhu_front_alloc(g->f, 4u * NEV, 8, (void **)&g->evb, &g->evb_gpa));
	ASSERT_OK(vhu_front_start(g->f));
	eg_rings(g, ev_len);
}

/* The VMM goes away (no orderly stop): closes the front-end, then frees the ring state. */
static void eg_close(struct eguest *g)
{
	vhu_front_free(g->f);
	vring_drv_free(g->ev);
	vring_drv_free(g->tx);
	*g = (struct eguest){ 0 };
}

/* Sends one RST to the host (port 1234): moves the TX ring's avail index past 0. */
static void eg_send_rst(struct eguest *g)
{
	struct vsock_hdr h = { .src_cid = vhu_front_guest_cid(g->f), .dst_cid = 2,
			       .src_port = 1024, .dst_port = 1234,
			       .type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_RST };
	struct vring_drv_buf b = { g->pkt_gpa, VSOCK_HDR_SIZE, false };
	uint32_t len;
	void *ck;

	vsock_hdr_encode(&h, g->pkt);
	ASSERT_GE(vring_drv_add(g->tx, &b, 1, g), 0);
	vring_drv_publish(g->tx);
	ASSERT_EQ(eventfd_signal_nb(vhu_front_ring(g->f, 1)->kick_fd), 0);
	ASSERT_WAIT_FOR(vring_drv_get_used(g->tx, &len, &ck) == 0, EVQ_WAIT_MS);
}

/* The next used event buffer: its length and id. */
static bool eg_event(struct eguest *g, uint32_t *len, uint32_t *id)
{
	void *ck;

	if (vring_drv_get_used(g->ev, len, &ck) != 0)
		return false;
	memcpy(id, g->evb + 4u * (unsigned)((int *)ck - evmark), 4);
	*id = le32toh(*id);
	return true;
}

static uint64_t posted(struct tdev *t)
{
	struct vsock_dev_stats st;

	vsock_dev_get_stats(t->d, &st);
	return st.transport_resets;
}

TEST(reset_owed_while_stopped_is_posted_when_a_used_ring_comes_back)
{
	struct tdev t;
	struct eguest g;
	uint32_t len = 0, id = 1;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	eg_open(&g, t.sock, 4);
	eg_send_rst(&g);
	ASSERT_EQ(posted(&t), 0);
	ASSERT_FALSE(eg_event(&g, &len, &id)); /* nothing owed: buffers untouched */
	/* The VMM stops the rings (VM stop), asks for a reset, and starts them again. */
	ASSERT_OK(vhu_front_stop(g.f, NULL));
	ASSERT_OK(uvsock_dev_transport_reset(dev_api(t.d)));
	ASSERT_EQ(posted(&t), 0); /* waits for the session */
	ASSERT_OK(vhu_front_start(g.f));
	ASSERT_WAIT_FOR(eg_event(&g, &len, &id), EVQ_WAIT_MS);
	ASSERT_EQ(len, 4);
	ASSERT_EQ(id, 0); /* VIRTIO_VSOCK_EVENT_TRANSPORT_RESET */
	ASSERT_EQ(posted(&t), 1);
	ASSERT_FALSE(eg_event(&g, &len, &id)); /* one event, not one per buffer */
	eg_close(&g);
	tdev_halt(&t);
	ASSERT_OK(rmdir(t.dir));
}

TEST(reset_owed_to_a_new_driver_is_dropped)
{
	struct tdev t;
	struct eguest g;
	uint32_t len, id;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	eg_open(&g, t.sock, 4);
	eg_send_rst(&g);
	eg_close(&g); /* the VMM goes: connections (none here) dropped */
	ASSERT_WAIT_FOR(!atomic_load(&t.d->vmm_connected), EVQ_WAIT_MS);
	ASSERT_OK(uvsock_dev_transport_reset(dev_api(t.d))); /* owed, no session */
	eg_open(&g, t.sock, 4); /* fresh rings: TX from index 0 */
	eg_send_rst(&g); /* the session runs (this went through TX) */
	ASSERT_FALSE(eg_event(&g, &len, &id));
	ASSERT_EQ(posted(&t), 0);
	eg_close(&g);
	tdev_halt(&t);
	ASSERT_OK(rmdir(t.dir));
}

TEST(short_event_buffers_go_back_empty_and_the_reset_stays_owed)
{
	struct tdev t;
	struct eguest g;
	uint32_t len = 9, id;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	eg_open(&g, t.sock, 2); /* 2-byte event buffers */
	eg_send_rst(&g);
	ASSERT_OK(uvsock_dev_transport_reset(dev_api(t.d)));
	for (int i = 0; i < NEV; i++) {
		ASSERT_WAIT_FOR(eg_event(&g, &len, &id), EVQ_WAIT_MS);
		ASSERT_EQ(len, 0);
	}
	ASSERT_EQ(posted(&t), 0);
	eg_close(&g);
	tdev_halt(&t);
	ASSERT_OK(rmdir(t.dir));
}

TEST_MAIN()
