/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the vhost-user back-end's state save and restore (vhu_backend_save/_restore/
 * _resume, docs/upgrade.md "The vhost-user back-end's part"): our own front-end sets a back-end
 * up (memory, rings started and enabled, features and protocol features acked, optionally the
 * dirty log), the back-end is saved into a record, the record goes through a sealed memfd and
 * is restored into a second back-end, which then serves the same connection: the front-end's
 * next requests (GET_VRING_BASE, SET_VRING_ENABLE, a new SET_MEM_TABLE) are answered by it, at
 * the ring indices the first one stopped at, and nothing was sent to the front-end in between.
 * Refused records (another schema, another CID, an fd of the wrong kind) create nothing, leak
 * no fd, and leave the saved back-end to resume. Crash survival (vhu_backend_snapshot,
 * vhu_backend_resume_adopted): a snapshot stops nothing, the change hook runs before each
 * reply, and an adopting back-end starts each split ring at the used index in guest memory,
 * signals each call eventfd once, and refuses a running packed ring.
 */
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "fakedev.h"
#include "fdutil.h"
#include "test.h"
#include "util/macros.h"
#include "util/rec.h"
#include "vring/dirty_log.h"
#include "vhost_user/frontend.h"
#include "vhost_user/msg.h"

/* A back-end served by a thread until asked to stop (between two messages) or the end. */
struct srv {
	struct vhu_backend *b;
	struct fakedev *dev;
	pthread_t thread;
	int stop; /* eventfd: stop serving */
	int result;
};

static void *srv_main(void *arg)
{
	struct srv *s = arg;

	for (;;) {
		struct pollfd p[2] = { { .fd = vhu_backend_fd(s->b), .events = POLLIN },
				       { .fd = s->stop, .events = POLLIN } };
		int r = poll(p, 2, 10000);

		if (r <= 0) {
			s->result = -ETIMEDOUT;
			break;
		}
		if (p[1].revents)
			break;
		r = vhu_backend_process(s->b);
		if (r < 0) {
			s->result = r;
			break;
		}
	}
	return NULL;
}

static void srv_run(struct srv *s)
{
	s->result = 0;
	s->stop = eventfd(0, EFD_CLOEXEC);
	ASSERT_GE(s->stop, 0);
	ASSERT_OK(-pthread_create(&s->thread, NULL, srv_main, s));
}

/* Stops the serving thread between two messages; the back-end is the caller's again. */
static int srv_pause(struct srv *s)
{
	uint64_t one = 1;

	ASSERT_EQ(write(s->stop, &one, 8), 8);
	pthread_join(s->thread, NULL);
	close(s->stop);
	return s->result;
}

static void backend_cfg(struct vhu_backend_config *cfg)
{
	vhu_backend_config_init(cfg);
	cfg->guest_cid = 0xabcdef;
}

/* The record of b's state (kind REC_KIND_VHOST_USER) in a sealed memfd, and its fds. */
struct saved {
	int memfd;
	int fds[32];
	size_t nfds;
};

static void save(struct vhu_backend *b, struct saved *sv)
{
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;

	rec_writer_init(&w, REC_KIND_VHOST_USER, 1);
	ASSERT_OK(vhu_backend_save(b, &w));
	ASSERT_OK(rec_writer_finish(&w, &buf, &len));
	ASSERT_OK(rec_memfd(buf, len, "vhu-test", &sv->memfd));
	ASSERT_TRUE(w.nfds <= ARRAY_SIZE(sv->fds));
	memcpy(sv->fds, w.fds, w.nfds * sizeof(int)); /* b's own numbers, borrowed */
	sv->nfds = w.nfds;
	rec_writer_free(&w);
}

/* vhu_backend_restore() of the record with fds (which may differ from sv's), whole-checked. */
static int restore(const struct saved *sv, const int *fds, const struct vhu_backend_config *cfg,
		   struct fakedev *dev, struct vhu_backend **ret)
{
	struct rec_doc doc;
	struct rec_reader r;
	const uint8_t *buf;
	size_t len;
	int err;

