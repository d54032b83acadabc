# SPDX-License-Identifier: MIT
# Shared shell functions of the real-guest interop run (tests/interop/interop.sh), of
# scripts/fetch-kernels.sh, scripts/fetch-qemu.sh and scripts/vm-shell.sh: where the cache
# lives, fetching and unpacking the Debian guest kernels and the newer QEMU (never installing
# them; only fetch_kernel and fetch_qemu touch the network, and the test itself only looks in the
# cache with kernel_cached and qemu_cached), recovering the uncompressed vmlinux from a bzImage,
# computing the module load order from modules.dep, building the initramfs, choosing and
# starting QEMU, and waiting with a deadline for a line to appear in a file.
# Sourced by bash scripts; every function reports failure through its exit status and a message
# on stderr.

# Directory that holds unpacked kernels between runs; keyed below by package name and version.
interop_cache_dir() {
	if [ -n "${UVSOCK_INTEROP_CACHE:-}" ]; then
		echo "$UVSOCK_INTEROP_CACHE"
	elif [ "$(id -u)" = 0 ]; then
		echo /var/cache/uvsock-interop
	else
		echo "${XDG_CACHE_HOME:-$HOME/.cache}/uvsock-interop"
	fi
}

# Bump when the layout of a cached kernel directory changes, so old entries are not reused.
INTEROP_CACHE_LAYOUT=2

# The guest kernels of the run, by short name (kernel_spec maps each to a meta package and the
# Debian suite it comes from): 6.1 and 6.12 from the system's Debian 12 lists, 7.3 from
# trixie-backports (or unstable) through a private apt configuration (private_apt_opts).
# UVSOCK_INTEROP_KERNELS overrides (comma or space separated, e.g. "6.1,6.12"; a meta package
# name of the system's lists is accepted too), for the test and scripts/fetch-kernels.sh alike.
INTEROP_KERNELS=${UVSOCK_INTEROP_KERNELS:-"6.1 6.12 7.3"}
INTEROP_KERNELS=${INTEROP_KERNELS//,/ }

# kernel_spec NAME: set KMETA (the meta package) and KSUITES (the suites to look in, in order of
# preference; empty = the system's own apt lists). Any other name is taken as a meta package of
# the system's lists.
kernel_spec() {
	case $1 in
	6.1) KMETA=linux-image-amd64 KSUITES="" ;;
	6.12) KMETA=linux-image-6.12-amd64 KSUITES="" ;;
	7.*) KMETA=linux-image-amd64 KSUITES="trixie-backports unstable" ;;
	*) KMETA=$1 KSUITES="" ;;
	esac
}

# private_apt_opts SUITE [deb-src]: fill the array APT_OPTS with an apt configuration of its own
# for SUITE (with deb-src: source packages, in apt/SUITE-src, for scripts/build-qemu.sh),
# creating its directories under the interop cache: sources list (signed by the Debian archive
# keyring), lists, cache and an empty dpkg status; no sources.list.d and no preferences (an
# empty directory of its own stands for the parts directories, a nonexistent one makes apt
# warn). The system's sources, lists and dpkg state are never read for it nor written.
private_apt_opts() {
	local d type=${2:-deb}
	d="$(interop_cache_dir)/apt/$1${2:+-src}"
	mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/state" "$d/none.d" || return 1
	[ -f "$d/state/status" ] || : >"$d/state/status"
	echo "$type [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
		"${UVSOCK_INTEROP_MIRROR:-http://deb.debian.org/debian} $1 main" >"$d/sources.list"
	APT_OPTS=(-o "Dir::Etc::SourceList=$d/sources.list" -o "Dir::Etc::SourceParts=$d/none.d"
		-o "Dir::State=$d/state" -o "Dir::State::Lists=$d/lists"
		-o "Dir::State::status=$d/state/status" -o "Dir::Cache=$d/cache"
		-o Dir::Etc::Preferences=/dev/null -o "Dir::Etc::PreferencesParts=$d/none.d"
		-o Acquire::Languages=none -o APT::Get::List-Cleanup=true)
}

# _apt SUITE CMD ARGS...: run the apt command CMD (apt-get, apt-cache) with the system's
# configuration (SUITE empty) or SUITE's private one, for at most 900 s.
_apt() {
	local suite=$1 cmd=$2
	shift 2
	if [ -z "$suite" ]; then
		timeout 900 "$cmd" "$@"
	else
		private_apt_opts "$suite" || return 1
		timeout 900 "$cmd" "${APT_OPTS[@]}" "$@"
	fi
}

# Modules the guest needs (with everything modules.dep says they need). Built-in ones are skipped.
INTEROP_MODULES="virtio_pci vmw_vsock_virtio_transport vsock_loopback vsock_diag vsockmon"

ilog() { echo "interop: $*" >&2; }

