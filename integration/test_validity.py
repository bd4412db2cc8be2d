"""Checkpoint validity gate (LangGraph #6491 class), end to end with real
LangGraph, each next to its stock differential in the same test: the same
scenario against PostgreSQL directly persists the invalid value, through the
proxy (``serve --rules DIR``) the write is refused with SQLSTATE 23514 and
nothing of it is durable.

Rules (written by the ``rules_dir`` fixture into a temp dir, next to copies of
the shipped saver profiles):
  * ``channels/items.toml``: a hand-written ``[[channel]]`` rule, ``items`` is an
    array of strings, for threads ``vt-…`` (the TypedDict graph);
  * ``channels/pyd-state.toml``: a ``[[state]]`` import of the pydantic graph's
    own ``get_input_jsonschema()``, for threads ``vp-…``.
Other threads are not selected by any rule.

Graphs (lg_enforce): TypedDict ``START -> append -> END`` and pydantic
``START -> append -> check -> END``; ``append`` adds ``[pending]`` to
``items: list[str]`` (and writes ``note`` in the same task), so input
``{"pending": None}`` or ``{"pending": 7}`` is the application bug.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pydantic
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

import lg_enforce as E
from conftest import HOST, REPO, free_port, port_accepts, proxy_binary

# The integration core, run per PostgreSQL major by full_matrix.sh (RG_CO_STACKS=versions).
pytestmark = pytest.mark.core

ITEMS_RULE = """\
[[channel]]
name = "items"
thread_id = "vt-.*"
schema = { type = "array", items = { type = "string" } }
"""
STATE_RULE = """\
[[state]]
file = "pyd-state.schema.json"
thread_id = "vp-.*"
"""
RULE_FILE = {"typeddict": "items.toml", "pydantic": "pyd-state.toml"}
PREFIX = {"typeddict": "vt", "pydantic": "vp"}
BAD_VALUES = {"none": None, "int": 7}


def write_rules_dir(root: Path, channel_files: dict[str, str]) -> Path:
    """A rules dir: the shipped saver profiles plus ``channels/<name>`` files."""
    (root / "channels").mkdir(parents=True, exist_ok=True)
    for profile in (REPO / "rules").glob("*.toml"):
        shutil.copy(profile, root / profile.name)
    for name, text in channel_files.items():
        (root / "channels" / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def rules_dir(workdir) -> Path:
    root = workdir / f"validity-rules-{uuid.uuid4().hex[:6]}"
    schema = E.state_jsonschema("pydantic")
    # the import is what the user's code states: items is a list of strings
    assert schema["properties"]["items"]["items"] == {"type": "string"}, schema
    return write_rules_dir(root, {
        "items.toml": ITEMS_RULE,
        "pyd-state.toml": STATE_RULE,
        "pyd-state.schema.json": json.dumps(schema, indent=1),
    })


@pytest.fixture(scope="module")
def vproxy(proxy_factory, rules_dir):
    return proxy_factory("--rules", str(rules_dir), name="proxy-validity")


@pytest.fixture(scope="module")
def vproxy_dsn(vproxy, dbname) -> str:
    return vproxy.dsn(dbname)


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    E.setup_db(direct_dsn)


def tid(state_kind: str, tag: str) -> str:
    return f"{PREFIX[state_kind]}-{tag}-{uuid.uuid4().hex[:8]}"


def audit_events(proxy, thread_id: str, want, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        events = proxy.audit(thread_id)
        if want(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def bad_durability(state_kind: str) -> str | None:
    # Pydantic graph: with the default (async) durability the pending write goes
    # to a background executor while the next node already validates the state,
    # and LangGraph raises that node's ValidationError in preference to the
    # write's error (see test_pydantic_default_durability_...). "sync" orders the
    # write before the next step, so the proxy's error is what invoke raises.
    return "sync" if state_kind == "pydantic" else None


def invoke(graph, inp, cfg, durability=None):
    if durability is None:
        return graph.invoke(inp, cfg)
    return graph.invoke(inp, cfg, durability=durability)


# --------------------------------------------------------------------------- 1. invalid append
@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
@pytest.mark.parametrize("state_kind", ("typeddict", "pydantic"))
def test_invalid_append_is_rejected_before_it_is_durable(direct_dsn, vproxy_dsn, state_kind, bad):
    value = BAD_VALUES[bad]
    build = E.GRAPHS[state_kind]
    dur = bad_durability(state_kind)

    # ---- stock: the invalid value is durable
    stock_thread = tid(state_kind, f"stock-{bad}")
    cfg = E.cfg_of(stock_thread)
    with PostgresSaver.from_conn_string(direct_dsn) as saver:
        g = build(saver)
        assert g.invoke({"pending": "a"}, cfg)["items"] == ["a"]
        if state_kind == "typeddict":
            out = invoke(g, {"pending": value}, cfg, dur)          # silently accepted
            assert out["items"] == ["a", value]
            assert g.get_state(cfg).values["items"] == ["a", value]
            # and it stays: later valid runs carry the corrupt value along
            assert g.invoke({"pending": "b"}, cfg)["items"] == ["a", value, "b"]
        else:
            with pytest.raises(pydantic.ValidationError):         # raised at the next node
                invoke(g, {"pending": value}, cfg, dur)
            with pytest.raises(pydantic.ValidationError):         # the thread is unreadable
                g.get_state(cfg)
            with pytest.raises(pydantic.ValidationError):
                list(g.get_state_history(cfg))
    stock_rows = E.channel_rows(direct_dsn, stock_thread, "items")
    assert ("writes", [value]) in E.invalid_items(stock_rows), stock_rows
    assert any(w == "blobs" for w, _ in E.invalid_items(stock_rows)), stock_rows
    assert f"appended {value!r}" in E.channel_rows(direct_dsn, stock_thread, "note")["writes"]

    # ---- proxy: invoke raises the proxy's 23514, nothing of it is durable
    thread = tid(state_kind, f"proxy-{bad}")
    cfg = E.cfg_of(thread)
    with PostgresSaver.from_conn_string(vproxy_dsn) as saver:
        g = build(saver)
        assert g.invoke({"pending": "a"}, cfg)["items"] == ["a"]
        with pytest.raises(psycopg.errors.CheckViolation) as ei:
            invoke(g, {"pending": value}, cfg, dur)
        err = ei.value
        assert err.sqlstate == "23514"
        msg = str(err)
        assert 'channel "items"' in msg, msg
        assert f'thread "{thread}"' in msg, msg
        assert "schema path /items/type" in msg, msg
        assert re.search(rf"{re.escape(RULE_FILE[state_kind])}:\d+", msg), msg
        # (that the message also names the checkpoint: test_every_rejection_names_its_checkpoint)

        rows = E.channel_rows(direct_dsn, thread, "items")
        assert E.invalid_items(rows) == [], f"invalid value durable through the proxy: {rows}"
        assert rows["writes"] == [["a"]] and rows["blobs"] == [["a"]], rows
        # nothing of the rejected Sync segment committed: not the task's other write either
        notes = E.channel_rows(direct_dsn, thread, "note")
        assert f"appended {value!r}" not in notes["writes"] + notes["blobs"] + notes["inline"], notes
        # no checkpoint committed without its blob
        assert E.dangling_versions(direct_dsn, thread, "items") == []

        # the thread stays readable
        st = g.get_state(cfg)
        assert st.values["items"] == ["a"], st.values
        hist = list(g.get_state_history(cfg))
        assert hist and all(h.values.get("items") in (None, [], ["a"]) for h in hist), \
            [h.values for h in hist]
        # the application fixes its input: the thread continues
        out = g.invoke({"pending": "b"}, cfg)
        assert out["items"] == ["a", "b"], out
        final = g.get_state(cfg)
        assert final.values["items"] == ["a", "b"] and final.next == ()
        assert len(list(g.get_state_history(cfg))) > len(hist)
    assert E.invalid_items(E.channel_rows(direct_dsn, thread, "items")) == []


def test_pydantic_default_durability_next_node_error_surfaces_first(direct_dsn, vproxy_dsn, vproxy):
    """Default (async) durability, pydantic state: the proxy rejects the pending
    write (audited), but LangGraph surfaces the next node's own ValidationError
    from invoke. Storage stays clean and the thread readable either way."""
    dsn = vproxy_dsn
    thread = tid("pydantic", "async")
    cfg = E.cfg_of(thread)
    with PostgresSaver.from_conn_string(dsn) as saver:
        g = E.build_pyd_graph(saver)
        g.invoke({"pending": "a"}, cfg)
        with pytest.raises((psycopg.errors.CheckViolation, pydantic.ValidationError)):
            g.invoke({"pending": None}, cfg)
        assert E.invalid_items(E.channel_rows(direct_dsn, thread, "items")) == []
        assert g.get_state(cfg).values["items"] == ["a"]
        assert g.invoke({"pending": "b"}, cfg)["items"] == ["a", "b"]
    events = audit_events(vproxy, thread, lambda evs: any(e["operation"] == "write_rejected"
                                                          for e in evs))
    assert any(e["operation"] == "write_rejected" for e in events), \
        [e["operation"] for e in events]


@pytest.mark.parametrize("kind", E.SAVER_KINDS)
def test_rejection_with_each_saver(direct_dsn, vproxy_dsn, kind):
    """The same repair for the three saver constructions (TypedDict, None)."""
    results = {}
    for via, dsn in (("direct", direct_dsn), ("proxy", vproxy_dsn)):
        thread = tid("typeddict", f"{kind}-{via}")
        cfg = E.cfg_of(thread)
        with E.Driver(kind, dsn) as d:
            g = E.build_items_graph(d.saver)
            d.invoke(g, {"pending": "a"}, cfg)
            try:
                d.invoke(g, {"pending": None}, cfg)
                raised = None
            except psycopg.errors.CheckViolation as e:
                raised = e
            values = dict(d.get_state(g, cfg).values)
            fixed = d.invoke(g, {"pending": "b"}, cfg)["items"]
        results[via] = (raised, values, fixed, E.invalid_items(E.channel_rows(direct_dsn, thread, "items")))
    raised, values, fixed, bad_rows = results["direct"]
    assert raised is None and values["items"] == ["a", None] and fixed == ["a", None, "b"]
    assert bad_rows, "stock should have stored the None"
    raised, values, fixed, bad_rows = results["proxy"]
    assert raised is not None and raised.sqlstate == "23514", f"{kind}: no CheckViolation"
    assert 'channel "items"' in str(raised) and "schema path /items/type" in str(raised)
    assert values["items"] == ["a"] and fixed == ["a", "b"]
    assert bad_rows == [], bad_rows


# --------------------------------------------------------------------------- 2. selection
def test_unselected_thread_passes_unchecked(direct_dsn, vproxy_dsn):
    """Rules select by thread prefix: another thread through the same proxy is
    stored exactly as stock stores it."""
    thread = f"other-{uuid.uuid4().hex[:8]}"
    cfg = E.cfg_of(thread)
    with PostgresSaver.from_conn_string(vproxy_dsn) as saver:
        g = E.build_items_graph(saver)
        g.invoke({"pending": "a"}, cfg)
        assert g.invoke({"pending": None}, cfg)["items"] == ["a", None]
    assert ("writes", [None]) in E.invalid_items(E.channel_rows(direct_dsn, thread, "items"))


# --------------------------------------------------------------------------- 3. valid runs
@pytest.mark.parametrize("state_kind", ("typeddict", "pydantic"))
def test_valid_run_with_schemas_is_identical_to_stock(direct_dsn, vproxy_dsn, vproxy, state_kind):
    inputs = ["a", "b", "c"]

    def run(dsn: str, thread: str) -> dict:
        cfg = E.cfg_of(thread)
        out = {"results": []}
        with PostgresSaver.from_conn_string(dsn) as saver:
            g = E.GRAPHS[state_kind](saver)
            for x in inputs:
                out["results"].append(dict(g.invoke({"pending": x}, cfg)))
            st = g.get_state(cfg)
            out["values"] = dict(st.values)
            out["next"] = list(st.next)
            hist = list(g.get_state_history(cfg))
            out["history"] = [(dict(h.values), list(h.next), h.metadata.get("step"),
                               h.metadata.get("source")) for h in hist]
        out["stored"] = E.payload_multiset(direct_dsn, thread)
        return out

    stock = run(direct_dsn, tid(state_kind, "valid-d"))
    thread = tid(state_kind, "valid-p")
    res = run(vproxy_dsn, thread)
    assert stock["values"]["items"] == inputs
    for key in ("results", "values", "next", "history"):
        assert res[key] == stock[key], f"{key} differs from stock"
    assert len(res["history"]) == len(stock["history"])
    # the stored payloads are byte-identical (ids and versions aside)
    for key in ("writes", "blobs", "checkpoint_values"):
        assert res["stored"][key] == stock["stored"][key], f"stored {key} differ from stock"
    events = vproxy.audit(thread)
    assert not [e for e in events if e["operation"] == "write_rejected"], "valid run was rejected"


# --------------------------------------------------------------------------- 4. audit
@pytest.mark.parametrize("state_kind", ("typeddict", "pydantic"))
def test_write_rejected_audit_event(vproxy_dsn, vproxy, rules_dir, state_kind):
    thread = tid(state_kind, "audit")
    cfg = E.cfg_of(thread)
    with PostgresSaver.from_conn_string(vproxy_dsn) as saver:
        g = E.GRAPHS[state_kind](saver)
        g.invoke({"pending": "a"}, cfg)
        with pytest.raises(psycopg.errors.CheckViolation):
            invoke(g, {"pending": None}, cfg, bad_durability(state_kind))
    events = audit_events(vproxy, thread, lambda evs: any(e["operation"] == "write_rejected"
                                                          for e in evs))
    rejected = [e for e in events if e["operation"] == "write_rejected"]
    assert rejected, [e["operation"] for e in events]
    rule_path = str(rules_dir / "channels" / RULE_FILE[state_kind])
    for ev in rejected:
        assert ev["thread_id"] == thread
        assert ev["channels"] == ["items"], ev
        d = ev["detail"]
        assert d["rule"].startswith(rule_path + ":"), d
        assert re.fullmatch(r"\d+", d["rule"].rsplit(":", 1)[1]), d
        assert d["schema_path"] == "/items/type", d
        assert f'thread "{thread}"' in d["reason"] and 'channel "items"' in d["reason"], d
    # the append task's pending write is refused, on a known checkpoint (LangGraph may
    # send the next checkpoint's put before or after it, so it need not come first)
    writes = [e for e in rejected if e["task_id"]]
    assert writes, rejected
    assert all(e["checkpoint_id"] for e in writes), writes
    assert writes[0]["detail"]["instance_path"] == "/0", writes[0]


UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.mark.parametrize("state_kind", ("typeddict", "pydantic"))
def test_every_rejection_names_its_checkpoint(vproxy_dsn, vproxy, state_kind):
    """The 23514 message names the channel, thread, *checkpoint* and
    schema path. With durability="sync" the rejection invoke raises is the
    checkpoint put's (its blob of ``items``); every write_rejected event and
    the client's message must name the checkpoint being written by its id."""
    thread = tid(state_kind, "names-cp")
    cfg = E.cfg_of(thread)
    with PostgresSaver.from_conn_string(vproxy_dsn) as saver:
        g = E.GRAPHS[state_kind](saver)
        g.invoke({"pending": "a"}, cfg)
        with pytest.raises(psycopg.errors.CheckViolation) as ei:
            g.invoke({"pending": None}, cfg, durability="sync")
    events = audit_events(vproxy, thread, lambda evs: sum(e["operation"] == "write_rejected"
                                                          for e in evs) >= 2)
    rejected = [e for e in events if e["operation"] == "write_rejected"]
    summary = "\n".join(f"  cp={e['checkpoint_id']} reason={e['detail']['reason']}" for e in rejected)
    assert rejected, [e["operation"] for e in events]
    unnamed = [e for e in rejected
               if not e["checkpoint_id"] or not re.search(rf"checkpoint {UUID}", e["detail"]["reason"])]
    assert not unnamed, f"rejections that do not name their checkpoint:\n{summary}"
    assert re.search(rf"checkpoint {UUID}", str(ei.value)), str(ei.value)


