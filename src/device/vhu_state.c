/* SPDX-License-Identifier: MIT */
/*
 * The device state transfer of the vhost-user glue (see vhu_state.h). The front-end's pipe is
 * read and written without blocking, from the device's loop (a watch on the pipe), so a
 * front-end that reads slowly or never never holds the device thread. Two bounded waits remain:
 * CHECK_DEVICE_STATE, at most VHU_STATE_CHECK_WAIT_MS, for the rest of a state whose writer has
 * already closed its end (vhost-user.rst: the front-end checks after the transfer), and the
 * loading side's rendezvous, at most VHU_STATE_RV_RECV_MS, for the record and its fds.
 *
 * The connections outlive the stop only where the front-end handed the event queue over (the
 * front-ends that save a vsock device's state do; QEMU does not, and for it a stop still ends
 * them: docs/upgrade.md, "The stop"): the session is then held, frozen, for the save. The host
 * sockets go to the loading back-end at a rendezvous on an abstract Unix socket whose name
 * only the state carries, for a peer of our own user (SO_PEERCRED), with rec_send/rec_recv.
 */
#include "device/vhu_state.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/vhu.h"
#include "device/vsock_dev.h"
#include "ops/vmlog.h"
#include "util/log.h"
#include "util/loop.h"
#include "util/macros.h"
#include "util/rec.h"
#include "util/time.h"
#include "uvsock/device.h"
#include "vsock/engine.h"

/* Tags of the state record (REC_KIND_DEVICE_STATE, version 1). */
enum {
	S_CID = 1,   /* u32: the guest's CID (the loading device's must be the same) */
	S_FEATURES,  /* u64: the acked device features (uvsock_dev_features() bits) */
	S_FLAGS,     /* u32: S_F_* */
	S_CONNS,     /* list: vsock_engine_save_conns items, with S_F_SESSION only */
	S_TOKEN,     /* bytes (version 2): the rendezvous that hands over the device record */
};
#define S_F_SESSION 1u /* a session ran: the guest may hold connections, which end */
#define S_F_ALL 1u
/* More connections than a 1 MiB record can name are refused anyway; this bounds the array. */
#define S_CONNS_MAX 65536u
/* The rendezvous: an abstract Unix socket "uvsock-devstate-<token>", the token 16 random bytes
 * in hex. */
#define RV_TOKEN_LEN 32u
#define RV_PREFIX "uvsock-devstate-"

enum xfer { X_NONE, X_SAVE, X_LOAD };

struct vhu_state {
	struct vsock_dev *d;

	/* The state taken when TX last stopped (a finished record), or NULL. */
	uint8_t *snap;
	size_t snap_len;

	/* The transfer: its direction, the front-end's fd and its watch, the bytes. */
	enum xfer dir;
	int fd;
	struct loop_watch *w;
	uint8_t *buf;
	size_t len, off;
	int result; /* -EINPROGRESS while it runs, then 0 or -errno */
	char why[192];

	/* A loaded and checked state, applied when TX starts. */
	bool loaded, session;
	bool moved; /* the device record came by the rendezvous: the connections go on */
	uint64_t features;
	struct vsock_conn_addr *conns;
	size_t nconns;

	/* The front-end handed the event queue over in this VMM session (a save holds the
	 * session only then: see vhu_state_tx_stopping). */
	bool evq;

	/* The saving side's rendezvous: the listener, its watch and deadline, the record and
	 * its fds (borrowed from the held device) that go to the first peer of our uid. */
	int rv_fd;
	struct loop_watch *rv_w;
	struct loop_timer *rv_t;
	char token[RV_TOKEN_LEN + 1];
	int rv_memfd;
	int *rv_fds;
	size_t rv_nfds;
};

struct vhu_state *vhu_state_new(struct vsock_dev *d)
{
	struct vhu_state *s = calloc(1, sizeof(*s));

