#!/usr/bin/env python3
"""resumeguard benchmark suite driver (stdlib only; started by bench/run.sh).

Starts a throwaway PostgreSQL 15, one resumeguard per named proxy
configuration, and PgBouncer (session mode), all on loopback, then measures:

  pgbench   select-only and TPC-B-like, -M simple/extended/prepared,
            direct vs each resumeguard config vs PgBouncer, interleaved;
            configurations with `sslmode=` are reached over TLS, and
            PgBouncer then runs a second time with client TLS beside them
  langgraph the interrupt protocol (park, get_state, resume) via
            bench/lg_bench.py, direct vs each resumeguard config
  memory    RSS growth of a fresh proxy process with N idle client sessions
  distance  the interrupt protocol with PostgreSQL behind a latency relay
            (examples/latency_relay) at several one-way latencies, via
            bench/lg_distance.py: each proxy's own claims traffic crosses
            the relay too; per operation p50s, round trips on the wire
            and the proxy's decisions, and N concurrent resumes

Writes <out>/<name>.json and <out>/<name>.md. Every wait is bounded; every
process it starts is stopped on exit (and its pid written to
<work>/pids so run.sh's trap can stop it if this driver dies).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import platform
import pwd
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HOST = "127.0.0.1"
USER = "postgres"
DB = "bench"
LG_DB = "lgbench"
DIST_DB = "lgdistance"
IS_ROOT = os.geteuid() == 0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def median(xs):
    return statistics.median(xs) if xs else None


def median_interval(xs, level: float = 0.95):
    """A distribution-free confidence interval for the median of xs: the
    order statistics x(k) and x(n+1-k) for the largest k whose coverage,
    1 - 2 P(Binomial(n, 1/2) < k), is still at least `level`. Returns
    (low, high, coverage), or None when even the whole range covers less
    (fewer than 6 values at 95%)."""
    n = len(xs)
    below, best = 0.0, None  # below: P(Binomial(n, 1/2) < k)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n
        coverage = 1 - 2 * below
        if coverage < level:
            break
        best = (k, coverage)
    if best is None:
        return None
    k, coverage = best
    s = sorted(xs)
    return s[k - 1], s[n - k], coverage


def as_postgres() -> list[str]:
    """Prefix that runs a command as the postgres OS user (exec, no fork)."""
    if not IS_ROOT:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def chown_pg(path: Path) -> None:
    if IS_ROOT:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


def pg_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --------------------------------------------------------------------------- processes
class Procs:
    """Every long-running child, with its pid recorded for run.sh's trap."""

    def __init__(self, work: Path):
        self.work = work
        self.live: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        log_path = self.work / f"{name}.log"
        out = open(log_path, "ab")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=kw.pop("stdout", out),
                             stderr=out, start_new_session=True, **kw)
        self.live.append((name, p))
        with open(self.work / "pids", "a") as f:
            f.write(f"{p.pid}\n")
        return p

    def stop(self, p: subprocess.Popen, timeout: float = 15) -> int | None:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.live = [(n, q) for n, q in self.live if q is not p]
        return p.returncode

    def stop_all(self) -> None:
        for _, p in list(self.live):
            try:
                self.stop(p)
            except Exception as e:  # noqa: BLE001 - cleanup must go on
                log(f"cleanup: {e}")


