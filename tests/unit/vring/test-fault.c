/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the guest-memory fault guard (src/vring/fault.c) through guest_mem: a front-end
 * that shrinks the memfd behind mapped guest memory must not kill the process. The map reads
 * zeros from then on and says it is poisoned, other maps are untouched, a SIGBUS outside guest
 * memory still kills, and a memfd that allows sealing is sealed against shrinking at map time.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "vring/fault.h"
#include "vring/guest_mem.h"

#define RAM (64u * 1024)

/* A memfd of RAM bytes filled with byte fill; sealing allowed only if flags say so. */
static int ram_fd(unsigned flags, uint8_t fill)
{
	int fd = memfd_create("guest-ram", MFD_CLOEXEC | flags);
	uint8_t buf[4096];

	ASSERT_GE(fd, 0);
	ASSERT_OK(ftruncate(fd, RAM));
	memset(buf, fill, sizeof(buf));
	for (unsigned off = 0; off < RAM; off += sizeof(buf))
		ASSERT_EQ(pwrite(fd, buf, sizeof(buf), off), sizeof(buf));
	return fd;
}

static struct guest_mem *map_fd(int fd, uint64_t gpa)
{
	struct guest_mem_region_desc d = { .guest_phys_addr = gpa, .memory_size = RAM, .fd = fd };
	struct guest_mem *m = NULL;

	ASSERT_OK(guest_mem_new(&d, 1, &m));
	return m;
}

/* Volatile byte reads, so that the compiler keeps each access. */
static uint8_t peek(const struct guest_mem *m, uint64_t gpa)
{
	uint64_t len = 1;
	volatile uint8_t *p = guest_mem_gpa_to_hva(m, gpa, &len);

	ASSERT_TRUE(p != NULL);
	return *p;
}

TEST(shrunk_memfd_reads_zeros_and_poisons_only_its_map)
{
	int fd1 = ram_fd(0, 0xa5), fd2 = ram_fd(0, 0x5a);
	struct guest_mem *m1 = map_fd(fd1, 0x100000), *m2 = map_fd(fd2, 0x100000);
	uint64_t len = 8;
	volatile uint8_t *w;

	ASSERT_EQ(peek(m1, 0x100000 + RAM - 1), 0xa5);
	ASSERT_FALSE(guest_mem_poisoned(m1));
	/* Without MFD_ALLOW_SEALING the map cannot seal: the "front-end" shrinks the file. */
	ASSERT_OK(ftruncate(fd1, 0));
	ASSERT_EQ(peek(m1, 0x100000 + 4096), 0); /* would have been SIGBUS */
	ASSERT_TRUE(guest_mem_poisoned(m1));
	/* The whole region is now zero pages: every other access, reads and writes, works. */
	ASSERT_EQ(peek(m1, 0x100000), 0);
	ASSERT_EQ(peek(m1, 0x100000 + RAM - 1), 0);
	w = guest_mem_gpa_to_hva(m1, 0x100000 + 100, &len);
	*w = 7;
	ASSERT_EQ(peek(m1, 0x100000 + 100), 7);
	/* The other map is untouched. */
	ASSERT_FALSE(guest_mem_poisoned(m2));
	ASSERT_EQ(peek(m2, 0x100000), 0x5a);
	ASSERT_EQ(peek(m2, 0x100000 + RAM - 1), 0x5a);
	guest_mem_free(m1);
	guest_mem_free(m2);
	close(fd1);
	close(fd2);
}

TEST(sigbus_outside_guest_memory_still_kills)
{
	pid_t pid = fork();
	int status;

	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct sigaction dfl = { .sa_handler = SIG_DFL };
		int gfd, ofd;
		struct guest_mem *m;
		volatile uint8_t *p;

		/* What SIGBUS did before the guard: the default (not a sanitizer's handler). */
		sigaction(SIGBUS, &dfl, NULL);
		gfd = ram_fd(0, 1);
		ofd = ram_fd(0, 2);
		m = map_fd(gfd, 0);
		/* The guard is live: a guest fault is survived... */
		if (ftruncate(gfd, 0) < 0 || peek(m, 0) != 0 || !guest_mem_poisoned(m))
			_exit(3);
		/* ...and one in a mapping that is not guest memory is not. */
		p = mmap(NULL, RAM, PROT_READ, MAP_SHARED, ofd, 0);
		if (p == MAP_FAILED || ftruncate(ofd, 0) < 0)
			_exit(4);
		(void)p[4096];
		_exit(5);
	}
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	ASSERT_TRUE(WIFSIGNALED(status));
	ASSERT_EQ(WTERMSIG(status), SIGBUS);
}

