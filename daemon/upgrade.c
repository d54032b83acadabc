/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's live upgrade, both ends of the hand-over (upgrade.h; docs/upgrade.md, "The
 * protocol" and "A VM of uvsockd"): starting the new binary, the VM records, the ready / go
 * exchange, and resuming every VM when anything fails.
 */
#include "upgrade.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "device/vhu.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"

#ifdef UVSOCKD_TEST_VM_REC_READ_MAX
uint32_t upgrade_vm_rec_read_max = UVSOCKD_TEST_VM_REC_READ_MAX;
#else
uint32_t upgrade_vm_rec_read_max = UPGRADE_VM_REC_VERSION;
#endif

#define MSG_MAX 512

/* The VM record's top level, and its configuration list (uvsockd_vm_config). */
enum {
	VM_CONFIG = 1,
	VM_GLUE = 2, /* the glue's items (device/vhu.c, dev_vhu_save) */
};
enum {
	VC_CID = 1,
	VC_NAME = 2,
	VC_SOCKET = 3,
	VC_UDS = 4,
	VC_TXBUF = 5,
	VC_QSIZE = 6,
	VC_MAX_CONNS = 7, /* max-conns= as configured (0: the budget's share) */
	VC_GRANTED = 8,   /* the host connections the fd budget gave it */
	VC_OK_GUEST_PORT = 9,
	VC_GROUPS = 10,   /* list of group names (1: bytes) */
};

static const struct rec_field vm_fields[] = {
	{ VM_CONFIG, REC_LIST, true, "configuration" },
	{ VM_GLUE, REC_LIST, true, "glue" },
};
static const struct rec_field vc_fields[] = {
	{ VC_CID, REC_U32, true, "guest-cid" },
	{ VC_NAME, REC_BYTES, true, "name" },
	{ VC_SOCKET, REC_BYTES, true, "socket" },
	{ VC_UDS, REC_BYTES, true, "uds-path" },
	{ VC_TXBUF, REC_U32, true, "tx-buffer-size" },
	{ VC_QSIZE, REC_U32, true, "queue-size" },
	{ VC_MAX_CONNS, REC_U32, true, "max-conns" },
	{ VC_GRANTED, REC_U32, true, "granted connections" },
	{ VC_OK_GUEST_PORT, REC_U32, true, "connect-reply" },
	{ VC_GROUPS, REC_LIST, true, "groups" },
};

/* ---- messages ---------------------------------------------------------------------------- */

