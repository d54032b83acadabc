/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the state record (src/util/rec.h) and the engine's restore from it
 * (src/vsock/save.c, vsock_engine_restore). The first input byte picks how the rest is read:
 *
 *   0  as a record exactly as given: rec_open() (almost every input stops at the header checks
 *      or the checksum, which is what those checks are for), then a walk of every item at every
 *      depth through the typed getters, then a restore into a fresh engine;
 *   1  the same after the header's length and checksum are set right, so that the item walk
 *      and the engine's decoders (the restore, and crash survival's list of connections,
 *      vsock_engine_read_conns) see the mutated bodies.
 *
 * The record may name up to 4 fds (fake numbers: nothing is done with them). Invariants: a
 * refused record leaves the engine empty (no socket, nothing to pull, no timer) with a message;
 * a restored engine can be driven (every packet pulled, timers run past their deadlines) and
 * saved again, and that record restores into a second fresh engine with the same sockets.
 * Nothing may crash, hang or leak.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-input.h"
#include "util/rec.h"
#include "vsock/engine.h"

#define FZ_FDS 4
#define FZ_MAX_SOCKS 64
#define FZ_ADOPT_MAX FZ_MAX_SOCKS

static uint64_t fz_clock;

static uint64_t fz_now(void *opaque)
{
	(void)opaque;
	return fz_clock;
}

static const struct vsock_engine_ops fz_ops = {.now = fz_now};

static struct vsock_engine *fz_engine(void)
{
	struct vsock_engine_config cfg;
	struct vsock_engine *e = NULL;

	vsock_engine_config_default(&cfg);
	cfg.ops = &fz_ops;
	cfg.max_socks = FZ_MAX_SOCKS;
	cfg.reply_limit = 16;
	cfg.dgram = true;
	FZ_CHECK(vsock_engine_new(&cfg, &e) == 0);
	return e;
}

struct adopted {
	unsigned n;
	struct vsock_sock *s[FZ_ADOPT_MAX];
};

static void fz_adopt(void *arg, struct vsock_sock *s)
{
	struct adopted *a = arg;

	FZ_CHECK(a->n < FZ_ADOPT_MAX);
	a->s[a->n++] = s;
}

static void adopted_close(struct adopted *a)
{
	for (unsigned i = 0; i < a->n; i++)
		vsock_sock_close(a->s[i]);
	a->n = 0;
}

/* Every item at every depth, through the getters that apply to any item. */
static void walk(struct rec_reader *r)
{
	struct rec_item it;

	while (rec_next(r, &it) > 0) {
		struct rec_reader sub;
		uint32_t u32;
		uint64_t u64;
		int fd;

		(void)rec_get_u32(r, &it, &u32);
		(void)rec_get_u64(r, &it, &u64);
		if (rec_get_fd(r, &it, &fd) == 0)
			FZ_CHECK(fd >= 100 && fd < 100 + FZ_FDS);
		if (rec_enter(r, &it, "item", &sub) == 0)
			walk(&sub);
	}
}

static bool engine_empty(struct vsock_engine *e)
{
	struct vsock_engine_stats st;

	vsock_engine_get_stats(e, &st);
	return st.socks_open == 0 && st.socks_total == 0 && !vsock_engine_has_pending(e) &&
	       vsock_engine_next_deadline(e) == UINT64_MAX;
}

/* Drives a restored engine: pulls what it has, runs its timers, pulls again. */
static void drive(struct vsock_engine *e)
{
	static uint8_t buf[65536];
	struct vsock_hdr h;
	struct iovec iov = {buf, sizeof(buf)};

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 4096 && vsock_engine_pull(e, &h, &iov, 1, sizeof(buf)) >= 0; i++)
			FZ_CHECK(h.len <= sizeof(buf));
		fz_clock += 10ull * 1000000000ull; /* past every default timer */
		vsock_engine_run_timers(e);
	}
}

