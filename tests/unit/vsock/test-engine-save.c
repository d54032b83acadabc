/* SPDX-License-Identifier: MIT */
/*
 * Engine state save and restore (src/vsock/save.c): two engines wired by the pump of
 * vsock-test-util.h; one of them is saved mid-transfer with connections in every state, freed,
 * and restored from the record (through a sealed memfd) into a fresh engine; the transfer then
 * goes on: every byte arrives once and in order, no RST the test did not ask for, credit
 * consistent, timers with the time they had left. And records that are corrupt, inconsistent
 * or too big for the new engine are refused, leaving it empty.
 */
#include <unistd.h>

#include "test.h"
#include "util/macros.h"
#include "util/rec.h"
#include "vsock-test-util.h"

#define PAT(seed, i) ((uint8_t)((i) * 7u + (seed) * 31u + ((i) >> 9)))

/* The sockets a restore handed back, by id. */
struct adopted {
	unsigned n;
	uint64_t id[64];
	struct vsock_sock *s[64];
};

static void adopt_cb(void *arg, struct vsock_sock *s)
{
	struct adopted *a = arg;

	ASSERT_LT(a->n, 64);
	a->id[a->n] = vsock_sock_id(s);
	a->s[a->n++] = s;
}

static struct vsock_sock *by_id(struct adopted *a, uint64_t id)
{
	for (unsigned i = 0; i < a->n; i++)
		if (a->id[i] == id)
			return a->s[i];
	test_fail(__FILE__, __LINE__, "socket id %llu was not handed back",
		  (unsigned long long)id);
}

/* Saves *ep into a sealed memfd and returns it. */
static int save_to_memfd(struct vsock_engine *e)
{
	struct rec_writer wr;
	const uint8_t *b;
	size_t len;
	int fd;

	rec_writer_init(&wr, REC_KIND_ENGINE, 1);
	ASSERT_OK(vsock_engine_save(e, &wr));
	ASSERT_OK(rec_writer_finish(&wr, &b, &len));
	ASSERT_OK(rec_memfd(b, len, "uvsock-engine", &fd));
	rec_writer_free(&wr);
	return fd;
}

/* Restores the record in buf into e; returns restore's result (message on stderr). */
static int restore_buf(struct vsock_engine *e, const uint8_t *buf, size_t len,
		       struct adopted *a)
{
	struct rec_reader r;
	struct rec_doc d;
	int k = rec_open(&d, buf, len, REC_KIND_ENGINE, 1, 1, NULL, 0);

	if (k < 0) {
		test_note("%s", rec_error(&d));
		return k;
	}
	rec_root(&d, &r, "engine");
	k = vsock_engine_restore(e, &r, adopt_cb, a);
	if (k < 0)
		test_note("%s", rec_error(&d));
	rec_doc_fini(&d);
	return k;
}

/* The upgrade of one engine: save *ep, free it, restore into a fresh one made by mk. */
static void restart(struct world *w, struct vsock_engine **ep, uint32_t cid,
		    void (*tweak)(struct vsock_engine_config *cfg), struct adopted *a)
{
	const uint8_t *m;
	size_t mlen;
	int fd = save_to_memfd(*ep);

	vsock_engine_free(*ep);
	*ep = w_engine(w, cid, tweak);
	ASSERT_OK(rec_map_fd(fd, &m, &mlen));
	ASSERT_OK(restore_buf(*ep, m, mlen, a));
	rec_unmap(m, mlen);
	close(fd);
}

/* Sends n pattern bytes from offset *off (as far as credit allows); returns bytes sent. */
static size_t send_pat(struct vsock_sock *s, unsigned seed, size_t *off, size_t n)
{
	uint8_t buf[8192];
	size_t done = 0;

	while (done < n) {
		size_t k = MIN(sizeof(buf), n - done);
		ssize_t r;

		for (size_t i = 0; i < k; i++)
			buf[i] = PAT(seed, *off + i);
		r = send_buf(s, buf, k, 0);
		if (r == -EAGAIN)
			break;
		ASSERT_GT(r, 0);
		*off += (size_t)r;
		done += (size_t)r;
		if ((size_t)r < k)
			break;
	}
	return done;
}

