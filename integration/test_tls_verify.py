"""The upstream's certificate checked as libpq checks it, on both of the
proxy's paths to the server: the data path (each client session's server
connection) and the claims path (the proxy's own connections for the
consume-once claims and the audit, here on the same upstream).

The server's certificate is an ordinary self-signed one made by ``openssl
req -x509`` (which marks it CA:TRUE), for ``localhost`` only, and that same
file is the ``sslrootcert``. libpq's ``psql`` accepts it under verify-full
when it connects to ``localhost`` and refuses it when it connects to
``127.0.0.1``; the proxy does the same on both paths, and its errors name
the problem. ``/readyz`` looks at the upstream as a session would: a server
that answers TCP but fails TLS is not ready. A certificate the claims path
refuses is a permanent fault: ``serve`` stops at start naming it (the data
path's checks keep their claims on a connection of their own). A ``[claims]
dsn`` takes the same URL forms and TLS modes as the upstream, checked by the
same verifier.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from conftest import (HOST, IS_ROOT, PSQL, SUPERUSER, PgServer, connect, free_port, make_dsn,
                      pg_env, proxy_binary)
from test_tls import TlsProxy, openssl

CLAIMS_APP = "resumeguard-claims"


@pytest.fixture(scope="module")
def self_signed(workdir) -> Path:
    """server.crt / server.key: self-signed (CA:TRUE), for localhost only."""
    d = workdir / "tls-self-signed"
    d.mkdir(exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "server.key", "-out", "server.crt", "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", cwd=d)
    text = subprocess.run(["openssl", "x509", "-in", d / "server.crt", "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "CA:TRUE" in text, text
    return d


@pytest.fixture(scope="module")
def ss_pg(self_signed):
    """A PostgreSQL serving the self-signed certificate; everyone trusted."""
    server = PgServer("tls-self-signed").start()
    for name in ("server.crt", "server.key"):
        shutil.copy(self_signed / name, server.datadir / name)
        os.chmod(server.datadir / name, 0o600)
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            os.chown(server.datadir / name, pw.pw_uid, pw.pw_gid)
    with open(server.datadir / "postgresql.conf", "a") as f:
        f.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    with connect(server.dsn("postgres")) as c:
        c.execute("SELECT pg_reload_conf()")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def started(workdir):
    proxies = []

    def start(upstream: str, env: dict[str, str] | None = None) -> TlsProxy:
        p = TlsProxy(upstream, workdir, f"proxy-verify-{len(proxies) + 1}")
        p.env.update(env or {})
        p.start()
        proxies.append(p)
        return p

    yield start
    for p in proxies:
        if not p.expected_down:
            assert p.alive() and p.stop() == 0, p.describe()


def verify_full(host: str, port: int, root: Path) -> str:
    return (f"postgres://{SUPERUSER}@{host}:{port}/postgres"
            f"?sslmode=verify-full&sslrootcert={root}")


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run([PSQL, dsn, "-X", "-A", "-t", "-c", sql], capture_output=True,
                          text=True, timeout=60, env=pg_env())


def readyz(proxy: TlsProxy) -> tuple[int, dict]:
    url = proxy.admin_url()
    assert url, proxy.describe()
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def claims_ssl(server: PgServer) -> list[bool]:
    """Whether each of the proxy's claims connections to `server` is TLS."""
    with connect(server.dsn("postgres")) as c:
        return [r[0] for r in c.execute(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.application_name = %s", (CLAIMS_APP,)).fetchall()]


def eventually(what, timeout: float = 60.0):
    """`what()` once it is truthy, polled (a loaded machine is slow)."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_self_signed_root_is_served_on_both_paths_as_psql_accepts_it(started, ss_pg,
                                                                      self_signed):
    root = self_signed / "server.crt"
    direct = psql(verify_full("localhost", ss_pg.port, root),
                  "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    assert direct.returncode == 0 and direct.stdout.strip() == "t", direct.stderr

    p = started(verify_full("localhost", ss_pg.port, root))
    # The data path: a session through the proxy reaches the server over TLS.
    through = psql(make_dsn(p.port, "postgres", sslmode="disable"),
                   "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    assert through.returncode == 0, through.stderr + p.describe()
    assert through.stdout.strip() == "t", through.stdout
    # The claims path: the store answers, over TLS.
    status, body = eventually(lambda: (r := readyz(p))[0] == 200 and r, 60) or readyz(p)
    assert status == 200, (body, p.describe())
    assert body["upstream"]["ok"] and body["claims_store"]["ok"], body
    assert eventually(lambda: claims_ssl(ss_pg)), p.describe()
    assert all(claims_ssl(ss_pg)), claims_ssl(ss_pg)


def serve_fails(upstream: str, workdir: Path, env: dict[str, str] | None = None
                ) -> tuple[int, str, float]:
    """Runs `serve` expecting it to stop at start: exit code, stderr, seconds taken."""
    argv = [str(proxy_binary()), "serve", "--listen", f"{HOST}:{free_port()}",
            "--upstream", upstream, "--audit-db", str(workdir / f"a-{free_port()}.db"),
            "--admin-listen", "off"]
    began = time.monotonic()
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=120, env={**os.environ, **(env or {})})
    return cp.returncode, cp.stderr, time.monotonic() - began


def test_a_wrong_host_name_is_refused_on_both_paths_naming_it(started, ss_pg, self_signed,
                                                             workdir):
    root = self_signed / "server.crt"
    direct = psql(verify_full("127.0.0.1", ss_pg.port, root), "SELECT 1")
    assert direct.returncode != 0, direct.stdout
    assert 'does not match host name "127.0.0.1"' in direct.stderr, direct.stderr
    named = 'does not match the host name "127.0.0.1"'

    # The claims path (here the upstream's): a certificate refusal is no outage
    # to wait out, so `serve` stops at start naming it and what to set, without
    # retrying it as if a reaper had ended the connection.
    code, err, took = serve_fails(verify_full("127.0.0.1", ss_pg.port, root), workdir)
    assert code == 1, err
    assert named in err and "valid for localhost" in err, err
    assert "sslrootcert" in err and "[claims] dsn" in err, err
    assert "ended by the server" not in err, err
    assert took < 60, took

    # The data path, its claims kept over a verified connection of their own:
    # the session's error names it, and /readyz is 503 for the upstream only.
    p = started(verify_full("127.0.0.1", ss_pg.port, root),
                env={"RESUMEGUARD_CLAIMS_DSN": verify_full("localhost", ss_pg.port, root)})
    with pytest.raises(psycopg.OperationalError) as e:
        connect(make_dsn(p.port, "postgres", sslmode="disable"))
    assert named in str(e.value) and "valid for localhost" in str(e.value), str(e.value)
    status, body = readyz(p)
    assert status == 503, body
    assert named in body["upstream"]["error"], body
    assert body["claims_store"]["ok"], body


def test_readyz_is_503_when_the_upstream_answers_tcp_but_fails_tls(started, ss_pg, pg,
                                                                  self_signed, workdir):
    # A server whose certificate is not the root given: TCP accepts, TLS fails.
    # (The claims are kept elsewhere: on this upstream they would stop `serve`.)
    other = workdir / "tls-other-root"
    other.mkdir(exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "other.key", "-out", "other.crt", "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", cwd=other)
    plain_claims = {"RESUMEGUARD_CLAIMS_DSN":
                    f"postgres://{SUPERUSER}@localhost:{pg.port}/postgres?sslmode=disable"}
    p = started(verify_full("localhost", ss_pg.port, other / "other.crt"), env=plain_claims)
    status, body = readyz(p)
    assert status == 503, body
    assert body["upstream"]["ok"] is False, body
    assert "self-signed and is not one of the roots" in body["upstream"]["error"], body
    assert "other.crt" in body["upstream"]["error"], body

    # A server without TLS under sslmode=require.
    q = started(f"postgres://{SUPERUSER}@localhost:{pg.port}/postgres?sslmode=require",
                env=plain_claims)
    status, body = readyz(q)
    assert status == 503, body
    assert "does not accept TLS" in body["upstream"]["error"], body


def test_a_claims_dsn_verifies_as_the_upstream_does(started, ss_pg, pg, self_signed, workdir):
    """`[claims] dsn` takes the upstream's URL forms and TLS modes: verify-full
    against the self-signed certificate given as sslrootcert is served (the
    claims connections are TLS), a wrong host name stops `serve` naming it,
    and sslrootcert=system reads the operating system's store."""
    root = self_signed / "server.crt"
    plain = f"{HOST}:{pg.port}"
    p = started(plain, env={"RESUMEGUARD_CLAIMS_DSN": verify_full("localhost", ss_pg.port, root)})
    status, body = eventually(lambda: (r := readyz(p))[0] == 200 and r, 60) or readyz(p)
    assert status == 200, (body, p.describe())
    assert eventually(lambda: claims_ssl(ss_pg)), p.describe()
    assert all(claims_ssl(ss_pg)), claims_ssl(ss_pg)

    code, err, _ = serve_fails(plain, workdir, {
        "RESUMEGUARD_CLAIMS_DSN": verify_full("127.0.0.1", ss_pg.port, root)})
    assert code == 1, err
    assert 'does not match the host name "127.0.0.1"' in err, err
    assert "valid for localhost" in err, err

    system = (f"postgres://{SUPERUSER}@localhost:{ss_pg.port}/postgres"
              "?sslrootcert=system")
    q = started(plain, env={"RESUMEGUARD_CLAIMS_DSN": system,
                            "SSL_CERT_FILE": str(root), "SSL_CERT_DIR": str(workdir)})
    status, body = eventually(lambda: (r := readyz(q))[0] == 200 and r, 60) or readyz(q)
    assert status == 200, (body, q.describe())
    # A system store without the server's certificate: refused, naming it.
    unrelated = workdir / "tls-unrelated"
    unrelated.mkdir(exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=unrelated", cwd=unrelated)
    code, err, _ = serve_fails(plain, workdir, {
        "RESUMEGUARD_CLAIMS_DSN": system, "SSL_CERT_FILE": str(unrelated / "ca.crt"),
        "SSL_CERT_DIR": str(unrelated)})
    assert code == 1, err
    assert "self-signed and is not one of the roots in the system's trust store" in err, err


def test_the_system_store_is_the_default_and_sslrootcert_system_names_it(started, ss_pg,
                                                                         self_signed, workdir):
    """Without sslrootcert, and with sslrootcert=system, the roots are the
    operating system's store as OpenSSL finds it (here SSL_CERT_FILE naming
    the server's own certificate, as an operator's bundle would hold its
    CA). With system, only verify-full is allowed, as in libpq."""
    env = {"SSL_CERT_FILE": str(self_signed / "server.crt"), "SSL_CERT_DIR": str(workdir)}
    plain = f"postgres://{SUPERUSER}@localhost:{ss_pg.port}/postgres"
    for query in ("?sslmode=verify-full", "?sslrootcert=system"):
        p = TlsProxy(plain + query, workdir, f"proxy-system-{len(query)}")
        p.env.update(env)
        p.start()
        try:
            through = psql(make_dsn(p.port, "postgres", sslmode="disable"),
                           "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert through.returncode == 0, through.stderr + p.describe()
            assert through.stdout.strip() == "t", through.stdout
        finally:
            assert p.stop() == 0, p.describe()
    # verify-ca with the system's roots stops the proxy at start, naming why.
    cp = subprocess.run(
        [str(proxy_binary()), "config", "check", "--upstream",
         plain + "?sslmode=verify-ca&sslrootcert=system"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert cp.returncode != 0, cp.stdout
    assert "sslmode=verify-ca may not be used with sslrootcert=system" in cp.stderr, cp.stderr
