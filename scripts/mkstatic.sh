#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the installed static libuvsock.a from the internal archive (meson.build):
#   mkstatic.sh IN.a OUT.a SCRATCHDIR
# Every member of IN.a is linked into one relocatable object (ld -r), whose hidden symbols
# (everything but the declarations of include/uvsock/*.h) are then made local, so a program
# linking the archive sees only the uvsock_* names, as with the shared library.
set -eu
in=$1 out=$2 dir=$3
mkdir -p "$dir"
ld -r --whole-archive "$in" -o "$dir/uvsock-all.o"
objcopy --localize-hidden "$dir/uvsock-all.o" "$dir/uvsock.o"
rm -f "$out" "$dir/uvsock-all.o"
ar rcD "$out" "$dir/uvsock.o"
rm -f "$dir/uvsock.o"
