/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the vhost-user back-end (src/vhost_user/backend.c), driven by stepping: the test
 * writes one request on its end of a socketpair, calls vhu_backend_process() and reads the reply.
 * Covers negotiation, GET_CONFIG, reply flags, REPLY_ACK, the ring start/stop rules, memory
 * table replacement, call fd replacement, the exact QEMU 7.2 sequence recorded in
 * qemu-guest-notes.md, and a table of malformed messages that must each end the connection with
 * a precise errno and leave no fd open.
 */
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "fakedev.h"
#include "fdutil.h"
#include "test.h"
#include "util/macros.h"
#include "vhost_user/msg.h"

#define MEMSZ (1u << 20)
#define FAKE_UVA 0x7f1234500000ull /* "QEMU's" address of the region: not our mapping */
#define GPA_BASE 0x40000000ull
#define QSZ 128u

/* Ring parts of queue q at these offsets in guest memory. */
#define DESC_OFF(q) (0x1000u + (q) * 0x4000u)
#define AVAIL_OFF(q) (0x2000u + (q) * 0x4000u)
#define USED_OFF(q) (0x3000u + (q) * 0x4000u)

static struct {
	int sock; /* our (front-end) end */
	struct vhu_backend *b;
	struct fakedev dev;
	int memfd;
	uint8_t *mem;
	int kick[VHU_NUM_QUEUES], call[VHU_NUM_QUEUES];
	int fds_before;
} fx;

static struct vhu_msg rm;

static void fx_setup_cfg(const struct vhu_backend_config *cfg)
{
	int sv[2];

	fx.fds_before = fd_count();
	fakedev_init(&fx.dev);
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	fx.sock = sv[0];
	ASSERT_OK(vhu_backend_new(sv[1], cfg, &fakedev_ops, &fx.dev, &fx.b));
	fx.memfd = memfd_create("test-guest", MFD_CLOEXEC);
	ASSERT_GE(fx.memfd, 0);
	ASSERT_OK(ftruncate(fx.memfd, MEMSZ));
	fx.mem = mmap(NULL, MEMSZ, PROT_READ | PROT_WRITE, MAP_SHARED, fx.memfd, 0);
	ASSERT_TRUE(fx.mem != MAP_FAILED);
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		fx.kick[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		fx.call[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	}
}

static void fx_setup(void)
{
	struct vhu_backend_config cfg;

	vhu_backend_config_init(&cfg);
	cfg.guest_cid = 0x1234567;
	cfg.msg_timeout_ms = 200;
	fx_setup_cfg(&cfg);
}

/* Frees everything and checks that no fd is left open. */
static void fx_teardown(void)
{
	vhu_backend_free(fx.b);
	fx.b = NULL;
	close(fx.sock);
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		close(fx.kick[q]);
		close(fx.call[q]);
	}
	munmap(fx.mem, MEMSZ);
	close(fx.memfd);
	ASSERT_EQ(fd_count(), fx.fds_before);
}

static int req(uint32_t request, uint32_t flags, const void *p, uint32_t size, const int *fds,
	       unsigned nfds)
{
	ASSERT_OK(vhu_msg_send(fx.sock, request, flags, p, size, fds, nfds, 1000));
	return vhu_backend_process(fx.b);
}

static int req_u64(uint32_t request, uint64_t v, const int *fds, unsigned nfds)
{
	return req(request, VHU_FLAG_VERSION, &v, 8, fds, nfds);
}

static int req_state(uint32_t request, uint32_t index, uint32_t num)
{
	struct vhu_vring_state s = { index, num };

	return req(request, VHU_FLAG_VERSION, &s, sizeof(s), NULL, 0);
}

static bool reply_pending(void)
{
	struct pollfd p = { .fd = fx.sock, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

/* Reads a reply and checks flags == 0x5, the request id and the size. */
static void get_reply(uint32_t request, void *out, uint32_t size)
{
	ASSERT_OK(vhu_msg_recv(fx.sock, &rm, 1000));
	ASSERT_EQ(rm.flags, 0x5);
	ASSERT_EQ(rm.request, request);
	ASSERT_EQ(rm.size, size);
	ASSERT_EQ(rm.nfds, 0);
	memcpy(out, rm.payload.raw, size);
}

static uint64_t get_u64_reply(uint32_t request)
{
	uint64_t v;

	get_reply(request, &v, 8);
	return v;
}

/* GET_FEATURES, GET/SET_PROTOCOL_FEATURES (proto), SET_OWNER. */
static void negotiate(uint64_t proto)
{
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	(void)get_u64_reply(VHU_REQ_GET_FEATURES);
	ASSERT_OK(req(VHU_REQ_GET_PROTOCOL_FEATURES, 1, NULL, 0, NULL, 0));
	(void)get_u64_reply(VHU_REQ_GET_PROTOCOL_FEATURES);
	ASSERT_OK(req_u64(VHU_REQ_SET_PROTOCOL_FEATURES, proto, NULL, 0));
	ASSERT_OK(req(VHU_REQ_SET_OWNER, 1, NULL, 0, NULL, 0));
}

static void mem_table_msg(struct vhu_mem_table *t, uint64_t uva, uint64_t size)
{
	memset(t, 0, sizeof(*t));
	t->nregions = 1;
	t->regions[0] = (struct vhu_mem_region){ .guest_phys_addr = GPA_BASE,
						 .memory_size = size,
						 .userspace_addr = uva,
						 .mmap_offset = 0 };
}

static int set_mem(uint64_t uva)
{
	struct vhu_mem_table t;

	mem_table_msg(&t, uva, MEMSZ);
	return req(VHU_REQ_SET_MEM_TABLE, 1, &t, 8 + 32, &fx.memfd, 1);
}

static int set_addr(unsigned q, uint64_t uva)
{
	struct vhu_vring_addr a = { .index = q,
				    .desc_user_addr = uva + DESC_OFF(q),
				    .used_user_addr = uva + USED_OFF(q),
				    .avail_user_addr = uva + AVAIL_OFF(q) };

	return req(VHU_REQ_SET_VRING_ADDR, 1, &a, sizeof(a), NULL, 0);
}

/* SET_VRING_NUM, BASE, ADDR, KICK, CALL for queue q. */
static void setup_ring(unsigned q, uint16_t base)
{
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, q, QSZ));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_BASE, q, base));
	ASSERT_OK(set_addr(q, FAKE_UVA));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, q, &fx.kick[q], 1));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, q, &fx.call[q], 1));
}