	ASSERT_OK(rec_map_fd(sv->memfd, &buf, &len));
	err = rec_open(&doc, buf, len, REC_KIND_VHOST_USER, 1, 1, fds, sv->nfds);
	if (err == 0) {
		rec_root(&doc, &r, "vhost-user");
		err = vhu_backend_restore(&r, cfg, &fakedev_ops, dev, ret);
		if (err == 0) {
			err = rec_check_fds_claimed(&doc);
			if (err < 0)
				vhu_backend_free(*ret);
		}
		if (err < 0)
			printf("# refused: %s\n", rec_error(&doc));
		rec_doc_fini(&doc);
	}
	rec_unmap(buf, len);
	return err;
}

/* Index in sv->fds of fd number fd of the saved back-end. */
static size_t fd_slot(const struct saved *sv, int fd)
{
	for (size_t i = 0; i < sv->nfds; i++)
		if (sv->fds[i] == fd)
			return i;
	ASSERT_TRUE(false);
	return 0;
}

static bool nothing_to_read(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 0;
}

/* A front-end that has set up a back-end served by s (its device dev): features acked, memory,
 * rings started and enabled. */
static struct vhu_front *pair_up(struct srv *s, struct fakedev *dev,
				 const struct vhu_backend_config *bcfg, uint64_t features)
{
	struct vhu_front_config fcfg;
	struct vhu_front *f = NULL;
	int sp[2];

	vhu_front_config_init(&fcfg);
	if (features)
		fcfg.features = features;
	fakedev_init(dev);
	s->dev = dev;
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp));
	ASSERT_OK(vhu_backend_new(sp[1], bcfg, &fakedev_ops, dev, &s->b));
	ASSERT_OK(vhu_front_new(sp[0], &fcfg, &f));
	srv_run(s);
	ASSERT_OK(vhu_front_init(f));
	ASSERT_OK(vhu_front_start(f));
	return f;
}

/*
 * The hand-over with the front-end's features (packed or split rings) and, with log, the
 * dirty log on: set up, save, restore, go on with the second back-end.
 */
