"""Consume-once claims that must neither strand a thread nor fail open, end to end
(real PostgreSQL 15, real LangGraph, ``resumeguard serve`` processes):

- an answered run that died after its gated task's writes but before its next
  checkpoint (a crash, a PostgreSQL restart) leaves the thread parked; stock LangGraph
  continues it, and so must the proxy once the answering session is gone — or at
  once after ``resumeguard claims release``;
- the ``/* resumeguard:inspect */`` comment marks inspection only where
  ``[claims] inspection_sql_hint = true``: without it, a hinted resume claims like
  any other and a race with it fires once.

The crash is made deterministic with a trigger that refuses the thread's next
checkpoint INSERT: the resume's gated task writes commit, its next checkpoint does
not, and the process ends. Then, as a crash before commit leaves it, the gated
task's writes on the parked checkpoint and anything newer are deleted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import racer as R
from conftest import HOST, proxy_binary, run_audit_cli

HERE = Path(__file__).resolve().parent
GRACE_MS = 500           # holder_gone_grace_ms
LAPSE_MS = 3000
ANSWERED = "55000"
FAIL_CLOSED = "58000"


@pytest.fixture(scope="module")
def db(direct_dsn):
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return direct_dsn


def start_proxy(proxy_factory, workdir: Path, name: str, **claims) -> object:
    keys = {"lapse_ms": LAPSE_MS, "holder_gone_grace_ms": GRACE_MS,
            "proxy_id": name, **claims}
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    cfg = workdir / f"{name}.toml"
    cfg.write_text(f"[claims]\n{body}")
    return proxy_factory("--config", str(cfg), name=name)


def tid(prefix: str) -> str:
    return f"rec-{prefix}-{uuid.uuid4().hex[:8]}"


def dsn_of(proxy, direct: str, app: str | None = None) -> str:
    dbname = direct.rsplit("/", 1)[1].split("?")[0]
    base = proxy.dsn(dbname)
    if app:
        base += ("&" if "?" in base else "?") + f"application_name={app}"
    return base


ledger = R.ledger


def park(dsn: str, thread: str) -> str:
    with R.Runner("conn", dsn) as r:
        res = r.invoke("one", dict(R.INITIAL), thread)
    its = R.interrupts_of(res)
    assert its, res
    return its[0]["id"]


def resume(dsn: str, thread: str, racer_id: str, **job) -> dict:
    R.CTX["racer"] = racer_id
    with R.Runner(job.pop("saver", "conn"), dsn, hint=job.pop("hint", False)) as r:
        return R.resume_once(r, {"thread": thread, **job})


def get_state(dsn: str, thread: str) -> dict:
    """An unmarked get_state; its outcome as plain data."""
    try:
        with R.Runner("conn", dsn) as r:
            st = r.get_state("one", thread)
        return {"ok": True, "next": list(st.next), "values": dict(st.values)}
    except Exception as e:
        return {"ok": False, "error": R.describe_error(e)}


def crash_after_gated_writes(direct: str, via: str, thread: str) -> str:
    """Parks ``thread`` through ``via``, then resumes it through ``via`` with the
    thread's next checkpoint INSERT refused (the run dies after its gated task's
    writes committed); then deletes the thread's rows newer than the parked
    checkpoint and the gated task's writes on it. Returns the parked checkpoint id."""
    park(via, thread)
    with psycopg.connect(direct, autocommit=True) as c:
        parked = c.execute("select max(checkpoint_id) from checkpoints where thread_id = %s",
                           (thread,)).fetchone()[0]
        fn = "rg_crash_" + re.sub(r"\W", "_", thread)
        c.execute(f"""create function {fn}() returns trigger language plpgsql as $$
            begin
              if new.thread_id = '{thread}' then
                raise exception 'test: the process died before its next checkpoint';
              end if;
              return new;
            end $$""")
        c.execute(f"create trigger {fn} before insert on checkpoints "
                  f"for each row execute function {fn}()")
        try:
            crashed = resume(via, thread, "crashed", gate_ms=0)
        finally:
            c.execute(f"drop trigger {fn} on checkpoints")
            c.execute(f"drop function {fn}()")
        assert not crashed["ok"], crashed
        assert "died before its next checkpoint" in crashed["error"]["message"], crashed
        assert [r[:2] for r in ledger(direct, thread)] == [("crashed", "gate")]
        written = c.execute("select count(*) from checkpoint_writes where thread_id = %s "
                            "and checkpoint_id = %s and channel <> '__interrupt__'",
                            (thread, parked)).fetchone()[0]
        assert written > 0, "the gated task's writes did not commit: no crash to recover from"
        c.execute("delete from checkpoint_writes where thread_id = %s and (checkpoint_id > %s "
                  "or (checkpoint_id = %s and channel <> '__interrupt__'))",
                  (thread, parked, parked))
        c.execute("delete from checkpoints where thread_id = %s and checkpoint_id > %s",
                  (thread, parked))
    return parked


