#!/usr/bin/env bash
# scripts/check_layers.sh: the engine's headers reach no kernel and no model layer. Each engine
# header is preprocessed alone (g++ -MM, the include tree without system headers) and every header
# it pulls in from src/kernels/ or src/model/layers/ is listed; any is a failure. The engine talks to
# the model through engine/executor.h; what a kernel or a layer is stays behind ModelExecutor's .cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for h in src/engine/*.h; do
  [[ $h == *_test* || $h == *fake_* ]] && continue
  deps=$(echo "#include \"${h#src/}\"" | g++ -std=c++20 -MM -x c++ -I src -isystem /usr/local/cuda/include - 2>&1) || {
    echo "$h: does not preprocess alone:"; echo "$deps"; status=1; continue; }
  bad=$(tr ' \\' '\n\n' <<<"$deps" | grep -E '^src/(kernels|model/layers)/' | sort -u || true)
  if [[ -n $bad ]]; then
    echo "$h reaches kernel or layer headers:"; sed 's/^/  /' <<<"$bad"; status=1
  fi
done
[[ $status == 0 ]] && echo "scripts/check_layers.sh: no engine header reaches src/kernels or src/model/layers"
exit $status
