"""LangGraph PostgresSaver through the proxy: same observable behaviour as direct,
and an audit trail showing the interrupt being parked and then resumed."""

from __future__ import annotations

import copy
import json
import time
import uuid

import pytest

import lg_scenarios as L
from conftest import connect

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core

EXPECTED_INTERRUPT = {"question": "approve?", "items": ["prep"]}
PARKED_VALUES = {"items": ["prep"], "count": 1, "name": "rg", "approved": None}
FINAL_VALUES = {"items": ["prep", "gate:True", "after"], "count": 2, "name": "rg", "approved": True}
HISTORY_NEXT = [[], ["after"], ["gate"], ["prep"], ["__start__"]]
HISTORY_STEPS = [3, 2, 1, 0, -1]

READ_OPS = {"read_latest", "read_by_id", "read_list"}
EVENT_FIELDS = {"time", "session_id", "client_addr", "user", "database", "application_name",
                "operation", "thread_id", "checkpoint_ns", "checkpoint_id",
                "parent_checkpoint_id", "task_id", "channels", "blob_sha256", "detail"}


@pytest.fixture(scope="module")
def lg_dbs(pg):
    """Two fresh databases, so setup() runs its full migration both direct and proxied."""
    names = {via: f"rg_lg_{via}_{uuid.uuid4().hex[:8]}" for via in ("direct", "proxy")}
    with connect(pg.dsn("postgres")) as c:
        for n in names.values():
            c.execute(f'CREATE DATABASE "{n}"')
    yield names
    with connect(pg.dsn("postgres")) as c:
        for n in names.values():
            c.execute(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)')


@pytest.fixture(scope="module")
def run_scenario(pg, proxy, lg_dbs):
    """run_scenario(kind, via) -> cached result of lg_scenarios.full_scenario."""
    cache: dict = {}

    def run(kind: str, via: str) -> dict:
        if (kind, via) not in cache:
            dsn = pg.dsn(lg_dbs[via]) if via == "direct" else proxy.dsn(lg_dbs[via])
            thread = f"lg-{kind}-{via}-{uuid.uuid4().hex[:8]}"
            started = time.monotonic()
            try:
                res = L.full_scenario(kind, dsn, thread, inspect_dsn=pg.dsn(lg_dbs[via]))
            except Exception as e:  # keep the failure, do not re-run it for every test
                res = {"error": e}
            res["elapsed"] = time.monotonic() - started
            cache[(kind, via)] = res
        res = cache[(kind, via)]
        if "error" in res:
            raise AssertionError(f"scenario {kind} via {via} raised "
                                 f"{type(res['error']).__name__}: {res['error']}") from res["error"]
        return res

    return run


def comparable(obs: dict) -> dict:
    obs = copy.deepcopy(obs)
    obs.pop("thread_id", None)
    obs.pop("saver", None)
    return obs


@pytest.mark.parametrize("kind", L.ALL_SAVER_KINDS)
def test_direct_scenario_behaves_as_expected(run_scenario, kind):
    """Baseline: the scenario itself, straight to PostgreSQL (no proxy)."""
    obs = run_scenario(kind, "direct")["observables"]
    assert obs["park_result"] == {**PARKED_VALUES, "__interrupt__": [EXPECTED_INTERRUPT]}
    assert obs["parked_state"]["next"] == ["gate"]
    assert obs["parked_state"]["values"] == PARKED_VALUES
    assert obs["parked_state"]["interrupts"] == [EXPECTED_INTERRUPT]
    assert obs["final_result"] == FINAL_VALUES
    assert obs["final_state"]["next"] == []
    assert obs["final_state"]["values"] == FINAL_VALUES
    assert [h["next"] for h in obs["history"]] == HISTORY_NEXT
    assert [h["step"] for h in obs["history"]] == HISTORY_STEPS
    assert obs["history"][0]["values"] == FINAL_VALUES
    assert obs["history"][2]["interrupts"] == [EXPECTED_INTERRUPT]
    assert all(v > 0 for v in obs["rows_before_delete"].values()), obs["rows_before_delete"]
    assert obs["after_delete"] == {"values": {}, "next": []}
    assert obs["history_after_delete"] == 0
    assert obs["rows_after_delete"] == {t: 0 for t in L.CHECKPOINT_TABLES}


