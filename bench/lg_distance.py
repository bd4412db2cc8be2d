#!/usr/bin/env python3
"""The LangGraph interrupt protocol with PostgreSQL at a network distance.

Started by bench.py once per one-way latency: every target reaches
PostgreSQL through its own latency relay (examples/latency_relay), so a
proxy's own claims traffic crosses the same distance as the saver's.

Sync saver (PostgresSaver.from_conn_string, one connection per target;
targets in a new random order each iteration). Iterations alternate two kinds on a
fresh thread each:
  A  park, get_state (unmarked, same connection), resume_held
  B  park, get_state_marked (a second connection with
     application_name=inspector), resume (its read takes the claim)
Around each operation it reads the target's counters: the relay's round
trips per application_name (--relay NAME=HOST:PORT) and, for a proxy, its
admin /metrics (--admin NAME=URL): claim store calls by op, fence lookups
by outcome, fences decided without a lookup (where the build counts them),
claims by outcome.

Concurrency (--concurrency N): per target and round, N threads park N
fresh threads at once through one ConnectionPool (N connections), then
resume them at once; wall time, client latency per resume, and the
proxy's decisions in the burst (claim store calls) with their latency
histogram.

Writes JSON (--out): every operation's times, the medians of its counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
import urllib.request
import uuid

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

from lg_bench import build, orders, saver_pool, summary

INSPECTOR = "inspector"
OPS = ("park", "get_state", "resume_held", "get_state_marked", "resume")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf)$")
RELAY_RE = re.compile(r'^name=("(?:[^"\\]|\\.)*") connections=(\d+) turns=(\d+) '
                      r'bytes_up=(\d+) bytes_down=(\d+)$')
# The proxy's counters of its own decisions, diffed around each operation.
COUNTED = ("resumeguard_claims_store_seconds_count", "resumeguard_fence_lookups_total",
           "resumeguard_fence_checks_total", "resumeguard_claims_total",
           "resumeguard_writes_fenced_total")
STORE_HIST = "resumeguard_claims_store_seconds"


def with_param(dsn: str, key: str, value: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}{key}={value}"


# --------------------------------------------------------------------------- counters
def scrape_metrics(url: str) -> dict[str, float]:
    """Every sample of the admin /metrics, keyed `name{labels}`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE_RE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def scrape_relay(hostport: str) -> dict[str, int]:
    """Round trips (turns) per application_name so far, from the relay."""
    host, port = hostport.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    out = {}
    for line in buf.decode().splitlines():
        m = RELAY_RE.match(line)
        if m:
            out[json.loads(m.group(1))] = int(m.group(3))
    return out


class Counters:
    """Snapshots of one target's counters (relay, and admin for a proxy)."""

    def __init__(self, relay: str | None, admin: str | None, one_way_ms: float):
        self.relay, self.admin = relay, admin
        # A quiet spell this long means the proxy's off-path work is done.
        self.quiet_s = 0.03 + 8 * one_way_ms / 1e3

    def snap(self) -> dict:
        return {"relay": scrape_relay(self.relay) if self.relay else {},
                "metrics": scrape_metrics(self.admin) if self.admin else {}}

    def settle(self, last: dict, limit_s: float = 3.0) -> dict:
        """Snapshots until the relay's counts stop moving (the proxy's
        evidence worker applies a write's evidence after it returned)."""
        deadline = time.monotonic() + limit_s
        while self.relay and time.monotonic() < deadline:
            time.sleep(self.quiet_s)
            now = self.snap()
            if now["relay"] == last["relay"]:
                return now
            last = now
        return last

    @staticmethod
    def diff(before: dict, after: dict) -> dict:
        turns = {k: v - before["relay"].get(k, 0) for k, v in after["relay"].items()}
        metrics = {}
        for k, v in after["metrics"].items():
            if k.startswith(COUNTED):
                d = v - before["metrics"].get(k, 0.0)
                if d:
                    metrics[k] = d
        return {"turns": {k: v for k, v in turns.items() if v}, "metrics": metrics}


