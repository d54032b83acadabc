// SPDX-License-Identifier: MIT
/*
 * Transfer sessions shared by the in-guest program and the host helper of the interop run: the
 * offset-keyed payload pattern, the poll-driven stream session engine (DUPLEX, ECHO, HALFCLOSE),
 * the SEQPACKET session and the tagged control-line channel. See xfer.h for the protocol.
 */
#include "xfer.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "util/time.h"

enum { ST_CONNECT, ST_PRE_W, ST_PRE_R, ST_HDR, ST_RUN, ST_TRL_OUT, ST_EOFWAIT, ST_DONE };

int64_t xfer_now_ms(void)
{
	return (int64_t)mono_ms();
}

/* splitmix64 of (seed, block): 8 pattern bytes per 8-byte block of the stream. */
static uint64_t pat_word(uint32_t seed, uint64_t block)
{
	uint64_t z = ((uint64_t)seed << 32 ^ block) + 0x9e3779b97f4a7c15ull * (block + 1);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t xfer_hash(uint64_t h, const void *buf, size_t len)
{
	const uint8_t *p = buf, *end = p + len;

	while (p < end)
		h = (h ^ *p++) * 0x100000001b3ull; /* the 64-bit FNV prime */
	return h;
}

void xfer_pattern_fill(uint32_t seed, uint64_t off, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		uint64_t w = pat_word(seed, off / 8);
		size_t in = off % 8, n = 8 - in;

		if (n > len)
			n = len;
		if (in == 0 && n == 8) {
			memcpy(p, &w, 8);
		} else {
			uint8_t b[8];

			memcpy(b, &w, 8);
			memcpy(p, b + in, n);
		}
		p += n;
		off += n;
		len -= n;
	}
}

ssize_t xfer_pattern_check(uint32_t seed, uint64_t off, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	size_t done = 0;

	while (done < len) {
		uint64_t w = pat_word(seed, (off + done) / 8);
		size_t in = (off + done) % 8, n = 8 - in;
		uint8_t b[8];

		if (n > len - done)
			n = len - done;
		memcpy(b, &w, 8);
		if (memcmp(p + done, b + in, n) != 0) {
			for (size_t k = 0; k < n; k++)
				if (p[done + k] != b[in + k])
					return (ssize_t)(done + k);
		}
		done += n;
	}
	return -1;
}

static const size_t wsizes[] = { 1,    7,      64,     511,    1024,   4095,   4096,
				 4097, 16384,  65535,  65536,  65537,  131072, 262144,
				 3,    100000, 262144, 200000, 262144, 32768 };
static const size_t rsizes[] = { 262144, 1, 4096, 65536, 13, 200000, 8192, 1500, 262144, 44 };
static const size_t echosizes[] = { 1, 2, 64, 1000, 4096, 4097, 65536, 100000, 262144, 17 };

size_t xfer_wsize(unsigned *i)
{
	return wsizes[(*i)++ % (sizeof(wsizes) / sizeof(wsizes[0]))];
}

size_t xfer_rsize(unsigned *i)
{
	return rsizes[(*i)++ % (sizeof(rsizes) / sizeof(rsizes[0]))];
}

static __thread uint8_t *scratch_buf[2];

void xfer_thread_done(void)
{
	for (int i = 0; i < 2; i++) {
		free(scratch_buf[i]);
		scratch_buf[i] = NULL;
	}
}

uint8_t *xfer_scratch(int which)
{
	uint8_t **buf = scratch_buf;

	if (!buf[which]) {
		buf[which] = malloc(XFER_SCRATCH);
		if (!buf[which])
			abort();
	}
	return buf[which];
}

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void init_common(struct xfer *x, int fd)
{
	memset(x, 0, sizeof(*x));
	x->fd = fd;
	x->t0 = xfer_now_ms();
	x->last_io = x->t0;
	x->trl.bad = UINT64_MAX;
	set_nonblock(fd);
}

void xfer_client_init(struct xfer *x, int fd, const struct xfer_hdr *h, const char *prelude,
		      bool connecting)
{
	init_common(x, fd);
	x->h = *h;
	x->h.magic = XFER_MAGIC;
	if (prelude)
		snprintf(x->prelude, sizeof(x->prelude), "%s", prelude);
	x->connecting = connecting;
	x->st = connecting ? ST_CONNECT : (x->prelude[0] ? ST_PRE_W : ST_HDR);
}

void xfer_server_init(struct xfer *x, int fd)
{
	init_common(x, fd);
	x->server = true;
	x->st = ST_HDR;
}

static void start_run(struct xfer *x);

void xfer_server_init_hdr(struct xfer *x, int fd, const struct xfer_hdr *h)
{
	init_common(x, fd);
	x->server = true;
	x->h = *h;
	x->hdr_off = sizeof(x->h);
	start_run(x);
}

