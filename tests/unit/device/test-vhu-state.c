/* SPDX-License-Identifier: MIT */
/*
 * VHOST_USER_PROTOCOL_F_DEVICE_STATE in the vhost-user glue (src/device/vhu_state.c, the
 * requests in src/vhost_user/backend.c): the project's front-end stops a device's rings, saves
 * its state through a pipe, moves to a second device of the same CID over the same guest memory
 * and rings, loads the state there and starts the rings at the saved indices. The guest's
 * connection of the first device ends on the second (a TRANSPORT_RESET on the event queue, or an
 * RST with two queues), its listener and new connections work, and every hostile request or state gets an error
 * reply without losing the connection. docs/upgrade.md, "VHOST_USER_PROTOCOL_F_DEVICE_STATE".
 */
#include <endian.h>
#include <signal.h>
#include <sys/eventfd.h>

#include "devtest.h"
#include "statetest.h"
#include "device/vhu_state.h"

TEST(stopped_state_moves_to_a_second_device_with_a_transfer_each_way)
{
	struct tdev ta, tb;
	struct mguest m;
	uint16_t bases[3];
	uint8_t *st;
	size_t len, h2g_got;
	int lfa, hfd, src;

	tdev_new(&ta, NULL, 3);
	tdev_new(&tb, NULL, 3);
	tdev_run(&ta);
	tdev_run(&tb);
	mg_connect_nrx(&m, ta.sock, MG_NRX_SMALL);
	hfd = transfer_started(&m, ta.uds, &lfa, &h2g_got);

	/* Stopped (the phase the spec calls so), the state saved through a pipe. */
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	ASSERT_GT(len, (size_t)REC_HDR_SIZE);

	/* The second device, same CID, same guest memory, the rings at the saved indices; the
	 * first one stays connected until the move is done, as a migrating VMM's source does. */
	src = dup(vhu_front_fd(m.g.f));
	move_to(m.g.f, tb.sock);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	close(src);

	/* Every byte once and in order, on the same host connection, and no RST or event. */
	transfer_finished(&m, hfd, h2g_got);
	ASSERT_EQ(mg_event(&m), -1);
	close(hfd);
	free(st);
	mg_disconnect(&m);
	rm_listener(ta.uds, lfa);
	tdev_stop(&ta);
	tdev_stop(&tb);
}

TEST(a_failed_migration_resumes_the_first_device_with_its_connections)
{
	struct tdev t;
	struct mguest m;
	uint16_t bases[3];
	uint8_t *st;
	size_t len, h2g_got;
	int lfd, hfd;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	mg_connect_nrx(&m, t.sock, MG_NRX_SMALL);
	hfd = transfer_started(&m, t.uds, &lfd, &h2g_got);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	/* The front-end gives up and starts the rings again: the device goes on where it was. */
	ASSERT_OK(vhu_front_start(m.g.f));
	transfer_finished(&m, hfd, h2g_got);
	ASSERT_EQ(mg_event(&m), -1);
	close(hfd);
	free(st);
	mg_disconnect(&m);
	rm_listener(t.uds, lfd);
	tdev_stop(&t);
}

/* The state's rendezvous token made unreachable (one hex digit changed, CRC set again). */
static void break_token(uint8_t *st, size_t len)
{
	struct rec_doc doc;
	struct rec_reader r;
	struct rec_item it;
	bool found = false;

	ASSERT_OK(rec_open(&doc, st, len, REC_KIND_DEVICE_STATE, 1, VHU_STATE_VERSION, NULL, 0));
	rec_root(&doc, &r, "state");
	while (rec_next(&r, &it) > 0)
		if (it.tag == 5) {
			uint8_t *p = st + (it.val - st);

			p[0] = p[0] == 'a' ? 'b' : 'a';
			found = true;
		}
	rec_doc_fini(&doc);
	ASSERT_TRUE(found);
	rec_reseal(st, len);
}

