#!/usr/bin/env bash
# train/run_python.sh SCRIPT ARGS...: runs a train/ script under the first python3 that has
# PyTorch (the PATH's python3, then Debian's /usr/bin/python3, which scripts/install_deps.sh
# --tests gives python3-torch). Without one it says so and exits 77, which ctest reports as a
# skip.
set -uo pipefail
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c "import torch" >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
done
echo "SKIP: no python3 with PyTorch (apt-get install python3-torch, or bash scripts/install_deps.sh --tests)"
exit 77
