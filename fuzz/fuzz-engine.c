/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the vsock protocol engine. The input is a little program: each command byte
 * picks an action (hand-made packet into the host engine, socket calls on either engine, moving
 * packets between the two engines with a chosen max_payload, advancing the fake clock, a batch
 * feed, a transport reset) and the following bytes are its arguments. Two engines (guest CID 3,
 * host CID 2) are wired as in the unit tests.
 *
 * Invariants checked (abort on violation): every pulled packet passes vsock_hdr_check with its
 * own length (but the RST answering an unknown type, which echoes it) and respects max_payload;
 * receive memory stays below its bound; and after closing every socket, pumping and letting
 * 30 s pass, no socket, timer, pending packet or queued reply is left in either engine.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vsock/engine.h"

#define NSOCK 12
#define MAX_STEPS 2000
#define BUF_MAX_LIMIT (1u << 20)
#define RX_MEM_BOUND (2ull * BUF_MAX_LIMIT + 65536 + 4096)

struct fz {
	const uint8_t *p;
	size_t n;
	uint64_t now;
	struct vsock_engine *e[2]; /* 0: guest CID 3, 1: host CID 2 */
	struct vsock_sock *s[NSOCK];
	int owner[NSOCK];
	uint8_t buf[65536];
};

#define CHECK(c)                                                                                   \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "fuzz-engine: invariant failed: %s (line %d)\n", #c,       \
				__LINE__);                                                         \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

static uint8_t u8(struct fz *f)
{
	if (!f->n)
		return 0;
	f->n--;
	return *f->p++;
}

static uint16_t u16(struct fz *f)
{
	return (uint16_t)(u8(f) | u8(f) << 8);
}

static uint32_t u32(struct fz *f)
{
	return (uint32_t)u16(f) | (uint32_t)u16(f) << 16;
}

static uint64_t fz_now(void *opaque)
{
	return ((struct fz *)opaque)->now;
}

static void fz_event(void *opaque, struct vsock_sock *s, void *user, unsigned mask)
{
	(void)opaque;
	(void)s;
	(void)user;
	(void)mask;
}

static const struct vsock_engine_ops fz_ops = {.now = fz_now, .sock_event = fz_event};

static uint32_t port_of(uint8_t b)
{
	return 1024 + (b % 8);
}

static void check_pkt(const struct vsock_hdr *h, ssize_t n, size_t max_payload)
{
	CHECK(n >= 0);
	CHECK((size_t)n <= max_payload || n == 0);
	CHECK(h->len == (uint32_t)n);
	enum vsock_hdr_error herr = vsock_hdr_check(h, (size_t)n);

	if (herr != VSOCK_HDR_OK && !(herr == VSOCK_HDR_BAD_TYPE && h->op == VSOCK_OP_RST))
		fprintf(stderr, "pulled packet: %s op %u type %u len %u flags %u\n",
			vsock_hdr_error_to_string(herr), h->op, h->type, h->len, h->flags);
	/* The RST answering an unknown type echoes that type (as Linux); all else is valid. */
	CHECK(herr == VSOCK_HDR_OK || (herr == VSOCK_HDR_BAD_TYPE && h->op == VSOCK_OP_RST));
}

/* Moves up to `count` packets each way. */
static void pump(struct fz *f, unsigned count, size_t max_payload)
{
	for (unsigned i = 0; i < count; i++) {
		bool any = false;

		for (int d = 0; d < 2; d++) {
			struct vsock_hdr h;
			struct iovec iov = {f->buf, max_payload};
			ssize_t n = vsock_engine_pull(f->e[d], &h, &iov, 1, max_payload);

			if (n == -EAGAIN)
				continue;
			check_pkt(&h, n, max_payload);
			iov.iov_len = (size_t)n;
			(void)vsock_engine_feed(f->e[!d], &h, &iov, 1);
			any = true;
		}
		if (!any)
			break;
	}
}

