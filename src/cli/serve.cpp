// cli/serve.cpp: `k3serve serve`: load a model folder, start the engine loop and the
// OpenAI-compatible HTTP server, serve until SIGINT/SIGTERM, then drain: new requests get 503,
// in-flight ones get --drain-seconds to finish, the rest end with an error event.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/log_options.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "server/api_server.h"
#include "server/serving_model.h"

namespace k3::cli {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

int serve_command(std::span<char* const> argv) {
  std::vector<OptionSpec> specs = model_option_specs();
  specs.push_back({"host", "H", "address to listen on", "127.0.0.1"});
  specs.push_back({"port", "P", "TCP port (0: any free port)", "8000"});
  specs.push_back({"served-model-name", "NAME [NAME ...]",
                   "model ids clients may use; replies name the one asked for (default: the folder's name)", "", false,
                   true});
  specs.push_back({"api-key", "KEY",
                   "require this key on every API route (Bearer or x-api-key); /health and /metrics "
                   "stay open",
                   ""});
  specs.push_back({"max-model-len", "N", "prompt + completion tokens of one request", "65536"});
  specs.push_back({"max-num-seqs", "N", "requests running at once (KDA state slots)", "64"});
  specs.push_back({"max-num-batched-tokens", "N",
                   "tokens per engine step; a prompt alone in its step (no decodes, no other prompt) takes them all",
                   "2048"});
  specs.push_back({"max-num-partial-prefills", "N", "prompts advancing in one step", "4"});
  specs.push_back({"max-long-partial-prefills", "N",
                   "of them, long prompts (shorter ones pass waiting long ones); at most --max-num-partial-prefills",
                   "1"});
  specs.push_back({"long-prefill-token-threshold", "N",
                   "a prompt with more tokens than this left to prefill is long: beside decodes or other prompts "
                   "its chunk is at most this (a multiple of the KDA chunk)",
                   "512"});
  specs.push_back({"shadow-validate-rate", "R",
                   "with --decode-backend latency_specialized: this share of the fused decode steps also runs the "
                   "standard path and compares the logits (k3serve:shadow_* in /metrics; divergences are logged); "
                   "clients get the fused step's output either way",
                   "0"});
  specs.push_back({"kv-cache-bytes", "B", "memory for MLA pages, KDA slots and prefix checkpoints", "268435456"});
  specs.push_back({"no-prefix-cache", "", "turn prefix caching off", ""});
  specs.push_back({"http-threads", "N", "connections served at once (streams + idle keep-alives)", "256"});
  specs.push_back({"max-body-bytes", "B", "largest request body (larger: 413)", "8388608"});
  specs.push_back({"drain-seconds", "S", "on SIGTERM/SIGINT, how long in-flight requests may finish", "30"});
  for (OptionSpec& s : speculative_option_specs()) specs.push_back(std::move(s));
  specs.push_back(tp_option_spec());
  specs.push_back(expert_parallel_option_spec());
  specs.push_back({"decode-context-parallel-size", "N",
                   "split every sequence's MLA cache over the --tp ranks by token (1: off, else N = --tp): N times "
                   "the context in the same --kv-cache-bytes",
                   "1"});
  for (OptionSpec& s : log_option_specs()) specs.push_back(std::move(s));
  Args args("serve", specs, argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  configure_log(args);
  auto positive = [&](const char* name, int64_t lo, int64_t hi) {
    const int64_t v = args.get_int(name);
    K3_CHECK(v >= lo && v <= hi, std::string("--") + name + " must be in [" + std::to_string(lo) + ", " +
                                     std::to_string(hi) + "], got " + std::to_string(v));
    return v;
  };

  // Signals go to the sigwait below, not to whichever thread happens to run: block them
  // before any thread exists so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  server::ServingOptions o;
  o.model_dir = args.get("model");
  o.model = parse_model_options(args);
  o.kv_cache = parse_kv_cache(args);
  o.max_model_len = positive("max-model-len", 2, 1 << 24);
  o.max_num_seqs = static_cast<int32_t>(positive("max-num-seqs", 1, 4096));
  o.max_num_batched_tokens = static_cast<int32_t>(positive("max-num-batched-tokens", 1, 1 << 20));
  o.max_partial_prefills = static_cast<int32_t>(positive("max-num-partial-prefills", 1, 4096));
  o.max_long_partial_prefills = static_cast<int32_t>(positive("max-long-partial-prefills", 1, 4096));
  K3_CHECK(o.max_long_partial_prefills <= o.max_partial_prefills,
           "--max-long-partial-prefills (" + std::to_string(o.max_long_partial_prefills) +
               ") must be <= --max-num-partial-prefills (" + std::to_string(o.max_partial_prefills) + ")");
  o.long_prefill_token_threshold = static_cast<int32_t>(positive("long-prefill-token-threshold", 1, 1 << 20));
  o.kv_cache_bytes = positive("kv-cache-bytes", 1, int64_t{1} << 50);
  o.shadow_validate_rate = args.get_double("shadow-validate-rate");
  K3_CHECK(o.shadow_validate_rate >= 0 && o.shadow_validate_rate <= 1,
           "--shadow-validate-rate must be in [0, 1], got " + args.get("shadow-validate-rate"));
  K3_CHECK(o.shadow_validate_rate == 0 || o.model.decode_backend == model::DecodeBackend::latency_specialized,
           "--shadow-validate-rate checks the fused decode path against the standard one: it needs "
           "--decode-backend latency_specialized");
  o.enable_prefix_cache = !args.flag("no-prefix-cache");
  o.tp = parse_tp(args);
  o.model.dcp = static_cast<int>(positive("decode-context-parallel-size", 1, 64));
  model::check_dcp_size(o.model.dcp, o.tp);
  parse_expert_parallel(args, o.tp, o.model);
  o.speculative = parse_speculative(args);
  o.draft_model_dir = args.get("speculative-model");
  K3_CHECK(o.draft_model_dir.empty() || o.speculative.needs_draft_model(),
           "--speculative-model is only used with --speculative-method dspark or eagle3");
  if (o.speculative.method == spec::SpecMethod::synthetic)
    log::warn(
        "SYNTHETIC speculative decoding (acceptance is forced: outputs are not the model's distribution; "
        "for benchmarks only)");

  server::ServerConfig sc;
  sc.host = args.get("host");
  sc.port = static_cast<int>(positive("port", 0, 65535));
  sc.served_model_names = args.get_list("served-model-name");
  for (const std::string& n : sc.served_model_names) K3_CHECK(!n.empty(), "--served-model-name: an empty name");
  if (sc.served_model_names.empty()) {
    std::string name = std::filesystem::path(o.model_dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::absolute(o.model_dir).parent_path().filename().string();
    sc.served_model_names = {name};
  }
  sc.api_key = args.get("api-key");
  sc.model_root = o.model_dir.string();
  sc.http_threads = static_cast<int>(positive("http-threads", 1, 16384));
  sc.max_body_bytes = static_cast<size_t>(positive("max-body-bytes", 1024, int64_t{1} << 34));
  const int64_t drain_seconds = positive("drain-seconds", 0, 86400);

  o.load_progress = load_progress_to_stderr(o.model_dir.string());
  log::info("loading " + o.model_dir.string());
  auto model = server::ServingModel::load(o);
  for (const std::string& line : split_lines(model->description())) log::info(line);
  // A coding agent's first prompt takes a CPU many seconds to prefill: say how it goes.
  model->engine().set_prefill_log([](const std::string& line) { log::info(line); });
  model->engine().start();
  auto http = std::make_unique<server::ApiServer>(sc, model->engine(), model->tokenizer());
  const int port = http->start();
  std::string names;
  for (const std::string& n : sc.served_model_names) names += (names.empty() ? "'" : ", '") + n + "'";
  log::info("serving model " + names + " on http://" + sc.host + ":" + std::to_string(port) +
            "/v1 (OpenAI chat/completions/responses, Anthropic messages; GET /metrics, /health" +
            (sc.api_key.empty() ? "" : "; API key required") + "). Ctrl-C to stop.");

  int sig = 0;
  sigwait(&signals, &sig);
  log::info(std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") + ", draining " + std::to_string(http->inflight()) +
            " request(s) for up to " + std::to_string(drain_seconds) + " s");
  // Each phase of the shutdown is timed in the log, so a slow exit names its phase.
  auto clock = std::chrono::steady_clock::now();
  const auto took = [&clock] {
    const auto now = std::chrono::steady_clock::now();
    char buf[32];
    snprintf(buf, sizeof buf, "%.2f s", std::chrono::duration<double>(now - clock).count());
    clock = now;
    return std::string(buf);
  };
  http->drain(std::chrono::seconds(drain_seconds));
  log::info("drained in " + took());
  http->stop();
  http.reset();
  model->engine().stop();
  log::info("closed the HTTP server and stopped the engine in " + took());
  model.reset();  // weights, caches, grammar warming and threads
  log::info("released the model in " + took());
  log::info("stopped");
  return 0;
}

}  // namespace k3::cli
