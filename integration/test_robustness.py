"""Hostile and broken input on raw sockets, and upstream failures: the proxy answers
or closes, never hangs, and keeps serving new connections."""

from __future__ import annotations

import struct
import threading
import time

import psycopg
import pytest

import pgraw
from conftest import HOST, SUPERUSER, Proxy, connect, free_port

IO_TIMEOUT = 10.0


def assert_serves(proxy, dbname):
    """A normal connection through the proxy still works."""
    assert proxy.alive(), f"proxy died\n{proxy.describe()}"
    with connect(proxy.dsn(dbname)) as c:
        assert c.execute("select 'alive'").fetchone()[0] == "alive"


def closed_with_optional_error(sock) -> list[dict]:
    """Read to EOF; everything received must be whole ErrorResponses (or nothing)."""
    data = pgraw.read_until_eof(sock, IO_TIMEOUT)
    msgs = pgraw.split_messages(data)
    consumed = sum(5 + len(p) for _, p in msgs)
    assert consumed == len(data), f"trailing non-message bytes after close: {data[consumed:][:100]!r}"
    assert all(tag == b"E" for tag, _ in msgs), f"expected only ErrorResponse before close, got {msgs}"
    return [pgraw.parse_error_fields(p) for _, p in msgs]


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",          # length field = 1.19 GB
    b"\x00\x00\x00\x08\x12\x34\x56\x78",                    # unknown request code
    b"\x00\x00\x00\x02",                                    # length below the minimum
    b"\x00\x00\x00\x10" + b"\xff" * 12,                     # junk "protocol version"
    bytes(range(256)) * 4,                                  # random-ish binary
])
def test_garbage_instead_of_startup(proxy, dbname, garbage):
    with pgraw.connect(HOST, proxy.port, IO_TIMEOUT) as s:
        try:
            s.sendall(garbage)
        except (BrokenPipeError, ConnectionResetError):
            pass
        errs = closed_with_optional_error(s)
        for e in errs:
            assert e.get("S") in ("FATAL", "ERROR"), e
    assert_serves(proxy, dbname)


def test_silent_client_then_close(proxy, dbname):
    """Connect, send nothing, close: nothing breaks."""
    for _ in range(5):
        s = pgraw.connect(HOST, proxy.port, IO_TIMEOUT)
        s.close()
    assert_serves(proxy, dbname)


def test_unsupported_protocol_version_9_9(pg, proxy, dbname):
    results = {}
    for name, port in (("direct", pg.port), ("proxy", proxy.port)):
        with pgraw.connect(HOST, port, IO_TIMEOUT) as s:
            s.sendall(pgraw.startup_message(SUPERUSER, dbname, version=pgraw.version_code(9, 9)))
            errs = closed_with_optional_error(s)
        assert len(errs) == 1, f"{name}: expected one ErrorResponse, got {errs}"
        results[name] = errs[0]
    assert results["proxy"].get("S") == "FATAL", results
    # PostgreSQL answers 0A000 (feature not supported); a proxy answering itself may say 08P01
    assert results["proxy"].get("C") in ("0A000", "08P01"), results
    assert_serves(proxy, dbname)


def test_ssl_request_answered_N_then_startup(proxy, dbname):
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname, ssl_first=True)
    try:
        rows, errs = sess.simple_query("select current_database()")
        assert rows == [[dbname.encode()]] and not errs
    finally:
        sess.close()


def test_gssenc_request_declined(proxy, dbname):
    """The proxy must not agree to GSSAPI encryption (it could not read the stream);
    after its 'N' a plain startup on the same socket works."""
    with pgraw.connect(HOST, proxy.port, IO_TIMEOUT) as s:
        s.sendall(pgraw.gssenc_request())
        answer = pgraw.recv_exact(s, 1)
        assert answer == b"N", f"GSSENCRequest answered {answer!r}"
        s.sendall(pgraw.startup_message(SUPERUSER, dbname))
        sess = pgraw.Session(s)
        msgs = sess.until_ready()
        assert msgs[0] == (b"R", struct.pack("!I", 0)), msgs[:2]
        rows, errs = sess.simple_query("select 1")
        assert rows == [[b"1"]] and not errs


