/* SPDX-License-Identifier: MIT */
/*
 * test-sim: runs seeded simulations of two vsock engines (see sim.h) and prints TAP.
 *
 *   test-sim --seeds N [--first S]    seeds S..S+N-1 (S defaults to 1); one TAP line per batch
 *                                     of seeds (per seed when N <= 50)
 *   test-sim --seed K [--verbose]     seed K alone; --verbose prints its step trace
 *   --steps M                         steps per seed before the drain (default: per seed,
 *                                     300..1800)
 *   --twice                           runs every seed twice and checks both traces are equal
 *                                     (the run is deterministic)
 *   --seqpacket-shrink                accepted and ignored (it is the default now; old replay
 *                                     lines carry it)
 *
 * A seed runs the scheduler for its steps (network, clock and application actions chosen by a
 * splitmix64 generator seeded from the seed), then drains: the applications stop, shut down,
 * read to the end and close, the network delivers everything and the clock runs the timers out.
 * It passes if no check failed on the way and, at the end, both engines hold no socket, no
 * packet and no timer. A failure prints the seed, the step, why, the state of both engines and
 * the command that replays it.
 *
 * Applications lower buffer sizes at random, SEQPACKET ones too, also while a message is partly
 * sent or partly received: that once stalled a connection until its close timeout (the sender's
 * credit, capped at its own lowered buf_alloc, or the receiver's lowered buf_alloc, at or below
 * the bytes in flight of a message the receiver can only consume whole). The engine's answer is
 * docs/vsock-protocol.md §3, "Lowering the buffer"; tests/unit/vsock/test-seqpacket-shrink.c
 * holds the cases, reduced. (test-sim --seed 711 hit the sender case before the fix, --seed 8148
 * the receiver case with only the sender side fixed.)
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define BATCH             100
#define DRAIN_ITERS       100000
#define SEED_TIME_LIMIT_S 60 /* wall clock per seed: a spin inside a call ends the run */

/* ---- randomness ------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* splitmix64 */
uint64_t sim_rand(struct sim *s)
{
	s->rng += 0x9e3779b97f4a7c15ull;
	return mix64(s->rng);
}

uint64_t sim_below(struct sim *s, uint64_t n)
{
	return n ? sim_rand(s) % n : 0;
}

bool sim_chance(struct sim *s, unsigned pct)
{
	return sim_below(s, 100) < pct;
}

unsigned sim_pick(struct sim *s, const unsigned *w, unsigned n, unsigned sum)
{
	uint64_t x = sim_below(s, sum);

	for (unsigned i = 0; i < n; i++) {
		if (x < w[i])
			return i;
		x -= w[i];
	}
	return n - 1;
}

uint32_t sim_size(struct sim *s, uint32_t max)
{
	static const uint32_t caps[] = { 64, 4096, 65536 };
	uint64_t r = sim_below(s, 100);
	uint32_t cap = max;

	if (r < 40)
		cap = caps[0];
	else if (r < 70)
		cap = caps[1];
	else if (r < 90)
		cap = caps[2];
	if (cap > max)
		cap = max;
	return 1 + (uint32_t)sim_below(s, cap);
}

/* ---- the pattern ------------------------------------------------------------------------ */

void sim_pat_fill(uint64_t key, uint64_t off, uint8_t *p, size_t n)
{
	uint64_t word = mix64(key ^ (off >> 3));

	for (size_t i = 0; i < n; i++, off++) {
		if ((off & 7) == 0)
			word = mix64(key ^ (off >> 3));
		p[i] = (uint8_t)(word >> ((off & 7) * 8));
	}
}

long sim_pat_check(uint64_t key, uint64_t off, const uint8_t *p, size_t n)
{
	uint64_t word = mix64(key ^ (off >> 3));

	for (size_t i = 0; i < n; i++, off++) {
		if ((off & 7) == 0)
			word = mix64(key ^ (off >> 3));
		if (p[i] != (uint8_t)(word >> ((off & 7) * 8)))
			return (long)i;
	}
	return -1;
}

/* ---- trace and failure ------------------------------------------------------------------ */

