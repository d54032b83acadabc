/* SPDX-License-Identifier: MIT */
/*
 * Transfer sessions of the interop run, shared by the in-guest program (AF_VSOCK inside the VM)
 * and the host helper (Unix sockets towards uvsockd). A session is one connected stream socket
 * with a "client" (the side that connected) and a "server" (the side that accepted). The client
 * first sends a fixed header (struct xfer_hdr) saying what the session does; the server follows
 * it. Payload bytes are a seeded pseudo-random pattern that depends on the stream offset, so the
 * receiver verifies every byte in place and reports the first wrong offset (a loss, duplication,
 * reordering or corruption anywhere shows up). Writes and reads cycle through sizes from 1 byte
 * to 256 KiB.
 *
 * The engine (xfer_run) drives any number of sessions on non-blocking sockets with one poll
 * loop, and optionally accepts server sessions from a listener, so 200 concurrent connections
 * are one call. It is single-threaded per call; the host helper calls it from several threads
 * (scratch buffers are per thread).
 *
 * Also here: SEQPACKET sessions (blocking, with timeouts), the control-channel line protocol
 * (tagged request/response lines over a byte stream: the guest's /dev/ttyS1 <-> the host
 * helper), and small time helpers. Nothing here opens AF_VSOCK sockets; callers pass fds.
 */
#ifndef UVSOCK_INTEROP_XFER_H
#define UVSOCK_INTEROP_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Result texts are cut to fit their buffers on purpose; gcc's truncation analysis is noise here. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#define XFER_MAGIC 0x4b535655u /* "UVSK" little-endian */
#define XFER_TRL_MAGIC 0x4c525456u /* "VTRL" */

/* Well-known ports of the host helper's services (the guest connects to CID 2 at these). */
#define XFER_PORT_STREAM 5000
#define XFER_PORT_SEQ 5001
#define XFER_PORT_NOBODY 5999 /* nobody listens here on the host */
/* Ports the guest listens on for host-initiated connections. */
#define XFER_GPORT_STREAM 6000
#define XFER_GPORT_SEQ 6001

enum xfer_mode {
	XM_DUPLEX = 1, /* both directions at once, then a trailer from the server */
	XM_ECHO = 2, /* ping-pong: the server echoes every byte */
	XM_HALFCLOSE = 3, /* client sends then SHUT_WR; server sends only after that EOF */
	XM_STALL = 4, /* host server reads nothing until released, then c2s to EOF */
	XM_ABORT = 5, /* host server reads c2s bytes, then closes with data in flight */
	XM_FLOOD = 6, /* host server writes until the peer goes away */
	XM_SINK = 7, /* host server reads forever, reports "FLOWING" once c2s seen */
	XM_SEQ = 8, /* SEQPACKET session (xfer_seq_*) */
	XM_COUNT = 9, /* host server reads exactly c2s bytes, then EOF; verdict names their hash */
};

#define XF_CHECK_EOR 0x1u /* SEQPACKET: MSG_EOR must arrive exactly as sent */

/* Sent by the client as the first 40 bytes (stream) or the first message (seqpacket). */
struct xfer_hdr {
	uint32_t magic;
	uint32_t mode;
	uint64_t c2s; /* payload bytes client -> server */
	uint64_t s2c; /* payload bytes server -> client */
	uint32_t seed;
	uint32_t flags;
	uint64_t id; /* lets the guest ask the host helper for its verdict on this session */
};

/* Sent by the server after its s2c payload (DUPLEX, HALFCLOSE): its verdict on c2s. */
struct xfer_trailer {
	uint32_t magic;
	int32_t status; /* 0 ok, else a positive error number or 1000+ for a data mismatch */
	uint64_t got; /* c2s bytes received */
	uint64_t bad; /* first wrong c2s offset, or UINT64_MAX */
};

struct xfer {
	int fd;
	bool server;
	bool connecting; /* client: non-blocking connect in progress */
	struct xfer_hdr h; /* client: what to send; server: what was received */
	char prelude[48]; /* client: line written first ("CONNECT <port>\n"), "" for none */
	/* engine state */
	int st;
	size_t pre_off, line_len, hdr_off, trl_off;
	char line[64];
	uint64_t sent, rcvd, echo_out;
	struct xfer_trailer trl;
	unsigned wi, ri;
	bool eof;
	uint8_t *echo_buf; /* echo server: bytes received, not yet written back */
	size_t echo_len, echo_off;
	/* result */
	bool done, ok;
	char msg[200];
	int64_t t0, t1; /* ms */
	int64_t last_io; /* ms of the last byte moved (stall detection) */
};

/* A session that moves no byte for this long fails even before its deadline. */
#define XFER_STALL_MS 60000

/* xfer_now_ms: CLOCK_MONOTONIC in milliseconds (mono_ms() of src/util/time.h). */
int64_t xfer_now_ms(void);

/* xfer_pattern_fill: write the pattern bytes [off, off+len) of stream @seed into @buf. */
void xfer_pattern_fill(uint32_t seed, uint64_t off, void *buf, size_t len);

