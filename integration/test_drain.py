"""A proxy shutting down (SIGTERM), end to end (real PostgreSQL 15, real LangGraph,
``resumeguard serve`` processes):

- a draining proxy grants nothing: readers waiting for a claim are refused (55006,
  "shutting down") and never served, while the holder inside its gated node keeps
  its connection until its run's next checkpoint commits; after a restart the thread
  is continued once: the gated effect fired exactly once, and every client ended
  with an SQLSTATE;
- every session closed at the end of the drain, idle or still busy when the grace
  ends, gets FATAL 57P01 before its socket closes, as PostgreSQL's own sessions do
  when they are terminated (``pg_terminate_backend``, beside it);
- claim evidence is never dropped: the holder killed in the crash window while the
  claims table is locked (straight to PostgreSQL) for longer than the store's lock
  timeout; the holder-gone evidence is retried until applied, and the thread is
  resumable once the lock is released (not stranded until the claim lapses).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import pgraw
import racer as R
from conftest import HOST, SUPERUSER, Proxy
from test_claims_recovery import db  # noqa: F401  (the saver's tables and the ledger)

HERE = Path(__file__).resolve().parent
GRACE_MS = 1000              # holder_gone_grace_ms
SHUTDOWN_GRACE_MS = 5000
GATE_MS = 3000
LONG_LAPSE_MS = 30000        # a stranded thread would stay refused this long
SHUTTING_DOWN = "55006"
ADMIN_SHUTDOWN = "57P01"
ANSWERED = "55000"


def config(workdir: Path, name: str, lapse_ms: int) -> Path:
    cfg = workdir / f"{name}.toml"
    cfg.write_text(
        f"shutdown_grace_ms = {SHUTDOWN_GRACE_MS}\n\n"
        f'[claims]\nproxy_id = "{name}"\nlapse_ms = {lapse_ms}\npolicy = "wait"\n'
        f"holder_gone_grace_ms = {GRACE_MS}\nprogress_hold_ms = 10000\n")
    return cfg


def start(pg, workdir: Path, name: str, lapse_ms: int = 3000) -> Proxy:
    """A proxy with the PostgreSQL claims store (the default backend) and a state
    directory of its own; the test stops it."""
    cfg = config(workdir, name, lapse_ms)
    state = workdir / f"state-{name}"
    return Proxy(pg.port, workdir, name, ("--config", str(cfg), "--state-dir", str(state))).start()


def dsn_of(proxy: Proxy, direct: str) -> str:
    return proxy.dsn(direct.rsplit("/", 1)[1].split("?")[0])


def tid(prefix: str) -> str:
    return f"drain-{prefix}-{uuid.uuid4().hex[:8]}"


def ledger(direct: str, thread: str) -> list[tuple]:
    """(racer, node) of each gated effect on ``thread``."""
    return [(racer, node) for racer, node, _ in R.ledger(direct, thread)]


def park(dsn: str, thread: str) -> None:
    with R.Runner("conn", dsn) as r:
        assert R.interrupts_of(r.invoke("one", dict(R.INITIAL), thread))


def final_state(direct: str, thread: str):
    with R.Runner("conn", direct) as r:
        return r.get_state("one", thread)


class Resumer:
    """``racer.py resume`` as a process of its own; ``reading`` once it is about to
    read the thread's head."""

    def __init__(self, dsn: str, direct: str, thread: str, racer_id: str, gate_ms: int = 0,
                 start_at: float | None = None):
        self.id = racer_id
        at = ["--start-at", str(start_at)] if start_at else []
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "racer.py"), "resume", "--dsn", dsn, "--ledger-dsn",
             direct, "--thread", thread, "--id", racer_id, "--value", json.dumps(racer_id),
             "--gate-ms", str(gate_ms), *at],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.reading = threading.Event()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            if line.strip() == "reading":
                self.reading.set()

    def result(self, timeout: float = 60) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, (self.id, out, "".join(self.stderr))
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def pipeline_on_a_terminated_backend(direct: str) -> str:
    """What psycopg reports for a pipeline sent on a connection whose backend
    PostgreSQL terminated (57P01 sent while the client was idle)."""
    c = psycopg.connect(direct, autocommit=True)
    with psycopg.connect(direct, autocommit=True) as admin:
        admin.execute("select pg_terminate_backend(%s)", (c.info.backend_pid,))
    time.sleep(0.2)
    try:
        with c.cursor() as cur, c.pipeline():
            cur.execute("select 1")
            cur.execute("select 2")
    except psycopg.OperationalError as e:
        assert e.sqlstate is None, e
        return str(e)
    finally:
        c.close()
    raise AssertionError("the pipeline on a terminated backend succeeded")