/* Receives what is queued and checks it continues the pattern at *off. */
static size_t recv_pat(struct vsock_sock *s, unsigned seed, size_t *off)
{
	uint8_t buf[8192];
	size_t got = 0;
	ssize_t r;

	while ((r = recv_buf(s, buf, sizeof(buf), 0, NULL)) > 0) {
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != PAT(seed, *off + (size_t)i))
				test_fail(__FILE__, __LINE__, "stream %u: byte %zu is 0x%02x, "
					  "expected 0x%02x", seed, *off + (size_t)i, buf[i],
					  PAT(seed, *off + (size_t)i));
		*off += (size_t)r;
		got += (size_t)r;
	}
	return got;
}

/* Packets held "on the wire" across the restart (they sit in the rings of a real transport). */
struct wire {
	struct vsock_hdr h[8];
	uint8_t *data[8];
	unsigned n;
};

static void wire_pull(struct wire *wi, struct vsock_engine *from, size_t max)
{
	uint8_t *buf = malloc(65536);
	ssize_t n;

	ASSERT_TRUE(buf != NULL);
	n = pull_one(from, &wi->h[wi->n], buf, max);
	ASSERT_GE(n, 0);
	wi->data[wi->n++] = buf;
}

static void wire_feed(struct wire *wi, struct vsock_engine *to)
{
	for (unsigned i = 0; i < wi->n; i++) {
		ASSERT_OK(feed_hdr(to, &wi->h[i], wi->data[i]));
		free(wi->data[i]);
	}
	wi->n = 0;
}

static void with_dgram(struct vsock_engine_config *cfg)
{
	cfg->dgram = true;
}

static int rsts_after(struct world *w, unsigned from)
{
	int n = 0;

	for (unsigned i = from; i < w->nlog; i++)
		n += w->log[i].op == VSOCK_OP_RST;
	return n;
}

