/* SPDX-License-Identifier: MIT */
/* The test runner behind test.h: registration, fork-per-case with a time limit, TAP output. */
#include "test.h"

#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/time.h"

#define MAX_TESTS 512
#define EXIT_SKIP 77
#define DEFAULT_TIMEOUT_S 60

struct test_case {
	const char *name;
	test_fn fn;
};

static struct test_case cases[MAX_TESTS];
static int ncases;
static bool in_child;

void test_register(const char *name, test_fn fn)
{
	if (ncases == MAX_TESTS) {
		fprintf(stderr, "too many tests\n");
		abort();
	}
	cases[ncases].name = name;
	cases[ncases].fn = fn;
	ncases++;
}

void test_note(const char *fmt, ...)
{
	va_list ap;

	fputs("# ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stdout, "# FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	/* Exit the whole child process, whichever thread failed. */
	_exit(1);
}

void test_skip(const char *why)
{
	test_note("SKIP %s", why);
	_exit(EXIT_SKIP);
}

static bool listed(const char *name, char **list, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}

static int run_one(const struct test_case *tc, int timeout_s)
{
	pid_t pid, w;
	int status = 0;
	uint64_t end;

	fflush(stdout);
	if (getenv("UVSOCK_TEST_NOFORK")) {
		in_child = true;
		tc->fn();
		return 0;
	}
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		in_child = true;
		alarm((unsigned)timeout_s + 5); /* last resort if the parent dies */
		tc->fn();
		fflush(stdout);
		_exit(0);
	}
	end = test_now_ms() + (uint64_t)timeout_s * 1000u;
	for (;;) {
		w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			break;
		if (w < 0 && errno != EINTR) {
			perror("waitpid");
			return 1;
		}
		if (test_now_ms() >= end) {
			printf("# TIMEOUT after %d s\n", timeout_s);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return 1;
		}
		test_sleep_ms(2);
	}
	if (WIFSIGNALED(status)) {
		printf("# killed by signal %d\n", WTERMSIG(status));
		return 1;
	}
	return WEXITSTATUS(status);
}

int test_main(int argc, char **argv)
{
	char *pick[MAX_TESTS], *skip[MAX_TESTS];
	int npick = 0, nskip = 0, n = 0, failed = 0, skipped = 0, timeout_s = DEFAULT_TIMEOUT_S;
	const char *env = getenv("UVSOCK_TEST_TIMEOUT");

	if (env && atoi(env) > 0)
		timeout_s = atoi(env);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--list") == 0) {
			for (int j = 0; j < ncases; j++)
				printf("%d %s\n", j, cases[j].name);
			return 0;
		} else if (strcmp(argv[i], "--pick") == 0 && i + 1 < argc && npick < MAX_TESTS) {
			pick[npick++] = argv[++i];
		} else if (strcmp(argv[i], "--skip") == 0 && i + 1 < argc && nskip < MAX_TESTS) {
			skip[nskip++] = argv[++i];
		} else {
			fprintf(stderr, "usage: %s [--list] [--pick NAME]... [--skip NAME]...\n",
				argv[0]);
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	for (int j = 0; j < ncases; j++)
		if ((!npick || listed(cases[j].name, pick, npick)) &&
		    !listed(cases[j].name, skip, nskip))
			n++;
	printf("TAP version 13\n1..%d\n", n);
	n = 0;
	for (int j = 0; j < ncases; j++) {
		const struct test_case *tc = &cases[j];
		int r;

		if ((npick && !listed(tc->name, pick, npick)) || listed(tc->name, skip, nskip))
			continue;
		n++;
		r = run_one(tc, timeout_s);
		if (r == EXIT_SKIP) {
			printf("ok %d - %s # SKIP\n", n, tc->name);
			skipped++;
		} else if (r == 0) {
			printf("ok %d - %s\n", n, tc->name);
		} else {
			printf("not ok %d - %s\n", n, tc->name);
			failed++;
		}
		fflush(stdout);
	}
	if (failed)
		return 1;
	return n > 0 && skipped == n ? EXIT_SKIP : 0;
}

void test_sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

uint64_t test_now_ms(void)
{
	return mono_ms();
}
