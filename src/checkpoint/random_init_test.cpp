// checkpoint/random_init_test.cpp: the two value draws of random_init.h (sequential Box-Muller for
// small tensors, block-forked quantile table for bulk ones), the fast MXFP4 quantizer against
// core::mxfp4_quantize_row, the threaded writer (same bytes for any thread count, k3-tiny bytes
// pinned), and the k3-proxy-tp8 inventory size.
#include "checkpoint/random_init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_test_util.h"
#include "core/bf16.h"
#include "core/fp4.h"
#include "core/rng.h"

namespace k3::checkpoint {
namespace {

using testing::TempDir;

// FNV-1a 64 of a file's bytes.
uint64_t file_hash(const std::filesystem::path& p) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : testing::read_bytes(p)) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

// Quantizes `values` both ways, row by row for core (rows of `row` values), and compares.
void expect_same_quantization(const std::vector<float>& values, size_t row, const char* what) {
  ASSERT_EQ(values.size() % row, 0u);
  std::vector<uint8_t> p1(values.size() / 2), s1(values.size() / 32), p2(p1.size(), 0xAA), s2(s1.size(), 0xAA);
  for (size_t r = 0; r < values.size() / row; ++r)
    core::mxfp4_quantize_row({values.data() + r * row, row}, {p1.data() + r * row / 2, row / 2},
                             {s1.data() + r * row / 32, row / 32});
  mxfp4_quantize_groups(values.data(), static_cast<int64_t>(values.size()), p2.data(), s2.data());
  for (size_t i = 0; i < p1.size(); ++i)
    ASSERT_EQ(p1[i], p2[i]) << what << ": packed byte " << i << " (values " << values[2 * i] << ", "
                            << values[2 * i + 1] << ")";
  for (size_t i = 0; i < s1.size(); ++i) ASSERT_EQ(s1[i], s2[i]) << what << ": scale " << i;
}

TEST(RandomInit, FastMxfp4QuantizerMatchesCore) {
  // Every finite BF16 value, in groups of 32 consecutive bit patterns (amax and scale vary from
  // group to group, subnormal to huge), then the same values shuffled into random groups.
  std::vector<float> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = core::bf16_bits_to_f32(static_cast<uint16_t>(b));
    if (std::isfinite(v)) all.push_back(v);
  }
  while (all.size() % (32 * 97)) all.push_back(0.0f);  // whole rows of 97 groups below
  expect_same_quantization(all, 32, "all bf16 values");
  core::Rng rng(17);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.next_u64() % i]);
    expect_same_quantization(all, 32 * 97, "shuffled bf16 values");
  }
  // Exact ties: every midpoint between E2M1 magnitudes (and the magnitudes), both signs, at
  // several scales (the group's 6 * 2^k member fixes the scale to 2^k).
  std::vector<float> ties;
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f};
  for (int k : {-126, -20, -7, 0, 3, 100}) {
    std::vector<float> g(32, 0.0f);
    g[0] = std::ldexp(6.0f, k);
    for (size_t i = 0; i < std::size(mids); ++i) {
      g[1 + i] = std::ldexp(mids[i], k);
      g[16 + i] = -std::ldexp(mids[i], k);
    }
    ties.insert(ties.end(), g.begin(), g.end());
  }
  expect_same_quantization(ties, 32, "ties");
  // Realistic rows: N(0, 0.02^2) and N(0, 1) BF16 values at the expert widths.
  for (double std : {0.02, 1.0}) {
    std::vector<float> w(3584 * 3);
    for (float& x : w) x = core::bf16_round(static_cast<float>(rng.normal(0.0, std)));
    expect_same_quantization(w, 3584, "normal rows");
  }
  // A non-finite value is refused, as core refuses it.
  std::vector<float> bad(32, 1.0f);
  bad[7] = NAN;
  std::vector<uint8_t> p(16), s(1);
  EXPECT_THROW(mxfp4_quantize_groups(bad.data(), 32, p.data(), s.data()), core::Error);
}

TEST(RandomInit, QuantileTableIsTheStandardNormal) {
  const float* q = bulk_normal_quantiles();
  for (int i = 1; i < 65536; ++i) ASSERT_LT(q[i - 1], q[i]) << i;
  for (int i = 0; i < 32768; ++i) ASSERT_EQ(q[i], -q[65535 - i]) << i;
  // Entry i is the (i + 0.5) / 2^16 quantile: its upper tail matches to float precision.
  for (int i : {32768, 40000, 60000, 63896, 65000, 65535}) {
    const double tail = 0.5 * std::erfc(static_cast<double>(q[i]) / std::sqrt(2.0));
    EXPECT_NEAR(tail / ((65535 - i + 0.5) / 65536.0), 1.0, 1e-5) << i;
  }
  EXPECT_NEAR(q[63896], 1.95968, 1e-4);  // the 0.974983 quantile
  EXPECT_NEAR(q[65535], 4.333, 0.01);    // the tails stop near 4.3 sigma
  double var = 0;
  for (int i = 0; i < 65536; ++i) var += static_cast<double>(q[i]) * q[i];
  EXPECT_NEAR(var / 65536, 1.0, 1e-3);
}