class Postgres:
    def __init__(self, work: Path, pg_bin: Path, max_connections: int):
        self.bin = pg_bin
        self.dir = work / "pg"
        self.dir.mkdir()
        chown_pg(self.dir)
        self.data = self.dir / "data"
        self.port = free_port()
        self.max_connections = max_connections
        self.started = False

    def run(self, args, timeout=300, check=True):
        cp = subprocess.run(as_postgres() + args, cwd=self.dir, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=timeout, env=pg_env())
        if check and cp.returncode != 0:
            raise RuntimeError(f"{args} failed: {cp.stdout}\n{cp.stderr}")
        return cp

    def start(self) -> None:
        self.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                  "-E", "UTF8", "--locale=C", "--no-sync"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"""
# --- resumeguard benchmark ---
listen_addresses = '{HOST}'
port = {self.port}
unix_socket_directories = '{self.dir}'
max_connections = {self.max_connections}
shared_buffers = 256MB
synchronous_commit = off
max_wal_size = 4GB
checkpoint_timeout = 30min
log_min_messages = warning
""")
        self.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"),
                  "-w", "-t", "120", "start"])
        self.started = True

    def stop(self) -> None:
        if self.started:
            self.started = False
            self.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                      "-t", "60", "stop"], check=False)

    def psql(self, sql: str, db: str = "postgres", timeout: float = 600) -> str:
        cp = subprocess.run([str(self.bin / "psql"), "-h", HOST, "-p", str(self.port), "-U", USER,
                             "-d", db, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-c", sql],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout, env=pg_env())
        if cp.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {cp.stderr}")
        return cp.stdout.strip()

    def postmaster(self) -> int:
        """The server's first process, from the pid file it writes."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def backends(self) -> int:
        return int(self.psql("select count(*) from pg_stat_activity where backend_type = 'client backend'"))

    def wait_backends_below(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.backends() < n:
                return
            time.sleep(0.25)
        log(f"warning: still {self.backends()} client backends after {timeout}s")


class Resumeguard:
    def __init__(self, procs: Procs, work: Path, binary: Path, name: str, args: list[str],
                 upstream_port: int, admin_port: int | None = None, upstream_url: str | None = None):
        self.procs, self.name, self.args = procs, name, args
        # "mem-NAME" / "prof-NAME" / "dist-NAME" instances run the configuration NAME.
        prefix = name.split("-", 1)[0]
        self.config_name = name.split("-", 1)[1] if prefix in ("mem", "prof", "dist") else name
        self.port = free_port()
        # A configuration may name its own upstream; "@SOCKET@" stands for
        # the benchmark server's Unix socket.
        args = [a.replace("@SOCKET@", f"unix:{work / 'pg'}/.s.PGSQL.{upstream_port}") for a in args]
        # "@TLS_CERT@" / "@TLS_KEY@": the benchmark's client-side certificate.
        if any("@TLS_" in a for a in args):
            cert, key = tls_files(work)
            args = [a.replace("@TLS_CERT@", str(cert)).replace("@TLS_KEY@", str(key)) for a in args]
        upstream = [] if "--upstream" in args else \
            ["--upstream", upstream_url or f"{HOST}:{upstream_port}"]
        # Its own admin API (and /metrics) when the harness reads its counters.
        # Otherwise none: proxies running side by side would all want the
        # default address, and an address in use stops a proxy at start.
        self.admin_url = None
        if "--admin-listen" in args:
            admin = []
        elif admin_port is None:
            admin = ["--admin-listen", "off"]
        else:
            admin = ["--admin-listen", f"{HOST}:{admin_port}"]
            self.admin_url = f"http://{HOST}:{admin_port}"
        self.argv = [str(binary), "serve", "--listen", f"{HOST}:{self.port}", *upstream,
                     "--audit-db", str(work / f"{name}-{self.port}-audit.sqlite"), *admin, *args]
        # A configuration may run another binary with the same command line
        # (`bin=PATH`: the copy-relay baseline).
        if self.config_name in CONFIG_BIN:
            self.argv[0] = str(CONFIG_BIN[self.config_name])
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "Resumeguard":
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "resumeguard=warn")
        env.update(CONFIG_ENV.get(self.config_name, {}))
        self.proc = self.procs.start(f"{self.name}-{self.port}", self.argv, cwd=REPO, env=env,
                                     stdout=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        out = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"resumeguard {self.name} exited {self.proc.returncode}; "
                                   f"argv {self.argv}; see {self.procs.work}")
            try:
                out += self.proc.stdout.read() or b""
            except (BlockingIOError, TypeError):
                pass
            if b"DATABASE_URL=" in out and port_accepts(self.port):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"resumeguard {self.name} not ready within {timeout}s")

    def stop(self) -> int | None:
        return self.procs.stop(self.proc) if self.proc else None


class PgBouncer:
    def __init__(self, procs: Procs, work: Path, upstream_port: int, pool_size: int,
                 max_clients: int, tag: str, tls: bool = False, unpooled: bool = False):
        self.procs = procs
        self.port = free_port()
        self.dir = work / f"pgbouncer-{tag}"
        self.dir.mkdir()
        chown_pg(self.dir)
        ini = self.dir / "pgbouncer.ini"
        users = self.dir / "userlist.txt"
        # auth_type=trust still wants the user listed in auth_file.
        users.write_text(f'"{USER}" ""\n')
        ini.write_text(f"""[databases]
* = host={HOST} port={upstream_port}

[pgbouncer]
listen_addr = {HOST}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = session
max_client_conn = {max_clients}
default_pool_size = {pool_size}
max_db_connections = 0
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits
logfile = {self.dir / 'pgbouncer.log'}
log_connections = 0
log_disconnections = 0
""")
        if unpooled:
            # Each server connection serves one client and is closed, as
            # every other target's upstream connection is: its backend
            # starts cold in each run instead of warm from the last one.
            with open(ini, "a") as f:
                f.write("server_lifetime = 0\n")
        if tls:
            # The same certificate as the TLS resumeguard configurations; a
            # client without TLS is refused, as under `--require-tls`.
            cert, key = tls_files(work)
            with open(ini, "a") as f:
                f.write(f"client_tls_sslmode = require\nclient_tls_cert_file = {cert}\n"
                        f"client_tls_key_file = {key}\n")
        for p in (ini, users):
            chown_pg(p)
        self.argv = as_postgres() + ["pgbouncer", str(ini)]
        self.tag = tag
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "PgBouncer":
        self.proc = self.procs.start(f"pgbouncer-{self.tag}", self.argv, cwd=self.dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}; see {self.dir}")
            if port_accepts(self.port):
                return self
            time.sleep(0.05)
        raise RuntimeError("pgbouncer not ready")

    def stop(self):
        return self.procs.stop(self.proc) if self.proc else None


def tls_files(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for the client side of the TLS
    targets (made once per run, readable by the postgres user)."""
    d = work / "tls"
    cert, key = d / "cert.pem", d / "key.pem"
    if not cert.exists():
        d.mkdir(exist_ok=True)
        cp = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
                             "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                            capture_output=True, text=True, timeout=60)
        if cp.returncode != 0:
            raise RuntimeError(f"openssl req failed: {cp.stderr}")
        for f in (d, cert, key):
            chown_pg(f)
    return cert, key


# --------------------------------------------------------------------------- pgbench
TPS_RE = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
TXNS_RE = re.compile(r"^number of transactions actually processed: ([0-9]+)", re.M)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """utime and stime of a whole process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def server_cpu_seconds(postmaster: int) -> float:
    """utime + stime of a whole PostgreSQL server: the postmaster, every
    process it has started and not yet reaped, and (its cutime + cstime) every
    one it has reaped, so backends that ended with their client still count.
    Read until the reaped part holds still across the reading of the live
    ones, so a backend reaped meanwhile is counted once."""
    def reaped() -> float:
        f = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[13]) + int(f[14])) / CLK_TCK

    while True:
        before = reaped()
        live = cpu_seconds(postmaster)
        for kid in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
            try:
                live += cpu_seconds(int(kid))
            except (FileNotFoundError, ProcessLookupError):
                pass  # gone between the listing and the reading: the next pass sees it reaped
        if reaped() == before:
            return before + live


def children_cpu_seconds() -> float:
    """utime + stime of this process's reaped children (pgbench, once a run ends)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads)."""
    return sum(cpu_times(pid))


class SwitchCounter:
    """`perf stat` (software counters, which work where hardware ones do
    not) attached to a whole process, its threads and the threads it starts
    while attached: context switches and CPU migrations over one run."""

    EVENTS = ("context-switches", "cpu-migrations")

    def __init__(self, pid: int, work: Path):
        self.out = work / f"perf-stat-{pid}.csv"
        self.proc = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(self.EVENTS),
                                      "-p", str(pid), "-o", str(self.out)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        # perf attaches to every thread before the run starts.
        time.sleep(0.3)

    def stop(self) -> dict[str, float]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        counts = {}
        for line in self.out.read_text().splitlines():
            f = line.split(",")
            if len(f) > 2 and f[2] in self.EVENTS and f[0].replace(".", "", 1).isdigit():
                counts[f[2]] = float(f[0])
        return counts


def run_pgbench(pg_bin: Path, port: int, args: list[str], duration: int, who=None,
                sslmode: str | None = None, switches: Path | None = None,
                server: int | None = None) -> tuple[float, float | None]:
    """TPS, and the CPU the process behind `port` spent per transaction (µs)
    when it is one of ours to watch (`who`). `sslmode`: libpq's, for a TLS
    target. The watched process's user-space share (µs per transaction)
    goes into `LAST_COUNTS`, and with `switches` (a directory for perf's
    output) its context switches and migrations per transaction. With
    `server` (the postmaster's pid), `LAST_COUNTS` also gets the CPU per
    transaction of the PostgreSQL server and of pgbench itself."""
    argv = [str(pg_bin / "pgbench"), "-h", HOST, "-p", str(port), "-U", USER, "-n",
            "-T", str(duration), *args, DB]
    env = pg_env()
    if sslmode:
        env["PGSSLMODE"] = sslmode
    LAST_COUNTS.clear()
    watched = who is not None and who.poll() is None
    counter = SwitchCounter(who.pid, switches) if watched and switches else None
    cpu_before = cpu_times(who.pid) if watched else None
    server_before = server_cpu_seconds(server) if server else None
    client_before = children_cpu_seconds()
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=duration + 120, env=env)
    # Before perf is reaped, so only pgbench is in the children's time.
    client_s = children_cpu_seconds() - client_before
    server_s = server_cpu_seconds(server) - server_before if server else None
    counts = counter.stop() if counter else {}
    m = TPS_RE.search(cp.stdout)
    if cp.returncode != 0 or not m:
        if who is not None and who.poll() is not None:
            raise RuntimeError(f"the process behind port {port} (pid {who.pid}) exited with "
                               f"{who.returncode} before this pgbench run")
        raise RuntimeError(f"pgbench failed ({cp.returncode}): {' '.join(argv)}\n"
                           f"{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    cpu_us = None
    txns = TXNS_RE.search(cp.stdout)
    if server_s is not None and txns and int(txns.group(1)) > 0:
        n = int(txns.group(1))
        LAST_COUNTS["server-us"] = server_s * 1e6 / n
        LAST_COUNTS["client-us"] = client_s * 1e6 / n
    if cpu_before is not None and txns and int(txns.group(1)) > 0:
        n = int(txns.group(1))
        user, system = cpu_times(who.pid)
        cpu_us = (user + system - sum(cpu_before)) * 1e6 / n
        LAST_COUNTS["user-us"] = (user - cpu_before[0]) * 1e6 / n
        LAST_COUNTS.update({k: v / n for k, v in counts.items()})
    return float(m.group(1)), cpu_us


# Per transaction, of the last run_pgbench: the watched process's
# user-space CPU (µs) and, when counted, context switches and migrations;
# the PostgreSQL server's and pgbench's CPU (µs) when the server was named.
LAST_COUNTS: dict[str, float] = {}


def pgbench_suite(a, pg: Postgres, targets: dict[str, int], who: dict,
                  sslmodes: dict[str, str]) -> dict:
    names = list(targets)
    cells = [(w, m) for w in a.workloads.split(",") for m in ("simple", "extended", "prepared")]
    results = {(w, m, t): [] for (w, m) in cells for t in names}
    base = ["-c", str(a.clients), "-j", str(a.threads)]
    log(f"pgbench warm-up ({a.warmup}s per target)")
    for t in names:
        run_pgbench(a.pg_bin, targets[t], base + ["-S", "-M", "prepared"], a.warmup, who.get(t),
                    sslmodes.get(t))
    cpu = {(w, m, t): [] for (w, m) in cells for t in names}
    switches = {(w, m, t): [] for (w, m) in cells for t in names}
    user = {(w, m, t): [] for (w, m) in cells for t in names}
    server = {(w, m, t): [] for (w, m) in cells for t in names}
    client = {(w, m, t): [] for (w, m) in cells for t in names}
    counting = a.work if a.perf_stat else None
    postmaster = pg.postmaster()
    total = a.rounds * len(cells) * len(names)
    k = 0
    for r in range(a.rounds):
        for ci, (w, m) in enumerate(cells):
            # Rotate who goes first so no target always runs right after another.
            shift = (r + ci) % len(names)
            order = names[shift:] + names[:shift]
            for t in order:
                k += 1
                extra = ["-S"] if w == "select-only" else []
                tps, cpu_us = run_pgbench(a.pg_bin, targets[t], base + extra + ["-M", m],
                                          a.duration, who.get(t), sslmodes.get(t), counting,
                                          postmaster)
                results[(w, m, t)].append(tps)
                if cpu_us is not None:
                    cpu[(w, m, t)].append(cpu_us)
                cpu_note = f" {cpu_us:7.1f} µs CPU/tx" if cpu_us is not None else ""
                if "user-us" in LAST_COUNTS:
                    user[(w, m, t)].append(LAST_COUNTS["user-us"])
                if "server-us" in LAST_COUNTS:
                    server[(w, m, t)].append(LAST_COUNTS["server-us"])
                    client[(w, m, t)].append(LAST_COUNTS["client-us"])
                if "context-switches" in LAST_COUNTS:
                    switches[(w, m, t)].append(LAST_COUNTS["context-switches"])
                    cpu_note += f" {LAST_COUNTS['context-switches']:5.2f} switches/tx"
                log(f"pgbench [{k}/{total}] round {r + 1} {w:11s} {m:8s} {t:22s} {tps:10.1f} tps{cpu_note}")
    out = []
    for (w, m) in cells:
        direct = results[(w, m, "direct")]
        for t in names:
            tps = results[(w, m, t)]
            ratios = [x / d for x, d in zip(tps, direct)]
            out.append({
                "workload": w, "mode": m, "target": t, "tps": tps,
                "median_tps": median(tps), "min_tps": min(tps), "max_tps": max(tps),
                "ratios_to_direct": ratios, "ratio_to_direct": median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios),
                "cpu_us_per_tx": cpu[(w, m, t)],
                "median_cpu_us_per_tx": median(cpu[(w, m, t)]) if cpu[(w, m, t)] else None,
                "user_us_per_tx": user[(w, m, t)],
                "median_user_us_per_tx": median(user[(w, m, t)]) if user[(w, m, t)] else None,
                "switches_per_tx": switches[(w, m, t)],
                "server_us_per_tx": server[(w, m, t)],
                "median_server_us_per_tx": median(server[(w, m, t)]) if server[(w, m, t)] else None,
                "client_us_per_tx": client[(w, m, t)],
                "median_client_us_per_tx": median(client[(w, m, t)]) if client[(w, m, t)] else None,
                "median_switches_per_tx": median(switches[(w, m, t)]) if switches[(w, m, t)] else None,
            })
    return {"clients": a.clients, "threads": a.threads, "scale": a.scale, "rounds": a.rounds,
            "duration_s": a.duration, "sslmodes": sslmodes, "cells": out}


# --------------------------------------------------------------------------- memory
def startup_packet(user: str, db: str) -> bytes:
    body = struct.pack("!i", 196608)
    for k, v in (("user", user), ("database", db), ("application_name", "rg-bench-idle")):
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def open_session(port: int, timeout: float = 15) -> socket.socket:
    """A real session: StartupMessage, trust auth, read up to ReadyForQuery."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(startup_packet(USER, DB))
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while len(buf) >= 5:
            tag = buf[0:1]
            (n,) = struct.unpack("!i", buf[1:5])
            if len(buf) < n + 1:
                break
            if tag == b"E":
                raise RuntimeError(f"server refused the session: {buf[5:n + 1]!r}")
            if tag == b"Z":
                return s
            buf = buf[n + 1:]
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed during startup")
        buf += chunk
    raise RuntimeError("startup timed out")


def measure_idle(pid: int, port: int, n: int) -> dict:
    warm = [open_session(port) for _ in range(min(10, n))]
    for s in warm:
        s.close()
    time.sleep(1.0)
    before = vm_rss_kib(pid)
    socks = []
    t0 = time.monotonic()
    try:
        for _ in range(n):
            socks.append(open_session(port))
        opened = time.monotonic() - t0
        time.sleep(2.0)
        after = vm_rss_kib(pid)
    finally:
        for s in socks:
            s.close()
    return {"connections": n, "rss_before_kib": before, "rss_after_kib": after,
            "kib_per_connection": (after - before) / n, "open_seconds": round(opened, 2)}


def memory_suite(a, procs: Procs, work: Path, pg: Postgres, proxies: dict[str, list[str]]) -> dict:
    out = {}
    for name, args in proxies.items():
        if not in_part(name, "memory"):
            continue
        rg = Resumeguard(procs, work, a.binary, f"mem-{name}", args, pg.port).start()
        try:
            r = measure_idle(rg.proc.pid, rg.port, a.mem_conns)
        finally:
            rg.stop()
        out[name] = r
        log(f"memory {name}: {r['kib_per_connection']:.1f} KiB per idle connection "
            f"({r['rss_before_kib']} -> {r['rss_after_kib']} KiB, {a.mem_conns} sessions)")
        pg.wait_backends_below(20)
    pb = PgBouncer(procs, work, pg.port, pool_size=a.mem_conns + 20,
                   max_clients=a.mem_conns + 50, tag="mem").start()
    try:
        r = measure_idle(pb.proc.pid, pb.port, a.mem_conns)
    finally:
        pb.stop()
    out["pgbouncer"] = r
    log(f"memory pgbouncer: {r['kib_per_connection']:.1f} KiB per idle connection")
    pg.wait_backends_below(20)
    return out


# --------------------------------------------------------------------------- profile
def perf_works() -> bool:
    if not shutil.which("perf"):
        return False
    cp = subprocess.run(["perf", "record", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"],
                        capture_output=True, timeout=60)
    return cp.returncode == 0


def profile_suite(a, procs: Procs, work: Path, pg: Postgres, name: str, args: list[str]) -> dict:
    """Where resumeguard spends its time under pgbench select-only, per mode.

    perf (software cpu-clock sampling, works where hardware counters do
    not) attached to a resumeguard under load with a full pgbench client
    set; else callgrind (instruction counts, reproducible) on a short
    single-client run. Reports go to <out>/profile-<mode>.txt.
    """
    tool = a.profiler if a.profiler != "auto" else ("perf" if perf_works() else "callgrind")
    a.out.mkdir(parents=True, exist_ok=True)
    out = {"tool": tool, "reports": {}}
    for mode in a.profile_modes.split(","):
        report = a.out / f"profile-{mode}.txt"
        if tool == "perf":
            rg = Resumeguard(procs, work, a.binary, f"prof-{name}", args, pg.port).start()
            data = work / f"perf-{mode}.data"
            try:
                rec = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-g",
                                        "--call-graph", "dwarf,16384", "-p", str(rg.proc.pid),
                                        "-o", str(data)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
                time.sleep(1)
                tps, _ = run_pgbench(a.pg_bin, rg.port, ["-c", str(a.clients), "-j", str(a.threads),
                                                         "-S", "-M", mode], a.profile_seconds)
                rec.send_signal(signal.SIGINT)
                rec.wait(timeout=120)
            finally:
                rg.stop()
            flat = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                                   "--sort", "dso,sym", "--percent-limit", "0.5", "-g", "none"],
                                  capture_output=True, text=True, timeout=900).stdout
            tree = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--children",
                                   "--sort", "sym", "--percent-limit", "3", "-g",
                                   "caller,0.5,callee,function,percent", "--max-stack", "30"],
                                  capture_output=True, text=True, timeout=900).stdout
            report.write_text(f"# perf cpu-clock, pgbench -S -M {mode}, {a.clients} clients, "
                              f"{a.profile_seconds} s, {tps:.0f} tps through the profiled proxy\n\n"
                              f"## self time by dso, symbol\n{flat}\n\n## inclusive (children)\n{tree}")
        else:
            cg = work / f"callgrind-{mode}.out"
            rg = Resumeguard(procs, work, a.binary, f"prof-{name}", args, pg.port)
            rg.argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}"] + rg.argv
            rg.start(timeout=300)
            try:
                n = a.profile_transactions
                cp = subprocess.run([str(a.pg_bin / "pgbench"), "-h", HOST, "-p", str(rg.port), "-U", USER,
                                     "-n", "-c", "1", "-t", str(n), "-S", "-M", mode, DB],
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=1800, env=pg_env())
                tps = float(TPS_RE.search(cp.stdout).group(1)) if TPS_RE.search(cp.stdout) else 0.0
            finally:
                rg.stop()
            ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=99", str(cg)],
                                 capture_output=True, text=True, timeout=600).stdout
            inc = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=95", str(cg)],
                                 capture_output=True, text=True, timeout=600).stdout
            report.write_text(f"# callgrind, pgbench -S -M {mode}, 1 client, {n} transactions "
                              f"(whole process incl. startup)\n\n## self\n{ann}\n\n## inclusive\n{inc}")
        out["reports"][mode] = str(report)
        log(f"profile ({tool}) -M {mode}: {report}")
    return out


# --------------------------------------------------------------------------- langgraph
def find_python(a) -> str | None:
    cands = [a.lg_python] if a.lg_python else [str(REPO / ".venv/bin/python"), "/work/venv-probe/bin/python"]
    for c in cands:
        if c and Path(c).exists():
            cp = subprocess.run([c, "-c", "import langgraph.checkpoint.postgres, psycopg_pool"],
                                capture_output=True, timeout=120)
            if cp.returncode == 0:
                return c
    return None


def langgraph_suite(a, work: Path, pg: Postgres, targets: dict[str, int]) -> dict:
    py = find_python(a)
    if not py:
        log("langgraph: no Python with langgraph + psycopg_pool found; skipped")
        return {"skipped": "no Python environment with langgraph (run integration/run_all.sh "
                           "to create .venv, or pass --lg-python)"}
    pg.psql(f"create database {LG_DB}")
    out_path = work / "lg.json"
    argv = [py, str(BENCH / "lg_bench.py"), "--iterations", str(a.lg_iterations),
            "--threads", str(a.lg_threads), "--rounds", str(a.lg_rounds),
            "--warmup", str(a.lg_warmup), "--out", str(out_path)]
    for name, port in targets.items():
        argv += ["--target", f"{name}=postgresql://{USER}@{HOST}:{port}/{LG_DB}?connect_timeout=10"]
    log(f"langgraph: {py} ({a.lg_iterations} iterations per variant and target)")
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=a.lg_timeout, env=pg_env(),
                        text=True)
    if cp.returncode != 0:
        raise RuntimeError(f"lg_bench.py exited {cp.returncode}")
    res = json.loads(out_path.read_text())
    res["python"] = py
    return res


# --------------------------------------------------------------------------- distance
class LatencyRelay:
    """examples/latency_relay in front of PostgreSQL: a fixed one-way delay
    each way, and its round-trip counts per application_name on a stats port."""

    def __init__(self, procs: Procs, binary: Path, one_way_ms: float, upstream_port: int, tag: str):
        self.procs, self.tag = procs, tag
        self.port, self.stats_port = free_port(), free_port()
        self.argv = [str(binary), "--listen", f"{HOST}:{self.port}", "--upstream",
                     f"{HOST}:{upstream_port}", "--one-way-ms", f"{one_way_ms:g}",
                     "--stats-listen", f"{HOST}:{self.stats_port}"]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "LatencyRelay":
        self.proc = self.procs.start(f"relay-{self.tag}-{self.port}", self.argv)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"latency_relay exited {self.proc.returncode}; argv {self.argv}")
            if port_accepts(self.port) and port_accepts(self.stats_port):
                return self
            time.sleep(0.05)
        raise RuntimeError("latency_relay not ready")

    def stop(self):
        return self.procs.stop(self.proc) if self.proc else None


def relay_binary(a) -> Path | None:
    """The latency relay, built (release profile) if it is missing."""
    if not a.relay_binary.exists():
        log(f"{a.relay_binary} missing: cargo build --release --example latency_relay")
        cp = subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "latency_relay"],
                            cwd=REPO, stdin=subprocess.DEVNULL, timeout=1800)
        if cp.returncode != 0 or not a.relay_binary.exists():
            return None
    return a.relay_binary


def distance_suite(a, procs: Procs, work: Path, pg: Postgres, proxies: dict[str, list[str]]) -> dict:
    """Per one-way latency: a relay per target (direct, and each proxy
    configuration in parts=distance, whose upstream and claims store are
    then the relay), then bench/lg_distance.py against them."""
    py = find_python(a)
    if not py:
        log("distance: no Python with langgraph + psycopg_pool found; skipped")
        return {"skipped": "no Python environment with langgraph (run integration/run_all.sh "
                           "to create .venv, or pass --lg-python)"}
    relay_bin = relay_binary(a)
    if relay_bin is None:
        raise RuntimeError("distance: no latency relay binary (cargo build --release --example latency_relay)")
    configs = {n: args for n, args in proxies.items() if in_part(n, "distance")}
    for n, args in list(configs.items()):
        if "--upstream" in args:
            log(f"distance: configuration {n} names its own upstream; not measured at a distance")
            del configs[n]
    if a.distance_concurrency and a.distance_concurrency_ms not in a.distance_latencies:
        log(f"distance: warning: --distance-concurrency-ms {a.distance_concurrency_ms:g} is not "
            f"among the latencies {a.distance_latencies}; no concurrency run")
    pg.psql(f"create database {DIST_DB}")
    out = {"python": py, "configs": list(configs), "latencies": [],
           "baseline": next((n for n, args in configs.items() if "--no-enforce" in args), "direct"),
           "concurrency_ms": a.distance_concurrency_ms}
    for ms in a.distance_latencies:
        started = []
        try:
            relays = {"direct": LatencyRelay(procs, relay_bin, ms, pg.port, f"{ms:g}ms-direct").start()}
            started.append(relays["direct"])
            rgs = {}
            for n, args in configs.items():
                relays[n] = LatencyRelay(procs, relay_bin, ms, pg.port, f"{ms:g}ms-{n}").start()
                started.append(relays[n])
                # The upstream names the application's database, so the
                # claims schema is there too (as a deployment's upstream URL
                # would have it), not in `postgres`.
                rgs[n] = Resumeguard(procs, work, a.binary, f"dist-{n}", args, relays[n].port,
                                     admin_port=free_port(),
                                     upstream_url=f"postgres://{USER}@{HOST}:{relays[n].port}/{DIST_DB}"
                                     ).start()
                started.append(rgs[n])
            ports = {"direct": relays["direct"].port, **{n: r.port for n, r in rgs.items()}}
            out_path = work / f"distance-{ms:g}.json"
            argv = [py, str(BENCH / "lg_distance.py"), "--one-way-ms", f"{ms:g}",
                    "--iterations", str(a.distance_iterations), "--warmup", str(a.lg_warmup),
                    "--setup-dsn", f"postgresql://{USER}@{HOST}:{pg.port}/{DIST_DB}",
                    "--out", str(out_path)]
            for n, port in ports.items():
                argv += ["--target", f"{n}=postgresql://{USER}@{HOST}:{port}/{DIST_DB}?connect_timeout=10",
                         "--relay", f"{n}={HOST}:{relays[n].stats_port}"]
                if n in rgs and rgs[n].admin_url:
                    argv += ["--admin", f"{n}={rgs[n].admin_url}"]
            if ms == a.distance_concurrency_ms and a.distance_concurrency:
                argv += ["--concurrency", str(a.distance_concurrency),
                         "--concurrency-rounds", str(a.distance_rounds)]
            log(f"distance {ms:g} ms one-way: {', '.join(ports)} "
                f"({a.distance_iterations} iterations each)")
            cp = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=a.lg_timeout, env=pg_env(),
                                text=True, cwd=BENCH)
            if cp.returncode != 0:
                raise RuntimeError(f"lg_distance.py exited {cp.returncode}")
            out["latencies"].append(json.loads(out_path.read_text()))
        finally:
            for proc in reversed(started):
                proc.stop()
        pg.wait_backends_below(20)
    return out


# Connections the application opened (the saver's, the marked inspector's),
# as the relay names them; the rest are the proxy's own.
APP_NAMES = ("", "inspector")


def fmt_turns(counts: dict) -> str:
    """Round trips on the wire while the operation ran: the application's
    + the proxy's own by name; then [the proxy's own after it returned]."""
    turns, later = counts["turns"], counts.get("after", {})
    app = sum(v for k, v in turns.items() if k in APP_NAMES)
    own = [f"{k} {v:g}" for k, v in sorted(turns.items()) if k not in APP_NAMES and v]
    after = [f"{k} {v:g}" for k, v in sorted(later.items()) if v]
    return (f"{app:g}" + (f" + {', '.join(own)}" if own else "")
            + (f" [after: {', '.join(after)}]" if after else ""))


def fmt_decisions(metrics: dict) -> str:
    """The proxy's decision counters as `op n` (store calls by op; fence
    lookups by outcome)."""
    parts = []
    for k, v in sorted(metrics.items()):
        label = re.search(r'(?:op|outcome|where)="([^"]+)"', k)
        if not label or not v:
            continue
        if k.startswith("resumeguard_claims_store_seconds_count"):
            parts.append(f"{label.group(1)} {v:g}")
        elif k.startswith("resumeguard_fence_lookups_total"):
            parts.append(f"fence:{label.group(1)} {v:g}")
        elif k.startswith("resumeguard_fence_checks_total"):
            parts.append(f"fence without lookup:{label.group(1)} {v:g}")
        elif k.startswith("resumeguard_claims_total"):
            parts.append(f"claims:{label.group(1)} {v:g}")
    return ", ".join(parts) or "none"


def own_per_call(burst: dict) -> str:
    """The proxy's own round trips over a burst's calls, during + after."""
    def own(rounds):
        return sum(v for turns in rounds for k, v in turns.items() if k not in APP_NAMES)
    during, after = own(burst.get("turns", [])), own(burst.get("turns_after", []))
    if not (during or after):
        return ""
    return f"{during / burst['calls']:.1f} + {after / burst['calls']:.1f}"


DIST_OPS = (("park", "park (invoke to the interrupt)"),
            ("get_state", "get_state, unmarked"),
            ("resume_held", "resume after an unmarked get_state (claim held)"),
            ("get_state_marked", "get_state, marked inspection"),
            ("resume", "resume after a marked get_state (resume takes the claim)"))


def render_distance(dist: dict) -> list[str]:
    if "skipped" in dist:
        return ["## At network distance", "", f"skipped: {dist['skipped']}", ""]
    base = dist["baseline"]
    ons = [c for c in dist["configs"] if c != base]
    L = ["## At network distance", "",
         "Every target reaches PostgreSQL through its own `examples/latency_relay` (fixed one-way "
         "delay each way, pipelining kept); a proxy's claims store is the database it fronts, so "
         "its decisions cross the relay too. The application sits next to the proxy (loopback). "
         f"Sync saver, one connection; p50 ms over the iterations (interleaved). Ratio = p50 ÷ "
         f"`{base}` p50; added round trips = (p50 − `{base}` p50) ÷ (2 × one-way), and ÷ the "
         "relay's measured round trip (`SELECT 1`, below). Round trips on "
         "the wire: the relay's count of client turns (bytes after the server last spoke), median "
         "per operation: the application's connections + the proxy's own, by application_name, "
         "while the operation ran; [after: the proxy's own from its return until the relay was "
         "quiet again, i.e. work off the data path]. "
         "Decisions: the proxy's `resumeguard_claims_store_seconds_count` by op, "
         "`resumeguard_fence_lookups_total` by outcome and (where the build has it) "
         "`resumeguard_fence_checks_total` by where, diffed around the operation (median).", ""]
    hdr = ["one-way ms (load avg)", "operation", "n"] + [f"{t} p50 ms (p25–p75)" for t in ["direct", base] + ons]
    for o in ons:
        hdr += [f"{o} ÷ {base}", f"{o} added round trips (nominal; measured)"]
    hdr += [f"round trips on the wire: {t}" for t in ["direct", base] + ons]
    hdr += [f"decisions: {o}" for o in ons]
    L += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for lat in dist["latencies"]:
        ms, sync = lat["one_way_ms"], lat["sync"]
        for op, label in DIST_OPS:
            if op not in sync.get(base, {}):
                continue
            row = [f"{ms:g} ({lat['load_avg_at_start'][0]:.1f})", label, str(sync[base][op]["n"])]
            row += [f"{sync[t][op]['p50_ms']:.2f} ({sync[t][op]['p25_ms']:.1f}–{sync[t][op]['p75_ms']:.1f})"
                    if op in sync.get(t, {}) else "" for t in ["direct", base] + ons]
            b = sync[base][op]["p50_ms"]
            for o in ons:
                v = sync[o][op]["p50_ms"]
                rtt = (lat.get("select1") or {}).get("p50_ms")
                measured = f"; {(v - b) / rtt:+.1f}" if rtt else ""
                row += [f"{v / b:.2f}×", f"{(v - b) / (2 * ms):+.1f}{measured}" if ms else "–"]
            row += [fmt_turns(sync[t][op]["counts"]) if op in sync.get(t, {}) else ""
                    for t in ["direct", base] + ons]
            row += [fmt_decisions(sync[o][op]["counts"]["metrics"]) for o in ons]
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    L += ["Measured round trip of the relay (`SELECT 1` from psycopg through the direct target's "
          "relay, p50 ms): " + ", ".join(
              f"{lat['one_way_ms']:g} ms one-way → {lat['select1']['p50_ms']:.2f}"
              for lat in dist["latencies"] if lat.get("select1")) + ".", ""]
    for lat in dist["latencies"]:
        conc = lat.get("concurrency")
        if not conc:
            continue
        L += [f"### {conc['threads']} concurrent parks / resumes at {lat['one_way_ms']:g} ms one-way", "",
              f"One `ConnectionPool` of {conc['threads']} connections per target; per round, "
              f"{conc['threads']} threads park {conc['threads']} fresh threads at once, then resume "
              f"them at once; {conc['rounds']} rounds, targets interleaved. Client: the time of "
              "each `invoke` (the Python client's GIL and this host's 2 cores included). "
              "Decisions: the proxy's claim store calls in the bursts "
              "(`resumeguard_claims_store_seconds`, all ops), per second of burst wall time; "
              "their p50/p99 are the histogram's bucket bounds (≤). Every burst starts once the "
              "relay is quiet; *drain* is how long after the burst the proxy's own traffic went "
              "on (its evidence worker), per round.", "",
              "| target | burst | calls | wall ms (per round) | invokes/s | client p50 ms | client p99 ms "
              "| decisions | decisions/s | decision mean ms | decision p50 ≤ ms | decision p99 ≤ ms "
              "| drain ms (per round) | proxy's own round trips per call: during + after |",
              "|" + "---|" * 14]
        for t, ops in conc["targets"].items():
            for op in ("park", "resume"):
                r = ops[op]
                f = lambda v, d=2: "" if v is None else f"{v:.{d}f}"  # noqa: E731
                L.append(f"| {t} | {op} | {r['calls']} | "
                         f"{' / '.join(f'{w * 1e3:.0f}' for w in r['wall_s'])} | "
                         f"{r['ops_per_s']:.1f} | {r['client_p50_ms']:.1f} | {r['client_p99_ms']:.1f} | "
                         f"{r['decisions']:.0f} | {f(r['decisions_per_s'], 1) if r['decisions'] else ''} | "
                         f"{f(r['decision_mean_ms'])} | {f(r['decision_p50_le_ms'], 1)} | "
                         f"{f(r['decision_p99_le_ms'], 1)} | "
                         f"{' / '.join(f'{d * 1e3:.0f}' for d in r.get('drain_s', []))} | "
                         f"{own_per_call(r)} |")
        L.append("")
    return L


# --------------------------------------------------------------------------- report
def machine_info(a) -> dict:
    def first_line(argv):
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (cp.stdout or cp.stderr).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "unknown"

    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GiB"
    except OSError:
        pass
    rev = first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "Cargo.toml"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "cpu": cpu, "memory": mem,
        "kernel": platform.release(),
        "load_avg_at_start": os.getloadavg(),
        "postgres": first_line([str(a.pg_bin / "postgres"), "--version"]),
        "pgbench": first_line([str(a.pg_bin / "pgbench"), "--version"]),
        "pgbouncer": first_line(["pgbouncer", "--version"]),
        "resumeguard": f"{first_line([str(a.binary), '--version'])} (git {rev}"
                       f"{', src modified' if dirty else ''})",
        "rustc": first_line(["rustc", "--version"]),
    }


def fmt_tps(c) -> str:
    return f"{c['median_tps']:.0f} ({c['min_tps']:.0f}–{c['max_tps']:.0f})"


def fmt_ratio(c) -> str:
    return f"{c['ratio_to_direct']:.3f}× ({c['ratio_min']:.2f}–{c['ratio_max']:.2f})"


def describe_config(res: dict, name: str, args: list[str]) -> str:
    """A configuration as its line in proxy-configs.conf would give it."""
    words = [f"bin={res['config_bin'][name]}"] if name in res.get("config_bin", {}) else []
    words += ["bound"] if name in res.get("config_bound", []) else []
    words += [f"sslmode={res['config_sslmode'][name]}"] if name in res.get("config_sslmode", {}) else []
    words += [f"{k}={v}" for k, v in res["config_env"].get(name, {}).items()] + args
    return " ".join(words) or "(no extra args)"


def fmt_cpu(c: dict) -> str:
    v, u = c.get("median_cpu_us_per_tx"), c.get("median_user_us_per_tx")
    return "" if v is None else f"{v:.1f}" if u is None else f"{v:.1f} ({u:.1f})"


def fmt_host(c: dict) -> str:
    """PostgreSQL's, pgbench's and (when watched) the proxy's CPU per
    transaction, and their sum: '61.2 + 14.0 + 18.1 = 93.3'."""
    server, client = c.get("median_server_us_per_tx"), c.get("median_client_us_per_tx")
    if server is None or client is None:
        return ""
    parts = [server, client] + ([c["median_cpu_us_per_tx"]] if c.get("median_cpu_us_per_tx") else [])
    return " + ".join(f"{x:.1f}" for x in parts) + f" = {sum(parts):.1f}"


def fmt_switches(c: dict) -> str:
    v = c.get("median_switches_per_tx")
    return "" if v is None else f"{v:.2f}"


def with_values(pb: dict, targets: list[str], key: str) -> list[str]:
    """The targets some pgbench cell of which has `key`: a table's columns."""
    return [t for t in targets
            if any(c.get(key) is not None for c in pb["cells"] if c["target"] == t)]


