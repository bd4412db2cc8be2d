"""The validity gate reads checkpoint JSON whatever its numbers.

Python's ``json.dumps`` writes an int as all its digits and PostgreSQL's
jsonb stores any number, so a checkpoint can carry ``10**400``. The gate
reads such JSON at full precision (and refuses, under a rule, JSON it still
cannot read), so a rule-breaking value beside a big number is refused, and a
valid state with a big number passes and reads back exactly.

Graph (lg_enforce.build_count_graph): ``START -> set -> END``, ``set`` returns
``{"count": ..., "name": ...}``; both channels are inline primitives of the
checkpoint JSON. Durability ``exit``: the run's one write is that checkpoint
(the saver cannot msgpack a pending write of an int past 64 bits).
Rule: ``count`` and ``name`` are integers, for threads ``bn-…``.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

import lg_enforce as E
from conftest import connect
from test_validity import write_rules_dir

RULE = """\
[[channel]]
name = "count"
thread_id = "bn-.*"
schema = { type = "integer" }

[[channel]]
name = "name"
thread_id = "bn-.*"
schema = { type = "integer", minimum = 0 }
"""
BIG = 10 ** 400


@pytest.fixture(scope="module")
def bproxy_dsn(proxy_factory, workdir, dbname) -> str:
    rules = write_rules_dir(workdir / f"bignum-rules-{uuid.uuid4().hex[:6]}",
                            {"bignum.toml": RULE})
    return proxy_factory("--rules", str(rules), name="proxy-validity-bignum").dsn(dbname)


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    E.setup_db(direct_dsn)


def run(dsn: str, thread: str, returns: dict) -> dict:
    with PostgresSaver.from_conn_string(dsn) as saver:
        g = E.build_count_graph(saver, returns)
        return g.invoke({"count": 0, "name": 0}, E.cfg_of(thread), durability="exit")


def stored(dsn: str, thread: str) -> list:
    """The inline values of every stored checkpoint of the thread."""
    with connect(dsn) as c:
        return [r[0] for r in c.execute(
            "SELECT checkpoint->'channel_values' FROM checkpoints WHERE thread_id = %s",
            (thread,))]


def test_rule_breaking_value_beside_a_big_int_is_refused(direct_dsn, bproxy_dsn):
    bad = {"count": "notint", "name": BIG}

    # ---- stock: the string is committed as the int channel's value
    stock = f"bn-stock-{uuid.uuid4().hex[:8]}"
    assert run(direct_dsn, stock, bad) == bad
    values = stored(direct_dsn, stock)
    assert [v["count"] for v in values] == ["notint"], values
    assert values[0]["name"] == BIG

    # ---- proxy: 23514 names the channel, nothing of the run is stored
    thread = f"bn-proxy-{uuid.uuid4().hex[:8]}"
    with pytest.raises(psycopg.errors.CheckViolation) as ei:
        run(bproxy_dsn, thread, bad)
    assert ei.value.sqlstate == "23514"
    msg = str(ei.value)
    assert 'channel "count"' in msg and f'thread "{thread}"' in msg, msg
    # The failing keyword, not the value ([audit] log_values is off).
    assert "bignum.toml:1" in msg and 'fails its "type" keyword' in msg, msg
    assert "notint" not in msg, msg
    assert stored(direct_dsn, thread) == []


@pytest.mark.parametrize("sign", (1, -1))
def test_valid_state_with_a_big_int_passes_and_reads_back(direct_dsn, bproxy_dsn, sign):
    thread = f"bn-valid-{uuid.uuid4().hex[:8]}"
    good = {"count": sign * BIG, "name": BIG}
    if sign < 0:
        # `name` has minimum 0: a big negative is below it, not an overflow.
        with pytest.raises(psycopg.errors.CheckViolation) as ei:
            run(bproxy_dsn, thread, {"count": 1, "name": -BIG})
        assert 'channel "name"' in str(ei.value), str(ei.value)
        assert stored(direct_dsn, thread) == []
    assert run(bproxy_dsn, thread, good) == good
    assert [v["count"] for v in stored(direct_dsn, thread)] == [sign * BIG]
    with PostgresSaver.from_conn_string(bproxy_dsn) as saver:
        state = E.build_count_graph(saver, good).get_state(E.cfg_of(thread))
    assert state.values == good
