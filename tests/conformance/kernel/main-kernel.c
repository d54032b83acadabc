/* SPDX-License-Identifier: MIT */
/*
 * uvsock-kconf: the conformance table (tests/conformance/cases.c) against Linux's own AF_VSOCK,
 * run inside the interop guest (docs/interop.md "The conformance table against the kernel").
 * Linked statically (the guest's initramfs has no libc); kvsock.c maps the uvsock_* calls onto
 * the real system calls.
 *
 *   uvsock-kconf [--pick NAME]... loopback
 *       both sides of every case in this guest over vsock_loopback (CID 1); CID 99 is the
 *       black hole (the guest's virtio transport sends it to uvsockd, which drops it)
 *   uvsock-kconf [--pick NAME]... server CTLPORT
 *   uvsock-kconf [--pick NAME]... client SERVER_CID CTLPORT
 *       the two sides in two guests (uvsockd's sibling routing): the server side waits for one
 *       SOCK_SEQPACKET control connection on CTLPORT, the client connects to it (retrying while
 *       the other guest boots); between two cases both sides meet on it ("END idx verdict"),
 *       and each case's own control messages run over a connection of its own to the same
 *       port, closed when the case ends (a side that failed so ends the other side's waits
 *       at once and leaves nothing behind for the next case)
 *   uvsock-kconf --list
 *
 * Each case runs in a forked child with a 60 s limit and prints, on stdout (the console):
 *   UVSOCK-BEGIN kconf/<case> 60
 *   UVSOCK-CASE kconf/<case> PASS|FAIL|SKIP <ms> <detail>
 * (the lines the interop harness reads; the child's own output follows as "# ..." lines). The
 * exit status is the number of failed cases (at most 125). SIGPIPE is ignored: uvsock never
 * raises it, Linux does for a send on a shut-down socket without MSG_NOSIGNAL.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf.h"
#include "kvsock.h"

#define CASE_LIMIT_S 60
#define CONNECT_RETRY_MS 120000
#define ACCEPT_WAIT_MS 240000
#define CASE_CTL_WAIT_MS 10000
#define BLACKHOLE_CID 99u
#define MAX_PICK 64
#define FD_LIMIT 8192u

static unsigned kernel_version;
static uint32_t local_cid, peer_cid;
static enum conf_role role = CONF_BOTH;

static int k_setup(struct conf_env *env)
{
	/* One context for this guest's CID serves whichever sides run here. */
	struct uvsock_ctx *ctx = kvsock_ctx_new(local_cid);

	if (!ctx)
		return -ENOMEM;
	*env = (struct conf_env){
		.client_ctx = ctx, .server_ctx = ctx,
		.server_cid = role == CONF_CLIENT ? peer_cid : local_cid,
		.client_cid = role == CONF_CLIENT ? local_cid : peer_cid,
		.blackhole_cid = BLACKHOLE_CID, .kernel = kernel_version,
	};
	return 0;
}

/* The one context k_setup made (client and server share it). */
static void k_teardown(struct conf_env *env)
{
	uvsock_ctx_free(env->server_ctx);
}

static const struct conf_factory kernel_factory = { "kernel", k_setup, k_teardown };

static unsigned parse_kernel(void)
{
	struct utsname u;
	unsigned major = 0, minor = 0;

	if (uname(&u) < 0 || sscanf(u.release, "%u.%u", &major, &minor) != 2)
		return CONF_KV(1, 0);
	return CONF_KV(major, minor);
}

/* This guest's CID, as the control connection's local address tells it. */
static uint32_t ctl_local_cid(int fd)
{
	struct sockaddr_vm sa;
	socklen_t len = sizeof(sa);

	if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
		return VMADDR_CID_ANY;
	return sa.svm_cid;
}

/* stream_1000_connections holds ~2000 descriptors (both ends in one process on loopback). */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_max < FD_LIMIT)
		rl.rlim_max = FD_LIMIT; /* root in the guest may raise it */
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

/* ---- Control connection between two guests ---- */

static int ctl_lfd = -1; /* server: the control port's listener */

