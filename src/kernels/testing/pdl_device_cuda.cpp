// kernels/testing/pdl_device_cuda.cpp: the CUDA device of the slow-producer runs (op_harness.h "the slow-producer
// run"): staging, the plain / slow / graph runs and the PDL probe (K3_HAVE_CUDA builds).
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/graph.h"
#include "kernels/registry.h"
#include "kernels/testing/op_harness.h"
#include "kernels/testing/slow_producer_cuda.h"

namespace k3::ops_test {

namespace {

namespace cu = backends::cuda;

constexpr double kSpinUs = 200.0;  // the producer's spin: far longer than any op's pre-wait part

size_t bytes_of(const TensorView& v) { return static_cast<size_t>(v.numel()) * core::dtype_size(v.dtype); }

// SM clocks in `us` microseconds at the device's peak clock.
int64_t spin_cycles(int device, double us) {
  int khz = 0;
  K3_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  return static_cast<int64_t>(static_cast<double>(khz) * us / 1000.0);
}

class CudaStagedOp final : public StagedOp {
 public:
  CudaStagedOp(std::shared_ptr<cu::Context> ctx, const OpBuffers& b) : ctx_(std::move(ctx)), buffers_(b) {
    const auto check = [](const TensorView& v, const std::string& name) {
      if (v.device != core::Device::cuda || !v.is_contiguous() || v.data == nullptr)
        throw core::Error("StagedOp: " + name + " must be a contiguous CUDA view of a whole tensor, got " +
                          std::string(core::dtype_name(v.dtype)) + " " + v.shape.str());
    };
    for (size_t i = 0; i < b.inputs.size(); ++i) check(b.inputs[i], "inputs[" + std::to_string(i) + "]");
    for (size_t i = 0; i < b.outputs.size(); ++i) check(b.outputs[i], "outputs[" + std::to_string(i) + "]");
    for (const TensorView& in : b.inputs) {
      Tensor s = cu::empty(ctx_->pool(), in.dtype, in.shape);
      K3_CUDA_CHECK(cudaMemcpyAsync(s.view().data, in.data, bytes_of(in), cudaMemcpyDeviceToDevice, stream()));
      stash_.push_back(std::move(s));
    }
    K3_CUDA_CHECK(cudaStreamSynchronize(stream()));
    cycles_ = spin_cycles(ctx_->device(), kSpinUs);
  }

  std::vector<Tensor> run_plain(const std::function<void()>& op) override {
    for (size_t i = 0; i < buffers_.inputs.size(); ++i)
      K3_CUDA_CHECK(cudaMemcpyAsync(buffers_.inputs[i].data, stash_[i].view().data, bytes_of(buffers_.inputs[i]),
                                    cudaMemcpyDeviceToDevice, stream()));
    for (const TensorView& out : buffers_.outputs)
      K3_CUDA_CHECK(cudaMemsetAsync(out.data, 0xff, bytes_of(out), stream()));
    op();
    return snapshot();
  }

  std::vector<Tensor> run_after_slow_producer(const std::function<void()>& op) override {
    queue_slow_form();
    op();
    return snapshot();
  }

  std::vector<std::vector<Tensor>> replay_after_slow_producer(const std::function<void()>& op, int replays) override {
    cu::Graph graph = cu::Graph::capture(*ctx_, [&] {
      queue_slow_form();
      op();
    });
    std::vector<std::vector<Tensor>> out;
    for (int r = 0; r < replays; ++r) {
      graph.replay();
      out.push_back(snapshot());
    }
    return out;
  }

 private:
  cudaStream_t stream() const { return ctx_->stream(); }

  // NaN over every buffer, then the producer: after its spin it copies the stashed inputs back and
  // writes NaN over the outputs again.
  void queue_slow_form() {
    std::vector<LateWrite> writes;
    for (size_t i = 0; i < buffers_.inputs.size(); ++i) {
      const TensorView& in = buffers_.inputs[i];
      K3_CUDA_CHECK(cudaMemsetAsync(in.data, 0xff, bytes_of(in), stream()));
      writes.push_back({in.data, stash_[i].view().data, bytes_of(in)});
    }
    for (const TensorView& out : buffers_.outputs) {
      K3_CUDA_CHECK(cudaMemsetAsync(out.data, 0xff, bytes_of(out), stream()));
      writes.push_back({out.data, nullptr, bytes_of(out)});
    }
    queue_slow_producer(stream(), writes, cycles_);
  }

  // Outputs, then inputs, as host tensors (waits for the queued work).
  std::vector<Tensor> snapshot() {
    std::vector<Tensor> got;
    for (const TensorView& out : buffers_.outputs) got.push_back(cu::download(out, stream()));
    for (const TensorView& in : buffers_.inputs) got.push_back(cu::download(in, stream()));
    return got;
  }

  std::shared_ptr<cu::Context> ctx_;
  OpBuffers buffers_;
  std::vector<Tensor> stash_;  // device copies of the inputs as staged
  int64_t cycles_ = 0;
};

class CudaPdlDevice final : public PdlDevice {
 public:
  explicit CudaPdlDevice(std::shared_ptr<cu::Context> ctx) : ctx_(std::move(ctx)) {
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
    return cu::upload(host.view(), as, ctx_->pool(), ctx_->stream());
  }
  Tensor poisoned(DType dtype, Shape shape) override {
    return cu::empty_poisoned(ctx_->pool(), dtype, shape, ctx_->stream());
  }
  Tensor to_host_f32(const TensorView& v) override { return cu::download_f32(v, ctx_->stream()); }
  Tensor to_host(const TensorView& v) override { return cu::download(v, ctx_->stream()); }
  void synchronize() override { K3_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream())); }
  int64_t kernels_queued_by(const std::function<void()>& op) override {
    return static_cast<int64_t>(cu::Graph::capture(*ctx_, op).kernel_nodes());
  }

  std::unique_ptr<StagedOp> stage(const OpBuffers& buffers) override {
    return std::make_unique<CudaStagedOp>(ctx_, buffers);
  }

  PdlProbe probe(double spin_us) override {
    const Tensor times = cu::empty(ctx_->pool(), DType::i64, {3});
    uint64_t* t = static_cast<uint64_t*>(times.view().data);
    // Twice, timing the second: the first launch of a kernel loads its module (lazy loading), which
    // holds the launch until the stream is idle, so only a loaded kernel can show an early start.
    for (int run = 0; run < 2; ++run) {
      queue_slow_producer(ctx_->stream(), {}, spin_cycles(ctx_->device(), spin_us), t);
      queue_pdl_probe(ctx_->stream(), t + 1);
    }
    const Tensor host = cu::download(times.view(), ctx_->stream());
    const auto* h = host.data<const int64_t>();
    return {h[0], h[1], h[2]};
  }

 private:
  std::shared_ptr<cu::Context> ctx_;
  kernels::Registry registry_;
};

}  // namespace

PdlDevice* PdlDevice::cuda(std::string* why) {
  static std::string reason;
  static CudaPdlDevice* device = []() -> CudaPdlDevice* {
    if (cu::device_count(&reason) == 0) return nullptr;
    try {
      return new CudaPdlDevice(cu::Context::create(0));
    } catch (const std::exception& e) {
      reason = e.what();
      return nullptr;
    }
  }();
  if (!device && why) *why = reason;
  return device;
}

}  // namespace k3::ops_test