static uint64_t std_features(void)
{
	return VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
	       VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC) |
	       VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_IN_ORDER);
}

/* What the default configuration offers: the features above, packed rings and dirty logging. */
static uint64_t offered_features(void)
{
	return std_features() | VHU_BIT(VHU_F_RING_PACKED) | VHU_BIT(VHU_F_LOG_ALL);
}

static const uint64_t std_proto = VHU_BIT(VHU_PROTO_F_CONFIG) | VHU_BIT(VHU_PROTO_F_REPLY_ACK);

/* Everything up to two started (kicked) rings, PROTOCOL_FEATURES acked: rings still disabled. */
static void bring_up_disabled(void)
{
	negotiate(std_proto);
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES, std_features(), NULL, 0));
	ASSERT_OK(set_mem(FAKE_UVA));
	setup_ring(0, 0);
	setup_ring(1, 0);
}

static void bring_up_running(void)
{
	bring_up_disabled();
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 0, 1));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 1, 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 1));
}

/* ---- negotiation and replies ---------------------------------------------------------- */

TEST(get_features_offers_vsock_set_and_reply_flags_are_0x5)
{
	fx_setup();
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES), offered_features());
	ASSERT_OK(req(VHU_REQ_GET_PROTOCOL_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_PROTOCOL_FEATURES),
		      std_proto | VHU_BIT(VHU_PROTO_F_LOG_SHMFD));
	fx_teardown();
}

/* Packed rings: any queue size, 4-aligned event areas, the base with its wrap bit both ways. */
TEST(packed_ring_sizes_alignment_and_base)
{
	struct vhu_vring_state st;

	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES, offered_features(), NULL, 0));
	ASSERT_OK(set_mem(FAKE_UVA));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, 100)); /* not a power of 2: fine */
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	/* QEMU's packed base: avail slot | wrap << 15, used position in the high half. */
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_BASE, 0, 0x80058005u));
	ASSERT_OK(set_addr(0, FAKE_UVA));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, 0, &fx.kick[0], 1));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 0, 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_EQ(fx.dev.info[0].last_avail_idx, 0x8005);
	ASSERT_TRUE(fx.dev.info[0].features & VHU_BIT(VHU_F_RING_PACKED));
	fx.dev.stop_ret[0] = 0x0003; /* slot 3, wrap 0 */
	ASSERT_OK(req_state(VHU_REQ_GET_VRING_BASE, 0, 0));
	get_reply(VHU_REQ_GET_VRING_BASE, &st, 8);
	ASSERT_EQ(st.num, 0x00030003u);
	fx_teardown();
}

TEST(features_are_configurable_and_mq_optional)
{
	struct vhu_backend_config cfg;

	vhu_backend_config_init(&cfg);
	cfg.features = 0;
	cfg.offer_mq = true;
	fx_setup_cfg(&cfg);
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES),
		      VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES));
	ASSERT_OK(req(VHU_REQ_GET_PROTOCOL_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_PROTOCOL_FEATURES),
		      std_proto | VHU_BIT(VHU_PROTO_F_MQ));
	ASSERT_OK(req_u64(VHU_REQ_SET_PROTOCOL_FEATURES, std_proto | VHU_BIT(VHU_PROTO_F_MQ), NULL,
			  0));
	ASSERT_OK(req(VHU_REQ_GET_QUEUE_NUM, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_QUEUE_NUM), 3); /* rx, tx, event */
	/* SEQPACKET was not offered this time, so acking it is a violation. */
	ASSERT_ERR(req_u64(VHU_REQ_SET_FEATURES, VHU_BIT(VHU_VSOCK_F_SEQPACKET), NULL, 0), EINVAL);
	fx_teardown();
}

TEST(get_config_returns_le64_guest_cid_size_20)
{
	uint8_t buf[VHU_CONFIG_HDR_SIZE + 8];
	struct vhu_config c = { .offset = 0, .size = 8 };
	uint32_t hdr[3];

	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req(VHU_REQ_GET_CONFIG, 1, &c, VHU_CONFIG_HDR_SIZE + 8, NULL, 0));
	get_reply(VHU_REQ_GET_CONFIG, buf, 20);
	memcpy(hdr, buf, 12);
	ASSERT_EQ(hdr[0], 0);
	ASSERT_EQ(hdr[1], 8);
	const uint8_t want[8] = { 0x67, 0x45, 0x23, 0x01, 0, 0, 0, 0 };
	ASSERT_MEMEQ(buf + 12, want, 8);
	/* A sub-range: the high half. */
	c.offset = 2;
	c.size = 2;
	ASSERT_OK(req(VHU_REQ_GET_CONFIG, 1, &c, VHU_CONFIG_HDR_SIZE + 2, NULL, 0));
	get_reply(VHU_REQ_GET_CONFIG, buf, 14);
	ASSERT_EQ(buf[12], 0x23);
	ASSERT_EQ(buf[13], 0x01);
	/* Beyond the 8-byte config space: violation, no reply. */
	c.offset = 4;
	c.size = 8;
	ASSERT_ERR(req(VHU_REQ_GET_CONFIG, 1, &c, VHU_CONFIG_HDR_SIZE + 8, NULL, 0), EINVAL);
	ASSERT_FALSE(reply_pending());
	ASSERT_TRUE(strstr(vhu_backend_error(fx.b), "GET_CONFIG") != NULL);
	fx_teardown();
}

