"""The proxy's rejection statement cannot be turned into code by client text.

A refused checkpoint write is answered by a ``DO`` block the proxy sends in
place of the write, raising 23514 with a message that quotes the thread id
and the validator's words. Every piece of that text reaches the server as
hex digits, so no thread id and no server setting can make it code:

* ``standard_conforming_strings`` off (per session through the startup
  ``options``, and for the whole database with ``ALTER DATABASE``) or on, a
  thread id carrying ``\\'`` and a PL/pgSQL payload (advance a ``canary``
  sequence, ``pg_sleep``) is refused with 23514, nothing of the write is
  stored, the sequence has not moved and nothing slept;
* a thread id carrying the block's dollar-quote tag ``$resumeguard$`` (also
  split by a NUL) is refused with 23514, not a syntax error;
* a database whose encoding lacks a character of the message still gets
  23514 (the text with ``\\u{…}`` escapes).

End to end with LangGraph's ``PostgresSaver`` (the ``items`` graph of
lg_enforce, its pending write ``[None]`` breaks the rule), and on the raw
protocol for what psycopg cannot send (a NUL inside a text parameter).
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.base import UPSERT_CHECKPOINT_WRITES_SQL

import lg_enforce as E
import pgraw
from conftest import HOST, SUPERUSER, connect
from test_validity import write_rules_dir

# `(?s)`: the thread ids below may hold any character.
RULE = """\
[[channel]]
name = "items"
thread_id = "(?s)inj-.*"
schema = { type = "array", items = { type = "string" } }

