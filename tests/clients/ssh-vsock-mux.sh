#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# systemd's `ssh vsock-mux/PATH` into a real guest through uvsockd (suite 'interop'; prints TAP,
# exits 0, 1 or 77). The parts are the real ones:
#   - the client: Debian's OpenSSH client of this host, with the ProxyCommand and
#     ProxyUseFdpass of systemd's ssh_config drop-in, the proxy being systemd-ssh-proxy of
#     Debian unstable's systemd (262: it peeks for an OK line of at most 9 bytes), unpacked in
#     the cache of tests/interop and run with its own libraries (never installed);
#   - the server: Debian 12's sshd in the interop guest (a Debian kernel under QEMU, TCG), started
#     per connection by Debian's socat listening on vsock port 22, as systemd's sshd-vsock.socket
#     does with Accept=yes; their libraries unpacked into the initramfs;
#   - uvsockd between them, booted twice: with the default connect-reply=host-port ("OK
#     <host-side port>", 14 bytes: the proxy leaves it unread and OpenSSH skips it as a line
#     before the server's version string, which `ssh -v` shows) and with
#     connect-reply=guest-port ("OK 22": the proxy consumes it, ssh never sees it).
# Each boot: a public-key login as root that runs a command, checked by its output.
# Nothing is fetched here: `make interop-deps` (scripts/fetch-guest-tools.sh) caches the
# packages; without them, a guest kernel, QEMU or ssh this exits 77 saying which.
#   ssh-vsock-mux.sh UVSOCKD UVSOCK_GUEST
set -u
UVSOCKD=$1 GUEST=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../interop/lib.sh
source "$HERE/../interop/lib.sh"
# shellcheck source=vmtap.sh
source "$HERE/vmtap.sh"
HOWTO="make interop-deps (scripts/fetch-kernels.sh, scripts/fetch-guest-tools.sh)"

for t in ssh ssh-keygen readelf cpio socat; do
	command -v $t >/dev/null 2>&1 || skip "$t missing (scripts/install-deps.sh interop)"
done
qemu_resolve || skip "no cached QEMU"
command -v "$INTEROP_QEMU" >/dev/null 2>&1 || skip "$INTEROP_QEMU missing: $HOWTO"
static_busybox >/dev/null || skip "no static busybox (package busybox-static): $HOWTO"
kernel_cached 6.1 || skip "no cached 6.1 guest kernel: $HOWTO"
debs_cached guest-tools || skip "no cached guest tools (socat, sshd): $HOWTO"
TOOLS=$DEBS_ROOT
debs_cached ssh-proxy || skip "no cached systemd-ssh-proxy (Debian unstable's systemd): $HOWTO"
PROXY_ROOT=$DEBS_ROOT

# ssh lowercases the host name, and so the path in vsock-mux/PATH: no capitals in it (mktemp's
# are mixed case).
T=/tmp/uvsock-ssh-$$
mkdir -m 0700 "$T" || exit 1
vm_traps

# The proxy: systemd-ssh-proxy with its own loader and libraries.
debs_overlay "$PROXY_ROOT" "$T/proxy" /usr/lib/systemd/systemd-ssh-proxy ||
	skip "the cached systemd-ssh-proxy is incomplete"
cat >"$T/systemd-ssh-proxy" <<EOF
#!/bin/sh
exec "$T/proxy/lib64/ld-linux-x86-64.so.2" --library-path "$T/proxy/lib/x86_64-linux-gnu" \\
	"$T/proxy/usr/lib/systemd/systemd-ssh-proxy" "\$@"
EOF
chmod 755 "$T/systemd-ssh-proxy"

# The guest's tree: socat and sshd with their libraries, keys, accounts, the sshd config and the
# script /init runs (uvsock.mode=script).
ov=$T/overlay
debs_overlay "$TOOLS" "$ov" /usr/bin/socat /usr/sbin/sshd || skip "the cached guest tools are incomplete"
mkdir -p "$ov/etc/ssh" "$ov/etc/uvsock" "$ov/root"
ssh-keygen -q -t ed25519 -N '' -C uvsock-guest -f "$ov/etc/ssh/ssh_host_ed25519_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -C uvsock-test -f "$T/client_key" || exit 1
cp "$T/client_key.pub" "$ov/etc/ssh/authorized_keys"
echo "uvsock-guest $(cut -d' ' -f1,2 "$ov/etc/ssh/ssh_host_ed25519_key.pub")" >"$T/known_hosts"
printf 'root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n' >"$ov/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ov/etc/group"
printf 'root:*:20000:0:99999:7:::\n' >"$ov/etc/shadow"
chmod 600 "$ov/etc/shadow"
printf 'passwd: files\ngroup: files\nshadow: files\n' >"$ov/etc/nsswitch.conf"
cat >"$ov/etc/ssh/sshd_config" <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
AuthorizedKeysFile /etc/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PidFile none
LogLevel VERBOSE
EOF
cat >"$ov/etc/uvsock/script" <<'EOF'
#!/bin/sh
# sshd per connection on vsock port 22 (systemd's sshd-vsock.socket does the same with Accept=yes).
mkdir -p /run/sshd && chmod 755 /run/sshd
echo "UVSOCK-SSHD listening cid=$(/bin/uvsock-guest cid)"
exec socat VSOCK-LISTEN:22,fork EXEC:"/usr/sbin/sshd -i -f /etc/ssh/sshd_config -E /dev/console"
EOF
chmod 755 "$ov/etc/uvsock/script"
GUEST_OVERLAY=$ov build_initramfs "$KDIR" "$GUEST" "$T/initrd.cpio" || { echo "1..0 # initramfs build failed"; exit 1; }
echo "1..6"

