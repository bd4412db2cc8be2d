"""LangGraph scenarios shared by the integration tests (and usable as a CLI).

The graph is ``prep -> gate(interrupt()) -> after`` over a TypedDict state with
a list channel (stored in ``checkpoint_blobs``) and primitive channels
(stored inline in the checkpoint).

Saver kinds, as the wire notes name them:
  ``conn``  PostgresSaver.from_conn_string(dsn)
  ``pool``  PostgresSaver(ConnectionPool(dsn, kwargs={autocommit, prepare_threshold=0, dict_row}))
  ``async`` AsyncPostgresSaver.from_conn_string(dsn)
  and, see EXTRA_SAVER_KINDS, ``pipeline`` and ``pool_tx``.

``RG_PREPARE_THRESHOLD=none`` in the environment (read at each construction, so
racer processes inherit it) builds ``conn``, ``pool`` and ``async`` the same way but
with psycopg's ``prepare_threshold=None`` (no named prepared statements): what a
saver needs behind a transaction pooler that does not track prepared statements
(PgBouncer before 1.21; docs/poolers.md).

Each scenario returns plain, JSON-able *observables* (values, next tuples,
interrupt values, history) that must be identical whether the saver talks to
PostgreSQL directly or through the proxy, plus ``ids`` (checkpoint ids) that
are not compared but are handy for audit checks.

CLI (for tests that need separate OS processes, e.g. concurrent resumers):

    python lg_scenarios.py park   --dsn DSN --thread T [--saver conn|pool|async]
    python lg_scenarios.py resume --dsn DSN --thread T [--saver ...] [--value true|false|JSON]
                                  [--checkpoint-id ID] [--start-at EPOCH_SECONDS]
    python lg_scenarios.py state  --dsn DSN --thread T [--saver ...]
    python lg_scenarios.py full   --dsn DSN --thread T [--saver ...]

Each prints one JSON object on stdout.
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
from typing import Annotated, Any, Callable, Iterator, TypedDict

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, StateSnapshot, interrupt

SAVER_KINDS = ("conn", "pool", "async")
# Further constructions from the wire notes' table. setup() fails with both (25001:
# CREATE INDEX CONCURRENTLY in a pipeline / in a transaction block), so the
# scenario migrates the database with a "conn" saver first.
#   ``pipeline`` PostgresSaver.from_conn_string(dsn, pipeline=True): permanent pipeline
#                mode, reads end in Flush with no Sync and no ReadyForQuery
#   ``pool_tx``  PostgresSaver(ConnectionPool(dsn)) with psycopg defaults: no autocommit,
#                BEGIN/COMMIT around each checkout, prepare_threshold=5
EXTRA_SAVER_KINDS = ("pipeline", "pool_tx")
ALL_SAVER_KINDS = SAVER_KINDS + EXTRA_SAVER_KINDS
INITIAL_INPUT = {"items": [], "count": 0, "name": "rg", "approved": None}
CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


class State(TypedDict):
    items: Annotated[list[str], operator.add]  # list channel -> checkpoint_blobs
    count: int                                 # primitive -> inline
    name: str
    approved: bool | None


# Side effects of the gated node, per process (tests of consume-once can read them).
GATE_EFFECTS: list[Any] = []


def prep(state: State) -> dict:
    return {"items": ["prep"], "count": state["count"] + 1}


def gate(state: State) -> dict:
    answer = interrupt({"question": "approve?", "items": list(state["items"])})
    GATE_EFFECTS.append(answer)
    return {"approved": answer, "items": [f"gate:{answer}"]}


def after(state: State) -> dict:
    return {"items": ["after"], "count": state["count"] + 1}


def chain(state_type, *nodes: tuple[str, Any]) -> StateGraph:
    """An uncompiled graph START -> nodes[0] -> ... -> nodes[-1] -> END over
    ``state_type``; each node is (name, callable or compiled subgraph)."""
    g = StateGraph(state_type)
    for name, fn in nodes:
        g.add_node(name, fn)
    names = [START, *(name for name, _ in nodes), END]
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    return g


def build_graph(checkpointer):
    return chain(State, ("prep", prep), ("gate", gate), ("after", after)).compile(
        checkpointer=checkpointer)


def thread_config(thread_id: str, checkpoint_id: str | None = None) -> dict:
    cfg: dict = {"configurable": {"thread_id": thread_id}}
    if checkpoint_id:
        cfg["configurable"]["checkpoint_id"] = checkpoint_id
    return cfg


# ----------------------------------------------------------------- interrupts across versions
# langgraph 0.2.x (paired with saver 2.0.8) has no StateSnapshot.interrupts: invoke's
# result carries no "__interrupt__", an Interrupt has no id, and a resume map is keyed
# by task id. Its parked state names the interrupts on its tasks instead.
LEGACY_INTERRUPTS = "interrupts" not in StateSnapshot._fields


def state_interrupts(snapshot) -> list:
    """The interrupts ``snapshot`` is parked on, whatever the langgraph version."""
    if LEGACY_INTERRUPTS:
        return [i for t in snapshot.tasks for i in t.interrupts]
    return list(snapshot.interrupts)


def interrupt_key(i) -> str:
    """The key of a resume map answering interrupt ``i``: its id, or on langgraph 0.2.x
    its task's id (the last element of its namespace, ``node:task_id``)."""
    if LEGACY_INTERRUPTS:
        return i.ns[-1].rsplit(":", 1)[1]
    return i.id