def test_huge_length_header_after_login(pg, proxy, dbname):
    results = {}
    for name, port in (("direct", pg.port), ("proxy", proxy.port)):
        sess = pgraw.login(HOST, port, SUPERUSER, dbname)
        with sess.sock as s:
            s.sendall(b"Q" + struct.pack("!I", 0x7FFFFFF0))   # ~2 GiB, no body
            errs = closed_with_optional_error(s)
        results[name] = errs
    # PostgreSQL itself only logs "invalid message length" and closes (COMMERROR, nothing
    # sent: results["direct"] == []); the proxy, which must not try to buffer 2 GiB, is
    # expected to say so with a protocol-violation ErrorResponse before closing.
    assert [e.get("C") for e in results["proxy"]] == ["08P01"], results
    assert_serves(proxy, dbname)


def test_negative_length_header_after_login(proxy, dbname):
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname)
    with sess.sock as s:
        s.sendall(b"Q" + struct.pack("!I", 0xFFFFFFF0))
        errs = closed_with_optional_error(s)
    assert [e.get("C") for e in errs] in ([], ["08P01"]), errs
    assert_serves(proxy, dbname)


def test_truncated_message_then_close(proxy, dbname):
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname)
    sess.sock.sendall(b"Q" + struct.pack("!I", 100) + b"select 1")   # 92 bytes short
    sess.sock.close()
    # and a truncated startup packet
    with pgraw.connect(HOST, proxy.port, IO_TIMEOUT) as s:
        s.sendall(pgraw.startup_message(SUPERUSER, dbname)[:11])
    time.sleep(0.3)
    assert_serves(proxy, dbname)


def test_unknown_message_type_after_login(pg, proxy, dbname):
    results = {}
    for name, port in (("direct", pg.port), ("proxy", proxy.port)):
        sess = pgraw.login(HOST, port, SUPERUSER, dbname)
        with sess.sock as s:
            s.sendall(pgraw.msg(b"\x01", b"junk"))
            errs = closed_with_optional_error(s)
        results[name] = [e.get("C") for e in errs]
    assert results["proxy"] == results["direct"] == ["08P01"], results
    assert_serves(proxy, dbname)


def test_raw_extended_protocol_and_pipeline_error(proxy, dbname):
    """Parse/Bind/Execute pipeline with an error in the middle: the rest of the segment
    is skipped up to Sync, and the session continues (the saver relies on this)."""
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname)
    try:
        sess.send(pgraw.parse("s1", "select $1::int + 1")
                  + pgraw.bind("", "s1", [b"41"]) + pgraw.describe_portal() + pgraw.execute()
                  + pgraw.bind("", "s1", [b"not-int"]) + pgraw.execute()
                  + pgraw.bind("", "s1", [b"1"]) + pgraw.execute()
                  + pgraw.sync())
        msgs = sess.until_ready()
        tags = b"".join(t for t, _ in msgs)
        assert tags == b"12TDCEZ", tags
        assert pgraw.parse_error_fields(msgs[5][1])["C"] == "22P02"
        sess.send(pgraw.bind("", "s1", [b"9"]) + pgraw.execute() + pgraw.sync())
        msgs = sess.until_ready()
        assert [pgraw.decode_datarow(p) for t, p in msgs if t == b"D"] == [[b"10"]]
    finally:
        sess.close()


def test_many_connections_closed_abruptly_leave_no_backends(pg, proxy, dbname):
    """Client sockets dropped without Terminate: the proxy closes its upstream ones."""
    app = "rg-leak-check"
    socks = []
    for _ in range(20):
        sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname, application_name=app)
        socks.append(sess.sock)
    with connect(pg.dsn(dbname)) as c:
        q = "select count(*) from pg_stat_activity where application_name = %s"
        assert c.execute(q, (app,)).fetchone()[0] == 20
        for s in socks:
            s.close()
        deadline = time.monotonic() + 10
        while c.execute(q, (app,)).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.execute(q, (app,)).fetchone()[0] == 0, "upstream backends leaked after client close"
    assert_serves(proxy, dbname)


def _backend_pid(conn) -> int:
    return conn.execute("select pg_backend_pid()").fetchone()[0]