TEST(without_the_rendezvous_the_guest_connections_end_and_new_ones_work)
{
	struct tdev ta, tb;
	struct mguest m;
	uint16_t bases[3];
	uint8_t *st;
	size_t len, h2g_got;
	int lfa, lfb, hfd, hfd2, src;
	int64_t ev;

	tdev_new(&ta, NULL, 3);
	tdev_new(&tb, NULL, 3);
	tdev_run(&ta);
	tdev_run(&tb);
	mg_connect_nrx(&m, ta.sock, MG_NRX_SMALL);
	hfd = transfer_started(&m, ta.uds, &lfa, &h2g_got);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	break_token(st, len);
	src = dup(vhu_front_fd(m.g.f));
	move_to(m.g.f, tb.sock);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	ASSERT_EQ(eventfd_write(vhu_front_ring(m.g.f, 2)->kick_fd, 1), 0);

	/* The guest's connection ends: a TRANSPORT_RESET on the event queue (and no RST for it:
	 * the_moved_connections_end_with_the_event_alone_or_rsts_alone). */
	ASSERT_WAIT_FOR((ev = mg_event(&m)) >= 0, WAIT_MS);
	ASSERT_EQ(ev, 0); /* VIRTIO_VSOCK_EVENT_TRANSPORT_RESET */
	/* The first device, which kept them, ends them when its VMM leaves. */
	close(src);
	host_read_to_eof(hfd);
	close(hfd);

	/* New connections work on the second device (its own host side). */
	hfd2 = guest_conn(&m.g, tb.uds, 40002, &lfb);
	hello_port(&m.g, hfd2, 40002);
	close(hfd2);
	free(st);
	mg_disconnect(&m);
	rm_listener(ta.uds, lfa);
	rm_listener(tb.uds, lfb);
	tdev_stop(&ta);
	tdev_stop(&tb);
}

/*
 * A new connection from sport to the host listener at <uds>_1234 (made here); returns how many
 * RSTs for port old came before its RESPONSE. Packets of one device reach the guest in the order
 * the device queued them, and a moved connection's RST is queued before the new REQUEST is read.
 */
static unsigned rsts_before_new_conn(struct tguest *g, const char *uds, uint32_t sport,
				     uint32_t old, int *lfd, int *hfd)
{
	char path[160];
	struct vsock_hdr h, r;
	uint8_t buf[RXBUF];
	unsigned rsts = 0;

	snprintf(path, sizeof(path), "%s_1234", uds);
	*lfd = unix_listen(path, SOCK_STREAM);
	h = mkhdr(g, 2, sport, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(g, &h, NULL);
	*hfd = accept_wait(*lfd, WAIT_MS);
	ASSERT_GE(*hfd, 0);
	for (;;) {
		ASSERT_OK(tg_recv(g, &r, buf, sizeof(buf), WAIT_MS, true));
		if (r.dst_port == sport)
			break;
		rsts += r.op == VSOCK_OP_RST && r.dst_port == old;
	}
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);
	return rsts;
}

/*
 * The moved connections end one way (src/device/device.c, moved_decide): with the event queue
 * handed over, only the TRANSPORT_RESET (an RST as well races it in a Linux guest, which takes
 * RX and events apart); with two queues (QEMU keeps the event queue), an RST each.
 */
