"""What clients write is escaped wherever the CLI prints it: a thread id, a login
role and an application_name carrying newlines, ANSI/OSC escapes, C1 controls and
a bidi override, recorded through the proxy by real LangGraph, print as visible
escapes in `audit --thread`, `audit --threads` and `claims list`; no line of the
output is forged, no control character reaches the terminal. `--json` stays JSON
with the text as written."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from conftest import HOST, connect, proxy_binary

FORGED = "\n[forged] answer recorded"
OSC_TITLE = "\x1b]0;title\x07"
HOSTILE = f"{FORGED}{OSC_TITLE}\x1b[31mred\u009b2J\u202egnp.exe\r\x7f"


def cli(*args: str) -> subprocess.CompletedProcess:
    cp = subprocess.run([str(proxy_binary()), *args], stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"{args}: rc={cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return cp


def assert_printable(out: str, what: str) -> None:
    raw = [c for c in out if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f
           or c in "\u202e\u2066\u2028"]
    assert not raw, f"{what}: raw control characters {raw!r} in\n{out!r}"
    forged = [line for line in out.splitlines() if line.lstrip().startswith("[forged]")]
    assert not forged, f"{what}: forged lines {forged!r}"


@pytest.fixture(scope="module")
def hostile_thread(proxy, pg):
    """A thread parked and answered through the proxy by a role, an application and
    with a thread id all carrying the hostile text."""
    import lg_scenarios as L
    # Role names are cut at 63 bytes: the newline, the OSC sequence and the bidi
    # override fit.
    role = f"u{FORGED}{OSC_TITLE}\u202e"
    db = f"rg_cli_text_{uuid.uuid4().hex[:6]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{db}"')
        c.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(role)))
    L.setup_db("conn", pg.dsn(db))
    thread = f"cli-text{HOSTILE}-{uuid.uuid4().hex[:8]}"
    dsn = proxy.dsn(db, user=role, application_name=f"app{HOSTILE}")
    L.park("conn", dsn, thread)
    L.resume("conn", dsn, thread)
    deadline = time.monotonic() + 10
    while "claim_consumed" not in {e["operation"] for e in proxy.audit(thread)}:
        assert time.monotonic() < deadline, proxy.describe()
        time.sleep(0.2)
    yield thread, role
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_the_timeline_shows_client_text_escaped(proxy, hostile_thread):
    thread, role = hostile_thread
    out = cli("audit", "--audit-db", str(proxy.audit_db), "--thread", thread).stdout
    assert_printable(out, "audit --thread")
    assert "\\n[forged] answer recorded\\u{1b}]0;title\\u{7}\\u{1b}[31mred\\u{9b}2J" in out, out
    assert "\\u{202e}gnp.exe\\r\\u{7f}" in out, out
    events = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--thread", thread,
                            "--json").stdout)
    # one line per event under the thread's header: nothing split a line
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(lines) == len(events), out
    # the JSON keeps the text as written
    assert {e["thread_id"] for e in events} == {thread}
    assert role in {e["user"] for e in events}, {e["user"] for e in events}
    assert all("u\\n[forged] answer recorded\\u{1b}]0;title\\u{7}\\u{202e}@" in line
               for line in lines if " claim_" in line), lines


def test_the_threads_listing_shows_client_text_escaped(proxy, hostile_thread):
    thread, _ = hostile_thread
    out = cli("audit", "--audit-db", str(proxy.audit_db), "--threads").stdout
    assert_printable(out, "audit --threads")
    mine = [line for line in out.splitlines() if "cli-text\\n[forged]" in line]
    assert len(mine) == 1, out
    assert "\\u{1b}]0;title\\u{7}" in mine[0], mine
    listed = json.loads(cli("audit", "--audit-db", str(proxy.audit_db), "--threads",
                            "--json").stdout)
    assert thread in {t["thread_id"] for t in listed}


def test_the_claims_list_shows_client_text_escaped(proxy, pg, hostile_thread):
    thread, _ = hostile_thread
    at = ["--upstream", f"postgres://postgres@{HOST}:{pg.port}/postgres"]
    out = cli("claims", "list", "--thread", thread, *at).stdout
    assert_printable(out, "claims list")
    mine = [line for line in out.splitlines() if line.startswith("cli-text\\n[forged]")]
    assert mine, out
    assert "\\u{202e}gnp.exe" in mine[0], mine
    # the table's rows are one line each: as many rows as claims listed
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
        n = c.execute("select count(*) from resumeguard.claims where thread_id = %s",
                      (thread,)).fetchone()[0]
    rows = [line for line in out.splitlines()
            if line and not line.startswith(("THREAD", "evidence:", "  "))]
    assert len(rows) == n, out