def per_mode_rows(cells: dict, targets: list[str], fmt) -> list[str]:
    """A table's rows, one per workload and mode that has a value, and the
    blank line after it."""
    rows = []
    for w in ("select-only", "tpcb-like"):
        for mo in ("simple", "extended", "prepared"):
            values = [fmt(cells[(w, mo, t)]) if (w, mo, t) in cells else "" for t in targets]
            if any(values):
                rows.append("| " + " | ".join([w, mo] + values) + " |")
    return rows + [""]


def render_md(res: dict) -> str:
    m = res["machine"]
    L = [f"# resumeguard benchmark{' (smoke)' if res['smoke'] else ''}", "",
         f"- date: {m['date']}; machine: {m['nproc']} cores, {m['cpu']}, {m['memory']}, "
         f"kernel {m['kernel']}; load average at start {', '.join(f'{x:.2f}' for x in m['load_avg_at_start'])}",
         f"- {m['postgres']}; {m['pgbench']}; {m['pgbouncer']}; {m['resumeguard']}; {m['rustc']}",
         "- everything on loopback on the same host; proxy configs: "
         + "; ".join(f"`{n}` = `{describe_config(res, n, args)}`"
                   + ("" if set(res["config_parts"][n]) == set(ALL_PARTS) else f" (only {', '.join(sorted(res['config_parts'][n]))})")
                   for n, args in res["proxy_configs"].items()),
         f"- wall time {res['elapsed_s']:.0f} s", ""]
    pb = res.get("pgbench")
    if pb:
        targets = []
        for c in pb["cells"]:
            if c["target"] not in targets:
                targets.append(c["target"])
        L += [f"## pgbench (scale {pb['scale']}, {pb['clients']} clients, -j {pb['threads']}, "
              f"{pb['rounds']} interleaved rounds × {pb['duration_s']} s)", "",
              "TPS: median (min–max) over rounds. Ratio: median of per-round ratios to direct "
              "(min–max).", ""]
        if pb.get("sslmodes"):
            L += ["Over TLS from pgbench to the proxy (direct stays plaintext): "
                  + ", ".join(f"`{t}` (sslmode={m})" for t, m in pb["sslmodes"].items()) + ".", ""]
        hdr = "| workload | mode | " + " | ".join(f"{t} TPS" for t in targets) + " | " + \
              " | ".join(f"{t} / direct" for t in targets if t != "direct") + " |"
        L += [hdr, "|" + "---|" * (2 + 2 * len(targets) - 1)]
        cells = {(c["workload"], c["mode"], c["target"]): c for c in pb["cells"]}
        for w in ("select-only", "tpcb-like"):
            for mo in ("simple", "extended", "prepared"):
                if (w, mo, "direct") not in cells:
                    continue
                row = [w, mo] + [fmt_tps(cells[(w, mo, t)]) for t in targets] + \
                      [fmt_ratio(cells[(w, mo, t)]) for t in targets if t != "direct"]
                L.append("| " + " | ".join(row) + " |")
        L.append("")
        watched = [t for t in targets if any(cells.get((w, mo, t), {}).get("median_cpu_us_per_tx")
                                              for w in ("select-only", "tpcb-like")
                                              for mo in ("simple", "extended", "prepared"))]
        if watched:
            L += ["### CPU per transaction", "",
                  "The proxy process's utime + stime (`/proc/PID/stat`, all threads) over each "
                  "pgbench run ÷ transactions: µs, median over rounds, with the user-space part "
                  "(utime) in brackets; the rest is the kernel's. Far steadier than TPS on a "
                  "shared host.", "",
                  "| workload | mode | " + " | ".join(f"{t} µs" for t in watched) + " |",
                  "|" + "---|" * (2 + len(watched))]
            L += per_mode_rows(cells, watched, fmt_cpu)
        hosted = with_values(pb, targets, "median_server_us_per_tx")
        if hosted:
            L += ["### Where the host's CPU goes", "",
                  "Per transaction, µs, median over rounds: the PostgreSQL server (the postmaster, "
                  "its live processes and those it reaped, from `/proc`) + pgbench (its rusage) "
                  "+ the proxy (as above) = their sum. What a proxy costs PostgreSQL and the "
                  "client shows here beside its own CPU.", "",
                  "| workload | mode | " + " | ".join(hosted) + " |",
                  "|" + "---|" * (2 + len(hosted))]
            L += per_mode_rows(cells, hosted, fmt_host)
        counted = with_values(pb, watched, "median_switches_per_tx")
        if counted:
            L += ["### Context switches per transaction", "",
                  "`perf stat -e context-switches` attached to the proxy process (every thread, "
                  "and those it starts) over each pgbench run ÷ transactions: median over rounds.",
                  "", "| workload | mode | " + " | ".join(counted) + " |",
                  "|" + "---|" * (2 + len(counted))]
            L += per_mode_rows(cells, counted, fmt_switches)
        if res.get("targets"):
            L += ["### Targets", ""]
            for line in res["targets"]:
                L.append(f"- {line}")
            L.append("")
    lg = res.get("langgraph")
    if lg and "skipped" not in lg:
        L += [f"## LangGraph interrupt protocol (langgraph {lg['versions'].get('langgraph')}, "
              f"langgraph-checkpoint-postgres {lg['versions'].get('langgraph-checkpoint-postgres')}, "
              f"psycopg {lg['versions'].get('psycopg')})", "",
              "Per iteration: `invoke` to the interrupt (park), `get_state`, `invoke(Command(resume=True))`. "
              "Milliseconds; ratio = target p50 / direct p50.", ""]
        L += ["| variant | operation | target | n | p50 ms | p95 ms | p50 / direct |", "|---|---|---|---|---|---|---|"]
        for v in lg["variants"]:
            for op in ("park", "get_state", "resume"):
                d = v["targets"]["direct"][op]["p50_ms"]
                for t, ops in v["targets"].items():
                    s = ops[op]
                    ratio = "" if t == "direct" else f"{s['p50_ms'] / d:.3f}×"
                    L.append(f"| {v['name']} | {op} | {t} | {s['n']} | {s['p50_ms']:.2f} | "
                             f"{s['p95_ms']:.2f} | {ratio} |")
        L.append("")
    elif lg:
        L += ["## LangGraph interrupt protocol", "", f"skipped: {lg['skipped']}", ""]
    if res.get("distance"):
        L += render_distance(res["distance"])
    mem = res.get("memory")
    if mem:
        L += ["## Memory: idle client sessions", "",
              "Fresh process per row; VmRSS before and after opening the sessions "
              "(each a real startup + trust auth, so each holds an upstream connection).", "",
              "| target | sessions | RSS before KiB | RSS after KiB | KiB per session |", "|---|---|---|---|---|"]
        for t, r in mem.items():
            L.append(f"| {t} | {r['connections']} | {r['rss_before_kib']} | {r['rss_after_kib']} | "
                     f"{r['kib_per_connection']:.1f} |")
        L.append("")
    return "\n".join(L)


