#!/bin/sh
# SPDX-License-Identifier: MIT
# ABI check (TAP): the dynamic symbols libuvsock.so defines (`nm -D --defined-only`, with their
# version) must be exactly tests/abi/symbols.txt, and the static libuvsock.a must define the
# same global names. An export missing from the list, or a listed one gone, fails with the
# difference. libuvsock.so must also need nothing but libc (and the dynamic loader), and hold
# none of the programs' code: uvsockd's config file and control-socket server, the control
# protocol's client and JSON (src/ctlproto), the tools' main functions. After a deliberate API change, regenerate the list:
#   nm -D --defined-only build/libuvsock.so | awk '{print $NF}' | LC_ALL=C sort \
#     > tests/abi/symbols.txt
#   check-symbols.sh LIBUVSOCK.so LIBUVSOCK.a SYMBOLS.txt
set -u
so=$1 ar=$2 list=$3
echo "1..4"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-abi.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fails=0
nm -D --defined-only "$so" | awk '{print $NF}' | LC_ALL=C sort >"$tmp/so" || exit 1
if diff -u "$list" "$tmp/so" >"$tmp/diff"; then
	echo "ok 1 - libuvsock.so exports exactly symbols.txt ($(wc -l <"$tmp/so") symbols)"
else
	echo "not ok 1 - libuvsock.so exports differ from symbols.txt (+ unlisted export, - missing)"
	sed 's/^/# /' "$tmp/diff"; fails=$((fails + 1))
fi
# The archive: every global defined name (no versions there) against the list's functions.
nm -g --defined-only "$ar" | awk 'NF == 3 {print $3}' | LC_ALL=C sort >"$tmp/a"
grep -v '^UVSOCK_' "$list" | sed 's/@.*//' | LC_ALL=C sort >"$tmp/fns"
if diff -u "$tmp/fns" "$tmp/a" >"$tmp/diff"; then
	echo "ok 2 - libuvsock.a defines exactly the listed functions"
else
	echo "not ok 2 - libuvsock.a globals differ from symbols.txt (+ unlisted, - missing)"
	sed 's/^/# /' "$tmp/diff"; fails=$((fails + 1))
fi
# NEEDED: libc.so.6 and ld-linux*.so.* only (and, in a sanitizer build, its runtimes).
readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' >"$tmp/needed"
if [ -s "$tmp/needed" ] &&
		! grep -Ev '^(libc\.so\.6|ld-linux.*\.so\.[0-9]+|lib(a|ub|t|l)san\.so\.[0-9]+)$' \
		"$tmp/needed" >"$tmp/extra"; then
	echo "ok 3 - libuvsock.so needs only $(tr '\n' ' ' <"$tmp/needed")"
else
	echo "not ok 3 - libuvsock.so needs more than libc: $(tr '\n' ' ' <"$tmp/extra")"
	fails=$((fails + 1))
fi
# Local symbols too (nm without -D): the programs' code would be there, hidden but linked in.
nm "$so" | awk '{print $NF}' |
	grep -E '^(ops_ctl_|ops_config_|config_file_|ops_json_|ops_jw_|uvsock_stat_main|uvsock_ctl_main|yaml_)' \
	>"$tmp/prog" || true
if [ ! -s "$tmp/prog" ]; then
	echo "ok 4 - libuvsock.so holds no daemon, control-protocol or tool code"
else
	echo "not ok 4 - libuvsock.so holds the programs' code: $(head -n 5 "$tmp/prog" | tr '\n' ' ')"
	fails=$((fails + 1))
fi
[ "$fails" = 0 ]
