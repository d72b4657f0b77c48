// Tensor views: slice_rows and reshape share the buffer; describe() formatting.
#include "core/tensor.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

Tensor iota_f32(int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty_host(DType::kF32, {rows, cols});
  std::iota(t.data<float>(), t.data<float>() + rows * cols, 0.0f);
  return t;
}

TEST(Tensor, EmptyHostIsZeroFilledWithShape) {
  Tensor t = Tensor::empty_host(DType::kBF16, {3, 5});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim(), 2);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.n_bytes(), 30u);
  EXPECT_EQ(t.device(), Device::cpu());
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(t.data<uint16_t>()[i], 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, DescribeFormatsShapeAndDtype) {
  EXPECT_EQ(Tensor::empty_host(DType::kBF16, {2, 3}).describe(), "[2, 3] BF16");
  EXPECT_EQ(Tensor::empty_host(DType::kF32, {7}).describe(), "[7] F32");
  EXPECT_EQ(Tensor::empty_host(DType::kF8E4M3, {1, 2, 3, 4}).describe(), "[1, 2, 3, 4] F8_E4M3");
  EXPECT_EQ(Tensor::empty_host(DType::kI32, {0, 4}).describe(), "[0, 4] I32");
  EXPECT_EQ(Tensor::empty_host(DType::kF32, std::vector<int64_t>{}).describe(), "[] F32");
}

TEST(Tensor, SliceRowsSharesTheBuffer) {
  Tensor t = iota_f32(5, 3);
  Tensor s = t.slice_rows(1, 4);
  EXPECT_EQ(s.shape(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(s.buffer(), t.buffer());
  EXPECT_EQ(s.data<float>(), t.data<float>() + 3);
  EXPECT_EQ(s.data<float>()[0], 3.0f);
  EXPECT_EQ(s.data<float>()[8], 11.0f);
  s.data<float>()[0] = -1.0f;  // writes through to the parent
  EXPECT_EQ(t.data<float>()[3], -1.0f);

  // Slices of slices compose offsets.
  Tensor ss = s.slice_rows(2, 3);
  EXPECT_EQ(ss.shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ss.data<float>()[0], 9.0f);

  // Empty and whole slices.
  EXPECT_EQ(t.slice_rows(5, 5).numel(), 0);
  EXPECT_EQ(t.slice_rows(0, 0).numel(), 0);
  EXPECT_EQ(t.slice_rows(0, 5).data<float>(), t.data<float>());
}

TEST(Tensor, SliceRowsOfHigherRankAndOfEmptyTensors) {
  Tensor t = Tensor::empty_host(DType::kF32, {4, 2, 3});
  for (int64_t i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor s = t.slice_rows(3, 4);
  EXPECT_EQ(s.shape(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(s.data<float>()[0], 18.0f);
  Tensor e = Tensor::empty_host(DType::kF32, {0, 8});
  EXPECT_EQ(e.slice_rows(0, 0).shape(), (std::vector<int64_t>{0, 8}));
}

TEST(Tensor, ReshapeKeepsBytesAndChecksNumel) {
  Tensor t = iota_f32(4, 6);
  Tensor r = t.reshape({2, 3, 4});
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(r.buffer(), t.buffer());
  EXPECT_EQ(r.data<float>(), t.data<float>());
  EXPECT_EQ(r.data<float>()[23], 23.0f);
  Tensor flat = r.reshape(std::vector<int64_t>{24});
  EXPECT_EQ(flat.ndim(), 1);
  // A reshaped slice keeps the slice's offset.
  Tensor sr = t.slice_rows(2, 4).reshape({3, 4});
  EXPECT_EQ(sr.data<float>()[0], 12.0f);
}

TEST(TensorDeathTest, InvalidViewsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor t = iota_f32(4, 6);
  EXPECT_DEATH((void)t.reshape({5, 5}), "DI_CHECK failed");
  EXPECT_DEATH((void)t.slice_rows(2, 5), "DI_CHECK failed");
  EXPECT_DEATH((void)t.slice_rows(3, 2), "DI_CHECK failed");
  EXPECT_DEATH((void)t.data<uint16_t>(), "DI_CHECK failed");  // wrong element size
}

}  // namespace
}  // namespace deepinfer