# _resolve_image_pkg SUITE META: the concrete image package META (linux-image-amd64,
# linux-image-6.12-amd64) depends on, in the system's lists (SUITE empty) or SUITE's private ones.
_resolve_image_pkg() {
	_apt "$1" apt-cache depends "$2" 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# _pkg_version SUITE PKG: the candidate version of PKG.
_pkg_version() {
	_apt "$1" apt-cache show --no-all-versions "$2" 2>/dev/null | awk '/^Version:/ { print $2; exit }'
}

# _split_pkgs SUITE PKG: the packages a 7.x kernel is split into besides its (nearly empty)
# linux-image package: PKG's dependencies named linux-WORD-<its ABI name> (linux-binary-*: the
# bzImage, linux-base-*: config and System.map, linux-modules-*: the modules). Empty for 6.x.
_split_pkgs() {
	local abi=${2#linux-image-}
	_apt "$1" apt-cache depends "$2" 2>/dev/null | awk -v abi="$abi" \
		'$1 == "Depends:" && substr($2, length($2) - length(abi)) == "-" abi && $2 ~ /^linux-[a-z]+-/ { print $2 }'
}

# extract_vmlinux BZIMAGE OUT: find a compressed payload (xz, zstd, gzip, lz4) inside the bzImage
# and decompress it; succeed only if the result is an ELF file (what the kernel's
# scripts/extract-vmlinux does, written afresh here).
extract_vmlinux() {
	local img=$1 out=$2 magic tool off
	for magic in 'xz:\xfd\x37\x7a\x58\x5a\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08' \
		'lz4:\x02\x21\x4c\x18'; do
		tool=${magic%%:*}
		command -v "$tool" >/dev/null 2>&1 || continue
		for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$img" 2>/dev/null | cut -d: -f1 | head -n 8); do
			case $tool in
			xz) tail -c +$((off + 1)) "$img" | xz -dcq >"$out" 2>/dev/null ;;
			zstd) tail -c +$((off + 1)) "$img" | zstd -dcq >"$out" 2>/dev/null ;;
			gzip) tail -c +$((off + 1)) "$img" | gzip -dcq >"$out" 2>/dev/null ;;
			lz4) tail -c +$((off + 1)) "$img" | lz4 -dcq >"$out" 2>/dev/null ;;
			esac
			if [ "$(head -c 4 "$out" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
				return 0
			fi
		done
	done
	rm -f "$out"
	return 1
}

# _module_order MODDIR KVER NAMES...: print the relative paths (as in modules.dep) of the named
# modules and their dependencies, dependencies first, each once. Names are matched with - and _
# treated alike. A name that is built in (modules.builtin) or unknown is skipped.
_module_order() {
	local dir=$1 kver=$2
	shift 2
	awk -v want="$*" '
		function norm(p,   b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.[a-z0-9]+)?$/, "", b);
			gsub(/-/, "_", b); return b }
		function visit(p,   n, i, d) {
			if (p in seen) return
			seen[p] = 1
			n = split(deps[p], d, " ")
			for (i = 1; i <= n; i++) visit(d[i])
			print p
		}
		{ p = $1; sub(/:$/, "", p); deps[p] = ""; for (i = 2; i <= NF; i++) deps[p] = deps[p] " " $i
		  byname[norm(p)] = p }
		END { n = split(want, w, " ")
		      for (i = 1; i <= n; i++) { k = w[i]; gsub(/-/, "_", k); if (k in byname) visit(byname[k]) } }
	' "$dir/lib/modules/$kver/modules.dep"
}

# _apt_download SUITE DIR PKG=VER...: apt-get download the packages into DIR (system lists for
# SUITE empty, else SUITE's private ones); on failure print apt's output and fail.
_apt_download() {
	local suite=$1 dir=$2
	shift 2
	(cd "$dir" && _apt "$suite" apt-get download -q "$@" >download.log 2>&1) && return 0
	sed 's/^/  /' "$dir/download.log" >&2
	ilog "apt-get download $* failed"
	return 1
}

# _kernel_key META PKG VER: the cache directory name of one kernel package version.
_kernel_key() { echo "$1.${2}_${3//:/%}.v$INTEROP_CACHE_LAYOUT"; }

# _kernel_want NAME PKG: whether image package PKG is what NAME asks for (a 7.x name wants a
# linux-image-7.* package: trixie-backports may still carry 6.x, then unstable is tried).
_kernel_want() {
	case $1 in
	7.*) case $2 in linux-image-7.*) return 0 ;; *) return 1 ;; esac ;;
	esac
	[ -n "$2" ]
}

