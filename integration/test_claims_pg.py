"""Consume-once across hosts: claims kept in the PostgreSQL the proxies front (the
default backend), end to end (real PostgreSQL 15, real LangGraph, ``resumeguard
serve`` processes that share nothing but the database: separate state dirs).

- racers spread over two proxies fire the gated node once per parked interrupt
  (N = 2, 4 x gate 0 / 300 ms); beside it the same cells straight to PostgreSQL (the
  stock defect): every racer runs the gated node;
- a proxy SIGKILLed while its racer holds the claim: the other proxy sees its
  liveness lock gone and its racer takes the claim over within the holder-gone
  grace, where the claim's lapse would have kept it refused for 30 s; the killed
  holder's write, replayed later through the surviving proxy, is fenced;
- ``resumeguard claims list|release --upstream`` reads and edits the same claims;
- the claims schema holds the claims (``resumeguard.claims``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from types import SimpleNamespace

import psycopg
import pytest

import racer as R
from conftest import HOST, proxy_binary, run_audit_cli
from test_consume_once import Racers, make_jobs, one_resumer, park, wait_for_node
from test_fencing import replay_write

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core

GRACE_MS = 1000          # holder_gone_grace_ms
LONG_LAPSE_MS = 30000    # long enough that only liveness explains a fast takeover
LAPSE_MS = 3000


def start(proxy_factory, workdir, name: str, lapse_ms: int = LAPSE_MS):
    """A proxy with a state directory of its own, its claims in the fronted database."""
    state = workdir / f"state-{name}-{uuid.uuid4().hex[:6]}"
    cfg = workdir / f"{name}.toml"
    cfg.write_text(
        f'[claims]\nproxy_id = "{name}"\nlapse_ms = {lapse_ms}\n'
        f'holder_gone_grace_ms = {GRACE_MS}\nprogress_hold_ms = 10000\n')
    return proxy_factory("--config", str(cfg), "--state-dir", str(state), name=name)


@pytest.fixture(scope="module")
def env(proxy_factory, direct_dsn, workdir):
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, str(here / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]
    return SimpleNamespace(direct=direct_dsn, dbname=dbname, workdir=workdir,
                           pg1=start(proxy_factory, workdir, "pg-1"),
                           pg2=start(proxy_factory, workdir, "pg-2"),
                           # No proxy: the racers' connections go straight to PostgreSQL.
                           straight=SimpleNamespace(dsn=lambda _db: direct_dsn))


def ledger(env, thread: str) -> list[tuple]:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select racer, node, value from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


def race(env, proxies, n: int, gates=(0, 300), saver: str = "conn") -> dict[int, list[int]]:
    """N racers spread over ``proxies`` resume one parked thread per gate; the number
    of fires (gated-node runs) per gate."""
    dsns = [proxies[i % len(proxies)].dsn(env.dbname) for i in range(n)]
    jobs = make_jobs(proxies[0].dsn(env.dbname), "bare", gates, 1, saver, f"x{n}{saver}")
    racers = Racers(env, dsns, saver, jobs, "r")
    try:
        racers.run_all()
    finally:
        racers.kill()
    fires: dict[int, list[int]] = {}
    for job in jobs:
        fires.setdefault(job["gate_ms"], []).append(len(ledger(env, job["thread"])))
    return fires


# CI: N = 2, 4 with the connection saver; RG_CO_FULL=1 (integration/full_matrix.sh
# sets it): N = 2, 4, 8, 16 x the connection, pool and async savers.
FULL = os.environ.get("RG_CO_FULL") == "1"
SPLIT_CELLS = [(n, saver) for n in ([2, 4, 8, 16] if FULL else [2, 4])
               for saver in (["conn", "pool", "async"] if FULL else ["conn"])]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n,saver", SPLIT_CELLS, ids=[f"n{n}-{s}" for n, s in SPLIT_CELLS])
def test_racers_over_two_proxies_sharing_only_the_database_fire_once(env, n, saver):
    shared = race(env, [env.pg1, env.pg2], n, saver=saver)
    print(f"postgres claims, N={n}, {saver}: fires per gate {shared}")
    assert shared == {0: [1], 300: [1]}, shared
    # The stock comparison: the same racers straight to PostgreSQL. Each one resumes
    # the interrupt: with a 300 ms gate several are inside the node together.
    stock = race(env, [env.straight], n, saver=saver)
    print(f"straight to PostgreSQL, N={n}, {saver}: fires per gate {stock}")
    assert stock[300][0] >= 2, stock
    assert 1 <= stock[0][0] <= n, stock


@pytest.mark.timeout(300)
def test_sigkilled_proxy_holding_a_claim_is_taken_over_within_the_bound(
        proxy_factory, env, workdir):
    p1 = start(proxy_factory, workdir, "kill-1", lapse_ms=LONG_LAPSE_MS)
    p2 = start(proxy_factory, workdir, "kill-2", lapse_ms=LONG_LAPSE_MS)
    thread = f"pgk-{uuid.uuid4().hex[:8]}"
    iid = park(p1.dsn(env.dbname), thread)[0]["id"]
    victim = one_resumer(env, p1.dsn(env.dbname), thread, "kv-", gate_ms=60000, interrupt_id=iid)
    recovery = one_resumer(env, p2.dsn(env.dbname), thread, "kr-", interrupt_id=iid)
    try:
        victim.ready(0)
        recovery.ready(0)
        victim.go(0)
        wait_for_node(env, thread, "gate")
        time.sleep(0.2)
        p1.proc.send_signal(signal.SIGKILL)
        p1.proc.wait(timeout=10)
        p1.expected_down = True
        t_kill = time.time()
        _, r = recovery.go_and_finish()
    finally:
        victim.kill()
        recovery.kill()
    latency = r["t_end"] - t_kill
    print(f"recovery through the other proxy completed {latency * 1000:.0f} ms after the SIGKILL")
    assert r["ok"], r
    vid, rid = victim.ids[0], recovery.ids[0]
    assert [row[0] for row in ledger(env, thread)] == [vid, rid]
    # The claim's lapse (30 s, extended by the run's progress) would have refused it;
    # the gone holder's grace (1 s) plus the resume's own run is what it took.
    assert latency < GRACE_MS / 1000 + 2.0, latency
    evs = run_audit_cli(p2.audit_db, thread)
    takeover = [e for e in evs if e["operation"] == "claim_takeover"]
    assert [e["application_name"] for e in takeover] == [f"racer-{rid}"], evs
    # The killed holder's client reconnects through the surviving proxy and replays
    # its gated task's write: fenced (the claim's holder is the takeover's session,
    # at epoch 2), nothing written, the parked checkpoint keeps one child.
    with psycopg.connect(env.direct, autocommit=True) as c:
        parked, task_id = c.execute(
            "select checkpoint_id, task_id from checkpoint_writes where thread_id = %s "
            "and channel = '__interrupt__'", (thread,)).fetchone()
    replay_dsn = p2.dsn(env.dbname, application_name="replayer")
    assert replay_write(replay_dsn, thread, parked, task_id) == "RGF01"
    with psycopg.connect(env.direct, autocommit=True) as c:
        replayed = c.execute("select count(*) from checkpoint_writes where thread_id = %s "
                             "and channel = 'replayed'", (thread,)).fetchone()[0]
        children = c.execute("select count(*) from checkpoints where thread_id = %s and "
                             "parent_checkpoint_id = %s", (thread, parked)).fetchone()[0]
    assert (replayed, children) == (0, 1)
    fenced = [e for e in run_audit_cli(p2.audit_db, thread) if e["operation"] == "write_fenced"]
    assert [(e["application_name"], e["detail"]["epoch"]) for e in fenced] == [("replayer", 2)], \
        fenced


def claims_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "claims", *args], capture_output=True, text=True,
                          timeout=30)


def test_claims_commands_read_the_upstream_database(env, pg):
    thread = f"pgc-{uuid.uuid4().hex[:8]}"
    park(env.pg1.dsn(env.dbname), thread)
    # A read through the proxy claims the parked head.
    with R.Runner("conn", env.pg2.dsn(env.dbname)) as r:
        r.get_state("one", thread)
    upstream = f"postgres://postgres@{HOST}:{pg.port}/postgres"
    listed = claims_cli("list", "--upstream", upstream, "--thread", thread)
    assert listed.returncode == 0, listed.stderr
    assert thread in listed.stdout and "held" in listed.stdout and "pg-2" in listed.stdout, listed.stdout
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
        rows = c.execute("select state, proxy_id, epoch from resumeguard.claims "
                         "where thread_id = %s", (thread,)).fetchall()
    assert rows == [("held", "pg-2", 1)], rows
    released = claims_cli("release", "--upstream", upstream, "--thread", thread)
    assert released.returncode == 0, released.stderr
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
        state = c.execute("select state from resumeguard.claims where thread_id = %s",
                          (thread,)).fetchone()[0]
    assert state == "released"
    # A database no proxy used has no claims schema: an error, not an empty store.
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
        c.execute("drop database if exists rg_no_claims")
        c.execute("create database rg_no_claims")
    missing = claims_cli("list", "--upstream", f"postgres://postgres@{HOST}:{pg.port}/rg_no_claims")
    assert missing.returncode != 0 and "no claims schema" in missing.stderr, missing.stderr
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
        c.execute("drop database rg_no_claims")
