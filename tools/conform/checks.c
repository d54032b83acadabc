/* SPDX-License-Identifier: MIT */
/*
 * uvsock-conform's checks (conform.h). Each one runs in its own guest session; every packet the
 * back-end returns also goes through the checks of stack.c (used length, header, addresses,
 * credit, byte pattern), so a check fails on the first deviation of any kind while it runs.
 * Host sockets and listeners a check opens are closed by the runner (ck_end).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/hybrid.h"
#include "conform.h"

#define BIG_CREDIT (256u * 1024u)

/* A guest connection of type with buf_alloc credit to the host listener of this check, accepted
 * on the host (*hfd, closed when the check ends). NULL (and the check failed) if not. */
static struct conn *connected_pair(struct ck *c, uint16_t type, uint32_t buf_alloc, int *hfd)
{
	struct conn *k = ck_conn(c, type, c->host_port, buf_alloc);

	*hfd = -1;
	if (!k)
		return NULL;
	if (!conn_connect(c, k)) {
		ck_fail(c, REF_CONNECT, "a %s REQUEST to host port %u with a host listener at %s_%u "
			"got %s", vsock_type_to_string(type), c->host_port, c->o->uds, c->host_port,
			k->state == CS_RESET ? "an RST" : "no answer");
		return NULL;
	}
	*hfd = ck_keep_fd(c, hybrid_accept(c->lfd, c->o->timeout_ms));
	if (*hfd < 0) {
		ck_fail(c, REF_CONNECT, "the back-end answered RESPONSE but connected nothing to "
			"%s_%u within %d ms", c->o->uds, c->host_port, c->o->timeout_ms);
		return NULL;
	}
	return k;
}

/* This check's session (RX buffers laid out as lay, NULL: default), its host stream listener and
 * one stream connection to it with buf_alloc credit; NULL (failed) if any step fails. */
static struct conn *session_pair(struct ck *c, const struct rg_rx_layout *lay, uint32_t buf_alloc,
				 int *hfd)
{
	*hfd = -1;
	if (!ck_open(c, lay) || ck_host_listen(c, c->host_port, SOCK_STREAM) < 0)
		return NULL;
	return connected_pair(c, VSOCK_TYPE_STREAM, buf_alloc, hfd);
}

/* The host starts writing n bytes of k's pattern on fd in thread *w (hio_join() it). */
static void host_write(struct ck *c, struct conn *k, int fd, uint64_t n, struct hio *w)
{
	*w = (struct hio){ .fd = fd, .writer = true, .n = n, .seed = k->seed,
			   .timeout_ms = c->o->timeout_ms };
	hio_start(w);
}

/* A session and a stream whose guest advertises credit bytes and reads nothing until told
 * (conn_consume), with the host writing n bytes to it in thread *w; NULL (failed) if not. */
static struct conn *held_stream(struct ck *c, uint32_t credit, uint64_t n, struct hio *w)
{
	int hfd;
	struct conn *k = session_pair(c, NULL, credit, &hfd);

	if (k) {
		k->hold = true;
		host_write(c, k, hfd, n, w);
	}
	return k;
}

/* The guest pumps until k received n bytes; false (failed, naming what) if they do not come. */
static bool guest_gets(struct ck *c, struct conn *k, uint64_t n, const char *ref, const char *what)
{
	if (CK_PUMP_UNTIL(c, k->rx_total >= n || c->failed, c->o->timeout_ms))
		return !c->failed;
	ck_fail(c, ref, "%s: %llu of %llu bytes the host wrote reached the guest within %d ms", what,
		(unsigned long long)k->rx_total, (unsigned long long)n, c->o->timeout_ms);
	return false;
}

/* The host reads n pattern bytes of k from fd; false (failed) if they do not all come intact. */
static bool host_reads(struct ck *c, struct conn *k, int fd, uint64_t n, const char *what)
{
	struct hio h = { .fd = fd, .n = n, .seed = k->seed, .timeout_ms = c->o->timeout_ms };

	hio_start(&h);
	hio_join(&h);
	if (h.mismatch)
		ck_fail(c, REF_DATA, "%s: byte %llu the host read differs from what the guest sent",
			what, (unsigned long long)h.bad_at);
	else if (h.done != n)
		ck_fail(c, REF_DATA, "%s: the host read %llu of %llu bytes (%s)", what,
			(unsigned long long)h.done, (unsigned long long)n,
			h.eof ? "end of stream" : strerror(h.err));
	return !h.mismatch && h.done == n;
}

