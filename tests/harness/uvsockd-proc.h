/* SPDX-License-Identifier: MIT */
/*
 * Runs the uvsockd binary as a child process for the guest-role integration tests: a temporary
 * directory for the sockets, one --vm per guest (CIDs and groups as given), a bounded wait until
 * every vhost-user socket exists, and a bounded stop by PID (SIGTERM, then SIGKILL). The child
 * gets PR_SET_PDEATHSIG, so a test case that dies (failed assertion, time limit) never leaves a
 * daemon behind. The binary is $UVSOCKD, else the one built in this build tree.
 */
#ifndef UVSOCK_TESTS_UVSOCKD_PROC_H
#define UVSOCK_TESTS_UVSOCKD_PROC_H

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostside.h"
#include "test.h"

#ifndef UVSOCKD_PATH
#define UVSOCKD_PATH "uvsockd"
#endif

#define UVD_MAX_VMS 16

struct uvd {
	pid_t pid;
	int nvms;
	char dir[64];
	uint32_t cid[UVD_MAX_VMS];
	char sock[UVD_MAX_VMS][128];  /* vhost-user socket of VM i */
	char uds[UVD_MAX_VMS][128];   /* host-side uds-path of VM i */
	char log[128];
};

static inline const char *uvd_binary(void)
{
	const char *p = getenv("UVSOCKD");

	return p && *p ? p : UVSOCKD_PATH;
}

/*
 * Forks and executes uvsockd with argv (argv[0] the binary), stdout and stderr to u->log
 * (truncated first unless append). The child dies with this process (PR_SET_PDEATHSIG).
 */
static inline void uvd_spawn(struct uvd *u, char *const *argv, bool append)
{
	pid_t parent = getpid();

	u->pid = fork();
	ASSERT_GE(u->pid, 0);
	if (u->pid == 0) {
		int fd = open(u->log, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC,
			      0600);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0) {
			dup2(fd, 2);
			dup2(fd, 1);
		}
		execv(argv[0], argv);
		_exit(127);
	}
}

/*
 * Bounded wait (5 s) until every VM's vhost-user socket is there; fails the test case if the
 * daemon exits first or time runs out (messages name `what`: "start-up" or "restart").
 */
/* True once every VM's vhost-user socket exists. */
static inline bool uvd_sockets_ready(const struct uvd *u)
{
	struct stat sb;

	for (int i = 0; i < u->nvms; i++)
		if (stat(u->sock[i], &sb) != 0 || !S_ISSOCK(sb.st_mode))
			return false;
	return true;
}

/* True (and u->pid cleared, *st set) once the daemon has exited. */
static inline bool uvd_exited(struct uvd *u, int *st)
{
	if (u->pid <= 0 || waitpid(u->pid, st, WNOHANG) != u->pid)
		return false;
	u->pid = 0;
	return true;
}

static inline void uvd_wait_ready(struct uvd *u, const char *what)
{
	int st = 0;

	if (WAIT_FOR(uvd_sockets_ready(u) || uvd_exited(u, &st), 5000) && uvd_sockets_ready(u))
		return;
	if (u->pid == 0)
		test_fail(__FILE__, __LINE__, "uvsockd (%s) exited at %s (status %d); log: %s",
			  uvd_binary(), what, st, u->log);
	test_fail(__FILE__, __LINE__, "uvsockd sockets not ready within 5 s (%s)", what);
}

/*
 * Starts uvsockd with nvms VMs, CIDs cids[i], all in group `group` (NULL: each VM in its own
 * group "g<cid>"). extra: one more argument (e.g. "--log-level=warn") or NULL.
 */
