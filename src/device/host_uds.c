/* SPDX-License-Identifier: MIT */
/*
 * Host side of the device: Unix sockets in the Firecracker / vhost-device-vsock "hybrid vsock"
 * convention (docs/uvsockd.md).
 *
 *   host -> guest: a host program connects to <uds-path> (SOCK_STREAM) or <uds-path>_seqpacket
 *     (SOCK_SEQPACKET) and sends "CONNECT <port>\n"; we connect an engine socket (local port
 *     auto-assigned in [2^30, 2^31)) to the guest's port and answer "OK <local-port>\n" when the
 *     guest accepts. A bad line, an early close, a refusal or DEV_HOST_CONNECT_TIMEOUT_NS without
 *     line + answer: the Unix socket is closed.
 *   guest -> host port P: the engine's deferred wildcard listeners hold the REQUEST; we connect
 *     a non-blocking Unix socket of the same type to <uds-path>_<P> (in uds-path's directory as
 *     opened at start, never through a symlink: uds_connect_at) and confirm (RESPONSE) once it
 *     is connected, or reject (RST) at once if nobody listens.
 *
 * Data, STREAM (docs/performance.md, "uvsockd's host path"): guest bytes go to the host socket
 * straight from the guest's TX buffer (dev_host_deliver, the engine's ops->deliver); only what the
 * socket refuses waits in the engine socket (bounded by the buf_alloc we advertised) until it
 * takes it: vsock_sock_rx_peek_iov + sendmsg + vsock_sock_rx_consume. Either way fwd_cnt (the
 * guest's credit) moves only when the host program has the bytes. A readable host socket joins
 * the device's read list; the RX path (dev_host_rx) reads it straight into the payload area of
 * a guest RX buffer, at most the guest's credit, everything the socket holds up to that in one
 * packet; while the guest holds many small packets, less (its per-packet overhead,
 * h2g_budget.h). With no credit the Unix socket is not polled for reading, nor while its bytes
 * wait for RX buffers. SEQPACKET, and STREAM with the zerocopy switch off (src/util/tune.h),
 * go through the engine's queues and the scratch buffer instead.
 * Half-close: guest SHUTDOWN(SEND) -> shutdown(SHUT_WR) once everything is flushed; host EOF ->
 * SHUTDOWN(SEND). The engine never answers an RST with an RST.
 *
 * Security model: host programs and the guest are untrusted. Connections per VM are capped
 * (max_conns, uvsockd's per-VM fd budget: beyond it a host connection is accepted and closed at
 * once), and so are those still waiting for their CONNECT line (half of max_conns; past it the
 * oldest one without its line goes), so idle sockets cannot lock well-behaved programs out;
 * every wait has the 2 s limit or is bounded by credit. accept() failing for lack of fds never
 * spins: a reserve fd is given up to shed the connection, or accepting pauses briefly. A symlink planted at
 * <uds-path>_<P> is refused, not followed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/h2g_budget.h"
#include "ops/vmlog.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/iov.h"
#include "util/rec.h"
#include "util/time.h"
#include "util/uds.h"
#include "vsock/credit.h"

#define HOST_IOV_MAX 32
/* Host bytes moved to the guest per readiness event of one connection (fairness). */
#define HOST_READ_BUDGET (256u * 1024)
/* Accepting paused after accept() failed for lack of fds (or memory) with no reserve fd left. */
#define HOST_ACCEPT_PAUSE_NS (100ull * NS_PER_MS)

static void hconn_update_events(struct hconn *c);
static void start_guest_connect(struct hconn *c, uint32_t port);
static void rd_queue(struct hconn *c);

/* Takes c off the device's read list (dev_host_rx), wherever it is; usually the head. */
static void rd_unlink(struct hconn *c)
{
	struct vsock_dev *d = c->dev;
	struct hconn **pp = &d->host.rd_head, *prev = NULL;

	if (d->host.rd_cur == c)
		d->host.rd_cur = NULL;
	if (!c->rd_queued)
		return;
	while (*pp != c) {
		prev = *pp;
		pp = &prev->rd_next;
	}
	*pp = c->rd_next;
	if (d->host.rd_tail == c)
		d->host.rd_tail = prev;
	c->rd_queued = false;
	c->rd_next = NULL;
}

void dev_host_mark_dirty(struct hconn *c)
{
	struct vsock_dev *d = c->dev;

	if (c->dirty)
		return;
	c->dirty = true;
	c->next_dirty = d->host.dirty;
	d->host.dirty = c;
}

static void hconn_free(struct hconn *c, bool close_sock)
{
	struct vsock_dev *d = c->dev;

	if (c->state == HC_READ_CONNECT)
		d->host.n_handshakes--;
	if (c->dirty) {
		struct hconn **pp;

		for (pp = &d->host.dirty; *pp; pp = &(*pp)->next_dirty)
			if (*pp == c) {
				*pp = c->next_dirty;
				break;
			}
	}
	rd_unlink(c);
	if (c->s) {
		vsock_sock_set_user(c->s, NULL);
		if (close_sock)
			vsock_sock_close(c->s);
	}
	loop_watch_del(c->w);
	if (c->fd >= 0)
		close(c->fd);
	loop_timer_free(c->timer);
	if (c->prev)
		c->prev->next = c->next;
	else
		d->host.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	d->host.n_conns--;
	free(c);
}

static void hconn_timer_cb(struct loop *l, struct loop_timer *t, void *opaque);

static void hconn_arm(struct hconn *c, uint64_t deadline)
{
	c->deadline = deadline;
	loop_timer_arm(c->timer, deadline);
}

/* The guest's port of c's connection, for log tags (0 if not known yet). */
static uint32_t peer_port_of(struct hconn *c)
{
	uint32_t cid, port = 0;

	if (c->s)
		(void)vsock_sock_peer_addr(c->s, &cid, &port);
	return port;
}
static void hconn_io_cb(struct loop *l, int fd, uint32_t events, void *opaque);

static int hconn_new(struct vsock_dev *d, int fd, bool seqpacket, enum hconn_state st,
		     uint32_t events, struct hconn **ret)
{
	struct hconn *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->dev = d;
	c->fd = fd;
	c->seqpacket = seqpacket;
	c->state = st;
	r = loop_timer_new(d->loop, hconn_timer_cb, c, &c->timer);
	if (r < 0)
		goto out_free;
	r = loop_watch_add(d->loop, fd, events, hconn_io_cb, c, &c->w);
	if (r < 0)
		goto out_free;
	c->next = d->host.conns;
	if (d->host.conns)
		d->host.conns->prev = c;
	d->host.conns = c;
	d->host.n_conns++;
	*ret = c;
	return 0;

out_free:
	loop_timer_free(c->timer);
	free(c);
	return r;
}

void dev_host_close_all(struct vsock_dev *d)
{
	while (d->host.conns)
		hconn_free(d->host.conns, false);
	d->host.dirty = NULL;
	d->host.rd_head = d->host.rd_tail = NULL;
}

/* Ends the connection: the engine socket is closed (SHUTDOWN, then RST after the linger). */
static void hconn_close(struct hconn *c)
{
	hconn_free(c, true);
}

/* The last component of uds_path: <uds-path>_<port> is that plus the suffix in host_dir_fd. */
static const char *uds_base(const struct vsock_dev *d)
{
	const char *slash = strrchr(d->uds_path, '/');

	return slash ? slash + 1 : d->uds_path;
}

/* ---- host -> guest connections ------------------------------------------------------------ */

/* Stops accepting on both listeners for HOST_ACCEPT_PAUSE_NS: no fd to take a connection with. */
static void host_pause_accept(struct vsock_dev *d)
{
	if (loop_timer_armed(d->host.pause_timer))
		return;
	log_vm_dev(LOG_LVL_WARN, d->cid, "out of file descriptors: not accepting host "
		   "connections for %llu ms", HOST_ACCEPT_PAUSE_NS / NS_PER_MS);
	(void)loop_watch_mod(d->host.uds_w, 0);
	(void)loop_watch_mod(d->host.uds_seq_w, 0);
	loop_timer_arm(d->host.pause_timer, loop_now_ns() + HOST_ACCEPT_PAUSE_NS);
}

static void host_pause_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)t;
	if (d->host.reserve_fd < 0)
		d->host.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	(void)loop_watch_mod(d->host.uds_w, EPOLLIN);
	(void)loop_watch_mod(d->host.uds_seq_w, EPOLLIN);
}

