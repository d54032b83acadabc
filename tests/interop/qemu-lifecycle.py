#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Back-end restart and live migration with a real guest (docs/interop.md, "Back-end restart and
live migration"): QEMU with contrib/qemu's patches (scripts/build-qemu.sh), a Debian guest kernel
under TCG, uvsockd, and the in-guest program uvsock-lifecycle driven over the guest's second
serial port.

  reconnect  uvsockd is killed (SIGTERM, SIGKILL, SIGTERM) and started again three times while
             the guest holds a connection to the host and listens: each time the guest's old
             socket ends with ECONNRESET, the host's old connection ends, new connections work
             both ways, the CID is the same and QEMU is the same process.
  migrate    two uvsockd processes serve the same CID on different socket paths; a second QEMU
             waits with -incoming; the guest streams data from the host (checked byte by byte)
             and rewrites memory while it migrates. The migration completes, the guest's memory
             and every byte it received are intact, its old connections end with ECONNRESET and
             new ones work both ways on the destination.
  stopped    the same, but the source is stopped first (QMP stop: the device is suspended,
             GET_VRING_BASE), migrated while stopped, and the destination waits paused until
             QMP cont.
  snapshot   the same, stopped, but saved to a file (exec:cat > FILE); a new QEMU loads that
             file (-incoming exec:cat FILE) on the second uvsockd and continues after cont.

The live upgrade cases need no patch: stock QEMU (the system's 7.2, or the newer one of the
interop cache, scripts/fetch-qemu.sh), its vhost-user socket without reconnect (docs/upgrade.md):

  upgrade          64 MiB each way at once (guest to host and host to guest, each byte checked
                   against the pattern, counted to the end of each stream) and 100 idle
                   connections (50 opened by the guest, 50 by the host); uvsock-ctl upgrade
                   three times in a row mid-transfer. Every byte arrives once and in order, every
                   idle connection still carries a byte each way, the guest's listener accepted
                   nothing new, its kernel logged nothing about vsock or virtio, new connections
                   work both ways, QEMU is the same process; each upgrade's pause_ms and conns
                   from uvsock-ctl's answer are printed (# timing).
  upgrade-refused  the same with 32 MiB each way and 20 idle connections; uvsock-ctl upgrade
                   --binary /nonexistent mid-transfer must fail, and the old uvsockd carries on:
                   the same checks.
  upgrade-isolate  upgrade with uvsockd --isolate: each upgrade replaces the worker serving the VM
                   (a new worker_pid in the answer, the old worker gone), the same checks.
  crash-isolate    uvsockd --isolate; the worker serving the VM is killed (SIGKILL) while the
                   guest holds a connection, streams to the host, and the host holds one to the
                   guest's listener. The main process starts a new worker that adopts the VMM's
                   connection: the open connections end (hang guards, no timing bound), the
                   listener keeps working, new connections work both ways, QEMU is the same
                   process (docs/upgrade.md, "Crash survival").
  crash-fdstore    the same without --isolate: uvsockd runs under fake-fdstore (a service
                   manager with systemd's fd store, tests/harness/fake-fdstore.c), which starts
                   it again when it is killed with SIGKILL, giving back what it stored; the
                   new uvsockd adopts the VMM's connection from the store.

Host side only AF_UNIX (uvsockd's hybrid sockets); AF_VSOCK exists only inside the guest.
Exit: 0 pass, 1 fail, 77 skip (no patched or stock QEMU, kernel, cpio, or an uvsock-ctl that
does not know "upgrade": named loudly).
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CID = 5
LISTEN_PORT = 5000   # the guest listens here
ECHO_PORT = 7000     # the host echoes here
STREAM_PORT = 7001   # the host streams the pattern here
SINK_PORT = 7002     # the host checks what the guest sends here (the upgrade cases)
CYCLES = (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)

T0 = time.monotonic()
TIMINGS = []


def log(msg):
    print(f"lifecycle [{time.monotonic() - T0:7.2f}s] {msg}", flush=True)


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def skip(why, hint="make interop-deps, or scripts/build-qemu.sh and scripts/fetch-kernels.sh"):
    print("#" * 72)
    print(f"# SKIP: {why}")
    print(f"# ({hint})")
    print("#" * 72, flush=True)
    sys.exit(77)


def lib(cmd):
    """Runs cmd in bash with tests/interop/lib.sh and qemu-patched.sh sourced; stdout or None."""
    script = (f'source "{HERE}/lib.sh" && source "{HERE}/qemu-patched.sh" && {cmd}')
    r = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, timeout=600)
    return r.stdout.decode() if r.returncode == 0 else None


def pattern_chunks():
    """The host's stream: byte i is (i*131 + (i>>12)*7 + 1) & 255, in 4 KiB chunks (256 of them
    repeat), as uvsock-lifecycle's pattern()."""
    base = bytes((j * 131 + 1) & 255 for j in range(4096))
    return [base.translate(bytes((x + 7 * k) & 255 for x in range(256))) for k in range(256)]


# ---- host services behind uvsockd's hybrid sockets (AF_UNIX only) ----

class Listener:
    """Accepts on PATH for ever; each connection is served by fn(conn) on its own thread."""

    def __init__(self, path, fn):
        self.path, self.fn = path, fn
        self.conns = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        # uvsockd connects without waiting (a full queue refuses the guest: EAGAIN, an RST).
        self.sock.listen(128)
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self.fn, args=(c,), daemon=True).start()

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def echo(conn):
    try:
        while True:
            b = conn.recv(65536)
            if not b:
                return
            conn.sendall(b)
    except OSError:
        return


CHUNKS = None


def stream(conn):
    k = 0
    try:
        while True:
            conn.sendall(CHUNKS[k % 256])
            k += 1
    except OSError:
        return


def host_connect(uds, port, timeout=5):
    """The host's connection to the guest's PORT through uvsockd's hybrid socket."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(uds)
    s.sendall(f"CONNECT {port}\n".encode())
    line = b""
    while not line.endswith(b"\n"):
        b = s.recv(1)
        if not b:
            raise OSError("closed before the CONNECT answer")
        line += b
    if not line.startswith(b"OK"):
        raise OSError(f"CONNECT {port}: {line.decode().strip()}")
    return s


def host_roundtrip(s, n=4096):
    data = os.urandom(n)
    s.sendall(data)
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        if not b:
            raise OSError("EOF")
        got += b
    return got == data


def host_conn_ended(s, timeout):
    """Whether the host's connection s ends (EOF or error) within timeout seconds."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


# ---- the guest's control channel ----

