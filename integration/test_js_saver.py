"""LangGraph.js (`@langchain/langgraph-checkpoint-postgres` 1.0.x, node-postgres) end to
end: every scenario runs straight to PostgreSQL (the stock defect shows) and through
the proxy (the repair shows), in separate ``node integration/js/lg.mjs`` processes.

* race: N racers (``lg.mjs race-resume``, one node process each) resume one parked
  thread behind racer.py's file barrier; the gated node sleeps gate_ms, then appends a
  line to a ledger file. Stock: every racer fires (N at 300 ms). Proxy: one fire, the
  losers refused 55000 before their node ran.
* fork: park at C, resume true (branch A), resume at C's checkpoint_id with false.
  Stock: the fork is served A's true. Proxy: its own false. What the fork's
  checkpoints then hold is a test of its own: this saver numbers channel versions
  per thread, so a branch's blobs can collide with another branch's.
* validity: ``items`` is a list of strings (channel rule for ``jv-…`` threads);
  appending null is persisted by stock, refused 23514 through the proxy with
  nothing of the task written.
* end: 50 x ``pool.end()`` / ``client.end()`` / ``saver.end()``: no ``error`` event.

The JS saver's statements are schema-qualified (``"public".checkpoints``) and its
blobs are JSON, not msgpack. Proxy-side cells the proxy does not pass yet are marked
``xfail(strict=True)`` (below), so each one turns into a failure the moment it starts
passing and its mark must go.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import REPO, audit_until, ops
from test_consume_once import Racers

HERE = Path(__file__).resolve().parent
JS_DIR = HERE / "js"
LG = JS_DIR / "lg.mjs"
NODE = os.environ.get("RG_NODE") or shutil.which("node")   # RG_NODE: another node binary
REFUSED, IN_USE, CHECK_VIOLATION = "55000", "55006", "23514"
PROXY_ID = "js-A"
TRUE_FINAL = {"items": ["prep", "gate:true", "after"], "approved": True}
FALSE_FINAL = {"items": ["prep", "gate:false", "after"], "approved": False}

JS_INTEGER_VERSIONS = pytest.mark.xfail(
    strict=True, reason="the JS saver's channel versions are per-thread integers: a fork "
    "branch's blobs collide with branch A's and are dropped (ON CONFLICT DO NOTHING)")

pytestmark = [pytest.mark.core, pytest.mark.skipif(
    NODE is None, reason="!!! node is not installed: the LangGraph.js saver is NOT tested "
    "(.ci/run installs Debian's nodejs and npm) !!!")]


def _env_cells(default: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``RG_JS_N=2,4,8,16 RG_JS_GATES=0,300`` widen the race cells beyond CI's."""
    ns, gates = os.environ.get("RG_JS_N"), os.environ.get("RG_JS_GATES")
    if not ns and not gates:
        return default
    n_list = [int(x) for x in (ns or "2,4,8").split(",")]
    g_list = [int(x) for x in (gates or "0,300").split(",")]
    return [(n, g) for n in n_list for g in g_list]


RACE_CELLS = _env_cells([(2, 0), (2, 300), (4, 0), (4, 300), (8, 0), (8, 300)])
RACE_REPS = int(os.environ.get("RG_JS_REPS", "1"))


def via_params(proxy_mark) -> list:
    return ["direct", pytest.param("proxy", marks=proxy_mark)]


# --------------------------------------------------------------------------- running node
def lg(*args: str, timeout: float = 60.0) -> dict:
    cp = subprocess.run([NODE, str(LG), *args], cwd=JS_DIR, stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=timeout)
    assert cp.returncode == 0, f"lg.mjs {args[0]} exited {cp.returncode}:\n{cp.stderr[-3000:]}"
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert "unhandled" not in out, f"lg.mjs {args[0]}: unhandled errors {out['unhandled']}"
    return out


