"""The README's quickstart, run as it is written: its `python …` and `node …`
commands run the programs in examples/ through a proxy the fixtures start, with
DATABASE_URL pointing at it, and print what the README shows. The `pip install`
and `npm install` lines it shows are checked against the versions this suite
installs (integration/requirements.txt, integration/js/package.json), whose
environments the programs then run in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_audit_cli

README = REPO / "README.md"
VENV_BIN = REPO / ".venv" / "bin"
JS_MODULES = REPO / "integration" / "js" / "node_modules"


def quickstart() -> str:
    text = README.read_text()
    return text[text.index("## Quickstart"):text.index("\n## ", text.index("## Quickstart") + 1)]


def blocks(lang: str) -> list[list[str]]:
    return [b.strip("\n").splitlines()
            for b in re.findall(rf"```{lang}\n(.*?)```", quickstart(), re.S)]


def command(lines: list[str], start: str) -> str:
    """The README line beginning `start`, without its trailing comment."""
    [line] = [ln for ln in lines if ln.startswith(start)]
    return line.split("  #", 1)[0].strip()


def shown_output() -> list[str]:
    [out] = blocks("text")
    return out


def run_shell(cmd: str, cwd: Path, dsn: str) -> list[str]:
    env = dict(os.environ, DATABASE_URL=dsn, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    cp = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, f"{cmd!r} exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return cp.stdout.splitlines()


@pytest.fixture(scope="module")
def quick(proxy_factory, dbname):
    """One proxy and one database for both programs, as a user following the README
    has: the Python one, then the JS one (thread order-43) beside it."""
    p = proxy_factory(name="examples")
    return p, p.dsn(dbname)


def pins(requirements: Path) -> dict[str, str]:
    out = {}
    for line in requirements.read_text().splitlines():
        if m := re.match(r"([\w.-]+)(?:\[[\w,]+\])?==([\w.]+)", line.strip()):
            out[m.group(1)] = m.group(2)
    return out


def test_pip_line_pins_what_the_suite_runs():
    [sh] = [b for b in blocks("sh") if any(ln.startswith("pip install") for ln in b)]
    line = command(sh, "pip install")
    want = pins(REPO / "integration" / "requirements.txt")
    shown = dict(re.findall(r"\"?([\w.-]+)(?:\[[\w,]+\])?==([\w.]+)\"?", line))
    assert shown and all(want.get(k) == v for k, v in shown.items()), (shown, want)
    assert {"langgraph", "langgraph-checkpoint-postgres", "psycopg"} <= set(shown)


def test_js_example_pins_what_the_suite_runs():
    mine = json.loads((REPO / "examples" / "js" / "package.json").read_text())["dependencies"]
    suite = json.loads((REPO / "integration" / "js" / "package.json").read_text())["dependencies"]
    assert mine and all(suite.get(k) == v for k, v in mine.items()), (mine, suite)
    [sh] = [b for b in blocks("sh") if any("npm install" in ln for ln in b)]
    comment = [ln for ln in sh if "npm install" in ln][0]
    for name in ("@langchain/langgraph", "langgraph-checkpoint-postgres", "pg"):
        version = mine[name if name.startswith("@") or name == "pg" else
                       "@langchain/" + name]
        assert f"{version}" in comment, (name, version, comment)


def test_python_quickstart_runs_as_written(quick):
    p, dsn = quick
    [sh] = [b for b in blocks("sh") if any(ln.startswith("python ") for ln in b)]
    out = run_shell(command(sh, "python "), REPO, dsn)
    assert out == shown_output(), out
    evs = run_audit_cli(p.audit_db, "order-42")
    ops = [e["operation"] for e in evs]
    assert "interrupt_parked" in ops and "claim_consumed" in ops, ops
    text = subprocess.run([str(p.argv[0]), "audit", "--audit-db", str(p.audit_db), "--thread",
                           "order-42"], capture_output=True, text=True, timeout=30).stdout
    assert re.search(r"answer recorded \(sha256 \w+.*\), by user_id=alice", text), text


@pytest.mark.skipif(not JS_MODULES.exists(), reason="integration/js/node_modules not installed")
def test_js_quickstart_runs_as_written(quick, tmp_path):
    p, dsn = quick
    [sh] = [b for b in blocks("sh") if any(ln.startswith("node ") for ln in b)]
    cd = command(sh, "cd ").split("&&")[0].strip()
    assert cd == "cd examples/js", cd
    # what `npm install` gives there: the suite's node_modules, of the same versions
    for f in ("quickstart.mjs", "package.json"):
        shutil.copy(REPO / "examples" / "js" / f, tmp_path / f)
    (tmp_path / "node_modules").symlink_to(JS_MODULES)
    out = run_shell(command(sh, "node "), tmp_path, dsn)
    assert out == [line.replace("order-42", "order-43") for line in shown_output()], out
    ops = [e["operation"] for e in run_audit_cli(p.audit_db, "order-43")]
    assert "interrupt_parked" in ops and "claim_consumed" in ops, ops
