// kernels/kda/cuda_conv.cu: CUDA causal depthwise short conv + SiLU (spec §5.2), batched over
// sequences: grid (channel blocks, sequences), one thread per (channel, sequence) walking that
// sequence's rows in order (so out may alias x, as in the reference):
//   out[t, c] = round(SiLU(sum_{i=0..K-1} w[c, i] * x_{t-K+1+i}[c]))     fp32, i in order
// with x_{<0} from the sequence's state slot, which ends holding the last K-1 inputs (bf16 values;
// a bf16 or f32 pool on CUDA). The rows and slot come from the SeqBatch tables in device memory;
// the grid depends only on C and num_seqs. Kernel widths up to kMaxWidth.
#include "kernels/cuda_common.cuh"
#include "kernels/kda/kda.h"
#include "kernels/kda/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 64;
constexpr int kMaxWidth = 8;

template <class T, class S>
__global__ void __launch_bounds__(kThreads)
    conv_kernel(const T* x, int64_t x_ld, const float* weight, S* state, int64_t slot_stride, T* out, int64_t out_ld,
                int64_t C, int K, const int32_t* row_begin, const int32_t* num_rows, const int32_t* slots, int max_rows,
                bool round, bool commit) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int s = blockIdx.y;
  const int n_raw = num_rows[s];
  const int n = n_raw < 0 ? 0 : (n_raw > max_rows ? max_rows : n_raw);  // never past what the caller sized
  const int64_t row0 = row_begin[s];
  // This sequence's slot, channel c: K-1 entries (K = 1 keeps no state and never touches it).
  S* st = state + static_cast<int64_t>(slots[s]) * slot_stride + c * (K - 1);
  float w[kMaxWidth], window[kMaxWidth];
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i) {
    w[i] = i < K ? weight[c * K + i] : 0.0f;
    window[i] = i < K - 1 ? to_f32(st[i]) : 0.0f;
  }
  for (int r = 0; r < n; ++r) {
    const int64_t t = row0 + r;
    // Inputs are bf16 values in bf16 mode already; rounding again keeps "the state holds bf16".
    const float xt = round_if(to_f32(x[t * x_ld + c]), round);
#pragma unroll
    for (int i = 0; i < kMaxWidth; ++i)
      if (i == K - 1) window[i] = xt;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxWidth; ++i)
      if (i < K) sum += w[i] * window[i];
    store_act(out + t * out_ld + c, sum / (1.0f + expf(-sum)), round);  // SiLU = x / (1 + e^-x)
#pragma unroll
    for (int i = 0; i + 1 < kMaxWidth; ++i)
      if (i + 1 < K) window[i] = window[i + 1];
  }
  if (!commit) return;  // speculative verify (KdaConvArgs::no_commit): the slot keeps its state
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i)
    if (i < K - 1) store_act(st + i, window[i], false);
}

}  // namespace

void register_kda_conv_cuda(KdaOps& r, const CudaOps& ops) {
  r.kda_conv.add(
      {"cuda_channel_scan", core::Device::cuda,
       [ops](const KdaConvArgs& a) {
         if (auto s = all_of({ops.usable(),
                              on_cuda({{"x", &a.x}, {"weight", &a.weight}, {"state", &a.state}, {"out", &a.out}}),
                              same_act({{"x", &a.x}, {"out", &a.out}}, a.precision)});
             !s)
           return s;
         if (a.seqs.num_seqs > 0)  // (an empty batch may leave its tables unset)
           if (auto s = on_cuda({{"seqs.row_begin", &a.seqs.row_begin},
                                 {"seqs.num_rows", &a.seqs.num_rows},
                                 {"seqs.slot", &a.seqs.slot}});
               !s)
             return s;
         if (a.seqs.num_seqs > 65535)
           return core::Status::fail("seqs.num_seqs " + std::to_string(a.seqs.num_seqs) +
                                     " is above the CUDA limit 65535 per call");
         const int64_t K = a.weight.dim(a.weight.rank() - 1);
         if (K > kMaxWidth)
           return core::Status::fail("kernel width K = " + std::to_string(K) + " is above the CUDA limit " +
                                     std::to_string(kMaxWidth));
         return core::Status::ok();
       },
       [ops](const KdaConvArgs& a) {
         const int64_t C = a.weight.dim(0);
         const int K = static_cast<int>(a.weight.dim(a.weight.rank() - 1));
         if (C == 0 || a.seqs.num_seqs == 0 || a.x.dim(0) == 0) return;
         const int64_t slot_stride = a.state.dim(0) > 1 ? a.state.strides[0] : 0;
         with_act(a.x.dtype, [&](auto xt) {
           using E = typename decltype(xt)::type;
           with_act(a.state.dtype, [&](auto st) {
             using S = typename decltype(st)::type;
             const dim3 grid(grid_for(C, kThreads), static_cast<unsigned>(a.seqs.num_seqs));
             conv_kernel<E, S><<<grid, kThreads, 0, ops.ctx->stream()>>>(
                 a.x.as<const E>(), a.x.strides[0], a.weight.as<const float>(), a.state.as<S>(), slot_stride,
                 a.out.as<E>(), a.out.strides[0], C, K, a.seqs.row_begin.as<const int32_t>(),
                 a.seqs.num_rows.as<const int32_t>(), a.seqs.slot.as<const int32_t>(), a.seqs.max_rows,
                 a.precision == Precision::bf16, !a.no_commit);
             K3_CUDA_CHECK_LAUNCH("conv_kernel");
           });
         });
       }});
}

}  // namespace k3::kernels