def _values_and_interrupts(chunks) -> dict:
    out: dict = {}
    interrupts: list = []
    for mode, chunk in chunks:
        if mode == "values":
            out = dict(chunk)
        elif "__interrupt__" in chunk:
            interrupts.extend(chunk["__interrupt__"])
    if interrupts:
        out["__interrupt__"] = tuple(interrupts)
    return out


def invoke_reporting_interrupts(graph, inp, config: dict) -> dict:
    """``graph.invoke`` whose result carries ``"__interrupt__"`` on every version:
    on langgraph 0.2.x it streams the same run (invoke is a stream of "values") and
    takes the interrupts from its "updates" chunks, with no further checkpoint read."""
    if not LEGACY_INTERRUPTS:
        return graph.invoke(inp, config)
    return _values_and_interrupts(graph.stream(inp, config, stream_mode=["values", "updates"]))


async def ainvoke_reporting_interrupts(graph, inp, config: dict) -> dict:
    """The async twin of :func:`invoke_reporting_interrupts`."""
    if not LEGACY_INTERRUPTS:
        return await graph.ainvoke(inp, config)
    return _values_and_interrupts([c async for c in graph.astream(
        inp, config, stream_mode=["values", "updates"])])


def resume_key(snapshot) -> str:
    """The key of ``Command(resume={key: value})`` answering ``snapshot``'s first
    interrupt: the interrupt's id, or on langgraph 0.2.x its task's id."""
    if LEGACY_INTERRUPTS:
        return next(t.id for t in snapshot.tasks if t.interrupts)
    return snapshot.interrupts[0].id


# ----------------------------------------------------------------- savers
def unprepared() -> bool:
    """Whether savers are built without prepared statements (RG_PREPARE_THRESHOLD=none)."""
    return os.environ.get("RG_PREPARE_THRESHOLD") == "none"


def saver_kwargs() -> dict:
    """The connection settings of the savers' own ``from_conn_string``, but for the
    prepare threshold under RG_PREPARE_THRESHOLD=none."""
    return {"autocommit": True, "prepare_threshold": None if unprepared() else 0,
            "row_factory": dict_row}


@contextlib.asynccontextmanager
async def async_saver(dsn: str):
    """``AsyncPostgresSaver.from_conn_string(dsn)``, or its unprepared twin."""
    if not unprepared():
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            yield saver
        return
    async with await psycopg.AsyncConnection.connect(dsn, **saver_kwargs()) as conn:
        yield AsyncPostgresSaver(conn)


@contextlib.contextmanager
def sync_saver(kind: str, dsn: str) -> Iterator[PostgresSaver]:
    if kind == "conn" and unprepared():
        with psycopg.connect(dsn, **saver_kwargs()) as conn:
            yield PostgresSaver(conn)
    elif kind == "conn":
        with PostgresSaver.from_conn_string(dsn) as saver:
            yield saver
    elif kind == "pool":
        with ConnectionPool(dsn, min_size=2, max_size=4, timeout=30, open=True,
                            kwargs=saver_kwargs()) as pool:
            yield PostgresSaver(pool)
    elif kind == "pipeline":
        with PostgresSaver.from_conn_string(dsn, pipeline=True) as saver:
            yield saver
    elif kind == "pool_tx":
        with ConnectionPool(dsn, min_size=2, max_size=4, timeout=30, open=True,
                            kwargs={"row_factory": dict_row}) as pool:
            yield PostgresSaver(pool)
    else:
        raise ValueError(f"not a sync saver kind: {kind}")