TEST(streams_in_every_state_survive_a_restart)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *gl, *ld, *ga, *ha, *gq, *hq, *hc, *gc, *gd, *hd, *ge, *he, *gg, *hg;
	struct vsock_sock *gp, *hp, *x;
	uint64_t id_l, id_ld, id_ha, id_hc, id_he, id_hg;
	size_t a_out = 0, a_in = 0, r_out = 0, r_in = 0;
	struct vsock_engine_stats st0, st1;
	struct vsock_sock_info gi, hi;
	struct adopted ad = {0};
	struct wire to_h = {0}, to_g = {0};
	uint32_t c_port, port, cid;
	uint64_t dl_before;
	unsigned mark;
	uint8_t b1[64];

	/* Listeners: l on h:1000, gl on g:2000, ld a deferred wildcard one on h:3000. */
	connect_pair(w, VSOCK_TYPE_STREAM, 1000, &l, &ga, &ha); /* A */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gl));
	ASSERT_OK(vsock_sock_bind(gl, VMADDR_CID_ANY, 2000));
	ASSERT_OK(vsock_sock_listen(gl, 4));
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &ld));
	ASSERT_OK(vsock_sock_bind(ld, VMADDR_CID_ANY, 3000));
	ASSERT_OK(vsock_sock_listen_deferred(ld, 8, true));
	/* D, E, G: accepted connections; Q: one left in l's accept queue, with bytes; P: a
	 * PENDING child of ld for a port nobody listens on. */
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gd));
	ASSERT_ERR(vsock_sock_connect(gd, 2, 1000), EINPROGRESS);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &ge));
	ASSERT_ERR(vsock_sock_connect(ge, 2, 1000), EINPROGRESS);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gg));
	ASSERT_ERR(vsock_sock_connect(gg, 2, 1000), EINPROGRESS);
	pump(w);
	ASSERT_OK(vsock_sock_accept(l, &hd));
	ASSERT_OK(vsock_sock_accept(l, &he));
	ASSERT_OK(vsock_sock_accept(l, &hg));
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gq));
	ASSERT_ERR(vsock_sock_connect(gq, 2, 1000), EINPROGRESS);
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &gp));
	ASSERT_ERR(vsock_sock_connect(gp, 2, 4444), EINPROGRESS);
	pump(w);
	ASSERT_EQ(vsock_sock_state(gq), VSOCK_SS_CONNECTED);
	ASSERT_EQ(send_buf(gq, "queued", 6, 0), 6);
	/* G: closed by g; h's end is CLOSED and still held by the application. */
	vsock_sock_close(gg);
	pump(w);
	ASSERT_EQ(vsock_sock_state(hg), VSOCK_SS_CLOSED);

	/* From here on nothing is pumped: what h has to send stays queued in h. E: 4 bytes,
	 * then a SHUTDOWN(SEND) that waits for them. D: closed by h, lingering in CLOSING with
	 * its SHUTDOWN queued. C: h connects to gl, its REQUEST queued. */
	ASSERT_EQ(send_buf(he, "last", 4, 0), 4);
	ASSERT_OK(vsock_sock_shutdown(he, VSOCK_SHUTDOWN_SEND));
	vsock_sock_close(hd);
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &hc));
	ASSERT_ERR(vsock_sock_connect(hc, 3, 2000), EINPROGRESS);
	ASSERT_OK(vsock_sock_local_addr(hc, &cid, &c_port));
	/* A: bytes both ways. Some of g's reach h and are read there (fwd_cnt moves, a credit
	 * update may be owed), some reach h unread, the rest stays in g's send ring; h's are all
	 * in its send ring; one packet each way is on the wire at the restart. */
	ASSERT_EQ(send_pat(ga, 1, &a_out, 200000), 200000);
	ASSERT_EQ(send_pat(ha, 2, &r_out, 150000), 150000);
	for (int i = 0; i < 5; i++) {
		struct vsock_hdr h;

		ASSERT_EQ(pull_one(w->g, &h, w->buf, 16384), 16384);
		ASSERT_OK(feed_hdr(w->h, &h, w->buf));
		if (i == 2)
			ASSERT_EQ(recv_pat(ha, 1, &a_in), 3 * 16384);
	}
	wire_pull(&to_h, w->g, 16384);
	wire_pull(&to_g, w->h, 16384);
	dl_before = vsock_engine_next_deadline(w->h);
	ASSERT_NE(dl_before, UINT64_MAX);
	ASSERT_EQ(vsock_sock_state(hd), VSOCK_SS_CLOSING);

	id_l = vsock_sock_id(l);
	id_ld = vsock_sock_id(ld);
	id_ha = vsock_sock_id(ha);
	id_hc = vsock_sock_id(hc);
	id_he = vsock_sock_id(he);
	id_hg = vsock_sock_id(hg);
	vsock_engine_get_stats(w->h, &st0);

	/* ---- the restart, 50 ms after the last call ---- */
	w->now += 50000000ull;
	restart(w, &w->h, 2, NULL, &ad);
	vsock_engine_get_stats(w->h, &st1);
	ASSERT_TRUE(memcmp(&st0, &st1, sizeof(st0)) == 0);
	/* The application's sockets come back (not hd, closed; not the queued children). */
	ASSERT_EQ(ad.n, 6);
	l = by_id(&ad, id_l);
	ld = by_id(&ad, id_ld);
	ha = by_id(&ad, id_ha);
	hc = by_id(&ad, id_hc);
	he = by_id(&ad, id_he);
	hg = by_id(&ad, id_hg);
	/* Timers: the same deadlines (hc's connect timeout first, then hd's linger). */
	ASSERT_EQ_U64(vsock_engine_next_deadline(w->h), dl_before);
	/* The port allocator goes on where it was. */
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &x));
	ASSERT_OK(vsock_sock_bind(x, VMADDR_CID_ANY, VMADDR_PORT_ANY));
	ASSERT_OK(vsock_sock_local_addr(x, &cid, &port));
	ASSERT_EQ(port, c_port + 1);
	vsock_sock_close(x);

	/* ---- and on it goes ---- */
	mark = w->nlog;
	wire_feed(&to_h, w->h);
	wire_feed(&to_g, w->g);
	for (int round = 0; round < 500 && (a_in < 600000 || r_in < 450000); round++) {
		pump(w);
		recv_pat(ha, 1, &a_in);
		recv_pat(ga, 2, &r_in);
		send_pat(ga, 1, &a_out, 600000 - a_out);
		send_pat(ha, 2, &r_out, 450000 - r_out);
	}
	ASSERT_EQ(a_in, 600000);
	ASSERT_EQ(r_in, 450000);
	/* Credit: each side's tx_cnt is the other's fwd_cnt. */
	vsock_sock_get_info(ga, &gi);
	vsock_sock_get_info(ha, &hi);
	ASSERT_EQ(gi.tx_cnt, hi.fwd_cnt);
	ASSERT_EQ(hi.tx_cnt, gi.fwd_cnt);
	ASSERT_EQ(gi.state, VSOCK_SS_CONNECTED);
	ASSERT_EQ(hi.state, VSOCK_SS_CONNECTED);

	/* Q: accepted now, its bytes intact, and it works both ways. */
	ASSERT_OK(vsock_sock_accept(l, &hq));
	ASSERT_EQ(vsock_sock_state(hq), VSOCK_SS_CONNECTED);
	ASSERT_EQ(recv_buf(hq, b1, sizeof(b1), 0, NULL), 6);
	ASSERT_TRUE(memcmp(b1, "queued", 6) == 0);
	ASSERT_EQ(send_buf(hq, "back", 4, 0), 4);
	pump(w);
	ASSERT_EQ(recv_buf(gq, b1, sizeof(b1), 0, NULL), 4);
	/* C: connected by the REQUEST that crossed the restart. */
	ASSERT_EQ(vsock_sock_state(hc), VSOCK_SS_CONNECTED);
	ASSERT_EQ(vsock_sock_take_error(hc), 0);
	ASSERT_OK(vsock_sock_accept(gl, &gc));
	ASSERT_EQ(send_buf(hc, "c", 1, 0), 1);
	pump(w);
	ASSERT_EQ(recv_buf(gc, b1, 1, 0, NULL), 1);
	/* E: the 4 bytes, then end of file; the other direction still open. */
	ASSERT_EQ(recv_buf(ge, b1, sizeof(b1), 0, NULL), 4);
	ASSERT_TRUE(memcmp(b1, "last", 4) == 0);
	ASSERT_EQ(recv_buf(ge, b1, sizeof(b1), 0, NULL), 0);
	ASSERT_EQ(send_buf(ge, "x", 1, 0), 1);
	pump(w);
	ASSERT_EQ(recv_buf(he, b1, 1, 0, NULL), 1);
	/* G: still closed, end of file. */
	ASSERT_EQ(vsock_sock_state(hg), VSOCK_SS_CLOSED);
	ASSERT_EQ(recv_buf(hg, b1, 1, 0, NULL), 0);
	/* P: accepted from ld and confirmed after the restart. */
	ASSERT_OK(vsock_sock_accept(ld, &hp));
	ASSERT_EQ(vsock_sock_state(hp), VSOCK_SS_PENDING);
	ASSERT_OK(vsock_sock_accept_pending(hp));
	pump(w);
	ASSERT_EQ(vsock_sock_state(gp), VSOCK_SS_CONNECTED);
	/* D: g got the SHUTDOWN and answered with an RST, the only RST since the restart. */
	ASSERT_EQ(vsock_sock_state(gd), VSOCK_SS_CLOSED);
	ASSERT_EQ(rsts_after(w, mark), 1);
	ASSERT_EQ(w->log_from[log_find_last(w, VSOCK_OP_RST, -1)], 0);

	vsock_sock_close(hp);
	vsock_sock_close(gp);
	vsock_sock_close(ld);
	vsock_sock_close(hq);
	vsock_sock_close(gq);
	vsock_sock_close(hc);
	vsock_sock_close(gc);
	vsock_sock_close(gl);
	vsock_sock_close(gd);
	vsock_sock_close(ge);
	vsock_sock_close(he);
	vsock_sock_close(hg);
	pair_free(w, l, ga, ha);
}

