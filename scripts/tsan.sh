#!/bin/sh
# SPDX-License-Identifier: MIT
#
# ThreadSanitizer over the threaded tests (`make tsan`; not part of `make check`, for CI time).
# Builds $TSAN_BUILD (default build-tsan) with -Db_sanitize=thread -Dinterop=false if it is not
# set up yet (CC picks the compiler; gcc 12 and clang 14 both work), then runs the suites that
# use threads: the socket API, the guest role (and its hostile-device test), the device role
# and its embedding API, the event loop, the conformance table over the loopback (inline and
# with the pump thread) and over uvsockd, and the uvsockd integration tests (e2e, the sibling
# flood; the guest role's datagrams, driver-dgram and dgram-guest). Every process writes its
# reports to one directory (TSAN_OPTIONS log_path), so those of the uvsockd child processes,
# whose stderr goes to a log file, are seen too; any report fails the run, and the reports are
# printed at the end.
#
# TSan needs its fixed memory layout: on a kernel whose mmap randomisation does not leave room
# for it ("FATAL: ThreadSanitizer: unexpected memory mapping"), the tests run under
# `setarch -R` (no address-space randomisation for them and their children).
#
# Usage: scripts/tsan.sh [meson test names...]   (default: the list below)
set -u

BUILD=${TSAN_BUILD:-build-tsan}
TESTS=${*:-"lib-lib lib-dgram vsock-dgram driver-driver driver-hostile driver-direct driver-txdirect util-loop
	device-core device-host-uds device-host-dgram device-sibling device-counters device-vhu embed-device-api conformance-loopback conformance-loopback-pump-thread
	conformance-uvsockd e2e sibling-flood driver-dgram dgram-guest"}

if [ ! -f "$BUILD/build.ninja" ]; then
	meson setup "$BUILD" -Db_sanitize=thread -Dinterop=false || exit 1
fi
meson compile -C "$BUILD" || exit 1

logdir=$(mktemp -d /tmp/uvsock-tsan-XXXXXX) || exit 1
# halt_on_error=0: every race of a run is reported, not only the first; exitcode stays 66.
opts="log_path=$logdir/tsan halt_on_error=0 second_deadlock_stack=1"

# A TSan binary that cannot map its shadow memory dies at once: then retry without ASLR.
probe="$BUILD/tests/unit/lib/test-lib"
prefix=""
if ! TSAN_OPTIONS="$opts" "$probe" --list >/dev/null 2>&1; then
	rm -f "$logdir"/tsan.*
	if setarch "$(uname -m)" -R env TSAN_OPTIONS="$opts" "$probe" --list >/dev/null 2>&1; then
		echo "tsan: running without address-space randomisation (setarch -R)" >&2
		prefix="setarch $(uname -m) -R"
	else
		echo "tsan: a TSan binary cannot start here, even under setarch -R:" >&2
		cat "$logdir"/tsan.* >&2 2>/dev/null
		exit 1
	fi
fi
rm -f "$logdir"/tsan.*

start=$(date +%s)
# shellcheck disable=SC2086 # TESTS and prefix are word lists
TSAN_OPTIONS="$opts" $prefix meson test -C "$BUILD" --print-errorlogs --timeout-multiplier 10 \
	$TESTS
rc=$?
end=$(date +%s)

reports=$(ls "$logdir"/tsan.* 2>/dev/null | wc -l)
if [ "$reports" -gt 0 ]; then
	echo "tsan: $reports process(es) reported (from $logdir):" >&2
	for f in "$logdir"/tsan.*; do
		echo "==== $f" >&2
		cat "$f" >&2
	done
	rc=1
else
	rmdir "$logdir" 2>/dev/null
fi
echo "tsan: $(($end - $start)) s, $( [ $rc -eq 0 ] && echo "no report, every test passed" ||
	echo "FAILED")" >&2
exit $rc
