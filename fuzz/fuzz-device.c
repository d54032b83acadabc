/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the device role end to end, through the public device API only
 * (<uvsock/device.h>): two external-loop devices (UVSOCK_DEV_EXTERNAL_LOOP) linked as siblings,
 * each with memfd guest RAM and split rings the target lays out in it, their host sides on real
 * Unix sockets in a temporary directory. The input is a little program run against them: hostile
 * TX chains (descriptor tables, lengths, flags, indirect tables, addresses, headers, CIDs,
 * ports), RX buffers, avail index jumps, host programs connecting, writing, reading and closing,
 * host listeners for guest connects, queue restarts, bad queue parameters, guest driver resets,
 * and freeing one sibling while the other runs. After every step both devices run
 * (uvsock_dev_process) until they are idle and the used rings are checked.
 *
 * Invariants checked (abort on violation), on every guest whose rings the input did not make
 * unreadable to the target (an avail index jump or a buffer placed over the rings: until its
 * next reset):
 *   - a used element names a chain the guest made available and the device has not returned
 *     yet, and the used index never moves past what was made available;
 *   - every used length is at most the chain's writable length (0 for a TX chain that has no
 *     writable descriptor);
 *   - a packet in a guest's RX buffer is a whole packet (used length 0, or header + its len)
 *     with dst_cid the guest's CID and src_cid the host (2) or the sibling's CID (routing);
 *   - the number of open file descriptors of the process after an input is what it was before
 *     (no fd leak), and the devices removed every socket file they created.
 *
 * One input runs in well under 10 ms: at most FZ_MAX_STEPS steps, small rings, and no waiting.
 * The devices' timers (2 s CONNECT limit, connect and close timeouts) never come due within an
 * input, so a run does not depend on real time (only the host-side port numbers the engine
 * picks at random, which the "reply" step copies from what the guest received).
 *
 * Input layout: byte 0 features and queue size (bit 0 INDIRECT_DESC, bit 1 EVENT_IDX, bit 2
 * SEQPACKET, bits 3-7 log2(num) % 9, so num is 1 .. 256); byte 1 the devices (bits 0-1 the CID
 * pair, bits 2-3 max_conns 1024/1/2/8, bit 4 buf_alloc 4096, bit 5 not linked); then steps, a
 * command byte (step(): TX packet, TX reply to the last packet received, RX buffers, host
 * connect, host write/read/shutdown/close, host listen, host accept, queue restart, reset,
 * avail index jump, free the sibling, just run) and its arguments. FUZZ_DEVICE_VERBOSE=1
 * prints each device's counters at the end of an input (for writing seeds).
 */
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "fuzz-input.h"
#include "util/log.h"
#include "vring/vring.h"
#include "vsock/hdr.h"

/*
 * Guest-physical layout of each guest's RAM (FZ_RAM bytes from 0):
 *   0x00000 RX ring      0x04000 TX ring (each at most 256 entries, vring_layout())
 *   0x10000 RX indirect tables, 0x20000 TX indirect tables (256 bytes, 16 entries, per slot)
 *   0x30000 RX buffers (FZ_RXSLOT bytes per descriptor slot)
 *   0x70000 scratch (RX buffers the input places anywhere in it; their content is not checked)
 *   0x80000 TX buffers (packets; the input places them anywhere in this area)
 */
#define FZ_RAM 0x100000u
#define FZ_RING_GPA(q) ((uint64_t)(q) * 0x4000u)
#define FZ_RING_AREA 0x4000u
#define FZ_INDIR_GPA(q, slot) (0x10000u + (uint64_t)(q) * 0x10000u + (uint64_t)(slot) * 256u)
#define FZ_INDIR_MAX 16u
#define FZ_RXSLOT 1024u
#define FZ_RXBUF_GPA(slot) (0x30000u + (uint64_t)(slot) * FZ_RXSLOT)
#define FZ_SCRATCH_GPA 0x70000u
#define FZ_SCRATCH_SIZE 0x10000u
#define FZ_TXBUF_GPA 0x80000u
#define FZ_TXBUF_SIZE 0x80000u

#define FZ_NUM_MAX 256u
#define FZ_CHAIN_MAX 4u     /* descriptors of one chain the target builds */
#define FZ_SEG_MAX 16u      /* writable segments remembered per chain */
#define FZ_NHOST 16u        /* host program sockets */
#define FZ_NLISTEN 4u       /* host listeners for guest connects */
#define FZ_MAX_STEPS 64
#define FZ_SETTLE_ROUNDS 16
#define FZ_PAYLOAD_MAX 4096u