/* Asks for a CREDIT_UPDATE on k and waits for it; false (failed) if none comes. */
static bool credit_update(struct ck *c, struct conn *k)
{
	unsigned before = k->credit_updates;

	if (conn_ctl(c, k, VSOCK_OP_CREDIT_REQUEST, 0) < 0)
		return false;
	if (!CK_PUMP_UNTIL(c, k->credit_updates > before, c->o->timeout_ms)) {
		ck_fail(c, REF_CREDIT_REQ, "CREDIT_REQUEST on port %u->%u got no CREDIT_UPDATE "
			"within %d ms", k->lport, k->pport, c->o->timeout_ms);
		return false;
	}
	return true;
}

/* ---- the checks ---- */

static void negotiation(struct ck *c)
{
	if (!ck_open(c, NULL))
		return;
	if (c->g.cid <= VMADDR_CID_HOST)
		ck_fail(c, REF_ADDR, "guest_cid %u in the device configuration is reserved",
			c->g.cid);
	snprintf(c->note, sizeof(c->note), "guest CID %u, features 0x%llx (seqpacket %s)",
		 c->g.cid, (unsigned long long)c->g.features, rg_seqpacket(&c->g) ? "yes" : "no");
}

static void refused_connect_rst(struct ck *c)
{
	char path[256];
	struct conn *k;

	if (!ck_open(c, NULL))
		return;
	snprintf(path, sizeof(path), "%s_%u", c->o->uds, c->host_port);
	unlink(path);
	k = ck_conn(c, VSOCK_TYPE_STREAM, c->host_port, BIG_CREDIT);
	(void)conn_connect(c, k);
	if (k->state == CS_OPEN)
		ck_fail(c, REF_NOSOCK, "a REQUEST to host port %u, where nothing listens (%s), was "
			"answered RESPONSE", c->host_port, path);
	else if (k->state != CS_RESET)
		ck_fail(c, REF_NOSOCK, "a REQUEST to host port %u, where nothing listens, got no RST "
			"within %d ms", c->host_port, c->o->timeout_ms);
}

static void connect_response(struct ck *c)
{
	struct hio h;
	int hfd;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	if (!k)
		return;
	if (k->peer_buf_alloc == 0)
		ck_fail(c, REF_CREDIT, "the RESPONSE advertises buf_alloc 0");
	if (k->peer_fwd_cnt != 0)
		ck_fail(c, REF_FWD, "the RESPONSE of a new connection carries fwd_cnt %u",
			k->peer_fwd_cnt);
	/* RST from the guest: the host end sees the connection end. */
	(void)conn_ctl(c, k, VSOCK_OP_RST, 0);
	k->state = CS_RESET;
	h = (struct hio){ .fd = hfd, .n = 1, .timeout_ms = c->o->timeout_ms };
	hio_start(&h);
	hio_join(&h);
	if (!h.eof && h.err != ECONNRESET)
		ck_fail(c, REF_SHUT, "after the guest's RST the host socket did not end within %d ms "
			"(%s)", c->o->timeout_ms, h.done ? "it read data" : strerror(h.err));
}

static void unknown_connection_rst(struct ck *c)
{
	uint8_t data[10] = { 0 };
	struct vsock_hdr h;

	if (!ck_open(c, NULL) || ck_host_listen(c, c->host_port, SOCK_STREAM) < 0)
		return;
	/* RW on a port pair that was never connected (the host listener exists). */
	h = (struct vsock_hdr){ .src_cid = c->g.cid, .dst_cid = VMADDR_CID_HOST,
				.src_port = c->next_port, .dst_port = c->host_port,
				.len = sizeof(data), .type = VSOCK_TYPE_STREAM, .op = VSOCK_OP_RW,
				.buf_alloc = BIG_CREDIT };
	if (rg_send(&c->g, &h, data, sizeof(data), NULL, 0, false) < 0)
		ck_fail(c, REF_USED, "TX ring refused a packet");
	else if (!CK_PUMP_UNTIL(c, c->nstray > 0 && c->stray.op == VSOCK_OP_RST, c->o->timeout_ms))
		ck_fail(c, REF_NOSOCK, "RW for a connection that does not exist (guest port %u -> "
			"host port %u) got no RST within %d ms", c->next_port, c->host_port,
			c->o->timeout_ms);
	else if (c->stray.dst_port != c->next_port || c->stray.src_port != c->host_port)
		ck_fail(c, REF_NOSOCK, "the RST goes from port %u to %u, not %u to %u",
			c->stray.src_port, c->stray.dst_port, c->host_port, c->next_port);
}

