// kernels/mla/mla_cp_chain_ops_test.cpp: the decode-context-parallel MLA ops chained as the model runs
// them (kernels/mla/mla_cp.h), on one device with the collectives done on the host in rank order, on the
// case tables of kernels/mla/cases.h: every odd group size (kMlaCpOddSizes, cp > 1) at odd dims over
// kMlaCpOddBatch and kMlaCpNoTokenBatch, and the K3 groups (kMlaCpK3Groups) over kMlaCpK3ChainBatch,
// against mla_absorbed_reference over the whole cache (f32 / bf16 / fp8 caches, the tensor-core partial
// attention as the registry's choice at K3 dims in bf16 mode), and cp = 1 against mla_absorbed's
// "cuda_split_kv" bit for bit (same kernels, weight 1) at every odd shape and one TP8 rank of K3.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/mla/mla_cp_ops_test_util.h"

namespace k3::ops_test {
namespace {

using namespace mla_cp;

// Columns [c0, c0 + w) of a CPU f32 [R, W] tensor.
Tensor columns(const Tensor& t, int64_t c0, int64_t w) {
  const int64_t R = t.dim(0), W = t.dim(1);
  Tensor out = f32_tensor({R, w});
  for (int64_t r = 0; r < R; ++r) std::copy_n(t.data<const float>() + r * W + c0, w, out.data<float>() + r * w);
  return out;
}
// Rows [r0, r0 + n) of a weight (any dtype) as a new weight.
kernels::LinearWeight weight_rows(const kernels::LinearWeight& w, int64_t r0, int64_t n) {
  const TensorView v = w.weight.view();
  const size_t row_bytes = static_cast<size_t>(v.dim(1)) * core::dtype_size(v.dtype);
  kernels::LinearWeight out;
  out.weight = Tensor::zeros(v.dtype, {n, v.dim(1)});
  std::memcpy(out.weight.data<uint8_t>(), static_cast<const uint8_t*>(v.data) + r0 * row_bytes, n * row_bytes);
  return out;
}

// The whole DCP step for cp ranks of H heads each (cp * H heads in all) on one device, the
// collectives done on the host in rank order, against mla_absorbed_reference of the whole cache.
// mma: the partial attention declares precision bf16 and must run on the tensor cores.
void check_chain(Device* dev, Mode mode, const Dims& d, int cp, const std::vector<Seq>& seqs, const std::string& kind,
                 int64_t bs, uint64_t seed, bool mma = false) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope, qw = H * (d.nope + d.rope), vw = H * d.v;
  const Precision p = precision(mode);
  const float scale = scale_of(d), k_scale = kind == "fp8" ? 0.5f : 1.0f;
  std::vector<Tensor> c_n, k_pe;  // every sequence's global entries
  for (const Seq& s : seqs) {
    c_n.push_back(random_act(rng, {s.S, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {s.S, d.rope}, Mode::bf16));
  }
  const Tensor q = random_act(rng, {R, cp * qw}, mode);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, cp * H * (d.nope + d.v), L);

  const Cache full = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  const Tables cpu(rows, full.block_table, nullptr);
  Tensor want = nan_tensor({R, cp * vw});
  cpu_registry().mla_absorbed.run({q.view(), full.pages.view(), cpu.seqs(rows, full.max_tokens), k_scale, &kv_b,
                                   want.view(), static_cast<int>(cp * H), d.nope, d.rope, d.v, d.kv_lora, scale, p},
                                  core::Device::cpu);

