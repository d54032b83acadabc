/* SPDX-License-Identifier: MIT */
/*
 * uvsock-run [--control PATH] [--listen-vm CID[,CID...]] [-v] [--] PROGRAM [ARGS...]
 *
 * Runs an unmodified AF_VSOCK host program over uvsockd (docs/shim.md, man/uvsock-run.1): sets
 * LD_PRELOAD to libuvsock-preload.so and UVSOCK_CONTROL to the control socket, then, before the
 * exec, makes sure the program can never reach this machine's own vsock:
 *
 *   - a seccomp filter (plain BPF, x86_64) makes socket() and socketpair() with AF_VSOCK fail
 *     with EAFNOSUPPORT, so a call the shim does not see (a static program, a raw system call)
 *     fails instead of creating a kernel vsock socket; io_uring_setup, io_uring_enter and
 *     io_uring_register fail with ENOSYS, and io_urings inherited from the caller are closed
 *     first (an io_uring socket request is not a system call a filter sees); a system call of
 *     another ABI (i386) fails with ENOSYS. Without the filter in place, nothing runs.
 *   - /dev/vsock, when it exists, is covered by /dev/null in a private mount namespace (a
 *     filter cannot match an openat() by path); if the namespace cannot be had, -v says so and
 *     the shim's emulated open("/dev/vsock") is what the program gets through libc.
 *
 * Test knob (never documented as a feature): UVSOCK_RUN_TEST_BLOCK_FAMILY=<n> adds address
 * family n to the refused ones, so the tests prove the filter with a harmless family and never
 * with AF_VSOCK itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef UVSOCK_LIBDIR
#define UVSOCK_LIBDIR "/usr/local/lib"
#endif
#define PRELOAD_NAME "libuvsock-preload.so"
/* The packaged uvsockd.service's control socket: the shim's and the tools' default too
 * (src/ctlproto/proto.h OPS_CTL_DEFAULT_PATH). */
#define DEFAULT_CONTROL "/run/uvsockd/control.sock"
#define X32_SYSCALL_BIT 0x40000000u
#define NR_IO_URING_SETUP 425u
#define NR_IO_URING_ENTER 426u
#define NR_IO_URING_REGISTER 427u

static bool verbose;

static void usage(FILE *f)
{
	fprintf(f, "usage: uvsock-run [--control PATH] [--listen-vm CID[,CID...]] [-v] [--] "
		   "PROGRAM [ARGS...]\n"
		   "Runs PROGRAM with its AF_VSOCK sockets carried by uvsockd\n"
		   "(libuvsock-preload.so), "
		   "under a seccomp filter that refuses the kernel's AF_VSOCK.\n"
		   "  --control PATH     uvsockd's control socket (default: $UVSOCK_CONTROL, else "
		   DEFAULT_CONTROL ")\n"
		   "  --listen-vm LIST   listeners serve only these VMs (default: every VM)\n"
		   "  -v, --verbose      say what was set up\n");
}

/* The library: $UVSOCK_PRELOAD, else next to a build tree's tools/, else the installed one. */
static int find_preload(char *buf, size_t len)
{
	const char *env = getenv("UVSOCK_PRELOAD");
	char exe[PATH_MAX];
	ssize_t n;

	if (env && env[0]) {
		snprintf(buf, len, "%s", env);
		return access(buf, R_OK) == 0 ? 0 : -errno;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		snprintf(buf, len, "%s/../src/shim/%s", dirname(exe), PRELOAD_NAME);
		if (access(buf, R_OK) == 0)
			return 0;
	}
	snprintf(buf, len, "%s/%s", UVSOCK_LIBDIR, PRELOAD_NAME);
	return access(buf, R_OK) == 0 ? 0 : -errno;
}

