/* SPDX-License-Identifier: MIT */
/*
 * Conversion from struct ops_config (the --config file, src/ops/config.h) to uvsockd's own
 * struct uvsockd_config (daemon/options.h). Header-only because daemon/options.h belongs to the
 * program, not to the library: include it from daemon/ (or from a test that puts daemon/ on the
 * include path) after "options.h".
 *
 * The two VM structs have the same fields and limits (tests/unit/ops/test-config.c checks the
 * limits agree), so the conversion is a copy.
 */
#ifndef UVSOCK_OPS_CONFIG_UVSOCKD_H
#define UVSOCK_OPS_CONFIG_UVSOCKD_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ops/config.h"

/*
 * Appends the file's VMs to dst->vms and applies its log_level (if the file has one) and its
 * isolate: true (a command-line --isolate stays on either way).
 * The caller decides whether file and command-line VMs may be mixed; if they are, it must check
 * CID and path uniqueness across both itself (the file's VMs are unique among themselves).
 * Returns 0, -E2BIG (more than UVSOCKD_MAX_VMS in all), -ENOMEM; dst is unchanged on failure.
 */
static inline int ops_config_to_uvsockd(const struct ops_config *src, struct uvsockd_config *dst)
{
	struct uvsockd_vm_config *v;

	if ((size_t)dst->n_vms + src->n_vms > UVSOCKD_MAX_VMS)
		return -E2BIG;
	v = realloc(dst->vms, (dst->n_vms + src->n_vms) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	dst->vms = v;
	for (unsigned i = 0; i < src->n_vms; i++) {
		const struct ops_vm_config *s = &src->vms[i];
		struct uvsockd_vm_config *d = &v[dst->n_vms + i];

		memset(d, 0, sizeof(*d));
		d->guest_cid = s->guest_cid;
		memcpy(d->socket_path, s->socket_path, sizeof(d->socket_path));
		memcpy(d->uds_path, s->uds_path, sizeof(d->uds_path));
		d->tx_buffer_size = s->tx_buffer_size;
		d->queue_size = s->queue_size;
		d->n_groups = s->n_groups;
		memcpy(d->groups, s->groups, sizeof(d->groups));
		memcpy(d->cgroup, s->cgroup, sizeof(d->cgroup));
		memcpy(d->name, s->name, sizeof(d->name));
		d->max_conns = s->max_conns;
		d->ok_guest_port = s->ok_guest_port;
	}
	dst->n_vms += src->n_vms;
	if (src->have_log_level)
		dst->log_level = src->log_level;
	dst->isolate = dst->isolate || src->isolate;
	return 0;
}

/* The two structs must agree for the copies above to be whole. */
_Static_assert(sizeof(((struct uvsockd_vm_config *)0)->socket_path) ==
		       sizeof(((struct ops_vm_config *)0)->socket_path), "socket_path size");
_Static_assert(sizeof(((struct uvsockd_vm_config *)0)->uds_path) ==
		       sizeof(((struct ops_vm_config *)0)->uds_path), "uds_path size");
_Static_assert(sizeof(((struct uvsockd_vm_config *)0)->groups) ==
		       sizeof(((struct ops_vm_config *)0)->groups), "groups size");
_Static_assert(sizeof(((struct uvsockd_vm_config *)0)->cgroup) ==
		       sizeof(((struct ops_vm_config *)0)->cgroup), "cgroup size");
_Static_assert(sizeof(((struct uvsockd_vm_config *)0)->name) ==
		       sizeof(((struct ops_vm_config *)0)->name), "name size");
_Static_assert(UVSOCKD_MAX_GROUPS == OPS_CFG_MAX_GROUPS, "group count");
_Static_assert(UVSOCKD_MAX_VMS == OPS_CFG_MAX_VMS, "VM count");

#endif
