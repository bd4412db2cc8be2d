"""LangGraph graphs and scenarios for the enforcement legs' integration tests
(test_fork.py: fork-intent filter; test_validity.py: checkpoint validity gate).

Every scenario runs unchanged against a *direct* DSN (stock behaviour, the
defect) and a *proxy* DSN (the repair); only the DSN differs. Side effects of
gated nodes are counted in a ledger outside the checkpoint tables: a plain
Python list owned by the caller, appended to by the node itself.

``Driver`` hides the sync/async split so one scenario body serves the three
saver constructions the issue names:

  ``conn``  PostgresSaver.from_conn_string(dsn)
  ``pool``  PostgresSaver(ConnectionPool(dsn, kwargs={autocommit, prepare_threshold=0, dict_row}))
  ``async`` AsyncPostgresSaver.from_conn_string(dsn)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
from typing import Annotated, Any, Callable, TypedDict

import psycopg
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command, interrupt
from pydantic import BaseModel, Field

import lg_scenarios as L

SAVER_KINDS = ("conn", "pool", "async")
NULL_TASK = "00000000-0000-0000-0000-000000000000"


# ----------------------------------------------------------------- driver
class Driver:
    """One saver (sync or async) plus sync-looking calls on compiled graphs."""

    def __init__(self, kind: str, dsn: str):
        self.kind = kind
        self.dsn = dsn
        self._stack = contextlib.ExitStack()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._acm = None
        self.saver = None

    def __enter__(self) -> "Driver":
        if self.kind == "async":
            self.loop = asyncio.new_event_loop()
            self._acm = L.async_saver(self.dsn)
            self.saver = self.loop.run_until_complete(self._acm.__aenter__())
        else:
            self.saver = self._stack.enter_context(L.sync_saver(self.kind, self.dsn))
        return self

    def __exit__(self, *exc) -> None:
        if self.kind == "async":
            assert self.loop is not None
            try:
                self.loop.run_until_complete(self._acm.__aexit__(*exc))
            finally:
                self.loop.close()
        else:
            self._stack.__exit__(*exc)

    def _run(self, coro):
        assert self.loop is not None
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout=60))

    def setup(self) -> None:
        if self.kind == "async":
            self._run(self.saver.setup())
        else:
            self.saver.setup()

    def invoke(self, graph, inp: Any, cfg: dict) -> dict:
        if self.kind == "async":
            return self._run(L.ainvoke_reporting_interrupts(graph, inp, cfg))
        return L.invoke_reporting_interrupts(graph, inp, cfg)

    def get_state(self, graph, cfg: dict, subgraphs: bool = False):
        if self.kind == "async":
            return self._run(graph.aget_state(cfg, subgraphs=subgraphs))
        return graph.get_state(cfg, subgraphs=subgraphs)

    def history(self, graph, cfg: dict) -> list:
        if self.kind == "async":
            async def collect():
                return [h async for h in graph.aget_state_history(cfg)]
            return self._run(collect())
        return list(graph.get_state_history(cfg))


def setup_db(dsn: str) -> None:
    """Run the saver's migrations once (use the direct DSN)."""
    with Driver("conn", dsn) as d:
        d.setup()


def cfg_of(thread_id: str, checkpoint_id: str | None = None) -> dict:
    return L.thread_config(thread_id, checkpoint_id)


def cp_id(snapshot_or_config) -> str:
    cfg = getattr(snapshot_or_config, "config", snapshot_or_config)
    return cfg["configurable"]["checkpoint_id"]


def strip_interrupts(res: dict) -> dict:
    return {k: v for k, v in dict(res).items() if k != "__interrupt__"}


def interrupt_values(res: dict) -> list:
    return [i.value for i in dict(res).get("__interrupt__", ())]


# ----------------------------------------------------------------- fork graph
class GateState(TypedDict):
    items: Annotated[list[str], operator.add]
    approved: bool | None


