/* SPDX-License-Identifier: MIT */
/*
 * The vsock protocol engine, sans-I/O: the part Linux calls virtio_transport_common.c plus the
 * socket-level semantics of af_vsock.c. It never touches a file descriptor or a ring. Implemented
 * by engine.c (packets, states, credit, pull, timers), sock.c (the vsock_sock_* calls), rxq.c
 * (the receive queue) and dgram.c (datagram sockets, "Datagrams" below).
 *
 *   packets in:   vsock_engine_feed() / vsock_engine_feed_batch()  (always consume the packet;
 *                 with ops->deliver an RW payload may be taken in place instead of queued)
 *   packets out:  vsock_engine_pull()  (only when the caller has room; -EAGAIN when nothing);
 *                 vsock_sock_tx_reserve() / _commit() for an RW packet the caller fills itself
 *   time:         ops->now() supplies monotonic ns; vsock_engine_run_timers() fires what is due,
 *                 vsock_engine_next_deadline() says when to call it next
 *   sockets:      vsock_sock_*(): non-blocking socket calls, Linux AF_VSOCK semantics and errno;
 *                 blocking is built on top of them by the API layer (src/lib)
 *
 * One engine is one CID's socket namespace: the device role has one per VM (local CID 2, the
 * host side), the guest role one per guest (local CID = guest CID), the loopback transport one with
 * CID 1 whose pulled packets are fed straight back.
 *
 * Threads. Every function here may be called from any thread. Each socket has one lock; the
 * connection table uses per-bucket locks and socket reference counts, so lookups on the data path
 * take no engine-wide lock. Pulling takes a short engine-wide lock on the send list only.
 * Datagram sends (vsock_dgram_send) take no lock at all once the socket is bound.
 * Callbacks in ops are invoked with no engine lock held, except sock_event, which is called with
 * that socket's lock held and must not call back into the engine (wake a waiter, set a flag,
 * write an eventfd: nothing more).
 *
 * Security model: every fed packet is untrusted. Headers are checked (vsock_hdr_check), counted by
 * reason when rejected, and answered as the spec says (RST, or drop). Nothing a peer sends can make
 * the engine allocate without bound: received bytes are bounded by the buf_alloc we advertised
 * (credit; a peer that exceeds it gets its connection reset), receive memory including per-chunk
 * overhead is bounded by a small constant times buf_alloc, pending control replies are bounded by
 * reply_limit, and connections by max_socks.
 */
#ifndef UVSOCK_VSOCK_ENGINE_H
#define UVSOCK_VSOCK_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "vsock/hdr.h"

struct vsock_engine;
struct vsock_sock;

/* Poll mask returned by vsock_sock_poll() and passed to ops->sock_event (values as poll.h). */
#define VSOCK_POLLIN 0x001u     /* readable: data, EOF, a message, or a pending accept */
#define VSOCK_POLLOUT 0x004u    /* writable: connected and peer credit available */
#define VSOCK_POLLERR 0x008u    /* an error is pending (vsock_sock_take_error) */
#define VSOCK_POLLHUP 0x010u    /* both directions shut down / closed */
#define VSOCK_POLLRDHUP 0x2000u /* peer will send no more */

/* Flags for send and recv (values as Linux's socket.h, so the API layer passes them through). */
#define VSOCK_MSG_PEEK 0x02
#define VSOCK_MSG_TRUNC 0x20
#define VSOCK_MSG_DONTWAIT 0x40
#define VSOCK_MSG_EOR 0x80
#define VSOCK_MSG_WAITALL 0x100
#define VSOCK_MSG_NOSIGNAL 0x4000

enum vsock_state {
	VSOCK_SS_FREE = 0,    /* created, not connected (TCP_CLOSE before connect) */
	VSOCK_SS_LISTEN,
	VSOCK_SS_CONNECTING,  /* REQUEST sent, waiting for RESPONSE (SYN_SENT) */
	VSOCK_SS_PENDING,     /* REQUEST received on a deferred listener, not yet accepted/rejected */
	VSOCK_SS_CONNECTED,   /* ESTABLISHED */
	VSOCK_SS_CLOSING,     /* close() called, waiting for the peer's RST (8 s linger) */
	VSOCK_SS_CLOSED,      /* done: reset, refused, timed out or fully closed */
	_VSOCK_SS_MAX,
};
const char *vsock_state_to_string(enum vsock_state s);