/*
 * xfer_pattern_check: compare @buf against pattern bytes [off, off+len) of stream @seed.
 * Returns: the index of the first wrong byte within @buf, or -1 if all match.
 */
ssize_t xfer_pattern_check(uint32_t seed, uint64_t off, const void *buf, size_t len);

/*
 * xfer_hash: 64-bit FNV-1a of @len bytes of @buf, continuing from @h (start with XFER_HASH_INIT).
 * Both ends of a session hash what they sent / received, so a verdict can name the hash.
 */
#define XFER_HASH_INIT 0xcbf29ce484222325ull
uint64_t xfer_hash(uint64_t h, const void *buf, size_t len);

/* The write-size and read-size cycles (1 B .. 256 KiB); exposed for case code. */
size_t xfer_wsize(unsigned *i);
size_t xfer_rsize(unsigned *i);

/* xfer_scratch: a per-thread buffer of XFER_SCRATCH bytes (index 0 or 1), never freed. */
#define XFER_SCRATCH (256 * 1024 + 64)
uint8_t *xfer_scratch(int which);
/* xfer_thread_done: free the calling thread's scratch buffers (call before a thread ends). */
void xfer_thread_done(void);

/*
 * xfer_client_init / xfer_server_init: prepare a session on @fd (made non-blocking here; the
 * session takes ownership and closes it when done). @prelude: NULL or a line sent before the
 * header, whose reply must start with "OK " (the uvsockd host-connect handshake).
 * @connecting: true when @fd is a non-blocking connect still in progress.
 * xfer_server_init_hdr: a server whose header the caller already read.
 */
void xfer_client_init(struct xfer *x, int fd, const struct xfer_hdr *h, const char *prelude,
		      bool connecting);
void xfer_server_init(struct xfer *x, int fd);
void xfer_server_init_hdr(struct xfer *x, int fd, const struct xfer_hdr *h);

/*
 * xfer_run: drive sessions v[0..*n) until all are done or @deadline_ms (CLOCK_MONOTONIC ms)
 * passes. If @lfd >= 0, accept up to @accept_n connections from it as server sessions appended to
 * v (capacity @cap, *n grows). Sessions still running at the deadline fail with "timeout".
 * Every session's fd is closed on return.
 * Returns: number of sessions that did not end ok (0 = all ok), including accepts that never
 * came (those count as failures, described in @why if not NULL).
 */
int xfer_run(struct xfer *v, size_t *n, size_t cap, int lfd, size_t accept_n, int64_t deadline_ms,
	     char *why, size_t why_len);

/*
 * xfer_hint_fd: when >= 0, xfer_run also watches this fd (the guest's control channel while the
 * host runs the other end): once it becomes readable the host has answered, so whatever is still
 * running gets at most 10 more seconds instead of the whole deadline. -1 by default.
 */
extern int xfer_hint_fd;

/* xfer_summary: first failure message (or "N ok") of v[0..n) into @out. */
void xfer_summary(const struct xfer *v, size_t n, char *out, size_t len);

/*
 * SEQPACKET session on a connected, blocking fd. The client sends the header message (mode
 * XM_SEQ), then messages of sizes 1 B .. 128 KiB (every other one with MSG_EOR) that the server
 * checks (exact length, content) and echoes with the same flags; then each side sends three
 * messages the other reads with a short buffer (MSG_TRUNC reported, rest discarded) and with the
 * MSG_TRUNC flag (real length returned); then the client closes and the server sees EOF.
 * @flags: XF_CHECK_EOR makes MSG_EOR mismatches an error (between two Linux kernels); otherwise
 * they are only counted in @msg. @timeout_ms bounds each send/receive.
 * Returns: 0 ok, else -1 with @msg describing the first failure.
 */
int xfer_seq_client(int fd, uint32_t seed, uint32_t flags, int timeout_ms, char *msg, size_t len);
int xfer_seq_server(int fd, int timeout_ms, char *msg, size_t len);
/* xfer_seq_server_hdr: server whose header message the caller already read. */
int xfer_seq_server_hdr(int fd, const struct xfer_hdr *h, int timeout_ms, char *msg, size_t len);

/* Control channel: tagged lines "<tag> <word> ..." over a byte stream (tty or socket). */
struct ctl {
	int fd;
	char buf[1024];
	size_t len;
};

/* ctl_send: write one line (a '\n' is appended). Returns: 0 or -errno. */
int ctl_send(struct ctl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * ctl_recv: read the next complete line into @out (without '\n') before @deadline_ms.
 * Returns: length, -ETIMEDOUT, -EPIPE on EOF, or -errno.
 */
int ctl_recv(struct ctl *c, char *out, size_t len, int64_t deadline_ms);

/* set_timeouts: SO_RCVTIMEO and SO_SNDTIMEO of @fd to @ms. */
void set_timeouts(int fd, int ms);

/* send_full / recv_full: blocking loops; Returns: 0, -errno, or -EPIPE on early EOF. */
int send_full(int fd, const void *buf, size_t len);
/* True once something listens on TCP port (any address) here: /proc/net/tcp (vsock_test). */
bool xfer_tcp_listening(unsigned port);
int recv_full(int fd, void *buf, size_t len);

#endif
