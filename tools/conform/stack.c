/* SPDX-License-Identifier: MIT */
/*
 * uvsock-conform's guest vsock stack (conform.h): connection slots, credit kept both ways, and
 * the checks every packet from the back-end goes through, whatever check is running:
 * used length against the buffer offered and the header's len, addresses, the header itself
 * (vsock_hdr_check(), as the protocol engine checks what it receives), the guest's credit, the
 * byte pattern of every stream.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "conform.h"
#include "../common/hybrid.h"

uint64_t ck_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void ck_fail(struct ck *c, const char *ref, const char *fmt, ...)
{
	va_list ap;

	c->deviations++;
	if (c->failed)
		return;
	c->failed = true;
	c->ref = ref;
	va_start(ap, fmt);
	vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
	va_end(ap);
}

void ck_skip(struct ck *c, const char *fmt, ...)
{
	va_list ap;

	if (c->failed)
		return;
	c->skipped = true;
	va_start(ap, fmt);
	vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
	va_end(ap);
}

bool ck_open(struct ck *c, const struct rg_rx_layout *lay)
{
	char err[256];
	int r = rg_open(&c->g, c->o->socket, lay, c->o->timeout_ms, err, sizeof(err));

	if (r < 0) {
		ck_fail(c, REF_INIT, "cannot start a guest session on %s: %s", c->o->socket, err);
		c->unreachable = true;
		return false;
	}
	c->open = true;
	return true;
}

struct conn *ck_conn(struct ck *c, uint16_t type, uint32_t pport, uint32_t buf_alloc)
{
	struct conn *k;

	if (c->nconns == MAX_CONNS)
		return NULL;
	k = &c->conns[c->nconns++];
	memset(k, 0, sizeof(*k));
	k->lport = c->next_port++;
	k->pport = pport;
	k->type = type;
	k->buf_alloc = buf_alloc;
	k->seed = k->lport * 2654435761u;
	return k;
}

static struct conn *find(struct ck *c, uint32_t lport, uint32_t pport)
{
	for (unsigned i = 0; i < c->nconns; i++)
		if (c->conns[i].lport == lport && c->conns[i].pport == pport &&
		    c->conns[i].state != CS_FREE)
			return &c->conns[i];
	return NULL;
}

static struct vsock_hdr hdr_for(const struct ck *c, const struct conn *k, unsigned op,
				unsigned flags, uint32_t len)
{
	return (struct vsock_hdr){ .src_cid = c->g.cid, .dst_cid = VMADDR_CID_HOST,
				   .src_port = k->lport, .dst_port = k->pport, .len = len,
				   .type = k->type, .op = (uint16_t)op, .flags = flags,
				   .buf_alloc = k->buf_alloc, .fwd_cnt = k->fwd_cnt };
}

int conn_ctl(struct ck *c, struct conn *k, unsigned op, unsigned flags)
{
	struct vsock_hdr h = hdr_for(c, k, op, flags, 0);
	int r = rg_send_hdr(&c->g, &h);

	if (r < 0) {
		ck_fail(c, REF_USED, "TX ring: %s putting a %s packet on it", strerror(-r),
			vsock_op_to_string(op));
		return -1;
	}
	k->fwd_adv = k->fwd_cnt;
	return 0;
}

/*
 * Tells the back-end what the guest consumed, as Linux's virtio_transport_do_dequeue() does:
 * once less than 64 KiB of the buffer would be left by the last advertised fwd_cnt, and whenever
 * the receive queue is drained (rx_bytes below SO_RCVLOWAT 1) while something was consumed since.
 * drained: no more RX packets are waiting.
 */
static void give_credit(struct ck *c, struct conn *k, bool drained)
{
	uint32_t since = k->fwd_cnt - k->fwd_adv;

	if (k->state == CS_OPEN && since &&
	    (drained || since + VSOCK_MAX_PKT_PAYLOAD > k->buf_alloc))
		(void)conn_ctl(c, k, VSOCK_OP_CREDIT_UPDATE, 0);
}

