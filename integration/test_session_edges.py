"""Connection edges a client meets before and after its work, on raw sockets,
each beside the same bytes straight to PostgreSQL: a client's own Terminate
is answered by a quiet close, and so is one sent before any StartupMessage
(node-postgres's connect() then end()); a client that half-closes after its
messages still gets every answer; a protocol 2.0 startup gets PostgreSQL's
own answer; bytes sent with the StartupMessage are served, startup and
authentication have one deadline however slowly bytes arrive, and messages
before authentication are small."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import pgraw as R
from conftest import HOST, SCRAM_USER, SUPERUSER, connect

JS_DIR = Path(__file__).resolve().parent / "js"
NODE = os.environ.get("RG_NODE") or shutil.which("node")


@pytest.fixture(scope="module")
def slow_proxy(proxy_factory, workdir):
    cfg = workdir / "edges.toml"
    cfg.write_text("startup_timeout_ms = 2000\n")
    return proxy_factory("--config", str(cfg), name="proxy-edges")


def read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return out + b"<timeout>"
        except ConnectionResetError:
            return out + b"<reset>"
        if not chunk:
            return out
        out += chunk


@pytest.mark.parametrize("target", ["direct", "proxy"])
def test_terminate_is_answered_by_a_quiet_close(target, pg, proxy, dbname):
    port = pg.port if target == "direct" else proxy.port
    for _ in range(50):
        s = R.login(HOST, port, SUPERUSER, dbname)
        s.send(R.terminate())
        after = read_all(s.sock)
        s.sock.close()
        assert after == b"", f"{target}: bytes after Terminate: {after[:200]!r}"


def half_closed(port: int, data: bytes) -> bytes:
    """Sends `data`, half-closes (SHUT_WR), and reads until the peer closes."""
    sock = R.connect(HOST, port)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    out = read_all(sock, timeout=10)
    sock.close()
    return out


def shape(data: bytes) -> list[tuple[bytes, bytes]]:
    """The messages, all of them whole, each backend's own key masked."""
    msgs = R.split_messages(data)
    whole = sum(5 + len(p) for _, p in msgs)
    assert whole == len(data), f"not whole messages: {data[whole:][:200]!r}"
    return [(tag, b"<key>" if tag == b"K" else payload) for tag, payload in msgs]


@pytest.mark.parametrize("first", [R.terminate(), R.terminate() + R.startup_message(SUPERUSER, "postgres")],
                         ids=["terminate", "terminate-then-startup"])
@pytest.mark.parametrize("target", ["direct", "proxy"])
def test_a_terminate_before_the_startup_is_closed_without_a_word(target, first, pg, proxy):
    """PostgreSQL reads the Terminate's first four bytes as a length word out of
    range, logs it and closes without a word."""
    port = pg.port if target == "direct" else proxy.port
    for _ in range(10):
        sock = R.connect(HOST, port)
        sock.sendall(first)
        after = read_all(sock)
        sock.close()
        assert after == b"", f"{target}: {after[:200]!r}"


