/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the packed virtqueue (virtio 1.2 §2.8): the input is a guest memory image
 * holding a descriptor ring, two event areas and whatever the descriptors point at. The device
 * side pops until the queue is empty or broken (touching every iovec byte so that ASan sees any
 * mapping outside guest memory), completes the buffers in an input-chosen order and exercises the
 * notification paths (with IN_ORDER in pop order, so that used descriptors fold into batches).
 * With bit 7 of the first byte the driver side is fuzzed instead: buffers are
 * added, the ring is then overwritten from the input as a "device" would, and collected. Nothing
 * may crash, hang or leak, whatever the input.
 *
 * Input layout:
 *   byte 0      bit 0 INDIRECT_DESC, bit 1 EVENT_IDX, bit 2 IN_ORDER, bit 6 small iovec arrays
 *               (-ENOBUFS, skip),
 *               bit 7 driver mode
 *   byte 1      queue size - 1 (1..256: packed sizes need not be powers of two)
 *   bytes 2-3   vring base (le16: next slot | wrap << 15) for the device queue
 *   rest        copied to guest-physical 0.. (two 32 KiB regions at gpa 0 and 0x8000, separate
 *               host buffers); the ring sits at gpa 0 as laid out by vring_layout_packed()
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

static volatile uint8_t acc;

static void use_iov(const struct iovec *v, unsigned n, uint8_t fill)
{
	for (unsigned i = 0; i < n; i++) {
		uint8_t *b = v[i].iov_base;
		size_t len = v[i].iov_len;

		if (!len)
			continue;
		if (fill) {
			memset(b, fill, len);
			continue;
		}
		acc += b[0];
		acc += b[len - 1];
	}
}

static void fuzz_device(struct guest_mem *gm, unsigned num, uint64_t feats, uint16_t base,
			const struct vring_layout *l, unsigned iovmax, const uint8_t *order,
			size_t order_len)
{
	struct vring_dev_config c = {
		.mem = gm, .num = num, .addr_kind = VRING_ADDR_GPA,
		.desc_addr = l->desc_off, .avail_addr = l->avail_off, .used_addr = l->used_off,
		.features = feats | (1ull << VRING_FEAT_RING_PACKED), .last_avail_idx = base,
	};
	static struct vring_dev_queue q; /* large (an id table): not on the stack */
	static uint16_t held[256];
	struct iovec rd[64], wr[64];
	unsigned nheld = 0;
	bool in_order = feats & (1ull << VRING_FEAT_IN_ORDER);

	if (vring_dev_init(&q, &c) < 0)
		return;
	(void)vring_dev_avail_count(&q);
	vring_dev_disable_notify(&q);
	/* Every pop or skip consumes at least one slot; the bound only turns a bug into a stop. */
	for (unsigned round = 0; round < 4 * num + 8; round++) {
		struct vring_chain ch;
		uint16_t id;
		int r = vring_dev_pop(&q, rd, iovmax, wr, iovmax, &ch);

		if (r == -ENOBUFS) {
			if (vring_dev_skip(&q, &id) == 0 && nheld < num)
				held[nheld++] = id;
			continue;
		}
		if (r == -EAGAIN) {
			if (!vring_dev_enable_notify(&q))
				break;
			vring_dev_disable_notify(&q);
			continue;
		}
		if (r < 0)
			break;
		use_iov(rd, ch.out_num, 0);
		use_iov(wr, ch.in_num, 0x5a);
		if (nheld < num)
			held[nheld++] = ch.head;
		/* Complete some now, in an order the input picks, the rest at the end. */
		while (nheld > 0 && order_len > 0 && (order[round % order_len] & 1)) {
			unsigned k = in_order ? 0 : order[round % order_len] % nheld;

			(void)vring_dev_fill(&q, held[k], (uint32_t)ch.in_len);
			if (in_order) /* the oldest first (the device's IN_ORDER duty) */
				memmove(held, held + 1, --nheld * sizeof(held[0]));
			else
				held[k] = held[--nheld];
			if (order[(round + 1) % order_len] & 2)
				vring_dev_flush(&q);
			round++;
		}
	}
	for (unsigned k = 0; k < nheld; k++)
		(void)vring_dev_fill(&q, held[in_order ? k : nheld - 1 - k], 0);
	vring_dev_flush(&q);
	(void)vring_dev_should_notify(&q);
	(void)vring_dev_empty(&q);
	(void)vring_dev_last_avail_idx(&q);
	(void)vring_err_to_string(vring_dev_error(&q));
	(void)vring_dev_error_msg(&q);
}

