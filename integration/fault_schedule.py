"""Seeded fault schedules: consume-once racers, proxy crashes and drains, PostgreSQL
restarts, partitions and clock skew mixed at random times, and the recorded history
checked against the Resume Contract.

A *schedule* is a random plan drawn from ``(seed, index)`` alone (the same seed plans
the same schedules on any machine) over a small world: one PostgreSQL, two
``resumeguard serve`` processes sharing the PostgreSQL claims store (one of them may
run under libfaketime, its clock 15-30 s ahead or behind), K threads parked at an
interrupt (racer.py's ``one`` graph, LangGraph's sync connection saver; the gate node
records each run in the ledger table over a direct connection), racers resuming them
through either proxy at planned times (worker processes), and faults:

  ``kill``       SIGKILL a proxy, restart it (same port, state, claims) after a delay
  ``term``       SIGTERM a proxy (it drains), restart it after a delay
  ``pg_restart`` ``pg_ctl restart -m fast``
  ``terminate``  ``pg_terminate_backend`` of the proxies' own connections (claims and
                 liveness, relayed sessions, or both)
  ``partition``  drop one proxy's packets to PostgreSQL for a while (iptables in the
                 network namespace the proxy runs in); needs root and network
                 namespaces, otherwise skipped with a logged reason

After the faults (everything healed, every proxy up), a settle phase waits past
``lapse_ms`` + ``holder_gone_grace_ms`` and resumes every thread that has not finished;
``fault_history.check`` then judges the history: a gate runs again only after the
previous run's racer was cut by a fault (its proxy killed or partitioned, PostgreSQL
restarted, its session's backend terminated; never a SIGTERM drain, never the end of
the claims connections alone), never after the answer the thread kept, never on a
session a fault had already ended; no lost output, no fork, no stranded thread, no
lost checkpoint. The plans are ``fault_plan.plan``.

CLI:  fault_schedule.py --seed S --schedules N --seconds T [--only I,J] [--json FILE]
      fault_schedule.py plan --seed S --schedules N --seconds T    (the plans, as JSON)
prints each schedule (faults with planned and actual times), the per-thread outcome
and the violations; exit status 1 when there are any. Needs PG_BIN and
RESUMEGUARD_BIN (or a release build), as the integration suite does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import netns as N  # noqa: E402
from conftest import HOST, PG_BIN, PgServer, Proxy, make_dsn, port_accepts  # noqa: E402
from fault_history import History, check, cut_by_fault, describe_fault  # noqa: E402
from fault_plan import FAULT_KINDS, Fault, Job, Plan, plan  # noqa: E402,F401  (the CLI's plans)

LAPSE_MS = 2000
GRACE_MS = 1000              # holder_gone_grace_ms
SHUTDOWN_GRACE_MS = 4000
LIVENESS_BOUND_MS = 4000
RETRYABLE = ("55000", "55006")  # answered / run in progress, shutting down
LIBFAKETIME = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
                                 Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"))
                    if p.exists()), None)


def log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------- the world
class FaultProxy(Proxy):
    """A proxy of the schedule: restarted on the same port with the same state
    directory and configuration; inside a network namespace when partitions can be
    made (then PostgreSQL is reached across the namespace's link)."""

    def __init__(self, pg_port: int, workdir: Path, name: str, dbname: str,
                 ns: N.Namespace | None, env: dict[str, str]):
        cfg = workdir / f"{name}.toml"
        cfg.write_text(
            f"shutdown_grace_ms = {SHUTDOWN_GRACE_MS}\n\n"
            f'[claims]\nproxy_id = "{name}"\nlapse_ms = {LAPSE_MS}\npolicy = "wait"\n'
            f"holder_gone_grace_ms = {GRACE_MS}\nliveness_bound_ms = {LIVENESS_BOUND_MS}\n")
        db_host = ns.host_ip if ns else HOST
        super().__init__(pg_port, workdir, name,
                         ("--config", str(cfg), "--state-dir", str(workdir / f"state-{name}")),
                         upstream=f"postgres://postgres@{db_host}:{pg_port}/{dbname}", env=env)
        self.ns = ns
        self.host = ns.ip if ns else HOST

    @property
    def argv(self) -> list[str]:
        argv = super().argv
        argv[argv.index("--listen") + 1] = f"{self.host}:{self.port}"
        return self.ns.argv(*argv) if self.ns else argv

    def start(self) -> "FaultProxy":
        self._stderr = open(self.stderr_path, "ab")
        env = {**os.environ, "RUST_LOG": "info", **self.env}
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, cwd=self.workdir, env=env)
        self.expected_down = False
        deadline = time.monotonic() + self.READY_TIMEOUT
        while not port_accepts(self.port, self.host):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not start\n{self.describe()}")
            time.sleep(0.05)
        return self

    def dsn(self, dbname: str = "postgres", **params) -> str:
        return make_dsn(self.port, dbname, **params).replace(f"@{HOST}:", f"@{self.host}:")