struct vsock_engine_ops {
	/* Monotonic time in ns. Required. */
	uint64_t (*now)(void *opaque);
	/*
	 * The engine has a packet to pull (the send list went from empty to non-empty), or a timer
	 * deadline moved earlier. The transport should call vsock_engine_pull() /
	 * vsock_engine_run_timers() soon. Optional.
	 */
	void (*tx_ready)(void *opaque);
	/*
	 * A socket's poll mask may have changed (readable, writable, connected, reset, new child to
	 * accept...). Called with that socket's lock held; see the threads rule above. `user` is the
	 * value set with vsock_sock_set_user(). Optional.
	 */
	void (*sock_event)(void *opaque, struct vsock_sock *s, void *user, unsigned mask);
	/*
	 * Deliver in place, the receive half of a forwarding transport's zero-copy path (the device
	 * role hands guest bytes to a host Unix socket straight from the guest's TX buffers;
	 * docs/performance.md, "uvsockd's host path"). An RW payload for a CONNECTED STREAM socket
	 * that has nothing queued is offered here first, after the credit check: the callback
	 * passes on what it can of the len bytes in iov (non-blocking) and returns how many it took
	 * (0..len). Those count as read at once (fwd_cnt, the credit-update rule); only the rest is
	 * queued, and later payloads queue behind it (never reordered), bounded by buf_alloc as
	 * always. iov is borrowed for the call. Called with that socket's lock held, like
	 * sock_event: it must not call into the engine. Optional: NULL queues every payload.
	 */
	size_t (*deliver)(void *opaque, struct vsock_sock *s, void *user, const struct iovec *iov,
			  int iovcnt, size_t len);
	/*
	 * A STREAM RW packet of len payload bytes from what send() queued left through
	 * vsock_engine_pull(); end is s's tx_cnt after it. Where the engine cuts the queued bytes
	 * into packets is known only here: for a transport that paces its sends by the size of the
	 * packets its peer holds (the device role's host -> guest budget on its copying path,
	 * src/device/h2g_budget.h). Called with s's lock held, like sock_event: it must not call
	 * into the engine. Optional.
	 */
	void (*tx_sent)(void *opaque, struct vsock_sock *s, void *user, uint32_t len,
			uint32_t end);
};

struct vsock_engine_config {
	uint32_t local_cid;            /* our CID as the peer sees it */
	uint32_t buf_size;             /* default SO_VM_SOCKETS_BUFFER_SIZE, 256 KiB */
	uint32_t buf_min;              /* default SO_VM_SOCKETS_BUFFER_MIN_SIZE, 128 */
	uint32_t buf_max;              /* default SO_VM_SOCKETS_BUFFER_MAX_SIZE, 256 KiB */
	uint32_t max_pkt;              /* largest RW payload we send, <= 64 KiB */
	uint64_t connect_timeout_ns;   /* default 2 s */
	uint64_t close_timeout_ns;     /* default 8 s (VSOCK_CLOSE_TIMEOUT) */
	uint32_t max_socks;            /* cap on live sockets of this engine (children included) */
	uint32_t reply_limit;          /* cap on queued control replies (vhost: TX ring size) */
	uint32_t port_lo, port_hi;     /* auto-bind range, inclusive; 0/0 = Linux ([1024, 2^32-2]) */
	bool seqpacket;                /* the peer may use SEQPACKET (feature bit negotiated) */
	bool dgram;                    /* VIRTIO_VSOCK_F_DGRAM negotiated: datagrams allowed */
	uint32_t dgram_max;            /* largest datagram payload; 0 = VSOCK_DGRAM_MAX */
	/*
	 * STREAM bytes in flight bounded by the peer's buf_alloc alone, what send() queues by
	 * ours: for a forwarding transport whose bytes in flight sit in the peer's memory, not in
	 * its own (the device role; docs/vsock-protocol.md §3, "The device role's window").
	 * Off (Linux since CVE-2026-23086): both bounded by min(peer buf_alloc, own buf_alloc).
	 */
	bool tx_window_peer;
	const struct vsock_engine_ops *ops;
	void *opaque;                  /* passed to every ops callback */
};

/* Fills *cfg with the Linux defaults listed above (ops and opaque left NULL). */
void vsock_engine_config_default(struct vsock_engine_config *cfg);

/*
 * Creates an engine. Borrows cfg->ops (must outlive the engine).
 * Returns 0, -EINVAL (bad config), -ENOMEM.
 */
int vsock_engine_new(const struct vsock_engine_config *cfg, struct vsock_engine **ret);
/* Frees the engine and every socket still in it, without sending anything. Safe on NULL. */
void vsock_engine_free(struct vsock_engine *e);

