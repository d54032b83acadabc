#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the QEMUs of the reconnect and migration interop tests into the interop cache: Debian
# 12's qemu 7.2 and QEMU 10.0.2, each with the patches of contrib/qemu/ (vhost-user-vsock
# reconnect and migration; contrib/qemu/README.md), with a minimal feature set.
#   scripts/build-qemu.sh [7.2] [10.0.2]      (default: both)
# Sources come with `apt-get source --download-only` through a private apt configuration with
# deb-src lines under the cache (apt/bookworm-src/, apt/bookworm-backports-src/; the system's
# sources are never read or changed): Debian 12's qemu source package (unpacked with dpkg-source -x, Debian's own patches
# applied) and the orig tarball of bookworm-backports' qemu 10.0.2 (its .debian.tar.xz is
# missing from the archive; the tarball is checked against the Sources index's SHA-256). 10.0.2
# needs meson >= 1.5 and python3-pycotap: bookworm-backports' packages are downloaded and
# unpacked under the cache (apt-get download, dpkg-deb -x), never installed.
# Each build lands in qemu-patched/<version>-<key>/ (key: SHA-256 of the patches, the configure
# line and this script's BUILD_LAYOUT), with the binary, a wrapper qemu-system-x86_64 that gives
# it its firmware directories (-L) and an info file; a cached build is reused as is. The tests
# only look in the cache (tests/interop/qemu-patched.sh) and skip, loudly, without it.
# Exit: 0 every requested QEMU is cached (prints their wrappers), 2 one could not be fetched (no
# archive) or the toolchain is missing (named on stderr), 1 an error (a patch does not apply, the
# build fails, the binary does not start).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/interop/lib.sh
source "$REPO/tests/interop/lib.sh"
# shellcheck source=../tests/interop/qemu-patched.sh
source "$REPO/tests/interop/qemu-patched.sh"

CACHE=$(interop_cache_dir)
JOBS=${UVSOCK_QEMU_JOBS:-$(nproc)}

# src_suite VER: the suite whose sources hold qemu VER (Debian 12's 7.2, or bookworm-backports).
src_suite() { if [ "$1" = 7.2 ]; then echo bookworm; else echo bookworm-backports; fi; }

# src_apt VER: APT_OPTS for src_suite VER's deb-src configuration (lib.sh private_apt_opts);
# `apt-get update` of it at most once a day.
src_apt() {
	local suite d
	suite=$(src_suite "$1")
	d=$CACHE/apt/$suite-src
	private_apt_opts "$suite" deb-src || { ilog "cannot create $d"; return 1; }
	if [ ! -f "$d/.updated" ] || [ -n "$(find "$d/.updated" -mmin +1440)" ]; then
		ilog "qemu $1: apt-get update of the private deb-src configuration for $suite"
		if timeout 900 apt-get "${APT_OPTS[@]}" update -q >"$d/update.log" 2>&1; then
			touch "$d/.updated"
		else
			tail -n 5 "$d/update.log" | sed 's/^/  /' >&2
			ilog "qemu $1: apt-get update for $suite failed"
		fi
	fi
}

# src_version PREFIX: the newest source version of qemu whose upstream part starts with PREFIX.
src_version() {
	timeout 300 apt-cache "${APT_OPTS[@]}" showsrc qemu 2>/dev/null |
		awk -v p="1:$1" '/^Version:/ && index($2, p) == 1 { print $2 }' | sort -V | tail -n 1
}

# toolchain_ok VER: whether the build tools and libraries are here; names what is missing.
toolchain_ok() {
	local missing="" p
	for p in gcc ninja pkg-config python3 dpkg-source; do
		command -v "$p" >/dev/null 2>&1 || missing+=" $p"
	done
	for p in glib-2.0 pixman-1; do
		pkg-config --exists "$p" 2>/dev/null || missing+=" $p.pc"
	done
	[ -f /usr/include/libfdt.h ] || missing+=" libfdt.h"
	if [ "$1" = 7.2 ]; then command -v meson >/dev/null 2>&1 || missing+=" meson"; fi
	[ -z "$missing" ] && return 0
	ilog "qemu $1: the toolchain lacks:$missing (scripts/install-deps.sh interop installs it)"
	return 1
}

