"""Fencing of superseded claim holders, end to end: two proxies (``fx-A``, ``fx-B``)
that share nothing but the database (claims in PostgreSQL, a state directory
each); each scenario runs beside the same scenario straight to PostgreSQL, where
the stock defect shows.

- A map-form gate slower than ``lapse_ms``: the first resumer's claim lapses while
  its node still runs, a second resumer (other proxy) takes it over and completes;
  the first resumer's writes then arrive. Stock: both runs write, the parked
  checkpoint gets two children. Through the proxies: the first resumer's writes are
  fenced (RGF01, ``write_fenced``), nothing of them is written, one child.
- A replay: while a holder's node runs, a session that never held the claim (a plain
  psycopg connection through the holder's proxy with another application_name, or
  through the other proxy) sends the gated task's pending write: fenced; stock: it
  lands.
- A psycopg pool: an unmarked get_state on one pooled connection claims, the resume
  reads and writes on others; none of the pool's writes is fenced.

Each scenario runs with fencing in both places (the module's fixture is
parametrized): ``lookup``, where the claims schema is in another database than the
sessions' (the proxies' upstream names no database, so it lives in ``postgres``)
and the proxy asks the store at each write's Bind; and ``in_transaction``, where
the upstream names the sessions' database, the schema lives beside the checkpoints
and the server checks each write inside its own transaction.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import psycopg
import pytest
from langgraph.checkpoint.postgres.base import BasePostgresSaver

import racer as R
from conftest import HOST, free_port
from test_consume_once import Env, audit_ops, ledger, one_resumer, ops, park

LAPSE_MS = 1000
SLOW_GATE_MS = LAPSE_MS + 3000
FENCED = "RGF01"
# The application_name whose reads fx-A and fx-B take as inspection.
INSPECTOR = "fx-inspect"


@pytest.fixture(scope="module", params=["lookup", "in_transaction"])
def fx(proxy_factory, direct_dsn, workdir, pg, request) -> Env:
    # The default claims backend (the PostgreSQL the proxies front), and a state
    # directory per proxy: the two share nothing but the database.
    place = request.param
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]
    upstream = (f"postgres://postgres@{HOST}:{pg.port}/{dbname}"
                if place == "in_transaction" else None)
    cfg = workdir / "fx.toml"
    cfg.write_text(f'[enforce]\nconsume_once = true\n\n[claims]\n'
                   f'lapse_ms = {LAPSE_MS}\npolicy = "wait"\nholder_gone_grace_ms = 1000\n'
                   f'inspection_application_names = ["^{INSPECTOR}$"]\n')
    state = workdir / f"fx-state-{uuid.uuid4().hex[:6]}"
    admin = free_port()
    a = proxy_factory("--config", str(cfg), "--proxy-id", "fx-A", "--admin-listen",
                      f"{HOST}:{admin}", "--state-dir", str(state / "a"),
                      name=f"fx-A-{place}", upstream=upstream)
    b = proxy_factory("--config", str(cfg), "--proxy-id", "fx-B", "--state-dir",
                      str(state / "b"), name=f"fx-B-{place}", upstream=upstream)
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    R.main(["setup", "--dsn", direct_dsn])
    env = Env(direct_dsn, a, b, a, 0, workdir)
    env.proxy_ids = {a.port: "fx-A", b.port: "fx-B"}
    env.admin = f"http://{HOST}:{admin}"
    env.place = place
    return env


def tid(prefix: str) -> str:
    return f"fx-{prefix}-{uuid.uuid4().hex[:8]}"


def head_id(env: Env, thread: str) -> str:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select checkpoint_id from checkpoints where thread_id = %s and "
                         "checkpoint_ns = '' order by checkpoint_id desc limit 1",
                         (thread,)).fetchone()[0]


def children(env: Env, thread: str, parent: str) -> list[str]:
    with psycopg.connect(env.direct, autocommit=True) as c:
        rows = c.execute("select checkpoint_id from checkpoints where thread_id = %s and "
                         "checkpoint_ns = '' and parent_checkpoint_id = %s", (thread, parent))
        return [r[0] for r in rows.fetchall()]


def wait_for_gate(env: Env, thread: str, racer: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(r[0] == racer and r[1] == "gate" for r in ledger(env, thread)):
        assert time.monotonic() < deadline, f"{racer}'s gate never ran"
        time.sleep(0.01)


def test_a_holder_superseded_during_a_slow_map_gate_is_fenced(fx):
    """Racer 1 (fx-A) resumes in map form and its gate runs longer than lapse_ms;
    racer 2 (fx-B) reads meanwhile, waits for the lapse, takes the claim over and
    completes. Racer 1's writes come after: stock, they land and the parked checkpoint
    has two children; through the proxies they are fenced, audited as write_fenced
    naming the holder and its epoch, and the parked checkpoint has one child, racer
    2's."""
    outcome = {}
    for via in ("direct", "proxies"):
        dsn1, dsn2 = (fx.direct, fx.direct) if via == "direct" else (fx.dsn("A"), fx.dsn("B"))
        thread = tid(f"slow-{via}")
        iid = park(dsn1, thread)[0]["id"]
        parked = head_id(fx, thread)
        first = one_resumer(fx, dsn1, thread, f"s1{via[0]}-", form="map", interrupt_id=iid,
                            gate_ms=SLOW_GATE_MS)
        second = one_resumer(fx, dsn2, thread, f"s2{via[0]}-", form="map", interrupt_id=iid)
        try:
            first.ready(0)
            second.ready(0)
            first.go(0)
            wait_for_gate(fx, thread, first.ids[0])
            second.go(0)
            r2 = second.results(0)[0]
            r1 = first.results(0, timeout=SLOW_GATE_MS / 1000 + 60)[0]
            first.finish()
            second.finish()
        finally:
            first.kill()
            second.kill()
        assert r2["ok"], r2
        assert r2["t_end"] < r1["t_end"], "the takeover's run must finish first"
        kids = children(fx, thread, parked)
        print(f"{via}: first resumer ok={r1['ok']} error={r1['error']}; children of the "
              f"parked checkpoint: {len(kids)}")
        if via == "direct":
            assert r1["ok"], r1
            assert len(kids) == 2, kids
        else:
            assert not r1["ok"], r1
            assert r1["error"]["sqlstate"] == FENCED, r1["error"]
            message = r1["error"]["message"]
            for part in ("write fenced", f'thread "{thread}"', f'checkpoint "{parked}"',
                         "proxy fx-B", "at epoch 2", "held epoch 1, which was taken over",
                         "nothing of this write was committed"):
                assert part in message, (part, message)
            assert len(kids) == 1, kids
            with R.Runner("conn", fx.direct) as rn:
                st = rn.get_state("one", thread)
            assert list(st.next) == [] and st.values["approved"] == f"v-{second.ids[0]}", st
            evs = audit_ops(fx, thread, lambda e: ops(e, "write_fenced"))
            fenced = ops(evs, "write_fenced")
            assert fenced, [e["operation"] for e in evs]
            d = fenced[0]["detail"]
            assert (d["sqlstate"], d["fence"], d["epoch"], d["continues"]) == \
                (FENCED, "superseded_holder", 2, parked), d
            assert d["holder"]["proxy_id"] == "fx-B", d
            assert fenced[0]["application_name"] == f"racer-{first.ids[0]}"
            assert {e["application_name"] for e in ops(evs, "claim_takeover")} == \
                {f"racer-{second.ids[0]}"}
        # the gate itself ran in both (the effect happened before any write)
        assert [r[0] for r in ledger(fx, thread)] == [first.ids[0], second.ids[0]]
        outcome[via] = len(kids)
    assert outcome == {"direct": 2, "proxies": 1}


