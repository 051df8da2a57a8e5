// kernels/sampling/sampling_ops_test.cpp: the `sample` op on every device backend against the CPU
// reference (which kernels/sampling/sampling_test.cpp holds equal to runner::Sampler): greedy
// tokens and top-N ids exact, logprobs within a few f32 ulp, drawn tokens equal in >= 99.9% of
// draws with every disagreement explained by a uniform, a top-p target or a min-p threshold lying
// within 1e-6 (relative) of a boundary; bad rows; run-to-run identical. Rows 1, 7, 64; vocabularies
// 1, 17, 1000, 20480 (the TP8 shard) and 163840 (K3's, what the sampler sees after the all-gather).
// OpsOdd.* stay small (scripts/gpu_check.sh runs them under compute-sanitizer); the many-draw
// statistics are OpsSampling.*.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/sampling/sampling.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

using kernels::SampleRowParams;

// N(0, scale) logits; with `ties` rounded to multiples of 0.5 (many exact ties) and every 8th id
// from id 3 on masked to -inf.
Tensor random_logits(core::Rng& rng, int64_t rows, int64_t V, double scale, bool ties) {
  Tensor t = f32_tensor({rows, V});
  for (int64_t i = 0; i < rows * V; ++i) {
    float v = static_cast<float>(rng.normal() * scale);
    if (ties) v = (i % V) % 8 == 3 ? -INFINITY : std::round(v * 2.0f) / 2.0f;
    t.data<float>()[i] = v;
  }
  return t;
}

struct Outputs {
  Tensor cpu, dev;  // f32 [R, 2 + 2N]
};

Outputs run_both(Device* dev, const Tensor& logits, const std::vector<SampleRowParams>& rows, int64_t N) {
  const int64_t R = static_cast<int64_t>(rows.size());
  const Tensor params = kernels::pack_sample_params(rows);
  Outputs o;
  o.cpu = nan_tensor({R, 2 + 2 * N});
  cpu_registry().sample.run({logits.view(), params.view(), o.cpu.view()}, core::Device::cpu);
  const Tensor d_logits = dev->upload(logits), d_params = dev->upload(params);
  const Tensor d_out = dev->poisoned(DType::f32, {R, 2 + 2 * N});
  const kernels::SampleArgs args{d_logits.view(), d_params.view(), d_out.view()};
  expect_device_impl(dev->registry().sample, args, dev);
  dev->registry().sample.run(args, dev->kind());
  o.dev = dev->to_host_f32(d_out.view());
  return o;
}

bool close_logprob(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (got == want) return true;  // -inf (a masked token) included
  return std::fabs(got - want) <= 1e-6f + 1e-6f * std::fabs(want);
}

// Every output but the drawn token: top-N ids exact, logprobs close, the unused slots -1 / NaN.
void expect_same_logprobs(const Outputs& o, const std::vector<SampleRowParams>& rows, int64_t N,
                          const std::string& what) {
  const int64_t W = 2 + 2 * N;
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* c = o.cpu.data<const float>() + static_cast<int64_t>(r) * W;
    const float* d = o.dev.data<const float>() + static_cast<int64_t>(r) * W;
    const std::string where = what + " row " + std::to_string(r);
    const bool same_token = c[kernels::kOutToken] == d[kernels::kOutToken];
    if (same_token) {
      EXPECT_TRUE(close_logprob(d[kernels::kOutLogprob], c[kernels::kOutLogprob]))
          << where << ": logprob " << d[kernels::kOutLogprob] << " vs " << c[kernels::kOutLogprob];
    }
    for (int64_t j = 0; j < N; ++j) {
      ASSERT_EQ(d[kernels::kOutTopIds + j], c[kernels::kOutTopIds + j]) << where << " top " << j;
      EXPECT_TRUE(close_logprob(d[kernels::kOutTopIds + N + j], c[kernels::kOutTopIds + N + j]))
          << where << " top " << j << ": " << d[kernels::kOutTopIds + N + j] << " vs "
          << c[kernels::kOutTopIds + N + j];
    }
  }
}