def hist_delta(before: dict, after: dict, name: str = STORE_HIST) -> dict:
    """The claim store histogram over an interval, all ops together:
    cumulative bucket counts by upper bound, count and sum."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for k, v in after.items():
        if not k.startswith(name):
            continue
        d = v - before.get(k, 0.0)
        if k.startswith(f"{name}_bucket"):
            le = re.search(r'le="([^"]+)"', k)
            if le:
                bound = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
                buckets[bound] = buckets.get(bound, 0.0) + d
        elif k.startswith(f"{name}_count"):
            count += d
        elif k.startswith(f"{name}_sum"):
            total += d
    return {"buckets": sorted(buckets.items()), "count": count, "sum_s": total}


def hist_quantile(h: dict, q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding quantile q."""
    if not h["count"]:
        return None
    for bound, cum in h["buckets"]:
        if cum >= q * h["count"]:
            return bound
    return float("inf")


# --------------------------------------------------------------------------- sync saver
def timed(counters: Counters, fn):
    """fn() timed; the counts while it ran, and those that followed it
    until the target was quiet again (`after`: off the data path)."""
    before = counters.snap()
    t0 = time.perf_counter()
    out = fn()
    took = time.perf_counter() - t0
    done = counters.snap()
    quiet = counters.settle(done)
    return out, took, {**Counters.diff(before, done), "after": Counters.diff(done, quiet)["turns"]}


def iteration(graph, inspector, counters: Counters, marked: bool) -> dict:
    cfg = {"configurable": {"thread_id": f"dist-{uuid.uuid4().hex}"}}
    res = {}
    r, res["park"], c_park = timed(counters, lambda: graph.invoke({"items": []}, cfg))
    if "__interrupt__" not in r:
        raise RuntimeError(f"did not park: {r}")
    gs_op, resume_op = ("get_state_marked", "resume") if marked else ("get_state", "resume_held")
    st, res[gs_op], c_gs = timed(counters, lambda: (inspector if marked else graph).get_state(cfg))
    if st.next != ("gate",):
        raise RuntimeError(f"unexpected state after park: next={st.next}")
    r, res[resume_op], c_res = timed(counters, lambda: graph.invoke(Command(resume=True), cfg))
    if r.get("items", [])[-2:] != ["gate:True", "after"]:
        raise RuntimeError(f"resume did not complete: {r}")
    return {"seconds": res, "counts": {"park": c_park, gs_op: c_gs, resume_op: c_res}}


def quartiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else xs * 3
    return {"p25_ms": q[0] * 1e3, "p75_ms": q[2] * 1e3}


def median_counts(samples: list[dict]) -> dict:
    """Per kind of count, the median over an operation's samples."""
    out = {}
    for part in ("turns", "metrics", "after"):
        keys = sorted({k for s in samples for k in s[part]})
        out[part] = {k: statistics.median(s[part].get(k, 0) for s in samples) for k in keys}
    return out


def sync_variant(targets: dict, counters: dict, iterations: int, warmup: int) -> dict:
    seconds = {t: {op: [] for op in OPS} for t in targets}
    counts = {t: {op: [] for op in OPS} for t in targets}
    cms, graphs, inspectors = [], {}, {}
    try:
        for t, dsn in targets.items():
            for key, url in ((t, dsn), (f"{t}/inspect", with_param(dsn, "application_name", INSPECTOR))):
                cm = PostgresSaver.from_conn_string(url)
                cms.append(cm)
                (graphs if key == t else inspectors)[t] = build(cm.__enter__())
        for t in targets:
            for i in range(warmup):
                iteration(graphs[t], inspectors[t], counters[t], marked=bool(i % 2))
        order = orders(list(targets))
        for i in range(iterations):
            for t in next(order):
                r = iteration(graphs[t], inspectors[t], counters[t], marked=bool(i % 2))
                for op, v in r["seconds"].items():
                    seconds[t][op].append(v)
                    counts[t][op].append(r["counts"][op])
    finally:
        for cm in cms:
            cm.__exit__(None, None, None)
    return {t: {op: {**summary(seconds[t][op]), **quartiles(seconds[t][op]),
                     "samples_ms": [v * 1e3 for v in seconds[t][op]],
                     "counts": median_counts(counts[t][op])}
                for op in OPS if seconds[t][op]}
            for t in targets}


