/* SPDX-License-Identifier: MIT */
/*
 * Device-role tests of src/device/host_uds.c, the host side: RST at once when no host listener,
 * guest->host and host->guest streams with the CONNECT/OK handshake, half-close both ways, bad
 * CONNECT lines and the CONNECT timeout, SEQPACKET boundaries, the guest's credit and packet
 * overhead, zero-copy both ways and the copying path, no allocation per packet.
 * Shared set-up: devtest.h.
 */
#include "devtest.h"

/*
 * Allocation counting, for the per-packet allocation test: malloc, calloc and realloc called by
 * alloc_thread while alloc_counting is set are counted. glibc only, and not under
 * AddressSanitizer or ThreadSanitizer, which own malloc (the test skips there).
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZER_OWNS_MALLOC 1
#endif
#endif
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) &&      \
	!defined(SANITIZER_OWNS_MALLOC)
#define ALLOC_COUNTING 1
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
static atomic_bool alloc_counting;
static pthread_t alloc_thread;
static atomic_uint alloc_count;

static void alloc_note(void)
{
	/* acquire: pairs with the release that set it, so alloc_thread is the one written. */
	if (atomic_load_explicit(&alloc_counting, memory_order_acquire) &&
	    pthread_equal(pthread_self(), alloc_thread))
		atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
}

void *malloc(size_t n)
{
	alloc_note();
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	alloc_note();
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	alloc_note();
	return __libc_realloc(p, n);
}
#endif

TEST(guest_connect_without_host_listener_gets_rst_at_once)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h = { 0 }, r;
	uint8_t buf[64];
	uint64_t t0;

	solo_start(&t, &g);
	ASSERT_EQ(g.cid, 3);
	h = mkhdr(&g, 2, 40000, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
	t0 = test_now_ms();
	tg_send(&g, &h, NULL);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	ASSERT_EQ(r.src_cid, 2);
	ASSERT_EQ(r.dst_cid, 3);
	ASSERT_EQ(r.src_port, 1234);
	ASSERT_EQ(r.dst_port, 40000);
	/* Not the 2 s connect timeout: the refusal is immediate. */
	ASSERT_LT(test_now_ms() - t0, 1500);
	solo_stop(&t, &g);
}

TEST(guest_to_host_stream_with_half_close)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	char path[160], buf[256];
	int lfd, hfd;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	hello_world(&g, hfd);

	/* guest SHUTDOWN(SEND): the host sees EOF but can still write. */
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN, 0);
	h.flags = VSOCK_SHUTDOWN_SEND;
	tg_send(&g, &h, NULL);
	ASSERT_EQ(read_wait(hfd, buf, sizeof(buf), WAIT_MS), 0);
	ASSERT_EQ(write(hfd, "bye", 3), 3);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_MEMEQ(buf, "bye", 3);

	/* host EOF: SHUTDOWN with the SEND bit reaches the guest. */
	ASSERT_OK(shutdown(hfd, SHUT_WR));
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_SHUTDOWN);
	ASSERT_TRUE(r.flags & VSOCK_SHUTDOWN_SEND);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(guest_close_with_unread_data_ends_with_rst_after_host_close)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h, r;
	static uint8_t payload[4096], rb[65536];
	char path[160];
	size_t got = 0;
	ssize_t n;
	int lfd, hfd, i;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	/* 248 KiB while the host reads nothing: more than its socket buffer takes. */
	for (i = 0; i < 62; i++) {
		memset(payload, i, sizeof(payload));
		h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, sizeof(payload));
		tg_send(&g, &h, payload);
	}
	/* The guest closes: SHUTDOWN with both flags. */
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_SHUTDOWN, 0);
	h.flags = VSOCK_SHUTDOWN_MASK;
	tg_send(&g, &h, NULL);
	/* The host now reads everything, sees EOF, closes: the guest gets its RST promptly. */
	while ((n = read_wait(hfd, rb, sizeof(rb), WAIT_MS)) > 0) {
		for (ssize_t k = 0; k < n; k++)
			if (rb[k] != (uint8_t)((got + (size_t)k) / 4096))
				test_fail(__FILE__, __LINE__, "byte %zu corrupted", got + (size_t)k);
		got += (size_t)n;
	}
	ASSERT_EQ(n, 0);
	ASSERT_EQ(got, 62 * 4096);
	close(hfd);
	do {
		ASSERT_OK(tg_recv(&g, &r, rb, sizeof(rb), 1500, true));
	} while (r.op == VSOCK_OP_SHUTDOWN);
	ASSERT_EQ(r.op, VSOCK_OP_RST);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

