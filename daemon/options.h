/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's command line: rust-vmm vhost-device-vsock compatible options (`--vm key=value,...`
 * repeatable, or the single-VM `--guest-cid/--socket/--uds-path...`), the vhost-user backend
 * program conventions (`--print-capabilities`, `--socket-path` alias, `--fd`/`fd=`) and our own
 * `--log-level`, `--config FILE` (vhost-device-vsock's YAML `vms:` list, parsed by
 * daemon/config.c), `--isolate` (one worker process per sibling group, daemon/isolate.c) with
 * the per-VM `cgroup=DIR`, `--socket-mode/--socket-group`, `--tune/--busy-poll-us`. Parsing
 * (GNU getopt_long) touches the file system only to read that file, so it is unit-testable;
 * uvsockd_check_paths() does the start-up checks that need the file system.
 *
 * Security model: argv comes from the operator, who is trusted, but every value is checked
 * (ranges, reserved CIDs, the 108-byte sun_path limit) so that mistakes give one clear line on
 * stderr instead of a daemon that half works.
 */
#ifndef UVSOCK_DAEMON_OPTIONS_H
#define UVSOCK_DAEMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "util/log.h"

#define UVSOCKD_MAX_VMS 1024
#define UVSOCKD_MAX_GROUPS 16
#define UVSOCKD_GROUP_NAME_MAX 63
/* sizeof(sockaddr_un.sun_path) is 108, including the terminating NUL. */
#define UVSOCKD_SUN_PATH_MAX 107
/* uds-path also names `<uds-path>_<port>` (port up to 10 digits) and `<uds-path>_seqpacket`. */
#define UVSOCKD_UDS_SUFFIX_MAX 11

#define UVSOCKD_DEFAULT_GUEST_CID 3u
#define UVSOCKD_DEFAULT_TX_BUFFER_SIZE (256u * 1024)
#define UVSOCKD_DEFAULT_QUEUE_SIZE 1024u
#define UVSOCKD_MIN_TX_BUFFER_SIZE 4096u
#define UVSOCKD_MAX_TX_BUFFER_SIZE (64u * 1024 * 1024)
#define UVSOCKD_MAX_QUEUE_SIZE 32768u
/* cgroup=DIR: an absolute path of at most this many bytes (DIR/cgroup.procs must fit PATH_MAX). */
#define UVSOCKD_CGROUP_PATH_MAX 1023
/* name=: a VM's name, at most this many bytes of [A-Za-z0-9._-], not all digits (so that a
 * CID and a name never look alike); max-conns=: host-side connections, in [1, this]. */
#define UVSOCKD_NAME_MAX 31
#define UVSOCKD_MAX_CONNS_MAX 65536u

/* One VM, whatever gave it: the command line, the --config file (config.h) or vm-add. */
struct uvsockd_vm_config {
	uint32_t guest_cid;
	char socket_path[UVSOCKD_SUN_PATH_MAX + 1]; /* vhost-user socket the VMM connects to */
	char uds_path[UVSOCKD_SUN_PATH_MAX + 1];    /* host side: listener and `_<port>` prefix */
	uint32_t tx_buffer_size; /* advertised buf_alloc per connection, bytes */
	uint32_t queue_size;     /* largest virtqueue size accepted from the VMM */
	unsigned n_groups;
	char groups[UVSOCKD_MAX_GROUPS][UVSOCKD_GROUP_NAME_MAX + 1];
	/* --isolate: the cgroup directory the VM's worker process joins ("" = stay where uvsockd
	 * is); every VM of one worker names the same one. */
	char cgroup[UVSOCKD_CGROUP_PATH_MAX + 1];
	/* --fd N / fd=N (N >= 3): an inherited vhost-user socket, listening or connected (QEMU's
	 * backend program conventions), used instead of binding; socket_path is then "/dev/fd/N".
	 * 0: none (so a zeroed entry has none). */
	int fd;
	char name[UVSOCKD_NAME_MAX + 1]; /* name= for logs, uvsock-stat, vm-remove ("" = vm<cid>) */
	uint32_t max_conns; /* max-conns=: host-side connections (0 = the fd budget's share) */
	/* The line of the --config file entry (its `-`) this VM came from, for messages;
	 * 0 = the command line or a runtime vm-add. */
	unsigned line;
};


enum uvsockd_action {
	UVSOCKD_RUN,
	UVSOCKD_HELP,
	UVSOCKD_VERSION,
	UVSOCKD_PRINT_CAPABILITIES,
	_UVSOCKD_ACTION_MAX,
};

