#!/usr/bin/env bash
# scripts/test.sh: install what is missing, build, and run the whole test suite (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --tests  # what only the tests use (setup.sh installs the rest)
K3_CUDA=on bash scripts/setup.sh  # CUDA code must compile even where no GPU runs it
cmake --build --preset default -j"$(nproc)"  # everything else: the tests and benchmarks
bash scripts/fetch_test_data.sh
ctest --preset default -j"$(nproc)" --timeout 600
