/* SPDX-License-Identifier: MIT */
/*
 * A hostile front-end against the real vhost-user back-end (src/vhost_user/backend.c), and the
 * fd helpers that defend it (src/util/fdcheck.c). Each case hands the back-end an fd that would
 * hang or spin a VM thread or crash the process if it were taken: a pipe as kick fd (readable for
 * ever once its writer is closed), a pipe or a socket as call or error fd (a write may block),
 * /dev/zero or a memfd shorter than the region as guest memory. Each must be refused with the
 * connection ended, nothing left open, and the process alive. Also: a blocking eventfd with a
 * saturated counter must not block the interrupt write, nor an empty one the kick read.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "fakedev.h"
#include "fdutil.h"
#include "test.h"
#include "util/fdcheck.h"
#include "vhost_user/msg.h"
#include "vring/guest_mem.h"

#define RAM (1u << 20)

static struct {
	int sock; /* the front-end's end */
	struct vhu_backend *b;
	struct fakedev dev;
	int fds_before;
} h;

/* A back-end on a socketpair, SET_OWNER done. */
static void hostile_setup(void)
{
	struct vhu_backend_config cfg;
	int sv[2];

	h.fds_before = fd_count();
	fakedev_init(&h.dev);
	vhu_backend_config_init(&cfg);
	cfg.msg_timeout_ms = 200;
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	h.sock = sv[0];
	ASSERT_OK(vhu_backend_new(sv[1], &cfg, &fakedev_ops, &h.dev, &h.b));
	ASSERT_OK(vhu_msg_send(h.sock, VHU_REQ_SET_OWNER, VHU_FLAG_VERSION, NULL, 0, NULL, 0,
			       1000));
	ASSERT_OK(vhu_backend_process(h.b));
}

/* Frees the back-end and checks that it kept no fd. */
static void hostile_teardown(void)
{
	vhu_backend_free(h.b);
	close(h.sock);
	ASSERT_EQ(fd_count(), h.fds_before);
}

static int send_fd_req(uint32_t request, const void *p, uint32_t size, int fd)
{
	ASSERT_OK(vhu_msg_send(h.sock, request, VHU_FLAG_VERSION, p, size, &fd, 1, 1000));
	return vhu_backend_process(h.b);
}

static int set_vring_fd(uint32_t request, uint64_t q, int fd)
{
	return send_fd_req(request, &q, sizeof(q), fd);
}

static int set_mem_fd(int fd, uint64_t size)
{
	struct vhu_mem_table t = { .nregions = 1 };

	t.regions[0] = (struct vhu_mem_region){ .guest_phys_addr = 0, .memory_size = size,
						.userspace_addr = 0x7f0000000000ull };
	return send_fd_req(VHU_REQ_SET_MEM_TABLE, &t, 8 + 32, fd);
}

/* A memfd of size bytes (sparse: nothing is written). */
static int memfd_of(uint64_t size)
{
	int fd = memfd_create("guest", MFD_CLOEXEC);

	ASSERT_GE(fd, 0);
	ASSERT_OK(ftruncate(fd, (off_t)size));
	return fd;
}

/* The connection ended with -err and an error text naming what, and stays ended. */
static void expect_refused(int ret, int err, const char *what)
{
	if (ret != -err)
		test_fail(__FILE__, __LINE__, "expected -%d, got %d (%s)", err, ret,
			  vhu_backend_error(h.b));
	if (!strstr(vhu_backend_error(h.b), what))
		test_fail(__FILE__, __LINE__, "error '%s' does not say '%s'",
			  vhu_backend_error(h.b), what);
	ASSERT_EQ(vhu_backend_process(h.b), ret);
}

/* ---- ring fds --------------------------------------------------------------------------- */

TEST(pipe_as_kick_fd_is_refused)
{
	int p[2];

	hostile_setup();
	ASSERT_OK(pipe2(p, O_CLOEXEC));
	close(p[1]); /* the read end now polls readable (EOF) for ever */
	expect_refused(set_vring_fd(VHU_REQ_SET_VRING_KICK, 0, p[0]), EINVAL,
		       "kick fd is not an eventfd");
	close(p[0]);
	hostile_teardown();
}

TEST(pipe_as_call_fd_is_refused)
{
	int p[2];

	hostile_setup();
	ASSERT_OK(pipe2(p, O_CLOEXEC));
	expect_refused(set_vring_fd(VHU_REQ_SET_VRING_CALL, 1, p[1]), EINVAL,
		       "call fd is not an eventfd");
	close(p[0]);
	close(p[1]);
	hostile_teardown();
}

TEST(socket_as_error_fd_is_refused)
{
	int sv[2];

	hostile_setup();
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	expect_refused(set_vring_fd(VHU_REQ_SET_VRING_ERR, 0, sv[0]), EINVAL,
		       "error fd is not an eventfd");
	close(sv[0]);
	close(sv[1]);
	hostile_teardown();
}

TEST(eventfds_are_still_taken)
{
	int kick, call;

	hostile_setup();
	kick = eventfd(0, EFD_CLOEXEC);
	call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ASSERT_OK(set_vring_fd(VHU_REQ_SET_VRING_KICK, 0, kick));
	ASSERT_OK(set_vring_fd(VHU_REQ_SET_VRING_CALL, 0, call));
	ASSERT_OK(set_vring_fd(VHU_REQ_SET_VRING_ERR, 1, call));
	ASSERT_EQ(vhu_backend_error(h.b)[0], 0);
	close(kick);
	close(call);
	hostile_teardown();
}

