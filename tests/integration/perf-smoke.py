#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Smoke test of uvsock-perf itself (nothing timed, no speed asserted): a --quick run of every
# measurement against the uvsockd of this build, then the JSON, CSV and terminal output are
# checked for their schema: every transport is there, every number is a
# finite non-negative value, percentiles are ordered, the memory section has its records.
# A --quick --dgram run: every datagram transport, one run each, sent = received + lost, the
# CSV rows. The kind of build (this program's, the back-end's --version) on the first line and in
# the JSON, the worst run beside the median. A run against a uvsockd started here as a running
# back-end (--socket, --backend-pid, --end count). Also: --help lists the datagram options, and
# a usage error exits 2.
# Usage: perf-smoke.py UVSOCK_PERF UVSOCKD
import json
import math
import os
import subprocess
import sys
import tempfile

perf, uvsockd = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("not ok: " + what)


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


with tempfile.TemporaryDirectory(prefix="uvsock-perf-smoke-") as d:
    js, csv = os.path.join(d, "r.json"), os.path.join(d, "r.csv")
    p = subprocess.run([perf, "--quick", "--in-process", "--uvsockd", uvsockd, "--json", js,
                        "--csv", csv, "--quiet"], capture_output=True, text=True, timeout=240)
    check(p.returncode == 0, "quick run exits 0 (stderr: %s)" % p.stderr[-500:])
    if p.returncode == 0:
        r = json.load(open(js))
        for k in ("stream", "rtt", "memory"):
            check(isinstance(r.get(k), list) and r[k], "JSON has a non-empty '%s' list" % k)
        seen = set()
        for s in r.get("stream", []):
            for k in ("transport", "size", "gbps", "cpu_s_per_gb", "rx_mode", "streams",
                      "gbps_min", "gbps_max", "mbit_per_cpu_pct"):
                check(k in s, "stream entry has '%s': %r" % (k, s))
            check(all(number(s.get(k)) for k in ("size", "gbps", "cpu_s_per_gb")),
                  "stream numbers: %r" % s)
            check(s.get("gbps_min", 1) <= s.get("gbps", 0) <= s.get("gbps_max", -1),
                  "min <= median <= max: %r" % s)
            check(s.get("rx_mode") in ("64k", "size"), "rx_mode: %r" % s)
            seen.add(s.get("transport"))
        for t in ("vsock-g2h", "vsock-h2g", "tcp", "tcp-nodelay", "unix", "shm-ring",
                  "inproc-g2h", "inproc-h2g", "vsock-seqpacket-g2h", "unix-seqpacket"):
            check(t in seen, "stream transport %s measured" % t)
        check(any(s.get("streams", 1) > 1 for s in r.get("stream", [])), "parallel streams")
        rseen = set()
        for s in r.get("rtt", []):
            for k in ("transport", "size", "p50_us", "p99_us", "mean_us", "p999_us"):
                check(k in s, "rtt entry has '%s': %r" % (k, s))
            check(all(number(s.get(k)) for k in ("size", "p50_us", "p99_us")), "rtt: %r" % s)
            check(s.get("p50_us", 1) <= s.get("p99_us", 0) <= s.get("p999_us", -1),
                  "p50 <= p99 <= p99.9: %r" % s)
            rseen.add(s.get("transport"))
        for t in ("vsock-g2h", "tcp", "tcp-nodelay", "unix", "shm-ring"):
            check(t in rseen, "rtt transport %s measured" % t)
        names = {m.get("name") for m in r.get("memory", [])}
        for n in ("rss_per_idle_conn", "rss_per_flooded_conn", "vms_ratio", "idle_conns"):
            check(n in names, "memory record %s" % n)
        lines = open(csv).read().splitlines()
        check(lines and lines[0].startswith("kind,transport,size,"), "CSV header")
        check(len(lines) == 1 + len(r["stream"]) + len(r["rtt"]), "CSV has one row per point")
        check("ratio to unix" in p.stdout and "round trips" in p.stdout, "terminal table")
        ver = subprocess.run([uvsockd, "--version"], capture_output=True, text=True).stdout
        b = r.get("build", {})
        check(b.get("uvsock_perf") in ("optimized", "debug", "asan", "asan+debug", "tsan",
                                       "tsan+debug"), "JSON build of uvsock-perf: %r" % b)
        check("(build: %s)" % b.get("backend") in ver, "JSON build of the back-end %r is what "
              "its --version says: %r" % (b, ver))
        check(p.stdout.startswith("uvsock-perf: back-end ") and
              ("build: uvsock-perf %s, back-end %s" % (b.get("uvsock_perf"), b.get("backend")))
              in p.stdout.splitlines()[0], "the first line names both builds")
        check(all(s.get("gbps_worst") == s.get("gbps_min") for s in r.get("stream", [])),
              "stream: the worst run is the slowest")
        check(all(s.get("p99_worst_us", -1) >= s.get("p99_us", 0) and
                  s.get("p50_worst_us", -1) >= s.get("p50_us", 0) for s in r.get("rtt", [])),
              "rtt: the worst run is at least the median")
    # A running back-end: --socket, --backend-pid, --end count (readers stop at the count).
    sock, uds = os.path.join(d, "vm.sock"), os.path.join(d, "vm.vsock")
    daemon = subprocess.Popen([uvsockd, "--vm", "guest-cid=3,socket=%s,uds-path=%s" % (sock, uds),
                               "--log-level", "warn"])
    try:
        for _ in range(200):
            if os.path.exists(sock + ".ctl") or daemon.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"])
        p = subprocess.run([perf, "--quick", "--socket", sock, "--uds-path", uds,
                            "--backend-pid", str(daemon.pid), "--end", "count", "--tests",
                            "stream", "--transports", "vsock-g2h,vsock-h2g", "--json", js,
                            "--quiet"], capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, "--socket --backend-pid --end count exits 0 (stderr: %s)"
              % p.stderr[-500:])
        if p.returncode == 0:
            r = json.load(open(js))
            check(r.get("end") == "count" and
                  {s.get("transport") for s in r.get("stream", [])} == {"vsock-g2h", "vsock-h2g"}
                  and all(number(s.get("cpu_backend_s_per_gb")) for s in r["stream"]),
                  "--end count run: both directions, the back-end's CPU: %r" % r.get("stream"))
            check(r.get("build", {}).get("backend", "").startswith("unknown"),
                  "a back-end not started here is of unknown build")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    p = subprocess.run([perf, "--quick", "--dgram", "--dgram-locked", "--dgram-senders", "1,4",
                        "--uvsockd", uvsockd, "--json", js, "--csv", csv, "--quiet"],
                       capture_output=True, text=True, timeout=240)
    check(p.returncode == 0, "--dgram run exits 0 (stderr: %s)" % p.stderr[-500:])
    if p.returncode == 0:
        r = json.load(open(js))
        dg = r.get("datagram", [])
        check(isinstance(dg, list) and dg, "JSON has a non-empty 'datagram' list")
        check(not r.get("stream") and not r.get("rtt"), "--dgram measures datagrams only")
        seen = set()
        for s in dg:
            for k in ("size", "senders", "mbps", "mbps_min", "mbps_max", "tx_mbps", "sent",
                      "received", "lost", "counted_drops", "ratio_udp"):
                check(number(s.get(k)), "datagram '%s': %r" % (k, s))
            check(s.get("runs") == 1 and s.get("size") == 4096, "datagram runs/size: %r" % s)
            check(s.get("sent", 0) > 0 and s.get("sent") == s.get("received", 0) + s.get("lost", 0)
                  + s.get("bad_length", 0), "sent = received + lost: %r" % s)
            check(s.get("bad_length") == 0, "no datagram arrives with a wrong length: %r" % s)
            check(s.get("mbps_min", 1) <= s.get("mbps", 0) <= s.get("mbps_max", -1),
                  "min <= median <= max: %r" % s)
            seen.add((s.get("transport"), s.get("senders")))
        for t in ("udp", "unix-dgram", "uvsock-loopback", "uvsock-loopback-locked", "uvsockd-g2h"):
            for n in (1, 4):
                check((t, n) in seen, "datagram transport %s with %d senders" % (t, n))
        lines = open(csv).read().splitlines()
        check(len(lines) == 1 + len(dg) and all(x.startswith("dgram,") for x in lines[1:]),
              "CSV has one dgram row per datagram point")
        check("DATAGRAM" in p.stdout and "ratio to udp" in p.stdout, "datagram table")
    h = subprocess.run([perf, "--help"], capture_output=True, text=True, timeout=30)
    check(h.returncode == 0 and "--dgram" in h.stdout, "--help lists the datagram options")
    b = subprocess.run([perf, "--no-such-option"], capture_output=True, text=True, timeout=30)
    check(b.returncode == 2, "usage error exits 2")
    b = subprocess.run([perf, "--socket", "/nonexistent"], capture_output=True, text=True,
                       timeout=30)
    check(b.returncode == 2, "--socket without --uds-path exits 2")

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
