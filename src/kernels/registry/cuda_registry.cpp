// kernels/registry/cuda_registry.cpp: registration of every op's CUDA implementation (K3_HAVE_CUDA).
#include <memory>
#include <string>

#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "kernels/registry.h"

namespace k3::kernels {

namespace {
void register_all(Registry& r, const CudaOps& ops) {
  r.for_each_family([&](auto& family) { family.register_cuda(ops); });
  // Which capable implementation runs: this GPU's table, then tuning/default.json (kernels/tuning.h).
  r.set_tuning(core::Device::cuda, builtin_tuning(ops.ctx ? ops.ctx->info().name : std::string()));
}
}  // namespace

void register_cuda_ops(Registry& r, std::shared_ptr<backends::cuda::Context> ctx) {
  K3_CHECK(ctx != nullptr, "register_cuda_ops: context is null");
  register_all(r, CudaOps{std::move(ctx), ""});
}

void register_cuda_ops(Registry& r) {
  CudaOps ops;
  std::string why;
  if (backends::cuda::device_count(&why) > 0) {
    try {
      ops.ctx = backends::cuda::Context::create(0);
    } catch (const core::Error& e) {
      ops.unavailable = e.what();
    }
  } else {
    ops.unavailable = why;
  }
  register_all(r, ops);
}

}  // namespace k3::kernels