TEST(get_config_size_field_must_match_payload)
{
	struct vhu_config c = { .offset = 0, .size = 8 };

	fx_setup();
	negotiate(std_proto);
	ASSERT_ERR(req(VHU_REQ_GET_CONFIG, 1, &c, VHU_CONFIG_HDR_SIZE + 4, NULL, 0), EPROTO);
	fx_teardown();
}

TEST(get_config_needs_protocol_feature_config)
{
	struct vhu_config c = { .offset = 0, .size = 8 };

	fx_setup();
	negotiate(VHU_BIT(VHU_PROTO_F_REPLY_ACK));
	ASSERT_ERR(req(VHU_REQ_GET_CONFIG, 1, &c, VHU_CONFIG_HDR_SIZE + 8, NULL, 0), EPERM);
	fx_teardown();
}

TEST(set_config_is_refused_politely)
{
	struct vhu_config c = { .offset = 0, .size = 8 };

	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req(VHU_REQ_SET_CONFIG, 1 | VHU_FLAG_NEED_REPLY, &c, VHU_CONFIG_HDR_SIZE + 8,
		      NULL, 0));
	ASSERT_NE(get_u64_reply(VHU_REQ_SET_CONFIG), 0);
	/* The connection is still fine. */
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES), offered_features());
	fx_teardown();
}

TEST(reply_ack_only_when_negotiated_and_requested)
{
	fx_setup();
	/* Not negotiated yet: NEED_REPLY is ignored, no ack. */
	ASSERT_OK(req(VHU_REQ_SET_OWNER, 1 | VHU_FLAG_NEED_REPLY, NULL, 0, NULL, 0));
	ASSERT_FALSE(reply_pending());
	ASSERT_OK(req_u64(VHU_REQ_SET_PROTOCOL_FEATURES, std_proto, NULL, 0));
	/* Negotiated but not requested: no ack. */
	ASSERT_OK(req(VHU_REQ_SET_OWNER, 1, NULL, 0, NULL, 0));
	ASSERT_FALSE(reply_pending());
	/* Requested: u64 0. */
	ASSERT_OK(req(VHU_REQ_SET_OWNER, 1 | VHU_FLAG_NEED_REPLY, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_SET_OWNER), 0);
	/* A request with its own reply answers with that reply only. */
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1 | VHU_FLAG_NEED_REPLY, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES), offered_features());
	ASSERT_FALSE(reply_pending());
	/* A failing request acks non-zero before the connection ends. */
	struct vhu_vring_state s = { 0, 100 };
	ASSERT_ERR(req(VHU_REQ_SET_VRING_NUM, 1 | VHU_FLAG_NEED_REPLY, &s, 8, NULL, 0), EINVAL);
	ASSERT_NE(get_u64_reply(VHU_REQ_SET_VRING_NUM), 0);
	fx_teardown();
}

/* ---- ring lifecycle ------------------------------------------------------------------- */

TEST(rings_start_only_after_enable_when_protocol_features_acked)
{
	char log[512];
	uint16_t used_idx = 9;

	fx_setup();
	memcpy(fx.mem + USED_OFF(0) + 2, &used_idx, 2);
	bring_up_disabled();
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 1));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "feat memnew");

	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 0, 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 1));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "start0");

	/* What the device got: sizes, fds, features, and host pointers into the same memory
	 * (translated through userspace_addr, not the guest-physical base). */
	struct vhu_vring_info *in = &fx.dev.info[0];
	ASSERT_EQ(in->num, QSZ);
	ASSERT_EQ(in->last_avail_idx, 0);
	ASSERT_EQ_U64(in->features, std_features());
	ASSERT_TRUE(in->mem == vhu_backend_mem(fx.b));
	ASSERT_EQ(fx.dev.used_idx_seen[0], 9);
	ASSERT_TRUE(same_eventfd(fx.kick[0], in->kick_fd));
	ASSERT_TRUE(same_eventfd(fx.call[0], in->call_fd));
	fx.mem[DESC_OFF(0)] = 0x5a;
	fx.mem[AVAIL_OFF(0)] = 0x6b;
	ASSERT_EQ(*(uint8_t *)in->desc, 0x5a);
	ASSERT_EQ(*(uint8_t *)in->avail, 0x6b);

	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 1, 1));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "start1");
	fx_teardown();
}

TEST(rings_start_at_kick_without_protocol_features_acked)
{
	char log[512];

	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES, VHU_BIT(VHU_F_VERSION_1), NULL, 0));
	ASSERT_OK(set_mem(FAKE_UVA));
	setup_ring(0, 7);
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_EQ(fx.dev.info[0].last_avail_idx, 7);
	fakedev_take_log(&fx.dev, log, sizeof(log));
	/* Running from the kick on; the CALL that follows reaches the running ring. */
	ASSERT_STREQ(log, "feat memnew start0 call0");
	fx_teardown();
}

TEST(kick_before_mem_table_and_addr_starts_when_complete)
{
	char log[512];

	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES, VHU_BIT(VHU_F_VERSION_1), NULL, 0));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, 0, &fx.kick[0], 1));
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_OK(set_addr(0, FAKE_UVA)); /* no memory yet: accepted, checked later */
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_OK(set_mem(FAKE_UVA));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "feat memnew start0");
	ASSERT_EQ(fx.dev.info[0].call_fd, -1);
	fx_teardown();
}

