#!/usr/bin/env bash
# scripts/gpu_check.sh: build and run every GPU test and benchmark of k3serve on a CUDA machine
# (made for the H200 machines: CUDA 13 toolkit, cmake, ninja, GoogleTest, nlohmann-json; no xxhash
# or pcre2 -dev packages, no network). Writes logs and JSON under $OUT and prints a summary table
# last.
#
#   OUT=/some/dir bash scripts/gpu_check.sh [all|build|test|model|sanitize|bench|layers|profile|comm|proxy|fastpath|longctx|constrained|serve]... [--budget SECONDS]
#
# Phases (default all, in this order):
#   build     configure with -DK3_GPU_CHECK_ONLY=ON (only core, config, kernels with their op tests, backends,
#             the GPU benchmark), nvcc -gencode=arch=compute_90a,code=sm_90a, build k3_ops_tests and
#             k3bench_ops_gpu                                                    -> build.log
#   test      k3_ops_tests: every registered op on the GPU against the CPU reference, odd shapes and
#             TP8 shapes, relative error / cosine / max-abs per comparison      -> ops_tests.log, ops_report.json
#             (K3_OPS_FILTER=PATTERN: only those cases, a gtest filter)
#   model     k3_gpu_tests: the model end to end on the GPU against the CPU oracle (bf16 logits,
#             fp32 greedy generations, batched steps) and the engine serving on the GPU (when
#             xxhash.h was carried in .carry/include: scripts/carry_headers.sh) -> model_tests.log
#             (K3_MODEL_FILTER=PATTERN: only those cases)
#   bench     k3bench_ops_gpu: per-op time, bytes, GB/s, ratio to the floor     -> bench.log, ops_gpu.json
#   layers    k3bench_layer_gpu --check: one KDA+MoE and one MLA+MoE layer (k3-layer-tp8) per CUDA-graph
#             step, batch 1/8/32/64: us, kernels, bytes, GB/s, ratio to the copy floor -> layers.log, layer_gpu.json
#   profile   (only when named) ncu per-kernel times of one layer step at batch 1 (K3_PROFILE_BATCHES="1 64":
#             more batches), KDA+MoE and MLA+MoE,
#             standard and fused path, the last graph replay's kernels in order -> profile.txt, profile_*.csv
#   comm      (2+ GPUs, else SKIP) builds and runs k3_comm_tests (NCCL and the custom peer-access
#             all-reduce on every visible GPU) and k3bench_allreduce_gpu (custom vs NCCL latency, rows
#             1..64 x 7168)                                                   -> comm_tests.log, allreduce.log, allreduce_gpu.json
#   sanitize  k3_ops_tests on the odd shapes under compute-sanitizer memcheck and racecheck
#                                                                               -> memcheck.log, racecheck.log
#   proxy     k3bench_decode_gpu: writes the k3-proxy-tp8 checkpoint (~52 GB; $K3_PROXY_DIR, default
#             /tmp/k3-proxy-tp8 on the machine's local disk, reused when present; fails when the disk
#             lacks room), opens it on the GPU once and sweeps whole-model decode steps: ctx 8K and 32K
#             x batch 1/8/64 x decode backend auto and latency_specialized x eager/graph: ms/step,
#             tok/s, GB/s, ratio to the copy floor, speed-up of the fused path, and (one GPU) each eager
#             row's per-op profile (--profile)                                -> proxy.log, decode_gpu.json
#             (under `all` it runs only when at least 240 s of the budget are left; else SKIP)
#             K3_PROXY_TP=N splits the model over GPUs 0..N-1 (TpRunner, NCCL) -> decode_gpu_tpN.json
#   fastpath  (only when named) the latency_specialized path against the standard one on the GPU:
#             k3eval_layer_diff on k3-tiny (fp32 free run of 500 greedy tokens: identical; bf16
#             teacher-forced 200 steps, both inits: fused vs standard, and each vs the CPU oracle,
#             per-layer cosine and top-1), then, when the proxy checkpoint is on disk
#             ($K3_PROXY_DIR), fp32 decode from a synthetic 32K-token context on both paths at batch
#             1/8: every greedy token must agree -> fastpath_*.log, layer_diff_*.json, decode_gpu_fp32_32k.json
#   longctx   (only when named) a real 32K-token prompt on the proxy (chunked prefill), 16 decode steps
#             per side, every layer compared: bf16 fused vs standard, and the standard path against
#             itself with a recurrent KDA prefill (the bf16 noise floor) -> longctx_*.log, layer_diff_proxy_32k_*.json
#   constrained (only when named) k3bench_constrained_decode: the engine serving the proxy checkpoint
#             ($K3_PROXY_DIR, written when absent) with CUDA graphs and the device sampler, batch 1 and 64,
#             free vs JSON Schema grammars (Claude Code's Bash tool; the 33 Claude Code and Codex tool
#             schemas cycled over the batch): decode-step time at full batch, its ratio to the free
#             row's and to its free twins' (same prompts and output lengths, step for step; K3_CONSTRAINED_VOCAB=163840:
#             a proxy with K3's whole vocabulary), every constrained output checked against its grammar. Needs .carry (xxhash.h)
#             and .testdata/gpt-tokenizer/o200k_base.tiktoken carried (the vocabulary) -> constrained.log, constrained_decode.json
#   serve     (only when named) the server on the GPU: builds k3serve (full configuration, CUDA) in
#             build/gpu-serve from the Debian headers and libraries that scripts/carry_headers.sh
#             stages in .carry (carry it along), then scripts/evaluate.sh (agentic multi-turn replay,
#             full scale, on the proxy checkpoint in $K3_PROXY_DIR, written when absent) once per
#             decode backend in $K3_SERVE_BACKENDS (default "auto latency_specialized") at the
#             concurrencies $K3_SERVE_CONCURRENCY (default "1 2 4 8 16"), $K3_SERVE_SECONDS per level
#             (default 40), then the n-gram drafter (--speculative-method ngram, K = 4) at
#             concurrency 1 when $K3_SERVE_NGRAM is not 0; $K3_SERVE_EXTRA adds server options to the
#             backend runs, every backend alike (e.g. "--max-num-batched-tokens 8192")
#                                                                     -> serve_*/ (bundles, reports)
# summary.txt repeats the table printed at the end. The whole run keeps within --budget seconds
# (default 570: one 10-minute device command); a phase that would overrun is cut by `timeout` and
# reported as TIMEOUT. The build folder (build/gpu-check) is reused by later calls, so the phases can
# also be run one call each. Exit status: 0 when every phase that ran passed.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_check_out}
BUILD=$ROOT/build/gpu-check
BUDGET=570
PROFILE_BATCHES=${K3_PROFILE_BATCHES:-1}
PHASES=()
while (($#)); do
  case "$1" in
    --budget) BUDGET=$2; shift 2 ;;
    all|build|test|model|bench|layers|profile|comm|sanitize|proxy|fastpath|longctx|constrained|serve) PHASES+=("$1"); shift ;;
    -h|--help) sed -n '2,62p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
