/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the device record (docs/upgrade.md, "The device's part"): uvsock_dev_restore
 * of <uvsock/device.h> reading a record of kind REC_KIND_DEVICE with the fds that came with it.
 *
 * Input: byte 0 bit 0: set the header's length, fd count and checksum right (so that the
 * decoders see mutated bodies rather than stopping at the checksum); bytes 1..8: the kind of
 * each fd that comes with the record (mod 5: a listening STREAM, a listening SEQPACKET, an
 * unbound DGRAM, a connected STREAM, a connected SEQPACKET Unix socket, all real, so that the
 * record's fd checks run); then the record itself. As many fds come as the header names, at
 * most 8.
 *
 * Invariants: a refused record creates no device and leaves every fd we passed open (the
 * device keeps duplicates only); an accepted one gives a device that can be saved again, and
 * that record is accepted by a second restore; nothing crashes, hangs or leaks, and no file
 * appears in (or is removed from) the device's directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "fuzz-input.h"
#include "fuzz-rec.h"
#include "util/log.h"
#include "util/rec.h"

#define FZ_FDS 8

static char fz_dir[64];
static char fz_uds[96];

static void fz_cleanup(void)
{
	if (fz_dir[0])
		(void)rmdir(fz_dir);
}

static void init_once(void)
{
	static bool done;

	if (done)
		return;
	done = true;
	log_set_level(LOG_LVL_ERROR);
	snprintf(fz_dir, sizeof(fz_dir), "/tmp/uvsock-fuzz-XXXXXX");
	FZ_CHECK(mkdtemp(fz_dir) != NULL);
	snprintf(fz_uds, sizeof(fz_uds), "%s/vm.vsock", fz_dir);
	atexit(fz_cleanup);
}

/* An autobound (abstract) Unix socket of type, listening if asked. */
static int fz_listening(int type)
{
	sa_family_t fam = AF_UNIX;
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	FZ_CHECK(fd >= 0);
	FZ_CHECK(bind(fd, (struct sockaddr *)&fam, sizeof(fam)) == 0);
	FZ_CHECK(listen(fd, 4) == 0);
	return fd;
}

/* fds[i] of the kind k, and the other end of a pair in *peer (-1 if none). */
static int fz_fd(unsigned k, int *peer)
{
	int sv[2], fd;

	*peer = -1;
	switch (k % 5) {
	case 0:
		return fz_listening(SOCK_STREAM);
	case 1:
		return fz_listening(SOCK_SEQPACKET);
	case 2:
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		FZ_CHECK(fd >= 0);
		return fd;
	default:
		FZ_CHECK(socketpair(AF_UNIX, (k % 5 == 3 ? SOCK_STREAM : SOCK_SEQPACKET) |
						     SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
		*peer = sv[1];
		return sv[0];
	}
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void fz_config(struct uvsock_dev_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
	cfg->guest_cid = 3;
	cfg->uds_path = fz_uds;
	cfg->max_conns = 16;
	cfg->flags = UVSOCK_DEV_EXTERNAL_LOOP;
}

/* d saves again and a second device restores that record. */
static void resave(struct uvsock_dev *d)
{
	struct uvsock_dev_config cfg;
	struct uvsock_dev *d2 = NULL;
	int memfd, *fds = NULL;
	size_t nfds;

	fz_config(&cfg);
	FZ_CHECK(uvsock_dev_save(d, &memfd, &fds, &nfds) == 0);
	FZ_CHECK(uvsock_dev_restore(&cfg, memfd, fds, nfds, &d2) == 0);
	/* Both hold the same sockets: the second is freed first, leaving them to nothing. */
	uvsock_dev_free(d2);
	close(memfd);
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	free(fds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[FZ_FDS], peers[FZ_FDS];
	struct uvsock_dev_config cfg;
	struct uvsock_dev *d = NULL;
	size_t len, nfds;
	uint8_t *copy;
	int memfd, r;

	init_once();
	if (size < 1 + FZ_FDS)
		return 0;
	copy = fz_record_input(data, size, FZ_FDS, &len, &nfds);
	if (len == 0 || rec_memfd(copy, len, "fuzz-devrec", &memfd) < 0) {
		free(copy);
		return 0;
	}
	free(copy);
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fz_fd(data[1 + i], &peers[i]);
	fz_config(&cfg);
	r = uvsock_dev_restore(&cfg, memfd, fds, nfds, &d);
	if (r == 0) {
		FZ_CHECK(d != NULL);
		resave(d);
		uvsock_dev_free(d);
	} else {
		FZ_CHECK(d == NULL);
		FZ_CHECK(r == -EBADMSG || r == -EPROTONOSUPPORT || r == -E2BIG || r == -ENOMEM ||
			 r == -EMFILE);
	}
	for (size_t i = 0; i < nfds; i++) {
		FZ_CHECK(fd_open(fds[i]));
		close(fds[i]);
		if (peers[i] >= 0)
			close(peers[i]);
	}
	close(memfd);
	/* Nothing was bound or left in the directory. */
	FZ_CHECK(access(fz_uds, F_OK) < 0 && errno == ENOENT);
	return 0;
}