/*
 * accept() failed with EMFILE/ENFILE: the connection stays in the backlog and the listener stays
 * readable, so without this the loop would spin. Frees the reserve fd, accepts the connection
 * with it and closes it at once, then takes the reserve back. Returns true if one was shed.
 */
static bool host_shed_one(struct vsock_dev *d, int lfd)
{
	int fd;

	if (d->host.reserve_fd < 0)
		return false;
	close(d->host.reserve_fd);
	fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	d->host.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	DEV_STAT_ADD(d, host_accept_shed, 1);
	log_vm_dev(LOG_LVL_WARN, d->cid, "out of file descriptors: host connection shed");
	return true;
}

/*
 * Pending CONNECT handshakes a VM admits (the slowloris bound): half its budget, so idle ones
 * always leave room. Not less: a client may open many connections before it writes its lines
 * (the interop run opens 200 at once), and past the cap the oldest pending one goes.
 */
static unsigned host_handshake_cap(const struct vsock_dev *d)
{
	return MAX(1u, d->max_conns / 2);
}

static void read_connect_line(struct hconn *c);

/*
 * Makes room for one more pending handshake once the cap is reached: the oldest pending one
 * (the last in d->host.conns, which takes new connections at its head) gets its line read now, in
 * case it came and was not served yet; if it is still not there, that connection is closed
 * (counted). Idle sockets age out first, so a flood of them never locks out a program that
 * connects now, and a burst of well-behaved programs (whose lines are there) loses nobody.
 */
static void make_handshake_room(struct vsock_dev *d)
{
	while (d->host.n_handshakes >= host_handshake_cap(d)) {
		struct hconn *c, *oldest = NULL;
		unsigned before;

		for (c = d->host.conns; c; c = c->next)
			if (c->state == HC_READ_CONNECT)
				oldest = c;
		if (!oldest)
			return;
		before = d->host.n_handshakes;
		read_connect_line(oldest);
		if (d->host.n_handshakes < before)
			continue; /* its line was there (a guest connect now), or it was closed */
		DEV_STAT_ADD(d, host_handshakes_refused, 1);
		log_vm_dev(LOG_LVL_WARN, d->cid,
			   "host connection closed: no CONNECT line yet and %u handshakes pending "
			   "(the cap): the oldest goes", d->host.n_handshakes);
		hconn_close(oldest);
	}
}

/*
 * Whether the first bytes of a host connection are a vhost-user message header (request 1..63,
 * flags with version 1 and no unknown bit, a payload of at most 4 KiB: what QEMU sends first,
 * GET_FEATURES, is 01 00 00 00 01 00 00 00 00 00 00 00): a VMM pointed at uds-path.
 */
static bool looks_like_vhost_user(const struct uds_connect_reader *rd)
{
	uint32_t req, flags, size;

	if (rd->len < 12 || memchr(rd->buf, '\n', rd->len))
		return false;
	req = (uint32_t)(uint8_t)rd->buf[0] | (uint32_t)(uint8_t)rd->buf[1] << 8 |
	      (uint32_t)(uint8_t)rd->buf[2] << 16 | (uint32_t)(uint8_t)rd->buf[3] << 24;
	flags = (uint32_t)(uint8_t)rd->buf[4] | (uint32_t)(uint8_t)rd->buf[5] << 8 |
		(uint32_t)(uint8_t)rd->buf[6] << 16 | (uint32_t)(uint8_t)rd->buf[7] << 24;
	size = (uint32_t)(uint8_t)rd->buf[8] | (uint32_t)(uint8_t)rd->buf[9] << 8 |
	       (uint32_t)(uint8_t)rd->buf[10] << 16 | (uint32_t)(uint8_t)rd->buf[11] << 24;
	return req >= 1 && req < 64 && (flags & 3) == 1 && flags < 0x100 && size <= 4096;
}

/* The two sockets swapped: a VMM on uds-path. Logged and counted as a bad CONNECT line. */
static void warn_vmm_on_host_side(struct vsock_dev *d)
{
	DEV_STAT_ADD(d, host_connect_bad_line, 1);
	log_vm_dev(LOG_LVL_WARN, d->cid,
		   "host connection closed: a vhost-user message on the host-side socket %s: a "
		   "VMM's chardev must use the VM's vhost-user socket (--vm socket=), not uds-path",
		   d->uds_path);
}

/*
 * Takes one accepted host connection. Refused at once (closed, counted) when the guest is not
 * running or the VM's host fd budget is full. A connection whose line is not there yet waits
 * as a pending handshake; past the cap on those, the oldest pending one goes
 * (make_handshake_room). A well-behaved program writes its line right after connect(), so the
 * line is usually here already and the connection never waits as a pending handshake.
 */
static void uds_take(struct vsock_dev *d, int fd, bool seqpacket)
{
	struct uds_connect_reader rd = { 0 };
	struct hconn *c;
	uint32_t port;
	int r;

	DEV_STAT_ADD(d, host_conns_accepted, 1);
	if (!d->eng) {
		/* The port, if the line is already there: it says which host program this is. */
		if (uds_connect_read(&rd, fd, seqpacket, &port) < 0)
			port = 0;
		/* A VMM on the wrong socket finds no VMM attached, of course: say what it is. */
		if (looks_like_vhost_user(&rd)) {
			warn_vmm_on_host_side(d);
			goto out_close;
		}
		DEV_STAT_ADD(d, host_conns_no_guest, 1);
		log_vm(LOG_LVL_WARN, d->cid, 0, port, "host connection refused: no VMM attached or "
		       "guest driver not running (%s)", strerror(ENOTCONN));
		goto out_close;
	}
	if (d->host.n_conns >= d->max_conns) {
		/* The VM's host fd budget: accepted and closed at once, never queued. */
		DEV_STAT_ADD(d, host_conns_refused, 1);
		log_vm_dev(LOG_LVL_WARN, d->cid,
			   "host connection refused: %u connections open (the VM's host fd budget)",
			   d->host.n_conns);
		goto out_close;
	}
	r = uds_connect_read(&rd, fd, seqpacket, &port);
	if (looks_like_vhost_user(&rd)) {
		warn_vmm_on_host_side(d);
		goto out_close;
	}
	if (r == -EAGAIN)
		make_handshake_room(d);
	if (r < 0 && r != -EAGAIN) {
		DEV_STAT_ADD(d, host_connect_bad_line, 1);
		log_vm_dev(LOG_LVL_WARN, d->cid,
			   "host connection closed: CONNECT line rejected: %s", strerror(-r));
		goto out_close;
	}
	if (hconn_new(d, fd, seqpacket, HC_READ_CONNECT, EPOLLIN, &c) < 0)
		goto out_close;
	c->rd = rd;
	d->host.n_handshakes++;
	/* The line (if still to come) and the guest's answer, both within the limit. */
	hconn_arm(c, loop_now_ns() + DEV_HOST_CONNECT_TIMEOUT_NS);
	if (r == 0)
		start_guest_connect(c, port);
	return;

out_close:
	close(fd);
}

static void uds_accept(struct vsock_dev *d, int lfd, bool seqpacket)
{
	for (int i = 0; i < 16; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) && host_shed_one(d, lfd))
				continue;
			if (errno != EAGAIN)
				host_pause_accept(d);
			return;
		}
		uds_take(d, fd, seqpacket);
	}
}

static void uds_listen_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	(void)events;
	uds_accept(d, fd, fd == d->host.uds_seq_l.fd);
	dev_up.settle(d);
}

/* Listens on path for host programs (a stale socket file is replaced; a live one is not ours). */
static int listen_one(struct vsock_dev *d, const char *path, int type, struct uds_listener *l,
		      struct loop_watch **w)
{
	int r = uds_listen(path, type, 128, 0, l);

	if (r < 0) {
		l->fd = -1;
		dev_up.listen_error(d, path, r);
		return r;
	}
	if (l->flags & UDS_REPLACED_STALE)
		log_info("%s: replaced the stale socket file %s", d->name, path);
	return loop_watch_add(d->loop, l->fd, EPOLLIN, uds_listen_cb, d, w);
}

/* Stops listening and removes the socket file if it is still the one we bound. */
static void close_one(const char *path, struct uds_listener *l, struct loop_watch **w,
		      bool keep_file)
{
	if (l->fd < 0)
		return;
	loop_watch_del(*w);
	*w = NULL;
	if (!keep_file)
		(void)uds_unlink_owned(path, l); /* before the close: see uds.h */
	close(l->fd);
	l->fd = -1;
}