def build_gate_graph(checkpointer, ledger: list):
    """prep -> gate(interrupt) -> after. ``gate`` appends its answer to ``ledger``
    (the gated side effect, counted outside the checkpoint tables)."""

    def prep(state: GateState) -> dict:
        return {"items": ["prep"]}

    def gate(state: GateState) -> dict:
        answer = interrupt({"question": "approve?"})
        ledger.append(answer)
        return {"approved": answer, "items": [f"gate:{answer}"]}

    def after(state: GateState) -> dict:
        return {"items": ["after"]}

    g = L.chain(GateState, ("prep", prep), ("gate", gate), ("after", after))
    return g.compile(checkpointer=checkpointer)


def fork_scenario(kind: str, dsn: str, thread_id: str, form: str, forks: int = 1,
                  fork_value: Any = False, read_a_by_id: bool = True) -> dict:
    """Park at C, resume with True (branch A, completes), then fork at C
    ``forks`` times with ``fork_value`` (bare: Command(resume=v); map:
    Command(resume={interrupt_id: v})) addressed to C's checkpoint_id."""
    ledger: list = []
    out: dict[str, Any] = {"thread_id": thread_id, "ledger": ledger}
    cfg = cfg_of(thread_id)
    with Driver(kind, dsn) as d:
        graph = build_gate_graph(d.saver, ledger)
        parked = d.invoke(graph, {"items": [], "approved": None}, cfg)
        out["parked_interrupts"] = interrupt_values(parked)
        c_state = d.get_state(graph, cfg)
        c_id = cp_id(c_state)
        out["c_id"] = c_id
        out["c_next"] = list(c_state.next)
        interrupt_id = L.resume_key(c_state)
        out["interrupt_id"] = interrupt_id
        a_result = d.invoke(graph, Command(resume=True), cfg)
        out["a_result"] = strip_interrupts(a_result)
        out["a_ledger"] = list(ledger)
        a_final = d.get_state(graph, cfg)
        out["a_final_id"] = cp_id(a_final)
        out["a_final_values"] = dict(a_final.values)
        out["forks"] = []
        for _ in range(forks):
            resume = fork_value if form == "bare" else {interrupt_id: fork_value}
            before = len(ledger)
            res = d.invoke(graph, Command(resume=resume), cfg_of(thread_id, c_id))
            head = d.get_state(graph, cfg)
            out["forks"].append({
                "result": strip_interrupts(res),
                "interrupts": interrupt_values(res),
                "effects": ledger[before:],
                "final_id": cp_id(head),
                "final_values": dict(head.values),
                "final_next": list(head.next),
                "final_parent": head.parent_config["configurable"]["checkpoint_id"]
                if head.parent_config else None,
            })
        history = d.history(graph, cfg)
        out["history"] = [{"id": cp_id(h), "values": dict(h.values), "next": list(h.next),
                           "parent": (h.parent_config or {}).get("configurable", {}).get("checkpoint_id")}
                          for h in history]
        if read_a_by_id:
            # A's final checkpoint, read by its id (it is not the head any more)
            out["a_final_by_id"] = dict(d.get_state(graph, cfg_of(thread_id, out["a_final_id"])).values)
    out["ledger"] = list(ledger)
    return out


def ordinary_resume_scenario(kind: str, dsn: str, thread_id: str, value: Any = True) -> dict:
    """Park, resume at the ordinary address (thread config only), final state."""
    ledger: list = []
    cfg = cfg_of(thread_id)
    with Driver(kind, dsn) as d:
        graph = build_gate_graph(d.saver, ledger)
        d.invoke(graph, {"items": [], "approved": None}, cfg)
        res = d.invoke(graph, Command(resume=value), cfg)
        final = d.get_state(graph, cfg)
        return {"result": strip_interrupts(res), "ledger": list(ledger),
                "values": dict(final.values), "next": list(final.next)}


