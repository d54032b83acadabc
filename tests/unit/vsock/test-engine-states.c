/* SPDX-License-Identifier: MIT */
/*
 * The state x op table (docs/vsock-protocol.md §2.3; Linux virtio_transport_recv_pkt() and its
 * per-state handlers in net/vmw_vsock/virtio_transport_common.c): for every socket state and every
 * op 0..7, a socket of engine CID 2 is put into that state against peer (3, 7000), the op is fed
 * as a hand-made header, and the reply (op and which RST variant), the resulting state and the
 * pending error are checked. Never is an RST answered with an RST.
 */
#include "vsock-test-util.h"

#define LPORT 500u
#define PPORT 7000u
#define NONE (-1)
#define GONE ((int)_VSOCK_SS_MAX) /* socket freed (closed by the app and finished) */

struct row {
	enum vsock_state state;
	unsigned op;
	int reply;       /* op of the reply, or NONE */
	int reply_zero;  /* 1: no-socket variant (buf_alloc = fwd_cnt = 0) */
	int after;       /* state after, or GONE */
	int err;         /* pending error after */
};

/* One row per (state, op); ops not listed for a state get that state's default row. */
static const struct row rows[] = {
	/* FREE (bound, not connected): everything but RST is answered with a no-socket RST. */
	{VSOCK_SS_FREE, VSOCK_OP_INVALID, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_REQUEST, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_RESPONSE, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_RST, NONE, 0, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_RW, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	{VSOCK_SS_FREE, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_RST, 1, VSOCK_SS_FREE, 0},
	/* LISTEN: REQUEST creates a child that answers RESPONSE; other ops get a no-socket RST. */
	{VSOCK_SS_LISTEN, VSOCK_OP_INVALID, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_REQUEST, VSOCK_OP_RESPONSE, 0, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_RESPONSE, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_RST, NONE, 0, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_RW, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	{VSOCK_SS_LISTEN, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_RST, 1, VSOCK_SS_LISTEN, 0},
	/* CONNECTING (SYN_SENT). */
	{VSOCK_SS_CONNECTING, VSOCK_OP_INVALID, NONE, 0, VSOCK_SS_CONNECTING, 0},
	{VSOCK_SS_CONNECTING, VSOCK_OP_REQUEST, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, EPROTO},
	{VSOCK_SS_CONNECTING, VSOCK_OP_RESPONSE, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTING, VSOCK_OP_RST, NONE, 0, VSOCK_SS_CLOSED, ECONNRESET},
	{VSOCK_SS_CONNECTING, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, EPROTO},
	{VSOCK_SS_CONNECTING, VSOCK_OP_RW, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, EPROTO},
	{VSOCK_SS_CONNECTING, VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, EPROTO},
	{VSOCK_SS_CONNECTING, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, EPROTO},
	/* PENDING (deferred child not yet confirmed): only RST matters. */
	{VSOCK_SS_PENDING, VSOCK_OP_INVALID, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_REQUEST, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_RESPONSE, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_RST, NONE, 0, VSOCK_SS_CLOSED, ECONNRESET},
	{VSOCK_SS_PENDING, VSOCK_OP_SHUTDOWN, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_RW, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_CREDIT_UPDATE, NONE, 0, VSOCK_SS_PENDING, 0},
	{VSOCK_SS_PENDING, VSOCK_OP_CREDIT_REQUEST, NONE, 0, VSOCK_SS_PENDING, 0},
	/* CONNECTED (ESTABLISHED). SHUTDOWN here carries both flags with an empty queue. */
	{VSOCK_SS_CONNECTED, VSOCK_OP_INVALID, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_REQUEST, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_RESPONSE, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_RST, NONE, 0, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 0, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_RW, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_CREDIT_UPDATE, NONE, 0, VSOCK_SS_CONNECTED, 0},
	{VSOCK_SS_CONNECTED, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_CREDIT_UPDATE, 0,
	 VSOCK_SS_CONNECTED, 0},
	/* CLOSING (closed by the app, SHUTDOWN(3) sent, lingering). */
	{VSOCK_SS_CLOSING, VSOCK_OP_INVALID, NONE, 0, VSOCK_SS_CLOSING, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_REQUEST, NONE, 0, VSOCK_SS_CLOSING, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_RESPONSE, NONE, 0, VSOCK_SS_CLOSING, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_RST, NONE, 0, GONE, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 0, GONE, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_RW, NONE, 0, VSOCK_SS_CLOSING, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_CREDIT_UPDATE, NONE, 0, VSOCK_SS_CLOSING, 0},
	{VSOCK_SS_CLOSING, VSOCK_OP_CREDIT_REQUEST, NONE, 0, VSOCK_SS_CLOSING, 0},
	/* CLOSED (a refused connect, still bound): no-socket RST, never for an RST. */
	{VSOCK_SS_CLOSED, VSOCK_OP_INVALID, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_REQUEST, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_RESPONSE, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_RST, NONE, 0, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_SHUTDOWN, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_RW, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
	{VSOCK_SS_CLOSED, VSOCK_OP_CREDIT_REQUEST, VSOCK_OP_RST, 1, VSOCK_SS_CLOSED, 0},
};

static struct vsock_hdr peer_hdr(unsigned op)
{
	return mkhdr(3, PPORT, 2, LPORT, VSOCK_TYPE_STREAM, op);
}

static void drain(struct vsock_engine *e)
{
	struct vsock_hdr h;
	uint8_t buf[64];

	while (pull_one(e, &h, buf, sizeof(buf)) >= 0)
		;
}

struct find_arg {
	bool found;
	struct vsock_sock_info info;
};

static void find_cb(void *arg, const struct vsock_sock_info *i)
{
	struct find_arg *a = arg;

	if (i->local_port == LPORT && i->peer_port == PPORT && i->peer_cid == 3 &&
	    i->state != VSOCK_SS_LISTEN) {
		a->found = true;
		a->info = *i;
	}
}

/*
 * Puts a socket of w->h into `st`. Returns the socket to observe (NULL for CLOSING, which the
 * app has released: observed through foreach_sock), and in *extra a second socket to close.
 */
static struct vsock_sock *setup(struct world *w, enum vsock_state st, struct vsock_sock **extra)
{
	struct vsock_sock *s = NULL, *l = NULL, *c = NULL;
	struct vsock_hdr h;

	*extra = NULL;
	switch (st) {
	case VSOCK_SS_FREE:
		ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &s));
		ASSERT_OK(vsock_sock_bind(s, VMADDR_CID_ANY, LPORT));
		return s;
	case VSOCK_SS_LISTEN:
		ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &s));
		ASSERT_OK(vsock_sock_bind(s, VMADDR_CID_ANY, LPORT));
		ASSERT_OK(vsock_sock_listen(s, 4));
		return s;
	case VSOCK_SS_CONNECTING:
	case VSOCK_SS_CLOSED:
		ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &s));
		ASSERT_OK(vsock_sock_bind(s, VMADDR_CID_ANY, LPORT));
		ASSERT_ERR(vsock_sock_connect(s, 3, PPORT), EINPROGRESS);
		drain(w->h);
		if (st == VSOCK_SS_CLOSED) {
			h = peer_hdr(VSOCK_OP_RST);
			ASSERT_OK(feed_hdr(w->h, &h, NULL));
			ASSERT_EQ(vsock_sock_take_error(s), ECONNRESET);
		}
		return s;
	case VSOCK_SS_PENDING:
	case VSOCK_SS_CONNECTED:
	case VSOCK_SS_CLOSING:
		ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
		ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, LPORT));
		if (st == VSOCK_SS_PENDING)
			ASSERT_OK(vsock_sock_listen_deferred(l, 4, false));
		else
			ASSERT_OK(vsock_sock_listen(l, 4));
		h = peer_hdr(VSOCK_OP_REQUEST);
		ASSERT_OK(feed_hdr(w->h, &h, NULL));
		drain(w->h);
		ASSERT_OK(vsock_sock_accept(l, &c));
		*extra = l;
		if (st == VSOCK_SS_CLOSING) {
			vsock_sock_close(c);
			drain(w->h);
			return NULL;
		}
		return c;
	default:
		test_fail(__FILE__, __LINE__, "bad state");
	}
}

