"""What the savers' housekeeping statements tell the claims store, with real
LangGraph 3.2.0 through the proxy:

* ``prune(strategy="delete")`` deletes whole threads (``thread_id = ANY($1)``):
  the claims of every listed thread go with them, a thread not listed keeps its
  own.
* ``ShallowPostgresSaver.put`` keeps one checkpoint per namespace; its
  ``DELETE … checkpoint_id NOT IN (new, continued)`` names the checkpoint the put
  continues, so a resume's next checkpoint moves the parked one on
  (``superseded_at``), as a new checkpoint naming its parent does for the other
  savers.

No stock counterpart: PostgreSQL keeps no claims; what is compared is the
claims the proxy shows (``GET /claims``) before and after.
"""

from __future__ import annotations

import time
import uuid

import pytest
from langgraph.checkpoint.postgres import PostgresSaver, ShallowPostgresSaver
from langgraph.types import Command

import lg_scenarios
from conftest import connect
from test_admin import TOKEN, get_json


def claims_of(base: str, thread: str) -> list[dict]:
    status, claims = get_json(base, f"/claims?thread={thread}")
    assert status == 200, claims
    return claims


def claims_until(base: str, thread: str, want, timeout: float = 10.0) -> list[dict]:
    """The thread's claims, polled until ``want(claims)`` holds (evidence is applied
    off the data path) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        claims = claims_of(base, thread)
        if want(claims) or time.monotonic() > deadline:
            return claims
        time.sleep(0.1)


@pytest.fixture(scope="module")
def proxy(proxy_factory):
    """The suite's proxy with an admin token: ``GET /claims`` needs it."""
    return proxy_factory(env={"RESUMEGUARD_ADMIN_TOKEN": TOKEN})


@pytest.fixture(scope="module")
def admin(proxy) -> str:
    base = proxy.admin_url()
    assert base, proxy.describe()
    return base


def test_pruning_threads_forgets_their_claims_and_only_theirs(proxy, admin, dbname,
                                                              direct_dsn):
    lg_scenarios.setup_db("conn", direct_dsn)
    dsn = proxy.dsn(dbname)
    pruned, kept = (f"hk-prune-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for thread in (pruned, kept):
        lg_scenarios.park("conn", dsn, thread)  # its get_state read takes the claim
        assert claims_until(admin, thread, bool), f"no claim of {thread}"

    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.prune([pruned], strategy="delete")

    assert claims_until(admin, pruned, lambda c: not c) == []
    assert len(claims_of(admin, kept)) == 1
    with connect(direct_dsn) as c:
        rows = c.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s",
                         (pruned,)).fetchone()
    assert rows == (0,)


@pytest.fixture(scope="module")
def shallow_db(pg, dbname):
    """A database of the shallow saver's own: its tables have other keys than the
    full saver's."""
    name = f"{dbname}_shallow"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    with ShallowPostgresSaver.from_conn_string(pg.dsn(name)) as saver:
        saver.setup()
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def park_shallow(graph, thread: str):
    """Parks a new thread at the gate; the parked snapshot, or None when the stock
    shallow saver lost the interrupt write (it does so straight to PostgreSQL too,
    about 1 park in 10 here: its get_state then shows the gate with no interrupt,
    a head the proxy sees as not parked and claims nothing on; a claim it asked
    beside that read, having seen the interrupt written, is withdrawn off the
    data path, so it can show for a moment)."""
    cfg = lg_scenarios.thread_config(thread)
    graph.invoke(dict(lg_scenarios.INITIAL_INPUT), cfg)
    parked = graph.get_state(cfg)  # takes the claim
    assert parked.next == ("gate",), parked
    return parked if any(t.interrupts for t in parked.tasks) else None


def test_a_shallow_resume_moves_the_parked_checkpoint_on(proxy, admin, shallow_db):
    with ShallowPostgresSaver.from_conn_string(proxy.dsn(shallow_db)) as saver:
        graph = lg_scenarios.build_graph(saver)
        for _ in range(10):
            thread = f"hk-shallow-{uuid.uuid4().hex[:8]}"
            parked = park_shallow(graph, thread)
            if parked is not None:
                break
            assert claims_until(admin, thread, lambda c: not c) == []
        assert parked is not None, "the shallow saver lost the interrupt 10 times in a row"
        parked_id = parked.config["configurable"]["checkpoint_id"]
        [claim] = claims_until(admin, thread, bool)
        assert claim["checkpoint_id"] == parked_id and claim["superseded_at"] is None, claim

        cfg = lg_scenarios.thread_config(thread)
        result = graph.invoke(Command(resume=True), cfg)
        assert result["approved"] is True, result

    claims = claims_until(admin, thread, lambda c: c and c[0]["superseded_at"])
    assert len(claims) == 1, claims
    [claim] = claims
    assert claim["checkpoint_id"] == parked_id, claim
    assert claim["superseded_at"] is not None, claim
    assert claim["state"] == "consumed", claim