def stray_resume_scenario(kind: str, dsn: str, thread_id: str, form: str) -> dict:
    """Complete a run with True, then send a stray Command(resume=False) to the
    ordinary address (thread config only): it must stay inert. ``stray_error`` is
    the stray's refusal (SQLSTATE and message), if it got one instead of a result."""
    ledger: list = []
    cfg = cfg_of(thread_id)
    out: dict[str, Any] = {}
    with Driver(kind, dsn) as d:
        graph = build_gate_graph(d.saver, ledger)
        d.invoke(graph, {"items": [], "approved": None}, cfg)
        interrupt_id = d.get_state(graph, cfg).interrupts[0].id
        out["completed"] = strip_interrupts(d.invoke(graph, Command(resume=True), cfg))
        before_state = d.get_state(graph, cfg)
        before_hist = len(d.history(graph, cfg))
        effects_before = len(ledger)
        resume = False if form == "bare" else {interrupt_id: False}
        try:
            res = d.invoke(graph, Command(resume=resume), cfg)
            out.update(stray_result=strip_interrupts(res), stray_interrupts=interrupt_values(res),
                       stray_error=None)
        except psycopg.Error as e:
            out.update(stray_result=None, stray_interrupts=None,
                       stray_error={"sqlstate": e.sqlstate, "message": e.diag.message_primary})
        after_state = d.get_state(graph, cfg)
        out.update({
            "stray_effects": ledger[effects_before:],
            "values_before": dict(before_state.values),
            "values_after": dict(after_state.values),
            "next_after": list(after_state.next),
            "head_unchanged": cp_id(before_state) == cp_id(after_state),
            "history_len_before": before_hist,
            "history_len_after": len(d.history(graph, cfg)),
            "ledger": list(ledger),
        })
    return out


# ----------------------------------------------------------------- two interrupts in one node
class TwoState(TypedDict):
    answers: Annotated[list[str], operator.add]


def build_two_interrupt_graph(checkpointer, ledger: list):
    def ask(state: TwoState) -> dict:
        first = interrupt("first?")
        second = interrupt("second?")
        ledger.append((first, second))
        return {"answers": [first, second]}

    return L.chain(TwoState, ("ask", ask)).compile(checkpointer=checkpointer)


def two_interrupt_scenario(kind: str, dsn: str, thread_id: str) -> dict:
    """Park at the first interrupt; answer twice, each time with the config
    get_state returned (it carries the head's checkpoint_id)."""
    ledger: list = []
    cfg = cfg_of(thread_id)
    out: dict[str, Any] = {"steps": []}
    with Driver(kind, dsn) as d:
        graph = build_two_interrupt_graph(d.saver, ledger)
        res = d.invoke(graph, {"answers": []}, cfg)
        out["park"] = interrupt_values(res)
        for answer in ("one", "two"):
            head = d.get_state(graph, cfg)
            head_cfg = head.config
            assert head_cfg["configurable"].get("checkpoint_id"), head_cfg
            res = d.invoke(graph, Command(resume=answer), head_cfg)
            out["steps"].append({"result": strip_interrupts(res), "interrupts": interrupt_values(res),
                                 "addressed_head": cp_id(head_cfg)})
        final = d.get_state(graph, cfg)
        out["values"] = dict(final.values)
        out["next"] = list(final.next)
        out["history_len"] = len(d.history(graph, cfg))
    out["ledger"] = list(ledger)
    return out


# ----------------------------------------------------------------- subgraphs
class SubState(TypedDict):
    items: Annotated[list[str], operator.add]
    approved: bool | None


