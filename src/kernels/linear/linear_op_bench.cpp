// kernels/linear/linear_op_bench.cpp: k3bench_ops_gpu's linear rows: every linear of one TP8 rank
// (spec §11), bf16 weights, at each decode batch; the implementation the table selects is named.
#include "kernels/testing/op_bench.h"

namespace k3::kernels {

void bench_linear_ops(OpBench& b) {
  using core::DType;
  struct Shape {
    const char* name;
    int64_t out, in;
    bool logits;
  };
  const Shape shapes[] = {{"kda.qkvg", 6144, 7168, false},      {"kda.f_a", 128, 7168, false},
                          {"kda.f_b", 1536, 128, false},        {"kda.b", 12, 7168, false},
                          {"attn.o_proj", 7168, 1536, false},   {"mla.q_a+kv_a", 2112, 7168, false},
                          {"mla.q_b", 2304, 1536, false},       {"mla.g", 1536, 7168, false},
                          {"moe.router", 896, 7168, true},      {"moe.latent_down", 3584, 7168, false},
                          {"moe.latent_up", 7168, 3584, false}, {"shared.gate_up", 1536, 7168, false},
                          {"shared.down", 7168, 768, false},    {"dense0.gate_up", 8448, 7168, false},
                          {"dense0.down", 7168, 4224, false},   {"lm_head", 20480, 7168, true}};
  for (const Shape& s : shapes) {
    LinearWeight w;
    w.weight = b.empty(DType::bf16, {s.out, s.in});
    b.fill(w.weight, b.pat().bf16_weight);
    for (int64_t T : b.batches()) {
      const core::Tensor x = b.empty(DType::bf16, {T, s.in});
      const core::Tensor y = b.empty(s.logits ? DType::f32 : DType::bf16, {T, s.out});
      b.fill(x, b.pat().bf16_act);
      const LinearArgs a{x.view(), &w, y.view(), !s.logits, Precision::bf16};
      const std::string impl = b.reg().linear.select(a, core::Device::cuda).name;
      const double bytes = static_cast<double>(w.weight.nbytes() + x.nbytes() + y.nbytes());
      b.row("linear", std::string(s.name) + (impl == "cuda_cublaslt" ? "" : " (" + impl + ")"),
            std::to_string(s.out) + "x" + std::to_string(s.in), T, bytes,
            [&] { b.reg().linear.run(a, core::Device::cuda); });
    }
  }
}

}  // namespace k3::kernels
