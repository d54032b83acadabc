/* SPDX-License-Identifier: MIT */
/*
 * Deterministic simulation of the vsock protocol: two engines (src/vsock/engine.h) joined by a
 * model of the virtio rings, driven by a seeded scheduler. Side 0 is the guest (CID 3, the driver
 * role: it fills the TX ring and posts RX buffers), side 1 the host (CID 2, the device role: it
 * drains the TX ring while vsock_engine_can_feed() and fills posted RX buffers).
 *
 *   sim.c      the runner (seeds, TAP, replay), the step scheduler and the final drain
 *   sim_net.c  the engines, the rings ("wire"), the transport model and the checks made on the
 *              wire: credit, tx_ready, timer deadlines, lost socket events
 *   sim_app.c  the applications on both sides: sockets and connections, the byte and message
 *              checks, the end-of-stream rules
 *
 * One struct sim is one seed's world. Everything in it derives from the seed: the same seed
 * gives the same trace (sockets are bound to explicit ports so the engine never draws a random
 * auto-bind port). A failed check longjmps out of the seed (sim_fail) after printing why.
 */
#ifndef UVSOCK_TEST_SIM_H
#define UVSOCK_TEST_SIM_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "vsock/engine.h"

#define SIM_GUEST        0
#define SIM_HOST         1
#define SIM_MAX_SOCKS    128 /* socket records per seed (never reused) */
#define SIM_MAX_CONNS    96  /* connection records per seed */
#define SIM_MAX_LIVE     10  /* live application sockets per side */
#define SIM_RING_MAX     64  /* largest ring the model uses */
#define SIM_MAX_CRED     256 /* credit trackers (one per flow direction ever seen) */
#define SIM_BACKLOG_MAX  64
#define SIM_NPORTS       3  /* listener ports 100.. (the last one never listens: RST) */
#define SIM_CLIENT_PORTS 12 /* client ports per side, 1024.. : small, so tuples get reused */

/* Relative weights of the scheduler's actions (per seed, see sim.c). */
enum sim_act {
	ACT_PULL_GUEST, /* guest engine -> TX ring */
	ACT_PULL_HOST,  /* host engine -> a posted RX buffer */
	ACT_DELIVER_TX, /* host drains the TX ring (a flow head, or a batch) */
	ACT_DELIVER_RX, /* guest processes filled RX buffers */
	ACT_REFILL,     /* guest reposts withheld RX buffers */
	ACT_WITHHOLD,   /* guest stops reposting RX buffers for a while */
	ACT_TIME,       /* the virtual clock advances; due timers fire */
	ACT_APP,        /* one application action on either side */
	_ACT_MAX,
};

enum sim_app_act {
	APP_LISTEN,
	APP_CONNECT,
	APP_ACCEPT,
	APP_DECIDE, /* accept_pending / reject a child of a deferred listener */
	APP_SEND,
	APP_RECV,
	APP_PEEK_CONSUME, /* the device role's zero-copy receive */
	APP_STALL,        /* a reader stops reading for a while */
	APP_SHUTDOWN,
	APP_CLOSE,
	APP_SETOPT, /* receive buffer size changed mid-connection */
	APP_CREDIT_REQ,
	_APP_MAX,
};

/* A packet pulled from one engine and not yet fed to the other. */
struct sim_pkt {
	struct vsock_hdr h;
	uint8_t *buf;   /* h.len payload bytes (malloc'd, exactly the pull's max_payload) */
	uint64_t ready; /* not delivered before this step (delays, held credit updates) */
	int conn;       /* REQUEST: the connection record it opens, else -1 */
};

/* Packets in pull order; per flow (port pair) they are delivered in that order. */
struct sim_wire {
	struct sim_pkt p[SIM_RING_MAX];
	unsigned n;
};