/*
 * Feeds one received packet. `h` is the decoded header; the payload is `iov`/`iovcnt` holding
 * exactly h->len bytes (the payload may be split anywhere). The engine copies what it keeps;
 * it borrows iov only for the call. Always consumes the packet: replies (RST, RESPONSE,
 * CREDIT_UPDATE) are queued for pull. Returns 0 when the packet was delivered, or a negative
 * errno saying why it was dropped; callers need not act on it, the engine has counted it:
 * -EPROTO malformed (stats.rx_dropped), -ECONNRESET answered with an RST (no socket, type
 * mismatch, refused), -ENOTCONN an RST for no socket (not answered), -ECONNREFUSED backlog full,
 * -EINVAL op not valid in the socket's state (ignored), -EPROTO unexpected op while connecting
 * (connection reset), -ENOBUFS credit violation or receive memory bound (connection reset),
 * -ENOMEM, -EMFILE.
 */
int vsock_engine_feed(struct vsock_engine *e, const struct vsock_hdr *h, const struct iovec *iov,
		      int iovcnt);

struct vsock_pkt_ref {
	struct vsock_hdr hdr;
	const struct iovec *iov;
	int iovcnt;
};
/*
 * Feeds n packets as one batch (docs/vsock-protocol.md §2.1; the idea of the Linux series "vsock:
 * reduce RX per-packet socket overhead"): one table lookup and one socket-lock hold per run of
 * consecutive packets of the same flow; write-space events are coalesced and readable events are
 * delivered once per socket at the end of the batch. Same semantics as n calls to feed.
 */
void vsock_engine_feed_batch(struct vsock_engine *e, const struct vsock_pkt_ref *pkts, size_t n);

/*
 * True while the number of queued control replies is below reply_limit. A transport stops
 * taking packets from its peer (e.g. stops draining a TX ring) while this is false, and resumes
 * after pulling: the spec's rule to keep processing with bounded side storage (virtio 1.2
 * §5.10.6.1 "Virtqueue Flow Control"), which Linux implements by counting queued replies
 * (drivers/vhost/vsock.c, vhost_vsock_more_replies(); docs/vsock-protocol.md §5).
 */
bool vsock_engine_can_feed(const struct vsock_engine *e);

/*
 * Produces the next outgoing packet, if any: fills *h and writes the payload (h->len bytes, at
 * most `max_payload`, never more than the peer's credit) into iov. Sockets with something to send
 * are served round-robin; within one socket replies go first in a fixed order (RST, RESPONSE,
 * REQUEST, SHUTDOWN, RW), a bare CREDIT_UPDATE only when nothing else is pending (every packet
 * carries our credit). A SHUTDOWN with the SEND flag is held back until the data queued before
 * it has been pulled. No-socket RSTs go before everything. Returns 0 for them (no payload).
 * For SEQPACKET, a message larger than max_payload goes out as several RW packets with EOM (and
 * EOR) on the last one only.
 * Returns the payload length (>= 0) or -EAGAIN when nothing is pending.
 */
ssize_t vsock_engine_pull(struct vsock_engine *e, struct vsock_hdr *h, const struct iovec *iov,
			  int iovcnt, size_t max_payload);

/* True if vsock_engine_pull() would return a packet now. */
bool vsock_engine_has_pending(struct vsock_engine *e);

/* Fires due timers (connect timeout, close linger). Call when next_deadline has passed. */
void vsock_engine_run_timers(struct vsock_engine *e);
/* Earliest pending timer deadline in ops->now() ns, or UINT64_MAX if none. */
uint64_t vsock_engine_next_deadline(struct vsock_engine *e);

/*
 * The transport was reset (guest role: the TRANSPORT_RESET event of the event queue, handled by
 * Linux in net/vmw_vsock/virtio_transport.c, virtio_vsock_event_handle(); device role: the
 * VMM went away). Every connected or connecting socket becomes CLOSED with error ECONNRESET and
 * no RST is sent, and so does one the peer closed that the application still holds (as Linux's
 * virtio_vsock_reset_sock() on every socket in vsock_connected_table); listeners survive.
 * new_cid (if not VMADDR_CID_ANY) becomes the local CID.
 */
void vsock_engine_transport_reset(struct vsock_engine *e, uint32_t new_cid);

uint32_t vsock_engine_local_cid(const struct vsock_engine *e);

/*
 * The engine's counters but rx_dropped[], one X(name) each, so that code can declare, copy or
 * print them all from one list (struct vsock_engine_stats below, the engine's own atomic copy,
 * vsock_engine_get_stats). Each is monotonic except socks_open.
 */
