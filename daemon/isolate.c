/* SPDX-License-Identifier: MIT */
/*
 * uvsockd --isolate (see isolate.h): forking the workers, their start-up (PR_SET_PDEATHSIG,
 * name, cgroup, then vms.c), the supervisor loop of the main process, and the request/response
 * protocol over one SOCK_SEQPACKET socketpair per worker that lets the control socket of the
 * main answer for the workers' VMs.
 *
 * Protocol (one message per datagram, both ends are this binary, so structs go as they are):
 *   worker -> main, once:     ISO_READY                    (devices up; or the worker exits)
 *   main -> worker:           struct iso_req {op, seq, vm} (vm: index among the worker's VMs)
 *   worker -> main, STATS:    one struct iso_stats_msg with the same seq
 *   worker -> main, CONNS:    struct iso_conns_msg batches, the final one with last = 1
 * The main drops answers whose seq is not the current request's (late answers of a request
 * that timed out).
 */
#include "isolate.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "ops/stats.h"
#include "sd.h"
#include "util/log.h"
#include "util/time.h"
#include "util/uds.h"
#include "vms.h"

#define ISO_CONNS_BATCH 32
/* A worker lists at most this many connections per request (the control socket's answer
 * would be truncated long before). */
#define ISO_CONNS_MAX 65536u
/* A worker's answer that the main does not take within this time is dropped. */
#define ISO_SEND_TIMEOUT_MS 2000
/*
 * A worker that fails (killed by a signal, or a non-zero exit) while uvsockd is not stopping is
 * started again after a back-off: ISO_RESTART_MIN_MS, doubled after each failure of a worker
 * that ran less than ISO_RESTART_STABLE_MS, at most ISO_RESTART_MAX_MS.
 */
#define ISO_RESTART_MIN_MS 200u
#define ISO_RESTART_MAX_MS 30000u
#define ISO_RESTART_STABLE_MS 10000u

enum iso_op {
	ISO_READY = 1,
	ISO_STATS,
	ISO_CONNS,
};

struct iso_req {
	uint32_t op;
	uint32_t seq;
	uint32_t vm;
};

struct iso_ans_hdr {
	uint32_t op;
	uint32_t seq;
	int32_t err;  /* 0 or a negative errno (no such VM) */
	uint32_t n;   /* CONNS: records in this batch */
	uint32_t last; /* CONNS: the final batch */
};

struct iso_stats_msg {
	struct iso_ans_hdr h;
	struct ops_vm_stats st;
};

struct iso_conns_msg {
	struct iso_ans_hdr h;
	struct ops_conn_info ci[ISO_CONNS_BATCH];
};

union iso_ans {
	struct iso_ans_hdr h;
	struct iso_stats_msg stats;
	struct iso_conns_msg conns;
};

/*
 * One worker, as the main process sees it. lock orders the main thread's changes of pid, alive
 * and fd (reaped: fd closed; restarted: a new pid and fd) against the control thread, which
 * holds it for a whole request and its answer (at most ISO_ANSWER_TIMEOUT_MS).
 */
struct worker {
	pthread_mutex_t lock;
	pid_t pid;
	/* Set by the main thread (under lock); read without it only to count the living. */
	_Atomic bool alive;
	int fd;             /* main's end of the socketpair, -1 if none */
	unsigned n;         /* its VMs: cfg->vms[idx[0..n)] */
	unsigned *idx;
	char vms[128];      /* "vm3 vm4" for the log */
	/* Main thread only: supervision. */
	uint64_t started_ms;    /* when this pid was forked */
	uint64_t restart_at_ms; /* 0, or when to start it again after a failure */
	uint32_t backoff_ms;    /* the back-off of its next restart */
	unsigned restarts;
	/* A VM of it has an inherited vhost-user socket (fd=, socket activation): dropped by the
	 * main once every worker had its own, it cannot be given to a new worker. */
	bool inherited;
	/* Control thread only (under lock). */
	uint32_t seq;
	uint64_t quiet_until_ms;
};

struct iso {
	const struct uvsockd_config *cfg;
	struct worker *w;
	unsigned nw;
	unsigned *worker_of; /* per cfg VM: its worker */
	unsigned *local;     /* per cfg VM: its index among the worker's VMs */
};

