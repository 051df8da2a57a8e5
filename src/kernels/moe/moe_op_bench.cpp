// kernels/moe/moe_op_bench.cpp: k3bench_ops_gpu's MoE rows at the K3 shapes of cases.h: the MXFP4
// routed experts of one TP8 rank (kMoeExpertsK3Tp8: top-16 of 896) and of one EP8 rank
// (kMoeExpertsK3Ep8: 112 whole experts of 896), every CUDA strategy that takes the batch, the
// selected one marked "*" (bytes count only the distinct held experts the routes touch); the router's
// top-k (kMoeRouterK3); and the fused tail (moe_tail_combine at kMoeTailK3Tp8).
#include <algorithm>

#include "backends/cuda/device_tensor.h"
#include "kernels/moe/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

using core::DType;
using core::Tensor;

namespace {

// The routed experts of shape s on rank 0 of `ep` (ep 1: every expert, rounded output as under TP; else
// the rank's whole experts [0, E / ep) of E, its unrounded f32 partial sum). Routes are k distinct
// experts of all E per token, weights 1 / k.
void bench_moe_experts(OpBench& b, const MoeExpertsShape& s, int ep) {
  core::Rng& rng = b.rng();
  const int64_t E = s.E, held = s.E / ep, k = s.topk[0], I = s.I, L = s.L;
  // All held experts in one slab each for codes and scales; per-expert views into them.
  const int64_t code_bytes[3] = {I * L / 2, I * L / 2, L * I / 2},
                scale_bytes[3] = {I * L / 32, I * L / 32, L * I / 32};
  Tensor codes = b.empty(DType::u8, {held * (code_bytes[0] * 3)});
  Tensor scales = b.empty(DType::u8, {held * (scale_bytes[0] * 3)});
  b.fill(codes, b.pat().fp4_codes), b.fill(scales, b.pat().e8m0);
  // Views into the slabs; each keeps its slab alive through a copy of the slab tensor.
  const std::shared_ptr<void> hold_codes(codes.view().data, [codes](void*) {});
  const std::shared_ptr<void> hold_scales(scales.view().data, [scales](void*) {});
  std::vector<LinearWeight> w[3];
  const int64_t rows[3] = {I, I, L}, cols[3] = {L, L, I};
  for (int64_t e = 0; e < held; ++e)
    for (int m = 0; m < 3; ++m) {
      LinearWeight lw;
      char* c = static_cast<char*>(codes.view().data) + (e * 3 + m) * code_bytes[0];
      char* sc = static_cast<char*>(scales.view().data) + (e * 3 + m) * scale_bytes[0];
      lw.weight = Tensor(core::TensorView::contiguous(c, DType::u8, {rows[m], cols[m] / 2}, core::Device::cuda),
                         hold_codes);
      lw.scale = Tensor(core::TensorView::contiguous(sc, DType::u8, {rows[m], cols[m] / 32}, core::Device::cuda),
                        hold_scales);
      w[m].push_back(lw);
    }
  const double expert_bytes = static_cast<double>(3 * (code_bytes[0] + scale_bytes[0]));
  const std::string op = ep > 1 ? "moe_experts ep" + std::to_string(ep) + " fp4 " : "moe_experts fp4 ";
  const std::string experts = ep > 1 ? std::to_string(held) + "/" + std::to_string(E) : std::to_string(E);
  for (int64_t T : b.batches()) {
    Tensor ids_h = Tensor::zeros(DType::i32, {T, k}), wts_h = Tensor::zeros(DType::f32, {T, k});
    std::vector<bool> touched(E);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int32_t e;
        do e = static_cast<int32_t>(rng.next_u64() % E);
        while (std::find(ids_h.data<int32_t>() + t * k, ids_h.data<int32_t>() + t * k + j, e) !=
               ids_h.data<int32_t>() + t * k + j);
        ids_h.data<int32_t>()[t * k + j] = e;
        wts_h.data<float>()[t * k + j] = 1.0f / k;
        touched[e] = true;
      }
    const int64_t distinct = std::count(touched.begin(), touched.begin() + held, true);
    Tensor ids = b.upload(ids_h);
    Tensor wts = b.upload(wts_h);
    Tensor z = b.empty(DType::bf16, {T, L}), u = b.empty(ep > 1 ? DType::f32 : DType::bf16, {T, L});
    b.fill(z, b.pat().bf16_act);
    MoeExpertsArgs a{z.view(), ids.view(), wts.view(), w[0], w[1], w[2], u.view()};
    if (ep > 1) a.round_output = false, a.num_experts = E, a.whole_experts = true;
    const double bytes = distinct * expert_bytes +
                         static_cast<double>(z.nbytes() + u.nbytes() + ids.nbytes() + wts.nbytes());
    // Every CUDA strategy that takes this batch gets a row (name shortened: "gemv", "grouped",
    // "rowdot"); the one the registry picks is marked "*", so a faster strategy that is not picked shows.
    const std::string picked = b.reg().moe_experts.select(a, core::Device::cuda).name;
    for (const auto& impl : b.reg().moe_experts.impls()) {
      if (impl.device != core::Device::cuda || !impl.supports(a)) continue;
      const std::string strategy = impl.name.rfind("cuda_expert_", 0) == 0 ? impl.name.substr(12) : impl.name;
      b.row("moe", op + strategy + (impl.name == picked ? "*" : ""),
            experts + "x(" + std::to_string(I) + "x" + std::to_string(L) + ") top" + std::to_string(k) +
                " d=" + std::to_string(distinct),
            T, bytes, [&] { impl.run(a); });
    }
  }
}

