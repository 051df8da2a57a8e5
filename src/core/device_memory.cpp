// core/device_memory.cpp: the CPU DeviceMemory.
#include "core/device_memory.h"

#include <chrono>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"

namespace k3::core {

namespace {

// Calls fn(dst_row_ptr, src_row_ptr, row_bytes) for each row of two same-shape views that are
// contiguous or row-strided rank 2.
template <class Fn>
void for_rows(const TensorView& a, const TensorView& b, Fn&& fn) {
  if (a.is_contiguous() && (!b.defined() || b.is_contiguous())) {
    fn(a.data, b.data, static_cast<size_t>(a.nbytes()));
    return;
  }
  K3_CHECK(a.rank() == 2 && a.strides[1] == 1 && (!b.data || (b.rank() == 2 && b.strides[1] == 1)),
           "DeviceMemory: views must be contiguous or row-strided rank 2");
  const size_t esz = dtype_size(a.dtype), row = static_cast<size_t>(a.dim(1)) * esz;
  for (int64_t r = 0; r < a.dim(0); ++r)
    fn(static_cast<char*>(a.data) + static_cast<size_t>(r * a.strides[0]) * esz,
       b.data ? static_cast<const char*>(b.data) + static_cast<size_t>(r * b.strides[0]) * esz : nullptr, row);
}

class HostMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::cpu; }
  void mark() override {
    std::lock_guard lk(marks_mu_);
    marks_.push_back(std::chrono::steady_clock::now());
  }
  std::vector<double> take_marks_ms() override {
    std::lock_guard lk(marks_mu_);
    std::vector<double> ms;
    for (const auto& t : marks_) ms.push_back(std::chrono::duration<double, std::milli>(t - marks_.front()).count());
    marks_.clear();
    return ms;
  }
  Tensor empty(DType dtype, Shape shape) override { return Tensor::zeros(dtype, shape); }
  void fill_bytes(const TensorView& dst, uint8_t byte) override {
    for_rows(dst, TensorView{}, [&](void* d, const void*, size_t n) { std::memset(d, byte, n); });
  }
  Tensor upload(const TensorView& host, DType as) override {
    K3_CHECK(host.device == Device::cpu, "upload: the source must be a CPU view");
    K3_CHECK(as == host.dtype, "the CPU backend keeps activations in f32: upload cannot convert");
    return Tensor::copy_of(host);
  }
  void copy_from_host(const TensorView& dst, const TensorView& host) override { copy(dst, host); }
  void copy(const TensorView& dst, const TensorView& src) override {
    K3_CHECK(dst.dtype == src.dtype && dst.shape == src.shape,
             "DeviceMemory::copy: dtype/shape mismatch " + dst.shape.str() + " vs " + src.shape.str());
    for_rows(dst, src, [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); });
  }
  Tensor download_f32(const TensorView& src) override {
    Tensor out = Tensor::zeros(DType::f32, src.shape);
    float* o = out.data<float>();
    const int64_t cols = src.rank() == 2 ? src.dim(1) : src.numel();
    const int64_t rows = src.rank() == 2 ? src.dim(0) : 1;
    const int64_t stride = src.rank() == 2 ? src.strides[0] : cols;
    K3_CHECK(src.rank() != 2 || src.strides[1] == 1 || src.is_contiguous(), "download_f32: inner stride must be 1");
    K3_CHECK(src.rank() == 2 || src.is_contiguous(), "download_f32: view must be contiguous");
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * stride + c;
        float v = 0;
        switch (src.dtype) {
          case DType::f32: v = src.as<const float>()[i]; break;
          case DType::bf16: v = bf16_bits_to_f32(src.as<const uint16_t>()[i]); break;
          case DType::f8_e4m3: v = fp8_e4m3_to_f32(src.as<const uint8_t>()[i]); break;
          default: throw Error("download_f32: unsupported dtype " + std::string(dtype_name(src.dtype)));
        }
        o[r * cols + c] = v;
      }
    return out;
  }
  void synchronize() override {}

 private:
  std::mutex marks_mu_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::shared_ptr<DeviceMemory> make_host_memory() { return std::make_shared<HostMemory>(); }

}  // namespace k3::core