def replay_write(dsn: str, thread: str, parked: str, task_id: str) -> str | None:
    """The gated task's pending write, sent as the saver sends it; the SQLSTATE of
    its error, or None if it was written."""
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(BasePostgresSaver.UPSERT_CHECKPOINT_WRITES_SQL,
                      (thread, "", parked, task_id, "", 7, "replayed", "msgpack", b"\xa1x"))
    except psycopg.Error as e:
        return e.sqlstate
    return None


def park_with_task(env: Env, dsn: str, thread: str) -> tuple[str, str, str]:
    """Parks ``thread`` through ``dsn``: its interrupt's id, the parked checkpoint and
    the id of the task that parked there."""
    iid = park(dsn, thread)[0]["id"]
    parked = head_id(env, thread)
    with psycopg.connect(env.direct, autocommit=True) as c:
        task_id = c.execute("select task_id from checkpoint_writes where thread_id = %s and "
                            "checkpoint_id = %s and channel = '__interrupt__'",
                            (thread, parked)).fetchone()[0]
    return iid, parked, task_id


def replays_during_a_holders_gate(env: Env, dsn: str, thread: str, tag: str,
                                  replayers: list[str]) -> tuple[list, int]:
    """Parks ``thread`` through ``dsn``, starts one map-form resumer there whose gate
    runs 2.5 s and, while it runs, replays the gated task's pending write through
    each of ``replayers``: their SQLSTATEs (None: written) and the replayed rows. The
    holder's own run must complete."""
    iid, parked, task_id = park_with_task(env, dsn, thread)
    holder = one_resumer(env, dsn, thread, f"h{tag}-", form="map", interrupt_id=iid, gate_ms=2500)
    try:
        holder.ready(0)
        holder.go(0)
        wait_for_gate(env, thread, holder.ids[0])
        states = [replay_write(d, thread, parked, task_id) for d in replayers]
        rows = replayed_rows(env, thread)
        r = holder.results(0)[0]
        holder.finish()
    finally:
        holder.kill()
    assert r["ok"], r
    return states, rows


