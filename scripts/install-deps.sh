#!/bin/sh
# Installs the Debian 12 packages the build and the tests need, only those that are missing.
# Usage: scripts/install-deps.sh [--check] [build|test|interop|capture|pkg|bench]...
# (default: build test). --check installs nothing: it names the missing packages and exits 1
# (tests that need a set skip with that line).
set -eu
check=no
if [ "${1:-}" = --check ]; then check=yes; shift; fi
want="meson ninja-build gcc pkg-config libsystemd-dev libyaml-dev" # libsystemd: uvsockd (daemon/sd.c); libyaml: the --config parser
for k in "${@:-build test}"; do
	case "$k" in
	build) ;;
	# tshark: the capture suite; python3-prometheus-client: its parsers check --prometheus;
	# socat, ncat: the shim suite
	# libvirt-clients: virt-xml-validate checks examples/libvirt-domain.xml (tests/clients)
	test) want="$want clang libclang-rt-14-dev socat ncat tshark python3-prometheus-client libvirt-clients" ;;
	# openssh-client: tests/clients/ssh-vsock-mux.sh (ssh, ssh-keygen); dpkg-dev libglib2.0-dev
	# libpixman-1-dev libfdt-dev: the patched QEMU builds (scripts/build-qemu.sh)
	interop) want="$want qemu-system-x86 busybox-static cpio xz-utils zstd kmod openssh-client dpkg-dev libglib2.0-dev libpixman-1-dev libfdt-dev" ;;
	capture) want="$want tshark" ;;
	# The Debian package and its test (debian/, tests/pkg): tools and Build-Depends.
	pkg) want="$want debhelper dpkg-dev fakeroot lintian pkg-config libyaml-dev libsystemd-dev" ;;
	bench) want="$want gnuplot-nox" ;; # uvsock-perf --plot (make bench, bench/run-all.sh)
	*) echo "install-deps: unknown set '$k'" >&2; exit 2 ;;
	esac
done
missing=""
for p in $want; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ $check = yes ]; then echo "missing:$missing" >&2; exit 1; fi
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
		echo "install-deps: missing packages:$missing (run as root or install them)" >&2; exit 1
	fi
else SUDO=""; fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
