// LinearWeight::dequantize (the one FP8 block-scale rule) against the scalar definition
// W[n,k] = e4m3_to_f32(q[n,k]) · scale_inv[n / bn, k / bk], over every non-NaN e4m3 code, partial
// edge blocks and sub-ranges that start and end inside blocks. Exact equality: the vector path
// multiplies by powers of two before the scale, so it must give the scalar result bit for bit.
// Also the column cut and join (exact: byte copies).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/linear_weight.h"
#include "support/random_linear.h"

namespace deepinfer {
namespace {

TEST(LinearWeight, Fp8DequantizeMatchesScalarRule) {
  const int64_t n = 200, k = 300, bn = 128, bk = 128;  // 2 x 3 scale blocks, both partial at the edge
  LinearWeight w;
  w.weight = Tensor::empty_host(DType::kF8E4M3, {n, k});
  w.scale_inv = Tensor::empty_host(DType::kF32, {2, 3});
  w.block_n = bn;
  w.block_k = bk;
  uint32_t state = 1;
  for (int64_t i = 0; i < n * k; ++i) {
    state = state * 1664525u + 1013904223u;
    uint8_t code = static_cast<uint8_t>(i < 256 ? i : state >> 24);
    if ((code & 0x7f) == 0x7f) code = 0x7e;  // NaN codes do not occur in weights
    w.weight.data<uint8_t>()[i] = code;
  }
  const float scales[6] = {1.0f / 448, 0.37f, 3.5e-5f, 2.0f, 1e-3f, 0.0625f};
  for (int i = 0; i < 6; ++i) w.scale_inv.data<float>()[i] = scales[i];

  for (auto [n0, rows, k0, cols] : {std::array<int64_t, 4>{0, n, 0, k}, {127, 3, 100, 200}, {5, 1, 255, 45}}) {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    w.dequantize(n0, rows, k0, cols, out.data(), cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t nn = n0 + r, kk = k0 + c;
        const float expect = e4m3_to_f32(w.weight.data<uint8_t>()[nn * k + kk]) * scales[(nn / bn) * 3 + kk / bk];
        ASSERT_EQ(out[static_cast<size_t>(r * cols + c)], expect) << "n " << nn << " k " << kk;
      }
  }
}

TEST(LinearWeight, Bf16AndF32DequantizeExactly) {
  LinearWeight w;
  w.weight = Tensor::empty_host(DType::kBF16, {3, 37});
  for (int64_t i = 0; i < 3 * 37; ++i) w.weight.data<uint16_t>()[i] = f32_to_bf16(0.1f * static_cast<float>(i) - 3.0f);
  std::vector<float> out(3 * 37);
  w.dequantize(0, 3, 0, 37, out.data(), 37);
  for (int64_t i = 0; i < 3 * 37; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], bf16_to_f32(w.weight.data<uint16_t>()[i]));
}

// columns() and concat_columns() (the cut of a shared MLP into expert slices, and its inverse):
// every slice dequantizes to the original's columns exactly, and joining the slices gives the
// original bytes and scales back. FP8: 128-wide blocks, the last slice a partial block.
TEST(LinearWeight, ColumnsAndConcatColumnsRoundTrip) {
  std::mt19937 rng(7);
  for (DType dt : {DType::kF32, DType::kF8E4M3}) {
    const int64_t n = 130, k = 300;
    const LinearWeight w = testing::random_linear(rng, n, k, dt);
    const LinearWeight a = w.columns(0, 128), b = w.columns(128, 128), c = w.columns(256, 44);
    std::vector<float> full(static_cast<size_t>(n * k)), part(static_cast<size_t>(n * 128));
    w.dequantize(0, n, 0, k, full.data(), k);
    int64_t k0 = 0;
    for (const LinearWeight* s : {&a, &b, &c}) {
      ASSERT_EQ(s->n_out(), n);
      s->dequantize(0, n, 0, s->n_in(), part.data(), s->n_in());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < s->n_in(); ++j)
          ASSERT_EQ(part[static_cast<size_t>(r * s->n_in() + j)], full[static_cast<size_t>(r * k + k0 + j)])
              << dtype_name(dt) << " row " << r << " column " << k0 + j;
      k0 += s->n_in();
    }
    const LinearWeight joined = concat_columns({&a, &b, &c});
    ASSERT_EQ(joined.n_in(), k);
    EXPECT_EQ(std::memcmp(joined.weight.raw_data(), w.weight.raw_data(), w.weight.n_bytes()), 0) << dtype_name(dt);
    if (dt == DType::kF8E4M3) {
      ASSERT_EQ(joined.scale_inv.numel(), w.scale_inv.numel());
      EXPECT_EQ(std::memcmp(joined.scale_inv.raw_data(), w.scale_inv.raw_data(), w.scale_inv.n_bytes()), 0);
    }
  }
}

}  // namespace
}  // namespace deepinfer
