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
* Python 2.0.x: the tests shipped in ``langgraph-checkpoint-postgres`` 2.0.25's sdist
  (pinned by hash beside 3.2.0), run by ``.venv-lg2``'s interpreter (langgraph 0.6.11;
  integration/requirements-lg2.txt adds pytest and pytest-asyncio for them):
  ``test_sync.py`` and ``test_async.py``, ``PostgresSaver``/``AsyncPostgresSaver``
  over a connection, a pool and a pipeline and the shallow savers, including the
  pending-sends migration this generation reads with a statement of its own. The same
  URI rewrite, the same cleanup fixture straight to the server, the store tests left
  out for the same reasons; nothing skipped by name. 2.0.8 has no such run: its sdist
  was built by Poetry with ``packages = [{ include = "langgraph" }]`` and holds only
  ``langgraph/``, ``README.md``, ``pyproject.toml`` and ``PKG-INFO`` — no ``tests/``
  (its wheel has only the package), so there is no published suite of 2.0.8 to run;
  test_py2_saver.py drives 2.0.8 with the project's own scenarios.
* JS: ``@langchain/langgraph-checkpoint-validation`` 1.1.1 (integration/js) over
  ``@langchain/langgraph-checkpoint-postgres`` 1.0.5, one fresh database per
  checkpointer (js/validation_initializer.mjs).

A test whose outcome differs between the two runs fails the comparison; so does any
"checkpoint traffic not enforced" line in the proxy's log (under ``refuse`` such a
statement would have failed 0A000), and the proxy's statement counters, counted over
each Python run alone, must show the statements that suite sends recognized (3.2.0:
prune, delta history, shallow; 2.0.25: the separate pending-sends read, shallow).
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
NOT_ENFORCED = "checkpoint traffic not enforced"


class PySuite:
    """One version of ``langgraph-checkpoint-postgres`` whose sdist's tests run: the
    interpreter that has that saver installed, the test files, the tests skipped by
    name (on both sides), words some of its test ids must contain (the savers it
    exercises) and the statement classes (``resumeguard_checkpoint_statements_total``)
    the run must send through the proxy as recognized traffic."""

    def __init__(self, version: str, python: Path, files: list[str],
                 skipped: dict[str, str], exercises: list[str], classes: list[str]):
        self.version, self.python, self.files = version, python, files
        self.skipped, self.exercises, self.classes = skipped, exercises, classes


PY_SUITES = [
    PySuite("3.2.0", Path(sys.executable),
            ["tests/test_sync.py", "tests/test_async.py", "tests/test_prune.py",
             "tests/test_delta_pagination.py", "tests/test_delta_plain_value_seed.py",
             "tests/test_conformance_delta.py"],
            {"tests/test_conformance_delta.py::test_delta_channel_conformance":
                 "needs the conformance library's delta_channel_history capability (not in 0.0.2)"},
            ["shallow", "prune", "pool", "pipe"],
            ["delete_threads", "delete_namespaces", "delete_listed_checkpoints",
             "delete_all_but_kept", "delete_blob_versions", "unparent",
             "read_without_writes", "channel_history_read", "read_latest"]),
    PySuite("2.0.25", Path(os.environ.get("RG_LG2_PYTHON", REPO / ".venv-lg2" / "bin" / "python")),
            ["tests/test_sync.py", "tests/test_async.py"], {}, ["shallow", "pool", "pipe"],
            ["read_latest", "read_by_id", "read_list", "writes_read", "checkpoint_upsert",
             "writes_insert_ignore", "delete_all_but_kept", "migration"]),
]


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
              ("--config", str(conf), "--admin-listen", f"{HOST}:{admin}")).start()
    p.admin_base = f"http://{HOST}:{admin}"
    yield p
    rc = p.stop()
    assert rc == 0, f"proxy did not exit cleanly: rc={rc}\n{p.describe()}"


def unpack_suite(suite: PySuite, workdir: Path) -> Path:
    """The pinned sdist's tests, unpacked, with their connection URIs read from the
    environment."""
    sdist = fetch_sdist(suite.version)
    root = workdir / f"lgcp-suite-{suite.version}"
    unpack = workdir / f"lgcp-unpack-{suite.version}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(unpack, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/tests/" in m.name and m.isfile()]
        tar.extractall(unpack, members=members, filter="data")
    (top,) = unpack.iterdir()
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


