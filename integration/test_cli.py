"""The command-line contract of `resumeguard serve` and `resumeguard audit`."""

from __future__ import annotations

import signal
import subprocess
from urllib.parse import urlparse

import psycopg

from conftest import SUPERUSER, Proxy, connect, proxy_binary, run_audit_cli


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
