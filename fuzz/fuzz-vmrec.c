/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for uvsockd's VM record (docs/upgrade.md, "A VM of uvsockd", record kind 4): the
 * reader the new process of a live upgrade runs on each record it is sent,
 * upgrade_vm_rec_read() (daemon/upgrade.c: header, version, checksum, the VM's configuration),
 * with a restore that does what uvsockd's does (daemon/vms.c, vm_restore): a device made to be
 * restored into, then dev_vhu_restore() (src/device/vhu.c: the glue's listener and flags, the
 * vhost-user back-end's part, the device's part with its sibling inbox and held packets).
 *
 * Input: byte 0 bit 0: set the header's length, fd count and checksum right (so that the
 * decoders see mutated bodies rather than stopping at the checksum); bytes 1..16: the kind of
 * each fd that comes with the record (mod 7: a listening STREAM, a listening SEQPACKET, an
 * unbound DGRAM, a connected STREAM and a connected SEQPACKET Unix socket, an eventfd, a 64 MiB
 * memfd, all real, so that the record's fd checks run); then the record itself. As many fds
 * come as the header names, at most 16.
 *
 * Invariants: a refused record says why and leaves every fd we passed open (what the restore
 * made, if the refusal came after it, is freed here as the new process would exit); an accepted one gives a VM that can be stopped and saved again as
 * the old process does (dev_vhu_stop, dev_vhu_save_device), and that record is accepted too;
 * nothing crashes, hangs or leaks, and no file appears in the VM's directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "device/vhu.h"
#include "device/vsock_dev.h"
#include "fuzz-input.h"
#include "fuzz-rec.h"
#include "upgrade.h"
#include "util/log.h"
#include "util/rec.h"

#define FZ_FDS 16
#define FZ_MEMFD_SIZE (64u << 20) /* sparse: as large as the guest memory the seeds name */

static char fz_dir[64];
static char fz_uds[96];
static char fz_sock[96];

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
	snprintf(fz_sock, sizeof(fz_sock), "%s/vm.sock", fz_dir);
	atexit(fz_cleanup);
}

/* fds[i] of the kind k, and the other end in *peer (-1 if none). */
static int fz_fd(unsigned k, int *peer)
{
	sa_family_t fam = AF_UNIX;
	int sv[2], fd;

	*peer = -1;
	switch (k % 7) {
	case 0:
	case 1:
		fd = socket(AF_UNIX, (k % 7 ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_CLOEXEC |
				     SOCK_NONBLOCK, 0);
		FZ_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&fam, sizeof(fam)) == 0 &&
			 listen(fd, 4) == 0);
		return fd;
	case 2:
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		FZ_CHECK(fd >= 0);
		return fd;
	case 3:
	case 4:
		FZ_CHECK(socketpair(AF_UNIX, (k % 7 == 3 ? SOCK_STREAM : SOCK_SEQPACKET) |
						     SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
		*peer = sv[1];
		return sv[0];
	case 5:
		fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		FZ_CHECK(fd >= 0);
		return fd;
	default:
		fd = memfd_create("fuzz-vmrec", MFD_CLOEXEC);
		FZ_CHECK(fd >= 0 && ftruncate(fd, FZ_MEMFD_SIZE) == 0);
		return fd;
	}
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* What a restore made (one VM). */
struct fz_vm {
	struct uvsockd_vm_config cfg;
	uint32_t max_conns;
	struct uvsock_dev *dev;
	struct dev_vhu *vhu;
};

/* upgrade_restore_fn: uvsockd's vm_restore, with this target's paths (nothing is bound). */
static int fz_restore(void *arg, const struct uvsockd_vm_config *v, uint32_t max_conns,
		      struct rec_reader *rr, char *err, size_t errlen)
{
	struct fz_vm *vm = arg;
	struct uvsock_dev_config dc = { .size = sizeof(dc) };
	int r;

	vm->cfg = *v;
	vm->max_conns = max_conns;
	dc.guest_cid = v->guest_cid;
	dc.uds_path = fz_uds;
	dc.buf_alloc = v->tx_buffer_size;
	dc.queue_size_max = v->queue_size;
	dc.max_conns = max_conns;
	dc.name = vm->cfg.name;
	dc.flags = v->ok_guest_port ? UVSOCK_DEV_OK_GUEST_PORT : 0;
	r = dev_vhu_new_device_frozen(&dc, &vm->dev);
	if (r < 0) {
		/* A configuration the device refuses (a buffer size, a queue size) */
		snprintf(err, errlen, "%s: cannot make its device: %s", v->name, strerror(-r));
		vm->dev = NULL;
		return r;
	}
	r = dev_vhu_restore(vsock_dev_of(vm->dev), rr, fz_sock, dc.queue_size_max, &vm->vhu);
	if (r < 0) {
		uvsock_dev_free(vm->dev);
		vm->dev = NULL;
		vm->vhu = NULL;
	}
	return r;
}

static void fz_vm_free(struct fz_vm *vm)
{
	dev_vhu_free(vm->vhu);
	uvsock_dev_free(vm->dev);
}

/* vm saves again, as the old process of an upgrade does, and that record is accepted. */
static void resave(struct fz_vm *vm)
{
	struct upgrade_vm uv = { .cfg = &vm->cfg, .max_conns = vm->max_conns,
				 .core = vsock_dev_of(vm->dev), .vhu = vm->vhu };
	struct dev_vhu_saved sv = { 0 };
	struct fz_vm vm2 = { 0 };
	struct rec_writer w;
	const uint8_t *buf;
	char why[400];
	size_t len;
	int r;

	upgrade_vm_rec_begin(&w, &uv);
	FZ_CHECK(dev_vhu_stop(vm->vhu, &w, &sv) == 0);
	FZ_CHECK(dev_vhu_save_device(vm->vhu, &w, &sv) == 0);
	rec_end(&w);
	FZ_CHECK(rec_writer_finish(&w, &buf, &len) == 0);
	r = upgrade_vm_rec_read(buf, len, (const int *)w.fds, w.nfds, fz_restore, &vm2, why,
				sizeof(why));
	if (r != 0) {
		fprintf(stderr, "fuzz-vmrec: a saved record was refused: %s\n", why);
		FZ_CHECK(r == 0);
	}
	fz_vm_free(&vm2);
	rec_writer_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[FZ_FDS], peers[FZ_FDS];
	struct fz_vm vm = { 0 };
	char why[400];
	size_t len, nfds;
	uint8_t *copy;
	int r;

	init_once();
	if (size < 1 + FZ_FDS)
		return 0;
	copy = fz_record_input(data, size, FZ_FDS, &len, &nfds);
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fz_fd(data[1 + i], &peers[i]);
	r = upgrade_vm_rec_read(copy, len, fds, nfds, fz_restore, &vm, why, sizeof(why));
	if (r == 0) {
		FZ_CHECK(vm.dev != NULL);
		resave(&vm);
		fz_vm_free(&vm);
	} else {
		/* Refused after the glue was restored (an fd no item names): what it made goes. */
		if (vm.dev)
			fz_vm_free(&vm);
		FZ_CHECK(why[0] != '\0');
	}
	free(copy);
	for (size_t i = 0; i < nfds; i++) {
		FZ_CHECK(fd_open(fds[i]));
		close(fds[i]);
		if (peers[i] >= 0)
			close(peers[i]);
	}
	/* Nothing was bound or left in the directory. */
	FZ_CHECK(access(fz_uds, F_OK) < 0 && errno == ENOENT);
	FZ_CHECK(access(fz_sock, F_OK) < 0 && errno == ENOENT);
	return 0;
}