static void fwd_cnt_per_connection(struct ck *c)
{
	const uint64_t n = 10000;
	int fa, fb;
	struct conn *a = session_pair(c, NULL, BIG_CREDIT, &fa);
	struct conn *b = a ? connected_pair(c, VSOCK_TYPE_STREAM, BIG_CREDIT, &fb) : NULL;

	if (!b || conn_send(c, a, n, 4096, false, NULL, 0, false) < 0 ||
	    !host_reads(c, a, fa, n, "connection A") || !credit_update(c, a) || !credit_update(c, b))
		return;
	if (a->update_fwd != (uint32_t)n)
		ck_fail(c, REF_FWD, "connection A sent %llu bytes, all read by the host, but its "
			"CREDIT_UPDATE says fwd_cnt %u", (unsigned long long)n, a->update_fwd);
	if (b->update_fwd != 0)
		ck_fail(c, REF_FWD, "connection B sent nothing, but its CREDIT_UPDATE says fwd_cnt "
			"%u (connection A's %llu bytes counted for B: one fwd_cnt shared by the "
			"streams?)", b->update_fwd, (unsigned long long)n);
}

static void guest_credit_respected(struct ck *c)
{
	const uint32_t credit = 4096;
	const uint64_t n = 65536;
	struct hio w;
	struct conn *k = held_stream(c, credit, n, &w);

	if (!k)
		return;
	if (guest_gets(c, k, credit, REF_CREDIT, "within a 4096-byte credit")) {
		/* Nothing beyond the credit may come (any extra RW fails in stack.c). */
		ck_drain(c, c->o->quiet_ms);
		/* Consume and open the window: the rest must follow. */
		k->buf_alloc = BIG_CREDIT;
		k->hold = false;
		conn_consume(c, k, k->rx_unread);
		(void)guest_gets(c, k, n, REF_CREDIT_GIVE, "after a CREDIT_UPDATE opened the window");
	}
	hio_join(&w);
}

static void half_close_guest(struct ck *c)
{
	struct hio h, w;
	int hfd;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	if (!k || conn_send(c, k, 3000, 4096, false, NULL, 0, false) < 0 ||
	    conn_ctl(c, k, VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_SEND) < 0)
		return;
	h = (struct hio){ .fd = hfd, .n = UINT64_MAX, .seed = k->seed,
			  .timeout_ms = c->o->timeout_ms };
	hio_start(&h);
	hio_join(&h);
	if (!h.eof || h.done != 3000)
		ck_fail(c, REF_SHUT, "after the guest's SHUTDOWN(SEND) the host read %llu of 3000 "
			"bytes and %s (a back-end must pass a half-close on: shutdown(SHUT_WR) of the "
			"host socket)", (unsigned long long)h.done,
			h.eof ? "then end of stream" : "no end of stream");
	/* The other direction still works. */
	host_write(c, k, hfd, 5000, &w);
	if (guest_gets(c, k, 5000, REF_SHUT, "host to guest after the guest's half-close") &&
	    k->state != CS_OPEN)
		ck_fail(c, REF_SHUT, "the back-end reset the connection after the guest's "
			"SHUTDOWN(SEND): host to guest must stay open");
	hio_join(&w);
}

static void half_close_host(struct ck *c)
{
	int hfd;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	if (!k)
		return;
	shutdown(hfd, SHUT_WR);
	if (!CK_PUMP_UNTIL(c, (k->peer_shut & VSOCK_SHUTDOWN_SEND) || k->state != CS_OPEN,
			   c->o->timeout_ms))
		ck_fail(c, REF_SHUT, "the host's shutdown(SHUT_WR) reached the guest as nothing "
			"within %d ms (expected SHUTDOWN with the SEND flag)", c->o->timeout_ms);
	else if (k->state != CS_OPEN)
		ck_fail(c, REF_SHUT, "the host's shutdown(SHUT_WR) reset the connection (expected "
			"SHUTDOWN with the SEND flag; guest to host stays open)");
	else if (conn_send(c, k, 5000, 4096, false, NULL, 0, false) == 0)
		(void)host_reads(c, k, hfd, 5000, "guest to host after the host's half-close");
}

