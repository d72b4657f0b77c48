// The FP8 quantizer's division through the group scale's reciprocal (fp8_scale_div.h) against
// IEEE division on the host: the same quotient, bit for bit, wherever it can give a nonzero e4m3
// code, and the sign of x (a code ±0) below.
#include "backend/cuda/fp8_scale_div.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

namespace deepinfer {
namespace {

// The recipe's scale for a group whose largest |x| is amax (cuda_fp8_quant.cuh).
float recipe_scale(float amax) { return std::fmax(amax, 1e-4f) / 448.0f; }

// x whose quotient by s lies within a few ulps of an e4m3 rounding boundary (the midpoint
// between two codes), where a quotient one ulp off would change the code.
float near_midpoint(std::mt19937_64& rng, float s) {
  // A quotient in [2^-10, 448): exponent e, the 3 mantissa bits of a code, then the midpoint bit.
  const uint32_t e = 117 + static_cast<uint32_t>(rng() % 17);  // 2^-10 .. 2^8
  const uint32_t m3 = static_cast<uint32_t>(rng() % 8) << 20;
  const int32_t off = static_cast<int32_t>(rng() % 9) - 4;
  const float q = std::bit_cast<float>((e << 23) | m3 | static_cast<uint32_t>(0x80000 + off));
  float x = q * s;
  if (rng() % 2) x = std::nextafter(x, 1e30f);
  return rng() % 2 ? -x : x;
}

TEST(Fp8ScaleDiv, EqualsIeeeDivisionWhereACodeCanBeNonzero) {
  std::mt19937_64 rng(20261204);
  int64_t checked = 0;
  for (int si = 0; si < 400; ++si) {
    float amax;
    if (si % 4 == 0) amax = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);  // powers of two
    else if (si % 4 == 1) amax = std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, static_cast<int>(rng() % 40) - 20);
    else amax = std::bit_cast<float>(0x38d1b717u + static_cast<uint32_t>(rng() % (0x7e000000u - 0x38d1b717u)));
    for (const float s : {recipe_scale(amax), std::exp2(std::ceil(std::log2(recipe_scale(amax))))}) {  // the ue8m0 form too
      const float inv = 1.0f / s;  // RN(1/s): __frcp_rn on the device
      for (int j = 0; j < 6000; ++j) {
        float x;
        if (j == 0) x = amax;
        else if (j == 1) x = -amax;
        else if (j % 2 == 0) x = near_midpoint(rng, s);
        else x = std::bit_cast<float>(static_cast<uint32_t>(rng())) ;
        if (!std::isfinite(x) || std::fabs(x) > amax || std::fabs(x) < 0x1p-100f) continue;
        const float want = x / s, got = div_by_scale(x, s, inv);
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
            << std::hexfloat << "x " << x << " s " << s;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 2'000'000);
}

TEST(Fp8ScaleDiv, TinyValuesKeepTheirSignAndGiveZeroCodes) {
  std::mt19937_64 rng(7);
  for (const float amax : {1e-4f, 1.0f, 3.5e4f, 1e30f}) {
    const float s = recipe_scale(amax), inv = 1.0f / s;
    for (int j = 0; j < 20000; ++j) {
      // |x| < 2^-100, zeros and subnormals included
      float x = j < 2 ? 0.0f : std::bit_cast<float>(static_cast<uint32_t>(rng() % 0x0d800000u));
      if (j % 2 == 1) x = -x;
      const float got = div_by_scale(x, s, inv);
      EXPECT_EQ(std::signbit(got), std::signbit(x)) << std::hexfloat << x;
      EXPECT_LT(std::fabs(got), 0x1p-10f) << std::hexfloat << x;  // rounds to an e4m3 zero
    }
  }
}

}  // namespace
}  // namespace deepinfer
