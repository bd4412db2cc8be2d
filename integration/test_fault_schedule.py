"""Seeded fault schedules against the Resume Contract (``fault_schedule.py``): racers
through two proxies sharing the PostgreSQL claims store while proxies are SIGKILLed
and SIGTERMed, PostgreSQL restarts, the proxies' backends are terminated, a proxy is
partitioned from the database (as root) and one proxy's clock is skewed; then every
thread is settled and resumed, and the history is checked: no double fire, no lost
output, no fork, no stranded thread, no lost checkpoint.

- the same seed plans the same schedules (the CLI's ``plan`` twice), so a failing
  seed reproduces its schedule;
- a short seeded run (``RG_FAULT_SCHEDULES`` x ``RG_FAULT_SECONDS``, 3 x 8 s; the
  seed ``RG_FAULT_SEED``) has zero violations; ``full_matrix.sh`` (``RG_CO_FULL=1``)
  runs 12 schedules of 20 s;
- beside it, racers straight to PostgreSQL: the checker reports their double fire;
- what the schedules once found, reduced to one scene: readers waiting for a claim
  whose server sessions are terminated with the holder's are not granted it (they
  were, one after another, and each ran the gated node).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import psycopg
import pytest

import fault_schedule as F
from test_claims_recovery import db  # noqa: F401  (the saver's tables and the ledger)
from test_drain import Resumer, dsn_of, ledger, park, start, wait_for

HERE = Path(__file__).resolve().parent
FULL = os.environ.get("RG_CO_FULL") == "1"
SEED = int(os.environ.get("RG_FAULT_SEED", "20261203"))
SCHEDULES = int(os.environ.get("RG_FAULT_SCHEDULES", "12" if FULL else "3"))
SECONDS = float(os.environ.get("RG_FAULT_SECONDS", "20" if FULL else "8"))


def planned(seed: int, schedules: int, seconds: float) -> list[dict]:
    cp = subprocess.run([sys.executable, str(HERE / "fault_schedule.py"), "plan", "--seed",
                         str(seed), "--schedules", str(schedules), "--seconds", str(seconds)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return [json.loads(line) for line in cp.stdout.splitlines()]


def test_a_seed_plans_the_same_schedules_in_every_process():
    first, again = planned(SEED, 20, 20), planned(SEED, 20, 20)
    assert first == again
    assert [json.loads(json.dumps(asdict(F.plan(SEED, i, 20)))) for i in range(20)] == first
    assert planned(SEED + 1, 20, 20) != first
    kinds = {f["kind"] for p in first for f in p["faults"]}
    assert kinds == set(F.FAULT_KINDS), kinds
    assert any(p["skew"] for p in first) and not all(p["skew"] for p in first)
    for p in first:   # several racers per thread, faults spread over the window
        assert all(0 <= f["at"] <= p["seconds"] for f in p["faults"]) and p["faults"]
        per_thread = [sum(1 for j in p["jobs"] if j["thread"] == t) for t in range(p["threads"])]
        assert min(per_thread) >= 2, per_thread


@pytest.mark.timeout(300 + SCHEDULES * (SECONDS + 150))
def test_seeded_fault_schedules_keep_the_resume_contract(workdir):
    out = F.run(SEED, SCHEDULES, SECONDS, workdir / "faults")
    rows = [{k: s[k] for k in ("index", "threads", "racers", "faults", "fault_kinds", "skew",
                               "served", "not_served", "fires", "fires_cut_by_a_fault",
                               "final_resumes", "violations")} for s in out]
    for r in rows:
        print(json.dumps(r))
    if os.environ.get("RG_FAULT_TABLE"):
        with open(os.environ["RG_FAULT_TABLE"], "a") as f:
            for s in out:
                f.write(json.dumps({"seed": SEED, "seconds": SECONDS, **s}) + "\n")
    violations = [v for s in out for v in s["violations"]]
    print(f"seed {SEED}: {len(out)} schedules of {SECONDS} s, "
          f"{sum(s['faults'] for s in out)} faults, {sum(s['racers'] for s in out)} racers, "
          f"{sum(s['threads'] for s in out)} threads, {len(violations)} violation(s)")
    assert violations == [], f"rerun: integration/fault_schedule.py --seed {SEED} " \
                             f"--schedules {SCHEDULES} --seconds {SECONDS}"
    # not vacuous: every schedule injected faults, served resumes, and fired each
    # thread's gate (a thread may be finished by a run its client saw fail: a holder
    # whose step committed before its connection ended)
    assert all(s["faults"] and s["served"] for s in out)
    assert all(s["fires"] >= s["threads"] for s in out)


@pytest.mark.timeout(300)
def test_racers_straight_to_postgres_are_a_double_fire_the_checker_sees(pg, workdir):
    world = F.World(workdir / "faults-stock", pg)
    try:
        history, violations = F.stock_race(world, racers=3, gate_ms=300)
    finally:
        world.close()
    fires = history.fires[history.thread_ids[0]]
    print(f"stock: fires {fires}; violations {violations}")
    assert len(fires) == 3, fires
    assert any(v.startswith("double fire:") for v in violations), violations


@pytest.mark.timeout(300)
def test_waiters_whose_server_sessions_ended_are_not_granted_the_claim(db, pg, workdir):  # noqa: F811
    """The holder runs its gated node (3 s), two readers wait for its claim, then every
    relayed session's backend is terminated (an operator, a reaper): the holder is gone,
    and so are the waiters' server sessions: none of them can commit, so none may run
    the gated node; the thread is continued by a later resume."""
    name = f"ended-{uuid.uuid4().hex[:4]}"
    p = start(pg, workdir, name)
    thread = f"ended-{uuid.uuid4().hex[:8]}"
    via = dsn_of(p, db)
    ledger_dsn = f"{db}&application_name=rg-ledger"
    procs: list[Resumer] = []
    try:
        park(via, thread)
        t0 = time.time() + 15
        procs.append(Resumer(f"{via}&application_name=racer-holder", ledger_dsn, thread, "holder",
                             gate_ms=3000, start_at=t0))
        procs += [Resumer(f"{via}&application_name=racer-w{i}", ledger_dsn, thread, f"w{i}",
                          start_at=t0 + 0.5) for i in range(2)]
        for r in procs:
            assert r.reading.wait(60), "".join(r.stderr)
        wait_for(lambda: ledger(db, thread), 60, "the holder's gated node never ran")
        time.sleep(max(0.0, t0 + 1.2 - time.time()))   # the waiters' reads wait for the claim
        with psycopg.connect(db, autocommit=True) as c:
            ended = c.execute("select count(pg_terminate_backend(pid)) from pg_stat_activity "
                              "where application_name like 'racer-%'").fetchone()[0]
        results = {r.id: r.result(timeout=60) for r in procs}
    finally:
        for r in procs:
            r.kill()
        p.stop()
    fires = ledger(db, thread)
    print(f"{ended} backends ended; fires {fires}; results "
          f"{ {k: (v['ok'], (v['error'] or {}).get('sqlstate')) for k, v in results.items()} }")
    assert ended >= 3
    assert fires == [("holder", "gate")], fires