TEST(host_to_guest_stream_connect_ok)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	ASSERT_EQ(write(fd, "ping", 4), 4);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.src_port, req.src_port);
	ASSERT_MEMEQ(buf, "ping", 4);
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 4);
	tg_send(&g, &h, "pong");
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 4);
	ASSERT_MEMEQ(buf, "pong", 4);
	/* Guest RST: the host socket is closed. */
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_RST, 0);
	tg_send(&g, &h, NULL);
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
	close(fd);
	solo_stop(&t, &g);
}

TEST(host_to_guest_seqpacket_keeps_boundaries)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	char buf[64];
	int fd;

	solo_start(&t, &g);
	ASSERT_TRUE(vhu_front_features(g.f) & (1ull << VIRTIO_VSOCK_F_SEQPACKET));
	host_initiated(&t, &g, SOCK_SEQPACKET, &fd, &req);
	ASSERT_EQ(write(fd, "one", 3), 3);
	ASSERT_EQ(write(fd, "three", 5), 5);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.op, VSOCK_OP_RW);
	ASSERT_EQ(r.len, 3);
	ASSERT_TRUE(r.flags & VSOCK_SEQ_EOM);
	ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
	ASSERT_EQ(r.len, 5);
	ASSERT_TRUE(r.flags & VSOCK_SEQ_EOM);
	/* Guest message -> one host message. */
	h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_SEQPACKET, VSOCK_OP_RW, 2);
	h.flags = VSOCK_SEQ_EOM;
	tg_send(&g, &h, "ab");
	h.len = 3;
	tg_send(&g, &h, "cde");
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 2);
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 3);
	ASSERT_MEMEQ(buf, "cde", 3);
	close(fd);
	solo_stop(&t, &g);
}

TEST(bad_connect_lines_and_timeout_close_the_socket)
{
	static const char *const bad[] = { "HELLO\n", "CONNECT x\n", "CONNECT 99999999999\n" };
	struct tdev t;
	struct tguest g;
	struct vsock_dev_stats st;
	char buf[64];
	uint64_t t0;
	int fd;

	solo_start(&t, &g);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fd = unix_connect(t.uds, SOCK_STREAM);
		ASSERT_EQ(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		ASSERT_EQ(read_wait(fd, buf, sizeof(buf), WAIT_MS), 0);
		close(fd);
	}
	/* A partial line followed by an early close. */
	fd = unix_connect(t.uds, SOCK_STREAM);
	ASSERT_EQ(write(fd, "CONN", 4), 4);
	close(fd);
	/* Silence: closed after the 2 s limit, not before. */
	fd = unix_connect(t.uds, SOCK_STREAM);
	t0 = test_now_ms();
	ASSERT_EQ(read_wait(fd, buf, sizeof(buf), 5000), 0);
	ASSERT_GE(test_now_ms() - t0, 1500);
	close(fd);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.host_connect_bad_line, 4);
	ASSERT_EQ(st.host_connect_timeouts, 1);
	solo_stop(&t, &g);
}

