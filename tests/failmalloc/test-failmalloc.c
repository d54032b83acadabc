/* SPDX-License-Identifier: MIT */
/*
 * Allocation failure at every allocation site (suite 'failmalloc'). The program is linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=free, so every allocation
 * libuvsock (and this file) makes goes through the counters below. For each scenario — the
 * protocol engine, the vhost-user back-end, the device role — a clean run first counts the
 * allocations made inside it; then, for every k in 1..count, a forked child runs it again with
 * allocation k (and only that one) failing. The child must not crash, every library call must
 * either succeed or fail with -ENOMEM (or an error the API documents for what the failure
 * causes, listed per scenario), and when it has cleaned up nothing it allocated may still be live
 * (checked here by pointer, and by LeakSanitizer in a sanitizer build).
 *
 * The scenarios allocate nothing themselves (static buffers), so the counted allocations are the
 * library's. The device runs in external-loop mode: no thread, so allocation k is the same call
 * in every run.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "../../examples/embed-guest.h"
#include "test.h"
#include "vhost_user/backend.h"
#include "util/rec.h"
#include "vhost_user/msg.h"
#include "vsock/engine.h"

/* ---- the allocation counter ------------------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t sz);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t sz);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
void __wrap_free(void *p);

#define FM_LIVE_MAX 8192

static struct {
	pthread_mutex_t lock;
	bool on;                  /* counting (inside a scenario) */
	unsigned long calls;      /* allocation calls counted */
	unsigned long fail_at;    /* this call fails (0: none) */
	bool failed;              /* it has */
	void *live[FM_LIVE_MAX];  /* what was allocated while counting and is not freed yet */
	unsigned nlive;
} fm = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Counts one allocation call; true if it must fail. Caller holds fm.lock. */
static bool fm_fail_now(void)
{
	if (!fm.on)
		return false;
	if (++fm.calls != fm.fail_at)
		return false;
	fm.failed = true;
	return true;
}

static void fm_track(void *p)
{
	if (!fm.on || !p)
		return;
	if (fm.nlive == FM_LIVE_MAX) {
		fprintf(stderr, "failmalloc: more than %u live allocations\n", FM_LIVE_MAX);
		abort();
	}
	fm.live[fm.nlive++] = p;
}

static void fm_untrack(void *p)
{
	for (unsigned i = 0; p && i < fm.nlive; i++) {
		if (fm.live[i] == p) {
			fm.live[i] = fm.live[--fm.nlive];
			return;
		}
	}
}

void *__wrap_malloc(size_t n)
{
	void *p = NULL;

	pthread_mutex_lock(&fm.lock);
	if (!fm_fail_now()) {
		p = __real_malloc(n);
		fm_track(p);
	}
	pthread_mutex_unlock(&fm.lock);
	return p;
}

void *__wrap_calloc(size_t n, size_t sz)
{
	void *p = NULL;

	pthread_mutex_lock(&fm.lock);
	if (!fm_fail_now()) {
		p = __real_calloc(n, sz);
		fm_track(p);
	}
	pthread_mutex_unlock(&fm.lock);
	return p;
}

void *__wrap_realloc(void *old, size_t n)
{
	void *p = NULL;

	pthread_mutex_lock(&fm.lock);
	if (!fm_fail_now()) {
		p = __real_realloc(old, n);
		if (p || n == 0)
			fm_untrack(old);
		fm_track(p);
	}
	pthread_mutex_unlock(&fm.lock);
	return p;
}

char *__wrap_strdup(const char *s)
{
	char *p = NULL;

	pthread_mutex_lock(&fm.lock);
	if (!fm_fail_now()) {
		p = __real_strdup(s);
		fm_track(p);
	}
	pthread_mutex_unlock(&fm.lock);
	return p;
}

void __wrap_free(void *p)
{
	pthread_mutex_lock(&fm.lock);
	fm_untrack(p);
	__real_free(p);
	pthread_mutex_unlock(&fm.lock);
}

static void fm_begin(unsigned long fail_at)
{
	pthread_mutex_lock(&fm.lock);
	fm.on = true;
	fm.calls = 0;
	fm.fail_at = fail_at;
	fm.failed = false;
	fm.nlive = 0;
	pthread_mutex_unlock(&fm.lock);
}

static void fm_end(void)
{
	pthread_mutex_lock(&fm.lock);
	fm.on = false;
	pthread_mutex_unlock(&fm.lock);
}

