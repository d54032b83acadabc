/* SPDX-License-Identifier: MIT */
/*
 * The control socket server (see ctl.h; the commands are in ctl_cmds.c): a thread of its own
 * running a struct loop (util/loop.h) with a watch on the listening socket, one per client and
 * one timer for the nearest deadline (an idle client, the end of an accept pause, a capture's
 * duration or its periodic flush). A client is either reading a request or writing an answer,
 * never both: one request is answered at a time, in order, so a client that pipelines requests
 * gets the answers in order and a client that never reads cannot make us buffer more than one
 * answer. Nothing here ever touches a VM thread's data except through struct ops_ctl_ops and
 * the taps' own locks.
 */
#include "ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl_internal.h"
#include "util/log.h"
#include "util/loop.h"
#include "util/macros.h"
#include "util/time.h"

#define CTL_DEFAULT_CLIENTS 8u
#define CTL_DEFAULT_RESPONSE (16u << 20)
#define CTL_DEFAULT_IDLE_MS 30000u
#define CTL_FLUSH_MS 1000u
#define CTL_ACCEPT_PAUSE_MS 100u
#define CTL_BACKLOG 16

/* ---- clients --------------------------------------------------------------------------- */

/* The VM set's lock around what uses VM indexes (ops lock/unlock, if given). */
static void vms_lock(struct ops_ctl *c)
{
	if (c->ops->lock)
		c->ops->lock(c->opaque);
}

static void vms_unlock(struct ops_ctl *c)
{
	if (c->ops->unlock)
		c->ops->unlock(c->opaque);
}

static void capture_end_locked(struct ops_ctl *c, const char *reason)
{
	if (!c->cap.active)
		return;
	vms_lock(c);
	ctl_capture_end(c, reason);
	vms_unlock(c);
}

static void client_close(struct ops_ctl *c, struct ctl_client *cl)
{
	unsigned i = 0;

	while (c->clients[i] != cl)
		i++;
	if (c->cap.active && c->cap.owner == cl)
		capture_end_locked(c, "client closed");
	loop_watch_del(cl->watch);
	close(cl->fd);
	if (cl->pass_fd >= 0)
		close(cl->pass_fd);
	free(cl->out);
	free(cl);
	c->clients[i] = c->clients[--c->n_clients];
}

/* Writes a short error line to a client we will not serve, best effort, and closes it. */
static void refuse(int fd, const char *msg)
{
	char line[256];
	int n = snprintf(line, sizeof(line),
			 "{\"proto\":%d,\"ok\":false,\"error\":\"%s\",\"errno\":\"EBUSY\"}\n",
			 OPS_CTL_PROTO, msg);

	(void)!send(fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	close(fd);
}

static void client_cb(struct loop *l, int fd, uint32_t events, void *opaque);

static void do_accept(struct ops_ctl *c)
{
	for (;;) {
		int fd = accept4(c->listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct ctl_client *cl;

		if (fd < 0) {
			/*
			 * Out of descriptors: the listener stays readable; stop watching it
			 * until timer_cb resumes it rather than spin (the pending connection
			 * waits in the backlog).
			 */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM) {
				c->accept_pause_until = mono_ms() + CTL_ACCEPT_PAUSE_MS;
				(void)loop_watch_mod(c->listen_watch, 0);
			}
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
		    (!c->any_uid && cred.uid != 0 && cred.uid != geteuid())) {
			refuse(fd, "permission denied");
			continue;
		}
		if (c->n_clients == c->max_clients) {
			refuse(fd, "too many control clients");
			continue;
		}
		cl = calloc(1, sizeof(*cl));
		if (!cl) {
			close(fd);
			continue;
		}
		cl->ctl = c;
		cl->fd = fd;
		cl->uid = cred.uid;
		cl->pass_fd = -1;
		cl->deadline_ms = mono_ms() + c->idle_ms;
		if (loop_watch_add(c->loop, fd, EPOLLIN, client_cb, cl, &cl->watch) < 0) {
			close(fd);
			free(cl);
			continue;
		}
		c->clients[c->n_clients++] = cl;
	}
}

/* Reads what is there; returns false when the client must be closed. */
static bool client_read(struct ops_ctl *c, struct ctl_client *cl)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { cl->in + cl->in_len, sizeof(cl->in) - cl->in_len };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
		.msg_controllen = sizeof(cm.buf),
	};
	ssize_t n = recvmsg(cl->fd, &msg, MSG_CMSG_CLOEXEC);

	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (cl->pass_fd < 0)
				cl->pass_fd = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return false;
	cl->in_len += (size_t)n;
	cl->deadline_ms = mono_ms() + c->idle_ms;
	return true;
}

/*
 * Queues the finished answer in w as cl's output, newline-terminated (the writer keeps one spare
 * byte past its maximum for the NUL: room for the newline). cl takes over w's buffer.
 */
static void client_answer(struct ctl_client *cl, struct ops_jw *w)
{
	w->buf[w->len++] = '\n';
	cl->out = w->buf;
	cl->out_len = w->len;
	cl->out_off = 0;
}

