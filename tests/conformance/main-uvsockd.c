/* SPDX-License-Identifier: MIT */
/*
 * Runs the conformance table (tests/conformance/cases.c) over the guest role through uvsockd:
 * each case starts a uvsockd child process with two VMs in one group (CIDs 3 and 4); the client
 * side is a guest-role context on VM 3, the server side one on VM 4, so every case exercises two
 * guest drivers, real vhost-user rings and the daemon's sibling routing. CID 99 is a black hole
 * (the daemon drops packets to a CID it does not serve).
 */
#include "conf.h"

#include <uvsock/guest.h>

#include "uvsockd-proc.h"

struct uvd_env {
	struct uvd u;
};

static int ud_setup(struct conf_env *env)
{
	static const uint32_t cids[] = { 3, 4 };
	struct uvd_env *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	uvd_start(&p->u, 2, cids, "conf", NULL);
	env->client_ctx = uvsock_ctx_new_guest(p->u.sock[0], NULL);
	if (!env->client_ctx)
		return -errno;
	env->server_ctx = uvsock_ctx_new_guest(p->u.sock[1], NULL);
	if (!env->server_ctx)
		return -errno;
	env->client_cid = 3;
	env->server_cid = 4;
	env->blackhole_cid = 99;
	env->shared_engine = false;
	env->priv = p;
	return 0;
}

static void ud_teardown(struct conf_env *env)
{
	struct uvd_env *p = env->priv;

	uvsock_ctx_free(env->client_ctx);
	uvsock_ctx_free(env->server_ctx);
	if (p) {
		uvd_stop(&p->u);
		free(p);
	}
}

static const struct conf_factory uvsockd_factory = {
	.name = "uvsockd",
	.setup = ud_setup,
	.teardown = ud_teardown,
};

int main(int argc, char **argv)
{
	return conf_main(argc, argv, &uvsockd_factory);
}
