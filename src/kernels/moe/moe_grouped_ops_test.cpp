// kernels/moe/moe_grouped_ops_test.cpp: the routed experts' grouped strategy ("cuda_expert_grouped":
// bf16 activations, MXFP4 experts, 1..64 tokens, each touched expert read once per call) against
// the CPU reference. Batches 1..16 run it by name (the registry picks the GEMV there), 17..64
// assert that the registry picks it; TP8 shapes (896 experts, top-16, L 3584, I 384), odd widths
// (L 96 / 2080, I 32 / 160) and few experts (groups of up to 64 routes: several passes of 8), k 1,
// 3, 16, 64, strided z / out rows, unrounded partial sums, bad ids (NaN rows), bitwise identity
// run to run and across batches (a token's row does not depend on the tokens beside it), and what
// it refuses (f32 activations) reaching "cuda_expert_rowdot".
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/moe/moe_ops_test_util.h"

namespace k3::ops_test {
namespace {

constexpr const char* kGrouped = "cuda_expert_grouped";
constexpr const char* kRowdot = "cuda_expert_rowdot";
constexpr const char* kGemv = "cuda_expert_gemv";

// One case in bf16 activations against the CPU reference (moe_test_util.h): the grouped strategy
// by name (batches where the registry picks another) or through the registry, asserting it picks it.
void check_grouped(Device* dev, const Experts& ex, const ExpertsCase& c, uint64_t seed, RunAs how,
                   const std::vector<BadId>& bad = {}) {
  check_experts_case(dev, kExpertsModes[0], ex, c, seed, kGrouped, bad, how);
}

// Batches 1..16 by name, 17..64 through the registry.
RunAs run_for(int64_t T) { return T <= 16 ? RunAs::by_name : RunAs::selected; }

// The stated order (runs without a GPU too): the GEMV keeps batches 1..16 and the grouped form
// takes 17..64 (tuning/default.json), ahead of the MXFP4 and row-dot strategies.
TEST(OpsOdd, MoeExpertsGroupedIsOrderedBetweenTheGemvAndTheRest) {
  const kernels::Tuning t = kernels::builtin_tuning("");
  ASSERT_NE(t.fallback, nullptr);
  for (int64_t T : {1, 16}) EXPECT_EQ(t.fallback->find("moe_experts", T)->order.at(0), kGemv) << T;
  for (int64_t T : {17, 64}) EXPECT_EQ(t.fallback->find("moe_experts", T)->order.at(0), kGrouped) << T;
  const auto& large = t.fallback->find("moe_experts", 65)->order;
  EXPECT_EQ(large.at(0), "cuda_expert_fp4_mma");
}

// The k3-layer-tp8 rank's expert shapes: 896 experts (32 weight sets), top-16.
TEST(OpsTp8, MoeExpertsGroupedMxfp4Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  const Experts ex(dev, rng, 896, 32, 3584, 384);
  uint64_t seed = 9100;
  for (int64_t T : {1, 8, 16, 17, 33, 64}) check_grouped(dev, ex, {T, 16}, ++seed, run_for(T));
  check_grouped(dev, ex, {32, 16, false, 0, 7168}, ++seed, RunAs::selected);  // [T, L | hidden] partial sums
  check_grouped(dev, ex, {17, 16, true, 8, 3}, ++seed, RunAs::selected);      // strided z and out rows
}

// Odd widths (L = 96 is 3 chunks: one step, lane 3 idle, the second slice idle; 2080 is 65 chunks;
// I = 32 is one chunk, 160 is five) at every kind of batch, k 1, 3, 16.
TEST(OpsOdd, MoeExpertsGroupedOddShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  const Experts narrow(dev, rng, 20, 20, 96, 160);
  const Experts wide(dev, rng, 20, 10, 2080, 32);
  uint64_t seed = 9300;
  for (int64_t T : {1, 2, 7, 16, 17, 33, 64})
    for (int64_t k : {1, 3, 16}) {
      check_grouped(dev, narrow, {T, k}, ++seed, run_for(T));
      check_grouped(dev, wide, {T, k}, ++seed, run_for(T));
    }
}

// Few experts, so groups hold many routes and take several passes of 8: E = 5, k = 3 at batch 64
// (~38 routes a group), k = 5 (every token on every expert: 64-route groups), E = 2 (k = 1: one
// or two groups of ~32), E = 70 with k = 64 (the largest k).
TEST(OpsOdd, MoeExpertsGroupedLargeGroups) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  const Experts five(dev, rng, 5, 5, 224, 64);
  const Experts two(dev, rng, 2, 2, 96, 96);
  const Experts seventy(dev, rng, 70, 10, 96, 64);
  uint64_t seed = 9500;
  for (int64_t T : {9, 17, 64}) {
    check_grouped(dev, five, {T, 3}, ++seed, run_for(T));
    check_grouped(dev, five, {T, 5}, ++seed, run_for(T));
    check_grouped(dev, two, {T, 1}, ++seed, run_for(T));
  }
  check_grouped(dev, five, {64, 3, false, 0, 5}, ++seed, RunAs::selected);
  check_grouped(dev, seventy, {2, 64}, ++seed, RunAs::by_name);
  check_grouped(dev, seventy, {20, 64}, ++seed, RunAs::selected);
}

// Strided z rows (16-byte multiples) and out rows, rounded and unrounded outputs.
TEST(OpsOdd, MoeExpertsGroupedStridedRows) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9600);
  const Experts ex(dev, rng, 12, 12, 224, 96);
  uint64_t seed = 9700;
  for (bool round_output : {true, false})
    for (int64_t T : {1, 5, 16, 17, 40, 64}) {
      check_grouped(dev, ex, {T, 3, round_output, 8, 3}, ++seed, run_for(T));
      check_grouped(dev, ex, {T, 12, round_output, 0, 5}, ++seed, run_for(T));
    }
}

