#!/usr/bin/env bash
# tests/clients/run_client_tests.sh: ctest "client_tests". Launches the real `k3serve serve` on a
# free port with a fresh k3-tiny checkpoint, waits for /health, runs curl_test.sh and
# openai_sdk_test.mjs (the official OpenAI Node SDK) against it, then sends SIGTERM while a long
# stream is in flight and checks the drain: /health turns 503, the stream ends with a finish or
# an error event and "data: [DONE]", and the server exits with code 0.
#
#   bash tests/clients/run_client_tests.sh PATH/TO/k3serve SOURCE_DIR
#
# Exits 77 (ctest SKIP_RETURN_CODE) when node or curl is missing, or when the SDK is missing
# from SOURCE_DIR/.testdata/openai-node (scripts/fetch_test_data.sh installs it; the curl and
# SIGTERM checks still run first). Every wait has a time limit, and the server is killed on
# every way out, so the test cannot hang or leave a server behind.
set -uo pipefail
bin=${1:?usage: run_client_tests.sh K3SERVE SOURCE_DIR}
src=${2:?usage: run_client_tests.sh K3SERVE SOURCE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
sdk_dir=${K3_OPENAI_SDK_DIR:-$src/.testdata/openai-node}
skip_code=77

say() { echo "client_tests: $*"; }
skip() {
  say "SKIP: $*"
  exit $skip_code
}
die() {
  say "FAIL: $*"
  if [ -n "${log:-}" ] && [ -f "$log" ]; then
    say "server log (last 40 lines):"
    tail -n 40 "$log" | sed 's/^/  | /'
  fi
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

command -v node >/dev/null 2>&1 || skip "node is not installed (scripts/install_deps.sh installs nodejs and npm)"
command -v curl >/dev/null 2>&1 || skip "curl is not installed"
[ -x "$bin" ] || die "no k3serve binary at $bin"
have_sdk=1
[ -f "$sdk_dir/node_modules/openai/index.mjs" ] || have_sdk=0

tmp=$(mktemp -d "${TMPDIR:-/tmp}/k3_client_tests.XXXXXX")
log=$tmp/server.log
server_pid=""
stream_pid=""
cleanup() {
  # The server runs under timeout(1), which forwards TERM to it; its process group (timeout's
  # own, see below) is killed outright if it is still there after 5 s.
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$server_pid" 2>/dev/null
    kill -KILL "$server_pid" 2>/dev/null
  fi
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

# --- start the server on a free port (--port 0: it binds one and prints it) ---
t0=$(now)
# timeout(1) bounds the server's life even if this script is killed without running its trap.
timeout --kill-after=5 300 "$bin" serve --model "$model_dir" --host 127.0.0.1 --port 0 --max-model-len 4096 \
  --max-body-bytes 1048576 --drain-seconds 2 --http-threads 64 >"$log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 600); do  # 60 s
  port=$(sed -n 's|^serving model .* on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || die "the server exited before it was serving"
  sleep 0.1
done
[ -n "$port" ] || die "the server did not print its port within 60 s"
base=http://127.0.0.1:$port
healthy=0
for _ in $(seq 300); do  # 30 s
  if [ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$base/health")" = 200 ]; then healthy=1; break; fi
  sleep 0.1
done
[ "$healthy" = 1 ] || die "GET /health did not answer 200 within 30 s"
say "server pid $server_pid serving on $base after $(since "$t0")"
# The load progress line (checkpoint::LoadProgressLog) is in the log.
grep -Eq "^loaded $model_dir: [0-9]+\.[0-9] MB in [0-9.]+ s \(([0-9.]+ [MG]B/s|- MB/s)\)$" "$log" ||
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
if [ "$have_sdk" = 1 ]; then
  t0=$(now)
  if timeout 180 node "$here/openai_sdk_test.mjs" --base-url "$base/v1" --model k3-tiny --sdk-dir "$sdk_dir"; then
    say "openai SDK checks passed in $(since "$t0")"
  else
    say "openai SDK checks FAILED (rc $?)"
    failures=$((failures + 1))
  fi
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
grep -q '^k3serve serve: SIGTERM, draining 1 request(s)' "$log" || drain_problems+=("no 'SIGTERM, draining 1 request(s)' in the log")
grep -q '^k3serve serve: stopped$' "$log" || drain_problems+=("no 'k3serve serve: stopped' in the log")
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

if [ "$failures" -gt 0 ]; then
  die "$failures part(s) failed"
fi
if [ "$have_sdk" = 0 ]; then
  skip "the openai SDK is missing ($sdk_dir; scripts/fetch_test_data.sh installs it): only the curl and SIGTERM checks ran (they passed)"
fi
say "all passed"
