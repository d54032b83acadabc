/* SPDX-License-Identifier: MIT */
/*
 * A static program for the test of uvsock-run's seccomp filter (tests/shim/test-shim.c): no
 * LD_PRELOAD reaches it, so only the filter stands between it and the kernel. It makes raw
 * socket() system calls of the families named on its command line and prints, per family,
 * "family N: ok" or "family N: refused: <strerror> (errno E)".
 *
 * SAFETY: it refuses AF_VSOCK (40) on its command line: the filter is proved with a harmless
 * family that uvsock-run's test knob adds (UVSOCK_RUN_TEST_BLOCK_FAMILY), never with vsock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		int fam = atoi(argv[i]);
		long fd;

		if (fam == 40) {
			fprintf(stderr, "shim-static: never AF_VSOCK\n");
			return 2;
		}
		/* SOCK_RAW for netlink (family 16, protocol 0 = NETLINK_ROUTE), else a stream. */
		fd = syscall(SYS_socket, fam, fam == 16 ? SOCK_RAW : SOCK_STREAM, 0);
		if (fd >= 0) {
			printf("family %d: ok\n", fam);
			close((int)fd);
		} else {
			printf("family %d: refused: %s (errno %d)\n", fam, strerror(errno), errno);
		}
	}
	return 0;
}
