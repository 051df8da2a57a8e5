// bench/decode_sweep_test.cpp: k3bench_decode_gpu as CI runs it (CPU reference ops, k3-tiny): the
// sweep's bundle holds every (ctx, batch, backend, mode) row with its path counts, the rows start
// from the same context and the command line refuses bad lists.
#include "bench/decode_sweep.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::bench {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A scratch folder of this process, removed with the object.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("k3_decode_sweep_test_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

struct BenchRun {
  int rc = -1;
  std::string out, err;
};

// Runs k3bench_decode_gpu with `args` (shell words), capturing stdout and stderr.
BenchRun run_bench(const TempDir& dir, const std::string& args) {
  const fs::path out = dir.path / "stdout.txt", err = dir.path / "stderr.txt";
  const std::string cmd = std::string("'") + K3BENCH_DECODE_GPU + "' " + args + " > '" + out.string() + "' 2> '" +
                          err.string() + "'";
  const int status = std::system(cmd.c_str());
  BenchRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

TEST(DecodeSweepCli, RefusesBadListsNamingTheFlag) {
  const TempDir dir;
  const std::string m = "--model '" + (dir.path / "none").string() + "' --device cpu ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--ctx 16,0", "--ctx"},
      {"--ctx 16,x", "'x'"},
      {"--ctx 16,16", "twice"},
      {"--decode-backend auto,fast", "'fast' is not one of: auto, latency_specialized"},
      {"--decode-backend auto,auto", "twice"},
      {"--modes eager,prefill", "'prefill'"},
      {"--batches 1,0", "--batches"},
      {"--steps 0", "--steps"},
      {"--seed -3", "--seed"},
      {"--frobnicate", "unknown option --frobnicate"},
      {"", "no checkpoint in"},  // parsed fine; nothing to open without --make
  };
  for (const auto& [args, needle] : cases) {
    const BenchRun r = run_bench(dir, m + args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  }
  const BenchRun help = run_bench(dir, "--help");
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.out.find("--decode-backend auto[,latency_specialized]"), std::string::npos) << help.out;
}