/*
 * What the host side holds besides its listeners: the reserve fd (host_shed_one), the timer of
 * an accept pause, and uds_path's directory (guest -> host connects). Returns 0, -ENOMEM, or the
 * errno of open.
 */
static int host_open_aux(struct vsock_dev *d)
{
	char dir[sizeof(d->uds_path)];
	size_t n = (size_t)(uds_base(d) - d->uds_path);
	int r;

	d->host.reserve_fd = d->host.dir_fd = -1;
	d->host.aux = true;
	r = loop_timer_new(d->loop, host_pause_cb, d, &d->host.pause_timer);
	if (r < 0)
		return r;
	d->host.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (d->host.reserve_fd < 0)
		return -errno;
	/* uds_path's directory ("dir/" -> "dir", "/x" -> "/", "x" -> "."), once. */
	if (n == 0)
		strcpy(dir, ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(n > 1 ? n - 1 : n), d->uds_path);
	d->host.dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (d->host.dir_fd < 0) {
		r = -errno;
		log_error("%s: cannot open the directory of %s: %s", d->name, d->uds_path,
			  strerror(-r));
		return r;
	}
	return 0;
}

static void host_close_aux(struct vsock_dev *d)
{
	if (!d->host.aux)
		return;
	loop_timer_free(d->host.pause_timer);
	d->host.pause_timer = NULL;
	if (d->host.reserve_fd >= 0)
		close(d->host.reserve_fd);
	if (d->host.dir_fd >= 0)
		close(d->host.dir_fd);
	d->host.reserve_fd = d->host.dir_fd = -1;
	d->host.aux = false;
}

int dev_host_open(struct vsock_dev *d)
{
	struct dev_host *h = &d->host;
	int r;

	h->scratch_len = MAX((size_t)d->buf_alloc, (size_t)VSOCK_MAX_PKT_PAYLOAD);
	h->scratch = malloc(h->scratch_len);
	if (!h->scratch)
		return -ENOMEM;
	r = host_open_aux(d);
	if (r < 0)
		return r;
	if (d->frozen)
		return 0; /* a device to restore into: the listeners come from the record */
	r = listen_one(d, d->uds_path, SOCK_STREAM, &h->uds_l, &h->uds_w);
	if (r < 0)
		return r;
	return listen_one(d, h->uds_seq_path, SOCK_SEQPACKET, &h->uds_seq_l, &h->uds_seq_w);
}

void dev_host_close(struct vsock_dev *d)
{
	close_one(d->uds_path, &d->host.uds_l, &d->host.uds_w, d->handed_over);
	close_one(d->host.uds_seq_path, &d->host.uds_seq_l, &d->host.uds_seq_w, d->handed_over);
	host_close_aux(d);
	free(d->host.scratch);
	d->host.scratch = NULL;
}

void dev_host_init(struct vsock_dev *d)
{
	d->host.uds_l.fd = d->host.uds_seq_l.fd = -1;
	snprintf(d->host.uds_seq_path, sizeof(d->host.uds_seq_path), "%.96s_seqpacket",
		 d->uds_path); /* vsock_dev_new checked the length */
}

bool dev_host_has_dirty(const struct vsock_dev *d)
{
	return d->host.dirty != NULL;
}

/* The CONNECT line is complete: connect to the guest's port. */
static void start_guest_connect(struct hconn *c, uint32_t port)
{
	struct vsock_dev *d = c->dev;
	uint32_t cid;
	int r;

	r = vsock_sock_new(d->eng, c->seqpacket ? VSOCK_TYPE_SEQPACKET : VSOCK_TYPE_STREAM, &c->s);
	if (r < 0) {
		c->s = NULL;
		goto out_close;
	}
	vsock_sock_set_user(c->s, c);
	r = vsock_sock_connect(c->s, d->cid, port);
	if (r != -EINPROGRESS && r != 0)
		goto out_close;
	if (vsock_sock_local_addr(c->s, &cid, &c->local_port) < 0)
		goto out_close;
	d->host.n_handshakes--;
	c->state = HC_GUEST_CONNECT;
	/* Nothing is read until the guest answers; EPOLLHUP/ERR still tell us if the host leaves. */
	(void)loop_watch_mod(c->w, 0);
	dev_host_mark_dirty(c);
	return;

out_close:
	log_vm(LOG_LVL_DEBUG, d->cid, c->local_port, port, "host connect to guest port failed: %s",
	       strerror(-r));
	hconn_close(c);
}

static void read_connect_line(struct hconn *c)
{
	uint32_t port;
	int r = uds_connect_read(&c->rd, c->fd, c->seqpacket, &port);

	/* The two sockets swapped: say so now rather than time out on a line that never comes. */
	if ((r == -EAGAIN || r == -EMSGSIZE || r == -ECONNRESET) && looks_like_vhost_user(&c->rd)) {
		warn_vmm_on_host_side(c->dev);
		hconn_close(c);
		return;
	}
	if (r == -EAGAIN)
		return;
	if (r < 0) {
		DEV_STAT_ADD(c->dev, host_connect_bad_line, 1);
		log_vm_dev(LOG_LVL_WARN, c->dev->cid,
			   "host connection closed: CONNECT line rejected: %s", strerror(-r));
		hconn_close(c);
		return;
	}
	start_guest_connect(c, port);
}

/* The guest accepted a host-initiated connection: tell the host program. */
static int send_ok(struct hconn *c)
{
	char line[16];
	size_t n = uds_connect_format_ok(line, c->dev->ok_guest_port ? peer_port_of(c)
								    : c->local_port);
	ssize_t w = send(c->fd, line, n, MSG_DONTWAIT | MSG_NOSIGNAL);

	/* A fresh socket's send buffer always takes 15 bytes; anything else means it is gone. */
	return w == (ssize_t)n ? 0 : -EPIPE;
}

/* ---- guest -> host connections ------------------------------------------------------------ */

static void guest_conn_refuse(struct vsock_dev *d, struct vsock_sock *child, const char *why,
			      uint32_t port)
{
	uint32_t peer_cid, peer_port = 0;

	(void)vsock_sock_peer_addr(child, &peer_cid, &peer_port);
	DEV_STAT_ADD(d, guest_conns_refused, 1);
	log_vm(LOG_LVL_DEBUG, d->cid, port, peer_port, "guest connection refused: %s", why);
	vsock_sock_reject(child);
	vsock_sock_close(child);
}

/* Logs why connecting to <uds-path>_<port> failed when the host side's setup is the cause. */
static void guest_conn_log_path(struct vsock_dev *d, struct vsock_sock *child, const char *name,
				int err)
{
	uint32_t cid, pport = 0, port = 0;

	(void)vsock_sock_peer_addr(child, &cid, &pport);
	(void)vsock_sock_local_addr(child, &cid, &port);
	if (err == -ELOOP)
		DEV_STAT_ADD(d, guest_conns_symlink, 1);
	if (err == -EACCES || err == -EPERM) {
		DEV_STAT_ADD(d, guest_conns_denied, 1);
		log_vm(LOG_LVL_WARN, d->cid, port, pport, "guest connection refused: uvsockd may "
		       "not connect to %s (%s; check its mode and owner)", name, strerror(-err));
	}
	if (err == -ELOOP || err == -ENOTSOCK || err == -EOPNOTSUPP)
		log_vm(LOG_LVL_WARN, d->cid, port, pport, "guest connection refused: %s %s", name,
		       err == -ELOOP      ? "is a symlink (not followed)"
		       : err == -ENOTSOCK ? "is not a socket"
					  : "cannot be reached without /proc");
	/* The most common question ("why does my guest get ECONNRESET?"), at the default level:
	 * rate-limited per VM like every guest-caused line. */
	if (err == -ENOENT || err == -ECONNREFUSED)
		log_vm(LOG_LVL_INFO, d->cid, port, pport,
		       "guest connection refused: nobody listens on %s_%u (%s)", d->uds_path, port,
		       strerror(-err));
}

/*
 * The abstract name the Unix socket to <uds-path>_<port> is bound to: "uvsock-peer PID CID PORT
 * HOSTPORT", the guest's address, for a listener (libuvsock-preload.so) that checks PID against
 * SO_PEERCRED (docs/uvsockd.md "Who is calling").
 */
static void peer_name(struct vsock_sock *child, uint32_t port, char *buf, size_t len)
{
	uint32_t cid = 0, pport = 0;

	(void)vsock_sock_peer_addr(child, &cid, &pport);
	snprintf(buf, len, "uvsock-peer %d %u %u %u", (int)getpid(), cid, pport, port);
}

