"""The audit trail across replicas (``[audit] postgres = true``), end to end: two
``resumeguard serve`` processes with separate state dirs in front of one PostgreSQL
15 (consume-once claims shared in its ``resumeguard`` schema), real LangGraph racers
split over the two.

- with ``postgres = true`` on both, ``resumeguard audit --thread T`` run with proxy
  A's configuration, and ``GET /threads/{id}`` on A's admin listener, show the claim
  taken through one proxy AND the refusal recorded by the other (both proxy ids),
  and say that the PostgreSQL table of every replica answered;
- beside it the same race over two proxies with ``postgres = false`` (each replica's
  trail its own SQLite file): A's trail shows only A's events, the other proxy's
  decision on the same thread is missing (what operators had before).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

import racer as R
from conftest import HOST, connect, free_port, proxy_binary
from test_admin import TOKEN, RaceEnv, http, wait_admin
from test_consume_once import Racers, park

HERE = Path(__file__).resolve().parent
GATE_MS = 300   # long enough that both racers are at the read while the winner's node runs


@pytest.fixture(scope="module", autouse=True)
def ledger_table(direct_dsn):
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None


def replica(proxy_factory, pg, workdir, name: str, audit_pg: bool) -> SimpleNamespace:
    """A proxy with a state dir of its own, its own admin port, and ``[audit]
    postgres`` as given; its configuration names the upstream and the SQLite trail it
    writes, so the audit command finds what it does."""
    name = f"{name}-{uuid.uuid4().hex[:4]}"
    state = workdir / f"state-{name}"
    admin_port = free_port()
    cfg = workdir / f"{name}.toml"
    cfg.write_text(
        f'upstream = "{HOST}:{pg.port}"\nadmin_listen = "{HOST}:{admin_port}"\n\n'
        f'[admin]\ntoken = "{TOKEN}"\n\n'
        f'[audit]\npostgres = {"true" if audit_pg else "false"}\n'
        f'sqlite = "{workdir / f"{name}-audit.sqlite"}"\n\n'
        f'[claims]\nproxy_id = "{name}"\nlapse_ms = 3000\n')
    proxy = proxy_factory("--config", str(cfg), "--state-dir", str(state), name=name)
    assert proxy.audit_db == workdir / f"{name}-audit.sqlite"
    return SimpleNamespace(name=name, proxy=proxy, cfg=cfg, admin=wait_admin(admin_port))


def race_over(a, b, dbname: str, direct: str, workdir: Path) -> tuple[str, dict[str, str]]:
    """Park a thread through A; one racer through A and one through B resume it at
    once. The thread, and which replica each racer went through, by outcome."""
    thread = f"replicas-{uuid.uuid4().hex[:8]}"
    its = park(a.proxy.dsn(dbname), thread)
    racers = Racers(RaceEnv(direct, workdir), [a.proxy.dsn(dbname), b.proxy.dsn(dbname)], "conn",
                    [{"thread": thread, "graph": "one", "form": "bare", "gate_ms": GATE_MS,
                      "interrupt_id": its[0]["id"]}], "rep-")
    try:
        results = racers.run_all()[0]
    finally:
        racers.kill()
    assert sorted(r["ok"] for r in results) == [False, True], results
    by = {("won" if r["ok"] else "refused"): (a, b)[i].name for i, r in enumerate(results)}
    loser = next(r for r in results if not r["ok"])
    assert loser["error"]["sqlstate"] == "55000", loser
    return thread, by


def audit(r, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "audit", "--config", str(r.cfg), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def timeline(r, thread: str, want: set[str], timeout: float = 15.0) -> list[dict]:
    """``audit --thread T --json`` with A's configuration, once it holds the
    operations ``want`` (the trail is written asynchronously) or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        cp = audit(r, "--thread", thread, "--json")
        events = json.loads(cp.stdout) if cp.returncode == 0 else []
        if want <= {e["operation"] for e in events} or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def by_op(events: list[dict], op: str) -> list[str]:
    return [e["proxy_id"] for e in events if e["operation"] == op]


@pytest.mark.timeout(300)
def test_one_timeline_shows_every_replicas_decisions_on_a_thread(proxy_factory, pg, workdir,
                                                                 dbname, direct_dsn):
    a = replica(proxy_factory, pg, workdir, "audit-a", audit_pg=True)
    b = replica(proxy_factory, pg, workdir, "audit-b", audit_pg=True)
    thread, by = race_over(a, b, dbname, direct_dsn, workdir)
    print(f"postgres trail: claim won through {by['won']}, refused through {by['refused']}")

    events = timeline(a, thread, {"claim_taken", "claim_refused"})
    assert by_op(events, "claim_taken") == [by["won"]], events
    assert by_op(events, "claim_refused") == [by["refused"]], events
    assert {e["proxy_id"] for e in events} == {a.name, b.name}
    # One timeline, ordered on the database's clock; each record shows its replica's
    # own time, so records a write's trip apart (two replicas', or one replica's in
    # two batches, each moved by the skew measured on its own trip) may read either
    # way by milliseconds, never by more than a trip on a loaded host.
    for proxy in (a.name, b.name):
        times = [datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
                 for e in events if e["proxy_id"] == proxy]
        back = max((max(times[:i]) - t for i, t in enumerate(times) if i),
                   default=timedelta(0))
        assert back < timedelta(milliseconds=100), f"{proxy}'s records {back} out of its time order"
    text = audit(a, "--thread", thread)
    assert text.returncode == 0, text.stderr
    head = text.stdout.splitlines()[0]
    assert head.startswith("audit trail: postgres ") and "(every replica)" in head, head
    assert f"replicas {a.name}, {b.name}" in text.stdout, text.stdout
    refused = next(ln for ln in text.stdout.splitlines() if "claim refused" in ln)
    assert f"proxy={by['refused']}" in refused, refused
    listed = audit(a, "--threads", "--op", "claim_refused")
    assert listed.returncode == 0 and thread in listed.stdout, listed.stdout

    status, body = http(a.admin, "GET", f"/threads/{thread}")
    assert status == 200, body
    ledger = json.loads(body)
    assert "(every replica)" in ledger["source"], ledger["source"]
    assert set(ledger["replicas"]) == {a.name, b.name}, ledger["replicas"]
    approval = ledger["approvals"][0]
    assert approval["claimed"]["proxy_id"] == by["won"], approval
    assert [m["proxy_id"] for m in approval["refused"]] == [by["refused"]], approval


