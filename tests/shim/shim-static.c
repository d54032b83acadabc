/* SPDX-License-Identifier: MIT */
/*
 * A static program for the test of uvsock-run's seccomp filter (tests/shim/test-shim.c): no
 * LD_PRELOAD reaches it, so only uvsock-run stands between it and the kernel.
 *
 *   shim-static FAMILY...                    raw socket() system calls of each family; prints
 *                                            "family N: ok" or "family N: refused: <strerror>
 *                                            (errno E)"
 *   shim-static ring-exec inherit|getfd FAMILY PROG ARGS...
 *                                            creates an io_uring, then executes PROG with it:
 *                                            "inherit" leaves the ring's fd open across the exec
 *                                            ($UVSOCK_TEST_RING=FD:PARAMS); "getfd" leaves it to
 *                                            a child process only, from which PROG takes it with
 *                                            pidfd_getfd() ($UVSOCK_TEST_RING_PID=PID:FD:PARAMS)
 *   shim-static ring FAMILY                  takes that ring and submits one IORING_OP_SOCKET of
 *                                            FAMILY on it; prints "ring family N: ok" or "ring
 *                                            family N: refused: <strerror> (errno E)" (whichever
 *                                            step failed: no ring, mmap, io_uring_enter, the op)
 *
 * SAFETY: it refuses AF_VSOCK (40) everywhere: the filter is proved with a harmless family that
 * uvsock-run's test knob adds (UVSOCK_RUN_TEST_BLOCK_FAMILY), never with vsock.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_open 434
#define SYS_pidfd_getfd 438
#endif

static int refuse_vsock(int fam)
{
	if (fam == 40) {
		fprintf(stderr, "shim-static: never AF_VSOCK\n");
		return 1;
	}
	return 0;
}

static int sock_type(int fam)
{
	/* SOCK_RAW for netlink (family 16, protocol 0 = NETLINK_ROUTE), else a stream. */
	return fam == 16 ? SOCK_RAW : SOCK_STREAM;
}

static int ring_exec(const char *how, char **argv)
{
	struct io_uring_params p;
	char hex[2 * sizeof(p) + 1], env[64 + sizeof(hex)];
	int fd;

	memset(&p, 0, sizeof(p));
	fd = (int)syscall(SYS_io_uring_setup, 4, &p);
	if (fd < 0) {
		printf("ring-exec: no io_uring here: %s (errno %d)\n", strerror(errno), errno);
		return 3;
	}
	for (size_t i = 0; i < sizeof(p); i++)
		snprintf(hex + 2 * i, 3, "%02x", ((unsigned char *)&p)[i]);
	if (!strcmp(how, "inherit")) {
		/* io_uring fds are close-on-exec: clear it, as a careless parent would. */
		snprintf(env, sizeof(env), "%d:%s", fd, hex);
		if (setenv("UVSOCK_TEST_RING", env, 1) < 0 || fcntl(fd, F_SETFD, 0) < 0)
			return 4;
	} else {
		/* A child of ours keeps the ring (and dies with us); we keep none. */
		pid_t holder, parent = getpid();

		fflush(stdout);
		holder = fork();
		if (holder < 0)
			return 4;
		if (holder == 0) {
			/* We may already be gone (then no signal comes): check after asking. A
			 * minute at most whatever happens. */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			alarm(60);
			while (getppid() == parent)
				pause();
			_exit(0);
		}
		close(fd);
		snprintf(env, sizeof(env), "%d:%d:%s", (int)holder, fd, hex);
		if (setenv("UVSOCK_TEST_RING_PID", env, 1) < 0)
			return 4;
	}
	fflush(stdout);
	execv(argv[0], argv);
	printf("ring-exec: cannot run %s: %s\n", argv[0], strerror(errno));
	return 5;
}

static int params_from_hex(const char *hex, struct io_uring_params *p)
{
	if (strlen(hex) != 2 * sizeof(*p))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(*p); i++) {
		unsigned b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1)
			return -EINVAL;
		((unsigned char *)p)[i] = (unsigned char)b;
	}
	return 0;
}