static void guest_conn_start(struct vsock_dev *d, struct vsock_sock *child)
{
	char peer[64];
	bool seq = vsock_sock_type(child) == VSOCK_TYPE_SEQPACKET;
	char name[sizeof(d->uds_path) + 12];
	uint32_t cid, port;
	struct hconn *c;
	bool pending;
	int fd, r;

	if (vsock_sock_local_addr(child, &cid, &port) < 0) {
		guest_conn_refuse(d, child, "no address", 0);
		return;
	}
	if (d->host.n_conns >= d->max_conns) {
		guest_conn_refuse(d, child, "connection limit", port);
		return;
	}
	snprintf(name, sizeof(name), "%s_%u", uds_base(d), port);
	/* In uds_path's directory as opened at start, following no symlink (uds_connect.h). */
	peer_name(child, port, peer, sizeof(peer));
	fd = uds_connect_at_as(d->host.dir_fd, name, seq ? SOCK_SEQPACKET : SOCK_STREAM, peer,
			       &pending);
	if (fd < 0) {
		/* ENOENT / ECONNREFUSED: nobody listens; EAGAIN: backlog full. RST at once. */
		guest_conn_log_path(d, child, name, fd);
		guest_conn_refuse(d, child, strerror(-fd), port);
		return;
	}
	r = pending ? -EINPROGRESS : 0;
	if (hconn_new(d, fd, seq, r == 0 ? HC_OPEN : HC_HOST_CONNECT, r == 0 ? EPOLLIN : EPOLLOUT,
		      &c) < 0) {
		close(fd);
		guest_conn_refuse(d, child, "out of memory", port);
		return;
	}
	c->s = child;
	c->local_port = port;
	vsock_sock_set_user(child, c);
	if (r < 0)
		hconn_arm(c, loop_now_ns() + DEV_HOST_CONNECT_TIMEOUT_NS);
	if (r == 0) {
		if (vsock_sock_accept_pending(child) < 0) {
			hconn_close(c);
			return;
		}
		dev_host_mark_dirty(c);
	}
}

void dev_host_accept_guest_conns(struct vsock_dev *d)
{
	d->accept_pending = false;
	for (int i = 0; i < 2; i++) {
		struct vsock_sock *child;

		if (!d->lst[i])
			continue;
		while (vsock_sock_accept(d->lst[i], &child) == 0)
			guest_conn_start(d, child);
	}
}

static void host_connect_done(struct hconn *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		struct vsock_dev *d = c->dev;
		struct vsock_sock *child = c->s;
		uint32_t port = c->local_port;

		c->s = NULL;
		vsock_sock_set_user(child, NULL);
		hconn_free(c, false);
		guest_conn_refuse(d, child, strerror(err), port);
		return;
	}
	loop_timer_disarm(c->timer);
	if (vsock_sock_accept_pending(c->s) < 0) {
		hconn_close(c);
		return;
	}
	c->state = HC_OPEN;
	hconn_update_events(c);
	dev_host_mark_dirty(c);
}

/* ---- data --------------------------------------------------------------------------------- */

static void hconn_update_events(struct hconn *c)
{
	uint32_t ev = 0;

	if (c->state != HC_OPEN)
		return;
	if (!c->host_rd_eof && !c->guest_blocked && !c->rd_parked)
		ev |= EPOLLIN;
	if (c->host_wr_blocked)
		ev |= EPOLLOUT;
	/*
	 * epoll reports EPOLLHUP whatever the mask: once the host has hung up, a connection that
	 * waits for guest credit must leave epoll altogether, or the loop would spin.
	 */
	if (c->host_hup && ev == 0) {
		loop_watch_del(c->w);
		c->w = NULL;
		return;
	}
	if (!c->w) {
		if (loop_watch_add(c->dev->loop, c->fd, ev, hconn_io_cb, c, &c->w) < 0)
			c->w = NULL;
		return;
	}
	(void)loop_watch_mod(c->w, ev);
}

/*
 * Guest -> host: moves queued guest bytes into the host socket. Returns 0, or -EPIPE if the host
 * socket is gone for writing (the connection must end).
 */
static int flush_to_host(struct hconn *c)
{
	struct vsock_dev *d = c->dev;

	c->host_wr_blocked = false;
	if (c->host_wr_shut)
		return 0;
	for (int rounds = 0; rounds < 64; rounds++) {
		if (!c->seqpacket) {
			struct iovec iov[HOST_IOV_MAX];
			struct msghdr mh = { .msg_iov = iov };
			ssize_t n = vsock_sock_rx_peek_iov(c->s, iov, HOST_IOV_MAX), w;
			size_t cnt = 0, tot = 0;

			if (n <= 0)
				return 0;
			while (tot < (size_t)n && cnt < HOST_IOV_MAX)
				tot += iov[cnt++].iov_len;
			mh.msg_iovlen = cnt;
			w = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (w < 0) {
				if (errno == EAGAIN || errno == EINTR) {
					c->host_wr_blocked = errno == EAGAIN;
					return 0;
				}
				return -EPIPE;
			}
			vsock_sock_rx_consume(c->s, (size_t)w);
			if (w < n) {
				c->host_wr_blocked = true;
				return 0;
			}
		} else {
			struct iovec iov = { d->host.scratch, d->host.scratch_len };
			struct iovec none = { NULL, 0 };
			ssize_t n = vsock_sock_recv(c->s, &iov, 1, VSOCK_MSG_PEEK, NULL), w;

			if (n < 0)
				return 0;
			if (n == 0) {
				/* EOF, or an empty message: not forwarded (consumed if it was one). */
				(void)vsock_sock_recv(c->s, &none, 1, VSOCK_MSG_TRUNC, NULL);
				return 0;
			}
			w = send(c->fd, d->host.scratch, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (w < 0) {
				if (errno == EAGAIN || errno == ENOBUFS) {
					c->host_wr_blocked = true;
					return 0;
				}
				return -EPIPE;
			}
			(void)vsock_sock_recv(c->s, &none, 1, VSOCK_MSG_TRUNC, NULL);
		}
	}
	/* More than a pass's worth: come back through the continuation. */
	dev_host_mark_dirty(c);
	return 0;
}

/* The guest will take no more bytes: stop reading the host socket for good. */
static void guest_rcv_shut(struct hconn *c)
{
	c->host_rd_eof = true;
	c->guest_blocked = false;
	shutdown(c->fd, SHUT_RD);
}

/* guest_rcv_shut() if the guest has sent SHUTDOWN with RCV. */
static void guest_rcv_shut_if_asked(struct hconn *c)
{
	struct vsock_sock_info info;

	vsock_sock_get_info(c->s, &info);
	if (info.peer_shutdown & VSOCK_SHUTDOWN_RCV)
		guest_rcv_shut(c);
}

/* ---- host -> guest budget (h2g_budget.h, docs/performance.md §7) ---------------------------- */

/*
 * c's credit limit, bytes in flight and where its next packet starts (tx_cnt + bytes queued)
 * now; forgets the packets the guest consumed.
 */
static void h2g_state(struct hconn *c, uint32_t *cap, uint64_t *in_flight, uint32_t *tx_end)
{
	struct vsock_sock_info in;

	vsock_sock_get_info(c->s, &in);
	/* The guest's buf_alloc alone, as the engine's credit (cfg.tx_window_peer): capped by our
	 * own (tx-buffer-size), a guest that reads only once it holds more than that would wait
	 * forever, sending no CREDIT_UPDATE (docs/vsock-protocol.md §3). */
	*cap = in.peer_buf_alloc;
	*in_flight = (uint64_t)vsock_credit_in_flight(in.tx_cnt, in.peer_fwd_cnt) + in.tx_queued;
	*tx_end = in.tx_cnt + in.tx_queued;
	if (c->h2g_small && (int32_t)(in.peer_fwd_cnt - c->h2g_small_end) >= 0)
		c->h2g_small = 0;
	if (c->h2g_big && (int32_t)(in.peer_fwd_cnt - c->h2g_big_end) >= 0)
		c->h2g_big = 0;
}

/*
 * Bytes the next read of c may send the guest (0: wait until the guest consumes); *tx_end: where
 * that read's packets will start (h2g_state).
 */
static uint32_t h2g_room_at(struct hconn *c, uint32_t *tx_end)
{
	uint64_t in_flight;
	uint32_t cap;

	h2g_state(c, &cap, &in_flight, tx_end);
	return h2g_budget(cap, in_flight, c->h2g_big, c->h2g_small);
}

static uint32_t h2g_room(struct hconn *c)
{
	uint32_t tx_end;

	return h2g_room_at(c, &tx_end);
}

/* c sent or queued @small small packets and @big bytes in big ones, the last ending at @end
 * (tx_cnt + bytes queued after them; h2g_budget.h). */
static void h2g_note_at(struct hconn *c, unsigned small, size_t big, uint32_t end)
{
	if (small) {
		c->h2g_small += small;
		c->h2g_small_end = end;
	}
	if (big) {
		c->h2g_big += big;
		c->h2g_big_end = end;
	}
}

/* h2g_note_at() with the end as the engine has it now. */
static void h2g_note(struct hconn *c, unsigned small, size_t big)
{
	struct vsock_sock_info in;

	if (!small && !big)
		return;
	vsock_sock_get_info(c->s, &in);
	h2g_note_at(c, small, big, in.tx_cnt + in.tx_queued);
}

void dev_host_tx_sent(void *user, uint32_t len, uint32_t end)
{
	struct hconn *c = user;

	/* Its bytes were charged as big when read (read_from_host); only a small packet adds. */
	if (!c->seqpacket && h2g_is_small(len))
		h2g_note_at(c, 1, 0, end);
}

/* Host -> guest. Returns 0, or -EPIPE if the connection must end. */
static int read_from_host(struct hconn *c)
{
	struct vsock_dev *d = c->dev;
	size_t moved = 0;

	if (d->zerocopy && !c->seqpacket) {
		/* Read by the RX path straight into a guest buffer (dev_host_rx). */
		if (!c->host_rd_eof)
			rd_queue(c);
		return 0;
	}
	while (!c->host_rd_eof && moved < HOST_READ_BUDGET) {
		struct iovec iov;
		ssize_t n, s;

		if (!c->seqpacket) {
			size_t space = MIN(vsock_sock_send_space(c->s), (size_t)h2g_room(c));

			if (space == 0) {
				c->guest_blocked = true;
				break;
			}
			n = recv(c->fd, d->host.scratch, MIN(space, d->host.scratch_len), MSG_DONTWAIT);
		} else {
			n = recv(c->fd, d->host.scratch, d->host.scratch_len, MSG_DONTWAIT | MSG_PEEK | MSG_TRUNC);
			if (n > (ssize_t)d->host.scratch_len) {
				log_vm(LOG_LVL_DEBUG, d->cid, c->local_port, peer_port_of(c),
				       "host seqpacket message of %zd bytes is too big", n);
				return -EPIPE;
			}
		}
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				break;
			return -EPIPE;
		}
		if (n == 0) {
			/* Host EOF: the guest gets SHUTDOWN with SEND only (half-close). */
			c->host_rd_eof = true;
			(void)vsock_sock_shutdown(c->s, VSOCK_SHUTDOWN_SEND);
			break;
		}
		iov.iov_base = d->host.scratch;
		iov.iov_len = (size_t)n;
		s = vsock_sock_send(c->s, &iov, 1, 0);
		if (c->seqpacket) {
			if (s == -EAGAIN) {
				c->guest_blocked = true;
				break;
			}
			if (s == -EPIPE) {
				guest_rcv_shut(c);
				break;
			}
			if (s < 0)
				return -EPIPE;
			(void)recv(c->fd, d->host.scratch, 0, MSG_DONTWAIT); /* drops the peeked message */
		} else if (s == -EPIPE) {
			/* The guest shut down receiving: this direction is over, the other goes on. */
			guest_rcv_shut(c);
			break;
		} else if (s != n) {
			/* send_space promised room: a short send means the socket is no longer usable. */
			return -EPIPE;
		} else {
			/* Charged as big now; where the engine cuts them into packets is known
			 * once they leave (dev_host_tx_sent counts the small ones). */
			h2g_note(c, 0, (size_t)n);
		}
		moved += (size_t)n;
	}
	if (moved >= HOST_READ_BUDGET)
		dev_host_mark_dirty(c);
	return 0;
}

