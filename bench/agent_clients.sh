#!/usr/bin/env bash
# bench/agent_clients.sh: the real agent CLIs against `k3serve serve`, as a user runs them: Claude
# Code (`claude -p`, Anthropic Messages API) and Codex (`codex exec`, OpenAI Responses API) with
# their DEFAULT system prompts and tools (about 49 KB and 41 KB of first request with 2.1.332 and
# 0.171.0), nothing shrunk. Per run it measures the wall time of the CLI, and from the server's
# /metrics deltas around the run the requests it sent, their mean time to first token
# (vllm:time_to_first_token_seconds_sum / _count), prompt, cached and generated tokens. Prints a
# table and writes a result bundle (git sha, machine, config, raw samples, medians) into
# RESULTS_DIR. A benchmark, not a test: CI does not run it (tests/clients/agent_cli_test.sh is
# the test, with short prompts).
#
#   bash bench/agent_clients.sh MODEL_DIR RESULTS_DIR [--runs N] [--k3serve PATH] [--cli-dir DIR]
#        [--name SERVED_NAME] [--max-model-len N] [--timeout S] [--prompt TEXT] [-- SERVE ARGS...]
#
# MODEL_DIR: a checkpoint folder (`k3serve make-checkpoint` writes one). SERVE ARGS go to
# `k3serve serve` as they are (e.g. -- --device cuda --decode-backend latency_specialized).
# Defaults: 3 runs per client, build/cpu-release/k3serve, .testdata/agent-clis (installed by
# scripts/fetch_test_data.sh), the folder's name, --max-model-len 65536 (Claude Code asks for
# max_tokens 32000 on top of its prompt), 900 s per run. Every run has its own empty HOME (the
# runs of one client share a work folder, so their prompts repeat): the first run of each client
# finds the server's prefix cache cold (marked "cold"), later ones warm. Retries are off in both clients, so a failed request shows as a
# failed run (rc) instead of a slow one.
set -uo pipefail
usage() {
  sed -n '12,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 2 ] || usage
model_dir=$1 results_dir=$2
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
runs=3 k3serve=$here/build/cpu-release/k3serve cli_dir=$here/.testdata/agent-clis name="" max_model_len=65536 limit=900
prompt="Reply with one word."
serve_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --k3serve) k3serve=$2; shift 2 ;;
    --cli-dir) cli_dir=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --max-model-len) max_model_len=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    *) echo "agent_clients: unknown option $1" >&2; usage ;;
  esac
done
model_dir=$(cd "$model_dir" 2>/dev/null && pwd) || { echo "agent_clients: no model folder $1" >&2; exit 2; }
name=${name:-$(basename "$model_dir")}
cli_dir=$(cd "$cli_dir" 2>/dev/null && pwd) || { echo "agent_clients: no CLI folder (scripts/fetch_test_data.sh installs it)" >&2; exit 2; }
claude=$cli_dir/node_modules/@anthropic-ai/claude-code-linux-x64/claude
codex=$cli_dir/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
for b in "$k3serve" "$claude" "$codex"; do
  [ -x "$b" ] || { echo "agent_clients: no executable $b" >&2; exit 2; }
done
for t in node curl; do command -v $t >/dev/null || { echo "agent_clients: $t is not installed" >&2; exit 2; }; done
mkdir -p "$results_dir"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/k3_agent_bench.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
now() { date +%s.%N; }

