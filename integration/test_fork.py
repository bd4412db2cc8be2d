"""Fork-intent filter (LangGraph #6663), end to end with real
LangGraph savers, each next to its stock differential in the same test: the
scenario runs against PostgreSQL directly (the defect shows) and then through
the proxy (the repair shows). Gated side effects are counted in an in-process
ledger the node appends to, outside the checkpoint tables.

Graph (lg_enforce.build_gate_graph): ``prep -> gate(interrupt) -> after``. C is
the checkpoint parked at ``gate``; branch A resumes it with True and completes;
a fork re-invokes with ``Command(resume=False)`` (bare) or
``Command(resume={interrupt_id: False})`` (map) addressed to C's checkpoint_id.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from langgraph.types import Command

import lg_enforce as E
import pgraw

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core

TRUE_FINAL = {"items": ["prep", "gate:True", "after"], "approved": True}
FALSE_FINAL = {"items": ["prep", "gate:False", "after"], "approved": False}
FORMS = ("bare", "map")


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    E.setup_db(direct_dsn)


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def timed(fn, *args, **kw):
    started = time.monotonic()
    out = fn(*args, **kw)
    return out, time.monotonic() - started


def audit_events(proxy, thread_id: str, want=lambda evs: True, timeout: float = 10.0) -> list[dict]:
    """The thread's audit events once ``want(events)`` holds and the trail has
    settled (same length on two polls 0.3 s apart), so that the absence of an
    event is meaningful; bounded poll: the audit sink writes asynchronously."""
    deadline = time.monotonic() + timeout
    previous = -1
    while True:
        events = proxy.audit(thread_id)
        if (want(events) and len(events) == previous) or time.monotonic() > deadline:
            return events
        previous = len(events)
        time.sleep(0.3)


def forks_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("operation") == "fork_served"]


def children(history: list[dict], parent_id: str) -> list[dict]:
    return [h for h in history if h["parent"] == parent_id]


def check_branch_a(res: dict) -> None:
    """Branch A (resume True at the ordinary address) is the same either way."""
    assert res["parked_interrupts"] == [{"question": "approve?"}]
    assert res["c_next"] == ["gate"]
    assert res["a_result"] == TRUE_FINAL
    assert res["a_ledger"] == [True]
    assert res["a_final_values"] == TRUE_FINAL


# --------------------------------------------------------------------------- 1. bare and map forms
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", E.SAVER_KINDS)
def test_fork_is_served_its_own_value(direct_dsn, proxy_dsn, kind, form):
    # stock: the fork re-runs the gate with A's stale True and reports True
    stock, _ = timed(E.fork_scenario, kind, direct_dsn, tid(f"fk-{kind}-{form}-d"), form)
    check_branch_a(stock)
    assert stock["ledger"] == [True, True], "stock defect (#6663) not reproduced: the fork " \
        f"should re-fire the gate with the stale True, ledger={stock['ledger']}"
    assert stock["forks"][0]["result"] == TRUE_FINAL
    assert stock["forks"][0]["final_values"] == TRUE_FINAL

    # proxy: A fired once with True and ends True; B fires once with False and ends False
    res, elapsed = timed(E.fork_scenario, kind, proxy_dsn, tid(f"fk-{kind}-{form}-p"), form)
    check_branch_a(res)
    fork = res["forks"][0]
    assert res["ledger"] == [True, False], f"effects through the proxy: {res['ledger']}"
    assert fork["effects"] == [False]
    assert fork["interrupts"] == []
    assert fork["result"] == FALSE_FINAL
    assert fork["final_values"] == FALSE_FINAL
    assert fork["final_next"] == []
    assert fork["final_id"] != res["a_final_id"], "the fork must end on a new checkpoint"
    # A's final checkpoint, found in the history, still says True; so does a read by its id
    by_id = {h["id"]: h for h in res["history"]}
    assert res["a_final_id"] in by_id, "A's final checkpoint is missing from get_state_history"
    assert by_id[res["a_final_id"]]["values"] == TRUE_FINAL
    assert res["a_final_by_id"] == TRUE_FINAL
    # B is a branch from C: C has two children (A's and B's first checkpoints)
    kids = children(res["history"], res["c_id"])
    assert len(kids) == 2, f"C should have the two branches as children: {kids}"
    assert sorted(k["values"]["approved"] for k in kids) == [False, True]
    assert res["history"][0]["id"] == fork["final_id"], "B's final checkpoint is the head"
    assert elapsed < 30, f"proxied fork scenario took {elapsed:.1f}s"


# --------------------------------------------------------------------------- 2. re-fork
@pytest.mark.parametrize("form", FORMS)
def test_refork_with_same_value_is_deterministic(direct_dsn, proxy_dsn, form):
    n = 3
    stock = E.fork_scenario("conn", direct_dsn, tid(f"rf-{form}-d"), form, forks=n)
    check_branch_a(stock)
    assert stock["ledger"] == [True] * (1 + n), f"stock re-forks re-fire True: {stock['ledger']}"
    assert all(f["final_values"] == TRUE_FINAL for f in stock["forks"])

    res = E.fork_scenario("conn", proxy_dsn, tid(f"rf-{form}-p"), form, forks=n)
    check_branch_a(res)
    # one more effect per fork, always False; every fork ends the same way
    assert res["ledger"] == [True] + [False] * n, res["ledger"]
    for i, f in enumerate(res["forks"]):
        assert f["effects"] == [False], f"fork {i}: {f['effects']}"
        assert f["result"] == FALSE_FINAL, f"fork {i}: {f['result']}"
        assert f["final_values"] == FALSE_FINAL, f"fork {i}: {f['final_values']}"
    # each fork is a new branch from C: distinct final checkpoints, C has 1 + n children
    finals = [f["final_id"] for f in res["forks"]]
    assert len(set(finals + [res["a_final_id"]])) == n + 1, finals
    kids = children(res["history"], res["c_id"])
    assert len(kids) == 1 + n, f"C's children: {kids}"
    by_id = {h["id"]: h for h in res["history"]}
    assert by_id[res["a_final_id"]]["values"] == TRUE_FINAL
    for fid in finals:
        assert by_id[fid]["values"] == FALSE_FINAL


# --------------------------------------------------------------------------- 3. two interrupts, head by id
@pytest.mark.parametrize("kind", E.SAVER_KINDS)
def test_two_interrupts_resumed_at_head_by_id(direct_dsn, proxy_dsn, proxy, kind):
    stock = E.two_interrupt_scenario(kind, direct_dsn, tid(f"ti-{kind}-d"))
    thread = tid(f"ti-{kind}-p")
    res = E.two_interrupt_scenario(kind, proxy_dsn, thread)
    for r in (stock, res):
        assert r["park"] == ["first?"]
        assert r["steps"][0]["interrupts"] == ["second?"], r["steps"][0]
        assert r["steps"][1]["interrupts"] == [], r["steps"][1]
        assert r["steps"][1]["result"] == {"answers": ["one", "two"]}
        assert r["values"] == {"answers": ["one", "two"]}
        assert r["next"] == []
        assert r["ledger"] == [("one", "two")]
    strip = lambda r: {**r, "steps": [{k: v for k, v in s.items() if k != "addressed_head"}
                                      for s in r["steps"]]}
    assert strip(res) == strip(stock), "two-interrupt run differs from stock"
    # both answers were addressed to the head (the node interrupts twice on one checkpoint)
    assert res["steps"][0]["addressed_head"] == res["steps"][1]["addressed_head"]
    # a read of the head by id is not a fork
    events = audit_events(proxy, thread, lambda evs: any(e["operation"] == "read_by_id" for e in evs))
    assert any(e["operation"] == "read_by_id" for e in events), \
        f"expected the head-by-id reads in the audit: {[e['operation'] for e in events]}"
    assert forks_of(events) == [], f"head-by-id reads were audited as forks: {forks_of(events)}"


# --------------------------------------------------------------------------- 4. stray resume
@pytest.mark.parametrize("form", FORMS)
def test_stray_resume_after_completion_is_inert(direct_dsn, proxy_dsn, proxy, form):
    """A stray resume after the thread completed runs nothing. Stock serves it the
    finished state in silence, both forms. Through the proxy the bare form's run-level
    __resume__ write onto the finished head is refused 55000 (a late duplicate, naming
    the first answer) and audited late_duplicate; the map form writes no such thing and
    its read of the finished head is a get_state's: served, inert, as stock."""
    stock = E.stray_resume_scenario("conn", direct_dsn, tid(f"st-{form}-d"), form)
    thread = tid(f"st-{form}-p")
    res = E.stray_resume_scenario("conn", proxy_dsn, thread, form)
    for r in (stock, res):
        assert r["completed"] == TRUE_FINAL
        assert r["stray_effects"] == [], r
        assert r["ledger"] == [True]
        assert r["values_after"] == r["values_before"] == TRUE_FINAL
        assert r["next_after"] == []
        assert r["head_unchanged"]
        assert r["history_len_after"] == r["history_len_before"]
    assert stock["stray_error"] is None and stock["stray_result"] == TRUE_FINAL, stock
    events = audit_events(proxy, thread)
    assert forks_of(events) == [], forks_of(events)
    late = [e for e in events if e["operation"] == "late_duplicate"]
    if form == "map":
        assert res == stock
        assert late == [], late
        return
    err = res["stray_error"]
    assert err and err["sqlstate"] == "55000", res
    assert err["message"].startswith("resumeguard: late duplicate resume: interrupt "), err
    assert "and nothing was run" in err["message"], err
    assert res["stray_result"] is None
    assert len(late) == 1, [e["operation"] for e in events]
    # the stray's answer was never recorded: one run-level answer, the first one
    run_level = [e for e in events if e["operation"] == "resume_recorded"
                 and e["task_id"] == "00000000-0000-0000-0000-000000000000"]
    assert len(run_level) == 1, run_level


