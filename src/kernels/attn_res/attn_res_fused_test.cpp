// kernels/attn_res/attn_res_fused_test.cpp: the fused AttnRes ops (CPU reference) against a
// direct computation (attn_res_bank) and against the standard add -> attn_res_mix -> rmsnorm
// sequence run through the reference registry (attn_res_merge, one sublayer and a whole block).
#include "kernels/attn_res/attn_res_fused.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/attn_res/cases.h"
#include "kernels/attn_res/fused_test_util.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;
using core::TensorView;
using namespace attn_res_fused_test;

Registry& reference_registry() {
  static Registry r;
  static const bool registered = (register_reference_ops(r), true);
  (void)registered;
  return r;
}

// ---------------------------------------------------------------- attn_res_bank

// acc / stats of one (mix, token) by the spec's formulas: scores in the attn_res_mix order (so
// the stats must match bit for bit), acc summed in double from the same e_j.
void check_bank_against_direct(const std::vector<Tensor>& bank, const MixWeights& w, const Tensor& acc,
                               const Tensor& stats, int m, int64_t t) {
  const int64_t T = bank[0].dim(0), D = bank[0].dim(1);
  const size_t n = bank.size();
  std::vector<float> s(n);
  for (size_t j = 0; j < n; ++j) {
    const float* r = bank[j].data<float>() + t * D;
    float ss = 0.0f, dd = 0.0f;
    for (int64_t h = 0; h < D; ++h) {
      const float c = load_f32(w.norm.view(), h) * load_f32(w.query.view(), h);
      ss += r[h] * r[h];
      dd += r[h] * c;
    }
    s[j] = (1.0f / std::sqrt(ss / static_cast<float>(D) + kEps)) * dd;
  }
  float mx = s[0];
  for (size_t j = 1; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  std::vector<float> e(n);
  for (size_t j = 0; j < n; ++j) sum += (e[j] = std::exp(s[j] - mx));
  const float* st = stats.data<float>() + (m * T + t) * 2;
  EXPECT_EQ(st[0], mx) << "max, mix " << m << " row " << t;
  EXPECT_EQ(st[1], sum) << "sum, mix " << m << " row " << t;
  const float* a = acc.data<float>() + (m * T + t) * D;
  double err = 0.0, ref = 0.0;
  for (int64_t h = 0; h < D; ++h) {
    double want = 0.0;
    for (size_t j = 0; j < n; ++j) want += static_cast<double>(e[j]) * bank[j].data<float>()[t * D + h];
    ASSERT_TRUE(std::isfinite(a[h])) << "acc unwritten at mix " << m << " row " << t << " col " << h;
    err = std::max(err, std::abs(a[h] - want));
    ref = std::max(ref, std::abs(want));
  }
  EXPECT_LE(err, 2e-6 * ref) << "acc, mix " << m << " row " << t;
}

TEST(AttnResBank, MatchesTheDirectComputationOnOddShapes) {
  struct Case {
    int n, M;
    int64_t T, D;
  };
  std::vector<Case> cases;
  for (const AttnResShape& s : kAttnResOddShapes)  // kernels/attn_res/cases.h
    for (const int64_t T : kAttnResOddRows) cases.push_back({s.bank_rows, s.mixes, T, s.D});
  for (const Case c : cases) {
    core::Rng rng(100 + c.n * 7 + c.T + c.D);
    const std::vector<Tensor> bank = random_rows(rng, c.n, c.T, c.D);
    std::vector<MixWeights> mixes;
    for (int m = 0; m < c.M; ++m) mixes.push_back(random_mix(rng, c.D, m % 2 == 0 ? DType::bf16 : DType::f32));
    Tensor acc = nan_f32({c.M, c.T, c.D}), stats = nan_f32({c.M, c.T, 2});
    run_bank(reference_registry(), bank, mixes, acc, stats, Precision::fp32);
    for (int m = 0; m < c.M; ++m)
      for (int64_t t = 0; t < c.T; ++t) check_bank_against_direct(bank, mixes[m], acc, stats, m, t);
  }
}

// One TP8 rank's real shapes (AttnRes is replicated: hidden 7168), 9 bank rows, 24 mixes.
TEST(AttnResBank, MatchesTheDirectComputationAtK3Shapes) {
  constexpr int n = kAttnResK3.bank_rows, M = kAttnResK3.mixes;
  constexpr int64_t T = 4, D = kAttnResK3.D;
  core::Rng rng(7);
  const std::vector<Tensor> bank = random_rows(rng, n, T, D);
  std::vector<MixWeights> mixes;
  for (int m = 0; m < M; ++m) mixes.push_back(random_mix(rng, D, DType::bf16));
  Tensor acc = nan_f32({M, T, D}), stats = nan_f32({M, T, 2});
  run_bank(reference_registry(), bank, mixes, acc, stats, Precision::bf16);
  for (int m : {0, 11, 23})
    for (int64_t t = 0; t < T; ++t) check_bank_against_direct(bank, mixes[m], acc, stats, m, t);
  for (float v : acc.span<float>()) ASSERT_TRUE(std::isfinite(v)) << "an acc element was not written";
  for (float v : stats.span<float>()) ASSERT_TRUE(std::isfinite(v)) << "a stats element was not written";
}

// ---------------------------------------------------------------- attn_res_merge vs the standard ops

// One sublayer tail, standard (add, attn_res_mix, rmsnorm through the registry) and fused (bank
// over 3 mixes, this one in the middle, then merge), compared: P_new bit for bit, h and x close.
void merge_case(int n, int64_t T, int64_t D, bool with_a, bool restart, bool alias, Precision p, RmsNormStyle style,
                MergeTally& tally) {
  SCOPED_TRACE("n=" + std::to_string(n) + " T=" + std::to_string(T) + " D=" + std::to_string(D) +
               " a=" + std::to_string(with_a) + " restart=" + std::to_string(restart) +
               " alias=" + std::to_string(alias) + (p == Precision::bf16 ? " bf16" : " fp32"));
  core::Rng rng(static_cast<uint64_t>(n * 1000003 + T * 1009 + D * 7 + with_a * 3 + restart * 5 + alias));
  const std::vector<Tensor> bank = random_rows(rng, n, T, D);
  const Tensor p_old = random_rows(rng, 1, T, D, 2.0)[0];
  const Tensor a = random_rows(rng, 1, T, D, 1.5)[0];
  std::vector<MixWeights> mixes;
  for (int m = 0; m < 3; ++m) mixes.push_back(random_mix(rng, D, DType::bf16));
  const MixWeights& w = mixes[1];
  const Tensor norm_w = random_norm_weight(rng, D);

  const Standard want = run_standard(reference_registry(), bank, p_old, with_a ? &a : nullptr, restart, w, norm_w,
                                     style, p);
  Fused got = run_fused(reference_registry(), bank, mixes, 1, p_old, with_a ? &a : nullptr, restart, w, norm_w, style,
                        p, alias);
  expect_bits_equal(got.prefix, want.prefix, "P_new");
  tally.add(got.mixed, want.mixed, p, "h");
  tally.add(got.normed, want.normed, p, "x");
}

TEST(AttnResMerge, EqualsAddMixRmsnormOnOddAndK3Shapes) {
  MergeTally tally;
  int cases = 0;
  for (const Precision p : {Precision::fp32, Precision::bf16})
    for (const int64_t D : {kAttnResMergeOddWidths[0], kAttnResMergeOddWidths[2], kAttnResK3.D})
      for (const int64_t T : {1, 5, 64})
        for (const int n : kAttnResMergeBankRows)
          for (const bool restart : {false, true}) {
            if (D == kAttnResK3.D && T == 64 && n != 9) continue;  // keeps the run short; n = 9 is the costly one
            const bool alias = (cases % 2) == 1;
            const RmsNormStyle style = (cases % 3) == 2 ? RmsNormStyle::fused : RmsNormStyle::moonshot;
            merge_case(n, T, D, /*with_a=*/true, restart, alias, p, style, tally);
            ++cases;
          }
  // Without a sublayer output: layer 0's attention side (empty bank) and the final Mix (a bank).
  for (const Precision p : {Precision::fp32, Precision::bf16})
    for (const int n : {0, 9})
      merge_case(n, 5, 97, /*with_a=*/false, false, cases++ % 2 == 1, p, RmsNormStyle::moonshot, tally);
  tally.expect_within_contract();
  std::printf("[attn_res_merge] %d cases; %s\n", cases, tally.summary().c_str());
}

// ---------------------------------------------------------------- a whole block

// The AttnRes stream of `layers` layers with block size 12 (bank writes at 0, 12, 24): the
// standard path (Mix per sublayer) against the fast path (attn_res_bank once per bank state for
// every mix that sees it, then one merge per sublayer). Sublayer outputs are random inputs (not
// functions of x), so the prefixes must agree bit for bit and every h, x within the contract.
void block_case(int layers, int64_t T, int64_t D, Precision p, MergeTally& tally) {
  SCOPED_TRACE("layers=" + std::to_string(layers) + " T=" + std::to_string(T) + " D=" + std::to_string(D));
  const StreamResult want = run_stream(reference_registry(), layers, T, D, p, /*fused=*/false);
  const StreamResult got = run_stream(reference_registry(), layers, T, D, p, /*fused=*/true);
  ASSERT_EQ(got.prefix.size(), want.prefix.size());
  EXPECT_GT(got.bank_calls, 0);
  for (size_t i = 0; i < want.prefix.size(); ++i) {
    SCOPED_TRACE("mix " + std::to_string(i));
    expect_bits_equal(got.prefix[i], want.prefix[i], "P");
    tally.add(got.mixed[i], want.mixed[i], p, "h");
    tally.add(got.normed[i], want.normed[i], p, "x");
  }
}

TEST(AttnResFusedStream, ABlockOfMixesFromBankPartialsEqualsTheStandardPath) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    MergeTally tally;
    block_case(/*layers=*/26, /*T=*/5, /*D=*/97, p, tally);    // writes at 0, 12, 24; 53 mixes
    block_case(/*layers=*/13, /*T=*/2, /*D=*/7168, p, tally);  // a full block at K3 width
    tally.expect_within_contract();
    std::printf("[stream %s] %s\n", p == Precision::bf16 ? "bf16" : "fp32", tally.summary().c_str());
  }
}

