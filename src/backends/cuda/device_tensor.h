// backends/cuda/device_tensor.h: device tensors as core::Tensor (view.device = Device::cuda, the
// keep-alive returns the block to a DevicePool) and copies between them and CPU tensors.
//
// Activations on CUDA are bf16 (engine mode) or f32; upload() converts a CPU f32 tensor to bf16
// when asked (round to nearest even, as core::bf16_round) and download_f32() widens back, so a test
// can feed one CPU tensor to both backends and compare. Copies here are synchronous on `stream`
// (they return when the data is in place): they are for loading and testing, not the step loop.
#pragma once
#include <cuda_runtime.h>

#include "backends/cuda/memory_pool.h"
#include "core/tensor.h"

namespace k3::backends::cuda {

// Uninitialised contiguous device tensor.
core::Tensor empty(DevicePool& pool, core::DType dtype, core::Shape shape);
// Device tensor filled with a NaN pattern (all bytes 0xff: NaN in f32, bf16 and fp8 e4m3; -1 in
// integers), so an output an op forgets to write is caught. Works on row-strided rank-2 views too.
core::Tensor empty_poisoned(DevicePool& pool, core::DType dtype, core::Shape shape, cudaStream_t stream);
void poison_nan(const core::TensorView& dev, cudaStream_t stream);

// Copies a CPU tensor (contiguous) to a new device tensor. `as` may differ from the source dtype
// only for f32 -> bf16 (activations); otherwise the bytes are copied as they are (bf16 weights,
// MXFP4 codes and scales, fp8 caches, ids).
core::Tensor upload(const core::TensorView& host, DevicePool& pool, cudaStream_t stream);
core::Tensor upload(const core::TensorView& host, core::DType as, DevicePool& pool, cudaStream_t stream);
// Copies host bytes into an existing device view of the same shape and dtype (contiguous or
// row-strided rank 2).
void copy_to_device(const core::TensorView& host, const core::TensorView& dev, cudaStream_t stream);

// Copies a device view (contiguous or row-strided rank 2) to a new contiguous CPU tensor of the
// same dtype.
core::Tensor download(const core::TensorView& dev, cudaStream_t stream);
// The same, widened to f32 (bf16, f8_e4m3 and f32 sources): for comparisons against the oracle.
core::Tensor download_f32(const core::TensorView& dev, cudaStream_t stream);

// A view of rows [r0, r0 + n) of a rank-2 view (same storage, same strides).
core::TensorView rows_of(const core::TensorView& v, int64_t r0, int64_t n);
// A view of columns [c0, c0 + n) of a rank-2 view (row-strided, same storage).
core::TensorView cols_of(const core::TensorView& v, int64_t c0, int64_t n);

}  // namespace k3::backends::cuda
