/* SPDX-License-Identifier: MIT */
/*
 * The receive chunk queue (rxq.h): chunks and the spares, the small-payload merge into the tail
 * chunk, STREAM compaction, the receive-memory bound with its per-chunk overhead, and the reads
 * that consume, peek at or free what is queued. No locks, no sockets, no credit.
 */
#include "vsock/rxq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/iov.h"
#include "util/macros.h"

/* Frees the queued chunks and empties the queue; the byte and message counts are left as is. */
static void rxq_free_chunks(struct vsock_rxq *q)
{
	struct rx_chunk *c = q->head;

	while (c) {
		struct rx_chunk *n = c->next;
		free(c);
		c = n;
	}
	q->head = q->tail = NULL;
	q->mem = 0;
}

void vsock_rxq_free(struct vsock_rxq *q)
{
	rxq_free_chunks(q);
	q->msgs = 0;
	q->bytes = 0;
	q->open_bytes = 0;
	while (q->spare) {
		struct rx_chunk *n = q->spare->next;

		free(q->spare);
		q->spare = n;
	}
	q->n_spare = 0;
}

static struct rx_chunk *chunk_new(uint32_t cap)
{
	struct rx_chunk *c = malloc(sizeof(*c) + cap);

	if (!c)
		return NULL;
	c->next = NULL;
	c->cap = cap;
	c->start = c->end = 0;
	c->eom = c->eor = 0;
	return c;
}

/*
 * A chunk of at least `cap` bytes of room whose whole room still fits the queue's bound
 * (`limit`): the smallest spare that does (a burst of packets of varying sizes, as a device
 * cuts a host stream into RX buffers, finds the chunks the reader emptied), else a new
 * allocation of exactly `cap`. Reusing instead of freeing matters beyond malloc itself: a
 * burst of 64 KiB chunks freed at once makes glibc trim its heap (madvise, a TLB shootdown
 * on every CPU) and the next burst fault in and zero fresh pages.
 */
static struct rx_chunk *chunk_get(struct vsock_rxq *q, uint32_t cap, uint64_t limit)
{
	struct rx_chunk **best = NULL, *c;

	for (struct rx_chunk **p = &q->spare; *p; p = &(*p)->next)
		if ((*p)->cap >= cap && q->mem + (*p)->cap + RX_CHUNK_OVERHEAD <= limit &&
		    (!best || (*p)->cap < (*best)->cap))
			best = p;
	if (!best)
		return chunk_new(cap);
	c = *best;
	*best = c->next;
	q->n_spare--;
	c->next = NULL;
	c->start = c->end = 0;
	c->eom = c->eor = 0;
	return c;
}

/*
 * Releases an emptied chunk: it joins the spares if small enough, replacing the smallest one
 * when there are RX_SPARES already and it is larger.
 */
static void chunk_put(struct vsock_rxq *q, struct rx_chunk *c)
{
	struct rx_chunk **small = NULL, *o;

	if (c->cap > RX_SPARE_MAX) {
		free(c);
		return;
	}
	if (q->n_spare >= RX_SPARES) {
		for (struct rx_chunk **p = &q->spare; *p; p = &(*p)->next)
			if (!small || (*p)->cap < (*small)->cap)
				small = p;
		if ((*small)->cap >= c->cap) {
			free(c);
			return;
		}
		o = *small;
		*small = o->next;
		free(o);
		q->n_spare--;
	}
	c->next = q->spare;
	q->spare = c;
	q->n_spare++;
}

static void rxq_append(struct vsock_rxq *q, struct rx_chunk *c)
{
	if (q->tail)
		q->tail->next = c;
	else
		q->head = c;
	q->tail = c;
	q->mem += c->cap + RX_CHUNK_OVERHEAD;
}

static void rxq_pop_head(struct vsock_rxq *q)
{
	struct rx_chunk *c = q->head;

	q->head = c->next;
	if (!q->head)
		q->tail = NULL;
	q->mem -= c->cap + RX_CHUNK_OVERHEAD;
	chunk_put(q, c);
}

/*
 * STREAM only: copies all queued bytes into one chunk with room for `extra` more, so that a
 * stream of odd-sized packets never costs more than the bytes plus one chunk's overhead.
 * Amortised O(1) per byte: it runs only when mem doubled past the data it holds.
 */
