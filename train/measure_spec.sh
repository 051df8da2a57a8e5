#!/usr/bin/env bash
# train/measure_spec.sh WORK [DRAFT_SECONDS]: real speculative decoding on the GPU, on the bundled
# trained model (models/k3-code-15m; K3_MODEL=DIR for another), in one call of the device tool:
#   1. k3serve for CUDA (sm_90a; headers the machine lacks from .carry), built while
#      train/corpus.py collects a training corpus from the machine's installed Python packages;
#   2. the corpus in the model's own tokenizer (k3serve encode-corpus);
#   3. an EAGLE-3 and a DSpark draft trained on the target's hidden states (train/eagle3_torch.py,
#      train/dspark_torch.py, DRAFT_SECONDS each, default 150, side by side on the one GPU)
#      -> WORK/eagle3, WORK/dspark (kept: a second call on a warm machine measures only);
#   4. the target served on the GPU without speculation, with n-gram (K = 4), EAGLE-3 (K = 4) and
#      DSpark (K = 7) drafts, each probed by train/spec_probe.py on the code, chat and agentic sets at
#      concurrency 1, 8 and 32 (greedy, 128 tokens per request)
#      -> WORK/probe/<method>_<set>_c<N>.json, and a table (tokens/s, speed-up, acceptance) last.
# Settings (environment): K3_DEVICE=cpu serves on the CPU (default cuda); K3_METHODS (default
# "none ngram eagle3 dspark"; the drafts are trained only when named); K3_CONCURRENCY (default
# "1 8 32"); K3_K3SERVE=PATH uses that k3serve instead of building one; PYTHON (default python3;
# Debian's CPU torch: /usr/bin/python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:?usage: train/measure_spec.sh WORK [DRAFT_SECONDS]}
DRAFT_SECONDS=${2:-150}
MODEL=${K3_MODEL:-$ROOT/models/k3-code-15m}
DEVICE=${K3_DEVICE:-cuda}
METHODS=${K3_METHODS:-none ngram eagle3 dspark}
CONCURRENCY=${K3_CONCURRENCY:-1 8 32}
mkdir -p "$WORK/probe"
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
stamp() { echo "[$(date +%T)] $*"; }

stamp "build k3serve ($DEVICE) and collect the corpus"
K3=${K3_K3SERVE:-$WORK/build/k3serve}
drafts=0
[[ " $METHODS " == *" eagle3 "* || " $METHODS " == *" dspark "* ]] && drafts=1
if [[ ! -x $K3 ]]; then
  (PKG_CONFIG_PATH=$ROOT/.carry/lib/pkgconfig cmake -S "$ROOT" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DK3_ENABLE_CUDA=$([[ $DEVICE == cuda ]] && echo ON || echo OFF) -DK3_BUILD_TESTS=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
     -DCMAKE_CUDA_ARCHITECTURES=OFF "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_90a,code=sm_90a" \
     "-DCMAKE_CXX_FLAGS=-I$ROOT/.carry/include" &&
   cmake --build "$WORK/build" --target k3serve -j"$(nproc)") > "$WORK/build.log" 2>&1 &
  build=$!
fi
((drafts == 0)) || [[ -f $WORK/corpus/train.jsonl ]] ||
  "$PYTHON" "$ROOT/train/corpus.py" --out "$WORK/corpus" --max-bytes 80000000 --retrieval-chats 2000 > "$WORK/corpus.log"
if [[ -n ${build:-} ]] && ! wait "$build"; then tail -30 "$WORK/build.log"; exit 1; fi
((drafts == 0)) || [[ -f $WORK/train.bin ]] ||
  "$K3" encode-corpus --tokenizer "$MODEL" --corpus "$WORK/corpus/train.jsonl" --out "$WORK/train.bin"

pids=()
((drafts == 0)) || stamp "train the drafts ($DRAFT_SECONDS s each, side by side)"
[[ $drafts == 0 || " $METHODS " != *" eagle3 "* || -f $WORK/eagle3/model.safetensors ]] || {
  "$PYTHON" "$ROOT/train/eagle3_torch.py" --target "$MODEL" --tokens "$WORK/train.bin" --out "$WORK/eagle3" \
    --seconds "$DRAFT_SECONDS" > "$WORK/train_eagle3.log" 2>&1 & pids+=($!); }
[[ $drafts == 0 || " $METHODS " != *" dspark "* || -f $WORK/dspark/model.safetensors ]] || {
  "$PYTHON" "$ROOT/train/dspark_torch.py" --target "$MODEL" --tokens "$WORK/train.bin" --out "$WORK/dspark" \
    --seconds "$DRAFT_SECONDS" > "$WORK/train_dspark.log" 2>&1 & pids+=($!); }
for p in "${pids[@]}"; do wait "$p" || { tail -20 "$WORK"/train_*.log; exit 1; }; done
((${#pids[@]} == 0)) || tail -3 "$WORK"/train_*.log

port=8130
for method in $METHODS; do
  args=()
  case $method in
    ngram) args=(--speculative-method ngram --num-speculative-tokens 4) ;;
    eagle3) args=(--speculative-method eagle3 --speculative-model "$WORK/eagle3" --num-speculative-tokens 4) ;;
    dspark) args=(--speculative-method dspark --speculative-model "$WORK/dspark" --num-speculative-tokens 7) ;;
  esac
  port=$((port + 1))
  stamp "serve on $DEVICE: $method"
  "$K3" serve --model "$MODEL" --device "$DEVICE" --port $port --max-num-seqs 64 "${args[@]}" > "$WORK/serve_$method.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && break; sleep 0.5; done
  for set in code chat agentic; do
    for conc in $CONCURRENCY; do
      count=$((conc == 1 ? 12 : conc * 2 > 50 ? 50 : conc * 2))
      "$PYTHON" "$ROOT/train/spec_probe.py" --url "http://127.0.0.1:$port" --label "${method}_${set}_c$conc" \
        --set $set --concurrency $conc --count $count --out "$WORK/probe/${method}_${set}_c$conc.json" ||
        echo "probe ${method}_${set}_c$conc failed"
    done
  done
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
done

stamp "table"
"$PYTHON" - "$WORK/probe" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = {}
for f in sorted(os.listdir(d)):
    b = json.load(open(os.path.join(d, f)))
    rows[(b["label"].rsplit("_", 2)[0], b["set"], b["concurrency"])] = b
print("%-8s %-8s %4s %9s %7s %8s %8s" % ("method", "set", "conc", "tok/s", "speedup", "accept", "mean_AL"))
for (m, s, c), b in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
    base = rows.get(("none", s, c))
    sp = b["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
    print("%-8s %-8s %4d %9.1f %7.2fx %8s %8s" % (m, s, c, b["tokens_per_s"], sp, b["acceptance_rate"], b["mean_acceptance_length"]))
PY
