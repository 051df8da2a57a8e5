#!/usr/bin/env bash
# scripts/setup.sh: install what is missing, build the server (preset "default": CPU, plus CUDA
# where nvcc is found; only the k3serve target, not the tests and benchmarks: scripts/test.sh
# builds those), and write the bundled default model models/k3-tiny (make-checkpoint, seed 0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target k3serve
if [ ! -f models/k3-tiny/config.json ] || [ ! -f models/k3-tiny/tiktoken.model ]; then
  build/default/k3serve make-checkpoint --config k3-tiny --seed 0 --out models/k3-tiny
fi
