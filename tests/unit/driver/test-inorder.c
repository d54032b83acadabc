/* SPDX-License-Identifier: MIT */
/*
 * VIRTIO_F_IN_ORDER end to end (docs/vring.md, "IN_ORDER"): the guest role over the project's
 * vhost-user front-end against the device role in-process, with the feature on (the default:
 * offered by the device, negotiated by the guest role; TX used elements arrive in batches) and
 * off (switch no-in-order). Each way moves patterned bytes both directions at several write
 * sizes and checks every byte, so a used batch expanded wrongly (a lost, repeated or reordered
 * buffer, a wrong length) shows up as a mismatch.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/device.h>
#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "guestside.h"
#include "lib/lib.h"
#include "driver/driver.h"
#include "util/tune.h"
#include "vhost_user/protocol.h"
#include "drvtest.h"
#include "test.h"

/* Under the switches `tune`: one connection, both directions; returns the negotiated bits. */
static uint64_t both_ways(const char *tune)
{
	static const size_t chunks[] = { 100, 4096, 65536 };
	struct conn c;
	char err[160];
	uint64_t feats;

	ASSERT_EQ(tune_set(tune, err, sizeof(err)), 0);
	conn_open(&c);
	feats = vdrv_features(lib_ctx_guest_vdrv(c.g));
	for (unsigned i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		struct host_io h = { .fd = c.hfd, .total = 2u << 20, .seed = 11 + i };
		pthread_t th;

		/* guest -> host in writes of chunks[i] */
		ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &h), 0);
		g_send_pattern(c.gfd, h.total, chunks[i], h.seed);
		pthread_join(th, NULL);
		ASSERT_TRUE(h.ok);
		/* host -> guest in writes of chunks[i] */
		h = (struct host_io){ .fd = c.hfd, .total = 2u << 20, .seed = 21 + i,
				      .chunk = chunks[i] };
		ASSERT_EQ(pthread_create(&th, NULL, host_send_main, &h), 0);
		g_recv_pattern(c.gfd, h.total, h.seed);
		pthread_join(th, NULL);
		ASSERT_TRUE(h.ok);
	}
	conn_close(&c);
	ASSERT_EQ(tune_set("in-order", err, sizeof(err)), 0);
	return feats;
}

TEST(in_order_is_negotiated_and_data_stays_exact)
{
	char err[128];

	/* Whatever UVSOCK_TUNE says: this case is about the switch on. */
	ASSERT_EQ(tune_set("in-order", err, sizeof(err)), 0);
	ASSERT_TRUE(uvsock_dev_features() & (1ull << UVSOCK_DEV_F_IN_ORDER));
	ASSERT_TRUE(both_ways("in-order") & VHU_BIT(VHU_F_IN_ORDER));
}

TEST(no_in_order_is_not_negotiated_and_data_stays_exact)
{
	ASSERT_FALSE(both_ways("no-in-order") & VHU_BIT(VHU_F_IN_ORDER));
}

TEST_MAIN()