static void run_row(const struct row *r)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *s, *extra;
	struct vsock_hdr h, rep;
	uint8_t payload[1] = {'x'};
	uint8_t buf[64];
	struct find_arg fa = {0};
	int state_now, err_now = 0;

	s = setup(w, r->state, &extra);
	if (s)
		ASSERT_EQ(vsock_sock_state(s), r->state);
	h = peer_hdr(r->op);
	if (r->op == VSOCK_OP_RW)
		h.len = 1;
	if (r->op == VSOCK_OP_SHUTDOWN)
		h.flags = VSOCK_SHUTDOWN_MASK;
	(void)feed_hdr(w->h, &h, r->op == VSOCK_OP_RW ? payload : NULL);

	ssize_t n = pull_one(w->h, &rep, buf, sizeof(buf));
	if (r->reply == NONE) {
		if (n >= 0)
			test_fail(__FILE__, __LINE__, "%s x %s: unexpected reply %s",
				  vsock_state_to_string(r->state), vsock_op_to_string(r->op),
				  vsock_op_to_string(rep.op));
	} else {
		if (n < 0)
			test_fail(__FILE__, __LINE__, "%s x %s: no reply, expected %s",
				  vsock_state_to_string(r->state), vsock_op_to_string(r->op),
				  vsock_op_to_string((unsigned)r->reply));
		ASSERT_EQ(rep.op, r->reply);
		ASSERT_EQ(rep.dst_cid, 3);
		ASSERT_EQ(rep.dst_port, PPORT);
		ASSERT_EQ(rep.src_port, LPORT);
		ASSERT_EQ(rep.len, 0);
		if (r->reply_zero) {
			ASSERT_EQ(rep.buf_alloc, 0);
			ASSERT_EQ(rep.fwd_cnt, 0);
		} else {
			ASSERT_EQ(rep.buf_alloc, 262144);
		}
		ASSERT_EQ(pull_one(w->h, &rep, buf, sizeof(buf)), -EAGAIN);
	}
	if (s) {
		state_now = vsock_sock_state(s);
		err_now = vsock_sock_take_error(s);
	} else {
		vsock_engine_foreach_sock(w->h, find_cb, &fa);
		state_now = fa.found ? (int)fa.info.state : GONE;
	}
	if (state_now != r->after)
		test_fail(__FILE__, __LINE__, "%s x %s: state %s, expected %s",
			  vsock_state_to_string(r->state), vsock_op_to_string(r->op),
			  vsock_state_to_string(state_now), vsock_state_to_string(r->after));
	ASSERT_EQ(err_now, r->err);
	if (r->state == VSOCK_SS_LISTEN && r->op == VSOCK_OP_REQUEST) {
		struct vsock_sock *child;
		ASSERT_OK(vsock_sock_accept(s, &child));
		ASSERT_EQ(vsock_sock_state(child), VSOCK_SS_CONNECTED);
		vsock_sock_close(child);
	}
	if (s)
		vsock_sock_close(s);
	if (extra)
		vsock_sock_close(extra);
	world_free(w);
}

