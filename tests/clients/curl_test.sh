#!/usr/bin/env bash
# tests/clients/curl_test.sh: the wire basics of a running `k3serve serve`, checked with curl:
# /health, /v1/models, completions and chat (plain, and streamed as SSE "data:" lines ending in
# "data: [DONE]"), /metrics with vLLM's metric names and counters that move, /tokenize and
# /detokenize round trips, and the error replies (400 malformed JSON, 404, 405, 413 body over
# --max-body-bytes) with OpenAI's error body. JSON is checked with node (no jq needed).
#
#   bash tests/clients/curl_test.sh http://127.0.0.1:8000 [MODEL_NAME]
#
# One line per check; exits 1 when any check fails.
set -uo pipefail
base=${1:?usage: curl_test.sh BASE_URL [MODEL_NAME]}
base=${base%/}
model=${2:-k3-tiny}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
passed=0

# curl_to NAME METHOD PATH [BODY_FILE]: response body to $tmp/NAME.body, headers to
# $tmp/NAME.headers, status code on stdout. Every call has a time limit.
curl_to() {
  local name=$1 method=$2 path=$3 body=${4:-}
  local args=(-sS --max-time 60 -o "$tmp/$name.body" -D "$tmp/$name.headers" -w '%{http_code}' -X "$method")
  if [ -n "$body" ]; then args+=(-H 'Content-Type: application/json' --data-binary "@$body"); fi
  curl "${args[@]}" "$base$path" 2>"$tmp/$name.curl_err" || echo "curl-failed"
}

# json_assert FILE JS_EXPR: evaluates JS_EXPR with `j` = the parsed JSON of FILE (or, when
# FILE is an SSE body, `events` = the data payloads, `j` unset); fails with the expression.
json_assert() {
  node -e '
    const fs = require("fs");
    const [file, expr] = process.argv.slice(1);
    const text = fs.readFileSync(file, "utf8");
    let j, events;
    if (text.startsWith("data: ")) {
      events = text.split("\n\n").filter((b) => b.length).map((b) => {
        if (!b.startsWith("data: ")) throw new Error("SSE block without data: prefix: " + JSON.stringify(b));
        return b.slice(6);
      });
    } else {
      j = JSON.parse(text);
    }
    const ok = (0, eval)("(j, events) => (" + expr + ")")(j, events);
    if (!ok) { console.error("assertion failed: " + expr + "\n  on: " + text.slice(0, 600)); process.exit(1); }
  ' "$1" "$2"
}

check() {
  local name=$1
  shift
  local out
  if out=$("$@" 2>&1); then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    printf '%s\n' "$out" | sed 's/^/     /'
  fi
}

expect_status() {  # expect_status WANT GOT
  [ "$1" = "$2" ] || { echo "status $2, expected $1"; return 1; }
}

header() {  # header NAME FILE: the value of a response header (case-insensitive), CR stripped
  grep -i "^$1:" "$2" | head -1 | cut -d: -f2- | sed 's/^ *//; s/\r$//'
}

body() {  # body NAME JSON: writes a request body file, prints its path
  printf '%s' "$2" >"$tmp/$1.json"
  echo "$tmp/$1.json"
}

t_health() {
  expect_status 200 "$(curl_to health GET /health)"
}

t_models() {
  expect_status 200 "$(curl_to models GET /v1/models)" &&
    [[ "$(header content-type "$tmp/models.headers")" == application/json* ]] &&
    json_assert "$tmp/models.body" "j.object === 'list' && j.data.length >= 1 && j.data[0].id === '$model' &&
      j.data[0].object === 'model' && j.data[0].max_model_len > 0"
}

t_completion() {
  local b
  b=$(body completion '{"model": "'"$model"'", "prompt": "Hello, curl", "max_tokens": 5, "temperature": 0}')
  expect_status 200 "$(curl_to completion POST /v1/completions "$b")" &&
    json_assert "$tmp/completion.body" "j.object === 'text_completion' && j.id.startsWith('cmpl-') &&
      j.choices.length === 1 && typeof j.choices[0].text === 'string' &&
      ['length', 'stop'].includes(j.choices[0].finish_reason) &&
      j.usage.prompt_tokens > 0 && j.usage.completion_tokens <= 5 &&
      j.usage.total_tokens === j.usage.prompt_tokens + j.usage.completion_tokens &&
      j.usage.prompt_tokens_details.cached_tokens === 0"
}

