"""Protocol state that changes only on the server's answer, on raw sockets
against real PostgreSQL 15, each sequence beside the same bytes straight to
PostgreSQL.

Five sequences once let a checkpoint statement escape the proxy's eye,
because the proxy changed its view of a prepared statement when the client
asked, not when the server confirmed:

1. ``Parse s1 = <write>``; ``Parse s1 = select 1`` (42P05: the server keeps
   the write); ``Bind/Execute s1``.
2. ``Parse(bad SQL) Close(S s1) Sync``: the server skips the Close.
3. ``BEGIN; select 1/0; DEALLOCATE s1`` (not executed, 25P02); ``ROLLBACK``;
   ``Bind s1``.
4. SQL ``PREPARE s4 AS <write>`` then a protocol ``Bind s4``.
5. SQL ``PREPARE s5 AS <write>`` then ``EXECUTE s5(...)``.

For the write variant the payload breaks a channel rule (``items`` must be
a list of strings; the blob is msgpack ``[None]``): straight to PostgreSQL it
commits one row; through the proxy it is refused (23514 for 1-4, where the
statement is recognized when bound; 0A000 for 5, as SQL EXECUTE of a
checkpoint statement is refused) and 0 rows exist. For the read variant the
statement is the saver's READ(latest) of a parked thread: through the proxy
it takes its consume-once claim (``claim_taken`` in the audit trail).
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from langgraph.checkpoint.postgres.base import BasePostgresSaver

import lg_scenarios as S
import pgraw as R
from conftest import HOST, SUPERUSER, connect
from test_validity import write_rules_dir



def numbered(sql: str) -> str:
    """psycopg's ``%s`` placeholders as the ``$n`` psycopg puts on the wire."""
    count = iter(range(1, 100))
    return re.sub(r"%s", lambda _: f"${next(count)}", sql)


WRITE_SQL = numbered(BasePostgresSaver.UPSERT_CHECKPOINT_WRITES_SQL)
READ_SQL = (BasePostgresSaver.SELECT_SQL
            + "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1")
ITEMS_RULE = """\
[[channel]]
name = "items"
thread_id = "tt-.*"
schema = { type = "array", items = { type = "string" } }
"""


@pytest.fixture(scope="module")
def tproxy(proxy_factory, workdir):
    rules = write_rules_dir(workdir / f"tracker-rules-{uuid.uuid4().hex[:6]}",
                            {"items.toml": ITEMS_RULE})
    return proxy_factory("--rules", str(rules), name="proxy-tracker")


@pytest.fixture(scope="module")
def tables(direct_dsn):
    S.setup_db("conn", direct_dsn)


def write_params(thread: str) -> list[bytes]:
    # thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx,
    # channel, type, blob (bytea as text: msgpack [None])
    return [thread.encode(), b"", b"ck1", b"task-1", b"~", b"0", b"items", b"msgpack",
            b"\\x91c0"]


def open_session(port: int, dbname: str) -> R.Session:
    return R.login(HOST, port, SUPERUSER, dbname)


def exchange(s: R.Session, *messages: bytes) -> list[tuple[bytes, bytes]]:
    """Send messages ending in Sync (or a Query); read to ReadyForQuery."""
    s.send(b"".join(messages))
    return s.until_ready()


def errors_of(msgs) -> list[str]:
    return [R.parse_error_fields(p).get("C", "") for t, p in msgs if t == b"E"]


def prepare(s: R.Session, sequence: int, name: str, sql: str) -> None:
    """Leave `name` prepared as `sql` the way `sequence` does, ending on a
    state where the client could believe `name` is something else."""
    if sequence in (1, 2, 3):
        assert errors_of(exchange(s, R.parse(name, sql), R.sync())) == []
    if sequence == 1:
        assert errors_of(exchange(s, R.parse(name, "select 1"), R.sync())) == ["42P05"]
    elif sequence == 2:
        msgs = exchange(s, R.parse("", "this is not sql"),
                        R.msg(b"C", b"S" + R.cstr(name)), R.sync())
        assert errors_of(msgs) == ["42601"]
    elif sequence == 3:
        _, errs = s.simple_query(f"BEGIN; select 1/0; DEALLOCATE {name}")
        assert [e["C"] for e in errs] == ["22012"]
        _, errs = s.simple_query("ROLLBACK")
        assert errs == []
    elif sequence in (4, 5):
        _, errs = s.simple_query(f"PREPARE {name} AS {sql}")
        assert errs == [], errs