class NodeRacers(Racers):
    """N ``lg.mjs race-resume`` processes on racer.py's barrier protocol (job 0)."""

    def __init__(self, workdir: Path, dsns: list[str], thread: str, gate_ms: int, tag: str):
        self.dir = workdir / f"js-race-{tag}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir()
        self.jobs = [{"thread": thread, "gate_ms": gate_ms}]
        self.ledger = self.dir / "ledger.jsonl"
        self.ledger.touch()
        self.ids = [f"{tag}{i}" for i in range(len(dsns))]
        self.procs = []
        for rid, dsn in zip(self.ids, dsns):
            argv = [NODE, str(LG), "race-resume", "--dsn", f"{dsn}&application_name=racer-{rid}",
                    "--thread", thread, "--id", rid, "--gate-ms", str(gate_ms),
                    "--ledger", str(self.ledger), "--dir", str(self.dir)]
            err = open(self.dir / f"{rid}.stderr", "wb")
            self.procs.append(subprocess.Popen(argv, cwd=JS_DIR, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=err))

    def fires(self) -> list[dict]:
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def node_modules():
    if not (JS_DIR / "node_modules" / "@langchain" / "langgraph-checkpoint-postgres").is_dir():
        pytest.fail(f"{JS_DIR}/node_modules is missing: run `npm ci` there "
                    "(integration/run_all.sh does)")


@pytest.fixture(scope="module")
def rules_dir(workdir) -> Path:
    root = workdir / f"js-rules-{uuid.uuid4().hex[:6]}"
    (root / "channels").mkdir(parents=True)
    for profile in (REPO / "rules").glob("*.toml"):
        shutil.copy(profile, root / profile.name)
    (root / "channels" / "items.toml").write_text(
        '[[channel]]\nname = "items"\nthread_id = "jv-.*"\n'
        'schema = { type = "array", items = { type = "string" } }\n')
    return root


@pytest.fixture(scope="module")
def jsproxy(proxy_factory, rules_dir, workdir):
    return proxy_factory("--rules", str(rules_dir), "--proxy-id", PROXY_ID, name="proxy-js")


@pytest.fixture(scope="module")
def dsns(direct_dsn, jsproxy, dbname) -> dict[str, str]:
    lg("setup", "--dsn", direct_dsn)
    return {"direct": direct_dsn, "proxy": jsproxy.dsn(dbname)}


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- race
MATRIX_TABLE = os.environ.get("RG_CO_TABLE")


def is_late_duplicate(err: dict) -> bool:
    return err["code"] == REFUSED and err["message"].startswith("resumeguard: late duplicate")


class Tally:
    """Per-cell counts for full_matrix.sh's table."""

    def __init__(self):
        self.fires, self.loser_ms, self.winner_ms = [], [], []
        self.refused = self.leased = self.in_use = self.late = self.late_dups = self.waits = 0

    def add(self, winner: dict, losers: list[dict], late: list[dict], waits: int) -> None:
        for lo in losers:
            if is_late_duplicate(lo["error"]):
                self.late_dups += 1
            elif lo["error"]["code"] == REFUSED:
                self.refused += 1
                self.leased += "its run is in progress" in lo["error"]["message"]
            else:
                self.in_use += 1
            self.loser_ms.append((lo["t_end"] - lo["t_go"]) * 1000)
        self.winner_ms.append((winner["t_end"] - winner["t_go"]) * 1000)
        self.late += len(late)
        self.waits += waits

    def row(self, cell: str, via: str, gate: int) -> dict:
        if via == "direct":
            return {"cell": cell, f"stock_fires_g{gate}": self.fires}
        return {"cell": cell, f"proxy_fires_g{gate}": self.fires, f"refused_g{gate}": self.refused,
                f"leased_g{gate}": self.leased, f"in_use_g{gate}": self.in_use,
                f"late_g{gate}": self.late, f"late_dup_g{gate}": self.late_dups,
                f"waits_g{gate}": self.waits,
                f"max_loser_ms_g{gate}": round(max(self.loser_ms), 1) if self.loser_ms else None,
                f"max_winner_ms_g{gate}": round(max(self.winner_ms), 1)}