static int send_text(int fd, const char *s, int pass_fd)
{
	struct iovec iov = { .iov_base = (void *)s, .iov_len = strlen(s) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (pass_fd >= 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	return sendmsg(fd, &m, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/*
 * One text message (NUL-terminated into buf) within timeout_ms, with at most one passed fd in
 * *ret_fd (-1 if none; ret_fd NULL: any passed fd is closed). Returns 0, -ETIMEDOUT,
 * -ECONNRESET (the peer closed), -EBADMSG (truncated, or fds where none belong).
 */
static int recv_text(int fd, char *buf, size_t len, int timeout_ms, int *ret_fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len - 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	int got = -1, r, extra = 0;
	ssize_t n;

	if (ret_fd)
		*ret_fd = -1;
	do {
		r = poll(&p, 1, timeout_ms);
	} while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return errno == ECONNRESET ? -ECONNRESET : -errno;
	if (n == 0)
		return -ECONNRESET;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (got < 0 && ret_fd) {
				got = f;
			} else {
				close(f);
				extra = 1;
			}
		}
	}
	buf[n] = '\0';
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || extra) {
		if (got >= 0)
			close(got);
		return -EBADMSG;
	}
	if (ret_fd)
		*ret_fd = got;
	return 0;
}

/* ---- the record of one VM --------------------------------------------------------------- */

static void put_str(struct rec_writer *w, uint32_t tag, const char *s)
{
	rec_put_bytes(w, tag, s, strlen(s));
}

static void write_config(struct rec_writer *w, const struct upgrade_vm *v)
{
	const struct uvsockd_vm_config *c = v->cfg;

	rec_begin(w, VM_CONFIG);
	rec_put_u32(w, VC_CID, c->guest_cid);
	put_str(w, VC_NAME, c->name);
	put_str(w, VC_SOCKET, c->socket_path);
	put_str(w, VC_UDS, c->uds_path);
	rec_put_u32(w, VC_TXBUF, c->tx_buffer_size);
	rec_put_u32(w, VC_QSIZE, c->queue_size);
	rec_put_u32(w, VC_MAX_CONNS, c->max_conns);
	rec_put_u32(w, VC_GRANTED, v->max_conns);
	rec_put_u32(w, VC_OK_GUEST_PORT, c->ok_guest_port);
	rec_begin(w, VC_GROUPS);
	for (unsigned g = 0; g < c->n_groups; g++)
		put_str(w, 1, c->groups[g]);
	rec_end(w);
	rec_end(w);
}

/* A bytes item into a NUL-terminated string of at most size - 1 bytes, no NUL inside. */
static int get_str(struct rec_doc *doc, const struct rec_val *v, const char *what, char *out,
		   size_t size)
{
	if (v->it.len >= size || memchr(v->it.val, '\0', v->it.len))
		return rec_fail(doc, -EBADMSG, "%s: %u bytes, or a NUL inside", what, v->it.len);
	memcpy(out, v->it.val, v->it.len);
	out[v->it.len] = '\0';
	return 0;
}

static int read_config(struct rec_reader *r, const struct rec_item *it,
		       struct uvsockd_vm_config *c, uint32_t *granted)
{
	struct rec_val v[ARRAY_SIZE(vc_fields)];
	struct rec_reader sub, gr;
	struct rec_item g;
	int e;

	memset(c, 0, sizeof(*c));
	e = rec_enter(r, it, "configuration", &sub);
	if (e == 0)
		e = rec_scan(&sub, vc_fields, ARRAY_SIZE(vc_fields), v);
	if (e < 0)
		return e;
	if (v[0].u < 3 || v[0].u > 0xfffffffeull)
		return rec_fail(r->doc, -EBADMSG, "guest-cid %llu", (unsigned long long)v[0].u);
	c->guest_cid = (uint32_t)v[0].u;
	e = get_str(r->doc, &v[1], "name", c->name, sizeof(c->name));
	if (e == 0)
		e = get_str(r->doc, &v[2], "socket", c->socket_path, sizeof(c->socket_path));
	if (e == 0)
		e = get_str(r->doc, &v[3], "uds-path", c->uds_path, sizeof(c->uds_path));
	if (e < 0)
		return e;
	if (!c->name[0] || !c->socket_path[0] || !c->uds_path[0])
		return rec_fail(r->doc, -EBADMSG, "an empty name or path");
	/* Within what the command line and the configuration file take (options.c): the record
	 * makes the device, as a --vm does (a buffer size of 4 GiB would be allocated). */
	if (strlen(c->socket_path) > UVSOCKD_SUN_PATH_MAX ||
	    strlen(c->uds_path) > UVSOCKD_SUN_PATH_MAX - UVSOCKD_UDS_SUFFIX_MAX)
		return rec_fail(r->doc, -EBADMSG, "socket or uds-path too long");
	if (v[4].u < UVSOCKD_MIN_TX_BUFFER_SIZE || v[4].u > UVSOCKD_MAX_TX_BUFFER_SIZE ||
	    v[5].u < 1 || v[5].u > UVSOCKD_MAX_QUEUE_SIZE || (v[5].u & (v[5].u - 1)) ||
	    v[6].u > UVSOCKD_MAX_CONNS_MAX || v[7].u > UVSOCKD_MAX_CONNS_MAX)
		return rec_fail(r->doc, -EBADMSG, "tx-buffer-size %llu, queue-size %llu, "
				"max-conns %llu or granted connections %llu out of range",
				(unsigned long long)v[4].u, (unsigned long long)v[5].u,
				(unsigned long long)v[6].u, (unsigned long long)v[7].u);
	c->tx_buffer_size = (uint32_t)v[4].u;
	c->queue_size = (uint32_t)v[5].u;
	c->max_conns = (uint32_t)v[6].u;
	*granted = (uint32_t)v[7].u;
	if (v[8].u > 1)
		return rec_fail(r->doc, -EBADMSG, "connect-reply %llu", (unsigned long long)v[8].u);
	c->ok_guest_port = v[8].u;
	e = rec_enter(&sub, &v[9].it, "groups", &gr);
	while (e == 0 && (e = rec_next(&gr, &g)) == 1) {
		if (g.tag != 1 || c->n_groups == UVSOCKD_MAX_GROUPS)
			return rec_fail(r->doc, -EBADMSG, "groups: item %u, or more than %d",
					g.tag, UVSOCKD_MAX_GROUPS);
		e = get_str(r->doc, &(struct rec_val){ .present = true, .it = g }, "group",
			    c->groups[c->n_groups], sizeof(c->groups[0]));
		if (e == 0)
			c->n_groups++;
	}
	return e < 0 ? e : 0;
}

void upgrade_vm_rec_begin(struct rec_writer *w, const struct upgrade_vm *v)
{
	rec_writer_init(w, REC_KIND_VM, UPGRADE_VM_REC_VERSION);
	write_config(w, v);
	rec_begin(w, VM_GLUE);
}

/* ---- the old process ---------------------------------------------------------------------- */

struct child {
	const char *path;
	pid_t pid;
	int sock;
	bool theirs; /* started by someone else (an --isolate main): not ours to kill or reap */
};

/* This binary's path on disk now (an upgrade replaced the file: "PATH (deleted)" is PATH). */
int upgrade_self_path(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	static const char del[] = " (deleted)";

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	if ((size_t)n > sizeof(del) - 1 && strcmp(buf + n - (sizeof(del) - 1), del) == 0)
		buf[n - (sizeof(del) - 1)] = '\0';
	return 0;
}

void upgrade_utoa(unsigned v, char *out)
{
	char t[12];
	int n = 0;

	do {
		t[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		*out++ = t[--n];
	*out = '\0';
}

static int spawn(struct child *ch, int argc, char *const *argv, char *err, size_t errlen)
{
	char fdnum[12], msg[40] = "exec-failed ";
	char **av;
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		snprintf(err, errlen, "upgrade: socketpair: %s", strerror(errno));
		return -errno;
	}
	av = calloc((size_t)argc + 4, sizeof(*av));
	if (!av) {
		close(sv[0]);
		close(sv[1]);
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	upgrade_utoa((unsigned)sv[1], fdnum);
	av[0] = (char *)ch->path;
	av[1] = "--takeover";
	av[2] = fdnum;
	for (int i = 1; i < argc; i++)
		av[i + 2] = argv[i];
	pid = fork();
	if (pid == 0) {
		sigset_t none;
		int e;

		/* The new process takes signals as uvsockd's main() sets them up. */
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		fcntl(sv[1], F_SETFD, 0);
		execv(ch->path, av);
		e = errno;
		upgrade_utoa((unsigned)e, msg + strlen(msg));
		(void)!write(sv[1], msg, strlen(msg));
		_exit(127);
	}
	free(av);
	close(sv[1]);
	if (pid < 0) {
		int e = errno;

		close(sv[0]);
		snprintf(err, errlen, "upgrade: fork: %s", strerror(e));
		return -e;
	}
	ch->pid = pid;
	ch->sock = sv[0];
	return 0;
}

/* The new process failed or must go: ends it (killed if still there) and reaps it. */
static void child_end(struct child *ch)
{
	int st;

	if (ch->sock >= 0)
		close(ch->sock);
	ch->sock = -1;
	if (ch->pid > 0 && !ch->theirs) {
		/* It had its chance to answer; whatever it does now, it does not serve. */
		kill(ch->pid, SIGKILL);
		while (waitpid(ch->pid, &st, 0) < 0 && errno == EINTR)
			;
	}
	ch->pid = -1;
}

/* "upgrade refused by PATH (pid N): why" */
static int refuse(const struct child *ch, int e, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int refuse(const struct child *ch, int e, char *err, size_t errlen, const char *fmt, ...)
{
	char why[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "upgrade refused by %s (pid %d): %s", ch->path, (int)ch->pid, why);
	return e;
}

static const char *lost(int r)
{
	return r == -ETIMEDOUT ? "no answer in time" :
	       r == -ECONNRESET ? "it exited (or closed the hand-over socket)" : strerror(-r);
}

/* Stops VM v (on its thread) and writes its record but the device's part into w. */
static int stop_vm(struct upgrade_vm *v, struct rec_writer *w, uint64_t *stop_ns, char *err,
		   size_t errlen)
{
	struct dev_vhu_saved sv = { 0 };
	int r;

	upgrade_vm_rec_begin(w, v);
	r = dev_vhu_stop(v->vhu, w, &sv);
	if (r < 0) {
		snprintf(err, errlen, "upgrade: %s cannot be saved: %s", v->cfg->name,
			 strerror(-r));
		return r;
	}
	*stop_ns = sv.stop_ns;
	return 0;
}

/* Every VM is stopped: writes VM v's device part into w, seals the record and sends it. */
static int send_vm(struct child *ch, struct upgrade_vm *v, struct rec_writer *w, char *err,
		   size_t errlen)
{
	struct dev_vhu_saved sv = { 0 };
	const uint8_t *buf;
	size_t len;
	int r, memfd = -1;

	r = dev_vhu_save_device(v->vhu, w, &sv);
	rec_end(w);
	if (r < 0) {
		snprintf(err, errlen, "upgrade: %s cannot be saved: %s", v->cfg->name,
			 strerror(-r));
		return r;
	}
	v->conns = sv.conns;
	r = rec_writer_finish(w, &buf, &len);
	if (r == 0)
		r = rec_memfd(buf, len, "uvsockd-vm", &memfd);
	if (r == 0)
		r = rec_send(ch->sock, memfd, w->fds, w->nfds);
	if (memfd >= 0)
		close(memfd);
	if (r < 0)
		return refuse(ch, r, err, errlen, "sending %s's record: %s", v->cfg->name,
			      r == -EPIPE || r == -ECONNRESET ? lost(-ECONNRESET) : strerror(-r));
	log_info("upgrade: %s sent (%zu bytes, %u fds, %u connections)", v->cfg->name, len,
		 w->nfds, v->conns);
	return 0;
}

static int hand_over(struct child *ch, struct upgrade_vm *vms, unsigned n,
		     const struct uds_listener *ctl, uint64_t *stop, struct upgrade_result *res,
		     char *err, size_t errlen);

int upgrade_run(const char *binary, int argc, char *const *argv, struct upgrade_vm *vms,
		unsigned n, const struct uds_listener *ctl, struct upgrade_result *res, char *err,
		size_t errlen)
{
	char self[PATH_MAX];
	struct child ch = { .pid = -1, .sock = -1 };
	uint64_t *stop = NULL;
	int r;

	if (!binary) {
		r = upgrade_self_path(self, sizeof(self));
		if (r < 0) {
			snprintf(err, errlen, "upgrade: cannot read /proc/self/exe: %s",
				 strerror(-r));
			return r;
		}
		binary = self;
	}
	ch.path = binary;
	stop = calloc(n ? n : 1, sizeof(*stop));
	if (!stop) {
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	log_info("upgrade: starting %s for %u VM%s", binary, n, n == 1 ? "" : "s");
	r = spawn(&ch, argc, argv, err, errlen);
	if (r == 0)
		r = hand_over(&ch, vms, n, ctl, stop, res, err, errlen);
	free(stop);
	return r;
}

/*
 * The hand-over to the new process ch, started already: its hello, every VM's record, go.
 * stop: n entries. Returns as upgrade_run.
 */
static int hand_over(struct child *chp, struct upgrade_vm *vms, unsigned n,
		     const struct uds_listener *ctl, uint64_t *stop, struct upgrade_result *res,
		     char *err, size_t errlen)
{
	struct child ch = *chp;
	char msg[MSG_MAX];
	size_t started_len = 64 + (size_t)n * 24;
	char *started = NULL;
	unsigned vmin = 0, vmax = 0, sent = 0, stopped = 0;
	struct rec_writer *w = calloc(n ? n : 1, sizeof(*w));
	long hello_pid = 0;
	const char *binary = ch.path;
	char *p;
	int r;

	if (!w) {
		r = -ENOMEM;
		snprintf(err, errlen, "upgrade: out of memory");
		goto fail;
	}
	r = recv_text(ch.sock, msg, sizeof(msg), UPGRADE_STEP_TIMEOUT_MS, NULL);
	if (r == 0 && strncmp(msg, "exec-failed ", 12) == 0) {
		r = refuse(&ch, -ENOEXEC, err, errlen, "cannot execute it: %s",
			   strerror(atoi(msg + 12)));
		goto fail;
	}
	if (r == 0 && sscanf(msg, "hello %ld %u %u", &hello_pid, &vmin, &vmax) != 3)
		r = -EBADMSG;
	if (r < 0) {
		r = refuse(&ch, r, err, errlen, "before its hello: %s", lost(r));
		goto fail;
	}
	if (UPGRADE_VM_REC_VERSION < vmin || UPGRADE_VM_REC_VERSION > vmax)
		log_warn("upgrade: %s reads VM records %u..%u, this one writes %u: it will refuse",
			 binary, vmin, vmax, UPGRADE_VM_REC_VERSION);
	snprintf(msg, sizeof(msg), "vms %u", n);
	r = send_text(ch.sock, msg, -1);
	if (r < 0) {
		r = refuse(&ch, r, err, errlen, "%s", lost(-ECONNRESET));
		goto fail;
	}
	/* Every VM stopped before any device is written: VMs linked to siblings put packets in
	 * each other's inboxes until both are stopped (docs/upgrade.md, "The sibling part"). */
	for (stopped = 0; stopped < n; stopped++) {
		r = stop_vm(&vms[stopped], &w[stopped], &stop[stopped], err, errlen);
		if (r < 0) {
			rec_writer_free(&w[stopped]);
			goto fail; /* that one resumed already */
		}
	}
	/* Every VM sent, each answered, before any is given: a refusal leaves all of them here. */
	for (sent = 0; sent < n; sent++) {
		r = send_vm(&ch, &vms[sent], &w[sent], err, errlen);
		if (r < 0)
			goto fail;
		r = recv_text(ch.sock, msg, sizeof(msg), UPGRADE_STEP_TIMEOUT_MS, NULL);
		if (r < 0) {
			sent++;
			r = refuse(&ch, r, err, errlen, "%s: %s", vms[sent - 1].cfg->name, lost(r));
			goto fail;
		}
		if (strcmp(msg, "ready") != 0) {
			sent++;
			r = refuse(&ch, -EPROTO, err, errlen, "%s: %s", vms[sent - 1].cfg->name,
				   strncmp(msg, "refused ", 8) == 0 ? msg + 8 : msg);
			goto fail;
		}
	}
	snprintf(msg, sizeof(msg), "go %llu %llu", ctl && ctl->fd >= 0 ? (unsigned long long)ctl->dev : 0ull,
		 ctl && ctl->fd >= 0 ? (unsigned long long)ctl->ino : 0ull);
	r = send_text(ch.sock, msg, ctl ? ctl->fd : -1);
	if (r < 0) {
		/* go was not sent: the new process never serves. */
		r = refuse(&ch, r, err, errlen, "sending go: %s", lost(-ECONNRESET));
		goto fail;
	}
	/* Committed: from here the VMs are the new process's whatever it answers (it may have
	 * started their rings: resuming here could repeat what it did). */
	res->committed = true;
	for (unsigned i = 0; i < n; i++)
		dev_vhu_given(vms[i].vhu);
	started = malloc(started_len);
	r = started ? recv_text(ch.sock, started, started_len, UPGRADE_STEP_TIMEOUT_MS, NULL)
		    : -ENOMEM;
	if (r == 0 && strncmp(started, "started ", 8) != 0)
		r = -EPROTO;
	if (r < 0) {
		r = refuse(&ch, r, err, errlen, "after go, no confirmation (%s): its VMs are its "
			   "own now (docs/upgrade.md: a crash of the new process)", lost(r));
		log_error("%s", err);
		close(ch.sock);
		goto out;
	}
	p = started + 8;
	res->new_pid = (pid_t)strtol(p, &p, 10);
	res->old_pid = getpid();
	for (unsigned i = 0; i < n; i++) {
		unsigned long long t = strtoull(p, &p, 10);

		vms[i].pause_ns = t > stop[i] ? t - stop[i] : 0;
		log_info("upgrade: %s now served by pid %d (paused %.3f ms, %u connections)",
			 vms[i].cfg->name, (int)res->new_pid, (double)vms[i].pause_ns / 1e6,
			 vms[i].conns);
	}
	close(ch.sock); /* the new process is not waited for: it is the service now */
	r = 0;
	goto out;

fail:
	if (ch.sock >= 0)
		(void)send_text(ch.sock, "abort", -1);
	child_end(&ch);
	for (unsigned i = 0; i < stopped; i++)
		(void)dev_vhu_resume(vms[i].vhu);
	log_error("%s; every VM goes on here", err);
out:
	for (unsigned i = 0; w && i < stopped; i++)
		rec_writer_free(&w[i]);
	free(w);
	free(started);
	return r;
}

int upgrade_hand_over(int sock, pid_t pid, const char *path, struct upgrade_vm *vms,
		      unsigned n, struct upgrade_result *res, char *err, size_t errlen)
{
	struct child ch = { .path = path, .pid = pid, .sock = sock, .theirs = true };
	uint64_t *stop = calloc(n ? n : 1, sizeof(*stop));
	int r;

	if (!stop) {
		close(sock);
		snprintf(err, errlen, "upgrade: out of memory");
		return -ENOMEM;
	}
	log_info("upgrade: handing %u VM%s to %s (pid %d)", n, n == 1 ? "" : "s", path,
		 (int)pid);
	r = hand_over(&ch, vms, n, NULL, stop, res, err, errlen);
	free(stop);
	return r;
}

/* ---- the new process ---------------------------------------------------------------------- */

int upgrade_vm_rec_read(const uint8_t *buf, size_t len, const int *fds, size_t nfds,
			upgrade_restore_fn restore, void *arg, char *why, size_t whylen)
{
	struct rec_val v[ARRAY_SIZE(vm_fields)];
	struct uvsockd_vm_config cfg;
	struct rec_reader r, glue;
	struct rec_doc doc;
	uint32_t granted = 0;
	int e;

	why[0] = '\0';
	e = rec_open(&doc, buf, len, REC_KIND_VM, 1, upgrade_vm_rec_read_max, fds, nfds);
	if (e < 0) {
		snprintf(why, whylen, "%s (this binary reads VM records 1..%u)", rec_error(&doc),
			 upgrade_vm_rec_read_max);
		return e;
	}
	rec_root(&doc, &r, "VM");
	e = rec_scan(&r, vm_fields, ARRAY_SIZE(vm_fields), v);
	if (e == 0)
		e = read_config(&r, &v[0].it, &cfg, &granted);
	if (e == 0)
		e = rec_enter(&r, &v[1].it, "glue", &glue);
	if (e == 0)
		e = restore(arg, &cfg, granted, &glue, why, whylen);
	if (e == 0)
		e = rec_check_fds_claimed(&doc);
	if (e < 0 && !why[0])
		snprintf(why, whylen, "%s", rec_error(&doc)[0] ? rec_error(&doc) : strerror(-e));
	else if (e < 0 && rec_error(&doc)[0] && !strstr(why, rec_error(&doc)))
		snprintf(why + strlen(why), whylen - strlen(why), ": %s", rec_error(&doc));
	rec_doc_fini(&doc);
	return e;
}

/* One VM: the record received, checked whole and restored, or refused with why. */
static int take_vm(int fd, upgrade_restore_fn restore, void *arg, char *why, size_t whylen)
{
	const uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int *fds = NULL, memfd = -1, e;

	e = rec_recv(fd, UPGRADE_STEP_TIMEOUT_MS, &memfd, &fds, &nfds);
	if (e < 0) {
		snprintf(why, whylen, "receiving the record: %s", strerror(-e));
		return e;
	}
	e = rec_map_fd(memfd, &buf, &len);
	if (e < 0)
		snprintf(why, whylen, "cannot map the record: %s", strerror(-e));
	else
		e = upgrade_vm_rec_read(buf, len, fds, nfds, restore, arg, why, whylen);
	if (buf)
		rec_unmap(buf, len);
	/* The restored parts hold duplicates of what they kept. */
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	free(fds);
	close(memfd);
	return e;
}

int upgrade_takeover(int fd, upgrade_restore_fn restore, void *arg, struct uds_listener *ctl)
{
	char msg[MSG_MAX], why[400];
	unsigned long long dev = 0, ino = 0;
	unsigned n = 0;
	int r, cfd = -1;

	ctl->fd = -1;
	snprintf(msg, sizeof(msg), "hello %d %u %u", (int)getpid(), 1u, upgrade_vm_rec_read_max);
	r = send_text(fd, msg, -1);
	if (r == 0)
		r = recv_text(fd, msg, sizeof(msg), UPGRADE_STEP_TIMEOUT_MS, NULL);
	if (r == 0 && sscanf(msg, "vms %u", &n) != 1)
		r = -EBADMSG;
	if (r < 0) {
		log_error("takeover: no VM list from the old process: %s", strerror(-r));
		return r;
	}
	for (unsigned i = 0; i < n; i++) {
		why[0] = '\0';
		r = take_vm(fd, restore, arg, why, sizeof(why));
		if (r < 0) {
			log_error("takeover: VM %u of %u refused: %s", i + 1, n, why);
			snprintf(msg, sizeof(msg), "refused %s", why);
			(void)send_text(fd, msg, -1);
			return r;
		}
		r = send_text(fd, "ready", -1);
		if (r < 0)
			return r;
	}
	r = recv_text(fd, msg, sizeof(msg), UPGRADE_STEP_TIMEOUT_MS, &cfd);
	if (r == 0 && sscanf(msg, "go %llu %llu", &dev, &ino) != 2)
		r = -ECANCELED; /* "abort" */
	if (r < 0) {
		if (cfd >= 0)
			close(cfd);
		log_error("takeover: the old process %s", r == -ECANCELED ? "abandoned the upgrade" :
			  "went away before go");
		return r;
	}
	if (cfd >= 0)
		*ctl = (struct uds_listener){ .fd = cfd, .dev = (dev_t)dev, .ino = (ino_t)ino };
	return 0;
}

void upgrade_takeover_done(int fd, const uint64_t *serve_ns, unsigned n)
{
	size_t len = 64 + (size_t)n * 24, off;
	char *msg = malloc(len);

	if (msg) {
		off = (size_t)snprintf(msg, len, "started %d", (int)getpid());
		for (unsigned i = 0; i < n; i++)
			off += (size_t)snprintf(msg + off, len - off, " %llu",
						(unsigned long long)serve_ns[i]);
		(void)send_text(fd, msg, -1);
		free(msg);
	}
	close(fd);
}
