# SPDX-License-Identifier: MIT
# Shared shell functions of the real-guest interop run (tests/interop/interop.sh), of
# scripts/fetch-kernels.sh and of scripts/vm-shell.sh: where the cache lives, fetching and
# unpacking the two Debian guest kernels (never installing them; only fetch_kernel touches the
# network, and the test itself only looks in the cache with kernel_cached), recovering the
# uncompressed vmlinux from a bzImage, computing the module load order from modules.dep, building
# the initramfs, starting QEMU, and waiting with a deadline for a line to appear in a file.
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

# The guest kernels of the run: Debian meta packages (6.1 and 6.12). UVSOCK_INTEROP_KERNELS
# overrides, for the test and for scripts/fetch-kernels.sh alike.
INTEROP_KERNELS=${UVSOCK_INTEROP_KERNELS:-"linux-image-amd64 linux-image-6.12-amd64"}

# Modules the guest needs (with everything modules.dep says they need). Built-in ones are skipped.
INTEROP_MODULES="virtio_pci vmw_vsock_virtio_transport vsock_loopback vsock_diag vsockmon"

ilog() { echo "interop: $*" >&2; }

# The concrete image package a meta package (linux-image-amd64, linux-image-6.12-amd64) depends on.
_resolve_image_pkg() {
	apt-cache depends "$1" 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
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

# _kernel_key META PKG VER: the cache directory name of one kernel package version.
_kernel_key() { echo "$1.${2}_${3//:/%}.v$INTEROP_CACHE_LAYOUT"; }

# kernel_cached META: set KDIR to META's kernel in the cache without fetching anything: the
# version the local package lists resolve META to when that one is cached, else the newest
# cached one. Returns 0, or 2 when nothing is cached for META (scripts/fetch-kernels.sh fetches).
kernel_cached() {
	local meta=$1 cache pkg ver dir
	cache=$(interop_cache_dir)
	pkg=$(_resolve_image_pkg "$meta")
	if [ -n "$pkg" ]; then
		ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/ { print $2; exit }')
		dir="$cache/kernels/$(_kernel_key "$meta" "$pkg" "$ver")"
		if [ -n "$ver" ] && [ -f "$dir/.complete" ]; then
			KDIR=$dir
			return 0
		fi
	fi
	dir=$(ls -d "$cache/kernels/$meta".*".v$INTEROP_CACHE_LAYOUT"/ 2>/dev/null | tail -n 1)
	if [ -n "$dir" ] && [ -f "$dir/.complete" ]; then
		KDIR=${dir%/}
		return 0
	fi
	return 2
}

# fetch_kernel META: make sure the kernel that META (a Debian meta package) currently resolves to
# is unpacked in the cache, and set KDIR to its directory. The directory holds: vmlinuz, vmlinux
# (when it could be recovered), config, modules/ (only the modules the guest needs, uncompressed),
# load-order (their paths under modules/, dependencies first), info (package, version, kver).
# Returns 0, or 2 when the package archive cannot be reached (caller decides to skip), 1 on errors.
fetch_kernel() {
	local meta=$1 cache pkg ver key dir tmp deb kver m rel
	cache=$(interop_cache_dir)
	mkdir -p "$cache" || { ilog "cannot create cache dir $cache"; return 1; }
	pkg=$(_resolve_image_pkg "$meta")
	if [ -z "$pkg" ] && [ "$(id -u)" = 0 ]; then
		ilog "apt-cache does not know $meta; running apt-get update"
		timeout 600 apt-get update -qq >/dev/null 2>&1 || true
		pkg=$(_resolve_image_pkg "$meta")
	fi
	if [ -z "$pkg" ]; then
		# Offline, but maybe a previous run cached something for this meta package.
		if kernel_cached "$meta"; then
			ilog "$meta not resolvable; using cached $(tr '\n' ' ' <"$KDIR/info")"
			return 0
		fi
		ilog "cannot resolve $meta to a kernel image package (no package lists?)"
		return 2
	fi
	ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/ { print $2; exit }')
	[ -n "$ver" ] || { ilog "no version for $pkg"; return 2; }
	key=$(_kernel_key "$meta" "$pkg" "$ver")
	dir="$cache/kernels/$key"
	KDIR=$dir
	[ -f "$dir/.complete" ] && return 0

	mkdir -p "$cache/kernels"
	exec {lockfd}>"$cache/.lock"
	flock -w 900 "$lockfd" || { ilog "cache lock busy"; exec {lockfd}>&-; return 1; }
	if [ -f "$dir/.complete" ]; then exec {lockfd}>&-; return 0; fi
	tmp=$(mktemp -d "$cache/tmp.XXXXXX")
	ilog "downloading $pkg=$ver"
	if ! (cd "$tmp" && timeout 900 apt-get download -q "$pkg=$ver" >download.log 2>&1); then
		sed 's/^/  /' "$tmp/download.log" >&2
		rm -rf "$tmp"; exec {lockfd}>&-
		ilog "apt-get download $pkg=$ver failed"
		return 2
	fi
	deb=$(ls "$tmp"/*.deb | head -n 1)
	timeout 600 dpkg-deb -x "$deb" "$tmp/x" || { rm -rf "$tmp"; exec {lockfd}>&-; return 1; }
	kver=$(ls "$tmp/x/lib/modules" | head -n 1)
	if [ ! -f "$tmp/x/lib/modules/$kver/modules.dep" ]; then
		# The package leaves modules.dep to the installer; compute it in the unpacked tree.
		PATH=$PATH:/usr/sbin:/sbin depmod -b "$tmp/x" "$kver" || { ilog "depmod failed"; rm -rf "$tmp"; exec {lockfd}>&-; return 1; }
	fi
	rm -rf "$dir"; mkdir -p "$dir/modules"
	cp "$tmp/x/boot/vmlinuz-$kver" "$dir/vmlinuz"
	cp "$tmp/x/boot/config-$kver" "$dir/config"
	for m in modules.dep modules.order modules.builtin; do
		[ -f "$tmp/x/lib/modules/$kver/$m" ] && cp "$tmp/x/lib/modules/$kver/$m" "$dir/$m"
	done
	: >"$dir/load-order"
	for rel in $(_module_order "$tmp/x" "$kver" $INTEROP_MODULES); do
		local src="$tmp/x/lib/modules/$kver/$rel" out="$dir/modules/${rel%%.ko*}.ko"
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
	printf 'package=%s\nversion=%s\nkver=%s\nmeta=%s\n' "$pkg" "$ver" "$kver" "$meta" >"$dir/info"
	rm -rf "$tmp"
	touch "$dir/.complete"
	exec {lockfd}>&-
	ilog "cached $pkg $ver ($kver) in $dir"
	return 0
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
# if given, the kernel's static vsock_test as /bin/vsock_test.
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
# one host thread per vCPU, QEMU's default).
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
		-object "memory-backend-memfd,id=mem0,size=${mem}M,share=on"
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
		QEMU_ARGS+=(-chardev "socket,id=vu0,path=$vsock" -device vhost-user-vsock-pci,chardev=vu0)
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
