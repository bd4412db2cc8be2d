"""Consume-once racers: LangGraph resumers as separate OS processes.

Used by test_consume_once.py and full_matrix.sh. The graphs' gated nodes record
their side effect in a *ledger* table written over a DIRECT connection to
PostgreSQL (``--ledger-dsn``), outside the checkpoint tables, so a test can
count how many times a node really ran and by which racer.

Graphs (``--graph``):
  ``one``        prep -> gate(interrupt) -> after
  ``two_gates``  prep -> gate1(interrupt) -> gate2(interrupt) -> after
  ``double``     prep -> gate(interrupt "first"; interrupt "second") -> after
  ``slow_after`` like ``one``, but ``after`` records a ledger row (node "after") and
                 sleeps 1.5 s (a window in which the head is past the parked checkpoint)

Gated nodes: ``answer = interrupt(...)``; INSERT a ledger row (thread, racer id,
node, answer, pid); sleep ``gate_ms``; return ``{"approved": answer, ...}``.

Commands (each prints one JSON object on stdout):

  worker --dsn D --ledger-dsn L --id R --saver conn|pool|async|pipeline|pool_tx --dir DIR --jobs FILE
      Imports LangGraph, opens its saver, compiles the graphs, then for every job j
      of the JSON list in FILE ({"thread", "graph", "form": "bare"|"map",
      "value", "gate_ms", "interrupt_id"}): touches DIR/ready-j-R, spins until
      DIR/go-j exists (the barrier: the test creates it once every racer is ready),
      resumes the thread and writes DIR/result-j-R.json.
  park   --dsn D --thread T [--graph G] [--saver S]     first run up to the interrupt
  resume --dsn D --ledger-dsn L --thread T [--id R] [--value JSON] [--form bare|map]
         [--interrupt-id I] [--gate-ms MS] [--graph G] [--saver S] [--start-at EPOCH]
      One resume (no barrier); prints "reading" on stderr just before invoke.
  state  --dsn D --thread T [--saver S] [--hold-s SECONDS]
      get_state (one READ(latest)); with --hold-s keeps the connection open that long
      after printing (a long-lived inspector).
  setup  --dsn D                                          saver.setup() + ledger table

A racer's result: {"id", "ok", "values", "interrupts", "error": {"class",
"sqlstate", "message"} | null, "t_go", "t_start", "t_end"} (epoch seconds).

Runs under every LangGraph Python the suite installs, langgraph 0.2.x (saver 2.0.8)
included: there invoke is streamed so the result still names its interrupts, and an
interrupt's "id" (the key of a map-form resume) is its task's id.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import operator
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.types import Command, interrupt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lg_scenarios as L  # noqa: E402

LEDGER_DDL = """
create table if not exists rg_ledger (
    seq bigserial primary key,
    thread_id text not null,
    racer text not null,
    node text not null,
    value text,
    pid int not null,
    at timestamptz not null default clock_timestamp()
)"""

INSPECT_HINT = "/* resumeguard:inspect */ "
GRAPHS = ("one", "two_gates", "double", "slow_after")
INITIAL = {"items": [], "approved": None}


class State(TypedDict):
    items: Annotated[list[str], operator.add]
    approved: Any


# Per-process settings the gated nodes read.
CTX: dict[str, Any] = {"racer": "main", "gate_ms": 0, "ledger": None, "ledger_dsn": None}


def _ledger_conn() -> psycopg.Connection:
    if CTX["ledger"] is None:
        CTX["ledger"] = psycopg.connect(CTX["ledger_dsn"], autocommit=True)
    return CTX["ledger"]


def record(node: str, answer: Any) -> None:
    thread = CTX.get("thread", "?")
    _ledger_conn().execute(
        "insert into rg_ledger (thread_id, racer, node, value, pid) values (%s, %s, %s, %s, %s)",
        (thread, CTX["racer"], node, json.dumps(answer), os.getpid()))


def ledger(dsn: str, thread: str) -> list[tuple]:
    """The gated effects recorded for ``thread``: (racer, node, value), in order."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("select racer, node, value from rg_ledger where thread_id = %s order by seq",
                         (thread,)).fetchall()


def _gate_node(name: str):
    def node(state: State) -> dict:
        answer = interrupt({"question": f"approve {name}?"})
        record(name, answer)
        time.sleep(CTX["gate_ms"] / 1000.0)
        return {"approved": answer, "items": [f"{name}:{answer}"]}
    node.__name__ = name
    return node