# --------------------------------------------------------------------------- 5. subgraphs
@pytest.mark.parametrize("variant", ("inherit", "own"))
@pytest.mark.parametrize("kind", ("conn", "async"))
def test_subgraph_interrupt_resume_is_stock_identical(direct_dsn, proxy_dsn, proxy,
                                                      kind, variant):
    stock_thread = tid(f"sg-{kind}-{variant}-d")
    thread = tid(f"sg-{kind}-{variant}-p")
    stock = E.subgraph_scenario(kind, direct_dsn, stock_thread, variant)
    res = E.subgraph_scenario(kind, proxy_dsn, thread, variant)
    # the second (stray) resume: stock serves it the finished state; through the proxy
    # a bare resume onto the finished root head is refused as a late duplicate where
    # the session read that head itself (docs/late-duplicates.md)
    stray = res.pop("stray_result")
    assert stray in (stock.pop("stray_result"), {"refused": "55000", "late_duplicate": True}), stray
    assert res == stock, "subgraph run differs from stock"
    assert res["park_interrupts"] == [{"question": "sub approve?"}]
    assert res["final_values"]["approved"] is True
    assert res["final_next"] == []
    assert res["ledger"] == [True], "the subgraph gate must fire exactly once"
    # the scenario exercises the namespace it claims to
    for t in (stock_thread, thread):
        ns = E.namespaces(direct_dsn, t)
        sub = [n for n in ns if n]
        if variant == "inherit":
            assert len(sub) == 1 and sub[0].startswith("sub:") and len(sub[0]) > 4, ns
        else:
            assert sub == ["sub"], ns
        assert "" in ns
    events = audit_events(proxy, thread)
    assert forks_of(events) == [], forks_of(events)


