"""SIGHUP reloads the configuration file and the files it names, without
dropping a session: the rules directory (saver profiles, channel rules), the
certificate and key the proxy shows its clients, the JSONL audit file.

* A channel rule added while a LangGraph saver keeps its connection open: the
  write it accepted before the SIGHUP is refused after it (23514), on that
  same connection and on new ones.
* A rule file that does not load: the SIGHUP is logged at ERROR with the
  file, counted as failed in /metrics, and the rules in effect stay in effect.
* The client certificate rotated to one from another CA: a new
  ``sslmode=verify-full`` connection trusting only the new CA fails before the
  SIGHUP and succeeds after it, and the handshake shows the new certificate's
  fingerprint; a TLS session opened before it goes on working. A certificate
  file that does not load keeps the current one.
* The upstream's trusted roots (``sslrootcert``, verify-full) replaced by
  another CA's: new sessions are refused (the server's certificate no longer
  verifies) while a session opened before goes on; a root file that does not
  load keeps the roots in effect; the right CA back, new sessions pass again.
* The configuration file edited: a new ``[claims] lapse_ms`` holds the next
  claim that long, a new admin token replaces the old one (``POST /reload``
  takes only the new), a changed key that needs a restart (``max_client_conn``)
  is named at WARN and in ``GET /config`` and stays; a file that no longer
  loads changes nothing and is counted as failed.
* The claims timings the store and its evidence worker read: a new
  ``holder_gone_grace_ms`` decides the next closed holder's claim. Before the
  SIGHUP, the claim of an inspector that read the parked head and exited still
  holds a resume 2 s later off (55006); after it, the same sequence on another
  thread ends with the resume taking that claim over and firing.
* The JSONL file moved away (logrotate without copytruncate): after SIGHUP the
  next events are in a new file at the configured path, none in the moved one.
* No SIGHUP stops the proxy (every proxy here must still exit 0 on SIGTERM).
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import sqlite3
import ssl
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

import lg_enforce as E
import lg_scenarios
from conftest import HOST, connect, free_port, make_dsn
from test_admin import TOKEN, get_json, http, scrape, value, wait_admin
from test_tls import (TlsProxy, certs, make_ca, make_leaf, tls_pg,  # noqa: F401
                      upstream_url)
from test_validity import write_rules_dir

ITEMS_RULE = """\
[[channel]]
name = "items"
thread_id = "rl-.*"
schema = { type = "array", items = { type = "string" } }
"""
RELOADS = "resumeguard_reloads_total"


def sighup_and_wait(proxy, part: str, result: str, timeout: float = 10.0) -> None:
    """Sends SIGHUP and waits until the proxy logged the part's outcome."""
    want = "SIGHUP: reloaded" if result == "ok" else "SIGHUP: reload failed"
    seen = log_count(proxy, part, want)
    proxy.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while log_count(proxy, part, want) == seen:
        assert proxy.alive(), proxy.describe()
        assert time.monotonic() < deadline, f"no {want!r} for {part}\n{proxy.describe()}"
        time.sleep(0.05)
    assert proxy.alive(), proxy.describe()


def log_count(proxy, part: str, text: str) -> int:
    return sum(1 for line in proxy.stderr_path.read_text(errors="replace").splitlines()
               if text in line and f'part="{part}"' in line)


def error_lines(proxy, part: str) -> list[str]:
    return [line for line in proxy.stderr_path.read_text(errors="replace").splitlines()
            if "ERROR" in line and "SIGHUP: reload failed" in line and f'part="{part}"' in line]


# --------------------------------------------------------------------------- rules
@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    E.setup_db(direct_dsn)


@pytest.fixture(scope="module")
def rules_dir(workdir) -> Path:
    """The shipped saver profiles and no channel rule yet."""
    return write_rules_dir(workdir / f"reload-rules-{uuid.uuid4().hex[:6]}", {})


@pytest.fixture(scope="module")
def admin_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def rproxy(proxy_factory, rules_dir, admin_port):
    return proxy_factory("--rules", str(rules_dir), "--admin-listen", f"{HOST}:{admin_port}",
                         name="proxy-reload-rules")


def reloads(admin_port: int, part: str, result: str, token: str = TOKEN) -> float:
    return value(scrape(wait_admin(admin_port), token), RELOADS, part=part, result=result)


