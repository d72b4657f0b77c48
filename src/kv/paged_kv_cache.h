// PagedKvCache: the per-layer KV pages of one model plus the pool that hands them out.
// The model declares what each layer caches (KvLayerSpec); today the only kind is DeepSeek's
// MLA latent ([c_kv | k_pe], kv_lora_rank + qk_rope_head_dim values per token), and new
// kinds (sliding-window rings, compressed entries) add a kind here, not a new cache.
// KvSequence is one sequence's page list; slot = block_id * block_size + offset.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kv/block_pool.h"

namespace deepinfer {

enum class KvKind { kMlaLatent };

struct KvLayerSpec {
  KvKind kind = KvKind::kMlaLatent;
  int64_t width = 0;  // values per token
};

class PagedKvCache {
 public:
  // Pages [n_blocks, block_size, width] of `dtype` per layer, in `backend`'s memory
  // (Backend::allocate, zero-filled).
  PagedKvCache(Backend& backend, const std::vector<KvLayerSpec>& layers, int64_t n_blocks, int64_t block_size,
               DType dtype);
  // Bytes one page costs over all layers.
  static int64_t bytes_per_block(const std::vector<KvLayerSpec>& layers, int64_t block_size, DType dtype);

  int64_t block_size() const { return block_size_; }
  int64_t n_layers() const { return static_cast<int64_t>(pages_.size()); }
  Tensor& layer(int64_t l) { return pages_[static_cast<size_t>(l)]; }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  // Bytes per token over all layers (what one more cached token costs).
  int64_t bytes_per_token() const { return bytes_per_token_; }

 private:
  int64_t block_size_;
  int64_t bytes_per_token_ = 0;
  std::vector<Tensor> pages_;
  BlockPool pool_;
};

// One sequence's cached tokens and the pages that hold them.
struct KvSequence {
  std::vector<int32_t> block_ids;
  int64_t n_tokens = 0;

  // Pages needed to hold n_tokens + n_new tokens beyond those already owned.
  int64_t blocks_needed(int64_t n_new, int64_t block_size) const {
    const int64_t total = (n_tokens + n_new + block_size - 1) / block_size;
    return total > static_cast<int64_t>(block_ids.size()) ? total - static_cast<int64_t>(block_ids.size()) : 0;
  }
  int32_t slot(int64_t position, int64_t block_size) const {
    return block_ids[static_cast<size_t>(position / block_size)] * static_cast<int32_t>(block_size) +
           static_cast<int32_t>(position % block_size);
  }
};

}  // namespace deepinfer