static int ctl_connect(uint32_t cid, uint32_t port, uint64_t retry_ms)
{
	struct sockaddr_vm sa = vm_addr(cid, port);
	uint64_t end = test_now_ms() + retry_ms;

	for (;;) {
		int fd = socket(AF_VSOCK, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

		if (fd < 0)
			return -1;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		close(fd);
		if (test_now_ms() >= end)
			return -1;
		test_sleep_ms(200);
	}
}

/* The next connection to the control port (the first one tells the peer's CID). */
static int ctl_accept(uint32_t port, int wait_ms)
{
	struct sockaddr_vm sa = vm_addr(VMADDR_CID_ANY, port), peer;
	socklen_t len = sizeof(peer);
	struct pollfd p;
	int fd = -1;

	if (ctl_lfd < 0) {
		ctl_lfd = socket(AF_VSOCK, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (ctl_lfd < 0 || bind(ctl_lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    listen(ctl_lfd, 4) < 0)
			return -1;
	}
	p = (struct pollfd){ .fd = ctl_lfd, .events = POLLIN };
	if (poll(&p, 1, wait_ms) == 1) {
		fd = accept4(ctl_lfd, (struct sockaddr *)&peer, &len, SOCK_CLOEXEC);
		if (fd >= 0 && peer_cid == 0)
			peer_cid = peer.svm_cid;
	}
	return fd;
}

/* Both sides: a control connection of its own for one case. */
static int case_ctl(uint32_t port)
{
	if (role == CONF_SERVER)
		return ctl_accept(port, CASE_CTL_WAIT_MS);
	return ctl_connect(peer_cid, port, CASE_CTL_WAIT_MS);
}

/* Sends "END idx verdict" and reads up to the peer's END for idx; its verdict into *peer_v. */
static int ctl_meet(int ctl, unsigned idx, const char *verdict, char *peer_v, size_t vlen)
{
	char msg[256], want[32];
	int n;

	snprintf(msg, sizeof(msg), "END %u %s", idx, verdict);
	if (send(ctl, msg, strlen(msg), MSG_NOSIGNAL) < 0)
		return -1;
	n = snprintf(want, sizeof(want), "END %u ", idx);
	for (;;) {
		struct pollfd p = { .fd = ctl, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, (CASE_LIMIT_S + 10) * 1000) != 1)
			return -1;
		r = recv(ctl, msg, sizeof(msg) - 1, 0);
		if (r <= 0)
			return -1;
		msg[r] = '\0';
		/* Anything else is a message the other side's case left behind: dropped. */
		if (strncmp(msg, want, (size_t)n) == 0) {
			snprintf(peer_v, vlen, "%s", msg + n);
			return 0;
		}
	}
}

/* ---- Running one case ---- */

/* Runs case idx in a child; its output goes to the console as "# ..." lines, the first failure
 * or skip note into detail. Returns PASS, FAIL or SKIP. */
static const char *run_child(unsigned idx, int ctl, char *detail, size_t dlen)
{
	uint64_t end = test_now_ms() + CASE_LIMIT_S * 1000u;
	char buf[4096], line[400];
	size_t ll = 0;
	int pfd[2], status = 0;
	bool timed_out = false;
	pid_t pid;

	detail[0] = '\0';
	if (pipe(pfd) < 0) {
		snprintf(detail, dlen, "pipe: %s", strerror(errno));
		return "FAIL";
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		snprintf(detail, dlen, "fork: %s", strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		return "FAIL";
	}
	if (pid == 0) {
		close(pfd[0]);
		dup2(pfd[1], STDOUT_FILENO);
		close(pfd[1]);
		alarm(CASE_LIMIT_S + 5); /* last resort if the parent dies */
		conf_run_case(&kernel_factory, idx, role, ctl);
		fflush(stdout);
		_exit(0);
	}
	close(pfd[1]);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		int64_t left = (int64_t)(end - test_now_ms());
		ssize_t n;

		if (left <= 0 || poll(&p, 1, (int)left) == 0) {
			timed_out = true;
			kill(pid, SIGKILL);
			break;
		}
		n = read(pfd[0], buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] != '\n' && ll < sizeof(line) - 1) {
				line[ll++] = buf[i];
				continue;
			}
			if (buf[i] != '\n')
				continue;
			line[ll] = '\0';
			ll = 0;
			printf("# %s\n", line[0] == '#' ? line + 2 : line);
			if (!detail[0] && line[0] == '#')
				snprintf(detail, dlen, "%s", line + 2);
		}
	}
	close(pfd[0]);
	waitpid(pid, &status, 0);
	if (timed_out) {
		snprintf(detail, dlen, "time limit of %d s exceeded", CASE_LIMIT_S);
		return "FAIL";
	}
	if (WIFSIGNALED(status)) {
		snprintf(detail, dlen, "killed by signal %d", WTERMSIG(status));
		return "FAIL";
	}
	if (WEXITSTATUS(status) == 77)
		return "SKIP";
	return WEXITSTATUS(status) == 0 ? "PASS" : "FAIL";
}

static bool picked(const char *name, char **pick, int npick)
{
	if (npick == 0)
		return true;
	for (int i = 0; i < npick; i++)
		if (strcmp(pick[i], name) == 0)
			return true;
	return false;
}

static int usage(void)
{
	fprintf(stderr, "usage: uvsock-kconf [--pick NAME]... loopback | server CTLPORT | "
			"client SERVER_CID CTLPORT | --list\n");
	return 2;
}

/*
 * This program opens real AF_VSOCK sockets, which on a development machine would reach the
 * machine's own vsock: it runs only inside the interop guest, whose kernel command line carries
 * uvsock.kconf= (tests/interop/init.sh starts it from there).
 */
