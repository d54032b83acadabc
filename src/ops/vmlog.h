/* SPDX-License-Identifier: MIT */
/*
 * Tagged, rate-limited logging for messages a guest can trigger: every line carries
 * `vm=<cid> lp=<local port> pp=<peer port>` so that an operator can grep one VM or one
 * connection, and goes through log_ratelimited() (src/util/log.h: a burst of 10 per 5 s, then one
 * "N similar messages suppressed" line).
 *
 * Unlike log_guest(), whose limit is one per call site, log_vm() keeps OPS_VMLOG_SLOTS limits per
 * call site, chosen by the CID: a guest that floods one call site mostly silences itself, not
 * every other VM's messages from the same line (two CIDs that share a slot still share a limit).
 *
 *   log_vm(LOG_LVL_WARN, cid, lport, pport, "RST: %s", why);
 *   -> "uvsock warn: vm=3 lp=1234 pp=5000: RST: bad op"
 *
 * Use log_vm_dev() for messages about the VM as a whole (no connection): tags `vm=<cid>` only.
 * Context: any thread (log_ratelimited takes a short lock).
 */
#ifndef UVSOCK_OPS_VMLOG_H
#define UVSOCK_OPS_VMLOG_H

#include <stdint.h>

#include "util/log.h"

#define OPS_VMLOG_SLOTS 8u

#define log_vm(lvl, cid, lport, pport, fmt, ...)                                                   \
	do {                                                                                       \
		static struct log_ratelimit rl_vm_[OPS_VMLOG_SLOTS];                               \
		uint32_t cid_ = (uint32_t)(cid);                                                   \
		log_ratelimited(&rl_vm_[cid_ % OPS_VMLOG_SLOTS], lvl, "vm=%u lp=%u pp=%u: " fmt,   \
				cid_, (unsigned)(lport), (unsigned)(pport), ##__VA_ARGS__);        \
	} while (0)

#define log_vm_dev(lvl, cid, fmt, ...)                                                             \
	do {                                                                                       \
		static struct log_ratelimit rl_vm_[OPS_VMLOG_SLOTS];                               \
		uint32_t cid_ = (uint32_t)(cid);                                                   \
		log_ratelimited(&rl_vm_[cid_ % OPS_VMLOG_SLOTS], lvl, "vm=%u: " fmt, cid_,         \
				##__VA_ARGS__);                                                    \
	} while (0)

#endif
