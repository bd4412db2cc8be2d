"""Authentication pass-through (SCRAM-SHA-256) and query cancellation through the proxy."""

from __future__ import annotations

import subprocess
import threading
import time

import psycopg
import pytest
from psycopg import errors

import pgraw
from conftest import HOST, PSQL, SCRAM_PASSWORD, SCRAM_USER, SUPERUSER, connect, pg_env

CANCEL_DEADLINE = 5.0


# ----------------------------------------------------------------- SCRAM
def test_scram_role_connects_through_proxy(proxy, dbname):
    with connect(proxy.dsn(dbname, SCRAM_USER, SCRAM_PASSWORD)) as c:
        assert c.execute("select current_user, session_user").fetchone() == (SCRAM_USER, SCRAM_USER)
        assert c.execute("select 1 + 1").fetchone()[0] == 2


def test_scram_is_really_required(pg, proxy, dbname):
    """pg_hba demands a password for scram_user: no password fails, direct and proxied."""
    for port in (pg.port, proxy.port):
        with pytest.raises(psycopg.OperationalError) as ei:
            psycopg.connect(f"host={HOST} port={port} dbname={dbname} user={SCRAM_USER} "
                            f"connect_timeout=10 password=")
        assert "password" in str(ei.value).lower(), (port, str(ei.value))


def test_wrong_password_refused_28P01(pg, proxy, dbname):
    # libpq's view
    with pytest.raises(psycopg.OperationalError) as ei:
        connect(proxy.dsn(dbname, SCRAM_USER, "wrong-password"))
    assert 'password authentication failed for user "scram_user"' in str(ei.value), str(ei.value)
    # the exact ErrorResponse, from a raw SCRAM exchange: same as direct
    for port in (pg.port, proxy.port):
        with pytest.raises(pgraw.LoginError) as ei:
            pgraw.login(HOST, port, SCRAM_USER, dbname, password="wrong-password")
        assert ei.value.sqlstate == "28P01", (port, ei.value.fields)
        assert ei.value.fields.get("S") == "FATAL", (port, ei.value.fields)


def test_raw_scram_exchange_verifies_server_signature(proxy, dbname):
    """A full SCRAM-SHA-256 exchange through the proxy; the client checks the server's
    final signature, so the proxy passed the real server's messages unchanged."""
    sess = pgraw.login(HOST, proxy.port, SCRAM_USER, dbname, password=SCRAM_PASSWORD, ssl_first=True)
    try:
        rows, errs = sess.simple_query("select current_user")
        assert errs == [] and rows == [[SCRAM_USER.encode()]]
        assert sess.params.get("server_version", "").startswith("15")
        assert sess.pid is not None and sess.key is not None
    finally:
        sess.close()


def test_psql_with_password_through_proxy(proxy, dbname):
    env = pg_env()
    env["PGPASSWORD"] = SCRAM_PASSWORD
    cp = subprocess.run([PSQL, "-X", "-A", "-t", "-h", HOST, "-p", str(proxy.port), "-U", SCRAM_USER,
                         "-d", dbname, "-c", "select current_user"], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=60, env=env)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == SCRAM_USER


# ----------------------------------------------------------------- cancel
def _run_in_thread(fn):
    box: dict = {}

    def target():
        t0 = time.monotonic()
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            box["error"] = e
        box["elapsed"] = time.monotonic() - t0
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


@pytest.mark.parametrize("method", ["cancel", "cancel_safe"])
def test_cancel_long_query_through_proxy(proxy_dsn, method):
    with connect(proxy_dsn) as c:
        t, box = _run_in_thread(lambda: c.execute("select pg_sleep(30)").fetchone())
        time.sleep(1.0)
        assert t.is_alive(), f"pg_sleep(30) ended early: {box}"
        t_cancel = time.monotonic()
        if method == "cancel":
            c.cancel()            # libpq PQcancel: a CancelRequest on a new connection to the proxy
        else:
            c.cancel_safe(timeout=CANCEL_DEADLINE)   # libpq 17+ PQcancelConn
        t.join(CANCEL_DEADLINE + 5)
        assert not t.is_alive(), "query still running after cancel"
        waited = time.monotonic() - t_cancel
        assert isinstance(box.get("error"), errors.QueryCanceled), box
        assert box["error"].sqlstate == "57014"
        assert waited < CANCEL_DEADLINE, f"cancel took {waited:.1f}s"
        # the session survives the cancel
        assert c.execute("select 'after cancel'").fetchone()[0] == "after cancel"


def test_raw_cancel_request_with_key_from_proxy(proxy, dbname):
    """CancelRequest with the pid/key the client got from the proxy cancels that query."""
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname)
    try:
        sess.send(pgraw.query("select pg_sleep(30)"))
        time.sleep(0.5)
        with pgraw.connect(HOST, proxy.port) as s:
            s.sendall(pgraw.cancel_request(sess.pid, sess.key))
            pgraw.read_until_eof(s, 5)   # the server closes the cancel connection
        t0 = time.monotonic()
        sess.sock.settimeout(CANCEL_DEADLINE)
        msgs = sess.until_ready()
        errs = [pgraw.parse_error_fields(p) for tag, p in msgs if tag == b"E"]
        assert [e.get("C") for e in errs] == ["57014"], msgs
        assert time.monotonic() - t0 < CANCEL_DEADLINE
        rows, errs = sess.simple_query("select 1")
        assert rows == [[b"1"]] and not errs
    finally:
        sess.close()


def test_cancel_with_wrong_key_is_ignored(proxy, dbname):
    """A CancelRequest with a wrong key must not cancel anything."""
    sess = pgraw.login(HOST, proxy.port, SUPERUSER, dbname)
    try:
        wrong_key = bytes(b ^ 0xFF for b in sess.key)
        sess.send(pgraw.query("select pg_sleep(1.5), 'finished'"))
        time.sleep(0.3)
        for pid, key in ((sess.pid, wrong_key), ((sess.pid + 1) & 0x7FFFFFFF, sess.key)):
            with pgraw.connect(HOST, proxy.port) as s:
                s.sendall(pgraw.cancel_request(pid, key))
                pgraw.read_until_eof(s, 5)
        sess.sock.settimeout(10)
        msgs = sess.until_ready()
        assert not [m for m in msgs if m[0] == b"E"], msgs
        rows = [pgraw.decode_datarow(p) for tag, p in msgs if tag == b"D"]
        assert rows == [[b"", b"finished"]], rows
    finally:
        sess.close()


def test_cancel_does_not_hit_other_sessions(proxy_dsn):
    """Cancelling one proxied session leaves a concurrent one alone."""
    with connect(proxy_dsn) as a, connect(proxy_dsn) as b:
        ta, box_a = _run_in_thread(lambda: a.execute("select pg_sleep(30)").fetchone())
        tb, box_b = _run_in_thread(lambda: b.execute("select pg_sleep(2), 'b done'").fetchone())
        time.sleep(0.7)
        a.cancel()
        ta.join(CANCEL_DEADLINE + 5)
        tb.join(10)
        assert isinstance(box_a.get("error"), errors.QueryCanceled), box_a
        assert box_b.get("result") == ("", "b done"), box_b
