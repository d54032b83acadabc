/* SPDX-License-Identifier: MIT */
/*
 * Datagrams of the device role (docs/uvsockd.md "Datagrams"; the wire format is
 * docs/vsock-protocol.md "Datagrams"): VIRTIO_VSOCK_F_DGRAM offered unless the device was made
 * with no_dgram; our guest's DGRAM packets handled here, never by the STREAM engine; the host
 * side, plain AF_UNIX SOCK_DGRAM sockets.
 *
 * Host convention: every host-side datagram, both ways, starts with one line "<guest port>\n"
 * (decimal, 1 to 10 digits, no leading zero, at most 4294967295), then the payload.
 *  - Guest -> host port P: "<guest src port>\n<payload>" is sent on a socket of ours connected
 *    to the socket bound at <uds_path>_<P>.dgram (opened O_PATH | O_NOFOLLOW in uds_path's
 *    directory and connected to through /proc/self/fd, as uds_connect_at: a symlink there is
 *    never followed; dgram_dest_get), whose replies we read as the per-VM socket's, or, if P
 *    is a port given to a host sender below, on a socket of ours connected to that sender
 *    (dgram_peer_sock: one per sender, bounded, so that one that never reads fills only its
 *    own), or from the per-VM socket to a sender connected to it.
 *  - Host -> guest: the per-VM socket bound at <uds_path>.dgram takes "<guest dst port>\n
 *    <payload>". The host source port is P when the sender is bound at <uds_path>_<P>.dgram
 *    and that file, in uds_path's directory as we see it, is a socket of the sender's uid
 *    (SO_PASSCRED: a name in another mount namespace, or someone else's file, proves nothing);
 *    a sender bound anywhere else gets an ephemeral port in [2^30, 2^31 - 1) remembered in a
 *    table of DEV_DGRAM_PEERS entries (least recently used one replaced), so that replies reach
 *    it; an unbound sender gets DEV_DGRAM_UNBOUND_PORT, whose replies are dropped.
 * Host datagrams are read as they come (recvmmsg, at most DEV_DGRAM_READ_BATCH per wakeup) and
 * queued in our own sibling inbox (bounded: DEV_INBOX_PKTS / DEV_INBOX_BYTES, sibling.c), from
 * which rx_fill puts each one whole into one guest RX buffer; a full inbox, a guest that did not
 * negotiate DGRAM or rings not running drop the datagram (counted): the socket is always
 * drained, so nothing waits in it without bound and the loop never spins on it.
 *
 * Threads: everything here runs on the device's thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/uds_connect.h"
#include "device/vhu.h"
#include "ops/vmlog.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/time.h"

/* "<port>\n": at most 10 digits and the newline. */
#define DGRAM_LINE_MAX 11u

bool dev_dgram_negotiated(const struct vsock_dev *d)
{
	return !d->dgram.off && (d->features & (1ull << VIRTIO_VSOCK_F_DGRAM));
}

void dev_dgram_features(struct vsock_dev *d)
{
	if (d->sib.port)
		atomic_store_explicit(&d->sib.port->dgram, dev_dgram_negotiated(d),
				      memory_order_relaxed);
}

bool dev_dgram_offered(const struct vsock_dev *d)
{
	return !d->dgram.off;
}

/*
 * Parses a decimal port of len bytes at s: 1 to 10 digits, no leading zero (but "0"), at most
 * 0xffffffff. Returns 0 or -EINVAL.
 */
static int dgram_parse_port(const char *s, size_t len, uint32_t *port)
{
	uint64_t v = 0;

	if (len == 0 || len > DGRAM_LINE_MAX - 1 || (s[0] == '0' && len > 1))
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > UINT32_MAX)
		return -EINVAL;
	*port = (uint32_t)v;
	return 0;
}

/* The "<port>\n" line at the start of buf (len bytes). Returns its length or -EINVAL. */
static int dgram_parse_line(const char *buf, size_t len, uint32_t *port)
{
	const char *nl = memchr(buf, '\n', MIN(len, (size_t)DGRAM_LINE_MAX));

	if (!nl || dgram_parse_port(buf, (size_t)(nl - buf), port) < 0)
		return -EINVAL;
	return (int)(nl - buf) + 1;
}

/* The last component of uds_path. */
static const char *dgram_base(const struct vsock_dev *d)
{
	const char *slash = strrchr(d->uds_path, '/');

	return slash ? slash + 1 : d->uds_path;
}

/* P if path (len bytes, no NUL) is <uds_path>_<P>.dgram, else -EINVAL. */
static int dgram_port_of_path(const struct vsock_dev *d, const char *path, size_t len,
			      uint32_t *port)
{
	size_t pre = strlen(d->uds_path), suf = strlen(".dgram");

	if (len < pre + 1 + suf + 1 || memcmp(path, d->uds_path, pre) || path[pre] != '_' ||
	    memcmp(path + len - suf, ".dgram", suf))
		return -EINVAL;
	return dgram_parse_port(path + pre + 1, len - pre - 1 - suf, port);
}