static const char *prog = "test-sim";
static char steps_note[32]; /* " --steps M" when given, for the replay line */

void sim_trace_(struct sim *s, const char *fmt, ...)
{
	va_list ap;

	fprintf(s->out, "# %6" PRIu64 " %7" PRIu64 ".%03" PRIu64 " ", s->step, s->now / 1000000,
	        (s->now / 1000) % 1000);
	va_start(ap, fmt);
	vfprintf(s->out, fmt, ap);
	va_end(ap);
	fputc('\n', s->out);
}

static void dump_sock(void *arg, const struct vsock_sock_info *i)
{
	printf("#   %s %s %s %u->%u buf_alloc %u fwd %u rx %u | peer buf_alloc %u fwd %u, tx_cnt "
	       "%u queued %u | shut %u peer %u\n",
	       (const char *)arg, vsock_type_to_string(i->type), vsock_state_to_string(i->state),
	       i->local_port, i->peer_port, i->buf_alloc, i->fwd_cnt, i->rx_bytes,
	       i->peer_buf_alloc, i->peer_fwd_cnt, i->tx_cnt, i->tx_queued, i->shutdown,
	       i->peer_shutdown);
}

/* Both engines' sockets and what is on the wire, for a failure report. */
static void dump(struct sim *s)
{
	for (int side = 0; side < 2; side++) {
		const char *name = side ? "host" : "guest";

		if (!s->e[side])
			continue;
		printf("# %s engine: can_feed %d has_pending %d next deadline %" PRIu64
		       " now %" PRIu64 ", %u packets on its wire%s\n",
		       name, vsock_engine_can_feed(s->e[side]),
		       vsock_engine_has_pending(s->e[side]), vsock_engine_next_deadline(s->e[side]),
		       s->now, s->w[side].n, side ? "" : " (TX ring)");
		vsock_engine_foreach_sock(s->e[side], dump_sock, (void *)name);
		for (unsigned i = 0; i < s->w[side].n; i++) {
			const struct sim_pkt *p = &s->w[side].p[i];

			printf("#   wire %s %u->%u len %u ready at step %" PRIu64 "\n",
			       vsock_op_to_string(p->h.op), p->h.src_port, p->h.dst_port, p->h.len,
			       p->ready);
		}
	}
	printf("# RX buffers: %u posted, %u owed, ring %u\n", s->rx_posted, s->rx_owed, s->rx_ring);
}

void sim_fail(struct sim *s, const char *fmt, ...)
{
	va_list ap;

	printf("# seed %" PRIu64 " FAILED at step %" PRIu64 " (t=%" PRIu64 " ms): ", s->seed,
	       s->step, s->now / 1000000);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	dump(s);
	printf("# replay: %s --seed %" PRIu64 "%s --verbose\n", prog, s->seed, steps_note);
	fflush(stdout);
	longjmp(s->fail, 1);
}

/* ---- the scheduler ---------------------------------------------------------------------- */

static void weights(struct sim *s)
{
	static const unsigned act[_ACT_MAX] = {
		[ACT_PULL_GUEST] = 16, [ACT_PULL_HOST] = 16, [ACT_DELIVER_TX] = 16,
		[ACT_DELIVER_RX] = 16, [ACT_REFILL] = 3,     [ACT_WITHHOLD] = 1,
		[ACT_TIME] = 5,        [ACT_APP] = 27,
	};
	static const unsigned app[_APP_MAX] = {
		[APP_LISTEN] = 3,   [APP_CONNECT] = 5, [APP_ACCEPT] = 6,       [APP_DECIDE] = 3,
		[APP_SEND] = 18,    [APP_RECV] = 18,   [APP_PEEK_CONSUME] = 3, [APP_STALL] = 1,
		[APP_SHUTDOWN] = 2, [APP_CLOSE] = 3,   [APP_SETOPT] = 1,       [APP_CREDIT_REQ] = 1,
	};

	/* Each seed weighs the actions differently: slow networks, eager closers, ... */
	s->w_act_sum = s->w_app_sum = 0;
	for (int i = 0; i < _ACT_MAX; i++) {
		s->w_act[i] = act[i] * (1 + (unsigned)sim_below(s, 3));
		s->w_act_sum += s->w_act[i];
	}
	for (int i = 0; i < _APP_MAX; i++) {
		s->w_app[i] =
		        app[i] * (1 + (unsigned)sim_below(s, 3)) / 2 + (unsigned)sim_below(s, 2);
		s->w_app_sum += s->w_app[i];
	}
}

