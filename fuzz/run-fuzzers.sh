#!/bin/bash
# SPDX-License-Identifier: MIT
# Runs libFuzzer targets of a -Dfuzzing=true build (`make fuzz` calls this), as many at once as
# the machine has CPUs (FUZZ_JOBS overrides; each target is one process), each for SECONDS on its committed corpus fuzz/corpus/<target> (read only: new inputs go to
# BUILD/fuzz-work/<target>), and prints for each its executions per second, its final coverage
# (libFuzzer's "cov:" and "ft:") and its crashes. Fails if any target crashed, leaked, timed out
# or ran out of memory (an artifact in BUILD/fuzz-work/artifacts/<target>/), or did not run; a
# slow input (slow-unit-*: over 10 s of wall time, which a loaded machine gives any input) is
# counted and kept, not a failure.
# BUILD/fuzz-work/results.json gets one line per target in meson's testlog.json form (name
# "libfuzzer-<target>", result OK or FAIL) for scripts/count-tests.py (.ci/run).
#
# Usage: fuzz/run-fuzzers.sh BUILD SECONDS [TARGET...]   (default: every fuzz/fuzz-<t>.c)
set -u
[ $# -ge 2 ] || { echo "usage: $0 BUILD SECONDS [TARGET...]" >&2; exit 2; }
build=$1
secs=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
if [ $# -eq 0 ]; then
	set -- $(cd "$src" && ls fuzz-*.c | sed -n 's/^fuzz-\(.*\)\.c$/\1/p' | grep -vx main)
fi
work=$build/fuzz-work
rc=0
summary=""
mkdir -p "$work"
results=$work/results.json
: >"$results"
# One target: its summary line in $work/$t.line, its results.json line in $work/$t.result, and
# exit status 1 when it failed.
run_one() {
	local t=$1 bin art log status final eps crashes slow line result
	bin=$build/fuzz/fuzz-$t-libfuzzer
	art=$work/artifacts/$t
	log=$work/$t.log
	if [ ! -x "$bin" ]; then
		echo "fuzz: $bin is missing (configure with CC=clang -Dfuzzing=true)" >&2
		printf '{"name": "libfuzzer-%s", "result": "FAIL", "stdout": "missing"}\n' "$t" \
			>"$work/$t.result"
		printf '%-10s missing\n' "$t" >"$work/$t.line"
		return 1
	fi
	rm -rf "$art"
	mkdir -p "$work/$t" "$art"
	echo "fuzz: $t for ${secs}s (log: $log)"
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
		"$bin" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$art/" \
		"$work/$t" "$src/corpus/$t" >"$log" 2>&1
	status=$?
	final=$(grep -E 'cov: [0-9]+' "$log" | tail -n 1 | sed -n 's/.*\(cov: [0-9]*\) \(ft: [0-9]*\).*/\1 \2/p')
	eps=$(sed -n 's/^stat::average_exec_per_sec:[[:space:]]*//p' "$log")
	# slow-unit-*: an input that took over 10 s of wall time, which a loaded machine gives any
	# input; reported, not a failure (a hang is a timeout-* artifact, after -timeout).
	crashes=$(find "$art" -type f ! -name 'slow-unit-*' | wc -l)
	slow=$(find "$art" -type f -name 'slow-unit-*' | wc -l)
	line=$(printf '%-10s %6s exec/s  %-24s crashes: %s  slow units: %s' "$t" "${eps:-?}" \
		"${final:-no coverage line}" "$crashes" "$slow")
	echo "fuzz: $line"
	printf '%s\n' "$line" >"$work/$t.line"
	result=OK
	[ "$crashes" -ne 0 ] || [ "$status" -ne 0 ] && result=FAIL
	printf '{"name": "libfuzzer-%s", "result": "%s", "stdout": "%s"}\n' "$t" "$result" \
		"$(printf '%s' "$line" | tr -s ' ' | tr -d '"\\')" >"$work/$t.result"
	if [ "$result" = FAIL ]; then
		echo "fuzz: $t FAILED (exit $status); artifacts:" >&2
		find "$art" -type f >&2
		grep -E -A30 '^==[0-9]+==ERROR|runtime error|invariant failed' "$log" | head -n 60 >&2
		return 1
	fi
	return 0
}

jobs_max=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
running=0
for t in "$@"; do
	rm -f "$work/$t.result" "$work/$t.line"
	if [ "$running" -ge "$jobs_max" ]; then
		wait -n || rc=1
		running=$((running - 1))
	fi
	run_one "$t" &
	running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
	wait -n || rc=1
	running=$((running - 1))
done
# Results and summary in the targets' order, whatever order they ended in.
for t in "$@"; do
	cat "$work/$t.result" >>"$results" 2>/dev/null ||
		{ printf '{"name": "libfuzzer-%s", "result": "FAIL", "stdout": "no result"}\n' "$t" \
			>>"$results"; rc=1; }
	summary="$summary$(cat "$work/$t.line" 2>/dev/null)
"
done
printf '\nfuzz summary (%ss each):\n%s' "$secs" "$summary"
echo "New inputs are in $work/<target>; keep what adds coverage with"
echo "  $build/fuzz/fuzz-<target>-libfuzzer -merge=1 fuzz/corpus/<target> $work/<target>"
echo "(then rename the added files to their SHA-256)."
exit $rc
