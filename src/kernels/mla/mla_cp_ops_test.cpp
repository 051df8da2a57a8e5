// kernels/mla/mla_cp_ops_test.cpp: the four MLA ops of decode context parallelism (kernels/mla/mla_cp.h)
// on every device backend against the CPU reference, each case asserting the strategy that ran:
//   mla_q_absorb ("cuda_q_absorb"), mla_partial_attention ("cuda_partial_splitkv"; in bf16 mode at
//   tensor-core dims "cuda_partial_splitkv_mma"), mla_lse_rescale ("cuda_lse_rescale"); mla_w_uv
//   ("cuda_w_uv_rowdot", with and without the output gate) has its own file, mla_cp_w_uv_ops_test.cpp,
//   and the four chained as the model runs them are mla_cp_chain_ops_test.cpp
// on the case tables of kernels/mla/cases.h: at odd dims (kMlaCpOddShapes: H 1-12, latents 37 / 54 / 56;
// G = cp of kMlaCpOddSizes, ranks 0 and cp-1, pages of 7 and 16 tokens, f32 / bf16 / fp8 caches, the
// contexts of kMlaCpOddBatch split unevenly with 1-token contexts and verify rows, and kMlaCpNoTokenBatch
// on every rank: rows that see no local position, ranks that hold no token) and at one TP8 rank of K3 in
// the groups of kMlaCpK3Groups (H 12, kv_lora 512, rope 64, G 8 and 2, thousands of local positions),
// with NaN-poisoned outputs and rows of no sequence that must stay untouched.
// The tensor-core partial attention runs by name on kMlaCpMmaOddGroups (G * H = 12 / 17 / 24 / 48 heads:
// 1-3 head groups; cp 1 to 4, every rank), and is the registry's own choice at the K3 groups in bf16 mode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/mla/mla_cp_ops_test_util.h"

namespace k3::ops_test {
namespace {

using namespace mla_cp;

// ---------------------------------------------------------------- mla_q_absorb

void check_q_absorb(Device* dev, Mode mode, const Dims& d, const std::vector<Seq>& seqs, DType w_dtype, uint64_t seed) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, E = d.kv_lora + d.rope;
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  kernels::LinearWeight kv_b;
  kv_b.weight = w_dtype == DType::bf16
                    ? random_bf16_weight(rng, H * (d.nope + d.v), d.kv_lora)
                    : random_uniform_f32(rng, {H * (d.nope + d.v), d.kv_lora}, 1.0 / std::sqrt(d.kv_lora));
  const Tables cpu(rows, Tensor(), nullptr);
  Tensor want = nan_tensor({R, H, E});
  cpu_registry().mla_q_absorb.run({q.view(), cpu.seqs(rows, 0), &kv_b, want.view(), d.heads, d.nope, d.rope, d.v,
                                   d.kv_lora, precision(mode)},
                                  core::Device::cpu);
  const Tables dt(rows, Tensor(), dev);
  const Tensor dq = dev->act(q, mode);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  Tensor qc = dev->poisoned(DType::f32, {R, H, E});
  const kernels::MlaQAbsorbArgs args{dq.view(), dt.seqs(rows, 0), &dkv_b, qc.view(), d.heads,
                                     d.nope,    d.rope,           d.v,    d.kv_lora, precision(mode)};
  expect_device_impl(dev->registry().mla_q_absorb, args, dev);
  ASSERT_EQ(dev->registry().mla_q_absorb.select(args, dev->kind()).name, kQAbsorb);
  dev->registry().mla_q_absorb.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(qc.view());
  expect_row0_nan(got, R, "mla_q_absorb qc");
  expect_close("mla_q_absorb", shape_str({R, H, d.nope, d.kv_lora}), mode,
               "kv_b_" + std::string(core::dtype_name(w_dtype)), owned_rows(got, R), owned_rows(want, R),
               tol_reduction(mode));
}

// f32 weights in fp32 mode (bf16 mode: the bf16 weights the model holds).
TEST(OpsOdd, MlaCpQAbsorb) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9100;
  for (Mode m : kModes)
    for (const Dims& d : kernels::kMlaCpOddShapes) {
      check_q_absorb(dev, m, d, as_vector(kernels::kMlaCpOddBatch), DType::bf16, ++seed);
      if (m == Mode::fp32) check_q_absorb(dev, m, d, as_vector(kernels::kMlaCpOddBatch), DType::f32, ++seed);
    }
}
TEST(OpsTp8, MlaCpQAbsorb) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    check_q_absorb(dev, m, kernels::kMlaK3Tp8, as_vector(kernels::kMlaCpK3Batch), DType::bf16, 9150);
}

