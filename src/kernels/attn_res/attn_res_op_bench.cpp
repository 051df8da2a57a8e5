// kernels/attn_res/attn_res_op_bench.cpp: k3bench_ops_gpu's AttnRes rows at K3's shape (cases.h
// kAttnResK3: hidden 7168, 9 bank rows, 24 mixes) at each decode batch: the standard attn_res_mix over
// 9 bank rows and the prefix, and the fused pair that replaces it: attn_res_bank (one pass over the
// bank for all 24 mixes of a block) and attn_res_merge (one sublayer tail: add, the mix's merge with
// the bank partials, rmsnorm). Bytes: what each reads and writes once.
#include <vector>

#include "kernels/attn_res/cases.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

void bench_attn_res_ops(OpBench& b) {
  using core::DType;
  using core::Tensor;
  const AttnResShape& s = kAttnResK3;
  const int64_t D = s.D;
  std::vector<Tensor> queries, norms;
  for (int m = 0; m < s.mixes; ++m) {
    queries.push_back(b.empty(DType::bf16, {1, D}));
    norms.push_back(b.empty(DType::bf16, {D}));
    b.fill(queries.back(), b.pat().bf16_weight), b.fill(norms.back(), b.pat().bf16_weight);
  }
  const Tensor rms_w = b.empty(DType::bf16, {D});
  b.fill(rms_w, b.pat().bf16_weight);
  std::vector<core::TensorView> query_views, norm_views;
  for (int m = 0; m < s.mixes; ++m) query_views.push_back(queries[m].view()), norm_views.push_back(norms[m].view());
  const double weight_row = static_cast<double>(D) * 2;
  for (int64_t T : b.batches()) {
    const double row = static_cast<double>(T * D * 2);
    std::vector<Tensor> bank;
    for (int j = 0; j < s.bank_rows + 1; ++j) bank.push_back(b.empty(DType::bf16, {T, D}));
    for (const Tensor& r : bank) b.fill(r, b.pat().bf16_act);
    std::vector<core::TensorView> sources;
    for (const Tensor& r : bank) sources.push_back(r.view());
    const Tensor mixed = b.empty(DType::bf16, {T, D});
    b.row("attn_res", "attn_res_mix 10 sources", "D=7168", T, (s.bank_rows + 2) * row + 2 * weight_row, [&] {
      b.reg().attn_res_mix.run({sources, queries[0].view(), norms[0].view(), mixed.view()}, core::Device::cuda);
    });
    // The fused form: the bank pass over the 9 bank rows (the prefix is the merge's), then one merge.
    const std::span<const core::TensorView> bank_rows(sources.data(), static_cast<size_t>(s.bank_rows));
    const Tensor acc = b.empty(DType::f32, {s.mixes, T, D}), stats = b.empty(DType::f32, {s.mixes, T, 2});
    const AttnResBankArgs bank_args{bank_rows, query_views, norm_views, acc.view(), stats.view()};
    b.row("attn_res", "attn_res_bank (fused)", std::string(s.name) + " n=9 M=24", T,
          s.bank_rows * row + 2 * s.mixes * weight_row + static_cast<double>(acc.nbytes() + stats.nbytes()),
          [&] { b.reg().attn_res_bank.run(bank_args, core::Device::cuda); });
    const Tensor sublayer = b.empty(DType::bf16, {T, D}), prefix_out = b.empty(DType::bf16, {T, D});
    const Tensor normed = b.empty(DType::bf16, {T, D});
    b.fill(sublayer, b.pat().bf16_act);
    AttnResMergeArgs merge;
    merge.prefix = sources.back(), merge.sublayer_out = sublayer.view();
    merge.bank_acc = acc.view().row(0), merge.bank_stats = stats.view().row(0);
    merge.query = queries[0].view(), merge.norm = norms[0].view(), merge.rmsnorm_weight = rms_w.view();
    merge.prefix_out = prefix_out.view(), merge.normed_out = normed.view();
    const std::string impl = b.reg().attn_res_merge.select(merge, core::Device::cuda).name;
    b.row("attn_res", "attn_res_merge (fused)", std::string(s.name) + " n=9 " + impl, T,
          4 * row + static_cast<double>(T * D * 4 + T * 2 * 4) + 3 * weight_row,
          [&] { b.reg().attn_res_merge.run(merge, core::Device::cuda); });
  }
}

}  // namespace k3::kernels
