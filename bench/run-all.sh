#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs the full uvsock-perf benchmark of bench/README.md with this build's uvsockd and writes,
# into OUT (default bench/): results.txt (the terminal tables), results.csv, results.json,
# results.md (the Markdown tables, bench/md-tables.py) and throughput.png (gnuplot-nox:
# scripts/install-deps.sh bench). With COMPARE="sw1,sw2" it also runs the before/after of each
# switch (compare.txt, compare.json, compare.md): vsock both ways and Unix (the noise reference)
# at 64 B, 4 KiB and 64 KiB plus the 64 B round trip, alternating off and on. The datagram run
# writes dgram.txt, dgram.csv and dgram.json.
# Usage: bench/run-all.sh [BUILD_DIR] [OUT_DIR]    extra uvsock-perf options in PERF_ARGS
set -eu
build=${1:-build}
out=${2:-bench}
perf="$build/tools/uvsock-perf"
[ -x "$perf" ] || { echo "run-all: $perf not built (meson compile -C $build)" >&2; exit 1; }
here=$(dirname "$0")
mkdir -p "$out"
start=$(date +%s)
echo "run-all: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs," \
	"load $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/results.txt"
# uvsock-perf's stdout goes to a file first (a pipe to tee would hide its exit status from sh).
# shellcheck disable=SC2086 # PERF_ARGS is a list of options
"$perf" --in-process --runs "${RUNS:-5}" --uvsockd "$build/daemon/uvsockd" \
	--csv "$out/results.csv" --json "$out/results.json" --plot "$out/throughput.png" \
	${PERF_ARGS:-} > "$out/results.tmp" || { cat "$out/results.tmp"; exit 1; }
cat "$out/results.tmp" >> "$out/results.txt"
rm -f "$out/results.tmp"
cat "$out/results.txt"
python3 "$here/md-tables.py" "$out/results.json" > "$out/results.md"
# Datagrams (bench/README.md "Datagrams"): 1, 2, 4, 16 senders x 4 KiB on one socket, every
# datagram transport and the UVSOCK_DGRAM_LOCKED=1 row.
# shellcheck disable=SC2086
"$perf" --dgram --dgram-locked --runs "${RUNS:-5}" --uvsockd "$build/daemon/uvsockd" \
	--csv "$out/dgram.csv" --json "$out/dgram.json" ${PERF_ARGS:-} > "$out/dgram.txt" ||
	{ cat "$out/dgram.txt"; exit 1; }
cat "$out/dgram.txt"
if [ -n "${COMPARE:-}" ]; then
	# shellcheck disable=SC2086
	"$perf" --tests stream,rtt --sizes 64,4K,64K --rtt-sizes 64 --runs "${RUNS:-5}" \
		--transports vsock-g2h,vsock-h2g,unix --uvsockd "$build/daemon/uvsockd" \
		--compare "$COMPARE" --json "$out/compare.json" ${PERF_ARGS:-} > "$out/compare.txt" ||
		{ cat "$out/compare.txt"; exit 1; }
	cat "$out/compare.txt"
	python3 "$here/md-tables.py" "$out/compare.json" > "$out/compare.md"
fi
echo "run-all: done in $(( $(date +%s) - start )) s" | tee -a "$out/results.txt"
