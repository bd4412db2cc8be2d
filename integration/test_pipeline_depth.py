"""Deep pipelines through the proxy, on raw sockets against real PostgreSQL 15,
each beside the same bytes straight to PostgreSQL: one Parse, N Bind/Execute
groups, one Sync, sent by one thread while another reads the answers.

The proxy's work per message must not grow with the number of messages still
waiting for their answers: its CPU time (utime + stime of the whole process,
from /proc/PID/stat) for 100,000 groups stays within 3x of ten times its CPU
time for 10,000. A tracker that walks every unanswered message per Bind and
Execute fails this by far (its CPU grows with the square of the depth). An
error deep in a pipeline skips the rest of its segment as PostgreSQL does,
and psycopg's pipelined `executemany` stores every row.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import Counter

import pgraw as R
from conftest import HOST, SUPERUSER, connect, cpu_seconds

# Generous on a loaded 2-core machine: the direct run takes ~1 s.
DEEP_PIPELINE_DEADLINE_S = 120.0
# CPU below this is clock-tick noise: the shallow run's CPU is counted as at
# least this much, so the ratio cannot blow up on a tiny denominator.
CPU_FLOOR_S = 0.05

PARSE = R.parse("pd", "SELECT $1::int4")
GROUP = R.bind("", "pd", [b"7"]) + R.execute("")
BAD_GROUP = R.bind("", "pd", [b"not a number"]) + R.execute("")


def tags_of(data: bytes) -> dict[str, int]:
    return dict(Counter(tag.decode() for tag, _ in R.split_messages(data)))


def pipeline(port: int, dbname: str, payload: bytes, readies: int,
             deadline_s: float = DEEP_PIPELINE_DEADLINE_S) -> tuple[dict[str, int], float]:
    """Sends `payload` from a thread and reads until `readies` ReadyForQuery
    arrived: the answers' message counts, and the wall time."""
    sess = R.login(HOST, port, SUPERUSER, dbname)
    sock = sess.sock
    sock.settimeout(deadline_s)
    failed: list[BaseException] = []

    def send():
        try:
            sock.sendall(payload)
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    sender = threading.Thread(target=send, daemon=True)
    t0 = time.monotonic()
    sender.start()
    chunks = []
    seen = 0
    tail = b""
    try:
        while seen < readies:
            assert time.monotonic() - t0 < deadline_s, (
                f"{len(payload)} bytes of pipeline not answered within {deadline_s} s")
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                raise AssertionError(f"no answer for {deadline_s} s")
            assert chunk, "connection closed mid-pipeline"
            chunks.append(chunk)
            # ReadyForQuery is the only message whose bytes look like this
            # here (the rows are one int4 '7').
            window = tail + chunk
            seen += sum(window.count(b"Z\0\0\0\x05" + s) for s in (b"I", b"T", b"E"))
            tail = chunk[-5:]
        wall = time.monotonic() - t0
    finally:
        sender.join(timeout=30)
        sess.close()
    assert not failed, f"sending the pipeline failed: {failed[0]!r}"
    return tags_of(b"".join(chunks)), wall


def groups(n: int) -> bytes:
    return PARSE + GROUP * n + R.sync()


def proxied_cpu(proxy, dbname: str, n: int) -> float:
    before = cpu_seconds(proxy.proc.pid)
    tags, _ = pipeline(proxy.port, dbname, groups(n), readies=1)
    assert (tags.get("2"), tags.get("C"), tags.get("E")) == (n, n, None), tags
    return cpu_seconds(proxy.proc.pid) - before


def test_100k_pipelined_groups_cost_the_proxy_linear_cpu(proxy, pg, dbname):
    n = 100_000
    direct, _ = pipeline(pg.port, dbname, groups(n), readies=1)
    assert (direct.get("2"), direct.get("C")) == (n, n), direct
    proxied_cpu(proxy, dbname, 10_000)  # warm the session path
    shallow = statistics.median(proxied_cpu(proxy, dbname, 10_000) for _ in range(3))
    deep = proxied_cpu(proxy, dbname, n)
    per_10k = max(shallow, CPU_FLOOR_S)
    assert deep < 3 * 10 * per_10k, (
        f"proxy CPU {deep:.2f} s for {n} groups vs {shallow:.3f} s for 10,000: "
        f"{deep / per_10k:.0f}x for ten times the messages (linear is ~10x)")


def test_an_error_deep_in_a_pipeline_skips_to_its_sync_as_postgres_does(proxy, pg, dbname):
    # Three segments: 30,000 groups with a failing Bind at 20,000 (the rest
    # of its segment is skipped), 20,000 groups, then one more group.
    payload = (PARSE + GROUP * 20_000 + BAD_GROUP + GROUP * 9_999 + R.sync()
               + GROUP * 20_000 + R.sync() + GROUP + R.sync())
    direct, _ = pipeline(pg.port, dbname, payload, readies=3)
    proxied, _ = pipeline(proxy.port, dbname, payload, readies=3)
    assert direct == {"1": 1, "2": 40_001, "D": 40_001, "C": 40_001, "E": 1, "Z": 3}, direct
    assert proxied == direct


def test_executemany_of_40k_rows_in_pipeline_mode_stores_every_row(proxy_dsn, direct_dsn):
    import psycopg

    assert psycopg.Pipeline.is_supported()
    rows = [(i, f"row {i}") for i in range(40_000)]
    for dsn in (direct_dsn, proxy_dsn):
        with connect(dsn) as c:
            c.execute("DROP TABLE IF EXISTS pipeline_rows")
            c.execute("CREATE TABLE pipeline_rows (id int, label text)")
            with c.cursor() as cur:
                cur.executemany("INSERT INTO pipeline_rows (id, label) VALUES (%s, %s)", rows)
            got = c.execute("SELECT count(*), count(DISTINCT id), max(label) FROM pipeline_rows").fetchone()
            assert got == (40_000, 40_000, "row 9999"), (dsn, got)
