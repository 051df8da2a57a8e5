// loadgen/integration/serve_workloads_test.cpp: every workload kind, for a second or two each,
// against the real `k3serve serve` (the program, started here on a free loopback port with a
// fresh k3-tiny checkpoint from `k3serve make-checkpoint`): every request succeeds with its exact
// prompt and reply lengths, the bundle holds the samples, shared prefixes and agentic turns hit
// the prefix cache, a time limit stops a run early without failures, and `bench-serve` /
// `bench-compare` work as commands. Nothing asserts how fast the server is: goodput is checked
// against the samples' own times, a prefix is known to be cached before requests count on it,
// and the time limit's effect is bounded by the planned pauses; the deadlines that remain only
// guard against a hang and say what never happened.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "loadgen/bench_run.h"
#include "loadgen/bundle.h"
#include "loadgen/client.h"
#include "loadgen/compare.h"

extern char** environ;

namespace k3::loadgen {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string k3serve_bin() {
  const char* env = std::getenv("K3SERVE_BIN");
  return env && *env ? env : K3SERVE_BIN;
}

// The program whose bench-serve / bench-compare commands are tested: $K3SERVE_BENCH_BIN when set
// (a client build tried against another build's server), else the same k3serve.
std::string bench_bin() {
  const char* env = std::getenv("K3SERVE_BENCH_BIN");
  return env && *env ? env : k3serve_bin();
}

std::string read_file(const fs::path& p) {
  std::stringstream s;
  s << std::ifstream(p).rdbuf();
  return s.str();
}

// Runs argv to completion with stdout+stderr to `log`; returns the exit status.
int run_program(const std::vector<std::string>& argv, const fs::path& log) {
  std::string cmd;
  for (const std::string& a : argv) cmd += "'" + a + "' ";
  return WEXITSTATUS(std::system((cmd + "> '" + log.string() + "' 2>&1").c_str()));
}

// `k3serve serve` on port 0 with a fresh k3-tiny checkpoint; the port is read from its log line
// "serving model '...' on http://127.0.0.1:PORT/v1". SIGTERM (then SIGKILL) at the end.
struct ServerProcess {
  fs::path dir;
  pid_t pid = -1;
  int port = 0;
  std::string failure;

