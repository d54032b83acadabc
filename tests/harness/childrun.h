/* SPDX-License-Identifier: MIT */
/*
 * One measurement in a process of its own, for the benchmark modes of the integration tests: a
 * failed assertion (test_fail exits) ends only that child, and its result comes back through a
 * pipe.
 */
#ifndef UVSOCK_TESTS_CHILDRUN_H
#define UVSOCK_TESTS_CHILDRUN_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

/*
 * Runs fn(arg, res) in a forked child and copies its res (len bytes) back. Returns true if the
 * child sent it and exited with status 0.
 */
static inline bool test_run_in_child(void (*fn)(void *arg, void *res), void *arg, void *res,
				     size_t len)
{
	int p[2], st;
	pid_t pid;
	bool ok;

	ASSERT_OK(pipe2(p, O_CLOEXEC));
	fflush(stdout);
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		close(p[0]);
		fn(arg, res);
		(void)!write(p[1], res, len);
		_exit(0);
	}
	close(p[1]);
	ok = read(p[0], res, len) == (ssize_t)len;
	close(p[0]);
	waitpid(pid, &st, 0);
	return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#endif
