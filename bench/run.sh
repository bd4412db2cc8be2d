#!/usr/bin/env bash
# resumeguard benchmark suite: one command.
#
#   bench/run.sh            full run (~15-20 min on 2 cores): results in bench/results/latest.{json,md}
#   bench/run.sh --smoke    CI smoke (< 3 min): bench/results/smoke-latest.{json,md}
#   bench/run.sh --parts distance   PostgreSQL behind a latency relay (0, 1, 5 ms
#                           one-way): bench/results/distance.{json,md}
#
# Any other arguments go to bench/bench.py (see `python3 bench/bench.py --help`), e.g.
#   bench/run.sh --rounds 3 --duration 5 --parts pgbench
#   bench/run.sh --proxy 'resumeguard' --proxy 'legs-on --enforce all'
#   bench/run.sh --proxy-configs my-configs.conf
#
# Installs PgBouncer from Debian packages if missing, builds resumeguard
# (release), then runs PostgreSQL 15 (throwaway data dir), resumeguard and
# PgBouncer on loopback. Everything it starts is stopped on exit.
# Environment: PG_BIN (default /usr/lib/postgresql/15/bin), RG_SKIP_BUILD=1,
# BENCH_TIMEOUT (seconds; default 3600, smoke 600).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
export PG_BIN

smoke=0
for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=1; done
if [ "$smoke" = 1 ]; then limit="${BENCH_TIMEOUT:-600}"; else limit="${BENCH_TIMEOUT:-3600}"; fi

say() { printf '[run.sh] %s\n' "$*"; }

# ---------------------------------------------------------------- prerequisites
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    say "installing pgbouncer from Debian packages"
    if [ "$(id -u)" -ne 0 ]; then echo "pgbouncer missing and not root: apt-get install pgbouncer" >&2; exit 2; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
fi
export PATH="$PATH:/usr/sbin"
for b in initdb pg_ctl postgres psql pgbench; do
    [ -x "$PG_BIN/$b" ] || { echo "missing $PG_BIN/$b (apt-get install postgresql-15)" >&2; exit 2; }
done
if [ "$(id -u)" -eq 0 ]; then
    id -u postgres >/dev/null 2>&1 || { echo "OS user 'postgres' missing" >&2; exit 2; }
    command -v setpriv >/dev/null 2>&1 || { echo "setpriv (util-linux) missing" >&2; exit 2; }
fi
# 1,000 idle sessions need ~2,000 descriptors in the proxy and 1,000 in the driver.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 4096 ]; then
    say "warning: open-file limit $(ulimit -n) is low for the memory test"
fi

if [ "${RG_SKIP_BUILD:-0}" != 1 ]; then
    say "cargo build --release"
    cargo build --release --quiet --bin resumeguard --example copy_relay --example event_loop_relay --example uring_relay --example latency_relay
fi

# ---------------------------------------------------------------- run, always clean up
WORK="$(mktemp -d /tmp/rg-bench.XXXXXX)"
chmod 755 "$WORK"
driver=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [ -n "$driver" ] && kill -0 "$driver" 2>/dev/null; then
        kill -TERM "$driver" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$driver" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$driver" 2>/dev/null || true
    fi
    # Whatever the driver could not stop itself (it was killed, say).
    if [ -f "$WORK/pids" ]; then
        while read -r pid; do
            [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
        done < "$WORK/pids"
    fi
    if [ -f "$WORK/pg/data/postmaster.pid" ]; then
        if [ "$(id -u)" -eq 0 ]; then
            setpriv --reuid=postgres --regid=postgres --init-groups -- \
                "$PG_BIN/pg_ctl" -D "$WORK/pg/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
        else
            "$PG_BIN/pg_ctl" -D "$WORK/pg/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
        fi
    fi
    if [ "$rc" -ne 0 ] && [ -d "$WORK" ]; then
        say "failed (exit $rc); logs:"
        for f in "$WORK"/*.log "$WORK"/pg/pg.log "$WORK"/pgbouncer-*/pgbouncer.log; do
            [ -f "$f" ] && { echo "--- $f (tail)"; tail -n 20 "$f"; }
        done
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

say "work dir $WORK; time limit ${limit}s"
timeout -k 20 "$limit" python3 -u "$ROOT/bench/bench.py" --work "$WORK" "$@" &
driver=$!
wait "$driver"