def invalid_append(graph, thread: str) -> psycopg.Error | None:
    """Appends None to ``items`` (a list of strings in the application's own
    type); the error the write raised, if any."""
    try:
        graph.invoke({"pending": None}, E.cfg_of(thread))
        return None
    except psycopg.Error as e:
        return e


def test_sighup_puts_a_new_rule_in_effect_on_open_and_new_connections(
        rproxy, rules_dir, admin_port, dbname, direct_dsn):
    assert reloads(admin_port, "rules", "ok") == 0
    assert reloads(admin_port, "rules", "failed") == 0
    dsn = rproxy.dsn(dbname)
    with PostgresSaver.from_conn_string(dsn) as saver:   # one connection, kept open
        g = E.build_items_graph(saver)
        before = f"rl-before-{uuid.uuid4().hex[:8]}"
        g.invoke({"pending": "a"}, E.cfg_of(before))
        assert invalid_append(g, before) is None, "no rule yet: the invalid value is accepted"
        assert ("writes", [None]) in E.invalid_items(E.channel_rows(direct_dsn, before, "items"))

        (rules_dir / "channels" / "items.toml").write_text(ITEMS_RULE)
        sighup_and_wait(rproxy, "rules", "ok")
        assert reloads(admin_port, "rules", "ok") == 1

        after = f"rl-after-{uuid.uuid4().hex[:8]}"
        g.invoke({"pending": "a"}, E.cfg_of(after))
        err = invalid_append(g, after)
        assert isinstance(err, psycopg.errors.CheckViolation), err
        assert err.sqlstate == "23514" and "items.toml" in str(err), str(err)
        assert E.invalid_items(E.channel_rows(direct_dsn, after, "items")) == []
        assert g.invoke({"pending": "b"}, E.cfg_of(after))["items"] == ["a", "b"]
    with PostgresSaver.from_conn_string(dsn) as saver:   # a new connection
        g = E.build_items_graph(saver)
        fresh = f"rl-new-{uuid.uuid4().hex[:8]}"
        assert isinstance(invalid_append(g, fresh), psycopg.errors.CheckViolation)


