/* SPDX-License-Identifier: MIT */
/*
 * The whole of `uvsock-stat` as a function, so that tests run it in-process against a control
 * server (tools/uvsock-stat.c is a two-line main), over the control protocol's client
 * (src/ctlproto/client.h). Built as a static library of its own (tools/meson.build).
 *
 * Security model: the answer comes from a daemon that may be of another version or broken: it is
 * size-bounded (OPS_STATCLI_MAX_ANSWER), time-bounded, parsed with the bounded JSON reader, and
 * missing or mistyped members print as 0 / "?" rather than failing.
 */
#ifndef UVSOCK_TOOLS_STATCLI_H
#define UVSOCK_TOOLS_STATCLI_H

#include <stdio.h>

#include "ctlproto/json.h"

/*
 * Writes the counters of a "stats" answer (every VM it lists) as a Prometheus text exposition
 * (format 0.0.4) or, with openmetrics, as OpenMetrics 1.0 text ending in "# EOF" (statprom.c;
 * metric names and labels in docs/operations.md).
 */
void ops_stat_prometheus(FILE *out, const struct ops_jv *stats, bool openmetrics);

/*
 * uvsock-stat: parses argv, talks to the daemon, prints to out (data) and err (diagnostics);
 * `version` is what --version prints. Returns the process exit code: 0, 1 (error talking to the
 * daemon, or an error answer), 2 (usage). Blocks SIGINT/SIGTERM in the calling thread while a
 * capture runs (they end it cleanly).
 */
int uvsock_stat_main(int argc, char **argv, const char *version, FILE *out, FILE *err);

#endif