static bool in_interop_guest(void)
{
	char line[4096];
	FILE *f = fopen("/proc/cmdline", "re");
	bool ok = false;

	if (f) {
		ok = fgets(line, sizeof(line), f) && strstr(line, "uvsock.kconf=");
		fclose(f);
	}
	return ok;
}

int main(int argc, char **argv)
{
	char *pick[MAX_PICK];
	int npick = 0, i, ctl = -1, fails = 0;
	uint32_t ctl_port = 0;

	for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
		if (strcmp(argv[i], "--list") == 0) {
			for (unsigned c = 0; c < conf_ncases; c++)
				printf("%s\n", conf_cases[c].name);
			return 0;
		}
		if (strcmp(argv[i], "--pick") != 0 || i + 1 >= argc || npick == MAX_PICK)
			return usage();
		pick[npick++] = argv[++i];
	}
	if (i < argc && strcmp(argv[i], "loopback") == 0 && i + 1 == argc) {
		role = CONF_BOTH;
	} else if (i + 2 == argc && strcmp(argv[i], "server") == 0) {
		role = CONF_SERVER;
		ctl_port = (uint32_t)strtoul(argv[i + 1], NULL, 10);
	} else if (i + 3 == argc && strcmp(argv[i], "client") == 0) {
		role = CONF_CLIENT;
		peer_cid = (uint32_t)strtoul(argv[i + 1], NULL, 10);
		ctl_port = (uint32_t)strtoul(argv[i + 2], NULL, 10);
	} else {
		return usage();
	}
	if (!in_interop_guest()) {
		fprintf(stderr, "uvsock-kconf: no uvsock.kconf= on the kernel command line: this is not "
				"the interop guest, refusing to open AF_VSOCK sockets\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	setvbuf(stdout, NULL, _IOLBF, 0);
	kernel_version = parse_kernel();
	local_cid = VMADDR_CID_LOCAL; /* loopback: both sides on CID 1 */
	peer_cid = role == CONF_CLIENT ? peer_cid : (role == CONF_BOTH ? VMADDR_CID_LOCAL : 0);
	if (role == CONF_SERVER)
		ctl = ctl_accept(ctl_port, ACCEPT_WAIT_MS);
	else if (role == CONF_CLIENT)
		ctl = ctl_connect(peer_cid, ctl_port, CONNECT_RETRY_MS);
	if (role != CONF_BOTH && ctl < 0) {
		printf("UVSOCK-KCONF no control connection on port %u: %s\n", ctl_port,
		       strerror(errno));
		return 1;
	}
	if (ctl >= 0)
		local_cid = ctl_local_cid(ctl);
	printf("UVSOCK-KCONF %s kernel=%u.%u cid=%u peer=%u cases=%u\n", argv[i],
	       kernel_version / 1000, kernel_version % 1000, local_cid, peer_cid, conf_ncases);
	for (unsigned c = 0; c < conf_ncases; c++) {
		const char *name = conf_cases[c].name, *v;
		char detail[512], peer_v[256];
		uint64_t t0;
		int cctl;

		if (!picked(name, pick, npick))
			continue;
		printf("UVSOCK-BEGIN kconf/%s %d\n", name, CASE_LIMIT_S);
		t0 = test_now_ms();
		if (role == CONF_BOTH) {
			v = run_child(c, -1, detail, sizeof(detail));
		} else if ((cctl = case_ctl(ctl_port)) < 0) {
			v = "FAIL";
			snprintf(detail, sizeof(detail), "no control connection for the case: %s",
				 strerror(errno));
		} else {
			v = run_child(c, cctl, detail, sizeof(detail));
			close(cctl);
		}
		if (role != CONF_BOTH) {
			if (ctl_meet(ctl, c, v, peer_v, sizeof(peer_v)) < 0) {
				printf("UVSOCK-CASE kconf/%s FAIL %llu control connection lost\n",
				       name, (unsigned long long)(test_now_ms() - t0));
				return 1 + fails;
			}
			/* A side that failed makes the case fail on both; a skip is mutual. */
			if (strcmp(v, "PASS") == 0 && strcmp(peer_v, "PASS") != 0 &&
			    strcmp(peer_v, "SKIP") != 0) {
				v = "FAIL";
				snprintf(detail, sizeof(detail), "the other side: %s", peer_v);
			}
		}
		if (strcmp(v, "FAIL") == 0)
			fails++;
		printf("UVSOCK-CASE kconf/%s %s %llu %s\n", name, v,
		       (unsigned long long)(test_now_ms() - t0), detail[0] ? detail : "-");
	}
	if (ctl >= 0)
		close(ctl);
	if (ctl_lfd >= 0)
		close(ctl_lfd);
	return fails > 125 ? 125 : fails;
}
