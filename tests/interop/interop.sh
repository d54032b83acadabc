#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The real-guest interop run: for each Debian guest kernel of UVSOCK_INTEROP_KERNELS (default
# 6.1 via linux-image-amd64 and 6.12 via linux-image-6.12-amd64 of Debian 12, 7.3 via
# trixie-backports' linux-image-amd64; taken from the cache that scripts/fetch-kernels.sh fills
# with apt-get download, never installed; this script itself installs and fetches nothing),
# start uvsockd with two VMs (CIDs 3 and 4, one group), boot QEMU (TCG, q35, vhost-user-vsock-pci)
# with an initramfs holding busybox, the vsock modules and tests/interop/guest/uvsock-guest, and
# run the cases: the guest program runs them in the VM (AF_VSOCK there only) and prints
# "UVSOCK-CASE <name> PASS|FAIL <ms> <detail>" on the serial console; a host helper per VM
# (tests/interop/host) plays the host applications behind uvsockd's Unix sockets and answers the
# guest over a second serial port. Every step has a time limit; every process started here is
# ended by PID on every exit path; temporary files live in one mktemp dir removed at exit.
#
# Usage: interop.sh --guest BIN --host BIN [--daemon UVSOCKD] [--uvsock-run BIN] [--selftest]
#                   [--kernels "K,..."]
#   --uvsock-run adds the shim cases (shim_h2g, shim_g2h, shim_refused: Debian's socat and ncat
#                run unmodified through uvsock-run on the host, docs/shim.md) when socat and
#                ncat are installed, and the kernel's own vsock_test both ways (vsock_test,
#                vsock_test_server) when scripts/fetch-kernels.sh cached its source
#   --kconf BIN  the conformance table against each guest kernel (tests/conformance/kernel):
#                over vsock_loopback in the main boot, between the sibling guests (client in
#                CID 3, server in CID 4); as cases: kconf, kconf_sib (docs/interop.md)
#   --selftest   no daemon: boot each kernel, load the modules, and run the guest program over
#                vsock loopback plus the control channel (proves everything but uvsockd)
# Environment: UVSOCK_INTEROP_BULK (bytes each way of the bulk cases, default 64 MiB),
#   UVSOCK_INTEROP_KERNELS (the kernels, comma or space separated: 6.1, 6.12, 7.3 or a meta
#   package of the system's lists; default "6.1 6.12 7.3"; one not cached is left out loudly),
#   UVSOCK_INTEROP_CASES (only this case list, one boot, e.g.
#   "hello,g2h_echo"), UVSOCK_INTEROP_KEEP=1 (keep the temp dir), UVSOCK_INTEROP_CACHE,
#   UVSOCK_INTEROP_SMP, UVSOCK_INTEROP_MEM, UVSOCK_INTEROP_BOOT=bzimage,
#   UVSOCK_INTEROP_DAEMON_ARGS (extra uvsockd options, e.g. "--log-level debug"),
#   UVSOCK_INTEROP_TRACE=PORT|all (the guest prints its virtio-vsock packets: UVSOCK-TRACE),
#   UVSOCK_INTEROP_QEMU (the QEMU binary, default the system's; "backports": the cached
#   bookworm-backports one of scripts/fetch-qemu.sh), UVSOCK_INTEROP_PACKED=1 (packed=on),
#   UVSOCK_INTEROP_INORDER=1 (in_order=on, and the case in_order checks bit 35 was negotiated),
#   UVSOCK_INTEROP_TCG_THREAD=multi|single, UVSOCK_INTEROP_FAULT (test knob, comma list:
#   boot-panic:VM = VM's first boot attempt panics before /init, init-panic:VM = VM panics
#   right after UVSOCK-INIT; VM is main, sibsrv, sibcli, surv, victim, again or self).
# A boot whose kernel dies before /init prints UVSOCK-INIT is retried once (loudly); nothing
# after UVSOCK-INIT is ever retried.
# Exit: 0 all passed, 1 a failure, 77 cannot run here (printed loudly): a program or every cached
# kernel is missing, or the QEMU asked for (UVSOCK_INTEROP_QEMU=backports: not cached,
# scripts/fetch-qemu.sh; UVSOCK_INTEROP_INORDER=1: no in_order property) is not there; `make interop-deps` (scripts/install-deps.sh interop, then
# scripts/fetch-kernels.sh) provides both, and `make check` runs it first.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

GUEST="" HOST="" DAEMON="" UVSOCK_RUN="" SELFTEST=0 KCONF_BIN=""
KERNELS=$INTEROP_KERNELS
BULK=${UVSOCK_INTEROP_BULK:-$((64 << 20))}
VM_LIMIT=${UVSOCK_INTEROP_VM_LIMIT:-900}   # seconds one VM may run in all
while [ $# -gt 0 ]; do
	case $1 in
	--guest) GUEST=$2; shift 2 ;;
	--host) HOST=$2; shift 2 ;;
	--daemon) DAEMON=$2; shift 2 ;;
	--uvsock-run) UVSOCK_RUN=$2; shift 2 ;;
	--kconf) KCONF_BIN=$2; shift 2 ;;
	--selftest) SELFTEST=1; shift ;;
	--kernels) KERNELS=$2; shift 2 ;;
	*) echo "usage: $0 --guest BIN --host BIN [--daemon UVSOCKD] [--uvsock-run BIN] [--selftest]" >&2; exit 2 ;;
	esac
