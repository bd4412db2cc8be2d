"""LangGraph Python's 2.0.x saver generation end to end, at two points of it:
`langgraph-checkpoint-postgres` 2.0.25 with langgraph 0.6.11 (``.venv-lg2``,
integration/requirements-lg2.txt) and 2.0.8 with langgraph 0.2.70 (``.venv-lg208``,
integration/requirements-lg208.txt), each straight to PostgreSQL (the stock defect)
and through the proxy (the repair). This generation's checkpoint read carries
4-element pending writes and reads pending sends with a separate statement; the
scenarios are the suite's own (racer.py, lg_enforce.py), run by the generation's
interpreter in separate processes, each generation in a database and behind a proxy
of its own (``--rules``; its claims in that database).

* race: N ``racer.py worker`` processes resume one parked thread behind the file
  barrier; the gated node writes a row to ``rg_ledger`` over a direct connection.
  Stock: every racer fires (N at 300 ms). Proxy: one fire, the losers refused 55000.
* fork: ``lg_enforce.fork_scenario``: park at C, resume True, resume at C's
  checkpoint_id with False. Stock: served A's True. Proxy: its own False.
* validity: ``lg_enforce.build_items_graph`` appends None to ``items: list[str]``
  (a ``[[channel]]`` rule says: strings). Stock: persisted. Proxy: 23514, nothing of
  it durable, the thread goes on.
* every statement the generation sent through the proxy was recognized: the proxy
  logged no "checkpoint traffic not enforced".

langgraph 0.2.70 returns no ``__interrupt__`` from invoke and its interrupts have no
id (a resume map is keyed by task id): lg_scenarios' ``invoke_reporting_interrupts``
and ``resume_key`` bridge that in the harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

import lg_enforce as E
from conftest import REPO, audit_until, connect, ops
from test_consume_once import Racers
from test_js_saver import Tally, record
from test_validity import write_rules_dir

HERE = Path(__file__).resolve().parent


class Generation:
    """One installed 2.0.x saver stack: its venv's interpreter and the tag of its
    rows in full_matrix.sh's table."""

    def __init__(self, version: str, venv: str, requirements: str, env: str, tag: str):
        self.version, self.requirements, self.tag = version, requirements, tag
        self.python = Path(os.environ.get(env, REPO / venv / "bin" / "python"))


GENERATIONS = [
    Generation("2.0.25", ".venv-lg2", "requirements-lg2.txt", "RG_LG2_PYTHON", "py2"),
    Generation("2.0.8", ".venv-lg208", "requirements-lg208.txt", "RG_LG208_PYTHON", "py208"),
]
REFUSED, IN_USE = "55000", "55006"
PROXY_ID = "py2-A"
TRUE_FINAL = {"items": ["prep", "gate:True", "after"], "approved": True}
FALSE_FINAL = {"items": ["prep", "gate:False", "after"], "approved": False}

# the race's (n, gates_ms) cells; RG_PY2_N / RG_PY2_GATES / RG_PY2_REPS / RG_PY2_SAVERS widen it
# (full_matrix.sh). Forks and refused writes run with every saver construction.
RACE_CELLS = [(int(n), tuple(int(g) for g in os.environ.get("RG_PY2_GATES", "0,300").split(",")))
              for n in os.environ.get("RG_PY2_N", "4").split(",")]
RACE_REPS = int(os.environ.get("RG_PY2_REPS", "1"))
SAVERS = tuple(os.environ.get("RG_PY2_SAVERS", "conn").split(","))


def lg2(gen: Generation, *argv: str, timeout: float = 120.0) -> str:
    cp = subprocess.run([str(gen.python), "-W", "ignore", *argv], cwd=HERE, stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, f"{argv[:2]} exited {cp.returncode}:\n{cp.stderr[-3000:]}"
    return cp.stdout.strip().splitlines()[-1]


class Py2Racers(Racers):
    """``racer.py worker`` processes under a 2.0.x generation's interpreter."""

    def __init__(self, gen: Generation, workdir: Path, ledger_dsn: str, dsns: list[str], saver: str,
                 jobs: list[dict], tag: str):
        self.dir = workdir / f"py2-race-{tag}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        (self.dir / "jobs.json").write_text(json.dumps(jobs))
        self.jobs = jobs
        self.ids = [f"{tag}{i}" for i in range(len(dsns))]
        self.procs = []
        for rid, dsn in zip(self.ids, dsns):
            argv = [str(gen.python), "-W", "ignore", str(HERE / "racer.py"), "worker",
                    "--dsn", f"{dsn}&application_name=racer-{rid}", "--ledger-dsn", ledger_dsn,
                    "--id", rid, "--saver", saver, "--dir", str(self.dir),
                    "--jobs", str(self.dir / "jobs.json")]
            err = open(self.dir / f"{rid}.stderr", "wb")
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=err))


