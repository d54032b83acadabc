#!/bin/sh
# SPDX-License-Identifier: MIT
# The Debian package (suite 'pkg'; prints TAP, exits 0, 1 or 77): builds uvsockd, libuvsock0 and
# libuvsock-dev with `dpkg-buildpackage -us -uc -b` from a copy of the source tree in a scratch
# directory (DEB_BUILD_OPTIONS=nocheck: the tree's own run is this one), checks them with
# lintian (errors fail), checks that libuvsock0 depends on libc alone and uvsockd on libyaml,
# unpacks them with `dpkg -x` into a scratch root and, from there, runs
# the installed uvsockd --version, one VM started and stopped (SIGTERM by PID: exit 0, its
# sockets removed), uvsock-stat against it, and tests/abi/link-prog.c built with the installed
# libuvsock-dev's pkg-config file. Exit 77 (skip, said loudly) without the packaging tools.
#   test-pkg.sh SRCDIR SANITIZE
set -u
src=$1 san=$2
if [ "$san" != none ]; then
	echo "1..0 # SKIP the package is built from the source, not this $san build: the plain" \
		"build's run covers it"
	exit 77
fi
for t in dpkg-buildpackage dpkg-checkbuilddeps dh fakeroot dpkg-deb tar; do
	if ! command -v $t >/dev/null 2>&1; then
		echo "1..0 # SKIP $t missing (scripts/install-deps.sh pkg installs the packaging tools)"
		exit 77
	fi
done
if ! (cd "$src" && dpkg-checkbuilddeps) >/dev/null 2>&1; then
	echo "1..0 # SKIP build dependencies missing: $(cd "$src" && dpkg-checkbuilddeps 2>&1)"
	exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-pkg.XXXXXX") || exit 1
pid=""
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fails=0
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fails=$((fails + 1)); }
show() { sed 's/^/# /' "$@" 2>/dev/null | tail -n 40; }
echo "1..9"

# 1. Build from a copy: tracked and new files of a git checkout, else the whole tree minus builds.
mkdir "$tmp/src"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$src" && git ls-files -z --cached --others --exclude-standard |
		tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$tmp/src" -xf -
else
	tar -C "$src" --exclude='./build*' --exclude=./obj-* --exclude=./debian/.debhelper \
		-cf - . | tar -C "$tmp/src" -xf -
