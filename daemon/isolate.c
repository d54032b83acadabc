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
 *   main -> worker, UPGRADE: struct iso_up_req with the hand-over socket (SCM_RIGHTS) to a new
 *     worker the main started from the new binary (--iso-worker); the worker hands its VMs
 *     over (upgrade.c) and answers one struct iso_up_ans; once its VMs went, it exits when the
 *     main closes this socket (docs/upgrade.md, "Under --isolate")
 *   main -> worker, PDEATH: struct iso_req with vm = the signal (0: none) its main thread sets
 *     as PR_SET_PDEATHSIG; one struct iso_ans_hdr answers (before the main is handed over)
 * The main drops answers whose seq is not the current request's (late answers of a request
 * that timed out).
 *
 * Crash survival (docs/upgrade.md, "Crash survival") uses a second SOCK_SEQPACKET socketpair
 * per worker, the keeper's:
 *   main -> worker, once at its start: struct iso_keep_hdr {ISO_KEEP_OFFERS, n}, then n records
 *     (rec_send) the main kept for the worker's VMs from the worker before it, offered to the
 *     new devices (src/device/vhu_keep.h), which re-adopt their VMMs
 *   worker -> main, whenever a VM's vhost-user configuration changed (after the message that
 *     changed it, never per packet) or its VMM went: the VM's record (rec_send)
 * The main's keeper thread stores the latest record of each VM (a sealed memfd and the fds:
 * the VMM's connection, the memory regions', the rings' eventfds); it never maps guest memory.
 * It drops a VM's record when its VMM hangs up (the main's copy of the connection is polled),
 * when the worker says so, and when the worker stops without failing.
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
#include <limits.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "device/vhu_keep.h"
#include "ops/stats.h"
#include "sd.h"
#include "util/log.h"
#include "util/rec.h"
#include "util/time.h"
#include "util/uds.h"
#include "upgrade.h"
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
	ISO_KEEP_OFFERS,
	ISO_UPGRADE,
	ISO_PDEATH,
};

/* A record and its fds take this long at most to arrive once their first message is there. */
#define ISO_KEEP_RECV_MS 2000

struct iso_keep_hdr {
	uint32_t op; /* ISO_KEEP_OFFERS */
	uint32_t n;  /* records that follow */
};

/* What the main keeps of one VM for its next worker (memfd -1: nothing). */
struct kept {
	int memfd;
	int *fds;
	size_t nfds;
	int conn; /* among fds: the VMM's connection, polled for its hang-up */
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

/*
 * main -> old worker: hand your VMs to the new worker pid (running path) over the passed fd
 * (docs/upgrade.md, "Under --isolate").
 */
struct iso_up_req {
	struct iso_req q; /* op ISO_UPGRADE */
	int32_t pid;
	char path[PATH_MAX];
};

/* old worker -> main: how it went (vms[n] follow). exit_after >= 0: the VMs went. */
struct iso_up_ans {
	struct iso_ans_hdr h; /* op ISO_UPGRADE, err */
	int32_t exit_after;
	int32_t new_pid;
	uint32_t n;
	char why[640];
	struct ops_ctl_upgrade_vm vms[];
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
	/* Under iso->keep_lock: the keeper's socketpair (main's end, -1) and, per VM of the
	 * worker (kept[k] for cfg->vms[idx[k]]), the latest record. */
	int keep_fd;
	struct kept *kept;
	/* Under iso->keep_lock: the binary an upgrade put this worker on (malloc'd; NULL: this
	 * process's own code, forked), which a restart after a crash runs again. */
	char *exec_path;
	/* A worker this process took over from the main before it (not its child): its pidfd
	 * (-1: a child, reaped by waitpid) and the thread that waits for it to exit. */
	int pidfd;
	pthread_t watch;
	bool watching;
	/* The pidfd the watch thread polls: set before it starts, never changed (an upgrade may
	 * take pidfd away before the thread first runs). */
	int watch_fd;
	_Atomic bool pid_exited;
};

struct iso {
	const struct uvsockd_config *cfg;
	struct worker *w;
	unsigned nw;
	unsigned *worker_of; /* per cfg VM: its worker */
	unsigned *local;     /* per cfg VM: its index among the worker's VMs */
	/* The keeper thread (crash survival): keep_lock guards every worker's keep_fd and kept;
	 * keep_gen changes whenever an fd it polls may have been closed; keep_wake wakes it. */
	pthread_mutex_t keep_lock;
	pthread_t keeper;
	bool keeper_started, keep_stop;
	uint64_t keep_gen;
	int keep_wake;
	/* One upgrade at a time (the control thread's, or the main thread's on SIGUSR2). */
	pthread_mutex_t up_lock;
	struct ops_ctl *ctl;
	/* The main process was handed to a new one (upgrade_main): nothing is reaped, restarted
	 * or kept here any more; this process exits once the upgrade is answered. */
	_Atomic bool handed_over;
};

/* ---- the worker process ------------------------------------------------------------------ */

struct responder {
	int fd;
	struct vm_set *set;
	pthread_t th;
	bool started;
	/*
	 * ISO_PDEATH: PR_SET_PDEATHSIG belongs to the thread that set it (the worker's main
	 * thread), so the responder asks that thread (a SIGHUP to it, taken by worker_signal) and
	 * waits under pd_lock for pd_done.
	 */
	pthread_mutex_t pd_lock;
	pthread_cond_t pd_cond;
	bool pd_req, pd_done;
	int pd_sig, pd_err;
	/* The parent death signal is off (the main was handed over): at the end of the request
	 * socket (the main is gone) the worker stops itself; not when stopping anyway. */
	_Atomic bool unparented, stopping;
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

/* One message of at most len bytes, with at most one passed fd (*fd, -1 if none). */
static ssize_t recv_with_fd(int sock, void *buf, size_t len, int *fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);

	*fd = -1;
	if (n < 0)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*fd < 0)
				*fd = f;
			else
				close(f);
		}
	}
	return n;
}

/*
 * ISO_UPGRADE in the old worker: its VMs to the new worker over sock (vm_set_hand_over), the
 * answer to the main. Once the VMs went, waits for the main to close the request socket (it
 * has put the new worker in this one's place) and ends with _exit: nothing of what the new
 * worker serves may be shut down or removed here.
 */
static void hand_over_and_exit(struct responder *rs, const struct iso_up_req *u, int sock)
{
	struct ops_ctl_upgrade res = { .exit_after = -1 };
	struct iso_up_ans *a;
	char path[PATH_MAX], err[640] = "";
	size_t len;
	int r;

	memcpy(path, u->path, sizeof(path));
	path[sizeof(path) - 1] = '\0';
	r = vm_set_hand_over(rs->set, sock, (pid_t)u->pid, path, &res, err, sizeof(err));
	len = sizeof(*a) + (size_t)res.n * sizeof(a->vms[0]);
	a = calloc(1, len);
	if (a) {
		a->h = (struct iso_ans_hdr){ .op = ISO_UPGRADE, .seq = u->q.seq, .err = r };
		a->exit_after = res.exit_after;
		a->new_pid = res.new_pid;
		a->n = res.n;
		snprintf(a->why, sizeof(a->why), "%s", err);
		for (unsigned i = 0; i < res.n; i++)
			a->vms[i] = res.vms[i];
		(void)send_msg(rs->fd, a, len);
		free(a);
	}
	free(res.vms);
	if (res.exit_after < 0)
		return;
	/* The main swaps the workers, then closes its end (a bounded wait: it may be gone). */
	{
		struct pollfd p = { .fd = rs->fd, .events = POLLIN };
		char b[64];

		while (poll(&p, 1, ISO_STOP_TIMEOUT_MS) == 1 && recv(rs->fd, b, sizeof(b), 0) > 0)
			;
	}
	_exit(res.exit_after);
}

/*
 * ISO_PDEATH in the responder: the worker's main thread sets PR_SET_PDEATHSIG to sig (0: off)
 * within ISO_ANSWER_TIMEOUT_MS / 2. Returns 0 or -errno.
 */
static int set_pdeath(struct responder *rs, int sig)
{
	struct timespec end;
	int r = 0;

	if (sig < 0 || sig >= NSIG)
		return -EINVAL;
	clock_gettime(CLOCK_REALTIME, &end);
	end.tv_nsec += (long)(ISO_ANSWER_TIMEOUT_MS / 2) * (long)NS_PER_MS;
	end.tv_sec += end.tv_nsec / 1000000000L;
	end.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&rs->pd_lock);
	rs->pd_req = true;
	rs->pd_done = false;
	rs->pd_sig = sig;
	pthread_mutex_unlock(&rs->pd_lock);
	/* The main thread's id is the process's: a thread-directed SIGHUP. */
	if (tgkill(getpid(), getpid(), SIGHUP) < 0)
		return -errno;
	pthread_mutex_lock(&rs->pd_lock);
	while (!rs->pd_done && r == 0)
		r = pthread_cond_timedwait(&rs->pd_cond, &rs->pd_lock, &end);
	rs->pd_req = false;
	r = rs->pd_done ? rs->pd_err : -ETIMEDOUT;
	pthread_mutex_unlock(&rs->pd_lock);
	if (r == 0)
		atomic_store(&rs->unparented, sig == 0);
	return r;
}