  ServerProcess() {
    dir = fs::temp_directory_path() / ("k3-loadgen-server-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string bin = k3serve_bin();
    if (!fs::exists(bin)) {
      failure = "no k3serve program at " + bin + " (build the k3serve target, or set K3SERVE_BIN)";
      return;
    }
    if (run_program({bin, "make-checkpoint", "--config", "k3-tiny", "--seed", "0", "--out", (dir / "k3-tiny").string()},
                    dir / "make_checkpoint.log") != 0) {
      failure = "make-checkpoint failed: " + read_file(dir / "make_checkpoint.log");
      return;
    }
    const std::string log = (dir / "server.log").string();
    std::vector<std::string> args = {bin,
                                     "serve",
                                     "--model",
                                     (dir / "k3-tiny").string(),
                                     "--port",
                                     "0",
                                     "--max-model-len",
                                     "512",
                                     "--kv-cache-bytes",
                                     "67108864",
                                     "--drain-seconds",
                                     "1"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      failure = "cannot start " + bin;
      pid = -1;
      return;
    }
    // Waits for the log line that says the server listens; the deadline is a hang guard (loading
    // takes a second; a loaded machine is slower, never this slow).
    const std::regex line(R"(serving model '[^']*' on http://[^:]+:(\d+)/v1)");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!port) {
      std::smatch m;
      const std::string text = read_file(log);
      if (std::regex_search(text, m, line)) port = std::stoi(m[1]);
      else if (::waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = -1;
        failure = "the server exited: " + text;
        return;
      } else if (std::chrono::steady_clock::now() >= until) {
        failure = "the server never said its port (waited 120 s): " + text;
        return;
      } else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServerProcess() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 50 && ::waitpid(pid, nullptr, WNOHANG) != pid; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (::kill(pid, 0) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

ServerProcess& server() {
  static ServerProcess s;
  return s;
}

#define REQUIRE_SERVER() \
  if (!server().failure.empty()) FAIL() << server().failure

BenchConfig config_for(WorkloadSpec w) {
  BenchConfig c;
  c.endpoint.port = server().port;
  c.endpoint.timeout_s = 60;
  c.workload = std::move(w);
  c.workload.token_low = 0;
  c.workload.token_high = 768;  // k3-tiny's ordinary ids (1024 - 256 specials)
  c.run.warmup_requests = 1;
  c.label = c.workload.kind;
  c.model_dir = (server().dir / "k3-tiny").string();
  c.engine_config = {{"max_model_len", 512}};
  return c;
}

// Every planned request ran, succeeded, and had exactly the planned prompt and reply lengths.
void expect_complete(const Json& bundle, const WorkloadSpec& spec) {
  const std::vector<Session> sessions = build_workload(spec);
  const auto samples = bundle_samples(bundle);
  ASSERT_EQ(static_cast<int64_t>(samples.size()), count_requests(sessions));
  std::map<std::pair<int64_t, int64_t>, const Turn*> planned;
  std::map<int64_t, int64_t> context_len;  // session id * 1000 + turn -> planned prompt length
  std::function<void(const Session&, int64_t)> walk = [&](const Session& s, int64_t context) {
    for (size_t t = 0; t < s.turns.size(); ++t) {
      const Turn& turn = s.turns[t];
      context = turn.reset_context ? static_cast<int64_t>(turn.append.size())
                                   : context + static_cast<int64_t>(turn.append.size());
      planned[{s.id, static_cast<int64_t>(t)}] = &turn;
      context_len[s.id * 1000 + static_cast<int64_t>(t)] = context;
      for (const Session& sub : turn.subagents) walk(sub, context);
    }
  };
  for (const Session& s : sessions) walk(s, 0);
  for (const RequestSample& s : samples) {
    EXPECT_TRUE(s.ok) << "session " << s.session << " turn " << s.turn << ": " << s.error;
    const auto it = planned.find({s.session, s.turn});
    ASSERT_NE(it, planned.end()) << "unplanned request session " << s.session << " turn " << s.turn;
    EXPECT_EQ(s.input_tokens, context_len[s.session * 1000 + s.turn]);
    EXPECT_EQ(s.output_tokens, it->second->output_tokens);  // ignore_eos: exact
    EXPECT_EQ(s.expected_output_tokens, it->second->output_tokens);
    EXPECT_GT(s.ttft_s, 0);
    EXPECT_GE(s.e2e_s, s.ttft_s);
    EXPECT_GE(s.cached_tokens, 0);  // the server reports usage in the stream
  }
  const Json& summary = bundle["summary"];
  EXPECT_EQ(summary["failed"].get<int64_t>(), 0);
  EXPECT_EQ(summary["completed"].get<int64_t>(), count_requests(sessions));
  EXPECT_GT(summary["output_throughput"].get<double>(), 0);
  EXPECT_GT(summary["ttft_ms"]["p50"].get<double>(), 0);
  EXPECT_FALSE(summary["hit_time_limit"].get<bool>());
  EXPECT_EQ(bundle["server"]["model"]["config_hash"].get<std::string>().size(), 16u);
  EXPECT_EQ(bundle["server"]["model"]["name"], "k3-tiny");
  // The server's counters moved with the run (scraped before and after it).
  EXPECT_GT(bundle["server_metrics"]["deltas"]["vllm:prompt_tokens_total"].get<double>(), 0);
  EXPECT_GE(bundle["server_metrics"]["deltas"]["vllm:generation_tokens_total"].get<double>(),
            summary["total_output_tokens"].get<double>());
}

// The requests of a bundle within a TTFT and a TPOT objective, from the samples' own times
// (TPOT as vLLM: (e2e - ttft) / (output - 1), 0 for one token). Goodput must count exactly
// these, however fast or slow the machine was: no wall-clock assertion.
int64_t within_slos(const Json& bundle, double ttft_ms, double tpot_ms) {
  int64_t n = 0;
  for (const RequestSample& s : bundle_samples(bundle)) {
    const double tpot = s.output_tokens > 1 ? (s.e2e_s - s.ttft_s) / static_cast<double>(s.output_tokens - 1) * 1000
                                            : 0.0;
    n += s.ok && s.ttft_s * 1000 <= ttft_ms && tpot <= tpot_ms;
  }
  return n;
}

TEST(ServeWorkloads, RandomAtFixedConcurrency) {
  REQUIRE_SERVER();
  WorkloadSpec w;
  w.kind = "random";
  w.num_sessions = 8;
  w.input = {48, 0.5};
  w.output = {8, 0.5};
  BenchConfig c = config_for(w);
  c.run.concurrency = 4;
  c.slos = parse_slos({"ttft:60000", "tpot:60000"});
  const Json b = run_benchmark(c);
  expect_complete(b, w);
  EXPECT_EQ(b["summary"]["good_requests"].get<int64_t>(), within_slos(b, 60000, 60000));
  EXPECT_NE(format_summary(b).find("Successful requests:"), std::string::npos);
}

TEST(ServeWorkloads, SharedPrefixAtPoissonRateHitsThePrefixCache) {
  REQUIRE_SERVER();
  WorkloadSpec w;
  w.kind = "shared_prefix";
  w.num_sessions = 6;
  w.num_prefixes = 2;
  w.prefix_len = 64;
  w.input = {16, 0};
  w.output = {6, 0};
  BenchConfig c = config_for(w);
  c.run.mode = "rate";
  c.run.request_rate = 8;  // Poisson arrivals, any number in flight
  c.run.concurrency = 0;
  // Whether a request finds its prefix computed by an earlier one of the run depends on arrival
  // gaps against prefill time. So each prefix is put in the cache first, by its first session's
  // own request, answered before the run: then every request of the run must hit it.
  const std::vector<Session> sessions = build_workload(w);
  Endpoint e = c.endpoint;
  e.model = "k3-tiny";
  ApiClient primer(e);
  for (int64_t g = 0; g < w.num_prefixes; ++g) {
    const RequestSample s = primer.stream_completion(sessions[static_cast<size_t>(g)].turns[0].append, 1,
                                                     std::chrono::steady_clock::now());
    ASSERT_TRUE(s.ok) << "priming prefix " << g << ": " << s.error;
  }
  const Json b = run_benchmark(c);
  expect_complete(b, w);
  for (const RequestSample& s : bundle_samples(b))
    EXPECT_GT(s.cached_tokens, 0) << "session " << s.session << " missed its cached prefix";
  EXPECT_GT(b["summary"]["total_cached_tokens"].get<int64_t>(), 0);
  EXPECT_TRUE(b["server_metrics"]["rates"]["prefix_cache_hit_rate"].is_number());
}

TEST(ServeWorkloads, AgenticSessionsWithSubagents) {
  REQUIRE_SERVER();
  WorkloadSpec w;
  w.kind = "agentic";
  w.num_sessions = 2;
  w.first_turn = {128, 0.1};
  w.turn_increment = {24, 0.25};
  w.agent_output = {8, 0};
  w.turns_min = 2;
  w.turns_max = 3;
  w.pause_mean_s = 0.05;
  w.subagents = 1;
  w.subagent_turns = 2;
  w.subagent_increment = {16, 0};
  BenchConfig c = config_for(w);
  c.run.concurrency = 2;
  const Json b = run_benchmark(c);
  expect_complete(b, w);
  // Every later turn re-sends its session's earlier prompt: the prefix cache serves part of it.
  int64_t later_turns = 0, later_cached = 0;
  for (const RequestSample& s : bundle_samples(b))
    if (s.turn > 0) {
      ++later_turns;
      later_cached += s.cached_tokens > 0;
    }
  EXPECT_GT(later_turns, 0);
  EXPECT_EQ(later_cached, later_turns);
}

TEST(ServeWorkloads, TraceReplayAndBundleRoundTrip) {
  REQUIRE_SERVER();
  const fs::path dir = fs::temp_directory_path() / ("k3-loadgen-it-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "trace.jsonl")
      << "{\"session_id\": \"s\", \"timestamp\": 5.0, \"input_length\": 40, \"output_length\": 4, \"hash_ids\": [7, 8]}\n"
         "{\"session_id\": \"t\", \"timestamp\": 5.2, \"input_length\": 33, \"output_length\": 5, \"hash_ids\": [7]}\n"
         "{\"session_id\": \"s\", \"delay\": 0.1, \"input_length\": 60, \"output_length\": 3, \"hash_ids\": [7, 8, 9]}\n";
  WorkloadSpec w;
  w.kind = "trace";
  w.trace_path = (dir / "trace.jsonl").string();
  w.trace_block_size = 16;
  BenchConfig c = config_for(w);
  c.run.mode = "rate";
  c.run.request_rate = 1;  // sessions with timestamps arrive at them instead
  const Json b = run_benchmark(c);
  expect_complete(b, w);
  write_bundle(b, dir / "a.json");
  EXPECT_EQ(read_bundle(dir / "a.json"), b);
  // A compare of the run with itself writes a report and flags nothing.
  const CompareResult r = compare_bundles({{"a", dir / "a.json", b}, {"b", dir / "a.json", b}}, CompareOptions{},
                                          dir / "cmp");
  EXPECT_EQ(r.regressions, 0);
  EXPECT_TRUE(fs::exists(dir / "cmp" / "report.md"));
  fs::remove_all(dir);
}

TEST(ServeWorkloads, TimeLimitStopsStartingRequests) {
  REQUIRE_SERVER();
  WorkloadSpec w;
  w.kind = "agentic";
  w.num_sessions = 2;
  w.first_turn = {32, 0};
  w.turn_increment = {8, 0};
  w.agent_output = {4, 0};
  w.turns_min = w.turns_max = 5;
  w.pause_mean_s = 0.4;  // 4 pauses of >= 0.2 s: more than the limit
  BenchConfig c = config_for(w);
  c.run.concurrency = 2;
  c.run.max_duration_s = 0.5;
  c.run.warmup_requests = 0;
  // A turn starts only after the pauses planned before it, so the ones whose summed pauses pass
  // the limit cannot start, however fast the server is (a planned bound, not a timing one).
  std::map<std::pair<int64_t, int64_t>, bool> startable;  // (session, turn) -> may start in the limit
  int64_t can_start = 0;
  for (const Session& s : build_workload(w)) {
    double planned = 0;
    for (size_t t = 0; t < s.turns.size(); ++t) {
      planned += s.turns[t].delay_before_s;
      startable[{s.id, static_cast<int64_t>(t)}] = planned <= c.run.max_duration_s;
      can_start += planned <= c.run.max_duration_s;
    }
  }
  ASSERT_LT(can_start, 10);  // the limit really cuts the run
  const Json b = run_benchmark(c);
  EXPECT_TRUE(b["summary"]["hit_time_limit"].get<bool>());
  const int64_t n = b["summary"]["completed"].get<int64_t>();
  EXPECT_GE(n, 2);  // the first turns start at once, and a started request is never cut
  EXPECT_LE(n, can_start);
  for (const RequestSample& s : bundle_samples(b))
    EXPECT_TRUE((startable[{s.session, s.turn}]))
        << "session " << s.session << " turn " << s.turn << " started after the limit";
  EXPECT_EQ(b["summary"]["failed"].get<int64_t>(), 0);
}

TEST(ServeWorkloads, UnreachableServerIsAClearError) {
  BenchConfig c;
  c.endpoint.port = 1;  // nothing listens on port 1
  c.run.warmup_requests = 0;
  try {
    run_benchmark(c);
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GET http://127.0.0.1:1/v1/models failed"), std::string::npos) << e.what();
  }
}

TEST(ServeWorkloads, BenchServeAndBenchCompareCommands) {
  REQUIRE_SERVER();
  const fs::path dir = server().dir / "cli";
  fs::create_directories(dir);
  const std::string port = std::to_string(server().port), model = (server().dir / "k3-tiny").string();
  for (const char* name : {"a", "b"}) {
    const fs::path log = dir / (std::string(name) + ".log");
    ASSERT_EQ(run_program({bench_bin(),
                           "bench-serve",
                           "--port",
                           port,
                           "--model-dir",
                           model,
                           "--workload",
                           "agentic",
                           "--num-sessions",
                           "2",
                           "--first-turn-len",
                           "64",
                           "--turn-increment",
                           "16",
                           "--agent-output-len",
                           "4",
                           "--turns",
                           "2:2",
                           "--pause",
                           "0.01",
                           "--concurrency",
                           "2",
                           "--goodput",
                           "ttft:60000",
                           "tpot:60000",
                           "--label",
                           name,
                           "--engine-config",
                           "{\"max_model_len\": 512}",
                           "--out",
                           (dir / (std::string(name) + ".json")).string()},
                          log),
              0)
        << read_file(log);
    EXPECT_NE(read_file(log).find("Request goodput (req/s):"), std::string::npos) << read_file(log);
    const Json b = read_bundle(dir / (std::string(name) + ".json"));
    EXPECT_EQ(b["summary"]["completed"].get<int64_t>(), 4);
    EXPECT_EQ(b["summary"]["good_requests"].get<int64_t>(), within_slos(b, 60000, 60000));
    EXPECT_EQ(b["engine_config"]["max_model_len"], 512);
    EXPECT_EQ(b["slos"]["ttft"], 60000.0);
    EXPECT_EQ(b["workload"]["token_high"], 1024 - 256);  // from the model's vocab_size
  }
  const fs::path log = dir / "compare.log";
  EXPECT_EQ(run_program({bench_bin(), "bench-compare", (dir / "a.json").string(), (dir / "b.json").string(), "--out",
                         (dir / "report").string(), "--resamples", "200"},
                        log),
            0)
      << read_file(log);
  EXPECT_NE(read_file(log).find("| b | ttft_ms.mean |"), std::string::npos) << read_file(log);
  EXPECT_TRUE(fs::exists(dir / "report" / "cdf_ttft_ms.svg"));
  // Bad input is a clear error (exit 2) naming the option.
  EXPECT_EQ(run_program({bench_bin(), "bench-serve", "--port", port, "--workload", "chat"}, log), 2);
  EXPECT_NE(read_file(log).find("kind must be random, shared_prefix, agentic or trace, got 'chat'"), std::string::npos)
      << read_file(log);
  EXPECT_EQ(run_program({bench_bin(), "bench-compare", (dir / "missing.json").string()}, log), 2);
  EXPECT_NE(read_file(log).find("cannot read the bundle"), std::string::npos) << read_file(log);
}

// `k3serve bench-serve` runs the k3serve-bench program beside k3serve; a k3serve without it (the
// server-only build of scripts/setup.sh) says which target to build instead of failing obscurely.
TEST(ServeWorkloads, BenchCommandsWithoutTheBenchProgramNameTheTarget) {
  if (!fs::exists(k3serve_bin())) GTEST_SKIP() << "no k3serve at " << k3serve_bin();
  const fs::path dir = fs::temp_directory_path() / ("k3-bench-missing-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(k3serve_bin(), dir / "k3serve");
  const fs::path log = dir / "run.log";
  for (const char* command : {"bench-serve", "bench-compare"}) {
    EXPECT_EQ(run_program({(dir / "k3serve").string(), command, "--help"}, log), 2) << read_file(log);
    EXPECT_NE(read_file(log).find(std::string(command) + " is in the k3serve-bench program"), std::string::npos)
        << read_file(log);
    EXPECT_NE(read_file(log).find("--target k3serve-bench"), std::string::npos) << read_file(log);
  }
  // Beside its k3serve-bench, the same k3serve runs the command.
  EXPECT_EQ(run_program({k3serve_bin(), "bench-compare", "--help"}, log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("--fail-on-regression"), std::string::npos) << read_file(log);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace k3::loadgen