static void hand_over(uint64_t features, bool log)
{
	struct vhu_backend_config bcfg;
	struct fakedev dev1, dev2;
	struct srv s1, s2 = { .dev = &dev2 };
	struct vhu_front *f;
	struct vhu_backend *b2 = NULL;
	struct saved sv;
	bool packed = features & VHU_BIT(VHU_F_RING_PACKED);
	/* Where the first device stopped (packed: the wrap counter set in bit 15). */
	uint16_t base[2] = { packed ? 0x8000 | 5 : 517, packed ? 7 : 65530 };
	uint16_t got;
	char evlog[512];
	int before = fd_count();

	backend_cfg(&bcfg);
	fakedev_init(&dev2);
	f = pair_up(&s1, &dev1, &bcfg, features);
	if (log) {
		ASSERT_OK(vhu_front_set_log_base(f, 0));
		ASSERT_OK(vhu_front_set_logging(f, true));
	}
	ASSERT_OK(srv_pause(&s1));
	ASSERT_TRUE(vhu_backend_queue_running(s1.b, 0) && vhu_backend_queue_running(s1.b, 1));
	ASSERT_EQ_U64(vhu_backend_protocol_features(s1.b), vhu_front_protocol_features(f));
	fakedev_take_log(&dev1, evlog, sizeof(evlog));

	/* Save: the first device stops its rings where it is. */
	dev1.stop_ret[0] = base[0];
	dev1.stop_ret[1] = base[1];
	save(s1.b, &sv);
	fakedev_take_log(&dev1, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "stop0 stop1");
	ASSERT_ERR(vhu_backend_process(s1.b), EBUSY);

	ASSERT_OK(restore(&sv, sv.fds, &bcfg, &dev2, &b2));
	close(sv.memfd);
	fakedev_take_log(&dev2, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, ""); /* frozen: the device is told nothing yet */
	/* The old back-end goes; its fds were duplicated, the connection stays open. */
	vhu_backend_free(s1.b);
	ASSERT_OK(vhu_backend_resume(b2));
	fakedev_take_log(&dev2, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "feat memnew start0 start1");
	ASSERT_EQ_U64(dev2.features, vhu_front_features(f) |
					      (log ? VHU_BIT(VHU_F_LOG_ALL) : 0));
	ASSERT_EQ_U64(vhu_backend_protocol_features(b2), vhu_front_protocol_features(f));
	for (unsigned q = 0; q < 2; q++) {
		const struct vhu_front_ring *fr = vhu_front_ring(f, q);

		ASSERT_EQ(dev2.info[q].last_avail_idx, base[q]);
		ASSERT_EQ(dev2.info[q].num, fr->num);
		ASSERT_TRUE(same_eventfd(fr->kick_fd, dev2.info[q].kick_fd));
		ASSERT_TRUE(same_eventfd(dev2.info[q].call_fd, fr->call_fd));
		/* The same ring memory, through the new back-end's own mapping. */
		((uint8_t *)fr->desc)[3] = (uint8_t)(0x40 + q);
		ASSERT_EQ(((uint8_t *)dev2.info[q].desc)[3], 0x40 + q);
	}
	if (log) {
		const struct vring_log *l = vhu_backend_log(b2);
		uint64_t lsize = 0;
		const uint8_t *bits = vhu_front_log(f, &lsize);

		ASSERT_TRUE(l->active && l->size == lsize);
		/* A page the new back-end marks is the front-end's bit. */
		vring_log_mark_gpa((struct vring_log *)l, 5 * VRING_LOG_PAGE, 1);
		ASSERT_EQ(bits[0], 1u << 5);
	}
	/* Nothing was sent to the front-end: no message replayed. */
	ASSERT_TRUE(nothing_to_read(vhu_front_fd(f)));

	/* The front-end goes on with the restored back-end. */
	s2.b = b2;
	srv_run(&s2);
	/* Ring 0 disabled and enabled again: stopped and restarted where the device was. */
	pthread_mutex_lock(&dev2.lock);
	dev2.stop_ret[0] = (uint16_t)(base[0] + 3);
	dev2.stop_ret[1] = (uint16_t)(base[1] + 2);
	pthread_mutex_unlock(&dev2.lock);
	ASSERT_OK(vhu_front_enable_ring(f, 0, false));
	ASSERT_OK(vhu_front_enable_ring(f, 0, true));
	/* A new memory table: every running ring stops, the map is replaced, they restart. */
	ASSERT_OK(vhu_front_set_mem_table(f));
	fakedev_take_log(&dev2, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "stop0 start0 stop0 stop1 memchg memnew start0 start1");
	ASSERT_EQ(dev2.info[0].last_avail_idx, (uint16_t)(base[0] + 3));
	ASSERT_EQ(dev2.info[1].last_avail_idx, (uint16_t)(base[1] + 2));
	ASSERT_TRUE(dev2.mem == vhu_backend_mem(b2));
	/* GET_VRING_BASE answers the restored device's index (packed: used half too). */
	ASSERT_OK(vhu_front_get_vring_base(f, 1, &got));
	ASSERT_EQ(got, (uint16_t)(base[1] + 2));
	ASSERT_OK(vhu_front_get_vring_base(f, 0, &got));
	ASSERT_EQ(got, (uint16_t)(base[0] + 3));
	fakedev_take_log(&dev2, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "stop1 stop0");

	vhu_front_free(f);
	pthread_join(s2.thread, NULL);
	close(s2.stop);
	ASSERT_ERR(s2.result, ECONNRESET);
	vhu_backend_free(b2);
	ASSERT_EQ(fd_count(), before);
}

TEST(split_rings_move_to_a_second_backend)
{
	hand_over(VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC) |
			  VHU_BIT(VHU_VSOCK_F_SEQPACKET),
		  false);
}

TEST(packed_rings_and_the_dirty_log_move_to_a_second_backend)
{
	hand_over(VHU_BIT(VHU_F_RING_PACKED) | VHU_BIT(VHU_F_EVENT_IDX) |
			  VHU_BIT(VHU_VSOCK_F_SEQPACKET),
		  true);
}