def interval_note(ratios: list[float]) -> str:
    """Where the median of per-round ratios may lie, for a reader to tell a
    miss from noise: '; median within 0.951–1.012 (98%)'."""
    iv = median_interval(ratios)
    if iv is None:
        return "; no interval under 6 rounds"
    lo, hi, coverage = iv
    return f"; median within {lo:.3f}–{hi:.3f} ({coverage:.0%})"


def peer_targets(cells: dict, proxy_names: list[str], sslmodes: dict) -> list[str]:
    """Each configuration against PgBouncer (the TLS one for a TLS
    configuration; the unpooled one too when it ran), per mode: CPU per
    transaction ÷ PgBouncer's and TPS ÷ PgBouncer's, each the median of
    per-round ratios (rounds are interleaved, so a round's two runs saw the
    same host) with the interval where that median lies at 95% confidence
    or more."""
    lines = []
    for p in proxy_names:
        bouncers = [PGBOUNCER_TLS] if p in sslmodes else ["pgbouncer", PGBOUNCER_UNPOOLED]
        for bouncer, mo in itertools.product(bouncers, ("simple", "extended", "prepared")):
            c, b = cells.get(("select-only", mo, p)), cells.get(("select-only", mo, bouncer))
            if not c or not b:
                continue
            ratios = [x / y for x, y in zip(c["tps"], b["tps"])]
            tps = median(ratios)
            line = f"{p} select-only -M {mo} vs {bouncer}: TPS {tps:.3f}× " \
                   f"({'meets' if tps >= 1.0 else 'MISSES'} ≥ 1.00×{interval_note(ratios)})"
            if c["cpu_us_per_tx"] and b["cpu_us_per_tx"]:
                ratios = [x / y for x, y in zip(c["cpu_us_per_tx"], b["cpu_us_per_tx"])]
                cpu = median(ratios)
                line += f"; CPU/tx {cpu:.3f}× ({'meets' if cpu <= 1.0 else 'MISSES'} ≤ 1.00×" \
                        f"{interval_note(ratios)})"
            lines.append(line)
    return lines