def _double_node(state: State) -> dict:
    first = interrupt({"question": "first?"})
    second = interrupt({"question": "second?"})
    record("gate", [first, second])
    time.sleep(CTX["gate_ms"] / 1000.0)
    return {"approved": [first, second], "items": [f"gate:{first}:{second}"]}


def _prep(state: State) -> dict:
    return {"items": ["prep"]}


def _after(state: State) -> dict:
    return {"items": ["after"]}


def _slow_after(state: State) -> dict:
    record("after", None)
    time.sleep(CTX.get("after_ms", 1500) / 1000.0)
    return {"items": ["after"]}


def build(kind: str, checkpointer):
    gates = {
        "one": [("gate", _gate_node("gate"))],
        "slow_after": [("gate", _gate_node("gate"))],
        "two_gates": [("gate1", _gate_node("gate1")), ("gate2", _gate_node("gate2"))],
        "double": [("gate", _double_node)],
    }[kind]
    after = _slow_after if kind == "slow_after" else _after
    return L.chain(State, ("prep", _prep), *gates, ("after", after)).compile(
        checkpointer=checkpointer)


def cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def interrupts_of(res: dict) -> list[dict]:
    return [{"id": L.interrupt_key(i), "value": i.value} for i in (res.get("__interrupt__") or ())]


def plain(res: dict) -> dict:
    return {k: v for k, v in dict(res).items() if k != "__interrupt__"}


def describe_error(e: BaseException) -> dict:
    seen = e
    chain = [e]
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__
        chain.append(seen)
        if len(chain) > 10:
            break
    pg = next((x for x in chain if isinstance(x, psycopg.Error)), None)
    src = pg or e
    return {"class": type(src).__name__, "module": type(src).__module__,
            "sqlstate": getattr(src, "sqlstate", None), "message": str(src)}


# ----------------------------------------------------------------- one saver, sync-looking
class Runner:
    """A saver of one kind (sync or async) plus compiled graphs, with sync calls."""

    def __init__(self, kind: str, dsn: str, hint: bool = False):
        self.kind, self.dsn, self.hint = kind, dsn, hint
        self.stack = contextlib.ExitStack()
        self.loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> "Runner":
        if self.kind == "async":
            self.loop = asyncio.new_event_loop()
            self._acm = L.async_saver(self.dsn)
            self.saver = self.loop.run_until_complete(self._acm.__aenter__())
        else:
            self.saver = self.stack.enter_context(L.sync_saver(self.kind, self.dsn))
        if self.hint:
            # "for those who can change code": the inspection comment on the saver's reads
            self.saver.SELECT_SQL = INSPECT_HINT + self.saver.SELECT_SQL
        self.graphs = {g: build(g, self.saver) for g in GRAPHS}
        return self

    def __exit__(self, *exc) -> None:
        if self.loop is not None:
            try:
                self.loop.run_until_complete(self._acm.__aexit__(None, None, None))
            finally:
                self.loop.close()
        else:
            self.stack.__exit__(None, None, None)

    def invoke(self, graph: str, inp: Any, thread: str) -> dict:
        g = self.graphs[graph]
        if self.loop is not None:
            return self.loop.run_until_complete(L.ainvoke_reporting_interrupts(g, inp, cfg(thread)))
        return L.invoke_reporting_interrupts(g, inp, cfg(thread))

    def get_state(self, graph: str, thread: str):
        g = self.graphs[graph]
        if self.loop is not None:
            return self.loop.run_until_complete(g.aget_state(cfg(thread)))
        return g.get_state(cfg(thread))

    def setup(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.saver.setup())
        else:
            self.saver.setup()


def resume_once(runner: Runner, job: dict) -> dict:
    CTX["thread"] = job["thread"]
    CTX["gate_ms"] = job.get("gate_ms", 0)
    value = job.get("value", f"v-{CTX['racer']}")
    if job.get("form", "bare") == "map":
        cmd = Command(resume={job["interrupt_id"]: value})
    else:
        cmd = Command(resume=value)
    out: dict[str, Any] = {"id": CTX["racer"], "pid": os.getpid(), "thread": job["thread"],
                           "t_start": time.time()}
    try:
        res = runner.invoke(job.get("graph", "one"), cmd, job["thread"])
        out.update(ok=True, values=plain(res), interrupts=interrupts_of(res), error=None)
    except Exception as e:  # the racer reports, the test judges
        out.update(ok=False, values=None, interrupts=[], error=describe_error(e))
        recover_pipeline(runner)
    out["t_end"] = time.time()
    return out