/* The ring the exec'ing parent left: its fd (ours, or taken from the holder) and params. */
static int ring_take(struct io_uring_params *p)
{
	const char *e = getenv("UVSOCK_TEST_RING"), *g = getenv("UVSOCK_TEST_RING_PID");
	int pid, fd, pfd, off = 0;

	if (e) {
		if (sscanf(e, "%d:%n", &fd, &off) != 1 || !off || params_from_hex(e + off, p) < 0)
			return -EINVAL;
		return fd;
	}
	if (g) {
		if (sscanf(g, "%d:%d:%n", &pid, &fd, &off) != 2 || !off ||
		    params_from_hex(g + off, p) < 0)
			return -EINVAL;
		pfd = (int)syscall(SYS_pidfd_open, pid, 0);
		if (pfd < 0)
			return -errno;
		fd = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
		return fd < 0 ? -errno : fd;
	}
	return -EINVAL;
}

/* One IORING_OP_SOCKET on the inherited ring; 0 or -errno of the first step that failed. */
static int ring_socket(int fam)
{
	struct io_uring_params p;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqe;
	uint8_t *sq, *cq;
	size_t sq_len, cq_len;
	uint32_t tail, head;
	int fd = ring_take(&p);

	if (fd < 0)
		return fd;
	sq_len = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
	cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if ((p.features & IORING_FEAT_SINGLE_MMAP) && cq_len > sq_len)
		sq_len = cq_len;
	sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, IORING_OFF_SQ_RING);
	if (sq == MAP_FAILED)
		return -errno;
	cq = sq;
	if (!(p.features & IORING_FEAT_SINGLE_MMAP)) {
		cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, IORING_OFF_CQ_RING);
		if (cq == MAP_FAILED)
			return -errno;
	}
	sqes = mmap(NULL, p.sq_entries * sizeof(*sqes), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		    IORING_OFF_SQES);
	if (sqes == MAP_FAILED)
		return -errno;
	tail = __atomic_load_n((uint32_t *)(sq + p.sq_off.tail), __ATOMIC_ACQUIRE);
	memset(&sqes[0], 0, sizeof(sqes[0]));
	sqes[0].opcode = IORING_OP_SOCKET;
	sqes[0].fd = fam;
	sqes[0].off = (uint64_t)sock_type(fam);
	((uint32_t *)(sq + p.sq_off.array))[tail & *(uint32_t *)(sq + p.sq_off.ring_mask)] = 0;
	__atomic_store_n((uint32_t *)(sq + p.sq_off.tail), tail + 1, __ATOMIC_RELEASE);
	if (syscall(SYS_io_uring_enter, fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
		return -errno;
	head = __atomic_load_n((uint32_t *)(cq + p.cq_off.head), __ATOMIC_ACQUIRE);
	if (head == __atomic_load_n((uint32_t *)(cq + p.cq_off.tail), __ATOMIC_ACQUIRE))
		return -EAGAIN;
	cqe = (struct io_uring_cqe *)(cq + p.cq_off.cqes) +
	      (head & *(uint32_t *)(cq + p.cq_off.ring_mask));
	if (cqe->res < 0)
		return cqe->res;
	close(cqe->res);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "ring-exec")) {
		if (refuse_vsock(atoi(argv[3])))
			return 2;
		return ring_exec(argv[2], argv + 4);
	}
	if (argc == 3 && !strcmp(argv[1], "ring")) {
		int fam = atoi(argv[2]), r;

		if (refuse_vsock(fam))
			return 2;
		r = ring_socket(fam);
		if (r == 0)
			printf("ring family %d: ok\n", fam);
		else
			printf("ring family %d: refused: %s (errno %d)\n", fam, strerror(-r), -r);
		return 0;
	}
	for (int i = 1; i < argc; i++) {
		int fam = atoi(argv[i]);
		long fd;

		if (refuse_vsock(fam))
			return 2;
		fd = syscall(SYS_socket, fam, sock_type(fam), 0);
		if (fd >= 0) {
			printf("family %d: ok\n", fam);
			close((int)fd);
		} else {
			printf("family %d: refused: %s (errno %d)\n", fam, strerror(errno), errno);
		}
	}
	return 0;
}