// Whether a drawn-token disagreement lies at a boundary: the kept set and CDF of the reference
// recomputed by full sort; the device's token must be within `tol` (relative) of the reference's
// interval for it, or the top-p cut / a min-p comparison at the edge of the kept set must be that
// close to flipping.
bool at_a_boundary(const float* x, int64_t V, const SampleRowParams& p, int32_t dev_token, double tol) {
  const float m = *std::max_element(x, x + V);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  std::vector<double> prob(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    prob[i] = std::exp(static_cast<float>(std::max(static_cast<double>(x[i] - m) * inv_t, -150.0)));
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  const int64_t k = (p.top_k <= 0 || p.top_k >= V) ? V : p.top_k;
  double mass = 0;
  for (int64_t j = 0; j < k; ++j) mass += prob[order[j]];
  int64_t keep = 0;
  while (keep < k && prob[order[keep]] >= p.min_p) ++keep;
  // A min-p comparison near its threshold at the edge explains anything.
  if (keep < k && std::fabs(prob[order[keep]] - p.min_p) <= 4e-7 * std::max(1.0, static_cast<double>(p.min_p)))
    return true;
  if (keep > 0 && std::fabs(prob[order[keep - 1]] - p.min_p) <= 4e-7) return true;
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * mass;
    double cum = 0;
    for (int64_t j = 0; j < keep; ++j) {
      cum += prob[order[j]];
      if (std::fabs(cum - target) <= tol * mass) return true;  // the cut could fall either side
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
  }
  std::vector<char> kept(static_cast<size_t>(V), 0);
  for (int64_t j = 0; j < keep; ++j) kept[order[j]] = 1;
  double total = 0;
  for (int64_t i = 0; i < V; ++i)
    if (kept[i]) total += prob[i];
  double before = 0;
  const double u = p.uniform * total;
  for (int64_t i = 0; i < V; ++i) {
    if (!kept[i]) continue;
    const double after = before + prob[i];
    if (i == dev_token) return u >= before - tol * total && u <= after + tol * total;
    before = after;
  }
  return false;  // the device drew a token outside the kept set with no boundary near
}

// Runs rows (each with its own parameters and uniform, all on logits row 0) in one call: greedy
// rows must agree exactly, drawn tokens must be in [0, V) and every disagreement at a boundary.
void check_rows(Device* dev, const Tensor& logits, const std::vector<SampleRowParams>& rows, int64_t N,
                const std::string& what, int* disagreements, int* total) {
  const int64_t V = logits.dim(1), W = 2 + 2 * N;
  const Outputs o = run_both(dev, logits, rows, N);
  expect_same_logprobs(o, rows, N, what);
  for (size_t d = 0; d < rows.size(); ++d) {
    const float c = o.cpu.data<const float>()[static_cast<int64_t>(d) * W];
    const float g = o.dev.data<const float>()[static_cast<int64_t>(d) * W];
    const SampleRowParams& p = rows[d];
    const std::string where = what + " T " + std::to_string(p.temperature) + " k " + std::to_string(p.top_k) +
                              " top_p " + std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) + " row " +
                              std::to_string(d) + " (u " + std::to_string(p.uniform) + ")";
    ASSERT_GE(g, 0.0f) << where;
    ASSERT_LT(g, static_cast<float>(V)) << where;
    ++*total;
    if (c == g) continue;
    ASSERT_NE(p.temperature, 0.0f) << where << ": greedy tokens differ";
    ++*disagreements;
    EXPECT_TRUE(at_a_boundary(logits.data<const float>(), V, p, static_cast<int32_t>(g), 1e-6))
        << where << ": device " << g << ", reference " << c;
  }
}

