// kernels/testing/slow_producer_cuda.h: the slow producer of the PDL tests (slow_producer_cuda.cu): a kernel
// that triggers its programmatic dependents at once, spins, then writes the op's inputs (CUDA builds only).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

namespace k3::ops_test {

// One late write of the producer: `bytes` from src to dst, or 0xff bytes (NaN in f32, bf16 and fp8 e4m3)
// when src is null.
struct LateWrite {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};
inline constexpr int kMaxLateWrites = 32;

// Queues on `stream` (a normal launch: it follows all earlier work): a kernel that calls
// pdl_launch_dependents() first, spins `spin_cycles` SM clocks (clock64), then performs `writes` (at most
// kMaxLateWrites) and, when end_ns is given, stores the globaltimer of its end there (block 0, after the
// spin and its own writes). Throws core::Error past kMaxLateWrites.
void queue_slow_producer(cudaStream_t stream, std::span<const LateWrite> writes, int64_t spin_cycles,
                         uint64_t* end_ns = nullptr);

// Queues a probe kernel as a programmatic dependent (launch_dependent) of whatever kernel came before it:
// times[0] = globaltimer when it starts, times[1] after its pdl_wait(). One CTA, one thread.
void queue_pdl_probe(cudaStream_t stream, uint64_t* times);

}  // namespace k3::ops_test
