// kernels/testing/op_harness.cpp: host tensors, metrics, the report, and the no-CUDA device stub.
#include "kernels/testing/op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/fp4.h"
#include "core/fp8.h"

namespace k3::ops_test {

Tensor f32_tensor(Shape shape) { return Tensor::zeros(DType::f32, shape); }

Tensor nan_tensor(Shape shape) {
  Tensor t = f32_tensor(shape);
  std::fill(t.span<float>().begin(), t.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

Tensor random_act(core::Rng& rng, Shape shape, Mode mode, double mean, double std) {
  Tensor t = f32_tensor(shape);
  for (float& x : t.span<float>()) {
    x = static_cast<float>(rng.normal(mean, std));
    if (mode == Mode::bf16) x = core::bf16_round(x);
  }
  return t;
}

Tensor random_uniform_f32(core::Rng& rng, Shape shape, double std) {
  Tensor t = f32_tensor(shape);
  const double a = std::sqrt(3.0) * std;
  for (float& x : t.span<float>()) x = static_cast<float>(rng.uniform(-a, a));
  return t;
}

Tensor random_bf16_weight(core::Rng& rng, int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros(DType::bf16, {rows, cols});
  const double a = std::sqrt(3.0 / static_cast<double>(cols));
  for (uint16_t& b : t.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.uniform(-a, a)));
  return t;
}

kernels::LinearWeight random_mxfp4_weight(core::Rng& rng, int64_t rows, int64_t cols) {
  kernels::LinearWeight w;
  w.weight = Tensor::zeros(DType::u8, {rows, cols / 2});
  w.scale = Tensor::zeros(DType::u8, {rows, cols / 32});
  std::vector<float> row(static_cast<size_t>(cols));
  const double a = std::sqrt(3.0 / static_cast<double>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& x : row) x = static_cast<float>(rng.uniform(-a, a));
    core::mxfp4_quantize_row(row, {w.weight.data<uint8_t>() + r * (cols / 2), static_cast<size_t>(cols / 2)},
                             {w.scale.data<uint8_t>() + r * (cols / 32), static_cast<size_t>(cols / 32)});
  }
  return w;
}

Tensor copy(const Tensor& t) { return Tensor::copy_of(t.view()); }

Tensor copy_rows(const TensorView& v) {
  if (v.is_contiguous()) return Tensor::copy_of(v);
  Tensor out = f32_tensor(v.shape);
  for (int64_t r = 0; r < v.dim(0); ++r)
    for (int64_t c = 0; c < v.dim(1); ++c)
      out.data<float>()[r * v.dim(1) + c] = v.as<const float>()[r * v.strides[0] + c];
  return out;
}

TensorView column_block(const Tensor& t, int64_t c0, int64_t c1) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(t.dtype()));
  v.shape = Shape{t.dim(0), c1 - c0};
  return v;
}

Tensor to_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor out = f32_tensor(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i)
    out.data<float>()[i] = t.dtype() == DType::bf16 ? core::bf16_bits_to_f32(t.data<const uint16_t>()[i])
                                                    : core::fp8_e4m3_to_f32(t.data<const uint8_t>()[i]);
  return out;
}

Metrics compare(std::span<const float> got, std::span<const float> want) {
  Metrics m;
  double num = 0, den = 0, dot = 0, gg = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      m.finite = false;
      continue;
    }
    num += (g - w) * (g - w);
    den += w * w;
    dot += g * w;
    gg += g * g;
    m.max_abs = std::max(m.max_abs, std::fabs(g - w));
  }
  m.rel_err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  m.cosine = (gg > 0 && den > 0) ? dot / std::sqrt(gg * den) : (gg == den ? 1.0 : 0.0);
  if (!m.finite) m.rel_err = m.max_abs = std::numeric_limits<double>::infinity(), m.cosine = 0;
  return m;
}

Tol tol_elementwise(Mode m) { return m == Mode::bf16 ? Tol{1e-2, 0.9999} : Tol{1e-5, 1 - 1e-9}; }
Tol tol_reduction(Mode m) { return m == Mode::bf16 ? Tol{1.5e-2, 0.9998} : Tol{1e-4, 1 - 1e-7}; }
Tol tol_attention(Mode m) { return m == Mode::bf16 ? Tol{3e-2, 0.999} : Tol{2e-4, 1 - 1e-7}; }

namespace {
std::mutex g_report_mu;
nlohmann::json& report_rows() {
  static nlohmann::json rows = nlohmann::json::array();
  return rows;
}
}  // namespace

