/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the vhost-user front-end (src/vhost_user/frontend.c): against our own back-end
 * running in a thread (full init / start / stop / restart cycle, shared ring memory, eventfds,
 * REPLY_ACK, fd accounting), against scripted misbehaving back-ends (bad reply flags, sizes,
 * ids, missing features, silence, hang-up), over a real socket path, and the guest-memory
 * allocator.
 */
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "fakedev.h"
#include "fdutil.h"
#include "test.h"
#include "vhost_user/frontend.h"
#include "vhost_user/msg.h"

/* ---- our back-end in a thread --------------------------------------------------------- */

struct srv {
	struct vhu_backend *b;
	struct fakedev dev;
	pthread_t thread;
	int result;
};

/* Serves until the connection ends (or 10 s without a message, which fails the test later). */
static void *srv_main(void *arg)
{
	struct srv *s = arg;

	for (;;) {
		struct pollfd p = { .fd = vhu_backend_fd(s->b), .events = POLLIN };
		int r = poll(&p, 1, 10000);

		if (r <= 0) {
			s->result = -ETIMEDOUT;
			break;
		}
		r = vhu_backend_process(s->b);
		if (r < 0) {
			s->result = r;
			break;
		}
	}
	return NULL;
}

static void srv_start(struct srv *s, int sock, const struct vhu_backend_config *cfg)
{
	fakedev_init(&s->dev);
	ASSERT_OK(vhu_backend_new(sock, cfg, &fakedev_ops, &s->dev, &s->b));
	ASSERT_OK(-pthread_create(&s->thread, NULL, srv_main, s));
}

/* Waits for the serving thread (the front-end must have closed) and frees the back-end. */
static int srv_join(struct srv *s)
{
	pthread_join(s->thread, NULL);
	vhu_backend_free(s->b);
	return s->result;
}

static void backend_cfg(struct vhu_backend_config *cfg)
{
	vhu_backend_config_init(cfg);
	cfg->guest_cid = 0xabcdef;
}

static struct vhu_front *pair_with_backend(struct srv *s, const struct vhu_backend_config *bcfg,
					   const struct vhu_front_config *fcfg)
{
	struct vhu_front *f = NULL;
	int sv[2];

	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	srv_start(s, sv[1], bcfg);
	ASSERT_OK(vhu_front_new(sv[0], fcfg, &f));
	return f;
}

