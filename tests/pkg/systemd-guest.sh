#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The packaged units as shipped, under a real systemd (called by test-pkg.sh with the .debs it
# built; prints TAP lines numbered from FIRST, exits 0, 1 or 77). A QEMU guest (the interop
# guest's Debian 6.1 kernel, TCG) boots Debian 12's systemd 252 as PID 1 from an initramfs that
# holds the systemd package and its libraries (scripts/fetch-guest-tools.sh systemd-guest caches
# them; unpacked, never installed), busybox, and the uvsockd and libuvsock0 packages unpacked as
# dpkg would. A oneshot unit in the guest then does what an operator does and prints one
# UVSOCK-SYS line per step on the serial console:
#   systemctl start uvsockd@example (the shipped /etc/uvsockd/example.yaml): the start returns
#   only after READY=1 (Type=notify), its STATUS= text, the sockets under /run/uvsockd/example;
#   systemctl reload with the file unchanged (check, then SIGHUP: the daemon logs the re-read);
#   a typo in the file: the reload fails and the daemon keeps running; a unit whose file has a
#   typo: failed once with exit 2, no restart; systemd-analyze security's exposure score;
#   systemctl stop: inactive, sockets gone.
#   systemd-guest.sh DEBDIR FIRST
set -u
DEBDIR=$1 FIRST=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../interop/lib.sh
source "$HERE/../interop/lib.sh"
HOWTO="make interop-deps (scripts/fetch-kernels.sh, scripts/fetch-guest-tools.sh)"
skip() { echo "ok $FIRST - systemd guest # SKIP $*"; exit 77; }

command -v cpio >/dev/null 2>&1 || skip "cpio missing"
qemu_resolve || skip "no cached QEMU"
command -v "$INTEROP_QEMU" >/dev/null 2>&1 || skip "$INTEROP_QEMU missing: $HOWTO"
bb=$(static_busybox) || skip "no static busybox (package busybox-static)"
kernel_cached 6.1 || skip "no cached 6.1 guest kernel: $HOWTO"
debs_cached systemd-guest || skip "no cached systemd for the guest: $HOWTO"
SYSD=$DEBS_ROOT

T=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-sysguest.XXXXXX") || exit 1
qpid=""
trap '[ -n "$qpid" ] && kill -KILL "$qpid" 2>/dev/null; rm -rf "$T"' EXIT
n=$((FIRST - 1)) fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fails=$((fails + 1)); }

ov=$T/root
mkdir -p "$ov"
cp -a "$SYSD/." "$ov/"
for p in uvsockd libuvsock0; do
	deb=$(ls "$DEBDIR/${p}_"*.deb 2>/dev/null | head -n 1)
	[ -n "$deb" ] && dpkg -x "$deb" "$ov" || { notok "no $p .deb in $DEBDIR"; exit 1; }
done
# What dpkg and the maintainer scripts would leave: an os-release, an empty machine-id, the
# busybox applets the units and the script use.
mkdir -p "$ov/etc/systemd/system/multi-user.target.wants" "$ov/usr/local/bin" "$ov/run" "$ov/var/log"
[ -e "$ov/etc/os-release" ] || printf 'ID=debian\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n' >"$ov/etc/os-release"
: >"$ov/etc/machine-id"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ov/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ov/etc/group"
for a in sh kill cat grep ls sleep tr head tail sed cp rm echo test mount; do
	[ -e "$ov/bin/$a" ] || ln -s busybox "$ov/bin/$a"
