/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's live upgrade (docs/upgrade.md, "The protocol"): the running process starts a new
 * binary with --takeover FD and hands it every VM over a SOCK_SEQPACKET socketpair, each VM as
 * one record of kind REC_KIND_VM (its configuration, the vhost-user glue with the listening
 * socket, the back-end's part and the device's part) with its fds beside it (rec_send). The
 * new process checks each record whole and answers "ready" or "refused <reason>"; the old one
 * commits every VM at once with one "go" (which carries the control socket's listening fd), or
 * on any refusal, a timeout or the new process dying, resumes every VM it had stopped. Both
 * sides of that exchange are here; building and running the VMs is vms.c's.
 *
 * Messages (each one SOCK_SEQPACKET message, text unless said):
 *   new -> old  "hello <pid> <vmin> <vmax>"   the VM record versions it reads
 *   child       "exec-failed <errno>"         (the forked child, when execve failed)
 *   old -> new  "vms <n>", then per VM: the record and its fds (rec_send), and
 *   new -> old  "ready" | "refused <reason>"
 *   old -> new  "go <ctl dev> <ctl ino>" (+ the control listening fd, if any) | "abort"
 *   new -> old  "started <pid> <ns>..."        when each VM serves (CLOCK_MONOTONIC)
 *
 * Context: the old side runs on the thread that asked (the control thread, or the main thread
 * on SIGUSR2) with the VM set's lock held; the new side on the new process's main thread.
 */
#ifndef UVSOCK_DAEMON_UPGRADE_H
#define UVSOCK_DAEMON_UPGRADE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "options.h"
#include "util/uds.h"

struct dev_vhu;
struct rec_reader;
struct rec_writer;
struct vsock_dev;

/* The VM record (REC_KIND_VM): the version written, and the range read. */
#define UPGRADE_VM_REC_VERSION 1u
/*
 * The highest VM record version this binary reads: UPGRADE_VM_REC_VERSION, or what
 * UVSOCKD_TEST_VM_REC_READ_MAX says at compile time (the test binary uvsockd-test-refuse reads
 * none, to test a refused upgrade).
 */
extern uint32_t upgrade_vm_rec_read_max;

/* How long each step may take before the old process gives up (a hang guard, not a bound). */
#define UPGRADE_STEP_TIMEOUT_MS 30000

/* ---- the old process ---------------------------------------------------------------------- */

struct upgrade_vm {
	const struct uvsockd_vm_config *cfg; /* name filled in */
	uint32_t max_conns;                  /* what the fd budget gave it */
	struct vsock_dev *core;
	struct dev_vhu *vhu;
	/* results */
	uint64_t pause_ns;
	unsigned conns;
};

struct upgrade_result {
	pid_t old_pid, new_pid;
	/* go was sent: the VMs are the new process's even if upgrade_run failed after it (the
	 * new process did not confirm): the caller exits all the same */
	bool committed;
};

/*
 * Hands the n VMs to a new process running binary (NULL: this binary's path, read again from
 * disk) with the arguments argv[1..argc) after "--takeover FD". ctl: the control socket's
 * listener (fd -1: none), sent with the go. Returns 0 when the new process serves every VM
 * (each glue marked given: the caller must exit without touching them, and without removing
 * any socket file), or -errno with a one-line reason in err ("upgrade refused by PATH (pid N):
 * ...") and every VM serving here again.
 */
int upgrade_run(const char *binary, int argc, char *const *argv, struct upgrade_vm *vms,
		unsigned n, const struct uds_listener *ctl, struct upgrade_result *res, char *err,
		size_t errlen);

/*
 * v in decimal into out (at least 11 bytes), async-signal-safe: for a child between fork and
 * execve (this file's spawn, isolate.c's new workers and main).
 */
void upgrade_utoa(unsigned v, char *out);

/*
 * The same hand-over to a new process that someone else started (the main process of
 * --isolate starts a new worker and gives its old worker the socket: docs/upgrade.md, "Under
 * --isolate"): sock is this side's end (closed here), pid and path only name it in messages;
 * it is never killed or reaped here. No control socket travels. Returns as upgrade_run.
 */
int upgrade_hand_over(int sock, pid_t pid, const char *path, struct upgrade_vm *vms,
		      unsigned n, struct upgrade_result *res, char *err, size_t errlen);

/* This binary's path on disk now (a replaced file's " (deleted)" dropped). Returns 0 or -errno. */
int upgrade_self_path(char *buf, size_t len);

/* ---- the new process ---------------------------------------------------------------------- */

/*
 * Builds one VM from its record: cfg as it was (name filled in), the fd budget's max_conns and
 * the glue's items in r. Returns 0 or -errno with a reason in err (the record refused).
 */
typedef int (*upgrade_restore_fn)(void *arg, const struct uvsockd_vm_config *cfg,
				  uint32_t max_conns, struct rec_reader *r, char *err,
				  size_t errlen);

/*
 * The new process's check of one VM record (kind 4), the fuzzed reader (fuzz/fuzz-vmrec.c):
 * the header, version and checksum (rec_open, versions 1..upgrade_vm_rec_read_max), the
 * configuration, then the glue through restore, and every fd named by an item. buf, fds stay
 * the caller's. Returns 0, or -errno with why (never empty) saying what was refused.
 */
int upgrade_vm_rec_read(const uint8_t *buf, size_t len, const int *fds, size_t nfds,
			upgrade_restore_fn restore, void *arg, char *why, size_t whylen);
/* The old process's side: a VM record for v, up to the glue's list, which it leaves open
 * (the glue's items, dev_vhu_stop and dev_vhu_save_device, then rec_end). */
void upgrade_vm_rec_begin(struct rec_writer *w, const struct upgrade_vm *v);

/*
 * Takes the VMs over from the old process on fd: hello, each record checked and restored
 * through restore (answered ready or refused), then waits for go. Returns 0 after go with
 * *ctl the control socket's listener (fd -1: none), or -errno (refused, aborted, the old
 * process gone): the caller then exits without touching anything it restored.
 */
int upgrade_takeover(int fd, upgrade_restore_fn restore, void *arg, struct uds_listener *ctl);

/* After go: every VM serves; serve_ns[i] is when VM i did (CLOCK_MONOTONIC). Closes fd. */
void upgrade_takeover_done(int fd, const uint64_t *serve_ns, unsigned n);

#endif