def wait_for_reload_records(audit_db, part: str, ending: list[str],
                            timeout: float = 10.0) -> list[dict]:
    """The `config_reloaded` audit records' details of `part`, once the last of them
    have the results `ending` (the audit writer is asynchronous, and the same proxy's
    earlier reloads are in the trail too)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            con = sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True, timeout=5)
            try:
                rows = con.execute("SELECT detail FROM audit_events WHERE operation = "
                                   "'config_reloaded' ORDER BY id").fetchall()
            finally:
                con.close()
        except sqlite3.Error:
            rows = []
        details = [d for d in (json.loads(r[0]) for r in rows) if d["part"] == part]
        if ([d["result"] for d in details[-len(ending):]] == ending
                or time.monotonic() > deadline):
            return details
        time.sleep(0.1)


def test_a_broken_rule_file_keeps_the_rules_in_effect(rproxy, rules_dir, admin_port, dbname):
    rule = rules_dir / "channels" / "items.toml"
    rule.write_text(ITEMS_RULE)
    sighup_and_wait(rproxy, "rules", "ok")
    broken = rules_dir / "channels" / "zz-broken.toml"
    broken.write_text('[[channel]\nname = ')
    failed = reloads(admin_port, "rules", "failed")
    sighup_and_wait(rproxy, "rules", "failed")
    assert reloads(admin_port, "rules", "failed") == failed + 1
    errors = error_lines(rproxy, "rules")
    assert errors and "zz-broken.toml" in errors[-1], errors
    # each reload is in the audit trail, with its outcome and why it failed
    reloads_audited = wait_for_reload_records(rproxy.audit_db, "rules", ["ok", "failed"])
    assert [(d["part"], d["result"]) for d in reloads_audited[-2:]] == [
        ("rules", "ok"), ("rules", "failed")], reloads_audited
    assert "zz-broken.toml" in reloads_audited[-1]["reason"], reloads_audited[-1]
    # the rules loaded before are still enforced, on a connection opened now
    with PostgresSaver.from_conn_string(rproxy.dsn(dbname)) as saver:
        g = E.build_items_graph(saver)
        thread = f"rl-kept-{uuid.uuid4().hex[:8]}"
        assert isinstance(invalid_append(g, thread), psycopg.errors.CheckViolation)
        assert g.invoke({"pending": "ok"}, E.cfg_of(thread))["items"] == ["ok"]
    # removing the rule and the broken file: the next SIGHUP lifts the rule
    broken.unlink()
    rule.unlink()
    sighup_and_wait(rproxy, "rules", "ok")
    with PostgresSaver.from_conn_string(rproxy.dsn(dbname)) as saver:
        g = E.build_items_graph(saver)
        assert invalid_append(g, f"rl-lifted-{uuid.uuid4().hex[:8]}") is None


def test_repeated_sighups_never_stop_the_proxy(rproxy, dbname):
    for _ in range(5):
        rproxy.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert rproxy.alive(), rproxy.describe()
    with connect(rproxy.dsn(dbname)) as c:
        assert c.execute("SELECT 1").fetchone()[0] == 1


# --------------------------------------------------------------------------- client TLS
@pytest.fixture(scope="module")
def tls_files(workdir) -> Path:
    """Two CAs, a leaf of each for localhost; the proxy's files start as ca1's."""
    d = workdir / f"reload-tls-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    for n in (1, 2):
        make_ca(d, f"ca{n}")
        make_leaf(d, f"leaf{n}", f"ca{n}")
    (d / "proxy.crt").write_bytes((d / "leaf1.crt").read_bytes())
    (d / "proxy.key").write_bytes((d / "leaf1.key").read_bytes())
    return d


@pytest.fixture(scope="module")
def tproxy(proxy_factory, tls_files):
    return proxy_factory("--tls-cert", str(tls_files / "proxy.crt"),
                         "--tls-key", str(tls_files / "proxy.key"), name="proxy-reload-tls")


def tls_dsn(proxy, dbname: str, sslmode: str, root: Path | None = None) -> str:
    params = {"sslmode": sslmode}
    if root is not None:
        params["sslrootcert"] = str(root)
    return make_dsn(proxy.port, dbname, **params).replace(f"@{HOST}:", "@localhost:")


def fingerprint_of_file(pem: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.read_text())).hexdigest()


def presented_fingerprint(port: int, root: Path) -> str:
    """SSLRequest, then a handshake verifying chain and host name (what
    verify-full checks); the sha256 of the certificate the proxy showed."""
    ctx = ssl.create_default_context(cafile=str(root))
    with socket.create_connection(("localhost", port), timeout=10) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S"
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            return hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest()


def test_sighup_rotates_the_client_certificate_and_open_sessions_survive(
        tproxy, tls_files, dbname):
    d = tls_files
    assert presented_fingerprint(tproxy.port, d / "ca1.crt") == fingerprint_of_file(d / "leaf1.crt")
    with pytest.raises(psycopg.OperationalError):
        connect(tls_dsn(tproxy, dbname, "verify-full", d / "ca2.crt"))
    open_session = connect(tls_dsn(tproxy, dbname, "require"))
    assert open_session.pgconn.ssl_in_use
    open_session.execute("CREATE TEMP TABLE kept (v int)")
    open_session.execute("INSERT INTO kept VALUES (1)")

    (d / "proxy.crt").write_bytes((d / "leaf2.crt").read_bytes())
    (d / "proxy.key").write_bytes((d / "leaf2.key").read_bytes())
    sighup_and_wait(tproxy, "client_tls", "ok")

    assert presented_fingerprint(tproxy.port, d / "ca2.crt") == fingerprint_of_file(d / "leaf2.crt")
    with connect(tls_dsn(tproxy, dbname, "verify-full", d / "ca2.crt")) as c:
        assert c.pgconn.ssl_in_use and c.execute("SELECT 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError):
        connect(tls_dsn(tproxy, dbname, "verify-full", d / "ca1.crt"))
    # the session opened before the SIGHUP is the same session, still encrypted
    assert open_session.execute("SELECT sum(v) FROM kept").fetchone()[0] == 1
    assert open_session.pgconn.ssl_in_use
    open_session.close()


def test_a_certificate_that_does_not_load_keeps_the_current_one(tproxy, tls_files, dbname):
    d = tls_files
    (d / "proxy.crt").write_bytes((d / "leaf2.crt").read_bytes())
    (d / "proxy.key").write_bytes((d / "leaf2.key").read_bytes())
    sighup_and_wait(tproxy, "client_tls", "ok")
    # leaf1's certificate with leaf2's key: not a pair
    (d / "proxy.crt").write_bytes((d / "leaf1.crt").read_bytes())
    sighup_and_wait(tproxy, "client_tls", "failed")
    errors = error_lines(tproxy, "client_tls")
    assert errors and "proxy.crt" in errors[-1], errors
    (d / "proxy.key").write_text("not a key\n")
    sighup_and_wait(tproxy, "client_tls", "failed")
    assert "proxy.key" in error_lines(tproxy, "client_tls")[-1]
    assert presented_fingerprint(tproxy.port, d / "ca2.crt") == fingerprint_of_file(d / "leaf2.crt")
    with connect(tls_dsn(tproxy, dbname, "verify-full", d / "ca2.crt")) as c:
        assert c.execute("SELECT 1").fetchone()[0] == 1


# --------------------------------------------------------------------------- upstream TLS
def upstream_session(proxy) -> psycopg.Connection:
    """A plaintext client session through `proxy` (trust auth: the proxy's
    own TLS towards the server is what is at stake)."""
    return connect(make_dsn(proxy.port, "postgres", sslmode="disable"))


@pytest.fixture
def upstream_root(workdir, certs) -> Path:
    """The proxy's sslrootcert file, starting as the right CA."""
    root = workdir / f"reload-upstream-root-{uuid.uuid4().hex[:6]}.crt"
    root.write_bytes((certs / "ca.crt").read_bytes())
    return root