static struct dgram_peer *dgram_peer_by_port(struct vsock_dev *d, uint32_t port)
{
	if (port < DEV_HOST_PORT_LO || port >= DEV_HOST_PORT_HI)
		return NULL;
	for (unsigned i = 0; i < d->dgram.n_peers; i++)
		if (d->dgram.peers[i].port == port)
			return &d->dgram.peers[i];
	return NULL;
}

/* Closes p's own sending socket (dgram_peer_sock), if it has one. */
static void dgram_peer_sock_drop(struct vsock_dev *d, struct dgram_peer *p)
{
	if (p->sfd < 0)
		return;
	loop_watch_del(p->w);
	p->w = NULL;
	close(p->sfd);
	p->sfd = -1;
	d->dgram.n_peer_socks--;
}

/* The remembered entry of a sender bound at sa (any other path, or an abstract name); a new one
 * with a free ephemeral port (the least recently used entry replaced when the table is full). */
static uint32_t dgram_peer_port(struct vsock_dev *d, const struct sockaddr_un *sa,
				socklen_t salen)
{
	struct dgram_peer *p = NULL;

	for (unsigned i = 0; i < d->dgram.n_peers; i++) {
		struct dgram_peer *e = &d->dgram.peers[i];

		if (e->salen == salen && !memcmp(&e->sa, sa, salen)) {
			e->used = ++d->dgram.tick;
			return e->port;
		}
		if (!p || e->used < p->used)
			p = e;
	}
	if (d->dgram.n_peers < DEV_DGRAM_PEERS) {
		p = &d->dgram.peers[d->dgram.n_peers++];
	} else {
		dgram_peer_sock_drop(d, p);
		p->port = 0; /* replaced: its port is free again */
	}
	/* A port no other entry has (the table is far smaller than the range: this ends). */
	do {
		if (++d->dgram.next_port < DEV_HOST_PORT_LO ||
		    d->dgram.next_port >= DEV_HOST_PORT_HI)
			d->dgram.next_port = DEV_HOST_PORT_LO;
	} while (dgram_peer_by_port(d, d->dgram.next_port));
	memset(&p->sa, 0, sizeof(p->sa));
	memcpy(&p->sa, sa, salen);
	p->salen = salen;
	p->port = d->dgram.next_port;
	p->used = ++d->dgram.tick;
	p->sfd = -1;
	p->w = NULL;
	p->shared_ms = 0;
	return p->port;
}

/*
 * True if <uds_path>_<port>.dgram, as we see it in uds_path's directory, is a socket owned by
 * the sender's uid (cred: its SCM_CREDENTIALS). A sender's bound address is only a string: one
 * in a mount namespace of its own binds that string without owning the file we would reply to.
 */
static bool dgram_port_owned(const struct vsock_dev *d, uint32_t port, const struct ucred *cred)
{
	char name[NAME_MAX + 1];
	struct stat st;

	if (!cred || d->host.dir_fd < 0 ||
	    (size_t)snprintf(name, sizeof(name), "%s_%u.dgram", dgram_base(d), port) >= sizeof(name))
		return false;
	return fstatat(d->host.dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISSOCK(st.st_mode) && st.st_uid == cred->uid;
}

/*
 * The host port of a host datagram's sender (sa, salen as recvmsg gave them). cred: the
 * sender's credentials on the per-VM socket; NULL on a destination socket of ours, which only
 * the socket it is connected to can send to.
 */
static uint32_t dgram_src_port(struct vsock_dev *d, const struct sockaddr_un *sa, socklen_t salen,
			       const struct ucred *cred, bool connected)
{
	size_t off = offsetof(struct sockaddr_un, sun_path);
	uint32_t port;

	if (salen <= off || salen > sizeof(*sa))
		return DEV_DGRAM_UNBOUND_PORT;
	if (sa->sun_path[0] &&
	    dgram_port_of_path(d, sa->sun_path, strnlen(sa->sun_path, salen - off), &port) == 0) {
		if (connected || dgram_port_owned(d, port, cred))
			return port;
		log_vm_dev(LOG_LVL_DEBUG, d->cid,
			   "host datagram from a socket bound as host port %u that does not own "
			   "that path here: given an ephemeral port", port);
	}
	return dgram_peer_port(d, sa, salen);
}

/*
 * One datagram read from a host socket of ours into buf (d->dgram.rlen bytes): n bytes, more
 * than dgram_rlen if it was truncated.
 */
static void dgram_from_host(struct vsock_dev *d, const char *buf, const struct sockaddr_un *sa,
			    socklen_t salen, size_t n, const struct ucred *cred, bool connected)
{
	struct vsock_hdr h;
	uint32_t port;
	int line;

	if (!dev_dgram_negotiated(d) || !d->rxq.running || dev_broken(d)) {
		DEV_STAT_ADD(d, dgram_drop_not_negotiated, 1);
		return;
	}
	line = dgram_parse_line(buf, MIN(n, d->dgram.rlen), &port);
	if (line < 0) {
		DEV_STAT_ADD(d, dgram_drop_malformed, 1);
		log_vm_dev(LOG_LVL_DEBUG, d->cid, "host datagram dropped: no \"<port>\\n\" line");
		return;
	}
	if (n > d->dgram.rlen || n - (size_t)line > d->dgram.max) {
		DEV_STAT_ADD(d, dgram_drop_oversize, 1);
		return;
	}
	h = (struct vsock_hdr){
		.src_cid = VMADDR_CID_HOST,
		.dst_cid = d->cid,
		.src_port = dgram_src_port(d, sa, salen, cred, connected),
		.dst_port = port,
		.len = (uint32_t)(n - (size_t)line),
		.type = VSOCK_TYPE_DGRAM,
		.op = VSOCK_OP_RW,
	};
	if (dev_sib_queue_self(d, &h, buf + line) < 0)
		DEV_STAT_ADD(d, dgram_drop_full, 1);
}

/* The SCM_CREDENTIALS of a received message into *ret; false if it has none. */
static bool dgram_cred(struct msghdr *m, struct ucred *ret)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
		    c->cmsg_len >= CMSG_LEN(sizeof(*ret))) {
			memcpy(ret, CMSG_DATA(c), sizeof(*ret));
			return true;
		}
	return false;
}