/* Refusals: nothing created or leaked, and the saved back-end resumes and serves on. */
TEST(refused_records_leave_the_saved_backend_to_resume)
{
	struct vhu_backend_config bcfg, other;
	struct fakedev dev1, dev2;
	struct srv s1;
	struct vhu_front *f;
	struct vhu_backend *b2 = NULL;
	struct saved sv;
	int fds[32], pipefd[2], evfd, before = fd_count(), mid;
	char evlog[512];
	uint16_t got;

	backend_cfg(&bcfg);
	fakedev_init(&dev2);
	f = pair_up(&s1, &dev1, &bcfg, 0);
	ASSERT_OK(srv_pause(&s1));
	dev1.stop_ret[0] = 11;
	dev1.stop_ret[1] = 12;
	save(s1.b, &sv);
	ASSERT_OK(pipe2(pipefd, O_CLOEXEC));
	evfd = eventfd(0, EFD_CLOEXEC);
	mid = fd_count();

	/* Another guest CID. */
	other = bcfg;
	other.guest_cid = 0xabcdee;
	ASSERT_ERR(restore(&sv, sv.fds, &other, &dev2, &b2), EINVAL);
	/* A configuration that offers less than the VMM acked (no SEQPACKET). */
	other = bcfg;
	other.features &= ~VHU_BIT(VHU_VSOCK_F_SEQPACKET);
	ASSERT_ERR(restore(&sv, sv.fds, &other, &dev2, &b2), EBADMSG);
	/* A pipe where a kick eventfd is expected. */
	memcpy(fds, sv.fds, sizeof(fds));
	fds[fd_slot(&sv, dev1.info[0].kick_fd)] = pipefd[0];
	ASSERT_ERR(restore(&sv, fds, &bcfg, &dev2, &b2), EBADMSG);
	/* An eventfd where the connection (fd 0 of the record) or a region (fd 1) is expected. */
	memcpy(fds, sv.fds, sizeof(fds));
	fds[0] = evfd;
	ASSERT_ERR(restore(&sv, fds, &bcfg, &dev2, &b2), EBADMSG);
	memcpy(fds, sv.fds, sizeof(fds));
	fds[1] = evfd;
	ASSERT_ERR(restore(&sv, fds, &bcfg, &dev2, &b2), EBADMSG);
	/* A schema this binary does not know (the first item of the body is the schema). */
	{
		const uint8_t *buf;
		uint8_t *copy;
		size_t len;
		struct saved sv2 = sv;
		uint32_t two = 2;

		ASSERT_OK(rec_map_fd(sv.memfd, &buf, &len));
		copy = malloc(len);
		ASSERT_TRUE(copy != NULL);
		memcpy(copy, buf, len);
		rec_unmap(buf, len);
		ASSERT_EQ(copy[REC_HDR_SIZE], 1); /* tag 1 */
		memcpy(copy + REC_HDR_SIZE + 8, &two, 4);
		rec_reseal(copy, len);
		ASSERT_OK(rec_memfd(copy, len, "vhu-test2", &sv2.memfd));
		free(copy);
		ASSERT_ERR(restore(&sv2, sv.fds, &bcfg, &dev2, &b2), EPROTONOSUPPORT);
		close(sv2.memfd);
	}
	ASSERT_EQ(fd_count(), mid);
	fakedev_take_log(&dev2, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "");
	close(pipefd[0]);
	close(pipefd[1]);
	close(evfd);
	close(sv.memfd);

	/* The saved back-end resumes where its device stopped and serves the front-end. */
	fakedev_take_log(&dev1, evlog, sizeof(evlog));
	ASSERT_OK(vhu_backend_resume(s1.b));
	fakedev_take_log(&dev1, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, "start0 start1");
	ASSERT_EQ(dev1.info[0].last_avail_idx, 11);
	ASSERT_EQ(dev1.info[1].last_avail_idx, 12);
	srv_run(&s1);
	dev1.stop_ret[1] = 13;
	ASSERT_OK(vhu_front_get_vring_base(f, 1, &got));
	ASSERT_EQ(got, 13);
	vhu_front_free(f);
	pthread_join(s1.thread, NULL);
	close(s1.stop);
	ASSERT_ERR(s1.result, ECONNRESET);
	vhu_backend_free(s1.b);
	ASSERT_EQ(fd_count(), before);
}

