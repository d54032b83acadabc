/* SPDX-License-Identifier: MIT */
/* uvsock-perf's process-wide helpers (util.h): errors, progress, CPU and RSS clocks, medians. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "util/time.h"

bool g_quiet;
static void (*g_at_die)(void);
static uint64_t g_t0;

void perf_util_init(void)
{
	g_t0 = mono_ns();
}

double perf_elapsed_s(void)
{
	return (double)(mono_ns() - g_t0) / 1e9;
}

void perf_at_die(void (*fn)(void))
{
	g_at_die = fn;
}

void die(const char *fmt, ...)
{
	void (*fn)(void) = g_at_die;
	va_list ap;

	va_start(ap, fmt);
	fputs("uvsock-perf: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	g_at_die = NULL;
	if (fn)
		fn();
	exit(1);
}

void progress(const char *fmt, ...)
{
	va_list ap;

	if (g_quiet)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "[%5.0f s] ", (double)(mono_ns() - g_t0) / 1e9);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static double ts_s(const struct timeval *tv)
{
	return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

double cpu_self_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ts_s(&ru.ru_utime) + ts_s(&ru.ru_stime);
}

double cpu_thread_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* utime + stime of pid in seconds, from /proc/<pid>/stat; 0 if unknown. */
double cpu_pid_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;
	size_t n;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	/* Fields after the command: state(3) ... utime(14) stime(15). */
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* VmRSS of pid in KiB from /proc/<pid>/status; -1 if unknown. */
long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