/* Answers a request we cannot even parse with an error (best effort) and closes after it. */
static void client_reject(struct ctl_client *cl, int e, const char *msg)
{
	struct ops_jw w;

	if (ops_jw_init(&w, 512) == 0) {
		ctl_error_answer(&w, e, "%s", msg);
		client_answer(cl, &w);
	}
	cl->closing = true;
}

/* Answers one request line (NUL-terminated, no newline) into cl->out. */
static void client_request(struct ops_ctl *c, struct ctl_client *cl, char *line)
{
	struct ops_jw w;

	if (ops_jw_init(&w, c->max_response) < 0) {
		cl->closing = true;
		return;
	}
	vms_lock(c);
	ctl_cmd_run(c, cl, line, &w);
	vms_unlock(c);
	client_answer(cl, &w);
	/* An unused passed descriptor is not kept for a later request. */
	if (cl->pass_fd >= 0) {
		close(cl->pass_fd);
		cl->pass_fd = -1;
	}
}

/* Answers the next complete request in the input, if any and if no answer is pending. */
static void client_process(struct ops_ctl *c, struct ctl_client *cl)
{
	char line[OPS_CTL_MAX_REQUEST];
	char *nl;
	size_t n;

	if (cl->out || cl->closing)
		return;
	nl = memchr(cl->in, '\n', cl->in_len);
	if (!nl) {
		if (cl->in_len == sizeof(cl->in)) {
			char msg[64];

			snprintf(msg, sizeof(msg), "request longer than %u bytes",
				 OPS_CTL_MAX_REQUEST);
			client_reject(cl, E2BIG, msg);
		}
		return;
	}
	n = (size_t)(nl - cl->in);
	memcpy(line, cl->in, n);
	line[n] = '\0';
	cl->in_len -= n + 1;
	memmove(cl->in, nl + 1, cl->in_len);
	if (n && line[n - 1] == '\r')
		line[--n] = '\0';
	if (memchr(line, '\0', n)) {
		client_reject(cl, EINVAL, "NUL byte in request");
		return;
	}
	client_request(c, cl, line);
	cl->deadline_ms = mono_ms() + c->idle_ms;
}

/* Writes what it can; returns false when the client must be closed. */
static bool client_write(struct ops_ctl *c, struct ctl_client *cl)
{
	while (cl->out_off < cl->out_len) {
		ssize_t n = send(cl->fd, cl->out + cl->out_off, cl->out_len - cl->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return true;
		if (n <= 0)
			return false;
		cl->out_off += (size_t)n;
		cl->deadline_ms = mono_ms() + c->idle_ms;
	}
	free(cl->out);
	cl->out = NULL;
	if (cl->closing)
		return false;
	client_process(c, cl); /* a pipelined request may be waiting */
	return true;
}

/* The client that owns a running capture may stay idle (it waits for the capture to end). */
static bool exempt_idle(struct ops_ctl *c, struct ctl_client *cl)
{
	return c->cap.active && c->cap.owner == cl && !cl->out;
}


/* ---- the loop: callbacks and the deadline timer ------------------------------------------ */

/* Arms the timer at the nearest deadline (every callback ends with this). */
static void ctl_schedule(struct ops_ctl *c)
{
	uint64_t next = UINT64_MAX;

	for (unsigned i = 0; i < c->n_clients; i++)
		if (!exempt_idle(c, c->clients[i]))
			next = MIN(next, c->clients[i]->deadline_ms);
	if (c->accept_pause_until)
		next = MIN(next, c->accept_pause_until);
	if (c->cap.active) {
		next = MIN(next, c->last_flush_ms + CTL_FLUSH_MS);
		if (c->cap.end_ms)
			next = MIN(next, c->cap.end_ms);
	}
	if (next == UINT64_MAX)
		loop_timer_disarm(c->timer);
	else
		loop_timer_arm(c->timer, next * NS_PER_MS);
}

static void client_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct ctl_client *cl = opaque;
	struct ops_ctl *c = cl->ctl;
	bool keep = true;

	(void)l;
	(void)fd;
	if (events & EPOLLOUT) {
		keep = client_write(c, cl);
	} else if (events & EPOLLIN) {
		keep = client_read(c, cl);
		if (keep) {
			client_process(c, cl);
			if (cl->out)
				keep = client_write(c, cl);
		}
	} else if (events & (EPOLLHUP | EPOLLERR)) {
		keep = false;
	}
	if (keep)
		keep = loop_watch_mod(cl->watch, cl->out ? EPOLLOUT : EPOLLIN) == 0;
	/* An upgrade gave the VMs away: once its answer is out (or its client gone), the old
	 * process ends, without its teardown: every socket is the new process's now, and
	 * nothing may be shut down or removed (docs/upgrade.md). */
	if (c->exit_after >= 0 && (!keep || !cl->out))
		_exit(c->exit_after);
	if (!keep)
		client_close(c, cl);
	ctl_schedule(c);
}