/* Counting again after fm_end (the count and the live set go on). */
static void fm_resume(void)
{
	pthread_mutex_lock(&fm.lock);
	fm.on = true;
	pthread_mutex_unlock(&fm.lock);
}

/* ---- checking calls --------------------------------------------------------------------- */

/*
 * What a scenario run saw: the first call that failed (its name and errno), or none. A scenario
 * stops at the first failed call and cleans up.
 */
struct fm_run {
	const char *call;
	int err;
	char why[200];
};

/* Records the failure r (< 0) of call; returns r. */
static int fm_failed_call(struct fm_run *run, const char *call, int r)
{
	run->call = call;
	run->err = r;
	return r;
}

/* A check that is not a library return value (e.g. the data that arrived). */
static int fm_wrong(struct fm_run *run, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fm_wrong(struct fm_run *run, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(run->why, sizeof(run->why), fmt, ap);
	va_end(ap);
	return fm_failed_call(run, "check", err);
}

#define CALL(run, expr)                                                                            \
	do {                                                                                       \
		long long r_ = (long long)(expr);                                                  \
		if (r_ < 0)                                                                        \
			return fm_failed_call(run, #expr, (int)r_);                                \
	} while (0)

typedef int (*fm_scenario)(struct fm_run *run);

/*
 * Runs scen with allocation fail_at failing (0: none) in a forked child and checks it: no
 * crash, a failed call only with -ENOMEM or one of ok_errs (0-terminated), nothing left live.
 * Returns the number of allocations the run made (child's count), or fails the case.
 */
static unsigned long fm_check(const char *name, fm_scenario scen, unsigned long fail_at,
			      const int *ok_errs)
{
	int pfd[2], st;
	unsigned long calls = 0;
	pid_t pid;

	ASSERT_EQ(pipe(pfd), 0);
	fflush(stdout);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct fm_run run = { 0 };
		unsigned leaked;
		bool ok;
		int r;

		close(pfd[0]);
		fm_begin(fail_at);
		r = scen(&run);
		fm_end();
		ok = r == 0 || r == -ENOMEM;
		for (const int *e = ok_errs; !ok && *e; e++)
			ok = r == -*e;
		if (getenv("UVSOCK_FAILMALLOC_VERBOSE"))
			printf("# %s k=%lu (%s): %s -> %d%s%s\n", name, fail_at,
			       fm.failed ? "failed" : "not reached", run.call ? run.call : "-", r,
			       run.why[0] ? ": " : "", run.why);
		if (!ok || (fail_at == 0 && r != 0))
			printf("# %s, allocation %lu (0: none) fails: %s returned %d (%s)%s%s\n",
			       name, fail_at, run.call ? run.call : "?", r, strerror(-r),
			       run.why[0] ? ": " : "", run.why);
		if (fm.nlive)
			printf("# %s, allocation %lu (0: none) fails: %u allocations still live "
			       "after clean-up (first %p)\n", name, fail_at, fm.nlive, fm.live[0]);
		if (write(pfd[1], &fm.calls, sizeof(fm.calls)) != sizeof(fm.calls))
			exit(3);
		leaked = fm.nlive;
		/* Forget the pointers, or LeakSanitizer would find the leaks reachable from here. */
		memset(fm.live, 0, sizeof(fm.live));
		fflush(stdout);
		/* exit, not _exit: LeakSanitizer checks the child at exit in sanitizer builds. */
		exit(ok && !leaked && (fail_at != 0 || r == 0) ? 0 : 1);
	}
	close(pfd[1]);
	if (read(pfd[0], &calls, sizeof(calls)) != sizeof(calls))
		calls = 0;
	close(pfd[0]);
	ASSERT_EQ(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st))
		test_fail(__FILE__, __LINE__, "%s: allocation %lu of %s fails: killed by signal %d",
			  name, fail_at, name, WTERMSIG(st));
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		test_fail(__FILE__, __LINE__, "%s: allocation %lu fails: exit status %d", name,
			  fail_at, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return calls;
}

/* The clean run, then one run per allocation with that allocation failing. */
static void fm_every_allocation(const char *name, fm_scenario scen, const int *ok_errs)
{
	unsigned long n = fm_check(name, scen, 0, ok_errs);

	ASSERT_GT(n, 0);
	test_note("%s: %lu allocations in a clean run", name, n);
	for (unsigned long k = 1; k <= n; k++)
		fm_check(name, scen, k, ok_errs);
}

/* ---- (a) the engine --------------------------------------------------------------------- */

static uint64_t eng_now_ns = 1000000000ull;
static uint8_t eng_buf[65536];

static uint64_t eng_now(void *opaque)
{
	return eng_now_ns;
}

static const struct vsock_engine_ops eng_ops = { .now = eng_now };

/* Moves packets both ways until both engines are idle (feed errors are the engine's business:
 * it counts them and answers as the protocol says). */
static void eng_pump(struct vsock_engine *a, struct vsock_engine *b)
{
	for (int guard = 0; guard < 100000; guard++) {
		bool any = false;

		for (int dir = 0; dir < 2; dir++) {
			struct vsock_engine *from = dir ? b : a, *to = dir ? a : b;
			struct iovec iov = { eng_buf, sizeof(eng_buf) };
			struct vsock_hdr h;
			ssize_t n = vsock_engine_pull(from, &h, &iov, 1, sizeof(eng_buf));

			if (n < 0)
				continue;
			iov.iov_len = (size_t)n;
			(void)vsock_engine_feed(to, &h, &iov, 1);
			any = true;
		}
		if (!any)
			return;
	}
	test_fail(__FILE__, __LINE__, "engine pump did not settle");
}

/* Sends msg on from and receives it whole on to (STREAM); a short receive is the peer's reset. */
static int eng_transfer(struct fm_run *run, struct vsock_engine *g, struct vsock_engine *h,
			struct vsock_sock *from, struct vsock_sock *to, const char *msg)
{
	size_t len = strlen(msg);
	struct iovec iov = { (void *)msg, len };
	char got[64] = "";
	struct iovec riov = { got, sizeof(got) - 1 };
	ssize_t n;

	n = vsock_sock_send(from, &iov, 1, 0);
	if (n < 0)
		return fm_failed_call(run, "vsock_sock_send", (int)n);
	if ((size_t)n != len)
		return fm_wrong(run, -EIO, "sent %zd of %zu", n, len);
	eng_pump(g, h);
	n = vsock_sock_recv(to, &riov, 1, 0, NULL);
	if (n < 0)
		return fm_failed_call(run, "vsock_sock_recv", (int)n);
	if ((size_t)n != len || memcmp(got, msg, len) != 0) {
		/* Data the receiver could not store: the engine resets the connection. */
		int e = vsock_sock_take_error(to);

		return fm_wrong(run, e ? -e : -EIO, "received %zd of %zu bytes (state %s)", n,
				len, vsock_state_to_string(vsock_sock_state(to)));
	}
	return 0;
}

/* Two engines (CID 3 and CID 2), a listener, a connection, data both ways, close, free. */
static int eng_session(struct fm_run *run, struct vsock_engine *g, struct vsock_engine *h,
		       struct vsock_sock **l, struct vsock_sock **c, struct vsock_sock **a)
{
	int r, e;

	CALL(run, vsock_sock_new(h, VSOCK_TYPE_STREAM, l));
	CALL(run, vsock_sock_bind(*l, VMADDR_CID_ANY, 1234));
	CALL(run, vsock_sock_listen(*l, 4));
	CALL(run, vsock_sock_new(g, VSOCK_TYPE_STREAM, c));
	r = vsock_sock_connect(*c, 2, 1234);
	if (r != -EINPROGRESS)
		return fm_failed_call(run, "vsock_sock_connect", r < 0 ? r : -EIO);
	eng_pump(g, h);
	if (vsock_sock_state(*c) != VSOCK_SS_CONNECTED) {
		e = vsock_sock_take_error(*c);
		return fm_wrong(run, e ? -e : -EIO, "connect did not complete (state %s)",
				vsock_state_to_string(vsock_sock_state(*c)));
	}
	CALL(run, vsock_sock_accept(*l, a));
	r = eng_transfer(run, g, h, *c, *a, "hello");
	if (r == 0)
		r = eng_transfer(run, g, h, *a, *c, "world!");
	return r;
}

/* Engines g (CID 3) and h (CID 2); cfg is left as h's. */
static int eng_pair_new(struct fm_run *run, struct vsock_engine_config *cfg,
			struct vsock_engine **g, struct vsock_engine **h)
{
	int r;

	vsock_engine_config_default(cfg);
	cfg->ops = &eng_ops;
	cfg->local_cid = 3;
	r = vsock_engine_new(cfg, g);
	if (r < 0)
		return fm_failed_call(run, "vsock_engine_new(3)", r);
	cfg->local_cid = 2;
	r = vsock_engine_new(cfg, h);
	if (r < 0) {
		vsock_engine_free(*g);
		return fm_failed_call(run, "vsock_engine_new(2)", r);
	}
	return 0;
}

static int scen_engine(struct fm_run *run)
{
	struct vsock_engine_config cfg;
	struct vsock_engine *g = NULL, *h = NULL;
	struct vsock_sock *l = NULL, *c = NULL, *a = NULL;
	int r;

	r = eng_pair_new(run, &cfg, &g, &h);
	if (r < 0)
		return r;
	r = eng_session(run, g, h, &l, &c, &a);
	vsock_sock_close(c);
	vsock_sock_close(a);
	vsock_sock_close(l);
	eng_pump(g, h);
	vsock_engine_free(g);
	vsock_engine_free(h);
	return r;
}

/*
 * An allocation that fails inside a fed packet is answered as the protocol says: a REQUEST the
 * listener cannot take is refused with RST (the connect ends with ECONNRESET); data the receiver
 * cannot store resets the connection (ENOMEM on the receiving socket).
 */
static const int eng_ok[] = { ECONNRESET, 0 };

TEST(engine_survives_every_allocation_failing)
{
	fm_every_allocation("engine", scen_engine, eng_ok);
}

/*
 * The engine's state save and restore (src/vsock/save.c): a session with bytes queued both ways,
 * h saved, freed and restored into a fresh engine, the connection used again. An allocation
 * that fails in the save fails the save; one that fails in the restore fails it and leaves
 * the fresh engine empty (nothing live once it is freed: the rollback freed what it built).
 */
static struct vsock_sock *eng_adopted[4];
static unsigned eng_nadopted;

static void eng_adopt(void *arg, struct vsock_sock *s)
{
	(void)arg;
	if (eng_nadopted < 4)
		eng_adopted[eng_nadopted++] = s;
}

static int eng_save_restore(struct fm_run *run, struct vsock_engine **h,
			    const struct vsock_engine_config *cfg)
{
	struct rec_writer w;
	struct rec_reader rd;
	struct rec_doc d;
	const uint8_t *b;
	size_t len;
	int r;

	rec_writer_init(&w, REC_KIND_ENGINE, 1);
	r = vsock_engine_save(*h, &w);
	if (r == 0)
		r = rec_writer_finish(&w, &b, &len);
	if (r < 0) {
		rec_writer_free(&w);
		return fm_failed_call(run, "vsock_engine_save", r);
	}
	vsock_engine_free(*h);
	*h = NULL;
	r = vsock_engine_new(cfg, h);
	if (r < 0) {
		rec_writer_free(&w);
		return fm_failed_call(run, "vsock_engine_new(2, again)", r);
	}
	r = rec_open(&d, b, len, REC_KIND_ENGINE, 1, 1, NULL, 0);
	if (r == 0) {
		rec_root(&d, &rd, "engine");
		r = vsock_engine_restore(*h, &rd, eng_adopt, NULL);
		rec_doc_fini(&d);
	}
	rec_writer_free(&w);
	if (r < 0) {
		struct vsock_engine_stats st;

		vsock_engine_get_stats(*h, &st);
		if (st.socks_open != 0 || eng_nadopted != 0 || vsock_engine_has_pending(*h))
			return fm_wrong(run, -EIO, "a failed restore left %llu sockets",
					(unsigned long long)st.socks_open);
		return fm_failed_call(run, "vsock_engine_restore", r);
	}
	if (eng_nadopted != 2 || vsock_sock_id(eng_adopted[0]) == vsock_sock_id(eng_adopted[1]))
		return fm_wrong(run, -EIO, "%u sockets handed back", eng_nadopted);
	return 0;
}

static int scen_engine_save(struct fm_run *run)
{
	struct vsock_engine_config cfg;
	struct vsock_engine *g = NULL, *h = NULL;
	struct vsock_sock *l = NULL, *c = NULL, *a = NULL;
	struct iovec iov = { (void *)"queued", 6 };
	uint64_t id_l = 0, id_a = 0;
	ssize_t n;
	int r;

	eng_nadopted = 0;
	r = eng_pair_new(run, &cfg, &g, &h);
	if (r < 0)
		return r;
	r = eng_session(run, g, h, &l, &c, &a);
	/* Bytes queued both ways at the save: in h's send ring, and unread in h. */
	if (r == 0 && (n = vsock_sock_send(a, &iov, 1, 0)) != 6)
		r = n < 0 ? fm_failed_call(run, "vsock_sock_send(a)", (int)n)
			  : fm_wrong(run, -EIO, "send before the save");
	if (r == 0 && (n = vsock_sock_send(c, &iov, 1, 0)) != 6)
		r = n < 0 ? fm_failed_call(run, "vsock_sock_send(c)", (int)n)
			  : fm_wrong(run, -EIO, "send before the save");
	if (r == 0)
		eng_pump(g, h);
	if (r == 0) {
		id_l = vsock_sock_id(l);
		id_a = vsock_sock_id(a);
		r = eng_save_restore(run, &h, &cfg);
		/* h's old sockets went with the old engine; the restored ones replace them. */
		l = a = NULL;
		for (unsigned i = 0; i < eng_nadopted; i++) {
			if (vsock_sock_id(eng_adopted[i]) == id_l)
				l = eng_adopted[i];
			if (vsock_sock_id(eng_adopted[i]) == id_a)
				a = eng_adopted[i];
		}
		if (r == 0 && (!l || !a))
			r = fm_wrong(run, -EIO, "the listener or the connection is missing");
	}
	if (r == 0) {
		char got[16];
		struct iovec riov = { got, sizeof(got) };

		eng_pump(g, h);
		for (int i = 0; i < 2 && r == 0; i++) {
			struct vsock_sock *s = i ? c : a;

			if (vsock_sock_recv(s, &riov, 1, 0, NULL) != 6) {
				/* Bytes a receiver could not store reset the connection. */
				int e = vsock_sock_take_error(s);

				r = fm_wrong(run, e ? -e : -EIO,
					     "the queued bytes did not cross the restore");
			}
		}
	}
	if (r == 0)
		r = eng_transfer(run, g, h, c, a, "again");
	vsock_sock_close(c);
	vsock_sock_close(a);
	vsock_sock_close(l);
	if (h)
		eng_pump(g, h);
	vsock_engine_free(g);
	vsock_engine_free(h);
	return r;
}

TEST(engine_save_restore_survives_every_allocation_failing)
{
	fm_every_allocation("engine-save", scen_engine_save, eng_ok);
}

/* ---- (b) the vhost-user back-end -------------------------------------------------------- */

#define VHU_MEMSZ (1u << 20)
#define VHU_UVA 0x7f1234500000ull
#define VHU_GPA 0x40000000ull
#define VHU_QSZ 128u

static struct vhu_msg vhu_reply;

/* Sends one request and lets the back-end handle it; reads the reply of a GET_ request. */
static int vhu_req(struct fm_run *run, int sock, struct vhu_backend *b, const char *name,
		   uint32_t request, const void *p, uint32_t size, const int *fds, unsigned nfds,
		   bool reply)
{
	int r = vhu_msg_send(sock, request, VHU_FLAG_VERSION, p, size, fds, nfds, 1000);

	if (r < 0)
		return fm_wrong(run, -EIO, "sending %s: %s", name, strerror(-r));
	r = vhu_backend_process(b);
	if (r < 0)
		return fm_failed_call(run, name, r);
	if (reply) {
		r = vhu_msg_recv(sock, &vhu_reply, 1000);
		if (r < 0 || vhu_reply.request != request)
			return fm_wrong(run, -EIO, "no reply to %s", name);
	}
	return 0;
}

static int vhu_u64(struct fm_run *run, int sock, struct vhu_backend *b, const char *name,
		   uint32_t request, uint64_t v, const int *fds, unsigned nfds)
{
	return vhu_req(run, sock, b, name, request, &v, 8, fds, nfds, false);
}

static int vhu_state(struct fm_run *run, int sock, struct vhu_backend *b, const char *name,
		     uint32_t request, uint32_t index, uint32_t num, bool reply)
{
	struct vhu_vring_state s = { index, num };

	return vhu_req(run, sock, b, name, request, &s, sizeof(s), NULL, 0, reply);
}

/* What QEMU 7.2's vhost-user-vsock-pci sends up to two running rings, then GET_VRING_BASE. */
static int vhu_sequence(struct fm_run *run, int sock, struct vhu_backend *b, int memfd,
			const int *kick, const int *call)
{
	const uint64_t features = VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
				  VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_VSOCK_F_SEQPACKET);
	struct vhu_mem_table t = { .nregions = 1 };
	int r;

	t.regions[0] = (struct vhu_mem_region){ .guest_phys_addr = VHU_GPA,
						.memory_size = VHU_MEMSZ,
						.userspace_addr = VHU_UVA };
#define VHU(expr)                                                                                  \
	do {                                                                                       \
		r = (expr);                                                                        \
		if (r < 0)                                                                         \
			return r;                                                                  \
	} while (0)
	VHU(vhu_req(run, sock, b, "GET_FEATURES", VHU_REQ_GET_FEATURES, NULL, 0, NULL, 0, true));
	VHU(vhu_req(run, sock, b, "GET_PROTOCOL_FEATURES", VHU_REQ_GET_PROTOCOL_FEATURES, NULL, 0,
		    NULL, 0, true));
	VHU(vhu_u64(run, sock, b, "SET_PROTOCOL_FEATURES", VHU_REQ_SET_PROTOCOL_FEATURES,
		    VHU_BIT(VHU_PROTO_F_CONFIG), NULL, 0));
	VHU(vhu_req(run, sock, b, "SET_OWNER", VHU_REQ_SET_OWNER, NULL, 0, NULL, 0, false));
	VHU(vhu_u64(run, sock, b, "SET_FEATURES", VHU_REQ_SET_FEATURES, features, NULL, 0));
	VHU(vhu_req(run, sock, b, "SET_MEM_TABLE", VHU_REQ_SET_MEM_TABLE, &t, 8 + 32, &memfd, 1,
		    false));
	for (unsigned q = 0; q < 2; q++) {
		struct vhu_vring_addr a = { .index = q,
					    .desc_user_addr = VHU_UVA + 0x1000u + q * 0x4000u,
					    .avail_user_addr = VHU_UVA + 0x2000u + q * 0x4000u,
					    .used_user_addr = VHU_UVA + 0x3000u + q * 0x4000u };

		VHU(vhu_state(run, sock, b, "SET_VRING_NUM", VHU_REQ_SET_VRING_NUM, q, VHU_QSZ,
			      false));
		VHU(vhu_state(run, sock, b, "SET_VRING_BASE", VHU_REQ_SET_VRING_BASE, q, 0, false));
		VHU(vhu_req(run, sock, b, "SET_VRING_ADDR", VHU_REQ_SET_VRING_ADDR, &a, sizeof(a),
			    NULL, 0, false));
		VHU(vhu_u64(run, sock, b, "SET_VRING_KICK", VHU_REQ_SET_VRING_KICK, q, &kick[q], 1));
		VHU(vhu_u64(run, sock, b, "SET_VRING_CALL", VHU_REQ_SET_VRING_CALL, q, &call[q], 1));
		VHU(vhu_state(run, sock, b, "SET_VRING_ENABLE", VHU_REQ_SET_VRING_ENABLE, q, 1,
			      false));
	}
	if (!vhu_backend_queue_running(b, 0) || !vhu_backend_queue_running(b, 1))
		return fm_wrong(run, -EIO, "rings not running after the sequence");
	for (unsigned q = 0; q < 2; q++)
		VHU(vhu_state(run, sock, b, "GET_VRING_BASE", VHU_REQ_GET_VRING_BASE, q, 0, true));
#undef VHU
	return 0;
}