def partitions_unavailable() -> str | None:
    why = N.unavailable()
    if why is None and shutil.which("iptables") is None:
        why = "iptables is not installed"
    return why


class World:
    """One PostgreSQL (and, where partitions can be made, two network namespaces)
    shared by the schedules of a run; each schedule gets a database of its own."""

    def __init__(self, workdir: Path, pg: PgServer | None = None):
        """With ``pg`` given (a server the caller owns), no namespaces: no partitions."""
        self.workdir = workdir
        self.borrowed = pg is not None
        self.no_partition = "a borrowed server" if pg else partitions_unavailable()
        self.namespaces: list[N.Namespace] = []
        self.pg = pg or PgServer("faults").start()
        self.racers = RacerPool(workdir)
        if self.no_partition is None:
            try:
                self._link_namespaces()
            except BaseException:
                self.close()
                raise

    def _link_namespaces(self) -> None:
        """Two namespaces (the proxies' hosts) whose links PostgreSQL listens on."""
        base = 100 + os.getpid() % 150   # apart from other suites' namespaces
        for index in (base, base + 1):
            self.namespaces.append(N.make(index))
        listen = ",".join([HOST] + [ns.host_ip for ns in self.namespaces])
        with open(self.pg.datadir / "postgresql.conf", "a") as f:
            f.write(f"listen_addresses = '{listen}'\n")
        with open(self.pg.datadir / "pg_hba.conf", "a") as f:
            f.write(f"host all all {N.SUBNET}.0.0/16 trust\n")
        self.pg_ctl("restart")

    def pg_ctl(self, action: str) -> None:
        self.pg._run([str(PG_BIN / "pg_ctl"), "-D", str(self.pg.datadir), "-l",
                      str(self.pg.logfile), "-m", "fast", "-w", "-t", "60", action])

    def close(self) -> None:
        self.racers.close()
        for ns in self.namespaces:
            ns.close()
        if not self.borrowed:
            self.pg.stop()


# ----------------------------------------------------------------- racer workers
LANES = 4  # racer processes: at most 4 racers of a thread, each in a process of its own


def worker_main(a) -> int:
    """A racer process, kept for a whole run (LangGraph is imported once): for each
    batch DIR/batch-N-ID.json ({"dir", "ledger_dsn", "jobs"}) it touches ready-ID in
    the batch's dir, waits for the start that the schedule writes there (t0), runs its
    jobs (one fresh saver connection each) at their planned times, writes each
    result, then touches done-ID. DIR/stop ends it."""
    import racer as R
    pool, n = Path(a.dir), int(a.first_batch)
    while not (pool / "stop").exists():
        batch_file = pool / f"batch-{n}-{a.id}.json"
        if not batch_file.exists():
            time.sleep(0.02)
            continue
        batch = json.loads(batch_file.read_text())
        d = Path(batch["dir"])
        R.CTX["ledger_dsn"] = batch["ledger_dsn"]
        (d / f"ready-{a.id}").touch()
        deadline = time.monotonic() + 300
        while not (d / "t0").exists():
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.01)
        t0 = float((d / "t0").read_text())
        for job in [] if (d / "cancel").exists() else batch["jobs"]:
            time.sleep(max(0.0, t0 + job["at"] - time.time()))
            R.write_json(d / f"result-{job['racer']}.json", run_job(R, job))
        (d / f"done-{a.id}").touch()
        n += 1
    return 0