((${#PHASES[@]})) || PHASES=(all)
want() { local p; for p in "${PHASES[@]}"; do [[ $p == all || $p == "$1" ]] && return 0; done; return 1; }

mkdir -p "$OUT"
START=$(date +%s)
SUMMARY=()        # "phase|status|seconds|detail" rows
OVERALL=0
left() { echo $((BUDGET - ($(date +%s) - START))); }
record() {        # phase status seconds detail
  SUMMARY+=("$1|$2|$3|$4")
  [[ $2 == PASS || $2 == SKIP ]] || OVERALL=1
}
# Runs "$@" with a time cap of min($1, budget left - 15 s) seconds; sets RC and SECS.
capped() {
  local cap=$1; shift
  local avail=$(( $(left) - 15 ))
  ((avail < cap)) && cap=$avail
  if ((cap < 10)); then RC=124; SECS=0; return; fi
  local t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@"
  RC=$?
  SECS=$(( $(date +%s) - t0 ))
}

# ---------------------------------------------------------------- tools
NVCC=$(command -v nvcc || true)
[[ -z $NVCC && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
SANITIZER=$(command -v compute-sanitizer || true)
[[ -z $SANITIZER && -x /usr/local/cuda/bin/compute-sanitizer ]] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer
[[ -z $SANITIZER ]] && SANITIZER=$(ls /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
echo "gpu_check: root $ROOT, out $OUT, budget ${BUDGET}s"
echo "gpu_check: GPU: ${GPU:-none seen by nvidia-smi}; nvcc: ${NVCC:-missing} ($($NVCC --version 2>/dev/null | grep -o 'release [0-9.]*'))"
echo "gpu_check: cmake $(cmake --version 2>/dev/null | head -1 | grep -o '[0-9.]*$'), ninja $(ninja --version 2>/dev/null), compute-sanitizer: ${SANITIZER:-missing}"

TESTS=$BUILD/src/kernels/k3_ops_tests
BACKEND_TESTS=$BUILD/src/backends/cuda/k3_backends_cuda_tests
BENCH=$BUILD/k3bench_ops_gpu

# ---------------------------------------------------------------- build
if want build; then
  if [[ -z $NVCC ]]; then
    record build FAIL 0 "nvcc not found (PATH, /usr/local/cuda/bin)"
  else
    t0=$(date +%s)
    {
      # Hopper's own instructions need sm_90a; -gencode names it without a plain sm_90 pass.
      configure() {
        cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DK3_ENABLE_CUDA=ON \
          -DK3_GPU_CHECK_ONLY=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=OFF \
          "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_90a,code=sm_90a" "$@"
      }
      configure -DK3_BUILD_TESTS=ON || {
        echo "gpu_check: configure with tests failed (GoogleTest missing?); retrying without tests"
        rm -f "$BUILD/CMakeCache.txt"
        configure -DK3_BUILD_TESTS=OFF
      }
    } > "$OUT/build.log" 2>&1
    targets=(k3bench_ops_gpu)
    grep -q '^K3_BUILD_TESTS:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null &&
      targets=(k3_backends_cuda_tests k3_ops_tests k3_gpu_tests k3_eval_tests k3bench_ops_gpu)
    targets+=(k3bench_layer_gpu k3bench_decode_gpu k3eval_layer_diff)
    # The engine (and so this benchmark) is configured only when xxhash.h was carried.
    [[ -f $ROOT/.carry/include/xxhash.h ]] && targets+=(k3bench_constrained_decode)
    capped 400 cmake --build "$BUILD" --target "${targets[@]}" -j"$(nproc)" >> "$OUT/build.log" 2>&1
    secs=$(( $(date +%s) - t0 ))
    if ((RC == 0)); then
      record build PASS "$secs" "built ${targets[*]} (sm_90a)"
    elif ((RC == 124 || RC == 137)); then
      record build TIMEOUT "$secs" "see build.log"
    else
      record build FAIL "$secs" "$(grep -m1 -E 'error|Error' "$OUT/build.log" | cut -c1-110)"
    fi
  fi
fi

# ---------------------------------------------------------------- test
gtest_counts() {  # log (one or more test programs' output) -> "N passed, M failed, K skipped"
  local p f s
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | awk '{n += $1} END {print n + 0}')
  f=$(grep -oE '\[  FAILED  \] [0-9]+ tests?,' "$1" | grep -oE '[0-9]+' | awk '{n += $1} END {print n + 0}')
  s=$(grep -oE '\[  SKIPPED \] [0-9]+ tests?,' "$1" | grep -oE '[0-9]+' | awk '{n += $1} END {print n + 0}')
  echo "$p passed, $f failed, $s skipped"
}
if want test; then
  if [[ ! -x $TESTS ]]; then
    record test FAIL 0 "no $TESTS (run the build phase)"
  else
    # The backend's own tests (pool, copies, cuBLASLt), then every op; one log.
    tmp=$(mktemp)
    if [[ -x $BACKEND_TESTS ]]; then
      capped 60 "$BACKEND_TESTS" > "$tmp" 2>&1
      backend_rc=$RC
      backend_counts="backend tests: $(gtest_counts "$tmp")"
      cat "$tmp" > "$OUT/ops_tests.log"
    else
      backend_rc=0; backend_counts="backend tests: not built"; : > "$OUT/ops_tests.log"
    fi
    capped 300 "$TESTS" --k3_report="$OUT/ops_report.json" ${K3_OPS_FILTER:+--gtest_filter="$K3_OPS_FILTER"} > "$tmp" 2>&1
    counts="ops: $(gtest_counts "$tmp"); $backend_counts"
    cat "$tmp" >> "$OUT/ops_tests.log"
    rm -f "$tmp"
    ((RC == 0 && backend_rc != 0)) && RC=$backend_rc
    if ((RC == 0)); then
      if grep -q 'no CUDA backend to test' "$OUT/ops_tests.log"; then
        record test FAIL "$SECS" "$counts: GPU cases skipped ($(grep -m1 -o 'no CUDA backend to test: .*' "$OUT/ops_tests.log" | cut -c1-80))"
      else
        record test PASS "$SECS" "$counts"
      fi
    elif ((RC == 124 || RC == 137)); then
      record test TIMEOUT "$SECS" "$counts so far"
    else
      record test FAIL "$SECS" "$counts (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- model
MODEL_TESTS=$BUILD/tests/gpu/k3_gpu_tests
if want model; then
  if [[ ! -x $MODEL_TESTS ]]; then
    record model FAIL 0 "no $MODEL_TESTS (run the build phase)"
  else
    capped 240 "$MODEL_TESTS" ${K3_MODEL_FILTER:+--gtest_filter="$K3_MODEL_FILTER"} > "$OUT/model_tests.log" 2>&1
    model_rc=$RC; model_secs=$SECS; eval_secs=0
    # eval/'s GPU cases (the layer diff on CUDA sides) join the same log.
    if [[ -x $BUILD/eval/k3_eval_tests ]] && ((model_rc == 0 || model_rc == 1)); then
      capped 120 "$BUILD/eval/k3_eval_tests" --gtest_filter='LayerDiffGpu.*' > "$OUT/eval_gpu_tests.log" 2>&1
      ((RC == 0)) || model_rc=$RC
      eval_secs=$SECS
      cat "$OUT/eval_gpu_tests.log" >> "$OUT/model_tests.log"
    fi
    RC=$model_rc; SECS=$((model_secs + eval_secs))
    counts=$(gtest_counts "$OUT/model_tests.log")
    if ((RC == 0)); then
      # Multi-GPU cases (tensor parallelism) skip on a one-GPU machine: that is expected; any
      # other skip means the GPU was not usable.
      if grep 'GPU test skipped' "$OUT/model_tests.log" | grep -v 'GPU test skipped: needs [0-9]* GPUs' > /dev/null; then
        record model FAIL "$SECS" "$counts: skipped ($(grep -m1 -o 'GPU test skipped: .*' "$OUT/model_tests.log" | cut -c1-80))"
      else
        record model PASS "$SECS" "$counts$(grep -q 'GPU test skipped: needs' "$OUT/model_tests.log" && echo ' (multi-GPU cases need 2+ GPUs)')"
      fi
    elif ((RC == 124 || RC == 137)); then
      record model TIMEOUT "$SECS" "$counts so far"
    else
      record model FAIL "$SECS" "$counts (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- bench
if want bench; then
  if [[ ! -x $BENCH ]]; then
    record bench FAIL 0 "no $BENCH (run the build phase)"
  else
    capped 200 "$BENCH" --out "$OUT/ops_gpu.json" > "$OUT/bench.log" 2>&1
    if ((RC == 0)); then
      record bench PASS "$SECS" "$(grep -m1 -o 'device copy [0-9]* GB/s' "$OUT/bench.log"), $(grep -c '^[a-z]' "$OUT/bench.log") lines"
    elif ((RC == 124 || RC == 137)); then
      record bench TIMEOUT "$SECS" "partial table in bench.log"
    else
      record bench FAIL "$SECS" "$(grep -m1 'error' "$OUT/bench.log" | cut -c1-110) (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- layers
LAYER_BENCH=$BUILD/k3bench_layer_gpu
if want layers; then
  if [[ ! -x $LAYER_BENCH ]]; then
    record layers FAIL 0 "no $LAYER_BENCH (run the build phase)"
  else
    # --check: outputs finite, eager deterministic, one graph replay equal to eager bit for bit.
    capped 300 "$LAYER_BENCH" --check --out "$OUT/layer_gpu.json" > "$OUT/layers.log" 2>&1
    tp8_rc=$RC; tp8_secs=$SECS
    # One TP16 rank's shapes too (6 heads, experts [192, 3584]), batch 1 and 64, both paths; it
    # runs whatever the TP8 rows found (a failed check exits 3 but times every row).
    if ((tp8_rc == 0 || tp8_rc == 3)); then
      capped 120 "$LAYER_BENCH" --tp 16 --batches 1,64 --check --out "$OUT/layer_gpu_tp16.json" >> "$OUT/layers.log" 2>&1
      ((tp8_rc == 0)) && tp8_rc=$RC
      SECS=$((tp8_secs + SECS))
    fi
    RC=$tp8_rc
    if ((RC == 0)); then
      record layers PASS "$SECS" "$(grep -c 'check ok' "$OUT/layers.log") rows checked (TP8 and TP16 shapes), $(grep -m1 -o 'device copy [0-9]* GB/s' "$OUT/layers.log")"
    elif ((RC == 124 || RC == 137)); then
      record layers TIMEOUT "$SECS" "partial rows in layers.log"
    elif ((RC == 3)); then
      record layers FAIL "$SECS" "$(grep -m1 'CHECK FAILED' "$OUT/layers.log" | cut -c1-110)"
    else
      record layers FAIL "$SECS" "$(grep -m1 -iE 'error' "$OUT/layers.log" | cut -c1-110) (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- profile
# (only when named) per-kernel GPU time of one layer step at each batch of $K3_PROFILE_BATCHES
# (default 1), each layer kind and decode path: ncu (clocks left as they run, L2 flushed between kernels) over k3bench_layer_gpu with one
# copy and five timed replays; the table lists the kernels of the last graph replay in launch order.
if [[ " ${PHASES[*]} " == *" profile "* ]]; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -z $NCU || ! -x $LAYER_BENCH ]]; then
    record profile FAIL 0 "needs ncu (${NCU:-missing}) and $LAYER_BENCH"
  else
    t0=$(date +%s); prof_rc=0
    for batch in $PROFILE_BATCHES; do
      for layer in kda mla; do
        for path in auto latency_specialized; do
          tag=${layer}_${path}_b$batch
          capped 60 "$NCU" --csv --metrics gpu__time_duration.sum --clock-control none --log-file "$OUT/profile_$tag.csv" \
            "$LAYER_BENCH" --batches "$batch" --copies 1 --replays 5 --layers "$layer" --paths "$path" \
            --out "$OUT/profile_$tag.json" > "$OUT/profile_$tag.log" 2>&1
          ((RC == 0)) || prof_rc=$RC
        done
      done
    done
    python3 - "$OUT" $PROFILE_BATCHES > "$OUT/profile.txt" 2>&1 <<'PY'
import csv, json, os, sys
out = sys.argv[1]
for tag in [f"{l}_{p}_b{b}" for b in sys.argv[2:] for l in ("kda", "mla") for p in ("auto", "latency_specialized")]:
        batch = tag.rsplit("_b", 1)[1]
        try:
            rows = [r for r in csv.reader(open(f"{out}/profile_{tag}.csv")) if len(r) > 10]
            head = rows[0]; rows = rows[1:]
            name_i, val_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
            n = int(round(json.load(open(f"{out}/profile_{tag}.json"))["rows"][0]["kernels_per_layer"]))
        except Exception as e:
            print(f"{tag}: no profile ({e})"); continue
        # The fused rows time the AttnRes bank write as their own graph after the layer's replays:
        # the layer's last replay ends where that trailing run of bank kernels starts.
        end = len(rows)
        while end > 0 and "bank_kernel" in rows[end - 1][name_i]: end -= 1
        last = rows[end - n:end]
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        us = [float(r[val_i].replace(",", "")) * scale.get(r[unit_i], 1.0) for r in last]
        print(f"{tag}: batch {batch}, {n} kernels of the last replay, sum {sum(us):.1f} us (ncu, L2 flushed per kernel)")
        for r, t in zip(last, us):
            print(f"  {t:8.1f}  {r[name_i][:110]}")
PY
    record profile "$( ((prof_rc == 0)) && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "see profile.txt"
  fi
fi

# ---------------------------------------------------------------- comm
COMM_TESTS=$BUILD/src/comm/k3_comm_tests
AR_BENCH=$BUILD/k3bench_allreduce_gpu
if want comm; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if ((ngpu < 2)); then
    record comm SKIP 0 "needs 2+ GPUs, $ngpu visible (ask for an nvidia-h200-x2/x4/x8 machine)"
  else
    # The benchmark exists only where CMake found NCCL; the tests build either way.
    comm_targets=(k3_comm_tests)
    # (grep reads all of ninja's output: with -q it would stop early, ninja would die of SIGPIPE
    # and pipefail would call the pipeline failed)
    ninja -C "$BUILD" -t targets all 2>/dev/null | grep '^k3bench_allreduce_gpu:' > /dev/null && comm_targets+=(k3bench_allreduce_gpu)
    capped 300 cmake --build "$BUILD" --target "${comm_targets[@]}" -j"$(nproc)" > "$OUT/comm_build.log" 2>&1
    if [[ ! -f $BUILD/CMakeCache.txt ]]; then
      record comm FAIL 0 "no $BUILD (run the build phase)"
    elif ((RC != 0)); then
      record comm FAIL "$SECS" "build: $(grep -m1 -E 'error|Error' "$OUT/comm_build.log" | cut -c1-100)"
    else
      capped 240 "$COMM_TESTS" > "$OUT/comm_tests.log" 2>&1
      test_rc=$RC; test_secs=$SECS; counts=$(gtest_counts "$OUT/comm_tests.log")
      if [[ -x $AR_BENCH ]]; then
        capped 180 "$AR_BENCH" --out "$OUT/allreduce_gpu.json" > "$OUT/allreduce.log" 2>&1
      else
        RC=0; SECS=0; echo "k3bench_allreduce_gpu not configured (NCCL not found)" > "$OUT/allreduce.log"
      fi
      if ((test_rc == 0 && RC == 0)); then
        record comm PASS $((test_secs + SECS)) "$ngpu GPUs: $counts; one-shot us: $(grep -m1 '^  custom_one_shot ' "$OUT/allreduce.log" | tr -s ' ' | cut -c18-70)"
      elif ((test_rc == 124 || test_rc == 137 || RC == 124 || RC == 137)); then
        record comm TIMEOUT $((test_secs + SECS)) "tests rc $test_rc ($counts), bench rc $RC"
      else
        record comm FAIL $((test_secs + SECS)) "tests rc $test_rc ($counts), bench rc $RC: $(grep -m1 -iE 'error|FAILED' "$OUT/comm_tests.log" "$OUT/allreduce.log" | cut -c1-90)"
      fi
    fi
  fi
fi

# ---------------------------------------------------------------- sanitize
# The odd shapes only (small, every code path); TP8 shapes would take the sanitizers far too long.
SAN_FILTER='OpsOdd.*:OpsCoverage.*'
# True when every race racecheck reports lies inside a cuBLASLt kernel (nvjet_*) on both sides.
library_only_races() {
  local lines
  lines=$(grep -E '(Race reported between|and) (Read|Write) access at ' "$1") || return 1
  ! grep -vqE 'access at nvjet_' <<< "$lines"
}
if want sanitize; then
  for tool in memcheck racecheck; do
    if [[ -z $SANITIZER ]]; then
      record "$tool" SKIP 0 "compute-sanitizer not found"
      continue
    fi
    if [[ ! -x $TESTS ]]; then
      record "$tool" FAIL 0 "no $TESTS (run the build phase)"
      continue
    fi
    cap=240; [[ $tool == racecheck ]] && cap=300
    capped "$cap" "$SANITIZER" --tool "$tool" --error-exitcode 86 --print-limit 50 \
      "$TESTS" --gtest_filter="$SAN_FILTER" > "$OUT/$tool.log" 2>&1
    verdict=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | sed 's/^=* *//' | cut -c1-70)
    counts=$(gtest_counts "$OUT/$tool.log")
    if ((RC == 0)); then
      record "$tool" PASS "$SECS" "${verdict:-no report line}; $counts"
    elif ((RC == 124 || RC == 137)); then
      record "$tool" TIMEOUT "$SECS" "$counts so far"
    elif ((RC == 86)) && [[ $tool == racecheck ]] && ! library_only_races "$OUT/$tool.log"; then
      record "$tool" FAIL "$SECS" "${verdict:-hazards found}; see $tool.log"
    elif ((RC == 86)) && [[ $tool == racecheck ]]; then
      # racecheck does not model the mbarrier/TMA synchronisation of cuBLASLt's Hopper kernels
      # (nvjet_*): their reports are not ours to fix, and every k3serve kernel came out clean.
      record "$tool" PASS "$SECS" "no hazard in k3serve kernels (only in cuBLASLt nvjet_*, see $tool.log); $counts"
    elif ((RC == 86)); then
      record "$tool" FAIL "$SECS" "${verdict:-hazards/errors found}; see $tool.log"
    else
      record "$tool" FAIL "$SECS" "rc $RC; $counts; ${verdict}"
    fi
  done
fi

# ---------------------------------------------------------------- proxy
DECODE_BENCH=$BUILD/k3bench_decode_gpu
PROXY_DIR=${K3_PROXY_DIR:-/tmp/k3-proxy-tp8}
PROXY_GB=52  # k3-proxy-tp8 checkpoint size (51.93 GB), plus 1 GB margin below
if want proxy; then
  explicit=0; for p in "${PHASES[@]}"; do [[ $p == proxy ]] && explicit=1; done
  mkdir -p "$(dirname "$PROXY_DIR")"
  free_gb=$(( $(df -Pk "$(dirname "$PROXY_DIR")" | awk 'NR==2 {print $4}') / 1000000 ))
  if [[ ! -x $DECODE_BENCH ]]; then
    record proxy FAIL 0 "no $DECODE_BENCH (run the build phase)"
  elif ((explicit == 0 && $(left) < 240)); then
    record proxy SKIP 0 "needs ~240 s, $(left) s of the budget left: run 'gpu_check.sh proxy' alone"
  elif [[ ! -f $PROXY_DIR/config.json ]] && ((free_gb < PROXY_GB + 1)); then
    record proxy FAIL 0 "only ${free_gb} GB free under $(dirname "$PROXY_DIR"); the k3-proxy-tp8 checkpoint needs ${PROXY_GB} GB + 1 GB"
  else
    PROXY_TP=${K3_PROXY_TP:-1}
    proxy_json=$OUT/decode_gpu.json; ((PROXY_TP > 1)) && proxy_json=$OUT/decode_gpu_tp$PROXY_TP.json
    profile=(--profile); ((PROXY_TP > 1)) && profile=()  # per-op times of each eager row (one GPU)
    capped 480 "$DECODE_BENCH" --model "$PROXY_DIR" --make --config k3-proxy-tp8 --tp "$PROXY_TP" --ctx 8192,32768 \
      --decode-backend auto,latency_specialized "${profile[@]}" --out "$proxy_json" > "$OUT/proxy.log" 2>&1
    if ((RC == 0)); then
      record proxy PASS "$SECS" "$(grep -m1 -o 'wrote [0-9.]* GB in [0-9.]* s' "$OUT/proxy.log" || echo 'checkpoint reused'); $(grep -m1 -o 'opened .* in [0-9.]* s' "$OUT/proxy.log" | grep -o 'in [0-9.]* s' | sed 's/^/load /')"
    elif ((RC == 124 || RC == 137)); then
      record proxy TIMEOUT "$SECS" "partial rows in proxy.log"
    else
      record proxy FAIL "$SECS" "$(grep -m1 -iE 'error' "$OUT/proxy.log" | cut -c1-110) (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- constrained
CONSTRAINED_BENCH=$BUILD/k3bench_constrained_decode
# K3_CONSTRAINED_VOCAB=163840: the proxy written with K3's whole vocabulary (its own folder, 4.7 GB
# more for the embedding and lm_head), instead of the proxy's 20480.
CONSTRAINED_VOCAB=${K3_CONSTRAINED_VOCAB:-0}
CONSTRAINED_DIR=$PROXY_DIR
CONSTRAINED_EXTRA_GB=0
if ((CONSTRAINED_VOCAB > 0)); then CONSTRAINED_DIR=$PROXY_DIR-v$CONSTRAINED_VOCAB; CONSTRAINED_EXTRA_GB=5; fi
if [[ " ${PHASES[*]} " == *" constrained "* ]]; then
  mkdir -p "$(dirname "$PROXY_DIR")"
  free_gb=$(( $(df -Pk "$(dirname "$PROXY_DIR")" | awk 'NR==2 {print $4}') / 1000000 ))
  if [[ ! -x $CONSTRAINED_BENCH ]]; then
    record constrained FAIL 0 "no $CONSTRAINED_BENCH (run the build phase with .carry carried)"
  elif [[ ! -f $ROOT/.testdata/gpt-tokenizer/o200k_base.tiktoken ]]; then
    record constrained FAIL 0 "no .testdata/gpt-tokenizer/o200k_base.tiktoken (carry it: the vocabulary)"
  elif [[ ! -f $CONSTRAINED_DIR/config.json ]] && ((free_gb < PROXY_GB + CONSTRAINED_EXTRA_GB + 1)); then
    record constrained FAIL 0 "only ${free_gb} GB free under $(dirname "$PROXY_DIR"); the checkpoint needs $((PROXY_GB + CONSTRAINED_EXTRA_GB)) GB + 1 GB"
  else
    capped 480 "$CONSTRAINED_BENCH" --model "$CONSTRAINED_DIR" --make --config k3-proxy-tp8 --vocab "$CONSTRAINED_VOCAB" \
      --batches 1,64 --grammars free,bash,agent_tools --rounds 2 \
      --out "$OUT/constrained_decode.json" > "$OUT/constrained.log" 2>&1
    if ((RC == 0)); then
      record constrained PASS "$SECS" "$(grep -E '^(1|64) +(bash|agent_tools)' "$OUT/constrained.log" | awk '{printf "b%s %s %s twins %s; ", $1, $2, $6, $7}')"
    elif ((RC == 124 || RC == 137)); then
      record constrained TIMEOUT "$SECS" "partial log in constrained.log"
    else
      record constrained FAIL "$SECS" "$(grep -m1 -iE 'error' "$OUT/constrained.log" | cut -c1-110) (rc $RC)"
    fi
  fi
fi

# ---------------------------------------------------------------- fastpath
LAYER_DIFF=$BUILD/k3eval_layer_diff
named() { local p; for p in "${PHASES[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
if named fastpath; then
  if [[ ! -x $LAYER_DIFF ]]; then
    record fastpath FAIL 0 "no $LAYER_DIFF (run the build phase)"
  else
    t0=$(date +%s)
    fp_rc=0
    capped 120 "$LAYER_DIFF" --config k3-tiny --seed 3 --prompt-len 48 --steps 500 --free-run --check \
      --a device=cuda,precision=fp32 --b device=cuda,precision=fp32,decode_backend=latency_specialized \
      --out "$OUT/layer_diff_fp32.json" > "$OUT/fastpath_layer_diff_fp32.log" 2>&1
    ((RC == 0)) || fp_rc=$RC
    detail="fp32 free run: $(grep -m1 -o 'identical.*\|first divergence.*' "$OUT/fastpath_layer_diff_fp32.log" | cut -c1-40)"
    # bf16: the fused path against the standard one, and each against the CPU oracle, so the fused
    # path's divergence reads beside the noise floor of bf16 itself (two correct implementations
    # that round in different orders). Teacher-forced, 200 decode steps, both inits.
    for init in realistic sensitive; do
      for pair in "std_fused|device=cuda,precision=bf16|device=cuda,precision=bf16,decode_backend=latency_specialized" \
                  "cpu_std|device=cpu,precision=bf16|device=cuda,precision=bf16" \
                  "cpu_fused|device=cpu,precision=bf16|device=cuda,precision=bf16,decode_backend=latency_specialized"; do
        IFS='|' read -r name side_a side_b <<< "$pair"
        capped 120 "$LAYER_DIFF" --config k3-tiny --seed 3 --init "$init" --prompt-len 48 --steps 200 --a "$side_a" --b "$side_b" \
          --out "$OUT/layer_diff_bf16_${name}_$init.json" > "$OUT/fastpath_layer_diff_bf16_${name}_$init.log" 2>&1
        ((RC == 0 || fp_rc != 0)) || fp_rc=$RC
      done
    done
    detail+="; bf16 top-1 fused/std: $(grep -m1 -o 'top-1 agreement [0-9.]*%' "$OUT/fastpath_layer_diff_bf16_std_fused_realistic.log" | grep -o '[0-9.]*%')"
    detail+=" (std/cpu $(grep -m1 -o 'top-1 agreement [0-9.]*%' "$OUT/fastpath_layer_diff_bf16_cpu_std_realistic.log" | grep -o '[0-9.]*%'))"
    if [[ -x $DECODE_BENCH && -f $PROXY_DIR/config.json ]]; then
      # Long context, decisive: fp32 activations from the same synthetic 32K-token context, both
      # paths, batch 1 / 8, 8 greedy steps each: every token must agree (bf16 rounding noise
      # flips nearly tied routes of the random proxy: see the longctx phase for that comparison).
      capped 240 "$DECODE_BENCH" --model "$PROXY_DIR" --precision fp32 --ctx 32768 --batches 1,8 --modes eager \
        --steps 8 --warmup 1 --decode-backend auto,latency_specialized --out "$OUT/decode_gpu_fp32_32k.json" \
        > "$OUT/fastpath_fp32_32k.log" 2>&1
      ((RC == 0 || fp_rc != 0)) || fp_rc=$RC
      agree=$(grep -c 'greedy tokens equal (identical)' "$OUT/fastpath_fp32_32k.log"); pairs=$(grep -c 'greedy tokens equal' "$OUT/fastpath_fp32_32k.log")
      ((agree == pairs && pairs > 0)) || fp_rc=1
      detail+="; fp32 32K: $agree of $pairs batches token-identical"
    else
      detail+="; proxy skipped (no checkpoint: run the proxy phase first)"
    fi
    record fastpath "$( ((fp_rc == 0)) && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "$detail"
  fi
fi

# ---------------------------------------------------------------- longctx
# (only when named; needs the proxy checkpoint) a real 32K-token prompt, chunked prefill (standard
# on both sides), then 16 teacher-forced decode steps per path, every layer compared: bf16 fused vs
# standard, and the bf16 noise floor of the standard path against itself with the prompt's KDA state
# prefilled by the recurrent instead of the chunked kernel. (fp32 here prefills too slowly; the
# fastpath phase compares fp32 decode from a synthetic 32K context instead.)
if named longctx; then
  if [[ ! -x $LAYER_DIFF || ! -f $PROXY_DIR/config.json ]]; then
    record longctx FAIL 0 "needs $LAYER_DIFF and the proxy checkpoint (run the build and proxy phases)"
  else
    t0=$(date +%s); lc_rc=0; detail=""
    for lc in "bf16|device=cuda,precision=bf16,kv_cache=fp8|device=cuda,precision=bf16,kv_cache=fp8,decode_backend=latency_specialized" \
              "bf16_noise_floor|device=cuda,precision=bf16,kv_cache=fp8|device=cuda,precision=bf16,kv_cache=fp8,kda_prefill=recurrent"; do
      IFS='|' read -r name side_a side_b <<< "$lc"
      capped 150 "$LAYER_DIFF" --model "$PROXY_DIR" --prompt-len 32768 --prefill-chunk 4096 --no-prefill-trace --steps 16 \
        --a "$side_a" --b "$side_b" --out "$OUT/layer_diff_proxy_32k_$name.json" > "$OUT/longctx_$name.log" 2>&1
      ((RC == 0)) || lc_rc=$RC
      detail+="32K $name: top-1 $(grep -m1 -o 'top-1 agreement [0-9.]*%' "$OUT/longctx_$name.log" | grep -o '[0-9.]*%'); "
    done
    record longctx "$( ((lc_rc == 0)) && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "$detail"
  fi
fi

# ---------------------------------------------------------------- serve
if named serve; then
  t0=$(date +%s)
  SERVE_BUILD=$ROOT/build/gpu-serve
  if [[ ! -f $ROOT/.carry/lib/pkgconfig/cpp-httplib.pc || -z $NVCC ]]; then
    record serve FAIL 0 "needs nvcc and .carry from scripts/carry_headers.sh (carried along)"
  else
    {
      PKG_CONFIG_PATH=$ROOT/.carry/lib/pkgconfig cmake -S "$ROOT" -B "$SERVE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DK3_ENABLE_CUDA=ON -DK3_BUILD_TESTS=OFF -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=OFF \
        "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_90a,code=sm_90a" "-DCMAKE_CXX_FLAGS=-I$ROOT/.carry/include"
    } > "$OUT/serve_build.log" 2>&1
    capped 300 cmake --build "$SERVE_BUILD" --target k3serve k3serve-bench -j"$(nproc)" >> "$OUT/serve_build.log" 2>&1
    if ((RC != 0)); then
      record serve FAIL $(( $(date +%s) - t0 )) "build: $(grep -m1 -E 'error|Error' "$OUT/serve_build.log" | cut -c1-100)"
    else
      sv_rc=0; detail="built in $SECS s"
      runs=(); for b in ${K3_SERVE_BACKENDS:-auto latency_specialized}; do runs+=("$b|${K3_SERVE_CONCURRENCY:-1 2 4 8 16}|--decode-backend $b ${K3_SERVE_EXTRA:-}"); done
      [[ ${K3_SERVE_NGRAM:-1} != 0 ]] && runs+=("ngram|1|--decode-backend auto --speculative-method ngram --num-speculative-tokens 4")
      for r in "${runs[@]}"; do
        IFS='|' read -r name conc extra <<< "$r"
        # No --model-dir: evaluate.sh takes $K3_PROXY_DIR and writes it (with its tokenizer) when absent.
        export K3_PROXY_DIR=$PROXY_DIR
        capped 600 bash "$ROOT/scripts/evaluate.sh" --bin "$SERVE_BUILD/k3serve" --device cuda \
          --scale full --concurrency "$conc" --max-duration "${K3_SERVE_SECONDS:-40}" --serve-extra "$extra" --no-checks \
          --out "$OUT/serve_$name" > "$OUT/serve_$name.log" 2>&1
        ((RC == 0)) || sv_rc=$RC
        detail+="; $name: rc $RC in $SECS s"
        # Per level: finished requests, mean TTFT and TPOT (bench-serve's text report).
        for f in "$OUT/serve_$name"/agentic-c*.txt; do
          [[ -f $f ]] || continue
          detail+=" [c${f##*agentic-c}"; detail=${detail%.txt}
          detail+=": $(awk '/^Successful requests:/ {ok=$3} /^-+ Time to First Token/ {t=1} t && /^mean:/ {ttft=$2; t=0}
                           /^-+ Time per Output Token/ {p=1} p && /^mean:/ {tpot=$2; p=0}
                           END {printf "%s done, TTFT %s ms, TPOT %s ms", ok, ttft, tpot}' "$f")]"
        done
      done
      record serve "$( ((sv_rc == 0)) && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "$detail"
    fi
  fi
fi

# ---------------------------------------------------------------- summary (printed last)
{
  echo
  echo "================ k3serve GPU check: ${GPU:-no GPU seen} ================"
  if [[ -f $OUT/ops_report.json ]] && command -v python3 > /dev/null; then
    python3 - "$OUT/ops_report.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["comparisons"]
groups = {}
for r in rows:
    groups.setdefault((r["op"], r["mode"]), []).append(r)
def closeness(r):  # error over tolerance: > 1 fails; non-finite is worst
    if not r["finite"]: return float("inf")
    return r["rel_err"] / r["tol_rel"] if r["tol_rel"] > 0 else (0.0 if r["rel_err"] == 0 else float("inf"))
print("op comparisons vs the CPU reference (worst case per op and mode):" if rows else "no op comparisons recorded")
if rows:
    print(f"  {'op':16} {'mode':4} {'n':>4} {'fail':>4} {'worst rel_err':>13} {'tol':>8} {'cosine':>12} {'max_abs':>10}  where")
for (op, mode), rs in sorted(groups.items()):
    r = max(rs, key=closeness)
    fails = sum(not x["pass"] for x in rs)
    rel = "nonfinite" if not r["finite"] else f"{r['rel_err']:.2e}"
    print(f"  {op:16} {mode:4} {len(rs):4d} {fails:4d} {rel:>13} {r['tol_rel']:8.0e} {r['cosine']:12.9f} {r['max_abs']:10.2e}  {r['shape']} {r['what']}")
PY
  fi
  if [[ -f $OUT/ops_gpu.json ]] && command -v python3 > /dev/null; then
    python3 - "$OUT/ops_gpu.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
print(f"per-op timings (median, L2 flushed), device copy {b['copy_GBps']:.0f} GB/s; 'x floor' = time / (bytes / 4.3 TB/s):")
print(f"  {'op':26} {'shape':22} {'batch':>5} {'us':>9} {'GB/s':>7} {'x floor':>8}")
for r in b["rows"]:
    if r["group"] == "elt" and r["batch"] != 64: continue
    print(f"  {r['op'][:26]:26} {r['shape'][:22]:22} {r['batch']:5d} {r['median_us']:9.1f} {r['GBps']:7.0f} {r['ratio_to_4p3TBps_floor']:8.2f}")
PY
  fi
  for layer_json in "$OUT"/layer_gpu*.json; do
    [[ -f $layer_json ]] && command -v python3 > /dev/null || continue
    python3 - "$layer_json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
c = b["config"]
print(f"per-layer decode ({c['name']}, ctx {c['ctx_tokens']}, fp8 cache; CUDA graph / {c['copies']} copies, median of {c['replays']} replays; collectives stubbed); floor = bytes / device copy {b['copy_GBps']:.0f} GB/s:")
print(f"  {'layer':16} {'path':6} {'batch':>5} {'us/layer':>9} {'p10':>8} {'p90':>8} {'kernels':>7} {'MB':>8} {'GB/s':>6} {'floor_us':>8} {'x floor':>7} {'speedup':>7}  check")
std = {}
for r in b["rows"]:
    if "median_us" not in r: continue  # rows without a layer time (e.g. the bank write)
    path = r.get("path", "auto")
    us = r.get("median_us_with_bank", r["median_us"])  # the fused path: its share of the bank write included
    key = (r["layer"], r["batch"])
    if path == "auto": std[key] = us
    speed = f"{std[key] / us:7.2f}" if path != "auto" and key in std else ""
    chk = "" if not r["check"] else ("ok" if r["check"]["pass"] else "FAILED")
    print(f"  {r['layer']:16} {path[:6]:6} {r['batch']:5d} {us:9.1f} {r['p10_us']:8.1f} {r['p90_us']:8.1f} {r['kernels_per_layer']:7.1f} {r['bytes']['total']/1e6:8.1f} {r['bytes']['total']/(us*1e-6)/1e9:6.0f} {r['floor_us_copy']:8.1f} {us/r['floor_us_copy']:7.2f} {speed:>7}  {chk}")
PY
  done
  layer_diffs=("$OUT"/layer_diff_*.json)
  if [[ -f ${layer_diffs[0]} ]] && command -v python3 > /dev/null; then
    python3 - "${layer_diffs[@]}" <<'PY'
import json, os, sys
print("layer diffs (k3eval_layer_diff; A is the reference side):")
print(f"  {'bundle':34} {'mode':14} {'steps':>5} {'top-1':>7} {'min cos':>9} {'logits min cos':>14}  first below 0.999")
for f in sys.argv[1:]:
    b = json.load(open(f)); s = b["summary"]
    lg = [l for l in b["layers"] if l["name"] == "logits"]
    fb = s.get("first_below_threshold") or {}
    where = f"{fb.get('name', '')}@{fb.get('layer', '')}" if fb else ""
    if b["mode"] == "free_run":
        div = s["first_divergence"]
        print(f"  {os.path.basename(f)[:34]:34} {'free_run':14} {len(b['tokens_a']):5d} {'identical' if div < 0 else 'diverges at ' + str(div)}")
        continue
    print(f"  {os.path.basename(f)[:34]:34} {b['mode']:14} {len(b['steps']):5d} {100*float(s['top1_agreement']):6.2f}% {float(s['min_cosine']):9.6f} {float(lg[0]['cosine_worst']) if lg else float('nan'):14.6f}  {where}")
PY
  fi
  for decode_json in "$OUT"/decode_gpu*.json; do
    [[ -f $decode_json ]] && command -v python3 > /dev/null || continue
    python3 - "$decode_json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
c = b["config"]
tp = c.get("tp", 1)
print(f"whole-model decode ({c['name']}{f', TP{tp} over {tp} GPUs, per-GPU bytes' if tp > 1 else ''}, {c['weight_bytes']/1e9:.1f} GB, ctx {c['ctx_tokens']}, fp8 cache, bf16; median of {c['steps']} steps; "
      f"checkpoint written in {b['checkpoint_write_seconds']:.0f} s, loaded in {b['load_seconds']:.0f} s); floor = bytes / device copy {b['copy_GBps']:.0f} GB/s:")
print(f"  {'ctx':>6} {'batch':>5} {'backend':7} {'mode':5} {'ms/step':>9} {'p10':>8} {'p90':>8} {'tok/s':>9} {'kernels':>7} {'GB/step':>8} {'GB/s':>6} {'floor_ms':>8} {'x floor':>7} {'x_auto':>6}")
for r in b["rows"]:
    be = "fused" if r.get("decode_backend") == "latency_specialized" else "auto"
    xa = f"{r['speedup_vs_auto']:6.2f}" if "speedup_vs_auto" in r else ""
    print(f"  {r.get('ctx_tokens', c['ctx_tokens']):6d} {r['batch']:5d} {be:7} {r['mode']:5} {r['median_ms']:9.2f} {r['p10_ms']:8.2f} {r['p90_ms']:8.2f} {r['tokens_per_s']:9.1f} {r['kernels_per_step']:7d} "
          f"{r['bytes']['total']/1e9:8.2f} {r['GBps']:6.0f} {r['floor_ms_copy']:8.2f} {r['ratio_to_copy_floor']:7.2f} {xa:>6}{'' if r['logits_finite'] else '  NON-FINITE'}")
for a in b.get("backend_agreement", []):
    print(f"  {c.get('precision', 'bf16')} tokens fused vs auto, ctx {a['ctx_tokens']} batch {a['batch']} {a['mode']}: {a['equal']} of {a['tokens']} equal" + (" (identical)" if a["identical"] else f", first difference at step {a['first_different_step']}"))
PY
  done
  echo
  printf '%-10s %-8s %6s  %s\n' phase status seconds detail
  for row in "${SUMMARY[@]}"; do
    IFS='|' read -r p s t d <<< "$row"
    printf '%-10s %-8s %6s  %s\n' "$p" "$s" "$t" "$d"
  done
  echo "outputs: $OUT ($(ls "$OUT" | tr '\n' ' '))"
  echo "overall: $([[ $OVERALL == 0 ]] && echo PASS || echo FAIL) in $(( $(date +%s) - START ))s"
} | tee "$OUT/summary.txt"
exit $OVERALL
