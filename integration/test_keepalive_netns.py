"""TCP keepalives and a user timeout on the data path: a primary that goes
silent — every packet it sends dropped on its link, no RST, no ICMP, as when
a switch dies — ends the sessions through the proxy within the bound
`[keepalive]` states, and the proxy stays healthy.

The database host is a network namespace: a relay inside it listens on the
namespace's address and hands each connection to PostgreSQL (a server of the
root namespace, through its Unix socket), so the proxy in the root namespace
reaches "the primary" over the veth link only. Silencing the namespace drops
everything it sends over that link.

Two sessions are open when the link goes: one idle (only keepalive probes can
notice), one that sends a query after it (its data goes unacknowledged: the
user timeout ends it). Both clients get FATAL 08006 within the bound; a
session opened after the link is back is served. Beside it, the same
scenario with keepalives off (`idle_ms = 0`, `user_timeout_ms = 0`, what the
proxy did before): the idle session is still open long after the bound.

The other side too: a client in a namespace whose host goes silent has its
session ended and its server connection closed within the bound (with
keepalives off, the backend stays).

Needs root and iproute2 (`netns.unavailable()` says why not; skipped then).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import netns as N
import pgraw as R
from conftest import HOST, SUPERUSER, PgServer, Proxy, connect

WHY_NOT = N.unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}")

# Short settings so the test is quick; the bound is user_timeout + interval.
KEEPALIVE = {"RESUMEGUARD_KEEPALIVE_IDLE_MS": "2000",
             "RESUMEGUARD_KEEPALIVE_INTERVAL_MS": "1000",
             "RESUMEGUARD_KEEPALIVE_COUNT": "2",
             "RESUMEGUARD_KEEPALIVE_USER_TIMEOUT_MS": "4000"}
BOUND_S = 4 + 1
# A loaded machine is slow to schedule; the bound is what the kernel keeps,
# the slack is for the test's own polling and the proxy's threads.
SLACK_S = 15
OFF = {"RESUMEGUARD_KEEPALIVE_IDLE_MS": "0", "RESUMEGUARD_KEEPALIVE_USER_TIMEOUT_MS": "0"}
FWD_PORT = 15432


@pytest.fixture
def primary_host():
    """(namespace, server) with the server reachable at namespace.ip:FWD_PORT."""
    ns = N.make(211)
    server = PgServer("keepalive").start()
    relay = ns.forward(FWD_PORT, str(server.tmp / f".s.PGSQL.{server.port}"))
    yield ns, server
    relay.kill()
    relay.wait(timeout=10)
    ns.close()
    server.stop()


def start_proxy(ns: N.Namespace, workdir: Path, name: str, env: dict[str, str]) -> Proxy:
    upstream = f"postgres://{SUPERUSER}@{ns.ip}:{FWD_PORT}/postgres?sslmode=disable"
    # Consume-once off (no claims connections): only the data path crosses the link.
    return Proxy(0, workdir, name, upstream=upstream,
                 env={**env, "RESUMEGUARD_ENFORCE_CONSUME_ONCE": "false"}).start()


def ended_within(session: R.Session, seconds: float) -> tuple[bool, list[dict[str, str]]]:
    """Whether the proxy closed `session` within `seconds`, and its errors."""
    try:
        data = R.read_until_eof(session.sock, seconds)
    except TimeoutError:
        return False, []
    return True, [R.parse_error_fields(p) for t, p in R.split_messages(data) if t == b"E"]


def healthz(proxy: Proxy) -> int:
    with urllib.request.urlopen(f"{proxy.admin_url()}/healthz", timeout=30) as r:
        return r.status


def test_a_silent_primary_ends_its_sessions_within_the_bound(primary_host, workdir):
    ns, _server = primary_host
    proxy = start_proxy(ns, workdir, "proxy-keepalive", KEEPALIVE)
    idle = R.login(HOST, proxy.port, SUPERUSER, "postgres")
    busy = R.login(HOST, proxy.port, SUPERUSER, "postgres")
    assert idle.simple_query("SELECT 1")[0] == [[b"1"]]
    assert busy.simple_query("SELECT 1")[0] == [[b"1"]]

    ns.silence()
    silenced = time.monotonic()
    try:
        busy.send(R.query("SELECT 2"))  # forwarded, never acknowledged
        ended, errors = ended_within(idle, BOUND_S + SLACK_S)
        idle_after = time.monotonic() - silenced
        assert ended, f"idle session still open {idle_after:.0f}s after the link went silent"
        assert any(e.get("C") == "08006" and "lost the upstream connection" in e.get("M", "")
                   for e in errors), errors
        ended, errors = ended_within(busy, max(1.0, BOUND_S + SLACK_S - idle_after))
        busy_after = time.monotonic() - silenced
        assert ended, f"busy session still open {busy_after:.0f}s after the link went silent"
        assert any(e.get("C") == "08006" for e in errors), errors
        assert proxy.alive(), proxy.describe()
    finally:
        ns.unsilence()
    # Healthy: a new session through the same proxy is served.
    fresh = R.login(HOST, proxy.port, SUPERUSER, "postgres")
    assert fresh.simple_query("SELECT 3")[0] == [[b"3"]]
    fresh.close()
    assert healthz(proxy) == 200
    print(json.dumps({"idle_ended_s": round(idle_after, 1), "busy_ended_s": round(busy_after, 1),
                      "bound_s": BOUND_S}))
    assert proxy.stop() == 0, proxy.describe()


def test_without_keepalives_an_idle_session_outlives_the_bound(primary_host, workdir):
    """What the proxy did before `[keepalive]`, set by turning it off: the
    idle session of a silent primary stays open (until the kernel's own
    defaults, two hours for keepalives, if they were on at all)."""
    ns, _server = primary_host
    proxy = start_proxy(ns, workdir, "proxy-no-keepalive", OFF)
    idle = R.login(HOST, proxy.port, SUPERUSER, "postgres")
    assert idle.simple_query("SELECT 1")[0] == [[b"1"]]
    ns.silence()
    try:
        ended, _ = ended_within(idle, BOUND_S + 5)
        assert not ended, "the idle session ended although keepalives were off"
    finally:
        ns.unsilence()
    idle.close()
    assert proxy.stop() == 0, proxy.describe()


class ListeningEverywhere(Proxy):
    """``resumeguard serve`` on every address: loopback (where `start` looks)
    and the namespace link's root end (where the client comes from)."""

    @property
    def argv(self) -> list[str]:
        argv = super().argv
        argv[argv.index("--listen") + 1] = f"0.0.0.0:{self.port}"
        return argv


CLIENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import pgraw as R
s = R.login(sys.argv[2], int(sys.argv[3]), "postgres", "postgres",
            application_name="rg-keepalive-client")
s.simple_query("SELECT 1")
print("ready", flush=True)
time.sleep(600)
"""


def client_backends(server: PgServer) -> int:
    with connect(server.dsn("postgres")) as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity "
                         "WHERE application_name = 'rg-keepalive-client'").fetchone()[0]


@pytest.mark.parametrize("keepalive", ["on", "off"])
def test_a_vanished_client_frees_its_server_connection(workdir, keepalive):
    """The client's host goes silent (every packet it sends dropped): with
    keepalives the proxy ends the session and its server connection closes
    within the bound; with them off (as before) the backend stays."""
    ns = N.make(212)
    server = PgServer("keepalive-client").start()
    env = {**(KEEPALIVE if keepalive == "on" else OFF), "RESUMEGUARD_ENFORCE_CONSUME_ONCE": "false"}
    proxy = ListeningEverywhere(server.port, workdir, f"proxy-ka-client-{keepalive}", env=env)
    client = None
    try:
        proxy.start()
        client = subprocess.Popen(
            ns.argv(sys.executable, "-c", CLIENT, str(Path(__file__).parent), ns.host_ip,
                    str(proxy.port)), stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None and client.stdout.readline().strip() == "ready"
        assert client_backends(server) == 1
        ns.silence()
        silenced = time.monotonic()
        deadline = silenced + BOUND_S + SLACK_S
        while client_backends(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = client_backends(server)
        if keepalive == "on":
            assert left == 0, (f"server connection still open "
                               f"{time.monotonic() - silenced:.0f}s after the client went silent")
        else:
            assert left == 1, "the server connection closed although keepalives were off"
        assert proxy.alive(), proxy.describe()
        ns.unsilence()
        fresh = R.login(ns.host_ip, proxy.port, SUPERUSER, "postgres")
        assert fresh.simple_query("SELECT 4")[0] == [[b"4"]]
        fresh.close()
        assert proxy.stop() == 0, proxy.describe()
    finally:
        if client is not None:
            client.kill()
            client.wait(timeout=10)
        if proxy.alive():
            proxy.kill()
        ns.close()
        server.stop()
