"""The admin listener (``--admin-listen``) end to end: Prometheus ``/metrics``
counters move while real LangGraph runs through the proxy (a fork, a rejected
write, a race of two resumers, a takeover), ``/readyz`` follows a throwaway
PostgreSQL going down while ``/healthz`` and ``pg_isready`` through the proxy
stay up, ``/threads/{id}`` shows an approval go parked → answered → completed,
``/sessions`` lists a live session, and ``POST /claims/release`` needs the
``[admin] token``. ``--log-format json`` prints the login and close lines as JSON.

The helpers are the enforcement suites': ``lg_enforce`` scenarios (test_fork,
test_validity) and the racer processes of test_consume_once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

import lg_enforce as E
import racer as R
from conftest import (HOST, PG_CLIENT_BIN, PgServer, Proxy, cpu_seconds, free_port, pg_env,
                      port_accepts, proxy_binary)
from test_consume_once import Racers, park, racer_cli
from test_validity import ITEMS_RULE, write_rules_dir

HERE = Path(__file__).resolve().parent
TOKEN = f"adm-{uuid.uuid4().hex}"


# ----------------------------------------------------------------- http
def http(base: str, method: str, path: str, body: dict | None = None,
         token: str | None = TOKEN) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get_json(base: str, path: str, token: str | None = TOKEN) -> tuple[int, object]:
    status, text = http(base, "GET", path, token=token)
    return status, json.loads(text)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(base: str, token: str | None = TOKEN) -> dict[tuple, float]:
    """``/metrics`` as {(name, ((label, value), ...)): value}."""
    status, text = http(base, "GET", "/metrics", token=token)
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(sample: dict, name: str, **labels) -> float:
    return sample.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_admin(port: int) -> str:
    deadline = time.monotonic() + 10
    while not port_accepts(port):
        assert time.monotonic() < deadline, f"admin listener {port} never accepted"
        time.sleep(0.05)
    return f"http://{HOST}:{port}"


# ----------------------------------------------------------------- fixtures
class Admin:
    def __init__(self, proxy: Proxy, base: str, dbname: str):
        self.proxy, self.base, self.dbname = proxy, base, dbname

    def dsn(self, app: str | None = None) -> str:
        return self.proxy.dsn(self.dbname) + (f"&application_name={app}" if app else "")


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    E.setup_db(direct_dsn)
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None


@pytest.fixture(scope="module")
def admin(proxy_factory, workdir, dbname) -> Admin:
    port = free_port()
    rules = write_rules_dir(workdir / "admin-rules", {"items.toml": ITEMS_RULE})
    cfg = workdir / "admin.toml"
    cfg.write_text(f'admin_listen = "{HOST}:{port}"\n\n[admin]\ntoken = "{TOKEN}"\n\n'
                   f'[claims]\nlapse_ms = 3000\n'
                   f'holder_gone_grace_ms = 500\n')
    p = proxy_factory("--config", str(cfg), "--rules", str(rules), name="admin")
    return Admin(p, wait_admin(port), dbname)


def tid(prefix: str) -> str:
    return f"{prefix}-adm-{uuid.uuid4().hex[:8]}"


class RaceEnv:
    """What test_consume_once's ``Racers`` needs of its environment."""

    def __init__(self, direct: str, workdir: Path):
        self.direct, self.workdir = direct, workdir