done

skip() {
	echo "######################################################################" >&2
	echo "## INTEROP SKIPPED: $*" >&2
	echo "######################################################################" >&2
	exit 77
}

[ -x "$GUEST" ] && [ -x "$HOST" ] || { echo "interop: --guest and --host programs needed" >&2; exit 2; }
if [ $SELFTEST = 0 ] && [ ! -x "$DAEMON" ]; then
	echo "interop: FAIL: uvsockd not found at '$DAEMON'" >&2
	exit 1
fi

# What the run needs is installed and fetched before the test (make interop-deps), never here.
HOWTO="run 'make interop-deps' (scripts/install-deps.sh interop && scripts/fetch-kernels.sh)"
# The QEMU of the run (lib.sh INTEROP_QEMU): the system's, or with UVSOCK_INTEROP_QEMU=backports
# the bookworm-backports one that scripts/fetch-qemu.sh caches.
qemu_resolve || skip "the $QEMU_SUITE QEMU (UVSOCK_INTEROP_QEMU=backports) is not in the cache" \
	"$(interop_cache_dir)/qemu: run 'make interop-deps' (scripts/fetch-qemu.sh)"
for p in "$INTEROP_QEMU" cpio; do
	command -v "$p" >/dev/null 2>&1 || skip "$p is not installed: $HOWTO"
done
if [ "${UVSOCK_INTEROP_INORDER:-0}" = 1 ]; then
	"$INTEROP_QEMU" -device vhost-user-vsock-pci,help 2>/dev/null | grep -q '^ *in_order=' ||
		skip "$("$INTEROP_QEMU" --version | head -n 1) has no vhost-user-vsock-pci in_order" \
			"property (UVSOCK_INTEROP_INORDER=1 needs a newer QEMU: UVSOCK_INTEROP_QEMU=backports)"
	# uvsockd's debug log names the features QEMU acked (SET_FEATURES), checked after the boot.
	UVSOCK_INTEROP_DAEMON_ARGS="${UVSOCK_INTEROP_DAEMON_ARGS:-} --log-level debug"
