#!/usr/bin/env bash
# train/run_pipeline.sh WORK [TRAIN_SECONDS]: the whole training run of train/README.md, on a
# machine with PyTorch and a CUDA GPU (the H200 of the device tool; it fits one 10-minute call):
#   1. k3serve for the CPU (train-tokenizer, encode-corpus, the oracle server), built while
#      train/corpus.py collects the corpus from the machine's installed Python packages;
#   2. the tokenizer (8192 ids: 7936 BPE ranks + K3's 256 special slots) and the token streams;
#   3. train/train_k3.py for TRAIN_SECONDS (default 330) -> WORK/model (HF layout, MXFP4 experts);
#   4. with K3_DRAFT_SECONDS=S: an EAGLE-3 and a DSpark draft for it (train/eagle3_torch.py,
#      train/dspark_torch.py, S seconds each) -> WORK/eagle3, WORK/dspark;
#   5. the trained model served by that k3serve on the CPU, train/evaluate.py against it ->
#      WORK/model/eval_cpu.json (task accuracy up to 4K-token contexts, sample answers), and with a
#      draft, its real acceptance (train/spec_probe.py) -> WORK/{eagle3,dspark}/spec_probe_cpu.json.
# Headers the machine lacks (cpp-httplib, PCRE2, xxhash) come from .carry (scripts/carry_headers.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:?usage: train/run_pipeline.sh WORK [TRAIN_SECONDS]}
TRAIN_SECONDS=${2:-330}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%T)] $*"; }

# Each step is skipped when its output is there, so a second call on the same (warm) machine
# goes on where the first stopped: with K3_SESSION_SECONDS=S training stops after S seconds of this
# call, keeping WORK/train_state.pt, and the next call resumes the same TRAIN_SECONDS schedule.
stamp "build k3serve (CPU) and collect the corpus"
K3=$WORK/build/k3serve
if [[ ! -x $K3 ]]; then
  (PKG_CONFIG_PATH=$ROOT/.carry/lib/pkgconfig cmake -S "$ROOT" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DK3_ENABLE_CUDA=OFF -DK3_BUILD_TESTS=OFF "-DCMAKE_CXX_FLAGS=-I$ROOT/.carry/include" &&
   cmake --build "$WORK/build" --target k3serve -j"$(nproc)") > "$WORK/build.log" 2>&1 &
  build=$!
fi
[[ -f $WORK/corpus/eval.json ]] || python3 "$ROOT/train/corpus.py" --out "$WORK/corpus" --retrieval-chats 10000
if [[ -n ${build:-} ]] && ! wait "$build"; then tail -30 "$WORK/build.log"; exit 1; fi

stamp "tokenizer and token streams"
[[ -f $WORK/tokenizer/tiktoken.model ]] ||
  "$K3" train-tokenizer --corpus "$WORK/corpus/train.jsonl" --vocab-size 8192 --out "$WORK/tokenizer"
for split in train heldout; do
  [[ -f $WORK/$split.bin ]] ||
    "$K3" encode-corpus --tokenizer "$WORK/tokenizer" --corpus "$WORK/corpus/$split.jsonl" --out "$WORK/$split.bin"
done

stamp "train"
python3 "$ROOT/train/train_k3.py" --tokens "$WORK/train.bin" --heldout "$WORK/heldout.bin" \
  --tokenizer "$WORK/tokenizer" --out "$WORK/model" --seconds "$TRAIN_SECONDS" --state "$WORK/train_state.pt" \
  --session-seconds "${K3_SESSION_SECONDS:-0}" | tee -a "$WORK/train.log"

if [[ ${K3_DRAFT_SECONDS:-0} != 0 && ! -f $WORK/eagle3/model.safetensors ]]; then
  stamp "train the EAGLE-3 draft"
  python3 "$ROOT/train/eagle3_torch.py" --target "$WORK/model" --tokens "$WORK/train.bin" --out "$WORK/eagle3" \
    --seconds "$K3_DRAFT_SECONDS" | tee -a "$WORK/train_eagle3.log"
fi
if [[ ${K3_DRAFT_SECONDS:-0} != 0 && ! -f $WORK/dspark/model.safetensors ]]; then
  stamp "train the DSpark draft"
  python3 "$ROOT/train/dspark_torch.py" --target "$WORK/model" --tokens "$WORK/train.bin" --out "$WORK/dspark" \
    --seconds "$K3_DRAFT_SECONDS" | tee -a "$WORK/train_dspark.log"
fi
[[ ${K3_TRAIN_ONLY:-0} == 1 ]] && { stamp "done (K3_TRAIN_ONLY=1: no evaluation)"; exit 0; }
stamp "evaluate on the CPU oracle"
"$K3" serve --model "$WORK/model" --port 8123 > "$WORK/serve_cpu.log" 2>&1 &
server=$!
python3 "$ROOT/train/evaluate.py" --url http://127.0.0.1:8123 --tasks "$WORK/corpus/eval.json" \
  --max-context 4000 --per-group 10 --out "$WORK/model/eval_cpu.json" | tee "$WORK/eval_cpu.log" || true
kill $server 2>/dev/null || true
for kind in eagle3 dspark; do
  [[ -f $WORK/$kind/model.safetensors ]] || continue
  stamp "$kind acceptance on the CPU oracle"
  "$K3" serve --model "$WORK/model" --port 8124 --speculative-method $kind --speculative-model "$WORK/$kind" \
    --num-speculative-tokens $([[ $kind == dspark ]] && echo 7 || echo 4) > "$WORK/serve_$kind.log" 2>&1 &
  server=$!
  sleep 3
  python3 "$ROOT/train/spec_probe.py" --url http://127.0.0.1:8124 --label ${kind}_cpu \
    --out "$WORK/$kind/spec_probe_cpu.json" || true
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
done
stamp "done"