static int scen_backend(struct fm_run *run)
{
	struct vhu_backend_config cfg;
	struct vhu_backend *b = NULL;
	int sv[2], memfd, kick[2], call[2], r;

	vhu_backend_config_init(&cfg);
	cfg.msg_timeout_ms = 1000;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return fm_wrong(run, -errno, "socketpair");
	memfd = memfd_create("failmalloc-guest", MFD_CLOEXEC);
	if (memfd < 0 || ftruncate(memfd, VHU_MEMSZ) < 0)
		return fm_wrong(run, -errno, "memfd");
	for (int q = 0; q < 2; q++) {
		kick[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		call[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	}
	r = vhu_backend_new(sv[1], &cfg, NULL, NULL, &b);
	if (r < 0) {
		close(sv[1]); /* ownership passes on success only */
		fm_failed_call(run, "vhu_backend_new", r);
	} else {
		r = vhu_sequence(run, sv[0], b, memfd, kick, call);
	}
	vhu_backend_free(b);
	close(sv[0]);
	close(memfd);
	for (int q = 0; q < 2; q++) {
		close(kick[q]);
		close(call[q]);
	}
	return r;
}

static const int vhu_ok[] = { 0 };

TEST(vhost_user_backend_survives_every_allocation_failing)
{
	fm_every_allocation("vhost-user back-end", scen_backend, vhu_ok);
}

/* ---- (c) the device role ---------------------------------------------------------------- */

static struct eg_guest dev_guest;
static char dev_dir[64], dev_uds[96];

/* A guest REQUEST to host port 5000, where the test listens: the answer the guest gets. */
static int dev_request(struct fm_run *run, struct uvsock_dev *d, struct eg_guest *g)
{
	struct vsock_hdr o = eg_hdr(g, 40000, 5000, VSOCK_OP_REQUEST, 0, 0), h = { 0 };
	static char buf[EG_RXBUF];
	int r;

	r = eg_send(g, &o, "", 2000);
	if (r < 0)
		return fm_wrong(run, r, "guest TX");
	r = eg_recv(g, &h, buf, sizeof(buf), 5000);
	if (r < 0)
		return fm_wrong(run, r, "no answer to the guest's REQUEST");
	if (h.op == VSOCK_OP_RST)
		return fm_wrong(run, -ECONNRESET, "REQUEST refused with RST");
	if (h.op != VSOCK_OP_RESPONSE || h.dst_port != 40000)
		return fm_wrong(run, -EIO, "answer op %u to port %u", h.op, h.dst_port);
	return 0;
}

static int dev_session(struct fm_run *run, struct uvsock_dev *d, struct eg_guest *g)
{
	struct uvsock_dev_mem_region reg = eg_region(g);

	CALL(run, uvsock_dev_set_features(d, g->features));
	CALL(run, uvsock_dev_set_mem_table(d, &reg, 1));
	for (unsigned q = 0; q < 2; q++) {
		struct uvsock_dev_queue dq = eg_queue(g, q);

		CALL(run, uvsock_dev_queue_start(d, q, &dq));
	}
	if (eg_post_all_rx(g) < 0)
		return fm_wrong(run, -EIO, "guest RX buffers");
	return dev_request(run, d, g);
}

static int scen_device(struct fm_run *run)
{
	struct uvsock_dev_config cfg = { .size = sizeof(cfg), .guest_cid = 3, .uds_path = dev_uds,
					 .flags = UVSOCK_DEV_EXTERNAL_LOOP };
	struct uvsock_dev *d = NULL;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char *path = a.sun_path;
	int lfd, r;

	/* The guest stand-in (its rings use libuvsock's driver code) exists outside the count. */
	fm_end();
	if (eg_init(&dev_guest, 3, uvsock_dev_features()) < 0)
		return fm_wrong(run, -EIO, "guest stand-in");
	snprintf(path, sizeof(a.sun_path), "%s_5000", dev_uds);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	unlink(path);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 8) < 0)
		return fm_wrong(run, -errno, "host listener");
	fm_resume();
	r = uvsock_dev_new(&cfg, &d);
	if (r < 0) {
		fm_failed_call(run, "uvsock_dev_new", r);
	} else {
		dev_guest.loop_dev = d;
		r = dev_session(run, d, &dev_guest);
		if (r == 0) {
			r = uvsock_dev_reset(d);
			if (r < 0)
				fm_failed_call(run, "uvsock_dev_reset", r);
		}
	}
	uvsock_dev_free(d);

	fm_end();
	close(lfd);
	unlink(path);
	eg_destroy(&dev_guest);
	return r;
}

/*
 * An allocation that fails while the device handles the guest's REQUEST (the connection, the
 * host socket) is answered with RST: the guest sees a refused connect (ECONNRESET).
 */
static const int dev_ok[] = { ECONNRESET, 0 };

TEST(device_survives_every_allocation_failing)
{
	snprintf(dev_dir, sizeof(dev_dir), "/tmp/uvsock-failmalloc-XXXXXX");
	ASSERT_TRUE(mkdtemp(dev_dir) != NULL);
	snprintf(dev_uds, sizeof(dev_uds), "%s/vm3.vsock", dev_dir);
	fm_every_allocation("device", scen_device, dev_ok);
	rmdir(dev_dir);
}

TEST_MAIN()
