// backends/cuda/device_tensor.cpp: device tensor allocation, poisoning and host <-> device copies.
#include "backends/cuda/device_tensor.h"

#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "core/bf16.h"
#include "core/fp8.h"

namespace k3::backends::cuda {

namespace {

size_t elem(core::DType t) { return core::dtype_size(t); }

// A view as (rows, row_bytes, pitch_bytes) for cudaMemcpy2D: contiguous tensors of any rank are one
// row; rank-2 views may have a row stride.
struct Pitched {
  size_t rows = 0, row_bytes = 0, pitch = 0;
};
Pitched pitched(const core::TensorView& v, const char* what) {
  Pitched p;
  if (v.is_contiguous()) {
    p.rows = 1;
    p.row_bytes = p.pitch = static_cast<size_t>(v.nbytes());
    return p;
  }
  K3_CHECK(v.rank() == 2 && v.strides[1] == 1 && v.strides[0] >= v.dim(1),
           std::string(what) + ": only contiguous tensors or row-strided rank-2 views are supported, got " +
               v.shape.str());
  p.rows = static_cast<size_t>(v.dim(0));
  p.row_bytes = static_cast<size_t>(v.dim(1)) * elem(v.dtype);
  p.pitch = static_cast<size_t>(v.strides[0]) * elem(v.dtype);
  return p;
}

}  // namespace

core::Tensor empty(DevicePool& pool, core::DType dtype, core::Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * elem(dtype);
  std::shared_ptr<void> block = pool.allocate_shared(bytes);
  return core::Tensor(core::TensorView::contiguous(block.get(), dtype, shape, core::Device::cuda), block);
}

core::Tensor empty_poisoned(DevicePool& pool, core::DType dtype, core::Shape shape, cudaStream_t stream) {
  core::Tensor t = empty(pool, dtype, shape);
  poison_nan(t.view(), stream);
  return t;
}

void poison_nan(const core::TensorView& dev, cudaStream_t stream) {
  K3_CHECK(dev.device == core::Device::cuda, "poison_nan: tensor is not on the CUDA device");
  if (dev.numel() == 0) return;
  const Pitched p = pitched(dev, "poison_nan");
  K3_CUDA_CHECK(cudaMemset2DAsync(dev.data, p.pitch, 0xff, p.row_bytes, p.rows, stream));
}

core::Tensor upload(const core::TensorView& host, DevicePool& pool, cudaStream_t stream) {
  return upload(host, host.dtype, pool, stream);
}

core::Tensor upload(const core::TensorView& host, core::DType as, DevicePool& pool, cudaStream_t stream) {
  K3_CHECK(host.device == core::Device::cpu, "upload: source is not a CPU tensor");
  K3_CHECK(host.is_contiguous(), "upload: source must be contiguous, got strides of " + host.shape.str());
  core::Tensor dev = empty(pool, as, host.shape);
  if (host.numel() == 0) return dev;
  if (as == host.dtype) {
    K3_CUDA_CHECK(cudaMemcpyAsync(dev.view().data, host.data, static_cast<size_t>(host.nbytes()),
                                  cudaMemcpyHostToDevice, stream));
  } else {
    K3_CHECK(host.dtype == core::DType::f32 && as == core::DType::bf16,
             "upload: the only conversion is f32 -> bf16, asked " + std::string(core::dtype_name(host.dtype)) + " -> " +
                 std::string(core::dtype_name(as)));
    std::vector<uint16_t> bits(static_cast<size_t>(host.numel()));
    const float* src = host.as<const float>();
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = core::f32_to_bf16_bits(src[i]);
    K3_CUDA_CHECK(cudaMemcpyAsync(dev.view().data, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice, stream));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream));  // `bits` dies at return
  }
  K3_CUDA_CHECK(cudaStreamSynchronize(stream));
  return dev;
}

void copy_to_device(const core::TensorView& host, const core::TensorView& dev, cudaStream_t stream) {
  K3_CHECK(host.device == core::Device::cpu && dev.device == core::Device::cuda,
           "copy_to_device: expects a CPU source and a CUDA destination");
  K3_CHECK(host.dtype == dev.dtype && host.shape == dev.shape,
           "copy_to_device: dtype/shape mismatch " + host.shape.str() + " vs " + dev.shape.str());
  K3_CHECK(host.is_contiguous(), "copy_to_device: source must be contiguous");
  if (host.numel() == 0) return;
  const Pitched d = pitched(dev, "copy_to_device");
  K3_CUDA_CHECK(cudaMemcpy2DAsync(dev.data, d.pitch, host.data, d.row_bytes, d.row_bytes, d.rows,
                                  cudaMemcpyHostToDevice, stream));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream));
}

core::Tensor download(const core::TensorView& dev, cudaStream_t stream) {
  K3_CHECK(dev.device == core::Device::cuda, "download: source is not a CUDA tensor");
  core::Tensor host = core::Tensor::zeros(dev.dtype, dev.shape);
  if (dev.numel() == 0) return host;
  const Pitched p = pitched(dev, "download");
  K3_CUDA_CHECK(cudaMemcpy2DAsync(host.view().data, p.row_bytes, dev.data, p.pitch, p.row_bytes, p.rows,
                                  cudaMemcpyDeviceToHost, stream));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

core::Tensor download_f32(const core::TensorView& dev, cudaStream_t stream) {
  core::Tensor raw = download(dev, stream);
  if (raw.dtype() == core::DType::f32) return raw;
  core::Tensor out = core::Tensor::zeros(core::DType::f32, raw.shape());
  float* o = out.data<float>();
  const int64_t n = raw.numel();
  if (raw.dtype() == core::DType::bf16) {
    const uint16_t* s = raw.data<const uint16_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = core::bf16_bits_to_f32(s[i]);
  } else if (raw.dtype() == core::DType::f8_e4m3) {
    const uint8_t* s = raw.data<const uint8_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = core::fp8_e4m3_to_f32(s[i]);
  } else {
    throw core::Error("download_f32: cannot widen " + std::string(core::dtype_name(raw.dtype())) + " to f32");
  }
  return out;
}

core::TensorView rows_of(const core::TensorView& v, int64_t r0, int64_t n) {
  K3_CHECK(v.rank() == 2 && r0 >= 0 && n >= 0 && r0 + n <= v.dim(0), "rows_of: rows out of range");
  core::TensorView r = v;
  r.data = static_cast<char*>(v.data) + r0 * v.strides[0] * static_cast<int64_t>(elem(v.dtype));
  r.shape[0] = n;
  return r;
}

core::TensorView cols_of(const core::TensorView& v, int64_t c0, int64_t n) {
  K3_CHECK(v.rank() == 2 && c0 >= 0 && n >= 0 && c0 + n <= v.dim(1), "cols_of: columns out of range");
  core::TensorView r = v;
  r.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(elem(v.dtype));
  r.shape[1] = n;
  return r;
}

}  // namespace k3::backends::cuda
