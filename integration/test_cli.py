"""The command-line contract of `resumeguard serve` and `resumeguard audit`."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

import pgraw
from conftest import (AUDIT_NO_SUCH_THREAD, HOST, SUPERUSER, Proxy, connect, free_port,
                      port_accepts, proxy_binary, run_audit_cli)


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


def test_database_url_goes_to_stderr_when_stdout_carries_the_audit_jsonl(pg, workdir):
    """``--audit-jsonl -``: stdout holds JSON lines only (a SIGHUP's
    ``config_reloaded`` event among them), the DATABASE_URL line is on stderr."""
    port = free_port()
    argv = [str(proxy_binary()), "serve", "--listen", f"{HOST}:{port}",
            "--upstream", f"{HOST}:{pg.port}", "--audit-db", str(workdir / "jsonl-stdout.sqlite"),
            "--audit-jsonl", "-", "--admin-listen", "off"]
    log = workdir / "jsonl-stdout.stderr.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env={**os.environ, "RUST_LOG": "info"})
    try:
        deadline = time.monotonic() + 30
        while "DATABASE_URL=" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        while "SIGHUP: reloaded" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    err = log.read_text()
    assert proc.returncode == 0, err
    assert f"DATABASE_URL=postgres://{HOST}:{port}/postgres" in err.splitlines(), err
    assert "DATABASE_URL" not in out, out
    events = [json.loads(line) for line in out.splitlines()]   # every stdout line is JSON
    assert "config_reloaded" in [e["operation"] for e in events], out


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


def test_audit_unknown_thread_says_so(proxy):
    cp = subprocess.run([str(proxy_binary()), "audit", "--audit-db", str(proxy.audit_db),
                         "--thread", "no-such-thread-anywhere"],
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert cp.returncode == AUDIT_NO_SUCH_THREAD, (cp.returncode, cp.stdout, cp.stderr)
    assert cp.stdout == ""
    assert 'no audit events for thread "no-such-thread-anywhere"' in cp.stderr, cp.stderr
    assert "audit --threads" in cp.stderr, cp.stderr


def test_audit_missing_arguments_is_an_error():
    cp = subprocess.run([str(proxy_binary()), "audit"], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode != 0


def test_help_lists_subcommands():
    cp = subprocess.run([str(proxy_binary()), "--help"], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert "serve" in cp.stdout and "audit" in cp.stdout, cp.stdout


# --------------------------------------------------------------------------- audit listing and filters
def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def langgraph_thread(proxy, pg, tag: str) -> str:
    """A thread parked and answered through ``proxy`` (real LangGraph)."""
    import lg_scenarios as L
    db = f"rg_cli_{tag}_{uuid.uuid4().hex[:6]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    L.setup_db("conn", pg.dsn(db))
    thread = f"cli-{tag}-{uuid.uuid4().hex[:8]}"
    L.park("conn", proxy.dsn(db), thread)
    L.resume("conn", proxy.dsn(db), thread)
    deadline = time.monotonic() + 10
    while "claim_consumed" not in {e["operation"] for e in proxy.audit(thread)}:
        assert time.monotonic() < deadline, proxy.describe()
        time.sleep(0.2)
    return thread


def test_audit_lists_threads_and_filters_by_time_and_operation(proxy, pg, workdir):
    first = langgraph_thread(proxy, pg, "a")
    time.sleep(0.05)
    second = langgraph_thread(proxy, pg, "b")
    listing = cli("audit", "--audit-db", str(proxy.audit_db), "--threads")
    assert listing.returncode == 0, listing.stderr
    lines = [line for line in listing.stdout.splitlines() if first in line or second in line]
    assert len(lines) == 2 and second in lines[0] and first in lines[1], listing.stdout
    listed = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--threads", "--json").stdout)
    mine = {t["thread_id"]: t for t in listed if t["thread_id"] in (first, second)}
    assert mine[first]["last"] <= mine[second]["last"]
    assert mine[first]["events"] == len(proxy.audit(first))

    # The same trail through --state-dir: <dir>/audit.sqlite.
    state = workdir / f"state-{uuid.uuid4().hex[:6]}"
    state.mkdir()
    with sqlite3.connect(proxy.audit_db) as src, sqlite3.connect(state / "audit.sqlite") as dst:
        src.backup(dst)  # the live trail is in WAL mode: copy it whole
    again = cli("audit", "--state-dir", str(state), "--threads")
    assert again.returncode == 0 and first in again.stdout and second in again.stdout, again.stderr

    # --op keeps only those operations; --since/--until a window.
    events = proxy.audit(first)
    ops = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--thread", first, "--json",
                         "--op", "interrupt_parked,claim_consumed").stdout)
    assert [e["operation"] for e in ops] == [e["operation"] for e in events
                                             if e["operation"] in ("interrupt_parked", "claim_consumed")]
    assert {e["operation"] for e in ops} == {"interrupt_parked", "claim_consumed"}
    cut = events[len(events) // 2]["time"]
    later = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--thread", first, "--json",
                           "--since", cut).stdout)
    assert later and all(e["time"] >= cut for e in later)
    assert len(later) == sum(1 for e in events if e["time"] >= cut)
    earlier = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--thread", first, "--json",
                             "--until", cut).stdout)
    assert len(earlier) == sum(1 for e in events if e["time"] <= cut)
    recent = cli("audit", "--audit-db", str(proxy.audit_db), "--threads", "--since", "1h")
    assert first in recent.stdout
    none = cli("audit", "--audit-db", str(proxy.audit_db), "--threads", "--until", "2000-01-01T00:00:00Z")
    assert none.returncode == 0 and none.stdout == "", none.stdout
    bad = cli("audit", "--audit-db", str(proxy.audit_db), "--thread", first, "--op", "resumed")
    assert bad.returncode != 0 and "resume_recorded" in bad.stderr, bad.stderr


def test_claims_take_the_state_dir(proxy, pg, workdir):
    state = workdir / f"claims-{uuid.uuid4().hex[:6]}"
    state.mkdir()
    # The default backend keeps the claims in the managed server of the state dir.
    missing = cli("claims", "list", "--state-dir", str(state))
    assert missing.returncode != 0 and "no managed PostgreSQL running" in missing.stderr, \
        missing.stderr
    assert str(state / "postgres" / "postmaster.pid") in missing.stderr, missing.stderr


def test_rules_check_without_a_directory_checks_the_built_in_profiles(tmp_path):
    cp = cli("rules", "check", cwd=tmp_path)  # no ./rules here
    assert cp.returncode == 0, cp.stderr
    assert "built-in profiles" in cp.stdout, cp.stdout
    assert "profile langgraph-python" in cp.stdout and "profile langgraph-js" in cp.stdout, cp.stdout
    assert "no channel rules" in cp.stdout, cp.stdout


def test_every_flag_has_help():
    for sub in (["serve"], ["audit"], ["audit", "prune"], ["claims", "list"], ["claims", "release"],
                ["rules", "check"]):
        cp = cli(*sub, "--help")
        assert cp.returncode == 0, cp.stderr
        flags = [line for line in cp.stdout.splitlines() if line.strip().startswith("--")]
        bare = [f for f in flags if len(f.strip().split("  ", 1)) < 2 and not f.rstrip().endswith(">")]
        assert flags and not bare, (sub, bare, cp.stdout)
    assert "--since" in cli("audit", "--help").stdout


# --------------------------------------------------------------------------- the managed server's lifecycle
class Managed:
    """``resumeguard serve`` with no upstream: it starts its own PostgreSQL
    in ``state_dir``."""

    def __init__(self, state_dir: Path, port: int | None = None):
        self.state_dir = state_dir
        self.port = port or free_port()
        self.log = state_dir.with_suffix(".log")
        argv = [str(proxy_binary()), "serve", "--listen", f"{HOST}:{self.port}",
                "--state-dir", str(state_dir), "--admin-listen", "auto"]
        env = {**os.environ, "RUST_LOG": "resumeguard=info"}
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(self.log, "w"),
                                  stdin=subprocess.DEVNULL, text=True, env=env)

    def wait_url(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if line.startswith("DATABASE_URL="):
                return line.strip().split("=", 1)[1]
            if not line and self.p.poll() is not None:
                break
        raise AssertionError(f"no DATABASE_URL\n{self.log.read_text()}")

    def wait_exit(self, timeout: float = 60) -> int:
        return self.p.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.log.read_text()


def data_dir_processes(data_dir: Path) -> list[str]:
    """Command lines of running processes that name ``data_dir``."""
    needle = str(data_dir.resolve())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and "pytest" not in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def assert_managed_server_gone(state_dir: Path) -> None:
    data = state_dir / "postgres"
    deadline = time.monotonic() + 10
    while (data / "postmaster.pid").exists() or data_dir_processes(data):
        assert time.monotonic() < deadline, \
            f"the managed PostgreSQL outlived the proxy: {data_dir_processes(data)}"
        time.sleep(0.1)


def test_sighup_keeps_serving_and_the_managed_server_stops_with_the_proxy(workdir):
    state = workdir / f"hup-{uuid.uuid4().hex[:6]}"
    m = Managed(state)
    try:
        url = m.wait_url()
        m.p.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert m.p.poll() is None, f"SIGHUP ended the proxy\n{m.stderr()}"
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as c:
            assert c.execute("select 1").fetchone()[0] == 1
        assert "SIGHUP received" in m.stderr()
        m.p.send_signal(signal.SIGTERM)
        assert m.wait_exit() == 0, m.stderr()
        assert_managed_server_gone(state)
    finally:
        if m.p.poll() is None:
            m.p.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_startup_never_orphans_the_managed_server(workdir, sig):
    state = workdir / f"early-{sig.name}-{uuid.uuid4().hex[:6]}"
    m = Managed(state)
    try:
        time.sleep(0.3)  # initdb / pg_ctl start are running
        assert m.p.poll() is None, m.stderr()
        m.p.send_signal(sig)
        if sig == signal.SIGINT:
            assert m.wait_exit() == 0, m.stderr()
            assert "shutdown requested while the managed PostgreSQL starts" in m.stderr(), m.stderr()
        else:
            m.wait_url()
            m.p.send_signal(signal.SIGTERM)
            assert m.wait_exit() == 0, m.stderr()
        assert_managed_server_gone(state)
    finally:
        if m.p.poll() is None:
            m.p.kill()
    # The state directory is reusable at once: no "another server might be running".
    again = Managed(state)
    try:
        url = again.wait_url()
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as c:
            assert c.execute("select 1").fetchone()[0] == 1
        again.p.send_signal(signal.SIGTERM)
        assert again.wait_exit() == 0, again.stderr()
        assert_managed_server_gone(state)
    finally:
        if again.p.poll() is None:
            again.p.kill()


def test_a_taken_listen_port_fails_before_the_managed_server_starts(workdir):
    state = workdir / f"busy-{uuid.uuid4().hex[:6]}"
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        m = Managed(state, port=taken.getsockname()[1])
        rc = m.wait_exit(timeout=30)
    assert rc != 0
    assert "listening on" in m.stderr(), m.stderr()
    assert not (state / "postgres").exists(), "the managed server was started before the port was checked"