/* hybrid_connect() in a thread, since the guest must answer while it waits. */
struct hconn {
	const char *uds;
	unsigned port;
	int timeout_ms, fd, err;
	pthread_t th;
};

static void *hconn_main(void *arg)
{
	struct hconn *h = arg;

	h->fd = hybrid_connect(h->uds, h->port, SOCK_STREAM, h->timeout_ms);
	h->err = h->fd < 0 ? errno : 0;
	return NULL;
}

/* A host CONNECT to a new guest listening port, answered RESPONSE (or RST if refuse): the
 * connection (NULL if no REQUEST came), *hfd the host end (-1 if the CONNECT failed). */
static struct conn *host_connects(struct ck *c, bool refuse, int *hfd)
{
	struct hconn hc = { .uds = c->o->uds, .timeout_ms = c->o->timeout_ms, .fd = -1 };
	unsigned before = c->nconns;

	c->listen_port = c->next_port++;
	c->listen_refuse = refuse;
	hc.port = c->listen_port;
	*hfd = -1;
	if (pthread_create(&hc.th, NULL, hconn_main, &hc) != 0) {
		ck_fail(c, REF_INIT, "pthread_create failed");
		return NULL;
	}
	(void)CK_PUMP_UNTIL(c, c->nconns > before, c->o->timeout_ms);
	pthread_join(hc.th, NULL);
	*hfd = ck_keep_fd(c, hc.fd);
	if (c->nconns == before) {
		ck_fail(c, REF_CONNECT, "a host CONNECT %u reached the guest as no REQUEST within "
			"%d ms", hc.port, c->o->timeout_ms);
		return NULL;
	}
	if (hc.fd < 0 && !refuse)
		ck_fail(c, REF_HYBRID, "the guest answered RESPONSE but the host's CONNECT %u "
			"failed: %s", hc.port, strerror(hc.err));
	if (hc.fd >= 0 && refuse)
		ck_fail(c, REF_HYBRID, "the guest answered RST to the host's CONNECT %u, and the "
			"host socket was answered OK", hc.port);
	return &c->conns[before];
}

static void host_connect(struct ck *c)
{
	struct hio w;
	struct conn *k;
	int hfd;

	if (!ck_open(c, NULL) || !(k = host_connects(c, false, &hfd)) || hfd < 0)
		return;
	host_write(c, k, hfd, 20000, &w);
	(void)guest_gets(c, k, 20000, REF_DATA, "host to guest");
	hio_join(&w);
	if (!c->failed && conn_send(c, k, 20000, 4096, false, NULL, 0, false) == 0)
		(void)host_reads(c, k, hfd, 20000, "guest to host");
	/* Refused by the guest: the host's CONNECT must fail. */
	if (!c->failed)
		(void)host_connects(c, true, &hfd);
}

static void tx_multi_descriptor(struct ck *c)
{
	/* Cuts of a 3000-byte packet (44 + 3000 bytes): header and payload apart, the header cut
	 * in two, the payload in three, one cut inside the payload. */
	static const uint32_t lay[][4] = { { 44 }, { 20 }, { 10, 44, 1000, 2000 }, { 1544 },
					   { 44, 1044 } };
	static const unsigned nl[] = { 1, 1, 4, 1, 2 };
	uint64_t total = 0;
	int hfd;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	for (unsigned i = 0; k && !c->failed && i < sizeof(nl) / sizeof(nl[0]); i++)
		if (conn_send(c, k, 3000, 3000, false, lay[i], nl[i], false) == 0)
			total += 3000;
	if (k && !c->failed && rg_indirect(&c->g) &&
	    conn_send(c, k, 3000, 3000, false, lay[2], nl[2], true) == 0)
		total += 3000;
	if (k && !c->failed)
		(void)host_reads(c, k, hfd, total, "packets in several descriptors");
}