/* ---- the worker process ------------------------------------------------------------------ */

struct responder {
	int fd;
	struct vm_set *set;
	pthread_t th;
	bool started;
};

struct conns_buf {
	struct ops_conn_info *ci;
	size_t n, cap;
};

static bool collect_conn(void *arg, const struct ops_conn_info *ci)
{
	struct conns_buf *b = arg;

	if (b->n == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 64;
		struct ops_conn_info *p;

		if (cap > ISO_CONNS_MAX || !(p = realloc(b->ci, cap * sizeof(*p))))
			return false;
		b->ci = p;
		b->cap = cap;
	}
	b->ci[b->n++] = *ci;
	return true;
}

static bool send_msg(int fd, const void *m, size_t len)
{
	ssize_t r;

	do {
		r = send(fd, m, len, MSG_NOSIGNAL);
	} while (r < 0 && errno == EINTR);
	return r == (ssize_t)len;
}

/*
 * The connections of VM q->vm in batches. They are gathered first and sent afterwards: the
 * listing walks the device under its lock, and a send may wait for the main.
 */
static void answer_conns(struct responder *rs, const struct iso_req *q, bool have_vm)
{
	struct conns_buf b = { 0 };
	struct iso_conns_msg *m = calloc(1, sizeof(*m));
	size_t off = 0;

	if (!m)
		return;
	if (have_vm)
		vm_set_ctl_ops.vm_conns(rs->set, q->vm, collect_conn, &b);
	m->h = (struct iso_ans_hdr){ .op = ISO_CONNS, .seq = q->seq, .err = have_vm ? 0 : -ENOENT };
	do {
		size_t k = b.n - off < ISO_CONNS_BATCH ? b.n - off : ISO_CONNS_BATCH;

		for (size_t i = 0; i < k; i++)
			m->ci[i] = b.ci[off + i];
		off += k;
		m->h.n = (uint32_t)k;
		m->h.last = off == b.n;
	} while (send_msg(rs->fd, m, sizeof(*m)) && off < b.n);
	free(b.ci);
	free(m);
}

static void *responder_main(void *arg)
{
	struct responder *rs = arg;

	pthread_setname_np(pthread_self(), "uvsockd-ctl");
	for (;;) {
		struct iso_req q;
		ssize_t n = recv(rs->fd, &q, sizeof(q), 0);
		bool have_vm;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the main is gone, or we are stopping (shutdown) */
		if (n != sizeof(q))
			continue;
		have_vm = q.vm < vm_set_count(rs->set);
		if (q.op == ISO_STATS) {
			struct iso_stats_msg m = { .h = { .op = ISO_STATS, .seq = q.seq } };

			m.h.err = have_vm ? 0 : -ENOENT;
			if (have_vm)
				vm_set_ctl_ops.vm_stats(rs->set, q.vm, &m.st);
			(void)send_msg(rs->fd, &m, sizeof(m));
		} else if (q.op == ISO_CONNS) {
			answer_conns(rs, &q, have_vm);
		}
	}
	return NULL;
}

/* vm_set hooks of a worker: the responder runs while the devices exist; then report up. */
static int worker_ready(struct vm_set *s, void *arg)
{
	struct responder *rs = arg;
	struct iso_ans_hdr up = { .op = ISO_READY };
	int r;

	rs->set = s;
	/* The devices took their inherited sockets; the other workers' are not ours. */
	uds_drop_adopted();
	r = pthread_create(&rs->th, NULL, responder_main, rs);
	if (r) {
		log_error("cannot start a thread: %s", strerror(r));
		return -r;
	}
	rs->started = true;
	return send_msg(rs->fd, &up, sizeof(up)) ? 0 : -EPIPE;
}

static void worker_stopping(struct vm_set *s, void *arg)
{
	struct responder *rs = arg;

	(void)s;
	if (!rs->started)
		return;
	/* Wakes the responder's recv (and a send waiting for the main) with an end of file. */
	shutdown(rs->fd, SHUT_RDWR);
	pthread_join(rs->th, NULL);
	rs->started = false;
}

