/* SPDX-License-Identifier: MIT */
/*
 * The kernel mapping's own entry point (kvsock.c): a context for the conformance table that
 * stands for one CID of the running kernel's AF_VSOCK. The other uvsock_* calls it defines are
 * declared in include/uvsock/uvsock.h.
 */
#ifndef UVSOCK_TESTS_KVSOCK_H
#define UVSOCK_TESTS_KVSOCK_H

#include <stdint.h>

struct uvsock_ctx;

/* A context for CID cid (the caller frees it with uvsock_ctx_free); NULL with errno ENOMEM. */
struct uvsock_ctx *kvsock_ctx_new(uint32_t cid);

#endif
