#!/usr/bin/env python3
"""LangGraph interrupt protocol latency: direct vs proxies.

Graph: prep -> gate (interrupt) -> after. One iteration on a fresh thread:
  park       graph.invoke({"items": []}, cfg)      -> stops at the interrupt
  get_state  graph.get_state(cfg)                  -> one READ(latest)
  resume     graph.invoke(Command(resume=True), cfg)

Variants (each measured against every --target, interleaved):
  sync  PostgresSaver.from_conn_string(dsn): one connection, iterations in turn
  pool  PostgresSaver(ConnectionPool(dsn, kwargs={autocommit, prepare_threshold=0,
        row_factory=dict_row})) with --threads threads resuming concurrently

Writes JSON with p50/p95 per variant, target and operation. Client stack as
pinned by integration/requirements.txt (langgraph 1.2.22,
langgraph-checkpoint-postgres 3.2.0); the versions found are recorded and a
mismatch is reported.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import statistics
import sys
import threading
import time
import uuid
from importlib.metadata import version
from typing import Annotated, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

PINNED = {"langgraph": "1.2.22", "langgraph-checkpoint-postgres": "3.2.0"}
OPS = ("park", "get_state", "resume")


class State(TypedDict):
    items: Annotated[list, operator.add]


def prep(state: State) -> dict:
    return {"items": ["prep"]}


def gate(state: State) -> dict:
    answer = interrupt({"question": "go on?"})
    return {"items": [f"gate:{answer}"]}


def after(state: State) -> dict:
    return {"items": ["after"]}


def build(saver):
    g = StateGraph(State)
    g.add_node("prep", prep)
    g.add_node("gate", gate)
    g.add_node("after", after)
    g.add_edge(START, "prep")
    g.add_edge("prep", "gate")
    g.add_edge("gate", "after")
    g.add_edge("after", END)
    return g.compile(checkpointer=saver)


def iteration(graph, tag: str, inspector=None) -> dict[str, float]:
    cfg = {"configurable": {"thread_id": f"{tag}-{uuid.uuid4().hex}"}}
    t0 = time.perf_counter()
    r = graph.invoke({"items": []}, cfg)
    t1 = time.perf_counter()
    if "__interrupt__" not in r:
        raise RuntimeError(f"did not park: {r}")
    st = (inspector or graph).get_state(cfg)
    t2 = time.perf_counter()
    if st.next != ("gate",):
        raise RuntimeError(f"unexpected state after park: next={st.next}")
    r = graph.invoke(Command(resume=True), cfg)
    t3 = time.perf_counter()
    if r.get("items", [])[-2:] != ["gate:True", "after"]:
        raise RuntimeError(f"resume did not complete: {r}")
    return {"park": t1 - t0, "get_state": t2 - t1, "resume": t3 - t2}


def summary(samples: list[float]) -> dict:
    s = sorted(samples)
    n = len(s)
    q = statistics.quantiles(s, n=100, method="inclusive") if n >= 2 else s * 99
    return {"n": n, "p50_ms": statistics.median(s) * 1e3, "p95_ms": q[94] * 1e3,
            "min_ms": s[0] * 1e3, "max_ms": s[-1] * 1e3}


def orders(names: list[str]):
    """The targets in a new random order each time (a fixed seed): a
    rotation keeps who runs after whom, and a target that always runs
    after the same one inherits its leftovers (cache, the server's work)."""
    rng = random.Random(6663)
    while True:
        yield rng.sample(names, len(names))


def thread_tags(targets: dict[str, str]) -> dict[str, str]:
    """Each target's thread ids begin alike, with its place among them:
    its name would put one target's keys in one spot of another's range
    (`resumeguard-b…` among `resumeguard-<hex>`), and the checkpoint
    tables' indexes would favour whichever target's keys cluster."""
    return {t: f"{i:02d}" for i, t in enumerate(targets)}


def sync_variant(targets: dict[str, str], iterations: int, warmup: int) -> dict:
    samples = {t: {op: [] for op in OPS} for t in targets}
    tags = thread_tags(targets)
    savers, graphs = {}, {}
    try:
        for t, dsn in targets.items():
            cm = PostgresSaver.from_conn_string(dsn)
            savers[t] = (cm, cm.__enter__())
            graphs[t] = build(savers[t][1])
        for t in targets:
            for _ in range(warmup):
                iteration(graphs[t], "warm")
        order = orders(list(targets))
        for _ in range(iterations):
            for t in next(order):
                for op, v in iteration(graphs[t], f"sync-{tags[t]}").items():
                    samples[t][op].append(v)
    finally:
        for cm, _ in savers.values():
            cm.__exit__(None, None, None)
    return {t: {op: summary(v) for op, v in ops.items()} for t, ops in samples.items()}


def saver_pool(dsn: str, min_size: int, max_size: int, timeout: float, **kwargs) -> ConnectionPool:
    """An open pool as the saver wants its connections: autocommit, no
    server-side prepares, dict rows (plus `kwargs`, e.g. application_name)."""
    pool = ConnectionPool(dsn, min_size=min_size, max_size=max_size, open=True, timeout=timeout,
                          kwargs={"autocommit": True, "prepare_threshold": 0,
                                  "row_factory": dict_row, **kwargs})
    pool.wait(timeout=timeout)
    return pool


def pool_variant(targets: dict[str, str], iterations: int, threads: int, rounds: int,
                 warmup: int) -> dict:
    samples = {t: {op: [] for op in OPS} for t in targets}
    tags = thread_tags(targets)
    pools, graphs, inspectors = {}, {}, {}
    per_thread = max(1, -(-iterations // (rounds * threads)))
    try:
        for t, dsn in targets.items():
            pool = saver_pool(dsn, threads, threads, 30)
            pools[t] = pool
            graphs[t] = build(PostgresSaver(pool))
            # get_state through its own pool, marked as inspection by its
            # application_name: in a pool the resume runs on another
            # connection than the get_state, and an unmarked inspection's
            # claim would make it wait for the lapse (docs/langgraph.md).
            ipool = saver_pool(dsn, 1, threads, 30, application_name="inspector")
            pools[f"{t}-inspect"] = ipool
            inspectors[t] = build(PostgresSaver(ipool))
        errors: list[BaseException] = []
        lock = threading.Lock()

        def batch(t: str, n: int, record: bool) -> None:
            def worker() -> None:
                try:
                    for _ in range(n):
                        r = iteration(graphs[t], f"pool-{tags[t]}", inspectors[t])
                        if record:
                            with lock:
                                for op, v in r.items():
                                    samples[t][op].append(v)
                except BaseException as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(e)

            ths = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join(timeout=600)
                if th.is_alive():
                    raise RuntimeError("pool worker did not finish within 600 s")
            if errors:
                raise errors[0]

        for t in targets:
            batch(t, max(1, warmup // 2), record=False)
        order = orders(list(targets))
        for _ in range(rounds):
            for t in next(order):
                batch(t, per_thread, record=True)
    finally:
        for p in pools.values():
            p.close(timeout=10)
    return {t: {op: summary(v) for op, v in ops.items()} for t, ops in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", required=True,
                    help="NAME=DSN (the first one named 'direct' is the baseline)")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="pool variant: interleaved rounds")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--variants", default="sync,pool")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    targets = dict(t.split("=", 1) for t in a.target)
    if "direct" not in targets:
        raise SystemExit("a target named 'direct' is required")

    versions = {p: version(p) for p in ("langgraph", "langgraph-checkpoint",
                                        "langgraph-checkpoint-postgres", "psycopg", "psycopg-pool")}
    mismatch = {p: (versions[p], v) for p, v in PINNED.items() if versions[p] != v}
    if mismatch:
        print(f"lg_bench: WARNING: versions differ from the pinned stack: {mismatch}", file=sys.stderr)

    # One-time schema setup straight to PostgreSQL.
    with PostgresSaver.from_conn_string(targets["direct"]) as s:
        s.setup()

    out = {"versions": versions, "pinned_mismatch": mismatch, "iterations": a.iterations,
           "threads": a.threads, "variants": []}
    for v in a.variants.split(","):
        t0 = time.monotonic()
        if v == "sync":
            res = sync_variant(targets, a.iterations, a.warmup)
            name = "sync saver (1 connection)"
        elif v == "pool":
            res = pool_variant(targets, a.iterations, a.threads, a.rounds, a.warmup)
            name = f"pool, {a.threads} threads"
        else:
            raise SystemExit(f"unknown variant {v}")
        out["variants"].append({"name": name, "key": v, "targets": res,
                                "seconds": round(time.monotonic() - t0, 1)})
        for t, ops in res.items():
            print(f"lg_bench {name:26s} {t:22s} " + "  ".join(
                f"{op} p50 {s['p50_ms']:.2f} p95 {s['p95_ms']:.2f} ms" for op, s in ops.items()),
                flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
