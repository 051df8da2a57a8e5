// kernels/gqa/gqa_test.cpp: rope_gqa_attention's argument check names what is wrong, and the
// reference writes exactly the new cache rows (the math against a double-precision transcription
// is draft/eagle3_model_test.cpp's; the device against this reference, gqa_ops_test.cpp's).
#include "kernels/gqa/gqa.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

struct Args {
  Tensor q = Tensor::zeros(DType::f32, {2, 12}), k = Tensor::zeros(DType::f32, {2, 6}),
         v = Tensor::zeros(DType::f32, {2, 6}), kc = Tensor::zeros(DType::f32, {5, 6}),
         vc = Tensor::zeros(DType::f32, {5, 6}), freq = Tensor::zeros(DType::f32, {3}),
         out = Tensor::zeros(DType::f32, {2, 12});
  RopeGqaAttentionArgs get(int64_t past = 1) const {
    return {q.view(), k.view(), v.view(), kc.view(), vc.view(), freq.view(),    out.view(),
            past,     7,        2,        1,         6,         Precision::fp32};
  }
};

TEST(RopeGqaAttention, CheckNamesTheBadArgument) {
  Args a;
  EXPECT_TRUE(rope_gqa_attention_check(a.get()));
  auto reason = [](RopeGqaAttentionArgs x) { return rope_gqa_attention_check(x).reason(); };
  EXPECT_NE(reason(a.get(4)).find("exceed the 5 cache rows"), std::string::npos) << reason(a.get(4));
  RopeGqaAttentionArgs x = a.get();
  x.num_kv_heads = 3;
  EXPECT_NE(reason(x).find("NKV dividing NH"), std::string::npos) << reason(x);
  x = a.get();
  x.head_dim = 5;
  EXPECT_FALSE(rope_gqa_attention_check(x));
  Tensor bad_freq = Tensor::zeros(DType::f32, {4});
  x = a.get();
  x.inv_freq = bad_freq.view();
  EXPECT_NE(reason(x).find("inv_freq"), std::string::npos) << reason(x);
  Tensor bad_k = Tensor::zeros(DType::f32, {2, 7});
  x = a.get();
  x.k = bad_k.view();
  EXPECT_NE(reason(x).find("k must be"), std::string::npos) << reason(x);
}

TEST(RopeGqaAttention, WritesExactlyTheNewCacheRows) {
  Args a;
  for (float& f : a.kc.span<float>()) f = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 6; ++i) a.kc.data<float>()[i] = 1.0f;  // row 0: the cached key
  for (float& f : a.k.span<float>()) f = 0.5f;
  rope_gqa_attention_reference(a.get());
  for (int64_t i = 0; i < 5 * 6; ++i) EXPECT_EQ(std::isnan(a.kc.data<float>()[i]), i >= 3 * 6) << i;
  // inv_freq 0: no rotation, the keys land as given.
  EXPECT_EQ(a.kc.data<float>()[6], 0.5f);
}

}  // namespace
}  // namespace k3::kernels
