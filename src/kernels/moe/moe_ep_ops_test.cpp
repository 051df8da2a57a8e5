// kernels/moe/moe_ep_ops_test.cpp: the routed experts under expert parallelism (MoeExpertsArgs
// expert_begin / num_experts / whole_experts; spec §11 "EP variant", the all-reduce form): a rank holds
// whole experts [rank * E / ep, (rank + 1) * E / ep) of E, ids stay global, and its output is the
// unrounded f32 partial sum over the routes it holds (e_j rounded as at TP=1 in bf16). Every CUDA
// strategy ("cuda_expert_gemv", "cuda_expert_grouped", "cuda_expert_rowdot" with its MXFP4 tensor-core
// and CUDA-core kernels in the route and sorted forms, and its generic row-dot kernels for bf16 experts)
// runs by name against the CPU reference's partial for the same rank: random odd shapes and the TP8
// shapes (896 experts, top-16, L 3584; I 384 per the TP8 expert shard, plus one whole-expert I 3072
// case), in the three activation modes. Also: tokens none of whose routes the rank holds come back as
// exact zeros, bad ids (outside [0, E), not merely another rank's) as NaN rows, the out view's pad
// columns keep their NaN poison, and the sorted forms are identical run to run.
#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kernels/moe/moe_ops_test_util.h"

namespace k3::ops_test {
namespace {

constexpr const char* kGemv = "cuda_expert_gemv";
constexpr const char* kGrouped = "cuda_expert_grouped";
constexpr const char* kRowdot = "cuda_expert_rowdot";

struct EpCase {
  int64_t T, k;
  int rank, ep;
  int64_t out_pad = 0;  // extra f32 columns beside out (the [T, L | hidden] partial buffer)
};

// Runs rank c.rank of c.ep on the device with strategy `impl` (by name: it must support the case;
// with `expect_selected` the registry must also pick it) and compares with the CPU reference's
// partial for the same rank. `bad` ids are written over the device's ids only: those tokens must be
// NaN rows, the rest as the reference computes them with the original ids.
void check_ep_case(Device* dev, const ExpertsMode& mode, const Experts& ex, const EpCase& c, uint64_t seed,
                   const std::string& impl, const std::vector<BadId>& bad = {}, bool expect_selected = false) {
  core::Rng rng(seed);
  const int64_t E = ex.E(), L = ex.L(), I = ex.I(), T = c.T, k = c.k;
  ASSERT_EQ(E % c.ep, 0) << "the test's expert count must split evenly";
  const int64_t held = E / c.ep, begin = c.rank * held;
  const Tensor z = random_act(rng, {T, L}, mode.act, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, T, E, k, ids, weights);
  const auto part = [&](const std::vector<kernels::LinearWeight>& w) {
    return std::span<const kernels::LinearWeight>(w).subspan(static_cast<size_t>(begin), static_cast<size_t>(held));
  };
  kernels::MoeExpertsArgs cpu{z.view(),    ids.view(),     weights.view(),        part(ex.w1),
                              part(ex.w3), part(ex.w2),    TensorView{},          4.0f,
                              25.0f,       mode.precision, /*round_output=*/false};
  cpu.expert_begin = begin, cpu.num_experts = E, cpu.whole_experts = true;
  Tensor want = nan_tensor({T, L});
  cpu.out = want.view();
  cpu_registry().moe_experts.run(cpu, core::Device::cpu);

  Tensor bad_ids = copy(ids);
  std::vector<bool> bad_token(static_cast<size_t>(T), false);
  for (const BadId& b : bad) {
    bad_ids.data<int32_t>()[b.t * k + b.j] = b.id;
    bad_token[static_cast<size_t>(b.t)] = true;
  }
  Tensor dz = dev->act(z, mode.act), d_ids = dev->upload(bad_ids), d_w = dev->upload(weights);
  Tensor out = dev->poisoned(DType::f32, {T, L + c.out_pad});
  kernels::MoeExpertsArgs args{
      dz.view(), d_ids.view(), d_w.view(),     part(ex.dw1), part(ex.dw3), part(ex.dw2), column_block(out, 0, L),
      4.0f,      25.0f,        mode.precision, false};
  args.expert_begin = begin, args.num_experts = E, args.whole_experts = true;
  const std::string shape = shape_str({T, E, k, L, I});
  const std::string where = shape + " " + mode.name + " rank " + std::to_string(c.rank) + "/" + std::to_string(c.ep);
  if (expect_selected) {
    ASSERT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, impl)) << where;
  }
  const auto& named = moe_impl_named(dev,
                                     expected_moe_impl(dev, args, impl));  // the MXFP4 forms run where they take it
  const core::Status s = named.supports(args);
  ASSERT_TRUE(s) << where << ": " << s.reason();
  named.run(args);
  const Tensor got_full = dev->to_host_f32(out.view());
  Tensor got = copy_rows(column_block(got_full, 0, L));

