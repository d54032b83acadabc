#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Boot the interop guest (a Debian 6.1, 6.12 or 7.3 kernel, busybox, the vsock modules and
# uvsock-guest) under QEMU against a RUNNING uvsockd, with an interactive shell on this
# terminal, to try vsock in a real VM in one command. The guest's CID comes from uvsockd.
#
#   scripts/vm-shell.sh [--kernel 6.1|6.12|7.3] [--guest BIN] [--no-tools] VHOST_USER_SOCKET
#
# e.g.  build/daemon/uvsockd --vm guest-cid=3,socket=/tmp/vm3.sock,uds-path=/tmp/vm3.vsock &
#       scripts/vm-shell.sh /tmp/vm3.sock
# In the guest: `uvsock-guest connect 2 PORT` (to a host listener at /tmp/vm3.vsock_PORT),
# `uvsock-guest listen PORT` (the host connects to /tmp/vm3.vsock and writes "CONNECT PORT\n"),
# and Debian's socat, ncat and ssh (`socat - VSOCK-CONNECT:2:PORT`, `ncat --vsock -l PORT`;
# --no-tools leaves them out). Leave with `poweroff -f` in the guest (or Ctrl-A x). Kernels and
# tools are fetched with apt-get download into the cache of tests/interop (never installed).
# See docs/interop.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
source "$REPO/tests/interop/lib.sh"

META=linux-image-amd64 GUEST="" TOOLS=yes
while [ $# -gt 1 ]; do
	case $1 in
	--kernel)
		case $2 in
		6.1) META=linux-image-amd64 ;;
		6.12) META=linux-image-6.12-amd64 ;;
		7.3) META=7.3 ;; # trixie-backports, fetched by scripts/fetch-kernels.sh 7.3
		*) echo "vm-shell: --kernel 6.1, 6.12 or 7.3" >&2; exit 2 ;;
		esac
		shift 2 ;;
	--guest) GUEST=$2; shift 2 ;;
	--no-tools) TOOLS=no; shift ;;
	*) break ;;
	esac
done
if [ $# != 1 ] || [ "${1:0:1}" = - ]; then
	sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
SOCK=$1
[ -S "$SOCK" ] || { echo "vm-shell: $SOCK is not a socket: start uvsockd first" >&2; exit 1; }

"$REPO/scripts/install-deps.sh" interop || {
	echo "vm-shell: needs qemu-system-x86 busybox-static cpio xz-utils zstd kmod (run as root" \
		"or install them)" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-vm-shell.XXXXXX")
trap 'rm -rf "$T"' EXIT

if [ -z "$GUEST" ]; then
	for b in "$REPO"/build*/tests/interop/uvsock-guest; do
		[ -x "$b" ] && { GUEST=$b; break; }
	done
fi
if [ -z "$GUEST" ]; then
	# Not built yet (or built without -Dinterop): build it here, statically.
	gcc -static -O2 -std=gnu11 -D_GNU_SOURCE -I "$REPO/tests/interop/common" -I "$REPO/src" \
		"$REPO/tests/interop/guest/uvsock-guest.c" "$REPO/tests/interop/common/xfer.c" \
		-o "$T/uvsock-guest"
	GUEST=$T/uvsock-guest
fi

fetch_kernel "$META" || { echo "vm-shell: could not fetch $META" >&2; exit 1; }
# Debian's socat, ncat and ssh with their libraries (scripts/fetch-guest-tools.sh; a few MiB more
# to load, well under a second of the boot).
OVERLAY=""
if [ $TOOLS = yes ]; then
	if debs_cached guest-tools || "$REPO/scripts/fetch-guest-tools.sh" guest-tools && debs_cached guest-tools; then
		bins=()
		for t in $GUEST_TOOLS; do bins+=("${t#*:}"); done
		debs_overlay "$DEBS_ROOT" "$T/tools" "${bins[@]}" && OVERLAY=$T/tools
		# ssh wants a user for its uid.
		mkdir -p "$T/tools/etc" "$T/tools/root"
		echo 'root:x:0:0:root:/root:/bin/sh' >"$T/tools/etc/passwd"
		echo 'root:x:0:' >"$T/tools/etc/group"
	fi
	[ -n "$OVERLAY" ] || echo "vm-shell: no socat/ncat/ssh in the guest (fetch failed); uvsock-guest only" >&2
fi
GUEST_OVERLAY=$OVERLAY build_initramfs "$KDIR" "$GUEST" "$T/initrd.cpio"
qemu_args "$KDIR" "$T/initrd.cpio" "uvsock.mode=shell" stdio "$SOCK"
echo "vm-shell: booting $(kinfo "$KDIR" package) $(kinfo "$KDIR" version) against $SOCK (Ctrl-A x quits QEMU)"
qemu-system-x86_64 "${QEMU_ARGS[@]}"
