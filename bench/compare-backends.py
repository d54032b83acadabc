#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Two vhost-user vsock back-ends in one run (bench/README.md, "Comparing two back-ends"):
# uvsock-perf --runs 1 against each back-end in turn, for N rounds (A B, B A, A B ...: the order
# alternates so that neither always runs second on a machine whose load drifts), then the median
# of the rounds per point and the ratio B / A. The Unix column is measured in every uvsock-perf
# run: its spread between the two back-ends' runs is the noise of the comparison.
#
# Usage: compare-backends.py [--rounds N] [--perf PATH] [--json OUT] A B [-- UVSOCK-PERF ARGS]
#   A, B: NAME=SOCKET,UDS[,PID]   (PID: the back-end's process, for its CPU per byte)
# Example:
#   compare-backends.py uvsockd=/tmp/a.sock,/tmp/a.vsock,1234 \
#       vdv=/tmp/b.sock,/tmp/b.vsock,5678 -- --tests stream,rtt --sizes 64,4K,64K --end count
import json
import statistics
import subprocess
import sys
import tempfile


def main(argv):
    rounds, perf, out, extra, specs = 5, "uvsock-perf", None, [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            extra = argv[i + 1:]
            break
        if a in ("--rounds", "--perf", "--json") and i + 1 < len(argv):
            if a == "--rounds":
                rounds = int(argv[i + 1])
            elif a == "--perf":
                perf = argv[i + 1]
            else:
                out = argv[i + 1]
            i += 2
            continue
        name, _, rest = a.partition("=")
        parts = rest.split(",")
        if not name or len(parts) not in (2, 3):
            sys.exit("compare-backends.py: back-end '%s': NAME=SOCKET,UDS[,PID]" % a)
        specs.append((name, parts))
        i += 1
    if len(specs) != 2:
        sys.exit("usage: compare-backends.py [--rounds N] [--perf PATH] [--json OUT] "
                 "NAME=SOCKET,UDS[,PID] NAME=SOCKET,UDS[,PID] [-- UVSOCK-PERF ARGS]")
    samples = {}  # (backend, kind, transport, size, rx) -> [value]
    builds = {}
    for r in range(rounds):
        order = specs if r % 2 == 0 else specs[::-1]
        for name, (sock, uds, *pid) in order:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [perf, "--socket", sock, "--uds-path", uds, "--runs", "1", "--quiet",
                       "--json", f.name] + (["--backend-pid", pid[0]] if pid else []) + extra
                print("round %d/%d: %s" % (r + 1, rounds, " ".join(cmd)), file=sys.stderr)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                d = json.load(open(f.name))
            builds[name] = d.get("build", {}).get("uvsock_perf", "?")
            for s in d["stream"]:
                if s["streams"] != 1:
                    continue
                k = (s["transport"], s["size"], s["rx_mode"])
                samples.setdefault((name, "gbps") + k, []).append(s["gbps"])
                samples.setdefault((name, "cpu") + k, []).append(s["cpu_backend_s_per_gb"])
            for s in d["rtt"]:
                k = (s["transport"], s["size"], "rtt")
                samples.setdefault((name, "p50") + k, []).append(s["p50_us"])
    a, b = specs[0][0], specs[1][0]
    keys = sorted({k[2:] for k in samples if k[0] == a} & {k[2:] for k in samples if k[0] == b},
                  key=lambda k: (k[0], k[2], k[1]))
    med = {k: statistics.median(v) for k, v in samples.items()}
    worst = {k: (min(v) if k[1] == "gbps" else max(v)) for k, v in samples.items()}
    print("Back-ends %s and %s, %d alternating rounds, medians (worst round in brackets); "
          "uvsock-perf build %s" % (a, b, rounds, builds.get(a)))
    print()
    print("| transport | size | rx | %s Gbit/s | %s Gbit/s | %s / %s | %s back-end CPU s/GB | "
          "%s back-end CPU s/GB |" % (a, b, b, a, a, b))
    print("|---|---|---|---|---|---|---|---|")
    for t, size, rx in keys:
        if rx == "rtt":
            continue
        ga, gb = med[(a, "gbps", t, size, rx)], med[(b, "gbps", t, size, rx)]
        print("| %s | %s | %s | %.3g (%.3g) | %.3g (%.3g) | %.2fx | %.3g | %.3g |" % (
            t, size, rx, ga, worst[(a, "gbps", t, size, rx)], gb,
            worst[(b, "gbps", t, size, rx)], gb / ga if ga else 0,
            med[(a, "cpu", t, size, rx)], med[(b, "cpu", t, size, rx)]))
    rt = [k for k in keys if k[2] == "rtt"]
    if rt:
        print()
        print("| transport | size | %s p50 us | %s p50 us | %s / %s |" % (a, b, b, a))
        print("|---|---|---|---|---|")
        for t, size, _ in rt:
            pa, pb = med[(a, "p50", t, size, "rtt")], med[(b, "p50", t, size, "rtt")]
            print("| %s | %s | %.1f | %.1f | %.2fx |" % (t, size, pa, pb, pb / pa if pa else 0))
    if out:
        json.dump({"rounds": rounds, "backends": [a, b],
                   "samples": [{"backend": k[0], "what": k[1], "transport": k[2], "size": k[3],
                                "rx_mode": k[4], "values": v} for k, v in samples.items()]},
                  open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