/* Moves this (single-threaded) process into the cgroup directory dir. */
static int join_cgroup(const char *dir)
{
	char path[UVSOCKD_CGROUP_PATH_MAX + 16], pid[24];
	int fd, n, r = 0;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (write(fd, pid, (size_t)n) != n)
		r = errno ? -errno : -EIO;
	close(fd);
	return r;
}

/*
 * The child side of fork(): never returns. restart: forked by the supervisor after start-up,
 * from a main process that runs the control thread.
 */
static __attribute__((noreturn)) void worker_main(struct iso *iso, unsigned wi, int fd,
						  const sigset_t *sigs, pid_t parent, bool restart)
{
	struct worker *w = &iso->w[wi];
	const struct uvsockd_vm_config *first = &iso->cfg->vms[w->idx[0]];
	struct responder rs = { .fd = fd };
	char name[16];
	int r;

	/* SIGTERM is in *sigs: the worker stops as on a forwarded SIGTERM, sockets removed. */
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
		_exit(1);
	if (restart) {
		/*
		 * Nothing of the main's is ours: the other workers' socketpairs, the control
		 * socket and its clients (a client must see its connection end with the main).
		 * The sockets inherited at start were dropped once every worker had its own.
		 */
		if ((fd > 3 && close_range(3, (unsigned)fd - 1, 0) < 0) ||
		    close_range((unsigned)fd + 1, ~0u, 0) < 0)
			_exit(1);
	} else {
		/* The main's ends of the other workers' socketpairs are not ours. */
		for (unsigned j = 0; j < iso->nw; j++)
			if (j != wi && iso->w[j].fd >= 0)
				close(iso->w[j].fd);
	}
	snprintf(name, sizeof(name), "uvsockd vm%u", first->guest_cid);
	(void)prctl(PR_SET_NAME, name);
	/* Before any device exists, before any guest memory is mapped. */
	if (first->cgroup[0]) {
		r = join_cgroup(first->cgroup);
		if (r < 0) {
			log_error("worker of %s: cannot join cgroup %s: %s", w->vms,
				  first->cgroup, strerror(-r));
			exit(1);
		}
	}
	r = vm_set_run(iso->cfg, w->idx, w->n, sigs,
		       &(struct vm_set_hooks){ worker_ready, worker_stopping, &rs });
	close(fd);
	/*
	 * A restarted worker holds copies of what the main's other threads allocated (the control
	 * thread's clients) that nothing of the worker refers to: no exit handler of the main's
	 * (a leak check among them) is for it.
	 */
	if (restart)
		_exit(r);
	exit(r);
}

/* ---- the main process: the control socket's callbacks ------------------------------------ */

/*
 * Sends a request for VM idx (a cfg index) to its worker (*ret_w). Returns 0, -ESRCH (the
 * worker is reaped), -ETIMEDOUT (it is quiet after a missed answer), or the errno of send
 * (-EAGAIN: its queue is full; -EPIPE/-ECONNRESET: it is gone).
 */
static int iso_ask(struct iso *iso, unsigned idx, uint32_t op, struct worker **ret_w)
{
	struct worker *w = &iso->w[iso->worker_of[idx]];
	struct iso_req q;

	*ret_w = w;
	if (!atomic_load_explicit(&w->alive, memory_order_relaxed) || w->fd < 0)
		return -ESRCH;
	if (mono_ms() < w->quiet_until_ms)
		return -ETIMEDOUT;
	q = (struct iso_req){ .op = op, .seq = ++w->seq, .vm = iso->local[idx] };
	if (send(w->fd, &q, sizeof(q), MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof(q))
		return -errno;
	return 0;
}

/*
 * One datagram of fd into buf, waiting until end_ms (mono_ms). Returns its length (0: the peer
 * is gone), -ETIMEDOUT, or -errno.
 */
static ssize_t recv_until(int fd, void *buf, size_t len, uint64_t end_ms)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = mono_ms();
		ssize_t n;

		if (now >= end_ms)
			return -ETIMEDOUT;
		if (poll(&p, 1, (int)(end_ms - now)) < 0 && errno != EINTR)
			return -errno;
		n = recv(fd, buf, len, MSG_DONTWAIT);
		if (n >= 0)
			return n;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
	}
}