TEST(full_cycle_against_our_backend)
{
	struct vhu_backend_config bcfg;
	struct vhu_front_config fcfg;
	const struct vhu_front_ring *r0, *r1;
	struct vhu_front *f;
	struct srv s;
	uint16_t bases[2];
	char log[512];
	uint64_t v;
	int before = fd_count();

	backend_cfg(&bcfg);
	vhu_front_config_init(&fcfg);
	fcfg.gpa_base = 0x100000000ull;
	f = pair_with_backend(&s, &bcfg, &fcfg);
	ASSERT_TRUE(vhu_front_ring(f, 0) == NULL);

	ASSERT_OK(vhu_front_init(f));
	ASSERT_EQ_U64(vhu_front_guest_cid(f), 0xabcdef);
	ASSERT_EQ_U64(vhu_front_protocol_features(f),
		      VHU_BIT(VHU_PROTO_F_CONFIG) | VHU_BIT(VHU_PROTO_F_REPLY_ACK) |
			      VHU_BIT(VHU_PROTO_F_LOG_SHMFD));

	/* Negotiated features are known before the start (the guest role needs SEQPACKET). */
	ASSERT_EQ_U64(vhu_front_features(f),
		      VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
			      VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC) |
			      VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_IN_ORDER));
	ASSERT_OK(vhu_front_start(f));
	ASSERT_EQ_U64(s.dev.features, vhu_front_features(f));
	/* Every request was acked, so the device state is final here. */
	fakedev_take_log(&s.dev, log, sizeof(log));
	ASSERT_STREQ(log, "feat memnew start0 start1");

	r0 = vhu_front_ring(f, 0);
	r1 = vhu_front_ring(f, 1);
	ASSERT_TRUE(r0 && r1);
	ASSERT_EQ(r0->num, 128);
	ASSERT_EQ((uintptr_t)r0->desc % 16, 0);
	ASSERT_EQ_U64(vhu_front_gpa(f, r1->used), r1->used_gpa);
	ASSERT_TRUE(vhu_front_hva(f, r1->used_gpa, 8) == r1->used);
	/* Both sides see the same ring memory, through different mappings. */
	pthread_mutex_lock(&s.dev.lock);
	ASSERT_EQ(s.dev.info[1].num, 128);
	ASSERT_TRUE(s.dev.info[1].desc != r1->desc);
	((uint8_t *)r1->desc)[5] = 0xc3;
	ASSERT_EQ(((uint8_t *)s.dev.info[1].desc)[5], 0xc3);
	/* Kick: front-end to device. Call: device to front-end. */
	ASSERT_TRUE(same_eventfd(r0->kick_fd, s.dev.info[0].kick_fd));
	ASSERT_TRUE(same_eventfd(s.dev.info[1].call_fd, r1->call_fd));
	/* The memory map the device got translates guest-physical addresses too. */
	ASSERT_TRUE(guest_mem_gpa_range(s.dev.info[0].mem, r0->avail_gpa, 6) ==
		    s.dev.info[0].avail);
	s.dev.stop_ret[0] = 5;
	s.dev.stop_ret[1] = 6;
	pthread_mutex_unlock(&s.dev.lock);

	ASSERT_OK(vhu_front_stop(f, bases));
	ASSERT_EQ(bases[0], 5);
	ASSERT_EQ(bases[1], 6);
	fakedev_take_log(&s.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1");

	/* Restart (guest reboot): same rings, bases carried over. */
	ASSERT_OK(vhu_front_start(f));
	fakedev_take_log(&s.dev, log, sizeof(log));
	/* The memory table is sent again: the old map is dropped after the device was told. */
	ASSERT_STREQ(log, "feat memchg memnew start0 start1");
	ASSERT_TRUE(vhu_front_ring(f, 0) == r0);
	ASSERT_EQ(s.dev.info[0].last_avail_idx, 5);
	ASSERT_EQ(s.dev.info[1].last_avail_idx, 6);

	/* A raw request the back-end refuses (SET_CONFIG) acks non-zero, connection stays. */
	struct vhu_config c = { .offset = 0, .size = 8 };
	ASSERT_OK(vhu_front_request(f, VHU_REQ_SET_CONFIG, true, &c, 20, NULL, 0, &v, 8));
	ASSERT_NE(v, 0);
	ASSERT_OK(vhu_front_get_features(f, &v));

	ASSERT_OK(vhu_front_stop(f, NULL));
	vhu_front_free(f);
	ASSERT_ERR(srv_join(&s), ECONNRESET);
	ASSERT_EQ(fd_count(), before);
}

TEST(negotiation_follows_what_the_backend_offers)
{
	struct vhu_backend_config bcfg;
	struct vhu_front_config fcfg;
	struct vhu_front *f;
	struct srv s;
	int before = fd_count();

	backend_cfg(&bcfg);
	bcfg.features = VHU_BIT(VHU_F_EVENT_IDX);
	bcfg.offer_mq = true;
	vhu_front_config_init(&fcfg);
	fcfg.features = VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_VSOCK_F_SEQPACKET);
	fcfg.queue_size = 256;
	f = pair_with_backend(&s, &bcfg, &fcfg);
	ASSERT_OK(vhu_front_init(f));
	ASSERT_EQ_U64(vhu_front_protocol_features(f), VHU_BIT(VHU_PROTO_F_CONFIG) |
							     VHU_BIT(VHU_PROTO_F_REPLY_ACK) |
							     VHU_BIT(VHU_PROTO_F_MQ));
	ASSERT_OK(vhu_front_start(f));
	ASSERT_EQ_U64(vhu_front_features(f), VHU_BIT(VHU_F_VERSION_1) |
						     VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
						     VHU_BIT(VHU_F_EVENT_IDX));
	ASSERT_EQ(s.dev.info[0].num, 256);
	ASSERT_EQ_U64(s.dev.features, vhu_front_features(f));
	vhu_front_free(f);
	ASSERT_ERR(srv_join(&s), ECONNRESET);
	ASSERT_EQ(fd_count(), before);
}