  int64_t pad_written = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = L; l < L + c.out_pad; ++l)
      pad_written += !std::isnan(got_full.data<float>()[t * (L + c.out_pad) + l]);
  EXPECT_EQ(pad_written, 0) << where << ": out columns beside the op's view were written";
  int64_t empty_tokens = 0;
  for (int64_t t = 0; t < T; ++t) {
    float* g = got.data<float>() + t * L;
    float* w = want.data<float>() + t * L;
    if (bad_token[static_cast<size_t>(t)]) {
      int64_t nan_count = 0;
      for (int64_t l = 0; l < L; ++l) nan_count += std::isnan(g[l]);
      EXPECT_EQ(nan_count, L) << where << ": token " << t << " has a bad id, its row must be NaN";
      std::fill_n(g, L, 0.0f), std::fill_n(w, L, 0.0f);  // out of the comparison
      continue;
    }
    int64_t held_routes = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids.data<int32_t>()[t * k + j];
      held_routes += id >= begin && id < begin + held;
    }
    if (held_routes > 0) continue;
    ++empty_tokens;  // none of its routes is held: exactly +0 everywhere, as the reference
    int64_t nonzero = 0;
    for (int64_t l = 0; l < L; ++l) nonzero += std::bit_cast<uint32_t>(g[l]) != 0u;
    EXPECT_EQ(nonzero, 0) << where << ": token " << t << " has no held route, its row must be 0";
  }
  const std::string what = std::string(mode.name) + "_ep" + std::to_string(c.ep) + "_k" + std::to_string(k) +
                           (bad.empty() ? "" : "_badid") + (c.out_pad ? "_outld" : "") +
                           (empty_tokens ? "_empty" + std::to_string(empty_tokens) : "");
  expect_close(std::string("moe_experts_ep/") + impl, shape, mode.tol, what, got, want, tol_reduction(mode.tol));
}

// The ranks the odd-shape tests take of an ep-way split: first, one inside, last.
std::vector<int> some_ranks(int ep) {
  return ep <= 2 ? std::vector<int>{0, ep - 1} : std::vector<int>{0, ep / 2, ep - 1};
}

// The MXFP4 strategies at odd widths (L 96 = 3 chunks, I 160 = 5 chunks), 24 experts split 2, 4 and
// 8 ways (12, 6, 3 per rank), k 3 and 16: the GEMV at 1..16 tokens, the grouped kernels (bf16) at
// 1..64, the rowdot strategy's route form (<= 256 routes) and sorted form (97 tokens) in every mode.
TEST(OpsOdd, MoeExpertsEpEveryStrategy) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  const Experts ex(dev, rng, 24, 24, 96, 160, true);
  uint64_t seed = 9100;
  for (int ep : {2, 4, 8})
    for (int rank : some_ranks(ep))
      for (int64_t k : {3, 16}) {
        for (const ExpertsMode& gm : kExpertsModes) {
          for (int64_t T : {1, 5, 16}) check_ep_case(dev, gm, ex, {T, k, rank, ep}, ++seed, kGemv);
          for (int64_t T : {1, 7, 97}) check_ep_case(dev, gm, ex, {T, k, rank, ep}, ++seed, kRowdot);
        }
        for (int64_t T : {1, 17, 64}) check_ep_case(dev, kExpertsModes[0], ex, {T, k, rank, ep}, ++seed, kGrouped);
      }
}

// The rowdot strategy's generic row-dot kernels (bf16 experts, odd widths L 54, I 17), every mode.
TEST(OpsOdd, MoeExpertsEpRowdotBf16Experts) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9200);
  const Experts ex(dev, rng, 12, 12, 54, 17, false);
  uint64_t seed = 9300;
  for (const ExpertsMode& gm : kExpertsModes)
    for (int ep : {2, 4})
      for (int rank : some_ranks(ep))
        for (int64_t T : {1, 17, 97}) check_ep_case(dev, gm, ex, {T, 3, rank, ep}, ++seed, kRowdot, {}, true);
}