/*
 * Receives the next answer of w to its current request into *a, waiting at most
 * ISO_ANSWER_TIMEOUT_MS. Returns 0, -ETIMEDOUT (then w stays quiet for ISO_QUIET_MS),
 * -ECONNRESET (the worker is gone) or -EPROTO (an answer of the wrong kind or size).
 */
static int iso_answer(struct worker *w, uint32_t op, union iso_ans *a)
{
	uint64_t end = mono_ms() + ISO_ANSWER_TIMEOUT_MS;
	size_t want = op == ISO_STATS ? sizeof(a->stats) : sizeof(a->conns);

	for (;;) {
		ssize_t n = recv_until(w->fd, a, sizeof(*a), end);

		if (n == -ETIMEDOUT) {
			w->quiet_until_ms = mono_ms() + ISO_QUIET_MS;
			log_warn("worker pid %d (%s) did not answer within %u ms", (int)w->pid,
				 w->vms, ISO_ANSWER_TIMEOUT_MS);
			return -ETIMEDOUT;
		}
		if (n <= 0)
			return -ECONNRESET;
		if ((size_t)n < sizeof(a->h) || a->h.seq != w->seq)
			continue; /* the late answer of an earlier request */
		if (a->h.op != op || (size_t)n != want ||
		    (op == ISO_CONNS && a->conns.h.n > ISO_CONNS_BATCH))
			return -EPROTO;
		return 0;
	}
}

static unsigned iso_vm_count(void *opaque)
{
	return ((struct iso *)opaque)->cfg->n_vms;
}

static uint32_t iso_vm_cid(void *opaque, unsigned idx)
{
	return ((struct iso *)opaque)->cfg->vms[idx].guest_cid;
}

static const char *iso_vm_uds_path(void *opaque, unsigned idx)
{
	return ((struct iso *)opaque)->cfg->vms[idx].uds_path;
}

static void iso_vm_stats(void *opaque, unsigned idx, struct ops_vm_stats *ret)
{
	struct iso *iso = opaque;
	uint32_t cid = iso->cfg->vms[idx].guest_cid;
	struct worker *w = &iso->w[iso->worker_of[idx]];
	union iso_ans a;
	int r;

	pthread_mutex_lock(&w->lock);
	r = iso_ask(iso, idx, ISO_STATS, &w);
	if (r == 0)
		r = iso_answer(w, ISO_STATS, &a);
	if (r == 0 && a.h.err == 0) {
		*ret = a.stats.st;
		snprintf(ret->name, sizeof(ret->name), "vm%u pid %d", cid, (int)w->pid);
	} else {
		bool gone = r == -ESRCH || r == -EPIPE || r == -ECONNRESET;

		snprintf(ret->name, sizeof(ret->name), "vm%u %s", cid,
			 gone ? "worker gone" : "no answer");
	}
	pthread_mutex_unlock(&w->lock);
	ret->cid = cid;
	snprintf(ret->socket, sizeof(ret->socket), "%s", iso->cfg->vms[idx].socket_path);
}

static void iso_vm_conns(void *opaque, unsigned idx,
			 bool (*emit)(void *arg, const struct ops_conn_info *ci), void *arg)
{
	struct iso *iso = opaque;
	struct worker *w = &iso->w[iso->worker_of[idx]];
	union iso_ans a;
	bool full = false;

	pthread_mutex_lock(&w->lock);
	if (iso_ask(iso, idx, ISO_CONNS, &w) < 0) {
		pthread_mutex_unlock(&w->lock);
		return;
	}
	/* Read every batch even once emit is full: the next request must find no leftovers. */
	while (iso_answer(w, ISO_CONNS, &a) == 0 && a.h.err == 0) {
		for (uint32_t i = 0; i < a.conns.h.n && !full; i++)
			full = !emit(arg, &a.conns.ci[i]);
		if (a.conns.h.last)
			break;
	}
	pthread_mutex_unlock(&w->lock);
}

/* No vm_tap: capture needs the VM's tap in this process (`capture start` answers ENOTSUP). */
static const struct ops_ctl_ops iso_ctl_ops = {
	.vm_count = iso_vm_count,
	.vm_cid = iso_vm_cid,
	.vm_uds_path = iso_vm_uds_path,
	.vm_stats = iso_vm_stats,
	.vm_conns = iso_vm_conns,
};