TEST(host_to_guest_respects_guest_credit)
{
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	struct writer_arg wa;
	pthread_t th;
	static uint8_t buf[RXBUF];
	size_t total = 0, stalled_at;
	uint32_t fwd = 0;
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	wa.fd = fd;
	wa.len = 600 * 1024;
	ASSERT_EQ(pthread_create(&th, NULL, writer_thread, &wa), 0);
	/* No credit update from the guest: no more than its 256 KiB buf_alloc may arrive. */
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0) {
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		total += r.len;
	}
	stalled_at = total;
	/*
	 * At most its buf_alloc, less what the per-packet overhead bound (h2g_budget.h) holds back
	 * while bytes are in flight: H2G_PKT_COST, and half of it per small packet (a short tail
	 * of a read); there are at most as many of those as host writes.
	 */
	ASSERT_LE(stalled_at, 256 * 1024);
	ASSERT_GE(stalled_at, 256 * 1024 - (wa.len / 8192 + 2) * H2G_PKT_COST);
	/* Grant credit as the guest consumes: the rest arrives, in order. */
	while (total < wa.len) {
		if (fwd != total) {
			fwd = (uint32_t)total;
			h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM,
				  VSOCK_OP_CREDIT_UPDATE, 0);
			h.fwd_cnt = fwd;
			tg_send(&g, &h, NULL);
		}
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		total += r.len;
	}
	ASSERT_EQ(total, wa.len);
	pthread_join(th, NULL);
	close(fd);
	solo_stop(&t, &g);
}

TEST(host_to_guest_small_writes_respect_the_guest_packet_overhead)
{
	static uint8_t chunk[512], buf[RXBUF];
	const size_t buf_alloc = 256 * 1024;
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, h, r;
	size_t written = 0, total = 0, pkts = 0;
	bool held = false;
	unsigned w;
	int fd;

	solo_start(&t, &g);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	ASSERT_OK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK));
	for (w = 0; written < buf_alloc; w++) {
		size_t n = 129 + (w * 37u) % 384;

		for (size_t i = 0; i < n; i++)
			chunk[i] = (uint8_t)((written + i) % 251);
		if (write(fd, chunk, n) != (ssize_t)n)
			break; /* the host socket is full: the device waits for the guest */
		written += n;
		/* One packet per write until the device holds back; then only what comes. */
		if (tg_recv(&g, &r, buf, sizeof(buf), held ? 0 : 200, true) < 0) {
			held = true;
			continue;
		}
		overhead_rx(&r, buf, &total, &pkts);
	}
	while (tg_recv(&g, &r, buf, sizeof(buf), 300, true) == 0)
		overhead_rx(&r, buf, &total, &pkts);
	test_note("%zu packets, %zu of %zu bytes before the device held back; %u host writes", pkts,
		  total, written, w);
	ASSERT_LT(total, buf_alloc);
	ASSERT_LT(total, written);
	/* The guest consumes everything: the waiting bytes leave coalesced. */
	for (bool first = true; total < written; first = false) {
		h = mkhdr(&g, 2, 5000, req.src_port, VSOCK_TYPE_STREAM, VSOCK_OP_CREDIT_UPDATE, 0);
		h.fwd_cnt = (uint32_t)total;
		tg_send(&g, &h, NULL);
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, total);
		if (first && written - total > 512)
			ASSERT_GT(r.len, 512);
		total += r.len;
	}
	ASSERT_EQ(total, written);
	close(fd);
	solo_stop(&t, &g);
}

/*
 * Guest -> host with the host socket full: what it takes goes straight from the TX buffers, the
 * rest is queued and flushed later in order, and fwd_cnt counts only what the host socket took.
 */