def test_upstream_backend_killed_mid_query(pg, proxy, dbname):
    with connect(proxy.dsn(dbname)) as victim, connect(pg.dsn(dbname)) as admin:
        pid = _backend_pid(victim)
        box: dict = {}

        def run():
            try:
                victim.execute("select pg_sleep(20)")
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(0.7)
        t0 = time.monotonic()
        assert admin.execute("select pg_terminate_backend(%s)", (pid,)).fetchone()[0] is True
        t.join(IO_TIMEOUT)
        assert not t.is_alive(), "client hangs after its upstream backend was terminated"
        assert time.monotonic() - t0 < 5
        assert isinstance(box.get("error"), psycopg.OperationalError), box
        assert victim.closed or victim.broken
    assert_serves(proxy, dbname)


def test_upstream_backend_killed_mid_pipeline(pg, proxy, dbname):
    victim = connect(proxy.dsn(dbname), prepare_threshold=0)
    try:
        with connect(pg.dsn(dbname)) as admin:
            victim.execute("create temp table pl(id int)")
            pid = _backend_pid(victim)
            box: dict = {}

            def run():
                try:
                    with victim.pipeline():
                        for i in range(50):
                            victim.execute("insert into pl values (%s)", (i,))
                        victim.execute("select pg_sleep(20)")
                        for i in range(50):
                            victim.execute("insert into pl values (%s)", (i,))
                except BaseException as e:  # noqa: BLE001
                    box["error"] = e
            t = threading.Thread(target=run, daemon=True)
            t.start()
            time.sleep(1.0)
            admin.execute("select pg_terminate_backend(%s)", (pid,))
            t.join(IO_TIMEOUT)
            assert not t.is_alive(), "pipelined client hangs after its backend was terminated"
            assert isinstance(box.get("error"), psycopg.OperationalError), box
        # the proxy must also close the client's socket (PostgreSQL does): the next use
        # of the connection fails at once instead of hanging or succeeding
        if not victim.closed:
            t0 = time.monotonic()
            box2: dict = {}

            def again():
                try:
                    victim.execute("select 1")
                except BaseException as e:  # noqa: BLE001
                    box2["error"] = e
            t2 = threading.Thread(target=again, daemon=True)
            t2.start()
            t2.join(IO_TIMEOUT)
            assert not t2.is_alive(), "reusing the dead connection hangs"
            assert isinstance(box2.get("error"), psycopg.OperationalError), box2
            assert time.monotonic() - t0 < 5
        assert victim.closed or victim.broken
    finally:
        victim.close()
    assert_serves(proxy, dbname)


def test_upstream_server_stopped(workdir):
    """A whole throwaway PostgreSQL goes away under the proxy: clients get errors,
    and new connections fail fast instead of hanging."""
    from conftest import PgServer
    spare = PgServer("spare").start()
    p = Proxy(spare.port, workdir, "proxy-spare").start()
    try:
        c = connect(p.dsn("postgres"))
        assert c.execute("select 1").fetchone()[0] == 1
        box: dict = {}

        def run():
            try:
                c.execute("select pg_sleep(20)")
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(0.5)
        spare.stop()       # pg_ctl stop -m fast: terminates backends
        t.join(IO_TIMEOUT)
        assert not t.is_alive(), "client hangs after the upstream server stopped"
        assert isinstance(box.get("error"), psycopg.OperationalError), box
        c.close()
        t0 = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            connect(p.dsn("postgres"))
        assert time.monotonic() - t0 < IO_TIMEOUT, "connecting to a proxy without upstream hangs"
        assert p.alive(), f"proxy exited after losing its upstream\n{p.describe()}"
    finally:
        spare.stop()
        rc = p.stop()
    assert rc == 0, f"proxy exit code {rc} on SIGTERM\n{p.describe()}"


