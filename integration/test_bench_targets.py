"""The benchmark's lines against PgBouncer: the interval on a median of
per-round ratios (the order statistics it picks cover the median as often
as they say; a run with too few rounds says it has none), which
PgBouncer each configuration is held against, and how the host's CPU per
transaction is counted (a server's processes, live or reaped, once)."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench  # noqa: E402


def coverage(n: int, k: int) -> float:
    """P(x(k) <= median <= x(n+1-k)) for n draws of a continuous variable."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


def test_the_interval_is_the_tightest_pair_of_order_statistics_at_95_percent():
    for n in range(6, 40):
        xs = random.Random(n).sample(range(1000), n)
        low, high, cov = bench.median_interval(xs)
        s = sorted(xs)
        k = s.index(low) + 1
        assert high == s[n - k], n
        assert cov == coverage(n, k) >= 0.95, n
        assert k == n // 2 or coverage(n, k + 1) < 0.95, n


def test_seven_rounds_give_the_whole_range_and_fifteen_cut_three_off_each_end():
    assert bench.median_interval([5, 1, 7, 3, 2, 6, 4]) == (1, 7, coverage(7, 1))
    assert bench.median_interval(list(range(15, 0, -1)))[:2] == (4, 12)


def test_a_run_of_fewer_than_six_rounds_says_it_has_no_interval():
    assert bench.median_interval([1.0, 0.9, 1.1, 1.0, 0.95]) is None
    assert "no interval under 6 rounds" in bench.interval_note([1.0, 0.9, 1.1])
    assert bench.interval_note([1.0, 0.98, 1.02, 0.97, 1.05, 0.99, 1.01]) == \
        "; median within 0.970–1.050 (98%)"


def cell(tps: list[float], cpu: list[float]) -> dict:
    return {"tps": tps, "cpu_us_per_tx": cpu}


def test_a_plaintext_configuration_is_held_against_both_pgbouncers_and_tls_against_its_own():
    rounds = 7
    cells = {}
    for mode in ("simple", "extended", "prepared"):
        for target, tps in (("rg", 105.0), ("rg-tls", 90.0), ("pgbouncer", 100.0),
                            ("pgbouncer-unpooled", 95.0), ("pgbouncer-tls", 100.0)):
            cells[("select-only", mode, target)] = cell([tps] * rounds, [10.0] * rounds)
    lines = bench.peer_targets(cells, ["rg", "rg-tls"], {"rg-tls": "require"})
    assert len(lines) == 9
    held = {(line.split(" vs ")[0].split()[0], line.split(" vs ")[1].split(":")[0])
            for line in lines}
    assert held == {("rg", "pgbouncer"), ("rg", "pgbouncer-unpooled"), ("rg-tls", "pgbouncer-tls")}
    unpooled = next(line for line in lines if "-M extended vs pgbouncer-unpooled" in line)
    assert unpooled.startswith("rg select-only -M extended vs pgbouncer-unpooled: TPS 1.105× (meets")
    assert "median within 1.105–1.105 (98%)" in unpooled


def test_without_the_unpooled_pgbouncer_only_the_pooled_one_is_held_against():
    cells = {("select-only", mode, t): cell([100.0] * 6, [10.0] * 6)
             for mode in ("simple", "extended", "prepared") for t in ("rg", "pgbouncer")}
    lines = bench.peer_targets(cells, ["rg"], {})
    assert [line.split(":")[0] for line in lines] == [
        f"rg select-only -M {mode} vs pgbouncer" for mode in ("simple", "extended", "prepared")]


def burn_child(seconds: float) -> subprocess.Popen:
    """A child process that spins on the CPU for about `seconds`, then exits."""
    return subprocess.Popen([sys.executable, "-c",
                             "import time\nend = time.process_time() + %r\n"
                             "while time.process_time() < end: pass\n"
                             "import sys; sys.stdout.write('done\\n'); sys.stdout.flush()\n"
                             "sys.stdin.read()" % seconds],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_servers_cpu_counts_its_processes_live_and_reaped_once():
    """What a server's processes spent counts while they run and after the
    server reaps them, and the same CPU is not counted twice: measured on this
    process as the 'postmaster' of two children that each spin 0.3 s."""
    me = os.getpid()
    start = bench.server_cpu_seconds(me)
    a, b = burn_child(0.3), burn_child(0.3)
    try:
        assert a.stdout.readline() == "done\n" and b.stdout.readline() == "done\n"
        live = bench.server_cpu_seconds(me) - start
        assert 0.55 <= live < 0.9, live             # both alive, counted in /proc
        a.stdin.close()
        a.wait()                                     # one reaped: now in cutime
        mixed = bench.server_cpu_seconds(me) - start
        assert abs(mixed - live) < 0.1, (live, mixed)
    finally:
        b.stdin.close()
        b.wait()
    reaped = bench.server_cpu_seconds(me) - start
    assert abs(reaped - live) < 0.1, (live, reaped)


def test_the_hosts_cpu_is_told_as_its_parts_and_their_sum():
    cell = {"median_server_us_per_tx": 61.24, "median_client_us_per_tx": 14.0,
            "median_cpu_us_per_tx": 18.1}
    assert bench.fmt_host(cell) == "61.2 + 14.0 + 18.1 = 93.3"
    assert bench.fmt_host({**cell, "median_cpu_us_per_tx": None}) == "61.2 + 14.0 = 75.2"
    assert bench.fmt_host({"median_cpu_us_per_tx": 18.1}) == ""
