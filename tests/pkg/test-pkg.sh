#!/bin/sh
# SPDX-License-Identifier: MIT
# The Debian package (suite 'pkg'; prints TAP, exits 0, 1 or 77): builds uvsockd, libuvsock0 and
# libuvsock-dev with `dpkg-buildpackage -us -uc -b` from a copy of the source tree in a scratch
# directory (DEB_BUILD_OPTIONS=nocheck: the tree's own run is this one), checks them with
# lintian (errors fail), checks that the build leaves nothing git sees in the tree (.gitignore),
# checks that libuvsock0 depends on libc alone and uvsockd on libyaml,
# unpacks them with `dpkg -x` into a scratch root and, from there, runs
# the installed uvsockd --version, one VM started and stopped (SIGTERM by PID: exit 0, its
# sockets removed), uvsock-stat against it, and tests/abi/link-prog.c built with the installed
# libuvsock-dev's pkg-config file; then the units under a real systemd in a QEMU guest
# (systemd-guest.sh: skipped, said loudly, without its cached parts). Exit 77 (skip, said loudly)
# without the packaging tools.
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

# 1. Build from a copy: tracked and new files of a git checkout, else the whole tree minus builds.
mkdir "$tmp/src"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$src" && git ls-files -z --cached --others --exclude-standard |
		tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$tmp/src" -xf -
else
	tar -C "$src" --exclude='./build*' --exclude=./obj-* --exclude=./debian/.debhelper \
		-cf - . | tar -C "$tmp/src" -xf -
fi
# The copy as a git repository of its own, to see what the build leaves behind (1b).
gitc() { git -C "$tmp/src" -c user.name=uvsock-test -c user.email=test@invalid "$@"; }
tracked=no
if command -v git >/dev/null 2>&1 && gitc init -q && gitc add -A &&
		gitc commit -q --no-gpg-sign -m copy; then
	tracked=yes
fi
if (cd "$tmp/src" && DEB_BUILD_OPTIONS="nocheck parallel=2" \
		dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1; then
	ok "dpkg-buildpackage -us -uc -b"
else
	notok "dpkg-buildpackage -us -uc -b"; show "$tmp/build.log"; exit 1
fi
# 1b. The build leaves the tree as git sees it: every file it makes is in .gitignore, none it
# changes is tracked (README "Installing" builds in the source tree).
if [ $tracked = no ]; then
	ok "the tree after the build # SKIP git missing or the copy could not be committed"
elif gitc status --porcelain --untracked-files=all >"$tmp/left" 2>&1 && [ ! -s "$tmp/left" ]; then
	ok "dpkg-buildpackage leaves the tree clean (.gitignore covers what it makes)"
else
	notok "dpkg-buildpackage leaves files git sees"; show "$tmp/left"
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

# 4. uvsockd --version names the package's version and an optimized build.
if "$root/usr/bin/uvsockd" --version >"$tmp/out" 2>&1 &&
	grep -q "^uvsockd $ver (build: optimized)\$" "$tmp/out"; then
	ok "installed uvsockd --version: $(cat "$tmp/out")"
else
	notok "installed uvsockd --version (want 'uvsockd $ver (build: optimized)')"; show "$tmp/out"
fi

# 4b. The example config is installed (a conffile) and the installed uvsockd accepts it.
if [ -f "$root/etc/uvsockd/example.yaml" ] &&
	"$root/usr/bin/uvsockd" --check-config --config "$root/etc/uvsockd/example.yaml" \
		>"$tmp/out" 2>&1; then
	ok "/etc/uvsockd/example.yaml installed: $(cat "$tmp/out")"
else
	notok "/etc/uvsockd/example.yaml missing or refused"; show "$tmp/out"
fi
# 4c. An upgrade neither stops nor restarts a running uvsockd (its VMs would lose their vsock).
deb=$(ls "$tmp/uvsockd_${ver}_"*.deb | head -n 1)
dpkg-deb -e "$deb" "$tmp/ctl" 2>/dev/null
if grep -q 'etc/uvsockd/example.yaml' "$tmp/ctl/conffiles" 2>/dev/null &&
	! grep -sqE 'deb-systemd-invoke.*(restart|stop)|_dh_action=(restart|try-restart)' \
		"$tmp/ctl/prerm" "$tmp/ctl/postinst" "$tmp/ctl/postrm"; then
	ok "maintainer scripts: example.yaml a conffile; no stop or restart on upgrade"
else
	notok "maintainer scripts stop or restart uvsockd, or example.yaml is no conffile"
	show "$tmp/ctl/conffiles" "$tmp/ctl/prerm" "$tmp/ctl/postinst"
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

# 7. The units as shipped under a real systemd: a QEMU guest with systemd as PID 1 and these
# packages (systemd-guest.sh; its own lines, or one skipped line without the cached guest parts).
"$src/tests/pkg/systemd-guest.sh" "$tmp" $((n + 1)) >"$tmp/sysguest.tap" 2>&1
rc=$?
cat "$tmp/sysguest.tap"
n=$((n + $(grep -cE '^(not )?ok ' "$tmp/sysguest.tap")))
[ $rc = 0 ] || [ $rc = 77 ] || fails=$((fails + 1))
echo "1..$n"
[ "$fails" = 0 ]
