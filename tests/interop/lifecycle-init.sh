#!/bin/busybox sh
# SPDX-License-Identifier: MIT
# /init of the guest of the back-end restart and migration cases (tests/interop/qemu-lifecycle.py):
# appended as a second cpio archive to the interop initramfs (tests/interop/lib.sh,
# build_initramfs), it replaces that archive's /init. Loads the vsock modules in the computed
# order, then runs /bin/uvsock-lifecycle, which takes its commands from the host on /dev/ttyS1.
/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec 0</dev/console 1>/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "UVSOCK-INIT kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"
for m in $(cat /etc/uvsock/load-order); do
	insmod "/lib/modules/$m" || echo "UVSOCK-MODFAIL $m"
done
/bin/uvsock-lifecycle
echo "UVSOCK-DONE rc=$?"
poweroff -f