def run_job(R, job: dict) -> dict:
    R.CTX["racer"], R.CTX["ledger"] = job["racer"], None
    out = {"id": job["racer"], "t_start": time.time()}
    try:
        with R.Runner("conn", job["dsn"]) as runner:
            out = R.resume_once(runner, {"thread": job["thread_id"], "value": job["racer"],
                                         "gate_ms": job["gate_ms"]})
    except Exception as e:  # connecting through a proxy that is down, ...
        out.update(ok=False, error=R.describe_error(e), t_end=time.time())
    finally:
        if R.CTX["ledger"] is not None:
            R.CTX["ledger"].close()
    out.update(proxy=job["proxy"], thread_index=job["thread"])
    return out


class RacerPool:
    """``LANES`` racer processes for the schedules of a run; a process that had to
    be killed (its batch overran) is replaced before the next batch."""

    def __init__(self, workdir: Path):
        self.dir = workdir / "racers"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen | None] = [None] * LANES
        self.batch = 0

    def ensure(self) -> None:
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                self.procs[i] = subprocess.Popen(
                    [sys.executable, __file__, "worker", "--id", str(i), "--dir", str(self.dir),
                     "--first-batch", str(self.batch)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=open(self.dir / f"worker-{i}.log", "ab"))

    def submit(self, sched_dir: Path, ledger_dsn: str, lanes: list[list[dict]]) -> None:
        self.ensure()
        for i in range(LANES):
            f = self.dir / f"batch-{self.batch}-{i}.json"
            f.with_suffix(".tmp").write_text(json.dumps(
                {"dir": str(sched_dir), "ledger_dsn": ledger_dsn, "jobs": lanes[i]}))
            os.replace(f.with_suffix(".tmp"), f)
        self.batch += 1

    def wait(self, sched_dir: Path, name: str, timeout: float) -> list[int]:
        """Waits for every lane's ``name-ID`` file in ``sched_dir``; the lanes late."""
        deadline = time.monotonic() + timeout
        while True:
            late = [i for i in range(LANES) if not (sched_dir / f"{name}-{i}").exists()]
            dead = [i for i in late if self.procs[i] is None or self.procs[i].poll() is not None]
            if not late or dead or time.monotonic() > deadline:
                return late
            time.sleep(0.05)

    def kill(self, lane: int) -> None:
        p = self.procs[lane]
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=10)

    def close(self) -> None:
        (self.dir / "stop").touch()
        for i in range(LANES):
            p = self.procs[i]
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.kill(i)


# ----------------------------------------------------------------- one schedule
class CountMonitor:
    """Polls each thread's checkpoint count over a direct connection; remembers any
    decrease (a committed checkpoint lost)."""

    def __init__(self, dsn: str, threads: list[str]):
        self.dsn, self.threads = dsn, threads
        self.best: dict[str, int] = {}
        self.fell: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as c:
            rows = dict(c.execute("select thread_id, count(*) from checkpoints where thread_id = "
                                  "any(%s) group by 1", (self.threads,)).fetchall())
        for t in self.threads:
            n = rows.get(t, 0)
            if n < self.best.get(t, 0):
                self.fell.append(f"{t}: checkpoint count fell from {self.best[t]} to {n}")
            self.best[t] = max(n, self.best.get(t, 0))

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                self.sample()
            except psycopg.Error:
                pass  # PostgreSQL restarting: the next sample counts again

    def finish(self) -> list[str]:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sample()
        return self.fell


