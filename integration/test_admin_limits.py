"""The admin listener cannot starve the data path: under RLIMIT_NOFILE 256,
600 half-sent HTTP requests to the admin port leave PostgreSQL clients
connecting and querying through the proxy. The admin side holds at most its
connection cap of descriptors (``/proc/PID/fd``): the connections past the cap
are answered 503 and closed at once, the ones it took are closed at the header
deadline, and then it is back to its baseline while the peers still hold
their ends open."""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
import urllib.request

import pytest

from conftest import HOST, Proxy, connect, free_port, port_accepts

NOFILE = 256
HALF_SENT = 600
# The default [admin] max_connections, and a quarter of NOFILE.
ADMIN_CAP = 64
# The admin listener's header deadline (src/admin/http/connections.rs).
HEADER_DEADLINE_S = 5.0
CLIENTS = 30


class LimitedProxy(Proxy):
    """``resumeguard serve`` started under ``prlimit --nofile``, which execs
    it: the pid is the proxy's."""

    @property
    def argv(self) -> list[str]:
        return ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--", *super().argv]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile_of(pid: int) -> tuple[int, int]:
    text = open(f"/proc/{pid}/limits").read()
    m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", text, re.M)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def closed_by_peer(socks: list[socket.socket]) -> int:
    """How many of `socks` (non-blocking) the other side has closed; what
    they were sent is read and dropped."""
    closed = 0
    for s in socks:
        try:
            while s.recv(4096):
                pass
            closed += 1
        except BlockingIOError:
            pass
        except OSError:  # reset
            closed += 1
    return closed


def answered_503(socks: list[socket.socket]) -> int:
    """How many of `socks` were sent a 503 (read without consuming it)."""
    readable, _, _ = select.select(socks, [], [], 0)
    n = 0
    for s in readable:
        try:
            n += s.recv(64, socket.MSG_PEEK).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
    return n


def clients_query(port_dsn: str, n: int) -> list[str]:
    """`n` concurrent clients connect through the proxy and query; the errors."""
    errors: list[str] = []

    def client(i: int) -> None:
        try:
            with connect(port_dsn) as c:
                assert c.execute("select %s::int", (i,)).fetchone() == (i,)
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors


@pytest.fixture
def limited(pg, workdir):
    admin_port = free_port()
    p = LimitedProxy(pg.port, workdir, "proxy-admin-limits",
                     ("--admin-listen", f"{HOST}:{admin_port}")).start()
    p.admin_port = admin_port
    yield p
    was_alive = p.alive()
    rc = p.stop()
    assert was_alive and rc == 0, f"rc={rc}\n{p.describe()}"


def test_half_sent_admin_requests_leave_the_data_path_serving(limited, dbname):
    pid = limited.proc.pid
    assert nofile_of(pid) == (NOFILE, NOFILE)
    deadline = time.monotonic() + 10
    while not port_accepts(limited.admin_port):
        assert time.monotonic() < deadline, limited.describe()
        time.sleep(0.05)
    time.sleep(0.2)
    baseline = open_fds(pid)

    socks = []
    try:
        for _ in range(HALF_SENT):
            s = socket.create_connection((HOST, limited.admin_port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: admin\r\n")  # the head never ends
            s.setblocking(False)
            socks.append(s)
        flooded_at = time.monotonic()
        time.sleep(1.0)
        assert open_fds(pid) - baseline <= ADMIN_CAP + 2, (baseline, open_fds(pid))
        refused = answered_503(socks)
        assert refused >= HALF_SENT - ADMIN_CAP - 2, f"{refused} answered 503"

        errors = clients_query(limited.dsn(dbname), CLIENTS)
        assert not errors, errors[:5]
        # Once the clients' sessions have closed, the admin side still holds
        # no more than its cap.
        settle = time.monotonic() + 3
        while open_fds(pid) - baseline > ADMIN_CAP + 2:
            assert time.monotonic() < settle, (baseline, open_fds(pid))
            time.sleep(0.1)

        # The header deadline closes the ones taken; the peers keep theirs open.
        while closed_by_peer(socks) < HALF_SENT or open_fds(pid) > baseline + 2:
            assert time.monotonic() - flooded_at < HEADER_DEADLINE_S + 5, (
                closed_by_peer(socks), baseline, open_fds(pid))
            time.sleep(0.25)
    finally:
        for s in socks:
            s.close()
    with urllib.request.urlopen(f"http://{HOST}:{limited.admin_port}/healthz", timeout=10) as r:
        assert r.status == 200
    assert not clients_query(limited.dsn(dbname), 5)
