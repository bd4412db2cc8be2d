"""The README's table of outcomes, one test per row: each produces its outcome
through the proxy with real clients (LangGraph Python over psycopg, psycopg itself,
or raw protocol bytes where no driver would send them) and asserts the SQLSTATE and
the message the table states; where stock behaviour makes sense beside it, the same
scenario straight to PostgreSQL. ``test_every_row_of_the_table_has_its_test``
reads the table and checks that each row names a test of this module, and each
test a row.

Graph: ``approve`` (interrupt(); then records the answer in ``oc_ledger`` over a
direct connection, the side effect counted, and sleeps SLOW[thread]["gate"]) ->
``ship`` (sleeps SLOW[thread]["after"]). Racers are threads of this process, each
with a saver on a connection of its own.
"""

from __future__ import annotations

import operator
import re
import shutil
import signal
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row

import pgraw
from lg_scenarios import chain
from conftest import HOST, REPO, SUPERUSER, Proxy, audit_until, connect, free_port, ops

README = REPO / "README.md"
INSPECT_APP = "rg-inspect-ui"
# Four proxies at once: none needs the admin API.
NO_ADMIN = ("--admin-listen", "off")
LEDGER_DSN: dict[str, str] = {}
SLOW: dict[str, dict[str, float]] = {}
ITEMS_RULE = """\
[[channel]]
name = "items"
thread_id = "oc-invalid-.*"
schema = { type = "array", items = { type = "string" } }
"""


class Order(TypedDict, total=False):
    order: str
    approved: Any
    shipped: bool
    items: Annotated[list, operator.add]
    pending: Any


def approve(state: Order, config: RunnableConfig) -> dict:
    answer = interrupt({"question": f"ship {state['order']}?"})
    thread = config["configurable"]["thread_id"]
    with psycopg.connect(LEDGER_DSN["dsn"], autocommit=True) as c:
        c.execute("insert into oc_ledger (thread_id, answer) values (%s, %s)", (thread, str(answer)))
    time.sleep(SLOW.get(thread, {}).get("gate", 0))
    return {"approved": answer}


def ship(state: Order, config: RunnableConfig) -> dict:
    time.sleep(SLOW.get(config["configurable"]["thread_id"], {}).get("after", 0))
    return {"shipped": True}


def append(state: Order) -> dict:
    return {"items": [state.get("pending")]}


def approval_graph(checkpointer):
    return chain(Order, ("approve", approve), ("ship", ship)).compile(checkpointer=checkpointer)


def append_graph(checkpointer):
    return chain(Order, ("append", append)).compile(checkpointer=checkpointer)


def write_rules_dir(root: Path, channel_files: dict[str, str]) -> Path:
    """A rules dir: the shipped saver profiles plus ``channels/<name>`` files."""
    (root / "channels").mkdir(parents=True)
    for profile in (REPO / "rules").glob("*.toml"):
        shutil.copy(profile, root / profile.name)
    for name, text in channel_files.items():
        (root / "channels" / name).write_text(text)
    return root


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread, "user_id": "alice"}}