class Schedule:
    """One schedule run in ``world``; with ``stock``, the same racers straight to
    PostgreSQL (no proxies, no faults): the defect the proxy holds off."""

    def __init__(self, world: World, p: Plan, no_partition: str | None, stock: bool = False):
        self.world, self.plan, self.no_partition, self.stock = world, p, no_partition, stock
        self.tag = uuid.uuid4().hex[:6]
        self.dbname = f"rg_faults_{p.index}_{self.tag}"
        self.dir = world.workdir / f"schedule-{p.index}-{self.tag}"
        self.dir.mkdir(parents=True)
        self.direct = world.pg.dsn(self.dbname)
        self.ledger_dsn = world.pg.dsn(self.dbname, application_name="rg-ledger")
        self.proxies: list[FaultProxy] = []
        self.h = History(p, [f"fs-{p.seed}-{p.index}-{t}-{self.tag}" for t in range(p.threads)])

    def via(self, proxy: int, **params) -> str:
        """The DSN of the schedule's database through ``proxy`` (straight to it, stock)."""
        if self.stock:
            return self.world.pg.dsn(self.dbname, **params)
        return self.proxies[proxy].dsn(self.dbname, **params)

    # -- setup
    def start(self) -> None:
        import racer as R
        with psycopg.connect(self.world.pg.dsn("postgres"), autocommit=True) as c:
            c.execute(f'create database "{self.dbname}"')
        R.main(["setup", "--dsn", self.direct])
        for i in range(0 if self.stock else 2):
            env = {}
            if self.plan.skew and self.plan.skew[0] == i:
                if LIBFAKETIME is None:
                    self.h.notes.append("skew skipped: libfaketime missing")
                else:
                    env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{self.plan.skew[1]:+}s",
                           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
            ns = self.world.namespaces[i] if self.world.namespaces else None
            self.proxies.append(FaultProxy(self.world.pg.port, self.dir, f"fs{self.plan.index}-{'ab'[i]}",
                                           self.dbname, ns, env))
        self.submit_racers()
        for p in self.proxies:
            p.start()
        R.CTX["ledger_dsn"], R.CTX["ledger"] = self.ledger_dsn, None
        for t, thread in enumerate(self.h.thread_ids):
            with R.Runner("conn", self.via(t % 2)) as r:
                assert R.interrupts_of(r.invoke("one", dict(R.INITIAL), thread)), thread
        with psycopg.connect(self.direct, autocommit=True) as c:
            for thread in self.h.thread_ids:
                self.h.parked[thread] = c.execute(
                    "select checkpoint_id from checkpoint_writes where thread_id = %s and "
                    "channel = '__interrupt__'", (thread,)).fetchone()[0]

    def submit_racers(self) -> None:
        """Hands the racers' jobs to the pool; racers of one thread in different lanes."""
        lanes: list[list[dict]] = [[] for _ in range(LANES)]
        by_thread: dict[int, int] = {}
        for j in self.plan.jobs:
            lane = by_thread.get(j.thread, 0)
            by_thread[j.thread] = lane + 1
            lanes[lane].append({**asdict(j), "dsn": self.via(j.proxy, application_name=f"racer-{j.racer}"),
                                "thread_id": self.h.thread_ids[j.thread]})
        self.world.racers.submit(self.dir, self.ledger_dsn, lanes)

    def release_racers(self) -> float:
        """Waits until every racer process is ready; the schedule's start (epoch)."""
        late = self.world.racers.wait(self.dir, "ready", 180)
        if late:
            raise RuntimeError(f"racer processes {late} did not get ready (logs in "
                               f"{self.world.racers.dir})")
        t0 = time.time() + 0.5
        (self.dir / "t0.tmp").write_text(repr(t0))
        os.replace(self.dir / "t0.tmp", self.dir / "t0")
        return t0

    # -- faults
    def run_faults(self, t0: float) -> None:
        for f in self.plan.faults:
            time.sleep(max(0.0, t0 + f.at - time.time()))
            rec = {**asdict(f), "start": time.time() - t0}
            try:
                rec["note"] = self.inject(f)
            except Exception as e:  # a fault that could not be injected is said, not hidden
                rec["note"] = f"NOT INJECTED: {type(e).__name__}: {e}"
            rec["end"] = time.time() - t0
            self.h.faults.append(rec)
            log(f"schedule {self.plan.index}: {describe_fault(rec)}")

    def inject(self, f: Fault) -> str:
        if f.kind in ("kill", "term"):
            p = self.proxies[f.proxy]
            rc = p.stop(signal.SIGKILL if f.kind == "kill" else signal.SIGTERM,
                        timeout=SHUTDOWN_GRACE_MS / 1000 + 10)
            time.sleep(f.down_s)
            p.start()
            return f"exit {rc}, restarted"
        if f.kind == "pg_restart":
            self.world.pg_ctl("restart")
            return "restarted"
        if f.kind == "terminate":
            pattern = {"claims": ["resumeguard%"], "sessions": ["racer-%"],
                       "all": ["resumeguard%", "racer-%"]}[f.which]
            with psycopg.connect(self.direct, autocommit=True, connect_timeout=5) as c:
                n = c.execute("select count(pg_terminate_backend(pid)) from pg_stat_activity "
                              "where datname = %s and pid <> pg_backend_pid() and "
                              "application_name like any(%s)", (self.dbname, pattern)).fetchone()[0]
            return f"{n} backend(s) ended"
        if f.kind == "partition":
            if self.no_partition:
                return f"skipped: {self.no_partition}"
            ns = self.proxies[f.proxy].ns
            rule = ["OUTPUT", "-p", "tcp", "-d", ns.host_ip, "--dport", str(self.world.pg.port),
                    "-j", "DROP"]
            subprocess.run(ns.argv("iptables", "-A", *rule), check=True, timeout=30)
            try:
                time.sleep(f.down_s)
            finally:
                subprocess.run(ns.argv("iptables", "-D", *rule), check=True, timeout=30)
            return "healed"
        raise ValueError(f.kind)

    # -- the end
    def collect(self, t0: float) -> None:
        for lane in self.world.racers.wait(self.dir, "done", max(1.0, t0 + self.plan.seconds + 90
                                                                 - time.time())):
            self.world.racers.kill(lane)
            self.h.notes.append(f"racer process {lane} still ran {time.time() - t0:.0f} s in: killed")
        for j in self.plan.jobs:
            f = self.dir / f"result-{j.racer}.json"
            if f.exists():
                r = json.loads(f.read_text())
            else:  # its process was killed while it ran: not served (cut only if a fault overlapped)
                r = {"id": j.racer, "ok": False, "error": {"sqlstate": None, "message": "no result"},
                     "t_start": t0 + j.at, "t_end": time.time(), "proxy": j.proxy}
            r["t_start"] -= t0
            r["t_end"] -= t0
            self.h.results[j.racer] = r

    def settle_and_finish(self, t0: float) -> None:
        import racer as R
        for p in self.proxies:
            if not p.alive():
                p.start()
        time.sleep((LAPSE_MS + GRACE_MS) / 1000 + 1.0)
        for t, thread in enumerate(self.h.thread_ids):
            if not self.state(thread)["next"]:
                continue
            rid = f"s{self.plan.index}t{t}final"
            R.CTX["racer"], R.CTX["ledger"] = rid, None
            deadline, refusals = time.monotonic() + 30, []
            dsn = self.via(t % 2, application_name=f"racer-{rid}")
            while True:
                try:
                    with R.Runner("conn", dsn) as runner:
                        res = R.resume_once(runner, {"thread": thread, "value": rid})
                except Exception as e:  # the proxy does not take the connection
                    res = {"id": rid, "ok": False, "error": R.describe_error(e),
                           "t_start": time.time(), "t_end": time.time()}
                code = (res.get("error") or {}).get("sqlstate")
                if res["ok"] or code not in RETRYABLE or time.monotonic() > deadline:
                    break
                refusals.append(code)
                time.sleep(0.5)
            res.update(proxy=t % 2, t_start=res["t_start"] - t0, t_end=res["t_end"] - t0,
                       refusals=refusals)
            self.h.results[rid] = res

    def state(self, thread: str) -> dict:
        import racer as R
        with R.Runner("conn", self.direct) as r:
            st = r.get_state("one", thread)
        return {"next": list(st.next), "approved": st.values.get("approved"),
                "items": st.values.get("items")}

    def record(self) -> None:
        with psycopg.connect(self.direct, autocommit=True) as c:
            for thread in self.h.thread_ids:
                rows = c.execute("select racer, extract(epoch from at)::float8 from rg_ledger "
                                 "where thread_id = %s and node = 'gate' order by at, seq",
                                 (thread,)).fetchall()
                self.h.fires[thread] = [r for r, _ in rows]
                self.h.fire_at[thread] = [round(at - self.h.t0, 3) for _, at in rows]
                self.h.children[thread] = c.execute(
                    "select count(*) from checkpoints where thread_id = %s and "
                    "parent_checkpoint_id = %s", (thread, self.h.parked[thread])).fetchone()[0]
                self.h.final[thread] = self.state(thread)

    def cleanup(self) -> None:
        if not (self.dir / "t0").exists():  # never started: the racers skip their jobs
            (self.dir / "cancel").touch()
            (self.dir / "t0").write_text(repr(time.time()))
        for lane in self.world.racers.wait(self.dir, "done", 60):
            self.world.racers.kill(lane)
        for p in self.proxies:
            if p.alive():
                p.stop(signal.SIGTERM, timeout=SHUTDOWN_GRACE_MS / 1000 + 10)
        for ns in self.world.namespaces:  # a partition left behind by an error
            if self.stock:
                break
            subprocess.run(ns.argv("iptables", "-F", "OUTPUT"), capture_output=True, timeout=30)
        try:
            with psycopg.connect(self.world.pg.dsn("postgres"), autocommit=True) as c:
                c.execute(f'drop database if exists "{self.dbname}" with (force)')
        except psycopg.Error as e:
            log(f"could not drop {self.dbname}: {e}")

    def run(self) -> History:
        began = time.monotonic()

        def phase(name: str) -> None:
            self.h.phases[name] = round(time.monotonic() - began - sum(self.h.phases.values()), 1)

        try:
            self.start()
            monitor = CountMonitor(self.direct, self.h.thread_ids)
            t0 = self.h.t0 = self.release_racers()
            phase("setup")
            self.run_faults(t0)
            self.collect(t0)
            phase("racers and faults")
            self.settle_and_finish(t0)
            phase("settle and final resumes")
            self.h.counts_fell = monitor.finish()
            self.record()
        finally:
            self.cleanup()
            phase("check and cleanup")
        return self.h