class Ctl:
    """One serial port of the guest (QEMU connects to our listening socket at path)."""

    def __init__(self, path):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.conn, self.buf = None, b""

    def accept(self, timeout):
        self.srv.settimeout(timeout)
        self.conn, _ = self.srv.accept()

    def line(self, timeout):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise Fail("no answer from the guest in time")
            self.conn.settimeout(left)
            try:
                b = self.conn.recv(4096)
            except socket.timeout:
                continue
            if not b:
                raise Fail("the guest's control channel closed")
            self.buf += b
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def cmd(self, text, timeout=30):
        self.conn.sendall(text.encode() + b"\n")
        ans = self.line(timeout)
        log(f"guest: {text} -> {ans}")
        return ans

    def ok(self, text, timeout=30):
        ans = self.cmd(text, timeout)
        check(ans.startswith("OK"), f"guest '{text}': {ans}")
        return ans[2:].strip()

    def close(self):
        for s in (self.conn, self.srv):
            if s:
                s.close()


def retry(fn, what, limit):
    """Calls fn() until it returns truthy or limit seconds pass; returns seconds taken."""
    t = time.monotonic()
    while True:
        try:
            if fn():
                return time.monotonic() - t
        except (OSError, Fail):
            pass
        if time.monotonic() - t > limit:
            raise Fail(f"{what}: not within {limit} s")
        time.sleep(0.1)


# ---- processes ----