def resume_until_served(dsn: str, thread: str, racer_id: str, within: float) -> tuple[dict, list]:
    """Resumes until a resume is not refused for a claim or run still held (55006 /
    55000 while the old holder's lease ends); returns the last result and every
    refusal's SQLSTATE."""
    R.CTX["racer"] = racer_id
    refused = []
    deadline = time.monotonic() + within
    while True:
        with R.Runner("conn", dsn) as r:
            res = R.resume_once(r, {"thread": thread, "value": racer_id})
        code = (res.get("error") or {}).get("sqlstate")
        if res["ok"] or code not in (SHUTTING_DOWN, ANSWERED) or time.monotonic() > deadline:
            return res, refused
        refused.append(code)
        time.sleep(0.25)


# ----------------------------------------------------------------- rolling restart
def test_sigterm_during_a_gated_node_fires_once_and_the_run_is_continued_once(db, pg, workdir):
    """SIGTERM while the holder is inside its gated node (3 s) and two racers wait for
    its claim (grace 5 s): the racers are refused at once, saying the proxy is shutting
    down, and never served; the holder keeps its connection until its step's checkpoint
    commits, then gets 57P01; the proxy exits well inside the grace. A restarted proxy
    continues the thread once: the gated effect fired once, the run completed."""
    name = f"drain-a-{uuid.uuid4().hex[:4]}"
    p = start(pg, workdir, name)
    thread = tid("gate")
    procs: list[Resumer] = []
    try:
        via = dsn_of(p, db)
        park(via, thread)
        # every process imports LangGraph first; the holder reads at t0, the racers
        # 0.5 s later, while its gated node runs
        t0 = time.time() + 15
        holder = Resumer(via, db, thread, "holder", gate_ms=GATE_MS, start_at=t0)
        racers = [Resumer(via, db, thread, f"w{i}", start_at=t0 + 0.5) for i in range(2)]
        procs += [holder, *racers]
        for w in procs:
            assert w.reading.wait(60), "".join(w.stderr)
        wait_for(lambda: ledger(db, thread), 60, "the holder's gated node never ran")
        time.sleep(max(0.0, t0 + 1.2 - time.time()))  # the racers' reads wait for the claim
        assert not holder.proc.poll() and len(ledger(db, thread)) == 1
        t_term, t_term_wall = time.monotonic(), time.time()
        p.proc.send_signal(signal.SIGTERM)
        results = {w.id: w.result() for w in racers}
        # when each racer's resume returned (its own clock), not when its process ended
        t_racers = max(results[w.id]["t_end"] for w in racers) - t_term_wall
        results["holder"] = holder.result()
        rc = p.proc.wait(timeout=SHUTDOWN_GRACE_MS / 1000 + 10)
        t_exit = time.monotonic() - t_term
        p.stop()
    finally:
        for r in procs:
            r.kill()
        p.kill()
    print(f"racers refused {t_racers * 1000:.0f} ms after SIGTERM, proxy exited after "
          f"{t_exit * 1000:.0f} ms (rc {rc}); holder: "
          f"{results['holder']['error'] or 'completed'}")
    assert rc == 0, p.describe()
    for w in ("w0", "w1"):
        err = results[w]["error"]
        assert not results[w]["ok"] and err["sqlstate"] == SHUTTING_DOWN, results[w]
        assert "shutting down" in err["message"], err
    assert t_racers < 1.5, "the waiting racers were not refused at once"
    # the holder's step committed before its session closed; the proxy did not wait
    # out the grace for it
    assert t_exit < SHUTDOWN_GRACE_MS / 1000, t_exit
    h = results["holder"]
    if not h["ok"] and h["error"]["sqlstate"] is None:
        # LangGraph's saver writes in psycopg pipeline mode, and a pipeline on a
        # connection the server ended reports it lost, without the FATAL's SQLSTATE:
        # the same as on a backend PostgreSQL itself terminated (beside it)
        # (which of psycopg's lost-connection messages depends on when it notices
        # the close: flushing the next send, reading the result, or after either)
        stock = pipeline_on_a_terminated_backend(db)
        lost = ("server closed the connection unexpectedly", "the connection is closed")
        assert any(m in stock for m in lost), stock
        assert h["error"]["class"] == "OperationalError", (h, stock)
        assert any(m in h["error"]["message"] for m in lost), (h, stock)
    else:
        assert h["ok"] or h["error"]["sqlstate"] == ADMIN_SHUTDOWN, h
    assert ledger(db, thread) == [("holder", "gate")]
    with psycopg.connect(db, autocommit=True) as c:
        steps = c.execute("select count(*) from checkpoints where thread_id = %s",
                          (thread,)).fetchone()[0]
    stderr = p.stderr_path.read_text()
    assert "claim evidence not applied before exit" not in stderr, stderr[-3000:]

    # the restart: the same configuration, the same claims (in the database)
    p2 = start(pg, workdir, name)
    try:
        again, refused = resume_until_served(dsn_of(p2, db), thread, "again", within=20)
        late, _ = resume_until_served(dsn_of(p2, db), thread, "late", within=0)
    finally:
        p2.stop()
    print(f"after the restart: {len(refused)} refusal(s) {refused} before the continuation; "
          f"{steps} checkpoint(s) before it")
    assert again["ok"], again
    assert ledger(db, thread) == [("holder", "gate")], "the gated effect fired again"
    st = final_state(db, thread)
    assert list(st.next) == [] and st.values["approved"] == "holder", st
    assert st.values["items"] == ["prep", "gate:holder", "after"], st.values
    # a late duplicate changes nothing
    assert ledger(db, thread) == [("holder", "gate")], late