TEST(seqpacket_half_sent_and_half_received_messages)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *g, *h;
	struct adopted ad = {0};
	static uint8_t big[100000], got[100000];
	struct wire wi = {0};
	uint64_t id, id_l;
	int mf = 0;

	connect_pair(w, VSOCK_TYPE_SEQPACKET, 1100, &l, &g, &h);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = PAT(9, i);
	/* h -> g: a message h has started to send (msg_sent > 0); g -> h: one h has started to
	 * receive (an open message in its receive queue), one more piece on the wire. */
	ASSERT_EQ(send_buf(h, big, sizeof(big), VSOCK_MSG_EOR), (ssize_t)sizeof(big));
	ASSERT_EQ(send_buf(h, "m2", 2, 0), 2);
	for (int i = 0; i < 2; i++) {
		struct vsock_hdr hd;

		ASSERT_EQ(pull_one(w->h, &hd, w->buf, 4096), 4096);
		ASSERT_OK(feed_hdr(w->g, &hd, w->buf));
	}
	ASSERT_EQ(send_buf(g, big, 50000, 0), 50000);
	for (int i = 0; i < 3; i++) {
		struct vsock_hdr hd;

		ASSERT_EQ(pull_one(w->g, &hd, w->buf, 4096), 4096);
		ASSERT_OK(feed_hdr(w->h, &hd, w->buf));
	}
	wire_pull(&wi, w->g, 4096);
	id = vsock_sock_id(h);
	id_l = vsock_sock_id(l);

	restart(w, &w->h, 2, NULL, &ad);
	h = by_id(&ad, id);
	l = by_id(&ad, id_l);
	wire_feed(&wi, w->h);
	pump(w);
	ASSERT_EQ(recv_buf(g, got, sizeof(got), 0, &mf), (ssize_t)sizeof(big));
	ASSERT_TRUE(memcmp(got, big, sizeof(big)) == 0);
	ASSERT_TRUE(mf & VSOCK_MSG_EOR);
	ASSERT_EQ(recv_buf(g, got, sizeof(got), 0, &mf), 2);
	ASSERT_EQ(recv_buf(h, got, sizeof(got), 0, &mf), 50000);
	ASSERT_TRUE(memcmp(got, big, 50000) == 0);
	ASSERT_EQ(log_count(w, VSOCK_OP_RST, -1), 0);
	pair_free(w, l, g, h);
}