def build_subgraph_parent(checkpointer, ledger: list, variant: str):
    """Parent: START -> pre -> sub -> post -> END; sub: sg_prep -> sg_gate(interrupt).
    variant "inherit": sub compiled without a checkpointer (ns ``sub:<task id>``);
    variant "own": sub compiled with checkpointer=True (ns ``sub``)."""

    def sg_prep(state: SubState) -> dict:
        return {"items": ["sg_prep"]}

    def sg_gate(state: SubState) -> dict:
        answer = interrupt({"question": "sub approve?"})
        ledger.append(answer)
        return {"approved": answer, "items": [f"sg_gate:{answer}"]}

    sg = L.chain(SubState, ("sg_prep", sg_prep), ("sg_gate", sg_gate))
    sub = sg.compile(checkpointer=True) if variant == "own" else sg.compile()

    def pre(state: SubState) -> dict:
        return {"items": ["pre"]}

    def post(state: SubState) -> dict:
        return {"items": ["post"]}

    g = L.chain(SubState, ("pre", pre), ("sub", sub), ("post", post))
    return g.compile(checkpointer=checkpointer)


def subgraph_scenario(kind: str, dsn: str, thread_id: str, variant: str) -> dict:
    ledger: list = []
    cfg = cfg_of(thread_id)
    out: dict[str, Any] = {}
    with Driver(kind, dsn) as d:
        graph = build_subgraph_parent(d.saver, ledger, variant)
        res = d.invoke(graph, {"items": [], "approved": None}, cfg)
        out["park_values"] = strip_interrupts(res)
        out["park_interrupts"] = interrupt_values(res)
        parked = d.get_state(graph, cfg, subgraphs=True)
        out["parked_next"] = list(parked.next)
        out["parked_sub_values"] = [dict(t.state.values) if t.state is not None and
                                    hasattr(t.state, "values") else None for t in parked.tasks]
        res = d.invoke(graph, Command(resume=True), cfg)
        out["final_result"] = strip_interrupts(res)
        final = d.get_state(graph, cfg)
        out["final_values"] = dict(final.values)
        out["final_next"] = list(final.next)
        out["history_len"] = len(d.history(graph, cfg))
        # a second resume at the ordinary address: inert, as stock (or, through the
        # proxy, refused as a late duplicate)
        try:
            res = d.invoke(graph, Command(resume=False), cfg)
            out["stray_result"] = strip_interrupts(res)
        except psycopg.Error as e:
            out["stray_result"] = {"refused": e.sqlstate,
                                   "late_duplicate": "late duplicate" in str(e.diag.message_primary)}
    out["ledger"] = list(ledger)
    return out


def namespaces(dsn: str, thread_id: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(
            "select distinct checkpoint_ns from checkpoints where thread_id = %s order by 1",
            (thread_id,))]


# ----------------------------------------------------------------- validity graphs
class ItemsState(TypedDict):
    items: Annotated[list[str], operator.add]
    pending: Any
    note: str


def build_items_graph(checkpointer):
    """START -> append -> END: ``append`` adds ``[state["pending"]]`` to items,
    whatever it is (the application bug: None or an int), and writes ``note``
    in the same task (so its pending-write batch has a valid neighbour)."""

    def append(state: ItemsState) -> dict:
        return {"items": [state["pending"]], "note": f"appended {state['pending']!r}"}

    return L.chain(ItemsState, ("append", append)).compile(checkpointer=checkpointer)


class PydState(BaseModel):
    items: Annotated[list[str], operator.add] = Field(default_factory=list)
    pending: Any = None
    note: str = ""
    seen: int = 0


def build_pyd_graph(checkpointer):
    """START -> append -> check -> END over a pydantic state: ``append`` adds
    ``[pending]`` to items; ``check`` is the next node (where stock raises,
    after the bad value is durable)."""

    def append(state: PydState) -> dict:
        return {"items": [state.pending], "note": f"appended {state.pending!r}"}

    def check(state: PydState) -> dict:
        return {"seen": state.seen + 1}

    g = L.chain(PydState, ("append", append), ("check", check))
    return g.compile(checkpointer=checkpointer)


GRAPHS: dict[str, Callable] = {"typeddict": build_items_graph, "pydantic": build_pyd_graph}


def state_jsonschema(state_kind: str) -> dict:
    """The graph's own exported input schema (what a user would import)."""
    return GRAPHS[state_kind](None).get_input_jsonschema()


# ----------------------------------------------------------------- row inspection
_SERDE = JsonPlusSerializer()


