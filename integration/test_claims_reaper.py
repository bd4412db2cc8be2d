"""Consume-once through a DBA's idle-session reaper (real PostgreSQL 15, real LangGraph,
``resumeguard serve`` with the PostgreSQL claims backend): the proxy's own connections
to the claims database (``application_name`` ``resumeguard-claims``, its decisions, and
``resumeguard-claims-liveness``, its liveness lock) are ended with
``pg_terminate_backend`` while racers resume.

- every proxy-owned connection ended while N = 4 racers wait at their barrier, again
  while the winner's gate runs (its evidence meets ended connections) and again as the
  racers' sessions close (holder-gone evidence): the gated node fires once, no racer is
  refused 58000, nothing is counted lost or left pending, the claim ends consumed, and
  the reconnects are counted; beside it the same race straight to PostgreSQL fires N
  times;
- the proxy's connections ended every ~100 ms during several get_state + resume
  rounds: no parked read is refused 58000 and each thread's gated node fires once.

The proxy keeps its claims in this module's database, so only its connections are
ended (the other modules' proxies keep theirs in their own).
"""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

import psycopg
import pytest

import racer as R
from conftest import HOST
from test_admin import scrape, value
from test_consume_once import Racers, make_jobs, park

N = 4
GATE_MS = 300
FAIL_CLOSED = "58000"
LOSER_STATES = ("55000", "55006")
RECONNECTS = "resumeguard_claims_reconnects_total"


@pytest.fixture(scope="module")
def env(proxy_factory, direct_dsn, pg, dbname, workdir):
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    R.cmd_setup(SimpleNamespace(dsn=direct_dsn))
    state = workdir / f"state-reaper-{uuid.uuid4().hex[:6]}"
    cfg = workdir / "reaper.toml"
    cfg.write_text(
        '[claims]\nbackend = "postgres"\nproxy_id = "reaper"\nlapse_ms = 3000\n'
        'holder_gone_grace_ms = 1000\nprogress_hold_ms = 10000\n'
        f'dsn = "postgres://postgres@{HOST}:{pg.port}/{dbname}"\n')
    proxy = proxy_factory("--config", str(cfg), "--state-dir", str(state), name="reaper")
    return SimpleNamespace(direct=direct_dsn, dbname=dbname, workdir=workdir, proxy=proxy,
                           admin=proxy.admin_url())


def reap(env) -> int:
    """Ends every connection the proxy holds to its claims database, as an idle-session
    reaper does; how many it ended."""
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute(
            "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity "
            "where datname = current_database() and application_name like 'resumeguard%' "
            "and pid <> pg_backend_pid()").fetchone()[0]


def ledger(env, thread: str) -> list[tuple]:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select racer, node from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


def claim_states(env, thread: str) -> list[str]:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return [r[0] for r in c.execute("select state from resumeguard.claims "
                                        "where thread_id = %s", (thread,))]


def evidence_counts(env) -> dict:
    s = scrape(env.admin)
    lost = sum(v for (name, _), v in s.items() if name == "resumeguard_evidence_lost_total")
    return {"lost": lost,
            "pending": value(s, "resumeguard_evidence_pending"),
            "retries": value(s, "resumeguard_evidence_retries_total"),
            "decision": value(s, RECONNECTS, connection="decision"),
            "liveness": value(s, RECONNECTS, connection="liveness"),
            "unavailable": value(s, "resumeguard_claims_refused_total",
                                 reason="store_unavailable")}


def race(env, dsn: str, tag: str, reap_at=()) -> tuple[dict, list[dict], list[int]]:
    """N racer processes resume one parked thread (gate 300 ms) through ``dsn``; the
    proxy's connections are ended before they go and at each of ``reap_at`` ("gate":
    while the gated node runs, "closed": once every racer answered). The job, the
    results and how many connections each reaping ended."""
    jobs = make_jobs(dsn, "bare", (GATE_MS,), 1, "conn", tag)
    racers = Racers(env, [dsn] * N, "conn", jobs, tag)
    ended = []
    try:
        racers.ready(0)
        if reap_at:
            ended.append(reap(env))
            time.sleep(0.05)   # the ended backends exit before any racer reads
        racers.go(0)
        if "gate" in reap_at:
            deadline = time.monotonic() + 30
            while not ledger(env, jobs[0]["thread"]):
                assert time.monotonic() < deadline, "the gated node never ran"
                time.sleep(0.01)
            ended.append(reap(env))
        results = racers.results(0)
        if "closed" in reap_at:
            ended.append(reap(env))
        racers.finish()
    finally:
        racers.kill()
    return jobs[0], results, ended


