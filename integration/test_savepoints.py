"""What a transaction's savepoints keep of the checkpoint writes in it, with real
LangGraph 3.2.0 (psycopg's nested ``conn.transaction()`` blocks are savepoints)
through the proxy:

* a resume committed in a transaction in which a later block failed and rolled
  back to its savepoint: PostgreSQL keeps the resume, so the proxy acts on it
  (the claim is consumed, the parked checkpoint moved on, the answer audited);
* a resume inside a block rolled back to its savepoint, in a transaction that
  commits: PostgreSQL keeps none of it, and neither does the proxy.

Straight to PostgreSQL the same scenarios show what the database kept, which is
what the proxy's claims and trail must follow (PostgreSQL itself keeps no claims).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

import lg_scenarios
from test_fork import audit_events
from test_saver_housekeeping import admin, claims_until, proxy  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def setup(dbname, direct_dsn):
    lg_scenarios.setup_db("conn", direct_dsn)


def resume_in_transaction(dsn: str, thread: str, *, undo_resume: bool) -> dict:
    """Resumes the parked thread inside one transaction. ``undo_resume``: the
    resume runs in a nested block rolled back to its savepoint; otherwise a
    later nested block fails and rolls back to its own. The transaction
    commits either way."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        graph = lg_scenarios.build_graph(PostgresSaver(conn))
        cfg = lg_scenarios.thread_config(thread)
        with conn.transaction():
            if undo_resume:
                with conn.transaction():
                    result = graph.invoke(Command(resume=True), cfg)
                    raise psycopg.Rollback()
            else:
                result = graph.invoke(Command(resume=True), cfg)
                with pytest.raises(psycopg.errors.DivisionByZero):
                    with conn.transaction():
                        conn.execute("SELECT 1/0")
    return result


def head_next(dsn: str, thread: str) -> tuple:
    with psycopg.connect(dsn, autocommit=True) as conn:
        graph = lg_scenarios.build_graph(PostgresSaver(conn))
        return graph.get_state(lg_scenarios.thread_config(thread)).next


def parked(dsn: str, prefix: str) -> str:
    thread = f"{prefix}-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", dsn, thread)
    return thread


def operations(proxy, thread: str, want=lambda evs: True) -> list[str]:
    return [e["operation"] for e in audit_events(proxy, thread, want)]


@pytest.mark.parametrize("target", ["direct", "proxy"])
def test_a_resume_before_a_rolled_back_savepoint_commits(target, proxy, admin, dbname,
                                                          direct_dsn, setup):
    dsn = direct_dsn if target == "direct" else proxy.dsn(dbname)
    thread = parked(dsn, "sp-kept")
    if target == "proxy":
        [claim] = claims_until(admin, thread, bool)
        parked_id = claim["checkpoint_id"]
    result = resume_in_transaction(dsn, thread, undo_resume=False)
    assert result["approved"] is True, result
    # PostgreSQL kept the resume: the thread ran past the gate.
    assert head_next(direct_dsn, thread) == ()
    if target == "direct":
        return
    [claim] = claims_until(admin, thread, lambda c: c and c[0]["superseded_at"])
    assert claim["checkpoint_id"] == parked_id, claim
    assert claim["state"] == "consumed" and claim["superseded_at"] is not None, claim
    ops = operations(proxy, thread, lambda evs: any(
        e["operation"] == "resume_recorded" for e in evs))
    assert "resume_recorded" in ops, ops


@pytest.mark.parametrize("target", ["direct", "proxy"])
def test_a_resume_a_savepoint_rolled_back_is_not_acted_on(target, proxy, admin, dbname,
                                                          direct_dsn, setup):
    dsn = direct_dsn if target == "direct" else proxy.dsn(dbname)
    thread = parked(dsn, "sp-undone")
    resume_in_transaction(dsn, thread, undo_resume=True)
    # PostgreSQL kept none of it: the thread is still parked at the gate.
    assert head_next(direct_dsn, thread) == ("gate",)
    if target == "direct":
        return
    [claim] = claims_until(admin, thread, bool)
    assert claim["state"] != "consumed" and claim["superseded_at"] is None, claim
    ops = operations(proxy, thread)
    assert "resume_recorded" not in ops, ops