class Run:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="uvsock-lifecycle-")
        self.procs = []
        self.pids = []   # processes we did not start ourselves (the upgraded uvsockd), by PID

    def path(self, name):
        return os.path.join(self.dir, name)

    def uvsockd(self, tag, sock, uds, extra=()):
        log_path = self.path(f"uvsockd-{tag}.log")
        f = open(log_path, "a")
        p = subprocess.Popen([self.args.daemon, "--log-level", "debug", *extra, "--vm",
                              f"guest-cid={CID},socket={sock},uds-path={uds}"],
                             stdout=f, stderr=subprocess.STDOUT)
        f.close()
        self.procs.append(p)
        end = time.monotonic() + 10
        while not os.path.exists(sock):
            check(p.poll() is None and time.monotonic() < end,
                  f"uvsockd {tag} did not come up ({log_path})")
            time.sleep(0.05)
        return p

    def qemu(self, tag, vsock, ctl, incoming=None):
        # no_timer_check: skip the IO-APIC timer test, which a TCG guest on a loaded host can
        # fail ("IO-APIC + timer doesn't work!", a panic before /init).
        append = "quiet no_timer_check uvsock.mode=lifecycle"
        # The migration cases run one vCPU: with two (TCG, one host thread for both), about one
        # live migration in four left the destination guest corrupt in ways that have nothing
        # to do with vsock (a stack-protector panic in rcu_sched_clock_irq, list_del corruption
        # in the page allocator), and it still did when uvsockd re-marked every page it had
        # written since logging began just before the final RAM pass; with one vCPU none of
        # the runs did (docs/interop.md, "Back-end restart and live migration").
        smp = ("1" if self.args.case not in ("reconnect", "backoff") + STOCK_CASES
               else os.environ.get("UVSOCK_INTEROP_SMP", "2"))
        out = lib(f'UVSOCK_INTEROP_SMP={smp} UVSOCK_INTEROP_MEM={self.args.mem} '
                  f'qemu_args "{self.kdir}" "{self.initrd}" '
                  f'"{append}" "{self.path(tag + ".serial")}" "{vsock}" "{ctl}" && '
                  'printf "%s\\0" "${QEMU_ARGS[@]}"')
        check(out is not None, "qemu_args failed")
        qargs = out.split("\0")[:-1]
        rec = "reconnect=1" if self.args.qemu_version == "7.2" else "reconnect-ms=200"
        if self.args.case not in STOCK_CASES:
            # The upgrade cases do without: the vhost-user connection must never end.
            qargs = [a + "," + rec if a.startswith("socket,id=vu0,") else a for a in qargs]
        if self.args.case not in ("reconnect", "backoff") + STOCK_CASES:
            # TCG's "-cpu max" does not survive a migration (the destination guest dies in
            # its timer code, with or without vsock traffic); a named model does.
            qargs = ["qemu64" if a == "max" else a for a in qargs]
        qargs += ["-qmp", f"unix:{self.path(tag + '.qmp')},server=on,wait=off"]
        if incoming:
            qargs += ["-incoming", incoming]
        f = open(self.path(tag + ".qemu.log"), "w")
        p = subprocess.Popen([self.qemu_bin] + qargs, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        f.close()
        self.procs.append(p)
        return p

    def cleanup(self, keep):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in self.pids:
            end_pid(pid, signal.SIGKILL)
        if keep:
            log(f"logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Qmp:
    def __init__(self, path, timeout=30):
        end = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                check(time.monotonic() < end, f"no QMP socket at {path}")
                time.sleep(0.1)
        self.f = self.s.makefile("rwb")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        self.f.write(json.dumps(msg).encode() + b"\n")
        self.f.flush()
        while True:
            line = self.f.readline()
            check(line, f"QMP closed during {name}")
            r = json.loads(line)
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise Fail(f"QMP {name}: {r['error'].get('desc')}")

    def close(self):
        self.s.close()


def boot(run, tag, vsock, ctl_path, incoming=None):
    """Starts QEMU tag and waits for the guest program. A boot that dies before our code runs
    (a kernel panic under TCG on a loaded machine) is retried once, loudly."""
    for attempt in (1, 2):
        ctl = Ctl(ctl_path)
        q = run.qemu(tag, vsock, ctl_path, incoming)
        t = time.monotonic()
        try:
            ctl.accept(60)
            if incoming:
                return q, ctl
            check(ctl.line(180) == "READY", "the guest program did not start")
            TIMINGS.append((f"{tag}: boot to the guest program (s)", time.monotonic() - t))
            return q, ctl
        except (Fail, OSError) as e:
            with open(run.path(tag + ".serial"), errors="replace") as f:
                serial = f.read()
            ctl.close()
            os.unlink(ctl_path)
            if attempt == 2 or "UVSOCK-INIT" in serial or "Kernel panic" not in serial:
                raise Fail(f"{tag}: boot: {e}")
            log(f"#### {tag}: the kernel died before /init (a boot failure, not ours); "
                f"retrying once: {[ln for ln in serial.splitlines() if 'panic' in ln][:1]}")
            q.kill()
            q.wait()
            os.rename(run.path(tag + ".serial"), run.path(tag + ".serial.attempt1"))


# ---- the cases ----

def case_reconnect(run):
    sock, uds = run.path("vm.sock"), run.path("vm.vsock")
    d = run.uvsockd("a", sock, uds)
    echo_l = Listener(f"{uds}_{ECHO_PORT}", echo)
    q, ctl = boot(run, "vm", sock, run.path("ctl"))
    cid = ctl.ok("cid")
    check(cid == str(CID), f"guest CID {cid}, not {CID}")
    ctl.ok(f"listen {LISTEN_PORT}")
    ctl.ok(f"hold 1 {ECHO_PORT}")
    ctl.ok("ping 1")
    h = host_connect(uds, LISTEN_PORT)
    check(host_roundtrip(h), "host to guest echo")
    for n, sig in enumerate(CYCLES, 1):
        name = signal.Signals(sig).name
        t = time.monotonic()
        d.send_signal(sig)
        d.wait(15)
        os.unlink(sock) if os.path.exists(sock) else None
        d = run.uvsockd("a", sock, uds)
        t_up = time.monotonic() - t
        ans = ctl.cmd("wait_reset 1 20000", 30)
        # SIGKILL: only QEMU's TRANSPORT_RESET can end the socket (ECONNRESET). SIGTERM: uvsockd
        # first resets its connections (an RST: Linux then answers ENOTCONN or EOF), or the
        # TRANSPORT_RESET comes first (ECONNRESET).
        ended = ("OK ECONNRESET",) if sig == signal.SIGKILL else (
            "OK ECONNRESET", "OK ENOTCONN", "OK EOF")
        check(ans in ended, f"cycle {n} ({name}): the guest's old socket: {ans}")
        t_reset = time.monotonic() - t
        check(host_conn_ended(h, 10), f"cycle {n}: the host's old connection stays open")
        h.close()
        t_g2h = retry(lambda: ctl.cmd(f"echo {ECHO_PORT} 4096", 30) == "OK",
                      f"cycle {n}: a new guest-to-host connection", 30) + (time.monotonic() - t)
        h = host_connect(uds, LISTEN_PORT)
        check(host_roundtrip(h), f"cycle {n}: a new host-to-guest connection")
        t_h2g = time.monotonic() - t
        check(ctl.ok("cid") == str(CID), f"cycle {n}: CID changed")
        check(q.poll() is None, f"cycle {n}: QEMU exited")
        ctl.ok(f"hold 1 {ECHO_PORT}")
        ctl.ok("ping 1")
        TIMINGS.append((f"cycle {n} {name}: uvsockd back / guest reset / new g2h / new h2g",
                        (t_up, t_reset, t_g2h, time.monotonic() - t)))
        log(f"cycle {n} ({name}) passed in {time.monotonic() - t:.2f} s")
    accepted = int(ctl.ok("accepted"))
    check(accepted == 1 + len(CYCLES), f"the guest accepted {accepted} connections")
    h.close()
    ctl.cmd("poweroff", 10)
    q.wait(30)
    echo_l.close()
    ctl.close()


BACKOFF_ATTEMPTS = 6        # set-up attempts the refusing back-end takes before uvsockd returns
BACKOFF_MIN_S = 0.1         # contrib/qemu/patches/0002: 100 ms after the first failure, doubling


def refusing_backend(path, n, limit):
    """Listens on path as a back-end that fails every set-up: each connection is closed as soon
    as QEMU's first vhost-user message arrives. Returns the times of the first n messages."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    times, end = [], time.monotonic() + limit
    try:
        while len(times) < n:
            left = end - time.monotonic()
            check(left > 0, f"QEMU tried to set up the device {len(times)} times in {limit} s, "
                  f"not {n}")
            srv.settimeout(left)
            c, _ = srv.accept()
            # QEMU may wait on an open connection before its set-up (the back-off): wait for
            # its first message, then fail the set-up by closing.
            c.settimeout(max(end - time.monotonic(), 0.1))
            try:
                if c.recv(64):
                    times.append(time.monotonic())
            except socket.timeout:
                pass
            c.close()
    finally:
        srv.close()
        os.unlink(path)
    return times


def case_backoff(run):
    """uvsockd is killed and a back-end that fails every set-up takes its socket: QEMU must wait
    longer and longer between attempts (100 ms after the first failure, doubling), never spin,
    and once uvsockd is back it must reconnect as in case_reconnect."""
    sock, uds = run.path("vm.sock"), run.path("vm.vsock")
    d = run.uvsockd("a", sock, uds)
    echo_l = Listener(f"{uds}_{ECHO_PORT}", echo)
    q, ctl = boot(run, "vm", sock, run.path("ctl"))
    check(ctl.ok("cid") == str(CID), "guest CID")
    ctl.ok(f"hold 1 {ECHO_PORT}")
    ctl.ok("ping 1")
    d.send_signal(signal.SIGKILL)
    d.wait(15)
    os.unlink(sock) if os.path.exists(sock) else None
    times = refusing_backend(sock, BACKOFF_ATTEMPTS, 120)
    gaps = [b - a for a, b in zip(times, times[1:])]
    log("gaps between set-up attempts (s): " + " ".join(f"{g:.2f}" for g in gaps))
    # Lower bounds only: a loaded machine makes the gaps longer, never shorter.
    for i, g in enumerate(gaps):
        want = BACKOFF_MIN_S * (1 << i) * 0.9
        check(g >= want, f"attempt {i + 2} came {g:.3f} s after the one before, not the "
              f"{want / 0.9:.1f} s of the back-off: QEMU does not back off")
    check(q.poll() is None, "QEMU exited while the back-end refused")
    t = time.monotonic()
    d = run.uvsockd("a", sock, uds)
    ans = ctl.cmd("wait_reset 1 30000", 40)
    check(ans in ("OK ECONNRESET", "OK ENOTCONN", "OK EOF"), f"the guest's old socket: {ans}")
    t_new = retry(lambda: ctl.cmd(f"echo {ECHO_PORT} 4096", 30) == "OK",
                  "a new guest-to-host connection after the back-end came back", 30)
    check(ctl.ok("cid") == str(CID), "CID changed")
    TIMINGS.append(("gaps between failed set-up attempts (s)", [round(g, 2) for g in gaps]))
    TIMINGS.append(("uvsockd back to a new g2h connection (s)", time.monotonic() - t))
    log(f"reconnected {t_new:.2f} s after the first try")
    ctl.cmd("poweroff", 10)
    q.wait(30)
    echo_l.close()
    ctl.close()


def wait_status(qmp, want, what, limit=30):
    """Polls QMP query-status until the VM's status is want; the last status in the failure."""
    last = {}

    def is_want():
        last.update(qmp.cmd("query-status"))
        return last.get("status") == want
    try:
        retry(is_want, what, limit)
    except Fail as e:
        raise Fail(f"{e} (its last status: {last.get('status')})")


def wait_migration(qmp, limit):
    """Polls query-migrate on the sending QEMU until completed; its last answer."""
    status = {}

    def done():
        status.update(qmp.cmd("query-migrate"))
        check(status.get("status") not in ("failed", "cancelled"),
              f"migration {status.get('status')}: {status.get('error-desc', '')}")
        return status.get("status") == "completed"
    retry(done, "the migration", limit)
    return status


def case_migrate(run, mode):
    """mode: live (the guest runs while it migrates), stopped (stop, migrate, cont on the
    destination) or snapshot (stop, save to a file, a new QEMU loads that file, cont)."""
    global CHUNKS
    CHUNKS = pattern_chunks()
    sock_a, uds_a = run.path("a.sock"), run.path("a.vsock")
    sock_b, uds_b = run.path("b.sock"), run.path("b.vsock")
    run.uvsockd("a", sock_a, uds_a)
    run.uvsockd("b", sock_b, uds_b)
    la = Listener(f"{uds_a}_{ECHO_PORT}", echo)
    ls = Listener(f"{uds_a}_{STREAM_PORT}", stream)
    lb = Listener(f"{uds_b}_{ECHO_PORT}", echo)
    src, ctl = boot(run, "src", sock_a, run.path("ctl-a"))
    mig, image = run.path("mig.sock"), run.path("vm.image")
    if mode != "snapshot":
        dst, ctl_b = boot(run, "dst", sock_b, run.path("ctl-b"), incoming=f"unix:{mig}")
    check(ctl.ok("cid") == str(CID), "guest CID")
    ctl.ok(f"listen {LISTEN_PORT}")
    ctl.ok(f"hold 1 {ECHO_PORT}")
    ctl.ok("ping 1")
    ctl.ok(f"hold 2 {STREAM_PORT}")
    ctl.ok("stream 2")
    ctl.ok(f"memload {run.args.load_mb}")
    h = host_connect(uds_a, LISTEN_PORT)
    check(host_roundtrip(h), "host to guest echo on the source")
    retry(lambda: int(ctl.ok("streamstat").split()[0].split("=")[1]) > 0,
          "the stream flows", 30)
    qs = Qmp(run.path("src.qmp"))
    qd = Qmp(run.path("dst.qmp")) if mode != "snapshot" else None
    t = time.monotonic()
    if mode != "live":
        # The device is stopped with the VM (GET_VRING_BASE): from here uvsockd must not write
        # into guest memory, or what the destination loads misses it and the stream check fails.
        qs.cmd("stop")
        wait_status(qs, "paused", "the source stops")
    qs.cmd("migrate", uri=f"exec:cat > {image}" if mode == "snapshot" else f"unix:{mig}")
    status = wait_migration(qs, run.args.migrate_limit)
    t_mig = time.monotonic() - t
    ram = status.get("ram", {})
    log(f"{mode} migration completed in {t_mig:.2f} s: {ram.get('transferred', 0) >> 20} MiB, "
        f"{ram.get('dirty-sync-count', '?')} dirty syncs, downtime {status.get('downtime')} ms")
    qs.cmd("quit")
    src.wait(30)
    if mode == "snapshot":
        log(f"saved image: {os.path.getsize(image) >> 20} MiB; loading it into a new QEMU")
        t_load = time.monotonic()
        dst, ctl_b = boot(run, "dst", sock_b, run.path("ctl-b"), incoming=f"exec:cat {image}")
        qd = Qmp(run.path("dst.qmp"))
    if mode == "live":
        # The source reports "completed" once it has sent everything; the destination may still
        # be loading the last device state ("inmigrate") before it runs.
        wait_status(qd, "running", "the destination runs")
    else:
        # A VM that was stopped when it was saved stays stopped on the destination until cont.
        wait_status(qd, "paused", "the destination loads and waits, paused",
                    run.args.migrate_limit)
        if mode == "snapshot":
            TIMINGS.append(("snapshot: new QEMU start and load (s)", time.monotonic() - t_load))
        qd.cmd("cont")
        wait_status(qd, "running", "the destination runs after cont")
    ctl_b.conn.settimeout(None)
    ctl = ctl_b
    # The old connections: the held one reads ECONNRESET from SO_ERROR (the TRANSPORT_RESET
    # QEMU posts on the destination); the stream ended, every byte received was right. The
    # stream's reader is blocked in recv when the reset comes, and Linux may end that recv with
    # ECONNRESET or with 0 (seen once: QEMU 10.0.2, a 6.12 guest): either is the end asked for.
    ans = ctl.cmd("wait_reset 1 20000", 30)
    check(ans == "OK ECONNRESET", f"the held connection after migration: {ans}")
    retry(lambda: any(f"end={e}" in ctl.ok("streamstat") for e in ("ECONNRESET", "EOF")),
          "the stream's end", 30)
    st = dict(kv.split("=") for kv in ctl.ok("streamstat").split())
    check(st["bad"] == "0", f"stream bytes corrupted: {st}")
    check(int(st["bytes"]) > 0, "nothing streamed")
    check(ctl.ok("memcheck", 120).startswith("passes="), "guest memory")
    check(host_conn_ended(h, 10), "the host's old connection to the guest stays open")
    # New connections, both ways, on the destination's uvsockd.
    t_new = retry(lambda: ctl.cmd(f"echo {ECHO_PORT} 65536", 30) == "OK",
                  "a new guest-to-host connection on the destination", 30)
    h = host_connect(uds_b, LISTEN_PORT)
    check(host_roundtrip(h), "host to guest on the destination")
    check(ctl.ok("cid") == str(CID), "CID after migration")
    TIMINGS.append((f"{mode} migration (completed, s)", t_mig))
    TIMINGS.append(("streamed bytes checked", int(st["bytes"])))
    TIMINGS.append(("first new g2h connection after migration (s)", t_new))
    h.close()
    ctl.cmd("poweroff", 10)
    dst.wait(30)
    for x in (la, ls, lb, qs, qd, ctl):
        x.close()


# ---- live upgrade (stock QEMU; docs/upgrade.md, docs/interop.md "Live upgrade") ----

STOCK_CASES = ("upgrade", "upgrade-refused", "upgrade-isolate", "crash-isolate", "crash-fdstore")
UPGRADES = 3          # uvsock-ctl upgrade, three times in a row (the upgrade case)
STALL_S = 60          # hang guard: a stream that moves no byte for this long has stopped
GATE_AHEAD = 8 << 20  # each upgrade starts at a quarter of the streams, which stop 8 MiB further


def set_subreaper():
    """Makes this process the subreaper of its descendants (prctl PR_SET_CHILD_SUBREAPER): the
    uvsockd an upgrade starts is the old one's child, and once the old one exits it becomes ours,
    so its exit status can be read with waitpid and it can be ended by PID."""
    libc = ctypes.CDLL(None, use_errno=True)
    check(libc.prctl(36, 1, 0, 0, 0) == 0, "prctl(PR_SET_CHILD_SUBREAPER) failed")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_pid_exit(pid, limit):
    """Waits (a hang guard of limit s) for PID to exit; its exit status (os.waitstatus_to_exitcode)
    when it is our child (or, through the subreaper, grandchild), else None."""
    end = time.monotonic() + limit
    while True:
        try:
            got, st = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                return os.waitstatus_to_exitcode(st)
        except ChildProcessError:
            if not pid_alive(pid):
                return None
        check(time.monotonic() < end, f"process {pid} still runs after {limit} s")
        time.sleep(0.05)


def end_pid(pid, sig):
    """Ends PID (a uvsockd we track by PID) with sig and reaps it; its exit status or None."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    return wait_pid_exit(pid, 30)


class Streams:
    """The host's ends of the two checked transfers: SOURCE sends exactly n bytes of the pattern
    to the guest and shuts its sending side; SINK reads what the guest sends until end of file
    and checks every byte against the pattern at its offset. Neither goes past the gate (a byte
    offset) until the test moves it: a transfer faster than the upgrades (under 1 s for 64 MiB
    on an idle machine) then cannot end before the last one, and when an upgrade is slow the
    rings and buffers stay full until it is through (uvsockd hands over data in flight)."""

    def __init__(self, n):
        self.n = n
        self.gate = n
        self.cv = threading.Condition()
        self.period = b"".join(pattern_chunks())   # 1 MiB: pattern(i) repeats every 1 MiB
        self.twice = self.period * 2
        self.sent = 0
        self.source_err = None
        self.sink = {"bytes": 0, "bad": 0, "first_bad": None, "end": "-", "conns": 0}

    def source(self, conn):
        view, off = memoryview(self.twice), 0
        try:
            while off < self.n:
                self.wait_gate(off)
                k = min(65536, self.n - off, self.gate - off)
                o = off % len(self.period)
                conn.sendall(view[o:o + k])
                off += k
                self.sent = off
            conn.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.source_err = f"{e} after {off} bytes"
            log(f"host source: {self.source_err}")

    def set_gate(self, gate):
        with self.cv:
            self.gate = min(gate, self.n)
            self.cv.notify_all()

    def wait_gate(self, off):
        with self.cv:
            self.cv.wait_for(lambda: off < self.gate or off >= self.n)

    def sink_fn(self, conn):
        st = self.sink
        st["conns"] += 1
        off = 0
        try:
            while True:
                self.wait_gate(off)
                b = conn.recv(min(262144, max(self.gate - off, 1)))
                if not b:
                    st["end"] = "EOF"
                    return
                o = off % len(self.period)
                if self.twice[o:o + len(b)] != b:
                    st["bad"] += sum(1 for i, x in enumerate(b)
                                     if x != self.twice[(off + i) % len(self.period)])
                    if st["first_bad"] is None:
                        st["first_bad"] = off
                off += len(b)
                st["bytes"] = off
        except OSError as e:
            st["end"] = f"error {e}"


def guest_stat(ctl, what):
    return dict(kv.split("=", 1) for kv in ctl.ok(what).split())


def upgrade_cmd(run, extra):
    """Runs uvsock-ctl upgrade; (exit code, stdout, stderr, seconds)."""
    t = time.monotonic()
    r = subprocess.run([run.args.ctl, "--control", run.path("vm.ctl"), "--json", "upgrade",
                        *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return (r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"),
            time.monotonic() - t)


def answer_json(out):
    """The JSON object in uvsock-ctl's output (its --json answer: one line)."""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    raise Fail(f"no JSON answer in uvsock-ctl's output: {out!r}")


def case_upgrade(run, refused, isolate=False):
    """refused: one upgrade to /nonexistent, which must fail and leave the old uvsockd serving;
    else UPGRADES upgrades, each mid-transfer, each to a new process. isolate: uvsockd
    --isolate, where each upgrade replaces the VM's worker (and the main process, where the
    answer names a new one)."""
    n = (32 if refused else 64) << 20
    idle_each = 10 if refused else 50
    set_subreaper()
    sock, uds = run.path("vm.sock"), run.path("vm.vsock")
    d = run.uvsockd("a", sock, uds, ("--control", run.path("vm.ctl")) +
                    (("--isolate",) if isolate else ()))
    pid = d.pid
    streams = Streams(n)
    echo_l = Listener(f"{uds}_{ECHO_PORT}", echo)
    src_l = Listener(f"{uds}_{STREAM_PORT}", streams.source)
    sink_l = Listener(f"{uds}_{SINK_PORT}", streams.sink_fn)
    q, ctl = boot(run, "vm", sock, run.path("ctl"))
    qmp = Qmp(run.path("vm.qmp"))
    check(ctl.ok("cid") == str(CID), "guest CID")
    ctl.ok(f"listen {LISTEN_PORT}")
    # The idle connections: half opened by the guest (to the host's echo), half by the host (to
    # the guest's listener, which echoes).
    t = time.monotonic()
    # Both in batches of 10, each accepted before the next: a full accept queue refuses the
    # connection (uvsockd's connect to a Unix listener does not wait; Linux's vsock answers an
    # RST), and the accepting ends are slow here (a thread per connection on the host, a fork
    # per connection under TCG in the guest).
    for k in range(10, idle_each + 1, 10):   # idle_each: a multiple of 10
        check(ctl.ok(f"idle 10 {ECHO_PORT}", 60) == str(k), "guest idle count")
        retry(lambda: len(echo_l.conns) == k, "the host accepts the guest's", 30)
    hosts = []
    while len(hosts) < idle_each:
        hosts += [host_connect(uds, LISTEN_PORT, 30) for _ in range(10)]
        retry(lambda: ctl.ok("accepted") == str(len(hosts)), "the guest accepts the host's", 30)
    check(len(echo_l.conns) == idle_each, f"the host accepted {len(echo_l.conns)} of the "
          f"guest's {idle_each}")
    TIMINGS.append((f"{2 * idle_each} idle connections opened (s)", time.monotonic() - t))
    kmsg0 = ctl.ok("kmsg")
    worker = None
    if isolate:
        retry(lambda: worker_of(pid) is not None, "the worker of the VM runs", 30)
        worker = worker_of(pid)
    ctl.ok(f"hold 1 {STREAM_PORT}")
    ctl.ok(f"hold 2 {SINK_PORT}")
    t_xfer = time.monotonic()
    ctl.ok("stream 1")
    ctl.ok(f"send 2 {n}")

    def progress():
        return min(streams.sent, streams.sink["bytes"])

    def wait_progress(want, what):
        last, t_last = -1, time.monotonic()
        while progress() < want:
            p = progress()
            if p != last:
                last, t_last = p, time.monotonic()
            check(time.monotonic() - t_last < STALL_S,
                  f"{what}: no byte moved for {STALL_S} s (host sent {streams.sent}, "
                  f"host received {streams.sink['bytes']} of {n})")
            check(q.poll() is None, f"{what}: QEMU exited")
            # A stream that ended early fails at once (an end the hang guard would wait for).
            check(streams.source_err is None, f"{what}: the host's stream to the guest failed: "
                  f"{streams.source_err}")
            check(streams.sink["end"] == "-" or streams.sink["bytes"] >= n,
                  f"{what}: the guest's stream to the host ended early: {streams.sink}")
            time.sleep(0.05)

    rounds = 1 if refused else UPGRADES
    for i in range(1, rounds + 1):
        streams.set_gate(n * i // (rounds + 1) + GATE_AHEAD)
        wait_progress(n * i // (rounds + 1), f"upgrade {i}")
        at = (streams.sent, streams.sink["bytes"])
        # Mid-transfer: neither stream is through (the host has not sent all of its stream, nor
        # received all of the guest's).
        check(at[0] < n and at[1] < n, f"upgrade {i}: a transfer already ended {at}")
        if refused:
            rc, out, err, secs = upgrade_cmd(run, ["--binary", "/nonexistent"])
            log(f"upgrade --binary /nonexistent: exit {rc}, {secs:.2f} s: "
                f"{(out + err).strip()}")
            check(rc != 0, "uvsock-ctl upgrade --binary /nonexistent succeeded")
            # The reason names what failed: the binary (its path, or the errno of its exec).
            check(any(w in out + err for w in ("/nonexistent", "No such file", "ENOENT")),
                  "uvsock-ctl failed without naming the missing binary")
            check(d.poll() is None, f"the old uvsockd exited ({d.returncode}) after a refused "
                  "upgrade")
            # and the process it started for the new binary is gone (reaped, no zombie).
            retry(lambda: not children(d.pid), "the refused process ends", 30)
            TIMINGS.append(("refused upgrade: uvsock-ctl (s)", secs))
            continue
        rc, out, err, secs = upgrade_cmd(run, [])
        check(rc == 0, f"upgrade {i}: uvsock-ctl exit {rc}: {(out + err).strip()}")
        ans = answer_json(out)
        log(f"upgrade {i} at {at[0] >> 20}/{at[1] >> 20} MiB (h2g/g2h), uvsock-ctl "
            f"{secs:.2f} s: {json.dumps(ans)}")
        check(ans.get("old_pid") == pid, f"upgrade {i}: old_pid {ans.get('old_pid')}, not {pid}")
        new = ans.get("new_pid")
        # Under --isolate the main process may stay (only the workers are replaced).
        check(isinstance(new, int) and new > 0 and (new != pid or isolate),
              f"upgrade {i}: new_pid {new}")
        if new != pid:
            run.pids.append(new)
        vms = [v for v in ans.get("vms", []) if v.get("cid") == CID]
        check(len(vms) == 1, f"upgrade {i}: vms {ans.get('vms')}: not one with cid {CID}")
        vm = vms[0]
        check(isinstance(vm.get("pause_ms"), (int, float)), f"upgrade {i}: pause_ms {vm}")
        # 2 * idle_each idle connections and the two streams, at least.
        check(isinstance(vm.get("conns"), int) and vm["conns"] >= 2 * idle_each + 2,
              f"upgrade {i}: conns {vm.get('conns')}, not the {2 * idle_each + 2} open")
        if isolate:
            # The VM's worker is a new process; the old one ends (reaped by its main process).
            nw = vm.get("worker_pid")
            check(isinstance(nw, int) and nw > 0 and nw != worker,
                  f"upgrade {i}: worker_pid {nw} (the old worker was {worker})")
            retry(lambda: not pid_alive(worker), f"upgrade {i}: the old worker {worker} ends",
                  30)
            check(pid_alive(nw), f"upgrade {i}: the new worker {nw} is not running")
            worker = nw
        if new != pid:
            # Each uvsockd is this process's descendant (the subreaper): its status is known.
            st = d.wait(30) if pid == d.pid else wait_pid_exit(pid, 30)
            check(st == 0, f"upgrade {i}: the old uvsockd {pid} exited with {st}, not 0")
            log(f"upgrade {i}: the old uvsockd {pid} exited with status 0")
            if pid in run.pids:
                run.pids.remove(pid)
        check(pid_alive(new), f"upgrade {i}: the new uvsockd {new} is not running")
        check(q.poll() is None, f"upgrade {i}: QEMU exited")
        TIMINGS.append((f"upgrade {i}", f"pause_ms={vm['pause_ms']} conns={vm['conns']} "
                        f"(uvsock-ctl {secs:.2f} s; at {at[0] >> 20} MiB host to guest, "
                        f"{at[1] >> 20} MiB guest to host)"))
        pid = new
    streams.set_gate(n)
    # Both streams to their ends: every byte once, in order, then end of file.
    wait_progress(n, "the transfers")
    retry(lambda: guest_stat(ctl, "streamstat")["end"] != "-", "the guest's stream ends", STALL_S)
    retry(lambda: guest_stat(ctl, "sendstat")["end"] != "-", "the guest's send ends", STALL_S)
    retry(lambda: streams.sink["end"] != "-", "the host's sink ends", STALL_S)
    xfer_s = time.monotonic() - t_xfer
    gs, gd, hs = guest_stat(ctl, "streamstat"), guest_stat(ctl, "sendstat"), streams.sink
    check(gs == {"bytes": str(n), "bad": "0", "end": "EOF"},
          f"host to guest: the guest saw {gs}, not {n} good bytes and end of file")
    check(gd == {"bytes": str(n), "end": "DONE"}, f"guest to host: the guest's sender {gd}")
    check(hs["bytes"] == n and hs["bad"] == 0 and hs["end"] == "EOF" and hs["conns"] == 1,
          f"guest to host: the host saw {hs}, not {n} good bytes and end of file")
    # The idle connections: each carries a byte each way, and nobody reconnected.
    t = time.monotonic()
    check(ctl.ok("idleping", 120) == str(idle_each), "the guest's idle connections")
    for k, h in enumerate(hosts):
        check(host_roundtrip(h, 1), f"the host's idle connection {k}: wrong echo")
    TIMINGS.append((f"a byte each way on {2 * idle_each} idle connections (s)",
                    time.monotonic() - t))
    check(ctl.ok("accepted") == str(idle_each), "the guest's listener accepted new connections")
    check(len(echo_l.conns) == idle_each, "the guest reconnected to the host's echo")
    kmsg1 = ctl.ok("kmsg")
    check(kmsg1 == kmsg0, f"the guest's kernel logged about vsock/virtio: {kmsg1} "
          f"(before: {kmsg0})")
    # New connections both ways, to whichever uvsockd now serves.
    check(ctl.cmd(f"echo {ECHO_PORT} 65536", 30) == "OK", "a new guest-to-host connection")
    h = host_connect(uds, LISTEN_PORT)
    check(host_roundtrip(h), "a new host-to-guest connection")
    check(ctl.ok("cid") == str(CID), "CID")
    check(q.poll() is None, "QEMU exited")
    check(qmp.cmd("query-status").get("status") == "running", "QEMU's VM is not running")
    TIMINGS.append((f"{n >> 20} MiB each way, both ends checked (s)", xfer_s))
    log(f"{n >> 20} MiB each way in {xfer_s:.1f} s; kmsg {kmsg1}")
    h.close()
    for h in hosts:
        h.close()
    ctl.cmd("poweroff", 10)
    q.wait(30)
    if refused:
        check(d.poll() is None, "the old uvsockd exited")
    else:
        st = end_pid(pid, signal.SIGTERM)
        check(st == 0, f"the last uvsockd {pid} exited with {st} on SIGTERM")
        if pid in run.pids:
            run.pids.remove(pid)
    for x in (echo_l, src_l, sink_l, qmp, ctl):
        x.close()


def children(pid):
    """The PIDs of pid's children (/proc/PID/task/*/children)."""
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def worker_of(main_pid):
    """The --isolate worker serving our VM (named "uvsockd vm<CID>", docs/uvsockd.md
    "Isolation"), or None."""
    for c in children(main_pid):
        try:
            with open(f"/proc/{c}/comm") as f:
                if f.read().strip() == f"uvsockd vm{CID}" and pid_alive(c):
                    return c
        except OSError:
            pass
    return None


class FakeFdstore:
    """uvsockd under tests/harness/fake-fdstore --restart-on-kill: the PIDs it starts, read from
    its stdout (`fake-fdstore: started pid P`), each tracked in run.pids until it ends."""

    def __init__(self, run, tool, sock, uds):
        self.run, self.pids = run, []
        self.log_path = run.path("uvsockd-a.log")
        f = open(self.log_path, "a")
        self.p = subprocess.Popen([tool, "--restart-on-kill", "--", run.args.daemon,
                                   "--log-level", "debug", "--control", run.path("vm.ctl"),
                                   "--vm", f"guest-cid={CID},socket={sock},uds-path={uds}"],
                                  stdout=subprocess.PIPE, stderr=f, text=True)
        f.close()
        run.procs.append(self.p)
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_pids(1)
        end = time.monotonic() + 10
        while not os.path.exists(sock):
            check(self.p.poll() is None and time.monotonic() < end, "uvsockd did not come up")
            time.sleep(0.05)

    def _read(self):
        for line in self.p.stdout:
            log(f"fake-fdstore: {line.strip()}")
            if line.startswith("fake-fdstore: started pid "):
                with self.cv:
                    pid = int(line.split()[-1])
                    self.pids.append(pid)
                    self.run.pids.append(pid)
                    self.cv.notify_all()

    def wait_pids(self, n, limit=30):
        with self.cv:
            check(self.cv.wait_for(lambda: len(self.pids) >= n, limit),
                  f"fake-fdstore started {len(self.pids)} uvsockd, not {n}")
            return self.pids[n - 1]

    def log_has(self, what):
        with open(self.log_path, errors="replace") as f:
            return what in f.read()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(30)
        for pid in self.pids:
            if pid in self.run.pids and not pid_alive(pid):
                self.run.pids.remove(pid)
        return rc


def case_crash_isolate(run, fdstore=None):
    """uvsockd --isolate; the worker serving the VM is killed with SIGKILL while the guest holds a
    connection to the host, streams to it, and the host holds one to the guest's listener. The
    main process restarts the worker, which adopts the VMM's connection it kept (docs/upgrade.md,
    "Crash survival"): the open connections end, the guest's listener keeps working, new
    connections work both ways, QEMU (stock, no reconnect) is the same process.
    fdstore: the fake-fdstore program; uvsockd (no --isolate) runs under it, is killed instead of
    a worker, and fake-fdstore starts it again with what it stored (docs/upgrade.md, "Without
    --isolate: the systemd fd store")."""
    sock, uds = run.path("vm.sock"), run.path("vm.vsock")
    if fdstore:
        fs = FakeFdstore(run, fdstore, sock, uds)
        d = fs.p
    else:
        d = run.uvsockd("a", sock, uds, ("--isolate", "--control", run.path("vm.ctl")))
    echo_l = Listener(f"{uds}_{ECHO_PORT}", echo)
    streams = Streams(1 << 40)   # more than it can send before the kill
    sink_l = Listener(f"{uds}_{SINK_PORT}", streams.sink_fn)
    q, ctl = boot(run, "vm", sock, run.path("ctl"))
    qmp = Qmp(run.path("vm.qmp"))
    check(ctl.ok("cid") == str(CID), "guest CID")
    ctl.ok(f"listen {LISTEN_PORT}")
    ctl.ok(f"hold 1 {ECHO_PORT}")
    ctl.ok("ping 1")
    ctl.ok(f"hold 2 {SINK_PORT}")
    ctl.ok(f"send 2 {1 << 40}")
    h = host_connect(uds, LISTEN_PORT)
    check(host_roundtrip(h), "host to guest echo")
    retry(lambda: streams.sink["bytes"] >= 4 << 20, "the guest's stream flows", 60)
    if fdstore:
        # The record with the held connections is in the store (it is written when the set
        # of connections changes, at most every 100 ms).
        retry(lambda: fs.log_has(f"vm{CID}: crash-survival record stored in the fd store"),
              "uvsockd stores its record", 30)
        time.sleep(0.3)
        w = fs.wait_pids(1)
    else:
        w = worker_of(d.pid)
        check(w, f"no worker 'uvsockd vm{CID}' under uvsockd {d.pid}")
    t = time.monotonic()
    os.kill(w, signal.SIGKILL)
    log(f"killed {'uvsockd' if fdstore else 'worker'} {w} at {streams.sink['bytes'] >> 20} "
        "MiB streamed")
    # Hang guards, not timing assertions: each end must come, however slowly.
    ans = ctl.cmd("wait_reset 1 30000", 40)
    check(ans in ("OK ECONNRESET", "OK ENOTCONN", "OK EOF"), f"the guest's held socket: {ans}")
    t_reset = time.monotonic() - t
    retry(lambda: guest_stat(ctl, "sendstat")["end"] != "-", "the guest's stream ends", 30)
    check(host_conn_ended(h, 30), "the host's connection to the guest stays open")
    h.close()
    retry(lambda: streams.sink["end"] != "-", "the host's end of the guest's stream ends", 30)
    check(streams.sink["bad"] == 0, f"the guest's stream, up to the kill: {streams.sink}")
    if fdstore:
        nw = fs.wait_pids(2)
        retry(lambda: fs.log_has(f"vm{CID}: adopted the VMM's vhost-user connection"),
              "the new uvsockd adopts the VMM", 30)
        if w in run.pids and not pid_alive(w):
            run.pids.remove(w)
    else:
        nw = worker_of(d.pid)
        check(nw and nw != w, f"no new worker under uvsockd {d.pid} (old {w}, now {nw})")
    # The guest's listener kept working; new connections both ways.
    retry(lambda: ctl.cmd(f"echo {ECHO_PORT} 65536", 30) == "OK",
          "a new guest-to-host connection", 30)
    t_g2h = time.monotonic() - t
    h = host_connect(uds, LISTEN_PORT)
    check(host_roundtrip(h), "a new host-to-guest connection")
    t_h2g = time.monotonic() - t
    check(ctl.ok("accepted") == "2", "the guest's listener")
    check(ctl.ok("cid") == str(CID), "CID")
    check(q.poll() is None, "QEMU exited")
    check(qmp.cmd("query-status").get("status") == "running", "QEMU's VM is not running")
    check(d.poll() is None, "uvsockd's main process (or fake-fdstore) exited")
    TIMINGS.append(("kill -9 to: the guest's held socket ended / a new g2h connection / a new "
                    "h2g connection (s)", (round(t_reset, 2), round(t_g2h, 2),
                                           round(t_h2g, 2))))
    TIMINGS.append(("guest stream checked up to the kill (bytes)", streams.sink["bytes"]))
    h.close()
    ctl.cmd("poweroff", 10)
    q.wait(30)
    if fdstore:
        rc = fs.stop()
        check(rc == 0, f"fake-fdstore (uvsockd) exited with {rc} on SIGTERM")
    else:
        d.send_signal(signal.SIGTERM)
        check(d.wait(30) == 0, f"uvsockd --isolate exited with {d.returncode} on SIGTERM")
    for x in (echo_l, sink_l, qmp, ctl):
        x.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--guest", required=True, help="the static uvsock-lifecycle")
    ap.add_argument("--ctl", help="uvsock-ctl (the upgrade cases)")
    ap.add_argument("--fake-fdstore", help="tests/harness/fake-fdstore (crash-fdstore)")
    ap.add_argument("--case", choices=("reconnect", "backoff", "migrate", "stopped", "snapshot")
                    + STOCK_CASES, required=True)
    ap.add_argument("--qemu-version", default=os.environ.get("UVSOCK_LIFECYCLE_QEMU", "7.2"))
    ap.add_argument("--kernel", default=os.environ.get("UVSOCK_LIFECYCLE_KERNEL", "6.1"))
    ap.add_argument("--mem", default="256")
    ap.add_argument("--load-mb", default="32")
    ap.add_argument("--migrate-limit", type=int, default=240)
    args = ap.parse_args()

    if args.case in STOCK_CASES:
        # Stock QEMU: 7.2 is the system's (Debian bookworm's qemu-system-x86), a newer one the
        # bookworm-backports QEMU scripts/fetch-qemu.sh unpacks into the interop cache.
        if args.qemu_version == "7.2":
            qemu_bin = shutil.which("qemu-system-x86_64")
            if not qemu_bin:
                skip("no qemu-system-x86_64 (apt-get install qemu-system-x86)")
        else:
            qdir = lib('qemu_cached && echo "$QDIR"')
            if not qdir:
                skip("no bookworm-backports QEMU in the interop cache (scripts/fetch-qemu.sh)")
            qemu_bin = qdir.strip() + "/qemu-system-x86_64"
    else:
        pdir = lib(f'qemu_patched_cached {args.qemu_version} && echo "$PDIR"')
        if not pdir:
            skip(f"no QEMU {args.qemu_version} with contrib/qemu's patches in the interop cache")
        qemu_bin = pdir.strip() + "/qemu-system-x86_64"
    if args.case in ("upgrade", "upgrade-refused"):
        helptext = subprocess.run([args.ctl or "uvsock-ctl", "--help"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT).stdout.decode(errors="replace")
        if not any(ln.split()[:1] == ["upgrade"] or " upgrade" in ln
                   for ln in helptext.splitlines()):
            skip(f"{args.ctl} does not know the command 'upgrade' (the live upgrade is not "
                 "built into this tree): nothing to test", "docs/upgrade.md")
    kdir = lib(f'kernel_cached {args.kernel} && echo "$KDIR"')
    if not kdir:
        skip(f"guest kernel {args.kernel} not cached")
    # Its temporary directory only once nothing is left to skip for.
    run = Run(args)
    run.qemu_bin = qemu_bin
    run.kdir = kdir.strip()
    if not shutil.which("cpio"):
        skip("cpio missing")
    # The interop initramfs (its /init runs /bin/uvsock-lifecycle with uvsock.mode=lifecycle),
    # then a second archive adding that program.
    run.initrd = run.path("initrd")
    check(lib(f'build_initramfs "{run.kdir}" "{args.guest}" "{run.initrd}"') is not None,
          "build_initramfs failed")
    extra = run.path("extra")
    os.makedirs(extra + "/bin")
    shutil.copy(args.guest, extra + "/bin/uvsock-lifecycle")
    with open(run.initrd, "ab") as out:
        files = subprocess.run("find . | LC_ALL=C sort", shell=True, cwd=extra,
                               stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0", "--quiet"], cwd=extra,
                       input=files, stdout=out, check=True)
    banner = subprocess.run([run.qemu_bin, "--version"], stdout=subprocess.PIPE).stdout
    log(f"{args.case}: {banner.decode().splitlines()[0]}, kernel {args.kernel}, "
        f"uvsockd {args.daemon}")
    rc = 0
    try:
        if args.case == "reconnect":
            case_reconnect(run)
        elif args.case == "backoff":
            case_backoff(run)
        elif args.case == "crash-isolate":
            case_crash_isolate(run)
        elif args.case == "crash-fdstore":
            check(args.fake_fdstore, "crash-fdstore needs --fake-fdstore")
            case_crash_isolate(run, args.fake_fdstore)
        elif args.case in STOCK_CASES:
            case_upgrade(run, args.case == "upgrade-refused", args.case == "upgrade-isolate")
        else:
            case_migrate(run, "live" if args.case == "migrate" else args.case)
        log(f"PASS {args.case} in {time.monotonic() - T0:.1f} s")
    except (Fail, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
        log(f"FAIL {args.case}: {e}")
        for name in sorted(os.listdir(run.dir)):
            if name.endswith((".serial", ".log")):
                print(f"---- {name} (last lines)")
                with open(run.path(name), errors="replace") as f:
                    print("".join(f.readlines()[-15:]))
        rc = 1
    for what, v in TIMINGS:
        print(f"# timing: {what}: {v if isinstance(v, int) else v}")
    run.cleanup(keep=rc != 0 or os.environ.get("UVSOCK_INTEROP_KEEP") == "1")
    return rc


if __name__ == "__main__":
    sys.exit(main())