def test_a_session_still_busy_when_the_grace_ends_gets_57p01(pg, workdir):
    """A query still running when the grace ends: the session is closed with FATAL
    57P01 ("shutting down"), never a bare close."""
    cfg = workdir / "drain-busy.toml"
    cfg.write_text("shutdown_grace_ms = 1000\n")
    p = Proxy(pg.port, workdir, "drain-busy", ("--config", str(cfg))).start()
    busy = pgraw.login(HOST, p.port, SUPERUSER, "postgres")
    try:
        busy.send(pgraw.query("select pg_sleep(30)"))
        time.sleep(0.3)
        t0 = time.monotonic()
        rc = p.stop(signal.SIGTERM, timeout=15)
        took = time.monotonic() - t0
        got = pgraw.split_messages(pgraw.read_until_eof(busy.sock, 10))
    finally:
        busy.sock.close()
        p.kill()
    assert rc == 0, p.describe()
    assert took < 5, took
    assert got and got[-1][0] == b"E", got
    err = pgraw.parse_error_fields(got[-1][1])
    assert (err["S"], err["C"]) == ("FATAL", ADMIN_SHUTDOWN), err
    assert "shutting down" in err["M"], err


def test_an_idle_psycopg_session_gets_57p01_like_a_terminated_backend(pg, workdir, direct_dsn):
    """An idle psycopg connection when the proxy is stopped sees AdminShutdown
    (57P01) on its next query, as it does when PostgreSQL terminates its backend."""
    stock = psycopg.connect(direct_dsn, autocommit=True)
    pid = stock.info.backend_pid
    with psycopg.connect(direct_dsn, autocommit=True) as admin:
        admin.execute("select pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.errors.AdminShutdown) as direct:
        stock.execute("select 1")
    stock.close()
    p = Proxy(pg.port, workdir, "drain-idle").start()
    idle = psycopg.connect(dsn_of(p, direct_dsn), autocommit=True)
    try:
        assert idle.execute("select 1").fetchone() == (1,)
        assert p.stop(signal.SIGTERM, timeout=15) == 0, p.describe()
        with pytest.raises(psycopg.errors.AdminShutdown) as proxied:
            idle.execute("select 1")
    finally:
        idle.close()
        p.kill()
    assert direct.value.sqlstate == proxied.value.sqlstate == ADMIN_SHUTDOWN
    assert "shutting down" in str(proxied.value), proxied.value


# ----------------------------------------------------------------- evidence retried
def test_holder_gone_evidence_is_retried_while_the_claims_table_is_locked(db, pg, workdir):
    """The holder is SIGKILLed inside its gated node while another session (straight to
    PostgreSQL) holds ACCESS EXCLUSIVE on ``resumeguard.claims`` for 3 s, longer than
    the store's lock timeout: the holder-gone evidence fails, is retried (counted), and
    is applied once the lock is released, so a resume is served within the holder-gone
    grace of the release instead of the claim's 30 s lapse; the gated effect of the
    recovery fires once."""
    name = f"drain-ev-{uuid.uuid4().hex[:4]}"
    p = start(pg, workdir, name, lapse_ms=LONG_LAPSE_MS)
    thread = tid("evidence")
    claims_db = pg.dsn("postgres")
    victim = None
    try:
        via = dsn_of(p, db)
        park(via, thread)
        victim = Resumer(via, db, thread, "victim", gate_ms=60000)
        wait_for(lambda: ledger(db, thread), 60, "the victim's gated node never ran")
        time.sleep(0.3)
        with psycopg.connect(claims_db) as locker:
            locker.execute("LOCK TABLE resumeguard.claims IN ACCESS EXCLUSIVE MODE")
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(timeout=10)
            time.sleep(3)
            locker.rollback()
        t_release = time.monotonic()
        again, refused = resume_until_served(via, thread, "again", within=LONG_LAPSE_MS / 1000)
        served_after = time.monotonic() - t_release
        stderr = p.stderr_path.read_text()
    finally:
        if victim:
            victim.kill()
        p.stop()
    print(f"resume served {served_after * 1000:.0f} ms after the lock was released, "
          f"{len(refused)} refusal(s) before")
    assert again["ok"], again
    assert [r for r in ledger(db, thread)] == [("victim", "gate"), ("again", "gate")]
    assert served_after < GRACE_MS / 1000 + 5, "the thread stayed stranded"
    assert "retrying until the claim store takes it" in stderr, stderr[-3000:]
    assert "claim evidence applied again" in stderr, stderr[-3000:]
    assert "evidence lost" not in stderr