def summary(h: History, found: list[str]) -> dict:
    """``found``: every violation."""
    p = h.plan
    served = sum(1 for r in h.results.values() if r.get("ok"))
    refused: dict[str, int] = {}
    for r in h.results.values():
        if not r.get("ok"):
            code = (r.get("error") or {}).get("sqlstate") or "no sqlstate"
            refused[code] = refused.get(code, 0) + 1
    cut = sum(1 for t in h.thread_ids for r in h.fires.get(t, []) if cut_by_fault(h, r))
    return {"seed": p.seed, "index": p.index, "threads": p.threads, "racers": len(p.jobs),
            "faults": len(p.faults), "skew": p.skew,
            "fault_kinds": sorted({f.kind for f in p.faults}), "served": served,
            "not_served": refused, "fires": sum(len(v) for v in h.fires.values()),
            "fires_cut_by_a_fault": cut,
            "final_resumes": sum(1 for k in h.results if k.endswith("final")),
            "violations": found, "notes": h.notes,
            "phases_s": h.phases,
            "history": {"faults": h.faults,
                        "threads": {t: {"fires": list(zip(h.fires.get(t, []), h.fire_at.get(t, []))),
                                        "final": h.final.get(t)} for t in h.thread_ids},
                        "racers": {k: {x: r.get(x) for x in ("proxy", "t_start", "t_end", "ok",
                                                             "error", "refusals")}
                                   for k, r in h.results.items()}}}


