// kernels/registry/registry.cpp: registration of the CPU reference implementations.
#include "kernels/registry.h"

#include "backends/cpu/thread_pool.h"

namespace k3::kernels {

void register_reference_ops(Registry& r, std::shared_ptr<backends::cpu::ThreadPool> pool) {
  if (!pool) pool = std::make_shared<backends::cpu::ThreadPool>(backends::cpu::ThreadPool::machine_threads());
  const CpuOps cpu{std::move(pool)};
  r.for_each_family([&](auto& family) { family.register_reference(cpu); });
}

#ifndef K3_HAVE_CUDA
void register_cuda_ops(Registry&) {}  // no CUDA backend in this build (kernels/registry/cuda_registry.cpp)
void register_cuda_ops(Registry&, std::shared_ptr<backends::cuda::Context>) {}
#endif

}  // namespace k3::kernels