@pytest.fixture
def uproxy(tls_pg, upstream_root, workdir):
    """verify-full towards the TLS server, trusting the roots of `upstream_root`."""
    upstream = upstream_url(tls_pg.port, sslmode="verify-full", sslrootcert=upstream_root)
    p = TlsProxy(upstream, workdir, "proxy-reload-upstream").start()
    yield p
    was_alive = p.alive()
    assert was_alive and p.stop() == 0, p.describe()


def test_sighup_replaces_the_upstream_roots(uproxy, upstream_root, certs):
    proxy, root = uproxy, upstream_root
    open_session = upstream_session(proxy)
    assert open_session.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                                ).fetchone()[0]

    root.write_text("no certificate here\n")
    sighup_and_wait(proxy, "upstream_tls", "failed")
    assert str(root.name) in error_lines(proxy, "upstream_tls")[-1]
    with upstream_session(proxy) as c:                       # the roots in effect stay
        assert c.execute("SELECT 1").fetchone()[0] == 1

    root.write_bytes((certs / "wrong_ca.crt").read_bytes())
    sighup_and_wait(proxy, "upstream_tls", "ok")
    with pytest.raises(psycopg.OperationalError) as e:
        upstream_session(proxy)
    msg = str(e.value)
    assert "TLS handshake" in msg and ("UnknownIssuer" in msg or "unknown issuer" in msg.lower()), msg
    assert open_session.execute("SELECT 2").fetchone()[0] == 2   # opened before: unaffected

    root.write_bytes((certs / "ca.crt").read_bytes())
    sighup_and_wait(proxy, "upstream_tls", "ok")
    with upstream_session(proxy) as c:
        assert c.execute("SELECT 3").fetchone()[0] == 3
    open_session.close()


# --------------------------------------------------------------------------- configuration file
def claim_lapse_s(base: str, thread: str, token: str) -> float:
    """How long the thread's claim holds from its taking (lapses_at - claimed_at)."""
    from datetime import datetime
    deadline = time.monotonic() + 10
    while True:
        status, claims = get_json(base, f"/claims?thread={thread}", token=token)
        assert status == 200, claims
        if claims:
            c = claims[0]
            return (datetime.fromisoformat(c["lapses_at"])
                    - datetime.fromisoformat(c["claimed_at"])).total_seconds()
        assert time.monotonic() < deadline, f"no claim of {thread}"
        time.sleep(0.1)