TEST(datagrams_queued_both_ways)
{
	struct world *w = world_new(with_dgram);
	struct vsock_sock *gs, *hs;
	struct vsock_dgram_addr to = {3, 7000}, src;
	struct adopted ad = {0};
	struct iovec iov;
	uint8_t buf[64];
	uint64_t id;

	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_DGRAM, &gs));
	ASSERT_OK(vsock_sock_bind(gs, VMADDR_CID_ANY, 7000));
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_DGRAM, &hs));
	ASSERT_OK(vsock_sock_bind(hs, VMADDR_CID_ANY, 7001));
	ASSERT_OK(vsock_dgram_set_buf(hs, true, 100000));
	/* g -> h: delivered to h's queue before the restart; h -> g: still in h's send queue. */
	to = (struct vsock_dgram_addr){2, 7001};
	iov = (struct iovec){(void *)"to-h", 4};
	ASSERT_EQ(vsock_dgram_send(gs, &to, &iov, 1), 4);
	pump(w);
	to = (struct vsock_dgram_addr){3, 7000};
	iov = (struct iovec){(void *)"to-g-1", 6};
	ASSERT_EQ(vsock_dgram_send(hs, &to, &iov, 1), 6);
	iov = (struct iovec){(void *)"to-g-2", 6};
	ASSERT_EQ(vsock_dgram_send(hs, &to, &iov, 1), 6);
	id = vsock_sock_id(hs);

	restart(w, &w->h, 2, with_dgram, &ad);
	ASSERT_EQ(ad.n, 1);
	hs = by_id(&ad, id);
	{
		uint64_t v;

		ASSERT_OK(vsock_dgram_get_buf(hs, true, &v));
		ASSERT_EQ(v, 200000);
	}
	iov = (struct iovec){buf, sizeof(buf)};
	ASSERT_EQ(vsock_dgram_recv(hs, &iov, 1, 0, NULL, &src), 4);
	ASSERT_TRUE(memcmp(buf, "to-h", 4) == 0);
	ASSERT_EQ(src.cid, 3);
	ASSERT_EQ(src.port, 7000);
	pump(w);
	ASSERT_EQ(vsock_dgram_recv(gs, &iov, 1, 0, NULL, &src), 6);
	ASSERT_TRUE(memcmp(buf, "to-g-1", 6) == 0);
	ASSERT_EQ(src.port, 7001);
	ASSERT_EQ(vsock_dgram_recv(gs, &iov, 1, 0, NULL, &src), 6);
	ASSERT_TRUE(memcmp(buf, "to-g-2", 6) == 0);
	/* Still bound: a new datagram reaches it. */
	to = (struct vsock_dgram_addr){2, 7001};
	iov = (struct iovec){(void *)"again", 5};
	ASSERT_EQ(vsock_dgram_send(gs, &to, &iov, 1), 5);
	pump(w);
	iov = (struct iovec){buf, sizeof(buf)};
	ASSERT_EQ(vsock_dgram_recv(hs, &iov, 1, 0, NULL, &src), 5);
	vsock_sock_close(gs);
	vsock_sock_close(hs);
	world_free(w);
}