TEST(zerocopy_guest_to_host_with_the_host_socket_full)
{
	struct vsock_dev_stats st;
	static uint8_t payload[4096], rb[65536];
	struct tdev t;
	struct tguest g;
	struct vsock_hdr h;
	char path[160];
	size_t total = 62 * sizeof(payload), got = 0;
	struct vsock_sock_info info;
	int lfd, hfd, inq;

	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	/* 248 KiB, within the credit, while the host reads nothing: more than its socket takes. */
	for (size_t off = 0; off < total; off += sizeof(payload)) {
		for (size_t i = 0; i < sizeof(payload); i++)
			payload[i] = (uint8_t)((off + i) % 251);
		h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, sizeof(payload));
		tg_send(&g, &h, payload);
	}
	ASSERT_WAIT_FOR((info = conn_info(&t), info.fwd_cnt + info.rx_bytes == total), WAIT_MS);
	vsock_dev_get_stats(t.d, &st);
	ASSERT_GT(st.zc_tx_bytes, 0);
	ASSERT_GE(info.fwd_cnt, st.zc_tx_bytes); /* in place, plus what a retry flushed */
	ASSERT_GT(info.rx_bytes, 0);             /* the rest waits, unacknowledged */
	ASSERT_LE(info.rx_bytes, info.buf_alloc);
	/* fwd_cnt is exactly what the host socket holds: credit only for what it took. */
	ASSERT_OK(ioctl(hfd, FIONREAD, &inq));
	ASSERT_EQ((uint32_t)inq, info.fwd_cnt);
	while (got < total) {
		ssize_t n = read_wait(hfd, rb, sizeof(rb), WAIT_MS);

		ASSERT_GT(n, 0);
		check_pattern(rb, (size_t)n, got);
		got += (size_t)n;
	}
	ASSERT_WAIT_FOR((info = conn_info(&t), info.fwd_cnt == total), WAIT_MS);
	ASSERT_EQ(info.rx_bytes, 0);
	/* Nothing queued any more: in place again. */
	vsock_dev_get_stats(t.d, &st);
	h = mkhdr(&g, 2, 40001, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_RW, 5);
	tg_send(&g, &h, "again");
	ASSERT_EQ(read_wait(hfd, rb, sizeof(rb), WAIT_MS), 5);
	ASSERT_MEMEQ(rb, "again", 5);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.zc_tx_bytes), WAIT_MS);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

/*
 * Host -> guest while the guest posts no RX buffers: 100 small host writes wait in the host
 * socket and become as few packets as the guest's buffers allow, read with one readv over
 * several buffers, every buffer full but the last; every byte in order, all of it in place.
 */
TEST(zerocopy_host_to_guest_coalesces_small_writes)
{
	static uint8_t chunk[640], buf[RXBUF];
	struct vsock_dev_stats st;
	struct tdev t;
	struct tguest g;
	struct vsock_hdr req, r;
	size_t total = 100 * sizeof(chunk), got = 0, off = 0;
	unsigned rw = 0;
	int fd;

	tdev_new(&t, NULL, 3);
	tdev_run(&t);
	tg_connect_nrx(&g, &t, 2);
	host_initiated(&t, &g, SOCK_STREAM, &fd, &req);
	/* Take the guest's two buffers with one byte each. */
	vsock_dev_get_stats(t.d, &st);
	for (int i = 0; i < 2; i++) {
		chunk[0] = (uint8_t)(off % 251);
		ASSERT_EQ(write(fd, chunk, 1), 1);
		off++;
		wait_rx_pkts(&t, st.rx_pkts + 1 + (uint64_t)i);
	}
	for (int w = 0; w < 100; w++) {
		for (size_t i = 0; i < sizeof(chunk); i++)
			chunk[i] = (uint8_t)((off + i) % 251);
		ASSERT_EQ(write(fd, chunk, sizeof(chunk)), (ssize_t)sizeof(chunk));
		off += sizeof(chunk);
	}
	/* Buffers again, many at once: one gathered read fills them. */
	for (int i = 2; i < NRX; i++)
		tg_post_rx(&g, i);
	tg_kick(&g, 0);
	total += 2;
	while (got < total) {
		ASSERT_OK(tg_recv(&g, &r, buf, sizeof(buf), WAIT_MS, true));
		ASSERT_EQ(r.op, VSOCK_OP_RW);
		check_pattern(buf, r.len, got);
		got += r.len;
		if (++rw > 2 && got < total)
			ASSERT_EQ(r.len, RXBUF - 44);
	}
	ASSERT_EQ(got, total);
	/* 2 one-byte packets, then 64000 bytes in 16 buffers of 4052 (the last 3220). */
	ASSERT_EQ(rw, 2 + (64000 + RXBUF - 45) / (RXBUF - 44));
	vsock_dev_get_stats(t.d, &st);
	ASSERT_EQ(st.zc_rx_bytes, total);
	close(fd);
	solo_stop(&t, &g);
}