/* One direction of a connection: what the sender's application sent, what the receiver read. */
struct sim_msg {
	uint32_t len;
	bool eor;
	uint64_t off; /* first pattern offset of the message */
};
struct sim_dir {
	uint64_t key; /* pattern key: byte at offset o is sim_pat_byte(key, o) */
	uint64_t sent, recvd;
	struct sim_msg *msgs; /* SEQPACKET: every message sent, in order */
	uint32_t nmsg, msg_cap, next_msg;
	bool wr_done; /* the sender shut down SEND or closed: `sent` is final */
	bool rst;     /* an RST reached the receiver: the stream may end early */
	bool eof;     /* the receiver's recv returned 0 */
	bool rd_shut; /* the receiver shut down RCV itself: no end-of-stream checks */
};

struct sim_conn {
	enum vsock_type type;
	int cside;          /* side of the client */
	int client, server; /* sim_sock indices, -1 if none (yet) */
	uint32_t cport, lport;
	bool request_seen;   /* its REQUEST left the client's engine */
	bool child;          /* the listener's engine created a child for it */
	bool reset;          /* a transport reset happened during its life: no completeness check */
	bool connected;      /* the client reached CONNECTED */
	bool healthy;        /* at the drain, both ends were open and nothing was lost: it must
			     * end with every byte read and no RST before either EOF */
	struct sim_dir d[2]; /* d[0]: client -> server, d[1]: server -> client */
};

enum sim_role { ROLE_LISTENER, ROLE_CLIENT, ROLE_CHILD };

struct sim_sock {
	struct vsock_sock *s; /* NULL once the application closed it */
	int side;
	enum sim_role role;
	enum vsock_type type;
	int conn;           /* -1 for listeners */
	uint32_t port;      /* local port */
	unsigned mask_seen; /* poll mask as last reported by sock_event (or seen by the app) */
	uint64_t stall_until;
	bool wr_shut;
	/* listener */
	bool deferred;
	int fifo[SIM_BACKLOG_MAX]; /* connection records of children not yet accepted */
	unsigned fifo_head, fifo_n;
	/* child of a deferred listener: still waiting for accept_pending / reject */
	bool undecided;
};

/* The sender's credit view of one flow direction, rebuilt from the packets on the wire. */
struct sim_cred {
	int side; /* the sender */
	uint32_t lport, pport;
	uint32_t tx; /* RW payload bytes pulled from the sender (wraps like tx_cnt) */
	uint32_t peer_ba, peer_fwd; /* the receiver's last advertisement fed to the sender */
};

/* The opaque pointer of one engine's ops callbacks. */
struct sim_ep {
	struct sim *sim;
	int side;
};

struct sim {
	uint64_t seed, rng;
	struct sim_ep ep[2];
	bool verbose;
	FILE *out;             /* where the trace goes (stdout, or memory for --twice) */
	bool seqpacket_shrink; /* --seqpacket-shrink: reproduce the known bug (sim_app.c) */
	jmp_buf fail;
	uint64_t step, max_steps, now;
	struct vsock_engine *e[2];
	struct vsock_engine_config cfg[2];
	unsigned w_act[_ACT_MAX], w_app[_APP_MAX];
	unsigned w_act_sum, w_app_sum;

	/* transport model */
	struct sim_wire w[2];                 /* w[X]: pulled from side X, to be fed to the other */
	unsigned tx_ring;                     /* guest TX ring size (capacity of w[GUEST]) */
	unsigned rx_ring, rx_posted, rx_owed; /* guest RX ring: posted, processed not reposted */
	uint64_t withhold_until;              /* the guest reposts no RX buffer before this step */
	uint32_t rx_buf_len, tx_buf_len;
	bool idle[2];               /* the transport found nothing to pull and would sleep */
	uint64_t known_deadline[2]; /* the deadline the transport waits for */
	unsigned tx_ready_calls[2];
	unsigned delay_pct, credit_hold_pct;
	bool had_reset;
	bool draining;

	struct sim_sock socks[SIM_MAX_SOCKS];
	unsigned nsocks;
	struct sim_conn conns[SIM_MAX_CONNS];
	unsigned nconns;
	struct sim_cred cred[SIM_MAX_CRED];
	unsigned ncred;
	uint64_t bytes_moved, msgs_moved; /* statistics for the summary line */
	uint64_t clean_eofs;              /* EOFs checked complete */
};

