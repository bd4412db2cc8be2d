"""The proxy's own schema (``resumeguard``: claims, run leases, the audit trail) is
the proxy's: statements from clients that change it, lock its rows or put it on
search_path are refused through the proxy (42501, the rows remain), in simple and
extended protocol; plain SELECTs of it are served. Each case beside the same
statement straight to PostgreSQL, where it succeeds (the defect: with claims in the
fronted database under the application's role, a client can undo a claim).

The claims store of the ``proxy`` fixture is the default one: the PostgreSQL the
proxy fronts, database ``postgres``, role ``postgres`` — the role the tests log in
as. Stock statements that would damage the shared schema run in a transaction
that is rolled back.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest

import pgraw
from conftest import HOST, SUPERUSER
from test_consume_once import (  # noqa: F401  (co is a fixture)
    IN_USE,
    REFUSED,
    co,
    in_process_resume,
    ledger,
    one_resumer,
    park,
    tid,
    wait_for_node,
)

DENIED = "42501"
SCHEMA_DB = "postgres"   # where the claims store keeps its schema (the upstream's default)


@pytest.fixture(scope="module")
def schema_dsn(proxy, pg):
    """Direct DSN of the database holding the schema, once the proxy created it."""
    direct = pg.dsn(SCHEMA_DB)
    deadline = time.monotonic() + 15
    with psycopg.connect(direct, autocommit=True) as c:
        while c.execute("select to_regclass('resumeguard.audit_events')").fetchone()[0] is None:
            assert time.monotonic() < deadline, f"no resumeguard schema\n{proxy.describe()}"
            time.sleep(0.1)
    return direct


def seed(direct: str) -> str:
    """A claim row and an audit row of a fresh thread, written straight to PostgreSQL."""
    thread = f"own-{uuid.uuid4().hex[:10]}"
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute(
            "insert into resumeguard.claims (thread_id, checkpoint_ns, checkpoint_id, fingerprint,"
            " state, proxy_id, session_id, client_addr, application_name, claimed_at_ms,"
            " lapse_at_ms, holder_instance) values (%s, '', 'c1', 'f', 'consumed', 'seed', 1,"
            " 'test', 'test', 1, 1, 1)", (thread,))
        c.execute(
            "insert into resumeguard.audit_events (time, proxy_id, session_id, client_addr,"
            ' "user", "database", application_name, operation, thread_id, channels, blob_sha256,'
            " detail) values (now(), 'seed', 1, 'test', 'u', 'd', 'a', 'claim_consumed', %s,"
            " '[]', '{}', '{}')", (thread,))
    return thread


def rows_of(direct: str, thread: str) -> tuple[int, int, list[str]]:
    with psycopg.connect(direct, autocommit=True) as c:
        claims = c.execute("select count(*) from resumeguard.claims where thread_id = %s",
                           (thread,)).fetchone()[0]
        ops = [r[0] for r in c.execute("select operation from resumeguard.audit_events"
                                       " where thread_id = %s", (thread,))]
        triggers = c.execute("select count(*) from pg_trigger where tgrelid ="
                             " 'resumeguard.audit_events'::regclass and tgenabled = 'D'").fetchone()[0]
    return claims, triggers, ops


# Statements a client must not run on the schema ({t}: the seeded thread).
REFUSED_STATEMENTS = {
    "delete-claim": "DELETE FROM resumeguard.claims WHERE thread_id = '{t}'",
    "truncate-audit": "TRUNCATE resumeguard.audit_events",
    "disable-trigger": "ALTER TABLE resumeguard.audit_events DISABLE TRIGGER ALL",
    "rewrite-audit": "UPDATE resumeguard.audit_events SET operation = 'forged' WHERE thread_id = '{t}'",
    "delete-audit": "DELETE FROM resumeguard.audit_events WHERE thread_id = '{t}'",
    "quoted": 'DELETE FROM "resumeguard"."claims" WHERE thread_id = \'{t}\'',
    "upper-case": "delete from RESUMEGUARD.Claims where thread_id = '{t}'",
    "unicode-escape": 'DELETE FROM U&"resum\\0065guard".claims WHERE thread_id = \'{t}\'',
    "search-path": "SET search_path = resumeguard",
    "set-config": "SELECT set_config('search_path', 'public, ResumeGuard', false)",
    "select-for-update": "SELECT * FROM resumeguard.claims WHERE thread_id = '{t}' FOR UPDATE",
    "do-block": "DO $$ BEGIN DELETE FROM resumeguard.claims WHERE thread_id = '{t}'; END $$",
}

# Straight to PostgreSQL: what each does there, run in a rolled-back transaction
# (the trigger that keeps audit_events append-only is disabled first, as the
# client in the defect did).
STOCK = {
    "delete-claim": "DELETE FROM resumeguard.claims WHERE thread_id = '{t}'",
    "truncate-audit": "ALTER TABLE resumeguard.audit_events DISABLE TRIGGER ALL;"
                      " TRUNCATE resumeguard.audit_events",
    "rewrite-audit": "ALTER TABLE resumeguard.audit_events DISABLE TRIGGER ALL;"
                     " UPDATE resumeguard.audit_events SET operation = 'forged' WHERE thread_id = '{t}'",
    "search-path": "SET search_path = resumeguard; DELETE FROM claims WHERE thread_id = '{t}'",
    "unicode-escape": 'DELETE FROM U&"resum\\0065guard".claims WHERE thread_id = \'{t}\'',
}


def simple(port: int, sql: str) -> tuple[list, list[dict], list[bytes]]:
    """A simple Query over the raw protocol: rows, errors, message tags."""
    sess = pgraw.login(HOST, port, SUPERUSER, SCHEMA_DB)
    try:
        sess.send(pgraw.query(sql))
        out = sess.until_ready()
        rows = [pgraw.decode_datarow(p) for t, p in out if t == b"D"]
        errors = [pgraw.parse_error_fields(p) for t, p in out if t == b"E"]
        # The session goes on.
        assert sess.simple_query("select 1") == ([[b"1"]], [])
        return rows, errors, [t for t, _ in out]
    finally:
        sess.close()


def extended(port: int, sql: str) -> tuple[list[dict], list[bytes]]:
    """Parse (named) / Bind / Execute / Sync over the raw protocol: errors, tags."""
    sess = pgraw.login(HOST, port, SUPERUSER, SCHEMA_DB)
    try:
        sess.send(pgraw.parse("s1", sql) + pgraw.bind("", "s1") + pgraw.execute() + pgraw.sync())
        out = sess.until_ready()
        errors = [pgraw.parse_error_fields(p) for t, p in out if t == b"E"]
        assert sess.simple_query("select 1") == ([[b"1"]], [])
        return errors, [t for t, _ in out]
    finally:
        sess.close()


def assert_denied(error: dict, what: str) -> None:
    assert error.get("C") == DENIED, (what, error)
    assert "schema resumeguard belongs to resumeguard" in error.get("M", ""), (what, error)


@pytest.mark.parametrize("case", sorted(REFUSED_STATEMENTS))
def test_statements_on_the_schema_are_refused_and_the_rows_remain(proxy, schema_dsn, case):
    thread = seed(schema_dsn)
    sql = REFUSED_STATEMENTS[case].format(t=thread)
    before = rows_of(schema_dsn, thread)
    assert before == (1, 0, ["claim_consumed"]), before

    # simple Query: ErrorResponse then ReadyForQuery, nothing else
    rows, errors, tags = simple(proxy.port, sql)
    assert tags == [b"E", b"Z"], (case, tags, errors)
    assert_denied(errors[0], f"simple {case}")
    assert rows_of(schema_dsn, thread) == before, case

    # extended: the error where ParseComplete would be; Bind and Execute skipped
    errors, tags = extended(proxy.port, sql)
    assert tags == [b"E", b"Z"], (case, tags, errors)
    assert_denied(errors[0], f"extended {case}")
    assert rows_of(schema_dsn, thread) == before, case

    # psycopg, prepared (named Parse) and not
    with psycopg.connect(proxy.dsn(SCHEMA_DB), autocommit=True) as c:
        for prepare in (True, False):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as ei:
                c.execute(sql, prepare=prepare)
            assert "belongs to resumeguard" in str(ei.value), ei.value
        assert c.execute("show search_path").fetchone()[0] == '"$user", public'
    assert rows_of(schema_dsn, thread) == before, case

    # straight to PostgreSQL the same statement runs (rolled back here)
    stock = STOCK.get(case)
    if stock:
        with psycopg.connect(schema_dsn) as c:
            c.execute(stock.format(t=thread))
            assert c.execute("select count(*) from resumeguard.claims where thread_id = %s"
                             " union all select count(*) from resumeguard.audit_events"
                             " where thread_id = %s and operation = 'claim_consumed'",
                             (thread, thread)).fetchall() != [(1,), (1,)], case
            c.rollback()
    assert rows_of(schema_dsn, thread) == before, case


def test_a_refusal_inside_a_transaction_aborts_it(proxy, schema_dsn):
    thread = seed(schema_dsn)
    with psycopg.connect(proxy.dsn(SCHEMA_DB)) as c:
        c.execute("select 1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("DELETE FROM resumeguard.claims WHERE thread_id = %s", (thread,))
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("select 1")
        c.rollback()
    assert rows_of(schema_dsn, thread)[0] == 1


def test_a_delete_a_multibyte_character_hides_in_a_string_is_refused(proxy, schema_dsn, pg):
    """In SJIS (as in BIG5 and GBK) a character's second byte may be a
    backslash: 表 is 0x95 0x5C, and read as UTF-8 that backslash escapes the
    quote after it, so the DELETE reads as part of a string. Straight to
    PostgreSQL the claim is deleted (rolled back here); through the proxy the
    text fails 42501 and the claim stays."""
    thread = seed(schema_dsn)
    text = (f"SELECT E'表' ; DELETE FROM resumeguard.claims WHERE thread_id = '{thread}'"
            " ; --'").encode("shift_jis")
    assert b"\x95\\'" in text
    for port in (proxy.port, pg.port):
        sess = pgraw.login(HOST, port, SUPERUSER, SCHEMA_DB)
        try:
            assert sess.simple_query("SET client_encoding = 'SJIS'")[1] == []
            assert sess.simple_query("BEGIN")[1] == []
            sess.send(pgraw.query(text))
            out = sess.until_ready()
            errors = [pgraw.parse_error_fields(p) for t, p in out if t == b"E"]
            done = [p.rstrip(b"\0") for t, p in out if t == b"C"]
            if port == proxy.port:
                assert [t for t, _ in out] == [b"E", b"Z"], out
                assert_denied(errors[0], "SJIS")
            else:
                assert errors == [] and done[-1] == b"DELETE 1", out   # stock: it deletes
            sess.simple_query("ROLLBACK")
        finally:
            sess.close()
        assert rows_of(schema_dsn, thread)[0] == 1


def test_search_path_refused_then_the_unqualified_delete_misses(proxy, schema_dsn):
    """SET search_path = resumeguard is refused, so `DELETE FROM claims` that
    follows resolves to no table (42P01) and the claim stays; straight to
    PostgreSQL the pair deletes it."""
    thread = seed(schema_dsn)
    with psycopg.connect(proxy.dsn(SCHEMA_DB), autocommit=True) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SET search_path = resumeguard")
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute("DELETE FROM claims WHERE thread_id = %s", (thread,))
    assert rows_of(schema_dsn, thread)[0] == 1
    with psycopg.connect(schema_dsn) as c:
        c.execute("SET search_path = resumeguard")
        assert c.execute("DELETE FROM claims WHERE thread_id = %s", (thread,)).rowcount == 1
        c.rollback()


def test_search_path_at_login_is_refused(proxy, schema_dsn, pg):
    thread = seed(schema_dsn)
    opts = {"options": "-c search_path=resumeguard"}
    with pytest.raises(pgraw.LoginError) as ei:
        pgraw.login(HOST, proxy.port, SUPERUSER, SCHEMA_DB, **opts)
    assert ei.value.sqlstate == DENIED, ei.value.fields
    # stock: the login puts the schema on the path, the bare name reaches it
    sess = pgraw.login(HOST, pg.port, SUPERUSER, SCHEMA_DB, **opts)
    try:
        rows, errors = sess.simple_query(f"BEGIN; DELETE FROM claims WHERE thread_id = '{thread}'"
                                         " RETURNING thread_id; ROLLBACK")
        assert errors == [] and rows == [[thread.encode()]], (rows, errors)
    finally:
        sess.close()
    assert rows_of(schema_dsn, thread)[0] == 1


def test_what_postgres_resolves_elsewhere_is_not_refused(proxy, schema_dsn):
    """Quoted "RESUMEGUARD" and "ResumeGuard" are other schemas for PostgreSQL:
    passed on, the server answers 3F000/42P01, the rows stay. Mentions in strings
    and comments are not statements on the schema."""
    thread = seed(schema_dsn)
    with psycopg.connect(proxy.dsn(SCHEMA_DB), autocommit=True) as c:
        for quoted in ('"RESUMEGUARD"', '"ResumeGuard"'):
            with pytest.raises((psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedTable)):
                c.execute(f"DELETE FROM {quoted}.claims WHERE thread_id = %s", (thread,))
        assert c.execute("select 'resumeguard.claims', $$DELETE FROM resumeguard.claims$$"
                         " /* resumeguard.claims */").fetchone() == (
            "resumeguard.claims", "DELETE FROM resumeguard.claims")
        # set to the other schema "RESUMEGUARD": allowed, and not ours
        c.execute("SET search_path = 'RESUMEGUARD'")
        c.execute("RESET search_path")
    assert rows_of(schema_dsn, thread)[0] == 1


@pytest.mark.parametrize("prepare", [False, True])
def test_reading_the_schema_is_served(proxy, schema_dsn, prepare):
    thread = seed(schema_dsn)
    with psycopg.connect(proxy.dsn(SCHEMA_DB), autocommit=True) as c:
        got = c.execute("SELECT state, proxy_id FROM resumeguard.claims WHERE thread_id = %s",
                        (thread,), prepare=prepare).fetchall()
        assert got == [("consumed", "seed")]
        ops = c.execute('SELECT operation FROM "resumeguard".audit_events WHERE thread_id = %s',
                        (thread,), prepare=prepare).fetchall()
        assert ops == [("claim_consumed",)]


def test_a_racer_deleting_the_claim_row_is_refused_and_one_fires(co, pg):
    """While the winner's gated node runs (its claim held), a second client removes
    the thread's claim and run lease rows, then resumes. With the rows deleted
    straight at PostgreSQL the second resume is served and the gated node fires
    twice; through the proxy the DELETEs are refused (42501), the second resume is
    refused before its node runs, and the node fires once."""
    seen = {}
    for via, deleter in (("direct", pg.dsn(SCHEMA_DB)), ("proxy", co.a.dsn(SCHEMA_DB))):
        thread = tid(f"del-{via}")
        park(co.dsn("A"), thread)
        winner = one_resumer(co, co.dsn("A"), thread, f"dw{via[0]}-", gate_ms=3000)
        try:
            winner.ready(0)
            winner.go(0)
            wait_for_node(co, thread, "gate")
            deleted = []
            with psycopg.connect(deleter, autocommit=True) as c:
                for table in ("claims", "run_leases"):
                    try:
                        cur = c.execute(f"DELETE FROM resumeguard.{table} WHERE thread_id = %s",
                                        (thread,))
                        deleted.append(cur.rowcount)
                    except psycopg.errors.InsufficientPrivilege as e:
                        deleted.append(e.sqlstate)
            second = in_process_resume(co.dsn("A"), thread, f"ds{via[0]}")
            first = winner.results(0)[0]
            winner.finish()
        finally:
            winner.kill()
        rows = ledger(co, thread)
        seen[via] = (deleted, first, second, rows)
        print(f"{via}: deleted={deleted} second ok={second['ok']} error={second['error']};"
              f" ledger={rows}")
    deleted, first, second, rows = seen["direct"]
    assert deleted[0] == 1, deleted
    assert second["ok"], second
    assert sorted(r[1] for r in rows) == ["gate", "gate"], rows   # the defect: two fires
    deleted, first, second, rows = seen["proxy"]
    assert deleted == [DENIED, DENIED], deleted
    assert first["ok"], first
    assert not second["ok"] and second["error"]["sqlstate"] in (REFUSED, IN_USE), second
    assert len(rows) == 1 and rows[0][1] == "gate", rows
    assert rows == [(rows[0][0], "gate", json.dumps(f"v-{rows[0][0]}"))], rows
