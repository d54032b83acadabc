#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches the Debian programs the guest and the client tests use into the cache of tests/interop
# (apt-get download and dpkg-deb -x with their library packages, never installed; see
# tests/interop/lib.sh fetch_debs), so that the tests and scripts/vm-shell.sh only look in the
# cache:
#   guest-tools  Debian 12's socat, ncat, OpenSSH client and server (the system's lists): the
#                tools of scripts/vm-shell.sh's guest, sshd for tests/clients/ssh-vsock-mux.sh
#   ssh-proxy    systemd-ssh-proxy from Debian unstable's systemd (a private apt configuration;
#                Debian 12 has systemd 252, the proxy came in 256): the real `ssh vsock-mux/PATH`
#                client of tests/clients/ssh-vsock-mux.sh
#   systemd-guest Debian 12's systemd (and libyaml, which uvsockd links) for the guest that runs
#                systemd as PID 1 with the built packages (tests/pkg/systemd-guest.sh)
# `make interop-deps` runs this. Exit: 0 all cached, 2 something could not be fetched (no package
# archive), 1 an error.
#   scripts/fetch-guest-tools.sh [guest-tools] [ssh-proxy] [systemd-guest]
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../tests/interop/lib.sh
source "$REPO/tests/interop/lib.sh"

rc=0
for what in ${@:-guest-tools ssh-proxy systemd-guest}; do
	case $what in
	guest-tools) fetch_debs guest-tools "" socat ncat openssh-client openssh-server ;;
	ssh-proxy) fetch_debs ssh-proxy unstable systemd ;;
	systemd-guest) fetch_debs systemd-guest "" systemd libyaml-0-2 ;;
	*) echo "fetch-guest-tools: unknown set '$what' (guest-tools, ssh-proxy, systemd-guest)" >&2
		exit 2 ;;
	esac
	r=$?
	if [ $r = 0 ]; then
		ilog "$what: $(wc -l <"$DEBS_ROOT/../packages") packages in $DEBS_ROOT"
	else
		ilog "$what: could not be fetched (status $r)"
		[ $rc = 1 ] || rc=$r
	fi
done
exit $rc