def check_targets(res: dict, proxy_names: list[str]) -> list[str]:
    lines = []
    pb = res.get("pgbench")
    if pb:
        cells = {(c["workload"], c["mode"], c["target"]): c for c in pb["cells"]}
        baselines = [b for b in proxy_names if b in CONFIG_BIN and b not in CONFIG_BOUND]
        for p in proxy_names:
            if ("select-only", "simple", p) not in cells or p in CONFIG_BIN:
                continue
            for mo in ("simple", "extended", "prepared"):
                c = cells[("select-only", mo, p)]
                ok = c["ratio_to_direct"] >= 0.85
                line = f"{p} select-only -M {mo}: {c['ratio_to_direct']:.3f}× direct " \
                       f"({'meets' if ok else 'MISSES'} ≥ 0.85×"
                # TLS configurations are held against PgBouncer with TLS only
                # (peer_targets).
                tls = p in res.get("config_sslmode", {})
                for base in [] if tls else baselines:
                    if ("select-only", mo, base) in cells:
                        r = cells[("select-only", mo, base)]
                        vs = median([x / y for x, y in zip(c["tps"], r["tps"])])
                        line += f"; {vs:.3f}× {base}"
                        mine, theirs = c.get("median_cpu_us_per_tx"), r.get("median_cpu_us_per_tx")
                        if mine and theirs:
                            within = mine <= theirs * 1.10
                            line += (f"; CPU/tx {mine:.1f} vs {theirs:.1f} µs = {mine / theirs:.3f}× "
                                     f"({'meets' if within else 'MISSES'} ≤ 1.10×)")
                lines.append(line + ")")
        lines += peer_targets(cells, proxy_names, res.get("config_sslmode", {}))
    mem = res.get("memory")
    if mem:
        for p in proxy_names:
            if p in mem:
                k = mem[p]["kib_per_connection"]
                lines.append(f"{p} idle session: {k:.1f} KiB ({'meets' if k <= 64 else 'MISSES'} ≤ 64 KiB)")
    return lines