def run(s: R.Session, sequence: int, name: str, params: list[bytes]) -> list[tuple[bytes, bytes]]:
    if sequence == 5:
        args = ", ".join("'" + p.decode().replace("'", "''") + "'" for p in params)
        s.send(R.query(f"EXECUTE {name}({args})"))
        return s.until_ready()
    return exchange(s, R.bind("", name, params), R.execute(), R.sync())


def row_count(dsn: str, thread: str) -> int:
    with connect(dsn) as c:
        return c.execute("select count(*) from checkpoint_writes where thread_id = %s",
                         (thread,)).fetchone()[0]


@pytest.mark.parametrize("sequence", [1, 2, 3, 4, 5])
def test_an_invalid_write_is_caught_whatever_the_client_did_to_its_name(
        sequence, tables, pg, dbname, direct_dsn, tproxy):
    # Straight to PostgreSQL: the statement is still the write, and commits.
    thread = f"tt-direct-{sequence}-{uuid.uuid4().hex[:6]}"
    s = open_session(pg.port, dbname)
    try:
        prepare(s, sequence, "s1", WRITE_SQL)
        msgs = run(s, sequence, "s1", write_params(thread))
        assert errors_of(msgs) == []
        assert any(t == b"C" and p.startswith(b"INSERT 0 1") for t, p in msgs), msgs
    finally:
        s.close()
    assert row_count(direct_dsn, thread) == 1

    # Through the proxy: refused, nothing written, the session still usable.
    thread = f"tt-proxy-{sequence}-{uuid.uuid4().hex[:6]}"
    s = open_session(tproxy.port, dbname)
    try:
        prepare(s, sequence, "s1", WRITE_SQL)
        msgs = run(s, sequence, "s1", write_params(thread))
        assert errors_of(msgs) == (["0A000"] if sequence == 5 else ["23514"]), msgs
        rows, errs = s.simple_query("select 1")
        assert (rows, errs) == ([[b"1"]], [])
    finally:
        s.close()
    assert row_count(direct_dsn, thread) == 0


def audited(proxy, thread: str, operation: str, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in proxy.audit(thread) if e.get("operation") == operation]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("sequence", [1, 2, 3, 4, 5])
def test_a_parked_head_read_takes_its_claim_whatever_the_client_did_to_its_name(
        sequence, tables, pg, dbname, direct_dsn, tproxy):
    thread = f"tr-{sequence}-{uuid.uuid4().hex[:6]}"
    S.park("conn", direct_dsn, thread)
    params = [thread.encode(), b""]

    # Straight to PostgreSQL: the parked head is served.
    s = open_session(pg.port, dbname)
    try:
        prepare(s, sequence, "r1", READ_SQL)
        msgs = run(s, sequence, "r1", params)
        assert errors_of(msgs) == []
        assert sum(t == b"D" for t, _ in msgs) == 1
    finally:
        s.close()

    s = open_session(tproxy.port, dbname)
    try:
        prepare(s, sequence, "r1", READ_SQL)
        msgs = run(s, sequence, "r1", params)
        if sequence == 5:
            # SQL EXECUTE of a checkpoint statement is refused: no row, no claim.
            assert errors_of(msgs) == ["0A000"], msgs
            assert not any(t == b"D" for t, _ in msgs)
            return
        assert errors_of(msgs) == [], msgs
        assert sum(t == b"D" for t, _ in msgs) == 1
    finally:
        s.close()
    taken = audited(tproxy, thread, "claim_taken")
    assert len(taken) == 1, tproxy.audit(thread)


