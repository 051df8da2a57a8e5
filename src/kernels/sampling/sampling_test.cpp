// kernels/sampling/sampling_test.cpp: the `sample` op's CPU reference against runner::Sampler (the
// oracle): the same tokens for the same uniform draws, bit-identical logprobs and top-N lists, on
// odd vocabularies (1, 17, 1000, 20480) and K3's 163840, every parameter combination, tied and
// masked logits; bad rows, bad arguments and the params packing.
#include "kernels/sampling/sampling.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "runner/sampler.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits N(0, scale); with `ties`, rounded to multiples of 0.5 so many values repeat; `masked`
// sets about one in eight to -inf (never all of them: id 0 stays finite).
Tensor random_logits(int64_t rows, int64_t V, uint64_t seed, double scale, bool ties, bool masked) {
  core::Rng rng(seed);
  Tensor t = Tensor::zeros(DType::f32, {rows, V});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < V; ++i) {
      float v = static_cast<float>(rng.normal() * scale);
      if (ties) v = std::round(v * 2.0f) / 2.0f;
      if (masked && i > 0 && rng.next_u64() % 8 == 0) v = -kInf;
      t.data<float>()[r * V + i] = v;
    }
  return t;
}

Tensor poisoned_out(int64_t R, int64_t N) {
  Tensor out = Tensor::zeros(DType::f32, {R, 2 + 2 * N});
  for (float& v : out.span<float>()) v = kNaN;
  return out;
}

SampleRowParams row_params(const runner::SamplingParams& sp, int32_t logits_row, double u) {
  SampleRowParams p;
  p.logits_row = logits_row;
  p.temperature = sp.temperature;
  p.top_p = sp.top_p;
  p.min_p = sp.min_p;
  p.top_k = sp.top_k;
  p.num_top = sp.logprobs;
  p.want_logprob = sp.logprob;
  p.uniform = u;
  return p;
}

std::string describe(const runner::SamplingParams& sp, int64_t V) {
  return "V " + std::to_string(V) + " T " + std::to_string(sp.temperature) + " top_k " + std::to_string(sp.top_k) +
         " top_p " + std::to_string(sp.top_p) + " min_p " + std::to_string(sp.min_p) + " logprobs " +
         std::to_string(sp.logprobs) + (sp.logprob ? " +logprob" : "");
}

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Runs `draws` samples of logits row `row` through a Sampler and, with a twin Sampler of the same
// seed giving draw_uniform(), through the op (all draws as rows of one call); every result must
// be identical, and the twin's Rng must end where the Sampler's does.
void expect_op_matches_sampler(const Tensor& logits, int32_t row, const runner::SamplingParams& sp, int draws,
                               int64_t N = kMaxTopLogprobs) {
  const int64_t V = logits.dim(1);
  runner::Sampler host(sp, static_cast<int32_t>(V)), twin(sp, static_cast<int32_t>(V));
  std::vector<SampleRowParams> rows;
  std::vector<runner::SampleResult> want;
  const std::span<const float> x(logits.data<const float>() + row * V, static_cast<size_t>(V));
  for (int d = 0; d < draws; ++d) {
    want.push_back(host.sample(x, {}, {}));
    rows.push_back(row_params(sp, row, twin.draw_uniform()));
  }
  EXPECT_EQ(host.draw_uniform(), twin.draw_uniform()) << "the Rngs drifted apart: " << describe(sp, V);
  const Tensor params = pack_sample_params(rows);
  Tensor out = poisoned_out(draws, N);
  const SampleArgs args{logits.view(), params.view(), out.view()};
  ASSERT_TRUE(sample_check(args)) << sample_check(args).reason();
  sample_reference(args);
  const bool want_lp = sp.logprob || sp.logprobs > 0;
  for (int d = 0; d < draws; ++d) {
    const float* o = out.data<const float>() + d * (2 + 2 * N);
    const std::string where = describe(sp, V) + " draw " + std::to_string(d);
    ASSERT_EQ(o[kOutToken], static_cast<float>(want[d].token)) << where;
    if (want_lp)
      ASSERT_TRUE(same_bits(o[kOutLogprob], want[d].logprob))
          << where << ": " << o[kOutLogprob] << " vs " << want[d].logprob;
    else ASSERT_TRUE(std::isnan(o[kOutLogprob])) << where;
    for (int64_t j = 0; j < N; ++j) {
      const float id = o[kOutTopIds + j], lp = o[out_top_logprobs_col(N) + j];
      if (j < sp.logprobs) {
        ASSERT_EQ(id, static_cast<float>(want[d].top_logprobs[j].first)) << where << " top " << j;
        ASSERT_TRUE(same_bits(lp, want[d].top_logprobs[j].second)) << where << " top " << j;
      } else {
        ASSERT_EQ(id, -1.0f) << where << " unused top " << j;
        ASSERT_TRUE(std::isnan(lp)) << where << " unused top " << j;
      }
    }
  }
}

