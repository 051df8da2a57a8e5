// cli/bench/bench_serve.cpp: `k3serve bench-serve`: drive a running OpenAI-compatible server with a
// workload (random, shared_prefix, agentic, trace), print vLLM-style metrics and write a result
// bundle (loadgen/bundle.h). Every workload parameter is a flag, so the agentic shape of the big
// model scales down to the tiny one in CI.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include "cli/args.h"
#include "cli/bench/commands.h"
#include "cli/log_options.h"
#include "core/error.h"
#include "core/log.h"
#include "loadgen/bench_run.h"
#include "loadgen/bundle.h"

namespace k3::cli {

namespace {

// "A:B" -> {A, B} (integers).
std::pair<int64_t, int64_t> int_pair(const std::string& option, const std::string& v) {
  const size_t colon = v.find(':');
  K3_CHECK(colon != std::string::npos, "bench-serve: --" + option + " must be MIN:MAX, got '" + v + "'");
  try {
    size_t a = 0, b = 0;
    const int64_t lo = std::stoll(v.substr(0, colon), &a), hi = std::stoll(v.substr(colon + 1), &b);
    K3_CHECK(a == colon && b == v.size() - colon - 1, "");
    return {lo, hi};
  } catch (const std::exception&) {
    throw core::Error("bench-serve: --" + option + " must be MIN:MAX integers, got '" + v + "'");
  }
}

// vLLM spells SLOs as separate words after --goodput ("--goodput ttft:500 tpot:50"): join them
// into one value so the strict parser sees a single option.
std::vector<std::string> join_goodput(std::span<char* const> argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    out.emplace_back(argv[i]);
    if (out.back() != "--goodput") continue;
    std::string joined;
    while (i + 1 < argv.size() && std::string(argv[i + 1]).rfind("--", 0) != 0) joined += std::string(argv[++i]) + " ";
    out.push_back(joined);
  }
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  std::istringstream in(s);
  while (in >> w)
    for (size_t start = 0, comma; start <= w.size(); start = comma + 1) {
      comma = w.find(',', start);
      if (comma == std::string::npos) comma = w.size();
      if (comma > start) out.push_back(w.substr(start, comma - start));
    }
  return out;
}

}  // namespace

