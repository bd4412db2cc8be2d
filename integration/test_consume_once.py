"""Consume-once (issue 4) end to end: racers as separate OS processes against stock
PostgreSQL (direct DSN: the defect, N fires) and through the proxy (one fire, the rest
refused before their node runs), plus liveness, inspection, fail-closed and the
operator commands.

Racers are ``racer.py worker`` processes: each imports LangGraph, opens its saver,
compiles the graph, touches ``ready-<job>-<id>`` and spins until ``go-<job>`` exists
(the barrier); the gated node writes its effect to ``rg_ledger`` over a DIRECT
connection (outside the checkpoint tables) with the racer's id, sleeps gate_ms,
returns.

CI runs the reduced matrix below (CI_CELLS). The full matrix (N = 2,4,8,16 x gate
0/300 ms x 10 reps x bare/map x conn/pool/async x one/two proxies) is
``integration/full_matrix.sh``; it runs this module's ``test_race`` with
RG_CO_FULL=1 and prints a results table (fires / refusals / waits per cell).

Proxies (``co`` fixture): ``co-A`` and ``co-B`` share one claims store (A also has the
inspection application_name pattern ``^rg-inspect`` and an inspection listener);
``co-F`` has an unopenable claims store (fail closed).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import racer as R
from conftest import HOST, free_port, port_accepts, proxy_binary, run_audit_cli

HERE = Path(__file__).resolve().parent
LAPSE_MS = 3000
GRACE_MS = 1000          # holder_gone_grace_ms
PROGRESS_HOLD_MS = 10000
INSPECT_APP = "rg-inspect-ui"
REFUSED = "55000"
IN_USE = "55006"
FAIL_CLOSED = "58000"


# ----------------------------------------------------------------- matrix
def _env_list(name: str, default: tuple, conv=str) -> tuple:
    v = os.environ.get(name)
    return tuple(conv(x) for x in v.split(",")) if v else default


# (n, saver, form, proxies, gates_ms, reps)
CI_CELLS = [
    (2, "conn", "bare", 1, (0, 300), 2),
    (4, "conn", "bare", 1, (0, 300), 2),
    (4, "conn", "map", 1, (0, 300), 1),
    (4, "pool", "bare", 1, (0, 300), 1),
    (4, "async", "bare", 1, (0, 300), 1),
    (4, "conn", "bare", 2, (0, 300), 1),
]


def full_cells() -> list[tuple]:
    ns = _env_list("RG_CO_N", (2, 4, 8, 16), int)
    gates = _env_list("RG_CO_GATES", (0, 300), int)
    reps = int(os.environ.get("RG_CO_REPS", "10"))
    forms = _env_list("RG_CO_FORMS", ("bare", "map"))
    savers = _env_list("RG_CO_SAVERS", ("conn", "pool", "async"))
    proxies = _env_list("RG_CO_PROXIES", (1, 2), int)
    return [(n, s, f, p, gates, reps) for n, s, f, p in itertools.product(ns, savers, forms, proxies)]


CELLS = full_cells() if os.environ.get("RG_CO_FULL") == "1" else CI_CELLS


def cell_id(c: tuple) -> str:
    n, saver, form, proxies, gates, reps = c
    return f"n{n}-{saver}-{form}-{proxies}px"


# ----------------------------------------------------------------- fixtures
class Env:
    def __init__(self, direct: str, a, b, f, inspect_port: int, store: Path, workdir: Path):
        self.direct = direct
        self.a, self.b, self.f = a, b, f
        self.dbname = direct.rsplit("/", 1)[1].split("?")[0]
        self.inspect_port = inspect_port
        self.store = store
        self.workdir = workdir
        self.proxy_ids = {a.port: "co-A", b.port: "co-B"}

    def dsn(self, which: str, app: str | None = None) -> str:
        base = {"direct": self.direct, "A": self.a.dsn(self.dbname), "B": self.b.dsn(self.dbname),
                "F": self.f.dsn(self.dbname),
                "inspect": f"postgresql://postgres@{HOST}:{self.inspect_port}/{self.dbname}"
                           "?connect_timeout=10"}[which]
        return base + (f"&application_name={app}" if app else "")

    def audit(self, thread: str, proxies=("A", "B")) -> list[dict]:
        evs = []
        for p in proxies:
            evs += run_audit_cli({"A": self.a, "B": self.b, "F": self.f}[p].audit_db, thread)
        return evs


@pytest.fixture(scope="module")
def co(proxy_factory, direct_dsn, workdir) -> Env:
    store = workdir / f"co-claims-{uuid.uuid4().hex[:6]}.sqlite"
    ins = free_port()
    cfg_a = workdir / "co-A.toml"
    common = (f'store = "{store}"\nlapse_ms = {LAPSE_MS}\npolicy = "wait"\n'
              f'holder_gone_grace_ms = {GRACE_MS}\nprogress_hold_ms = {PROGRESS_HOLD_MS}\n')
    cfg_a.write_text(f'[enforce]\nconsume_once = true\n\n[claims]\n{common}proxy_id = "co-A"\n'
                     f'inspection_application_names = ["^rg-inspect"]\n'
                     f'inspection_listen = "{HOST}:{ins}"\n')
    cfg_b = workdir / "co-B.toml"
    cfg_b.write_text(f'[claims]\n{common}')
    a = proxy_factory("--config", str(cfg_a), name="co-A")
    # --proxy-id on the command line overrides the file; the store is shared with A
    b = proxy_factory("--config", str(cfg_b), "--proxy-id", "co-B", name="co-B")
    f = proxy_factory("--claims-store", "/proc/nonexistent/claims.sqlite", "--proxy-id", "co-F",
                      name="co-F")
    deadline = time.monotonic() + 10
    while not port_accepts(ins):
        assert time.monotonic() < deadline, f"inspection listener {ins} never accepted\n{a.describe()}"
        time.sleep(0.05)
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return Env(direct_dsn, a, b, f, ins, store, workdir)


def tid(prefix: str) -> str:
    return f"co-{prefix}-{uuid.uuid4().hex[:8]}"


def ledger(env: Env, thread: str) -> list[tuple]:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select racer, node, value from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


def park(dsn: str, thread: str, graph: str = "one", saver: str = "conn") -> list[dict]:
    with R.Runner(saver, dsn) as r:
        res = r.invoke(graph, dict(R.INITIAL), thread)
    its = R.interrupts_of(res)
    assert its, f"graph {graph} did not park: {res}"
    return its


def final_state(env: Env, thread: str, graph: str = "one"):
    with R.Runner("conn", env.direct) as r:   # direct: never claims
        return r.get_state(graph, thread)


def in_process_resume(dsn: str, thread: str, racer_id: str, **job) -> dict:
    R.CTX["racer"] = racer_id
    with R.Runner(job.pop("saver", "conn"), dsn) as r:
        return R.resume_once(r, {"thread": thread, **job})


def audit_ops(env: Env, thread: str, want, proxies=("A", "B"), timeout: float = 10.0) -> list[dict]:
    """Audit events of the thread, polled until ``want(events)`` (the sink is async)."""
    deadline = time.monotonic() + timeout
    while True:
        evs = env.audit(thread, proxies)
        if want(evs) or time.monotonic() > deadline:
            return evs
        time.sleep(0.2)


def ops(evs: list[dict], name: str) -> list[dict]:
    return [e for e in evs if e["operation"] == name]


def claims_cli(*args: str) -> subprocess.CompletedProcess:
    cp = subprocess.run([str(proxy_binary()), "claims", *args], capture_output=True, text=True,
                        timeout=30)
    assert cp.returncode == 0, f"claims {args}: rc={cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return cp


# ----------------------------------------------------------------- racer processes
class Racers:
    """N ``racer.py worker`` processes running a list of jobs behind a file barrier."""

    def __init__(self, env: Env, dsns: list[str], saver: str, jobs: list[dict], tag: str):
        self.dir = env.workdir / f"race-{tag}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        (self.dir / "jobs.json").write_text(json.dumps(jobs))
        self.jobs = jobs
        self.ids = [f"{tag}{i}" for i in range(len(dsns))]
        self.procs = []
        for rid, dsn in zip(self.ids, dsns):
            sep = "&" if "?" in dsn else "?"
            argv = [sys.executable, str(HERE / "racer.py"), "worker",
                    "--dsn", f"{dsn}{sep}application_name=racer-{rid}",
                    "--ledger-dsn", env.direct, "--id", rid, "--saver", saver,
                    "--dir", str(self.dir), "--jobs", str(self.dir / "jobs.json")]
            err = open(self.dir / f"{rid}.stderr", "wb")
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=err))

    def _wait_files(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.dir / n).exists() for n in names):
            for rid, p in zip(self.ids, self.procs):
                if p.poll() is not None and p.returncode != 0:
                    raise AssertionError(f"racer {rid} exited {p.returncode}:\n"
                                         f"{(self.dir / f'{rid}.stderr').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                missing = [n for n in names if not (self.dir / n).exists()]
                raise AssertionError(f"timed out waiting for {missing}")
            time.sleep(0.005)

    def ready(self, j: int, timeout: float = 90.0) -> None:
        self._wait_files([f"ready-{j}-{rid}" for rid in self.ids], timeout)

    def go(self, j: int) -> float:
        t = time.time()
        (self.dir / f"go-{j}").touch()
        return t

    def results(self, j: int, timeout: float = 90.0) -> list[dict]:
        names = [f"result-{j}-{rid}.json" for rid in self.ids]
        self._wait_files(names, timeout)
        return [json.loads((self.dir / n).read_text()) for n in names]

    def run_all(self) -> list[list[dict]]:
        out = []
        for j in range(len(self.jobs)):
            self.ready(j)
            self.go(j)
            out.append(self.results(j))
        self.finish()
        return out

    def finish(self, timeout: float = 60.0) -> None:
        for rid, p in zip(self.ids, self.procs):
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"racer {rid} did not exit")
            assert rc == 0, f"racer {rid} exited {rc}:\n{(self.dir / f'{rid}.stderr').read_text()[-3000:]}"

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def make_jobs(dsn: str, form: str, gates: tuple, reps: int, saver: str, tag: str) -> list[dict]:
    jobs = []
    for gate in gates:
        for rep in range(reps):
            thread = tid(f"{tag}-g{gate}-r{rep}")
            its = park(dsn, thread, saver="conn" if saver == "async" else saver)
            jobs.append({"thread": thread, "graph": "one", "form": form, "gate_ms": gate,
                         "interrupt_id": its[0]["id"], "rep": rep})
    return jobs


# ----------------------------------------------------------------- the race matrix
RESULTS_TABLE = os.environ.get("RG_CO_TABLE")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_race(co, cell):
    """N racers resume one parked thread at the same instant. Stock: N fires (every
    racer succeeds). Proxy: one fire, every loser refused (55000, or 55006 after the
    maximum wait) before its node ran, the thread completes with the winner's value."""
    n, saver, form, proxies, gates, reps = cell
    label = cell_id(cell)
    summary = {"cell": label, "n": n, "saver": saver, "form": form, "proxies": proxies}

    # ---- stock (direct DSN), the differential
    if proxies == 1:
        jobs = make_jobs(co.direct, form, gates, reps, saver, "st")
        racers = Racers(co, [co.direct] * n, saver, jobs, "s")
        try:
            runs = racers.run_all()
        finally:
            racers.kill()
        for gate in gates:
            fires = []
            for job, res in zip(jobs, runs):
                if job["gate_ms"] != gate:
                    continue
                rows = ledger(co, job["thread"])
                fires.append(len(rows))
                bad = [r for r in res if not r["ok"]]
                assert not bad, f"stock racer failed: {bad}"
                # every racer ran the gated node: one ledger row per racer
                assert sorted(r[0] for r in rows) == sorted(racers.ids), (gate, rows)
            summary[f"stock_fires_g{gate}"] = fires

    # ---- through the proxy (one or two instances, racers split between them)
    targets = ["A", "B"][:proxies]
    dsns = [co.dsn(targets[i % proxies]) for i in range(n)]
    jobs = make_jobs(co.dsn("A"), form, gates, reps, saver, "px")
    racers = Racers(co, dsns, saver, jobs, "p")
    try:
        runs = racers.run_all()
    finally:
        racers.kill()
    port_of = {rid: int(d.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
               for rid, d in zip(racers.ids, dsns)}
    for gate in gates:
        fires, refused, in_use, waits, loser_ms, winner_ms = [], 0, 0, 0, [], []
        for job, res in zip(jobs, runs):
            if job["gate_ms"] != gate:
                continue
            thread = job["thread"]
            winners = [r for r in res if r["ok"]]
            losers = [r for r in res if not r["ok"]]
            rows = ledger(co, thread)
            fires.append(len(rows))
            ctx = f"{label} gate={gate} thread={thread}\nresults={json.dumps(res, indent=1)}\nledger={rows}"
            assert len(winners) == 1, f"expected exactly one successful resume\n{ctx}"
            w = winners[0]
            wid = w["id"]
            # exactly one effect, by the winner, with the winner's value; no loser's node ran
            assert rows == [(wid, "gate", json.dumps(f"v-{wid}"))], ctx
            assert w["values"]["approved"] == f"v-{wid}", ctx
            assert w["values"]["items"] == ["prep", f"gate:v-{wid}", "after"], ctx
            for lo in losers:
                err = lo["error"]
                assert err["sqlstate"] in (REFUSED, IN_USE), f"loser {lo['id']}: {err}\n{ctx}"
                if err["sqlstate"] == REFUSED:
                    refused += 1
                    assert err["class"] == "ObjectNotInPrerequisiteState", err
                    msg = err["message"]
                    for part in ("resumeguard: interrupt already answered", f'thread "{thread}"',
                                 f'application_name "racer-{wid}"', f"proxy {co.proxy_ids[port_of[wid]]}",
                                 "refused before its node ran"):
                        assert part in msg, f"{part!r} not in {msg!r}"
                else:
                    in_use += 1
                    assert err["class"] == "ObjectInUse", err
                    assert "interrupt is being answered" in err["message"], err
                loser_ms.append((lo["t_end"] - lo["t_go"]) * 1000)
            winner_ms.append((w["t_end"] - w["t_go"]) * 1000)
            # the thread completed with the winner's value
            st = final_state(co, thread)
            assert list(st.next) == [], ctx
            assert st.values["approved"] == f"v-{wid}", ctx
            # audit (both proxies' trails): one claim, consumed, one refusal per 55000
            evs = audit_ops(co, thread, lambda e: len(ops(e, "claim_refused")) >= len(losers)
                            and ops(e, "claim_consumed"), proxies=targets)
            assert len(ops(evs, "claim_taken")) == 1, [e["operation"] for e in evs]
            assert not ops(evs, "claim_takeover"), ctx
            assert len(ops(evs, "claim_consumed")) == 1, ctx
            assert len(ops(evs, "claim_refused")) == len(losers), ctx
            waits += len(ops(evs, "claim_waited"))
        summary[f"proxy_fires_g{gate}"] = fires
        summary[f"refused_g{gate}"] = refused
        summary[f"in_use_g{gate}"] = in_use
        summary[f"waits_g{gate}"] = waits
        summary[f"max_loser_ms_g{gate}"] = round(max(loser_ms), 1) if loser_ms else None
        summary[f"max_winner_ms_g{gate}"] = round(max(winner_ms), 1)
    # the consumed claim is listed by the operator command
    first = jobs[0]["thread"]
    out = claims_cli("list", "--store", str(co.store), "--thread", first).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith(first)), "")
    assert " consumed " in line, out
    print("RESULT " + json.dumps(summary))
    if RESULTS_TABLE:
        with open(RESULTS_TABLE, "a") as fh:
            fh.write(json.dumps(summary) + "\n")