// ---------------------------------------------------------------- mla_partial_attention

// How a partial-attention case runs: which strategy must run, the precision the call declares (bf16:
// qc holds bf16 values, as mla_q_absorb leaves it in bf16 mode) and whether the strategy runs by name
// (asserting that it supports the case) or through the registry (asserting that it is the one chosen).
struct PartialRun {
  const char* impl = kPartial;
  Precision precision = Precision::fp32;
  bool by_name = false;
};
const kernels::OpImpl<kernels::MlaPartialAttentionArgs>& partial_impl_named(Device* dev, const std::string& name) {
  for (const auto& impl : dev->registry().mla_partial_attention.impls())
    if (impl.name == name && impl.device == dev->kind()) return impl;
  throw core::Error("no mla_partial_attention implementation " + name + " registered");
}

// qc [G, R, H, E] random; this rank's local cache of random entries; o_part / lse against the CPU.
// Tolerances: the CUDA-core strategy is fp32 throughout (tol_attention(fp32) for every cache); the tensor-core
// one rounds P to f16 (fp8 cache) or bf16 (bf16 cache) for its P.V mma and l sums the same rounded P, so
// o_part is a weighted mean with weights off by <= 2^-11 / 2^-8 relative: ~2e-3 relative at most, checked at
// tol_attention(bf16) as the decode op's tensor-core cases; lse = m + log l moves by <= 2^-8 absolute.
// The tensor-core strategy also runs twice: the same bytes both times.
void check_partial(Device* dev, const Dims& d, int G, int rank, const std::vector<Seq>& seqs, const std::string& kind,
                   float k_scale, int64_t bs, uint64_t seed, const PartialRun& run = {}) {
  core::Rng rng(seed);
  const int cp = G;
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope;
  std::vector<Tensor> c_n, k_pe;
  for (const Seq& s : seqs) {
    const int64_t n = std::max<int64_t>(1, local_count(s.S, cp, rank));  // >= 1 page per sequence
    c_n.push_back(random_act(rng, {n, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {n, d.rope}, Mode::bf16));
  }
  const Cache cache = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  const Tensor qc = random_act(rng, {G, R, H, E}, kind == "f32" ? Mode::fp32 : Mode::bf16);
  const float scale = scale_of(d);
  const Tables cpu(rows, cache.block_table, nullptr);
  Tensor want_o = nan_tensor({G, R, H, L}), want_lse = nan_tensor({G, R, H});
  cpu_registry().mla_partial_attention.run({qc.view(), cache.pages.view(), cpu.seqs(rows, cache.max_tokens), k_scale,
                                            want_o.view(), want_lse.view(), cp, rank, scale},
                                           core::Device::cpu);
  const Tables dt(rows, cache.block_table, dev);
  const Tensor dqc = dev->upload(qc), dpages = device_pages(dev, cache, kind);
  Tensor o_part = dev->poisoned(DType::f32, {G, R, H, L}), lse = dev->poisoned(DType::f32, {G, R, H});
  kernels::MlaPartialAttentionArgs args{
      dqc.view(), dpages.view(), dt.seqs(rows, cache.max_tokens), k_scale, o_part.view(), lse.view(), cp, rank, scale};
  args.precision = run.precision;
  auto& table = dev->registry().mla_partial_attention;
  expect_device_impl(table, args, dev);
  const bool mma = std::string(run.impl) == kPartialMma;
  if (!mma) {  // the tensor-core strategy must refuse the case with its reason (precision, cache, dims)
    const core::Status why = partial_impl_named(dev, kPartialMma).supports(args);
    ASSERT_FALSE(why.is_ok()) << "cuda_partial_splitkv_mma accepts a case meant for " << run.impl;
    EXPECT_NE(why.reason().find("tensor-core partial split_kv: "), std::string::npos) << why.reason();
  }
  const auto run_once = [&](const kernels::MlaPartialAttentionArgs& a) {
    if (run.by_name) {
      const auto& impl = partial_impl_named(dev, run.impl);
      const core::Status s = impl.supports(a);
      ASSERT_TRUE(s.is_ok()) << run.impl << ": " << s.reason();
      impl.run(a);
    } else {
      ASSERT_EQ(table.select(a, dev->kind()).name, run.impl);
      table.run(a, dev->kind());
    }
  };
  run_once(args);
  if (::testing::Test::HasFatalFailure()) return;
  const Tensor got_o = dev->to_host_f32(o_part.view()), got_lse = dev->to_host_f32(lse.view());
  if (mma) {  // deterministic: a second run into fresh poisoned buffers gives the same bytes
    Tensor o2 = dev->poisoned(DType::f32, {G, R, H, L}), lse2 = dev->poisoned(DType::f32, {G, R, H});
    kernels::MlaPartialAttentionArgs again = args;
    again.o_part = o2.view();
    again.lse = lse2.view();
    run_once(again);
    if (::testing::Test::HasFatalFailure()) return;
    const Tensor o2h = dev->to_host_f32(o2.view()), lse2h = dev->to_host_f32(lse2.view());
    EXPECT_EQ(std::memcmp(o2h.data<const float>(), got_o.data<const float>(), static_cast<size_t>(got_o.nbytes())), 0)
        << "o_part differs between two runs";
    EXPECT_EQ(
        std::memcmp(lse2h.data<const float>(), got_lse.data<const float>(), static_cast<size_t>(got_lse.nbytes())), 0)
        << "lse differs between two runs";
  }
  const Tensor go = owned_rows_g(got_o, G, R, "o_part"), wo = owned_rows_g(want_o, G, R, "o_part (cpu)");
  const Tensor gl = owned_rows_g(got_lse, G, R, "lse"), wl = owned_rows_g(want_lse, G, R, "lse (cpu)");
  // Rows that see no local position: lse exactly -inf and o_part exactly 0, on both sides.
  std::vector<float> got_finite, want_finite;
  int empty = 0;
  for (int64_t k = 0; k < wl.numel(); ++k) {
    const float w = wl.data<const float>()[k], g = gl.data<const float>()[k];
    if (w == -kInf) {
      ++empty;
      ASSERT_EQ(g, -kInf) << "lse of a row with no visible local position, entry " << k;
      for (int64_t i = 0; i < L; ++i) ASSERT_EQ(go.data<const float>()[k * L + i], 0.0f) << "o_part of an empty row";
    } else {
      got_finite.push_back(g), want_finite.push_back(w);
    }
  }
  const std::string shape = shape_str({G, rank, H, L, bs}) + " empty " + std::to_string(empty);  // G rank H L bs
  const Mode m = kind == "f32" ? Mode::fp32 : Mode::bf16;  // f32 caches: the tight fp32 tolerance
  const Tol tight = tol_attention(Mode::fp32);
  const Tol o_tol = mma ? tol_attention(Mode::bf16) : tight, lse_tol = mma ? Tol{2e-3, 1 - 1e-5} : tight;
  const std::string tag = mma ? "_mma" : "";
  expect_close("mla_partial_attention", shape, m, "o_part_cache_" + kind + tag, go, wo, o_tol);
  const auto n = static_cast<int64_t>(got_finite.size());
  Tensor gf = f32_tensor({n}), wf = f32_tensor({n});
  std::copy(got_finite.begin(), got_finite.end(), gf.data<float>());
  std::copy(want_finite.begin(), want_finite.end(), wf.data<float>());
  if (n > 0) expect_close("mla_partial_attention", shape, m, "lse_cache_" + kind + tag, gf, wf, lse_tol);
}

// Ranks 0 and cp - 1 of every odd group (cp = 1: rank 0).
std::vector<int> end_ranks(int cp) { return cp == 1 ? std::vector<int>{0} : std::vector<int>{0, cp - 1}; }

TEST(OpsOdd, MlaCpPartialAttention) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9200;
  for (int G : kernels::kMlaCpOddSizes)
    for (int rank : end_ranks(G))
      for (const Dims& d : kernels::kMlaCpOddShapes)
        for (int64_t bs : kernels::kMlaCpOddBlockSizes) {
          const std::vector<Seq> seqs = as_vector(kernels::kMlaCpOddBatch);
          check_partial(dev, d, G, rank, seqs, "f32", 1.0f, bs, ++seed);
          check_partial(dev, d, G, rank, seqs, "bf16", 1.0f, bs, ++seed);
          check_partial(dev, d, G, rank, seqs, "fp8", 0.5f, bs, ++seed);
        }
  // Every rank of every group over contexts that leave the upper ranks without a token.
  for (int G : kernels::kMlaCpOddSizes)
    for (int rank = 0; rank < G; ++rank)
      for (const std::string kind : {"f32", "bf16", "fp8"})
        check_partial(dev, kernels::kMlaOdd, G, rank, as_vector(kernels::kMlaCpNoTokenBatch), kind,
                      kind == "fp8" ? 0.5f : 1.0f, 7, ++seed);
}
// One TP8 rank of K3 in each group of kMlaCpK3Groups, ranks 0 and cp - 1: contexts of up to 24K global
// tokens (3000 local at DCP 8) with verify rows, short ones, a lone 1-token context (many splits per
// query); bf16 pages of 64 and fp8 pages of 16, and f32 pages on a middle rank of DCP 8.
TEST(OpsTp8, MlaCpPartialAttention) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9300;
  for (const Group& g : kernels::kMlaCpK3Groups)
    for (int rank : {0, g.cp - 1}) {
      check_partial(dev, g.shape, g.cp, rank, as_vector(kernels::kMlaCpK3Batch), "bf16", 1.0f, 64, ++seed);
      check_partial(dev, g.shape, g.cp, rank, as_vector(kernels::kMlaCpK3Batch), "fp8", 1.0f, 16, ++seed);
    }
  const Group& dcp8 = kernels::kMlaCpK3Dcp8;
  check_partial(dev, dcp8.shape, dcp8.cp, 3, as_vector(kernels::kMlaCpK3ChainBatch), "f32", 1.0f, 16, ++seed);
}

