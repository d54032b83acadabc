#!/bin/busybox sh
# SPDX-License-Identifier: MIT
# /init of the interop guest's initramfs. Mounts the pseudo file systems, loads the vsock modules
# in the order computed on the host from modules.dep (/etc/uvsock/load-order), then either runs
# the in-guest test program (uvsock.mode=test, the default), which reads its case list from the
# kernel command line and prints UVSOCK-CASE lines, or gives an interactive shell on the serial
# console (uvsock.mode=shell). Either way the VM powers off at the end; the last line on the
# console is "UVSOCK-DONE rc=N".
/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin /root
/bin/busybox --install -s
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec 0</dev/console 1>/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "UVSOCK-INIT kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"

mode=test
for w in $(cat /proc/cmdline); do
	case $w in
	uvsock.mode=*) mode=${w#uvsock.mode=} ;;
	uvsock.fault=panic) fault=panic ;;
	uvsock.kconf=*) kconf=${w#uvsock.kconf=} ;;
	esac
done
# Test knob of the harness (UVSOCK_INTEROP_FAULT=init-panic:VM): a kernel panic right after
# UVSOCK-INIT, which the harness must report as a failure and never retry.
[ "${fault:-}" = panic ] && echo c >/proc/sysrq-trigger

for m in $(cat /etc/uvsock/load-order); do
	insmod "/lib/modules/$m" || echo "UVSOCK-MODFAIL $m"
done
echo "UVSOCK-MODULES $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"
# The negotiated features of each virtio device (64 characters, bit 0 first): the harness checks
# IN_ORDER/RING_PACKED of the vsock device (id 0x0013) with UVSOCK_INTEROP_INORDER=1.
for d in /sys/bus/virtio/devices/*; do
	[ -f "$d/features" ] &&
		echo "UVSOCK-VIRTIO ${d##*/} device=$(cat "$d/device") features=$(cat "$d/features")"
done

finish() {
	echo "UVSOCK-DONE rc=$1"
	poweroff -f
	echo o >/proc/sysrq-trigger
	sleep 5
}

if [ "$mode" = shell ]; then
	cid=$(/bin/uvsock-guest cid 2>/dev/null)
	cat <<BANNER

  uvsock guest shell (kernel $(uname -r), guest CID ${cid:-unknown}).
  To the host:  uvsock-guest connect 2 PORT    (host listens on <uds-path>_PORT)
  From host:    uvsock-guest listen PORT       (host: CONNECT PORT on <uds-path>)
$([ -x /usr/bin/socat ] && echo "  Debian tools: socat - VSOCK-CONNECT:2:PORT    socat VSOCK-LISTEN:PORT,fork EXEC:cat
                ncat --vsock 2 PORT            ncat --vsock -l PORT            ssh")
  'poweroff -f' (or exit this shell) stops the VM.

BANNER
	setsid cttyhack sh -l
	finish 0
fi

# uvsock.mode=script: the program an extra archive put at /etc/uvsock/script (a test's own guest
# side, e.g. tests/clients/ssh-vsock-mux.sh), then power off.
if [ "$mode" = script ] && [ -x /etc/uvsock/script ]; then
	/etc/uvsock/script
	finish $?
fi

# The back-end restart and migration cases (tests/interop/qemu-lifecycle.py) append their own
# program to the initramfs and take the guest's second serial port with it.
if [ "$mode" = lifecycle ]; then
	/bin/uvsock-lifecycle
	finish $?
fi

/bin/uvsock-guest run
rc=$?
# Then the conformance table against this kernel, if asked (uvsock.kconf=loopback,
# server,PORT or client,CID,PORT; tests/conformance/kernel/main-kernel.c).
if [ -n "${kconf:-}" ]; then
	/bin/uvsock-kconf $(echo "$kconf" | tr , ' ') || rc=$((rc + 1))
fi
finish $rc
