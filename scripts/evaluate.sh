#!/usr/bin/env bash
# scripts/evaluate.sh: the evaluation a contributor runs on their own machine (issue #7): the
# checks (on a GPU: `scripts/gpu_check.sh build test model proxy`, i.e. every kernel against the
# CPU reference, the model and engine against the CPU oracle, and the whole-model decode sweep over
# batch x context x decode backend; without one: the CPU decode sweep), then `k3serve serve` on the
# model, the agentic multi-turn workload at each concurrency of a sweep with `k3serve bench-serve`
# (one result bundle each), and `k3serve bench-compare` of them into one report (markdown, JSON,
# SVG plots: latency CDFs, throughput vs concurrency, interactivity vs throughput). Everything
# lands in one folder (the checks in checks/).
#
#   bash scripts/evaluate.sh [--model-dir DIR] [--out DIR] [--bin K3SERVE] [--scale tiny|full]
#                            [--concurrency "1 2 4 8 16"] [--sessions-per-worker N] [--max-duration S]
#                            [--device cpu|cuda] [--seed N] [--port P] [--baseline-dir DIR]
#                            [--serve-extra "SERVER OPTIONS"] [--no-checks] [--checks-budget S]
#                            [-- EXTRA bench-serve OPTIONS]
#
# Defaults: on a machine with nvidia-smi, the k3-proxy-tp8 model ($K3_PROXY_DIR, default
# /tmp/k3-proxy-tp8, written with make-checkpoint when absent: ~52 GB) on cuda at full scale
# (MXFP4 experts; first turn 50K tokens, +800 per turn, 10-15 turns, 500 output tokens, 1 s pauses); elsewhere
# k3-tiny (models/k3-tiny, written when absent) on the CPU at tiny scale (first turn 256, +32,
# 3-4 turns, 16 output tokens, 50 ms pauses). Each concurrency level runs
# concurrency x sessions-per-worker sessions, cut at --max-duration seconds. The sweep report
# (compare/) sets every level against the first; --baseline-dir DIR (an earlier evaluate.sh
# folder) adds compare-cN/ per level: DIR's agentic-cN.json against this run's, with regressions
# flagged.
# --serve-extra adds options to `k3serve serve` (split at spaces), e.g. "--decode-backend
# latency_specialized" or "--speculative-method ngram"; they are recorded in every bundle's engine config.
# --no-checks skips the checks (gpu_check.sh's serve phase does: it ran them already); on a GPU
# they get --checks-budget seconds (default 300: on the H200 the build takes ~75 s, the op tests
# ~55 s, the model tests ~10 s, and the proxy decode sweep what is left; a phase cut by the budget
# is reported as TIMEOUT and the serving sweep still runs; a FAIL stops the script).
# The k3serve binary: --bin, else build/default/k3serve (built with cmake when missing).
# Exit status: 0 done; 1 something failed (server, bench-serve, a compare); 3 a regression was
# flagged against --baseline-dir. Requests that failed are kept in the bundles and warned about.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODEL_DIR=""
OUT=""
BIN=""
SCALE=""
DEVICE=""
CONCURRENCY="1 2 4 8 16"
SESSIONS_PER_WORKER=1
MAX_DURATION=""
SEED=0
PORT=0
BASELINE_DIR=""
SERVE_EXTRA=""
CHECKS=1
CHECKS_BUDGET=300
EXTRA=()
while (($#)); do
  case "$1" in
    --model-dir) MODEL_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --sessions-per-worker) SESSIONS_PER_WORKER=$2; shift 2 ;;
    --max-duration) MAX_DURATION=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --baseline-dir) BASELINE_DIR=$2; shift 2 ;;
    --serve-extra) SERVE_EXTRA=$2; shift 2 ;;
    --no-checks) CHECKS=0; shift ;;
    --checks-budget) CHECKS_BUDGET=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "evaluate.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