static int set_preload(const char *lib)
{
	const char *old = getenv("LD_PRELOAD");
	char *v;
	int r;

	if (old && old[0]) {
		size_t n = strlen(lib) + strlen(old) + 2;

		v = malloc(n);
		if (!v)
			return -ENOMEM;
		/* After what is there: a sanitizer runtime the caller preloads stays first. */
		snprintf(v, n, "%s:%s", old, lib);
		r = setenv("LD_PRELOAD", v, 1);
		free(v);
	} else {
		r = setenv("LD_PRELOAD", lib, 1);
	}
	return r < 0 ? -errno : 0;
}

/* One BPF statement / jump (linux/filter.h's macros, spelled out for the -W flags). */
#define STMT(c, k) ((struct sock_filter){ (unsigned short)(c), 0, 0, (unsigned)(k) })
#define JEQ(k, t, f) ((struct sock_filter){ BPF_JMP | BPF_JEQ | BPF_K, (t), (f), (unsigned)(k) })
#define RET_ERRNO(e) STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

/*
 * socket/socketpair(AF_VSOCK or test_family) -> EAFNOSUPPORT; io_uring_setup, _enter and
 * _register -> ENOSYS (a ring that reaches the program later, in an SCM_RIGHTS message, cannot
 * be driven; close_inherited_rings() took care of the ones it had at the exec); any
 * system call of another ABI -> ENOSYS; the rest allowed. x32 calls (nr | X32_SYSCALL_BIT,
 * same arch value) are matched on the number without that bit: socket is 41 there too.
 */
static int install_filter(int test_family)
{
	struct sock_filter f[] = {
		STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		JEQ(AUDIT_ARCH_X86_64, 1, 0),
		RET_ERRNO(ENOSYS),
		STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		STMT(BPF_ALU | BPF_AND | BPF_K, ~X32_SYSCALL_BIT),
		JEQ(NR_IO_URING_SETUP, 2, 0),
		JEQ(NR_IO_URING_ENTER, 1, 0),
		JEQ(NR_IO_URING_REGISTER, 0, 1),
		RET_ERRNO(ENOSYS),
		JEQ(SYS_socket, 1, 0),
		JEQ(SYS_socketpair, 0, 4),
		/* The family: the low 32 bits of args[0] (an int; little-endian). */
		STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		JEQ(AF_VSOCK, 1, 0),
		JEQ((unsigned)test_family, 0, 1),
		RET_ERRNO(EAFNOSUPPORT),
		STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -errno;
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0)
		return 0;
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0)
		return 0;
	return -errno;
}

/*
 * Closes every io_uring this process inherited (its parent may have left one open across the
 * exec): a ring's operations, IORING_OP_SOCKET among them, are not system calls the filter
 * sees, and with IORING_SETUP_SQPOLL the kernel runs them without any system call at all, so
 * refusing io_uring_enter is not enough. Returns how many were closed, or -errno.
 */
static int close_inherited_rings(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		char path[64], link[64];
		ssize_t len;
		int fd = atoi(e->d_name);

		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len < 0)
			continue;
		link[len] = '\0';
		if (!strcmp(link, "anon_inode:[io_uring]") && close(fd) == 0)
			n++;
	}
	closedir(d);
	return n;
}

static int write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
		r = -errno;
	close(fd);
	return r;
}

/* A user namespace mapping only our own ids (for the mount namespace without privileges). */
static int enter_userns(void)
{
	char map[64];
	uid_t uid = getuid();
	gid_t gid = getgid();
	int r;

	if (unshare(CLONE_NEWUSER) < 0)
		return -errno;
	snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)uid, (unsigned)uid);
	r = write_file("/proc/self/uid_map", map);
	if (r == 0)
		r = write_file("/proc/self/setgroups", "deny\n");
	snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)gid, (unsigned)gid);
	if (r == 0)
		r = write_file("/proc/self/gid_map", map);
	return r;
}

/* Covers /dev/vsock with /dev/null in a private mount namespace. Returns 0, 1 (no /dev/vsock
 * here: nothing to do) or -errno; *how says which namespaces were used. */