/* Reads what waits on fd (the per-VM socket or a destination's), DEV_DGRAM_MMSG at a time. */
static void dgram_read_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vsock_dev *d = opaque;
	struct mmsghdr mm[DEV_DGRAM_MMSG];
	struct sockaddr_un sa[DEV_DGRAM_MMSG];
	struct iovec v[DEV_DGRAM_MMSG];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(struct ucred))];
	} cm[DEV_DGRAM_MMSG];
	/* A destination socket is connected: only that socket can send to it. */
	bool connected = fd != d->dgram.l.fd;

	(void)l;
	(void)events;
	for (unsigned done = 0; done < DEV_DGRAM_READ_BATCH;) {
		int n;

		for (unsigned i = 0; i < DEV_DGRAM_MMSG; i++) {
			v[i] = (struct iovec){ d->dgram.rbuf + i * d->dgram.rlen, d->dgram.rlen };
			mm[i] = (struct mmsghdr){ .msg_hdr = { .msg_name = &sa[i],
							       .msg_namelen = sizeof(sa[i]),
							       .msg_iov = &v[i], .msg_iovlen = 1,
							       .msg_control = cm[i].b,
							       .msg_controllen = sizeof(cm[i].b) } };
		}
		/* MSG_TRUNC: each datagram's whole length, to tell an oversize one. */
		n = recvmmsg(fd, mm, DEV_DGRAM_MMSG, MSG_DONTWAIT | MSG_TRUNC, NULL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < n; i++) {
			struct ucred cred;
			bool have = dgram_cred(&mm[i].msg_hdr, &cred);

			dgram_from_host(d, v[i].iov_base, &sa[i], mm[i].msg_hdr.msg_namelen,
					mm[i].msg_len, have ? &cred : NULL, connected);
		}
		done += (unsigned)n;
		if ((unsigned)n < DEV_DGRAM_MMSG)
			break;
	}
	dev_up.settle(d);
}

/*
 * The socket our guest's replies to the remembered sender p leave through, and whether it is
 * the per-VM socket (*shared: send with p's address) or p's own, connected to p. Its own is
 * opened when missing (autobound, so that p can answer to the address it sees; what comes back
 * on it is read as on the per-VM socket), the least recently used peer's closed first when
 * DEV_DGRAM_PEER_SOCKS are open: a sender that never reads fills its own socket's send buffer,
 * not the one every other sender's replies need. A sender connected to <uds_path>.dgram takes
 * datagrams from that socket only (net/unix/af_unix.c, unix_may_send: the connect is refused
 * with EPERM): its replies leave from the per-VM socket, asked again DEV_DGRAM_RECHECK_MS later.
 * Returns the fd or -errno (p's address is gone: -ENOENT, -ECONNREFUSED...).
 */
