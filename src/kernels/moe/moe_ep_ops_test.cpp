// kernels/moe/moe_ep_ops_test.cpp: the routed experts under expert parallelism (MoeExpertsArgs
// expert_begin / num_experts / whole_experts; spec §11 "EP variant", the all-reduce form): a rank holds
// whole experts [rank * E / ep, (rank + 1) * E / ep) of E, ids stay global, and its output is the
// unrounded f32 partial sum over the routes it holds (e_j rounded as at TP=1 in bf16). Every CUDA
// strategy ("cuda_expert_gemv", "cuda_expert_grouped", "cuda_expert_rowdot" with its MXFP4 tensor-core
// and CUDA-core kernels in the route and sorted forms, and its generic row-dot kernels for bf16 experts)
// runs by name against the CPU reference's partial for the same rank, at the shapes of cases.h: odd
// shapes and the K3 ones (896 experts, top-16, L 3584; I 384 per the TP8 expert shard split 8 ways,
// and one EP8 rank's whole experts, I 3072), in the three activation modes. Also: tokens none of
// whose routes the rank holds come back as exact zeros, bad ids (outside [0, E), not merely another
// rank's) as NaN rows, the out view's pad columns keep their NaN poison, and the sorted forms are
// identical run to run.
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

// cases.h kMoeExpertsEpOddShapes, each split that divides E: MXFP4 experts on the GEMV at every batch
// it takes, the grouped kernels (bf16) at every kind of batch, the rowdot strategy's route form and
// sorted form (97 tokens) at the odd token counts, in every mode; bf16 experts on the rowdot strategy's
// generic row-dot kernels (selected), every mode.
TEST(OpsOdd, MoeExpertsEpEveryStrategy) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  uint64_t seed = 9100;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsEpOddShapes) {
    const Experts ex(dev, rng, s);
    for (int ep : kernels::kMoeExpertsEpSplits) {
      if (s.E % ep != 0) continue;
      for (int rank : some_ranks(ep))
        for (int64_t k : s.topk) {
          for (const ExpertsMode& gm : kExpertsModes) {
            if (s.mxfp4) {
              for (int64_t T : kernels::kMoeExpertsGemvTokens)
                check_ep_case(dev, gm, ex, {T, k, rank, ep}, ++seed, kGemv);
            }
            for (int64_t T : kernels::kMoeExpertsOddTokens)
              check_ep_case(dev, gm, ex, {T, k, rank, ep}, ++seed, kRowdot, {}, !s.mxfp4);
          }
          if (!s.mxfp4) continue;
          for (int64_t T : kernels::kMoeExpertsGroupedTokens)
            check_ep_case(dev, kExpertsModes[0], ex, {T, k, rank, ep}, ++seed, kGrouped);
        }
    }
  }
}

// Bad ids (the router's -1, E, far beyond: some_bad_ids) make their tokens' rows NaN on every strategy,
// whichever rank holds the token's other routes; strided out rows (the packed partial buffer) keep
// their pad (cases.h kMoeExpertsEpBadIdShape).
TEST(OpsOdd, MoeExpertsEpBadIdsAndStridedOut) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9400);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsEpBadIdShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 9500;
  for (int ep : kernels::kMoeExpertsEpSplits)
    for (int rank : some_ranks(ep))
      for (int64_t k : s.topk) {
        const auto bad = [&](int64_t T) { return some_bad_ids(T, k, s.E); };
        for (const ExpertsMode& gm : kExpertsModes) {
          for (int64_t T : kernels::kMoeExpertsGemvTokens)
            check_ep_case(dev, gm, ex, {T, k, rank, ep, 7}, ++seed, kGemv, bad(T));
          for (int64_t T : kernels::kMoeExpertsOddTokens)  // the route form, and the sorted form at 97 tokens
            check_ep_case(dev, gm, ex, {T, k, rank, ep, 7}, ++seed, kRowdot, bad(T));
        }
        for (int64_t T : kernels::kMoeExpertsGroupedTokens)
          check_ep_case(dev, kExpertsModes[0], ex, {T, k, rank, ep, 7}, ++seed, kGrouped, bad(T));
      }
}

