#!/bin/sh
# SPDX-License-Identifier: MIT
# The libvirt recipe (examples/libvirt-domain.xml, docs/libvirt.md) against libvirt's own domain
# schema with Debian's virt-xml-validate (package libvirt-clients: scripts/install-deps.sh test),
# and the parts the recipe exists for: memfd memory shared with uvsockd, the chardev on uvsockd's
# vhost-user socket and vhost-user-vsock-pci on it. A copy with a broken <qemu:arg> must fail, so
# the validator really checks the qemu namespace. Prints TAP; exit 77 (loudly) without the tool.
#   libvirt-xml.sh SRCDIR
set -u
xml=$1/examples/libvirt-domain.xml
if ! command -v virt-xml-validate >/dev/null 2>&1; then
	echo "1..0 # SKIP virt-xml-validate missing (package libvirt-clients: scripts/install-deps.sh test)"
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-libvirt.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0 n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fails=$((fails + 1)); }
echo "1..3"
if virt-xml-validate "$xml" domain >"$tmp/out" 2>&1; then
	ok "virt-xml-validate: $(cat "$tmp/out")"
else
	notok "virt-xml-validate $xml domain"; sed 's/^/# /' "$tmp/out"
fi
missing=""
for want in "<source type='memfd'/>" "<access mode='shared'/>" \
	"xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'" \
	"<qemu:arg value='socket,id=uvsock0,path=/run/uvsockd/vm3/vm3.sock'/>" \
	"<qemu:arg value='vhost-user-vsock-pci,chardev=uvsock0'/>"; do
	grep -qF "$want" "$xml" || missing="$missing $want"
done
if [ -z "$missing" ]; then
	ok "the recipe shares memfd memory and adds the chardev and vhost-user-vsock-pci"
else
	notok "the recipe lacks:$missing"
fi
sed "s/<qemu:arg value='-device'\/>/<qemu:arg valeu='-device'\/>/" "$xml" >"$tmp/bad.xml"
if ! virt-xml-validate "$tmp/bad.xml" domain >/dev/null 2>&1; then
	ok "a broken <qemu:arg> fails validation"
else
	notok "virt-xml-validate accepted a broken <qemu:arg>"
fi
[ "$fails" = 0 ]
