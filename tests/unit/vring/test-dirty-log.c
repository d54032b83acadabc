/* SPDX-License-Identifier: MIT */
/*
 * The dirty log at the ring level (src/vring/dirty_log.h): a two-region guest memory mapped
 * from one memfd (gpa 0x10000..0x20000 and 0x20000..0x30000, adjacent in guest-physical space,
 * far apart in the file), a split ring with its used ring on a page of its own, and a log in a
 * memfd. A writable buffer that straddles the region boundary is popped and written in part:
 * exactly the pages written are marked, on both sides of the boundary, with the used ring's
 * page; the rest of the buffer, the descriptor table and the avail ring are not. A log that
 * covers only region A drops (and counts) the marks of region B and never writes past its end.
 * A packed ring marks the descriptors it writes back and its device event area.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "test.h"
#include "vring/guest_mem.h"
#include "vring/vring.h"
#include "vring/vring_drv.h"

#include <endian.h>

#define RA 0x10000ull
#define RB 0x20000ull
#define RSIZE 0x10000ull
#define FILE_B 0x40000ull /* region B's offset in the memfd */
#define PAGE 4096u
#define DESC (RA)            /* descriptor table: page 0x10 */
#define AVAIL (RA + 0x1000)  /* avail ring: page 0x11 */
#define USED (RA + 0x2000)   /* used ring: page 0x12 */
#define NUM 16

struct fx {
	int memfd, logfd;
	uint8_t *map;   /* the whole memfd, for the test's own view of guest memory */
	struct guest_mem *gm;
	struct vring_log log;
	struct vring_dev_queue q;
	uint8_t *logmap; /* the log memfd as the "front-end" sees it */
};

static uint8_t *host(struct fx *f, uint64_t gpa)
{
	return gpa >= RB ? f->map + FILE_B + (gpa - RB) : f->map + (gpa - RA);
}

/* Guest memory, and a log of log_bytes at offset 8 of a page-sized memfd filled with 0x5a. */
static void fx_init(struct fx *f, uint64_t log_bytes)
{
	struct guest_mem_region_desc d[2] = {
		{ .guest_phys_addr = RA, .memory_size = RSIZE, .userspace_addr = 0x7000000000,
		  .mmap_offset = 0 },
		{ .guest_phys_addr = RB, .memory_size = RSIZE, .userspace_addr = 0x7000100000,
		  .mmap_offset = FILE_B },
	};

	memset(f, 0, sizeof(*f));
	f->memfd = memfd_create("dirty-log-test-mem", MFD_CLOEXEC);
	ASSERT_GE(f->memfd, 0);
	ASSERT_OK(ftruncate(f->memfd, FILE_B + RSIZE));
	f->map = mmap(NULL, FILE_B + RSIZE, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
	ASSERT_TRUE(f->map != MAP_FAILED);
	d[0].fd = d[1].fd = f->memfd;
	ASSERT_OK(guest_mem_new(d, 2, &f->gm));

	f->logfd = memfd_create("dirty-log-test-log", MFD_CLOEXEC);
	ASSERT_GE(f->logfd, 0);
	ASSERT_OK(ftruncate(f->logfd, PAGE));
	f->logmap = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, f->logfd, 0);
	ASSERT_TRUE(f->logmap != MAP_FAILED);
	memset(f->logmap, 0x5a, PAGE);
	memset(f->logmap + 8, 0, log_bytes);
	vring_log_init(&f->log);
	ASSERT_OK(vring_log_map(&f->log, f->logfd, log_bytes, 8));
	guest_mem_set_log(f->gm, &f->log);
}

static void fx_fini(struct fx *f)
{
	vring_log_reset(&f->log);
	guest_mem_free(f->gm);
	munmap(f->logmap, PAGE);
	munmap(f->map, FILE_B + RSIZE);
	close(f->logfd);
	close(f->memfd);
}

static bool marked(struct fx *f, uint64_t page)
{
	return f->logmap[8 + page / 8] & (1u << (page % 8));
}

static unsigned count_marked(struct fx *f, uint64_t log_bytes)
{
	unsigned n = 0;

	for (uint64_t p = 0; p < log_bytes * 8; p++)
		n += marked(f, p);
	return n;
}

static void split_start(struct fx *f, struct vring_drv **drv)
{
	struct vring_dev_config c = {
		.mem = f->gm, .num = NUM, .addr_kind = VRING_ADDR_GPA, .desc_addr = DESC,
		.avail_addr = AVAIL, .used_addr = USED, .last_avail_idx = 0,
	};

	ASSERT_OK(vring_drv_new(NUM, host(f, DESC), host(f, AVAIL), host(f, USED), 0, drv));
	ASSERT_OK(vring_dev_init(&f->q, &c));
}

/* Pops the one chain posted, writes `wrote` bytes into it, logs them, fills and publishes. */
static void device_writes(struct fx *f, uint32_t wrote)
{
	struct iovec out[1], in[4];
	struct vring_chain ch;

	ASSERT_OK(vring_dev_pop(&f->q, out, 1, in, 4, &ch));
	for (unsigned i = 0, left = wrote; i < ch.in_num && left; i++) {
		size_t l = in[i].iov_len < left ? in[i].iov_len : left;

		memset(in[i].iov_base, 0xee, l);
		left -= (unsigned)l;
	}
	vring_dev_log_written(&f->q, in, ch.in_num, wrote);
	ASSERT_OK(vring_dev_push(&f->q, ch.head, wrote));
}