static inline void uvd_start(struct uvd *u, int nvms, const uint32_t *cids, const char *group,
			     const char *extra)
{
	char *argv[2 * UVD_MAX_VMS + 4];
	char vmarg[UVD_MAX_VMS][400];
	int argc = 0;

	ASSERT_LE(nvms, UVD_MAX_VMS);
	memset(u, 0, sizeof(*u));
	u->nvms = nvms;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-it-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	argv[argc++] = (char *)uvd_binary();
	for (int i = 0; i < nvms; i++) {
		char grp[64];

		u->cid[i] = cids[i];
		snprintf(u->sock[i], sizeof(u->sock[i]), "%s/vm%u.sock", u->dir, cids[i]);
		snprintf(u->uds[i], sizeof(u->uds[i]), "%s/vm%u.vsock", u->dir, cids[i]);
		if (group)
			snprintf(grp, sizeof(grp), "%s", group);
		else
			snprintf(grp, sizeof(grp), "g%u", cids[i]);
		snprintf(vmarg[i], sizeof(vmarg[i]), "guest-cid=%u,socket=%s,uds-path=%s,groups=%s",
			 cids[i], u->sock[i], u->uds[i], grp);
		argv[argc++] = "--vm";
		argv[argc++] = vmarg[i];
	}
	argv[argc++] = (char *)(extra ? extra : "--log-level=warn");
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
}

/* Stops the daemon by PID (SIGTERM, 5 s, then SIGKILL); returns its exit status or -1. */
static inline int uvd_kill(struct uvd *u)
{
	int st = 0, ret = -1;

	if (u->pid <= 0)
		return -1;
	kill(u->pid, SIGTERM);
	if (WAIT_FOR(uvd_exited(u, &st), 5000)) {
		ret = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	} else {
		kill(u->pid, SIGKILL);
		waitpid(u->pid, &st, 0);
	}
	u->pid = 0;
	return ret;
}

/*
 * Starts a new daemon for a one-VM struct uvd on the same socket paths (the previous one must
 * be stopped with uvd_kill), serving guest CID new_cid: a back-end restart behind the VMM.
 */
static inline void uvd_restart_one(struct uvd *u, uint32_t new_cid)
{
	char vmarg[400];
	char *argv[] = { (char *)uvd_binary(), "--vm", vmarg, "--log-level=warn", NULL };

	ASSERT_EQ(u->nvms, 1);
	ASSERT_EQ(u->pid, 0);
	u->cid[0] = new_cid;
	snprintf(vmarg, sizeof(vmarg), "guest-cid=%u,socket=%s,uds-path=%s", new_cid, u->sock[0],
		 u->uds[0]);
	uvd_spawn(u, argv, true);
	uvd_wait_ready(u, "restart");
}

/* A "Key:   N kB" line of /proc/<pid>/status (VmRSS, VmSize...), in KiB; 0 if unreadable. */
static inline uint64_t proc_status_kib(pid_t pid, const char *key)
{
	char path[64], line[256];
	size_t kl = strlen(key);
	uint64_t kib = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			kib = strtoull(line + kl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kib;
}

/* VmRSS of the daemon in KiB, or 0 if unreadable. */
static inline uint64_t uvd_rss_kib(const struct uvd *u)
{
	return proc_status_kib(u->pid, "VmRSS");
}

/* True if the daemon is still running. */
static inline bool uvd_alive(struct uvd *u)
{
	int st;

	return u->pid > 0 && waitpid(u->pid, &st, WNOHANG) == 0;
}

/* Stops the daemon by PID (SIGTERM, 5 s, then SIGKILL) and removes the directory. Returns the
 * exit status (or -1 if it had to be killed). */
static inline int uvd_stop(struct uvd *u)
{
	int ret = uvd_kill(u);
	char path[400];
	DIR *dir;

	/* The daemon removes its own sockets; the log and the test's listeners go here. */
	dir = opendir(u->dir);
	if (dir) {
		struct dirent *de;

		while ((de = readdir(dir)) != NULL) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "%s/%s", u->dir, de->d_name);
			unlink(path);
		}
		closedir(dir);
	}
	rmdir(u->dir);
	return ret;
}

#endif