/* ---- zero-copy data ------------------------------------------------------------------------ */

size_t dev_host_deliver(struct vsock_dev *d, void *user, const struct iovec *iov, int iovcnt,
		    size_t len)
{
	struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	struct hconn *c = user;
	ssize_t w;

	/* Before HC_OPEN the host program has not had its "OK" line yet: the bytes wait. */
	if (!c || c->state != HC_OPEN || c->seqpacket || c->host_wr_shut || c->host_wr_blocked)
		return 0;
	w = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w < 0 || (size_t)w < len) {
		/* The rest is queued; flush_to_host retries it, waits for EPOLLOUT, or ends the
		 * connection on an error. */
		c->host_wr_blocked = true;
		dev_host_mark_dirty(c);
		if (w < 0)
			return 0;
	}
	DEV_STAT_ADD(d, zc_tx_bytes, (uint64_t)w);
	return (size_t)w;
}

/* Puts c at the tail of the read list if it is not on it. */
static void rd_queue(struct hconn *c)
{
	struct vsock_dev *d = c->dev;

	if (c->rd_queued)
		return;
	c->rd_queued = true;
	c->rd_next = NULL;
	if (d->host.rd_tail)
		d->host.rd_tail->rd_next = c;
	else
		d->host.rd_head = c;
	d->host.rd_tail = c;
}

/* c leaves the read list: polled for input again if it was parked. */
static void rd_done(struct hconn *c)
{
	rd_unlink(c);
	if (c->rd_parked) {
		c->rd_parked = false;
		hconn_update_events(c);
	}
}

/*
 * c cannot send now: reserve said r (0: no guest credit; -EPIPE: the guest shut down receiving;
 * else the engine socket is no longer connected). It leaves the read list.
 */
static void rd_cannot_send(struct hconn *c, ssize_t r)
{
	rd_done(c);
	if (r == 0)
		c->guest_blocked = true;
	else if (r == -EPIPE)
		guest_rcv_shut(c);
	dev_host_mark_dirty(c);
	hconn_update_events(c);
}

/* The host socket of c reached EOF (or failed: err): c leaves the read list. */
static void rd_eof(struct hconn *c, bool err)
{
	rd_done(c);
	if (err) {
		hconn_close(c);
		return;
	}
	/* Host EOF: the guest gets SHUTDOWN with SEND only (half-close). */
	c->host_rd_eof = true;
	(void)vsock_sock_shutdown(c->s, VSOCK_SHUTDOWN_SEND);
	if (c->host_wr_shut || c->host_hup) {
		/* Both directions over, as hconn_service_open decides: one SHUTDOWN (both flags)
		 * goes out, not two. */
		hconn_close(c);
		return;
	}
	dev_host_mark_dirty(c);
	hconn_update_events(c);
}

/*
 * The host bytes read in place, as an RX producer (struct dev_rx_src). pending: the bytes the
 * first connection of the read list may send the guest now (what its host socket holds, capped
 * by the guest's credit and the h2g budget, both reserved here, once, for the fill that follows;
 * at least 1 if its engine packets must go first or it reached EOF), 0 if none has any (those
 * without credit or input leave the list; EOF leaves its SHUTDOWN in the engine).
 */
static size_t host_rx_pending(struct vsock_dev *d)
{
	struct hconn *c;

	d->host.rd_cur = NULL;
	d->host.rd_credit = 0;
	while ((c = d->host.rd_head)) {
		ssize_t r = vsock_sock_tx_reserve(c->s, SIZE_MAX);
		int avail = 0;
		char b;

		if (r == -EAGAIN)
			return 1; /* a buffer for its engine packets first (no fill: rd_cur NULL) */
		if (r > 0)
			r = MIN(r, (ssize_t)h2g_room_at(c, &d->host.rd_tx_end));
		if (r <= 0) {
			rd_cannot_send(c, r);
			continue;
		}
		d->host.rd_cur = c;
		d->host.rd_credit = (size_t)r;
		if (ioctl(c->fd, FIONREAD, &avail) == 0 && avail > 0)
			return MIN((size_t)avail, (size_t)r);
		/*
		 * Nothing queued: EOF, or a stale EPOLLIN (another event of the same wakeup drained
		 * the socket). A popped RX buffer must never go unused (the guest counts an empty
		 * one as a drop), so tell them apart first; EOF needs only the engine's SHUTDOWN.
		 */
		r = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (r > 0)
			return 1;
		d->host.rd_cur = NULL;
		if (r == 0 || (errno != EAGAIN && errno != EINTR))
			rd_eof(c, r < 0);
		else
			rd_done(c);
	}
	return 0;
}

