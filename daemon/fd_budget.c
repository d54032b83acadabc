/* SPDX-License-Identifier: MIT */
/* uvsockd's file-descriptor budget (see fd_budget.h). */
#include "fd_budget.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "util/log.h"

uint32_t uvsockd_host_conn_budget(uint64_t nofile, unsigned n_vms)
{
	uint64_t share;

	if (n_vms == 0 || nofile <= UVSOCKD_FDS_GLOBAL)
		return 0;
	share = (nofile - UVSOCKD_FDS_GLOBAL) / n_vms;
	if (share <= UVSOCKD_FDS_PER_VM)
		return 0;
	share -= UVSOCKD_FDS_PER_VM;
	return share > UVSOCKD_HOST_CONNS_MAX ? UVSOCKD_HOST_CONNS_MAX : (uint32_t)share;
}

/* Soft RLIMIT_NOFILE raised to the hard limit; returns the soft limit in force afterwards. */
static uint64_t raise_nofile(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		log_warn("getrlimit(RLIMIT_NOFILE): %s; assuming 1024 fds", strerror(errno));
		return 1024;
	}
	was = rl.rlim_cur;
	if (rl.rlim_cur != rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			log_warn("cannot raise RLIMIT_NOFILE from %llu to %llu: %s",
				 (unsigned long long)was, (unsigned long long)rl.rlim_max,
				 strerror(errno));
			rl.rlim_cur = was;
		}
	}
	return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

uint32_t uvsockd_fd_budget_per_vm(unsigned n_vms)
{
	static uint32_t budget;
	uint64_t nofile;

	if (budget)
		return budget;
	nofile = raise_nofile();
	budget = uvsockd_host_conn_budget(nofile, n_vms);
	if (budget < UVSOCKD_HOST_CONNS_MAX)
		log_warn("RLIMIT_NOFILE %llu for %u VMs: host fd budget %u connections per VM "
			 "(raise the hard limit, e.g. LimitNOFILE=, for %u)",
			 (unsigned long long)nofile, n_vms, budget ? budget : 1,
			 UVSOCKD_HOST_CONNS_MAX);
	else
		log_info("RLIMIT_NOFILE %llu for %u VMs: host fd budget %u connections per VM",
			 (unsigned long long)nofile, n_vms, budget);
	if (!budget)
		budget = 1;
	return budget;
}