/* ---- the main process: workers and supervision ------------------------------------------- */

static unsigned alive_count(const struct iso *iso)
{
	unsigned n = 0;

	for (unsigned i = 0; i < iso->nw; i++)
		n += atomic_load_explicit(&iso->w[i].alive, memory_order_relaxed);
	return n;
}

/* Marks w reaped: its socketpair closed (under lock, the control thread may be using it). */
static void worker_gone(struct worker *w)
{
	pthread_mutex_lock(&w->lock);
	atomic_store_explicit(&w->alive, false, memory_order_relaxed);
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	pthread_mutex_unlock(&w->lock);
}

/*
 * When to start w again after a failure now: the back-off doubles while it keeps failing
 * within ISO_RESTART_STABLE_MS of its start, and starts over once it ran longer.
 */
static uint32_t schedule_restart(struct worker *w, uint64_t now)
{
	if (!w->backoff_ms || now - w->started_ms >= ISO_RESTART_STABLE_MS)
		w->backoff_ms = ISO_RESTART_MIN_MS;
	else if (w->backoff_ms < ISO_RESTART_MAX_MS)
		w->backoff_ms = w->backoff_ms * 2 < ISO_RESTART_MAX_MS ? w->backoff_ms * 2
								       : ISO_RESTART_MAX_MS;
	w->restart_at_ms = now + w->backoff_ms;
	return w->backoff_ms;
}

/*
 * Reaps every worker that has exited (WNOHANG), logging how; returns how many failed. Unless
 * stopping, a failed worker (a signal or a non-zero status) is scheduled for a restart; one
 * that exited with status 0 (stopped by a SIGTERM of its own) is not.
 */
static unsigned reap(struct iso *iso, bool stopping)
{
	unsigned failed = 0;

	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];
		char again[96] = "";
		int st;

		if (!atomic_load_explicit(&w->alive, memory_order_relaxed) ||
		    waitpid(w->pid, &st, WNOHANG) != w->pid)
			continue;
		worker_gone(w);
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			if (stopping)
				log_info("worker pid %d (%s) stopped", (int)w->pid, w->vms);
			else
				log_error("worker pid %d (%s) stopped on its own; its VMs are gone, "
					  "the others keep running", (int)w->pid, w->vms);
			continue;
		}
		failed++;
		if (!stopping && w->inherited)
			snprintf(again, sizeof(again), "; not started again (its socket was "
				 "inherited): restart uvsockd");
		else if (!stopping)
			snprintf(again, sizeof(again), "; starting it again in %u ms",
				 schedule_restart(w, mono_ms()));
		if (WIFSIGNALED(st))
			log_error("worker pid %d (%s) was killed by signal %d (%s)%s", (int)w->pid,
				  w->vms, WTERMSIG(st), strsignal(WTERMSIG(st)), again);
		else
			log_error("worker pid %d (%s) exited with status %d%s", (int)w->pid, w->vms,
				  WEXITSTATUS(st), again);
	}
	return failed;
}

static void forward(struct iso *iso, int sig)
{
	for (unsigned i = 0; i < iso->nw; i++)
		if (atomic_load_explicit(&iso->w[i].alive, memory_order_relaxed))
			kill(iso->w[i].pid, sig);
}

/*
 * Waits (bounded by ISO_STOP_TIMEOUT_MS) for the workers to exit after a forwarded signal, then
 * kills the rest (by PID) and reaps them. *chld holds SIGCHLD only. Returns how many failed.
 */
static unsigned stop_workers(struct iso *iso, const sigset_t *chld)
{
	uint64_t end = mono_ms() + ISO_STOP_TIMEOUT_MS;
	unsigned failed = reap(iso, true);

	while (alive_count(iso) && mono_ms() < end) {
		struct timespec ts = { .tv_nsec = 50 * (long)NS_PER_MS };

		(void)sigtimedwait(chld, NULL, &ts);
		failed += reap(iso, true);
	}
	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];

		if (!atomic_load_explicit(&w->alive, memory_order_relaxed))
			continue;
		log_error("worker pid %d (%s) did not stop within %u ms: killing it", (int)w->pid,
			  w->vms, ISO_STOP_TIMEOUT_MS);
		kill(w->pid, SIGKILL);
		(void)waitpid(w->pid, NULL, 0);
		atomic_store_explicit(&w->alive, false, memory_order_relaxed);
		failed++;
	}
	return failed;
}

