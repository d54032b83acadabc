#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches the guest kernels of the real-guest interop run into its cache (apt-get download and
# dpkg-deb -x, never installed; 6.1 and 6.12 through the system's Debian 12 lists, 7.3 from
# trixie-backports through a private apt configuration under the cache that never changes the
# system's sources; see tests/interop/lib.sh fetch_kernel and docs/interop.md), so
# that the interop test itself never touches the network: it only looks in the cache and skips
# (exit 77, loudly) when a kernel is missing. `make check` runs this (target interop-deps).
#   scripts/fetch-kernels.sh [KERNEL...]   (6.1, 6.12, 7.3 or a meta package; default: the run's
#                                           kernels, $UVSOCK_INTEROP_KERNELS)
# Exit: 0 every kernel is cached, 2 one could not be fetched (no package archive), 1 an error.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/interop/lib.sh
source "$REPO/tests/interop/lib.sh"

rc=0
for meta in ${@:-$INTEROP_KERNELS}; do
	fetch_kernel "$meta"
	r=$?
	if [ $r = 0 ]; then
		ilog "$meta: $(kinfo "$KDIR" package) $(kinfo "$KDIR" version) in $KDIR"
	else
		ilog "$meta: could not be fetched (status $r)"
		[ $rc = 1 ] || rc=$r
	fi
done
# The kernel's own vsock suite for the vsock_test case (tools/testing/vsock of linux-source-6.1).
if fetch_vsock_test_src; then
	ilog "$VT_SRC_PKG: tools/testing/vsock in $(vsock_test_src)"
else
	ilog "$VT_SRC_PKG: could not be fetched (the vsock_test case will be left out)"
fi
exit $rc
