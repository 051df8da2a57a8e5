// kernels/kda/conv.cpp: causal depthwise short convolution + SiLU with a rolling state (spec §5.2).
//
// Per channel c and token t (K = kernel width, 4 in K3):
//   out[t, c] = round( SiLU( sum_{i=0..K-1} w[c, i] * x_{t-K+1+i}[c] ) )   fp32 sum in order i = 0..K-1
// where x_{<0} are the K-1 values held in the sequence's state slot (zeros at the start of a
// sequence). After the call the slot holds the last K-1 pre-conv inputs, oldest first, of
// (old state ++ its rows of x), so a split of one sequence over several calls gives the same
// outputs and state as one call. Sequences (own rows, own slot) are independent.
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
  if (auto s = kda_detail::expect_pool(a.state, "state", {C, K - 1}, " (C, K-1)"); !s) return s;
  if (a.state.device != a.x.device)
    return core::Status::fail("state must be on the device of x, got " + describe(a.state));
  return kda_detail::check_seq_batch(a.seqs, T, a.state.dim(0), a.x.device, /*need_position=*/false);
}

void kda_conv_reference(const KdaConvArgs& a, backends::cpu::ThreadPool* pool) {
  if (core::Status s = kda_conv_check(a); !s) throw core::Error("kda_conv: " + s.reason());
  const int64_t C = a.weight.dim(0), K = a.weight.dim(a.weight.rank() - 1);
  const std::vector<kda_detail::HostSeq> seqs = kda_detail::host_seqs(a.seqs, false);
  if (seqs.empty() || C == 0) return;
  const float* weight = a.weight.as<const float>();
  // Channels are independent, and so are sequences: each task takes a channel range and walks
  // every sequence's rows in token order (one parallel_for however many sequences).
  backends::cpu::parallel_for(
      pool, C,
      [&](int64_t c_begin, int64_t c_end) {
        std::vector<float> window(static_cast<size_t>(K));  // x_{t-K+1} .. x_t of one channel
        for (const kda_detail::HostSeq& sq : seqs) {
          // This sequence's slot: [C, K-1] contiguous (K = 1 keeps no state at all).
          float* slot = K > 1 ? a.state.as<float>() + sq.slot * a.state.strides[0] : nullptr;
          for (int64_t c = c_begin; c < c_end; ++c) {
            const float* w = weight + c * K;
            float* st = K > 1 ? slot + c * (K - 1) : nullptr;
            for (int64_t i = 0; i < K - 1; ++i) window[i] = st[i];
            for (int64_t t = sq.row_begin; t < sq.row_begin + sq.num_rows; ++t) {
              // In bf16 mode the inputs are bf16 values already; rounding them again is a no-op that
              // keeps "state holds bf16" true even for an unrounded caller.
              window[K - 1] = round_act(kda_detail::row_f32(a.x, t)[c], a.precision);
              float sum = 0.0f;
              for (int64_t i = 0; i < K; ++i) sum += w[i] * window[i];
              // out is written after x[t, c] was read, so out may alias x.
              kda_detail::row_f32_mut(a.out, t)[c] = round_act(kda_detail::silu_f32(sum), a.precision);
              for (int64_t i = 0; i + 1 < K; ++i) window[i] = window[i + 1];
            }
            if (!a.no_commit)  // a verify call leaves the committed state as it was
              for (int64_t i = 0; i < K - 1; ++i) st[i] = window[i];
          }
        }
      },
      64);
}

}  // namespace k3::kernels
