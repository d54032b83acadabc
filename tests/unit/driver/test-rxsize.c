/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the guest role's adaptive RX buffer sizing (src/driver/rxsize.h): bounds,
 * alignment, convergence of the EWMA both ways, growth out of full buffers, garbage samples.
 */
#include "test.h"

#include "driver/rxsize.h"
#include "vsock/hdr.h"

static uint32_t room(const struct vdrv_rxsize *s)
{
	return vdrv_rxsize_buf_len(s) - VSOCK_HDR_SIZE;
}

TEST(init_rejects_bad_bounds)
{
	struct vdrv_rxsize s;

	ASSERT_ERR(vdrv_rxsize_init(&s, 0, 4096), EINVAL);
	ASSERT_ERR(vdrv_rxsize_init(&s, 44, 4096), EINVAL);
	ASSERT_ERR(vdrv_rxsize_init(&s, 8192, 4096), EINVAL);
	ASSERT_ERR(vdrv_rxsize_init(&s, 4096, 65537), EINVAL);
	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 4096));
}

TEST(starts_at_minimum_and_is_aligned)
{
	struct vdrv_rxsize s;
	uint32_t len;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	len = vdrv_rxsize_buf_len(&s);
	ASSERT_EQ(len % VDRV_RXSIZE_ALIGN, 0);
	ASSERT_GE(len - VSOCK_HDR_SIZE, 4096);
	ASSERT_LT(len - VSOCK_HDR_SIZE, 4096 + VDRV_RXSIZE_ALIGN);
}

TEST(small_packets_keep_the_minimum)
{
	struct vdrv_rxsize s;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	for (int i = 0; i < 1000; i++)
		vdrv_rxsize_sample(&s, VSOCK_HDR_SIZE + 64, vdrv_rxsize_buf_len(&s));
	ASSERT_GE(room(&s), 4096);
	ASSERT_LT(room(&s), 4096 + VDRV_RXSIZE_ALIGN);
	/* Control packets (no payload) do not pull it below the minimum either. */
	for (int i = 0; i < 100; i++)
		vdrv_rxsize_sample(&s, VSOCK_HDR_SIZE, vdrv_rxsize_buf_len(&s));
	ASSERT_GE(room(&s), 4096);
}

/* Bulk traffic: the device fills every buffer completely (it cuts packets to fit). */
TEST(full_buffers_grow_to_the_maximum_within_a_few_refills)
{
	struct vdrv_rxsize s;
	int i;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	for (i = 0; i < 1000 && room(&s) < 65536; i++) {
		uint32_t len = vdrv_rxsize_buf_len(&s);

		vdrv_rxsize_sample(&s, len, len);
	}
	ASSERT_EQ(vdrv_rxsize_buf_len(&s), 65536 + VSOCK_HDR_SIZE);
	/* Growth is fast: within 4 refills of a 128-entry ring (refill at half = 64 buffers). */
	test_note("reached 64 KiB after %d full buffers", i);
	ASSERT_LE(i, 4 * 64);
	/* And it never exceeds the maximum. */
	for (int k = 0; k < 100; k++)
		vdrv_rxsize_sample(&s, 65536 + VSOCK_HDR_SIZE, 65536 + VSOCK_HDR_SIZE);
	ASSERT_EQ(vdrv_rxsize_buf_len(&s), 65536 + VSOCK_HDR_SIZE);
}

TEST(falls_back_when_traffic_turns_small)
{
	struct vdrv_rxsize s;
	int i;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	for (i = 0; i < 500; i++)
		vdrv_rxsize_sample(&s, 65536 + VSOCK_HDR_SIZE, 65536 + VSOCK_HDR_SIZE);
	ASSERT_EQ(room(&s), 65536);
	for (i = 0; i < 1000 && room(&s) > 4096 + VDRV_RXSIZE_ALIGN; i++)
		vdrv_rxsize_sample(&s, VSOCK_HDR_SIZE + 100, vdrv_rxsize_buf_len(&s));
	test_note("back to 4 KiB after %d small packets", i);
	ASSERT_LT(i, 1000);
	ASSERT_GE(room(&s), 4096);
}

/* Steady medium packets: the average settles at their size, rounded up to the alignment. */
TEST(converges_on_a_steady_medium_size)
{
	struct vdrv_rxsize s;
	const uint32_t pay = 20000;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	for (int i = 0; i < 2000; i++) {
		uint32_t len = vdrv_rxsize_buf_len(&s);
		/* The device cuts a packet to the buffer, as a real one does. */
		uint32_t used = pay + VSOCK_HDR_SIZE < len ? pay + VSOCK_HDR_SIZE : len;

		vdrv_rxsize_sample(&s, used, len);
	}
	ASSERT_GE(room(&s), pay);
	ASSERT_LE(room(&s), pay + 2 * VDRV_RXSIZE_ALIGN + 64);
	ASSERT_EQ(vdrv_rxsize_buf_len(&s) % VDRV_RXSIZE_ALIGN, 0);
}

TEST(custom_bounds_are_respected)
{
	struct vdrv_rxsize s;

	ASSERT_OK(vdrv_rxsize_init(&s, 8192, 16384));
	ASSERT_GE(room(&s), 8192);
	for (int i = 0; i < 500; i++)
		vdrv_rxsize_sample(&s, vdrv_rxsize_buf_len(&s), vdrv_rxsize_buf_len(&s));
	ASSERT_EQ(room(&s), 16384);
	for (int i = 0; i < 500; i++)
		vdrv_rxsize_sample(&s, VSOCK_HDR_SIZE + 1, vdrv_rxsize_buf_len(&s));
	ASSERT_GE(room(&s), 8192);
	ASSERT_LT(room(&s), 8192 + VDRV_RXSIZE_ALIGN);
}

TEST(garbage_samples_are_ignored)
{
	struct vdrv_rxsize s;
	uint32_t before;

	ASSERT_OK(vdrv_rxsize_init(&s, 4096, 65536));
	before = vdrv_rxsize_buf_len(&s);
	vdrv_rxsize_sample(&s, 0, before);
	vdrv_rxsize_sample(&s, 43, before);
	vdrv_rxsize_sample(&s, 100, 0);
	ASSERT_EQ(s.samples, 0);
	ASSERT_EQ(vdrv_rxsize_buf_len(&s), before);
	/* A used length beyond the buffer (the ring layer rejects it first) counts as a full
	 * buffer: twice its room, no more. */
	for (int i = 0; i < 1000; i++)
		vdrv_rxsize_sample(&s, UINT32_MAX, 4140);
	ASSERT_GE(room(&s), 8192);
	ASSERT_LT(room(&s), 8192 + VDRV_RXSIZE_ALIGN);
}

TEST_MAIN()
