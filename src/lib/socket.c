/* SPDX-License-Identifier: MIT */
/*
 * The socket calls of include/uvsock/uvsock.h over the engine's non-blocking vsock_sock_*()
 * functions: descriptors, blocking with deadlines, Linux AF_VSOCK errno, pollable descriptors.
 *
 * Descriptors. Each socket owns an eventfd; its number is the descriptor the caller sees. A
 * process-wide two-level table maps descriptor -> struct usock. Lookups take one striped mutex
 * and a reference; uvsock_close() removes the entry, so later calls fail EBADF, and the engine
 * socket is closed when the last in-flight call drops its reference.
 *
 * Blocking. A blocked call samples the socket's event counter (evseq), retries the engine call,
 * and sleeps on the counter with a futex until sock_event bumps it or the deadline passes.
 * sock_event bumps the counter and issues the wake syscall only if someone waits (waiters > 0)
 * and a waiter armed a wake since the last one (wake_arm): a burst of events while a reader
 * sleeps costs one FUTEX_WAKE, not one per packet. All sides use sequentially consistent
 * atomics so that either the waiter sees the new count or the event sees the waiter and its arm.
 *
 * wake_arm holds 0 or ARM_BIT | seq, the last value some waiter sleeps on (sock_wait stores it
 * after waiters++ and before its final evseq check). The event that moves evseq from v: if the
 * arm is 0, every sleeper was already woken (the event that cleared it woke them all, and a
 * waiter arming later re-checks evseq after its store); else it wakes everyone, and clears the
 * arm only if it is for v or older: an arm for a later value belongs to a waiter that already
 * saw this event, so it is left for the event that waiter is really waiting for.
 *
 * Direct RX (transports with rx_wait, the guest role; tune direct_rx). A blocked call first asks
 * the transport to wait for it: the caller then drains the RX ring itself and sleeps on the
 * device's interrupt instead of on the futex (one wake-up per hop: the device wakes the
 * application thread, not a transport thread that wakes it in turn). While it does, `direct`
 * counts it, and sock_event of that socket wakes it through the transport's rx_wake (events
 * that come from elsewhere: a close, a timer, another thread). The same Dekker pair as above:
 * direct++ before the waiter's last evseq check; the event's evseq bump before its load of
 * direct. uvsock_poll does the same with the descriptors it polls.
 *
 * Pollable descriptor. While armed (interest != 0) the eventfd holds 1 exactly when the last
 * known poll mask intersects interest|POLLERR|POLLHUP. sock_event applies the mask it is given;
 * an API call that may have changed the mask without an event re-polls (refresh), and a
 * sequence number (pseq) keeps a stale re-poll from overwriting a newer event's mask.
 *
 * Datagrams (SOCK_DGRAM, the "Datagrams" section below). Sends take neither tx_mu nor the engine
 * socket's lock (vsock_dgram_send, src/vsock/dgram.c), so threads sending on one descriptor run
 * in parallel; receivers take no tx_mu/rx_mu either (each recv takes one whole datagram under
 * the engine socket's lock). Blocking uses the same evseq wait as streams.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/time.h>
#include <unistd.h>

#include "lib/ctx.h"
#include "util/iov.h"
#include "util/macros.h"
#include "util/time.h"

#define NS_PER_US 1000ull
#define NO_DEADLINE UINT64_MAX
/* SO_RCVTIMEO/SO_SNDTIMEO value meaning "do not wait" (a negative tv_sec, as Linux). */
#define TIMEO_IMMEDIATE 1ull
#define ARM_BIT (1ull << 32) /* wake_arm: set when armed, low 32 bits the evseq value */

struct usock {
	atomic_int refs;             /* 1 for the table entry (until close) + 1 per call */
	int fd;                      /* the descriptor: our eventfd */
	int type;                    /* SOCK_STREAM, SOCK_SEQPACKET or SOCK_DGRAM */
	struct uvsock_ctx *ctx;
	struct vsock_sock *vs;       /* engine socket; our reference, released at destroy */
	atomic_bool closed;          /* uvsock_close() was called */
	atomic_bool nonblock;        /* O_NONBLOCK */
	_Atomic uint64_t rcvtimeo;   /* ns, 0 = forever */
	_Atomic uint64_t sndtimeo;
	_Atomic uint32_t rcvlowat;   /* cached copy of the engine's value */
	_Atomic uint64_t bufsize;    /* cached SO_VM_SOCKETS_BUFFER_SIZE */
	atomic_uint evseq;           /* bumped by every sock_event; futex word */
	atomic_int waiters;          /* threads sleeping on evseq */
	atomic_int direct;           /* threads waiting in the transport's rx_wait */
	_Atomic uint64_t wake_arm;   /* 0 or ARM_BIT | evseq value a waiter sleeps on */
	pthread_mutex_t tx_mu;       /* serializes senders */
	pthread_mutex_t rx_mu;       /* serializes receivers and accepters */

	atomic_bool armed;           /* interest != 0; read without pmu on the event path */
	pthread_mutex_t pmu;
	/* Protected by pmu. */
	unsigned interest;           /* POLL* bits incl. POLLERR|POLLHUP, 0 = disarmed */
	bool signalled;              /* the eventfd counter is 1 */
	unsigned pseq;               /* count of masks applied by sock_event */

	/* Protected by ctx->mu. */
	struct usock *prev, *next;
};

/* ---- Descriptor table ------------------------------------------------------------------ */

#define FDT_CHUNK_BITS 10
#define FDT_CHUNK (1u << FDT_CHUNK_BITS)
#define FDT_NCHUNKS 1024u /* descriptors below 2^20 */
#define FDT_STRIPES 64u

static struct usock **_Atomic fdt_chunks[FDT_NCHUNKS];
static pthread_mutex_t fdt_alloc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fdt_stripe[FDT_STRIPES] = {
#define S4 PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, \
	   PTHREAD_MUTEX_INITIALIZER
#define S16 S4, S4, S4, S4
	S16, S16, S16, S16
#undef S16
#undef S4
};

static int fdt_insert(struct usock *us)
{
	unsigned fd = (unsigned)us->fd, ci = fd >> FDT_CHUNK_BITS;
	struct usock **chunk;
	pthread_mutex_t *lk;

	if (ci >= FDT_NCHUNKS)
		return -EMFILE;
	chunk = atomic_load_explicit(&fdt_chunks[ci], memory_order_acquire);
	if (!chunk) {
		pthread_mutex_lock(&fdt_alloc_mu);
		chunk = atomic_load_explicit(&fdt_chunks[ci], memory_order_relaxed);
		if (!chunk) {
			chunk = calloc(FDT_CHUNK, sizeof(*chunk));
			if (!chunk) {
				pthread_mutex_unlock(&fdt_alloc_mu);
				return -ENOMEM;
			}
			/* Publishes the zeroed chunk before any lookup can load the pointer. */
			atomic_store_explicit(&fdt_chunks[ci], chunk, memory_order_release);
		}
		pthread_mutex_unlock(&fdt_alloc_mu);
	}
	lk = &fdt_stripe[fd % FDT_STRIPES];
	pthread_mutex_lock(lk);
	chunk[fd & (FDT_CHUNK - 1)] = us;
	pthread_mutex_unlock(lk);
	return 0;
}

/* Removes fd's entry if it is `us` (or any entry if us is NULL); returns what was removed. */
static struct usock *fdt_remove(int fd, struct usock *us)
{
	struct usock **chunk, *cur = NULL;
	pthread_mutex_t *lk;