TEST(exactly_the_written_pages_are_marked_across_a_region_boundary)
{
	/* 0x1e800..0x217ff: 0x1800 bytes in A, 0x1800 in B; 0x2000 of them written. */
	struct vring_drv_buf b = { RB - 0x1800, 0x3000, true };
	struct vring_drv *drv;
	struct fx f;
	int cookie;

	fx_init(&f, 8); /* 64 pages: all of guest memory */
	split_start(&f, &drv);
	ASSERT_EQ(count_marked(&f, 8), 0); /* logging not enabled yet: init marked nothing */
	vring_log_set_enabled(&f.log, true);
	ASSERT_GE(vring_drv_add(drv, &b, 1, &cookie), 0);
	vring_drv_publish(drv);
	device_writes(&f, 0x2000);
	ASSERT_TRUE(marked(&f, 0x1e));  /* A, the last two pages */
	ASSERT_TRUE(marked(&f, 0x1f));
	ASSERT_TRUE(marked(&f, 0x20));  /* B, the first page: 0x20000..0x207ff written */
	ASSERT_FALSE(marked(&f, 0x21)); /* in the buffer, not written */
	ASSERT_TRUE(marked(&f, USED / PAGE));
	ASSERT_FALSE(marked(&f, DESC / PAGE));
	ASSERT_FALSE(marked(&f, AVAIL / PAGE));
	ASSERT_EQ(count_marked(&f, 8), 4);
	ASSERT_EQ_U64(f.log.outside, 0);
	/* The bytes around the log are untouched. */
	for (unsigned i = 0; i < 8; i++)
		ASSERT_EQ(f.logmap[i], 0x5a);
	for (unsigned i = 16; i < PAGE; i++)
		ASSERT_EQ(f.logmap[i], 0x5a);

	/* Off: nothing more is marked. */
	memset(f.logmap + 8, 0, 8);
	vring_log_set_enabled(&f.log, false);
	ASSERT_GE(vring_drv_add(drv, &b, 1, &cookie), 0);
	vring_drv_publish(drv);
	device_writes(&f, 0x3000);
	ASSERT_EQ(count_marked(&f, 8), 0);
	vring_drv_free(drv);
	fx_fini(&f);
}

TEST(marks_past_the_end_of_the_log_are_dropped_never_written)
{
	struct vring_drv_buf b = { RB + 0x3000, 0x2000, true };
	struct vring_drv *drv;
	struct fx f;
	int cookie;

	fx_init(&f, 4); /* 32 pages: gpa < 0x20000, region A only */
	split_start(&f, &drv);
	vring_log_set_enabled(&f.log, true);
	ASSERT_GE(vring_drv_add(drv, &b, 1, &cookie), 0);
	vring_drv_publish(drv);
	device_writes(&f, 0x2000);
	ASSERT_TRUE(marked(&f, USED / PAGE));
	ASSERT_EQ(count_marked(&f, 4), 1);
	ASSERT_EQ_U64(f.log.outside, 2); /* pages 0x23 and 0x24 */
	for (unsigned i = 0; i < 8; i++)
		ASSERT_EQ(f.logmap[i], 0x5a);
	for (unsigned i = 12; i < PAGE; i++)
		ASSERT_EQ(f.logmap[i], 0x5a);
	/* Direct marks at the very end of the address space neither wrap nor write. */
	vring_log_mark_gpa(&f.log, UINT64_MAX - 10, 100);
	ASSERT_EQ(count_marked(&f, 4), 1);
	vring_drv_free(drv);
	fx_fini(&f);
}

TEST(packed_ring_marks_used_descriptors_and_its_event_area)
{
	struct vring_dev_config c = {
		.mem = NULL, .num = NUM, .addr_kind = VRING_ADDR_GPA, .desc_addr = DESC,
		.avail_addr = AVAIL, .used_addr = USED, .last_avail_idx = 1u << 15,
		.features = 1ull << VRING_FEAT_RING_PACKED,
	};
	struct vring_pk_desc_le *ring;
	struct iovec out[1], in[2];
	struct vring_chain ch;
	struct fx f;

	fx_init(&f, 8);
	c.mem = f.gm;
	vring_log_set_enabled(&f.log, true);
	ASSERT_OK(vring_dev_init(&f.q, &c));
	ASSERT_TRUE(marked(&f, USED / PAGE)); /* the device event area, written at start */
	memset(f.logmap + 8, 0, 8);
	/* One available writable descriptor in slot 0 (wrap counter 1: AVAIL set, USED clear). */
	ring = (struct vring_pk_desc_le *)(void *)host(&f, DESC);
	ring[0].addr = htole64(RB + 0x5000);
	ring[0].len = htole32(100);
	ring[0].id = htole16(0);
	__atomic_store_n(&ring[0].flags, htole16(VRING_PK_DESC_F_AVAIL | VRING_DESC_F_WRITE),
			 __ATOMIC_RELEASE);
	ASSERT_OK(vring_dev_pop(&f.q, out, 1, in, 2, &ch));
	memset(in[0].iov_base, 0xee, 10);
	vring_dev_log_written(&f.q, in, ch.in_num, 10);
	ASSERT_OK(vring_dev_push(&f.q, ch.head, 10));
	ASSERT_TRUE(marked(&f, (RB + 0x5000) / PAGE));
	ASSERT_TRUE(marked(&f, DESC / PAGE)); /* the used descriptor, written in place */
	ASSERT_EQ(count_marked(&f, 8), 2);
	fx_fini(&f);
}

TEST_MAIN()