#define VSOCK_ENGINE_STATS(X)                                                                      \
	X(rx_pkts)              /* packets fed */                                                  \
	X(rx_bytes)             /* payload bytes delivered */                                      \
	X(tx_pkts)              /* packets pulled */                                               \
	X(tx_bytes)             /* payload bytes pulled */                                         \
	X(rx_no_socket)         /* no matching socket: answered with RST */                        \
	X(rx_type_mismatch)     /* socket type differs: RST */                                     \
	X(rx_unexpected)        /* op not valid in the socket's state */                           \
	X(rst_sent)                                                                                \
	X(rst_received)                                                                            \
	X(credit_violations)    /* peer sent beyond our credit: reset */                           \
	X(rx_mem_resets)        /* receive memory bound hit (tiny-packet flood): reset */          \
	X(credit_stalls)        /* a send found zero peer credit */                                \
	X(credit_updates_sent)                                                                     \
	X(credit_requests_sent)                                                                    \
	X(backlog_refused)      /* REQUEST refused: accept queue full or listener gone */          \
	X(socks_open)           /* live sockets now */                                             \
	X(socks_total)          /* sockets ever created */                                         \
	X(connects_timed_out)                                                                      \
	X(close_timeouts)                                                                          \
	X(rst_dropped)          /* no-socket RST not queued: reply ring full */                    \
	X(dgram_tx)             /* datagrams pulled */                                             \
	X(dgram_tx_bytes)                                                                          \
	X(dgram_rx)             /* datagrams delivered to a socket's receive queue */              \
	X(dgram_rx_bytes)                                                                          \
	X(dgram_drop_no_listener) /* fed datagram: no socket bound to its port */                  \
	X(dgram_drop_full)      /* fed datagram: receiver's SO_RCVBUF limit reached */             \
	X(dgram_drop_oversize)  /* fed over dgram_max, or pulled over max_payload */               \
	X(dgram_drop_not_negotiated) /* fed datagram while dgram is off */

/* Counters. Read with vsock_engine_get_stats (a consistent-enough snapshot). */
struct vsock_engine_stats {
#define VSOCK_ENGINE_STAT_FIELD_(name) uint64_t name;
	VSOCK_ENGINE_STATS(VSOCK_ENGINE_STAT_FIELD_)
#undef VSOCK_ENGINE_STAT_FIELD_
	uint64_t rx_dropped[_VSOCK_HDR_ERROR_MAX]; /* malformed, by vsock_hdr_error */
};
void vsock_engine_get_stats(struct vsock_engine *e, struct vsock_engine_stats *ret);

/* ---- Sockets ---------------------------------------------------------------------------- */

/*
 * Creates a socket of `type` (VSOCK_TYPE_STREAM, VSOCK_TYPE_SEQPACKET, or VSOCK_TYPE_DGRAM: see
 * "Datagrams" below). The caller holds one reference, released by vsock_sock_close().
 * Returns 0, -ESOCKTNOSUPPORT (other type), -ENODEV (DGRAM, not negotiated), -EMFILE (max_socks
 * reached), -ENOMEM. listen and connect of a DGRAM socket return -EOPNOTSUPP.
 * (SEQPACKET without the negotiated feature fails later, at connect/listen, as on Linux.)
 */
int vsock_sock_new(struct vsock_engine *e, enum vsock_type type, struct vsock_sock **ret);

/* Opaque pointer handed back in ops->sock_event. */
void vsock_sock_set_user(struct vsock_sock *s, void *user);
void *vsock_sock_get_user(const struct vsock_sock *s);

/*
 * bind(2). cid: VMADDR_CID_ANY or the local CID; port: VMADDR_PORT_ANY for auto-assignment.
 * Returns 0, -EINVAL (already bound), -EADDRNOTAVAIL (foreign CID, or no free port after 24
 * tries), -EADDRINUSE, -EACCES (port <= 1023 and !privileged: the engine is always privileged;
 * the API layer decides).
 */
int vsock_sock_bind(struct vsock_sock *s, uint32_t cid, uint32_t port);

/*
 * listen(2). Auto-binds if unbound. backlog is clamped to [0, 4096]; REQUESTs beyond backlog+1
 * pending children get an RST.
 * Returns 0, -EINVAL (connected or connecting), -EPROTONOSUPPORT (SEQPACKET not negotiated).
 */
int vsock_sock_listen(struct vsock_sock *s, int backlog);

/*
 * Makes a listener "deferred": REQUESTs create children in VSOCK_SS_PENDING without answering;
 * the owner confirms each with vsock_sock_accept_pending() (RESPONSE) or rejects it with
 * vsock_sock_reject() (RST). Used by the device role, which must first connect the host socket.
 * With `wildcard`, the listener also receives REQUESTs for every local port that has no
 * listener of its own.
 */