# --------------------------------------------------------------------------- 6. audit trail
def test_audit_fork_served_for_fork_only(direct_dsn, proxy_dsn, proxy):
    # an ordinary park + resume: no fork
    plain = tid("au-plain")
    r = E.ordinary_resume_scenario("conn", proxy_dsn, plain)
    assert r["values"] == TRUE_FINAL and r["ledger"] == [True]
    plain_events = audit_events(proxy, plain, lambda evs: any(
        e["operation"] == "resume_recorded" for e in evs))
    assert "resume_recorded" in {e["operation"] for e in plain_events}, \
        [e["operation"] for e in plain_events]
    assert forks_of(plain_events) == [], forks_of(plain_events)

    # a fork at C after A completed: exactly one fork_served, addressed to C
    thread = tid("au-fork")
    res = E.fork_scenario("conn", proxy_dsn, thread, "bare", read_a_by_id=False)
    assert res["ledger"] == [True, False]
    events = audit_events(proxy, thread, lambda evs: bool(forks_of(evs)))
    forks = forks_of(events)
    summary = "\n".join(f"  {e['operation']} cp={e.get('checkpoint_id')} detail={e.get('detail')}"
                        for e in events)
    assert len(forks) == 1, f"expected one fork_served event:\n{summary}"
    ev = forks[0]
    assert ev["thread_id"] == thread
    assert ev["checkpoint_ns"] == ""
    assert ev["checkpoint_id"] == res["c_id"], summary
    detail = ev["detail"]
    assert detail["head"] == res["a_final_id"], f"head at the time of the fork: {detail}"
    hidden = detail["hidden"]
    assert all(h["channel"] == "__resume__" for h in hidden), hidden
    tasks = {h["task_id"] for h in hidden}
    # A's bare-form resume left a run-level (null task) and a task-level __resume__ on C
    assert E.NULL_TASK in tasks, hidden
    assert len(tasks - {E.NULL_TASK}) == 1, hidden
    assert len(hidden) == 2, hidden
    assert set(ev["channels"]) == {"__resume__"}, ev["channels"]
    # the fork event comes after A's resume was recorded, and no fork before it
    ops = [e["operation"] for e in events]
    assert ops.index("resume_recorded") < ops.index("fork_served"), summary


