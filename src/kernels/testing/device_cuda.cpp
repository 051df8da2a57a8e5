// kernels/testing/device_cuda.cpp: the CUDA device adapter of the op test harness (K3_HAVE_CUDA builds).
#include <memory>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/graph.h"
#include "kernels/registry.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {

namespace {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(std::shared_ptr<backends::cuda::Context> ctx) : ctx_(std::move(ctx)) {
    kernels::register_reference_ops(registry_);
    kernels::register_cuda_ops(registry_, ctx_);
    // The op tests check every implementation against the reference, and which one the stated
    // order (tuning/default.json) picks at each shape and after each refusal: they select by that
    // order on every GPU, not by the GPU's own table (the model's GPU tests run with that one).
    registry_.set_tuning(core::Device::cuda, kernels::Tuning{nullptr, kernels::builtin_tuning("").fallback});
  }
  core::Device kind() const override { return core::Device::cuda; }
  std::string impl_prefix() const override { return "cuda_"; }
  kernels::Registry& registry() override { return registry_; }
  Tensor upload(const Tensor& host, DType as) override {
    return backends::cuda::upload(host.view(), as, ctx_->pool(), ctx_->stream());
  }
  Tensor poisoned(DType dtype, Shape shape) override {
    return backends::cuda::empty_poisoned(ctx_->pool(), dtype, shape, ctx_->stream());
  }
  Tensor to_host_f32(const TensorView& v) override { return backends::cuda::download_f32(v, ctx_->stream()); }
  Tensor to_host(const TensorView& v) override { return backends::cuda::download(v, ctx_->stream()); }
  void synchronize() override { K3_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream())); }
  int64_t kernels_queued_by(const std::function<void()>& op) override {
    return static_cast<int64_t>(backends::cuda::Graph::capture(*ctx_, op).kernel_nodes());
  }

 private:
  std::shared_ptr<backends::cuda::Context> ctx_;
  kernels::Registry registry_;
};

}  // namespace

Device* Device::cuda(std::string* why) {
  static std::string reason;
  static CudaDevice* device = []() -> CudaDevice* {
    if (backends::cuda::device_count(&reason) == 0) return nullptr;
    try {
      return new CudaDevice(backends::cuda::Context::create(0));
    } catch (const std::exception& e) {
      reason = e.what();
      return nullptr;
    }
  }();
  if (!device && why) *why = reason;
  return device;
}

}  // namespace k3::ops_test