TEST(disable_and_get_vring_base_stop_the_ring)
{
	struct vhu_vring_state st;
	char log[512];
	int before;

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	fx.dev.stop_ret[0] = 1234;
	fx.dev.stop_ret[1] = 77;

	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 0, 0));
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0");
	/* GET_VRING_BASE of the disabled ring answers what the device said at the stop. */
	ASSERT_OK(req_state(VHU_REQ_GET_VRING_BASE, 0, 0));
	get_reply(VHU_REQ_GET_VRING_BASE, &st, 8);
	ASSERT_EQ(st.index, 0);
	ASSERT_EQ(st.num, 1234);
	/* GET_VRING_BASE stops a running ring by itself and closes its kick fd. */
	before = fd_count();
	ASSERT_OK(req_state(VHU_REQ_GET_VRING_BASE, 1, 0));
	get_reply(VHU_REQ_GET_VRING_BASE, &st, 8);
	ASSERT_EQ(st.index, 1);
	ASSERT_EQ(st.num, 77);
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 1));
	ASSERT_EQ(fd_count(), before - 1);
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop1");
	/* Re-enabling a stopped (un-kicked) ring does not start it. */
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 1, 1));
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 1));
	/* A new kick does, resuming from the saved base. */
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, 1, &fx.kick[1], 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 1));
	ASSERT_EQ(fx.dev.info[1].last_avail_idx, 77);
	fx_teardown();
}

TEST(mem_table_replacement_stops_notifies_then_restarts)
{
	char log[512];
	void *old_desc;

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	fx.dev.stop_ret[0] = 3;
	fx.dev.stop_ret[1] = 4;
	old_desc = fx.dev.info[0].desc;
	ASSERT_OK(set_mem(FAKE_UVA));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1 memchg memnew start0 start1");
	ASSERT_TRUE(fx.dev.mem == vhu_backend_mem(fx.b));
	/* New mapping, same memory; indices carried over from the stop. */
	ASSERT_TRUE(fx.dev.info[0].desc != old_desc);
	fx.mem[DESC_OFF(0)] = 0x11;
	ASSERT_EQ(*(uint8_t *)fx.dev.info[0].desc, 0x11);
	ASSERT_EQ(fx.dev.info[0].last_avail_idx, 3);
	ASSERT_EQ(fx.dev.info[1].last_avail_idx, 4);
	fx_teardown();
}

TEST(mem_table_making_rings_unreachable_fails_connection)
{
	char log[512];

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	/* Same memory announced at another front-end address: the rings now point outside it. */
	ASSERT_ERR(set_mem(FAKE_UVA + 0x100000000ull), EFAULT);
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1 memchg memnew");
	fx_teardown();
}

TEST(call_fd_replaced_while_running_old_one_closed)
{
	char log[512];
	int before, nfd;

	fx_setup();
	nfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	before = fd_count();
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, 0, &nfd, 1));
	ASSERT_EQ(fd_count(), before); /* one received, one closed */
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "call0");
	ASSERT_TRUE(same_eventfd(nfd, fx.dev.call_fd[0]));
	/* "No fd" bit: the ring runs without interrupts. */
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, 0 | VHU_VRING_NOFD_MASK, NULL, 0));
	ASSERT_EQ(fx.dev.call_fd[0], -1);
	ASSERT_EQ(fd_count(), before - 1);
	/* ERR fds are kept and replaced too. */
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_ERR, 1, &nfd, 1));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_ERR, 1, &nfd, 1));
	ASSERT_EQ(fd_count(), before);
	close(nfd);
	fx_teardown();
}

TEST(kick_replaced_while_running_restarts_ring)
{
	char log[512];

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	fx.dev.stop_ret[0] = 21;
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, 0, &fx.kick[1], 1));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 start0");
	ASSERT_EQ(fx.dev.info[0].last_avail_idx, 21);
	ASSERT_TRUE(same_eventfd(fx.kick[1], fx.dev.info[0].kick_fd));
	fx_teardown();
}

TEST(reset_owner_stops_rings_and_requires_owner_again)
{
	char log[512];

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_OK(req(VHU_REQ_RESET_OWNER, 1, NULL, 0, NULL, 0));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1");
	ASSERT_EQ_U64(vhu_backend_features(fx.b), 0);
	ASSERT_ERR(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ), EPERM);
	fx_teardown();
}

TEST(device_refusing_start_fails_connection)
{
	fx_setup();
	fx.dev.start_error = -ENOTSUP;
	bring_up_disabled();
	ASSERT_ERR(req_state(VHU_REQ_SET_VRING_ENABLE, 0, 1), ENOTSUP);
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	/* Sticky. */
	ASSERT_ERR(vhu_backend_process(fx.b), ENOTSUP);
	fx_teardown();
}

TEST(free_with_running_rings_stops_them_and_releases_memory)
{
	char log[512];

	fx_setup();
	bring_up_running();
	fakedev_take_log(&fx.dev, log, sizeof(log));
	vhu_backend_free(fx.b);
	fx.b = NULL;
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1 memchg");
	fx_teardown();
}

/*
 * The event queue (index 2): never set up (QEMU), nothing changes; set up (Cloud Hypervisor,
 * crosvm, our front-end with num_queues 3), it starts, stops and answers its base like the
 * other two.
 */
TEST(event_queue_runs_when_the_front_end_sets_it_up)
{
	struct vhu_vring_state st;
	char log[512];

	fx_setup();
	bring_up_running();
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 2));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	setup_ring(2, 5);
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 2)); /* disabled until SET_VRING_ENABLE */
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, 2, 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 2));
	ASSERT_EQ(fx.dev.info[2].last_avail_idx, 5);
	ASSERT_TRUE(same_eventfd(fx.kick[2], fx.dev.info[2].kick_fd));
	fx.dev.stop_ret[2] = 6;
	ASSERT_OK(req_state(VHU_REQ_GET_VRING_BASE, 2, 0));
	get_reply(VHU_REQ_GET_VRING_BASE, &st, 8);
	ASSERT_EQ(st.index, 2);
	ASSERT_EQ(st.num, 6);
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "start2 stop2");
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	fx_teardown();
}

