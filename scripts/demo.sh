#!/usr/bin/env bash
# Runs the uvsock demo from a build directory: scripts/demo.sh BUILD_DIR (default: build).
# First version: client and server over the in-process loopback transport (CID 1).
set -euo pipefail
build=${1:-build}
demo="$build/tools/uvsock-demo"
if [ ! -x "$demo" ]; then
	echo "demo.sh: $demo not found; build first (meson compile -C $build)" >&2
	exit 1
fi
echo "== uvsock demo: AF_VSOCK-style client and server over the loopback transport =="
"$demo" --bytes 64