/* A chain the guest made available, indexed by its head. */
struct fz_chain {
	bool out;                      /* made available, not returned yet */
	uint8_t nslots;
	uint16_t slots[FZ_CHAIN_MAX];  /* descriptor slots it holds */
	uint64_t wlen;                 /* writable bytes, walked as the device would */
	bool checked;                  /* content readable back: every buffer in its own slot */
	unsigned nseg;
	uint64_t seg_gpa[FZ_SEG_MAX];
	uint32_t seg_len[FZ_SEG_MAX];
};

struct fz_queue {
	unsigned num;
	struct vring_desc_le *desc;
	struct vring_avail_le *avail;
	struct vring_used_le *used;
	bool slot_busy[FZ_NUM_MAX];
	struct fz_chain ch[FZ_NUM_MAX];
	uint16_t avail_idx, last_used;
	unsigned outstanding;
};

struct fz_guest {
	int memfd;
	uint8_t *ram;
	int kick[2], call[2];
	struct uvsock_dev *dev;        /* NULL once freed */
	uint32_t cid;
	char uds[128];
	struct fz_queue q[2];
	bool unchecked;                /* the input made the rings unreadable to us until reset */
	bool have_last_rx;
	struct vsock_hdr last_rx;
	uint32_t fwd_cnt;              /* payload bytes received, sent back as fwd_cnt */
	uint32_t tx_cursor;
};

struct fz {
	struct fz_in in;
	struct fz_guest g[2];
	uint64_t features;
	unsigned num;
	int host[FZ_NHOST];
	int lis[FZ_NLISTEN];
	char lis_path[FZ_NLISTEN][160];
};

static struct fz fz;
static char fz_dir[64];

/* At exit, also in the middle of an input (libFuzzer's time limit): the socket files too. */
static void fz_cleanup(void)
{
	if (fz_dir[0]) {
		fz_dir_clean(fz_dir);
		(void)rmdir(fz_dir);
	}
}

static bool dir_empty(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	bool empty = true;

	FZ_CHECK(d != NULL);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			fprintf(stderr, "fuzz-device: left behind: %s/%s\n", path, de->d_name);
			empty = false;
		}
	closedir(d);
	return empty;
}