ParamSpec linear_spec(const std::string& name, int64_t out, int64_t in) {
  ParamSpec s;
  s.name = s.value_name = name;
  s.role = ParamRole::linear;
  s.dtypes = {core::DType::bf16};
  s.shapes = {{out, in}};
  s.out_features = out;
  s.in_features = in;
  return s;
}

TEST(RandomInit, SmallTensorsKeepTheSequentialBoxMullerDraw) {
  // 1024 x 1024 = kSequentialMaxValues exactly: still one stream, one Rng::normal per value.
  const ParamSpec s = linear_spec("w.small", 1024, 1024);
  const std::vector<float> v = random_linear_values(s, InitStyle::realistic, 5);
  core::Rng rng = core::Rng(5).fork(core::Rng::hash("w.small"));
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(v[i], core::bf16_round(static_cast<float>(rng.normal(0.0, 0.02)))) << i;
}

TEST(RandomInit, BulkTensorsDrawBlocksFromTheQuantileTable) {
  // 17 x 61697 = 1,048,849 values: just over the limit, 17 blocks, the last one partial (17 values).
  const ParamSpec s = linear_spec("w.bulk", 17, 61697);
  const int64_t n = 17 * 61697;
  ASSERT_GT(n, kSequentialMaxValues);
  const std::vector<float> v = random_linear_values(s, InitStyle::realistic, 5);
  ASSERT_EQ(static_cast<int64_t>(v.size()), n);
  // The definition, at the start of block 0, of block 1 and of the partial last block.
  const core::Rng stream = core::Rng(5).fork(core::Rng::hash("w.bulk"));
  const float* q = bulk_normal_quantiles();
  for (int64_t block : {int64_t{0}, int64_t{1}, n / kBulkBlockValues}) {
    core::Rng rng = stream.fork(static_cast<uint64_t>(block));
    const uint64_t u = rng.next_u64();
    for (int j = 0; j < 4; ++j) {
      const float want = core::bf16_round(0.02f * q[(u >> (16 * j)) & 0xffff]);
      EXPECT_EQ(v[static_cast<size_t>(block * kBulkBlockValues + j)], want) << "block " << block << " value " << j;
    }
  }
  // N(0, 0.02^2) in aggregate, and the same again on a second call.
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += static_cast<double>(x) * x;
  EXPECT_NEAR(sum / n, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.0002);
  EXPECT_EQ(random_linear_values(s, InitStyle::realistic, 5), v);
  EXPECT_NE(random_linear_values(s, InitStyle::realistic, 6), v);
  // fill_random_param stores exactly these values, and an MXFP4 pair quantizes exactly them.
  std::vector<std::byte> bytes(static_cast<size_t>(n) * 2);
  fill_random_param(s, config::builtin_config("k3-tiny"), InitStyle::realistic, 5, bytes);
  for (int64_t i : {int64_t{0}, int64_t{65536}, n - 1}) {
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    EXPECT_EQ(core::bf16_bits_to_f32(b), v[static_cast<size_t>(i)]) << i;
  }
  // An MXFP4 pair quantizes the BF16 values of the same name (rows of 65568 = 2049 groups, so
  // the flat 2^16-value blocks cross rows).
  ParamSpec packed = linear_spec("w.bulk", 16, 65568);
  packed.role = ParamRole::expert_packed;
  const std::vector<float> w = random_linear_values(packed, InitStyle::realistic, 5);
  const Mxfp4Values mx = random_mxfp4_values(packed, InitStyle::realistic, 5);
  std::vector<uint8_t> p(w.size() / 2), sc(w.size() / 32);
  for (size_t r = 0; r < 16; ++r)
    core::mxfp4_quantize_row({w.data() + r * 65568, 65568}, {p.data() + r * 32784, 32784},
                             {sc.data() + r * 2049, 2049});
  EXPECT_EQ(mx.packed, p);
  EXPECT_EQ(mx.scales, sc);
}

// k3-tiny with a vocabulary large enough that the embedding and lm_head are bulk tensors, and
// MXFP4 experts: both draws and the pair jobs in one small checkpoint.
config::K3Config mixed_config() {
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["vocab_size"] = 4099;  // 4099 x 256 = 1,049,344 values > 2^20
  return config::parse_config(j, "test:mixed");
}

