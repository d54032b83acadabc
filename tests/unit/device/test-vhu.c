/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/vhu.c, the vhost-user glue: a VMM disconnect resets the
 * device and the next VMM is served.
 * Shared set-up: devtest.h.
 */
#include "devtest.h"

TEST(vmm_disconnect_resets_and_reconnect_works)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	tg_disconnect(&g);
	/* The VM is gone: its host connection is closed. */
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
	close(fd);
	/* Same socket path, a new VMM session. */
	tg_connect(&g, &t);
	h = mkhdr(&g, 2, 40000, 4321, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	solo_stop(&t, &g);
}

TEST_MAIN()