def print_schedule(h: History, violations: list[str]) -> None:
    p = h.plan
    log(f"seed {p.seed} schedule {p.index}: {p.threads} threads, {len(p.jobs)} racers, "
        f"{len(p.faults)} faults in {p.seconds} s, skew "
        f"{f'proxy {p.skew[0]} {p.skew[1]:+} s' if p.skew else 'none'}")
    for f in h.faults or [asdict(f) for f in p.faults]:
        log(f"  fault {describe_fault(f)}")
    for t, thread in enumerate(h.thread_ids):
        rs = [f"{j.racer}@{j.at}s/p{j.proxy}/g{j.gate_ms}:" +
              ("ok" if h.results.get(j.racer, {}).get("ok") else
               str((h.results.get(j.racer, {}).get("error") or {}).get("sqlstate")))
              for j in p.jobs if j.thread == t]
        log(f"  thread {t}: fires {h.fires.get(thread)} final {h.final.get(thread)} racers {rs}")
    for n in h.notes:
        log(f"  note: {n}")
    log(f"  phases (s): {h.phases}")
    for v in violations:
        log(f"  VIOLATION: {v}")
    if not violations:
        log("  violations: none")


def stock_race(world: World, racers: int = 3, gate_ms: int = 300) -> tuple[History, list[str]]:
    """``racers`` resumes of one parked thread arriving together straight to
    PostgreSQL, checked as a schedule is: the checker's view of the stock defect."""
    jobs = [Job(racer=f"stock-r{r}", thread=0, proxy=0, at=0.0, gate_ms=gate_ms)
            for r in range(racers)]
    p = Plan(seed=0, index=0, seconds=1.0, threads=1, skew=None, jobs=jobs, faults=[])
    h = Schedule(world, p, "stock", stock=True).run()
    return h, check(h)


