// A MoE step's (token, slot) entries as the sorts see them (cuda_moe.cu's one-block sort,
// cuda_moe_sort.cu's counting sort): entry i is token i / kt, slot i % kt; slots j < k carry the
// token's routed experts ids[token·k + j], slots k .. kt − 1 the shared experts e_routed + (j − k)
// (MoeArgs::n_shared). Device code only (.cu files).
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

__device__ __forceinline__ int32_t slot_expert(const int32_t* ids, int64_t i, int64_t k, int64_t kt,
                                               int64_t e_routed) {
  const int64_t tok = i / kt, j = i % kt;
  return j < k ? ids[tok * k + j] : static_cast<int32_t>(e_routed + j - k);
}

}  // namespace deepinfer::cuda
