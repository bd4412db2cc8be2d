"""A claims database that goes silent: the proxy's `[claims] dsn` reaches PostgreSQL
over a link to another host (a network namespace relaying to the server), while
its upstream and its clients stay on loopback. Once the claims connections are in
use, that host stops answering without the link going down: no reply, no RST, no
ICMP, as behind a dead switch or a firewall that drops.

A resume of a parked thread is then refused with 58000 (claim store unavailable,
fail closed) within `liveness_bound_ms` plus the 2 s connect timeout of the new
connection it tries: the proxy's end of every claims connection has TCP keepalives
and a TCP user timeout derived from that bound. Without them, the decision waits
on TCP retransmission (about 15 minutes with Linux defaults) and the read hangs.
Ordinary queries keep flowing meanwhile; once the host answers again, the thread
is resumed through the same proxy.

Needs root and iproute2 (`netns.unavailable()` says why not, and the test is
skipped with that reason); CI runs as root.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import netns as N
import racer as R
from conftest import free_port
from test_consume_once import in_process_resume, park

HERE = Path(__file__).resolve().parent
WHY_NOT = N.unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}")

BOUND_MS = 6000
CONNECT_TIMEOUT_S = 2.0     # the claims store's connect timeout (src/pg/target.rs)
FAIL_CLOSED = "58000"


@pytest.fixture(scope="module")
def remote(pg, dbname, direct_dsn, proxy_factory, workdir):
    """A proxy whose claims database is across a link, and that link's namespace."""
    ns = N.make(3)
    relay = None
    try:
        port = free_port()
        relay = ns.forward(port, f"{pg.tmp}/.s.PGSQL.{pg.port}")
        cfg = workdir / f"blackhole-{uuid.uuid4().hex[:6]}.toml"
        cfg.write_text(
            '[claims]\nbackend = "postgres"\nproxy_id = "blackhole"\n'
            f'dsn = "host={ns.ip} port={port} user=postgres dbname={dbname}"\n'
            f"liveness_bound_ms = {BOUND_MS}\n")
        proxy = proxy_factory("--config", str(cfg), "--state-dir",
                              str(workdir / f"blackhole-state-{uuid.uuid4().hex[:6]}"),
                              name="blackhole")
        R.CTX["ledger_dsn"] = direct_dsn
        R.CTX["ledger"] = None
        out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn",
                              direct_dsn], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        yield ns, proxy.dsn(dbname), direct_dsn
    finally:
        ns.unsilence()
        if relay is not None:
            relay.kill()
            relay.wait(timeout=10)
        ns.close()


def ledger(direct: str, thread: str) -> list[tuple]:
    with psycopg.connect(direct, autocommit=True) as c:
        return c.execute("select racer, node from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


@pytest.mark.timeout(180)
def test_a_silent_claims_database_refuses_the_parked_read_within_the_bound(remote):
    ns, dsn, direct = remote
    # The claims connections are up and in use: a first parked thread is resumed.
    warm = f"bh-warm-{uuid.uuid4().hex[:8]}"
    park(dsn, warm)
    assert in_process_resume(dsn, warm, "bh-warm")["ok"]
    thread = f"bh-{uuid.uuid4().hex[:8]}"
    park(dsn, thread)
    # Past the proxy's own liveness check interval (1 s): the read's first step
    # is asking the silent database whether this proxy still holds its lock.
    time.sleep(1.2)
    out: dict = {}
    resumer = threading.Thread(
        target=lambda: out.update(in_process_resume(dsn, thread, "bh-cut")), daemon=True)
    ns.silence()
    try:
        t_cut = time.time()
        resumer.start()
        # Other traffic does not touch the claims store: it flows meanwhile.
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as c:
            assert c.execute("select 1 + 1").fetchone() == (2,)
        resumer.join(timeout=BOUND_MS / 1000 * 4)
        waited = time.time() - t_cut
    finally:
        ns.unsilence()
    print(f"parked read {'still waiting' if resumer.is_alive() else 'answered'} "
          f"{waited * 1000:.0f} ms after the claims database went silent (bound {BOUND_MS} ms)")
    assert not resumer.is_alive(), f"the parked read still waits {waited:.1f} s after the cut"
    assert not out["ok"], out
    assert out["error"]["sqlstate"] == FAIL_CLOSED, out["error"]
    assert "claim store unavailable" in out["error"]["message"], out["error"]
    assert waited < BOUND_MS / 1000 + CONNECT_TIMEOUT_S + 3.0, waited
    assert ledger(direct, thread) == []
    # The database answers again: the store reconnects (retried with backoff up to
    # 2 s) and the thread is resumed through the same proxy.
    deadline = time.monotonic() + BOUND_MS / 1000 + 10
    while True:
        r = in_process_resume(dsn, thread, "bh-back")
        if r["ok"] or time.monotonic() > deadline:
            break
        assert r["error"]["sqlstate"] == FAIL_CLOSED, r["error"]
        time.sleep(0.5)
    assert r["ok"], r
    assert ledger(direct, thread) == [("bh-back", "gate")]
