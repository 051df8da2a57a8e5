// kernels/moe/moe_grouped_ops_test.cpp: the routed experts' grouped strategy ("cuda_expert_grouped":
// bf16 activations, MXFP4 experts, 1..64 tokens, each touched expert read once per call) against
// the CPU reference, at the shapes of cases.h. Batches 1..16 run it by name (the registry picks the
// GEMV there), 17..64 assert that the registry picks it; one TP8 rank's shapes (896 experts, top-16,
// L 3584, I 384), odd widths (L 32 / 96 / 2080, I 32 / 96 / 160), one expert, few experts (groups of
// up to 64 routes: several passes of 8), k 1 to 64 and k = E, strided z / out rows, unrounded partial
// sums, bad ids (NaN rows), bitwise identity run to run and across batches (a token's row does not
// depend on the tokens beside it), and what it refuses (f32 activations, more than 64 tokens or
// routes, misaligned z rows) reaching the strategy the bounds name.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/moe/moe_ops_test_util.h"

namespace k3::ops_test {
namespace {

constexpr const char* kGrouped = "cuda_expert_grouped";
constexpr const char* kGemv = "cuda_expert_gemv";

// One case in bf16 activations against the CPU reference (moe_ops_test_util.h): the grouped strategy
// by name (batches where the registry picks another) or through the registry, asserting it picks it.
void check_grouped(Device* dev, const Experts& ex, const ExpertsCase& c, uint64_t seed, RunAs how,
                   const std::vector<BadId>& bad = {}) {
  check_experts_case(dev, kExpertsModes[0], ex, c, seed, kGrouped, bad, how);
}

// Batches the GEMV takes by name, the rest through the registry.
RunAs run_for(int64_t T) { return T <= kernels::kMoeExpertsGemvMaxTokens ? RunAs::by_name : RunAs::selected; }

// The stated order (runs without a GPU too): the GEMV keeps batches 1..16 and the grouped form
// takes 17..64 (tuning/default.json; the bounds in cases.h), ahead of the MXFP4 and row-dot strategies.
TEST(OpsOdd, MoeExpertsGroupedIsOrderedBetweenTheGemvAndTheRest) {
  const kernels::Tuning t = kernels::builtin_tuning("");
  ASSERT_NE(t.fallback, nullptr);
  const int64_t gemv_max = kernels::kMoeExpertsGemvMaxTokens, grouped_max = kernels::kMoeExpertsGroupedMaxTokens;
  for (int64_t T : {int64_t{1}, gemv_max}) EXPECT_EQ(t.fallback->find("moe_experts", T)->order.at(0), kGemv) << T;
  for (int64_t T : {gemv_max + 1, grouped_max})
    EXPECT_EQ(t.fallback->find("moe_experts", T)->order.at(0), kGrouped) << T;
  const auto& large = t.fallback->find("moe_experts", grouped_max + 1)->order;
  EXPECT_EQ(large.at(0), "cuda_expert_fp4_mma");
}

// One TP8 rank (cases.h kMoeExpertsK3Tp8) at the K3 token counts it takes; at the counts the registry
// gives it, also the [T, L | hidden] partial sums and strided z and out rows.
TEST(OpsTp8, MoeExpertsGroupedMxfp4Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Tp8;
  const Experts ex(dev, rng, s);
  const int64_t k = s.topk[0];
  uint64_t seed = 9100;
  for (int64_t T : kernels::kMoeK3Tokens) {
    if (T > kernels::kMoeExpertsGroupedMaxTokens) break;
    check_grouped(dev, ex, {T, k}, ++seed, run_for(T));
    if (run_for(T) == RunAs::by_name) continue;
    check_grouped(dev, ex, {T, k, false, 0, kernels::kMoeTailK3Tp8.hidden}, ++seed, RunAs::selected);
    check_grouped(dev, ex, {T, k, true, 8, 3}, ++seed, RunAs::selected);
  }
}

// cases.h kMoeExpertsMxfp4OddShapes at every kind of batch.
TEST(OpsOdd, MoeExpertsGroupedOddShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  uint64_t seed = 9300;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsMxfp4OddShapes) {
    const Experts ex(dev, rng, s);
    for (int64_t T : kernels::kMoeExpertsGroupedTokens)
      for (int64_t k : s.topk) check_grouped(dev, ex, {T, k}, ++seed, run_for(T));
  }
}

// cases.h kMoeExpertsLargeGroupShapes (few experts: groups of many routes, several passes of 8) at every
// kind of batch, and unrounded into a strided out at the largest.
TEST(OpsOdd, MoeExpertsGroupedLargeGroups) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  uint64_t seed = 9500;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsLargeGroupShapes) {
    const Experts ex(dev, rng, s);
    for (int64_t k : s.topk) {
      for (int64_t T : kernels::kMoeExpertsGroupedTokens) check_grouped(dev, ex, {T, k}, ++seed, run_for(T));
      check_grouped(dev, ex, {kernels::kMoeExpertsGroupedMaxTokens, k, false, 0, 5}, ++seed, RunAs::selected);
    }
  }
}