# ----------------------------------------------------------------- metrics
def test_metrics_move_with_a_fork_a_rejection_a_race_and_a_takeover(admin, direct_dsn, workdir):
    before = scrape(admin.base)

    # A fork at the answered checkpoint is served its own answer.
    fork = E.fork_scenario("conn", admin.dsn(), tid("fk"), "bare")
    assert fork["ledger"] == [True, False], fork["ledger"]

    # An invalid append is refused (23514).
    thread = "vt" + tid("")
    with E.Driver("conn", admin.dsn()) as d:
        g = E.build_items_graph(d.saver)
        d.invoke(g, {"pending": "a"}, E.cfg_of(thread))
        with pytest.raises(psycopg.errors.CheckViolation):
            d.invoke(g, {"pending": None}, E.cfg_of(thread))

    # Two racer processes resume one parked interrupt: one fires, one is refused.
    race_thread = tid("race")
    its = park(admin.dsn(), race_thread)
    racers = Racers(RaceEnv(direct_dsn, workdir), [admin.dsn(), admin.dsn()], "conn",
                    [{"thread": race_thread, "graph": "one", "form": "bare", "gate_ms": 300,
                      "interrupt_id": its[0]["id"]}], "adm-")
    try:
        results = racers.run_all()[0]
    finally:
        racers.kill()
    assert sorted(r["ok"] for r in results) == [False, True], results
    loser = next(r for r in results if not r["ok"])
    assert loser["error"]["sqlstate"] == "55000", loser

    # A get_state from a process that exits claims the parked head; a resume
    # right after takes the lapsed claim over.
    late_thread = tid("takeover")
    park(admin.dsn(), late_thread)
    racer_cli("state", "--dsn", admin.dsn("adm-inspector"), "--thread", late_thread)
    R.CTX["racer"] = "adm-late"
    with R.Runner("conn", admin.dsn()) as r:
        assert R.resume_once(r, {"thread": late_thread})["ok"]

    after = scrape(admin.base)

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("resumeguard_forks_served_total") >= 1
    assert moved("resumeguard_writes_rejected_total") >= 1
    assert moved("resumeguard_claims_total", outcome="taken") >= 2   # fork's branch A, race winner
    assert moved("resumeguard_claims_total", outcome="refused") >= 1
    assert moved("resumeguard_claims_refused_total", reason="answered") >= 1
    assert moved("resumeguard_claim_waits_total") >= 1
    assert moved("resumeguard_claims_total", outcome="takeover") >= 1
    assert moved("resumeguard_claim_takeovers_total", reason="lapsed") >= 1
    # Each takeover is counted once, by one reason.
    assert moved("resumeguard_claims_total", outcome="takeover") == sum(
        moved("resumeguard_claim_takeovers_total", reason=r) for r in ("lapsed", "abandoned"))
    # consumed by the claims worker, off the data path: give it a moment
    deadline = time.monotonic() + 5
    while moved("resumeguard_claims_consumed_total") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = scrape(admin.base)
    assert moved("resumeguard_claims_consumed_total") >= 3
    for cls in ("read_latest", "read_by_id", "checkpoint_upsert", "blob_upsert",
                "writes_insert_ignore", "writes_upsert"):
        assert moved("resumeguard_checkpoint_statements_total", **{"class": cls}) >= 1, cls
    reads = moved("resumeguard_checkpoint_statement_seconds_count", **{"class": "read_latest"})
    assert reads >= 1
    assert value(after, "resumeguard_checkpoint_statement_seconds_bucket",
                 **{"class": "read_latest", "le": "+Inf"}) >= reads
    assert moved("resumeguard_client_connections_total") >= 5
    assert ("resumeguard_audit_queue_depth", ()) in after
    assert ("resumeguard_unknown_saver_statements_total", ()) in after


# ----------------------------------------------------------------- ledger
def test_thread_ledger_shows_parked_then_answered(admin):
    thread = tid("ledger")
    ledger: list = []
    with E.Driver("conn", admin.dsn("adm-runner")) as d:
        d.invoke(E.build_gate_graph(d.saver, ledger), {"items": [], "approved": None},
                 E.cfg_of(thread))

    def ledger_when(want) -> dict:
        deadline = time.monotonic() + 10
        while True:
            status, body = get_json(admin.base, f"/threads/{thread}")
            if (status == 200 and want(body)) or time.monotonic() > deadline:
                assert status == 200, body
                return body
            time.sleep(0.2)

    parked = ledger_when(lambda b: b["state"] == "parked")
    assert parked["state"] == "parked", parked
    approval = parked["approvals"][0]
    assert approval["parked"]["application_name"] == "adm-runner"
    assert approval["claimed"] is None and approval["answered"] is None

    with E.Driver("conn", admin.dsn("adm-approver")) as d:
        d.invoke(E.build_gate_graph(d.saver, ledger), E.Command(resume=True), E.cfg_of(thread))
    assert ledger == [True]

    done = ledger_when(lambda b: b["state"] == "completed" and b["approvals"][0]["consumed"])
    assert done["state"] == "completed", done
    a = done["approvals"][0]
    assert a["checkpoint_id"] == approval["checkpoint_id"]
    assert a["claimed"]["application_name"] == "adm-approver"
    assert a["answered"]["application_name"] == "adm-approver"
    assert a["completed"]["operation"] == "checkpoint_put"
    assert a["refused"] == [] and a["forks_served"] == []
    ops = [e["operation"] for e in done["timeline"]]
    for op in ("interrupt_parked", "claim_taken", "resume_recorded", "claim_consumed"):
        assert op in ops, ops
    assert ops.index("interrupt_parked") < ops.index("claim_taken") < ops.index("resume_recorded")
    assert http(admin.base, "GET", f"/threads/{tid('never')}")[0] == 404