fi
static_busybox >/dev/null || skip "no static busybox (package busybox-static): $HOWTO"
# A kernel that is not cached is left out loudly (listed again in the summary); the run skips
# only when none of them is cached.
CACHED="" MISSING=""
for meta in ${KERNELS//,/ }; do
	if kernel_cached "$meta"; then
		CACHED="$CACHED $meta"
	else
		MISSING="$MISSING $meta"
		echo "######################################################################" >&2
		echo "## INTEROP: kernel $meta is not in the cache $(interop_cache_dir): LEFT OUT" >&2
		echo "## ($HOWTO)" >&2
		echo "######################################################################" >&2
	fi
done
[ -n "$CACHED" ] || skip "none of the kernels ($KERNELS) is in the cache $(interop_cache_dir): $HOWTO"

T=$(mktemp -d /tmp/uvsock-interop.XXXXXX) || exit 1
declare -A QPID HPID VMSTART VMNOTE VMCASES BOOTMS VMARGS VMTRIES
DPID=""
RETRIES=()   # one line per boot that died before /init and was retried
cleanup() {
	local p
	for p in "${QPID[@]}" "${HPID[@]}" $DPID; do
		[ -n "$p" ] && kill -9 "$p" 2>/dev/null
	done
	for p in "${QPID[@]}" "${HPID[@]}" $DPID; do
		[ -n "$p" ] && wait "$p" 2>/dev/null
	done
	if [ "${UVSOCK_INTEROP_KEEP:-0}" = 1 ]; then
		echo "interop: kept $T" >&2
	else
		rm -rf "$T"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

RESULTS=()   # "kernel|case|PASS|ms|detail"
FAILS=0
result() {   # kernel case PASS|FAIL ms detail
	RESULTS+=("$1|$2|$3|$4|$5")
	[ "$3" = PASS ] || [ "$3" = SKIP ] || FAILS=$((FAILS + 1))
	printf '  %-5s %-24s %-4s %7s ms  %s\n' "$1" "$2" "$3" "$4" "$5"
}

# ---- daemon ----

daemon_start() {
	local k=$1
	# shellcheck disable=SC2086 # extra daemon options (e.g. --log-level debug) split on purpose
	"$DAEMON" ${UVSOCK_INTEROP_DAEMON_ARGS:-} --vm "guest-cid=3,socket=$T/vm3.sock,uds-path=$T/vm3.vsock,groups=interop" \
		--vm "guest-cid=4,socket=$T/vm4.sock,uds-path=$T/vm4.vsock,groups=interop" \
		>"$T/uvsockd.$k.log" 2>&1 &
	DPID=$!
	ln -sf "uvsockd.$k.log" "$T/uvsockd.log"
	local end=$(($(now_ms) + 10000))
	while ! [ -S "$T/vm3.sock" ] || ! [ -S "$T/vm4.sock" ]; do
		if ! kill -0 "$DPID" 2>/dev/null || [ "$(now_ms)" -ge "$end" ]; then
			echo "interop: uvsockd did not come up:" >&2
			tail -n 20 "$T/uvsockd.$k.log" >&2
			kill -9 "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=""
			return 1
		fi
		sleep 0.05
	done
}

daemon_alive() { [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; }

# Stop with SIGTERM (10 s), then SIGKILL. Returns 1 if it had to be killed or died badly.
daemon_stop() {
	local rc=0 end
	[ -n "$DPID" ] || return 0
	kill -TERM "$DPID" 2>/dev/null
	end=$(($(now_ms) + 10000))
	while kill -0 "$DPID" 2>/dev/null && [ "$(now_ms)" -lt "$end" ]; do sleep 0.05; done
	if kill -0 "$DPID" 2>/dev/null; then
		kill -9 "$DPID" 2>/dev/null; rc=1
	fi
	wait "$DPID" 2>/dev/null
	local st=$?
	[ $st -ge 128 ] && [ $st -ne 143 ] && rc=1
	DPID=""
	return $rc
}

# ---- VMs ----

# vm_start NAME CID CASES [HOLD_FILE]: host helper + QEMU (CID < 0: no vsock device).
vm_start() {
	local name=$1 cid=$2 cases=$3 hold=${4:-} ctl="$T/$1.ctl" uds vsock=""
	if [ "$cid" -ge 3 ]; then uds="$T/vm$cid.vsock"; vsock="$T/vm$cid.sock"; else uds="$T/none"; fi
	local hargs=(--ctl "$ctl" --uds "$uds" --name "$name")
	[ "$cid" -ge 3 ] && hargs+=(--cid "$cid")
	[ -n "$DPID" ] && hargs+=(--daemon-pid "$DPID")
	[ -n "$hold" ] && hargs+=(--hold-file "$hold")
	# The shim cases: the helper runs socat/ncat through uvsock-run, always (docs/shim.md).
	[ -n "$UVSOCK_RUN" ] && [ "$cid" -ge 3 ] && hargs+=(--uvsock-run "$UVSOCK_RUN" --control "$T/vm3.sock")
	[ -n "$UVSOCK_RUN" ] && [ -n "${VT_HOST:-}" ] && hargs+=(--vsock-test "$VT_HOST")
	"$HOST" "${hargs[@]}" >"$T/$name.host.log" 2>&1 &
	HPID[$name]=$!
	local end=$(($(now_ms) + 10000))
	until [ -S "$ctl" ]; do
		if ! kill -0 "${HPID[$name]}" 2>/dev/null || [ "$(now_ms)" -ge "$end" ]; then
			VMNOTE[$name]="host helper did not start: $(tail -n 3 "$T/$name.host.log" | tr '\n' ' ')"
			return 1
		fi
		sleep 0.05
	done
	local extra=""
	[ -n "${UVSOCK_INTEROP_TRACE:-}" ] && extra=" uvsock.trace=$UVSOCK_INTEROP_TRACE"
	VMTRIES[$name]=$((${VMTRIES[$name]:-0} + 1))
	VMARGS[$name]="$cid|$cases|$hold|${INTEROP_REBOOT:-0}"
	# Test knob: the first boot attempt of this VM panics before /init (no initramfs init, no
	# root fs: "VFS: Unable to mount root fs"), to exercise the boot retry.
	case ",${UVSOCK_INTEROP_FAULT:-}," in
	*",boot-panic:$name,"* | *",boot-panic:${name%-*},"*)
		[ "${VMTRIES[$name]}" = 1 ] && extra+=" rdinit=/nonexistent" ;;
	esac
	# Test knob: the guest panics right after UVSOCK-INIT (must fail, never be retried).
	case ",${UVSOCK_INTEROP_FAULT:-}," in
	*",init-panic:$name,"* | *",init-panic:${name%-*},"*) extra+=" uvsock.fault=panic" ;;
	esac
	extra+=${KCONF_APPEND[$name]:-}
	qemu_args "$KDIR" "$INITRD" "uvsock.cases=$cases uvsock.bulk=$BULK$extra" "$T/$name.serial" \
		"$vsock" "$ctl"
	: >"$T/$name.serial"
	"$INTEROP_QEMU" "${QEMU_ARGS[@]}" >"$T/$name.qemu.log" 2>&1 </dev/null &
	QPID[$name]=$!
	VMSTART[$name]=$(now_ms)
	VMCASES[$name]=$cases
	VMNOTE[$name]=""
	BOOTMS[$name]=""
}

# What a kernel that dies on its own prints (panic, oops, BUG, exceptions).
PANIC_RE='Kernel panic|Oops|BUG:|general protection fault|invalid opcode|Fatal exception'

# boot_died NAME: succeed (printing why) if the VM died before its /init ran: no UVSOCK-INIT line
# yet, and the serial log shows a panic/oops or QEMU has exited (while uvsockd is alive, and not
# because of vhost-user, which is our code). Nothing after UVSOCK-INIT counts: such failures are
# never retried.
boot_died() {
	local name=$1 pre line
	# The log up to and including the first UVSOCK-INIT (a rebooting QEMU may boot again).
	pre=$(tr -d '\r' <"$T/$name.serial" 2>/dev/null | sed '/^UVSOCK-INIT/q')
	line=$(printf '%s\n' "$pre" | grep -a -m1 -E "$PANIC_RE") && { echo "${line:0:160}"; return 0; }
	printf '%s\n' "$pre" | grep -a -q '^UVSOCK-INIT' && return 1
	kill -0 "${QPID[$name]}" 2>/dev/null && return 1
	daemon_alive || [ -z "$DPID" ] || return 1
	grep -a -q -i 'vhost' "$T/$name.qemu.log" 2>/dev/null && return 1
	echo "QEMU exited: $(tail -n 2 "$T/$name.qemu.log" 2>/dev/null | tr '\n' ' ')"
}

# vm_retry NAME WHY: end the dead attempt (QEMU and host helper, by PID), keep its logs as
# NAME.*.attempt1, print the loud line and its last serial lines, and start the VM again with the
# same arguments. Fails (leaving the VM for vm_wait to report) after 2 attempts.
vm_retry() {
	local name=$1 why=$2 n=${VMTRIES[$1]} cid cases hold reboot f
	[ "$n" -lt 2 ] || return 1
	kill -9 "${QPID[$name]}" 2>/dev/null; wait "${QPID[$name]}" 2>/dev/null
	kill -9 "${HPID[$name]}" 2>/dev/null; wait "${HPID[$name]}" 2>/dev/null
	unset "QPID[$name]" "HPID[$name]"
	for f in serial host.log qemu.log; do mv -f "$T/$name.$f" "$T/$name.$f.attempt$n" 2>/dev/null; done
	rm -f "$T/$name.ctl"
	RETRIES+=("$name: attempt $n died before /init after $(($(now_ms) - VMSTART[$name])) ms ($why)")
	echo "interop: $name boot attempt $n died before /init ($why): retrying"
	echo "    --- $name attempt $n: serial (last 25 lines) ---"
	tr -d '\r' <"$T/$name.serial.attempt$n" | tail -n 25 | sed 's/^/    | /'
	IFS='|' read -r cid cases hold reboot <<<"${VMARGS[$name]}"
	INTEROP_REBOOT=$reboot vm_start "$name" "$cid" "$cases" "$hold"
}

# vm_boot NAME...: wait (up to 120 s) until each VM's /init has printed UVSOCK-INIT; a VM whose
# kernel dies before that is started once more (vm_retry), while the others keep running. VMs
# that fail otherwise are left to vm_wait, which reports them.
vm_boot() {
	local end=$(($(now_ms) + 120000)) name why pending
	while [ "$(now_ms)" -lt "$end" ]; do
		pending=0
		for name in "$@"; do
			[ -n "${QPID[$name]:-}" ] || continue
			if why=$(boot_died "$name"); then
				vm_retry "$name" "$why" || continue
			elif ! kill -0 "${QPID[$name]}" 2>/dev/null ||
				tr -d '\r' <"$T/$name.serial" 2>/dev/null | grep -a -q '^UVSOCK-INIT'; then
				continue
			fi
			pending=1
		done
		[ $pending = 0 ] && return 0
		sleep 0.2
	done
	return 0   # still booting: vm_wait's boot limit decides
}

# Lines of the serial log that mark progress, without the console's \r.
markers() { tr -d '\r' <"$T/$1.serial" 2>/dev/null | grep -a -E '^UVSOCK-(GUEST|BEGIN|CASE|DONE)'; }

# vm_wait NAME: watch the VM until it powers off, with a limit per phase: boot 120 s, each case
# its own limit (from the guest's BEGIN line) + 30 s, power-off 30 s. Kills QEMU on overrun.
vm_wait() {
	[ -n "${QPID[$1]:-}" ] || return 1   # not started (vm_start set VMNOTE)
	local name=$1 qpid=${QPID[$1]} seen=-1 phase_start limit=120 phase=boot m n last
	phase_start=$(now_ms)
	while kill -0 "$qpid" 2>/dev/null; do
		m=$(markers "$name")
		n=$(printf '%s' "$m" | grep -c .)
		if [ "$n" != "$seen" ]; then
			seen=$n
			phase_start=$(now_ms)
			last=$(printf '%s\n' "$m" | tail -n 1)
			if [ -z "${BOOTMS[$name]}" ] && printf '%s' "$m" | grep -q '^UVSOCK-GUEST'; then
				BOOTMS[$name]=$(($(now_ms) - VMSTART[$name]))
			fi
			case $last in
			UVSOCK-GUEST*) phase="first case"; limit=30 ;;
			UVSOCK-BEGIN*)
				set -- $last
				phase="case $2"; limit=$((${3:-60} + 30)) ;;
			UVSOCK-CASE*) phase="between cases"; limit=30 ;;
			UVSOCK-DONE*) phase="power-off"; limit=30 ;;
			esac
		fi
		if [ -n "$DPID" ] && ! kill -0 "$DPID" 2>/dev/null; then
			VMNOTE[$name]="uvsockd exited during this VM's run; QEMU killed: $(tail -n 3 "$T/uvsockd.log" 2>/dev/null | tr '\n' ' ')"
			kill -9 "$qpid" 2>/dev/null
			break
		fi
		if [ $(($(now_ms) - VMSTART[$name])) -ge $((VM_LIMIT * 1000)) ]; then
			VMNOTE[$name]="VM ran longer than $VM_LIMIT s (UVSOCK_INTEROP_VM_LIMIT) in phase '$phase'; QEMU killed"
			kill -9 "$qpid" 2>/dev/null
			break
		fi
		if [ $(($(now_ms) - phase_start)) -ge $((limit * 1000)) ]; then
			VMNOTE[$name]="time limit of $limit s exceeded in phase '$phase'; QEMU killed"
			kill -9 "$qpid" 2>/dev/null
			break
		fi
		sleep 0.2
	done
	wait "$qpid" 2>/dev/null
	local rc=$?
	if ! markers "$name" | grep -q '^UVSOCK-DONE' && [ -z "${VMNOTE[$name]}" ]; then
		VMNOTE[$name]="QEMU exited (status $rc) before UVSOCK-DONE: $(tail -n 2 "$T/$name.qemu.log" | tr '\n' ' ')"
	fi
	unset "QPID[$name]"
	# The helper ends when QEMU closes the control socket.
	local hp=${HPID[$name]} end=$(($(now_ms) + 10000))
	while kill -0 "$hp" 2>/dev/null && [ "$(now_ms)" -lt "$end" ]; do sleep 0.05; done
	kill -9 "$hp" 2>/dev/null
	wait "$hp" 2>/dev/null
	unset "HPID[$name]"
}

