/* SPDX-License-Identifier: MIT */
/*
 * The state record (rec.h): CRC32C, the writer into a growable buffer, the sealed memfd that
 * carries a record, and the reader that checks every byte before it is used.
 */
#include "util/rec.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/time.h"

/* ---- CRC32C ----------------------------------------------------------------------------------- */

/* Castagnoli polynomial, reflected. One table of 256 entries, built once. */
#define CRC32C_POLY 0x82f63b78u

static uint32_t crc_table[256];
static bool crc_hw; /* SSE4.2's crc32 instruction is there */
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	crc_hw = __builtin_cpu_supports("sse4.2");
#endif
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		crc_table[i] = c;
	}
}

uint32_t rec_crc32c_sw(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;

	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	while (n--)
		crc = crc_table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/*
 * The same CRC with SSE4.2's crc32 instruction (same polynomial, same bit order), 8 bytes at a
 * time: a record of tens of MiB is summed twice per hand-over, and the table walk would be most
 * of the save's time (bench/bench-engine-save.c).
 */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *b,
								   size_t n)
{
	uint64_t c = crc;

	for (; n >= 8; n -= 8, b += 8) {
		uint64_t v;

		memcpy(&v, b, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	crc = (uint32_t)c;
	while (n--)
		crc = __builtin_ia32_crc32qi(crc, *b++);
	return crc;
}
#endif

uint32_t rec_crc32c(uint32_t crc, const void *p, size_t n)
{
	pthread_once(&crc_once, crc_init);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (crc_hw)
		return ~crc32c_sse42(~crc, p, n);
#endif
	return rec_crc32c_sw(crc, p, n);
}

/* The record's CRC: every byte, the CRC field read as zero. */
static uint32_t rec_sum(const uint8_t *buf, size_t len)
{
	static const uint8_t zero[4];
	uint32_t c = rec_crc32c(0, buf, REC_CRC_OFFSET);

	c = rec_crc32c(c, zero, sizeof(zero));
	return rec_crc32c(c, buf + REC_CRC_OFFSET + 4, len - REC_CRC_OFFSET - 4);
}

static void le32_put(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void le64_put(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t le32_get(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64_get(const uint8_t *p)
{
	return (uint64_t)le32_get(p) | (uint64_t)le32_get(p + 4) << 32;
}

/* ---- writer ----------------------------------------------------------------------------------- */

void rec_writer_init(struct rec_writer *w, uint32_t kind, uint32_t version)
{
	*w = (struct rec_writer){.kind = kind, .version = version};
	w->buf = malloc(4096);
	if (!w->buf) {
		w->err = -ENOMEM;
		return;
	}
	w->cap = 4096;
	memset(w->buf, 0, REC_HDR_SIZE);
	w->len = REC_HDR_SIZE;
}

void rec_writer_free(struct rec_writer *w)
{
	free(w->buf);
	free(w->fds);
	*w = (struct rec_writer){0};
}

/* Room for n more bytes; returns where they go, or NULL (error set). */
static uint8_t *w_room(struct rec_writer *w, size_t n)
{
	uint8_t *p;

	if (w->err)
		return NULL;
	if (n > REC_MAX_LEN || w->len + n > REC_MAX_LEN) {
		w->err = -E2BIG;
		return NULL;
	}
	if (w->len + n > w->cap) {
		size_t ncap = w->cap;
		uint8_t *nb;

		while (ncap < w->len + n)
			ncap *= 2;
		nb = realloc(w->buf, ncap);
		if (!nb) {
			w->err = -ENOMEM;
			return NULL;
		}
		w->buf = nb;
		w->cap = ncap;
	}
	p = w->buf + w->len;
	w->len += n;
	return p;
}

/* An item header with room for n value bytes; returns the value's place or NULL. */
static uint8_t *w_item(struct rec_writer *w, uint32_t tag, size_t n)
{
	uint8_t *p;

	if (!w->err && (tag == 0 || n > UINT32_MAX)) {
		w->err = tag == 0 ? -EINVAL : -E2BIG;
		return NULL;
	}
	p = w_room(w, 8 + n);
	if (!p)
		return NULL;
	le32_put(p, tag);
	le32_put(p + 4, (uint32_t)n);
	return p + 8;
}

void rec_put_u32(struct rec_writer *w, uint32_t tag, uint32_t v)
{
	uint8_t *p = w_item(w, tag, 4);

	if (p)
		le32_put(p, v);
}

void rec_put_u64(struct rec_writer *w, uint32_t tag, uint64_t v)
{
	uint8_t *p = w_item(w, tag, 8);

	if (p)
		le64_put(p, v);
}

void rec_put_bytes(struct rec_writer *w, uint32_t tag, const void *src, size_t n)
{
	uint8_t *p = w_item(w, tag, n);

	if (p && n)
		memcpy(p, src, n);
}

void rec_put_iov(struct rec_writer *w, uint32_t tag, const struct iovec *iov, size_t iovcnt)
{
	size_t n = 0;
	uint8_t *p;

	for (size_t i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	p = w_item(w, tag, n);
	if (!p)
		return;
	for (size_t i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len)
			memcpy(p, iov[i].iov_base, iov[i].iov_len);
		p += iov[i].iov_len;
	}
}

void rec_put_fd(struct rec_writer *w, uint32_t tag, int fd)
{
	if (w->err)
		return;
	if (fd < 0) {
		w->err = -EBADF;
		return;
	}
	if (w->nfds == w->fd_cap) {
		uint32_t ncap = w->fd_cap ? w->fd_cap * 2 : 16;
		int *nf;

		if (w->nfds >= REC_MAX_FDS) {
			w->err = -E2BIG;
			return;
		}
		nf = realloc(w->fds, ncap * sizeof(*nf));
		if (!nf) {
			w->err = -ENOMEM;
			return;
		}
		w->fds = nf;
		w->fd_cap = ncap;
	}
	rec_put_u32(w, tag, w->nfds);
	if (!w->err)
		w->fds[w->nfds++] = fd;
}

void rec_begin(struct rec_writer *w, uint32_t tag)
{
	size_t at = w->len;

	if (!w->err && w->depth == REC_MAX_DEPTH) {
		w->err = -E2BIG;
		return;
	}
	if (w_item(w, tag, 0))
		w->open[w->depth++] = at;
}

void rec_end(struct rec_writer *w)
{
	size_t at, n;

	if (w->err)
		return;
	if (w->depth == 0) {
		w->err = -EINVAL;
		return;
	}
	at = w->open[--w->depth];
	n = w->len - at - 8;
	if (n > UINT32_MAX) {
		w->err = -E2BIG;
		return;
	}
	le32_put(w->buf + at + 4, (uint32_t)n);
}

void rec_reseal(uint8_t *buf, size_t len)
{
	le32_put(buf + REC_CRC_OFFSET, rec_sum(buf, len));
}

int rec_writer_finish(struct rec_writer *w, const uint8_t **ret_buf, size_t *ret_len)
{
	uint8_t *h = w->buf;

	if (!w->err && w->depth)
		w->err = -EINVAL;
	if (w->err)
		return w->err;
	memcpy(h, REC_MAGIC, 8);
	le32_put(h + 8, w->kind);
	le32_put(h + 12, w->version);
	le64_put(h + 16, w->len);
	le32_put(h + 24, w->nfds);
	le32_put(h + 28, 0);
	le32_put(h + 36, 0);
	rec_reseal(h, w->len);
	*ret_buf = w->buf;
	*ret_len = w->len;
	return 0;
}

/* ---- memfd ------------------------------------------------------------------------------------ */

#define REC_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

int rec_memfd(const void *buf, size_t len, const char *name, int *ret_fd)
{
	const uint8_t *p = buf;
	size_t done = 0;
	int fd, r;

	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t n = write(fd, p + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			goto fail;
		}
		done += (size_t)n;
	}
	if (fcntl(fd, F_ADD_SEALS, REC_SEALS | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto fail;
	}
	*ret_fd = fd;
	return 0;
fail:
	close(fd);
	return r;
}

int rec_map_fd(int fd, const uint8_t **ret_buf, size_t *ret_len)
{
	struct stat st;
	void *m;
	int seals;

	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EPERM : -errno;
	if ((seals & REC_SEALS) != REC_SEALS)
		return -EPERM;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (st.st_size <= 0)
		return -EBADMSG;
	if ((uint64_t)st.st_size > REC_MAX_LEN)
		return -E2BIG;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	*ret_buf = m;
	*ret_len = (size_t)st.st_size;
	return 0;
}

void rec_unmap(const uint8_t *buf, size_t len)
{
	if (buf)
		munmap((void *)buf, len);
}

/* ---- passing a record to another process ------------------------------------------------------ */

#define XFER_MAGIC "UVSKFDS1"

/* Sends len bytes and n fds as one message. */
static int xfer_send(int sock, const void *buf, size_t len, const int *fds, size_t n)
{
	char cbuf[CMSG_SPACE(REC_FDS_PER_MSG * sizeof(int))] __attribute__((aligned(8)));
	struct iovec iov = {(void *)buf, len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r;

	if (n) {
		struct cmsghdr *c;

		memset(cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf;
		msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(c), fds, n * sizeof(int));
	}
	do
		r = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	return (size_t)r == len ? 0 : -EIO;
}

int rec_send(int sock, int memfd, const int *fds, size_t nfds)
{
	uint8_t hdr[16];
	int r;

	if (nfds > REC_MAX_FDS || memfd < 0)
		return -EINVAL;
	memcpy(hdr, XFER_MAGIC, 8);
	le32_put(hdr + 8, (uint32_t)nfds);
	le32_put(hdr + 12, 0);
	r = xfer_send(sock, hdr, sizeof(hdr), &memfd, 1);
	for (size_t i = 0; r == 0 && i < nfds; i += REC_FDS_PER_MSG) {
		size_t n = nfds - i < REC_FDS_PER_MSG ? nfds - i : REC_FDS_PER_MSG;
		uint8_t b[8];

		le32_put(b, (uint32_t)i);
		le32_put(b + 4, (uint32_t)n);
		r = xfer_send(sock, b, sizeof(b), fds + i, n);
	}
	return r;
}

/*
 * Receives one message of exactly want bytes into buf, its fds appended to fds[*nfd..cap).
 * Every fd that arrives is kept there (or closed when beyond cap), so that the caller can close
 * them all on failure.
 */
static int xfer_recv(int sock, uint64_t deadline_ns, void *buf, size_t want, int *fds,
		     size_t *nfd, size_t cap, size_t *got_fds)
{
	char cbuf[CMSG_SPACE(REC_FDS_PER_MSG * sizeof(int))] __attribute__((aligned(8)));
	uint8_t raw[32];
	struct iovec iov = {raw, sizeof(raw)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf)};
	struct pollfd p = {.fd = sock, .events = POLLIN};
	bool bad = false;
	ssize_t r;

	*got_fds = 0;
	for (;;) {
		uint64_t now = mono_ns();
		int ms = now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);

		r = poll(&p, 1, ms);
		if (r > 0)
			break;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
	do
		r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
			bad = true;
			continue;
		}
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*nfd < cap) {
				fds[(*nfd)++] = fd;
				(*got_fds)++;
			} else {
				close(fd);
				bad = true;
			}
		}
	}
	if (r == 0 && *got_fds == 0)
		return -ECONNRESET;
	if (bad || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || (size_t)r != want)
		return -EBADMSG;
	memcpy(buf, raw, want);
	return 0;
}

int rec_recv(int sock, int timeout_ms, int *ret_memfd, int **ret_fds, size_t *ret_nfds)
{
	uint64_t deadline = mono_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
	size_t nfd = 0, total, got;
	uint8_t hdr[16];
	int memfd[1], *fds = NULL;
	int r;

	r = xfer_recv(sock, deadline, hdr, sizeof(hdr), memfd, &nfd, 1, &got);
	if (r == 0 && (memcmp(hdr, XFER_MAGIC, 8) != 0 || got != 1 || le32_get(hdr + 12) != 0))
		r = -EBADMSG;
	if (r < 0) {
		if (nfd)
			close(memfd[0]);
		return r;
	}
	total = le32_get(hdr + 8);
	if (total > REC_MAX_FDS) {
		close(memfd[0]);
		return -E2BIG;
	}
	fds = malloc((total ? total : 1) * sizeof(*fds));
	if (!fds) {
		close(memfd[0]);
		return -ENOMEM;
	}
	nfd = 0;
	while (nfd < total) {
		size_t first = nfd;
		uint8_t b[8];

		r = xfer_recv(sock, deadline, b, sizeof(b), fds, &nfd, total, &got);
		if (r == 0 && (le32_get(b) != first || le32_get(b + 4) != got || got == 0 ||
			       got > REC_FDS_PER_MSG))
			r = -EBADMSG;
		if (r < 0)
			break;
	}
	if (r < 0) {
		for (size_t i = 0; i < nfd; i++)
			close(fds[i]);
		free(fds);
		close(memfd[0]);
		return r;
	}
	*ret_memfd = memfd[0];
	*ret_fds = fds;
	*ret_nfds = total;
	return 0;
}

/* ---- reader ----------------------------------------------------------------------------------- */

int rec_fail(struct rec_doc *d, int err, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(d->err, sizeof(d->err), "record: ");

	va_start(ap, fmt);
	vsnprintf(d->err + n, sizeof(d->err) - (size_t)n, fmt, ap);
	va_end(ap);
	return err;
}

const char *rec_error(const struct rec_doc *d)
{
	return d->err;
}

int rec_open(struct rec_doc *d, const void *buf, size_t len, uint32_t kind, uint32_t vmin,
	     uint32_t vmax, const int *fds, size_t nfds)
{
	const uint8_t *h = buf;
	uint64_t total;
	uint32_t v, sum;

	*d = (struct rec_doc){.buf = buf, .len = len, .fds = fds};
	if (len < REC_HDR_SIZE)
		return rec_fail(d, -EBADMSG, "%zu bytes, shorter than its %u-byte header", len,
				REC_HDR_SIZE);
	if (memcmp(h, REC_MAGIC, 8) != 0)
		return rec_fail(d, -EBADMSG, "bad magic (not a uvsock state record)");
	if (le32_get(h + 8) != kind)
		return rec_fail(d, -EBADMSG, "kind %u, expected %u", le32_get(h + 8), kind);
	v = le32_get(h + 12);
	if (v < vmin || v > vmax)
		return rec_fail(d, -EPROTONOSUPPORT,
				"version %u is not one this program reads (%u..%u)", v, vmin, vmax);
	total = le64_get(h + 16);
	if (total != len)
		return rec_fail(d, -EBADMSG, "length field %llu, but %zu bytes present (truncated?)",
				(unsigned long long)total, len);
	if (len > REC_MAX_LEN)
		return rec_fail(d, -E2BIG, "%zu bytes, over the limit", len);
	if (le32_get(h + 28) != 0 || le32_get(h + 36) != 0)
		return rec_fail(d, -EBADMSG, "unknown header flags 0x%x", le32_get(h + 28));
	if (le32_get(h + 24) != nfds)
		return rec_fail(d, -EBADMSG, "names %u fds, %zu came with it", le32_get(h + 24),
				nfds);
	if (nfds > REC_MAX_FDS)
		return rec_fail(d, -E2BIG, "%zu fds, over the limit", nfds);
	sum = rec_sum(h, len);
	if (sum != le32_get(h + REC_CRC_OFFSET))
		return rec_fail(d, -EBADMSG, "checksum mismatch (stored 0x%08x, computed 0x%08x)",
				le32_get(h + REC_CRC_OFFSET), sum);
	d->fd_claimed = calloc(nfds ? nfds : 1, 1);
	if (!d->fd_claimed)
		return rec_fail(d, -ENOMEM, "out of memory");
	d->kind = kind;
	d->version = v;
	d->nfds = (uint32_t)nfds;
	d->err[0] = '\0';
	return 0;
}

void rec_doc_fini(struct rec_doc *d)
{
	free(d->fd_claimed);
	d->fd_claimed = NULL;
}

int rec_check_fds_claimed(struct rec_doc *d)
{
	for (uint32_t i = 0; i < d->nfds; i++)
		if (!d->fd_claimed[i])
			return rec_fail(d, -EBADMSG, "fd %u of %u is named by no item", i, d->nfds);
	return 0;
}

void rec_root(struct rec_doc *d, struct rec_reader *r, const char *where)
{
	*r = (struct rec_reader){.doc = d, .p = d->buf + REC_HDR_SIZE, .end = d->buf + d->len,
				 .where = where};
}

int rec_next(struct rec_reader *r, struct rec_item *it)
{
	size_t left = (size_t)(r->end - r->p);

	if (left == 0)
		return 0;
	it->off = (size_t)(r->p - r->doc->buf);
	if (left < 8)
		return rec_fail(r->doc, -EBADMSG, "%s: item at offset %zu cut short (%zu bytes left)",
				r->where, it->off, left);
	it->tag = le32_get(r->p);
	it->len = le32_get(r->p + 4);
	if (it->tag == 0)
		return rec_fail(r->doc, -EBADMSG, "%s: item at offset %zu has tag 0", r->where,
				it->off);
	if (it->len > left - 8)
		return rec_fail(r->doc, -EBADMSG,
				"%s: item 0x%x at offset %zu is %u bytes long, only %zu remain",
				r->where, it->tag, it->off, it->len, left - 8);
	it->val = r->p + 8;
	r->p += 8 + (size_t)it->len;
	return 1;
}

int rec_enter(struct rec_reader *r, const struct rec_item *it, const char *where,
	      struct rec_reader *sub)
{
	if (r->depth >= REC_MAX_DEPTH)
		return rec_fail(r->doc, -EBADMSG, "%s: item 0x%x at offset %zu nested too deep",
				r->where, it->tag, it->off);
	*sub = (struct rec_reader){.doc = r->doc, .p = it->val, .end = it->val + it->len,
				   .depth = r->depth + 1, .where = where};
	return 0;
}

static int bad_size(struct rec_reader *r, const struct rec_item *it, const char *name,
		    unsigned want)
{
	return rec_fail(r->doc, -EBADMSG, "%s: %s (tag 0x%x, offset %zu) is %u bytes, expected %u",
			r->where, name, it->tag, it->off, it->len, want);
}

int rec_get_u32(struct rec_reader *r, const struct rec_item *it, uint32_t *v)
{
	if (it->len != 4)
		return bad_size(r, it, "u32", 4);
	*v = le32_get(it->val);
	return 0;
}

int rec_get_u64(struct rec_reader *r, const struct rec_item *it, uint64_t *v)
{
	if (it->len != 8)
		return bad_size(r, it, "u64", 8);
	*v = le64_get(it->val);
	return 0;
}

int rec_get_fd(struct rec_reader *r, const struct rec_item *it, int *fd)
{
	struct rec_doc *d = r->doc;
	uint32_t i;

	if (it->len != 4)
		return bad_size(r, it, "fd index", 4);
	i = le32_get(it->val);
	if (i >= d->nfds)
		return rec_fail(d, -EBADMSG, "%s: fd index %u at offset %zu, the record has %u fds",
				r->where, i, it->off, d->nfds);
	if (d->fd_claimed[i])
		return rec_fail(d, -EBADMSG, "%s: fd %u named twice (offset %zu)", r->where, i,
				it->off);
	d->fd_claimed[i] = 1;
	*fd = d->fds[i];
	return 0;
}

int rec_scan(struct rec_reader *r, const struct rec_field *fields, size_t n, struct rec_val *vals)
{
	struct rec_item it;
	int k;

	for (size_t i = 0; i < n; i++)
		vals[i] = (struct rec_val){0};
	while ((k = rec_next(r, &it)) > 0) {
		const struct rec_field *f = NULL;
		struct rec_val *v;
		uint32_t u32;
		size_t i;
		int fd, e = 0;

		for (i = 0; i < n; i++)
			if (fields[i].tag == it.tag) {
				f = &fields[i];
				break;
			}
		if (!f)
			return rec_fail(r->doc, -EBADMSG, "%s: unknown field 0x%x at offset %zu",
					r->where, it.tag, it.off);
		v = &vals[i];
		if (v->present)
			return rec_fail(r->doc, -EBADMSG, "%s: field %s appears twice (offset %zu)",
					r->where, f->name, it.off);
		switch (f->type) {
		case REC_U32:
			if (it.len != 4)
				return bad_size(r, &it, f->name, 4);
			e = rec_get_u32(r, &it, &u32);
			v->u = u32;
			break;
		case REC_U64:
			if (it.len != 8)
				return bad_size(r, &it, f->name, 8);
			e = rec_get_u64(r, &it, &v->u);
			break;
		case REC_FD:
			e = rec_get_fd(r, &it, &fd);
			v->u = (uint64_t)fd;
			break;
		case REC_BYTES:
		case REC_LIST:
			break;
		}
		if (e < 0)
			return e;
		v->present = true;
		v->it = it;
	}
	if (k < 0)
		return k;
	for (size_t i = 0; i < n; i++)
		if (fields[i].required && !vals[i].present)
			return rec_fail(r->doc, -EBADMSG, "%s: required field %s (tag 0x%x) missing",
					r->where, fields[i].name, fields[i].tag);
	return 0;
}
