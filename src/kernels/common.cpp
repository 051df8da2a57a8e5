// kernels/common.cpp: weight decoding shared by the reference ops.
#include "kernels/common.h"

#include <span>
#include <utility>

#include "core/fp4.h"

namespace k3::kernels {

void LinearWeight::load_row(int64_t r, float* out) const {
  const int64_t in = in_features();
  if (is_mxfp4()) {
    const int64_t packed_cols = weight.dim(1), scale_cols = scale.dim(1);
    core::mxfp4_dequantize_row({weight.data<const uint8_t>() + r * packed_cols, static_cast<size_t>(packed_cols)},
                               {scale.data<const uint8_t>() + r * scale_cols, static_cast<size_t>(scale_cols)},
                               {out, static_cast<size_t>(in)});
    return;
  }
  if (weight.dtype() == core::DType::bf16) {
    const uint16_t* w = weight.data<const uint16_t>() + r * in;
    for (int64_t i = 0; i < in; ++i) out[i] = core::bf16_bits_to_f32(w[i]);
  } else {
    K3_CHECK(weight.dtype() == core::DType::f32, "linear weight must be BF16, F32 or MXFP4");
    const float* w = weight.data<const float>() + r * in;
    for (int64_t i = 0; i < in; ++i) out[i] = w[i];
  }
}

float load_f32(const core::TensorView& v, int64_t i) {
  if (v.dtype == core::DType::bf16) return core::bf16_bits_to_f32(v.as<const uint16_t>()[i]);
  K3_CHECK(v.dtype == core::DType::f32, "expected a BF16 or F32 vector");
  return v.as<const float>()[i];
}

std::string describe_view(const core::TensorView& v) {
  if (!v.defined() || v.rank() == 0) return "undefined";
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str() + " on " +
         std::string(core::device_name(v.device));
}

std::string rows_cols_str(int64_t rows, int64_t cols) {
  std::string s(1, '[');  // appended piecewise: GCC 12 warns (-Wrestrict, false positive) on "[" + string
  s += std::to_string(rows);
  s += ", ";
  s += std::to_string(cols);
  s += ']';
  return s;
}

namespace {
// Byte range [first, last) of a rank-2 row view.
std::pair<const char*, const char*> byte_span(const core::TensorView& v) {
  const auto* p = static_cast<const char*>(v.data);
  if (v.numel() == 0) return {p, p};
  const int64_t elems = (v.dim(0) - 1) * v.strides[0] + v.dim(1);
  return {p, p + elems * static_cast<int64_t>(core::dtype_size(v.dtype))};
}
}  // namespace

bool row_views_overlap(const core::TensorView& a, const core::TensorView& b) {
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

}  // namespace k3::kernels
