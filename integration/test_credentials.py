"""The proxy's own credential for its claims database, against a password-protected
PostgreSQL 15 (scram-sha-256 on every TCP line, no trust; the test administers it over
its Unix socket), with real LangGraph through ``resumeguard serve``:

- no credential: ``serve`` exits 1 within 10 s with one line naming the missing
  password and where to give it; a wrong password, a database that does not exist and
  a role that may not create the ``resumeguard`` schema likewise, each naming its fix
  (the last is then mended by the administrator's snippet of docs/operations.md); the
  audit table's database is checked the same way when no claims store checks it;
- ``PGPASSWORD``: a parked LangGraph read is served (resumed once), and the printed
  ``DATABASE_URL`` names the upstream's user and database at the proxy's address;
- a ``[claims] password_file`` re-read at each connect: the password rotated on the
  server and in the file, the proxy's claims connections ended
  (``pg_terminate_backend``), the next parked read is served with no restart;
- a ``[claims] password_command`` run at each connect (it counts its calls): a token
  rotated on the server and in what the command prints is picked up the same way;
- an unreachable claims database: ``serve`` starts, ``/readyz`` is 503 naming the
  cause and a parked read is refused 58000 with a HINT about the claims database,
  then ``/readyz`` is 200 once the database is up;
- an upstream typo (``postgres//127.0.0.1:57301``) is refused, naming the text.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

import lg_scenarios as L
from conftest import HOST, SUPERUSER, PgServer, Proxy, free_port, make_dsn, proxy_binary

PASSWORD_1 = "first-Secret-1"
PASSWORD_2 = "rotated-Secret-2"
STARTUP_FAILS_WITHIN = 10.0
# No ambient credential reaches the proxy unless a test gives one.
NO_AMBIENT = {"PGPASSFILE": "/nonexistent/pgpass", "PGPASSWORD": ""}


class LockedPg:
    """A PgServer whose TCP lines all ask for a scram-sha-256 password."""

    def __init__(self):
        self.server = PgServer("creds").start()
        self.port = self.server.port
        self.socket_dir = str(self.server.tmp)
        self.admin("postgres", f"ALTER ROLE {SUPERUSER} PASSWORD '{PASSWORD_1}'")
        hba = self.server.datadir / "pg_hba.conf"
        hba.write_text("local all all trust\n"
                       f"host all all {HOST}/32 scram-sha-256\n")
        self.admin("postgres", "SELECT pg_reload_conf()")
        self.password = PASSWORD_1

    def admin(self, db: str, sql: str, params=None):
        """Runs `sql` as the superuser over the Unix socket (trust)."""
        with psycopg.connect(host=self.socket_dir, port=self.port, user=SUPERUSER, dbname=db,
                             autocommit=True, connect_timeout=10) as c:
            cur = c.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def rotate(self, password: str) -> None:
        self.admin("postgres", f"ALTER ROLE {SUPERUSER} PASSWORD '{password}'")
        self.password = password

    def url(self, db: str, user: str = SUPERUSER) -> str:
        """The upstream as a user gives it: no password."""
        return f"postgres://{user}@{HOST}:{self.port}/{db}"

    def end_claims_connections(self) -> int:
        rows = self.admin("postgres",
                          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                          "WHERE application_name LIKE 'resumeguard-claims%'")
        return int(rows[0][0])


@pytest.fixture(scope="module")
def locked():
    pg = LockedPg()
    pg.admin("postgres", "CREATE DATABASE app")
    L.setup_db("conn", make_dsn(pg.port, "app", password=PASSWORD_1))
    yield pg
    pg.server.stop()


def serve_argv(upstream: str, workdir: Path, *extra: str) -> list[str]:
    return [str(proxy_binary()), "serve", "--listen", f"{HOST}:{free_port()}",
            "--upstream", upstream, "--audit-db", str(workdir / f"a-{uuid.uuid4().hex[:6]}.db"),
            "--admin-listen", "off", *extra]


def failed_start(argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """Runs `serve` expecting it to stop at start: exit code, stderr, seconds taken."""
    full = dict(os.environ)
    full.update(NO_AMBIENT)
    full.update(env)
    began = time.monotonic()
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=60, env=full)
    return cp.returncode, cp.stderr, time.monotonic() - began


def last_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def start_proxy(locked: LockedPg, workdir: Path, env: dict[str, str], *extra: str,
                upstream: str | None = None) -> Proxy:
    name = f"creds-{uuid.uuid4().hex[:6]}"
    return Proxy(locked.port, workdir / name, name=name, upstream=upstream or locked.url("app"),
                 extra_args=extra, env={**NO_AMBIENT, **env}).start()


def parked(proxy: Proxy, password: str) -> str:
    thread = f"creds-{uuid.uuid4().hex[:8]}"
    L.park("conn", proxy.dsn("app", password=password), thread)
    return thread


def assert_resumed_once(res: dict) -> None:
    """The resume was served: the gated node answered and the graph ran to its end."""
    assert res["result"].get("approved") is True, res
    assert res["result"]["items"] == ["prep", "gate:True", "after"], res


# ----------------------------------------------------------------- permanent faults
def test_no_credential_stops_serve_naming_the_password_and_where_to_give_it(locked, workdir):
    code, stderr, took = failed_start(serve_argv(locked.url("app"), workdir), {})
    line = last_line(stderr)
    assert code == 1, stderr
    assert took < STARTUP_FAILS_WITHIN, f"took {took:.1f}s\n{stderr}"
    assert "password missing" in line, line
    for where in ("PGPASSWORD", "password_file", "password_command"):
        assert where in line, line


def test_the_audit_tables_database_is_checked_when_no_claims_store_checks_it(locked, workdir):
    conf = workdir / f"audit-{uuid.uuid4().hex[:6]}.toml"
    conf.write_text("[enforce]\nconsume_once = false\n[audit]\npostgres = true\n")
    code, stderr, took = failed_start(serve_argv(locked.url("app"), workdir, "--config",
                                                 str(conf)), {})
    line = last_line(stderr)
    assert code == 1, stderr
    assert took < STARTUP_FAILS_WITHIN, f"took {took:.1f}s\n{stderr}"
    assert "[audit] postgres" in line and "password missing" in line, line


@pytest.mark.parametrize("case", ["wrong password", "no such database"])
def test_other_permanent_faults_stop_serve_with_their_fix(locked, workdir, case):
    if case == "wrong password":
        upstream, env, cause, fix = locked.url("app"), {"PGPASSWORD": "wrong"}, \
            "password authentication failed", "current password"
    else:
        upstream, env, cause, fix = locked.url("nodb"), {"PGPASSWORD": locked.password}, \
            '"nodb" does not exist', "name an existing one"
    code, stderr, took = failed_start(serve_argv(upstream, workdir), env)
    line = last_line(stderr)
    assert code == 1, stderr
    assert took < STARTUP_FAILS_WITHIN, f"took {took:.1f}s\n{stderr}"
    assert cause in line and fix in line, line


def test_a_role_that_may_not_create_the_schema_stops_serve_until_the_admin_snippet_ran(
        locked, workdir):
    db = f"app_limited_{uuid.uuid4().hex[:6]}"
    role = f"rg_{uuid.uuid4().hex[:6]}"
    locked.admin("postgres", f"CREATE DATABASE {db}")
    locked.admin("postgres", f"CREATE ROLE {role} LOGIN PASSWORD 'limited-Pw-3'")
    conf = workdir / f"{role}.toml"
    conf.write_text(
        f'[claims]\ndsn = "postgres://{role}:limited-Pw-3@{HOST}:{locked.port}/{db}"\n')
    argv = serve_argv(locked.url("app"), workdir, "--config", str(conf))
    code, stderr, _ = failed_start(argv, {})
    line = last_line(stderr)
    assert code == 1, stderr
    assert "permission denied" in line and "schema resumeguard" in line, line
    assert "docs/operations.md" in line, line
    # The administrator's one-time snippet (docs/operations.md), then the same start.
    locked.admin(db, f"CREATE SCHEMA resumeguard AUTHORIZATION {role}")
    proxy = start_proxy(locked, workdir, {}, "--config", str(conf))
    try:
        status, body = get(f"{proxy.admin_url()}/readyz")
        assert status == 200, body
        tables = locked.admin(db, "SELECT count(*) FROM pg_tables WHERE schemaname = "
                                  "'resumeguard' AND tableowner = %s", (role,))
        assert tables[0][0] >= 3, tables
    finally:
        assert proxy.stop() == 0


# ----------------------------------------------------------------- credentials per connect
def test_pgpassword_serves_parked_reads_and_database_url_is_the_upstreams(locked, workdir):
    proxy = start_proxy(locked, workdir, {"PGPASSWORD": locked.password},
                        upstream=f"postgres://{SUPERUSER}@{HOST}:{locked.port}/app?sslmode=disable")
    try:
        assert proxy.database_url() == f"postgres://{SUPERUSER}@{HOST}:{proxy.port}/app"
        thread = parked(proxy, locked.password)
        assert_resumed_once(L.resume("conn", proxy.dsn("app", password=locked.password), thread))
    finally:
        assert proxy.stop() == 0


def test_a_rotated_password_file_is_read_at_the_next_connect(locked, workdir):
    pwfile = workdir / f"pw-{uuid.uuid4().hex[:6]}"
    pwfile.write_text(locked.password + "\n")
    proxy = start_proxy(locked, workdir,
                        {"RESUMEGUARD_CLAIMS_PASSWORD_FILE": str(pwfile)})
    try:
        thread = parked(proxy, locked.password)
        old = locked.password
        new = PASSWORD_2 if old != PASSWORD_2 else PASSWORD_1
        locked.rotate(new)
        pwfile.write_text(new + "\n")
        assert locked.end_claims_connections() >= 1
        # Served: the claims connections that decided it were opened with the
        # file's new password (the old one no longer opens any).
        assert_resumed_once(L.resume("conn", proxy.dsn("app", password=new), thread))
    finally:
        assert proxy.stop() == 0


def test_a_password_command_mints_the_password_at_each_connect(locked, workdir):
    token = workdir / f"token-{uuid.uuid4().hex[:6]}"
    calls = workdir / f"calls-{uuid.uuid4().hex[:6]}"
    token.write_text(locked.password)
    script = workdir / f"mint-{uuid.uuid4().hex[:6]}.sh"
    script.write_text(f"#!/bin/sh\necho call >> {calls}\ncat {token}\n")
    script.chmod(0o755)
    proxy = start_proxy(locked, workdir, {"RESUMEGUARD_CLAIMS_PASSWORD_COMMAND": str(script)})
    try:
        thread = parked(proxy, locked.password)
        before = len(calls.read_text().splitlines())
        assert before >= 1
        fresh = f"token-{uuid.uuid4().hex[:10]}"
        locked.rotate(fresh)
        token.write_text(fresh)
        assert locked.end_claims_connections() >= 1
        assert_resumed_once(L.resume("conn", proxy.dsn("app", password=fresh), thread))
        assert len(calls.read_text().splitlines()) > before
        assert fresh not in proxy.describe(400), "the token appears in the proxy's output"
    finally:
        assert proxy.stop() == 0


# ----------------------------------------------------------------- transient faults
def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_an_unreachable_claims_database_starts_not_ready_then_ready(locked, workdir):
    later = PgServer("creds-later")
    conf = workdir / f"later-{uuid.uuid4().hex[:6]}.toml"
    conf.write_text(f'[claims]\ndsn = "postgres://{SUPERUSER}@{HOST}:{later.port}/postgres"\n')
    proxy = start_proxy(locked, workdir, {"PGPASSWORD": locked.password}, "--config", str(conf))
    try:
        admin = proxy.admin_url()
        status, body = get(f"{admin}/readyz")
        assert status == 503, body
        error = body["claims_store"]["error"]
        assert f"{HOST}:{later.port}" in error and "refused" in error.lower(), body
        # Meanwhile a parked read is refused, fail closed, with a HINT about the
        # claims database (not a store file).
        # (The park's own get_state is that read.)
        with pytest.raises(psycopg.Error) as refused:
            parked(proxy, locked.password)
        assert refused.value.sqlstate == "58000", refused.value
        hint = refused.value.diag.message_hint or ""
        assert "claims database" in hint and "claim store file" not in hint, hint
        later.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = get(f"{admin}/readyz")
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, body
    finally:
        assert proxy.stop() == 0
        later.stop()


# ----------------------------------------------------------------- URLs
def test_an_upstream_typo_is_refused_naming_the_text(workdir):
    typo = "postgres//127.0.0.1:57301"
    code, stderr, took = failed_start(serve_argv(typo, workdir), {})
    assert code == 1, stderr
    assert took < STARTUP_FAILS_WITHIN
    assert typo in last_line(stderr), stderr
    # `config check` refuses it the same way.
    code, stderr, _ = failed_start([str(proxy_binary()), "config", "check", "--upstream", typo],
                                   {})
    assert code == 1 and typo in last_line(stderr), stderr