def run(seed: int, schedules: int, seconds: float, workdir: Path | None = None,
        only: list[int] | None = None) -> list[dict]:
    """Runs ``schedules`` schedules of ``seed`` (or those of them in ``only``); each
    one's summary (its violations included)."""
    own = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="rg-faults-"))
    world = World(workdir)
    if world.no_partition:
        log(f"partition faults will be skipped: {world.no_partition}")
    out = []
    try:
        for i in (only if only is not None else range(schedules)):
            h = Schedule(world, plan(seed, i, seconds), world.no_partition).run()
            v = check(h)
            print_schedule(h, v)
            out.append(summary(h, v))
    finally:
        world.close()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    total = sum(len(s["violations"]) for s in out)
    failing = ",".join(str(s["index"]) for s in out if s["violations"])
    log(f"seed {seed}: {len(out)} schedules, {sum(s['faults'] for s in out)} faults, "
        f"{sum(s['racers'] for s in out)} racers, {total} violation(s); rerun with "
        f"--seed {seed} --schedules {schedules} --seconds {seconds}"
        + (f" --only {failing}" if failing else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", choices=["run", "plan", "worker"], default="run")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--schedules", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", default=None, help="write the run's summaries here")
    ap.add_argument("--only", default=None, help="comma list: run only these schedules")
    ap.add_argument("--id"), ap.add_argument("--dir"), ap.add_argument("--first-batch", default="0")
    a = ap.parse_args(argv)
    if a.command == "worker":
        return worker_main(a)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    if a.command == "plan":
        for i in range(a.schedules):
            print(json.dumps(asdict(plan(seed, i, a.seconds))))
        return 0
    only = [int(x) for x in a.only.split(",")] if a.only else None
    out = run(seed, a.schedules, a.seconds, only=only)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 1 if any(s["violations"] for s in out) else 0


if __name__ == "__main__":
    sys.exit(main())