// The tensor-core strategy by name on every group of kMlaCpMmaOddGroups and every rank: fp8 (k_scale 0.75)
// and bf16 pages of 7 and 16 tokens over kMlaCpOddBatch (contexts of up to 1004 local positions that end
// mid-stage (64) and mid-page, verify rows with spare slots, and sequences at global positions 0 .. 2 that
// rank 3 of 4 never stores: lse -inf, o_part 0).
TEST(OpsOdd, MlaCpPartialAttentionMma) {
  K3_REQUIRE_CUDA(dev);
  const PartialRun mma{kPartialMma, Precision::bf16, true};
  uint64_t seed = 9250;
  for (const Group& g : kernels::kMlaCpMmaOddGroups)
    for (int rank = 0; rank < g.cp; ++rank) {
      const int flip = (rank + g.cp * g.shape.heads) % 2;
      const int64_t bs = kernels::kMlaCpOddBlockSizes[flip], other = kernels::kMlaCpOddBlockSizes[1 - flip];
      const std::vector<Seq> seqs = as_vector(kernels::kMlaCpOddBatch);
      check_partial(dev, g.shape, g.cp, rank, seqs, "fp8", 0.75f, bs, ++seed, mma);
      check_partial(dev, g.shape, g.cp, rank, seqs, "bf16", 1.0f, other, ++seed, mma);
    }
}
// In bf16 mode at the K3 groups the registry picks the tensor-core strategy itself: DCP 8 (G 8 x 12 = 96
// heads: 6 groups of 16) and the group of 2 (24 heads: 2 groups of 12; 12K local positions), ranks 0 and
// cp - 1. Where it cannot be exact or its dims do not fit (precision fp32, an f32 cache, kv_lora 54) it
// refuses with its reason and the CUDA-core strategy runs.
TEST(OpsTp8, MlaCpPartialAttentionMma) {
  K3_REQUIRE_CUDA(dev);
  const PartialRun selected{kPartialMma, Precision::bf16, false};
  uint64_t seed = 9330;
  for (const Group& g : kernels::kMlaCpK3Groups)
    for (int rank : {0, g.cp - 1}) {
      check_partial(dev, g.shape, g.cp, rank, as_vector(kernels::kMlaCpK3Batch), "fp8", 0.5f, 64, ++seed, selected);
      check_partial(dev, g.shape, g.cp, rank, as_vector(kernels::kMlaCpK3Batch), "bf16", 1.0f, 16, ++seed, selected);
    }
  const Group& dcp2 = kernels::kMlaCpK3Dcp2;
  const std::vector<Seq> chain = as_vector(kernels::kMlaCpK3ChainBatch);
  check_partial(dev, dcp2.shape, dcp2.cp, 1, chain, "fp8", 0.5f, 64, ++seed, PartialRun{kPartial, Precision::fp32});
  check_partial(dev, dcp2.shape, dcp2.cp, 1, chain, "f32", 1.0f, 16, ++seed, PartialRun{kPartial, Precision::bf16});
  check_partial(dev, kernels::kMlaOdd, 2, 0, as_vector(kernels::kMlaCpOddBatch), "bf16", 1.0f, 16, ++seed,
                PartialRun{kPartial, Precision::bf16});
}