t_completion_stream() {
  local b
  b=$(body completion_stream '{"model": "'"$model"'", "prompt": "Hello, curl", "max_tokens": 5, "temperature": 0, "stream": true}')
  expect_status 200 "$(curl_to completion_stream POST /v1/completions "$b")" &&
    [[ "$(header content-type "$tmp/completion_stream.headers")" == text/event-stream* ]] &&
    # Every event is "data: <payload>\n\n"; the last is [DONE]; the texts add up to the
    # non-streamed greedy text of t_completion.
    json_assert "$tmp/completion_stream.body" "events.at(-1) === '[DONE]' && events.length >= 3 &&
      events.slice(0, -1).map(JSON.parse).every((c) => c.object === 'text_completion' && c.choices.length === 1) &&
      events.slice(0, -1).map(JSON.parse).map((c) => c.choices[0].text).join('') ===
        JSON.parse(require('fs').readFileSync('$tmp/completion.body', 'utf8')).choices[0].text &&
      JSON.parse(events.at(-2)).choices[0].finish_reason !== null"
}

t_chat() {
  local b
  b=$(body chat '{"model": "'"$model"'", "messages": [{"role": "user", "content": "Hi from curl"}], "max_tokens": 6, "seed": 3, "temperature": 1}')
  expect_status 200 "$(curl_to chat POST /v1/chat/completions "$b")" &&
    json_assert "$tmp/chat.body" "j.object === 'chat.completion' && j.id.startsWith('chatcmpl-') &&
      j.choices[0].message.role === 'assistant' && ['length', 'stop'].includes(j.choices[0].finish_reason) &&
      j.usage.completion_tokens <= 6"
}

t_chat_stream() {
  local b
  b=$(body chat_stream '{"model": "'"$model"'", "messages": [{"role": "user", "content": "Hi from curl"}], "max_tokens": 6,
       "seed": 3, "temperature": 1, "stream": true, "stream_options": {"include_usage": true}}')
  expect_status 200 "$(curl_to chat_stream POST /v1/chat/completions "$b")" &&
    [[ "$(header content-type "$tmp/chat_stream.headers")" == text/event-stream* ]] &&
    grep -q $'^data: \\[DONE\\]$' "$tmp/chat_stream.body" &&
    # Role first, the usage chunk (no choices) just before [DONE], and the same seeded answer
    # as the non-streamed t_chat.
    json_assert "$tmp/chat_stream.body" "(() => {
      const plain = JSON.parse(require('fs').readFileSync('$tmp/chat.body', 'utf8'));
      const chunks = events.slice(0, -1).map(JSON.parse);
      const usage = chunks.at(-1);
      const deltas = chunks.slice(0, -1);
      const text = (k) => deltas.map((c) => c.choices[0].delta[k] ?? '').join('');
      return events.at(-1) === '[DONE]' && chunks.every((c) => c.object === 'chat.completion.chunk') &&
        deltas[0].choices[0].delta.role === 'assistant' && usage.choices.length === 0 &&
        usage.usage.completion_tokens === plain.usage.completion_tokens &&
        text('content') === (plain.choices[0].message.content ?? '') &&
        text('reasoning_content') === (plain.choices[0].message.reasoning_content ?? '') &&
        deltas.at(-1).choices[0].finish_reason === plain.choices[0].finish_reason;
    })()"
}

t_metrics() {
  expect_status 200 "$(curl_to metrics GET /metrics)" || return 1
  [[ "$(header content-type "$tmp/metrics.headers")" == text/plain* ]] || { echo "content-type"; return 1; }
  local name
  for name in vllm:time_to_first_token_seconds_bucket vllm:inter_token_latency_seconds_bucket \
    vllm:e2e_request_latency_seconds_count vllm:prompt_tokens_total vllm:generation_tokens_total \
    vllm:prefix_cache_queries_total vllm:prefix_cache_hits_total vllm:num_requests_running \
    vllm:num_requests_waiting vllm:num_preemptions_total vllm:request_success_total; do
    grep -q "^$name{" "$tmp/metrics.body" || { echo "no $name in /metrics"; return 1; }
  done
  grep -q '^# TYPE vllm:time_to_first_token_seconds histogram$' "$tmp/metrics.body" || { echo "TYPE line"; return 1; }
  # The requests above moved the counters (4 generation requests, greedy ones included).
  local value
  value() { grep "^$1{" "$tmp/metrics.body" | head -1 | awk '{print $NF}'; }
  awk -v p="$(value vllm:prompt_tokens_total)" -v g="$(value vllm:generation_tokens_total)" \
    -v e="$(value vllm:e2e_request_latency_seconds_count)" 'BEGIN { exit !(p > 0 && g > 0 && e >= 4) }' ||
    { echo "counters did not move: prompt $(value vllm:prompt_tokens_total) generation $(value vllm:generation_tokens_total)"; return 1; }
}