def claims_at(pg) -> list[str]:
    """Where the proxies keep their claims: the PostgreSQL they front."""
    return ["--upstream", f"postgres://postgres@{HOST}:{pg.port}/postgres"]


def claims_cli(*args: str) -> str:
    cp = subprocess.run([str(proxy_binary()), "claims", *args], capture_output=True, text=True,
                        timeout=30)
    assert cp.returncode == 0, f"claims {args}: rc={cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return cp.stdout


# ----------------------------------------------------------------- stranded threads
def test_a_run_that_died_before_its_next_checkpoint_does_not_strand_its_thread(
        db, proxy_factory, workdir):
    """Stock LangGraph continues a thread whose answering run died between its gated
    task's writes and its next checkpoint. Through the proxy the claim was consumed by
    those writes; once the answering session is gone (closed + holder_gone_grace_ms)
    and no child checkpoint was recorded, the next reader takes the claim over
    (audited as the takeover of an abandoned run) and the thread continues: the same
    outcome as stock."""
    p = start_proxy(proxy_factory, workdir, "rec-strand")
    outcome = {}
    for via_name, via in (("direct", db), ("proxy", dsn_of(p, db))):
        thread = tid(f"strand-{via_name}")
        crash_after_gated_writes(db, via, thread)
        time.sleep(GRACE_MS / 1000 + 0.5)
        st = get_state(via, thread)
        assert st["ok"], (via_name, st)
        assert st["next"] == ["gate"], (via_name, st)
        again = resume(via, thread, "again", gate_ms=0)
        assert again["ok"], (via_name, again)
        assert [r[:2] for r in ledger(db, thread)] == [("crashed", "gate"), ("again", "gate")]
        outcome[via_name] = (st["next"], again["values"])
        if via_name == "proxy":
            evs = run_audit_cli(p.audit_db, thread)
            takeovers = [e for e in evs if e["operation"] == "claim_takeover"]
            assert takeovers, [e["operation"] for e in evs]
            assert "abandoned run" in takeovers[0]["detail"]["takeover"], takeovers[0]
            # the answered interrupt stays answered for duplicates of the new run: the
            # duplicate reads the finished head and is refused as a late duplicate
            dup = resume(via, thread, "dup", gate_ms=0)
            assert [r[0] for r in ledger(db, thread)] == ["crashed", "again"], dup
            assert not dup["ok"] and dup["error"]["sqlstate"] == "55000", dup
            assert dup["error"]["message"].startswith("resumeguard: late duplicate resume"), dup
    assert outcome["proxy"] == outcome["direct"], outcome


def test_claims_release_frees_a_thread_whose_run_died(db, pg, proxy_factory, workdir):
    """With the answering session still counted as present (a long holder_gone_grace_ms),
    the thread of a run that died before its next checkpoint is refused (55000);
    ``resumeguard claims release`` releases that answered claim (the thread never moved
    on from it) and the next resume goes through at once."""
    p = start_proxy(proxy_factory, workdir, "rec-release", holder_gone_grace_ms=600_000)
    via = dsn_of(p, db)
    thread = tid("release")
    crash_after_gated_writes(db, via, thread)
    st = get_state(via, thread)
    assert not st["ok"] and st["error"]["sqlstate"] == ANSWERED, st
    out = claims_cli("release", "--thread", thread, *claims_at(pg))
    assert "released 1 claim(s)" in out, out
    t0 = time.monotonic()
    again = resume(via, thread, "again", gate_ms=0)
    assert again["ok"], again
    assert time.monotonic() - t0 < LAPSE_MS / 1000, "the resume waited for a lapse"
    assert [r[0] for r in ledger(db, thread)] == ["crashed", "again"]
    # finished: nothing left to release, and a duplicate runs nothing
    assert "released 0 claim(s)" in claims_cli("release", "--thread", thread, *claims_at(pg))