def fetch_sdist(version: str) -> Path:
    """langgraph-checkpoint-postgres's sdist at that version and its hash in
    saver-suites.txt (pip download, cached under target/)."""
    name = f"langgraph_checkpoint_postgres-{version}.tar.gz"
    sdist = CACHE / name
    if not sdist.exists():
        pins = [ln for ln in SUITES_REQ.read_text().splitlines()
                if ln.startswith(f"langgraph-checkpoint-postgres=={version} ")]
        assert len(pins) == 1, f"{SUITES_REQ} pins {version} {len(pins)} times"
        CACHE.mkdir(parents=True, exist_ok=True)
        # One requirement per download: pip refuses two versions of a package in one file.
        req = CACHE / f"requirement-{version}.txt"
        req.write_text(pins[0] + "\n")
        cp = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                             "--no-binary", ":all:", "--require-hashes", "-r", str(req),
                             "-d", str(CACHE), "-q"],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, f"pip download failed:\n{cp.stdout}\n{cp.stderr}"
    assert sdist.exists(), f"pip download left no {name} in {CACHE}"
    return sdist


# --------------------------------------------------------------------------- runners
def run_python_suite(suite: PySuite, root: Path, base_uri: str, cleanup_uri: str,
                     tag: str) -> dict[str, str]:
    """Runs the suite once; {test id: passed | failed | skipped}."""
    junit = root / f"junit-{tag}.xml"
    argv = [str(suite.python), "-m", "pytest", *suite.files, "-q", "-p", "no:cacheprovider",
            "-W", "ignore", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    for test in suite.skipped:
        argv += ["--deselect", test]
    env = dict(os.environ, RG_SUITE_BASE_URI=base_uri, RG_SUITE_CLEANUP_URI=cleanup_uri,
               PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    cp = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600,
                        stdin=subprocess.DEVNULL)
    print(f"python suite {suite.version} {tag}: {time.monotonic() - started:.1f}s, "
          f"exit {cp.returncode}")
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
# Two full suite runs, each bounded by its subprocess timeout: on a loaded machine the
# 3.2.0 suite alone took 61 s straight to PostgreSQL, past what the 180 s backstop leaves.
@pytest.mark.timeout(1300)
@pytest.mark.parametrize("suite", PY_SUITES, ids=[s.version for s in PY_SUITES])
def test_langgraph_python_suite_is_the_same_through_the_refusing_proxy(
        suite, suite_pg, refusing_proxy, workdir):
    assert suite.python.exists(), f"{suite.python} is missing: run_all.sh creates it"
    root = unpack_suite(suite, workdir)
    direct_base = f"postgres://postgres@{HOST}:{suite_pg.port}/"
    proxy_base = f"postgres://postgres@{HOST}:{refusing_proxy.port}/"
    cleanup = direct_base + "postgres"
    direct = run_python_suite(suite, root, direct_base, cleanup, "direct")
    before = statement_counts(refusing_proxy)
    proxied = run_python_suite(suite, root, proxy_base, cleanup, "proxy")
    after = statement_counts(refusing_proxy)
    compare(direct, proxied, f"langgraph-checkpoint-postgres {suite.version} tests")
    unexercised = [w for w in suite.exercises if not any(w in t for t in direct)]
    assert not unexercised, f"no test of {unexercised} ran: {sorted(direct)}"
    assert unenforced_lines(refusing_proxy) == [], "\n".join(unenforced_lines(refusing_proxy))
    counts = {c: n - before.get(c, 0) for c, n in after.items() if n > before.get(c, 0)}
    print(f"statement classes ({suite.version}): {counts}")
    missing = [c for c in suite.classes if counts.get(c, 0) == 0]
    assert not missing, f"statement classes never seen: {missing}; counts {counts}"
    assert after.get("unrecognized", 0) == 0, counts


@pytest.mark.timeout(1300)
def test_langgraph_js_validation_suite_is_the_same_through_the_refusing_proxy(
        suite_pg, refusing_proxy, workdir):
    direct = run_js_validation(f"postgres://postgres@{HOST}:{suite_pg.port}/postgres",
                               "direct", workdir)
    proxied = run_js_validation(f"postgres://postgres@{HOST}:{refusing_proxy.port}/postgres",
                                "proxy", workdir)
    compare(direct, proxied, "@langchain/langgraph-checkpoint-validation 1.1.1")
    assert unenforced_lines(refusing_proxy) == [], "\n".join(unenforced_lines(refusing_proxy))
    assert statement_counts(refusing_proxy).get("unrecognized", 0) == 0