# vm_results KERNEL NAME [SKIP_CASE...]: one result per case of the VM's list.
vm_results() {
	local k=$1 name=$2 c line ms verdict detail label
	local -A nth=()
	shift 2
	local IFS=,
	for c in ${VMCASES[$name]}; do
		c=${c%%:*}
		nth[$c]=$((${nth[$c]:-0} + 1))
		case " $* " in *" $c "*) continue ;; esac
		# The n-th occurrence of a case in the list (a list may repeat cases after a reboot).
		line=$(markers "$name" | grep -a "^UVSOCK-CASE $c " | sed -n "${nth[$c]}p")
		if [ -z "$line" ]; then
			result "$k" "$c" FAIL 0 "[$name] no result: ${VMNOTE[$name]:-guest stopped early}"
			continue
		fi
		IFS=' ' read -r _ _ verdict ms detail <<<"$line"
		# Cases of the main boot keep their name; others are prefixed with their VM's role.
		label=$c
		[ "${name%-*}" = main ] || [ "${name%-*}" = self ] || label="${name%-*}/$c"
		[ "${nth[$c]}" -gt 1 ] && label="$label#${nth[$c]}"
		result "$k" "$label" "$verdict" "$ms" "[$name] $detail"
	done
	IFS=' '
}

vm_log_tail() {
	echo "    --- $1: serial (last 15 lines) ---"
	tr -d '\r' <"$T/$1.serial" | tail -n 15 | sed 's/^/    | /'
	echo "    --- $1: host helper (last 8 lines) ---"
	tail -n 8 "$T/$1.host.log" | sed 's/^/    | /'
}