/* The host writes n bytes to a guest whose RX buffers are laid out as lay. */
static void rx_layout(struct ck *c, const struct rg_rx_layout *lay, uint64_t n)
{
	struct hio w;
	int hfd;
	struct conn *k = session_pair(c, lay, BIG_CREDIT, &hfd);

	if (!k)
		return;
	host_write(c, k, hfd, n, &w);
	(void)guest_gets(c, k, n, REF_DATA, "into the RX buffers offered");
	hio_join(&w);
}

static void rx_small_buffers(struct ck *c)
{
	const struct rg_rx_layout lay = { .room = { 128 }, .nroom = 1 };

	rx_layout(c, &lay, 20000);
}

static void rx_mixed_buffers(struct ck *c)
{
	const struct rg_rx_layout lay = { .room = { 64, 1500, 4096, 65536, 300, 8192 },
					  .nroom = 6, .split = true };

	rx_layout(c, &lay, 400000);
}

static void seqpacket_boundaries(struct ck *c)
{
	static const uint64_t g2h[] = { 1, 100, 4096, 70000 }, h2g[] = { 1, 5000, 60000 };
	static uint8_t buf[128 * 1024];
	uint64_t off = 0;
	struct conn *k;
	int hfd;

	if (!ck_open(c, NULL))
		return;
	if (!rg_seqpacket(&c->g)) {
		ck_skip(c, "the back-end does not offer VIRTIO_VSOCK_F_SEQPACKET");
		return;
	}
	if (ck_host_listen(c, c->host_port, SOCK_SEQPACKET) < 0)
		return;
	k = ck_conn(c, VSOCK_TYPE_SEQPACKET, c->host_port, BIG_CREDIT);
	if (!conn_connect(c, k)) {
		ck_skip(c, "SEQPACKET is negotiated, but a SEQPACKET REQUEST to a SOCK_SEQPACKET "
			"listener at %s_%u got %s: the back-end does not carry SEQPACKET to the "
			"host side (uvsockd's convention, docs/uvsockd.md)", c->o->uds,
			c->host_port, k->state == CS_RESET ? "an RST" : "no answer");
		return;
	}
	hfd = ck_keep_fd(c, hybrid_accept(c->lfd, c->o->timeout_ms));
	if (hfd < 0) {
		ck_fail(c, REF_CONNECT, "RESPONSE, but nothing reached the SEQPACKET listener");
		return;
	}
	for (unsigned i = 0; !c->failed && i < 4; i++) {
		ssize_t r = conn_send(c, k, g2h[i], 65536, true, NULL, 0, false);

		if (r == -EMSGSIZE) {
			snprintf(c->note, sizeof(c->note), "messages above the back-end's buf_alloc "
				 "%u not tried (Linux refuses them: EMSGSIZE)", k->peer_buf_alloc);
			continue;
		}
		if (r < 0)
			break;
		r = recv(hfd, buf, sizeof(buf), 0);
		if (r != (ssize_t)g2h[i])
			ck_fail(c, REF_SEQ, "guest to host: message %u of %llu bytes (EOM on its last "
				"packet) reached the host as %zd bytes", i,
				(unsigned long long)g2h[i], r);
		for (ssize_t j = 0; r > 0 && j < r && !c->failed; j++)
			if (buf[j] != pat(k->seed, off + (uint64_t)j))
				ck_fail(c, REF_DATA, "guest to host: message %u differs at byte %zd",
					i, j);
		off += g2h[i];
	}
	for (unsigned i = 0, got = 0; !c->failed && i < 3; i++) {
		/* As large as the back-end's own buffer at most (uvsockd ends a connection whose
		 * host message exceeds it). */
		if (h2g[i] > k->peer_buf_alloc) {
			snprintf(c->note, sizeof(c->note), "messages above the back-end's buf_alloc "
				 "%u not tried", k->peer_buf_alloc);
			continue;
		}
		for (uint64_t j = 0; j < h2g[i]; j++)
			buf[j] = pat(k->seed, k->rx_total + j); /* every earlier message ended */
		if (send(hfd, buf, h2g[i], MSG_NOSIGNAL) != (ssize_t)h2g[i])
			ck_fail(c, REF_SEQ, "the host's send of message %u failed", i);
		else if (!CK_PUMP_UNTIL(c, k->nmsgs > got || c->failed, c->o->timeout_ms))
			ck_fail(c, REF_SEQ, "host to guest: message %u (%llu bytes) brought no "
				"packet with VIRTIO_VSOCK_SEQ_EOM within %d ms (%llu bytes came)", i,
				(unsigned long long)h2g[i], c->o->timeout_ms,
				(unsigned long long)k->msg_len);
		else if (k->msgs[got++] != h2g[i])
			ck_fail(c, REF_SEQ, "host to guest: message %u of %llu bytes ended (EOM) "
				"after %llu bytes", i, (unsigned long long)h2g[i],
				(unsigned long long)k->msgs[got - 1]);
	}
}