static int hide_dev_vsock(const char **how)
{
	struct stat st;

	*how = "";
	if (lstat("/dev/vsock", &st) < 0)
		return 1;
	if (unshare(CLONE_NEWNS) == 0) {
		*how = "a private mount namespace";
	} else {
		int r = enter_userns();

		if (r < 0)
			return r;
		if (unshare(CLONE_NEWNS) < 0)
			return -errno;
		*how = "private user and mount namespaces";
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return -errno;
	if (mount("/dev/null", "/dev/vsock", NULL, MS_BIND, NULL) < 0)
		return -errno;
	return 0;
}

int main(int argc, char **argv)
{
	const char *control = getenv("UVSOCK_CONTROL"), *listen_vms = NULL, *how, *tf;
	char lib[PATH_MAX];
	int i, r, test_family = -1;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
			verbose = true;
		} else if (!strcmp(argv[i], "--control") && i + 1 < argc) {
			control = argv[++i];
		} else if (!strncmp(argv[i], "--control=", 10)) {
			control = argv[i] + 10;
		} else if (!strcmp(argv[i], "--listen-vm") && i + 1 < argc) {
			listen_vms = argv[++i];
		} else if (!strncmp(argv[i], "--listen-vm=", 12)) {
			listen_vms = argv[i] + 12;
		} else {
			fprintf(stderr, "uvsock-run: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	r = find_preload(lib, sizeof(lib));
	if (r < 0) {
		fprintf(stderr, "uvsock-run: %s not found (%s): set UVSOCK_PRELOAD\n", PRELOAD_NAME,
			strerror(-r));
		return 127;
	}
	if (set_preload(lib) < 0 ||
	    setenv("UVSOCK_CONTROL", control && control[0] ? control : DEFAULT_CONTROL, 1) < 0 ||
	    (listen_vms && setenv("UVSOCK_LISTEN_VMS", listen_vms, 1) < 0)) {
		fprintf(stderr, "uvsock-run: cannot set the environment: %s\n", strerror(errno));
		return 127;
	}
	r = hide_dev_vsock(&how);
	if (r < 0)
		fprintf(stderr, "uvsock-run: /dev/vsock stays visible (%s): the shim emulates "
			"open(\"/dev/vsock\") and the filter refuses AF_VSOCK sockets\n",
			strerror(-r));
	else if (verbose)
		fprintf(stderr, r == 1 ? "uvsock-run: no /dev/vsock on this machine%s\n"
				       : "uvsock-run: /dev/vsock hidden by /dev/null in %s\n", how);
	r = close_inherited_rings();
	if (r < 0) {
		fprintf(stderr, "uvsock-run: cannot list inherited fds (%s): refusing to run %s "
			"with an io_uring it may have inherited\n", strerror(-r), argv[i]);
		return 126;
	}
	if (verbose && r > 0)
		fprintf(stderr, "uvsock-run: closed %d inherited io_uring fd(s)\n", r);
	tf = getenv("UVSOCK_RUN_TEST_BLOCK_FAMILY");
	if (tf && tf[0])
		test_family = atoi(tf);
	r = install_filter(test_family);
	if (r < 0) {
		fprintf(stderr, "uvsock-run: cannot install the seccomp filter (%s): "
			"refusing to run %s without it\n", strerror(-r), argv[i]);
		return 126;
	}
	if (verbose)
		fprintf(stderr, "uvsock-run: seccomp filter installed (socket(AF_VSOCK%s) "
			"refused); LD_PRELOAD=%s; control %s\n",
			test_family >= 0 ? " and the test family" : "", lib,
			getenv("UVSOCK_CONTROL"));
	execvp(argv[i], argv + i);
	r = errno;
	fprintf(stderr, "uvsock-run: cannot run %s: %s\n", argv[i], strerror(r));
	return r == ENOENT ? 127 : 126;
}
