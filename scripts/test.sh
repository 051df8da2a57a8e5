#!/usr/bin/env bash
# scripts/test.sh: install what is missing, build, and run the whole test suite (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_test_data.sh
ctest --preset default -j"$(nproc)" --timeout 600
