"""The audit trail through a real proxy: a full disk leaves a gap record whose
count is exactly what went missing, retention keeps the trail bounded and says
what it removed, the prune command works while the proxy runs, and the trail's
files are private (0600)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import lg_scenarios as L
from conftest import IS_ROOT, Proxy, connect, proxy_binary, run_audit_cli

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def lg_db(pg):
    """A database with the LangGraph tables, migrated straight to PostgreSQL."""
    name = f"rg_audit_trail_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    L.setup_db("conn", pg.dsn(name))
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scenario(proxy: Proxy, db: str, tag: str) -> str:
    """One LangGraph park / inspect / resume / history / delete through `proxy`."""
    thread = f"audit-{tag}-{uuid.uuid4().hex[:8]}"
    L.full_scenario_sync("conn", proxy.dsn(db), thread)
    return thread


def rows(db: Path, where: str = "1", args: tuple = ()) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        con.row_factory = sqlite3.Row
        return [dict(r) for r in con.execute(f"SELECT * FROM audit_events WHERE {where} ORDER BY id", args)]
    finally:
        con.close()


def jsonl_events(path: Path) -> list[dict]:
    # A write failure can leave one torn line; the JSONL output did not fail here.
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stderr_lines(proxy: Proxy, needle: str) -> list[str]:
    return [line for line in proxy.stderr_path.read_text(errors="replace").splitlines() if needle in line]


def wait_for(what: str, cond, timeout: float = 30.0, proxy: Proxy | None = None):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            extra = f"\n{proxy.describe()}" if proxy else ""
            raise AssertionError(f"timed out waiting for {what}{extra}")
        time.sleep(0.1)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def stop_cleanly(p: Proxy) -> None:
    was_alive = p.alive()
    rc = p.stop(signal.SIGTERM)
    assert was_alive and rc == 0, f"proxy did not exit cleanly: alive={was_alive} rc={rc}\n{p.describe()}"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs under the test's directory (root only)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root; the full-disk test cannot run")
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                        capture_output=True, text=True, timeout=30)
    if cp.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {cp.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def fill(disk: Path) -> Path:
    """Write zeros to `disk` until it is full; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


# --------------------------------------------------------------------------- full disk
def test_full_disk_losses_are_recorded_in_a_gap_record_after_space_returns(pg, workdir, lg_db, small_disk):
    """The audit db on a 2 MiB tmpfs; LangGraph traffic while the disk is full.
    The proxy logs the failure at ERROR, and once space returns writes an
    events_dropped record whose count is the count it logged and exactly the
    number of events missing from the db (the JSONL output, on another disk,
    has them all)."""
    p = Proxy(pg.port, workdir, f"audit-full-{uuid.uuid4().hex[:6]}")
    p.audit_db = small_disk / "audit.sqlite"
    p.start()
    try:
        early = scenario(p, lg_db, "before")
        wait_for("the first events", lambda: rows(p.audit_db), proxy=p)

        filler = fill(small_disk)
        failing = lambda: stderr_lines(p, "audit output failed to write")  # noqa: E731
        for i in range(200):
            scenario(p, lg_db, f"full{i}")
            if failing():
                break
        assert failing(), f"the audit db never failed on a full disk\n{p.describe()}"
        # Traffic after the failure: these events are retried, then counted as lost.
        for i in range(3):
            scenario(p, lg_db, f"lost{i}")
        time.sleep(1.5)
        assert not stderr_lines(p, "gap record written"), "recorded while the disk was still full"

        filler.unlink()
        summaries = wait_for("the recovery summary",
                             lambda: [ln for ln in stderr_lines(p, "gap record written") if "sqlite" in ln],
                             proxy=p)
        scenario(p, lg_db, "after")
    finally:
        stop_cleanly(p)

    logged = [int(re.search(r"dropped=(\d+)", ln).group(1)) for ln in summaries]
    assert all("ERROR" in ln for ln in summaries), summaries
    assert all("ERROR" in ln for ln in failing()), failing()
    gaps = rows(p.audit_db, "operation = 'events_dropped'")
    recorded = [json.loads(g["detail"])["dropped"] for g in gaps]
    assert recorded == logged, (recorded, logged)
    assert sum(recorded) > 0
    for g in gaps:
        d = json.loads(g["detail"])
        assert d["reason"] == "write_failed", d
        assert d["first_lost"] <= d["last_lost"] <= g["time"], (d, g["time"])
        assert "full" in d["error"], d

    in_db = [r for r in rows(p.audit_db) if r["operation"] != "events_dropped"]
    everything = jsonl_events(p.audit_jsonl)
    assert not [e for e in everything if e["operation"] == "events_dropped"], "the JSONL output lost nothing"
    assert len(everything) - len(in_db) == sum(recorded), (len(everything), len(in_db), recorded)
    # What survived is in order and nothing written after recovery is missing.
    assert in_db[-1]["thread_id"].startswith("audit-after-"), in_db[-1]
    # A thread that began before the gap shows it in its timeline.
    timeline = run_audit_cli(p.audit_db, early)
    assert [e["detail"]["dropped"] for e in timeline if e["operation"] == "events_dropped"] == recorded