/* A snapshot of b (vhu_backend_snapshot: nothing stopped) as save() makes a record. */
static void snap(struct vhu_backend *b, struct saved *sv)
{
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;

	rec_writer_init(&w, REC_KIND_VHOST_USER, 1);
	ASSERT_OK(vhu_backend_snapshot(b, &w));
	ASSERT_OK(rec_writer_finish(&w, &buf, &len));
	ASSERT_OK(rec_memfd(buf, len, "vhu-test", &sv->memfd));
	ASSERT_TRUE(w.nfds <= ARRAY_SIZE(sv->fds));
	memcpy(sv->fds, w.fds, w.nfds * sizeof(int));
	sv->nfds = w.nfds;
	rec_writer_free(&w);
}

static void count_change(void *arg)
{
	(*(int *)arg)++;
}

/* A process that died: its snapshot adopted by a second back-end over the same connection. */
static void adopt(uint64_t features)
{
	struct vhu_backend_config bcfg;
	struct fakedev dev1, dev2;
	struct srv s1;
	struct vhu_front *f;
	struct vhu_backend *b2 = NULL;
	struct saved sv;
	bool packed = features & VHU_BIT(VHU_F_RING_PACKED);
	const uint16_t used[2] = { 40, 65535 };
	char evlog[512];
	int changes = 0, before = fd_count();
	uint64_t v;

	backend_cfg(&bcfg);
	fakedev_init(&dev2);
	f = pair_up(&s1, &dev1, &bcfg, features);
	ASSERT_OK(srv_pause(&s1));
	/* The change hook runs for a message that changes the configuration, not for a question. */
	vhu_backend_set_change_hook(s1.b, count_change, &changes);
	srv_run(&s1);
	ASSERT_OK(vhu_front_enable_ring(f, 0, true));
	ASSERT_OK(vhu_front_get_config(f, 0, 8, &v));
	ASSERT_OK(srv_pause(&s1));
	ASSERT_EQ(changes, 1);
	fakedev_take_log(&dev1, evlog, sizeof(evlog));
	/* What the dead device completed, in guest memory (split: struct vring_used's idx). */
	for (unsigned q = 0; q < 2 && !packed; q++)
		((volatile uint16_t *)vhu_front_ring(f, q)->used)[1] = htole16(used[q]);
	snap(s1.b, &sv);
	fakedev_take_log(&dev1, evlog, sizeof(evlog));
	ASSERT_STREQ(evlog, ""); /* nothing stopped */
	ASSERT_TRUE(vhu_backend_queue_running(s1.b, 0) && vhu_backend_queue_running(s1.b, 1));

	ASSERT_OK(restore(&sv, sv.fds, &bcfg, &dev2, &b2));
	close(sv.memfd);
	vhu_backend_free(s1.b); /* (the dead process's copies) */
	for (unsigned q = 0; q < 2; q++)
		(void)!read(vhu_front_ring(f, q)->call_fd, &v, 8);
	if (packed) {
		ASSERT_ERR(vhu_backend_resume_adopted(b2), EOPNOTSUPP);
		ASSERT_TRUE(strstr(vhu_backend_error(b2), "packed ring cannot be adopted") != NULL);
		fakedev_take_log(&dev2, evlog, sizeof(evlog));
		ASSERT_STREQ(evlog, ""); /* the device was told nothing */
	} else {
		ASSERT_OK(vhu_backend_resume_adopted(b2));
		fakedev_take_log(&dev2, evlog, sizeof(evlog));
		ASSERT_STREQ(evlog, "feat memnew start0 start1");
		for (unsigned q = 0; q < 2; q++) {
			ASSERT_EQ(dev2.info[q].last_avail_idx, used[q]);
			/* One interrupt per running ring. */
			ASSERT_EQ(read(vhu_front_ring(f, q)->call_fd, &v, 8), 8);
			ASSERT_EQ_U64(v, 1);
		}
	}
	ASSERT_TRUE(nothing_to_read(vhu_front_fd(f)));
	vhu_front_free(f);
	vhu_backend_free(b2);
	ASSERT_EQ(fd_count(), before);
}

TEST(an_adopted_snapshot_starts_split_rings_at_the_used_index)
{
	adopt(VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_INDIRECT_DESC));
}

TEST(an_adopted_snapshot_refuses_a_running_packed_ring)
{
	adopt(VHU_BIT(VHU_F_RING_PACKED) | VHU_BIT(VHU_F_EVENT_IDX));
}

TEST_MAIN()