TEST(SampleReference, GreedyArgmaxLogprobsAndTopNOnOddVocabularies) {
  for (int64_t V : {1, 17, 1000, 20480}) {
    for (bool ties : {false, true}) {
      const Tensor logits = random_logits(3, V, 100 + V + ties, 2.0, ties, /*masked=*/ties);
      for (int32_t row : {0, 2}) {
        runner::SamplingParams sp;
        expect_op_matches_sampler(logits, row, sp, 1, 0);
        sp.logprob = true;
        expect_op_matches_sampler(logits, row, sp, 1, 3);
        sp.logprobs = static_cast<int>(std::min<int64_t>(V, 20));
        expect_op_matches_sampler(logits, row, sp, 1);
      }
    }
  }
}

// Every combination of temperature, top-k (off, 1, small, vocab - 1, above the vocabulary),
// top-p (off, moderate, tight), min-p (off, on) and logprobs, many draws each.
TEST(SampleReference, EveryFilterCombinationDrawsTheSamplersTokens) {
  for (int64_t V : {17, 1000}) {
    const Tensor logits = random_logits(2, V, 7 + V, 1.5, false, false);
    const Tensor tied = random_logits(1, V, 9 + V, 1.0, true, true);
    for (float T : {0.0f, 0.6f, 1.0f, 1.7f})
      for (int k : {0, 1, 5, static_cast<int>(V) - 1, static_cast<int>(V) + 3})
        for (float top_p : {1.0f, 0.9f, 0.3f})
          for (float min_p : {0.0f, 0.05f}) {
            runner::SamplingParams sp;
            sp.temperature = T, sp.top_k = k, sp.top_p = top_p, sp.min_p = min_p;
            sp.seed = 1000u + static_cast<uint64_t>(k) * 7u + static_cast<uint64_t>(top_p * 10);
            sp.logprobs = (k % 2 == 0) ? 3 : 0;
            expect_op_matches_sampler(logits, 1, sp, 40, 4);
            expect_op_matches_sampler(tied, 0, sp, 20, 4);
          }
  }
}

// Flat rows make top-p cut deep (thousands of survivors), peaked ones keep a handful; top-k with
// k in the thousands takes the Sampler's scan path, small k its sorted path.
TEST(SampleReference, DeepAndShallowCutsAt20480) {
  const int64_t V = 20480;
  const Tensor flat = random_logits(1, V, 31, 0.05, false, false);
  const Tensor peaked = random_logits(1, V, 32, 4.0, false, true);
  for (const Tensor* t : {&flat, &peaked})
    for (auto [k, top_p, min_p] : {std::tuple{0, 0.95f, 0.0f},
                                   {50, 1.0f, 0.0f},
                                   {4000, 0.8f, 0.0f},
                                   {0, 1.0f, 0.1f},
                                   {0, 0.5f, 0.02f},
                                   {1000, 1.0f, 0.5f}}) {
      runner::SamplingParams sp;
      sp.temperature = 0.8f, sp.top_k = k, sp.top_p = top_p, sp.min_p = min_p, sp.seed = 5;
      sp.logprob = true;
      expect_op_matches_sampler(*t, 0, sp, 25, 0);
    }
}

TEST(SampleReference, K3Vocabulary163840) {
  const int64_t V = 163840;
  const Tensor logits = random_logits(1, V, 77, 3.0, false, false);
  for (auto [T, k, top_p] : {std::tuple{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 40, 0.95f}, {1.0f, 0, 0.9f}}) {
    runner::SamplingParams sp;
    sp.temperature = T, sp.top_k = k, sp.top_p = top_p, sp.seed = 11, sp.logprobs = 5;
    expect_op_matches_sampler(logits, 0, sp, 4, 5);
  }
}

TEST(SampleReference, BadRowsSayMinusOneAndTheOthersStillSample) {
  const int64_t V = 33;
  Tensor logits = random_logits(4, V, 3, 1.0, false, false);
  logits.data<float>()[1 * V + 5] = kNaN;
  logits.data<float>()[2 * V + 30] = kInf;
  for (int64_t i = 0; i < V; ++i) logits.data<float>()[3 * V + i] = -kInf;
  std::vector<SampleRowParams> rows(4);
  for (int32_t r = 0; r < 4; ++r) rows[r].logits_row = r, rows[r].want_logprob = true, rows[r].num_top = 2;
  const Tensor params = pack_sample_params(rows);
  Tensor out = poisoned_out(4, 2);
  sample_reference({logits.view(), params.view(), out.view()});
  const float* o = out.data<const float>();
  EXPECT_GE(o[kOutToken], 0.0f);
  EXPECT_FALSE(std::isnan(o[kOutLogprob]));
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(o[r * 6 + kOutToken], -1.0f) << "row " << r;
    EXPECT_TRUE(std::isnan(o[r * 6 + kOutLogprob])) << "row " << r;
    EXPECT_EQ(o[r * 6 + kOutTopIds], -1.0f) << "row " << r;
  }
}