# --- the server ---
log=$tmp/server.log
"$k3serve" serve --model "$model_dir" --served-model-name "$name" --host 127.0.0.1 --port 0 \
  --max-model-len "$max_model_len" "${serve_args[@]}" >"$log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 3000); do  # 300 s: a real checkpoint takes a while to load
  port=$(sed -n 's|^.* info *serving model .* on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { tail -n 30 "$log" >&2; echo "agent_clients: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { tail -n 30 "$log" >&2; echo "agent_clients: the server printed no port within 300 s" >&2; exit 1; }
base=http://127.0.0.1:$port
for _ in $(seq 600); do
  [ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$base/health")" = 200 ] && break
  sleep 0.1
done
echo "agent_clients: k3serve serving $name from $model_dir on $base"

# metrics FILE: the counters this bench reads, one "name value" line each (summed over labels).
metrics() {
  curl -s --max-time 10 "$base/metrics" | awk '
    BEGIN { split("vllm:time_to_first_token_seconds_sum vllm:time_to_first_token_seconds_count vllm:prompt_tokens_total vllm:prefix_cache_hits_total vllm:generation_tokens_total vllm:e2e_request_latency_seconds_sum", want, " ")
            for (i in want) { keep[want[i]] = 1; v[want[i]] = 0 } }
    /^[^#]/ { n = $1; sub(/\{.*/, "", n); if (n in keep) v[n] += $NF }
    END { for (n in v) print n, v[n] }' >"$1"
}
metric() { awk -v n="$2" '$1 == n { print $2 }' "$1"; }
idle() {  # waits (up to 30 s) until no request runs
  for _ in $(seq 300); do
    curl -s --max-time 2 "$base/metrics" | awk '/^vllm:num_requests_(running|waiting)/ { s += $NF } END { exit s > 0 }' && return
    sleep 0.1
  done
}

# run_cli CLIENT RUN: one run with the client's defaults; appends a sample line to $tmp/samples.tsv.
run_cli() {
  # A fresh HOME per run, one work folder per client: the prompt (which names the folder) repeats.
  local client=$1 run=$2 dir=$tmp/$1_$2 work=$tmp/$1_work
  mkdir -p "$dir/home/.codex" "$work"
  local cmd
  if [ "$client" = claude ]; then
    cmd=(env -i PATH=/usr/bin:/bin HOME="$dir/home" TMPDIR="$dir" LANG=C.UTF-8 ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY=dummy
         DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1
         CLAUDE_CODE_MAX_RETRIES=0 "$claude" -p "$prompt" --model "$name")
  else
    cat >"$dir/home/.codex/config.toml" <<EOF
model = "$name"
model_provider = "k3"

[model_providers.k3]
name = "k3serve"
base_url = "$base/v1"
wire_api = "responses"
env_key = "K3_KEY"
request_max_retries = 0
stream_max_retries = 0
EOF
    cmd=(env -i PATH=/usr/bin:/bin HOME="$dir/home" CODEX_HOME="$dir/home/.codex" TMPDIR="$dir" LANG=C.UTF-8 K3_KEY=dummy
         "$codex" exec --skip-git-repo-check --ephemeral --color never "$prompt")
  fi
  idle
  metrics "$dir/before"
  local t0 t1 rc
  t0=$(now)
  (cd "$work" && timeout --kill-after=5 "$limit" "${cmd[@]}" </dev/null >"$dir/out" 2>"$dir/err")
  rc=$?
  t1=$(now)
  idle
  metrics "$dir/after"
  local m d=()
  for m in vllm:time_to_first_token_seconds_sum vllm:time_to_first_token_seconds_count vllm:prompt_tokens_total \
           vllm:prefix_cache_hits_total vllm:generation_tokens_total vllm:e2e_request_latency_seconds_sum; do
    d+=("$(awk -v a="$(metric "$dir/before" "$m")" -v b="$(metric "$dir/after" "$m")" 'BEGIN { printf "%.6f", b - a }')")
  done
  local text
  text=$(tr -d '\000-\037' <"$dir/out" | head -c 200)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$client" "$run" "$rc" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "${d[@]}" "$text" >>"$tmp/samples.tsv"
  [ "$rc" = 0 ] || { echo "agent_clients: $client run $run exited $rc; stderr:" >&2; tail -n 5 "$dir/err" | sed 's/^/  | /' >&2; }
}

: >"$tmp/samples.tsv"
for client in claude codex; do
  for run in $(seq "$runs"); do
    echo "agent_clients: $client run $run of $runs"
    run_cli "$client" "$run"
  done
done

# --- table and bundle ---
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$results_dir/agent_clients_$stamp.json
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
BENCH_RUNS=$runs BENCH_PROMPT=$prompt BENCH_NAME=$name BENCH_MAX_MODEL_LEN=$max_model_len BENCH_TIMEOUT=$limit \
BENCH_K3SERVE=$k3serve BENCH_CLAUDE=$claude BENCH_CODEX=$codex BENCH_REPO=$here BENCH_MODEL_DIR=$model_dir BENCH_LOG=$log \
BENCH_GPU=$gpu node - "$tmp/samples.tsv" "$out" "${serve_args[@]}" <<'EOF'
// Folds the samples into the bundle and prints the table; the settings come in BENCH_* variables.
const fs = require("fs"), os = require("os"), env = process.env;
const [tsv, out, ...serveArgs] = process.argv.slice(2);
const sh = (c) => { try { return require("child_process").execSync(c, { cwd: env.BENCH_REPO, stdio: ["ignore", "pipe", "ignore"] }).toString().trim(); } catch { return ""; } };
const q = (s) => "'" + s.replace(/'/g, "'\\''") + "'";
const cpu = (fs.readFileSync("/proc/cpuinfo", "utf8").match(/^model name\s*:\s*(.*)$/m) || [])[1] || "unknown";
const samples = fs.readFileSync(tsv, "utf8").split("\n").filter(Boolean).map((l) => {
  const [client, run, rc, wall, ttftSum, ttftCount, prompt, cached, gen, e2eSum, text] = l.split("\t");
  const n = Math.round(Number(ttftCount));
  return { client, run: Number(run), cold: Number(run) === 1, rc: Number(rc), wall_s: Number(wall), requests: n,
           ttft_s: n > 0 ? Number(ttftSum) / n : null, mean_request_latency_s: n > 0 ? Number(e2eSum) / n : null,
           prompt_tokens: Math.round(Number(prompt)), cached_tokens: Math.round(Number(cached)), generated_tokens: Math.round(Number(gen)),
           output_head: text ?? "" };
});
const median = (xs) => { const s = xs.filter((x) => x != null).sort((a, b) => a - b); const k = s.length;
                         return k ? (k % 2 ? s[(k - 1) / 2] : (s[k / 2 - 1] + s[k / 2]) / 2) : null; };
const summary = {};
for (const client of ["claude", "codex"]) {
  const ok = samples.filter((s) => s.client === client && s.rc === 0), warm = ok.filter((s) => !s.cold);
  const cold = ok.find((s) => s.cold);
  summary[client] = { runs: samples.filter((s) => s.client === client).length, ok_runs: ok.length,
    median_wall_s: median(ok.map((s) => s.wall_s)), median_ttft_s: median(ok.map((s) => s.ttft_s)),
    median_warm_wall_s: median(warm.map((s) => s.wall_s)), median_warm_ttft_s: median(warm.map((s) => s.ttft_s)),
    cold_wall_s: cold?.wall_s ?? null, cold_ttft_s: cold?.ttft_s ?? null, median_prompt_tokens: median(ok.map((s) => s.prompt_tokens)) };
}
const bundle = {
  benchmark: "agent_clients",
  config: { runs: Number(env.BENCH_RUNS), prompt: env.BENCH_PROMPT, served_model_name: env.BENCH_NAME,
            max_model_len: Number(env.BENCH_MAX_MODEL_LEN), timeout_s: Number(env.BENCH_TIMEOUT), serve_args: serveArgs,
            k3serve: env.BENCH_K3SERVE, claude_code: sh(q(env.BENCH_CLAUDE) + " --version"), codex: sh(q(env.BENCH_CODEX) + " --version"),
            client_options: "defaults (system prompts, tools, thinking); retries off; an empty HOME per run" },
  environment: { git_sha: sh("git rev-parse HEAD"), git_dirty: sh("git status --porcelain") !== "", cpu, cpu_threads: os.cpus().length,
                 host: os.hostname(), gpu: env.BENCH_GPU || null },
  model: { dir: env.BENCH_MODEL_DIR,
           server_log_head: fs.readFileSync(env.BENCH_LOG, "utf8").split("\n").filter((l) => /^(model|loaded|scheduler|cache|serving)/.test(l)) },
  samples, summary,
};
fs.writeFileSync(out, JSON.stringify(bundle, null, 2) + "\n");
const f = (x, d = 2) => x == null ? "-" : x.toFixed(d);
console.log("client  run  rc   wall_s  ttft_s  requests  prompt_tok  cached_tok  gen_tok");
for (const s of samples) console.log([s.client.padEnd(6), String(s.run).padStart(3) + (s.cold ? "c" : " "), String(s.rc).padStart(3),
  f(s.wall_s).padStart(8), f(s.ttft_s, 3).padStart(7), String(s.requests).padStart(9), String(s.prompt_tokens).padStart(11),
  String(s.cached_tokens).padStart(11), String(s.generated_tokens).padStart(8)].join(" "));
for (const [c, m] of Object.entries(summary)) console.log(c + ": median wall " + f(m.median_wall_s) + " s, median TTFT " + f(m.median_ttft_s, 3) +
  " s (cold run: " + f(m.cold_wall_s) + " s, TTFT " + f(m.cold_ttft_s, 3) + " s), " + m.ok_runs + "/" + m.runs + " runs ok");
console.log("bundle: " + out);
EOF
