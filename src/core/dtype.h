// Element types and scalar conversions (bf16, fp16, fp8 e4m3fn) between storage and fp32.
// Scalar only: vectorized conversions live with the kernels that use them.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // torch.float8_e4m3fn: no infinities, max |x| = 448, NaN = 0x7F / 0xFF
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
};

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; nullopt for unknown spellings.
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, overflow to infinity, NaN preserved.
uint16_t f32_to_f16(float f);

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is subnormal (m/8 · 2^-6).
inline float e4m3_to_f32(uint8_t v) {
  const int sign = v >> 7;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float f;
  if (exp == 0xf && man == 0x7) {
    f = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -9);
  } else {
    f = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return sign ? -f : f;
}

// Round to nearest even, saturating to ±448 (torch's float8_e4m3fn cast saturates only with
// its satfinite variants; DeepSeek's quantizer clamps before casting, so saturation is what
// block-scaled quantization wants). NaN maps to 0x7F.
uint8_t f32_to_e4m3(float f);

}  // namespace deepinfer