void conn_consume(struct ck *c, struct conn *k, uint64_t n)
{
	if (n > k->rx_unread)
		n = k->rx_unread;
	k->rx_unread -= n;
	k->fwd_cnt += (uint32_t)n;
	if (k->state == CS_OPEN)
		(void)conn_ctl(c, k, VSOCK_OP_CREDIT_UPDATE, 0);
}

/* Data for k: credit, pattern, message bounds. */
static void on_rw(struct ck *c, struct conn *k, const struct rg_pkt *p)
{
	uint64_t inflight = k->rx_total + p->ndata - k->fwd_adv;

	if (k->state != CS_OPEN)
		return;
	if (inflight > k->buf_alloc)
		ck_fail(c, REF_CREDIT,
			"the back-end sent %llu bytes on port %u->%u where the guest's credit was "
			"%u (buf_alloc %u, fwd_cnt %u, %llu bytes received)",
			(unsigned long long)p->ndata, k->pport, k->lport,
			(unsigned)(k->buf_alloc - (uint32_t)(k->rx_total - k->fwd_adv)), k->buf_alloc,
			k->fwd_adv, (unsigned long long)k->rx_total);
	for (uint32_t i = 0; i < p->ndata; i++)
		if (p->data[i] != pat(k->seed, k->rx_total + i) && !k->mismatch_told) {
			k->mismatch_told = true;
			ck_fail(c, REF_DATA,
				"byte %llu of the stream host port %u -> guest port %u is 0x%02x, "
				"the host wrote 0x%02x (lost, repeated or reordered data)",
				(unsigned long long)(k->rx_total + i), k->pport, k->lport,
				p->data[i], pat(k->seed, k->rx_total + i));
			break;
		}
	k->rx_total += p->ndata;
	k->msg_len += p->ndata;
	if (k->type == VSOCK_TYPE_SEQPACKET && (p->h.flags & VSOCK_SEQ_EOM)) {
		if (k->nmsgs < 16)
			k->msgs[k->nmsgs] = k->msg_len;
		k->nmsgs++;
		k->msg_len = 0;
	}
	if (k->hold) {
		k->rx_unread += p->ndata;
	} else {
		k->fwd_cnt += p->ndata;
		give_credit(c, k, false);
	}
}

/* A packet for no connection: a REQUEST to the listening port, or a stray. */
static void on_stray(struct ck *c, const struct rg_pkt *p)
{
	struct conn *k;

	if (p->h.op == VSOCK_OP_REQUEST && c->listen_port && p->h.dst_port == c->listen_port &&
	    c->nconns < MAX_CONNS) {
		k = &c->conns[c->nconns++];
		memset(k, 0, sizeof(*k));
		k->lport = p->h.dst_port;
		k->pport = p->h.src_port;
		k->type = p->h.type;
		k->buf_alloc = 256 * 1024;
		k->seed = k->pport * 2654435761u;
		k->peer_known = true;
		k->peer_buf_alloc = p->h.buf_alloc;
		k->peer_fwd_cnt = p->h.fwd_cnt;
		k->state = CS_OPEN;
		if (p->h.buf_alloc == 0)
			ck_fail(c, REF_CREDIT, "the host's REQUEST to guest port %u advertises "
				"buf_alloc 0: the guest could never send", k->lport);
		if (c->listen_refuse) {
			(void)conn_ctl(c, k, VSOCK_OP_RST, 0);
			k->state = CS_RESET;
		} else {
			(void)conn_ctl(c, k, VSOCK_OP_RESPONSE, 0);
		}
		return;
	}
	c->stray = p->h;
	c->nstray++;
}