/* Waits for every worker's ISO_READY within ISO_START_TIMEOUT_MS. */
static int wait_ready(struct iso *iso)
{
	uint64_t end = mono_ms() + ISO_START_TIMEOUT_MS;

	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];
		struct iso_ans_hdr up;
		ssize_t n = recv_until(w->fd, &up, sizeof(up), end);

		if (n != sizeof(up) || up.op != ISO_READY) {
			log_error("the worker process of %s (pid %d) %s", w->vms, (int)w->pid,
				  n < 0 ? "did not start in time" : "failed to start");
			return -1;
		}
		log_info("worker pid %d runs %s (%s%s)", (int)w->pid, w->vms,
			 iso->cfg->vms[w->idx[0]].cgroup[0] ? "cgroup " : "in uvsockd's cgroup",
			 iso->cfg->vms[w->idx[0]].cgroup);
	}
	return 0;
}

/* The workers' VM lists from uvsockd_workers(). */
static int plan(struct iso *iso, const struct uvsockd_config *cfg)
{
	iso->cfg = cfg;
	iso->worker_of = calloc(cfg->n_vms, sizeof(unsigned));
	iso->local = calloc(cfg->n_vms, sizeof(unsigned));
	if (!iso->worker_of || !iso->local)
		return -ENOMEM;
	iso->nw = uvsockd_workers(cfg, iso->worker_of);
	iso->w = calloc(iso->nw, sizeof(*iso->w));
	if (!iso->w)
		return -ENOMEM;
	for (unsigned i = 0; i < iso->nw; i++) {
		iso->w[i].fd = -1;
		pthread_mutex_init(&iso->w[i].lock, NULL);
	}
	for (unsigned i = 0; i < cfg->n_vms; i++) {
		struct worker *w = &iso->w[iso->worker_of[i]];
		size_t len = strlen(w->vms);

		if (!w->idx && !(w->idx = calloc(cfg->n_vms, sizeof(unsigned))))
			return -ENOMEM;
		iso->local[i] = w->n;
		w->idx[w->n++] = i;
		if (cfg->vms[i].fd > 0 || uds_is_adopted(cfg->vms[i].socket_path))
			w->inherited = true;
		if (len + 16 < sizeof(w->vms))
			snprintf(w->vms + len, sizeof(w->vms) - len, "%svm%u", len ? " " : "",
				 cfg->vms[i].guest_cid);
		else if (!strstr(w->vms, "..."))
			snprintf(w->vms + len, sizeof(w->vms) - len, " ...");
	}
	return 0;
}

/*
 * Forks worker i; its end of the socketpair goes to it, ours to w->fd. restart: after start-up,
 * while the control thread runs. The child uses none of the main's locks but malloc's and
 * stdio's (the log writes through stderr), which glibc's fork() leaves usable in the child of a
 * threaded process; the control thread takes no other lock the worker needs.
 */