/* vm_set hook of a worker: the responder's SIGHUP for set_pdeath, on the main thread. */
static bool worker_signal(const siginfo_t *si, void *arg)
{
	struct responder *rs = arg;
	bool mine;

	/* From this process (si_code is SI_TKILL on some kernels, SI_USER on others). */
	if (si->si_signo != SIGHUP || si->si_pid != getpid())
		return false;
	pthread_mutex_lock(&rs->pd_lock);
	mine = rs->pd_req && !rs->pd_done;
	if (mine) {
		rs->pd_err = prctl(PR_SET_PDEATHSIG, rs->pd_sig) < 0 ? -errno : 0;
		rs->pd_done = true;
		pthread_cond_broadcast(&rs->pd_cond);
	}
	pthread_mutex_unlock(&rs->pd_lock);
	return mine;
}

static void *responder_main(void *arg)
{
	struct responder *rs = arg;

	pthread_setname_np(pthread_self(), "uvsockd-ctl");
	for (;;) {
		struct iso_up_req u;
		struct iso_req q;
		int passed = -1;
		ssize_t n = recv_with_fd(rs->fd, &u, sizeof(u), &passed);
		bool have_vm;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* The main is gone, or we are stopping (shutdown). Without the parent death
			 * signal, a gone main stops the worker this way (docs/upgrade.md). */
			if (n == 0 && atomic_load(&rs->unparented) && !atomic_load(&rs->stopping)) {
				log_warn("the main process is gone: stopping");
				kill(getpid(), SIGTERM);
			}
			break;
		}
		if (n == sizeof(u) && u.q.op == ISO_UPGRADE && passed >= 0) {
			hand_over_and_exit(rs, &u, passed); /* returns if the VMs stay */
			continue;
		}
		if (passed >= 0)
			close(passed);
		if (n != sizeof(q))
			continue;
		q = u.q;
		have_vm = q.vm < vm_set_count(rs->set);
		if (q.op == ISO_STATS) {
			struct iso_stats_msg m = { .h = { .op = ISO_STATS, .seq = q.seq } };

			m.h.err = have_vm ? 0 : -ENOENT;
			if (have_vm)
				vm_set_ctl_ops.vm_stats(rs->set, q.vm, &m.st);
			(void)send_msg(rs->fd, &m, sizeof(m));
		} else if (q.op == ISO_CONNS) {
			answer_conns(rs, &q, have_vm);
		} else if (q.op == ISO_PDEATH) {
			struct iso_ans_hdr a = { .op = ISO_PDEATH, .seq = q.seq };

			a.err = set_pdeath(rs, (int)q.vm);
			(void)send_msg(rs->fd, &a, sizeof(a));
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
	/* Every device took its kept record: one left over must not hold its VMM's connection. */
	dev_vhu_adopt_clear();
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
	atomic_store(&rs->stopping, true);
	/* Wakes the responder's recv (and a send waiting for the main) with an end of file. */
	shutdown(rs->fd, SHUT_RDWR);
	pthread_join(rs->th, NULL);
	rs->started = false;
}

/* The worker's end of the keeper's socketpair; the device threads send on it one at a time. */
struct keep_link {
	int fd;
	pthread_mutex_t lock;
	bool warned;
};

/* dev_vhu_keep_fn of a worker: the record to the main (vhu_keep.h). */
static void worker_keep(void *arg, uint32_t cid, const uint8_t *buf, size_t len, const int *fds,
			size_t nfds)
{
	struct keep_link *k = arg;
	int memfd = -1, r;
	bool warn;

	r = rec_memfd(buf, len, "uvsockd-keep", &memfd);
	pthread_mutex_lock(&k->lock);
	if (r == 0) {
		r = rec_send(k->fd, memfd, fds, nfds);
		close(memfd);
	}
	warn = r < 0 && !k->warned;
	k->warned |= warn;
	pthread_mutex_unlock(&k->lock);
	if (warn)
		log_warn("vm%u: cannot hand the crash-survival record to the main process: %s; a "
			 "crash of this worker may now cost its VMs their vsock", cid, strerror(-r));
}

/*
 * Takes the records the main kept for this worker's VMs (ISO_KEEP_OFFERS) and offers them to
 * the devices about to be made. Returns how many, or -1 (the main is gone: exit).
 */
static int worker_take_offers(int fd)
{
	struct iso_keep_hdr h;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	unsigned took = 0;
	ssize_t n;

	if (poll(&p, 1, ISO_START_TIMEOUT_MS) != 1)
		return -1;
	n = recv(fd, &h, sizeof(h), 0);
	if (n != sizeof(h) || h.op != ISO_KEEP_OFFERS)
		return -1;
	for (uint32_t i = 0; i < h.n; i++) {
		int memfd, *fds, r;
		size_t nfds;

		r = rec_recv(fd, ISO_KEEP_RECV_MS, &memfd, &fds, &nfds);
		if (r < 0) {
			log_error("cannot receive the kept records: %s", strerror(-r));
			return -1;
		}
		r = dev_vhu_adopt_offer(memfd, fds, nfds);
		if (r < 0)
			log_error("a kept record is refused: %s", strerror(-r));
		else
			took++;
	}
	return (int)took;
}

/* Closes every fd from 3 up but a and b (a < b). */
static int close_all_but(int a, int b)
{
	if ((a > 3 && close_range(3, (unsigned)a - 1, 0) < 0) ||
	    (b > a + 1 && close_range((unsigned)a + 1, (unsigned)b - 1, 0) < 0) ||
	    close_range((unsigned)b + 1, ~0u, 0) < 0)
		return -1;
	return 0;
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
						  int keep_fd, const sigset_t *sigs, pid_t parent,
						  bool restart)
{
	struct worker *w = &iso->w[wi];
	const struct uvsockd_vm_config *first = &iso->cfg->vms[w->idx[0]];
	struct responder rs = { .fd = fd, .pd_lock = PTHREAD_MUTEX_INITIALIZER,
				.pd_cond = PTHREAD_COND_INITIALIZER };
	struct keep_link keep = { .fd = keep_fd, .lock = PTHREAD_MUTEX_INITIALIZER };
	char name[16];
	int r, took;

	/* SIGTERM is in *sigs: the worker stops as on a forwarded SIGTERM, sockets removed. */
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
		_exit(1);
	if (restart) {
		/*
		 * Nothing of the main's is ours: the other workers' socketpairs, the control
		 * socket and its clients (a client must see its connection end with the main),
		 * the records the main keeps (a VMM must see its connection end with the
		 * worker that serves it). The sockets inherited at start were dropped once every
		 * worker had its own.
		 */
		if (close_all_but(fd < keep_fd ? fd : keep_fd, fd < keep_fd ? keep_fd : fd) < 0)
			_exit(1);
	} else {
		/* The main's ends of the other workers' socketpairs are not ours. (Nothing is
		 * kept yet: the keeper thread starts after the first workers are forked.) */
		for (unsigned j = 0; j < iso->nw; j++) {
			if (j != wi && iso->w[j].fd >= 0)
				close(iso->w[j].fd);
			if (j != wi && iso->w[j].keep_fd >= 0)
				close(iso->w[j].keep_fd);
		}
	}
	took = worker_take_offers(keep_fd);
	if (took < 0)
		_exit(1);
	dev_vhu_set_keeper(worker_keep, &keep);
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
	if (took)
		log_info("worker of %s: %d VMM connection%s kept across the crash of the worker "
			 "before", w->vms, took, took == 1 ? "" : "s");
	r = vm_set_run(iso->cfg, w->idx, w->n, sigs,
		       &(struct vm_set_hooks){ worker_ready, worker_stopping, &rs, worker_signal });
	dev_vhu_set_keeper(NULL, NULL);
	dev_vhu_adopt_clear();
	close(keep_fd);
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

static int iso_upgrade(void *opaque, const char *binary, struct ops_ctl_upgrade *ret,
		       char *err, size_t errlen);
static int upgrade_main(struct iso *iso, const char *path, struct ops_ctl_upgrade *ret,
			char *err, size_t errlen);

/* No vm_tap: capture needs the VM's tap in this process (`capture start` answers ENOTSUP). */
static const struct ops_ctl_ops iso_ctl_ops = {
	.vm_count = iso_vm_count,
	.vm_cid = iso_vm_cid,
	.vm_uds_path = iso_vm_uds_path,
	.vm_stats = iso_vm_stats,
	.vm_conns = iso_vm_conns,
	.upgrade = iso_upgrade,
};

/* ---- the main process: the keeper of crash survival ---------------------------------------- */

static void kept_clear(struct kept *k)
{
	if (k->memfd >= 0)
		close(k->memfd);
	for (size_t i = 0; i < k->nfds; i++)
		close(k->fds[i]);
	free(k->fds);
	*k = (struct kept){ .memfd = -1, .conn = -1 };
}

/* Drops every record of w (keep_lock held): the VMMs see their connections end with it. */
static void kept_drop_all(struct iso *iso, struct worker *w)
{
	for (unsigned k = 0; k < w->n; k++)
		kept_clear(&w->kept[k]);
	iso->keep_gen++;
}

/* Stores a record the worker w sent (keep_lock held), in place of its VM's last. */
static void kept_store(struct iso *iso, struct worker *w, int memfd, int *fds, size_t nfds)
{
	const uint8_t *buf = NULL;
	size_t len = 0;
	uint32_t cid = 0;
	size_t nconns = 0;
	int conn = -1, r;
	unsigned k;

	r = rec_map_fd(memfd, &buf, &len);
	if (r == 0) {
		r = dev_vhu_keep_peek(buf, len, fds, nfds, &cid, &conn, &nconns);
		rec_unmap(buf, len);
	}
	for (k = 0; r == 0 && k < w->n; k++)
		if (iso->cfg->vms[w->idx[k]].guest_cid == cid)
			break;
	if (r == 0 && k == w->n)
		r = -ENOENT;
	if (r < 0) {
		log_error("worker pid %d (%s) sent a crash-survival record that is refused: %s",
			  (int)w->pid, w->vms, strerror(-r));
		close(memfd);
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		free(fds);
		return;
	}
	kept_clear(&w->kept[k]);
	iso->keep_gen++;
	if (conn < 0) { /* the VM has no VMM any more */
		close(memfd);
		free(fds);
		return;
	}
	w->kept[k] = (struct kept){ .memfd = memfd, .fds = fds, .nfds = nfds, .conn = conn };
	log_debug("vm%u: crash-survival record kept: %zu fds, %zu connections", cid, nfds, nconns);
}

/*
 * Reads every record waiting on w's keeper socket (keep_lock held) until it would wait; at
 * the end of the stream (the worker is gone) the socket is closed. A record whose sender died
 * halfway is lost: the one before it stays.
 */
static void keep_read(struct iso *iso, struct worker *w)
{
	for (;;) {
		struct pollfd p = { .fd = w->keep_fd, .events = POLLIN };
		int memfd, *fds, r;
		size_t nfds;

		if (poll(&p, 1, 0) != 1)
			return;
		r = rec_recv(w->keep_fd, ISO_KEEP_RECV_MS, &memfd, &fds, &nfds);
		if (r == 0) {
			kept_store(iso, w, memfd, fds, nfds);
			continue;
		}
		if (r != -ECONNRESET)
			log_error("worker pid %d (%s): crash-survival record: %s; no more are taken "
				  "from it", (int)w->pid, w->vms, strerror(-r));
		close(w->keep_fd);
		w->keep_fd = -1;
		iso->keep_gen++;
		return;
	}
}

/*
 * The keeper thread: takes the workers' records, and drops a VM's record when its VMM hangs
 * up (the main's copy of the connection reports POLLRDHUP): a VMM that goes while its worker is
 * down finds its connection closed, and the new worker listens for the next one.
 */
static void *keeper_main(void *arg)
{
	struct iso *iso = arg;
	unsigned max = 1;
	struct pollfd *p;
	struct { unsigned w, k; } *who;

	pthread_setname_np(pthread_self(), "uvsockd-keep");
	for (unsigned i = 0; i < iso->nw; i++)
		max += 1 + iso->w[i].n;
	p = calloc(max, sizeof(*p));
	who = calloc(max, sizeof(*who));
	if (!p || !who) {
		log_error("crash survival: out of memory: nothing is kept");
		free(p);
		free(who);
		return NULL;
	}
	for (;;) {
		unsigned n = 1;
		uint64_t gen, v;

		pthread_mutex_lock(&iso->keep_lock);
		if (iso->keep_stop) {
			pthread_mutex_unlock(&iso->keep_lock);
			break;
		}
		p[0] = (struct pollfd){ .fd = iso->keep_wake, .events = POLLIN };
		for (unsigned i = 0; i < iso->nw; i++) {
			struct worker *w = &iso->w[i];

			if (w->keep_fd >= 0) {
				who[n].w = i;
				who[n].k = UINT32_MAX;
				p[n++] = (struct pollfd){ .fd = w->keep_fd, .events = POLLIN };
			}
			for (unsigned k = 0; k < w->n; k++) {
				if (w->kept[k].memfd < 0)
					continue;
				who[n].w = i;
				who[n].k = k;
				p[n++] = (struct pollfd){ .fd = w->kept[k].conn, .events = POLLRDHUP };
			}
		}
		gen = iso->keep_gen;
		pthread_mutex_unlock(&iso->keep_lock);
		if (poll(p, n, -1) < 0)
			continue;
		if (p[0].revents)
			(void)!read(iso->keep_wake, &v, sizeof(v));
		pthread_mutex_lock(&iso->keep_lock);
		if (iso->keep_stop) { /* stopping, or handed to a new main: it takes the records */
			pthread_mutex_unlock(&iso->keep_lock);
			break;
		}
		/* An fd polled may have been closed (and its number reused) meanwhile: poll anew. */
		for (unsigned j = 1; j < n && iso->keep_gen == gen; j++) {
			struct worker *w = &iso->w[who[j].w];

			if (!p[j].revents)
				continue;
			if (who[j].k == UINT32_MAX) {
				keep_read(iso, w);
				continue;
			}
			if (atomic_load_explicit(&w->alive, memory_order_relaxed))
				log_debug("vm%u: the VMM closed its vhost-user connection: its "
					  "record dropped", iso->cfg->vms[w->idx[who[j].k]].guest_cid);
			else
				log_warn("vm%u: the VMM closed its vhost-user connection while its "
					 "worker was down; the new worker waits for the next VMM",
					 iso->cfg->vms[w->idx[who[j].k]].guest_cid);
			kept_clear(&w->kept[who[j].k]);
			iso->keep_gen++;
		}
		pthread_mutex_unlock(&iso->keep_lock);
	}
	free(p);
	free(who);
	return NULL;
}

/* Makes the keeper thread poll anew (its fds changed). */
static void keep_wake(struct iso *iso)
{
	uint64_t one = 1;

	if (iso->keep_wake >= 0)
		(void)!write(iso->keep_wake, &one, sizeof(one));
}

/*
 * Gives the new worker w (its keeper socket: fd) the records kept for its VMs (keep_lock held),
 * after taking what its predecessor sent last. Returns how many were sent, or -errno.
 */
static int keep_hand_over(struct iso *iso, struct worker *w, int fd)
{
	struct iso_keep_hdr h = { .op = ISO_KEEP_OFFERS };
	int r = 0;

	if (w->keep_fd >= 0) {
		keep_read(iso, w);
		if (w->keep_fd >= 0) { /* still open: it will end; nothing more comes from it */
			close(w->keep_fd);
			w->keep_fd = -1;
			iso->keep_gen++;
		}
	}
	for (unsigned k = 0; k < w->n; k++)
		h.n += w->kept[k].memfd >= 0;
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != sizeof(h))
		return -errno;
	for (unsigned k = 0; k < w->n && r == 0; k++)
		if (w->kept[k].memfd >= 0)
			r = rec_send(fd, w->kept[k].memfd, w->kept[k].fds, w->kept[k].nfds);
	return r < 0 ? r : (int)h.n;
}

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
 * A worker taken over from the main before (w->pidfd, its watch thread): once it exited, the
 * thread is joined and the pidfd closed. Not being its parent, this process cannot have its
 * exit status (docs/upgrade.md, "Under --isolate"): *st says "exited 0" when stopping (the
 * SIGTERM forwarded to it; one that does not stop in time is killed and counted as failed),
 * else "killed by SIGKILL": a failure, started again. Its zombie is reaped by whoever
 * inherited it (init or the subreaper) once the old main exited.
 */
static bool adopted_exited(struct worker *w, bool stopping, int *st)
{
	if (!atomic_load(&w->pid_exited))
		return false;
	pthread_join(w->watch, NULL);
	w->watching = false;
	close(w->pidfd);
	w->pidfd = -1;
	atomic_store(&w->pid_exited, false);
	*st = stopping ? 0 : SIGKILL; /* WIFEXITED 0, or WIFSIGNALED with WTERMSIG SIGKILL */
	return true;
}

/* The watch thread of a worker taken over: waits for its exit, then wakes the supervisor. */
static void *pidfd_watch(void *arg)
{
	struct worker *w = arg;
	struct pollfd p = { .fd = w->watch_fd, .events = POLLIN };

	pthread_setname_np(pthread_self(), "uvsockd-pidfd");
	while (poll(&p, 1, -1) < 0 && errno == EINTR)
		;
	atomic_store(&w->pid_exited, true);
	kill(getpid(), SIGCHLD);
	return NULL;
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

		/* Under its lock: an upgrade may be putting a new worker in this one's place. */
		pthread_mutex_lock(&w->lock);
		if (atomic_load(&iso->handed_over) ||
		    !atomic_load_explicit(&w->alive, memory_order_relaxed) ||
		    (w->pidfd >= 0 ? !adopted_exited(w, stopping, &st)
				   : waitpid(w->pid, &st, WNOHANG) != w->pid)) {
			pthread_mutex_unlock(&w->lock);
			continue;
		}
		pthread_mutex_unlock(&w->lock);
		worker_gone(w);
		/* Kept for the next worker only if there is one. */
		if (stopping || (WIFEXITED(st) && WEXITSTATUS(st) == 0) || w->inherited) {
			pthread_mutex_lock(&iso->keep_lock);
			kept_drop_all(iso, w);
			pthread_mutex_unlock(&iso->keep_lock);
			keep_wake(iso);
		}
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
		if (w->pidfd >= 0) {
			int st;
			struct pollfd p = { .fd = w->pidfd, .events = POLLIN };

			(void)poll(&p, 1, ISO_STOP_TIMEOUT_MS);
			(void)adopted_exited(w, true, &st);
		} else {
			(void)waitpid(w->pid, NULL, 0);
		}
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
		iso->w[i].fd = iso->w[i].keep_fd = iso->w[i].pidfd = -1;
		pthread_mutex_init(&iso->w[i].lock, NULL);
	}
	for (unsigned i = 0; i < cfg->n_vms; i++) {
		struct worker *w = &iso->w[iso->worker_of[i]];
		size_t len = strlen(w->vms);

		if (!w->idx && !(w->idx = calloc(cfg->n_vms, sizeof(unsigned))))
			return -ENOMEM;
		if (!w->kept && !(w->kept = calloc(cfg->n_vms, sizeof(*w->kept))))
			return -ENOMEM;
		w->kept[w->n] = (struct kept){ .memfd = -1, .conn = -1 };
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
 * The child of fork_worker when it runs another binary: only fds a, b and c (c may be -1)
 * stay, then exec path as "--iso-worker spec" with uvsockd's own arguments. If execve fails,
 * the hand-over socket c hears "exec-failed <errno>" (upgrade.h).
 */
static __attribute__((noreturn)) void exec_worker(const char *path, char **av, int a, int b,
						  int c, pid_t parent)
{
	int keep[3] = { a, b, c }, n = c >= 0 ? 3 : 2, lo = 3;
	char msg[40] = "exec-failed ";
	sigset_t none;

	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
		_exit(1);
	for (int i = 0; i < n; i++) /* sort the few fds kept */
		for (int j = i + 1; j < n; j++)
			if (keep[j] < keep[i]) {
				int t = keep[i];

				keep[i] = keep[j];
				keep[j] = t;
			}
	for (int i = 0; i < n; i++) {
		if (keep[i] > lo && close_range((unsigned)lo, (unsigned)keep[i] - 1, 0) < 0)
			_exit(1);
		lo = keep[i] + 1;
		(void)fcntl(keep[i], F_SETFD, 0);
	}
	(void)close_range((unsigned)lo, ~0u, 0);
	/* The new program takes signals as uvsockd's main() sets them up. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execv(path, av);
	if (c >= 0) {
		upgrade_utoa((unsigned)errno, msg + strlen(msg));
		(void)!write(c, msg, strlen(msg));
	}
	_exit(127);
}

/*
 * Forks a worker for group i: its socketpairs (the main's ends in *ret_fd and *ret_keep), then
 * in the child either worker_main (path NULL: this process's code) or path executed in worker
 * mode, given the hand-over socket hfd too (-1: none, a worker that makes its VMs).
 */
/*
 * Forks worker i; its end of the socketpair goes to it, ours to w->fd. restart: after start-up,
 * while the control thread runs. The child uses none of the main's locks but malloc's and
 * stdio's (the log writes through stderr), which glibc's fork() leaves usable in the child of a
 * threaded process; the control thread takes no other lock the worker needs.
 */
static int fork_worker(struct iso *iso, unsigned i, const sigset_t *sigs, bool restart,
		       const char *path, int hfd, pid_t *ret_pid, int *ret_fd, int *ret_keep)
{
	struct timeval tv = { .tv_sec = ISO_SEND_TIMEOUT_MS / 1000 };
	pid_t parent = getpid(), pid;
	char *const *argv;
	int argc = vm_set_args(&argv);
	char spec[64], **av = NULL;
	int sv[2], kv[2], e = 0;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, kv) < 0) {
		e = errno;
		close(sv[0]);
		close(sv[1]);
		return -e;
	}
	(void)setsockopt(sv[1], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	(void)setsockopt(kv[1], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (path) {
		av = calloc((size_t)argc + 4, sizeof(*av));
		if (!av || !argv) {
			free(av);
			close(sv[0]);
			close(sv[1]);
			close(kv[0]);
			close(kv[1]);
			return av ? -EINVAL : -ENOMEM;
		}
		snprintf(spec, sizeof(spec), "%u,%d,%d,%d", i, hfd, sv[1], kv[1]);
		av[0] = (char *)path;
		av[1] = "--iso-worker";
		av[2] = spec;
		for (int k = 1; k < argc; k++)
			av[k + 2] = argv[k];
	}
	pid = fork();
	if (pid == 0) {
		if (path)
			exec_worker(path, av, sv[1], kv[1], hfd, parent);
		close(sv[0]);
		close(kv[0]);
		worker_main(iso, i, sv[1], kv[1], sigs, parent, restart);
	}
	e = errno;
	free(av);
	close(sv[1]);
	close(kv[1]);
	if (pid < 0) {
		close(sv[0]);
		close(kv[0]);
		return -e;
	}
	(void)setsockopt(kv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	*ret_pid = pid;
	*ret_fd = sv[0];
	*ret_keep = kv[0];
	return 0;
}

static int spawn(struct iso *iso, unsigned i, const sigset_t *sigs, bool restart)
{
	struct worker *w = &iso->w[i];
	char *path = NULL;
	pid_t pid = -1;
	int sfd = -1, kfd = -1, e, r;

	pthread_mutex_lock(&iso->keep_lock);
	if (restart && w->exec_path)
		path = strdup(w->exec_path);
	pthread_mutex_unlock(&iso->keep_lock);
	pthread_mutex_lock(&w->lock);
	e = atomic_load(&iso->handed_over) ? -ECANCELED
					   : fork_worker(iso, i, sigs, restart, path, -1, &pid, &sfd, &kfd);
	free(path);
	if (e == 0) {
		pthread_mutex_lock(&iso->keep_lock);
		r = keep_hand_over(iso, w, kfd);
		w->keep_fd = kfd;
		iso->keep_gen++;
		pthread_mutex_unlock(&iso->keep_lock);
		keep_wake(iso);
		if (r > 0)
			log_info("worker pid %d (%s) gets %d VMM connection%s kept across the "
				 "crash", (int)pid, w->vms, r, r == 1 ? "" : "s");
		else if (r < 0)
			log_error("worker pid %d (%s): cannot hand it the kept connections: %s",
				  (int)pid, w->vms, strerror(-r));
		w->pid = pid;
		w->fd = sfd;
		w->started_ms = mono_ms();
		w->restart_at_ms = 0;
		atomic_store_explicit(&w->alive, true, memory_order_relaxed);
	}
	pthread_mutex_unlock(&w->lock);
	return e;
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

/* ---- the main process: live upgrade, one worker at a time (docs/upgrade.md) --------------- */

static int send_with_fd(int sock, const void *buf, size_t len, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c;

	memset(&u, 0, sizeof(u));
	c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/*
 * The old worker old, replaced, ends on its own (it waits for its request socket to close).
 * pidfd >= 0: it is not this process's child (taken over from the main before): its exit is
 * waited for on pidfd (closed here) and its watch thread joined.
 */
static void reap_replaced(struct worker *w, pid_t old, int pidfd, pthread_t watch,
			  const char *vms)
{
	uint64_t end = mono_ms() + ISO_STOP_TIMEOUT_MS;
	int st = 0;

	if (pidfd >= 0) {
		struct pollfd p = { .fd = pidfd, .events = POLLIN };

		if (poll(&p, 1, ISO_STOP_TIMEOUT_MS) != 1) {
			log_error("the replaced worker pid %d (%s) did not exit: killing it",
				  (int)old, vms);
			kill(old, SIGKILL);
		}
		pthread_join(watch, NULL);
		close(pidfd);
		atomic_store(&w->pid_exited, false);
		return;
	}

	for (;;) {
		pid_t r = waitpid(old, &st, WNOHANG);

		if (r == old || (r < 0 && errno != EINTR))
			break;
		if (mono_ms() >= end) {
			log_error("the replaced worker pid %d (%s) did not exit: killing it",
				  (int)old, vms);
			kill(old, SIGKILL);
			(void)waitpid(old, &st, 0);
			return;
		}
		(void)poll(NULL, 0, 5);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		log_warn("the replaced worker pid %d (%s) ended with status %#x", (int)old, vms, st);
}

/*
 * Upgrades worker wi to path: a new worker from path for the same group, handed the old one's
 * VMs (upgrade_hand_over in the old worker), then put in the old one's place (pid, request
 * socket, keeper link; the records kept stay until the new worker's replace them). Appends the
 * group's VMs to ret->vms. Returns 0, or -errno with why in err: the old worker serves on then,
 * unless its hand-over was committed without a confirmation (the new worker owns the VMs).
 */
static int upgrade_worker(struct iso *iso, unsigned wi, const char *path,
			  struct ops_ctl_upgrade *ret, char *err, size_t errlen)
{
	struct worker *w = &iso->w[wi];
	struct iso_keep_hdr none = { .op = ISO_KEEP_OFFERS };
	struct iso_up_req u;
	struct iso_up_ans *a = NULL;
	size_t alen = sizeof(*a) + (size_t)w->n * sizeof(a->vms[0]);
	uint64_t end;
	pid_t pid = -1, old;
	pthread_t old_watch;
	int hv[2] = { -1, -1 }, sfd = -1, kfd = -1, r, old_pidfd;
	ssize_t n;

	pthread_mutex_lock(&w->lock);
	old = w->pid;
	if (!atomic_load_explicit(&w->alive, memory_order_relaxed) || w->fd < 0) {
		pthread_mutex_unlock(&w->lock);
		snprintf(err, errlen, "the worker of %s is not running (it waits for its restart)",
			 w->vms);
		return -ESRCH;
	}
	a = calloc(1, alen);
	r = a ? 0 : -ENOMEM;
	if (r == 0 && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, hv) < 0)
		r = -errno;
	if (r == 0)
		r = fork_worker(iso, wi, NULL, false, path, hv[1], &pid, &sfd, &kfd);
	if (hv[1] >= 0)
		close(hv[1]);
	if (r < 0) {
		if (hv[0] >= 0)
			close(hv[0]);
		pthread_mutex_unlock(&w->lock);
		free(a);
		snprintf(err, errlen, "cannot start a new worker for %s: %s", w->vms, strerror(-r));
		return r;
	}
	log_info("upgrade: new worker pid %d (%s) for %s, worker pid %d hands its VMs over",
		 (int)pid, path, w->vms, (int)old);
	/* Its VMs come from the old worker, not from kept records. */
	(void)!send(kfd, &none, sizeof(none), MSG_NOSIGNAL);
	memset(&u, 0, sizeof(u));
	u.q = (struct iso_req){ .op = ISO_UPGRADE, .seq = ++w->seq };
	u.pid = (int32_t)pid;
	snprintf(u.path, sizeof(u.path), "%s", path);
	r = send_with_fd(w->fd, &u, sizeof(u), hv[0]);
	close(hv[0]);
	if (r < 0) {
		snprintf(err, errlen, "cannot ask worker pid %d (%s): %s", (int)old, w->vms,
			 strerror(-r));
		goto abort;
	}
	/* A hang guard over the hand-over's own deadlines (upgrade.h: per step). */
	end = mono_ms() + (uint64_t)(w->n + 4) * UPGRADE_STEP_TIMEOUT_MS;
	do {
		n = recv_until(w->fd, a, alen, end);
	} while (n >= (ssize_t)sizeof(a->h) && (a->h.seq != w->seq || a->h.op != ISO_UPGRADE));
	if (n < (ssize_t)sizeof(*a) || a->n > w->n) {
		r = n < 0 ? (int)n : -ECONNRESET;
		snprintf(err, errlen, "worker pid %d (%s) %s during the hand-over", (int)old, w->vms,
			 n == -ETIMEDOUT ? "did not answer" : "went away");
		goto abort;
	}
	if (a->exit_after < 0) {
		r = a->h.err < 0 ? a->h.err : -EPROTO;
		snprintf(err, errlen, "%s", a->why[0] ? a->why : strerror(-r));
		goto abort;
	}
	/* The VMs are the new worker's: it takes the old one's place. */
	{
		struct iso_ans_hdr up;

		n = recv_until(sfd, &up, sizeof(up), mono_ms() + ISO_START_TIMEOUT_MS);
		if (n != sizeof(up) || up.op != ISO_READY)
			log_error("upgrade: the new worker pid %d (%s) did not report ready", (int)pid,
				  w->vms);
	}
	pthread_mutex_lock(&iso->keep_lock);
	if (w->keep_fd >= 0) {
		keep_read(iso, w); /* the old worker's last records; the new one's replace them */
		if (w->keep_fd >= 0)
			close(w->keep_fd);
	}
	w->keep_fd = kfd;
	iso->keep_gen++;
	free(w->exec_path);
	w->exec_path = strdup(path);
	pthread_mutex_unlock(&iso->keep_lock);
	keep_wake(iso);
	close(w->fd); /* the old worker's cue to exit */
	old_pidfd = w->pidfd;
	old_watch = w->watch;
	w->pidfd = -1;
	w->watching = false;
	w->fd = sfd;
	w->pid = pid;
	w->started_ms = mono_ms();
	w->backoff_ms = 0;
	w->seq = 0;
	w->quiet_until_ms = 0;
	pthread_mutex_unlock(&w->lock);
	reap_replaced(w, old, old_pidfd, old_watch, w->vms);
	for (uint32_t k = 0; k < a->n; k++) {
		ret->vms[ret->n] = a->vms[k];
		ret->vms[ret->n++].worker_pid = (int)pid;
		log_info("upgrade: vm%u now served by worker pid %d (was %d), paused %.3f ms, %u "
			 "connections", a->vms[k].cid, (int)pid, (int)old,
			 (double)a->vms[k].pause_us / 1e3, a->vms[k].conns);
	}
	r = 0;
	if (a->exit_after != 0) {
		r = a->h.err < 0 ? a->h.err : -EPROTO;
		snprintf(err, errlen, "%s", a->why);
	}
	free(a);
	return r;

abort:
	/* It serves nothing; the old worker resumed its VMs (upgrade.c). */
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	close(sfd);
	close(kfd);
	pthread_mutex_unlock(&w->lock);
	free(a);
	return r;
}

/*
 * upgrade with --isolate (docs/upgrade.md, "Under --isolate"): every worker in turn, stopping at
 * the first that fails, then the main process itself (upgrade_main): ret->new_pid is the new
 * main's pid and ret->exit_after 0 once it took over, else this process's pid.
 */
static int iso_upgrade(void *opaque, const char *binary, struct ops_ctl_upgrade *ret,
		       char *err, size_t errlen)
{
	struct iso *iso = opaque;
	char self[PATH_MAX], why[640];
	unsigned done = 0;
	int r = 0;

	ret->exit_after = -1; /* the main process stays */
	ret->old_pid = ret->new_pid = (int)getpid();
	if (!binary) {
		r = upgrade_self_path(self, sizeof(self));
		if (r < 0) {
			snprintf(err, errlen, "upgrade: cannot read /proc/self/exe: %s",
				 strerror(-r));
			return r;
		}
		binary = self;
	}
	ret->vms = calloc(iso->cfg->n_vms ? iso->cfg->n_vms : 1, sizeof(*ret->vms));
	if (!ret->vms) {
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	pthread_mutex_lock(&iso->up_lock);
	for (done = 0; done < iso->nw; done++) {
		why[0] = '\0';
		r = upgrade_worker(iso, done, binary, ret, why, sizeof(why));
		if (r < 0)
			break;
	}
	if (r < 0) {
		snprintf(err, errlen, "worker of %s (%u of %u upgraded before it; it and the rest "
			 "serve on): %s", iso->w[done].vms, done, iso->nw, why);
		log_error("%s", err);
	} else {
		why[0] = '\0';
		r = upgrade_main(iso, binary, ret, why, sizeof(why));
		if (r < 0) {
			snprintf(err, errlen, "every worker was upgraded (%u), the main process was "
				 "not (it serves on): %s", iso->nw, why);
			log_error("upgrade: %s", err);
		} else {
			log_info("upgrade: every worker upgraded; pid %d is the main process now: "
				 "exiting", ret->new_pid);
		}
	}
	pthread_mutex_unlock(&iso->up_lock);
	return r;
}

/* ---- the main process: its own hand-over, the last step of an upgrade (docs/upgrade.md) ---- */

/* The main process's record (REC_KIND_ISO_MAIN), version 1: tags (docs/upgrade.md, kind 7). */
#define ISO_MAIN_REC_VERSION 1u
#ifdef UVSOCKD_TEST_ISO_MAIN_REC_READ_MAX
/* uvsockd-test-refuse-main: reads no version, to test a refused hand-over of the main. */
static const uint32_t iso_main_rec_read_max = UVSOCKD_TEST_ISO_MAIN_REC_READ_MAX;
#else
static const uint32_t iso_main_rec_read_max = ISO_MAIN_REC_VERSION;
#endif
enum { /* top level */
	IM_WORKERS = 1,  /* u32: how many workers (the plan's count) */
	IM_CTL = 2,      /* list: the control socket's listener, if there is one */
	IM_WORKER = 3,   /* list, once per worker, in the plan's order */
};
enum { IMC_FD = 1, IMC_DEV, IMC_INO, IMC_FLAGS };
enum { /* a worker */
	IMW_ALIVE = 1,   /* u32 0|1 */
	IMW_PID,         /* u32 */
	IMW_REQ,         /* fd: the main's end of its request socket (alive only) */
	IMW_KEEP,        /* fd: the main's end of its keeper socket, if open */
	IMW_EXEC,        /* bytes: the binary its restart runs, if not the main's own */
	IMW_BACKOFF,     /* u32 ms */
	IMW_RESTARTS,    /* u32 */
	IMW_RESTART_IN,  /* u32 ms until its pending restart, 0: none */
	IMW_INHERITED,   /* u32 0|1 */
	IMW_KEPT,        /* list, once per VM with a kept record */
};
enum { IMK_VM = 1 /* u32: index among the worker's VMs */, IMK_MEMFD /* fd */,
       IMK_CONN /* u32: which of the IMK_FD is the VMM's connection */, IMK_FD /* fd, in order */ };

/* Builds the record (every worker's lock and keep_lock held). */
static int main_rec_write(struct iso *iso, struct rec_writer *rw)
{
	const struct uds_listener *l = iso->ctl ? ops_ctl_listener(iso->ctl) : NULL;
	uint64_t now = mono_ms();

	rec_writer_init(rw, REC_KIND_ISO_MAIN, ISO_MAIN_REC_VERSION);
	rec_put_u32(rw, IM_WORKERS, iso->nw);
	if (l && l->fd >= 0) {
		rec_begin(rw, IM_CTL);
		rec_put_fd(rw, IMC_FD, l->fd);
		rec_put_u64(rw, IMC_DEV, (uint64_t)l->dev);
		rec_put_u64(rw, IMC_INO, (uint64_t)l->ino);
		rec_put_u32(rw, IMC_FLAGS, l->flags);
		rec_end(rw);
	}
	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];
		bool alive = atomic_load_explicit(&w->alive, memory_order_relaxed) && w->fd >= 0;

		rec_begin(rw, IM_WORKER);
		rec_put_u32(rw, IMW_ALIVE, alive);
		rec_put_u32(rw, IMW_PID, alive ? (uint32_t)w->pid : 0);
		if (alive)
			rec_put_fd(rw, IMW_REQ, w->fd);
		if (w->keep_fd >= 0)
			rec_put_fd(rw, IMW_KEEP, w->keep_fd);
		if (w->exec_path)
			rec_put_bytes(rw, IMW_EXEC, w->exec_path, strlen(w->exec_path));
		rec_put_u32(rw, IMW_BACKOFF, w->backoff_ms);
		rec_put_u32(rw, IMW_RESTARTS, w->restarts);
		rec_put_u32(rw, IMW_RESTART_IN,
			    !w->restart_at_ms ? 0 : w->restart_at_ms > now
			    ? (uint32_t)(w->restart_at_ms - now) : 1);
		rec_put_u32(rw, IMW_INHERITED, w->inherited);
		for (unsigned k = 0; k < w->n; k++) {
			struct kept *kp = &w->kept[k];
			uint32_t conn = 0;

			if (kp->memfd < 0)
				continue;
			for (size_t f = 0; f < kp->nfds; f++)
				if (kp->fds[f] == kp->conn)
					conn = (uint32_t)f;
			rec_begin(rw, IMW_KEPT);
			rec_put_u32(rw, IMK_VM, k);
			rec_put_fd(rw, IMK_MEMFD, kp->memfd);
			rec_put_u32(rw, IMK_CONN, conn);
			for (size_t f = 0; f < kp->nfds; f++)
				rec_put_fd(rw, IMK_FD, kp->fds[f]);
			rec_end(rw);
		}
		rec_end(rw);
	}
	return rec_writer_finish(rw, &(const uint8_t *){ NULL }, &(size_t){ 0 });
}

/* One kept record of worker w from item it (a list); *seen marks its VMs. */
static int main_rec_kept(struct rec_reader *r, const struct rec_item *it, struct worker *w,
			 bool *seen)
{
	struct rec_reader sub;
	struct rec_item f;
	struct kept kp = { .memfd = -1, .conn = -1 };
	uint32_t vm = UINT32_MAX, conn = UINT32_MAX, u;
	int fd, k, e;

	e = rec_enter(r, it, "kept", &sub);
	while (e == 0 && (k = rec_next(&sub, &f)) == 1) {
		if (f.tag == IMK_VM && vm == UINT32_MAX && (e = rec_get_u32(&sub, &f, &u)) == 0)
			vm = u;
		else if (f.tag == IMK_CONN && conn == UINT32_MAX &&
			 (e = rec_get_u32(&sub, &f, &u)) == 0)
			conn = u;
		else if (f.tag == IMK_MEMFD && kp.memfd < 0 && (e = rec_get_fd(&sub, &f, &fd)) == 0)
			kp.memfd = fd;
		else if (f.tag == IMK_FD && (e = rec_get_fd(&sub, &f, &fd)) == 0) {
			int *p = realloc(kp.fds, (kp.nfds + 1) * sizeof(int));

			if (!p)
				e = -ENOMEM;
			else
				(kp.fds = p)[kp.nfds++] = fd;
		} else if (e == 0)
			e = rec_fail(sub.doc, -EBADMSG, "kept: unknown or repeated item %u", f.tag);
	}
	if (e == 0 && k < 0)
		e = k;
	if (e == 0 && (vm >= w->n || seen[vm] || kp.memfd < 0 || conn >= kp.nfds))
		e = rec_fail(sub.doc, -EBADMSG, "kept: a VM index, memfd or connection is missing, "
			     "repeated or out of range");
	if (e < 0) {
		free(kp.fds); /* the fds are closed with the record's */
		return e;
	}
	kp.conn = kp.fds[conn];
	seen[vm] = true;
	w->kept[vm] = kp;
	return 0;
}

/* Worker w from item it: its fields once each, its kept records (IMW_KEPT) any number. */
static int main_rec_worker(struct rec_reader *r, const struct rec_item *it, struct worker *w)
{
	static const struct rec_field all[] = {
		{ IMW_ALIVE, REC_U32, true, "alive" },
		{ IMW_PID, REC_U32, true, "pid" },
		{ IMW_REQ, REC_FD, false, "request socket" },
		{ IMW_KEEP, REC_FD, false, "keeper socket" },
		{ IMW_EXEC, REC_BYTES, false, "binary" },
		{ IMW_BACKOFF, REC_U32, true, "back-off" },
		{ IMW_RESTARTS, REC_U32, true, "restarts" },
		{ IMW_RESTART_IN, REC_U32, true, "restart in" },
		{ IMW_INHERITED, REC_U32, true, "inherited" },
	};
	enum { NF = sizeof(all) / sizeof(all[0]) };
	struct rec_val v[NF];
	struct rec_reader sub;
	struct rec_item f;
	bool seen[UVSOCKD_MAX_VMS];
	int e, k;

	memset(seen, 0, sizeof(seen));
	memset(v, 0, sizeof(v));
	e = rec_enter(r, it, "worker", &sub);
	if (e < 0)
		return e;
	while ((k = rec_next(&sub, &f)) == 1) {
		size_t j;

		if (f.tag == IMW_KEPT) {
			if ((e = main_rec_kept(&sub, &f, w, seen)) < 0)
				return e;
			continue;
		}
		for (j = 0; j < NF && all[j].tag != f.tag; j++)
			;
		if (j == NF || v[j].present)
			return rec_fail(sub.doc, -EBADMSG, "worker: unknown or repeated item %u",
					f.tag);
		v[j].present = true;
		v[j].it = f;
		if (all[j].type == REC_U32) {
			uint32_t u;

			if ((e = rec_get_u32(&sub, &f, &u)) < 0)
				return e;
			v[j].u = u;
		} else if (all[j].type == REC_FD) {
			int fd;

			if ((e = rec_get_fd(&sub, &f, &fd)) < 0)
				return e;
			v[j].u = (uint64_t)fd;
		}
	}
	if (k < 0)
		return k;
	for (size_t j = 0; j < NF; j++)
		if (all[j].required && !v[j].present)
			return rec_fail(sub.doc, -EBADMSG, "worker: %s missing", all[j].name);
	if (v[0].u > 1 || v[8].u > 1 ||
	    (v[0].u && (!v[2].present || v[1].u == 0 || v[1].u > INT32_MAX)) ||
	    (!v[0].u && v[2].present) || v[4].it.len >= PATH_MAX || v[5].u > ISO_RESTART_MAX_MS ||
	    v[7].u > ISO_RESTART_MAX_MS)
		return rec_fail(sub.doc, -EBADMSG, "worker: inconsistent fields");
	if (v[4].present && (!v[4].it.len || memchr(v[4].it.val, '\0', v[4].it.len)))
		return rec_fail(sub.doc, -EBADMSG, "worker: a bad binary path");
	if (v[4].present && !(w->exec_path = strndup((const char *)v[4].it.val, v[4].it.len)))
		return -ENOMEM;
	atomic_store(&w->alive, v[0].u == 1);
	w->pid = (pid_t)v[1].u;
	w->fd = v[2].present ? (int)v[2].u : -1;
	w->keep_fd = v[3].present ? (int)v[3].u : -1;
	w->backoff_ms = (uint32_t)v[5].u;
	w->restarts = (unsigned)v[6].u;
	w->restart_at_ms = v[7].u ? mono_ms() + v[7].u : 0;
	w->inherited = v[8].u == 1;
	w->started_ms = mono_ms();
	return 0;
}

/* Forgets (closes nothing) what main_rec_read put in iso from the record's fds. */
static void main_rec_forget(struct iso *iso)
{
	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];

		w->fd = w->keep_fd = -1;
		atomic_store(&w->alive, false);
		for (unsigned k = 0; k < w->n; k++) {
			free(w->kept[k].fds);
			w->kept[k] = (struct kept){ .memfd = -1, .conn = -1 };
		}
	}
}

/*
 * The record from the old main in buf, its fds[nfds], into iso and *ctl. Every check is done
 * before anything is used; on failure (why in err) iso holds none of the fds.
 */
static int main_rec_read(struct iso *iso, const uint8_t *buf, size_t len, const int *fds,
			 size_t nfds, struct uds_listener *ctl, char *err, size_t errlen)
{
	struct rec_doc d;
	struct rec_reader r;
	struct rec_item it;
	unsigned wi = 0;
	bool have_n = false, have_ctl = false;
	int e, k;

	e = rec_open(&d, buf, len, REC_KIND_ISO_MAIN, 1, iso_main_rec_read_max, fds, nfds);
	if (e < 0) {
		snprintf(err, errlen, "main record: %s", rec_error(&d));
		return e;
	}
	rec_root(&d, &r, "main");
	while (e == 0 && (k = rec_next(&r, &it)) == 1) {
		uint32_t u;

		if (it.tag == IM_WORKERS && !have_n) {
			e = rec_get_u32(&r, &it, &u);
			if (e == 0 && u != iso->nw)
				e = rec_fail(&d, -EBADMSG, "%u workers, this configuration has %u", u,
					     iso->nw);
			have_n = true;
		} else if (it.tag == IM_CTL && !have_ctl) {
			static const struct rec_field cf[] = {
				{ IMC_FD, REC_FD, true, "listener" },
				{ IMC_DEV, REC_U64, true, "dev" },
				{ IMC_INO, REC_U64, true, "ino" },
				{ IMC_FLAGS, REC_U32, true, "flags" },
			};
			struct rec_val cv[4];
			struct rec_reader sub;

			e = rec_enter(&r, &it, "control", &sub);
			if (e == 0)
				e = rec_scan(&sub, cf, 4, cv);
			if (e == 0) {
				ctl->fd = (int)cv[0].u;
				ctl->dev = (dev_t)cv[1].u;
				ctl->ino = (ino_t)cv[2].u;
				ctl->flags = (unsigned)cv[3].u;
			}
			have_ctl = true;
		} else if (it.tag == IM_WORKER && have_n && wi < iso->nw) {
			e = main_rec_worker(&r, &it, &iso->w[wi++]);
		} else {
			e = rec_fail(&d, -EBADMSG, "unknown, repeated or misplaced item %u", it.tag);
		}
	}
	if (e == 0 && k < 0)
		e = k;
	if (e == 0 && (!have_n || wi != iso->nw))
		e = rec_fail(&d, -EBADMSG, "%u of %u workers", wi, iso->nw);
	if (e == 0)
		e = rec_check_fds_claimed(&d);
	if (e < 0) {
		snprintf(err, errlen, "main record: %s", rec_error(&d)[0] ? rec_error(&d)
									: strerror(-e));
		main_rec_forget(iso);
		ctl->fd = -1;
	}
	rec_doc_fini(&d);
	return e;
}

/*
 * Asks every living worker to set its parent death signal to sig (0: off), stopping at the
 * first that fails (why in err). Returns how many did, or -1 - that count on a failure.
 */
static int workers_pdeath(struct iso *iso, int sig, char *err, size_t errlen)
{
	for (unsigned i = 0; i < iso->nw; i++) {
		struct worker *w = &iso->w[i];
		struct iso_req q;
		struct iso_ans_hdr a;
		uint64_t end = mono_ms() + ISO_ANSWER_TIMEOUT_MS;
		ssize_t n;

		if (!atomic_load_explicit(&w->alive, memory_order_relaxed) || w->fd < 0)
			continue;
		q = (struct iso_req){ .op = ISO_PDEATH, .seq = ++w->seq, .vm = (uint32_t)sig };
		if (send(w->fd, &q, sizeof(q), MSG_NOSIGNAL) != sizeof(q)) {
			snprintf(err, errlen, "worker pid %d (%s): %s", (int)w->pid, w->vms,
				 strerror(errno));
			return -1 - (int)i;
		}
		do {
			n = recv_until(w->fd, &a, sizeof(a), end);
		} while (n >= (ssize_t)sizeof(a) && (a.seq != w->seq || a.op != ISO_PDEATH));
		if (n != sizeof(a) || a.err) {
			snprintf(err, errlen, "worker pid %d (%s) cannot %s its parent death signal: %s",
				 (int)w->pid, w->vms, sig ? "set" : "clear",
				 n != sizeof(a) ? (n == -ETIMEDOUT ? "no answer" : "gone")
						: strerror(-a.err));
			return -1 - (int)i;
		}
	}
	return (int)iso->nw;
}

/*
 * The child of upgrade_main: only fd stays, then path runs as "--takeover fd" with uvsockd's own
 * arguments; no parent death signal (it outlives this process). If execve fails, fd hears
 * "exec-failed <errno>".
 */
static __attribute__((noreturn)) void exec_main(const char *path, char **av, int fd)
{
	char msg[40] = "exec-failed ";
	sigset_t none;

	if ((fd > 3 && close_range(3, (unsigned)fd - 1, 0) < 0) ||
	    close_range((unsigned)fd + 1, ~0u, 0) < 0)
		_exit(1);
	(void)fcntl(fd, F_SETFD, 0);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execv(path, av);
	upgrade_utoa((unsigned)errno, msg + strlen(msg));
	(void)!write(fd, msg, strlen(msg));
	_exit(127);
}

/*
 * The last step of an upgrade under --isolate, once every worker runs the new binary: a new
 * main process from path takes this one's state (docs/upgrade.md, "Under --isolate"). Holds
 * every worker's lock and the keeper's until the commit, so nothing is reaped, restarted or
 * kept meanwhile. Returns 0 (committed: ret names the new main, ret->exit_after 0: this
 * process exits once it answered, removing nothing and stopping no worker) or -errno with why
 * in err (this process keeps everything; the workers' parent death signal is set again).
 */
static int upgrade_main(struct iso *iso, const char *path, struct ops_ctl_upgrade *ret,
			char *err, size_t errlen)
{
	struct rec_writer rw = { 0 };
	char *const *argv;
	int argc = vm_set_args(&argv);
	char fdarg[16], **av = NULL, msg[512];
	int sv[2] = { -1, -1 }, memfd = -1, r, cleared = 0;
	pid_t pid = -1;
	ssize_t n;

	av = calloc((size_t)argc + 4, sizeof(*av));
	if (!av || !argv) {
		free(av);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		r = -errno;
		free(av);
		snprintf(err, errlen, "socketpair: %s", strerror(-r));
		return r;
	}
	snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
	av[0] = (char *)path;
	av[1] = "--takeover";
	av[2] = fdarg;
	for (int k = 1; k < argc; k++)
		av[k + 2] = argv[k];
	for (unsigned i = 0; i < iso->nw; i++)
		pthread_mutex_lock(&iso->w[i].lock);
	pthread_mutex_lock(&iso->keep_lock);
	pid = fork();
	if (pid == 0)
		exec_main(path, av, sv[1]);
	r = pid < 0 ? -errno : 0;
	close(sv[1]);
	free(av);
	if (r < 0) {
		snprintf(err, errlen, "fork: %s", strerror(-r));
		goto out;
	}
	log_info("upgrade: new main process pid %d (%s) takes over the main process", (int)pid,
		 path);
	/* The keeper's last records first: they go with the rest. */
	for (unsigned i = 0; i < iso->nw; i++)
		if (iso->w[i].keep_fd >= 0)
			keep_read(iso, &iso->w[i]);
	r = main_rec_write(iso, &rw);
	if (r == 0)
		r = rec_memfd(rw.buf, rw.len, "uvsockd-main", &memfd);
	if (r == 0)
		r = rec_send(sv[0], memfd, rw.fds, rw.nfds);
	if (r < 0) {
		snprintf(err, errlen, "cannot send the main record: %s", strerror(-r));
		goto out;
	}
	n = recv_until(sv[0], msg, sizeof(msg) - 1, mono_ms() + UPGRADE_STEP_TIMEOUT_MS);
	msg[n > 0 ? n : 0] = '\0';
	if (n <= 0 || strcmp(msg, "ready") != 0) {
		r = n == -ETIMEDOUT ? -ETIMEDOUT : -EPROTO;
		if (strncmp(msg, "refused ", 8) == 0)
			snprintf(err, errlen, "refused by %.200s (pid %d): %.380s", path, (int)pid, msg + 8);
		else if (strncmp(msg, "exec-failed ", 12) == 0)
			snprintf(err, errlen, "cannot run %.200s: %s", path, strerror(atoi(msg + 12)));
		else
			snprintf(err, errlen, "the new main process pid %d %s", (int)pid,
				 n == -ETIMEDOUT ? "did not answer" : "went away");
		goto out;
	}
	/* Before this process may exit: its exit would stop every worker. */
	cleared = workers_pdeath(iso, 0, err, errlen);
	if (cleared < 0) {
		r = -EIO;
		goto out;
	}
	if (send(sv[0], "go", 2, MSG_NOSIGNAL) != 2) {
		r = -errno;
		snprintf(err, errlen, "the new main process pid %d went away before go", (int)pid);
		goto out;
	}
	/* Committed: the workers, the records and the control socket are the new main's. */
	atomic_store(&iso->handed_over, true);
	iso->keep_stop = true;
	n = recv_until(sv[0], msg, sizeof(msg) - 1, mono_ms() + UPGRADE_STEP_TIMEOUT_MS);
	msg[n > 0 ? n : 0] = '\0';
	if (strncmp(msg, "started", 7) != 0)
		log_error("upgrade: the new main process pid %d did not confirm: it owns everything "
			  "all the same", (int)pid);
	ret->new_pid = (int)pid;
	ret->exit_after = 0;
	r = 0;
out:
	if (r < 0 && pid > 0) {
		char why[640];

		(void)send(sv[0], "abort", 5, MSG_NOSIGNAL);
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (cleared != 0) {
			/* the ones cleared (a failure counts them as -1 - done) get it back */
			if (workers_pdeath(iso, SIGTERM, why, sizeof(why)) < 0)
				log_error("upgrade: %s", why);
		}
	}
	pthread_mutex_unlock(&iso->keep_lock);
	for (unsigned i = iso->nw; i-- > 0;)
		pthread_mutex_unlock(&iso->w[i].lock);
	keep_wake(iso);
	if (memfd >= 0)
		close(memfd);
	rec_writer_free(&rw);
	close(sv[0]);
	return r;
}

static void iso_free(struct iso *iso)
{
	if (iso->keeper_started) {
		pthread_mutex_lock(&iso->keep_lock);
		iso->keep_stop = true;
		pthread_mutex_unlock(&iso->keep_lock);
		keep_wake(iso);
		pthread_join(iso->keeper, NULL);
	}
	if (iso->keep_wake >= 0)
		close(iso->keep_wake);
	for (unsigned i = 0; iso->w && i < iso->nw; i++) {
		if (iso->w[i].pidfd >= 0) {
			if (iso->w[i].watching) {
				pthread_cancel(iso->w[i].watch);
				pthread_join(iso->w[i].watch, NULL);
			}
			close(iso->w[i].pidfd);
		}
		if (iso->w[i].fd >= 0)
			close(iso->w[i].fd);
		if (iso->w[i].keep_fd >= 0)
			close(iso->w[i].keep_fd);
		for (unsigned k = 0; iso->w[i].kept && k < iso->w[i].n; k++)
			kept_clear(&iso->w[i].kept[k]);
		free(iso->w[i].kept);
		free(iso->w[i].idx);
		free(iso->w[i].exec_path);
		pthread_mutex_destroy(&iso->w[i].lock);
	}
	free(iso->w);
	free(iso->worker_of);
	free(iso->local);
	pthread_mutex_destroy(&iso->keep_lock);
	pthread_mutex_destroy(&iso->up_lock);
}

/* The keeper thread of crash survival (keeper_main), with what it means said in the log. */
static void start_keeper(struct iso *iso)
{
	int r;

	iso->keep_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r = iso->keep_wake < 0 ? -errno : pthread_create(&iso->keeper, NULL, keeper_main, iso);
	if (r > 0)
		r = -r;
	if (r < 0)
		log_error("crash survival: off (cannot start the keeper: %s): a worker that dies "
			  "costs its VMs their vsock until each restarts", strerror(-r));
	else
		log_info("crash survival: on (--isolate): the main process keeps each VM's vhost-user "
			 "connection and configuration; a worker that dies is started again and "
			 "adopts its VMs (their open vsock connections end)");
	iso->keeper_started = r == 0;
}

/*
 * The main process's loop once the workers run (run false: start-up failed, straight to the
 * stop): restarts, SIGCHLD, SIGUSR2, and the stop. Returns the exit status (isolate_run).
 */
static int supervise(struct iso *iso, const sigset_t *sigs, bool run)
{
	sigset_t all = *sigs, chld;
	int sig = 0, rc = 1;

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigaddset(&all, SIGCHLD);
	while (run) {
		int wait_ms = atomic_load(&iso->handed_over) ? -1 : restart_due(iso, sigs);
		struct timespec ts = { .tv_sec = wait_ms / 1000,
				       .tv_nsec = (long)(wait_ms % 1000) * (long)NS_PER_MS };

		sig = sigtimedwait(&all, NULL, wait_ms < 0 ? NULL : &ts);
		if (sig < 0 || atomic_load(&iso->handed_over))
			continue; /* a restart is due, EINTR; or the control thread is exiting */
		if (sig == SIGCHLD) {
			(void)reap(iso, false);
			if (alive_count(iso) || restart_pending(iso))
				continue;
			log_error("every worker process is gone: exiting");
			break;
		}
		if (sig == SIGUSR2) {
			struct ops_ctl_upgrade u = { .exit_after = -1 };
			char err[768];

			if (iso_upgrade(iso, NULL, &u, err, sizeof(err)) == 0) {
				log_info("SIGUSR2: upgraded: pid %d is the main process", u.new_pid);
				_exit(0); /* nothing of what the new main owns may be touched */
			}
			free(u.vms);
			continue;
		}
		forward(iso, sig);
		if (sig == SIGHUP)
			continue;
		log_info("signal %d: stopping the workers", sig);
		rc = 0;
		break;
	}
	daemon_sd_stopping();
	/* The control thread asks the workers: stop it before their sockets close. */
	ops_ctl_stop(iso->ctl);
	iso->ctl = NULL;
	if (rc != 0)
		forward(iso, SIGTERM);
	if (stop_workers(iso, &chld))
		rc = 1;
	return rc;
}

int isolate_run(const struct uvsockd_config *cfg, const sigset_t *sigs)
{
	struct iso iso = { .keep_wake = -1, .keep_lock = PTHREAD_MUTEX_INITIALIZER,
			   .up_lock = PTHREAD_MUTEX_INITIALIZER };
	sigset_t chld;
	int r, rc = 1;

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &chld, NULL);
	if (plan(&iso, cfg) < 0) {
		log_error("out of memory");
		goto out;
	}
	for (unsigned i = 0; i < iso.nw; i++) {
		r = spawn(&iso, i, sigs, false);
		if (r < 0) {
			log_error("cannot start a worker process: %s", strerror(-r));
			rc = supervise(&iso, sigs, false);
			goto out;
		}
	}
	/* Every worker has its inherited sockets: a VMM must see its connection end with it. */
	uds_drop_adopted();
	/* Only now: a worker forked while records are kept would hold copies of them. */
	start_keeper(&iso);
	if (wait_ready(&iso) < 0 || daemon_ctl_start(cfg, &iso_ctl_ops, &iso, &iso.ctl) < 0) {
		rc = supervise(&iso, sigs, false);
		goto out;
	}
	log_info("%u worker processes for %u VMs", iso.nw, cfg->n_vms);
	daemon_sd_ready(cfg->n_vms, iso.nw);
	rc = supervise(&iso, sigs, true);
out:
	iso_free(&iso);
	return rc;
}

int isolate_worker_exec(const struct uvsockd_config *cfg, const char *spec, const sigset_t *sigs)
{
	struct iso iso = { .keep_wake = -1, .keep_lock = PTHREAD_MUTEX_INITIALIZER,
			   .up_lock = PTHREAD_MUTEX_INITIALIZER };
	unsigned wi;
	int hfd, rfd, kfd;

	if (sscanf(spec, "%u,%d,%d,%d", &wi, &hfd, &rfd, &kfd) != 4 || rfd < 3 || kfd < 3) {
		log_error("--iso-worker %s: not what the main process gives", spec);
		return 1;
	}
	if (plan(&iso, cfg) < 0 || wi >= iso.nw) {
		log_error("--iso-worker %s: no such worker in this configuration", spec);
		return 1;
	}
	(void)fcntl(rfd, F_SETFD, FD_CLOEXEC);
	(void)fcntl(kfd, F_SETFD, FD_CLOEXEC);
	if (hfd >= 0) {
		(void)fcntl(hfd, F_SETFD, FD_CLOEXEC);
		vm_set_takeover_fd(hfd);
	}
	worker_main(&iso, wi, rfd, kfd, sigs, getppid(), false);
}

/* Answers the old main "refused <why>" and logs it. */
static void takeover_refuse(int fd, const char *why)
{
	char msg[700];

	log_error("--takeover: the main process is not taken over: %s", why);
	snprintf(msg, sizeof(msg), "refused %s", why);
	(void)send(fd, msg, strlen(msg), MSG_NOSIGNAL);
}

int isolate_takeover(const struct uvsockd_config *cfg, int fd, const sigset_t *sigs)
{
	struct iso iso = { .keep_wake = -1, .keep_lock = PTHREAD_MUTEX_INITIALIZER,
			   .up_lock = PTHREAD_MUTEX_INITIALIZER };
	struct uds_listener ctl = { .fd = -1 };
	const uint8_t *buf = NULL;
	char err[640] = "", msg[64];
	int memfd = -1, *fds = NULL, r, rc = 1;
	size_t nfds = 0, len = 0;
	sigset_t chld;
	ssize_t n;

	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &chld, NULL);
	r = plan(&iso, cfg);
	if (r < 0)
		snprintf(err, sizeof(err), "out of memory");
	if (r == 0 && (r = rec_recv(fd, UPGRADE_STEP_TIMEOUT_MS, &memfd, &fds, &nfds)) < 0)
		snprintf(err, sizeof(err), "cannot receive the main record: %s", strerror(-r));
	if (r == 0 && (r = rec_map_fd(memfd, &buf, &len)) < 0)
		snprintf(err, sizeof(err), "cannot map the main record: %s", strerror(-r));
	if (r == 0)
		r = main_rec_read(&iso, buf, len, fds, nfds, &ctl, err, sizeof(err));
	if (buf)
		rec_unmap(buf, len);
	if (memfd >= 0)
		close(memfd);
	if (r < 0) {
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
	}
	free(fds);
	/* The workers are not our children: their pidfds tell when they exit. */
	for (unsigned i = 0; r == 0 && i < iso.nw; i++) {
		struct worker *w = &iso.w[i];

		if (!atomic_load(&w->alive))
			continue;
		w->pidfd = (int)syscall(SYS_pidfd_open, w->pid, 0);
		if (w->pidfd < 0) {
			r = -errno;
			snprintf(err, sizeof(err), "pidfd_open of worker pid %d (%s): %s",
				 (int)w->pid, w->vms, strerror(-r));
		}
	}
	if (r < 0) {
		takeover_refuse(fd, err);
		goto out;
	}
	if (send(fd, "ready", 5, MSG_NOSIGNAL) != 5) {
		log_error("--takeover: the old main process is gone");
		goto out;
	}
	n = recv_until(fd, msg, sizeof(msg) - 1, mono_ms() + UPGRADE_STEP_TIMEOUT_MS);
	msg[n > 0 ? n : 0] = '\0';
	if (strcmp(msg, "go") != 0) {
		log_error("--takeover: the old main process %s: nothing is taken over",
			  n > 0 ? "aborted" : "went away before go");
		goto out;
	}
	/* Ours from here: every worker, record and the control socket. */
	for (unsigned i = 0; i < iso.nw; i++) {
		struct worker *w = &iso.w[i];

		if (w->pidfd < 0)
			continue;
		w->watch_fd = w->pidfd;
		r = pthread_create(&w->watch, NULL, pidfd_watch, w);
		if (r)
			log_error("worker pid %d (%s): cannot watch it (%s): its exit goes unseen",
				  (int)w->pid, w->vms, strerror(r));
		w->watching = r == 0;
	}
	start_keeper(&iso);
	if (ctl.fd >= 0)
		vm_set_takeover_ctl(&ctl);
	if (daemon_ctl_start(cfg, &iso_ctl_ops, &iso, &iso.ctl) < 0)
		log_error("--takeover: no control socket: the workers are supervised all the same");
	else
		ctl.fd = -1;
	daemon_sd_mainpid();
	daemon_sd_ready(cfg->n_vms, iso.nw);
	snprintf(msg, sizeof(msg), "started %d", (int)getpid());
	(void)send(fd, msg, strlen(msg), MSG_NOSIGNAL);
	close(fd);
	fd = -1;
	log_info("took over as the main process: %u worker processes for %u VMs", iso.nw,
		 cfg->n_vms);
	rc = supervise(&iso, sigs, true);
out:
	if (fd >= 0)
		close(fd);
	if (ctl.fd >= 0)
		close(ctl.fd);
	iso_free(&iso);
	return rc;
}
