"""Keys PostgreSQL accepts, the proxy accepts: a LangGraph thread whose ``thread_id``
is 2,600 bytes (incompressible) or 10,000 bytes (compressible, as PostgreSQL's own
checkpoint tables then need) parks and resumes straight to PostgreSQL and through the
proxy, with claims in the fronted PostgreSQL; a race of N = 4 over two
proxies on such a thread fires the gated node once. (With the claims keyed by their
full key columns, a btree tuple of about 2.7 KB, the resume through the proxy was
refused 58000: the claim row did not fit the index.)

Real PostgreSQL 15, real LangGraph (``racer.py``), real proxies.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import racer as R
from test_claims_pg import ledger, start
from test_consume_once import Racers, in_process_resume, park

HERE = Path(__file__).resolve().parent


def long_thread(size: int) -> str:
    """A thread id of ``size`` bytes: random hex (pglz finds nothing to compress) up
    to 2,600 bytes; beyond, a unique head and a repeated tail PostgreSQL compresses,
    as its checkpoint tables' own index needs."""
    head = f"long-{uuid.uuid4().hex}-"
    if size <= 2600:
        return head + secrets.token_hex(size)[: size - len(head)]
    return head + "x" * (size - len(head))


SIZES = [2600, 10_000]


@pytest.fixture(scope="module")
def env(proxy_factory, direct_dsn, workdir):
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]
    return SimpleNamespace(direct=direct_dsn, dbname=dbname, workdir=workdir,
                           pg1=start(proxy_factory, workdir, "long-pg-1"),
                           pg2=start(proxy_factory, workdir, "long-pg-2"))


def park_and_resume(dsn: str, thread: str, racer: str) -> dict:
    its = park(dsn, thread)
    return in_process_resume(dsn, thread, racer, interrupt_id=its[0]["id"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", SIZES)
def test_a_long_thread_id_parks_and_resumes_straight_and_through_the_proxy(env, size):
    # Stock: PostgreSQL and LangGraph take it.
    stock = long_thread(size)
    assert len(stock.encode()) == size
    r = park_and_resume(env.direct, stock, "stock")
    assert r["ok"], r
    assert len(ledger(env, stock)) == 1
    thread = long_thread(size)
    r = park_and_resume(env.pg1.dsn(env.dbname), thread, f"via-{env.pg1.name}")
    print(f"{size}-byte thread id through the proxy: ok={r['ok']} "
          f"sqlstate={(r['error'] or {}).get('sqlstate')}")
    assert r["ok"], r
    assert len(ledger(env, thread)) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", SIZES)
def test_a_race_of_four_on_a_long_thread_id_fires_once(env, size):
    thread = long_thread(size)
    its = park(env.pg1.dsn(env.dbname), thread)
    jobs = [{"thread": thread, "graph": "one", "form": "bare", "gate_ms": 300,
             "interrupt_id": its[0]["id"], "rep": 0}]
    dsns = [p.dsn(env.dbname) for p in (env.pg1, env.pg2, env.pg1, env.pg2)]
    racers = Racers(env, dsns, "conn", jobs, "lk")
    try:
        runs = racers.run_all()
    finally:
        racers.kill()
    served = [r for r in runs[0] if r["ok"]]
    errors = sorted({str((r["error"] or {}).get("sqlstate")) for r in runs[0] if not r["ok"]})
    fires = len(ledger(env, thread))
    print(f"N = 4 over two proxies, {size}-byte thread id: {fires} fire(s), "
          f"{len(served)} served, refused: {errors}")
    assert fires == 1, runs
    assert len(served) == 1, runs
