# SPDX-License-Identifier: MIT
# What the real-guest scripts of this folder share (ssh-vsock-mux.sh, unshared-memory.sh;
# sourced after tests/interop/lib.sh): the TAP counters and lines, the skip exit (77), and the
# cleanup of the scratch directory $T and of the uvsockd ($upid) and QEMU ($qpid) a script
# started, by PID. A script calls vm_traps once $T exists.
skip() { echo "1..0 # SKIP $*"; exit 77; }
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fails=$((fails + 1)); }
show() { sed 's/^/# /' "$@" 2>/dev/null | tail -n 30; }

upid="" qpid=""
vm_cleanup() {
	[ -n "$qpid" ] && kill -KILL "$qpid" 2>/dev/null
	[ -n "$upid" ] && kill -KILL "$upid" 2>/dev/null
	rm -rf "$T"
}
vm_traps() {
	trap vm_cleanup EXIT
	trap 'exit 1' INT TERM
}