TEST(RandomInit, WriterBytesDoNotDependOnThreads) {
  const config::K3Config cfg = mixed_config();
  TempDir one, many, sharded_one, sharded_many;
  for (bool mxfp4 : {false, true}) {
    WriteOptions opt{.seed = 3, .mxfp4 = mxfp4, .init = InitStyle::sensitive, .threads = 1};
    write_random_checkpoint(cfg, opt, one.path());
    opt.threads = 5;
    write_random_checkpoint(cfg, opt, many.path());
    EXPECT_EQ(testing::read_bytes(one / kSingleFileName), testing::read_bytes(many / kSingleFileName)) << mxfp4;
    // Sharded (MXFP4 pairs may straddle files): 3 workers prefetch across file boundaries.
    opt.max_shard_bytes = 200'000;
    opt.threads = 1;
    write_random_checkpoint(cfg, opt, sharded_one.path());
    opt.threads = 3;
    write_random_checkpoint(cfg, opt, sharded_many.path());
    const SafetensorsSet a = SafetensorsSet::open_dir(sharded_one.path()),
                         b = SafetensorsSet::open_dir(sharded_many.path());
    ASSERT_EQ(a.entries().size(), b.entries().size());
    for (const auto& [name, e] : a.entries()) {
      const core::Tensor ta = a.tensor(e), tb = b.tensor(*b.find(name));
      ASSERT_EQ(ta.nbytes(), tb.nbytes()) << name;
      ASSERT_EQ(std::memcmp(ta.data<void>(), tb.data<void>(), static_cast<size_t>(ta.nbytes())), 0) << name;
    }
    testing::expect_round_trip(sharded_many.path(), cfg, opt);
  }
}

TEST(RandomInit, TinyCheckpointBytesArePinned) {
  // FNV-1a of model.safetensors as written before the bulk draw and the threaded writer existed:
  // k3-tiny's tensors are all below kSequentialMaxValues, so nothing of them may change (the
  // golden logits in tests/golden depend on these bytes).
  struct Case {
    bool mxfp4;
    InitStyle init;
    uint64_t seed;
    uint64_t hash;
  };
  const Case cases[] = {{false, InitStyle::realistic, 0, 0x68b29979c116fb92ull},
                        {false, InitStyle::sensitive, 0, 0x736b23a3c32b95ceull},
                        {true, InitStyle::sensitive, 0, 0xbf00638eb35153afull},
                        {true, InitStyle::realistic, 7, 0x91b1807f1a872e06ull}};
  for (const Case& c : cases) {
    TempDir dir;
    write_random_checkpoint(config::builtin_config("k3-tiny"),
                            {.seed = c.seed, .mxfp4 = c.mxfp4, .init = c.init, .threads = 4}, dir.path());
    EXPECT_EQ(file_hash(dir / kSingleFileName), c.hash)
        << "mxfp4 " << c.mxfp4 << " init " << static_cast<int>(c.init) << " seed " << c.seed;
  }
}

TEST(RandomInit, ProxyTp8InventoryIs52GB) {
  // The same total as config/proxy_config_test.cpp counts from the config fields.
  const config::K3Config p = config::builtin_config("k3-proxy-tp8");
  const std::vector<ParamSpec> specs = expected_params(p);
  int64_t bytes = 0, expert_bytes = 0, bulk = 0, expert_tensors = 0;
  for (const ParamSpec& s : specs) {
    const int64_t b = s.shapes[0].numel() * static_cast<int64_t>(core::dtype_size(s.dtypes[0]));
    bytes += b;
    if (s.role == ParamRole::expert_packed || s.role == ParamRole::expert_scale) {
      expert_bytes += b;
      ++expert_tensors;
      // Every expert matrix (384 x 3584 values) takes the bulk draw.
      EXPECT_GT(s.out_features * s.in_features, kSequentialMaxValues) << s.name;
    }
    bulk += s.role != ParamRole::expert_scale && s.shapes[0].numel() > kSequentialMaxValues;
  }
  std::printf("k3-proxy-tp8: %zu tensors, %.3f GB (experts %.3f GB in %lld tensors, %lld bulk tensors)\n", specs.size(),
              static_cast<double>(bytes) / 1e9, static_cast<double>(expert_bytes) / 1e9,
              static_cast<long long>(expert_tensors), static_cast<long long>(bulk));
  EXPECT_EQ(bytes, 51'925'337'600);
  EXPECT_EQ(expert_bytes, 45'201'752'064);
  EXPECT_EQ(expert_tensors, 23 * 896 * 3 * 2);
  ASSERT_TRUE(p.mxfp4.enabled);
}

}  // namespace
}  // namespace k3::checkpoint
