"""Captures real client sessions, byte for byte, as the fuzz seed corpus.

A loopback TCP tee sits in front of a throwaway PostgreSQL 15 (conftest's
``PgServer``) and records both directions of every connection. Through it run
the LangGraph saver scenarios (psycopg: conn, pool, async, pipeline, pool_tx),
LangGraph.js over node-postgres (when ``integration/js/node_modules`` exists)
and plain psycopg traffic (simple, extended, prepared, errors, transactions,
COPY). Each connection becomes ``fuzz/corpus/<scenario>-<n>.client`` (what the
client sent: first packets then typed messages) and ``.server`` (what
PostgreSQL answered), cut at a message boundary to stay small.

    PG_BIN=/usr/lib/postgresql/15/bin .venv/bin/python integration/capture.py [--out fuzz/corpus]

Used by tests/fuzz_wire.rs (the in-process harness) and
integration/test_fuzz_sessions.py (mutated replays through the real proxy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402

import lg_scenarios  # noqa: E402
from conftest import HOST, PgServer, make_dsn  # noqa: E402

# Per stream, the cut is the last message boundary under this many bytes.
MAX_STREAM_BYTES = 24 * 1024
# Connections kept per scenario (those that touched checkpoint tables first).
MAX_CONNECTIONS = 3


class Tee:
    """Forwards loopback connections to ``upstream_port`` and records each
    direction of each connection."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.sessions: list[tuple[bytearray, bytearray]] = []
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection((HOST, self.upstream_port))
            up, down = bytearray(), bytearray()
            with self.lock:
                self.sessions.append((up, down))
            for src, dst, rec in ((client, server, up), (server, client, down)):
                t = threading.Thread(target=self._pump, args=(src, dst, rec), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, rec: bytearray) -> None:
        try:
            while chunk := src.recv(65536):
                rec.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def take(self) -> list[tuple[bytes, bytes]]:
        """The sessions recorded so far (waits for their relays to finish)."""
        for t in list(self.threads):
            t.join(timeout=10)
        with self.lock:
            taken = [(bytes(u), bytes(d)) for u, d in self.sessions]
            self.sessions.clear()
            self.threads.clear()
        return taken

    def close(self) -> None:
        self.sock.close()


def first_packets_len(stream: bytes) -> int:
    """Bytes of the untyped first packets (SSLRequest/GSSENCRequest, then
    the StartupMessage) at the front of a client stream."""
    at = 0
    while len(stream) >= at + 8:
        (n,) = struct.unpack_from(">i", stream, at)
        (code,) = struct.unpack_from(">I", stream, at + 4)
        at += n
        if code not in (80877103, 80877104):
            break
    return at


def cut(stream: bytes, start: int, limit: int) -> bytes:
    """``stream`` up to its last typed-message boundary under ``limit``."""
    at = start
    while at + 5 <= len(stream):
        (n,) = struct.unpack_from(">i", stream, at + 1)
        if at + 1 + n > limit:
            break
        at += 1 + n
    return stream[:at]


def server_start(stream: bytes) -> int:
    """The 'N' answers to SSL/GSSENC requests before the typed messages (the
    server's first typed message is an Authentication 'R')."""
    at = 0
    while stream[at:at + 1] == b"N":
        at += 1
    return at


def save(out: Path, scenario: str, sessions: list[tuple[bytes, bytes]]) -> int:
    useful = [s for s in sessions if len(s[0]) > 8]
    useful.sort(key=lambda s: (b"checkpoint" not in s[0], -len(s[0])))
    written = 0
    for i, (up, down) in enumerate(useful[:MAX_CONNECTIONS]):
        client = cut(up, first_packets_len(up), MAX_STREAM_BYTES)
        server = cut(down, server_start(down), MAX_STREAM_BYTES)
        (out / f"{scenario}-{i}.client").write_bytes(client)
        (out / f"{scenario}-{i}.server").write_bytes(server)
        written += len(client) + len(server)
    return written


def plain_psycopg(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("select 1")
        c.execute("select %s::int + %s", (1, 2))
        c.execute("create table if not exists fuzz_t (id int primary key, v text)")
        for i in range(3):
            c.execute("insert into fuzz_t values (%s, %s) on conflict (id) do update set v = excluded.v",
                      (i, f"v{i}"), prepare=True)
        c.execute("select * from fuzz_t where id = %s", (1,), binary=True)
        with c.cursor() as cur:
            with cur.copy("copy fuzz_t (id, v) to stdout") as cp:
                for _ in cp:
                    pass
        try:
            c.execute("select * from no_such_table")
        except psycopg.Error:
            pass
        with c.transaction():
            c.execute("select count(*) from fuzz_t")
        c.execute("select 1; select 2")
        with c.pipeline():
            c.execute("select %s", (1,))
            c.execute("select %s", (2,))


def node_scenarios(dsn: str) -> list[str] | None:
    js = HERE / "js"
    if not (js / "node_modules").exists() or not shutil.which("node"):
        return None
    thread = f"cap-js-{uuid.uuid4().hex[:6]}"
    steps = [["setup"], ["park", "--thread", thread], ["state", "--thread", thread],
             ["resume", "--thread", thread]]
    return [" ".join(s) for s in steps if subprocess.run(
        ["node", str(js / "lg.mjs"), s[0], "--dsn", dsn, *s[1:]], cwd=js,
        capture_output=True, timeout=120).returncode == 0] or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE.parent / "fuzz" / "corpus"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pg = PgServer("capture").start()
    tee = Tee(pg.port)
    total = 0
    try:
        with psycopg.connect(pg.dsn("postgres"), autocommit=True) as c:
            c.execute("create database capture")
        dsn = make_dsn(tee.port, "capture")
        runs = [(f"psycopg-lg-{kind}", lambda kind=kind: lg_scenarios.full_scenario(
            kind, dsn, f"cap-{kind}-{uuid.uuid4().hex[:6]}")) for kind in lg_scenarios.ALL_SAVER_KINDS]
        runs.append(("psycopg-plain", lambda: plain_psycopg(dsn)))
        runs.append(("node-pg-lg", lambda: node_scenarios(dsn)))
        for name, run in runs:
            result = run()
            sessions = tee.take()
            if result is None and name.startswith("node"):
                print(f"{name}: skipped (no node or integration/js/node_modules)")
                continue
            n = save(out, name, sessions)
            total += n
            print(f"{name}: {len(sessions)} connections, {n} bytes kept")
    finally:
        tee.close()
        pg.stop()
    print(f"corpus: {total} bytes in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
