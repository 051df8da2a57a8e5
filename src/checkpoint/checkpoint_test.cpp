// checkpoint/checkpoint_test.cpp: write_random_checkpoint -> load_checkpoint round trips on
// k3-tiny and on another K3-family config (BF16 and MXFP4, single file and sharded), byte
// determinism, the init values of spec §14.1/§14.3, and the MXFP4 payload.
// The loader's error paths are in loader_errors_test.cpp.
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "core/fp4.h"

namespace k3::checkpoint {
namespace {

using namespace k3::checkpoint::testing;

struct RoundTripCase {
  bool other_config;  // false: k3-tiny; true: other_config() (6 layers, block 3, 8 experts top-2)
  bool mxfp4;
  bool sharded;
  InitStyle init;
};

class CheckpointRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(CheckpointRoundTrip, LoadsExactlyWhatWasWritten) {
  const RoundTripCase rc = GetParam();
  const config::K3Config cfg = rc.other_config ? other_config() : config::builtin_config("k3-tiny");
  WriteOptions opt;
  opt.seed = 1234;
  opt.mxfp4 = rc.mxfp4;
  opt.init = rc.init;
  opt.max_shard_bytes = rc.sharded ? 300 * 1024 : 0;
  TempDir dir;
  write_random_checkpoint(cfg, opt, dir.path());

  EXPECT_EQ(fs::exists(dir / kIndexFileName), rc.sharded);
  EXPECT_EQ(fs::exists(dir / kSingleFileName), !rc.sharded);
  if (rc.sharded) {
    int shards = 0;
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().extension() == ".safetensors") {
        ++shards;
        // A shard passes the limit only when it holds one tensor larger than the limit.
        const SafetensorsFile f = SafetensorsFile::open(e.path());
        int64_t bytes = 0;
        for (const TensorInfo& t : f.tensors()) bytes += t.end - t.begin;
        EXPECT_TRUE(bytes <= opt.max_shard_bytes || f.tensors().size() == 1) << e.path();
      }
    EXPECT_GT(shards, 2);
    EXPECT_TRUE(fs::exists(dir / shard_file_name(1, shards)));
  }
  expect_round_trip(dir.path(), cfg, opt);
}

INSTANTIATE_TEST_SUITE_P(Forms, CheckpointRoundTrip,
                         ::testing::Values(RoundTripCase{false, false, false, InitStyle::realistic},
                                           RoundTripCase{false, true, false, InitStyle::realistic},
                                           RoundTripCase{false, false, true, InitStyle::sensitive},
                                           RoundTripCase{false, true, true, InitStyle::realistic},
                                           RoundTripCase{true, false, false, InitStyle::realistic},
                                           RoundTripCase{true, true, true, InitStyle::sensitive}),
                         [](const auto& info) {
                           const RoundTripCase& c = info.param;
                           return std::string(c.other_config ? "Other" : "Tiny") + (c.mxfp4 ? "Mxfp4" : "Bf16") +
                                  (c.sharded ? "Sharded" : "Single") +
                                  (c.init == InitStyle::sensitive ? "Sensitive" : "Realistic");
                         });

TEST(Checkpoint, ConfigJsonIsToJsonAndStatesMxfp4) {
  TempDir dir;
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  WriteOptions opt;
  opt.mxfp4 = true;
  write_random_checkpoint(tiny, opt, dir.path());
  std::ifstream f(dir / "config.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  config::K3Config expect = tiny;
  expect.mxfp4.enabled = true;
  EXPECT_EQ(j, config::to_json(expect));
  const auto& q = j.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(q.at("format"), "mxfp4-pack-quantized");
  EXPECT_EQ(q.at("config_groups").at("group_0").at("weights").at("group_size"), 32);
  EXPECT_EQ(config::load_config(dir / "config.json").hash(), expect.hash());

  opt.mxfp4 = false;  // rewriting the same folder: the written form follows the options
  write_random_checkpoint(expect, opt, dir.path());
  EXPECT_FALSE(config::load_config(dir / "config.json").mxfp4.enabled);
}

std::map<std::string, std::vector<char>> all_files(const fs::path& dir) {
  std::map<std::string, std::vector<char>> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_bytes(e.path());
  return out;
}

TEST(Checkpoint, SameSeedSameBytesOtherSeedOtherBytes) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  TempDir a, b, c, d;
  WriteOptions opt;
  opt.seed = 99;
  opt.mxfp4 = true;
  opt.max_shard_bytes = 500 * 1024;
  write_random_checkpoint(tiny, opt, a.path());
  write_random_checkpoint(tiny, opt, b.path());
  const auto fa = all_files(a.path()), fb = all_files(b.path());
  EXPECT_GT(fa.size(), 3u);
  EXPECT_EQ(fa, fb);  // every shard, the index and config.json

  opt.seed = 100;
  write_random_checkpoint(tiny, opt, c.path());
  const auto fc = all_files(c.path());
  ASSERT_EQ(fc.size(), fa.size());
  EXPECT_EQ(fc.at("config.json"), fa.at("config.json"));
  EXPECT_EQ(fc.at(kIndexFileName), fa.at(kIndexFileName));  // same split: sizes do not depend on values
  for (const auto& [name, bytes] : fa)
    if (name.ends_with(".safetensors")) {
      EXPECT_NE(fc.at(name), bytes) << name;
    }

  // Values depend on the tensor's name only, not on the file split or what else is written.
  opt.seed = 99;
  opt.max_shard_bytes = 0;
  write_random_checkpoint(tiny, opt, d.path());
  const SafetensorsSet sharded = SafetensorsSet::open_dir(a.path()), single = SafetensorsSet::open_dir(d.path());
  ASSERT_EQ(sharded.entries().size(), single.entries().size());
  for (const auto& [name, e] : single.entries())
    EXPECT_TRUE(same_bytes(single.tensor(e), sharded.tensor(*sharded.find(name)))) << name;
  TempDir other;
  write_random_checkpoint(other_config_same_hidden(), opt, other.path());
  const SafetensorsSet o = SafetensorsSet::open_dir(other.path());
  EXPECT_TRUE(same_bytes(o.tensor(*o.find("model.norm.weight")), single.tensor(*single.find("model.norm.weight"))));
  EXPECT_TRUE(same_bytes(o.tensor(*o.find("model.layers.0.input_layernorm.weight")),
                         single.tensor(*single.find("model.layers.0.input_layernorm.weight"))));
}

TEST(Checkpoint, RewritingAFolderRemovesStaleShards) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  TempDir dir;
  WriteOptions opt;
  opt.max_shard_bytes = 200 * 1024;
  write_random_checkpoint(tiny, opt, dir.path());
  write_bytes(dir / "notes.txt", {'k', '3'});
  opt.max_shard_bytes = 0;
  write_random_checkpoint(tiny, opt, dir.path());
  EXPECT_FALSE(fs::exists(dir / kIndexFileName));
  EXPECT_FALSE(fs::exists(dir / shard_file_name(1, 2)));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));  // not a checkpoint file: left alone
  expect_round_trip(dir.path(), tiny, opt);
}