int bench_serve_command(std::span<char* const> raw_argv) {
  std::vector<OptionSpec> specs = {
      {"host", "H", "server address", "127.0.0.1"},
      {"port", "P", "server port", "8000"},
      {"model", "NAME", "model id to request (default: the first of /v1/models)", ""},
      {"model-dir", "DIR",
       "the served model folder: its config.json is hashed into the bundle, vocab_size sets --token-range", ""},
      {"workload", "KIND", "random | shared_prefix | agentic | trace", "random"},
      {"seed", "N", "workload seed (prompts, lengths, pauses, arrivals)", "0"},
      {"num-sessions", "N", "sessions (requests, for random / shared_prefix)", "16"},
      {"input-len", "N", "random, shared_prefix: prompt tokens (after the prefix)", "256"},
      {"output-len", "N", "random, shared_prefix: reply tokens", "64"},
      {"range-ratio", "R", "random, shared_prefix: lengths uniform in len x [1-R, 1+R]", "0"},
      {"prefix-len", "N", "shared_prefix: tokens of each shared prefix", "128"},
      {"num-prefixes", "N", "shared_prefix: distinct prefixes", "1"},
      {"first-turn-len", "N", "agentic: first prompt tokens", "50000"},
      {"turn-increment", "N", "agentic: new tokens each later turn adds (besides the previous reply)", "800"},
      {"agent-output-len", "N", "agentic: reply tokens per turn", "500"},
      {"agent-range-ratio", "R", "agentic: first-turn and increment lengths uniform in len x [1-R, 1+R]", "0.1"},
      {"turns", "MIN:MAX", "agentic: turns per session, uniform", "10:15"},
      {"pause", "S", "agentic: mean pause before a later turn (tool call), uniform in [0.5, 1.5] x S", "1"},
      {"subagents", "N", "agentic: sub-agent sessions each session forks after its middle turn", "0"},
      {"subagent-turns", "N", "agentic: turns of a sub-agent session", "2"},
      {"subagent-increment", "N", "agentic: new tokens per sub-agent turn", "400"},
      {"trace", "FILE",
       "trace: JSONL file (input_length, output_length, session_id, hash_ids, timestamp, delay); --mode rate replays its timestamps",
       ""},
      {"trace-block-size", "N", "trace: tokens per hash id", "512"},
      {"trace-time-scale", "X", "trace: multiplies timestamps and delays", "1"},
      {"token-range", "LO:HI",
       "prompt token ids drawn from [LO, HI) (default 0:vocab-256 with --model-dir, else 0:768)", ""},
      {"mode", "M", "concurrency (N workers back to back) | rate (Poisson session arrivals)", "concurrency"},
      {"concurrency", "N", "workers; in rate mode the most sessions in flight (default there: no cap)", "1"},
      {"request-rate", "R", "rate mode: sessions per second ('inf': all at once)", "1"},
      {"warmup", "N", "unmeasured warm-up requests first", "1"},
      {"max-duration", "S", "start no request after S seconds (0: run the whole workload)", "0"},
      {"goodput", "SLOS", "SLOs in ms for goodput: ttft:500 tpot:50 e2e:3000", ""},
      {"timeout", "S", "read timeout of one request", "600"},
      {"label", "NAME", "run name in compare reports (default: the bundle file name)", ""},
      {"series", "NAME", "curve name in sweep plots (default: git sha + workload)", ""},
      {"engine-config", "JSON", "how the server was started, recorded in the bundle (JSON text or @FILE)", ""},
      {"out", "FILE", "result bundle path", "bench_serve.json"},
      {"progress", "S", "print finished requests every S seconds on stderr (0: never)", "10"},
      {"quiet", "", "do not print the summary table", ""},
  };
  const std::vector<std::string> joined = join_goodput(raw_argv);
  std::vector<char*> argv;
  for (const std::string& s : joined) argv.push_back(const_cast<char*>(s.c_str()));
  for (OptionSpec& s : log_option_specs()) specs.push_back(std::move(s));
  Args args("bench-serve", specs, argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  configure_log(args);

  loadgen::BenchConfig c;
  c.endpoint.host = args.get("host");
  c.endpoint.port = static_cast<int>(args.get_int("port"));
  K3_CHECK(c.endpoint.port > 0 && c.endpoint.port < 65536, "bench-serve: --port must be in [1, 65535]");
  c.endpoint.model = args.get("model");
  c.endpoint.timeout_s = args.get_double("timeout");
  c.model_dir = args.get("model-dir");

  loadgen::WorkloadSpec& w = c.workload;
  w.kind = args.get("workload");
  w.seed = args.get_u64("seed");
  w.num_sessions = args.get_int("num-sessions");
  const double rr = args.get_double("range-ratio"), arr = args.get_double("agent-range-ratio");
  w.input = {args.get_int("input-len"), rr};
  w.output = {args.get_int("output-len"), rr};
  w.prefix_len = args.get_int("prefix-len");
  w.num_prefixes = args.get_int("num-prefixes");
  w.first_turn = {args.get_int("first-turn-len"), arr};
  w.turn_increment = {args.get_int("turn-increment"), arr};
  w.agent_output = {args.get_int("agent-output-len"), 0};
  std::tie(w.turns_min, w.turns_max) = int_pair("turns", args.get("turns"));
  w.pause_mean_s = args.get_double("pause");
  w.subagents = args.get_int("subagents");
  w.subagent_turns = args.get_int("subagent-turns");
  w.subagent_increment = {args.get_int("subagent-increment"), arr};
  w.trace_path = args.get("trace");
  w.trace_block_size = args.get_int("trace-block-size");
  w.trace_time_scale = args.get_double("trace-time-scale");
  if (args.has("token-range")) {
    const auto [lo, hi] = int_pair("token-range", args.get("token-range"));
    w.token_low = static_cast<int32_t>(lo);
    w.token_high = static_cast<int32_t>(hi);
  } else if (!c.model_dir.empty()) {
    // K3 tokenizers keep their 256 special tokens at the top of the vocabulary.
    std::ifstream f(std::filesystem::path(c.model_dir) / "config.json");
    K3_CHECK(f.good(), "bench-serve: cannot read " + c.model_dir + "/config.json (--model-dir)");
    const nlohmann::json cfg = nlohmann::json::parse(f, nullptr, false);
    K3_CHECK(!cfg.is_discarded() && cfg.contains("vocab_size") && cfg["vocab_size"].is_number_integer(),
             "bench-serve: " + c.model_dir + "/config.json has no integer vocab_size");
    w.token_low = 0;
    w.token_high = cfg["vocab_size"].get<int32_t>() - 256;
  }
  w.validate();

  c.run.mode = args.get("mode");
  // In rate mode --concurrency caps sessions in flight; not given, there is no cap.
  c.run.concurrency = c.run.mode == "rate" && !args.has("concurrency") ? 0 : args.get_int("concurrency");
  c.run.request_rate = args.get("request-rate") == "inf" ? std::numeric_limits<double>::infinity()
                                                         : args.get_double("request-rate");
  c.run.warmup_requests = args.get_int("warmup");
  c.run.max_duration_s = args.get_double("max-duration");
  c.run.seed = w.seed;
  c.run.progress_s = args.get_double("progress");
  c.run.validate();
  c.slos = loadgen::parse_slos(words(args.get("goodput")));
  c.label = args.get("label");
  c.series = args.get("series");
  if (const std::string e = args.get("engine-config"); !e.empty()) {
    std::string text = e;
    if (e[0] == '@') {
      std::ifstream f(e.substr(1));
      K3_CHECK(f.good(), "bench-serve: cannot read --engine-config file '" + e.substr(1) + "'");
      std::stringstream s;
      s << f.rdbuf();
      text = s.str();
    }
    c.engine_config = nlohmann::json::parse(text, nullptr, false);
    if (c.engine_config.is_discarded()) c.engine_config = text;  // a command line, kept as text
  }

  const std::string out = args.get("out");
  log::info("bench-serve: " + w.kind + " workload, " + c.run.mode + " mode, against " + c.endpoint.url());
  const nlohmann::json bundle = loadgen::run_benchmark(c);
  loadgen::write_bundle(bundle, out);
  if (!args.flag("quiet")) std::cout << loadgen::format_summary(bundle);
  std::cout << "bundle: " << out << std::endl;
  // Failed requests are measured results, but a run where some failed is not a clean run.
  return bundle["summary"]["failed"].get<int64_t>() > 0 ? 1 : 0;
}

}  // namespace k3::cli
