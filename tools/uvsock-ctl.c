/* SPDX-License-Identifier: MIT */
/*
 * uvsock-ctl: adds and removes VMs of a running uvsockd through its control socket. All of it is
 * in tools/ctlcli.c (so that tests run it in-process); see man/uvsock-ctl.1 and
 * docs/uvsockd.md ("Runtime VMs").
 */
#include <stdio.h>

#include "ctlcli.h"

#ifndef UVSOCK_VERSION
#define UVSOCK_VERSION "unknown"
#endif

int main(int argc, char **argv)
{
	return uvsock_ctl_main(argc, argv, UVSOCK_VERSION, stdout, stderr);
}