TEST(backend_violation_surfaces_as_error)
{
	struct vhu_backend_config bcfg;
	struct vhu_front_config fcfg;
	struct vhu_front *f;
	struct srv s;
	uint16_t base;

	backend_cfg(&bcfg);
	bcfg.queue_size_max = 64;
	vhu_front_config_init(&fcfg); /* queue size 128 > 64 */
	f = pair_with_backend(&s, &bcfg, &fcfg);
	ASSERT_OK(vhu_front_init(f));
	/* The back-end nacks SET_VRING_NUM (REPLY_ACK) and closes. */
	ASSERT_ERR(vhu_front_start(f), EPROTO);
	ASSERT_ERR(srv_join(&s), EINVAL);
	/* The back-end is gone: the next request fails, it does not hang. */
	ASSERT_ERR(vhu_front_get_vring_base(f, 0, &base), EPIPE);
	vhu_front_free(f);
}

/* ---- scripted misbehaving back-ends --------------------------------------------------- */

enum mode { M_OK, M_BAD_FLAGS, M_BAD_SIZE, M_WRONG_ID, M_NO_CONFIG, M_NO_VERSION1, M_CLOSE,
	    M_SILENT, M_BAD_CID, M_SENDS_FD };

struct script {
	int sock;
	enum mode mode;
	pthread_t thread;
};

static void *script_main(void *arg)
{
	static struct vhu_msg m;
	struct script *sc = arg;
	uint64_t feat = VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES);
	uint64_t proto = VHU_BIT(VHU_PROTO_F_CONFIG);

	if (sc->mode == M_CLOSE) {
		/* Hang up after reading the first request, so the front-end sees EOF. */
		if (vhu_msg_recv(sc->sock, &m, 5000) == 0)
			vhu_msg_close_fds(&m);
		goto out;
	}
	if (sc->mode == M_NO_VERSION1)
		feat = VHU_BIT(VHU_F_PROTOCOL_FEATURES);
	if (sc->mode == M_NO_CONFIG)
		proto = VHU_BIT(VHU_PROTO_F_REPLY_ACK);
	while (vhu_msg_recv(sc->sock, &m, 5000) == 0) {
		uint32_t flags = sc->mode == M_BAD_FLAGS ? 0x1 : 0x5;
		uint32_t req = sc->mode == M_WRONG_ID ? m.request + 1 : m.request;
		uint8_t cfg[20] = { 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 42 };
		const void *p = NULL;
		uint32_t size = 0;
		int efd = -1;

		vhu_msg_close_fds(&m);
		if (sc->mode == M_SILENT)
			continue;
		switch (m.request) {
		case VHU_REQ_GET_FEATURES:
			p = &feat;
			size = sc->mode == M_BAD_SIZE ? 4 : 8;
			break;
		case VHU_REQ_GET_PROTOCOL_FEATURES:
			p = &proto;
			size = 8;
			break;
		case VHU_REQ_GET_CONFIG:
			if (sc->mode == M_BAD_CID)
				cfg[12] = 2;
			p = cfg;
			size = 20;
			break;
		default:
			continue;
		}
		if (sc->mode == M_SENDS_FD)
			efd = eventfd(0, EFD_CLOEXEC);
		vhu_msg_send(sc->sock, req, flags, p, size, &efd, efd >= 0, 1000);
		if (efd >= 0)
			close(efd);
	}
out:
	close(sc->sock);
	return NULL;
}

