"""Shared fixtures for the resumeguard integration suite.

* ``pg``      (session) a real PostgreSQL 15 in a fresh temp data dir on a free
              loopback port; run as the ``postgres`` OS user when the suite runs
              as root. Roles: ``postgres`` (superuser, trust over TCP) and
              ``scram_user`` (SCRAM-SHA-256 password over TCP).
* ``proxy``   (module) ``resumeguard serve`` in front of ``pg`` with its own audit
              db; teardown sends SIGTERM and asserts exit code 0.
* ``proxy_factory`` (module) start further proxies with extra CLI args
              (``--rules DIR``, ``--no-enforce``); same teardown contract.
* ``dbname``  (module) a fresh database per test module (CREATE DATABASE).
* ``direct_dsn`` / ``proxy_dsn`` (module) URIs for that database, straight to
              PostgreSQL and through the proxy.

Every network wait has a timeout; pytest-timeout (pytest.ini) is the backstop.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

REPO = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
# The client programs (psql, pgbench, pg_isready): from PG_BIN when it has them; a
# directory of server binaries only (integration/pg-versions) takes Debian's 15 clients.
PG_CLIENT_BIN = Path(os.environ.get("PG_CLIENT_BIN") or (
    PG_BIN if (PG_BIN / "psql").exists() else "/usr/lib/postgresql/15/bin"))
PSQL = str(PG_CLIENT_BIN / "psql")
PGBENCH = str(PG_CLIENT_BIN / "pgbench")
IS_ROOT = os.geteuid() == 0
HOST = "127.0.0.1"
SUPERUSER = "postgres"
SCRAM_USER = "scram_user"
SCRAM_PASSWORD = "Scram-Secret-7"
CONNECT_TIMEOUT = 10


def proxy_binary() -> Path:
    if os.environ.get("RESUMEGUARD_BIN"):
        return Path(os.environ["RESUMEGUARD_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    return target / "release" / "resumeguard"


# --------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_accepts(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def make_dsn(port: int, dbname: str, user: str = SUPERUSER, password: str | None = None,
             **params) -> str:
    auth = quote(user, safe="")
    if password is not None:
        auth += ":" + quote(password, safe="")
    params.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql://{auth}@{HOST}:{port}/{quote(dbname, safe='')}?{query}"


def connect(dsn: str, autocommit: bool = True, **kw) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=autocommit, **kw)


def pg_env() -> dict[str, str]:
    """Environment for psql/pgbench: no stray PG* settings, bounded connect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = str(CONNECT_TIMEOUT)
    env["PGAPPNAME"] = "rg-integration"
    return env


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid`, from /proc/<pid>/stat (in
    the kernel's clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields 14 and 15 (utime, stime), counted after the command's ")".
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------- postgres
class PgServer:
    """A throwaway PostgreSQL cluster."""

    def __init__(self, name: str = "main", bin_dir: Path | None = None):
        self.name = name
        self.bin = Path(bin_dir or PG_BIN)   # initdb, pg_ctl, postgres
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"rg-it-pg-{name}-"))
        self.datadir = self.tmp / "data"
        self.logfile = self.tmp / "postgres.log"
        self.started = False
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            os.chown(self.tmp, pw.pw_uid, pw.pw_gid)

    def _run(self, args: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        cmd = (["runuser", "-u", "postgres", "--"] if IS_ROOT else []) + args
        cp = subprocess.run(cmd, cwd=self.tmp, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=timeout)
        if check and cp.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}\n"
                               f"--- postgres log ---\n{tail(self.logfile)}")
        return cp

    def start(self) -> "PgServer":
        self._run([str(self.bin / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER,
                   "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"""
# --- resumeguard integration fixture ---
listen_addresses = '{HOST}'
port = {self.port}
unix_socket_directories = '{self.tmp}'
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
password_encryption = 'scram-sha-256'
log_line_prefix = '%m [%p] %q%u@%d/%a '
log_connections = on
log_disconnections = on
""")
        # First matching line wins: the SCRAM role must authenticate with a password,
        # everyone else (the saver, psql, pgbench) is trusted on loopback.
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {SCRAM_USER} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
        )
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            for p in (self.datadir / "postgresql.conf", self.datadir / "pg_hba.conf"):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
                   "-w", "-t", "60", "start"])
        self.started = True
        atexit.register(self.stop)
        with connect(self.dsn("postgres")) as c:
            c.execute(f"CREATE ROLE {SCRAM_USER} LOGIN PASSWORD '{SCRAM_PASSWORD}'")
        return self

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w",
                       "-t", "60", "stop"], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER, password: str | None = None,
            **params) -> str:
        return make_dsn(self.port, dbname, user, password, **params)


# --------------------------------------------------------------------------- proxy
_LIVE_PROXIES: list["Proxy"] = []


class Proxy:
    """`resumeguard serve` in front of an upstream PostgreSQL."""

    READY_TIMEOUT = 30.0

    def __init__(self, upstream_port: int, workdir: Path, name: str = "proxy",
                 extra_args: tuple[str, ...] = (), upstream: str | None = None,
                 env: dict[str, str] | None = None):
        self.upstream_port = upstream_port
        # The upstream as given to --upstream (default host:port: the claims
        # schema then lives in the upstream user's database, "postgres").
        self.upstream = upstream or f"{HOST}:{upstream_port}"
        self.env = dict(env or {})
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = free_port()
        self.audit_db = self.workdir / f"{name}-audit.sqlite"
        self.audit_jsonl = self.workdir / f"{name}-audit.jsonl"
        self.stderr_path = self.workdir / f"{name}.stderr.log"
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self.stdout_lines: list[str] = []
        self.expected_down = False

    @property
    def argv(self) -> list[str]:
        return [str(proxy_binary()), "serve", "--listen", f"{HOST}:{self.port}",
                "--upstream", self.upstream, "--audit-db", str(self.audit_db),
                "--audit-jsonl", str(self.audit_jsonl), *self._admin_auto(), *self.extra_args]

    def _admin_auto(self) -> list[str]:
        """``--admin-listen auto`` unless the test names the admin address: the default
        port 6433, taken by another proxy, would be a startup error."""
        args = list(self.extra_args)
        if "--admin-listen" in args or "RESUMEGUARD_ADMIN_LISTEN" in self.env:
            return []
        if "--config" in args:
            conf = Path(args[args.index("--config") + 1])
            if conf.exists() and re.search(r"^\s*admin_listen\s*=", conf.read_text(), re.M):
                return []
        return ["--admin-listen", "auto"]

    def start(self) -> "Proxy":
        binary = proxy_binary()
        if not binary.exists():
            pytest.fail(f"proxy binary {binary} does not exist (run `cargo build --release`)")
        self._stderr = open(self.stderr_path, "wb")
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("RUST_LOG", "info")
        env.setdefault("RUST_BACKTRACE", "1")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=self.workdir, env=env)
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        _LIVE_PROXIES.append(self)
        deadline = time.monotonic() + self.READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"proxy exited during startup with code {self.proc.returncode}\n"
                            f"argv: {self.argv}\n{self.describe()}")
            if port_accepts(self.port):
                return self
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"proxy did not accept on {HOST}:{self.port} within {self.READY_TIMEOUT}s\n"
                    f"{self.describe()}")

    def _pump_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.stdout_lines.append(raw.decode(errors="replace").rstrip("\n"))

    def printed(self, key: str, timeout: float = 10.0) -> str | None:
        """The value of the ``KEY=value`` line the proxy printed on stdout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.stdout_lines):
                m = re.search(rf"{key}=(\S+)", line)
                if m:
                    return m.group(1)
            time.sleep(0.05)
        return None

    def database_url(self, timeout: float = 10.0) -> str | None:
        return self.printed("DATABASE_URL", timeout)

    def admin_url(self, timeout: float = 30.0) -> str | None:
        """The ``ADMIN_URL=`` of ``--admin-listen auto``."""
        return self.printed("ADMIN_URL", timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Send `sig`, wait for exit; return the exit code (None if it had to be killed)."""
        self.expected_down = True
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        if self in _LIVE_PROXIES:
            _LIVE_PROXIES.remove(self)
        self._stderr.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.expected_down = True
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self in _LIVE_PROXIES:
            _LIVE_PROXIES.remove(self)

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER, password: str | None = None,
            **params) -> str:
        return make_dsn(self.port, dbname, user, password, **params)

    def describe(self, n: int = 40) -> str:
        out = "\n".join(self.stdout_lines[-10:])
        return (f"--- {self.name} stdout (tail) ---\n{out}\n"
                f"--- {self.name} stderr (tail) ---\n{tail(self.stderr_path, n)}")

    # ---- audit CLI
    def audit(self, thread_id: str, timeout: float = 30.0) -> list[dict]:
        return run_audit_cli(self.audit_db, thread_id, timeout)


# `resumeguard audit --thread T` of a thread with no events on record.
AUDIT_NO_SUCH_THREAD = 3


def run_audit_cli(audit_db: Path, thread_id: str, timeout: float = 30.0) -> list[dict]:
    argv = [str(proxy_binary()), "audit", "--audit-db", str(audit_db), "--thread", thread_id, "--json"]
    cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if cp.returncode == AUDIT_NO_SUCH_THREAD:
        return []  # nothing on record for the thread (yet)
    assert cp.returncode == 0, f"{argv} exited {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    try:
        data = json.loads(cp.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"audit --json printed no JSON ({e}):\n{cp.stdout[:2000]}\nstderr:\n{cp.stderr}")
    assert isinstance(data, list), f"audit --json must print a JSON array, got {type(data).__name__}"
    return data


def audit_until(proxy: "Proxy", thread_id: str, want, timeout: float = 10.0) -> list[dict]:
    """The thread's audit events of `proxy`, polled until ``want(events)`` holds or
    `timeout` passes (the audit writer is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        evs = run_audit_cli(proxy.audit_db, thread_id)
        if want(evs) or time.monotonic() > deadline:
            return evs
        time.sleep(0.2)


def ops(evs: list[dict], name: str) -> list[dict]:
    """The events of one operation."""
    return [e for e in evs if e["operation"] == name]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def pg():
    server = PgServer("main").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="rg-it-work-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(pg, workdir, request):
    name = "proxy-" + re.sub(r"\W+", "_", request.module.__name__.rsplit(".", 1)[-1])
    p = Proxy(pg.port, workdir, name).start()
    yield p
    was_alive = p.alive()
    rc = p.stop(signal.SIGTERM)
    assert was_alive, f"proxy had died before module teardown (rc={p.proc.returncode})\n{p.describe()}"
    assert rc == 0, f"proxy did not exit cleanly on SIGTERM: rc={rc}\n{p.describe()}"


@pytest.fixture(scope="module")
def proxy_factory(pg, workdir, request):
    """``proxy_factory(*extra_args, name=None)`` starts a further ``resumeguard serve``
    in front of ``pg`` with extra CLI arguments (e.g. ``"--rules", DIR``). Every proxy
    it started is stopped with SIGTERM at module teardown and must exit 0."""
    mod = re.sub(r"\W+", "_", request.module.__name__.rsplit(".", 1)[-1])
    started: list[Proxy] = []

    def start(*extra_args: str, name: str | None = None, **kw) -> Proxy:
        p = Proxy(pg.port, workdir, name or f"proxy-{mod}-{len(started) + 1}", extra_args,
                  **kw).start()
        started.append(p)
        return p

    yield start
    problems = []
    for p in started:
        if p.expected_down:
            continue
        was_alive = p.alive()
        rc = p.stop(signal.SIGTERM)
        if not was_alive or rc != 0:
            problems.append(f"{p.name}: alive before teardown={was_alive}, rc={rc}\n{p.describe()}")
    assert not problems, "proxies did not exit cleanly:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def dbname(pg, request):
    mod = re.sub(r"\W+", "_", request.module.__name__.rsplit(".", 1)[-1])
    name = f"rg_{mod}_{uuid.uuid4().hex[:8]}"
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connect(pg.dsn("postgres")) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def direct_dsn(pg, dbname) -> str:
    return pg.dsn(dbname)


@pytest.fixture(scope="module")
def proxy_dsn(proxy, dbname) -> str:
    return proxy.dsn(dbname)


@pytest.fixture(autouse=True)
def _proxies_survive_each_test():
    """A proxy that crashed during a test is reported on that test."""
    yield
    dead = [p for p in list(_LIVE_PROXIES) if not p.expected_down and not p.alive()]
    for p in dead:
        _LIVE_PROXIES.remove(p)
    assert not dead, "proxy process died during this test:\n" + "\n".join(
        f"rc={p.proc.returncode}\n{p.describe()}" for p in dead)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for p in list(_LIVE_PROXIES):
            rep.sections.append((f"{p.name} stderr (tail)", tail(p.stderr_path, 30)))
