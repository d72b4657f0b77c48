// Scalar dtype conversions (bf16, fp16, fp8 e4m3fn): known bit patterns, exhaustive round
// trips over every code, and round-to-nearest-even checked against a brute-force nearest-code
// oracle built from the decoders.
#include "core/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }
bool e4m3_is_nan(uint8_t v) { return (v & 0x7fu) == 0x7fu; }

// Brute-force round-to-nearest-even onto a format's non-negative codes [0, n_codes), whose
// values `values[c]` increase with c. Ties go to the even code (mantissa LSB 0), which is IEEE
// RNE for these formats. Returns the code for |f| (the caller adds the sign).
uint32_t nearest_even_code(const std::vector<double>& values, double a) {
  auto it = std::lower_bound(values.begin(), values.end(), a);
  if (it == values.end()) return static_cast<uint32_t>(values.size() - 1);
  const auto hi = static_cast<uint32_t>(it - values.begin());
  if (*it == a || hi == 0) return hi;
  const uint32_t lo = hi - 1;
  const double dlo = a - values[lo], dhi = values[hi] - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) == 0 ? lo : hi;
}

// Inputs for the rounding oracles: every midpoint between adjacent codes, its float
// neighbours, and random floats over the whole range.
std::vector<float> probe_values(const std::vector<double>& values, uint32_t n_random, uint32_t seed) {
  std::vector<float> out;
  for (size_t c = 0; c + 1 < values.size(); ++c) {
    const double mid = 0.5 * (values[c] + values[c + 1]);
    const float m = static_cast<float>(mid);
    if (!std::isfinite(m)) continue;
    out.push_back(m);
    out.push_back(std::nextafter(m, 0.0f));
    out.push_back(std::nextafter(m, std::numeric_limits<float>::infinity()));
    out.push_back(static_cast<float>(values[c]));
  }
  std::mt19937 rng(seed);
  for (uint32_t i = 0; i < n_random; ++i) {
    const float f = from_bits(rng() & 0x7fffffffu);
    if (std::isfinite(f)) out.push_back(f);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Names and sizes

TEST(DType, SizesAndNamesRoundTrip) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI16, DType::kI8,   DType::kU8,     DType::kBool};
  for (DType d : all) {
    auto back = dtype_from_name(dtype_name(d));
    ASSERT_TRUE(back.has_value()) << dtype_name(d);
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(dtype_from_name("F8_E5M2").has_value());
  EXPECT_FALSE(dtype_from_name("f32").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());
}

// ---------------------------------------------------------------------------------------------
// e4m3fn

TEST(E4M3, KnownBitPatterns) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_FALSE(std::signbit(e4m3_to_f32(0x00)));
  EXPECT_EQ(e4m3_to_f32(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(e4m3_to_f32(0x77), 240.0f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in e4m3fn
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(E4M3, DecodeIsMonotoneAndOnlyTwoNaNs) {
  int n_nan = 0;
  for (int c = 0; c < 256; ++c)
    if (std::isnan(e4m3_to_f32(static_cast<uint8_t>(c)))) ++n_nan;
  EXPECT_EQ(n_nan, 2);
  for (int c = 0; c + 1 < 0x7f; ++c)
    EXPECT_LT(e4m3_to_f32(static_cast<uint8_t>(c)), e4m3_to_f32(static_cast<uint8_t>(c + 1))) << c;
}

TEST(E4M3, RoundTripsAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = e4m3_to_f32(code);
    const uint8_t back = f32_to_e4m3(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(e4m3_is_nan(back)) << "code " << c;
      EXPECT_TRUE(std::isnan(e4m3_to_f32(back))) << "code " << c;
    } else {
      EXPECT_EQ(back, code) << "code " << c << " value " << f;
    }
  }
}

TEST(E4M3, SaturatesToMaxFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // midpoint to the (absent) 480
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(inf), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-449.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-inf), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_TRUE(e4m3_is_nan(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN())));
}

TEST(E4M3, RoundsHalfToEven) {
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);   // 1 | 1.125: even is 1.0
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);   // 1.125 | 1.25: even is 1.25
  EXPECT_EQ(f32_to_e4m3(1.9375f), 0x40);   // 1.875 | 2.0: carries into the exponent
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7e);    // 416 | 448: even is 448
  EXPECT_EQ(f32_to_e4m3(400.0f), 0x7c);    // 384 | 416: even is 384 (mantissa 4)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // 0 | 2^-9: even is 0
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1 | 2 (x 2^-9): even is 2
  EXPECT_EQ(f32_to_e4m3(std::ldexp(5.0f, -10)), 0x02);  // 2 | 3: even is 2
  EXPECT_EQ(f32_to_e4m3(std::ldexp(15.0f, -10)), 0x08);  // largest subnormal | smallest normal
  EXPECT_EQ(f32_to_e4m3(-1.0625f), 0xb8);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);  // keeps the sign of zero
}