static int rxq_compact(struct vsock_rxq *q, uint32_t extra)
{
	struct rx_chunk *n = chunk_new(q->bytes + extra);
	struct rx_chunk *c;

	if (!n)
		return -ENOMEM;
	for (c = q->head; c; c = c->next) {
		memcpy(n->data + n->end, c->data + c->start, c->end - c->start);
		n->end += c->end - c->start;
	}
	rxq_free_chunks(q);
	rxq_append(q, n);
	return 0;
}

uint64_t vsock_rxq_mem_limit(uint32_t rx_limit)
{
	return 2ull * rx_limit + VSOCK_MAX_PKT_PAYLOAD + 2ull * RX_CHUNK_OVERHEAD;
}

int vsock_rxq_push(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt, uint32_t len,
		   bool seq, bool eom, bool eor, uint32_t rx_limit)
{
	uint64_t limit = vsock_rxq_mem_limit(rx_limit);
	struct rx_chunk *c = q->tail;
	struct iov_cur cur;

	if (!(len <= VSOCK_GOOD_COPY_LEN && !q->no_merge && c && !c->eom &&
	      c->cap - c->end >= len)) {
		uint32_t cap = len;

		if (len <= VSOCK_GOOD_COPY_LEN && !eom && !q->no_merge)
			cap = RX_SMALL_CHUNK; /* room for the small payloads that follow */
		if (q->mem + cap + RX_CHUNK_OVERHEAD > limit)
			cap = len;
		if (q->mem + cap + RX_CHUNK_OVERHEAD > limit && !seq && q->head) {
			if (rxq_compact(q, len) < 0)
				return -ENOMEM;
			c = q->tail;
			goto copy;
		}
		if (q->mem + cap + RX_CHUNK_OVERHEAD > limit)
			return -ENOBUFS;
		c = chunk_get(q, cap, limit);
		if (!c)
			return -ENOMEM;
		rxq_append(q, c);
	}
copy:
	iov_cur_init(&cur, iov, iovcnt);
	iov_cur_read(&cur, c->data + c->end, len);
	c->end += len;
	if (eom) {
		c->eom = 1;
		c->eor = eor ? 1 : 0;
		q->msgs++;
		q->open_bytes = 0;
	} else if (seq) {
		q->open_bytes += len;
	}
	q->bytes += len;
	return 0;
}

uint32_t vsock_rxq_read(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt,
			uint32_t len, bool peek)
{
	uint32_t done = 0;
	struct rx_chunk *c = q->head;
	struct iov_cur cur;

	iov_cur_init(&cur, iov, iovcnt);
	while (c && done < len) {
		uint32_t avail = c->end - c->start;
		uint32_t n = MIN(avail, len - done);

		iov_cur_write(&cur, c->data + c->start, n);
		done += n;
		if (peek) {
			c = c->next;
			continue;
		}
		c->start += n;
		if (c->start == c->end) {
			struct rx_chunk *next = c->next;
			rxq_pop_head(q);
			c = next;
		}
	}
	if (!peek)
		q->bytes -= done;
	return done;
}

uint32_t vsock_rxq_read_msg(struct vsock_rxq *q, const struct iovec *iov, size_t iovcnt,
			    bool peek, uint32_t *ret_copied, bool *ret_eor)
{
	size_t space = iov_total(iov, iovcnt);
	uint32_t msglen = 0, copied = 0;
	struct rx_chunk *c = q->head;
	struct iov_cur cur;
	bool eor = false;

	*ret_copied = 0;
	*ret_eor = false;
	if (q->msgs == 0)
		return 0;
	iov_cur_init(&cur, iov, iovcnt);
	for (; c; c = c->next) {
		uint32_t avail = c->end - c->start;

		if (copied < space) {
			uint32_t n = (uint32_t)MIN((size_t)avail, space - copied);
			iov_cur_write(&cur, c->data + c->start, n);
			copied += n;
		}
		msglen += avail;
		if (c->eom) {
			eor = c->eor;
			break;
		}
	}
	if (!peek) {
		bool last;

		do {
			last = q->head->eom;
			rxq_pop_head(q);
		} while (!last);
		q->bytes -= msglen;
		q->msgs--;
	}
	*ret_copied = copied;
	*ret_eor = eor;
	return msglen;
}

size_t vsock_rxq_peek_iov(const struct vsock_rxq *q, struct iovec *iov, size_t iovcnt)
{
	size_t total = 0, i = 0;

	for (struct rx_chunk *c = q->head; c && i < iovcnt; c = c->next) {
		if (c->end == c->start)
			continue;
		iov[i].iov_base = c->data + c->start;
		iov[i].iov_len = c->end - c->start;
		total += iov[i].iov_len;
		i++;
	}
	return total;
}