// The sweep CI runs: k3-tiny written by --make, ctx 16,40 x batches 1,3 x both backends x eager,
// graph, verify, verify-graph; 1 warm-up + 3 timed steps per row. Then the one-backend call of gpu_check.sh's
// fastpath phase on the same checkpoint.
TEST(DecodeSweepCli, TinySweepOnCpuHasEveryRowWithItsPath) {
  const TempDir dir;
  const fs::path model = dir.path / "k3-tiny", bundle_path = dir.path / "sweep.json";
  const BenchRun r = run_bench(
      dir,
      "--model '" + model.string() +
          "' --make --config k3-tiny --device cpu --ctx 16,40 --batches 3,1 "
          "--decode-backend auto,latency_specialized --steps 3 --warmup 1 --modes verify-graph,verify,graph,eager --out '" +
          bundle_path.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const nlohmann::json b = nlohmann::json::parse(read_text(bundle_path));
  const nlohmann::json& c = b["config"];
  EXPECT_EQ(c["name"], "k3-tiny");
  EXPECT_EQ(c["tp"], 1);
  EXPECT_EQ(c["ctx_tokens"], 16);  // the first ctx
  EXPECT_EQ(c["steps"], 3);
  EXPECT_GT(c["weight_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(c["sweep"]["ctx_tokens"], nlohmann::json({16, 40}));
  EXPECT_EQ(c["sweep"]["batches"], nlohmann::json({1, 3}));
  EXPECT_EQ(c["sweep"]["decode_backends"], nlohmann::json({"auto", "latency_specialized"}));
  EXPECT_EQ(c["sweep"]["modes"], nlohmann::json({"eager", "graph", "verify", "verify-graph"}));
  EXPECT_GT(b["checkpoint_write_seconds"].get<double>(), 0);
  EXPECT_GT(b["load_seconds"].get<double>(), 0);
  EXPECT_GT(b["copy_GBps"].get<double>(), 0);

  // Every row, in sweep order: ctx, then batch, then backend, then mode.
  const std::vector<std::string> backends = {"auto", "latency_specialized"},
                                 modes = {"eager", "graph", "verify", "verify-graph"};
  const nlohmann::json& rows = b["rows"];
  ASSERT_EQ(rows.size(), 2u * 2u * 2u * 4u);
  constexpr int64_t kStepsPerRow = 1 + 3;
  std::map<std::tuple<int64_t, int64_t, std::string, std::string>, nlohmann::json> by_key;
  size_t i = 0;
  int64_t fused_total = 0, standard_total = 0;
  for (const int64_t ctx : {16, 40})
    for (const int64_t batch : {1, 3})
      for (const std::string& backend : backends)
        for (const std::string& mode : modes) {
          const nlohmann::json& row = rows[i++];
          const std::string where = "row " + std::to_string(i - 1) + " " + row.dump().substr(0, 200);
          ASSERT_EQ(row["ctx_tokens"], ctx) << where;
          ASSERT_EQ(row["batch"], batch) << where;
          ASSERT_EQ(row["decode_backend"], backend) << where;
          ASSERT_EQ(row["mode"], mode) << where;
          EXPECT_GT(row["tokens_per_s"].get<double>(), 0) << where;
          EXPECT_GT(row["median_ms"].get<double>(), 0) << where;
          EXPECT_LE(row["p10_ms"].get<double>(), row["p90_ms"].get<double>()) << where;
          EXPECT_EQ(row["samples_ms"].size(), 3u) << where;
          EXPECT_TRUE(row["logits_finite"].get<bool>()) << where;
          EXPECT_GT(row["bytes"]["total"].get<double>(), 0) << where;
          EXPECT_GT(row["GBps"].get<double>(), 0) << where;
          EXPECT_GT(row["ratio_to_copy_floor"].get<double>(), 0) << where;
          EXPECT_EQ(row["tokens_per_step_per_seq"], mode.starts_with("verify") ? 6 : 1) << where;
          EXPECT_EQ(row["kernels_per_step"], 0) << where;  // the CPU captures nothing
          // The path of every step of the row (warm-up included): the fused path serves all of
          // these pure-decode steps (1..24 rows); auto never runs it.
          const nlohmann::json& p = row["decode_path"];
          if (backend == "auto") {
            EXPECT_EQ(p["fused_steps"], 0) << where;
            EXPECT_EQ(p["standard_steps"], kStepsPerRow) << where;
            EXPECT_FALSE(row.contains("speedup_vs_auto")) << where;
          } else {
            EXPECT_EQ(p["fused_steps"], kStepsPerRow) << where;
            EXPECT_EQ(p["standard_steps"], 0) << where;
            ASSERT_TRUE(row.contains("speedup_vs_auto")) << where;
            EXPECT_GT(row["speedup_vs_auto"].get<double>(), 0) << where;
          }
          EXPECT_TRUE(p["fallbacks"].empty()) << where;
          fused_total += p["fused_steps"].get<int64_t>();
          standard_total += p["standard_steps"].get<int64_t>();
          ASSERT_EQ(row["final_tokens"].size(), static_cast<size_t>(batch)) << where;
          for (const nlohmann::json& t : row["final_tokens"]) {
            EXPECT_GE(t.get<int64_t>(), 0) << where;
            EXPECT_LT(t.get<int64_t>(), c["model"]["vocab_size"].get<int64_t>()) << where;
          }
          by_key[{ctx, batch, backend, mode}] = row;
        }
  for (const int64_t batch : {1, 3})
    for (const std::string& backend : backends)
      for (const std::string& mode : modes) {
        // The latent cache read grows with ctx; nothing else does.
        const nlohmann::json &a = by_key[{16, batch, backend, mode}]["bytes"],
                             &z = by_key[{40, batch, backend, mode}]["bytes"];
        EXPECT_GT(z["mla_kv_read_write"].get<double>(), a["mla_kv_read_write"].get<double>());
        EXPECT_EQ(z["weights_non_expert_incl_lm_head"], a["weights_non_expert_incl_lm_head"]);
        EXPECT_EQ(z["kda_state_rw"], a["kda_state_rw"]);
      }
  for (const int64_t ctx : {16, 40})
    for (const int64_t batch : {1, 3})
      for (const std::string& backend : backends) {
        // Rows start from the same context (KDA slots restored, num_tokens = ctx, the same first
        // tokens): on the CPU a graph step is the eager step, so their greedy tokens agree.
        const nlohmann::json& eager = by_key[{ctx, batch, backend, "eager"}]["final_tokens"];
        const nlohmann::json& graph = by_key[{ctx, batch, backend, "graph"}]["final_tokens"];
        EXPECT_EQ(eager, graph) << "ctx " << ctx << " batch " << batch << " " << backend;
        // Likewise a verify step through DecodeGraphs (captured on a GPU) is the eager verify step.
        const nlohmann::json& verify = by_key[{ctx, batch, backend, "verify"}]["final_tokens"];
        const nlohmann::json& verify_graph = by_key[{ctx, batch, backend, "verify-graph"}]["final_tokens"];
        EXPECT_EQ(verify, verify_graph) << "ctx " << ctx << " batch " << batch << " " << backend;
      }

  // Whole-run counters per backend; decode_path keeps the first backend's (the pre-sweep field).
  ASSERT_EQ(b["decode_paths"].size(), 2u);
  EXPECT_EQ(b["decode_paths"][0]["decode_backend"], "auto");
  EXPECT_EQ(b["decode_paths"][0]["fused_steps"], 0);
  EXPECT_EQ(b["decode_paths"][1]["decode_backend"], "latency_specialized");
  EXPECT_EQ(b["decode_paths"][1]["fused_steps"], fused_total);
  EXPECT_EQ(b["decode_paths"][0]["standard_steps"].get<int64_t>() +
                b["decode_paths"][1]["standard_steps"].get<int64_t>(),
            standard_total);
  EXPECT_EQ(b["decode_path"], b["decode_paths"][0]);
  EXPECT_NE(
      r.out.find("decode_backend latency_specialized: " + std::to_string(fused_total) + " steps fused, 0 standard"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("x_auto"), std::string::npos) << r.out;
  // The backends' greedy trajectories: on the CPU the fused path equals the standard one bit for
  // bit, so every (ctx, batch, eager|graph) pair agrees on every token of every step.
  ASSERT_EQ(b["backend_agreement"].size(), 2u * 2u * 2u);
  for (const nlohmann::json& a : b["backend_agreement"]) {
    EXPECT_EQ(a["tokens"], kStepsPerRow * a["batch"].get<int64_t>()) << a.dump();
    EXPECT_TRUE(a["identical"].get<bool>()) << a.dump();
    EXPECT_EQ(a["first_different_step"], -1) << a.dump();
  }
  EXPECT_EQ(c["precision"], "bf16");

  // gpu_check.sh's fastpath call shape (one backend, on an existing checkpoint): no --make needed.
  const fs::path one_path = dir.path / "one.json";
  const BenchRun one = run_bench(dir, "--model '" + model.string() +
                                          "' --device cpu --decode-backend latency_specialized --ctx 24 "
                                          "--batches 2 --steps 1 --warmup 1 --out '" +
                                          one_path.string() + "'");
  ASSERT_EQ(one.rc, 0) << one.out << one.err;
  const nlohmann::json o = nlohmann::json::parse(read_text(one_path));
  EXPECT_EQ(o["checkpoint_write_seconds"], 0);
  EXPECT_EQ(o["config"]["ctx_tokens"], 24);
  ASSERT_EQ(o["rows"].size(), 2u);  // eager, graph (the default modes)
  for (const nlohmann::json& row : o["rows"]) {
    EXPECT_EQ(row["decode_backend"], "latency_specialized");
    EXPECT_EQ(row["decode_path"]["fused_steps"], 2);
    EXPECT_FALSE(row.contains("speedup_vs_auto"));  // no auto twin
  }
  EXPECT_EQ(o["decode_path"]["decode_backend"], "latency_specialized");
  EXPECT_EQ(o["decode_path"]["fused_steps"], 4);

  // --precision fp32 reaches the model (the bundle says so); a bad value is refused by name.
  const fs::path fp32_path = dir.path / "fp32.json";
  const BenchRun f = run_bench(dir, "--model '" + model.string() +
                                        "' --device cpu --precision fp32 --ctx 24 --batches 1 "
                                        "--steps 1 --warmup 1 --modes eager --out '" +
                                        fp32_path.string() + "'");
  ASSERT_EQ(f.rc, 0) << f.out << f.err;
  EXPECT_EQ(nlohmann::json::parse(read_text(fp32_path))["config"]["precision"], "fp32");
  const BenchRun bad = run_bench(dir, "--model '" + model.string() + "' --device cpu --precision fp16");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--precision must be bf16 or fp32, got 'fp16'"), std::string::npos) << bad.err;
}

TEST(DecodeSweepCli, ProfileTimesEveryOpOfAnEagerStep) {
  const TempDir dir;
  const fs::path model = dir.path / "k3-tiny", bundle_path = dir.path / "sweep.json";
  const BenchRun r = run_bench(
      dir, "--model '" + model.string() +
               "' --make --config k3-tiny --device cpu --ctx 16 --batches 2 "
               "--decode-backend auto,latency_specialized --steps 2 --warmup 1 --modes eager,graph --profile --out '" +
               bundle_path.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("profile (one eager step"), std::string::npos) << r.out;
  const nlohmann::json b = nlohmann::json::parse(read_text(bundle_path));
  const int64_t layers = b["config"]["model"]["num_hidden_layers"].get<int64_t>();
  ASSERT_EQ(b["rows"].size(), 4u);
  for (const nlohmann::json& row : b["rows"]) {
    const std::string where = row["decode_backend"].get<std::string>() + " " + row["mode"].get<std::string>();
    if (row["mode"] == "graph") {
      EXPECT_FALSE(row.contains("profile")) << where;  // replays cannot be timed per op
      continue;
    }
    ASSERT_TRUE(row.contains("profile")) << where;
    const nlohmann::json& p = row["profile"];
    EXPECT_EQ(p["num_layers"], layers) << where;
    const double step = p["step_ms"].get<double>(), top = p["top_level_ops_ms"].get<double>();
    EXPECT_GT(top, 0) << where;
    EXPECT_LE(top, step * 1.0001 + 1e-6) << where;  // top-level calls do not overlap
    double sum = 0;
    std::map<std::string, int64_t> calls;
    for (const nlohmann::json& op : p["ops"]) {
      EXPECT_GE(op["total_us"].get<double>(), 0) << where;
      EXPECT_GT(op["calls"].get<int64_t>(), 0) << where;
      EXPECT_NEAR(op["us_per_layer"].get<double>() * layers, op["total_us"].get<double>(), 1e-6) << where;
      if (!op["nested"].get<bool>()) sum += op["total_us"].get<double>();
      calls[op["op"].get<std::string>()] += op["calls"].get<int64_t>();
    }
    EXPECT_NEAR(sum / 1e3, top, 1e-6 + 1e-9 * top) << where;
    // Every step embeds the tokens and projects the final norm to logits once; the two paths differ
    // in which attention ops they call.
    EXPECT_EQ(calls["embedding"], 1) << where;
    if (row["decode_backend"] == "auto") EXPECT_GT(calls["kda_recurrent"], 0) << where;
    else EXPECT_GT(calls["kda_decode"], 0) << where;
  }
  // Under --tp the profile is rank 0's step, the other ranks running theirs beside it: every op is
  // timed on rank 0's stream, and the time between its top-level ops holds the collectives.
  const BenchRun tp = run_bench(
      dir, "--model '" + model.string() +
               "' --device cpu --tp 2 --ctx 16 --batches 2 --steps 2 "
               "--warmup 1 --modes eager --decode-backend auto,latency_specialized --profile --out '" +
               (dir.path / "tp.json").string() + "'");
  ASSERT_EQ(tp.rc, 0) << tp.out << tp.err;
  EXPECT_NE(tp.out.find("; collectives)"), std::string::npos) << tp.out;
  const nlohmann::json t = nlohmann::json::parse(read_text(dir.path / "tp.json"));
  ASSERT_EQ(t["rows"].size(), 2u);
  for (const nlohmann::json& row : t["rows"]) {
    const std::string where = "tp 2 " + row["decode_backend"].get<std::string>();
    ASSERT_TRUE(row.contains("profile")) << where;
    const nlohmann::json& p = row["profile"];
    EXPECT_GT(p["top_level_ops_ms"].get<double>(), 0) << where;
    EXPECT_LE(p["top_level_ops_ms"].get<double>(), p["step_ms"].get<double>() * 1.0001 + 1e-6) << where;
    std::map<std::string, int64_t> calls;
    for (const nlohmann::json& op : p["ops"]) calls[op["op"].get<std::string>()] += op["calls"].get<int64_t>();
    EXPECT_EQ(calls["embedding"], 1) << where << ": rank 0's calls alone";
  }
}

// --dcp: the same sweep with each sequence's latent cache split over 2 CPU ranks runs every row
// (finite logits) while each rank reads half the latent cache; without --tp it is refused, naming the
// flag. (The synthetic contexts are random per rank, so the two runs' tokens are not comparable;
// runner/tp_dcp_test.cpp proves DCP computes what TP 1 computes.)
TEST(DecodeSweepCli, DcpRowsRunAndCountHalfTheCache) {
  const TempDir dir;
  const fs::path model = dir.path / "k3-tiny";
  const std::string common = "--model '" + model.string() +
                             "' --make --config k3-tiny --device cpu --tp 2 --ctx 40 --batches 1,3 "
                             "--steps 2 --warmup 1 --modes eager,verify --out '";
  const BenchRun plain = run_bench(dir, common + (dir.path / "tp.json").string() + "'");  // writes k3-tiny
  ASSERT_EQ(plain.rc, 0) << plain.out << plain.err;
  const BenchRun dcp = run_bench(dir, common + (dir.path / "dcp.json").string() + "' --dcp");
  ASSERT_EQ(dcp.rc, 0) << dcp.out << dcp.err;
  EXPECT_NE(dcp.out.find("decode context parallel"), std::string::npos) << dcp.out;
  const nlohmann::json a = nlohmann::json::parse(read_text(dir.path / "tp.json"));
  const nlohmann::json b = nlohmann::json::parse(read_text(dir.path / "dcp.json"));
  EXPECT_EQ(a["config"]["dcp"], 1);
  EXPECT_EQ(b["config"]["dcp"], 2);
  ASSERT_EQ(a["rows"].size(), 4u);
  ASSERT_EQ(b["rows"].size(), a["rows"].size());
  for (size_t i = 0; i < a["rows"].size(); ++i) {
    const nlohmann::json &ra = a["rows"][i], &rb = b["rows"][i];
    const std::string where = "row " + std::to_string(i) + " (" + ra["mode"].get<std::string>() + ", batch " +
                              std::to_string(ra["batch"].get<int64_t>()) + ")";
    EXPECT_EQ(ra["mode"], rb["mode"]) << where;
    EXPECT_EQ(ra["batch"], rb["batch"]) << where;
    EXPECT_TRUE(rb["logits_finite"].get<bool>()) << where;
    const double kv_a = ra["bytes"]["mla_kv_read_write"].get<double>(),
                 kv_b = rb["bytes"]["mla_kv_read_write"].get<double>();
    EXPECT_GT(kv_a, 0) << where;
    EXPECT_NEAR(kv_b, kv_a / 2, 1e-6 * kv_a) << where;
  }
  const BenchRun alone = run_bench(dir, "--model '" + model.string() + "' --device cpu --dcp --out '" +
                                            (dir.path / "alone.json").string() + "'");
  EXPECT_NE(alone.rc, 0);
  EXPECT_NE((alone.out + alone.err).find("--dcp"), std::string::npos) << alone.out << alone.err;
}

// --config also takes a config.json: the checkpoint --make writes has that file's shapes (here
// k3-tiny cut to 2 layers, as K3 cut to a few layers would be run at --tp 8), the bundle names it,
// and a missing file is refused before anything is written, naming the flag and the path.
TEST(DecodeSweepCli, ConfigFileGivesTheCheckpointItsShapes) {
  const TempDir dir;
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["num_hidden_layers"] = 2;
  j["linear_attn_config"]["kda_layers"] = {1};
  j["linear_attn_config"]["full_attn_layers"] = {2};
  const fs::path file = dir.path / "two_layers.json", model = dir.path / "two";
  std::ofstream(file) << j.dump(2);
  const BenchRun r = run_bench(
      dir, "--model '" + model.string() + "' --make --config '" + file.string() +
               "' --device cpu --tp 2 --ctx 16 --batches 1 --steps 1 --warmup 1 --modes eager --out '" +
               (dir.path / "two.json").string() + "'");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(config::load_config(model / "config.json").num_hidden_layers, 2);
  const nlohmann::json b = nlohmann::json::parse(read_text(dir.path / "two.json"));
  EXPECT_EQ(b["config"]["name"], file.string());
  EXPECT_EQ(b["config"]["model"]["num_hidden_layers"], 2);
  ASSERT_EQ(b["rows"].size(), 1u);
  EXPECT_TRUE(b["rows"][0]["logits_finite"].get<bool>());

  const fs::path missing = dir.path / "nowhere.json", unmade = dir.path / "unmade";
  const BenchRun bad = run_bench(dir, "--model '" + unmade.string() + "' --make --config '" + missing.string() +
                                          "' --device cpu");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--config '" + missing.string() + "'"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(unmade));
}

// bench/configs/k3-4layers.json is K3 (spec §1.1) with only its first 4 layers: a dense KDA layer,
// two KDA + MoE, one MLA + MoE at full widths, for per-layer decode at --tp 8 with real collectives.
TEST(DecodeSweepCli, TheFourLayerK3ConfigIsK3CutToFourLayers) {
  const config::K3Config got = config::load_config(fs::path(K3BENCH_CONFIGS) / "k3-4layers.json");
  ASSERT_EQ(got.num_hidden_layers, 4);
  EXPECT_EQ(got.ffn_kind(0), config::FfnKind::dense);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(got.attn_kind(l), config::AttnKind::kda) << "layer " << l;
  EXPECT_EQ(got.attn_kind(3), config::AttnKind::mla);
  EXPECT_EQ(got.ffn_kind(3), config::FfnKind::moe);
  nlohmann::json a = config::to_json(got), b = config::to_json(config::builtin_config("k3"));
  b["num_hidden_layers"] = 4;
  b["linear_attn_config"]["kda_layers"] = {1, 2, 3};
  b["linear_attn_config"]["full_attn_layers"] = {4};
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace k3::bench