# ---- the run, per kernel ----

MAIN_CASES=${UVSOCK_INTEROP_CASES:-}
[ -n "$MAIN_CASES" ] || MAIN_CASES="hello,g2h_echo,h2g_echo,g2h_seqpacket,h2g_seqpacket,g2h_refused,h2g_refused"
[ -n "${UVSOCK_INTEROP_CASES:-}" ] || MAIN_CASES+=",g2h_halfclose,h2g_halfclose,host_close,guest_close,g2h_bulk,h2g_bulk"
[ -n "${UVSOCK_INTEROP_CASES:-}" ] || MAIN_CASES+=",g2h_many,h2g_many,g2h_backpressure,h2g_backpressure,h2g_tiny,close_rst,reload"
# New-kernel behaviour (issue 13 item 2; docs/interop.md cases 12-17).
[ -n "${UVSOCK_INTEROP_CASES:-}" ] || MAIN_CASES+=",g2h_multidesc,h2g_small_slow,peek_partial,sioc_queues,guest_linger,h2g_bigbuf"
# vsock_test cases that cannot pass over the hybrid path (docs/shim.md has each reason); they
# are skipped so that the rest run (vsock_test stops at its first failure).
# 6 SOCK_SEQPACKET msg bounds: MSG_EOR is not carried by Unix sockets; 9 SOCK_SEQPACKET invalid
# receive buffer: wants the virtio transport's ENOMEM where a Unix socket gives EFAULT.
VT_SKIP=${UVSOCK_INTEROP_VT_SKIP:-6.9}
# The other way round (vsock_test_server: the host is the client): 6 as above; 9 checks the guest
# kernel's own errno, ENOMEM in 6.1 and EFAULT in 6.12, against 6.1's test; 10 SOCK_STREAM
# poll() + SO_RCVLOWAT: poll() of a Unix socket does not honour SO_RCVLOWAT.
VT_SKIP_SERVER=${UVSOCK_INTEROP_VT_SKIP_SERVER:-6.9.10}
if [ -z "${UVSOCK_INTEROP_CASES:-}" ] && [ -n "$UVSOCK_RUN" ]; then
	if command -v socat >/dev/null && command -v ncat >/dev/null; then
		MAIN_CASES+=",shim_h2g,shim_g2h,shim_refused"
		# The kernel's own suite: client in the guest, server through uvsock-run here.
		if build_vsock_test "$T"; then
			MAIN_CASES+=",vsock_test:$VT_SKIP,vsock_test_server:$VT_SKIP_SERVER"
		else
			echo "interop: NOTE: no cached tools/testing/vsock (scripts/fetch-kernels.sh): the vsock_test case is left out" >&2
		fi
	else
		echo "interop: NOTE: socat or ncat not installed: the shim cases are left out" >&2
	fi
