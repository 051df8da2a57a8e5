// kernels/kda/conv.cpp: causal depthwise short convolution + SiLU with a rolling state (spec §5.2).
//
// Per channel c and token t (K = kernel width, 4 in K3):
//   out[t, c] = round( SiLU( sum_{i=0..K-1} w[c, i] * x_{t-K+1+i}[c] ) )   fp32 sum in order i = 0..K-1
// where x_{<0} are the K-1 values held in the state (zeros at the start of a sequence). After the
// call the state holds the last K-1 pre-conv inputs, oldest first, of (old state ++ x), so a split
// of one sequence over several calls gives the same outputs and state as one call.
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/kda/gate.h"
#include "kernels/kda/kda_check.h"

namespace k3::kernels {

core::Status kda_conv_check(const KdaConvArgs& a) {
  using kda_detail::describe;
  using kda_detail::expect_activation;
  using kda_detail::expect_f32;
  if (auto s = expect_f32(a.weight, "weight"); !s) return s;
  // [C, K], or the checkpoint's [C, 1, K] as is.
  const bool rank3 = a.weight.rank() == 3 && a.weight.dim(1) == 1;
  if (!(a.weight.rank() == 2 || rank3) || !a.weight.is_contiguous())
    return core::Status::fail("weight must be contiguous F32 [C, K] (or [C, 1, K]), got " + describe(a.weight));
  const int64_t C = a.weight.dim(0), K = a.weight.dim(a.weight.rank() - 1);
  if (K < 1) return core::Status::fail("weight kernel width K must be >= 1, got " + describe(a.weight));
  if (a.x.rank() != 2) return core::Status::fail("x must be rank 2 [T, C], got " + describe(a.x));
  const int64_t T = a.x.dim(0);
  if (auto s = expect_activation(a.x, "x", T, C, " (T, C = weight rows)"); !s) return s;
  if (auto s = expect_activation(a.out, "out", T, C, " (T, C)"); !s) return s;
  // The conv state holds bf16 values: an f32 tensor on the CPU, f32 or real bf16 on CUDA.
  if (!is_activation_dtype(a.state))
    return core::Status::fail("state must be F32 (or BF16 on CUDA), got " + describe(a.state));
  if (!(a.state.shape == core::Shape{C, K - 1}) || !a.state.is_contiguous())
    return core::Status::fail("state must be contiguous F32 [" + std::to_string(C) + ", " +
                              std::to_string(K - 1) + "] (C, K-1), got " + describe(a.state));
  return core::Status::ok();
}

void kda_conv_reference(const KdaConvArgs& a) {
  if (core::Status s = kda_conv_check(a); !s) throw core::Error("kda_conv: " + s.reason());
  const int64_t C = a.weight.dim(0), K = a.weight.dim(a.weight.rank() - 1), T = a.x.dim(0);
  const float* weight = a.weight.as<const float>();
  float* state = a.state.as<float>();
  // Channels are independent: each is computed by one task, in token order.
  backends::cpu::ThreadPool::shared().parallel_for(
      C,
      [&](int64_t c_begin, int64_t c_end) {
        std::vector<float> window(static_cast<size_t>(K));  // x_{t-K+1} .. x_t of one channel
        for (int64_t c = c_begin; c < c_end; ++c) {
          const float* w = weight + c * K;
          float* st = state + c * (K - 1);
          for (int64_t i = 0; i < K - 1; ++i) window[i] = st[i];
          for (int64_t t = 0; t < T; ++t) {
            // In bf16 mode the inputs are bf16 values already; rounding them again is a no-op that
            // keeps "state holds bf16" true even for an unrounded caller.
            window[K - 1] = round_act(kda_detail::row_f32(a.x, t)[c], a.precision);
            float sum = 0.0f;
            for (int64_t i = 0; i < K; ++i) sum += w[i] * window[i];
            // out is written after x[t, c] was read, so out may alias x.
            kda_detail::row_f32_mut(a.out, t)[c] = round_act(kda_detail::silu_f32(sum), a.precision);
            for (int64_t i = 0; i + 1 < K; ++i) window[i] = window[i + 1];
          }
          for (int64_t i = 0; i < K - 1; ++i) st[i] = window[i];
        }
      },
      64);
}

}  // namespace k3::kernels
