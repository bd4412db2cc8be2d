"""TLS on both sides of the proxy.

Certificates are made here with the ``openssl`` CLI: a test CA signs the
proxy's certificate and the upstream server's (both for ``localhost`` and
127.0.0.1); a second, unrelated CA is the "wrong" one.

The upstream is a PostgreSQL of its own with ``ssl = on`` and a role,
``tls_scram``, admitted only over TLS with SCRAM (``hostssl`` ... and a
``hostnossl ... reject`` line). The proxy reaches it with
``sslmode=verify-full`` and terminates the clients' TLS with its own
certificate. psql, psycopg and node-postgres connect with
``sslmode=require`` and ``verify-full``; LangGraph parks and resumes through
TLS on both sides.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import pgraw as R
from conftest import (HOST, IS_ROOT, PSQL, REPO, SUPERUSER, PgServer, Proxy, connect,
                      make_dsn, pg_env)
from lg_scenarios import park, resume, setup_db

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core

TLS_USER = "tls_scram"
TLS_PASSWORD = "Tls-Secret-9"
CERT_USER = "tls_cert"
NODE_MODULES = REPO / "integration" / "js" / "node_modules"


def openssl(*args: str, cwd: Path) -> None:
    cp = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"openssl {' '.join(args)}:\n{cp.stderr}"


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
            "-subj", f"/CN=resumeguard test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d: Path, name: str, ca: str) -> None:
    (d / f"{name}.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
            "-extfile", f"{name}.ext", cwd=d)


def make_client_leaf(d: Path, user: str, ca: str) -> None:
    """A client certificate whose CN is the role it authenticates."""
    (d / f"{user}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                   "extendedKeyUsage=clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{user}.key", "-out", f"{user}.csr", "-subj", f"/CN={user}", cwd=d)
    openssl("x509", "-req", "-in", f"{user}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{user}.crt", "-days", "2", "-extfile", f"{user}.ext",
            cwd=d)


@pytest.fixture(scope="module")
def certs(workdir):
    d = workdir / "tls-certs"
    d.mkdir(exist_ok=True)
    make_ca(d, "ca")
    make_ca(d, "wrong_ca")
    make_leaf(d, "proxy", "ca")
    make_leaf(d, "server", "ca")
    make_client_leaf(d, CERT_USER, "ca")
    return d


def install_certs(server: PgServer, certs: Path, names: tuple[str, ...]) -> None:
    """Copies certificate and key files into the server's data directory, readable by
    the server only."""
    for name in names:
        shutil.copy(certs / name, server.datadir / name)
        os.chmod(server.datadir / name, 0o600)
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            os.chown(server.datadir / name, pw.pw_uid, pw.pw_gid)


@pytest.fixture(scope="module")
def tls_pg(certs):
    """A PostgreSQL with ssl = on; ``tls_scram`` only over TLS, with SCRAM."""
    server = PgServer("tls").start()
    install_certs(server, certs, ("server.crt", "server.key", "ca.crt"))
    with open(server.datadir / "postgresql.conf", "a") as f:
        f.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                "ssl_ca_file = 'ca.crt'\n")
    (server.datadir / "pg_hba.conf").write_text(
        "local all all trust\n"
        f"hostssl all {TLS_USER} 127.0.0.1/32 scram-sha-256\n"
        f"hostnossl all {TLS_USER} 127.0.0.1/32 reject\n"
        f"hostssl all {CERT_USER} 127.0.0.1/32 cert\n"
        f"host all {CERT_USER} 127.0.0.1/32 reject\n"
        "host all all 127.0.0.1/32 trust\n")
    with connect(server.dsn("postgres")) as c:
        c.execute("SELECT pg_reload_conf()")
        c.execute(f"CREATE ROLE {TLS_USER} LOGIN SUPERUSER PASSWORD '{TLS_PASSWORD}'")
        c.execute(f"CREATE ROLE {CERT_USER} LOGIN")
    yield server
    server.stop()


class TlsProxy(Proxy):
    """``resumeguard serve`` with an upstream URL of its own."""

    def __init__(self, upstream: str, workdir: Path, name: str, extra_args=()):
        super().__init__(0, workdir, name, tuple(extra_args))
        self.upstream = upstream

    @property
    def argv(self) -> list[str]:
        argv = super().argv
        argv[argv.index("--upstream") + 1] = self.upstream
        return argv


def upstream_url(port: int, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"postgres://localhost:{port}/postgres?{query}"


@pytest.fixture(scope="module")
def started(workdir):
    proxies: list[Proxy] = []

    def start(upstream: str, *extra: str, env: dict[str, str] | None = None) -> Proxy:
        p = TlsProxy(upstream, workdir, f"proxy-tls-{len(proxies) + 1}", extra)
        p.env.update(env or {})
        p.start()
        proxies.append(p)
        return p

    yield start
    for p in proxies:
        if not p.expected_down:
            was_alive = p.alive()
            assert was_alive and p.stop() == 0, p.describe()


@pytest.fixture(scope="module")
def tls_proxy(started, certs, tls_pg):
    """TLS towards clients (required) and verify-full towards tls_pg."""
    upstream = upstream_url(tls_pg.port, sslmode="verify-full", sslrootcert=certs / "ca.crt")
    return started(upstream, "--tls-cert", str(certs / "proxy.crt"),
                   "--tls-key", str(certs / "proxy.key"), "--require-tls")


def client_dsn(proxy: Proxy, certs: Path, sslmode: str, **params) -> str:
    """A TLS_USER DSN through `proxy`. SCRAM through a TLS-terminating proxy to
    a TLS server needs channel_binding=disable (see
    test_scram_channel_binding_through_the_proxy)."""
    params.setdefault("channel_binding", "disable")
    if sslmode.startswith("verify"):
        params["sslrootcert"] = str(certs / "ca.crt")
    return make_dsn(proxy.port, "postgres", TLS_USER, TLS_PASSWORD, sslmode=sslmode,
                    **params).replace(f"@{HOST}:", "@localhost:")


def upstream_ssl(conn: psycopg.Connection) -> bool:
    """Whether the server sees this session's connection (the proxy's) as TLS."""
    return conn.execute(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0]


@pytest.mark.parametrize("sslmode", ["require", "verify-full"])
def test_psql_through_tls_on_both_sides(tls_proxy, certs, sslmode):
    dsn = client_dsn(tls_proxy, certs, sslmode)
    cp = subprocess.run(
        [PSQL, dsn, "-X", "-A", "-t", "-c", r"\conninfo", "-c",
         "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"],
        capture_output=True, text=True, timeout=30, env=pg_env())
    assert cp.returncode == 0, cp.stderr + tls_proxy.describe()
    assert "SSL connection" in cp.stdout, cp.stdout
    assert cp.stdout.strip().endswith("t"), cp.stdout


@pytest.mark.parametrize("sslmode", ["require", "verify-full"])
def test_psycopg_through_tls_on_both_sides(tls_proxy, certs, sslmode):
    with connect(client_dsn(tls_proxy, certs, sslmode)) as c:
        assert c.pgconn.ssl_in_use
        assert upstream_ssl(c)
        assert c.execute("SELECT current_user").fetchone()[0] == TLS_USER


def test_direct_tls_negotiation(tls_proxy, certs):
    """PostgreSQL 17's sslnegotiation=direct: a ClientHello as the first bytes."""
    if psycopg.pq.version() < 170000:
        pytest.skip("libpq before 17 has no direct TLS")
    with connect(client_dsn(tls_proxy, certs, "verify-full", sslnegotiation="direct")) as c:
        assert c.pgconn.ssl_in_use and upstream_ssl(c)