def test_upstream_unreachable_from_start(workdir):
    port = free_port()   # nothing listens there
    p = Proxy(port, workdir, "proxy-nowhere").start()
    try:
        t0 = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(p.dsn("postgres"), connect_timeout=10)
        assert time.monotonic() - t0 < IO_TIMEOUT
        # raw: the client gets an ErrorResponse or a close, not silence
        with pgraw.connect(HOST, p.port, IO_TIMEOUT) as s:
            s.sendall(pgraw.startup_message(SUPERUSER, "postgres"))
            errs = closed_with_optional_error(s)
            for e in errs:
                assert e.get("S") == "FATAL", e
        assert p.alive()
    finally:
        rc = p.stop()
    assert rc == 0, f"proxy exit code {rc} on SIGTERM\n{p.describe()}"


def test_pipelined_flood_both_directions(pg, proxy, dbname):
    """The client writes ~8 MB of pipelined Bind/Execute while PostgreSQL answers
    with ~40 MB of rows; a proxy that does not move both directions independently
    deadlocks here. Same result as direct."""
    n = 20000
    batch = (pgraw.parse("flood", "select $1::int, repeat('r', 2000)")
             + b"".join(pgraw.bind("", "flood", [str(i).encode()]) + pgraw.execute()
                        for i in range(n)) + pgraw.sync())
    results = {}
    for name, port in (("direct", pg.port), ("proxy", proxy.port)):
        sess = pgraw.login(HOST, port, SUPERUSER, dbname)
        try:
            sender = threading.Thread(target=sess.sock.sendall, args=(batch,), daemon=True)
            sender.start()
            count = total = 0
            sess.sock.settimeout(30)
            for tag, payload in sess.until_ready():
                if tag == b"D":
                    row = pgraw.decode_datarow(payload)
                    count += 1
                    total += int(row[0])
                    assert len(row[1]) == 2000
                elif tag == b"E":
                    raise AssertionError(pgraw.parse_error_fields(payload))
            sender.join(30)
            assert not sender.is_alive()
            results[name] = (count, total)
        finally:
            sess.close()
    assert results["proxy"] == results["direct"] == (n, n * (n - 1) // 2)


def test_many_concurrent_connections(proxy, dbname):
    n = 100
    errors_seen, pids = [], set()
    barrier = threading.Barrier(n, timeout=30)

    def worker():
        try:
            with connect(proxy.dsn(dbname)) as c:
                barrier.wait()
                pids.add(c.execute("select pg_backend_pid(), pg_sleep(0.2)").fetchone()[0])
        except BaseException as e:  # noqa: BLE001
            errors_seen.append(repr(e))
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors_seen, errors_seen[:5]
    assert len(pids) == n   # one upstream backend per client


def test_proxy_survived_everything(proxy, dbname):
    assert_serves(proxy, dbname)


def test_max_client_conn_refuses_with_53300_and_frees_on_close(proxy_factory, workdir):
    """Each session is two relay threads and a server connection: beyond
    max_client_conn a new client is told so (FATAL 53300) instead of exhausting the
    host; a slot frees when a session ends, and cancel requests still pass."""
    cfg = workdir / "max-client-conn.toml"
    cfg.write_text("max_client_conn = 2\n")
    p = proxy_factory("--config", str(cfg), name="proxy-max-conn")
    first, second = connect(p.dsn("postgres")), connect(p.dsn("postgres"))
    try:
        with pytest.raises(psycopg.OperationalError) as refused:
            connect(p.dsn("postgres"))
        assert "too many client connections (max_client_conn = 2)" in str(refused.value)
        with pgraw.connect(HOST, p.port, IO_TIMEOUT) as s:   # psycopg keeps no SQLSTATE here
            s.sendall(pgraw.startup_message(SUPERUSER, "postgres"))
            errs = closed_with_optional_error(s)
        assert [(e["S"], e["C"]) for e in errs] == [("FATAL", "53300")], errs
        assert second.execute("select 2").fetchone()[0] == 2     # the others are unharmed
        second.cancel()                                          # a cancel request still passes
    finally:
        second.close()
    deadline = time.monotonic() + IO_TIMEOUT
    while True:
        try:
            third = connect(p.dsn("postgres"))
            break
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "the closed session's slot never freed"
            time.sleep(0.05)
    try:
        assert third.execute("select 3").fetchone()[0] == 3
        assert first.execute("select 1").fetchone()[0] == 1
    finally:
        third.close()
        first.close()