/* Guest RAM and eventfds live for the whole process (they are not what is being tested). */
static void init_once(void)
{
	static bool done;

	if (done)
		return;
	done = true;
	log_set_level(LOG_LVL_ERROR);
	snprintf(fz_dir, sizeof(fz_dir), "/tmp/uvsock-fuzz-XXXXXX");
	FZ_CHECK(mkdtemp(fz_dir) != NULL);
	atexit(fz_cleanup);
	for (unsigned i = 0; i < 2; i++) {
		struct fz_guest *g = &fz.g[i];

		g->memfd = memfd_create("fuzz-guest-ram", MFD_CLOEXEC);
		FZ_CHECK(g->memfd >= 0 && ftruncate(g->memfd, FZ_RAM) == 0);
		g->ram = mmap(NULL, FZ_RAM, PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd, 0);
		FZ_CHECK(g->ram != MAP_FAILED);
		for (unsigned q = 0; q < 2; q++) {
			g->kick[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
			g->call[q] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
			FZ_CHECK(g->kick[q] >= 0 && g->call[q] >= 0);
		}
	}
}

static void drain_eventfd(int fd)
{
	uint64_t v;

	(void)!read(fd, &v, sizeof(v));
}

/* ---- rings ------------------------------------------------------------------------------ */

static struct uvsock_dev_queue queue_params(struct fz_guest *g, unsigned qi, uint16_t last_avail)
{
	struct vring_layout l;

	FZ_CHECK(vring_layout(fz.num, &l) == 0 && l.total <= FZ_RING_AREA);
	return (struct uvsock_dev_queue){
		.size = sizeof(struct uvsock_dev_queue),
		.num = fz.num,
		.desc_addr = FZ_RING_GPA(qi) + l.desc_off,
		.avail_addr = FZ_RING_GPA(qi) + l.avail_off,
		.used_addr = FZ_RING_GPA(qi) + l.used_off,
		.last_avail_idx = last_avail,
		.kick_fd = g->kick[qi],
		.call_fd = g->call[qi],
	};
}

/* Fresh rings in zeroed RAM and the device told about them (at creation and after a reset). */
static void guest_start(struct fz_guest *g)
{
	struct uvsock_dev_mem_region r = { .guest_phys_addr = 0, .size = FZ_RAM, .fd = g->memfd };

	memset(g->ram, 0, FZ_RAM);
	memset(g->q, 0, sizeof(g->q));
	g->unchecked = false;
	g->have_last_rx = false;
	g->fwd_cnt = 0;
	g->tx_cursor = 0;
	for (unsigned qi = 0; qi < 2; qi++) {
		struct uvsock_dev_queue p = queue_params(g, qi, 0);
		struct fz_queue *q = &g->q[qi];

		drain_eventfd(g->kick[qi]);
		drain_eventfd(g->call[qi]);
		q->num = fz.num;
		q->desc = (void *)(g->ram + p.desc_addr);
		q->avail = (void *)(g->ram + p.avail_addr);
		q->used = (void *)(g->ram + p.used_addr);
	}
	FZ_CHECK(uvsock_dev_set_features(g->dev, fz.features) == 0);
	FZ_CHECK(uvsock_dev_set_mem_table(g->dev, &r, 1) == 0);
	for (unsigned qi = 0; qi < 2; qi++) {
		struct uvsock_dev_queue p = queue_params(g, qi, 0);

		FZ_CHECK(uvsock_dev_queue_start(g->dev, qi, &p) == 0);
	}
}

static int alloc_slot(struct fz_queue *q)
{
	for (unsigned i = 0; i < q->num; i++)
		if (!q->slot_busy[i]) {
			q->slot_busy[i] = true;
			return (int)i;
		}
	return -1;
}

/* Reads descriptor i of the table at gpa (any alignment); false if it is outside RAM. */
static bool read_desc(struct fz_guest *g, uint64_t gpa, unsigned i, struct vring_desc_le *d)
{
	uint64_t at = gpa + (uint64_t)i * sizeof(*d);

	if (gpa >= FZ_RAM || at < gpa || at >= FZ_RAM || FZ_RAM - at < sizeof(*d))
		return false;
	memcpy(d, g->ram + at, sizeof(*d));
	return true;
}

/* True if the buffer is one RX slot's own data area, of a slot the chain holds. */
static bool own_rx_buffer(const struct fz_chain *c, uint64_t addr, uint32_t len)
{
	uint64_t slot;

	if (len > FZ_RXSLOT || addr < FZ_RXBUF_GPA(0) || (addr - FZ_RXBUF_GPA(0)) % FZ_RXSLOT)
		return false;
	slot = (addr - FZ_RXBUF_GPA(0)) / FZ_RXSLOT;
	for (unsigned k = 0; k < c->nslots; k++)
		if (c->slots[k] == slot)
			return true;
	return false;
}

/*
 * Walks the chain at head as the device would (virtio 1.2 §2.7.5.3.2, §2.7.7) and records its
 * writable length and segments. Malformed chains are walked as far as they go (the device
 * rejects them; their writable length is still an upper bound). An RX chain that visits a
 * descriptor twice, has a readable buffer, or a buffer outside its own slots is not checked.
 */
static void walk_chain(struct fz_guest *g, struct fz_queue *q, struct fz_chain *c, uint16_t head,
		       bool rx)
{
	uint64_t tbl = (uint64_t)((uint8_t *)q->desc - g->ram);
	unsigned size = q->num, i = head, steps = 0;
	uint8_t visits[FZ_NUM_MAX] = { 0 };
	bool indirect = false;

	c->wlen = 0;
	c->nseg = 0;
	c->checked = rx;
	while (i < size && steps++ < 2 * FZ_NUM_MAX + 64) {
		struct vring_desc_le dp;
		uint16_t flags;
		uint64_t addr;
		uint32_t len;

		if (!read_desc(g, tbl, i, &dp))
			break;
		flags = le16toh(dp.flags);
		addr = le64toh(dp.addr);
		len = le32toh(dp.len);
		if (!indirect && (flags & VRING_DESC_F_INDIRECT)) {
			tbl = addr;
			size = len / 16;
			indirect = true;
			i = 0;
			continue;
		}
		if (visits[i % FZ_NUM_MAX]++)
			c->checked = false;
		if (flags & VRING_DESC_F_WRITE) {
			c->wlen += len;
			if (!own_rx_buffer(c, addr, len))
				c->checked = false;
			if (c->nseg < FZ_SEG_MAX) {
				c->seg_gpa[c->nseg] = addr;
				c->seg_len[c->nseg++] = len;
			} else {
				c->checked = false;
			}
		} else {
			c->checked = false;
		}
		if (!(flags & VRING_DESC_F_NEXT))
			return;
		i = le16toh(dp.next);
	}
	if (steps > 2 * FZ_NUM_MAX + 64)
		c->checked = false;
}

/* Makes the chain at head available and kicks. */
static void publish(struct fz_guest *g, unsigned qi, unsigned head)
{
	struct fz_queue *q = &g->q[qi];
	uint64_t one = 1;

	walk_chain(g, q, &q->ch[head], (uint16_t)head, qi == UVSOCK_DEV_QUEUE_RX);
	q->ch[head].out = true;
	q->outstanding++;
	q->avail->ring[q->avail_idx % q->num] = htole16((uint16_t)head);
	q->avail_idx++;
	__atomic_store_n(&q->avail->idx, htole16(q->avail_idx), __ATOMIC_RELEASE);
	(void)!write(g->kick[qi], &one, sizeof(one));
}

/* One descriptor as the target builds it, hostile as `how` says. */
struct fz_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
};

