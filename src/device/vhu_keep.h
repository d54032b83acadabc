/* SPDX-License-Identifier: MIT */
/*
 * Crash survival of the vhost-user glue (vhu.c; docs/upgrade.md, "Crash survival"): what a
 * process serving VMs keeps outside itself so that a process started after it dies can serve
 * the same VMMs over the same vhost-user connections (QEMU never reconnects a
 * vhost-user-vsock device).
 *
 * Per VM, a small record (REC_KIND_CRASH, version 1) and its fds, written by the glue after
 * every vhost-user message that changed the back-end's configuration (never per packet) and
 * handed to a keeper (uvsockd --isolate: the worker sends it to the main process,
 * daemon/isolate.c). Its items:
 *   1  guest CID (u32)
 *   2  the vhost-user back-end (list: vhu_backend_snapshot(), src/vhost_user/backend.h); absent
 *      when the VM has no VMM any more: the keeper drops what it kept
 *   3  the index of the VMM's connection among the record's fds (u32; with 2)
 *   4  the guest's connections the device had (list: vsock_engine_save_conns; with 2),
 *      written again when that set changes (at most every VHU_KEEP_CONNS_MS)
 * A restarted process is offered the records it kept (dev_vhu_adopt_offer) before its devices
 * are made; dev_vhu_new then adopts the connection instead of waiting for a VMM
 * (vhu_backend_resume_adopted: rings at the used index), posts a TRANSPORT_RESET on the event
 * queue when the back-end has it, sends an RST for each kept connection (for a guest whose
 * event queue is the VMM's, as with QEMU), and serves on. The listening socket is bound again as usual.
 *
 * The keeper holds fds only (the connection, the memory regions' fds, eventfds): it never maps
 * guest memory (docs/security.md).
 */
#ifndef UVSOCK_DEVICE_VHU_KEEP_H
#define UVSOCK_DEVICE_VHU_KEEP_H

#include <stddef.h>
#include <stdint.h>

#define VHU_KEEP_VERSION 1u
enum { VHU_KEEP_T_CID = 1, VHU_KEEP_T_BACKEND, VHU_KEEP_T_CONN, VHU_KEEP_T_CONNS };
/* A change of the set of connections is kept at most this often (a burst of connections
 * costs one record); a crash inside that window misses the newest connections' RSTs. */
#define VHU_KEEP_CONNS_MS 100u
/* At most this many connections are read back from a record. */
#define VHU_KEEP_MAX_CONNS (1u << 20)
/* A record names at most this many fds (connection, 8 regions, 3 rings x 3, the dirty log and
 * its eventfd); a keeper refuses more. */
#define VHU_KEEP_MAX_FDS 24u

/*
 * The keeper of this process: fn gets every new record of every VM (buf of len bytes and nfds
 * fds, all borrowed for the call), from each device's thread (fn serialises itself). NULL: none
 * (the default: nothing is kept). Set before any device is made.
 */
typedef void (*dev_vhu_keep_fn)(void *arg, uint32_t cid, const uint8_t *buf, size_t len,
				const int *fds, size_t nfds);
void dev_vhu_set_keeper(dev_vhu_keep_fn fn, void *arg);

/*
 * Reads a record's header and top level (what a keeper needs, no guest memory touched): the
 * guest CID, the VMM's connection among fds (-1: the record drops the VM) and (ret_nconns may
 * be NULL) how many connections it lists. Returns 0 or -errno (-EBADMSG, -EPROTONOSUPPORT,
 * -E2BIG over VHU_KEEP_MAX_FDS).
 */
int dev_vhu_keep_peek(const uint8_t *buf, size_t len, const int *fds, size_t nfds,
		      uint32_t *ret_cid, int *ret_conn, size_t *ret_nconns);

/*
 * Offers a kept record (its sealed memfd and fds, taken over: closed by this module whatever
 * happens) to the device of its CID made next by dev_vhu_new. Returns 0 or -errno (a record
 * that cannot be read: then nothing is kept). Call before the devices are made.
 */
int dev_vhu_adopt_offer(int memfd, int *fds, size_t nfds);

/* Closes every offer no device took (its VM is no longer configured, or it failed). */
void dev_vhu_adopt_clear(void);

#endif
