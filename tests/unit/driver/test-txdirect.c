/* SPDX-License-Identifier: MIT */
/*
 * Direct TX of the guest role (src/driver/driver.h vdrv_tx_send; docs/guest-role.md "Direct
 * TX"), against the device role in-process: a send on an idle connection reaches the host
 * through the direct path (tx_direct_pkts; a small one once the device holds no TX buffer), no-tx-direct keeps every byte on the engine's path,
 * a send behind a queued control packet or queued bytes falls back and keeps the order, a flood
 * the host does not read never exceeds the device's credit, and many threads sending on many
 * connections at once deliver every byte intact.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "guestside.h"
#include "lib/lib.h"
#include "driver/driver.h"
#include "util/time.h"
#include "util/tune.h"
#include "drvtest.h"
#include "test.h"

#define NCONN 6
#define PER_CONN (3u << 20)

static struct vdrv_stats dstats(struct uvsock_ctx *g)
{
	struct vdrv_stats st;

	vdrv_get_stats(lib_ctx_guest_vdrv(g), &st);
	return st;
}

/* 1 MiB guest -> host in 64 KiB writes from a thread, the host checking the pattern. */
static void send_mib(struct conn *c, uint64_t seed)
{
	struct host_io hr = { .fd = c->hfd, .total = 1u << 20, .seed = seed };
	pthread_t th;

	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	g_send_pattern(c->gfd, 1u << 20, 65536, seed);
	pthread_join(th, NULL);
	ASSERT_TRUE(hr.ok);
}

/*
 * A small send goes direct only while the device holds none of our TX buffers: sends one byte
 * `ch` at a time (each read back by the host) until one went direct, within WAIT_MS. On an
 * idle connection that is the first or second one.
 */
static void small_send_goes_direct(struct conn *c, char ch)
{
	uint64_t before = dstats(c->g).tx_direct_bytes;
	uint64_t until = mono_ms() + WAIT_MS;
	char got;

	for (;;) {
		ASSERT_EQ(uvsock_send(c->gfd, &ch, 1, 0), 1);
		ASSERT_EQ(hs_read_full(c->hfd, &got, 1, WAIT_MS), 1);
		ASSERT_EQ(got, ch);
		if (dstats(c->g).tx_direct_bytes > before)
			break;
		ASSERT_LT(mono_ms(), until);
		test_sleep_ms(1);
	}
	ASSERT_EQ_U64(dstats(c->g).tx_direct_bytes - before, 1);
}

TEST(send_on_an_idle_connection_goes_direct)
{
	struct vdrv_stats a, b;
	uint8_t *buf = malloc(65536);
	struct conn c;

	ASSERT_TRUE(buf != NULL);
	conn_open(&c);
	/* The handshake is over (the host's CONNECT got its OK): nothing is queued for us, and a
	 * whole packet goes direct whatever the device still holds. */
	hs_fill(buf, 65536, 10, 0);
	a = dstats(c.g);
	ASSERT_EQ(uvsock_send(c.gfd, buf, 65536, 0), 65536);
	b = dstats(c.g);
	ASSERT_EQ_U64(b.tx_direct_pkts - a.tx_direct_pkts, 1);
	ASSERT_EQ_U64(b.tx_direct_bytes - a.tx_direct_bytes, 65536);
	memset(buf, 0, 65536);
	ASSERT_EQ(hs_read_full(c.hfd, buf, 65536, WAIT_MS), 65536);
	ASSERT_EQ(hs_check(buf, 65536, 10, 0), 65536);
	small_send_goes_direct(&c, 'p');
	free(buf);
	send_mib(&c, 11);
	b = dstats(c.g);
	ASSERT_GT(b.tx_direct_bytes, a.tx_direct_bytes + 65537);
	ASSERT_LE(b.tx_direct_bytes, b.tx_bytes);
	conn_close(&c);
}

TEST(no_tx_direct_keeps_the_engine_path)
{
	char err[160];
	struct conn c;

	ASSERT_EQ(tune_set("no-tx-direct", err, sizeof(err)), 0);
	conn_open(&c);
	send_mib(&c, 12);
	ASSERT_EQ_U64(dstats(c.g).tx_direct_pkts, 0);
	ASSERT_EQ_U64(dstats(c.g).tx_direct_bytes, 0);
	ASSERT_GE(dstats(c.g).tx_bytes, 1u << 20);
	conn_close(&c);
	ASSERT_EQ(tune_set("tx-direct", err, sizeof(err)), 0);
}

/*
 * With the I/O thread held off TX, a SHUTDOWN (control packet) is queued in the engine: the
 * sends after it fall back behind it, and the second one behind the first one's queued bytes;
 * released, everything arrives in order. Once the engine is empty again a send goes direct.
 */
