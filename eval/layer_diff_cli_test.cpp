// eval/layer_diff_cli_test.cpp: the JSON bundle's round trip and fields, `layer-diff` driven in
// process (options, errors, --check, --out) and as a program (exit codes), and the GPU sides
// (skipped without a GPU).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "eval/layer_diff.h"
#include "eval/layer_diff_command.h"
#include "eval/test_util.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

namespace k3::eval {
namespace {

namespace fs = std::filesystem;
using testing_util::TinyModel;

LayerDiffReport fp32_vs_bf16(int64_t steps) {
  const SideSpec a = parse_side("precision=fp32"), b = parse_side("precision=bf16");
  const auto ra = open_side(TinyModel::dir(), a), rb = open_side(TinyModel::dir(), b);
  LayerDiffConfig c;
  c.prompt = {5, 9, 1000};
  c.decode_steps = steps;
  return run_layer_diff(*ra, a, *rb, b, c);
}

TEST(LayerDiffJson, RoundTripsWithEveryField) {
  LayerDiffReport r = fp32_vs_bf16(3);
  r.model = "k3-tiny seed 0 (test)";
  r.environment = {{"git_sha", "0123abc"}, {"git_dirty", true}};
  const nlohmann::json j = nlohmann::json::parse(to_json(r).dump(2));
  for (const char* key : {"tool", "mode", "environment", "model", "sides", "config", "summary", "layers", "steps",
                          "rows", "only_in_a", "only_in_b", "tokens_a", "tokens_b"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["tool"], "layer_diff");
  EXPECT_EQ(j["environment"]["git_sha"], "0123abc");
  EXPECT_EQ(j["model"]["config_hash"], r.config_hash);
  EXPECT_EQ(j["sides"]["a"], "device=cpu,precision=fp32,decode_backend=auto,kv_cache=bf16,kda_prefill=chunked");
  EXPECT_EQ(j["rows"].size(), r.rows.size());
  EXPECT_EQ(j["steps"].size(), 4u);
  EXPECT_EQ(j["config"]["prompt"], nlohmann::json({5, 9, 1000}));
  EXPECT_EQ(j["config"]["prefill_chunk"], 0);
  EXPECT_TRUE(j["summary"].contains("top1_agreement"));
  EXPECT_TRUE(j["summary"].contains("first_below_threshold"));
  const LayerDiffReport back = report_from_json(j);
  EXPECT_EQ(back, r);
  // Spot checks on the parsed values (operator== compares the bundles).
  ASSERT_EQ(back.rows.size(), r.rows.size());
  EXPECT_EQ(back.rows.back().name, r.rows.back().name);
  EXPECT_EQ(back.rows.back().stats.cosine, r.rows.back().stats.cosine);  // exact: 17 digits in JSON
  EXPECT_EQ(back.layers.size(), r.layers.size());
  EXPECT_EQ(back.steps.back().greedy_b, r.steps.back().greedy_b);
}

TEST(LayerDiffJson, NonFiniteValuesRoundTrip) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  LayerDiffReport r;
  r.mode = "teacher_forced";
  r.config.prompt = {1};
  r.rows.push_back({0, "kda.o", 2, {nan, inf, -inf, 17}});
  r.layers.push_back({"kda.o", 2, 1, nan, nan, inf, inf, -inf, -inf});
  r.min_cosine = nan;
  r.any_below = true;
  r.first_below_name = "kda.o";
  r.first_below_layer = 2;
  r.first_below_cosine = nan;
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["rows"][0]["cosine"], "nan");
  EXPECT_EQ(j["rows"][0]["rel_l2"], "inf");
  const LayerDiffReport back = report_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_TRUE(std::isnan(back.rows[0].stats.cosine));
  EXPECT_EQ(back.rows[0].stats.rel_l2, inf);
  EXPECT_EQ(back.rows[0].stats.max_abs, -inf);
  EXPECT_TRUE(std::isnan(back.first_below_cosine));
  EXPECT_EQ(back.first_below_layer, 2);
  EXPECT_EQ(back, r);
}

TEST(LayerDiffJson, MissingOrMistypedFieldsAreNamed) {
  const nlohmann::json good = to_json(fp32_vs_bf16(1));
  auto expect_error = [](const nlohmann::json& j, const char* fragment) {
    try {
      report_from_json(j);
      ADD_FAILURE() << "accepted a bundle without/with a bad " << fragment;
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  nlohmann::json j = good;
  j.erase("summary");
  expect_error(j, "'summary'");
  j = good;
  j["config"]["decode_steps"] = "many";
  expect_error(j, "config.decode_steps");
  j = good;
  j["rows"][0].erase("max_abs");
  expect_error(j, "'max_abs'");
  j = good;
  j["mode"] = "sideways";
  expect_error(j, "mode must be");
}

// Runs the command in process; returns its exit code and leaves its stdout in `out`.
int run_command(std::vector<std::string> args, std::string* out = nullptr) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  int rc = -1;
  try {
    rc = eval::layer_diff_command(argv);
  } catch (...) {
    const std::string ignored = ::testing::internal::GetCapturedStdout();
    throw;
  }
  const std::string text = ::testing::internal::GetCapturedStdout();
  if (out) *out = text;
  return rc;
}

std::string error_of(std::vector<std::string> args) {
  try {
    run_command(std::move(args));
  } catch (const core::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LayerDiffCli, RunsEndToEndAndWritesTheBundle) {
  const fs::path json = fs::temp_directory_path() / ("k3_layer_diff_" + std::to_string(::getpid()) + ".json");
  std::string out;
  ASSERT_EQ(run_command({"--config", "k3-tiny", "--seed", "3", "--a", "precision=fp32", "--b", "precision=bf16",
                         "--steps", "3", "--prompt-len", "4", "--out", json.string()},
                        &out),
            0);
  EXPECT_NE(out.find("logits"), std::string::npos) << out;
  EXPECT_NE(out.find("summary: top-1 agreement"), std::string::npos) << out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  fs::remove(json);
  EXPECT_TRUE(j["environment"].contains("git_sha"));
  EXPECT_EQ(j["model"]["source"], "k3-tiny seed 3 init realistic (temporary)");
  EXPECT_EQ(j["config"]["prompt"].size(), 4u);
  EXPECT_EQ(j["steps"].size(), 4u);
  EXPECT_FALSE(j["rows"].empty());
  EXPECT_EQ(report_from_json(j).side_b, parse_side("precision=bf16").text());
}

TEST(LayerDiffCli, CheckPassesAndFails) {
  std::string out;
  EXPECT_EQ(run_command({"--model", TinyModel::dir().string(), "--a", "precision=bf16", "--b", "precision=bf16",
                         "--steps", "2", "--check"},
                        &out),
            0);
  EXPECT_NE(out.find("check: PASS"), std::string::npos) << out;
  EXPECT_EQ(run_command({"--model", TinyModel::dir().string(), "--a", "precision=fp32", "--b", "precision=bf16",
                         "--steps", "2", "--threshold", "1", "--check"},
                        &out),
            1);
  EXPECT_NE(out.find("check: FAIL"), std::string::npos) << out;
  EXPECT_NE(out.find("< threshold"), std::string::npos) << out;
  EXPECT_EQ(run_command({"--model", TinyModel::dir().string(), "--a", "precision=fp32", "--b", "precision=fp32",
                         "--steps", "5", "--free-run", "--check", "--token-ids", "1,2,3"},
                        &out),
            0);
  EXPECT_NE(out.find("identical (5 of 5 tokens)"), std::string::npos) << out;
}

TEST(LayerDiffCli, BadInputIsAnErrorNamingIt) {
  const std::string model = TinyModel::dir().string();
  auto has = [](const std::string& text, const char* fragment) {
    return text.find(fragment) != std::string::npos
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "'" << fragment << "' not in: " << text;
  };
  EXPECT_TRUE(has(error_of({"--a", "device=cpu", "--b", "device=cpu", "--bogus", "1"}), "unknown option --bogus"));
  EXPECT_TRUE(has(error_of({"--a", "device=cpu", "--b", "device=tpu"}), "--b: side spec 'device=tpu': device must be"));
  EXPECT_TRUE(has(error_of({"--a", "speed=max", "--b", "device=cpu"}), "--a: side spec 'speed=max': unknown key"));
  EXPECT_TRUE(has(error_of({"--a", "device=cpu"}), "--b is required"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--model", model, "--config", "k3-tiny"}), "--model or --config"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--model", model, "--steps", "-1"}), "--steps must be >= 0"));
  EXPECT_TRUE(
      has(error_of({"--a", "", "--b", "", "--model", model, "--threshold", "1.5"}), "--threshold must be <= 1"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--model", model, "--token-ids", "1,x"}), "--token-ids expects"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--model", model, "--token-ids", "1", "--prompt-len", "3"}),
                  "--token-ids or --prompt-len"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--model", "/nonexistent/k3"}), "/nonexistent/k3"));
  EXPECT_TRUE(has(error_of({"--a", "", "--b", "", "--config", "k3-nope"}), "k3-nope"));
  std::string help;
  EXPECT_EQ(run_command({"--help"}, &help), 0);
  EXPECT_NE(help.find("--free-run"), std::string::npos) << help;
}

// Exit status of a shell command line (-1 when it did not exit normally).
int exit_status(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(LayerDiffCli, ProgramExitsTwoOnBadInput) {
  const fs::path program = testing_util::build_dir() / "k3eval_layer_diff";
  if (!fs::exists(program)) GTEST_SKIP() << "k3eval_layer_diff is not built in " << testing_util::build_dir();
  EXPECT_EQ(exit_status(program.string() + " --a device=cpu --b device=tpu"), 2);
  EXPECT_EQ(exit_status(program.string() + " --a device=cpu --b device=cpu --no-such-option"), 2);
  EXPECT_EQ(exit_status(program.string() + " --model " + TinyModel::dir().string() +
                        " --a precision=fp32 --b precision=fp32 --steps 2 --check"),
            0);
}

// The GPU sides on the tiny model. Past the first MoE router a near-tie can flip one routed expert
// of a single-row step (see layer_diff_test.cpp), so per-layer cosines are asserted up to the first
// "moe.latent" and greedy tokens over the whole model:
//   * CPU oracle vs the CUDA standard path in fp32: greedy tokens agree, early layers > 0.9999;
//   * the two decode paths on the GPU in fp32: 32 free-running greedy tokens identical (issue 6:
//     "greedy generations identical between the two paths in fp32 mode");
//   * the two decode paths in bf16: early layers >= 0.999, top-1 agreement >= 90%.
std::string no_gpu_reason() {
#ifdef K3_HAVE_CUDA
  std::string why;
  return backends::cuda::device_count(&why) > 0 ? "" : "no usable CUDA device: " + why;
#else
  return "this build has no CUDA backend";
#endif
}

void expect_close_before_router(const LayerDiffReport& r, double min_cosine) {
  for (const LayerSummary& l : r.layers) {
    if (l.name == "moe.latent") break;
    EXPECT_GE(l.cosine_worst, min_cosine) << l.name << " layer " << l.layer << "\n" << format_table(r);
  }
}

TEST(LayerDiffGpu, CudaAgreesWithCpuAndDecodePathsAgree) {
  if (const std::string why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << "GPU test skipped: " << why;
  LayerDiffConfig c;
  c.prompt = {3, 17, 54, 97, 1};
  c.decode_steps = 16;
  const SideSpec cpu = parse_side("device=cpu,precision=fp32"), gpu = parse_side("device=cuda,precision=fp32");
  const auto rc = open_side(TinyModel::dir(), cpu), rg = open_side(TinyModel::dir(), gpu);
  const LayerDiffReport r = run_layer_diff(*rc, cpu, *rg, gpu, c);
  EXPECT_EQ(r.top1_agreement, 1) << format_table(r);
  EXPECT_FALSE(r.layers.empty());
  expect_close_before_router(r, 0.9999);

  const SideSpec fast32 = parse_side("device=cuda,precision=fp32,decode_backend=latency_specialized");
  const auto rf32 = open_side(TinyModel::dir(), fast32);
  LayerDiffConfig f = c;
  f.free_run = true;
  f.decode_steps = 32;
  const LayerDiffReport fr = run_layer_diff(*rg, gpu, *rf32, fast32, f);
  EXPECT_EQ(fr.first_divergence, -1) << format_table(fr);

  const SideSpec standard = parse_side("device=cuda,precision=bf16"),
                 fast = parse_side("device=cuda,precision=bf16,decode_backend=latency_specialized");
  const auto rs = open_side(TinyModel::dir(), standard), rf = open_side(TinyModel::dir(), fast);
  const LayerDiffReport p = run_layer_diff(*rs, standard, *rf, fast, c);
  EXPECT_GE(p.top1_agreement, 0.9) << format_table(p);
  expect_close_before_router(p, 0.999);
}

}  // namespace
}  // namespace k3::eval
