"""Connection edges a client meets before and after its work, on raw sockets,
each beside the same bytes straight to PostgreSQL: a client's own Terminate
is answered by a quiet close, bytes sent with the StartupMessage are served,
startup and authentication have one deadline however slowly bytes arrive,
and messages before authentication are small."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

import pgraw as R
from conftest import HOST, SCRAM_USER, SUPERUSER, connect


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