/* ---- guest memory fds ------------------------------------------------------------------- */

/* SET_MEM_TABLE of one region of size bytes in fd ends the connection with -err and text what. */
static void mem_refused(int fd, uint64_t size, int err, const char *what)
{
	ASSERT_GE(fd, 0);
	hostile_setup();
	expect_refused(set_mem_fd(fd, size), err, what);
	ASSERT_TRUE(h.dev.mem == NULL);
	ASSERT_EQ_U64(guest_mem_mapped_bytes(), 0);
	hostile_teardown();
	close(fd);
}

TEST(dev_zero_as_guest_memory_is_refused)
{
	mem_refused(open("/dev/zero", O_RDWR | O_CLOEXEC), RAM, EINVAL,
		    "region 0: the fd is not a regular file");
}

TEST(too_small_memfd_as_guest_memory_is_refused)
{
	mem_refused(memfd_of(RAM / 2), RAM, EINVAL, "region 0: the file is shorter");
}

TEST(huge_sparse_memfd_is_refused_by_the_per_vm_cap)
{
	/* 128 TiB that cost the front-end no memory. */
	mem_refused(memfd_of(128ull << 40), 128ull << 40, E2BIG, "per-VM cap");
}

TEST(right_sized_memfd_is_still_taken)
{
	int fd;

	hostile_setup();
	fd = memfd_of(RAM);
	ASSERT_OK(set_mem_fd(fd, RAM));
	ASSERT_TRUE(h.dev.mem != NULL);
	close(fd);
	hostile_teardown();
}

/* ---- fdcheck helpers -------------------------------------------------------------------- */

TEST(fd_check_eventfd_tells_eventfds_apart)
{
	int e = eventfd(0, EFD_CLOEXEC), m = memfd_create("x", MFD_CLOEXEC), p[2];

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	ASSERT_OK(fd_check_eventfd(e));
	ASSERT_ERR(fd_check_eventfd(p[0]), EINVAL);
	ASSERT_ERR(fd_check_eventfd(p[1]), EINVAL);
	ASSERT_ERR(fd_check_eventfd(m), EINVAL);
	ASSERT_ERR(fd_check_eventfd(-1), EBADF);
	close(e);
	ASSERT_ERR(fd_check_eventfd(e), EBADF);
	close(m);
	close(p[0]);
	close(p[1]);
}

TEST(eventfd_signal_nb_never_blocks_on_a_saturated_counter)
{
	int e = eventfd(0, EFD_CLOEXEC); /* blocking, as a hostile front-end may hand it */
	uint64_t v = 0xfffffffffffffffeull;
	int flags = fcntl(e, F_GETFL);

	ASSERT_GE(e, 0);
	ASSERT_OK(eventfd_signal_nb(e));
	ASSERT_EQ(read(e, &v, sizeof(v)), sizeof(v));
	ASSERT_EQ_U64(v, 1);
	v = 0xfffffffffffffffeull;
	ASSERT_EQ(write(e, &v, sizeof(v)), sizeof(v));
	alarm(10); /* a blocking write() would hang here: SIGALRM ends the case */
	ASSERT_ERR(eventfd_signal_nb(e), EAGAIN);
	alarm(0);
	/* The counter is unchanged, and so are the fd's flags (shared with the front-end). */
	ASSERT_EQ(read(e, &v, sizeof(v)), sizeof(v));
	ASSERT_EQ_U64(v, 0xfffffffffffffffeull);
	ASSERT_EQ(fcntl(e, F_GETFL), flags);
	ASSERT_ERR(eventfd_signal_nb(-1), EBADF);
	close(e);
}

TEST(eventfd_consume_nb_never_blocks_on_an_empty_counter)
{
	int e = eventfd(0, EFD_CLOEXEC); /* blocking */
	uint64_t v = 9;
	int flags = fcntl(e, F_GETFL);

	alarm(10);
	ASSERT_ERR(eventfd_consume_nb(e, &v), EAGAIN);
	alarm(0);
	ASSERT_EQ_U64(v, 9);
	ASSERT_OK(eventfd_signal_nb(e));
	ASSERT_OK(eventfd_signal_nb(e));
	ASSERT_OK(eventfd_consume_nb(e, &v));
	ASSERT_EQ_U64(v, 2);
	ASSERT_ERR(eventfd_consume_nb(e, NULL), EAGAIN);
	ASSERT_EQ(fcntl(e, F_GETFL), flags);
	close(e);
}

TEST(fd_check_guest_memory_wants_a_large_enough_regular_file)
{
	int z = open("/dev/zero", O_RDWR | O_CLOEXEC), m = memfd_create("x", MFD_CLOEXEC), p[2];

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	ASSERT_OK(ftruncate(m, 8192));
	ASSERT_OK(fd_check_guest_memory(m, 8192));
	ASSERT_OK(fd_check_guest_memory(m, 0));
	ASSERT_ERR(fd_check_guest_memory(m, 8193), ERANGE);
	ASSERT_ERR(fd_check_guest_memory(m, UINT64_MAX), ERANGE);
	ASSERT_ERR(fd_check_guest_memory(z, 0), EINVAL);
	ASSERT_ERR(fd_check_guest_memory(p[0], 0), EINVAL);
	ASSERT_ERR(fd_check_guest_memory(-1, 0), EBADF);
	close(z);
	close(m);
	close(p[0]);
	close(p[1]);
}

TEST_MAIN()