def with_app(dsn: str, app: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={app}"


def saver(dsn: str):
    return PostgresSaver(psycopg.connect(dsn, autocommit=True, prepare_threshold=0,
                                         row_factory=dict_row))


def run(dsn: str, inp, thread: str) -> dict:
    """One invoke on a saver of its own connection: the result, or the error."""
    s = saver(dsn)
    try:
        return {"ok": True, "values": approval_graph(s).invoke(inp, cfg(thread))}
    except psycopg.Error as e:
        return {"ok": False, "sqlstate": e.sqlstate, "message": e.diag.message_primary or str(e)}
    finally:
        s.conn.close()


def park(dsn: str, thread: str) -> None:
    res = run(dsn, {"order": thread, "approved": None, "shipped": False}, thread)
    assert res["ok"] and res["values"].get("__interrupt__"), res


def ledger(thread: str) -> list[str]:
    with psycopg.connect(LEDGER_DSN["dsn"], autocommit=True) as c:
        return [r[0] for r in c.execute("select answer from oc_ledger where thread_id = %s "
                                        "order by seq", (thread,))]


def wait_until(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def in_background(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(fn(*args)), daemon=True)
    t.start()
    return t, out


def race(dsn: str, thread: str, gate_s: float) -> tuple[dict, dict, list[str]]:
    """Park, start a resume whose gate runs for gate_s, then a second resume of the
    same interrupt from another connection while the first one's gate runs."""
    SLOW[thread] = {"gate": gate_s}
    park(dsn, thread)
    t, first = in_background(run, dsn, Command(resume="first"), thread)
    wait_until(lambda: ledger(thread), "the first resume's gate")
    second = run(with_app(dsn, "second-racer"), Command(resume="second"), thread)
    t.join(30)
    return first, second, ledger(thread)


def tid(name: str) -> str:
    return f"oc-{name}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def env(proxy_factory, direct_dsn, workdir):
    LEDGER_DSN["dsn"] = direct_dsn
    with psycopg.connect(direct_dsn, autocommit=True) as c:
        c.execute("create table if not exists oc_ledger (seq bigserial primary key, "
                  "thread_id text, answer text)")
    PostgresSaver(psycopg.connect(direct_dsn, autocommit=True)).setup()
    rules = write_rules_dir(workdir / f"outcomes-rules-{uuid.uuid4().hex[:6]}",
                            {"items.toml": ITEMS_RULE})
    guard_cfg = workdir / "outcomes-guard.toml"
    guard_cfg.write_text(f'[enforce]\nunknown_saver = "refuse"\n\n[claims]\nlapse_ms = 3000\n'
                         f'holder_gone_grace_ms = 1000\n'
                         f'inspection_application_names = ["^{INSPECT_APP}$"]\n')
    busy_cfg = workdir / "outcomes-busy.toml"
    busy_cfg.write_text('[claims]\npolicy = "refuse"\n')
    tiny_cfg = workdir / "outcomes-tiny.toml"
    tiny_cfg.write_text("max_client_conn = 1\n")
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]

    class Env:
        direct = direct_dsn
        guard = proxy_factory(*NO_ADMIN, "--config", str(guard_cfg), "--rules", str(rules),
                              "--proxy-id", "oc-guard", name="oc-guard")
        busy = proxy_factory(*NO_ADMIN, "--config", str(busy_cfg), "--proxy-id", "oc-busy", name="oc-busy")
        # Its claims database is a port nothing listens on: reads of parked heads
        # fail closed.
        nostore = proxy_factory(*NO_ADMIN, "--proxy-id", "oc-nostore", name="oc-nostore",
                                env={"RESUMEGUARD_CLAIMS_DSN":
                                     f"postgres://rg@{HOST}:{free_port()}/nowhere?connect_timeout=2"})
        tiny = proxy_factory(*NO_ADMIN, "--config", str(tiny_cfg), name="oc-tiny")
        db = dbname

    return Env


def dsn_of(p: Proxy, env) -> str:
    return p.dsn(env.db)


# ----------------------------------------------------------------- one test per row
def test_refused_racer(env):
    """Two resumes of one parked interrupt: stock, both run the gated node; through
    the proxy the second waits for the first's claim, then is refused 55000 naming
    the first answer's client before its node runs."""
    s_first, s_second, s_ledger = race(env.direct, tid("race-stock"), 2.0)
    assert s_first["ok"] and s_second["ok"], (s_first, s_second)
    assert sorted(s_ledger) == ["first", "second"]

    thread = tid("race")
    first, second, fired = race(dsn_of(env.guard, env), thread, 2.0)
    assert first["ok"] and first["values"]["approved"] == "first", first
    assert second["sqlstate"] == "55000", second
    assert second["message"].startswith("resumeguard: interrupt already answered"), second
    assert "was answered by client" in second["message"], second
    assert "refused before its node ran" in second["message"], second
    assert fired == ["first"]


def test_late_duplicate(env):
    """A resume (bare form) that reaches the finished head of an answered interrupt.
    Stock serves it the finished state with no error (no node runs again; the caller
    cannot tell it was late). Through the proxy its __resume__ write onto the finished
    head is refused 55000 naming the first answer's approver and time; nothing of it
    is recorded but a late_duplicate audit line (no second answer)."""
    outcome = {}
    for via, dsn in (("direct", env.direct), ("proxy", dsn_of(env.guard, env))):
        thread = tid(f"late-{via}")
        park(dsn, thread)
        done = run(with_app(dsn, "first-resumer"), Command(resume="first"), thread)
        assert done["ok"] and done["values"]["shipped"], done
        late = run(with_app(dsn, "late-resumer"), Command(resume="late"), thread)
        outcome[via] = (late, ledger(thread), thread)
    late, rows, _ = outcome["direct"]
    assert late["ok"] and late["values"]["approved"] == "first", late    # stock: silent
    assert rows == ["first"]
    late, rows, thread = outcome["proxy"]
    assert rows == ["first"]
    assert not late["ok"] and late["sqlstate"] == "55000", late
    msg = late["message"]
    assert msg.startswith("resumeguard: late duplicate resume: interrupt "), msg
    assert re.search(r"was answered at 20\d\d-\d\d-\d\dT[\d:.]+Z by user_id=alice, client "
                     r"\S+ \(application_name \"first-resumer\"", msg), msg
    assert msg.endswith("and nothing was run"), msg
    evs = audit_until(env.guard, thread, lambda e: ops(e, "late_duplicate"))
    late_evs = ops(evs, "late_duplicate")
    assert [e["application_name"] for e in late_evs] == ["late-resumer"], late_evs
    assert late_evs[0]["detail"]["answer_approver"] == "user_id=alice", late_evs
    assert late_evs[0]["detail"]["sqlstate"] == "55000", late_evs
    assert not [e for e in ops(evs, "resume_recorded") if e["application_name"] == "late-resumer"]
    s = saver(env.direct)
    try:
        state = approval_graph(s).get_state(cfg(thread))
    finally:
        s.conn.close()
    # on the finished head, which the refused write left as it was
    assert [e["checkpoint_id"] for e in late_evs] == [state.config["configurable"]["checkpoint_id"]]
    assert state.values["approved"] == "first" and state.next == ()


def test_run_in_progress(env):
    """While the answering run is still running (`ship` sleeps), an unmarked
    get_state of the thread from another session is refused 55000 (the run lease);
    the message and the hint say how to mark it (this proxy's application_name
    patterns, the inspection listener, the SQL comment). A marked read is
    served. Stock serves it."""
    dsn = dsn_of(env.guard, env)
    thread = tid("running")
    SLOW[thread] = {"after": 3.0}
    park(dsn, thread)
    t, done = in_background(run, dsn, Command(resume="yes"), thread)

    def running_ship() -> bool:
        s = saver(env.direct)
        try:
            return approval_graph(s).get_state(cfg(thread)).next == ("ship",)
        finally:
            s.conn.close()

    wait_until(running_ship, "the answering run to reach `ship`")
    s = saver(env.direct)
    try:
        assert approval_graph(s).get_state(cfg(thread)).next == ("ship",)   # stock: served
    finally:
        s.conn.close()
    s = saver(with_app(dsn, "status-page"))
    try:
        with pytest.raises(psycopg.Error) as refused:
            approval_graph(s).get_state(cfg(thread))
    finally:
        s.conn.close()
    e = refused.value
    assert e.sqlstate == "55000", e
    assert e.diag.message_primary.startswith(
        "resumeguard: interrupt already answered and its run is in progress"), e.diag.message_primary
    assert "mark the read as inspection" in (e.diag.message_hint or ""), e.diag.message_hint
    # the remedy names this proxy's own inspection patterns, in the message and the hint
    remedy = f'claims.inspection_application_names (now "^{INSPECT_APP}$")'
    assert remedy in e.diag.message_primary and remedy in e.diag.message_hint, e.diag.message_primary
    assert "if this is a status read (get_state), mark the read as inspection" in \
        e.diag.message_primary, e.diag.message_primary
    s = saver(with_app(dsn, INSPECT_APP))
    try:
        assert approval_graph(s).get_state(cfg(thread)).next == ("ship",)
    finally:
        s.conn.close()
    t.join(30)
    assert done["ok"] and done["values"]["shipped"], done


def test_lock_busy(env):
    """Under `[claims] policy = "refuse"` the second resume is refused at once with
    55006 while the first one's gate runs."""
    thread = tid("busy")
    t0 = time.monotonic()
    first, second, fired = race(dsn_of(env.busy, env), thread, 2.0)
    assert first["ok"], first
    assert second["sqlstate"] == "55006", second
    assert second["message"].startswith("resumeguard: interrupt is being answered"), second
    assert "has not finished" in second["message"], second
    assert fired == ["first"]
    assert time.monotonic() - t0 < 20


def test_canceled(env):
    """A second resume waits for the claim while the first one's gate runs (3 s); its
    client cancels it 0.5 s in (libpq's CancelRequest): it fails 57014 at once, as a
    canceled statement does, its node never runs, and the first goes on."""
    dsn = dsn_of(env.guard, env)
    thread = tid("canceled")
    SLOW[thread] = {"gate": 3.0}
    park(dsn, thread)
    t, first = in_background(run, dsn, Command(resume="first"), thread)
    wait_until(lambda: ledger(thread), "the first resume's gate")
    second = saver(with_app(dsn, "canceled-racer"))

    def resume_second() -> dict:
        try:
            return {"ok": True, "values": approval_graph(second).invoke(
                Command(resume="second"), cfg(thread))}
        except psycopg.Error as e:
            return {"ok": False, "sqlstate": e.sqlstate, "message": e.diag.message_primary}
    try:
        t2, res = in_background(resume_second)
        time.sleep(0.5)
        canceled_at = time.monotonic()
        second.conn.cancel_safe()
        t2.join(30)
        waited = time.monotonic() - canceled_at
    finally:
        second.conn.close()
    t.join(30)
    assert res["sqlstate"] == "57014", res
    assert res["message"].startswith("canceling statement due to user request"), res
    assert waited < 1.0, waited
    assert first["ok"], first
    assert ledger(thread) == ["first"]


def test_store_unavailable(env):
    """A claims store that cannot be opened: the resume's read of the parked head is
    refused 58000 (fail closed); ordinary queries still pass. Stock resumes."""
    stock = tid("nostore-stock")
    park(env.direct, stock)
    assert run(env.direct, Command(resume="yes"), stock)["ok"]
    dsn = dsn_of(env.nostore, env)
    thread = tid("nostore")
    park(dsn, thread)
    res = run(dsn, Command(resume="yes"), thread)
    assert res["sqlstate"] == "58000", res
    assert res["message"].startswith("resumeguard: read of parked thread"), res
    assert "refused (fail closed)" in res["message"], res
    assert ledger(thread) == []
    with connect(dsn) as c:
        assert c.execute("select 1").fetchone()[0] == 1


def replay_write(dsn: str, thread: str, parked: str, task_id: str) -> dict:
    """The gated task's pending write, sent as the saver sends it."""
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(PostgresSaver.UPSERT_CHECKPOINT_WRITES_SQL,
                      (thread, "", parked, task_id, "", 7, "replayed", "msgpack", b"\xa1x"))
    except psycopg.Error as e:
        return {"sqlstate": e.sqlstate, "message": e.diag.message_primary}
    return {"sqlstate": None}


def test_fenced(env):
    """While the holder's gate runs, the gated task's write for the parked checkpoint
    is replayed from another client: stock it is written; through the proxy it is
    raised RGF01 and nothing of it commits."""
    outcome = {}
    for via, dsn in (("direct", env.direct), ("proxy", dsn_of(env.guard, env))):
        thread = tid(f"fence-{via}")
        SLOW[thread] = {"gate": 2.0}
        park(dsn, thread)
        with psycopg.connect(env.direct, autocommit=True) as c:
            parked, task_id = c.execute(
                "select checkpoint_id, task_id from checkpoint_writes where thread_id = %s "
                "and channel = '__interrupt__'", (thread,)).fetchone()
        t, holder = in_background(run, dsn, Command(resume="yes"), thread)
        wait_until(lambda: ledger(thread), "the holder's gate")
        replay = replay_write(with_app(dsn, "replayer"), thread, parked, task_id)
        t.join(30)
        assert holder["ok"], holder
        with psycopg.connect(env.direct, autocommit=True) as c:
            rows = c.execute("select count(*) from checkpoint_writes where thread_id = %s and "
                             "channel = 'replayed'", (thread,)).fetchone()[0]
        outcome[via] = (replay["sqlstate"], rows)
        if via == "proxy":
            assert replay["message"].startswith("resumeguard: write fenced"), replay
            assert "nothing of this write was committed" in replay["message"], replay
    assert outcome == {"direct": (None, 1), "proxy": ("RGF01", 0)}


def test_invalid_write(env):
    """A channel rule says `items` holds strings; the graph appends None. Stock
    persists it; through the proxy the write is refused 23514 and nothing commits."""
    outcome = {}
    for via, dsn in (("direct", env.direct), ("proxy", dsn_of(env.guard, env))):
        thread = tid(f"invalid-{via}")
        s = saver(dsn)
        try:
            append_graph(s).invoke({"pending": None}, {"configurable": {"thread_id": thread}})
            outcome[via] = None
        except psycopg.Error as e:
            outcome[via] = e.sqlstate
            assert e.diag.message_primary.startswith("resumeguard: "), e.diag.message_primary
            assert "rejected" in e.diag.message_primary, e.diag.message_primary
        finally:
            s.conn.close()
        if via == "proxy":
            with psycopg.connect(env.direct, autocommit=True) as c:
                n = c.execute("select count(*) from checkpoint_blobs where thread_id = %s and "
                              "channel = 'items'", (thread,)).fetchone()[0]
            assert n == 0, "a refused write left a blob"
    assert outcome == {"direct": None, "proxy": "23514"}


def test_unknown_saver(env):
    """Under `[enforce] unknown_saver = "refuse"` a statement on the checkpoint
    tables that no saver profile recognizes fails 0A000 before it runs, however
    it spells their names."""
    sql = "update checkpoints set metadata = metadata where thread_id = %s"
    thread = tid("unknown")
    park(env.direct, thread)
    with connect(env.direct) as c:
        assert c.execute(sql, (thread,)).rowcount == 2          # stock: it runs (two checkpoints)
    with connect(dsn_of(env.guard, env)) as c:
        with pytest.raises(psycopg.Error) as refused:
            c.execute(sql, (thread,))
    assert refused.value.sqlstate == "0A000", refused.value
    assert refused.value.diag.message_primary.startswith(
        "resumeguard: checkpoint statement not recognized"), refused.value.diag.message_primary
    # The table named through Unicode escapes: the same table to the server.
    escaped = sql.replace("checkpoints", 'U&"checkpo\\0069nts"')
    with connect(env.direct) as c:
        assert c.execute(escaped, (thread,)).rowcount == 2      # stock: it runs
    with connect(dsn_of(env.guard, env)) as c:
        with pytest.raises(psycopg.Error) as refused:
            c.execute(escaped, (thread,))
    assert refused.value.sqlstate == "0A000", refused.value
    # With standard_conforming_strings off, `'a\''` ends at its second quote;
    # in SJIS 表 is 0x95 0x5C, and `E'表'` ends where, read as UTF-8, its
    # backslash escapes the quote. Either way the DELETE after it runs (a
    # simple Query: psycopg's ClientCursor).
    hidden = {
        "standard_conforming_strings = off":
            "select 'a\\'' ; delete from checkpoint_writes where thread_id = '{}' ; --'",
        # (the thread in dollar quotes: read as UTF-8 the whole text is then
        # one SELECT of a string, which the classifier reads as no checkpoint
        # statement at all)
        "client_encoding = 'SJIS'":
            "select E'表' ; delete from checkpoint_writes where thread_id = $t${}$t$ ; --'",
    }
    for setting, text in hidden.items():
        for via, expect in ((env.direct, None), (dsn_of(env.guard, env), "0A000")):
            mine = tid("hidden")
            park(env.direct, mine)
            with connect(via, autocommit=True) as c:
                c.execute(f"set {setting}")
                try:
                    psycopg.ClientCursor(c).execute(text.format(mine))
                    outcome = None
                except psycopg.Error as e:
                    outcome = e.sqlstate
            with connect(env.direct) as c:
                left = c.execute("select count(*) from checkpoint_writes where thread_id = %s",
                                 (mine,)).fetchone()[0]
            assert (outcome, left > 0) == (expect, expect is not None), (setting, via, outcome, left)


def test_own_schema(env):
    """A client statement that changes the proxy's schema fails 42501 before the
    server sees it."""
    with connect(dsn_of(env.guard, env)) as c:
        with pytest.raises(psycopg.Error) as refused:
            c.execute("delete from resumeguard.claims")
    assert refused.value.sqlstate == "42501", refused.value
    assert refused.value.diag.message_primary == \
        "resumeguard: schema resumeguard belongs to resumeguard (claims and audit trail)"


def test_shutting_down(pg, workdir):
    """SIGTERM: an open session's next statement gets FATAL 57P01."""
    p = Proxy(pg.port, workdir, "oc-stopping").start()
    c = connect(p.dsn("postgres"))
    try:
        assert c.execute("select 1").fetchone()[0] == 1
        assert p.stop(signal.SIGTERM) == 0, p.describe()
        with pytest.raises(psycopg.OperationalError) as closed:
            c.execute("select 1")
    finally:
        c.close()
    assert closed.value.sqlstate == "57P01", closed.value
    assert "terminating connection: resumeguard is shutting down" in str(closed.value)


def test_too_many_connections(env):
    """Beyond `max_client_conn` a new client is refused FATAL 53300 at startup."""
    first = connect(env.tiny.dsn("postgres"))
    try:
        with pytest.raises(psycopg.OperationalError) as refused:
            connect(env.tiny.dsn("postgres"))
        assert "resumeguard: too many client connections (max_client_conn = 1)" in \
            str(refused.value)
        sess = pgraw.connect(HOST, env.tiny.port)    # psycopg keeps no SQLSTATE here
        with sess as s:
            s.sendall(pgraw.startup_message(SUPERUSER, "postgres"))
            msgs = pgraw.split_messages(pgraw.read_until_eof(s, 10))
        err = pgraw.parse_error_fields(msgs[0][1])
        assert (err["S"], err["C"]) == ("FATAL", "53300"), err
        assert first.execute("select 1").fetchone()[0] == 1
    finally:
        first.close()


def test_protocol_violation(env):
    """A message above `max_message_bytes` is refused from its header: FATAL 08P01,
    and the session closes. (PostgreSQL closes without a word.)"""
    sess = pgraw.login(HOST, env.guard.port, SUPERUSER, env.db)
    with sess.sock as s:
        s.sendall(b"Q" + struct.pack("!I", 0x7FFFFFF0))
        msgs = pgraw.split_messages(pgraw.read_until_eof(s, 10))
    errs = [pgraw.parse_error_fields(p) for t, p in msgs if t == b"E"]
    assert [(e["S"], e["C"]) for e in errs] == [("FATAL", "08P01")], msgs
    assert errs[0]["M"].startswith("resumeguard: "), errs
    assert "above the limit of" in errs[0]["M"], errs


# ----------------------------------------------------------------- the table itself
def outcome_rows() -> list[list[str]]:
    """The rows of the README's outcomes table (the one whose header names `test`)."""
    rows, in_table = [], False
    for line in README.read_text().splitlines():
        if line.startswith("| ") and "SQLSTATE" in line and "test" in line:
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            if not line.startswith("| ---"):
                rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_every_row_of_the_table_has_its_test():
    rows = outcome_rows()
    assert len(rows) >= 11, rows
    named = []
    for r in rows:
        m = re.search(r"test_outcomes\.py::(test_\w+)", r[-1])
        assert m, f"row names no test of this module: {r}"
        assert m.group(1) in globals(), f"the row's test does not exist: {m.group(1)}"
        named.append(m.group(1))
        sqlstate = r[1].strip("`")
        if sqlstate != "—":
            src = globals()[m.group(1)].__code__.co_consts
            assert any(isinstance(x, str) and sqlstate in x for x in src) or \
                sqlstate in repr(src), f"{m.group(1)} never checks {sqlstate}"
    tests = sorted(n for n in globals() if n.startswith("test_")
                   and n != "test_every_row_of_the_table_has_its_test")
    assert sorted(named) == tests, (sorted(named), tests)
