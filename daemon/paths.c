/* SPDX-License-Identifier: MIT */
/* The paths of a VM and the rule that keeps two VMs' paths apart (see paths.h). */
#include "paths.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ctlproto/proto.h"

#define NAME_MAX_LEN (UVSOCKD_SUN_PATH_MAX + 16)

/* The fixed names of a VM (the families U_<P> and U_<P>.dgram are matched by in_family). */
enum { N_FIXED = 4 };

struct names {
	char path[N_FIXED][NAME_MAX_LEN];
	const char *what[N_FIXED];
	int n;
};

static void fixed_names(const struct uvsockd_vm_config *v, struct names *nm)
{
	nm->n = 0;
	if (v->fd <= 0) {
		snprintf(nm->path[nm->n], NAME_MAX_LEN, "%s", v->socket_path);
		nm->what[nm->n++] = "socket";
	}
	snprintf(nm->path[nm->n], NAME_MAX_LEN, "%s", v->uds_path);
	nm->what[nm->n++] = "uds-path";
	snprintf(nm->path[nm->n], NAME_MAX_LEN, "%s_seqpacket", v->uds_path);
	nm->what[nm->n++] = "SEQPACKET socket <uds-path>_seqpacket";
	snprintf(nm->path[nm->n], NAME_MAX_LEN, "%s.dgram", v->uds_path);
	nm->what[nm->n++] = "datagram socket <uds-path>.dgram";
}

/*
 * If path is <uds>_<P> or <uds>_<P>.dgram (P up to 10 digits, as a port prints), says which in
 * *what and returns true.
 */
static bool in_family(const char *path, const char *uds, const char **what)
{
	size_t n = strlen(uds), d;

	if (strncmp(path, uds, n) != 0 || path[n] != '_')
		return false;
	path += n + 1;
	d = strspn(path, "0123456789");
	if (d == 0 || d > 10)
		return false;
	if (!path[d])
		*what = "host port path <uds-path>_<port>";
	else if (!strcmp(path + d, ".dgram"))
		*what = "host datagram path <uds-path>_<port>.dgram";
	else
		return false;
	return true;
}

/* Which name of o path is (*what), if any. */
static bool name_of(const char *path, const struct uvsockd_vm_config *o, const struct names *on,
		    const char **what)
{
	for (int i = 0; i < on->n; i++)
		if (!strcmp(path, on->path[i])) {
			*what = on->what[i];
			return true;
		}
	return in_family(path, o->uds_path, what);
}

/* "'path' is both its vwhat and other" */
static int refuse(char *err, size_t errlen, const struct uvsockd_vm_config *v, const char *path,
		  const char *vwhat, const char *other)
{
	snprintf(err, errlen,
		 "guest-cid %u: '%s' is both its %s and %s (paths uvsockd derives from a "
		 "uds-path count); give each VM a directory of its own",
		 v->guest_cid, path, vwhat, other);
	return -EINVAL;
}

int uvsockd_check_vm_paths(const struct uvsockd_vm_config *v,
			   const struct uvsockd_vm_config *const *others, unsigned n,
			   const char *control, char *err, size_t errlen)
{
	struct names vn, on;
	const char *what;
	char other[128];

	if (v->fd <= 0 && v->socket_path[0] != '/') {
		snprintf(err, errlen, "guest-cid %u: socket '%s' must be an absolute path",
			 v->guest_cid, v->socket_path);
		return -EINVAL;
	}
	if (v->uds_path[0] != '/') {
		snprintf(err, errlen, "guest-cid %u: uds-path '%s' must be an absolute path",
			 v->guest_cid, v->uds_path);
		return -EINVAL;
	}
	fixed_names(v, &vn);
	/* Its own socket among its uds-path's names (vn.path[0] is the socket itself). */
	if (v->fd <= 0) {
		for (int i = 1; i < vn.n; i++)
			if (!strcmp(v->socket_path, vn.path[i]))
				return refuse(err, errlen, v, v->socket_path, "socket", vn.what[i]);
		if (in_family(v->socket_path, v->uds_path, &what))
			return refuse(err, errlen, v, v->socket_path, "socket", what);
	}
	for (unsigned k = 0; k < n; k++) {
		const struct uvsockd_vm_config *o = others[k];

		fixed_names(o, &on);
		for (int i = 0; i < vn.n; i++)
			if (name_of(vn.path[i], o, &on, &what)) {
				snprintf(other, sizeof(other), "guest-cid %u's %s", o->guest_cid,
					 what);
				return refuse(err, errlen, v, vn.path[i], vn.what[i], other);
			}
		/* o's fixed names in v's families (fixed against fixed was above). */
		for (int i = 0; i < on.n; i++)
			if (in_family(on.path[i], v->uds_path, &what)) {
				snprintf(other, sizeof(other), "guest-cid %u's %s", o->guest_cid,
					 on.what[i]);
				return refuse(err, errlen, v, on.path[i], what, other);
			}
	}
	if (control && control[0]) {
		for (int i = 0; i < vn.n; i++)
			if (!strcmp(control, vn.path[i]))
				return refuse(err, errlen, v, control, vn.what[i], "the control socket");
		if (in_family(control, v->uds_path, &what))
			return refuse(err, errlen, v, control, what, "the control socket");
	}
	return 0;
}

const char *uvsockd_control_path(const struct uvsockd_config *c, char *buf, size_t len)
{
	if (c->control_off || !c->n_vms)
		return NULL;
	if (c->control_path[0]) {
		snprintf(buf, len, "%s", c->control_path);
		return buf;
	}
	if (c->vms[0].fd > 0 || ops_ctl_default_path(c->vms[0].socket_path, buf, len) < 0)
		return NULL;
	return buf;
}
