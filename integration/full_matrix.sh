#!/usr/bin/env bash
# Consume-once full race matrix — NOT run in CI (CI runs the reduced
# CI_CELLS of integration/test_consume_once.py::test_race).
#
#   integration/full_matrix.sh                 # N=2,4,8,16 x gate 0/300 ms x 10 reps
#                                              # x bare/map x conn/pool/async x 1/2 proxies
# Narrow it with environment variables (comma lists):
#   RG_CO_N=2,4 RG_CO_GATES=0,300 RG_CO_REPS=3 RG_CO_FORMS=bare,map \
#   RG_CO_SAVERS=conn,pool,async RG_CO_PROXIES=1,2 integration/full_matrix.sh
# Saver stacks (RG_CO_STACKS, comma list, default py3): py3 = test_consume_once.py
# (LangGraph Python 3.x, the cells above); js = test_js_saver.py (LangGraph.js,
# N x gates x reps); py2 and py208 = test_py2_saver.py (Python 2.0.25 and 2.0.8,
# N x gates x reps x RG_CO_SAVERS). RG_CO_FORMS and RG_CO_PROXIES apply to py3 only.
# split = test_claims_pg.py: two proxies with separate state dirs, N x conn/pool/async,
# on PostgreSQL claims beside the same racers straight to PostgreSQL (the stock defect).
# faults = test_fault_schedule.py: seeded fault schedules (racers over two proxies
# while proxies are SIGKILLed / SIGTERMed, PostgreSQL restarts, backends are
# terminated, a proxy is partitioned, a clock is skewed), RG_FAULT_SCHEDULES (12)
# of RG_FAULT_SECONDS (20) from RG_FAULT_SEED; one summary row per schedule.
#   RG_CO_STACKS=py3,js,py2,py208,split,faults integration/full_matrix.sh
# versions = the integration core (tests marked `core`: protocol, LangGraph Python and
# JS, claims in PostgreSQL, TLS) once per PostgreSQL major, each run's server from
# integration/pg-versions (RG_PG_MAJORS, default 13,14,15,16,17,18; CI cell sizes unless
# RG_CO_FULL=1 is set for it too: RG_VERSIONS_FULL=1):
#   RG_CO_STACKS=versions integration/full_matrix.sh
# Extra arguments go to pytest (e.g. -x, or -k 'n16').
# First, the claims protocol model at its larger bounds (tests/claims_model.rs;
# RG_MODEL_LARGE=0 skips it).
#
# Every cell runs racers as separate OS processes behind a file barrier, first
# straight to PostgreSQL (stock; only in 1-proxy cells) and then through the
# proxy (two proxies sharing one claims store in 2-proxy cells, racers split
# between them). It asserts what CI asserts and prints one table row per
# cell: stock fires per repetition, proxy fires per repetition, refusals
# (55000), in-use refusals (55006), late racers (read the finished head:
# served the finished state, or, bare form, refused 55000 as late
# duplicates), claim_waited events, slowest loser and
# winner (ms after the barrier). Results are also kept in
# $RG_CO_TABLE (default: a temp file, path printed).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export RG_CO_FULL=1
export RG_CO_TABLE="${RG_CO_TABLE:-$(mktemp /tmp/rg-consume-once-matrix.XXXXXX.jsonl)}"
: > "$RG_CO_TABLE"
# the JS and 2.0.x modules read their own knobs; the matrix's apply unless those are set
export RG_JS_N="${RG_JS_N:-${RG_CO_N:-2,4,8,16}}" RG_JS_GATES="${RG_JS_GATES:-${RG_CO_GATES:-0,300}}"
export RG_JS_REPS="${RG_JS_REPS:-${RG_CO_REPS:-10}}"
export RG_PY2_N="${RG_PY2_N:-${RG_CO_N:-2,4,8,16}}" RG_PY2_GATES="${RG_PY2_GATES:-${RG_CO_GATES:-0,300}}"
export RG_PY2_REPS="${RG_PY2_REPS:-${RG_CO_REPS:-10}}" RG_PY2_SAVERS="${RG_PY2_SAVERS:-${RG_CO_SAVERS:-conn,pool,async}}"
selected=()
versions_rc=0
export RG_FAULT_TABLE="${RG_FAULT_TABLE:-$(mktemp /tmp/rg-fault-schedules.XXXXXX.jsonl)}"
: > "$RG_FAULT_TABLE"
IFS=, read -ra stacks <<< "${RG_CO_STACKS:-py3,faults}"
for stack in "${stacks[@]}"; do
    case "$stack" in
        versions)
            build=0
            IFS=, read -ra majors <<< "${RG_PG_MAJORS:-13,14,15,16,17,18}"
            for major in "${majors[@]}"; do
                bin="$ROOT/integration/pg-versions/node_modules/pg$major/native/bin"
                echo "=== full_matrix: core on PostgreSQL $major ($bin) ==="
                if [ "${RG_VERSIONS_FULL:-0}" = 1 ]; then full=1; else full=0; fi
                PG_BIN="$bin" RG_CO_FULL="$full" RG_SKIP_UNIT=1 RG_SKIP_BUILD="${RG_SKIP_BUILD:-$build}" \
                    RG_SKIP_BENCH=1 RG_PYTEST_TIMEOUT="${RG_PYTEST_TIMEOUT:-5400}" \
                    integration/run_all.sh -m core "$@" || versions_rc=1
                build=1
            done
            continue ;;
        py3) selected+=("test_consume_once and test_race") ;;
        js) selected+=("test_js_saver and test_race") ;;
        py2) selected+=("test_py2_saver and test_race and saver2.0.25") ;;
        py208) selected+=("test_py2_saver and test_race and saver2.0.8") ;;
        split) selected+=("test_claims_pg and test_racers_over") ;;
        faults) selected+=("test_fault_schedule") ;;
        *) echo "full_matrix: unknown stack '$stack' in RG_CO_STACKS (py3, js, py2, py208, split, faults, versions)" >&2; exit 2 ;;
    esac