static void many_connections(struct ck *c)
{
	unsigned n = c->o->conns, done = 0;
	uint8_t buf[64];
	int *fds;

	if (!ck_open(c, NULL) || ck_host_listen(c, c->host_port, SOCK_STREAM) < 0)
		return;
	for (unsigned i = 0; i < n; i++) {
		struct conn *k = ck_conn(c, VSOCK_TYPE_STREAM, c->host_port, BIG_CREDIT);

		k->state = CS_CONNECTING;
		if (conn_ctl(c, k, VSOCK_OP_REQUEST, 0) < 0)
			return;
	}
	(void)CK_PUMP_UNTIL(c, ({
		done = 0;
		for (unsigned i = 0; i < n; i++)
			done += c->conns[i].state != CS_CONNECTING;
		done == n;
	}), c->o->timeout_ms);
	for (unsigned i = 0; i < n && !c->failed; i++)
		if (c->conns[i].state != CS_OPEN)
			ck_fail(c, REF_CONNECT, "connection %u of %u (guest port %u) got %s", i + 1, n,
				c->conns[i].lport,
				c->conns[i].state == CS_RESET ? "an RST" : "no answer");
	fds = malloc(n * sizeof(*fds));
	if (!fds) {
		ck_fail(c, REF_INIT, "out of memory");
		return;
	}
	/* Each connection sends 64 bytes of its own pattern; each host end echoes what it read:
	 * every connection must get its own bytes back (stack.c checks the pattern). */
	for (unsigned i = 0; i < n; i++) {
		fds[i] = c->failed ? -1 : hybrid_accept(c->lfd, c->o->timeout_ms);
		if (fds[i] < 0 && !c->failed)
			ck_fail(c, REF_CONNECT, "the host accepted %u of %u connections", i, n);
		else if (fds[i] >= 0)
			(void)conn_send(c, &c->conns[i], sizeof(buf), sizeof(buf), false, NULL, 0,
					false);
	}
	for (unsigned i = 0; !c->failed && i < n; i++) {
		size_t got = 0;
		ssize_t r = 1;

		while (got < sizeof(buf) && r > 0) {
			struct pollfd p = { .fd = fds[i], .events = POLLIN };

			r = poll(&p, 1, c->o->timeout_ms) > 0
				    ? recv(fds[i], buf + got, sizeof(buf) - got, 0)
				    : -1;
			got += r > 0 ? (size_t)r : 0;
		}
		if (got != sizeof(buf) ||
		    send(fds[i], buf, sizeof(buf), MSG_NOSIGNAL) != (ssize_t)sizeof(buf))
			ck_fail(c, REF_DATA, "host end %u of %u read %zu of 64 bytes", i + 1, n, got);
		while (ck_pump(c, 0) == 0)
			;
	}
	(void)CK_PUMP_UNTIL(c, ({
		done = 0;
		for (unsigned i = 0; i < n; i++)
			done += c->conns[i].rx_total >= sizeof(buf);
		done == n || c->failed;
	}), c->o->timeout_ms);
	if (!c->failed && done != n)
		ck_fail(c, REF_DATA, "%u of %u connections got their 64 bytes back", done, n);
	for (unsigned i = 0; i < n; i++)
		if (c->conns[i].state == CS_OPEN)
			(void)conn_ctl(c, &c->conns[i], VSOCK_OP_RST, 0);
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
}