t_tokenize_round_trip() {
  local text='Hello wörld 🙂, tokenize me: 12345!' b
  b=$(body tokenize '{"model": "'"$model"'", "prompt": "'"$text"'", "return_token_strs": true}')
  expect_status 200 "$(curl_to tokenize POST /tokenize "$b")" || return 1
  json_assert "$tmp/tokenize.body" "j.count === j.tokens.length && j.count > 3 && j.max_model_len > 0 &&
    j.token_strs.length === j.count && j.tokens.every(Number.isInteger)" || return 1
  node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); process.stdout.write(JSON.stringify({tokens: j.tokens}))' \
    "$tmp/tokenize.body" >"$tmp/detok.json"
  expect_status 200 "$(curl_to detokenize POST /detokenize "$tmp/detok.json")" &&
    json_assert "$tmp/detokenize.body" "j.prompt === '$text'"
}

t_tokenize_chat() {
  local b
  b=$(body tokenize_chat '{"model": "'"$model"'", "messages": [{"role": "user", "content": "Hi from curl"}]}')
  expect_status 200 "$(curl_to tokenize_chat POST /tokenize "$b")" &&
    # The chat prompt t_chat sent has exactly these tokens.
    json_assert "$tmp/tokenize_chat.body" "j.count === JSON.parse(require('fs').readFileSync('$tmp/chat.body', 'utf8')).usage.prompt_tokens"
}

t_malformed_json() {
  printf '{"model": "%s", "prompt": "x", ' "$model" >"$tmp/malformed.json"
  expect_status 400 "$(curl_to malformed POST /v1/completions "$tmp/malformed.json")" &&
    json_assert "$tmp/malformed.body" "j.error.type === 'invalid_request_error' && /JSON/i.test(j.error.message)"
}

t_bad_field() {
  local b
  b=$(body bad_field '{"model": "'"$model"'", "prompt": "x", "temperature": -1}')
  expect_status 400 "$(curl_to bad_field POST /v1/completions "$b")" &&
    json_assert "$tmp/bad_field.body" "j.error.param === 'temperature' && j.error.message.includes('temperature')"
}

t_huge_body() {
  # 9 MiB of prompt: over the default --max-body-bytes (8 MiB) and the driver's (1 MiB). The
  # server answers 413 without reading the body.
  node -e 'process.stdout.write(JSON.stringify({model: process.argv[1], prompt: "x".repeat(9 << 20)}))' \
    "$model" >"$tmp/huge.json"
  expect_status 413 "$(curl_to huge POST /v1/completions "$tmp/huge.json")" &&
    json_assert "$tmp/huge.body" "j.error.type === 'invalid_request_error' && /larger than/.test(j.error.message)"
}

t_not_found_and_method() {
  expect_status 404 "$(curl_to nowhere GET /v1/nowhere)" &&
    json_assert "$tmp/nowhere.body" "j.error.type === 'not_found_error'" &&
    expect_status 405 "$(curl_to method GET /v1/completions)" &&
    json_assert "$tmp/method.body" "/POST/.test(j.error.message)"
}

t_server_still_healthy() {
  expect_status 200 "$(curl_to health2 GET /health)"
}

echo "curl checks against $base (model $model)"
check "GET /health is 200" t_health
check "GET /v1/models lists the model" t_models
check "POST /v1/completions (greedy) with usage" t_completion
check "POST /v1/completions stream: SSE data lines, [DONE], same text" t_completion_stream
check "POST /v1/chat/completions" t_chat
check "POST /v1/chat/completions stream: role, deltas, usage, [DONE]" t_chat_stream
check "GET /metrics has vLLM's names and moving counters" t_metrics
check "POST /tokenize then /detokenize round-trips UTF-8 text" t_tokenize_round_trip
check "POST /tokenize of messages counts the chat prompt" t_tokenize_chat
check "malformed JSON is 400 with an OpenAI error body" t_malformed_json
check "an out-of-range field is 400 naming it" t_bad_field
check "a body over --max-body-bytes is 413" t_huge_body
check "unknown route 404, wrong method 405" t_not_found_and_method
check "the server is still healthy" t_server_still_healthy
echo "curl checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
