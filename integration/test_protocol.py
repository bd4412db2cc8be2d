"""Extended-protocol details a parsing proxy must get right (psycopg, direct vs proxy)."""

from __future__ import annotations

import os

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from conftest import connect

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core


def test_named_prepared_statements_and_deallocate(proxy_dsn):
    """prepare_threshold=0 (the saver's setting): every statement is named _pg3_n;
    DEALLOCATE ALL resets them; the same SQL is re-prepared afterwards."""
    with connect(proxy_dsn, prepare_threshold=0) as c:
        for i in range(5):
            assert c.execute("select %s::int * 2", (i,)).fetchone()[0] == i * 2
        c.execute("DEALLOCATE ALL")
        for i in range(5):
            assert c.execute("select %s::int * 2", (i,)).fetchone()[0] == i * 2
        assert c.execute("select count(*) from pg_prepared_statements").fetchone()[0] >= 1


def test_binary_params_and_results_equal(direct_dsn, proxy_dsn):
    q = "select %b::bytea, %b::int2, %b::int8, %b::float8, %b::text, %b::jsonb, %b::int4[]"
    args = (os.urandom(70000), -4, 2**40, 1.5, "é中😀", psycopg.types.json.Jsonb({"a": [1, None]}),
            [1, None, 3])

    def run(dsn):
        with connect(dsn, prepare_threshold=0) as c, c.cursor(binary=True) as cur:
            return cur.execute(q, args).fetchone()
    assert run(proxy_dsn) == run(direct_dsn)


def test_large_rows_and_query_text(direct_dsn, proxy_dsn):
    # ~1 MiB of query text (a comment) plus 4 MiB parameters, and a 10 MiB result value
    big_sql = ("select length(%s) as n, md5(%s) as h, " + "+".join(["1"] * 500) + " as s /* "
               + "c" * (1024 * 1024) + " */")
    text = "x" * (4 * 1024 * 1024)

    def run(dsn):
        with connect(dsn) as c:
            a = c.execute(big_sql, (text, text)).fetchone()
            b = c.execute("select repeat('ab', 5*1024*1024)").fetchone()[0]
            return a, len(b), b[:10]
    assert run(proxy_dsn) == run(direct_dsn)


def test_many_rows_streamed(direct_dsn, proxy_dsn):
    def run(dsn):
        with connect(dsn) as c, c.cursor() as cur:
            rows = 0
            total = 0
            for (v,) in cur.stream("select g from generate_series(1, 200000) g"):
                rows += 1
                total += v
            return rows, total
    assert run(proxy_dsn) == run(direct_dsn) == (200000, 200000 * 200001 // 2)


def test_server_side_cursor(proxy_dsn):
    with connect(proxy_dsn, autocommit=False) as c:
        with c.cursor(name="rg_cur") as cur:
            cur.itersize = 500
            cur.execute("select g from generate_series(1, 3000) g")
            assert sum(r[0] for r in cur) == 3000 * 3001 // 2
        c.commit()


def test_pipeline_with_error_recovers(direct_dsn, proxy_dsn):
    def run(dsn):
        out = []
        with connect(dsn, prepare_threshold=0) as c:
            c.execute("create temp table p(id int primary key)")
            with pytest.raises(errors.UniqueViolation):
                with c.pipeline():
                    c.execute("insert into p values (1)")
                    c.execute("insert into p values (1)")
                    c.execute("insert into p values (2)")
            out.append(c.execute("select array_agg(id order by id) from p").fetchone()[0])
            with c.pipeline():
                curs = [c.execute("select %s::int", (i,)) for i in range(100)]
            out.append([cur.fetchone()[0] for cur in curs])
        return out
    assert run(proxy_dsn) == run(direct_dsn)


def test_dict_row_saver_style_connection(proxy_dsn):
    with psycopg.connect(proxy_dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as c:
        assert c.execute("select 1 as a, 'b' as b").fetchone() == {"a": 1, "b": "b"}


def test_parameter_status_and_set(direct_dsn, proxy_dsn):
    def run(dsn):
        with connect(dsn) as c:
            c.execute("set application_name = 'rg-proto'")
            c.execute("set timezone = 'Asia/Tokyo'")
            return (c.info.parameter_status("application_name"), c.info.parameter_status("TimeZone"),
                    c.info.parameter_status("server_encoding"), c.info.parameter_status("client_encoding"))
    assert run(proxy_dsn) == run(direct_dsn) == ("rg-proto", "Asia/Tokyo", "UTF8", "UTF8")


def test_notice_processing(proxy_dsn):
    with connect(proxy_dsn) as c:
        notes = []
        c.add_notice_handler(lambda d: notes.append((d.severity_nonlocalized, d.message_primary)))
        c.execute("do $$ begin raise notice 'n1'; raise warning 'w1'; end $$")
        assert notes == [("NOTICE", "n1"), ("WARNING", "w1")]


def test_protocol_3_2_negotiation(direct_dsn, proxy_dsn):
    """libpq 18 can ask for protocol 3.2; PostgreSQL 15 answers NegotiateProtocolVersion.
    Works direct, so must work through the proxy."""
    def run(dsn):
        with psycopg.connect(dsn, autocommit=True, max_protocol_version="3.2") as c:
            return c.execute("select 1").fetchone()[0], c.pgconn.protocol_version
    assert run(proxy_dsn) == run(direct_dsn)


def test_application_name_and_options_in_startup(proxy_dsn):
    with psycopg.connect(proxy_dsn, autocommit=True, application_name="rg-app",
                         options="-c statement_timeout=4321") as c:
        assert c.execute("select current_setting('application_name'), "
                         "current_setting('statement_timeout')").fetchone() == ("rg-app", "4321ms")