def test_a_reaper_ending_every_proxy_connection_during_a_race_refuses_nothing_58000(env):
    stock_job, stock, _ = race(env, env.direct, "st")
    stock_fires = len(ledger(env, stock_job["thread"]))
    assert all(r["ok"] for r in stock), stock
    before = evidence_counts(env)
    job, results, ended = race(env, env.proxy.dsn(env.dbname), "rp", reap_at=("gate", "closed"))
    thread = job["thread"]
    fires = ledger(env, thread)
    print(f"stock: {stock_fires} fires of N={N}; through the proxy under the reaper: "
          f"{len(fires)} fire, connections ended per reaping {ended}")
    assert stock_fires == N, ledger(env, stock_job["thread"])
    # Each reaping ended the proxy's decision connections it had open and its lock's.
    assert ended[0] >= 2, ended
    assert len(fires) == 1, (fires, results)
    winner = fires[0][0]
    for r in results:
        if r["id"] == winner:
            assert r["ok"], r
        elif not r["ok"]:
            assert r["error"]["sqlstate"] in LOSER_STATES, r
    # The evidence the reaper met (the gated writes, the next checkpoint, the racers'
    # closed sessions) was applied: the claim is consumed, nothing lost or pending.
    deadline = time.monotonic() + 10
    while True:
        after = evidence_counts(env)
        done = claim_states(env, thread) == ["consumed"] and after["pending"] == 0
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print(f"metrics before {before}, after {after}")
    assert claim_states(env, thread) == ["consumed"]
    assert after["lost"] == before["lost"] == 0, after
    assert after["pending"] == 0, after
    assert after["unavailable"] == before["unavailable"], after
    assert after["decision"] > before["decision"], after
    assert after["liveness"] > before["liveness"], after
    log = env.proxy.stderr_path.read_text()
    # Never marked down (ERROR), no evidence left waiting (WARN): the retries did it.
    assert "refused (58000, fail closed) until it is back" not in log, log[-3000:]
    assert "claim evidence not applied" not in log, log[-3000:]


def test_a_reaper_every_100_ms_never_refuses_a_parked_read(env):
    via = env.proxy.dsn(env.dbname)
    threads = [f"reap-loop-{i}-{uuid.uuid4().hex[:6]}" for i in range(10)]
    for t in threads:
        park(via, t)
    before = evidence_counts(env)
    stop = threading.Event()
    ended: list[int] = []

    def reaper() -> None:
        while not stop.is_set():
            ended.append(reap(env))
            stop.wait(0.1)

    killer = threading.Thread(target=reaper, daemon=True)
    outcomes = []
    killer.start()
    try:
        for t in threads:
            # An unmarked get_state (it claims the parked head), then the resume on
            # the same connection (its holder), as a LangGraph API server does.
            R.CTX["racer"] = f"loop-{t}"
            with R.Runner("conn", via) as r:
                try:
                    st = r.get_state("one", t)
                    outcomes.append(("get_state", t, list(st.next) == ["gate"], list(st.next)))
                except Exception as e:  # the test judges below
                    outcomes.append(("get_state", t, False, R.describe_error(e)))
                res = R.resume_once(r, {"thread": t, "gate_ms": 150})
            outcomes.append(("resume", t, res["ok"], res["error"]))
    finally:
        stop.set()
        killer.join(timeout=10)
    after = evidence_counts(env)
    print(f"reaped {len(ended)} times ({sum(ended)} connections) during {len(threads)} "
          f"get_state + resume rounds; reconnects decision "
          f"{after['decision'] - before['decision']:.0f}, liveness "
          f"{after['liveness'] - before['liveness']:.0f}")
    assert len(ended) >= 10 and sum(ended) >= 10, ended
    refused = [o for o in outcomes if not o[2]]
    assert not refused, refused
    for t in threads:
        assert ledger(env, t) == [(f"loop-{t}", "gate")], t
    assert after["unavailable"] == before["unavailable"], after
    assert after["lost"] == 0, after