/*
 * Builds a chain of n descriptors in free slots (or in the head slot's indirect table) and
 * publishes it. how: bit 0 raw next fields (another slot of the chain: loops; or past the
 * table), bit 1 raw flags, bit 2 indirect, bit 3 raw indirect length. Returns false when the
 * queue has no free slot.
 */
static bool build_chain(struct fz_guest *g, unsigned qi, const struct fz_desc *d, unsigned n,
			uint8_t how)
{
	struct fz_queue *q = &g->q[qi];
	struct fz_in *in = &fz.in;
	uint16_t slots[FZ_CHAIN_MAX];
	unsigned ns = n; /* indirect too: the buffers stay in slots the chain holds */
	struct vring_desc_le *tbl;
	struct fz_chain *c;

	for (unsigned k = 0; k < ns; k++) {
		int s = alloc_slot(q);

		if (s < 0) {
			for (unsigned j = 0; j < k; j++)
				q->slot_busy[slots[j]] = false;
			return false;
		}
		slots[k] = (uint16_t)s;
	}
	c = &q->ch[slots[0]];
	memset(c, 0, sizeof(*c));
	c->nslots = (uint8_t)ns;
	memcpy(c->slots, slots, sizeof(slots[0]) * ns);
	tbl = (how & 4) ? (void *)(g->ram + FZ_INDIR_GPA(qi, slots[0])) : NULL;
	for (unsigned k = 0; k < n; k++) {
		struct vring_desc_le *dp = tbl ? &tbl[k] : &q->desc[slots[k]];
		uint16_t flags = d[k].flags, next = 0;

		if (k + 1 < n) {
			flags |= VRING_DESC_F_NEXT;
			next = tbl ? (uint16_t)(k + 1) : slots[k + 1];
		}
		if (how & 1) {
			uint8_t b = fz_u8(in);

			if (b & 0x80)
				next = (uint16_t)((tbl ? n : q->num) + (b & 0x7f));
			else
				next = tbl ? (uint16_t)(b % n) : slots[b % n];
		}
		if (how & 2)
			flags = fz_u8(in) & 7;
		dp->addr = htole64(d[k].addr);
		dp->len = htole32(d[k].len);
		dp->flags = htole16(flags);
		dp->next = htole16(next);
	}
	if (tbl) {
		struct vring_desc_le *hd = &q->desc[slots[0]];
		uint32_t len = (how & 8) ? fz_u8(in) : 16 * n;

		hd->addr = htole64(FZ_INDIR_GPA(qi, slots[0]));
		hd->len = htole32(len);
		hd->flags = htole16(VRING_DESC_F_INDIRECT);
		hd->next = 0;
	}
	publish(g, qi, slots[0]);
	return true;
}

/* Returns a chain's slots (it came back in the used ring). */
static void chain_done(struct fz_queue *q, struct fz_chain *c)
{
	for (unsigned k = 0; k < c->nslots; k++)
		q->slot_busy[c->slots[k]] = false;
	c->out = false;
	q->outstanding--;
}

/* Copies up to n bytes of what the device wrote into chain c. */
static size_t gather(struct fz_guest *g, const struct fz_chain *c, uint8_t *buf, size_t n)
{
	size_t got = 0;

	for (unsigned s = 0; s < c->nseg && got < n; s++) {
		size_t take = c->seg_len[s] < n - got ? c->seg_len[s] : n - got;

		memcpy(buf + got, g->ram + c->seg_gpa[s], take);
		got += take;
	}
	return got;
}

static uint32_t sibling_cid(const struct fz_guest *g)
{
	return fz.g[g == &fz.g[0]].cid;
}

static void check_rx_packet(struct fz_guest *g, const struct fz_chain *c, uint32_t len)
{
	uint8_t wire[VSOCK_HDR_SIZE];
	struct vsock_hdr h;

	FZ_CHECK(len == 0 || len >= VSOCK_HDR_SIZE);
	if (len == 0)
		return;
	FZ_CHECK(gather(g, c, wire, sizeof(wire)) == sizeof(wire));
	vsock_hdr_decode(wire, &h);
	if (h.dst_cid != g->cid || (h.src_cid != VMADDR_CID_HOST && h.src_cid != sibling_cid(g)) ||
	    (uint64_t)VSOCK_HDR_SIZE + h.len != len)
		fprintf(stderr, "fuzz-device: guest %u got op %u src %llu:%u dst %llu:%u len %u in %u\n",
			g->cid, h.op, (unsigned long long)h.src_cid, h.src_port,
			(unsigned long long)h.dst_cid, h.dst_port, h.len, len);
	FZ_CHECK(h.dst_cid == g->cid);
	FZ_CHECK(h.src_cid == VMADDR_CID_HOST || h.src_cid == sibling_cid(g));
	FZ_CHECK((uint64_t)VSOCK_HDR_SIZE + h.len == len);
	g->last_rx = h;
	g->have_last_rx = true;
	if (h.op == VSOCK_OP_RW)
		g->fwd_cnt += h.len;
}

