"""The command-line contract of `resumeguard serve` and `resumeguard audit`."""

from __future__ import annotations

import signal
import subprocess
import time
from urllib.parse import urlparse

import psycopg

import pgraw
from conftest import HOST, SUPERUSER, Proxy, connect, proxy_binary, run_audit_cli


def test_serve_prints_database_url(proxy):
    url = proxy.database_url(timeout=10)
    assert url, f"serve printed no DATABASE_URL=... line\n{proxy.describe()}"
    u = urlparse(url)
    assert u.scheme in ("postgres", "postgresql"), url
    assert u.port == proxy.port, url
    assert u.hostname in ("127.0.0.1", "localhost"), url


def test_database_url_is_usable(proxy):
    url = proxy.database_url(timeout=10)
    assert url
    # with --upstream the URL names no user (the proxy does not know one): libpq's
    # default (the OS user) would apply, so say which role to use
    with psycopg.connect(url, autocommit=True, connect_timeout=10,
                         **({} if urlparse(url).username else {"user": SUPERUSER})) as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_serve_exits_cleanly_on_sigint(pg, workdir):
    p = Proxy(pg.port, workdir, "proxy-sigint").start()
    with connect(p.dsn("postgres")) as c:
        assert c.execute("select 1").fetchone()[0] == 1
    rc = p.stop(signal.SIGINT)
    assert rc == 0, f"exit code {rc} on SIGINT\n{p.describe()}"


def test_serve_exits_on_sigterm_with_idle_client_connected(pg, workdir):
    p = Proxy(pg.port, workdir, "proxy-sigterm-busy").start()
    c = connect(p.dsn("postgres"))
    try:
        assert c.execute("select 1").fetchone()[0] == 1
        rc = p.stop(signal.SIGTERM, timeout=15)
        assert rc == 0, f"exit code {rc} on SIGTERM with a client connected\n{p.describe()}"
    finally:
        c.close()


def test_sigterm_lets_in_flight_work_finish_then_closes_with_57p01(pg, workdir):
    """Graceful shutdown: an idle session is closed at once with FATAL 57P01, a busy one
    gets its result first and is then closed with 57P01 at its idle point, and the proxy
    exits 0 only after that (each session relays on threads blocked in reads; shutdown
    has to reach them). Raw sockets, so every byte before the close is seen."""
    p = Proxy(pg.port, workdir, "proxy-drain").start()
    idle = pgraw.login(HOST, p.port, SUPERUSER, "postgres")
    busy = pgraw.login(HOST, p.port, SUPERUSER, "postgres")
    try:
        busy.send(pgraw.query("select pg_sleep(1.5), 42"))
        time.sleep(0.5)
        t0 = time.monotonic()
        rc = p.stop(signal.SIGTERM, timeout=15)
        assert rc == 0, f"exit code {rc}\n{p.describe()}"
        assert time.monotonic() - t0 >= 0.8, "the proxy exited before the in-flight query ended"
        got = {}
        for name, s in (("idle", idle), ("busy", busy)):
            got[name] = pgraw.split_messages(pgraw.read_until_eof(s.sock, 10))
        assert [t for t, _ in got["idle"]] == [b"E"], got["idle"]
        tags = [t for t, _ in got["busy"]]
        assert tags == [b"T", b"D", b"C", b"Z", b"E"], got["busy"]
        assert pgraw.decode_datarow(got["busy"][1][1])[1] == b"42"
        for name in ("idle", "busy"):
            err = pgraw.parse_error_fields(got[name][-1][1])
            assert (err["S"], err["C"]) == ("FATAL", "57P01"), err
            assert "shutting down" in err["M"], err
    finally:
        idle.sock.close()
        busy.sock.close()
        if p.alive():
            p.kill()


def test_audit_unknown_thread_is_empty(proxy):
    assert run_audit_cli(proxy.audit_db, "no-such-thread-anywhere") == []


def test_audit_missing_arguments_is_an_error():
    cp = subprocess.run([str(proxy_binary()), "audit"], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode != 0


def test_help_lists_subcommands():
    cp = subprocess.run([str(proxy_binary()), "--help"], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert "serve" in cp.stdout and "audit" in cp.stdout, cp.stdout
