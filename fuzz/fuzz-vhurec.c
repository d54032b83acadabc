/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the vhost-user back-end's record (docs/upgrade.md, "The vhost-user
 * back-end's part"): vhu_backend_restore() reading a record of kind REC_KIND_VHOST_USER with
 * the fds that came with it.
 *
 * Input: byte 0 bit 0: set the header's length, fd count and checksum right (so that the
 * decoder sees mutated bodies rather than stopping at the checksum); bytes 1..16: the kind of
 * each fd that comes with the record (mod 5: an eventfd, a 1 MiB memfd, a connected Unix
 * stream socket, a pipe, a listening Unix stream socket, all real, so that the record's fd
 * checks run); then the record itself. As many fds come as the header names, at most 16.
 *
 * Invariants: a refused record creates nothing, closes none of our fds and leaves no fd of its
 * own; an accepted one gives a back-end whose resume succeeds and starts only rings whose every
 * part lies in the memory (the fake device touches their first and last bytes), which can be
 * saved again,
 * and whose record a second restore accepts; nothing crashes, hangs or leaks.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz-input.h"
#include "fuzz-rec.h"
#include "util/log.h"
#include "util/rec.h"
#include "vhost_user/backend.h"

#define FZ_FDS 16
#define FZ_MEMFD_SIZE (1u << 20)

static volatile uint8_t sink;

static void touch(const void *p, size_t len)
{
	sink ^= ((const volatile uint8_t *)p)[0];
	sink ^= ((const volatile uint8_t *)p)[len - 1];
}

/* A device that reads every part of the ring it is handed, as a real one would. */
static int fz_queue_start(void *opaque, unsigned q, const struct vhu_vring_info *info)
{
	bool packed = info->features & VHU_BIT(VHU_F_RING_PACKED);

	FZ_CHECK(q < VHU_NUM_QUEUES && info->num > 0);
	touch(info->desc, 16u * info->num);
	touch(info->avail, packed ? 4 : 6 + 2u * info->num);
	touch(info->used, packed ? 4 : 6 + 8u * info->num);
	return 0;
}

static uint16_t fz_queue_stop(void *opaque, unsigned q)
{
	return 0;
}

static const struct vhu_backend_ops fz_ops = {
	.queue_start = fz_queue_start,
	.queue_stop = fz_queue_stop,
};

/* fds[i] of the kind k, and the other end in *peer (-1 if none). */
static int fz_fd(unsigned k, int *peer)
{
	int sv[2], fd;
	sa_family_t fam = AF_UNIX;

	*peer = -1;
	switch (k % 5) {
	case 0:
		fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		break;
	case 1:
		fd = memfd_create("fuzz-vhurec", MFD_CLOEXEC);
		FZ_CHECK(fd >= 0 && ftruncate(fd, FZ_MEMFD_SIZE) == 0);
		break;
	case 2:
		FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
		*peer = sv[1];
		fd = sv[0];
		break;
	case 3:
		FZ_CHECK(pipe2(sv, O_CLOEXEC) == 0);
		*peer = sv[1];
		fd = sv[0];
		break;
	default:
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		FZ_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&fam, sizeof(fam)) == 0 &&
			 listen(fd, 1) == 0);
		break;
	}
	FZ_CHECK(fd >= 0);
	return fd;
}

static void fz_config(struct vhu_backend_config *cfg)
{
	vhu_backend_config_init(cfg);
	cfg->features = VHU_BACKEND_OPTIONAL_FEATURES;
	cfg->offer_mq = true;
	cfg->guest_cid = 3;
}

/* Restores buf (len bytes) with fds. Returns 0 and *ret, or the refusal. */
static int fz_restore(const uint8_t *buf, size_t len, const int *fds, size_t nfds,
		      struct vhu_backend **ret)
{
	struct vhu_backend_config cfg;
	struct rec_doc doc;
	struct rec_reader r;
	int err;

	fz_config(&cfg);
	err = rec_open(&doc, buf, len, REC_KIND_VHOST_USER, 1, 1, fds, nfds);
	if (err < 0)
		return err;
	rec_root(&doc, &r, "vhost-user");
	err = vhu_backend_restore(&r, &cfg, &fz_ops, NULL, ret);
	if (err == 0) {
		err = rec_check_fds_claimed(&doc);
		if (err < 0)
			vhu_backend_free(*ret);
	}
	rec_doc_fini(&doc);
	return err;
}

/* b saves again and a second back-end restores that record and resumes. */
static void resave(struct vhu_backend *b)
{
	struct vhu_backend *b2 = NULL;
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;

	rec_writer_init(&w, REC_KIND_VHOST_USER, 1);
	FZ_CHECK(vhu_backend_save(b, &w) == 0);
	FZ_CHECK(rec_writer_finish(&w, &buf, &len) == 0);
	FZ_CHECK(fz_restore(buf, len, w.fds, w.nfds, &b2) == 0);
	FZ_CHECK(vhu_backend_resume(b2) == 0);
	vhu_backend_free(b2);
	rec_writer_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[FZ_FDS], peers[FZ_FDS], before;
	struct vhu_backend *b = NULL;
	size_t len, nfds;
	uint8_t *copy;
	int r;

	log_set_level(LOG_LVL_ERROR);
	if (size < 1 + FZ_FDS)
		return 0;
	before = fz_count_fds();
	copy = fz_record_input(data, size, FZ_FDS, &len, &nfds);
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fz_fd(data[1 + i], &peers[i]);
	r = fz_restore(copy, len, fds, nfds, &b);
	if (r == 0) {
		FZ_CHECK(b != NULL);
		/* The restore checked every ring that starts now, and the device accepts all. */
		FZ_CHECK(vhu_backend_resume(b) == 0);
		resave(b);
		vhu_backend_free(b);
	} else {
		FZ_CHECK(r == -EBADMSG || r == -EPROTONOSUPPORT || r == -E2BIG || r == -ENOMEM ||
			 r == -EINVAL || r == -ENOSPC || r == -EMFILE);
	}
	for (size_t i = 0; i < nfds; i++) {
		FZ_CHECK(fcntl(fds[i], F_GETFD) >= 0);
		close(fds[i]);
		if (peers[i] >= 0)
			close(peers[i]);
	}
	free(copy);
	FZ_CHECK(fz_count_fds() == before);
	return 0;
}