# --------------------------------------------------------------------------- retention
def test_retention_keeps_the_trail_bounded_and_records_each_prune(pg, workdir, lg_db, tmp_path):
    conf = tmp_path / "retention.toml"
    conf.write_text("[audit]\nmax_rows = 40\nprune_interval_ms = 100\n")
    p = Proxy(pg.port, workdir, f"audit-retention-{uuid.uuid4().hex[:6]}", ("--config", str(conf))).start()
    try:
        for i in range(4):
            scenario(p, lg_db, f"ret{i}")
        total = wait_for("every event in the JSONL output",
                         lambda: len(jsonl_events(p.audit_jsonl)) > 100 and len(jsonl_events(p.audit_jsonl)),
                         proxy=p)
        wait_for("the trail cut to max_rows", lambda: len(rows(p.audit_db)) <= 41, proxy=p)
        left = rows(p.audit_db)
    finally:
        stop_cleanly(p)
    assert total > 100, total
    pruned = [json.loads(r["detail"]) for r in left if r["operation"] == "audit_pruned"]
    assert pruned, [r["operation"] for r in left]
    assert all(d["by"] == "retention" and d["max_rows"] == 40 and d["rows"] > 0 for d in pruned), pruned
    # Rows leave oldest first: what is left is the newest, without holes.
    ids = [r["id"] for r in left]
    assert ids == list(range(ids[0], ids[0] + len(ids))), ids
    # The kept chain starts where the prune records said it does.
    cp = verify(p.audit_db)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert "after a prune" in cp.stdout and "verified: every chain holds" in cp.stdout, cp.stdout