static volatile sig_atomic_t vmm_sigbus;

static void vmm_handler(int sig, siginfo_t *si, void *uctx)
{
	(void)sig;
	(void)si;
	(void)uctx;
	vmm_sigbus++;
}

/*
 * An embedding VMM with a SIGBUS handler of its own (memory-error reports, say) installed before
 * the guard: a SIGBUS that is not a guest-memory fault reaches that handler, a kill() as well as
 * an asynchronous memory-error report (which retries no access), and the guard stays in place.
 */
TEST(foreign_sigbus_reaches_the_previous_handler_and_the_guard_stays)
{
	pid_t pid = fork();
	int status;

	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct sigaction sa = { .sa_sigaction = vmm_handler, .sa_flags = SA_SIGINFO };
		siginfo_t si = { .si_signo = SIGBUS, .si_code = BUS_MCEERR_AO };
		static uint8_t elsewhere[64];
		struct guest_mem *m;
		int gfd;

		alarm(10); /* a guard gone would loop on the retried fault below */
		sigaction(SIGBUS, &sa, NULL);
		gfd = ram_fd(0, 1);
		m = map_fd(gfd, 0);
		kill(getpid(), SIGBUS);
		if (vmm_sigbus != 1)
			_exit(3);
		si.si_addr = elsewhere;
		if (syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGBUS, &si) < 0)
			_exit(4);
		if (vmm_sigbus != 2)
			_exit(5);
		if (ftruncate(gfd, 0) < 0 || peek(m, 0) != 0 || !guest_mem_poisoned(m))
			_exit(6);
		_exit(vmm_sigbus == 2 ? 0 : 7);
	}
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(WEXITSTATUS(status), 0);
}

TEST(sealable_memfd_is_sealed_against_shrinking)
{
	int fd = ram_fd(MFD_ALLOW_SEALING, 3);
	struct guest_mem *m;
	int seals;

	ASSERT_FALSE(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK);
	m = map_fd(fd, 0);
	seals = fcntl(fd, F_GET_SEALS);
	ASSERT_GE(seals, 0);
	ASSERT_TRUE(seals & F_SEAL_SHRINK);
	/* Only shrinking is sealed: the front-end may still write and grow its memory. */
	ASSERT_FALSE(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SEAL));
	ASSERT_EQ(ftruncate(fd, 0), -1);
	ASSERT_EQ(errno, EPERM);
	ASSERT_OK(ftruncate(fd, 2 * RAM));
	ASSERT_EQ(peek(m, RAM - 1), 3);
	ASSERT_FALSE(guest_mem_poisoned(m));
	guest_mem_free(m);
	close(fd);
}

TEST(memfd_sealed_without_shrink_seal_is_still_mapped)
{
	/* F_SEAL_SEAL without F_SEAL_SHRINK: we cannot add the seal; the guard is what protects. */
	int fd = ram_fd(MFD_ALLOW_SEALING, 4);
	struct guest_mem *m;

	ASSERT_OK(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL));
	m = map_fd(fd, 0);
	ASSERT_FALSE(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK);
	ASSERT_OK(ftruncate(fd, 0));
	ASSERT_EQ(peek(m, 8), 0);
	ASSERT_TRUE(guest_mem_poisoned(m));
	guest_mem_free(m);
	close(fd);
}

TEST(registry_bounds)
{
	static atomic_bool flag;
	static uint8_t page[4096];
	int id;

	ASSERT_ERR(fault_register(page, 0, &flag), EINVAL);
	ASSERT_ERR(fault_register(NULL, 1, &flag), EINVAL);
	ASSERT_ERR(fault_register(page, 1, NULL), EINVAL);
	id = fault_register(page, sizeof(page), &flag);
	ASSERT_GE(id, 0);
	fault_unregister(id);
	/* A freed slot is reused. */
	ASSERT_EQ(fault_register(page, sizeof(page), &flag), id);
	fault_unregister(id);
	fault_unregister(-1);
	fault_unregister(FAULT_MAX_REGIONS);
}

TEST_MAIN()