int ck_pump(struct ck *c, int ms)
{
	struct rg_pkt p;
	struct conn *k;
	enum vsock_hdr_error e;
	int r;

	if (!c->open)
		return -EIO;
	r = rg_recv(&c->g, &p, ms < 0 ? 0 : ms);
	if (r == -ETIMEDOUT)
		return r;
	if (r == -EPROTO) {
		ck_fail(c, REF_USED, "the back-end returned an RX buffer of %u payload bytes with "
			"used length %u (shorter than a header or longer than the buffer)",
			p.room, p.used_len);
		return 0;
	}
	if (r < 0) {
		ck_fail(c, REF_USED, "the RX ring broke: %s", strerror(-r));
		c->open = false;
		return -EIO;
	}
	if (VSOCK_HDR_SIZE + (uint64_t)p.h.len > p.used_len || p.h.len > p.room) {
		ck_fail(c, REF_CUT,
			"an RX %s packet (port %u -> %u) claims %u payload bytes, but the back-end "
			"wrote %u into a buffer of %u payload bytes",
			vsock_op_to_string(p.h.op), p.h.src_port, p.h.dst_port, p.h.len,
			p.used_len - VSOCK_HDR_SIZE, p.room);
		return 0;
	}
	e = vsock_hdr_check(&p.h, p.ndata);
	if (e != VSOCK_HDR_OK && e != VSOCK_HDR_BAD_TYPE)
		ck_fail(c, REF_HDR, "an RX %s packet (port %u -> %u) is malformed: %s",
			vsock_op_to_string(p.h.op), p.h.src_port, p.h.dst_port,
			vsock_hdr_error_to_string(e));
	if (p.h.src_cid != VMADDR_CID_HOST || p.h.dst_cid != c->g.cid)
		ck_fail(c, REF_ADDR, "an RX %s packet goes from CID %llu to CID %llu; the guest is "
			"CID %u and the host CID 2", vsock_op_to_string(p.h.op),
			(unsigned long long)p.h.src_cid, (unsigned long long)p.h.dst_cid, c->g.cid);
	k = find(c, p.h.dst_port, p.h.src_port);
	if (!k) {
		on_stray(c, &p);
		return 0;
	}
	if (p.h.type != k->type)
		ck_fail(c, REF_HDR, "an RX %s packet of a %s connection has type %s",
			vsock_op_to_string(p.h.op), vsock_type_to_string(k->type),
			vsock_type_to_string(p.h.type));
	k->peer_known = true;
	k->peer_buf_alloc = p.h.buf_alloc;
	k->peer_fwd_cnt = p.h.fwd_cnt;
	if ((int32_t)(p.h.fwd_cnt - k->tx_cnt) > 0)
		ck_fail(c, REF_FWD, "the back-end's fwd_cnt %u on port %u->%u is ahead of the %u "
			"bytes this connection sent (another connection's bytes counted here: one fwd_cnt "
			"shared by the streams?)", p.h.fwd_cnt, k->pport, k->lport, k->tx_cnt);
	switch (p.h.op) {
	case VSOCK_OP_RESPONSE:
		if (k->state == CS_CONNECTING)
			k->state = CS_OPEN;
		break;
	case VSOCK_OP_RST:
		k->state = CS_RESET;
		break;
	case VSOCK_OP_SHUTDOWN:
		k->peer_shut |= p.h.flags;
		break;
	case VSOCK_OP_CREDIT_UPDATE:
		k->credit_updates++;
		k->update_fwd = p.h.fwd_cnt;
		break;
	case VSOCK_OP_CREDIT_REQUEST:
		if (k->state == CS_OPEN)
			(void)conn_ctl(c, k, VSOCK_OP_CREDIT_UPDATE, 0);
		break;
	case VSOCK_OP_RW:
		on_rw(c, k, &p);
		break;
	default:
		break;
	}
	if (!rg_rx_pending(&c->g))
		for (unsigned i = 0; i < c->nconns; i++)
			if (!c->conns[i].hold)
				give_credit(c, &c->conns[i], true);
	return 0;
}

void ck_drain(struct ck *c, int ms)
{
	uint64_t dl = ck_now_ms() + (uint64_t)ms;

	while (ck_now_ms() < dl && ck_pump(c, (int)(dl - ck_now_ms())) != -EIO)
		;
}

