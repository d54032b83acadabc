/* SPDX-License-Identifier: MIT */
/*
 * The VMM side of embedding the uvsock device (<uvsock/device.h>), plus a stand-in guest driver,
 * for examples/embed-device.c and its tests: guest RAM is a memfd the "VMM" maps; the two split
 * rings and the packet buffers are placed in it at fixed guest-physical addresses; the guest
 * side writes descriptors with libuvsock's driver-side ring code (src/vring/vring_drv.h) and
 * builds vsock packets byte by byte (src/vsock/hdr.h), as a guest kernel would. A real VMM has a
 * real guest instead of eg_send/eg_recv and passes what the guest driver programmed into its
 * virtio transport.
 *
 * Guest-physical layout (EG_RAM_SIZE bytes from address 0):
 *   0x000000  RX ring (queue 0)     0x010000  TX ring (queue 1)
 *   0x020000  RX buffers, EG_NRX x EG_RXBUF      0x080000  TX buffers, EG_NTX x EG_TXBUF
 *
 * External-loop devices (UVSOCK_DEV_EXTERNAL_LOOP): set loop_dev, and every wait of the guest
 * side runs eg_loop_once(), one iteration of the VMM's own poll() loop, which also runs the
 * device (the guest, the VMM loop and the device then share one thread).
 *
 * Context: one thread uses one struct eg_guest. Errors are returned as -errno.
 */
#ifndef UVSOCK_EXAMPLES_EMBED_GUEST_H
#define UVSOCK_EXAMPLES_EMBED_GUEST_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "vring/vring.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

#define EG_RAM_SIZE (4u << 20)
#define EG_QSIZE 128u
#define EG_NRX 64u
#define EG_RXBUF 4096u
#define EG_NTX 32u
#define EG_TXBUF (44u + 65536u)
#define EG_RING_GPA(q) ((uint64_t)(q) * 0x10000u)
#define EG_RX_GPA 0x20000u
#define EG_TX_GPA 0x80000u

struct eg_guest {
	int memfd;               /* guest RAM: the VMM created it and hands it to the device */
	uint8_t *ram;            /* the VMM's own mapping of guest RAM */
	int kick[2], call[2];    /* per queue: guest -> device, device -> guest eventfds */
	struct vring_drv *vq[2]; /* guest driver side of queues 0 (rx) and 1 (tx) */
	uint64_t features;
	uint32_t cid;
	bool txbusy[EG_NTX];
	struct uvsock_dev *loop_dev; /* an external-loop device the waits run, or NULL */
};

static inline uint64_t eg_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void *eg_host(struct eg_guest *g, uint64_t gpa)
{
	return g->ram + gpa;
}

