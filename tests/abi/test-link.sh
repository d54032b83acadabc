#!/bin/sh
# SPDX-License-Identifier: MIT
# Out-of-tree link test (TAP): installs the build into a scratch DESTDIR, builds link-prog.c there
# with only `pkg-config --cflags --libs uvsock` (PKG_CONFIG_SYSROOT_DIR maps the .pc file's
# paths into the scratch root), once against libuvsock.so.0 and once against the static
# libuvsock.a (`pkg-config --static`), and runs both.
#   test-link.sh BUILDDIR SRCDIR CC SANITIZE
set -u
build=$1 src=$2 cc=$3 san=$4
# TAP: a skip is the empty plan with SKIP (meson counts it as skipped), exit 0.
command -v pkg-config >/dev/null || { echo "1..0 # SKIP pkg-config missing"; exit 0; }
echo "1..3"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-link.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
root=$tmp/root
flags=""
[ "$san" != none ] && flags="-fsanitize=$san"
fails=0

if meson install -C "$build" --destdir "$root" --no-rebuild --quiet >"$tmp/install.log" 2>&1; then
	echo "ok 1 - meson install --destdir"
else
	echo "not ok 1 - meson install --destdir"; sed 's/^/# /' "$tmp/install.log"; exit 1
fi
pc=$(find "$root" -name uvsock.pc | head -n 1)
[ -n "$pc" ] || { echo "# no uvsock.pc installed"; exit 1; }
# The system's .pc directories stay on the path, should uvsock.pc ever name a Requires.private
# (it has none: libuvsock needs only libc, tests/abi/check-symbols.sh).
sys_pc=$(pkg-config --variable pc_path pkg-config)
export PKG_CONFIG_PATH="${pc%/uvsock.pc}:$sys_pc" PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR=""
# pkg-config prefixes the sysroot to --variable as to -I/-L.
libdir=$(pkg-config --variable=libdir uvsock)
# meson test points LD_LIBRARY_PATH at the build tree: only the scratch root may serve the library.
unset LD_LIBRARY_PATH
echo "# $(pkg-config --cflags --libs uvsock)"

# Shared: the program must need libuvsock.so.0 and get it from the scratch root.
if $cc $flags -o "$tmp/prog" "$src/link-prog.c" $(pkg-config --cflags --libs uvsock) \
		>"$tmp/cc.log" 2>&1 &&
	readelf -d "$tmp/prog" >"$tmp/run.log" && grep -q 'NEEDED.*\[libuvsock\.so\.0\]' "$tmp/run.log" &&
	LD_LIBRARY_PATH="$libdir" ldd "$tmp/prog" >"$tmp/run.log" &&
	grep -q "=> $libdir/libuvsock.so.0" "$tmp/run.log" &&
	LD_LIBRARY_PATH="$libdir" timeout 60 "$tmp/prog" >"$tmp/run.log" 2>&1; then
	echo "ok 2 - linked against the installed libuvsock.so.0 and ran"
else
	echo "not ok 2 - linked against the installed libuvsock.so.0 and ran"
	cat "$tmp/cc.log" "$tmp/run.log" 2>/dev/null | sed 's/^/# /'; fails=$((fails + 1))
fi

# Static: the archive first, then what `pkg-config --static` adds (with --as-needed, its -luvsock
# resolves nothing and is dropped); the program must not need the shared library.
if $cc $flags -o "$tmp/prog-static" "$src/link-prog.c" $(pkg-config --cflags uvsock) \
		"$libdir/libuvsock.a" -Wl,--as-needed $(pkg-config --static --libs uvsock) \
		>"$tmp/cc.log" 2>&1 &&
	readelf -d "$tmp/prog-static" >"$tmp/run.log" && ! grep -q 'NEEDED.*libuvsock' "$tmp/run.log" &&
	timeout 60 "$tmp/prog-static" >"$tmp/run.log" 2>&1; then
	echo "ok 3 - linked against the installed libuvsock.a and ran"
else
	echo "not ok 3 - linked against the installed libuvsock.a and ran"
	cat "$tmp/cc.log" "$tmp/run.log" 2>/dev/null | sed 's/^/# /'; fails=$((fails + 1))
fi
[ "$fails" = 0 ]