TEST(table_covers_every_state_and_op)
{
	for (int st = VSOCK_SS_FREE; st < _VSOCK_SS_MAX; st++) {
		for (unsigned op = 0; op < _VSOCK_OP_MAX; op++) {
			int found = 0;
			for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
				if ((int)rows[i].state == st && rows[i].op == op)
					found++;
			if (found != 1)
				test_fail(__FILE__, __LINE__, "%s x %s: %d rows",
					  vsock_state_to_string(st), vsock_op_to_string(op),
					  found);
		}
	}
}

TEST(state_op_table)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		run_row(&rows[i]);
}

TEST(type_mismatch_and_unknown_type_get_rst)
{
	struct world *w = world_new(NULL);
	struct vsock_sock *l;
	struct vsock_hdr h, rep;
	uint8_t buf[8];
	struct vsock_engine_stats st;

	ASSERT_OK(vsock_sock_new(w->h, VSOCK_TYPE_STREAM, &l));
	ASSERT_OK(vsock_sock_bind(l, VMADDR_CID_ANY, LPORT));
	ASSERT_OK(vsock_sock_listen(l, 4));
	h = mkhdr(3, PPORT, 2, LPORT, VSOCK_TYPE_SEQPACKET, VSOCK_OP_REQUEST);
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), ECONNRESET);
	ASSERT_EQ(pull_one(w->h, &rep, buf, sizeof(buf)), 0);
	ASSERT_EQ(rep.op, VSOCK_OP_RST);
	ASSERT_EQ(rep.type, VSOCK_TYPE_SEQPACKET);
	h.type = 4; /* 3 is DGRAM: dropped, never answered (test-dgram.c) */
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	ASSERT_EQ(pull_one(w->h, &rep, buf, sizeof(buf)), 0);
	ASSERT_EQ(rep.op, VSOCK_OP_RST);
	ASSERT_EQ(rep.type, 4);
	ASSERT_EQ(rep.buf_alloc, 0);
	/* ... but an RST of unknown type is not answered. */
	h.op = VSOCK_OP_RST;
	ASSERT_ERR(feed_hdr(w->h, &h, NULL), EPROTO);
	ASSERT_EQ(pull_one(w->h, &rep, buf, sizeof(buf)), -EAGAIN);
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rx_type_mismatch, 1);
	ASSERT_EQ(st.rx_dropped[VSOCK_HDR_BAD_TYPE], 2);
	vsock_sock_close(l);
	world_free(w);
}

TEST(never_rst_an_rst)
{
	struct world *w = world_new(NULL);
	struct vsock_hdr h, rep;
	uint8_t buf[8];
	struct vsock_engine_stats st;

	/* No socket at all, any type. */
	for (unsigned type = 1; type <= 2; type++) {
		h = mkhdr(3, PPORT, 2, 4242, type, VSOCK_OP_RST);
		ASSERT_ERR(feed_hdr(w->h, &h, NULL), ENOTCONN);
	}
	ASSERT_EQ(pull_one(w->h, &rep, buf, sizeof(buf)), -EAGAIN);
	ASSERT_FALSE(vsock_engine_has_pending(w->h));
	vsock_engine_get_stats(w->h, &st);
	ASSERT_EQ(st.rst_sent, 0);
	ASSERT_EQ(st.rx_no_socket, 2);
	world_free(w);
}

TEST_MAIN()
