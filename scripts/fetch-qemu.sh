#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches the newer QEMU of the IN_ORDER interop test (meson test interop-inorder) into the
# interop cache: qemu-system-x86, qemu-system-data, qemu-system-common and seabios from Debian's
# bookworm-backports, through the same kind of private apt configuration under the cache as the
# 7.3 kernel (the system's sources are never changed), apt-get download and dpkg-deb -x, never
# installed (tests/interop/lib.sh fetch_qemu, docs/interop.md "IN_ORDER with a newer QEMU").
# The test itself never touches the network: it only looks in the cache and skips (exit 77,
# loudly) when this QEMU is missing. `make check` runs this (target interop-deps).
#   scripts/fetch-qemu.sh
# Exit: 0 it is cached (prints the wrapper to run it), 2 it could not be fetched (no package
# archive), 1 an error (e.g. the unpacked binary does not start here).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/interop/lib.sh
source "$REPO/tests/interop/lib.sh"

fetch_qemu
rc=$?
if [ $rc = 0 ]; then
	ilog "qemu: $(sed -n 's/^banner=//p' "$QDIR/info") in $QDIR"
	echo "$QDIR/qemu-system-x86_64"
else
	ilog "qemu: the $QEMU_SUITE QEMU could not be fetched (status $rc)"
fi
exit $rc
