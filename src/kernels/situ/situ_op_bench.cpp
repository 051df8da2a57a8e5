// kernels/situ/situ_op_bench.cpp: k3bench_ops_gpu's SiTU row: situ_glu over one TP8 rank's shared
// expert width (2 x 3072 / 8 = 768) at each decode batch, gate and up as column slices of wider rows
// (as the fused gate_up projection writes them). Bytes: gate and up in, the activation out.
#include "backends/cuda/device_tensor.h"
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

void bench_situ_ops(OpBench& b) {
  using core::DType;
  constexpr int64_t kWidth = 768;
  for (int64_t T : b.batches()) {
    const core::Tensor gate_up = b.empty(DType::bf16, {T, 2 * kWidth}), act = b.empty(DType::bf16, {T, kWidth});
    b.fill(gate_up, b.pat().bf16_act);
    const core::TensorView g = backends::cuda::cols_of(gate_up.view(), 0, kWidth);
    const core::TensorView up = backends::cuda::cols_of(gate_up.view(), kWidth, kWidth);
    b.row("situ", "situ_glu", "I=768", T, 3.0 * static_cast<double>(act.nbytes()), [&] {
      b.reg().situ_glu.run({g, up, act.view()}, core::Device::cuda);
    });
  }
}

}  // namespace k3::kernels
