/* SPDX-License-Identifier: MIT */
/*
 * Checks of one parsed VM entry (struct uvsockd_vm_config), for the tests of uvsockd's two VM
 * parsers: the command line (tests/unit/daemon/test-options.c) and the --config file
 * (tests/unit/daemon/test-config.c). The includer links uvsockd's static library, which puts
 * daemon/ on its include path (options.h).
 */
#ifndef UVSOCK_TESTS_VMCONFIG_H
#define UVSOCK_TESTS_VMCONFIG_H

#include "options.h" /* daemon/options.h: UVSOCKD_DEFAULT_* */
#include "test.h"

/* vm has this CID, these socket paths and sizes, and n_groups groups. */
#define ASSERT_VM(vm, cid, sock, uds, txbuf, qsize, ngroups)                                       \
	do {                                                                                       \
		ASSERT_EQ((vm).guest_cid, cid);                                                    \
		ASSERT_STREQ((vm).socket_path, sock);                                              \
		ASSERT_STREQ((vm).uds_path, uds);                                                  \
		ASSERT_EQ((vm).tx_buffer_size, txbuf);                                             \
		ASSERT_EQ((vm).queue_size, qsize);                                                 \
		ASSERT_EQ((vm).n_groups, ngroups);                                                 \
	} while (0)

/* vm has uvsockd's defaults for what its entry left out: sizes, and the group "default". */
#define ASSERT_VM_DEFAULTS(vm)                                                                     \
	do {                                                                                       \
		ASSERT_EQ((vm).tx_buffer_size, UVSOCKD_DEFAULT_TX_BUFFER_SIZE);                    \
		ASSERT_EQ((vm).queue_size, UVSOCKD_DEFAULT_QUEUE_SIZE);                            \
		ASSERT_EQ((vm).n_groups, 1);                                                       \
		ASSERT_STREQ((vm).groups[0], "default");                                           \
	} while (0)

#endif
