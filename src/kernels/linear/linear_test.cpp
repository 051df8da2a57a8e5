// kernels/linear/linear_test.cpp: linear against naive float/double forms; bf16/f32/MXFP4.
#include "kernels/linear/linear.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/fp4.h"
#include "core/rng.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Uniform values with the given std (weights: gain/sqrt(in), spec §14.3, so outputs are O(1)).
// Uniform rather than normal only because it is cheaper for the 11M-element K3 shard.
std::vector<float> random_matrix(int64_t rows, int64_t cols, double std, uint64_t seed) {
  core::Rng rng(seed);
  const double half_width = std * std::sqrt(3.0);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& v : m) v = static_cast<float>(rng.uniform(-half_width, half_width));
  return m;
}

Tensor x_tensor(int64_t T, int64_t in, uint64_t seed) {
  Tensor x = Tensor::zeros(DType::f32, {T, in});
  const std::vector<float> v = random_matrix(T, in, 1.0, seed);
  std::copy(v.begin(), v.end(), x.data<float>());
  return x;
}

// Dense weight in bf16 (values rounded) or f32; `values` receives what the weight decodes to.
LinearWeight dense_weight(DType dt, int64_t out, int64_t in, uint64_t seed, std::vector<float>* values) {
  *values = random_matrix(out, in, 1.0 / std::sqrt(static_cast<double>(in)), seed);
  LinearWeight w;
  w.weight = Tensor::zeros(dt, {out, in});
  for (int64_t i = 0; i < out * in; ++i) {
    if (dt == DType::bf16) {
      w.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits((*values)[i]);
      (*values)[i] = core::bf16_round((*values)[i]);
    } else {
      w.weight.data<float>()[i] = (*values)[i];
    }
  }
  return w;
}

// MXFP4 weight quantized from random values; `values` receives the dequantized weights.
LinearWeight mxfp4_weight(int64_t out, int64_t in, uint64_t seed, std::vector<float>* values) {
  const std::vector<float> src = random_matrix(out, in, 1.0 / std::sqrt(static_cast<double>(in)), seed);
  LinearWeight w;
  w.weight = Tensor::zeros(DType::u8, {out, in / 2});
  w.scale = Tensor::zeros(DType::u8, {out, in / 32});
  values->assign(static_cast<size_t>(out * in), 0.0f);
  for (int64_t r = 0; r < out; ++r) {
    std::span<uint8_t> packed{w.weight.data<uint8_t>() + r * in / 2, static_cast<size_t>(in / 2)};
    std::span<uint8_t> scales{w.scale.data<uint8_t>() + r * in / 32, static_cast<size_t>(in / 32)};
    core::mxfp4_quantize_row({src.data() + r * in, static_cast<size_t>(in)}, packed, scales);
    core::mxfp4_dequantize_row(packed, scales, {values->data() + r * in, static_cast<size_t>(in)});
  }
  return w;
}

Tensor run(const Tensor& x, const LinearWeight& w, bool round_output, Precision p) {
  Tensor out = Tensor::zeros(DType::f32, {x.dim(0), w.out_features()});
  for (float& v : out.span<float>()) v = kNaN;
  LinearArgs a{x.view(), &w, out.view(), round_output, p};
  EXPECT_TRUE(linear_check(a)) << linear_check(a).reason();
  linear_reference(a);
  return out;
}

// The textbook triple loop, fp32, sequential over `in`.
std::vector<float> naive_float(const Tensor& x, const std::vector<float>& w, int64_t out) {
  const int64_t T = x.dim(0), in = x.dim(1);
  std::vector<float> y(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      float acc = 0.0f;
      for (int64_t i = 0; i < in; ++i) acc = acc + x.data<float>()[t * in + i] * w[o * in + i];
      y[t * out + o] = acc;
    }
  return y;
}

// Exact-ish value and the magnitude sum used for the rigorous fp32 error bound.
void naive_double(const Tensor& x, const std::vector<float>& w, int64_t t, int64_t o, double* value, double* abs_sum) {
  const int64_t in = x.dim(1);
  double v = 0.0, s = 0.0;
  for (int64_t i = 0; i < in; ++i) {
    const double p = static_cast<double>(x.data<float>()[t * in + i]) * w[o * in + i];
    v += p;
    s += std::fabs(p);
  }
  *value = v;
  *abs_sum = s;
}

void check_against_naive(const Tensor& x, const LinearWeight& w, const std::vector<float>& values) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.out_features();
  const std::vector<float> want = naive_float(x, values, out);
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    for (bool round_output : {true, false}) {
      Tensor y = run(x, w, round_output, p);
      const bool rounded = round_output && p == Precision::bf16;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < out; ++o) {
          const float got = y.data<float>()[t * out + o];
          const float expect = rounded ? core::bf16_round(want[t * out + o]) : want[t * out + o];
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expect))
              << "T=" << T << " in=" << in << " out=" << out << " t=" << t << " o=" << o;
        }
      if (rounded) continue;
      // Unrounded outputs against double: within the sequential-sum bound n * 2^-24 * sum|x w|.
      for (int64_t t = 0; t < T; t += 5)
        for (int64_t o = 0; o < out; o += 3) {
          double exact, abs_sum;
          naive_double(x, values, t, o, &exact, &abs_sum);
          ASSERT_NEAR(y.data<float>()[t * out + o], exact, in * 0x1p-24 * abs_sum + 1e-30);
        }
    }
  }
}