	if (fd < 0 || ((unsigned)fd >> FDT_CHUNK_BITS) >= FDT_NCHUNKS)
		return NULL;
	chunk = atomic_load_explicit(&fdt_chunks[(unsigned)fd >> FDT_CHUNK_BITS],
				     memory_order_acquire);
	if (!chunk)
		return NULL;
	lk = &fdt_stripe[(unsigned)fd % FDT_STRIPES];
	pthread_mutex_lock(lk);
	cur = chunk[(unsigned)fd & (FDT_CHUNK - 1)];
	if (cur && (!us || cur == us))
		chunk[(unsigned)fd & (FDT_CHUNK - 1)] = NULL;
	else
		cur = NULL;
	pthread_mutex_unlock(lk);
	return cur;
}

/* Looks fd up and takes a reference. Returns NULL with errno EBADF/ENOTSOCK. */
static struct usock *sock_get(int fd)
{
	struct usock **chunk, *us = NULL;
	pthread_mutex_t *lk;

	if (fd >= 0 && ((unsigned)fd >> FDT_CHUNK_BITS) < FDT_NCHUNKS) {
		chunk = atomic_load_explicit(&fdt_chunks[(unsigned)fd >> FDT_CHUNK_BITS],
					     memory_order_acquire);
		if (chunk) {
			lk = &fdt_stripe[(unsigned)fd % FDT_STRIPES];
			pthread_mutex_lock(lk);
			us = chunk[(unsigned)fd & (FDT_CHUNK - 1)];
			if (us)
				atomic_fetch_add_explicit(&us->refs, 1, memory_order_relaxed);
			pthread_mutex_unlock(lk);
		}
	}
	if (!us)
		errno = fd >= 0 && fcntl(fd, F_GETFD) >= 0 ? ENOTSOCK : EBADF;
	return us;
}

static void sock_destroy(struct usock *us)
{
	struct uvsock_ctx *ctx = us->ctx;

	/*
	 * set_user(NULL) takes the engine socket's lock, and sock_event runs under that lock:
	 * after this no callback can still be using `us`.
	 */
	vsock_sock_set_user(us->vs, NULL);
	vsock_sock_close(us->vs);
	pthread_mutex_lock(&ctx->mu);
	if (us->prev)
		us->prev->next = us->next;
	else
		ctx->socks = us->next;
	if (us->next)
		us->next->prev = us->prev;
	pthread_mutex_unlock(&ctx->mu);
	close(us->fd);
	pthread_mutex_destroy(&us->tx_mu);
	pthread_mutex_destroy(&us->rx_mu);
	pthread_mutex_destroy(&us->pmu);
	free(us);
}

static void sock_put(struct usock *us)
{
	if (atomic_fetch_sub_explicit(&us->refs, 1, memory_order_acq_rel) == 1)
		sock_destroy(us);
}

/* Returns r (>= 0) or sets errno = -r and returns -1. */
static int ret_errno(int r)
{
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return r;
}

static ssize_t ret_errno_ssize(ssize_t r)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

/* ---- Events, waiting, pollable descriptor --------------------------------------------- */