	if (s) {
		s->d = d;
		s->fd = s->rv_fd = s->rv_memfd = -1;
	}
	return s;
}

static void xfer_end(struct vhu_state *s)
{
	if (s->w)
		loop_watch_del(s->w);
	s->w = NULL;
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	free(s->buf);
	s->buf = NULL;
	s->len = s->off = 0;
}

static void loaded_drop(struct vhu_state *s)
{
	free(s->conns);
	s->conns = NULL;
	s->nconns = 0;
	s->loaded = s->session = s->moved = false;
}

static void rv_close(struct vhu_state *s)
{
	if (s->rv_w)
		loop_watch_del(s->rv_w);
	s->rv_w = NULL;
	if (s->rv_t)
		loop_timer_free(s->rv_t);
	s->rv_t = NULL;
	if (s->rv_fd >= 0)
		close(s->rv_fd);
	s->rv_fd = -1;
	if (s->rv_memfd >= 0)
		close(s->rv_memfd);
	s->rv_memfd = -1;
	free(s->rv_fds);
	s->rv_fds = NULL;
	s->rv_nfds = 0;
}

static void state_clear(struct vhu_state *s)
{
	xfer_end(s);
	rv_close(s);
	s->dir = X_NONE;
	loaded_drop(s);
	free(s->snap);
	s->snap = NULL;
	s->snap_len = 0;
	s->evq = false;
}

void vhu_state_reset(struct vhu_state *s)
{
	if (!s)
		return;
	state_clear(s);
	/* A held session ends with the VMM: the device thaws for its reset. */
	dev_session_hold(s->d, false);
}

void vhu_state_free(struct vhu_state *s)
{
	if (s)
		state_clear(s);
	free(s);
}

/* Records why the transfer failed (logged at CHECK_DEVICE_STATE) and ends it. */
__attribute__((format(printf, 3, 4))) static void xfer_fail(struct vhu_state *s, int err,
							    const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->why, sizeof(s->why), fmt, ap);
	va_end(ap);
	s->result = err;
	xfer_end(s);
}

/* ---- the state -------------------------------------------------------------------------- */

/* The state record of d now, with features, into a malloc'd buffer. Returns 0 or -errno. */
static int state_build(struct vhu_state *s, uint64_t features, const char *token, uint8_t **ret,
		       size_t *ret_len)
{
	struct rec_writer w;
	const uint8_t *buf;
	size_t len = 0;
	int r, session;

	/* Version 1 without a rendezvous: a reader that knows only 1 takes it. */
	rec_writer_init(&w, REC_KIND_DEVICE_STATE, token ? VHU_STATE_VERSION : 1);
	rec_put_u32(&w, S_CID, vsock_dev_guest_cid(s->d));
	rec_put_u64(&w, S_FEATURES, features & uvsock_dev_features());
	/* The flags go before the list, whose presence they announce; written once we know. */
	rec_begin(&w, S_CONNS);
	session = dev_save_conns(s->d, &w);
	rec_end(&w);
	rec_put_u32(&w, S_FLAGS, session > 0 ? S_F_SESSION : 0);
	if (token)
		rec_put_bytes(&w, S_TOKEN, token, strlen(token));
	r = session < 0 ? session : rec_writer_finish(&w, &buf, &len);
	if (r == 0) {
		*ret = malloc(len);
		if (*ret)
			memcpy(*ret, buf, len);
		else
			r = -ENOMEM;
		*ret_len = len;
	}
	rec_writer_free(&w);
	return r;
}

static const struct rec_field state_fields[] = {
	{ S_CID, REC_U32, true, "cid" },
	{ S_FEATURES, REC_U64, true, "features" },
	{ S_FLAGS, REC_U32, true, "flags" },
	{ S_CONNS, REC_LIST, true, "connections" },
	{ S_TOKEN, REC_BYTES, false, "rendezvous" },
};

/* ---- the rendezvous: the device record and its fds, same host only ------------------------- */