static int dgram_peer_sock(struct vsock_dev *d, struct dgram_peer *p, bool *shared)
{
	static const struct sockaddr autobind = { .sa_family = AF_UNIX };
	uint64_t now = mono_ms();
	int sfd, r;

	*shared = false;
	if (p->sfd >= 0)
		return p->sfd;
	if (p->shared_ms && now - p->shared_ms < DEV_DGRAM_RECHECK_MS) {
		*shared = true;
		return d->dgram.l.fd;
	}
	if (d->dgram.n_peer_socks >= DEV_DGRAM_PEER_SOCKS) {
		struct dgram_peer *lru = NULL;

		for (unsigned i = 0; i < d->dgram.n_peers; i++) {
			struct dgram_peer *e = &d->dgram.peers[i];

			if (e->sfd >= 0 && (!lru || e->used < lru->used))
				lru = e;
		}
		dgram_peer_sock_drop(d, lru);
	}
	sfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sfd < 0)
		return -errno;
	if (bind(sfd, &autobind, sizeof(sa_family_t)) < 0 ||
	    connect(sfd, (const struct sockaddr *)&p->sa, p->salen) < 0) {
		r = -errno;
		close(sfd);
		if (r != -EPERM)
			return r;
		p->shared_ms = now ? now : 1;
		*shared = true;
		return d->dgram.l.fd;
	}
	r = loop_watch_add(d->loop, sfd, EPOLLIN, dgram_read_cb, d, &p->w);
	if (r < 0) {
		p->w = NULL;
		close(sfd);
		return r;
	}
	p->sfd = sfd;
	p->shared_ms = 0;
	d->dgram.n_peer_socks++;
	return sfd;
}

static void dgram_dest_drop(struct dgram_dest *e)
{
	if (!e->live)
		return;
	loop_watch_del(e->w);
	e->w = NULL;
	close(e->sfd);
	e->live = false;
}

/*
 * A socket connected to the socket file name (in uds_path's directory) into slot, or -ENOENT
 * (nothing there, not a socket, a symlink, nobody bound) or another -errno, through
 * uds_connect_at_st(): a symlink there is never followed, and what is connected to is an inode
 * that was a socket file at that path.
 * The socket is autobound (an abstract name), so that the host program can answer to the
 * address it sees; what comes back on it is read as on the per-VM socket.
 */
static int dgram_dest_open(struct vsock_dev *d, struct dgram_dest *slot, const char *name,
			   uint32_t port)
{
	struct stat st;
	bool pending;
	int sfd, r;

	sfd = uds_connect_at_st(d->host.dir_fd, name, SOCK_DGRAM, "", &pending, &st);
	if (sfd < 0)
		return sfd == -ELOOP || sfd == -ENOTSOCK || sfd == -ECONNREFUSED ? -ENOENT : sfd;
	/* Room for a burst to a host program that connected back to us (best effort: capped by
	 * net.core.wmem_max). */
	setsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &(int){ DEV_DGRAM_SNDBUF }, sizeof(int));
	dgram_dest_drop(slot);
	*slot = (struct dgram_dest){ .live = true, .port = port, .sfd = sfd, .dev = st.st_dev,
				     .ino = st.st_ino, .checked_ms = mono_ms(),
				     .used = ++d->dgram.tick };
	r = loop_watch_add(d->loop, sfd, EPOLLIN, dgram_read_cb, d, &slot->w);
	if (r < 0) {
		slot->w = NULL;
		dgram_dest_drop(slot);
		return r;
	}
	return 0;
}

/*
 * The cache entry of <uds_path>_<port>.dgram (opened by dgram_dest_open when missing), or NULL
 * with *err set. Kept in a small table (DEV_DGRAM_DESTS, least recently used one closed), so
 * that a send is one send() with no path lookup: the path is looked at again (one fstatat with
 * AT_SYMLINK_NOFOLLOW) when recheck is set (the last send found the socket gone) or
 * DEV_DGRAM_RECHECK_MS after the last look, and connected to again if another socket file is
 * there; gone or no longer a socket: the entry is dropped.
 */
static struct dgram_dest *dgram_dest_get(struct vsock_dev *d, uint32_t port, bool recheck,
					 int *err)
{
	struct dgram_dest *e = NULL, *slot = &d->dgram.dests[0];
	char name[NAME_MAX + 1];
	uint64_t now = mono_ms();
	struct stat st;

	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++) {
		struct dgram_dest *c = &d->dgram.dests[i];

		if (c->live && c->port == port)
			e = c;
		if (slot->live && (!c->live || c->used < slot->used))
			slot = c;
	}
	if (e && !recheck && now - e->checked_ms < DEV_DGRAM_RECHECK_MS) {
		e->used = ++d->dgram.tick;
		return e;
	}
	if ((size_t)snprintf(name, sizeof(name), "%s_%u.dgram", dgram_base(d), port) >= sizeof(name)) {
		*err = -ENAMETOOLONG;
		return NULL;
	}
	if (e) {
		if (fstatat(d->host.dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISSOCK(st.st_mode)) {
			dgram_dest_drop(e);
			*err = -ENOENT;
			return NULL;
		}
		if (!recheck && e->dev == st.st_dev && e->ino == st.st_ino) {
			e->checked_ms = now;
			e->used = ++d->dgram.tick;
			return e;
		}
		slot = e;
	}
	*err = dgram_dest_open(d, slot, name, port);
	if (*err < 0 && e)
		dgram_dest_drop(e); /* connected to a socket that is gone */
	return *err < 0 ? NULL : slot;
}

