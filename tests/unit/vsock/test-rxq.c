/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the receive chunk queue of src/vsock/rxq.c, used directly (no engine): append
 * and the small-payload merge into the tail chunk, STREAM reads that consume or peek, zero-copy
 * peeks, SEQPACKET messages with EOM/EOR and truncation, the spare chunk, the receive-memory
 * bound with its per-chunk overhead, STREAM compaction under that bound, and free.
 */
#include <string.h>

#include "test.h"
#include "util/macros.h"
#include "vsock/rxq.h"

/* Pushes len bytes of a pattern that continues from byte offset *seq of the stream. */
static int push_pat(struct vsock_rxq *q, uint32_t len, bool seqpacket, bool eom, bool eor,
		    uint32_t rx_limit, uint32_t *seq)
{
	static uint8_t buf[VSOCK_MAX_PKT_PAYLOAD];
	struct iovec iov = {buf, len};
	int r;

	for (uint32_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(*seq + i);
	r = vsock_rxq_push(q, &iov, 1, len, seqpacket, eom, eor, rx_limit);
	if (r == 0)
		*seq += len;
	return r;
}

/* Reads len bytes and checks they continue the pattern from *seq. */
static void read_pat(struct vsock_rxq *q, uint32_t len, uint32_t *seq)
{
	static uint8_t buf[1u << 20];
	struct iovec iov = {buf, len};

	ASSERT_LE(len, sizeof(buf));
	ASSERT_EQ(vsock_rxq_read(q, &iov, 1, len, false), len);
	for (uint32_t i = 0; i < len; i++)
		ASSERT_EQ(buf[i], (uint8_t)(*seq + i));
	*seq += len;
}

static unsigned nchunks(const struct vsock_rxq *q)
{
	unsigned n = 0;

	for (const struct rx_chunk *c = q->head; c; c = c->next)
		n++;
	return n;
}

TEST(empty_queue)
{
	struct vsock_rxq q = {0};
	struct iovec iov[2];
	uint8_t b[4];
	struct iovec out = {b, sizeof(b)};
	uint32_t copied = 7;
	bool eor = true;

	ASSERT_EQ(vsock_rxq_read(&q, &out, 1, sizeof(b), false), 0);
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, false, &copied, &eor), 0);
	ASSERT_EQ(copied, 0);
	ASSERT_FALSE(eor);
	ASSERT_EQ(vsock_rxq_peek_iov(&q, iov, 2), 0);
	vsock_rxq_free(&q);
	ASSERT_TRUE(q.head == NULL && q.tail == NULL && q.spare == NULL);
}

TEST(append_exact_chunk_then_consume)
{
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0;

	ASSERT_OK(push_pat(&q, 1000, false, false, false, 262144, &wr));
	ASSERT_EQ(q.bytes, 1000);
	ASSERT_EQ(nchunks(&q), 1);
	ASSERT_EQ(q.head->cap, 1000); /* above VSOCK_GOOD_COPY_LEN: exact size */
	ASSERT_EQ_U64(q.mem, 1000 + RX_CHUNK_OVERHEAD);

	read_pat(&q, 300, &rd);
	ASSERT_EQ(q.bytes, 700);
	ASSERT_EQ(nchunks(&q), 1);
	read_pat(&q, 700, &rd);
	ASSERT_EQ(q.bytes, 0);
	ASSERT_TRUE(q.head == NULL && q.tail == NULL);
	ASSERT_EQ_U64(q.mem, 0);
	/* The emptied chunk is kept as the spare, and the next payload of that size reuses it. */
	ASSERT_TRUE(q.spare != NULL);
	ASSERT_EQ(q.spare->cap, 1000);
	{
		struct rx_chunk *spare = q.spare;

		ASSERT_OK(push_pat(&q, 1000, false, false, false, 262144, &wr));
		ASSERT_TRUE(q.head == spare);
		ASSERT_TRUE(q.spare == NULL);
	}
	read_pat(&q, 1000, &rd);
	vsock_rxq_free(&q);
}

/*
 * A burst of packets of varying sizes, read in one go, leaves its emptied chunks as spares; the
 * next burst reuses them (the smallest that fits, counted in mem with its whole room) instead of
 * allocating, and a full set of spares keeps the largest.
 */
TEST(burst_of_varying_sizes_reuses_the_spares)
{
	static const uint32_t sz[] = {60000, 50000, 40000, 30000, 20000};
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0, total = 0;

	for (unsigned i = 0; i < ARRAY_SIZE(sz); i++) {
		ASSERT_OK(push_pat(&q, sz[i], false, false, false, 262144, &wr));
		total += sz[i];
	}
	read_pat(&q, total, &rd);
	ASSERT_EQ_U64(q.mem, 0);
	ASSERT_EQ(q.n_spare, RX_SPARES);
	for (struct rx_chunk *c = q.spare; c; c = c->next)
		ASSERT_GE(c->cap, 30000); /* the 20000 one was the smallest: freed */
	ASSERT_OK(push_pat(&q, 45000, false, false, false, 262144, &wr));
	ASSERT_EQ(q.head->cap, 50000);
	ASSERT_EQ_U64(q.mem, 50000 + RX_CHUNK_OVERHEAD);
	ASSERT_EQ(q.n_spare, RX_SPARES - 1);
	/* A spare that would take the queue past its bound is not used: exact size instead. */
	ASSERT_OK(push_pat(&q, 59000, false, false, false, 22000, &wr));
	ASSERT_EQ(q.tail->cap, 59000);
	read_pat(&q, 45000 + 59000, &rd);
	vsock_rxq_free(&q);
	ASSERT_TRUE(q.spare == NULL && q.n_spare == 0);
}