static void pollfd_apply(struct usock *us, unsigned mask)
{
	bool want = us->interest && (mask & us->interest);
	uint64_t v = 1;

	if (want && !us->signalled) {
		if (write(us->fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
			us->signalled = true;
	} else if (!want && us->signalled) {
		/* Non-blocking eventfd: resets the counter to 0. */
		if (read(us->fd, &v, sizeof(v)) == (ssize_t)sizeof(v) || errno == EAGAIN)
			us->signalled = false;
	}
}

void lib_sock_event(struct usock *us, unsigned mask)
{
	/* Pairs with waiters++ / wake_arm store / evseq load in sock_wait (file comment). */
	unsigned v = atomic_fetch_add(&us->evseq, 1);

	if (atomic_load(&us->waiters) > 0) {
		uint64_t a = atomic_load(&us->wake_arm);

		if (a != 0) {
			/* Arm for v or older (modulo 2^32): ours to clear. */
			if ((int)((unsigned)a - v) <= 0)
				atomic_compare_exchange_strong(&us->wake_arm, &a, 0);
			lib_futex_wake(&us->evseq);
		}
	}
	/* After the bump: pairs with direct++ and the evseq check in sock_wait. */
	if (atomic_load(&us->direct) > 0)
		us->ctx->tops->rx_wake(us->ctx);
	if (atomic_load_explicit(&us->armed, memory_order_relaxed)) {
		pthread_mutex_lock(&us->pmu);
		us->pseq++;
		pollfd_apply(us, mask);
		pthread_mutex_unlock(&us->pmu);
	}
}

/* Re-evaluates the pollable descriptor after a call that may have changed the mask. */
static void pollfd_refresh(struct usock *us)
{
	unsigned seq, mask;

	if (!atomic_load_explicit(&us->armed, memory_order_relaxed))
		return;
	pthread_mutex_lock(&us->pmu);
	seq = us->pseq;
	pthread_mutex_unlock(&us->pmu);
	mask = vsock_sock_poll(us->vs);
	pthread_mutex_lock(&us->pmu);
	/* A sock_event in between applied a mask at least as recent as ours. */
	if (us->pseq == seq)
		pollfd_apply(us, mask);
	pthread_mutex_unlock(&us->pmu);
}

/* Wakes every thread blocked on us (close). */
static void sock_wake_all(struct usock *us)
{
	atomic_fetch_add(&us->evseq, 1);
	lib_futex_wake(&us->evseq);
	if (atomic_load(&us->direct) > 0)
		us->ctx->tops->rx_wake(us->ctx);
}

/*
 * Sleeps until an event after `seq` or the deadline. Returns 0 or -ETIMEDOUT (deadline passed).
 */
static int sock_wait(struct usock *us, unsigned seq, uint64_t deadline)
{
	int r = 0;

	if (deadline != NO_DEADLINE && mono_ns() >= deadline)
		return -ETIMEDOUT;
	if (us->ctx->tops->rx_wait) {
		struct pollfd own[2];

		atomic_fetch_add(&us->direct, 1);
		r = us->ctx->tops->rx_wait(us->ctx, own, 0, &us->evseq, seq, deadline);
		atomic_fetch_sub(&us->direct, 1);
		/* A signal is a spurious wake-up here, as for the futex below. */
		if (r != 0)
			return 0;
	}
	atomic_fetch_add(&us->waiters, 1);
	atomic_store(&us->wake_arm, ARM_BIT | seq);
	if (atomic_load(&us->evseq) == seq)
		r = lib_futex_wait(&us->evseq, seq, deadline);
	atomic_fetch_sub(&us->waiters, 1);
	return r;
}

static uint64_t deadline_after(uint64_t timeo_ns)
{
	if (timeo_ns == 0)
		return NO_DEADLINE;
	return mono_ns() + timeo_ns;
}

/*
 * ThreadSanitizer (gcc defines __SANITIZE_THREAD__, clang has __has_feature(thread_sanitizer))
 * does not intercept pthread_mutex_clocklock (glibc 2.30+; GCC 12's and clang 14's runtimes):
 * a lock taken through it is invisible to TSan, which then reports false races on everything
 * the mutex protects and "unlock of an unlocked mutex". Under TSan only, lock_until uses
 * pthread_mutex_timedlock (intercepted) with the monotonic deadline converted to a CLOCK_REALTIME
 * one. The conversion is exact unless the wall clock is set during the wait, which only makes
 * that one timeout longer or shorter; it is not a reason to suppress TSan's reports of the
 * sockets' locks, and a trylock loop would sleep or spin. Every other build keeps clocklock
 * (immune to wall-clock changes).
 */
#if defined(__SANITIZE_THREAD__)
#define SOCK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SOCK_TSAN 1
#endif
#endif

/* Locks m before the deadline; with deadline 0 only tries. Returns 0 or -EAGAIN. */
static int lock_until(pthread_mutex_t *m, bool nonblock, uint64_t deadline)
{
	struct timespec ts;

	if (nonblock)
		return pthread_mutex_trylock(m) == 0 ? 0 : -EAGAIN;
	if (deadline == NO_DEADLINE) {
		pthread_mutex_lock(m);
		return 0;
	}
#ifdef SOCK_TSAN
	{
		uint64_t now = mono_ns(), left = deadline > now ? deadline - now : 0, rt;

		clock_gettime(CLOCK_REALTIME, &ts);
		rt = (uint64_t)ts.tv_sec * NS_PER_SEC + (uint64_t)ts.tv_nsec + left;
		ts.tv_sec = (time_t)(rt / NS_PER_SEC);
		ts.tv_nsec = (long)(rt % NS_PER_SEC);
		return pthread_mutex_timedlock(m, &ts) == 0 ? 0 : -EAGAIN;
	}
#else
	ts.tv_sec = (time_t)(deadline / NS_PER_SEC);
	ts.tv_nsec = (long)(deadline % NS_PER_SEC);
	return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts) == 0 ? 0 : -EAGAIN;
#endif
}

/*
 * The retry step of a blocking call's loop, after an attempt that returned r (seq read before it):
 * true to try again (r is -EAGAIN, the call may block and an event came before the deadline);
 * false to stop with r as it is (-EAGAIN also when the deadline passed).
 */
static bool sock_retry(struct usock *us, ssize_t r, unsigned seq, bool nonblock, uint64_t deadline)
{
	if (r != -EAGAIN || nonblock)
		return false;
	return sock_wait(us, seq, deadline) != -ETIMEDOUT;
}

/* ---- Creation and lifetime ------------------------------------------------------------- */

static void sock_cache_opts(struct usock *us)
{
	uint64_t v;

	if (vsock_sock_getopt(us->vs, VSOCK_OPT_RCVLOWAT, &v) == 0)
		atomic_store(&us->rcvlowat, (uint32_t)MIN(v, UINT32_MAX));
	if (vsock_sock_getopt(us->vs, VSOCK_OPT_BUFFER_SIZE, &v) == 0)
		atomic_store(&us->bufsize, v);
}

/* Wraps an engine socket (takes ownership of its reference, also on failure). */
static int sock_wrap(struct uvsock_ctx *ctx, struct vsock_sock *vs, int type, int flags)
{
	struct usock *us;
	int r, efd;

	efd = eventfd(0, EFD_NONBLOCK | ((flags & SOCK_CLOEXEC) ? EFD_CLOEXEC : 0));
	if (efd < 0) {
		r = -errno;
		goto out_close_vs;
	}
	us = calloc(1, sizeof(*us));
	if (!us) {
		r = -ENOMEM;
		goto out_close_efd;
	}
	atomic_init(&us->refs, 1);
	us->fd = efd;
	us->type = type;
	us->ctx = ctx;
	us->vs = vs;
	atomic_init(&us->nonblock, !!(flags & SOCK_NONBLOCK));
	pthread_mutex_init(&us->tx_mu, NULL);
	pthread_mutex_init(&us->rx_mu, NULL);
	pthread_mutex_init(&us->pmu, NULL);
	sock_cache_opts(us);
	r = fdt_insert(us);
	if (r < 0)
		goto out_free;
	pthread_mutex_lock(&ctx->mu);
	us->next = ctx->socks;
	if (ctx->socks)
		ctx->socks->prev = us;
	ctx->socks = us;
	pthread_mutex_unlock(&ctx->mu);
	vsock_sock_set_user(vs, us);
	return efd;

out_free:
	pthread_mutex_destroy(&us->tx_mu);
	pthread_mutex_destroy(&us->rx_mu);
	pthread_mutex_destroy(&us->pmu);
	free(us);
out_close_efd:
	close(efd);
out_close_vs:
	vsock_sock_close(vs);
	return r;
}

int uvsock_socket(struct uvsock_ctx *ctx, int type, int protocol)
{
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
	enum vsock_type vtype;
	struct vsock_sock *vs;
	int r;

	if (!ctx)
		return ret_errno(-EINVAL);
	if (protocol != 0 && protocol != PF_VSOCK)
		return ret_errno(-EPROTONOSUPPORT);
	if (base != SOCK_STREAM && base != SOCK_SEQPACKET && base != SOCK_DGRAM)
		return ret_errno(-ESOCKTNOSUPPORT);
	if (base == SOCK_STREAM)
		vtype = VSOCK_TYPE_STREAM;
	else if (base == SOCK_DGRAM)
		vtype = VSOCK_TYPE_DGRAM;
	else
		vtype = VSOCK_TYPE_SEQPACKET;
	r = vsock_sock_new(ctx->engine, vtype, &vs);
	if (r < 0)
		return ret_errno(r);
	return ret_errno(sock_wrap(ctx, vs, base, type));
}

static void sock_close_common(struct usock *us)
{
	atomic_store(&us->closed, true);
	sock_wake_all(us);
	sock_put(us); /* the table's reference */
}

int uvsock_close(int fd)
{
	struct usock *us = fdt_remove(fd, NULL);

	if (!us) {
		errno = fd >= 0 && fcntl(fd, F_GETFD) >= 0 ? ENOTSOCK : EBADF;
		return -1;
	}
	sock_close_common(us);
	return 0;
}

void lib_ctx_close_all(struct uvsock_ctx *ctx)
{
	struct usock *us;

	for (;;) {
		pthread_mutex_lock(&ctx->mu);
		us = ctx->socks;
		if (us && !fdt_remove(us->fd, us)) {
			/* Already closed but still referenced: a call is in flight (misuse). */
			if (us->next)
				us->next->prev = NULL;
			ctx->socks = us->next;
			us->prev = us->next = NULL;
			pthread_mutex_unlock(&ctx->mu);
			continue;
		}
		pthread_mutex_unlock(&ctx->mu);
		if (!us)
			break;
		sock_close_common(us);
	}
}

/* ---- Addresses --------------------------------------------------------------------------- */

static int addr_in(const struct sockaddr *addr, socklen_t len, struct sockaddr_vm *ret)
{
	struct sockaddr_vm svm;

	/* Linux: a NULL address of nonzero length fails copying it in (net/socket.c
	 * move_addr_to_kernel), a short one is EINVAL (af_vsock.c vsock_bind, vsock_connect). */
	if (!addr && len > 0)
		return -EFAULT;
	if (!addr || len < (socklen_t)sizeof(svm))
		return -EINVAL;
	memcpy(&svm, addr, sizeof(svm));
	if (svm.svm_family != AF_VSOCK || svm.svm_zero[0] != 0)
		return -EINVAL;
	*ret = svm;
	return 0;
}

static int addr_out(uint32_t cid, uint32_t port, struct sockaddr *addr, socklen_t *len)
{
	struct sockaddr_vm svm;

	if (!addr || !len)
		return -EINVAL;
	memset(&svm, 0, sizeof(svm));
	svm.svm_family = AF_VSOCK;
	svm.svm_cid = cid;
	svm.svm_port = port;
	memcpy(addr, &svm, MIN((size_t)*len, sizeof(svm)));
	*len = sizeof(svm);
	return 0;
}

int uvsock_bind(int fd, const struct sockaddr *addr, socklen_t addrlen)
{
	struct usock *us = sock_get(fd);
	struct sockaddr_vm svm;
	uint32_t lcid, lport;
	int r;

	if (!us)
		return -1;
	r = addr_in(addr, addrlen, &svm);
	if (r < 0)
		goto out;
	/* Linux order: already bound (EINVAL), foreign CID, reserved port, port in use. */
	r = vsock_sock_local_addr(us->vs, &lcid, &lport);
	if (r == 0 && lport != VMADDR_PORT_ANY) {
		r = -EINVAL;
		goto out;
	}
	if (svm.svm_cid != VMADDR_CID_ANY && svm.svm_cid != vsock_engine_local_cid(us->ctx->engine)) {
		r = -EADDRNOTAVAIL;
		goto out;
	}
	if ((us->ctx->flags & UVSOCK_CTX_UNPRIVILEGED) && svm.svm_port != VMADDR_PORT_ANY &&
	    svm.svm_port <= VSOCK_LAST_RESERVED_PORT) {
		r = -EACCES;
		goto out;
	}
	r = vsock_sock_bind(us->vs, svm.svm_cid, svm.svm_port);
out:
	sock_put(us);
	return ret_errno(r);
}

/* getsockname/getpeername: the address that get (local or peer) reports, as a sockaddr_vm. */
static int sock_name(int fd, struct sockaddr *addr, socklen_t *addrlen,
		     int (*get)(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port))
{
	struct usock *us = sock_get(fd);
	uint32_t cid, port;
	int r;

	if (!us)
		return -1;
	r = get(us->vs, &cid, &port);
	if (r == 0)
		r = addr_out(cid, port, addr, addrlen);
	sock_put(us);
	return ret_errno(r);
}

int uvsock_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return sock_name(fd, addr, addrlen, vsock_sock_local_addr);
}

