// kernels/testing/slow_producer_cuda.cu: the slow producer and the PDL probe kernels of the op tests (what they
// do: slow_producer_cuda.h; why: op_harness.h "the slow-producer run").
#include "kernels/testing/slow_producer_cuda.h"

#include <string>

#include "kernels/cuda_common.cuh"

namespace k3::ops_test {

namespace {

using kernels::cuda_detail::pdl_launch_dependents;
using kernels::cuda_detail::pdl_wait;

// 16 CTAs of 256 threads: little of the GPU, so the op's kernels find room beside the spinning CTAs.
constexpr int kBlocks = 16;
constexpr int kThreads = 256;

struct ProducerParams {
  LateWrite w[kMaxLateWrites];
  int n = 0;
  long long spin_cycles = 0;
  unsigned long long* end_ns = nullptr;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) slow_producer_kernel(const ProducerParams p) {
  pdl_launch_dependents();  // the op's first kernel may launch now and run up to its pdl_wait()
  const long long t0 = clock64();
  while (clock64() - t0 < p.spin_cycles) {
  }
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (int i = 0; i < p.n; ++i) {
    auto* dst = static_cast<unsigned char*>(p.w[i].dst);
    const auto* src = static_cast<const unsigned char*>(p.w[i].src);
    const uint64_t bytes = p.w[i].bytes;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15u) == 0) {
      const uint4 nan4 = make_uint4(~0u, ~0u, ~0u, ~0u);
      for (uint64_t k = tid; k < bytes / 16; k += threads)
        reinterpret_cast<uint4*>(dst)[k] = src != nullptr ? reinterpret_cast<const uint4*>(src)[k] : nan4;
    } else {
      for (uint64_t k = tid; k < bytes; k += threads) dst[k] = src != nullptr ? src[k] : 0xffu;
    }
  }
  if (p.end_ns != nullptr && blockIdx.x == 0) {
    __syncthreads();  // block 0's writes are issued
    if (threadIdx.x == 0) *p.end_ns = global_ns();
  }
}

__global__ void pdl_probe_kernel(unsigned long long* times) {
  const unsigned long long start = global_ns();  // before the wait: may run beside the producer
  pdl_wait();
  times[0] = start;  // stores after the wait (rule 1 of kernels/cuda_common.cuh)
  times[1] = global_ns();
}

}  // namespace

void queue_slow_producer(cudaStream_t stream, std::span<const LateWrite> writes, int64_t spin_cycles,
                         uint64_t* end_ns) {
  if (writes.size() > static_cast<size_t>(kMaxLateWrites))
    throw core::Error("queue_slow_producer: " + std::to_string(writes.size()) + " late writes, at most " +
                      std::to_string(kMaxLateWrites));
  ProducerParams p;
  for (size_t i = 0; i < writes.size(); ++i) p.w[i] = writes[i];
  p.n = static_cast<int>(writes.size());
  p.spin_cycles = spin_cycles;
  p.end_ns = reinterpret_cast<unsigned long long*>(end_ns);
  slow_producer_kernel<<<kBlocks, kThreads, 0, stream>>>(p);
  K3_CUDA_CHECK_LAUNCH("slow_producer_kernel");
}

void queue_pdl_probe(cudaStream_t stream, uint64_t* times) {
  kernels::cuda_detail::launch_dependent(pdl_probe_kernel, dim3(1), dim3(1), 0, stream, dim3(1, 1, 1),
                                         reinterpret_cast<unsigned long long*>(times));
  K3_CUDA_CHECK_LAUNCH("pdl_probe_kernel");
}

}  // namespace k3::ops_test