int vsock_sock_listen_deferred(struct vsock_sock *s, int backlog, bool wildcard);
int vsock_sock_accept_pending(struct vsock_sock *child);
void vsock_sock_reject(struct vsock_sock *child);

/*
 * accept(2), non-blocking. On success *ret is a new socket reference owned by the caller.
 * The child is normally CONNECTED (it may already be CLOSED if the peer reset it while queued);
 * from a deferred listener it is PENDING until vsock_sock_accept_pending()/vsock_sock_reject().
 * Returns 0, -EAGAIN (none pending), -EINVAL (not listening).
 */
int vsock_sock_accept(struct vsock_sock *s, struct vsock_sock **ret);

/*
 * connect(2), non-blocking: sends REQUEST, returns -EINPROGRESS. Completion is signalled through
 * sock_event; then vsock_sock_take_error() gives 0 or the error (ECONNRESET refused, ETIMEDOUT,
 * ENETUNREACH...). Auto-binds. Returns -EINPROGRESS, -EISCONN, -EALREADY, -EINVAL (listening),
 * -ENETUNREACH (CID not reachable), -EPROTONOSUPPORT (SEQPACKET not negotiated), -EADDRNOTAVAIL.
 */
int vsock_sock_connect(struct vsock_sock *s, uint32_t cid, uint32_t port);

/*
 * send(2), non-blocking. STREAM: copies as much as peer credit allows and returns the count, or
 * -EAGAIN if none. SEQPACKET: all or nothing: -EMSGSIZE if the message exceeds the maximum
 * message size (min(peer buf_alloc, our buf_alloc)), -EAGAIN if credit is short now.
 * flags: VSOCK_MSG_EOR (SEQPACKET). Returns -ENOTCONN, -EPIPE (shut down for sending, peer
 * receive-shutdown, or reset).
 */
ssize_t vsock_sock_send(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags);

/*
 * recv(2), non-blocking. STREAM: up to the iov size, whatever is queued (-EAGAIN only when
 * nothing is; rcvlowat is the blocking caller's target, as in Linux), MSG_PEEK; MSG_WAITALL and
 * the rcvlowat wait are the caller's loop. After a reset by the peer (RST),
 * queued data is still returned, then 0 (EOF, as Linux). SEQPACKET: one whole message (MSG_PEEK
 * supported);
 * *ret_msg_flags gets MSG_TRUNC if it was longer than iov and MSG_EOR if the sender set EOR; with
 * MSG_TRUNC in flags the full length is returned. Returns bytes, 0 at EOF, -EAGAIN, -ENOTCONN,
 * -EINVAL (listening). ret_msg_flags may be NULL.
 */
ssize_t vsock_sock_recv(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags,
			int *ret_msg_flags);

/*
 * Zero-copy receive for transports that forward bytes (device role → host Unix socket): fills
 * up to iovcnt iovecs pointing at queued STREAM bytes without consuming them; returns the number
 * of bytes described. vsock_sock_rx_consume() then consumes n of them (moves fwd_cnt, may queue a
 * credit update). Both take the socket lock; the iovecs stay valid until the next call on s or
 * the next packet fed for s (receive-queue compaction may move bytes), so use them from the
 * thread that feeds the engine.
 */
ssize_t vsock_sock_rx_peek_iov(struct vsock_sock *s, struct iovec *iov, int iovcnt);
void vsock_sock_rx_consume(struct vsock_sock *s, size_t n);

/* Bytes that vsock_sock_send() would accept now (peer credit), for STREAM. */
size_t vsock_sock_send_space(struct vsock_sock *s);

/*
 * Zero-copy send for transports that forward bytes (device role: host Unix socket -> guest RX
 * buffer, read straight into the buffer's payload area). vsock_sock_tx_reserve() says how many
 * payload bytes s may send now: at most max and the peer's credit. It returns 0 when there is
 * no credit (as send() would block), -EAGAIN when other packets of s must go first (control
 * packets, bytes queued by send(): pull them, then ask again), -EPIPE (shut down for sending,
 * or the peer shut down receiving), -ENOTCONN, -EOPNOTSUPP (SEQPACKET). The caller then puts up
 * to that many bytes into one or more RW packets of at most max_pkt bytes each and calls
 * vsock_sock_tx_commit() for each, in order, with the count n it put there: the engine accounts
 * them (tx_cnt, counters, a pending credit update is answered) and fills *h, the complete RW
 * header carrying our current credit (fwd_cnt, buf_alloc). Returns 0, or the errors of reserve
 * (and -EINVAL for n beyond the credit or max_pkt) if s changed in between; the caller then
 * drops the bytes and must end the connection. Nothing
 * is queued inside the engine on this path; both calls take the socket lock, and reserve and
 * commit must come from the one thread that feeds the engine (nothing may change s in between).
 */