# --------------------------------------------------------------------------- concurrency
def burst(n: int, fn) -> tuple[float, list[float]]:
    """fn(i) on n threads released at once: wall time and each call's time."""
    gate = threading.Barrier(n + 1)
    took = [0.0] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            gate.wait(timeout=120)
            t0 = time.perf_counter()
            fn(i)
            took[i] = time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for th in ths:
        th.start()
    gate.wait(timeout=120)
    t0 = time.perf_counter()
    for th in ths:
        th.join(timeout=600)
        if th.is_alive():
            raise RuntimeError("a burst worker did not finish within 600 s")
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, took


def concurrency_variant(targets: dict, counters: dict, n: int, rounds: int) -> dict:
    out = {t: {"park": [], "resume": []} for t in targets}
    pools, graphs = {}, {}
    try:
        for t, dsn in targets.items():
            pools[t] = pool = saver_pool(dsn, n, n, 120)
            graphs[t] = build(PostgresSaver(pool))
        for t in targets:  # warm-up: every connection used once
            cfgs = [{"configurable": {"thread_id": f"cw-{uuid.uuid4().hex}"}} for _ in range(n)]
            burst(n, lambda i, g=graphs[t], c=cfgs: g.invoke({"items": []}, c[i]))
            burst(n, lambda i, g=graphs[t], c=cfgs: g.invoke(Command(resume=True), c[i]))
        order = orders(list(targets))
        for _ in range(rounds):
            for t in next(order):
                g = graphs[t]
                cfgs = [{"configurable": {"thread_id": f"conc-{uuid.uuid4().hex}"}} for _ in range(n)]
                for op, call in (("park", lambda i: g.invoke({"items": []}, cfgs[i])),
                                 ("resume", lambda i: g.invoke(Command(resume=True), cfgs[i]))):
                    # Each burst starts on a quiet store (the last one's
                    # evidence applied), and says how long that took.
                    before = counters[t].settle(counters[t].snap(), limit_s=120)
                    wall, took = burst(n, call)
                    done = counters[t].snap()
                    t_done = time.perf_counter()
                    quiet = counters[t].settle(done, limit_s=120)
                    drain = time.perf_counter() - t_done - counters[t].quiet_s
                    h = hist_delta(before["metrics"], done["metrics"])
                    fences = sum(v - before["metrics"].get(k, 0.0) for k, v in done["metrics"].items()
                                 if k.startswith("resumeguard_fence_lookups_total"))
                    out[t][op].append({"wall_s": wall, "took_s": took, "store": h,
                                       "fence_lookups": fences, "drain_s": max(0.0, drain),
                                       "turns": Counters.diff(before, done)["turns"],
                                       "turns_after": Counters.diff(done, quiet)["turns"]})
                # Every resume finished its graph.
                for c in cfgs:
                    st = g.get_state(c)
                    if st.next:
                        raise RuntimeError(f"{t}: a resumed thread did not finish: next={st.next}")
    finally:
        for p in pools.values():
            p.close(timeout=10)
    res = {}
    for t, ops in out.items():
        res[t] = {}
        for op, rs in ops.items():
            took = sorted(x for r in rs for x in r["took_s"])
            q = statistics.quantiles(took, n=100, method="inclusive")
            decisions = sum(r["store"]["count"] for r in rs)
            wall = sum(r["wall_s"] for r in rs)
            merged = {"buckets": [], "count": decisions, "sum_s": sum(r["store"]["sum_s"] for r in rs)}
            if decisions:
                bounds = sorted({b for r in rs for b, _ in r["store"]["buckets"]})
                merged["buckets"] = [(b, sum(dict(r["store"]["buckets"]).get(b, 0.0) for r in rs))
                                     for b in bounds]
            p50, p99 = hist_quantile(merged, 0.5), hist_quantile(merged, 0.99)
            res[t][op] = {
                "rounds": len(rs), "calls": len(took), "wall_s": [r["wall_s"] for r in rs],
                "drain_s": [r["drain_s"] for r in rs],
                "turns": [r["turns"] for r in rs], "turns_after": [r["turns_after"] for r in rs],
                "ops_per_s": len(took) / wall,
                "client_p50_ms": statistics.median(took) * 1e3, "client_p99_ms": q[98] * 1e3,
                "decisions": decisions, "decisions_per_s": decisions / wall,
                "fence_lookups": sum(r["fence_lookups"] for r in rs),
                "decision_mean_ms": merged["sum_s"] / decisions * 1e3 if decisions else None,
                "decision_p50_le_ms": p50 * 1e3 if p50 is not None else None,
                "decision_p99_le_ms": p99 * 1e3 if p99 is not None else None,
                "store_histogram": merged["buckets"],
            }
    return res


