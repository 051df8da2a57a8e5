#!/usr/bin/env bash
# scripts/make_golden.sh: rewrites tests/golden/ from `make-checkpoint --config k3-tiny --seed 0`.
# Run only when the model contract or the checkpoint init changes on purpose; say why in the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${K3SERVE:-build/default/k3serve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" make-checkpoint --config k3-tiny --seed 0 --out "$tmp/k3-tiny"
tokens=$(cat tests/golden/k3-tiny-seed0.tokens)
for p in fp32 bf16; do
  "$bin" logits --model "$tmp/k3-tiny" --precision "$p" --token-ids "$tokens" \
    --out "tests/golden/k3-tiny-seed0-$p.safetensors"
done