@pytest.mark.parametrize("verify", [False, True])
def test_node_postgres_through_tls(tls_proxy, certs, verify):
    if not (NODE_MODULES / "pg").is_dir():
        pytest.skip("integration/js has no node_modules (npm ci)")
    ssl = ({"ca": (certs / "ca.crt").read_text(), "servername": "localhost"} if verify
           else {"rejectUnauthorized": False})
    script = """
const { Client } = require('pg');
const c = new Client(JSON.parse(process.argv[1]));
c.connect()
  .then(() => c.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
  .then(r => { console.log(JSON.stringify({ssl: r.rows[0].ssl, enc: c.connection.stream.encrypted === true})); return c.end(); })
  .catch(e => { console.error(e.message); process.exit(1); });
"""
    cfg = {"host": "localhost", "port": tls_proxy.port, "user": TLS_USER,
           "password": TLS_PASSWORD, "database": "postgres", "ssl": ssl}
    cp = subprocess.run(["node", "-e", script, json.dumps(cfg)], capture_output=True, text=True,
                        timeout=60, env={**os.environ, "NODE_PATH": str(NODE_MODULES)})
    assert cp.returncode == 0, cp.stderr + tls_proxy.describe()
    assert json.loads(cp.stdout) == {"ssl": True, "enc": True}


