// backends/cuda/cuda_memory.h: core::DeviceMemory on a CUDA Context (its pool and stream), so the
// model code allocates, fills and copies device tensors in the same stream order as the ops.
#pragma once
#include <memory>

#include "backends/cuda/context.h"
#include "core/device_memory.h"

namespace k3::backends::cuda {

std::shared_ptr<core::DeviceMemory> make_device_memory(std::shared_ptr<Context> ctx);

}  // namespace k3::backends::cuda