static int run_script(enum mode mode, int timeout_ms, uint64_t *ret_cid)
{
	struct vhu_front_config fcfg;
	struct vhu_front *f = NULL;
	struct script sc = { .mode = mode };
	int sv[2], r;

	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	sc.sock = sv[1];
	vhu_front_config_init(&fcfg);
	fcfg.timeout_ms = timeout_ms;
	ASSERT_OK(vhu_front_new(sv[0], &fcfg, &f));
	ASSERT_OK(-pthread_create(&sc.thread, NULL, script_main, &sc));
	r = vhu_front_init(f);
	if (r == 0 && ret_cid)
		*ret_cid = vhu_front_guest_cid(f);
	vhu_front_free(f);
	pthread_join(sc.thread, NULL);
	return r;
}

TEST(minimal_backend_without_reply_ack_is_fine)
{
	uint64_t cid = 0;
	int before = fd_count();

	ASSERT_OK(run_script(M_OK, 2000, &cid));
	ASSERT_EQ_U64(cid, 42);
	ASSERT_EQ(fd_count(), before);
}

TEST(malformed_replies_are_rejected)
{
	int before = fd_count();

	ASSERT_ERR(run_script(M_BAD_FLAGS, 2000, NULL), EPROTO);
	ASSERT_ERR(run_script(M_BAD_SIZE, 2000, NULL), EPROTO);
	ASSERT_ERR(run_script(M_WRONG_ID, 2000, NULL), EPROTO);
	ASSERT_ERR(run_script(M_BAD_CID, 2000, NULL), EINVAL);
	/* An fd attached to a reply is closed, the reply itself accepted. */
	ASSERT_OK(run_script(M_SENDS_FD, 2000, NULL));
	ASSERT_EQ(fd_count(), before);
}

TEST(missing_features_are_refused)
{
	ASSERT_ERR(run_script(M_NO_VERSION1, 2000, NULL), EPROTONOSUPPORT);
	ASSERT_ERR(run_script(M_NO_CONFIG, 2000, NULL), EPROTONOSUPPORT);
}

TEST(backend_hangup_and_silence)
{
	ASSERT_ERR(run_script(M_CLOSE, 2000, NULL), ECONNRESET);
	ASSERT_ERR(run_script(M_SILENT, 50, NULL), ETIMEDOUT);
}

/* ---- over a socket path --------------------------------------------------------------- */

struct listener {
	int lfd;
	struct srv srv;
	struct vhu_backend_config cfg;
};

static void *accept_main(void *arg)
{
	struct listener *l = arg;
	int c = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC);

	if (c < 0)
		return (void *)1;
	fakedev_init(&l->srv.dev);
	if (vhu_backend_new(c, &l->cfg, &fakedev_ops, &l->srv.dev, &l->srv.b) < 0) {
		close(c);
		return (void *)1;
	}
	srv_main(&l->srv);
	vhu_backend_free(l->srv.b);
	return NULL;
}

TEST(connect_by_path)
{
	char dir[] = "/tmp/uvsock-vhu-XXXXXX", path[128];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct vhu_front_config fcfg;
	struct vhu_front *f = NULL;
	struct listener l;
	pthread_t t;
	void *res;
	int before = fd_count();

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/vm.sock", dir);
	vhu_front_config_init(&fcfg);
	fcfg.timeout_ms = 50;
	/* Nobody listening: bounded retry, then -ETIMEDOUT. */
	ASSERT_ERR(vhu_front_connect(path, &fcfg, &f), ETIMEDOUT);

	backend_cfg(&l.cfg);
	l.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, path);
	ASSERT_OK(bind(l.lfd, (struct sockaddr *)&sa, sizeof(sa)));
	ASSERT_OK(listen(l.lfd, 1));
	ASSERT_OK(-pthread_create(&t, NULL, accept_main, &l));
	fcfg.timeout_ms = 5000;
	ASSERT_OK(vhu_front_connect(path, &fcfg, &f));
	ASSERT_OK(vhu_front_init(f));
	ASSERT_EQ_U64(vhu_front_guest_cid(f), 0xabcdef);
	ASSERT_OK(vhu_front_start(f));
	ASSERT_OK(vhu_front_stop(f, NULL));
	vhu_front_free(f);
	pthread_join(t, &res);
	ASSERT_TRUE(res == NULL);
	ASSERT_ERR(l.srv.result, ECONNRESET);
	close(l.lfd);
	unlink(path);
	rmdir(dir);
	ASSERT_EQ(fd_count(), before);

	char longpath[200];
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = 0;
	ASSERT_ERR(vhu_front_connect(longpath, &fcfg, &f), ENAMETOOLONG);
}

