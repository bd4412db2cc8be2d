"""A bounded soak of a running proxy: mixed LangGraph and plain traffic from
many concurrent sessions for a fixed time, sampling the proxy process.

Traffic: LangGraph workers loop park -> get_state (marked inspection by
application_name) -> resume on fresh threads (integration/lg_scenarios.py,
``conn`` saver: a connection per step), and plain workers each keep one
psycopg connection running pgbench-like transactions (a prepared select by
key, an update, a history insert) on their own table. Every second the
proxy's VmRSS, thread count (all, and those serving a client session), open
fds and the audit table's row count are sampled.

    .venv/bin/python integration/soak.py --proxy-dsn URL --inspect-dsn URL \\
        --pid PID --audit-db FILE [--seconds 60] [--sessions 50] [--lg-sessions 10]

prints a JSON report; ``integration/test_soak.py`` runs it against a proxy it
starts (``RG_SOAK_SECONDS`` for a longer run) and asserts on the report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

import lg_scenarios  # noqa: E402

PLAIN_ROWS = 1000
# The threads the proxy starts per client session (wire/listener.rs, wire/session.rs);
# every other thread is the proxy's own (event loop, audit writers, claims worker,
# blocking pool) and may start lazily, at the first use of what it serves.
SESSION_THREADS = ("rg-session", "rg-client")


@dataclass
class Sample:
    t: float
    rss_kb: int
    threads: int
    fds: int
    audit_rows: int
    session_threads: int = 0


@dataclass
class Report:
    seconds: float
    sessions: int
    ops: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    def thirds(self, key: str) -> tuple[float, float]:
        """Mean of `key` over the first and the last third of the samples."""
        values = [getattr(s, key) for s in self.samples]
        n = max(1, len(values) // 3)
        return sum(values[:n]) / n, sum(values[-n:]) / n


def proc_sample(pid: int, audit_db: Path) -> Sample:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.split()[0] if value.split() else "0"
    rows = -1
    try:
        with sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute("select count(*) from audit_events").fetchone()[0]
    except sqlite3.Error:
        pass
    return Sample(time.monotonic(), int(status["VmRSS"]), int(status["Threads"]),
                  len(os.listdir(f"/proc/{pid}/fd")), rows, session_threads(pid))


def thread_names(pid: int) -> dict[str, int]:
    """The proxy's threads, counted by name."""
    names: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
        except OSError:
            continue  # the thread exited meanwhile
        names[name] = names.get(name, 0) + 1
    return names


def session_threads(pid: int) -> int:
    """The proxy's threads serving client sessions."""
    names = thread_names(pid)
    return sum(names.get(n, 0) for n in SESSION_THREADS)


def warm_up(proxy_dsn: str, inspect_dsn: str) -> None:
    """One LangGraph park, get_state and resume through the proxy: what the
    proxy starts at first use (its claims store connection, the evidence
    worker's) exists afterwards."""
    thread = f"soak-warmup-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", proxy_dsn, thread)
    lg_scenarios.state("conn", inspect_dsn, thread)
    lg_scenarios.resume("conn", proxy_dsn, thread, True)


def prepare(direct_dsn: str) -> None:
    """Tables of the plain traffic and the saver's schema."""
    lg_scenarios.setup_db("conn", direct_dsn)
    with psycopg.connect(direct_dsn, autocommit=True) as c:
        c.execute("create table if not exists soak_accounts (aid int primary key, abalance int not null)")
        c.execute("create table if not exists soak_history (aid int, delta int, mtime timestamptz)")
        c.execute("insert into soak_accounts select g, 0 from generate_series(1, %s) g "
                  "on conflict do nothing", (PLAIN_ROWS,))