TEST(E4M3, MatchesBruteForceNearestEven) {
  std::vector<double> values;  // codes 0x00 .. 0x7e
  for (int c = 0; c <= 0x7e; ++c) values.push_back(e4m3_to_f32(static_cast<uint8_t>(c)));
  for (float f : probe_values(values, 100000, 1)) {
    const double a = std::fabs(static_cast<double>(f));
    const uint32_t want = a >= 448.0 ? 0x7eu : nearest_even_code(values, a);
    ASSERT_EQ(f32_to_e4m3(f), want) << "f = " << f << " (bits " << std::hex << to_bits(f) << ")";
    ASSERT_EQ(f32_to_e4m3(-f), want | 0x80u) << "f = " << -f;
  }
}

// ---------------------------------------------------------------------------------------------
// fp16

TEST(F16, KnownBitPatterns) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x8000), 0.0f);

  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(f16_is_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(f16_is_nan(f32_to_f16(from_bits(0x7f800001u))));  // signalling NaN, payload in low bits
}

TEST(F16, RoundsHalfToEvenAndOverflowsToInfinity) {
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 65536 (inf): even is inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: even is 1.0
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);      // tie: even is 0x3c02
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // tie 0 | 2^-24: even is 0
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);             // tie 1 | 2: even is 2
  EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);          // largest subnormal | smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -26)), 0x8000);
}

TEST(F16, RoundTripsAll65536Codes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    const float f = f16_to_f32(h);
    const uint16_t back = f32_to_f16(f);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << c;
      ASSERT_TRUE(f16_is_nan(back)) << std::hex << c;
    } else {
      ASSERT_EQ(back, h) << std::hex << "code 0x" << c << " value " << f;
    }
  }
}

TEST(F16, MatchesBruteForceNearestEven) {
  // Codes 0x0000 .. 0x7c00, with infinity standing at 65536 for rounding purposes.
  std::vector<double> values;
  for (uint32_t c = 0; c < 0x7c00; ++c) values.push_back(f16_to_f32(static_cast<uint16_t>(c)));
  values.push_back(65536.0);
  for (float f : probe_values(values, 200000, 2)) {
    const double a = std::fabs(static_cast<double>(f));
    const uint32_t want = a > 65536.0 ? 0x7c00u : nearest_even_code(values, a);
    ASSERT_EQ(f32_to_f16(f), want) << "f = " << f << " (bits " << std::hex << to_bits(f) << ")";
    ASSERT_EQ(f32_to_f16(-f), want | 0x8000u) << "f = " << -f;
  }
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(BF16, KnownBitPatterns) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x7f7f), from_bits(0x7f7f0000u));
  EXPECT_EQ(bf16_to_f32(0x0001), from_bits(0x00010000u));
  EXPECT_EQ(bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc0)));

  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, lower code even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, lower code odd: rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // just below the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);  // sign symmetric
  EXPECT_EQ(f32_to_bf16(from_bits(0x3fffffffu)), 0x4000);  // carries into the exponent
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);
  // NaNs stay NaN, even when the payload lives only in the low 16 bits.
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(from_bits(0x7f800001u))));
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(from_bits(0xff800001u))));
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(bf16_is_nan(f32_to_bf16(from_bits(0x7fffffffu))));
}

TEST(BF16, RoundTripsAll65536Codes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto b = static_cast<uint16_t>(c);
    const float f = bf16_to_f32(b);
    const uint16_t back = f32_to_bf16(f);
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << c;
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << c;
    } else {
      ASSERT_EQ(back, b) << std::hex << "code 0x" << c;
    }
  }
}

TEST(BF16, MatchesBruteForceNearestEven) {
  std::vector<double> values;  // codes 0x0000 .. 0x7f80, infinity standing at 2^128
  for (uint32_t c = 0; c < 0x7f80; ++c) values.push_back(bf16_to_f32(static_cast<uint16_t>(c)));
  values.push_back(std::ldexp(1.0, 128));
  for (float f : probe_values(values, 200000, 3)) {
    const double a = std::fabs(static_cast<double>(f));
    const uint32_t want = nearest_even_code(values, a);
    ASSERT_EQ(f32_to_bf16(f), want) << "f = " << f << " (bits " << std::hex << to_bits(f) << ")";
    ASSERT_EQ(f32_to_bf16(-f), want | 0x8000u) << "f = " << -f;
  }
}

}  // namespace
}  // namespace deepinfer