TEST(the_moved_connections_end_with_the_event_alone_or_rsts_alone)
{
	struct tdev ta, tb;
	struct mguest m;
	struct tguest g;
	uint16_t bases[3];
	uint8_t *st;
	size_t len;
	int lfa, lfb, hfd, hfd2, src;
	int64_t ev;

	/* Three queues: the event, and no RST before the guest's next connection. */
	tdev_new(&ta, NULL, 3);
	tdev_new(&tb, NULL, 3);
	tdev_run(&ta);
	tdev_run(&tb);
	mg_connect(&m, ta.sock);
	hfd = guest_conn(&m.g, ta.uds, 40001, &lfa);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	break_token(st, len);
	src = dup(vhu_front_fd(m.g.f));
	move_to(m.g.f, tb.sock);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	ASSERT_EQ(eventfd_write(vhu_front_ring(m.g.f, 2)->kick_fd, 1), 0);
	ASSERT_WAIT_FOR((ev = mg_event(&m)) >= 0, WAIT_MS);
	ASSERT_EQ(ev, 0); /* VIRTIO_VSOCK_EVENT_TRANSPORT_RESET */
	ASSERT_EQ(rsts_before_new_conn(&m.g, tb.uds, 40002, 40001, &lfb, &hfd2), 0u);
	hello_port(&m.g, hfd2, 40002);
	ASSERT_EQ(mg_event(&m), -1); /* one event */
	close(hfd2);
	close(src);
	host_read_to_eof(hfd);
	close(hfd);
	free(st);
	mg_disconnect(&m);
	rm_listener(ta.uds, lfa);
	rm_listener(tb.uds, lfb);
	tdev_stop(&ta);
	tdev_stop(&tb);

	/* Two queues: the RST, before the guest's next connection. */
	tdev_new(&ta, NULL, 3);
	tdev_new(&tb, NULL, 3);
	tdev_run(&ta);
	tdev_run(&tb);
	tg_connect(&g, &ta);
	ASSERT_TRUE(vhu_front_protocol_features(g.f) & VHU_BIT(VHU_PROTO_F_DEVICE_STATE));
	hfd = guest_conn(&g, ta.uds, 40001, &lfa);
	ASSERT_OK(vhu_front_stop(g.f, bases));
	st = save_state(g.f, &len);
	src = dup(vhu_front_fd(g.f));
	move_to(g.f, tb.sock);
	ASSERT_EQ(load_state(g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(g.f));
	ASSERT_EQ(rsts_before_new_conn(&g, tb.uds, 40002, 40001, &lfb, &hfd2), 1u);
	hello_port(&g, hfd2, 40002);
	close(hfd2);
	close(src);
	host_read_to_eof(hfd);
	close(hfd);
	free(st);
	tg_disconnect(&g);
	rm_listener(ta.uds, lfa);
	rm_listener(tb.uds, lfb);
	tdev_stop(&ta);
	tdev_stop(&tb);
}

TEST(after_the_hand_over_a_resumed_first_device_has_no_connections)
{
	struct tdev ta, tb;
	struct mguest m;
	struct vhu_front_config cfg;
	struct vhu_front *other;
	uint16_t bases[3];
	uint8_t *st;
	size_t len, h2g_got;
	int lfa, hfd, hfd2, lfa2;
	int64_t ev;

	tdev_new(&ta, NULL, 3);
	tdev_new(&tb, NULL, 3);
	tdev_run(&ta);
	tdev_run(&tb);
	mg_connect_nrx(&m, ta.sock, MG_NRX_SMALL);
	hfd = transfer_started(&m, ta.uds, &lfa, &h2g_got);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	/* Another front-end (the destination VMM) loads the state into the second device: the
	 * host sockets go there. */
	vhu_front_config_init(&cfg);
	cfg.mem_size = 1u << 20;
	cfg.num_queues = 3;
	ASSERT_OK(vhu_front_connect(tb.sock, &cfg, &other));
	ASSERT_OK(vhu_front_init(other));
	ASSERT_EQ(load_state(other, st, len), 0);
	/* The migration fails after all and the first device's rings start again: its guest is
	 * told that its connections are gone (they are the second device's now), and new ones
	 * work. */
	ASSERT_OK(vhu_front_start(m.g.f));
	ASSERT_EQ(eventfd_write(vhu_front_ring(m.g.f, 2)->kick_fd, 1), 0);
	ASSERT_WAIT_FOR((ev = mg_event(&m)) >= 0, WAIT_MS);
	ASSERT_EQ(ev, 0);
	rm_listener(ta.uds, lfa);
	hfd2 = guest_conn(&m.g, ta.uds, 40002, &lfa2);
	hello_port(&m.g, hfd2, 40002);
	close(hfd2);
	/* The second device never ran them: they end when its VMM leaves. */
	vhu_front_free(other);
	host_read_to_eof(hfd);
	close(hfd);
	free(st);
	mg_disconnect(&m);
	rm_listener(ta.uds, lfa2);
	tdev_stop(&ta);
	tdev_stop(&tb);
}

TEST(a_guest_reset_while_held_ends_the_connections)
{
	struct tdev t;
	struct mguest m;
	struct tguest *g = &m.g;
	const struct vhu_front_ring *rr, *tr, *er;
	uint16_t bases[3];
	uint64_t feats;
	int lfd, hfd, lfd2, hfd2;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	mg_connect(&m, t.sock);
	hfd = guest_conn(g, t.uds, 40001, &lfd);
	hello_port(g, hfd, 40001);
	ASSERT_OK(vhu_front_stop(g->f, bases));
	/* A new driver (the guest reset the device while it was stopped): rings zeroed, every
	 * index from 0. The held connection ends then, not before. */
	rr = vhu_front_ring(g->f, 0);
	tr = vhu_front_ring(g->f, 1);
	er = vhu_front_ring(g->f, 2);
	for (unsigned q = 0; q < 3; q++) {
		const struct vhu_front_ring *x = vhu_front_ring(g->f, q);

		memset(x->desc, 0, 16u * x->num);
		memset(x->avail, 0, 6u + 2u * x->num);
		memset(x->used, 0, 6u + 8u * x->num);
	}
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vring_drv_free(m.ev);
	feats = vhu_front_features(g->f);
	ASSERT_OK(vring_drv_new(rr->num, rr->desc, rr->avail, rr->used, feats, &g->rx));
	ASSERT_OK(vring_drv_new(tr->num, tr->desc, tr->avail, tr->used, feats, &g->tx));
	ASSERT_OK(vring_drv_new(er->num, er->desc, er->avail, er->used, feats, &m.ev));
	memset(g->txbusy, 0, sizeof(g->txbusy));
	for (unsigned q = 0; q < 3; q++)
		ASSERT_OK(vhu_front_setup_ring(g->f, q, 0));
	for (unsigned q = 0; q < 3; q++)
		ASSERT_OK(vhu_front_enable_ring(g->f, q, true));
	host_read_to_eof(hfd);
	close(hfd);
	for (int i = 0; i < NRX; i++)
		tg_post_rx(g, i);
	tg_kick(g, 0);
	rm_listener(t.uds, lfd);
	hfd2 = guest_conn(g, t.uds, 40002, &lfd2);
	hello_port(g, hfd2, 40002);
	close(hfd2);
	mg_disconnect(&m);
	rm_listener(t.uds, lfd2);
	tdev_stop(&t);
}

TEST(a_device_linked_to_siblings_saves_its_state_too)
{
	struct vsock_router *router;
	struct tdev ta, tb, tc;
	struct tguest gb;
	struct mguest m;
	struct vsock_hdr h, r;
	uint16_t bases[3];
	uint8_t buf[64], *st;
	size_t len;
	int64_t ev;

	sib_start(&router, &ta, &tb);
	tdev_new(&tc, NULL, 3);
	tdev_run(&tc);
	mg_connect(&m, ta.sock);
	tg_connect(&gb, &tb);
	/* Guest 3 connects to guest 4 through the sibling link. */
	h = mkhdr(&m.g, 4, 50001, 77, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&m.g, &h, NULL);
	ASSERT_OK(tg_recv(&gb, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_REQUEST);
	h = mkhdr(&gb, 3, 77, 50001, VSOCK_TYPE_STREAM, VSOCK_OP_RESPONSE, 0);
	tg_send(&gb, &h, NULL);
	ASSERT_OK(tg_recv(&m.g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RESPONSE);

	/* The linked device's state (vsock_dev_save refuses a linked device) is saved and loaded
	 * into an unlinked one; the guest is told its connections are gone. */
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	move_to(m.g.f, tc.sock);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	ASSERT_EQ(eventfd_write(vhu_front_ring(m.g.f, 2)->kick_fd, 1), 0);
	ASSERT_WAIT_FOR((ev = mg_event(&m)) >= 0, WAIT_MS);
	ASSERT_EQ(ev, 0);
	/* Connections to siblings are not the device's (sibling.c routes their packets and keeps
	 * no connection), so the state names none: only the event ends them. */
	free(st);
	mg_disconnect(&m);
	tdev_stop(&tc);
	sib_stop(router, &ta, &tb, &(struct tguest){ 0 }, &gb);
}

/* A state record by hand: CID, features, flags, connections (n of them, from port 40000). */
static uint8_t *make_state(uint32_t cid, uint64_t features, uint32_t flags, unsigned n,
			   size_t *ret_len)
{
	struct rec_writer w;
	const uint8_t *b;
	uint8_t *out;

	rec_writer_init(&w, REC_KIND_DEVICE_STATE, VHU_STATE_VERSION);
	rec_put_u32(&w, 1, cid);
	rec_put_u64(&w, 2, features);
	rec_put_u32(&w, 3, flags);
	rec_begin(&w, 4);
	for (unsigned i = 0; i < n; i++) {
		rec_begin(&w, 0x13);
		rec_put_u32(&w, 1, VSOCK_TYPE_STREAM);
		rec_put_u32(&w, 2, 1234);
		rec_put_u32(&w, 3, cid);
		rec_put_u32(&w, 4, 40000 + i);
		rec_end(&w);
	}
	rec_end(&w);
	ASSERT_OK(rec_writer_finish(&w, &b, ret_len));
	out = malloc(*ret_len);
	ASSERT_TRUE(out != NULL);
	memcpy(out, b, *ret_len);
	rec_writer_free(&w);
	return out;
}

/* SET_DEVICE_STATE_FD with a raw payload and fds; the reply. */
static uint64_t raw_set(struct vhu_front *f, const void *p, uint32_t size, const int *fds,
			unsigned nfds)
{
	uint64_t rep = 0;

	ASSERT_OK(vhu_front_request(f, VHU_REQ_SET_DEVICE_STATE_FD, false, p, size, fds, nfds, &rep,
				    sizeof(rep)));
	return rep;
}

struct big_writer {
	int fd;
	size_t wrote;
};

/* Writes zeros until the reader closes (EPIPE) or 2 MiB went. */
static void *big_writer_main(void *arg)
{
	struct big_writer *bw = arg;
	static uint8_t zeros[65536];

	while (bw->wrote < (2u << 20)) {
		ssize_t k = write(bw->fd, zeros, sizeof(zeros));

		if (k <= 0)
			break;
		bw->wrote += (size_t)k;
	}
	close(bw->fd);
	return NULL;
}

TEST(hostile_requests_and_states_get_an_error_reply_and_the_connection_stays)
{
	struct vhu_device_state save = { VHU_STATE_DIR_SAVE, 0 }, load = { VHU_STATE_DIR_LOAD, 0 };
	struct tdev t;
	struct mguest m;
	uint16_t bases[3];
	uint64_t chk, feats, dev_feats;
	uint8_t *st, *good;
	size_t len, good_len;
	int p[2], mfd;

	signal(SIGPIPE, SIG_IGN);
	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	mg_connect(&m, t.sock);
	feats = vhu_front_features(m.g.f);
	dev_feats = feats & uvsock_dev_features();
	ASSERT_OK(pipe2(p, O_CLOEXEC));

	/* Rings running: not the phase "stopped". */
	ASSERT_EQ(raw_set(m.g.f, &save, 8, &p[1], 1), (uint64_t)EBUSY | VHU_STATE_REPLY_NOFD);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	/* Another phase, direction, payload size, fd count; the wrong end of the pipe; a memfd. */
	ASSERT_EQ(raw_set(m.g.f, &(struct vhu_device_state){ 0, 1 }, 8, &p[1], 1) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &(struct vhu_device_state){ 2, 0 }, 8, &p[1], 1) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &save, 4, &p[1], 1) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &save, 8, NULL, 0) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &save, 8, p, 2) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &save, 8, &p[0], 1) & 0xff, EINVAL);
	ASSERT_EQ(raw_set(m.g.f, &load, 8, &p[1], 1) & 0xff, EINVAL);
	mfd = memfd_create("not-a-pipe", MFD_CLOEXEC);
	ASSERT_GE(mfd, 0);
	ASSERT_EQ(raw_set(m.g.f, &load, 8, &mfd, 1) & 0xff, EINVAL);
	close(mfd);
	close(p[0]);
	close(p[1]);
	/* CHECK after a refused request: no transfer. */
	ASSERT_OK(vhu_front_check_device_state(m.g.f, &chk));
	ASSERT_NE(chk, 0);

	/* Loads: garbage, truncated, another CID, features not offered, not the acked ones (the
	 * front-end acked its features before), flags unknown, connections without a session. */
	good = make_state(3, dev_feats, 1, 2, &good_len);
	ASSERT_NE(load_state(m.g.f, "garbage garbage garbage garbage garbage garbage", 47), 0);
	ASSERT_NE(load_state(m.g.f, good, good_len - 1), 0);
	ASSERT_NE(load_state(m.g.f, good, 0), 0);
	st = make_state(4, dev_feats, 1, 2, &len);
	ASSERT_EQ(load_state(m.g.f, st, len), EINVAL);
	free(st);
	st = make_state(3, dev_feats | (1ull << 60), 1, 2, &len);
	ASSERT_EQ(load_state(m.g.f, st, len), EINVAL);
	free(st);
	st = make_state(3, dev_feats & ~VHU_BIT(VHU_VSOCK_F_SEQPACKET), 1, 2, &len);
	ASSERT_EQ(load_state(m.g.f, st, len), EINVAL);
	free(st);
	st = make_state(3, dev_feats, 3, 2, &len);
	ASSERT_NE(load_state(m.g.f, st, len), 0);
	free(st);
	st = make_state(3, dev_feats, 0, 2, &len);
	ASSERT_NE(load_state(m.g.f, st, len), 0);
	free(st);
	/* A rendezvous in a version 1 state, a malformed one, one without a session. */
	{
		static const struct { uint32_t version, flags; const char *token; } bad[] = {
			{ 1, 1, "0123456789abcdef0123456789abcdef" },
			{ 2, 1, "0123456789abcdef0123456789abcdeF" },
			{ 2, 1, "0123456789abcdef" },
			{ 2, 0, "0123456789abcdef0123456789abcdef" },
		};

		for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
			struct rec_writer w;
			const uint8_t *b;

			rec_writer_init(&w, REC_KIND_DEVICE_STATE, bad[i].version);
			rec_put_u32(&w, 1, 3);
			rec_put_u64(&w, 2, dev_feats);
			rec_put_u32(&w, 3, bad[i].flags);
			rec_begin(&w, 4);
			rec_end(&w);
			rec_put_bytes(&w, 5, bad[i].token, strlen(bad[i].token));
			ASSERT_OK(rec_writer_finish(&w, &b, &len));
			ASSERT_EQ(load_state(m.g.f, b, len), EBADMSG);
			rec_writer_free(&w);
		}
	}

	/* More than the bound: refused, and the writer sees the pipe closed (no hang). */
	{
		struct big_writer bw;
		pthread_t th;
		uint64_t rep = 0;

		ASSERT_OK(pipe2(p, O_CLOEXEC));
		ASSERT_OK(vhu_front_set_device_state_fd(m.g.f, VHU_STATE_DIR_LOAD, 0, p[0], &rep));
		ASSERT_EQ(rep, VHU_STATE_REPLY_NOFD);
		close(p[0]);
		bw = (struct big_writer){ .fd = p[1] };
		ASSERT_EQ(pthread_create(&th, NULL, big_writer_main, &bw), 0);
		pthread_join(th, NULL);
		ASSERT_OK(vhu_front_check_device_state(m.g.f, &chk));
		ASSERT_EQ(chk, EFBIG);
		ASSERT_LT(bw.wrote, 2u << 20);
	}
	/* A front-end that keeps the pipe open: CHECK answers after a bounded wait. */
	{
		uint64_t rep = 0;

		ASSERT_OK(pipe2(p, O_CLOEXEC));
		ASSERT_OK(vhu_front_set_device_state_fd(m.g.f, VHU_STATE_DIR_LOAD, 0, p[0], &rep));
		ASSERT_EQ(write(p[1], good, 10), 10);
		ASSERT_OK(vhu_front_check_device_state(m.g.f, &chk));
		ASSERT_EQ(chk, ETIMEDOUT);
		close(p[0]);
		close(p[1]);
	}
	/* A save whose reader went away before reading. */
	{
		uint64_t rep = 0;

		ASSERT_OK(pipe2(p, O_CLOEXEC));
		close(p[0]);
		ASSERT_OK(vhu_front_set_device_state_fd(m.g.f, VHU_STATE_DIR_SAVE, 0, p[1], &rep));
		ASSERT_NE(rep & 0xff, 0);
		close(p[1]);
	}

	/* Still the same connection, and a good state is taken; the device then runs. */
	ASSERT_EQ(load_state(m.g.f, good, good_len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	{
		int64_t ev;

		/* Its two connections end with the event queue's TRANSPORT_RESET. */
		ASSERT_EQ(eventfd_write(vhu_front_ring(m.g.f, 2)->kick_fd, 1), 0);
		ASSERT_WAIT_FOR((ev = mg_event(&m)) >= 0, WAIT_MS);
		ASSERT_EQ(ev, 0);
	}
	free(good);
	mg_disconnect(&m);
	tdev_stop(&t);
}

TEST(a_refused_load_drops_the_state_loaded_before)
{
	struct tdev t;
	struct mguest m;
	struct vsock_hdr h, r;
	uint16_t bases[3];
	uint8_t buf[64], *st;
	size_t len;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	mg_connect(&m, t.sock);
	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = make_state(3, vhu_front_features(m.g.f) & uvsock_dev_features(), 1, 1, &len);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_NE(load_state(m.g.f, st, len - 1), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	/* The first packet the guest gets answers its own REQUEST (no host listener: an RST), not
	 * an RST for port 40000 of the state that was replaced. */
	h = mkhdr(&m.g, 2, 41000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&m.g, &h, NULL);
	ASSERT_OK(tg_recv(&m.g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.dst_port, 41000);
	free(st);
	mg_disconnect(&m);
	tdev_stop(&t);
}

TEST_MAIN()