TEST(Linear, MatchesNaiveOnOddShapesAllWeightDtypes) {
  for (int64_t T : {1, 17, 54, 97}) {
    std::vector<float> values;
    for (int64_t in : {96, 257}) {
      const int64_t out = in == 96 ? 37 : 130;
      for (DType dt : {DType::bf16, DType::f32}) {
        LinearWeight w = dense_weight(dt, out, in, 31 * T + in, &values);
        check_against_naive(x_tensor(T, in, T + in), w, values);
      }
    }
    LinearWeight w = mxfp4_weight(45, 320, T, &values);
    check_against_naive(x_tensor(T, 320, 3 * T), w, values);
  }
}

TEST(Linear, K3Tp8ShardShape) {
  // A TP8 shard of q_a_proj-sized output: [1536, 7168], with 9 tokens (one 8-block + 1 leftover).
  std::vector<float> values;
  LinearWeight w = dense_weight(DType::bf16, 1536, 7168, 77, &values);
  Tensor x = x_tensor(9, 7168, 78);
  const std::vector<float> want = naive_float(x, values, 1536);
  Tensor y = run(x, w, true, Precision::bf16);
  for (int64_t i = 0; i < 9 * 1536; ++i) ASSERT_EQ(y.data<float>()[i], core::bf16_round(want[i])) << i;
  Tensor y32 = run(x, w, true, Precision::fp32);
  for (int64_t i = 0; i < 9 * 1536; ++i) ASSERT_EQ(y32.data<float>()[i], want[i]) << i;
}

TEST(Linear, Mxfp4EqualsDequantizedBf16Weights) {
  // K3 routed expert w1 shard at TP8: [384, 3584], group 32 along the input.
  for (int64_t T : {1, 17}) {
    std::vector<float> values;
    LinearWeight w4 = mxfp4_weight(384, 3584, 5 + T, &values);
    LinearWeight wbf;
    wbf.weight = Tensor::zeros(DType::bf16, {384, 3584});
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(values[i], core::bf16_round(values[i])) << "MXFP4 values must be exact in bf16";
      wbf.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits(values[i]);
    }
    Tensor x = x_tensor(T, 3584, 40 + T);
    for (Precision p : {Precision::bf16, Precision::fp32}) {
      Tensor a = run(x, w4, true, p);
      Tensor b = run(x, wbf, true, p);
      for (int64_t i = 0; i < T * 384; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(a.data<float>()[i]), std::bit_cast<uint32_t>(b.data<float>()[i]));
    }
  }
}

TEST(Linear, StridedRowsOfInputAndOutput) {
  // x and out as column windows of wider buffers (row stride != width).
  const int64_t T = 17, in = 96, out = 40, pad = 7;
  std::vector<float> values;
  LinearWeight w = dense_weight(DType::bf16, out, in, 3, &values);
  Tensor xc = x_tensor(T, in, 4);
  Tensor xwide = Tensor::zeros(DType::f32, {T, in + pad});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < in; ++i) xwide.data<float>()[t * (in + pad) + pad + i] = xc.data<float>()[t * in + i];
  Tensor ywide = Tensor::zeros(DType::f32, {T, out + pad});
  for (float& v : ywide.span<float>()) v = kNaN;
  core::TensorView xv = xwide.view(), yv = ywide.view();
  xv.data = xwide.data<float>() + pad;
  xv.shape = {T, in};
  yv.shape = {T, out};
  LinearArgs a{xv, &w, yv, true, Precision::bf16};
  ASSERT_TRUE(linear_check(a)) << linear_check(a).reason();
  linear_reference(a);
  Tensor want = run(xc, w, true, Precision::bf16);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o)
      ASSERT_EQ(ywide.data<float>()[t * (out + pad) + o], want.data<float>()[t * out + o]);
    for (int64_t o = out; o < out + pad; ++o) ASSERT_TRUE(std::isnan(ywide.data<float>()[t * (out + pad) + o]));
  }
}

TEST(Linear, BadArgumentsFail) {
  std::vector<float> values;
  LinearWeight w = dense_weight(DType::bf16, 8, 64, 1, &values);
  Tensor x = x_tensor(3, 64, 2), x_bad = x_tensor(3, 63, 2);
  Tensor out = Tensor::zeros(DType::f32, {3, 8}), out_bad = Tensor::zeros(DType::f32, {3, 9});
  EXPECT_FALSE(linear_check({x.view(), nullptr, out.view()}));
  core::Status s = linear_check({x_bad.view(), &w, out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("[T, 64]"), std::string::npos) << s.reason();
  s = linear_check({x.view(), &w, out_bad.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("[3, 8]"), std::string::npos) << s.reason();
  LinearWeight w4 = mxfp4_weight(8, 64, 1, &values);
  w4.scale = Tensor::zeros(DType::u8, {8, 3});
  s = linear_check({x.view(), &w4, out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("w.scale"), std::string::npos) << s.reason();
  LinearWeight w_i32;
  w_i32.weight = Tensor::zeros(DType::i32, {8, 64});
  EXPECT_FALSE(linear_check({x.view(), &w_i32, out.view()}));
  LinearWeight sq = dense_weight(DType::f32, 64, 64, 1, &values);
  Tensor xs = x_tensor(3, 64, 2);
  EXPECT_FALSE(linear_check({xs.view(), &sq, xs.view()})) << "in-place linear must be refused";
  EXPECT_TRUE(linear_check({x.view(), &w, out.view()}));
}

}  // namespace
}  // namespace k3::kernels