/* getpeername of either kind of socket: a datagram socket's is its default peer. */
static int sock_peer_addr(struct vsock_sock *s, uint32_t *ret_cid, uint32_t *ret_port)
{
	if (vsock_sock_type(s) == VSOCK_TYPE_DGRAM)
		return vsock_dgram_peer_addr(s, ret_cid, ret_port);
	return vsock_sock_peer_addr(s, ret_cid, ret_port);
}

int uvsock_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return sock_name(fd, addr, addrlen, sock_peer_addr);
}

/* ---- Datagrams ---------------------------------------------------------------------------- */

/* connect(2) of a SOCK_DGRAM socket: the default peer; AF_UNSPEC clears it (Linux UDP). */
static int dgram_connect(struct usock *us, const struct sockaddr *addr, socklen_t addrlen)
{
	struct sockaddr_vm svm;
	int r;

	if (addr && addrlen >= (socklen_t)sizeof(sa_family_t) && addr->sa_family == AF_UNSPEC)
		return vsock_dgram_connect(us->vs, 0, 0, true);
	r = addr_in(addr, addrlen, &svm);
	if (r < 0)
		return r;
	return vsock_dgram_connect(us->vs, svm.svm_cid, svm.svm_port, false);
}

/* The blocking mode and deadline of a datagram call (O_NONBLOCK, MSG_DONTWAIT, *timeo). */
static bool dgram_nonblock(struct usock *us, int flags, _Atomic uint64_t *timeo,
			   uint64_t *ret_deadline)
{
	*ret_deadline = deadline_after(atomic_load(timeo));
	return atomic_load(&us->nonblock) || (flags & MSG_DONTWAIT) ||
	       atomic_load(timeo) == TIMEO_IMMEDIATE;
}

/*
 * sendmsg(2) of a SOCK_DGRAM socket: one datagram to msg_name (msg_namelen != 0) or the default
 * peer. Blocks (unless non-blocking) while the socket's send quota is full. No lock of ours.
 */
static ssize_t dgram_sendmsg(struct usock *us, const struct msghdr *msg, int flags)
{
	struct vsock_dgram_addr to, *top = NULL;
	struct sockaddr_vm svm;
	uint64_t deadline;
	bool nonblock;
	unsigned seq;
	ssize_t r;

	if (flags & MSG_OOB)
		return -EOPNOTSUPP;
	if (msg->msg_namelen) {
		r = addr_in(msg->msg_name, msg->msg_namelen, &svm);
		if (r < 0)
			return r;
		to = (struct vsock_dgram_addr){ .cid = svm.svm_cid, .port = svm.svm_port };
		top = &to;
	}
	r = iov_check(msg->msg_iov, msg->msg_iovlen);
	if (r < 0)
		return r;
	nonblock = dgram_nonblock(us, flags, &us->sndtimeo, &deadline);
	do {
		seq = atomic_load(&us->evseq);
		if (atomic_load(&us->closed))
			return -EBADF;
		r = vsock_dgram_send(us->vs, top, msg->msg_iov, (int)msg->msg_iovlen);
	} while (sock_retry(us, r, seq, nonblock, deadline));
	return r;
}

/*
 * recvmsg(2) of a SOCK_DGRAM socket: one whole datagram (MSG_TRUNC in msg_flags if cut; with
 * MSG_TRUNC in flags its full length is returned), its source in msg_name.
 */
static ssize_t dgram_recvmsg(struct usock *us, struct msghdr *msg, int flags)
{
	struct vsock_dgram_addr src;
	uint64_t deadline;
	int mflags = 0;
	bool nonblock;
	unsigned seq;
	ssize_t r;

	if (flags & (MSG_OOB | MSG_ERRQUEUE))
		return -EOPNOTSUPP;
	r = iov_check(msg->msg_iov, msg->msg_iovlen);
	if (r < 0)
		return r;
	msg->msg_flags = 0;
	nonblock = dgram_nonblock(us, flags, &us->rcvtimeo, &deadline);
	do {
		seq = atomic_load(&us->evseq);
		if (atomic_load(&us->closed))
			return -EBADF;
		r = vsock_dgram_recv(us->vs, msg->msg_iov, (int)msg->msg_iovlen,
				     flags & (MSG_PEEK | MSG_TRUNC), &mflags, &src);
	} while (sock_retry(us, r, seq, nonblock, deadline));
	if (r < 0)
		return r;
	msg->msg_flags = mflags;
	if (msg->msg_name)
		addr_out(src.cid, src.port, msg->msg_name, &msg->msg_namelen);
	else
		msg->msg_namelen = 0;
	return r;
}

/* ---- Connection setup -------------------------------------------------------------------- */

int uvsock_listen(int fd, int backlog)
{
	struct usock *us = sock_get(fd);
	uint32_t cid, port;
	int r;

	if (!us)
		return -1;
	if (us->type == SOCK_DGRAM) {
		r = -EOPNOTSUPP; /* Linux: sock_no_listen */
		goto out;
	}
	/* Linux: listen() on an unbound socket is EINVAL (no auto-bind). */
	r = vsock_sock_local_addr(us->vs, &cid, &port);
	if (r == 0 && port == VMADDR_PORT_ANY)
		r = -EINVAL;
	if (r == 0)
		r = vsock_sock_listen(us->vs, backlog);
out:
	pollfd_refresh(us);
	sock_put(us);
	return ret_errno(r);
}