# OK answers to a bare CONNECT 22 through uvsockd (sshd answers only after the client's version).
connect_ok() { printf 'CONNECT 22\n' | timeout 5 socat -t 2 - "UNIX-CONNECT:$1" 2>/dev/null | head -c 3; }

# boot REPLY: uvsockd with connect-reply=REPLY, the guest booted and its sshd reachable.
boot() {
	local reply=$1 i=0
	"$UVSOCKD" --vm "guest-cid=3,socket=$T/vm3.sock,uds-path=$T/vm3.vsock,connect-reply=$reply" \
		--control none >"$T/uvsockd-$reply.log" 2>&1 &
	upid=$!
	while [ $i -lt 100 ] && ! [ -S "$T/vm3.sock" ]; do sleep 0.1; i=$((i + 1)); done
	[ -S "$T/vm3.sock" ] || return 1
	qemu_args "$KDIR" "$T/initrd.cpio" "uvsock.mode=script" "$T/console-$reply.log" "$T/vm3.sock"
	"$INTEROP_QEMU" "${QEMU_ARGS[@]}" >"$T/qemu-$reply.log" 2>&1 &
	qpid=$!
	# A kernel that panics before /init (TCG on a loaded machine: "IO-APIC + timer doesn't
	# work") is booted once more, loudly, as tests/interop/interop.sh does.
	if wait_for_line "$T/console-$reply.log" '^UVSOCK-INIT|Kernel panic' 180 "$qpid" |
		grep -q 'Kernel panic'; then
		echo "# $reply: boot attempt 1 panicked before /init; booting again"
		kill -KILL "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null
		mv "$T/console-$reply.log" "$T/console-$reply.log.attempt1"
		"$INTEROP_QEMU" "${QEMU_ARGS[@]}" >"$T/qemu-$reply.log" 2>&1 &
		qpid=$!
	fi
	wait_for_line "$T/console-$reply.log" '^UVSOCK-SSHD listening' 180 "$qpid" >/dev/null || return 1
	# socat may not listen yet when the line is printed: wait for the guest to accept.
	i=0
	while [ $i -lt 100 ] && [ "$(connect_ok "$T/vm3.vsock")" != "OK " ]; do
		kill -0 "$qpid" 2>/dev/null || return 1
		sleep 0.2; i=$((i + 1))
	done
	[ "$(connect_ok "$T/vm3.vsock")" = "OK " ]
}

halt() {
	[ -n "$qpid" ] && kill -KILL "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
	qpid=""
	[ -n "$upid" ] && kill -TERM "$upid" 2>/dev/null && wait "$upid" 2>/dev/null
	upid=""
}

# ssh as systemd's drop-in configures it (20-systemd-ssh-proxy.conf), plus a known host key.
login() {
	timeout 120 ssh -v -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -i "$T/client_key" \
		-o "ProxyCommand=$T/systemd-ssh-proxy %h %p" -o ProxyUseFdpass=yes -o CheckHostIP=no \
		-o HostKeyAlias=uvsock-guest -o "UserKnownHostsFile=$T/known_hosts" \
		-o StrictHostKeyChecking=yes -o ConnectTimeout=60 \
		"root@vsock-mux$T/vm3.vsock" 'echo "uvsock-login $(id -u) $(uname -r)"'
}

for reply in host-port guest-port; do
	if boot "$reply"; then
		ok "$reply: guest booted, sshd on vsock port 22 answers CONNECT through uvsockd"
	else
		notok "$reply: guest or uvsockd did not come up"
		show "$T/console-$reply.log" "$T/uvsockd-$reply.log" "$T/qemu-$reply.log"
		halt; continue
	fi
	login >"$T/ssh-$reply.out" 2>"$T/ssh-$reply.err"
	rc=$?
	logged_in=no
	if [ $rc = 0 ] && grep -q "^uvsock-login 0 $(kinfo "$KDIR" kver)\$" "$T/ssh-$reply.out"; then
		logged_in=yes
		ok "$reply: ssh root@vsock-mux/... logged in and ran a command ($(head -n 1 "$T/ssh-$reply.out"))"
	else
		notok "$reply: ssh exit $rc"; show "$T/ssh-$reply.out" "$T/ssh-$reply.err" "$T/console-$reply.log"
	fi
	# What ssh saw before the server's version string.
	banner=$(grep -a 'banner line' "$T/ssh-$reply.err" | head -n 1 | tr -d '\r')
	case $logged_in$reply in
	no*) notok "$reply: no login, so nothing to say about the OK line" ;;
	yeshost-port)
		if echo "$banner" | grep -qE 'banner line 0: OK [0-9]{10}$'; then
			ok "host-port: the proxy left the 14-byte OK line to ssh, which skipped it ($banner)"
		else
			notok "host-port: expected ssh to skip 'OK <host port>' (got: ${banner:-none})"
		fi ;;
	yesguest-port)
		if [ -z "$banner" ]; then
			ok "guest-port: the proxy consumed 'OK 22'; ssh saw only the server's version"
		else
			notok "guest-port: ssh saw a line before the version: $banner"
		fi ;;
	esac
	halt
done
[ "$fails" = 0 ]