// Every combination of temperature (0 included), top-k (off, 1, 7, V - 1), top-p (off, 0.9, 0.4)
// and min-p (off, 0.05), `draws` uniforms each, on a peaked row and on a tied and masked one.
void check_every_filter(Device* dev, int64_t V, int draws, core::Rng& rng, int* disagreements, int* total) {
  const Tensor peaked = random_logits(rng, 1, V, 3.0, false), tied = random_logits(rng, 1, V, 1.0, true);
  std::vector<SampleRowParams> rows;
  for (float T : {0.0f, 0.6f, 1.0f, 1.5f})
    for (int k : {0, 1, 7, static_cast<int>(V) - 1})
      for (float top_p : {1.0f, 0.9f, 0.4f})
        for (float min_p : {0.0f, 0.05f})
          for (int d = 0; d < draws; ++d) {
            SampleRowParams p;
            p.temperature = T, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.num_top = k == 7 ? 3 : 0;
            p.want_logprob = true, p.uniform = rng.uniform();
            rows.push_back(p);
          }
  check_rows(dev, peaked, rows, 3, "V " + std::to_string(V), disagreements, total);
  check_rows(dev, tied, rows, 3, "V " + std::to_string(V) + " ties", disagreements, total);
}

TEST(OpsOdd, SampleGreedyTokensAndLogprobs) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9100);
  for (int64_t V : {1, 17, 1000, 20480})
    for (bool ties : {false, true})
      for (int64_t R : {1, 7, 64}) {
        const Tensor logits = random_logits(rng, R + 1, V, 2.0, ties);
        const int64_t N = std::min<int64_t>(V, kernels::kMaxTopLogprobs);
        std::vector<SampleRowParams> rows(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) {
          rows[r].logits_row = static_cast<int32_t>((r * 3 + 1) % (R + 1));
          rows[r].num_top = static_cast<int32_t>(r % (N + 1));
          rows[r].want_logprob = r % 2 == 0;
        }
        const Outputs o = run_both(dev, logits, rows, N);
        const std::string what = "greedy V " + std::to_string(V) + " R " + std::to_string(R) + (ties ? " ties" : "");
        for (int64_t r = 0; r < R; ++r)
          ASSERT_EQ(o.dev.data<const float>()[r * (2 + 2 * N)], o.cpu.data<const float>()[r * (2 + 2 * N)])
              << what << " row " << r;
        expect_same_logprobs(o, rows, N, what);
      }
}

// One call per vocabulary and row kind with every filter path (small: the sanitizers run OpsOdd).
TEST(OpsOdd, SampleEveryFilterPath) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  int disagreements = 0, total = 0;
  for (int64_t V : {17, 1000, 20480}) check_every_filter(dev, V, 1, rng, &disagreements, &total);
  EXPECT_LE(disagreements, 1) << disagreements << " of " << total << " draws differ";
}

// Many uniforms per setting: drawn tokens agree in >= 99.9% of the draws.
TEST(OpsSampling, DrawsAgreeWithTheReferenceIn999Of1000) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9250);
  int disagreements = 0, total = 0;
  for (int64_t V : {17, 1000}) check_every_filter(dev, V, 40, rng, &disagreements, &total);
  check_every_filter(dev, 20480, 8, rng, &disagreements, &total);
  EXPECT_LE(disagreements * 1000, total) << disagreements << " of " << total << " draws differ";
}

TEST(OpsOdd, SampleBadRowsAndRunToRunIdentical) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9300);
  const int64_t V = 1000;
  Tensor logits = random_logits(rng, 4, V, 2.0, false);
  logits.data<float>()[1 * V + 17] = NAN;
  logits.data<float>()[2 * V + 999] = INFINITY;
  for (int64_t i = 0; i < V; ++i) logits.data<float>()[3 * V + i] = -INFINITY;
  std::vector<SampleRowParams> rows(8);
  for (int32_t r = 0; r < 8; ++r) {
    rows[r].logits_row = r % 4, rows[r].num_top = 4, rows[r].want_logprob = true;
    rows[r].temperature = r < 4 ? 0.0f : 0.8f, rows[r].top_p = 0.9f, rows[r].uniform = rng.uniform();
  }
  const Outputs a = run_both(dev, logits, rows, 4), b = run_both(dev, logits, rows, 4);
  ASSERT_EQ(std::memcmp(a.dev.data<const float>(), b.dev.data<const float>(), static_cast<size_t>(a.dev.nbytes())), 0)
      << "two runs differ";
  for (int r = 0; r < 8; ++r) {
    const float* d = a.dev.data<const float>() + r * 10;
    if (r % 4 == 0) {
      EXPECT_EQ(d[0], a.cpu.data<const float>()[r * 10]) << "row " << r;
      continue;
    }
    EXPECT_EQ(d[kernels::kOutToken], -1.0f) << "row " << r;
    EXPECT_TRUE(std::isnan(d[kernels::kOutLogprob])) << "row " << r;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(d[kernels::kOutTopIds + j], -1.0f) << "row " << r;
  }
}