// One TP8 rank's expert shard (cases.h kMoeExpertsK3Tp8) split 8 ways (112 experts a rank), first and
// last rank, at the K3 token counts: the GEMV (selected) up to 16 tokens, the grouped kernels (selected)
// at 17..64, the rowdot forms in f32 up to 8 tokens (the CPU reference's time) and in bf16 at 64 (the
// sorted tensor-core form), the [T, L | hidden] partial buffer; the sorted forms twice, bitwise.
TEST(OpsTp8, MoeExpertsEp8Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9600);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Tp8;
  const int ep = kernels::kMoeExpertsK3EpRanks;
  const int64_t k = s.topk[0], hidden = kernels::kMoeTailK3Tp8.hidden;
  const Experts ex(dev, rng, s);
  uint64_t seed = 9700;
  for (int rank : {0, ep - 1})
    for (int64_t T : kernels::kMoeK3Tokens) {
      if (T > kernels::kMoeExpertsGroupedMaxTokens) break;
      check_ep_case(dev, kExpertsModes[0], ex, {T, k, rank, ep}, ++seed, mxfp4_strategy(kExpertsModes[0], T, k), {},
                    true);
      if (T > 8) continue;
      check_ep_case(dev, kExpertsModes[1], ex, {T, k, rank, ep}, ++seed, kGemv);
      check_ep_case(dev, kExpertsModes[1], ex, {T, k, rank, ep}, ++seed, kRowdot);
      if (T == 1) check_ep_case(dev, kExpertsModes[2], ex, {T, k, rank, ep}, ++seed, kGemv);
      if (T == 8) check_ep_case(dev, kExpertsModes[0], ex, {T, k, rank, ep, hidden}, ++seed, kGemv);
    }
  for (int rank : {0, ep - 1})
    check_ep_case(dev, kExpertsModes[0], ex, {kernels::kMoeExpertsGroupedMaxTokens, k, rank, ep}, ++seed, kRowdot);
  // Run to run (rank 1): the sorts place routes with atomics; no bit may depend on their order.
  const int64_t T = kernels::kMoeExpertsGroupedMaxTokens, held = s.E / ep;
  const Tensor z = random_act(rng, {T, s.L}, Mode::bf16, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, T, s.E, k, ids, weights);
  Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  const auto part = [&](const std::vector<kernels::LinearWeight>& w) {
    return std::span<const kernels::LinearWeight>(w).subspan(static_cast<size_t>(held), static_cast<size_t>(held));
  };
  for (const char* impl : {kGrouped, kRowdot}) {
    std::vector<Tensor> got;
    for (int run = 0; run < 3; ++run) {
      Tensor out = dev->poisoned(DType::f32, {T, s.L});
      kernels::MoeExpertsArgs a{dz.view(),  d_ids.view(), d_w.view(), part(ex.dw1),    part(ex.dw3), part(ex.dw2),
                                out.view(), 4.0f,         25.0f,      Precision::bf16, false};
      a.expert_begin = held, a.num_experts = s.E, a.whole_experts = true;
      moe_impl_named(dev, impl).run(a);
      got.push_back(dev->to_host(out.view()));
    }
    for (int run = 1; run < 3; ++run)
      EXPECT_TRUE(std::equal(got[0].span<const uint32_t>().begin(), got[0].span<const uint32_t>().end(),
                             got[run].span<const uint32_t>().begin()))
          << impl << ": run " << run << " differs from run 0";
  }
}

// One EP8 rank's real shapes (cases.h kMoeExpertsK3Ep8: whole experts, I 3072, 112 of 896, top-16, L
// 3584), first, middle and last rank. The GEMV's shared-memory budget (k * I bf16 h rows) refuses I
// 3072, so bf16 batches up to 16 tokens select the grouped kernels; f32 activations (up to 2 tokens:
// the CPU reference's time) take the rowdot strategy's CUDA-core kernels.
TEST(OpsTp8, MoeExpertsEp8WholeExpertShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9800);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Ep8;
  const int ep = kernels::kMoeExpertsK3EpRanks;
  const Experts ex(dev, rng, s);
  uint64_t seed = 9900;
  for (int rank : some_ranks(ep))
    for (int64_t T : kernels::kMoeK3Tokens) {
      if (T > kernels::kMoeExpertsGemvMaxTokens) break;
      check_ep_case(dev, kExpertsModes[0], ex, {T, s.topk[0], rank, ep}, ++seed, kGrouped, {}, true);
      if (T <= 2) check_ep_case(dev, kExpertsModes[1], ex, {T, s.topk[0], rank, ep}, ++seed, kRowdot, {}, true);
    }
}

}  // namespace
}  // namespace k3::ops_test