/* ---- refusals ---------------------------------------------------------------------------- */


/* Finds field `tag` of the last socket item of the top-level list; returns its value's offset. */
static size_t last_sock_field(const uint8_t *buf, size_t len, uint32_t tag)
{
	struct rec_reader r, socks, s;
	struct rec_item it, last = {0};
	struct rec_doc d;
	size_t off = 0;

	ASSERT_OK(rec_open(&d, buf, len, REC_KIND_ENGINE, 1, 1, NULL, 0));
	rec_root(&d, &r, "engine");
	while (rec_next(&r, &it) > 0)
		if (it.tag == 6) /* E_SOCKS (docs/upgrade.md) */
			break;
	ASSERT_EQ(it.tag, 6);
	ASSERT_OK(rec_enter(&r, &it, "sockets", &socks));
	while (rec_next(&socks, &it) > 0)
		last = it;
	ASSERT_EQ(last.tag, 0x10);
	ASSERT_OK(rec_enter(&socks, &last, "socket", &s));
	while (rec_next(&s, &it) > 0)
		if (it.tag == tag)
			off = (size_t)(it.val - buf);
	rec_doc_fini(&d);
	ASSERT_NE(off, 0);
	return off;
}

/* A fresh engine is empty: nothing open, pending, armed; ports free. */
static void assert_empty(struct vsock_engine *e, struct adopted *a)
{
	struct vsock_engine_stats st;
	struct vsock_sock *s;

	ASSERT_EQ(a->n, 0);
	vsock_engine_get_stats(e, &st);
	ASSERT_EQ(st.socks_open, 0);
	ASSERT_EQ(st.socks_total, 0);
	ASSERT_FALSE(vsock_engine_has_pending(e));
	ASSERT_EQ_U64(vsock_engine_next_deadline(e), UINT64_MAX);
	ASSERT_OK(vsock_sock_new(e, VSOCK_TYPE_STREAM, &s));
	ASSERT_OK(vsock_sock_bind(s, VMADDR_CID_ANY, 1000));
	vsock_sock_close(s);
}

/* A record of h with a listener, a connection carrying bytes both ways, and more. */
static uint8_t *busy_record(size_t *ret_len, unsigned *ret_socks)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l, *g, *h;
	const uint8_t *m;
	uint8_t *copy;
	size_t off = 0, mlen;
	int fd;

	connect_pair(w, VSOCK_TYPE_STREAM, 1000, &l, &g, &h);
	ASSERT_GT(send_pat(g, 1, &off, 100000), 0);
	pump(w);
	off = 0;
	ASSERT_GT(send_pat(h, 2, &off, 1000), 0);
	fd = save_to_memfd(w->h);
	ASSERT_OK(rec_map_fd(fd, &m, &mlen));
	copy = malloc(mlen);
	memcpy(copy, m, mlen);
	rec_unmap(m, mlen);
	close(fd);
	*ret_len = mlen;
	*ret_socks = 2;
	pair_free(w, l, g, h);
	return copy;
}

/*
 * Sets field `tag` (of `size` bytes) of the last socket of the record b to v, checks that a
 * fresh engine refuses it and stays empty, and puts the record back as it was.
 */
