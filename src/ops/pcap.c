/* SPDX-License-Identifier: MIT */
/*
 * vsockmon-format pcap writer (see pcap.h). Records are staged in a 256 KiB buffer and written
 * in large writes; pipes and sockets are switched to non-blocking so that a slow reader makes
 * us drop whole records (counted) instead of stalling a VM thread, and the stream stays valid
 * because a record is only ever queued whole.
 */
#include "ops/pcap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/macros.h"

#define PCAP_MAGIC_US 0xa1b2c3d4u
#define PCAP_MAGIC_NS 0xa1b23c4du
#define PCAP_FILE_HDR_SIZE 24u
#define PCAP_REC_HDR_SIZE 16u
#define PCAP_BUF_SIZE (256u * 1024)
#define PCAP_DEFAULT_MAX_BYTES (1ull << 30)
#define PCAP_FLUSH_NS 1000000000ull

struct ops_pcap {
	pthread_mutex_t lock;
	atomic_int refs;
	int fd;
	bool nanosecond;
	uint32_t snaplen;
	uint64_t max_bytes;
	uint64_t pkts, bytes, dropped; /* bytes: accepted into the file (buffered or written) */
	int error;
	uint64_t last_flush_ns;
	size_t head, len;    /* unwritten bytes are buf[head, head + len) */
	uint8_t buf[PCAP_BUF_SIZE];
};

enum ops_vsockmon_op ops_vsockmon_op(uint16_t virtio_op)
{
	switch (virtio_op) {
	case VSOCK_OP_REQUEST:
	case VSOCK_OP_RESPONSE:
		return OPS_VSOCKMON_OP_CONNECT;
	case VSOCK_OP_RST:
	case VSOCK_OP_SHUTDOWN:
		return OPS_VSOCKMON_OP_DISCONNECT;
	case VSOCK_OP_RW:
		return OPS_VSOCKMON_OP_PAYLOAD;
	case VSOCK_OP_CREDIT_UPDATE:
	case VSOCK_OP_CREDIT_REQUEST:
		return OPS_VSOCKMON_OP_CONTROL;
	default:
		return OPS_VSOCKMON_OP_UNKNOWN;
	}
}

