#!/usr/bin/env bash
# Consume-once full race matrix (issue 4) — NOT run in CI (CI runs the reduced
# CI_CELLS of integration/test_consume_once.py::test_race).
#
#   integration/full_matrix.sh                 # N=2,4,8,16 x gate 0/300 ms x 10 reps
#                                              # x bare/map x conn/pool/async x 1/2 proxies
# Narrow it with environment variables (comma lists):
#   RG_CO_N=2,4 RG_CO_GATES=0,300 RG_CO_REPS=3 RG_CO_FORMS=bare,map \
#   RG_CO_SAVERS=conn,pool,async RG_CO_PROXIES=1,2 integration/full_matrix.sh
# Extra arguments go to pytest (e.g. -x, or -k 'n16').
#
# Every cell runs racers as separate OS processes behind a file barrier, first
# straight to PostgreSQL (stock; only in 1-proxy cells) and then through the
# proxy (two proxies sharing one claims store in 2-proxy cells, racers split
# between them). It asserts what CI asserts and prints one table row per
# cell: stock fires per repetition, proxy fires per repetition, refusals
# (55000), in-use refusals (55006), claim_waited events, slowest loser and
# winner (ms after the barrier). Results are also kept in
# $RG_CO_TABLE (default: a temp file, path printed).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export RG_CO_FULL=1
export RG_CO_TABLE="${RG_CO_TABLE:-$(mktemp /tmp/rg-consume-once-matrix.XXXXXX.jsonl)}"
: > "$RG_CO_TABLE"
RG_SKIP_UNIT="${RG_SKIP_UNIT:-1}" RG_PYTEST_TIMEOUT="${RG_PYTEST_TIMEOUT:-5400}" \
    integration/run_all.sh -k 'test_consume_once and test_race' "$@"
rc=$?
PY="$ROOT/.venv/bin/python"
"$PY" - "$RG_CO_TABLE" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def fmt(v):
    if v is None: return "-"
    if isinstance(v, list):
        return ",".join(map(str, v)) if len(set(v)) > 1 else f"{v[0]}x{len(v)}"
    return str(v)
gates = sorted({int(k.rsplit("_g", 1)[1]) for r in rows for k in r if k.startswith("proxy_fires_g")})
hdr = ["cell", "gate_ms", "stock fires/rep", "proxy fires/rep", "55000", "of which lease", "55006",
       "late", "waits", "max loser ms", "max winner ms"]
lines = []
for r in rows:
    for g in gates:
        lines.append([r["cell"], str(g), fmt(r.get(f"stock_fires_g{g}")), fmt(r.get(f"proxy_fires_g{g}")),
                      fmt(r.get(f"refused_g{g}")), fmt(r.get(f"leased_g{g}")), fmt(r.get(f"in_use_g{g}")),
                      fmt(r.get(f"late_g{g}")), fmt(r.get(f"waits_g{g}")),
                      fmt(r.get(f"max_loser_ms_g{g}")), fmt(r.get(f"max_winner_ms_g{g}"))])
w = [max(len(x) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
print("\n| " + " | ".join(h.ljust(n) for h, n in zip(hdr, w)) + " |")
print("| " + " | ".join("-" * n for n in w) + " |")
for ln in lines:
    print("| " + " | ".join(x.ljust(n) for x, n in zip(ln, w)) + " |")
print(f"\n{len(rows)} cell(s); raw results: {sys.argv[1]}")
PYEOF
exit "$rc"
