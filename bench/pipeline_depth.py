#!/usr/bin/env python3
"""Deep pipelines through resumeguard: wall time against a direct
connection, and the proxy's CPU time, as the pipeline gets deeper.

Starts a throwaway PostgreSQL 15 and one `resumeguard serve` (default
arguments, every enforcement leg on) on loopback, with bench/bench.py's
process helpers, then measures, direct and through the proxy, interleaved:

  groups    one Parse of a named statement, N Bind/Execute groups and one
            Sync, hand-built and sent by one thread while another reads the
            answers (N = --depths, default 10,000 / 100,000 / 300,000)
  executemany
            psycopg `executemany` of --rows rows (default 40,000) into a
            table, which psycopg sends in pipeline mode

The proxy's CPU time (utime + stime of the whole process, from
/proc/PID/stat) is read before and after each proxied run; its growth with N
says whether the proxy's work per message depends on the pipeline's depth.
A pipeline that does not finish within --timeout seconds is reported as
such (with the CPU time it used), its connection dropped and the proxy
restarted for the next run.

    /work/main/.venv/bin/python bench/pipeline_depth.py            # ~3 min
    ... --binary /tmp/old-resumeguard --rounds 1 --timeout 120     # an older build
    ... --perf bench/results/pipeline-depth-perf.txt               # + perf profile

Needs psycopg (the integration venv) and, as root, the postgres OS user.
Writes <out>/<name>.json and <out>/<name>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - the suite's process helpers, stdlib only

HOST, USER, DB = bench.HOST, bench.USER, bench.DB
# The target: a deep pipeline through the proxy within this much of direct.
WALL_RATIO_TARGET = 1.5


def msg(tag: bytes, body: bytes = b"") -> bytes:
    return tag + struct.pack("!i", len(body) + 4) + body


def pipeline_bytes(n: int) -> bytes:
    """Parse of a named statement, `n` Bind/Execute groups, one Sync."""
    parse = msg(b"P", b"pd\0SELECT $1::int4\0" + struct.pack("!h", 0))
    bind = msg(b"B", b"\0pd\0" + struct.pack("!hhi", 0, 1, 1) + b"7" + struct.pack("!h", 0))
    execute = msg(b"E", b"\0" + struct.pack("!i", 0))
    return parse + (bind + execute) * n + msg(b"S")


def count_messages(data: bytes) -> dict[str, int]:
    counts: dict[str, int] = {}
    i = 0
    while i + 5 <= len(data):
        tag = chr(data[i])
        (length,) = struct.unpack_from("!i", data, i + 1)
        counts[tag] = counts.get(tag, 0) + 1
        i += 1 + length
    return counts


READY_TAIL = (b"Z\0\0\0\x05I", b"Z\0\0\0\x05T", b"Z\0\0\0\x05E")


def run_groups(port: int, n: int, timeout: float, cpu_of=None) -> dict:
    """Sends the pipeline from a thread, reads every answer up to the
    ReadyForQuery (the only one: it answers the one Sync)."""
    payload = pipeline_bytes(n)
    sock = bench.open_session(port)
    sock.settimeout(timeout)
    cpu0 = cpu_of() if cpu_of else None
    sent_error: list[BaseException] = []

    def send():
        try:
            sock.sendall(payload)
        except BaseException as e:  # noqa: BLE001 - reported by the reader
            sent_error.append(e)

    chunks: list[bytes] = []
    finished = False
    t0 = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        tail = b""
        while time.monotonic() - t0 < timeout:
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                break
            if not chunk:
                break
            chunks.append(chunk)
            tail = (tail + chunk)[-6:]
            if tail in READY_TAIL:
                finished = True
                break
        wall = time.monotonic() - t0
        cpu = (cpu_of() - cpu0) if cpu_of else None
    finally:
        sock.close()
        sender.join(timeout=10)
    counts = count_messages(b"".join(chunks))
    ok = finished and counts.get("2", 0) == n and counts.get("C", 0) == n and "E" not in counts
    return {"n": n, "finished": finished, "ok": ok, "wall_s": wall, "proxy_cpu_s": cpu,
            "bind_complete": counts.get("2", 0), "command_complete": counts.get("C", 0),
            "errors": counts.get("E", 0), "send_error": repr(sent_error[0]) if sent_error else None}


def run_executemany(port: int, rows: int, cpu_of=None) -> dict:
    import psycopg

    dsn = f"host={HOST} port={port} user={USER} dbname={DB} connect_timeout=10"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pipeline_rows")
        data = [(i, f"row {i}") for i in range(rows)]
        cpu0 = cpu_of() if cpu_of else None
        t0 = time.monotonic()
        try:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO pipeline_rows (id, label) VALUES (%s, %s)", data)
            finished = True
        except psycopg.Error:
            finished = False
        wall = time.monotonic() - t0
        cpu = (cpu_of() - cpu0) if cpu_of else None
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT count(*) FROM pipeline_rows").fetchone()[0]
    return {"rows": rows, "finished": finished, "ok": finished and stored == rows,
            "wall_s": wall, "proxy_cpu_s": cpu, "stored": stored,
            "pipeline_mode": psycopg.Pipeline.is_supported()}


def median_of(runs: list[dict], key: str):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def summarize(direct: list[dict], proxied: list[dict]) -> dict:
    d, p = median_of(direct, "wall_s"), median_of(proxied, "wall_s")
    return {"direct_wall_s": d, "proxy_wall_s": p,
            "ratio": (p / d) if d and p and all(r["finished"] for r in proxied) else None,
            "proxy_cpu_s": median_of(proxied, "proxy_cpu_s"),
            "all_ok": all(r["ok"] for r in direct + proxied),
            "direct": direct, "proxy": proxied}


def perf_report(pid: int, data: Path, out: Path, what: str) -> None:
    flat = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                           "--sort", "sym", "--percent-limit", "1", "-g", "none"],
                          capture_output=True, text=True, timeout=900).stdout
    tree = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--children",
                           "--sort", "sym", "--percent-limit", "5", "-g", "none"],
                          capture_output=True, text=True, timeout=900).stdout
    out.write_text(f"# perf cpu-clock of resumeguard (pid {pid}) during {what}\n\n"
                   f"## self time by symbol\n{flat}\n\n## inclusive (children)\n{tree}")


def render_md(res: dict) -> str:
    lines = [f"# Deep pipelines: {res['binary']}", "",
             f"{res['rounds']} round(s), median; proxy CPU = utime+stime of the proxy process; "
             f"timeout {res['timeout_s']} s per run.", "",
             "| workload | direct wall s | proxy wall s | ratio | proxy CPU s | CPU µs / message group | ok |",
             "|---|---:|---:|---:|---:|---:|---|"]

    def fmt(v, f="{:.2f}"):
        return "n/a" if v is None else f.format(v)

    for key, s in res["results"].items():
        n = s["n"]
        unfinished = not all(r["finished"] for r in s["proxy"])
        wall = fmt(s["proxy_wall_s"]) + (" (unfinished)" if unfinished else "")
        cpu_per = None if s["proxy_cpu_s"] is None else s["proxy_cpu_s"] / n * 1e6
        lines.append(f"| {key} | {fmt(s['direct_wall_s'])} | {wall} | {fmt(s['ratio'], '{:.2f}x')} | "
                     f"{fmt(s['proxy_cpu_s'])} | {fmt(cpu_per, '{:.1f}')} | {'yes' if s['all_ok'] else 'NO'} |")
    lines += ["", "Targets: " + ("; ".join(res["targets"]) if res["targets"] else "all met")]
    return "\n".join(lines)


def check_targets(results: dict) -> list[str]:
    missed = []
    for key, s in results.items():
        if s["ratio"] is None or s["ratio"] > WALL_RATIO_TARGET:
            missed.append(f"{key}: ratio {s['ratio']} above {WALL_RATIO_TARGET}x")
        if not s["all_ok"]:
            missed.append(f"{key}: a run was incomplete or wrong")
    groups = [(s["n"], s["proxy_cpu_s"]) for k, s in results.items() if k.startswith("groups")]
    if len(groups) >= 2 and all(c is not None for _, c in groups):
        (n0, c0), (n1, c1) = min(groups), max(groups)
        # Linear: CPU per group at the deepest within 3x of the shallowest's.
        if c0 > 0 and (c1 / n1) > 3 * (c0 / n0):
            missed.append(f"proxy CPU per group {c1 / n1 * 1e6:.1f} µs at {n1} vs "
                          f"{c0 / n0 * 1e6:.1f} µs at {n0}: not linear")
    return missed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=bench.REPO / "target/release/resumeguard")
    ap.add_argument("--pg-bin", type=Path, default=Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")))
    ap.add_argument("--depths", default="10000,100000,300000")
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--perf", type=Path, help="write a perf profile of the proxy during one more run here")
    ap.add_argument("--perf-depth", type=int, help="groups in the profiled run (default: the deepest)")
    ap.add_argument("--out", type=Path, default=bench.BENCH / "results")
    ap.add_argument("--name", default="pipeline-depth")
    ap.add_argument("proxy_args", nargs="*", help="extra `resumeguard serve` arguments")
    a = ap.parse_args()
    if not a.binary.exists():
        raise SystemExit(f"{a.binary} missing: cargo build --release")
    depths = [int(x) for x in a.depths.split(",") if x]

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    work = Path(tempfile.mkdtemp(prefix="rg-pipeline-"))
    os.chmod(work, 0o755)
    procs = bench.Procs(work)
    pg = bench.Postgres(work, a.pg_bin, max_connections=50)
    try:
        pg.start()
        pg.psql(f"create database {DB}")
        pg.psql("create table pipeline_rows (id int, label text)", db=DB)
        rg = bench.Resumeguard(procs, work, a.binary, "resumeguard", a.proxy_args, pg.port).start()
        cpu_of = lambda: bench.cpu_seconds(rg.proc.pid)  # noqa: E731
        bench.log(f"postgres on {pg.port}, resumeguard {a.binary} on {rg.port} (pid {rg.proc.pid})")

        def restart_if_unfinished(run: dict) -> bool:
            """A session cut off mid-pipeline may still burn the proxy's CPU:
            the next run gets a fresh proxy."""
            nonlocal rg
            if run["finished"]:
                return False
            rg.stop()
            rg = bench.Resumeguard(procs, work, a.binary, "resumeguard", a.proxy_args, pg.port).start()
            return True

        results = {}
        for n in depths:
            direct, proxied = [], []
            for r in range(a.rounds):
                direct.append(run_groups(pg.port, n, a.timeout))
                proxied.append(run_groups(rg.port, n, a.timeout, cpu_of))
                bench.log(f"groups {n} round {r + 1}: direct {direct[-1]['wall_s']:.2f} s, "
                          f"proxy {proxied[-1]['wall_s']:.2f} s (finished {proxied[-1]['finished']}), "
                          f"proxy CPU {proxied[-1]['proxy_cpu_s']:.2f} s")
                if restart_if_unfinished(proxied[-1]):
                    break
            results[f"groups {n:,}"] = {"n": n, **summarize(direct, proxied)}
        direct, proxied = [], []
        for r in range(a.rounds):
            direct.append(run_executemany(pg.port, a.rows))
            proxied.append(run_executemany(rg.port, a.rows, cpu_of))
            bench.log(f"executemany {a.rows} round {r + 1}: direct {direct[-1]['wall_s']:.2f} s, "
                      f"proxy {proxied[-1]['wall_s']:.2f} s, proxy CPU {proxied[-1]['proxy_cpu_s']:.2f} s")
            if restart_if_unfinished(proxied[-1]):
                break
        results[f"executemany {a.rows:,} rows"] = {"n": a.rows, **summarize(direct, proxied)}
        if a.perf:
            data = work / "perf.data"
            n = a.perf_depth or max(depths)
            pid = rg.proc.pid
            rec = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "999", "-g",
                                    "-p", str(pid), "-o", str(data)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(1)
            try:
                run_groups(rg.port, n, a.timeout, cpu_of)
            finally:
                rec.send_signal(signal.SIGINT)
                rec.wait(timeout=120)
            perf_report(pid, data, a.perf, f"{n:,} pipelined Bind/Execute groups + Sync")
            bench.log(f"perf profile: {a.perf}")
        rg.stop()
        res = {"binary": str(a.binary), "rounds": a.rounds, "timeout_s": a.timeout,
               "results": results, "targets": check_targets(results)}
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
        md = render_md(res)
        (a.out / f"{a.name}.md").write_text(md + "\n")
        print(md)
        return 0
    finally:
        procs.stop_all()
        pg.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    sys.exit(main())
