"""pgbench through the proxy: initialisation (COPY), the TPC-B-like script in
every query mode, no failed transactions, and the balance invariants."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import HOST, PGBENCH, SUPERUSER, connect, pg_env

MODES = ("simple", "extended", "prepared")


def pgbench(port: int, dbname: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [PGBENCH, "-h", HOST, "-p", str(port), "-U", SUPERUSER, *args, dbname]
    cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=timeout, env=pg_env())
    assert cp.returncode == 0, (f"{' '.join(cmd)} exited {cp.returncode}\n"
                                f"stdout:\n{cp.stdout}\nstderr:\n{cp.stderr}")
    return cp


def run_stats(cp: subprocess.CompletedProcess) -> dict:
    out = cp.stdout
    m = re.search(r"number of transactions actually processed: (\d+)(?:/(\d+))?", out)
    f = re.search(r"number of failed transactions: (\d+)", out)
    assert m and f, f"unexpected pgbench output:\n{out}\n{cp.stderr}"
    return {"processed": int(m.group(1)), "planned": int(m.group(2)) if m.group(2) else None,
            "failed": int(f.group(1))}


def invariants(dsn: str) -> dict:
    with connect(dsn) as c:
        row = c.execute("""
            select (select count(*) from pgbench_accounts),
                   (select count(*) from pgbench_branches),
                   (select count(*) from pgbench_tellers),
                   (select coalesce(sum(abalance), 0) from pgbench_accounts),
                   (select coalesce(sum(bbalance), 0) from pgbench_branches),
                   (select coalesce(sum(tbalance), 0) from pgbench_tellers),
                   (select coalesce(sum(delta), 0) from pgbench_history),
                   (select count(*) from pgbench_history)""").fetchone()
    keys = ("accounts", "branches", "tellers", "sum_abalance", "sum_bbalance", "sum_tbalance",
            "sum_delta", "history_rows")
    return dict(zip(keys, row))


def assert_invariants(inv: dict, expected_history_rows: int | None = None) -> None:
    assert (inv["accounts"], inv["branches"], inv["tellers"]) == (100_000, 1, 10), inv
    assert inv["sum_abalance"] == inv["sum_delta"], inv
    assert inv["sum_bbalance"] == inv["sum_delta"], inv
    assert inv["sum_tbalance"] == inv["sum_delta"], inv
    if expected_history_rows is not None:
        assert inv["history_rows"] == expected_history_rows, inv


@pytest.fixture(scope="module")
def initialized(proxy, dbname, direct_dsn):
    cp = pgbench(proxy.port, dbname, "-i", "-s", "1", "-q")
    inv = invariants(direct_dsn)
    return {"output": cp.stdout + cp.stderr, "inv": inv}


def test_init_through_proxy(initialized):
    assert "done" in initialized["output"], initialized["output"]
    inv = initialized["inv"]
    assert_invariants(inv, expected_history_rows=0)
    assert inv["sum_delta"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_timed_run(initialized, proxy, dbname, direct_dsn, mode):
    before = invariants(direct_dsn)
    stats = run_stats(pgbench(proxy.port, dbname, "-n", "-T", "3", "-c", "4", "-j", "2", "-M", mode))
    assert stats["failed"] == 0, stats
    assert stats["processed"] > 0, stats
    after = invariants(direct_dsn)
    assert_invariants(after, expected_history_rows=before["history_rows"] + stats["processed"])


@pytest.mark.parametrize("mode", MODES)
def test_fixed_count_run(initialized, proxy, dbname, direct_dsn, mode):
    before = invariants(direct_dsn)
    stats = run_stats(pgbench(proxy.port, dbname, "-n", "-t", "200", "-c", "4", "-j", "2", "-M", mode))
    assert stats == {"processed": 800, "planned": 800, "failed": 0}, stats
    after = invariants(direct_dsn)
    assert_invariants(after, expected_history_rows=before["history_rows"] + 800)


def test_connection_per_transaction(initialized, proxy, dbname, direct_dsn):
    """-C: a new connection (through the proxy) for every transaction."""
    before = invariants(direct_dsn)
    stats = run_stats(pgbench(proxy.port, dbname, "-n", "-C", "-t", "50", "-c", "2", "-M", "extended"))
    assert stats == {"processed": 100, "planned": 100, "failed": 0}, stats
    assert_invariants(invariants(direct_dsn), expected_history_rows=before["history_rows"] + 100)


def test_select_only_prepared_many_clients(initialized, proxy, dbname):
    stats = run_stats(pgbench(proxy.port, dbname, "-n", "-S", "-T", "2", "-c", "16", "-j", "2",
                              "-M", "prepared"))
    assert stats["failed"] == 0 and stats["processed"] > 0, stats