fi
# UVSOCK_INTEROP_CASES naming vsock_test needs the binaries too.
case ",${UVSOCK_INTEROP_CASES:-}," in *,vsock_test*) build_vsock_test "$T" ;; esac
[ -f "$T/vsock_test.static" ] && VT_STATIC=$T/vsock_test.static VT_HOST=$T/vsock_test
SELF_CASES="ctl,lo_refused,lo_seqpacket,lo_stream"

# ---- the conformance table against the kernel (--kconf; docs/interop.md) ----

# Which kconf steps run: both by default; with UVSOCK_INTEROP_CASES only those it names (kconf:
# over vsock_loopback in the main boot; kconf_sib: client in CID 3, server in CID 4), taken out
# of the guest program's list.
declare -A KCONF_APPEND
KCONF_LO=0 KCONF_SIB=0 KCONF_PORT=9000
if [ -n "$KCONF_BIN" ] && [ $SELFTEST = 0 ]; then
	if [ -z "${UVSOCK_INTEROP_CASES:-}" ]; then
		KCONF_LO=1 KCONF_SIB=1
	else
		case ",$MAIN_CASES," in *,kconf,*) KCONF_LO=1 ;; esac
		case ",$MAIN_CASES," in *,kconf_sib,*) KCONF_SIB=1 ;; esac
		MAIN_CASES=$(echo ",$MAIN_CASES," | sed -e 's/,kconf_sib,/,/g' -e 's/,kconf,/,/g' \
			-e 's/^,//' -e 's/,$//')
		[ -n "$MAIN_CASES" ] || MAIN_CASES=hello
	fi
	[ $KCONF_LO = 1 ] || [ $KCONF_SIB = 1 ] || KCONF_BIN=""
fi

# kconf_prepare K: the kernel command line words that make /init run uvsock-kconf after the
# guest program, per VM name (kept across a boot retry).
kconf_prepare() {
	[ $KCONF_LO = 1 ] && KCONF_APPEND[main-$1]=" uvsock.kconf=loopback"
	[ $KCONF_SIB = 1 ] && KCONF_APPEND[sibsrv-$1]=" uvsock.kconf=server,$KCONF_PORT" &&
		KCONF_APPEND[sibcli-$1]=" uvsock.kconf=client,4,$KCONF_PORT"
	return 0
}

# kconf_results K NAME LABEL: one result per table case from NAME's serial log ("kconf <case>"
# or "kconf_sib <case>"); a case without a line fails.
kconf_results() {
	local k=$1 name=$2 label=$3 c line verdict ms detail
	[ -n "${KCONF_APPEND[$name]:-}" ] || return 0
	while read -r c; do
		line=$(tr -d '\r' <"$T/$name.serial" 2>/dev/null | grep -a -m1 "^UVSOCK-CASE kconf/$c ")
		if [ -z "$line" ]; then
			result "$k" "$label $c" FAIL 0 "[$name] no result: ${VMNOTE[$name]:-guest stopped early}"
			continue
		fi
		IFS=' ' read -r _ _ verdict ms detail <<<"$line"
		result "$k" "$label $c" "$verdict" "$ms" "[$name] $detail"
	done < <("$KCONF_BIN" --list)
}

# kconf_sib_only K: with UVSOCK_INTEROP_CASES naming kconf_sib, the sibling pair boots for it
# alone.
kconf_sib_only() {
	local k=$1
	[ $KCONF_SIB = 1 ] || return 0
	vm_start "sibsrv-$k" 4 hello && vm_start "sibcli-$k" 3 hello
	vm_boot "sibsrv-$k" "sibcli-$k"
	vm_wait "sibsrv-$k"
	vm_wait "sibcli-$k"
	kconf_results "$k" "sibcli-$k" kconf_sib
	[ -n "${VMNOTE[sibsrv-$k]}${VMNOTE[sibcli-$k]}" ] && { vm_log_tail "sibsrv-$k"; vm_log_tail "sibcli-$k"; }
	return 0
}

