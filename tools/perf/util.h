/* SPDX-License-Identifier: MIT */
/*
 * uvsock-perf's process-wide helpers, used by every file of tools/perf/: fatal errors (die:
 * message, the at-die hook that stops the back-end this program started, exit 1), progress
 * lines on stderr (silenced by g_quiet), CPU clocks of this process, a thread and another
 * process, RSS, and the median of a run's samples.
 */
#ifndef UVSOCK_PERF_UTIL_H
#define UVSOCK_PERF_UTIL_H

#include <stdbool.h>
#include <sys/types.h>

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* fn runs once in die(), before the exit (the main program's teardown). */
void perf_at_die(void (*fn)(void));
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern bool g_quiet;
/* The clock progress() and perf_elapsed_s() count from. */
void perf_util_init(void);
double perf_elapsed_s(void);
double cpu_self_s(void);
double cpu_thread_s(void);
/* utime + stime of pid in seconds (/proc/<pid>/stat); 0 if unknown or pid <= 0. */
double cpu_pid_s(pid_t pid);
/* VmRSS of pid in KiB (/proc/<pid>/status); -1 if unknown. */
long rss_kib(pid_t pid);
int cmp_double(const void *a, const void *b);
/* Sorts v[0..n) in place and returns its median. */
double median(double *v, int n);

#endif
