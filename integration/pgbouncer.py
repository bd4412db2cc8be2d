"""A throwaway PgBouncer (Debian's, /usr/sbin/pgbouncer) for the pooler tests
(test_poolers.py): one process on a free loopback port, every database forwarded
to one PostgreSQL (or proxy) address, in the pool mode asked for (transaction, as
Neon's ``-pooler`` endpoints, Supabase's port 6543 and most fleets run it).

Clients log in as any user (``auth_type = any``); PgBouncer logs in to the server
as ``postgres`` (trusted on loopback by the suite's PostgreSQL). Run as the
``postgres`` OS user when the suite runs as root (PgBouncer refuses root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import HOST, IS_ROOT, SUPERUSER, free_port, make_dsn, port_accepts, tail

PGBOUNCER = os.environ.get("RG_PGBOUNCER") or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def unavailable() -> str | None:
    """Why PgBouncer cannot run here, or None."""
    if not Path(PGBOUNCER).exists():
        return f"pgbouncer not found ({PGBOUNCER}; .ci/run installs Debian's pgbouncer)"
    return None


class PgBouncer:
    """``pgbouncer`` forwarding every database to ``server_port``."""

    def __init__(self, server_port: int, pool_mode: str = "transaction", pool_size: int = 20,
                 name: str = "pgbouncer"):
        self.server_port = server_port
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"rg-it-{name}-"))
        self.ini = self.tmp / "pgbouncer.ini"
        self.logfile = self.tmp / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "PgBouncer":
        self.ini.write_text(f"""[databases]
* = host={HOST} port={self.server_port} user={SUPERUSER}

[pgbouncer]
listen_addr = {HOST}
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 400
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = {self.logfile}
pidfile =
log_connections = 1
log_disconnections = 1
""")
        cmd = [PGBOUNCER, str(self.ini)]
        if IS_ROOT:
            pw = pwd.getpwnam("postgres")
            for p in (self.tmp, self.ini):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not port_accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not start (rc={self.proc.returncode}):\n"
                                   f"{tail(self.logfile)}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", **params) -> str:
        return make_dsn(self.port, dbname, SUPERUSER, None, **params)
