// runner/model_runner.cpp: ModelRunner.
#include "runner/model_runner.h"

#include "core/log.h"
#include "fastpath/fused_decode.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/context.h"
#include "backends/cuda/cuda_memory.h"
#include "kernels/registry.h"
#endif

namespace k3::runner {

std::unique_ptr<ModelRunner> ModelRunner::open(const std::filesystem::path& dir, const model::ModelOptions& options,
                                               model::KvCacheDtype kv_cache,
                                               const checkpoint::LoadProgressFn& progress) {
  return std::make_unique<ModelRunner>(checkpoint::load_checkpoint(dir, progress), options, kv_cache);
}

ModelRunner::ModelRunner(checkpoint::LoadedModel loaded, const model::ModelOptions& options,
                         model::KvCacheDtype kv_cache)
    : loaded_(std::move(loaded)), kv_cache_(kv_cache) {
  kernels::register_reference_ops(registry_);
  memory_ = core::make_host_memory();
  if (options.device == core::Device::cuda) {
#ifdef K3_HAVE_CUDA
    auto ctx = backends::cuda::Context::create(0);
    kernels::register_cuda_ops(registry_, ctx);
    memory_ = backends::cuda::make_device_memory(ctx);
#else
    throw core::Error("device cuda: this build has no CUDA backend (configure with nvcc present)");
#endif
  }
  device_weights_ = model::to_device(loaded_.weights, *memory_);
  // Each op's first choice of implementation, with the tuning rule behind it (--log-level debug).
  registry_.set_log([](const std::string& line) { log::debug(line); });
  model_ = std::make_unique<model::Model>(loaded_.config, device_weights_, registry_, options, memory_);
  fastpath::attach(*model_, 0);
}

}  // namespace k3::runner