int uvsock_accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
	struct usock *us = sock_get(fd);
	struct vsock_sock *child;
	uint64_t deadline;
	uint32_t cid, port;
	bool nonblock;
	unsigned seq;
	int r, nfd;

	if (!us)
		return -1;
	if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) {
		r = -EINVAL;
		goto out;
	}
	if (us->type == SOCK_DGRAM) {
		r = -EOPNOTSUPP; /* Linux: sock_no_accept */
		goto out;
	}
	if (addr && !addrlen) {
		r = -EINVAL;
		goto out;
	}
	nonblock = atomic_load(&us->nonblock);
	deadline = deadline_after(atomic_load(&us->rcvtimeo));
	if (vsock_sock_state(us->vs) != VSOCK_SS_LISTEN) {
		r = -EINVAL;
		goto out;
	}
	r = lock_until(&us->rx_mu, nonblock, deadline);
	if (r < 0)
		goto out;
	for (;;) {
		seq = atomic_load(&us->evseq);
		if (atomic_load(&us->closed)) {
			r = -EBADF;
			break;
		}
		r = vsock_sock_accept(us->vs, &child);
		if (!sock_retry(us, r, seq, nonblock, deadline))
			break;
	}
	pthread_mutex_unlock(&us->rx_mu);
	if (r < 0)
		goto out;
	if (addr && vsock_sock_peer_addr(child, &cid, &port) == 0)
		addr_out(cid, port, addr, addrlen);
	else if (addr)
		addr_out(VMADDR_CID_ANY, VMADDR_PORT_ANY, addr, addrlen);
	nfd = sock_wrap(us->ctx, child, us->type, flags);
	r = nfd;
out:
	if (us)
		pollfd_refresh(us);
	sock_put(us);
	return ret_errno(r);
}

int uvsock_accept(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
	return uvsock_accept4(fd, addr, addrlen, 0);
}

int uvsock_connect(int fd, const struct sockaddr *addr, socklen_t addrlen)
{
	struct usock *us = sock_get(fd);
	struct sockaddr_vm svm;
	enum vsock_state st;
	bool nonblock;
	unsigned seq;
	int r, err;

	if (!us)
		return -1;
	if (us->type == SOCK_DGRAM) {
		r = dgram_connect(us, addr, addrlen);
		goto out;
	}
	nonblock = atomic_load(&us->nonblock);
	st = vsock_sock_state(us->vs);
	if (st == VSOCK_SS_CONNECTING) {
		if (nonblock) {
			r = -EALREADY;
			goto out;
		}
		goto wait; /* Linux: a blocking connect() joins the attempt in progress */
	}
	r = addr_in(addr, addrlen, &svm);
	if (r < 0)
		goto out;
	if (st != VSOCK_SS_CONNECTED && st != VSOCK_SS_LISTEN && us->ctx->tops->connect_check) {
		r = us->ctx->tops->connect_check(us->ctx, svm.svm_cid);
		if (r < 0)
			goto out;
	}
	r = vsock_sock_connect(us->vs, svm.svm_cid, svm.svm_port);
	if (r != -EINPROGRESS && r != -EALREADY)
		goto out;
	if (nonblock) {
		pollfd_refresh(us);
		goto out;
	}
wait:
	/* The engine's connect timer (SO_VM_SOCKETS_CONNECT_TIMEOUT) ends the wait. */
	for (;;) {
		seq = atomic_load(&us->evseq);
		if (atomic_load(&us->closed)) {
			r = -EBADF;
			goto out;
		}
		st = vsock_sock_state(us->vs);
		if (st != VSOCK_SS_CONNECTING)
			break;
		sock_wait(us, seq, NO_DEADLINE);
	}
	err = vsock_sock_take_error(us->vs);
	if (err)
		r = -err;
	else if (st == VSOCK_SS_CONNECTED || st == VSOCK_SS_CLOSED || st == VSOCK_SS_CLOSING)
		r = 0; /* connected (and possibly already closed by the peer again) */
	else
		r = -ECONNRESET;
out:
	pollfd_refresh(us);
	sock_put(us);
	return ret_errno(r);
}

/* ---- Data ------------------------------------------------------------------------------- */

/* Linux's checks for a send that moves no bytes (len 0): EPIPE, ENOTCONN, else 0. */
static int send_zero_len(struct usock *us)
{
	struct vsock_sock_info info;

	vsock_sock_get_info(us->vs, &info);
	if ((info.shutdown & VSOCK_SHUTDOWN_SEND) || (info.peer_shutdown & VSOCK_SHUTDOWN_RCV))
		return -EPIPE;
	if (info.state != VSOCK_SS_CONNECTED)
		return -ENOTCONN;
	return 0;
}

/*
 * State of one sendmsg/recvmsg call between sock_io_begin and sock_io_end: the scratch iovec the
 * loop fills with sock_io_round, whether it may block, and its deadline.
 */
struct sock_io {
	struct iovec stack_iov[16];
	struct iovec *iov;          /* stack_iov, or malloc'd for a longer msg_iov */
	bool nonblock;
	uint64_t deadline;
};

/*
 * Starts a data call on us: scratch iovec for msg, blocking mode from O_NONBLOCK, MSG_DONTWAIT
 * and *timeo (SO_SNDTIMEO or SO_RCVTIMEO), deadline from *timeo, then takes the direction's
 * lock mu. Returns 0 (end with sock_io_end), -ENOMEM or -EAGAIN (lock not taken in time;
 * nothing to end).
 */
static int sock_io_begin(struct usock *us, struct sock_io *io, const struct msghdr *msg, int flags,
			 _Atomic uint64_t *timeo, pthread_mutex_t *mu)
{
	int r;

	io->iov = io->stack_iov;
	if (msg->msg_iovlen > ARRAY_SIZE(io->stack_iov)) {
		io->iov = malloc(msg->msg_iovlen * sizeof(*io->iov));
		if (!io->iov)
			return -ENOMEM;
	}
	io->nonblock = atomic_load(&us->nonblock) || (flags & MSG_DONTWAIT);
	io->deadline = deadline_after(atomic_load(timeo));
	if (atomic_load(timeo) == TIMEO_IMMEDIATE)
		io->nonblock = true;
	r = lock_until(mu, io->nonblock, io->deadline);
	if (r < 0 && io->iov != io->stack_iov)
		free(io->iov);
	return r;
}

/*
 * Ends a data call started by sock_io_begin: unlocks mu, frees the scratch iovec. Returns the
 * call's result: the `total` bytes moved if any (STREAM: a partial count wins over the error
 * that stopped the loop), else r.
 */
static ssize_t sock_io_end(struct sock_io *io, pthread_mutex_t *mu, ssize_t total, ssize_t r)
{
	pthread_mutex_unlock(mu);
	if (io->iov != io->stack_iov)
		free(io->iov);
	return total > 0 ? total : r;
}

/* The last step of every data call: poll state refreshed, the reference dropped, errno set. */
static ssize_t sock_data_done(struct usock *us, ssize_t r)
{
	pollfd_refresh(us);
	sock_put(us);
	return ret_errno_ssize(r);
}

/*
 * Starts one round of a send or recv loop: notes the event sequence the round may wait on
 * (*seq) and points io->iov at what is left of msg's iovecs after `done` of `len` bytes.
 * Returns the entry count, or -EBADF if the socket was closed meanwhile.
 */