# ----------------------------------------------------------------- observables
def _interrupt_values(interrupts) -> list:
    return [i.value for i in (interrupts or ())]


def _result(res: dict) -> dict:
    res = dict(res)
    out = {k: v for k, v in res.items() if k != "__interrupt__"}
    if "__interrupt__" in res:
        out["__interrupt__"] = _interrupt_values(res["__interrupt__"])
    return out


def _snapshot(s) -> dict:
    return {
        "values": dict(s.values),
        "next": list(s.next),
        "interrupts": _interrupt_values(state_interrupts(s)),
        "task_names": [t.name for t in s.tasks],
        "task_interrupts": [_interrupt_values(t.interrupts) for t in s.tasks],
        "step": (s.metadata or {}).get("step"),
        "source": (s.metadata or {}).get("source"),
    }


def count_rows(dsn: str, thread_id: str) -> dict[str, int]:
    """Rows per checkpoint table for the thread (use a *direct* DSN)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return {t: c.execute(f"select count(*) from {t} where thread_id = %s", (thread_id,)).fetchone()[0]
                for t in CHECKPOINT_TABLES}


# ----------------------------------------------------------------- scenarios
def full_scenario_sync(kind: str, dsn: str, thread_id: str, inspect_dsn: str | None = None,
                       resume_value: Any = True) -> dict:
    """setup, park, inspect, resume, final state, history, delete_thread."""
    obs: dict[str, Any] = {"thread_id": thread_id, "saver": kind}
    ids: dict[str, Any] = {}
    cfg = thread_config(thread_id)
    if kind in EXTRA_SAVER_KINDS:
        with sync_saver("conn", dsn) as migrator:
            migrator.setup()
    with sync_saver(kind, dsn) as saver:
        if kind not in EXTRA_SAVER_KINDS:
            saver.setup()
        graph = build_graph(saver)
        obs["park_result"] = _result(graph.invoke(dict(INITIAL_INPUT), cfg))
        parked = graph.get_state(cfg)
        obs["parked_state"] = _snapshot(parked)
        ids["parked_checkpoint_id"] = parked.config["configurable"]["checkpoint_id"]
        obs["final_result"] = _result(graph.invoke(Command(resume=resume_value), cfg))
        final = graph.get_state(cfg)
        obs["final_state"] = _snapshot(final)
        ids["final_checkpoint_id"] = final.config["configurable"]["checkpoint_id"]
        history = list(graph.get_state_history(cfg))
        obs["history"] = [_snapshot(h) for h in history]
        ids["history"] = [h.config["configurable"]["checkpoint_id"] for h in history]
        if inspect_dsn:
            obs["rows_before_delete"] = count_rows(inspect_dsn, thread_id)
        saver.delete_thread(thread_id)
        gone = graph.get_state(cfg)
        obs["after_delete"] = {"values": dict(gone.values), "next": list(gone.next)}
        obs["history_after_delete"] = len(list(graph.get_state_history(cfg)))
    if inspect_dsn:
        obs["rows_after_delete"] = count_rows(inspect_dsn, thread_id)
    return {"observables": obs, "ids": ids}


async def _full_scenario_async(dsn: str, thread_id: str, inspect_dsn: str | None,
                               resume_value: Any) -> dict:
    obs: dict[str, Any] = {"thread_id": thread_id, "saver": "async"}
    ids: dict[str, Any] = {}
    cfg = thread_config(thread_id)
    async with async_saver(dsn) as saver:
        await saver.setup()
        graph = build_graph(saver)
        obs["park_result"] = _result(await graph.ainvoke(dict(INITIAL_INPUT), cfg))
        parked = await graph.aget_state(cfg)
        obs["parked_state"] = _snapshot(parked)
        ids["parked_checkpoint_id"] = parked.config["configurable"]["checkpoint_id"]
        obs["final_result"] = _result(await graph.ainvoke(Command(resume=resume_value), cfg))
        final = await graph.aget_state(cfg)
        obs["final_state"] = _snapshot(final)
        ids["final_checkpoint_id"] = final.config["configurable"]["checkpoint_id"]
        history = [h async for h in graph.aget_state_history(cfg)]
        obs["history"] = [_snapshot(h) for h in history]
        ids["history"] = [h.config["configurable"]["checkpoint_id"] for h in history]
        if inspect_dsn:
            obs["rows_before_delete"] = await asyncio.to_thread(count_rows, inspect_dsn, thread_id)
        await saver.adelete_thread(thread_id)
        gone = await graph.aget_state(cfg)
        obs["after_delete"] = {"values": dict(gone.values), "next": list(gone.next)}
        obs["history_after_delete"] = len([h async for h in graph.aget_state_history(cfg)])
    if inspect_dsn:
        obs["rows_after_delete"] = count_rows(inspect_dsn, thread_id)
    return {"observables": obs, "ids": ids}


def full_scenario(kind: str, dsn: str, thread_id: str, inspect_dsn: str | None = None,
                  resume_value: Any = True) -> dict:
    if kind == "async":
        return asyncio.run(_full_scenario_async(dsn, thread_id, inspect_dsn, resume_value))
    return full_scenario_sync(kind, dsn, thread_id, inspect_dsn, resume_value)


# Single steps (for multi-process tests). Each opens its own saver.
def _with_graph(kind: str, dsn: str, fn_sync: Callable, fn_async: Callable) -> Any:
    if kind == "async":
        async def run():
            async with async_saver(dsn) as saver:
                return await fn_async(build_graph(saver), saver)
        return asyncio.run(run())
    with sync_saver(kind, dsn) as saver:
        return fn_sync(build_graph(saver), saver)


def setup_db(kind: str, dsn: str) -> None:
    async def a(graph, saver):
        await saver.setup()
    _with_graph(kind, dsn, lambda graph, saver: saver.setup(), a)


def park(kind: str, dsn: str, thread_id: str) -> dict:
    cfg = thread_config(thread_id)

    def s(graph, saver):
        res = _result(graph.invoke(dict(INITIAL_INPUT), cfg))
        st = graph.get_state(cfg)
        return {"result": res, "state": _snapshot(st),
                "checkpoint_id": st.config["configurable"]["checkpoint_id"]}

    async def a(graph, saver):
        res = _result(await graph.ainvoke(dict(INITIAL_INPUT), cfg))
        st = await graph.aget_state(cfg)
        return {"result": res, "state": _snapshot(st),
                "checkpoint_id": st.config["configurable"]["checkpoint_id"]}

    return _with_graph(kind, dsn, s, a)


def resume(kind: str, dsn: str, thread_id: str, value: Any = True,
           checkpoint_id: str | None = None, start_at: float | None = None) -> dict:
    """Resume the parked thread; optionally addressed to a checkpoint (a fork) and
    started at an absolute time (so several processes race)."""
    cfg = thread_config(thread_id, checkpoint_id)

    def wait():
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))

    def s(graph, saver):
        wait()
        res = _result(graph.invoke(Command(resume=value), cfg))
        return {"result": res, "gate_effects": list(GATE_EFFECTS)}

    async def a(graph, saver):
        wait()
        res = _result(await graph.ainvoke(Command(resume=value), cfg))
        return {"result": res, "gate_effects": list(GATE_EFFECTS)}

    return _with_graph(kind, dsn, s, a)


def state(kind: str, dsn: str, thread_id: str) -> dict:
    cfg = thread_config(thread_id)

    def s(graph, saver):
        st = graph.get_state(cfg)
        return {"state": _snapshot(st), "history": [_snapshot(h) for h in graph.get_state_history(cfg)]}

    async def a(graph, saver):
        st = await graph.aget_state(cfg)
        return {"state": _snapshot(st),
                "history": [_snapshot(h) async for h in graph.aget_state_history(cfg)]}

    return _with_graph(kind, dsn, s, a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["setup", "park", "resume", "state", "full"])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--thread", default=None)
    ap.add_argument("--saver", choices=ALL_SAVER_KINDS, default="conn")
    ap.add_argument("--value", default="true", help="resume value, JSON (default true)")
    ap.add_argument("--checkpoint-id", default=None)
    ap.add_argument("--start-at", type=float, default=None)
    ap.add_argument("--inspect-dsn", default=None)
    a = ap.parse_args(argv)
    if a.command != "setup" and not a.thread:
        ap.error("--thread is required")
    if a.command == "setup":
        setup_db(a.saver, a.dsn)
        out: Any = {"ok": True}
    elif a.command == "park":
        out = park(a.saver, a.dsn, a.thread)
    elif a.command == "resume":
        out = resume(a.saver, a.dsn, a.thread, json.loads(a.value), a.checkpoint_id, a.start_at)
    elif a.command == "state":
        out = state(a.saver, a.dsn, a.thread)
    else:
        out = full_scenario(a.saver, a.dsn, a.thread, a.inspect_dsn, json.loads(a.value))
    json.dump(out, sys.stdout, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
