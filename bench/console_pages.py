#!/usr/bin/env python3
"""How long the approvals console's pages take on a large trail: fills a SQLite
audit trail with --threads threads and --events events (a LangGraph run's
records each: checkpoints, blobs, pending writes, reads, the park, the claim,
the answer with its approver, the next checkpoints; --waiting of the threads
still parked), starts ``resumeguard serve`` on it, and times the console's
pages through the admin listener (loopback, bearer token): each page --runs
times after one warm-up, min / median / max in milliseconds.

    bench/console_pages.py [--binary target/release/resumeguard] [--threads 10000]
                           [--events 200000] [--runs 15] [--json out.json]

Standard library only. Not a test: nothing here passes or fails on a number.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-console-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def serve(binary: Path, workdir: Path, db: Path) -> tuple[subprocess.Popen, str]:
    admin = free_port()
    cfg = workdir / "bench.toml"
    cfg.write_text(f'admin_listen = "127.0.0.1:{admin}"\n\n[admin]\ntoken = "{TOKEN}"\n\n'
                   f'[audit]\nsqlite = "{db}"\nretention_days = 0\nmax_rows = 0\n')
    log = open(workdir / "serve.log", "ab")
    proc = subprocess.Popen([str(binary), "serve", "--config", str(cfg), "--listen",
                             f"127.0.0.1:{free_port()}", "--upstream", "127.0.0.1:9",
                             "--state-dir", str(workdir / "state")],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir)
    wait_port(admin)
    return proc, f"http://127.0.0.1:{admin}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def digest(s: str) -> str:
    return json.dumps([{"channel": "__interrupt__", "sha256": hashlib.sha256(s.encode()).hexdigest()}])


def thread_rows(i: int, start: datetime, waiting: bool, per_thread: int) -> list[tuple]:
    """One run's records: (time, op, ckpt, parent, task, blobs, detail, session)."""
    thread = f"bench-{i:06d}"
    c = [f"1f0{i:06d}-{k:04d}-6000-8000-{i:012d}" for k in range(5)]
    task = f"task-{i:06d}"
    rows: list[tuple] = []
    t = start

    def add(op, ckpt=None, parent=None, task_id=None, blobs="[]", detail=None, session=1):
        nonlocal t
        t += timedelta(milliseconds=random.randint(5, 400))
        rows.append((stamp(t), op, thread, ckpt, parent, task_id, blobs,
                     json.dumps(detail or {}), session))

    add("checkpoint_put", c[0], None, None, detail={"source": "input", "approver": {"user_id": "bob"}})
    add("checkpoint_put", c[1], c[0], detail={"source": "loop"})
    for _ in range(3):
        add("blob_put", c[1])
    for _ in range(2):
        add("writes_put", c[1], task_id=task)
    add("checkpoint_put", c[2], c[1], detail={"source": "loop"})
    add("interrupt_parked", c[2], task_id=task, blobs=digest(thread),
        detail={"run_level": False, "task_path": "~__pregel_pull, gate"})
    if not waiting:
        t += timedelta(seconds=random.randint(5, 3600))
        add("read_latest", c[2], session=2)
        add("claim_taken", c[2], session=2, detail={"interrupt": "ab12cd34ef56"})
        who = random.choice(["alice", "carol", "dana", "erin"])
        add("resume_recorded", c[2], task_id="00000000-0000-0000-0000-000000000000",
            blobs=digest(who), detail={"run_level": True, "approver": {"resume/by": who}}, session=2)
        add("resume_recorded", c[2], task_id=task, blobs=digest(who),
            detail={"run_level": False, "approver": {"resume/by": who}}, session=2)
        add("claim_consumed", c[2], session=2, detail={"after_lapse": False})
        add("checkpoint_put", c[3], c[2], detail={"source": "loop", "approver": {"user_id": who}}, session=2)
        add("writes_put", c[3], task_id=task, session=2)
        add("checkpoint_put", c[4], c[3], detail={"source": "loop"}, session=2)
    while len(rows) < per_thread:
        add("read_latest", c[2], session=3)
    return rows[:per_thread]


def fill(db: Path, threads: int, events: int, waiting_share: float) -> int:
    random.seed(22)
    per_thread = max(events // threads, 12)
    now = datetime.now(timezone.utc)
    every: list[tuple] = []
    for i in range(threads):
        start = now - timedelta(days=7) + timedelta(seconds=random.randint(0, 7 * 86400 - 7200))
        every.extend(thread_rows(i, start, random.random() < waiting_share, per_thread))
    every.sort(key=lambda r: r[0])
    conn = sqlite3.connect(db)
    conn.executemany(
        'INSERT INTO audit_events (time, session_id, client_addr, "user", "database", '
        "application_name, operation, thread_id, checkpoint_ns, checkpoint_id, "
        "parent_checkpoint_id, task_id, channels, blob_sha256, detail, proxy_id) "
        "VALUES (?, ?, '10.0.0.7:51234', 'app', 'agents', 'agent-worker', ?, ?, '', ?, ?, ?, "
        "'[]', ?, ?, 'bench-proxy')",
        [(r[0], r[8], r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in every])
    conn.commit()
    n = conn.execute("SELECT count(*) FROM audit_events").fetchone()[0]
    conn.close()
    return n


def timed(url: str) -> tuple[float, int, int]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as res:
        body = res.read()
        status = res.status
    return (time.perf_counter() - t0) * 1000, status, body.count(b"<tr data-id=")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "resumeguard"))
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--waiting", type=float, default=0.3, help="share of threads still parked")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    binary = Path(args.binary).resolve()
    if not binary.exists():
        raise SystemExit(f"{binary} does not exist (cargo build --release, or --binary)")
    with tempfile.TemporaryDirectory(prefix="rg-console-bench-") as tmp:
        work = Path(tmp)
        db = work / "audit.sqlite"
        proc, _ = serve(binary, work, db)      # creates the trail's schema and indexes
        stop(proc)
        t0 = time.monotonic()
        rows = fill(db, args.threads, args.events, args.waiting)
        print(f"trail: {rows} events of {args.threads} threads in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
        proc, base = serve(binary, work, db)
        try:
            pages = {
                "waiting": "/ui/waiting",
                "answered": "/ui/answered",
                "answered, approver search": "/ui/answered?approver=dana",
                "answered, approver nobody is": "/ui/answered?approver=nobody",
                "waiting, one thread": "/ui/waiting?thread=bench-004242",
                "answered, since 1h": "/ui/answered?since=1h",
                "waiting, an older page": f"/ui/waiting?before={rows // 2}",
                "refused (none on record)": "/ui/refused",
            }
            results = []
            for name, path in pages.items():
                timed(base + path)                 # warm-up
                samples, shown = [], 0
                for _ in range(args.runs):
                    ms, status, shown = timed(base + path)
                    assert status == 200, (path, status)
                    samples.append(ms)
                results.append({"page": name, "path": path, "rows_shown": shown,
                                "min_ms": round(min(samples), 1),
                                "median_ms": round(statistics.median(samples), 1),
                                "max_ms": round(max(samples), 1)})
        finally:
            stop(proc)
    print(f"| page | rows shown | min ms | median ms | max ms |\n|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['page']} (`{r['path']}`) | {r['rows_shown']} | {r['min_ms']} | "
              f"{r['median_ms']} | {r['max_ms']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "events": rows,
                                               "runs": args.runs, "binary": str(binary),
                                               "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
