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
 * The result is struct config_file, whose VMs are daemon/options.h's struct uvsockd_vm_config,
 * the one VM struct of uvsockd: config_file_apply() appends them to the command line's.
 *
 * Security model: the file comes from the operator (trusted) but is parsed defensively: size,
 * line length and VM count are bounded before libyaml sees the text, nothing is expanded
 * (no aliases), every value is range-checked.
 */
#ifndef UVSOCK_DAEMON_CONFIG_H
#define UVSOCK_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "util/log.h"

/* Input bounds (the values' limits are the command line's, options.h). */
#define CONFIG_FILE_MAX_SIZE (1u << 20)
#define CONFIG_FILE_MAX_LINE 4096u

struct config_file {
	unsigned n_vms;
	struct uvsockd_vm_config *vms; /* owned */
	bool have_control;
	char control_path[UVSOCKD_SUN_PATH_MAX + 1];
	bool have_log_level;
	enum log_level log_level;
	bool isolate; /* isolate: true */
};

/*
 * Parses `len` bytes of text (need not be NUL-terminated); `name` is used in messages.
 * On success *ret holds at least one VM (free with config_file_clear). On failure one line
 * "NAME:LINE: message" (no newline) is written to err and *ret is untouched.
 * Returns 0, -EINVAL (syntax or value), -EFBIG (over CONFIG_FILE_MAX_SIZE), -ENOMEM.
 */
int config_file_parse(const char *name, const char *text, size_t len, struct config_file *ret,
		      char *err, size_t errlen);

/* Reads and parses a file. Returns as config_file_parse, or the errno of open/read. */
int config_file_load(const char *path, struct config_file *ret, char *err, size_t errlen);

/*
 * The checks of name= and max-conns= (shared with uvsockd's --vm parser): copies v into
 * dst[UVSOCKD_NAME_MAX + 1], or its number into *dst. key names the key in the message written
 * to err on failure ("name 'x y' ..."). Returns 0 or -EINVAL.
 */
int config_set_name(char *dst, const char *key, const char *v, char *err, size_t errlen);
int config_set_max_conns(uint32_t *dst, const char *key, const char *v, char *err,
			 size_t errlen);

/* Frees what a parse allocated. Safe on a zeroed config. */
void config_file_clear(struct config_file *c);

/*
 * Appends the file's VMs to dst->vms and applies its log_level (if the file has one) and its
 * isolate: true (a command-line --isolate stays on either way).
 * The caller decides whether file and command-line VMs may be mixed; if they are, it must check
 * CID and path uniqueness across both itself (the file's VMs are unique among themselves).
 * Returns 0, -E2BIG (more than UVSOCKD_MAX_VMS in all), -ENOMEM; dst is unchanged on failure.
 */
int config_file_apply(const struct config_file *src, struct uvsockd_config *dst);

#endif
