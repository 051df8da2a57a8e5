// backends/cuda/cuda_memory.cpp: CudaMemory, core::DeviceMemory over a Context.
#include "backends/cuda/cuda_memory.h"

#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/graph.h"

namespace k3::backends::cuda {

namespace {

// (rows, row bytes, pitch bytes) of a contiguous view (one row) or a row-strided rank-2 view.
struct Rows {
  size_t rows, bytes, pitch;
};
Rows rows_of_view(const core::TensorView& v, const char* what) {
  if (v.is_contiguous()) return {1, static_cast<size_t>(v.nbytes()), static_cast<size_t>(v.nbytes())};
  K3_CHECK(v.rank() == 2 && v.strides[1] == 1 && v.strides[0] >= v.dim(1),
           std::string(what) + ": views must be contiguous or row-strided rank 2, got " + v.shape.str());
  const size_t e = core::dtype_size(v.dtype);
  return {static_cast<size_t>(v.dim(0)), static_cast<size_t>(v.dim(1)) * e, static_cast<size_t>(v.strides[0]) * e};
}

class CudaMemory final : public core::DeviceMemory {
 public:
  explicit CudaMemory(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  core::Device device() const override { return core::Device::cuda; }
  core::Tensor empty(core::DType dtype, core::Shape shape) override { return cuda::empty(ctx_->pool(), dtype, shape); }
  void fill_bytes(const core::TensorView& dst, uint8_t byte) override {
    K3_CHECK(dst.device == core::Device::cuda, "fill_bytes: view is not on the CUDA device");
    if (dst.numel() == 0) return;
    const Rows r = rows_of_view(dst, "fill_bytes");
    K3_CUDA_CHECK(cudaMemset2DAsync(dst.data, r.pitch, byte, r.bytes, r.rows, ctx_->stream()));
  }
  core::Tensor upload(const core::TensorView& host, core::DType as) override {
    return cuda::upload(host, as, ctx_->pool(), ctx_->stream());
  }
  void copy_from_host(const core::TensorView& dst, const core::TensorView& host) override {
    cuda::copy_to_device(host, dst, ctx_->stream());  // waits: the host view may go right after
  }
  void copy(const core::TensorView& dst, const core::TensorView& src) override {
    K3_CHECK(dst.device == core::Device::cuda && src.device == core::Device::cuda,
             "DeviceMemory::copy: both views must be on the CUDA device");
    K3_CHECK(dst.dtype == src.dtype && dst.shape == src.shape,
             "DeviceMemory::copy: dtype/shape mismatch " + dst.shape.str() + " vs " + src.shape.str());
    if (dst.numel() == 0) return;
    const Rows d = rows_of_view(dst, "copy"), s = rows_of_view(src, "copy");
    // A contiguous rank-2 view on one side and a strided one on the other: copy row by row.
    const size_t rows = std::max(d.rows, s.rows), bytes = std::min(d.bytes, s.bytes);
    const size_t dp = d.rows == rows ? d.pitch : bytes, sp = s.rows == rows ? s.pitch : bytes;
    K3_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dp, src.data, sp, bytes, rows, cudaMemcpyDeviceToDevice, ctx_->stream()));
  }
  core::Tensor download_f32(const core::TensorView& src) override { return cuda::download_f32(src, ctx_->stream()); }
  void synchronize() override { K3_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream())); }
  void mark() override {
    cudaEvent_t e = nullptr;
    K3_CUDA_CHECK(cudaEventCreate(&e));
    marks_.push_back(e);
    K3_CUDA_CHECK(cudaEventRecord(e, ctx_->stream()));
  }
  std::vector<double> take_marks_ms() override {
    std::vector<double> ms;
    if (marks_.empty()) return ms;
    synchronize();
    for (cudaEvent_t e : marks_) {
      float t = 0.0f;
      K3_CUDA_CHECK(cudaEventElapsedTime(&t, marks_.front(), e));
      ms.push_back(t);
    }
    release_marks();
    return ms;
  }
  ~CudaMemory() override { release_marks(); }
  void make_current() override { K3_CUDA_CHECK(cudaSetDevice(ctx_->device())); }
  std::unique_ptr<core::CapturedWork> capture(const std::function<void()>& body) override {
    struct CapturedGraph final : core::CapturedWork {
      explicit CapturedGraph(Graph g) : graph(std::move(g)) {}
      void replay() override { graph.replay(); }
      size_t kernel_launches() const override { return graph.kernel_nodes(); }
      Graph graph;
    };
    return std::make_unique<CapturedGraph>(Graph::capture(*ctx_, body));
  }

 private:
  void release_marks() {
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);  // no check: also runs from the destructor
    marks_.clear();
  }
  std::shared_ptr<Context> ctx_;
  std::vector<cudaEvent_t> marks_;  // mark(): events on the stream, read by take_marks_ms()
};

}  // namespace

std::shared_ptr<core::DeviceMemory> make_device_memory(std::shared_ptr<Context> ctx) {
  K3_CHECK(ctx != nullptr, "make_device_memory: no CUDA context");
  return std::make_shared<CudaMemory>(std::move(ctx));
}

}  // namespace k3::backends::cuda