/* Saves e and restores the record into a fresh engine: it must be accepted. */
static void resave(struct vsock_engine *e)
{
	struct vsock_engine_stats st1, st2;
	struct adopted a2 = {0};
	struct vsock_engine *e2;
	struct rec_writer w;
	struct rec_reader r;
	struct rec_doc d;
	const uint8_t *b;
	size_t len;

	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	FZ_CHECK(vsock_engine_save(e, &w) == 0);
	FZ_CHECK(rec_writer_finish(&w, &b, &len) == 0);
	FZ_CHECK(rec_open(&d, b, len, REC_KIND_ENGINE, 1, 1, NULL, 0) == 0);
	e2 = fz_engine();
	rec_root(&d, &r, "engine");
	if (vsock_engine_restore(e2, &r, fz_adopt, &a2) != 0) {
		fprintf(stderr, "re-saved record refused: %s\n", rec_error(&d));
		FZ_CHECK(0);
	}
	vsock_engine_get_stats(e, &st1);
	vsock_engine_get_stats(e2, &st2);
	FZ_CHECK(st1.socks_open == st2.socks_open);
	rec_doc_fini(&d);
	rec_writer_free(&w);
	adopted_close(&a2);
	vsock_engine_free(e2);
}

static void try_restore(const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
	struct adopted a = {0};
	struct vsock_engine *e;
	struct rec_reader r;
	struct rec_doc d;
	int k;

	if (rec_open(&d, buf, len, REC_KIND_ENGINE, 1, 1, fds, nfds) < 0) {
		FZ_CHECK(rec_error(&d)[0] != '\0');
		return;
	}
	rec_root(&d, &r, "body");
	walk(&r);
	rec_doc_fini(&d);
	/* The same body as crash survival's list of connections. */
	FZ_CHECK(rec_open(&d, buf, len, REC_KIND_ENGINE, 1, 1, fds, nfds) == 0);
	rec_root(&d, &r, "connections");
	{
		struct vsock_conn_addr *ca = NULL;
		size_t n = 0;

		if (vsock_engine_read_conns(&r, 64, &ca, &n) == 0) {
			FZ_CHECK(n <= 64 && (n == 0 || ca != NULL));
			for (size_t i = 0; i < n; i++)
				FZ_CHECK(ca[i].type == VSOCK_TYPE_STREAM ||
					 ca[i].type == VSOCK_TYPE_SEQPACKET);
			free(ca);
		} else {
			FZ_CHECK(rec_error(&d)[0] != '\0');
		}
	}
	rec_doc_fini(&d);

	FZ_CHECK(rec_open(&d, buf, len, REC_KIND_ENGINE, 1, 1, fds, nfds) == 0);
	fz_clock = 1000000000ull;
	e = fz_engine();
	rec_root(&d, &r, "engine");
	k = vsock_engine_restore(e, &r, fz_adopt, &a);
	if (k < 0) {
		FZ_CHECK(rec_error(&d)[0] != '\0');
		FZ_CHECK(a.n == 0);
		FZ_CHECK(engine_empty(e));
	} else {
		resave(e);
		drive(e);
		adopted_close(&a);
		drive(e);
	}
	rec_doc_fini(&d);
	vsock_engine_free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int fds[FZ_FDS] = {100, 101, 102, 103};
	uint8_t *copy;
	size_t len, nfds;

	if (size < 1)
		return 0;
	len = size - 1;
	copy = malloc(len ? len : 1);
	FZ_CHECK(copy != NULL);
	memcpy(copy, data + 1, len);
	/* The fds that "came with" the record: what its header says, within FZ_FDS. */
	nfds = len >= REC_HDR_SIZE ? copy[24] % (FZ_FDS + 1) : 0;
	if (data[0] & 1 && len >= REC_HDR_SIZE) {
		for (int i = 0; i < 8; i++)
			copy[16 + i] = (uint8_t)((uint64_t)len >> (8 * i));
		for (int i = 0; i < 4; i++)
			copy[24 + i] = i == 0 ? (uint8_t)nfds : 0;
		rec_reseal(copy, len);
	}
	try_restore(copy, len, fds, nfds);
	free(copy);
	return 0;
}