done
cat >"$ov/usr/local/bin/uvsock-systest" <<'EOF'
#!/bin/sh
# The operator's steps (tests/pkg/systemd-guest.sh); one UVSOCK-SYS line each on the console.
say() { echo "UVSOCK-SYS $*" >/dev/ttyS0; }
u=uvsockd@example
say "pid1=$(cat /proc/1/comm) systemd=$(systemctl --version | head -n 1 | tr ' ' _)"
systemctl start $u; say "start rc=$?"
say "show $(systemctl show -p ActiveState -p SubState -p StatusText -p NRestarts $u | tr '\n ' ';_')"
say "sockets $(ls /run/uvsockd/example | tr '\n' ' ')"
systemctl reload $u; say "reload rc=$?"
sleep 1
say "reread $(journalctl -u $u -o cat --no-pager | grep -c -i 're-read\|reread\|SIGHUP')"
cp /etc/uvsockd/example.yaml /tmp/example.yaml
echo "    uds_pth: /run/uvsockd/example/typo" >>/etc/uvsockd/example.yaml
systemctl reload $u; say "reload-typo rc=$? $(systemctl is-active $u)"
cp /tmp/example.yaml /etc/uvsockd/example.yaml
cp /tmp/example.yaml /etc/uvsockd/typo.yaml
echo "    uds_pth: /run/uvsockd/typo/x" >>/etc/uvsockd/typo.yaml
systemctl start uvsockd@typo; say "typo-start rc=$?"
sleep 3
say "typo-show $(systemctl show -p ActiveState -p Result -p ExecMainStatus -p NRestarts uvsockd@typo | tr '\n ' ';_')"
say "typo-log $(journalctl -u uvsockd@typo -o cat --no-pager | grep -m1 uds_pth | tr ' ' _)"
say "security $(systemd-analyze security --no-pager $u 2>&1 | grep -i 'overall exposure' | tr ' ' _)"
systemd-analyze security --no-pager $u >/dev/ttyS0 2>&1
systemctl stop $u; say "stop rc=$? $(systemctl is-active $u) left=$(ls /run/uvsockd/example 2>/dev/null | wc -l)"
journalctl -u $u -o short-monotonic --no-pager >/dev/ttyS0 2>&1
say "done"
systemctl poweroff -f
EOF
chmod 755 "$ov/usr/local/bin/uvsock-systest"
cat >"$ov/etc/systemd/system/uvsock-systest.service" <<'EOF'
[Unit]
Description=uvsock: the packaged units under systemd (tests/pkg/systemd-guest.sh)
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/usr/local/bin/uvsock-systest
[Install]
WantedBy=multi-user.target
EOF
ln -s ../uvsock-systest.service "$ov/etc/systemd/system/multi-user.target.wants/uvsock-systest.service"

GUEST_OVERLAY=$ov build_initramfs "$KDIR" "$bb" "$T/initrd.cpio" || { notok "initramfs"; exit 1; }
UVSOCK_INTEROP_MEM=1024 qemu_args "$KDIR" "$T/initrd.cpio" \
	"rdinit=/lib/systemd/systemd systemd.unit=multi-user.target systemd.show_status=0" "$T/console.log"
# A kernel that panics before userspace (under TCG on a loaded machine: "IO-APIC + timer doesn't
# work") is booted once more, loudly, as tests/interop/interop.sh does.
for attempt in 1 2; do
	"$INTEROP_QEMU" "${QEMU_ARGS[@]}" >"$T/qemu.log" 2>&1 &
	qpid=$!
	wait_for_line "$T/console.log" '^UVSOCK-SYS (done|pid1)|Kernel panic' 600 "$qpid" |
		grep -q 'Kernel panic' || break
	[ $attempt = 2 ] && break
	echo "# boot attempt 1 panicked before userspace: $(grep -a -m1 'Kernel panic' "$T/console.log" | cut -c1-120); booting again"
	kill -KILL "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null
	mv "$T/console.log" "$T/console.log.attempt1"
done
if ! wait_for_line "$T/console.log" '^UVSOCK-SYS done' 600 "$qpid" >/dev/null; then
	notok "the guest did not run the steps (systemd as PID 1)"
	sed 's/^/# /' "$T/console.log" "$T/qemu.log" | tail -n 60
	exit 1
fi
line() { grep -a -m1 "^UVSOCK-SYS $1" "$T/console.log" | tr -d '\r'; }
check() { # check DESC KEY REGEX... (every REGEX must match the step's line)
	local l desc=$1 key=$2 re
	shift 2
	l=$(line "$key")
	for re in "$@"; do
		echo "$l" | grep -qE "$re" || { notok "$desc (got: ${l:-nothing})"; return; }
	done
	ok "$desc (${l#UVSOCK-SYS })"
}
check "systemd is PID 1 in the guest" pid1= 'pid1=systemd '
check "systemctl start uvsockd@example returns after READY=1" "start" 'rc=0$'
check "active, STATUS= from uvsockd" "show" 'ActiveState=active;' 'StatusText=serving_1_VM'
check "sockets under /run/uvsockd/example" "sockets" 'vm3.sock vm3.sock.ctl vm3.vsock'
check "systemctl reload: checked, then SIGHUP" "reload rc" 'rc=0$'
check "uvsockd re-read its file on the reload's SIGHUP" "reread" 'reread [1-9]'
check "a typo fails the reload, the daemon keeps running" "reload-typo" 'rc=[1-9][0-9]* active$'
check "a unit whose file has a typo fails once (exit 2), no restart" "typo-show" \
	'ActiveState=failed;' 'ExecMainStatus=2;' 'NRestarts=0;'
check "its journal has uvsockd's message" "typo-log" "unknown_key_'uds_pth'"
check "systemd-analyze security scores the unit" "security" 'exposure'
check "systemctl stop: inactive, sockets removed" "stop" 'rc=0 inactive left=0$'
sed -n '/UVSOCK-SYS security/,/UVSOCK-SYS stop/p' "$T/console.log" | grep -a -E '^(→|✓|✗)|Overall' | sed 's/^/# /' | head -n 60
[ "$fails" = 0 ]