// The router's top-k at K3's shape: fp32 logits in, ids and weights out.
void bench_router(OpBench& b) {
  const MoeRouterShape& s = kMoeRouterK3;
  Tensor bias = b.empty(DType::f32, {s.E});
  b.fill(bias, b.pat().f32_act);
  for (int64_t T : b.batches()) {
    Tensor logits = b.empty(DType::f32, {T, s.E}), ids = b.empty(DType::i32, {T, s.k}),
           w = b.empty(DType::f32, {T, s.k});
    b.fill(logits, b.pat().f32_act);
    const RouterTopkArgs ra{logits.view(), bias.view(), ids.view(), w.view()};
    b.row("moe", "router_topk", "E=" + std::to_string(s.E) + " k=" + std::to_string(s.k), T,
          static_cast<double>(logits.nbytes() + bias.nbytes() + 2 * w.nbytes()),
          [&] { b.reg().router_topk.run(ra, core::Device::cuda); });
  }
}

// The fused MoE tail (situ_glu, latent_up, the latent norm, shared_down, add in one op) at one TP8
// rank's shape, bf16 weights: the implementation the table selects is named in the shape. Bytes: both
// weights, the norm weight, u, the shared halves and out.
void bench_moe_tail(OpBench& b) {
  const MoeTailShape& s = kMoeTailK3Tp8;
  LinearWeight latent_up, shared_down;
  latent_up.weight = b.empty(DType::bf16, {s.hidden, s.L});
  shared_down.weight = b.empty(DType::bf16, {s.hidden, s.SI});
  Tensor latent_norm = b.empty(DType::bf16, {s.L});  // non-const: one pointer type in the fill list
  for (const Tensor* t : {&latent_up.weight, &shared_down.weight, &latent_norm}) b.fill(*t, b.pat().bf16_weight);
  for (int64_t T : b.batches()) {
    const Tensor u = b.empty(DType::bf16, {T, s.L}), gate = b.empty(DType::bf16, {T, s.SI});
    const Tensor up = b.empty(DType::bf16, {T, s.SI}), out = b.empty(DType::bf16, {T, s.hidden});
    for (const Tensor* t : {&u, &gate, &up}) b.fill(*t, b.pat().bf16_act);
    MoeTailCombineArgs a;
    a.u = u.view(), a.latent_norm = latent_norm.view(), a.latent_up = &latent_up;
    a.shared_gate = gate.view(), a.shared_up = up.view(), a.shared_down = &shared_down, a.out = out.view();
    const std::string impl = b.reg().moe_tail_combine.select(a, core::Device::cuda).name;
    const double bytes = static_cast<double>(latent_up.weight.nbytes() + shared_down.weight.nbytes() +
                                             latent_norm.nbytes() + u.nbytes() + gate.nbytes() + up.nbytes() +
                                             out.nbytes());
    b.row("moe", "moe_tail_combine (fused)", std::string(s.name) + " " + impl, T, bytes,
          [&] { b.reg().moe_tail_combine.run(a, core::Device::cuda); });
  }
}
}  // namespace

void bench_moe_ops(OpBench& b) {
  bench_moe_experts(b, kMoeExpertsK3Tp8, 1);
  bench_moe_experts(b, kMoeExpertsK3Ep8, kMoeExpertsK3EpRanks);
  bench_router(b);
  bench_moe_tail(b);
}

}  // namespace k3::kernels