static bool token_valid(const uint8_t *p, size_t n)
{
	if (n != RV_TOKEN_LEN)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
			return false;
	return true;
}

static socklen_t rv_addr(const char *token, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Abstract (sun_path[0] == 0): no file, gone with its socket, this network namespace. */
	memcpy(sa->sun_path + 1, RV_PREFIX, strlen(RV_PREFIX));
	memcpy(sa->sun_path + 1 + strlen(RV_PREFIX), token, RV_TOKEN_LEN);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(RV_PREFIX) +
			   RV_TOKEN_LEN);
}

/* The peer of a connected Unix socket runs as our user (only it may take our sockets). */
static bool peer_is_us(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.uid == geteuid();
}

static void rv_timeout_cb(struct loop *l, struct loop_timer *t, void *opaque)
{
	struct vhu_state *s = opaque;

	(void)l;
	(void)t;
	log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d), "%s: nobody took the saved device "
		   "state within %d s; the rendezvous closes (the connections stay here, held)",
		   vsock_dev_name(s->d), VHU_STATE_RV_SECONDS);
	rv_close(s);
}

/* A back-end connected to the rendezvous: the first of our uid gets the record and the fds. */
static void rv_accept_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vhu_state *s = opaque;
	int c, fl, r;

	(void)l;
	(void)events;
	c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return;
	if (!peer_is_us(c)) {
		log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: a process of another user "
			   "connected to the state rendezvous; refused", vsock_dev_name(s->d));
		close(c);
		return;
	}
	/* The record is small beside the socket buffer and the fds go in batches: a short
	 * blocking send, bounded by the peer (which waits in rec_recv with a deadline). */
	fl = fcntl(c, F_GETFL);
	if (fl >= 0)
		(void)fcntl(c, F_SETFL, fl & ~O_NONBLOCK);
	(void)setsockopt(c, SOL_SOCKET, SO_SNDTIMEO,
			 &(struct timeval){ .tv_sec = VHU_STATE_RV_SEND_MS / 1000,
					    .tv_usec = (VHU_STATE_RV_SEND_MS % 1000) * 1000 },
			 sizeof(struct timeval));
	r = rec_send(c, s->rv_memfd, s->rv_fds, s->rv_nfds);
	close(c);
	if (r < 0) {
		log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: cannot hand the device "
			   "state over: %s", vsock_dev_name(s->d), strerror(-r));
		return;
	}
	log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d), "%s: device state handed over (%zu "
		   "fds); its connections are the other back-end's now", vsock_dev_name(s->d),
		   s->rv_nfds);
	rv_close(s);
	/* Never touch those sockets again: closed here, unread and unwritten. */
	dev_session_handed_over(s->d);
}

/*
 * The saving side: the held device's record into a sealed memfd, its fds borrowed (the device
 * keeps them, frozen, until the hand-over or until it lets go: both close the rendezvous first),
 * and a listener at a fresh token. Returns 0 with s->token set, or -errno (the state is then
 * saved without a rendezvous).
 */
