/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's `--config FILE`: the VMs of `--vm` (and three daemon settings) in YAML laid out like
 * rust-vmm vhost-device-vsock's configuration file, so one file serves both:
 *
 *   # uvsockd.yaml
 *   control: /run/uvsockd.ctl        # optional: control socket path
 *   log_level: info                  # optional: error, warn, info, debug
 *   isolate: true                    # optional: one worker process per sibling group
 *   vms:
 *     - guest_cid: 4
 *       socket: /run/vhost4.socket   # vhost-user socket (the VMM connects here)
 *       uds_path: /run/vm4.vsock     # host side (hybrid vsock)
 *       tx_buffer_size: 262144       # optional
 *       queue_size: 1024             # optional
 *       groups: group1+groupA        # optional; also [group1, groupA]
 *       cgroup: /sys/fs/cgroup/vm4   # optional, needs isolate: the worker's cgroup
 *       name: web4                   # optional: for logs, uvsock-stat, vm-remove (vm<cid>)
 *       max_conns: 4096              # optional: host-side connections (fd budget share)
 *
 * The file is YAML, read with libyaml: block or flow style (`vms: [{guest_cid: 4, socket: /x,
 * uds_path: /y}]`), plain or quoted scalars, comments, `---` at the top and `...` at the end.
 * Refused, each with its line: anchors and aliases, tags, multi-line scalars, a second
 * document, tabs in indentation, control characters in values. Keys accept `_` and `-` alike.
 * Every error names the file and line: "FILE:LINE: unknown key 'x'"; YAML syntax errors are
 * libyaml's words, "FILE:LINE: YAML: ...". Values are checked exactly as the command line
 * checks them (daemon/options.c): same ranges, same reserved CIDs, same path limits, plus
 * uniqueness of CIDs, paths and names across the file. docs/operations.md has the reference.
 *
 * The result is struct ops_config, field for field the shape of daemon/options.h's
 * struct uvsockd_vm_config; config_uvsockd.h converts (daemon/ only).
 *
 * Security model: the file comes from the operator (trusted) but is parsed defensively: size,
 * line length and VM count are bounded before libyaml sees the text, nothing is expanded
 * (no aliases), every value is range-checked.
 */
#ifndef UVSOCK_OPS_CONFIG_H
#define UVSOCK_OPS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

/* Same limits as daemon/options.h (tests/unit/ops/test-config.c checks they agree). */
#define OPS_CFG_MAX_VMS 1024
#define OPS_CFG_MAX_GROUPS 16
#define OPS_CFG_GROUP_NAME_MAX 63
#define OPS_CFG_SUN_PATH_MAX 107
#define OPS_CFG_UDS_SUFFIX_MAX 11
#define OPS_CFG_DEFAULT_GUEST_CID 3u
#define OPS_CFG_DEFAULT_TX_BUFFER_SIZE (256u * 1024)
#define OPS_CFG_DEFAULT_QUEUE_SIZE 1024u
#define OPS_CFG_MIN_TX_BUFFER_SIZE 4096u
#define OPS_CFG_MAX_TX_BUFFER_SIZE (64u * 1024 * 1024)
#define OPS_CFG_MAX_QUEUE_SIZE 32768u
#define OPS_CFG_CGROUP_PATH_MAX 1023
/* name=: a VM's name, at most this many bytes of [A-Za-z0-9._-], not all digits (so that a
 * CID and a name never look alike); max-conns=: host-side connections, in [1, this]. */
#define OPS_CFG_NAME_MAX 31
#define OPS_CFG_MAX_CONNS_MAX 65536u
/* Input bounds. */
#define OPS_CFG_MAX_FILE_SIZE (1u << 20)
#define OPS_CFG_MAX_LINE 4096u

struct ops_vm_config {
	uint32_t guest_cid;
	char socket_path[OPS_CFG_SUN_PATH_MAX + 1];
	char uds_path[OPS_CFG_SUN_PATH_MAX + 1];
	uint32_t tx_buffer_size;
	uint32_t queue_size;
	unsigned n_groups;
	char groups[OPS_CFG_MAX_GROUPS][OPS_CFG_GROUP_NAME_MAX + 1];
	char cgroup[OPS_CFG_CGROUP_PATH_MAX + 1]; /* absolute path, or "" */
	char name[OPS_CFG_NAME_MAX + 1];          /* "" = the default, vm<cid> */
	uint32_t max_conns;                       /* 0 = the daemon's fd budget share */
	bool ok_guest_port; /* connect_reply: guest-port ("OK <guest port>", vhost-device-vsock) */
	unsigned line; /* line of the entry's `-` */
};

struct ops_config {
	unsigned n_vms;
	struct ops_vm_config *vms; /* owned */
	bool have_control;
	char control_path[OPS_CFG_SUN_PATH_MAX + 1];
	bool have_log_level;
	enum log_level log_level;
	bool isolate; /* isolate: true */
};

/*
 * Parses `len` bytes of text (need not be NUL-terminated); `name` is used in messages.
 * On success *ret holds at least one VM (free with ops_config_clear). On failure one line
 * "NAME:LINE: message" (no newline) is written to err and *ret is untouched.
 * Returns 0, -EINVAL (syntax or value), -EFBIG (over OPS_CFG_MAX_FILE_SIZE), -ENOMEM.
 */
int ops_config_parse(const char *name, const char *text, size_t len, struct ops_config *ret,
		     char *err, size_t errlen);

/* Reads and parses a file. Returns as ops_config_parse, or the errno of open/read. */
int ops_config_load(const char *path, struct ops_config *ret, char *err, size_t errlen);

/*
 * The checks of name= and max-conns= (shared with uvsockd's --vm parser): copies v into
 * dst[OPS_CFG_NAME_MAX + 1], or its number into *dst. key names the key in the message written
 * to err on failure ("name 'x y' ..."). Returns 0 or -EINVAL.
 */
int ops_cfg_set_name(char *dst, const char *key, const char *v, char *err, size_t errlen);
int ops_cfg_set_max_conns(uint32_t *dst, const char *key, const char *v, char *err,
			  size_t errlen);
/*
 * connect-reply=host-port|guest-port: the number of the "OK <port>" answer to a host program's
 * CONNECT (docs/uvsockd.md, "Host-side address forms"). Sets *guest_port. 0 or -EINVAL.
 */
int ops_cfg_set_connect_reply(bool *guest_port, const char *key, const char *v, char *err,
			      size_t errlen);

/* Frees what a parse allocated. Safe on a zeroed config. */
void ops_config_clear(struct ops_config *c);

#endif