ssize_t vsock_sock_tx_reserve(struct vsock_sock *s, size_t max);
int vsock_sock_tx_commit(struct vsock_sock *s, size_t n, struct vsock_hdr *h);

/*
 * Queues a CREDIT_REQUEST to the peer (docs/vsock-protocol.md §3: Linux never sends one, but
 * answers it, virtio_transport_recv_connected()).
 * For a transport that found zero credit and wants a fresh CREDIT_UPDATE instead of waiting.
 * Returns 0, -ENOTCONN.
 */
int vsock_sock_request_credit(struct vsock_sock *s);

/*
 * shutdown(2): how = VSOCK_SHUTDOWN_RCV, _SEND or both. Sends SHUTDOWN (sticky flags).
 * Returns 0, -ENOTCONN, -EINVAL.
 */
int vsock_sock_shutdown(struct vsock_sock *s, unsigned how);

/*
 * close(2): releases the caller's reference. A connected socket discards unread data, sends
 * SHUTDOWN(3) (after any data still queued for sending) and lingers in CLOSING until the
 * peer's RST or close_timeout (then RST); if the peer already shut both ways, RST at once.
 * A listener closes its queued children (connected ones as above, pending ones with RST).
 * Never fails. Safe on NULL.
 */
void vsock_sock_close(struct vsock_sock *s);

/* Current poll mask (VSOCK_POLL*). */
unsigned vsock_sock_poll(struct vsock_sock *s);
/* SO_ERROR: returns and clears the pending error as a positive errno, 0 if none. */
int vsock_sock_take_error(struct vsock_sock *s);
enum vsock_state vsock_sock_state(struct vsock_sock *s);
enum vsock_type vsock_sock_type(const struct vsock_sock *s);

/* getsockname/getpeername. Returns 0 or -ENOTCONN (peer) / fills VMADDR_*_ANY when unbound. */
int vsock_sock_local_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port);
int vsock_sock_peer_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port);

/* Options (level AF_VSOCK / SOL_SOCKET as Linux). */
enum vsock_sockopt {
	VSOCK_OPT_BUFFER_SIZE,     /* u64; clamped into [min, max]; a change is announced at once */
	VSOCK_OPT_BUFFER_MIN_SIZE, /* u64 */
	VSOCK_OPT_BUFFER_MAX_SIZE, /* u64 */
	VSOCK_OPT_CONNECT_TIMEOUT, /* ns; 0 resets to the default */
	VSOCK_OPT_RCVLOWAT,        /* bytes; 0 becomes 1; STREAM: > buffer size is -EINVAL */
	_VSOCK_OPT_MAX,
};
int vsock_sock_setopt(struct vsock_sock *s, enum vsock_sockopt opt, uint64_t val);
int vsock_sock_getopt(struct vsock_sock *s, enum vsock_sockopt opt, uint64_t *ret);

/* Per-socket snapshot for listings (uvsock-stat) and tests. */
struct vsock_sock_info {
	enum vsock_type type;
	enum vsock_state state;
	uint32_t local_cid, local_port, peer_cid, peer_port;
	uint32_t buf_alloc, fwd_cnt, last_fwd_cnt, rx_bytes, rx_mem;
	uint32_t peer_buf_alloc, peer_fwd_cnt, tx_cnt, tx_queued;
	uint64_t bytes_in, bytes_out;
	unsigned shutdown, peer_shutdown;
};
void vsock_sock_get_info(struct vsock_sock *s, struct vsock_sock_info *ret);
/* Calls fn for every live socket of the engine (listing). fn must not call into the engine. */
void vsock_engine_foreach_sock(struct vsock_engine *e,
			       void (*fn)(void *arg, const struct vsock_sock_info *info), void *arg);

/* ---- State save and restore (save.c; docs/upgrade.md "The engine's part") ------------------ */

struct rec_writer;
struct rec_reader;

/*
 * A socket's id: unique within its engine, never reused by it, and kept by a save and restore.
 * An owner that keeps something beside an engine socket across a restore (the device role: the
 * host Unix socket of each connection) saves the id with it and finds the socket again by it
 * when the restore hands the socket back (vsock_engine_restore's adopt).
 */
uint64_t vsock_sock_id(const struct vsock_sock *s);

/* The engine's part of a state record: its schema version (docs/upgrade.md). */
#define VSOCK_ENGINE_SAVE_SCHEMA 1u

