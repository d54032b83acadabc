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

#include "fuzz-vhu.h"

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
