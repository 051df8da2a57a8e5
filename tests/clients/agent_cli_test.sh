#!/usr/bin/env bash
# tests/clients/agent_cli_test.sh: the real agent CLIs against a running `k3serve serve`: Claude
# Code (`claude -p`, the Anthropic Messages API through POST /v1/messages?beta=true, streamed) and
# Codex (`codex exec`, the OpenAI Responses API through POST /v1/responses, streamed). Each runs
# with an isolated HOME in a temp dir, an environment of only what it needs (env -i), nothing
# but loopback to reach, stdin from /dev/null, under timeout(1). Each must exit 0 and print
# non-empty text (the model's: random words from a random-weights model).
#
#   bash tests/clients/agent_cli_test.sh SERVER_BASE MODEL CLI_DIR [API_KEY]
#
# SERVER_BASE is the server root (http://127.0.0.1:PORT); CLI_DIR the folder
# scripts/fetch_test_data.sh installs them into (.testdata/agent-clis); API_KEY the key both
# clients send (claude as x-api-key, codex as Authorization: Bearer; default "dummy").
#
# The options keep the prompt short for a CPU prefill (bench/agent_clients.sh runs the defaults):
#   claude: --bare --system-prompt --tools "" --max-turns 1, thinking off, no retries (env): about
#           0.8 KB of request instead of about 49 KB. Claude Code reports a reply that stops at
#           max_tokens as an error, so the cap (16384) stays far above what the random model
#           writes before its end of message (about 1300 tokens on average); the server's
#           --max-model-len must leave room for it.
#   codex:  a one-line model_instructions_file, no environment / permissions / skills blocks, no
#           shell, image, goal, agent or web_search tools, reasoning effort "none", no retries:
#           about 3 KB instead of about 41 KB (one function tool, request_user_input, remains;
#           codex sends no max_output_tokens, so its answer runs to the model's end of message).
#
# One line per client; exits 1 when either fails, 77 (ctest's skip code) when the binaries are
# missing.
set -uo pipefail
base=${1:?usage: agent_cli_test.sh SERVER_BASE MODEL CLI_DIR [API_KEY]}
base=${base%/}
base=${base%/v1}
model=${2:?usage: agent_cli_test.sh SERVER_BASE MODEL CLI_DIR [API_KEY]}
cli_dir=${3:?usage: agent_cli_test.sh SERVER_BASE MODEL CLI_DIR [API_KEY]}
key=${4:-dummy}
[ -d "$cli_dir" ] && cli_dir=$(cd "$cli_dir" && pwd)  # the clients run in their own work dirs
claude=$cli_dir/node_modules/@anthropic-ai/claude-code-linux-x64/claude
codex=$cli_dir/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
limit=${K3_AGENT_CLI_TIMEOUT:-240}  # seconds per client run

missing=()
[ -x "$claude" ] || missing+=("$claude")
[ -x "$codex" ] || missing+=("$codex")
if ((${#missing[@]})); then
  echo "agent_cli_test: SKIP: no agent CLI binaries (${missing[*]}); scripts/fetch_test_data.sh installs them on Linux x86-64"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/k3_agent_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failed=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# run_client NAME CMD...: runs CMD in $tmp/NAME/work (HOME $tmp/NAME/home), stdout and stderr to
# $tmp/NAME/{out,err}; passes when it exits 0 with non-empty stdout. A random model may end its
# answer at once, so an empty answer gets one more try.
run_client() {
  local name=$1
  shift
  local dir=$tmp/$name attempt rc t0 text
  for attempt in 1 2; do
    t0=$(now)
    (cd "$dir/work" && timeout --kill-after=5 "$limit" "$@" </dev/null >"$dir/out" 2>"$dir/err")
    rc=$?
    # Random text: control characters (NUL included) dropped, whitespace runs folded, for one log line.
    text=$(tr -d '\000-\010\016-\037' <"$dir/out" | tr -s '[:space:]' ' ' | sed 's/^ //; s/ $//')
    if [ "$rc" = 0 ] && [ -n "$text" ]; then
      echo "ok   $name: exit 0 in $(since "$t0"), printed: ${text:0:120}"
      return 0
    fi
    [ "$rc" = 0 ] && [ "$attempt" = 1 ] && { echo "     $name: exit 0 but printed nothing; once more"; continue; }
    break
  done
  failed=$((failed + 1))
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "FAIL $name: no exit within $limit s"
  else
    echo "FAIL $name: exit code $rc, stdout ${#text} characters"
  fi
  echo "     stdout (last 10 lines):"
  tail -n 10 "$dir/out" | sed 's/^/     | /'
  echo "     stderr (last 30 lines):"
  tail -n 30 "$dir/err" | sed 's/^/     | /'
}

# --- Claude Code ---
mkdir -p "$tmp/claude/home" "$tmp/claude/work"
run_client claude env -i PATH=/usr/bin:/bin HOME="$tmp/claude/home" TMPDIR="$tmp/claude" LANG=C.UTF-8 \
  ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY="$key" \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_THINKING=1 CLAUDE_CODE_MAX_OUTPUT_TOKENS=16384 CLAUDE_CODE_MAX_RETRIES=0 \
  "$claude" -p "Reply with one word." --model "$model" \
  --bare --system-prompt "You are terse." --tools "" --max-turns 1 \
  --no-session-persistence --strict-mcp-config --setting-sources ""

# --- Codex ---
mkdir -p "$tmp/codex/home/.codex" "$tmp/codex/work"
printf 'You are terse.\n' >"$tmp/codex/instructions.md"
cat >"$tmp/codex/home/.codex/config.toml" <<EOF
model = "$model"
model_provider = "k3"
model_instructions_file = "$tmp/codex/instructions.md"
model_reasoning_effort = "none"
model_reasoning_summary = "none"
include_permissions_instructions = false
include_environment_context = false
web_search = "disabled"
project_doc_max_bytes = 0

[features]
shell_tool = false
unified_exec = false
view_image = false
goals = false

[agents]
enabled = false

[skills]
include_instructions = false

[skills.bundled]
enabled = false

[model_providers.k3]
name = "k3serve"
base_url = "$base/v1"
wire_api = "responses"
env_key = "K3_KEY"
request_max_retries = 0
stream_max_retries = 0
EOF
run_client codex env -i PATH=/usr/bin:/bin HOME="$tmp/codex/home" CODEX_HOME="$tmp/codex/home/.codex" TMPDIR="$tmp/codex" LANG=C.UTF-8 \
  K3_KEY="$key" \
  "$codex" exec --skip-git-repo-check --ephemeral --strict-config --color never "Reply with one word."

[ "$failed" = 0 ] || exit 1
exit 0