TEST(process_without_data_returns_at_once)
{
	fx_setup(); /* msg_timeout_ms 200 */
	for (int i = 0; i < 1000; i++)
		ASSERT_OK(vhu_backend_process(fx.b));
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES), offered_features());
	fx_teardown();
}

TEST(eof_is_econnreset_and_sticky)
{
	fx_setup();
	negotiate(std_proto);
	shutdown(fx.sock, SHUT_WR);
	ASSERT_ERR(vhu_backend_process(fx.b), ECONNRESET);
	ASSERT_ERR(vhu_backend_process(fx.b), ECONNRESET);
	ASSERT_STREQ(vhu_backend_error(fx.b), "front-end closed the connection");
	fx_teardown();
}

/* ---- the recorded QEMU 7.2 sequence --------------------------------------------------- */

/*
 * Replays, message by message, what QEMU 7.2 sends for vhost-user-vsock-pci
 * (qemu-guest-notes.md): header flags 0x1 (0x9 on SET_MEM_TABLE with REPLY_ACK), GET requests
 * with empty payloads, realize, guest driver load, power-off. Every reply must have flags 0x5
 * and the size QEMU checks.
 */
TEST(qemu_7_2_recorded_sequence)
{
	struct vhu_config c = { .offset = 0, .size = 8 };
	uint8_t cfgrep[20];
	struct vhu_vring_state st;
	struct vhu_mem_table t;
	char log[512];
	uint64_t feat, proto;
	int masked[2], irq[2];

	fx_setup();
	for (int q = 0; q < 2; q++) {
		masked[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		irq[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	}
	/* Realize. */
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	feat = get_u64_reply(VHU_REQ_GET_FEATURES);
	ASSERT_TRUE(feat & VHU_BIT(VHU_F_VERSION_1));
	ASSERT_TRUE(feat & VHU_BIT(VHU_F_PROTOCOL_FEATURES));
	ASSERT_OK(req(VHU_REQ_GET_PROTOCOL_FEATURES, 1, NULL, 0, NULL, 0));
	proto = get_u64_reply(VHU_REQ_GET_PROTOCOL_FEATURES);
	ASSERT_TRUE(proto & VHU_BIT(VHU_PROTO_F_CONFIG));
	/* QEMU acks the bits it knows: all of ours. */
	ASSERT_OK(req_u64(VHU_REQ_SET_PROTOCOL_FEATURES, proto, NULL, 0));
	ASSERT_OK(req(VHU_REQ_SET_OWNER, 1, NULL, 0, NULL, 0));
	ASSERT_OK(req(VHU_REQ_GET_FEATURES, 1, NULL, 0, NULL, 0));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_GET_FEATURES), feat);
	for (unsigned q = 0; q < 2; q++) {
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, q, &masked[q], 1));
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_ERR, q, &masked[q], 1));
	}
	ASSERT_OK(req(VHU_REQ_GET_CONFIG, 1, &c, 20, NULL, 0));
	get_reply(VHU_REQ_GET_CONFIG, cfgrep, 20);
	ASSERT_EQ(cfgrep[12], 0x67);
	ASSERT_FALSE(reply_pending());

	/* Guest driver loads (DRIVER_OK). QEMU acks PROTOCOL_FEATURES in SET_FEATURES. */
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, q, &masked[q], 1));
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES,
			  VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
				  VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC),
			  NULL, 0));
	mem_table_msg(&t, FAKE_UVA, MEMSZ);
	ASSERT_OK(req(VHU_REQ_SET_MEM_TABLE, 1 | VHU_FLAG_NEED_REPLY, &t, 40, &fx.memfd, 1));
	ASSERT_EQ_U64(get_u64_reply(VHU_REQ_SET_MEM_TABLE), 0);
	for (unsigned q = 0; q < 2; q++) {
		ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, q, 128));
		ASSERT_OK(req_state(VHU_REQ_SET_VRING_BASE, q, 0));
		ASSERT_OK(set_addr(q, FAKE_UVA));
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, q, &fx.kick[q], 1));
	}
	ASSERT_FALSE(vhu_backend_queue_running(fx.b, 0));
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, q, 1));
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, q, &irq[q], 1));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 0));
	ASSERT_TRUE(vhu_backend_queue_running(fx.b, 1));
	ASSERT_TRUE(same_eventfd(irq[1], fx.dev.call_fd[1]));
	ASSERT_FALSE(reply_pending());
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "feat memnew start0 start1 call0 call1");

	/* Power-off. */
	fx.dev.stop_ret[0] = 10;
	fx.dev.stop_ret[1] = 20;
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(req_state(VHU_REQ_SET_VRING_ENABLE, q, 0));
	for (unsigned q = 0; q < 2; q++) {
		ASSERT_OK(req_state(VHU_REQ_GET_VRING_BASE, q, 0));
		get_reply(VHU_REQ_GET_VRING_BASE, &st, 8);
		ASSERT_EQ(st.index, q);
		ASSERT_EQ(st.num, q ? 20 : 10);
	}
	for (unsigned q = 0; q < 2; q++)
		ASSERT_OK(req_u64(VHU_REQ_SET_VRING_CALL, q, &masked[q], 1));
	fakedev_take_log(&fx.dev, log, sizeof(log));
	ASSERT_STREQ(log, "stop0 stop1");
	close(fx.sock);
	fx.sock = -1;
	ASSERT_ERR(vhu_backend_process(fx.b), ECONNRESET);
	for (int q = 0; q < 2; q++) {
		close(masked[q]);
		close(irq[q]);
	}
	fx_teardown();
}

/* ---- malformed and out-of-order messages ---------------------------------------------- */

enum stage { ST_FRESH, ST_OWNED, ST_STARTED };