# backports_python: download and unpack bookworm-backports' meson and python3-pycotap into
# $CACHE/qemu-patched/python (never installed); print its dist-packages directory.
backports_python() {
	local dir=$CACHE/qemu-patched/python tmp p v pkgs=() deb
	if [ -f "$dir/.complete" ]; then echo "$dir/root/usr/lib/python3/dist-packages"; return 0; fi
	private_apt_opts bookworm-backports || return 1
	if [ ! -d "$CACHE/apt/bookworm-backports/lists" ] ||
		[ -z "$(_pkg_version bookworm-backports meson)" ]; then
		_apt bookworm-backports apt-get update -q >"$CACHE/apt/bookworm-backports/update.log" 2>&1
	fi
	for p in meson python3-pycotap; do
		v=$(_pkg_version bookworm-backports "$p")
		[ -n "$v" ] || { ilog "qemu: bookworm-backports has no $p"; return 2; }
		pkgs+=("$p=$v")
	done
	tmp=$(mktemp -d "$CACHE/tmp.XXXXXX") || return 1
	_apt_download bookworm-backports "$tmp" "${pkgs[@]}" || { rm -rf "$tmp"; return 2; }
	rm -rf "$dir"; mkdir -p "$dir"
	for deb in "$tmp"/*.deb; do
		dpkg-deb -x "$deb" "$dir/root" || { rm -rf "$tmp" "$dir"; return 1; }
	done
	rm -rf "$tmp"
	touch "$dir/.complete"
	echo "$dir/root/usr/lib/python3/dist-packages"
}

# fetch_source VER SRCVER OUT: the unpacked, unpatched source of qemu SRCVER in OUT.
fetch_source() {
	local ver=$1 srcver=$2 out=$3 dl=$3.dl f sha
	mkdir -p "$dl"
	if [ "$ver" = 7.2 ]; then
		(cd "$dl" && timeout 900 apt-get "${APT_OPTS[@]}" source --download-only -q \
			"qemu=$srcver" >download.log 2>&1) ||
			{ tail -n 5 "$dl/download.log" >&2; ilog "qemu $ver: apt-get source failed"; return 2; }
		timeout 600 dpkg-source -x "$dl"/qemu_*.dsc "$out" >"$dl/unpack.log" 2>&1 ||
			{ tail -n 5 "$dl/unpack.log" >&2; ilog "qemu $ver: dpkg-source -x failed"; return 1; }
		return 0
	fi
	# Only the orig tarball: its name and SHA-256 as the Sources index lists them
	# ('URI' NAME SIZE SHA256:HASH), then apt fetches it.
	read -r f sha < <(cd "$dl" && apt-get "${APT_OPTS[@]}" source --print-uris -q "qemu=$srcver" \
		2>/dev/null | awk '/orig\.tar\./ && $4 ~ /^SHA256:/ { print $2, substr($4, 8); exit }')
	[ -n "$f" ] && [ -n "$sha" ] || { ilog "qemu $ver: no orig tarball listed for $srcver"; return 2; }
	# apt-get source fails on the missing .debian.tar.xz; the tarball it got is checked here.
	(cd "$dl" && timeout 900 apt-get "${APT_OPTS[@]}" source --download-only -q \
		"qemu=$srcver" >download.log 2>&1)
	echo "$sha  $dl/$f" | sha256sum -c --quiet - 2>/dev/null ||
		{ tail -n 5 "$dl/download.log" >&2; ilog "qemu $ver: $f missing or not matching its SHA-256"; return 2; }
	mkdir -p "$out"
	timeout 600 tar -xf "$dl/$f" -C "$out" --strip-components=1 ||
		{ ilog "qemu $ver: cannot unpack $f"; return 1; }
}

# build_one VER: fetch, patch, build and cache one QEMU; sets PDIR.
build_one() {
	local ver=$1 srcver key dir tmp log pp="" rc b
	toolchain_ok "$ver" || return 2
	src_apt "$ver" || return 1
	srcver=$(src_version "$ver")
	[ -n "$srcver" ] || { ilog "qemu $ver: no source package qemu 1:$ver* in bookworm(-backports)"; return 2; }
	key=$(qemu_patched_key "$ver")
	dir=$CACHE/qemu-patched/$(qemu_patched_name "$srcver" "$key")
	PDIR=$dir
	[ -f "$dir/.complete" ] && { ilog "qemu $ver: cached in $dir"; return 0; }
	if [ "$ver" != 7.2 ]; then
		pp=$(backports_python) || return $?
		src_apt "$ver" || return 1 # backports_python used APT_OPTS
	fi
	mkdir -p "$CACHE/qemu-patched"
	exec {lockfd}>"$CACHE/.lock-qemu-$ver"
	flock -w 3600 "$lockfd" || { ilog "qemu $ver: build lock busy"; exec {lockfd}>&-; return 1; }
	if [ -f "$dir/.complete" ]; then exec {lockfd}>&-; return 0; fi
	tmp=$(mktemp -d "$CACHE/tmp.XXXXXX")
	ilog "qemu $ver: fetching source $srcver"
	fetch_source "$ver" "$srcver" "$tmp/src"
	rc=$?
	[ $rc = 0 ] || { rm -rf "$tmp"; exec {lockfd}>&-; return $rc; }
	for p in $(qemu_patch_list "$ver"); do
		if ! patch -d "$tmp/src" -p1 --batch --forward -s <"$p" >"$tmp/patch.log" 2>&1; then
			sed 's/^/  /' "$tmp/patch.log" >&2
			ilog "qemu $ver: ${p#"$REPO"/} does not apply to $srcver"
			rm -rf "$tmp"; exec {lockfd}>&-; return 1
		fi
	done
	# The +ds tarball of 10.x leaves out the EDK2 images, which pc-bios/meson.build decompresses
	# whenever bzip2 is there although this x86, SeaBIOS-booted build never uses them: empty
	# compressed placeholders stand in.
	if [ "$ver" != 7.2 ]; then
		for f in $(sed -n "s/^ *'\(edk2-[a-z0-9_-]*\.fd\)',\$/\1/p" "$tmp/src/pc-bios/meson.build"); do
			[ -f "$tmp/src/pc-bios/$f.bz2" ] || bzip2 -c </dev/null >"$tmp/src/pc-bios/$f.bz2"
		done
	fi
	# Only the devices the tests need (and what the q35 machine selects): QEMU_DEVICES.
	echo "$QEMU_DEVICES" | tr ' ' '\n' >"$tmp/src/configs/devices/x86_64-softmmu/uvsock.mak"
	ilog "qemu $ver: building ($JOBS jobs; $(qemu_configure "$ver"))"
	b=$tmp/src/build
	mkdir -p "$b"
	log=$CACHE/qemu-patched/build-$ver.log
	# No deadline short of 3 hours: on a busy 2-core machine a build has taken over an hour.
	# PYTHONPATH: 10.x's meson (unpacked) runs during the build too.
	# shellcheck disable=SC2086
	if ! (cd "$b" && export PYTHONPATH=${pp} && timeout 600 ../configure \
		$(qemu_configure "$ver") ${pp:+--disable-download} &&
		timeout 10800 ninja -j "$JOBS" qemu-system-x86_64) >"$log" 2>&1; then
		tail -n 20 "$log" | sed 's/^/  /' >&2
		ilog "qemu $ver: the build failed (log: $log)"
		rm -rf "$tmp"; exec {lockfd}>&-; return 1
	fi
	install_build "$ver" "$b" "$dir" "$srcver" "$key"
	rc=$?
	rm -rf "$tmp"
	exec {lockfd}>&-
	return $rc
}

# install_build VER BUILDDIR DIR SRCVER KEY: the binary of BUILDDIR (stripped), its option ROMs,
# the wrapper and the info file into DIR, marked complete once the binary starts.
install_build() {
	local ver=$1 b=$2 dir=$3 srcver=$4 key=$5 log
	rm -rf "$dir"; mkdir -p "$dir/share"
	cp "$b/qemu-system-x86_64" "$dir/qemu-system-x86_64.bin" && strip "$dir/qemu-system-x86_64.bin"
	# The option ROMs this build made (linuxboot_dma.bin, pvh.bin...), if any.
	cp "$b"/pc-bios/optionrom/*.bin "$dir/share/" 2>/dev/null
	qemu_patched_wrapper "$dir" "$ver"
	log=$("$dir/qemu-system-x86_64" --version 2>&1 | head -n 1)
	case $log in
	"QEMU emulator version "*) ;;
	*) ilog "qemu $ver: the built binary does not start: $log"; rm -rf "$dir"; return 1 ;;
	esac
	if ! "$dir/qemu-system-x86_64" -device help 2>&1 | grep -q '"vhost-user-vsock-pci"'; then
		ilog "qemu $ver: the built binary has no vhost-user-vsock-pci"; rm -rf "$dir"; return 1
	fi
	printf 'source=%s\nkey=%s\nbanner=%s\npatches=%s\n' "$srcver" "$key" "$log" \
		"$(qemu_patch_list "$ver" | xargs -n1 basename | tr '\n' ' ')" >"$dir/info"
	touch "$dir/.complete"
	ilog "qemu $ver: cached $log in $dir"
}

main() {
	local vers=("$@") v rc=0 r
	[ ${#vers[@]} -gt 0 ] || vers=(7.2 10.0.2)
	mkdir -p "$CACHE" || { ilog "cannot create $CACHE"; return 1; }
	for v in "${vers[@]}"; do
		build_one "$v"
		r=$?
		if [ $r = 0 ]; then
			echo "$PDIR/qemu-system-x86_64"
		elif [ $rc = 0 ] || [ $r = 1 ]; then
			rc=$r
		fi
	done
	return $rc
}

main "$@"