/* Takes what the device returned in the used rings, checking it. */
static void harvest(struct fz_guest *g)
{
	if (g->unchecked)
		return;
	for (unsigned qi = 0; qi < 2; qi++) {
		struct fz_queue *q = &g->q[qi];
		uint16_t idx = le16toh(__atomic_load_n(&q->used->idx, __ATOMIC_ACQUIRE));

		FZ_CHECK((uint16_t)(idx - q->last_used) <= q->outstanding);
		for (; q->last_used != idx; q->last_used++) {
			const struct vring_used_elem_le *e = &q->used->ring[q->last_used % q->num];
			uint32_t id = le32toh(e->id), len = le32toh(e->len);

			FZ_CHECK(id < q->num && q->ch[id].out);
			FZ_CHECK(len <= q->ch[id].wlen);
			if (qi == UVSOCK_DEV_QUEUE_RX && q->ch[id].checked)
				check_rx_packet(g, &q->ch[id], len);
			chain_done(q, &q->ch[id]);
		}
	}
}

static bool dev_busy(struct uvsock_dev *d)
{
	struct pollfd p = { .fd = uvsock_dev_fd(d), .events = POLLIN };

	return uvsock_dev_timeout_ms(d) == 0 || poll(&p, 1, 0) > 0;
}

/* Runs both devices until neither has work left (bounded), checking the rings after each pass. */
static void settle(void)
{
	for (int round = 0; round < FZ_SETTLE_ROUNDS; round++) {
		bool busy = false;

		for (unsigned i = 0; i < 2; i++) {
			struct fz_guest *g = &fz.g[i];

			if (!g->dev)
				continue;
			FZ_CHECK(uvsock_dev_process(g->dev) == 0);
			harvest(g);
		}
		for (unsigned i = 0; i < 2; i++)
			busy |= fz.g[i].dev && dev_busy(fz.g[i].dev);
		if (!busy)
			break;
	}
}

/* ---- guest steps ------------------------------------------------------------------------ */

static uint32_t pick_cid(struct fz_guest *g, uint8_t mode)
{
	switch (mode % 4) {
	case 0: return VMADDR_CID_HOST;
	case 1: return sibling_cid(g);
	case 2: return g->cid;
	default: return fz_u32(&fz.in);
	}
}

static uint32_t pick_port(uint8_t b)
{
	switch (b >> 6) {
	case 0: return 1024 + (b & 3);       /* the host listeners' ports */
	case 1: return (1u << 30) + (b & 3); /* where host-side ports start */
	case 2: return 5000 + (b & 3);       /* guest listeners' ports (the seeds use 5000) */
	default: return fz_u32(&fz.in);
	}
}

/* A header from the input; reply: answer the last packet the guest received. */
static void make_hdr(struct fz_guest *g, struct vsock_hdr *h, bool reply)
{
	struct fz_in *in = &fz.in;
	uint8_t sel = fz_u8(in);

	*h = (struct vsock_hdr){
		.src_cid = (sel & 0x80) ? pick_cid(g, fz_u8(in)) : g->cid,
		.type = (sel & 0x40) ? fz_u16(in) : (uint16_t)(1 + (sel & 1)),
		.op = (uint16_t)(fz_u8(in) % 9),
		.flags = (sel & 0x20) ? fz_u32(in) : fz_u8(in) % 4,
		.buf_alloc = (sel & 0x10) ? fz_u32(in) : 65536,
		.fwd_cnt = (sel & 0x08) ? fz_u32(in) : g->fwd_cnt,
	};
	if (reply && g->have_last_rx) {
		h->dst_cid = g->last_rx.src_cid;
		h->dst_port = g->last_rx.src_port;
		h->src_port = g->last_rx.dst_port;
		h->type = g->last_rx.type;
	} else {
		h->dst_cid = pick_cid(g, fz_u8(in));
		h->src_port = pick_port(fz_u8(in));
		h->dst_port = pick_port(fz_u8(in));
	}
}

/* Where a TX buffer goes: the next free stretch of the TX area, or (hostile) anywhere. */
static uint64_t tx_addr(struct fz_guest *g, uint8_t mode, uint32_t len)
{
	uint64_t a;

	switch (mode % 8) {
	case 5: return FZ_RAM - (fz_u8(&fz.in) % 64);         /* straddles the end of RAM */
	case 6: return fz_u64(&fz.in);                       /* anywhere, wrapping included */
	case 7: return FZ_RING_GPA(0) + fz_u16(&fz.in) % FZ_RAM; /* over the rings (read only) */
	default:
		if (g->tx_cursor + (uint64_t)len > FZ_TXBUF_SIZE)
			g->tx_cursor = 0;
		a = FZ_TXBUF_GPA + g->tx_cursor;
		g->tx_cursor = (g->tx_cursor + len + 7) & ~7u;
		return a;
	}
}

