/* SPDX-License-Identifier: MIT */
/*
 * VHOST_USER_PROTOCOL_F_DEVICE_STATE between two uvsockd processes (docs/upgrade.md,
 * "VHOST_USER_PROTOCOL_F_DEVICE_STATE"): both serve guest CID 3 on their own socket paths; the
 * project's front-end, with three queues as Cloud Hypervisor hands them over, drives the first
 * in the middle of a transfer each way, stops it, saves its state through a pipe, moves to the
 * second with the same guest memory and rings, loads the state and starts the rings there. The
 * host connection (made through the first daemon) goes on through the second: every byte once
 * and in order, no RST, no event; the daemons live on.
 */
#include "../unit/device/devtest.h"
#include "../unit/device/statetest.h"
#include "uvsockd-proc.h"

TEST(a_vm_moves_between_two_uvsockd_with_a_transfer_each_way)
{
	static const uint32_t cid[] = { 3 };
	struct uvd a, b;
	struct mguest m;
	uint16_t bases[3];
	uint8_t *st;
	size_t len, h2g_got;
	int lfa, hfd, src;
	char path[200];

	uvd_start(&a, 1, cid, NULL, NULL);
	uvd_start(&b, 1, cid, NULL, NULL);
	mg_connect_nrx(&m, a.sock[0], MG_NRX_SMALL);
	hfd = transfer_started(&m, a.uds[0], &lfa, &h2g_got);

	ASSERT_OK(vhu_front_stop(m.g.f, bases));
	st = save_state(m.g.f, &len);
	/* The first daemon stays connected until the second took the state, as a migrating VMM's
	 * source does. */
	src = dup(vhu_front_fd(m.g.f));
	move_to(m.g.f, b.sock[0]);
	ASSERT_EQ(load_state(m.g.f, st, len), 0);
	ASSERT_OK(vhu_front_start(m.g.f));
	close(src);

	transfer_finished(&m, hfd, h2g_got);
	ASSERT_EQ(mg_event(&m), -1);
	close(hfd);
	free(st);
	mg_disconnect(&m);
	close(lfa);
	snprintf(path, sizeof(path), "%s_1234", a.uds[0]);
	unlink(path);
	ASSERT_TRUE(uvd_alive(&a));
	ASSERT_TRUE(uvd_alive(&b));
	ASSERT_EQ(uvd_stop(&a), 0);
	ASSERT_EQ(uvd_stop(&b), 0);
}

TEST_MAIN()