static uint64_t pick_dt(struct sim *s)
{
	uint64_t r = sim_below(s, 100), dl;

	if (r < 50)
		return sim_below(s, 5000000);
	if (r < 80)
		return sim_below(s, 300000000);
	if (r < 95) {
		dl = s->known_deadline[0] < s->known_deadline[1] ? s->known_deadline[0]
		                                                 : s->known_deadline[1];
		return dl != UINT64_MAX && dl > s->now ? dl - s->now : 100000000;
	}
	return sim_below(s, 5000000000ull);
}

static void net_checks(struct sim *s, int side)
{
	sim_check_events(s, side);
	sim_check_engines(s);
}

static void one_step(struct sim *s)
{
	switch ((enum sim_act)sim_pick(s, s->w_act, _ACT_MAX, s->w_act_sum)) {
	case ACT_PULL_GUEST:
		(void)sim_pull(s, SIM_GUEST);
		net_checks(s, SIM_GUEST);
		break;
	case ACT_PULL_HOST:
		(void)sim_pull(s, SIM_HOST);
		net_checks(s, SIM_HOST);
		break;
	case ACT_DELIVER_TX:
		(void)sim_deliver(s, SIM_HOST, sim_chance(s, 30), false);
		net_checks(s, SIM_HOST);
		break;
	case ACT_DELIVER_RX:
		(void)sim_deliver(s, SIM_GUEST, sim_chance(s, 30), false);
		net_checks(s, SIM_GUEST);
		break;
	case ACT_REFILL:
		sim_refill(s);
		break;
	case ACT_WITHHOLD:
		s->withhold_until = s->step + 20 + sim_below(s, 400);
		sim_trace(s, "guest withholds RX buffers until step %" PRIu64, s->withhold_until);
		break;
	case ACT_TIME:
		sim_advance(s, pick_dt(s));
		net_checks(s, SIM_GUEST);
		net_checks(s, SIM_HOST);
		break;
	default:
		sim_app_step(s);
		sim_check_engines(s);
		break;
	}
}

/* Whether a connection may legitimately stay half-open (one end gone, the other not told). */
static bool half_open_allowed(struct sim *s)
{
	for (int side = 0; side < 2; side++) {
		struct vsock_engine_stats st;

		vsock_engine_get_stats(s->e[side], &st);
		if (st.rst_dropped)
			return true;
	}
	return s->had_reset;
}