// Bad ids (the router's -1, E, far beyond) make their tokens' rows NaN on every strategy, whichever
// rank holds the token's other routes; strided out rows (the packed partial buffer) keep their pad.
TEST(OpsOdd, MoeExpertsEpBadIdsAndStridedOut) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  const Experts ex(dev, rng, 16, 16, 96, 64, true);
  uint64_t seed = 9500;
  const std::vector<BadId> bad = {{0, 2, -1}, {3, 0, 16}, {4, 1, 1000}};
  for (int rank : {0, 3}) {
    for (const ExpertsMode& gm : kExpertsModes) {
      check_ep_case(dev, gm, ex, {5, 3, rank, 4, 7}, ++seed, kGemv, bad);
      check_ep_case(dev, gm, ex, {5, 3, rank, 4, 7}, ++seed, kRowdot, bad);    // route form
      check_ep_case(dev, gm, ex, {120, 3, rank, 4, 7}, ++seed, kRowdot, bad);  // sorted form (360 routes)
    }
    check_ep_case(dev, kExpertsModes[0], ex, {5, 3, rank, 4, 7}, ++seed, kGrouped, bad);
    check_ep_case(dev, kExpertsModes[0], ex, {40, 3, rank, 4, 7}, ++seed, kGrouped, bad);
  }
}

// EP8 at the real expert count and top-k (896 experts, top-16, L 3584: 112 experts per rank) with
// the TP8 shard's I 384 to keep the run small, first and last rank: the GEMV (selected) at 1..16
// tokens, the grouped kernels (selected) at 17 and 64, the rowdot forms in f32 and bf16 (64 tokens:
// the sorted tensor-core form), the [T, L | hidden] partial buffer; the sorted forms twice, bitwise.
TEST(OpsTp8, MoeExpertsEp8Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9600);
  const Experts ex(dev, rng, 896, 16, 3584, 384, true);
  uint64_t seed = 9700;
  for (int rank : {0, 7}) {
    for (int64_t T : {1, 8, 16}) check_ep_case(dev, kExpertsModes[0], ex, {T, 16, rank, 8}, ++seed, kGemv, {}, true);
    check_ep_case(dev, kExpertsModes[1], ex, {8, 16, rank, 8}, ++seed, kGemv);
    check_ep_case(dev, kExpertsModes[2], ex, {1, 16, rank, 8}, ++seed, kGemv);
    check_ep_case(dev, kExpertsModes[0], ex, {8, 16, rank, 8, 7168}, ++seed, kGemv);
    for (int64_t T : {17, 64}) check_ep_case(dev, kExpertsModes[0], ex, {T, 16, rank, 8}, ++seed, kGrouped, {}, true);
    check_ep_case(dev, kExpertsModes[0], ex, {64, 16, rank, 8}, ++seed, kRowdot);
    check_ep_case(dev, kExpertsModes[1], ex, {8, 16, rank, 8}, ++seed, kRowdot);
  }
  // Run to run: the sorts place routes with atomics; no bit may depend on their order.
  const Tensor z = random_act(rng, {64, 3584}, Mode::bf16, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, 64, 896, 16, ids, weights);
  Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  const auto part = [](const std::vector<kernels::LinearWeight>& w) {
    return std::span<const kernels::LinearWeight>(w).subspan(112, 112);
  };
  for (const char* impl : {kGrouped, kRowdot}) {
    std::vector<Tensor> got;
    for (int run = 0; run < 3; ++run) {
      Tensor out = dev->poisoned(DType::f32, {64, 3584});
      kernels::MoeExpertsArgs a{dz.view(),  d_ids.view(), d_w.view(), part(ex.dw1),    part(ex.dw3), part(ex.dw2),
                                out.view(), 4.0f,         25.0f,      Precision::bf16, false};
      a.expert_begin = 112, a.num_experts = 896, a.whole_experts = true;
      moe_impl_named(dev, impl).run(a);
      got.push_back(dev->to_host(out.view()));
    }
    for (int run = 1; run < 3; ++run)
      EXPECT_TRUE(std::equal(got[0].span<const uint32_t>().begin(), got[0].span<const uint32_t>().end(),
                             got[run].span<const uint32_t>().begin()))
          << impl << ": run " << run << " differs from run 0";
  }
}

// One case at the real EP8 rank's shapes: whole experts (I 3072), 112 of 896, top-16, L 3584. The
// GEMV's shared-memory budget (k * I bf16 h rows) refuses I 3072, so bf16 batches select the grouped
// kernels; f32 activations take the rowdot strategy's CUDA-core kernels.
TEST(OpsTp8, MoeExpertsEp8WholeExpertShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9800);
  const Experts ex(dev, rng, 896, 4, 3584, 3072, true);
  uint64_t seed = 9900;
  check_ep_case(dev, kExpertsModes[0], ex, {1, 16, 3, 8}, ++seed, kGrouped, {}, true);
  check_ep_case(dev, kExpertsModes[0], ex, {16, 16, 5, 8}, ++seed, kGrouped, {}, true);
  check_ep_case(dev, kExpertsModes[1], ex, {2, 16, 0, 8}, ++seed, kRowdot, {}, true);
}

}  // namespace
}  // namespace k3::ops_test