TEST(send_behind_queued_packets_falls_back_in_order)
{
	struct vdrv *d;
	struct vdrv_stats a;
	struct conn c;
	char buf[6];

	conn_open(&c);
	d = lib_ctx_guest_vdrv(c.g);
	vdrv_test_io_tx(d, false);
	a = dstats(c.g);
	ASSERT_EQ(uvsock_shutdown(c.gfd, SHUT_RD), 0);
	ASSERT_EQ(uvsock_send(c.gfd, "ab", 2, 0), 2);
	ASSERT_EQ(uvsock_send(c.gfd, "cd", 2, 0), 2);
	ASSERT_EQ_U64(dstats(c.g).tx_direct_pkts, a.tx_direct_pkts);
	ASSERT_EQ_U64(dstats(c.g).tx_pkts, a.tx_pkts);
	vdrv_test_io_tx(d, true);
	ASSERT_EQ(hs_read_full(c.hfd, buf, 4, WAIT_MS), 4);
	ASSERT_MEMEQ(buf, "abcd", 4);
	ASSERT_EQ_U64(dstats(c.g).tx_direct_pkts, a.tx_direct_pkts);
	/* The host read them: the I/O thread pulled all, nothing is queued for us any more. */
	small_send_goes_direct(&c, 'e');
	conn_close(&c);
}

/*
 * The host reads nothing: non-blocking sends run until the credit (and the host socket's
 * buffer behind the device) is used up, then EAGAIN. The device never saw more than its credit
 * (no credit violation, the connection lives), and every byte then arrives intact.
 */
TEST(flood_never_exceeds_the_credit)
{
	struct vsock_dev_status ds;
	struct host_io hr;
	uint8_t *buf = malloc(65536);
	size_t sent = 0;
	struct conn c;
	pthread_t th;

	ASSERT_TRUE(buf != NULL);
	conn_open(&c);
	for (unsigned tries = 0; tries < 100000; tries++) {
		ssize_t r;

		hs_fill(buf, 65536, 13, sent);
		r = uvsock_send(c.gfd, buf, 65536, MSG_DONTWAIT);
		if (r < 0) {
			ASSERT_EQ(errno, EAGAIN);
			break;
		}
		ASSERT_GT(r, 0);
		sent += (size_t)r;
	}
	ASSERT_GT(sent, 0);
	ASSERT_GT(dstats(c.g).tx_direct_bytes, 0);
	hr = (struct host_io){ .fd = c.hfd, .total = sent, .seed = 13 };
	ASSERT_EQ(pthread_create(&th, NULL, host_recv_main, &hr), 0);
	pthread_join(th, NULL);
	ASSERT_TRUE(hr.ok);
	vsock_dev_get_status(c.t.d, &ds);
	ASSERT_TRUE(ds.have_engine);
	ASSERT_EQ_U64(ds.eng.credit_violations, 0);
	/* Still connected both ways. */
	ASSERT_EQ(uvsock_send(c.gfd, "z", 1, 0), 1);
	ASSERT_EQ(hs_read_full(c.hfd, buf, 1, WAIT_MS), 1);
	ASSERT_EQ(buf[0], 'z');
	free(buf);
	conn_close(&c);
}

struct sender {
	int gfd, hfd;
	uint64_t seed;
	struct host_io hr;
	pthread_t tg, th;
};

static void *sender_main(void *arg)
{
	struct sender *s = arg;

	/* Odd sizes, so packets end at every offset of the pattern. */
	g_send_pattern(s->gfd, PER_CONN, 40000 + (size_t)s->seed * 777, s->seed);
	return NULL;
}

/* NCONN threads send on NCONN connections at once, NCONN host threads check every byte. */
TEST(many_threads_many_sockets_intact)
{
	struct sender s[NCONN];
	struct tdev t;
	struct uvsock_ctx *g;
	int ls;

	tdev_start(&t, 3);
	g = g_guest_new(t.sock, NULL);
	ls = g_listen(g, SOCK_STREAM, 6000);
	for (unsigned i = 0; i < NCONN; i++) {
		s[i] = (struct sender){ .seed = 100 + i };
		s[i].gfd = g_accept_host(ls, t.uds, SOCK_STREAM, 6000, &s[i].hfd);
		g_set_timeouts(s[i].gfd, WAIT_MS);
		s[i].hr = (struct host_io){ .fd = s[i].hfd, .total = PER_CONN, .seed = s[i].seed };
	}
	for (unsigned i = 0; i < NCONN; i++) {
		ASSERT_EQ(pthread_create(&s[i].th, NULL, host_recv_main, &s[i].hr), 0);
		ASSERT_EQ(pthread_create(&s[i].tg, NULL, sender_main, &s[i]), 0);
	}
	for (unsigned i = 0; i < NCONN; i++) {
		pthread_join(s[i].tg, NULL);
		pthread_join(s[i].th, NULL);
		ASSERT_TRUE(s[i].hr.ok);
		uvsock_close(s[i].gfd);
		close(s[i].hfd);
	}
	ASSERT_GT(dstats(g).tx_direct_pkts, 0);
	test_note("tx_pkts %" PRIu64 " direct %" PRIu64 " wakeups %" PRIu64, dstats(g).tx_pkts,
		  dstats(g).tx_direct_pkts, dstats(g).wakeups);
	uvsock_close(ls);
	uvsock_ctx_free(g);
	tdev_stop(&t);
}

TEST_MAIN()
