/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the guest memory map: region validation, gpa/uva translation with length
 * clamping, splitting a range across regions into iovecs, and a real memfd mapping with a
 * non-page-aligned mmap_offset as QEMU may send it.
 */
#include "test.h"
#include "util/macros.h"
#include "vring/guest_mem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static uint8_t ram0[4096], ram1[8192];

/* Two regions: gpa 0x1000..0x2000 (ram0) and 0x2000..0x4000 (ram1), adjacent. */
static struct guest_mem *two_regions(void)
{
	struct guest_mem_region_desc d[2] = {
		{ .guest_phys_addr = 0x1000, .memory_size = sizeof(ram0),
		  .userspace_addr = 0x7f0000 },
		{ .guest_phys_addr = 0x2000, .memory_size = sizeof(ram1),
		  .userspace_addr = 0x900000 },
	};
	void *hb[2] = { ram0, ram1 };
	struct guest_mem *m = NULL;

	ASSERT_OK(guest_mem_new_local(d, hb, 2, &m));
	ASSERT_TRUE(m);
	return m;
}

TEST(gpa_translate_and_clamp)
{
	struct guest_mem *m = two_regions();
	uint64_t len = 100;

	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0x1000, &len) == ram0);
	ASSERT_EQ(len, 100);
	len = 1000;
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0x1f00, &len) == ram0 + 0xf00);
	ASSERT_EQ(len, 0x100); /* clamped to the end of region 0 */
	len = UINT64_MAX;
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0x3fff, &len) == ram1 + 0x1fff);
	ASSERT_EQ(len, 1);
	len = 1;
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0x4000, &len) == NULL);
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0xfff, &len) == NULL);
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, 0, &len) == NULL);
	ASSERT_TRUE(guest_mem_gpa_to_hva(m, UINT64_MAX, &len) == NULL);
	guest_mem_free(m);
}

TEST(uva_translate)
{
	struct guest_mem *m = two_regions();
	uint64_t len = 64;

	ASSERT_TRUE(guest_mem_uva_to_hva(m, 0x900010, &len) == ram1 + 0x10);
	ASSERT_EQ(len, 64);
	len = 0x10000;
	ASSERT_TRUE(guest_mem_uva_to_hva(m, 0x7f0800, &len) == ram0 + 0x800);
	ASSERT_EQ(len, 0x800);
	ASSERT_TRUE(guest_mem_uva_to_hva(m, 0x1000, &len) == NULL);
	ASSERT_TRUE(guest_mem_uva_range(m, 0x900000, 8192) == ram1);
	ASSERT_TRUE(guest_mem_uva_range(m, 0x900001, 8192) == NULL);
	guest_mem_free(m);
}

TEST(gpa_range_contiguous_only)
{
	struct guest_mem *m = two_regions();

	ASSERT_TRUE(guest_mem_gpa_range(m, 0x1000, 4096) == ram0);
	/* Adjacent in guest-physical space, not in host memory: refused as one range. */
	ASSERT_TRUE(guest_mem_gpa_range(m, 0x1ff0, 32) == NULL);
	ASSERT_TRUE(guest_mem_gpa_range(m, 0x5000, 1) == NULL);
	guest_mem_free(m);
}

TEST(map_iov_split_across_regions)
{
	struct guest_mem *m = two_regions();
	struct iovec iov[4];

	ASSERT_EQ(guest_mem_map_iov(m, 0x1ff0, 0x20, iov, 4), 2);
	ASSERT_TRUE(iov[0].iov_base == ram0 + 0xff0);
	ASSERT_EQ(iov[0].iov_len, 0x10);
	ASSERT_TRUE(iov[1].iov_base == ram1);
	ASSERT_EQ(iov[1].iov_len, 0x10);

	ASSERT_EQ(guest_mem_map_iov(m, 0x1000, 0x3000, iov, 4), 2);
	ASSERT_EQ(iov[0].iov_len + iov[1].iov_len, 0x3000);

	ASSERT_EQ(guest_mem_map_iov(m, 0x1800, 0x10, iov, 4), 1);
	ASSERT_EQ(guest_mem_map_iov(m, 0x1800, 0, iov, 4), 0);
	guest_mem_free(m);
}

TEST(map_iov_errors)
{
	struct guest_mem *m = two_regions();
	struct iovec iov[4];

	ASSERT_ERR(guest_mem_map_iov(m, 0x1ff0, 0x20, iov, 1), ENOBUFS);
	ASSERT_ERR(guest_mem_map_iov(m, 0x3ff0, 0x20, iov, 4), EFAULT); /* runs off the end */
	ASSERT_ERR(guest_mem_map_iov(m, 0x8000, 1, iov, 4), EFAULT);    /* unmapped */
	ASSERT_ERR(guest_mem_map_iov(m, UINT64_MAX - 4, 16, iov, 4), EFAULT); /* wraps */
	ASSERT_ERR(guest_mem_map_iov(m, 0x1000, UINT64_MAX, iov, 4), EFAULT);
	guest_mem_free(m);
}