def verify(db: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "audit", "verify", "--audit-db", str(db)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def tampered(src: Path, dst: Path, sql: str, *args) -> Path:
    """A copy of the trail ``src`` changed by ``sql`` as someone with the file could
    (the append-only triggers dropped first)."""
    con = sqlite3.connect(src, timeout=10)
    try:
        con.execute(f"VACUUM INTO '{dst}'")
    finally:
        con.close()
    con = sqlite3.connect(dst, timeout=10)
    try:
        con.execute("DROP TRIGGER audit_events_no_update")
        con.execute("DROP TRIGGER audit_events_prune_only")
        con.execute(sql, args)
        con.commit()
    finally:
        con.close()
    return dst


def test_verify_names_the_record_removed_or_changed_after_it_was_written(pg, workdir, lg_db,
                                                                        tmp_path):
    p = Proxy(pg.port, workdir, f"audit-verify-{uuid.uuid4().hex[:6]}").start()
    try:
        thread = scenario(p, lg_db, "verify")
        wait_for("the thread's resume", lambda: rows(p.audit_db, "thread_id = ? AND operation = ?",
                                                     (thread, "resume_recorded")), proxy=p)
        cp = verify(p.audit_db)
        assert cp.returncode == 0, (cp.stdout, cp.stderr)
        assert "verified: every chain holds" in cp.stdout, cp.stdout
    finally:
        stop_cleanly(p)
    mine = rows(p.audit_db, "thread_id = ?", (thread,))
    assert len(mine) >= 5, mine
    # Every record carries the hash of the one before it in its chain.
    assert all(r["hash"] and r["prev_hash"] for r in mine), mine[0]
    resume = next(r for r in mine if r["operation"] == "resume_recorded")
    edited = tampered(p.audit_db, tmp_path / "edited.sqlite",
                      "UPDATE audit_events SET user = 'mallory' WHERE id = ?", resume["id"])
    cp = verify(edited)
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    assert f"BROKEN: record {resume['id']} " in cp.stdout and "was changed" in cp.stdout, cp.stdout

    gone = mine[2]
    chain = [r for r in rows(p.audit_db) if r["proxy_id"] == gone["proxy_id"]]
    after = max((r for r in chain if r["id"] < gone["id"]), key=lambda r: r["id"])
    removed = tampered(p.audit_db, tmp_path / "removed.sqlite",
                       "DELETE FROM audit_events WHERE id = ?", gone["id"])
    cp = verify(removed)
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    nxt = next(r for r in rows(removed) if r["id"] > gone["id"] and r["proxy_id"] == gone["proxy_id"])
    assert f"BROKEN: record {nxt['id']} " in cp.stdout, cp.stdout
    assert f"does not follow record {after['id']}" in cp.stdout, cp.stdout


def test_prune_command_while_the_proxy_runs(pg, workdir, lg_db):
    p = Proxy(pg.port, workdir, f"audit-prune-{uuid.uuid4().hex[:6]}").start()
    try:
        old = scenario(p, lg_db, "old")
        wait_for("the old thread's events", lambda: rows(p.audit_db, "thread_id = ?", (old,)), proxy=p)
        time.sleep(0.5)  # the writer has caught up with the scenario
        before = len(rows(p.audit_db))

        def prune(*args: str) -> subprocess.CompletedProcess:
            cp = subprocess.run([str(proxy_binary()), "audit", "prune", "--audit-db", str(p.audit_db), *args],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            assert cp.returncode == 0, f"{cp.args} exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
            return cp

        assert "nothing before 2000-01-01T00:00:00.000Z" in prune("--before", "2000-01-01T00:00:00Z").stdout
        out = prune("--before", "0s").stdout
        m = re.search(r"pruned (\d+) row\(s\)", out)
        assert m and int(m.group(1)) == before, (out, before)
        assert rows(p.audit_db, "thread_id = ?", (old,)) == []

        # Outside the prune the table still refuses deletes.
        con = sqlite3.connect(p.audit_db, timeout=10)
        try:
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                con.execute("DELETE FROM audit_events")
        finally:
            con.close()

        new = scenario(p, lg_db, "new")
        wait_for("the new thread's events", lambda: rows(p.audit_db, "thread_id = ?", (new,)), proxy=p)
        left = rows(p.audit_db)
        assert left[0]["operation"] == "audit_pruned", left[0]
        d = json.loads(left[0]["detail"])
        assert d["rows"] == before and d["by"] == "cli" and d["cutoff"], d
        bad = subprocess.run([str(proxy_binary()), "audit", "prune", "--before", "yesterday",
                              "--audit-db", str(p.audit_db)], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "--before" in bad.stderr, bad.stderr
    finally:
        stop_cleanly(p)


# --------------------------------------------------------------------------- file modes
def test_trail_files_are_created_0600(pg, workdir, lg_db):
    old = os.umask(0o022)  # the proxy inherits the common default
    try:
        p = Proxy(pg.port, workdir, f"audit-modes-{uuid.uuid4().hex[:6]}").start()
    finally:
        os.umask(old)
    try:
        scenario(p, lg_db, "modes")
        wait_for("events", lambda: rows(p.audit_db), proxy=p)
        files = [p.audit_db, Path(f"{p.audit_db}-wal"), Path(f"{p.audit_db}-shm"), p.audit_jsonl]
        assert {str(f): oct(mode(f)) for f in files} == {str(f): "0o600" for f in files}
    finally:
        stop_cleanly(p)


def test_losses_still_unrecorded_at_shutdown_are_logged(pg, workdir, lg_db, small_disk):
    """Stopped while the disk is still full: the trail cannot say it, so the
    log does, at ERROR, with the count; the proxy still exits cleanly."""
    p = Proxy(pg.port, workdir, f"audit-full-stop-{uuid.uuid4().hex[:6]}")
    p.audit_db = small_disk / "audit.sqlite"
    p.start()
    try:
        scenario(p, lg_db, "before")
        wait_for("the first events", lambda: rows(p.audit_db), proxy=p)
        fill(small_disk)
        for i in range(200):
            scenario(p, lg_db, f"full{i}")
            if stderr_lines(p, "audit output failed to write"):
                break
        assert stderr_lines(p, "audit output failed to write"), p.describe()
    finally:
        stop_cleanly(p)
    unrecorded = stderr_lines(p, "not recorded in the trail")
    assert len(unrecorded) == 1 and "ERROR" in unrecorded[0] and 'output="sqlite"' in unrecorded[0], unrecorded
    assert int(re.search(r"dropped=(\d+)", unrecorded[0]).group(1)) > 0, unrecorded
    assert not stderr_lines(p, "gap record written")