/*
 * TX: one packet. Arguments: guest, chain shape (descriptor count, hostile bits), header,
 * payload length (and a lying len field), payload bytes, where the header/payload split.
 */
static void step_tx(bool reply)
{
	struct fz_in *in = &fz.in;
	uint8_t sel = fz_u8(in), how = fz_u8(in);
	struct fz_guest *g = &fz.g[sel & 1];
	unsigned n = 1 + (sel >> 1) % FZ_CHAIN_MAX;
	uint8_t pkt[VSOCK_HDR_SIZE + FZ_PAYLOAD_MAX];
	struct fz_desc d[FZ_CHAIN_MAX];
	struct vsock_hdr h;
	const uint8_t *pl;
	size_t plen, off = 0;
	uint32_t total;

	make_hdr(g, &h, reply);
	pl = fz_bytes(in, fz_u16(in) % (FZ_PAYLOAD_MAX + 1), &plen);
	h.len = (how & 0x10) ? fz_u32(in) : (uint32_t)plen;
	vsock_hdr_encode(&h, pkt);
	memcpy(pkt + VSOCK_HDR_SIZE, pl, plen);
	total = VSOCK_HDR_SIZE + (uint32_t)plen;
	if (!g->dev || g->unchecked)
		return;
	for (unsigned k = 0; k < n; k++) {
		uint32_t len = k + 1 == n ? total - (uint32_t)off
					  : (uint32_t)((total - off) * fz_u8(in) / 255);
		uint8_t mode = (how & 0x20) ? fz_u8(in) : 0;

		d[k] = (struct fz_desc){ .addr = tx_addr(g, mode, len), .len = len };
		if (mode % 8 < 5)
			memcpy(g->ram + d[k].addr, pkt + off, len);
		if ((how & 0x40) && k + 1 == n)
			d[k].len = fz_u32(in);
		off += len;
	}
	if (!build_chain(g, UVSOCK_DEV_QUEUE_TX, d, n, how & 0xf))
		return;
	settle();
}

/*
 * RX: post count buffers. Arguments: guest and count, shape, then per buffer its descriptor
 * lengths (and, hostile, addresses anywhere in the scratch area, past RAM, or over the rings).
 */
static void step_rx(void)
{
	struct fz_in *in = &fz.in;
	uint8_t sel = fz_u8(in), how = fz_u8(in);
	struct fz_guest *g = &fz.g[sel & 1];
	unsigned count = 1 + (sel >> 1) % 32, n = 1 + (how >> 4) % FZ_CHAIN_MAX;

	if (!g->dev || g->unchecked)
		return;
	for (unsigned b = 0; b < count; b++) {
		struct fz_queue *q = &g->q[UVSOCK_DEV_QUEUE_RX];
		struct fz_desc d[FZ_CHAIN_MAX];
		unsigned first = 0;

		/* The slots build_chain() will take: the lowest free ones, in order. */
		for (unsigned k = 0; k < n; k++) {
			uint8_t lb = (how & 0x80) ? fz_u8(in) : 0xff;
			uint64_t addr;

			while (first < q->num && q->slot_busy[first])
				first++;
			addr = FZ_RXBUF_GPA(first < q->num ? first : 0);
			first++;
			d[k] = (struct fz_desc){ .addr = addr, .len = lb == 0xff ? FZ_RXSLOT : lb * 4u,
						 .flags = VRING_DESC_F_WRITE };
			if (lb % 16 == 1) {
				switch (fz_u8(in) % 4) {
				case 0: d[k].addr = FZ_SCRATCH_GPA + fz_u16(in) % FZ_SCRATCH_SIZE; break;
				case 1: d[k].addr = FZ_RAM - fz_u8(in) % 64; break;
				case 2: d[k].addr = fz_u64(in) | 0x100000000ull; break;
				default:
					d[k].addr = fz_u16(in) % (2 * FZ_RING_AREA);
					g->unchecked = true; /* the device may write over the rings */
				}
				d[k].len = fz_u16(in);
			}
		}
		if (!build_chain(g, UVSOCK_DEV_QUEUE_RX, d, n, how & 0xf))
			break;
	}
	settle();
}

