#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The uvsock demo (`make demo`): starts uvsockd for one VM (guest cid 3) in a temporary
# directory, runs tools/uvsock-demo as that VM's userspace guest and as a host program (greetings
# both ways, SEQPACKET, a short throughput table, the commands to try it by hand), shows
# uvsock-stat with one line on why a clean run counts RSTs, then stops uvsockd by PID and
# checks that it exited cleanly and removed its sockets. Nothing is left running; the temporary
# directory is removed on every path.
#
#   scripts/demo.sh [--check] [BUILD_DIR]      (BUILD_DIR defaults to build)
#   scripts/demo.sh --loopback [BUILD_DIR]     the first demo: in-process loopback, no uvsockd
#
# --check also verifies the output (the meson test 'demo' runs this).
set -euo pipefail

check=0 loopback=0
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1; shift ;;
	--loopback) loopback=1; shift ;;
	-h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
build=${1:-build}
demo=$build/tools/uvsock-demo
uvsockd=$build/daemon/uvsockd
stat=$build/tools/uvsock-stat
for b in "$demo" "$uvsockd" "$stat"; do
	if [ ! -x "$b" ]; then
		echo "demo.sh: $b not found; build first (meson compile -C $build)" >&2
		exit 1
	fi
done

if [ $loopback = 1 ]; then
	echo "== uvsock demo: AF_VSOCK-style client and server over the loopback transport =="
	exec "$demo" --loopback --bytes 64M
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-demo.XXXXXX")
pid=""

# Every exit path: stop uvsockd if it is still running (by PID), remove the directory.
cleanup() {
	local rc=$? i
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

fail() {
	echo "demo.sh: FAILED: $*" >&2
	if [ -s "$tmp/uvsockd.log" ]; then
		echo "--- uvsockd's log:" >&2
		tail -n 20 "$tmp/uvsockd.log" >&2
	fi
	exit 1
}

sock=$tmp/vm3.sock uds=$tmp/vm3.vsock ctl=$tmp/vm3.sock.ctl
# uvsockd dies with this script even if the script is killed (setpriv: util-linux).
pdeath=()
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
	pdeath=(setpriv --pdeathsig TERM --)
fi
"${pdeath[@]}" "$uvsockd" --vm "guest-cid=3,socket=$sock,uds-path=$uds" --log-level warn \
	2>"$tmp/uvsockd.log" &
pid=$!

# The control socket is created last: once it is there, uvsockd is ready (bounded: 10 s).
for ((i = 0; i < 200; i++)); do
	[ -S "$sock" ] && [ -S "$ctl" ] && break
	kill -0 "$pid" 2>/dev/null || fail "uvsockd exited at start-up"
	sleep 0.05
done
[ -S "$sock" ] && [ -S "$ctl" ] || fail "uvsockd's sockets did not appear within 10 s"

echo "== uvsock demo: uvsockd (pid $pid) serves one VM, guest cid 3 =="
"$demo" --socket "$sock" --uds-path "$uds" --uvsockd "$uvsockd" | tee "$tmp/demo.out" ||
	fail "uvsock-demo failed (see above)"

echo "uvsock-stat -s $ctl --counters (uvsockd's counters for this run):"
"$stat" -s "$ctl" --counters | sed 's/^/  /' | tee "$tmp/stat.out" || fail "uvsock-stat failed"
# Why a clean run shows RSTs (docs/vsock-protocol.md, state table: SHUTDOWN with both flags).
echo "  Why RSTs after a clean run: a vsock close ends with one (the side that gets SHUTDOWN" \
	"answers RST, as Linux does)"

# Stop uvsockd by PID and check that it exits 0 and removes its sockets (bounded: 5 s).
kill -TERM "$pid"
for ((i = 0; i < 100; i++)); do
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.05
done
kill -0 "$pid" 2>/dev/null && fail "uvsockd (pid $pid) still runs 5 s after SIGTERM"
rc=0
wait "$pid" || rc=$?
pid=""
[ $rc = 0 ] || fail "uvsockd exited with status $rc"
left=$(find "$tmp" -type s)
[ -z "$left" ] || fail "uvsockd left sockets behind: $left"
echo "uvsockd stopped (SIGTERM, exit 0) and removed its sockets; $tmp is removed."

if [ $check = 1 ]; then
	for want in \
		'guest(cid 3:port [0-9]*) -> host: "hello from the guest"' \
		'host -> guest(cid 3:port [0-9]*): "hello from the host"' \
		'writes "CONNECT 6000", and uvsockd answers "OK [0-9]*"' \
		'host(cid 2:port [0-9]*) -> guest(port 6000): "hello guest, the host here"' \
		'guest(cid 3:port 6000) -> host: "hello host, the guest here"' \
		'guest sent 3 messages (5, 1500, 30000 bytes), host received 3 messages (5, 1500, 30000' \
		'host sent 3 messages (5, 1500, 30000 bytes), guest received 3 messages (5, 1500, 30000' \
		'64 KiB .* MiB/s .* MiB/s' \
		'socat - UNIX-CONNECT:/tmp/vm3.vsock'; do
		grep -q -- "$want" "$tmp/demo.out" || fail "the output lacks: $want"
	done
	grep -q 'rst  [0-9]* sent, [0-9]* received' "$tmp/stat.out" ||
		fail "uvsock-stat's counters lack the RST line the explanation is about"
	grep -q 'Why 64 B host -> guest is slower: ' "$tmp/demo.out" ||
		echo "demo.sh --check: (64 B host -> guest was not slower this time: no explanation)"
	echo "demo.sh --check: every expected line is there."
fi