/* UVSOCK_TUNE=no-zerocopy,no-event-idx: the copying path still works; EVENT_IDX not offered. */
TEST(no_zerocopy_switch_runs_the_copying_path)
{
	struct vsock_dev_stats st;
	struct tdev t;
	struct tguest g;
	char path[160], err[128];
	int lfd, hfd;

	ASSERT_OK(tune_set("no-zerocopy,no-event-idx", err, sizeof(err)));
	ASSERT_EQ(uvsock_dev_features() & (1ull << UVSOCK_DEV_F_EVENT_IDX), 0);
	hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
	ASSERT_EQ(vhu_front_features(g.f) & (1ull << UVSOCK_DEV_F_EVENT_IDX), 0);
	for (int i = 0; i < 20; i++)
		hello_world(&g, hfd);
	ASSERT_WAIT_FOR((vsock_dev_get_stats(t.d, &st), st.rx_bytes == 100), WAIT_MS);
	ASSERT_EQ(st.tx_bytes, 100);
	ASSERT_EQ(st.zc_tx_bytes, 0);
	ASSERT_EQ(st.zc_rx_bytes, 0);
	close(hfd);
	close(lfd);
	unlink(path);
	solo_stop(&t, &g);
}

/*
 * No allocation per packet on the device's data path, zero-copy or not: 1000 packets each way
 * (and the credit updates they cause) cost the device thread no malloc at all once warm.
 */
TEST(no_allocation_per_packet_on_the_host_path)
{
#ifdef ALLOC_COUNTING
	char path[160], err[128];
	struct vsock_hdr h;
	struct tdev t;
	struct tguest g;
	int lfd, hfd, fd2;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			ASSERT_OK(tune_set("no-zerocopy", err, sizeof(err)));
		hfd = solo_start_guest_conn(&t, &g, path, sizeof(path), &lfd);
		for (int i = 0; i < 50; i++)
			hello_world(&g, hfd);
		alloc_thread = t.th;
		atomic_store_explicit(&alloc_count, 0, memory_order_relaxed);
		/* release: publishes alloc_thread to alloc_note (acquire). */
		atomic_store_explicit(&alloc_counting, true, memory_order_release);
		for (int i = 0; i < 1000; i++)
			hello_world(&g, hfd);
		test_note("pass %d (%s): %u allocations by the device thread for 2000 packets",
			  pass, pass ? "no-zerocopy" : "zerocopy",
			  atomic_load_explicit(&alloc_count, memory_order_relaxed));
		ASSERT_EQ(atomic_load_explicit(&alloc_count, memory_order_relaxed), 0);
		/* The hook does count: a new connection allocates its state. */
		h = mkhdr(&g, 2, 40002, 1234, VSOCK_TYPE_STREAM, VSOCK_OP_REQUEST, 0);
		tg_send(&g, &h, NULL);
		fd2 = accept_wait(lfd, WAIT_MS);
		ASSERT_GE(fd2, 0);
		ASSERT_WAIT_FOR(atomic_load_explicit(&alloc_count, memory_order_relaxed) > 0,
				WAIT_MS);
		atomic_store_explicit(&alloc_counting, false, memory_order_relaxed);
		close(fd2);
		close(hfd);
		close(lfd);
		unlink(path);
		solo_stop(&t, &g);
	}
#else
	test_skip("malloc cannot be counted here (not glibc, or under a sanitizer)");
#endif
}

TEST_MAIN()