// Strided z rows (16-byte multiples) and out rows, rounded and unrounded outputs.
TEST(OpsOdd, MoeExpertsGroupedStridedRows) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9600);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsStridedShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 9700;
  for (bool round_output : {true, false})
    for (int64_t T : kernels::kMoeExpertsGroupedTokens)
      for (int64_t k : s.topk) {
        check_grouped(dev, ex, {T, k, round_output, 8, 3}, ++seed, run_for(T));
        check_grouped(dev, ex, {T, k, round_output, 0, 5}, ++seed, run_for(T));
      }
}

// A TP rank's unrounded f32 partial sums into the latent block of a packed [T, L | hidden] buffer.
TEST(OpsOdd, MoeExpertsGroupedUnroundedPartial) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9800);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsPartialShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 9900;
  for (int64_t T : kernels::kMoeExpertsGroupedTokens)
    for (int64_t k : s.topk) check_grouped(dev, ex, {T, k, false, 0, 96}, ++seed, run_for(T));
}

// A route id outside [0, E) (the router's NaN marker -1, E, beyond: some_bad_ids) makes its token's row
// NaN; the other tokens' rows (sharing groups with the bad token's valid routes) are unaffected.
TEST(OpsOdd, MoeExpertsGroupedBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10000);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsBadIdShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 10100;
  for (bool round_output : {true, false})
    for (int64_t T : kernels::kMoeExpertsGroupedTokens)
      for (int64_t k : s.topk)
        check_grouped(dev, ex, {T, k, round_output, 0, 2}, ++seed, run_for(T), some_bad_ids(T, k, s.E));
}