/*
 * Sends our guest's datagram h (payload at piov, pn entries; pn < DEV_TX_IOV_MAX / 2 + 1) to the
 * host: to the sender that got port dst_port (from the per-VM socket), or on the socket connected
 * to <uds_path>_<dst_port>.dgram. Never blocks.
 */
static void dgram_to_host(struct vsock_dev *d, const struct vsock_hdr *h, const struct iovec *piov,
			  int pn)
{
	struct iovec v[1 + DEV_TX_IOV_MAX / 2];
	struct msghdr m = { .msg_iov = v, .msg_iovlen = (size_t)pn + 1 };
	struct dgram_peer *peer = dgram_peer_by_port(d, h->dst_port);
	char line[DGRAM_LINE_MAX + 1];
	struct dgram_dest *e = NULL;
	ssize_t r;
	int err, fd;
	bool shared;

	if (d->dgram.l.fd < 0 || h->dst_port == DEV_DGRAM_UNBOUND_PORT)
		goto no_listener;
	v[0] = (struct iovec){ line, (size_t)snprintf(line, sizeof(line), "%u\n", h->src_port) };
	memcpy(v + 1, piov, (size_t)pn * sizeof(*v));
	if (peer) {
		peer->used = ++d->dgram.tick;
		for (int tries = 0;; tries++) {
			fd = dgram_peer_sock(d, peer, &shared);
			if (fd < 0)
				goto no_listener;
			m.msg_name = shared ? &peer->sa : NULL;
			m.msg_namelen = shared ? peer->salen : 0;
			r = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
			/* ECONNREFUSED, EPERM: the sender closed its socket, or connected it to another
			 * one, since ours was connected to it: ours is closed and opened again, once. */
			if (r >= 0 || shared || (errno != ECONNREFUSED && errno != EPERM) || tries > 0)
				break;
			dgram_peer_sock_drop(d, peer);
		}
	} else {
		for (int tries = 0;; tries++) {
			e = dgram_dest_get(d, h->dst_port, tries > 0, &err);
			if (!e)
				goto no_listener;
			r = sendmsg(e->sfd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
			/* ECONNREFUSED: the socket we were connected to is closed; one bound there
			 * anew is found by looking again, once. */
			if (r >= 0 || errno != ECONNREFUSED || tries > 0)
				break;
		}
	}
	if (r >= 0) {
		DEV_STAT_ADD(d, dgram_tx, 1);
		DEV_STAT_ADD(d, dgram_tx_bytes, h->len);
		return;
	}
	if (errno == EAGAIN || errno == ENOBUFS) {
		DEV_STAT_ADD(d, dgram_drop_full, 1);
		return;
	}
	/* ECONNREFUSED (nobody bound any more), EACCES, EPERM: nobody to take it. */
	if (e)
		dgram_dest_drop(e);
	else if (peer)
		dgram_peer_sock_drop(d, peer);
no_listener:
	DEV_STAT_ADD(d, dgram_drop_no_listener, 1);
}

enum dev_tx_verdict dev_dgram_tx(struct vsock_dev *d, const struct vsock_hdr *h, struct iovec *iov,
				 unsigned n)
{
	struct iovec *piov = iov + n;
	struct sib_port *t;
	int pn, r;

	if (!dev_dgram_negotiated(d)) {
		/* Never an RST: a peer could not match it to anything (docs/vsock-protocol.md). */
		DEV_STAT_ADD(d, dgram_drop_not_negotiated, 1);
		return DEV_TX_DROP;
	}
	if (h->op != VSOCK_OP_RW) {
		DEV_STAT_ADD(d, dgram_drop_malformed, 1);
		return DEV_TX_DROP;
	}
	if (h->len > d->dgram.max) {
		DEV_STAT_ADD(d, dgram_drop_oversize, 1);
		return DEV_TX_DROP;
	}
	if (h->dst_cid == VMADDR_CID_HOST) {
		/* The payload slice goes after the chain's own entries in the same row. */
		pn = iov_slice(iov, n, VSOCK_HDR_SIZE, h->len, piov, DEV_TX_IOV_MAX / 2);
		if (pn < 0) {
			DEV_STAT_ADD(d, tx_bad_chain, 1);
			return DEV_TX_DROP;
		}
		OPS_TAP(&d->tap, h, piov, pn);
		dgram_to_host(d, h, piov, pn);
		return DEV_TX_DROP; /* done with the chain: no engine packet */
	}
	t = dev_sib_lookup(d, h->dst_cid);
	if (!t) {
		DEV_STAT_ADD(d, tx_bad_dst_cid, 1);
		return DEV_TX_DROP;
	}
	r = dev_sib_send_dgram(d, t, h, iov, n);
	if (r == 0) {
		DEV_STAT_ADD(d, dgram_tx, 1);
		DEV_STAT_ADD(d, dgram_tx_bytes, h->len);
		return DEV_TX_SIBLING_SENT;
	}
	if (r == -EPROTONOSUPPORT)
		DEV_STAT_ADD(d, dgram_drop_not_negotiated, 1);
	else if (r == -EPIPE)
		DEV_STAT_ADD(d, dgram_drop_no_listener, 1);
	else
		DEV_STAT_ADD(d, dgram_drop_full, 1);
	return DEV_TX_DROP;
}

bool dev_dgram_rx_ok(struct vsock_dev *d, const struct vsock_hdr *h, size_t room)
{
	if (!dev_dgram_negotiated(d)) {
		DEV_STAT_ADD(d, dgram_drop_not_negotiated, 1);
		return false;
	}
	if (h->len > room) {
		DEV_STAT_ADD(d, dgram_drop_oversize, 1);
		return false;
	}
	DEV_STAT_ADD(d, dgram_rx, 1);
	DEV_STAT_ADD(d, dgram_rx_bytes, h->len);
	return true;
}

int dev_dgram_open(struct vsock_dev *d, const struct vsock_dev_config *cfg)
{
	int r;

	d->dgram.l.fd = -1;
	d->dgram.off = cfg->no_dgram;
	d->dgram.max = cfg->dgram_max && cfg->dgram_max < DEV_DGRAM_MAX ? cfg->dgram_max
									 : DEV_DGRAM_MAX;
	d->dgram.next_port = DEV_HOST_PORT_LO - 1;
	if (d->dgram.off)
		return 0;
	d->dgram.rlen = d->dgram.max + DGRAM_LINE_MAX + 1;
	d->dgram.peers = calloc(DEV_DGRAM_PEERS, sizeof(*d->dgram.peers));
	d->dgram.rbuf = malloc(DEV_DGRAM_MMSG * d->dgram.rlen);
	if (!d->dgram.peers || !d->dgram.rbuf)
		return -ENOMEM;
	if ((size_t)snprintf(d->dgram.path, sizeof(d->dgram.path), "%s.dgram", d->uds_path) >=
	    sizeof(d->dgram.path))
		return -ENAMETOOLONG;
	if (d->frozen)
		return 0; /* a device to restore into: the socket comes from the record */
	r = uds_listen(d->dgram.path, SOCK_DGRAM, 0, 0, &d->dgram.l);
	if (r < 0) {
		dev_up.listen_error(d, d->dgram.path, r);
		return r;
	}
	if (d->dgram.l.flags & UDS_REPLACED_STALE)
		log_info("%s: replaced the stale socket file %s", d->name, d->dgram.path);
	/* Each sender's credentials come with its datagrams (dgram_port_owned). */
	if (setsockopt(d->dgram.l.fd, SOL_SOCKET, SO_PASSCRED, &(int){ 1 }, sizeof(int)) < 0)
		return -errno;
	return loop_watch_add(d->loop, d->dgram.l.fd, EPOLLIN, dgram_read_cb, d, &d->dgram.w);
}

void dev_dgram_close(struct vsock_dev *d)
{
	free(d->dgram.rbuf);
	d->dgram.rbuf = NULL;
	if (!d->dgram.peers)
		return;
	loop_watch_del(d->dgram.w);
	d->dgram.w = NULL;
	if (d->dgram.l.fd >= 0) {
		if (!d->handed_over)
			uds_unlink_owned(d->dgram.path, &d->dgram.l);
		close(d->dgram.l.fd);
		d->dgram.l.fd = -1;
	}
	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++)
		dgram_dest_drop(&d->dgram.dests[i]);
	for (unsigned i = 0; i < d->dgram.n_peers; i++)
		dgram_peer_sock_drop(d, &d->dgram.peers[i]);
	free(d->dgram.peers);
	d->dgram.peers = NULL;
	d->dgram.n_peers = 0;
}