/*
 * Writes the whole state of e as items of the list w is in (the caller opens and closes it):
 * every socket with its state machine, addresses, options, credit counters, pending replies,
 * queued bytes both ways (receive queue with message boundaries, send ring, SEQPACKET message
 * boundaries and pacing), timers as the time left, listeners with their accept queues,
 * datagram sockets with their queues, the RSTs queued for no socket, the port allocators, the
 * socket id counter and the counters. Nothing changes in e.
 *
 * Only at a consistent point: the caller guarantees that no other call on e runs until the
 * save is done (the device role: its own thread, between two passes, nothing popped and not
 * pushed). Payload bytes that a transport has already pulled are the transport's (in the
 * guest's RX ring); bytes it has not fed yet likewise (in the TX ring).
 * Returns 0, -ENOMEM, or the writer's error.
 */
int vsock_engine_save(struct vsock_engine *e, struct rec_writer *w);

/*
 * Recreates the state saved by vsock_engine_save() in e, which must be fresh (no socket, nothing
 * queued; -EBUSY otherwise) and configured as the saved one was (its local CID; datagrams and
 * SEQPACKET allowed if the record uses them). r reads the list the save wrote. The record is
 * checked completely before e is changed in a way anyone can see: on any error e is left as it
 * was (empty), no callback has been called, and r's document says why (rec_error()).
 *
 * On success every socket the application held (created by vsock_sock_new or returned by
 * vsock_sock_accept, not closed) is handed to adopt, once each, with the reference the
 * application had: the owner finds its state by vsock_sock_id(s) and sets its user pointer
 * (vsock_sock_set_user). Sockets in an accept queue are accepted as before; closed sockets that
 * linger finish on their own. Timers restart with the time they had left at the save. Then
 * ops->tx_ready tells the transport whatever is ready to pull. No sock_event reports the
 * restored state: an owner asks each adopted socket once (vsock_sock_poll) after setting it up.
 * Returns 0, -EBUSY, -EINVAL (adopt NULL), -EBADMSG (malformed or inconsistent state: refused),
 * -EMFILE (more sockets than max_socks), -ENOMEM.
 */
int vsock_engine_restore(struct vsock_engine *e, struct rec_reader *r,
			 void (*adopt)(void *arg, struct vsock_sock *s), void *arg);

/*
 * Crash survival (docs/upgrade.md): the engine of a restarted process ends a connection that
 * the dead one had and that it knows only by its addresses (kept outside the process: the
 * systemd fd store, or the --isolate supervisor), so that the peer reads end of file or
 * ECONNRESET at once instead of waiting on a connection nobody serves. Queues an RST from
 * local_port to (peer_cid, peer_port) for a connection of `type`, on the ring of RSTs that
 * answer no socket (so at most reply_limit wait; pull, then call again).
 * Returns 0, -EEXIST (this engine has that connection: it is not ended), -EINVAL (type),
 * -ENOBUFS (the ring is full; counted in rst_dropped as any RST it has no room for).
 */
int vsock_engine_reset_conn(struct vsock_engine *e, enum vsock_type type, uint32_t local_port,
			    uint32_t peer_cid, uint32_t peer_port);

/* A connection known by its addresses only (what crash survival keeps outside the process). */
struct vsock_conn_addr {
	uint32_t type, local_port, peer_cid, peer_port;
};

/*
 * The small record crash survival keeps (docs/upgrade.md): the addresses of every connection of
 * e that the peer may still think open (CONNECTING, PENDING, CONNECTED, CLOSING), as items of
 * the list w is in, rewritten by the owner whenever the set of connections changes (never per
 * packet). Returns 0 or the writer's error (-ENOMEM...).
 */
int vsock_engine_save_conns(struct vsock_engine *e, struct rec_writer *w);
/* Changes whenever a connection enters or leaves the connected table, so the owner knows when
 * to write the list again (any thread, a relaxed load). */
uint64_t vsock_engine_conn_changes(struct vsock_engine *e);
/*
 * Reads what vsock_engine_save_conns wrote: a malloc'd array of *ret_n addresses in *ret (NULL
 * when none), each checked (type STREAM or SEQPACKET, no port or CID "any"), at most max of
 * them. Then call vsock_engine_reset_conn for each (pulling whenever it says -ENOBUFS).
 * Returns 0, -EBADMSG (r's document says why), -E2BIG (more than max), -ENOMEM.
 */
int vsock_engine_read_conns(struct rec_reader *r, size_t max, struct vsock_conn_addr **ret,
			    size_t *ret_n);

/* ---- Datagrams (dgram.c; docs/vsock-protocol.md "Datagrams") ------------------------------ */

