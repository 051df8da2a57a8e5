// comm/rank_sum.h: the device side of the rank-order sum contract (comm/communicator.h): a kernel
// that adds n rank chunks gathered into one buffer, in rank order, accumulating in fp32 and rounding
// bf16 once. The NCCL communicator's exact all-reduce / reduce-scatter run it on each rank's chunk;
// the result is bit-identical to ThreadComm (the CPU oracle). Built only when K3_HAVE_CUDA.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace k3::comm {

// out[i] = (((c_0[i] + c_1[i]) + c_2[i]) + ... + c_{n-1}[i]) for i in [0, count), where
// c_q = chunks + q * chunk_stride (elements). dtype f32 or bf16 (both chunks and out); bf16 is
// widened to f32, summed in f32 and rounded to bf16 (round-to-nearest-even) once. `out` must not
// overlap the chunks. Enqueued on `stream`; nothing is launched when count == 0.
void rank_sum(const void* chunks, int64_t chunk_stride, int n, int64_t count, core::DType dtype, void* out,
              cudaStream_t stream);

}  // namespace k3::comm
