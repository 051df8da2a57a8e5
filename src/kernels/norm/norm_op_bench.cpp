// kernels/norm/norm_op_bench.cpp: k3bench_ops_gpu's norm row: rmsnorm over hidden 7168 (replicated
// under TP) at each decode batch. Bytes: the rows in and out and the weight.
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

void bench_norm_ops(OpBench& b) {
  constexpr int64_t kHidden = 7168;
  const core::Tensor w = b.empty(core::DType::bf16, {kHidden});
  b.fill(w, b.pat().bf16_weight);
  for (int64_t T : b.batches()) {
    const core::Tensor x = b.empty(core::DType::bf16, {T, kHidden}), y = b.empty(core::DType::bf16, {T, kHidden});
    b.fill(x, b.pat().bf16_act);
    b.row("norm", "rmsnorm", "D=7168", T, static_cast<double>(x.nbytes() + y.nbytes() + w.nbytes()), [&] {
      b.reg().rmsnorm.run({x.view(), w.view(), y.view()}, core::Device::cuda);
    });
  }
}

}  // namespace k3::kernels
