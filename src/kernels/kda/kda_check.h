// kernels/kda/kda_check.h: internal to kernels/kda: argument-check helpers whose failure messages
// name the argument, the expected shape/dtype and what was passed.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/common.h"

namespace k3::kernels::kda_detail {

inline std::string describe(const core::TensorView& v) {
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str();
}

inline core::Status expect_f32(const core::TensorView& v, const char* name) {
  if (v.data == nullptr && v.numel() != 0) return core::Status::fail(std::string(name) + " is not set");
  if (v.dtype != core::DType::f32)
    return core::Status::fail(std::string(name) + " must be F32, got " + describe(v));
  return core::Status::ok();
}

// An activation [rows, cols] in f32 (or bf16 on CUDA, kernels/common.h) whose rows may be strided
// but whose columns are contiguous. `meaning` says what the dims are, e.g. " (T, num_heads*head_dim)".
inline core::Status expect_activation(const core::TensorView& v, const char* name, int64_t rows,
                                      int64_t cols, const std::string& meaning) {
  if (v.data == nullptr && v.numel() != 0) return core::Status::fail(std::string(name) + " is not set");
  if (!is_activation_dtype(v))
    return core::Status::fail(std::string(name) + " must be F32 (or BF16 on CUDA), got " + describe(v));
  if (v.rank() != 2 || v.dim(0) != rows || v.dim(1) != cols)
    return core::Status::fail(std::string(name) + " must be F32 [" + std::to_string(rows) + ", " +
                              std::to_string(cols) + "]" + meaning + ", got " + describe(v));
  if (cols > 1 && v.strides[1] != 1)
    return core::Status::fail(std::string(name) + " must have contiguous rows (inner stride 1), got stride " +
                              std::to_string(v.strides[1]));
  if (rows > 1 && v.strides[0] < cols)
    return core::Status::fail(std::string(name) + " row stride " + std::to_string(v.strides[0]) +
                              " is smaller than its row length " + std::to_string(cols));
  return core::Status::ok();
}

}  // namespace k3::kernels::kda_detail