TEST(small_payloads_merge_into_tail)
{
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0;

	for (int i = 0; i < 20; i++)
		ASSERT_OK(push_pat(&q, 10, false, false, false, 262144, &wr));
	ASSERT_EQ(nchunks(&q), 1);
	ASSERT_EQ(q.head->cap, RX_SMALL_CHUNK);
	ASSERT_EQ_U64(q.mem, RX_SMALL_CHUNK + RX_CHUNK_OVERHEAD);
	ASSERT_EQ(q.bytes, 200);
	/* A payload above VSOCK_GOOD_COPY_LEN gets its own chunk even if it would fit. */
	ASSERT_OK(push_pat(&q, VSOCK_GOOD_COPY_LEN + 1, false, false, false, 262144, &wr));
	ASSERT_EQ(nchunks(&q), 2);
	/* ... and a small one after it does not fit that exact chunk: a new small chunk. */
	ASSERT_OK(push_pat(&q, 5, false, false, false, 262144, &wr));
	ASSERT_EQ(nchunks(&q), 3);
	ASSERT_EQ(q.tail->cap, RX_SMALL_CHUNK);
	read_pat(&q, wr, &rd);
	ASSERT_EQ(q.bytes, 0);
	vsock_rxq_free(&q);
}

TEST(peek_does_not_consume)
{
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0;
	uint8_t b[50];
	struct iovec out = {b, sizeof(b)};
	struct iovec iov[4];

	ASSERT_OK(push_pat(&q, 40, false, false, false, 262144, &wr));
	ASSERT_OK(push_pat(&q, 200, false, false, false, 262144, &wr));
	ASSERT_EQ(vsock_rxq_read(&q, &out, 1, sizeof(b), true), sizeof(b));
	for (unsigned i = 0; i < sizeof(b); i++)
		ASSERT_EQ(b[i], (uint8_t)i);
	ASSERT_EQ(q.bytes, 240);

	/* Zero-copy view: one entry per non-empty chunk, limited by iovcnt. */
	ASSERT_EQ(vsock_rxq_peek_iov(&q, iov, 4), 240);
	ASSERT_EQ(iov[0].iov_len, 40);
	ASSERT_EQ(iov[1].iov_len, 200);
	ASSERT_EQ(((uint8_t *)iov[1].iov_base)[0], 40);
	ASSERT_EQ(vsock_rxq_peek_iov(&q, iov, 1), 40);

	/* Consuming without copying (iovcnt 0), as vsock_sock_rx_consume does. */
	ASSERT_EQ(vsock_rxq_read(&q, NULL, 0, 45, false), 45);
	rd = 45;
	ASSERT_EQ(q.bytes, 195);
	ASSERT_EQ(vsock_rxq_peek_iov(&q, iov, 4), 195);
	ASSERT_EQ(iov[0].iov_len, 195);
	read_pat(&q, 195, &rd);
	vsock_rxq_free(&q);
}

TEST(seqpacket_messages)
{
	struct vsock_rxq q = {0};
	uint32_t wr = 0, copied;
	uint8_t b[16];
	struct iovec out = {b, 3};
	bool eor;

	/* Message 1: 10 + 5 bytes, EOR. Message 2: 4 bytes, no EOR. Message 3: empty. */
	ASSERT_OK(push_pat(&q, 10, true, false, false, 262144, &wr));
	ASSERT_EQ(q.open_bytes, 10);
	ASSERT_OK(push_pat(&q, 5, true, true, true, 262144, &wr));
	ASSERT_EQ(q.open_bytes, 0);
	ASSERT_EQ(q.msgs, 1);
	ASSERT_OK(push_pat(&q, 4, true, true, false, 262144, &wr));
	ASSERT_EQ(nchunks(&q), 2); /* the first merged; nothing merges past an EOM */
	ASSERT_EQ(q.tail->cap, 4); /* a small payload ending a message gets an exact chunk */
	ASSERT_OK(vsock_rxq_push(&q, NULL, 0, 0, true, true, false, 262144));
	ASSERT_EQ(nchunks(&q), 3);
	ASSERT_EQ(q.msgs, 3);
	ASSERT_EQ(q.bytes, 19);

	/* Peek, truncated to the 3-byte buffer. */
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, true, &copied, &eor), 15);
	ASSERT_EQ(copied, 3);
	ASSERT_TRUE(eor);
	ASSERT_EQ(q.msgs, 3);
	/* Read: the whole message goes, however little was copied. */
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, false, &copied, &eor), 15);
	ASSERT_EQ(copied, 3);
	ASSERT_EQ(b[0], 0);
	ASSERT_EQ(b[2], 2);
	ASSERT_EQ(q.msgs, 2);
	ASSERT_EQ(q.bytes, 4);
	out.iov_len = sizeof(b);
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, false, &copied, &eor), 4);
	ASSERT_EQ(copied, 4);
	ASSERT_FALSE(eor);
	ASSERT_EQ(b[0], 15);
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, false, &copied, &eor), 0);
	ASSERT_EQ(q.msgs, 0);
	ASSERT_TRUE(q.head == NULL);
	ASSERT_EQ_U64(q.mem, 0);
	/* An open message behind a whole one: reading the whole one leaves it open. */
	ASSERT_OK(push_pat(&q, 4, true, true, false, 262144, &wr));
	ASSERT_OK(push_pat(&q, 6, true, false, false, 262144, &wr));
	ASSERT_OK(push_pat(&q, 7, true, false, false, 262144, &wr));
	ASSERT_EQ(q.open_bytes, 13);
	ASSERT_EQ(vsock_rxq_read_msg(&q, &out, 1, false, &copied, &eor), 4);
	ASSERT_EQ(q.open_bytes, 13);
	ASSERT_EQ(q.bytes, 13);
	vsock_rxq_free(&q);
	ASSERT_EQ(q.open_bytes, 0);
}