def config_file(path: Path, lapse_ms: int, max_client_conn: int, token: str) -> None:
    # The parking session closes before its claim is read: a holder-gone grace
    # above either lapse keeps that close from shortening the lapse measured
    # (a loaded machine reads the claim only after the close was applied).
    path.write_text(f"max_client_conn = {max_client_conn}\n\n[claims]\nlapse_ms = {lapse_ms}\n"
                    f"holder_gone_grace_ms = 120000\n\n[admin]\ntoken = '{token}'\n")


def test_sighup_rereads_the_configuration_file(proxy_factory, workdir, dbname, direct_dsn):
    """A changed lapse_ms reaches the consume-once gate (the next claim holds
    that long), a new admin token replaces the old one, and a changed key that
    needs a restart (max_client_conn) is named in the log and in GET /config
    and stays as it was."""
    lg_scenarios.setup_db("conn", direct_dsn)
    conf = workdir / f"reload-config-{uuid.uuid4().hex[:6]}.toml"
    config_file(conf, 60_000, 100, "first-token")
    port = free_port()
    proxy = proxy_factory("--config", str(conf), "--admin-listen", f"{HOST}:{port}",
                          name="proxy-reload-config")
    base = wait_admin(port)
    dsn = proxy.dsn(dbname)
    before = f"rl-cfg-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", dsn, before)           # its get_state read takes the claim
    assert claim_lapse_s(base, before, "first-token") == pytest.approx(60, abs=0.5)
    status, shown = http(base, "GET", "/config", token="first-token")
    assert "lapse_ms = 60000  # file" in shown, shown

    config_file(conf, 1_500, 7, "second-token")
    sighup_and_wait(proxy, "config", "ok")
    log = proxy.stderr_path.read_text(errors="replace")
    assert "applied admin.token, claims.lapse_ms; needs a restart for max_client_conn" in log, log
    warned = [line for line in log.splitlines() if "WARN" in line and "need a restart" in line]
    assert warned and "max_client_conn" in warned[-1], log

    after = f"rl-cfg-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", dsn, after)
    assert claim_lapse_s(base, after, "second-token") == pytest.approx(1.5, abs=0.5)
    status, shown = http(base, "GET", "/config", token="second-token")
    assert f"lapse_ms = 1500  # file {conf}" in shown.splitlines(), shown
    assert "max_client_conn = 100  # " in shown, shown
    assert "in effect after a restart: max_client_conn" in shown, shown
    assert "second-token" not in shown, shown
    assert http(base, "POST", "/reload", token="first-token")[0] == 401
    status, body = http(base, "POST", "/reload", token="second-token")
    assert status == 200, body
    assert json.loads(body)["awaiting_restart"] == ["max_client_conn"], body

    # A file that no longer loads changes nothing and is counted as failed.
    conf.write_text("[claims]\nlapse_ms = 'soon'\n")
    sighup_and_wait(proxy, "config", "failed")
    assert conf.name in error_lines(proxy, "config")[-1]
    shown = http(base, "GET", "/config", token="second-token")[1]
    assert f"lapse_ms = 1500  # file {conf}" in shown.splitlines()
    assert reloads(port, "config", "failed", "second-token") == 1


def racer(*args: str) -> dict:
    """One ``racer.py`` command in a process of its own (it exits when done)."""
    cp = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "racer.py"), *args],
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"racer.py {args[0]} exited {cp.returncode}:\n{cp.stderr[-3000:]}"
    return json.loads(cp.stdout.splitlines()[0])


def grace_config(path: Path, grace_ms: int) -> None:
    """A lapse far longer than the test: only the holder-gone grace frees a claim."""
    path.write_text(f'[claims]\nlapse_ms = 60000\npolicy = "refuse"\n'
                    f'holder_gone_grace_ms = {grace_ms}\n\n[admin]\ntoken = "{TOKEN}"\n')


def inspected_then_resumed(proxy, dbname: str, direct: str, thread: str) -> dict:
    """Parks ``thread``, reads it from a process that exits (its session closes:
    the holder is gone), waits 2 s, resumes; the resume's result."""
    dsn = proxy.dsn(dbname)
    racer("park", "--dsn", dsn, "--thread", thread)
    state = racer("state", "--dsn", proxy.dsn(dbname, application_name="rl-inspector"),
                  "--thread", thread)
    assert state["ok"] and state["next"] == ["gate"], state
    time.sleep(2.0)
    return racer("resume", "--dsn", dsn, "--ledger-dsn", direct, "--thread", thread,
                 "--id", "rl-resumer")