[[channel]]
name = "count"
thread_id = "(?s)inj-.*"
schema = { type = "integer" }
"""
SLEEP_S = 4
# Closes the message literal where backslash escapes are on, runs code, ends
# the block and comments out the rest of it.
QUOTE_PAYLOAD = (f"\\' || (SELECT nextval($c$canary$c$))::text || pg_sleep({SLEEP_S})::text; "
                 "END; -- '; select nextval('canary'); --")
# Closes the DO block's dollar quote.
TAG_PAYLOAD = "$resumeguard$resumeguard$ x $resumeguard$"
PAYLOADS = {"quote": QUOTE_PAYLOAD, "tag": TAG_PAYLOAD}
SCS_OFF = "-c standard_conforming_strings=off"


@pytest.fixture(scope="module")
def rproxy(proxy_factory, workdir):
    rules = write_rules_dir(workdir / f"inject-rules-{uuid.uuid4().hex[:6]}",
                            {"inject.toml": RULE})
    return proxy_factory("--rules", str(rules), name="proxy-reject-injection")


def prepare_db(dsn: str) -> None:
    E.setup_db(dsn)
    with connect(dsn) as c:
        c.execute("CREATE SEQUENCE IF NOT EXISTS canary")


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    prepare_db(direct_dsn)


@pytest.fixture(scope="module")
def scs_off_db(pg):
    """A database whose sessions start with standard_conforming_strings off."""
    name = f"rg_inject_scs_off_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
        c.execute(f'ALTER DATABASE "{name}" SET standard_conforming_strings = off')
    prepare_db(pg.dsn(name))
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def latin1_db(pg):
    name = f"rg_inject_latin1_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f"CREATE DATABASE \"{name}\" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                  "TEMPLATE template0")
    prepare_db(pg.dsn(name, options="-c client_encoding=UTF8"))
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def canary(dsn: str) -> tuple[int, bool]:
    with connect(dsn) as c:
        return c.execute("SELECT last_value, is_called FROM canary").fetchone()


def setting(dsn: str) -> str:
    with connect(dsn) as c:
        return c.execute("SHOW standard_conforming_strings").fetchone()[0]


def where(pg, dbname: str, mode: str, via) -> tuple[str, str]:
    """(direct DSN, DSN through `via`) for a setting mode."""
    params = {"options": SCS_OFF} if mode == "session-off" else {}
    return pg.dsn(dbname, **params), via.dsn(dbname, **params)


# --------------------------------------------------------------------------- LangGraph
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("mode", ("session-off", "database-off", "on"))
def test_langgraph_thread_id_cannot_inject(pg, rproxy, dbname, scs_off_db, mode, payload):
    db = scs_off_db if mode == "database-off" else dbname
    direct, through = where(pg, db, mode, rproxy)
    assert setting(through) == ("on" if mode == "on" else "off")
    thread = f"inj-{mode}-{uuid.uuid4().hex[:8]}{PAYLOADS[payload]}"
    cfg = E.cfg_of(thread)
    before = canary(direct)
    with PostgresSaver.from_conn_string(through) as saver:
        g = E.build_items_graph(saver)
        assert g.invoke({"pending": "a"}, cfg)["items"] == ["a"]
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as ei:
            g.invoke({"pending": None}, cfg)
        elapsed = time.monotonic() - started
    err = ei.value
    assert canary(direct) == before, "the payload ran: canary sequence advanced"
    assert elapsed < SLEEP_S - 1, f"the payload ran: the refused write took {elapsed:.1f}s"
    assert err.sqlstate == "23514", f"{type(err).__name__} {err.sqlstate}: {err}"
    # The raised text is the text: the thread id arrives whole.
    assert f'thread "{thread}"' in str(err), str(err)
    assert 'channel "items"' in str(err), str(err)
    rows = E.channel_rows(direct, thread, "items")
    assert E.invalid_items(rows) == [], rows
    assert rows["writes"] == [["a"]], rows
    note = E.channel_rows(direct, thread, "note")
    assert "appended None" not in note["writes"] + note["blobs"] + note["inline"], note


# --------------------------------------------------------------------------- raw protocol
def raw_write(port: int, dbname: str, thread: bytes, blob: bytes, channel: bytes = b"items",
              **startup: str) -> tuple[list[dict], str]:
    """One pending-write UPSERT as LangGraph sends it, every parameter text;
    returns the ErrorResponses and the task id it used."""
    sql = UPSERT_CHECKPOINT_WRITES_SQL
    for n in range(1, 10):
        sql = sql.replace("%s", f"${n}", 1)
    task = str(uuid.uuid4())
    params = [thread, b"", b"ck-inject", task.encode(), b"", b"0", channel, b"msgpack",
              b"\\x" + blob.hex().encode()]
    sess = pgraw.login(HOST, port, SUPERUSER, dbname, **startup)
    try:
        sess.send(pgraw.parse("", sql) + pgraw.bind("", "", params) + pgraw.execute()
                  + pgraw.sync())
        errors = [pgraw.parse_error_fields(p) for t, p in sess.until_ready() if t == b"E"]
        rows, errs = sess.simple_query("SELECT 1")
        assert errs == [] and rows == [[b"1"]], (rows, errs)
    finally:
        sess.close()
    return errors, task


def stored_writes(dsn: str, task: str) -> int:
    with connect(dsn) as c:
        return c.execute("SELECT count(*) FROM checkpoint_writes WHERE task_id = %s",
                         (task,)).fetchone()[0]


RAW_THREADS = {
    "quote": QUOTE_PAYLOAD.encode(),
    "tag": TAG_PAYLOAD.encode(),
    "nul-tag": b"$resume\x00guard$resumeguard$\x00",
    "backslashes": b"\\\\' \\' '' \\x27 E'\\'",
}


@pytest.mark.parametrize("case", sorted(RAW_THREADS))
@pytest.mark.parametrize("mode", ("session-off", "on"))
def test_raw_write_thread_id_cannot_inject(pg, rproxy, dbname, mode, case):
    direct = pg.dsn(dbname)
    startup = {"options": SCS_OFF} if mode == "session-off" else {}
    thread = b"inj-raw-" + uuid.uuid4().hex[:8].encode() + RAW_THREADS[case]
    before = canary(direct)
    started = time.monotonic()
    errors, task = raw_write(rproxy.port, dbname, thread, b"\x91\xc0", **startup)  # [None]
    elapsed = time.monotonic() - started
    assert canary(direct) == before, "the payload ran: canary sequence advanced"
    assert elapsed < SLEEP_S - 1, f"the payload ran: the refused write took {elapsed:.1f}s"
    assert [e.get("C") for e in errors] == ["23514"], errors
    shown = thread.decode().replace("\x00", "\ufffd")
    assert f'thread "{shown}"' in errors[0]["M"], errors[0]
    assert errors[0]["D"].startswith("rule "), errors[0]
    assert stored_writes(direct, task) == 0


def test_raw_write_valid_value_is_stored(pg, rproxy, dbname):
    """The same statement with a valid value passes: the refusals above are
    the rule's, not the odd thread ids'."""
    thread = b"inj-raw-ok-" + uuid.uuid4().hex[:8].encode() + TAG_PAYLOAD.encode()
    errors, task = raw_write(rproxy.port, dbname, thread, b"\x91\xa1a",  # ["a"]
                             options=SCS_OFF)
    assert errors == []
    assert stored_writes(pg.dsn(dbname), task) == 1


def test_message_the_database_encoding_cannot_hold_is_still_23514(pg, rproxy, latin1_db):
    """The message names the thread: one with a character LATIN1 has none for."""
    blob = b"\xa4boom"  # msgpack fixstr, for an integer channel
    thread = "inj-latin1-\U0001f4a5-".encode() + uuid.uuid4().hex[:8].encode()
    errors, task = raw_write(rproxy.port, latin1_db, thread, blob, channel=b"count",
                             client_encoding="UTF8")
    assert [e.get("C") for e in errors] == ["23514"], errors
    assert "inj-latin1-\\u{1f4a5}-" in errors[0]["M"], errors[0]
    assert stored_writes(pg.dsn(latin1_db, options="-c client_encoding=UTF8"), task) == 0


def test_message_the_client_encoding_cannot_hold_is_still_23514(pg, rproxy, dbname):
    """The message names the thread as the proxy read it: an SJIS client's ﾃｩ
    (0xC3 0xA9) read as UTF-8 is é, which the server cannot convert back to SJIS
    for the client; the message falls back to its ASCII form, not to 22P05."""
    blob = b"\xa4boom"  # msgpack fixstr, for an integer channel
    thread = "inj-sjis-ﾃｩ-".encode("shift_jis") + uuid.uuid4().hex[:8].encode()
    errors, task = raw_write(rproxy.port, dbname, thread, blob, channel=b"count",
                             client_encoding="SJIS")
    assert [e.get("C") for e in errors] == ["23514"], errors
    assert "inj-sjis-\\u{e9}-" in errors[0]["M"], errors[0]
    assert stored_writes(pg.dsn(dbname), task) == 0
