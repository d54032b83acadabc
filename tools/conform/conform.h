/* SPDX-License-Identifier: MIT */
/*
 * uvsock-conform: a conformance tester for any vhost-user vsock back-end, guest-less. Each check
 * opens its own vhost-user session (rguest.h: a raw guest on real virtqueues), plays a small
 * guest vsock stack over it (this header: connections, credit, the checks every received packet
 * goes through) and the host application on the back-end's hybrid Unix sockets
 * (tools/common/hybrid.h), and reports the first deviation it saw, named with the virtio spec
 * section or the Linux function it contradicts (the REF_* strings).
 *
 * Context: single-threaded except the host I/O threads (struct hio), which touch only their own
 * struct and descriptor.
 */
#ifndef UVSOCK_CONFORM_H
#define UVSOCK_CONFORM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "rguest.h"

/* What each deviation contradicts. */
#define REF_INIT "vhost-user front-end initialisation (virtio 1.2 §5.10.5 Device Initialization)"
#define REF_ADDR "virtio 1.2 §5.10.6.2 Addressing"
#define REF_USED "virtio 1.2 §2.7.8 The Virtqueue Used Ring (len: bytes written into the buffer)"
#define REF_CUT                                                                                    \
	"virtio 1.2 §5.10.6.4 Receive and Transmit (len is the payload that follows the header); "  \
	"Linux vhost_transport_do_send_pkt() sets hdr.len to the bytes that fit the guest's buffer"
#define REF_HDR "virtio 1.2 §5.10.6 Device Operation (struct virtio_vsock_hdr)"
#define REF_CREDIT                                                                                 \
	"virtio 1.2 §5.10.6.3 Buffer Space Management (never more than buf_alloc - (tx_cnt - "      \
	"fwd_cnt) in flight); Linux virtio_transport_get_credit()"
#define REF_FWD                                                                                    \
	"virtio 1.2 §5.10.6.3 Buffer Space Management (fwd_cnt counts one socket's bytes); Linux "  \
	"virtio_transport_inc_tx_pkt() stamps the socket's own fwd_cnt"
#define REF_CREDIT_REQ                                                                             \
	"virtio 1.2 §5.10.6.3 (CREDIT_REQUEST asks for a CREDIT_UPDATE); Linux "                   \
	"virtio_transport_recv_connected() answers it with virtio_transport_send_credit_update()"
#define REF_CREDIT_GIVE                                                                            \
	"virtio 1.2 §5.10.6.3 Buffer Space Management (the receiver tells the sender of freed "     \
	"space); Linux virtio_transport_do_dequeue() sends virtio_transport_send_credit_update()"
#define REF_HOLD_BACK                                                                              \
	"Linux vhost_transport_do_send_pkt() sends while the guest's credit lasts; a guest "        \
	"waiting for more (SO_RCVLOWAT) sends no CREDIT_UPDATE before it reads "                     \
	"(virtio_transport_do_dequeue()), so a back-end that holds back below the credit stalls it"
#define REF_CREDIT_WINDOW                                                                          \
	"virtio 1.2 §5.10.6.3 Buffer Space Management (the receiver tells the sender of freed "     \
	"space); Linux virtio_transport_get_credit() keeps at most min(peer buf_alloc, own "        \
	"buf_alloc) in flight (virtio_transport_tx_buf_size(), CVE-2026-23086) and never sends "    \
	"CREDIT_REQUEST: a receiver that sends CREDIT_UPDATE only when its own larger buffer "      \
	"runs low stalls it"
#define REF_NOSOCK                                                                                 \
	"virtio 1.2 §5.10.6.5 Stream Sockets (a REQUEST is answered by RESPONSE or RST); Linux "    \
	"virtio_transport_reset_no_sock()"