/* Guest RAM, eventfds and the guest's view of the rings (zeroed, index 0). */
static inline int eg_init(struct eg_guest *g, uint32_t cid, uint64_t features)
{
	memset(g, 0, sizeof(*g));
	g->memfd = -1;
	g->kick[0] = g->kick[1] = g->call[0] = g->call[1] = -1;
	g->cid = cid;
	g->features = features;
	g->memfd = memfd_create("guest-ram", MFD_CLOEXEC);
	if (g->memfd < 0 || ftruncate(g->memfd, EG_RAM_SIZE) < 0)
		return -errno;
	g->ram = mmap(NULL, EG_RAM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd, 0);
	if (g->ram == MAP_FAILED) {
		g->ram = NULL;
		return -errno;
	}
	for (unsigned q = 0; q < 2; q++) {
		struct vring_layout l;
		uint8_t *base = eg_host(g, EG_RING_GPA(q));
		int r;

		g->kick[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		g->call[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (g->kick[q] < 0 || g->call[q] < 0)
			return -errno;
		r = vring_layout(EG_QSIZE, &l);
		if (r == 0)
			r = vring_drv_new(EG_QSIZE, base + l.desc_off, base + l.avail_off,
					  base + l.used_off, features, &g->vq[q]);
		if (r < 0)
			return r;
	}
	return 0;
}

/* The guest RAM region as the device API takes it: the memfd, guest-physical 0. */
static inline struct uvsock_dev_mem_region eg_region(const struct eg_guest *g)
{
	return (struct uvsock_dev_mem_region){
		.guest_phys_addr = 0, .size = EG_RAM_SIZE, .fd = g->memfd, .fd_offset = 0 };
}

/* What the VMM's virtio transport would know about queue q at DRIVER_OK. */
static inline struct uvsock_dev_queue eg_queue(const struct eg_guest *g, unsigned q)
{
	struct vring_layout l;

	(void)vring_layout(EG_QSIZE, &l);
	return (struct uvsock_dev_queue){
		.size = sizeof(struct uvsock_dev_queue),
		.num = EG_QSIZE,
		.desc_addr = EG_RING_GPA(q) + l.desc_off,
		.avail_addr = EG_RING_GPA(q) + l.avail_off,
		.used_addr = EG_RING_GPA(q) + l.used_off,
		/* A packed ring starts at slot 0 with wrap counter 1 (virtio 1.2 §2.8.1). */
		.last_avail_idx = (g->features & (1ull << UVSOCK_DEV_F_RING_PACKED)) ? 0x8000 : 0,
		.kick_fd = g->kick[q],
		.call_fd = g->call[q],
	};
}

static inline void eg_kick(struct eg_guest *g, unsigned q)
{
	uint64_t one = 1;

	if (vring_drv_kick_prepare(g->vq[q]))
		(void)!write(g->kick[q], &one, sizeof(one));
}

static inline int eg_post_rx(struct eg_guest *g, unsigned i)
{
	struct vring_drv_buf b = { .addr = EG_RX_GPA + (uint64_t)i * EG_RXBUF, .len = EG_RXBUF,
				   .write = true };
	int r = vring_drv_add(g->vq[0], &b, 1, (void *)(uintptr_t)(i + 1));

	return r < 0 ? r : 0;
}

/* Gives the device every RX buffer (the guest driver does this at probe). */
static inline int eg_post_all_rx(struct eg_guest *g)
{
	for (unsigned i = 0; i < EG_NRX; i++) {
		int r = eg_post_rx(g, i);

		if (r < 0)
			return r;
	}
	eg_kick(g, 0);
	return 0;
}

/*
 * One iteration of a VMM's event loop that runs an external-loop device: poll() the device's fd
 * and fd (if >= 0, for `events`) no longer than the device's timeout and deadline_ms, then let
 * the device run what is ready (uvsock_dev_process never blocks).
 * Returns fd's revents (0: not ready, or fd < 0), or -errno (poll, uvsock_dev_process).
 */
static inline int eg_loop_once(struct uvsock_dev *dev, int fd, short events, uint64_t deadline_ms)
{
	struct pollfd p[2] = { { .fd = uvsock_dev_fd(dev), .events = POLLIN },
			       { .fd = fd, .events = events } };
	uint64_t now = eg_now_ms();
	int wait_ms = now >= deadline_ms ? 0 : (int)(deadline_ms - now);
	int dev_ms = uvsock_dev_timeout_ms(dev); /* right before the wait: -1, or due in dev_ms */
	int r;

	if (dev_ms >= 0 && dev_ms < wait_ms)
		wait_ms = dev_ms;
	if (poll(p, fd >= 0 ? 2 : 1, wait_ms) < 0 && errno != EINTR)
		return -errno;
	/* Readable or a timer due: either way processing is cheap when there is nothing to do. */
	r = uvsock_dev_process(dev);
	if (r < 0)
		return r;
	return fd >= 0 ? p[1].revents : 0;
}

/* Waits (bounded) for the call eventfd of queue q after asking for an interrupt. */
static inline void eg_wait_call(struct eg_guest *g, unsigned q, uint64_t deadline_ms)
{
	uint64_t now = eg_now_ms(), v;
	struct pollfd p = { .fd = g->call[q], .events = POLLIN };

	if (vring_drv_enable_cb(g->vq[q]) || now >= deadline_ms)
		return;
	if (g->loop_dev) {
		if (eg_loop_once(g->loop_dev, g->call[q], POLLIN, deadline_ms) > 0)
			(void)!read(g->call[q], &v, sizeof(v));
		return;
	}
	if (poll(&p, 1, (int)(deadline_ms - now)) > 0)
		(void)!read(g->call[q], &v, sizeof(v));
}

/* Sends one packet (header + payload in one TX buffer). Returns 0 or -ETIMEDOUT. */
static inline int eg_send(struct eg_guest *g, const struct vsock_hdr *h, const void *payload,
			  int timeout_ms)
{
	uint64_t deadline = eg_now_ms() + (uint64_t)timeout_ms;
	struct vring_drv_buf b;
	unsigned i;
	int r;

	for (;;) {
		uint32_t len;
		void *cookie;

		while (vring_drv_get_used(g->vq[1], &len, &cookie) == 0)
			g->txbusy[(uintptr_t)cookie - 1] = false;
		for (i = 0; i < EG_NTX && g->txbusy[i]; i++)
			;
		if (i < EG_NTX)
			break;
		if (eg_now_ms() >= deadline)
			return -ETIMEDOUT;
		eg_wait_call(g, 1, deadline);
	}
	b = (struct vring_drv_buf){ .addr = EG_TX_GPA + (uint64_t)i * EG_TXBUF,
				    .len = VSOCK_HDR_SIZE + h->len };
	vsock_hdr_encode(h, eg_host(g, b.addr));
	if (h->len)
		memcpy((uint8_t *)eg_host(g, b.addr) + VSOCK_HDR_SIZE, payload, h->len);
	g->txbusy[i] = true;
	r = vring_drv_add(g->vq[1], &b, 1, (void *)(uintptr_t)(i + 1));
	if (r < 0)
		return r;
	eg_kick(g, 1);
	return 0;
}

/*
 * Receives the next packet into *h and buf (payload up to cap bytes), reposting the buffer.
 * Returns 0, -ETIMEDOUT, -EMSGSIZE (payload over cap) or -EIO (ring broken).
 */
static inline int eg_recv(struct eg_guest *g, struct vsock_hdr *h, void *buf, size_t cap,
			  int timeout_ms)
{
	uint64_t deadline = eg_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		uint32_t len;
		void *cookie;
		int r = vring_drv_get_used(g->vq[0], &len, &cookie);

		if (r == 0) {
			unsigned i = (unsigned)(uintptr_t)cookie - 1;
			const uint8_t *p = eg_host(g, EG_RX_GPA + (uint64_t)i * EG_RXBUF);

			if (len < VSOCK_HDR_SIZE)
				return -EIO;
			vsock_hdr_decode(p, h);
			if (h->len > cap || VSOCK_HDR_SIZE + h->len > len)
				return -EMSGSIZE;
			memcpy(buf, p + VSOCK_HDR_SIZE, h->len);
			r = eg_post_rx(g, i);
			if (r < 0)
				return r;
			eg_kick(g, 0);
			return 0;
		}
		if (r != -EAGAIN)
			return r;
		if (eg_now_ms() >= deadline)
			return -ETIMEDOUT;
		eg_wait_call(g, 0, deadline);
	}
}

/* A header from this guest (credit: 64 KiB buffer, fwd_cnt as given). */
static inline struct vsock_hdr eg_hdr(const struct eg_guest *g, uint32_t src_port,
				      uint32_t dst_port, uint16_t op, uint32_t len,
				      uint32_t fwd_cnt)
{
	return (struct vsock_hdr){ .src_cid = g->cid, .dst_cid = 2, .src_port = src_port,
				   .dst_port = dst_port, .len = len, .type = VSOCK_TYPE_STREAM,
				   .op = op, .buf_alloc = 65536, .fwd_cnt = fwd_cnt };
}

/* Frees the guest side; the device must have stopped the queues (it borrows the eventfds). */
static inline void eg_destroy(struct eg_guest *g)
{
	for (unsigned q = 0; q < 2; q++) {
		vring_drv_free(g->vq[q]);
		if (g->kick[q] >= 0)
			close(g->kick[q]);
		if (g->call[q] >= 0)
			close(g->call[q]);
	}
	if (g->ram)
		munmap(g->ram, EG_RAM_SIZE);
	if (g->memfd >= 0)
		close(g->memfd);
	memset(g, 0, sizeof(*g));
}

#endif