static void check_socks(struct fz *f)
{
	for (int i = 0; i < NSOCK; i++) {
		struct vsock_sock_info info;

		if (!f->s[i])
			continue;
		vsock_sock_get_info(f->s[i], &info);
		CHECK(info.rx_mem <= RX_MEM_BOUND);
		CHECK(info.rx_bytes <= BUF_MAX_LIMIT);
	}
}

static void crafted(struct fz *f, struct vsock_hdr *h, const uint8_t **payload)
{
	uint8_t sel = u8(f);

	*h = (struct vsock_hdr){
		.src_cid = (sel & 0x80) ? u32(f) : 3,
		.dst_cid = (sel & 0x40) ? u32(f) : 2,
		.src_port = port_of(u8(f)),
		.dst_port = port_of(u8(f)),
		.type = (sel & 0x20) ? u8(f) : (uint16_t)(1 + (sel & 1)),
		.op = (uint16_t)(u8(f) % 9),
		.flags = u8(f) % 8,
		.buf_alloc = (sel & 0x10) ? u32(f) : 262144,
		.fwd_cnt = (sel & 0x08) ? u32(f) : 0,
	};
	if (sel & 0x04)
		h->src_port = u32(f);
	h->len = h->op == 5 ? u16(f) % 2048 : 0;
	if (h->len > f->n)
		h->len = (uint32_t)f->n;
	*payload = f->p;
	f->p += h->len;
	f->n -= h->len;
}