# inorder_result K VM: case in_order: VIRTIO_F_IN_ORDER (bit 35) was negotiated on both sides
# of VM's vsock device: in the guest's /sys/bus/virtio/devices/*/features (init.sh prints them,
# UVSOCK-VIRTIO; device id 0x0013 is vsock) and in what QEMU acked to uvsockd (SET_FEATURES, in
# uvsockd's debug log). With packed=on, bit 34 (RING_PACKED) too.
inorder_result() {
	local k=$1 vm=$2 g h bits=35 b why=""
	[ "${UVSOCK_INTEROP_PACKED:-0}" = 1 ] && bits="34 35"
	g=$(tr -d '\r' <"$T/$vm.serial" | awk '$1 == "UVSOCK-VIRTIO" && $3 == "device=0x0013" {
		sub(/^features=/, "", $4); print $4; exit }')
	h=$(sed -n 's/.*vhost-user .*: features \(0x[0-9a-f]*\) acked.*/\1/p' "$T/uvsockd.$k.log" |
		tail -n 1)
	[ -n "$g" ] || why="the guest printed no features of a vsock device"
	[ -n "$h" ] || why="${why:+$why; }uvsockd logged no acked features"
	for b in $bits; do
		[ -n "$g" ] && [ "${g:$b:1}" != 1 ] && why="${why:+$why; }guest: bit $b not negotiated"
		[ -n "$h" ] && [ $(( (h >> b) & 1 )) != 1 ] && why="${why:+$why; }uvsockd: bit $b not acked"
	done
	if [ -z "$why" ]; then
		result "$k" in_order PASS 0 "bit(s) $bits negotiated: guest features $g, acked to uvsockd $h"
	else
		result "$k" in_order FAIL 0 "$why (guest ${g:-?}, uvsockd ${h:-?})"
	fi
}

run_kernel() {
	local meta=$1 k
	kernel_cached "$meta" || skip "kernel $meta is not in the cache $(interop_cache_dir): $HOWTO"
	k=$(kinfo "$KDIR" kver | cut -d. -f1,2)
	echo "== kernel $(kinfo "$KDIR" package) $(kinfo "$KDIR" version) ($(kinfo "$KDIR" kver)), boot image $(basename "$(kernel_image "$KDIR")")"
	INITRD="$T/initrd-$k.cpio"
	kconf_prepare "$k"
	KCONF_BIN=$KCONF_BIN build_initramfs "$KDIR" "$GUEST" "$INITRD" "${VT_STATIC:-}" || { result "$k" initramfs FAIL 0 "build failed"; return; }

	if [ $SELFTEST = 1 ]; then
		vm_start "self-$k" -1 "$SELF_CASES" || { result "$k" boot FAIL 0 "${VMNOTE[self-$k]}"; return; }
		vm_boot "self-$k"
		vm_wait "self-$k"
		echo "  guest: $(tr -d '\r' <"$T/self-$k.serial" | grep -a -m1 '^UVSOCK-GUEST')"
		echo "  boot to the guest program: ${BOOTMS[self-$k]:-?} ms; modules: $(tr -d '\r' <"$T/self-$k.serial" | grep -a -m1 '^UVSOCK-MODULES' | cut -d' ' -f2-)"
		if tr -d '\r' <"$T/self-$k.serial" | grep -a -q '^UVSOCK-MODFAIL'; then
			result "$k" modules FAIL 0 "$(tr -d '\r' <"$T/self-$k.serial" | grep -a '^UVSOCK-MODFAIL' | tr '\n' ' ')"
		fi
		vm_results "$k" "self-$k"
		[ -n "${VMNOTE[self-$k]}" ] && vm_log_tail "self-$k"
		return
	fi

	daemon_start "$k" || { result "$k" uvsockd-start FAIL 0 "uvsockd did not start"; return; }

	# Cases 1-7, 10 and 12-17 in one boot of CID 3.
	vm_start "main-$k" 3 "$MAIN_CASES" && vm_boot "main-$k" && vm_wait "main-$k"
	echo "  guest: $(tr -d '\r' <"$T/main-$k.serial" | grep -a -m1 '^UVSOCK-GUEST'); boot ${BOOTMS[main-$k]:-?} ms"
	vm_results "$k" "main-$k"
	kconf_results "$k" "main-$k" kconf
	[ "${UVSOCK_INTEROP_INORDER:-0}" = 1 ] && inorder_result "$k" "main-$k"
	[ -n "${VMNOTE[main-$k]}" ] && vm_log_tail "main-$k"
	if ! daemon_alive; then
		result "$k" uvsockd-alive FAIL 0 "uvsockd died during the main boot: $(tail -n 5 "$T/uvsockd.$k.log" | tr '\n' ' ')"
		DPID=""
		return
	fi

	if [ -n "${UVSOCK_INTEROP_CASES:-}" ]; then
		kconf_sib_only "$k"
		daemon_stop || result "$k" uvsockd-exit FAIL 0 "uvsockd did not exit cleanly on SIGTERM"
		return
	fi

	# Case 8: siblings (CID 3 -> CID 4, same group), two QEMUs at once.
	local t0
	t0=$(now_ms)
	vm_start "sibsrv-$k" 4 "hello,sib_server" && vm_start "sibcli-$k" 3 "hello,sib_client:4"
	# Each is retried alone if its kernel dies before /init; the partner keeps running (the
	# client retries its connect for 120 s, the server waits 240 s for it).
	vm_boot "sibsrv-$k" "sibcli-$k"
	vm_wait "sibsrv-$k"
	vm_wait "sibcli-$k"
	vm_results "$k" "sibsrv-$k" hello
	vm_results "$k" "sibcli-$k" hello
	kconf_results "$k" "sibcli-$k" kconf_sib
	[ -n "${VMNOTE[sibsrv-$k]}${VMNOTE[sibcli-$k]}" ] && { vm_log_tail "sibsrv-$k"; vm_log_tail "sibcli-$k"; }

	# Case 9: kill the QEMU of CID 3 mid-transfer while CID 4 keeps echoing; then CID 4 goes
	# on, and a new QEMU on CID 3's socket must work.
	local hold="$T/hold-$k" why="" line
	rm -f "$hold"
	t0=$(now_ms)
	vm_start "surv-$k" 4 "hello,survive,g2h_echo,h2g_echo,g2h_bulk:8388608" "$hold"
	vm_boot "surv-$k"
	if ! wait_for_line "$T/surv-$k.host.log" '^UVSOCK-HOST HOLDING' 150 "${QPID[surv-$k]:-}" >/dev/null; then
		why="CID 4 never reached the survive case"
	fi
	if [ -z "$why" ]; then
		vm_start "victim-$k" 3 "hello,flood"
		vm_boot "victim-$k"
		if wait_for_line "$T/victim-$k.host.log" '^UVSOCK-HOST FLOWING' 150 "${QPID[victim-$k]:-}" >/dev/null; then
			kill -9 "${QPID[victim-$k]}"
			wait "${QPID[victim-$k]}" 2>/dev/null
			echo "  killed QEMU of CID 3 mid-transfer at +$(($(now_ms) - t0)) ms"
		else
			why="CID 3's transfer never started"
			kill -9 "${QPID[victim-$k]:-}" 2>/dev/null
			wait "${QPID[victim-$k]:-}" 2>/dev/null
		fi
		unset "QPID[victim-$k]"
		local hp=${HPID[victim-$k]:-}
		kill -9 "$hp" 2>/dev/null; wait "$hp" 2>/dev/null; unset "HPID[victim-$k]"
	fi
	daemon_alive || why="${why:+$why; }uvsockd died when QEMU was killed"
	touch "$hold"
	vm_wait "surv-$k"
	vm_results "$k" "surv-$k" hello
	if daemon_alive; then
		# ... and a guest reboot inside that QEMU re-initialises the device (case 10).
		INTEROP_REBOOT=1 vm_start "again-$k" 3 "hello,g2h_echo,h2g_echo,g2h_bulk:8388608,reboot,hello,g2h_echo,h2g_echo" &&
			vm_boot "again-$k" && vm_wait "again-$k"
		vm_results "$k" "again-$k"
		line=$(markers "again-$k" | grep -m4 '^UVSOCK-CASE' | grep -c ' PASS ')
		[ "$line" = 4 ] || why="${why:+$why; }the new QEMU on CID 3's socket did not work"
	else
		why="${why:+$why; }uvsockd not alive after the kill"
	fi
	if markers "surv-$k" | grep -q '^UVSOCK-CASE survive PASS'; then :; else
		why="${why:+$why; }CID 4's connection did not survive"
	fi
	if [ -z "$why" ]; then
		result "$k" qemu_kill PASS $(($(now_ms) - t0)) "CID 4 kept working while CID 3's QEMU was killed; a new QEMU on the same socket worked"
	else
		result "$k" qemu_kill FAIL $(($(now_ms) - t0)) "$why"
		vm_log_tail "surv-$k"
	fi

	if daemon_stop; then :; else
		result "$k" uvsockd-exit FAIL 0 "uvsockd did not exit cleanly on SIGTERM: $(tail -n 5 "$T/uvsockd.$k.log" | tr '\n' ' ')"
	fi
}