bool conn_connect(struct ck *c, struct conn *k)
{
	k->state = CS_CONNECTING;
	if (conn_ctl(c, k, VSOCK_OP_REQUEST, 0) < 0)
		return false;
	(void)CK_PUMP_UNTIL(c, k->state != CS_CONNECTING, c->o->timeout_ms);
	return k->state == CS_OPEN;
}

static uint32_t peer_credit(const struct conn *k)
{
	uint32_t used = k->tx_cnt - k->peer_fwd_cnt;
	uint32_t window = k->peer_buf_alloc;

	if (k->linux_tx && k->buf_alloc < window)
		window = k->buf_alloc;
	return k->peer_known && used < window ? window - used : 0;
}

int conn_send(struct ck *c, struct conn *k, uint64_t len, uint32_t pkt, bool eom,
	      const uint32_t *cuts, unsigned ncuts, bool indirect)
{
	static uint8_t buf[65536];
	uint64_t sent = 0;

	/* Linux refuses a message larger than the peer's buffer (virtio_transport_seqpacket_enqueue()
	 * returns EMSGSIZE): so does this guest. */
	if (k->type == VSOCK_TYPE_SEQPACKET && k->peer_known && len > k->peer_buf_alloc)
		return -EMSGSIZE;

	while (sent < len) {
		uint32_t n, credit = peer_credit(k);
		struct vsock_hdr h;
		int r;

		if (credit == 0) {
			if (!k->linux_tx && conn_ctl(c, k, VSOCK_OP_CREDIT_REQUEST, 0) < 0)
				return -1;
			if (!CK_PUMP_UNTIL(c, peer_credit(k) > 0 || k->state != CS_OPEN,
					   c->o->timeout_ms) && k->linux_tx) {
				ck_fail(c, REF_CREDIT_WINDOW,
					"no CREDIT_UPDATE from the back-end for %d ms on port %u->%u "
					"after %llu bytes: the guest's window is min(back-end buf_alloc "
					"%u, guest buf_alloc %u) and the back-end has forwarded all but "
					"%u bytes of it (fwd_cnt %u, tx_cnt %u)", c->o->timeout_ms,
					k->lport, k->pport, (unsigned long long)sent,
					k->peer_buf_alloc, k->buf_alloc, k->tx_cnt - k->peer_fwd_cnt,
					k->peer_fwd_cnt, k->tx_cnt);
				return -1;
			}
			if (peer_credit(k) == 0 && k->state == CS_OPEN) {
				ck_fail(c, REF_CREDIT_GIVE,
					"no credit from the back-end for %d ms on port %u->%u after "
					"%llu bytes (buf_alloc %u, fwd_cnt %u, tx_cnt %u; a "
					"CREDIT_REQUEST was sent)", c->o->timeout_ms, k->lport,
					k->pport, (unsigned long long)sent, k->peer_buf_alloc,
					k->peer_fwd_cnt, k->tx_cnt);
				return -1;
			}
			if (k->state != CS_OPEN) {
				ck_fail(c, REF_DATA, "the back-end reset port %u->%u after %llu of "
					"%llu bytes", k->lport, k->pport, (unsigned long long)sent,
					(unsigned long long)len);
				return -1;
			}
			continue;
		}
		n = len - sent < pkt ? (uint32_t)(len - sent) : pkt;
		if (ncuts && n > credit) {
			/* A packet with a descriptor layout is sent whole: wait for room for it. */
			if (!CK_PUMP_UNTIL(c, peer_credit(k) >= n || k->state != CS_OPEN,
					   c->o->timeout_ms)) {
				ck_fail(c, REF_CREDIT_GIVE, "no room for a %u-byte packet on port "
					"%u->%u for %d ms (buf_alloc %u)", n, k->lport, k->pport,
					c->o->timeout_ms, k->peer_buf_alloc);
				return -1;
			}
			continue;
		}
		if (n > credit)
			n = credit;
		for (uint32_t i = 0; i < n; i++)
			buf[i] = pat(k->seed, k->tx_off + i);
		h = hdr_for(c, k, VSOCK_OP_RW,
			    eom && k->type == VSOCK_TYPE_SEQPACKET && sent + n == len ? VSOCK_SEQ_EOM
										      : 0, n);
		r = rg_send(&c->g, &h, buf, n, cuts, ncuts, indirect);
		if (r < 0) {
			ck_fail(c, REF_USED, "TX ring: %s (the back-end stopped taking packets after "
				"%llu bytes)", strerror(-r), (unsigned long long)sent);
			return -1;
		}
		k->fwd_adv = k->fwd_cnt;
		k->tx_cnt += n;
		k->tx_off += n;
		sent += n;
		while (ck_pump(c, 0) == 0)
			;
	}
	return 0;
}

