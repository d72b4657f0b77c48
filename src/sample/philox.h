// Philox-4x32-10 (Salmon et al., SC'11): a counter-based RNG. A draw is a pure function of
// (key, counter), so a request's randomness is keyed by (seq_seed, position, purpose) and never
// depends on its neighbours in the batch or on the order steps run in.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Purposes separate independent streams drawn at the same position.
enum class RngPurpose : uint32_t { kSample = 0, kSpeculativeAccept = 1, kSpeculativeResidual = 2 };

// A uniform float in [0, 1) with 24 random bits, keyed by (seed, position, purpose).
inline float philox_uniform(uint64_t seed, uint64_t position, RngPurpose purpose) {
  const auto r = philox4x32_10({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                                static_cast<uint32_t>(purpose), 0u},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return static_cast<float>(r[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace deepinfer