fi
if (cd "$tmp/src" && DEB_BUILD_OPTIONS="nocheck parallel=2" \
		dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1; then
	ok "dpkg-buildpackage -us -uc -b"
else
	notok "dpkg-buildpackage -us -uc -b"; show "$tmp/build.log"; exit 1
fi
ver=$(cd "$tmp/src" && dpkg-parsechangelog -S Version)

# 2. lintian: no error (warnings are printed).
if ! command -v lintian >/dev/null 2>&1; then
	ok "lintian # SKIP lintian missing"
elif lintian --fail-on error "$tmp"/uvsock_*.changes >"$tmp/lintian.log" 2>&1; then
	ok "lintian: no errors"; show "$tmp/lintian.log"
else
	notok "lintian: errors"; show "$tmp/lintian.log"
fi

# 3. The three packages, unpacked into one scratch root.
root=$tmp/root
miss=""
for p in uvsockd libuvsock0 libuvsock-dev; do
	deb=$(ls "$tmp/${p}_${ver}_"*.deb 2>/dev/null | head -n 1)
	if [ -z "$deb" ] || ! dpkg -x "$deb" "$root"; then miss="$miss $p"; fi
done
if [ -z "$miss" ] && [ -x "$root/usr/bin/uvsockd" ]; then
	ok "uvsockd, libuvsock0, libuvsock-dev $ver unpacked with dpkg -x"
else
	notok "packages missing or not unpackable:$miss"; exit 1
fi
# 3b. libuvsock0 depends on libc alone (shlibs: libuvsock.so needs nothing else); libyaml, which
# reads uvsockd's --config file, is uvsockd's dependency.
dep_lib=$(dpkg-deb -f "$(ls "$tmp/libuvsock0_${ver}_"*.deb | head -n 1)" Depends)
dep_d=$(dpkg-deb -f "$(ls "$tmp/uvsockd_${ver}_"*.deb | head -n 1)" Depends)
if [ -n "$dep_lib" ] && ! printf '%s' "$dep_lib" | tr ',' '\n' | grep -v '^ *libc6 ' | grep -q . &&
		printf '%s' "$dep_d" | grep -q 'libyaml'; then
	ok "libuvsock0 depends on '$dep_lib' only; uvsockd on libyaml"
else
	notok "dependencies: libuvsock0 '$dep_lib', uvsockd '$dep_d'"
fi
libdir=$(dirname "$(find "$root/usr/lib" -name 'libuvsock.so.0' | head -n 1)")
export LD_LIBRARY_PATH="$libdir"

# 4. uvsockd --version names the package's version.
if "$root/usr/bin/uvsockd" --version >"$tmp/out" 2>&1 && grep -q "^uvsockd $ver\$" "$tmp/out"; then
	ok "installed uvsockd --version: $(cat "$tmp/out")"
else
	notok "installed uvsockd --version (want 'uvsockd $ver')"; show "$tmp/out"
fi

# 5. One VM: its sockets appear, uvsock-stat reads its counters, SIGTERM ends it with 0 and the
# socket files it created are gone.
run=$tmp/run
mkdir "$run"
"$root/usr/bin/uvsockd" --guest-cid 3 --socket "$run/vm.sock" --uds-path "$run/vm.vsock" \
	>"$tmp/daemon.log" 2>&1 &
pid=$!
i=0
while [ $i -lt 100 ] && ! { [ -S "$run/vm.sock" ] && [ -S "$run/vm.vsock" ] &&
		[ -S "$run/vm.sock.ctl" ]; }; do
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.1; i=$((i + 1))
done
if [ -S "$run/vm.sock" ] && [ -S "$run/vm.vsock" ] && [ -S "$run/vm.sock.ctl" ]; then
	ok "installed uvsockd serves one VM"
else
	notok "installed uvsockd did not create its sockets within 10 s"; show "$tmp/daemon.log"
fi
if timeout 10 "$root/usr/bin/uvsock-stat" -s "$run/vm.sock.ctl" --counters >"$tmp/stat" 2>&1 &&
		grep -q '^VM 3 ' "$tmp/stat"; then
	ok "installed uvsock-stat reads the VM's counters"
else
	notok "installed uvsock-stat against the VM"; show "$tmp/stat"
fi
kill -TERM "$pid" 2>/dev/null
i=0
while [ $i -lt 100 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$pid" 2>/dev/null; then
	notok "uvsockd still running 10 s after SIGTERM"; show "$tmp/daemon.log"
else
	wait "$pid"; rc=$?; pid=""
	left=$(ls -A "$run")
	if [ "$rc" = 0 ] && [ -z "$left" ]; then
		ok "SIGTERM: uvsockd exited 0 and removed its sockets"
	else
		notok "SIGTERM: exit $rc, left: $left"; show "$tmp/daemon.log"
	fi
fi

# 6. libuvsock-dev: the out-of-tree program built with only its pkg-config file, run against
# libuvsock0's library.
pc=$(find "$root" -name uvsock.pc | head -n 1)
if [ -n "$pc" ] && PKG_CONFIG_PATH="${pc%/uvsock.pc}:$(pkg-config --variable pc_path pkg-config)" \
	PKG_CONFIG_SYSROOT_DIR="$root" \
	PKG_CONFIG_LIBDIR="" sh -c 'cc -o "$1" "$2" $(pkg-config --cflags --libs uvsock)' sh \
		"$tmp/prog" "$src/tests/abi/link-prog.c" >"$tmp/cc.log" 2>&1 &&
	timeout 60 "$tmp/prog" >>"$tmp/cc.log" 2>&1; then
	ok "a program built against libuvsock-dev runs on libuvsock0"
else
	notok "a program built against libuvsock-dev"; show "$tmp/cc.log"
fi
[ "$fails" = 0 ]