def read_bound_then(port: int, dbname: str, thread: str, portal: str,
                    *then: list[bytes]) -> list[tuple[bytes, bytes]]:
    """In a transaction, the saver's READ(latest) of `thread` bound by the
    protocol to `portal` and not executed; then each exchange of `then`
    (none failing but the last): the last one's answers."""
    s = open_session(port, dbname)
    try:
        _, errs = s.simple_query("BEGIN")
        assert errs == [], errs
        msgs = exchange(s, R.parse("", READ_SQL), R.bind(portal, "", [thread.encode(), b""]),
                        R.sync())
        for messages in then:
            assert errors_of(msgs) == [], msgs
            msgs = exchange(s, *messages)
        return msgs
    finally:
        s.close()


def served_straight_refused_through(pg, dbname, direct_dsn, tproxy, sqlstate: str, portal: str,
                                    *then: list[bytes]) -> str:
    """A parked thread's head bound to `portal` and read by `then`: served
    straight to PostgreSQL, refused with `sqlstate` through the proxy, no row.
    The thread."""
    thread = f"tr-portal-{uuid.uuid4().hex[:6]}"
    S.park("conn", direct_dsn, thread)
    msgs = read_bound_then(pg.port, dbname, thread, portal, *then)
    assert errors_of(msgs) == [], msgs
    assert sum(t == b"D" for t, _ in msgs) == 1

    msgs = read_bound_then(tproxy.port, dbname, thread, portal, *then)
    assert errors_of(msgs) == [sqlstate], msgs
    assert not any(t == b"D" for t, _ in msgs)
    return thread


def test_a_parked_head_bound_by_the_protocol_cannot_be_read_by_sql_fetch(
        tables, pg, dbname, direct_dsn, tproxy):
    """SQL FETCH reads a portal a protocol Bind made, and its rows would reach
    the client unwatched: straight to PostgreSQL the parked head is served;
    through the proxy the FETCH fails 0A000, with no row and no claim."""
    thread = served_straight_refused_through(pg, dbname, direct_dsn, tproxy, "0A000", "p6",
                                             [R.query("FETCH ALL FROM p6")])
    assert audited(tproxy, thread, "claim_taken", timeout=1) == []


def test_the_unnamed_portal_an_empty_query_keeps_is_not_read_unwatched(
        tables, pg, dbname, direct_dsn, tproxy):
    """An empty Query keeps the unnamed portal, where any other Query drops it:
    straight to PostgreSQL the parked head bound before it is served by a later
    Execute; through the proxy, which saw no Bind since the Query, that Execute
    gets the server's own 34000, with no row."""
    served_straight_refused_through(pg, dbname, direct_dsn, tproxy, "34000", "",
                                    [R.query("")], [R.execute(), R.sync()])


def execute_after(port: int, dbname: str, setting: str, text: bytes) -> list[tuple[bytes, bytes]]:
    """The saver's READ(latest) prepared by Parse as ``r7``; then ``SET setting``
    and the Query ``text``."""
    s = open_session(port, dbname)
    try:
        assert errors_of(exchange(s, R.parse("r7", READ_SQL), R.sync())) == []
        _, errs = s.simple_query(f"SET {setting}")
        assert errs == [], errs
        return exchange(s, R.query(text))
    finally:
        s.close()


def hidden_execute_served_straight_refused_through(pg, dbname, direct_dsn, tproxy,
                                                   setting: str, text: str, encoding: str):
    """Straight to PostgreSQL the parked head is served by the ``EXECUTE r7`` in
    ``text`` (``{}``: the thread), sent in ``encoding`` after ``SET setting``;
    through the proxy the text fails 0A000 before it runs."""
    thread = f"tr-hidden-{uuid.uuid4().hex[:6]}"
    S.park("conn", direct_dsn, thread)
    sent = text.format(thread).encode(encoding)
    msgs = execute_after(pg.port, dbname, setting, sent)
    assert errors_of(msgs) == [], msgs
    assert sum(t == b"D" for t, _ in msgs) == 2          # the SELECT's row and the head

    msgs = execute_after(tproxy.port, dbname, setting, sent)
    assert errors_of(msgs) == ["0A000"], msgs
    assert not any(t == b"D" for t, _ in msgs)
    return sent