struct bad_case {
	const char *name;
	enum stage stage;
	uint32_t request, flags;
	uint8_t payload[64];
	uint32_t size;
	int nfds; /* eventfds to attach; -1: attach the memfd */
	int err;
};

#define U64(v)                                                                                     \
	{                                                                                          \
		(uint8_t)(v), (uint8_t)((v) >> 8), (uint8_t)((v) >> 16), (uint8_t)((v) >> 24),    \
			(uint8_t)((uint64_t)(v) >> 32), 0, 0, 0                                    \
	}
#define STATE(i, n)                                                                                \
	{                                                                                          \
		(uint8_t)(i), 0, 0, 0, (uint8_t)(n), (uint8_t)((n) >> 8), (uint8_t)((n) >> 16), 0  \
	}

static const struct bad_case bad_cases[] = {
	{ "unknown request 99", ST_OWNED, 99, 1, { 0 }, 0, 0, EOPNOTSUPP },
	{ "request 0", ST_OWNED, 0, 1, { 0 }, 0, 0, EOPNOTSUPP },
	{ "huge request id", ST_OWNED, 0xffffffffu, 1, { 0 }, 0, 0, EOPNOTSUPP },
	{ "SET_LOG_BASE without LOG_SHMFD", ST_OWNED, VHU_REQ_SET_LOG_BASE, 1, { 0 }, 16, 1, EPERM },
	{ "SET_LOG_FD without LOG_SHMFD", ST_OWNED, VHU_REQ_SET_LOG_FD, 1, { 0 }, 0, 1, EPERM },
	{ "SET_BACKEND_REQ_FD not offered", ST_OWNED, VHU_REQ_SET_BACKEND_REQ_FD, 1, { 0 }, 0, 1,
	  EOPNOTSUPP },
	{ "ADD_MEM_REG not offered", ST_OWNED, VHU_REQ_ADD_MEM_REG, 1, { 0 }, 40, 1, EOPNOTSUPP },
	{ "version 2", ST_OWNED, VHU_REQ_GET_FEATURES, 2, { 0 }, 0, 0, EPROTO },
	{ "version 0", ST_OWNED, VHU_REQ_GET_FEATURES, 0, { 0 }, 0, 0, EPROTO },
	{ "REPLY flag on a request", ST_OWNED, VHU_REQ_GET_FEATURES, 5, { 0 }, 0, 0, EPROTO },
	{ "unknown flag bit", ST_OWNED, VHU_REQ_GET_FEATURES, 0x11, { 0 }, 0, 0, EPROTO },
	{ "GET_FEATURES with payload", ST_OWNED, VHU_REQ_GET_FEATURES, 1, { 0 }, 8, 0, EPROTO },
	{ "GET_FEATURES with an fd", ST_OWNED, VHU_REQ_GET_FEATURES, 1, { 0 }, 0, 1, EPROTO },
	{ "SET_FEATURES short", ST_OWNED, VHU_REQ_SET_FEATURES, 1, { 0 }, 4, 0, EPROTO },
	{ "SET_FEATURES long", ST_OWNED, VHU_REQ_SET_FEATURES, 1, { 0 }, 16, 0, EPROTO },
	{ "SET_FEATURES bit not offered", ST_OWNED, VHU_REQ_SET_FEATURES, 1, U64(1ull << 38), 8, 0,
	  EINVAL },
	{ "SET_PROTOCOL_FEATURES STATUS", ST_FRESH, VHU_REQ_SET_PROTOCOL_FEATURES, 1,
	  U64(1ull << 16), 8, 0, EINVAL },
	{ "SET_VRING_NUM before SET_OWNER", ST_FRESH, VHU_REQ_SET_VRING_NUM, 1, STATE(0, 128), 8, 0,
	  EPERM },
	{ "SET_MEM_TABLE before SET_OWNER", ST_FRESH, VHU_REQ_SET_MEM_TABLE, 1, { 1 }, 40, -1,
	  EPERM },
	{ "GET_QUEUE_NUM without MQ", ST_OWNED, VHU_REQ_GET_QUEUE_NUM, 1, { 0 }, 0, 0, EPERM },
	{ "SET_VRING_NUM index 3", ST_OWNED, VHU_REQ_SET_VRING_NUM, 1, STATE(3, 128), 8, 0, EINVAL },
	{ "SET_VRING_NUM index 255", ST_OWNED, VHU_REQ_SET_VRING_NUM, 1, STATE(255, 128), 8, 0,
	  EINVAL },
	{ "SET_VRING_NUM 100", ST_OWNED, VHU_REQ_SET_VRING_NUM, 1, STATE(0, 100), 8, 0, EINVAL },
	{ "SET_VRING_NUM 0", ST_OWNED, VHU_REQ_SET_VRING_NUM, 1, STATE(0, 0), 8, 0, EINVAL },
	{ "SET_VRING_NUM 65536", ST_OWNED, VHU_REQ_SET_VRING_NUM, 1, STATE(0, 65536), 8, 0, EINVAL },
	{ "SET_VRING_NUM while started", ST_STARTED, VHU_REQ_SET_VRING_NUM, 1, STATE(0, 64), 8, 0,
	  EBUSY },
	{ "SET_VRING_BASE while started", ST_STARTED, VHU_REQ_SET_VRING_BASE, 1, STATE(1, 0), 8, 0,
	  EBUSY },
	{ "SET_FEATURES while started", ST_STARTED, VHU_REQ_SET_FEATURES, 1, U64(1ull << 32), 8, 0,
	  EBUSY },
	{ "SET_VRING_BASE index 3", ST_OWNED, VHU_REQ_SET_VRING_BASE, 1, STATE(3, 0), 8, 0, EINVAL },
	{ "SET_VRING_BASE 65536", ST_OWNED, VHU_REQ_SET_VRING_BASE, 1, STATE(0, 65536), 8, 0,
	  EINVAL },
	{ "GET_VRING_BASE index 3", ST_OWNED, VHU_REQ_GET_VRING_BASE, 1, STATE(3, 0), 8, 0, EINVAL },
	{ "SET_VRING_ENABLE index 3", ST_OWNED, VHU_REQ_SET_VRING_ENABLE, 1, STATE(3, 1), 8, 0,
	  EINVAL },
	{ "SET_VRING_ENABLE value 2", ST_OWNED, VHU_REQ_SET_VRING_ENABLE, 1, STATE(0, 2), 8, 0,
	  EINVAL },
	{ "SET_VRING_KICK index 3", ST_OWNED, VHU_REQ_SET_VRING_KICK, 1, U64(3), 8, 1, EINVAL },
	{ "SET_VRING_CALL index 3", ST_OWNED, VHU_REQ_SET_VRING_CALL, 1, U64(3), 8, 1, EINVAL },
	{ "SET_VRING_ERR index 3", ST_OWNED, VHU_REQ_SET_VRING_ERR, 1, U64(3), 8, 1, EINVAL },
	{ "SET_VRING_KICK reserved bits", ST_OWNED, VHU_REQ_SET_VRING_KICK, 1, U64(0x200), 8, 1,
	  EINVAL },
	{ "SET_VRING_KICK without fd", ST_OWNED, VHU_REQ_SET_VRING_KICK, 1, U64(0), 8, 0, EPROTO },
	{ "SET_VRING_KICK no-fd bit with fd", ST_OWNED, VHU_REQ_SET_VRING_KICK, 1, U64(0x100), 8, 1,
	  EPROTO },
	{ "SET_VRING_CALL two fds", ST_OWNED, VHU_REQ_SET_VRING_CALL, 1, U64(0), 8, 2, EPROTO },
	{ "SET_MEM_TABLE no fd", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 1 }, 40, 0, EPROTO },
	{ "SET_MEM_TABLE 0 regions", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 0 }, 40, -1, EINVAL },
	{ "SET_MEM_TABLE 2 regions 1 fd", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 2 }, 40, -1,
	  EPROTO },
	{ "SET_MEM_TABLE 9 regions", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 9 }, 40, -1, EINVAL },
	{ "SET_MEM_TABLE header only", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 1 }, 8, -1, EPROTO },
	{ "SET_MEM_TABLE zero size region", ST_OWNED, VHU_REQ_SET_MEM_TABLE, 1, { 1 }, 40, -1,
	  EINVAL },
	{ "SET_VRING_ADDR index 3", ST_OWNED, VHU_REQ_SET_VRING_ADDR, 1, { 3 }, 40, 0, EINVAL },
	{ "SET_VRING_ADDR unknown flag", ST_OWNED, VHU_REQ_SET_VRING_ADDR, 1, { 0, 0, 0, 0, 2 }, 40,
	  0, EINVAL },
	{ "SET_VRING_ADDR short", ST_OWNED, VHU_REQ_SET_VRING_ADDR, 1, { 0 }, 32, 0, EPROTO },
	{ "SET_CONFIG too big", ST_OWNED, VHU_REQ_SET_CONFIG, 1, { 0 }, 12 + 257, 0, EPROTO },
};