def replayed_rows(env: Env, thread: str) -> int:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select count(*) from checkpoint_writes where thread_id = %s and "
                         "channel = 'replayed'", (thread,)).fetchone()[0]


def test_a_replayed_write_from_a_session_that_never_held_the_claim_is_fenced(fx):
    """While the holder's (fx-A) gate runs, the gated task's pending write for the
    parked checkpoint is replayed from a plain connection: through fx-A with another
    application_name (other client) and through fx-B (other proxy). Stock: it is
    written. Through the proxies: fenced (RGF01) and nothing written; the holder's own
    run then completes."""
    outcome = {}
    for via in ("direct", "proxies"):
        dsn = fx.direct if via == "direct" else fx.dsn("A")
        thread = tid(f"replay-{via}")
        replayers = [fx.direct] if via == "direct" else [fx.dsn("A", "replayer"), fx.dsn("B")]
        states, rows = replays_during_a_holders_gate(fx, dsn, thread, via[0], replayers)
        print(f"{via}: replays answered {states}, replayed rows {rows}")
        if via == "proxies":
            evs = audit_ops(fx, thread, lambda e: len(ops(e, "write_fenced")) >= 2)
            fences = sorted(e["detail"]["fence"] for e in ops(evs, "write_fenced"))
            assert fences == ["other_client", "other_proxy"], fences
            assert all(e["detail"]["holder"]["proxy_id"] == "fx-A" and e["detail"]["epoch"] == 1
                       for e in ops(evs, "write_fenced"))
            # the holder's own writes were not fenced
            assert not any(e["application_name"].startswith("racer-") for e in ops(evs, "write_fenced"))
        outcome[via] = (states, rows)
    assert outcome == {"direct": ([None], 1), "proxies": ([FENCED, FENCED], 0)}