/* ---- allocator and config ------------------------------------------------------------- */

TEST(allocator_alignment_exhaustion_and_translation)
{
	struct vhu_front_config fcfg;
	struct vhu_front *f;
	void *p, *q;
	uint64_t gpa;
	int sv[2];

	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	vhu_front_config_init(&fcfg);
	fcfg.mem_size = 1 << 16;
	fcfg.gpa_base = 0x8000;
	ASSERT_OK(vhu_front_new(sv[0], &fcfg, &f));
	ASSERT_ERR(vhu_front_start(f), EINVAL); /* not initialised */
	ASSERT_OK(vhu_front_alloc(f, 3, 1, &p, &gpa));
	ASSERT_TRUE(p == vhu_front_mem(f));
	ASSERT_EQ_U64(gpa, 0x8000);
	ASSERT_OK(vhu_front_alloc(f, 10, 64, &q, &gpa));
	ASSERT_EQ((uintptr_t)q % 64, 0);
	ASSERT_EQ_U64(gpa, 0x8000 + 64);
	ASSERT_EQ_U64(vhu_front_gpa(f, q), gpa);
	ASSERT_TRUE(vhu_front_hva(f, gpa, 10) == q);
	ASSERT_TRUE(vhu_front_hva(f, 0x8000 + (1 << 16) - 4, 8) == NULL);
	ASSERT_TRUE(vhu_front_hva(f, 0x7000, 8) == NULL);
	ASSERT_EQ_U64(vhu_front_gpa(f, (char *)vhu_front_mem(f) + (1 << 16)), UINT64_MAX);
	ASSERT_ERR(vhu_front_alloc(f, 8, 3, &p, NULL), EINVAL);
	ASSERT_ERR(vhu_front_alloc(f, 0, 8, &p, NULL), EINVAL);
	ASSERT_ERR(vhu_front_alloc(f, 1 << 16, 8, &p, NULL), ENOMEM);
	ASSERT_ERR(vhu_front_alloc(f, SIZE_MAX, 8, &p, NULL), ENOMEM);
	ASSERT_OK(vhu_front_alloc(f, (1 << 16) - 128, 64, &p, NULL));
	ASSERT_ERR(vhu_front_alloc(f, 1, 1, &p, NULL), ENOMEM);
	/* The memory is zero-filled and shared through the memfd. */
	ASSERT_EQ(((uint8_t *)p)[100], 0);
	ASSERT_EQ_U64(vhu_front_mem_size(f), 1 << 16);
	ASSERT_GE(vhu_front_memfd(f), 0);
	vhu_front_free(f);
	close(sv[1]);
}

TEST(new_rejects_bad_config)
{
	struct vhu_front_config fcfg;
	struct vhu_front *f = NULL;

	vhu_front_config_init(&fcfg);
	ASSERT_ERR(vhu_front_new(-1, &fcfg, &f), EINVAL);
	fcfg.mem_size = 1000;
	ASSERT_ERR(vhu_front_new(0, &fcfg, &f), EINVAL);
	vhu_front_config_init(&fcfg);
	fcfg.queue_size = 100;
	ASSERT_ERR(vhu_front_new(0, &fcfg, &f), EINVAL);
	vhu_front_config_init(&fcfg);
	fcfg.features = VHU_BIT(VHU_F_PROTOCOL_FEATURES);
	ASSERT_ERR(vhu_front_new(0, &fcfg, &f), EINVAL);
	vhu_front_config_init(&fcfg);
	fcfg.gpa_base = UINT64_MAX - 4095;
	ASSERT_ERR(vhu_front_new(0, &fcfg, &f), EINVAL);
	ASSERT_TRUE(f == NULL);
	vhu_front_free(NULL);
}

TEST_MAIN()
