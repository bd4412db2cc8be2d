"""psql (and psycopg) through the proxy behave exactly as direct."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import errors

from conftest import PSQL, connect, pg_env

PSQL_TIMEOUT = 60


def psql(dsn: str, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [PSQL, "-X", "-d", dsn, *args]
    cp = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=PSQL_TIMEOUT,
                        env=pg_env(), stdin=None if input is not None else subprocess.DEVNULL)
    if check:
        assert cp.returncode == 0, f"psql exited {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    return cp


def both(direct_dsn, proxy_dsn, *args, **kw):
    return psql(direct_dsn, *args, **kw), psql(proxy_dsn, *args, **kw)


MULTI = r"""
select 1 as one, 'two' as two, null::text as three;
select g as n, md5(g::text) from generate_series(1, 5) g;
create temp table t(id int primary key, v text);
insert into t select g, repeat('x', g) from generate_series(1, 100) g;
select count(*), sum(length(v)) from t;
select 'é中文😀'::text, E'tab\there', 1.5::numeric, '2024-01-02'::date, '{1,2,3}'::int[], '{"a": 1}'::jsonb;
do $$ begin raise notice 'hello notice %', 42; end $$;
select x from (values (1), (2)) v(x) where false;
select repeat('abcdefghij', 100000) = repeat('abcdefghij', 100000) as big, length(repeat('z', 1000000));
;
select 'after empty statement';
"""


def test_multi_statement_simple_query_equal(direct_dsn, proxy_dsn):
    # -c sends the whole string as ONE simple Query; psql 15 prints every result
    d, p = both(direct_dsn, proxy_dsn, "-v", "ON_ERROR_STOP=1", "-c", MULTI)
    assert "INSERT 0 100" in d.stdout and "hello notice 42" in d.stderr
    assert p.stdout == d.stdout
    assert p.stderr == d.stderr


def test_statement_by_statement_script_equal(direct_dsn, proxy_dsn):
    # -f / stdin sends one Query per statement
    d, p = both(direct_dsn, proxy_dsn, "-v", "ON_ERROR_STOP=1", "-f", "-", input=MULTI)
    assert "INSERT 0 100" in d.stdout
    assert p.stdout == d.stdout
    assert p.stderr == d.stderr


@pytest.fixture(scope="module")
def copy_source(direct_dsn):
    """10k rows with awkward text (tabs, newlines, backslashes, unicode, NULLs)."""
    with connect(direct_dsn) as c:
        c.execute("drop table if exists copy_src, copy_dst_proxy, copy_dst_direct")
        c.execute("""
            create table copy_src(id int primary key, t text, n numeric, b bytea, j jsonb);
            insert into copy_src
            select g,
                   case when g % 7 = 0 then null
                        else 'row ' || g || E'\t tab \\ backslash \n newline é中😀 ' || repeat('y', g % 50) end,
                   g * 1.25,
                   decode(md5(g::text), 'hex'),
                   jsonb_build_object('g', g, 's', 'v' || g)
            from generate_series(1, 10000) g;
            create table copy_dst_proxy (like copy_src);
            create table copy_dst_direct (like copy_src);
        """)
    return "copy_src"


def table_digest(dsn: str, table: str) -> tuple[int, str]:
    with connect(dsn) as c:
        return c.execute(f"select count(*), md5(coalesce(string_agg(x::text, '|' order by id), '')) "
                         f"from {table} x").fetchone()


def test_copy_out_and_in_roundtrip(direct_dsn, proxy_dsn, copy_source, tmp_path):
    out_d, out_p = tmp_path / "direct.tsv", tmp_path / "proxy.tsv"
    psql(direct_dsn, "-v", "ON_ERROR_STOP=1", "-c", rf"\copy copy_src to '{out_d}'")
    psql(proxy_dsn, "-v", "ON_ERROR_STOP=1", "-c", rf"\copy copy_src to '{out_p}'")
    assert out_d.stat().st_size > 500_000
    assert out_p.read_bytes() == out_d.read_bytes(), "COPY TO STDOUT through the proxy differs"

    p = psql(proxy_dsn, "-v", "ON_ERROR_STOP=1", "-c", rf"\copy copy_dst_proxy from '{out_p}'")
    assert p.stdout.strip() in ("", "COPY 10000"), p.stdout
    psql(direct_dsn, "-v", "ON_ERROR_STOP=1", "-c", rf"\copy copy_dst_direct from '{out_d}'")
    src = table_digest(direct_dsn, "copy_src")
    assert src[0] == 10000
    assert table_digest(direct_dsn, "copy_dst_proxy") == src
    assert table_digest(direct_dsn, "copy_dst_direct") == src


def test_copy_csv_out_equal(direct_dsn, proxy_dsn, copy_source, tmp_path):
    cmd = r"\copy (select * from copy_src order by id) to '{}' with (format csv, header)"
    psql(direct_dsn, "-c", cmd.format(tmp_path / "d.csv"))
    psql(proxy_dsn, "-c", cmd.format(tmp_path / "p.csv"))
    assert (tmp_path / "p.csv").read_bytes() == (tmp_path / "d.csv").read_bytes()


def test_copy_binary_psycopg_equal(direct_dsn, proxy_dsn, copy_source):
    def dump(dsn):
        h = hashlib.sha256()
        with connect(dsn) as c, c.cursor() as cur:
            with cur.copy("copy (select * from copy_src order by id) to stdout (format binary)") as cp:
                for chunk in cp:
                    h.update(chunk)
        return h.hexdigest()
    assert dump(proxy_dsn) == dump(direct_dsn)


def test_copy_from_stdin_errors_and_copyfail_keep_session(proxy_dsn):
    with connect(proxy_dsn) as c:
        c.execute("create temp table ce(id int, t text)")
        cur = c.cursor()
        # server-side error in the middle of COPY data
        with pytest.raises(errors.InvalidTextRepresentation) as ei:
            with cur.copy("copy ce from stdin") as cp:
                cp.write("1\tok\n")
                cp.write("not-a-number\tbad\n")
        assert ei.value.sqlstate == "22P02"
        assert c.execute("select count(*) from ce").fetchone()[0] == 0
        # client-side abort: psycopg sends CopyFail
        with pytest.raises(errors.QueryCanceled):
            with cur.copy("copy ce from stdin") as cp:
                cp.write("2\tok\n")
                raise errors.QueryCanceled("client gave up")
        assert c.execute("select count(*) from ce").fetchone()[0] == 0
        # and a good COPY afterwards
        with cur.copy("copy ce from stdin") as cp:
            for i in range(1000):
                cp.write_row((i, f"r{i}"))
        assert c.execute("select count(*), sum(id) from ce").fetchone() == (1000, 499500)


ERROR_SCRIPT = r"""
\set VERBOSITY verbose
select 1/0;
select 'still alive' as status;
"""


def test_error_sqlstate_and_session_continues_psql(direct_dsn, proxy_dsn):
    d, p = both(direct_dsn, proxy_dsn, "-f", "-", input=ERROR_SCRIPT)
    assert "ERROR:  22012: division by zero" in p.stderr, p.stderr
    assert "still alive" in p.stdout
    assert p.stdout == d.stdout
    assert p.stderr == d.stderr


def test_error_sqlstate_and_session_continues_psycopg(proxy_dsn):
    with connect(proxy_dsn) as c:
        with pytest.raises(errors.DivisionByZero) as ei:
            c.execute("select 1/0")
        assert ei.value.sqlstate == "22012"
        assert ei.value.diag.message_primary == "division by zero"
        assert c.execute("select 41 + 1").fetchone()[0] == 42
        # the same in the extended protocol with parameters
        with pytest.raises(errors.DivisionByZero):
            c.execute("select %s::int / %s::int", (1, 0))
        assert c.execute("select %s::int + 1", (41,)).fetchone()[0] == 42


@pytest.fixture(scope="module")
def other_db(pg, dbname):
    name = dbname + "_other"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_reconnect_with_backslash_c(proxy_dsn, proxy, dbname, other_db):
    # psql's \c reuses host and port, i.e. opens a second connection through the proxy
    script = (f"select current_database();\n\\c {other_db}\nselect current_database();\n"
              f"\\c {dbname}\nselect current_database();\n")
    p = psql(proxy_dsn, "-A", "-t", "-v", "ON_ERROR_STOP=1", "-f", "-", input=script)
    assert f'You are now connected to database "{other_db}"' in p.stdout, p.stdout
    lines = [line for line in p.stdout.splitlines() if line.strip() and "connected" not in line]
    assert lines == [dbname, other_db, dbname], p.stdout


TX_SCRIPT = r"""
create temp table tx(id int);
begin;
insert into tx values (1), (2);
select count(*) as in_tx from tx;
rollback;
select count(*) as after_rollback from tx;
begin;
insert into tx values (3);
savepoint s1;
select 1/0;
rollback to savepoint s1;
insert into tx values (4);
commit;
select array_agg(id order by id) as committed from tx;
begin;
select 1/0;
select 'in failed tx';
rollback;
select 'after failed tx' as ok;
"""


def test_transaction_rollback_psql_equal(direct_dsn, proxy_dsn):
    d, p = both(direct_dsn, proxy_dsn, "-f", "-", input=TX_SCRIPT)
    assert "{3,4}" in p.stdout and "after failed tx" in p.stdout, p.stdout
    assert "25P02" in p.stderr or "current transaction is aborted" in p.stderr
    assert p.stdout == d.stdout
    assert p.stderr == d.stderr


def test_transaction_status_tracking_psycopg(proxy_dsn):
    TS = psycopg.pq.TransactionStatus
    with connect(proxy_dsn, autocommit=False) as c:
        c.execute("create temp table tt(id int) on commit preserve rows")
        c.commit()
        assert c.info.transaction_status == TS.IDLE
        c.execute("insert into tt values (1)")
        assert c.info.transaction_status == TS.INTRANS
        assert c.execute("select count(*) from tt").fetchone()[0] == 1
        c.rollback()
        assert c.info.transaction_status == TS.IDLE
        assert c.execute("select count(*) from tt").fetchone()[0] == 0
        with pytest.raises(errors.DivisionByZero):
            c.execute("select 1/0")
        assert c.info.transaction_status == TS.INERROR
        with pytest.raises(errors.InFailedSqlTransaction):
            c.execute("select 1")
        c.rollback()
        assert c.execute("select 5").fetchone()[0] == 5
        c.commit()


def test_listen_notify_through_proxy(direct_dsn, proxy_dsn):
    chan = "rg_chan_" + uuid.uuid4().hex[:8]
    with connect(proxy_dsn) as listener, connect(direct_dsn) as n_direct, connect(proxy_dsn) as n_proxy:
        listener.execute(f"LISTEN {chan}")
        pid_direct = n_direct.execute("select pg_backend_pid()").fetchone()[0]
        pid_proxy = n_proxy.execute("select pg_backend_pid()").fetchone()[0]

        # notifications arrive while the listener is idle: the proxy must forward
        # server-initiated messages without waiting for client traffic
        def send():
            time.sleep(0.3)
            n_direct.execute("select pg_notify(%s, %s)", (chan, "from-direct"))
            n_proxy.execute(f"NOTIFY {chan}, 'from-proxy'")
        t = threading.Thread(target=send)
        t.start()
        got = list(listener.notifies(timeout=10, stop_after=2))
        t.join(10)
        assert [(n.channel, n.payload, n.pid) for n in got] == [
            (chan, "from-direct", pid_direct), (chan, "from-proxy", pid_proxy)]
        # the listening session still works and UNLISTEN stops delivery
        listener.execute(f"UNLISTEN {chan}")
        n_direct.execute("select pg_notify(%s, 'late')", (chan,))
        assert list(listener.notifies(timeout=1)) == []
        assert listener.execute("select 1").fetchone()[0] == 1


def test_notify_delivered_with_query_result(proxy_dsn, direct_dsn):
    """A notification that arrives while the listener runs a query is delivered too."""
    chan = "rg_chan2_" + uuid.uuid4().hex[:8]
    seen = []
    with connect(proxy_dsn) as listener, connect(direct_dsn) as notifier:
        listener.add_notify_handler(lambda n: seen.append((n.channel, n.payload)))
        listener.execute(f"LISTEN {chan}")
        notifier.execute(f"NOTIFY {chan}, 'p1'")
        time.sleep(0.2)
        assert listener.execute("select 7").fetchone()[0] == 7
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            listener.execute("select 1")
            time.sleep(0.05)
        assert seen == [(chan, "p1")]


def test_large_object_import_export_fastpath(direct_dsn, proxy_dsn, tmp_path):
    """psql's \\lo_import / \\lo_export use libpq's large-object API, i.e. the
    FunctionCall ('F') fast-path message, which nothing else here sends."""
    src = tmp_path / "blob.bin"
    src.write_bytes(hashlib.sha256(b"seed").digest() * 40000)   # 1.28 MB
    out = tmp_path / "back.bin"
    p = psql(proxy_dsn, "-v", "ON_ERROR_STOP=1", "-f", "-", input=(
        "begin;\n"
        f"\\lo_import '{src}'\n"
        f"\\lo_export :LASTOID '{out}'\n"
        "select lo_unlink(:LASTOID);\n"
        "commit;\n"))
    assert out.read_bytes() == src.read_bytes(), p.stdout + p.stderr