def test_a_replayed_write_whose_client_encoding_the_server_converts_is_not_written(fx):
    """As above, for a thread whose id is outside ASCII, replayed through fx-A from a
    session whose client_encoding is SJIS: the server converts its bytes to the
    held thread, where the proxy reads another (ﾃｩ is 0xC3 0xA9 in SJIS, é read as
    UTF-8), which no claim holds. Stock: written. By lookup the store cannot be
    asked for the thread, and the write is refused 0A000, audited write_fenced; in
    the write's transaction the server checks the client's own bytes, converted as
    the write's are, and fences it RGF01."""
    sjis = "&options=-c%20client_encoding%3DSJIS"
    outcome = {}
    for via in ("direct", "proxies"):
        dsn = fx.direct if via == "direct" else fx.dsn("A")
        thread = f"fx-ﾃｩ-{via}-{uuid.uuid4().hex[:8]}"
        replayer = (fx.direct if via == "direct" else fx.dsn("A", "replayer")) + sjis
        states, rows = replays_during_a_holders_gate(fx, dsn, thread, f"e{via[0]}", [replayer])
        outcome[via] = (states, rows)
    refused = "0A000" if fx.place == "lookup" else FENCED
    assert outcome == {"direct": ([None], 1), "proxies": ([refused], 0)}
    if fx.place == "lookup":
        evs = audit_ops(fx, thread.encode("shift_jis").decode("utf-8"),
                        lambda e: ops(e, "write_fenced"), proxies=("A",))
        fences = [(e["detail"]["fence"], e["detail"]["sqlstate"])
                  for e in ops(evs, "write_fenced")]
        assert fences == [("client_encoding", "0A000")], evs


def metric(env: Env, name: str, label: str) -> dict[str, float]:
    """fx-A's metric `name` (a counter, or a histogram's _count), by `label`."""
    deadline = time.time() + 10
    while True:  # the admin listener comes up just after the proxy's own
        try:
            text = urllib.request.urlopen(f"{env.admin}/metrics", timeout=10).read().decode()
            break
        except urllib.error.URLError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
            out[value] = float(line.rsplit(" ", 1)[1])
    return out


def fence_lookups(env: Env) -> dict[str, float]:
    """fx-A's resumeguard_fence_lookups_total, by outcome."""
    return metric(env, "resumeguard_fence_lookups_total", "outcome")


def fence_checks(env: Env) -> dict[str, float]:
    """fx-A's resumeguard_fence_checks_total (no store lookup), by where."""
    return metric(env, "resumeguard_fence_checks_total", "where")


def store_calls(env: Env) -> dict[str, float]:
    """How many claim store calls fx-A timed, by op."""
    return metric(env, "resumeguard_claims_store_seconds_count", "op")


def test_a_pool_resume_is_not_fenced_by_its_own_connections(fx):
    """psycopg ConnectionPool (autocommit, 2 connections) through fx-A: an unmarked
    get_state claims the parked head on one pooled connection, the resume reads it on
    another (taking that claim over after lapse_ms) and writes on whichever the pool
    hands out. The run completes as it does straight to PostgreSQL, no write is fenced,
    and the proxy's fence lookups accepted pooled writers (outcome "pool")."""
    outcome = {}
    before = fence_lookups(fx)
    checks_before = fence_checks(fx)
    timed_before = store_calls(fx)
    for via in ("direct", "A"):
        dsn = fx.direct if via == "direct" else fx.dsn("A")
        thread = tid(f"pool-{via}")
        R.CTX["racer"] = f"pool{via}"
        with R.Runner("pool", dsn) as r:
            R.CTX["thread"] = thread
            r.invoke("one", dict(R.INITIAL), thread)
            st = r.get_state("one", thread)
            assert st.interrupts, st
            res = r.invoke("one", R.Command(resume="yes"), thread)
        outcome[via] = R.plain(res)
    assert outcome["A"] == outcome["direct"] == {"items": ["prep", "gate:yes", "after"],
                                                 "approved": "yes"}, outcome
    evs = audit_ops(fx, thread, lambda e: ops(e, "claim_consumed"), proxies=("A",))
    assert not ops(evs, "write_fenced"), ops(evs, "write_fenced")
    after = fence_lookups(fx)
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    checks = fence_checks(fx)
    checked = {k: checks.get(k, 0) - checks_before.get(k, 0) for k in checks}
    print(f"fence lookups during the pooled run: {grew}; without a lookup: {checked}")
    if fx.place == "lookup":
        assert grew.get("pool", 0) >= 1, grew
    else:
        # Every write continuing the parked checkpoint was checked by the server,
        # in its own transaction: no lookup at all.
        assert checked.get("in_transaction", 0) >= 1, checked
        assert sum(grew.values()) == 0, grew
    assert grew.get("fenced", 0) == 0, grew
    # Every lookup, and the parked reads' claims, are timed.
    timed = store_calls(fx)
    timed_grew = {k: timed.get(k, 0) - timed_before.get(k, 0) for k in timed}
    assert timed_grew.get("fence_lookup", 0) == sum(grew.values()), (timed_grew, grew)
    assert timed_grew.get("claim", 0) >= 2, timed_grew


