"""Prints, as a Markdown table, the saver stacks the integration suite runs
against: the packages installed in .venv (LangGraph Python, saver 3.x),
.venv-lg2 (saver 2.0.25) and .venv-lg208 (saver 2.0.8), the LangGraph.js packages pinned by
integration/js/package-lock.json, and the PostgreSQL servers: the one in $PG_BIN (the
whole suite) and those pinned by integration/pg-versions/package-lock.json (the core,
test_pg_versions.py).
integration/run_all.sh writes its output to
integration/results/supported-versions.md after a passing run.

Reads the venvs' installed metadata directly (no interpreter of theirs is
run), so it works from any Python 3.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY_PACKAGES = ("langgraph", "langgraph-checkpoint-postgres", "langgraph-checkpoint", "psycopg")
JS_PACKAGES = ("@langchain/langgraph", "@langchain/langgraph-checkpoint-postgres", "pg")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def venv_versions(venv: Path) -> dict[str, str]:
    """Installed distribution versions of ``venv``, by normalized name."""
    found: dict[str, str] = {}
    for meta in venv.glob("lib/python*/site-packages/*.dist-info/METADATA"):
        name = version = None
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Name: "):
                name = line[6:].strip()
            elif line.startswith("Version: "):
                version = line[9:].strip()
            elif not line:
                break
        if name and version:
            found[_normalized(name)] = version
    return found


def venv_python(venv: Path) -> str:
    cfg = venv / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return value.strip()
    return "?"


def js_versions(lock: Path) -> dict[str, str]:
    packages = json.loads(lock.read_text()).get("packages", {})
    return {name: packages.get(f"node_modules/{name}", {}).get("version", "?")
            for name in JS_PACKAGES}


def postgres_version() -> str:
    exe = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")) / "postgres"
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "?"
    m = re.search(r"(\d+(?:\.\d+)+)", out)
    return m.group(1) if m else "?"


def matrix_versions(lock: Path) -> list[str]:
    """The server versions of integration/pg-versions (13.23, 14.23, …)."""
    if not lock.exists():
        return []
    packages = json.loads(lock.read_text()).get("packages", {})
    found = []
    for name, meta in sorted(packages.items()):
        m = re.fullmatch(r"node_modules/pg(\d+)", name)
        v = re.match(r"(\d+\.\d+)", meta.get("version", ""))
        if m and v:
            found.append((int(m.group(1)), v.group(1)))
    return [v for _, v in sorted(found)]


def servers(core: bool) -> str:
    """The PostgreSQL column: the suite's server, and for the stacks the core runs
    with, the version matrix's."""
    suite = f"{postgres_version()} (all tests)"
    matrix = matrix_versions(ROOT / "integration/pg-versions/package-lock.json")
    if core and matrix:
        return f"{suite}; {', '.join(matrix)} (`test_pg_versions.py`)"
    return suite


def node_version() -> str:
    try:
        return subprocess.run(["node", "-v"], capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except OSError:
        return "not installed"


def python_row(label: str, venv: Path, tests: str, core: bool = False) -> str:
    v = venv_versions(venv)
    if not v:
        return f"| {label} | not installed (`{venv.name}`) | | | | | | {tests} |"
    get = lambda name: v.get(_normalized(name), "?")  # noqa: E731
    return (f"| {label} | `{venv.name}` | {get('langgraph-checkpoint-postgres')} | {get('langgraph')} "
            f"(checkpoint {get('langgraph-checkpoint')}) | psycopg {get('psycopg')} | "
            f"Python {venv_python(venv)} | {servers(core)} | {tests} |")


def table() -> str:
    lock = ROOT / "integration/js/package-lock.json"
    js = js_versions(lock) if lock.exists() else {}
    rows = [
        "| saver | installed in | saver version | langgraph | driver | runtime | PostgreSQL | tests |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        python_row("Python `langgraph-checkpoint-postgres` 3.x", ROOT / ".venv",
                   "the pytest suite runs in it", core=True),
        python_row("Python `langgraph-checkpoint-postgres` 2.0.x", ROOT / ".venv-lg2",
                   "`test_py2_saver.py`; its own tests: `test_saver_suites.py`"),
        python_row("Python `langgraph-checkpoint-postgres` 2.0.x", ROOT / ".venv-lg208",
                   "`test_py2_saver.py`"),
    ]
    if js:
        rows.append(
            f"| JS `@langchain/langgraph-checkpoint-postgres` | `integration/js` (package-lock.json) | "
            f"{js['@langchain/langgraph-checkpoint-postgres']} | {js['@langchain/langgraph']} | "
            f"pg {js['pg']} | Node {node_version()} | {servers(True)} | `test_js_saver.py` |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