def record(row: dict) -> None:
    """One row of full_matrix.sh's table (it merges the rows of a cell)."""
    if MATRIX_TABLE:
        with open(MATRIX_TABLE, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def race(workdir: Path, dsn: str, n: int, gate_ms: int, tag: str) -> tuple[NodeRacers, list[dict]]:
    thread = tid(f"jr-{tag}")
    parked = lg("park", "--dsn", dsn, "--thread", thread)
    assert [i["value"] for i in parked["interrupts"]] == [{"question": "approve?"}], parked
    racers = NodeRacers(workdir, [dsn] * n, thread, gate_ms, tag)
    try:
        results = racers.run_all()[0]
    finally:
        racers.kill()
    return racers, results


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("cell", RACE_CELLS, ids=lambda c: f"n{c[0]}-g{c[1]}")
def test_race(dsns, jsproxy, workdir, via, cell):
    """N node racers resume one parked thread at the same instant. Stock: every racer
    succeeds and fires (all N at 300 ms). Proxy: exactly one fire, every loser refused
    (55000, or 55006 after the maximum wait) before its node ran, the thread completes
    with the winner's answer."""
    n, gate = cell
    tally = Tally()
    for rep in range(RACE_REPS):
        racers, res = race(workdir, dsns[via], n, gate, f"{via[0]}{rep}-")
        thread = racers.jobs[0]["thread"]
        fires = racers.fires()
        ctx = f"{via} n={n} gate={gate} thread={thread}\nresults={json.dumps(res, indent=1)}\nfires={fires}"
        final = lg("state", "--dsn", dsns["direct"], "--thread", thread)
        print(f"RESULT js race {via} n={n} gate={gate}: {len(fires)} fire(s), "
              f"{sum(not r['ok'] for r in res)} refused")
        tally.fires.append(len(fires))
        if via == "direct":
            assert all(r["ok"] for r in res), ctx
            assert len({f["racer"] for f in fires}) == len(fires), ctx
            if gate > 0:
                assert sorted(f["racer"] for f in fires) == sorted(racers.ids), ctx
            else:
                # gate 0 on two cores: a racer reading after another's task writes
                # replays them instead of running the node
                assert 1 <= len(fires) <= n, ctx
            assert final["next"] == [], ctx
            continue
        assert len(fires) == 1, f"expected exactly one fire\n{ctx}"
        wid = fires[0]["racer"]
        assert fires[0]["value"] == f"v-{wid}", ctx
        winner = next(r for r in res if r["id"] == wid)
        assert winner["ok"] and winner["values"] == {
            "items": ["prep", f"gate:v-{wid}", "after"], "approved": f"v-{wid}"}, ctx
        losers = [r for r in res if r["id"] != wid and not r["ok"]]
        late = [r for r in res if r["id"] != wid and r["ok"]]
        for lo in losers:
            err = lo["error"]
            assert err["code"] in (REFUSED, IN_USE), f"loser {lo['id']}: {err}\n{ctx}"
            assert lo["effects"] == [], ctx
            if err["code"] == REFUSED:
                # a late racer (its read found the finished head) is refused at its
                # __resume__ write as a late duplicate, naming the winner too
                first = ("resumeguard: late duplicate resume" if is_late_duplicate(err)
                         else "resumeguard: interrupt already answered")
                for part in (first, f'thread "{thread}"',
                             f'application_name "racer-{wid}"', f"proxy {PROXY_ID}"):
                    assert part in err["message"], f"{part!r} not in {err['message']!r}"
        # a racer served without firing read a head the winner had already finished
        for r in late:
            assert r["effects"] == [] and r["values"] == winner["values"], ctx
        assert gate == 0 or not late, ctx
        assert final["next"] == [] and final["values"]["approved"] == f"v-{wid}", ctx
        late_dups = sum(is_late_duplicate(lo["error"]) for lo in losers)
        evs = audit_until(jsproxy, thread, lambda e: len(ops(e, "claim_refused"))
                          + len(ops(e, "late_duplicate")) >= len(losers)
                          and ops(e, "claim_consumed"))
        taken = ops(evs, "claim_taken")
        assert [e["application_name"] for e in taken] == [f"racer-{wid}"], ctx
        assert len(ops(evs, "claim_consumed")) == 1, ctx
        assert len(ops(evs, "claim_refused")) == len(losers) - late_dups, ctx
        assert len(ops(evs, "late_duplicate")) == late_dups, ctx
        tally.add(winner, losers, late, len(ops(evs, "claim_waited")))
    record(tally.row(f"js-n{n}", via, gate))


# --------------------------------------------------------------------------- late duplicate
@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_late_duplicate_bare_is_served_inert(dsns, jsproxy, via):
    """A second bare resume after the first one finished the thread. LangGraph JS
    records no `updated_channels` in its checkpoints, so the proxy cannot tell its
    finished head from one with tasks left to run (docs/late-duplicates.md): the
    late resume is not refused as a late duplicate, and is served the finished state
    as stock is; the gate does not run again either way."""
    thread = tid("jl")
    lg("park", "--dsn", dsns[via], "--thread", thread)
    first = lg("resume", "--dsn", f"{dsns[via]}&application_name=js-first", "--thread", thread,
               "--id", "first")
    assert first["ok"] and first["effects"] == ["v-first"], first
    late = lg("resume", "--dsn", f"{dsns[via]}&application_name=js-late", "--thread", thread,
              "--id", "late")
    assert late["effects"] == [], late
    assert late["ok"] and late["values"]["approved"] == "v-first", late
    final = lg("state", "--dsn", dsns["direct"], "--thread", thread)
    assert final["next"] == [] and final["values"]["approved"] == "v-first", final
    if via == "proxy":
        evs = audit_until(jsproxy, thread, lambda e: ops(e, "claim_consumed"))
        assert not ops(evs, "late_duplicate"), evs


# --------------------------------------------------------------------------- fork
@pytest.fixture(scope="module")
def fork_run(dsns):
    """fork_run(via, form) -> lg.mjs fork's result (and the thread, as ``thread``),
    run once per module."""
    cache: dict = {}

    def run(via: str, form: str) -> dict:
        if (via, form) not in cache:
            thread = tid(f"jf-{form}")
            cache[(via, form)] = {**lg("fork", "--dsn", dsns[via], "--thread", thread,
                                       "--form", form), "thread": thread}
        return cache[(via, form)]
    return run


@pytest.mark.parametrize("via", ["direct", "proxy"])
@pytest.mark.parametrize("form", ["bare", "map"])
def test_fork_is_served_its_own_value(fork_run, via, form):
    """A resume addressed to the interrupt checkpoint C with a new answer. Stock: the
    gate re-fires with branch A's stale true. Proxy: it fires with the fork's false,
    the fork's run returns false and ends on its own checkpoint, a child of C; A's
    final checkpoint still says true."""
    res = fork_run(via, form)
    assert res["parked_interrupts"] == [{"question": "approve?"}]
    assert res["c_next"] == ["gate"]
    assert res["a_result"] == TRUE_FINAL and res["a_effects"] == [True]
    fork = res["fork"]
    if via == "direct":
        assert res["effects"] == [True, True], res
        assert fork["result"] == TRUE_FINAL and fork["final_values"] == TRUE_FINAL, res
        return
    assert res["effects"] == [True, False], res
    assert fork["effects"] == [False] and fork["interrupts"] == []
    assert fork["result"] == FALSE_FINAL, fork
    assert fork["final_next"] == [] and fork["final_id"] != res["a_final_id"]
    assert res["a_final_by_id"] == TRUE_FINAL
    kids = [h for h in res["history"] if h["parent_checkpoint_id"] == res["c_id"]]
    assert len(kids) == 2 and res["history"][0]["checkpoint_id"] == fork["final_id"], res["history"]


@pytest.mark.parametrize("via", via_params(JS_INTEGER_VERSIONS))
@pytest.mark.parametrize("form", ["bare", "map"])
def test_fork_branch_stores_what_it_ran(fork_run, via, form):
    """The fork's head holds the values its run returned. Stock holds trivially (the
    fork re-ran A's answer). Through the proxy the fork ran with false, but the JS
    saver numbers channel versions 1, 2, 3… per thread, not per branch: the fork's
    blobs have the keys of A's and `ON CONFLICT DO NOTHING` drops them, so its
    checkpoints read A's true."""
    fork = fork_run(via, form)["fork"]
    assert fork["final_values"] == fork["result"], fork


@pytest.mark.parametrize("form", ["bare", "map"])
def test_a_fork_branch_whose_blobs_were_not_written_is_audited(fork_run, jsproxy, form):
    """The drop of the test above, said through the proxy: each of the fork's blobs
    the server kept A's in place of (`INSERT 0 0`) is audited `blob_put` with
    `detail.written = false`, for the channels whose value the fork changed; A's own
    blobs were written."""
    res = fork_run("proxy", form)
    evs = audit_until(jsproxy, res["thread"], lambda e: any(
        b["detail"].get("written") is False for b in ops(e, "blob_put")))
    kept = [b for b in ops(evs, "blob_put") if b["detail"].get("written") is False]
    assert kept, evs
    assert {"approved"} <= {c for b in kept for c in b["channels"]}, kept
    first = [b for b in ops(evs, "blob_put") if b["detail"].get("written") is not False]
    assert first, "A's blobs were written"


# --------------------------------------------------------------------------- validity
def items_rows(dsn: str, thread: str, channel: str) -> dict[str, list]:
    """The channel's stored values (JSON blobs), by table."""
    with psycopg.connect(dsn, autocommit=True) as c:
        blobs = c.execute("select blob from checkpoint_blobs where thread_id = %s and channel = %s "
                          "and type = 'json'", (thread, channel)).fetchall()
        writes = c.execute("select blob from checkpoint_writes where thread_id = %s and channel = %s",
                           (thread, channel)).fetchall()
        dangling = c.execute(
            "select cp.checkpoint_id from checkpoints cp, jsonb_each_text(cp.checkpoint -> 'channel_versions') v "
            "where cp.thread_id = %s and v.key = %s and not exists (select 1 from checkpoint_blobs b "
            "where b.thread_id = cp.thread_id and b.checkpoint_ns = cp.checkpoint_ns "
            "and b.channel = v.key and b.version = v.value)", (thread, channel)).fetchall()
    return {"blobs": [json.loads(bytes(b)) for (b,) in blobs],
            "writes": [json.loads(bytes(b)) for (b,) in writes],
            "dangling": [d for (d,) in dangling]}


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_invalid_append_is_rejected_before_it_is_durable(dsns, via):
    """Appending null to ``items: string[]``. Stock: persisted and carried along.
    Proxy: the write fails with 23514 naming the channel and thread, nothing of the
    task is durable (not its other write either), the thread stays readable and
    continues with valid input."""
    thread = tid(f"jv-{via}")
    res = lg("invalid", "--dsn", dsns[via], "--thread", thread)
    assert res["first"]["ok"] and res["first"]["values"]["items"] == ["a"], res
    rows = items_rows(dsns["direct"], thread, "items")
    notes = items_rows(dsns["direct"], thread, "note")
    if via == "direct":
        assert res["bad"]["ok"] and res["bad"]["values"]["items"] == ["a", None], res
        assert res["last"]["values"]["items"] == ["a", None, "b"], res
        assert [None] in rows["writes"] and ["a", None] in rows["blobs"], rows
        assert "appended null" in notes["writes"], notes
        return
    err = res["bad"]["error"]
    assert not res["bad"]["ok"] and err["code"] == CHECK_VIOLATION, res
    assert 'channel "items"' in err["message"] and f'thread "{thread}"' in err["message"], err
    assert all(None not in v for v in rows["writes"] + rows["blobs"]), rows
    assert "appended null" not in notes["writes"] + notes["blobs"], notes
    assert rows["dangling"] == [], rows
    assert res["state_after_bad"]["ok"] and res["state_after_bad"]["values"]["items"] == ["a"], res
    assert res["last"]["ok"] and res["last"]["values"]["items"] == ["a", "b"], res


# --------------------------------------------------------------------------- end()
@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_end_emits_no_error(dsns, via):
    """50 x open, one query, end() for a pg.Pool, a pg.Client and the saver's own
    pool: node-postgres emits no `error` event (a process without a listener would
    die of it)."""
    procs = {mode: subprocess.Popen([NODE, str(LG), "pool-end", "--dsn", dsns[via], "--mode", mode,
                                     "--count", "50"], cwd=JS_DIR, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("pool", "client", "saver")}
    outs = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, f"pool-end {mode} exited {p.returncode}:\n{stderr[-3000:]}"
        outs[mode] = json.loads(stdout.strip().splitlines()[-1])
    counts = {m: o["error_events"] + len(o.get("unhandled", [])) for m, o in outs.items()}
    print(f"RESULT js end() {via}: error events {counts}")
    assert counts == {"pool": 0, "client": 0, "saver": 0}, json.dumps(outs, indent=1)[:4000]