static void fuzz_driver(uint8_t *mem0, unsigned num, uint64_t feats, const struct vring_layout *l,
			const uint8_t *img, size_t img_len)
{
	static int ck[256];
	struct vring_drv *d;
	size_t ring_len = (size_t)16 * num + 4;

	if (vring_drv_new(num, mem0 + l->desc_off, mem0 + l->avail_off, mem0 + l->used_off,
			  feats | (1ull << VRING_FEAT_RING_PACKED), &d) < 0)
		return;
	for (unsigned i = 0; i < num; i++) {
		struct vring_drv_buf b[2] = { { 0x9000 + i * 64, 16, false },
					      { 0x9000 + i * 64 + 16, 48, true } };

		if (vring_drv_add(d, b, 1 + i % 2, &ck[i]) < 0)
			break;
	}
	(void)vring_drv_kick_prepare(d);
	/* The "device" rewrites the ring and the device event area arbitrarily. */
	memcpy(mem0 + l->desc_off, img, img_len < ring_len ? img_len : ring_len);
	(void)vring_drv_kick_prepare(d);
	for (unsigned i = 0; i < 2 * num + 8; i++) {
		uint32_t len;
		void *cookie;

		if (vring_drv_get_used(d, &len, &cookie) < 0 && !vring_drv_enable_cb(d))
			break;
	}
	vring_drv_disable_cb(d);
	vring_drv_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct guest_mem_region_desc rd[2] = {
		{ .guest_phys_addr = 0, .memory_size = REGION },
		{ .guest_phys_addr = REGION, .memory_size = REGION },
	};
	struct guest_mem *gm = NULL;
	struct vring_layout l;
	uint64_t feats = 0;
	uint8_t *m0 = NULL, *m1 = NULL;
	void *hb[2];
	unsigned num;
	size_t img;

	if (size < 4)
		return 0;
	num = (unsigned)data[1] + 1;
	feats |= (data[0] & 1) ? 1ull << VRING_FEAT_INDIRECT_DESC : 0;
	feats |= (data[0] & 2) ? 1ull << VRING_FEAT_EVENT_IDX : 0;
	feats |= (data[0] & 4) ? 1ull << VRING_FEAT_IN_ORDER : 0;
	if (vring_layout_packed(num, &l) < 0 || l.total > REGION)
		return 0;
	/* Exactly region-sized separate buffers: ASan flags any access past a region. */
	m0 = calloc(1, REGION);
	m1 = calloc(1, REGION);
	img = size - 4;
	if (!m0 || !m1)
		goto done;
	memcpy(m0, data + 4, img < REGION ? img : REGION);
	if (img > REGION)
		memcpy(m1, data + 4 + REGION, img - REGION < REGION ? img - REGION : REGION);
	hb[0] = m0;
	hb[1] = m1;
	if (guest_mem_new_local(rd, hb, 2, &gm) < 0)
		goto done;
	if (data[0] & 0x80)
		fuzz_driver(m0, num, feats, &l, data + 4, img);
	else
		fuzz_device(gm, num, feats, (uint16_t)(data[2] | data[3] << 8), &l,
			    (data[0] & 0x40) ? 2 : 64, data + 4 + (img > 16 * num ? 16 * num : 0),
			    img > 16 * num + 64 ? 64 : 0);
done:
	guest_mem_free(gm);
	free(m0);
	free(m1);
	return 0;
}