#define REF_CONNECT "virtio 1.2 §5.10.6.5 Stream Sockets (a REQUEST is answered by RESPONSE or RST)"
#define REF_SHUT                                                                                   \
	"virtio 1.2 §5.10.6.5 Stream Sockets (SHUTDOWN flags close one direction); Linux "          \
	"virtio_transport_recv_connected()"
#define REF_DATA                                                                                   \
	"virtio 1.2 §5.10.6.5 Stream Sockets (an in-order, reliable byte stream); Linux "           \
	"virtio_transport_recv_enqueue()"
#define REF_FRAMING                                                                                \
	"virtio 1.2 §2.7.4 Message Framing (a device makes no assumption about how a buffer is "    \
	"split into descriptors)"
#define REF_SEQ                                                                                    \
	"virtio 1.2 §5.10.6.6 Seqpacket Sockets (VIRTIO_VSOCK_SEQ_EOM ends a message); Linux "      \
	"virtio_transport_seqpacket_do_dequeue()"
#define REF_HYBRID "the hybrid vsock convention (a refused host CONNECT closes the host socket)"

enum cstate { CS_FREE, CS_CONNECTING, CS_OPEN, CS_RESET };

/* One guest-side connection. */
struct conn {
	uint32_t lport, pport;
	uint16_t type;
	enum cstate state;
	uint32_t buf_alloc;      /* advertised */
	uint32_t fwd_cnt;        /* bytes this guest consumed */
	uint32_t fwd_adv;        /* fwd_cnt in the last packet sent */
	bool hold;               /* slow reader: consume only through conn_consume() */
	bool linux_tx;           /* send as Linux since CVE-2026-23086: in flight at most
				  * min(peer buf_alloc, own buf_alloc), never a CREDIT_REQUEST */
	uint64_t rx_total;       /* payload bytes received */
	uint64_t rx_unread;      /* held, not consumed */
	uint32_t seed;           /* pattern of the bytes expected and sent */
	uint64_t tx_off;
	uint32_t tx_cnt;
	bool peer_known;
	uint32_t peer_buf_alloc, peer_fwd_cnt;
	unsigned peer_shut;      /* SHUTDOWN flags received */
	unsigned credit_updates; /* CREDIT_UPDATE packets received */
	uint32_t update_fwd;     /* fwd_cnt of the last one */
	uint64_t msg_len;        /* SEQPACKET: bytes of the message being received */
	uint64_t msgs[16];       /* lengths of the messages received (first 16) */
	unsigned nmsgs;
	bool mismatch_told;
};

struct opts {
	const char *socket, *uds;
	int timeout_ms;
	int quiet_ms;
	unsigned conns;
	bool json, verbose;
	const char *only;
};

#define MAX_CONNS 1024u

/* One check's context. */
struct ck {
	const struct opts *o;
	struct rguest g;
	bool open;
	struct conn conns[MAX_CONNS];
	unsigned nconns;
	uint32_t next_port;
	uint32_t host_port;       /* first of this check's host ports */
	uint32_t listen_port;     /* a REQUEST to this guest port is answered (0: none) */
	bool listen_refuse;       /* ... with RST instead of RESPONSE */
	struct vsock_hdr stray;   /* last packet for no connection */
	unsigned nstray;
	char paths[8][256];       /* host listeners to remove */
	unsigned npaths;
	int lfd;                  /* the host listener of ck_host_listen() */
	int fds[8];               /* host sockets closed when the check ends */
	unsigned nfds;
	/* result */
	bool failed, skipped;
	char msg[600];
	const char *ref;
	unsigned deviations;
	char note[200];
	bool unreachable; /* the session could not even start */
};

