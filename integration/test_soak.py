"""A bounded soak (integration/soak.py) through a proxy with a small audit
retention: 50 concurrent sessions of mixed LangGraph (park / get_state /
resume) and pgbench-like traffic for ``RG_SOAK_SECONDS`` (default 60).
Asserts no error, a flat proxy (RSS, threads, fds: mean of the last third of
the samples against the first third), the audit table never far above
``[audit] max_rows`` and under it once the writer pruned, no thread serving a
client session left afterwards and the proxy's threads and fds back to their
idle count, and no recorded value (only digests) in the audit database or
JSONL file.

The idle baseline is sampled after one LangGraph park / resume went through
the proxy, once its session threads are gone: the threads and connections
the proxy opens at first use (the claims store's) exist by then, however
slowly a busy machine gets there."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import soak

SECONDS = float(os.environ.get("RG_SOAK_SECONDS", "60"))
MAX_ROWS = 2000
PRUNE_INTERVAL_MS = 1000


def settled(sample, timeout: float = 20.0):
    """A sample once no session thread is left (the warm-up's have exited)."""
    deadline = time.monotonic() + timeout
    s = sample()
    while s.session_threads and time.monotonic() < deadline:
        time.sleep(0.1)
        s = sample()
    return s


def test_soak_mixed_traffic_is_flat(proxy_factory, pg, dbname, direct_dsn, workdir):
    config = workdir / "soak.toml"
    config.write_text(f"""
[audit]
max_rows = {MAX_ROWS}
prune_interval_ms = {PRUNE_INTERVAL_MS}

[claims]
inspection_application_names = ["^soak-inspect$"]
""")
    proxy = proxy_factory("--config", str(config), name="proxy-soak")
    soak.prepare(direct_dsn)
    pid = proxy.proc.pid
    dsn, inspect_dsn = proxy.dsn(dbname), proxy.dsn(dbname, application_name="soak-inspect")
    soak.warm_up(dsn, inspect_dsn)
    idle = settled(lambda: soak.proc_sample(pid, proxy.audit_db))
    idle_names = soak.thread_names(pid)
    report = soak.run(dsn, inspect_dsn, pid, proxy.audit_db, SECONDS)
    # Let the writer apply max_rows once more, then the final sample.
    time.sleep(2 * PRUNE_INTERVAL_MS / 1000)
    end = soak.proc_sample(pid, proxy.audit_db)
    rss, threads, fds = report.thirds("rss_kb"), report.thirds("threads"), report.thirds("fds")
    summary = {
        "seconds": report.seconds, "sessions": report.sessions, "ops": report.ops,
        "errors": len(report.errors), "samples": len(report.samples),
        "rss_kb first/last third": rss, "threads first/last third": threads,
        "fds first/last third": fds, "idle before": asdict(idle), "idle after": asdict(end),
        "threads idle before": idle_names,
        "audit rows max sampled": max(s.audit_rows for s in report.samples),
    }
    print("soak report: " + json.dumps(summary))

    assert not report.errors, "\n".join(report.errors[:5])
    assert proxy.alive(), proxy.describe()
    for op in ("lg_park", "lg_get_state", "lg_resume", "plain_txn"):
        assert report.ops.get(op, 0) > 0, summary
    # Flat: the last third no higher than the first, within tolerance.
    assert rss[1] <= rss[0] * 1.25 + 10 * 1024, summary
    assert threads[1] <= threads[0] * 1.2 + 4, summary
    assert fds[1] <= fds[0] * 1.2 + 4, summary
    # Retention: rows written between two prunes may sit above max_rows for
    # at most one interval; once the writer pruned, the table holds the
    # newest max_rows rows and the `audit_pruned` record of that prune.
    assert all(s.audit_rows <= MAX_ROWS * 1.5 for s in report.samples), summary
    assert 0 < end.audit_rows <= MAX_ROWS + 1, summary
    # Every session closed: no session thread left, the proxy back to its
    # idle threads and fds.
    assert idle.session_threads == 0, asdict(idle)
    deadline = time.monotonic() + 20
    while (end.session_threads or end.threads > idle.threads) and time.monotonic() < deadline:
        time.sleep(0.2)
        end = soak.proc_sample(pid, proxy.audit_db)
    names = {"idle": idle_names, "end": soak.thread_names(pid)}
    assert end.session_threads == 0, (asdict(end), names)
    assert end.threads <= idle.threads, (asdict(idle), asdict(end), names)
    assert end.fds <= idle.fds + 2, (asdict(idle), asdict(end))
    # Digests, not values: the interrupt's question (inside every parked
    # write's msgpack value) is nowhere in the trail.
    wal = proxy.audit_db.with_name(proxy.audit_db.name + "-wal")
    for path in (proxy.audit_db, wal, proxy.audit_jsonl):
        if path.exists():
            assert b"approve?" not in path.read_bytes(), path