# --------------------------------------------------------------------------- rows that do not decode
def fork_from_sjis(dsn: str, thread_id: str) -> dict:
    """Park at C and resume it with True in UTF-8, then fork at C with False from a
    session whose client_encoding is SJIS. The ledger, and what the fork got: its
    result, or the SQLSTATE it was refused with (and the error's message, read in
    SJIS, as ``said``)."""
    ledger: list = []
    with E.Driver("conn", dsn) as d:
        graph = E.build_gate_graph(d.saver, ledger)
        d.invoke(graph, {"items": [], "approved": None}, E.cfg_of(thread_id))
        c_id = E.cp_id(d.get_state(graph, E.cfg_of(thread_id)))
        d.invoke(graph, Command(resume=True), E.cfg_of(thread_id))
    with E.Driver("conn", dsn + "&options=-c%20client_encoding%3DSJIS") as f:
        graph = E.build_gate_graph(f.saver, ledger)
        try:
            fork = E.strip_interrupts(f.invoke(graph, Command(resume=False),
                                               E.cfg_of(thread_id, c_id)))
        except psycopg.Error as e:
            return {"ledger": ledger, "fork": e.sqlstate, "said": e.diag.message_primary}
    return {"ledger": ledger, "fork": fork}


def test_a_fork_whose_row_does_not_decode_is_refused(direct_dsn, dbname, proxy_factory):
    """A fork read by id from a session in SJIS, of a thread named with 表 (0x95 0x5C
    in SJIS, not UTF-8): the proxy cannot find the answer to hide in a row that does
    not decode. Stock: the fork is served the first answer and re-fires the gate with
    it. Proxy (consume-once off, so that no head read is refused first): refused
    0A000 before any node ran, its error naming the thread as the client sent it,
    audited statement_refused."""
    stock = fork_from_sjis(direct_dsn, tid("表-fk-d"))
    assert stock == {"ledger": [True, True], "fork": TRUE_FINAL}, stock
    proxy = proxy_factory(name="fork-only", env={"RESUMEGUARD_ENFORCE_CONSUME_ONCE": "false"})
    thread = tid("表-fk-p")
    res = fork_from_sjis(proxy.dsn(dbname), thread)
    assert res["ledger"] == [True] and res["fork"] == "0A000", res
    assert f'thread "{thread}"' in res["said"], res
    # Audited under the thread as the proxy read it: each byte outside UTF-8
    # as U+F700 plus the byte.
    as_read = "".join(chr(0xF700 + b) if b >= 0x80 else chr(b) for b in thread.encode("shift_jis"))
    refused = lambda evs: [e for e in evs if e["operation"] == "statement_refused"]  # noqa: E731
    events = audit_events(proxy, as_read, lambda evs: refused(evs))
    assert [e["detail"]["refusal"] for e in refused(events)] == ["undecodable_row"], events


def test_what_is_pipelined_past_a_refused_fork_read_fails_with_its_block(
        direct_dsn, dbname, pg, proxy_factory):
    """The fork read of the test above sent raw from an SJIS session in a transaction
    block, with an INSERT and a COMMIT pipelined past the read's Sync before any
    answer, through a proxy with consume-once off (its sessions stay on the event
    loop): the read is refused 0A000, the INSERT fails 25P02 and the COMMIT rolls
    back, nothing kept. Straight to PostgreSQL the read is served and the INSERT
    committed."""
    from langgraph.checkpoint.postgres.base import BasePostgresSaver
    from test_consume_once import past_a_reads_sync_in_a_block
    thread = tid("表-fk-past")
    with E.Driver("conn", direct_dsn) as d:
        graph = E.build_gate_graph(d.saver, [])
        d.invoke(graph, {"items": [], "approved": None}, E.cfg_of(thread))
        c_id = E.cp_id(d.get_state(graph, E.cfg_of(thread)))
    sql = (BasePostgresSaver.SELECT_SQL
           + "WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3")
    by_id = (pgraw.parse("", sql) + pgraw.bind("", "", [thread.encode("shift_jis"), b"",
                                                         c_id.encode()])
             + pgraw.describe_portal() + pgraw.execute())
    stock = past_a_reads_sync_in_a_block(direct_dsn, dbname, pg.port, by_id,
                                         client_encoding="SJIS")
    assert stock == ([["1", "2", "T", "D", "C SELECT 1", "Z T"], ["C INSERT 0 1", "Z T"],
                      ["C COMMIT", "Z I"]], 1), stock
    proxy = proxy_factory(name="fork-only-past",
                          env={"RESUMEGUARD_ENFORCE_CONSUME_ONCE": "false"})
    refused = past_a_reads_sync_in_a_block(direct_dsn, dbname, proxy.port, by_id,
                                           client_encoding="SJIS")
    assert refused == ([["1", "2", "T", "E 0A000", "Z E"], ["E 25P02", "Z E"],
                        ["C ROLLBACK", "Z I"]], 0), refused
