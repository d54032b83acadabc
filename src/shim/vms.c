/* SPDX-License-Identifier: MIT */
/*
 * Where the shim finds the VMs (shim.h shim_vms): $UVSOCK_VMS, else uvsockd's control socket
 * (`vms`, docs/operations.md). Asked at connect() and listen(), so VMs added to or removed
 * from a running daemon are seen within VMS_CACHE_NS. One request at a time per process (the
 * control socket serves a few clients only; a program connecting from 100 threads asks once),
 * under a mutex taken around fork. The answer is untrusted input like any control answer:
 * bounded in time and size (ops_ctl_request), and anything that is not a VM with a CID and a
 * path that fits is skipped.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctlproto/client.h"
#include "ctlproto/json.h"
#include "shim/shim.h"
#include "util/macros.h"
#include "util/time.h"

#define VMS_TIMEOUT_MS 2000
#define VMS_CACHE_NS (500ull * NS_PER_MS)

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_vm cache[SHIM_MAX_VMS];
static int cache_n;
static uint64_t cache_ns; /* when cache was filled; 0: never */

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

/*
 * Says once per process on stderr why the daemon cannot be reached (the program itself sees
 * only the errno of its connect or listen), and returns that errno: EACCES for permission on
 * the control socket, else ENETUNREACH (no daemon there: the VMs are out of reach).
 */
static int vms_unreachable(const char *path, int err)
{
	static atomic_bool said;

	if (!atomic_exchange(&said, true))
		fprintf(stderr,
			"uvsock-run: cannot ask uvsockd for its VMs at %s: %s; give uvsock-run "
			"--control PATH or set $%s (vsock connects and listens fail meanwhile)\n",
			path, ops_ctl_why(err), OPS_STATCLI_ENV);
	return err == -EACCES || err == -EPERM ? -EACCES : -ENETUNREACH;
}

static int vms_from_control(const char *path, struct shim_vm *vms, int max)
{
	struct ops_jv *ans = NULL;
	const struct ops_jv *list, *e;
	char found[SHIM_PATH_MAX] = "";
	int fd, n = 0, r;

	/* On EACCES, found is the control socket that refused (path's own, or one next to it). */
	r = ops_ctl_find(path, &fd, found, sizeof(found));
	if (r < 0)
		return vms_unreachable(r == -EACCES && found[0] ? found : path, r);
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
	uint64_t now = mono_ns();
	int n;

	if (env && env[0])
		return vms_from_env(env, vms, max);
	pthread_mutex_lock(&cache_lock);
	if (!cache_ns || now - cache_ns >= VMS_CACHE_NS) {
		n = vms_from_control(ctl && ctl[0] ? ctl : SHIM_DEFAULT_CONTROL, cache,
				     SHIM_MAX_VMS);
		cache_n = MAX(n, 0);
		cache_ns = n < 0 ? 0 : now;
	} else {
		n = cache_n;
	}
	if (n >= 0) {
		n = MIN(cache_n, max);
		memcpy(vms, cache, (size_t)n * sizeof(*vms));
	}
	pthread_mutex_unlock(&cache_lock);
	return n;
}

void shim_vms_atfork_prepare(void)
{
	pthread_mutex_lock(&cache_lock);
}

void shim_vms_atfork_release(void)
{
	pthread_mutex_unlock(&cache_lock);
}