// ---------------------------------------------------------------- mla_lse_rescale

void check_rescale(Device* dev, int G, int rank, int H, int L, const std::vector<Seq>& seqs, uint64_t seed) {
  core::Rng rng(seed);
  const int cp = G;
  const Rows rows(seqs);
  const int64_t R = rows.total;
  const Tensor o_part = random_act(rng, {G, R, H, L}, Mode::fp32);
  Tensor lse_all = random_act(rng, {cp, G, R, H}, Mode::fp32, 2.0, 3.0);
  // Ranks > 0 sometimes saw no position (-inf); rank 0 always saw position 0.
  for (int64_t k = static_cast<int64_t>(G) * R * H; k < lse_all.numel(); ++k)
    if (rng.next_u64() % 4 == 0) lse_all.data<float>()[k] = -kInf;
  const Tables cpu(rows, Tensor(), nullptr);
  Tensor want = copy(o_part);
  cpu_registry().mla_lse_rescale.run({want.view(), lse_all.view(), cpu.seqs(rows, 0), rank}, core::Device::cpu);
  const Tables dt(rows, Tensor(), dev);
  Tensor d_o = dev->upload(o_part);
  const Tensor d_lse = dev->upload(lse_all);
  const kernels::MlaLseRescaleArgs args{d_o.view(), d_lse.view(), dt.seqs(rows, 0), rank};
  expect_device_impl(dev->registry().mla_lse_rescale, args, dev);
  ASSERT_EQ(dev->registry().mla_lse_rescale.select(args, dev->kind()).name, kRescale);
  dev->registry().mla_lse_rescale.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(d_o.view());
  // Row 0 of every owner belongs to no sequence: untouched, bit for bit.
  const int64_t inner = static_cast<int64_t>(H) * L;
  for (int64_t g = 0; g < G; ++g)
    ASSERT_EQ(std::memcmp(got.data<const float>() + g * R * inner, o_part.data<const float>() + g * R * inner,
                          static_cast<size_t>(inner) * sizeof(float)),
              0)
        << "row 0 of owner " << g << " changed";
  expect_close("mla_lse_rescale", shape_str({G, rank, R, H, L}), Mode::fp32, "o_part", got, want,
               tol_elementwise(Mode::fp32));
}

TEST(OpsOdd, MlaCpLseRescale) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9400;
  for (int G : kernels::kMlaCpOddSizes)
    for (int rank : end_ranks(G))
      for (const Dims& d : kernels::kMlaCpOddShapes)
        check_rescale(dev, G, rank, d.heads, d.kv_lora, as_vector(kernels::kMlaCpOddBatch), ++seed);
}
TEST(OpsTp8, MlaCpLseRescale) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9450;
  for (const Group& g : kernels::kMlaCpK3Groups)
    for (int rank : {0, g.cp - 1})
      check_rescale(dev, g.cp, rank, g.shape.heads, g.shape.kv_lora, as_vector(kernels::kMlaCpK3Batch), ++seed);
}

}  // namespace
}  // namespace k3::ops_test