static void finish(struct xfer *x, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void finish(struct xfer *x, bool ok, const char *fmt, ...)
{
	va_list ap;

	if (x->done)
		return;
	x->done = true;
	x->ok = ok;
	x->st = ST_DONE;
	x->t1 = xfer_now_ms();
	va_start(ap, fmt);
	vsnprintf(x->msg, sizeof(x->msg), fmt, ap);
	va_end(ap);
	if (x->fd >= 0)
		close(x->fd);
	x->fd = -1;
	free(x->echo_buf);
	x->echo_buf = NULL;
}

static const char *who(const struct xfer *x)
{
	return x->server ? "server" : "client";
}

/* One non-blocking send; Returns: bytes, -EAGAIN, or fails the session and returns -1. */
static ssize_t do_send(struct xfer *x, const void *buf, size_t len)
{
	ssize_t r = send(x->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

	if (r >= 0)
		return r;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
		return -EAGAIN;
	finish(x, false, "%s id %llu: send: %s (sent %llu, rcvd %llu)", who(x),
	       (unsigned long long)x->h.id, strerror(errno), (unsigned long long)x->sent,
	       (unsigned long long)x->rcvd);
	return -1;
}

/* One non-blocking receive; Returns: bytes, 0 on EOF, -EAGAIN, or -1 after failing. */
static ssize_t do_recv(struct xfer *x, void *buf, size_t len)
{
	ssize_t r = recv(x->fd, buf, len, MSG_DONTWAIT);

	if (r >= 0)
		return r;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
		return -EAGAIN;
	finish(x, false, "%s id %llu: recv: %s (sent %llu, rcvd %llu)", who(x),
	       (unsigned long long)x->h.id, strerror(errno), (unsigned long long)x->sent,
	       (unsigned long long)x->rcvd);
	return -1;
}

static uint32_t out_seed(const struct xfer *x)
{
	return x->server ? x->h.seed ^ 0x5a5a5a5au : x->h.seed;
}

static uint32_t in_seed(const struct xfer *x)
{
	return x->server ? x->h.seed : x->h.seed ^ 0x5a5a5a5au;
}

static uint64_t out_total(const struct xfer *x)
{
	return x->server ? x->h.s2c : x->h.c2s;
}

static uint64_t in_total(const struct xfer *x)
{
	return x->server ? x->h.c2s : x->h.s2c;
}

/* Send the next payload chunk; Returns: 1 progress, 0 would block, -1 failed. */
static int send_payload(struct xfer *x, uint64_t limit)
{
	size_t n = xfer_wsize(&x->wi);
	uint8_t *buf = xfer_scratch(0);
	ssize_t r;

	if (n > limit - x->sent)
		n = limit - x->sent;
	xfer_pattern_fill(out_seed(x), x->sent, buf, n);
	r = do_send(x, buf, n);
	if (r == -EAGAIN)
		return 0;
	if (r < 0)
		return -1;
	x->sent += r;
	return 1;
}

/* Receive and verify the next payload chunk; Returns: 1 progress, 0 would block, 2 EOF, -1. */
static int recv_payload(struct xfer *x, uint64_t limit)
{
	size_t n = xfer_rsize(&x->ri);
	uint8_t *buf = xfer_scratch(1);
	ssize_t r, bad;

	if (n > limit - x->rcvd)
		n = limit - x->rcvd;
	r = do_recv(x, buf, n);
	if (r == -EAGAIN)
		return 0;
	if (r < 0)
		return -1;
	if (r == 0)
		return 2;
	bad = xfer_pattern_check(in_seed(x), x->rcvd, buf, r);
	if (bad >= 0) {
		finish(x, false, "%s id %llu: data mismatch at byte %llu of %llu (got 0x%02x)",
		       who(x), (unsigned long long)x->h.id, (unsigned long long)(x->rcvd + bad),
		       (unsigned long long)in_total(x), buf[bad]);
		return -1;
	}
	x->rcvd += r;
	return 1;
}

static void start_run(struct xfer *x)
{
	x->st = ST_RUN;
	if (x->server && x->h.mode == XM_ECHO) {
		x->echo_buf = malloc(XFER_SCRATCH);
		if (!x->echo_buf)
			finish(x, false, "echo: out of memory");
	}
	if (!x->server && x->h.mode == XM_ECHO)
		x->echo_out = 0; /* end of the current ping chunk */
}

static int fail_eof(struct xfer *x, const char *what)
{
	finish(x, false, "%s id %llu: EOF %s (sent %llu/%llu, rcvd %llu/%llu)", who(x),
	       (unsigned long long)x->h.id, what, (unsigned long long)x->sent,
	       (unsigned long long)out_total(x), (unsigned long long)x->rcvd,
	       (unsigned long long)in_total(x));
	return -1;
}

/* Receive the server's trailer (client side); Returns like recv_payload, 3 when complete. */
static int recv_trailer(struct xfer *x)
{
	uint8_t *p = (uint8_t *)&x->trl;
	ssize_t r = do_recv(x, p + x->trl_off, sizeof(x->trl) - x->trl_off);

	if (r == -EAGAIN)
		return 0;
	if (r < 0)
		return -1;
	if (r == 0)
		return fail_eof(x, "before the server's trailer");
	x->trl_off += r;
	if (x->trl_off < sizeof(x->trl))
		return 1;
	if (x->trl.magic != XFER_TRL_MAGIC) {
		finish(x, false, "client id %llu: bad trailer magic 0x%x",
		       (unsigned long long)x->h.id, x->trl.magic);
		return -1;
	}
	if (x->trl.status != 0 || x->trl.got != x->h.c2s) {
		finish(x, false, "client id %llu: server reports status %d, got %llu of %llu",
		       (unsigned long long)x->h.id, x->trl.status, (unsigned long long)x->trl.got,
		       (unsigned long long)x->h.c2s);
		return -1;
	}
	return 3;
}

static int step_client_stream(struct xfer *x, short *want)
{
	int prog = 0, r;
	bool half = x->h.mode == XM_HALFCLOSE;

	if (x->sent < x->h.c2s) {
		r = send_payload(x, x->h.c2s);
		if (r < 0)
			return -1;
		if (r == 0)
			*want |= POLLOUT;
		prog |= r;
	}
	if (half && x->sent == x->h.c2s && !x->eof) {
		/* x->eof doubles as "SHUT_WR done" on the client. */
		if (shutdown(x->fd, SHUT_WR) < 0) {
			finish(x, false, "client id %llu: shutdown(SHUT_WR): %s",
			       (unsigned long long)x->h.id, strerror(errno));
			return -1;
		}
		x->eof = true;
		prog = 1;
	}
	if (x->rcvd < x->h.s2c) {
		r = recv_payload(x, x->h.s2c);
		if (r < 0)
			return -1;
		if (r == 2)
			return fail_eof(x, "before all payload");
		if (r == 0)
			*want |= POLLIN;
		prog |= r;
	} else if (x->trl_off < sizeof(x->trl)) {
		r = recv_trailer(x);
		if (r < 0)
			return -1;
		if (r == 0)
			*want |= POLLIN;
		prog |= r != 0;
	}
	if (x->sent == x->h.c2s && x->rcvd == x->h.s2c && x->trl_off == sizeof(x->trl)) {
		if (!half) {
			finish(x, true, "ok");
			return 1;
		}
		x->st = ST_EOFWAIT;
		return 1;
	}
	return prog;
}

static int step_client_echo(struct xfer *x, short *want)
{
	int prog = 0;

	if (x->sent == x->rcvd && x->rcvd < x->h.c2s && x->echo_out == x->sent) {
		size_t n = echosizes[x->wi++ % (sizeof(echosizes) / sizeof(echosizes[0]))];

		if (n > x->h.c2s - x->sent)
			n = x->h.c2s - x->sent;
		x->echo_out = x->sent + n;
	}
	if (x->sent < x->echo_out) {
		uint8_t *buf = xfer_scratch(0);
		size_t n = x->echo_out - x->sent;
		ssize_t s;

		xfer_pattern_fill(x->h.seed, x->sent, buf, n);
		s = do_send(x, buf, n);
		if (s == -EAGAIN)
			*want |= POLLOUT;
		else if (s < 0)
			return -1;
		else
			x->sent += s, prog = 1;
	}
	if (x->rcvd < x->sent) {
		uint8_t *buf = xfer_scratch(1);
		ssize_t s = do_recv(x, buf, x->sent - x->rcvd), bad;

		if (s == -EAGAIN) {
			*want |= POLLIN;
		} else if (s < 0) {
			return -1;
		} else if (s == 0) {
			return fail_eof(x, "while waiting for the echo");
		} else {
			bad = xfer_pattern_check(x->h.seed, x->rcvd, buf, s);
			if (bad >= 0) {
				finish(x, false, "client id %llu: echo mismatch at byte %llu",
				       (unsigned long long)x->h.id,
				       (unsigned long long)(x->rcvd + bad));
				return -1;
			}
			x->rcvd += s;
			prog = 1;
		}
	}
	if (x->rcvd == x->h.c2s) {
		finish(x, true, "ok");
		return 1;
	}
	return prog;
}

static int step_server_echo(struct xfer *x, short *want)
{
	int prog = 0;

	if (x->echo_off < x->echo_len) {
		ssize_t s = do_send(x, x->echo_buf + x->echo_off, x->echo_len - x->echo_off);

		if (s == -EAGAIN) {
			*want |= POLLOUT;
		} else if (s < 0) {
			return -1;
		} else {
			x->echo_off += s;
			x->sent += s;
			prog = 1;
		}
	}
	if (x->echo_off == x->echo_len) {
		ssize_t s, bad;

		x->echo_off = x->echo_len = 0;
		s = do_recv(x, x->echo_buf, 262144);
		if (s == -EAGAIN) {
			*want |= POLLIN;
		} else if (s < 0) {
			return -1;
		} else if (s == 0) {
			/* c2s == UINT64_MAX: echo until the client closes. */
			if (x->rcvd != x->h.c2s && x->h.c2s != UINT64_MAX)
				return fail_eof(x, "before all echo bytes");
			finish(x, true, "ok");
			return 1;
		} else {
			bad = xfer_pattern_check(x->h.seed, x->rcvd, x->echo_buf, s);
			if (bad >= 0) {
				finish(x, false, "server id %llu: echo input mismatch at byte %llu",
				       (unsigned long long)x->h.id,
				       (unsigned long long)(x->rcvd + bad));
				return -1;
			}
			x->rcvd += s;
			x->echo_len = s;
			prog = 1;
		}
	}
	return prog;
}

static int step_server_stream(struct xfer *x, short *want)
{
	int prog = 0, r;
	bool half = x->h.mode == XM_HALFCLOSE;

	if (x->rcvd < x->h.c2s) {
		r = recv_payload(x, x->h.c2s);
		if (r < 0)
			return -1;
		if (r == 2)
			return fail_eof(x, "before all payload");
		if (r == 0)
			*want |= POLLIN;
		prog |= r;
	} else if (half && !x->eof) {
		uint8_t b;
		ssize_t s = do_recv(x, &b, 1);

		if (s == -EAGAIN)
			*want |= POLLIN;
		else if (s < 0)
			return -1;
		else if (s > 0) {
			finish(x, false, "server id %llu: byte after the announced payload",
			       (unsigned long long)x->h.id);
			return -1;
		} else {
			x->eof = true;
			prog = 1;
		}
	}
	/* HALFCLOSE: the server sends only once the client's SHUT_WR arrived. */
	if (x->sent < x->h.s2c && (!half || x->eof)) {
		r = send_payload(x, x->h.s2c);
		if (r < 0)
			return -1;
		if (r == 0)
			*want |= POLLOUT;
		prog |= r;
	}
	if (x->rcvd == x->h.c2s && x->sent == x->h.s2c && (!half || x->eof)) {
		x->trl.magic = XFER_TRL_MAGIC;
		x->trl.status = 0;
		x->trl.got = x->rcvd;
		x->trl.bad = UINT64_MAX;
		x->trl_off = 0;
		x->st = ST_TRL_OUT;
		return 1;
	}
	return prog;
}

static int step(struct xfer *x, short *want)
{
	ssize_t r;

	switch (x->st) {
	case ST_CONNECT: {
		struct pollfd p = { .fd = x->fd, .events = POLLOUT };
		int err = 0;
		socklen_t el = sizeof(err);

		if (poll(&p, 1, 0) == 0) {
			*want |= POLLOUT;
			return 0;
		}
		if (getsockopt(x->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
			err = errno;
		if (err) {
			finish(x, false, "client id %llu: connect: %s", (unsigned long long)x->h.id,
			       strerror(err));
			return -1;
		}
		x->st = x->prelude[0] ? ST_PRE_W : ST_HDR;
		return 1;
	}
	case ST_PRE_W:
		r = do_send(x, x->prelude + x->pre_off, strlen(x->prelude) - x->pre_off);
		if (r == -EAGAIN) {
			*want |= POLLOUT;
			return 0;
		}
		if (r < 0)
			return -1;
		x->pre_off += r;
		if (x->pre_off == strlen(x->prelude))
			x->st = ST_PRE_R;
		return 1;
	case ST_PRE_R: {
		char c;

		r = do_recv(x, &c, 1);
		if (r == -EAGAIN) {
			*want |= POLLIN;
			return 0;
		}
		if (r < 0)
			return -1;
		if (r == 0) {
			x->line[x->line_len] = 0;
			finish(x, false, "client id %llu: uvsockd closed during the handshake%s%s",
			       (unsigned long long)x->h.id, x->line_len ? " after: " : "", x->line);
			return -1;
		}
		if (c != '\n') {
			if (x->line_len + 1 >= sizeof(x->line)) {
				finish(x, false, "handshake reply too long");
				return -1;
			}
			x->line[x->line_len++] = c;
			return 1;
		}
		x->line[x->line_len] = 0;
		if (strncmp(x->line, "OK ", 3) != 0) {
			finish(x, false, "client id %llu: handshake reply '%s'",
			       (unsigned long long)x->h.id, x->line);
			return -1;
		}
		x->st = ST_HDR;
		return 1;
	}
	case ST_HDR:
		if (!x->server) {
			r = do_send(x, (uint8_t *)&x->h + x->hdr_off, sizeof(x->h) - x->hdr_off);
			if (r == -EAGAIN) {
				*want |= POLLOUT;
				return 0;
			}
		} else {
			r = do_recv(x, (uint8_t *)&x->h + x->hdr_off, sizeof(x->h) - x->hdr_off);
			if (r == -EAGAIN) {
				*want |= POLLIN;
				return 0;
			}
			if (r == 0)
				return fail_eof(x, "before the session header");
		}
		if (r < 0)
			return -1;
		x->hdr_off += r;
		if (x->hdr_off < sizeof(x->h))
			return 1;
		if (x->server &&
		    (x->h.magic != XFER_MAGIC || (x->h.mode != XM_DUPLEX && x->h.mode != XM_ECHO &&
						  x->h.mode != XM_HALFCLOSE))) {
			finish(x, false, "server: bad session header (magic 0x%x mode %u)",
			       x->h.magic, x->h.mode);
			return -1;
		}
		start_run(x);
		return 1;
	case ST_RUN:
		if (x->h.mode == XM_ECHO)
			return x->server ? step_server_echo(x, want) : step_client_echo(x, want);
		return x->server ? step_server_stream(x, want) : step_client_stream(x, want);
	case ST_TRL_OUT:
		r = do_send(x, (uint8_t *)&x->trl + x->trl_off, sizeof(x->trl) - x->trl_off);
		if (r == -EAGAIN) {
			*want |= POLLOUT;
			return 0;
		}
		if (r < 0)
			return -1;
		x->trl_off += r;
		if (x->trl_off < sizeof(x->trl))
			return 1;
		if (x->h.mode == XM_HALFCLOSE) {
			/* Our SHUT_WR: the client must see EOF after the trailer. */
			if (shutdown(x->fd, SHUT_WR) < 0) {
				finish(x, false, "server: shutdown(SHUT_WR): %s", strerror(errno));
				return -1;
			}
			finish(x, true, "ok");
			return 1;
		}
		x->st = ST_EOFWAIT;
		return 1;
	case ST_EOFWAIT: {
		uint8_t b[64];

		r = do_recv(x, b, sizeof(b));
		if (r == -EAGAIN) {
			*want |= POLLIN;
			return 0;
		}
		if (r < 0)
			return -1;
		if (r > 0) {
			finish(x, false, "%s id %llu: %zd unexpected bytes after the end", who(x),
			       (unsigned long long)x->h.id, r);
			return -1;
		}
		finish(x, true, "ok");
		return 1;
	}
	default:
		return 0;
	}
}

/* Make progress on @x until it would block; sets x->want (poll events), 0 when done. */
static short pump(struct xfer *x)
{
	for (int guard = 0; guard < 32 && !x->done; guard++) {
		short want = 0;
		int r = step(x, &want);

		if (r < 0 || x->done)
			return 0;
		if (r == 0)
			return want ? want : POLLIN;
	}
	return x->done ? 0 : POLLIN | POLLOUT;
}

int xfer_hint_fd = -1;

int xfer_run(struct xfer *v, size_t *n, size_t cap, int lfd, size_t accept_n, int64_t deadline_ms,
	     char *why, size_t why_len)
{
	size_t accepted = 0;
	bool hint = xfer_hint_fd >= 0;
	struct pollfd *p = calloc(cap + 2, sizeof(*p));
	short *want = calloc(cap + 1, sizeof(*want));
	int bad = 0;

	if (why && why_len)
		why[0] = 0;
	if (!p || !want) {
		free(p);
		free(want);
		for (size_t i = 0; i < *n; i++)
			finish(&v[i], false, "out of memory");
		return (int)*n;
	}
	if (lfd >= 0)
		set_nonblock(lfd);
	for (size_t i = 0; i < *n; i++)
		want[i] = pump(&v[i]);

	for (;;) {
		size_t np = 0, live = 0;
		int64_t now = xfer_now_ms();
		int timeout, r;

		for (size_t i = 0; i < *n; i++) {
			if (v[i].done)
				continue;
			live++;
			p[np].fd = v[i].fd;
			p[np].events = want[i];
			p[np].revents = 0;
			np++;
		}
		if (lfd >= 0 && accepted < accept_n) {
			p[np].fd = lfd;
			p[np].events = POLLIN;
			p[np].revents = 0;
			np++;
		}
		if (np == 0)
			break;
		size_t hint_i = np;

		if (hint) {
			p[np].fd = xfer_hint_fd;
			p[np].events = POLLIN;
			p[np].revents = 0;
			np++;
		}
		if (now >= deadline_ms)
			break;
		for (size_t i = 0; i < *n; i++) {
			if (!v[i].done && now - v[i].last_io > XFER_STALL_MS)
				finish(&v[i], false,
				       "%s id %llu: no progress for %d s (sent %llu/%llu, "
				       "rcvd %llu/%llu)",
				       who(&v[i]), (unsigned long long)v[i].h.id,
				       XFER_STALL_MS / 1000, (unsigned long long)v[i].sent,
				       (unsigned long long)out_total(&v[i]),
				       (unsigned long long)v[i].rcvd,
				       (unsigned long long)in_total(&v[i]));
		}
		timeout = deadline_ms - now > 1000 ? 1000 : (int)(deadline_ms - now);
		r = poll(p, np, timeout);
		if (r < 0 && errno != EINTR)
			break;
		if (r <= 0)
			continue;
		if (hint && p[hint_i].revents) {
			/* The other end's owner answered: finish soon, whatever the deadline. */
			hint = false;
			if (deadline_ms > xfer_now_ms() + 10000)
				deadline_ms = xfer_now_ms() + 10000;
		}
		/* Sessions in the same order as they were put into p. */
		size_t k = 0;

		for (size_t i = 0; i < *n; i++) {
			if (v[i].done)
				continue;
			if (p[k].revents) {
				uint64_t before =
					v[i].sent + v[i].rcvd + v[i].hdr_off + v[i].trl_off;

				want[i] = pump(&v[i]);
				if (v[i].sent + v[i].rcvd + v[i].hdr_off + v[i].trl_off != before)
					v[i].last_io = xfer_now_ms();
			}
			k++;
		}
		if (lfd >= 0 && accepted < accept_n && (p[k].revents & POLLIN)) {
			for (;;) {
				int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

				if (c < 0)
					break;
				if (*n >= cap) {
					close(c);
					break;
				}
				xfer_server_init(&v[*n], c);
				want[*n] = pump(&v[*n]);
				(*n)++;
				if (++accepted == accept_n)
					break;
			}
		}
		(void)live;
	}
	for (size_t i = 0; i < *n; i++) {
		if (!v[i].done) {
			finish(&v[i], false, "%s id %llu: timeout (sent %llu/%llu, rcvd %llu/%llu)",
			       who(&v[i]), (unsigned long long)v[i].h.id,
			       (unsigned long long)v[i].sent, (unsigned long long)out_total(&v[i]),
			       (unsigned long long)v[i].rcvd, (unsigned long long)in_total(&v[i]));
		}
		if (!v[i].ok)
			bad++;
	}
	if (lfd >= 0 && accepted < accept_n) {
		bad += (int)(accept_n - accepted);
		if (why && why_len)
			snprintf(why, why_len, "only %zu of %zu connections arrived", accepted,
				 accept_n);
	}
	free(p);
	free(want);
	return bad;
}

void xfer_summary(const struct xfer *v, size_t n, char *out, size_t len)
{
	size_t ok = 0;
	const struct xfer *first = NULL;

	for (size_t i = 0; i < n; i++) {
		if (v[i].ok)
			ok++;
		else if (!first)
			first = &v[i];
	}
	if (first)
		snprintf(out, len, "%zu/%zu ok; first failure: %s", ok, n, first->msg);
	else
		snprintf(out, len, "%zu/%zu ok", ok, n);
}

/* ---- SEQPACKET ---- */

static const size_t seqsizes[] = { 1,	 2,    3,    44,    64,	   100,	  1000,	 3732,	 3733,
				   4096, 4097, 8192, 32768, 65535, 65536, 65537, 100000, 131072 };
#define NSEQ (sizeof(seqsizes) / sizeof(seqsizes[0]))
#define SEQ_MAX (131072 + 64)

static int seq_send(int fd, const void *buf, size_t len, int flags)
{
	ssize_t r = send(fd, buf, len, MSG_NOSIGNAL | flags);

	if (r < 0)
		return -errno;
	if ((size_t)r != len)
		return -EMSGSIZE;
	return 0;
}

/* Receive one message; Returns: length (per recvmsg), with *mflags = msg_flags, or -errno. */
static ssize_t seq_recv(int fd, void *buf, size_t len, int flags, int *mflags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t r = recvmsg(fd, &m, flags);

	if (r < 0)
		return -errno;
	*mflags = m.msg_flags;
	return r;
}

/* Both sides: send the three truncation probes. */
static int seq_trunc_send(int fd, uint32_t seed, char *msg, size_t len)
{
	uint8_t *buf = xfer_scratch(0);
	int r;

	xfer_pattern_fill(seed + 7777, 0, buf, 1000);
	if ((r = seq_send(fd, buf, 1000, 0)) || (r = seq_send(fd, buf, 1000, 0)) ||
	    (r = seq_send(fd, "DONE!", 5, 0))) {
		snprintf(msg, len, "truncation probe send: %s", strerror(-r));
		return -1;
	}
	return 0;
}

/* Both sides: read the probes: short buffer -> MSG_TRUNC; MSG_TRUNC flag -> real length. */
static int seq_trunc_recv(int fd, uint32_t seed, const char *side, char *msg, size_t len)
{
	uint8_t *buf = xfer_scratch(1);
	int mf = 0;
	ssize_t r;

	r = seq_recv(fd, buf, 100, 0, &mf);
	if (r != 100 || !(mf & MSG_TRUNC) || xfer_pattern_check(seed + 7777, 0, buf, 100) >= 0) {
		snprintf(msg, len, "%s: short read of a 1000-byte message: ret %zd%s%s", side, r,
			 r < 0 ? strerror((int)-r) : "", (mf & MSG_TRUNC) ? "" : ", no MSG_TRUNC");
		return -1;
	}
	r = seq_recv(fd, buf, 100, MSG_TRUNC, &mf);
	if (r != 1000) {
		snprintf(msg, len, "%s: recv(MSG_TRUNC) of a 1000-byte message returned %zd (%s)",
			 side, r, r < 0 ? strerror((int)-r) : "want 1000");
		return -1;
	}
	r = seq_recv(fd, buf, 100, 0, &mf);
	if (r != 5 || memcmp(buf, "DONE!", 5) != 0) {
		snprintf(msg, len,
			 "%s: after truncated messages expected the 5-byte marker, got %zd", side,
			 r);
		return -1;
	}
	return 0;
}

int xfer_seq_client(int fd, uint32_t seed, uint32_t flags, int timeout_ms, char *msg, size_t len)
{
	struct xfer_hdr h = { .magic = XFER_MAGIC, .mode = XM_SEQ, .seed = seed, .flags = flags };
	uint8_t *out = xfer_scratch(0), *in = xfer_scratch(1);
	unsigned eor_seen = 0, eor_sent = 0;
	int r, mf = 0;
	ssize_t got;

	set_timeouts(fd, timeout_ms);
	h.c2s = NSEQ;
	if ((r = seq_send(fd, &h, sizeof(h), 0))) {
		snprintf(msg, len, "client: header send: %s", strerror(-r));
		return -1;
	}
	for (size_t i = 0; i < NSEQ; i++) {
		size_t sz = seqsizes[i];
		int eor = (i & 1) ? MSG_EOR : 0;

		xfer_pattern_fill(seed + (uint32_t)i, 0, out, sz);
		if ((r = seq_send(fd, out, sz, eor))) {
			snprintf(msg, len, "client: send of %zu-byte message #%zu: %s", sz, i,
				 strerror(-r));
			return -1;
		}
		eor_sent += !!eor;
		got = seq_recv(fd, in, SEQ_MAX, 0, &mf);
		if (got < 0) {
			snprintf(msg, len, "client: recv of echo #%zu (%zu B): %s", i, sz,
				 strerror((int)-got));
			return -1;
		}
		if ((size_t)got != sz || (mf & MSG_TRUNC)) {
			snprintf(msg, len,
				 "client: echo #%zu: boundary broken: sent %zu B, got %zd B%s", i,
				 sz, got, (mf & MSG_TRUNC) ? " MSG_TRUNC" : "");
			return -1;
		}
		if (xfer_pattern_check(seed + (uint32_t)i, 0, in, sz) >= 0) {
			snprintf(msg, len, "client: echo #%zu (%zu B): content mismatch", i, sz);
			return -1;
		}
		if (!!(mf & MSG_EOR) == !!eor)
			eor_seen++;
		else if (flags & XF_CHECK_EOR) {
			snprintf(msg, len, "client: echo #%zu: MSG_EOR %s but sender %s it", i,
				 (mf & MSG_EOR) ? "set" : "missing", eor ? "set" : "did not set");
			return -1;
		}
	}
	if (seq_trunc_recv(fd, seed, "client", msg, len) || seq_trunc_send(fd, seed, msg, len))
		return -1;
	/* The server acknowledges the probes, so closing cannot race with them. */
	got = seq_recv(fd, in, 16, 0, &mf);
	if (got != 3 || memcmp(in, "BYE", 3) != 0) {
		snprintf(msg, len, "client: expected the server's BYE, got %zd%s%s", got,
			 got < 0 ? " " : "", got < 0 ? strerror((int)-got) : "");
		return -1;
	}
	snprintf(msg, len,
		 "%zu messages 1 B..128 KiB, MSG_TRUNC ok, MSG_EOR matched %u/%zu (sent %u)", NSEQ,
		 eor_seen, NSEQ, eor_sent);
	return 0;
}

int xfer_seq_server_hdr(int fd, const struct xfer_hdr *h, int timeout_ms, char *msg, size_t len)
{
	uint8_t *in = xfer_scratch(1);
	int r, mf = 0;
	ssize_t got;

	set_timeouts(fd, timeout_ms);
	if (h->magic != XFER_MAGIC || h->mode != XM_SEQ || h->c2s != NSEQ) {
		snprintf(msg, len, "server: bad seqpacket header");
		return -1;
	}
	for (size_t i = 0; i < NSEQ; i++) {
		size_t sz = seqsizes[i];
		int eor = (i & 1) ? MSG_EOR : 0;

		got = seq_recv(fd, in, SEQ_MAX, 0, &mf);
		if (got < 0) {
			snprintf(msg, len, "server: recv #%zu (%zu B): %s", i, sz,
				 strerror((int)-got));
			return -1;
		}
		if ((size_t)got != sz || (mf & MSG_TRUNC)) {
			snprintf(msg, len,
				 "server: message #%zu: boundary broken: sent %zu B, got %zd B", i,
				 sz, got);
			return -1;
		}
		if (xfer_pattern_check(h->seed + (uint32_t)i, 0, in, sz) >= 0) {
			snprintf(msg, len, "server: message #%zu (%zu B): content mismatch", i, sz);
			return -1;
		}
		if ((h->flags & XF_CHECK_EOR) && !!(mf & MSG_EOR) != !!eor) {
			snprintf(msg, len, "server: message #%zu: MSG_EOR %s but sender %s it", i,
				 (mf & MSG_EOR) ? "set" : "missing", eor ? "set" : "did not set");
			return -1;
		}
		if ((r = seq_send(fd, in, sz, eor))) {
			snprintf(msg, len, "server: echo #%zu: %s", i, strerror(-r));
			return -1;
		}
	}
	if (seq_trunc_send(fd, h->seed, msg, len) ||
	    seq_trunc_recv(fd, h->seed, "server", msg, len))
		return -1;
	if ((r = seq_send(fd, "BYE", 3, 0))) {
		snprintf(msg, len, "server: BYE: %s", strerror(-r));
		return -1;
	}
	got = seq_recv(fd, in, 16, 0, &mf);
	if (got != 0) {
		snprintf(msg, len, "server: expected EOF after BYE, got %zd%s%s", got,
			 got < 0 ? " " : "", got < 0 ? strerror((int)-got) : "");
		return -1;
	}
	snprintf(msg, len, "ok");
	return 0;
}

int xfer_seq_server(int fd, int timeout_ms, char *msg, size_t len)
{
	struct xfer_hdr h;
	int mf;
	ssize_t got;

	set_timeouts(fd, timeout_ms);
	got = seq_recv(fd, &h, sizeof(h), 0, &mf);
	if (got != (ssize_t)sizeof(h)) {
		snprintf(msg, len, "server: header message: got %zd%s%s", got, got < 0 ? " " : "",
			 got < 0 ? strerror((int)-got) : "");
		return -1;
	}
	return xfer_seq_server_hdr(fd, &h, timeout_ms, msg, len);
}

/* ---- control channel and helpers ---- */

int ctl_send(struct ctl *c, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	for (int off = 0; off < n;) {
		ssize_t r = write(c->fd, line + off, n - off);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = c->fd, .events = POLLOUT };

				poll(&p, 1, 1000);
				continue;
			}
			return -errno;
		}
		off += r;
	}
	return 0;
}

int ctl_recv(struct ctl *c, char *out, size_t len, int64_t deadline_ms)
{
	if (len == 0)
		return -EINVAL;
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);

		if (nl) {
			size_t l = nl - c->buf;

			if (l > 0 && c->buf[l - 1] == '\r')
				c->buf[l - 1] = 0;
			if (l >= len)
				l = len - 1;
			memcpy(out, c->buf, l);
			out[l] = 0;
			if (l > 0 && out[l - 1] == '\r')
				out[--l] = 0;
			c->len -= (nl - c->buf) + 1;
			memmove(c->buf, nl + 1, c->len);
			return (int)l;
		}
		if (c->len == sizeof(c->buf))
			c->len = 0; /* overlong garbage: drop it */
		int64_t left = deadline_ms - xfer_now_ms();

		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);

		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		ssize_t n = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);

		if (n == 0)
			return -EPIPE;
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		c->len += n;
	}
}

void set_timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

int send_full(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t r = send(fd, p, len, MSG_NOSIGNAL);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += r;
		len -= r;
	}
	return 0;
}

int recv_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t r = recv(fd, p, len, 0);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EPIPE;
		p += r;
		len -= r;
	}
	return 0;
}

bool xfer_tcp_listening(unsigned port)
{
	char line[256], want[16];
	bool found = false;
	FILE *f = fopen("/proc/net/tcp", "r");

	snprintf(want, sizeof(want), ":%04X", port);
	while (f && !found && fgets(line, sizeof(line), f)) {
		char local[64], remote[64], st[8];

		if (sscanf(line, "%*s %63s %63s %7s", local, remote, st) == 3 &&
		    strstr(local, want) && strcmp(st, "0A") == 0)
			found = true;
	}
	if (f)
		fclose(f);
	return found;
}