/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

enum { G_SOCK = 1, G_DEV, G_INO, G_FLAGS, G_PEERS, G_NEXT_PORT, G_TICK, G_DESTS };
enum { G_PEER = 0x21, G_DEST = 0x22 };
enum { GP_ADDR = 1, GP_PORT, GP_USED };
enum { GD_PORT = 1, GD_FD, GD_DEV, GD_INO, GD_USED };

void dev_dgram_freeze(struct vsock_dev *d)
{
	loop_watch_del(d->dgram.w);
	d->dgram.w = NULL;
	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++) {
		loop_watch_del(d->dgram.dests[i].w);
		d->dgram.dests[i].w = NULL;
	}
}

int dev_dgram_thaw(struct vsock_dev *d)
{
	int r;

	if (d->dgram.l.fd >= 0 && !d->dgram.w) {
		r = loop_watch_add(d->loop, d->dgram.l.fd, EPOLLIN, dgram_read_cb, d, &d->dgram.w);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++) {
		struct dgram_dest *e = &d->dgram.dests[i];

		if (!e->live || e->w)
			continue;
		r = loop_watch_add(d->loop, e->sfd, EPOLLIN, dgram_read_cb, d, &e->w);
		if (r < 0)
			return r;
	}
	return 0;
}

void dev_dgram_save(struct vsock_dev *d, struct rec_writer *w)
{
	if (d->dgram.off || d->dgram.l.fd < 0)
		return;
	rec_put_fd(w, G_SOCK, d->dgram.l.fd);
	rec_put_u64(w, G_DEV, (uint64_t)d->dgram.l.dev);
	rec_put_u64(w, G_INO, (uint64_t)d->dgram.l.ino);
	rec_put_u32(w, G_FLAGS, d->dgram.l.flags & UDS_INHERITED);
	rec_put_u32(w, G_NEXT_PORT, d->dgram.next_port);
	rec_put_u64(w, G_TICK, d->dgram.tick);
	rec_begin(w, G_PEERS);
	for (unsigned i = 0; i < d->dgram.n_peers; i++) {
		const struct dgram_peer *p = &d->dgram.peers[i];

		rec_begin(w, G_PEER);
		rec_put_bytes(w, GP_ADDR, &p->sa, p->salen);
		rec_put_u32(w, GP_PORT, p->port);
		rec_put_u64(w, GP_USED, p->used);
		rec_end(w);
	}
	rec_end(w);
	rec_begin(w, G_DESTS);
	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++) {
		const struct dgram_dest *e = &d->dgram.dests[i];

		if (!e->live)
			continue;
		rec_begin(w, G_DEST);
		rec_put_u32(w, GD_PORT, e->port);
		rec_put_fd(w, GD_FD, e->sfd);
		rec_put_u64(w, GD_DEV, (uint64_t)e->dev);
		rec_put_u64(w, GD_INO, (uint64_t)e->ino);
		rec_put_u64(w, GD_USED, e->used);
		rec_end(w);
	}
	rec_end(w);
}