static int rv_open(struct vhu_state *s)
{
	struct rec_writer w;
	struct sockaddr_un sa;
	const uint8_t *buf;
	uint8_t rnd[RV_TOKEN_LEN / 2];
	size_t len;
	int r;

	rv_close(s);
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EIO;
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(s->token + 2 * i, 3, "%02x", rnd[i]);
	rec_writer_init(&w, REC_KIND_DEVICE, VSOCK_DEV_SAVE_VERSION);
	r = dev_save_moved(s->d, &w);
	if (r == 0)
		r = rec_writer_finish(&w, &buf, &len);
	if (r == 0)
		r = rec_memfd(buf, len, "uvsock-device-state", &s->rv_memfd);
	if (r == 0 && w.nfds) {
		s->rv_fds = malloc(w.nfds * sizeof(int));
		if (s->rv_fds)
			memcpy(s->rv_fds, w.fds, w.nfds * sizeof(int));
		else
			r = -ENOMEM;
	}
	s->rv_nfds = w.nfds;
	rec_writer_free(&w);
	if (r == 0) {
		s->rv_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (s->rv_fd < 0 || bind(s->rv_fd, (struct sockaddr *)&sa, rv_addr(s->token, &sa)) < 0 ||
		    listen(s->rv_fd, 4) < 0)
			r = -errno;
	}
	if (r == 0)
		r = loop_watch_add(dev_loop(s->d), s->rv_fd, EPOLLIN, rv_accept_cb, s, &s->rv_w);
	if (r == 0)
		r = loop_timer_new(dev_loop(s->d), rv_timeout_cb, s, &s->rv_t);
	if (r < 0) {
		rv_close(s);
		return r;
	}
	loop_timer_arm(s->rv_t, loop_now_ns() + (uint64_t)VHU_STATE_RV_SECONDS * 1000000000ull);
	return 0;
}

/*
 * The loading side: takes the device record and its fds from the saving back-end's rendezvous
 * and restores it into this device (dev_restore_moved). Returns 0, or -errno with the reason
 * logged: the device then ends the connections as a state without a rendezvous says.
 */
static int rv_fetch(struct vhu_state *s, const char *token)
{
	struct sockaddr_un sa;
	const uint8_t *buf = NULL;
	struct rec_doc doc;
	int c, r, memfd = -1, *fds = NULL;
	size_t nfds = 0, len = 0;
	const char *why;

	c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c < 0)
		return -errno;
	if (connect(c, (struct sockaddr *)&sa, rv_addr(token, &sa)) < 0) {
		r = -errno;
		why = "cannot reach it (another host, or it closed)";
		goto out;
	}
	if (!peer_is_us(c)) {
		r = -EPERM;
		why = "its process runs as another user";
		goto out;
	}
	r = rec_recv(c, VHU_STATE_RV_RECV_MS, &memfd, &fds, &nfds);
	why = "receiving the record";
	if (r == 0) {
		r = rec_map_fd(memfd, &buf, &len);
		why = "mapping the record";
	}
	if (r == 0) {
		r = rec_open(&doc, buf, len, REC_KIND_DEVICE, 1, VSOCK_DEV_SAVE_VERSION, fds, nfds);
		if (r == 0) {
			r = dev_restore_moved(s->d, &doc);
			rec_doc_fini(&doc);
		}
		why = r < 0 ? rec_error(&doc) : "";
		if (r < 0)
			log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: the moved device "
				   "record is refused: %s; the guest's connections end",
				   vsock_dev_name(s->d), why);
		rec_unmap(buf, len);
		why = NULL;
	}
out:
	if (r < 0 && why)
		log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: the state's rendezvous: "
			   "%s: %s; the guest's connections end", vsock_dev_name(s->d), why,
			   strerror(-r));
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	free(fds);
	if (memfd >= 0)
		close(memfd);
	close(c);
	if (r == 0)
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d), "%s: device record taken over "
			   "(%zu fds): the guest's connections go on here", vsock_dev_name(s->d),
			   nfds);
	return r;
}

/* The device features this device could have acked: the loaded state may hold no others. */
static uint64_t features_offerable(struct vhu_state *s)
{
	uint64_t f = uvsock_dev_features();

	if (!dev_dgram_offered(s->d))
		f &= ~(1ull << 3); /* VIRTIO_VSOCK_F_DGRAM */
	return f;
}