static void attach_and_send(const struct bad_case *c, int *ret)
{
	int efd[2];
	int n = c->nfds < 0 ? 1 : c->nfds;
	static uint8_t big[VHU_PAYLOAD_MAX];

	efd[0] = c->nfds < 0 ? fx.memfd : eventfd(0, EFD_CLOEXEC);
	efd[1] = eventfd(0, EFD_CLOEXEC);
	memset(big, 0, sizeof(big));
	memcpy(big, c->payload, sizeof(c->payload));
	*ret = req(c->request, c->flags, big, c->size, efd, (unsigned)n);
	if (c->nfds >= 0)
		close(efd[0]);
	close(efd[1]);
}

TEST(malformed_messages_fail_cleanly_without_leaks)
{
	for (size_t i = 0; i < ARRAY_SIZE(bad_cases); i++) {
		const struct bad_case *c = &bad_cases[i];
		int ret;

		fx_setup();
		if (c->stage >= ST_OWNED)
			negotiate(std_proto);
		if (c->stage >= ST_STARTED) {
			ASSERT_OK(set_mem(FAKE_UVA));
			setup_ring(0, 0);
			setup_ring(1, 0);
		}
		attach_and_send(c, &ret);
		if (ret != -c->err)
			test_fail(__FILE__, __LINE__, "case '%s': expected -%d got %d (%s)", c->name,
				  c->err, ret, vhu_backend_error(fx.b));
		ASSERT_TRUE(vhu_backend_error(fx.b)[0] != 0);
		/* The error is sticky and nothing else is read. */
		ASSERT_EQ(vhu_backend_process(fx.b), ret);
		fx_teardown();
	}
}

