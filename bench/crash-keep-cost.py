#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What crash survival costs a vhost-user configuration message (docs/upgrade.md, "Crash survival").

Under --isolate the worker sends the main process a record of the VM's configuration (a sealed
memfd and its fds) after every message that may change it, before the reply. This starts uvsockd
with one VM, once without and once with --isolate, connects as a minimal vhost-user front-end
(GET_FEATURES, SET_OWNER) and times COUNT rounds of SET_FEATURES (a configuration message)
followed by GET_FEATURES (a question, whose reply orders the round), RUNS times, and prints the
microseconds per round of each run and their median. With --fake-fdstore PATH
(tests/harness/fake-fdstore), a third row: the default mode storing each record in a (fake)
service manager's fd store (daemon/fdstore.c). Nothing is asserted.

Usage: bench/crash-keep-cost.py [--uvsockd PATH] [--fake-fdstore PATH] [--count N] [--runs R]
"""
import argparse
import os
import statistics
import socket
import struct
import subprocess
import tempfile
import time

GET_FEATURES, SET_FEATURES, SET_OWNER = 1, 2, 3
F_VERSION_1, F_PROTOCOL_FEATURES = 1 << 32, 1 << 30


def request(s, req, payload=b""):
    s.sendall(struct.pack("<III", req, 1, len(payload)) + payload)


def reply(s):
    _, _, n = struct.unpack("<III", s.recv(12, socket.MSG_WAITALL))
    return s.recv(n, socket.MSG_WAITALL)


def measure(uvsockd, isolate, count, runs, fake_fdstore=None):
    with tempfile.TemporaryDirectory(prefix="uvsock-keep-") as d:
        sock = os.path.join(d, "vm3.sock")
        args = [uvsockd, "--vm", "guest-cid=3,socket=%s,uds-path=%s/vm3.vsock,groups=g3" % (sock, d),
                "--log-level=warn"] + (["--isolate"] if isolate else [])
        if fake_fdstore:
            args = [fake_fdstore, "--"] + args
        with open(os.path.join(d, "log"), "w") as log:
            p = subprocess.Popen(args, stderr=log)
        try:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            request(s, GET_FEATURES)
            want = struct.unpack("<Q", reply(s))[0] & (F_VERSION_1 | F_PROTOCOL_FEATURES)
            request(s, SET_OWNER)
            out = []
            for _ in range(runs):
                t = time.perf_counter()
                for _ in range(count):
                    request(s, SET_FEATURES, struct.pack("<Q", want))
                    request(s, GET_FEATURES)
                    reply(s)
                out.append((time.perf_counter() - t) / count * 1e6)
            s.close()
            return out
        finally:
            p.terminate()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uvsockd", default="build/daemon/uvsockd")
    ap.add_argument("--fake-fdstore", default=None)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with open("/proc/loadavg") as f:
        print("load average:", f.read().split()[0])
    for isolate in (False, True):
        r = measure(a.uvsockd, isolate, a.count, a.runs)
        print("%-12s us per SET_FEATURES + GET_FEATURES: %s  median %.1f" %
              ("--isolate" if isolate else "one process", " ".join("%.1f" % x for x in r),
               statistics.median(r)))
    if a.fake_fdstore:
        r = measure(a.uvsockd, False, a.count, a.runs, a.fake_fdstore)
        print("%-12s us per SET_FEATURES + GET_FEATURES: %s  median %.1f" %
              ("fd store", " ".join("%.1f" % x for x in r), statistics.median(r)))


if __name__ == "__main__":
    main()
