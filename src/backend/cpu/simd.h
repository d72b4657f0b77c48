// 16-lane fp32 vectors through GCC/Clang vector extensions: AVX-512 registers under
// -march with AVX-512, two AVX2 registers otherwise, plain scalar code elsewhere. Every
// reduction here has a fixed order, so results do not depend on how work is split.
// Multiply-adds are fused explicitly (simd::fma, std::fma) and the backend is compiled with
// -ffp-contract=off: the compiler must not decide per call site, or per template instance,
// whether a*b+c rounds once or twice — that made batch sizes disagree under gcc 13.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace deepinfer::simd {

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));

inline v16f zero() { return v16f{}; }
// a·b + c rounded once, lane by lane.
inline v16f fma(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
  return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  __m256 a2[2], b2[2], c2[2];
  std::memcpy(a2, &a, 64);
  std::memcpy(b2, &b, 64);
  std::memcpy(c2, &c, 64);
  a2[0] = _mm256_fmadd_ps(a2[0], b2[0], c2[0]);
  a2[1] = _mm256_fmadd_ps(a2[1], b2[1], c2[1]);
  v16f r;
  std::memcpy(&r, a2, 64);
  return r;
#else
  v16f r;
  for (int i = 0; i < 16; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
#endif
}
inline v16f splat(float x) { return v16f{} + x; }
inline v16f load(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }
// 16 bf16 values widened to fp32 (exact: bf16 is the top half of an fp32).
inline v16f load_bf16(const uint16_t* p) {
  v16u16 h;
  std::memcpy(&h, p, sizeof(h));
  v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  return (v16f)w;  // bit cast between same-size vector types
}
// 16 bytes zero-extended to 16 uint32 lanes (GCC lowers __builtin_convertvector for this
// widening to scalar inserts, so the x86 widening moves are spelled out).
#pragma GCC diagnostic push
// GCC 12's avx512fintrin.h builds the widening from an undefined vector (false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline v16u32 load_u8_widen(const uint8_t* p) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  v16u32 out;
  std::memcpy(&out, &w, sizeof(out));
  return out;
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i lo = _mm256_cvtepu8_epi32(bytes);
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  v16u32 out;
  std::memcpy(&out, &lo, 32);
  std::memcpy(reinterpret_cast<char*>(&out) + 32, &hi, 32);
  return out;
#else
  v16u32 out;
  for (int i = 0; i < 16; ++i) out[i] = p[i];
  return out;
#endif
}
#pragma GCC diagnostic pop

// Fixed pairwise tree: (0+8, 1+9, ...) then halves again, so the sum is reproducible.
inline float hsum(v16f v) {
  float a[16];
  std::memcpy(a, &v, sizeof(a));
  float b[8];
  for (int i = 0; i < 8; ++i) b[i] = a[i] + a[i + 8];
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}
inline float hmax(v16f v) {
  float a[16];
  std::memcpy(a, &v, sizeof(a));
  float m = a[0];
  for (int i = 1; i < 16; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

// Σ a[i]·b[i] over n floats: 16-lane partial sums in i order, a fixed tree, then the tail.
inline float dot(const float* a, const float* b, int64_t n) {
  v16f acc = zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = fma(load(a + i), load(b + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

// y[i] += alpha · x[i]
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  const v16f a = splat(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(y + i, fma(a, load(x + i), load(y + i)));
  for (; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
}

}  // namespace deepinfer::simd