HAVE_GPU=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && HAVE_GPU=1
if [[ -z $SCALE ]]; then ((HAVE_GPU)) && SCALE=full || SCALE=tiny; fi
if [[ -z $DEVICE ]]; then ((HAVE_GPU)) && DEVICE=cuda || DEVICE=cpu; fi
OUT=${OUT:-$ROOT/eval_out/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say() { echo "evaluate: $*"; }

# ---- the binary
if [[ -z $BIN ]]; then
  BIN=$ROOT/build/default/k3serve
  if [[ ! -x $BIN || ! -x ${BIN%/*}/k3serve-bench ]]; then
    say "building k3serve and k3serve-bench in build/default"
    cmake -S "$ROOT" -B "$ROOT/build/default" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1
    cmake --build "$ROOT/build/default" --target k3serve k3serve-bench >>"$OUT/build.log" 2>&1 ||
      { tail -30 "$OUT/build.log"; exit 1; }
  fi
fi
[[ -x $BIN ]] || { say "no k3serve binary at $BIN"; exit 1; }
# `k3serve bench-serve` and `bench-compare` run the k3serve-bench program beside it.
[[ -x ${BIN%/*}/k3serve-bench ]] || { say "no k3serve-bench beside $BIN (build the k3serve-bench target)"; exit 1; }

# ---- the model
if [[ -z $MODEL_DIR ]]; then
  # The proxy's routed experts in MXFP4 as K3 ships them (bf16 experts would not fit the disk).
  if ((HAVE_GPU)); then MODEL_DIR=${K3_PROXY_DIR:-/tmp/k3-proxy-tp8}; MAKE=(--config k3-proxy-tp8 --mxfp4)
  else MODEL_DIR=$ROOT/models/k3-tiny; MAKE=(--config k3-tiny); fi
  if [[ ! -f $MODEL_DIR/config.json ]]; then
    # Written beside and renamed when complete: a cut write leaves no half checkpoint in MODEL_DIR
    # (and the next run clears the partial one, which on a RAM-backed /dev/shm would hold memory).
    say "writing ${MAKE[*]} to $MODEL_DIR"
    rm -rf "$MODEL_DIR.partial"
    "$BIN" make-checkpoint "${MAKE[@]}" --seed 0 --out "$MODEL_DIR.partial" >"$OUT/make_checkpoint.log" 2>&1 ||
      { say "make-checkpoint failed:"; tail -5 "$OUT/make_checkpoint.log"; rm -rf "$MODEL_DIR.partial"; exit 1; }
    if [[ -d $MODEL_DIR ]] && ! rmdir "$MODEL_DIR" 2>/dev/null; then
      say "$MODEL_DIR holds files but no config.json: not a checkpoint; move it away (the new one is in $MODEL_DIR.partial)"
      exit 1
    fi
    mv "$MODEL_DIR.partial" "$MODEL_DIR"
  fi
fi
[[ -f $MODEL_DIR/config.json ]] || { say "no config.json in $MODEL_DIR"; exit 1; }
[[ -f $MODEL_DIR/tiktoken.model ]] || { say "no tokenizer (tiktoken.model) in $MODEL_DIR: the server needs one"; exit 1; }

# ---- the checks (before the server: they want the device to themselves)
if ((CHECKS)); then
  mkdir -p "$OUT/checks"
  if ((HAVE_GPU)); then
    say "checks: scripts/gpu_check.sh build test model proxy (budget ${CHECKS_BUDGET} s) -> $OUT/checks"
    rc=0
    K3_PROXY_DIR=$MODEL_DIR OUT=$OUT/checks bash "$ROOT/scripts/gpu_check.sh" build test model proxy \
      --budget "$CHECKS_BUDGET" >"$OUT/checks/gpu_check.log" 2>&1 || rc=$?
    tail -8 "$OUT/checks/summary.txt" 2>/dev/null || tail -8 "$OUT/checks/gpu_check.log"
    if grep -qE '^[a-z]+ +FAIL ' "$OUT/checks/summary.txt" 2>/dev/null || [[ ! -f $OUT/checks/summary.txt ]]; then
      say "checks FAILED (exit $rc): $OUT/checks/summary.txt"; exit 1
    fi
    ((rc == 0)) || say "WARNING: a check phase was cut by the budget (TIMEOUT in $OUT/checks/summary.txt)"
  else
    SWEEP_BIN=$(dirname "$BIN")/k3bench_cpu_decode
    if [[ ! -x $SWEEP_BIN ]]; then
      say "building k3bench_cpu_decode beside $BIN"
      cmake --build "$(dirname "$BIN")" --target k3bench_cpu_decode >>"$OUT/checks/build.log" 2>&1 ||
        { tail -20 "$OUT/checks/build.log"; exit 1; }
    fi
    say "checks: CPU decode sweep on $MODEL_DIR -> $OUT/checks/decode_cpu.json (the CPU test suite is .ci/run)"
    "$SWEEP_BIN" --model "$MODEL_DIR" --repeats 2 --out "$OUT/checks/decode_cpu.json" >"$OUT/checks/decode_cpu.txt" 2>&1 ||
      { tail -20 "$OUT/checks/decode_cpu.txt"; say "the CPU decode sweep failed"; exit 1; }
    tail -6 "$OUT/checks/decode_cpu.txt"
  fi
fi

# ---- the workload shape
if [[ $SCALE == full ]]; then
  SHAPE=(--first-turn-len 50000 --turn-increment 800 --agent-output-len 500 --turns 10:15 --pause 1)
  MAX_MODEL_LEN=131072
  MAX_DURATION=${MAX_DURATION:-300}
  KV_BYTES=$((64 << 30))
elif [[ $SCALE == tiny ]]; then
  SHAPE=(--first-turn-len 256 --turn-increment 32 --agent-output-len 16 --turns 3:4 --pause 0.05)
  MAX_MODEL_LEN=1024
  MAX_DURATION=${MAX_DURATION:-60}
  KV_BYTES=$((256 << 20))
else
  say "--scale must be tiny or full, got '$SCALE'"; exit 2
fi

# ---- the server
SERVE_ARGS=(serve --model "$MODEL_DIR" --device "$DEVICE" --host 127.0.0.1 --port "$PORT"
            --max-model-len "$MAX_MODEL_LEN" --kv-cache-bytes "$KV_BYTES" --drain-seconds 5)
read -r -a serve_extra <<< "$SERVE_EXTRA"
SERVE_ARGS+=("${serve_extra[@]}")
LOG=$OUT/server.log
SERVER_PID=""
cleanup() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
say "starting: $BIN ${SERVE_ARGS[*]}"
"$BIN" "${SERVE_ARGS[@]}" >"$LOG" 2>&1 &
SERVER_PID=$!
# The server prints "serving model 'NAME' on http://HOST:PORT/v1" once it listens.
for _ in $(seq 3000); do
  grep -q " info *serving model" "$LOG" 2>/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || { say "the server exited:"; tail -20 "$LOG"; exit 1; }
  sleep 0.2
done
grep -q " info *serving model" "$LOG" || { say "the server did not start in 600 s"; tail -20 "$LOG"; exit 1; }
PORT=$(grep -o 'http://[^ ]*' "$LOG" | head -1 | sed -E 's|http://[^:]+:([0-9]+)/.*|\1|')
say "server up on port $PORT (log: $LOG)"

# ---- the sweep
BUNDLES=()
GIT_SHA=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
for c in $CONCURRENCY; do
  bundle=$OUT/agentic-c$c.json
  say "agentic, concurrency $c"
  rc=0
  "$BIN" bench-serve --port "$PORT" --model-dir "$MODEL_DIR" --workload agentic "${SHAPE[@]}" \
    --num-sessions $((c * SESSIONS_PER_WORKER)) --concurrency "$c" --seed "$SEED" --warmup 1 \
    --max-duration "$MAX_DURATION" --label "agentic-c$c" --series "$GIT_SHA $SCALE" \
    --engine-config "$(printf '%q ' "${SERVE_ARGS[@]}")" --out "$bundle" "${EXTRA[@]}" \
    >"$OUT/agentic-c$c.txt" 2>&1 || rc=$?
  cat "$OUT/agentic-c$c.txt"
  [[ -f $bundle ]] || { say "bench-serve wrote no bundle (exit $rc)"; exit 1; }
  ((rc == 0)) || say "WARNING: some requests failed at concurrency $c (see the bundle's samples)"
  BUNDLES+=("$bundle")
done

"$BIN" bench-compare "${BUNDLES[@]}" --out "$OUT/compare" --seed "$SEED" >"$OUT/compare.txt"
say "sweep report: $OUT/compare/report.md (plots beside it); bundles: $OUT/agentic-c*.json"
REGRESSED=0
if [[ -n $BASELINE_DIR ]]; then
  for c in $CONCURRENCY; do
    base=$BASELINE_DIR/agentic-c$c.json
    [[ -f $base ]] || { say "no baseline $base: concurrency $c not compared"; continue; }
    rc=0
    "$BIN" bench-compare "$base" "$OUT/agentic-c$c.json" --out "$OUT/compare-c$c" --seed "$SEED" \
      --fail-on-regression >"$OUT/compare-c$c.txt" || rc=$?
    if ((rc == 3)); then say "REGRESSION at concurrency $c: $OUT/compare-c$c/report.md"; REGRESSED=3
    elif ((rc != 0)); then say "bench-compare failed at concurrency $c (exit $rc)"; exit 1
    else say "concurrency $c: no regression against $base"; fi
  done
fi
exit $REGRESSED