class Soak:
    def __init__(self, proxy_dsn: str, inspect_dsn: str, seconds: float):
        self.proxy_dsn = proxy_dsn
        self.inspect_dsn = inspect_dsn
        self.deadline = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.ops: dict[str, int] = {}
        self.errors: list[str] = []

    def count(self, op: str) -> None:
        with self.lock:
            self.ops[op] = self.ops.get(op, 0) + 1

    def error(self, where: str) -> None:
        with self.lock:
            self.errors.append(f"{where}: {traceback.format_exc(limit=3)}")

    def lg_worker(self, n: int) -> None:
        while time.monotonic() < self.deadline:
            thread = f"soak-{n}-{uuid.uuid4().hex[:8]}"
            try:
                parked = lg_scenarios.park("conn", self.proxy_dsn, thread)
                assert parked["state"]["next"] == ["gate"], parked
                self.count("lg_park")
                st = lg_scenarios.state("conn", self.inspect_dsn, thread)
                assert st["state"]["next"] == ["gate"], st
                self.count("lg_get_state")
                done = lg_scenarios.resume("conn", self.proxy_dsn, thread, True)
                assert done["result"]["approved"] is True, done
                self.count("lg_resume")
            except Exception:
                self.error(f"langgraph worker {n} thread {thread}")
                time.sleep(0.5)

    def plain_worker(self, n: int) -> None:
        rng = random.Random(n)
        try:
            conn = psycopg.connect(self.proxy_dsn, autocommit=True, application_name=f"soak-plain-{n}")
        except Exception:
            self.error(f"plain worker {n} connect")
            return
        with conn:
            while time.monotonic() < self.deadline:
                aid, delta = rng.randint(1, PLAIN_ROWS), rng.randint(-5000, 5000)
                try:
                    with conn.transaction():
                        conn.execute("update soak_accounts set abalance = abalance + %s where aid = %s",
                                     (delta, aid), prepare=True)
                        got = conn.execute("select abalance from soak_accounts where aid = %s", (aid,),
                                           prepare=True).fetchone()
                        assert got is not None
                        conn.execute("insert into soak_history values (%s, %s, now())", (aid, delta),
                                     prepare=True)
                    self.count("plain_txn")
                    conn.execute(f"select {aid}")
                    self.count("plain_simple")
                except Exception:
                    self.error(f"plain worker {n}")
                    return
                time.sleep(0.005)


def run(proxy_dsn: str, inspect_dsn: str, pid: int, audit_db: Path, seconds: float,
        sessions: int = 50, lg_sessions: int = 10) -> Report:
    soak = Soak(proxy_dsn, inspect_dsn, seconds)
    workers = [threading.Thread(target=soak.lg_worker, args=(i,), daemon=True) for i in range(lg_sessions)]
    workers += [threading.Thread(target=soak.plain_worker, args=(i,), daemon=True)
                for i in range(sessions - lg_sessions)]
    report = Report(seconds=seconds, sessions=sessions)
    started = time.monotonic()
    for w in workers:
        w.start()
    while time.monotonic() < soak.deadline:
        report.samples.append(proc_sample(pid, audit_db))
        time.sleep(1.0)
    for w in workers:
        w.join(timeout=60)
    report.seconds = round(time.monotonic() - started, 1)
    report.ops = dict(soak.ops)
    report.errors = list(soak.errors)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxy-dsn", required=True)
    ap.add_argument("--inspect-dsn", required=True, help="the proxy, marked as inspection")
    ap.add_argument("--direct-dsn", help="straight to PostgreSQL: prepare the tables first")
    ap.add_argument("--pid", type=int, required=True, help="the proxy's process id")
    ap.add_argument("--audit-db", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("RG_SOAK_SECONDS", "60")))
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--lg-sessions", type=int, default=10)
    args = ap.parse_args()
    if args.direct_dsn:
        prepare(args.direct_dsn)
    report = run(args.proxy_dsn, args.inspect_dsn, args.pid, args.audit_db, args.seconds,
                 args.sessions, args.lg_sessions)
    print(json.dumps(asdict(report), indent=1))
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