TEST(ring_address_checks)
{
	struct vhu_vring_addr a;

	/* Outside guest memory. */
	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(set_mem(FAKE_UVA));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	ASSERT_ERR(set_addr(0, FAKE_UVA + MEMSZ), EFAULT);
	fx_teardown();

	/* The used ring runs past the end of the region. */
	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(set_mem(FAKE_UVA));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	a = (struct vhu_vring_addr){ .index = 0,
				     .desc_user_addr = FAKE_UVA,
				     .used_user_addr = FAKE_UVA + MEMSZ - 8,
				     .avail_user_addr = FAKE_UVA + 0x1000 };
	ASSERT_ERR(req(VHU_REQ_SET_VRING_ADDR, 1, &a, sizeof(a), NULL, 0), EFAULT);
	fx_teardown();

	/* Guest-physical addresses are not front-end addresses. */
	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(set_mem(FAKE_UVA));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	ASSERT_ERR(set_addr(0, GPA_BASE), EFAULT);
	fx_teardown();

	/* Misaligned descriptor table. */
	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(set_mem(FAKE_UVA));
	a = (struct vhu_vring_addr){ .index = 0,
				     .desc_user_addr = FAKE_UVA + 8,
				     .used_user_addr = FAKE_UVA + 0x3000,
				     .avail_user_addr = FAKE_UVA + 0x2000 };
	ASSERT_ERR(req(VHU_REQ_SET_VRING_ADDR, 1, &a, sizeof(a), NULL, 0), EINVAL);
	fx_teardown();

	/* Addresses set before the memory table are checked when it arrives. */
	fx_setup();
	negotiate(std_proto);
	ASSERT_OK(req_u64(VHU_REQ_SET_FEATURES, VHU_BIT(VHU_F_VERSION_1), NULL, 0));
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, QSZ));
	ASSERT_OK(set_addr(0, FAKE_UVA + MEMSZ));
	ASSERT_OK(req_u64(VHU_REQ_SET_VRING_KICK, 0, &fx.kick[0], 1));
	ASSERT_ERR(set_mem(FAKE_UVA), EFAULT);
	fx_teardown();
}

TEST(mem_table_region_larger_than_file_refused)
{
	struct vhu_mem_table t;

	fx_setup();
	negotiate(std_proto);
	mem_table_msg(&t, FAKE_UVA, 2 * MEMSZ);
	ASSERT_ERR(req(VHU_REQ_SET_MEM_TABLE, 1, &t, 40, &fx.memfd, 1), EINVAL);
	ASSERT_TRUE(vhu_backend_mem(fx.b) == NULL);
	fx_teardown();
}

TEST(short_header_then_eof)
{
	uint32_t hdr = VHU_REQ_GET_FEATURES;

	fx_setup();
	ASSERT_EQ(write(fx.sock, &hdr, 4), 4);
	shutdown(fx.sock, SHUT_WR);
	ASSERT_ERR(vhu_backend_process(fx.b), EPROTO);
	fx_teardown();
}

TEST(too_many_fds_refused)
{
	int fds[9];
	uint64_t v = 0;

	fx_setup();
	negotiate(std_proto);
	for (int i = 0; i < 9; i++)
		fds[i] = eventfd(0, EFD_CLOEXEC);
	/* vhu_msg_send caps at 8, so build the 9-fd message by hand. */
	{
		uint8_t buf[20];
		uint32_t hdr[3] = { VHU_REQ_SET_VRING_CALL, 1, 8 };
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
		union {
			char b[CMSG_SPACE(sizeof(int) * 9)];
			struct cmsghdr a;
		} ctl;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
				     .msg_controllen = sizeof(ctl.b) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

		memcpy(buf, hdr, 12);
		memcpy(buf + 12, &v, 8);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * 9);
		memcpy(CMSG_DATA(cm), fds, sizeof(fds));
		ASSERT_EQ(sendmsg(fx.sock, &mh, 0), 20);
	}
	ASSERT_ERR(vhu_backend_process(fx.b), EPROTO);
	for (int i = 0; i < 9; i++)
		close(fds[i]);
	fx_teardown();
}

TEST(slow_partial_message_times_out)
{
	uint32_t hdr[3] = { VHU_REQ_SET_FEATURES, 1, 8 };

	fx_setup(); /* msg_timeout_ms 200 */
	ASSERT_EQ(write(fx.sock, hdr, 12), 12);
	ASSERT_ERR(vhu_backend_process(fx.b), ETIMEDOUT);
	fx_teardown();
}

TEST(new_rejects_bad_config)
{
	struct vhu_backend_config cfg;
	struct vhu_backend *b = NULL;

	vhu_backend_config_init(&cfg);
	ASSERT_ERR(vhu_backend_new(-1, &cfg, NULL, NULL, &b), EINVAL);
	cfg.guest_cid = 2;
	ASSERT_ERR(vhu_backend_new(0, &cfg, NULL, NULL, &b), EINVAL);
	cfg.guest_cid = 0xffffffffull;
	ASSERT_ERR(vhu_backend_new(0, &cfg, NULL, NULL, &b), EINVAL);
	vhu_backend_config_init(&cfg);
	cfg.features = VHU_BIT(40);
	ASSERT_ERR(vhu_backend_new(0, &cfg, NULL, NULL, &b), EINVAL);
	vhu_backend_config_init(&cfg);
	cfg.queue_size_max = 100;
	ASSERT_ERR(vhu_backend_new(0, &cfg, NULL, NULL, &b), EINVAL);
	cfg.queue_size_max = 65536;
	ASSERT_ERR(vhu_backend_new(0, &cfg, NULL, NULL, &b), EINVAL);
	ASSERT_TRUE(b == NULL);
	vhu_backend_free(NULL);
}

TEST(queue_size_max_from_config)
{
	struct vhu_backend_config cfg;

	vhu_backend_config_init(&cfg);
	cfg.queue_size_max = 128;
	fx_setup_cfg(&cfg);
	negotiate(std_proto);
	ASSERT_OK(req_state(VHU_REQ_SET_VRING_NUM, 0, 128));
	ASSERT_ERR(req_state(VHU_REQ_SET_VRING_NUM, 1, 256), EINVAL);
	fx_teardown();
}

TEST(request_names)
{
	ASSERT_STREQ(vhu_request_to_string(VHU_REQ_GET_FEATURES), "GET_FEATURES");
	ASSERT_STREQ(vhu_request_to_string(VHU_REQ_SET_VRING_ADDR), "SET_VRING_ADDR");
	ASSERT_STREQ(vhu_request_to_string(VHU_REQ_GET_STATUS), "GET_STATUS");
	ASSERT_STREQ(vhu_request_to_string(0), "UNKNOWN");
	ASSERT_STREQ(vhu_request_to_string(1000), "UNKNOWN");
}

TEST_MAIN()