void expect_close(const std::string& op, const std::string& shape, Mode mode, const std::string& what,
                  const Tensor& got_f32, const Tensor& want_f32, Tol tol) {
  ASSERT_EQ(got_f32.numel(), want_f32.numel()) << op << " " << what;
  const Metrics m = compare(got_f32.span<const float>(), want_f32.span<const float>());
  const bool pass = m.finite && m.rel_err <= tol.rel && m.cosine >= tol.min_cos;
  std::printf("  %-16s %-24s %-4s %-8s rel %.3e  cos %.9f  max_abs %.3e  %s\n", op.c_str(), shape.c_str(),
              mode_name(mode), what.c_str(), m.rel_err, m.cosine, m.max_abs, pass ? "ok" : "FAIL");
  {
    std::lock_guard<std::mutex> lk(g_report_mu);
    report_rows().push_back({{"op", op},
                             {"shape", shape},
                             {"mode", mode_name(mode)},
                             {"what", what},
                             {"rel_err", m.finite ? m.rel_err : -1.0},
                             {"cosine", m.cosine},
                             {"max_abs", m.finite ? m.max_abs : -1.0},
                             {"finite", m.finite},
                             {"tol_rel", tol.rel},
                             {"tol_min_cos", tol.min_cos},
                             {"pass", pass}});
  }
  EXPECT_TRUE(m.finite) << op << " " << shape << " " << mode_name(mode) << " " << what
                        << ": non-finite values (an output left unwritten stays NaN)";
  EXPECT_LE(m.rel_err, tol.rel) << op << " " << shape << " " << mode_name(mode) << " " << what;
  EXPECT_GE(m.cosine, tol.min_cos) << op << " " << shape << " " << mode_name(mode) << " " << what;
}

void write_report(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_report_mu);
  std::ofstream(path) << nlohmann::json{{"comparisons", report_rows()}}.dump(1) << "\n";
}

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

kernels::LinearWeight Device::upload(const kernels::LinearWeight& w) {
  kernels::LinearWeight d;
  d.weight = upload(w.weight);
  if (w.is_mxfp4()) d.scale = upload(w.scale);
  return d;
}

kernels::Registry& cpu_registry() {
  static kernels::Registry* r = [] {
    auto* reg = new kernels::Registry;
    kernels::register_reference_ops(*reg);
    return reg;
  }();
  return *r;
}

void expect_same_bytes(const std::string& what, const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < got.size(); ++b) {
    const Tensor& g = got[b];
    const Tensor& w = want[b];
    ASSERT_EQ(g.dtype(), w.dtype()) << what << " buffer " << b;
    ASSERT_EQ(g.numel(), w.numel()) << what << " buffer " << b;
    const size_t elem = core::dtype_size(g.dtype());
    const auto* gp = static_cast<const unsigned char*>(g.view().data);
    const auto* wp = static_cast<const unsigned char*>(w.view().data);
    int64_t differ = 0, first = -1, nan_got = 0, nan_want = 0;
    const bool floats = g.dtype() == DType::f32 || g.dtype() == DType::bf16 || g.dtype() == DType::f8_e4m3;
    const Tensor gf = floats ? to_f32(g) : Tensor(), wf = floats ? to_f32(w) : Tensor();
    for (int64_t i = 0; i < g.numel(); ++i) {
      if (std::memcmp(gp + i * elem, wp + i * elem, elem) != 0) {
        ++differ;
        if (first < 0) first = i;
      }
      if (floats) {
        nan_got += std::isnan(gf.data<const float>()[i]) ? 1 : 0;
        nan_want += std::isnan(wf.data<const float>()[i]) ? 1 : 0;
      }
    }
    std::printf("  %-40s buffer %zu  %lld elements  %lld differ  NaN %lld (plain %lld)  %s\n", what.c_str(), b,
                static_cast<long long>(g.numel()), static_cast<long long>(differ), static_cast<long long>(nan_got),
                static_cast<long long>(nan_want), differ == 0 ? "ok" : "FAIL");
    EXPECT_EQ(differ, 0) << what << " buffer " << b << " (" << core::dtype_name(g.dtype()) << " " << g.shape().str()
                         << "): " << differ << " elements differ from the plain run, the first at " << first << "; NaN "
                         << nan_got << " here, " << nan_want
                         << " in the plain run (NaN here: a kernel read an input before its pdl_wait(), or "
                            "stored an output before it)";
  }
}

#ifndef K3_HAVE_CUDA
Device* Device::cuda(std::string* why) {
  *why = "this build has no CUDA backend (K3_HAVE_CUDA is off: nvcc not found or K3_ENABLE_CUDA=OFF)";
  return nullptr;
}
PdlDevice* PdlDevice::cuda(std::string* why) {
  *why = "this build has no CUDA backend (K3_HAVE_CUDA is off: nvcc not found or K3_ENABLE_CUDA=OFF)";
  return nullptr;
}
#endif

}  // namespace k3::ops_test