struct uvsockd_config {
	enum uvsockd_action action;
	enum log_level log_level;
	unsigned n_vms;
	struct uvsockd_vm_config *vms; /* n_vms entries, owned */
	/* Control socket (uvsock-stat): --control PATH or `control:` of --config; "" = the default
	 * `<first VM's socket>.ctl`; control_off with --control none. */
	char control_path[UVSOCKD_SUN_PATH_MAX + 1];
	bool control_off;
	/* --capture FILE: every VM's packets from start-up into this new pcap file ("" = none). */
	char capture_path[4096];
	/* --isolate or `isolate: true`: run each sibling group's VMs in a worker process of its own
	 * (daemon/isolate.c); not combinable with --capture. */
	bool isolate;
	/* --guest-memory-max / --guest-memory-total-max: caps on mapped guest memory per VM and per
	 * process (src/vring/guest_mem.h); 0 = the default (1 TiB, 16 TiB). */
	uint64_t guest_memory_max;
	uint64_t guest_memory_total_max;
	/* --tune LIST and --busy-poll-us N, in order, as one list for tune_set() (src/util/tune.h);
	 * "" = none. */
	char tune[1024];
	/* --socket-mode MODE (octal; 0 = as the umask leaves it) and --socket-group GROUP ("" =
	 * uvsockd's own) of the vhost-user and host-side sockets uvsockd creates. */
	unsigned socket_mode;
	char socket_group[64];
	/* --no-dgram: VIRTIO_VSOCK_F_DGRAM not offered, no <uds-path>.dgram; --dgram-max SIZE: the
	 * largest datagram payload either way (0 = 65492), docs/uvsockd.md "Datagrams". */
	bool no_dgram;
	uint32_t dgram_max;
};

/* Usage errors (the command line or the --config file) exit with this status; others with 1. */
#define UVSOCKD_EXIT_USAGE 2

/*
 * Parses argv (argv[0] is the program name). On success *ret is filled (free with
 * uvsockd_config_clear) and, for UVSOCKD_RUN, has at least one VM with every value checked:
 * CIDs in [3, 0xfffffffe] and unique, paths non-empty, unique and within the sun_path limit
 * (uds-path leaves room for `_<10 digits>`), sizes in range, group names valid, cgroup= only
 * with --isolate and the same for every VM of one worker (uvsockd_workers()), no --capture with
 * --isolate.
 * On failure a one-line message (no trailing newline) is written to err.
 * Returns 0, -EINVAL (bad usage or value, or a bad --config file), -ENOMEM, -E2BIG (too many VMs),
 * or the errno of reading the --config file.
 */
int uvsockd_parse_args(int argc, char *const *argv, struct uvsockd_config *ret, char *err,
		       size_t errlen);

/*
 * Start-up checks that need the file system, made before anything is bound: the directory of
 * every socket path and uds-path exists and is writable (we create sockets there), no such path
 * exists as a non-socket, every cgroup= directory is a directory of a cgroup file system with a
 * writable cgroup.procs, and no path uvsockd will listen on (socket, uds-path,
 * `<uds-path>_seqpacket`, the control socket) is served by a live process: -EADDRINUSE with the
 * path and the owner's PID in err. Inherited sockets (--fd, socket activation: uds_adopt) are
 * not checked. Returns 0 or a negative errno with a one-line message in err.
 */
int uvsockd_check_paths(const struct uvsockd_config *c, char *err, size_t errlen);

/*
 * The checks of uvsockd_check_paths() but the liveness probes: directories, path types and
 * cgroups. For VMs added at runtime (vm-add, SIGHUP), whose config also names the sockets this
 * process serves itself; a path another process serves fails when the VM binds it.
 */
int uvsockd_check_dirs(const struct uvsockd_config *c, char *err, size_t errlen);

/*
 * The group of --socket-group as a gid (a name from the group database, or a number); *gid is
 * (gid_t)-1 when none was given. Returns 0 or -ENOENT / -errno with a one-line message in err.
 */
int uvsockd_socket_gid(const struct uvsockd_config *c, gid_t *gid, char *err, size_t errlen);

/* Frees what uvsockd_parse_args allocated. Safe on a zeroed config. */
void uvsockd_config_clear(struct uvsockd_config *c);

/* True if the two VMs share at least one group (may route to each other). */
bool uvsockd_vms_share_group(const struct uvsockd_vm_config *a, const struct uvsockd_vm_config *b);

/*
 * Splits the VMs into the workers of --isolate: VMs that share a group, directly or through
 * other VMs, route to each other in-process and so share a worker. Sets worker_of[i] (c->n_vms
 * entries) to the worker of VM i, workers numbered in the order of their first VM, and returns
 * the number of workers. O(n^2) in the VMs, as the sibling linking itself.
 */
unsigned uvsockd_workers(const struct uvsockd_config *c, unsigned *worker_of);

/* The --help text (also the source of the man page's option list). */
void uvsockd_print_usage(FILE *f, const char *prog);
/* The --print-capabilities JSON, one object and a newline. */
void uvsockd_print_capabilities(FILE *f);

#endif
