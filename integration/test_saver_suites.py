"""The savers' own conformance suites, each run straight to PostgreSQL and through
the proxy under ``[enforce] unknown_saver = "refuse"``, compared test by test.

* Python: the tests shipped in ``langgraph-checkpoint-postgres`` 3.2.0's sdist (the
  pinned saver; fetched with pip by hash, integration/saver-suites.txt), its checkpoint
  tests: ``PostgresSaver``/``AsyncPostgresSaver`` over a connection, a pool and a
  pipeline, ``ShallowPostgresSaver``/``AsyncShallowPostgresSaver``, ``prune()`` (both
  strategies, its races), the delta-channel history walk, and the conformance library
  (``langgraph-checkpoint-conformance``). The suite's ``postgres://…:5441/`` URIs are
  pointed at the proxy (or the server); its cleanup fixture (``DELETE FROM
  checkpoints`` without a WHERE, the harness's own, no saver's) always goes straight
  to the server. Left out: the store tests (``test_store.py``, ``test_async_store.py``:
  no checkpoint traffic, and 124 of their 299 need pgvector), and, on both sides, by
  name, ``test_delta_channel_conformance`` (needs a conformance release newer than
  PyPI's 0.0.2).
* JS: ``@langchain/langgraph-checkpoint-validation`` 1.1.1 (integration/js) over
  ``@langchain/langgraph-checkpoint-postgres`` 1.0.5, one fresh database per
  checkpointer (js/validation_initializer.mjs).

A test whose outcome differs between the two runs fails the comparison; so does any
"checkpoint traffic not enforced" line in the proxy's log (under ``refuse`` such a
statement would have failed 0A000), and the proxy's statement counters must show the
prune, delta-history and shallow statements recognized.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import HOST, REPO, PgServer, Proxy, free_port

HERE = Path(__file__).resolve().parent
JS = HERE / "js"
SUITES_REQ = HERE / "saver-suites.txt"
CACHE = REPO / "target" / "saver-suites"
PY_SUITE_FILES = [
    "tests/test_sync.py",
    "tests/test_async.py",
    "tests/test_prune.py",
    "tests/test_delta_pagination.py",
    "tests/test_delta_plain_value_seed.py",
    "tests/test_conformance_delta.py",
]
PY_SKIPPED = {
    "tests/test_conformance_delta.py::test_delta_channel_conformance":
        "needs the conformance library's delta_channel_history capability (not in 0.0.2)",
}
# Statement classes (resumeguard_checkpoint_statements_total) the Python suite must
# have sent through the proxy as recognized traffic.
PY_CLASSES = ["delete_threads", "delete_namespaces", "delete_listed_checkpoints",
              "delete_all_but_kept", "delete_blob_versions", "unparent",
              "read_without_writes", "channel_history_read", "read_latest"]
NOT_ENFORCED = "checkpoint traffic not enforced"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def suite_pg():
    """A server of the module's own: the Python suite clears the checkpoint tables of
    its ``postgres`` database before each test."""
    server = PgServer("suites").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def refusing_proxy(suite_pg, workdir):
    conf = workdir / "suites-refuse.toml"
    conf.write_text('[enforce]\nunknown_saver = "refuse"\n')
    admin = free_port()
    p = Proxy(suite_pg.port, workdir, "proxy-saver-suites",
              ("--config", str(conf), "--claims-store", str(workdir / "suites-claims.sqlite"),
               "--admin-listen", f"{HOST}:{admin}")).start()
    p.admin_base = f"http://{HOST}:{admin}"
    yield p
    rc = p.stop()
    assert rc == 0, f"proxy did not exit cleanly: rc={rc}\n{p.describe()}"


@pytest.fixture(scope="module")
def python_suite(workdir) -> Path:
    """The pinned sdist's tests, unpacked, with their connection URIs read from the
    environment."""
    sdist = fetch_sdist()
    root = workdir / "lgcp-suite"
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/tests/" in m.name and m.isfile()]
        tar.extractall(workdir / "lgcp-unpack", members=members, filter="data")
    (top,) = (workdir / "lgcp-unpack").iterdir()
    shutil.move(str(top), root)
    conftest = root / "tests" / "conftest.py"
    text = conftest.read_text()
    for old, new in [
        ('DEFAULT_POSTGRES_URI = "postgres://postgres:postgres@localhost:5441/"',
         'import os\nDEFAULT_POSTGRES_URI = os.environ["RG_SUITE_BASE_URI"]'),
        ('DEFAULT_URI = "postgres://postgres:postgres@localhost:5441/postgres?sslmode=disable"',
         'DEFAULT_URI = DEFAULT_POSTGRES_URI + "postgres"\n'
         '_CLEANUP_URI = os.environ["RG_SUITE_CLEANUP_URI"]'),
        ("DEFAULT_URI, autocommit=True, prepare_threshold=0",
         "_CLEANUP_URI, autocommit=True, prepare_threshold=0"),
    ]:
        assert text.count(old) == 1, f"{conftest} no longer has {old!r}"
        text = text.replace(old, new)
    conftest.write_text(text)
    (root / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n"
                                     "asyncio_default_fixture_loop_scope = function\n")
    return root


def fetch_sdist() -> Path:
    """langgraph-checkpoint-postgres's sdist at the pinned version and hash (pip
    download, cached under target/)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob("langgraph_checkpoint_postgres-*.tar.gz"))
    if not found:
        cp = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                             "--no-binary", ":all:", "--require-hashes", "-r", str(SUITES_REQ),
                             "-d", str(CACHE), "-q"],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, f"pip download failed:\n{cp.stdout}\n{cp.stderr}"
        found = sorted(CACHE.glob("langgraph_checkpoint_postgres-*.tar.gz"))
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------- runners
def run_python_suite(root: Path, base_uri: str, cleanup_uri: str, tag: str) -> dict[str, str]:
    """Runs the suite once; {test id: passed | failed | skipped}."""
    junit = root / f"junit-{tag}.xml"
    argv = [sys.executable, "-m", "pytest", *PY_SUITE_FILES, "-q", "-p", "no:cacheprovider",
            "-W", "ignore", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    for test in PY_SKIPPED:
        argv += ["--deselect", test]
    env = dict(os.environ, RG_SUITE_BASE_URI=base_uri, RG_SUITE_CLEANUP_URI=cleanup_uri,
               PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    cp = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600,
                        stdin=subprocess.DEVNULL)
    print(f"python suite {tag}: {time.monotonic() - started:.1f}s, exit {cp.returncode}")
    assert junit.exists(), f"no junit report ({tag}):\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{file}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test_id] = ("failed" if kinds & {"failure", "error"} else
                             "skipped" if "skipped" in kinds else "passed")
    return outcomes