static int sock_io_round(struct usock *us, struct sock_io *io, const struct msghdr *msg,
			 size_t done, size_t len, unsigned *seq)
{
	*seq = atomic_load(&us->evseq);
	if (atomic_load(&us->closed))
		return -EBADF;
	return iov_slice(msg->msg_iov, msg->msg_iovlen, done, len - done, io->iov,
			 msg->msg_iovlen);
}

/* sendmsg on a STREAM or SEQPACKET socket (sock_msg has checked msg). */
static ssize_t stream_sendmsg(struct usock *us, const struct msghdr *msg, int flags)
{
	ssize_t len, r, total = 0;
	struct sock_io io;
	unsigned seq;
	int n, eflags;

	if (flags & MSG_OOB)
		return -EOPNOTSUPP;
	if (msg->msg_namelen)
		return vsock_sock_state(us->vs) == VSOCK_SS_CONNECTED ? -EISCONN : -EOPNOTSUPP;
	len = iov_check(msg->msg_iov, msg->msg_iovlen);
	if (len < 0)
		return len;
	if (len == 0)
		return send_zero_len(us);
	eflags = flags & MSG_EOR;
	r = sock_io_begin(us, &io, msg, flags, &us->sndtimeo, &us->tx_mu);
	if (r < 0)
		return r;
	/* Each round: what is left of msg's iovecs, or the socket closed meanwhile (n < 0). */
	while ((n = sock_io_round(us, &io, msg, (size_t)total, (size_t)len, &seq)) >= 0) {
		/* Direct TX: the transport copies what it can straight into its TX buffers. */
		r = 0;
		if (us->type == SOCK_STREAM && us->ctx->tops->send_direct)
			r = us->ctx->tops->send_direct(us->ctx, us->vs, io.iov, n,
						       (size_t)len - (size_t)total);
		if (r > 0) {
			total += r;
			if (total >= len)
				break;
			continue;
		}
		r = vsock_sock_send(us->vs, io.iov, n, eflags);
		if (r > 0) {
			total += r;
			if (total >= len)
				break;
			continue;
		}
		if (!sock_retry(us, r, seq, io.nonblock, io.deadline))
			break;
	}
	return sock_io_end(&io, &us->tx_mu, total, n < 0 ? n : r);
}

ssize_t uvsock_send(int fd, const void *buf, size_t len, int flags)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	return uvsock_sendmsg(fd, &msg, flags);
}

/* Linux's result for a recv of 0 bytes: 0 if connected or done, else ENOTCONN. */
static int recv_zero_len(struct usock *us)
{
	struct vsock_sock_info info;

	vsock_sock_get_info(us->vs, &info);
	if (info.state == VSOCK_SS_CONNECTED)
		return 0;
	if ((info.state == VSOCK_SS_CLOSED || info.state == VSOCK_SS_CLOSING) &&
	    (info.peer_shutdown || info.shutdown))
		return 0;
	return -ENOTCONN;
}

/* recvmsg on a STREAM or SEQPACKET socket (sock_msg has checked msg). */
static ssize_t stream_recvmsg(struct usock *us, struct msghdr *msg, int flags)
{
	ssize_t len, r, total = 0;
	int n, eflags, mflags = 0;
	struct sock_io io;
	uint64_t target = 1;
	unsigned seq;

	if (flags & (MSG_OOB | MSG_ERRQUEUE))
		return -EOPNOTSUPP;
	len = iov_check(msg->msg_iov, msg->msg_iovlen);
	if (len < 0)
		return len;
	msg->msg_namelen = 0;
	msg->msg_flags = 0;
	if (len == 0)
		return recv_zero_len(us);
	if (us->type == SOCK_STREAM) {
		/* Linux: the wait target must stay below the receive buffer (ENOMEM). */
		target = (flags & MSG_WAITALL) ? (uint64_t)len
					       : MIN((uint64_t)atomic_load(&us->rcvlowat), (uint64_t)len);
		if (target >= atomic_load(&us->bufsize) &&
		    vsock_sock_state(us->vs) == VSOCK_SS_CONNECTED)
			return -ENOMEM;
	}
	eflags = flags & (MSG_PEEK | MSG_TRUNC);
	r = sock_io_begin(us, &io, msg, flags, &us->rcvtimeo, &us->rx_mu);
	if (r < 0)
		return r;
	/* Each round: what is left of msg's iovecs, or the socket closed meanwhile (n < 0). */
	while ((n = sock_io_round(us, &io, msg, (size_t)total, (size_t)len, &seq)) >= 0) {
		mflags = 0;
		r = vsock_sock_recv(us->vs, io.iov, n, eflags, &mflags);
		if (r == -EINVAL && vsock_sock_state(us->vs) == VSOCK_SS_LISTEN)
			r = -ENOTCONN; /* Linux: recv on a listener is ENOTCONN */
		if (r > 0 && us->type == SOCK_STREAM) {
			total += r;
			/* Linux (af_vsock.c __vsock_stream_recvmsg): up to the target, unless a
			 * peek; a non-blocking call or a timeout returns what was read. */
			if ((uint64_t)total >= target || (flags & MSG_PEEK))
				break;
			continue;
		}
		if (r < 0 && sock_retry(us, r, seq, io.nonblock, io.deadline))
			continue;
		if (r >= 0)
			msg->msg_flags = mflags;
		break;
	}
	return sock_io_end(&io, &us->rx_mu, total, n < 0 ? n : r);
}

/*
 * What sendmsg and recvmsg share: the socket, a NULL msg (EFAULT, as Linux's net/socket.c
 * copy_msghdr_from_user), then the datagram or the stream path, and the end of a data call.
 * With send, msg is only read.
 */
static ssize_t sock_msg(int fd, struct msghdr *msg, int flags, bool send)
{
	struct usock *us = sock_get(fd);
	ssize_t r;

	if (!us)
		return -1;
	if (!msg)
		r = -EFAULT;
	else if (us->type == SOCK_DGRAM)
		r = send ? dgram_sendmsg(us, msg, flags) : dgram_recvmsg(us, msg, flags);
	else
		r = send ? stream_sendmsg(us, msg, flags) : stream_recvmsg(us, msg, flags);
	return sock_data_done(us, r);
}

ssize_t uvsock_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	return sock_msg(fd, (struct msghdr *)msg, flags, true);
}

ssize_t uvsock_recvmsg(int fd, struct msghdr *msg, int flags)
{
	return sock_msg(fd, msg, flags, false);
}

ssize_t uvsock_recv(int fd, void *buf, size_t len, int flags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	return uvsock_recvmsg(fd, &msg, flags);
}

ssize_t uvsock_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
		      socklen_t addrlen)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_name = (void *)addr, .msg_namelen = addr ? addrlen : 0,
			      .msg_iov = &iov, .msg_iovlen = 1 };

	return uvsock_sendmsg(fd, &msg, flags);
}

ssize_t uvsock_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *addrlen)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_name = addr, .msg_namelen = addr && addrlen ? *addrlen : 0,
			      .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t r;

	if (addr && !addrlen) {
		errno = EINVAL;
		return -1;
	}
	if (!addr)
		msg.msg_name = NULL;
	r = uvsock_recvmsg(fd, &msg, flags);
	if (r >= 0 && addr)
		*addrlen = msg.msg_namelen;
	return r;
}

int uvsock_shutdown(int fd, int how)
{
	struct usock *us = sock_get(fd);
	int r;

	if (!us)
		return -1;
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		r = -EINVAL;
	else
		r = vsock_sock_shutdown(us->vs, (unsigned)how + 1);
	/* Blocked readers/writers re-check their condition. */
	sock_wake_all(us);
	pollfd_refresh(us);
	sock_put(us);
	return ret_errno(r);
}

