/* SPDX-License-Identifier: MIT */
/*
 * Adaptive RX buffer sizing (see rxsize.h): an EWMA of received payload sizes, with full
 * buffers counted as twice their room so that the size can grow.
 */
#include "driver/rxsize.h"

#include <errno.h>

#include "vsock/hdr.h"

#define FP_SHIFT 8

int vdrv_rxsize_init(struct vdrv_rxsize *s, uint32_t min, uint32_t max)
{
	if (min <= VSOCK_HDR_SIZE || min > max || max > VSOCK_MAX_PKT_PAYLOAD)
		return -EINVAL;
	s->min = min;
	s->max = max;
	s->avg_fp = (uint64_t)min << FP_SHIFT;
	s->samples = 0;
	return 0;
}

void vdrv_rxsize_sample(struct vdrv_rxsize *s, uint32_t used_len, uint32_t buf_len)
{
	uint64_t sample, sample_fp;

	if (used_len < VSOCK_HDR_SIZE || buf_len < VSOCK_HDR_SIZE)
		return;
	sample = used_len - VSOCK_HDR_SIZE;
	/* A full buffer says "the packet may have been cut to fit": ask for more room. */
	if (used_len >= buf_len)
		sample = 2 * (uint64_t)(buf_len - VSOCK_HDR_SIZE);
	if (sample > s->max)
		sample = s->max;
	sample_fp = sample << FP_SHIFT;
	/* avg += (sample - avg) / weight, in signed steps so a falling average works too. */
	if (sample_fp >= s->avg_fp)
		s->avg_fp += (sample_fp - s->avg_fp) / VDRV_RXSIZE_WEIGHT;
	else
		s->avg_fp -= (s->avg_fp - sample_fp) / VDRV_RXSIZE_WEIGHT;
	s->samples++;
}

uint32_t vdrv_rxsize_buf_len(const struct vdrv_rxsize *s)
{
	uint64_t room = (s->avg_fp + (1u << FP_SHIFT) - 1) >> FP_SHIFT;
	uint64_t total;

	if (room < s->min)
		room = s->min;
	total = room + VSOCK_HDR_SIZE + VDRV_RXSIZE_ALIGN - 1;
	total &= ~(uint64_t)(VDRV_RXSIZE_ALIGN - 1);
	if (total - VSOCK_HDR_SIZE > s->max)
		total = (uint64_t)s->max + VSOCK_HDR_SIZE;
	return (uint32_t)total;
}