// Bitwise identity: the same call three times (the sort's groups and route order come from atomics;
// no bit may depend on them), and a token's row in a batch of 64 equals its row in a batch of the
// first 17 tokens (other groups, other pass positions). One TP8 rank and cases.h
// kMoeExpertsLargeGroupShapes (groups of many routes).
TEST(OpsTp8, MoeExpertsGroupedBitwiseRunToRunAndAcrossBatches) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10200);
  std::vector<kernels::MoeExpertsShape> shapes = {kernels::kMoeExpertsK3Tp8};
  shapes.insert(shapes.end(), std::begin(kernels::kMoeExpertsLargeGroupShapes),
                std::end(kernels::kMoeExpertsLargeGroupShapes));
  const int64_t T = kernels::kMoeExpertsGroupedMaxTokens, T_first = kernels::kMoeExpertsGemvMaxTokens + 1;
  for (const kernels::MoeExpertsShape& s : shapes) {
    const Experts ex(dev, rng, s);
    for (int64_t k : s.topk) {
      const Tensor z = random_act(rng, {T, s.L}, Mode::bf16, 0.0, 2.0);
      Tensor ids, weights;
      random_routes(rng, T, s.E, k, ids, weights);
      Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
      const auto first_rows = [](const Tensor& t, int64_t rows) {
        TensorView v = t.view();
        v.shape = Shape{rows, t.dim(1)};
        return v;
      };
      std::vector<Tensor> got;
      for (int64_t rows : {T, T, T, T_first}) {
        Tensor out = dev->poisoned(DType::bf16, {rows, s.L});
        const kernels::MoeExpertsArgs args{
            first_rows(dz, rows), first_rows(d_ids, rows), first_rows(d_w, rows), ex.dw1, ex.dw3, ex.dw2, out.view()};
        ASSERT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, kGrouped) << s.name << " T " << rows;
        dev->registry().moe_experts.run(args, dev->kind());
        got.push_back(dev->to_host(out.view()));
      }
      const auto bits = [](const Tensor& t) { return t.span<const uint16_t>(); };
      for (int run = 1; run < 3; ++run)
        EXPECT_TRUE(std::equal(bits(got[0]).begin(), bits(got[0]).end(), bits(got[run]).begin()))
            << s.name << " k " << k << ": run " << run << " differs from run 0";
      EXPECT_TRUE(std::equal(bits(got[3]).begin(), bits(got[3]).end(), bits(got[0]).begin()))
          << s.name << " k " << k << ": the first " << T_first << " tokens' rows differ between batches of " << T
          << " and " << T_first;
    }
  }
}

// What the grouped strategy refuses reaches the strategy the bounds name (mxfp4_strategy; cases.h
// kMoeExpertsRouteBoundShape at kMoeExpertsBoundTokens): f32 activations (with a reason naming bf16),
// more than 64 tokens or routes, z rows not 16-byte multiples apart. (moe_ops_test.cpp compares the
// results of the same cases with the CPU reference.)
TEST(OpsOdd, MoeExpertsGroupedRefusalsTakeRowdot) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10300);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsRouteBoundShape;
  const Experts ex(dev, rng, s);
  const auto& grouped = moe_impl_named(dev, kGrouped);
  for (int64_t T : kernels::kMoeExpertsBoundTokens)
    for (int64_t k : s.topk) {
      Tensor ids, weights;
      random_routes(rng, T, s.E, k, ids, weights);
      Tensor d_ids = dev->upload(ids), d_w = dev->upload(weights);
      const std::string where = "T " + std::to_string(T) + " k " + std::to_string(k);
      for (const ExpertsMode& gm : kExpertsModes)
        for (bool aligned : {true, false}) {
          // Misaligned: a [T, L + pad] buffer's first L columns, rows 8 bytes off a 16-byte multiple.
          const int64_t pad = aligned ? 0 : gm.act == Mode::bf16 ? 4 : 2;
          const Tensor z = random_act(rng, {T, s.L + pad}, gm.act);
          Tensor dz = dev->act(z, gm.act), out = dev->poisoned(act_dtype(gm.act), {T, s.L});
          const kernels::MoeExpertsArgs args{column_block(dz, 0, s.L),
                                             d_ids.view(),
                                             d_w.view(),
                                             ex.dw1,
                                             ex.dw3,
                                             ex.dw2,
                                             out.view(),
                                             4.0f,
                                             25.0f,
                                             gm.precision};
          const char* want = mxfp4_strategy(gm, T, k, aligned || T == 1);
          const core::Status st = grouped.supports(args);
          EXPECT_EQ(static_cast<bool>(st), gm.act == Mode::bf16 && T <= kernels::kMoeExpertsGroupedMaxTokens &&
                                               k <= kernels::kMoeExpertsMaxTopk && (aligned || T == 1))
              << where << " " << gm.name << (aligned ? "" : " misaligned") << ": " << st.reason();
          if (gm.act != Mode::bf16) {
            EXPECT_NE(st.reason().find("bf16"), std::string::npos) << st.reason();
          }
          EXPECT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, want))
              << where << " " << gm.name << (aligned ? "" : " misaligned");
        }
    }
}

}  // namespace
}  // namespace k3::ops_test
