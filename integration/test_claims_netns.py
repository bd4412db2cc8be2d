"""Consume-once across hosts, each proxy on a host of its own: two network
namespaces, each with its own network stack and one veth link to the root
namespace, where PostgreSQL listens. The proxies share nothing but the database
(claims in PostgreSQL, a state directory each) and reach it over their links, as
sidecars on two nodes would.

- racers spread over both proxies fire the gated node once per parked interrupt
  (N = 2, 4 x gate 0 / 300 ms) (the stock comparison, racers straight to
  PostgreSQL, is `test_claims_pg.py`'s);
- a partition: the link of the host whose racer holds the claim goes down; its
  proxy's liveness lock goes within `liveness_bound_ms` (server-side keepalives and
  `tcp_user_timeout`), and a racer on the other host takes the claim over and
  completes, where the claim's lapse (30 s) would have kept it refused.

Needs root and iproute2 (`netns.unavailable()` says why not, and the tests are
skipped with that reason); CI runs as root.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import netns as N
import racer as R
from conftest import PgServer, Proxy, make_dsn, port_accepts, proxy_binary, run_audit_cli
from test_claims_pg import ledger, race
from test_consume_once import one_resumer, park, wait_for_node

HERE = Path(__file__).resolve().parent
WHY_NOT = N.unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}")

GRACE_MS = 1000
LONG_LAPSE_MS = 30000
LIVENESS_BOUND_MS = 6000


class NsProxy(Proxy):
    """``resumeguard serve`` inside a namespace, listening on the namespace's
    address, its upstream the database across the link."""

    def __init__(self, ns: N.Namespace, pg_port: int, workdir: Path, name: str, extra=()):
        super().__init__(pg_port, workdir, name, tuple(extra))
        self.ns = ns

    @property
    def argv(self) -> list[str]:
        return self.ns.argv(
            str(proxy_binary()), "serve", "--listen", f"{self.ns.ip}:{self.port}",
            "--upstream", f"postgres://postgres@{self.ns.host_ip}:{self.upstream_port}/postgres",
            "--audit-db", str(self.audit_db), "--audit-jsonl", str(self.audit_jsonl),
            "--admin-listen", f"127.0.0.1:{self.port + 1}", *self.extra_args)

    def start(self) -> "NsProxy":
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=self.workdir)
        deadline = time.monotonic() + self.READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"proxy exited during startup ({self.proc.returncode})\n"
                            f"{self.describe()}")
            if port_accepts(self.port, self.ns.ip):
                return self
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"{self.name} did not accept on {self.ns.ip}:{self.port}\n{self.describe()}")

    def dsn(self, dbname: str = "postgres", **params) -> str:
        return make_dsn(self.port, dbname, **params).replace("@127.0.0.1:", f"@{self.ns.ip}:")


@pytest.fixture(scope="module")
def hosts(workdir):
    namespaces = [N.make(1), N.make(2)]
    pg = PgServer("netns").start()
    listen = ",".join(["127.0.0.1"] + [ns.host_ip for ns in namespaces])
    with open(pg.datadir / "postgresql.conf", "a") as f:
        f.write(f"listen_addresses = '{listen}'\n")
    with open(pg.datadir / "pg_hba.conf", "a") as f:
        f.write(f"host all all {N.SUBNET}.0.0/16 trust\n")
    pg._run([str(pg_bin() / "pg_ctl"), "-D", str(pg.datadir), "-l", str(pg.logfile), "-w",
             "-t", "60", "restart"])
    direct = pg.dsn("postgres")
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    R.CTX["ledger_dsn"] = direct
    R.CTX["ledger"] = None
    proxies: list[NsProxy] = []

    def start(ns: N.Namespace, name: str, lapse_ms: int = 3000) -> NsProxy:
        cfg = workdir / f"{name}.toml"
        cfg.write_text(
            f'[claims]\nproxy_id = "{name}"\nlapse_ms = {lapse_ms}\n'
            f'holder_gone_grace_ms = {GRACE_MS}\nliveness_bound_ms = {LIVENESS_BOUND_MS}\n')
        state = workdir / f"state-{name}-{uuid.uuid4().hex[:6]}"
        p = NsProxy(ns, pg.port, workdir, name,
                    ("--config", str(cfg), "--state-dir", str(state))).start()
        proxies.append(p)
        return p

    env = SimpleNamespace(direct=direct, dbname="postgres", workdir=workdir, ns=namespaces,
                          start=start)
    try:
        yield env
    finally:
        for p in proxies:
            p.stop()
        for ns in namespaces:
            ns.close()
        pg.stop()


def pg_bin() -> Path:
    from conftest import PG_BIN
    return Path(PG_BIN)


@pytest.mark.timeout(600)
def test_racers_on_two_hosts_sharing_only_the_database_fire_once(hosts):
    a = hosts.start(hosts.ns[0], "host-a")
    b = hosts.start(hosts.ns[1], "host-b")
    for n in (2, 4):
        fires = race(hosts, [a, b], n)
        print(f"postgres claims over two namespaces, N={n}: fires per gate {fires}")
        assert fires == {0: [1], 300: [1]}, fires


@pytest.mark.timeout(300)
def test_a_partitioned_holder_loses_its_claim_within_the_liveness_bound(hosts):
    a = hosts.start(hosts.ns[0], "part-a", lapse_ms=LONG_LAPSE_MS)
    b = hosts.start(hosts.ns[1], "part-b", lapse_ms=LONG_LAPSE_MS)
    thread = f"nsp-{uuid.uuid4().hex[:8]}"
    iid = park(a.dsn(hosts.dbname), thread)[0]["id"]
    victim = one_resumer(hosts, a.dsn(hosts.dbname), thread, "pv-", gate_ms=60000,
                         interrupt_id=iid)
    recovery = one_resumer(hosts, b.dsn(hosts.dbname), thread, "pr-", interrupt_id=iid)
    try:
        victim.ready(0)
        recovery.ready(0)
        victim.go(0)
        wait_for_node(hosts, thread, "gate")
        time.sleep(0.2)
        # Host A drops off the network: its link goes down (the proxy keeps running).
        subprocess.run(["ip", "link", "set", hosts.ns[0].veth, "down"], check=True)
        t_cut = time.time()
        _, r = recovery.go_and_finish()
    finally:
        victim.kill()
        recovery.kill()
        subprocess.run(["ip", "link", "set", hosts.ns[0].veth, "up"], check=False)
    latency = r["t_end"] - t_cut
    print(f"takeover through host B completed {latency * 1000:.0f} ms after host A's link "
          f"went down (liveness bound {LIVENESS_BOUND_MS} ms, grace {GRACE_MS} ms)")
    assert r["ok"], r
    assert [row[0] for row in ledger(hosts, thread)] == [victim.ids[0], recovery.ids[0]]
    # Far inside the claim's 30 s lapse: the liveness bound, the holder-gone grace and
    # the resume's own run.
    assert latency < (LIVENESS_BOUND_MS + GRACE_MS) / 1000 + 4.0, latency
    takeover = [e for e in run_audit_cli(b.audit_db, thread) if e["operation"] == "claim_takeover"]
    assert [e["application_name"] for e in takeover] == [f"racer-{recovery.ids[0]}"], takeover