int ck_host_listen(struct ck *c, uint32_t port, int type)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s_%u", c->o->uds, port);
	fd = hybrid_listen(path, type);
	if (fd < 0) {
		ck_fail(c, REF_INIT, "cannot listen at %s: %s", path, strerror(errno));
		return -1;
	}
	if (c->npaths < 8)
		snprintf(c->paths[c->npaths++], sizeof(c->paths[0]), "%s", path);
	c->lfd = ck_keep_fd(c, fd);
	return fd;
}

int ck_keep_fd(struct ck *c, int fd)
{
	if (fd >= 0 && c->nfds < sizeof(c->fds) / sizeof(c->fds[0]))
		c->fds[c->nfds++] = fd;
	return fd;
}

void ck_end(struct ck *c)
{
	if (c->open)
		rg_close(&c->g);
	c->open = false;
	for (unsigned i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = 0;
	for (unsigned i = 0; i < c->npaths; i++)
		unlink(c->paths[i]);
	c->npaths = 0;
}

/* ---- host I/O threads ---- */

static int wait_fd(int fd, short ev, int ms)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int r;

	do {
		r = poll(&p, 1, ms);
	} while (r < 0 && errno == EINTR);
	return r;
}

static void *hio_main(void *arg)
{
	struct hio *h = arg;
	uint8_t *buf = malloc(h->chunk);
	unsigned chunks = 0;

	if (!buf) {
		h->err = ENOMEM;
		return NULL;
	}
	while (h->go && !atomic_load(h->go))
		usleep(1000);
	while (h->done < h->n) {
		size_t want = h->n - h->done < h->chunk ? (size_t)(h->n - h->done) : h->chunk;
		ssize_t r;

		if (wait_fd(h->fd, h->writer ? POLLOUT : POLLIN, h->timeout_ms) <= 0) {
			h->err = ETIMEDOUT;
			break;
		}
		if (h->writer) {
			for (size_t i = 0; i < want; i++)
				buf[i] = pat(h->seed, h->done + i);
			r = send(h->fd, buf, want, MSG_NOSIGNAL | MSG_DONTWAIT);
		} else {
			r = recv(h->fd, buf, want, MSG_DONTWAIT);
		}
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r < 0) {
			h->err = errno;
			break;
		}
		if (r == 0) {
			h->eof = true;
			break;
		}
		if (!h->writer)
			for (ssize_t i = 0; i < r && !h->mismatch; i++)
				if (buf[i] != pat(h->seed, h->done + (uint64_t)i)) {
					h->mismatch = true;
					h->bad_at = h->done + (uint64_t)i;
				}
		h->done += (uint64_t)r;
		if (h->pause_every && ++chunks % h->pause_every == 0)
			usleep(1000);
	}
	if (h->writer && h->shut && h->err == 0)
		shutdown(h->fd, SHUT_WR);
	free(buf);
	return NULL;
}

void hio_start(struct hio *h)
{
	if (h->chunk == 0)
		h->chunk = 65536;
	if (pthread_create(&h->th, NULL, hio_main, h) != 0) {
		h->err = EAGAIN;
		h->th = 0;
	}
}

void hio_join(struct hio *h)
{
	if (h->th)
		pthread_join(h->th, NULL);
	h->th = 0;
}