/*
 * Builds in v (max entries) the payload areas of b[0..nb) for *r bytes in all, as many whole
 * areas as fit (the first always does: a chain has at most DEV_RX_IOV_MAX entries); *r is set
 * to the bytes described. Returns the entries used.
 */
static int rx_gather_iov(const struct dev_rx_buf *b, unsigned nb, size_t *r, struct iovec *v,
			 size_t max)
{
	size_t vn = 0, got = 0;

	for (unsigned i = 0; i < nb && got < *r; i++) {
		size_t k = MIN(*r - got, b[i].room);
		int n = iov_slice(b[i].iov, b[i].iovcnt, VSOCK_HDR_SIZE, k, v + vn, max - vn);

		if (n < 0)
			break;
		vn += (size_t)n;
		got += k;
	}
	*r = got;
	return (int)vn;
}

/*
 * fill: reads the bytes of the connection pending chose with one readv straight into the
 * payload areas of the nb buffers (each at most its room, all together at most the credit
 * reserved there) and fills the header of each buffer it used, in order. Returns how many it
 * used; 0 if it read nothing (EOF and errors leave a SHUTDOWN or RST in the engine instead).
 */
static unsigned host_rx_fill(struct vsock_dev *d, struct dev_rx_buf *b, unsigned nb)
{
	struct iovec v[2 * DEV_RX_IOV_MAX];
	struct hconn *c = d->host.rd_cur;
	size_t want = d->host.rd_credit, big = 0;
	unsigned used = 0, small = 0;
	ssize_t n;
	int vn;

	d->host.rd_cur = NULL;
	if (!c)
		return 0; /* its engine packets (a RESPONSE...) go first */
	vn = rx_gather_iov(b, nb, &want, v, ARRAY_SIZE(v));
	n = readv(c->fd, v, vn);
	if (n <= 0) {
		if (n == 0 || (errno != EAGAIN && errno != EINTR))
			rd_eof(c, n < 0);
		else
			rd_done(c);
		return 0;
	}
	DEV_STAT_ADD(d, zc_rx_bytes, (uint64_t)n);
	/* One packet per buffer, in order; each carries our credit as of then. */
	for (size_t left = (size_t)n; left > 0; used++) {
		size_t k = MIN(left, b[used].room);

		small += h2g_is_small(k);
		big += k >= H2G_PKT_COST ? k : 0;
		if (vsock_sock_tx_commit(c->s, k, &b[used].h) < 0) {
			/* Cannot happen on the one thread that feeds the engine; the bytes are
			 * gone, so is the connection. */
			rd_done(c);
			hconn_close(c);
			return used;
		}
		left -= k;
	}
	/* Nothing else sent on c since pending reserved (one thread feeds the engine), and a
	 * reservation needs nothing queued: the packets end at its tx_cnt + n. */
	h2g_note_at(c, small, big, d->host.rd_tx_end + (uint32_t)n);
	/* Round robin; a read that filled every buffer may have left more behind. */
	rd_unlink(c);
	if ((size_t)n == want)
		rd_queue(c);
	else
		rd_done(c);
	return used;
}

/*
 * park: the RX ring cannot take more now: stop polling the waiting connections for input (a
 * readable socket would make the loop spin) until a fill serves them.
 */
static void host_rx_park(struct vsock_dev *d, bool stopped)
{
	(void)stopped;
	d->host.rd_cur = NULL;
	for (struct hconn *c = d->host.rd_head; c; c = c->rd_next) {
		if (c->rd_parked)
			continue;
		c->rd_parked = true;
		hconn_update_events(c);
	}
}

const struct dev_rx_src dev_host_rx = {
	.pending = host_rx_pending,
	.fill = host_rx_fill,
	.park = host_rx_park,
	.max_bufs = DEV_RX_GATHER,
};

static bool rx_empty(struct hconn *c)
{
	struct vsock_sock_info info;

	vsock_sock_get_info(c->s, &info);
	return info.rx_bytes == 0;
}

/* Drives an open connection after any event; may free c. */
static void hconn_service_open(struct hconn *c)
{
	unsigned mask = vsock_sock_poll(c->s);
	enum vsock_state st = vsock_sock_state(c->s);

	if (flush_to_host(c) < 0) {
		hconn_close(c);
		return;
	}
	/*
	 * The guest shut down receiving (its close(): SHUTDOWN with RCV and SEND): the host ->
	 * guest direction ends before the SEND shutdown below is passed on, so a host program that
	 * sees the EOF finds its writes refused (EPIPE) at once, as a vsock peer's are.
	 */
	if ((mask & (VSOCK_POLLRDHUP | VSOCK_POLLHUP)) && !c->host_rd_eof)
		guest_rcv_shut_if_asked(c);
	/* Guest half-close: pass it on once every byte it sent has been handed over. */
	if ((mask & VSOCK_POLLRDHUP) && !c->host_wr_shut && !c->host_wr_blocked &&
	    rx_empty(c)) {
		shutdown(c->fd, SHUT_WR);
		c->host_wr_shut = true;
	}
	/*
	 * No credit: maybe because the guest shut down receiving (SHUTDOWN with RCV, e.g. its
	 * close()), which ends the host -> guest direction.
	 */
	if (c->guest_blocked && !c->host_rd_eof) {
		struct vsock_sock_info info;

		vsock_sock_get_info(c->s, &info);
		if (info.peer_shutdown & VSOCK_SHUTDOWN_RCV)
			guest_rcv_shut(c);
	}
	if (st == VSOCK_SS_CLOSED && !c->host_wr_blocked) {
		/* Reset or fully closed by the guest, and everything delivered. */
		hconn_close(c);
		return;
	}
	/*
	 * Both directions finished: host -> guest by host EOF or guest SHUTDOWN(RCV), guest -> host
	 * by guest SHUTDOWN(SEND) with everything flushed or by the host closing its socket. The
	 * engine then ends the connection (at once with RST if the guest shut down both ways).
	 */
	if (c->host_rd_eof && (c->host_wr_shut || c->host_hup)) {
		hconn_close(c);
		return;
	}
	if (c->guest_blocked &&
	    (c->seqpacket || (vsock_sock_send_space(c->s) > 0 && h2g_room(c) > 0))) {
		c->guest_blocked = false;
		if (read_from_host(c) < 0) {
			hconn_close(c);
			return;
		}
	}
	hconn_update_events(c);
}

static void hconn_service(struct hconn *c)
{
	switch (c->state) {
	case HC_READ_CONNECT:
		return;
	case HC_HOST_CONNECT:
		if (vsock_sock_state(c->s) == VSOCK_SS_CLOSED)
			hconn_close(c);
		return;
	case HC_GUEST_CONNECT: {
		enum vsock_state st = vsock_sock_state(c->s);

		if (st == VSOCK_SS_CONNECTED) {
			loop_timer_disarm(c->timer);
			if (send_ok(c) < 0) {
				hconn_close(c);
				return;
			}
			c->state = HC_OPEN;
			break;
		}
		if (st == VSOCK_SS_CLOSED) {
			int e = vsock_sock_take_error(c->s);
			uint32_t port = 0;

			/* The socket is closed: the guest port is the one of the CONNECT line. */
			(void)uds_connect_parse(c->rd.buf, c->rd.len, &port);
			DEV_STAT_ADD(c->dev, host_conns_guest_refused, 1);
			log_vm(LOG_LVL_WARN, c->dev->cid, c->local_port, port,
			       "host connection refused by the guest: nobody listens on guest port "
			       "%u (%s)", port, strerror(e < 0 ? -e : e));
			hconn_close(c);
		}
		return;
	}
	case HC_OPEN:
		break;
	}
	hconn_service_open(c);
}

void dev_host_service_dirty(struct vsock_dev *d)
{
	struct hconn *snap = d->host.dirty;

	d->host.dirty = NULL;
	while (snap) {
		struct hconn *c = snap;

		snap = c->next_dirty;
		c->dirty = false;
		hconn_service(c);
	}
}

static void hconn_io_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct hconn *c = opaque;
	struct vsock_dev *d = c->dev;

	(void)l;
	(void)fd;
	switch (c->state) {
	case HC_READ_CONNECT:
		read_connect_line(c);
		break;
	case HC_GUEST_CONNECT:
		/* Only EPOLLHUP/ERR are watched: the host program left before the guest answered. */
		hconn_close(c);
		break;
	case HC_HOST_CONNECT:
		host_connect_done(c);
		break;
	case HC_OPEN:
		if (events & (EPOLLHUP | EPOLLERR))
			c->host_hup = true;
		if (events & EPOLLOUT)
			c->host_wr_blocked = false;
		if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->guest_blocked &&
		    read_from_host(c) < 0) {
			hconn_close(c);
			break;
		}
		hconn_service_open(c);
		break;
	}
	dev_up.settle(d);
}