static void listen_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct ops_ctl *c = opaque;

	(void)l;
	(void)fd;
	(void)events;
	do_accept(c);
	ctl_schedule(c);
}

/* Closes idle clients, resumes accepting, ends or flushes the capture: whatever is due. */
static void timer_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct ops_ctl *c = opaque;
	uint64_t now = mono_ms();

	(void)l;
	(void)t;
	/* From the end: client_close() moves the last client into the freed slot. */
	for (unsigned i = c->n_clients; i-- > 0;) {
		struct ctl_client *cl = c->clients[i];

		if (now >= cl->deadline_ms && !exempt_idle(c, cl))
			client_close(c, cl);
	}
	if (c->accept_pause_until && now >= c->accept_pause_until) {
		c->accept_pause_until = 0;
		if (loop_watch_mod(c->listen_watch, EPOLLIN) < 0)
			c->accept_pause_until = now + CTL_ACCEPT_PAUSE_MS;
	}
	if (c->cap.active && c->cap.end_ms && now >= c->cap.end_ms)
		capture_end_locked(c, "duration");
	if (c->cap.active && now - c->last_flush_ms >= CTL_FLUSH_MS) {
		ops_pcap_flush(c->cap.pcap);
		c->last_flush_ms = now;
	}
	ctl_schedule(c);
}

static void *ctl_main(void *arg)
{
	struct ops_ctl *c = arg;
	int r;

	pthread_setname_np(pthread_self(), "uvsock-ctl");
	r = loop_run(c->loop);
	if (r < 0)
		log_error("control socket: epoll_wait: %s; control thread ends", strerror(-r));
	return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* Frees c and all it holds, half-built or not. Context: no control thread running. */
static void ctl_free(struct ops_ctl *c)
{
	capture_end_locked(c, "shutdown");
	while (c->n_clients)
		client_close(c, c->clients[c->n_clients - 1]);
	loop_timer_free(c->timer);
	loop_watch_del(c->listen_watch);
	if (c->listener.fd >= 0) {
		uds_unlink_owned(c->path, &c->listener); /* before the close: see uds.h */
		close(c->listener.fd);
	}
	loop_free(c->loop);
	free(c->clients);
	free(c);
}

int ops_ctl_start(const struct ops_ctl_config *cfg, struct ops_ctl **ret)
{
	struct ops_ctl *c;
	int r;

	if (!cfg->path || !cfg->ops || !cfg->ops->vm_count || !cfg->ops->vm_cid ||
	    !cfg->ops->vm_stats)
		return -EINVAL;
	if (strlen(cfg->path) >= sizeof(c->path))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->listener.fd = -1;
	c->exit_after = -1;
	memcpy(c->path, cfg->path, strlen(cfg->path) + 1);
	snprintf(c->server, sizeof(c->server), "%s", cfg->server ? cfg->server : "uvsock");
	c->ops = cfg->ops;
	c->opaque = cfg->opaque;
	c->max_clients = cfg->max_clients ? cfg->max_clients : CTL_DEFAULT_CLIENTS;
	c->max_response = cfg->max_response ? cfg->max_response : CTL_DEFAULT_RESPONSE;
	if (c->max_response < 2 * CTL_TAIL_ROOM + CTL_CONN_ROOM)
		c->max_response = 2 * CTL_TAIL_ROOM + CTL_CONN_ROOM;
	c->idle_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms : CTL_DEFAULT_IDLE_MS;
	c->any_uid = cfg->any_uid;
	c->last_flush_ms = mono_ms();
	c->clients = calloc(c->max_clients, sizeof(*c->clients));
	if (!c->clients) {
		r = -ENOMEM;
		goto fail;
	}
	r = loop_new(&c->loop);
	if (r < 0)
		goto fail;
	if (cfg->listener) {
		c->listener = *cfg->listener;
		r = 0;
	} else {
		r = uds_listen(c->path, SOCK_STREAM, CTL_BACKLOG, 0600, &c->listener);
	}
	if (r < 0)
		goto fail;
	r = loop_watch_add(c->loop, c->listener.fd, EPOLLIN, listen_cb, c, &c->listen_watch);
	if (r < 0)
		goto fail;
	r = loop_timer_new(c->loop, timer_cb, c, &c->timer);
	if (r < 0)
		goto fail;
	/* The loop is handed to the control thread here; until then this thread set it up. */
	r = -pthread_create(&c->th, NULL, ctl_main, c);
	if (r < 0)
		goto fail;
	*ret = c;
	return 0;

fail:
	ctl_free(c);
	return r;
}

const struct uds_listener *ops_ctl_listener(const struct ops_ctl *c)
{
	return c && c->listener.fd >= 0 ? &c->listener : NULL;
}

void ops_ctl_stop(struct ops_ctl *c)
{
	if (!c)
		return;
	loop_stop(c->loop);
	pthread_join(c->th, NULL);
	ctl_free(c);
}
