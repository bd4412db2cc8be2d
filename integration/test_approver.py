"""Who answered an interrupt, as the application says it: real LangGraph
copies the run's configurable keys (a ``user_id``) into the metadata of the
checkpoints it saves, and the audit trail names that person on the answer
(``resume_recorded``) and on the claim it consumed (``claim_consumed``) — not
just the connection. ``update_state`` writes are labelled as such. Keys that
are not ``[audit] approver_keys`` never reach the trail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

import lg_scenarios as L
from conftest import connect, proxy_binary

pytestmark = pytest.mark.timeout(300)

SECRET = "not-an-approver-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def lg_db(pg):
    name = f"rg_approver_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    L.setup_db("conn", pg.dsn(name))
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cfg(thread: str, user: str) -> dict:
    return {"configurable": {"thread_id": thread, "user_id": user, "session_token": SECRET}}


def park_resume_update(dsn: str, thread: str) -> None:
    """bob starts the run and it parks; alice answers from another
    connection; carol edits the finished state by hand."""
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = L.build_graph(saver)
        graph.invoke(dict(L.INITIAL_INPUT), cfg(thread, "bob"))
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = L.build_graph(saver)
        out = graph.invoke(Command(resume=True), cfg(thread, "alice"))
        assert out["approved"] is True
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = L.build_graph(saver)
        graph.update_state(cfg(thread, "carol"), {"name": "edited"})


def audit_cli(proxy, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(proxy_binary()), "audit", "--audit-db", str(proxy.audit_db), *args],
                          capture_output=True, text=True, timeout=30)


def test_langgraph_writes_the_run_config_into_checkpoint_metadata(pg, lg_db):
    """What the proxy relies on, straight to PostgreSQL: the answered
    checkpoint's child carries the resumer's user_id, the parked one the
    starter's, and update_state's checkpoint says source=update."""
    thread = f"meta-{uuid.uuid4().hex[:8]}"
    park_resume_update(pg.dsn(lg_db), thread)
    with connect(pg.dsn(lg_db)) as c:
        rows = c.execute(
            "SELECT metadata FROM checkpoints WHERE thread_id = %s ORDER BY checkpoint_id",
            (thread,)).fetchall()
    metas = [r[0] for r in rows]
    assert [m["source"] for m in metas] == ["input", "loop", "loop", "loop", "loop", "update"], metas
    assert [m["user_id"] for m in metas] == ["bob", "bob", "bob", "alice", "alice", "carol"], metas
    assert all(m["session_token"] == SECRET for m in metas)


def test_the_answer_and_its_claim_name_the_approver(proxy, lg_db):
    thread = f"approver-{uuid.uuid4().hex[:8]}"
    park_resume_update(proxy.dsn(lg_db), thread)
    # The trail is written asynchronously: wait for the last records.
    deadline = time.monotonic() + 10
    while True:
        events = proxy.audit(thread)
        ops = [e["operation"] for e in events]
        done = "claim_consumed" in ops and ops.count("checkpoint_put") == 6
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def one(op: str) -> dict:
        found = [e for e in events if e["operation"] == op]
        assert len(found) == 1, (op, [e["operation"] for e in events])
        return found[0]

    # The run-level answer and the gated task's own record of it.
    answers = [e for e in events if e["operation"] == "resume_recorded"]
    assert answers, [e["operation"] for e in events]
    assert [a["detail"].get("approver") for a in answers] == [{"user_id": "alice"}] * len(answers), answers
    answer = answers[0]
    consumed = one("claim_consumed")
    assert consumed["detail"]["approver"] == {"user_id": "alice"}, consumed
    # The parked checkpoint was saved by bob's run.
    parked = one("interrupt_parked")
    parked_put = [e for e in events if e["operation"] == "checkpoint_put"
                  and e["checkpoint_id"] == parked["checkpoint_id"]]
    assert [p["detail"]["approver"] for p in parked_put] == [{"user_id": "bob"}]
    assert answer["detail"]["approver_from"] in {
        e["checkpoint_id"] for e in events
        if e["operation"] == "checkpoint_put" and e["parent_checkpoint_id"] == parked["checkpoint_id"]}

    updates = [e for e in events if e["operation"] == "checkpoint_put"
               and e["detail"].get("source") == "update"]
    assert len(updates) == 1, events
    assert updates[0]["detail"]["approver"] == {"user_id": "carol"}
    assert {e["detail"].get("source") for e in events if e["operation"] == "checkpoint_put"} \
        == {"input", "loop", "update"}

    text = audit_cli(proxy, "--thread", thread)
    assert text.returncode == 0, text.stderr
    assert "answer recorded (sha256 " in text.stdout and ", by user_id=alice" in text.stdout, text.stdout
    assert "claim consumed: resume completed, by user_id=alice" in text.stdout, text.stdout
    assert "state updated by hand (update_state)" in text.stdout, text.stdout

    # Only the approver keys are kept: the other configurable value is in
    # the checkpoint's metadata, never in either audit output.
    assert SECRET not in json.dumps(events)
    assert SECRET not in proxy.audit_jsonl.read_text()
    assert SECRET.encode() not in proxy.audit_db.read_bytes()


# --------------------------------------------------------------------------- the answer names its approver
JS_DIR = Path(__file__).resolve().parent / "js"
NODE = os.environ.get("RG_NODE") or shutil.which("node")


@pytest.fixture(scope="module")
def pointer_proxy(proxy_factory, workdir):
    conf = workdir / f"approver-pointers-{uuid.uuid4().hex[:6]}.toml"
    conf.write_text('[audit]\napprover_pointers = ["/approver", "/by"]\n')
    return proxy_factory("--config", str(conf), name="proxy-approver-pointers")


def answers_of(proxy, thread: str) -> list[dict]:
    deadline = time.monotonic() + 10
    while True:
        events = proxy.audit(thread)
        answers = [e for e in events if e["operation"] == "resume_recorded"]
        if answers or time.monotonic() > deadline:
            return answers
        time.sleep(0.2)


@pytest.mark.parametrize("form", ["bare", "map"])
def test_a_python_answer_names_its_approver_by_a_pointer_into_the_resume_value(
        pointer_proxy, lg_db, form):
    thread = f"pointer-py-{form}-{uuid.uuid4().hex[:8]}"
    dsn = pointer_proxy.dsn(lg_db)
    value = {"approved": True, "by": "alice"}
    config = {"configurable": {"thread_id": thread}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = L.build_graph(saver)
        graph.invoke(dict(L.INITIAL_INPUT), config)
        iid = graph.get_state(config).interrupts[0].id
        resume = value if form == "bare" else {iid: value}
        graph.invoke(Command(resume=resume), config)
    answers = answers_of(pointer_proxy, thread)
    assert answers, thread
    assert {json.dumps(a["detail"].get("approver")) for a in answers} \
        == {json.dumps({"resume/by": "alice"})}, answers
    text = audit_cli(pointer_proxy, "--thread", thread)
    assert ", by resume/by=alice" in text.stdout, text.stdout


@pytest.mark.skipif(NODE is None, reason="!!! node is not installed: the LangGraph.js "
                    "approver is NOT tested !!!")
@pytest.mark.parametrize("form", ["bare", "map"])
def test_a_js_answer_names_its_approver_by_a_pointer_into_the_resume_value(
        pointer_proxy, pg, lg_db, form):
    """LangGraph.js copies no configuration into checkpoint metadata: the answer's
    own value is the only place its approver can be named."""
    def lg(*args: str) -> dict:
        cp = subprocess.run([NODE, str(JS_DIR / "lg.mjs"), *args], cwd=JS_DIR,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr[-3000:]
        return json.loads(cp.stdout.strip().splitlines()[-1])

    lg("setup", "--dsn", pg.dsn(lg_db))
    thread = f"pointer-js-{form}-{uuid.uuid4().hex[:8]}"
    dsn = pointer_proxy.dsn(lg_db)
    parked = lg("park", "--dsn", dsn, "--thread", thread)
    args = ["resume", "--dsn", dsn, "--thread", thread, "--form", form,
            "--value", json.dumps({"approved": True, "approver": "dana"})]
    if form == "map":
        args += ["--interrupt-id", parked["interrupts"][0]["id"]]
    done = lg(*args)
    assert done["ok"], done
    answers = answers_of(pointer_proxy, thread)
    assert answers, thread
    assert {json.dumps(a["detail"].get("approver")) for a in answers} \
        == {json.dumps({"resume/approver": "dana"})}, answers