static int spawn(struct iso *iso, unsigned i, const sigset_t *sigs, bool restart)
{
	struct worker *w = &iso->w[i];
	pid_t parent = getpid(), pid;
	int sv[2], e = 0;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	pthread_mutex_lock(&w->lock);
	pid = fork();
	if (pid == 0) {
		struct timeval tv = { .tv_sec = ISO_SEND_TIMEOUT_MS / 1000 };

		close(sv[0]);
		(void)setsockopt(sv[1], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		worker_main(iso, i, sv[1], sigs, parent, restart);
	}
	e = errno;
	close(sv[1]);
	if (pid < 0) {
		close(sv[0]);
	} else {
		w->pid = pid;
		w->fd = sv[0];
		w->started_ms = mono_ms();
		w->restart_at_ms = 0;
		atomic_store_explicit(&w->alive, true, memory_order_relaxed);
	}
	pthread_mutex_unlock(&w->lock);
	return pid < 0 ? -e : 0;
}

/*
 * Starts again every worker whose restart is due; returns the milliseconds until the next one
 * is (-1: none pending). A worker that cannot be forked now is tried again after its back-off.
 */
static int restart_due(struct iso *iso, const sigset_t *sigs)
{
	uint64_t now = mono_ms(), next = UINT64_MAX;

	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];
		int r;

		if (!w->restart_at_ms)
			continue;
		if (w->restart_at_ms > now) {
			next = w->restart_at_ms < next ? w->restart_at_ms : next;
			continue;
		}
		r = spawn(iso, i, sigs, true);
		if (r < 0) {
			log_error("cannot start the worker of %s again: %s; next try in %u ms",
				  w->vms, strerror(-r), schedule_restart(w, now));
			next = w->restart_at_ms < next ? w->restart_at_ms : next;
			continue;
		}
		w->restarts++;
		log_warn("worker pid %d started again for %s (restart %u)", (int)w->pid, w->vms,
			 w->restarts);
	}
	if (next == UINT64_MAX)
		return -1;
	return next - now > INT32_MAX ? INT32_MAX : (int)(next - now);
}

/* True while a failed worker waits for its restart. */
static bool restart_pending(const struct iso *iso)
{
	for (unsigned i = 0; i < iso->nw; i++)
		if (iso->w[i].restart_at_ms)
			return true;
	return false;
}

static void iso_free(struct iso *iso)
{
	for (unsigned i = 0; iso->w && i < iso->nw; i++) {
		if (iso->w[i].fd >= 0)
			close(iso->w[i].fd);
		free(iso->w[i].idx);
		pthread_mutex_destroy(&iso->w[i].lock);
	}
	free(iso->w);
	free(iso->worker_of);
	free(iso->local);
}

int isolate_run(const struct uvsockd_config *cfg, const sigset_t *sigs)
{
	struct iso iso = { 0 };
	struct ops_ctl *ctl = NULL;
	sigset_t all = *sigs, chld;
	int r, sig = 0, rc = 1;

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigaddset(&all, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &chld, NULL);
	if (plan(&iso, cfg) < 0) {
		log_error("out of memory");
		goto out;
	}
	for (unsigned i = 0; i < iso.nw; i++) {
		r = spawn(&iso, i, sigs, false);
		if (r < 0) {
			log_error("cannot start a worker process: %s", strerror(-r));
			goto stop;
		}
	}
	/* Every worker has its inherited sockets: a VMM must see its connection end with it. */
	uds_drop_adopted();
	if (wait_ready(&iso) < 0 || daemon_ctl_start(cfg, &iso_ctl_ops, &iso, &ctl) < 0)
		goto stop;
	log_info("%u worker processes for %u VMs", iso.nw, cfg->n_vms);
	daemon_sd_ready(cfg->n_vms, iso.nw);
	for (;;) {
		int wait_ms = restart_due(&iso, sigs);
		struct timespec ts = { .tv_sec = wait_ms / 1000,
				       .tv_nsec = (long)(wait_ms % 1000) * (long)NS_PER_MS };

		sig = sigtimedwait(&all, NULL, wait_ms < 0 ? NULL : &ts);
		if (sig < 0)
			continue; /* a restart is due, or EINTR */
		if (sig == SIGCHLD) {
			(void)reap(&iso, false);
			if (alive_count(&iso) || restart_pending(&iso))
				continue;
			log_error("every worker process is gone: exiting");
			goto stop;
		}
		if (sig == SIGUSR2) {
			log_error("SIGUSR2: uvsockd --isolate cannot be upgraded in place yet "
				  "(docs/upgrade.md): restart it");
			continue;
		}
		forward(&iso, sig);
		if (sig == SIGHUP)
			continue;
		log_info("signal %d: stopping the workers", sig);
		rc = 0;
		break;
	}
stop:
	daemon_sd_stopping();
	/* The control thread asks the workers: stop it before their sockets close. */
	ops_ctl_stop(ctl);
	if (rc != 0)
		forward(&iso, SIGTERM);
	if (stop_workers(&iso, &chld))
		rc = 1;
out:
	iso_free(&iso);
	return rc;
}
