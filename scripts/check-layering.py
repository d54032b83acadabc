#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks the include layering of the tree against the layer table of docs/architecture.md.

The layers are the folders of src/ (the library, and ctlproto, the control protocol's static
library), and the programs' folders daemon/ (uvsockd) and tools/ (uvsock-stat, uvsock-ctl...).
Every `#include "..."` in a layer must name a file of its own folder or of one of the layers
that layer may use (ALLOWED below): nothing of src/ may include daemon/ or tools/, and the
library's layers may not include ctlproto. Public headers (include/uvsock/*.h) may be included
only by the layers that implement them, and must not include anything from src/. The include
graph of the files must also be acyclic. Exit 0 when the tree holds, 1 with one line per
violation.

  check-layering.py [--root DIR] [--graph]
--graph prints the folder-level include graph (what each layer includes, with counts).
"""
import argparse
import os
import re
import sys

# Layer -> the layers it may include (its own folder is always allowed). Keep in step with the
# "Layers" table of docs/architecture.md.
ALLOWED = {
    "util": set(),
    "vsock": {"util"},
    "vring": {"util"},
    "vhost_user": {"util", "vring"},
    "ops": {"util", "vsock"},
    "device": {"util", "vsock", "vring", "vhost_user", "ops", "uvsock"},
    "driver": {"util", "vsock", "vring", "vhost_user"},
    "lib": {"util", "vsock", "driver", "uvsock"},
    # Not in libuvsock.so: the control protocol (a static library) and the preload library.
    "ctlproto": {"util"},
    "shim": {"util", "ctlproto"},
    # The programs (top-level folders, not src/).
    "daemon": {"util", "vsock", "vring", "device", "ops", "ctlproto"},
    "tools": {"util", "ops", "ctlproto", "examples"},
}
PUBLIC = "uvsock"  # include/uvsock/*.h
PROGRAMS = ("daemon", "tools")  # layers that are top-level folders

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def sources(root):
    for top in ("src", os.path.join("include", PUBLIC)) + PROGRAMS:
        base = os.path.join(root, top)
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield os.path.join(dirpath, f)


def layer_of(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "include":
        return PUBLIC
    if rel[0] == "src":
        return rel[1] if len(rel) > 2 else None
    return rel[0] if len(rel) > 1 else None


def resolve(root, path, inc):
    """The repository file an include names, or None (system or generated header)."""
    for base in (os.path.dirname(path), os.path.join(root, "src"), os.path.join(root, "include"),
                 root):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(cand):
            return cand
    return None


def check(root):
    errors, graph, edges = [], {}, {}
    for path in sources(root):
        src_layer = layer_of(root, path)
        rel = os.path.relpath(path, root)
        if src_layer is None:
            errors.append(f"{rel}: not inside a layer folder")
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = resolve(root, path, m.group(1))
                if target is None:
                    errors.append(f"{rel}:{lineno}: includes \"{m.group(1)}\", not a file of the tree")
                    continue
                dst_layer = layer_of(root, target)
                edges.setdefault(path, set()).add(target)
                if dst_layer == src_layer:
                    continue
                graph.setdefault(src_layer, {}).setdefault(dst_layer, 0)
                graph[src_layer][dst_layer] += 1
                if src_layer == PUBLIC:
                    ok = False
                else:
                    ok = dst_layer in ALLOWED.get(src_layer, set())
                if not ok:
                    errors.append(f"{rel}:{lineno}: {src_layer} may not include {dst_layer} "
                                  f"(\"{m.group(1)}\"): it is below or beside {src_layer} "
                                  "in the layer list")
    errors += cycles(root, edges)
    return errors, graph


def cycles(root, edges):
    """One error per include cycle found by a depth-first walk of the file graph."""
    out, state = [], {}

    def walk(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                loop = stack[stack.index(m):] + [m]
                out.append("include cycle: " + " -> ".join(os.path.relpath(x, root) for x in loop))
            elif m not in state:
                walk(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            walk(n, [])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--graph", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    errors, graph = check(root)
    if args.graph:
        order = list(ALLOWED) + [PUBLIC]
        for src in order:
            deps = graph.get(src, {})
            line = ", ".join(f"{d} ({deps[d]})" for d in order if d in deps)
            print(f"{src:10} -> {line or '-'}")
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layering violation(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