def test_a_takeover_waits_for_the_holders_commit(fx):
    """The holder (fx-A) reads the parked head (its claim) and writes the gated
    task's result inside an explicit transaction that it keeps open 2.5 s, longer
    than the 2 s commit cover a lookup gives and longer than lapse_ms. A resume
    through fx-B reads the parked head meanwhile. Stock: the resume runs the gated
    node beside the holder's answer (two answers). With fencing in the write's
    transaction: the server checked the write inside the holder's transaction and
    kept the claim there (its row locked until the commit, its lapse moved past
    it), so the resume's decision waits until the holder's commit, then finds the
    interrupt answered and is refused (55000); its node never runs, nothing is
    forked."""
    if fx.place != "in_transaction":
        pytest.skip("a lookup covers a holder's open transaction for 2 s only "
                    "(docs/architecture.md, known limits)")
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    outcome = {}
    for via in ("direct", "proxies"):
        dsn_a, dsn_b = (fx.direct, fx.direct) if via == "direct" else (fx.dsn("A"), fx.dsn("B"))
        thread = tid(f"commit-{via}")
        iid = park(dsn_a, thread)[0]["id"]
        parked = head_id(fx, thread)
        taker = one_resumer(fx, dsn_b, thread, f"t{via[0]}-", interrupt_id=iid)
        try:
            taker.ready(0)
            with psycopg.connect(dsn_a + "&application_name=holder", autocommit=True,
                                 prepare_threshold=0, row_factory=dict_row) as conn:
                saver = PostgresSaver(conn)
                tup = saver.get_tuple({"configurable": {"thread_id": thread,
                                                        "checkpoint_ns": ""}})
                task_id = next(w[0] for w in tup.pending_writes if w[1] == "__interrupt__")
                with conn.transaction():
                    saver.put_writes(tup.config, [("approved", "holder")], task_id)
                    taker.go(0)
                    time.sleep(2.5)
                t_commit = time.time()
            r = taker.results(0, timeout=60)[0]
            taker.finish()
        finally:
            taker.kill()
        fires = [row[0] for row in ledger(fx, thread)]
        print(f"{via}: the taker ok={r['ok']} error={r['error']} "
              f"{r['t_end'] - t_commit:+.2f} s after the holder's commit; fires {fires}")
        if via == "direct":
            assert r["ok"], r
            assert fires == [taker.ids[0]], fires
        else:
            assert not r["ok"], r
            assert r["error"]["sqlstate"] == "55000", r["error"]
            assert r["t_end"] >= t_commit, "the taker's answer came before the commit"
            assert fires == [], fires
            assert children(fx, thread, parked) == [], "nothing continued the parked head"
        outcome[via] = len(fires)
    assert outcome == {"direct": 1, "proxies": 0}


