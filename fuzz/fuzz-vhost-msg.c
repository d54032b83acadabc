/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the vhost-user back-end: the input is a front-end byte stream, cut into small
 * writes that may carry fds, fed through a socketpair into a struct vhu_backend (systemd
 * fuzz-varlink style). A helper thread writes the chunks and drains the replies; this thread
 * calls vhu_backend_process() until the connection ends. The fake device reads the used index
 * and touches the first and last byte of every ring part it is handed, so a translation outside
 * guest memory crashes here instead of in the daemon. Nothing may crash, hang or leak an fd,
 * whatever the input; a leaked fd aborts.
 *
 * Input layout: a sequence of records
 *   byte 0       bits 0-4: chunk length - 1 (1..32 bytes follow)
 *                bits 5-6: fds to attach to the chunk (0..3)
 *                bit 7:    the fds are 1 MiB memfds (guest memory) instead of eventfds
 *   bytes 1..n   the chunk, written with one sendmsg
 * At most FUZZ_MAX_FDS fds are created per input; the stream ends with the input.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vhost_user/backend.h"

#define FUZZ_MAX_INPUT (64u << 10)
#define FUZZ_MAX_FDS 48
#define FUZZ_MEMFD_SIZE (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void touch(const void *p, size_t len)
{
	const volatile uint8_t *b = p;

	sink ^= b[0];
	sink ^= b[len - 1];
}

static int dev_queue_start(void *opaque, unsigned q, const struct vhu_vring_info *info)
{
	touch(info->desc, 16 * (size_t)info->num);
	touch(info->avail, 6 + 2 * (size_t)info->num);
	touch(info->used, 6 + 8 * (size_t)info->num);
	if (info->kick_fd >= 0 || info->call_fd >= 0)
		sink ^= 1;
	return 0;
}

static uint16_t dev_queue_stop(void *opaque, unsigned q)
{
	return (uint16_t)(q * 1000 + 7);
}

static const struct vhu_backend_ops dev_ops = {
	.queue_start = dev_queue_start,
	.queue_stop = dev_queue_stop,
};

struct feeder {
	int sock;
	const uint8_t *data;
	size_t size;
};

static int make_fd(bool memfd)
{
	int fd;

	if (!memfd)
		return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	fd = memfd_create("fuzz-guest", MFD_CLOEXEC);
	if (fd >= 0 && ftruncate(fd, FUZZ_MEMFD_SIZE) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void send_chunk(int sock, const uint8_t *p, size_t len, unsigned nfds, bool memfd,
		       int *fds_made)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 3)];
		struct cmsghdr a;
	} ctl;
	struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int fds[3];
	unsigned n = 0;

	while (n < nfds && *fds_made < FUZZ_MAX_FDS) {
		fds[n] = make_fd(memfd);
		if (fds[n] < 0)
			break;
		n++;
		(*fds_made)++;
	}
	if (n > 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	}
	/* Blocking socket: waits while the back-end catches up; fails once it has hung up. */
	while (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0 && errno == EINTR)
		;
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* Drains whatever replies are readable (the back-end would block on a full socket otherwise). */
static bool drain(int sock)
{
	char buf[4096];
	ssize_t r;

	for (;;) {
		r = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
		if (r > 0)
			continue;
		if (r == 0)
			return false;
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
	}
}

static void *feeder_main(void *arg)
{
	struct feeder *fe = arg;
	size_t off = 0;
	int fds_made = 0;
	bool open = true;

	while (off < fe->size && open) {
		uint8_t ctl = fe->data[off++];
		size_t len = (ctl & 0x1f) + 1u;
		struct pollfd p = { .fd = fe->sock, .events = POLLIN | POLLOUT };

		if (len > fe->size - off)
			len = fe->size - off;
		if (len == 0)
			break;
		/* Wait until the chunk can go or replies need draining. */
		while (open && poll(&p, 1, 5000) > 0 && (p.revents & POLLIN) &&
		       !(p.revents & POLLOUT))
			open = drain(fe->sock);
		if (!open || (p.revents & (POLLHUP | POLLERR)))
			break;
		send_chunk(fe->sock, fe->data + off, len, (ctl >> 5) & 3, ctl & 0x80, &fds_made);
		open = open && drain(fe->sock);
		off += len;
	}
	shutdown(fe->sock, SHUT_WR);
	/* Drain until the back-end hangs up. */
	for (;;) {
		struct pollfd p = { .fd = fe->sock, .events = POLLIN };

		if (poll(&p, 1, 10000) <= 0 || !drain(fe->sock))
			break;
	}
	return NULL;
}

static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct vhu_backend_config cfg;
	struct vhu_backend *b = NULL;
	struct feeder fe = { .data = data, .size = size };
	pthread_t t;
	int sv[2], before;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	before = fd_count();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	vhu_backend_config_init(&cfg);
	cfg.guest_cid = 42;
	cfg.offer_mq = size & 1;
	cfg.msg_timeout_ms = 2000;
	if (vhu_backend_new(sv[1], &cfg, &dev_ops, NULL, &b) < 0)
		abort();
	fe.sock = sv[0];
	if (pthread_create(&t, NULL, feeder_main, &fe) != 0)
		abort();
	for (;;) {
		struct pollfd p = { .fd = vhu_backend_fd(b), .events = POLLIN };
		int r = poll(&p, 1, 10000);

		/* libFuzzer's timer interrupts system calls. */
		if (r < 0 && errno == EINTR)
			continue;
		/* The feeder always ends the stream, so the back-end always ends with an error. */
		if (r != 1)
			abort();
		if (vhu_backend_process(b) < 0)
			break;
	}
	if (vhu_backend_error(b)[0] == 0)
		abort(); /* a failed connection always says why */
	vhu_backend_free(b);
	pthread_join(t, NULL);
	close(sv[0]);
	if (fd_count() != before)
		abort();
	return 0;
}
