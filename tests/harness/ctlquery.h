/* SPDX-License-Identifier: MIT */
/*
 * One request to a live uvsockd's control socket (<first VM's socket>.ctl, uvsockd-proc.h), its
 * JSON answer parsed, and a VM's counter from a `stats` answer. For the integration tests.
 */
#ifndef UVSOCK_TESTS_CTLQUERY_H
#define UVSOCK_TESTS_CTLQUERY_H

#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "test.h"
#include "uvsockd-proc.h"

/* The answer to req (asserted to come within 5 s); free with ops_json_free. */
static inline struct ops_jv *uvd_ctl_query(const struct uvd *u, const char *req)
{
	struct ops_jv *v = NULL;
	char ctl[200];
	int fd = -1;

	snprintf(ctl, sizeof(ctl), "%s.ctl", u->sock[0]);
	ASSERT_OK(ops_ctl_connect(ctl, &fd));
	ASSERT_OK(ops_ctl_request(fd, req, -1, 5000, NULL, &v));
	close(fd);
	return v;
}

/* Counter `name` of VM cid (UINT64_MAX if the daemon does not report it). */
static inline uint64_t uvd_vm_counter(const struct uvd *u, uint32_t cid, const char *name)
{
	char req[32];
	struct ops_jv *v;
	const struct ops_jv *vms;
	uint64_t n = UINT64_MAX;

	snprintf(req, sizeof(req), "stats vm=%u", cid);
	v = uvd_ctl_query(u, req);
	vms = ops_json_get(v, "vms");
	if (vms && vms->child)
		n = ops_json_u64(ops_json_get(vms->child, "counters"), name, UINT64_MAX);
	ops_json_free(v);
	return n;
}

#endif