# kernel_cached NAME: set KDIR to NAME's kernel (a short name of kernel_spec or a meta package)
# in the cache without fetching anything: for each of its suites, the version the local (or
# private) package lists resolve it to when that one is cached, else the newest cached one.
# Returns 0, or 2 when nothing is cached for NAME (scripts/fetch-kernels.sh fetches).
kernel_cached() {
	local name=$1 cache pkg ver dir suite km
	cache=$(interop_cache_dir)
	kernel_spec "$name"
	for suite in ${KSUITES:-""}; do
		km=$KMETA${suite:+@$suite}
		pkg=$(_resolve_image_pkg "$suite" "$KMETA")
		if _kernel_want "$name" "$pkg"; then
			ver=$(_pkg_version "$suite" "$pkg")
			dir="$cache/kernels/$(_kernel_key "$km" "$pkg" "$ver")"
			if [ -n "$ver" ] && [ -f "$dir/.complete" ]; then
				KDIR=$dir
				return 0
			fi
		fi
		for dir in $(ls -d "$cache/kernels/$km".*".v$INTEROP_CACHE_LAYOUT"/ 2>/dev/null | sort -rV); do
			pkg=${dir##*/kernels/"$km".}
			if _kernel_want "$name" "${pkg%%_*}" && [ -f "$dir/.complete" ]; then
				KDIR=${dir%/}
				return 0
			fi
		done
	done
	return 2
}

# fetch_kernel NAME: make sure the kernel that NAME (a short name of kernel_spec, or a Debian meta
# package of the system's lists) currently resolves to is unpacked in the cache, and set KDIR to
# its directory. A suite other than the system's is looked up with `apt-get update` under its
# private configuration (private_apt_opts) first. The directory holds: vmlinuz, vmlinux
# (when it could be recovered), config, modules/ (only the modules the guest needs, uncompressed),
# load-order (their paths under modules/, dependencies first), info (package, version, kver,
# meta, suite). A 7.x kernel comes split in linux-image, -binary, -base and -modules packages
# (_split_pkgs); all are downloaded and unpacked into one tree.
# Returns 0, or 2 when the package archive cannot be reached (caller decides to skip), 1 on errors.
fetch_kernel() {
	local name=$1 cache pkg="" ver key dir tmp deb kver m rel suite="" s km root
	cache=$(interop_cache_dir)
	mkdir -p "$cache" || { ilog "cannot create cache dir $cache"; return 1; }
	kernel_spec "$name"
	for s in ${KSUITES:-""}; do
		if [ -n "$s" ]; then
			ilog "$name: apt-get update of the private configuration for $s"
			# (creates the directory the log goes to)
			private_apt_opts "$s" || { ilog "cannot create $cache/apt/$s"; return 1; }
			_apt "$s" apt-get update -q >"$cache/apt/$s/update.log" 2>&1 ||
				{ ilog "$name: apt-get update for $s failed:"; sed 's/^/  /' "$cache/apt/$s/update.log" | tail -n 5 >&2; }
		fi
		pkg=$(_resolve_image_pkg "$s" "$KMETA")
		if [ -z "$pkg" ] && [ -z "$s" ] && [ "$(id -u)" = 0 ]; then
			ilog "apt-cache does not know $KMETA; running apt-get update"
			timeout 600 apt-get update -qq >/dev/null 2>&1 || true
			pkg=$(_resolve_image_pkg "" "$KMETA")
		fi
		if _kernel_want "$name" "$pkg"; then suite=$s; break; fi
		[ -n "$pkg" ] && ilog "$name: ${s:-system} lists resolve $KMETA to $pkg, not wanted"
		pkg=""
	done
	if [ -z "$pkg" ]; then
		# Offline, but maybe a previous run cached something for this kernel.
		if kernel_cached "$name"; then
			ilog "$name not resolvable; using cached $(tr '\n' ' ' <"$KDIR/info")"
			return 0
		fi
		ilog "cannot resolve $name to a kernel image package (no package lists?)"
		return 2
	fi
	km=$KMETA${suite:+@$suite}
	ver=$(_pkg_version "$suite" "$pkg")
	[ -n "$ver" ] || { ilog "no version for $pkg"; return 2; }
	key=$(_kernel_key "$km" "$pkg" "$ver")
	dir="$cache/kernels/$key"
	KDIR=$dir
	[ -f "$dir/.complete" ] && return 0

	mkdir -p "$cache/kernels"
	exec {lockfd}>"$cache/.lock"
	flock -w 900 "$lockfd" || { ilog "cache lock busy"; exec {lockfd}>&-; return 1; }
	if [ -f "$dir/.complete" ]; then exec {lockfd}>&-; return 0; fi
	tmp=$(mktemp -d "$cache/tmp.XXXXXX")
	local pkgs=("$pkg=$ver") p
	for p in $(_split_pkgs "$suite" "$pkg"); do pkgs+=("$p=$ver"); done
	ilog "downloading ${pkgs[*]}${suite:+ (from $suite, private apt configuration)}"
	_apt_download "$suite" "$tmp" "${pkgs[@]}" || { rm -rf "$tmp"; exec {lockfd}>&-; return 2; }
	for deb in "$tmp"/*.deb; do
		timeout 600 dpkg-deb -x "$deb" "$tmp/x" || { rm -rf "$tmp"; exec {lockfd}>&-; return 1; }
	done
	# Modules live in lib/modules or, in a merged-/usr package, usr/lib/modules.
	root=$tmp/x
	[ -d "$root/lib/modules" ] || root=$tmp/x/usr
	kver=$(ls "$root/lib/modules" 2>/dev/null | head -n 1)
	[ -n "$kver" ] || { ilog "${pkgs[*]} hold no lib/modules"; rm -rf "$tmp"; exec {lockfd}>&-; return 1; }
	if [ ! -f "$root/lib/modules/$kver/modules.dep" ]; then
		# The package leaves modules.dep to the installer; compute it in the unpacked tree.
		PATH=$PATH:/usr/sbin:/sbin depmod -b "$root" "$kver" || { ilog "depmod failed"; rm -rf "$tmp"; exec {lockfd}>&-; return 1; }
	fi
	rm -rf "$dir"; mkdir -p "$dir/modules"
	# 6.x: boot/vmlinuz-KVER, boot/config-KVER; 7.x: (usr/)lib/modules/KVER/{vmlinuz,config}.
	for m in vmlinuz config; do
		p=$(ls "$tmp/x/boot/$m-$kver" "$root/lib/modules/$kver/$m" 2>/dev/null | head -n 1)
		[ -n "$p" ] || { ilog "${pkgs[*]} hold no $m-$kver"; rm -rf "$tmp" "$dir"; exec {lockfd}>&-; return 1; }
		cp "$p" "$dir/$m"
	done
	for m in modules.dep modules.order modules.builtin; do
		[ -f "$root/lib/modules/$kver/$m" ] && cp "$root/lib/modules/$kver/$m" "$dir/$m"
	done
	: >"$dir/load-order"
	for rel in $(_module_order "$root" "$kver" $INTEROP_MODULES); do
		local src="$root/lib/modules/$kver/$rel" out="$dir/modules/${rel%%.ko*}.ko"
		mkdir -p "$(dirname "$out")"
		case $rel in
		*.ko) cp "$src" "$out" ;;
		*.ko.xz) xz -dc "$src" >"$out" ;;
		*.ko.zst) zstd -qdc "$src" >"$out" ;;
		*.ko.gz) gzip -dc "$src" >"$out" ;;
		*) ilog "unknown module format $rel"; rm -rf "$tmp"; exec {lockfd}>&-; return 1 ;;
		esac
		echo "${rel%%.ko*}.ko" >>"$dir/load-order"
	done
	for m in vmw_vsock_virtio_transport virtio_pci; do
		if ! grep -q "/$m\.ko" "$dir/load-order" "$dir/modules.builtin" 2>/dev/null; then
			ilog "$pkg has neither a module nor a built-in $m"; rm -rf "$tmp"; exec {lockfd}>&-; return 1
		fi
	done
	if extract_vmlinux "$dir/vmlinuz" "$dir/vmlinux"; then :; else
		ilog "could not recover vmlinux from $pkg; will boot the bzImage"
	fi
	printf 'package=%s\nversion=%s\nkver=%s\nmeta=%s\nsuite=%s\n' "$pkg" "$ver" "$kver" "$KMETA" \
		"${suite:-system}" >"$dir/info"
	rm -rf "$tmp"
	touch "$dir/.complete"
	exec {lockfd}>&-
	ilog "cached $pkg $ver ($kver) in $dir"
	return 0
}

# ---- QEMU: the system's, or a newer one from bookworm-backports (docs/interop.md) ----

# The QEMU binary every VM of the run is started with (interop.sh, scripts/vm-shell.sh):
# UVSOCK_INTEROP_QEMU, default the system's qemu-system-x86_64. The value "backports" stands for
# the bookworm-backports QEMU in the cache (qemu_cached resolves it; interop.sh skips when it is
# not cached); any other value is a path or a command name.
INTEROP_QEMU=${UVSOCK_INTEROP_QEMU:-qemu-system-x86_64}

# The packages of the newer QEMU: the binary, the files it loads at run time (firmware blobs and
# option ROMs in qemu-system-data, modules in qemu-system-common) and the SeaBIOS it asks for
# (qemu-system-x86 depends on seabios >> 1.16.3, bookworm has 1.16.2). Every shared library it
# links is in bookworm (docs/interop.md, "IN_ORDER with a newer QEMU").
QEMU_SUITE=bookworm-backports
QEMU_PKGS="qemu-system-x86 qemu-system-data qemu-system-common seabios"

# _qemu_key VER: the cache directory name of one qemu-system-x86 version.
_qemu_key() { echo "qemu-system-x86_${1//:/%}.v$INTEROP_CACHE_LAYOUT"; }

# _qemu_wrapper DIR: write DIR/qemu-system-x86_64, which runs the unpacked binary with its own
# firmware directories first (-L, in the order of Debian's configured firmware path) and its own
# modules (QEMU_MODULE_DIR), so that none of the system's QEMU 7.2 files is picked up instead.
_qemu_wrapper() {
	cat >"$1/qemu-system-x86_64" <<'WRAP' && chmod 755 "$1/qemu-system-x86_64"
#!/bin/sh
# SPDX-License-Identifier: MIT
# Written by tests/interop/lib.sh (_qemu_wrapper): the unpacked bookworm-backports QEMU.
here=$(dirname "$(readlink -f "$0")")
r=$here/root
QEMU_MODULE_DIR=$r/usr/lib/x86_64-linux-gnu/qemu
export QEMU_MODULE_DIR
exec "$r/usr/bin/qemu-system-x86_64" -L "$r/usr/share/qemu" -L "$r/usr/share/seabios" "$@"
WRAP
}

# qemu_cached: set QDIR to the newest complete bookworm-backports QEMU in the cache without
# fetching anything (its wrapper is $QDIR/qemu-system-x86_64). Returns 0, or 2 when none is.
qemu_cached() {
	local dir
	for dir in $(ls -d "$(interop_cache_dir)/qemu/qemu-system-x86_"*".v$INTEROP_CACHE_LAYOUT"/ \
		2>/dev/null | sort -rV); do
		if [ -f "$dir/.complete" ]; then
			QDIR=${dir%/}
			return 0
		fi
	done
	return 2
}

# fetch_qemu: make sure the qemu-system-x86 that bookworm-backports currently has is unpacked in
# the cache (QEMU_PKGS at their candidate versions, apt-get download through the private apt
# configuration of QEMU_SUITE, dpkg-deb -x into QDIR/root, never installed), with its wrapper,
# and set QDIR. The unpacked binary must start (--version) and its vhost-user-vsock-pci must have
# the property in_order, else nothing is cached. Returns 0, 2 when the archive cannot be reached
# (a previously cached QEMU is then used if there is one), 1 on errors.
fetch_qemu() {
	local cache ver key dir tmp deb p v pkgs=() log
	cache=$(interop_cache_dir)
	mkdir -p "$cache/qemu" || { ilog "cannot create $cache/qemu"; return 1; }
	ilog "qemu: apt-get update of the private configuration for $QEMU_SUITE"
	private_apt_opts "$QEMU_SUITE" || { ilog "qemu: cannot create $cache/apt/$QEMU_SUITE"; return 1; }
	log=$cache/apt/$QEMU_SUITE/update.log
	if ! _apt "$QEMU_SUITE" apt-get update -q >"$log" 2>&1; then
		ilog "qemu: apt-get update for $QEMU_SUITE failed:"
		tail -n 5 "$log" | sed 's/^/  /' >&2
	fi
	ver=$(_pkg_version "$QEMU_SUITE" qemu-system-x86)
	if [ -z "$ver" ]; then
		qemu_cached && { ilog "qemu: $QEMU_SUITE not reachable; using cached $QDIR"; return 0; }
		ilog "qemu: $QEMU_SUITE has no qemu-system-x86 (no package lists?)"
		return 2
	fi
	key=$(_qemu_key "$ver")
	dir="$cache/qemu/$key"
	QDIR=$dir
	[ -f "$dir/.complete" ] && return 0
	for p in $QEMU_PKGS; do
		v=$(_pkg_version "$QEMU_SUITE" "$p")
		[ -n "$v" ] || { ilog "qemu: $QEMU_SUITE has no $p"; return 2; }
		pkgs+=("$p=$v")
	done
	exec {lockfd}>"$cache/.lock"
	flock -w 900 "$lockfd" || { ilog "cache lock busy"; exec {lockfd}>&-; return 1; }
	if [ -f "$dir/.complete" ]; then exec {lockfd}>&-; return 0; fi
	tmp=$(mktemp -d "$cache/tmp.XXXXXX")
	ilog "qemu: downloading ${pkgs[*]} (from $QEMU_SUITE, private apt configuration)"
	_apt_download "$QEMU_SUITE" "$tmp" "${pkgs[@]}" || { rm -rf "$tmp"; exec {lockfd}>&-; return 2; }
	rm -rf "$dir"; mkdir -p "$dir"
	for deb in "$tmp"/*.deb; do
		timeout 600 dpkg-deb -x "$deb" "$dir/root" ||
			{ rm -rf "$tmp" "$dir"; exec {lockfd}>&-; return 1; }
	done
	rm -rf "$dir/root/usr/share/doc" "$dir/root/usr/share/man" "$tmp"
	_qemu_wrapper "$dir"
	log=$("$dir/qemu-system-x86_64" --version 2>&1 | head -n 1)
	case $log in
	"QEMU emulator version "*) ;;
	*)
		ilog "qemu: the unpacked $dir/root/usr/bin/qemu-system-x86_64 does not start: $log"
		ldd "$dir/root/usr/bin/qemu-system-x86_64" 2>&1 | grep 'not found' | sed 's/^/  /' >&2
		rm -rf "$dir"; exec {lockfd}>&-
		return 1 ;;
	esac
	if ! "$dir/qemu-system-x86_64" -device vhost-user-vsock-pci,help 2>&1 |
		grep -q '^ *in_order='; then
		ilog "qemu: $log: vhost-user-vsock-pci has no in_order property"
		rm -rf "$dir"; exec {lockfd}>&-
		return 1
	fi
	printf 'packages=%s\nversion=%s\nbanner=%s\nsuite=%s\n' "${pkgs[*]}" "$ver" "$log" \
		"$QEMU_SUITE" >"$dir/info"
	touch "$dir/.complete"
	exec {lockfd}>&-
	ilog "qemu: cached $log in $dir"
	return 0
}

# qemu_resolve: turn INTEROP_QEMU into the command to run: "backports" becomes the cached
# wrapper (fails with 2 when none is cached). Anything else is kept as is.
qemu_resolve() {
	[ "$INTEROP_QEMU" = backports ] || return 0
	qemu_cached || return 2
	INTEROP_QEMU=$QDIR/qemu-system-x86_64
}

# kinfo KDIR KEY: one value from a cached kernel's info file.
kinfo() { sed -n "s/^$2=//p" "$1/info"; }

# static_busybox: print the path of a statically linked busybox (the initramfs has no libc), or
# fail.
static_busybox() {
	local bb
	bb=$(command -v busybox || echo /bin/busybox)
	[ -x "$bb" ] && ! readelf -l "$bb" 2>/dev/null | grep -q 'interpreter' && echo "$bb"
}

# build_initramfs KDIR GUEST_BIN OUT [VSOCK_TEST]: an uncompressed newc cpio with busybox, /init,
# the vsock modules of KDIR (uncompressed, with their load order), the in-guest test program and,
# if given, the kernel's static vsock_test as /bin/vsock_test; with KCONF_BIN set, that program
# (the conformance table against the kernel) as /bin/uvsock-kconf.
# Uncompressed because decompressing under TCG costs boot time; it is a few MiB.
build_initramfs() {
	local kdir=$1 guest=$2 out=$3 here root bb
	here=$(dirname "${BASH_SOURCE[0]}")
	bb=$(static_busybox) || { ilog "need a static busybox (package busybox-static)"; return 1; }
	root=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-initramfs.XXXXXX") || return 1
	mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc/uvsock,lib/modules}
	cp "$bb" "$root/bin/busybox"
	cp "$here/init.sh" "$root/init"
	chmod 755 "$root/init"
	cp "$guest" "$root/bin/uvsock-guest"
	[ -n "${4:-}" ] && cp "$4" "$root/bin/vsock_test"
	[ -n "${KCONF_BIN:-}" ] && cp "$KCONF_BIN" "$root/bin/uvsock-kconf"
	# GUEST_OVERLAY: a directory copied over the tree last (Debian programs from debs_overlay,
	# a test's /etc/uvsock/script).
	[ -n "${GUEST_OVERLAY:-}" ] && cp -a "$GUEST_OVERLAY/." "$root/"
	cp -r "$kdir/modules/." "$root/lib/modules/"
	cp "$kdir/load-order" "$root/etc/uvsock/load-order"
	kinfo "$kdir" kver >"$root/etc/uvsock/kver"
	kinfo "$kdir" version >"$root/etc/uvsock/pkgver"
	# The kernel opens /dev/console before /init runs; without the node /init redirects itself
	# after mounting devtmpfs, so a non-root build still works (with no early error output).
	[ "$(id -u)" = 0 ] && mknod "$root/dev/console" c 5 1 2>/dev/null
	(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$out"
	local rc=$?
	rm -rf "$root"
	return $rc
}

# kernel_image KDIR: the file to pass to -kernel: the uncompressed vmlinux (booted through the
# PVH entry, saves the in-guest decompression) when it was recovered and the kernel has
# CONFIG_PVH=y, else the bzImage. UVSOCK_INTEROP_BOOT=bzimage forces the bzImage.
kernel_image() {
	if [ "${UVSOCK_INTEROP_BOOT:-}" != bzimage ] && [ -f "$1/vmlinux" ] &&
		grep -q '^CONFIG_PVH=y' "$1/config"; then
		echo "$1/vmlinux"
	else
		echo "$1/vmlinuz"
	fi
}

# qemu_args KDIR INITRD APPEND CONSOLE [VHOST_SOCK [CTL_SOCK]]: fill the array QEMU_ARGS.
# Environment: UVSOCK_INTEROP_MEM (MiB, 512), UVSOCK_INTEROP_SMP (2), INTEROP_REBOOT (0),
# UVSOCK_INTEROP_TCG_THREAD (single, the default here: one host thread for all vCPUs; or multi:
# one host thread per vCPU, QEMU's default), UVSOCK_INTEROP_PACKED=1 (packed=on),
# UVSOCK_INTEROP_INORDER=1 (in_order=on), UVSOCK_INTEROP_SHARE=off (guest memory not shared with
# the back-end: the mistake tests/clients/unshared-memory.sh makes on purpose).
# CONSOLE is "stdio" for an interactive console or a file name for the serial log. VHOST_SOCK is
# the vhost-user socket of uvsockd (QEMU connects as client); CTL_SOCK a Unix listener that
# becomes the guest's second serial port /dev/ttyS1 (the test control channel).
qemu_args() {
	local kdir=$1 initrd=$2 append=$3 console=$4 vsock=${5:-} ctl=${6:-}
	local mem=${UVSOCK_INTEROP_MEM:-512} smp=${UVSOCK_INTEROP_SMP:-2}
	# One host thread runs all vCPUs (thread=single): no true concurrency inside TCG, so no
	# cross-modifying-code race while the guest kernel patches its text (seen once with multi:
	# a 6.12 panic at 1.8 s); measured at no cost on this run (docs/interop.md).
	local thread=${UVSOCK_INTEROP_TCG_THREAD:-single}
	QEMU_ARGS=(-machine q35,memory-backend=mem0 -accel "tcg,thread=$thread" -cpu max -smp "$smp"
		-m "${mem}M"
		-object "memory-backend-memfd,id=mem0,size=${mem}M,share=${UVSOCK_INTEROP_SHARE:-on}"
		-nodefaults -display none -no-user-config
		-kernel "$(kernel_image "$kdir")" -initrd "$initrd"
		-append "console=ttyS0 panic=-1 loglevel=4 $append")
	# A guest reboot ends QEMU, unless INTEROP_REBOOT=1 (the guest-reboot case).
	[ "${INTEROP_REBOOT:-0}" = 1 ] || QEMU_ARGS+=(-no-reboot)
	if [ "$console" = stdio ]; then
		QEMU_ARGS+=(-serial mon:stdio)
	else
		QEMU_ARGS+=(-chardev "file,id=con0,path=$console" -serial chardev:con0)
	fi
	if [ -n "$ctl" ]; then
		QEMU_ARGS+=(-chardev "socket,id=ctl0,path=$ctl" -serial chardev:ctl0)
	fi
	if [ -n "$vsock" ]; then
		local dev="vhost-user-vsock-pci,chardev=vu0"
		[ "${UVSOCK_INTEROP_PACKED:-0}" = 1 ] && dev+=,packed=on
		# IN_ORDER needs a QEMU whose vhost-user-vsock passes it on (UVSOCK_INTEROP_QEMU).
		[ "${UVSOCK_INTEROP_INORDER:-0}" = 1 ] && dev+=,in_order=on
		QEMU_ARGS+=(-chardev "socket,id=vu0,path=$vsock" -device "$dev")
	fi
}

# wait_for_line FILE REGEX SECONDS [PID]: wait until a line of FILE matches the extended REGEX.
# Fails after SECONDS, or at once when PID (if given) has exited. Prints the matching line.
wait_for_line() {
	local file=$1 re=$2 limit=$3 pid=${4:-} end line
	end=$(($(date +%s%N) / 1000000 + limit * 1000))
	while :; do
		line=$(grep -a -m1 -E "$re" "$file" 2>/dev/null) && { echo "$line"; return 0; }
		[ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && {
			line=$(grep -a -m1 -E "$re" "$file" 2>/dev/null) && { echo "$line"; return 0; }
			return 2; }
		[ $(($(date +%s%N) / 1000000)) -ge "$end" ] && return 1
		sleep 0.1
	done
}

# now_ms: milliseconds since the epoch.
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# ---- the kernel's own vsock suite (tools/testing/vsock), for the vsock_test case ----

VT_SRC_PKG=linux-source-6.1

# The cached tools/testing/vsock of VT_SRC_PKG (fetch_vsock_test_src fills it).
vsock_test_src() { echo "$(interop_cache_dir)/src/$VT_SRC_PKG/tools/testing/vsock"; }

# Fetches VT_SRC_PKG with apt-get download (never installed) and keeps only its
# tools/testing/vsock in the cache. Returns 0 if it is cached afterwards.
fetch_vsock_test_src() {
	local dir tmp ver
	dir=$(vsock_test_src)
	[ -f "$dir/vsock_test.c" ] && return 0
	ver=$(apt-cache show --no-all-versions "$VT_SRC_PKG" 2>/dev/null | awk '/^Version:/ { print $2; exit }')
	[ -n "$ver" ] || { ilog "apt-cache does not know $VT_SRC_PKG"; return 2; }
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/uvsock-src.XXXXXX") || return 1
	if ! (cd "$tmp" && timeout 900 apt-get download -q "$VT_SRC_PKG=$ver" >download.log 2>&1); then
		ilog "apt-get download $VT_SRC_PKG=$ver failed"; rm -rf "$tmp"; return 2
	fi
	dpkg-deb -x "$tmp"/*.deb "$tmp/x" &&
		mkdir -p "$(dirname "$(dirname "$(dirname "$dir")")")" &&
		tar -xJf "$tmp/x/usr/src/$VT_SRC_PKG.tar.xz" -C "$(interop_cache_dir)/src" \
			--wildcards "$VT_SRC_PKG/tools/testing/vsock/*"
	local rc=$?
	rm -rf "$tmp"
	[ $rc = 0 ] && [ -f "$dir/vsock_test.c" ]
}

# build_vsock_test OUTDIR: OUTDIR/vsock_test (for the host, run through uvsock-run) and
# OUTDIR/vsock_test.static (for the initramfs) from the cached source. Returns 0 if both built.
build_vsock_test() {
	local src out=$1 f
	src=$(vsock_test_src)
	[ -f "$src/vsock_test.c" ] || return 1
	for f in "" -static; do
		gcc -g -O2 -I"$src" '-DARRAY_SIZE(x)=(sizeof(x)/sizeof((x)[0]))' -D_GNU_SOURCE \
			-Wno-pointer-sign -fno-strict-overflow -fno-strict-aliasing $f \
			-o "$out/vsock_test${f:+.static}" "$src"/vsock_test.c "$src"/timeout.c \
			"$src"/control.c "$src"/util.c 2>"$out/vsock_test-build.log" || return 1
	done
}

# ---- Debian programs for the guest (scripts/vm-shell.sh) and for tests (tests/clients) ----
# Programs come from Debian packages downloaded with apt-get download (the system's lists, or a
# suite's private configuration) and unpacked with dpkg-deb -x, never installed; only the files
# a program needs are kept: the program, the shared libraries of its NEEDED closure and the
# dynamic loader, each checked to resolve inside the tree (debs_overlay).

# The guest tools of scripts/vm-shell.sh: package and program pairs.
GUEST_TOOLS="socat:/usr/bin/socat ncat:/usr/bin/ncat openssh-client:/usr/bin/ssh"

# _lib_deps SUITE PKGS...: the direct Depends and Pre-Depends of PKGS that are shared-library
# packages (lib*, zlib1g; first alternatives, no virtual packages), less the ones that hold no
# library a program links (PAM modules, -bin, -common, -runtime and -data packages). One
# apt-cache call for all of PKGS.
_lib_deps() {
	local suite=$1
	shift
	_apt "$suite" apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
		--no-replaces --no-enhances "$@" 2>/dev/null |
		awk '$1 ~ /^[|]?(Pre)?Depends:$/ && $2 !~ /^</ { print $2 }' |
		grep -E '^(lib|zlib1g$)' | grep -vE '^libpam-|-(bin|common|runtime|data)$' | sort -u
}

# _pkg_versions SUITE PKGS...: "PKG=VERSION" of each of PKGS that has a candidate, one apt-cache
# call for all.
_pkg_versions() {
	local suite=$1
	shift
	_apt "$suite" apt-cache show --no-all-versions "$@" 2>/dev/null |
		awk '/^Package:/ { p = $2 } /^Version:/ && p != "" { print p "=" $2; p = "" }'
}

# fetch_debs NAME SUITE PKGS...: download PKGS and, recursively, the library packages they depend
# on (_lib_deps) at their candidate versions from SUITE ("" = the system's lists, else its
# private configuration), unpack them into one tree in the cache, remember it as NAME (for
# debs_cached) and set DEBS_ROOT to it. Cached by the list of package versions. Returns 0, 2 when
# a package cannot be resolved or downloaded (the archive is not reachable: callers skip), 1 on
# other errors.
fetch_debs() {
	local name=$1 suite=$2 cache level=() next all=() seen=" " p key dir tmp deb pv
	shift 2
	cache=$(interop_cache_dir)
	if [ -n "$suite" ]; then
		private_apt_opts "$suite" || return 1
		[ -n "$(ls "$cache/apt/$suite/lists/" 2>/dev/null | grep Packages)" ] ||
			_apt "$suite" apt-get update -q >"$cache/apt/$suite/update.log" 2>&1 ||
			{ ilog "debs: apt-get update for $suite failed"; return 2; }
	fi
	level=("$@")
	while [ ${#level[@]} -gt 0 ]; do
		for p in "${level[@]}"; do seen="$seen$p "; done
		# shellcheck disable=SC2207 # package names and versions have no spaces
		pv=($(_pkg_versions "$suite" "${level[@]}"))
		[ ${#pv[@]} = ${#level[@]} ] ||
			{ ilog "debs: ${suite:-system} lists lack some of ${level[*]}"; return 2; }
		all+=("${pv[@]}")
		next=()
		for p in $(_lib_deps "$suite" "${level[@]}"); do
			case $seen in *" $p "*) ;; *) next+=("$p") ;; esac
		done
		level=("${next[@]}")
	done
	key=$(printf '%s\n' "${all[@]}" | LC_ALL=C sort | sha256sum | cut -c1-16)
	dir=$cache/debs/$name.$key.v$INTEROP_CACHE_LAYOUT
	DEBS_ROOT=$dir/root
	mkdir -p "$cache/debs" || return 1
	if [ ! -f "$dir/.complete" ]; then
		exec {lockfd}>"$cache/.lock"
		flock -w 900 "$lockfd" || { ilog "cache lock busy"; exec {lockfd}>&-; return 1; }
		if [ ! -f "$dir/.complete" ]; then
			tmp=$(mktemp -d "$cache/tmp.XXXXXX")
			ilog "debs: downloading ${all[*]}${suite:+ (from $suite, private apt configuration)}"
			_apt_download "$suite" "$tmp" "${all[@]}" ||
				{ rm -rf "$tmp"; exec {lockfd}>&-; return 2; }
			rm -rf "$dir"; mkdir -p "$dir"
			for deb in "$tmp"/*.deb; do
				timeout 600 dpkg-deb -x "$deb" "$dir/root" ||
					{ rm -rf "$tmp" "$dir"; exec {lockfd}>&-; return 1; }
			done
			rm -rf "$dir/root/usr/share/doc" "$dir/root/usr/share/man" \
				"$dir/root/usr/share/locale" "$tmp"
			printf '%s\n' "${all[@]}" >"$dir/packages"
			touch "$dir/.complete"
		fi
		exec {lockfd}>&-
	fi
	echo "$dir" >"$cache/debs/$name.current"
	return 0
}

# debs_cached NAME: set DEBS_ROOT to the tree fetch_debs last unpacked as NAME, without looking at
# any package list. Returns 0, or 2 when there is none.
debs_cached() {
	local dir
	dir=$(cat "$(interop_cache_dir)/debs/$1.current" 2>/dev/null) || return 2
	[ -f "$dir/.complete" ] || return 2
	DEBS_ROOT=$dir/root
}

# _find_lib ROOT SONAME [RUNPATH...]: the file of SONAME in ROOT's library directories.
_find_lib() {
	local root=$1 so=$2 d
	shift 2
	for d in "$@" /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /lib /usr/lib; do
		[ -e "$root$d/$so" ] && { echo "$root$d/$so"; return 0; }
	done
	return 1
}

# debs_overlay ROOT OUT PROGRAMS...: copy each program (a path inside ROOT) to the same path
# under OUT, with every shared library of its NEEDED closure (searched in ROOT's library
# directories and the program's RUNPATH) put in OUT/lib/x86_64-linux-gnu and the dynamic loader
# as OUT/lib64/ld-linux-x86-64.so.2. A library no package holds is an error naming it.
debs_overlay() {
	local root=$1 out=$2 f so lib rp queue=() have=" "
	shift 2
	mkdir -p "$out/lib/x86_64-linux-gnu" "$out/lib64" || return 1
	cp -L "$root/lib64/ld-linux-x86-64.so.2" "$out/lib64/" 2>/dev/null ||
		cp -L "$root/usr/lib64/ld-linux-x86-64.so.2" "$out/lib64/" ||
		{ ilog "debs: no dynamic loader in $root"; return 1; }
	for f in "$@"; do
		[ -f "$root$f" ] || { ilog "debs: no $f in the packages"; return 1; }
		mkdir -p "$out$(dirname "$f")"
		cp -L "$root$f" "$out$f"
		queue+=("$root$f")
	done
	while [ ${#queue[@]} -gt 0 ]; do
		f=${queue[0]}
		queue=("${queue[@]:1}")
		rp=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
		for so in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			case $have in *" $so "*) continue ;; esac
			have="$have$so "
			case $so in ld-linux-x86-64.so.2) continue ;; esac
			lib=$(_find_lib "$root" "$so" ${rp//:/ }) ||
				{ ilog "debs: $(basename "$f") needs $so, which no downloaded package holds"; return 1; }
			cp -L "$lib" "$out/lib/x86_64-linux-gnu/$so"
			queue+=("$lib")
		done
	done
}
