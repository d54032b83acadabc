#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What --isolate costs at N VMs (docs/security.md "Memory a guest makes us touch").

Starts uvsockd with N VMs, each in a sibling group of its own (so --isolate makes N workers),
once without and once with --isolate, RUNS times each, alternating, and prints medians of:
  start   seconds from exec to the control socket answering (it starts once every VM's device
          is up, in both modes)
  rss     VmRSS summed over uvsockd and its workers, KiB (pages shared after fork counted in each)
  pss     Pss summed the same way (shared pages split between the processes), KiB
  threads threads summed the same way
  procs   processes
with no VMM attached (the daemon's own cost; guest memory is the VMs'). Nothing is asserted.

Usage: bench/isolate-cost.py [--uvsockd PATH] [--vms N] [--runs R]
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def field(path, key):
    """The number after "key:" in a /proc file of "key: value kB" lines (0 if none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ':'):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def status(pid, key):
    return field(f'/proc/{pid}/status', key)


def pss(pid):
    return field(f'/proc/{pid}/smaps_rollup', 'Pss')


def children(pid):
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def answers(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(b'v1 version\n')
        s.settimeout(2)
        return s.recv(4096).startswith(b'{')
    except OSError:
        return False
    finally:
        s.close()


def one(uvsockd, n, isolate):
    d = tempfile.mkdtemp(prefix='uvsock-isocost-')
    args = [uvsockd, '--log-level=warn']
    if isolate:
        args.append('--isolate')
    for i in range(n):
        args += ['--vm', f'guest-cid={i + 3},socket={d}/vm{i}.sock,uds-path={d}/vm{i}.vsock,'
                         f'groups=g{i}']
    ctl = f'{d}/vm0.sock.ctl'
    log = open(f'{d}/uvsockd.log', 'w')
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        while not answers(ctl):
            if p.poll() is not None or time.monotonic() - t0 > 120:
                raise SystemExit(f'uvsockd did not start (see {d}/uvsockd.log)')
            time.sleep(0.005)
        start = time.monotonic() - t0
        time.sleep(0.5)
        procs = [p.pid] + children(p.pid)
        r = {'start': start, 'procs': len(procs),
             'rss': sum(status(q, 'VmRSS') for q in procs),
             'pss': sum(pss(q) for q in procs),
             'threads': sum(status(q, 'Threads') for q in procs)}
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--uvsockd', default=os.environ.get('UVSOCKD', 'build/daemon/uvsockd'))
    ap.add_argument('--vms', type=int, default=64)
    ap.add_argument('--runs', type=int, default=5)
    o = ap.parse_args()
    res = {False: [], True: []}
    for _ in range(o.runs):
        for iso in (False, True):
            res[iso].append(one(o.uvsockd, o.vms, iso))
    print(f'uvsockd with {o.vms} idle VMs (each its own group), medians of {o.runs} runs')
    print('| mode | start s | RSS KiB (sum) | PSS KiB (sum) | threads | processes |')
    print('|---|---:|---:|---:|---:|---:|')
    for iso in (False, True):
        m = {k: statistics.median(r[k] for r in res[iso]) for k in res[iso][0]}
        print(f"| {'--isolate' if iso else 'default'} | {m['start']:.3f} | {m['rss']:.0f} | "
              f"{m['pss']:.0f} | {m['threads']:.0f} | {m['procs']:.0f} |")
    return 0


if __name__ == '__main__':
    sys.exit(main())
