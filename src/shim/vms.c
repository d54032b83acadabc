/* SPDX-License-Identifier: MIT */
/*
 * Where the shim finds the VMs (shim.h shim_vms): $UVSOCK_VMS, else uvsockd's control socket
 * (`vms`, docs/operations.md). Asked at every connect() and listen(), so VMs added to or removed
 * from a running daemon are seen at once. The answer is untrusted input like any control answer:
 * bounded in time and size (ops_ctl_request), and anything that is not a VM with a CID and a
 * path that fits is skipped.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/json.h"
#include "ops/statcli.h"
#include "shim/shim.h"

#define VMS_TIMEOUT_MS 2000

/* "CID=PATH[,CID=PATH...]": a path cannot contain ',' here. */
static int vms_from_env(const char *spec, struct shim_vm *vms, int max)
{
	int n = 0;

	while (*spec && n < max) {
		const char *end = strchr(spec, ','), *eq = strchr(spec, '=');
		size_t len = end ? (size_t)(end - spec) : strlen(spec);
		char *num_end;
		unsigned long cid = strtoul(spec, &num_end, 10);

		if (eq && eq < spec + len && num_end == eq && cid < SHIM_CID_ANY &&
		    (size_t)(spec + len - eq - 1) < SHIM_PATH_MAX && spec + len > eq + 1) {
			vms[n].cid = (uint32_t)cid;
			snprintf(vms[n].uds_path, SHIM_PATH_MAX, "%.*s", (int)(spec + len - eq - 1),
				 eq + 1);
			n++;
		}
		if (!end)
			break;
		spec = end + 1;
	}
	return n;
}

static int vms_from_control(const char *path, struct shim_vm *vms, int max)
{
	struct ops_jv *ans = NULL;
	const struct ops_jv *list, *e;
	int fd, n = 0, r;

	r = ops_ctl_connect(path, &fd);
	if (r < 0)
		return -ENETUNREACH;
	r = ops_ctl_request(fd, "v1 vms", -1, VMS_TIMEOUT_MS, NULL, &ans);
	close(fd);
	if (r < 0)
		return r == -ENOMEM ? r : -ENETUNREACH;
	list = ops_json_get(ans, "vms");
	if (!ops_json_bool(ans, "ok", false) || !list || list->type != OPS_J_ARR) {
		ops_json_free(ans);
		return -ENETUNREACH;
	}
	for (e = list->child; e && n < max; e = e->next) {
		uint64_t cid = ops_json_u64(e, "cid", SHIM_CID_ANY);
		const char *p = ops_json_str(e, "uds_path", NULL);

		if (cid >= SHIM_CID_ANY || !p || !p[0] || strlen(p) >= SHIM_PATH_MAX)
			continue;
		vms[n].cid = (uint32_t)cid;
		snprintf(vms[n].uds_path, SHIM_PATH_MAX, "%s", p);
		n++;
	}
	ops_json_free(ans);
	return n;
}

int shim_vms(struct shim_vm *vms, int max)
{
	const char *env = getenv("UVSOCK_VMS"), *ctl = getenv(OPS_STATCLI_ENV);

	if (env && env[0])
		return vms_from_env(env, vms, max);
	return vms_from_control(ctl && ctl[0] ? ctl : SHIM_DEFAULT_CONTROL, vms, max);
}