static const struct rec_field dgram_fields[] = {
	{ G_SOCK, REC_FD, false, "datagram socket" },
	{ G_DEV, REC_U64, false, "dev" },
	{ G_INO, REC_U64, false, "ino" },
	{ G_FLAGS, REC_U32, false, "flags" },
	{ G_PEERS, REC_LIST, false, "senders" },
	{ G_NEXT_PORT, REC_U32, false, "next port" },
	{ G_TICK, REC_U64, false, "tick" },
	{ G_DESTS, REC_LIST, false, "destinations" },
};
static const struct rec_field peer_fields[] = {
	{ GP_ADDR, REC_BYTES, true, "address" },
	{ GP_PORT, REC_U32, true, "port" },
	{ GP_USED, REC_U64, true, "used" },
};
static const struct rec_field dest_fields[] = {
	{ GD_PORT, REC_U32, true, "port" },
	{ GD_FD, REC_FD, true, "fd" },
	{ GD_DEV, REC_U64, true, "dev" },
	{ GD_INO, REC_U64, true, "ino" },
	{ GD_USED, REC_U64, true, "used" },
};

/* Undoes a partial dev_dgram_restore: the datagram side as dev_dgram_open(restore) left it. */
void dev_dgram_restore_undo(struct vsock_dev *d)
{
	if (d->dgram.l.fd >= 0)
		close(d->dgram.l.fd);
	d->dgram.l.fd = -1;
	for (unsigned i = 0; i < DEV_DGRAM_DESTS; i++)
		dgram_dest_drop(&d->dgram.dests[i]);
	d->dgram.n_peers = 0;
	d->dgram.next_port = DEV_HOST_PORT_LO - 1;
	d->dgram.tick = 0;
}