def test_plaintext_client_is_refused_when_tls_is_required(tls_proxy, certs):
    with pytest.raises(psycopg.OperationalError) as e:
        connect(client_dsn(tls_proxy, certs, "disable"))
    assert "TLS is required" in str(e.value)


@pytest.mark.parametrize("binding", ["require", "prefer"])
def test_scram_channel_binding_through_the_proxy(tls_proxy, tls_pg, certs, binding):
    """Straight to the server, channel binding works. Through the proxy it
    cannot: the client binds SCRAM-SHA-256-PLUS to the proxy's certificate,
    the server checks its own, and the binding is inside the SCRAM proof.
    A TLS client sees the server's offer as sent; when it starts
    SCRAM-SHA-256-PLUS (`require`, and libpq's default `prefer`) the proxy
    ends the login with its own FATAL 08004 saying why and what to set,
    rather than PostgreSQL's "SCRAM channel binding negotiation error" (the
    stock answer to `prefer` when the offer is withheld, shown here straight
    to the server with the offer withheld by a plaintext-only check below)."""
    direct = make_dsn(tls_pg.port, "postgres", TLS_USER, TLS_PASSWORD, sslmode="require",
                      channel_binding=binding)
    with connect(direct) as c:
        assert c.execute("SELECT 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError) as e:
        connect(client_dsn(tls_proxy, certs, "require", channel_binding=binding))
    msg = str(e.value)
    assert "FATAL:  resumeguard: channel binding cannot pass a TLS-terminating proxy" in msg, msg
    assert "HINT:" in msg and "channel_binding=disable" in msg, msg
    with connect(client_dsn(tls_proxy, certs, "require", channel_binding="disable")) as c:
        assert c.execute("SELECT 1").fetchone()[0] == 1


def test_node_postgres_asking_for_channel_binding_gets_the_proxys_answer(tls_proxy, tls_pg):
    """node-postgres with enableChannelBinding: straight to the server it binds;
    through the proxy the login ends with the proxy's 08004 naming the setting."""
    if not (NODE_MODULES / "pg").is_dir():
        pytest.skip("integration/js has no node_modules (npm ci)")
    script = """
const { Client } = require('pg');
const c = new Client(JSON.parse(process.argv[1]));
c.connect()
  .then(() => c.query("SELECT 1"))
  .then(() => { console.log(JSON.stringify({ok: true})); return c.end(); })
  .catch(e => { console.log(JSON.stringify({ok: false, code: e.code, message: e.message,
                                            hint: e.hint})); });
"""

    def node(port: int) -> dict:
        cfg = {"host": "localhost", "port": port, "user": TLS_USER, "password": TLS_PASSWORD,
               "database": "postgres", "ssl": {"rejectUnauthorized": False},
               "enableChannelBinding": True}
        cp = subprocess.run(["node", "-e", script, json.dumps(cfg)], capture_output=True,
                            text=True, timeout=60,
                            env={**os.environ, "NODE_PATH": str(NODE_MODULES)})
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)

    assert node(tls_pg.port) == {"ok": True}
    through = node(tls_proxy.port)
    assert through["ok"] is False and through["code"] == "08004", through
    assert "channel binding cannot pass a TLS-terminating proxy" in through["message"], through
    assert "enableChannelBinding: false" in through["hint"], through