TEST(SampleReference, ChecksNameTheBadArgument) {
  const Tensor logits = random_logits(2, 10, 1, 1.0, false, false);
  std::vector<SampleRowParams> rows(1);
  Tensor params = pack_sample_params(rows), out = poisoned_out(1, 2);
  EXPECT_TRUE(sample_check({logits.view(), params.view(), out.view()}));
  auto reason = [&](const SampleArgs& a) {
    const core::Status s = sample_check(a);
    return s ? std::string() : s.reason();
  };
  const Tensor logits_bf16 = Tensor::zeros(DType::bf16, {2, 10});
  EXPECT_NE(reason({logits_bf16.view(), params.view(), out.view()}).find("logits"), std::string::npos);
  const Tensor params_f32 = Tensor::zeros(DType::f32, {1, kSampleParamCols});
  EXPECT_NE(reason({logits.view(), params_f32.view(), out.view()}).find("params"), std::string::npos);
  const Tensor out_odd = poisoned_out(1, 2);
  Tensor out_wide = Tensor::zeros(DType::f32, {1, 2 + 2 * 21}), out_rows = poisoned_out(2, 2);
  EXPECT_NE(reason({logits.view(), params.view(), out_wide.view()}).find("out"), std::string::npos);
  EXPECT_NE(reason({logits.view(), params.view(), out_rows.view()}).find("R = 1"), std::string::npos);
  struct Bad {
    SampleRowParams p;
    const char* field;
  };
  std::vector<Bad> bad(6);
  bad[0].p.logits_row = 2, bad[0].field = "logits_row";
  bad[1].p.temperature = -1.0f, bad[1].field = "temperature";
  bad[2].p.top_p = 0.0f, bad[2].field = "top_p";
  bad[3].p.min_p = 1.5f, bad[3].field = "min_p";
  bad[4].p.num_top = 3, bad[4].field = "num_top";  // out has N = 2
  bad[5].p.temperature = kNaN, bad[5].field = "temperature";
  for (const Bad& b : bad) {
    const Tensor p = pack_sample_params(std::span<const SampleRowParams>(&b.p, 1));
    const std::string msg = reason({logits.view(), p.view(), out_odd.view()});
    EXPECT_NE(msg.find(b.field), std::string::npos) << b.field << ": '" << msg << "'";
    EXPECT_NE(msg.find("params row 0"), std::string::npos) << msg;
  }
}

TEST(SampleReference, PackingRoundTripsAndRejectsUniformsOffTheGrid) {
  core::Rng rng(9);
  std::vector<SampleRowParams> rows(5);
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].logits_row = static_cast<int32_t>(r * 3);
    rows[r].temperature = 0.25f * static_cast<float>(r);
    rows[r].top_p = 0.9f, rows[r].min_p = 0.01f, rows[r].top_k = static_cast<int32_t>(r) - 1;
    rows[r].num_top = static_cast<int32_t>(r), rows[r].want_logprob = r % 2 == 1;
    rows[r].uniform = r == 4 ? 1.0 - 0x1.0p-53 : rng.uniform();
  }
  const Tensor t = pack_sample_params(rows);
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRowParams p = unpack_sample_params(t.data<const int32_t>() + r * kSampleParamCols);
    EXPECT_EQ(p.logits_row, rows[r].logits_row);
    EXPECT_EQ(p.temperature, rows[r].temperature);
    EXPECT_EQ(p.top_p, rows[r].top_p);
    EXPECT_EQ(p.min_p, rows[r].min_p);
    EXPECT_EQ(p.top_k, rows[r].top_k);
    EXPECT_EQ(p.num_top, rows[r].num_top);
    EXPECT_EQ(p.want_logprob, rows[r].want_logprob);
    EXPECT_EQ(p.uniform, rows[r].uniform) << r;
  }
  SampleRowParams off;
  off.uniform = 0.1;  // 0.1 has bits below 2^-53: core::Rng::uniform() never returns it
  EXPECT_THROW(pack_sample_params(std::span<const SampleRowParams>(&off, 1)), core::Error);
  off.uniform = 0x1.0p-60;
  EXPECT_THROW(pack_sample_params(std::span<const SampleRowParams>(&off, 1)), core::Error);
  off.uniform = 1.0;
  EXPECT_THROW(pack_sample_params(std::span<const SampleRowParams>(&off, 1)), core::Error);
}

}  // namespace
}  // namespace k3::kernels