/* ---- Options ---------------------------------------------------------------------------- */

static int timeval_to_ns(const void *val, socklen_t len, bool allow_negative, uint64_t *ret)
{
	struct timeval tv;

	if (!val || len < (socklen_t)sizeof(tv))
		return -EINVAL;
	memcpy(&tv, val, sizeof(tv));
	if (tv.tv_usec < 0 || tv.tv_usec >= 1000000)
		return -EDOM;
	if (tv.tv_sec < 0) {
		if (!allow_negative)
			return -ERANGE;
		*ret = TIMEO_IMMEDIATE;
		return 0;
	}
	if ((uint64_t)tv.tv_sec > (UINT64_MAX / NS_PER_SEC) - 1)
		*ret = 0;
	else
		*ret = (uint64_t)tv.tv_sec * NS_PER_SEC + (uint64_t)tv.tv_usec * NS_PER_US;
	return 0;
}

static int ns_to_timeval(uint64_t ns, void *val, socklen_t *len, bool truncate)
{
	struct timeval tv = { 0 };

	if (ns != TIMEO_IMMEDIATE) {
		tv.tv_sec = (time_t)(ns / NS_PER_SEC);
		tv.tv_usec = (suseconds_t)((ns % NS_PER_SEC + NS_PER_US - 1) / NS_PER_US);
		if (tv.tv_usec == 1000000) {
			tv.tv_sec++;
			tv.tv_usec = 0;
		}
	}
	if (!truncate && *len < (socklen_t)sizeof(tv))
		return -EINVAL;
	memcpy(val, &tv, MIN((size_t)*len, sizeof(tv)));
	*len = (socklen_t)MIN((size_t)*len, sizeof(tv));
	return 0;
}

static int int_out(int v, void *val, socklen_t *len)
{
	memcpy(val, &v, MIN((size_t)*len, sizeof(v)));
	*len = (socklen_t)MIN((size_t)*len, sizeof(v));
	return 0;
}

static int vsock_opt_of(int optname, enum vsock_sockopt *ret)
{
	switch (optname) {
	case SO_VM_SOCKETS_BUFFER_SIZE:
		*ret = VSOCK_OPT_BUFFER_SIZE;
		return 0;
	case SO_VM_SOCKETS_BUFFER_MIN_SIZE:
		*ret = VSOCK_OPT_BUFFER_MIN_SIZE;
		return 0;
	case SO_VM_SOCKETS_BUFFER_MAX_SIZE:
		*ret = VSOCK_OPT_BUFFER_MAX_SIZE;
		return 0;
	case SO_VM_SOCKETS_CONNECT_TIMEOUT_OLD:
	case SO_VM_SOCKETS_CONNECT_TIMEOUT_NEW:
		*ret = VSOCK_OPT_CONNECT_TIMEOUT;
		return 0;
	default:
		return -ENOPROTOOPT;
	}
}

/* The largest connect timeout Linux accepts (MAX_SCHEDULE_TIMEOUT / HZ - 1 s, HZ = 1000). */
#define CONNECT_TIMEOUT_MAX_S ((uint64_t)LONG_MAX / 1000 - 1)

int uvsock_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen)
{
	struct usock *us = sock_get(fd);
	enum vsock_sockopt opt;
	uint64_t v;
	int r, iv;

	if (!us)
		return -1;
	if (level == AF_VSOCK) {
		r = vsock_opt_of(optname, &opt);
		if (r < 0)
			goto out;
		if (opt == VSOCK_OPT_CONNECT_TIMEOUT) {
			struct timeval tv;

			if (!optval || optlen < (socklen_t)sizeof(tv)) {
				r = -EINVAL;
				goto out;
			}
			memcpy(&tv, optval, sizeof(tv));
			if (tv.tv_sec < 0 || tv.tv_usec < 0 || tv.tv_usec >= 1000000 ||
			    (uint64_t)tv.tv_sec >= CONNECT_TIMEOUT_MAX_S ||
			    (uint64_t)tv.tv_sec > UINT64_MAX / NS_PER_SEC - 1) {
				r = -ERANGE;
				goto out;
			}
			v = (uint64_t)tv.tv_sec * NS_PER_SEC + (uint64_t)tv.tv_usec * NS_PER_US;
		} else {
			if (!optval || optlen < (socklen_t)sizeof(v)) {
				r = -EINVAL;
				goto out;
			}
			memcpy(&v, optval, sizeof(v));
		}
		r = vsock_sock_setopt(us->vs, opt, v);
		sock_cache_opts(us);
		goto out;
	}
	if (level != SOL_SOCKET) {
		r = -ENOPROTOOPT;
		goto out;
	}
	if (us->type == SOCK_DGRAM && (optname == SO_RCVBUF || optname == SO_SNDBUF)) {
		r = optval && optlen >= (socklen_t)sizeof(iv) ? 0 : -EINVAL;
		if (r == 0) {
			memcpy(&iv, optval, sizeof(iv));
			r = vsock_dgram_set_buf(us->vs, optname == SO_RCVBUF,
						iv < 0 ? 0 : (uint64_t)iv);
		}
		pollfd_refresh(us);
		goto out;
	}
	switch (optname) {
	case SO_RCVTIMEO_OLD:
	case SO_RCVTIMEO_NEW:
	case SO_SNDTIMEO_OLD:
	case SO_SNDTIMEO_NEW:
		r = timeval_to_ns(optval, optlen, true, &v);
		if (r < 0)
			break;
		if (optname == SO_RCVTIMEO_OLD || optname == SO_RCVTIMEO_NEW)
			atomic_store(&us->rcvtimeo, v);
		else
			atomic_store(&us->sndtimeo, v);
		break;
	case SO_RCVLOWAT:
		if (!optval || optlen < (socklen_t)sizeof(int)) {
			r = -EINVAL;
			break;
		}
		memcpy(&iv, optval, sizeof(iv));
		if (iv < 0)
			iv = INT_MAX;
		r = vsock_sock_setopt(us->vs, VSOCK_OPT_RCVLOWAT, (uint64_t)iv);
		sock_cache_opts(us);
		/* POLLIN depends on rcvlowat. */
		sock_wake_all(us);
		pollfd_refresh(us);
		break;
	default:
		r = -ENOPROTOOPT;
		break;
	}
out:
	sock_put(us);
	return ret_errno(r);
}