/* Checks the loaded bytes (s->buf) and keeps what they say. Returns 0 or -errno (s->why). */
static int state_parse(struct vhu_state *s)
{
	struct rec_val v[ARRAY_SIZE(state_fields)];
	struct vsock_conn_addr *conns = NULL;
	struct rec_reader r, sub;
	struct rec_doc doc;
	size_t n = 0;
	int k;

	k = rec_open(&doc, s->buf, s->len, REC_KIND_DEVICE_STATE, 1, VHU_STATE_VERSION, NULL, 0);
	if (k < 0) {
		snprintf(s->why, sizeof(s->why), "%s", rec_error(&doc));
		return k;
	}
	rec_root(&doc, &r, "device state");
	k = rec_scan(&r, state_fields, ARRAY_SIZE(state_fields), v);
	if (k == 0 && v[0].u != vsock_dev_guest_cid(s->d))
		k = rec_fail(&doc, -EINVAL, "the state is guest CID %llu's, this device serves %u",
			     (unsigned long long)v[0].u, vsock_dev_guest_cid(s->d));
	if (k == 0 && (v[1].u & ~features_offerable(s)))
		k = rec_fail(&doc, -EINVAL, "features %#llx that this device does not offer",
			     (unsigned long long)(v[1].u & ~features_offerable(s)));
	if (k == 0 && (v[2].u & ~(uint64_t)S_F_ALL))
		k = rec_fail(&doc, -EBADMSG, "flags %#llx", (unsigned long long)v[2].u);
	if (k == 0)
		k = rec_enter(&r, &v[3].it, "connections", &sub);
	if (k == 0)
		k = vsock_engine_read_conns(&sub, S_CONNS_MAX, &conns, &n);
	if (k == 0 && n && !(v[2].u & S_F_SESSION))
		k = rec_fail(&doc, -EBADMSG, "%zu connections without a session", n);
	if (k == 0 && v[4].present && (doc.version < 2 || !(v[2].u & S_F_SESSION) ||
				       !token_valid(v[4].it.val, v[4].it.len)))
		k = rec_fail(&doc, -EBADMSG, "a rendezvous %s",
			     doc.version < 2 ? "in a version 1 state" : "malformed or without a session");
	if (k < 0) {
		snprintf(s->why, sizeof(s->why), "%s", rec_error(&doc));
		rec_doc_fini(&doc);
		free(conns);
		return k;
	}
	loaded_drop(s);
	s->loaded = true;
	s->session = v[2].u & S_F_SESSION;
	s->features = v[1].u;
	s->conns = conns;
	s->nconns = n;
	if (v[4].present) {
		char token[RV_TOKEN_LEN + 1];

		memcpy(token, v[4].it.val, RV_TOKEN_LEN);
		token[RV_TOKEN_LEN] = '\0';
		s->moved = rv_fetch(s, token) == 0;
	}
	rec_doc_fini(&doc);
	return 0;
}

/* ---- the transfer ----------------------------------------------------------------------- */

/*
 * write() without SIGPIPE: a front-end that closed its end of the pipe makes the write fail with
 * EPIPE; the signal it also raises is blocked for this thread and taken back (uvsockd ignores it,
 * a VMM that embeds the device may not).
 */