// K3's vocabulary: greedy and sampled rows mixed as a decode batch is, rows 1, 7 and 64, N = 20.
TEST(OpsTp8, SampleK3Vocabulary) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  const int64_t V = 163840, N = kernels::kMaxTopLogprobs;
  int disagreements = 0, total = 0;
  for (int64_t R : {1, 7, 64}) {
    const Tensor logits = random_logits(rng, R, V, 3.0, false);
    std::vector<SampleRowParams> rows(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
      SampleRowParams& p = rows[r];
      p.logits_row = static_cast<int32_t>(r);
      p.temperature = r % 3 == 0 ? 0.0f : 0.7f;
      p.top_k = r % 4 == 1 ? 50 : 0;
      p.top_p = r % 5 == 2 ? 0.95f : 1.0f;
      p.min_p = r % 7 == 3 ? 0.02f : 0.0f;
      p.num_top = static_cast<int32_t>(r % (N + 1));
      p.want_logprob = true;
      p.uniform = rng.uniform();
    }
    const Outputs o = run_both(dev, logits, rows, N);
    expect_same_logprobs(o, rows, N, "K3 R " + std::to_string(R));
    for (int64_t r = 0; r < R; ++r) {
      const float c = o.cpu.data<const float>()[r * (2 + 2 * N)], g = o.dev.data<const float>()[r * (2 + 2 * N)];
      ++total;
      if (rows[r].temperature == 0.0f) {
        EXPECT_EQ(g, c) << "greedy row " << r;
      } else if (g != c) {
        ++disagreements;
        EXPECT_TRUE(at_a_boundary(logits.data<const float>() + r * V, V, rows[r], static_cast<int32_t>(g), 1e-6))
            << "row " << r << ": device " << g << ", reference " << c;
      }
    }
  }
  EXPECT_LE(disagreements, 1) << disagreements << " of " << total << " K3 rows differ";
}

}  // namespace
}  // namespace k3::ops_test

namespace k3::ops_test {
namespace {

// token_mask: every listed row's refused ids become -inf, nothing else changes, bit for bit the
// reference; odd vocabularies (a partial last word) and K3's.
TEST(OpsOdd, TokenMaskMatchesTheReference) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  for (int64_t V : {1, 17, 33, 1000, 163840})
    for (int64_t R : {1, 3}) {
      const int64_t rows = R + 2, words = (V + 31) / 32;
      const Tensor logits = random_logits(rng, rows, V, 2.0, false);
      Tensor masks = Tensor::zeros(DType::i32, {R, words});
      for (int64_t i = 0; i < R * words; ++i) masks.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64());
      Tensor which = Tensor::zeros(DType::i32, {R});
      for (int64_t r = 0; r < R; ++r) which.data<int32_t>()[r] = static_cast<int32_t>(rows - 1 - 2 * r);
      Tensor want = copy(logits);
      cpu_registry().token_mask.run({want.view(), masks.view(), which.view()}, core::Device::cpu);
      const Tensor d_logits = dev->upload(logits), d_masks = dev->upload(masks), d_rows = dev->upload(which);
      const kernels::TokenMaskArgs args{d_logits.view(), d_masks.view(), d_rows.view()};
      expect_device_impl(dev->registry().token_mask, args, dev);
      dev->registry().token_mask.run(args, dev->kind());
      const Tensor got = dev->to_host_f32(d_logits.view());
      ASSERT_EQ(std::memcmp(got.data<const float>(), want.data<const float>(), static_cast<size_t>(rows * V) * 4), 0)
          << "V " << V << " R " << R;
      int64_t masked = 0;
      for (int64_t i = 0; i < rows * V; ++i) masked += std::isinf(want.data<const float>()[i]);
      if (V > 32) EXPECT_GT(masked, 0) << "the random masks refuse some ids";
    }
}

}  // namespace
}  // namespace k3::ops_test