int uvsock_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
{
	struct usock *us = sock_get(fd);
	enum vsock_sockopt opt;
	uint64_t v;
	int r;

	if (!us)
		return -1;
	if (!optval || !optlen) {
		r = -EINVAL;
		goto out;
	}
	if (level == AF_VSOCK) {
		r = vsock_opt_of(optname, &opt);
		if (r < 0)
			goto out;
		r = vsock_sock_getopt(us->vs, opt, &v);
		if (r < 0)
			goto out;
		if (opt == VSOCK_OPT_CONNECT_TIMEOUT) {
			r = ns_to_timeval(v, optval, optlen, false);
			goto out;
		}
		if (*optlen < (socklen_t)sizeof(v)) {
			r = -EINVAL;
			goto out;
		}
		memcpy(optval, &v, sizeof(v));
		*optlen = sizeof(v);
		goto out;
	}
	if (level != SOL_SOCKET) {
		r = -ENOPROTOOPT;
		goto out;
	}
	if ((int)*optlen < 0) {
		r = -EINVAL;
		goto out;
	}
	if (us->type == SOCK_DGRAM && (optname == SO_RCVBUF || optname == SO_SNDBUF)) {
		r = vsock_dgram_get_buf(us->vs, optname == SO_RCVBUF, &v);
		if (r == 0)
			r = int_out((int)MIN(v, (uint64_t)INT_MAX), optval, optlen);
		goto out;
	}
	switch (optname) {
	case SO_RCVTIMEO_OLD:
	case SO_RCVTIMEO_NEW:
		r = ns_to_timeval(atomic_load(&us->rcvtimeo), optval, optlen, true);
		break;
	case SO_SNDTIMEO_OLD:
	case SO_SNDTIMEO_NEW:
		r = ns_to_timeval(atomic_load(&us->sndtimeo), optval, optlen, true);
		break;
	case SO_RCVLOWAT:
		r = vsock_sock_getopt(us->vs, VSOCK_OPT_RCVLOWAT, &v);
		if (r == 0)
			r = int_out((int)MIN(v, (uint64_t)INT_MAX), optval, optlen);
		break;
	case SO_ERROR:
		r = int_out(vsock_sock_take_error(us->vs), optval, optlen);
		pollfd_refresh(us);
		break;
	case SO_TYPE:
		r = int_out(us->type, optval, optlen);
		break;
	case SO_DOMAIN:
		r = int_out(AF_VSOCK, optval, optlen);
		break;
	case SO_PROTOCOL:
		r = int_out(0, optval, optlen);
		break;
	case SO_ACCEPTCONN:
		r = int_out(vsock_sock_state(us->vs) == VSOCK_SS_LISTEN, optval, optlen);
		break;
	default: /* an option we do not know */
		r = -ENOPROTOOPT;
	}
out:
	sock_put(us);
	return ret_errno(r);
}

int uvsock_fcntl(int fd, int cmd, int arg)
{
	struct usock *us = sock_get(fd);
	int r;

	if (!us)
		return -1;
	switch (cmd) {
	case F_GETFL:
		r = O_RDWR | (atomic_load(&us->nonblock) ? O_NONBLOCK : 0);
		break;
	case F_SETFL:
		atomic_store(&us->nonblock, !!(arg & O_NONBLOCK));
		r = 0;
		break;
	default:
		r = -EINVAL;
		break;
	}
	sock_put(us);
	return ret_errno(r);
}

int uvsock_set_nonblock(int fd, int on)
{
	return uvsock_fcntl(fd, F_SETFL, on ? O_NONBLOCK : 0);
}

/* ---- Polling ---------------------------------------------------------------------------- */

#define POLL_INTEREST_BITS (POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP)
#define POLL_STACK_FDS 16 /* uvsock_poll: up to this many descriptors without an allocation */

int uvsock_poll_events(int fd)
{
	struct usock *us = sock_get(fd);
	int r;

	if (!us)
		return -1;
	r = (int)vsock_sock_poll(us->vs);
	sock_put(us);
	return r;
}

static void set_interest(struct usock *us, unsigned events, bool arm)
{
	pthread_mutex_lock(&us->pmu);
	us->interest = arm ? (events | POLLERR | POLLHUP) : 0;
	atomic_store(&us->armed, arm);
	if (!arm)
		pollfd_apply(us, 0);
	pthread_mutex_unlock(&us->pmu);
	if (arm)
		pollfd_refresh(us);
}

int uvsock_poll_interest(int fd, short events)
{
	struct usock *us;

	if ((unsigned short)events & ~(unsigned)POLL_INTEREST_BITS) {
		us = sock_get(fd);
		if (!us)
			return -1;
		sock_put(us);
		return ret_errno(-EINVAL);
	}
	us = sock_get(fd);
	if (!us)
		return -1;
	set_interest(us, (unsigned short)events, events != 0);
	sock_put(us);
	return 0;
}

/*
 * Fills revents for every entry; returns the number of ready entries. With kfds, also sets
 * *direct to the context of every socket polled if they all share one whose transport has
 * rx_wait (direct RX), else NULL.
 */
static int poll_scan(struct pollfd *fds, nfds_t nfds, struct pollfd *kfds, bool arm,
		     struct uvsock_ctx **direct)
{
	bool mixed = false;
	int ready = 0;

	if (direct)
		*direct = NULL;
	for (nfds_t i = 0; i < nfds; i++) {
		struct usock *us;
		unsigned m, want;

		fds[i].revents = 0;
		if (kfds) {
			kfds[i].fd = -1;
			kfds[i].events = POLLIN;
		}
		if (fds[i].fd < 0)
			continue;
		us = sock_get(fds[i].fd);
		if (!us) {
			fds[i].revents = POLLNVAL;
			ready++;
			continue;
		}
		want = ((unsigned short)fds[i].events & (POLLIN | POLLOUT | POLLRDHUP)) | POLLERR |
		       POLLHUP;
		if (arm)
			set_interest(us, want, true);
		m = vsock_sock_poll(us->vs);
		fds[i].revents = (short)(m & want);
		if (fds[i].revents)
			ready++;
		if (kfds)
			kfds[i].fd = us->fd;
		if (direct && !mixed && us->ctx->tops->rx_wait && (!*direct || *direct == us->ctx))
			*direct = us->ctx;
		else if (direct)
			mixed = true;
		sock_put(us);
	}
	if (mixed)
		*direct = NULL;
	return ready;
}

int uvsock_poll(struct pollfd *fds, nfds_t nfds, int timeout_ms)
{
	uint64_t deadline = timeout_ms < 0 ? NO_DEADLINE
					   : mono_ns() + (uint64_t)timeout_ms * NS_PER_MS;
	struct pollfd stack_kfds[POLL_STACK_FDS + 2], *kfds = stack_kfds;
	struct uvsock_ctx *direct;
	bool intr = false;
	int ready;

	if (nfds > (1u << 20) || (nfds && !fds))
		return ret_errno(-EINVAL);
	/* Two spare entries for the transport's own fds in rx_wait; no allocation for few fds. */
	memset(stack_kfds, 0, sizeof(stack_kfds));
	if (nfds > POLL_STACK_FDS)
		kfds = calloc(nfds + 2, sizeof(*kfds));
	if (!kfds)
		return ret_errno(-ENOMEM);
	ready = poll_scan(fds, nfds, kfds, true, &direct);
	while (ready == 0) {
		uint64_t now = mono_ns();
		int ms;

		if (now >= deadline)
			break;
		/* Direct RX: this caller drains the RX ring and sleeps on its interrupt too. */
		if (direct) {
			int r = direct->tops->rx_wait(direct, kfds, (unsigned)nfds, NULL, 0,
						      deadline);

			if (r == -EINTR) {
				intr = true;
				break;
			}
			if (r > 0) {
				ready = poll_scan(fds, nfds, NULL, false, NULL);
				continue;
			}
		}
		ms = deadline == NO_DEADLINE ? -1
					     : (int)MIN((deadline - now + 999999) / 1000000, INT_MAX);
		if (poll(kfds, nfds, ms) < 0 && errno == EINTR) {
			if (kfds != stack_kfds)
				free(kfds);
			return -1;
		}
		ready = poll_scan(fds, nfds, NULL, false, NULL);
	}
	if (kfds != stack_kfds)
		free(kfds);
	/* Interrupted in the direct wait: as poll(2), EINTR. */
	return intr ? ret_errno(-EINTR) : ready;
}