def _loads(type_: str | None, blob: bytes | None) -> Any:
    if type_ is None or type_ == "empty":
        return "<empty>"
    return _SERDE.loads_typed((type_, bytes(blob) if blob is not None else b""))


def channel_rows(dsn: str, thread_id: str, channel: str) -> dict[str, list]:
    """Every stored value of ``channel`` for the thread, decoded: pending writes,
    blobs, and inline values in the checkpoint JSONB (use a *direct* DSN)."""
    out: dict[str, list] = {"writes": [], "blobs": [], "inline": []}
    with psycopg.connect(dsn, autocommit=True) as c:
        for type_, blob in c.execute(
                "select type, blob from checkpoint_writes where thread_id = %s and channel = %s",
                (thread_id, channel)):
            out["writes"].append(_loads(type_, blob))
        for type_, blob in c.execute(
                "select type, blob from checkpoint_blobs where thread_id = %s and channel = %s",
                (thread_id, channel)):
            out["blobs"].append(_loads(type_, blob))
        for (cv,) in c.execute(
                "select checkpoint->'channel_values'->%s from checkpoints "
                "where thread_id = %s and checkpoint->'channel_values' ? %s",
                (channel, thread_id, channel)):
            out["inline"].append(cv)
    return out


def dangling_versions(dsn: str, thread_id: str, channel: str) -> list:
    """Checkpoints whose channel_versions name a version of ``channel`` with no
    blob row (a checkpoint committed without its blob: a torn ``put``)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(
            "select c.checkpoint_id, c.checkpoint->'channel_versions'->>%s from checkpoints c "
            "where c.thread_id = %s and c.checkpoint->'channel_versions' ? %s "
            "and not (c.checkpoint->'channel_values' ? %s) "
            "and not exists (select 1 from checkpoint_blobs b where b.thread_id = c.thread_id "
            "  and b.checkpoint_ns = c.checkpoint_ns and b.channel = %s "
            "  and b.version = c.checkpoint->'channel_versions'->>%s)",
            (channel, thread_id, channel, channel, channel, channel)).fetchall()


def payload_multiset(dsn: str, thread_id: str) -> dict[str, list]:
    """(channel, type, payload bytes) of every pending write and blob of the
    thread, sorted: ids, task ids and versions differ between runs, the bytes
    of what was stored must not."""
    with psycopg.connect(dsn, autocommit=True) as c:
        writes = sorted((ch, t, bytes(b or b"")) for ch, t, b in c.execute(
            "select channel, type, blob from checkpoint_writes where thread_id = %s", (thread_id,)))
        blobs = sorted((ch, t, bytes(b or b"")) for ch, t, b in c.execute(
            "select channel, type, blob from checkpoint_blobs where thread_id = %s", (thread_id,)))
        inline = sorted(json.dumps(v, sort_keys=True) for (v,) in c.execute(
            "select checkpoint->'channel_values' from checkpoints where thread_id = %s", (thread_id,)))
    return {"writes": writes, "blobs": blobs, "checkpoint_values": inline}


def invalid_items(rows: dict[str, list]) -> list:
    """Stored values of a list[str] channel that are not lists of strings
    (pending writes of operator.add are lists too)."""
    bad = []
    for where, values in rows.items():
        for v in values:
            if v == "<empty>":
                continue
            if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                bad.append((where, v))
    return bad


# ----------------------------------------------------------------- numbers past f64
class CountState(TypedDict):
    count: int
    name: Any


def build_count_graph(checkpointer, returns: dict):
    """START -> set -> END: ``set`` returns ``returns`` (e.g. a str for the int
    ``count`` beside ``name = 10**400``). Both are primitives, so the saver
    stores them inline in the checkpoint JSON, where ``json.dumps`` writes the
    big int as its 401 digits."""

    def set_(state: CountState) -> dict:
        return dict(returns)

    return L.chain(CountState, ("set", set_)).compile(checkpointer=checkpointer)