static void slow_host_reader(struct ck *c)
{
	const uint64_t n = 4u << 20;
	struct hio h;
	int hfd;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	if (!k)
		return;
	/* 4 KiB reads, a 1 ms pause every 16 of them. */
	h = (struct hio){ .fd = hfd, .n = n, .seed = k->seed, .chunk = 4096, .pause_every = 16,
			  .timeout_ms = c->o->timeout_ms };
	hio_start(&h);
	(void)conn_send(c, k, n, 65536, false, NULL, 0, false);
	hio_join(&h);
	if (!c->failed && (h.mismatch || h.done != n))
		ck_fail(c, REF_DATA, "a slow host reader got %llu of %llu bytes%s",
			(unsigned long long)h.done, (unsigned long long)n,
			h.mismatch ? ", with a wrong byte" : "");
}

static void slow_guest_reader(struct ck *c)
{
	const uint64_t n = 1u << 20;
	const uint32_t credit = 65536;
	struct hio w;
	struct conn *k = held_stream(c, credit, n, &w);

	if (!k)
		return;
	/* The guest reads 8 KiB whenever half its credit is taken: the back-end must stop at the
	 * credit (stack.c) and go on as it comes back. */
	while (!c->failed && k->rx_total < n) {
		if (!CK_PUMP_UNTIL(c, k->rx_unread >= credit / 2 || k->rx_total >= n || c->failed,
				   c->o->timeout_ms)) {
			ck_fail(c, REF_HOLD_BACK, "a slow guest reader: %llu of %llu bytes came, "
				"then nothing for %d ms although %llu bytes of the guest's credit "
				"were open (the reader waits for %u bytes, as with SO_RCVLOWAT)",
				(unsigned long long)k->rx_total, (unsigned long long)n,
				c->o->timeout_ms, (unsigned long long)(credit - k->rx_unread),
				credit / 2);
			break;
		}
		conn_consume(c, k, 8192);
	}
	hio_join(&w);
}

/*
 * Credit windows of every size on either side: for each guest buf_alloc (small, one byte above
 * an RX buffer, one maximum packet and one byte above it, Linux's default), with whatever
 * buf_alloc the back-end advertises (run-conform.sh runs this against several):
 *  - host -> guest: the guest reads only once it holds half its buf_alloc (SO_RCVLOWAT), so it
 *    sends no CREDIT_UPDATE before that; the back-end must send that much on the guest's credit
 *    alone, and go on after each CREDIT_UPDATE;
 *  - guest -> host: the guest sends as Linux does, at most min(back-end buf_alloc, guest
 *    buf_alloc) in flight and no CREDIT_REQUEST; the back-end's CREDIT_UPDATEs must keep it
 *    going.
 */
static void credit_windows(struct ck *c)
{
	static const uint32_t sizes[] = { 4096, 4097, 65536, 65537, 262144 };
	struct hio w, h;
	int hfd;

	if (!ck_open(c, NULL) || ck_host_listen(c, c->host_port, SOCK_STREAM) < 0)
		return;
	for (unsigned i = 0; !c->failed && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		const uint32_t credit = sizes[i];
		const uint64_t n = 3ull * credit + 1000;
		struct conn *k = connected_pair(c, VSOCK_TYPE_STREAM, credit, &hfd);
		uint32_t window;

		if (!k)
			return;
		k->hold = true;
		host_write(c, k, hfd, n, &w);
		while (!c->failed && k->rx_total < n) {
			if (!CK_PUMP_UNTIL(c, k->rx_unread >= credit / 2 || k->rx_total >= n ||
					   c->failed, c->o->timeout_ms)) {
				ck_fail(c, REF_HOLD_BACK, "guest buf_alloc %u, back-end buf_alloc %u: "
					"%llu of %llu bytes came, then nothing for %d ms although "
					"%llu bytes of the guest's credit were open (the reader "
					"waits for %u bytes, as with SO_RCVLOWAT)", credit,
					k->peer_buf_alloc, (unsigned long long)k->rx_total,
					(unsigned long long)n, c->o->timeout_ms,
					(unsigned long long)(credit - k->rx_unread), credit / 2);
				break;
			}
			conn_consume(c, k, k->rx_unread);
		}
		hio_join(&w);
		if (c->failed)
			break;
		k->linux_tx = true;
		window = k->peer_buf_alloc < credit ? k->peer_buf_alloc : credit;
		h = (struct hio){ .fd = hfd, .n = 3ull * window + 1000, .seed = k->seed,
				  .timeout_ms = c->o->timeout_ms };
		hio_start(&h);
		(void)conn_send(c, k, h.n, 65536, false, NULL, 0, false);
		hio_join(&h);
		if (!c->failed && (h.mismatch || h.done != h.n))
			ck_fail(c, REF_DATA, "guest buf_alloc %u, back-end buf_alloc %u: the host "
				"read %llu of the %llu bytes the guest sent%s", credit,
				k->peer_buf_alloc, (unsigned long long)h.done,
				(unsigned long long)h.n, h.mismatch ? ", with a wrong byte" : "");
		(void)conn_ctl(c, k, VSOCK_OP_RST, 0);
		k->state = CS_RESET;
	}
}