/* Every application closes; everything in flight is delivered; the timers run out. */
static void drain(struct sim *s)
{
	uint64_t t0 = s->now, bound = 0;

	for (int side = 0; side < 2; side++) {
		uint64_t b = s->cfg[side].connect_timeout_ns + s->cfg[side].close_timeout_ns;

		bound = b > bound ? b : bound;
	}
	bound += 2000000000ull;
	s->draining = true;
	sim_refill(s);
	sim_app_drain_start(s);
	sim_trace(s, "drain");
	for (int iter = 0;; iter++) {
		bool progress = false, done;

		SIM_CHECK(s, iter < DRAIN_ITERS, "drain: no end after %d passes", iter);
		s->step++;
		done = sim_app_drain(s, &progress);
		sim_check_engines(s);
		for (int k = 0; k < 10000; k++) {
			bool any = false;

			sim_refill(s);
			any |= sim_pull(s, SIM_GUEST);
			any |= sim_pull(s, SIM_HOST);
			any |= sim_deliver(s, SIM_HOST, sim_chance(s, 30), true);
			any |= sim_deliver(s, SIM_GUEST, sim_chance(s, 30), true);
			net_checks(s, SIM_GUEST);
			net_checks(s, SIM_HOST);
			if (!any)
				break;
			progress = true;
		}
		if (done && sim_net_quiet(s))
			break;
		if (!progress) {
			uint64_t dl = s->known_deadline[0] < s->known_deadline[1]
			                      ? s->known_deadline[0]
			                      : s->known_deadline[1];

			if (dl == UINT64_MAX && !done && half_open_allowed(s)) {
				/*
				 * A side was reset, or an RST was dropped (reply ring full): a
				 * peer that sends nothing more never learns. The application
				 * gives up, as its own timeout would make it.
				 */
				sim_trace(s,
				          "drain: half-open connections, the applications close");
				sim_app_close_all(s);
				t0 = s->now; /* their closes start the timeouts of the bound anew */
				continue;
			}
			SIM_CHECK(s, dl != UINT64_MAX,
			          "drain stuck: nothing to deliver, no timer, %u+%u sockets open",
			          sim_app_live(s, 0), sim_app_live(s, 1));
			sim_advance(s, dl > s->now ? dl - s->now : 0);
			net_checks(s, SIM_GUEST);
			net_checks(s, SIM_HOST);
		}
		SIM_CHECK(s, s->now - t0 <= bound,
		          "drain: connections still open %" PRIu64 " ms (virtual) after the end",
		          (s->now - t0) / 1000000);
	}
}

static void count_sock(void *arg, const struct vsock_sock_info *i)
{
	(void)i;
	(*(unsigned *)arg)++;
}

static void final_checks(struct sim *s)
{
	for (int side = 0; side < 2; side++) {
		struct vsock_engine_stats st;
		unsigned n = 0;

		vsock_engine_get_stats(s->e[side], &st);
		vsock_engine_foreach_sock(s->e[side], count_sock, &n);
		SIM_CHECK(s, st.socks_open == 0 && n == 0,
		          "side %d leaks %" PRIu64 " sockets (%u "
		          "listed)",
		          side, st.socks_open, n);
	}
}

struct seed_result {
	bool ok;
	uint64_t steps, bytes, msgs, conns, clean_eofs;
};

/* The seed's whole life; a failed check longjmps out of it. */
static void simulate(struct sim *s, uint64_t steps)
{
	uint64_t reset_step = UINT64_MAX;
	int reset_side = 0;

	weights(s);
	sim_net_init(s);
	sim_app_setup(s);
	s->max_steps = steps ? steps : 300 + sim_below(s, 1500);
	if (sim_chance(s, 35)) {
		reset_step = 1 + sim_below(s, s->max_steps);
		reset_side = (int)sim_below(s, 2);
	}
	for (s->step = 1; s->step <= s->max_steps; s->step++) {
		if (s->step == reset_step) {
			sim_transport_reset(s, reset_side);
			net_checks(s, reset_side);
			continue;
		}
		one_step(s);
	}
	drain(s);
	final_checks(s);
}

static volatile sig_atomic_t current_seed_lo; /* for the watchdog's message */

static void watchdog(int sig)
{
	char msg[96];
	int n = snprintf(msg, sizeof(msg), "# seed %lu: no progress for %d s (a call spins)\n",
	                 (unsigned long)current_seed_lo, SEED_TIME_LIMIT_S);

	(void)sig;
	if (write(STDOUT_FILENO, msg, (size_t)n) < 0)
		_exit(3);
	_exit(1);
}

static struct seed_result run_seed(uint64_t seed, uint64_t steps, FILE *trace)
{
	struct sim *s = calloc(1, sizeof(*s));
	struct seed_result res = { false, 0, 0, 0, 0, 0 };

	if (!s) {
		printf("# out of memory\n");
		return res;
	}
	s->seed = seed;
	s->rng = mix64(seed ^ 0x5eed5eed5eedull);
	s->verbose = trace != NULL;
	s->out = trace;
	s->now = 1000000000ull;
	current_seed_lo = (sig_atomic_t)seed;
	alarm(SEED_TIME_LIMIT_S);
	if (setjmp(s->fail) == 0) {
		simulate(s, steps);
		res.ok = true;
	}
	alarm(0);
	res.steps = s->step;
	res.bytes = s->bytes_moved;
	res.msgs = s->msgs_moved;
	res.conns = s->nconns;
	res.clean_eofs = s->clean_eofs;
	sim_app_free(s);
	sim_net_free(s);
	free(s);
	return res;
}

