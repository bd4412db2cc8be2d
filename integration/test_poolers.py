"""Transaction poolers on both sides of the proxy, with Debian's PgBouncer (1.18) in
transaction mode (docs/poolers.md). Every scenario runs beside the same scenario
straight through PgBouncer, without the proxy, where the stock behaviour shows.

Behind the proxy (app -> resumeguard -> PgBouncer -> PostgreSQL), ``[claims] dsn``
pointing at PostgreSQL itself:

- racers N = 4 resuming one parked interrupt (LangGraph Python conn / pool / async,
  and LangGraph.js): the gated node fires once, the losers are refused; straight
  through PgBouncer it fires four times;
- a fork at the interrupt's checkpoint is served its own answer (stock: the first);
- an invalid append is refused 23514 with nothing written (stock: persisted);
- a write replayed by a session that never held the claim is fenced (RGF01), with the
  fence checked by a store lookup and, with ``[claims] fence_database``, by the server
  inside the write's own transaction (``resumeguard.fence_write``).

The Python savers are built with ``prepare_threshold=None`` (RG_PREPARE_THRESHOLD):
PgBouncer before 1.21 does not carry psycopg's named prepared statements from one
transaction to the next, with or without the proxy (shown here too).

A claims target that is a transaction pooler (the default, the upstream, when that is
PgBouncer; or a ``[claims] dsn`` naming it) stops ``serve`` at start: exit 1, one
line naming the cause and the key to set.

In front of the proxy (app -> PgBouncer -> resumeguard -> PostgreSQL): see the last
section.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from types import SimpleNamespace

import psycopg
import pytest

import lg_enforce as E
import racer as R
from conftest import HOST, proxy_binary
from pgbouncer import PgBouncer, unavailable
from test_consume_once import Racers, ledger, make_jobs
from test_fencing import FENCED, head_id, replays_during_a_holders_gate
from test_js_saver import NODE, lg, rules_dir  # noqa: F401 (a fixture)
from test_js_saver import race as js_race

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"!!! {unavailable()} !!!")

REFUSED, IN_USE, CHECK_VIOLATION = "55000", "55006", "23514"
N = 4
GATE_MS = 300
STARTUP_BOUND_S = 10


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def unprepared():
    """Savers without named prepared statements, in this process and its racers."""
    before = os.environ.get("RG_PREPARE_THRESHOLD")
    os.environ["RG_PREPARE_THRESHOLD"] = "none"
    yield
    if before is None:
        os.environ.pop("RG_PREPARE_THRESHOLD", None)
    else:
        os.environ["RG_PREPARE_THRESHOLD"] = before


@pytest.fixture(scope="module")
def bouncer(pg):
    b = PgBouncer(pg.port).start()
    yield b
    b.stop()


def proxy_config(workdir, name: str, claims_dsn: str, extra: str = "") -> str:
    cfg = workdir / f"{name}.toml"
    cfg.write_text(f'[claims]\ndsn = "{claims_dsn}"\nproxy_id = "{name}"\nlapse_ms = 3000\n'
                   f'policy = "wait"\nholder_gone_grace_ms = 1000\n{extra}')
    return str(cfg)


@pytest.fixture(scope="module")
def behind(pg, bouncer, dbname, direct_dsn, proxy_factory, rules_dir, workdir, unprepared):  # noqa: F811
    """A proxy whose upstream is PgBouncer, its claims straight to PostgreSQL."""
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    R.main(["setup", "--dsn", direct_dsn])
    lg("setup", "--dsn", direct_dsn)
    upstream = f"{HOST}:{bouncer.port}"
    proxy = proxy_factory("--config", proxy_config(workdir, "behind", pg.dsn(dbname)),
                          "--rules", str(rules_dir), "--state-dir", str(workdir / "behind-state"),
                          name="behind", upstream=upstream)
    return SimpleNamespace(direct=direct_dsn, dbname=dbname, workdir=workdir, proxy=proxy,
                           stock=bouncer.dsn(dbname), guarded=proxy.dsn(dbname), pg=pg,
                           bouncer=bouncer, rules=rules_dir, upstream=upstream)


def tid(prefix: str) -> str:
    return f"pb-{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- the claims target
def serve_until_exit(workdir, upstream: str, config: str | None, timeout: float = 30.0):
    """``serve`` that is expected to stop at start: its exit status, stderr, seconds."""
    name = uuid.uuid4().hex[:6]
    argv = [str(proxy_binary()), "serve", "--listen", f"{HOST}:0", "--upstream", upstream,
            "--admin-listen", "off", "--audit-db", str(workdir / f"refused-{name}.sqlite"),
            "--audit-jsonl", str(workdir / f"refused-{name}.jsonl"),
            "--state-dir", str(workdir / f"refused-{name}")]
    if config:
        argv += ["--config", config]
    began = time.monotonic()
    try:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"serve did not stop within {timeout}s:\n{e.stderr}")
    return cp.returncode, cp.stderr, time.monotonic() - began


@pytest.mark.parametrize("where", ["upstream", "dsn"])
def test_a_claims_target_that_is_a_transaction_pooler_is_refused_at_start(pg, bouncer, dbname,
                                                                          workdir, where):
    """The claims in the database behind PgBouncer: by default (the upstream is
    PgBouncer), or a ``[claims] dsn`` naming it. ``serve`` exits 1 within 10 s with
    one line naming PgBouncer's address, the cause and the key to set. The same
    configuration with the dsn at PostgreSQL itself starts (below, ``behind``)."""
    upstream = f"postgres://postgres@{HOST}:{bouncer.port}/{dbname}"
    config = (proxy_config(workdir, f"refused-{where}", bouncer.dsn(dbname))
              if where == "dsn" else None)
    rc, stderr, took = serve_until_exit(workdir, upstream, config)
    assert rc == 1, stderr
    assert took < STARTUP_BOUND_S, took
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("resumeguard: claims database "), stderr
    assert f"{HOST}:{bouncer.port}/{dbname}" in last, last
    assert "behind a transaction pooler" in last, last
    assert "point `[claims] dsn` (RESUMEGUARD_CLAIMS_DSN) at PostgreSQL itself" in last, last


def test_a_claims_target_straight_to_postgres_is_not_refused(behind):
    """The probe on PostgreSQL itself finds one backend per connection: the proxy
    behind PgBouncer with its dsn direct serves (and its log says nothing of a pooler)."""
    with psycopg.connect(behind.guarded, autocommit=True) as c:
        assert c.execute("select 1").fetchone() == (1,)
    assert "transaction pooler" not in behind.proxy.stderr_path.read_text()


def test_prepared_statements_do_not_survive_pgbouncer_1_18_without_the_proxy(behind):
    """Why the savers here run with prepare_threshold=None: psycopg's named prepared
    statements (LangGraph's ``from_conn_string`` prepares every statement) meet
    other clients' on PgBouncer 1.18's shared server connections, straight through
    PgBouncer, no proxy involved."""
    errors = []

    def work():
        try:
            with psycopg.connect(behind.stock, autocommit=True, prepare_threshold=0) as c:
                for k in range(50):
                    c.execute("select %s::int + 1", (k,)).fetchone()
        except psycopg.Error as e:
            errors.append(e.sqlstate)
    import threading
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors and set(errors) <= {"42P05", "26000"}, errors


# --------------------------------------------------------------------------- behind: race
def python_race(env, dsn: str, saver: str, tag: str) -> tuple[int, list[dict]]:
    """N racers on ``dsn`` resume one parked thread after a 300 ms gate: the fires
    and the racers' results."""
    jobs = make_jobs(dsn, "bare", (GATE_MS,), 1, saver, tag)
    racers = Racers(env, [dsn] * N, saver, jobs, tag)
    try:
        results = racers.run_all()[0]
    finally:
        racers.kill()
    return len(ledger(env, jobs[0]["thread"])), results


@pytest.mark.timeout(600)
@pytest.mark.parametrize("saver", ["conn", "pool", "async"])
def test_race_behind_pgbouncer_fires_once(behind, saver):
    """Stock (straight through PgBouncer): every racer fires. Through the proxy in
    front of PgBouncer: one fire, every loser refused before its node ran."""
    stock, stock_res = python_race(behind, behind.stock, saver, f"s{saver}")
    assert all(r["ok"] for r in stock_res), stock_res
    assert stock == N, stock_res
    fires, res = python_race(behind, behind.guarded, saver, f"p{saver}")
    print(f"{saver}: stock fires {stock}, proxy fires {fires}")
    assert fires == 1, res
    losers = [r for r in res if not r["ok"]]
    assert len(losers) == N - 1, res
    assert all(r["error"]["sqlstate"] in (REFUSED, IN_USE) for r in losers), losers


@pytest.mark.timeout(600)
@pytest.mark.skipif(NODE is None, reason="!!! node is not installed: LangGraph.js NOT tested !!!")
def test_js_race_behind_pgbouncer_fires_once(behind):
    """LangGraph.js (node-postgres: unnamed statements) racers: stock N fires, the
    proxy one, losers 55000/55006."""
    fires = {}
    for via, dsn in (("stock", behind.stock), ("proxy", behind.guarded)):
        racers, res = js_race(behind.workdir, dsn, N, GATE_MS, f"pb{via[0]}")
        fires[via] = len(racers.fires())
        if via == "proxy":
            losers = [r for r in res if not r["ok"]]
            assert len(losers) == N - 1, res
            assert all(r["error"]["code"] in (REFUSED, IN_USE) for r in losers), losers
    assert fires == {"stock": N, "proxy": 1}, fires


# --------------------------------------------------------------------------- behind: fork, validity
def test_fork_behind_pgbouncer_is_served_its_own_value(behind):
    """A resume at the interrupt's checkpoint with False after branch A answered True:
    stock re-runs the gate with A's True, through the proxy with its own False."""
    effects = {}
    for via, dsn in (("stock", behind.stock), ("proxy", behind.guarded)):
        out = E.fork_scenario("conn", dsn, tid(f"fork-{via}"), "bare")
        effects[via] = out["forks"][0]["effects"]
    assert effects == {"stock": [True], "proxy": [False]}, effects


@pytest.mark.skipif(NODE is None, reason="!!! node is not installed: LangGraph.js NOT tested !!!")
def test_invalid_append_behind_pgbouncer_is_refused(behind):
    """null appended to ``items: string[]``: stock persists it; the proxy refuses the
    write 23514 and the thread goes on with valid input."""
    # the channel rule applies to threads named jv-… (test_js_saver's rules_dir)
    stock = lg("invalid", "--dsn", behind.stock, "--thread", f"jv-stock-{uuid.uuid4().hex[:8]}")
    assert stock["bad"]["ok"], stock
    guarded = lg("invalid", "--dsn", behind.guarded, "--thread", f"jv-proxy-{uuid.uuid4().hex[:8]}")
    assert not guarded["bad"]["ok"] and guarded["bad"]["error"]["code"] == CHECK_VIOLATION, guarded
    assert guarded["last"]["ok"] and guarded["last"]["values"]["items"] == ["a", "b"], guarded


# --------------------------------------------------------------------------- behind: fencing
@pytest.fixture(scope="module")
def in_transaction(pg, dbname, behind, proxy_factory, workdir):
    """A second proxy behind PgBouncer whose writes are fenced by the server inside
    their own transaction: ``[claims] fence_database`` says the dsn's database is
    the one its sessions reach through the upstream."""
    return proxy_factory(
        "--config", proxy_config(workdir, "behind-tx", pg.dsn(dbname),
                                 f'fence_database = "{dbname}"\n'),
        "--rules", str(behind.rules), "--state-dir", str(workdir / "behind-tx-state"),
        "--admin-listen", "off", name="behind-tx", upstream=behind.upstream)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("place", ["lookup", "in_transaction"])
def test_a_replayed_write_behind_pgbouncer_is_fenced(behind, in_transaction, place):
    """While the holder's gate runs (its session through the proxy and PgBouncer),
    the gated task's pending write is replayed by a plain connection through the
    same proxy: fenced (RGF01), nothing written, the holder completes. Stock
    (straight through PgBouncer): written."""
    proxy = behind.proxy if place == "lookup" else in_transaction
    outcome = {}
    for via, dsn in (("stock", behind.stock), ("proxy", proxy.dsn(behind.dbname))):
        sep = "&" if "?" in dsn else "?"
        states, rows = replays_during_a_holders_gate(
            behind, dsn, tid(f"replay-{via}"), via[0], [f"{dsn}{sep}application_name=replayer"])
        outcome[via] = (states[0], rows)
    assert outcome == {"stock": (None, 1), "proxy": (FENCED, 0)}, outcome
    log = proxy.stderr_path.read_text()
    want = ("checked by the server inside each write's transaction" if place == "in_transaction"
            else "checked by a claim store lookup per write")
    assert want in log, log[-3000:]


# --------------------------------------------------------------------------- in front of the proxy
@pytest.fixture(scope="module")
def in_front(pg, dbname, behind, proxy_factory, workdir):
    """PgBouncer (transaction mode) in front of a proxy in front of PostgreSQL."""
    proxy = proxy_factory("--config", proxy_config(workdir, "fronted", pg.dsn(dbname)),
                          "--state-dir", str(workdir / "fronted-state"), name="fronted")
    front = PgBouncer(proxy.port, name="pgbouncer-front").start()
    yield SimpleNamespace(proxy=proxy, front=front, dsn=front.dsn(dbname))
    front.stop()


FENCED_OR_REFUSED = (REFUSED, IN_USE, FENCED)


def children_of(env, thread: str, parked: str) -> int:
    with psycopg.connect(env.direct, autocommit=True) as c:
        return c.execute("select count(*) from checkpoints where thread_id = %s and "
                         "checkpoint_ns = '' and parent_checkpoint_id = %s",
                         (thread, parked)).fetchone()[0]


@pytest.mark.timeout(600)
def test_race_through_pgbouncer_in_front_of_the_proxy(behind, in_front):
    """What a user gets with PgBouncer (transaction mode) in front: the proxy sees a
    few sessions each carrying every racer's transactions, so "the holder's session"
    is whichever racer runs on it next. Consume-once does not hold: a racer whose read
    lands on the holder's session is served as the holder, so the gated node can
    fire more than once, and that racer's writes, told from the holder's only by the
    session's application_name, were fenced in some runs and committed in others
    (the parked checkpoint then has a second child). The proxy says so: a WARN naming the shared session. Every
    racer is served, refused (55000 / 55006) or fenced (RGF01); at least one succeeds."""
    jobs = make_jobs(in_front.dsn, "bare", (GATE_MS,), 1, "conn", "front")
    thread = jobs[0]["thread"]
    parked = head_id(behind, thread)
    racers = Racers(behind, [in_front.dsn] * N, "conn", jobs, "front")
    try:
        res = racers.run_all()[0]
    finally:
        racers.kill()
    fires = len(ledger(behind, thread))
    errors = sorted(r["error"]["sqlstate"] for r in res if not r["ok"])
    kids = children_of(behind, thread, parked)
    print(f"PgBouncer in front: fires {fires}, children {kids}, refusals {errors}")
    assert 1 <= fires <= N and 1 <= kids <= N, res
    assert any(r["ok"] for r in res), res
    assert set(errors) <= set(FENCED_OR_REFUSED), res
    log = in_front.proxy.stderr_path.read_text()
    assert "application_name changed mid-session" in log, log[-3000:]
    assert "transaction pooler in front of the proxy?" in log
    # a proxy whose clients connect straight to it never says so
    assert "application_name changed mid-session" not in behind.proxy.stderr_path.read_text()