/* Hostile avail index: jumps past what the ring holds (the device must mark itself broken). */
static void step_avail_jump(void)
{
	uint8_t sel = fz_u8(&fz.in);
	struct fz_guest *g = &fz.g[sel & 1];
	struct fz_queue *q = &g->q[(sel >> 1) & 1];
	uint64_t one = 1;

	if (!g->dev)
		return;
	g->unchecked = true;
	q->avail_idx += fz_u16(&fz.in);
	__atomic_store_n(&q->avail->idx, htole16(q->avail_idx), __ATOMIC_RELEASE);
	(void)!write(g->kick[(sel >> 1) & 1], &one, sizeof(one));
	settle();
}

/* Stops a queue and starts it again where it stopped, maybe trying bad parameters in between. */
static void step_restart(void)
{
	struct fz_in *in = &fz.in;
	uint8_t sel = fz_u8(in);
	struct fz_guest *g = &fz.g[sel & 1];
	unsigned qi = (sel >> 1) & 1;
	uint16_t last;

	if (!g->dev)
		return;
	FZ_CHECK(uvsock_dev_queue_stop(g->dev, qi, &last) == 0);
	if (sel & 4) {
		struct uvsock_dev_queue p = queue_params(g, qi, last);

		p.num = (sel & 8) ? fz_u16(in) : p.num;
		p.desc_addr += (sel & 16) ? fz_u64(in) : 0;
		p.avail_addr += (sel & 32) ? fz_u32(in) : 0;
		p.used_addr += (sel & 64) ? fz_u32(in) : 0;
		p.flags = (sel & 128) ? fz_u8(in) : 0;
		if (uvsock_dev_queue_start(g->dev, qi, &p) == 0) {
			/* Valid by chance: the ring is where we do not look any more. */
			g->unchecked = true;
			FZ_CHECK(uvsock_dev_queue_stop(g->dev, qi, &last) == 0);
		}
	}
	{
		struct uvsock_dev_queue p = queue_params(g, qi, last);

		FZ_CHECK(uvsock_dev_queue_start(g->dev, qi, &p) == 0);
	}
	settle();
}

static void step_reset(void)
{
	struct fz_guest *g = &fz.g[fz_u8(&fz.in) & 1];

	if (!g->dev)
		return;
	FZ_CHECK(uvsock_dev_reset(g->dev) == 0);
	guest_start(g);
	settle();
}

/* Frees the second device while the first runs on (its guest's packets to it get RSTs). */
static void step_free_sibling(void)
{
	if (!fz.g[1].dev)
		return;
	uvsock_dev_free(fz.g[1].dev);
	fz.g[1].dev = NULL;
	settle();
}

/* ---- host steps ------------------------------------------------------------------------- */

static int free_host_slot(void)
{
	for (unsigned i = 0; i < FZ_NHOST; i++)
		if (fz.host[i] < 0)
			return (int)i;
	return -1;
}