done
if [ "${#selected[@]}" -eq 0 ]; then
    exit "$versions_rc"
fi
expr="$(printf '(%s) or ' "${selected[@]}")"
# The claims protocol model at its larger bounds (docs/guarantees.md);
# RG_MODEL_LARGE=0 skips it.
model_rc=0
if [ "${RG_MODEL_LARGE:-1}" != 0 ]; then
    cargo test --test claims_model -- --ignored --nocapture claims_protocol_holds_at_large_bounds
    model_rc=$?
fi
RG_SKIP_UNIT="${RG_SKIP_UNIT:-1}" RG_PYTEST_TIMEOUT="${RG_PYTEST_TIMEOUT:-5400}" \
    integration/run_all.sh -k "${expr% or }" "$@"
rc=$?
[ "$model_rc" -eq 0 ] || rc=$model_rc
[ "$versions_rc" -eq 0 ] || rc=1
PY="$ROOT/.venv/bin/python"
"$PY" - "$RG_CO_TABLE" <<'PYEOF'
import json, sys
rows = {}
for l in open(sys.argv[1]):   # a cell's stock and proxy halves may come as separate rows
    if l.strip():
        r = json.loads(l)
        rows.setdefault(r["cell"], {}).update(r)
rows = list(rows.values())
def fmt(v):
    if v is None: return "-"
    if isinstance(v, list):
        return ",".join(map(str, v)) if len(set(v)) > 1 else f"{v[0]}x{len(v)}"
    return str(v)
gates = sorted({int(k.rsplit("_g", 1)[1]) for r in rows for k in r if k.startswith("proxy_fires_g")})
hdr = ["cell", "gate_ms", "stock fires/rep", "proxy fires/rep", "55000", "of which lease", "55006",
       "late (served)", "late (55000)", "waits", "max loser ms", "max winner ms"]
lines = []
for r in rows:
    for g in gates:
        lines.append([r["cell"], str(g), fmt(r.get(f"stock_fires_g{g}")), fmt(r.get(f"proxy_fires_g{g}")),
                      fmt(r.get(f"refused_g{g}")), fmt(r.get(f"leased_g{g}")), fmt(r.get(f"in_use_g{g}")),
                      fmt(r.get(f"late_g{g}")), fmt(r.get(f"late_dup_g{g}")), fmt(r.get(f"waits_g{g}")),
                      fmt(r.get(f"max_loser_ms_g{g}")), fmt(r.get(f"max_winner_ms_g{g}"))])
w = [max(len(x) for x in col) for col in zip(hdr, *lines)] if lines else [len(h) for h in hdr]
print("\n| " + " | ".join(h.ljust(n) for h, n in zip(hdr, w)) + " |")
print("| " + " | ".join("-" * n for n in w) + " |")
for ln in lines:
    print("| " + " | ".join(x.ljust(n) for x, n in zip(ln, w)) + " |")
print(f"\n{len(rows)} cell(s); raw results: {sys.argv[1]}")
PYEOF
"$PY" - "$RG_FAULT_TABLE" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if rows:
    print("\n| seed | schedule | threads | racers | faults | kinds | skew s | served | fires | cut | violations |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        skew = f"{r['skew'][1]:+}" if r["skew"] else "-"
        print(f"| {r['seed']} | {r['index']} | {r['threads']} | {r['racers']} | {r['faults']} | "
              f"{','.join(r['fault_kinds'])} | {skew} | {r['served']} | {r['fires']} | "
              f"{r['fires_cut_by_a_fault']} | {len(r['violations'])} |")
    print(f"\n{len(rows)} fault schedule(s), {sum(r['faults'] for r in rows)} faults, "
          f"{sum(r['racers'] for r in rows)} racers, "
          f"{sum(len(r['violations']) for r in rows)} violation(s); raw: {sys.argv[1]}")
PYEOF
exit "$rc"
