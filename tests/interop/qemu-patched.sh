# SPDX-License-Identifier: MIT
# The patched QEMUs of the reconnect and migration cases (contrib/qemu/): where
# scripts/build-qemu.sh puts them in the interop cache and how the tests find them without
# building or fetching anything. Sourced after tests/interop/lib.sh.

# Bump when what a cached build holds changes, so old builds are not reused.
QEMU_PATCHED_LAYOUT=1

# The configure line of every build: x86_64 TCG only, vhost-user and vhost-kernel, nothing else.
QEMU_CONFIGURE="--target-list=x86_64-softmmu --without-default-features --enable-tcg \
--enable-vhost-user --enable-vhost-kernel --disable-docs --without-default-devices \
--with-devices-x86_64=uvsock"
# configs/devices/x86_64-softmmu/uvsock.mak, written into the source by scripts/build-qemu.sh:
# the q35 machine (which selects what it needs), virtio-pci, vhost-user-vsock, the ISA serial.
QEMU_DEVICES="CONFIG_Q35=y CONFIG_VIRTIO_PCI=y CONFIG_VHOST_USER_VSOCK=y CONFIG_SERIAL_ISA=y"

# qemu_configure VER: the configure line of VER's build: QEMU_CONFIGURE, and for 10.x also
# --disable-install-blobs (its +ds source leaves the firmware images out; nothing is installed).
qemu_configure() {
	if [ "$1" = 7.2 ]; then echo "$QEMU_CONFIGURE"; else echo "$QEMU_CONFIGURE --disable-install-blobs"; fi
}

# qemu_patch_list VER: the patches applied to QEMU VER, in order (7.2 gets its own fix first).
qemu_patch_list() {
	local top
	top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/contrib/qemu
	[ "$1" = 7.2 ] && ls "$top"/patches-7.2/*.patch
	ls "$top"/patches/*.patch
}

# qemu_patched_key VER: 12 hex digits naming the patches, VER's configure line and the layout.
qemu_patched_key() {
	{
		local p
		for p in $(qemu_patch_list "$1"); do sha256sum <"$p"; done
		echo "$(qemu_configure "$1") $QEMU_DEVICES $QEMU_PATCHED_LAYOUT"
	} | sha256sum | cut -c1-12
}

# qemu_patched_name SRCVER KEY: the cache directory name of one build.
qemu_patched_name() { echo "qemu_${1//:/%}-$2"; }

# qemu_patched_wrapper DIR VER: DIR/qemu-system-x86_64 runs DIR's binary with its own option
# ROMs first, then the firmware of the matching Debian QEMU: the system's (7.2) or the
# unpacked bookworm-backports one of scripts/fetch-qemu.sh (10.x; its SeaBIOS is newer), else
# the system's.
qemu_patched_wrapper() {
	local fw="-L /usr/share/qemu -L /usr/share/seabios"
	if [ "$2" != 7.2 ] && qemu_cached; then
		fw="-L $QDIR/root/usr/share/qemu -L $QDIR/root/usr/share/seabios"
	fi
	cat >"$1/qemu-system-x86_64" <<WRAP && chmod 755 "$1/qemu-system-x86_64"
#!/bin/sh
# SPDX-License-Identifier: MIT
# Written by scripts/build-qemu.sh (qemu_patched_wrapper): QEMU $2 with contrib/qemu's patches.
here=\$(dirname "\$(readlink -f "\$0")")
exec "\$here/qemu-system-x86_64.bin" -L "\$here/share" $fw "\$@"
WRAP
}

# qemu_patched_cached VER: set PDIR to the cached build of VER (7.2, 10.0.2) with the current
# patches, without fetching or building. Returns 0, or 2 when there is none.
qemu_patched_cached() {
	local key dir
	key=$(qemu_patched_key "$1")
	for dir in $(ls -d "$(interop_cache_dir)/qemu-patched/qemu_1%$1"*"-$key"/ 2>/dev/null | sort -rV); do
		if [ -f "$dir/.complete" ]; then
			PDIR=${dir%/}
			return 0
		fi
	done
	return 2
}
