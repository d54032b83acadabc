/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the split virtqueue: the input is a small guest memory image plus ring
 * parameters; the device side pops everything until the queue is empty or broken (touching every
 * byte of every iovec so that a mapping outside guest memory shows up under ASan), pushes the
 * chains back and exercises the notification paths. With bit 7 of the first byte the driver side
 * is fuzzed instead: buffers are added, then the used ring is overwritten from the input and
 * collected. Nothing may crash, hang or leak, whatever the input.
 *
 * Input layout:
 *   byte 0      bit 0 INDIRECT_DESC, bit 1 EVENT_IDX, bits 2-5 log2(queue size) % 9,
 *               bit 6 small iovec arrays (exercise -ENOBUFS / skip), bit 7 driver mode
 *   bytes 1-2   last_avail_idx (le16) for the device queue; bit 7 of byte 2 also negotiates
 *               VIRTIO_F_IN_ORDER (both modes: batched used elements, ring-order descriptors)
 *   rest        copied to guest-physical 0.. (two 32 KiB regions at gpa 0 and 0x8000, separate
 *               host buffers); the ring sits at gpa 0 as laid out by vring_layout()
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vring/vring.h"
#include "vring/vring_drv.h"

#define REGION 0x8000u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void touch(const struct iovec *iov, unsigned n, bool write)
{
	for (unsigned i = 0; i < n; i++) {
		uint8_t *p = iov[i].iov_base;

		if (iov[i].iov_len == 0)
			continue;
		if (write) {
			memset(p, 0xa5, iov[i].iov_len);
		} else {
			sink ^= p[0];
			sink ^= p[iov[i].iov_len - 1];
		}
	}
}

static void run_device(struct guest_mem *gm, unsigned num, uint64_t features, uint16_t last_avail,
		       const struct vring_layout *l, bool small)
{
	struct vring_dev_config c = {
		.mem = gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = l->desc_off, .avail_addr = l->avail_off, .used_addr = l->used_off,
		.features = features, .last_avail_idx = last_avail,
	};
	struct vring_dev_queue q;
	struct iovec out[64], in[64];
	unsigned max = small ? 2 : 64;

	if (vring_dev_init(&q, &c) < 0)
		return;
	(void)vring_dev_avail_count(&q);
	vring_dev_disable_notify(&q);
	/* Each successful pop or skip consumes a chain, and at most num are available per avail
	 * read; the bound only guards against a bug turning into a hang. */
	for (unsigned iter = 0; iter < 4 * num + 8; iter++) {
		struct vring_chain ch;
		uint16_t head;
		int r = vring_dev_pop(&q, out, max, in, max, &ch);

		if (r == -ENOBUFS) {
			if (vring_dev_skip(&q, &head) == 0)
				(void)vring_dev_push(&q, head, 0);
			continue;
		}
		if (r == -EAGAIN && vring_dev_enable_notify(&q)) {
			vring_dev_disable_notify(&q);
			continue;
		}
		if (r < 0)
			break;
		touch(out, ch.out_num, false);
		touch(in, ch.in_num, true);
		(void)vring_dev_fill(&q, ch.head, (uint32_t)ch.in_len);
		if (iter % 3 == 0)
			vring_dev_flush(&q);
	}
	vring_dev_flush(&q);
	(void)vring_dev_should_notify(&q);
	(void)vring_dev_empty(&q);
	(void)vring_err_to_string(vring_dev_error(&q));
	(void)vring_dev_error_msg(&q);
}

static void run_driver(uint8_t *mem0, unsigned num, uint64_t features, const struct vring_layout *l,
		       const uint8_t *img, size_t img_len)
{
	static int cookies[64];
	struct vring_drv *d;
	uint8_t *used = mem0 + l->used_off;
	size_t used_len = vring_used_size(num);

	if (vring_drv_new(num, mem0 + l->desc_off, mem0 + l->avail_off, used, features, &d) < 0)
		return;
	for (unsigned i = 0; i < num && i < 64; i++) {
		struct vring_drv_buf b[2] = { { 0x9000 + i * 64, 16, false },
					      { 0x9000 + i * 64 + 16, 48, true } };

		if (vring_drv_add(d, b, i % 2 ? 2 : 1, &cookies[i]) < 0)
			break;
	}
	(void)vring_drv_kick_prepare(d);
	/* The "device" writes an arbitrary used ring. */
	memcpy(used, img, img_len < used_len ? img_len : used_len);
	for (unsigned i = 0; i < 2 * num + 8; i++) {
		uint32_t len;
		void *ck;

		if (vring_drv_get_used(d, &len, &ck) < 0 && !vring_drv_enable_cb(d))
			break;
	}
	vring_drv_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct guest_mem_region_desc rd[2] = {
		{ .guest_phys_addr = 0, .memory_size = REGION },
		{ .guest_phys_addr = REGION, .memory_size = REGION },
	};
	struct vring_layout l;
	struct guest_mem *gm = NULL;
	void *hb[2];
	uint8_t *mem[2];
	unsigned num;
	uint64_t features = 0;
	size_t img;

	if (size < 3)
		return 0;
	num = 1u << ((data[0] >> 2 & 15) % 9);
	if (data[0] & 1)
		features |= 1ull << VRING_FEAT_INDIRECT_DESC;
	if (data[0] & 2)
		features |= 1ull << VRING_FEAT_EVENT_IDX;
	if (data[2] & 0x80)
		features |= 1ull << VRING_FEAT_IN_ORDER;
	if (vring_layout(num, &l) < 0 || l.total > REGION)
		return 0;
	/* Separate allocations, exactly region-sized: ASan flags any access past a region. */
	mem[0] = calloc(1, REGION);
	mem[1] = calloc(1, REGION);
	if (!mem[0] || !mem[1])
		goto out;
	img = size - 3;
	memcpy(mem[0], data + 3, img < REGION ? img : REGION);
	if (img > REGION)
		memcpy(mem[1], data + 3 + REGION, img - REGION < REGION ? img - REGION : REGION);
	hb[0] = mem[0];
	hb[1] = mem[1];
	if (guest_mem_new_local(rd, hb, 2, &gm) < 0)
		goto out;
	if (data[0] & 0x80)
		run_driver(mem[0], num, features, &l, data + 3, img);
	else
		run_device(gm, num, features, (uint16_t)(data[1] | data[2] << 8), &l,
			   data[0] & 0x40);
out:
	guest_mem_free(gm);
	free(mem[0]);
	free(mem[1]);
	return 0;
}
