/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the state a vhost-user front-end loads into a device with
 * VHOST_USER_PROTOCOL_F_DEVICE_STATE (docs/upgrade.md, "VHOST_USER_PROTOCOL_F_DEVICE_STATE";
 * src/device/vhu_state.c): the bytes come through a pipe, as from the front-end, and
 * CHECK_DEVICE_STATE says whether they were taken.
 *
 * Input: byte 0 bit 0: set the record header's length and checksum right (fuzz-rec.h), so that
 * the decoder sees mutated bodies rather than stopping at the checksum; then the state, at most
 * 60,000 bytes (the rest is cut: it must fit a pipe's buffer, since this target writes before
 * the device reads).
 *
 * Invariants: nothing crashes, hangs or leaks an fd; a state is taken or refused as a whole; a
 * taken state applied to a device without a session changes nothing; and a state the device
 * saves is taken by the same device again.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/vhu_state.h"
#include "device/vsock_dev.h"
#include "fuzz-input.h"
#include "fuzz-rec.h"
#include "util/log.h"
#include "util/rec.h"

#define FZ_STATE_MAX 60000u

static char fz_dir[64];
static struct vsock_dev *fz_dev;
static struct vhu_state *fz_st;

static void fz_cleanup(void)
{
	vhu_state_free(fz_st);
	vsock_dev_free(fz_dev);
	if (fz_dir[0])
		(void)rmdir(fz_dir);
}

static void init_once(void)
{
	static bool done;
	static char uds[96];
	struct vsock_dev_config cfg = { .guest_cid = 3, .buf_alloc = 65536, .queue_size_max = 256 };

	if (done)
		return;
	done = true;
	log_set_level(LOG_LVL_ERROR);
	snprintf(fz_dir, sizeof(fz_dir), "/tmp/uvsock-fuzz-XXXXXX");
	FZ_CHECK(mkdtemp(fz_dir) != NULL);
	snprintf(uds, sizeof(uds), "%s/vm.vsock", fz_dir);
	cfg.uds_path = uds;
	FZ_CHECK(vsock_dev_new(NULL, &cfg, &fz_dev) == 0);
	fz_st = vhu_state_new(fz_dev);
	FZ_CHECK(fz_st != NULL);
	atexit(fz_cleanup);
}

/* Loads len bytes through a pipe; CHECK_DEVICE_STATE's answer. */
static int load(const uint8_t *p, size_t len)
{
	int fds[2];

	FZ_CHECK(pipe2(fds, O_CLOEXEC) == 0);
	FZ_CHECK(write(fds[1], p, len) == (ssize_t)len);
	close(fds[1]);
	FZ_CHECK(vhu_state_load(fz_st, fds[0]) == 0);
	return vhu_state_check(fz_st, 0);
}

/* The device's own state, saved through a pipe, into a malloc'd buffer. */
static uint8_t *save(size_t *ret_len)
{
	uint8_t *b = malloc(FZ_STATE_MAX);
	int fds[2];
	ssize_t n;

	FZ_CHECK(b != NULL);
	FZ_CHECK(pipe2(fds, O_CLOEXEC) == 0);
	FZ_CHECK(vhu_state_save(fz_st, fds[1], 0) == 0);
	FZ_CHECK(vhu_state_check(fz_st, 0) == 0);
	n = read(fds[0], b, FZ_STATE_MAX);
	FZ_CHECK(n > 0);
	FZ_CHECK(read(fds[0], b + n, FZ_STATE_MAX - (size_t)n) == 0); /* the device closed it */
	close(fds[0]);
	*ret_len = (size_t)n;
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t len, nfds;
	uint8_t *st, *own;
	int before, r;

	if (size < 1)
		return 0;
	init_once();
	before = fz_count_fds();
	st = fz_record_input(data, size, 0, &len, &nfds);
	if (len > FZ_STATE_MAX)
		len = FZ_STATE_MAX;
	r = load(st, len);
	FZ_CHECK(r <= 0);
	/* Taken or not, starting TX on a device with no session ends nothing and sends nothing. */
	vhu_state_tx_started(fz_st);
	free(st);

	own = save(&len);
	FZ_CHECK(load(own, len) == 0);
	vhu_state_tx_started(fz_st);
	free(own);
	vhu_state_reset(fz_st);
	FZ_CHECK(fz_count_fds() == before);
	return 0;
}