/* A host program connects to a device's <uds> (stream) or <uds>_seqpacket. */
static void step_host_connect(void)
{
	uint8_t sel = fz_u8(&fz.in);
	struct fz_guest *g = &fz.g[sel & 1];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	bool seq = sel & 2;
	int slot = free_host_slot(), fd;

	if (slot < 0 || !g->dev)
		return;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s%s", g->uds, seq ? "_seqpacket" : "");
	fd = socket(AF_UNIX, (seq ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	FZ_CHECK(fd >= 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return;
	}
	fz.host[slot] = fd;
	settle();
}

/* A host listener at <uds>_<port> for guest connects. */
static void step_host_listen(void)
{
	uint8_t sel = fz_u8(&fz.in);
	struct fz_guest *g = &fz.g[sel & 1];
	unsigned i = (sel >> 1) % FZ_NLISTEN;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	bool seq = sel & 8;
	int fd;

	if (fz.lis[i] >= 0)
		return;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s_%u", g->uds, 1024 + i);
	memcpy(fz.lis_path[i], sa.sun_path, sizeof(sa.sun_path));
	fd = socket(AF_UNIX, (seq ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	FZ_CHECK(fd >= 0);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0) {
		close(fd);
		return;
	}
	fz.lis[i] = fd;
}

static void step_host_accept(void)
{
	int i = fz_u8(&fz.in) % FZ_NLISTEN, slot = free_host_slot(), fd;

	if (fz.lis[i] < 0 || slot < 0)
		return;
	fd = accept4(fz.lis[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0)
		return;
	fz.host[slot] = fd;
	settle();
}

/* Write (bytes from the input), read everything there is, half-close or close a host socket. */
static void step_host_io(void)
{
	struct fz_in *in = &fz.in;
	uint8_t sel = fz_u8(in);
	int *fd = &fz.host[sel % FZ_NHOST];
	static uint8_t buf[65536];
	const uint8_t *p;
	size_t n;

	switch ((sel >> 4) % 4) {
	case 0:
		p = fz_bytes(in, fz_u8(in), &n);
		if (*fd >= 0)
			(void)!send(*fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		break;
	case 1:
		while (*fd >= 0 && recv(*fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
			;
		break;
	case 2:
		if (*fd >= 0)
			(void)shutdown(*fd, SHUT_WR);
		break;
	default:
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
	}
	settle();
}

static void step(void)
{
	switch (fz_u8(&fz.in) % 12) {
	case 0: step_tx(false); break;
	case 1: step_tx(true); break;
	case 2: step_rx(); break;
	case 3: step_host_connect(); break;
	case 4: step_host_io(); break;
	case 5: step_host_listen(); break;
	case 6: step_host_accept(); break;
	case 7: step_restart(); break;
	case 8: step_reset(); break;
	case 9: step_avail_jump(); break;
	case 10: step_free_sibling(); break;
	default: settle(); break;
	}
}

/* FUZZ_DEVICE_VERBOSE=1: what an input did, for writing seeds. */
static void print_stats(struct fz_guest *g)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };

	uvsock_dev_get_stats(g->dev, &st);
	fprintf(stderr,
		"fuzz-device: cid %u: tx %llu/%llu rx %llu/%llu dropped %llu ring_errors %llu "
		"conns %llu/%llu refused %llu broken %d\n",
		g->cid, (unsigned long long)st.tx_pkts, (unsigned long long)st.tx_bytes,
		(unsigned long long)st.rx_pkts, (unsigned long long)st.rx_bytes,
		(unsigned long long)st.dropped, (unsigned long long)st.ring_errors,
		(unsigned long long)st.conns_open, (unsigned long long)st.conns_total,
		(unsigned long long)st.host_connects_refused, st.broken);
}

/* ---- one input -------------------------------------------------------------------------- */

static void devices_new(uint8_t sel)
{
	static const uint32_t cids[][2] = { { 3, 4 }, { 4, 3 }, { 100, 0xfffffffe }, { 3, 1000 } };
	static const uint32_t conns[] = { 0, 1, 2, 8 };

	for (unsigned i = 0; i < 2; i++) {
		struct fz_guest *g = &fz.g[i];
		struct uvsock_dev_config cfg = {
			.size = sizeof(cfg),
			.guest_cid = cids[sel % 4][i],
			.max_conns = conns[(sel >> 2) % 4],
			.buf_alloc = (sel & 0x10) ? 4096 : 0,
			.flags = UVSOCK_DEV_EXTERNAL_LOOP,
		};

		g->cid = cfg.guest_cid;
		snprintf(g->uds, sizeof(g->uds), "%s/%c.vsock", fz_dir, 'a' + i);
		cfg.uds_path = g->uds;
		FZ_CHECK(uvsock_dev_new(&cfg, &g->dev) == 0);
	}
	if (!(sel & 0x20))
		FZ_CHECK(uvsock_dev_link(fz.g[0].dev, fz.g[1].dev) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t b0, b1;
	int fds;

	init_once();
	fds = fz_count_fds();
	fz.in = (struct fz_in){ .p = data, .n = size };
	b0 = fz_u8(&fz.in);
	b1 = fz_u8(&fz.in);
	fz.features = 1ull << UVSOCK_DEV_F_VERSION_1;
	if (b0 & 1)
		fz.features |= 1ull << UVSOCK_DEV_F_INDIRECT_DESC;
	if (b0 & 2)
		fz.features |= 1ull << UVSOCK_DEV_F_EVENT_IDX;
	if (b0 & 4)
		fz.features |= 1ull << UVSOCK_DEV_F_SEQPACKET;
	fz.num = 1u << ((b0 >> 3) % 9);
	for (unsigned i = 0; i < FZ_NHOST; i++)
		fz.host[i] = -1;
	for (unsigned i = 0; i < FZ_NLISTEN; i++)
		fz.lis[i] = -1;

	devices_new(b1);
	for (unsigned i = 0; i < 2; i++)
		guest_start(&fz.g[i]);
	settle();
	for (int n = 0; n < FZ_MAX_STEPS && fz.in.n > 0; n++)
		step();

	for (unsigned i = 0; i < FZ_NHOST; i++)
		if (fz.host[i] >= 0)
			close(fz.host[i]);
	settle();
	for (unsigned i = 0; i < 2; i++) {
		if (fz.g[i].dev && getenv("FUZZ_DEVICE_VERBOSE"))
			print_stats(&fz.g[i]);
		uvsock_dev_free(fz.g[i].dev);
		fz.g[i].dev = NULL;
	}
	for (unsigned i = 0; i < FZ_NLISTEN; i++)
		if (fz.lis[i] >= 0) {
			close(fz.lis[i]);
			unlink(fz.lis_path[i]);
		}
	FZ_CHECK(dir_empty(fz_dir));
	FZ_CHECK(fz_count_fds() == fds);
	return 0;
}