// Tensor statistics of the two inits (spec §14.1 and the documented §14.3 choices).
struct Stats {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
};
Stats stats_of(const core::Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = kernels::load_f32(t.view(), i);
  Stats s;
  for (float x : v) s.mean += x, s.min = std::min<double>(s.min, x), s.max = std::max<double>(s.max, x);
  s.mean /= static_cast<double>(v.size());
  for (float x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}
core::Tensor flat(const core::Tensor& t) {  // view of any tensor as rank 1 (same storage)
  core::TensorView v = core::TensorView::contiguous(t.data<void>(), t.dtype(), {t.numel()});
  return core::Tensor(v, std::shared_ptr<void>(std::shared_ptr<int>(), t.data<void>()));
}

TEST(Checkpoint, InitDistributions) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  for (InitStyle style : {InitStyle::realistic, InitStyle::sensitive}) {
    SCOPED_TRACE(style == InitStyle::realistic ? "realistic" : "sensitive");
    const bool sens = style == InitStyle::sensitive;
    TempDir dir;
    WriteOptions opt;
    opt.seed = 5;
    opt.init = style;
    write_random_checkpoint(tiny, opt, dir.path());
    const model::Weights w = load_checkpoint(dir.path()).weights;
    const auto& kda = std::get<model::KdaWeights>(w.layers[1].attn);
    const auto& moe = std::get<model::MoeWeights>(w.layers[1].ffn);
    auto near = [](double v, double target, double rel) { EXPECT_NEAR(v, target, rel * target); };
    // linears: N(0, 0.02^2), or gain/sqrt(fan_in) with gain 1 (8 for SiTU inputs)
    near(stats_of(flat(kda.q_proj.weight)).std, sens ? 1.0 / 16.0 : 0.02, 0.05);
    near(stats_of(flat(moe.shared_gate.weight)).std, sens ? 8.0 / 16.0 : 0.02, 0.05);
    near(stats_of(flat(moe.shared_down.weight)).std, sens ? 1.0 / std::sqrt(128.0) : 0.02, 0.05);
    near(stats_of(flat(w.embed)).std, sens ? 1.0 : 0.02, 0.05);
    // norms 1 + N(0, 0.01^2) / N(0, 0.1^2)
    const Stats norm = stats_of(w.layers[2].input_norm);
    EXPECT_NEAR(norm.mean, 1.0, sens ? 0.03 : 0.003);
    near(norm.std, sens ? 0.1 : 0.01, 0.2);
    EXPECT_EQ(kda.o_norm.dtype(), core::DType::f32);
    // pseudo-queries N(0, 0.02^2) / N(0, (3/sqrt(hidden))^2)
    near(stats_of(flat(w.layers[2].mlp_res.query)).std, sens ? 3.0 / 16.0 : 0.02, 0.2);
    // conv N(0, 0.25^2) / N(0, 0.5^2), F32
    near(stats_of(flat(kda.k_conv)).std, sens ? 0.5 : 0.25, 0.1);
    // router bias N(0, 0.01^2) / N(0, 0.1^2)
    near(stats_of(moe.router_bias).std, sens ? 0.1 : 0.01, 0.4);
    // dt_bias = softplus^-1(u), u in [0.001, 0.1]
    for (int64_t i = 0; i < kda.dt_bias.numel(); ++i) {
      const double u = std::log1p(std::exp(static_cast<double>(kda.dt_bias.data<float>()[i])));
      EXPECT_GE(u, 0.001 * 0.999);
      EXPECT_LE(u, 0.1 * 1.001);
    }
    // A_log: [head_dim], N(0, 0.3^2) on the first num_heads entries, zero beyond (spec §4 quirk)
    ASSERT_EQ(kda.a_log.shape(), core::Shape({32}));
    for (int64_t i = 0; i < 32; ++i) {
      const float v = kda.a_log.data<float>()[i];
      if (i < 4) {
        EXPECT_NE(v, 0.0f);
        EXPECT_LT(std::fabs(v), 1.5f);
      } else {
        EXPECT_EQ(v, 0.0f) << i;
      }
    }
  }
}