# ----------------------------------------------------------------- claims and sessions
def test_claims_release_needs_the_token(admin, proxy_factory):
    thread = tid("release")
    park(admin.dsn(), thread)
    with R.Runner("conn", admin.dsn("adm-holder")) as holder:
        # an unmarked get_state on a connection that stays open holds the claim
        holder.get_state("one", thread)
        status, claims = get_json(admin.base, f"/claims?thread={thread}")
        assert status == 200 and len(claims) == 1, claims
        assert claims[0]["state"] == "held"
        assert claims[0]["holder"]["application_name"] == "adm-holder"
        status, sessions = get_json(admin.base, "/sessions")
        assert any(s["application_name"] == "adm-holder" and s["database"] == admin.dbname
                   for s in sessions), sessions

        body = {"thread": thread}
        assert http(admin.base, "POST", "/claims/release", body, token=None)[0] == 401
        assert http(admin.base, "POST", "/claims/release", body, token="wrong")[0] == 401
        assert get_json(admin.base, f"/claims?thread={thread}")[1][0]["state"] == "held"
        status, text = http(admin.base, "POST", "/claims/release", body, token=TOKEN)
        assert status == 200 and json.loads(text) == {"released": 1}, text
        assert get_json(admin.base, f"/claims?thread={thread}")[1][0]["state"] == "released"

    # Without a token configured, mutating endpoints are off.
    port = free_port()
    tokenless = proxy_factory("--admin-listen", f"{HOST}:{port}", name="admin-tokenless")
    base = wait_admin(port)
    assert http(base, "POST", "/claims/release", {"thread": thread}, token=TOKEN)[0] == 403
    tokenless.stop()


def test_connections_are_counted_and_refusals_past_max_client_conn(proxy_factory, workdir, dbname):
    port = free_port()
    cfg = workdir / "admin-maxconn.toml"
    cfg.write_text(f'admin_listen = "{HOST}:{port}"\nmax_client_conn = 1\n')
    p = proxy_factory("--config", str(cfg), name="admin-maxconn")
    base = wait_admin(port)
    before = scrape(base)
    with psycopg.connect(p.dsn(dbname), autocommit=True) as first:
        first.execute("select 1")
        with pytest.raises(psycopg.OperationalError, match="max_client_conn"):
            psycopg.connect(p.dsn(dbname), autocommit=True).close()
        deadline = time.monotonic() + 5   # the refused connection's thread ends on its own
        while value(during := scrape(base), "resumeguard_client_connections_open") != 1:
            assert time.monotonic() < deadline, during
            time.sleep(0.05)
    total = "resumeguard_client_connections_total"
    assert value(during, total) - value(before, total) == 2
    assert value(during, "resumeguard_client_connections_refused_total",
                 reason="max_client_conn") == 1
    p.stop()


# ----------------------------------------------------------------- readiness
def test_readyz_fails_while_the_upstream_is_down(workdir, tmp_path):
    server = PgServer("admin-ready").start()
    port = free_port()
    proxy = Proxy(server.port, workdir, "admin-ready",
                  ("--admin-listen", f"{HOST}:{port}", "--log-format", "json",
                   "--state-dir", str(tmp_path))).start()
    try:
        base = wait_admin(port)
        status, ready = get_json(base, "/readyz")
        assert status == 200 and ready["ready"] and ready["upstream"]["ok"], ready
        # The claims live in that PostgreSQL (the default backend).
        assert ready["claims_store"]["ok"], ready
        before = scrape(base)
        session = psycopg.connect(proxy.dsn("postgres", application_name="adm-ready"),
                                  autocommit=True)
        session.execute("select 1")

        server.stop()
        status, ready = get_json(base, "/readyz")
        assert status == 503 and not ready["ready"] and not ready["upstream"]["ok"], ready
        assert not ready["claims_store"]["ok"], ready
        assert http(base, "GET", "/healthz")[0] == 200
        # pg_isready asks the proxy, which answers: it still says "accepting".
        isready = subprocess.run([str(PG_CLIENT_BIN / "pg_isready"), "-h", HOST, "-p", str(proxy.port)],
                                 capture_output=True, text=True, timeout=30, env=pg_env())
        assert isready.returncode == 0, isready.stdout + isready.stderr
        with pytest.raises(psycopg.OperationalError):
            session.execute("select 1")
        session.close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(proxy.dsn("postgres"), autocommit=True).close()
        after = scrape(base)
        errors = "resumeguard_upstream_errors_total"
        assert value(after, errors, kind="lost") - value(before, errors, kind="lost") == 1
        assert value(after, errors, kind="connect") - value(before, errors, kind="connect") >= 1
    finally:
        rc = proxy.stop(signal.SIGTERM)
        server.stop()
    assert rc == 0, proxy.describe()
    # --log-format json: one JSON object per line, the login and the close among them.
    lines = [json.loads(ln) for ln in proxy.stderr_path.read_text().splitlines() if ln.strip()]
    logins = [ln for ln in lines if ln["fields"].get("message") == "login"]
    assert any(ln["fields"].get("app") == "adm-ready" and ln["span"]["user"] == "postgres"
               for ln in logins), logins
    closes = [ln for ln in lines if ln["fields"].get("message") == "session closed"]
    assert closes and all("age_ms" in ln["fields"] for ln in closes), closes


