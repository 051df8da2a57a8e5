// core/tensor.h: non-owning tensor views and an owning Tensor (shared storage).
//
// A TensorView is (data, dtype, device, shape, strides in elements). Tensor adds a
// shared keep-alive for the storage, which may be a heap buffer, a region of an mmap'd
// checkpoint, or (later) device memory from a pool.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace k3::core {

inline constexpr int kMaxDims = 4;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  static Shape of(std::span<const int64_t> dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[3, 4]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Shape shape;
  std::array<int64_t, kMaxDims> strides{};  // in elements

  static TensorView contiguous(void* data, DType dtype, Shape shape, Device device = Device::cpu);
  bool defined() const { return data != nullptr || shape.numel() == 0; }
  int rank() const { return shape.rank(); }
  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
  bool is_contiguous() const;
  // Row r of the leading dimension, as a view of rank-1.
  TensorView row(int64_t r) const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  template <class T>
  std::span<T> span() const {
    return {static_cast<T*>(data), static_cast<size_t>(numel())};
  }
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(TensorView view, std::shared_ptr<void> keepalive) : view_(view), storage_(std::move(keepalive)) {}
  // Zero-filled CPU tensor.
  static Tensor zeros(DType dtype, Shape shape);
  // Deep copy of a view into new CPU storage.
  static Tensor copy_of(const TensorView& v);

  bool defined() const { return storage_ != nullptr; }
  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t dim(int i) const { return view_.shape[i]; }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }
  template <class T>
  T* data() const {
    return view_.as<T>();
  }
  template <class T>
  std::span<T> span() const {
    return view_.span<T>();
  }

 private:
  TensorView view_;
  std::shared_ptr<void> storage_;
};

}  // namespace k3::core
