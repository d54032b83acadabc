/* SPDX-License-Identifier: MIT */
/*
 * uvsock-ctl as a function, so that tests run it in-process against a control server
 * (tools/uvsock-ctl.c is a two-line main): changes a running uvsockd through its control socket
 * (daemon/ctl.h): `add-vm SPEC` sends `vm-add SPEC`, `remove-vm CID|NAME` sends `vm-remove`. It uses the
 * control protocol's client (src/ctlproto/client.h: ops_ctl_connect, ops_ctl_request).
 *
 * Security model: as uvsock-stat: the answer is bounded in size and time and parsed with the
 * bounded JSON reader; the daemon serves only its own uid and root.
 */
#ifndef UVSOCK_TOOLS_CTLCLI_H
#define UVSOCK_TOOLS_CTLCLI_H

#include <stdio.h>

/*
 * uvsock-ctl: parses argv (getopt_long), sends one request, prints a one-line result to out
 * and diagnostics to err; `version` is what --version prints. Returns the process exit code:
 * 0, 1 (the daemon refused, or it cannot be reached), 2 (usage).
 */
int uvsock_ctl_main(int argc, char **argv, const char *version, FILE *out, FILE *err);

#endif
