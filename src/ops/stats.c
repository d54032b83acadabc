/* SPDX-License-Identifier: MIT */
/* Per-VM counters: drop-reason names, snapshot, sum. */
#include "ops/stats.h"

#include "util/macros.h"

static const char *const drop_names[_OPS_DROP_MAX] = {
	[OPS_DROP_SPOOFED_CID] = "spoofed_cid",
	[OPS_DROP_BAD_OP] = "bad_op",
	[OPS_DROP_BAD_TYPE] = "bad_type",
	[OPS_DROP_OVERSIZE] = "oversize",
	[OPS_DROP_NO_ROUTE] = "no_route",
	[OPS_DROP_MALFORMED] = "malformed",
};

const char *ops_drop_reason_name(enum ops_drop_reason r)
{
	if ((unsigned)r >= ARRAY_SIZE(drop_names))
		return "unknown";
	return drop_names[r];
}

/* Relaxed everywhere: a counter is a whole value and orders nothing else. */
static void copy_relaxed(_Atomic uint64_t *dst, const _Atomic uint64_t *src)
{
	atomic_store_explicit(dst, atomic_load_explicit(src, memory_order_relaxed),
			      memory_order_relaxed);
}

/* *acc += *c; acc is the caller's own (no other writer). */
static void add_relaxed(_Atomic uint64_t *acc, const _Atomic uint64_t *c)
{
	atomic_store_explicit(acc,
			      atomic_load_explicit(acc, memory_order_relaxed) +
				      atomic_load_explicit(c, memory_order_relaxed),
			      memory_order_relaxed);
}

void ops_counters_read(const struct ops_vm_counters *src, struct ops_vm_counters *ret)
{
#define OPS_X_READ_(f, name, help) copy_relaxed(&ret->f, &src->f);
	OPS_VM_COUNTERS(OPS_X_READ_)
#undef OPS_X_READ_
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		copy_relaxed(&ret->dropped[i], &src->dropped[i]);
}

void ops_counters_add(struct ops_vm_counters *acc, const struct ops_vm_counters *c)
{
#define OPS_X_ADD_(f, name, help) add_relaxed(&acc->f, &c->f);
	OPS_VM_COUNTERS(OPS_X_ADD_)
#undef OPS_X_ADD_
	for (unsigned i = 0; i < _OPS_DROP_MAX; i++)
		add_relaxed(&acc->dropped[i], &c->dropped[i]);
}