def claims_outcomes(env: Env) -> dict[str, float]:
    """fx-A's resumeguard_claims_total, by outcome."""
    return metric(env, "resumeguard_claims_total", "outcome")


def test_a_holders_re_read_of_its_claim_asks_the_store_nothing(fx):
    """Sync saver, one connection through fx-A: an unmarked get_state claims the
    parked head (one claim store call: ``claim_ahead``, fx-A parked it), the resume on the same connection reads the
    head again: answered from what the proxy remembers of its session's claim
    (claims outcome held_known), no second claim store call; the gate fires once and
    the run ends as it does straight to PostgreSQL. A second get_state after the
    resume finds the thread moved on: nothing is claimed from memory."""
    outcome = {}
    for via in ("direct", "A"):
        dsn = fx.direct if via == "direct" else fx.dsn("A")
        thread = tid(f"reread-{via}")
        R.CTX["racer"] = f"reread{via}"
        R.CTX["thread"] = thread
        with R.Runner("conn", dsn) as r:
            r.invoke("one", dict(R.INITIAL), thread)
            calls, known = store_calls(fx), claims_outcomes(fx)
            st = r.get_state("one", thread)
            assert st.interrupts, st
            after_state = store_calls(fx)
            res = r.invoke("one", R.Command(resume="yes"), thread)
            after_resume, known_after = store_calls(fx), claims_outcomes(fx)
            r.get_state("one", thread)
            after_second = claims_outcomes(fx)
        outcome[via] = R.plain(res)
        gates = [row for row in ledger(fx, thread) if row[1] == "gate"]
        assert len(gates) == 1, gates
        if via == "A":
            def claim_calls(c: dict) -> float:
                return c.get("claim", 0) + c.get("claim_ahead", 0)
            assert claim_calls(after_state) - claim_calls(calls) == 1, (calls, after_state)
            assert claim_calls(after_resume) == claim_calls(after_state), \
                (after_state, after_resume)
            assert known_after.get("held_known", 0) - known.get("held_known", 0) == 1, \
                (known, known_after)
            assert after_second.get("held_known", 0) == known_after.get("held_known", 0), \
                (known_after, after_second)
    assert outcome["A"] == outcome["direct"] == {"items": ["prep", "gate:yes", "after"],
                                                 "approved": "yes"}, outcome


def claims_db(env: Env) -> str:
    """Where the proxies keep their claims: beside the checkpoints, or in ``postgres``."""
    if env.place == "in_transaction":
        return env.direct
    head, tail = env.direct.rsplit("/", 1)
    query = tail.split("?", 1)[1:]
    return f"{head}/postgres" + (f"?{query[0]}" if query else "")


