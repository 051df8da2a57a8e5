#!/usr/bin/env bash
# tests/clients/run_client_tests.sh: ctest "client_tests". Launches the real `k3serve serve` on a
# free port with a fresh k3-tiny checkpoint served under two names (--served-model-name k3-tiny
# k3-tiny-fast) and a context long enough for agent prompts, waits for /health, and runs against
# it: curl_test.sh; openai_sdk_test.mjs and openai_responses_test.mjs (the official OpenAI Node
# SDK: chat/completions, then the Responses API); anthropic_sdk_test.mjs (the official Anthropic
# SDK: the Messages API), once more with the second name; structured_outputs_test.mjs (constrained
# outputs through both SDKs, each validated with ajv); agent_cli_test.sh (the real Claude Code
# and Codex CLIs). Then it sends SIGTERM while a long stream is in flight and checks the drain:
# /health turns 503, the stream ends with a finish or an error event and "data: [DONE]", and the
# server exits with code 0. Last, a second short launch with --api-key checks with curl that
# every API answers 401 in its own error shape without the key or with a wrong one, 200 with it
# (Authorization: Bearer or x-api-key), and that /health and /metrics stay open.
#
#   bash tests/clients/run_client_tests.sh PATH/TO/k3serve SOURCE_DIR
#
# Exits 77 (ctest SKIP_RETURN_CODE) when node or curl is missing, or when a client package is
# missing from SOURCE_DIR/.testdata (scripts/fetch_test_data.sh installs them: openai-node,
# anthropic-sdk, agent-clis; what is there still runs first, and a failure still fails). Every
# wait has a time limit, and the servers are killed on every way out, so the test cannot hang
# or leave a server behind.
set -uo pipefail
bin=${1:?usage: run_client_tests.sh K3SERVE SOURCE_DIR}
src=${2:?usage: run_client_tests.sh K3SERVE SOURCE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
sdk_dir=${K3_OPENAI_SDK_DIR:-$src/.testdata/openai-node}
anthropic_dir=${K3_ANTHROPIC_SDK_DIR:-$src/.testdata/anthropic-sdk}
cli_dir=${K3_AGENT_CLI_DIR:-$src/.testdata/agent-clis}
ajv_dir=${K3_AJV_DIR:-$src/.testdata/ajv}
skip_code=77

say() { echo "client_tests: $*"; }
skip() {
  say "SKIP: $*"
  exit $skip_code
}
die() {
  say "FAIL: $*"
  local l
  for l in "${log:-}" "${auth_log:-}"; do
    if [ -n "$l" ] && [ -f "$l" ]; then
      say "server log $l (last 40 lines):"
      tail -n 40 "$l" | sed 's/^/  | /'
    fi
  done
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

command -v node >/dev/null 2>&1 || skip "node is not installed (scripts/install_deps.sh installs nodejs and npm)"
command -v curl >/dev/null 2>&1 || skip "curl is not installed"
[ -x "$bin" ] || die "no k3serve binary at $bin"
# What is missing (each part that needs it is skipped with a message, and the test ends in 77).
missing=()
have_sdk=1
[ -f "$sdk_dir/node_modules/openai/index.mjs" ] || { have_sdk=0; missing+=("the openai SDK ($sdk_dir)"); }
have_anthropic=1
[ -f "$anthropic_dir/node_modules/@anthropic-ai/sdk/index.mjs" ] || { have_anthropic=0; missing+=("the Anthropic SDK ($anthropic_dir)"); }
have_ajv=1
[ -f "$ajv_dir/node_modules/ajv/dist/2020.js" ] && [ -f "$ajv_dir/node_modules/ajv-formats/package.json" ] ||
  { have_ajv=0; missing+=("ajv ($ajv_dir)"); }
have_clis=1
for b in node_modules/@anthropic-ai/claude-code-linux-x64/claude node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex; do
  [ -x "$cli_dir/$b" ] || have_clis=0
done
[ "$have_clis" = 1 ] || missing+=("the agent CLIs ($cli_dir; Linux x86-64 only)")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/k3_client_tests.XXXXXX")
log=$tmp/server.log
server_pid=""
auth_pid=""
stream_pid=""
# stop_server PID: TERM, then the process group (timeout's own, see start_server) killed outright
# if it is still there after 5 s.
stop_server() {
  local pid=$1
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
  fi
}
started_pid=""
cleanup() {
  # The servers run under timeout(1), which forwards TERM to them (started_pid: one that died
  # in start_server before it was serving).
  stop_server "$server_pid"
  stop_server "$auth_pid"
  stop_server "$started_pid"
  [ -n "$stream_pid" ] && kill -KILL "$stream_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# --- the model: a fresh k3-tiny (seed 0) with its tokenizer ---
t0=$(now)
model_dir=$tmp/k3-tiny  # the folder name is the served model name
timeout 60 "$bin" make-checkpoint --config k3-tiny --seed 0 --out "$model_dir" >"$tmp/make_checkpoint.log" 2>&1 ||
  { cat "$tmp/make_checkpoint.log"; die "make-checkpoint failed"; }
[ -f "$model_dir/tiktoken.model" ] || die "make-checkpoint wrote no tokenizer into $model_dir"
say "wrote $model_dir in $(since "$t0")"

# start_server LIFE_S LOG ARGS...: starts `k3serve serve` on a free port (--port 0: it binds one
# and prints it) with ARGS, waits for its port and for GET /health (no key needed) to answer 200;
# sets started_pid and started_base. timeout(1) bounds the server's life (LIFE_S) even if this
# script is killed without running its trap. timeout arms its KILL when it forwards our TERM too,
# so --kill-after is longer than the drain plus an exit on a loaded CI machine (5 s once killed a
# server that had logged "stopped"); the drain check below waits 40 s and the log times each
# shutdown phase.
start_server() {
  local life=$1 slog=$2
  shift 2
  timeout --kill-after=30 "$life" "$bin" serve --model "$model_dir" --host 127.0.0.1 --port 0 "$@" >"$slog" 2>&1 &
  started_pid=$!
  local port=""
  for _ in $(seq 600); do  # 60 s
    port=$(sed -n 's|^.* info *serving model .* on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$slog" | head -1)
    [ -n "$port" ] && break
    kill -0 "$started_pid" 2>/dev/null || die "the server exited before it was serving"
    sleep 0.1
  done
  [ -n "$port" ] || die "the server did not print its port within 60 s"
  started_base=http://127.0.0.1:$port
  local healthy=0
  for _ in $(seq 300); do  # 30 s
    if [ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$started_base/health")" = 200 ]; then healthy=1; break; fi
    sleep 0.1
  done
  [ "$healthy" = 1 ] || die "GET /health did not answer 200 within 30 s"
}

# --- the server: two names, a context that holds an agent's prompt ---
t0=$(now)
start_server 1200 "$log" --served-model-name k3-tiny k3-tiny-fast --max-model-len 65536 \
  --max-body-bytes 1048576 --drain-seconds 2 --http-threads 64
server_pid=$started_pid
base=$started_base
say "server pid $server_pid serving on $base after $(since "$t0")"
# The load progress line (checkpoint::LoadProgressLog) is in the log.
grep -Eq " info +loaded $model_dir: [0-9]+\.[0-9] MB in [0-9.]+ s \(([0-9.]+ [MG]B/s|- MB/s)\)$" "$log" ||
  die "no 'loaded $model_dir: ... MB in ... s (... MB/s)' line in the server log"

# --- the clients ---
failures=0
t0=$(now)
if timeout 120 bash "$here/curl_test.sh" "$base" k3-tiny; then
  say "curl checks passed in $(since "$t0")"
else
  say "curl checks FAILED (rc $?)"
  failures=$((failures + 1))
fi
# run_part NAME LIMIT_S CMD...: one client part, counted in failures when it fails.
run_part() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(now)
  timeout --kill-after=5 "$limit" "$@"
  rc=$?
  if [ "$rc" = 0 ]; then
    say "$name passed in $(since "$t0")"
  else
    say "$name FAILED (rc $rc after $(since "$t0"))"
    failures=$((failures + 1))
  fi
}
if [ "$have_sdk" = 1 ]; then
  run_part "openai SDK checks" 180 node "$here/openai_sdk_test.mjs" --base-url "$base/v1" --model k3-tiny --sdk-dir "$sdk_dir"
  run_part "openai SDK Responses API checks" 180 \
    node "$here/openai_responses_test.mjs" --base-url "$base/v1" --model k3-tiny --sdk-dir "$sdk_dir"
else
  say "skipping the openai SDK and Responses API checks: no openai SDK in $sdk_dir (scripts/fetch_test_data.sh installs it)"
fi
if [ "$have_anthropic" = 1 ]; then
  run_part "Anthropic SDK checks" 180 node "$here/anthropic_sdk_test.mjs" --base-url "$base" --model k3-tiny --sdk-dir "$anthropic_dir"
  run_part "Anthropic SDK check with the second served name" 60 node "$here/anthropic_sdk_test.mjs" --base-url "$base" \
    --model k3-tiny-fast --sdk-dir "$anthropic_dir" --only "messages.create basic"
else
  say "skipping the Anthropic SDK checks: no Anthropic SDK in $anthropic_dir (scripts/fetch_test_data.sh installs it)"
fi
if [ "$have_sdk" = 1 ] && [ "$have_anthropic" = 1 ] && [ "$have_ajv" = 1 ]; then
  run_part "structured output checks (both SDKs, every output validated by ajv)" 600 node "$here/structured_outputs_test.mjs" \
    --base-url "$base" --model k3-tiny --openai-dir "$sdk_dir" --anthropic-dir "$anthropic_dir" --ajv-dir "$ajv_dir" \
    --schemas "$src/src/structured/testdata/agent_tool_schemas.json"
else
  say "skipping the structured output checks: they need both SDKs and ajv (scripts/fetch_test_data.sh installs them)"
fi
if [ "$have_clis" = 1 ]; then
  run_part "agent CLI checks (claude -p, codex exec)" 540 bash "$here/agent_cli_test.sh" "$base" k3-tiny "$cli_dir"
else
  say "skipping the agent CLI checks: no claude / codex binaries in $cli_dir (scripts/fetch_test_data.sh installs them on Linux x86-64)"
fi
kill -0 "$server_pid" 2>/dev/null || die "the server died during the client checks"

# --- SIGTERM with a stream in flight: drain, then a clean exit ---
t0=$(now)
timeout 60 curl -sN --max-time 60 -H 'Content-Type: application/json' \
  -d '{"model": "k3-tiny", "prompt": "drain me", "max_tokens": 4000, "ignore_eos": true, "stream": true, "seed": 1}' \
  "$base/v1/completions" >"$tmp/drain.sse" 2>"$tmp/drain.err" &
stream_pid=$!
for _ in $(seq 200); do  # 20 s
  grep -q '^data: {' "$tmp/drain.sse" && break
  sleep 0.1
done
grep -q '^data: {' "$tmp/drain.sse" || die "the stream to drain sent no chunk within 20 s"
kill -TERM "$server_pid"
draining=0
for _ in $(seq 40); do  # 2 s: the drain grace (--drain-seconds 2) keeps the server up meanwhile
  if [ "$(curl -s --max-time 1 -o /dev/null -w '%{http_code}' "$base/health")" = 503 ]; then draining=1; break; fi
  sleep 0.05
done
for _ in $(seq 400); do  # 40 s
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server_pid" 2>/dev/null && die "the server did not exit within 40 s of SIGTERM"
wait "$server_pid"
server_rc=$?
server_pid=""
for _ in $(seq 100); do  # 10 s
  kill -0 "$stream_pid" 2>/dev/null || break
  sleep 0.1
done
wait "$stream_pid" 2>/dev/null
stream_pid=""
drain_problems=()
[ "$server_rc" = 0 ] || drain_problems+=("the server exited with code $server_rc, expected 0")
[ "$draining" = 1 ] || drain_problems+=("GET /health never answered 503 while draining")
grep -q ' info *SIGTERM, draining 1 request(s)' "$log" || drain_problems+=("no 'SIGTERM, draining 1 request(s)' in the log")
grep -q ' info *stopped$' "$log" || drain_problems+=("no 'stopped' line in the log")
[ "$(grep -v '^$' "$tmp/drain.sse" | tail -1)" = "data: [DONE]" ] || drain_problems+=("the drained stream does not end with data: [DONE]")
ending=$(grep '^data: {' "$tmp/drain.sse" | tail -1)
if [[ "$ending" == *'"error":'* ]]; then
  drain_end="an error event: ${ending:0:160}"
elif [[ "$ending" == *'"finish_reason":"length"'* ]]; then
  drain_end="its finish (length)"
else
  drain_problems+=("the drained stream ends with neither a finish nor an error event: ${ending:0:200}")
fi
if ((${#drain_problems[@]})); then
  for p in "${drain_problems[@]}"; do say "FAIL drain: $p"; done
  failures=$((failures + 1))
else
  say "SIGTERM drain: the in-flight stream ended with ${drain_end:-?}; exit code 0 after $(since "$t0")"
fi

# --- --api-key: every API wants the key, in its own error shape; /health and /metrics do not ---
t0=$(now)
auth_log=$tmp/server_auth.log
start_server 600 "$auth_log" --api-key sekrit --max-model-len 65536 --drain-seconds 1 --http-threads 16
auth_pid=$started_pid
auth_base=$started_base
say "server with --api-key: pid $auth_pid on $auth_base after $(since "$t0")"
# auth_call NAME METHOD PATH BODY HEADER...: the status code; the body in $tmp/auth_NAME.body.
auth_call() {
  local name=$1 method=$2 path=$3 body=$4
  shift 4
  local args=(-s --max-time 60 -o "$tmp/auth_$name.body" -w '%{http_code}' -X "$method")
  local h
  for h in "$@"; do args+=(-H "$h"); done
  [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
  curl "${args[@]}" "$auth_base$path" || echo "curl-failed"
}
# body_is FILE JS_EXPR: JS_EXPR holds for j, the JSON in FILE.
body_is() {
  node -e 'const fs = require("fs"); const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
           if (!(0, eval)("(j) => (" + process.argv[2] + ")")(j)) process.exit(1);' "$1" "$2" 2>/dev/null
}
openai_shape="typeof j.error === 'object' && typeof j.error.message === 'string' && j.error.message.length > 0"
anthropic_shape="j.type === 'error' && j.error.type === 'authentication_error' && typeof j.error.message === 'string'"
auth_problems=()
auth_checks=0
# route NAME METHOD PATH BODY SHAPE: no key / wrong keys -> 401 in SHAPE; the key -> 200.
route() {
  local name=$1 method=$2 path=$3 body=$4 shape=$5 code how
  for how in none "Authorization: Bearer wrong" "x-api-key: wrong"; do
    auth_checks=$((auth_checks + 1))
    if [ "$how" = none ]; then code=$(auth_call "$name" "$method" "$path" "$body"); else code=$(auth_call "$name" "$method" "$path" "$body" "$how"); fi
    if [ "$code" != 401 ]; then
      auth_problems+=("$method $path with ${how/none/no key}: status $code, expected 401")
    elif [ -n "$shape" ] && ! body_is "$tmp/auth_$name.body" "$shape"; then
      auth_problems+=("$method $path with ${how/none/no key}: 401 body not in the API's shape: $(head -c 200 "$tmp/auth_$name.body")")
    fi
  done
  for how in "Authorization: Bearer sekrit" "x-api-key: sekrit"; do
    auth_checks=$((auth_checks + 1))
    code=$(auth_call "$name" "$method" "$path" "$body" "$how")
    [ "$code" = 200 ] || auth_problems+=("$method $path with $how: status $code, expected 200: $(head -c 200 "$tmp/auth_$name.body")")
  done
}
route chat POST /v1/chat/completions '{"model": "k3-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' "$openai_shape"
route completions POST /v1/completions '{"model": "k3-tiny", "prompt": "hi", "max_tokens": 2}' "$openai_shape"
route responses POST /v1/responses '{"model": "k3-tiny", "input": "hi", "max_output_tokens": 2, "store": false}' "$openai_shape"
route messages POST /v1/messages '{"model": "k3-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}' "$anthropic_shape"
route messages_beta POST '/v1/messages?beta=true' '{"model": "k3-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}' "$anthropic_shape"
route count_tokens POST /v1/messages/count_tokens '{"model": "k3-tiny", "messages": [{"role": "user", "content": "hi"}]}' "$anthropic_shape"
route models GET /v1/models "" "$openai_shape"
for open_path in /health /metrics; do
  auth_checks=$((auth_checks + 1))
  code=$(auth_call open GET "$open_path" "")
  [ "$code" = 200 ] || auth_problems+=("GET $open_path without a key: status $code, expected 200")
done
if ((${#auth_problems[@]})); then
  for p in "${auth_problems[@]}"; do say "FAIL --api-key: $p"; done
  failures=$((failures + 1))
else
  say "--api-key: $auth_checks checks passed in $(since "$t0")"
fi
if [ "$have_clis" = 1 ]; then
  # The CLIs' own headers: claude sends x-api-key, codex Authorization: Bearer.
  run_part "agent CLI checks with --api-key" 540 bash "$here/agent_cli_test.sh" "$auth_base" k3-tiny "$cli_dir" sekrit
fi
stop_server "$auth_pid"
auth_pid=""

if [ "$failures" -gt 0 ]; then
  die "$failures part(s) failed"
fi
if ((${#missing[@]})); then
  list=$(printf '%s; ' "${missing[@]}")
  skip "missing ${list%; } (scripts/fetch_test_data.sh installs them): the other checks ran and passed"
fi
say "all passed"