# --------------------------------------------------------------------------- main
def parse_proxy_configs(a) -> dict[str, list[str]]:
    lines = a.proxy if a.proxy else Path(a.proxy_configs).read_text().splitlines()
    out = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        name, args = words[0], words[1:]
        reserved = ("direct", "pgbouncer", PGBOUNCER_TLS, PGBOUNCER_UNPOOLED)
        if name in reserved or name in out or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise SystemExit(f"bad or duplicate proxy config name {name!r}")
        parts = set(ALL_PARTS)
        env = {}
        while args and (args[0].startswith(("parts=", "bin=", "sslmode=")) or args[0] == "bound"
                        or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", args[0])):
            if args[0] == "bound":
                CONFIG_BOUND.add(name)
                args.pop(0)
                continue
            if args[0].startswith("bin="):
                CONFIG_BIN[name] = REPO / args.pop(0)[len("bin="):]
                continue
            if args[0].startswith("sslmode="):
                CONFIG_SSLMODE[name] = args.pop(0)[len("sslmode="):]
                continue
            if not args[0].startswith("parts="):
                k, v = args.pop(0).split("=", 1)
                env[k] = v
                continue
            parts = set(args.pop(0)[len("parts="):].split(","))
            if not parts <= set(ALL_PARTS):
                raise SystemExit(f"{name}: unknown parts {parts - set(ALL_PARTS)}")
        out[name] = args
        CONFIG_PARTS[name] = parts
        CONFIG_ENV[name] = env
    if not out:
        raise SystemExit("no proxy configuration given")
    return out


ALL_PARTS = ("pgbench", "langgraph", "memory", "distance")
CONFIG_PARTS: dict[str, set] = {}
CONFIG_ENV: dict[str, dict] = {}
# Configurations that run a baseline binary instead of resumeguard.
CONFIG_BIN: dict[str, Path] = {}
# Baselines that bound a design rather than set a target: measured beside
# the others and held against PgBouncer, but not a "within 1.10×" baseline.
CONFIG_BOUND: set[str] = set()
# Configurations whose clients connect with this libpq sslmode (TLS rows).
CONFIG_SSLMODE: dict[str, str] = {}
# The PgBouncer that terminates client TLS, run when some configuration does.
PGBOUNCER_TLS = "pgbouncer-tls"
# The PgBouncer whose server connections serve one client each
# (`--pgbouncer-unpooled`).
PGBOUNCER_UNPOOLED = "pgbouncer-unpooled"


def in_part(name: str, part: str) -> bool:
    return part in CONFIG_PARTS.get(name, ALL_PARTS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny, fast run (CI): scale 1, 1 round x 2 s, ...")
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (run.sh makes one)")
    ap.add_argument("--binary", type=Path, default=REPO / "target/release/resumeguard")
    ap.add_argument("--pg-bin", type=Path, default=Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")))
    ap.add_argument("--proxy-configs", default=str(BENCH / "proxy-configs.conf"))
    ap.add_argument("--proxy", action="append", help="'NAME [ARGS...]' (repeatable; replaces the file)")
    ap.add_argument("--parts", default="pgbench,langgraph,memory,distance")
    ap.add_argument("--out", type=Path, default=BENCH / "results")
    ap.add_argument("--name", help="result file stem (default latest / smoke-latest)")
    ap.add_argument("--scale", type=int)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--duration", type=int, help="seconds per pgbench run")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--no-pgbouncer", action="store_true")
    ap.add_argument("--pgbouncer-unpooled", action="store_true",
                    help="pgbench: also a PgBouncer whose server connections serve one client "
                         "each (server_lifetime = 0), held against like the pooled one")
    ap.add_argument("--workloads", default="select-only,tpcb-like")
    ap.add_argument("--lg-python")
    ap.add_argument("--lg-iterations", type=int)
    ap.add_argument("--lg-threads", type=int, default=8)
    ap.add_argument("--lg-rounds", type=int)
    ap.add_argument("--lg-warmup", type=int)
    ap.add_argument("--lg-timeout", type=int)
    ap.add_argument("--mem-conns", type=int)
    ap.add_argument("--relay-binary", type=Path, default=REPO / "target/release/examples/latency_relay")
    ap.add_argument("--distance-latencies", help="one-way ms, comma-separated (default 0,1,5; smoke 0,1)")
    ap.add_argument("--distance-iterations", type=int, help="per target and latency (default 30; smoke 4)")
    ap.add_argument("--distance-concurrency", type=int, help="concurrent resumes (default 64; smoke 8; 0 = none)")
    ap.add_argument("--distance-concurrency-ms", type=float, default=1.0,
                    help="the one-way latency the concurrency run uses")
    ap.add_argument("--distance-rounds", type=int, help="concurrency rounds (default 3; smoke 1)")
    ap.add_argument("--perf-stat", action="store_true",
                    help="pgbench: count each watched process's context switches and CPU "
                         "migrations per transaction with perf stat")
    ap.add_argument("--profiler", choices=("auto", "perf", "callgrind"), default="auto",
                    help="for --parts profile (not in the default parts)")
    ap.add_argument("--profile-modes", default="prepared,simple,extended")
    ap.add_argument("--profile-seconds", type=int, default=15)
    ap.add_argument("--profile-transactions", type=int, default=20000, help="callgrind: per mode")
    a = ap.parse_args()
    smoke = a.smoke
    d = lambda v, full, sm: v if v is not None else (sm if smoke else full)  # noqa: E731
    a.scale = d(a.scale, 10, 1)
    a.rounds = d(a.rounds, 5, 1)
    a.duration = d(a.duration, 10, 2)
    a.warmup = d(a.warmup, 3, 1)
    a.lg_iterations = d(a.lg_iterations, 200, 10)
    a.lg_rounds = d(a.lg_rounds, 5, 1)
    a.lg_warmup = d(a.lg_warmup, 5, 2)
    a.lg_timeout = d(a.lg_timeout, 1500, 240)
    a.mem_conns = d(a.mem_conns, 1000, 50)
    a.distance_latencies = [float(x) for x in d(a.distance_latencies, "0,1,5", "0,1").split(",")]
    a.distance_iterations = d(a.distance_iterations, 30, 4)
    a.distance_concurrency = d(a.distance_concurrency, 64, 8)
    a.distance_rounds = d(a.distance_rounds, 3, 1)
    parts = set(a.parts.split(","))
    # The distance part alone has result files of its own.
    stem = "distance" if parts == {"distance"} else "latest"
    a.name = a.name or (f"smoke-{stem}" if smoke else stem)
    proxies = parse_proxy_configs(a)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    if not a.binary.exists():
        raise SystemExit(f"{a.binary} missing: cargo build --release")

    started = time.monotonic()
    procs = Procs(work)
    pg = Postgres(work, a.pg_bin, max_connections=max(200, a.mem_conns + 100))

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    res: dict = {"smoke": smoke, "proxy_configs": proxies,
                 "config_parts": {n: sorted(CONFIG_PARTS[n]) for n in proxies},
                 "config_env": {n: CONFIG_ENV[n] for n in proxies},
                 "config_bin": {n: str(CONFIG_BIN[n].relative_to(REPO)) for n in proxies if n in CONFIG_BIN},
                 "config_sslmode": {n: CONFIG_SSLMODE[n] for n in proxies if n in CONFIG_SSLMODE},
                 "config_bound": sorted(n for n in proxies if n in CONFIG_BOUND),
                 "machine": machine_info(a)}
    try:
        log(f"machine: {res['machine']}")
        log(f"postgres 15 on {HOST}:{pg.port} (max_connections {pg.max_connections})")
        pg.start()
        pg.psql(f"create database {DB}")
        # The configurations the parts that measure them side by side on one
        # upstream use (profile: the first configuration).
        shared = parts & {"pgbench", "langgraph"}
        rgs = {n: Resumeguard(procs, work, a.binary, n, args, pg.port).start()
               for n, args in proxies.items() if shared & CONFIG_PARTS[n]}
        for n, r in rgs.items():
            log(f"resumeguard '{n}' on {HOST}:{r.port} (pid {r.proc.pid}) args {r.args}")
        pgb = pgb_tls = pgb_unpooled = None
        if not a.no_pgbouncer and ("pgbench" in parts):
            pgb = PgBouncer(procs, work, pg.port, pool_size=a.clients + 12, max_clients=200, tag="main").start()
            log(f"pgbouncer (session mode) on {HOST}:{pgb.port}")
            if a.pgbouncer_unpooled:
                pgb_unpooled = PgBouncer(procs, work, pg.port, pool_size=a.clients + 12,
                                         max_clients=200, tag="unpooled", unpooled=True).start()
                log(f"pgbouncer (session mode, server_lifetime = 0) on {HOST}:{pgb_unpooled.port}")
            if any(in_part(n, "pgbench") for n in CONFIG_SSLMODE):
                pgb_tls = PgBouncer(procs, work, pg.port, pool_size=a.clients + 12, max_clients=200,
                                    tag="tls", tls=True).start()
                log(f"pgbouncer (session mode, client TLS required) on {HOST}:{pgb_tls.port}")
        if parts & {"pgbench", "profile"}:
            log(f"pgbench -i -s {a.scale}")
            cp = subprocess.run([str(a.pg_bin / "pgbench"), "-h", HOST, "-p", str(pg.port), "-U", USER,
                                 "-i", "-q", "-s", str(a.scale), DB], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=900, env=pg_env())
            if cp.returncode != 0:
                raise RuntimeError(f"pgbench -i failed: {cp.stderr}")
            pg.psql("vacuum analyze", db=DB)
        if "pgbench" in parts:
            targets = {"direct": pg.port,
                       **{n: r.port for n, r in rgs.items() if in_part(n, "pgbench")}}
            who = {n: r.proc for n, r in rgs.items()}
            sslmodes = {n: m for n, m in CONFIG_SSLMODE.items() if n in targets}
            for name, bouncer in (("pgbouncer", pgb), (PGBOUNCER_TLS, pgb_tls),
                                  (PGBOUNCER_UNPOOLED, pgb_unpooled)):
                if bouncer:
                    targets[name] = bouncer.port
                    who[name] = bouncer.proc
            if pgb_tls:
                sslmodes[PGBOUNCER_TLS] = "require"
            res["pgbench"] = pgbench_suite(a, pg, targets, who, sslmodes)
        for bouncer in (pgb, pgb_tls, pgb_unpooled):
            if bouncer:
                bouncer.stop()
        if "langgraph" in parts:
            targets = {"direct": pg.port,
                       **{n: r.port for n, r in rgs.items() if in_part(n, "langgraph")}}
            res["langgraph"] = langgraph_suite(a, work, pg, targets)
        for r in rgs.values():
            rc = r.stop()
            if rc != 0:
                log(f"warning: resumeguard {r.name} exited {rc} on SIGTERM")
        pg.wait_backends_below(20)
        if "profile" in parts:
            first = next(iter(proxies))
            res["profile"] = profile_suite(a, procs, work, pg, first, proxies[first])
        if "distance" in parts:
            res["distance"] = distance_suite(a, procs, work, pg, proxies)
        if "memory" in parts:
            res["memory"] = memory_suite(a, procs, work, pg, proxies)
        res["elapsed_s"] = time.monotonic() - started
        res["targets"] = check_targets(res, list(proxies))
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
        md = render_md(res)
        (a.out / f"{a.name}.md").write_text(md + "\n")
        print()
        print(md)
        log(f"wrote {a.out / (a.name + '.json')} and {a.out / (a.name + '.md')} "
            f"in {res['elapsed_s']:.0f} s")
        return 0
    finally:
        procs.stop_all()
        pg.stop()


if __name__ == "__main__":
    sys.exit(main())
