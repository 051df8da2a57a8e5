// model/layers/context.cpp: ForwardContext helpers and row/column views.
#include <cmath>
#include <cstring>
#include <limits>

#include "model/layers/context.h"

namespace k3::model {

core::Tensor ForwardContext::alloc(int64_t rows, int64_t cols) const {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, {rows, cols});
  if (options.poison_buffers)
    for (float& v : t.span<float>()) v = std::numeric_limits<float>::quiet_NaN();
  return t;
}

core::Tensor ForwardContext::linear(const core::Tensor& x, const LinearWeight& w,
                                    bool round_output) const {
  core::Tensor y = alloc(x.dim(0), w.out_features());
  ops.linear.run({x.view(), &w, y.view(), round_output, precision()}, device());
  return y;
}

core::Tensor ForwardContext::rmsnorm(const core::Tensor& x, const core::Tensor& w, float eps) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops.rmsnorm.run({x.view(), w.view(), y.view(), eps, options.rmsnorm_style, precision()}, device());
  return y;
}

core::Tensor ForwardContext::situ_glu(const core::Tensor& gate, const core::Tensor& up) const {
  core::Tensor y = alloc(gate.dim(0), gate.dim(1));
  ops.situ_glu.run({gate.view(), up.view(), y.view(), config.situ_beta, config.situ_linear_beta,
                    precision()},
                   device());
  return y;
}

core::Tensor ForwardContext::add(const core::Tensor& a, const core::Tensor& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops.add.run({a.view(), b.view(), y.view(), precision()}, device());
  return y;
}

core::Tensor row_slice(const core::Tensor& t, int64_t begin, int64_t end) {
  K3_CHECK(t.shape().rank() == 2 && 0 <= begin && begin <= end && end <= t.dim(0),
           "row_slice out of range");
  const int64_t cols = t.dim(1);
  char* base = static_cast<char*>(t.data<void>()) +
               begin * cols * static_cast<int64_t>(core::dtype_size(t.dtype()));
  // Shares t's storage: the slice keeps a copy of t (and so its keep-alive).
  auto keep = std::make_shared<core::Tensor>(t);
  return core::Tensor(core::TensorView::contiguous(base, t.dtype(), {end - begin, cols}), keep);
}

core::Tensor column_copy(const core::Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1), width = end - begin;
  K3_CHECK(t.dtype() == core::DType::f32 && 0 <= begin && begin <= end && end <= cols,
           "column_copy out of range");
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * width, t.data<const float>() + r * cols + begin,
                static_cast<size_t>(width) * sizeof(float));
  return out;
}

}  // namespace k3::model