TEST(table_validation)
{
	static uint8_t a[64], b[64];
	void *hb[GUEST_MEM_MAX_REGIONS + 1];
	struct guest_mem_region_desc d[GUEST_MEM_MAX_REGIONS + 1] = { 0 };
	struct guest_mem *m = (struct guest_mem *)0x1;

	for (unsigned i = 0; i < ARRAY_SIZE(hb); i++)
		hb[i] = i % 2 ? b : a;
	/* Overlap. */
	d[0] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x1000, .memory_size = 64 };
	d[1] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x1020, .memory_size = 64 };
	ASSERT_ERR(guest_mem_new_local(d, hb, 2, &m), EINVAL);
	/* Containment. */
	d[1] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x0, .memory_size = 0x10000 };
	ASSERT_ERR(guest_mem_new_local(d, hb, 2, &m), EINVAL);
	/* Zero size. */
	d[1] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x8000, .memory_size = 0 };
	ASSERT_ERR(guest_mem_new_local(d, hb, 2, &m), EINVAL);
	/* gpa + size wraps. */
	d[1] = (struct guest_mem_region_desc){ .guest_phys_addr = UINT64_MAX - 10,
					      .memory_size = 64 };
	ASSERT_ERR(guest_mem_new_local(d, hb, 2, &m), EINVAL);
	/* uva + size wraps. */
	d[1] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x8000, .memory_size = 64,
					      .userspace_addr = UINT64_MAX - 3 };
	ASSERT_ERR(guest_mem_new_local(d, hb, 2, &m), EINVAL);
	/* Too many regions. */
	for (unsigned i = 0; i < GUEST_MEM_MAX_REGIONS + 1; i++)
		d[i] = (struct guest_mem_region_desc){ .guest_phys_addr = 0x10000 * (i + 1),
						      .memory_size = 64 };
	ASSERT_ERR(guest_mem_new_local(d, hb, GUEST_MEM_MAX_REGIONS + 1, &m), E2BIG);
	ASSERT_ERR(guest_mem_new(d, GUEST_MEM_MAX_REGIONS + 1, &m), E2BIG);
	/* The failures above left the output untouched. */
	ASSERT_TRUE(m == (struct guest_mem *)0x1);
	/* Exactly the maximum, adjacent but not overlapping, is fine. */
	ASSERT_OK(guest_mem_new_local(d, hb, GUEST_MEM_MAX_REGIONS, &m));
	guest_mem_free(m);
	guest_mem_free(NULL);
}

TEST(memfd_mapping_with_offset)
{
	/* Guest RAM of 3 pages + 100 bytes in a memfd; the region starts at file offset 100. */
	const uint64_t off = 100, size = 3 * 4096;
	int fd = memfd_create("guest-ram", MFD_CLOEXEC);
	struct guest_mem *m = NULL;
	uint8_t *p, buf[8];
	uint64_t len;

	ASSERT_TRUE(fd >= 0);
	ASSERT_OK(ftruncate(fd, (off_t)(off + size)));
	struct guest_mem_region_desc d = { .guest_phys_addr = 0x100000, .memory_size = size,
					   .userspace_addr = 0x7f0000000000, .mmap_offset = off,
					   .fd = fd };
	ASSERT_OK(guest_mem_new(&d, 1, &m));
	len = 16;
	p = guest_mem_gpa_to_hva(m, 0x100000 + 5, &len);
	ASSERT_TRUE(p != NULL);
	memcpy(p, "guestmem", 8);
	/* The fd is borrowed: closing it keeps the mapping alive. */
	ASSERT_EQ(pread(fd, buf, 8, (off_t)(off + 5)), 8);
	ASSERT_MEMEQ(buf, "guestmem", 8);
	close(fd);
	len = 8;
	p = guest_mem_uva_to_hva(m, 0x7f0000000000 + 5, &len);
	ASSERT_MEMEQ(p, "guestmem", 8);
	/* The last byte is mapped, the one after it is not. */
	len = 8;
	p = guest_mem_gpa_to_hva(m, 0x100000 + size - 1, &len);
	ASSERT_TRUE(p != NULL);
	ASSERT_EQ(len, 1);
	*p = 0xab;
	guest_mem_free(m);
}

