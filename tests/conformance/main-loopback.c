/* SPDX-License-Identifier: MIT */
/*
 * Runs the conformance table (cases.c) over the in-process loopback transport: one context
 * (CID 1) serves both sides, as Linux's vsock_loopback; CID 3 is a black hole for the
 * connect-timeout cases. With UVSOCK_LOOPBACK_PUMP_THREAD=1 in the environment the context
 * delivers packets on its pump thread instead of inline (the second registered run).
 */
#include <stdlib.h>

#include "conf.h"

static int lb_setup(struct conf_env *env)
{
	const char *pt = getenv("UVSOCK_LOOPBACK_PUMP_THREAD");
	struct uvsock_loopback_opts o = { .size = sizeof(o) };
	struct uvsock_ctx *ctx;

	if (pt && *pt == '1')
		o.flags |= UVSOCK_LOOPBACK_PUMP_THREAD;
	ctx = uvsock_ctx_new_loopback(&o);

	if (!ctx)
		return -errno;
	env->client_ctx = ctx;
	env->server_ctx = ctx;
	env->server_cid = VMADDR_CID_LOCAL;
	env->client_cid = VMADDR_CID_LOCAL;
	env->blackhole_cid = 3;
	env->shared_engine = true;
	return 0;
}

static void lb_teardown(struct conf_env *env)
{
	uvsock_ctx_free(env->client_ctx);
}

static const struct conf_factory loopback_factory = {
	.name = "loopback",
	.setup = lb_setup,
	.teardown = lb_teardown,
};

int main(int argc, char **argv)
{
	return conf_main(argc, argv, &loopback_factory);
}