  // 1. q_absorb on every rank, all_gather -> qc [cp, R, H, E] (rank-major, as a host concatenation).
  const Tables rows_only(rows, Tensor(), dev);
  Tensor qc_all = f32_tensor({cp, R, H, E});
  std::vector<kernels::LinearWeight> dkv(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    dkv[r] = dev->upload(weight_rows(kv_b, r * H * (d.nope + d.v), H * (d.nope + d.v)));
    const Tensor dq = dev->act(columns(q, r * qw, qw), mode);
    Tensor qc = dev->poisoned(DType::f32, {R, H, E});
    const kernels::MlaQAbsorbArgs a{
        dq.view(), rows_only.seqs(rows, 0), &dkv[r], qc.view(), d.heads, d.nope, d.rope, d.v, d.kv_lora, p};
    ASSERT_EQ(dev->registry().mla_q_absorb.select(a, dev->kind()).name, kQAbsorb);
    dev->registry().mla_q_absorb.run(a, dev->kind());
    const Tensor h = dev->to_host_f32(qc.view());
    std::copy_n(h.data<const float>(), h.numel(), qc_all.data<float>() + r * h.numel());
  }
  const Tensor dqc = dev->upload(qc_all);
  // 2. partial attention on every rank over its own pages; all_gather(lse) -> [cp, cp, R, H].
  std::vector<Tensor> o_part(static_cast<size_t>(cp));
  Tensor lse_all = f32_tensor({cp, cp, R, H});
  for (int r = 0; r < cp; ++r) {
    std::vector<Tensor> lc, lp;
    for (size_t s = 0; s < seqs.size(); ++s) {
      lc.push_back(take_local(c_n[s], cp, r));
      lp.push_back(take_local(k_pe[s], cp, r));
    }
    const Cache local = build_cache(lc, lp, bs, kind, k_scale, rng);
    const Tables dt(rows, local.block_table, dev);
    const Tensor dpages = device_pages(dev, local, kind);
    o_part[r] = dev->poisoned(DType::f32, {cp, R, H, L});
    Tensor lse = dev->poisoned(DType::f32, {cp, R, H});
    kernels::MlaPartialAttentionArgs a{
        dqc.view(), dpages.view(), dt.seqs(rows, local.max_tokens), k_scale, o_part[r].view(), lse.view(), cp,
        r,          scale};
    if (mma) a.precision = p;
    ASSERT_EQ(dev->registry().mla_partial_attention.select(a, dev->kind()).name, mma ? kPartialMma : kPartial);
    dev->registry().mla_partial_attention.run(a, dev->kind());
    const Tensor h = dev->to_host_f32(lse.view());
    std::copy_n(h.data<const float>(), h.numel(), lse_all.data<float>() + r * h.numel());
  }
  // 3. rescale in place on every rank; reduce_scatter_sum over the owner axis in rank order.
  const Tensor dlse_all = dev->upload(lse_all);
  std::vector<Tensor> parts;
  for (int r = 0; r < cp; ++r) {
    const kernels::MlaLseRescaleArgs a{o_part[r].view(), dlse_all.view(), rows_only.seqs(rows, 0), r};
    ASSERT_EQ(dev->registry().mla_lse_rescale.select(a, dev->kind()).name, kRescale);
    dev->registry().mla_lse_rescale.run(a, dev->kind());
    parts.push_back(dev->to_host_f32(o_part[r].view()));
  }
  const int64_t owner = R * H * L;  // o_part[r][g] is [R, H, L]
  for (int g = 0; g < cp; ++g) {
    Tensor o_lat = f32_tensor({R, H, L});
    for (int64_t i = 0; i < owner; ++i) {
      float sum = parts[0].data<const float>()[g * owner + i];
      for (int r = 1; r < cp; ++r) sum += parts[r].data<const float>()[g * owner + i];
      o_lat.data<float>()[i] = sum;
    }
    // 4. W_UV on the owner of heads g * H ..
    const Tensor d_lat = dev->upload(o_lat);
    Tensor out = dev->poisoned(act_dtype(mode), {R, vw});
    const kernels::MlaWUvArgs a{
        d_lat.view(), rows_only.seqs(rows, 0), &dkv[g], {}, out.view(), d.heads, d.nope, d.v, d.kv_lora, p};
    ASSERT_EQ(dev->registry().mla_w_uv.select(a, dev->kind()).name, kWUv);
    dev->registry().mla_w_uv.run(a, dev->kind());
    const Tensor got = dev->to_host_f32(out.view());
    expect_row0_nan(got, R, "chain out");
    expect_close(
        "mla_cp_chain",
        "cp" + std::to_string(cp) + " rank" + std::to_string(g) + " H" + std::to_string(H) + " bs" + std::to_string(bs),
        mode, "cache_" + kind, owned_rows(got, R), owned_rows(columns(want, g * vw, vw), R), tol_attention(mode));
  }
}

TEST(OpsOdd, MlaCpChainMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9600;
  for (const std::vector<Seq>& seqs : {as_vector(kernels::kMlaCpOddBatch), as_vector(kernels::kMlaCpNoTokenBatch)})
    for (int cp : kernels::kMlaCpOddSizes) {
      if (cp == 1) continue;  // MlaCpOneRankIsAbsorbedBitwise
      for (Mode m : kModes)
        for (int64_t bs : kernels::kMlaCpOddBlockSizes) {
          check_chain(dev, m, kernels::kMlaOdd, cp, seqs, m == Mode::bf16 ? "bf16" : "f32", bs, ++seed);
          check_chain(dev, m, kernels::kMlaOdd, cp, seqs, "fp8", bs, ++seed);
        }
    }
  for (const Dims& d : kernels::kMlaCpOddShapes)
    check_chain(dev, Mode::bf16, d, 4, as_vector(kernels::kMlaCpOddBatch), "fp8", 16, ++seed);
}
// The K3 groups (DCP 8: 8 ranks of 12 heads, 96 in all; and 2 ranks): fp8 pages of 64 through the CUDA-core
// partial attention, then in bf16 mode with the tensor-core one (the model's choice) over fp8 pages of 64
// and bf16 pages of 16.
TEST(OpsTp8, MlaCpChainMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9700;
  for (const Group& g : kernels::kMlaCpK3Groups)
    check_chain(dev, Mode::bf16, g.shape, g.cp, as_vector(kernels::kMlaCpK3ChainBatch), "fp8", 64, ++seed);
}
TEST(OpsTp8, MlaCpChainMmaMatchesAbsorbedReference) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9710;
  for (const Group& g : kernels::kMlaCpK3Groups) {
    check_chain(dev, Mode::bf16, g.shape, g.cp, as_vector(kernels::kMlaCpK3ChainBatch), "fp8", 64, ++seed,
                /*mma=*/true);
    check_chain(dev, Mode::bf16, g.shape, g.cp, as_vector(kernels::kMlaCpK3ChainBatch), "bf16", 16, ++seed,
                /*mma=*/true);
  }
}