// ---------------------------------------------------------------- argument checks

TEST(AttnResFusedCheck, BadArgumentsNameWhatIsWrong) {
  core::Rng rng(3);
  const std::vector<Tensor> bank = random_rows(rng, 2, 3, 16);
  const MixWeights w = random_mix(rng, 16, DType::bf16);
  std::vector<TensorView> rows = {bank[0].view(), bank[1].view()};
  std::vector<TensorView> q = {w.query.view()}, nv = {w.norm.view()};
  Tensor acc = nan_f32({1, 3, 16}), stats = nan_f32({1, 3, 2});
  AttnResBankArgs b{rows, q, nv, acc.view(), stats.view()};
  EXPECT_TRUE(attn_res_bank_check(b)) << attn_res_bank_check(b).reason();
  const auto fails_with = [](const core::Status& s, const std::string& what) {
    EXPECT_FALSE(s);
    if (!s) {
      EXPECT_NE(s.reason().find(what), std::string::npos) << s.reason();
    }
  };
  AttnResBankArgs bad = b;
  bad.bank = {};
  fails_with(attn_res_bank_check(bad), "bank must hold");
  bad = b;
  bad.norms = {};
  fails_with(attn_res_bank_check(bad), "norms holds 0");
  Tensor wrong = nan_f32({1, 3, 15});
  bad = b;
  bad.acc = wrong.view();
  fails_with(attn_res_bank_check(bad), "acc must be");
  bad = b;
  bad.acc = bank[0].view();
  fails_with(attn_res_bank_check(bad), "acc must be");

  Tensor p_old = bank[0], a = bank[1], out_p = nan_f32({3, 16}), h = nan_f32({3, 16}), x = nan_f32({3, 16});
  Tensor accm = nan_f32({3, 16}), st = nan_f32({3, 2});
  const Tensor nw = random_norm_weight(rng, 16);
  AttnResMergeArgs m{};
  m.prefix = p_old.view();
  m.sublayer_out = a.view();
  m.bank_acc = accm.view();
  m.bank_stats = st.view();
  m.query = w.query.view();
  m.norm = w.norm.view();
  m.rmsnorm_weight = nw.view();
  m.prefix_out = out_p.view();
  m.mixed_out = h.view();
  m.normed_out = x.view();
  EXPECT_TRUE(attn_res_merge_check(m)) << attn_res_merge_check(m).reason();
  AttnResMergeArgs mb = m;
  mb.sublayer_out = TensorView{};
  mb.restart = true;
  fails_with(attn_res_merge_check(mb), "restart needs sublayer_out");
  mb = m;
  mb.bank_stats = TensorView{};
  fails_with(attn_res_merge_check(mb), "both present");
  mb = m;
  mb.normed_out = h.view();
  fails_with(attn_res_merge_check(mb), "must not overlap");
  mb = m;
  mb.mixed_out = p_old.view();
  fails_with(attn_res_merge_check(mb), "mixed_out overlaps prefix");
  mb = m;
  mb.prefix_out = TensorView{};
  fails_with(attn_res_merge_check(mb), "prefix_out is absent");
  mb = m;
  mb.prefix_out = m.prefix;  // in place: allowed
  EXPECT_TRUE(attn_res_merge_check(mb)) << attn_res_merge_check(mb).reason();
  mb = m;
  mb.bank_stats = wrong.view();
  fails_with(attn_res_merge_check(mb), "bank_stats must be");
  // Selecting through the registry turns a failed check into a core::Error naming the op.
  EXPECT_THROW(reference_registry().attn_res_bank.select(bad, core::Device::cpu), core::Error);
}

}  // namespace
}  // namespace k3::kernels
