/* SPDX-License-Identifier: MIT */
/*
 * A struct sockaddr_vm for the tests of the socket API (tests/unit/lib, the guest-role helpers of
 * guestside.h): AF_VSOCK with the given CID and port, every other byte zero.
 */
#ifndef UVSOCK_TESTS_VMADDR_H
#define UVSOCK_TESTS_VMADDR_H

#include <stdint.h>
#include <string.h>

#include <uvsock/uvsock.h>

static inline struct sockaddr_vm vm_addr(uint32_t cid, uint32_t port)
{
	struct sockaddr_vm a;

	memset(&a, 0, sizeof(a));
	a.svm_family = AF_VSOCK;
	a.svm_cid = cid;
	a.svm_port = port;
	return a;
}

#endif