# --------------------------------------------------------------------------- fixtures
ITEMS_RULE = """\
[[channel]]
name = "items"
thread_id = "p2v-.*"
schema = { type = "array", items = { type = "string" } }
"""


@pytest.fixture(scope="module", params=GENERATIONS, ids=lambda g: f"saver{g.version}")
def gen(request) -> Generation:
    g = request.param
    if not g.python.exists():
        pytest.fail(f"{g.python} is missing: integration/run_all.sh creates it from "
                    f"integration/{g.requirements}")
    version = lg2(g, "-c", "import importlib.metadata as m; print(m.version('langgraph-checkpoint-postgres'))")
    assert version == g.version, f"{g.python} has langgraph-checkpoint-postgres {version}"
    return g


@pytest.fixture(scope="module")
def py2proxy(proxy_factory, workdir, gen):
    rules = write_rules_dir(workdir / f"{gen.tag}-rules-{uuid.uuid4().hex[:6]}", {"items.toml": ITEMS_RULE})
    return proxy_factory("--proxy-id", PROXY_ID, "--rules", str(rules), name=f"proxy-{gen.tag}")


@pytest.fixture(scope="module")
def gendb(pg, gen):
    """A database of the generation's own: its migrations differ from the other's."""
    name = f"rg_{gen.tag}_saver_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def dsns(pg, gen, gendb, py2proxy) -> dict[str, str]:
    direct = pg.dsn(gendb)
    # the generation's migrations and the ledger table
    lg2(gen, str(HERE / "racer.py"), "setup", "--dsn", direct)
    return {"direct": direct, "proxy": py2proxy.dsn(gendb)}


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ledger(dsn: str, thread: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("select racer, node, value from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


# --------------------------------------------------------------------------- race
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("saver", SAVERS)
@pytest.mark.parametrize("cell", RACE_CELLS, ids=lambda c: f"n{c[0]}")
def test_race(gen, dsns, py2proxy, workdir, via, saver, cell):
    """N 2.0.x racers resume one parked thread at the same instant, once per gate.
    Stock: every racer succeeds, all N fire at 300 ms. Proxy: one fire, every loser
    refused (55000, or 55006 after the maximum wait) before its node ran."""
    n, gates = cell
    dsn, direct = dsns[via], dsns["direct"]
    jobs = []
    for gate in gates:
        for rep in range(RACE_REPS):
            thread = tid(f"p2r-{via}-g{gate}")
            parked = json.loads(lg2(gen, str(HERE / "racer.py"), "park", "--dsn", dsn, "--thread", thread))
            assert [i["value"] for i in parked["interrupts"]] == [{"question": "approve gate?"}], parked
            jobs.append({"thread": thread, "graph": "one", "form": "bare", "gate_ms": gate})
    racers = Py2Racers(gen, workdir, direct, [dsn] * n, saver, jobs, f"{via[0]}")
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
        print(f"RESULT {gen.tag} race {via} {saver} n={n} gate={gate}: {len(rows)} fire(s), "
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
                # a late racer (it read the finished head) is refused at its __resume__
                # write as a late duplicate, naming the winner too
                late_dup = err["message"].startswith("resumeguard: late duplicate")
                first = ("resumeguard: late duplicate resume" if late_dup
                         else "resumeguard: interrupt already answered")
                for part in (first, f'thread "{thread}"',
                             f'application_name "racer-{wid}"', f"proxy {PROXY_ID}"):
                    assert part in err["message"], f"{part!r} not in {err['message']!r}"
        late = [r for r in res if r["id"] != wid and r["ok"]]
        for r in late:   # served without firing: read the head the winner had finished
            assert gate == 0 and r["values"] == winner["values"], ctx
        late_dups = sum(lo["error"]["message"].startswith("resumeguard: late duplicate")
                        for lo in losers)
        evs = audit_until(py2proxy, thread, lambda e: len(ops(e, "claim_refused"))
                          + len(ops(e, "late_duplicate")) >= len(losers)
                          and ops(e, "claim_consumed"))
        assert [e["application_name"] for e in ops(evs, "claim_taken")] == [f"racer-{wid}"], ctx
        assert len(ops(evs, "claim_refused")) == len(losers) - late_dups, ctx
        assert len(ops(evs, "late_duplicate")) == late_dups, ctx
        for r in res:   # the tally reads node-postgres' name of the SQLSTATE
            if r["error"]:
                r["error"]["code"] = r["error"]["sqlstate"]
        tallies[gate].add(winner, losers, late, len(ops(evs, "claim_waited")))
    for gate, tally in tallies.items():
        record(tally.row(f"{gen.tag}-{saver}-n{n}", via, gate))


# --------------------------------------------------------------------------- fork
FORK = ("import json, sys; import lg_enforce as E; "
        "print(json.dumps(E.fork_scenario(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]), default=str))")


@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("form", ["bare", "map"])
@pytest.mark.parametrize("saver", E.SAVER_KINDS)
def test_fork_is_served_its_own_value(gen, dsns, via, form, saver):
    """A 2.0.x resume addressed to the interrupt checkpoint C with False after branch
    A answered True (bare: ``Command(resume=False)``; map: keyed by the interrupt's id,
    or on langgraph 0.2.70 by its task's id). Stock: the gate re-fires with True.
    Proxy: with False."""
    res = json.loads(lg2(gen, "-c", FORK, saver, dsns[via], tid(f"p2f-{form}"), form))
    assert res["parked_interrupts"] == [{"question": "approve?"}], res
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


# --------------------------------------------------------------------------- validity
APPEND = """
import json, sys
import lg_enforce as E
from racer import describe_error
kind, dsn, thread = sys.argv[1:4]
cfg = E.cfg_of(thread)
out = {}
with E.Driver(kind, dsn) as d:
    g = E.build_items_graph(d.saver)
    out["first"] = d.invoke(g, {"pending": "a"}, cfg)["items"]
    try:
        d.invoke(g, {"pending": None}, cfg)
        out["error"] = None
    except Exception as e:
        out["error"] = describe_error(e)
    out["state"] = d.get_state(g, cfg).values["items"]
    out["then"] = d.invoke(g, {"pending": "b"}, cfg)["items"]
print(json.dumps(out))
"""


@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("saver", E.SAVER_KINDS)
def test_invalid_write_is_refused(gen, dsns, via, saver):
    """A task appends None to ``items`` (a list of strings by rule). Stock: invoke
    succeeds and the None is durable in the pending write and the blob. Proxy: invoke
    raises 23514 naming the channel and thread, nothing of that step is durable, and
    the thread continues with the next valid input."""
    thread = tid(f"p2v-{saver}")
    res = json.loads(lg2(gen, "-c", APPEND, saver, dsns[via], thread))
    rows = E.channel_rows(dsns["direct"], thread, "items")
    assert res["first"] == ["a"], res
    if via == "direct":
        assert res["error"] is None and res["state"] == ["a", None], res
        assert res["then"] == ["a", None, "b"], res
        bad = E.invalid_items(rows)
        assert ("writes", [None]) in bad and any(w == "blobs" for w, _ in bad), rows
        return
    err = res["error"]
    assert err is not None and err["sqlstate"] == "23514", res
    for part in ('channel "items"', f'thread "{thread}"', "schema path /items/type"):
        assert part in err["message"], f"{part!r} not in {err['message']!r}"
    assert res["state"] == ["a"] and res["then"] == ["a", "b"], res
    assert E.invalid_items(rows) == [], f"invalid value durable through the proxy: {rows}"
    assert E.dangling_versions(dsns["direct"], thread, "items") == []


# --------------------------------------------------------------------------- recognition
def test_every_statement_was_recognized(gen, dsns, py2proxy):
    """The proxy logged no unenforced checkpoint traffic for this generation: its
    saver profile recognized and decoded every statement and row the generation sent
    (the module's races, forks and writes before this test, plus a fork and a refused
    write over the async saver here, so the test holds on its own too)."""
    json.loads(lg2(gen, "-c", FORK, "async", dsns["proxy"], tid("p2f-rec"), "map"))
    res = json.loads(lg2(gen, "-c", APPEND, "async", dsns["proxy"], tid("p2v-rec")))
    assert res["error"]["sqlstate"] == "23514", res
    log = py2proxy.stderr_path.read_text(errors="replace")
    unenforced = [ln for ln in log.splitlines() if "checkpoint traffic not enforced" in ln]
    assert unenforced == [], "\n".join(unenforced)
