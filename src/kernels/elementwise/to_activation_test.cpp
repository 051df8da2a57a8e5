// kernels/elementwise/to_activation_test.cpp: to_activation rounds an fp32 sum once into an
// activation (bf16 mode: round to nearest even, fp32 mode: unchanged), reads and writes strided
// rows (the column blocks of a packed TP all-reduce buffer), may work in place, and rejects bad
// dtypes and shapes naming the argument.
#include <gtest/gtest.h>

#include <bit>
#include <limits>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/elementwise/elementwise.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;
using core::TensorView;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Columns [c0, c1) of a contiguous [rows, cols] f32 tensor as a row-strided view.
TensorView columns(const Tensor& t, int64_t c0, int64_t c1) {
  TensorView v = t.view();
  v.data = t.data<float>() + c0;
  v.shape = core::Shape{t.dim(0), c1 - c0};
  return v;
}

TEST(ToActivation, RoundsOnceOnStridedColumnBlocks) {
  for (int64_t T : {1, 17, 54, 97}) {
    // A packed [T, L + H] buffer as the LatentMoE reduces it: latent block, then hidden block.
    const int64_t L = 37, H = 96;
    core::Rng rng(T);
    Tensor packed = Tensor::zeros(DType::f32, {T, L + H});
    for (float& v : packed.span<float>()) v = static_cast<float>(rng.normal() * 3.0);
    for (Precision p : {Precision::bf16, Precision::fp32}) {
      for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, L}, {L, L + H}}) {
        Tensor out = Tensor::zeros(DType::f32, {T, c1 - c0});
        for (float& v : out.span<float>()) v = kNaN;
        const ToActivationArgs a{columns(packed, c0, c1), out.view(), p};
        ASSERT_TRUE(to_activation_check(a)) << to_activation_check(a).reason();
        to_activation_reference(a);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = c0; c < c1; ++c) {
            const float x = packed.data<float>()[t * (L + H) + c];
            const float want = p == Precision::bf16 ? core::bf16_round(x) : x;
            ASSERT_EQ(std::bit_cast<uint32_t>(out.data<float>()[t * (c1 - c0) + c - c0]), std::bit_cast<uint32_t>(want))
                << "T=" << T << " c=" << c;
          }
      }
    }
    // In place, on the strided block itself.
    Tensor copy = Tensor::copy_of(packed.view());
    to_activation_reference({columns(packed, L, L + H), columns(packed, L, L + H), Precision::bf16});
    for (int64_t i = 0; i < packed.numel(); ++i) {
      const bool in_block = i % (L + H) >= L;
      const float x = copy.data<float>()[i];
      ASSERT_EQ(packed.data<float>()[i], in_block ? core::bf16_round(x) : x) << i;
    }
  }
}

TEST(ToActivation, BadArgumentsNameTheArgument) {
  Tensor x = Tensor::zeros(DType::f32, {3, 8});
  Tensor bf16 = Tensor::zeros(DType::bf16, {3, 8});
  Tensor wrong = Tensor::zeros(DType::f32, {3, 9});
  core::Status s = to_activation_check({bf16.view(), x.view(), Precision::bf16});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("x must be an f32"), std::string::npos) << s.reason();
  s = to_activation_check({x.view(), wrong.view(), Precision::bf16});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("out must be"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("[3, 9]"), std::string::npos) << s.reason();
  s = to_activation_check({x.view(), bf16.view(), Precision::bf16});  // bf16 activations only on CUDA
  ASSERT_FALSE(s);
}

}  // namespace
}  // namespace k3::kernels