def recover_pipeline(runner: Runner) -> None:
    """A saver in pipeline mode stays aborted after any error until its pipeline
    syncs, and LangGraph syncs only after writes: its next read would fail
    PipelineAborted. Syncing is what an application does to go on."""
    pipe = getattr(runner.saver, "pipe", None)
    if pipe is None:
        return
    try:
        pipe.sync()
    except Exception:  # the aborted segment's own error, reported again
        pass


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, default=str))
    os.replace(tmp, path)


# ----------------------------------------------------------------- commands
def cmd_worker(a) -> dict:
    d = Path(a.dir)
    jobs = json.loads(Path(a.jobs).read_text())
    _ledger_conn()
    with Runner(a.saver, a.dsn) as runner:
        for j, job in enumerate(jobs):
            (d / f"ready-{j}-{a.id}").touch()
            go = d / f"go-{j}"
            deadline = time.monotonic() + a.barrier_timeout
            while not go.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"racer {a.id}: no {go} within {a.barrier_timeout}s")
                time.sleep(0.0005)
            t_go = time.time()
            res = resume_once(runner, job)
            res["t_go"] = t_go
            res["job"] = j
            write_json(d / f"result-{j}-{a.id}.json", res)
    return {"ok": True, "jobs": len(jobs)}


def cmd_park(a) -> dict:
    with Runner(a.saver, a.dsn) as runner:
        res = runner.invoke(a.graph, dict(INITIAL), a.thread)
    return {"values": plain(res), "interrupts": interrupts_of(res)}


def cmd_resume(a) -> dict:
    job = {"thread": a.thread, "graph": a.graph, "form": a.form, "value": json.loads(a.value),
           "gate_ms": a.gate_ms, "interrupt_id": a.interrupt_id}
    _ledger_conn()
    with Runner(a.saver, a.dsn) as runner:
        if a.start_at:
            time.sleep(max(0.0, a.start_at - time.time()))
        print("reading", file=sys.stderr, flush=True)
        return resume_once(runner, job)


def cmd_state(a) -> dict:
    with Runner(a.saver, a.dsn) as runner:
        t0 = time.time()
        try:
            st = runner.get_state(a.graph, a.thread)
            out = {"ok": True, "values": dict(st.values), "next": list(st.next),
                   "interrupts": [{"id": L.interrupt_key(i), "value": i.value}
                                  for i in L.state_interrupts(st)],
                   "error": None}
        except Exception as e:
            out = {"ok": False, "error": describe_error(e)}
        out.update(t_start=t0, t_end=time.time())
        if a.hold_s:
            print(json.dumps(out, default=str), flush=True)
            time.sleep(a.hold_s)
            return {"held": a.hold_s}
    return out


def cmd_setup(a) -> dict:
    with Runner("conn", a.dsn) as runner:
        runner.setup()
    with psycopg.connect(a.dsn, autocommit=True) as c:
        c.execute(LEDGER_DDL)
    return {"ok": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["worker", "park", "resume", "state", "setup"])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--ledger-dsn", default=None)
    ap.add_argument("--id", default="r0")
    ap.add_argument("--saver", choices=("conn", "pool", "async", "pipeline", "pool_tx"), default="conn")
    ap.add_argument("--graph", choices=GRAPHS, default="one")
    ap.add_argument("--thread", default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--jobs", default=None)
    ap.add_argument("--barrier-timeout", type=float, default=120.0)
    ap.add_argument("--value", default="true")
    ap.add_argument("--form", choices=("bare", "map"), default="bare")
    ap.add_argument("--interrupt-id", default=None)
    ap.add_argument("--gate-ms", type=int, default=0)
    ap.add_argument("--start-at", type=float, default=None)
    ap.add_argument("--hold-s", type=float, default=0.0)
    a = ap.parse_args(argv)
    CTX["racer"] = a.id
    CTX["ledger_dsn"] = a.ledger_dsn or a.dsn
    out = {"worker": cmd_worker, "park": cmd_park, "resume": cmd_resume, "state": cmd_state,
           "setup": cmd_setup}[a.command](a)
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