// A TP rank's unrounded f32 partial sums into the latent block of a packed [T, L | hidden] buffer.
TEST(OpsOdd, MoeExpertsGroupedUnroundedPartial) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9800);
  const Experts ex(dev, rng, 18, 18, 160, 64);
  uint64_t seed = 9900;
  for (int64_t T : {1, 2, 16, 17, 64})
    for (int64_t k : {1, 16}) check_grouped(dev, ex, {T, k, false, 0, 96}, ++seed, run_for(T));
}

// A route id outside [0, E) (the router's NaN marker -1, or E) makes its token's row NaN; the
// other tokens' rows (sharing groups with the bad token's valid routes) are unaffected.
TEST(OpsOdd, MoeExpertsGroupedBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10000);
  const Experts ex(dev, rng, 9, 9, 96, 64);
  uint64_t seed = 10100;
  for (bool round_output : {true, false}) {
    check_grouped(dev, ex, {3, 2, round_output}, ++seed, RunAs::by_name, {{1, 0, -1}});
    check_grouped(dev, ex, {1, 3, round_output}, ++seed, RunAs::by_name, {{0, 2, 9}});
    check_grouped(dev, ex, {17, 4, round_output, 0, 2}, ++seed, RunAs::selected, {{0, 3, -1}, {7, 0, 9}, {16, 1, 100}});
    check_grouped(dev, ex, {64, 3, round_output}, ++seed, RunAs::selected, {{63, 2, -1}});
  }
}

