#!/usr/bin/env bash
# scripts/test.sh: install what is missing, build, and run the whole test suite (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --tests  # what only the tests use (setup.sh installs the rest)
bash scripts/setup.sh
cmake --build --preset default -j"$(nproc)"  # everything else: the tests and benchmarks
bash scripts/fetch_test_data.sh
ctest --preset default -j"$(nproc)" --timeout 600
