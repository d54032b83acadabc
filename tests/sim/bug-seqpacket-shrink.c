/* SPDX-License-Identifier: MIT */
/*
 * The engine bug the simulation found (test-sim --seqpacket-shrink), reduced to one case. It is
 * registered with should_fail in suite 'sim' only: it passes (fails as expected) while the bug
 * is there, and meson reports an unexpected pass once the engine is fixed.
 *
 * A SEQPACKET sender lowers its own SO_VM_SOCKETS_BUFFER_SIZE while a message is partly sent.
 * Send credit is min(peer buf_alloc, own buf_alloc) - bytes in flight (vsock_credit_avail, the
 * "cap TX credit to local buffer size" rule); with the own buffer at or below the bytes already
 * in flight it is 0 until the receiver consumes, and a SEQPACKET receiver consumes only whole
 * messages. The rest of the message never goes: the connection is stuck until a close timeout.
 */
#include "test.h"
#include "vsock-test-util.h"

TEST (seqpacket_message_completes_after_sender_shrinks_buffer) {
	struct world *w = world_new(NULL);
	static uint8_t buf[65536];
	struct vsock_sock *l, *c, *a;
	struct vsock_hdr h;
	struct iovec iov;
	int mflags = 0;
	ssize_t n;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 100, &l, &c, &a);
	ASSERT_EQ(send_buf(c, buf, 60000, VSOCK_MSG_EOR), 60000);
	/* The first 16 KiB of the message reach the receiver... */
	n = pull_one(w->g, &h, buf, 16384);
	ASSERT_EQ(n, 16384);
	iov = (struct iovec){ buf, (size_t)n };
	ASSERT_OK(vsock_engine_feed(w->h, &h, &iov, 1));
	/* ...then the sender lowers its own buffer to 16 KiB, and everything is delivered. */
	ASSERT_OK(vsock_sock_setopt(c, VSOCK_OPT_BUFFER_SIZE, 16384));
	pump(w);
	n = recv_buf(a, buf, sizeof(buf), 0, &mflags);
	ASSERT_EQ(n, 60000);
	vsock_sock_close(c);
	vsock_sock_close(a);
	vsock_sock_close(l);
	world_free(w);
}

TEST_MAIN()