static void refused_with(struct world *w, uint8_t *b, size_t len, uint32_t tag, size_t size,
			 uint64_t v)
{
	size_t off = last_sock_field(b, len, tag);
	struct vsock_engine *e = w_engine(w, 2, NULL);
	struct adopted ad = {0};
	uint8_t save[8];

	memcpy(save, b + off, size);
	for (size_t i = 0; i < size; i++)
		b[off + i] = (uint8_t)(v >> (8 * i));
	rec_reseal(b, len);
	ASSERT_ERR(restore_buf(e, b, len, &ad), EBADMSG);
	assert_empty(e, &ad);
	memcpy(b + off, save, size);
	rec_reseal(b, len);
	vsock_engine_free(e);
}

TEST(corrupt_records_are_refused_and_leave_the_engine_empty)
{
	struct world *w = world_new(NULL);
	struct adopted ad = {0};
	unsigned nsocks;
	size_t len;
	uint8_t *b = busy_record(&len, &nsocks);
	struct vsock_engine *e;

	/* A flipped byte, a truncation. */
	e = w_engine(w, 2, NULL);
	b[len / 2] ^= 0x40;
	ASSERT_ERR(restore_buf(e, b, len, &ad), EBADMSG);
	b[len / 2] ^= 0x40;
	ASSERT_ERR(restore_buf(e, b, len - 1, &ad), EBADMSG);
	assert_empty(e, &ad);
	vsock_engine_free(e);

	/* Intact but inconsistent, on the last socket of the record (the listener; the connection
	 * before it, with its queues and table entries, was built already): its rx_limit below its
	 * buf_alloc, its state out of range, marked closed by the application while still
	 * listening, its id equal to the connection's (the listener is 1, the connection 2). */
	refused_with(w, b, len, 18 /* S_RX_LIMIT */, 4, 256);
	refused_with(w, b, len, 3 /* S_STATE */, 4, 42);
	refused_with(w, b, len, 4 /* S_FLAGS */, 4, 4 /* F_APP_CLOSED */ | 1 /* F_BOUND */);
	refused_with(w, b, len, 1 /* S_ID */, 8, 2);

	rec_reseal(b, len);
	e = w_engine(w, 2, NULL);
	ASSERT_OK(restore_buf(e, b, len, &ad)); /* the intact record restores */
	ASSERT_EQ(ad.n, nsocks);
	for (unsigned i = 0; i < ad.n; i++)
		vsock_sock_close(ad.s[i]);
	/* ... and not into an engine that is no longer fresh. */
	ad.n = 0;
	{
		struct vsock_sock *s;

		ASSERT_OK(vsock_sock_new(e, VSOCK_TYPE_STREAM, &s));
		ASSERT_ERR(restore_buf(e, b, len, &ad), EBUSY);
		vsock_sock_close(s);
	}
	vsock_engine_free(e);
	free(b);
	world_free(w);
}

static void one_sock_max(struct vsock_engine_config *cfg)
{
	cfg->max_socks = 1;
}

TEST(more_sockets_than_max_socks_refused)
{
	struct world *w = world_new(NULL);
	struct adopted ad = {0};
	unsigned nsocks;
	size_t len;
	uint8_t *b = busy_record(&len, &nsocks);
	struct vsock_engine *e = w_engine(w, 2, one_sock_max);

	/* The record has the connection, then the listener: the second is one too many. */
	ASSERT_ERR(restore_buf(e, b, len, &ad), EMFILE);
	assert_empty(e, &ad);
	vsock_engine_free(e);
	free(b);
	world_free(w);
}

/* ---- crash survival: the restarted engine ends the connections the dead one had --------------- */

static void small_ring(struct vsock_engine_config *cfg)
{
	cfg->reply_limit = 2;
}