# --------------------------------------------------------------------------- 5. rule-file errors
BAD_RULES = {
    # name: (file text, line the error is on, a phrase of the message)
    "bad_json_schema": ('# a rule with an invalid schema\n[[channel]]\nname = "items"\n'
                        'schema = { type = "arrayy" }\n', 4, "invalid JSON Schema"),
    "unknown_key": ('[[channel]]\nname = "items"\nschema = { type = "array" }\n\n'
                    '[[channel]]\nname = "count"\nshcema = { type = "integer" }\n', 7,
                    "unknown field `shcema`"),
    "bad_toml": ('[[channel]]\nname = "items"\nschema = { type = "array"\n', 3, ""),
}


def rules_check(dir_: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "rules", "check", str(dir_)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("case", sorted(BAD_RULES))
def test_bad_rule_file_refuses_start(pg, tmp_path, case):
    text, line, phrase = BAD_RULES[case]
    rules = write_rules_dir(tmp_path / "rules", {"bad.toml": text})
    where = f"{rules / 'channels' / 'bad.toml'}:{line}:"

    cp = rules_check(rules)
    assert cp.returncode == 1, f"rules check exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    assert where in cp.stderr, f"expected {where!r} in:\n{cp.stderr}"
    assert phrase in cp.stderr, cp.stderr

    port = free_port()
    argv = [str(proxy_binary()), "serve", "--listen", f"{HOST}:{port}",
            "--upstream", f"{HOST}:{pg.port}", "--rules", str(rules),
            "--audit-db", str(tmp_path / "audit.sqlite")]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        listening = port_accepts(port)
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail(f"serve with a bad rule kept running (listening={listening})")
    elapsed = time.monotonic() - started
    assert proc.returncode != 0, f"serve exited 0 with a bad rule\n{out}\n{err}"
    assert elapsed < 10, f"serve took {elapsed:.1f}s to refuse"
    assert where in err, f"expected {where!r} in serve's stderr:\n{err}"
    assert phrase in err, err
    assert "DATABASE_URL=" not in out, out
    assert not port_accepts(port), "something listens on the port serve was given"


def test_rules_check_good_dir_lists_rules(rules_dir):
    cp = rules_check(rules_dir)
    assert cp.returncode == 0, f"rules check exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    lines = cp.stdout.splitlines()
    items_rule = [l for l in lines if l.startswith(f"{rules_dir / 'channels' / 'items.toml'}:1 ")]
    assert len(items_rule) == 1, cp.stdout
    assert 'channel "items"' in items_rule[0] and "vt-.*" in items_rule[0], items_rule
    derived = [l for l in lines if l.startswith(f"{rules_dir / 'channels' / 'pyd-state.toml'}:1 ")]
    names = sorted(re.search(r'channel "([^"]+)"', l).group(1) for l in derived)
    assert names == sorted(E.state_jsonschema("pydantic")["properties"]), cp.stdout
    assert all("vp-.*" in l for l in derived), derived
