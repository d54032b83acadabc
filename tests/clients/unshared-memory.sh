#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A real guest whose memory QEMU does not share with uvsockd (suite 'interop'; prints TAP, exits
# 0, 1 or 77): -object memory-backend-memfd,share=off. The guest boots with the right CID, its
# connects time out, QEMU prints nothing; uvsockd must log one warning naming share=on and count
# the session in guest_mem_unshared. The same guest with share=on (connects refused at once,
# nobody listens on the host port) must log no such warning.
# Nothing is fetched here: without a cached guest kernel, QEMU or static busybox this exits 77.
#   unshared-memory.sh UVSOCKD UVSOCK_GUEST
set -u
UVSOCKD=$1 GUEST=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../interop/lib.sh
source "$HERE/../interop/lib.sh"
# shellcheck source=vmtap.sh
source "$HERE/vmtap.sh"
HOWTO="make interop-deps (scripts/fetch-kernels.sh)"

command -v cpio >/dev/null 2>&1 || skip "cpio missing (scripts/install-deps.sh interop)"
qemu_resolve || skip "no cached QEMU"
command -v "$INTEROP_QEMU" >/dev/null 2>&1 || skip "$INTEROP_QEMU missing: $HOWTO"
static_busybox >/dev/null || skip "no static busybox (package busybox-static): $HOWTO"
kernel_cached 6.1 || skip "no cached 6.1 guest kernel: $HOWTO"

T=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-unshared.XXXXXX") || exit 1
vm_traps

# The guest: three connects to host port 1234 (nobody listens there), then power off.
ov=$T/overlay
mkdir -p "$ov/etc/uvsock"
cat >"$ov/etc/uvsock/script" <<'EOF'
#!/bin/sh
echo "UVSOCK-UNSHARED cid=$(/bin/uvsock-guest cid)"
for i in 1 2 3; do
	/bin/uvsock-guest connect 2 1234 </dev/null
	echo "UVSOCK-CONNECT $i rc=$?"
done
echo "UVSOCK-UNSHARED done"
EOF
chmod 755 "$ov/etc/uvsock/script"
GUEST_OVERLAY=$ov build_initramfs "$KDIR" "$GUEST" "$T/initrd.cpio" || { echo "1..0 # initramfs build failed"; exit 1; }
echo "1..2"

# run SHARE: uvsockd, then the guest with share=SHARE until its script is done (or 180 s).
run() {
	local share=$1 i=0
	"$UVSOCKD" --vm "guest-cid=3,socket=$T/vm3.sock,uds-path=$T/vm3.vsock" --control none \
		>"$T/uvsockd-$share.log" 2>&1 &
	upid=$!
	while [ $i -lt 100 ] && ! [ -S "$T/vm3.sock" ]; do sleep 0.1; i=$((i + 1)); done
	[ -S "$T/vm3.sock" ] || return 1
	UVSOCK_INTEROP_SHARE=$share qemu_args "$KDIR" "$T/initrd.cpio" "uvsock.mode=script" \
		"$T/console-$share.log" "$T/vm3.sock"
	"$INTEROP_QEMU" "${QEMU_ARGS[@]}" >"$T/qemu-$share.log" 2>&1 &
	qpid=$!
	wait_for_line "$T/console-$share.log" '^UVSOCK-UNSHARED done' 180 "$qpid" >/dev/null
	local rc=$?
	kill -KILL "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null; qpid=""
	kill -TERM "$upid" 2>/dev/null; wait "$upid" 2>/dev/null; upid=""
	return $rc
}

if ! run off; then
	notok "share=off: the guest's script did not finish"
	show "$T/console-off.log" "$T/uvsockd-off.log" "$T/qemu-off.log"
elif [ "$(grep -c 'warn: .*its memory backend is not shared.*share=on' "$T/uvsockd-off.log")" = 1 ] &&
	grep -q '^UVSOCK-UNSHARED cid=3' "$T/console-off.log"; then
	ok "share=off: guest CID 3, connects time out, uvsockd warns once: $(grep -o 'vm3: the guest kicked.*' "$T/uvsockd-off.log")"
else
	notok "share=off: expected one warning naming share=on"
	show "$T/console-off.log" "$T/uvsockd-off.log"
fi

if ! run on; then
	notok "share=on: the guest's script did not finish"
	show "$T/console-on.log" "$T/uvsockd-on.log" "$T/qemu-on.log"
elif ! grep -q 'share=on' "$T/uvsockd-on.log" && grep -q 'UVSOCK-CONNECT 3 rc=1' "$T/console-on.log"; then
	ok "share=on: connects refused at once (no host listener), no warning"
else
	notok "share=on: unexpected warning, or the connects did not end"
	show "$T/console-on.log" "$T/uvsockd-on.log"
fi
[ "$fails" = 0 ]
