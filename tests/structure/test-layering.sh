#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The include layering of src/, daemon/ and tools/ (scripts/check-layering.py, the table in
# docs/architecture.md): the tree holds it, and the checker does fail on a reintroduced upward
# include, on an include across sibling layers, on the library reaching into the control
# protocol or a program, on a public header reaching into src/, and on an include cycle.
# TAP output; every scratch file lives in one temporary directory removed at exit.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
check="$root/scripts/check-layering.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 failed=0

ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); failed=1; echo "not ok $n - $1"; }

# A scratch copy of src/, include/, daemon/, tools/ and examples/ with one line added to one file, then the checker on it:
# it must exit 1 and name the violation: a line of its output holds both the file and $4.
expect_violation() { # name file line expected-text
	rm -rf "$tmp/tree" && mkdir "$tmp/tree" && cp -r "$root/src" "$root/include" "$root/daemon" \
		"$root/tools" "$root/examples" "$tmp/tree/"
	printf '%s\n' "$3" >>"$tmp/tree/$2"
	if python3 "$check" --root "$tmp/tree" >"$tmp/out" 2>&1; then
		notok "$1: the checker passed a tree with '$3' in $2"
	elif grep -F -- "$4" "$tmp/out" | grep -qF -- "$2"; then
		ok "$1"
	else
		notok "$1: no '$4' in: $(head -c 300 "$tmp/out")"
	fi
}

if python3 "$check" --root "$root" >"$tmp/out" 2>&1; then
	ok "the tree holds its layering"
else
	notok "the tree breaks its layering"
	sed 's/^/# /' "$tmp/out"
fi

expect_violation "an upward include (ops -> device) is refused" src/ops/stats.c \
	'#include "device/vsock_dev.h"' "ops may not include device"
# What the device reports (src/ops) stays apart from the control protocol, which is not part of
# libuvsock.so; no part of src/ includes a program's folder.
expect_violation "the library may not include the control protocol (ops -> ctlproto)" \
	src/ops/stats.c '#include "ctlproto/json.h"' "ops may not include ctlproto"
expect_violation "the library may not include the daemon (lib -> daemon)" src/lib/ctx.c \
	'#include "daemon/ctl.h"' "lib may not include daemon"
expect_violation "the library may not include the daemon by a relative path" src/device/evq.c \
	'#include "../../daemon/config.h"' "device may not include daemon"
expect_violation "the shim may not include a tool (shim -> tools)" src/shim/vms.c \
	'#include "../../tools/statcli.h"' "shim may not include tools"
expect_violation "the control protocol may not include the daemon (ctlproto -> daemon)" \
	src/ctlproto/find.c '#include "daemon/ctl.h"' "ctlproto may not include daemon"
expect_violation "a tool may not include the daemon (tools -> daemon)" tools/statcli.c \
	'#include "daemon/ctl.h"' "tools may not include daemon"
expect_violation "an upward include (vsock -> lib) is refused" src/vsock/hdr.c \
	'#include "lib/lib.h"' "vsock may not include lib"
expect_violation "a sibling include (driver -> device) is refused" src/driver/rxsize.c \
	'#include "device/vsock_dev.h"' "driver may not include device"
expect_violation "a public header may not include src/" include/uvsock/uvsock.h \
	'#include "vsock/engine.h"' "uvsock may not include vsock"

# An include cycle inside one layer: hdr.h includes engine.h, which includes hdr.h.
expect_violation "an include cycle is refused" src/vsock/hdr.h \
	'#include "vsock/engine.h"' "include cycle"

echo "1..$n"
exit $failed
