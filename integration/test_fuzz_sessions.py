"""Session-level mutation fuzzing through the real proxy in front of the real
PostgreSQL 15: captured client sessions (fuzz/corpus/, recorded from psycopg,
node-postgres and LangGraph by integration/capture.py) are replayed with
mutations — bit flips, byte stores, truncations, splices from other sessions,
length-field edits, dropped / duplicated / swapped messages, and now and then a
mutated first packet — many at once. Afterwards the proxy must be alive and
serve ``select 1``, its stderr must hold no panic, its resident memory must
not have grown by more than 50 MB and its thread count must be back to where
it was.

Knobs: ``RG_FUZZ_SESSIONS`` (default 1000), ``RG_FUZZ_PARALLEL`` (16),
``RG_FUZZ_SEED`` (random; printed, so a failing run can be repeated).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

import lg_scenarios
import pgraw
from conftest import HOST, connect

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"
SESSIONS = int(os.environ.get("RG_FUZZ_SESSIONS", "1000"))
PARALLEL = int(os.environ.get("RG_FUZZ_PARALLEL", "16"))
SEED = int(os.environ.get("RG_FUZZ_SEED", str(random.SystemRandom().randrange(1 << 32))))
RSS_GROWTH_LIMIT_KB = 50 * 1024
# After the replayed stream: end any pipeline, leave any transaction, and ask
# for a marker row, so a session whose stream still frames ends as soon as the
# server answered everything.
END_MARKER = b"fuzz_end"
TAIL = pgraw.sync() + pgraw.query(f"rollback; select 1 as {END_MARKER.decode()}")


def load_corpus() -> list[tuple[str, bytes, bytes]]:
    """(name, first packets, typed messages) of every captured client stream."""
    out = []
    for path in sorted(CORPUS.glob("*.client")):
        data = path.read_bytes()
        at = 0
        while at + 8 <= len(data):
            n, code = struct.unpack_from(">iI", data, at)
            at += n
            if code not in (pgraw.SSL_REQUEST_CODE, pgraw.GSSENC_REQUEST_CODE):
                break
        # Without the client's Terminate, so the replay's tail is answered.
        typed = b"".join(f for f in frames(data[at:]) if f[:1] != b"X")
        out.append((path.stem, data[:at], typed))
    assert out, f"no captured sessions in {CORPUS}"
    return out


def frames(stream: bytes) -> list[bytes]:
    """Typed messages as long as their headers hold; the rest is one piece."""
    out, at = [], 0
    while at + 5 <= len(stream):
        (n,) = struct.unpack_from(">i", stream, at + 1)
        if n < 4 or at + 1 + n > len(stream):
            break
        out.append(stream[at:at + 1 + n])
        at += 1 + n
    if at < len(stream):
        out.append(stream[at:])
    return out


INTERESTING_LENGTHS = (0, 3, 4, 5, -1, 0x7FFFFFFF, -0x80000000, 0x40000000, 65536, 10001)


def mutate(rng: random.Random, stream: bytes, corpus: list[tuple[str, bytes, bytes]]) -> bytes:
    b = bytearray(stream)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2:
            del b[rng.randrange(len(b) + 1):]
        elif op == 3:
            src = rng.choice(corpus)[2]
            if src:
                s = rng.randrange(len(src))
                at = rng.randrange(len(b) + 1)
                b[at:at] = src[s:s + rng.randint(1, 200)]
        else:
            fs = frames(bytes(b))
            if not fs:
                continue
            i = rng.randrange(len(fs))
            if op == 4 and len(fs[i]) >= 5:
                f = bytearray(fs[i])
                f[1:5] = struct.pack(">i", rng.choice(INTERESTING_LENGTHS))
                fs[i] = bytes(f)
            elif op == 5:
                del fs[i]
            elif op == 6:
                fs.insert(i, fs[i])
            else:
                j = rng.randrange(len(fs))
                fs[i], fs[j] = fs[j], fs[i]
            b = bytearray(b"".join(fs))
    return bytes(b)


def replay(port: int, dbname: str, first: bytes, stream: bytes) -> str:
    """Sends one (mutated) session and reads until the end marker, the
    proxy's close, or 0.5 s of silence; returns how it ended."""
    try:
        sock = pgraw.connect(HOST, port, timeout=5)
    except OSError as e:
        return f"connect failed: {e}"
    try:
        if first:
            sock.sendall(first)
        else:
            sock.sendall(pgraw.startup_message("postgres", dbname, application_name="fuzz"))
        sock.settimeout(0.5)
        for piece in (stream[i:i + 4096] for i in range(0, len(stream), 4096)):
            sock.sendall(piece)
        sock.sendall(TAIL)
        got = bytearray()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return "closed"
            got += chunk
            if END_MARKER + b"\x00" in got:
                return "answered"
        return "deadline"
    except socket.timeout:
        return "silent"
    except OSError:
        return "reset"
    finally:
        sock.close()


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def settle(pid: int, threads: int, timeout: float = 20.0) -> dict[str, int]:
    """The proxy's status once its thread count is back to `threads` (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        st = proc_status(pid)
        if st["Threads"] <= threads or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def quiet(pid: int) -> dict[str, int]:
    """The proxy's status once the sessions just closed have gone (its
    thread count stopped falling)."""
    last = proc_status(pid)
    for _ in range(20):
        time.sleep(0.3)
        now = proc_status(pid)
        if now["Threads"] >= last["Threads"]:
            return now
        last = now
    return last


def select_one(dsn: str) -> None:
    with connect(dsn) as c:
        assert c.execute("select 1").fetchone() == (1,)


def test_mutated_sessions_leave_the_proxy_healthy(proxy, direct_dsn, proxy_dsn, dbname):
    corpus = load_corpus()
    lg_scenarios.setup_db("conn", direct_dsn)
    with psycopg.connect(direct_dsn, autocommit=True) as c:
        c.execute("create table if not exists fuzz_t (id int primary key, v text)")
        # A replayed migration waiting on a lock behind another replay must
        # not outlive its client: the server notices a closed client only
        # when it next writes to it.
        c.execute(f'alter database "{dbname}" set statement_timeout = \'2s\'')
        c.execute(f'alter database "{dbname}" set lock_timeout = \'1s\'')
    pid = proxy.proc.pid
    # Baseline after a few real sessions, so lazily created state is counted.
    for _ in range(5):
        select_one(proxy_dsn)
    before = quiet(pid)
    rng = random.Random(SEED)
    jobs = []
    for _ in range(SESSIONS):
        name, first, typed = rng.choice(corpus)
        mutated_first = rng.random() < 0.1
        jobs.append((name, mutate(rng, first, corpus) if mutated_first else b"", mutate(rng, typed, corpus)))
    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        endings = list(pool.map(lambda j: replay(proxy.port, dbname, j[1], j[2]), jobs))
    elapsed = time.monotonic() - started
    counts = {e: endings.count(e) for e in sorted(set(endings))}
    print(f"seed {SEED}: {SESSIONS} mutated sessions in {elapsed:.1f} s: {counts}")
    assert not [e for e in endings if e.startswith("connect failed")], (SEED, counts)

    assert proxy.alive(), f"proxy died (seed {SEED})\n{proxy.describe()}"
    select_one(proxy_dsn)
    after = settle(pid, before["Threads"])
    print(f"proxy before: {before}, after: {after}")
    stderr = proxy.stderr_path.read_text(errors="replace")
    assert "panicked" not in stderr, f"panic in the proxy's stderr (seed {SEED}):\n" + "\n".join(
        line for line in stderr.splitlines() if "panicked" in line)
    assert after["VmRSS"] - before["VmRSS"] < RSS_GROWTH_LIMIT_KB, (SEED, before, after)
    assert after["Threads"] <= before["Threads"], (SEED, before, after)
    assert after["fds"] <= before["fds"] + 2, (SEED, before, after)
    # The enforcement still works after the storm: a real LangGraph round trip.
    thread = f"fuzz-after-{SEED}"
    parked = lg_scenarios.park("conn", proxy_dsn, thread)
    assert parked["state"]["next"] == ["gate"], parked
    resumed = lg_scenarios.resume("conn", proxy_dsn, thread)
    assert resumed["result"]["approved"] is True, resumed


def unwatched_read(proxy, dbname: str, thread: str, malformed: bytes) -> list[bytes]:
    """Prepares the saver's read of a thread's head as `s1`, then sends
    `malformed`, a Bind / Describe / Execute / Sync of `s1` for `thread` and
    a `select 1`, pipelined in one small write; returns the message types
    the client got until the proxy closed or answered everything."""
    from langgraph.checkpoint.postgres.base import BasePostgresSaver

    sql = (BasePostgresSaver.SELECT_SQL
           + "WHERE thread_id = $1 AND checkpoint_ns = $2 ORDER BY checkpoint_id DESC LIMIT 1")
    s = pgraw.login(HOST, proxy.port, "postgres", dbname)
    s.send(pgraw.parse("s1", sql) + pgraw.sync())
    assert [t for t, _ in s.until_ready()] == [b"1", b"Z"]
    s.send(malformed + pgraw.bind("", "s1", [thread.encode(), b""], result_formats=(1,))
           + pgraw.describe_portal() + pgraw.execute() + pgraw.sync() + pgraw.query("select 1"))
    tags = []
    try:
        while tags.count(b"Z") < (3 if malformed else 2):
            tag, _ = s.read()
            tags.append(tag)
    except (EOFError, OSError):
        pass
    s.sock.close()
    return tags


def test_a_malformed_message_does_not_unwatch_a_checkpoint_read(proxy, direct_dsn, dbname):
    """A parked head read behind a malformed message must still be claimed
    (or the session closed before its row goes out)."""
    lg_scenarios.setup_db("conn", direct_dsn)
    control = f"fuzz-watch-{uuid.uuid4().hex[:6]}"
    lg_scenarios.park("conn", direct_dsn, control)
    tags = unwatched_read(proxy, dbname, control, b"")
    assert b"D" in tags, tags
    deadline = time.monotonic() + 10
    while not any(e["operation"] == "claim_taken" for e in proxy.audit(control)):
        assert time.monotonic() < deadline, proxy.audit(control)
        time.sleep(0.2)
    no_nul = b"Q" + struct.pack("!I", 4 + 8) + b"select 1"
    leaks = []
    for _ in range(3):
        thread = f"fuzz-unwatch-{uuid.uuid4().hex[:6]}"
        lg_scenarios.park("conn", direct_dsn, thread)
        tags = unwatched_read(proxy, dbname, thread, no_nul)
        if b"D" in tags and not any(e["operation"] == "claim_taken" for e in proxy.audit(thread)):
            leaks.append((thread, tags))
    assert not leaks, f"parked heads served without a claim: {leaks}"
