#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# uvsock-conform's meson tests (tests/conformance/meson.build), TAP on stdout:
#
#   run-conform.sh BUILD_DIR pass     uvsock-conform against this tree's uvsockd: every check
#                                     must pass (its own TAP is the output)
#   run-conform.sh BUILD_DIR windows  uvsock-conform --only credit_windows,slow_guest_reader
#                                     against uvsockd with tx-buffer-size 4096, 4097, 65536 and
#                                     65537 (one uvsockd each; the pass run has the default):
#                                     no stall either way, whichever side's buf_alloc is smaller
#   run-conform.sh BUILD_DIR copy     the same checks against uvsockd on its copying path
#                                     (UVSOCK_TUNE=no-zerocopy), with the default tx-buffer-size
#                                     and those four
#   run-conform.sh BUILD_DIR detect   uvsock-conform against conform-mangler.c in front of that
#                                     uvsockd: passes through the transparent proxy, and fails,
#                                     naming the right rule, where the proxy shares one fwd_cnt
#                                     between the streams, cuts RX packets under their header or
#                                     never passes the host's half-close on; and uvsock-perf
#                                     --end count measures host to guest through that last one
#                                     (its readers would otherwise wait for an end of stream)
#
# Everything runs in a temporary directory; uvsockd and the proxies are stopped by PID.
set -u
build=${1:?build directory} what=${2:?pass, windows, copy or detect}
uvsockd=$build/daemon/uvsockd conform=$build/tools/uvsock-conform
mangler=$build/tests/conformance/conform-mangler
tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-conform.XXXXXX")
pids=()

stop() {
	local p i
	for p in "$@"; do
		kill -0 "$p" 2>/dev/null || continue
		kill -TERM "$p" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
}
cleanup() {
	local rc=$?
	stop "${pids[@]}"
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

pdeath=()
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then
	pdeath=(setpriv --pdeathsig TERM --)
fi

# Waits (bounded: 10 s) for socket $1 of process $2.
wait_socket() {
	local i
	for ((i = 0; i < 200; i++)); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || break
		sleep 0.05
	done
	echo "Bail out! $1 did not appear (process $2)"
	[ -s "$tmp/uvsockd.log" ] && sed 's/^/# /' "$tmp/uvsockd.log"
	exit 1
}

if [ "$what" = windows ] || [ "$what" = copy ]; then
	sizes=(4096 4097 65536 65537)
	tune=()
	if [ "$what" = copy ]; then
		sizes=(default "${sizes[@]}")
		tune=(env UVSOCK_TUNE=no-zerocopy)
	fi
	echo "TAP version 13"
	echo "1..${#sizes[@]}"
	n=0
	for size in "${sizes[@]}"; do
		n=$((n + 1))
		sock=$tmp/w$size.sock uds=$tmp/w$size.vsock vm="guest-cid=3,socket=$sock,uds-path=$uds"
		[ "$size" = default ] || vm+=",tx-buffer-size=$size"
		"${pdeath[@]}" "${tune[@]}" "$uvsockd" --log-level warn --vm "$vm" \
			2>"$tmp/uvsockd.log" &
		pids+=($!)
		wait_socket "$sock.ctl" "${pids[-1]}"
		"$conform" --socket "$sock" --uds-path "$uds" --cid 3 \
			--only credit_windows,slow_guest_reader >"$tmp/out" 2>&1
		rc=$?
		stop "${pids[-1]}"
		if [ "$rc" = 0 ]; then
			echo "ok $n - ${tune[1]:-}${tune:+ }tx-buffer-size=$size: credit_windows and slow_guest_reader pass"
		else
			echo "not ok $n - ${tune[1]:-}${tune:+ }tx-buffer-size=$size: uvsock-conform exits $rc"
		fi
		sed 's/^/# /' "$tmp/out"
	done
	exit 0
fi

sock=$tmp/vm3.sock uds=$tmp/vm3.vsock
"${pdeath[@]}" "$uvsockd" --vm "guest-cid=3,socket=$sock,uds-path=$uds" --log-level warn \
	2>"$tmp/uvsockd.log" &
pids+=($!)
wait_socket "$tmp/vm3.sock.ctl" "${pids[0]}"

if [ "$what" = pass ]; then
	"$conform" --socket "$sock" --uds-path "$uds" --cid 3
	exit $?
fi

# detect: one proxy per mode; each line: mode, checks, expected exit status, text the deviation
# must contain.
n=0
echo "TAP version 13"
echo "1..5"
while read -r mode only want text; do
	n=$((n + 1))
	px=$tmp/px-$mode.sock
	"${pdeath[@]}" "$mangler" --listen "$px" --backend "$sock" --mode "$mode" &
	pids+=($!)
	wait_socket "$px" "${pids[-1]}"
	"$conform" --socket "$px" --uds-path "$uds" --only "$only" >"$tmp/out" 2>&1
	rc=$?
	stop "${pids[-1]}"
	if [ "$rc" = "$want" ] && grep -q -- "$text" "$tmp/out"; then
		echo "ok $n - mode $mode: uvsock-conform --only $only exits $rc"
	else
		echo "not ok $n - mode $mode: uvsock-conform --only $only exits $rc, expected $want" \
			"with '$text' in its output"
	fi
	sed 's/^/# /' "$tmp/out"
done <<'MODES'
none fwd_cnt_per_connection,rx_small_buffers 0 2 passed, 0 failed
shared-fwd-cnt fwd_cnt_per_connection 1 contradicts: virtio 1.2 §5.10.6.3
cut rx_small_buffers 1 contradicts: virtio 1.2 §5.10.6.4
no-shutdown half_close_host_to_guest 1 contradicts: virtio 1.2 §5.10.6.5
MODES

# uvsock-perf --end count through a back-end that never passes the host's half-close on: the
# guest reader stops at the writer's count (a 120 s bound; it finishes in seconds).
px=$tmp/px-perf.sock
"${pdeath[@]}" "$mangler" --listen "$px" --backend "$sock" --mode no-shutdown &
pids+=($!)
wait_socket "$px" "${pids[-1]}"
timeout 120 "$build/tools/uvsock-perf" --quick --socket "$px" --uds-path "$uds" --end count \
	--backend-pid "${pids[0]}" --tests stream --transports vsock-h2g >"$tmp/out" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "vsock-h2g" "$tmp/out"; then
	echo "ok 5 - uvsock-perf --end count measures host to guest without the half-close"
else
	echo "not ok 5 - uvsock-perf --end count through mode no-shutdown exits $rc"
fi
sed 's/^/# /' "$tmp/out"