TEST(seqpacket_memory_bound_counts_chunk_overhead)
{
	const uint32_t rx_limit = 4096;
	uint64_t limit = vsock_rxq_mem_limit(rx_limit);
	struct vsock_rxq q = {0};
	uint32_t wr = 0, n = 0;
	int r;

	ASSERT_EQ_U64(limit, 2ull * rx_limit + VSOCK_MAX_PKT_PAYLOAD + 2ull * RX_CHUNK_OVERHEAD);
	/* 1-byte messages: each costs a chunk, so the bound is hit long before the credit. */
	for (;;) {
		uint64_t mem = q.mem;

		r = push_pat(&q, 1, true, true, false, rx_limit, &wr);
		if (r < 0) {
			ASSERT_EQ(r, -ENOBUFS);
			ASSERT_EQ_U64(q.mem, mem); /* unchanged on error */
			break;
		}
		n++;
		ASSERT_LE(q.mem, limit);
	}
	ASSERT_EQ(q.msgs, n);
	ASSERT_EQ_U64(q.mem, (uint64_t)n * (1 + RX_CHUNK_OVERHEAD));
	ASSERT_GT(q.mem + 1 + RX_CHUNK_OVERHEAD, limit);
	vsock_rxq_free(&q);
	ASSERT_EQ(q.msgs, 0);
	ASSERT_EQ(q.bytes, 0);
	ASSERT_EQ_U64(q.mem, 0);
}

TEST(stream_compacts_instead_of_hitting_the_bound)
{
	const uint32_t rx_limit = 65536;
	uint64_t limit = vsock_rxq_mem_limit(rx_limit);
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0;
	bool compacted = false;

	/*
	 * 1-byte payloads alternating with ones just above the merge threshold: each small one
	 * starts an RX_SMALL_CHUNK chunk that the next (too big to merge) one leaves almost empty,
	 * the worst waste a STREAM peer can cause within its credit.
	 */
	for (uint32_t i = 0; q.bytes + VSOCK_GOOD_COPY_LEN + 1 <= rx_limit; i++) {
		uint32_t len = i % 2 ? VSOCK_GOOD_COPY_LEN + 1 : 1;
		unsigned before = nchunks(&q);

		ASSERT_OK(push_pat(&q, len, false, false, false, rx_limit, &wr));
		ASSERT_LE(q.mem, limit);
		if (nchunks(&q) < before)
			compacted = true;
	}
	ASSERT_TRUE(compacted);
	ASSERT_EQ(q.bytes, wr);
	read_pat(&q, wr, &rd);
	ASSERT_EQ(q.bytes, 0);
	vsock_rxq_free(&q);
}

TEST(free_releases_everything)
{
	struct vsock_rxq q = {0};
	uint32_t wr = 0, rd = 0;

	ASSERT_OK(push_pat(&q, 3000, false, false, false, 262144, &wr));
	read_pat(&q, 3000, &rd); /* leaves a spare */
	ASSERT_OK(push_pat(&q, 20, false, false, false, 262144, &wr));
	ASSERT_OK(push_pat(&q, 3500, false, false, false, 262144, &wr)); /* the spare is too small */
	ASSERT_TRUE(q.spare != NULL);
	vsock_rxq_free(&q);
	ASSERT_TRUE(q.head == NULL && q.tail == NULL && q.spare == NULL);
	ASSERT_EQ(q.bytes, 0);
	ASSERT_EQ_U64(q.mem, 0);
	/* The queue is usable again. */
	ASSERT_OK(push_pat(&q, 20, false, false, false, 262144, &wr));
	ASSERT_EQ(q.bytes, 20);
	vsock_rxq_free(&q);
}

TEST_MAIN()