# --------------------------------------------------------------------------- main
def select1_rtt(dsn: str, n: int = 30) -> dict:
    """One statement's round trip through the relay, as the client sees it."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("select 1")
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.execute("select 1").fetchone()
            xs.append(time.perf_counter() - t0)
    return summary(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one-way-ms", type=float, required=True)
    ap.add_argument("--target", action="append", required=True, help="NAME=DSN")
    ap.add_argument("--relay", action="append", default=[], help="NAME=HOST:PORT (relay stats)")
    ap.add_argument("--admin", action="append", default=[], help="NAME=URL (proxy admin API)")
    ap.add_argument("--setup-dsn", required=True, help="straight to PostgreSQL: saver setup")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=0)
    ap.add_argument("--concurrency-rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    targets = dict(t.split("=", 1) for t in a.target)
    relays = dict(t.split("=", 1) for t in a.relay)
    admins = dict(t.split("=", 1) for t in a.admin)
    counters = {t: Counters(relays.get(t), admins.get(t), a.one_way_ms) for t in targets}
    with PostgresSaver.from_conn_string(a.setup_dsn) as s:
        s.setup()
    out = {"one_way_ms": a.one_way_ms, "iterations": a.iterations,
           "load_avg_at_start": os.getloadavg(),
           "select1": select1_rtt(targets["direct"]) if "direct" in targets else None}
    t0 = time.monotonic()
    out["sync"] = sync_variant(targets, counters, a.iterations, a.warmup)
    out["sync_seconds"] = round(time.monotonic() - t0, 1)
    for t, ops in out["sync"].items():
        print(f"lg_distance {a.one_way_ms:g} ms {t:24s} " + "  ".join(
            f"{op} {s['p50_ms']:.2f}" for op, s in ops.items()), flush=True)
    if a.concurrency:
        t0 = time.monotonic()
        out["concurrency"] = {"threads": a.concurrency, "rounds": a.concurrency_rounds,
                              "targets": concurrency_variant(targets, counters, a.concurrency,
                                                             a.concurrency_rounds)}
        out["concurrency_seconds"] = round(time.monotonic() - t0, 1)
        for t, ops in out["concurrency"]["targets"].items():
            for op, r in ops.items():
                print(f"lg_distance {a.one_way_ms:g} ms {a.concurrency} concurrent {op:6s} {t:24s} "
                      f"{r['ops_per_s']:.1f}/s client p50 {r['client_p50_ms']:.1f} "
                      f"p99 {r['client_p99_ms']:.1f} ms; decisions {r['decisions']:.0f} "
                      f"({r['decisions_per_s']:.1f}/s, p99 <= {r['decision_p99_le_ms']} ms)",
                      flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