// MXFP4 experts quantize the very matrix a BF16 checkpoint of the same seed holds: each
// dequantized element is within one scale unit of it (E2M1 spacing <= 2 units, scale chosen
// so no element saturates), and the packed layout is what core/fp4.h decodes.
TEST(Checkpoint, Mxfp4ExpertsQuantizeTheBf16Experts) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  TempDir bdir, qdir;
  WriteOptions opt;
  opt.seed = 21;
  write_random_checkpoint(tiny, opt, bdir.path());
  opt.mxfp4 = true;
  write_random_checkpoint(tiny, opt, qdir.path());
  const model::Weights wb = load_checkpoint(bdir.path()).weights, wq = load_checkpoint(qdir.path()).weights;
  for (int layer : {1, 3}) {
    const auto& mb = std::get<model::MoeWeights>(wb.layers[layer].ffn);
    const auto& mq = std::get<model::MoeWeights>(wq.layers[layer].ffn);
    for (int e : {0, 9, 15}) {
      for (auto pick : {&model::MoeWeights::w1, &model::MoeWeights::w2, &model::MoeWeights::w3}) {
        const kernels::LinearWeight& b = (mb.*pick)[e];
        const kernels::LinearWeight& q = (mq.*pick)[e];
        ASSERT_FALSE(b.is_mxfp4());
        ASSERT_TRUE(q.is_mxfp4());
        ASSERT_EQ(q.in_features(), b.in_features());
        ASSERT_EQ(q.out_features(), b.out_features());
        const int64_t in = b.in_features();
        std::vector<float> rb(in), rq(in);
        int64_t differ = 0;
        for (int64_t r = 0; r < b.out_features(); ++r) {
          b.load_row(r, rb.data());
          q.load_row(r, rq.data());
          for (int64_t i = 0; i < in; ++i) {
            const float unit = core::e8m0_to_f32(q.scale.data<uint8_t>()[r * (in / 32) + i / 32]);
            ASSERT_LE(std::fabs(rq[i] - rb[i]), unit) << "row " << r << " col " << i;
            differ += rq[i] != rb[i];
          }
        }
        EXPECT_GT(differ, 0);
      }
    }
  }
}

TEST(Checkpoint, TiedEmbeddingsShareTheTable) {
  config::K3Config cfg = config::builtin_config("k3-tiny");
  cfg.tie_word_embeddings = true;
  TempDir dir;
  write_random_checkpoint(cfg, WriteOptions{}, dir.path());
  EXPECT_EQ(SafetensorsSet::open_dir(dir.path()).find("lm_head.weight"), nullptr);
  const LoadedModel m = load_checkpoint(dir.path());
  EXPECT_TRUE(m.config.tie_word_embeddings);
  EXPECT_EQ(m.weights.lm_head.weight.data<void>(), m.weights.embed.data<void>());
}

// The loaded tensors point into a read-only mapping of the checkpoint file (no copy).
TEST(Checkpoint, TensorsStayMapped) {
  TempDir dir;
  write_random_checkpoint(config::builtin_config("k3-tiny"), WriteOptions{}, dir.path());
  const model::Weights w = load_weights(dir.path(), config::builtin_config("k3-tiny"));
  const std::string file = fs::canonical(dir / kSingleFileName).string();
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int hits = 0;
  for (const void* p : {w.embed.data<void>(), w.lm_head.weight.data<void>(), w.final_norm.data<void>()}) {
    maps.clear();
    maps.seekg(0);
    bool found = false;
    while (std::getline(maps, line)) {
      if (!line.ends_with(file)) continue;
      std::istringstream ls(line);
      uintptr_t lo = 0, hi = 0;
      char dash = 0;
      ls >> std::hex >> lo >> dash >> hi;
      const auto a = reinterpret_cast<uintptr_t>(p);
      if (a >= lo && a < hi) found = true;
    }
    hits += found;
  }
  EXPECT_EQ(hits, 3);
}

}  // namespace
}  // namespace k3::checkpoint