static ssize_t write_nosig(int fd, const void *p, size_t n)
{
	sigset_t pipe_set, old, pending;
	bool was_pending;
	ssize_t k;
	int e;

	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	sigpending(&pending);
	was_pending = sigismember(&pending, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	k = write(fd, p, n);
	e = errno;
	if (k < 0 && e == EPIPE && !was_pending) {
		struct timespec zero = { 0, 0 };

		(void)sigtimedwait(&pipe_set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = e;
	return k;
}

static void xfer_cb(struct loop *l, int fd, uint32_t events, void *opaque);

/* Writes what the pipe takes; at the end closes it (the front-end reads end of file). */
static void save_pump(struct vhu_state *s)
{
	while (s->off < s->len) {
		ssize_t k = write_nosig(s->fd, s->buf + s->off, s->len - s->off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN) {
			int r = s->w ? 0 : loop_watch_add(dev_loop(s->d), s->fd, EPOLLOUT, xfer_cb,
							  s, &s->w);

			if (r < 0)
				xfer_fail(s, r, "cannot watch the state pipe: %s", strerror(-r));
			return;
		}
		if (k <= 0) {
			xfer_fail(s, k < 0 ? -errno : -EIO, "writing the state: %s",
				  k < 0 ? strerror(errno) : "nothing written");
			return;
		}
		s->off += (size_t)k;
	}
	log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d),
		   "%s: device state saved (%zu bytes); the guest's connections end where it is "
		   "loaded (host connections and connections to sibling VMs do not move)",
		   vsock_dev_name(s->d), s->len);
	s->result = 0;
	xfer_end(s);
}

/* Reads what the pipe has; at end of file checks the state. */
static void load_pump(struct vhu_state *s)
{
	for (;;) {
		size_t room = VHU_STATE_MAX_BYTES + 1 - s->len;
		ssize_t k = read(s->fd, s->buf + s->len, room);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		if (k < 0) {
			xfer_fail(s, -errno, "reading the state: %s", strerror(errno));
			return;
		}
		if (k == 0)
			break;
		s->len += (size_t)k;
		if (s->len > VHU_STATE_MAX_BYTES) {
			xfer_fail(s, -EFBIG, "the state is over %u bytes", VHU_STATE_MAX_BYTES);
			return;
		}
	}
	s->result = state_parse(s);
	if (s->result == 0)
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d),
			   "%s: device state loaded (%zu bytes, %zu guest connections to end)",
			   vsock_dev_name(s->d), s->len, s->nconns);
	xfer_end(s);
}

static void xfer_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vhu_state *s = opaque;

	(void)l;
	(void)fd;
	if (s->dir == X_SAVE) {
		if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLOUT))
			xfer_fail(s, -EPIPE, "the front-end closed the state pipe before reading it all");
		else
			save_pump(s);
	} else {
		load_pump(s);
	}
}

/* Takes fd for a new transfer in direction dir (one still running ends). */
static int xfer_begin(struct vhu_state *s, int fd, enum xfer dir)
{
	int fl;

	xfer_end(s);
	s->dir = dir;
	s->fd = fd;
	s->result = -EINPROGRESS;
	s->why[0] = '\0';
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		xfer_fail(s, -errno, "state fd: %s", strerror(errno));
		return s->result;
	}
	return 0;
}

int vhu_state_save(struct vhu_state *s, int fd, uint64_t features)
{
	int r = xfer_begin(s, fd, X_SAVE);

	if (r < 0)
		return r;
	if (dev_session_held(s->d)) {
		/* The connections are here, frozen: they go by the rendezvous if it opens, and
		 * the state names them for the case that it cannot be reached. */
		const char *token = NULL;

		r = rv_open(s);
		if (r == 0)
			token = s->token;
		else
			log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: the state is saved "
				   "without its connections (they end where it is loaded): %s",
				   vsock_dev_name(s->d), r == -EOPNOTSUPP ? "the device is linked "
				   "to siblings, whose record is not built" : strerror(-r));
		r = state_build(s, features, token, &s->buf, &s->len);
		if (r < 0) {
			rv_close(s);
			xfer_fail(s, r, "cannot build the state: %s", strerror(-r));
			return r;
		}
	} else if (s->snap) {
		/* A copy: a front-end may save again (a retried migration). */
		s->buf = malloc(s->snap_len);
		if (!s->buf) {
			xfer_fail(s, -ENOMEM, "out of memory");
			return -ENOMEM;
		}
		memcpy(s->buf, s->snap, s->snap_len);
		s->len = s->snap_len;
	} else {
		r = state_build(s, features, NULL, &s->buf, &s->len);
		if (r < 0) {
			xfer_fail(s, r, "cannot build the state: %s", strerror(-r));
			return r;
		}
	}
	save_pump(s);
	return s->result == -EINPROGRESS || s->result == 0 ? 0 : s->result;
}

