#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/vm-shell.sh as a user runs it (suite 'interop'; prints TAP, exits 0, 1 or 77): a built
# uvsockd with VM 3, then vm-shell.sh against its vhost-user socket with commands typed on its
# terminal (a pipe here): the guest's banner offers Debian's socat, ncat and ssh, and each runs
# in the guest: socat and ncat connect to host listeners over vsock (their bytes arrive), ssh -V
# prints OpenSSH's version; `poweroff -f` ends QEMU. Nothing is fetched or installed here:
# without the cached kernel, guest tools or interop packages this exits 77 saying which.
#   vm-shell-tools.sh UVSOCKD UVSOCK_GUEST
set -u
UVSOCKD=$1 GUEST=$2
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=../interop/lib.sh
source "$HERE/../interop/lib.sh"
# shellcheck source=vmtap.sh
source "$HERE/vmtap.sh"
HOWTO="make interop-deps (scripts/fetch-kernels.sh, scripts/fetch-guest-tools.sh)"

command -v socat >/dev/null 2>&1 || skip "socat missing (scripts/install-deps.sh test)"
"$REPO/scripts/install-deps.sh" --check interop >/dev/null 2>&1 ||
	skip "interop packages missing: $("$REPO/scripts/install-deps.sh" --check interop 2>&1)"
kernel_cached 6.1 || skip "no cached 6.1 guest kernel: $HOWTO"
debs_cached guest-tools || skip "no cached guest tools (socat, ncat, ssh): $HOWTO"

T=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-vmshell.XXXXXX") || exit 1
# qpid is vm-shell.sh: its QEMU (a child, by its PID) goes first; then the host listeners.
l1="" l2=""
cleanup() {
	[ -n "$qpid" ] && kill -KILL $(pgrep -P "$qpid") 2>/dev/null
	[ -n "$l1" ] && kill -KILL "$l1" 2>/dev/null
	[ -n "$l2" ] && kill -KILL "$l2" 2>/dev/null
	vm_cleanup
}
trap cleanup EXIT
trap 'exit 1' INT TERM
echo "1..4"

"$UVSOCKD" --vm "guest-cid=3,socket=$T/vm3.sock,uds-path=$T/vm3.vsock" --control none \
	>"$T/uvsockd.log" 2>&1 &
upid=$!
# Host listeners the guest's tools connect to (host ports 5000 and 5001), each keeping what it
# gets.
socat -u "UNIX-LISTEN:$T/vm3.vsock_5000" "OPEN:$T/got-socat,creat" 2>"$T/l5000.log" &
l1=$!
socat -u "UNIX-LISTEN:$T/vm3.vsock_5001" "OPEN:$T/got-ncat,creat" 2>"$T/l5001.log" &
l2=$!
i=0
while [ $i -lt 100 ] && ! { [ -S "$T/vm3.sock" ] && [ -S "$T/vm3.vsock_5000" ] &&
		[ -S "$T/vm3.vsock_5001" ]; }; do
	sleep 0.1; i=$((i + 1))
done
[ -S "$T/vm3.sock" ] || { notok "uvsockd did not start"; show "$T/uvsockd.log"; exit 1; }

# The terminal: a FIFO held open here, so QEMU's stdin sees no end of file before poweroff.
mkfifo "$T/tty"
"$REPO/scripts/vm-shell.sh" --kernel 6.1 --guest "$GUEST" "$T/vm3.sock" <"$T/tty" \
	>"$T/console.log" 2>&1 &
qpid=$!
exec {tty}>"$T/tty"
if wait_for_line "$T/console.log" "stops the VM" 180 "$qpid" >/dev/null; then
	ok "vm-shell.sh boots to the guest shell"
else
	notok "vm-shell.sh did not reach the guest shell"; show "$T/console.log" "$T/uvsockd.log"
	exit 1
fi
if grep -q 'Debian tools: socat - VSOCK-CONNECT' "$T/console.log"; then
	ok "the banner offers socat, ncat and ssh"
else
	notok "no Debian tools in the banner"; show "$T/console.log"
fi
# Typed while the shell starts: the console's tty keeps the lines until sh reads them.
{
	echo 'echo from-guest-socat | socat - VSOCK-CONNECT:2:5000; echo "UVSOCK-T socat rc=$?"'
	echo 'echo from-guest-ncat | ncat --vsock 2 5001; echo "UVSOCK-T ncat rc=$?"'
	echo 'ssh -V 2>&1 | sed "s/^/UVSOCK-T ssh /"'
	echo 'poweroff -f'
} >&"$tty"
wait_for_line "$T/console.log" '^UVSOCK-T ssh ' 120 "$qpid" >/dev/null
i=0
while [ $i -lt 300 ] && kill -0 "$qpid" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
exec {tty}>&-
if grep -q '^UVSOCK-T socat rc=0' "$T/console.log" && [ "$(cat "$T/got-socat" 2>/dev/null)" = from-guest-socat ] &&
	grep -q '^UVSOCK-T ncat rc=0' "$T/console.log" && [ "$(cat "$T/got-ncat" 2>/dev/null)" = from-guest-ncat ]; then
	ok "socat and ncat in the guest reach host listeners through uvsockd"
else
	notok "socat or ncat in the guest: $(grep -a '^UVSOCK-T' "$T/console.log" | tr '\n' ' ')"
	show "$T/console.log" "$T/l5000.log" "$T/l5001.log"
fi
if grep -q '^UVSOCK-T ssh OpenSSH_' "$T/console.log"; then
	ok "ssh in the guest: $(grep -a -m1 '^UVSOCK-T ssh ' "$T/console.log" | cut -c14- | tr -d '\r')"
else
	notok "no ssh -V output in the guest"; show "$T/console.log"
fi
[ "$fails" = 0 ]