// cp = 1: the four CUDA ops give the bytes of mla_absorbed's "cuda_split_kv" (same kernels, same split
// plan, the rescale weight e^0 / e^0 = 1 exactly, o_lat rounded at the same point; mla_w_uv's own kernel
// sums each W_UV row in the lane order of the absorbed form's w_uv_kernel and takes the same vector /
// scalar path when the absorbed form's o_lat scratch is 16-byte aligned, as for these shapes: L not a
// multiple of 8, or H even).
void check_cp1_bitwise(Device* dev, Mode mode, const Dims& d, const std::vector<Seq>& seqs, const std::string& kind,
                       int64_t bs, uint64_t seed) {
  core::Rng rng(seed);
  const Rows rows(seqs);
  const int64_t R = rows.total, H = d.heads, L = d.kv_lora, E = L + d.rope;
  const Precision p = precision(mode);
  const float scale = scale_of(d), k_scale = kind == "fp8" ? 0.5f : 1.0f;
  std::vector<Tensor> c_n, k_pe;
  for (const Seq& s : seqs) {
    c_n.push_back(random_act(rng, {s.S, L}, Mode::bf16));
    k_pe.push_back(random_act(rng, {s.S, d.rope}, Mode::bf16));
  }
  const Cache cache = build_cache(c_n, k_pe, bs, kind, k_scale, rng);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  const Tables dt(rows, cache.block_table, dev);
  const kernels::SeqBatch sb = dt.seqs(rows, cache.max_tokens);
  const Tensor dq = dev->act(q, mode), dpages = device_pages(dev, cache, kind);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  kernels::Registry& reg = dev->registry();

  Tensor want = dev->poisoned(act_dtype(mode), {R, H * d.v});
  const kernels::MlaAttentionArgs absorbed{
      dq.view(), dpages.view(), sb, k_scale, &dkv_b, want.view(), d.heads, d.nope, d.rope, d.v, d.kv_lora, scale, p};
  // The CUDA-core strategy whose kernels the DCP ops share (a higher-priority tensor-core strategy may
  // be the one select() picks for some of these calls).
  const auto& impls = reg.mla_absorbed.impls();
  const auto split_kv = std::find_if(impls.begin(), impls.end(),
                                     [](const auto& i) { return i.name == "cuda_split_kv"; });
  ASSERT_NE(split_kv, impls.end());
  ASSERT_TRUE(kernels::mla_attention_check(absorbed).is_ok());
  ASSERT_TRUE(split_kv->supports(absorbed).is_ok()) << split_kv->supports(absorbed).reason();
  split_kv->run(absorbed);

  Tensor qc = dev->poisoned(DType::f32, {1, R, H, E}), o_part = dev->poisoned(DType::f32, {1, R, H, L});
  Tensor lse = dev->poisoned(DType::f32, {1, R, H}), out = dev->poisoned(act_dtype(mode), {R, H * d.v});
  const auto as = [](const Tensor& t, Shape shape) {
    return TensorView::contiguous(t.view().data, t.dtype(), shape, t.view().device);
  };
  reg.mla_q_absorb.run({dq.view(), sb, &dkv_b, as(qc, {R, H, E}), d.heads, d.nope, d.rope, d.v, d.kv_lora, p},
                       dev->kind());
  reg.mla_partial_attention.run({qc.view(), dpages.view(), sb, k_scale, o_part.view(), lse.view(), 1, 0, scale},
                                dev->kind());
  reg.mla_lse_rescale.run({o_part.view(), as(lse, {1, 1, R, H}), sb, 0}, dev->kind());
  reg.mla_w_uv.run({as(o_part, {R, H, L}), sb, &dkv_b, {}, out.view(), d.heads, d.nope, d.v, d.kv_lora, p},
                   dev->kind());
  const Tensor a = dev->to_host(want.view()), b = dev->to_host(out.view());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data<const uint8_t>(), b.data<const uint8_t>(), static_cast<size_t>(a.nbytes())), 0)
      << "cp = 1 differs from mla_absorbed on CUDA (" << mode_name(mode) << ", cache " << kind << ", H " << H << ")";
}

TEST(OpsOdd, MlaCpOneRankIsAbsorbedBitwise) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9800;
  for (Mode m : kModes)
    for (const Dims& d : kernels::kMlaCpOddShapes) {
      const std::vector<Seq> seqs = as_vector(kernels::kMlaCpOddBatch);
      check_cp1_bitwise(dev, m, d, seqs, m == Mode::bf16 ? "bf16" : "f32", kernels::kMlaCpOddBlockSizes[0], ++seed);
      check_cp1_bitwise(dev, m, d, seqs, "fp8", kernels::kMlaCpOddBlockSizes[1], ++seed);
    }
}
TEST(OpsTp8, MlaCpOneRankIsAbsorbedBitwise) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    check_cp1_bitwise(dev, m, kernels::kMlaK3Tp8, as_vector(kernels::kMlaCpK3ChainBatch), "fp8", 64, 9900);
}

}  // namespace
}  // namespace k3::ops_test