static void step(struct fz *f)
{
	uint8_t cmd = u8(f);
	int i = u8(f) % NSOCK;
	struct vsock_sock *s = f->s[i];

	switch (cmd % 14) {
	case 0: { /* hand-made packet into the host engine */
		struct vsock_hdr h;
		const uint8_t *pl;
		struct iovec iov;

		crafted(f, &h, &pl);
		iov = (struct iovec){(void *)pl, h.len};
		(void)vsock_engine_feed(f->e[1], &h, &iov, 1);
		break;
	}
	case 1: /* new socket */
		if (!s) {
			int side = u8(f) & 1;
			if (vsock_sock_new(f->e[side], (u8(f) & 1) ? VSOCK_TYPE_SEQPACKET
								    : VSOCK_TYPE_STREAM,
					   &f->s[i]) == 0)
				f->owner[i] = side;
		}
		break;
	case 2: /* bind + listen */
		if (s) {
			uint8_t how = u8(f);
			(void)vsock_sock_bind(s, VMADDR_CID_ANY,
					      (how & 1) ? VMADDR_PORT_ANY : port_of(u8(f)));
			if (how & 2)
				(void)vsock_sock_listen_deferred(s, u8(f) % 4, how & 4);
			else
				(void)vsock_sock_listen(s, u8(f) % 4);
		}
		break;
	case 3: /* connect to the other engine */
		if (s)
			(void)vsock_sock_connect(s, f->owner[i] ? 3 : 2, port_of(u8(f)));
		break;
	case 4: { /* send */
		if (s) {
			uint32_t len = u16(f) % 70000;
			static uint8_t data[70000];
			struct iovec iov[2] = {{data, len / 2}, {data + len / 2, len - len / 2}};
			(void)vsock_sock_send(s, iov, 2, (u8(f) & 1) ? VSOCK_MSG_EOR : 0);
		}
		break;
	}
	case 5: { /* recv */
		if (s) {
			static uint8_t data[70000];
			uint8_t fl = u8(f);
			struct iovec iov = {data, u16(f) % sizeof(data)};
			int mf;
			(void)vsock_sock_recv(s, &iov, 1,
					      ((fl & 1) ? VSOCK_MSG_PEEK : 0) |
						      ((fl & 2) ? VSOCK_MSG_TRUNC : 0),
					      &mf);
			if (fl & 4) {
				struct iovec zc[4];
				ssize_t n = vsock_sock_rx_peek_iov(s, zc, 4);
				if (n > 0)
					vsock_sock_rx_consume(s, (size_t)u16(f));
			}
		}
		break;
	}
	case 6:
		if (s)
			(void)vsock_sock_shutdown(s, u8(f) % 5);
		break;
	case 7:
		if (s) {
			vsock_sock_close(s);
			f->s[i] = NULL;
		}
		break;
	case 8:
		pump(f, 1 + u8(f) % 64, 1 + (size_t)(u16(f) % 65536));
		break;
	case 9:
		f->now += (uint64_t)u16(f) * 1000000ull;
		vsock_engine_run_timers(f->e[0]);
		vsock_engine_run_timers(f->e[1]);
		break;
	case 10:
		if (s) {
			uint8_t o = u8(f) % 6;
			uint64_t v = u32(f) % (BUF_MAX_LIMIT + 1);
			(void)vsock_sock_setopt(s, (enum vsock_sockopt)o, v);
		}
		break;
	case 11: /* accept into a free slot; confirm or reject deferred children */
		if (s) {
			struct vsock_sock *c;
			int j;
			for (j = 0; j < NSOCK && f->s[j]; j++)
				;
			if (j < NSOCK && vsock_sock_accept(s, &c) == 0) {
				f->s[j] = c;
				f->owner[j] = f->owner[i];
				if (vsock_sock_state(c) == VSOCK_SS_PENDING) {
					if (u8(f) & 1)
						(void)vsock_sock_accept_pending(c);
					else
						vsock_sock_reject(c);
				}
			}
		}
		break;
	case 12: { /* a batch of hand-made packets */
		struct vsock_pkt_ref refs[8];
		struct iovec iovs[8];
		int n = 1 + u8(f) % 8;
		for (int k = 0; k < n; k++) {
			const uint8_t *pl;
			crafted(f, &refs[k].hdr, &pl);
			iovs[k] = (struct iovec){(void *)pl, refs[k].hdr.len};
			refs[k].iov = &iovs[k];
			refs[k].iovcnt = 1;
		}
		vsock_engine_feed_batch(f->e[1], refs, (size_t)n);
		break;
	}
	case 13:
		if ((u8(f) & 7) == 0)
			vsock_engine_transport_reset(f->e[u8(f) & 1], VMADDR_CID_ANY);
		else if (s)
			(void)vsock_sock_request_credit(s);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fz f;
	struct vsock_engine_config cfg;
	struct vsock_engine_stats st;

	memset(&f, 0, sizeof(f));
	f.p = data;
	f.n = size;
	f.now = 1;
	vsock_engine_config_default(&cfg);
	cfg.ops = &fz_ops;
	cfg.opaque = &f;
	cfg.reply_limit = 16;
	cfg.max_socks = 64;
	cfg.local_cid = 3;
	if (vsock_engine_new(&cfg, &f.e[0]) < 0)
		abort();
	cfg.local_cid = 2;
	if (vsock_engine_new(&cfg, &f.e[1]) < 0)
		abort();

	for (int n = 0; n < MAX_STEPS && f.n > 0; n++) {
		step(&f);
		check_socks(&f);
	}

	/* Tear down: everything must finish within the close linger. */
	for (int i = 0; i < NSOCK; i++) {
		vsock_sock_close(f.s[i]);
		f.s[i] = NULL;
	}
	for (int round = 0; round < 3; round++) {
		pump(&f, 100000, 65536);
		f.now += 10000000000ull;
		vsock_engine_run_timers(f.e[0]);
		vsock_engine_run_timers(f.e[1]);
	}
	pump(&f, 100000, 65536);
	for (int d = 0; d < 2; d++) {
		vsock_engine_get_stats(f.e[d], &st);
		CHECK(st.socks_open == 0);
		CHECK(vsock_engine_can_feed(f.e[d]));
		CHECK(!vsock_engine_has_pending(f.e[d]));
		CHECK(vsock_engine_next_deadline(f.e[d]) == UINT64_MAX);
	}
	vsock_engine_free(f.e[0]);
	vsock_engine_free(f.e[1]);
	return 0;
}