def test_a_binding_sasl_start_gets_08004_and_never_reaches_the_server(tls_proxy, tls_pg):
    """On the wire: the TLS client is offered SCRAM-SHA-256-PLUS as the server
    sent it; its SASLInitialResponse for it is answered by the proxy with
    FATAL 08004, and the server never sees it (no failed login in its log)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    raw = socket.create_connection((HOST, tls_proxy.port), timeout=10)
    raw.sendall(R.ssl_request())
    assert R.recv_exact(raw, 1) == b"S"
    with ctx.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(R.startup_message(TLS_USER, "postgres"))
        tag, payload = R.read_message(sock)
        assert tag == b"R" and struct.unpack("!I", payload[:4])[0] == 10, (tag, payload)
        assert b"SCRAM-SHA-256-PLUS\x00" in payload[4:], payload
        data = b"p=tls-server-end-point,,n=,r=rg-test-nonce"
        sock.sendall(R.msg(b"p", R.cstr("SCRAM-SHA-256-PLUS") + struct.pack("!i", len(data))
                           + data))
        messages = R.split_messages(R.read_until_eof(sock))
    errors = [R.parse_error_fields(p) for t, p in messages if t == b"E"]
    assert len(errors) == 1, messages
    assert errors[0]["S"] == "FATAL" and errors[0]["C"] == "08004", errors
    assert "channel_binding=disable" in errors[0]["H"], errors
    log = tls_pg.logfile.read_text(errors="replace")
    assert "rg-test-nonce" not in log and "channel binding" not in log, log[-2000:]


def test_plaintext_client_of_a_tls_upstream_uses_scram(started, certs, tls_pg):
    """A proxy with no client TLS in front of a TLS server: the server offers
    SCRAM-SHA-256-PLUS to the proxy's TLS connection, which a plaintext client
    must refuse ("server offered SCRAM-SHA-256-PLUS authentication over a
    non-SSL connection"). The list reaches every client without it, so the
    client's default (channel_binding=prefer) authenticates with plain SCRAM."""
    upstream = upstream_url(tls_pg.port, sslmode="verify-full", sslrootcert=certs / "ca.crt")
    p = started(upstream)
    dsn = make_dsn(p.port, "postgres", TLS_USER, TLS_PASSWORD, sslmode="disable")
    with connect(dsn) as c:
        assert not c.pgconn.ssl_in_use
        assert upstream_ssl(c)
        assert c.execute("SELECT current_user").fetchone()[0] == TLS_USER


def plain_claims(pg) -> dict[str, str]:
    """The claims kept on the plaintext server: a claims connection refusing the
    upstream's certificate would stop `serve` at start (test_tls_verify.py)."""
    return {"RESUMEGUARD_CLAIMS_DSN":
            f"postgres://{SUPERUSER}@{HOST}:{pg.port}/postgres?sslmode=disable"}


def test_wrong_upstream_ca_is_refused_clearly(started, certs, tls_pg, pg):
    upstream = upstream_url(tls_pg.port, sslmode="verify-full",
                            sslrootcert=certs / "wrong_ca.crt")
    p = started(upstream, env=plain_claims(pg))
    with pytest.raises(psycopg.OperationalError) as e:
        connect(make_dsn(p.port, "postgres", TLS_USER, TLS_PASSWORD, sslmode="disable"))
    msg = str(e.value)
    assert "cannot reach the upstream server" in msg and "TLS handshake" in msg, msg
    assert "UnknownIssuer" in msg or "unknown issuer" in msg.lower(), msg


def test_wrong_client_ca_is_refused_by_the_client(tls_proxy, certs):
    dsn = client_dsn(tls_proxy, certs, "verify-full").replace(
        str(certs / "ca.crt").replace("/", "%2F"), str(certs / "wrong_ca.crt").replace("/", "%2F"))
    assert "wrong_ca" in dsn
    with pytest.raises(psycopg.OperationalError) as e:
        connect(dsn)
    assert "certificate verify failed" in str(e.value)


def test_required_tls_on_a_plaintext_server_fails_the_session(started, pg):
    p = started(upstream_url(pg.port, sslmode="require"), env=plain_claims(pg))
    with pytest.raises(psycopg.OperationalError) as e:
        connect(make_dsn(p.port, "postgres", sslmode="disable"))
    assert "does not accept TLS (sslmode=require requires it)" in str(e.value)
    # prefer goes on in plaintext.
    q = started(upstream_url(pg.port, sslmode="prefer"))
    with connect(make_dsn(q.port, "postgres", sslmode="disable")) as c:
        assert c.execute("SELECT 1").fetchone()[0] == 1


@pytest.mark.parametrize("args, expect", [
    (("--upstream", "postgres://localhost:5432/x?sslmode=verify_full"), "verify_full"),
    (("--upstream", "postgres://localhost:5432/x?sslmode=verify-ca&sslrootcert=/nonexistent.crt"),
     "/nonexistent.crt"),
    (("--upstream", "postgres://localhost:5432/x?sslcrl=/x.crl"), "sslcrl"),
    (("--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"), "/nonexistent.crt"),
    (("--require-tls",), "needs a certificate"),
])
def test_a_tls_setting_that_cannot_be_honoured_stops_the_proxy(workdir, args, expect):
    argv = [*TlsProxy("127.0.0.1:1", workdir, "refused").argv, *args]
    if args[0] == "--upstream":
        i = argv.index("--upstream")
        del argv[i:i + 2]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=workdir,
                        stdin=subprocess.DEVNULL)
    assert cp.returncode != 0
    assert expect in cp.stderr, cp.stderr