static int dgram_restore_lists(struct vsock_dev *d, struct rec_reader *r, const struct rec_val *v)
{
	struct rec_reader sub;
	struct rec_item it;
	unsigned nd = 0;
	int e;

	if (v[4].present) {
		e = rec_enter(r, &v[4].it, "datagram senders", &sub);
		while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
			struct rec_val pv[ARRAY_SIZE(peer_fields)];
			struct rec_reader ps;
			struct dgram_peer *p;

			if (it.tag != G_PEER || d->dgram.n_peers >= DEV_DGRAM_PEERS)
				return rec_fail(r->doc, -EBADMSG, "datagram senders: item "
						"%u at %zu (tag or count)", it.tag, it.off);
			e = rec_enter(&sub, &it, "datagram sender", &ps);
			if (e == 0)
				e = rec_scan(&ps, peer_fields, ARRAY_SIZE(peer_fields), pv);
			if (e < 0)
				return e;
			if (pv[0].it.len < offsetof(struct sockaddr_un, sun_path) ||
			    pv[0].it.len > sizeof(struct sockaddr_un) ||
			    pv[1].u < DEV_HOST_PORT_LO || pv[1].u >= DEV_HOST_PORT_HI ||
			    dgram_peer_by_port(d, (uint32_t)pv[1].u) || pv[2].u > v[6].u)
				return rec_fail(r->doc, -EBADMSG, "datagram sender at %zu: "
						"address, port or use out of range", it.off);
			p = &d->dgram.peers[d->dgram.n_peers++];
			memset(p, 0, sizeof(*p));
			p->sfd = -1; /* its own sending socket is opened again on its first reply */
			memcpy(&p->sa, pv[0].it.val, pv[0].it.len);
			p->salen = (socklen_t)pv[0].it.len;
			p->port = (uint32_t)pv[1].u;
			p->used = pv[2].u;
		}
		if (e < 0)
			return e;
	}
	if (!v[7].present)
		return 0;
	e = rec_enter(r, &v[7].it, "datagram destinations", &sub);
	while (e == 0 && (e = rec_next(&sub, &it)) > 0) {
		struct rec_val dv[ARRAY_SIZE(dest_fields)];
		struct rec_reader ds;
		struct dgram_dest *slot;
		int fd;

		if (it.tag != G_DEST || nd >= DEV_DGRAM_DESTS)
			return rec_fail(r->doc, -EBADMSG, "datagram destinations: item %u at "
					"%zu (tag or count)", it.tag, it.off);
		e = rec_enter(&sub, &it, "datagram destination", &ds);
		if (e == 0)
			e = rec_scan(&ds, dest_fields, ARRAY_SIZE(dest_fields), dv);
		if (e < 0)
			return e;
		for (unsigned i = 0; i < nd; i++)
			if (d->dgram.dests[i].port == dv[0].u)
				return rec_fail(r->doc, -EBADMSG, "datagram destination "
						"port %llu twice", (unsigned long long)dv[0].u);
		if (dv[4].u > v[6].u)
			return rec_fail(r->doc, -EBADMSG, "datagram destination at %zu: "
					"used after the tick", it.off);
		e = dev_rec_sock_fd(r, (int)dv[1].u, SOCK_DGRAM, false, &fd);
		if (e < 0)
			return e;
		slot = &d->dgram.dests[nd++];
		/* checked_ms 0: the path is looked at again on the first send. */
		*slot = (struct dgram_dest){ .live = true, .port = (uint32_t)dv[0].u, .sfd = fd,
					     .dev = (dev_t)dv[2].u, .ino = (ino_t)dv[3].u,
					     .used = dv[4].u };
	}
	return e;
}

int dev_dgram_restore(struct vsock_dev *d, struct rec_reader *r)
{
	struct rec_val v[ARRAY_SIZE(dgram_fields)];
	int e, fd;

	e = rec_scan(r, dgram_fields, ARRAY_SIZE(dgram_fields), v);
	if (e < 0)
		return e;
	if (!v[0].present) {
		for (unsigned i = 1; i < ARRAY_SIZE(v); i++)
			if (v[i].present)
				return rec_fail(r->doc, -EBADMSG, "datagram %s without the "
						"datagram socket", dgram_fields[i].name);
		return 0;
	}
	if (d->dgram.off)
		return rec_fail(r->doc, -EBADMSG, "a datagram socket for %s, configured "
				"without datagrams", d->name);
	if (!v[1].present || !v[2].present || !v[3].present || !v[5].present || !v[6].present ||
	    (v[3].u & ~(uint64_t)UDS_INHERITED) ||
	    (v[5].u != DEV_HOST_PORT_LO - 1 &&
	     (v[5].u < DEV_HOST_PORT_LO || v[5].u >= DEV_HOST_PORT_HI)))
		return rec_fail(r->doc, -EBADMSG, "datagram socket: a field missing or "
				"out of range");
	e = dev_rec_sock_fd(r, (int)v[0].u, SOCK_DGRAM, false, &fd);
	if (e < 0)
		return e;
	d->dgram.l = (struct uds_listener){ .fd = fd, .dev = (dev_t)v[1].u, .ino = (ino_t)v[2].u,
					    .flags = (unsigned)v[3].u };
	d->dgram.next_port = (uint32_t)v[5].u;
	d->dgram.tick = v[6].u;
	e = dgram_restore_lists(d, r, v);
	if (e < 0) {
		dev_dgram_restore_undo(d);
		return e;
	}
	return 0;
}