def test_a_thread_rewound_to_an_answered_checkpoint_is_released_by_naming_it(
        db, pg, proxy_factory, workdir):
    """A resume that ran to the end, then the thread rewound by hand to the parked
    checkpoint (its newer checkpoints and writes, and the gated task's writes, deleted).
    The proxy saw the run move on, so the interrupt stays answered (a read is refused
    55000, until the superseded grace) and a plain ``claims release --thread`` leaves it;
    naming the checkpoint releases it and the thread continues."""
    p = start_proxy(proxy_factory, workdir, "rec-rewind")
    via = dsn_of(p, db)
    thread = tid("rewind")
    park(via, thread)
    with psycopg.connect(db, autocommit=True) as c:
        parked = c.execute("select max(checkpoint_id) from checkpoints where thread_id = %s",
                           (thread,)).fetchone()[0]
    first = resume(via, thread, "first", gate_ms=0)
    assert first["ok"], first
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("delete from checkpoint_writes where thread_id = %s and (checkpoint_id > %s "
                  "or (checkpoint_id = %s and channel <> '__interrupt__'))",
                  (thread, parked, parked))
        c.execute("delete from checkpoints where thread_id = %s and checkpoint_id > %s",
                  (thread, parked))
    time.sleep(GRACE_MS / 1000 + 0.5)
    st = get_state(via, thread)
    assert not st["ok"] and st["error"]["sqlstate"] == ANSWERED, st
    assert "released 0 claim(s)" in claims_cli("release", "--thread", thread, *claims_at(pg))
    out = claims_cli("release", "--thread", thread, "--checkpoint", parked, *claims_at(pg))
    assert "released 1 claim(s)" in out, out
    again = resume(via, thread, "again", gate_ms=0)
    assert again["ok"], again
    assert [r[0] for r in ledger(db, thread)] == ["first", "again"]


# ----------------------------------------------------------------- the inspection hint is opt-in
def race_hinted_and_plain(via: str, db: str, thread: str, iid: str) -> dict:
    """Two in-process resumes of one parked thread started together: one whose saver
    reads carry the inspection comment, one plain. Returns each one's result."""
    barrier = threading.Barrier(2)
    results: dict[str, dict] = {}

    def run(name: str, hint: bool) -> None:
        with R.Runner("conn", via, hint=hint) as r:
            barrier.wait()
            results[name] = R.resume_once(r, {"thread": thread, "gate_ms": 500,
                                              "value": f"v-{name}", "interrupt_id": iid})

    threads = [threading.Thread(target=run, args=(n, h)) for n, h in (("hinted", True),
                                                                       ("plain", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_the_inspection_comment_claims_unless_the_hint_is_configured(db, proxy_factory, workdir):
    """Without ``inspection_sql_hint`` a resume whose reads carry
    ``/* resumeguard:inspect */`` claims like any other: racing a plain resume, the
    gated node runs once and the other is refused. With the key set the comment marks
    inspection, so that same race fires twice (which is why it is opt-in)."""
    fires = {}
    for name, hint_key in (("off", {}), ("on", {"inspection_sql_hint": True})):
        proxy = start_proxy(proxy_factory, workdir, f"rec-hint-{name}", **hint_key)
        thread = tid(f"hint-{name}")
        via = dsn_of(proxy, db)
        iid = park(via, thread)
        results = race_hinted_and_plain(via, db, thread, iid)
        fires[name] = len(ledger(db, thread))
        if name == "off":
            assert fires["off"] == 1, (ledger(db, thread), results)
            refused = [r for r in results.values() if not r["ok"]]
            assert len(refused) == 1, results
            assert refused[0]["error"]["sqlstate"] in (ANSWERED, "55006"), refused
    print(f"gated node fires with a hinted racer: without the key {fires['off']}, "
          f"with inspection_sql_hint = true {fires['on']}")
    assert fires == {"off": 1, "on": 2}, fires