def test_langgraph_park_and_resume_over_tls(tls_proxy, certs, tls_pg):
    db = f"rg_tls_{uuid.uuid4().hex[:8]}"
    with connect(tls_pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    dsn = client_dsn(tls_proxy, certs, "verify-full").replace("/postgres?", f"/{db}?")
    setup_db("conn", dsn)
    thread = f"tls-{uuid.uuid4().hex[:8]}"
    parked = park("conn", dsn, thread)
    assert parked["state"]["next"], parked
    resumed = resume("conn", dsn, thread, True)
    assert resumed["gate_effects"], resumed
    with connect(dsn) as c:
        assert upstream_ssl(c)
    # The proxy's own connections (the claims store in the upstream, its
    # liveness lock) take the upstream's TLS settings too.
    with connect(tls_pg.dsn("postgres")) as c:
        own = c.execute(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s "
            "USING (pid) WHERE a.application_name LIKE 'resumeguard-claims%'").fetchall()
        claims = c.execute("SELECT count(*) FROM resumeguard.claims WHERE thread_id = %s",
                           (thread,)).fetchone()[0]
    assert own and all(ssl for _, ssl in own), own
    assert claims >= 1


def test_cancel_request_over_tls_on_both_sides(tls_proxy, certs):
    """libpq 17+ sends its CancelRequest over TLS when the session uses it; the
    proxy forwards it over its own TLS connection to the server."""
    errors: list[Exception] = []

    def cancel(conn):
        # The cancel connection must end cleanly: libpq with OpenSSL 3 reports
        # an end-of-file without close_notify as a failed cancellation.
        try:
            conn.cancel_safe()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with connect(client_dsn(tls_proxy, certs, "verify-full")) as c:
        timer = threading.Timer(1.0, cancel, (c,))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            c.execute("SELECT pg_sleep(20)")
        timer.join()
        assert not errors, errors
        assert time.monotonic() - t0 < 10
        assert c.execute("SELECT 1").fetchone()[0] == 1


def test_upstream_client_certificate_from_the_config_file(started, certs, tls_pg, workdir):
    """`[upstream_tls]` in the TOML file: the proxy presents its client
    certificate, and the server's `cert` authentication admits the role it names;
    `[tls]` there too."""
    config = workdir / "tls-config.toml"
    config.write_text(
        f"[tls]\ncert = '{certs / 'proxy.crt'}'\nkey = '{certs / 'proxy.key'}'\nrequire = true\n"
        f"[upstream_tls]\nsslmode = 'verify-full'\nsslrootcert = '{certs / 'ca.crt'}'\n"
        f"sslcert = '{certs / (CERT_USER + '.crt')}'\nsslkey = '{certs / (CERT_USER + '.key')}'\n")
    p = started(f"localhost:{tls_pg.port}", "--config", str(config))
    dsn = make_dsn(p.port, "postgres", CERT_USER, sslmode="require")
    with connect(dsn) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == CERT_USER
        assert upstream_ssl(c)
    with pytest.raises(psycopg.OperationalError) as e:
        connect(make_dsn(p.port, "postgres", CERT_USER, sslmode="disable"))
    assert "TLS is required" in str(e.value)


def test_negotiation_edges_with_tls_on(tls_proxy):
    """GSSENCRequest is still answered 'N'; plaintext sent after SSLRequest,
    before the 'S', is refused in plaintext; an SSLRequest with no certificate
    configured is answered 'N' (test_robustness)."""
    with socket.create_connection((HOST, tls_proxy.port), timeout=5) as s:
        s.sendall(struct.pack("!II", 8, 80877104))
        assert s.recv(1) == b"N"
    with socket.create_connection((HOST, tls_proxy.port), timeout=5) as s:
        s.sendall(struct.pack("!II", 8, 80877103) + b"Q\0\0\0\x05x")
        reply = s.recv(4096)
    assert reply[:1] == b"E" and b"received unencrypted data after an encryption request" in reply


def test_large_values_both_ways_over_tls(tls_proxy, certs):
    """Many TLS records each way: a 16 MB parameter in, 24 MB of rows out."""
    big = "x" * (16 << 20)
    with connect(client_dsn(tls_proxy, certs, "require")) as c:
        # A first small query: the relay reads a session's first message
        # after authentication against the pre-authentication size limit.
        c.execute("SELECT 1")
        assert c.execute("SELECT length(%s::text)", (big,)).fetchone()[0] == len(big)
        rows = c.execute("SELECT repeat(md5(g::text), 1000) FROM generate_series(1, 750) g").fetchall()
        assert len(rows) == 750 and all(len(r[0]) == 32_000 for r in rows)


def tls_half_closed(port: int, data: bytes, close_notify: bool) -> bytes:
    """SSLRequest, a TLS handshake, `data`, then the client's end: a
    close_notify with the TCP connection left open, or a bare TCP half-close
    with no close_notify. The plaintext read until the peer closes."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.sendall(R.ssl_request())
    assert R.recv_exact(sock, 1) == b"S"
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")

    def send_pending():
        pending = outgoing.read()
        if pending:
            sock.sendall(pending)

    def receive() -> bool:
        chunk = sock.recv(65536)
        if not chunk:
            incoming.write_eof()
        else:
            incoming.write(chunk)
        return bool(chunk)

    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            send_pending()
            assert receive(), "closed during the TLS handshake"
    send_pending()
    tls.write(data)
    send_pending()
    if close_notify:
        try:
            tls.unwrap()
        except ssl.SSLWantReadError:
            pass
        send_pending()
    else:
        sock.shutdown(socket.SHUT_WR)
    plain = b""
    while True:
        try:
            chunk = tls.read(65536)
        except ssl.SSLWantReadError:
            if not receive():
                break
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
        else:
            if not chunk:  # the peer's close_notify
                break
            plain += chunk
    sock.close()
    return plain


@pytest.mark.parametrize("close_notify", [True, False], ids=["close_notify", "bare-fin"])
def test_a_half_closed_tls_client_gets_every_answer(tls_proxy, tls_pg, close_notify):
    """The half-close of test_session_edges over TLS on both sides: the client
    ends its TLS stream after a query; the proxy passes the end on (close_notify
    and a half-close towards the TLS server) and relays every answer, as
    PostgreSQL answers a TLS client of its own."""
    data = (R.startup_message(SUPERUSER, "postgres")
            + R.query("select 1 as a; select generate_series(1, 3)"))
    answers = {}
    for target, port in (("direct", tls_pg.port), ("proxy", tls_proxy.port)):
        msgs = R.split_messages(tls_half_closed(port, data, close_notify))
        answers[target] = [(t, b"<key>" if t == b"K" else p) for t, p in msgs]
    tags = [t for t, _ in answers["direct"]]
    assert tags[-1] == b"Z" and tags.count(b"D") == 4, tags
    assert answers["proxy"] == answers["direct"]