# ----------------------------------------------------------------- the admin address
def serve_argv(pg, workdir: Path, name: str, *extra: str) -> list[str]:
    return [str(proxy_binary()), "serve", "--listen", f"{HOST}:{free_port()}",
            "--upstream", f"{HOST}:{pg.port}", "--audit-db", str(workdir / f"{name}.sqlite"),
            *extra]


def exits_naming(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``serve`` expecting it to stop at start (within 20 s)."""
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=20, env={**os.environ, "RUST_LOG": "info", **(env or {})})
    assert cp.returncode != 0, f"serve started:\n{cp.stdout}\n{cp.stderr}"
    return cp


def test_a_busy_admin_address_stops_the_proxy_naming_it(pg, workdir):
    """Given explicitly (flag, environment) or left at the default 127.0.0.1:6433,
    an admin address in use is a startup error naming it; the proxy does not
    serve without its admin API."""
    taken = socket.socket()
    taken.bind((HOST, 0))
    taken.listen()
    addr = f"{HOST}:{taken.getsockname()[1]}"
    try:
        cp = exits_naming(serve_argv(pg, workdir, "busy-flag", "--admin-listen", addr))
        assert f"admin listener on {addr}" in cp.stderr and "auto" in cp.stderr, cp.stderr
        assert "in use" in cp.stderr.lower(), cp.stderr
        assert "DATABASE_URL" not in cp.stdout, cp.stdout
        cp = exits_naming(serve_argv(pg, workdir, "busy-env"),
                          env={"RESUMEGUARD_ADMIN_LISTEN": addr})
        assert f"admin listener on {addr}" in cp.stderr, cp.stderr
    finally:
        taken.close()
    # The default: held here unless something on the host holds it already.
    default = socket.socket()
    try:
        default.bind((HOST, 6433))
        default.listen()
    except OSError:
        pass
    try:
        cp = exits_naming(serve_argv(pg, workdir, "busy-default"))
        assert "admin listener on 127.0.0.1:6433" in cp.stderr, cp.stderr
    finally:
        default.close()


def test_admin_listen_auto_picks_a_free_port_and_prints_it(pg, workdir):
    """Two proxies with ``--admin-listen auto`` on one host: each prints its own
    ``ADMIN_URL=`` and logs it, and each URL answers for its own proxy."""
    proxies = [Proxy(pg.port, workdir, f"admin-auto-{i}", ("--admin-listen", "auto")).start()
               for i in range(2)]
    try:
        urls = [p.admin_url() for p in proxies]
        assert all(urls) and urls[0] != urls[1], urls
        for p, url in zip(proxies, urls):
            port = int(url.rsplit(":", 1)[1])
            log = p.stderr_path.read_text()
            assert f"listen={HOST}:{port}" in log and "admin API and /metrics" in log, log
            # No token configured: the data routes are off, /metrics is open.
            status, body = get_json(url, "/sessions")
            assert status == 403 and "[admin] token" in body["error"], body
            # The proxy's own connection shows in its own URL's gauge.
            with psycopg.connect(p.dsn("postgres"), autocommit=True):
                assert value(scrape(url), "resumeguard_client_connections_open") == 1
    finally:
        for p in proxies:
            assert p.stop() == 0, p.describe()


def test_admin_listen_off_starts_no_listener(pg, workdir):
    p = Proxy(pg.port, workdir, "admin-off", ("--admin-listen", "off")).start()
    try:
        log = p.stderr_path.read_text()
        assert "admin API and /metrics" not in log, log
        assert p.admin_url(timeout=1) is None
    finally:
        assert p.stop() == 0, p.describe()


# ----------------------------------------------------------------- metric names
DOCS_METRICS = HERE.parent / "docs" / "metrics.md"
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def test_a_fresh_proxys_metrics_follow_the_prometheus_conventions(pg, workdir):
    """A scrape before any traffic: counters end in _total, gauges do not, no
    family is two types, build_info and the process metrics are there, the label
    sets known up front are there at 0, and every family is in docs/metrics.md."""
    p = Proxy(pg.port, workdir, "admin-fresh", ("--admin-listen", "auto")).start()
    try:
        url = p.admin_url()
        status, text = http(url, "GET", "/metrics")
        assert status == 200, text
        cpu_before = cpu_seconds(p.proc.pid)
        sample = scrape(url)
        cpu_after = cpu_seconds(p.proc.pid)
    finally:
        assert p.stop() == 0, p.describe()
    types = _TYPE.findall(text)
    names = [n for n, _ in types]
    assert len(names) == len(set(names)), "a family declared twice"
    kinds = dict(types)
    for name, kind in types:
        if kind == "counter":
            assert name.endswith("_total"), name
            family = name.removesuffix("_total")
            assert family not in kinds, f"{family} ({kinds.get(family)}) and {name} (counter)"
        else:
            assert not name.endswith("_total"), f"{name} is a {kind}"
    for name, kind in [("process_cpu_seconds_total", "counter"),
                       ("process_resident_memory_bytes", "gauge"),
                       ("process_open_fds", "gauge"),
                       ("process_start_time_seconds", "gauge"),
                       ("resumeguard_build_info", "gauge")]:
        assert kinds.get(name) == kind, (name, kinds.get(name))
    version = re.search(r'^version = "([^"]+)"', (HERE.parent / "Cargo.toml").read_text(),
                        re.M).group(1)
    assert value(sample, "resumeguard_build_info", version=version) == 1, text
    assert value(sample, "process_resident_memory_bytes") > 1_000_000
    assert value(sample, "process_open_fds") >= 3
    assert abs(value(sample, "process_start_time_seconds") - time.time()) < 120
    # The process's own CPU time, as the kernel counts it (in clock ticks: a
    # proxy that started quickly may not have used one yet).
    assert cpu_before <= value(sample, "process_cpu_seconds_total") <= cpu_after
    zero = {
        "resumeguard_claims_total": ("outcome", ["taken", "takeover", "refused"]),
        "resumeguard_claim_takeovers_total": ("reason", ["lapsed", "abandoned"]),
        "resumeguard_claims_refused_total": (
            "reason", ["answered", "in_flight", "run_in_progress", "store_unavailable"]),
        "resumeguard_writes_fenced_total": (
            "reason", ["superseded_holder", "other_proxy", "other_client", "store_unavailable"]),
        "resumeguard_fence_lookups_total": (
            "outcome", ["unclaimed", "holder", "pool", "fenced", "failed"]),
        "resumeguard_fence_checks_total": ("where", ["known", "in_transaction"]),
        "resumeguard_upstream_errors_total": ("kind", ["connect", "lost"]),
        "resumeguard_client_connections_refused_total": ("reason", ["max_client_conn"]),
        "resumeguard_reloads_total": ("part", ["rules"]),
    }
    for name, (label, values) in zero.items():
        for v in values:
            series = [(k, n) for k, n in sample.items()
                      if k[0] == name and (label, v) in k[1]]
            assert series and all(n == 0 for _, n in series), (name, label, v, series)
    for name in ("resumeguard_claim_waits_total", "resumeguard_claims_consumed_total",
                 "resumeguard_forks_served_total", "resumeguard_writes_rejected_total",
                 "resumeguard_own_schema_refused_total"):
        assert (name, ()) in sample and sample[(name, ())] == 0, name
    docs = DOCS_METRICS.read_text()
    missing = [n for n in names if f"`{n}`" not in docs]
    assert not missing, f"not in docs/metrics.md: {missing}"