echo "interop: QEMU $("$INTEROP_QEMU" --version | head -n 1 | awk '{print $4}') ($INTEROP_QEMU)," \
	"cache $(interop_cache_dir), bulk $BULK B, temp $T"
T0=$(now_ms)
KTIME=()
for meta in $CACHED; do
	t0=$(now_ms)
	run_kernel "$meta"
	KTIME+=("$meta: $(( ($(now_ms) - t0) / 1000 )) s")
done

echo
echo "== interop summary ($(( ($(now_ms) - T0) / 1000 )) s)"
# One TAP line per case and kernel, so CI's counter (scripts/count-tests.py) sees each of them.
n=0
for r in "${RESULTS[@]}"; do
	IFS='|' read -r k c v ms _ <<<"$r"
	n=$((n + 1))
	skipped=""
	[ "$v" = SKIP ] && skipped=" # SKIP"
	if [ "$v" = PASS ] || [ "$v" = SKIP ]; then v="ok"; else v="not ok"; fi
	printf '%s %d - %-5s %-24s %7s ms%s\n' "$v" "$n" "$k" "$c" "$ms" "$skipped"
done
echo "1..$n"
echo "# $((${#RESULTS[@]} - FAILS)) passed, $FAILS failed"
echo "# time per kernel: ${KTIME[*]}"
[ -z "$MISSING" ] || echo "# LEFT OUT (not cached):$MISSING"
echo "# boots retried after dying before /init: ${#RETRIES[@]}"
for r in "${RETRIES[@]}"; do echo "#   $r"; done
[ ${#RESULTS[@]} -gt 0 ] && [ $FAILS = 0 ]