def test_sighup_puts_a_new_holder_gone_grace_in_effect(proxy_factory, workdir, dbname,
                                                        direct_dsn):
    """The claims timings the store and the evidence worker read are the ones in
    effect at each decision: holder_gone_grace_ms from 60 s to 0.3 s by SIGHUP."""
    racer("setup", "--dsn", direct_dsn)
    conf = workdir / f"reload-grace-{uuid.uuid4().hex[:6]}.toml"
    grace_config(conf, 60_000)
    port = free_port()
    proxy = proxy_factory("--config", str(conf), "--admin-listen", f"{HOST}:{port}",
                          name="proxy-reload-grace")
    base = wait_admin(port)
    held = f"rl-grace-{uuid.uuid4().hex[:8]}"
    r = inspected_then_resumed(proxy, dbname, direct_dsn, held)
    assert not r["ok"] and r["error"]["sqlstate"] == "55006", r   # the gone holder's claim holds

    grace_config(conf, 300)
    sighup_and_wait(proxy, "config", "ok")
    freed = f"rl-grace-{uuid.uuid4().hex[:8]}"
    r = inspected_then_resumed(proxy, dbname, direct_dsn, freed)
    assert r["ok"], r
    with psycopg.connect(direct_dsn, autocommit=True) as c:
        fired = c.execute("select racer from rg_ledger where thread_id = %s",
                          (freed,)).fetchall()
    assert fired == [("rl-resumer",)], fired
    assert "applied claims.holder_gone_grace_ms" in proxy.stderr_path.read_text(), \
        proxy.describe()
    status, claims = get_json(base, f"/claims?thread={freed}")
    assert status == 200 and [c["state"] for c in claims] == ["consumed"], claims
    # The claim closed under the old grace keeps its lapse.
    status, claims = get_json(base, f"/claims?thread={held}")
    assert status == 200 and [c["state"] for c in claims] == ["held"], claims


def test_sighup_reopens_the_jsonl_file_after_logrotate_moved_it(proxy_factory, dbname,
                                                                direct_dsn):
    """logrotate without copytruncate: the file is moved, SIGHUP, and the
    next events go to a new file at the configured path."""
    lg_scenarios.setup_db("conn", direct_dsn)
    proxy = proxy_factory(name="proxy-reload-jsonl")
    dsn = proxy.dsn(dbname)
    first = f"rl-jsonl-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", dsn, first)
    jsonl = proxy.audit_jsonl
    # The park's last statement is its get_state's read of the parked head:
    # its record may reach the file after the client had its answer.
    wait_for_thread(jsonl, first, operation="read_latest")
    rotated = jsonl.with_name(jsonl.name + ".1")
    jsonl.rename(rotated)
    sighup_and_wait(proxy, "audit_jsonl", "ok")
    second = f"rl-jsonl-{uuid.uuid4().hex[:8]}"
    lg_scenarios.park("conn", dsn, second)
    wait_for_thread(jsonl, second)
    assert first not in jsonl.read_text()
    assert second not in rotated.read_text(), "the moved file gets nothing after the reopen"
    assert jsonl.stat().st_mode & 0o777 == 0o600
    ops = [json.loads(line)["operation"] for line in jsonl.read_text().splitlines()]
    assert "config_reloaded" in ops, ops


def wait_for_thread(path: Path, thread: str, operation: str | None = None,
                    timeout: float = 10.0) -> None:
    """Until `path` holds a record of `thread` (its `operation`, if given)."""
    def there() -> bool:
        if not path.exists():
            return False
        # Whole lines only: the writer may be part-way through the last.
        lines = path.read_text().split("\n")[:-1]
        records = (json.loads(line) for line in lines if line)
        return any(r.get("thread_id") == thread
                   and (operation is None or r.get("operation") == operation)
                   for r in records)

    deadline = time.monotonic() + timeout
    while not there():
        assert time.monotonic() < deadline, f"no {operation or 'event'} of {thread} in {path}"
        time.sleep(0.1)