// Bitwise identity: the same call three times (the sort's groups and route order come from atomics;
// no bit may depend on them), and a token's row in a batch of 64 equals its row in a batch of the
// first 17 tokens (other groups, other pass positions). TP8 shapes with 8 weight sets, and 5
// experts (groups of ~38 routes).
TEST(OpsTp8, MoeExpertsGroupedBitwiseRunToRunAndAcrossBatches) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10200);
  const Experts tp8(dev, rng, 896, 8, 3584, 384);
  const Experts five(dev, rng, 5, 5, 224, 64);
  for (const Experts* ex : {&tp8, &five}) {
    const int64_t T = 64, E = ex->E(), L = ex->L(), k = E > 16 ? 16 : 3;
    const Tensor z = random_act(rng, {T, L}, Mode::bf16, 0.0, 2.0);
    Tensor ids, weights;
    random_routes(rng, T, E, k, ids, weights);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    const auto first_rows = [](const Tensor& t, int64_t rows) {
      TensorView v = t.view();
      v.shape = Shape{rows, t.dim(1)};
      return v;
    };
    std::vector<Tensor> got;
    for (int64_t rows : {T, T, T, int64_t{17}}) {
      Tensor out = dev->poisoned(DType::bf16, {rows, L});
      const kernels::MoeExpertsArgs args{
          first_rows(dz, rows), first_rows(d_ids, rows), first_rows(d_w, rows), ex->dw1, ex->dw3, ex->dw2, out.view()};
      ASSERT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, kGrouped) << "T " << rows;
      dev->registry().moe_experts.run(args, dev->kind());
      got.push_back(dev->to_host(out.view()));
    }
    const auto bits = [](const Tensor& t) { return t.span<const uint16_t>(); };
    for (int run = 1; run < 3; ++run)
      EXPECT_TRUE(std::equal(bits(got[0]).begin(), bits(got[0]).end(), bits(got[run]).begin()))
          << "E " << E << ": run " << run << " differs from run 0";
    EXPECT_TRUE(std::equal(bits(got[3]).begin(), bits(got[3]).end(), bits(got[0]).begin()))
        << "E " << E << ": the first 17 tokens' rows differ between batches of 64 and 17";
  }
}

// What the grouped strategy refuses reaches the rowdot strategy: f32 activations (with a reason
// naming bf16), more than 64 tokens, z rows not 16-byte multiples apart.
TEST(OpsOdd, MoeExpertsGroupedRefusalsTakeRowdot) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(10300);
  const Experts ex(dev, rng, 12, 12, 96, 64);
  const auto args_for = [&](const Tensor& dz, const Tensor& d_ids, const Tensor& d_w, const Tensor& out, Precision p) {
    return kernels::MoeExpertsArgs{dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3,
                                   ex.dw2,    out.view(),   4.0f,       25.0f,  p};
  };
  for (int64_t T : {17, 64}) {
    const Tensor z = random_act(rng, {T, 96}, Mode::fp32);
    Tensor ids, weights;
    random_routes(rng, T, 12, 3, ids, weights);
    Tensor d_ids = dev->upload(ids), d_w = dev->upload(weights);
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      Tensor dz = dev->upload(z, DType::f32), out = dev->poisoned(DType::f32, {T, 96});
      const kernels::MoeExpertsArgs args = args_for(dz, d_ids, d_w, out, p);
      const core::Status s = moe_impl_named(dev, kGrouped).supports(args);
      ASSERT_FALSE(s) << "f32 activations were taken";
      EXPECT_NE(s.reason().find("bf16"), std::string::npos) << s.reason();
      EXPECT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, kRowdot))
          << "T " << T;
    }
  }
  // 65 tokens and misaligned z rows, through the harness's comparison on the rowdot strategy.
  {
    const int64_t T = 65;
    const Tensor z = random_act(rng, {T, 96}, Mode::bf16);
    Tensor ids, weights;
    random_routes(rng, T, 12, 3, ids, weights);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    Tensor out = dev->poisoned(DType::bf16, {T, 96});
    const kernels::MoeExpertsArgs args = args_for(dz, d_ids, d_w, out, Precision::bf16);
    EXPECT_FALSE(moe_impl_named(dev, kGrouped).supports(args));
    EXPECT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, kRowdot));
  }
  {
    const int64_t T = 20;
    const Tensor z = random_act(rng, {T, 100}, Mode::bf16);  // rows 200 bytes apart
    Tensor ids, weights;
    random_routes(rng, T, 12, 3, ids, weights);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    Tensor out = dev->poisoned(DType::bf16, {T, 96});
    kernels::MoeExpertsArgs args = args_for(dz, d_ids, d_w, out, Precision::bf16);
    args.z = column_block(dz, 0, 96);
    EXPECT_FALSE(moe_impl_named(dev, kGrouped).supports(args));
    EXPECT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, kRowdot));
  }
}

}  // namespace
}  // namespace k3::ops_test