static void one_byte_flood(struct ck *c)
{
	const uint64_t n = 20000;
	atomic_bool go = false;
	struct hio h;
	int hfd, hfd2;
	struct conn *k = session_pair(c, NULL, BIG_CREDIT, &hfd);

	if (!k)
		return;
	/* The host reads only once the guest has sent all its credit allows, or everything. */
	h = (struct hio){ .fd = hfd, .n = n, .seed = k->seed, .go = &go,
			  .timeout_ms = c->o->timeout_ms };
	hio_start(&h);
	for (uint64_t i = 0; !c->failed && i < n; i++) {
		if (k->tx_cnt - k->peer_fwd_cnt >= k->peer_buf_alloc)
			atomic_store(&go, true);
		if (conn_send(c, k, 1, 1, false, NULL, 0, false) < 0)
			break;
	}
	atomic_store(&go, true);
	hio_join(&h);
	if (!c->failed && (h.mismatch || h.done != n))
		ck_fail(c, REF_DATA, "%llu one-byte packets: the host read %llu bytes%s",
			(unsigned long long)n, (unsigned long long)h.done,
			h.mismatch ? ", with a wrong byte" : "");
	/* The back-end still serves: a credit answer and a new connection. */
	if (!c->failed && credit_update(c, k))
		(void)connected_pair(c, VSOCK_TYPE_STREAM, BIG_CREDIT, &hfd2);
}

const struct check checks[] = {
	{ "negotiation", "features and the guest CID over vhost-user", negotiation },
	{ "refused_connect_rst", "a REQUEST to a host port nobody listens on gets an RST",
	  refused_connect_rst },
	{ "connect_response", "a REQUEST to a host listener gets RESPONSE with credit; the guest's "
	  "RST ends the host socket", connect_response },
	{ "unknown_connection_rst", "RW for a connection that does not exist gets an RST",
	  unknown_connection_rst },
	{ "fwd_cnt_per_connection", "fwd_cnt counts each connection's own bytes",
	  fwd_cnt_per_connection },
	{ "guest_credit_respected", "the host's data stops at the guest's buf_alloc and resumes "
	  "on CREDIT_UPDATE", guest_credit_respected },
	{ "half_close_guest_to_host", "the guest's SHUTDOWN(SEND) is the host's end of stream; "
	  "host to guest stays open", half_close_guest },
	{ "half_close_host_to_guest", "the host's shutdown(SHUT_WR) is a SHUTDOWN(SEND); guest to "
	  "host stays open", half_close_host },
	{ "host_connect", "a host CONNECT becomes a REQUEST; data both ways; a guest RST refuses "
	  "the host", host_connect },
	{ "tx_multi_descriptor", "TX packets whose header and payload are cut into several "
	  "descriptors (and an indirect table)", tx_multi_descriptor },
	{ "rx_small_buffers", "host data into 128-byte RX buffers", rx_small_buffers },
	{ "rx_mixed_buffers", "host data into mixed RX buffers, header and payload in two "
	  "descriptors", rx_mixed_buffers },
	{ "seqpacket_boundaries", "SEQPACKET message boundaries both ways (if offered)",
	  seqpacket_boundaries },
	{ "many_connections", "many connections at once, each with its own bytes",
	  many_connections },
	{ "slow_host_reader", "4 MiB to a slow host reader: credit comes back as it reads",
	  slow_host_reader },
	{ "slow_guest_reader", "1 MiB to a slow guest reader within a 64 KiB credit",
	  slow_guest_reader },
	{ "one_byte_flood", "20000 one-byte packets to a host that reads late", one_byte_flood },
	{ "credit_windows", "small and large buf_alloc on either side: no stall waiting for "
	  "credit either way", credit_windows },
};
const unsigned nchecks = sizeof(checks) / sizeof(checks[0]);
