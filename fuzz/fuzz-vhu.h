/* SPDX-License-Identifier: MIT */
/*
 * What the fuzz targets of vhost-user back-end records share (fuzz-vhurec.c, fuzz-crashrec.c):
 * a device that touches the first and last byte of every ring part it is handed (a ring outside
 * the mapped memory is an ASan report), and the real fds of the kinds an input names for a
 * record (mod 5: an eventfd, a memfd of FZ_MEMFD_SIZE, a connected Unix stream socket, a pipe,
 * a listening Unix stream socket), so that the readers' fd checks run. Header-only, after
 * fuzz-input.h; the including target defines FZ_MEMFD_SIZE.
 */
#ifndef UVSOCK_FUZZ_VHU_H
#define UVSOCK_FUZZ_VHU_H

#include <fcntl.h>
#include <stdbool.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vhost_user/backend.h"

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

/* An fd of the kind k, and the other end in *peer (-1 if none). */
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
		fd = memfd_create("fuzz-vhu", MFD_CLOEXEC);
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

#endif