static void hconn_timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct hconn *c = opaque;
	struct vsock_dev *d = c->dev;

	(void)l;
	(void)t;
	DEV_STAT_ADD(d, host_connect_timeouts, 1);
	/* A guest connect whose host listener did not accept in time is refused too (RST). */
	if (c->state == HC_HOST_CONNECT)
		DEV_STAT_ADD(d, guest_conns_refused, 1);
	if (c->state == HC_READ_CONNECT)
		DEV_STAT_ADD(d, host_handshake_timeouts, 1);
	/* A host program that never finishes its line is worth telling the operator. */
	log_vm(c->state == HC_READ_CONNECT ? LOG_LVL_INFO : LOG_LVL_DEBUG, d->cid, c->local_port,
	       c->s ? peer_port_of(c) : 0, "host connection timed out waiting for %s",
	       c->state == HC_READ_CONNECT   ? "the CONNECT line"
	       : c->state == HC_HOST_CONNECT ? "the host listener"
					     : "the guest");
	hconn_close(c);
	dev_up.settle(d);
}

/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

/* Tags of the host side's list, and of one connection (HC_*). */
enum {
	H_LST = 1,       /* the listeners: list of (fd, dev, ino, flags), STREAM then SEQPACKET */
	H_LST_SEQ = 2,
	H_CONNS = 3,     /* connections: list of H_CONN */
	H_CONN = 0x20,
};
enum { HL_FD = 1, HL_DEV, HL_INO, HL_FLAGS };
enum {
	HC_FD = 1, HC_ID, HC_STATE, HC_SEQPACKET, HC_LOCAL_PORT, HC_LINE, HC_TIMER_LEFT, HC_FLAGS,
	HC_H2G_SMALL, HC_H2G_SMALL_END, HC_H2G_BIG_END, HC_H2G_BIG,
};
/* HC_FLAGS bits */
#define HCF_RD_EOF 1u
#define HCF_WR_SHUT 2u
#define HCF_WR_BLOCKED 4u
#define HCF_GUEST_BLOCKED 8u
#define HCF_HUP 16u
#define HCF_ALL 31u

void dev_host_freeze(struct vsock_dev *d)
{
	struct dev_host *h = &d->host;

	loop_watch_del(h->uds_w);
	loop_watch_del(h->uds_seq_w);
	h->uds_w = h->uds_seq_w = NULL;
	if (h->aux)
		loop_timer_disarm(h->pause_timer);
	for (struct hconn *c = h->conns; c; c = c->next) {
		loop_watch_del(c->w);
		c->w = NULL;
		/* The read list is re-derived at thaw (level-triggered: unread bytes wake us). */
		rd_unlink(c);
		c->rd_parked = false;
		if (loop_timer_armed(c->timer)) {
			c->frozen_timer = true;
			loop_timer_disarm(c->timer);
		}
	}
}

int dev_host_thaw(struct vsock_dev *d)
{
	struct dev_host *h = &d->host;
	int r;

	if (h->uds_l.fd >= 0 && !h->uds_w) {
		r = loop_watch_add(d->loop, h->uds_l.fd, EPOLLIN, uds_listen_cb, d, &h->uds_w);
		if (r < 0)
			return r;
	}
	if (h->uds_seq_l.fd >= 0 && !h->uds_seq_w) {
		r = loop_watch_add(d->loop, h->uds_seq_l.fd, EPOLLIN, uds_listen_cb, d,
				   &h->uds_seq_w);
		if (r < 0)
			return r;
	}
	for (struct hconn *c = h->conns; c; c = c->next) {
		uint32_t ev = c->state == HC_READ_CONNECT   ? EPOLLIN
			      : c->state == HC_HOST_CONNECT ? EPOLLOUT
							    : 0;

		if (c->state == HC_OPEN) {
			hconn_update_events(c);
		} else if (!c->w) {
			r = loop_watch_add(d->loop, c->fd, ev, hconn_io_cb, c, &c->w);
			if (r < 0)
				return r;
		}
		if (c->frozen_timer) {
			c->frozen_timer = false;
			hconn_arm(c, c->deadline);
		}
		dev_host_mark_dirty(c);
	}
	return 0;
}

static void save_listener(struct rec_writer *w, uint32_t tag, const struct uds_listener *l)
{
	if (l->fd < 0)
		return;
	rec_begin(w, tag);
	rec_put_fd(w, HL_FD, l->fd);
	rec_put_u64(w, HL_DEV, (uint64_t)l->dev);
	rec_put_u64(w, HL_INO, (uint64_t)l->ino);
	rec_put_u32(w, HL_FLAGS, l->flags & UDS_INHERITED);
	rec_end(w);
}

void dev_host_save(struct vsock_dev *d, struct rec_writer *w)
{
	uint64_t now = loop_now_ns();

	save_listener(w, H_LST, &d->host.uds_l);
	save_listener(w, H_LST_SEQ, &d->host.uds_seq_l);
	rec_begin(w, H_CONNS);
	for (struct hconn *c = d->host.conns; c; c = c->next) {
		uint32_t f = (c->host_rd_eof ? HCF_RD_EOF : 0) | (c->host_wr_shut ? HCF_WR_SHUT : 0) |
			     (c->host_wr_blocked ? HCF_WR_BLOCKED : 0) |
			     (c->guest_blocked ? HCF_GUEST_BLOCKED : 0) | (c->host_hup ? HCF_HUP : 0);

		rec_begin(w, H_CONN);
		rec_put_fd(w, HC_FD, c->fd);
		if (c->s)
			rec_put_u64(w, HC_ID, vsock_sock_id(c->s));
		rec_put_u32(w, HC_STATE, c->state);
		rec_put_u32(w, HC_SEQPACKET, c->seqpacket);
		rec_put_u32(w, HC_LOCAL_PORT, c->local_port);
		if (c->state == HC_READ_CONNECT || c->state == HC_GUEST_CONNECT)
			rec_put_bytes(w, HC_LINE, c->rd.buf, c->rd.len);
		if (c->frozen_timer)
			rec_put_u64(w, HC_TIMER_LEFT, c->deadline > now ? c->deadline - now : 0);
		rec_put_u32(w, HC_FLAGS, f);
		rec_put_u32(w, HC_H2G_SMALL, c->h2g_small);
		rec_put_u32(w, HC_H2G_SMALL_END, c->h2g_small_end);
		rec_put_u32(w, HC_H2G_BIG_END, c->h2g_big_end);
		rec_put_u64(w, HC_H2G_BIG, c->h2g_big);
		rec_end(w);
	}
	rec_end(w);
}

static const struct rec_field host_fields[] = {
	{ H_LST, REC_LIST, false, "stream listener" },
	{ H_LST_SEQ, REC_LIST, false, "seqpacket listener" },
	{ H_CONNS, REC_LIST, true, "connections" },
};
static const struct rec_field lst_fields[] = {
	{ HL_FD, REC_FD, true, "fd" },
	{ HL_DEV, REC_U64, true, "dev" },
	{ HL_INO, REC_U64, true, "ino" },
	{ HL_FLAGS, REC_U32, true, "flags" },
};
static const struct rec_field conn_fields[] = {
	{ HC_FD, REC_FD, true, "fd" },
	{ HC_ID, REC_U64, false, "socket id" },
	{ HC_STATE, REC_U32, true, "state" },
	{ HC_SEQPACKET, REC_U32, true, "seqpacket" },
	{ HC_LOCAL_PORT, REC_U32, true, "local port" },
	{ HC_LINE, REC_BYTES, false, "CONNECT line" },
	{ HC_TIMER_LEFT, REC_U64, false, "timer" },
	{ HC_FLAGS, REC_U32, true, "flags" },
	{ HC_H2G_SMALL, REC_U32, true, "h2g_small" },
	{ HC_H2G_SMALL_END, REC_U32, true, "h2g_small_end" },
	{ HC_H2G_BIG_END, REC_U32, true, "h2g_big_end" },
	{ HC_H2G_BIG, REC_U64, true, "h2g_big" },
};

