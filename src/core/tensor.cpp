// core/tensor.cpp: Shape, TensorView and Tensor helpers.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace k3::core {

Shape::Shape(std::initializer_list<int64_t> dims) {
  K3_CHECK(dims.size() <= kMaxDims, "tensor rank above 4 is not supported");
  for (int64_t d : dims) dims_[rank_++] = d;
}

Shape Shape::of(std::span<const int64_t> dims) {
  K3_CHECK(dims.size() <= kMaxDims, "tensor rank above 4 is not supported");
  Shape s;
  for (int64_t d : dims) s.dims_[s.rank_++] = d;
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape, Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.shape = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    v.strides[i] = stride;
    stride *= shape[i];
  }
  return v;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != stride) return false;
    stride *= shape[i];
  }
  return true;
}

TensorView TensorView::row(int64_t r) const {
  K3_CHECK(rank() >= 1 && r >= 0 && r < shape[0], "row index out of range");
  TensorView v;
  v.dtype = dtype;
  v.device = device;
  v.data = static_cast<char*>(data) + r * strides[0] * static_cast<int64_t>(dtype_size(dtype));
  int64_t dims[kMaxDims];
  for (int i = 1; i < rank(); ++i) {
    dims[i - 1] = shape[i];
    v.strides[i - 1] = strides[i];
  }
  v.shape = Shape::of({dims, static_cast<size_t>(rank() - 1)});
  return v;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  // 64-byte alignment: SIMD loads and later pinned-copy paths want it.
  void* p = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
  K3_CHECK(p != nullptr, "out of host memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, bytes);
  std::shared_ptr<void> storage(p, [](void* q) { std::free(q); });
  return Tensor(TensorView::contiguous(p, dtype, shape), std::move(storage));
}

Tensor Tensor::copy_of(const TensorView& v) {
  K3_CHECK(v.device == Device::cpu, "Tensor::copy_of reads CPU views only");
  K3_CHECK(v.is_contiguous(), "Tensor::copy_of needs a contiguous view");
  Tensor t = zeros(v.dtype, v.shape);
  if (v.nbytes() > 0) std::memcpy(t.data<void>(), v.data, static_cast<size_t>(v.nbytes()));
  return t;
}

}  // namespace k3::core
