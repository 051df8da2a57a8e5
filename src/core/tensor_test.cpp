// core/tensor_test.cpp: Shape, TensorView (contiguous strides, row(), is_contiguous) and Tensor
// (zeros, copy_of), plus dtype names.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace k3::core {
namespace {

TEST(Shape, Basics) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 4);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  EXPECT_FALSE(s == (Shape{2, 3}));
  EXPECT_FALSE(s == (Shape{2, 3, 5}));
  const Shape scalar;
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "[]");
  EXPECT_EQ((Shape{5, 0, 3}).numel(), 0);
  const int64_t dims[4] = {1, 17, 54, 97};
  EXPECT_EQ(Shape::of(dims), (Shape{1, 17, 54, 97}));
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), Error);
  const int64_t five[5] = {1, 1, 1, 1, 1};
  EXPECT_THROW(Shape::of(five), Error);
}

TEST(TensorView, ContiguousStrides) {
  float buf[1];
  const TensorView v = TensorView::contiguous(buf, DType::bf16, Shape{17, 54, 97});
  EXPECT_EQ(v.strides[0], 54 * 97);
  EXPECT_EQ(v.strides[1], 97);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 17 * 54 * 97);
  EXPECT_EQ(v.nbytes(), 17 * 54 * 97 * 2);
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.dim(1), 54);
  TensorView t = v;
  t.strides[1] = 98;  // padded rows
  EXPECT_FALSE(t.is_contiguous());
  // A dimension of size 1 may carry any stride.
  TensorView one = TensorView::contiguous(buf, DType::f32, Shape{1, 5});
  one.strides[0] = 12345;
  EXPECT_TRUE(one.is_contiguous());
}

TEST(TensorView, Row) {
  std::vector<float> data(17 * 6);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  const TensorView v = TensorView::contiguous(data.data(), DType::f32, Shape{17, 2, 3});
  for (int64_t r = 0; r < 17; ++r) {
    const TensorView row = v.row(r);
    EXPECT_EQ(row.shape, (Shape{2, 3}));
    EXPECT_EQ(row.strides[0], 3);
    EXPECT_EQ(row.strides[1], 1);
    EXPECT_EQ(row.dtype, DType::f32);
    EXPECT_EQ(row.as<float>(), data.data() + r * 6);
    EXPECT_EQ(row.as<float>()[5], static_cast<float>(r * 6 + 5));
  }
  // Rows of a strided view keep its strides (here: every other row of a [8, 4] u8 buffer).
  std::vector<uint8_t> bytes(8 * 4);
  TensorView strided = TensorView::contiguous(bytes.data(), DType::u8, Shape{4, 4});
  strided.strides[0] = 8;
  EXPECT_EQ(strided.row(3).as<uint8_t>(), bytes.data() + 24);
  // Row of a bf16 view advances by 2-byte elements.
  std::vector<uint16_t> halves(3 * 5);
  const TensorView h = TensorView::contiguous(halves.data(), DType::bf16, Shape{3, 5});
  EXPECT_EQ(h.row(2).as<uint16_t>(), halves.data() + 10);
  // A rank-1 view gives rank-0 rows (one element).
  const TensorView flat = TensorView::contiguous(data.data(), DType::f32, Shape{7});
  EXPECT_EQ(flat.row(4).rank(), 0);
  EXPECT_EQ(flat.row(4).as<float>()[0], 4.0f);
  EXPECT_THROW(v.row(17), Error);
  EXPECT_THROW(v.row(-1), Error);
  EXPECT_THROW(flat.row(4).row(0), Error);  // rank 0 has no rows
}

TEST(Tensor, ZerosAndCopyOf) {
  const Tensor t = Tensor::zeros(DType::f32, Shape{17, 97});
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{17, 97}));
  EXPECT_EQ(t.nbytes(), 17 * 97 * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<void>()) % 64, 0u);
  for (float v : t.span<float>()) ASSERT_EQ(v, 0.0f);
  for (size_t i = 0; i < t.span<float>().size(); ++i) t.span<float>()[i] = static_cast<float>(i) * 0.5f;

  const Tensor c = Tensor::copy_of(t.view());
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_NE(c.data<void>(), t.data<void>());
  EXPECT_EQ(std::memcmp(c.data<void>(), t.data<void>(), static_cast<size_t>(t.nbytes())), 0);
  t.span<float>()[3] = -1.0f;  // deep copy: the source changing leaves the copy alone
  EXPECT_EQ(c.span<float>()[3], 1.5f);

  // Copies outlive the original storage (shared keep-alive of the copy, not of the source).
  Tensor keep;
  {
    const Tensor tmp = Tensor::zeros(DType::i32, Shape{5});
    tmp.span<int32_t>()[4] = 42;
    keep = Tensor::copy_of(tmp.view());
  }
  EXPECT_EQ(keep.span<int32_t>()[4], 42);

  const Tensor empty = Tensor::zeros(DType::bf16, Shape{0, 7});
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(Tensor::copy_of(empty.view()).numel(), 0);
  EXPECT_FALSE(Tensor().defined());

  TensorView strided = t.view();
  strided.shape = Shape{8, 97};
  strided.strides[0] = 2 * 97;
  EXPECT_THROW(Tensor::copy_of(strided), Error);
  TensorView device = t.view();
  device.device = Device::cuda;
  EXPECT_THROW(Tensor::copy_of(device), Error);
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::f32, DType::bf16, DType::f8_e4m3, DType::u8, DType::i32, DType::i64}) {
    DType back = DType::i64;
    ASSERT_TRUE(dtype_from_name(dtype_name(d), &back)) << dtype_name(d);
    EXPECT_EQ(back, d);
  }
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8_e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  DType out = DType::f32;
  EXPECT_FALSE(dtype_from_name("F16", &out));
  EXPECT_FALSE(dtype_from_name("bf16", &out));  // safetensors spells it BF16
  EXPECT_EQ(device_name(Device::cuda), "cuda");
}

}  // namespace
}  // namespace k3::core