@pytest.mark.parametrize("kind", L.ALL_SAVER_KINDS)
def test_proxy_matches_direct(run_scenario, kind):
    """Identical observable results through the proxy (ids and timestamps excluded)."""
    direct = comparable(run_scenario(kind, "direct")["observables"])
    proxied = comparable(run_scenario(kind, "proxy")["observables"])
    # field by field first, for a readable failure
    for key in direct:
        assert proxied.get(key) == direct[key], f"{key!r} differs through the proxy"
    assert proxied == direct
    # and the proxied run is not pathologically slow (a stall would show here)
    assert run_scenario(kind, "proxy")["elapsed"] < 30


def _wait_for_ops(proxy, thread_id: str, needed: set[str], timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    events: list[dict] = []
    while True:
        events = proxy.audit(thread_id)
        if needed <= {e.get("operation") for e in events} or time.monotonic() > deadline:
            return events
        time.sleep(0.25)


@pytest.mark.parametrize("kind", L.ALL_SAVER_KINDS)
def test_audit_timeline(run_scenario, proxy, kind):
    res = run_scenario(kind, "proxy")
    thread_id = res["observables"]["thread_id"]
    parked_cp = res["ids"]["parked_checkpoint_id"]
    needed = {"checkpoint_put", "blob_put", "writes_put", "interrupt_parked", "resume_recorded",
              "delete_thread"}
    events = _wait_for_ops(proxy, thread_id, needed)
    ops = [e.get("operation") for e in events]
    summary = "\n".join(f"  {e.get('operation')} cp={e.get('checkpoint_id')} task={e.get('task_id')} "
                        f"ch={e.get('channels')}" for e in events)
    assert events, f"audit shows no events for thread {thread_id}"
    for e in events:
        missing = EVENT_FIELDS - set(e)
        assert not missing, f"event lacks fields {sorted(missing)}: {e}"
        assert e["thread_id"] == thread_id, f"event for another thread in --thread output: {e}"
    assert READ_OPS & set(ops), f"no checkpoint read recorded:\n{summary}"
    missing_ops = needed - set(ops)
    assert not missing_ops, f"missing operations {sorted(missing_ops)} in timeline:\n{summary}"
    parked_i = ops.index("interrupt_parked")
    resumed_i = ops.index("resume_recorded")
    assert parked_i < resumed_i, f"interrupt_parked must precede resume_recorded:\n{summary}"
    assert ops.index(next(o for o in ops if o in READ_OPS)) < parked_i, summary
    assert ops.index("checkpoint_put") < parked_i, summary
    assert len(ops) - 1 - ops[::-1].index("delete_thread") > resumed_i, summary
    # both interrupt events are about the parked checkpoint C
    assert events[parked_i]["checkpoint_id"] == parked_cp, summary
    assert events[resumed_i]["checkpoint_id"] == parked_cp, summary
    # the audit session metadata is filled in
    assert events[parked_i]["user"] == "postgres"
    assert events[parked_i]["database"].startswith("rg_lg_proxy_")


def test_audit_jsonl_mirrors_audit_db(run_scenario, proxy):
    """--audit-jsonl: one JSON object per line, the same events as the audit db."""
    res = run_scenario("conn", "proxy")
    thread_id = res["observables"]["thread_id"]
    from_db = _wait_for_ops(proxy, thread_id, {"delete_thread"})
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in proxy.audit_jsonl.read_text().splitlines() if line.strip()]
        events = [json.loads(line) for line in lines]
        mine = [e for e in events if e.get("thread_id") == thread_id]
        if len(mine) >= len(from_db) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for e in events:
        assert isinstance(e, dict) and not (EVENT_FIELDS - set(e)), e
    assert sorted(e["operation"] for e in mine) == sorted(e["operation"] for e in from_db)
    # events without a thread (setup()'s migrations) are in the file too
    assert any(e["operation"] == "migration" for e in events)