def test_node_postgres_connect_then_end_closes_cleanly(pg, proxy, dbname):
    """node-postgres's own quick-disconnect test, 20 times each way: its
    Terminate goes out before the StartupMessage, and an `error` event (which
    kills a process without a listener) must not come."""
    if NODE is None:
        pytest.fail("node is not installed: node-postgres is NOT tested")
    if not (JS_DIR / "node_modules" / "pg").is_dir():
        pytest.fail(f"{JS_DIR}/node_modules has no pg: run `npm ci` there")
    results = {}
    for target, port in (("direct", pg.port), ("proxy", proxy.port)):
        cfg = {"host": HOST, "port": port, "user": SUPERUSER, "database": dbname}
        cp = subprocess.run([NODE, "quick_disconnect.mjs", json.dumps(cfg), "20"], cwd=JS_DIR,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, f"{target}: node exited {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
        results[target] = json.loads(cp.stdout.strip().splitlines()[-1])
    assert results["direct"]["clean"] == 20, results["direct"]
    assert results["proxy"]["clean"] == 20, results["proxy"]
    assert "closed connection start without a word" in proxy.stderr_path.read_text()


HALF_CLOSED = {
    "login": lambda db: R.startup_message(SUPERUSER, db),
    "scram-login": lambda db: R.startup_message(SCRAM_USER, db),
    "query": lambda db: R.startup_message(SUPERUSER, db)
    + R.query("select 1 as a, 'x' as b; select generate_series(1, 3)"),
    "query-error": lambda db: R.startup_message(SUPERUSER, db) + R.query("select 1/0"),
    "extended": lambda db: R.startup_message(SUPERUSER, db)
    + R.parse("", "select $1::int * 2") + R.bind("", "", [b"21"]) + R.describe_portal()
    + R.execute() + R.sync() + R.parse("", "selct") + R.sync(),
    "query-without-sync": lambda db: R.startup_message(SUPERUSER, db)
    + R.query("select 7") + R.parse("", "select 8") + R.bind("", "") + R.execute(),
}


@pytest.mark.parametrize("case", list(HALF_CLOSED))
def test_a_half_closed_client_gets_every_answer(case, pg, proxy, dbname):
    """Messages, then shutdown(SHUT_WR): PostgreSQL answers everything it was
    sent, then sees the end and closes. The proxy passes the half-close on and
    relays until the server closes: the same messages (the backend key aside)."""
    data = HALF_CLOSED[case](dbname)
    direct = shape(half_closed(pg.port, data))
    proxied = shape(half_closed(proxy.port, data))
    assert direct, "PostgreSQL answered nothing"
    assert proxied == direct


@pytest.mark.parametrize("major, minor", [(2, 0), (1, 0), (4, 0)])
def test_an_unsupported_protocol_gets_postgresqls_own_answer(major, minor, pg, proxy, dbname):
    """PostgreSQL answers a 2.0 startup in protocol 2.0 (`E`, text, NUL) and a 4.0
    one with an ErrorResponse; through the proxy the bytes are the same."""
    packet = R.startup_message(SUPERUSER, dbname, version=R.version_code(major, minor))
    answers = {}
    for target, port in (("direct", pg.port), ("proxy", proxy.port)):
        sock = R.connect(HOST, port)
        sock.sendall(packet)
        answers[target] = read_all(sock)
        sock.close()
    expected_start = b"EFATAL:  unsupported frontend protocol" if major < 3 else b"E\x00"
    assert answers["direct"].startswith(expected_start), answers
    assert answers["proxy"] == answers["direct"]


@pytest.mark.parametrize("target", ["direct", "proxy"])
def test_a_query_sent_with_the_startup_message_is_served(target, pg, proxy, dbname):
    port = pg.port if target == "direct" else proxy.port
    sock = R.connect(HOST, port)
    sock.sendall(R.startup_message(SUPERUSER, dbname) + R.query("select 41 + 1"))
    sock.settimeout(10)
    rows = []
    while True:
        tag, payload = R.read_message(sock)
        if tag == b"E":
            pytest.fail(f"{target}: {R.parse_error_fields(payload)}")
        if tag == b"D":
            rows.append(R.decode_datarow(payload))
        if tag == b"Z" and rows:
            break
    assert rows == [[b"42"]]
    sock.sendall(R.terminate())
    sock.close()


def dribble(port: int, data: bytes, every: float, stop: threading.Event) -> float:
    """Send `data` a byte at a time; return seconds until the peer closed."""
    sock = socket.create_connection((HOST, port))
    start = time.monotonic()
    try:
        for b in data:
            if stop.is_set():
                break
            sock.sendall(bytes([b]))
            time.sleep(every)
        sock.settimeout(10)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    finally:
        sock.close()
    return time.monotonic() - start


def test_a_dribbled_startup_is_closed_at_the_deadline(slow_proxy, dbname):
    """One byte every 0.3 s never trips a per-read timeout; the 2 s deadline
    for the whole startup closes it, while real clients connect throughout."""
    stop = threading.Event()
    results: list[float] = []
    packet = R.startup_message(SUPERUSER, dbname) * 5
    threads = [threading.Thread(target=lambda: results.append(dribble(slow_proxy.port, packet, 0.3, stop)))
               for _ in range(5)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            with connect(slow_proxy.dsn(dbname)) as c:
                assert c.execute("select 1").fetchone() == (1,)
            time.sleep(0.3)
    finally:
        for t in threads:
            t.join(timeout=20)
        stop.set()
    assert len(results) == 5
    assert all(1.5 < r < 4.5 for r in results), results


def test_a_dribbled_authentication_is_closed_at_the_deadline(slow_proxy, dbname):
    """The StartupMessage arrives at once, the password message a byte at a
    time: the same deadline covers authentication."""
    sock = R.connect(HOST, slow_proxy.port)
    sock.sendall(R.startup_message(SCRAM_USER, dbname))
    tag, _ = R.read_message(sock)
    assert tag == b"R"
    start = time.monotonic()
    body = R.cstr("SCRAM-SHA-256") + struct.pack("!i", 8) + b"n,,n=,r="
    message = b"p" + struct.pack("!i", len(body) + 4) + body
    try:
        for b in message:
            sock.sendall(bytes([b]))
            time.sleep(0.3)
    except OSError:
        pass
    rest = read_all(sock, timeout=10)
    elapsed = time.monotonic() - start
    sock.close()
    assert elapsed < 4.5, elapsed
    assert b"authentication timed out" in rest or rest in (b"", b"<reset>"), rest[:200]


def test_a_large_message_before_authentication_is_refused_unread(proxy, dbname):
    """A password message declaring 300 MB is refused from its header."""
    sock = R.connect(HOST, proxy.port)
    sock.sendall(R.startup_message(SCRAM_USER, dbname))
    tag, _ = R.read_message(sock)
    assert tag == b"R"
    sock.sendall(b"p" + struct.pack("!i", 300 * 1024 * 1024) + b"x" * 1024)
    rest = read_all(sock, timeout=10)
    sock.close()
    assert b"08P01" in rest and b"above the limit" in rest, rest[:300]