static int restore_listener(struct vsock_dev *d, struct rec_reader *r, const struct rec_val *v,
			    int type, struct uds_listener *l)
{
	struct rec_val lv[ARRAY_SIZE(lst_fields)];
	struct rec_reader sub;
	int fd, e;

	if (!v->present)
		return 0;
	e = rec_enter(r, &v->it, type == SOCK_STREAM ? "stream listener" : "seqpacket listener",
		      &sub);
	if (e < 0)
		return e;
	e = rec_scan(&sub, lst_fields, ARRAY_SIZE(lst_fields), lv);
	if (e < 0)
		return e;
	if (lv[3].u & ~(uint64_t)UDS_INHERITED)
		return rec_fail(r->doc, -EBADMSG, "%s: listener flags %#llx", d->name,
				(unsigned long long)lv[3].u);
	e = dev_rec_sock_fd(r, (int)lv[0].u, type, true, &fd);
	if (e < 0)
		return e;
	*l = (struct uds_listener){ .fd = fd, .dev = (dev_t)lv[1].u, .ino = (ino_t)lv[2].u,
				    .flags = (unsigned)lv[3].u };
	return 0;
}

static int restore_conn(struct vsock_dev *d, struct rec_reader *r, const struct rec_item *it)
{
	struct rec_val v[ARRAY_SIZE(conn_fields)];
	struct rec_reader sub;
	struct hconn *c;
	uint32_t f;
	int e, fd;

	e = rec_enter(r, it, "host connection", &sub);
	if (e < 0)
		return e;
	e = rec_scan(&sub, conn_fields, ARRAY_SIZE(conn_fields), v);
	if (e < 0)
		return e;
	f = (uint32_t)v[7].u;
	if (v[2].u > HC_OPEN || v[3].u > 1 || (f & ~HCF_ALL))
		return rec_fail(r->doc, -EBADMSG, "host connection at %zu: state %llu, "
				"seqpacket %llu or flags %#x out of range", it->off,
				(unsigned long long)v[2].u, (unsigned long long)v[3].u, f);
	/* Only a host connection still reading its CONNECT line has no engine socket. */
	if (v[1].present != (v[2].u != HC_READ_CONNECT) || (v[1].present && v[1].u == 0))
		return rec_fail(r->doc, -EBADMSG, "host connection at %zu: socket id %s "
				"in state %llu", it->off, v[1].present ? "present" : "missing",
				(unsigned long long)v[2].u);
	if (v[5].present && v[5].it.len >= UDS_CONNECT_LINE_MAX)
		return rec_fail(r->doc, -EBADMSG, "host connection at %zu: CONNECT line "
				"of %u bytes", it->off, v[5].it.len);
	if (v[6].present != (v[2].u == HC_READ_CONNECT || v[2].u == HC_GUEST_CONNECT ||
			     v[2].u == HC_HOST_CONNECT) ||
	    (v[6].present && v[6].u > DEV_HOST_CONNECT_TIMEOUT_NS))
		return rec_fail(r->doc, -EBADMSG, "host connection at %zu: timer does not "
				"fit state %llu", it->off, (unsigned long long)v[2].u);
	if (d->host.n_conns >= d->max_conns)
		return rec_fail(r->doc, -E2BIG, "more host connections than max_conns (%u)",
				d->max_conns);
	e = dev_rec_sock_fd(r, (int)v[0].u, v[3].u ? SOCK_SEQPACKET : SOCK_STREAM, false, &fd);
	if (e < 0)
		return e;
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->dev = d;
	c->fd = fd;
	e = loop_timer_new(d->loop, hconn_timer_cb, c, &c->timer);
	if (e < 0) {
		close(fd);
		free(c);
		return e;
	}
	c->state = (enum hconn_state)v[2].u;
	c->seqpacket = v[3].u;
	c->local_port = (uint32_t)v[4].u;
	c->restore_id = v[1].present ? v[1].u : 0;
	if (v[5].present) {
		memcpy(c->rd.buf, v[5].it.val, v[5].it.len);
		c->rd.len = v[5].it.len;
	}
	if (v[6].present) {
		c->frozen_timer = true;
		c->deadline = loop_now_ns() + v[6].u;
	}
	c->host_rd_eof = f & HCF_RD_EOF;
	c->host_wr_shut = f & HCF_WR_SHUT;
	c->host_wr_blocked = f & HCF_WR_BLOCKED;
	c->guest_blocked = f & HCF_GUEST_BLOCKED;
	c->host_hup = f & HCF_HUP;
	c->h2g_small = (uint32_t)v[8].u;
	c->h2g_small_end = (uint32_t)v[9].u;
	c->h2g_big_end = (uint32_t)v[10].u;
	c->h2g_big = v[11].u;
	c->next = d->host.conns;
	if (d->host.conns)
		d->host.conns->prev = c;
	d->host.conns = c;
	d->host.n_conns++;
	if (c->state == HC_READ_CONNECT)
		d->host.n_handshakes++;
	return 0;
}

static int cmp_restore_id(const void *a, const void *b)
{
	uint64_t x = (*(struct hconn *const *)a)->restore_id;
	uint64_t y = (*(struct hconn *const *)b)->restore_id;

	return x < y ? -1 : x > y;
}

static void by_id_free(struct vsock_dev *d)
{
	free(d->host.by_id);
	d->host.by_id = NULL;
	d->host.n_by_id = 0;
}

/* The restored connections that name an engine socket, sorted by its id; each id once. */
static int by_id_make(struct vsock_dev *d, struct rec_reader *r)
{
	unsigned n = 0;

	d->host.by_id = calloc(d->host.n_conns ? d->host.n_conns : 1, sizeof(*d->host.by_id));
	if (!d->host.by_id)
		return -ENOMEM;
	for (struct hconn *c = d->host.conns; c; c = c->next)
		if (c->restore_id)
			d->host.by_id[n++] = c;
	qsort(d->host.by_id, n, sizeof(*d->host.by_id), cmp_restore_id);
	d->host.n_by_id = n;
	for (unsigned i = 1; i < n; i++)
		if (d->host.by_id[i]->restore_id == d->host.by_id[i - 1]->restore_id)
			return rec_fail(r->doc, -EBADMSG, "two host connections name socket %llu",
					(unsigned long long)d->host.by_id[i]->restore_id);
	return 0;
}

int dev_host_restore(struct vsock_dev *d, struct rec_reader *r)
{
	struct rec_val v[ARRAY_SIZE(host_fields)];
	struct rec_reader sub;
	struct rec_item it;
	int e;

	e = rec_scan(r, host_fields, ARRAY_SIZE(host_fields), v);
	if (e < 0)
		return e;
	e = restore_listener(d, r, &v[0], SOCK_STREAM, &d->host.uds_l);
	if (e == 0)
		e = restore_listener(d, r, &v[1], SOCK_SEQPACKET, &d->host.uds_seq_l);
	if (e == 0)
		e = rec_enter(r, &v[2].it, "host connections", &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		if (it.tag != H_CONN)
			e = rec_fail(r->doc, -EBADMSG, "host connections: tag %u at %zu",
				     it.tag, it.off);
		else
			e = restore_conn(d, r, &it);
	}
	if (e == 0)
		e = by_id_make(d, r);
	if (e < 0)
		dev_host_unrestore(d);
	return e < 0 ? e : 0;
}

void dev_host_unrestore(struct vsock_dev *d)
{
	by_id_free(d);
	dev_host_close_all(d);
	if (d->host.uds_l.fd >= 0)
		close(d->host.uds_l.fd);
	if (d->host.uds_seq_l.fd >= 0)
		close(d->host.uds_seq_l.fd);
	d->host.uds_l.fd = d->host.uds_seq_l.fd = -1;
}

bool dev_host_adopt(struct vsock_dev *d, struct vsock_sock *s)
{
	uint64_t id = vsock_sock_id(s);
	unsigned lo = 0, hi = d->host.n_by_id;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		struct hconn *c = d->host.by_id[mid];

		if (c->restore_id < id) {
			lo = mid + 1;
		} else if (c->restore_id > id) {
			hi = mid;
		} else {
			if (c->s || (vsock_sock_type(s) == VSOCK_TYPE_SEQPACKET) != c->seqpacket)
				return false;
			c->s = s;
			vsock_sock_set_user(s, c);
			return true;
		}
	}
	return false;
}

int dev_host_check_adopted(struct vsock_dev *d, struct rec_reader *r)
{
	by_id_free(d);
	for (struct hconn *c = d->host.conns; c; c = c->next) {
		if (c->restore_id && !c->s)
			return rec_fail(r->doc, -EBADMSG, "host connection (local port %u): "
					"socket %llu is not one the engine restored", c->local_port,
					(unsigned long long)c->restore_id);
		c->restore_id = 0;
	}
	return 0;
}
