"""LangGraph Python's 2.0.x saver generation (`langgraph-checkpoint-postgres` 2.0.25 with
langgraph 0.6.11) end to end, straight to PostgreSQL (the stock defect) and through the
proxy (the repair). This generation's checkpoint read carries 4-element pending writes
and reads pending sends with a separate statement; the scenarios are the suite's own
(racer.py, lg_enforce.py), run by the interpreter of ``.venv-lg2``
(integration/requirements-lg2.txt) in separate processes.

* race: N ``racer.py worker`` processes resume one parked thread behind the file
  barrier; the gated node writes a row to ``rg_ledger`` over a direct connection.
  Stock: every racer fires (N at 300 ms). Proxy: one fire, the losers refused 55000.
* fork: ``lg_enforce.fork_scenario``: park at C, resume True, resume at C's
  checkpoint_id with False. Stock: served A's True. Proxy: its own False.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import REPO, run_audit_cli
from test_consume_once import Racers
from test_js_saver import Tally, record

HERE = Path(__file__).resolve().parent
LG2_PYTHON = Path(os.environ.get("RG_LG2_PYTHON", REPO / ".venv-lg2" / "bin" / "python"))
REFUSED, IN_USE = "55000", "55006"
PROXY_ID = "py2-A"
TRUE_FINAL = {"items": ["prep", "gate:True", "after"], "approved": True}
FALSE_FINAL = {"items": ["prep", "gate:False", "after"], "approved": False}

# (n, gates_ms); RG_PY2_N / RG_PY2_GATES / RG_PY2_REPS / RG_PY2_SAVERS widen it
RACE_CELLS = [(int(n), tuple(int(g) for g in os.environ.get("RG_PY2_GATES", "0,300").split(",")))
              for n in os.environ.get("RG_PY2_N", "4").split(",")]
RACE_REPS = int(os.environ.get("RG_PY2_REPS", "1"))
SAVERS = tuple(os.environ.get("RG_PY2_SAVERS", "conn").split(","))


def lg2(*argv: str, timeout: float = 120.0) -> str:
    cp = subprocess.run([str(LG2_PYTHON), "-W", "ignore", *argv], cwd=HERE, stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, f"{argv[:2]} exited {cp.returncode}:\n{cp.stderr[-3000:]}"
    return cp.stdout.strip().splitlines()[-1]


class Py2Racers(Racers):
    """``racer.py worker`` processes under the 2.0.x interpreter."""

    def __init__(self, workdir: Path, ledger_dsn: str, dsns: list[str], saver: str,
                 jobs: list[dict], tag: str):
        self.dir = workdir / f"py2-race-{tag}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        (self.dir / "jobs.json").write_text(json.dumps(jobs))
        self.jobs = jobs
        self.ids = [f"{tag}{i}" for i in range(len(dsns))]
        self.procs = []
        for rid, dsn in zip(self.ids, dsns):
            argv = [str(LG2_PYTHON), "-W", "ignore", str(HERE / "racer.py"), "worker",
                    "--dsn", f"{dsn}&application_name=racer-{rid}", "--ledger-dsn", ledger_dsn,
                    "--id", rid, "--saver", saver, "--dir", str(self.dir),
                    "--jobs", str(self.dir / "jobs.json")]
            err = open(self.dir / f"{rid}.stderr", "wb")
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=err))


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def py2proxy(proxy_factory, workdir):
    store = workdir / f"py2-claims-{uuid.uuid4().hex[:6]}.sqlite"
    return proxy_factory("--claims-store", str(store), "--proxy-id", PROXY_ID, name="proxy-py2")


@pytest.fixture(scope="module")
def dsns(direct_dsn, py2proxy, dbname) -> dict[str, str]:
    if not LG2_PYTHON.exists():
        pytest.fail(f"{LG2_PYTHON} is missing: integration/run_all.sh creates .venv-lg2 from "
                    "integration/requirements-lg2.txt")
    version = lg2("-c", "import importlib.metadata as m; print(m.version('langgraph-checkpoint-postgres'))")
    assert version.startswith("2.0."), f"{LG2_PYTHON} has langgraph-checkpoint-postgres {version}"
    # the 2.0.x migrations and the ledger table
    lg2(str(HERE / "racer.py"), "setup", "--dsn", direct_dsn)
    return {"direct": direct_dsn, "proxy": py2proxy.dsn(dbname)}


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ledger(dsn: str, thread: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("select racer, node, value from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


def audit_ops(proxy, thread: str, want, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        evs = run_audit_cli(proxy.audit_db, thread)
        if want(evs) or time.monotonic() > deadline:
            return evs
        time.sleep(0.2)


def ops(evs: list[dict], name: str) -> list[dict]:
    return [e for e in evs if e["operation"] == name]


# --------------------------------------------------------------------------- race
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("saver", SAVERS)
@pytest.mark.parametrize("cell", RACE_CELLS, ids=lambda c: f"n{c[0]}")
def test_race(dsns, py2proxy, workdir, via, saver, cell):
    """N 2.0.25 racers resume one parked thread at the same instant, once per gate.
    Stock: every racer succeeds, all N fire at 300 ms. Proxy: one fire, every loser
    refused (55000, or 55006 after the maximum wait) before its node ran."""
    n, gates = cell
    dsn, direct = dsns[via], dsns["direct"]
    jobs = []
    for gate in gates:
        for rep in range(RACE_REPS):
            thread = tid(f"p2r-{via}-g{gate}")
            parked = json.loads(lg2(str(HERE / "racer.py"), "park", "--dsn", dsn, "--thread", thread))
            assert parked["interrupts"], parked
            jobs.append({"thread": thread, "graph": "one", "form": "bare", "gate_ms": gate})
    racers = Py2Racers(workdir, direct, [dsn] * n, saver, jobs, f"{via[0]}")
    try:
        runs = racers.run_all()
    finally:
        racers.kill()
    tallies = {gate: Tally() for gate in gates}
    for job, res in zip(jobs, runs):
        thread, gate = job["thread"], job["gate_ms"]
        rows = ledger(direct, thread)
        tallies[gate].fires.append(len(rows))
        ctx = f"{via} {saver} n={n} gate={gate} thread={thread}\nresults={json.dumps(res, indent=1)}\nledger={rows}"
        print(f"RESULT py2 race {via} {saver} n={n} gate={gate}: {len(rows)} fire(s), "
              f"{sum(not r['ok'] for r in res)} refused")
        if via == "direct":
            assert all(r["ok"] for r in res), ctx
            if gate > 0:
                assert sorted(r[0] for r in rows) == sorted(racers.ids), ctx
            else:
                assert 1 <= len(rows) <= n, ctx
            continue
        assert len(rows) == 1, f"expected exactly one fire\n{ctx}"
        wid = rows[0][0]
        assert rows == [(wid, "gate", json.dumps(f"v-{wid}"))], ctx
        winner = next(r for r in res if r["id"] == wid)
        assert winner["ok"] and winner["values"]["approved"] == f"v-{wid}", ctx
        losers = [r for r in res if r["id"] != wid and not r["ok"]]
        for lo in losers:
            err = lo["error"]
            assert err["sqlstate"] in (REFUSED, IN_USE), f"loser {lo['id']}: {err}\n{ctx}"
            if err["sqlstate"] == REFUSED:
                for part in ("resumeguard: interrupt already answered", f'thread "{thread}"',
                             f'application_name "racer-{wid}"', f"proxy {PROXY_ID}"):
                    assert part in err["message"], f"{part!r} not in {err['message']!r}"
        late = [r for r in res if r["id"] != wid and r["ok"]]
        for r in late:   # served without firing: read the head the winner had finished
            assert gate == 0 and r["values"] == winner["values"], ctx
        evs = audit_ops(py2proxy, thread, lambda e: len(ops(e, "claim_refused")) >= len(losers)
                        and ops(e, "claim_consumed"))
        assert [e["application_name"] for e in ops(evs, "claim_taken")] == [f"racer-{wid}"], ctx
        assert len(ops(evs, "claim_refused")) == len(losers), ctx
        for r in res:   # the tally reads node-postgres' name of the SQLSTATE
            if r["error"]:
                r["error"]["code"] = r["error"]["sqlstate"]
        tallies[gate].add(winner, losers, late, len(ops(evs, "claim_waited")))
    for gate, tally in tallies.items():
        record(tally.row(f"py2-{saver}-n{n}", via, gate))


# --------------------------------------------------------------------------- fork
FORK = ("import json, sys; import lg_enforce as E; "
        "print(json.dumps(E.fork_scenario(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]), default=str))")


@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("form", ["bare", "map"])
@pytest.mark.parametrize("saver", SAVERS)
def test_fork_is_served_its_own_value(dsns, via, form, saver):
    """A 2.0.25 resume addressed to the interrupt checkpoint C with False after branch
    A answered True. Stock: the gate re-fires with True. Proxy: with False."""
    res = json.loads(lg2("-c", FORK, saver, dsns[via], tid(f"p2f-{form}"), form))
    assert res["a_result"] == TRUE_FINAL and res["a_ledger"] == [True], res
    fork = res["forks"][0]
    if via == "direct":
        assert res["ledger"] == [True, True], res
        assert fork["final_values"] == TRUE_FINAL, res
        return
    assert res["ledger"] == [True, False], res
    assert fork["effects"] == [False] and fork["result"] == FALSE_FINAL, fork
    assert fork["final_values"] == FALSE_FINAL and fork["final_id"] != res["a_final_id"], fork
    assert res["a_final_by_id"] == TRUE_FINAL, res