TEST(memfd_too_short_or_bad_fd_refused)
{
	int fd = memfd_create("guest-ram", MFD_CLOEXEC);
	struct guest_mem *m = NULL;

	ASSERT_TRUE(fd >= 0);
	ASSERT_OK(ftruncate(fd, 4096));
	struct guest_mem_region_desc d = { .guest_phys_addr = 0, .memory_size = 4096,
					   .mmap_offset = 1, .fd = fd };
	/* 4097 bytes of mapping over a 4096-byte file: touching the end would SIGBUS. */
	ASSERT_ERR(guest_mem_new(&d, 1, &m), EINVAL);
	d.mmap_offset = UINT64_MAX - 10;
	ASSERT_ERR(guest_mem_new(&d, 1, &m), EINVAL);
	d.mmap_offset = 0;
	d.fd = -1;
	ASSERT_ERR(guest_mem_new(&d, 1, &m), EINVAL);
	/* Not a regular file: /dev/zero maps without a size to check, and is no guest memory. */
	d.fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
	ASSERT_GE(d.fd, 0);
	ASSERT_ERR(guest_mem_new(&d, 1, &m), EINVAL);
	close(d.fd);
	close(fd);
	d.fd = fd; /* now closed */
	ASSERT_ERR(guest_mem_new(&d, 1, &m), EBADF);
	ASSERT_TRUE(m == NULL);
}

/* A memfd of size bytes that costs no memory (nothing is ever written to it). */
static int sparse_fd(uint64_t size)
{
	int fd = memfd_create("sparse-guest-ram", MFD_CLOEXEC);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ftruncate(fd, (off_t)size));
	return fd;
}

static int map_sparse(int fd, uint64_t size, struct guest_mem **m)
{
	struct guest_mem_region_desc d = { .guest_phys_addr = 0, .memory_size = size, .fd = fd };

	return guest_mem_new(&d, 1, m);
}

TEST(default_caps_refuse_a_map_over_1_tib)
{
	const uint64_t tib = 1ull << 40;
	int fd = sparse_fd(128 * tib); /* what a hostile front-end may hand us for free */
	struct guest_mem *m = NULL;
	uint64_t per_map, process;

	guest_mem_get_limits(&per_map, &process);
	ASSERT_EQ_U64(per_map, GUEST_MEM_DEFAULT_PER_MAP_MAX);
	ASSERT_EQ_U64(process, GUEST_MEM_DEFAULT_PROCESS_MAX);
	ASSERT_EQ_U64(per_map, tib);
	ASSERT_EQ_U64(process, 16 * tib);
	ASSERT_ERR(map_sparse(fd, 128 * tib, &m), E2BIG);
	ASSERT_ERR(map_sparse(fd, tib + 1, &m), E2BIG);
	ASSERT_TRUE(m == NULL);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 0);
	ASSERT_OK(map_sparse(fd, tib, &m));
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), tib);
	guest_mem_free(m);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 0);
	close(fd);
}

TEST(per_map_and_process_caps)
{
	const uint64_t mib = 1ull << 20;
	int fd = sparse_fd(4 * mib);
	struct guest_mem *m[4] = { NULL };
	struct guest_mem_region_desc d[2] = {
		{ .guest_phys_addr = 0, .memory_size = mib / 2, .fd = fd },
		{ .guest_phys_addr = mib, .memory_size = mib / 2, .mmap_offset = 1, .fd = fd },
	};

	guest_mem_set_limits(mib, 3 * mib);
	/* Per map: one region over the cap, or regions that are together (offsets count). */
	ASSERT_ERR(map_sparse(fd, mib + 1, &m[0]), E2BIG);
	ASSERT_ERR(guest_mem_new(d, 2, &m[0]), E2BIG);
	d[1].mmap_offset = 0;
	ASSERT_OK(guest_mem_new(d, 2, &m[0]));
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), mib);
	/* Per process: the fourth map of 1 MiB is one too many... */
	ASSERT_OK(map_sparse(fd, mib, &m[1]));
	ASSERT_OK(map_sparse(fd, mib, &m[2]));
	ASSERT_ERR(map_sparse(fd, mib, &m[3]), ENOMEM);
	ASSERT_TRUE(m[3] == NULL);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 3 * mib);
	/* ...until another map is freed. A refused map accounted nothing. */
	guest_mem_free(m[1]);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 2 * mib);
	ASSERT_OK(map_sparse(fd, mib, &m[3]));
	/* Local maps map nothing and count nothing. */
	static uint8_t ram[64];
	void *hb[1] = { ram };
	struct guest_mem *l = NULL;
	struct guest_mem_region_desc ld = { .memory_size = sizeof(ram) };

	ASSERT_OK(guest_mem_new_local(&ld, hb, 1, &l));
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 3 * mib);
	guest_mem_free(l);
	guest_mem_free(m[0]);
	guest_mem_free(m[2]);
	guest_mem_free(m[3]);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 0);
	/* 0 restores the defaults. */
	guest_mem_set_limits(0, 0);
	uint64_t per_map, process;

	guest_mem_get_limits(&per_map, &process);
	ASSERT_EQ_U64(per_map, GUEST_MEM_DEFAULT_PER_MAP_MAX);
	ASSERT_EQ_U64(process, GUEST_MEM_DEFAULT_PROCESS_MAX);
	close(fd);
}

TEST_MAIN()
