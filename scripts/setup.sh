#!/usr/bin/env bash
# scripts/setup.sh: install what is missing, build the server (preset "default": only the k3serve
# target, not the tests and benchmarks: scripts/test.sh builds those), and write models/k3-tiny
# (make-checkpoint, seed 0: random weights, the smallest model, which the README's agent and
# benchmark examples use). The bundled default model, models/k3-code-15m (trained by train/), is
# in the repository and needs no step here.
#
# The CUDA backend is built where it can run: on a machine whose nvidia-smi lists a GPU, or with
# K3_CUDA=on (scripts/test.sh sets it, so CI compiles every CUDA source without a GPU). Elsewhere the
# server is built for the CPU alone (serve's default --device cpu), which saves most of the compile
# time: the CUDA kernels are about two thirds of it. K3_CUDA=off builds for the CPU on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
case "${K3_CUDA:-auto}" in
  on) cuda=ON ;;
  off) cuda=OFF ;;
  auto)
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda=ON; else
      cuda=OFF
      echo "setup.sh: no NVIDIA GPU found: building the CPU server only (K3_CUDA=on builds the CUDA backend too)"
    fi ;;
  *) echo "scripts/setup.sh: K3_CUDA must be on, off or auto, got '$K3_CUDA'" >&2; exit 2 ;;
esac
cmake --preset default -DK3_ENABLE_CUDA=$cuda >/dev/null
cmake --build --preset default -j"$(nproc)" --target k3serve
if [ ! -f models/k3-tiny/config.json ] || [ ! -f models/k3-tiny/tiktoken.model ]; then
  build/default/k3serve make-checkpoint --config k3-tiny --seed 0 --out models/k3-tiny
fi