def test_an_execute_a_backslash_hides_from_the_standard_reading_is_refused(
        tables, pg, dbname, direct_dsn, tproxy):
    """With standard_conforming_strings off, ``'a\\''`` ends at its second
    quote, and the EXECUTE after it runs: straight to PostgreSQL the parked
    head is served by SQL EXECUTE; through the proxy the text, whose commands
    the two readings disagree on, fails 0A000 before it runs."""
    hidden_execute_served_straight_refused_through(
        pg, dbname, direct_dsn, tproxy, "standard_conforming_strings = off",
        "SELECT 'a\\'' ; EXECUTE r7('{}', '') ; --'", "utf-8")


def test_an_execute_a_multibyte_character_hides_from_the_utf8_reading_is_refused(
        tables, pg, dbname, direct_dsn, tproxy):
    """In SJIS (as in BIG5 and GBK) a character's second byte may be a
    backslash: 表 is 0x95 0x5C, and read as UTF-8 that backslash escapes the
    quote after it and holds the EXECUTE inside the string. Straight to
    PostgreSQL the parked head is served; through the proxy the text, whose
    commands differ in that encoding, fails 0A000 before it runs."""
    sent = hidden_execute_served_straight_refused_through(
        pg, dbname, direct_dsn, tproxy, "client_encoding = 'SJIS'",
        "SELECT E'表' ; EXECUTE r7('{}', '') ; --'", "shift_jis")
    assert b"\x95\\'" in sent


def read_through(s: R.Session, last: bytes) -> list[tuple[bytes, bytes]]:
    """Messages up to and including the first of type `last`."""
    out = []
    while True:
        tag, payload = s.read()
        out.append((tag, payload))
        if tag == last:
            return out


def extended_copy(s: R.Session, order: str) -> list[bytes]:
    """COPY FROM STDIN over the extended protocol, as libpq's PQexecParams
    sends it (a Sync after Execute, read by the server in copy-in mode and
    ignored, and one after CopyDone or CopyFail): the types of what the
    server answers, up to its single ReadyForQuery."""
    _, errs = s.simple_query("create temp table if not exists copy_t (x int)")
    assert errs == [], errs
    start = [R.parse("", "copy copy_t from stdin"), R.bind("", ""), R.describe_portal(),
             R.execute(), R.sync()]
    end = R.msg(b"f", R.cstr("client gave up")) if order == "fail" else R.msg(b"c")
    rest = [R.msg(b"d", b"1\n"), end, R.sync()]
    if order == "pipelined":
        msgs = exchange(s, *start, *rest)
    else:
        s.send(b"".join(start))
        msgs = read_through(s, b"G") + exchange(s, *rest)
    return [t for t, _ in msgs if t not in (b"N", b"S")]


@pytest.mark.parametrize("order", ["sync-before-copy-in", "pipelined", "fail"])
def test_extended_copy_from_stdin_answers_as_postgres_does(order, pg, dbname, tproxy):
    answers = []
    for port in (pg.port, tproxy.port):
        s = open_session(port, dbname)
        try:
            answers.append(extended_copy(s, order))
            rows, errs = s.simple_query("select 1")
            assert (rows, errs) == ([[b"1"]], [])
        finally:
            s.close()
    direct, proxied = answers
    assert direct == ([b"1", b"2", b"n", b"G", b"E", b"Z"] if order == "fail"
                      else [b"1", b"2", b"n", b"G", b"C", b"Z"]), direct
    assert proxied == direct


def test_a_failed_parse_of_the_unnamed_statement_leaves_none(tables, pg, dbname, direct_dsn,
                                                              tproxy):
    # PostgreSQL drops the unnamed write before it parses the bad text: the
    # Bind names no statement (26000), straight or through the proxy.
    for port in (pg.port, tproxy.port):
        thread = f"tt-unnamed-{uuid.uuid4().hex[:6]}"
        s = open_session(port, dbname)
        try:
            assert errors_of(exchange(s, R.parse("", WRITE_SQL), R.sync())) == []
            assert errors_of(exchange(s, R.parse("", "this is not sql"), R.sync())) == ["42601"]
            msgs = exchange(s, R.bind("", "", write_params(thread)), R.execute(), R.sync())
            assert errors_of(msgs) == ["26000"], msgs
            rows, errs = s.simple_query("select 1")
            assert (rows, errs) == ([[b"1"]], [])
        finally:
            s.close()
        assert row_count(direct_dsn, thread) == 0
