#include "backend/linear_weight.h"

#include <algorithm>
#include <cstring>

#include <array>

#include "backend/cpu/simd.h"

namespace deepinfer {
namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

void LinearWeight::dequantize(int64_t n0, int64_t n_rows, int64_t k0, int64_t n_cols, float* out,
                              int64_t ld_out) const {
  DI_CHECK(n0 >= 0 && n0 + n_rows <= n_out() && k0 >= 0 && k0 + n_cols <= n_in());
  const int64_t ld = n_in();
  switch (weight.dtype()) {
    case DType::kF32: {
      const float* w = static_cast<const float*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = w[(n0 + r) * ld + k0 + k];
      break;
    }
    case DType::kBF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = bf16_to_f32(w[(n0 + r) * ld + k0 + k]);
      break;
    }
    case DType::kF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = f16_to_f32(w[(n0 + r) * ld + k0 + k]);
      break;
    }
    case DType::kF8E4M3: {
      // e4m3 → fp32 without a table: put the 7 magnitude bits where fp32's exponent and top
      // mantissa bits are (<< 20) and the sign at bit 31, then multiply by 2^120 (the bias
      // difference 127 - 7). Exact for normals and subnormals alike (e4m3 subnormals land on
      // fp32 subnormals and scale back up exactly). e4m3 NaN (0x7F) does not occur in weights.
      const uint8_t* w = static_cast<const uint8_t*>(weight.raw_data());
      const float* s = scale_inv.data<float>();
      const int64_t s_cols = scale_inv.size(1);
      const simd::v16f two_120 = simd::splat(0x1p120f);
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t n = n0 + r;
        const float* srow = s + (n / block_n) * s_cols;
        const uint8_t* wrow = w + n * ld;
        float* orow = out + r * ld_out;
        int64_t k = 0;
        while (k < n_cols) {
          const int64_t kk = k0 + k;
          const int64_t block_end = std::min(n_cols, (kk / block_k + 1) * block_k - k0);
          const float scale = srow[kk / block_k];
          const simd::v16f vscale = simd::splat(scale);
          for (; k + 16 <= block_end; k += 16) {
            const simd::v16u32 b = simd::load_u8_widen(wrow + k0 + k);
            const simd::v16u32 bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
            simd::store(orow + k, ((simd::v16f)bits * two_120) * vscale);
          }
          for (; k < block_end; ++k) orow[k] = e4m3_table()[wrow[k0 + k]] * scale;
        }
      }
      break;
    }
    default:
      DI_CHECK(false && "LinearWeight dtype validated at load");
  }
}

LinearWeight LinearWeight::rows(int64_t n0, int64_t n_rows) const {
  LinearWeight out = *this;
  out.weight = weight.slice_rows(n0, n0 + n_rows);
  if (weight.dtype() == DType::kF8E4M3) {
    DI_CHECK_EQ(n0 % block_n, 0);
    DI_CHECK(n_rows % block_n == 0 || n0 + n_rows == n_out());
    const int64_t s0 = n0 / block_n;
    const int64_t s1 = (n0 + n_rows + block_n - 1) / block_n;
    out.scale_inv = scale_inv.slice_rows(s0, s1);
  }
  return out;
}

}  // namespace deepinfer
