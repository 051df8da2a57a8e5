// kernels/elementwise/elementwise_op_bench.cpp: k3bench_ops_gpu's elementwise rows at each decode
// batch: add over hidden 7168 (the residual) and sigmoid_gate over one TP8 rank's attention output
// (12 heads of 128). Bytes: two rows in, one out.
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

void bench_elementwise_ops(OpBench& b) {
  using core::DType;
  for (int64_t T : b.batches()) {
    const core::Tensor x = b.empty(DType::bf16, {T, 7168}), r = b.empty(DType::bf16, {T, 7168});
    const core::Tensor sum = b.empty(DType::bf16, {T, 7168});
    b.fill(x, b.pat().bf16_act), b.fill(r, b.pat().bf16_act);
    b.row("elementwise", "add", "D=7168", T, 3.0 * static_cast<double>(x.nbytes()), [&] {
      b.reg().add.run({x.view(), r.view(), sum.view()}, core::Device::cuda);
    });
    const core::Tensor o = b.empty(DType::bf16, {T, 1536}), g = b.empty(DType::bf16, {T, 1536});
    const core::Tensor gated = b.empty(DType::bf16, {T, 1536});
    b.fill(o, b.pat().bf16_act), b.fill(g, b.pat().bf16_act);
    b.row("elementwise", "sigmoid_gate", "D=1536", T, 3.0 * static_cast<double>(o.nbytes()), [&] {
      b.reg().sigmoid_gate.run({o.view(), g.view(), gated.view()}, core::Device::cuda);
    });
  }
}

}  // namespace k3::kernels