/*
 * A datagram socket is vsock_sock_new(e, VSOCK_TYPE_DGRAM): -ENODEV unless cfg.dgram (Linux's
 * answer when no transport supports datagrams). It binds with vsock_sock_bind() (its ports are
 * a namespace of their own, apart from STREAM/SEQPACKET), closes with vsock_sock_close(), polls
 * with vsock_sock_poll() (POLLIN: a datagram is queued; POLLOUT: the send quota has room) and
 * reports its address with vsock_sock_local_addr(). It has no state machine, no credit and
 * never sends or receives an RST. Each fed DGRAM packet is one datagram for the socket bound to
 * its destination port; each sent datagram leaves as one packet through vsock_engine_pull().
 *
 * Send path: vsock_dgram_send() takes no lock once the socket is bound (the default peer and
 * the local address are single atomic words; the engine's send queue is a multi-producer
 * lock-free list), so many threads may send on one socket at once. With the tune switch
 * dgram-lockfree off or UVSOCK_DGRAM_LOCKED=1 in the environment (read when each engine is
 * created) the same path runs under the socket lock, for comparison.
 */

/* Receive-queue charge of each queued datagram on top of its payload (SO_RCVBUF, SO_SNDBUF). */
#define VSOCK_DGRAM_OVERHEAD 64u
/* Default SO_RCVBUF and SO_SNDBUF of a datagram socket. */
#define VSOCK_DGRAM_BUF_DEFAULT (256u * 1024u)

/* A datagram address (source of a received one, destination of a sent one). */
struct vsock_dgram_addr {
	uint32_t cid, port;
};

/* True if the engine accepts datagrams (cfg.dgram). Any thread. */
bool vsock_engine_dgram_enabled(const struct vsock_engine *e);
/* The largest datagram payload of the engine (cfg.dgram_max). */
uint32_t vsock_engine_dgram_max(const struct vsock_engine *e);
/* True if this engine's datagram sends run under the socket lock (see above). Any thread. */
bool vsock_engine_dgram_locked(const struct vsock_engine *e);

/*
 * connect(2) of a datagram socket: sets the default destination (auto-binding first, as Linux
 * vsock_dgram_connect()); with `clear` (AF_UNSPEC) removes it instead. Datagrams from other
 * peers are still received. Returns 0, -EADDRNOTAVAIL (auto-bind), -EOPNOTSUPP (not DGRAM).
 */
int vsock_dgram_connect(struct vsock_sock *s, uint32_t cid, uint32_t port, bool clear);
/* getpeername(2): the default destination, or -ENOTCONN. */
int vsock_dgram_peer_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port);

/*
 * sendto(2), never blocking: copies the iov_total(iov) bytes once into a packet and queues it
 * for pull. `to` NULL means the default destination. Auto-binds an unbound socket (taking the
 * socket lock only then). Returns the length, -EMSGSIZE (over dgram_max), -EDESTADDRREQ (no
 * destination), -EAGAIN (the socket's SO_SNDBUF worth of datagrams is waiting to be pulled;
 * poll for POLLOUT), -EADDRNOTAVAIL (auto-bind), -ENOMEM, -EOPNOTSUPP (not DGRAM).
 */
ssize_t vsock_dgram_send(struct vsock_sock *s, const struct vsock_dgram_addr *to,
			 const struct iovec *iov, int iovcnt);

/*
 * recvfrom(2), never blocking: the oldest queued datagram, whole or cut to the iov size
 * (*ret_msg_flags gets VSOCK_MSG_TRUNC then). flags: VSOCK_MSG_PEEK (leave it queued),
 * VSOCK_MSG_TRUNC (return the datagram's full length). *ret_src gets its source (may be NULL).
 * Returns the length, -EAGAIN (none queued), -EOPNOTSUPP (not DGRAM).
 */
ssize_t vsock_dgram_recv(struct vsock_sock *s, const struct iovec *iov, int iovcnt, int flags,
			 int *ret_msg_flags, struct vsock_dgram_addr *ret_src);

/*
 * SO_RCVBUF / SO_SNDBUF of a datagram socket, in bytes counted as payload plus
 * VSOCK_DGRAM_OVERHEAD per datagram. set doubles val as Linux does (the doubled value is what
 * get returns), clamped to [4096, 64 MiB]. A full receive limit drops fed datagrams
 * (dgram_drop_full); a full send limit makes vsock_dgram_send() return -EAGAIN.
 * Returns 0, -EOPNOTSUPP (not DGRAM).
 */
int vsock_dgram_set_buf(struct vsock_sock *s, bool rcv, uint64_t val);
int vsock_dgram_get_buf(struct vsock_sock *s, bool rcv, uint64_t *ret);

#endif
