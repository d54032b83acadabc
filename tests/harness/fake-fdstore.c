/* SPDX-License-Identifier: MIT */
/*
 * fake-fdstore: runs a service under a fake service manager with a file descriptor store
 * (fakesd.h), for tests that need uvsockd's crash survival through systemd's fd store on a
 * machine whose systemd must not be touched (docs/upgrade.md, "Without --isolate: the systemd fd
 * store").
 *
 *   fake-fdstore [--restart-on-kill] [--max N] -- /path/to/uvsockd ARGS...
 *
 * Starts the program with NOTIFY_SOCKET (a datagram socket in a temporary directory of its
 * own) and FDSTORE=N (default 4096; 0: no store), keeps what it stores, and prints one line per
 * start on stdout, `fake-fdstore: started pid P`. With --restart-on-kill, a program that dies
 * of SIGKILL is started again at once with the store as LISTEN_FDS/LISTEN_FDNAMES/LISTEN_PID
 * (`fake-fdstore: pid P killed, N fds stored: started again`); any other end is final, and
 * fake-fdstore exits with the program's status (128 + signal for a signal). SIGTERM and SIGINT
 * are passed on to the running program. stderr of the program is fake-fdstore's.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "fakesd.h"

static void usage(void)
{
	fprintf(stderr, "usage: fake-fdstore [--restart-on-kill] [--max N] -- PROGRAM ARGS...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/fake-fdstore-XXXXXX";
	bool restart = false;
	struct fakesd *s;
	unsigned max = FAKESD_MAX;
	sigset_t sigs;
	int i, r, rc = 1;
	pid_t pid;

	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (strcmp(argv[i], "--restart-on-kill") == 0)
			restart = true;
		else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc)
			max = (unsigned)strtoul(argv[++i], NULL, 10);
		else
			usage();
	}
	if (i + 1 >= argc)
		usage();
	argv += i + 1;
	/* Taken synchronously here; blocked before the reader thread starts, so it never gets
	 * them (the program's mask is cleared in fakesd_spawn). */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGCHLD);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	s = calloc(1, sizeof(*s));
	if (!s || !mkdtemp(dir)) {
		perror("fake-fdstore");
		return 1;
	}
	r = fakesd_init(s, dir);
	if (r < 0) {
		fprintf(stderr, "fake-fdstore: %s: %s\n", dir, strerror(-r));
		rmdir(dir);
		return 1;
	}
	s->max = max;
	pid = fakesd_spawn(s, argv, -1, false);
	if (pid < 0) {
		fprintf(stderr, "fake-fdstore: %s: %s\n", argv[0], strerror(-pid));
		goto out;
	}
	printf("fake-fdstore: started pid %d\n", (int)pid);
	fflush(stdout);
	for (;;) {
		siginfo_t si;
		int st, sig = sigwaitinfo(&sigs, &si);

		if (sig == SIGTERM || sig == SIGINT) {
			kill(pid, sig);
			continue;
		}
		if (sig != SIGCHLD || waitpid(pid, &st, WNOHANG) != pid)
			continue;
		if (restart && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
			pid_t old = pid;

			(void)fakesd_drain(s, 5000);
			pid = fakesd_spawn(s, argv, -1, true);
			if (pid < 0) {
				fprintf(stderr, "fake-fdstore: %s: %s\n", argv[0], strerror(-pid));
				break;
			}
			printf("fake-fdstore: pid %d killed, %zu fds stored: started again\n"
			       "fake-fdstore: started pid %d\n", (int)old,
			       fakesd_count(s, ""), (int)pid);
			fflush(stdout);
			continue;
		}
		rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		(void)fakesd_drain(s, 5000);
		printf("fake-fdstore: pid %d ended (%s %d), %zu fds stored\n", (int)pid,
		       WIFEXITED(st) ? "status" : "signal",
		       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), fakesd_count(s, ""));
		fflush(stdout);
		break;
	}
out:
	fakesd_fini(s);
	free(s);
	rmdir(dir);
	return rc;
}
