"""An interrupt's answer whose off-path evidence comes later than the claim's lapse,
end to end: two proxies (``ae-A``, ``ae-B``) sharing nothing but the database, real
LangGraph, beside the same scenario straight to PostgreSQL.

The holder (through ae-A) reads the parked head, so takes the claim; a resume
through ae-B reads the same parked head and waits (``policy = "wait"``). ae-A's own
connections to the claims schema (``[claims] dsn``, the same database as its
sessions', ``fence_database`` naming it) pass a relay the test pauses: while it is
paused ae-A's evidence worker cannot apply anything, as with a claims store locked
or unreachable for seconds. The holder writes the gated task's answer during the
pause, which lasts longer than the claim's lapse and the write's commit cover.

- Straight to PostgreSQL (stock): the resume runs the gated node beside the
  holder's answer: the interrupt is answered twice.
- Through the proxies: the write consumed its claim in its own transaction
  (``fence_write``, on the server, not through the paused relay); the waiting
  resume is refused 55000 before the relay resumes and its node never runs. Once
  the worker applies the late evidence, the trail records the consumption
  (``claim_consumed``). Before the answer was recorded in its write, the resume
  took the lapsed claim over and ran the gated node a second time.

With the claims schema in another database only the evidence worker consumes the
claim: the timing assumption that remains there is stated in docs/guarantees.md and
found by the claims model (``tests/claims_model.rs``).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.rows import dict_row

import racer as R
from conftest import HOST, free_port
from test_consume_once import Env, audit_ops, ledger, one_resumer, ops, park

LAPSE_MS = 4000
# The write's commit cover is max(2000 ms, progress_hold_ms).
PROGRESS_HOLD_MS = 1000
# Longer than the lapse and the commit cover from the answer.
EVIDENCE_HELD_S = (LAPSE_MS + 2000) / 1000
ANSWERED = "55000"


class PausableRelay:
    """A TCP relay to PostgreSQL whose traffic can be held (both directions) and let
    go again: the connections stay open, nothing is lost, nothing answers."""

    def __init__(self, target_port: int):
        self.target = (HOST, target_port)
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(self.target)
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                self.flowing.wait()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.flowing.set()
        self.listener.close()


@pytest.fixture(scope="module")
def ae(proxy_factory, direct_dsn, workdir, pg) -> Env:
    dbname = direct_dsn.rsplit("/", 1)[1].split("?")[0]
    upstream = f"postgres://postgres@{HOST}:{pg.port}/{dbname}"
    relay = PausableRelay(pg.port)
    common = (f'[enforce]\nconsume_once = true\n\n[claims]\n'
              f'lapse_ms = {LAPSE_MS}\npolicy = "wait"\nmax_wait_ms = 60000\n'
              f'poll_ms = 50\nprogress_hold_ms = {PROGRESS_HOLD_MS}\n'
              f'holder_gone_grace_ms = 1000\n')
    cfg_a = workdir / "ae-A.toml"
    cfg_a.write_text(common + f'dsn = "host={HOST} port={relay.port} user=postgres '
                              f'dbname={dbname}"\nfence_database = "{dbname}"\n')
    cfg_b = workdir / "ae-B.toml"
    cfg_b.write_text(common)
    state = workdir / f"ae-state-{uuid.uuid4().hex[:6]}"
    a = proxy_factory("--config", str(cfg_a), "--proxy-id", "ae-A", "--state-dir",
                      str(state / "a"), name="ae-A", upstream=upstream)
    b = proxy_factory("--config", str(cfg_b), "--proxy-id", "ae-B", "--state-dir",
                      str(state / "b"), name="ae-B", upstream=upstream)
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    R.main(["setup", "--dsn", direct_dsn])
    env = Env(direct_dsn, a, b, a, 0, workdir)
    env.proxy_ids = {a.port: "ae-A", b.port: "ae-B"}
    env.relay = relay
    yield env
    relay.close()


def tid(prefix: str) -> str:
    return f"ae-{prefix}-{uuid.uuid4().hex[:8]}"


def answer_with_late_evidence(env: Env, dsn_a: str, dsn_b: str, thread: str,
                              tag: str) -> tuple[dict, list[str], float]:
    """The scene above: the waiting resume's result, the gated node's fires, and
    when ae-A's claims relay flowed again."""
    from langgraph.checkpoint.postgres import PostgresSaver

    iid = park(dsn_a, thread)[0]["id"]
    taker = one_resumer(env, dsn_b, thread, tag, interrupt_id=iid)
    try:
        taker.ready(0)
        with psycopg.connect(dsn_a + "&application_name=holder", autocommit=True,
                             prepare_threshold=0, row_factory=dict_row) as conn:
            saver = PostgresSaver(conn)
            # The holder's read: its claim.
            tup = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
            task_id = next(w[0] for w in tup.pending_writes if w[1] == "__interrupt__")
            # The resume reads the parked head and waits behind the holder's claim.
            taker.go(0)
            time.sleep(1.5)
            env.relay.flowing.clear()
            try:
                saver.put_writes(tup.config, [("approved", "holder")], task_id)
                time.sleep(EVIDENCE_HELD_S)
            finally:
                t_flowing = time.time()
                env.relay.flowing.set()
            result = taker.results(0, timeout=90)[0]
        taker.finish()
    finally:
        env.relay.flowing.set()
        taker.kill()
    fires = [row[0] for row in ledger(env, thread)]
    return result, fires, t_flowing


def test_an_answer_whose_evidence_comes_after_the_lapse_is_not_run_again(ae):
    # Stock: nothing stops the resume; the interrupt is answered twice.
    thread = tid("direct")
    r, fires, _ = answer_with_late_evidence(ae, ae.direct, ae.direct, thread, "ad-")
    print(f"direct: resume ok={r['ok']}; fires {fires}")
    assert r["ok"], r
    assert len(fires) == 1, fires

    thread = tid("proxies")
    r, fires, t_flowing = answer_with_late_evidence(ae, ae.dsn("A"), ae.dsn("B"), thread, "ap-")
    evs = audit_ops(ae, thread, lambda e: ops(e, "claim_consumed"), timeout=30)
    waited = [e["detail"].get("waited_ms", 0) for e in ops(evs, "claim_waited")]
    print(f"proxies: resume ok={r['ok']} error={r['error']}; fires {fires}; answered "
          f"{r['t_end'] - t_flowing:+.1f} s from the relay flowing again; the resume waited "
          f"{waited} ms; consumed {len(ops(evs, 'claim_consumed'))}, taken over "
          f"{len(ops(evs, 'claim_takeover'))}")
    # The resume read the parked head before the answer and waited behind the claim.
    assert waited, evs
    assert fires == [], f"the gated node ran again: {fires}"
    assert not r["ok"] and r["error"]["sqlstate"] == ANSWERED, r
    assert ops(evs, "claim_takeover") == []
    # Refused on what the write recorded, not on the late evidence.
    assert r["t_end"] < t_flowing, "the refusal waited for ae-A's evidence"
    consumed = ops(evs, "claim_consumed")
    assert len(consumed) == 1 and consumed[0]["detail"]["holder"]["proxy_id"] == "ae-A", consumed