/* --twice: runs the seed twice with its trace in memory; both runs must trace the same. */
static struct seed_result run_twice(uint64_t seed, uint64_t steps)
{
	char *text[2] = { NULL, NULL };
	size_t len[2] = { 0, 0 };
	struct seed_result r = { false, 0, 0, 0, 0, 0 };

	for (int i = 0; i < 2; i++) {
		FILE *f = open_memstream(&text[i], &len[i]);

		if (!f) {
			printf("# open_memstream failed\n");
			return r;
		}
		r = run_seed(seed, steps, f);
		fclose(f);
	}
	if (len[0] != len[1] || memcmp(text[0], text[1], len[0])) {
		printf("# seed %" PRIu64 ": two runs traced differently (%zu and %zu bytes)\n",
		       seed, len[0], len[1]);
		r.ok = false;
	}
	free(text[0]);
	free(text[1]);
	return r;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: %s --seeds N [--first S] | --seed K [--verbose]   [--steps M] [--twice]\n",
	        prog);
	exit(2);
}

static uint64_t num_arg(int argc, char **argv, int *i)
{
	char *end;
	unsigned long long v;

	if (*i + 1 >= argc)
		usage();
	errno = 0;
	v = strtoull(argv[++*i], &end, 0);
	if (errno || *end)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	uint64_t first = 1, n = 0, steps = 0, failed = 0, batch, nbatch;
	uint64_t tot_steps = 0, tot_bytes = 0, tot_msgs = 0, tot_conns = 0, tot_eofs = 0;
	bool verbose = false, single = false, twice = false;

	prog = argv[0];
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seeds"))
			n = num_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--first"))
			first = num_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--seed")) {
			first = num_arg(argc, argv, &i);
			n = 1;
			single = true;
		} else if (!strcmp(argv[i], "--steps"))
			steps = num_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--verbose"))
			verbose = true;
		else if (!strcmp(argv[i], "--twice"))
			twice = true;
		else if (!strcmp(argv[i], "--seqpacket-shrink"))
			; /* the default now */
		else
			usage();
	}
	if (n == 0)
		usage();
	if (verbose && !single)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	batch = n <= 50 ? 1 : BATCH;
	nbatch = (n + batch - 1) / batch;
	printf("1..%" PRIu64 "\n", nbatch);
	for (uint64_t b = 0; b < nbatch; b++) {
		uint64_t lo = first + b * batch, hi = lo + batch;
		uint64_t bad = 0;

		if (hi > first + n)
			hi = first + n;
		for (uint64_t seed = lo; seed < hi; seed++) {
			struct seed_result r =
			        twice ? run_twice(seed, steps)
			              : run_seed(seed, steps, verbose ? stdout : NULL);

			bad += !r.ok;
			tot_steps += r.steps;
			tot_bytes += r.bytes;
			tot_msgs += r.msgs;
			tot_conns += r.conns;
			tot_eofs += r.clean_eofs;
		}
		failed += bad;
		if (hi - lo == 1)
			printf("%sok %" PRIu64 " - seed %" PRIu64 "\n", bad ? "not " : "", b + 1,
			       lo);
		else
			printf("%sok %" PRIu64 " - seeds %" PRIu64 "..%" PRIu64 "%s\n",
			       bad ? "not " : "", b + 1, lo, hi - 1,
			       bad ? " (see the failed seeds above)" : "");
	}
	printf("# %" PRIu64 " seeds, %" PRIu64 " failed; %" PRIu64 " steps, %" PRIu64
	       " connections, %" PRIu64 " RW packets, %" PRIu64 " payload bytes delivered, %" PRIu64
	       " streams checked complete at EOF\n",
	       n, failed, tot_steps, tot_conns, tot_msgs, tot_bytes, tot_eofs);
	return failed ? 1 : 0;
}