int vhu_state_load(struct vhu_state *s, int fd)
{
	int r;

	/* Whatever this load gives, a state loaded before is not the one to apply any more. */
	loaded_drop(s);
	r = xfer_begin(s, fd, X_LOAD);

	if (r < 0)
		return r;
	s->buf = malloc(VHU_STATE_MAX_BYTES + 1);
	if (!s->buf) {
		xfer_fail(s, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	r = loop_watch_add(dev_loop(s->d), fd, EPOLLIN, xfer_cb, s, &s->w);
	if (r < 0) {
		xfer_fail(s, r, "cannot watch the state pipe: %s", strerror(-r));
		return r;
	}
	load_pump(s);
	return 0;
}

int vhu_state_check(struct vhu_state *s, uint64_t acked)
{
	uint64_t deadline = mono_ms() + VHU_STATE_CHECK_WAIT_MS;

	/* The front-end closed its end before asking: what is left is in the pipe already. */
	while (s->dir == X_LOAD && s->result == -EINPROGRESS) {
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int64_t left = (int64_t)(deadline - mono_ms());

		if (left <= 0) {
			xfer_fail(s, -ETIMEDOUT, "no end of the state after %d ms (the front-end "
				  "still holds the pipe open)", VHU_STATE_CHECK_WAIT_MS);
			break;
		}
		if (poll(&p, 1, (int)left) > 0)
			load_pump(s);
	}
	if (s->dir == X_NONE)
		snprintf(s->why, sizeof(s->why), "no state was transferred"), s->result = -ENOENT;
	else if (s->result == -EINPROGRESS)
		snprintf(s->why, sizeof(s->why), "the front-end has not read the whole state yet");
	else if (s->dir == X_LOAD && s->result == 0 && acked &&
		 (acked & uvsock_dev_features()) != s->features) {
		snprintf(s->why, sizeof(s->why), "the state's features %#llx are not the acked %#llx",
			 (unsigned long long)s->features,
			 (unsigned long long)(acked & uvsock_dev_features()));
		loaded_drop(s);
		s->result = -EINVAL;
	}
	if (s->result < 0) {
		log_vm_dev(LOG_LVL_WARN, vsock_dev_guest_cid(s->d), "%s: device state %s refused: %s",
			   vsock_dev_name(s->d), s->dir == X_SAVE ? "save" : "load", s->why);
		return s->result == -EINPROGRESS ? -EBUSY : s->result;
	}
	return 0;
}

void vhu_state_tx_stopping(struct vhu_state *s, uint64_t features)
{
	free(s->snap);
	s->snap = NULL;
	/*
	 * Where the front-end handed the event queue over (Cloud Hypervisor, crosvm: the
	 * front-ends that move a vsock device's state), the connections are held, frozen, for a
	 * save; QEMU keeps the event queue and never saves this device's state, so for it a stop
	 * stays what it was: the connections end (docs/upgrade.md).
	 */
	if (s->evq) {
		dev_session_hold(s->d, true);
		return;
	}
	if (state_build(s, features, NULL, &s->snap, &s->snap_len) < 0)
		s->snap = NULL; /* taken again, without the connections, at the save */
}

void vhu_state_evq_started(struct vhu_state *s)
{
	s->evq = true;
}

void vhu_state_tx_started(struct vhu_state *s)
{
	free(s->snap);
	s->snap = NULL;
	/* Back on this device (a failed migration, a pause): nobody takes its state now. */
	rv_close(s);
	if (!s->loaded)
		return;
	if (s->moved) {
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d), "%s: the moved connections go on",
			   vsock_dev_name(s->d));
	} else if (s->session) {
		log_vm_dev(LOG_LVL_INFO, vsock_dev_guest_cid(s->d),
			   "%s: the loaded state's %zu guest connections end (host connections do "
			   "not move between back-ends)", vsock_dev_name(s->d), s->nconns);
		dev_end_moved_conns(s->d, s->conns, s->nconns);
	}
	loaded_drop(s);
}