def run_js_validation(dsn: str, tag: str, workdir: Path) -> dict[str, str]:
    """Runs the JS validation suite once; {test name: passed | failed | skipped}."""
    report = workdir / f"js-validation-{tag}.json"
    vitest = JS / "node_modules" / ".bin" / "vitest"
    assert vitest.exists(), f"{vitest} is missing: run_all.sh runs npm ci in integration/js"
    started = time.monotonic()
    cp = subprocess.run([str(vitest), "run", "--globals", "--reporter=json",
                         f"--outputFile={report}", "validation.test.mjs"],
                        cwd=JS, env=dict(os.environ, RG_VALIDATION_DSN=dsn, CI="true"),
                        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    print(f"js validation {tag}: {time.monotonic() - started:.1f}s, exit {cp.returncode}")
    assert report.exists(), f"no vitest report ({tag}):\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    outcomes = {}
    for file in json.loads(report.read_text())["testResults"]:
        for a in file["assertionResults"]:
            status = a["status"]
            # Parametrized cases share a name: the n-th of a name is its own test.
            name, n = a["fullName"], 1
            while f"{name} #{n}" in outcomes:
                n += 1
            outcomes[f"{name} #{n}"] = status if status in ("passed", "failed") else "skipped"
    return outcomes


def compare(direct: dict[str, str], proxied: dict[str, str], what: str) -> None:
    counts = {side: {o: list(r.values()).count(o) for o in ("passed", "failed", "skipped")}
              for side, r in (("direct", direct), ("proxy", proxied))}
    print(f"{what}: {counts}")
    assert direct, f"{what}: no tests ran"
    assert set(direct) == set(proxied), (
        f"{what}: different tests ran: only direct {sorted(set(direct) - set(proxied))[:10]}, "
        f"only proxy {sorted(set(proxied) - set(direct))[:10]}")
    differ = {t: (direct[t], proxied[t]) for t in direct if direct[t] != proxied[t]}
    assert not differ, f"{what}: outcomes differ (direct, proxy): {differ}"
    failing = [t for t, o in direct.items() if o == "failed"]
    assert not failing, f"{what}: failing straight to PostgreSQL too: {failing}"


def unenforced_lines(proxy: Proxy) -> list[str]:
    log = proxy.stderr_path.read_text(errors="replace")
    return [ln for ln in log.splitlines() if NOT_ENFORCED in ln]


def statement_counts(proxy: Proxy) -> dict[str, float]:
    with urllib.request.urlopen(f"{proxy.admin_base}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    prefix = 'resumeguard_checkpoint_statements_total{class="'
    for line in text.splitlines():
        if line.startswith(prefix):
            label, _, rest = line[len(prefix):].partition('"')
            out[label] = float(rest.split()[-1])
    return out


# --------------------------------------------------------------------------- tests
def test_langgraph_python_suite_is_the_same_through_the_refusing_proxy(
        python_suite, suite_pg, refusing_proxy):
    direct_base = f"postgres://postgres@{HOST}:{suite_pg.port}/"
    proxy_base = f"postgres://postgres@{HOST}:{refusing_proxy.port}/"
    cleanup = direct_base + "postgres"
    direct = run_python_suite(python_suite, direct_base, cleanup, "direct")
    proxied = run_python_suite(python_suite, proxy_base, cleanup, "proxy")
    compare(direct, proxied, "langgraph-checkpoint-postgres 3.2.0 tests")
    assert any("shallow" in t for t in direct) and any("prune" in t for t in direct)
    assert unenforced_lines(refusing_proxy) == [], "\n".join(unenforced_lines(refusing_proxy))
    counts = statement_counts(refusing_proxy)
    missing = [c for c in PY_CLASSES if counts.get(c, 0) == 0]
    assert not missing, f"statement classes never seen: {missing}; counts {counts}"
    assert counts.get("unrecognized", 0) == 0, counts


def test_langgraph_js_validation_suite_is_the_same_through_the_refusing_proxy(
        suite_pg, refusing_proxy, workdir):
    direct = run_js_validation(f"postgres://postgres@{HOST}:{suite_pg.port}/postgres",
                               "direct", workdir)
    proxied = run_js_validation(f"postgres://postgres@{HOST}:{refusing_proxy.port}/postgres",
                                "proxy", workdir)
    compare(direct, proxied, "@langchain/langgraph-checkpoint-validation 1.1.1")
    assert unenforced_lines(refusing_proxy) == [], "\n".join(unenforced_lines(refusing_proxy))
    assert statement_counts(refusing_proxy).get("unrecognized", 0) == 0