void ops_vsockmon_hdr_encode(const struct vsock_hdr *h, void *out)
{
	uint8_t *p = out;

	vsock_le64_put_(p + 0, h->src_cid);
	vsock_le64_put_(p + 8, h->dst_cid);
	vsock_le32_put_(p + 16, h->src_port);
	vsock_le32_put_(p + 20, h->dst_port);
	vsock_le16_put_(p + 24, (uint16_t)ops_vsockmon_op(h->op));
	vsock_le16_put_(p + 26, OPS_VSOCKMON_TRANSPORT_VIRTIO);
	vsock_le16_put_(p + 28, VSOCK_HDR_SIZE);
	p[30] = 0;
	p[31] = 0;
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes what the buffer holds; stops at EAGAIN (non-blocking pipe full). Lock held. */
static int flush_locked(struct ops_pcap *p)
{
	while (p->len && !p->error) {
		ssize_t n = write(p->fd, p->buf + p->head, p->len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			p->error = n < 0 ? errno : EIO;
			p->len = 0;
			break;
		}
		p->head += (size_t)n;
		p->len -= (size_t)n;
	}
	if (p->len == 0)
		p->head = 0;
	return p->error ? -p->error : 0;
}

/* Makes room for n contiguous bytes at the end of the buffer; false if there is none. */
static bool room_locked(struct ops_pcap *p, size_t n)
{
	if (p->head + p->len + n <= PCAP_BUF_SIZE)
		return true;
	flush_locked(p);
	if (p->head && p->len) {
		memmove(p->buf, p->buf + p->head, p->len);
		p->head = 0;
	}
	return !p->error && p->head + p->len + n <= PCAP_BUF_SIZE;
}

int ops_pcap_open_fd(int fd, const struct ops_pcap_opts *o, struct ops_pcap **ret)
{
	struct ops_pcap *p;
	struct stat st;
	uint8_t *h;
	int r;

	if (o && o->snaplen && o->snaplen < OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE) {
		r = -EINVAL;
		goto fail_fd;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto fail_fd;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		r = -ENOMEM;
		goto fail_fd;
	}
	pthread_mutex_init(&p->lock, NULL);
	atomic_init(&p->refs, 1);
	p->fd = fd;
	p->nanosecond = o && o->nanosecond;
	p->snaplen = o && o->snaplen ? MIN(o->snaplen, OPS_PCAP_SNAPLEN_MAX) : OPS_PCAP_SNAPLEN_MAX;
	p->max_bytes = o && o->max_bytes ? o->max_bytes : PCAP_DEFAULT_MAX_BYTES;
	if (!S_ISREG(st.st_mode)) {
		int fl = fcntl(fd, F_GETFL);

		if (fl >= 0)
			(void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	}
	h = p->buf;
	vsock_le32_put_(h + 0, p->nanosecond ? PCAP_MAGIC_NS : PCAP_MAGIC_US);
	vsock_le16_put_(h + 4, 2);  /* version 2.4 */
	vsock_le16_put_(h + 6, 4);
	vsock_le32_put_(h + 8, 0);  /* thiszone */
	vsock_le32_put_(h + 12, 0); /* sigfigs */
	vsock_le32_put_(h + 16, p->snaplen);
	vsock_le32_put_(h + 20, OPS_LINKTYPE_VSOCK);
	p->len = PCAP_FILE_HDR_SIZE;
	p->bytes = PCAP_FILE_HDR_SIZE;
	p->last_flush_ns = realtime_ns();
	r = flush_locked(p);
	if (r < 0) {
		ops_pcap_unref(p);
		return r;
	}
	*ret = p;
	return 0;

fail_fd:
	close(fd);
	return r;
}

int ops_pcap_open_path(const char *path, const struct ops_pcap_opts *o, struct ops_pcap **ret)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	return ops_pcap_open_fd(fd, o, ret);
}

struct ops_pcap *ops_pcap_ref(struct ops_pcap *p)
{
	atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
	return p;
}

void ops_pcap_unref(struct ops_pcap *p)
{
	if (!p)
		return;
	/* acq_rel: every write made under earlier references happens before the close below. */
	if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_mutex_lock(&p->lock);
	flush_locked(p);
	pthread_mutex_unlock(&p->lock);
	close(p->fd);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

void ops_pcap_write(struct ops_pcap *p, const struct vsock_hdr *h, const struct iovec *iov,
		    int iovcnt, uint64_t ts_ns)
{
	size_t payload = 0, orig, incl, want;
	uint8_t *rec;
	uint64_t sub;

	for (int i = 0; i < iovcnt && payload < h->len; i++)
		payload += iov[i].iov_len;
	payload = MIN(payload, (size_t)h->len);
	orig = OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE + payload;
	incl = MIN(orig, (size_t)p->snaplen);
	if (!ts_ns)
		ts_ns = realtime_ns();

	pthread_mutex_lock(&p->lock);
	if (p->error || p->bytes + PCAP_REC_HDR_SIZE + incl > p->max_bytes ||
	    !room_locked(p, PCAP_REC_HDR_SIZE + incl)) {
		p->dropped++;
		goto out;
	}
	rec = p->buf + p->head + p->len;
	sub = p->nanosecond ? ts_ns % 1000000000ull : (ts_ns % 1000000000ull) / 1000;
	vsock_le32_put_(rec + 0, (uint32_t)(ts_ns / 1000000000ull));
	vsock_le32_put_(rec + 4, (uint32_t)sub);
	vsock_le32_put_(rec + 8, (uint32_t)incl);
	vsock_le32_put_(rec + 12, (uint32_t)orig);
	rec += PCAP_REC_HDR_SIZE;
	/* incl >= 76 always (snaplen is checked), so both headers are whole. */
	ops_vsockmon_hdr_encode(h, rec);
	vsock_hdr_encode(h, rec + OPS_VSOCKMON_HDR_SIZE);
	rec += OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE;
	want = incl - OPS_VSOCKMON_HDR_SIZE - VSOCK_HDR_SIZE;
	for (int i = 0; i < iovcnt && want; i++) {
		size_t n = MIN(want, iov[i].iov_len);

		memcpy(rec, iov[i].iov_base, n);
		rec += n;
		want -= n;
	}
	p->len += PCAP_REC_HDR_SIZE + incl;
	p->bytes += PCAP_REC_HDR_SIZE + incl;
	p->pkts++;
	if (ts_ns - p->last_flush_ns >= PCAP_FLUSH_NS) {
		p->last_flush_ns = ts_ns;
		flush_locked(p);
	}
out:
	pthread_mutex_unlock(&p->lock);
}

int ops_pcap_flush(struct ops_pcap *p)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = flush_locked(p);
	pthread_mutex_unlock(&p->lock);
	return r;
}

void ops_pcap_get_status(struct ops_pcap *p, struct ops_pcap_status *ret)
{
	pthread_mutex_lock(&p->lock);
	ret->pkts = p->pkts;
	ret->bytes = p->bytes;
	ret->dropped = p->dropped;
	ret->error = p->error;
	ret->snaplen = p->snaplen;
	ret->nanosecond = p->nanosecond;
	pthread_mutex_unlock(&p->lock);
}

/* ---- tap ------------------------------------------------------------------------------- */

void ops_tap_init(struct ops_tap *t)
{
	atomic_init(&t->on, 0);
	t->pcap = NULL;
	pthread_mutex_init(&t->lock, NULL);
}

void ops_tap_destroy(struct ops_tap *t)
{
	if (!t)
		return;
	ops_tap_detach(t);
	pthread_mutex_destroy(&t->lock);
}

int ops_tap_attach(struct ops_tap *t, struct ops_pcap *p)
{
	int r = 0;

	pthread_mutex_lock(&t->lock);
	if (t->pcap) {
		r = -EBUSY;
	} else {
		t->pcap = ops_pcap_ref(p);
		/* Relaxed is enough: the data path re-reads t->pcap under t->lock. */
		atomic_store_explicit(&t->on, 1, memory_order_relaxed);
	}
	pthread_mutex_unlock(&t->lock);
	return r;
}

bool ops_tap_detach(struct ops_tap *t)
{
	struct ops_pcap *old;

	pthread_mutex_lock(&t->lock);
	atomic_store_explicit(&t->on, 0, memory_order_relaxed);
	old = t->pcap;
	t->pcap = NULL;
	pthread_mutex_unlock(&t->lock);
	/* After the unlock no VM thread can reach old through t: drop our reference. */
	ops_pcap_unref(old);
	return old != NULL;
}

bool ops_tap_attached(struct ops_tap *t)
{
	bool r;

	pthread_mutex_lock(&t->lock);
	r = t->pcap != NULL;
	pthread_mutex_unlock(&t->lock);
	return r;
}

void ops_tap_packet(struct ops_tap *t, const struct vsock_hdr *h, const struct iovec *iov,
		    int iovcnt)
{
	pthread_mutex_lock(&t->lock);
	if (t->pcap)
		ops_pcap_write(t->pcap, h, iov, iovcnt, 0);
	pthread_mutex_unlock(&t->lock);
}