/* Records a deviation (the first one is reported; the rest counted). */
void ck_fail(struct ck *c, const char *ref, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void ck_skip(struct ck *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Opens this check's guest session (lay: RX layout, NULL: default). False (and failed) if not. */
bool ck_open(struct ck *c, const struct rg_rx_layout *lay);

/* Handles one packet from the back-end (every packet is validated); -ETIMEDOUT if none came
 * within ms, -EIO when the session is gone (recorded). */
int ck_pump(struct ck *c, int ms);
/* Pumps until *cond (re-evaluated after each packet) or ms pass; the condition's value. */
#define CK_PUMP_UNTIL(c, cond, ms)                                                                 \
	({                                                                                         \
		uint64_t dl_ = ck_now_ms() + (uint64_t)(ms);                                      \
		bool ok_;                                                                          \
		while (!(ok_ = (cond)) && ck_now_ms() < dl_ &&                                     \
		       ck_pump((c), (int)(dl_ - ck_now_ms())) != -EIO)                             \
			;                                                                          \
		ok_;                                                                               \
	})
/* Pumps every packet that arrives within ms (a quiet window). */
void ck_drain(struct ck *c, int ms);
uint64_t ck_now_ms(void);

/* A new connection slot to host port pport (not connected). */
struct conn *ck_conn(struct ck *c, uint16_t type, uint32_t pport, uint32_t buf_alloc);
/* Sends a control packet on k (op, flags) carrying k's credit. */
int conn_ctl(struct ck *c, struct conn *k, unsigned op, unsigned flags);
/* REQUEST and wait for the answer: true if RESPONSE (OPEN), false on RST or timeout. */
bool conn_connect(struct ck *c, struct conn *k);
/*
 * Sends len pattern bytes within the back-end's credit, in packets of at most pkt bytes (flags
 * on each; with eom on SEQPACKET the last one carries VSOCK_SEQ_EOM), each cut into descriptors
 * at cuts (relative to the packet) if given. A stall without credit for the timeout fails the
 * check. Returns 0, -1, or -EMSGSIZE (nothing sent) for a SEQPACKET message larger than the
 * back-end's buf_alloc, which Linux refuses too. With k->linux_tx the credit is Linux's
 * (min(peer buf_alloc, own buf_alloc) - in flight) and no CREDIT_REQUEST is sent while waiting.
 */
int conn_send(struct ck *c, struct conn *k, uint64_t len, uint32_t pkt, bool eom,
	      const uint32_t *cuts, unsigned ncuts, bool indirect);
/* Consumes n held bytes (slow reader) and tells the back-end with a CREDIT_UPDATE. */
void conn_consume(struct ck *c, struct conn *k, uint64_t n);

/* A listener at <uds>_<port> of type, also in c->lfd (closed and removed when the check ends). */
int ck_host_listen(struct ck *c, uint32_t port, int type);
/* fd is closed when the check ends; returns fd. */
int ck_keep_fd(struct ck *c, int fd);
/* Ends the check: closes the session and the host sockets, removes the listeners. */
void ck_end(struct ck *c);

/* The pattern byte at offset off of stream seed. */
static inline uint8_t pat(uint32_t seed, uint64_t off)
{
	return (uint8_t)((off ^ (off >> 8) ^ (off >> 16)) * 31u + seed);
}

/* Host-side I/O on one Unix socket in its own thread: write n pattern bytes (then SHUT_WR if
 * shut), or read until n bytes (UINT64_MAX: end of stream), checking the pattern. */
struct hio {
	int fd;
	bool writer, shut;
	uint64_t n;
	uint32_t seed;
	size_t chunk;          /* bytes per read/write */
	unsigned pause_every;  /* reader: pause 1 ms every this many chunks (0: never) */
	atomic_bool *go;       /* NULL, or wait until *go before starting */
	int timeout_ms;
	/* results */
	uint64_t done;
	bool eof, mismatch;
	uint64_t bad_at;
	int err;
	pthread_t th;
};
void hio_start(struct hio *h);
void hio_join(struct hio *h);

/* The checks (checks.c). */
struct check {
	const char *name;
	const char *what;
	void (*run)(struct ck *c);
};
extern const struct check checks[];
extern const unsigned nchecks;

#endif