def verify(r, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "audit", "verify", "--config", str(r.cfg), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def chains_of(cp: subprocess.CompletedProcess, names: set[str]) -> tuple[dict, list]:
    """``audit verify --json``: the chains of the replicas ``names``, and their breaks
    (the table is shared with every other test's replicas)."""
    assert cp.stdout, f"audit verify exited {cp.returncode}: {cp.stderr}"
    verdict = json.loads(cp.stdout)
    chains = {c["proxy_id"]: c for c in verdict["chains"] if c["proxy_id"] in names}
    breaks = [b for b in verdict["breaks"] if b["proxy_id"] in names]
    return chains, breaks


@pytest.mark.timeout(300)
def test_verify_proves_each_replicas_chain_in_the_table_and_names_an_edited_record(
        proxy_factory, pg, workdir, dbname, direct_dsn):
    a = replica(proxy_factory, pg, workdir, "chain-a", audit_pg=True)
    b = replica(proxy_factory, pg, workdir, "chain-b", audit_pg=True)
    thread, by = race_over(a, b, dbname, direct_dsn, workdir)
    timeline(a, thread, {"claim_taken", "claim_refused", "claim_consumed"})
    names = {a.name, b.name}
    cp = verify(a, "--json")
    chains, breaks = chains_of(cp, names)
    assert breaks == [] and set(chains) == names, cp.stdout
    assert all(c["records"] > 0 for c in chains.values()), chains

    # As the table's owner can: triggers off, one of A's records rewritten.
    with connect(direct_dsn.rsplit("/", 1)[0] + "/postgres") as c:
        row = c.execute("SELECT id, detail::text FROM resumeguard.audit_events "
                        "WHERE proxy_id = %s AND thread_id = %s ORDER BY id LIMIT 1",
                        (by["won"], thread)).fetchone()
        assert row, "the winner's records are in the table"
        rid, original = row

        def rewrite(detail: str) -> None:
            c.execute("ALTER TABLE resumeguard.audit_events DISABLE TRIGGER USER")
            c.execute("UPDATE resumeguard.audit_events SET detail = %s::json WHERE id = %s",
                      (detail, rid))
            c.execute("ALTER TABLE resumeguard.audit_events ENABLE TRIGGER USER")

        rewrite('{"rewritten": true}')
        try:
            cp = verify(a)
            assert cp.returncode == 1, (cp.stdout, cp.stderr)
            assert f"BROKEN: record {rid} (replica {by['won']}) was changed" in cp.stdout, cp.stdout
            assert "does not verify" in cp.stderr, cp.stderr
        finally:
            rewrite(original)
    chains, breaks = chains_of(verify(a, "--json"), names)
    assert breaks == [], "restored, the chain holds again"


@pytest.mark.timeout(300)
def test_without_it_each_replica_shows_only_its_own_events(proxy_factory, pg, workdir, dbname,
                                                           direct_dsn):
    a = replica(proxy_factory, pg, workdir, "local-a", audit_pg=False)
    b = replica(proxy_factory, pg, workdir, "local-b", audit_pg=False)
    thread, by = race_over(a, b, dbname, direct_dsn, workdir)
    print(f"sqlite trails: claim won through {by['won']}, refused through {by['refused']}")
    mine = "claim_taken" if by["won"] == a.name else "claim_refused"
    theirs = "claim_refused" if mine == "claim_taken" else "claim_taken"
    events = timeline(a, thread, {mine})
    # Give B's decision the same time to show up: it never does in A's trail.
    time.sleep(1.0)
    events = timeline(a, thread, {mine, theirs}, timeout=2.0)
    assert by_op(events, mine) == [a.name], events
    assert by_op(events, theirs) == [], f"{theirs} by {b.name} is not in {a.name}'s trail"
    assert {e["proxy_id"] for e in events} == {a.name}
    text = audit(a, "--thread", thread)
    assert text.stdout.splitlines()[0].startswith("audit trail: sqlite "), text.stdout
    status, body = http(a.admin, "GET", f"/threads/{thread}")
    assert status == 200, body
    assert json.loads(body)["replicas"] == [a.name]
