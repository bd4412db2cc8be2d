"""Claims on the database's clock: two proxies whose own clocks differ by 30 s (one
runs under ``faketime``, Debian's libfaketime) share the claims in the PostgreSQL
they front (real PostgreSQL 15, real LangGraph).

- The skewed proxy's own clock really is ahead: its audit timestamps are 30 s ahead
  of this host's.
- 10 races of N = 4 racers split over both proxies (gate 0 and 300 ms) fire the gated
  node once each.
- A claim held through the proxy whose clock is behind is not taken over through the
  one ahead before ``lapse_ms`` of the database's time: the resume there waits for
  the lapse. (With claim times taken from each proxy's own clock, the proxy 30 s
  ahead saw the claim as lapsed at once, took it over, and two holders fired.)
- The other way round, a claim held through the proxy ahead is taken over through
  the one behind once it lapses on the database's clock, not 30 s later.
- The audit trail both append to in PostgreSQL (``[audit] postgres = true``) reads a
  thread parked through the proxy ahead and answered through the one behind in the
  order it happened: the answer's own times are 30 s before the park's, but the
  trail is ordered on the database's clock.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

import racer as R
from conftest import HOST, run_audit_cli
from test_audit_replicas import timeline
from test_claims_pg import ledger, race
from test_consume_once import in_process_resume, one_resumer, park

SKEW_S = 30
LAPSE_MS = 4000

# libfaketime preloaded into the proxy itself (the faketime command would stand
# between the test and the proxy's signals); multi-threaded variant.
LIBFAKETIME = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
                                 Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"))
                    if p.exists()), None)
pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None, reason="libfaketime missing (Debian: apt-get install faketime)")


def start(proxy_factory, workdir, pg, dbname: str, name: str, skewed: bool):
    state = workdir / f"skew-state-{name}-{uuid.uuid4().hex[:6]}"
    cfg = workdir / f"skew-{name}.toml"
    upstream = f"postgres://postgres@{HOST}:{pg.port}/{dbname}"
    cfg.write_text(f'upstream = "{upstream}"\n\n[audit]\npostgres = true\n\n'
                   f'[claims]\nproxy_id = "{name}"\nlapse_ms = {LAPSE_MS}\n'
                   f'holder_gone_grace_ms = 1000\nprogress_hold_ms = 10000\n')
    kw = {}
    if skewed:
        kw = {"env": {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"+{SKEW_S}s",
                      "FAKETIME_DONT_FAKE_MONOTONIC": "1"}}
    proxy = proxy_factory("--config", str(cfg), "--state-dir", str(state), name=name,
                          upstream=upstream, **kw)
    proxy.cfg = cfg  # for the audit command (test_audit_replicas.timeline)
    return proxy


@pytest.fixture(scope="module")
def skew(proxy_factory, direct_dsn, pg, workdir):
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    R.main(["setup", "--dsn", direct_dsn])
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]
    ahead = start(proxy_factory, workdir, pg, dbname, "skew-ahead", skewed=True)
    behind = start(proxy_factory, workdir, pg, dbname, "skew-behind", skewed=False)
    return SimpleNamespace(direct=direct_dsn, dbname=dbname, ahead=ahead, behind=behind,
                           workdir=workdir)


def test_the_skewed_proxys_own_clock_is_ahead(skew):
    thread = f"skew-audit-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    park(skew.ahead.dsn(skew.dbname), thread)
    evs = run_audit_cli(skew.ahead.audit_db, thread)
    assert evs, "no audit events"
    first = datetime.fromisoformat(evs[0]["time"].replace("Z", "+00:00"))
    moved = first.timestamp() - t0
    print(f"the skewed proxy's first audit event is {moved:.1f} s ahead of this host")
    assert SKEW_S - 5 < moved < SKEW_S + 10, moved


@pytest.mark.timeout(600)
def test_ten_races_split_over_skewed_proxies_fire_once_each(skew):
    fires = race(skew, [skew.ahead, skew.behind], 4, gates=(0, 300, 0, 300, 0, 300, 0, 300,
                                                             0, 300))
    print(f"fires per gate over two proxies {SKEW_S} s apart: {fires}")
    assert fires == {0: [1] * 5, 300: [1] * 5}, fires


def hold_then_resume(skew, holder, other, prefix: str) -> tuple[str, float, float, dict, list]:
    """Parks a thread through ``holder``, takes its claim there with an unmarked
    get_state whose connection stays open (the holder is alive), and resumes it
    through ``other`` at once: the thread, the release and serve times after the
    claim, the resume's result and its runner's ids."""
    thread = f"{prefix}{uuid.uuid4().hex[:8]}"
    iid = park(holder.dsn(skew.dbname), thread)[0]["id"]
    R.CTX["racer"] = "looker"
    resumer = one_resumer(skew, other.dsn(skew.dbname), thread, prefix[:2] + "-",
                          interrupt_id=iid)
    try:
        resumer.ready(0)
        with R.Runner("conn", holder.dsn(skew.dbname)) as looker:
            st = looker.get_state("one", thread)
            assert st.interrupts, st
            claimed_at = time.time()
            t_go, r = resumer.go_and_finish()
    finally:
        resumer.kill()
    return thread, t_go - claimed_at, r["t_end"] - claimed_at, r, resumer.ids


@pytest.mark.timeout(120)
def test_a_claim_held_behind_is_not_taken_over_ahead_before_its_lapse(skew):
    thread, released, waited, r, ids = hold_then_resume(skew, skew.behind, skew.ahead,
                                                        "skew-lapse-")
    print(f"the resume through the proxy {SKEW_S} s ahead, released {released:.2f} s "
          f"after the claim, was served {waited:.2f} s after it (lapse {LAPSE_MS} ms of the "
          f"database's time)")
    assert released < 1.0, "the resume must race the live claim"
    assert r["ok"], r
    assert waited >= LAPSE_MS / 1000 - 0.5, waited
    assert [row[0] for row in ledger(skew, thread)] == [ids[0]]


@pytest.mark.timeout(120)
def test_a_claim_held_ahead_is_taken_over_behind_once_it_lapses(skew):
    # The resume through the proxy behind waits for the lapse on the database's
    # clock, then takes the claim over: neither 30 s longer (the lapse read on its
    # own clock) nor refused for waiting past its bound.
    thread, released, waited, r, ids = hold_then_resume(skew, skew.ahead, skew.behind,
                                                        "skew-back-")
    print(f"the resume through the proxy {SKEW_S} s behind was served {waited:.2f} s after "
          f"the claim taken ahead (lapse {LAPSE_MS} ms of the database's time)")
    assert released < 1.0, "the resume must race the live claim"
    assert r["ok"], r
    assert LAPSE_MS / 1000 - 0.5 <= waited < LAPSE_MS / 1000 + SKEW_S / 2, waited
    assert [row[0] for row in ledger(skew, thread)] == [ids[0]]


@pytest.mark.timeout(120)
def test_the_shared_trail_reads_a_park_ahead_and_its_answer_behind_in_the_order_they_happened(
        skew):
    thread = f"skew-trail-{uuid.uuid4().hex[:8]}"
    park(skew.ahead.dsn(skew.dbname), thread)
    answered = in_process_resume(skew.behind.dsn(skew.dbname), thread, "skew-trail")
    assert answered["ok"], answered
    events = timeline(skew.behind, thread, {"interrupt_parked", "resume_recorded"})
    ops = [(e["operation"], e["proxy_id"]) for e in events]
    print(f"the shared trail of a thread parked {SKEW_S} s ahead and answered behind: {ops}")
    parked = ops.index(("interrupt_parked", "skew-ahead"))
    answer = ops.index(("resume_recorded", "skew-behind"))
    assert parked < answer, ops
    # Each record keeps its replica's time: the answer's reads 30 s before the park's.
    at = {e["operation"]: datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
          for e in events if e["operation"] in ("interrupt_parked", "resume_recorded")}
    early = (at["interrupt_parked"] - at["resume_recorded"]).total_seconds()
    assert SKEW_S - 10 < early < SKEW_S + 5, early