/* ---- helpers (sim.c) -------------------------------------------------------------------- */
uint64_t sim_rand(struct sim *s);
uint64_t sim_below(struct sim *s, uint64_t n); /* uniform in [0, n), 0 if n == 0 */
bool sim_chance(struct sim *s, unsigned pct);
/* An index in [0, n) drawn with weights w (summing to sum > 0). */
unsigned sim_pick(struct sim *s, const unsigned *w, unsigned n, unsigned sum);
/* A size in [1, max] skewed towards small values. */
uint32_t sim_size(struct sim *s, uint32_t max);
void sim_trace_(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line of the step trace (--verbose only; the arguments are not even evaluated otherwise). */
#define sim_trace(s, ...)                                                                          \
	do {                                                                                       \
		if ((s)->verbose)                                                                  \
			sim_trace_(s, __VA_ARGS__);                                                \
	} while (0)
__attribute__((noreturn)) void sim_fail(struct sim *s, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
#define SIM_CHECK(s, cond, ...)                                                                    \
	do {                                                                                       \
		if (!(cond))                                                                       \
			sim_fail(s, __VA_ARGS__);                                                  \
	} while (0)

/* ---- pattern: the content of every byte sent, keyed by offset ---------------------------- */
void sim_pat_fill(uint64_t key, uint64_t off, uint8_t *p, size_t n);
/* Index of the first byte that differs from the pattern, or -1. */
long sim_pat_check(uint64_t key, uint64_t off, const uint8_t *p, size_t n);

/* ---- network (sim_net.c) ---------------------------------------------------------------- */
void sim_net_init(struct sim *s);
void sim_net_free(struct sim *s);
/* One network action; false if it could do nothing now. */
bool sim_pull(struct sim *s, int side);
bool sim_deliver(struct sim *s, int to, bool batch, bool ignore_holds);
void sim_refill(struct sim *s);
void sim_advance(struct sim *s, uint64_t ns);
void sim_transport_reset(struct sim *s, int side);
/* Checks run after every step: engine counters, tx_ready and deadline rules, socket events. */
void sim_check_engines(struct sim *s);
/* The transport re-reads what it waits for after acting itself. */
void sim_net_observe(struct sim *s, int side);
/* Nothing left anywhere: wires empty, nothing to pull, no timer, no socket. */
bool sim_net_quiet(struct sim *s);
void sim_cred_reset(struct sim *s, int side, uint32_t lport, uint32_t pport, uint32_t ba,
                    uint32_t fwd);
const struct vsock_engine_ops *sim_engine_ops(void);

/* ---- applications (sim_app.c) ----------------------------------------------------------- */
/* Listeners on both sides before the first step. */
void sim_app_setup(struct sim *s);
/* At the start of the drain: marks the connections that must end cleanly. */
void sim_app_drain_start(struct sim *s);
void sim_app_step(struct sim *s);
/*
 * One pass of the ending: accept what is queued and close listeners, confirm pending children,
 * shut down SEND, read to the end, close. Sets *progress if it did anything; returns true once
 * every application socket is closed.
 */
bool sim_app_drain(struct sim *s, bool *progress);
/* Network hooks: a REQUEST left / reached an engine, an RST reached a side. */
int sim_app_request_pulled(struct sim *s, int side, const struct vsock_hdr *h);
void sim_app_request_fed(struct sim *s, int side, const struct sim_pkt *p, int r);
void sim_app_rst_fed(struct sim *s, int side, const struct vsock_hdr *h);
void sim_app_transport_reset(struct sim *s, int side);
/* After a network step: no socket of `side` gained a poll bit without a sock_event. */
void sim_check_events(struct sim *s, int side);
/* The applications give up on every socket they still hold. */
void sim_app_close_all(struct sim *s);
void sim_app_free(struct sim *s);
unsigned sim_app_live(struct sim *s, int side);

#endif