def test_a_parked_heads_claim_is_asked_beside_the_read_that_returns_it(fx):
    """Sync saver through fx-A: a thread parks, a marked get_state reads its parked
    head, and a resume on a new connection reads that head again. Its claim was asked
    beside the read (``claims_ahead`` used, one ``claim_ahead`` store call, no ``claim``
    call after the head came back); the gate fires once and the run ends as straight
    to PostgreSQL. Then a thread fx-A saw parked is resumed straight to PostgreSQL
    (no claim): fx-A's next read of its head asks the old head's claim ahead, takes
    it, finds another head and withdraws it, leaving no claim row behind."""
    outcome = {}
    for via in ("direct", "A"):
        dsn = fx.direct if via == "direct" else fx.dsn("A")
        look = fx.direct if via == "direct" else fx.dsn("A", app=INSPECTOR)
        thread = tid(f"ahead-{via}")
        R.CTX["racer"] = f"ahead{via}"
        R.CTX["thread"] = thread
        with R.Runner("conn", dsn) as r:
            r.invoke("one", dict(R.INITIAL), thread)
        with R.Runner("conn", look) as r:
            assert r.get_state("one", thread).interrupts
        calls = store_calls(fx)
        ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
        with R.Runner("conn", dsn) as r:
            res = r.invoke("one", R.Command(resume="yes"), thread)
        after_calls = store_calls(fx)
        after_ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
        outcome[via] = R.plain(res)
        gates = [row for row in ledger(fx, thread) if row[1] == "gate"]
        assert len(gates) == 1, gates
        if via == "A":
            assert after_ahead.get("used", 0) - ahead.get("used", 0) == 1, (ahead, after_ahead)
            assert after_calls.get("claim_ahead", 0) - calls.get("claim_ahead", 0) == 1, \
                (calls, after_calls)
            assert after_calls.get("claim", 0) == calls.get("claim", 0), (calls, after_calls)
    assert outcome["A"] == outcome["direct"] == {"items": ["prep", "gate:yes", "after"],
                                                 "approved": "yes"}, outcome

    thread = tid("ahead-stale")
    R.CTX["racer"] = "aheadstale"
    R.CTX["thread"] = thread
    with R.Runner("conn", fx.dsn("A")) as r:
        r.invoke("one", dict(R.INITIAL), thread)
    with R.Runner("conn", fx.dsn("A", app=INSPECTOR)) as r:
        assert r.get_state("one", thread).interrupts
    with R.Runner("conn", fx.direct) as r:
        r.invoke("one", R.Command(resume="yes"), thread)
    ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
    with R.Runner("conn", fx.dsn("A")) as r:
        assert not r.get_state("one", thread).interrupts
    # Withdrawn by the read's end, or by the asking thread once the store answers.
    deadline = time.time() + 10
    while True:
        after_ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
        if after_ahead.get("withdrawn", 0) > ahead.get("withdrawn", 0) or time.time() > deadline:
            break
        time.sleep(0.05)
    assert after_ahead.get("withdrawn", 0) - ahead.get("withdrawn", 0) == 1, (ahead, after_ahead)
    with psycopg.connect(claims_db(fx), autocommit=True) as c:
        left = c.execute("select state from resumeguard.claims where thread_id = %s",
                         (thread,)).fetchall()
    assert left == [], left


def test_a_thread_parked_through_the_proxy_is_claimed_beside_its_first_read(fx):
    """Sync saver: a thread parked through fx-A is resumed through fx-A on a new
    connection with no read between. fx-A learned the parked head from the park's
    committed ``__interrupt__`` write, so the resume's read asks its claim ahead and
    uses it (no ``claim`` call after the head came back). A thread parked straight to
    PostgreSQL is unknown to fx-A: its resume claims after the read. Both fire the gate
    once and end as straight to PostgreSQL."""
    outcome = {}
    for parked_via in ("direct", "A"):
        thread = tid(f"park-ahead-{parked_via}")
        R.CTX["racer"] = f"parkahead{parked_via}"
        R.CTX["thread"] = thread
        with R.Runner("conn", fx.direct if parked_via == "direct" else fx.dsn("A")) as r:
            r.invoke("one", dict(R.INITIAL), thread)
        calls = store_calls(fx)
        ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
        with R.Runner("conn", fx.dsn("A")) as r:
            outcome[parked_via] = R.plain(r.invoke("one", R.Command(resume="yes"), thread))
        after_calls = store_calls(fx)
        after_ahead = metric(fx, "resumeguard_claims_ahead_total", "result")
        gates = [row for row in ledger(fx, thread) if row[1] == "gate"]
        assert len(gates) == 1, gates
        used = after_ahead.get("used", 0) - ahead.get("used", 0)
        claims = after_calls.get("claim", 0) - calls.get("claim", 0)
        asked = after_calls.get("claim_ahead", 0) - calls.get("claim_ahead", 0)
        expected = (1, 0, 1) if parked_via == "A" else (0, 1, 0)
        assert (used, claims, asked) == expected, (parked_via, calls, after_calls, after_ahead)
    assert outcome["A"] == outcome["direct"] == {"items": ["prep", "gate:yes", "after"],
                                                 "approved": "yes"}, outcome

