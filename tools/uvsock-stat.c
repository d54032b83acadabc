/* SPDX-License-Identifier: MIT */
/*
 * uvsock-stat: counters, connection listing and packet capture of a running uvsockd, through its
 * control socket. All of it is in tools/statcli.c (so that tests run it in-process); see
 * man/uvsock-stat.1 and docs/operations.md.
 */
#include <stdio.h>

#include "statcli.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

int main(int argc, char **argv)
{
	return uvsock_stat_main(argc, argv, UVSOCK_VERSION, stdout, stderr);
}