TEST(reset_conn_ends_what_a_dead_engine_had)
{
	struct world *w = world_new(small_ring);
	struct vsock_sock *l, *g1, *h1, *g2, *h2, *l2, *c, *a;
	uint32_t cid[2], lport[2], pcid[2], pport[2];
	struct vsock_sock *gs[2];
	uint8_t *conns_rec;
	size_t conns_len;
	uint8_t b[8];

	connect_pair(w, VSOCK_TYPE_STREAM, 1000, &l, &g1, &h1);
	connect_pair(w, VSOCK_TYPE_SEQPACKET, 1001, &l2, &g2, &h2);
	ASSERT_EQ(send_buf(h1, "x", 1, 0), 1);
	pump(w);
	ASSERT_EQ(recv_buf(g1, b, 1, 0, NULL), 1);
	/* The guest side waits for more; what the host side knew survives as addresses only, in
	 * the small record kept outside the process. */
	gs[0] = g1;
	gs[1] = g2;
	for (int i = 0; i < 2; i++) {
		ASSERT_OK(vsock_sock_local_addr(gs[i], &pcid[i], &pport[i]));
		ASSERT_OK(vsock_sock_peer_addr(gs[i], &cid[i], &lport[i]));
	}
	{
		struct rec_writer wr;
		const uint8_t *rb;
		size_t rlen;

		rec_writer_init(&wr, REC_KIND_ENGINE, 1);
		ASSERT_OK(vsock_engine_save_conns(w->h, &wr));
		ASSERT_OK(rec_writer_finish(&wr, &rb, &rlen));
		conns_rec = malloc(rlen);
		memcpy(conns_rec, rb, rlen);
		conns_len = rlen;
		rec_writer_free(&wr);
	}
	/* h dies (nothing sent) and a fresh engine takes its place. */
	vsock_engine_free(w->h);
	w->h = w_engine(w, 2, small_ring);
	ASSERT_ERR(vsock_engine_reset_conn(w->h, VSOCK_TYPE_DGRAM, lport[0], pcid[0], pport[0]),
		   EINVAL);
	/* The ring holds reply_limit (2) RSTs: a third waits for a pull. */
	ASSERT_OK(vsock_engine_reset_conn(w->h, VSOCK_TYPE_STREAM, 5, pcid[0], 5));
	ASSERT_OK(vsock_engine_reset_conn(w->h, VSOCK_TYPE_STREAM, 6, pcid[0], 6));
	ASSERT_ERR(vsock_engine_reset_conn(w->h, VSOCK_TYPE_STREAM, 7, pcid[0], 7), ENOBUFS);
	pump(w);
	{
		struct vsock_conn_addr *ca;
		struct rec_reader rr;
		struct rec_doc d;
		size_t n;

		ASSERT_OK(rec_open(&d, conns_rec, conns_len, REC_KIND_ENGINE, 1, 1, NULL, 0));
		rec_root(&d, &rr, "connections");
		ASSERT_OK(vsock_engine_read_conns(&rr, 16, &ca, &n));
		ASSERT_EQ(n, 2); /* the two connections (the listeners are not) */
		for (size_t i = 0; i < n; i++) {
			bool found = false;

			for (int j = 0; j < 2; j++)
				found |= ca[i].local_port == lport[j] && ca[i].peer_cid == pcid[j] &&
					 ca[i].peer_port == pport[j];
			ASSERT_TRUE(found);
			ASSERT_OK(vsock_engine_reset_conn(w->h, ca[i].type, ca[i].local_port,
							  ca[i].peer_cid, ca[i].peer_port));
		}
		free(ca);
		rec_root(&d, &rr, "connections");
		ASSERT_ERR(vsock_engine_read_conns(&rr, 1, &ca, &n), E2BIG);
		rec_doc_fini(&d);
		free(conns_rec);
	}
	pump(w);
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(vsock_sock_state(gs[i]), VSOCK_SS_CLOSED);
		ASSERT_EQ(recv_buf(gs[i], b, sizeof(b), 0, NULL), 0); /* end of file, at once */
	}
	/* New connections work; one the engine has is not ended. */
	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, 1000));
	ASSERT_OK(vsock_sock_listen(l, 4));
	ASSERT_OK(vsock_sock_new(w->g, VSOCK_TYPE_STREAM, &c));
	ASSERT_ERR(vsock_sock_connect(c, 2, 1000), EINPROGRESS);
	pump(w);
	ASSERT_OK(vsock_sock_accept(l, &a));
	ASSERT_OK(vsock_sock_local_addr(c, &pcid[0], &pport[0]));
	ASSERT_ERR(vsock_engine_reset_conn(w->h, VSOCK_TYPE_STREAM, 1000, pcid[0], pport[0]),
		   EEXIST);
	ASSERT_EQ(send_buf(c, "y", 1, 0), 1);
	pump(w);
	ASSERT_EQ(recv_buf(a, b, 1, 0, NULL), 1);
	vsock_sock_close(g1);
	vsock_sock_close(g2);
	pair_free(w, l, c, a);
}

TEST_MAIN()
